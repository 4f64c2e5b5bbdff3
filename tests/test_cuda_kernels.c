/* test_cuda_kernels.c — every CUDA kernel of kernels/ against its plain C
 * reference, over several shapes, llm.c style: for each case it prints the
 * normalised mean squared error (sum (got-ref)^2 / sum ref^2) and the worst
 * element, and fails when the NMSE or any element is outside a tolerance
 * that scales with the reference's magnitude. Conversions, copies and adds
 * must match bit for bit; reductions and transcendental functions to
 * rounding; the bf16 GEMM to f32 accumulation error. The KV store and the
 * attention kernels run on pools of each KV type (f16, q8, q4): the store's
 * bytes must be kv_quantize_row's exactly (corner cases included), and
 * attention over a quantized pool is held to the f16 tolerances against
 * attn_head's arithmetic on kv_dequantize_row'd rows (ref_attn_f32, itself
 * checked to give attn_head's bits on f16 rows), with and without a sliding
 * window (the blocks before it poisoned with NaN on the device) and
 * soft-capped scores.
 *
 * Skips (77) when kvbatch was built without CUDA or no usable device is
 * present (ctest label gpu). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/rng.h"
#include "support/testutil.h"

#ifdef KVBATCH_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/kvtype.h"
#include "base/dtype.h"
#include "cpu/attn.h"
#include "cpu/moe.h"
#include "engine/sampler.h"
#include "kernels/be_cuda.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_state = 12345;

static uint64_t rnd(void) { return kvb_splitmix64(&rng_state); }

/* Uniform in [-a, a). */
static float rnd_f(float a) { return a * (float)((double)(rnd() >> 11) * 0x1.0p-52 - 1.0); }

static void fill(float *x, int64_t n, float a)
{
    for (int64_t i = 0; i < n; i++) x[i] = rnd_f(a);
}

#define CU(expr)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));                     \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static void *dev_put(const void *host, size_t bytes)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 1));
    if (host) CU(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    else CU(cudaMemset(d, 0, bytes ? bytes : 1));
    return d;
}

static void dev_get(void *host, const void *dev, size_t bytes)
{
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

/* Compares got with ref: NMSE <= nmse_max, and every element within
 * rtol*|ref| + atol*max|ref| (a tolerance scaled by the reference's size).
 * nmse_max < 0 and rtol = atol = 0 demand bit equality. Prints one line. */
static void compare(const char *name, const float *got, const float *ref, int64_t n, double nmse_max, double rtol,
                    double atol)
{
    double se = 0, sr = 0, amax = 0, worst = 0;
    int64_t worst_i = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs((double)ref[i]));
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)got[i] - (double)ref[i];
        se += d * d;
        sr += (double)ref[i] * ref[i];
        const double tol = rtol * fabs((double)ref[i]) + atol * amax;
        const bool exact = nmse_max < 0;
        const bool ok = exact ? memcmp(&got[i], &ref[i], sizeof(float)) == 0 : (fabs(d) <= tol && isfinite(got[i]));
        if (!ok) bad++;
        const double ad = isnan(d) ? INFINITY : fabs(d);
        if (ad > worst) {
            worst = ad;
            worst_i = i;
        }
    }
    const double nmse = sr > 0 ? se / sr : se;
    const bool pass = bad == 0 && (nmse_max < 0 || nmse <= nmse_max);
    printf("%-44s n=%-8lld nmse=%.2e max|err|=%.2e (at %lld: %.6g vs %.6g) max|ref|=%.3g  %s\n", name, (long long)n,
           nmse, worst, (long long)worst_i, n ? got[worst_i] : 0.0f, n ? ref[worst_i] : 0.0f, amax,
           pass ? "ok" : "FAIL");
    CHECK_MSG(pass, "%s: %lld element(s) out of tolerance, nmse %.3e", name, (long long)bad, nmse);
}

static void compare_u16(const char *name, const uint16_t *got, const uint16_t *ref, int64_t n)
{
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            if (first < 0) first = i;
            bad++;
        }
    printf("%-44s n=%-8lld mismatches=%lld%s\n", name, (long long)n, (long long)bad,
           bad ? "  FAIL" : "  ok (bit-exact)");
    CHECK_MSG(bad == 0, "%s: %lld of %lld differ, first at %lld (%04x vs %04x)", name, (long long)bad, (long long)n,
              (long long)first, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0);
}

/* A fused kernel's bf16 output d_b (n values, on the device) against
 * kvb_f32_to_bf16 of the unfused kernel's f32 results: bit for bit. */
static void compare_bf16_of(const char *name, const uint16_t *d_b, const float *f32, int64_t n)
{
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)n), *got = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) want[i] = kvb_f32_to_bf16(f32[i]);
    dev_get(got, d_b, sizeof(uint16_t) * (size_t)n);
    compare_u16(name, got, want, n);
    free(want);
    free(got);
}

/* ---- embedding ------------------------------------------------------------------------------ */

static void test_embed(int32_t n_vocab, int32_t e, int32_t n_tok)
{
    uint16_t *table = malloc(sizeof(uint16_t) * (size_t)n_vocab * e);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_tok);
    float *ref = malloc(sizeof(float) * (size_t)n_tok * e), *got = malloc(sizeof(float) * (size_t)n_tok * e);
    for (int64_t i = 0; i < (int64_t)n_vocab * e; i++) table[i] = kvb_f32_to_bf16(rnd_f(2.0f));
    for (int32_t t = 0; t < n_tok; t++) tok[t] = (int32_t)(rnd() % (uint64_t)n_vocab);
    for (int32_t t = 0; t < n_tok; t++)
        for (int32_t i = 0; i < e; i++) ref[(int64_t)t * e + i] = kvb_bf16_to_f32(table[(int64_t)tok[t] * e + i]);
    uint16_t *d_table = dev_put(table, sizeof(uint16_t) * (size_t)n_vocab * e);
    int32_t *d_tok = dev_put(tok, sizeof(int32_t) * (size_t)n_tok);
    float *d_out = dev_put(NULL, sizeof(float) * (size_t)n_tok * e);
    CU(kcu_embed(d_out, d_table, d_tok, n_tok, e, 0));
    dev_get(got, d_out, sizeof(float) * (size_t)n_tok * e);
    char name[96];
    snprintf(name, sizeof name, "embed vocab=%d e=%d tok=%d", n_vocab, e, n_tok);
    compare(name, got, ref, (int64_t)n_tok * e, -1, 0, 0);
    cudaFree(d_table);
    cudaFree(d_tok);
    cudaFree(d_out);
    free(table);
    free(tok);
    free(ref);
    free(got);
}

/* ---- RMSNorm ------------------------------------------------------------------------------------ */

/* n_rows rows of n_sub sub-rows of n, stored with row stride ld; when
 * gather, rows are taken in a scrambled order through an index array. */
static void test_rmsnorm(int32_t n_rows, int32_t n_sub, int32_t n, int64_t ld, bool gather, bool in_place)
{
    const int64_t in_rows = gather ? 2 * n_rows + 1 : n_rows;
    const int64_t out_ld = in_place ? ld : (int64_t)n_sub * n;
    float *x = malloc(sizeof(float) * (size_t)(in_rows * ld)), *w = malloc(sizeof(float) * (size_t)n);
    float *ref = calloc((size_t)(n_rows * out_ld), sizeof(float)),
          *got = malloc(sizeof(float) * (size_t)(n_rows * out_ld));
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_rows);
    fill(x, in_rows * ld, 3.0f);
    for (int32_t i = 0; i < n; i++) w[i] = 1.0f + rnd_f(0.2f);
    for (int32_t r = 0; r < n_rows; r++) rows[r] = gather ? (int32_t)((r * 7 + 3) % in_rows) : r;
    if (in_place) memcpy(ref, x, sizeof(float) * (size_t)(n_rows * ld));
    for (int32_t r = 0; r < n_rows; r++)
        for (int32_t j = 0; j < n_sub; j++)
            attn_rmsnorm(ref + r * out_ld + (int64_t)j * n, x + rows[r] * ld + (int64_t)j * n, w, n, 1e-5f);
    float *d_x = dev_put(x, sizeof(float) * (size_t)(in_rows * ld)), *d_w = dev_put(w, sizeof(float) * (size_t)n);
    int32_t *d_rows = gather ? dev_put(rows, sizeof(int32_t) * (size_t)n_rows) : NULL;
    float *d_out = in_place ? d_x : dev_put(NULL, sizeof(float) * (size_t)(n_rows * out_ld));
    CU(kcu_rmsnorm(d_out, out_ld, d_x, ld, d_rows, n_rows, n_sub, n, d_w, 1e-5f, 0));
    dev_get(got, d_out, sizeof(float) * (size_t)(n_rows * out_ld));
    char name[96];
    snprintf(name, sizeof name, "rmsnorm rows=%d sub=%d n=%d%s%s", n_rows, n_sub, n, gather ? " gather" : "",
             in_place ? " in-place" : "");
    compare(name, got, ref, n_rows * out_ld, 1e-11, 1e-5, 1e-6);
    if (n_sub == 1 && !in_place) { /* the fused form */
        uint16_t *d_b = dev_put(NULL, sizeof(uint16_t) * (size_t)(n_rows * out_ld));
        CU(kcu_rmsnorm_bf16(d_b, out_ld, d_x, ld, d_rows, n_rows, n, d_w, 1e-5f, 0));
        snprintf(name, sizeof name, "rmsnorm->bf16 rows=%d n=%d%s", n_rows, n, gather ? " gather" : "");
        compare_bf16_of(name, d_b, got, n_rows * out_ld);
        cudaFree(d_b);
    }
    cudaFree(d_x);
    cudaFree(d_w);
    cudaFree(d_rows);
    if (!in_place) cudaFree(d_out);
    free(x);
    free(w);
    free(ref);
    free(got);
    free(rows);
}

/* ---- RoPE -------------------------------------------------------------------------------------- */

/* sc: the RoPE scaling (NULL: none); its frequencies and mscale come from
 * model_rope_freqs, which both backends use. */
