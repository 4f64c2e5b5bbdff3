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
#include <stdint.h>

#include "base/simd_avx2.h"
#include "cpu/attn.h"

/* Lanes of row vector v (rows 8v..8v+7) that fall in [lo, hi). */
static inline __m256 lane_mask(int64_t v, int64_t lo, int64_t hi)
{
    const __m256i lane =
        _mm256_add_epi32(_mm256_set1_epi32((int32_t)(8 * v)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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
    _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) mask[v] = lane_mask(v0 + v, lo, hi);
    int32_t p = 0;
    for (; p + PU <= n; p += PU) {
        __m256 acc[8][8];
        _Pragma("GCC unroll 8") for (int u = 0; u < PU; u++) _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)
            acc[u][v] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            __m256 k[8];
            _Pragma("GCC unroll 8") for (int u = 0; u < PU; u++) k[u] = _mm256_broadcast_ss(kf + (p + u) * hd8 + d);
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)
            {
                const __m256 q = _mm256_load_ps(qt + d * rw + (v0 + v) * 8);
                _Pragma("GCC unroll 8") for (int u = 0; u < PU; u++) acc[u][v] = _mm256_fmadd_ps(k[u], q, acc[u][v]);
            }
        }
        _Pragma("GCC unroll 8") for (int u = 0; u < PU; u++) _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)
        {
            float *dst = s + (int64_t)(p + u) * rw + (v0 + v) * 8;
            _mm256_store_ps(dst, _mm256_blendv_ps(_mm256_load_ps(dst), acc[u][v], mask[v]));
        }
    }
    for (; p < n; p++) {
        __m256 acc[8];
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m256 k = _mm256_broadcast_ss(kf + p * hd8 + d);
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[v] =
                _mm256_fmadd_ps(k, _mm256_load_ps(qt + d * rw + (v0 + v) * 8), acc[v]);
        }
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)
        {
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
#define VROW(p, off) (vh ? LOADH(vh + (p)*vh_rs + (off)) : _mm256_load_ps(vf + (p)*hd8 + (off)))
    for (int64_t j0 = 0; j0 < hd8; j0 += 8 * SL) {
        const int js = (int)((hd8 - j0) / 8 < SL ? (hd8 - j0) / 8 : SL);
        if (js == SL) {
            __m256 a[8][8];
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++)
                a[r][j] = _mm256_load_ps(acc + r * hd8 + j0 + 8 * j);
            for (int32_t p = 0; p < n; p++) {
                __m256 wv[8];
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) wv[r] =
                    _mm256_broadcast_ss(w + p * w_ps + r * w_rs);
                _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++)
                {
                    const __m256 x = VROW(p, j0 + 8 * j);
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r][j] = _mm256_fmadd_ps(wv[r], x, a[r][j]);
                }
            }
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++)
                _mm256_store_ps(acc + r * hd8 + j0 + 8 * j, a[r][j]);
        } else {
            for (int j = 0; j < js; j++) {
                __m256 a[8];
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r] = _mm256_load_ps(acc + r * hd8 + j0 + 8 * j);
                for (int32_t p = 0; p < n; p++) {
                    const __m256 x = VROW(p, j0 + 8 * j);
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r] =
                        _mm256_fmadd_ps(_mm256_broadcast_ss(w + p * w_ps + r * w_rs), x, a[r]);
                }
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _mm256_store_ps(acc + r * hd8 + j0 + 8 * j, a[r]);
            }
        }
    }
}

#undef VROW

/* G rows (acc: G rows of hd8; rows of consecutive tokens may come
 * together), in chunks of 3 rows x 4 vectors: 12 accumulators, 3 weights
 * and a V vector fill the 16 registers. */
static void pv_token(const float *vf, const uint16_t *vh, int64_t vh_rs, int32_t n, int64_t hd8, const float *w,
                     int64_t w_ps, int64_t w_rs, int32_t G, float *acc)
{
    while (G > 0) {
        const int R = G < 3 ? G : 3;
        switch (R) {
        case 1: pv_impl(1, 8, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 2: pv_impl(2, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        default: pv_impl(3, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        }
        acc += R * hd8;
        w += R * w_rs;
        G -= R;
    }
}

/* The tree the reference sums its 8 partials with (attn.h). */
static inline __m256 tree8_lanes(const __m256 p[8])
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[4]), _mm256_add_ps(p[2], p[6])),
                         _mm256_add_ps(_mm256_add_ps(p[1], p[5]), _mm256_add_ps(p[3], p[7])));
}

/* Softmax down the columns of S[p][rw] for rows 16v..16v+15 (rows in
 * lanes), each lane over its own positions [lo, np), soft-capped first when
 * cap > 0 (in place, attn_softcap's operations); positions from p0 (a
 * multiple of 8 no later than any lane's first block) on get their weight,
 * 0 outside a lane's range. Leaves weights in S, 1/sum in inv. */
static void softmax_cols8(float *s, int64_t rw, int64_t v, const int32_t *np, const int32_t *lo, int32_t p0,
                          int32_t max_pos, float cap, float *inv);
static void softmax_cols(float *s, int64_t rw, int64_t v, const int32_t *np, const int32_t *lo, int32_t p0,
                         int32_t max_pos, float cap, float *inv)
{
    softmax_cols8(s, rw, 2 * v, np, lo, p0, max_pos, cap, inv);
    softmax_cols8(s, rw, 2 * v + 1, np, lo, p0, max_pos, cap, inv);
}

/* Lanes whose range [lo, np) holds position p. */
static inline __m256 valid8(__m256i npv, __m256i lov, int32_t p)
{
    const __m256i pv = _mm256_set1_epi32(p);
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(lov, pv), _mm256_cmpgt_epi32(npv, pv)));
}

static void softmax_cols8(float *s, int64_t rw, int64_t v, const int32_t *np, const int32_t *lo, int32_t p0,
                          int32_t max_pos, float cap, float *inv)
{
    const __m256i npv = _mm256_load_si256((const __m256i *)(const void *)(np + 8 * v));
    const __m256i lov = _mm256_load_si256((const __m256i *)(const void *)(lo + 8 * v));
    const __m256 c = _mm256_set1_ps(cap);
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int32_t p = p0; p < max_pos; p++) {
        const __m256 valid = valid8(npv, lov, p);
        float *sp = s + p * rw + 8 * v;
        __m256 x = _mm256_load_ps(sp);
        if (cap > 0) {
            x = _mm256_blendv_ps(x, _mm256_mul_ps(c, tanh256(_mm256_div_ps(x, c))), valid);
            _mm256_store_ps(sp, x);
        }
        m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, valid));
    }
    __m256 part[8];
    for (int k = 0; k < 8; k++) part[k] = _mm256_setzero_ps();
    for (int32_t q0 = p0; q0 < max_pos; q0 += 8) {
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
        {
            const int32_t p = q0 + k;
            if (p >= max_pos) break;
            const __m256 valid = valid8(npv, lov, p);
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

#include "cpu/attn_tile_impl.h"

int64_t attn_tile_scratch_floats(int32_t n_tok, int32_t group, int32_t head_dim, int32_t max_pos, int32_t block_size)
{
    struct tile_buf b;
    return tile_carve(&b, NULL, n_tok, group, head_dim, max_pos, block_size);
}

void attn_tile_avx2(const struct attn_tile_tok *toks, int32_t n_tok, int32_t group, int32_t head_dim,
                    const struct attn_kv_view *kv, float scale, float *scratch)
{
    tile_run(toks, n_tok, group, head_dim, kv, scale, scratch);
}
