/* quant.c — reference dequantization of ggml weight blocks.
 *
 * One plain scalar function per type, written straight from ggml's block
 * layouts (ggml-common.h) so a reader can check it against them line by
 * line. Nothing here is fast: the forward pass never dequantizes whole
 * tensors (see matmul.c), and the tests use these as the ground truth the
 * fast paths are measured against. The block offsets below are spelled out
 * as byte offsets rather than structs so that no padding rule can sneak in. */
#include "model/quant.h"

#include <string.h>

#include "model/quant_blocks.h"

bool quant_type_supported(enum ggml_type type)
{
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

/* Q4_0: {half d; u8 qs[16]}; element j is d * ((qs[j] & 15) - 8), element
 * j + 16 is d * ((qs[j] >> 4) - 8). */
static void dequant_q4_0(const uint8_t *b, float *y)
{
    float d = qb_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1: {half d; half m; u8 qs[16]}; element = d * nibble + m. */
static void dequant_q4_1(const uint8_t *b, float *y)
{
    float d = qb_half(b), m = qb_half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0: {half d; u8 qh[4]; u8 qs[16]}; bit j of the little-endian qh word is
 * the fifth bit of element j; element = d * (q5 - 16). */
static void dequant_q5_0(const uint8_t *b, float *y)
{
    float d = qb_half(b);
    uint32_t qh = qb_u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int h0 = (int)((qh >> j) & 1) << 4;
        int h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((qs[j] & 0x0F) | h0) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
    }
}

/* Q5_1: {half d; half m; u8 qh[4]; u8 qs[16]}; element = d * q5 + m. */
static void dequant_q5_1(const uint8_t *b, float *y)
{
    float d = qb_half(b), m = qb_half(b + 2);
    uint32_t qh = qb_u32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int h0 = (int)((qh >> j) & 1) << 4;
        int h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)((qs[j] & 0x0F) | h0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
    }
}

/* Q8_0: {half d; i8 qs[32]}; element = d * q. */
static void dequant_q8_0(const uint8_t *b, float *y)
{
    float d = qb_half(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

/* Q4_K: {half d; half dmin; u8 scales[12]; u8 qs[128]} over 256 elements in
 * 8 sub-blocks of 32. Sub-block s has a 6-bit scale sc and min m (packed, see
 * qb_q4k_scale_min); element = d*sc * q - dmin*m. The 32 bytes qs[32c..32c+31]
 * hold sub-block 2c in their low nibbles and 2c+1 in their high nibbles. */
static void dequant_q4_K(const uint8_t *b, float *y)
{
    float d = qb_half(b), dmin = qb_half(b + 2);
    const uint8_t *scales = b + 4;
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        uint8_t sc0, m0, sc1, m1;
        qb_q4k_scale_min(2 * c, scales, &sc0, &m0);
        qb_q4k_scale_min(2 * c + 1, scales, &sc1, &m1);
        float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
        float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d0 * (float)(qs[32 * c + l] & 0x0F) - mm0;
            y[64 * c + 32 + l] = d1 * (float)(qs[32 * c + l] >> 4) - mm1;
        }
    }
}

/* Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d} over 256 elements.
 * Element e has a 6-bit value q6 (qb_q6k_value) and the int8 scale
 * scales[e / 16]; element = d * scale * (q6 - 32). */
static void dequant_q6_K(const uint8_t *b, float *y)
{
    float d = qb_half(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int e = 0; e < 256; e++) y[e] = d * (float)sc[e / 16] * (float)(qb_q6k_value(b, e) - 32);
}

/* Q5_K: Q4_K's scales and mins, 5-bit values (qb_q5k_value); element =
 * d*sc * q - dmin*m, in that order. */
static void dequant_q5_K(const uint8_t *b, float *y)
{
    float d = qb_half(b), dmin = qb_half(b + 2);
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        qb_q4k_scale_min(s, b + 4, &sc, &m);
        float ds = d * (float)sc, ms = dmin * (float)m;
        for (int l = 0; l < 32; l++) y[32 * s + l] = ds * (float)qb_q5k_value(b, 32 * s + l) - ms;
    }
}

