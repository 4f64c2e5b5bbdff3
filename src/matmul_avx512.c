/* matmul_avx512.c — matrix products with AVX-512 and VNNI (vpdpbusd).
 *
 * Entered only after matmul.c checked the CPU (avx512f/bw/vl/vnni).
 *
 * Layout idea. A row is cut into "groups" of 16 int32 lanes. The quantized
 * input and the weights of a group are rearranged into S "steps" of 64 bytes
 * in which every lane carries 4 bytes of one scale unit (a block of 32, or
 * half of one), the same unit in every step, so S vpdpbusd accumulate each
 * unit's integer dot product in its own lane with no horizontal work, and one
 * float step per group applies the 16 per-lane scales:
 *
 *   facc += float(isum) * (dw * dx)      [+ mw * dx*sum(qx) for types with a min]
 *
 * The float step costs as much as the integer steps of a short group, so the
 * wider the group the better. Three kinds:
 *  - S8, 16 blocks: lane L is block L, step s its dword s (Q4_0, Q4_1, Q8_0);
 *  - S4, 8 blocks: lane L is half (L>>2)&1 of block 2*(L&3) + (L>>3), step s
 *    dword s of that half. The half-block lanes are what Q6_K's 16-element
 *    scales need; every other type (Q5_x, Q4_K) keeps it too, and the "wide"
 *    types use it for a remainder of 3 to 8 blocks;
 *  - S1, 1 or 2 blocks in natural order: lane L is dword L&7 of block L>>3.
 * A "wide" row (Q4_0, Q4_1, Q8_0) is S8 groups, then at most two S4 groups,
 * then at most one S1 group: n_embd 576 = 18 blocks is one S8 and one S1,
 * where 8-block groups only would have padded it to 24 blocks. A "narrow"
 * row is S4 groups only. The quantized input holds both forms, one after
 * the other.
 *
 * vpdpbusd wants unsigned weights, so signed types are read with their
 * stored offset (nibble = q + 8, q + 16, q + 32; Q8_0 as q ^ 0x80 = q + 128)
 * and offset * (the input's lane sums) is removed exactly in the integer
 * start value.
 *
 * Two paths, one arithmetic:
 *  - few tokens (decode, n_tok <= FUSED_T): each weight group is unpacked in
 *    registers and used at once; the kernel streams the weights once, with
 *    software prefetch, and is bound by memory bandwidth;
 *  - many tokens (prefill): a panel of rows is unpacked into scratch once and
 *    R x T tiles reuse it from L1 for every token (compute-bound).
 * Determinism: every output element runs the same float operations in the
 * same order (its groups in row order, then one fixed 16-lane reduction tree)
 * in both paths and every tile shape, for any batch and any thread split; the
 * tests check this bit for bit. */
#include <immintrin.h>
#include <string.h>

#include "matmul_impl.h"
#include "quant_blocks.h"

#define GROUP_BLOCKS 8    /* blocks of an S4 group */
#define GROUP_BYTES_Q 256 /* S4: 4 steps x 64 bytes */
#define WGROUP_BYTES 384  /* S4 weight group: steps, dw[16], mw[16] */
#define PANEL_ROWS 16     /* weight rows unpacked at a time */
#define TILE_R 4          /* rows per micro-kernel */
#define TILE_T 3          /* tokens per micro-kernel */
/* Tokens whose quantized input is kept hot while one panel is applied. */
#define TOKEN_BUDGET_BYTES (512 * 1024)

