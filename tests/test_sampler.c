/* test_sampler.c — the sampler against plain double-precision references:
 * greedy and its ties, seeded determinism, empirical distributions against
 * softmax (with temperature, top-k, top-p, min-p), each penalty on crafted
 * logits, logprob, parameter checks and allocation failure. Ends by printing
 * the time of one call on a 49152-token vocabulary (printed, not asserted:
 * timings on shared CI machines are too noisy to gate on). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "engine/sampler.h"
#include "support/testutil.h"

#define BIG_VOCAB 49152

/* Test-side generator, independent of the sampler's. */
static uint64_t lcg_state = 1;
static double lcg_uniform(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}
static float lcg_normalish(void)
{
    double a = 0.0;
    for (int k = 0; k < 4; k++) a += lcg_uniform();
    return (float)((a - 2.0) * 1.7320508 * 3.0); /* mean 0, sd about 3 */
}
static void random_logits(float *x, int32_t n, uint64_t seed)
{
    lcg_state = seed;
    for (int32_t i = 0; i < n; i++) x[i] = lcg_normalish();
}

static struct sampler *make(float temp, int32_t top_k, float top_p, float min_p, uint64_t seed, int32_t n_vocab)
{
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    struct sampler *s = NULL;
    enum kvb_status st = sampler_create(&p, n_vocab, &s);
    CHECK_EQ_INT(st, KVB_OK);
    return s;
}

/* Samples once from a copy of logits (the sampler modifies its input). */
static int32_t draw(struct sampler *s, const float *logits, int32_t n, float *work)
{
    memcpy(work, logits, (size_t)n * sizeof *work);
    int32_t tok = -1;
    enum kvb_status st = sampler_sample(s, work, &tok);
    CHECK_EQ_INT(st, KVB_OK);
    return tok;
}

static int32_t ref_argmax(const float *x, int32_t n)
{
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* Reference distribution of the whole pipeline (no penalties), in double:
 * temperature, top-k, top-p, min-p with the sampler's order (logit
 * descending, id ascending). Writes probabilities into prob[n]. */
struct ranked {
    double s;
    int32_t id;
};
static int ranked_cmp(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}
static void ref_dist(const float *logits, int32_t n, float temp, int32_t top_k, float top_p, float min_p, double *prob,
                     int32_t *kept_out)
{
    struct ranked *r = malloc((size_t)n * sizeof *r);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        prob[i] = 0.0;
        float s = logits[i] / temp; /* the sampler scales in float */
        if (s > -INFINITY) r[m++] = (struct ranked){s, i};
    }
    qsort(r, (size_t)m, sizeof *r, ranked_cmp);
    if (top_k > 0 && top_k < m) m = top_k;
    double z = 0.0;
    for (int32_t j = 0; j < m; j++) z += exp(r[j].s - r[0].s);
    int32_t keep = m;
    if (top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t j = 0; j < m; j++) {
            cum += exp(r[j].s - r[0].s) / z;
            if (cum >= top_p) {
                keep = j + 1;
                break;
            }
        }
    }
    for (int32_t j = 1; j < keep; j++) {
        if (exp(r[j].s - r[0].s) < min_p) {
            keep = j;
            break;
        }
    }
    double w = 0.0;
    for (int32_t j = 0; j < keep; j++) w += exp(r[j].s - r[0].s);
    for (int32_t j = 0; j < keep; j++) prob[r[j].id] = exp(r[j].s - r[0].s) / w;
    if (kept_out) *kept_out = keep;
    free(r);
}

/* Draws `draws` times and checks every token's frequency against prob
 * within 5 standard deviations (plus a small floor), and that tokens of
 * probability 0 never come out. */
static void check_empirical(const char *what, const float *logits, int32_t n, float temp, int32_t top_k, float top_p,
                            float min_p, int draws)
{
    double *prob = malloc((size_t)n * sizeof *prob);
    long *count = calloc((size_t)n, sizeof *count);
    float *work = malloc((size_t)n * sizeof *work);
    ref_dist(logits, n, temp, top_k, top_p, min_p, prob, NULL);
    struct sampler *s = make(temp, top_k, top_p, min_p, 1234, n);
    for (int d = 0; d < draws; d++) {
        int32_t t = draw(s, logits, n, work);
        if (t >= 0 && t < n) count[t]++;
    }
    for (int32_t i = 0; i < n; i++) {
        double f = (double)count[i] / draws;
        double sd = sqrt(prob[i] * (1.0 - prob[i]) / draws);
        if (prob[i] == 0.0) CHECK_MSG(count[i] == 0, "%s: token %d has p=0 but came out %ld times", what, i, count[i]);
        else CHECK_MSG(fabs(f - prob[i]) <= 5.0 * sd + 1e-4, "%s: token %d freq %.5f vs p %.5f", what, i, f, prob[i]);
    }
    sampler_free(s);
    free(prob);
    free(count);
    free(work);
}

