/* bench_matmul.c — timing of the matrix products on SmolLM2-135M shapes.
 *
 * Built and run by scripts/bench-matmul.sh (not a ctest: it measures, it does
 * not check). Two kinds of numbers:
 *   1. per shape, one weight matrix called in a loop (its weights stay in
 *      cache: the kernel's best case), ms per call and GFLOP/s;
 *   2. a whole-model pass: 30 layers with their own weight buffers (the 7
 *      products of each) plus the tied Q8_0 output head, so the weights
 *      stream from memory as in a real forward pass; gives tok/s for decode
 *      (n_tok 1) and prefill (n_tok 512; the head applied to all 512 tokens,
 *      and to 1 token as a prefill that only samples the last position).
 * Usage: bench_matmul [impl=auto|scalar|avx2|avx512] [threads=2] [seconds=0.5]
 *
 * `bench_matmul types [impl] [threads] [seconds]` instead compares the
 * weight types with one another (bench_types below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "base/tpool.h"
#include "model/quant.h"

static double now(void) { return kvb_clock_s(); }

/* CPU seconds of the whole process (all pool threads): on a shared machine
 * the work a kernel costs, whatever share of the cores it was given. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { return (uint32_t)(kvb_xorshift64(&rng) >> 32); }

/* Byte offsets of a block's f16 scale and (-1: none) f16 min. */
static void scale_fields(enum ggml_type type, int *d_off, int *m_off)
{
    *m_off = -1;
    switch (type) {
    case GGML_TYPE_Q6_K: *d_off = 208; break;
    case GGML_TYPE_Q3_K: *d_off = 108; break;
    case GGML_TYPE_Q2_K:
        *d_off = 80;
        *m_off = 82;
        break;
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
        *d_off = 0;
        *m_off = 2;
        break;
    default: *d_off = 0; break;
    }
}

/* Random blocks with realistic f16 scales (0.01 and, for a min, -0.1). */
static struct mm_weight make_weight(enum ggml_type type, int64_t n_in, int64_t n_out)
{
    uint64_t rb = 0;
    ggml_type_row_bytes((uint32_t)type, (uint64_t)n_in, &rb);
    const struct ggml_type_traits *tr = ggml_type_get_traits((uint32_t)type);
    size_t total = (size_t)rb * (size_t)n_out;
    uint8_t *w = aligned_alloc(64, (total + 63) & ~(size_t)63);
    for (size_t i = 0; i < total; i++) w[i] = (uint8_t)rnd();
    uint16_t d = kvb_f32_to_fp16(0.01f), m = kvb_f32_to_fp16(-0.1f);
    int d_off, m_off;
    scale_fields(type, &d_off, &m_off);
    for (size_t b = 0; type != GGML_TYPE_F32 && b < total / tr->block_bytes; b++) {
        uint8_t *p = w + b * tr->block_bytes;
        memcpy(p + d_off, &d, 2);
        if (m_off >= 0) memcpy(p + m_off, &m, 2);
    }
    return (struct mm_weight){type, n_in, n_out, w, (size_t)rb, 0};
}

/* The weight as the CPU backend holds it: packed for the kernels where they
 * have a packed form (mm_pack_weight), the original freed. */
static struct mm_weight packed(struct mm_ctx *ctx, struct mm_weight w)
{
    struct mm_weight pw;
    void *owned = NULL;
    if (mm_pack_weight(ctx, &w, &pw, &owned) != KVB_OK || !owned) return w;
    free((void *)w.data);
    return pw;
}

static void free_weight(struct mm_weight *w)
{
    if (w->packed) kvb_free((void *)w->data);
    else free((void *)w->data);
}

struct shape {
    const char *name;
    enum ggml_type type;
    int64_t n_in, n_out;
    int per_layer; /* how many of these one layer runs */
};

