/* test_quant.c — weight dequantization and the quantized matrix products.
 *
 * (a) quant_dequant_row on hand-built blocks with known values, one per type,
 *     including the packed 6-bit scales of Q4_K/Q5_K and Q3_K, the split
 *     values of Q6_K, Q5_K and Q3_K, and the IQ4 grid;
 * (b) mm_matmul against double-precision references, for every supported
 *     type and every implementation this CPU can run, over shapes that are
 *     not multiples of any tile: tightly against the dequantized weights times
 *     the *quantized* input (what the kernels compute up to float rounding),
 *     and loosely against the float input (the quantization error bound);
 * (c) the determinism contract: a token's outputs are bit-identical whether
 *     it is computed alone or inside any batch, with 1, 2 or 3 threads, and
 *     through mm_apply_n;
 * (d) each SIMD implementation against the scalar one;
 * (e) the 16-bit activations (mm_ctx_set_act16) against both references,
 *     alone and packed, in every implementation;
 * plus argument errors and allocation failure. With arguments
 * `dequant TYPE N` it is instead a filter used by tests/pytest_quant.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "base/tpool.h"
#include "model/quant.h"
#include "support/testutil.h"

/* ---- helpers --------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) { return kvb_xorshift64(&rng_state); }

/* Uniform in [lo, hi). */
static float rng_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static void put_half(uint8_t *p, float f)
{
    uint16_t h = kvb_f32_to_fp16(f);
    memcpy(p, &h, 2);
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static int check_row(const char *what, const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++) {
        float tol = 1e-6f * fabsf(want[i]);
        if (!(fabsf(got[i] - want[i]) <= tol)) {
            CHECK_MSG(0, "%s: element %d is %.9g, want %.9g", what, i, got[i], want[i]);
            return 0;
        }
    }
    return 1;
}

/* ---- (a) dequantization of hand-built blocks ----------------------------------- */

static void test_dequant_q4_0(void)
{
    uint8_t b[18];
    put_half(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float got[32], want[32];
    for (int j = 0; j < 16; j++) {
        want[j] = 0.5f * (float)(j - 8);
        want[j + 16] = 0.5f * (float)(15 - j - 8);
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q4_0, b, got, 32) == KVB_OK);
    check_row("Q4_0", got, want, 32);
}

static void test_dequant_q4_1(void)
{
    uint8_t b[20];
    put_half(b, 0.5f);
    put_half(b + 2, -1.0f);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    float got[32], want[32];
    for (int j = 0; j < 16; j++) {
        want[j] = -1.0f + 0.5f * (float)j;
        want[j + 16] = -1.0f + 0.5f * (float)(15 - j);
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q4_1, b, got, 32) == KVB_OK);
    check_row("Q4_1", got, want, 32);
}

/* Q5: element e has the 5-bit value (e * 11 + 3) % 32; the low 4 bits go in
 * the nibbles (element j < 16 low, j + 16 high) and bit 4 in bit e of qh. */
static void build_q5(uint8_t *qh_at, uint8_t *qs, int *vals)
{
    uint32_t qh = 0;
    memset(qs, 0, 16);
    for (int e = 0; e < 32; e++) {
        int v = (e * 11 + 3) % 32;
        vals[e] = v;
        qs[e % 16] |= (uint8_t)((v & 15) << (e < 16 ? 0 : 4));
        if (v & 16) qh |= 1u << e;
    }
    put_u32(qh_at, qh);
}

static void test_dequant_q5(void)
{
    int vals[32];
    float got[32], want[32];
    uint8_t b0[22];
    put_half(b0, 0.25f);
    build_q5(b0 + 2, b0 + 6, vals);
    for (int e = 0; e < 32; e++) want[e] = 0.25f * (float)(vals[e] - 16);
    CHECK(quant_dequant_row(GGML_TYPE_Q5_0, b0, got, 32) == KVB_OK);
    check_row("Q5_0", got, want, 32);

    uint8_t b1[24];
    put_half(b1, 0.25f);
    put_half(b1 + 2, -3.0f);
    build_q5(b1 + 4, b1 + 8, vals);
    for (int e = 0; e < 32; e++) want[e] = 0.25f * (float)vals[e] - 3.0f;
    CHECK(quant_dequant_row(GGML_TYPE_Q5_1, b1, got, 32) == KVB_OK);
    check_row("Q5_1", got, want, 32);
}

static void test_dequant_q8_0(void)
{
    uint8_t b[2 * 34];
    float got[64], want[64];
    for (int blk = 0; blk < 2; blk++) {
        put_half(b + 34 * blk, blk ? -2.0f : 0.125f);
        for (int j = 0; j < 32; j++) {
            int8_t q = (int8_t)(j * 8 - 128 + blk);
            memcpy(b + 34 * blk + 2 + j, &q, 1);
            want[32 * blk + j] = (blk ? -2.0f : 0.125f) * (float)q;
        }
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q8_0, b, got, 64) == KVB_OK);
    check_row("Q8_0", got, want, 64);
}

static void test_dequant_q4_K(void)
{
    /* Scales and mins above 15 exercise the 2 high bits stored apart. */
    static const uint8_t sc[8] = {1, 63, 17, 32, 45, 5, 60, 33};
    static const uint8_t mn[8] = {0, 7, 63, 16, 48, 1, 31, 62};
    uint8_t b[144];
    memset(b, 0, sizeof b);
    put_half(b, 0.5f);
    put_half(b + 2, 0.25f);
    uint8_t *scales = b + 4;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    int q[256];
    for (int e = 0; e < 256; e++) {
        q[e] = (e * 7 + 3) % 16;
        int s = e / 32, l = e % 32;
        b[16 + 32 * (s / 2) + l] |= (uint8_t)(q[e] << (4 * (s % 2)));
    }
    float got[256], want[256];
    for (int e = 0; e < 256; e++) {
        int s = e / 32;
        want[e] = 0.5f * (float)sc[s] * (float)q[e] - 0.25f * (float)mn[s];
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q4_K, b, got, 256) == KVB_OK);
    check_row("Q4_K", got, want, 256);
}