static void test_greedy(void)
{
    float work[16];
    struct sampler *s = make(0.0f, 0, 1.0f, 0.0f, 0, 4);
    const float a[4] = {1.0f, 3.0f, 2.0f, 3.0f};
    CHECK_EQ_INT(draw(s, a, 4, work), 1); /* tie between 1 and 3: lowest id */
    const float b[4] = {NAN, 1.0f, 2.0f, -INFINITY};
    CHECK_EQ_INT(draw(s, b, 4, work), 2); /* NaN never wins */
    float c[4] = {-INFINITY, NAN, -INFINITY, -INFINITY};
    int32_t tok = 7;
    CHECK_EQ_INT(sampler_sample(s, c, &tok), KVB_ERR_INVALID_ARG);
    sampler_free(s);

    /* Large vocabularies: ties across vector lanes and accumulators, the max
     * in the scalar tail, and agreement with a scalar argmax. */
    const int32_t n = BIG_VOCAB + 7;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    s = make(0.0f, 0, 1.0f, 0.0f, 0, n);
    for (uint64_t seed = 1; seed <= 5; seed++) {
        random_logits(x, n, seed);
        CHECK_EQ_INT(draw(s, x, n, w), ref_argmax(x, n));
    }
    random_logits(x, n, 9);
    x[37] = 100.0f;
    x[2] = 100.0f;
    x[40000] = 100.0f;
    CHECK_EQ_INT(draw(s, x, n, w), 2);
    x[n - 1] = 101.0f;
    CHECK_EQ_INT(draw(s, x, n, w), n - 1);
    x[n - 3] = 101.0f;
    CHECK_EQ_INT(draw(s, x, n, w), n - 3);
    sampler_free(s);
    free(x);
    free(w);
}

static void test_determinism(void)
{
    enum { N = 1000, DRAWS = 500 };
    float logits[N], work[N];
    random_logits(logits, N, 77);
    for (int32_t i = 0; i < N; i++) logits[i] *= 0.3f; /* flat enough for many distinct tokens */
    int32_t a[DRAWS], b[DRAWS], c[DRAWS];
    struct sampler *s1 = make(1.0f, 0, 1.0f, 0.0f, 42, N);
    struct sampler *s2 = make(1.0f, 0, 1.0f, 0.0f, 42, N);
    struct sampler *s3 = make(1.0f, 0, 1.0f, 0.0f, 43, N);
    struct sampler *other = make(0.9f, 50, 0.9f, 0.0f, 42, N);
    for (int d = 0; d < DRAWS; d++) {
        a[d] = draw(s1, logits, N, work);
        (void)draw(other, logits, N, work); /* unrelated sampling in between changes nothing */
        b[d] = draw(s2, logits, N, work);
        c[d] = draw(s3, logits, N, work);
    }
    int same_ab = 0, same_ac = 0;
    for (int d = 0; d < DRAWS; d++) {
        same_ab += a[d] == b[d];
        same_ac += a[d] == c[d];
    }
    CHECK_EQ_INT(same_ab, DRAWS);
    CHECK_MSG(same_ac < DRAWS / 4, "seeds 42 and 43 agree on %d of %d draws", same_ac, DRAWS);

    sampler_reset(s1); /* back to the state right after create */
    int same_reset = 0;
    for (int d = 0; d < DRAWS; d++) same_reset += draw(s1, logits, N, work) == a[d];
    CHECK_EQ_INT(same_reset, DRAWS);

    /* Golden values: the generator and the arithmetic use only IEEE basic
     * operations, so these tokens are the same on every machine. A change
     * here means outputs of earlier runs can no longer be reproduced. */
    sampler_reset(s1);
    const int32_t golden[8] = {61, 343, 645, 925, 990, 743, 687, 831};
    for (int d = 0; d < 8; d++) {
        int32_t t = draw(s1, logits, N, work);
        CHECK_MSG(t == golden[d], "golden draw %d: got %d, want %d", d, t, golden[d]);
    }
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);
    sampler_free(other);
}