/* Lane L -> its block within an S4 group, and its 16-element sub-block. */
static const int32_t lane_block[16] = {0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7};
static const int32_t lane_sub16[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/* Types whose rows use S8 and S1 groups (their scales cover 32 elements and
 * their groups of 16 blocks are unpacked with shuffles alone). */
static inline int type_wide(enum ggml_type t)
{
    return t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q8_0;
}

/* How a row of nb blocks is cut into groups: n8 S8 groups, then n4 S4
 * groups (the last with last4 blocks), then n1 (0 or 1) S1 group of last1
 * blocks. Byte counts are per token (input) and per row (unpacked weights). */
struct lay {
    int64_t n8, n4, n1, ng;
    int last4, last1;
    size_t qbytes;   /* int8 steps of one token; then xs, sxs, sx: 64 bytes per group each */
    size_t tbytes;   /* one token: qbytes + 192 * ng */
    size_t wbytes;   /* one unpacked weight row: steps + dw[16] + mw[16] per group */
};

static struct lay lay_of(int64_t nb, int wide)
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

/* ---- the input: per token, the wide form then the narrow one; each is
 * q[steps] i8 | xs[g][16] f32 (block scale per lane) | sxs[g][16] f32
 * (scale * lane sum) | sx[g][16] i32 (lane sum) ------------------------- */

static size_t act_bytes(int64_t n_in)
{
    return lay_of(n_in / 32, 1).tbytes + lay_of(n_in / 32, 0).tbytes;
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

static inline __m512i pair512(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

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
    return _mm512_permutexvar_ps(_mm512_loadu_si512(lane_block), _mm512_castps256_ps512(v8));
}

/* One block of 32 floats -> 32 int8 and its scale. Same formula and
 * rounding as the scalar path (matmul_scalar.c). */
static inline __m256i q8_block(const float *x, float *d_out)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m512 a0 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, vid), lo), hi);
    __m512 a1 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, vid), lo), hi);
    __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a0));
    __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a1));
    *d_out = d;
    return _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
}

/* Where the next group of one form of a token goes. */
struct qcur {
    uint8_t *q;      /* next step */
    float *xs, *sxs; /* next group's lanes */
    int32_t *sx;
};

static struct qcur qcur_at(uint8_t *form, const struct lay *l)
{
    struct qcur c;
    c.q = form;
    c.xs = (float *)(form + l->qbytes);
    c.sxs = c.xs + l->ng * 16;
    c.sx = (int32_t *)(c.sxs + l->ng * 16);
    return c;
}

/* Stores S steps of one group and its per-lane xs, sxs, sx; advances c. */
static inline void put_group(struct qcur *c, const __m512i *st, int S, __m512 xsv)
{
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < S; k++) {
        _mm512_storeu_si512(c->q + 64 * k, st[k]);
        s = _mm512_dpbusd_epi32(s, ones, st[k]);
    }
    _mm512_storeu_ps(c->xs, xsv);
    _mm512_storeu_ps(c->sxs, _mm512_mul_ps(xsv, _mm512_cvtepi32_ps(s)));
    _mm512_storeu_si512(c->sx, s);
    c->q += 64 * S;
    c->xs += 16;
    c->sxs += 16;
    c->sx += 16;
}

/* An S4 group of the n <= 8 quantized blocks at nat/d. */
static void put_s4(struct qcur *c, const __m256i *nat, const float *d, int n)
{
    __m256i b8[GROUP_BLOCKS];
    float d8[GROUP_BLOCKS];
    for (int b = 0; b < GROUP_BLOCKS; b++) {
        b8[b] = b < n ? nat[b] : _mm256_setzero_si256();
        d8[b] = b < n ? d[b] : 0.0f;
    }
    __m512i z[4], st[4];
    for (int m = 0; m < 4; m++) z[m] = pair512(b8[2 * m], b8[2 * m + 1]);
    to_steps(z, st);
    put_group(c, st, 4, per_lane(_mm256_loadu_ps(d8)));
}

/* Input forms: bit 1 the wide one, bit 2 the narrow one. */
#define FORM_WIDE 1u
#define FORM_NARROW 2u

static unsigned forms_of(enum ggml_type type) { return type_wide(type) ? FORM_WIDE : FORM_NARROW; }

/* Both forms can be written in one pass over the row: the wide form's S8
 * groups and the narrow form's S4 groups both start at multiples of 8
 * blocks, so each run of 16 blocks is quantized once and stored in each
 * form asked for. */
