/* bench_amx.c — the AMX and AVX-512 matrix products side by side on the
 * shapes of a Llama-3.2-3B-shaped model (issue 26), interleaved call by call
 * (the machine is shared and noisy: a slow spell hits both sides), medians.
 *
 * Built by scripts/bench-amx.sh (target bench_amx, outside `all`; a
 * benchmark, never a test). Prints per shape and token count ms per call for
 * each implementation, GOP/s and the ratio; then one layer's seven products.
 * Usage: bench_amx [threads=2] [reps=7] [type=q4_0|q4_1|q8_0|q5_0|q5_1|q4_k|q6_k]
 *        bench_amx bw [threads=2] [MiB=2048]: the memory read rate (GB/s, best of 5 passes over a
 *        buffer far larger than the caches), for a decode's bound (bytes of weights per token / rate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "base/tpool.h"
#include "model/quant.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { return (uint32_t)(kvb_xorshift64(&rng) >> 32); }

static struct mm_weight make_weight(enum ggml_type type, int64_t n_in, int64_t n_out)
{
    uint64_t rb = 0;
    ggml_type_row_bytes((uint32_t)type, (uint64_t)n_in, &rb);
    const struct ggml_type_traits *tr = ggml_type_get_traits((uint32_t)type);
    size_t total = (size_t)rb * (size_t)n_out;
    uint8_t *w = kvb_aligned_alloc(64, (total + 63) & ~(size_t)63);
    for (size_t i = 0; i < total; i++) w[i] = (uint8_t)rnd();
    uint16_t d = kvb_f32_to_fp16(0.01f), m = kvb_f32_to_fp16(-0.1f);
    for (size_t b = 0; b < total / tr->block_bytes; b++) {
        uint8_t *p = w + b * tr->block_bytes;
        if (type == GGML_TYPE_Q6_K) {
            memcpy(p + 208, &d, 2);
        } else {
            memcpy(p, &d, 2);
            if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 || type == GGML_TYPE_Q4_K) memcpy(p + 2, &m, 2);
        }
    }
    return (struct mm_weight){type, n_in, n_out, w, (size_t)rb, 0};
}

struct shape {
    const char *name;
    int64_t n_in, n_out;
};

static const struct shape shapes[] = {
    {"q/o  3072->3072", 3072, 3072}, {"k/v  3072->1024", 3072, 1024},   {"gate/up 3072->8192", 3072, 8192},
    {"down 8192->3072", 8192, 3072}, {"head 3072->49152", 3072, 49152},
};
#define N_SHAPES 5

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static enum ggml_type type_of(const char *s)
{
    static const struct {
        const char *n;
        enum ggml_type t;
    } T[] = {{"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1}, {"q8_0", GGML_TYPE_Q8_0}, {"q5_0", GGML_TYPE_Q5_0},
             {"q5_1", GGML_TYPE_Q5_1}, {"q4_k", GGML_TYPE_Q4_K}, {"q6_k", GGML_TYPE_Q6_K}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(s, T[i].n)) return T[i].t;
    return GGML_TYPE_COUNT_;
}

struct bw_job {
    const uint64_t *buf;
    size_t n; /* words */
    uint64_t sum[64];
};

static void bw_worker(void *arg, int ith, int nth)
{
    struct bw_job *j = arg;
    size_t a = j->n * (size_t)ith / (size_t)nth / 8 * 8, b = j->n * (size_t)(ith + 1) / (size_t)nth / 8 * 8;
    const uint64_t *p = j->buf;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0; /* named: an array would live in memory */
    for (size_t i = a; i < b; i += 8) {
        s0 += p[i] + p[i + 4];
        s1 += p[i + 1] + p[i + 5];
        s2 += p[i + 2] + p[i + 6];
        s3 += p[i + 3] + p[i + 7];
    }
    j->sum[ith] = s0 ^ s1 ^ s2 ^ s3;
}