static void test_distributions(void)
{
    const float small[8] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, -INFINITY};
    check_empirical("T=1", small, 8, 1.0f, 0, 1.0f, 0.0f, 60000);
    check_empirical("T=0.7", small, 8, 0.7f, 0, 1.0f, 0.0f, 60000);
    check_empirical("T=2 top-k 3", small, 8, 2.0f, 3, 1.0f, 0.0f, 60000);
    check_empirical("top-p 0.8", small, 8, 1.0f, 0, 0.8f, 0.0f, 60000);
    check_empirical("top-k 5 top-p 0.8", small, 8, 1.0f, 5, 0.8f, 0.0f, 60000);
    check_empirical("min-p 0.2", small, 8, 1.0f, 0, 1.0f, 0.2f, 60000);
    check_empirical("top-p 0.99 min-p 0.3", small, 8, 1.0f, 0, 0.99f, 0.3f, 60000);

    /* A few hundred tokens: exercises the top-p histogram with several
     * tokens per bucket and NaN / -inf entries that must never come out. */
    enum { M = 300 };
    float mid[M];
    random_logits(mid, M, 5);
    mid[10] = NAN;
    mid[11] = -INFINITY;
    check_empirical("M top-p 0.9", mid, M, 1.0f, 0, 0.9f, 0.0f, 60000);
    check_empirical("M T=0.5 top-p 0.5 min-p 0.01", mid, M, 0.5f, 0, 0.5f, 0.01f, 60000);
    check_empirical("M top-k 20 T=1.5", mid, M, 1.5f, 20, 1.0f, 0.0f, 60000);
}

/* Top-p on a full-size vocabulary: every draw lies in the reference set,
 * give or take the one token at the boundary where float and double sums
 * may disagree. */
static void test_top_p_big(void)
{
    const int32_t n = BIG_VOCAB;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    double *prob = malloc((size_t)n * sizeof *prob);
    const float ps[3] = {0.5f, 0.9f, 0.95f};
    for (int k = 0; k < 3; k++) {
        random_logits(x, n, 100 + (uint64_t)k);
        int32_t kept = 0;
        ref_dist(x, n, 0.8f, 0, ps[k], 0.0f, prob, &kept);
        /* rank of each token in the reference order */
        struct ranked *r = malloc((size_t)n * sizeof *r);
        int32_t *rank = malloc((size_t)n * sizeof *rank);
        for (int32_t i = 0; i < n; i++) r[i] = (struct ranked){x[i] / 0.8f, i};
        qsort(r, (size_t)n, sizeof *r, ranked_cmp);
        for (int32_t j = 0; j < n; j++) rank[r[j].id] = j;
        struct sampler *s = make(0.8f, 0, ps[k], 0.0f, 7, n);
        int outside = 0;
        for (int d = 0; d < 300; d++) {
            int32_t t = draw(s, x, n, w);
            CHECK_MSG(rank[t] <= kept, "top-p %.2f: token of rank %d drawn, set has %d", ps[k], rank[t], kept);
            outside += rank[t] >= kept;
        }
        CHECK(outside <= 1);
        sampler_free(s);
        free(r);
        free(rank);
    }
    free(x);
    free(w);
    free(prob);
}

static void test_truncation_equals_greedy(void)
{
    const int32_t n = BIG_VOCAB;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    struct sampler *k1 = make(1.0f, 1, 1.0f, 0.0f, 3, n);
    struct sampler *ptiny = make(1.0f, 0, 1e-6f, 0.0f, 3, n);
    struct sampler *mp = make(1.0f, 0, 1.0f, 0.999f, 3, n);
    for (uint64_t seed = 1; seed <= 8; seed++) {
        random_logits(x, n, seed);
        if (seed == 8) { /* a tie at the top: the lowest id, as greedy */
            x[30000] = 50.0f;
            x[123] = 50.0f;
        }
        int32_t g = ref_argmax(x, n);
        CHECK_EQ_INT(draw(k1, x, n, w), g);
        CHECK_EQ_INT(draw(ptiny, x, n, w), g);
        if (seed != 8) CHECK_EQ_INT(draw(mp, x, n, w), g); /* a tie survives min-p */
    }
    sampler_free(k1);
    sampler_free(ptiny);
    sampler_free(mp);
    free(x);
    free(w);
}

