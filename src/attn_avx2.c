/* attn_avx2.c — AVX2+FMA versions of the attention and SwiGLU hot loops
 * (declared in attn.h). Compiled with -mavx2 -mfma; callers check the CPU
 * first (attn_have_avx2).
 *
 * exp is a fixed polynomial (not libm), so results are reproducible across
 * machines with AVX2 and independent of the batch: every reduction runs in
 * an order fixed by the sequence's own length. */
#include <immintrin.h>
#include <math.h>

#include "attn.h"

/* e^x for x <= 0 mostly (softmax, sigmoid): x = n ln2 + r, |r| <= ln2/2,
 * e^r by a degree-6 polynomial (relative error ~2e-7), times 2^n. */
static inline __m256 exp256(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.3981999507e-3f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void attn_swiglu_avx2(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
    if (i < n) { /* tail through the same vector math on a padded copy */
        float gx[8] = {0}, ux[8] = {0};
        for (int64_t j = i; j < n; j++) { gx[j - i] = g[j]; ux[j - i] = u[j]; }
        attn_swiglu_avx2(gx, ux, 8);
        for (int64_t j = i; j < n; j++) g[j] = gx[j - i];
    }
}

void attn_head_avx2(float *out, const float *q, int32_t head_dim, const struct attn_kv_view *kv, int32_t n_pos,
                    float scale, float *scores)
{
    if (head_dim % 8 != 0 || head_dim > 256) {
        attn_head(out, q, head_dim, kv, n_pos, scale, scores);
        return;
    }
    const int32_t nv = head_dim / 8;
    __m256 qv[32];
    for (int32_t j = 0; j < nv; j++) qv[j] = _mm256_mul_ps(_mm256_loadu_ps(q + 8 * j), _mm256_set1_ps(scale));
#define LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
    float maxs = -INFINITY;
    /* Walk block by block: no division per position. */
    const uint16_t *k = NULL;
    for (int32_t p = 0, slot = kv->block_size; p < n_pos; p++, slot++, k += kv->row_stride) {
        if (slot == kv->block_size) {
            slot = 0;
            k = kv->k_base + (int64_t)kv->table[p / kv->block_size] * kv->block_stride;
        }
        __m256 a0 = _mm256_mul_ps(qv[0], LOADH(k));
        __m256 a1 = _mm256_setzero_ps();
        int32_t j = 1;
        for (; j + 1 < nv; j += 2) {
            a1 = _mm256_fmadd_ps(qv[j], LOADH(k + 8 * j), a1);
            a0 = _mm256_fmadd_ps(qv[j + 1], LOADH(k + 8 * j + 8), a0);
        }
        if (j < nv) a1 = _mm256_fmadd_ps(qv[j], LOADH(k + 8 * j), a1);
        const float d = hsum256(_mm256_add_ps(a0, a1));
        scores[p] = d;
        if (d > maxs) maxs = d;
    }
    /* Pad to a multiple of 8 so the tail goes through the same exp. */
    const int32_t n8 = (n_pos + 7) & ~7;
    for (int32_t p = n_pos; p < n8; p++) scores[p] = -INFINITY;
    const __m256 mv = _mm256_set1_ps(maxs);
    __m256 sum = _mm256_setzero_ps();
    for (int32_t p = 0; p < n8; p += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + p), mv));
        e = _mm256_and_ps(e, _mm256_cmp_ps(_mm256_loadu_ps(scores + p), _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
        _mm256_storeu_ps(scores + p, e);
        sum = _mm256_add_ps(sum, e);
    }
    const float inv = 1.0f / hsum256(sum);
    __m256 acc[32];
    for (int32_t j = 0; j < nv; j++) acc[j] = _mm256_setzero_ps();
    const uint16_t *v = NULL;
    for (int32_t p = 0, slot = kv->block_size; p < n_pos; p++, slot++, v += kv->row_stride) {
        if (slot == kv->block_size) {
            slot = 0;
            v = kv->v_base + (int64_t)kv->table[p / kv->block_size] * kv->block_stride;
        }
        const __m256 w = _mm256_set1_ps(scores[p]);
        for (int32_t j = 0; j < nv; j++) acc[j] = _mm256_fmadd_ps(w, LOADH(v + 8 * j), acc[j]);
    }
#undef LOADH
    const __m256 iv = _mm256_set1_ps(inv);
    for (int32_t j = 0; j < nv; j++) _mm256_storeu_ps(out + 8 * j, _mm256_mul_ps(acc[j], iv));
}

/* The query heads that share one KV head (grouped-query attention), together:
 * each K and V row is loaded and widened from fp16 once for the whole group
 * instead of once per head. Per head the arithmetic is a fixed sequence that
 * depends only on that head's query and the sequence's K/V, so results do
 * not depend on the batch. G is a compile-time constant in each copy (see the
 * dispatch below) so the per-head accumulators live in registers. */