static int bandwidth(int nth, size_t mib)
{
    struct tpool *pool;
    if (nth > 64 || tpool_create(nth, &pool) != KVB_OK) return 1;
    size_t bytes = mib << 20;
    uint64_t *buf = kvb_aligned_alloc(64, bytes);
    if (!buf) return 1;
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i;
    struct bw_job j = {buf, bytes / 8, {0}};
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = kvb_clock_s();
        tpool_run(pool, bw_worker, &j);
        double gbs = (double)bytes / (kvb_clock_s() - t0) * 1e-9;
        if (gbs > best) best = gbs;
    }
    printf("memory read: %.1f GB/s (%d threads, %zu MiB, best of 5) [%llx]\n", best, nth, mib,
           (unsigned long long)j.sum[0]);
    kvb_free(buf);
    tpool_free(pool);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "bw"))
        return bandwidth(argc > 2 ? atoi(argv[2]) : 2, argc > 3 ? (size_t)atol(argv[3]) : 2048);
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    enum ggml_type type = type_of(argc > 3 ? argv[3] : "q4_0");
    if (type == GGML_TYPE_COUNT_ || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: bench_amx [threads] [reps 1..99] [q4_0|q4_1|q8_0|q5_0|q5_1|q4_k|q6_k]\n");
        return 2;
    }
    if (!mm_impl_available(MM_IMPL_AMX) || !mm_impl_available(MM_IMPL_AVX512)) {
        fprintf(stderr, "bench_amx: this machine cannot run both the AMX and the AVX-512 kernels\n");
        return 77;
    }
    struct tpool *pool;
    struct mm_ctx *ctx[2];
    if (tpool_create(nth, &pool) != KVB_OK) return 1;
    if (mm_ctx_create(pool, MM_IMPL_AVX512, &ctx[0], NULL) != KVB_OK) return 1;
    if (mm_ctx_create(pool, MM_IMPL_AMX, &ctx[1], NULL) != KVB_OK) return 1;
    printf("bench_amx: %s weights (head Q6_K), %d threads, median of %d interleaved calls\n",
           ggml_type_get_traits((uint32_t)type)->name, nth, reps);
    const int64_t toks[3] = {1, 32, 512};
    float *x = malloc(sizeof(float) * 8192 * 512);
    for (int i = 0; i < 8192 * 512; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    float *y = malloc(sizeof(float) * 49152 * 512);
    printf("%-20s %5s %12s %12s %9s %9s %7s\n", "shape", "n_tok", "avx512 ms", "amx ms", "avx GOP/s", "amx GOP/s",
           "ratio");
    double layer[3][2] = {{0}};
    for (int s = 0; s < N_SHAPES; s++) {
        /* Each implementation gets the weight in its own packed form (a
         * context refuses another's packing with an error, which must not be
         * timed as a product). */
        struct mm_weight w0 = make_weight(s == 4 ? GGML_TYPE_Q6_K : type, shapes[s].n_in, shapes[s].n_out), w[2];
        void *owned[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++)
            if (mm_pack_weight(ctx[k], &w0, &w[k], &owned[k]) != KVB_OK) return 1;
        for (int ti = 0; ti < 3; ti++) {
            int64_t nt = toks[ti];
            if (s == 4 && nt == 512) continue; /* a prefill samples the last token only */
            double t[2][99];
            for (int r = -1; r < reps; r++)
                for (int k = 0; k < 2; k++) {
                    double t0 = kvb_clock_s();
                    if (mm_matmul(ctx[k], &w[k], x, nt, y) != KVB_OK) {
                        fprintf(stderr, "bench_amx: the %s product failed\n", k ? "amx" : "avx512");
                        return 1;
                    }
                    if (r >= 0) t[k][r] = kvb_clock_s() - t0;
                }
            double med[2];
            for (int k = 0; k < 2; k++) {
                qsort(t[k], (size_t)reps, sizeof(double), cmp_d);
                med[k] = t[k][reps / 2];
            }
            double op = 2.0 * (double)shapes[s].n_in * (double)shapes[s].n_out * (double)nt;
            printf("%-20s %5lld %12.3f %12.3f %9.1f %9.1f %6.2fx\n", shapes[s].name, (long long)nt, med[0] * 1e3,
                   med[1] * 1e3, op / med[0] * 1e-9, op / med[1] * 1e-9, med[0] / med[1]);
            static const int per_layer[N_SHAPES] = {2, 2, 2, 1, 0};
            for (int k = 0; k < 2; k++) layer[ti][k] += per_layer[s] * med[k];
        }
        for (int k = 0; k < 2; k++) kvb_free(owned[k]);
        kvb_free((void *)w0.data);
    }
    for (int ti = 0; ti < 3; ti++)
        printf("one layer's products, n_tok %3lld: avx512 %.2f ms, amx %.2f ms: %.2fx\n", (long long)toks[ti],
               layer[ti][0] * 1e3, layer[ti][1] * 1e3, layer[ti][0] / layer[ti][1]);
    for (int k = 0; k < 2; k++) mm_ctx_free(ctx[k]);
    tpool_free(pool);
    free(x);
    free(y);
    return 0;
}
