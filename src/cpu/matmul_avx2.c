/* matmul_avx2.c — matrix products with AVX2, FMA and F16C.
 *
 * Entered only after matmul.c checked the CPU. Same plan as the AVX-512 path
 * (see the comment at the top of matmul_avx512.c), at half the width:
 *
 * A "group" is 4 blocks of 32 (128 elements); its 8 int32 lanes each own one
 * half-block: lane L holds block L&3, half L>>2. Input and weights are
 * rearranged into 4 "steps" of 32 bytes in which lane L carries 4 consecutive
 * bytes of its half-block. AVX2 has no vpdpbusd: pmaddubsw (u8 x s8 -> pairs
 * of int16) then pmaddwd with ones gives the same per-lane sums, and for small
 * weight values several steps are summed in int16 first:
 *   2- to 5-bit values (<= 31: Q4_x, Q5_x, Q2_K..Q5_K): 4 steps,
 *   |sum| <= 4*2*31*127 < 32768;
 *   Q6_K (values <= 63): 2 steps at a time;
 *   Q8_0 and the IQ4 types (int8 grid values): pmaddubsw needs one unsigned
 *   side, so |w| x sign(x, w), one step at a time (|pair| <= 2*128*127).
 * The K-quants and IQ4_XS (256-element super-blocks) fill a group with half
 * a super-block; their 16-element scales and mins (Q2_K, Q3_K, Q6_K) fit
 * the half-block lanes as they are.
 * Then per group and (row, token): facc += float(isum) * (dw * dx) [+ mw * dx*sum].
 *
 * Determinism: each output element runs the same float operations in the
 * same order (groups 0..ng-1, one fixed 8-lane reduction) in every kernel
 * shape, for any batch and thread split. */
#include <immintrin.h>
#include <string.h>

#include "cpu/matmul_impl.h"
#include "model/quant_blocks.h"

#define GROUP_BLOCKS 4
#define GROUP_BYTES_Q 128 /* 4 steps x 32 bytes */
#define WGROUP_BYTES 192  /* weight group: steps, dw[8], mw[8] */
#define PANEL_ROWS 16
#define TILE_R 2
#define TILE_T 3
#define FUSED_T 3
#define PREFETCH_BYTES 8192 /* see matmul_avx512.c */
#define TOKEN_BUDGET_BYTES (512 * 1024)

static int64_t n_groups(int64_t n_in) { return (n_in / 32 + GROUP_BLOCKS - 1) / GROUP_BLOCKS; }

/* ---- the input: per token, over groups g: q[g][4][32] i8 | xs[g][8] f32 |
 * sxs[g][8] f32 | sx[g][8] i32 (see matmul_avx512.c) -------------------- */

static size_t act_bytes(int64_t n_in) { return ((size_t)n_groups(n_in) * (GROUP_BYTES_Q + 3 * 32) + 63) & ~(size_t)63; }

/* In-lane 4x4 transpose of dwords: step s, lane 4k+j = dword s of 128-bit
 * lane k of y[j] (y[j] = natural block j: half 0 | half 1). */
static inline void to_steps(const __m256i y[4], __m256i st[4])
{
    __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]);
    __m256i t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]);
    __m256i t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    st[0] = _mm256_unpacklo_epi64(t0, t2);
    st[1] = _mm256_unpackhi_epi64(t0, t2);
    st[2] = _mm256_unpacklo_epi64(t1, t3);
    st[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* Per-lane int32 sums of 4-byte groups of signed bytes. */
static inline __m256i lane_sum_s8(__m256i v)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
}