static void test_rope_scaled(int32_t n_tok, int32_t n_heads, int32_t hd, int32_t rope_dim, int neox, int32_t max_pos,
                             const struct model_rope *sc, const char *label)
{
    const int64_t ld = (int64_t)n_heads * hd + 32; /* a stride wider than the row, as in the fused QKV */
    float *x = malloc(sizeof(float) * (size_t)(n_tok * ld)), *ref = malloc(sizeof(float) * (size_t)(n_tok * ld));
    float *got = malloc(sizeof(float) * (size_t)(n_tok * ld)), *inv = malloc(sizeof(float) * (size_t)(rope_dim / 2));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok);
    fill(x, n_tok * ld, 2.0f);
    memcpy(ref, x, sizeof(float) * (size_t)(n_tok * ld));
    struct model fm = {.hp = {.rope_dim = rope_dim, .head_dim = hd, .rope_base = 10000.0f},
                       .rope = {.type = ROPE_SCALING_NONE, .factor = 1.0f, .mscale = 1.0f}};
    if (sc) fm.rope = *sc;
    model_rope_freqs(&fm, inv);
    const float mscale = fm.rope.mscale;
    for (int32_t t = 0; t < n_tok; t++) pos[t] = t == 0 ? max_pos : (int32_t)(rnd() % (uint64_t)(max_pos + 1));
    for (int32_t t = 0; t < n_tok; t++)
        attn_rope(ref + t * ld, n_heads, hd, rope_dim, neox ? ROPE_NEOX : ROPE_NORM, pos[t], inv, mscale);
    float *d_x = dev_put(x, sizeof(float) * (size_t)(n_tok * ld)),
          *d_inv = dev_put(inv, sizeof(float) * (size_t)(rope_dim / 2));
    int32_t *d_pos = dev_put(pos, sizeof(int32_t) * (size_t)n_tok);
    CU(kcu_rope(d_x, ld, n_tok, n_heads, hd, rope_dim, neox, d_pos, d_inv, mscale, 0));
    dev_get(got, d_x, sizeof(float) * (size_t)(n_tok * ld));
    char name[96];
    snprintf(name, sizeof name, "rope %s %s tok=%d heads=%d hd=%d rot=%d pos<=%d", label, neox ? "neox" : "norm", n_tok,
             n_heads, hd, rope_dim, max_pos);
    /* cosf/sinf of the same f32 angle, within 2 ulp on either side. */
    compare(name, got, ref, n_tok * ld, 1e-11, 1e-5, 2e-6);
    cudaFree(d_x);
    cudaFree(d_inv);
    cudaFree(d_pos);
    free(x);
    free(ref);
    free(got);
    free(inv);
    free(pos);
}

static void test_rope(int32_t n_tok, int32_t n_heads, int32_t hd, int32_t rope_dim, int neox, int32_t max_pos)
{
    test_rope_scaled(n_tok, n_heads, hd, rope_dim, neox, max_pos, NULL, "plain");
}

/* Each scaling type GGUF files carry, through the same kernel. */
static void test_rope_scalings(void)
{
    float factors[64];
    for (int i = 0; i < 64; i++) factors[i] = i < 20 ? 1.0f : i > 40 ? 8.0f : 1.0f + 7.0f * (float)(i - 20) / 20.0f;
    const struct model_rope linear = {.type = ROPE_SCALING_LINEAR, .factor = 4.0f, .mscale = 1.0f};
    const struct model_rope yarn = {.type = ROPE_SCALING_YARN,
                                    .factor = 4.0f,
                                    .orig_ctx = 512,
                                    .beta_fast = 32.0f,
                                    .beta_slow = 1.0f,
                                    .mscale = 1.1386294f};
    const struct model_rope llama3 = {
        .type = ROPE_SCALING_NONE, .factor = 1.0f, .mscale = 1.0f, .freq_factors = factors};
    test_rope_scaled(5, 6, 128, 128, 0, 8000, &linear, "linear");
    test_rope_scaled(5, 6, 128, 128, 1, 8000, &linear, "linear");
    test_rope_scaled(5, 6, 128, 128, 1, 2047, &yarn, "yarn");
    test_rope_scaled(5, 6, 64, 64, 0, 2047, &yarn, "yarn");
    test_rope_scaled(5, 6, 128, 128, 0, 30000, &llama3, "llama3");
    /* Phi-4-mini: LongRoPE's factors and attention factor on 96 of 128 dims */
    const struct model_rope longrope = {
        .type = ROPE_SCALING_NONE, .factor = 1.0f, .mscale = 1.1902f, .freq_factors = factors};
    test_rope_scaled(5, 6, 128, 96, 1, 30000, &longrope, "longrope partial");
}

/* ---- elementwise ----------------------------------------------------------------------------- */

static void test_swiglu(int32_t n_tok, int32_t n_ff)
{
    const int64_t n = (int64_t)n_tok * n_ff;
    float *gu = malloc(sizeof(float) * (size_t)(2 * n)), *g = malloc(sizeof(float) * (size_t)n);
    float *u = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    fill(gu, 2 * n, 6.0f);
    for (int32_t t = 0; t < n_tok; t++)
        for (int32_t i = 0; i < n_ff; i++) {
            g[(int64_t)t * n_ff + i] = gu[(int64_t)t * 2 * n_ff + i];
            u[(int64_t)t * n_ff + i] = gu[(int64_t)t * 2 * n_ff + n_ff + i];
        }
    attn_swiglu(g, u, n);
    float *d_gu = dev_put(gu, sizeof(float) * (size_t)(2 * n)), *d_out = dev_put(NULL, sizeof(float) * (size_t)n);
    CU(kcu_swiglu(d_out, d_gu, n_tok, n_ff, 0));
    dev_get(got, d_out, sizeof(float) * (size_t)n);
    char name[96];
    snprintf(name, sizeof name, "swiglu tok=%d ff=%d", n_tok, n_ff);
    compare(name, got, g, n, 1e-12, 2e-6, 1e-7);
    {
        uint16_t *d_b = dev_put(NULL, sizeof(uint16_t) * (size_t)n);
        CU(kcu_swiglu_bf16(d_b, d_gu, n_tok, n_ff, 0));
        snprintf(name, sizeof name, "swiglu->bf16 tok=%d ff=%d", n_tok, n_ff);
        compare_bf16_of(name, d_b, got, n);
        cudaFree(d_b);
    }
    cudaFree(d_gu);
    cudaFree(d_out);
    free(gu);
    free(g);
    free(u);
    free(got);
}

/* GeGLU against attn_geglu (libm tanhf there, the device's here). */
static void test_geglu(int32_t n_tok, int32_t n_ff)
{
    const int64_t n = (int64_t)n_tok * n_ff;
    float *gu = malloc(sizeof(float) * (size_t)(2 * n)), *g = malloc(sizeof(float) * (size_t)n);
    float *u = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    fill(gu, 2 * n, 6.0f);
    for (int32_t t = 0; t < n_tok; t++)
        for (int32_t i = 0; i < n_ff; i++) {
            g[(int64_t)t * n_ff + i] = gu[(int64_t)t * 2 * n_ff + i];
            u[(int64_t)t * n_ff + i] = gu[(int64_t)t * 2 * n_ff + n_ff + i];
        }
    attn_geglu(g, u, n);
    float *d_gu = dev_put(gu, sizeof(float) * (size_t)(2 * n)), *d_out = dev_put(NULL, sizeof(float) * (size_t)n);
    CU(kcu_geglu(d_out, d_gu, n_tok, n_ff, 0));
    dev_get(got, d_out, sizeof(float) * (size_t)n);
    char name[96];
    snprintf(name, sizeof name, "geglu tok=%d ff=%d", n_tok, n_ff);
    compare(name, got, g, n, 1e-12, 2e-6, 1e-6);
    uint16_t *d_b = dev_put(NULL, sizeof(uint16_t) * (size_t)n);
    CU(kcu_geglu_bf16(d_b, d_gu, n_tok, n_ff, 0));
    snprintf(name, sizeof name, "geglu->bf16 tok=%d ff=%d", n_tok, n_ff);
    compare_bf16_of(name, d_b, got, n);
    cudaFree(d_b);
    cudaFree(d_gu);
    cudaFree(d_out);
    free(gu);
    free(g);
    free(u);
    free(got);
}

/* kcu_scale (exact), kcu_softcap (attn_softcap_ref, to rounding) and
 * kcu_rmsnorm_add (attn_rmsnorm, then the add) over rows n apart. */
