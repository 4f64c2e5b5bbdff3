/* attn_avx2.c — AVX2+FMA SwiGLU and GeGLU (declared in attn.h); the attention kernel
 * is in attn_tile_avx2.c. Compiled with -mavx2 -mfma; callers check the CPU
 * first (attn_have_avx2).
 *
 * exp is a fixed polynomial (not libm), so results are reproducible across
 * machines with AVX2 and independent of the batch: every reduction runs in
 * an order fixed by the sequence's own length. */
#include <immintrin.h>
#include <math.h>

#include "base/simd_avx2.h"
#include "cpu/attn.h"

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
        for (int64_t j = i; j < n; j++) {
            gx[j - i] = g[j];
            ux[j - i] = u[j];
        }
        attn_swiglu_avx2(gx, ux, 8);
        for (int64_t j = i; j < n; j++) g[j] = gx[j - i];
    }
}

void attn_geglu_avx2(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    const __m256 k = _mm256_set1_ps(0.7978845608028654f), c = _mm256_set1_ps(0.044715f);
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        const __m256 t = tanh256(_mm256_mul_ps(k, _mm256_fmadd_ps(c, x3, x)));
        const __m256 y = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, t));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
    }
    if (i < n) { /* tail through the same vector math on a padded copy */
        float gx[8] = {0}, ux[8] = {0};
        for (int64_t j = i; j < n; j++) {
            gx[j - i] = g[j];
            ux[j - i] = u[j];
        }
        attn_geglu_avx2(gx, ux, 8);
        for (int64_t j = i; j < n; j++) g[j] = gx[j - i];
    }
}