static void quantize(const float *x, int64_t n_in, unsigned forms, void *dst)
{
    int64_t nb = n_in / 32;
    const int w = (forms & FORM_WIDE) != 0, n = (forms & FORM_NARROW) != 0;
    struct lay wide = lay_of(nb, 1), narrow = lay_of(nb, 0);
    struct qcur cw = qcur_at(dst, &wide), cn = qcur_at((uint8_t *)dst + wide.tbytes, &narrow);
    __m256i nat[16];
    float d[16];
    int64_t blk = 0;
    for (int64_t i = 0; i < wide.n8; i++, blk += 16) {
        for (int b = 0; b < 16; b++) nat[b] = q8_block(x + 32 * (blk + b), &d[b]);
        if (w) {
            __m512i st[8];
            blocks16_to_steps(nat, st);
            put_group(&cw, st, 8, _mm512_loadu_ps(d));
        }
        if (n) {
            put_s4(&cn, nat, d, GROUP_BLOCKS);
            put_s4(&cn, nat + GROUP_BLOCKS, d + GROUP_BLOCKS, GROUP_BLOCKS);
        }
    }
    int r = (int)(nb - blk); /* < 16 */
    for (int b = 0; b < r; b++) nat[b] = q8_block(x + 32 * (blk + b), &d[b]);
    if (n)
        for (int b = 0; b < r; b += GROUP_BLOCKS) put_s4(&cn, nat + b, d + b, r - b < 8 ? r - b : 8);
    if (!w) return;
    int b = 0;
    for (int64_t i = 0; i < wide.n4; i++, b += GROUP_BLOCKS)
        put_s4(&cw, nat + b, d + b, i == wide.n4 - 1 ? wide.last4 : GROUP_BLOCKS);
    if (wide.n1) {
        int two = wide.last1 == 2;
        __m512i st = pair512(nat[b], two ? nat[b + 1] : _mm256_setzero_si256());
        __m512 xsv = _mm512_mask_mov_ps(_mm512_set1_ps(d[b]), 0xFF00,
                                        _mm512_set1_ps(two ? d[b + 1] : 0.0f));
        put_group(&cw, &st, 1, xsv);
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
static inline __attribute__((always_inline)) void wgroup8(enum ggml_type type, const uint8_t *src,
                                                          __m512i st[8], __m512 *dw, __m512 *mw)
{
    const int bs = wide_bs(type);
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(bs));
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

/* ---- packed rows: the S8 groups of a wide type rearranged once, in the
 * same bytes: Q4_0 / Q4_1 as q4_transposed's t[4] (256 bytes), then d[16]
 * and (Q4_1) m[16] as f16 in lane order; Q8_0 as q8_steps' 8 steps (512
 * bytes), then d[16]. S4 and S1 groups are left as stored. Unpacking a
 * packed group is then masks and shifts, no shuffles. */

#define PACK_TAG 0x512u

static int packs(enum ggml_type type) { return type_wide(type); }

static inline __attribute__((always_inline)) void wgroup8_packed(enum ggml_type type, const uint8_t *src,
                                                                 __m512i st[8], __m512 *dw, __m512 *mw)
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

static void pack_rows(const struct mm_weight *w, int64_t r0, int64_t r1, uint8_t *dst)
{
    const int bs = wide_bs(w->type);
    const int64_t n8 = lay_of(w->n_in / 32, 1).n8;
    for (int64_t r = r0; r < r1; r++, dst += w->row_bytes) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        memcpy(dst, row, w->row_bytes); /* S4 and S1 groups stay as stored */
        for (int64_t g = 0; g < n8; g++) {
            const uint8_t *src = row + (size_t)(16 * bs) * (size_t)g;
            uint8_t *o = dst + (size_t)(16 * bs) * (size_t)g;
            size_t scale_off;
            if (w->type == GGML_TYPE_Q8_0) {
                __m512i st[8];
                q8_steps(src, st);
                for (int k = 0; k < 8; k++) _mm512_storeu_si512(o + 64 * k, st[k]);
                scale_off = 512;
            } else {
                __m512i t[4];
                q4_transposed(src, bs, t);
                for (int k = 0; k < 4; k++) _mm512_storeu_si512(o + 64 * k, t[k]);
                scale_off = 256;
            }
            for (int b = 0; b < 16; b++) {
                memcpy(o + scale_off + 2 * b, src + bs * b, 2); /* d */
                if (w->type == GGML_TYPE_Q4_1) memcpy(o + scale_off + 32 + 2 * b, src + bs * b + 2, 2); /* m */
            }
        }
    }
}

/* An S8 group, from packed or stored bytes. */
static inline __attribute__((always_inline)) void wgroup8_any(enum ggml_type type, int packed,
                                                              const uint8_t *src, __m512i st[8],
                                                              __m512 *dw, __m512 *mw)
{
    if (packed) wgroup8_packed(type, src, st, dw, mw);
    else wgroup8(type, src, st, dw, mw);
}

/* S1: one or two blocks of a wide type, in natural order (lane L = dword
 * L&7 of block L>>3). */
static inline __attribute__((always_inline)) void wgroup1(enum ggml_type type, const uint8_t *src,
                                                          int nblk, __m512i *st, __m512 *dw,
                                                          __m512 *mw)
{
    const int bs = wide_bs(type);
    const int two = nblk == 2;
    const uint8_t *b = src + bs;
    *dw = _mm512_mask_mov_ps(_mm512_set1_ps(half_at(src)), 0xFF00,
                             _mm512_set1_ps(two ? half_at(b) : 0.0f));
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

static inline __attribute__((always_inline)) void unpack_row_t(enum ggml_type type, int packed,
                                                               const uint8_t *row,
                                                               const struct lay *lp, uint8_t *out)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    const struct lay l = *lp;
    const uint8_t *src = row;
    for (int64_t g = 0; g < l.n8; g++) {
        __m512i st[8];
        __m512 dw, mw;
        wgroup8_any(type, packed, src, st, &dw, &mw);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) _mm512_store_si512(out + 64 * k, st[k]);
        _mm512_store_ps(out + 512, dw);
        _mm512_store_ps(out + 576, mw);
        src += 16 * wt.block_bytes;
        out += 640;
    }
    for (int64_t g = 0; g < l.n4; g++) {
        __m512i st[4];
        __m512 dw, mw;
        wgroup_any(type, src, k_quant ? 8 : g == l.n4 - 1 ? l.last4 : GROUP_BLOCKS, st, &dw, &mw);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) _mm512_store_si512(out + 64 * k, st[k]);
        _mm512_store_ps(out + 256, dw);
        _mm512_store_ps(out + 320, mw);
        src = group_src(src, k_quant, wt.block_bytes, 1);
        out += 384;
    }
    if (l.n1) {
        __m512i st;
        __m512 dw, mw;
        wgroup1(type, src, l.last1, &st, &dw, &mw);
        _mm512_store_si512(out, st);
        _mm512_store_ps(out + 64, dw);
        _mm512_store_ps(out + 128, mw);
    }
}

