/* matmul_scalar.c — the plain C matrix product: the reference the SIMD
 * implementations are tested against, and the fallback on any CPU.
 *
 * Quantized weights: each token's input is cut into blocks of 32, each with
 * a float scale dx = amax/127 and int8 values qx = round(x/dx); a weight
 * block's integer dot product with qx is exact, and only the per-block
 * scaling and the running sum are float. Float weights: a plain f32 dot
 * product over the float copy of the input. Every output element is one
 * independent loop over its row, so it cannot depend on the batch. */
#include <math.h>
#include <string.h>

#include "cpu/matmul_impl.h"
#include "model/quant_blocks.h"

/* Quantized token layout: qx[nb*32] int8, then dx[nb] float, then the block
 * sums sum(qx) as int32 [nb] (needed by types with a min: Q4_1, Q5_1, Q4_K, Q5_K). */
static size_t off_d(int64_t nb) { return (size_t)nb * 32; }
static size_t off_s(int64_t nb) { return off_d(nb) + (size_t)nb * 4; }

static size_t act_bytes(int64_t n_in)
{
    int64_t nb = n_in / 32;
    return (off_s(nb) + (size_t)nb * 4 + 63) & ~(size_t)63;
}

/* Round-to-nearest-even into [-127, 127]; a NaN becomes -127 (as in the SIMD
 * paths, whose max(v, -127) returns -127 for a NaN). */
static int8_t q8_round(float v)
{
    if (!(v >= -127.0f)) v = -127.0f;
    if (v > 127.0f) v = 127.0f;
    return (int8_t)nearbyintf(v);
}

static void quantize(const float *x, int64_t n_in, unsigned forms, void *dst)
{
    (void)forms; /* one form */
    int64_t nb = n_in / 32;
    int8_t *q = dst;
    float *dxs = (float *)((uint8_t *)dst + off_d(nb));
    int32_t *sums = (int32_t *)((uint8_t *)dst + off_s(nb));
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t s = 0;
        for (int j = 0; j < 32; j++) {
            q[32 * b + j] = q8_round(xb[j] * id);
            s += q[32 * b + j];
        }
        dxs[b] = d;
        sums[b] = s;
    }
}

/* One quantized input token, unpacked from its bytes. */
struct qtok {
    const int8_t *q;
    const float *d;
    const int32_t *s;
};

static float dot_q4_0(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const uint8_t *qs = w + 2;
        const int8_t *qx = x->q + 32 * b;
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += ((qs[j] & 0x0F) - 8) * qx[j] + ((qs[j] >> 4) - 8) * qx[j + 16];
        acc += qb_half(w) * x->d[b] * (float)isum;
    }
    return acc;
}

static float dot_q4_1(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 20) {
        const uint8_t *qs = w + 4;
        const int8_t *qx = x->q + 32 * b;
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += (qs[j] & 0x0F) * qx[j] + (qs[j] >> 4) * qx[j + 16];
        /* (d*q + m) . x = d*dx*isum + m*dx*sum(qx) */
        acc += qb_half(w) * x->d[b] * (float)isum + qb_half(w + 2) * (x->d[b] * (float)x->s[b]);
    }
    return acc;
}

static int32_t dot_q5_block(const uint8_t *qs, uint32_t qh, const int8_t *qx, int offset)
{
    int32_t isum = 0;
    for (int j = 0; j < 16; j++) {
        int v0 = ((qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4) - offset;
        int v1 = ((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - offset;
        isum += v0 * qx[j] + v1 * qx[j + 16];
    }
    return isum;
}

static float dot_q5_0(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 22) {
        int32_t isum = dot_q5_block(w + 6, qb_u32(w + 2), x->q + 32 * b, 16);
        acc += qb_half(w) * x->d[b] * (float)isum;
    }
    return acc;
}

static float dot_q5_1(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 24) {
        int32_t isum = dot_q5_block(w + 8, qb_u32(w + 4), x->q + 32 * b, 0);
        acc += qb_half(w) * x->d[b] * (float)isum + qb_half(w + 2) * (x->d[b] * (float)x->s[b]);
    }
    return acc;
}

static float dot_q8_0(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 34) {
        const int8_t *qs = (const int8_t *)(w + 2);
        const int8_t *qx = x->q + 32 * b;
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += qs[j] * qx[j];
        acc += qb_half(w) * x->d[b] * (float)isum;
    }
    return acc;
}

