/* matmul_avx512.c — matrix products with AVX-512 and VNNI (vpdpbusd).
 *
 * Entered only after matmul.c checked the CPU (avx512f/bw/vl/vnni).
 *
 * Layout idea. A "group" is 8 blocks of 32 (256 elements). Its 16 int32
 * lanes each own one half-block (16 elements): lane L holds block
 * 2*(L&3) + (L>>3), half (L>>2)&1. Both the quantized input and the weights
 * are rearranged into 4 "steps" of 64 bytes in which lane L carries 4
 * consecutive bytes of its half-block, so four vpdpbusd accumulate each
 * half-block's whole integer dot product in its own lane with no horizontal
 * work, and one float step per group applies the 16 per-lane scales:
 *
 *   facc += float(isum) * (dw * dx)      [+ mw * dx*sum(qx) for types with a min]
 *
 * Why half-blocks: Q6_K's scales cover 16 elements, and with one lane per
 * half-block every type fits the same scheme. vpdpbusd wants unsigned
 * weights, so signed types are read with their stored offset (nibble = q + 8,
 * q + 16, q + 32; Q8_0 as q ^ 0x80 = q + 128) and offset * (the input's lane
 * sums) is removed exactly in the integer start value.
 *
 * Two paths, one arithmetic:
 *  - few tokens (decode, n_tok <= FUSED_T): each weight group is unpacked in
 *    registers and used at once; the kernel streams the weights once, with
 *    software prefetch, and is bound by memory bandwidth;
 *  - many tokens (prefill): a panel of rows is unpacked into scratch once and
 *    R x T tiles reuse it from L1 for every token (compute-bound).
 * Determinism: every output element runs the same float operations in the
 * same order (groups 0..ng-1, then one fixed 16-lane reduction tree) in both
 * paths and every tile shape, for any batch and any thread split; the tests
 * check this bit for bit. */
#include <immintrin.h>
#include <string.h>

#include "matmul_impl.h"
#include "quant_blocks.h"

#define GROUP_BLOCKS 8
#define GROUP_BYTES_Q 256 /* 4 steps x 64 bytes */
#define WGROUP_BYTES 384  /* weight group: steps, dw[16], mw[16] */
#define PANEL_ROWS 16     /* weight rows unpacked at a time */
#define TILE_R 4          /* rows per micro-kernel */
#define TILE_T 3          /* tokens per micro-kernel */
/* Tokens whose quantized input is kept hot while one panel is applied. */
#define TOKEN_BUDGET_BYTES (512 * 1024)

/* Lane L -> its block within the group, and its 16-element sub-block. */
static const int32_t lane_block[16] = {0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7};
static const int32_t lane_sub16[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

static int64_t n_groups(int64_t n_in) { return (n_in / 32 + GROUP_BLOCKS - 1) / GROUP_BLOCKS; }

/* ---- the input: per token, over groups g: q[g][4][64] i8 | xs[g][16] f32
 * (block scale per lane) | sxs[g][16] f32 (scale * lane sum) | sx[g][16] i32
 * (lane sum) -------------------------------------------------------------- */

static size_t act_bytes(int64_t n_in) { return (size_t)n_groups(n_in) * (GROUP_BYTES_Q + 3 * 64); }

/* Z[m] holds natural blocks 2m and 2m+1 (32 bytes each). A 4x4 transpose of
 * dwords within each 128-bit lane gives the steps: step s, lane 4k+j = dword
 * s of 128-bit lane k of Z[j]. */
static inline void to_steps(const __m512i z[4], __m512i st[4])
{
    __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    __m512i t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    __m512i t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    st[0] = _mm512_unpacklo_epi64(t0, t2);
    st[1] = _mm512_unpackhi_epi64(t0, t2);
    st[2] = _mm512_unpacklo_epi64(t1, t3);
    st[3] = _mm512_unpackhi_epi64(t1, t3);
}

static inline __m512i pair512(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Per-block floats (8, natural order) to per-lane floats. */
static inline __m512 per_lane(__m256 v8)
{
    return _mm512_permutexvar_ps(_mm512_loadu_si512(lane_block), _mm512_castps256_ps512(v8));
}

static void quantize(const float *x, int64_t n_in, void *dst)
{
    int64_t nb = n_in / 32, ng = n_groups(n_in);
    uint8_t *q = dst;
    float *xs = (float *)(q + ng * GROUP_BYTES_Q);
    float *sxs = xs + ng * 16;
    int32_t *sx = (int32_t *)(sxs + ng * 16);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t g = 0; g < ng; g++) {
        __m256i nat[GROUP_BLOCKS];
        float d8[GROUP_BLOCKS];
#pragma GCC unroll 8
        for (int b = 0; b < GROUP_BLOCKS; b++) {
            int64_t blk = g * GROUP_BLOCKS + b;
            if (blk >= nb) {
                nat[b] = _mm256_setzero_si256();
                d8[b] = 0.0f;
                continue;
            }
            __m512 v0 = _mm512_loadu_ps(x + 32 * blk), v1 = _mm512_loadu_ps(x + 32 * blk + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            /* Same formula and rounding as the scalar path (matmul_scalar.c). */
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            __m512 vid = _mm512_set1_ps(id);
            __m512 a0 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, vid), lo), hi);
            __m512 a1 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, vid), lo), hi);
            __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a0));
            __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a1));
            nat[b] = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
            d8[b] = d;
        }
        __m512i z[4], st[4];
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) z[m] = pair512(nat[2 * m], nat[2 * m + 1]);
        to_steps(z, st);
        __m512i s = _mm512_setzero_si512();
        const __m512i ones = _mm512_set1_epi8(1);
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            _mm512_storeu_si512(q + g * GROUP_BYTES_Q + 64 * k, st[k]);
            s = _mm512_dpbusd_epi32(s, ones, st[k]);
        }
        __m512 xsv = per_lane(_mm256_loadu_ps(d8));
        _mm512_storeu_ps(xs + 16 * g, xsv);
        _mm512_storeu_ps(sxs + 16 * g, _mm512_mul_ps(xsv, _mm512_cvtepi32_ps(s)));
        _mm512_storeu_si512(sx + 16 * g, s);
    }
}