#define LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
static inline __attribute__((always_inline)) void group_impl(float *out, const float *q, const int G,
                                                             int32_t head_dim, const struct attn_kv_view *kv,
                                                             int32_t n_pos, float scale, float *scores,
                                                             int64_t score_stride)
{
    const int32_t nv = head_dim / 8;
    float qs[8 * 256];
    for (int32_t i = 0; i < G * head_dim; i++) qs[i] = q[i] * scale;
    float maxs[8];
    _Pragma("GCC unroll 8")
    for (int h = 0; h < G; h++) maxs[h] = -INFINITY;
    const uint16_t *k = NULL;
    for (int32_t p = 0, slot = kv->block_size; p < n_pos; p++, slot++, k += kv->row_stride) {
        if (slot == kv->block_size) {
            slot = 0;
            k = kv->k_base + (int64_t)kv->table[p / kv->block_size] * kv->block_stride;
        }
        __m256 acc[8];
        _Pragma("GCC unroll 8")
        for (int h = 0; h < G; h++) acc[h] = _mm256_setzero_ps();
        for (int32_t j = 0; j < nv; j++) {
            const __m256 kx = LOADH(k + 8 * j);
            _Pragma("GCC unroll 8")
            for (int h = 0; h < G; h++) acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + h * head_dim + 8 * j), kx, acc[h]);
        }
        _Pragma("GCC unroll 8")
        for (int h = 0; h < G; h++) {
            const float d = hsum256(acc[h]);
            scores[h * score_stride + p] = d;
            if (d > maxs[h]) maxs[h] = d;
        }
    }
    const int32_t n8 = (n_pos + 7) & ~7;
    float inv[8];
    _Pragma("GCC unroll 8")
    for (int h = 0; h < G; h++) {
        float *sc = scores + h * score_stride;
        for (int32_t p = n_pos; p < n8; p++) sc[p] = -INFINITY;
        const __m256 mv = _mm256_set1_ps(maxs[h]);
        __m256 sum = _mm256_setzero_ps();
        for (int32_t p = 0; p < n8; p += 8) {
            __m256 x = _mm256_loadu_ps(sc + p);
            __m256 e = exp256(_mm256_sub_ps(x, mv));
            e = _mm256_and_ps(e, _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
            _mm256_storeu_ps(sc + p, e);
            sum = _mm256_add_ps(sum, e);
        }
        inv[h] = 1.0f / hsum256(sum);
    }
    /* P.V in passes over slices of SL 8-float vectors of the heads, SL chosen
     * so that the G x SL accumulators, SL values and G weights fit the 16
     * vector registers of AVX2 (spilling them costs more than extra passes
     * over the cached V rows). */
    const int SL = G <= 2 ? 4 : G == 3 ? 3 : G == 4 ? 2 : 1;
    for (int32_t j0 = 0; j0 < nv; j0 += SL) {
        const int32_t js = nv - j0 < SL ? nv - j0 : SL;
        __m256 acc[8][4];
        _Pragma("GCC unroll 8")
        for (int h = 0; h < G; h++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[h][j] = _mm256_setzero_ps();
        const uint16_t *v = NULL;
        for (int32_t p = 0, slot = kv->block_size; p < n_pos; p++, slot++, v += kv->row_stride) {
            if (slot == kv->block_size) {
                slot = 0;
                v = kv->v_base + (int64_t)kv->table[p / kv->block_size] * kv->block_stride;
            }
            __m256 w[8];
            _Pragma("GCC unroll 8")
            for (int h = 0; h < G; h++) w[h] = _mm256_broadcast_ss(scores + h * score_stride + p);
            if (js == SL) {
                _Pragma("GCC unroll 4")
                for (int j = 0; j < SL; j++) {
                    const __m256 vx = LOADH(v + 8 * (j0 + j));
                    _Pragma("GCC unroll 8")
                    for (int h = 0; h < G; h++) acc[h][j] = _mm256_fmadd_ps(w[h], vx, acc[h][j]);
                }
            } else {
                for (int32_t j = 0; j < js; j++) {
                    const __m256 vx = LOADH(v + 8 * (j0 + j));
                    _Pragma("GCC unroll 8")
                    for (int h = 0; h < G; h++) acc[h][j] = _mm256_fmadd_ps(w[h], vx, acc[h][j]);
                }
            }
        }
        _Pragma("GCC unroll 8")
        for (int h = 0; h < G; h++)
            for (int32_t j = 0; j < js; j++)
                _mm256_storeu_ps(out + (int64_t)h * head_dim + 8 * (j0 + j), _mm256_mul_ps(acc[h][j], _mm256_set1_ps(inv[h])));
    }
}
#undef LOADH

void attn_group_avx2(float *out, const float *q, int32_t group, int32_t head_dim, const struct attn_kv_view *kv,
                     int32_t n_pos, float scale, float *scores, int64_t score_stride)
{
    if (head_dim % 8 != 0 || head_dim > 256 || group > 8 || group < 1) {
        for (int32_t h = 0; h < group; h++)
            attn_head_avx2(out + (int64_t)h * head_dim, q + (int64_t)h * head_dim, head_dim, kv, n_pos, scale,
                           scores + h * score_stride);
        return;
    }
    switch (group) {
#define G_CASE(n) case n: group_impl(out, q, n, head_dim, kv, n_pos, scale, scores, score_stride); break;
        G_CASE(1) G_CASE(2) G_CASE(3) G_CASE(4) G_CASE(5) G_CASE(6) G_CASE(7) G_CASE(8)
#undef G_CASE
    }
}