static void test_gemma_ops(int32_t n_rows, int32_t n, float cap)
{
    const int64_t total = (int64_t)n_rows * n;
    float *x = malloc(sizeof(float) * (size_t)total), *y = malloc(sizeof(float) * (size_t)total);
    float *ref = malloc(sizeof(float) * (size_t)total), *got = malloc(sizeof(float) * (size_t)total);
    float *w = malloc(sizeof(float) * (size_t)n), *row = malloc(sizeof(float) * (size_t)n);
    fill(x, total, 40.0f);
    fill(y, total, 3.0f);
    fill(w, n, 1.5f);
    char name[96];
    float *d_x = dev_put(x, sizeof(float) * (size_t)total), *d_y = dev_put(y, sizeof(float) * (size_t)total);
    float *d_w = dev_put(w, sizeof(float) * (size_t)n);

    for (int64_t i = 0; i < total; i++) ref[i] = x[i] * 25.298221f;
    CU(kcu_scale(d_x, total, 25.298221f, 0));
    dev_get(got, d_x, sizeof(float) * (size_t)total);
    snprintf(name, sizeof name, "scale n=%lld", (long long)total);
    compare(name, got, ref, total, -1, 0, 0);

    CU(cudaMemcpy(d_x, x, sizeof(float) * (size_t)total, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < total; i++) ref[i] = attn_softcap_ref(x[i], cap);
    CU(kcu_softcap(d_x, n, n_rows, n, cap, 0));
    dev_get(got, d_x, sizeof(float) * (size_t)total);
    snprintf(name, sizeof name, "softcap %g rows=%d n=%d", (double)cap, n_rows, n);
    compare(name, got, ref, total, 1e-12, 4e-6, 1e-6);

    for (int32_t r = 0; r < n_rows; r++) {
        attn_rmsnorm(row, x + (int64_t)r * n, w, n, 1e-6f);
        for (int32_t i = 0; i < n; i++) ref[(int64_t)r * n + i] = y[(int64_t)r * n + i] + row[i];
    }
    CU(cudaMemcpy(d_x, x, sizeof(float) * (size_t)total, cudaMemcpyHostToDevice));
    CU(kcu_rmsnorm_add(d_y, d_x, n_rows, n, d_w, 1e-6f, 0));
    dev_get(got, d_y, sizeof(float) * (size_t)total);
    snprintf(name, sizeof name, "rmsnorm_add rows=%d n=%d", n_rows, n);
    compare(name, got, ref, total, 1e-11, 1e-5, 1e-5);
    cudaFree(d_x);
    cudaFree(d_y);
    cudaFree(d_w);
    free(x);
    free(y);
    free(ref);
    free(got);
    free(w);
    free(row);
}

static void test_adds(int32_t n_rows, int32_t n, int64_t ld)
{
    const int64_t total = n_rows * ld;
    float *y = malloc(sizeof(float) * (size_t)total), *x = malloc(sizeof(float) * (size_t)total);
    float *b = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)total);
    float *got = malloc(sizeof(float) * (size_t)total);
    fill(y, total, 4.0f);
    fill(x, total, 4.0f);
    fill(b, n, 1.0f);
    float *d_y = dev_put(y, sizeof(float) * (size_t)total), *d_x = dev_put(x, sizeof(float) * (size_t)total);
    float *d_b = dev_put(b, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < total; i++) ref[i] = y[i] + x[i];
    CU(kcu_add(d_y, d_x, total, 0));
    dev_get(got, d_y, sizeof(float) * (size_t)total);
    char name[96];
    snprintf(name, sizeof name, "residual add n=%lld", (long long)total);
    compare(name, got, ref, total, -1, 0, 0);
    for (int32_t r = 0; r < n_rows; r++)
        for (int32_t i = 0; i < n; i++) ref[r * ld + i] += b[i];
    CU(kcu_add_bias(d_y, ld, d_b, n_rows, n, 0));
    dev_get(got, d_y, sizeof(float) * (size_t)total);
    snprintf(name, sizeof name, "bias add rows=%d n=%d ld=%lld", n_rows, n, (long long)ld);
    compare(name, got, ref, total, -1, 0, 0);
    cudaFree(d_y);
    cudaFree(d_x);
    cudaFree(d_b);
    free(y);
    free(x);
    free(b);
    free(ref);
    free(got);
}

static void test_to_bf16(int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    uint16_t *ref = malloc(sizeof(uint16_t) * (size_t)n), *got = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        /* random magnitudes over many binades, and exact rounding ties */
        float v = rnd_f(1.0f) * ldexpf(1.0f, (int)(rnd() % 40) - 20);
        if (i % 7 == 0) {
            uint32_t bits;
            memcpy(&bits, &v, 4);
            bits = (bits & 0xffff0000u) | 0x8000u;
            memcpy(&v, &bits, 4);
        }
        x[i] = v;
        ref[i] = kvb_f32_to_bf16(v);
    }
    float *d_x = dev_put(x, sizeof(float) * (size_t)n);
    uint16_t *d_y = dev_put(NULL, sizeof(uint16_t) * (size_t)n);
    CU(kcu_f32_to_bf16(d_y, d_x, n, 0));
    dev_get(got, d_y, sizeof(uint16_t) * (size_t)n);
    char name[96];
    snprintf(name, sizeof name, "f32->bf16 n=%lld", (long long)n);
    compare_u16(name, got, ref, n);
    cudaFree(d_x);
    cudaFree(d_y);
    free(x);
    free(ref);
    free(got);
}

/* ---- paged KV: store and attention ------------------------------------------------------------ */

/* A step over three sequences of a pool: a single decode token deep in its
 * sequence, a prefill chunk from position 0, and a chunk continuing a
 * sequence — the mix the scheduler sends. Block tables are scrambled. The
 * pool holds rows of type kv (backend/kvtype.h). */
struct paged_case {
    int32_t n_layer, layer, block_size, n_blocks, n_head, n_head_kv, hd;
    enum kv_type kv;
    int32_t window; /* > 0: a sliding window (kcu_paged.window) */
    float softcap;  /* > 0: soft-capped scores */
};

enum { PAGED_N_SEQ = 3 };

/* One step of a paged_case, on the host and on the device. */
struct paged_step {
    int32_t seq_new[PAGED_N_SEQ]; /* new tokens per sequence */
    int32_t bs, kvd, qd, n_tok, n_tab;
    int64_t rk, rv; /* bytes of a K row, of a V row (the q4 pool's K rows are q8) */
    int64_t block_bytes, pool_bytes, ld;
    int32_t *perm;              /* (n_blocks) the pool's block ids, shuffled */
    int32_t *blocks;            /* (n_tab) the sequences' block tables, one after another */
    int32_t *tok_pos, *tok_tab; /* (n_tok) each token's position and table offset */
    uint8_t *pool;              /* (pool_bytes) K/V rows as kv: the reference's pool */
    float *qkv;                 /* (n_tok, ld) fused Q|K|V rows */
    uint8_t *d_pool;
    float *d_qkv;
    int32_t *d_blocks, *d_pos, *d_tab;
    struct kcu_paged pg;
};

/* Where slot `slot`'s K row (v = 0) or V row (v = 1) of layer `layer`
 * starts in a block: [layer][bs K rows][bs V rows] (be_block_bytes). */
static int64_t row_at(int64_t rk, int64_t rv, int32_t bs, int32_t layer, int v, int32_t slot)
{
    return (int64_t)layer * bs * (rk + rv) + (v ? bs * rk + slot * rv : slot * rk);
}

/* A random pool of n_blocks blocks of n_layer layers of pool type kv. For
 * f16 one random value per element in pool order, as this test has always
 * drawn them (so the f16 cases see the pool they saw before the quantized
 * types existed). */
static void random_pool(uint8_t *pool, enum kv_type kv, int32_t n_blocks, int32_t n_layer, int32_t bs, int32_t kvd)
{
    const int64_t rk = kv_row_bytes(kv_k_rows(kv), kvd), rv = kv_row_bytes(kv_v_rows(kv), kvd);
    if (kv == KV_F16) {
        uint16_t *h = (uint16_t *)pool;
        for (int64_t i = 0; i < (int64_t)n_blocks * n_layer * 2 * bs * kvd; i++) h[i] = kvb_f32_to_fp16(rnd_f(1.5f));
        return;
    }
    const int64_t block_bytes = (int64_t)n_layer * bs * (rk + rv);
    float *row = malloc(sizeof(float) * (size_t)kvd);
    for (int32_t blk = 0; blk < n_blocks; blk++)
        for (int32_t l = 0; l < n_layer; l++)
            for (int v = 0; v < 2; v++)
                for (int32_t slot = 0; slot < bs; slot++) {
                    fill(row, kvd, 1.5f);
                    kv_quantize_row(v ? kv_v_rows(kv) : kv_k_rows(kv),
                                    pool + blk * block_bytes + row_at(rk, rv, bs, l, v, slot), row, kvd);
                }
    free(row);
}

/* Block tables, positions, a random pool and Q|K|V, on host and device. */
static void paged_setup(const struct paged_case *pc, struct paged_step *st)
{
    const int32_t seq_pos[PAGED_N_SEQ] = {40, 0, 100}, seq_new[PAGED_N_SEQ] = {1, 17, 5};
    const int32_t bs = pc->block_size, kvd = pc->n_head_kv * pc->hd, qd = pc->n_head * pc->hd;
    const int64_t rk = kv_row_bytes(kv_k_rows(pc->kv), kvd), rv = kv_row_bytes(kv_v_rows(pc->kv), kvd);
    const int64_t block_bytes = (int64_t)pc->n_layer * bs * (rk + rv);
    int32_t n_tok = 0, n_tab = 0, seq_blocks[PAGED_N_SEQ];
    for (int s = 0; s < PAGED_N_SEQ; s++) {
        n_tok += seq_new[s];
        seq_blocks[s] = (seq_pos[s] + seq_new[s] + bs - 1) / bs;
        n_tab += seq_blocks[s];
    }
    CHECK(n_tab <= pc->n_blocks);
    /* Block ids: a permutation of the pool, handed out in order. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)pc->n_blocks);
    for (int32_t i = 0; i < pc->n_blocks; i++) perm[i] = i;
    for (int32_t i = pc->n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)n_tab), *tok_pos = malloc(sizeof(int32_t) * (size_t)n_tok);
    int32_t *tok_tab = malloc(sizeof(int32_t) * (size_t)n_tok);
    int32_t tab_off[PAGED_N_SEQ];
    for (int s = 0, nb = 0, t = 0; s < PAGED_N_SEQ; s++) {
        tab_off[s] = nb;
        for (int32_t b = 0; b < seq_blocks[s]; b++, nb++) blocks[nb] = perm[nb];
        for (int32_t j = 0; j < seq_new[s]; j++, t++) {
            tok_pos[t] = seq_pos[s] + j;
            tok_tab[t] = tab_off[s];
        }
    }
    /* Pool: random K/V everywhere (the cached prefix), then this step's
     * K/V stored by the kernel under test and by the reference. */
    const int64_t pool_bytes = block_bytes * pc->n_blocks;
    uint8_t *pool = malloc((size_t)pool_bytes);
    random_pool(pool, pc->kv, pc->n_blocks, pc->n_layer, bs, kvd);
    const int64_t ld = qd + 2 * kvd; /* fused Q|K|V rows */
    float *qkv = malloc(sizeof(float) * (size_t)(n_tok * ld));
    fill(qkv, n_tok * ld, 1.5f);

    uint8_t *d_pool = dev_put(pool, (size_t)pool_bytes);
    float *d_qkv = dev_put(qkv, sizeof(float) * (size_t)(n_tok * ld));
    int32_t *d_blocks = dev_put(blocks, sizeof(int32_t) * (size_t)n_tab);
    int32_t *d_pos = dev_put(tok_pos, sizeof(int32_t) * (size_t)n_tok),
            *d_tab = dev_put(tok_tab, sizeof(int32_t) * (size_t)n_tok);
    struct kcu_paged pg = {d_pool, block_bytes, (int32_t)pc->kv, bs,       kvd,        pc->layer,
                           n_tok,  d_pos,       d_tab,           d_blocks, pc->window, pc->softcap};
    *st = (struct paged_step){.bs = bs,
                              .kvd = kvd,
                              .qd = qd,
                              .n_tok = n_tok,
                              .n_tab = n_tab,
                              .rk = rk,
                              .rv = rv,
                              .block_bytes = block_bytes,
                              .pool_bytes = pool_bytes,
                              .ld = ld,
                              .perm = perm,
                              .blocks = blocks,
                              .tok_pos = tok_pos,
                              .tok_tab = tok_tab,
                              .pool = pool,
                              .qkv = qkv,
                              .d_pool = d_pool,
                              .d_qkv = d_qkv,
                              .d_blocks = d_blocks,
                              .d_pos = d_pos,
                              .d_tab = d_tab,
                              .pg = pg};
    memcpy(st->seq_new, seq_new, sizeof seq_new);
}

