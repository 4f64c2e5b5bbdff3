/* attn_tile_avx2.c — attention for a tile of query tokens over one KV head
 * (declared in attn.h). Compiled with -mavx2 -mfma -mf16c.
 *
 * Two ideas:
 *
 * 1. Rows in lanes. Each query row (token, head) is computed by the fixed
 *    scalar sequence attn_head documents; the SIMD code runs 8 such rows
 *    side by side, one per lane (scores, softmax), or 8 head dimensions of
 *    one row side by side (P.V). No reduction ever crosses lanes, so a row's
 *    result cannot depend on which rows share its vector, i.e. on the batch
 *    — and it equals the scalar reference bit for bit.
 *
 * 2. Shared blocks are read once. Tokens of a tile that use the same KV
 *    block at the same logical index (a shared prompt prefix, or the tokens
 *    of one prefill chunk) form a run; the block's rows are widened from
 *    fp16 once for the run into an L1-resident buffer, and every row of the
 *    run is computed from it. Token by token, a decode step of 32 requests
 *    over one system prompt would fetch that prompt's K/V 32 times.
 *
 * Scores live position-major, S[p][row], so that max, exp and sum over a
 * row's positions are plain element-wise vector ops down the column.
 *
 * A token alone in its block (a request's own tail, or a whole batch-1
 * decode) would fill 3 of 8 lanes that way, so its scores are computed the
 * other way round, positions in lanes, from the block's K transposed; the
 * arithmetic per score is the same fma chain, so nothing changes but speed.
 * A tile of one token keeps its scores row-major and does its softmax along
 * the row, 8 positions per vector: the reference's 8 interleaved partial
 * sums are exactly the lanes. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "attn.h"
#include "dtype.h"
#include "simd_avx2.h"

static int64_t round8(int64_t n) { return (n + 7) & ~(int64_t)7; }

int64_t attn_tile_scratch_floats(int32_t n_tok, int32_t group, int32_t head_dim, int32_t max_pos,
                                 int32_t block_size)
{
    const int64_t rw = round8((int64_t)n_tok * group), hd8 = round8(head_dim);
    return (int64_t)head_dim * rw        /* Qt: scaled queries, [d][row] */
           + rw                          /* n_pos per row (int32) */
           + rw                          /* 1 / sum per row */
           + rw * hd8                    /* P.V accumulators, [row][d] */
           + 2 * (int64_t)block_size * hd8 /* widened K and V rows */
           + (int64_t)head_dim * round8(block_size) /* K transposed, [d][p] */
           + (int64_t)group * (round8(max_pos) + 8) /* one token's scores, [row][p] */
           + (int64_t)group * round8(block_size)  /* bounce rows for odd block sizes */
           + round8(max_pos) * rw        /* scores / weights, [p][row] */
           + 8 * 8;                      /* alignment slack */
}

/* Widens rows [0, n) of one block's K or V (one KV head) to f32 rows of
 * hd8 floats; dimensions past head_dim are zeroed. */
static void widen_rows(float *dst, const uint16_t *src, int64_t row_stride, int32_t hd, int32_t n)
{
    const int32_t hd8 = (int32_t)round8(hd), full = hd & ~7;
    for (int32_t r = 0; r < n; r++) {
        const uint16_t *s = src + (int64_t)r * row_stride;
        float *d = dst + (int64_t)r * hd8;
        for (int32_t j = 0; j < full; j += 8) _mm256_store_ps(d + j, LOADH(s + j));
        for (int32_t j = full; j < hd; j++) d[j] = kvb_fp16_to_f32(s[j]);
        for (int32_t j = hd; j < hd8; j++) d[j] = 0.0f;
    }
}

/* Asks for rows [0, n) of a block (one KV head, hd halves each) ahead of
 * use: a token alone in its blocks has nothing else to hide that latency. */
static inline void prefetch_rows(const uint16_t *src, int64_t row_stride, int32_t hd, int32_t n)
{
    for (int32_t r = 0; r < n; r++)
        for (int32_t j = 0; j < hd; j += 32) _mm_prefetch((const char *)(src + (int64_t)r * row_stride + j), _MM_HINT_T0);
}

/* kt[d][p] = K[p][d] (widened) for p < n, 0 for n <= p < p8, straight from
 * the fp16 rows: 8x8 transposes in registers. */