static void test_dequant_q6_K(void)
{
    static const int8_t sc[16] = {-128, 127, 1, -1, 2, -3, 50, -60, 7, 0, 33, -33, 100, -100, 9, 64};
    uint8_t b[210];
    memset(b, 0, sizeof b);
    memcpy(b + 192, sc, 16);
    put_half(b + 208, 0.125f);
    int q[256];
    for (int e = 0; e < 256; e++) {
        q[e] = (e * 5 + 11) % 64;
        /* Element e of half n, quarter k, position l: low 4 bits in the
         * low (k < 2) or high nibble of ql[64n + 32(k%2) + l], high 2 bits
         * in bits 2k..2k+1 of qh[32n + l]. */
        int n = e / 128, k = (e % 128) / 32, l = e % 32;
        b[64 * n + 32 * (k % 2) + l] |= (uint8_t)((q[e] & 15) << (4 * (k / 2)));
        b[128 + 32 * n + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
    }
    float got[256], want[256];
    for (int e = 0; e < 256; e++) want[e] = 0.125f * (float)sc[e / 16] * (float)(q[e] - 32);
    CHECK(quant_dequant_row(GGML_TYPE_Q6_K, b, got, 256) == KVB_OK);
    check_row("Q6_K", got, want, 256);
}

/* The K-quants and IQ4 types kvbatch also reads, each block built here from
 * chosen values by the layouts of ggml-common.h (pytest_quant.py holds the
 * same code against gguf-py's dequantizers on random blocks). */
static const int iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void test_dequant_q5_K(void)
{
    static const uint8_t sc[8] = {3, 63, 17, 40, 45, 5, 60, 33};
    static const uint8_t mn[8] = {0, 9, 63, 16, 50, 1, 31, 62};
    uint8_t b[176];
    memset(b, 0, sizeof b);
    put_half(b, 0.25f);
    put_half(b + 2, 0.125f);
    for (int j = 0; j < 4; j++) {
        b[4 + j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        b[8 + j] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        b[12 + j] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    float got[256], want[256];
    for (int e = 0; e < 256; e++) {
        int q = (e * 7 + 3) % 32, s = e / 32, l = e % 32;
        b[48 + 32 * (s / 2) + l] |= (uint8_t)((q & 15) << (4 * (s % 2))); /* qs */
        b[16 + l] |= (uint8_t)((q >> 4) << s);                            /* qh */
        want[e] = 0.25f * (float)sc[s] * (float)q - 0.125f * (float)mn[s];
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q5_K, b, got, 256) == KVB_OK);
    check_row("Q5_K", got, want, 256);
}

/* Q2_K and Q3_K put element e = 128n + 32j + l in bits 2j, 2j+1 of
 * qs[32n + l]. */
static void put_crumb(uint8_t *qs, int e, int v)
{
    qs[32 * (e / 128) + e % 32] |= (uint8_t)(v << (2 * (e % 128 / 32)));
}

static void test_dequant_q2_K(void)
{
    uint8_t b[84];
    memset(b, 0, sizeof b);
    put_half(b + 80, 0.5f);
    put_half(b + 82, 0.25f);
    float got[256], want[256];
    for (int i = 0; i < 16; i++) b[i] = (uint8_t)(((i * 5 + 1) & 15) | ((i * 3 + 2) & 15) << 4);
    for (int e = 0; e < 256; e++) {
        int q = (e * 3 + e / 7) % 4;
        put_crumb(b + 16, e, q);
        want[e] = 0.5f * (float)((e / 16 * 5 + 1) & 15) * (float)q - 0.25f * (float)((e / 16 * 3 + 2) & 15);
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q2_K, b, got, 256) == KVB_OK);
    check_row("Q2_K", got, want, 256);
}

static void test_dequant_q3_K(void)
{
    uint8_t b[110];
    memset(b, 0, sizeof b);
    put_half(b + 108, 0.125f);
    int sc[16];
    for (int i = 0; i < 16; i++) {
        sc[i] = (i * 23 + 5) % 64 - 32; /* -32..31, stored + 32 */
        int u = sc[i] + 32;
        b[96 + i % 8] |= (uint8_t)((u & 15) << (4 * (i / 8)));
        b[96 + 8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
    }
    float got[256], want[256];
    for (int e = 0; e < 256; e++) {
        int q = (e * 5 + e / 9) % 8 - 4; /* -4..3: 2 low bits in qs, hmask bit set when q >= 0 */
        put_crumb(b + 32, e, q & 3);
        if (q >= 0) b[e % 32] |= (uint8_t)(1 << (e / 32));
        want[e] = 0.125f * (float)sc[e / 16] * (float)q;
    }
    CHECK(quant_dequant_row(GGML_TYPE_Q3_K, b, got, 256) == KVB_OK);
    check_row("Q3_K", got, want, 256);
}

static void test_dequant_iq4(void)
{
    uint8_t nl[2 * 18];
    float got[256], want[256];
    for (int blk = 0; blk < 2; blk++) {
        float d = blk ? -0.75f : 0.0625f;
        put_half(nl + 18 * blk, d);
        for (int j = 0; j < 16; j++) {
            int lo = (j * 7 + blk) % 16, hi = (j * 11 + 5) % 16;
            nl[18 * blk + 2 + j] = (uint8_t)(lo | hi << 4);
            want[32 * blk + j] = d * (float)iq4_grid[lo];
            want[32 * blk + j + 16] = d * (float)iq4_grid[hi];
        }
    }
    CHECK(quant_dequant_row(GGML_TYPE_IQ4_NL, nl, got, 64) == KVB_OK);
    check_row("IQ4_NL", got, want, 64);

    uint8_t xs[136];
    memset(xs, 0, sizeof xs);
    put_half(xs, 0.03125f);
    uint16_t sh = 0;
    for (int ib = 0; ib < 8; ib++) {
        int ls = (ib * 19 + 3) % 64 - 32, u = ls + 32;
        xs[4 + ib / 2] |= (uint8_t)((u & 15) << (4 * (ib % 2)));
        sh |= (uint16_t)((u >> 4) << (2 * ib));
        for (int j = 0; j < 16; j++) {
            int lo = (j * 5 + ib) % 16, hi = (j * 3 + 2 * ib + 1) % 16;
            xs[8 + 16 * ib + j] = (uint8_t)(lo | hi << 4);
            want[32 * ib + j] = 0.03125f * (float)ls * (float)iq4_grid[lo];
            want[32 * ib + j + 16] = 0.03125f * (float)ls * (float)iq4_grid[hi];
        }
    }
    memcpy(xs + 2, &sh, 2);
    CHECK(quant_dequant_row(GGML_TYPE_IQ4_XS, xs, got, 256) == KVB_OK);
    check_row("IQ4_XS", got, want, 256);
}

static void test_dequant_float(void)
{
    float src[5] = {1.5f, -2.25f, 0.0f, 65504.0f, -1e-3f}, got[5], want[5];
    uint16_t h[5], bf[5];
    for (int i = 0; i < 5; i++) {
        h[i] = kvb_f32_to_fp16(src[i]);
        bf[i] = kvb_f32_to_bf16(src[i]);
    }
    CHECK(quant_dequant_row(GGML_TYPE_F32, src, got, 5) == KVB_OK);
    check_row("F32", got, src, 5);
    for (int i = 0; i < 5; i++) want[i] = kvb_fp16_to_f32(h[i]);
    CHECK(quant_dequant_row(GGML_TYPE_F16, h, got, 5) == KVB_OK);
    check_row("F16", got, want, 5);
    for (int i = 0; i < 5; i++) want[i] = kvb_bf16_to_f32(bf[i]);
    CHECK(quant_dequant_row(GGML_TYPE_BF16, bf, got, 5) == KVB_OK);
    check_row("BF16", got, want, 5);
}

static void test_dequant_errors(void)
{
    uint8_t b[64] = {0};
    float y[64];
    CHECK(quant_dequant_row(GGML_TYPE_Q4_1, b, y, 33) == KVB_ERR_INVALID_ARG);
    CHECK(quant_dequant_row(GGML_TYPE_Q4_K, b, y, 32) == KVB_ERR_INVALID_ARG);
    CHECK(quant_dequant_row(GGML_TYPE_IQ2_XXS, b, y, 256) == KVB_ERR_UNSUPPORTED);
    CHECK(quant_dequant_row(GGML_TYPE_Q8_1, b, y, 32) == KVB_ERR_UNSUPPORTED);
    CHECK(quant_dequant_row(GGML_TYPE_IQ4_XS, b, y, 32) == KVB_ERR_INVALID_ARG);
    CHECK(!quant_type_supported(GGML_TYPE_IQ3_S));
    CHECK(quant_type_supported(GGML_TYPE_IQ4_NL));
    CHECK(quant_type_supported(GGML_TYPE_Q6_K));
    CHECK(quant_type_supported(GGML_TYPE_BF16));
}

/* ---- random weights ----------------------------------------------------------- */

static const enum ggml_type all_types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
};
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

static const char *type_name(enum ggml_type t) { return ggml_type_get_traits((uint32_t)t)->name; }

static int is_float_type(enum ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16; }

/* Types whose blocks are 256-element super-blocks. */
static int is_super_type(enum ggml_type t) { return ggml_type_get_traits((uint32_t)t)->block_elems == 256; }

/* A random (n_out, n_in) weight matrix: random bytes for the quantized
 * values, then finite, realistic scales written over the f16 fields. */
static uint8_t *make_weights(enum ggml_type type, int64_t n_in, int64_t n_out, size_t *row_bytes)
{
    const struct ggml_type_traits *tr = ggml_type_get_traits((uint32_t)type);
    uint64_t rb = 0;
    if (!ggml_type_row_bytes((uint32_t)type, (uint64_t)n_in, &rb)) return NULL;
    *row_bytes = (size_t)rb;
    uint8_t *w = malloc((size_t)rb * (size_t)n_out);
    if (!w) return NULL;
    size_t total = (size_t)rb * (size_t)n_out;
    for (size_t i = 0; i < total; i++) w[i] = (uint8_t)(rng_next() >> 56);
    if (is_float_type(type)) {
        size_t n = total / tr->block_bytes;
        for (size_t i = 0; i < n; i++) {
            float f = rng_uniform(-1.0f, 1.0f);
            if (type == GGML_TYPE_F32) memcpy(w + 4 * i, &f, 4);
            else if (type == GGML_TYPE_F16) put_half(w + 2 * i, f);
            else {
                uint16_t b = kvb_f32_to_bf16(f);
                memcpy(w + 2 * i, &b, 2);
            }
        }
        return w;
    }
    size_t nblk = total / tr->block_bytes;
    for (size_t i = 0; i < nblk; i++) {
        uint8_t *b = w + i * tr->block_bytes;
        float sgn = (rng_next() & 1) ? 1.0f : -1.0f;
        switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q5_0: put_half(b, sgn * rng_uniform(0.002f, 0.05f)); break;
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_1:
            put_half(b, rng_uniform(0.002f, 0.05f));
            put_half(b + 2, rng_uniform(-0.5f, 0.1f));
            break;
        case GGML_TYPE_Q8_0: put_half(b, sgn * rng_uniform(0.0005f, 0.01f)); break;
        case GGML_TYPE_Q4_K:
            put_half(b, rng_uniform(0.0005f, 0.002f));
            put_half(b + 2, rng_uniform(0.0005f, 0.004f));
            break;
        case GGML_TYPE_Q6_K: put_half(b + 208, sgn * rng_uniform(0.0001f, 0.001f)); break;
        case GGML_TYPE_Q5_K:
            put_half(b, rng_uniform(0.0002f, 0.001f));
            put_half(b + 2, rng_uniform(0.0005f, 0.004f));
            break;
        case GGML_TYPE_Q3_K: put_half(b + 108, sgn * rng_uniform(0.0005f, 0.004f)); break;
        case GGML_TYPE_Q2_K:
            put_half(b + 80, rng_uniform(0.002f, 0.01f));
            put_half(b + 82, rng_uniform(0.002f, 0.01f));
            break;
        case GGML_TYPE_IQ4_NL: put_half(b, sgn * rng_uniform(0.0002f, 0.005f)); break;
        case GGML_TYPE_IQ4_XS: put_half(b, sgn * rng_uniform(0.00002f, 0.0005f)); break;
        default: break;
        }
    }
    return w;
}