/* Q4_K: each 32-element sub-block is a Q4_1-like block with scale d*sc and
 * min -dmin*m, and lines up with one 32-block of the input. */
static float dot_q4_K(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, w += 144) {
        float d = qb_half(w), dmin = qb_half(w + 2);
        for (int s = 0; s < 8; s++) {
            int64_t b = 8 * sb + s;
            uint8_t sc, m;
            qb_q4k_scale_min(s, w + 4, &sc, &m);
            const uint8_t *qs = w + 16 + 32 * (s / 2);
            int shift = 4 * (s % 2);
            const int8_t *qx = x->q + 32 * b;
            int32_t isum = 0;
            for (int j = 0; j < 32; j++) isum += ((qs[j] >> shift) & 0x0F) * qx[j];
            acc += d * (float)sc * x->d[b] * (float)isum - dmin * (float)m * (x->d[b] * (float)x->s[b]);
        }
    }
    return acc;
}

/* Q6_K: the int8 scales cover 16 elements, so each 32-block of the input
 * meets two of them; their integer sums combine exactly before scaling. */
static float dot_q6_K(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, w += 210) {
        float d = qb_half(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int s = 0; s < 8; s++) {
            int64_t b = 8 * sb + s;
            const int8_t *qx = x->q + 32 * b;
            int32_t half[2] = {0, 0};
            for (int j = 0; j < 32; j++) half[j / 16] += (qb_q6k_value(w, 32 * s + j) - 32) * qx[j];
            int32_t isum = sc[2 * s] * half[0] + sc[2 * s + 1] * half[1];
            acc += d * x->d[b] * (float)isum;
        }
    }
    return acc;
}

/* Q5_K: Q4_K with 5-bit values. */
static float dot_q5_K(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, w += 176) {
        float d = qb_half(w), dmin = qb_half(w + 2);
        for (int s = 0; s < 8; s++) {
            int64_t b = 8 * sb + s;
            uint8_t sc, m;
            qb_q4k_scale_min(s, w + 4, &sc, &m);
            const int8_t *qx = x->q + 32 * b;
            int32_t isum = 0;
            for (int j = 0; j < 32; j++) isum += qb_q5k_value(w, 32 * s + j) * qx[j];
            acc += d * (float)sc * x->d[b] * (float)isum - dmin * (float)m * (x->d[b] * (float)x->s[b]);
        }
    }
    return acc;
}

/* Q3_K: as Q6_K, signed 6-bit scales per 16 elements and values q3 - 4. */
static float dot_q3_K(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, w += 110) {
        float d = qb_half(w + 108);
        for (int s = 0; s < 8; s++) {
            int64_t b = 8 * sb + s;
            const int8_t *qx = x->q + 32 * b;
            int32_t half[2] = {0, 0};
            for (int j = 0; j < 32; j++) half[j / 16] += (qb_q3k_value(w, 32 * s + j) - 4) * qx[j];
            int32_t isum = qb_q3k_scale(w + 96, 2 * s) * half[0] + qb_q3k_scale(w + 96, 2 * s + 1) * half[1];
            acc += d * x->d[b] * (float)isum;
        }
    }
    return acc;
}

/* Q2_K: a scale and a min per 16 elements. Both integer sums of a 32-block
 * (values times scales, input sums times mins) are exact; then
 * d*dx*isum - dmin*dx*msum. */
static float dot_q2_K(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, w += 84) {
        float d = qb_half(w + 80), dmin = qb_half(w + 82);
        for (int s = 0; s < 8; s++) {
            int64_t b = 8 * sb + s;
            const int8_t *qx = x->q + 32 * b;
            int32_t isum = 0, msum = 0;
            for (int h = 0; h < 2; h++) {
                int32_t vs = 0, xs = 0;
                for (int j = 16 * h; j < 16 * h + 16; j++) {
                    vs += qb_q2k_value(w + 16, 32 * s + j) * qx[j];
                    xs += qx[j];
                }
                isum += (w[2 * s + h] & 0x0F) * vs;
                msum += (w[2 * s + h] >> 4) * xs;
            }
            acc += d * x->d[b] * (float)isum - dmin * (x->d[b] * (float)msum);
        }
    }
    return acc;
}

