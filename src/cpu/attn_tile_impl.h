/* attn_tile_impl.h — the parts of the tiled attention kernel (attn.h,
 * attn_tile_avx2.c) that every instruction set shares, included by each
 * attn_tile_<isa>.c after that file defines its own
 *
 *   static void qk_rows(kf, n, hd, hd8, qt, rw, lo, hi, s);
 *   static void softmax_cols(s, rw, v, np, lo, p0, max_pos, cap, inv);  (rows 16v..16v+15)
 *   static void pv_token(vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, G, acc);
 *
 * so that the driver below is compiled once per instruction set against
 * that set's inner loops (C's way of writing a template). Everything here
 * is AVX2; callers compile it with at least -mavx2 -mfma -mf16c.
 *
 * Layout of the scratch, in floats, each region a multiple of 16 floats
 * from a 64-byte aligned start (rw: rows rounded up to 16; hd8: head_dim
 * rounded up to 8; p8: block size rounded up to 8):
 *   qt [hd][rw] scaled queries | np [rw] n_pos per row (int32) | lo [rw]
 *   p_lo per row (int32) | inv [rw]
 *   | acc [rw][hd8] | kf, vf [bs][hd8] widened rows | kt [hd][p8] K
 *   transposed | s1 [G][round8(max_pos) + 8] one token's scores, row-major
 *   | s [round8(max_pos)][rw] scores, position-major | bounce [G][p8] */
#ifndef KVB_ATTN_TILE_IMPL_H
#define KVB_ATTN_TILE_IMPL_H

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/simd_avx2.h"
#include "cpu/attn.h"

static inline int64_t round8(int64_t n) { return (n + 7) & ~(int64_t)7; }
static inline int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

struct tile_buf {
    float *qt, *inv, *acc, *kf, *vf, *kt, *s1, *s, *bounce;
    int32_t *np, *lo;
    int64_t rw;  /* row lanes: n_tok * G rounded up to 16 */
    int64_t ss1; /* row stride of s1 */
};

/* Carves the scratch (NULL base: only measures); returns floats used. */
static inline int64_t tile_carve(struct tile_buf *b, float *base, int32_t n_tok, int32_t G, int32_t hd, int32_t max_pos,
                                 int32_t bs)
{
    const int64_t rw = round16((int64_t)n_tok * G), hd8 = round8(hd), p8 = round8(bs), pm = round8(max_pos);
    int64_t off = 0;
    /* Takes n floats (rounded up to 16) from the scratch. */
#define TAKE(n) (off += round16(n), base ? base + off - round16(n) : NULL)
    b->qt = TAKE(hd * rw);
    b->np = (int32_t *)(void *)TAKE(rw);
    b->lo = (int32_t *)(void *)TAKE(rw);
    b->inv = TAKE(rw);
    b->acc = TAKE(rw * hd8);
    b->kf = TAKE(bs * hd8);
    b->vf = TAKE(bs * hd8);
    b->kt = TAKE(hd * p8);
    b->s1 = TAKE(G * (pm + 8));
    b->s = TAKE(pm * rw);
    b->bounce = TAKE(G * p8);
#undef TAKE
    b->rw = rw;
    b->ss1 = pm + 8;
    return off + 16; /* + room to align the base to 64 bytes */
}

/* A half float broadcast to 8 lanes (F16C's conversion is exact, as
 * kvb_fp16_to_f32 is, and needs no call). */
static inline __m256 bcast_half(uint16_t h) { return _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

/* One q8 group (32 elements) widened: d * q, exact in float as in
 * kv_dequantize_row. */
static inline void widen_q8(float *d, const struct kvq8_group *g)
{
    const __m256 sc = bcast_half(g->d);
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
    {
        const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(g->q + 8 * k));
        _mm256_store_ps(d + 8 * k, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
}

/* One q4 group widened: fma(d, q, m), one rounding as in kv_dequantize_row;
 * elements 0..15 are the low nibbles, 16..31 the high ones. */
static inline void widen_q4(float *d, const struct kvq4_group *g)
{
    const __m256 sc = bcast_half(g->d), mn = bcast_half(g->m);
    const __m256i lo4 = _mm256_set1_epi32(15);
    _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++)
    {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(g->qs + 8 * k)));
        const __m256 ql = _mm256_cvtepi32_ps(_mm256_and_si256(b, lo4));
        const __m256 qh = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
        _mm256_store_ps(d + 8 * k, _mm256_fmadd_ps(sc, ql, mn));
        _mm256_store_ps(d + 16 + 8 * k, _mm256_fmadd_ps(sc, qh, mn));
    }
}