static void transpose_block(float *kt, int64_t p8, const uint16_t *src, int64_t row_stride, int32_t n, int32_t hd)
{
    int32_t p0 = 0;
    if (hd % 8 == 0) {
        for (; p0 + 8 <= n; p0 += 8)
            for (int32_t d0 = 0; d0 < hd; d0 += 8) {
                __m256 r[8], t[8];
                _Pragma("GCC unroll 8")
                for (int i = 0; i < 8; i++) r[i] = LOADH(src + (int64_t)(p0 + i) * row_stride + d0);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < 8; i += 2) {
                    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
                }
                _Pragma("GCC unroll 2")
                for (int i = 0; i < 8; i += 4) {
                    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
                }
                _Pragma("GCC unroll 4")
                for (int i = 0; i < 4; i++) {
                    _mm256_store_ps(kt + (d0 + i) * p8 + p0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                    _mm256_store_ps(kt + (d0 + i + 4) * p8 + p0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
                }
            }
    }
    for (int32_t d = 0; d < hd; d++)
        for (int32_t p = p0; p < p8; p++) kt[d * p8 + p] = p < n ? kvb_fp16_to_f32(src[(int64_t)p * row_stride + d]) : 0.0f;
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
        _Pragma("GCC unroll 8")
        for (int r = 0; r < RG; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 k0 = _mm256_load_ps(kt + d * p8 + 8 * c), k1 = _mm256_load_ps(kt + d * p8 + 8 * c + 8);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < RG; r++) {
                const __m256 q = _mm256_broadcast_ss(qs + r + d * q_ds);
                a[r][0] = _mm256_fmadd_ps(k0, q, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(k1, q, a[r][1]);
            }
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < RG; r++) {
            _mm256_store_ps(out + r * out_rs + 8 * c, a[r][0]);
            _mm256_store_ps(out + r * out_rs + 8 * c + 8, a[r][1]);
        }
    }
    for (; 8 * c < n; c++) {
        __m256 a[8];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < RG; r++) a[r] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 k0 = _mm256_load_ps(kt + d * p8 + 8 * c);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < RG; r++) a[r] = _mm256_fmadd_ps(k0, _mm256_broadcast_ss(qs + r + d * q_ds), a[r]);
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < RG; r++) _mm256_store_ps(out + r * out_rs + 8 * c, a[r]);
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

/* Lanes of row vector v (rows 8v..8v+7) that fall in [lo, hi). */
static inline __m256 lane_mask(int64_t v, int64_t lo, int64_t hi)
{
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(8 * v)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i ge = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32((int32_t)lo - 1));
    const __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)hi), lane);
    return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

/* Scores of NV row vectors (starting at v0) for positions [0, n) of one
 * widened K block, PU positions at a time: s = fma(k[d], q[d], s) over d in
 * order. Stores only the lanes of rows [lo, hi) (neighbouring lanes may
 * belong to tokens reading another block here). */
static inline __attribute__((always_inline)) void qk_impl(const int NV, const int PU, const float *kf, int32_t n,
                                                          int32_t hd, int64_t hd8, const float *qt, int64_t rw,
                                                          int64_t v0, int64_t lo, int64_t hi, float *s)
{
    __m256 mask[8];
    _Pragma("GCC unroll 8")
    for (int v = 0; v < NV; v++) mask[v] = lane_mask(v0 + v, lo, hi);
    int32_t p = 0;
    for (; p + PU <= n; p += PU) {
        __m256 acc[8][8];
        _Pragma("GCC unroll 8")
        for (int u = 0; u < PU; u++)
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[u][v] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            __m256 k[8];
            _Pragma("GCC unroll 8")
            for (int u = 0; u < PU; u++) k[u] = _mm256_broadcast_ss(kf + (p + u) * hd8 + d);
            _Pragma("GCC unroll 8")
            for (int v = 0; v < NV; v++) {
                const __m256 q = _mm256_load_ps(qt + d * rw + (v0 + v) * 8);
                _Pragma("GCC unroll 8")
                for (int u = 0; u < PU; u++) acc[u][v] = _mm256_fmadd_ps(k[u], q, acc[u][v]);
            }
        }
        _Pragma("GCC unroll 8")
        for (int u = 0; u < PU; u++)
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) {
                float *dst = s + (int64_t)(p + u) * rw + (v0 + v) * 8;
                _mm256_store_ps(dst, _mm256_blendv_ps(_mm256_load_ps(dst), acc[u][v], mask[v]));
            }
    }
    for (; p < n; p++) {
        __m256 acc[8];
        _Pragma("GCC unroll 8")
        for (int v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 k = _mm256_broadcast_ss(kf + p * hd8 + d);
            _Pragma("GCC unroll 8")
            for (int v = 0; v < NV; v++) acc[v] = _mm256_fmadd_ps(k, _mm256_load_ps(qt + d * rw + (v0 + v) * 8), acc[v]);
        }
        _Pragma("GCC unroll 8")
        for (int v = 0; v < NV; v++) {
            float *dst = s + (int64_t)p * rw + (v0 + v) * 8;
            _mm256_store_ps(dst, _mm256_blendv_ps(_mm256_load_ps(dst), acc[v], mask[v]));
        }
    }
}

