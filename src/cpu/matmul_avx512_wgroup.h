/* matmul_avx512_wgroup.h — private to the matmul*_avx512.c files: one group
 * of one weight row -> steps (u8) + dw[16] + mw[16], in registers.
 *
 * Every function here is inline (most always_inline): the fused path uses a
 * group the moment it is unpacked and must not pay a call or a trip through
 * memory for it; the panel path stores it. Layout and lane order: the top
 * of matmul_avx512.c and matmul_avx512_impl.h.
 *
 * Q4_0, Q4_1 and Q4_K keep their high nibbles in place (q * 16) rather than
 * shifting them down: that saves a shift per vector. The lanes fed by high
 * nibbles carry dw / 16 (and a bias * 16) instead; isum * 16 converts to
 * float exactly and dw / 16 is exact, so the results equal the unshifted
 * arithmetic (and both paths use the same form anyway). */
#ifndef KVB_MATMUL_AVX512_WGROUP_H
#define KVB_MATMUL_AVX512_WGROUP_H

#include "cpu/matmul_avx512_impl.h"

struct wtype {
    int block_bytes; /* bytes per 32-block (K-quants: per 256) */
    int bias;        /* offset that made values unsigned (0: the type has a min) */
    int has_min;
};

static inline struct wtype wtype_of(enum ggml_type t)
{
    switch (t) {
    case GGML_TYPE_Q4_0: return (struct wtype){18, 8, 0};
    case GGML_TYPE_Q4_1: return (struct wtype){20, 0, 1};
    case GGML_TYPE_Q5_0: return (struct wtype){22, 16, 0};
    case GGML_TYPE_Q5_1: return (struct wtype){24, 0, 1};
    case GGML_TYPE_Q8_0: return (struct wtype){34, 128, 0};
    case GGML_TYPE_Q4_K: return (struct wtype){144, 0, 1};
    case GGML_TYPE_Q6_K: return (struct wtype){210, 32, 0};
    case GGML_TYPE_Q2_K: return (struct wtype){84, 0, 1};
    case GGML_TYPE_Q3_K: return (struct wtype){110, 4, 0};
    case GGML_TYPE_Q5_K: return (struct wtype){176, 0, 1};
    case GGML_TYPE_IQ4_NL: return (struct wtype){18, 128, 0};
    case GGML_TYPE_IQ4_XS: return (struct wtype){136, 128, 0};
    default: return (struct wtype){0, 0, 0};
    }
}

/* Types whose blocks are 256-element super-blocks: one S4 group each. */
static inline int type_super(enum ggml_type t)
{
    return t == GGML_TYPE_Q2_K || t == GGML_TYPE_Q3_K || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ||
           t == GGML_TYPE_Q6_K || t == GGML_TYPE_IQ4_XS;
}

/* lane L of an S4 group -> its 16-element sub-block of a super-block */
static inline __m512i lane_sub16(void)
{
    return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

/* The IQ4 grid offset by 128 (unsigned, as vpdpbusd wants; bias 128), in
 * every 128-bit lane. */
static inline __m512i iq4_grid_u8(void)
{
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_setr_epi8(QB_IQ4_GRID)), _mm512_set1_epi8((char)0x80));
}

/* Z for two 16-byte nibble runs a and b (IQ4: one 32-block each): 128-bit
 * lanes a low nibbles | a high | b low | b high, each looked up in the
 * offset grid. */
static inline __m512i iq4_pair(__m128i a, __m128i b)
{
    __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(a), 0xFF00, b);
    v = _mm512_mask_srli_epi16(v, (__mmask32)0xFF00FF00, v, 4);
    return _mm512_shuffle_epi8(iq4_grid_u8(), _mm512_and_si512(v, _mm512_set1_epi8(0x0F)));
}

/* Q2_K / Q3_K: Z[m] = sub-blocks 2m and 2m+1 = quarters j0, j0 + 1 (j0 =
 * 2(m%2)) of the 32 bytes q of half m/2: 2-bit fields 2j0 and 2j0 + 2. */