static void quantize(const float *x, int64_t n_in, unsigned forms, void *dst)
{
    (void)forms; /* one form */
    int64_t nb = n_in / 32, ng = n_groups(n_in);
    uint8_t *q = dst;
    float *xs = (float *)(q + ng * GROUP_BYTES_Q);
    float *sxs = xs + ng * 8;
    int32_t *sx = (int32_t *)(sxs + ng * 8);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t g = 0; g < ng; g++) {
        __m256i nat[GROUP_BLOCKS];
        float d4[GROUP_BLOCKS];
#pragma GCC unroll 8
        for (int b = 0; b < GROUP_BLOCKS; b++) {
            int64_t blk = g * GROUP_BLOCKS + b;
            if (blk >= nb) {
                nat[b] = _mm256_setzero_si256();
                d4[b] = 0.0f;
                continue;
            }
            __m256 v[4], m = _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(x + 32 * blk + 8 * i);
                m = _mm256_max_ps(m, _mm256_and_ps(v[i], nosign));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            /* Same formula and rounding as the scalar path (matmul_scalar.c). */
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            __m256 vid = _mm256_set1_ps(id);
            __m256i iv[4];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++)
                iv[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], vid), lo), hi));
            __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]), p23 = _mm256_packs_epi32(iv[2], iv[3]);
            nat[b] = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), order);
            d4[b] = d;
        }
        __m256i st[4];
        to_steps(nat, st);
        __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            _mm256_store_si256((__m256i *)(q + g * GROUP_BYTES_Q + 32 * k), st[k]);
            s = _mm256_add_epi32(s, lane_sum_s8(st[k]));
        }
        __m128 d4v = _mm_loadu_ps(d4);
        __m256 xsv = _mm256_set_m128(d4v, d4v);
        _mm256_store_ps(xs + 8 * g, xsv);
        _mm256_store_ps(sxs + 8 * g, _mm256_mul_ps(xsv, _mm256_cvtepi32_ps(s)));
        _mm256_store_si256((__m256i *)(sx + 8 * g), s);
    }
}

/* One f16 via F16C: an out-of-line call here would save and restore the
 * vector registers around it. */
static inline float half_at(const uint8_t *p) { return _cvtsh_ss(qb_u16(p)); }

/* ---- weights: one group of one row -> steps + dw[8] + mw[8] ---------------- */

enum kclass { K_NIB, K_Q6, K_Q8 }; /* how the integer kernel sums steps (see top) */

struct wtype {
    int block_bytes; /* bytes per 32-block (K-quants: per 256) */
    int bias;        /* offset that made values unsigned (0: none, or a min) */
    int has_min;
    enum kclass kc;
};

static struct wtype wtype_of(enum ggml_type t)
{
    switch (t) {
    case GGML_TYPE_Q4_0: return (struct wtype){18, 8, 0, K_NIB};
    case GGML_TYPE_Q4_1: return (struct wtype){20, 0, 1, K_NIB};
    case GGML_TYPE_Q5_0: return (struct wtype){22, 16, 0, K_NIB};
    case GGML_TYPE_Q5_1: return (struct wtype){24, 0, 1, K_NIB};
    case GGML_TYPE_Q8_0: return (struct wtype){34, 0, 0, K_Q8};
    case GGML_TYPE_Q4_K: return (struct wtype){144, 0, 1, K_NIB};
    case GGML_TYPE_Q6_K: return (struct wtype){210, 32, 0, K_Q6};
    case GGML_TYPE_Q2_K: return (struct wtype){84, 0, 1, K_NIB};
    case GGML_TYPE_Q3_K: return (struct wtype){110, 4, 0, K_NIB};
    case GGML_TYPE_Q5_K: return (struct wtype){176, 0, 1, K_NIB};
    case GGML_TYPE_IQ4_NL: return (struct wtype){18, 0, 0, K_Q8};
    case GGML_TYPE_IQ4_XS: return (struct wtype){136, 0, 0, K_Q8};
    default: return (struct wtype){0, 0, 0, K_NIB};
    }
}

/* Types whose blocks are 256-element super-blocks: a group is half of one. */
static inline int type_super(enum ggml_type t)
{
    return t == GGML_TYPE_Q2_K || t == GGML_TYPE_Q3_K || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ||
           t == GGML_TYPE_Q6_K || t == GGML_TYPE_IQ4_XS;
}

/* 16 nibble bytes -> their 32 int8 values in the IQ4 grid: low nibbles
 * (elements 0..15) | high (16..31). */
static inline __m256i iq4_values32(const uint8_t *qs)
{
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_setr_epi8(QB_IQ4_GRID));
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_shuffle_epi8(grid, _mm256_and_si256(v, _mm256_set1_epi8(0x0F)));
}

/* The 32 2-bit fields 2j, 2j+1 of 32 bytes (Q2_K / Q3_K quarter j). */
static inline __m256i crumbs(__m256i q, int j)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    switch (j) {
    case 0: return _mm256_and_si256(q, m3);
    case 1: return _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
    case 2: return _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
    default: return _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
    }
}