/* Byte arrays, bit for bit. */
static void compare_bytes(const char *name, const uint8_t *got, const uint8_t *ref, int64_t n)
{
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            if (first < 0) first = i;
            bad++;
        }
    printf("%-44s n=%-8lld mismatches=%lld%s\n", name, (long long)n, (long long)bad,
           bad ? "  FAIL" : "  ok (bit-exact)");
    CHECK_MSG(bad == 0, "%s: %lld of %lld bytes differ, first at %lld (%02x vs %02x)", name, (long long)bad,
              (long long)n, (long long)first, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0);
}

/* kcu_kv_store against kv_quantize_row (for f16, the store loop of
 * be_cpu.c: kvb_f32_to_fp16 per element), over the whole pool (nothing
 * else in it may change). Leaves the reference's K/V in st->pool. */
static void paged_check_store(const struct paged_case *pc, struct paged_step *st)
{
    const int32_t bs = st->bs, kvd = st->kvd, qd = st->qd, n_tok = st->n_tok;
    const int64_t ld = st->ld;
    uint8_t *pool = st->pool, *got_pool = malloc((size_t)st->pool_bytes);
    CU(kcu_kv_store(&st->pg, st->d_qkv + qd, st->d_qkv + qd + kvd, ld, 0));

    for (int32_t t = 0; t < n_tok; t++) {
        const int32_t p = st->tok_pos[t];
        uint8_t *blk = pool + (int64_t)st->blocks[st->tok_tab[t] + p / bs] * st->block_bytes;
        kv_quantize_row(kv_k_rows(pc->kv), blk + row_at(st->rk, st->rv, bs, pc->layer, 0, p % bs),
                        st->qkv + t * ld + qd, kvd);
        kv_quantize_row(kv_v_rows(pc->kv), blk + row_at(st->rk, st->rv, bs, pc->layer, 1, p % bs),
                        st->qkv + t * ld + qd + kvd, kvd);
    }
    dev_get(got_pool, st->d_pool, (size_t)st->pool_bytes);
    char name[128];
    snprintf(name, sizeof name, "kv store %s layer %d/%d bs=%d kvd=%d tok=%d", kv_type_name(pc->kv), pc->layer,
             pc->n_layer, bs, kvd, n_tok);
    compare_bytes(name, got_pool, pool, st->pool_bytes); /* also: nothing else in the pool changed */
    free(got_pool);
}

/* attn_head's arithmetic (cpu/attn.h: scaled q, fma chains in ascending
 * order, attn_exp, eight interleaved partial sums and their fixed tree) on
 * K/V rows that are already floats: the reference for the quantized types,
 * whose rows are kv_dequantize_row'd first. */
static void ref_attn_f32(float *out, const float *q, int32_t hd, const float *k_base, const float *v_base,
                         int64_t block_stride, int64_t row_stride, int32_t bs, const int32_t *table, int32_t p_lo,
                         int32_t n_pos, float scale, float softcap, float *scores)
{
    float qs[KCU_ATTN_MAX_HEAD_DIM], maxs = -INFINITY;
    for (int32_t i = 0; i < hd; i++) qs[i] = q[i] * scale;
    for (int32_t p = p_lo; p < n_pos; p++) {
        const float *k = k_base + (int64_t)table[p / bs] * block_stride + (int64_t)(p % bs) * row_stride;
        float d = 0.0f;
        for (int32_t i = 0; i < hd; i++) d = fmaf(k[i], qs[i], d);
        if (softcap > 0) d = attn_softcap(d, softcap);
        scores[p] = d;
        maxs = fmaxf(maxs, d);
    }
    float part[8] = {0};
    for (int32_t p = p_lo; p < n_pos; p++) {
        scores[p] = attn_exp(scores[p] - maxs);
        part[p % 8] += scores[p];
    }
    const float sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
    const float inv = 1.0f / sum;
    for (int32_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int32_t p = p_lo; p < n_pos; p++) {
        const float *v = v_base + (int64_t)table[p / bs] * block_stride + (int64_t)(p % bs) * row_stride;
        for (int32_t i = 0; i < hd; i++) out[i] = fmaf(scores[p], v[i], out[i]);
    }
    for (int32_t i = 0; i < hd; i++) out[i] *= inv;
}

/* The reference's pool dequantized (kv_dequantize_row, row by row, K and
 * V rows in their formats), as floats in the uniform element layout
 * [block][layer][K|V][slot][kv_dim]. */
static float *paged_pool_f32(const struct paged_case *pc, const struct paged_step *st)
{
    const int32_t bs = st->bs, kvd = st->kvd;
    float *f = malloc(sizeof(float) * (size_t)pc->n_blocks * pc->n_layer * 2 * bs * kvd), *o = f;
    for (int32_t blk = 0; blk < pc->n_blocks; blk++)
        for (int32_t l = 0; l < pc->n_layer; l++)
            for (int v = 0; v < 2; v++)
                for (int32_t slot = 0; slot < bs; slot++, o += kvd)
                    kv_dequantize_row(v ? kv_v_rows(pc->kv) : kv_k_rows(pc->kv), o,
                                      st->pool + blk * st->block_bytes + row_at(st->rk, st->rv, bs, l, v, slot), kvd);
    return f;
}

/* The reference attention over the reference pool, every token and head,
 * into ref: attn_head itself for f16; for q8 and q4 ref_attn_f32 over the
 * dequantized pool. For f16, ref_attn_f32 over the widened pool must give
 * attn_head's bits: that is what makes it the same reference. */
static void paged_ref_attn(const struct paged_case *pc, const struct paged_step *st, float scale, float *ref)
{
    const int32_t bs = st->bs, kvd = st->kvd, qd = st->qd;
    float *scores = malloc(sizeof(float) * 512), *pf = paged_pool_f32(pc, st);
    float *alt = malloc(sizeof(float) * (size_t)(st->n_tok * qd));
    const int32_t group = pc->n_head / pc->n_head_kv;
    const int64_t block_elems = (int64_t)pc->n_layer * 2 * bs * kvd; /* of the float pool (and the f16 one) */
    for (int32_t t = 0; t < st->n_tok; t++)
        for (int32_t h = 0; h < pc->n_head; h++) {
            const int32_t g = h / group;
            const int64_t k_off = (int64_t)pc->layer * 2 * bs * kvd + (int64_t)g * pc->hd;
            const int64_t v_off = ((int64_t)pc->layer * 2 + 1) * bs * kvd + (int64_t)g * pc->hd;
            float *o = ref + (int64_t)t * qd + (int64_t)h * pc->hd;
            const float *q = st->qkv + t * st->ld + (int64_t)h * pc->hd;
            const int32_t *table = st->blocks + st->tok_tab[t];
            const int32_t n_pos = st->tok_pos[t] + 1;
            const int32_t p_lo = pc->window > 0 && n_pos > pc->window ? n_pos - pc->window : 0;
            ref_attn_f32(pc->kv == KV_F16 ? alt + (o - ref) : o, q, pc->hd, pf + k_off, pf + v_off, block_elems, kvd,
                         bs, table, p_lo, n_pos, scale, pc->softcap, scores);
            if (pc->kv != KV_F16) continue;
            const uint16_t *h16 = (const uint16_t *)st->pool;
            struct attn_kv_view view = {
                .k_base = h16 + k_off,
                .v_base = h16 + v_off,
                .block_stride = block_elems,
                .row_stride = kvd,
                .block_size = bs,
                .table = table,
                .softcap = pc->softcap,
            };
            attn_head(o, q, pc->hd, &view, p_lo, n_pos, scale, scores);
        }
    if (pc->kv == KV_F16) {
        char name[128];
        snprintf(name, sizeof name, "attention ref f32 rows == attn_head hd=%d", pc->hd);
        compare(name, alt, ref, (int64_t)st->n_tok * qd, -1, 0, 0);
    }
    free(scores);
    free(pf);
    free(alt);
}

/* kcu_attn against ref, and its bf16 form against its own f32 result. */
static void paged_check_attn(const struct paged_case *pc, const struct paged_step *st, float scale, const float *ref)
{
    const int32_t n_tok = st->n_tok, qd = st->qd;
    float *got = malloc(sizeof(float) * (size_t)(n_tok * qd));
    char name[128];
    float *d_out = dev_put(NULL, sizeof(float) * (size_t)(n_tok * qd));
    CU(kcu_attn(d_out, st->d_qkv, st->ld, &st->pg, pc->n_head, pc->n_head_kv, pc->hd, scale, 0));
    dev_get(got, d_out, sizeof(float) * (size_t)(n_tok * qd));
    snprintf(name, sizeof name, "attention%s%s heads=%d/%d hd=%d bs=%d tok=%d", pc->kv ? " " : "",
             pc->kv ? kv_type_name(pc->kv) : "", pc->n_head, pc->n_head_kv, pc->hd, st->bs, n_tok);
    /* The same tolerance for every type: the kernel reads the quantized
     * values exactly, as the reference does after kv_dequantize_row. */
    compare(name, got, ref, (int64_t)n_tok * qd, 1e-10, 1e-4, 1e-5);
    {
        uint16_t *d_b = dev_put(NULL, sizeof(uint16_t) * (size_t)n_tok * (size_t)qd);
        CU(kcu_attn_bf16(d_b, st->d_qkv, st->ld, &st->pg, pc->n_head, pc->n_head_kv, pc->hd, scale, 0));
        snprintf(name, sizeof name, "attention->bf16%s%s heads=%d/%d hd=%d", pc->kv ? " " : "",
                 pc->kv ? kv_type_name(pc->kv) : "", pc->n_head, pc->n_head_kv, pc->hd);
        compare_bf16_of(name, d_b, got, (int64_t)n_tok * qd);
        cudaFree(d_b);
    }
    cudaFree(d_out);
    free(got);
}