/* One f16 via F16C: an out-of-line call here would save and restore the
 * vector registers around it. */
static inline float half_at(const uint8_t *p) { return _cvtsh_ss(qb_u16(p)); }

/* ---- weights: one group of one row -> steps (u8) + dw[16] + mw[16] ---------
 *
 * Q4_0, Q4_1 and Q4_K keep their high nibbles in place (q * 16) rather than
 * shifting them down: that saves a shift per vector. The lanes fed by high
 * nibbles carry dw / 16 (and a bias * 16) instead; isum * 16 converts to
 * float exactly and dw / 16 is exact, so the results equal the unshifted
 * arithmetic (and both paths use the same form anyway). */

struct wtype {
    int block_bytes; /* bytes per 32-block (K-quants: per 256) */
    int bias;        /* offset that made values unsigned (0: the type has a min) */
    int has_min;
};

static struct wtype wtype_of(enum ggml_type t)
{
    switch (t) {
    case GGML_TYPE_Q4_0: return (struct wtype){18, 8, 0};
    case GGML_TYPE_Q4_1: return (struct wtype){20, 0, 1};
    case GGML_TYPE_Q5_0: return (struct wtype){22, 16, 0};
    case GGML_TYPE_Q5_1: return (struct wtype){24, 0, 1};
    case GGML_TYPE_Q8_0: return (struct wtype){34, 128, 0};
    case GGML_TYPE_Q4_K: return (struct wtype){144, 0, 1};
    case GGML_TYPE_Q6_K: return (struct wtype){210, 32, 0};
    default: return (struct wtype){0, 0, 0};
    }
}

/* Lanes fed by high nibbles (Q4_0, Q4_1): 128-bit lanes 1 and 3. */
#define HI_NIB_LANES 0xF0F0

/* Minus the bias of each lane, as the integer start value's multiplier. */
static inline __m512i type_kneg(enum ggml_type type, int bias)
{
    __m512i k = _mm512_set1_epi32(-bias);
    if (type == GGML_TYPE_Q4_0) k = _mm512_mask_mov_epi32(k, HI_NIB_LANES, _mm512_set1_epi32(-bias * 16));
    return k;
}

/* log2 of each lane's bias: every bias is a power of two, so the start
 * value -bias * sum can be a shift and a negation (exact in two's
 * complement, like the multiply) instead of a slow vpmulld. */
static inline __m512i type_kshift(enum ggml_type type, int bias)
{
    const int k = bias > 0 ? __builtin_ctz((unsigned)bias) : 0;
    __m512i s = _mm512_set1_epi32(k);
    if (type == GGML_TYPE_Q4_0) s = _mm512_mask_mov_epi32(s, HI_NIB_LANES, _mm512_set1_epi32(k + 4));
    return s;
}