/* f16 scale (and the f16 after it) of 4 blocks of `bs` bytes, per lane. */
static inline void scales_per_lane(const uint8_t *src, int bs, __m256 *d, __m256 *m)
{
    __m128i dm =
        _mm_setr_epi32((int)qb_u32(src), (int)qb_u32(src + bs), (int)qb_u32(src + 2 * bs), (int)qb_u32(src + 3 * bs));
    __m256 f = _mm256_cvtph_ps(dm); /* d0 m0 d1 m1 d2 m2 d3 m3 */
    *d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    if (m) *m = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7));
}

/* 16 nibble bytes -> 32 values: low nibbles (elements 0..15) | high (16..31). */
static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0x10 where the bit is set. */
static inline __m256i bits_to_16(uint32_t bits)
{
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* One group (4 blocks; K-quants: half `half` of a super-block) into steps and
 * per-lane scales, in registers. */
static inline __attribute__((always_inline)) void wgroup(enum ggml_type type, const uint8_t *src, int half,
                                                         __m256i st[4], __m256 *dw, __m256 *mw)
{
    __m256i y[4];
    *mw = _mm256_setzero_ps();
    switch (type) {
    case GGML_TYPE_Q4_0:
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = nibbles32(src + 18 * j + 2);
        scales_per_lane(src, 18, dw, NULL);
        break;
    case GGML_TYPE_Q4_1:
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = nibbles32(src + 20 * j + 4);
        scales_per_lane(src, 20, dw, mw);
        break;
    case GGML_TYPE_Q5_0:
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++)
            y[j] = _mm256_or_si256(nibbles32(src + 22 * j + 6), bits_to_16(qb_u32(src + 22 * j + 2)));
        scales_per_lane(src, 22, dw, NULL);
        break;
    case GGML_TYPE_Q5_1:
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++)
            y[j] = _mm256_or_si256(nibbles32(src + 24 * j + 8), bits_to_16(qb_u32(src + 24 * j + 4)));
        scales_per_lane(src, 24, dw, mw);
        break;
    case GGML_TYPE_Q8_0:
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = _mm256_loadu_si256((const __m256i *)(src + 34 * j + 2));
        scales_per_lane(src, 34, dw, NULL);
        break;
    case GGML_TYPE_Q4_K: {
        /* Sub-blocks 4h..4h+3: chunks 2h, 2h+1 of qs, low then high nibbles. */
        const __m256i m4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8
        for (int c = 0; c < 2; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(src + 16 + 32 * (2 * half + c)));
            y[2 * c] = _mm256_and_si256(v, m4);
            y[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        float d = half_at(src), dmin = half_at(src + 2);
        float ds[8], ms[8];
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            uint8_t sc, mn;
            qb_q4k_scale_min(4 * half + j, src + 4, &sc, &mn);
            ds[j] = ds[j + 4] = d * (float)sc;
            ms[j] = ms[j + 4] = -(dmin * (float)mn);
        }
        *dw = _mm256_loadu_ps(ds);
        *mw = _mm256_loadu_ps(ms);
        break;
    }
    case GGML_TYPE_Q6_K: {
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + 64 * half));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + 64 * half + 32));
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + 128 + 32 * half));
        y[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
        y[1] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
        y[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(h, m30));
        y[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        /* lane L: sub-block 2 * (4h + (L & 3)) + (L >> 2) of 16 */
        const int8_t *sc = (const int8_t *)(src + 192) + 8 * half;
        __m256 s = _mm256_setr_ps(sc[0], sc[2], sc[4], sc[6], sc[1], sc[3], sc[5], sc[7]);
        *dw = _mm256_mul_ps(_mm256_set1_ps(half_at(src + 208)), s);
        break;
    }
    case GGML_TYPE_Q5_K: {
        /* Q4_K's nibbles; the fifth bit of sub-block s is bit s of qh[l]:
         * this half's bits 4h..4h+3 brought down to 0..3 first, then bit j
         * shifted up to bit 4 (16-bit shifts: a byte's bits never cross
         * into what the mask keeps). */
        const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(src + 16));
        if (half) qh = _mm256_srli_epi16(qh, 4);
        const __m256i h[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 3), _mm256_slli_epi16(qh, 2),
                              _mm256_slli_epi16(qh, 1)};
