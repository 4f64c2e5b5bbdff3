/* matmul_avx512_impl.h — private to the matmul*_avx512.c files: the group
 * layout and the helpers that more than one of them uses.
 *
 * The layout and the arithmetic are described at the top of matmul_avx512.c.
 * The pieces:
 *  - matmul_avx512.c        input quantization, packed rows, the kernel table;
 *  - matmul_avx512_wgroup.h one weight group -> steps and per-lane scales, in
 *                           registers (inline: both quantized paths use it);
 *  - matmul_fused_avx512.c  the few-token path (decode);
 *  - matmul_panel_avx512.c  the many-token path (prefill) and its micro-kernels;
 *  - matmul_float_avx512.c  float weights.
 * The helpers are static inline so that each file inlines them as it did
 * when they were one file: the kernels rely on that for speed. lay_of and
 * input_form stay plain static, as they were (unused: not every file calls
 * them): inlined, they changed the code of the fused kernels, which as it
 * is compiles to the same instructions as before the split. Compile with
 * the AVX-512 flags (CMake gives them to every src/ file named *_avx512.c). */
#ifndef KVB_MATMUL_AVX512_IMPL_H
#define KVB_MATMUL_AVX512_IMPL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/matmul_impl.h"
#include "model/quant_blocks.h"

#define GROUP_BLOCKS 8    /* blocks of an S4 group */
#define GROUP_BYTES_Q 256 /* S4: 4 steps x 64 bytes */
#define WGROUP_BYTES 384  /* S4 weight group: steps, dw[16], mw[16] */
#define PANEL_ROWS 16     /* weight rows unpacked at a time (panel path) */

/* Types whose rows use S8 and S1 groups (their scales cover 32 elements and
 * their groups of 16 blocks are unpacked with shuffles alone). */
static inline int type_wide(enum ggml_type t)
{
    return t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q8_0;
}

/* How a row of nb blocks is cut into groups: n8 S8 groups, then n4 S4
 * groups (the last with last4 blocks), then n1 (0 or 1) S1 group of last1
 * blocks. Byte counts are per token (input) and per row (unpacked weights).
 *
 * The quantized input: per token, the wide form then the narrow one; each is
 * q[steps] i8 | xs[g][16] f32 (block scale per lane) | sxs[g][16] f32
 * (scale * lane sum) | sx[g][16] i32 (lane sum). */
struct lay {
    int64_t n8, n4, n1, ng;
    int last4, last1;
    size_t qbytes; /* int8 steps of one token; then xs, sxs, sx: 64 bytes per group each */
    size_t tbytes; /* one token: qbytes + 192 * ng */
    size_t wbytes; /* one unpacked weight row: steps + dw[16] + mw[16] per group */
};

static __attribute__((unused)) struct lay lay_of(int64_t nb, int wide)
{
    struct lay l = {0, 0, 0, 0, GROUP_BLOCKS, 0, 0, 0, 0};
    int64_t r = nb;
    if (wide) {
        l.n8 = r / 16;
        r %= 16;
        if (r <= 2) {
            l.n1 = r > 0;
            l.last1 = (int)r;
            r = 0;
        } else if (r > 8 && r <= 10) {
            l.n4 = 1;
            l.n1 = 1;
            l.last1 = (int)(r - 8);
            r = 0;
        }
    }
    if (r > 0) {
        l.n4 = (r + GROUP_BLOCKS - 1) / GROUP_BLOCKS;
        l.last4 = (int)(r - (l.n4 - 1) * GROUP_BLOCKS);
    }
    l.ng = l.n8 + l.n4 + l.n1;
    l.qbytes = (size_t)(512 * l.n8 + 256 * l.n4 + 64 * l.n1);
    l.tbytes = l.qbytes + 192 * (size_t)l.ng;
    l.wbytes = (size_t)(640 * l.n8 + 384 * l.n4 + 192 * l.n1);
    return l;
}

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

static inline __m512i pair512(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* Sixteen 32-byte blocks (nat[b] = block b) -> 8 steps, lane L = block L:
 * 128-bit lane k of Z0[j] (Z1[j]) is the first (second) half of block
 * 4k + j, and to_steps' lane 4k + j then reads that block. */
static inline void blocks16_to_steps(const __m256i nat[16], __m512i st[8])
{
    __m512i z0[4], z1[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i a = pair512(nat[j], nat[4 + j]), b = pair512(nat[8 + j], nat[12 + j]);
        z0[j] = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        z1[j] = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    }
    to_steps(z0, st);
    to_steps(z1, st + 4);
}

/* Per-block floats (8, natural order) to S4 lanes. */
static inline __m512 per_lane(__m256 v8)
{
    /* lane L -> its block within an S4 group */
    static const int32_t lane_block[16] = {0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7};
    return _mm512_permutexvar_ps(_mm512_loadu_si512(lane_block), _mm512_castps256_ps512(v8));
}

/* One f16 via F16C: an out-of-line call here would save and restore the
 * vector registers around it. */
static inline float half_at(const uint8_t *p) { return _cvtsh_ss(qb_u16(p)); }

/* The one 16-lane reduction every output element goes through. */
static inline float reduce16(__m512 v)
{
    __m256 a =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* The float step of one group for one (row, token): the same operations in
 * every kernel, so tile shape and batch cannot change a result. */
static inline __attribute__((always_inline)) __m512 group_fma(__m512 facc, __m512i isum, __m512 dw, __m512 xs,
                                                              int has_min, __m512 mw, __m512 sxs)
{
    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, xs), facc);
    if (has_min) facc = _mm512_fmadd_ps(mw, sxs, facc);
    return facc;
}

/* The form of the input a type reads, and its offset within a token. */
static __attribute__((unused)) struct lay input_form(enum ggml_type type, int64_t n_in, size_t *off)
{
    struct lay wide = lay_of(n_in / 32, 1);
    *off = type_wide(type) ? 0 : wide.tbytes;
    return type_wide(type) ? wide : lay_of(n_in / 32, 0);
}

/* ---- the three row loops (rows [r0, r1) of every token; see mm_kernels.rows) */

/* Few tokens (decode): each weight group is unpacked in registers and used
 * at once, for up to FUSED_T tokens, with no trip through memory. Same
 * arithmetic per output element as the panel path. */
#define FUSED_T 3

/* n_tok <= FUSED_T; scratch: FUSED_T * ng __m512i (matmul_fused_avx512.c). */
void mm_avx512_rows_fused(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                          void *scratch);
/* More tokens; panel: PANEL_ROWS unpacked rows of lay.wbytes (matmul_panel_avx512.c). */
void mm_avx512_rows_panel(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                          uint8_t *panel);
/* F32, F16 and BF16 weights, from the float copy of the input (matmul_float_avx512.c). */
void mm_avx512_rows_float(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1);

#endif