/* The f16 scale and the f16 next to it (the min, for types that have one) of
 * the first nblk of 8 blocks of `bs` bytes, per lane; absent blocks get 0. */
static inline void scales_per_lane(const uint8_t *src, int bs, int nblk, __m512 *d, __m512 *m)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32(bs));
    __m256i dm;
    if (nblk >= GROUP_BLOCKS)
        dm = _mm256_i32gather_epi32((const int *)src, idx, 1);
    else
        dm = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), (__mmask8)((1u << nblk) - 1),
                                          idx, src, 1);
    /* 16 halves d0 m0 d1 m1 ... -> floats; lane L takes d (or m) of its block. */
    __m512 f = _mm512_cvtph_ps(dm);
    const __m512i pick_d = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 2, 6, 10, 14, 2, 6, 10, 14);
    *d = _mm512_permutexvar_ps(pick_d, f);
    if (m) *m = _mm512_permutexvar_ps(_mm512_add_epi32(pick_d, _mm512_set1_epi32(1)), f);
}

/* Q4_0 / Q4_1: Z[m] = (low nibbles, high nibbles * 16) of block 2m, then the
 * same of block 2m+1. Broadcast loads put each block's 16 bytes in two lanes. */
static inline void nib4_to_z(const uint8_t *src, int bs, int qoff, int nblk, __m512i z[4])
{
    const __m512i keep = _mm512_setr_epi32(0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F,
                                           (int)0xF0F0F0F0, (int)0xF0F0F0F0, (int)0xF0F0F0F0,
                                           (int)0xF0F0F0F0, 0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F,
                                           0x0F0F0F0F, (int)0xF0F0F0F0, (int)0xF0F0F0F0,
                                           (int)0xF0F0F0F0, (int)0xF0F0F0F0);
#pragma GCC unroll 8
    for (int m = 0; m < 4; m++) {
        const uint8_t *a = src + (2 * m) * bs + qoff, *b = a + bs;
        __m512i v;
        if (2 * m + 2 <= nblk)
            v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a)),
                                            0xFF00, _mm_loadu_si128((const __m128i *)b));
        else if (2 * m + 1 == nblk)
            v = _mm512_maskz_broadcast_i32x4(0x00FF, _mm_loadu_si128((const __m128i *)a));
        else
            v = _mm512_setzero_si512();
        z[m] = _mm512_and_si512(v, keep);
    }
}

/* Q5_0 / Q5_1: values 0..31 need the fifth bit beside the high nibble, so
 * here the high nibbles are shifted down. */
static inline void nib5_to_z(const uint8_t *src, int bs, int qoff, int hoff, int nblk, __m512i z[4])
{
    const __m512i perm = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(16);
#pragma GCC unroll 8
    for (int m = 0; m < 4; m++) {
        const uint8_t *a = src + (2 * m) * bs, *b = a + bs;
        if (2 * m >= nblk) {
            z[m] = _mm512_setzero_si512();
            continue;
        }
        int two = 2 * m + 2 <= nblk;
        __m128i qa = _mm_loadu_si128((const __m128i *)(a + qoff));
        __m128i qb = two ? _mm_loadu_si128((const __m128i *)(b + qoff)) : _mm_setzero_si128();
        __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
        __m512i v = _mm512_permutex2var_epi64(_mm512_castsi256_si512(y), perm,
                                              _mm512_castsi256_si512(_mm256_srli_epi16(y, 4)));
        v = _mm512_and_si512(v, m4);
        __mmask64 hb = (__mmask64)qb_u32(a + hoff) | (two ? (__mmask64)qb_u32(b + hoff) << 32 : 0);
        z[m] = _mm512_mask_add_epi8(v, hb, v, b4);
    }
}

/* One group of weights (nblk of 8 blocks present; K-quants: one super-block)
 * into steps and per-lane scales, in registers. */
