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