#pragma GCC unroll 8
        for (int c = 0; c < 2; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(src + 48 + 32 * (2 * half + c)));
            y[2 * c] = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(h[2 * c], b4));
            y[2 * c + 1] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(h[2 * c + 1], b4));
        }
        float d = half_at(src), dmin = half_at(src + 2);
        float ds[8], ms[8];
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            uint8_t sc, mn;
            qb_q4k_scale_min(4 * half + j, src + 4, &sc, &mn);
            ds[j] = ds[j + 4] = d * (float)sc;
            ms[j] = ms[j + 4] = -(dmin * (float)mn);
        }
        *dw = _mm256_loadu_ps(ds);
        *mw = _mm256_loadu_ps(ms);
        break;
    }
    case GGML_TYPE_Q3_K: {
        /* value + 4 = 2-bit field | hmask bit << 2: unsigned 0..7, bias 4 */
        const __m256i b2 = _mm256_set1_epi8(0x04);
        __m256i q = _mm256_loadu_si256((const __m256i *)(src + 32 + 32 * half));
        __m256i hm = _mm256_loadu_si256((const __m256i *)src);
        if (half) hm = _mm256_srli_epi16(hm, 4);
        const __m256i h[4] = {_mm256_slli_epi16(hm, 2), _mm256_slli_epi16(hm, 1), hm, _mm256_srli_epi16(hm, 1)};
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = _mm256_or_si256(crumbs(q, j), _mm256_and_si256(h[j], b2));
        int8_t sc[8]; /* lane L: 16-element sub-block 2 * (4h + (L & 3)) + (L >> 2) */
#pragma GCC unroll 8
        for (int L = 0; L < 8; L++) sc[L] = (int8_t)qb_q3k_scale(src + 96, 8 * half + 2 * (L & 3) + (L >> 2));
        __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc)));
        *dw = _mm256_mul_ps(_mm256_set1_ps(half_at(src + 108)), s);
        break;
    }
    case GGML_TYPE_Q2_K: {
        __m256i q = _mm256_loadu_si256((const __m256i *)(src + 16 + 32 * half));
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = crumbs(q, j);
        /* lane L: scales byte 8h + 2 * (L & 3) + (L >> 2); scale low nibble, min high */
        const uint8_t *sb = src + 8 * half;
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sb));
        v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
        __m256 mn = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
        *dw = _mm256_mul_ps(_mm256_set1_ps(half_at(src + 80)), sc);
        *mw =
            _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(half_at(src + 82)), mn), _mm256_set1_ps(-0.0f)); /* -(dmin*m) */
        break;
    }
    case GGML_TYPE_IQ4_NL:
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = iq4_values32(src + 18 * j + 2);
        scales_per_lane(src, 18, dw, NULL);
        break;
    case GGML_TYPE_IQ4_XS: {
        float d = half_at(src), ds[8];
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            y[j] = iq4_values32(src + 8 + 16 * (4 * half + j));
            ds[j] = ds[j + 4] = d * (float)qb_iq4xs_scale(src, 4 * half + j);
        }
        *dw = _mm256_loadu_ps(ds);
        break;
    }
    default: /* unreachable: callers dispatch on supported types */
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) y[j] = _mm256_setzero_si256();
        *dw = _mm256_setzero_ps();
        break;
    }
    to_steps(y, st);
}

/* Where group g of a row starts, and which half of its super-block it is. */
static inline const uint8_t *group_src(const uint8_t *row, enum ggml_type type, int bs, int64_t g, int *half)
{
    if (type_super(type)) {
        *half = (int)(g & 1);
        return row + (size_t)(g / 2) * (size_t)bs;
    }
    *half = 0;
    return row + (size_t)g * GROUP_BLOCKS * (size_t)bs;
}

/* Group g of a row, with a last partial group of 32-blocks copied into a
 * zeroed buffer first (zero scales: its padding lanes add exactly nothing). */