/* Tensor cores, where they take the heads: against the reference to fp16
 * rounding of Q and P (and, for q8 and q4, of the dequantized K and V:
 * one more rounding of the same size, within the same bound), and bit for
 * bit the same whatever the tiling (widest, one token per tile, three). */
static void paged_check_tc(const struct paged_case *pc, const struct paged_step *st, float scale, const float *ref)
{
    const int32_t n_tok = st->n_tok, qd = st->qd;
    const int32_t *seq_new = st->seq_new;
    char name[128];
    const int32_t tt = kcu_attn_tc_tile_tokens(pc->n_head, pc->n_head_kv, pc->hd);
    CHECK_EQ_INT(tt > 0, pc->hd == 64 || pc->hd == 128);
    if (tt <= 0) return;
    if (pc->window > 0 || pc->softcap > 0) { /* kcu_attn's alone */
        int32_t one[2] = {0, 1};
        int32_t *d_one = dev_put(one, sizeof one);
        float *d_o = dev_put(NULL, sizeof(float) * (size_t)qd);
        CHECK(kcu_attn_tc(d_o, st->d_qkv, st->ld, &st->pg, d_one, 1, pc->n_head, pc->n_head_kv, pc->hd, scale, 0) ==
              cudaErrorInvalidValue);
        cudaFree(d_one);
        cudaFree(d_o);
        return;
    }
    int32_t *tiles = malloc(sizeof(int32_t) * 2 * (size_t)n_tok);
    float *tc[3];
    const int32_t widths[3] = {tt, 1, tt < 3 ? tt : 3};
    int32_t *d_tiles[3];
    int32_t n_tiles[3];
    for (int w = 0; w < 3; w++) {
        int32_t nt = 0;
        for (int s = 0, t = 0; s < PAGED_N_SEQ; t += seq_new[s], s++)
            for (int32_t j = 0; j < seq_new[s]; j += widths[w], nt++) {
                tiles[2 * nt] = t + j;
                tiles[2 * nt + 1] = seq_new[s] - j < widths[w] ? seq_new[s] - j : widths[w];
            }
        n_tiles[w] = nt;
        d_tiles[w] = dev_put(tiles, sizeof(int32_t) * 2 * (size_t)nt);
        float *d_o = dev_put(NULL, sizeof(float) * (size_t)(n_tok * qd));
        CU(kcu_attn_tc(d_o, st->d_qkv, st->ld, &st->pg, d_tiles[w], nt, pc->n_head, pc->n_head_kv, pc->hd, scale, 0));
        tc[w] = malloc(sizeof(float) * (size_t)(n_tok * qd));
        dev_get(tc[w], d_o, sizeof(float) * (size_t)(n_tok * qd));
        cudaFree(d_o);
    }
    snprintf(name, sizeof name, "attention tc%s%s heads=%d/%d hd=%d tile=%d", pc->kv ? " " : "",
             pc->kv ? kv_type_name(pc->kv) : "", pc->n_head, pc->n_head_kv, pc->hd, tt);
    compare(name, tc[0], ref, (int64_t)n_tok * qd, 1e-6, 1e-2, 2e-3);
    const size_t bytes = sizeof(float) * (size_t)(n_tok * qd);
    CHECK_MSG(!memcmp(tc[0], tc[1], bytes) && !memcmp(tc[0], tc[2], bytes), "%s: the tiling changes a token's bits",
              name);
    uint16_t *d_b = dev_put(NULL, sizeof(uint16_t) * (size_t)n_tok * (size_t)qd);
    CU(kcu_attn_tc_bf16(d_b, st->d_qkv, st->ld, &st->pg, d_tiles[1], n_tiles[1], pc->n_head, pc->n_head_kv, pc->hd,
                        scale, 0));
    snprintf(name, sizeof name, "attention tc->bf16%s%s heads=%d/%d hd=%d", pc->kv ? " " : "",
             pc->kv ? kv_type_name(pc->kv) : "", pc->n_head, pc->n_head_kv, pc->hd);
    compare_bf16_of(name, d_b, tc[0], (int64_t)n_tok * qd);
    cudaFree(d_b);
    for (int w = 0; w < 3; w++) {
        cudaFree(d_tiles[w]);
        free(tc[w]);
    }
    free(tiles);
}

static void paged_free(struct paged_step *st)
{
    cudaFree(st->d_pool);
    cudaFree(st->d_qkv);
    cudaFree(st->d_blocks);
    cudaFree(st->d_pos);
    cudaFree(st->d_tab);
    free(st->perm);
    free(st->blocks);
    free(st->tok_pos);
    free(st->tok_tab);
    free(st->pool);
    free(st->qkv);
}

/* Under a window, each sequence's blocks wholly before the window of its
 * first new token filled with 0xff on the device (NaN in f16 and in a
 * quantized row's scale): attention that read them would show it. */
static void paged_poison(const struct paged_case *pc, const struct paged_step *st)
{
    if (pc->window <= 0) return;
    for (int32_t t = 0; t < st->n_tok; t++) {
        if (t > 0 && st->tok_tab[t] == st->tok_tab[t - 1]) continue; /* a sequence's first token */
        const int32_t n_pos = st->tok_pos[t] + 1, p_lo = n_pos > pc->window ? n_pos - pc->window : 0;
        for (int32_t b = 0; (b + 1) * st->bs <= p_lo; b++)
            CU(cudaMemset(st->d_pool + (int64_t)st->blocks[st->tok_tab[t] + b] * st->block_bytes, 0xff,
                          (size_t)st->block_bytes));
    }
}

static void test_paged(const struct paged_case *pc)
{
    struct paged_step st;
    paged_setup(pc, &st);
    paged_check_store(pc, &st);
    paged_poison(pc, &st);
    float *ref = malloc(sizeof(float) * (size_t)(st.n_tok * st.qd));
    const float scale = 1.0f / sqrtf((float)pc->hd);
    paged_ref_attn(pc, &st, scale, ref);
    for (int64_t i = 0; i < (int64_t)st.n_tok * st.qd; i++)
        if (!isfinite(ref[i])) {
            CHECK_MSG(0, "the reference attention is not finite at %lld", (long long)i);
            break;
        }
    paged_check_attn(pc, &st, scale, ref);
    paged_check_tc(pc, &st, scale, ref);
    free(ref);
    paged_free(&st);
}

/* The store's corners, q8 or q4, bytes against kv_quantize_row: groups of
 * zeros (scale 0), constant groups (q4: hi == lo), exact rounding ties
 * (rint to even), values whose scale passes the fp16 range (clamped to
 * 65504), minimums below -65504 (clamped), infinities, scales in fp16's
 * subnormal range, and ordinary random groups of every magnitude. NaN is
 * left out: the reference converts it to an integer, which C leaves
 * undefined. One layer, rows of 4 groups, 8 tokens over two blocks (in a
 * q4 pool the K rows are q8: every corner falls in V rows too). */
static void test_kv_store_edges(enum kv_type kt)
{
    enum { KVD = 4 * KV_QGROUP, N_TOK = 8, BSZ = 4 };
    const int64_t rk = kv_row_bytes(kv_k_rows(kt), KVD), rv = kv_row_bytes(kv_v_rows(kt), KVD);
    const int64_t block_bytes = BSZ * (rk + rv), ld = 2 * KVD;
    float x[N_TOK * 2 * KVD];
    fill(x, N_TOK * 2 * KVD, 2.0f);
    for (int g = 0; g < N_TOK * 2 * 4; g++) {
        float *v = x + g * KV_QGROUP;
        switch (g % 11) {
        case 0:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = 0.0f;
            break;
        case 1:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = -3.25f;
            break;
        case 2: /* q8: amax 127 -> d = 1; q4: lo 0, hi 15 -> d = 1, m = 0: halves tie */
            for (int i = 0; i < KV_QGROUP; i++) v[i] = (float)(i % 15) + 0.5f;
            v[0] = kt == KV_Q8 ? 127.0f : 0.0f;
            v[1] = 15.0f;
            v[3] = kt == KV_Q8 ? -2.5f : 2.5f;
            break;
        case 3:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = rnd_f(1e9f);
            break;
        case 4:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = -1e6f + rnd_f(10.0f);
            break;
        case 5: v[7] = INFINITY; break;
        case 6:
            v[2] = -INFINITY;
            v[9] = INFINITY;
            break;
        case 7:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = rnd_f(3e-6f);
            break;
        case 8:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = 1000.0f + rnd_f(1.0f);
            break;
        case 9:
            for (int i = 0; i < KV_QGROUP; i++) v[i] = rnd_f(1.0f) * ldexpf(1.0f, (int)(rnd() % 30) - 15);
            break;
        default: break; /* uniform in [-2, 2) */
        }
    }
    int32_t pos[N_TOK], tab[N_TOK], blocks[2] = {1, 0};
    for (int t = 0; t < N_TOK; t++) {
        pos[t] = t;
        tab[t] = 0;
    }
    uint8_t *ref = calloc(2, (size_t)block_bytes), *got = malloc(2 * (size_t)block_bytes);
    for (int t = 0; t < N_TOK; t++) {
        uint8_t *blk = ref + (int64_t)blocks[t / BSZ] * block_bytes;
        kv_quantize_row(kv_k_rows(kt), blk + row_at(rk, rv, BSZ, 0, 0, t % BSZ), x + t * ld, KVD);
        kv_quantize_row(kv_v_rows(kt), blk + row_at(rk, rv, BSZ, 0, 1, t % BSZ), x + t * ld + KVD, KVD);
    }
    uint8_t *d_pool = dev_put(NULL, 2 * (size_t)block_bytes);
    float *d_x = dev_put(x, sizeof x);
    int32_t *d_pos = dev_put(pos, sizeof pos), *d_tab = dev_put(tab, sizeof tab),
            *d_blocks = dev_put(blocks, sizeof blocks);
    struct kcu_paged pg = {d_pool, block_bytes, (int32_t)kt, BSZ, KVD, 0, N_TOK, d_pos, d_tab, d_blocks, 0, 0.0f};
    CU(kcu_kv_store(&pg, d_x, d_x + KVD, ld, 0));
    dev_get(got, d_pool, 2 * (size_t)block_bytes);
    char name[96];
    snprintf(name, sizeof name, "kv store %s corners (zeros, ties, clamps, inf)", kv_type_name(kt));
    compare_bytes(name, got, ref, 2 * block_bytes);
    cudaFree(d_pool);
    cudaFree(d_x);
    cudaFree(d_pos);
    cudaFree(d_tab);
    cudaFree(d_blocks);
    free(ref);
    free(got);
}