/* Widens rows [0, n) of one block's K or V (one KV head, stored as t; row
 * r at src + r * row_stride words) to f32 rows of hd8 floats, the values
 * kv_dequantize_row gives; dimensions past head_dim are zeroed. A
 * quantized head is whole groups (kv_type_check). */
static void widen_rows(float *dst, const uint16_t *src, int64_t row_stride, int32_t hd, int32_t n, enum kv_type t)
{
    const int32_t hd8 = (int32_t)round8(hd), full = hd & ~7;
    for (int32_t r = 0; r < n; r++) {
        const uint16_t *s = src + (int64_t)r * row_stride;
        float *d = dst + (int64_t)r * hd8;
        if (t == KV_Q8) {
            const struct kvq8_group *g = (const struct kvq8_group *)(const void *)s;
            for (int32_t j = 0; j < hd; j += KV_QGROUP) widen_q8(d + j, g++);
        } else if (t == KV_Q4) {
            const struct kvq4_group *g = (const struct kvq4_group *)(const void *)s;
            for (int32_t j = 0; j < hd; j += KV_QGROUP) widen_q4(d + j, g++);
        } else {
            for (int32_t j = 0; j < full; j += 8) _mm256_store_ps(d + j, LOADH(s + j));
            for (int32_t j = full; j < hd; j++) d[j] = kvb_fp16_to_f32(s[j]);
        }
        for (int32_t j = hd; j < hd8; j++) d[j] = 0.0f;
    }
}

/* Asks for rows [0, n) of a block (one KV head, hb bytes each) ahead of
 * use: a token alone in its blocks has nothing else to hide that latency. */
static inline void prefetch_rows(const uint16_t *src, int64_t row_stride, int64_t hb, int32_t n)
{
    for (int32_t r = 0; r < n; r++)
        for (int64_t j = 0; j < hb; j += 64)
            _mm_prefetch((const char *)(src + (int64_t)r * row_stride) + j, _MM_HINT_T0);
}

/* kt[d][p] = K[p][d] (widened) for p < n, 0 for n <= p < p8, straight from
 * the fp16 rows (WIDE false: src, rows row_stride words apart) or from
 * widened rows (WIDE true: wf, rows row_stride floats apart): 8x8
 * transposes in registers. */