static inline __attribute__((always_inline)) void wgroup_row(enum ggml_type type, const uint8_t *row, int64_t nb,
                                                             int64_t g, __m256i st[4], __m256 *dw, __m256 *mw)
{
    struct wtype wt = wtype_of(type);
    int half;
    const uint8_t *src = group_src(row, type, wt.block_bytes, g, &half);
    int64_t nblk = nb - g * GROUP_BLOCKS;
    if (wt.block_bytes > 34 || nblk >= GROUP_BLOCKS) {
        wgroup(type, src, half, st, dw, mw);
        return;
    }
    uint8_t tmp[GROUP_BLOCKS * 34];
    memset(tmp, 0, sizeof tmp);
    memcpy(tmp, src, (size_t)(nblk * wt.block_bytes));
    wgroup(type, tmp, 0, st, dw, mw);
}

static inline __attribute__((always_inline)) void unpack_row_t(enum ggml_type type, const uint8_t *row, int64_t nb,
                                                               uint8_t *out)
{
    int64_t ng = n_groups(nb * 32);
    for (int64_t g = 0; g < ng; g++) {
        __m256i st[4];
        __m256 dw, mw;
        wgroup_row(type, row, nb, g, st, &dw, &mw);
        uint8_t *o = out + g * WGROUP_BYTES;
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) _mm256_store_si256((__m256i *)(o + 32 * k), st[k]);
        _mm256_store_ps((float *)(o + 128), dw);
        _mm256_store_ps((float *)(o + 160), mw);
    }
}

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
    case GGML_TYPE_Q2_K: unpack_row_t(GGML_TYPE_Q2_K, row, nb, out); break;
    case GGML_TYPE_Q3_K: unpack_row_t(GGML_TYPE_Q3_K, row, nb, out); break;
    case GGML_TYPE_Q5_K: unpack_row_t(GGML_TYPE_Q5_K, row, nb, out); break;
    case GGML_TYPE_IQ4_NL: unpack_row_t(GGML_TYPE_IQ4_NL, row, nb, out); break;
    case GGML_TYPE_IQ4_XS: unpack_row_t(GGML_TYPE_IQ4_XS, row, nb, out); break;
    default: break;
    }
}

/* ---- the integer and float steps shared by all kernels ------------------------- */

/* The integer dot product of one group: weights w[4] (as unpacked), input
 * x[4], plus the start value. Exact, so any summation order is the same. */
static inline __attribute__((always_inline)) __m256i group_isum(enum kclass kc, const __m256i w[4], const __m256i aw[4],
                                                                const __m256i x[4], __m256i start)
{
    const __m256i ones = _mm256_set1_epi16(1);
    switch (kc) {
    case K_NIB: {
        __m256i p =
            _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w[0], x[0]), _mm256_maddubs_epi16(w[1], x[1])),
                             _mm256_add_epi16(_mm256_maddubs_epi16(w[2], x[2]), _mm256_maddubs_epi16(w[3], x[3])));
        return _mm256_add_epi32(start, _mm256_madd_epi16(p, ones));
    }
    case K_Q6: {
        __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], x[0]), _mm256_maddubs_epi16(w[1], x[1]));
        __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], x[2]), _mm256_maddubs_epi16(w[3], x[3]));
        return _mm256_add_epi32(start, _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
    }
    default: { /* K_Q8: |w| x sign(x, w) */ __m256i acc = start;
#pragma GCC unroll 8
        for (int s = 0; s < 4; s++)
            acc = _mm256_add_epi32(acc,
                                   _mm256_madd_epi16(_mm256_maddubs_epi16(aw[s], _mm256_sign_epi8(x[s], w[s])), ones));
        return acc;
    }
    }
}

static inline __attribute__((always_inline)) __m256 group_fma(__m256 facc, __m256i isum, __m256 dw, __m256 xs,
                                                              int has_min, __m256 mw, __m256 sxs)
{
    facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, xs), facc);
    if (has_min) facc = _mm256_fmadd_ps(mw, sxs, facc);
    return facc;
}