static inline __m512i crumb_pair(__m256i q, int m)
{
    const int j0 = 2 * (m % 2);
    __m512i v = _mm512_broadcast_i64x4(q);
    __m512i sh = _mm512_mask_mov_epi16(_mm512_set1_epi16((short)(2 * j0)), (__mmask32)0xFFFF0000,
                                       _mm512_set1_epi16((short)(2 * j0 + 2)));
    return _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(3));
}

/* For Z[m] (sub-blocks 2m | 2m+1): the bytes whose bit 2m (lower 32 bytes)
 * or 2m+1 (upper) is set in the 32 bytes h (Q3_K's hmask, Q5_K's qh). */
static inline __mmask64 high_bits(__m256i h, int m)
{
    __m512i bit = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)(1 << (2 * m))), (__mmask64)0xFFFFFFFF00000000ull,
                                       _mm512_set1_epi8((char)(1 << (2 * m + 1))));
    return _mm512_test_epi8_mask(_mm512_broadcast_i64x4(h), bit);
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
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bs));
    __m256i dm;
    if (nblk >= GROUP_BLOCKS) dm = _mm256_i32gather_epi32((const int *)src, idx, 1);
    else dm = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), (__mmask8)((1u << nblk) - 1), idx, src, 1);
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
    const __m512i keep =
        _mm512_setr_epi32(0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F, (int)0xF0F0F0F0, (int)0xF0F0F0F0,
                          (int)0xF0F0F0F0, (int)0xF0F0F0F0, 0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F, 0x0F0F0F0F,
                          (int)0xF0F0F0F0, (int)0xF0F0F0F0, (int)0xF0F0F0F0, (int)0xF0F0F0F0);
#pragma GCC unroll 8
    for (int m = 0; m < 4; m++) {
        const uint8_t *a = src + (2 * m) * bs + qoff, *b = a + bs;
        __m512i v;
        if (2 * m + 2 <= nblk)
            v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a)), 0xFF00,
                                            _mm_loadu_si128((const __m128i *)b));
        else if (2 * m + 1 == nblk) v = _mm512_maskz_broadcast_i32x4(0x00FF, _mm_loadu_si128((const __m128i *)a));
        else v = _mm512_setzero_si512();
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
        __m512i v =
            _mm512_permutex2var_epi64(_mm512_castsi256_si512(y), perm, _mm512_castsi256_si512(_mm256_srli_epi16(y, 4)));
        v = _mm512_and_si512(v, m4);
        __mmask64 hb = (__mmask64)qb_u32(a + hoff) | (two ? (__mmask64)qb_u32(b + hoff) << 32 : 0);
        z[m] = _mm512_mask_add_epi8(v, hb, v, b4);
    }
}

/* Q4_K / Q5_K: the eight 6-bit scales and mins of a super-block (the 12
 * bytes at src + 4, unpacked as qb_q4k_scale_min does) as per-lane floats:
 * dw = d * sc (times odd_k on odd sub-blocks), mw = -(dmin * m). The products
 * are the scalar code's, one IEEE multiply each (odd_k is a power of two,
 * the negation a sign flip), vectorised instead of eight scalar rounds. */
static inline __attribute__((always_inline)) void q4k_scales(const uint8_t *src, float odd_k, __m512 *dw, __m512 *mw)
{
    /* bytes 0..7 the scales, 8..15 the mins; a: the low bits' byte (j < 4: q[j], q[j + 4]; j >= 4:
     * q[j + 4], whose high nibble is the min's), b: the byte whose top two bits are bits 4-5 (j >= 4) */
    const __m128i q = _mm_loadu_si128((const __m128i *)(src + 4));
    __m128i a = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i b = _mm_shuffle_epi8(q, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    a = _mm_mask_blend_epi8((__mmask16)0xF000, a, _mm_srli_epi16(a, 4));
    a = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    const __m128i v = _mm_or_si128(a, _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30)));
    const __m512 dd = _mm512_mask_mov_ps(_mm512_set1_ps(half_at(src)), 0xFF00, _mm512_set1_ps(half_at(src + 2)));
    __m512 f = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)));
    if (odd_k != 1.0f) f = _mm512_mul_ps(f, _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), 0x00AA, _mm512_set1_ps(odd_k)));
    f = _mm512_castsi512_ps(
        _mm512_mask_xor_epi32(_mm512_castps_si512(f), 0xFF00, _mm512_castps_si512(f), _mm512_set1_epi32(INT32_MIN)));
    /* lane L -> its sub-block within the super-block (per_lane's order); the mins 8 further */
    const __m512i lane_block = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7);
    *dw = _mm512_permutexvar_ps(lane_block, f);
    *mw = _mm512_permutexvar_ps(_mm512_add_epi32(lane_block, _mm512_set1_epi32(8)), f);
}