/* Rows [lo, hi) against one widened K block, positions [0, n). */
static void qk_rows(const float *kf, int32_t n, int32_t hd, int64_t hd8, const float *qt, int64_t rw, int64_t lo,
                    int64_t hi, float *s)
{
    /* NV x PU accumulators + PU broadcasts + 1 query vector <= 16 registers,
     * with enough independent FMA chains (>= 8) to hide their latency. */
    for (int64_t v0 = lo / 8, v1 = (hi + 7) / 8; v0 < v1; v0 += 6) {
        const int64_t nv = v1 - v0 < 6 ? v1 - v0 : 6;
        switch (nv) {
        case 1: qk_impl(1, 7, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        case 2: qk_impl(2, 5, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        case 3: qk_impl(3, 3, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        case 4: qk_impl(4, 3, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        case 5: qk_impl(5, 2, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        default: qk_impl(6, 2, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        }
    }
}

/* acc[r][d] = fma(w(p, r), v[p][d], acc[r][d]) for p in [0, n), for the
 * R rows r0..r0+R-1 of one token, SL vectors of d at a time; the weight of
 * (p, r) is at w[p * w_ps + r * w_rs]. */
static inline __attribute__((always_inline)) void pv_impl(const int R, const int SL, const float *vf,
                                                          const uint16_t *vh, int64_t vh_rs, int32_t n, int64_t hd8,
                                                          const float *w, int64_t w_ps, int64_t w_rs, float *acc)
{
    /* V rows come widened (vf, rows hd8 apart) or, read once, straight
     * from the fp16 pool (vh, rows vh_rs apart; needs head_dim % 8 == 0). */
#define VROW(p, off) (vh ? LOADH(vh + (p) * vh_rs + (off)) : _mm256_load_ps(vf + (p) * hd8 + (off)))
    for (int64_t j0 = 0; j0 < hd8; j0 += 8 * SL) {
        const int js = (int)((hd8 - j0) / 8 < SL ? (hd8 - j0) / 8 : SL);
        if (js == SL) {
            __m256 a[8][8];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++)
                _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++) a[r][j] = _mm256_load_ps(acc + r * hd8 + j0 + 8 * j);
            for (int32_t p = 0; p < n; p++) {
                __m256 wv[8];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) wv[r] = _mm256_broadcast_ss(w + p * w_ps + r * w_rs);
                _Pragma("GCC unroll 8")
                for (int j = 0; j < SL; j++) {
                    const __m256 x = VROW(p, j0 + 8 * j);
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < R; r++) a[r][j] = _mm256_fmadd_ps(wv[r], x, a[r][j]);
                }
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++)
                _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++) _mm256_store_ps(acc + r * hd8 + j0 + 8 * j, a[r][j]);
        } else {
            for (int j = 0; j < js; j++) {
                __m256 a[8];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) a[r] = _mm256_load_ps(acc + r * hd8 + j0 + 8 * j);
                for (int32_t p = 0; p < n; p++) {
                    const __m256 x = VROW(p, j0 + 8 * j);
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + p * w_ps + r * w_rs), x, a[r]);
                }
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) _mm256_store_ps(acc + r * hd8 + j0 + 8 * j, a[r]);
            }
        }
    }
}

#undef VROW