/* The one 8-lane reduction every output element goes through. */
static inline float reduce8(__m256 v)
{
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* ---- panel path: many tokens ------------------------------------------------------ */

struct qtile {
    const uint8_t *w; /* first panel row */
    size_t w_stride;  /* bytes per panel row */
    const uint8_t *x; /* first token */
    size_t x_stride;  /* bytes per token */
    int64_t ng;
    float *y; /* y[t * ldy + r] */
    int64_t ldy;
};

static inline __attribute__((always_inline)) void tile_q(const enum ggml_type type, const int R, const int T,
                                                         const struct qtile *a)
{
    struct wtype wt = wtype_of(type);
    const int64_t ng = a->ng;
    const size_t xs_off = (size_t)ng * GROUP_BYTES_Q, sxs_off = xs_off + (size_t)ng * 32,
                 sx_off = sxs_off + (size_t)ng * 32;
    const __m256i kneg = _mm256_set1_epi32(-wt.bias);
    __m256 facc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = a->w + g * WGROUP_BYTES;
        __m256i wv[TILE_R][4], aw[TILE_R][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                wv[r][s] = _mm256_load_si256((const __m256i *)(wg + r * a->w_stride + 32 * s));
                aw[r][s] = wt.kc == K_Q8 ? _mm256_sign_epi8(wv[r][s], wv[r][s]) : wv[r][s];
            }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = a->x + t * a->x_stride;
            __m256i xv[4];
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) xv[s] = _mm256_load_si256((const __m256i *)(xt + g * GROUP_BYTES_Q + 32 * s));
            __m256i start = _mm256_setzero_si256();
            if (wt.bias) start = _mm256_mullo_epi32(_mm256_load_si256((const __m256i *)(xt + sx_off + 32 * g)), kneg);
            __m256 xs = _mm256_load_ps((const float *)(xt + xs_off + 32 * g));
            __m256 sxs = wt.has_min ? _mm256_load_ps((const float *)(xt + sxs_off + 32 * g)) : _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *wr = wg + r * a->w_stride;
                __m256i isum = group_isum(wt.kc, wv[r], aw[r], xv, start);
                facc[r][t] = group_fma(facc[r][t], isum, _mm256_load_ps((const float *)(wr + 128)), xs, wt.has_min,
                                       _mm256_load_ps((const float *)(wr + 160)), sxs);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[t * a->ldy + r] = reduce8(facc[r][t]);
}

/* clang-format off */ /* tables of cases */
#define QCASE(TY, R_, T_) \
    case (R_) * 8 + (T_): tile_q(TY, R_, T_, a); break;
#define QTILES(TY)                                                         \
    switch (R * 8 + T) {                                                   \
        QCASE(TY, 1, 1) QCASE(TY, 1, 2) QCASE(TY, 1, 3)                    \
        QCASE(TY, 2, 1) QCASE(TY, 2, 2) QCASE(TY, 2, 3)                    \
    default: break;                                                        \
    }
/* clang-format on */

/* Per kernel class, since the integer step differs; the type only matters
 * for bias and min, which the class functions read from wtype_of(). */
static void tile_nib_bias8(int R, int T, const struct qtile *a) { QTILES(GGML_TYPE_Q4_0) }
static void tile_nib_bias16(int R, int T, const struct qtile *a) { QTILES(GGML_TYPE_Q5_0) }
static void tile_nib_bias4(int R, int T, const struct qtile *a) { QTILES(GGML_TYPE_Q3_K) }
static void tile_nib_min(int R, int T, const struct qtile *a) { QTILES(GGML_TYPE_Q4_1) }
static void tile_q6(int R, int T, const struct qtile *a) { QTILES(GGML_TYPE_Q6_K) }
static void tile_q8(int R, int T, const struct qtile *a) { QTILES(GGML_TYPE_Q8_0) }

static void tile_q_any(enum ggml_type type, int R, int T, const struct qtile *a)
{
    switch (type) {
    case GGML_TYPE_Q4_0: tile_nib_bias8(R, T, a); break;
    case GGML_TYPE_Q5_0: tile_nib_bias16(R, T, a); break;
    case GGML_TYPE_Q3_K: tile_nib_bias4(R, T, a); break;
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: tile_nib_min(R, T, a); break;
    case GGML_TYPE_Q6_K: tile_q6(R, T, a); break;
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS: tile_q8(R, T, a); break;
    default: break;
    }
}

