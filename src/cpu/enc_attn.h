/* enc_attn.h — an encoder's attention for one head of one sequence, every
 * row attending to every row (no mask, no paged KV: the rows of one
 * forward pass): out[i] = softmax(scale q_i . K^T) V.
 *
 * enc_attn is the reference (plain loops, libm's expf, scores summed in
 * double); enc_attn_avx2 (enc_attn_avx2.c, AVX2+FMA: call only when
 * attn_have_avx2()) computes the same with K transposed in scratch, eight
 * keys or eight output values a lane set, and exp256's polynomial: equal
 * to the reference to float rounding (tests/test_enc_attn.c), not bit for
 * bit. A row's result depends only on its sequence's rows.
 *
 * q, k, v and out are rows of head_dim floats at a stride of ld floats
 * (out may not alias the others). scratch: enc_attn_scratch_floats(n,
 * head_dim) floats, 32-byte aligned. */
#ifndef KVB_ENC_ATTN_H
#define KVB_ENC_ATTN_H

#include <stdint.h>

int64_t enc_attn_scratch_floats(int32_t n, int32_t head_dim);
void enc_attn(float *out, const float *q, const float *k, const float *v, int64_t ld, int32_t n, int32_t head_dim,
              float scale, float *scratch);
void enc_attn_avx2(float *out, const float *q, const float *k, const float *v, int64_t ld, int32_t n, int32_t head_dim,
                   float scale, float *scratch);

#endif
