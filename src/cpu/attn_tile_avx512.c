/* attn_tile_avx512.c — the tiled attention kernel's inner loops in 16-lane
 * AVX-512 (declared in attn.h; the driver is attn_tile_impl.h). Compiled
 * with AVX-512 flags; callers check attn_have_avx512() first.
 *
 * Why it can be bit-identical to the AVX2 kernel and the scalar reference:
 * every lane runs one row's (or one head dimension's) own scalar sequence
 * (attn.h), and nothing ever reduces across lanes, so the lane count only
 * changes how many sequences run side by side. Twice the lanes per
 * instruction is twice the arithmetic per cycle on a CPU with two 512-bit
 * FMA units, and the rows-in-lanes loops are bound by exactly that. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "cpu/attn.h"

/* exp256 (simd_avx2.h), 16 lanes, operation for operation. */
static inline __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.3981999507e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* Lanes of row vector v (rows 16v..16v+15) that fall in [lo, hi). */
static inline __mmask16 lane_mask16(int64_t v, int64_t lo, int64_t hi)
{
    const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(16 * v)),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_cmpgt_epi32_mask(lane, _mm512_set1_epi32((int32_t)lo - 1)) &
           _mm512_cmpgt_epi32_mask(_mm512_set1_epi32((int32_t)hi), lane);
}

/* As the AVX2 qk_impl: NV vectors of 16 rows, PU positions at a time,
 * s = fma(k[d], q[d], s) over d in order; only lanes of rows [lo, hi) are
 * stored. NV x PU + PU + 1 <= 32 registers. */
static inline __attribute__((always_inline)) void qk_impl16(const int NV, const int PU, const float *kf, int32_t n,
                                                            int32_t hd, int64_t hd8, const float *qt, int64_t rw,
                                                            int64_t v0, int64_t lo, int64_t hi, float *s)
{
    __mmask16 mask[4];
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) mask[v] = lane_mask16(v0 + v, lo, hi);
    int32_t p = 0;
    for (; p + PU <= n; p += PU) {
        __m512 acc[16][4];
        _Pragma("GCC unroll 16") for (int u = 0; u < PU; u++) _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            acc[u][v] = _mm512_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            __m512 k[16];
            _Pragma("GCC unroll 16") for (int u = 0; u < PU; u++) k[u] = _mm512_set1_ps(kf[(p + u) * hd8 + d]);
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            {
                const __m512 q = _mm512_load_ps(qt + d * rw + (v0 + v) * 16);
                _Pragma("GCC unroll 16") for (int u = 0; u < PU; u++) acc[u][v] = _mm512_fmadd_ps(k[u], q, acc[u][v]);
            }
        }
        _Pragma("GCC unroll 16") for (int u = 0; u < PU; u++) _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            _mm512_mask_store_ps(s + (int64_t)(p + u) * rw + (v0 + v) * 16, mask[v], acc[u][v]);
    }
    for (; p < n; p++) {
        __m512 acc[4];
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[v] = _mm512_setzero_ps();
        for (int32_t d = 0; d < hd; d++) {
            const __m512 k = _mm512_set1_ps(kf[p * hd8 + d]);
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[v] =
                _mm512_fmadd_ps(k, _mm512_load_ps(qt + d * rw + (v0 + v) * 16), acc[v]);
        }
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
            _mm512_mask_store_ps(s + (int64_t)p * rw + (v0 + v) * 16, mask[v], acc[v]);
    }
}

static void qk_rows(const float *kf, int32_t n, int32_t hd, int64_t hd8, const float *qt, int64_t rw, int64_t lo,
                    int64_t hi, float *s)
{
    for (int64_t v0 = lo / 16, v1 = (hi + 15) / 16; v0 < v1; v0 += 3) {
        switch (v1 - v0 < 3 ? v1 - v0 : 3) {
        case 1: qk_impl16(1, 14, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        case 2: qk_impl16(2, 10, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        default: qk_impl16(3, 7, kf, n, hd, hd8, qt, rw, v0, lo, hi, s); break;
        }
    }
}

/* tanh256 (simd_avx2.h), 16 lanes, operation for operation. */
static inline __m512 tanh512(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
    const __m512 e = exp512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), a));
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    return _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(t), _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int32_t)0x80000000u))));
}

/* Lanes whose range [lo, np) holds position p. */
static inline __mmask16 valid16(__m512i npv, __m512i lov, int32_t p)
{
    const __m512i pv = _mm512_set1_epi32(p);
    return _mm512_cmpgt_epi32_mask(npv, pv) & _mm512_cmple_epi32_mask(lov, pv);
}

/* As the AVX2 softmax_cols8, 16 rows in lanes: the 8 interleaved partial
 * sums are 8 vectors, combined by the reference's tree. */
