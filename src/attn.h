/* attn.h — CPU attention over paged KV, and the small per-token ops of a
 * transformer layer (RMSNorm, RoPE, SwiGLU).
 *
 * Every output element is computed by a fixed sequence of float operations
 * that depends only on that token's inputs (never on the batch it came in),
 * which the engine's determinism guarantee rests on. */
#ifndef KVB_ATTN_H
#define KVB_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x. */
void attn_rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps);

/* Rotates n_heads heads of head_dim floats at position pos (first rope_dim
 * dims of each head). inv_freq has rope_dim/2 entries. */
void attn_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t rope_dim, enum rope_kind kind,
               int32_t pos, const float *inv_freq);

/* g[i] = silu(g[i]) * u[i]. */
void attn_swiglu(float *g, const float *u, int64_t n);

/* One query head over positions [0, n_pos) of one sequence (K/V stored as
 * IEEE half floats, as llama.cpp stores them by default: half the memory
 * and bandwidth of f32, and what the persistent cache writes):
 * out = softmax(q·K^T * scale) V. K/V rows are found through the block
 * table: position p lives in block table[p / block_size], slot p % block_size,
 * at k_base + block * block_stride + slot * row_stride (same for v_base).
 * scores is scratch of n_pos floats. */
struct attn_kv_view {
    const uint16_t *k_base, *v_base; /* fp16 pool base already offset to this layer and kv head */
    int64_t block_stride;            /* elements between consecutive blocks */
    int64_t row_stride;              /* elements between consecutive slots */
    int32_t block_size;
    const int32_t *table;
};
void attn_head(float *out, const float *q, int32_t head_dim, const struct attn_kv_view *kv, int32_t n_pos,
               float scale, float *scores);

/* AVX2+FMA versions (attn_avx2.c): same contracts, except that `scores`
 * must have room for n_pos rounded up to a multiple of 8. Call only when
 * attn_have_avx2(). */
void attn_head_avx2(float *out, const float *q, int32_t head_dim, const struct attn_kv_view *kv, int32_t n_pos,
                    float scale, float *scores);
void attn_swiglu_avx2(float *g, const float *u, int64_t n);
/* `group` query heads (contiguous in q and out) that share one KV head;
 * head h's scores use scores + h * score_stride (room for n_pos rounded up
 * to 8). */
void attn_group_avx2(float *out, const float *q, int32_t group, int32_t head_dim, const struct attn_kv_view *kv,
                     int32_t n_pos, float scale, float *scores, int64_t score_stride);
bool attn_have_avx2(void);

#endif