/* One group of weights (nblk of 8 blocks present; K-quants: one super-block)
 * into steps and per-lane scales, in registers. */
static inline __attribute__((always_inline)) void wgroup(enum ggml_type type, const uint8_t *src, int nblk,
                                                         __m512i st[4], __m512 *dw, __m512 *mw)
{
    __m512i z[4];
    const __m512 sixteenth = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), HI_NIB_LANES, _mm512_set1_ps(0.0625f));
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
            __m256i hi = 2 * m + 1 < nblk ? _mm256_loadu_si256((const __m256i *)(a + 34)) : _mm256_setzero_si256();
            z[m] = pair512(lo, hi);
        }
        scales_per_lane(src, 34, nblk, dw, NULL);
        break;
    case GGML_TYPE_Q4_K: {
        /* 32 bytes of qs hold sub-block 2m (low nibbles) and 2m+1 (high, kept * 16). */
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(src + 16 + 32 * m)));
            z[m] = _mm512_and_si512(
                c, _mm512_setr_epi64(0x0F0F0F0F0F0F0F0Fll, 0x0F0F0F0F0F0F0F0Fll, 0x0F0F0F0F0F0F0F0Fll,
                                     0x0F0F0F0F0F0F0F0Fll, (long long)0xF0F0F0F0F0F0F0F0ull,
                                     (long long)0xF0F0F0F0F0F0F0F0ull, (long long)0xF0F0F0F0F0F0F0F0ull,
                                     (long long)0xF0F0F0F0F0F0F0F0ull));
        }
        /* odd sub-blocks come from high nibbles, kept * 16 */
        q4k_scales(src, 0.0625f, dw, mw);
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
            nat[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            nat[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            nat[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(h, m30));
            nat[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        }
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) z[m] = pair512(nat[2 * m], nat[2 * m + 1]);
        __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 192))));
        sc = _mm512_mul_ps(_mm512_set1_ps(half_at(src + 208)), sc);
        /* lane L -> its 16-element sub-block */
        *dw = _mm512_permutexvar_ps(lane_sub16(), sc);
        break;
    }
    case GGML_TYPE_Q5_K: {
        /* Q4_K's nibbles shifted down (a fifth bit joins the high ones) */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(src + 16));
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(src + 48 + 32 * m)));
            v = _mm512_and_si512(_mm512_mask_srli_epi16(v, (__mmask32)0xFFFF0000, v, 4), _mm512_set1_epi8(0x0F));
            z[m] = _mm512_mask_add_epi8(v, high_bits(qh, m), v, _mm512_set1_epi8(16));
        }
        q4k_scales(src, 1.0f, dw, mw);
        break;
    }
    case GGML_TYPE_Q3_K: {
        /* value + 4 = 2-bit field | hmask bit << 2: unsigned 0..7, bias 4 */
        const __m256i hm = _mm256_loadu_si256((const __m256i *)src);
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            __m512i v = crumb_pair(_mm256_loadu_si256((const __m256i *)(src + 32 + 32 * (m / 2))), m);
            z[m] = _mm512_mask_add_epi8(v, high_bits(hm, m), v, _mm512_set1_epi8(4));
        }
        int8_t sc[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) sc[i] = (int8_t)qb_q3k_scale(src + 96, i);
        __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc)));
        f = _mm512_mul_ps(_mm512_set1_ps(half_at(src + 108)), f);
        *dw = _mm512_permutexvar_ps(lane_sub16(), f);
        break;
    }
    case GGML_TYPE_Q2_K: {
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++)
            z[m] = crumb_pair(_mm256_loadu_si256((const __m256i *)(src + 16 + 32 * (m / 2))), m);
        /* scales[i]: scale low nibble, min high nibble, of 16-element sub-block i */
        __m512i v = _mm512_permutexvar_epi32(lane_sub16(), _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src)));
        __m512 sc = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x0F)));
        __m512 mn = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
        *dw = _mm512_mul_ps(_mm512_set1_ps(half_at(src + 80)), sc);
        *mw = _mm512_castsi512_ps(
            _mm512_xor_si512(/* -(dmin*m) */
                             _mm512_castps_si512(_mm512_mul_ps(_mm512_set1_ps(half_at(src + 82)), mn)),
                             _mm512_set1_epi32(INT32_MIN)));
        break;
    }
    case GGML_TYPE_IQ4_NL:
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++) {
            const uint8_t *a = src + (2 * m) * 18 + 2;
            if (2 * m + 2 <= nblk)
                z[m] = iq4_pair(_mm_loadu_si128((const __m128i *)a), _mm_loadu_si128((const __m128i *)(a + 18)));
            else if (2 * m + 1 == nblk) /* the missing block's lanes read the grid's index 0: x is 0 there */
                z[m] = iq4_pair(_mm_loadu_si128((const __m128i *)a), _mm_setzero_si128());
            else z[m] = _mm512_setzero_si512();
        }
        scales_per_lane(src, 18, nblk, dw, NULL);
        break;
    case GGML_TYPE_IQ4_XS: {
#pragma GCC unroll 8
        for (int m = 0; m < 4; m++)
            z[m] = iq4_pair(_mm_loadu_si128((const __m128i *)(src + 8 + 32 * m)),
                            _mm_loadu_si128((const __m128i *)(src + 24 + 32 * m)));
        float d = half_at(src), ds[8];
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) ds[s] = d * (float)qb_iq4xs_scale(src, s);
        *dw = per_lane(_mm256_loadu_ps(ds));
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
static inline __attribute__((always_inline)) void wgroup_any(enum ggml_type type, const uint8_t *src, int nblk,
                                                             __m512i st[4], __m512 *dw, __m512 *mw)
{
    if (nblk == GROUP_BLOCKS) wgroup(type, src, GROUP_BLOCKS, st, dw, mw);
    else wgroup(type, src, nblk, st, dw, mw);
}