/* Row unpacking for the panel path, one instance per type. */
static void unpack_row(enum ggml_type type, int packed, const uint8_t *row, const struct lay *l,
                       uint8_t *out)
{
    switch (type) {
    case GGML_TYPE_Q4_0: unpack_row_t(GGML_TYPE_Q4_0, packed, row, l, out); break;
    case GGML_TYPE_Q4_1: unpack_row_t(GGML_TYPE_Q4_1, packed, row, l, out); break;
    case GGML_TYPE_Q5_0: unpack_row_t(GGML_TYPE_Q5_0, packed, row, l, out); break;
    case GGML_TYPE_Q5_1: unpack_row_t(GGML_TYPE_Q5_1, packed, row, l, out); break;
    case GGML_TYPE_Q8_0: unpack_row_t(GGML_TYPE_Q8_0, packed, row, l, out); break;
    case GGML_TYPE_Q4_K: unpack_row_t(GGML_TYPE_Q4_K, packed, row, l, out); break;
    case GGML_TYPE_Q6_K: unpack_row_t(GGML_TYPE_Q6_K, packed, row, l, out); break;
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
    const uint8_t *x;   /* first token (its form for this type) */
    size_t x_stride;    /* bytes per token */
    const struct lay *l;
    __m512i kshift4;    /* log2 of the per-lane bias in S4 groups (see type_kshift) */
    __m512i kshift;     /* the same in S8 and S1 groups (one bias for all lanes) */
    int bias, has_min;
    float *y;           /* y[t * ldy + r] */
    int64_t ldy;
};

/* One group of S steps (the g-th of the row; steps at qo in the input, the
 * weight group at wo in a panel row) for R rows x T tokens. */
static inline __attribute__((always_inline)) void seg_q(const int R, const int T, const int S,
                                                        const struct qtile *a, int64_t g, size_t qo,
                                                        size_t wo, __m512i kshift,
                                                        __m512 facc[TILE_R][TILE_T])
{
    const int64_t ng = a->l->ng;
    const size_t xs_off = a->l->qbytes + 64 * (size_t)g, sxs_off = xs_off + (size_t)ng * 64,
                 sx_off = sxs_off + (size_t)ng * 64;
    const uint8_t *wg = a->w + wo;
    const uint8_t *xg = a->x + qo;
    __m512i acc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m512i b0 = _mm512_setzero_si512();
        if (a->bias)
            b0 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                  _mm512_sllv_epi32(_mm512_load_si512(a->x + t * a->x_stride + sx_off),
                                                    kshift));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = b0;
    }
