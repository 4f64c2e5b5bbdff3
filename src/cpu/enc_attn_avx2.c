/* enc_attn_avx2.c — an encoder's attention with AVX2+FMA (see enc_attn.h):
 * K is transposed once per call so that eight keys' scores grow together
 * by one FMA per dimension, the softmax runs eight scores a lane set with
 * exp256, and the output grows eight dimensions at a time by one FMA per
 * key. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/simd_avx2.h"
#include "cpu/enc_attn.h"

void enc_attn_avx2(float *out, const float *q, const float *k, const float *v, int64_t ld, int32_t n, int32_t head_dim,
                   float scale, float *scratch)
{
    const int64_t n8 = ((int64_t)n + 7) & ~(int64_t)7;
    float *kt = (float *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31); /* (head_dim, n8) */
    float *s = kt + n8 * head_dim;                                     /* (n8) */
    for (int32_t c = 0; c < head_dim; c++) {
        float *row = kt + (int64_t)c * n8;
        for (int32_t p = 0; p < n; p++) row[p] = k[(int64_t)p * ld + c];
        for (int64_t p = n; p < n8; p++) row[p] = 0;
    }
    const __m256 vneg = _mm256_set1_ps(-INFINITY);
    for (int32_t i = 0; i < n; i++) {
        const float *qi = q + (int64_t)i * ld;
        __m256 vmax = vneg;
        for (int64_t p = 0; p < n8; p += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int32_t c = 0; c < head_dim; c++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(qi[c]), _mm256_load_ps(kt + (int64_t)c * n8 + p), acc);
            acc = _mm256_mul_ps(acc, _mm256_set1_ps(scale));
            if (p + 8 > n) { /* padding keys score -inf */
                const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - p)), lane));
                acc = _mm256_blendv_ps(vneg, acc, valid);
            }
            _mm256_store_ps(s + p, acc);
            vmax = _mm256_max_ps(vmax, acc);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const __m256 mx = _mm256_set1_ps(_mm_cvtss_f32(m4));
        __m256 vsum = _mm256_setzero_ps();
        for (int64_t p = 0; p < n8; p += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + p), mx));
            const __m256 keep = _mm256_cmp_ps(_mm256_load_ps(s + p), vneg, _CMP_NEQ_OQ); /* exp(-inf) is 0 */
            const __m256 ek = _mm256_and_ps(e, keep);
            _mm256_store_ps(s + p, ek);
            vsum = _mm256_add_ps(vsum, ek);
        }
        const float inv = 1.0f / hsum256(vsum);
        float *o = out + (int64_t)i * ld;
        int32_t c = 0;
        for (; c + 8 <= head_dim; c += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int32_t p = 0; p < n; p++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(s[p]), _mm256_loadu_ps(v + (int64_t)p * ld + c), acc);
            _mm256_storeu_ps(o + c, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
        }
        for (; c < head_dim; c++) {
            float acc = 0;
            for (int32_t p = 0; p < n; p++) acc += s[p] * v[(int64_t)p * ld + c];
            o[c] = acc * inv;
        }
    }
}