static float *make_input(int64_t n_in, int64_t n_tok)
{
    float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok));
    for (int64_t i = 0; i < n_in * n_tok; i++) {
        float v = rng_uniform(-1.0f, 1.0f);
        /* A few large values, as activations have, so block scales vary. */
        if ((rng_next() & 63) == 0) v *= 20.0f;
        x[i] = v;
    }
    return x;
}

/* The input quantization the kernels use (see matmul_scalar.c), written out
 * again here so the reference does not borrow from the code under test:
 * per block of 32, d = amax/127 and q = round-to-nearest-even(x / d). */
static void quantize_ref(const float *x, int64_t n, double *xq, double *half_step)
{
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            float v = x[32 * b + j] * id;
            v = v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v;
            xq[32 * b + j] = (double)d * (double)nearbyintf(v);
            half_step[32 * b + j] = 0.5 * (double)d;
        }
    }
}

/* ---- (b) products against references -------------------------------------------- */

struct refs {
    double *yq;   /* (n_tok, n_out): dequantized weights . quantized input */
    double *magq; /* (n_tok, n_out): sum |w * xq| */
    double *yf;   /* (n_tok, n_out): dequantized weights . float input */
    double *errf; /* (n_tok, n_out): bound on |yq - yf| from input quantization */
};

static void make_refs(enum ggml_type type, const uint8_t *w, size_t rb, const float *x, int64_t n_in, int64_t n_out,
                      int64_t n_tok, struct refs *r)
{
    size_t n = (size_t)(n_out * n_tok);
    r->yq = calloc(n, sizeof(double));
    r->magq = calloc(n, sizeof(double));
    r->yf = calloc(n, sizeof(double));
    r->errf = calloc(n, sizeof(double));
    float *wd = malloc(sizeof(float) * (size_t)n_in);
    double *xq = malloc(sizeof(double) * (size_t)n_in);
    double *hs = malloc(sizeof(double) * (size_t)n_in);
    int quantized = !is_float_type(type);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * n_in;
        if (quantized) quantize_ref(xt, n_in, xq, hs);
        for (int64_t k = 0; quantized == 0 && k < n_in; k++) {
            xq[k] = xt[k];
            hs[k] = 0.0;
        }
        for (int64_t o = 0; o < n_out; o++) {
            CHECK(quant_dequant_row(type, w + (size_t)o * rb, wd, n_in) == KVB_OK);
            double a = 0, m = 0, f = 0, e = 0;
            for (int64_t k = 0; k < n_in; k++) {
                a += (double)wd[k] * xq[k];
                m += fabs((double)wd[k] * xq[k]);
                f += (double)wd[k] * (double)xt[k];
                e += fabs((double)wd[k]) * hs[k];
            }
            size_t i = (size_t)(t * n_out + o);
            r->yq[i] = a;
            r->magq[i] = m;
            r->yf[i] = f;
            r->errf[i] = e;
        }
    }
    free(wd);
    free(xq);
    free(hs);
}

static void free_refs(struct refs *r)
{
    free(r->yq);
    free(r->magq);
    free(r->yf);
    free(r->errf);
}

static const char *impl_label(enum mm_impl impl)
{
    switch (impl) {
    case MM_IMPL_SCALAR: return "scalar";
    case MM_IMPL_AVX2: return "avx2";
    case MM_IMPL_AVX512: return "avx512";
    case MM_IMPL_AMX: return "amx";
    default: return "auto";
    }
}

static const enum mm_impl impls[] = {MM_IMPL_SCALAR, MM_IMPL_AVX2, MM_IMPL_AVX512, MM_IMPL_AMX};
#define N_IMPLS 4

/* Relative float tolerance for a sum of `terms` float additions of values
 * whose absolute sum is the magnitude: a worst-case rounding bound with some
 * room (scale products and int->float conversions add a few more roundings). */
static double float_tol(int64_t terms) { return (double)(terms + 16) * 1.2e-7; }

/* The AMX kernels' F16 and BF16 weights run on BF16 tiles with a split
 * input (matmul_bf16_amx.c): not the AVX-512 results, held to this bound
 * instead, relative to sum |w x|. Per product: the input is split into two
 * bf16 (what is left, at most 2^-16 |x|, is lost) and an F16 weight into two
 * (hi cut to 8 bits, |lo| < 2^-7 |w|; lo * xlo is lost, at most 2^-15
 * (1 + 2^-8) |w x|). Sums: each tile instruction adds 16 pairs to C, off by
 * at most 16 ulp of (|C| + sum |pairs|) (measured here: at most 7; the tile
 * unit's dot product is not a chain of fp32 adds); wh * xh runs in one chain
 * of one instruction per 32-input block, the cross products (at most
 * 1.51 * 2^-7 |w x| together) in a second of two (F16) or one (BF16) per
 * block; then one add of the two chains. */
static double bf16_tol(enum ggml_type type, int64_t n_in)
{
    const int64_t kp = (n_in + 31) / 32, cross = (type == GGML_TYPE_F16 ? 2 : 1) * kp;
    const double split = type == GGML_TYPE_F16 ? 3.02 * ldexp(1.0, -16) : 1.01 * ldexp(1.0, -16);
    const double sums = 16.0 * ((double)(kp + 1) + (double)(cross + 1) * 1.51 * ldexp(1.0, -7)) + 1.0;
    return split + sums * 1.01 * ldexp(1.0, -24);
}

static int on_bf16_tiles(enum mm_impl impl, enum ggml_type type)
{
    return impl == MM_IMPL_AMX && (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16);
}