static void test_min_p(void)
{
    /* probabilities proportional to 8, 4, 2, 1 (and a tail) */
    const float l[6] = {logf(8.0f), logf(4.0f), logf(2.0f), logf(1.0f), -5.0f, NAN};
    float work[6];
    long count[6] = {0};
    struct sampler *s = make(1.0f, 0, 1.0f, 0.3f, 11, 6); /* keeps p >= 0.3 * p_max: 8 and 4 */
    for (int d = 0; d < 4000; d++) count[draw(s, l, 6, work)]++;
    CHECK(count[0] > 0 && count[1] > 0);
    CHECK_EQ_INT(count[2] + count[3] + count[4] + count[5], 0);
    CHECK_MSG(fabs(count[0] / 4000.0 - 2.0 / 3.0) < 0.04, "min-p renormalised: %ld of 4000", count[0]);
    sampler_free(s);
}

static struct sampler *make_pen(float rep, float presence, float freq)
{
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.0f; /* greedy: sample() only applies the penalties to the logits */
    p.repetition_penalty = rep;
    p.presence_penalty = presence;
    p.frequency_penalty = freq;
    struct sampler *s = NULL;
    CHECK_EQ_INT(sampler_create(&p, 1000, &s), KVB_OK);
    return s;
}

static void test_penalties(void)
{
    float x[1000];
    int32_t tok;

    struct sampler *s = make_pen(2.0f, 0.0f, 0.0f);
    memset(x, 0, sizeof x);
    x[0] = 2.0f;
    x[1] = -2.0f;
    x[2] = 1.0f;
    sampler_accept(s, 0);
    sampler_accept(s, 1);
    sampler_accept(s, 0); /* repeats do not compound: repetition is once per token */
    CHECK_EQ_INT(sampler_sample(s, x, &tok), KVB_OK);
    CHECK(x[0] == 1.0f && x[1] == -4.0f && x[2] == 1.0f);
    CHECK_EQ_INT(tok, 0); /* 1.0 vs 1.0: lowest id */
    sampler_free(s);

    /* A repetition penalty turns a greedy choice. */
    s = make_pen(1.1f, 0.0f, 0.0f);
    memset(x, 0, sizeof x);
    x[5] = 2.0f;
    x[6] = 1.9f;
    sampler_accept(s, 5);
    CHECK_EQ_INT(sampler_sample(s, x, &tok), KVB_OK);
    CHECK_EQ_INT(tok, 6);
    sampler_free(s);

    s = make_pen(1.0f, 0.5f, 0.0f);
    memset(x, 0, sizeof x);
    sampler_accept(s, 3);
    sampler_accept(s, 3);
    sampler_accept(s, 4);
    CHECK_EQ_INT(sampler_sample(s, x, &tok), KVB_OK);
    CHECK(x[3] == -0.5f && x[4] == -0.5f && x[5] == 0.0f);
    sampler_free(s);

    s = make_pen(1.0f, 0.0f, 0.25f);
    memset(x, 0, sizeof x);
    sampler_accept(s, 3);
    sampler_accept(s, 3);
    sampler_accept(s, 4);
    sampler_accept(s, -1);   /* out of range: ignored */
    sampler_accept(s, 1000); /* out of range: ignored */
    CHECK_EQ_INT(sampler_sample(s, x, &tok), KVB_OK);
    CHECK(x[3] == -0.5f && x[4] == -0.25f && x[0] == 0.0f);
    CHECK_EQ_INT(tok, 0);
    sampler_free(s);

    /* The window: after many accepts the counts are those of the last 4096
     * tokens (frequency 1 turns them into -count exactly). */
    s = make_pen(1.0f, 0.0f, 1.0f);
    enum { HIST = 4096, TOTAL = 20000 };
    static int32_t seq[TOTAL];
    lcg_state = 99;
    for (int i = 0; i < TOTAL; i++) {
        seq[i] = (int32_t)(lcg_uniform() * (i % 3 == 0 ? 20 : 1000)); /* some very frequent */
        sampler_accept(s, seq[i]);
    }
    int ref[1000] = {0};
    for (int i = TOTAL - HIST; i < TOTAL; i++) ref[seq[i]]++;
    memset(x, 0, sizeof x);
    CHECK_EQ_INT(sampler_sample(s, x, &tok), KVB_OK);
    int bad = 0;
    for (int i = 0; i < 1000; i++) bad += x[i] != -(float)ref[i];
    CHECK_EQ_INT(bad, 0);
    sampler_reset(s); /* forgets the history */
    memset(x, 0, sizeof x);
    CHECK_EQ_INT(sampler_sample(s, x, &tok), KVB_OK);
    CHECK(x[seq[TOTAL - 1]] == 0.0f);
    sampler_free(s);
}