static inline __attribute__((always_inline)) void wgroup(enum ggml_type type, const uint8_t *src,
                                                         int nblk, __m512i st[4], __m512 *dw,
                                                         __m512 *mw)
{
    __m512i z[4];
    const __m512 sixteenth = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), HI_NIB_LANES,
                                                _mm512_set1_ps(0.0625f));
    *mw = _mm512_setzero_ps();
    switch (type) {
    case GGML_TYPE_Q4_0:
        nib4_to_z(src, 18, 2, nblk, z);
        scales_per_lane(src, 18, nblk, dw, NULL);
        *dw = _mm512_mul_ps(*dw, sixteenth);
        break;
    case GGML_TYPE_Q4_1:
        nib4_to_z(src, 20, 4, nblk, z);
        scales_per_lane(src, 20, nblk, dw, mw);
        *dw = _mm512_mul_ps(*dw, sixteenth);
        break;
    case GGML_TYPE_Q5_0:
        nib5_to_z(src, 22, 6, 2, nblk, z);
        scales_per_lane(src, 22, nblk, dw, NULL);
        break;
    case GGML_TYPE_Q5_1:
        nib5_to_z(src, 24, 8, 4, nblk, z);
        scales_per_lane(src, 24, nblk, dw, mw);
        break;
    case GGML_TYPE_Q8_0:
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            const uint8_t *a = src + 68 * m + 2;
            __m256i lo = 2 * m < nblk ? _mm256_loadu_si256((const __m256i *)a) : _mm256_setzero_si256();
            __m256i hi = 2 * m + 1 < nblk ? _mm256_loadu_si256((const __m256i *)(a + 34))
                                          : _mm256_setzero_si256();
            z[m] = pair512(lo, hi);
        }
        scales_per_lane(src, 34, nblk, dw, NULL);
        break;
    case GGML_TYPE_Q4_K: {
        /* 32 bytes of qs hold sub-block 2m (low nibbles) and 2m+1 (high, kept * 16). */
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(src + 16 + 32 * m)));
            z[m] = _mm512_and_si512(c, _mm512_setr_epi64(0x0F0F0F0F0F0F0F0Fll, 0x0F0F0F0F0F0F0F0Fll,
                                                         0x0F0F0F0F0F0F0F0Fll, 0x0F0F0F0F0F0F0F0Fll,
                                                         (long long)0xF0F0F0F0F0F0F0F0ull,
                                                         (long long)0xF0F0F0F0F0F0F0F0ull,
                                                         (long long)0xF0F0F0F0F0F0F0F0ull,
                                                         (long long)0xF0F0F0F0F0F0F0F0ull));
        }
        float d = half_at(src), dmin = half_at(src + 2);
        float ds[8], ms[8];
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            uint8_t sc, mn;
            qb_q4k_scale_min(s, src + 4, &sc, &mn);
            /* odd sub-blocks come from high nibbles, kept * 16 */
            ds[s] = d * (float)sc * (s & 1 ? 0.0625f : 1.0f);
            ms[s] = -(dmin * (float)mn);
        }
        *dw = per_lane(_mm256_loadu_ps(ds));
        *mw = per_lane(_mm256_loadu_ps(ms));
        break;
    }
    case GGML_TYPE_Q6_K: {
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
        __m256i nat[8];
#pragma GCC unroll 8
        for (int n = 0; n < 2; n++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(src + 64 * n));
            __m256i b = _mm256_loadu_si256((const __m256i *)(src + 64 * n + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(src + 128 + 32 * n));
            nat[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(a, m4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            nat[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(b, m4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            nat[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                                             _mm256_and_si256(h, m30));
            nat[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        }
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) z[m] = pair512(nat[2 * m], nat[2 * m + 1]);
        __m512 sc = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 192))));
        sc = _mm512_mul_ps(_mm512_set1_ps(half_at(src + 208)), sc);
        *dw = _mm512_permutexvar_ps(_mm512_loadu_si512(lane_sub16), sc);
        break;
    }
    default: /* unreachable: callers dispatch on supported types */
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) z[m] = _mm512_setzero_si512();
        *dw = _mm512_setzero_ps();
        break;
    }
    to_steps(z, st);
    if (type == GGML_TYPE_Q8_0) { /* signed -> unsigned: q + 128 */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) st[k] = _mm512_xor_si512(st[k], flip);
    }
}

/* wgroup with the common full group compiled apart from the partial one, so
 * that the full one has no per-block checks. */
static inline __attribute__((always_inline)) void wgroup_any(enum ggml_type type, const uint8_t *src,
                                                             int nblk, __m512i st[4], __m512 *dw,
                                                             __m512 *mw)
{
    if (nblk == GROUP_BLOCKS) wgroup(type, src, GROUP_BLOCKS, st, dw, mw);
    else wgroup(type, src, nblk, st, dw, mw);
}

