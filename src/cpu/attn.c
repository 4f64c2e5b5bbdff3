/* attn.c — plain C attention and layer ops (see attn.h). Written as simple
 * loops over contiguous floats so the compiler can vectorise them; the order
 * of each reduction is fixed (index order). */
#include "cpu/attn.h"

#include <math.h>
#include <string.h>

#include "base/cpu.h"
#include "base/dtype.h"

void attn_rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void attn_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t rope_dim, enum rope_kind kind, int32_t pos,
               const float *inv_freq, float mscale)
{
    const int32_t half = rope_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        const float theta = (float)pos * inv_freq[i];
        const float c = cosf(theta) * mscale, s = sinf(theta) * mscale; /* exact when mscale is 1 */
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + (int64_t)h * head_dim;
            int32_t a = kind == ROPE_NORM ? 2 * i : i;
            int32_t b = kind == ROPE_NORM ? 2 * i + 1 : i + half;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

void attn_swiglu(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void attn_geglu(float *g, const float *u, int64_t n)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * u[i];
    }
}

float attn_softcap_ref(float x, float c) { return c * tanhf(x / c); }

/* The scalar twin of exp256 (simd_avx2.h), operation for operation, so the
 * reference and the SIMD attention agree to the bit. */
float attn_exp(float x)
{
    x = fminf(fmaxf(x, -87.3f), 88.7f);
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.3981999507e-3f;
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float e;
    memcpy(&e, &bits, sizeof e);
    return p * e;
}

/* tanh(x) = sign(x) (1 - e) / (1 + e), e = e^(-2|x|) by attn_exp: no
 * cancellation problem that matters for a soft-cap (absolute error ~2e-7
 * near 0, where the cap multiplies it back only by c), and the vector
 * kernels repeat it operation for operation. */
float attn_tanh(float x)
{
    const float e = attn_exp(-2.0f * fabsf(x));
    return copysignf((1.0f - e) / (1.0f + e), x);
}

/* Element i of a row stored as t, as kv_dequantize_row gives it: read
 * where it lies, group by group, with no copy of the row. */
static inline float row_value(enum kv_type t, const uint16_t *row, int32_t i)
{
    if (t == KV_Q8) {
        const struct kvq8_group *g = (const struct kvq8_group *)(const void *)row + i / KV_QGROUP;
        return kvb_fp16_to_f32(g->d) * (float)g->q[i % KV_QGROUP];
    }
    if (t == KV_Q4) {
        const struct kvq4_group *g = (const struct kvq4_group *)(const void *)row + i / KV_QGROUP;
        const int32_t j = i % KV_QGROUP, h = KV_QGROUP / 2;
        const int q = j < h ? g->qs[j] & 15 : g->qs[j - h] >> 4;
        return fmaf(kvb_fp16_to_f32(g->d), (float)q, kvb_fp16_to_f32(g->m));
    }
    return kvb_fp16_to_f32(row[i]);
}

void attn_head(float *out, const float *q, int32_t head_dim, const struct attn_kv_view *kv, int32_t p_lo, int32_t n_pos,
               float scale, float *scores)
{
    const enum kv_type kt = kv_k_rows(kv->type), vt = kv_v_rows(kv->type);
    const int64_t vrs = kv->v_row_stride ? kv->v_row_stride : kv->row_stride;
    float qs[1024];
    const float *qq = q;
    if (head_dim <= 1024) {
        for (int32_t i = 0; i < head_dim; i++) qs[i] = q[i] * scale;
        qq = qs;
    }
    float maxs = -INFINITY;
    if (p_lo < 0) p_lo = 0;
    for (int32_t p = p_lo; p < n_pos; p++) {
        const uint16_t *k = kv->k_base + (int64_t)kv->table[p / kv->block_size] * kv->block_stride +
                            (int64_t)(p % kv->block_size) * kv->row_stride;
        float d = 0.0f;
        if (qq == qs)
            for (int32_t i = 0; i < head_dim; i++) d = fmaf(row_value(kt, k, i), qs[i], d);
        else
            for (int32_t i = 0; i < head_dim; i++) d = fmaf(row_value(kt, k, i), q[i] * scale, d);
        if (kv->softcap > 0) d = attn_softcap(d, kv->softcap);
        scores[p] = d;
        maxs = fmaxf(maxs, d);
    }
    /* Eight interleaved partial sums and a fixed tree: the shape of an
     * 8-lane vector sum, which every kernel can reproduce exactly whether
     * its lanes run over positions or over rows. */
    float part[8] = {0};
    for (int32_t p = p_lo; p < n_pos; p++) {
        scores[p] = attn_exp(scores[p] - maxs);
        part[p % 8] += scores[p];
    }
    const float sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
    const float inv = 1.0f / sum;
    for (int32_t i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int32_t p = p_lo; p < n_pos; p++) {
        const uint16_t *v = kv->v_base + (int64_t)kv->table[p / kv->block_size] * kv->block_stride +
                            (int64_t)(p % kv->block_size) * vrs;
        for (int32_t i = 0; i < head_dim; i++) out[i] = fmaf(scores[p], row_value(vt, v, i), out[i]);
    }
    for (int32_t i = 0; i < head_dim; i++) out[i] *= inv;
}

bool attn_have_avx2(void) { return cpu_features().avx2; }

bool attn_have_avx512(void) { return cpu_features().avx512; }
