/* enc_attn.c — the reference of an encoder's attention (see enc_attn.h). */
#include "cpu/enc_attn.h"

#include <math.h>
#include <string.h>

int64_t enc_attn_scratch_floats(int32_t n, int32_t head_dim)
{
    const int64_t n8 = ((int64_t)n + 7) & ~(int64_t)7;
    return n8 * head_dim + n8 + 16; /* transposed K, one row's scores, room to align */
}

void enc_attn(float *out, const float *q, const float *k, const float *v, int64_t ld, int32_t n, int32_t head_dim,
              float scale, float *scratch)
{
    float *s = scratch;
    for (int32_t i = 0; i < n; i++) {
        const float *qi = q + (int64_t)i * ld;
        float mx = -INFINITY;
        for (int32_t p = 0; p < n; p++) {
            const float *kp = k + (int64_t)p * ld;
            float dot = 0;
            for (int32_t c = 0; c < head_dim; c++) dot += qi[c] * kp[c];
            s[p] = dot * scale;
            if (s[p] > mx) mx = s[p];
        }
        double sum = 0;
        for (int32_t p = 0; p < n; p++) sum += s[p] = expf(s[p] - mx);
        const float inv = (float)(1.0 / sum);
        float *o = out + (int64_t)i * ld;
        memset(o, 0, sizeof(float) * (size_t)head_dim);
        for (int32_t p = 0; p < n; p++) {
            const float w = s[p] * inv, *vp = v + (int64_t)p * ld;
            for (int32_t c = 0; c < head_dim; c++) o[c] += w * vp[c];
        }
    }
}