/* Blocks of 32 present in group g of a row of nb blocks. */
static inline int group_blocks(int64_t nb, int64_t g)
{
    int64_t n = nb - g * GROUP_BLOCKS;
    return n >= GROUP_BLOCKS ? GROUP_BLOCKS : (int)n;
}

static inline const uint8_t *group_src(const uint8_t *row, int k_quant, int bs, int64_t g)
{
    return row + (size_t)g * (size_t)(k_quant ? bs : GROUP_BLOCKS * bs);
}

static inline __attribute__((always_inline)) void unpack_row_t(enum ggml_type type,
                                                               const uint8_t *row, int64_t nb,
                                                               uint8_t *out)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    int64_t ng = n_groups(nb * 32);
    for (int64_t g = 0; g < ng; g++) {
        __m512i st[4];
        __m512 dw, mw;
        wgroup_any(type, group_src(row, k_quant, wt.block_bytes, g), k_quant ? 8 : group_blocks(nb, g),
                   st, &dw, &mw);
        uint8_t *o = out + g * WGROUP_BYTES;
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) _mm512_store_si512(o + 64 * k, st[k]);
        _mm512_store_ps(o + 256, dw);
        _mm512_store_ps(o + 320, mw);
    }
}

/* Row unpacking for the panel path, one instance per type. */
static void unpack_row(enum ggml_type type, const uint8_t *row, int64_t nb, uint8_t *out)
{
    switch (type) {
    case GGML_TYPE_Q4_0: unpack_row_t(GGML_TYPE_Q4_0, row, nb, out); break;
    case GGML_TYPE_Q4_1: unpack_row_t(GGML_TYPE_Q4_1, row, nb, out); break;
    case GGML_TYPE_Q5_0: unpack_row_t(GGML_TYPE_Q5_0, row, nb, out); break;
    case GGML_TYPE_Q5_1: unpack_row_t(GGML_TYPE_Q5_1, row, nb, out); break;
    case GGML_TYPE_Q8_0: unpack_row_t(GGML_TYPE_Q8_0, row, nb, out); break;
    case GGML_TYPE_Q4_K: unpack_row_t(GGML_TYPE_Q4_K, row, nb, out); break;
    case GGML_TYPE_Q6_K: unpack_row_t(GGML_TYPE_Q6_K, row, nb, out); break;
    default: break;
    }
}

/* ---- the micro-kernels ----------------------------------------------------------- */

/* The one 16-lane reduction every output element goes through. */
static inline float reduce16(__m512 v)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* reduce16 of four vectors at once, result i in lane i: the same pairs are
 * added at every level (v[j] + v[j+8], then + 4, + 2, + 1), so each result
 * is bit for bit reduce16's, for a quarter of the shuffles. */
static inline __m128 reduce16x4(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 c = _mm512_add_ps(b, _mm512_permute_ps(b, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 d = _mm512_add_ps(c, _mm512_movehdup_ps(c));
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), d));
}

/* The float step of one group for one (row, token): the same operations in
 * every kernel, so tile shape and batch cannot change a result. */
static inline __attribute__((always_inline)) __m512 group_fma(__m512 facc, __m512i isum, __m512 dw,
                                                              __m512 xs, int has_min, __m512 mw,
                                                              __m512 sxs)
{
    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, xs), facc);
    if (has_min) facc = _mm512_fmadd_ps(mw, sxs, facc);
    return facc;
}

struct qtile {
    const uint8_t *w;   /* first panel row */
    size_t w_stride;    /* bytes per panel row */
    const uint8_t *x;   /* first token */
    size_t x_stride;    /* bytes per token */
    int64_t ng;
    __m512i kshift;     /* log2 of the per-lane bias (see type_kshift) */
    int bias, has_min;
    float *y;           /* y[t * ldy + r] */
    int64_t ldy;
};

/* R rows x T tokens of unpacked panel, all groups. Loops over r and t are
 * unrolled at each constant (R, T). */