/* Runs one shape of one type through every available implementation. */
static void check_shape(struct tpool *pool, enum ggml_type type, int64_t n_in, int64_t n_out, int64_t n_tok)
{
    size_t rb;
    uint8_t *w = make_weights(type, n_in, n_out, &rb);
    float *x = make_input(n_in, n_tok);
    struct refs r;
    make_refs(type, w, rb, x, n_in, n_out, n_tok, &r);
    struct mm_weight mw = {type, n_in, n_out, w, rb, 0};
    size_t ny = (size_t)(n_out * n_tok);
    float *y = malloc(sizeof(float) * ny);
    float *y_scalar = malloc(sizeof(float) * ny);
    int64_t terms = is_float_type(type) ? n_in : n_in / 32;
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!mm_impl_available(impls[ii])) continue;
        struct mm_ctx *ctx = NULL;
        CHECK(mm_ctx_create(pool, impls[ii], &ctx, NULL) == KVB_OK);
        if (!ctx) continue;
        CHECK(strcmp(mm_ctx_impl_name(ctx), impl_label(impls[ii])) == 0);
        for (size_t i = 0; i < ny; i++) y[i] = NAN;
        CHECK(mm_matmul(ctx, &mw, x, n_tok, y) == KVB_OK);
        int bad = 0;
        const double rel = on_bf16_tiles(impls[ii], type) ? bf16_tol(type, n_in) : float_tol(terms);
        for (size_t i = 0; i < ny && bad < 3; i++) {
            double tq = rel * r.magq[i] + 1e-30;
            double tf = 1.001 * r.errf[i] + tq;
            if (!(fabs(y[i] - r.yq[i]) <= tq) || !(fabs(y[i] - r.yf[i]) <= tf)) {
                CHECK_MSG(0,
                          "%s %s n_in=%lld n_out=%lld n_tok=%lld [t=%lld r=%lld]: got %.9g, "
                          "ref(quantized x) %.9g (tol %.3g), ref(float x) %.9g (tol %.3g)",
                          impl_label(impls[ii]), type_name(type), (long long)n_in, (long long)n_out, (long long)n_tok,
                          (long long)(i / (size_t)n_out), (long long)(i % (size_t)n_out), y[i], r.yq[i], tq, r.yf[i],
                          tf);
                bad++;
            }
        }
        if (impls[ii] == MM_IMPL_SCALAR) {
            memcpy(y_scalar, y, sizeof(float) * ny);
        } else {
            /* (d) SIMD vs scalar: both are within float rounding of the same
             * exact value, so within twice the tolerance of each other. */
            for (size_t i = 0; i < ny && bad < 3; i++) {
                double tol = (float_tol(terms) + rel) * r.magq[i] + 1e-30;
                if (!(fabs((double)y[i] - (double)y_scalar[i]) <= tol)) {
                    CHECK_MSG(0, "%s vs scalar %s n_in=%lld: [%zu] %.9g vs %.9g (tol %.3g)", impl_label(impls[ii]),
                              type_name(type), (long long)n_in, i, y[i], y_scalar[i], tol);
                    bad++;
                }
            }
        }
        mm_ctx_free(ctx);
    }
    free_refs(&r);
    free(y);
    free(y_scalar);
    free(x);
    free(w);
}

static void test_products(struct tpool *pool)
{
    static const int64_t n_in_32[] = {32, 64, 96, 288, 320, 352, 480, 576, 800, 1536, 2048};
    static const int64_t n_in_256[] = {256, 512, 768, 2048};
    static const int64_t n_in_f[] = {1, 5, 17, 100, 576, 1030};
    static const int64_t outs[] = {1, 7, 33, 67};
    static const int64_t toks[] = {1, 2, 5, 37};
    for (int ti = 0; ti < N_TYPES; ti++) {
        enum ggml_type type = all_types[ti];
        const int64_t *ins;
        int n_ins;
        if (is_float_type(type)) {
            ins = n_in_f;
            n_ins = (int)(sizeof n_in_f / sizeof n_in_f[0]);
        } else if (is_super_type(type)) {
            ins = n_in_256;
            n_ins = (int)(sizeof n_in_256 / sizeof n_in_256[0]);
        } else {
            ins = n_in_32;
            n_ins = (int)(sizeof n_in_32 / sizeof n_in_32[0]);
        }
        /* Walk the shape lists diagonally so every size meets several others
         * without running the full cross product through the scalar path. */
        for (int i = 0; i < n_ins; i++)
            for (int j = 0; j < 4; j++) check_shape(pool, type, ins[i], outs[(i + j) % 4], toks[j]);
    }
}

/* ---- (e) 16-bit activations (mm_ctx_set_act16) ----------------------------------- */

/* The residual's rounding as the test reads mm_ctx_set_act16's contract:
 * r = x - d q in float, then rounded like any input (quantize_ref). */
static void residual_ref(const float *x, int64_t n, float *r)
{
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            float v = x[32 * b + j] * id;
            v = v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v;
            float dq = d * nearbyintf(v);
            r[32 * b + j] = x[32 * b + j] - dq;
        }
    }
}

/* One shape: every implementation's act16 product against
 * (a) W (d q + d' q') in double, to float rounding of the two sums;
 * (b) W x in double, to the residual's rounding (|r - d' q'| <= d' / 2, d'
 *     <= d / 254) and the float error of r itself, which must come out over
 *     100 times tighter than the 8-bit bound in total;
 * (c) each token alone, and the packed weights, bit for bit. Returns the
 * number of failures. */
static int act16_shape(struct tpool *pool, enum ggml_type type, int64_t n_in, int64_t n_out, int64_t n_tok)
{
    size_t rb;
    uint8_t *w = make_weights(type, n_in, n_out, &rb);
    float *x = make_input(n_in, n_tok);
    size_t ny = (size_t)(n_out * n_tok);
    double *y2 = calloc(ny, sizeof(double)), *mag = calloc(ny, sizeof(double)), *yf = calloc(ny, sizeof(double));
    double *e16 = calloc(ny, sizeof(double)), *e8 = calloc(ny, sizeof(double));
    double *q1 = malloc(sizeof(double) * (size_t)n_in), *h1 = malloc(sizeof(double) * (size_t)n_in);
    double *q2 = malloc(sizeof(double) * (size_t)n_in), *h2 = malloc(sizeof(double) * (size_t)n_in);
    float *r = malloc(sizeof(float) * (size_t)n_in), *wd = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * n_in;
        quantize_ref(xt, n_in, q1, h1);
        residual_ref(xt, n_in, r);
        quantize_ref(r, n_in, q2, h2);
        for (int64_t o = 0; o < n_out; o++) {
            CHECK(quant_dequant_row(type, w + (size_t)o * rb, wd, n_in) == KVB_OK);
            double a = 0, m = 0, f = 0, e = 0, e_8 = 0;
            for (int64_t k = 0; k < n_in; k++) {
                a += (double)wd[k] * (q1[k] + q2[k]);
                m += fabs((double)wd[k] * q1[k]) + fabs((double)wd[k] * q2[k]);
                f += (double)wd[k] * (double)xt[k];
                e += fabs((double)wd[k]) * (h2[k] + ldexp(fabs((double)xt[k]) + 2.0 * h1[k], -23));
                e_8 += fabs((double)wd[k]) * h1[k];
            }
            size_t i = (size_t)(t * n_out + o);
            y2[i] = a, mag[i] = m, yf[i] = f, e16[i] = e, e8[i] = e_8;
        }
    }
    float *y = malloc(sizeof(float) * ny), *y1 = malloc(sizeof(float) * (size_t)n_out),
          *yp = malloc(sizeof(float) * ny);
    const int64_t terms = 2 * (n_in / 32) + 2;
    int bad = 0;
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!mm_impl_available(impls[ii])) continue;
        struct mm_ctx *ctx = NULL;
        CHECK(mm_ctx_create(pool, impls[ii], &ctx, NULL) == KVB_OK);
        if (!ctx) continue;
        mm_ctx_set_act16(ctx, true);
        CHECK(mm_ctx_act16(ctx));
        struct mm_weight mw = {type, n_in, n_out, w, rb, 0}, pw;
        void *owned = NULL;
        CHECK(mm_pack_weight(ctx, &mw, &pw, &owned) == KVB_OK);
        CHECK(mm_matmul(ctx, &mw, x, n_tok, y) == KVB_OK);
        CHECK(mm_matmul(ctx, &pw, x, n_tok, yp) == KVB_OK);
        double s16 = 0, s8 = 0;
        for (size_t i = 0; i < ny && bad < 3; i++) {
            const double tq = float_tol(terms) * mag[i] + 1e-30, tf = 1.001 * e16[i] + tq;
            s16 += fabs(y[i] - yf[i]);
            s8 += e8[i];
            if (!(fabs(y[i] - y2[i]) <= tq) || !(fabs(y[i] - yf[i]) <= tf) || memcmp(&y[i], &yp[i], 4)) {
                CHECK_MSG(0,
                          "act16 %s %s n_in=%lld n_out=%lld n_tok=%lld [t=%zu r=%zu]: got %.9g (packed %.9g), "
                          "ref(two-level x) %.9g (tol %.3g), ref(float x) %.9g (tol %.3g)",
                          impl_label(impls[ii]), type_name(type), (long long)n_in, (long long)n_out, (long long)n_tok,
                          i / (size_t)n_out, i % (size_t)n_out, y[i], yp[i], y2[i], tq, yf[i], tf);
                bad++;
            }
        }
        if (!(s16 * 100.0 <= s8)) {
            CHECK_MSG(0, "act16 %s %s n_in=%lld: total error %.3g not 100x under the 8-bit bound %.3g",
                      impl_label(impls[ii]), type_name(type), (long long)n_in, s16, s8);
            bad++;
        }
        for (int64_t t = 0; t < n_tok && t < 3 && !bad; t++) {
            int64_t tt = t == 2 ? n_tok - 1 : t;
            CHECK(mm_matmul(ctx, &pw, x + tt * n_in, 1, y1) == KVB_OK);
            if (memcmp(y1, y + tt * n_out, sizeof(float) * (size_t)n_out)) {
                CHECK_MSG(0, "act16 %s %s n_in=%lld n_tok=%lld: token %lld alone differs", impl_label(impls[ii]),
                          type_name(type), (long long)n_in, (long long)n_tok, (long long)tt);
                bad++;
            }
        }
        kvb_free(owned);
        mm_ctx_free(ctx);
    }
    free(y), free(y1), free(yp), free(y2), free(mag), free(yf), free(e16), free(e8);
    free(q1), free(h1), free(q2), free(h2), free(r), free(wd), free(x), free(w);
    return bad;
}