static void test_logprob(void)
{
    const int32_t n = BIG_VOCAB + 3;
    float *x = malloc((size_t)n * sizeof *x);
    random_logits(x, n, 31);
    double mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += exp(x[i] - mx);
    double worst = 0.0;
    const int32_t probe[5] = {0, 1, 777, n / 2, n - 1};
    for (int k = 0; k < 5; k++) {
        double want = (x[probe[k]] - mx) - log(sum);
        double got = sampler_logprob(x, n, probe[k]);
        double err = fabs(got - want);
        worst = err > worst ? err : worst;
    }
    CHECK_MSG(worst < 1e-5, "logprob error %g", worst);
    int32_t am = ref_argmax(x, n);
    CHECK(sampler_logprob(x, n, am) <= 0.0f);

    /* large offsets must not overflow; -inf entries have no mass */
    const float y[4] = {1000.0f, 1000.0f, -INFINITY, 999.0f};
    double z = 2.0 + exp(-1.0);
    CHECK(fabs(sampler_logprob(y, 4, 0) - (-log(z))) < 1e-6);
    CHECK(fabs(sampler_logprob(y, 4, 3) - (-1.0 - log(z))) < 1e-6);
    CHECK(sampler_logprob(y, 4, 2) == -INFINITY);
    CHECK(isnan(sampler_logprob(y, 4, 4)));
    free(x);
}