static void rows_panel(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                       uint8_t *panel)
{
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
            for (int64_t t0 = c0; t0 < c1; t0 += TILE_T) {
                int tt = (int)(c1 - t0 < TILE_T ? c1 - t0 : TILE_T);
                for (int64_t i = 0; i < rp; i += TILE_R) {
                    int rr = (int)(rp - i < TILE_R ? rp - i : TILE_R);
                    struct qtile a = {
                        panel + (size_t)i * prow,  prow,    in->xq + (size_t)t0 * in->xq_stride, in->xq_stride, ng,
                        y + t0 * w->n_out + p + i, w->n_out};
                    tile_q_any(w->type, rr, tt, &a);
                }
            }
        }
    }
}

/* ---- fused path: few tokens (decode), weights unpacked in registers ------------- */

static inline __attribute__((always_inline)) void fused_rows_t(const enum ggml_type type, const int T,
                                                               const struct mm_weight *w, const struct mm_input *in,
                                                               int64_t t0, float *y, int64_t r0, int64_t r1,
                                                               void *scratch)
{
    struct wtype wt = wtype_of(type);
    int64_t nb = in->n_in / 32, ng = n_groups(in->n_in);
    const size_t xs_off = (size_t)ng * GROUP_BYTES_Q, sxs_off = xs_off + (size_t)ng * 32,
                 sx_off = sxs_off + (size_t)ng * 32;
    const uint8_t *x0 = in->xq + (size_t)t0 * in->xq_stride;
    /* The integer start values depend on the token only: computed once. */
    __m256i *start = scratch;
    const __m256i kneg = _mm256_set1_epi32(-wt.bias);
    for (int t = 0; t < T; t++)
        for (int64_t g = 0; g < ng; g++)
            start[t * ng + g] =
                wt.bias ? _mm256_mullo_epi32(
                              _mm256_load_si256((const __m256i *)(x0 + t * in->xq_stride + sx_off + 32 * g)), kneg)
                        : _mm256_setzero_si256();
    const uint8_t *end = (const uint8_t *)w->data + (size_t)r1 * w->row_bytes;
    for (const uint8_t *p = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
         p < end && p < (const uint8_t *)w->data + (size_t)r0 * w->row_bytes + PREFETCH_BYTES; p += 64)
        _mm_prefetch((const char *)p, _MM_HINT_T0);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        if (r + 1 < r1 && row + w->row_bytes + PREFETCH_BYTES < end) /* see matmul_avx512.c */
            for (size_t o = 0; o < w->row_bytes; o += 64)
                _mm_prefetch((const char *)row + PREFETCH_BYTES + o, _MM_HINT_T0);
        __m256 facc[FUSED_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[t] = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            __m256i st[4], aw[4];
            __m256 dw, mw;
            wgroup_row(type, row, nb, g, st, &dw, &mw);
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) aw[s] = wt.kc == K_Q8 ? _mm256_sign_epi8(st[s], st[s]) : st[s];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const uint8_t *xt = x0 + t * in->xq_stride;
                __m256i xv[4];
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++)
                    xv[s] = _mm256_load_si256((const __m256i *)(xt + g * GROUP_BYTES_Q + 32 * s));
                __m256 sxs = wt.has_min ? _mm256_load_ps((const float *)(xt + sxs_off + 32 * g)) : _mm256_setzero_ps();
                facc[t] = group_fma(facc[t], group_isum(wt.kc, st, aw, xv, start[t * ng + g]), dw,
                                    _mm256_load_ps((const float *)(xt + xs_off + 32 * g)), wt.has_min, mw, sxs);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[(t0 + t) * w->n_out + r] = reduce8(facc[t]);
    }
}