/* ---- GEMM ------------------------------------------------------------------------------------------ */

/* Checks the layout reasoning of k_gemm.c as much as the arithmetic: a
 * wrong leading dimension or transpose gives garbage, not rounding. The
 * tolerance per element is a multiple of f32 accumulation error over
 * sum |x_k w_k|. */
static void test_gemm(cublasHandle_t h, int64_t n_tok, int64_t n_in, int64_t n_out)
{
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(n_tok * n_in)),
             *w = malloc(sizeof(uint16_t) * (size_t)(n_out * n_in));
    float *ref = malloc(sizeof(float) * (size_t)(n_tok * n_out)),
          *got = malloc(sizeof(float) * (size_t)(n_tok * n_out));
    for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = kvb_f32_to_bf16(rnd_f(2.0f));
    for (int64_t i = 0; i < n_out * n_in; i++) w[i] = kvb_f32_to_bf16(rnd_f(1.0f / sqrtf((float)n_in)));
    double worst_rel = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_out; r++) {
            double s = 0;
            for (int64_t k = 0; k < n_in; k++)
                s += (double)kvb_bf16_to_f32(x[t * n_in + k]) * kvb_bf16_to_f32(w[r * n_in + k]);
            ref[t * n_out + r] = (float)s;
        }
    uint16_t *d_x = dev_put(x, sizeof(uint16_t) * (size_t)(n_tok * n_in)),
             *d_w = dev_put(w, sizeof(uint16_t) * (size_t)(n_out * n_in));
    float *d_y = dev_put(NULL, sizeof(float) * (size_t)(n_tok * n_out));
    cublasStatus_t st = kcu_gemm_bf16(h, d_y, d_x, d_w, n_tok, n_in, n_out);
    CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "gemm: %s", cublasGetStatusString(st));
    dev_get(got, d_y, sizeof(float) * (size_t)(n_tok * n_out));
    /* sum |x_k w_k| per output: the scale of its accumulation error */
    double *sabs = malloc(sizeof(double) * (size_t)(n_tok * n_out));
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_out; r++) {
            double sa = 0;
            for (int64_t k = 0; k < n_in; k++)
                sa += fabs((double)kvb_bf16_to_f32(x[t * n_in + k]) * kvb_bf16_to_f32(w[r * n_in + k]));
            sabs[t * n_out + r] = sa;
        }
    int64_t bad = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_out; r++) {
            const double sa = sabs[t * n_out + r];
            const double err = fabs((double)got[t * n_out + r] - ref[t * n_out + r]);
            const double rel = err / (sa > 0 ? sa : 1);
            if (rel > worst_rel) worst_rel = rel;
            if (!(err <= 1e-5 * sa + 1e-30)) bad++;
        }
    char name[96];
    snprintf(name, sizeof name, "gemm bf16 tok=%lld in=%lld out=%lld", (long long)n_tok, (long long)n_in,
             (long long)n_out);
    compare(name, got, ref, n_tok * n_out, 1e-9, 1e30, 0); /* NMSE here; per-element bound below */
    printf("%-44s worst |err| / sum|x*w| = %.2e (bound 1e-5)%s\n", "", worst_rel, bad ? "  FAIL" : "");
    CHECK_MSG(bad == 0, "%s: %lld elements beyond 1e-5 * sum|x*w|", name, (long long)bad);
    /* y += x·wᵀ: the same products added to what y held (the residual). */
    {
        float *y0 = malloc(sizeof(float) * (size_t)(n_tok * n_out)),
              *want = malloc(sizeof(float) * (size_t)(n_tok * n_out));
        fill(y0, n_tok * n_out, 4.0f);
        for (int64_t i = 0; i < n_tok * n_out; i++) want[i] = y0[i] + ref[i];
        CU(cudaMemcpy(d_y, y0, sizeof(float) * (size_t)(n_tok * n_out), cudaMemcpyHostToDevice));
        st = kcu_gemm_bf16_acc(h, d_y, d_x, d_w, n_tok, n_in, n_out);
        CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "gemm acc: %s", cublasGetStatusString(st));
        dev_get(got, d_y, sizeof(float) * (size_t)(n_tok * n_out));
        snprintf(name, sizeof name, "gemm bf16 += tok=%lld in=%lld out=%lld", (long long)n_tok, (long long)n_in,
                 (long long)n_out);
        compare(name, got, want, n_tok * n_out, 1e-9, 1e30, 0); /* NMSE; per element as above */
        int64_t bad_acc = 0;
        for (int64_t i = 0; i < n_tok * n_out; i++)
            if (!(fabs((double)got[i] - want[i]) <= 1e-5 * sabs[i] + 2e-7 * fabs((double)want[i]))) bad_acc++;
        CHECK_MSG(bad_acc == 0, "%s: %lld elements beyond 1e-5 * sum|x*w| + rounding of the sum", name,
                  (long long)bad_acc);
        free(y0);
        free(want);
    }
    free(sabs);
    cudaFree(d_x);
    cudaFree(d_w);
    cudaFree(d_y);
    free(x);
    free(w);
    free(ref);
    free(got);
}

/* ---- greedy choice ----------------------------------------------------------------------------- */

/* Row r gets pattern r % 9; the ones past 0 are where an argmax goes wrong:
 * ties (inside one thread's stride and across threads, the lower index in
 * the higher thread), NaN, rows with nothing choosable, infinities, a
 * constant row, the winner last. */
static void argmax_row(float *x, int32_t n, int pattern)
{
    fill(x, n, 8.0f);
    const int32_t a = (int32_t)(rnd() % (uint64_t)n), b = (int32_t)(rnd() % (uint64_t)n);
    switch (pattern) {
    case 1:
        x[a] = x[b] = 9.0f;
        if (n > 300) x[257] = x[300] = x[44] = 9.5f;
        break;
    case 2:
        for (int32_t i = 0; i < n; i += 7) x[i] = NAN;
        x[0] = NAN;
        x[b] = 20.0f;
        break;
    case 3:
        for (int32_t i = 0; i < n; i++) x[i] = -INFINITY;
        break;
    case 4:
        for (int32_t i = 0; i < n; i++) x[i] = NAN;
        break;
    case 5:
        x[a] = INFINITY;
        x[b] = INFINITY;
        x[n / 2] = NAN;
        break;
    case 6:
        for (int32_t i = 0; i < n; i++) x[i] = 1.25f;
        break;
    case 7:
        for (int32_t i = 0; i < n; i++) x[i] = -INFINITY;
        x[n - 1] = -3.0f;
        break;
    case 8:
        for (int32_t i = 0; i < n; i++) x[i] = i % 2 ? NAN : -INFINITY;
        x[n - 1] = NAN;
        break;
    default: break;
    }
}

static void test_argmax(int32_t n_rows, int32_t n, int64_t ld, bool gather)
{
    const int32_t n_src = gather ? n_rows + 3 : n_rows;
    float *x = malloc(sizeof(float) * (size_t)(n_src * ld));
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_rows), *got = malloc(sizeof(int32_t) * (size_t)n_rows);
    for (int32_t r = 0; r < n_src; r++) argmax_row(x + r * ld, n, r % 9);
    for (int32_t r = 0; r < n_rows; r++) rows[r] = gather ? (r * 5 + 2) % n_src : r;
    float *d_x = dev_put(x, sizeof(float) * (size_t)(n_src * ld));
    int32_t *d_rows = dev_put(rows, sizeof(int32_t) * (size_t)n_rows),
            *d_out = dev_put(NULL, sizeof(int32_t) * (size_t)n_rows);
    CU(kcu_argmax(d_out, d_x, ld, gather ? d_rows : NULL, n_rows, n, 0));
    dev_get(got, d_out, sizeof(int32_t) * (size_t)n_rows);
    int32_t bad = 0, first = -1, want_first = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        int32_t want;
        const enum kvb_status st = sampler_greedy(x + (int64_t)rows[r] * ld, n, &want);
        if (st != KVB_OK) want = -1;
        if (got[r] != want) {
            if (first < 0) {
                first = r;
                want_first = want;
            }
            bad++;
        }
    }
    char name[96];
    snprintf(name, sizeof name, "argmax rows=%d n=%d ld=%lld%s", n_rows, n, (long long)ld, gather ? " gather" : "");
    printf("%-44s n=%-8lld mismatches=%d%s\n", name, (long long)n_rows * n, bad, bad ? "  FAIL" : "  ok (exact)");
    CHECK_MSG(bad == 0, "%s: %d rows differ, first %d (%d vs %d)", name, bad, first, first >= 0 ? got[first] : 0,
              want_first);
    cudaFree(d_x);
    cudaFree(d_rows);
    cudaFree(d_out);
    free(x);
    free(rows);
    free(got);
}

/* ---- mixture of experts --------------------------------------------------------------------- */

/* The four MoE kernels on one step of n_tok tokens over ne experts, k per
 * token, outputs n wide, with or without a shared expert: routing against
 * cpu_moe_route (the CPU backend's own), the plan and the gather exactly,
 * the weighted sum against the CPU's sum_rows expression (repeated here).
 * The router logits are spaced (a shuffled ramp plus small noise) so that
 * the device's expf cannot reorder two experts; some tokens get an exact
 * tie between their k-th choice and an expert left out, which must go to
 * the lower id. */
