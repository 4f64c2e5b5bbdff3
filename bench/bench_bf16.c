/* bench_bf16.c — F16 and BF16 weights: the AMX BF16 tiles against the
 * AVX-512 kernels, on BERT-base and Qwen3-0.6B shapes, 1 to 512 tokens.
 *
 * Not a test: it prints, per shape and token count, CPU milliseconds per
 * product of each (interleaved, process CPU time: on a shared machine the
 * work a kernel costs) and their ratio, and each one's error against a
 * double-precision dot product (RMS and max of |y - exact| / sum |w x| over
 * a sample of outputs). Usage: bench_bf16 [f16|bf16] [threads=1] [reps=3]
 * [only this token count] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "base/tpool.h"
#include "model/quant.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static double unif(void) { return (double)(kvb_xorshift64(&rng) >> 11) * 0x1.0p-53; }
static float gauss(void) { return (float)(sqrt(-2.0 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif())); }

int main(int argc, char **argv)
{
    const enum ggml_type type = argc > 1 && !strcmp(argv[1], "bf16") ? GGML_TYPE_BF16 : GGML_TYPE_F16;
    const int nth = argc > 2 ? atoi(argv[2]) : 1, reps = argc > 3 ? atoi(argv[3]) : 3;
    const int64_t only = argc > 4 ? atoll(argv[4]) : 0;
    static const int64_t shapes[][2] = {{768, 768}, {768, 3072}, {3072, 768}, {1024, 2048}, {1024, 3072}, {3072, 1024}};
    static const int64_t toks[] = {1, 4, 16, 64, 200, 512};
    struct tpool *pool = NULL;
    struct mm_ctx *ctx[2] = {NULL, NULL};
    if (tpool_create(nth, &pool) != KVB_OK) return 1;
    if (mm_ctx_create(pool, MM_IMPL_AVX512, &ctx[0], NULL) != KVB_OK) return 1;
    if (mm_ctx_create(pool, MM_IMPL_AMX, &ctx[1], NULL) != KVB_OK) return 1;
    printf("%s weights, %d thread(s), best of %d; err = |y - exact| / sum|w x|\n",
           type == GGML_TYPE_F16 ? "F16" : "BF16", nth, reps);
    printf("%6s %6s %5s | %10s %10s %6s | %9s %9s | %9s %9s\n", "n_in", "n_out", "tok", "avx512 ms", "amx ms", "x",
           "rms avx", "rms amx", "max avx", "max amx");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t n_in = shapes[si][0], n_out = shapes[si][1];
        uint16_t *w = kvb_aligned_alloc(64, (size_t)(n_in * n_out) * 2);
        float *wf = malloc(sizeof(float) * (size_t)(n_in * n_out));
        for (int64_t i = 0; i < n_in * n_out; i++) {
            float f = 0.05f * gauss();
            w[i] = type == GGML_TYPE_F16 ? kvb_f32_to_fp16(f) : kvb_f32_to_bf16(f);
            wf[i] = type == GGML_TYPE_F16 ? kvb_fp16_to_f32(w[i]) : kvb_bf16_to_f32(w[i]);
        }
        const struct mm_weight mw = {type, n_in, n_out, w, (size_t)n_in * 2, 0};
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
            const int64_t nt = toks[ti];
            if (only && nt != only) continue;
            float *x = malloc(sizeof(float) * (size_t)(n_in * nt));
            float *y[2] = {malloc(sizeof(float) * (size_t)(n_out * nt)), malloc(sizeof(float) * (size_t)(n_out * nt))};
            for (int64_t i = 0; i < n_in * nt; i++) x[i] = gauss() * (unif() < 0.01 ? 20.0f : 1.0f);
            double best[2] = {1e30, 1e30};
            const int calls = nt >= 64 ? 2 : 20;
            for (int r = 0; r < reps; r++)
                for (int k = 0; k < 2; k++) {
                    double t0 = cpu_now();
                    for (int c = 0; c < calls; c++)
                        if (mm_matmul(ctx[k], &mw, x, nt, y[k]) != KVB_OK) return 2;
                    double dt = (cpu_now() - t0) / calls;
                    if (dt < best[k]) best[k] = dt;
                }
            double se[2] = {0, 0}, mx[2] = {0, 0};
            int n = 0;
            for (int64_t t = 0; t<nt; t += nt> 16 ? 7 : 1)
                for (int64_t o = 0; o < n_out; o += 5, n++) {
                    double e = 0, m = 0;
                    for (int64_t i = 0; i < n_in; i++) {
                        e += (double)wf[o * n_in + i] * x[t * n_in + i];
                        m += fabs((double)wf[o * n_in + i] * x[t * n_in + i]);
                    }
                    for (int k = 0; k < 2; k++) {
                        double r = fabs(y[k][t * n_out + o] - e) / m;
                        se[k] += r * r;
                        if (r > mx[k]) mx[k] = r;
                    }
                }
            printf("%6lld %6lld %5lld | %10.3f %10.3f %6.2f | %9.2e %9.2e | %9.2e %9.2e\n", (long long)n_in,
                   (long long)n_out, (long long)nt, 1e3 * best[0], 1e3 * best[1], best[0] / best[1], sqrt(se[0] / n),
                   sqrt(se[1] / n), mx[0], mx[1]);
            fflush(stdout);
            free(x);
            free(y[0]);
            free(y[1]);
        }
        kvb_free(w);
        free(wf);
    }
    mm_ctx_free(ctx[0]);
    mm_ctx_free(ctx[1]);
    tpool_free(pool);
    return 0;
}
