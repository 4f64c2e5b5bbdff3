/* dtype.h — ggml tensor element types as GGUF stores them, their block
 * geometry, and scalar half/bfloat conversions.
 *
 * Values of enum ggml_type are the on-disk codes of the GGUF format; do not
 * renumber. Types kvbatch cannot compute with still have traits here so that
 * a GGUF reader can size their data and refuse them by name. */
#ifndef KVB_DTYPE_H
#define KVB_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_COUNT_ = 40 /* upper bound for table sizes, not a type */
};

struct ggml_type_traits {
    const char *name;     /* "Q4_1"; NULL for codes that are not types */
    uint32_t block_elems; /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
    bool computable;      /* kvbatch can dequantize / multiply it */
};

/* Traits of a type code, or NULL when the code is not a known type. */
const struct ggml_type_traits *ggml_type_get_traits(uint32_t type);

/* Bytes taken by `n_elems` elements of `type` stored contiguously; returns
 * false when n_elems is not a whole number of blocks or the size overflows. */
bool ggml_type_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out_bytes);

float kvb_fp16_to_f32(uint16_t h);
uint16_t kvb_f32_to_fp16(float f); /* round to nearest even */
/* n of kvb_f32_to_fp16, bit for bit (NaN payloads aside), with the CPU's
 * F16C conversion when it has one: the KV cache stores every K and V value
 * of every token through here. */
void kvb_f32_to_fp16_n(uint16_t *dst, const float *src, int64_t n);
/* The F16C loop (dtype_avx2.c); call only on a CPU with F16C. */
void kvb_f32_to_fp16_n_f16c(uint16_t *dst, const float *src, int64_t n);
float kvb_bf16_to_f32(uint16_t b);
uint16_t kvb_f32_to_bf16(float f); /* round to nearest even */

#endif