static void test_moe(int32_t n_tok, int32_t ne, int32_t k, bool norm, bool shared, int32_t n)
{
    const int64_t ld = ne + (shared ? 1 : 0), nr = (int64_t)n_tok * k;
    float *logits = malloc(sizeof(float) * (size_t)(n_tok * ld)), *p = malloc(sizeof(float) * (size_t)ne);
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)nr), *gsel = malloc(sizeof(int32_t) * (size_t)nr);
    float *wts = malloc(sizeof(float) * (size_t)nr), *gwts = malloc(sizeof(float) * (size_t)nr);
    for (int32_t t = 0; t < n_tok; t++) {
        float *l = logits + t * ld;
        for (int32_t i = 0; i < ne; i++) l[i] = 0.05f * (float)i - 0.025f * (float)ne + rnd_f(0.01f);
        for (int32_t i = ne - 1; i > 0; i--) { /* shuffle */
            const int32_t j = (int32_t)(rnd() % (uint64_t)(i + 1));
            const float x = l[i];
            l[i] = l[j];
            l[j] = x;
        }
        if (t % 3 == 1 && k < ne) { /* an exact tie between the k-th choice and one left out */
            int32_t kth = -1;
            for (int32_t j = 0; j < k; j++) { /* the k-th largest, by rank */
                int32_t b = -1;
                for (int32_t i = 0; i < ne; i++)
                    if ((kth < 0 || l[i] < l[kth]) && (b < 0 || l[i] > l[b])) b = i;
                kth = b;
            }
            int32_t other = (int32_t)(rnd() % (uint64_t)ne);
            while (l[other] >= l[kth]) other = (other + 1) % ne;
            l[other] = l[kth];
        }
        if (shared) l[ne] = rnd_f(3.0f);
        memcpy(p, l, sizeof(float) * (size_t)ne);
        cpu_moe_route(p, ne, k, norm, sel + t * k, wts + t * k);
    }
    float *d_logits = dev_put(logits, sizeof(float) * (size_t)(n_tok * ld));
    int32_t *d_sel = dev_put(NULL, sizeof(int32_t) * (size_t)nr);
    float *d_wts = dev_put(NULL, sizeof(float) * (size_t)nr);
    CU(kcu_moe_route(d_sel, d_wts, d_logits, ld, n_tok, ne, k, norm, 0));
    dev_get(gsel, d_sel, sizeof(int32_t) * (size_t)nr);
    dev_get(gwts, d_wts, sizeof(float) * (size_t)nr);
    int64_t bad = 0;
    for (int64_t i = 0; i < nr; i++) bad += gsel[i] != sel[i];
    char name[96];
    snprintf(name, sizeof name, "moe route tok=%d ne=%d k=%d%s%s", n_tok, ne, k, norm ? " norm" : "",
             shared ? " +shared" : "");
    printf("%-44s n=%-8lld experts differ=%lld%s\n", name, (long long)nr, (long long)bad, bad ? "  FAIL" : "  ok");
    CHECK_MSG(bad == 0, "%s: %lld choices differ from cpu_moe_route", name, (long long)bad);
    snprintf(name, sizeof name, "moe route weights tok=%d ne=%d k=%d", n_tok, ne, k);
    compare(name, gwts, wts, nr, 1e-12, 2e-6, 1e-7);

    /* The plan, from the reference's choices (the CPU's numbering). */
    int32_t *start = calloc((size_t)ne + 1, sizeof(int32_t)), *slot = malloc(sizeof(int32_t) * (size_t)nr);
    int32_t *row_tok = malloc(sizeof(int32_t) * (size_t)nr), *fillc = malloc(sizeof(int32_t) * (size_t)ne);
    for (int64_t i = 0; i < nr; i++) start[sel[i] + 1]++;
    for (int32_t x = 0; x < ne; x++) {
        start[x + 1] += start[x];
        fillc[x] = start[x];
    }
    for (int64_t i = 0; i < nr; i++) {
        slot[i] = fillc[sel[i]]++;
        row_tok[slot[i]] = (int32_t)(i / k);
    }
    int32_t *d_start = dev_put(NULL, sizeof(int32_t) * (size_t)(ne + 1)),
            *d_slot = dev_put(NULL, sizeof(int32_t) * (size_t)nr);
    int32_t *d_row_tok = dev_put(NULL, sizeof(int32_t) * (size_t)nr);
    CU(cudaMemcpy(d_sel, sel, sizeof(int32_t) * (size_t)nr, cudaMemcpyHostToDevice));
    CU(kcu_moe_plan(d_start, d_slot, d_row_tok, d_sel, n_tok, k, ne, 0));
    int32_t *g_start = malloc(sizeof(int32_t) * (size_t)(ne + 1)), *g_slot = malloc(sizeof(int32_t) * (size_t)nr);
    int32_t *g_row_tok = malloc(sizeof(int32_t) * (size_t)nr);
    dev_get(g_start, d_start, sizeof(int32_t) * (size_t)(ne + 1));
    dev_get(g_slot, d_slot, sizeof(int32_t) * (size_t)nr);
    dev_get(g_row_tok, d_row_tok, sizeof(int32_t) * (size_t)nr);
    bad = 0;
    for (int32_t x = 0; x <= ne; x++) bad += g_start[x] != start[x];
    for (int64_t i = 0; i < nr; i++) bad += (g_slot[i] != slot[i]) + (g_row_tok[i] != row_tok[i]);
    snprintf(name, sizeof name, "moe plan tok=%d ne=%d k=%d", n_tok, ne, k);
    printf("%-44s n=%-8lld mismatches=%lld%s\n", name, (long long)nr, (long long)bad, bad ? "  FAIL" : "  ok (exact)");
    CHECK_MSG(bad == 0, "%s: %lld entries differ", name, (long long)bad);

    /* The gather of bf16 rows (n wide in rows ld_x apart), bit for bit. */
    const int64_t ld_x = n + 3;
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(n_tok * ld_x)), *xg = malloc(sizeof(uint16_t) * (size_t)(nr * n));
    uint16_t *gxg = malloc(sizeof(uint16_t) * (size_t)(nr * n));
    for (int64_t i = 0; i < n_tok * ld_x; i++) xb[i] = kvb_f32_to_bf16(rnd_f(2.0f));
    for (int64_t r = 0; r < nr; r++) memcpy(xg + r * n, xb + row_tok[r] * ld_x, sizeof(uint16_t) * (size_t)n);
    uint16_t *d_xb = dev_put(xb, sizeof(uint16_t) * (size_t)(n_tok * ld_x)),
             *d_xg = dev_put(NULL, sizeof(uint16_t) * (size_t)(nr * n));
    CU(kcu_moe_gather(d_xg, d_xb, ld_x, d_row_tok, (int32_t)nr, n, 0));
    dev_get(gxg, d_xg, sizeof(uint16_t) * (size_t)(nr * n));
    snprintf(name, sizeof name, "moe gather rows=%lld n=%d", (long long)nr, n);
    compare_u16(name, gxg, xg, nr * n);

    /* The weighted sum (sum_rows: products rounded, added in choice order,
     * then the shared expert times sigmoid of its gate). */
    float *yd = malloc(sizeof(float) * (size_t)(nr * n)), *ys = malloc(sizeof(float) * (size_t)(n_tok * n));
    float *out = malloc(sizeof(float) * (size_t)(n_tok * n)), *gout = malloc(sizeof(float) * (size_t)(n_tok * n));
    fill(yd, nr * n, 4.0f);
    fill(ys, (int64_t)n_tok * n, 4.0f);
    for (int32_t t = 0; t < n_tok; t++) {
        float *o = out + (int64_t)t * n;
        for (int32_t c = 0; c < k; c++) {
            const float w = wts[t * k + c], *y = yd + (int64_t)slot[t * k + c] * n;
            for (int32_t i = 0; i < n; i++) {
                const float wy = y[i] * w;
                o[i] = c == 0 ? wy : o[i] + wy;
            }
        }
        if (shared) {
            const float sg = 1.0f / (1.0f + expf(-logits[t * ld + ne]));
            for (int32_t i = 0; i < n; i++) {
                const float sy = ys[(int64_t)t * n + i] * sg;
                o[i] += sy;
            }
        }
    }
    float *d_yd = dev_put(yd, sizeof(float) * (size_t)(nr * n)),
          *d_ys = dev_put(ys, sizeof(float) * (size_t)(n_tok * n));
    float *d_out = dev_put(NULL, sizeof(float) * (size_t)(n_tok * n));
    CU(cudaMemcpy(d_wts, wts, sizeof(float) * (size_t)nr, cudaMemcpyHostToDevice));
    CU(kcu_moe_combine(d_out, d_yd, d_slot, d_wts, n_tok, k, n, shared ? d_ys : NULL, shared ? d_logits + ne : NULL, ld,
                       0));
    dev_get(gout, d_out, sizeof(float) * (size_t)(n_tok * n));
    snprintf(name, sizeof name, "moe combine tok=%d k=%d n=%d%s", n_tok, k, n, shared ? " +shared" : "");
    /* Exact but for the device's expf in the shared gate's sigmoid. */
    if (shared) compare(name, gout, out, (int64_t)n_tok * n, 1e-12, 1e-6, 1e-7);
    else compare(name, gout, out, (int64_t)n_tok * n, -1, 0, 0);

    void *dbufs[] = {d_logits, d_sel, d_wts, d_start, d_slot, d_row_tok, d_xb, d_xg, d_yd, d_ys, d_out};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) cudaFree(dbufs[i]);
    void *hbufs[] = {logits,  p,      sel,       gsel, wts, gwts, start, slot, row_tok, fillc,
                     g_start, g_slot, g_row_tok, xb,   xg,  gxg,  yd,    ys,   out,     gout};
    for (size_t i = 0; i < sizeof hbufs / sizeof hbufs[0]; i++) free(hbufs[i]);
}

/* The f32 product of the MoE router against a double-precision dot per
 * (token, row): only f32 accumulation error allowed. */
