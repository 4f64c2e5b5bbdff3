/* cli_util.c — option parsing and file helpers for the commands. */
#include "app/cli_util.h"
#include "base/clock.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool cli_opt_is(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

const char *cli_opt_value(int argc, char **argv, int *i)
{
    const char *eq = strchr(argv[*i], '=');
    if (eq && strncmp(argv[*i], "--", 2) == 0) return eq + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvbatch: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_parse_i64(const char *opt, const char *val, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno || end == val || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kvbatch: %s expects an integer in [%lld, %lld], got '%s'\n", opt, (long long)lo, (long long)hi,
                val);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_f32(const char *opt, const char *val, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end != '\0' || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "kvbatch: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, val);
        return false;
    }
    *out = (float)v;
    return true;
}

bool cli_parse_kv_type(const char *opt, const char *val, enum kv_type *out)
{
    if (kv_type_parse(val, out)) return true;
    fprintf(stderr, "kvbatch: %s expects f16, q8 or q4, got '%s'\n", opt, val);
    return false;
}

bool cli_parse_activations(const char *opt, const char *val, bool *act16)
{
    if (strcmp(val, "8") && strcmp(val, "16")) {
        fprintf(stderr, "kvbatch: %s expects 8 or 16, got '%s'\n", opt, val);
        return false;
    }
    *act16 = !strcmp(val, "16");
    return true;
}

bool cli_parse_kernels(const char *opt, const char *val, enum mm_impl *out)
{
    enum mm_impl k, resolved;
    if (!mm_impl_parse(val, &k)) {
        fprintf(stderr, "kvbatch: %s expects auto, amx, avx512, avx2 or scalar, got '%s'\n", opt, val);
        return false;
    }
    struct kvb_err err = {{0}};
    if (mm_impl_resolve(k, &resolved, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch: %s %s: %s\n", opt, val, err.msg);
        return false;
    }
    *out = k;
    return true;
}

bool cli_parse_size(const char *opt, const char *val, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    double mul = 1;
    if (!errno && end != val) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = 1024.0;
            end++;
            break;
        case 'm':
        case 'M':
            mul = 1024.0 * 1024;
            end++;
            break;
        case 'g':
        case 'G':
            mul = 1024.0 * 1024 * 1024;
            end++;
            break;
        case 't':
        case 'T':
            mul = 1024.0 * 1024 * 1024 * 1024;
            end++;
            break;
        default: break;
        }
        if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0 || strcmp(end, "b") == 0)) end += strlen(end);
    }
    if (errno || end == val || *end != '\0' || !isfinite(v) || v < 0 || v * mul > 1.8e19) {
        fprintf(stderr, "kvbatch: %s expects a size such as 512M or 2G, got '%s'\n", opt, val);
        return false;
    }
    *out = (uint64_t)(v * mul);
    return true;
}

char *cli_read_stream(void *stdio_file, size_t *len)
{
    FILE *f = stdio_file;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

char *cli_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = cli_read_stream(f, len);
    fclose(f);
    return b;
}

void cli_default_model(char *buf, size_t cap)
{
    const char *env = getenv("KVBATCH_MODEL");
    const char *rel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    snprintf(buf, cap, "%s", env && *env ? env : rel);
    if ((env && *env) || access(rel, R_OK) == 0) return;
    /* Beside the source tree when run as build/kvbatch from elsewhere. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = '\0';
            char cand[PATH_MAX + 64];
            snprintf(cand, sizeof cand, "%s/%s", exe, rel);
            if (access(cand, R_OK) == 0) {
                snprintf(buf, cap, "%s", cand);
                return;
            }
        }
    }
}

double cli_now(void) { return kvb_clock_s(); }