static void test_params(void)
{
    struct sampler_params p;
    struct sampler *s = NULL;
    sampler_params_default(&p);
    CHECK(p.temperature == 1.0f && p.top_k <= 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    CHECK_EQ_INT(sampler_create(&p, 0, &s), KVB_ERR_INVALID_ARG);
    p.top_p = 0.0f;
    CHECK_EQ_INT(sampler_create(&p, 10, &s), KVB_ERR_INVALID_ARG);
    sampler_params_default(&p);
    p.temperature = -1.0f;
    CHECK_EQ_INT(sampler_create(&p, 10, &s), KVB_ERR_INVALID_ARG);
    sampler_params_default(&p);
    p.min_p = 1.0f;
    CHECK_EQ_INT(sampler_create(&p, 10, &s), KVB_ERR_INVALID_ARG);
    sampler_params_default(&p);
    p.repetition_penalty = 0.0f;
    CHECK_EQ_INT(sampler_create(&p, 10, &s), KVB_ERR_INVALID_ARG);
    CHECK(s == NULL);
    sampler_free(NULL);

    /* Allocation failures at every step: NOMEM, never a crash. */
    sampler_params_default(&p);
    p.repetition_penalty = 1.2f;
    p.top_p = 0.9f;
    int ok_at = -1;
    for (long k = 0; k < 10 && ok_at < 0; k++) {
        kvb_alloc_fail_after(k);
        enum kvb_status st = sampler_create(&p, 100, &s);
        if (st == KVB_OK) {
            float x[100] = {0};
            int32_t tok;
            st = sampler_sample(s, x, &tok); /* lazily allocated scratch may fail too */
            CHECK(st == KVB_OK || st == KVB_ERR_NOMEM);
            if (st == KVB_OK) ok_at = (int)k;
            sampler_free(s);
        } else {
            CHECK_EQ_INT(st, KVB_ERR_NOMEM);
        }
        kvb_alloc_fail_after(-1);
    }
    CHECK(ok_at > 0);
}

static double now_s(void) { return kvb_clock_s(); }

static void report_timing(void)
{
    const int32_t n = BIG_VOCAB;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    random_logits(x, n, 2024);
    struct {
        const char *name;
        float temp, top_p;
        int32_t top_k;
    } cfg[4] = {{"greedy", 0.0f, 1.0f, 0},
                {"temperature 0.8", 0.8f, 1.0f, 0},
                {"top-k 40", 0.8f, 1.0f, 40},
                {"top-p 0.95", 0.8f, 0.95f, 0}};
    for (int c = 0; c < 4; c++) {
        struct sampler *s = make(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, 0.0f, 1, n);
        double total = 0.0;
        const int iters = 200;
        for (int it = 0; it < iters; it++) {
            memcpy(w, x, (size_t)n * sizeof *w);
            int32_t tok;
            double t0 = now_s();
            (void)sampler_sample(s, w, &tok);
            total += now_s() - t0;
        }
        printf("sampler_sample, %d logits, %-16s %7.1f us/call\n", n, cfg[c].name, total / iters * 1e6);
        sampler_free(s);
    }
    free(x);
    free(w);
}

/* logit_bias: added before everything, copied at create (the caller's
 * array may go), never greedy on the device, bad ids refused. */
static void test_logit_bias(void)
{
    float work[8];
    const float x[6] = {0.0f, 5.0f, 1.0f, 0.0f, 0.0f, 0.0f};
    struct sampler_bias *b = malloc(2 * sizeof *b);
    b[0] = (struct sampler_bias){1, -100.0f};
    b[1] = (struct sampler_bias){4, 0.5f};
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.bias = b;
    p.n_bias = 2;
    CHECK(!sampler_is_greedy(&p));
    struct sampler *s = NULL;
    CHECK(sampler_create(&p, 6, &s) == KVB_OK);
    b[0].value = 100.0f; /* the sampler's copy is what counts */
    free(b);
    CHECK_EQ_INT(draw(s, x, 6, work), 2); /* 1 banned; 2 (1.0) beats 4 (0.5) */
    CHECK_EQ_INT(draw(s, x, 6, work), 2); /* applied afresh each time, not accumulated */
    sampler_free(s);
    struct sampler_bias force = {5, 100.0f};
    p.bias = &force;
    p.n_bias = 1;
    p.temperature = 1.0f;
    CHECK(sampler_create(&p, 6, &s) == KVB_OK);
    for (int k = 0; k < 20; k++) CHECK_EQ_INT(draw(s, x, 6, work), 5);
    sampler_free(s);
    struct sampler_bias bad = {6, 1.0f};
    p.bias = &bad;
    CHECK_EQ_INT(sampler_create(&p, 6, &s), KVB_ERR_INVALID_ARG);
    bad = (struct sampler_bias){0, NAN};
    CHECK_EQ_INT(sampler_create(&p, 6, &s), KVB_ERR_INVALID_ARG);
}

/* min_tokens' ban: the banned ids cannot be drawn until ban_until tokens
 * are accepted, greedy or not; the request is then no longer "greedy" for
 * a backend to decide alone. Bad ban ids are refused. */
static void test_ban(void)
{
    const float l[5] = {0.0f, 5.0f, 1.0f, 4.0f, -1.0f};
    const int32_t ban[2] = {1, 3};
    for (int t = 0; t < 2; t++) {
        struct sampler_params p;
        sampler_params_default(&p);
        p.temperature = t ? 0.7f : 0.0f;
        p.top_k = t ? 2 : 0; /* among the two best left: never 1 or 3 while banned */
        p.ban = ban;
        p.n_ban = 2;
        p.ban_until = 2;
        CHECK(!sampler_is_greedy(&p));
        struct sampler *s = NULL;
        CHECK(sampler_create(&p, 5, &s) == KVB_OK);
        if (!s) return;
        for (int k = 0; k < 40; k++) {
            sampler_reset(s);
            for (int step = 0; step < 3; step++) {
                float x[5];
                memcpy(x, l, sizeof x);
                int32_t tok = -1;
                CHECK(sampler_sample(s, x, &tok) == KVB_OK);
                if (step < 2) CHECK_MSG(tok != 1 && tok != 3, "step %d drew banned %d", step, tok);
                if (step == 2 && !t) CHECK_EQ_INT(tok, 1); /* the ban is over */
                sampler_accept(s, tok);
            }
        }
        sampler_free(s);
    }
    struct sampler_params p;
    sampler_params_default(&p);
    p.ban = ban;
    p.n_ban = 2;
    p.ban_until = 0;
    CHECK(sampler_is_greedy(&p) == (p.temperature == 0.0f));
    const int32_t bad[1] = {5};
    p.ban = bad;
    p.n_ban = 1;
    struct sampler *s = NULL;
    CHECK(sampler_create(&p, 5, &s) == KVB_ERR_INVALID_ARG && !s);
}

int main(void)
{
    test_greedy();
    test_ban();
    test_logit_bias();
    test_determinism();
    test_distributions();
    test_top_p_big();
    test_truncation_equals_greedy();
    test_min_p();
    test_penalties();
    test_logprob();
    test_params();
    report_timing();
    return tu_finish();
}