static inline __attribute__((always_inline)) void tile_q(const int R, const int T,
                                                         const struct qtile *a)
{
    const int64_t ng = a->ng;
    const size_t xs_off = (size_t)ng * GROUP_BYTES_Q, sxs_off = xs_off + (size_t)ng * 64,
                 sx_off = sxs_off + (size_t)ng * 64;
    __m512 facc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = a->w + g * WGROUP_BYTES;
        const uint8_t *xg = a->x + g * GROUP_BYTES_Q;
        __m512i acc[TILE_R][TILE_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512i b0 = _mm512_setzero_si512();
            if (a->bias)
                b0 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_sllv_epi32(_mm512_load_si512(a->x + t * a->x_stride + sx_off + 64 * g),
                                                        a->kshift));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = b0;
        }
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            __m512i wv[TILE_R];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) wv[r] = _mm512_load_si512(wg + r * a->w_stride + 64 * s);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m512i xv = _mm512_load_si512(xg + t * a->x_stride + 64 * s);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv[r], xv);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = a->x + t * a->x_stride;
            __m512 xs = _mm512_load_ps(xt + xs_off + 64 * g);
            __m512 sxs = a->has_min ? _mm512_load_ps(xt + sxs_off + 64 * g) : _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *wr = wg + r * a->w_stride;
                facc[r][t] = group_fma(facc[r][t], acc[r][t], _mm512_load_ps(wr + 256), xs,
                                       a->has_min, _mm512_load_ps(wr + 320), sxs);
            }
        }
    }
    if (R == 4) {
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            _mm_storeu_ps(a->y + t * a->ldy, reduce16x4(facc[0][t], facc[1][t], facc[2][t], facc[3][t]));
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[t * a->ldy + r] = reduce16(facc[r][t]);
}

#define QCASE(R_, T_) \
    case (R_) * 8 + (T_): tile_q(R_, T_, a); break;

static void tile_q_any(int R, int T, const struct qtile *a)
{
    switch (R * 8 + T) {
        QCASE(1, 1) QCASE(1, 2) QCASE(1, 3)
        QCASE(2, 1) QCASE(2, 2) QCASE(2, 3)
        QCASE(3, 1) QCASE(3, 2) QCASE(3, 3)
        QCASE(4, 1) QCASE(4, 2) QCASE(4, 3)
    default: break;
    }
}

/* R rows against n whole tiles of TILE_T tokens, one after another in one
 * loop: with 576 inputs a tile is only 3 groups of work, and calling it
 * through the dispatch once per tile left its set-up and reduction
 * unoverlapped. Same arithmetic per output as tile_q alone. */
static inline __attribute__((always_inline)) void tile_q_row_run(const int R, struct qtile a, int64_t n)
{
    for (int64_t k = 0; k < n; k++) {
        tile_q(R, TILE_T, &a);
        a.x += TILE_T * a.x_stride;
        a.y += TILE_T * a.ldy;
    }
}

static void tile_q_rows(int R, const struct qtile *a, int64_t n)
{
    switch (R) {
    case 1: tile_q_row_run(1, *a, n); break;
    case 2: tile_q_row_run(2, *a, n); break;
    case 3: tile_q_row_run(3, *a, n); break;
    case 4: tile_q_row_run(4, *a, n); break;
    default: break;
    }
}

static void rows_panel(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0,
                       int64_t r1, uint8_t *panel)
{
    struct wtype wt = wtype_of(w->type);
    int64_t nb = in->n_in / 32, ng = n_groups(in->n_in);
    size_t prow = (size_t)ng * WGROUP_BYTES;
    int64_t tchunk = (int64_t)(TOKEN_BUDGET_BYTES / in->xq_stride) / TILE_T * TILE_T;
    if (tchunk < TILE_T) tchunk = TILE_T;
    for (int64_t c0 = 0; c0 < in->n_tok; c0 += tchunk) {
        int64_t c1 = c0 + tchunk < in->n_tok ? c0 + tchunk : in->n_tok;
        for (int64_t p = r0; p < r1; p += PANEL_ROWS) {
            int64_t rp = r1 - p < PANEL_ROWS ? r1 - p : PANEL_ROWS;
            for (int64_t i = 0; i < rp; i++)
                unpack_row(w->type, (const uint8_t *)w->data + (size_t)(p + i) * w->row_bytes, nb,
                           panel + (size_t)i * prow);
            const int64_t n_whole = (c1 - c0) / TILE_T, t_tail = c0 + n_whole * TILE_T;
            for (int64_t i = 0; i < rp; i += TILE_R) {
                int rr = (int)(rp - i < TILE_R ? rp - i : TILE_R);
                struct qtile a = {panel + (size_t)i * prow, prow,
                                  in->xq + (size_t)c0 * in->xq_stride, in->xq_stride, ng,
                                  type_kshift(w->type, wt.bias), wt.bias, wt.has_min,
                                  y + c0 * w->n_out + p + i, w->n_out};
                tile_q_rows(rr, &a, n_whole);
                if (t_tail < c1) {
                    a.x = in->xq + (size_t)t_tail * in->xq_stride;
                    a.y = y + t_tail * w->n_out + p + i;
                    tile_q_any(rr, (int)(c1 - t_tail), &a);
                }
            }
        }
    }
}