/* All G rows of one token (acc: G rows of hd8), in register-sized chunks. */
static void pv_token(const float *vf, const uint16_t *vh, int64_t vh_rs, int32_t n, int64_t hd8, const float *w,
                     int64_t w_ps, int64_t w_rs, int32_t G, float *acc)
{
    while (G > 0) {
        const int R = G < 4 ? G : 4;
        switch (R) {
        case 1: pv_impl(1, 8, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 2: pv_impl(2, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 3: pv_impl(3, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        default: pv_impl(4, 2, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        }
        acc += R * hd8;
        w += R * w_rs;
        G -= R;
    }
}

/* Valid positions of token t in logical block ib. */
static inline int32_t block_len(const struct attn_tile_tok *t, int32_t ib, int32_t bs)
{
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

/* The tree the reference sums its 8 partials with (attn.h). */
static inline __m256 tree8_lanes(const __m256 p[8])
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[4]), _mm256_add_ps(p[2], p[6])),
                         _mm256_add_ps(_mm256_add_ps(p[1], p[5]), _mm256_add_ps(p[3], p[7])));
}

/* Softmax down the columns of S[p][rw] for row vector v (rows in lanes),
 * each lane over its own n_pos; leaves weights in S, 1/sum in inv. */
static void softmax_cols(float *s, int64_t rw, int64_t v, const int32_t *np, int32_t max_pos, float *inv)
{
    const __m256i npv = _mm256_load_si256((const __m256i *)(const void *)(np + 8 * v));
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int32_t p = 0; p < max_pos; p++) {
        const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(npv, _mm256_set1_epi32(p)));
        m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_load_ps(s + p * rw + 8 * v), valid));
    }
    __m256 part[8];
    for (int k = 0; k < 8; k++) part[k] = _mm256_setzero_ps();
    for (int32_t p0 = 0; p0 < max_pos; p0 += 8) {
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 8; k++) {
            const int32_t p = p0 + k;
            if (p >= max_pos) break;
            const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(npv, _mm256_set1_epi32(p)));
            float *sp = s + p * rw + 8 * v;
            /* Invalid lanes go through exp(0), never through garbage. */
            const __m256 x = _mm256_blendv_ps(m, _mm256_load_ps(sp), valid);
            const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(x, m)), valid);
            _mm256_store_ps(sp, e);
            part[k] = _mm256_add_ps(part[k], e);
        }
    }
    _mm256_store_ps(inv + 8 * v, _mm256_div_ps(_mm256_set1_ps(1.0f), tree8_lanes(part)));
}

/* Softmax along one row of n_pos scores (positions in lanes; the row has
 * room up to n_pos rounded up to 8). Returns 1/sum. */
static float softmax_row(float *sc, int32_t n_pos)
{
    const int32_t n8 = (n_pos + 7) & ~7;
    for (int32_t p = n_pos; p < n8; p++) sc[p] = -INFINITY;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (int32_t p = 0; p < n8; p += 8) mv = _mm256_max_ps(mv, _mm256_load_ps(sc + p));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    mv = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 sum = _mm256_setzero_ps();
    for (int32_t p = 0; p < n8; p += 8) {
        const __m256 x = _mm256_load_ps(sc + p);
        const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_blendv_ps(mv, x, valid), mv)), valid);
        _mm256_store_ps(sc + p, e);
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum256(sum); /* hsum256's tree is the reference's */
}

struct tile_buf {
    float *qt;   /* [d][rw] scaled queries */
    int32_t *np; /* [rw] n_pos per row */
    float *inv;  /* [rw] */
    float *acc;  /* [rw][hd8] */
    float *kf, *vf; /* [bs][hd8] */
    float *kt;   /* [hd][p8] */
    float *s1;   /* [G][round8(max_pos) + 8]: one token's scores */
    float *s;    /* [round8(max_pos)][rw] */
    float *bounce; /* [G][p8] */
};

/* A tile of one token: scores row-major, softmax along rows; nothing is
 * shared, so K goes straight from fp16 into its transpose and V is read
 * in place, with the next block prefetched. */