#define FUSED_TYPE(T_)                                                                                                 \
    switch (w->type) {                                                                                                 \
    case GGML_TYPE_Q4_0: fused_rows_t(GGML_TYPE_Q4_0, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q4_1: fused_rows_t(GGML_TYPE_Q4_1, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q5_0: fused_rows_t(GGML_TYPE_Q5_0, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q5_1: fused_rows_t(GGML_TYPE_Q5_1, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q8_0: fused_rows_t(GGML_TYPE_Q8_0, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q4_K: fused_rows_t(GGML_TYPE_Q4_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q6_K: fused_rows_t(GGML_TYPE_Q6_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q2_K: fused_rows_t(GGML_TYPE_Q2_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q3_K: fused_rows_t(GGML_TYPE_Q3_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q5_K: fused_rows_t(GGML_TYPE_Q5_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_IQ4_NL: fused_rows_t(GGML_TYPE_IQ4_NL, T_, w, in, t0, y, r0, r1, scratch); break;                   \
    case GGML_TYPE_IQ4_XS: fused_rows_t(GGML_TYPE_IQ4_XS, T_, w, in, t0, y, r0, r1, scratch); break;                   \
    default: break;                                                                                                    \
    }

static void rows_fused(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                       void *scratch)
{
    for (int64_t t0 = 0; t0 < in->n_tok; t0 += FUSED_T) {
        int64_t tt = in->n_tok - t0 < FUSED_T ? in->n_tok - t0 : FUSED_T;
        if (tt == 1) FUSED_TYPE(1)
        else if (tt == 2) FUSED_TYPE(2)
        else FUSED_TYPE(3)
    }
}

/* ---- float weights ------------------------------------------------------------------ */

#define FTILE_R 3
#define FTILE_T 3

/* 8 weights from k on, converted to f32; past n_in they read as zero. */
static inline __m256 load_w8(enum ggml_type type, const uint8_t *row, int64_t k, int64_t n_in)
{
    int64_t left = n_in - k;
    size_t es = type == GGML_TYPE_F32 ? 4 : 2;
    uint8_t tmp[32];
    const uint8_t *p = row + (size_t)k * es;
    if (left < 8) { /* never read past the row: it may end the mapping */
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, p, (size_t)left * es);
        p = tmp;
    }
    switch (type) {
    case GGML_TYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case GGML_TYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    default: return _mm256_loadu_ps((const float *)p);
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

static inline __attribute__((always_inline)) void tile_f(const int R, const int T, const struct ftile *a)
{
    __m256 facc[FTILE_R][FTILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < a->n_in; k += 8) {
        __m256 wv[FTILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = load_w8(a->type, a->w + r * a->w_stride, k, a->n_in);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            /* the input copy is zero-padded to a multiple of 16 */
            __m256 xv = _mm256_load_ps(a->x + t * a->x_stride + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) facc[r][t] = _mm256_fmadd_ps(wv[r], xv, facc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[t * a->ldy + r] = reduce8(facc[r][t]);
}

/* clang-format off */
#define FCASE(R_, T_) \
    case (R_) * 8 + (T_): tile_f(R_, T_, a); break;

static void tile_f_any(int R, int T, const struct ftile *a)
{
    switch (R * 8 + T) {
        FCASE(1, 1) FCASE(1, 2) FCASE(1, 3)
        FCASE(2, 1) FCASE(2, 2) FCASE(2, 3)
        FCASE(3, 1) FCASE(3, 2) FCASE(3, 3)
    default: break;
    }
}
/* clang-format on */

static void rows_float(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += FTILE_R) {
        int rr = (int)(r1 - r < FTILE_R ? r1 - r : FTILE_R);
        for (int64_t t0 = 0; t0 < in->n_tok; t0 += FTILE_T) {
            int tt = (int)(in->n_tok - t0 < FTILE_T ? in->n_tok - t0 : FTILE_T);
            struct ftile a = {w->type,
                              (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                              w->row_bytes,
                              in->xf + t0 * in->xf_stride,
                              in->xf_stride,
                              in->n_in,
                              y + t0 * w->n_out + r,
                              w->n_out};
            tile_f_any(rr, tt, &a);
        }
    }
}

/* ---- table ----------------------------------------------------------------------------- */

static size_t scratch_bytes(const struct mm_weight *w, int64_t n_tok)
{
    if (!mm_type_is_quantized(w->type)) return 0;
    if (n_tok <= FUSED_T) return (size_t)FUSED_T * (size_t)n_groups(w->n_in) * sizeof(__m256i);
    return (size_t)PANEL_ROWS * (size_t)n_groups(w->n_in) * WGROUP_BYTES;
}

static void rows(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1, void *scratch)
{
    if (!mm_type_is_quantized(w->type)) rows_float(w, in, y, r0, r1);
    else if (in->n_tok <= FUSED_T) rows_fused(w, in, y, r0, r1, scratch);
    else rows_panel(w, in, y, r0, r1, scratch);
}

const struct mm_kernels mm_kernels_avx2 = {"avx2", act_bytes, NULL, quantize, scratch_bytes, rows, 0, NULL, NULL};