/* Q4_0 / Q4_1, sixteen blocks at src: their qs transposed so that lane L
 * holds block L and dword s of t[s] holds qs bytes 4s..4s+3 (low nibbles:
 * elements 4s..4s+3, high: 16+4s..). 128-bit lane k of z[j] is block 4k+j. */
static inline __attribute__((always_inline)) void q4_transposed(const uint8_t *src, int bs, __m512i t[4])
{
    const int qoff = bs - 16;
    __m512i z[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(src + bs * j + qoff)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(src + bs * (4 + j) + qoff)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(src + bs * (8 + j) + qoff)), 2);
        z[j] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(src + bs * (12 + j) + qoff)), 3);
    }
    to_steps(z, t);
}

/* Q8_0, sixteen blocks at src: 8 steps, lane L = block L, flipped to u8. */
static inline __attribute__((always_inline)) void q8_steps(const uint8_t *src, __m512i st[8])
{
    __m256i nat[16];
#pragma GCC unroll 16
    for (int b = 0; b < 16; b++) nat[b] = _mm256_loadu_si256((const __m256i *)(src + 34 * b + 2));
    blocks16_to_steps(nat, st);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) st[k] = _mm512_xor_si512(st[k], flip);
}

static inline __attribute__((always_inline)) void split_nibbles(const __m512i t[4], __m512i st[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        st[k] = _mm512_and_si512(t[k], m4);
        st[4 + k] = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), m4);
    }
}

static inline int wide_bs(enum ggml_type type)
{
    return type == GGML_TYPE_Q4_0 ? 18 : type == GGML_TYPE_Q4_1 ? 20 : 34;
}

/* S8: sixteen blocks of a wide type at src -> 8 steps and per-lane scales
 * (lane L = block L). Nibbles are shifted down here (a lane mixes both
 * halves of its block), so every lane has the type's one bias. */
