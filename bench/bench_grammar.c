/* bench_grammar.c — what the grammar engine costs a decode step.
 *
 * For a few grammars, `batch` sequences (default 64), each with its own
 * matcher as each request has in a run, walk `steps` tokens: every step
 * every sequence takes a mask (grammar_mask over the default model's
 * 49152-token vocabulary: the sampler's redraw path, paid when the model's
 * own choice breaks the grammar) and accepts a random allowed token. The
 * numbers: the vocabulary's build time (once per run), the first step
 * (cold caches), the mean step over the rest, the mean over the last half
 * (warm), and the cheap path alone (grammar_allows + accept: the model's
 * token was allowed). Times are for the whole batch, i.e. per decode step.
 *
 * Not a ctest: it measures. Usage: bench_grammar [batch=64] [steps=200] [grammar] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "engine/grammar.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_schema.h"
#include "support/testutil.h"
#include "text/tok.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static struct grammar *gbnf(const char *text, size_t len)
{
    struct grammar *g = NULL;
    char msg[256];
    if (grammar_compile(text, len, &g, msg, sizeof msg) != KVB_OK) fprintf(stderr, "compile: %s\n", msg);
    return g;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = kvb_malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    if (s) s[n] = 0;
    *len = (size_t)n;
    return s;
}

/* One grammar: batch matchers, steps tokens. */
static const char *only; /* argv[3]: run only the grammar of that name */

static void bench(const char *name, const struct grammar *g, const struct grammar_vocab *v, const struct tok *t,
                  int batch, int steps)
{
    if (only && strcmp(only, name) != 0) return;
    const int32_t n = grammar_vocab_size(v);
    struct grammar_matcher **m = kvb_calloc((size_t)batch, sizeof *m);
    float *logits = kvb_malloc(sizeof *logits * (size_t)n);
    int32_t *allowed = kvb_malloc(sizeof *allowed * (size_t)n);
    for (int b = 0; b < batch; b++) grammar_matcher_create(g, v, &m[b]);
    double first = 0, total = 0, warm = 0;
    int n_warm = 0, ended = 0;
    int32_t *picked = kvb_malloc(sizeof *picked * (size_t)batch * (size_t)steps);
    for (int s = 0; s < steps; s++) {
        const double t0 = kvb_clock_s();
        for (int b = 0; b < batch; b++) {
            for (int32_t i = 0; i < n; i++) logits[i] = 0.0f;
            grammar_mask(m[b], logits);
            int32_t na = 0;
            for (int32_t i = 0; i < n; i++)
                if (logits[i] == 0.0f) allowed[na++] = i;
            int32_t pick = -1;
            for (int tries = 0; tries < 8 && pick < 0 && rnd(2); tries++) { /* now and then a short token: structure */
                const int32_t c = allowed[rnd((uint32_t)na)];
                char piece[8];
                if (!tok_is_eog(t, c) && tok_piece(t, c, false, piece, sizeof piece) == 1) pick = c;
            }
            if (pick < 0) pick = allowed[rnd((uint32_t)na)];
            if (tok_is_eog(t, pick)) { /* ended: start again, as a new request would */
                grammar_matcher_reset(m[b]);
                ended++;
                pick = -1;
            } else {
                grammar_accept(m[b], pick);
            }
            picked[s * batch + b] = pick;
        }
        const double dt = kvb_clock_s() - t0;
        if (s == 0) first = dt;
        else total += dt;
        if (s >= steps / 2) warm += dt, n_warm++;
    }
    uint64_t masks = 0, hits = 0, mask_ns = 0, states = 0;
    size_t cached = 0;
    for (int b = 0; b < batch; b++) {
        struct grammar_stats st;
        grammar_matcher_stats(m[b], &st);
        masks += st.masks;
        hits += st.mask_hits;
        mask_ns += st.mask_ns;
        states += st.states;
        cached += st.cache_bytes;
    }
    /* The cheap path: the same tokens again through allows + accept. */
    for (int b = 0; b < batch; b++) {
        grammar_matcher_free(m[b]);
        grammar_matcher_create(g, v, &m[b]);
    }
    double cheap = 0;
    for (int s = 0; s < steps; s++) {
        const double t0 = kvb_clock_s();
        for (int b = 0; b < batch; b++) {
            const int32_t pick = picked[s * batch + b];
            if (pick < 0) {
                grammar_matcher_reset(m[b]);
                continue;
            }
            if (grammar_allows(m[b], pick)) grammar_accept(m[b], pick);
        }
        if (s >= steps / 2) cheap += kvb_clock_s() - t0;
    }
    printf("%-16s step: first %7.2f ms, mean %7.3f ms, warm %7.3f ms; inside grammar_mask %7.3f ms/step; "
           "allows-only warm %7.4f ms/step\n"
           "%-16s   %llu masks, %.1f%% from the cache; %d ends; %.0f states and %.2f MiB a matcher\n",
           name, first * 1e3, total / (steps - 1) * 1e3, warm / n_warm * 1e3, mask_ns / 1e6 / steps,
           cheap / n_warm * 1e3, "", (unsigned long long)masks, masks ? 100.0 * (double)hits / (double)masks : 0.0,
           ended, (double)states / batch, (double)cached / batch / 1048576.0);
    for (int b = 0; b < batch; b++) grammar_matcher_free(m[b]);
    kvb_free(m);
    kvb_free(logits);
    kvb_free(allowed);
    kvb_free(picked);
}