/* Q3_K: element = (d * scale) * (q3 - 4), scale per 16 elements
 * (qb_q3k_scale, qb_q3k_value). */
static void dequant_q3_K(const uint8_t *b, float *y)
{
    float d = qb_half(b + 108);
    for (int e = 0; e < 256; e++) y[e] = d * (float)qb_q3k_scale(b + 96, e / 16) * (float)(qb_q3k_value(b, e) - 4);
}

/* Q2_K: element = (d * sc) * q2 - dmin * m, with sc and m the nibbles of
 * scales[e / 16]. */
static void dequant_q2_K(const uint8_t *b, float *y)
{
    float d = qb_half(b + 80), dmin = qb_half(b + 82);
    for (int e = 0; e < 256; e++) {
        float dl = d * (float)(b[e / 16] & 0x0F), ml = dmin * (float)(b[e / 16] >> 4);
        y[e] = dl * (float)qb_q2k_value(b + 16, e) - ml;
    }
}

/* IQ4_NL: {half d; u8 qs[16]}; element j is d * grid[qs[j] & 15], element
 * j + 16 is d * grid[qs[j] >> 4] (qb_iq4_value). */
static void dequant_iq4_nl(const uint8_t *b, float *y)
{
    float d = qb_half(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)qb_iq4_value(b[2 + j] & 0x0F);
        y[j + 16] = d * (float)qb_iq4_value(b[2 + j] >> 4);
    }
}

/* IQ4_XS: sub-block ib is an IQ4_NL block with scale d * (its 6-bit scale
 * - 32) (qb_iq4xs_scale). */
static void dequant_iq4_xs(const uint8_t *b, float *y)
{
    float d = qb_half(b);
    for (int ib = 0; ib < 8; ib++) {
        float dl = d * (float)qb_iq4xs_scale(b, ib);
        const uint8_t *qs = b + 8 + 16 * ib;
        for (int j = 0; j < 16; j++) {
            y[32 * ib + j] = dl * (float)qb_iq4_value(qs[j] & 0x0F);
            y[32 * ib + j + 16] = dl * (float)qb_iq4_value(qs[j] >> 4);
        }
    }
}

enum kvb_status quant_dequant_row(enum ggml_type type, const void *src, float *dst, int64_t n)
{
    if (!quant_type_supported(type)) return KVB_ERR_UNSUPPORTED;
    const struct ggml_type_traits *tr = ggml_type_get_traits((uint32_t)type);
    if (!tr || n < 0 || n % tr->block_elems != 0) return KVB_ERR_INVALID_ARG;
    const uint8_t *p = src;
    int64_t nb = n / tr->block_elems;
    int64_t be = tr->block_elems;
    for (int64_t i = 0; i < nb; i++, p += tr->block_bytes) {
        float *y = dst + i * be;
        switch (type) {
        case GGML_TYPE_F32: memcpy(y, p, 4); break;
        case GGML_TYPE_F16: y[0] = qb_half(p); break;
        case GGML_TYPE_BF16: y[0] = kvb_bf16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
        case GGML_TYPE_Q4_0: dequant_q4_0(p, y); break;
        case GGML_TYPE_Q4_1: dequant_q4_1(p, y); break;
        case GGML_TYPE_Q5_0: dequant_q5_0(p, y); break;
        case GGML_TYPE_Q5_1: dequant_q5_1(p, y); break;
        case GGML_TYPE_Q8_0: dequant_q8_0(p, y); break;
        case GGML_TYPE_Q4_K: dequant_q4_K(p, y); break;
        case GGML_TYPE_Q6_K: dequant_q6_K(p, y); break;
        case GGML_TYPE_Q5_K: dequant_q5_K(p, y); break;
        case GGML_TYPE_Q3_K: dequant_q3_K(p, y); break;
        case GGML_TYPE_Q2_K: dequant_q2_K(p, y); break;
        case GGML_TYPE_IQ4_NL: dequant_iq4_nl(p, y); break;
        case GGML_TYPE_IQ4_XS: dequant_iq4_xs(p, y); break;
        default: return KVB_ERR_UNSUPPORTED;
        }
    }
    return KVB_OK;
}