static inline __attribute__((always_inline)) void transpose_impl(const bool WIDE, float *kt, int64_t p8,
                                                                 const uint16_t *src, const float *wf,
                                                                 int64_t row_stride, int32_t n, int32_t hd)
{
    int32_t p0 = 0;
    if (hd % 8 == 0) {
        for (; p0 < n; p0 += 8) /* rows past n read as zeros */
            for (int32_t d0 = 0; d0 < hd; d0 += 8) {
                __m256 r[8], t[8];
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) r[i] =
                    p0 + i >= n ? _mm256_setzero_ps()
                    : WIDE      ? _mm256_load_ps(wf + (int64_t)(p0 + i) * row_stride + d0)
                                : LOADH(src + (int64_t)(p0 + i) * row_stride + d0);
                _Pragma("GCC unroll 4") for (int i = 0; i < 8; i += 2)
                {
                    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
                }
                _Pragma("GCC unroll 2") for (int i = 0; i < 8; i += 4)
                {
                    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
                }
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                {
                    _mm256_store_ps(kt + (d0 + i) * p8 + p0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                    _mm256_store_ps(kt + (d0 + i + 4) * p8 + p0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
                }
            }
    }
    for (int32_t d = 0; d < hd; d++) /* what is left: odd head sizes, and zero padding */
        for (int32_t p = p0; p < p8; p++)
            kt[d * p8 + p] = p >= n ? 0.0f
                             : WIDE ? wf[(int64_t)p * row_stride + d]
                                    : kvb_fp16_to_f32(src[(int64_t)p * row_stride + d]);
}

static void transpose_block(float *kt, int64_t p8, const uint16_t *src, int64_t row_stride, int32_t n, int32_t hd)
{
    transpose_impl(false, kt, p8, src, NULL, row_stride, n, hd);
}

/* The transpose of a block's K for one head, from any KV type: fp16 rows
 * directly, quantized ones through their widening into kf (which no run
 * holds at that point). */
static void transpose_k(const struct tile_buf *b, int64_t p8, const uint16_t *k, const struct attn_kv_view *kv,
                        int32_t n, int32_t hd)
{
    const enum kv_type kt = kv_k_rows(kv->type);
    if (kt == KV_F16) {
        transpose_block(b->kt, p8, k, kv->row_stride, n, hd);
        return;
    }
    widen_rows(b->kf, k, kv->row_stride, hd, n, kt);
    transpose_impl(true, b->kt, p8, NULL, b->kf, round8(hd), n, hd);
}

/* One token's G rows (scaled queries qs, rows hd apart) against a
 * transposed block, 8 positions per vector, positions [0, n). Row r's
 * scores for positions 8c.. go to dst(r, c) (8 floats; only lanes < n - 8c
 * are meaningful). */
static inline __attribute__((always_inline)) void qk_one_impl(const int RG, const float *kt, int64_t p8, int32_t n,
                                                              int32_t hd, const float *qs, int64_t q_ds, float *out,
                                                              int64_t out_rs)
{
    int32_t c = 0;
    for (; 8 * c + 8 < n; c += 2) { /* two position vectors: 2 x RG chains */
        __m256 a[8][2];
        _Pragma("GCC unroll 8") for (int r = 0; r < RG; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 k0 = _mm256_load_ps(kt + d * p8 + 8 * c), k1 = _mm256_load_ps(kt + d * p8 + 8 * c + 8);
            _Pragma("GCC unroll 8") for (int r = 0; r < RG; r++)
            {
                const __m256 q = _mm256_broadcast_ss(qs + r + d * q_ds);
                a[r][0] = _mm256_fmadd_ps(k0, q, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(k1, q, a[r][1]);
            }
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < RG; r++)
        {
            _mm256_store_ps(out + r * out_rs + 8 * c, a[r][0]);
            _mm256_store_ps(out + r * out_rs + 8 * c + 8, a[r][1]);
        }
    }
    for (; 8 * c < n; c++) {
        __m256 a[8];
        _Pragma("GCC unroll 8") for (int r = 0; r < RG; r++) a[r] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 k0 = _mm256_load_ps(kt + d * p8 + 8 * c);
            _Pragma("GCC unroll 8") for (int r = 0; r < RG; r++) a[r] =
                _mm256_fmadd_ps(k0, _mm256_broadcast_ss(qs + r + d * q_ds), a[r]);
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < RG; r++) _mm256_store_ps(out + r * out_rs + 8 * c, a[r]);
    }
}

/* One token's G rows against a transposed block: query (r, d) at
 * qs[r + d * q_ds]; row r's scores at out + r * out_rs, whole vectors of 8
 * positions up to n rounded up (the caller keeps only [0, n)). */
static void qk_one(const float *kt, int64_t p8, int32_t n, int32_t hd, const float *qs, int64_t q_ds, int32_t G,
                   float *out, int64_t out_rs)
{
    for (int32_t r0 = 0; r0 < G; r0 += 6) {
        const int32_t rg = G - r0 < 6 ? G - r0 : 6;
        const float *q = qs + r0;
        float *o = out + r0 * out_rs;
        switch (rg) {
        case 1: qk_one_impl(1, kt, p8, n, hd, q, q_ds, o, out_rs); break;
        case 2: qk_one_impl(2, kt, p8, n, hd, q, q_ds, o, out_rs); break;
        case 3: qk_one_impl(3, kt, p8, n, hd, q, q_ds, o, out_rs); break;
        case 4: qk_one_impl(4, kt, p8, n, hd, q, q_ds, o, out_rs); break;
        case 5: qk_one_impl(5, kt, p8, n, hd, q, q_ds, o, out_rs); break;
        default: qk_one_impl(6, kt, p8, n, hd, q, q_ds, o, out_rs); break;
        }
    }
}

/* Rows of logical block ib that token t reads: [0, n) up to its last
 * position; 0 for a block wholly before its window (never read: under a
 * sliding window the pool may have given it to someone else). Rows of the
 * window's first block that lie before it are read and weighted 0. */
static inline int32_t block_len(const struct attn_tile_tok *t, int32_t ib, int32_t bs)
{
    if ((int64_t)(ib + 1) * bs <= t->p_lo) return 0;
    const int32_t n = t->n_pos - ib * bs;
    return n <= 0 ? 0 : n > bs ? bs : n;
}

/* Tokens [ti, *end) read the same physical block at index ib; returns the
 * longest of their lengths in it. */
static int32_t run_end(const struct attn_tile_tok *toks, int32_t n_tok, int32_t ti, int32_t ib, int32_t bs,
                       int32_t *end)
{
    const int32_t b = toks[ti].table[ib];
    int32_t n = block_len(&toks[ti], ib, bs), tb = ti + 1;
    for (; tb < n_tok; tb++) {
        const int32_t m = block_len(&toks[tb], ib, bs);
        if (m == 0 || toks[tb].table[ib] != b) break;
        if (m > n) n = m;
    }
    *end = tb;
    return n;
}

/* Softmax along one row of scores at positions [lo, n_pos) (positions in
 * lanes; the row has room up to n_pos rounded up to 8), soft-capped first
 * when cap > 0 (attn_softcap's operations). Vectors start at p0, a
 * multiple of 8 at or before lo, so lane k still sums the positions
 * p = k mod 8, as the reference's partials do; positions [p0, lo) count as
 * absent and leave a weight of 0. Returns 1/sum. */
static float softmax_row(float *sc, int32_t p0, int32_t lo, int32_t n_pos, float cap)
{
    const int32_t n8 = (n_pos + 7) & ~7;
    for (int32_t p = n_pos; p < n8; p++) sc[p] = -INFINITY;
    for (int32_t p = p0; p < lo; p++) sc[p] = -INFINITY;
    if (cap > 0) {
        const __m256 c = _mm256_set1_ps(cap);
        for (int32_t p = p0; p < n8; p += 8) {
            const __m256 x = _mm256_load_ps(sc + p);
            const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
            const __m256 y = _mm256_mul_ps(c, tanh256(_mm256_div_ps(x, c)));
            _mm256_store_ps(sc + p, _mm256_blendv_ps(x, y, valid));
        }
    }
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (int32_t p = p0; p < n8; p += 8) mv = _mm256_max_ps(mv, _mm256_load_ps(sc + p));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    mv = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 sum = _mm256_setzero_ps();
    for (int32_t p = p0; p < n8; p += 8) {
        const __m256 x = _mm256_load_ps(sc + p);
        const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_blendv_ps(mv, x, valid), mv)), valid);
        _mm256_store_ps(sc + p, e);
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum256(sum); /* hsum256's tree is the reference's */
}