static void test_act16(struct tpool *pool)
{
    /* n_tok 300 at n_out 450: the product runs in several row blocks
     * (matmul.c's act16_block), as a prefill chunk does. */
    static const int64_t shapes[][3] = {{32, 7, 1}, {288, 33, 5}, {576, 67, 2}, {64, 450, 300}, {96, 450, 300}};
    static const int64_t shapes_k[][3] = {{256, 7, 1}, {512, 33, 5}, {256, 450, 300}};
    int n = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        enum ggml_type type = all_types[ti];
        if (is_float_type(type)) continue;
        const int64_t(*sh)[3] = is_super_type(type) ? shapes_k : shapes;
        int ns = is_super_type(type) ? 3 : 5;
        for (int i = 0; i < ns; i++) n += act16_shape(pool, type, sh[i][0], sh[i][1], sh[i][2]) == 0;
    }
    fprintf(stderr, "act16: %d shapes pass in every implementation\n", n);
}

/* ---- (c) determinism -------------------------------------------------------------- */

static void test_determinism_type(struct tpool **pools, int n_pools, enum mm_impl impl, enum ggml_type type,
                                  int64_t n_in, int64_t n_out)
{
    const int64_t n_tok = 37;
    size_t rb;
    uint8_t *w = make_weights(type, n_in, n_out, &rb);
    float *x = make_input(n_in, n_tok);
    struct mm_weight mw = {type, n_in, n_out, w, rb, 0};
    size_t ny = (size_t)(n_out * n_tok);
    float *ref = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny);
    float *xr = malloc(sizeof(float) * (size_t)(n_in * n_tok));
    const char *tn = type_name(type), *il = impl_label(impl);

    struct mm_ctx *ctx = NULL;
    CHECK(mm_ctx_create(pools[0], impl, &ctx, NULL) == KVB_OK);
    CHECK(mm_matmul(ctx, &mw, x, n_tok, ref) == KVB_OK);

    /* Each token alone. */
    for (int64_t t = 0; t < n_tok; t++) {
        CHECK(mm_matmul(ctx, &mw, x + t * n_in, 1, y) == KVB_OK);
        if (memcmp(y, ref + t * n_out, sizeof(float) * (size_t)n_out) != 0) {
            CHECK_MSG(0, "%s %s: token %lld alone differs from the batch", il, tn, (long long)t);
            break;
        }
    }
    /* Tokens in reverse order, and in odd-sized sub-batches (every tile edge). */
    for (int64_t t = 0; t < n_tok; t++) memcpy(xr + t * n_in, x + (n_tok - 1 - t) * n_in, sizeof(float) * (size_t)n_in);
    CHECK(mm_matmul(ctx, &mw, xr, n_tok, y) == KVB_OK);
    for (int64_t t = 0; t < n_tok; t++)
        if (memcmp(y + (n_tok - 1 - t) * n_out, ref + t * n_out, sizeof(float) * (size_t)n_out)) {
            CHECK_MSG(0, "%s %s: reversed batch differs at token %lld", il, tn, (long long)t);
            break;
        }
    for (int64_t t0 = 0, len = 2; t0 < n_tok; t0 += len, len = len % 7 + 1) {
        int64_t l = t0 + len > n_tok ? n_tok - t0 : len;
        CHECK(mm_matmul(ctx, &mw, x + t0 * n_in, l, y) == KVB_OK);
        if (memcmp(y, ref + t0 * n_out, sizeof(float) * (size_t)(l * n_out))) {
            CHECK_MSG(0, "%s %s: sub-batch [%lld, +%lld) differs", il, tn, (long long)t0, (long long)l);
            break;
        }
    }
    /* The weight packed for this implementation: bit for bit the same, for
     * the batch and for each token alone (both kernel paths); refused by
     * another implementation. */
    struct mm_weight pw;
    void *owned = NULL;
    CHECK(mm_pack_weight(ctx, &mw, &pw, &owned) == KVB_OK);
    if (owned) {
        CHECK(pw.packed != 0 && pw.data == owned && pw.row_bytes == mw.row_bytes);
        CHECK(mm_matmul(ctx, &pw, x, n_tok, y) == KVB_OK);
        CHECK_MSG(memcmp(y, ref, sizeof(float) * ny) == 0, "%s %s: packed weight differs (batch)", il, tn);
        for (int64_t t = 0; t < n_tok; t++) {
            CHECK(mm_matmul(ctx, &pw, x + t * n_in, 1, y) == KVB_OK);
            if (memcmp(y, ref + t * n_out, sizeof(float) * (size_t)n_out) != 0) {
                CHECK_MSG(0, "%s %s: packed weight, token %lld alone differs", il, tn, (long long)t);
                break;
            }
        }
        struct mm_ctx *other = NULL;
        CHECK(mm_ctx_create(pools[0], MM_IMPL_SCALAR, &other, NULL) == KVB_OK);
        CHECK(mm_matmul(other, &pw, x, n_tok, y) == KVB_ERR_INVALID_ARG);
        struct mm_weight pw2;
        void *owned2 = (void *)1;
        CHECK(mm_pack_weight(other, &pw, &pw2, &owned2) == KVB_ERR_INVALID_ARG && owned2 == NULL);
        mm_ctx_free(other);
        kvb_free(owned);
    }
    /* mm_apply_n with the same weight three times (different thread grains). */
    float *ys[3] = {y, malloc(sizeof(float) * ny), malloc(sizeof(float) * ny)};
    const struct mm_weight *ws[3] = {&mw, &mw, &mw};
    CHECK(mm_set_input(ctx, x, n_in, n_tok) == KVB_OK);
    CHECK(mm_apply_n(ctx, ws, ys, 3) == KVB_OK);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(memcmp(ys[i], ref, sizeof(float) * ny) == 0, "%s %s: mm_apply_n output %d", il, tn, i);
    free(ys[1]);
    free(ys[2]);
    mm_ctx_free(ctx);

    /* Other thread counts. */
    for (int p = 1; p < n_pools; p++) {
        ctx = NULL;
        CHECK(mm_ctx_create(pools[p], impl, &ctx, NULL) == KVB_OK);
        CHECK(mm_matmul(ctx, &mw, x, n_tok, y) == KVB_OK);
        CHECK_MSG(memcmp(y, ref, sizeof(float) * ny) == 0, "%s %s: %d threads differ from 1", il, tn,
                  tpool_size(pools[p]));
        mm_ctx_free(ctx);
    }
    free(xr);
    free(y);
    free(ref);
    free(x);
    free(w);
}

static void test_determinism(struct tpool **pools, int n_pools)
{
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!mm_impl_available(impls[ii])) continue;
        for (int ti = 0; ti < N_TYPES; ti++) {
            enum ggml_type type = all_types[ti];
            int k = is_super_type(type);
            /* n_out 67 and 50: not a multiple of any row tile or thread grain. */
            test_determinism_type(pools, n_pools, impls[ii], type, k ? 512 : 576, 67);
            test_determinism_type(pools, n_pools, impls[ii], type, k ? 256 : (is_float_type(type) ? 100 : 96), 50);
        }
    }
}