static void test_gemm_f32(cublasHandle_t h, int64_t n_tok, int64_t n_in, int64_t n_out)
{
    float *x = malloc(sizeof(float) * (size_t)(n_tok * n_in)), *w = malloc(sizeof(float) * (size_t)(n_out * n_in));
    float *ref = malloc(sizeof(float) * (size_t)(n_tok * n_out)),
          *got = malloc(sizeof(float) * (size_t)(n_tok * n_out));
    fill(x, n_tok * n_in, 1.0f);
    fill(w, n_out * n_in, 1.0f);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_out; r++) {
            double s = 0;
            for (int64_t i = 0; i < n_in; i++) s += (double)x[t * n_in + i] * w[r * n_in + i];
            ref[t * n_out + r] = (float)s;
        }
    float *d_x = dev_put(x, sizeof(float) * (size_t)(n_tok * n_in)),
          *d_w = dev_put(w, sizeof(float) * (size_t)(n_out * n_in));
    float *d_y = dev_put(NULL, sizeof(float) * (size_t)(n_tok * n_out));
    CHECK(kcu_gemm_f32(h, d_y, d_x, d_w, n_tok, n_in, n_out) == CUBLAS_STATUS_SUCCESS);
    dev_get(got, d_y, sizeof(float) * (size_t)(n_tok * n_out));
    char name[96];
    snprintf(name, sizeof name, "gemm f32 tok=%lld in=%lld out=%lld", (long long)n_tok, (long long)n_in,
             (long long)n_out);
    compare(name, got, ref, n_tok * n_out, 1e-10, 1e-4, 1e-5);
    cudaFree(d_x);
    cudaFree(d_w);
    cudaFree(d_y);
    free(x);
    free(w);
    free(ref);
    free(got);
}

/* Launchers must refuse what they cannot do rather than run off bounds. */
static void test_refusals(void)
{
    struct kcu_paged pg = {NULL, 0, KCU_KV_F16, 16, 2 * 512, 0, 1, NULL, NULL, NULL, 0, 0.0f};
    CHECK(kcu_attn(NULL, NULL, 0, &pg, 4, 2, 512, 1.0f, 0) == cudaErrorInvalidValue); /* head_dim > 256 */
    pg.kv_dim = 3 * 64;
    CHECK(kcu_attn(NULL, NULL, 0, &pg, 4, 3, 64, 1.0f, 0) == cudaErrorInvalidValue);             /* 4 heads over 3 */
    CHECK(kcu_attn_tc(NULL, NULL, 0, &pg, NULL, 1, 4, 1, 96, 1.0f, 0) == cudaErrorInvalidValue); /* head 96 */
    CHECK(kcu_attn_tc_tile_tokens(4, 1, 96) == 0 && kcu_attn_tc_tile_tokens(32, 8, 128) == 16);
    /* Quantized rows need heads of whole groups; unknown types are refused. */
    pg.kv_type = KCU_KV_Q8;
    pg.kv_dim = 2 * 80;
    CHECK(kcu_attn(NULL, NULL, 0, &pg, 4, 2, 80, 1.0f, 0) == cudaErrorInvalidValue);
    pg.kv_type = KCU_KV_Q4;
    pg.kv_dim = 48;
    CHECK(kcu_kv_store(&pg, NULL, NULL, 0, 0) == cudaErrorInvalidValue);
    pg.kv_type = 3;
    pg.kv_dim = 2 * 64;
    CHECK(kcu_attn(NULL, NULL, 0, &pg, 4, 2, 64, 1.0f, 0) == cudaErrorInvalidValue);
    CHECK(kcu_attn_tc(NULL, NULL, 0, &pg, NULL, 1, 4, 2, 64, 1.0f, 0) == cudaErrorInvalidValue);
    CHECK(kcu_kv_store(&pg, NULL, NULL, 0, 0) == cudaErrorInvalidValue);
    pg.kv_type = KCU_KV_F16;
    CHECK(kcu_rope(NULL, 0, 1, 1, 64, 128, 0, NULL, NULL, 1.0f, 0) == cudaErrorInvalidValue); /* rope_dim > head_dim */
    CHECK(kcu_add(NULL, NULL, 0, 0) == cudaSuccess);                            /* empty: nothing enqueued */
    CHECK(kcu_argmax(NULL, NULL, 10, NULL, 1, 20, 0) == cudaErrorInvalidValue); /* rows overlap */
    CHECK(kcu_argmax(NULL, NULL, 10, NULL, 0, 10, 0) == cudaSuccess);
    cudaGetLastError();
}

int main(void)
{
    char why[256];
    if (!be_cuda_available(0, why, sizeof why)) tu_skip(why);
    printf("device 0: %s\n", why);

    test_embed(300, 64, 5);
    test_embed(259, 576, 33);
    test_embed(1000, 4096, 7);

    test_rmsnorm(1, 1, 64, 64, false, false);
    test_rmsnorm(7, 1, 576, 576, false, false);
    test_rmsnorm(33, 1, 4096, 4096, false, false);
    test_rmsnorm(5, 1, 8192, 8192, false, false);
    test_rmsnorm(9, 1, 576, 576, true, false);                /* output-row gather */
    test_rmsnorm(6, 8, 64, 8 * 64 + 2 * 2 * 64, false, true); /* qwen3 Q norm in the fused row */
    test_rmsnorm(6, 2, 128, 4 * 128 + 2 * 2 * 128, false, true);
    test_rmsnorm(6, 1, 512, 512 + 2 * 256, false, true); /* olmo2's Q norm over the whole projection */

    test_rope(5, 4, 64, 64, 0, 40);
    test_rope(9, 8, 64, 64, 1, 2000);
    test_rope(3, 32, 128, 128, 0, 8191);
    test_rope(3, 8, 128, 128, 1, 32767);
    test_rope(4, 4, 64, 32, 0, 300); /* partial rotation */
    test_rope(4, 4, 64, 32, 1, 300);
    test_rope_scalings();

    test_swiglu(1, 128);
    test_swiglu(3, 1536);
    test_swiglu(17, 14336);
    test_geglu(1, 128);
    test_geglu(3, 2048);
    test_geglu(17, 9216);
    test_gemma_ops(1, 640, 30.0f);
    test_gemma_ops(9, 2304, 2.5f);
    test_gemma_ops(33, 640, 50.0f);

    test_adds(1, 64, 64);
    test_adds(13, 576, 576 + 2 * 192);
    test_adds(64, 4096, 4096 + 2 * 1024);

    test_to_bf16(1);
    test_to_bf16(100003);

    const struct paged_case pcs[] = {
        {2, 0, 16, 24, 4, 2, 64, KV_F16, 0, 0.0f},
        {2, 1, 16, 24, 8, 2, 64, KV_F16, 0, 0.0f},
        {3, 2, 16, 24, 9, 3, 64, KV_F16, 0, 0.0f},
        {1, 0, 32, 12, 32, 8, 128, KV_F16, 0, 0.0f},
        {2, 1, 8, 48, 4, 4, 128, KV_F16, 0, 0.0f},
        {2, 0, 16, 24, 2, 1, 256, KV_F16, 0, 0.0f},
        {2, 1, 16, 24, 6, 2, 80, KV_F16, 0, 0.0f},
        {1, 0, 64, 8, 4, 1, 96, KV_F16, 0, 0.0f},
        /* The quantized types on the same mix of heads (head_dim whole
         * groups of 32: 80 and 96 are refused, see test_refusals). */
        {2, 0, 16, 24, 4, 2, 64, KV_Q8, 0, 0.0f},
        {3, 2, 16, 24, 9, 3, 64, KV_Q8, 0, 0.0f},
        {1, 0, 32, 12, 32, 8, 128, KV_Q8, 0, 0.0f},
        {2, 1, 8, 48, 4, 4, 128, KV_Q8, 0, 0.0f},
        {2, 0, 16, 24, 2, 1, 256, KV_Q8, 0, 0.0f},
        {2, 1, 16, 24, 8, 2, 64, KV_Q4, 0, 0.0f},
        {3, 2, 16, 24, 9, 3, 64, KV_Q4, 0, 0.0f},
        {1, 0, 32, 12, 32, 8, 128, KV_Q4, 0, 0.0f},
        {2, 1, 8, 48, 4, 4, 128, KV_Q4, 0, 0.0f},
        {2, 0, 16, 24, 2, 1, 256, KV_Q4, 0, 0.0f},
        {1, 0, 16, 24, 3, 1, 160, KV_Q4, 0, 0.0f},
        /* Gemma: sliding windows (cutting a block, of a whole number of
         * blocks, short), soft-caps (Gemma 2's 50; one that bites), hd 256. */
        {2, 1, 16, 24, 4, 1, 256, KV_F16, 37, 0.0f},
        {2, 0, 8, 48, 4, 2, 128, KV_F16, 32, 0.0f},
        {2, 1, 16, 24, 8, 2, 64, KV_F16, 0, 50.0f},
        {2, 0, 16, 24, 8, 4, 256, KV_F16, 9, 2.0f},
        {2, 1, 16, 24, 4, 1, 256, KV_Q8, 37, 50.0f},
        {2, 0, 8, 48, 4, 2, 128, KV_Q4, 20, 0.0f},
    };
    for (size_t i = 0; i < sizeof pcs / sizeof pcs[0]; i++) test_paged(&pcs[i]);
    test_kv_store_edges(KV_Q8);
    test_kv_store_edges(KV_Q4);

    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    test_gemm(h, 1, 64, 96);
    test_gemm(h, 7, 576, 1536);
    test_gemm(h, 33, 256, 259);
    test_gemm(h, 128, 1024, 512);
    test_gemm(h, 200, 4096, 72);
    test_gemm_f32(h, 1, 256, 8);
    test_gemm_f32(h, 37, 2048, 129); /* a qwen2moe-shaped router: 128 experts + the shared gate */
    cublasDestroy(h);

    test_moe(1, 8, 2, true, false, 64);     /* Mixtral: decode */
    test_moe(37, 128, 8, true, false, 96);  /* Qwen3-30B-A3B's router */
    test_moe(21, 64, 8, false, false, 64);  /* OLMoE: not renormalised */
    test_moe(19, 60, 4, false, true, 128);  /* Qwen1.5-MoE: shared expert */
    test_moe(300, 16, 16, true, false, 32); /* k = n_expert */

    test_argmax(18, 1, 1, false);
    test_argmax(18, 255, 255, false);
    test_argmax(27, 1000, 1003, false);
    test_argmax(9, 49152, 49152, true);
    test_argmax(18, 128256, 128256, false);

    test_refusals();
    return tu_finish();
}

#else

int main(void) { tu_skip("built without CUDA (configure with -DKVBATCH_CUDA=ON)"); }

#endif
