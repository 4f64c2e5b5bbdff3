/* kvtype.c — the reference K/V row conversions (see kvtype.h for the
 * formulas every kernel reproduces). */
#include "backend/kvtype.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"

static const char *const kv_names[KV_N_TYPES] = {"f16", "q8", "q4"};

const char *kv_type_name(enum kv_type t) { return (unsigned)t < KV_N_TYPES ? kv_names[t] : "?"; }

bool kv_type_parse(const char *s, enum kv_type *out)
{
    for (int i = 0; s && i < KV_N_TYPES; i++)
        if (!strcmp(s, kv_names[i])) {
            *out = (enum kv_type)i;
            return true;
        }
    return false;
}

int64_t kv_row_bytes(enum kv_type t, int64_t n)
{
    switch (t) {
    case KV_Q8: return n / KV_QGROUP * (int64_t)sizeof(struct kvq8_group);
    case KV_Q4: return n / KV_QGROUP * (int64_t)sizeof(struct kvq4_group);
    default: return n * (int64_t)sizeof(uint16_t);
    }
}

enum kvb_status kv_type_check(enum kv_type t, int32_t head_dim, struct kvb_err *err)
{
    if ((unsigned)t >= KV_N_TYPES) return kvb_errf(err, KVB_ERR_INVALID_ARG, "unknown KV type %d", (int)t);
    if (t != KV_F16 && (head_dim <= 0 || head_dim % KV_QGROUP != 0))
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "KV type %s stores groups of %d elements, but the model's head_dim is %d (use f16)",
                        kv_type_name(t), KV_QGROUP, head_dim);
    return KVB_OK;
}

/* Half-float rounding of a scale that may exceed the fp16 range (a row of
 * overflowing activations): the largest finite half instead of infinity,
 * so that the group's values stay finite and clamped. */
static uint16_t scale_fp16(float d) { return kvb_f32_to_fp16(d < 65504.0f ? d : 65504.0f); }
static uint16_t min_fp16(float m) { return kvb_f32_to_fp16(m < -65504.0f ? -65504.0f : m > 65504.0f ? 65504.0f : m); }

void kvq8_quantize_group(struct kvq8_group *g, const float *x)
{
    float amax = 0.0f;
    for (int i = 0; i < KV_QGROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
    g->d = scale_fp16(amax / 127.0f);
    const float d = kvb_fp16_to_f32(g->d);
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < KV_QGROUP; i++) {
        float q = rintf(x[i] * inv);
        g->q[i] = (int8_t)(q > 127.0f ? 127 : q < -127.0f ? -127 : q);
    }
}

void kvq4_quantize_group(struct kvq4_group *g, const float *x)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < KV_QGROUP; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    g->d = scale_fp16((hi - lo) / 15.0f);
    g->m = min_fp16(lo + 0.0f); /* -0 + 0 is +0: the minimum of a group holding both zeros has one code */
    const float d = kvb_fp16_to_f32(g->d), m = kvb_fp16_to_f32(g->m);
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[KV_QGROUP];
    for (int i = 0; i < KV_QGROUP; i++) {
        float v = rintf((x[i] - m) * inv);
        q[i] = (uint8_t)(v > 15.0f ? 15 : v < 0.0f ? 0 : v);
    }
    for (int j = 0; j < KV_QGROUP / 2; j++) g->qs[j] = (uint8_t)(q[j] | q[j + KV_QGROUP / 2] << 4);
}

void kv_quantize_row(enum kv_type t, void *dst, const float *src, int64_t n)
{
    if (t == KV_Q8) {
        struct kvq8_group *g = dst;
        for (int64_t b = 0; b < n / KV_QGROUP; b++) kvq8_quantize_group(&g[b], src + b * KV_QGROUP);
    } else if (t == KV_Q4) {
        struct kvq4_group *g = dst;
        for (int64_t b = 0; b < n / KV_QGROUP; b++) kvq4_quantize_group(&g[b], src + b * KV_QGROUP);
    } else {
        kvb_f32_to_fp16_n(dst, src, n);
    }
}

void kv_dequantize_row(enum kv_type t, float *dst, const void *src, int64_t n)
{
    if (t == KV_Q8) {
        const struct kvq8_group *g = src;
        for (int64_t b = 0; b < n / KV_QGROUP; b++) {
            const float d = kvb_fp16_to_f32(g[b].d);
            for (int i = 0; i < KV_QGROUP; i++) dst[b * KV_QGROUP + i] = d * (float)g[b].q[i];
        }
    } else if (t == KV_Q4) {
        const struct kvq4_group *g = src;
        for (int64_t b = 0; b < n / KV_QGROUP; b++) {
            const float d = kvb_fp16_to_f32(g[b].d), m = kvb_fp16_to_f32(g[b].m);
            for (int j = 0; j < KV_QGROUP / 2; j++) {
                dst[b * KV_QGROUP + j] = fmaf(d, (float)(g[b].qs[j] & 15), m);
                dst[b * KV_QGROUP + j + KV_QGROUP / 2] = fmaf(d, (float)(g[b].qs[j] >> 4), m);
            }
        }
    } else {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = kvb_fp16_to_f32(h[i]);
    }
}