/* ---- (e) AMX against AVX-512, bit for bit --------------------------------------------- */

/* The AMX kernels compute every output with the AVX-512 kernels' float
 * operations on the same exact integer sums (matmul_amx.c), so the two are
 * equal bit for bit: for every type, at every tile edge (token counts around
 * the tile heights 1, 2, 4, 8, 16 and their multiples; rows around the
 * 16-row panels), every group kind of the wide types (S8, partial S4, S1 of
 * one and two blocks), stored and packed weights (each implementation's own
 * packed form), token chunks (n_in 8192 with 40 tokens is two chunks) and
 * any thread split. (Stored weights reach the tiles only in a build with
 * -DAMX_STORED=1, matmul_amx.c; otherwise the AMX table hands them to the
 * AVX-512 code, and those cases hold the routing, not the tile code.) */
static int amx_vs_avx512(struct tpool *pool, enum ggml_type type, int64_t n_in, int64_t n_out, int64_t n_tok, int pack)
{
    size_t rb;
    uint8_t *w = make_weights(type, n_in, n_out, &rb);
    float *x = make_input(n_in, n_tok);
    if (n_tok > 2) memset(x + n_in, 0, sizeof(float) * (size_t)n_in); /* an all-zero token: block scales 0 */
    struct mm_weight mw = {type, n_in, n_out, w, rb, 0};
    size_t ny = (size_t)(n_out * n_tok);
    float *y[2] = {malloc(sizeof(float) * ny), malloc(sizeof(float) * ny)};
    const enum mm_impl im[2] = {MM_IMPL_AVX512, MM_IMPL_AMX};
    void *owned[2] = {NULL, NULL};
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        struct mm_ctx *ctx = NULL;
        CHECK(mm_ctx_create(pool, im[k], &ctx, NULL) == KVB_OK);
        struct mm_weight use = mw;
        if (pack) CHECK(mm_pack_weight(ctx, &mw, &use, &owned[k]) == KVB_OK);
        for (size_t i = 0; i < ny; i++) y[k][i] = NAN;
        CHECK(mm_matmul(ctx, &use, x, n_tok, y[k]) == KVB_OK);
        mm_ctx_free(ctx);
    }
    for (size_t i = 0; i < ny; i++)
        if (memcmp(&y[0][i], &y[1][i], sizeof(float)) != 0) {
            CHECK_MSG(0, "amx vs avx512 %s n_in=%lld n_out=%lld n_tok=%lld%s: [t=%lld r=%lld] %.9g vs %.9g",
                      type_name(type), (long long)n_in, (long long)n_out, (long long)n_tok, pack ? " packed" : "",
                      (long long)(i / (size_t)n_out), (long long)(i % (size_t)n_out), y[1][i], y[0][i]);
            ok = 0;
            break;
        }
    for (int k = 0; k < 2; k++) kvb_free(owned[k]);
    free(y[0]);
    free(y[1]);
    free(x);
    free(w);
    return ok;
}

static void test_amx_bits(struct tpool **pools, int n_pools)
{
    if (!mm_impl_available(MM_IMPL_AMX) || !mm_impl_available(MM_IMPL_AVX512)) {
        fprintf(stderr, "amx vs avx512: not both supported by this CPU, skipped\n");
        return;
    }
    /* wide types: 1..3 blocks (S4/S1 only), 9, 10, 11 (S4 + S1), 16 (S8), 17, 18 (S8 + S1),
     * 25 (S8 + S4 + S1), 33, 96, 256 */
    static const int64_t in_wide[] = {32, 64, 96, 288, 320, 352, 512, 544, 576, 800, 1056, 3072, 8192};
    static const int64_t in_k[] = {256, 512, 768, 3072};
    static const int64_t outs[] = {1, 15, 16, 17, 33, 67};
    static const int64_t toks[] = {1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 40};
    static const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0,
                                           GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    int n = 0, bad = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int k = types[ti] == GGML_TYPE_Q4_K || types[ti] == GGML_TYPE_Q6_K;
        const int64_t *ins = k ? in_k : in_wide;
        const int n_ins = k ? 4 : 13;
        for (int i = 0; i < n_ins; i++)
            for (size_t j = 0; j < sizeof toks / sizeof toks[0]; j++) {
                if (ins[i] >= 8192 && toks[j] != 40 && toks[j] != 1) continue; /* the chunked shape: a few */
                const int64_t n_out = outs[(i + j) % 6];
                for (int pack = 0; pack < 2; pack++, n++)
                    bad += !amx_vs_avx512(pools[(i + j + (size_t)pack) % (size_t)n_pools], types[ti], ins[i], n_out,
                                          toks[j], pack);
            }
    }
    fprintf(stderr, "amx vs avx512: %d shapes, %d differ\n", n, bad);
}

/* One input read by weights of several types: an implementation may keep
 * several arrangements (forms) of the quantized input and make each the first
 * time a weight needs it, so every order of use must give each weight the
 * result it gets alone. n_in 512 suits every quantized type. */
static void test_mixed_types(struct tpool *pool)
{
    static const enum ggml_type types[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0,  GGML_TYPE_Q5_0,
                                           GGML_TYPE_Q4_K, GGML_TYPE_Q2_K, GGML_TYPE_IQ4_NL};
    enum { NT = 7 };
    const int64_t n_in = 512, n_out = 21, n_tok = 11;
    float *x = make_input(n_in, n_tok), *x2 = make_input(n_in, n_tok);
    for (int64_t i = 0; i < n_in * n_tok; i++) x2[i] = -0.5f * x2[i] + 0.25f;
    uint8_t *w[NT];
    struct mm_weight mw[NT];
    float *ref[NT], *y[NT];
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!mm_impl_available(impls[ii])) continue;
        struct mm_ctx *ctx = NULL;
        CHECK(mm_ctx_create(pool, impls[ii], &ctx, NULL) == KVB_OK);
        for (int i = 0; i < NT; i++) {
            size_t rb;
            w[i] = make_weights(types[i], n_in, n_out, &rb);
            mw[i] = (struct mm_weight){types[i], n_in, n_out, w[i], rb, 0};
            ref[i] = malloc(sizeof(float) * (size_t)(n_out * n_tok));
            y[i] = malloc(sizeof(float) * (size_t)(n_out * n_tok));
            CHECK(mm_matmul(ctx, &mw[i], x, n_tok, ref[i]) == KVB_OK);
        }
        /* One weight after another on one input, in two orders. Every form
         * is first filled from another input, so a form not remade reads
         * stale values. */
        for (int order = 0; order < 2; order++) {
            for (int i = 0; i < NT; i++) CHECK(mm_matmul(ctx, &mw[i], x2, n_tok, y[i]) == KVB_OK);
            CHECK(mm_set_input(ctx, x, n_in, n_tok) == KVB_OK);
            for (int k = 0; k < NT; k++) {
                int i = order ? NT - 1 - k : k;
                CHECK(mm_apply(ctx, &mw[i], y[i]) == KVB_OK);
                CHECK_MSG(memcmp(y[i], ref[i], sizeof(float) * (size_t)(n_out * n_tok)) == 0,
                          "%s %s after other types (order %d) differs from alone", impl_label(impls[ii]),
                          type_name(types[i]), order);
            }
        }
        /* All at once. */
        for (int i = 0; i < NT; i++) CHECK(mm_matmul(ctx, &mw[i], x2, n_tok, y[i]) == KVB_OK);
        const struct mm_weight *ws[NT];
        for (int i = 0; i < NT; i++) ws[i] = &mw[i];
        CHECK(mm_set_input(ctx, x, n_in, n_tok) == KVB_OK);
        CHECK(mm_apply_n(ctx, ws, y, NT) == KVB_OK);
        for (int i = 0; i < NT; i++)
            CHECK_MSG(memcmp(y[i], ref[i], sizeof(float) * (size_t)(n_out * n_tok)) == 0,
                      "%s %s in mm_apply_n with other types differs from alone", impl_label(impls[ii]),
                      type_name(types[i]));
        for (int i = 0; i < NT; i++) {
            free(w[i]);
            free(ref[i]);
            free(y[i]);
        }
        mm_ctx_free(ctx);
    }
    free(x);
    free(x2);
}