/* A tile of one token: scores row-major, softmax along rows; nothing is
 * shared, so K goes straight from fp16 into its transpose and V is read
 * in place, with the next block prefetched (quantized rows go through their
 * widening, once per block, the only copy of them there is). */
static void tile_one(const struct attn_tile_tok *t, int32_t G, int32_t hd, const struct attn_kv_view *kv,
                     const struct tile_buf *b)
{
    const int32_t bs = kv->block_size, n_blk = (t->n_pos + bs - 1) / bs, b_lo = t->p_lo / bs;
    const int64_t hd8 = round8(hd), p8 = round8(bs), ss = b->ss1, rw = b->rw;
    const enum kv_type vt = kv_v_rows(kv->type);
    const int64_t kb = kv_row_bytes(kv_k_rows(kv->type), hd), vb = kv_row_bytes(vt, hd);
    const int64_t vrs = kv->v_row_stride ? kv->v_row_stride : kv->row_stride;
    for (int32_t ib = b_lo; ib < n_blk; ib++) {
        const int32_t n = block_len(t, ib, bs);
        if (ib + 1 < n_blk)
            prefetch_rows(kv->k_base + (int64_t)t->table[ib + 1] * kv->block_stride, kv->row_stride, kb,
                          block_len(t, ib + 1, bs));
        transpose_k(b, p8, kv->k_base + (int64_t)t->table[ib] * kv->block_stride, kv, n, hd);
        if (bs % 8 == 0) {
            qk_one(b->kt, p8, n, hd, b->qt, rw, G, b->s1 + (int64_t)ib * bs, ss);
        } else { /* vectors would straddle blocks: go through a bounce row */
            qk_one(b->kt, p8, n, hd, b->qt, rw, G, b->bounce, p8);
            for (int32_t r = 0; r < G; r++)
                for (int32_t p = 0; p < n; p++) b->s1[r * ss + (int64_t)ib * bs + p] = b->bounce[r * p8 + p];
        }
    }
    /* From the window's first block on, every weight P.V reads is set. */
    const int32_t p0 = (b_lo * bs) & ~7;
    for (int32_t r = 0; r < G; r++) b->inv[r] = softmax_row(b->s1 + r * ss, p0, t->p_lo, t->n_pos, kv->softcap);
    for (int32_t ib = b_lo; ib < n_blk; ib++) {
        const int32_t n = block_len(t, ib, bs);
        const uint16_t *v = kv->v_base + (int64_t)t->table[ib] * kv->block_stride;
        if (ib + 1 < n_blk)
            prefetch_rows(kv->v_base + (int64_t)t->table[ib + 1] * kv->block_stride, vrs, vb, block_len(t, ib + 1, bs));
        if (vt == KV_F16 && hd % 8 == 0) {
            pv_token(NULL, v, vrs, n, hd8, b->s1 + (int64_t)ib * bs, 1, ss, G, b->acc);
        } else {
            widen_rows(b->vf, v, vrs, hd, n, vt);
            pv_token(b->vf, NULL, 0, n, hd8, b->s1 + (int64_t)ib * bs, 1, ss, G, b->acc);
        }
    }
}