int main(int argc, char **argv)
{
    const int batch = argc > 1 ? atoi(argv[1]) : 64;
    const int steps = argc > 2 ? atoi(argv[2]) : 200;
    only = argc > 3 ? argv[3] : NULL;
    bool absent = false;
    struct tok *t = tu_model_tokenizer(&absent);
    if (!t) return fprintf(stderr, "bench_grammar: no tokenizer ($KVB_MODEL)\n"), 1;
    const double t0 = kvb_clock_s();
    struct grammar_vocab *v = NULL;
    struct kvb_err err = {{0}};
    if (grammar_vocab_create(t, &v, &err) != KVB_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    printf("vocabulary: %d tokens, built in %.1f ms; batch %d, %d steps, a mask every step for every sequence\n",
           grammar_vocab_size(v), (kvb_clock_s() - t0) * 1e3, batch, steps);
    struct kvb_buf b = {0};
    char path[160], msg[256];
    if (gschema_to_gbnf(NULL, 0, "json_object", &b, path, sizeof path, msg, sizeof msg) == KVB_OK) {
        struct grammar *g = gbnf(b.data, b.len);
        if (g) bench("json_object", g, v, t, batch, steps);
        grammar_free(g);
    }
    b.len = 0;
    static const char re[] = "[a-z]{3,10}@[a-z]{3,8}\\.(com|org|net)";
    if (gregex_to_gbnf(re, sizeof re - 1, GREGEX_WHOLE, "root", &b, msg, sizeof msg) == KVB_OK) {
        struct grammar *g = gbnf(b.data, b.len);
        if (g) bench("regex email", g, v, t, batch, steps);
        grammar_free(g);
    }
    static const char *files[] = {"json.gbnf", "arithmetic.gbnf", "chess.gbnf", "c.gbnf"};
    const char *dir = tu_env("KVB_SOURCE_DIR");
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/data/gbnf/%s", dir ? dir : ".", files[f]);
        size_t len = 0;
        char *text = read_all(p, &len);
        if (!text) continue;
        struct grammar *g = gbnf(text, len);
        if (g) bench(files[f], g, v, t, batch, steps);
        grammar_free(g);
        kvb_free(text);
    }
    kvb_buf_free(&b);
    grammar_vocab_free(v);
    tok_free(t);
    return 0;
}