#pragma GCC unroll 8
    for (int s = 0; s < S; s++) {
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
        __m512 xs = _mm512_load_ps(xt + xs_off);
        __m512 sxs = a->has_min ? _mm512_load_ps(xt + sxs_off) : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *wr = wg + r * a->w_stride;
            facc[r][t] = group_fma(facc[r][t], acc[r][t], _mm512_load_ps(wr + 64 * S), xs,
                                   a->has_min, _mm512_load_ps(wr + 64 * S + 64), sxs);
        }
    }
}

/* R rows x T tokens of unpacked panel, all groups. Loops over r and t are
 * unrolled at each constant (R, T). */
static inline __attribute__((always_inline)) void tile_q(const int R, const int T,
                                                         const struct qtile *a)
{
    const struct lay *l = a->l;
    __m512 facc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    int64_t g = 0;
    size_t qo = 0, wo = 0;
    for (int64_t i = 0; i < l->n8; i++, g++, qo += 512, wo += 640)
        seg_q(R, T, 8, a, g, qo, wo, a->kshift, facc);
    for (int64_t i = 0; i < l->n4; i++, g++, qo += 256, wo += 384)
        seg_q(R, T, 4, a, g, qo, wo, a->kshift4, facc);
    if (l->n1) seg_q(R, T, 1, a, g, qo, wo, a->kshift, facc);
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

/* The form of the input a type reads, and its offset within a token. */
static struct lay input_form(enum ggml_type type, int64_t n_in, size_t *off)
{
    struct lay wide = lay_of(n_in / 32, 1);
    *off = type_wide(type) ? 0 : wide.tbytes;
    return type_wide(type) ? wide : lay_of(n_in / 32, 0);
}

static inline __m512i uniform_kshift(int bias)
{
    return _mm512_set1_epi32(bias > 0 ? __builtin_ctz((unsigned)bias) : 0);
}

static void rows_panel(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0,
                       int64_t r1, uint8_t *panel)
{
    struct wtype wt = wtype_of(w->type);
    size_t xoff;
    const struct lay l = input_form(w->type, in->n_in, &xoff);
    const size_t prow = l.wbytes;
    const uint8_t *xq = in->xq + xoff;
    int64_t tchunk = (int64_t)(TOKEN_BUDGET_BYTES / in->xq_stride) / TILE_T * TILE_T;
    if (tchunk < TILE_T) tchunk = TILE_T;
    for (int64_t c0 = 0; c0 < in->n_tok; c0 += tchunk) {
        int64_t c1 = c0 + tchunk < in->n_tok ? c0 + tchunk : in->n_tok;
        for (int64_t p = r0; p < r1; p += PANEL_ROWS) {
            int64_t rp = r1 - p < PANEL_ROWS ? r1 - p : PANEL_ROWS;
            for (int64_t i = 0; i < rp; i++)
                unpack_row(w->type, w->packed != 0, (const uint8_t *)w->data + (size_t)(p + i) * w->row_bytes, &l,
                           panel + (size_t)i * prow);
            const int64_t n_whole = (c1 - c0) / TILE_T, t_tail = c0 + n_whole * TILE_T;
            for (int64_t i = 0; i < rp; i += TILE_R) {
                int rr = (int)(rp - i < TILE_R ? rp - i : TILE_R);
                struct qtile a = {panel + (size_t)i * prow, prow,
                                  xq + (size_t)c0 * in->xq_stride, in->xq_stride, &l,
                                  type_kshift(w->type, wt.bias), uniform_kshift(wt.bias), wt.bias,
                                  wt.has_min, y + c0 * w->n_out + p + i, w->n_out};
                tile_q_rows(rr, &a, n_whole);
                if (t_tail < c1) {
                    a.x = xq + (size_t)t_tail * in->xq_stride;
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

/* The float step of one group of S steps for T tokens (fused path). */
static inline __attribute__((always_inline)) void fused_group(const int T, const int S,
                                                              const __m512i *st, __m512 dw,
                                                              __m512 mw, int has_min,
                                                              const uint8_t *x0, size_t x_stride,
                                                              size_t qo, size_t meta, size_t ng64,
                                                              const __m512i *start, __m512 *facc)
{
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *xt = x0 + t * x_stride;
        __m512i acc = start[t];
#pragma GCC unroll 8
        for (int s = 0; s < S; s++)
            acc = _mm512_dpbusd_epi32(acc, st[s], _mm512_load_si512(xt + qo + 64 * s));
        __m512 sxs = has_min ? _mm512_load_ps(xt + meta + ng64) : _mm512_setzero_ps();
        facc[t] = group_fma(facc[t], acc, dw, _mm512_load_ps(xt + meta), has_min, mw, sxs);
    }
}

static inline __attribute__((always_inline)) void fused_rows_t(const enum ggml_type type, const int T,
                                                               const struct mm_weight *w,
                                                               const struct mm_input *in,
                                                               int64_t t0, float *y, int64_t r0,
                                                               int64_t r1, void *scratch)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    size_t xoff;
    const struct lay l = input_form(type, in->n_in, &xoff);
    const int64_t ng = l.ng;
    const size_t ng64 = (size_t)ng * 64, sx_off = l.qbytes + 2 * ng64;
    const uint8_t *x0 = in->xq + xoff + (size_t)t0 * in->xq_stride;
    /* The integer start values depend on the token only: computed once,
     * start[g * T + t]. */
    __m512i *start = scratch;
    const __m512i kneg4 = type_kneg(type, wt.bias), kneg = _mm512_set1_epi32(-wt.bias);
    for (int64_t g = 0; g < ng; g++)
        for (int t = 0; t < T; t++) {
            int s4 = g >= l.n8 && g < l.n8 + l.n4;
            start[g * T + t] = wt.bias ? _mm512_mullo_epi32(_mm512_load_si512(x0 + t * in->xq_stride + sx_off + 64 * g),
                                                            s4 ? kneg4 : kneg)
                                       : _mm512_setzero_si512();
        }
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
        const uint8_t *src = row;
        int64_t g = 0;
        size_t qo = 0;
        for (int64_t i = 0; i < l.n8; i++, g++, qo += 512) {
            __m512i st[8];
            __m512 dw, mw;
            wgroup8_any(type, w->packed != 0, src, st, &dw, &mw);
            fused_group(T, 8, st, dw, mw, wt.has_min, x0, in->xq_stride, qo, l.qbytes + 64 * g,
                        ng64, start + g * T, facc);
            src += 16 * wt.block_bytes;
        }
        for (int64_t i = 0; i < l.n4; i++, g++, qo += 256) {
            __m512i st[4];
            __m512 dw, mw;
            wgroup_any(type, src, k_quant ? 8 : i == l.n4 - 1 ? l.last4 : GROUP_BLOCKS, st, &dw, &mw);
            fused_group(T, 4, st, dw, mw, wt.has_min, x0, in->xq_stride, qo, l.qbytes + 64 * g,
                        ng64, start + g * T, facc);
            src = group_src(src, k_quant, wt.block_bytes, 1);
        }
        if (l.n1) {
            __m512i st;
            __m512 dw, mw;
            wgroup1(type, src, l.last1, &st, &dw, &mw);
            fused_group(T, 1, &st, dw, mw, wt.has_min, x0, in->xq_stride, qo, l.qbytes + 64 * g,
                        ng64, start + g * T, facc);
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
    size_t xoff;
    const struct lay l = input_form(w->type, w->n_in, &xoff);
    if (n_tok <= FUSED_T) return (size_t)FUSED_T * (size_t)l.ng * sizeof(__m512i);
    return (size_t)PANEL_ROWS * l.wbytes;
}

static void rows(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0,
                 int64_t r1, void *scratch)
{
    if (!mm_type_is_quantized(w->type)) rows_float(w, in, y, r0, r1);
    else if (in->n_tok <= FUSED_T) rows_fused(w, in, y, r0, r1, scratch);
    else rows_panel(w, in, y, r0, r1, scratch);
}

const struct mm_kernels mm_kernels_avx512 = {"avx512", act_bytes, forms_of, quantize, scratch_bytes, rows, PACK_TAG, packs, pack_rows};