/* Few tokens (decode): each weight group is unpacked in registers and used
 * at once, for up to FUSED_T tokens, with no trip through memory. Same
 * arithmetic per output element as the panel path. */
#define FUSED_T 3
/* How far ahead the fused path prefetches weights (bytes). 4-16 KiB measured
 * the same on the 2-core test machine (about 10 GB/s per core from memory);
 * none or 2 KiB lost a quarter of that. -D to tune elsewhere. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 8192
#endif

static inline __attribute__((always_inline)) void fused_rows_t(const enum ggml_type type, const int T,
                                                               const struct mm_weight *w,
                                                               const struct mm_input *in,
                                                               int64_t t0, float *y, int64_t r0,
                                                               int64_t r1, void *scratch)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    int64_t nb = in->n_in / 32, ng = n_groups(in->n_in);
    const size_t xs_off = (size_t)ng * GROUP_BYTES_Q, sxs_off = xs_off + (size_t)ng * 64,
                 sx_off = sxs_off + (size_t)ng * 64;
    const uint8_t *x0 = in->xq + (size_t)t0 * in->xq_stride;
    /* The integer start values depend on the token only: computed once. */
    __m512i *start = scratch;
    const __m512i kneg = type_kneg(type, wt.bias);
    for (int t = 0; t < T; t++)
        for (int64_t g = 0; g < ng; g++)
            start[t * ng + g] = wt.bias ? _mm512_mullo_epi32(_mm512_load_si512(x0 + t * in->xq_stride + sx_off + 64 * g), kneg)
                                        : _mm512_setzero_si512();
    const uint8_t *end = (const uint8_t *)w->data + (size_t)r1 * w->row_bytes;
    /* The first rows too: the hardware prefetcher needs a while to notice. */
    for (const uint8_t *p = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
         p < end && p < (const uint8_t *)w->data + (size_t)r0 * w->row_bytes + PREFETCH_BYTES; p += 64)
        _mm_prefetch((const char *)p, _MM_HINT_T0);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        /* Weights are read once: ask for them well ahead so that the memory
         * stream never waits on the arithmetic. */
        if (r + 1 < r1 && row + w->row_bytes + PREFETCH_BYTES < end)
            for (size_t o = 0; o < w->row_bytes; o += 64)
                _mm_prefetch((const char *)row + PREFETCH_BYTES + o, _MM_HINT_T0);
        __m512 facc[FUSED_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[t] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            __m512i st[4];
            __m512 dw, mw;
            wgroup_any(type, group_src(row, k_quant, wt.block_bytes, g),
                       k_quant ? 8 : group_blocks(nb, g), st, &dw, &mw);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const uint8_t *xt = x0 + t * in->xq_stride;
                __m512i acc = start[t * ng + g];
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++)
                    acc = _mm512_dpbusd_epi32(acc, st[s],
                                              _mm512_load_si512(xt + g * GROUP_BYTES_Q + 64 * s));
                __m512 sxs = wt.has_min ? _mm512_load_ps(xt + sxs_off + 64 * g) : _mm512_setzero_ps();
                facc[t] = group_fma(facc[t], acc, dw, _mm512_load_ps(xt + xs_off + 64 * g),
                                    wt.has_min, mw, sxs);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[(t0 + t) * w->n_out + r] = reduce16(facc[t]);
    }
}

#define FUSED_TYPE(T_)                                                                     \
    switch (w->type) {                                                                     \
    case GGML_TYPE_Q4_0: fused_rows_t(GGML_TYPE_Q4_0, T_, w, in, t0, y, r0, r1, scratch); break;    \
    case GGML_TYPE_Q4_1: fused_rows_t(GGML_TYPE_Q4_1, T_, w, in, t0, y, r0, r1, scratch); break;    \
    case GGML_TYPE_Q5_0: fused_rows_t(GGML_TYPE_Q5_0, T_, w, in, t0, y, r0, r1, scratch); break;    \
    case GGML_TYPE_Q5_1: fused_rows_t(GGML_TYPE_Q5_1, T_, w, in, t0, y, r0, r1, scratch); break;    \
    case GGML_TYPE_Q8_0: fused_rows_t(GGML_TYPE_Q8_0, T_, w, in, t0, y, r0, r1, scratch); break;    \
    case GGML_TYPE_Q4_K: fused_rows_t(GGML_TYPE_Q4_K, T_, w, in, t0, y, r0, r1, scratch); break;    \
    case GGML_TYPE_Q6_K: fused_rows_t(GGML_TYPE_Q6_K, T_, w, in, t0, y, r0, r1, scratch); break;    \
    default: break;                                                                        \
    }