static inline __attribute__((always_inline)) void wgroup8(enum ggml_type type, const uint8_t *src, __m512i st[8],
                                                          __m512 *dw, __m512 *mw)
{
    const int bs = wide_bs(type);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(bs));
    /* d (and m after it) of block L in lane L */
    const __m512i dm = _mm512_i32gather_epi32(idx, src, 1);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    *mw = type == GGML_TYPE_Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)))
                                 : _mm512_setzero_ps();
    if (type == GGML_TYPE_Q8_0) {
        q8_steps(src, st);
        return;
    }
    __m512i t[4];
    q4_transposed(src, bs, t);
    split_nibbles(t, st);
}

/* Packed rows (written by pack_rows in matmul_avx512.c): the S8 groups of a wide type rearranged once, in the
 * same bytes: Q4_0 / Q4_1 as q4_transposed's t[4] (256 bytes), then d[16]
 * and (Q4_1) m[16] as f16 in lane order; Q8_0 as q8_steps' 8 steps (512
 * bytes), then d[16]. S4 and S1 groups are left as stored. Unpacking a
 * packed group is then masks and shifts, no shuffles. */

static inline __attribute__((always_inline)) void wgroup8_packed(enum ggml_type type, const uint8_t *src, __m512i st[8],
                                                                 __m512 *dw, __m512 *mw)
{
    if (type == GGML_TYPE_Q8_0) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) st[k] = _mm512_loadu_si512(src + 64 * k);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 512)));
        *mw = _mm512_setzero_ps();
        return;
    }
    __m512i t[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) t[k] = _mm512_loadu_si512(src + 64 * k);
    split_nibbles(t, st);
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 256)));
    *mw = type == GGML_TYPE_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 288)))
                                 : _mm512_setzero_ps();
}

/* An S8 group, from packed or stored bytes. */
static inline __attribute__((always_inline)) void wgroup8_any(enum ggml_type type, int packed, const uint8_t *src,
                                                              __m512i st[8], __m512 *dw, __m512 *mw)
{
    if (packed) wgroup8_packed(type, src, st, dw, mw);
    else wgroup8(type, src, st, dw, mw);
}

/* S1: one or two blocks of a wide type, in natural order (lane L = dword
 * L&7 of block L>>3). */
static inline __attribute__((always_inline)) void wgroup1(enum ggml_type type, const uint8_t *src, int nblk,
                                                          __m512i *st, __m512 *dw, __m512 *mw)
{
    const int bs = wide_bs(type);
    const int two = nblk == 2;
    const uint8_t *b = src + bs;
    *dw = _mm512_mask_mov_ps(_mm512_set1_ps(half_at(src)), 0xFF00, _mm512_set1_ps(two ? half_at(b) : 0.0f));
    *mw = type == GGML_TYPE_Q4_1 ? _mm512_mask_mov_ps(_mm512_set1_ps(half_at(src + 2)), 0xFF00,
                                                      _mm512_set1_ps(two ? half_at(b + 2) : 0.0f))
                                 : _mm512_setzero_ps();
    if (type == GGML_TYPE_Q8_0) {
        __m512i v = pair512(_mm256_loadu_si256((const __m256i *)(src + 2)),
                            two ? _mm256_loadu_si256((const __m256i *)(b + 2)) : _mm256_setzero_si256());
        *st = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
        return;
    }
    const int qoff = bs - 16;
    /* 128-bit lanes: a's qs, a's qs, b's qs, b's qs; the odd lanes shifted */
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(src + qoff)));
    if (two) v = _mm512_mask_broadcast_i32x4(v, 0xFF00, _mm_loadu_si128((const __m128i *)(b + qoff)));
    v = _mm512_mask_srli_epi16(v, (__mmask32)0xFF00FF00, v, 4);
    v = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
    if (!two) v = _mm512_maskz_mov_epi64(0x0F, v);
    *st = v;
}

static inline const uint8_t *group_src(const uint8_t *row, int k_quant, int bs, int64_t g)
{
    return row + (size_t)g * (size_t)(k_quant ? bs : GROUP_BLOCKS * bs);
}

#endif
