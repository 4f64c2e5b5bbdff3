/* dtype.c — block geometry of ggml types and scalar float conversions. */
#include "base/dtype.h"

#include <string.h>

#include "base/cpu.h"

static const struct ggml_type_traits traits[GGML_TYPE_COUNT_] = {
    [GGML_TYPE_F32] = {"F32", 1, 4, true},
    [GGML_TYPE_F16] = {"F16", 1, 2, true},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [GGML_TYPE_Q4_1] = {"Q4_1", 32, 20, true},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, 22, true},
    [GGML_TYPE_Q5_1] = {"Q5_1", 32, 24, true},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [GGML_TYPE_Q8_1] = {"Q8_1", 32, 36, false},
    [GGML_TYPE_Q2_K] = {"Q2_K", 256, 84, true},
    [GGML_TYPE_Q3_K] = {"Q3_K", 256, 110, true},
    [GGML_TYPE_Q4_K] = {"Q4_K", 256, 144, true},
    [GGML_TYPE_Q5_K] = {"Q5_K", 256, 176, true},
    [GGML_TYPE_Q6_K] = {"Q6_K", 256, 210, true},
    [GGML_TYPE_Q8_K] = {"Q8_K", 256, 292, false},
    [GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, false},
    [GGML_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, false},
    [GGML_TYPE_IQ1_S] = {"IQ1_S", 256, 50, false},
    [GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, true},
    [GGML_TYPE_IQ3_S] = {"IQ3_S", 256, 110, false},
    [GGML_TYPE_IQ2_S] = {"IQ2_S", 256, 82, false},
    [GGML_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136, true},
    [GGML_TYPE_I8] = {"I8", 1, 1, false},
    [GGML_TYPE_I16] = {"I16", 1, 2, false},
    [GGML_TYPE_I32] = {"I32", 1, 4, false},
    [GGML_TYPE_I64] = {"I64", 1, 8, false},
    [GGML_TYPE_F64] = {"F64", 1, 8, false},
    [GGML_TYPE_IQ1_M] = {"IQ1_M", 256, 56, false},
    [GGML_TYPE_BF16] = {"BF16", 1, 2, true},
    [GGML_TYPE_TQ1_0] = {"TQ1_0", 256, 54, false},
    [GGML_TYPE_TQ2_0] = {"TQ2_0", 256, 66, false},
};

const struct ggml_type_traits *ggml_type_get_traits(uint32_t type)
{
    if (type >= GGML_TYPE_COUNT_ || traits[type].name == NULL) return NULL;
    return &traits[type];
}

bool ggml_type_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out_bytes)
{
    const struct ggml_type_traits *t = ggml_type_get_traits(type);
    if (!t || n_elems % t->block_elems != 0) return false;
    uint64_t blocks = n_elems / t->block_elems;
    if (blocks > UINT64_MAX / t->block_bytes) return false;
    *out_bytes = blocks * t->block_bytes;
    return true;
}

float kvb_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                mant <<= 1;
                e++;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kvb_f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (absx < 0x38800000u) {                                  /* result is subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        /* value = m * 2^(e-150) and the subnormal unit is 2^-24, so the
         * half mantissa is m * 2^(e-126): a right shift by 126-e (14..24). */
        uint32_t s = 126 - e;
        uint32_t q = m >> s;
        uint32_t rem = m & ((1u << s) - 1);
        uint32_t half = 1u << (s - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (absx >> 23) - 127 + 15;
    uint32_t m = absx & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exponent: correct */
    return (uint16_t)(sign | h);
}

void kvb_f32_to_fp16_n(uint16_t *dst, const float *src, int64_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_features().f16c) {
        kvb_f32_to_fp16_n_f16c(dst, src, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = kvb_f32_to_fp16(src[i]);
}

float kvb_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kvb_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