static void rows_fused(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0,
                       int64_t r1, void *scratch)
{
    for (int64_t t0 = 0; t0 < in->n_tok; t0 += FUSED_T) {
        int64_t tt = in->n_tok - t0 < FUSED_T ? in->n_tok - t0 : FUSED_T;
        if (tt == 1) FUSED_TYPE(1)
        else if (tt == 2) FUSED_TYPE(2)
        else FUSED_TYPE(3)
    }
}

/* ---- float weights ------------------------------------------------------------------ */

#define FTILE_R 4
#define FTILE_T 4

static inline __m512 load_w16(enum ggml_type type, const uint8_t *row, int64_t k, __mmask16 m)
{
    switch (type) {
    case GGML_TYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
    case GGML_TYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * k)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, row + 4 * k);
    }
}

struct ftile {
    enum ggml_type type;
    const uint8_t *w;
    size_t w_stride;
    const float *x;
    int64_t x_stride;
    int64_t n_in;
    float *y;
    int64_t ldy;
};

static inline __attribute__((always_inline)) void tile_f(const int R, const int T,
                                                         const struct ftile *a)
{
    __m512 facc[FTILE_R][FTILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < a->n_in; k += 16) {
        /* The input copy is zero-padded to 16; only the weights need a mask. */
        __mmask16 m = a->n_in - k >= 16 ? (__mmask16)0xFFFF
                                        : (__mmask16)((1u << (a->n_in - k)) - 1);
        __m512 wv[FTILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = load_w16(a->type, a->w + r * a->w_stride, k, m);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_load_ps(a->x + t * a->x_stride + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) facc[r][t] = _mm512_fmadd_ps(wv[r], xv, facc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[t * a->ldy + r] = reduce16(facc[r][t]);
}

#define FCASE(R_, T_) \
    case (R_) * 8 + (T_): tile_f(R_, T_, a); break;

static void tile_f_any(int R, int T, const struct ftile *a)
{
    switch (R * 8 + T) {
        FCASE(1, 1) FCASE(1, 2) FCASE(1, 3) FCASE(1, 4)
        FCASE(2, 1) FCASE(2, 2) FCASE(2, 3) FCASE(2, 4)
        FCASE(3, 1) FCASE(3, 2) FCASE(3, 3) FCASE(3, 4)
        FCASE(4, 1) FCASE(4, 2) FCASE(4, 3) FCASE(4, 4)
    default: break;
    }
}

static void rows_float(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0,
                       int64_t r1)
{
    for (int64_t r = r0; r < r1; r += FTILE_R) {
        int rr = (int)(r1 - r < FTILE_R ? r1 - r : FTILE_R);
        for (int64_t t0 = 0; t0 < in->n_tok; t0 += FTILE_T) {
            int tt = (int)(in->n_tok - t0 < FTILE_T ? in->n_tok - t0 : FTILE_T);
            struct ftile a = {w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                              w->row_bytes, in->xf + t0 * in->xf_stride, in->xf_stride, in->n_in,
                              y + t0 * w->n_out + r, w->n_out};
            tile_f_any(rr, tt, &a);
        }
    }
}

/* ---- table ----------------------------------------------------------------------------- */

static size_t scratch_bytes(const struct mm_weight *w, int64_t n_tok)
{
    if (!mm_type_is_quantized(w->type)) return 0;
    if (n_tok <= FUSED_T) return (size_t)FUSED_T * (size_t)n_groups(w->n_in) * sizeof(__m512i);
    return (size_t)PANEL_ROWS * (size_t)n_groups(w->n_in) * WGROUP_BYTES;
}

static void rows(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0,
                 int64_t r1, void *scratch)
{
    if (!mm_type_is_quantized(w->type)) rows_float(w, in, y, r0, r1);
    else if (in->n_tok <= FUSED_T) rows_fused(w, in, y, r0, r1, scratch);
    else rows_panel(w, in, y, r0, r1, scratch);
}

const struct mm_kernels mm_kernels_avx512 = {"avx512", act_bytes, quantize, scratch_bytes, rows};