static const struct shape shapes[] = {
    {"q/o   576->576  ", GGML_TYPE_Q4_1, 576, 576, 2},   {"k/v   576->192  ", GGML_TYPE_Q4_1, 576, 192, 2},
    {"gate/up 576->1536", GGML_TYPE_Q4_1, 576, 1536, 2}, {"down 1536->576  ", GGML_TYPE_Q4_1, 1536, 576, 1},
    {"head 576->49152 ", GGML_TYPE_Q8_0, 576, 49152, 0},
};
#define N_SHAPES 5
#define N_LAYERS 30

static double time_calls(struct mm_ctx *ctx, const struct mm_weight *w, const float *x, int64_t n_tok, float *y,
                         double seconds)
{
    mm_matmul(ctx, w, x, n_tok, y); /* warm-up: scratch, caches */
    int iters = 0;
    double t0 = now(), t;
    do {
        mm_matmul(ctx, w, x, n_tok, y);
        iters++;
        t = now() - t0;
    } while (t < seconds);
    return t / iters;
}

/* One model pass; returns seconds. Q/K/V and gate/up share their input. */
static double model_pass(struct mm_ctx *ctx, struct mm_weight (*lw)[7], const struct mm_weight *head, const float *x,
                         int64_t n_tok, int64_t head_tok, float *y, float *y2, float *y3)
{
    double t0 = now();
    for (int l = 0; l < N_LAYERS; l++) {
        const struct mm_weight *qkv[3] = {&lw[l][0], &lw[l][1], &lw[l][2]};
        float *yq[3] = {y, y2, y3};
        mm_set_input(ctx, x, 576, n_tok);
        mm_apply_n(ctx, qkv, yq, 3);
        mm_matmul(ctx, &lw[l][3], x, n_tok, y);
        const struct mm_weight *gu[2] = {&lw[l][4], &lw[l][5]};
        float *yg[2] = {y, y2};
        mm_set_input(ctx, x, 576, n_tok);
        mm_apply_n(ctx, gu, yg, 2);
        mm_matmul(ctx, &lw[l][6], y2, n_tok, y);
    }
    mm_matmul(ctx, head, x, head_tok, y);
    return now() - t0;
}

/* ---- types: each weight type against Q4_K ---------------------------------------- */

static const enum ggml_type cmp_types[] = {GGML_TYPE_Q4_K,   GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                                           GGML_TYPE_Q5_K,   GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                           GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0};
#define N_CMP ((int)(sizeof cmp_types / sizeof cmp_types[0]))
#define CMP_IN 2048
#define CMP_OUT 2048
#define CMP_ROUNDS 7
/* Decode from beyond L2: copies of the matrix cycled, this many bytes of Q4_K. */
#define CMP_STREAM_BYTES (64u << 20)

/* Every type on one shape (CMP_IN -> CMP_OUT) at a few token counts, the
 * types interleaved: CMP_ROUNDS rounds, each timing every type for
 * seconds / CMP_ROUNDS, so that a noisy neighbour slows all types alike and
 * the ratios to Q4_K (measured in the same rounds) hold when the absolute
 * figures do not. Figures are per CPU second of the process (CLOCK_PROCESS_
 * CPUTIME_ID), not per wall second: on a shared machine a run gets a varying
 * share of the cores; with threads > 1 a pool's waiting counts too, so the
 * single-thread figures are the cleanest. Rows "hot": one matrix called again and again (it stays in
 * L2: the kernel's arithmetic); "stream": n_tok 1 over copies of the matrix
 * totalling CMP_STREAM_BYTES of Q4_K (the same number of weights for every
 * type), read from L3 / memory as in a real decode step. */