static void tile_one(const struct attn_tile_tok *t, int32_t G, int32_t hd, const struct attn_kv_view *kv,
                     const struct tile_buf *b, int64_t rw)
{
    const int32_t bs = kv->block_size, n_blk = (t->n_pos + bs - 1) / bs;
    const int64_t hd8 = round8(hd), p8 = round8(bs), ss = round8(t->n_pos) + 8;
    for (int32_t ib = 0; ib < n_blk; ib++) {
        const int32_t n = block_len(t, ib, bs);
        if (ib + 1 < n_blk)
            prefetch_rows(kv->k_base + (int64_t)t->table[ib + 1] * kv->block_stride, kv->row_stride, hd,
                          block_len(t, ib + 1, bs));
        transpose_block(b->kt, p8, kv->k_base + (int64_t)t->table[ib] * kv->block_stride, kv->row_stride, n, hd);
        if (bs % 8 == 0) {
            qk_one(b->kt, p8, n, hd, b->qt, rw, G, b->s1 + (int64_t)ib * bs, ss);
        } else { /* vectors would straddle blocks: go through a bounce row */
            qk_one(b->kt, p8, n, hd, b->qt, rw, G, b->bounce, p8);
            for (int32_t r = 0; r < G; r++)
                for (int32_t p = 0; p < n; p++) b->s1[r * ss + (int64_t)ib * bs + p] = b->bounce[r * p8 + p];
        }
    }
    for (int32_t r = 0; r < G; r++) b->inv[r] = softmax_row(b->s1 + r * ss, t->n_pos);
    for (int32_t ib = 0; ib < n_blk; ib++) {
        const int32_t n = block_len(t, ib, bs);
        const uint16_t *v = kv->v_base + (int64_t)t->table[ib] * kv->block_stride;
        if (ib + 1 < n_blk)
            prefetch_rows(kv->v_base + (int64_t)t->table[ib + 1] * kv->block_stride, kv->row_stride, hd,
                          block_len(t, ib + 1, bs));
        if (hd % 8 == 0) {
            pv_token(NULL, v, kv->row_stride, n, hd8, b->s1 + (int64_t)ib * bs, 1, ss, G, b->acc);
        } else {
            widen_rows(b->vf, v, kv->row_stride, hd, n);
            pv_token(b->vf, NULL, 0, n, hd8, b->s1 + (int64_t)ib * bs, 1, ss, G, b->acc);
        }
    }
}

void attn_tile_avx2(const struct attn_tile_tok *toks, int32_t n_tok, int32_t group, int32_t head_dim,
                    const struct attn_kv_view *kv, float scale, float *scratch)
{
    const int32_t G = group, hd = head_dim, bs = kv->block_size;
    const int64_t R = (int64_t)n_tok * G, rw = round8(R), hd8 = round8(hd), p8 = round8(bs);
    int32_t max_pos = 0;
    for (int32_t ti = 0; ti < n_tok; ti++)
        if (toks[ti].n_pos > max_pos) max_pos = toks[ti].n_pos;

    struct tile_buf b;
    b.qt = (float *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31);
    b.np = (int32_t *)(b.qt + hd * rw);
    b.inv = (float *)b.np + rw;
    b.acc = b.inv + rw;
    b.kf = b.acc + rw * hd8;
    b.vf = b.kf + (int64_t)bs * hd8;
    b.kt = b.vf + (int64_t)bs * hd8;
    b.s1 = b.kt + hd * p8;
    b.s = b.s1 + (int64_t)G * (round8(max_pos) + 8);
    b.bounce = b.s + round8(max_pos) * rw;

    for (int64_t r = 0; r < rw; r++) {
        const struct attn_tile_tok *t = r < R ? &toks[r / G] : NULL;
        b.np[r] = t ? t->n_pos : 0;
        for (int32_t d = 0; d < hd; d++) b.qt[d * rw + r] = t ? t->q[(r % G) * hd + d] * scale : 0.0f;
    }
    for (int64_t i = 0; i < rw * hd8; i++) b.acc[i] = 0.0f;

    if (n_tok == 1) {
        tile_one(&toks[0], G, hd, kv, &b, rw);
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
                    widen_rows(b.kf, k, kv->row_stride, hd, n);
                    qk_rows(b.kf, n, hd, hd8, b.qt, rw, (int64_t)ti * G, (int64_t)tb * G, sb);
                    continue;
                }
                transpose_block(b.kt, p8, k, kv->row_stride, n, hd);
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
        for (int64_t v = 0; v < rw / 8; v++) softmax_cols(b.s, rw, v, b.np, max_pos, b.inv);

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
                const bool direct = tb - ti == 1 && hd % 8 == 0; /* read once: no point widening */
                if (!direct) widen_rows(b.vf, v, kv->row_stride, hd, n);
                for (int32_t t = ti; t < tb; t++)
                    pv_token(direct ? NULL : b.vf, direct ? v : NULL, kv->row_stride, block_len(&toks[t], ib, bs), hd8,
                             b.s + (int64_t)ib * bs * rw + (int64_t)t * G, rw, 1, G, b.acc + (int64_t)t * G * hd8);
            }
        }
    }

    for (int64_t r = 0; r < R; r++) {
        float *out = toks[r / G].out + (r % G) * hd;
        const float iv = b.inv[r];
        for (int32_t d = 0; d < hd; d++) out[d] = b.acc[r * hd8 + d] * iv;
    }
}
