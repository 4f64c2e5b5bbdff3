/* testutil.c — see testutil.h. */
#include "support/testutil.h"

#include <string.h>

#include "model/gguf.h"
#include "text/tok.h"

int tu_failures = 0;

int tu_finish(void)
{
    if (tu_failures) {
        fprintf(stderr, "%d check(s) failed\n", tu_failures);
        return 1;
    }
    return 0;
}

void tu_skip(const char *why)
{
    fprintf(stderr, "SKIP: %s\n", why);
    exit(77);
}

const char *tu_env(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

struct tok *tu_model_tokenizer(bool *absent)
{
    const char *path = tu_env("KVB_MODEL");
    FILE *probe = path ? fopen(path, "rb") : NULL;
    *absent = !probe;
    if (!probe) return NULL;
    fclose(probe);
    struct kvb_err err = {{0}};
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    CHECK_MSG(gguf_open(path, &f, &err) == KVB_OK, "%s", err.msg);
    if (f) CHECK_MSG(tok_load(f, &t, &err) == KVB_OK, "%s", err.msg);
    gguf_close(f);
    return t;
}