static void softmax_cols(float *s, int64_t rw, int64_t v, const int32_t *np, const int32_t *lo, int32_t p0,
                         int32_t max_pos, float cap, float *inv)
{
    const __m512i npv = _mm512_load_si512((const void *)(np + 16 * v));
    const __m512i lov = _mm512_load_si512((const void *)(lo + 16 * v));
    const __m512 c = _mm512_set1_ps(cap);
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int32_t p = p0; p < max_pos; p++) {
        const __mmask16 valid = valid16(npv, lov, p);
        float *sp = s + p * rw + 16 * v;
        __m512 x = _mm512_load_ps(sp);
        if (cap > 0) {
            x = _mm512_mask_blend_ps(valid, x, _mm512_mul_ps(c, tanh512(_mm512_div_ps(x, c))));
            _mm512_store_ps(sp, x);
        }
        m = _mm512_mask_max_ps(m, valid, m, x);
    }
    __m512 part[8];
    for (int k = 0; k < 8; k++) part[k] = _mm512_setzero_ps();
    for (int32_t q0 = p0; q0 < max_pos; q0 += 8) {
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
        {
            const int32_t p = q0 + k;
            if (p >= max_pos) break;
            const __mmask16 valid = valid16(npv, lov, p);
            float *sp = s + p * rw + 16 * v;
            /* Invalid lanes go through exp(0), never through garbage. */
            const __m512 x = _mm512_mask_blend_ps(valid, m, _mm512_load_ps(sp));
            const __m512 e = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(x, m)));
            _mm512_store_ps(sp, e);
            part[k] = _mm512_add_ps(part[k], e);
        }
    }
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(part[0], part[4]), _mm512_add_ps(part[2], part[6])),
                                     _mm512_add_ps(_mm512_add_ps(part[1], part[5]), _mm512_add_ps(part[3], part[7])));
    _mm512_store_ps(inv + 16 * v, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
}

/* As the AVX2 pv_impl, 16 head dimensions per vector (head_dim % 16 == 0). */
static inline __attribute__((always_inline)) void pv_impl16(const int R, const int SL, const float *vf,
                                                            const uint16_t *vh, int64_t vh_rs, int32_t n, int64_t hd8,
                                                            const float *w, int64_t w_ps, int64_t w_rs, float *acc)
{
#define VROW16(p, off)                                                                                                 \
    (vh ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(vh + (p)*vh_rs + (off))))                 \
        : _mm512_load_ps(vf + (p)*hd8 + (off)))
    for (int64_t j0 = 0; j0 < hd8; j0 += 16 * SL) {
        const int js = (int)((hd8 - j0) / 16 < SL ? (hd8 - j0) / 16 : SL);
        if (js == SL) {
            __m512 a[6][4];
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int j = 0; j < SL; j++)
                a[r][j] = _mm512_load_ps(acc + r * hd8 + j0 + 16 * j);
            for (int32_t p = 0; p < n; p++) {
                __m512 wv[6];
                _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) wv[r] = _mm512_set1_ps(w[p * w_ps + r * w_rs]);
                _Pragma("GCC unroll 4") for (int j = 0; j < SL; j++)
                {
                    const __m512 x = VROW16(p, j0 + 16 * j);
                    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) a[r][j] = _mm512_fmadd_ps(wv[r], x, a[r][j]);
                }
            }
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int j = 0; j < SL; j++)
                _mm512_store_ps(acc + r * hd8 + j0 + 16 * j, a[r][j]);
        } else {
            for (int j = 0; j < js; j++) {
                __m512 a[6];
                _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) a[r] = _mm512_load_ps(acc + r * hd8 + j0 + 16 * j);
                for (int32_t p = 0; p < n; p++) {
                    const __m512 x = VROW16(p, j0 + 16 * j);
                    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) a[r] =
                        _mm512_fmadd_ps(_mm512_set1_ps(w[p * w_ps + r * w_rs]), x, a[r]);
                }
                _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) _mm512_store_ps(acc + r * hd8 + j0 + 16 * j, a[r]);
            }
        }
    }
#undef VROW16
}

static void pv_token(const float *vf, const uint16_t *vh, int64_t vh_rs, int32_t n, int64_t hd8, const float *w,
                     int64_t w_ps, int64_t w_rs, int32_t G, float *acc)
{
    while (G > 0) {
        const int R = G < 6 ? G : 6;
        switch (R) {
        case 1: pv_impl16(1, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 2: pv_impl16(2, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 3: pv_impl16(3, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 4: pv_impl16(4, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        case 5: pv_impl16(5, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        default: pv_impl16(6, 4, vf, vh, vh_rs, n, hd8, w, w_ps, w_rs, acc); break;
        }
        acc += R * hd8;
        w += R * w_rs;
        G -= R;
    }
}

#include "cpu/attn_tile_impl.h"

void attn_tile_avx512(const struct attn_tile_tok *toks, int32_t n_tok, int32_t group, int32_t head_dim,
                      const struct attn_kv_view *kv, float scale, float *scratch)
{
    if (head_dim % 16 != 0) { /* 16-lane rows of V need whole vectors */
        attn_tile_avx2(toks, n_tok, group, head_dim, kv, scale, scratch);
        return;
    }
    tile_run(toks, n_tok, group, head_dim, kv, scale, scratch);
}