/* The whole tile: set up, scores, softmax, P.V, output. */
static void tile_run(const struct attn_tile_tok *toks, int32_t n_tok, int32_t G, int32_t hd,
                     const struct attn_kv_view *kv, float scale, float *scratch)
{
    const int32_t bs = kv->block_size;
    int32_t max_pos = 0;
    for (int32_t ti = 0; ti < n_tok; ti++)
        if (toks[ti].n_pos > max_pos) max_pos = toks[ti].n_pos;
    struct tile_buf b;
    tile_carve(&b, (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63), n_tok, G, hd, max_pos, bs);
    const int64_t R = (int64_t)n_tok * G, rw = b.rw, hd8 = round8(hd), p8 = round8(bs);
    /* Where the softmax starts: the first block any token reads, rounded
     * down to a vector of 8 (see softmax_row). */
    int32_t p_start = max_pos;
    for (int32_t ti = 0; ti < n_tok; ti++) {
        const int32_t s0 = (toks[ti].p_lo / bs * bs) & ~7;
        if (s0 < p_start) p_start = s0;
    }

    for (int64_t r = 0; r < rw; r++) {
        float *dst = b.qt + r;
        if (r >= R) {
            b.np[r] = 0;
            b.lo[r] = 0;
            for (int32_t d = 0; d < hd; d++) dst[d * rw] = 0.0f;
            continue;
        }
        const struct attn_tile_tok *t = &toks[r / G];
        const float *src = t->q + (r % G) * hd;
        b.np[r] = t->n_pos;
        b.lo[r] = t->p_lo;
        for (int32_t d = 0; d < hd; d++) dst[d * rw] = src[d] * scale;
    }
    for (int64_t i = 0; i < rw * hd8; i++) b.acc[i] = 0.0f;

    if (n_tok == 1) {
        tile_one(&toks[0], G, hd, kv, &b);
    } else {
        const int32_t n_blk = (max_pos + bs - 1) / bs;
        /* Scores. Block ib's positions go to rows ib*bs.. of S. Runs of
         * several tokens put rows in lanes; a token alone in its block puts
         * positions in lanes and scatters into S. */
        _Alignas(32) float tmp[8 * 8];
        for (int32_t ib = 0; ib < n_blk; ib++) {
            float *sb = b.s + (int64_t)ib * bs * rw;
            for (int32_t ti = 0, tb; ti < n_tok; ti = tb) {
                if (block_len(&toks[ti], ib, bs) == 0) {
                    tb = ti + 1;
                    continue;
                }
                const int32_t n = run_end(toks, n_tok, ti, ib, bs, &tb);
                const uint16_t *k = kv->k_base + (int64_t)toks[ti].table[ib] * kv->block_stride;
                if (tb - ti > 1) {
                    widen_rows(b.kf, k, kv->row_stride, hd, n, kv_k_rows(kv->type));
                    qk_rows(b.kf, n, hd, hd8, b.qt, rw, (int64_t)ti * G, (int64_t)tb * G, sb);
                    continue;
                }
                transpose_k(&b, p8, k, kv, n, hd);
                for (int32_t r0 = 0; r0 < G; r0 += 8) {
                    const int32_t rg = G - r0 < 8 ? G - r0 : 8;
                    for (int32_t c = 0; 8 * c < n; c++) {
                        /* one vector of positions per row, via a bounce buffer */
                        qk_one(b.kt + 8 * c, p8, n - 8 * c < 8 ? n - 8 * c : 8, hd, b.qt + (int64_t)ti * G + r0, rw, rg,
                               tmp, 8);
                        for (int32_t r = 0; r < rg; r++)
                            for (int32_t p = 8 * c; p < n && p < 8 * c + 8; p++)
                                sb[p * rw + (int64_t)ti * G + r0 + r] = tmp[r * 8 + p - 8 * c];
                    }
                }
            }
        }
        for (int64_t v = 0; v < rw / 16; v++)
            softmax_cols(b.s, rw, v, b.np, b.lo, p_start, max_pos, kv->softcap, b.inv);

        /* P.V, runs again sharing one widened V block; each token over its
         * own positions, in ascending order across blocks. */
        for (int32_t ib = 0; ib < n_blk; ib++) {
            for (int32_t ti = 0, tb; ti < n_tok; ti = tb) {
                if (block_len(&toks[ti], ib, bs) == 0) {
                    tb = ti + 1;
                    continue;
                }
                const int32_t n = run_end(toks, n_tok, ti, ib, bs, &tb);
                const uint16_t *v = kv->v_base + (int64_t)toks[ti].table[ib] * kv->block_stride;
                /* read once: no point widening (fp16 rows load widened) */
                const enum kv_type vt = kv_v_rows(kv->type);
                const int64_t vrs = kv->v_row_stride ? kv->v_row_stride : kv->row_stride;
                const bool direct = tb - ti == 1 && hd % 8 == 0 && vt == KV_F16;
                if (!direct) widen_rows(b.vf, v, vrs, hd, n, vt);
                /* Consecutive tokens with as many positions here go as one
                 * block of rows: each V vector loaded then feeds them all. */
                for (int32_t t = ti, te; t < tb; t = te) {
                    const int32_t m = block_len(&toks[t], ib, bs);
                    for (te = t + 1; te < tb && block_len(&toks[te], ib, bs) == m;) te++;
                    pv_token(direct ? NULL : b.vf, direct ? v : NULL, vrs, m, hd8,
                             b.s + (int64_t)ib * bs * rw + (int64_t)t * G, rw, 1, (te - t) * G,
                             b.acc + (int64_t)t * G * hd8);
                }
            }
        }
    }

    for (int64_t r = 0; r < R; r++) {
        float *out = toks[r / G].out + (r % G) * hd;
        const float iv = b.inv[r];
        for (int32_t d = 0; d < hd; d++) out[d] = b.acc[r * hd8 + d] * iv;
    }
}

#endif