/* IQ4_NL: Q8_0 with the values looked up in the grid. */
static float dot_iq4_nl(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const uint8_t *qs = w + 2;
        const int8_t *qx = x->q + 32 * b;
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += qb_iq4_value(qs[j] & 0x0F) * qx[j] + qb_iq4_value(qs[j] >> 4) * qx[j + 16];
        acc += qb_half(w) * x->d[b] * (float)isum;
    }
    return acc;
}

/* IQ4_XS: IQ4_NL sub-blocks whose integer scales multiply their exact sums. */
static float dot_iq4_xs(const uint8_t *w, const struct qtok *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, w += 136) {
        float d = qb_half(w);
        for (int s = 0; s < 8; s++) {
            int64_t b = 8 * sb + s;
            const uint8_t *qs = w + 8 + 16 * s;
            const int8_t *qx = x->q + 32 * b;
            int32_t isum = 0;
            for (int j = 0; j < 16; j++)
                isum += qb_iq4_value(qs[j] & 0x0F) * qx[j] + qb_iq4_value(qs[j] >> 4) * qx[j + 16];
            acc += d * x->d[b] * (float)(qb_iq4xs_scale(w, s) * isum);
        }
    }
    return acc;
}

static float dot_float(enum ggml_type type, const uint8_t *w, const float *x, int64_t n)
{
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        float wk;
        switch (type) {
        case GGML_TYPE_F16: wk = qb_half(w + 2 * k); break;
        case GGML_TYPE_BF16: wk = kvb_bf16_to_f32(qb_u16(w + 2 * k)); break;
        default: memcpy(&wk, w + 4 * k, 4); break;
        }
        acc += wk * x[k];
    }
    return acc;
}

static size_t scratch_bytes(const struct mm_weight *w, int64_t n_tok) { return 0; }

static void rows(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1, void *scratch)
{
    int64_t nb = in->n_in / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int64_t t = 0; t < in->n_tok; t++) {
            float *out = y + t * w->n_out + r;
            if (!mm_type_is_quantized(w->type)) {
                *out = dot_float(w->type, wr, in->xf + t * in->xf_stride, in->n_in);
                continue;
            }
            const uint8_t *xt = in->xq + (size_t)t * in->xq_stride;
            struct qtok x = {(const int8_t *)xt, (const float *)(xt + off_d(nb)), (const int32_t *)(xt + off_s(nb))};
            switch (w->type) {
            case GGML_TYPE_Q4_0: *out = dot_q4_0(wr, &x, nb); break;
            case GGML_TYPE_Q4_1: *out = dot_q4_1(wr, &x, nb); break;
            case GGML_TYPE_Q5_0: *out = dot_q5_0(wr, &x, nb); break;
            case GGML_TYPE_Q5_1: *out = dot_q5_1(wr, &x, nb); break;
            case GGML_TYPE_Q8_0: *out = dot_q8_0(wr, &x, nb); break;
            case GGML_TYPE_Q4_K: *out = dot_q4_K(wr, &x, nb); break;
            case GGML_TYPE_Q6_K: *out = dot_q6_K(wr, &x, nb); break;
            case GGML_TYPE_Q5_K: *out = dot_q5_K(wr, &x, nb); break;
            case GGML_TYPE_Q3_K: *out = dot_q3_K(wr, &x, nb); break;
            case GGML_TYPE_Q2_K: *out = dot_q2_K(wr, &x, nb); break;
            case GGML_TYPE_IQ4_NL: *out = dot_iq4_nl(wr, &x, nb); break;
            case GGML_TYPE_IQ4_XS: *out = dot_iq4_xs(wr, &x, nb); break;
            default: *out = 0.0f; break; /* unreachable: mm_apply checked the type */
            }
        }
    }
}

const struct mm_kernels mm_kernels_scalar = {"scalar", act_bytes, NULL, quantize, scratch_bytes, rows, 0, NULL, NULL};