/* mm_set_input_fn: rows made by a callback on the pool's threads, once per
 * token, only when a product needs them; results as with mm_set_input. */
struct fn_rows {
    const float *x;
    int64_t n_in;
    int *calls; /* per token */
};

static void fn_make(void *arg, int64_t t, float *dst)
{
    struct fn_rows *a = arg;
    a->calls[t]++;
    memcpy(dst, a->x + t * a->n_in, sizeof(float) * (size_t)a->n_in);
}

static void test_input_fn(struct tpool *pool)
{
    const int64_t n_in = 576, n_out = 40, n_tok = 23;
    float *x = make_input(n_in, n_tok);
    size_t rb;
    uint8_t *w = make_weights(GGML_TYPE_Q4_1, n_in, n_out, &rb);
    struct mm_weight mw = {GGML_TYPE_Q4_1, n_in, n_out, w, rb, 0};
    float *ref = malloc(sizeof(float) * (size_t)(n_out * n_tok)), *y = malloc(sizeof(float) * (size_t)(n_out * n_tok));
    int calls[23];
    struct fn_rows rows = {x, n_in, calls};
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!mm_impl_available(impls[ii])) continue;
        struct mm_ctx *ctx = NULL;
        CHECK(mm_ctx_create(pool, impls[ii], &ctx, NULL) == KVB_OK);
        CHECK(mm_matmul(ctx, &mw, x, n_tok, ref) == KVB_OK);
        for (int64_t n = 1; n <= n_tok; n += n_tok - 1) { /* one token (on the caller) and many */
            memset(calls, 0, sizeof calls);
            CHECK(mm_set_input_fn(ctx, n_in, n, fn_make, &rows) == KVB_OK);
            int untouched = 1;
            for (int64_t t = 0; t < n; t++) untouched &= calls[t] == 0;
            CHECK_MSG(untouched, "%s: rows made before a product needed them", impl_label(impls[ii]));
            CHECK(mm_apply(ctx, &mw, y) == KVB_OK);
            CHECK(mm_apply(ctx, &mw, y) == KVB_OK);
            int once = 1;
            for (int64_t t = 0; t < n; t++) once &= calls[t] == 1;
            CHECK_MSG(once, "%s: a row was not made exactly once (n_tok %lld)", impl_label(impls[ii]), (long long)n);
            CHECK_MSG(memcmp(y, ref, sizeof(float) * (size_t)(n * n_out)) == 0,
                      "%s: rows from mm_set_input_fn differ from mm_set_input", impl_label(impls[ii]));
        }
        CHECK(mm_set_input_fn(ctx, n_in, n_tok, NULL, &rows) == KVB_ERR_INVALID_ARG);
        mm_ctx_free(ctx);
    }
    free(ref);
    free(y);
    free(w);
    free(x);
}

/* ---- errors ----------------------------------------------------------------------- */

static void test_errors(struct tpool *pool)
{
    struct mm_ctx *ctx = NULL;
    CHECK(mm_ctx_create(pool, MM_IMPL_AUTO, &ctx, NULL) == KVB_OK);
    uint8_t wbuf[4 * 20] = {0};
    float x[64] = {0}, y[8];
    struct mm_weight w = {GGML_TYPE_Q4_1, 64, 2, wbuf, 40, 0};
    CHECK(mm_apply(ctx, &w, y) == KVB_ERR_INVALID_ARG); /* no input yet */
    CHECK(mm_set_input(ctx, x, 32, 1) == KVB_OK);
    CHECK(mm_apply(ctx, &w, y) == KVB_ERR_INVALID_ARG); /* n_in mismatch */
    CHECK(mm_matmul(ctx, &w, x, 1, y) == KVB_OK);
    struct mm_weight w2 = {GGML_TYPE_IQ2_XXS, 256, 1, wbuf, 66, 0};
    CHECK(mm_matmul(ctx, &w2, x, 0, y) == KVB_ERR_UNSUPPORTED);
    struct mm_weight w3 = {GGML_TYPE_Q4_1, 64, 2, wbuf, 39, 0}; /* row too short */
    CHECK(mm_matmul(ctx, &w3, x, 1, y) == KVB_ERR_INVALID_ARG);
    struct mm_weight w4 = {GGML_TYPE_F32, 5, 2, x, 20, 0}; /* float weights, odd n_in: fine */
    CHECK(mm_matmul(ctx, &w4, x, 2, y) == KVB_OK);
    struct mm_weight w5 = {GGML_TYPE_Q8_0, 40, 1, wbuf, 34, 0}; /* not whole blocks */
    CHECK(mm_matmul(ctx, &w5, x, 1, y) == KVB_ERR_INVALID_ARG);
    /* Packing: padded rows are left as they are, short ones refused. */
    struct mm_weight pw;
    void *owned = (void *)1;
    struct mm_weight w6 = {GGML_TYPE_Q4_1, 32, 2, wbuf, 40, 0}; /* 20-byte rows padded to 40 */
    CHECK(mm_pack_weight(ctx, &w6, &pw, &owned) == KVB_OK && owned == NULL && pw.data == wbuf && pw.packed == 0);
    CHECK(mm_pack_weight(ctx, &w3, &pw, &owned) == KVB_ERR_INVALID_ARG && owned == NULL);
    CHECK(mm_pack_weight(ctx, NULL, &pw, &owned) == KVB_ERR_INVALID_ARG);
    mm_ctx_free(ctx);
    mm_ctx_free(NULL);

    /* Allocation failures are reported, never crash. */
    for (long n = 0; n < 4; n++) {
        ctx = NULL;
        kvb_alloc_fail_after(n);
        enum kvb_status st = mm_ctx_create(pool, MM_IMPL_SCALAR, &ctx, NULL);
        if (st == KVB_OK) st = mm_matmul(ctx, &w, x, 1, y);
        kvb_alloc_fail_after(-1);
        CHECK(st == KVB_OK || st == KVB_ERR_NOMEM);
        mm_ctx_free(ctx);
    }
}

/* What AUTO means and why a kernel is refused. Run twice by ctest: as is,
 * and with KVBATCH_AMX_DENY=1 (test_quant_amx_denied), which acts as the
 * operating system refusing the AMX tile state: AMX is then unavailable with
 * that reason, and AUTO falls back to AVX-512 (the rest of this test then
 * runs without AMX, as on a machine that refused it). */
static void test_kernel_choice(void)
{
    const struct cpu_features cf = cpu_features();
    const char *deny = getenv("KVBATCH_AMX_DENY");
    const int denied = deny && *deny && *deny != '0';
    CHECK(!denied || !cf.amx);
    CHECK(!cf.amx || cf.amx_cpu);
    CHECK(mm_impl_available(MM_IMPL_AMX) == cf.amx || !cf.amx);
    enum mm_impl k = MM_IMPL_AUTO;
    struct kvb_err err = {{0}};
    const char *env = getenv("KVBATCH_KERNELS");
    if (!env || !*env || !strcmp(env, "auto")) {
        CHECK(mm_impl_resolve(MM_IMPL_AUTO, &k, &err) == KVB_OK);
        CHECK(k == (mm_impl_available(MM_IMPL_AMX)      ? MM_IMPL_AMX
                    : mm_impl_available(MM_IMPL_AVX512) ? MM_IMPL_AVX512
                    : mm_impl_available(MM_IMPL_AVX2)   ? MM_IMPL_AVX2
                                                        : MM_IMPL_SCALAR));
    }
    if (!mm_impl_available(MM_IMPL_AMX)) {
        struct tpool *pool = NULL;
        struct mm_ctx *ctx = NULL;
        CHECK(tpool_create(1, &pool) == KVB_OK);
        CHECK(mm_ctx_create(pool, MM_IMPL_AMX, &ctx, &err) == KVB_ERR_UNSUPPORTED && ctx == NULL);
        CHECK_MSG(!cf.amx_cpu || strstr(err.msg, "refused"), "AMX refused, but the message says: %s", err.msg);
        CHECK_MSG(cf.amx_cpu || strstr(err.msg, "no AMX"), "no AMX, but the message says: %s", err.msg);
        tpool_free(pool);
    }
    enum mm_impl parsed;
    CHECK(mm_impl_parse("amx", &parsed) && parsed == MM_IMPL_AMX && !strcmp(mm_impl_label(parsed), "amx"));
    CHECK(mm_impl_parse("scalar", &parsed) && parsed == MM_IMPL_SCALAR);
    CHECK(!mm_impl_parse("AMX", &parsed) && !mm_impl_parse("", &parsed) && !mm_impl_parse(NULL, &parsed));
}