static int bench_types(struct mm_ctx *ctx, double secs)
{
    static const int64_t toks[] = {1, 16, 512};
    enum { N_TOKS = 3, N_ROWS = N_TOKS + 1 };
    uint64_t q4k_bytes = 0;
    ggml_type_row_bytes(GGML_TYPE_Q4_K, CMP_IN, &q4k_bytes);
    int n_copies = (int)(CMP_STREAM_BYTES / (q4k_bytes * CMP_OUT));
    struct mm_weight *wbuf = calloc((size_t)(N_CMP * n_copies), sizeof *wbuf);
#define W(i, c) (wbuf[(i)*n_copies + (c)])
    for (int i = 0; i < N_CMP; i++)
        for (int c = 0; c < n_copies; c++) W(i, c) = packed(ctx, make_weight(cmp_types[i], CMP_IN, CMP_OUT));
    float *x = malloc(sizeof(float) * CMP_IN * 512), *y = malloc(sizeof(float) * CMP_OUT * 512);
    for (int i = 0; i < CMP_IN * 512; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    double t_sum[N_CMP][N_ROWS] = {{0}};
    long calls[N_CMP][N_ROWS] = {{0}};
    for (int i = 0; i < N_CMP; i++) /* warm-up: scratch, first touch */
        for (int c = 0; c < n_copies; c++) mm_matmul(ctx, &W(i, c), x, 512, y);
    for (int r = 0; r < CMP_ROUNDS; r++)
        for (int row = 0; row < N_ROWS; row++)
            for (int i = 0; i < N_CMP; i++) {
                int64_t nt = row < N_TOKS ? toks[row] : 1;
                double t0 = now(), c0 = cpu_now();
                long n = 0;
                do {
                    int c = row < N_TOKS ? 0 : (int)(n % n_copies);
                    mm_matmul(ctx, &W(i, c), x, nt, y);
                    n++;
                } while (now() - t0 < secs / CMP_ROUNDS / N_ROWS);
                t_sum[i][row] += cpu_now() - c0;
                calls[i][row] += n;
            }
    printf("%d -> %d, GFLOP per CPU second (x Q4_K, same rounds); stream: n_tok 1 over %d copies (%.0f MiB of Q4_K)\n",
           CMP_IN, CMP_OUT, n_copies, (double)n_copies * (double)(q4k_bytes * CMP_OUT) / (1 << 20));
    printf("%-7s %5s", "type", "bits");
    for (int row = 0; row < N_ROWS; row++) {
        char h[32];
        if (row < N_TOKS) snprintf(h, sizeof h, "n_tok %lld", (long long)toks[row]);
        else snprintf(h, sizeof h, "stream");
        printf(" %17s", h);
    }
    printf("\n");
    for (int i = 0; i < N_CMP; i++) {
        const struct ggml_type_traits *tr = ggml_type_get_traits((uint32_t)cmp_types[i]);
        printf("%-7s %5.2f", tr->name, 8.0 * tr->block_bytes / tr->block_elems);
        for (int row = 0; row < N_ROWS; row++) {
            int64_t nt = row < N_TOKS ? toks[row] : 1;
            double flop = 2.0 * CMP_IN * CMP_OUT * (double)nt;
            double g = flop * (double)calls[i][row] / t_sum[i][row] * 1e-9;
            double g0 = flop * (double)calls[0][row] / t_sum[0][row] * 1e-9;
            printf(" %9.1f (%4.2fx)", g, g / g0);
        }
        printf("\n");
    }
    for (int i = 0; i < N_CMP; i++)
        for (int c = 0; c < n_copies; c++) free_weight(&W(i, c));
#undef W
    free(wbuf);
    free(x);
    free(y);
    return 0;
}

int main(int argc, char **argv)
{
    int types_mode = argc > 1 && !strcmp(argv[1], "types");
    if (types_mode) {
        argc--;
        argv++;
    }
    const char *impl_s = argc > 1 ? argv[1] : "auto";
    int nth = argc > 2 ? atoi(argv[2]) : 2;
    double secs = argc > 3 ? atof(argv[3]) : 0.5;
    enum mm_impl impl = MM_IMPL_AUTO;
    if (!strcmp(impl_s, "scalar")) impl = MM_IMPL_SCALAR;
    else if (!strcmp(impl_s, "avx2")) impl = MM_IMPL_AVX2;
    else if (!strcmp(impl_s, "avx512")) impl = MM_IMPL_AVX512;
    struct tpool *pool;
    struct mm_ctx *ctx;
    struct kvb_err err;
    if (tpool_create(nth, &pool) != KVB_OK) return 1;
    if (mm_ctx_create(pool, impl, &ctx, &err) != KVB_OK) {
        fprintf(stderr, "bench_matmul: %s\n", err.msg);
        return 1;
    }
    printf("impl %s, %d threads\n", mm_ctx_impl_name(ctx), nth);
    if (types_mode) {
        int rc = bench_types(ctx, secs);
        mm_ctx_free(ctx);
        tpool_free(pool);
        return rc;
    }

    const int64_t toks[3] = {1, 32, 512};
    float *x = malloc(sizeof(float) * 1536 * 512);
    for (int i = 0; i < 1536 * 512; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    float *y = malloc(sizeof(float) * 49152 * 512);
    double per_call[N_SHAPES][3];
    printf("%-18s %6s %10s %9s\n", "shape", "n_tok", "ms/call", "GFLOP/s");
    for (int s = 0; s < N_SHAPES; s++) {
        struct mm_weight w = packed(ctx, make_weight(shapes[s].type, shapes[s].n_in, shapes[s].n_out));
        for (int ti = 0; ti < 3; ti++) {
            double t = time_calls(ctx, &w, x, toks[ti], y, secs);
            per_call[s][ti] = t;
            double flop = 2.0 * (double)shapes[s].n_in * (double)shapes[s].n_out * (double)toks[ti];
            printf("%-18s %6lld %10.4f %9.1f\n", shapes[s].name, (long long)toks[ti], t * 1e3, flop / t * 1e-9);
        }
        free_weight(&w);
    }
    for (int ti = 0; ti < 3; ti++) {
        double layer = 0;
        for (int s = 0; s < 4; s++) layer += shapes[s].per_layer * per_call[s][ti];
        double total = N_LAYERS * layer + per_call[4][ti];
        printf("estimate from hot per-shape times, n_tok %lld: %.1f tok/s (%.2f ms per pass)\n", (long long)toks[ti],
               (double)toks[ti] / total, total * 1e3);
    }

    /* Whole-model pass with every layer's own weights (about 96 MB). */
    struct mm_weight(*lw)[7] = malloc(sizeof(*lw) * N_LAYERS);
    static const int order[7] = {0, 1, 1, 0, 2, 2, 3}; /* q k v o gate up down */
    for (int l = 0; l < N_LAYERS; l++)
        for (int i = 0; i < 7; i++) {
            const struct shape *sh = &shapes[order[i]];
            lw[l][i] = packed(ctx, make_weight(sh->type, sh->n_in, sh->n_out));
        }
    struct mm_weight head = packed(ctx, make_weight(GGML_TYPE_Q8_0, 576, 49152));
    float *y2 = malloc(sizeof(float) * 1536 * 512), *y3 = malloc(sizeof(float) * 1536 * 512);
    for (int ti = 0; ti < 2; ti++) {
        int64_t nt = toks[ti];
        int reps = nt == 1 ? 50 : 3;
        if (nt > 1 && !strcmp(mm_ctx_impl_name(ctx), "scalar")) {
            printf("model pass, n_tok %lld: skipped for scalar (minutes); see the estimate above\n", (long long)nt);
            continue;
        }
        model_pass(ctx, lw, &head, x, nt, nt, y, y2, y3);
        double best = 1e9, sum = 0;
        for (int r = 0; r < reps; r++) {
            double t = model_pass(ctx, lw, &head, x, nt, nt, y, y2, y3);
            sum += t;
            if (t < best) best = t;
        }
        printf("model pass (matmuls only), n_tok %3lld: %.1f tok/s mean, %.1f best (%.2f ms mean)\n", (long long)nt,
               (double)nt * reps / sum, (double)nt / best, sum / reps * 1e3);
        if (nt > 1) {
            double s2 = 0;
            for (int r = 0; r < reps; r++) s2 += model_pass(ctx, lw, &head, x, nt, 1, y, y2, y3);
            printf("model pass, n_tok %3lld, head on the last token only: %.1f tok/s\n", (long long)nt,
                   (double)nt * reps / s2);
        }
    }
    mm_ctx_free(ctx);
    tpool_free(pool);
    return 0;
}