/* `test_quant dequant TYPE N`: dequantizes one row of N elements read from
 * stdin to raw f32 on stdout, so that tests/pytest_quant.py can compare with
 * gguf-py's independent numpy implementation. */
/* ---- (f) AMX BF16 tiles for F16 and BF16 weights ------------------------------------- */

/* One shape on the BF16 tiles: every output within bf16_tol of the exact
 * (double) product, and each token's outputs the same bits whether it runs
 * alone (decode), in the batch, or in another sub-batch (the determinism
 * contract, matmul_impl.h: the tiles run at every token count). */
static int bf16_shape(struct tpool *pool, enum ggml_type type, int64_t n_in, int64_t n_out, int64_t n_tok)
{
    size_t rb;
    uint8_t *w = make_weights(type, n_in, n_out, &rb);
    float *x = make_input(n_in, n_tok);
    /* Values the split must survive: zeros, tiny (denormal) and huge inputs. */
    for (int64_t i = 0; i < n_in * n_tok; i += 37) x[i] = (i / 37) % 3 == 0 ? 0.0f : (i / 37) % 3 == 1 ? 3e-39f : 3e4f;
    struct mm_weight mw = {type, n_in, n_out, w, rb, 0};
    const size_t ny = (size_t)(n_out * n_tok);
    float *y = malloc(sizeof(float) * ny), *y1 = malloc(sizeof(float) * ny);
    float *wd = malloc(sizeof(float) * (size_t)n_in);
    struct mm_ctx *ctx = NULL;
    int ok = 1;
    CHECK(mm_ctx_create(pool, MM_IMPL_AMX, &ctx, NULL) == KVB_OK);
    for (size_t i = 0; i < ny; i++) y[i] = NAN;
    CHECK(mm_matmul(ctx, &mw, x, n_tok, y) == KVB_OK);
    const double rel = bf16_tol(type, n_in);
    for (int64_t o = 0; o < n_out && ok; o++) {
        CHECK(quant_dequant_row(type, w + (size_t)o * rb, wd, n_in) == KVB_OK);
        for (int64_t t = 0; t < n_tok; t++) {
            double e = 0, m = 0;
            for (int64_t k = 0; k < n_in; k++) {
                e += (double)wd[k] * x[t * n_in + k];
                m += fabs((double)wd[k] * x[t * n_in + k]);
            }
            /* tiny inputs count as zero: at most 2^-126 |w| each */
            const double tol = rel * m + (double)n_in * ldexp(1.0, -126) + 1e-30;
            const float got = y[t * n_out + o];
            if (!(fabs(got - e) <= tol)) {
                CHECK_MSG(0,
                          "amx bf16 %s n_in=%lld n_out=%lld n_tok=%lld [t=%lld r=%lld]: %.9g vs exact %.9g (tol %.3g)",
                          type_name(type), (long long)n_in, (long long)n_out, (long long)n_tok, (long long)t,
                          (long long)o, got, e, tol);
                ok = 0;
                break;
            }
        }
    }
    /* Each token alone (at most 40 of them), then sub-batches of 1..17. */
    for (int64_t t = 0; t < n_tok && ok; t += n_tok > 40 ? 37 : 1) {
        CHECK(mm_matmul(ctx, &mw, x + t * n_in, 1, y1) == KVB_OK);
        if (memcmp(y1, y + t * n_out, sizeof(float) * (size_t)n_out)) {
            CHECK_MSG(0, "amx bf16 %s n_in=%lld n_out=%lld: token %lld alone differs from the batch of %lld",
                      type_name(type), (long long)n_in, (long long)n_out, (long long)t, (long long)n_tok);
            ok = 0;
        }
    }
    for (int64_t t0 = 0, len = 1; t0 < n_tok && ok; t0 += len, len = len % 17 + 1) {
        const int64_t l = t0 + len > n_tok ? n_tok - t0 : len;
        CHECK(mm_matmul(ctx, &mw, x + t0 * n_in, l, y1) == KVB_OK);
        if (memcmp(y1, y + t0 * n_out, sizeof(float) * (size_t)(l * n_out))) {
            CHECK_MSG(0, "amx bf16 %s n_in=%lld n_out=%lld: sub-batch [%lld, +%lld) differs from the batch of %lld",
                      type_name(type), (long long)n_in, (long long)n_out, (long long)t0, (long long)l,
                      (long long)n_tok);
            ok = 0;
        }
    }
    mm_ctx_free(ctx);
    free(wd);
    free(y);
    free(y1);
    free(x);
    free(w);
    return ok;
}

static void test_amx_bf16(struct tpool **pools, int n_pools)
{
    if (!mm_impl_available(MM_IMPL_AMX)) {
        fprintf(stderr, "amx bf16: AMX not available, skipped\n");
        return;
    }
    /* n_in: under one block, around the 32-element block and the 64-byte
     * rows, odd; n_out around the 16-row panels; n_tok 1..40 (the tile
     * widths 1..16, two token tiles, a remainder) and 512 (chunks). */
    static const int64_t ins[] = {1, 5, 31, 32, 33, 63, 64, 100, 255, 768, 1030, 3072};
    static const int64_t outs[] = {1, 15, 16, 17, 33, 67};
    static const enum ggml_type types[] = {GGML_TYPE_F16, GGML_TYPE_BF16};
    int n = 0, bad = 0;
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
            for (int64_t t = 1; t <= 40; t += (ins[i] >= 768 ? 13 : 1), n++)
                bad += !bf16_shape(pools[(i + (size_t)t) % (size_t)n_pools], types[ti], ins[i],
                                   outs[(i + (size_t)t) % 6], t);
            if (ins[i] == 100 || ins[i] == 1030 || ins[i] == 3072) {
                bad += !bf16_shape(pools[i % (size_t)n_pools], types[ti], ins[i], 33, 512);
                n++;
            }
        }
    fprintf(stderr, "amx bf16: %d shapes, %d failed\n", n, bad);
}

static int dequant_filter(int type, long n)
{
    uint64_t rb;
    if (!ggml_type_row_bytes((uint32_t)type, (uint64_t)n, &rb)) return 2;
    unsigned char *b = malloc((size_t)rb);
    float *y = malloc(sizeof(float) * (size_t)n);
    int rc = 0;
    if (!b || !y || fread(b, 1, (size_t)rb, stdin) != rb) rc = 2;
    else if (quant_dequant_row((enum ggml_type)type, b, y, n) != KVB_OK) rc = 3;
    else if (fwrite(y, sizeof(float), (size_t)n, stdout) != (size_t)n) rc = 4;
    free(b);
    free(y);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "dequant") == 0) return dequant_filter(atoi(argv[2]), atol(argv[3]));

    test_dequant_q4_0();
    test_dequant_q4_1();
    test_dequant_q5();
    test_dequant_q8_0();
    test_dequant_q4_K();
    test_dequant_q6_K();
    test_dequant_q5_K();
    test_dequant_q2_K();
    test_dequant_q3_K();
    test_dequant_iq4();
    test_dequant_float();
    test_dequant_errors();

    struct tpool *pools[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) CHECK(tpool_create(i + 1, &pools[i]) == KVB_OK);
    if (!pools[0] || !pools[1] || !pools[2]) return tu_finish();
    for (int ii = 0; ii < N_IMPLS; ii++)
        fprintf(stderr, "impl %s: %s\n", impl_label(impls[ii]),
                mm_impl_available(impls[ii]) ? "tested" : "not supported by this CPU, skipped");

    test_kernel_choice();
    test_errors(pools[1]);
    test_products(pools[1]);
    test_determinism(pools, 3);
    test_amx_bits(pools, 3);
    test_amx_bf16(pools, 3);
    test_mixed_types(pools[1]);
    test_input_fn(pools[1]);
    test_act16(pools[1]);
    for (int i = 0; i < 3; i++) tpool_free(pools[i]);
    return tu_finish();
}
