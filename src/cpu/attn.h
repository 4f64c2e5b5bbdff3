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

#include "backend/kvtype.h"
#include "model/model.h"

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x. */
void attn_rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps);

/* Rotates n_heads heads of head_dim floats at position pos (first rope_dim
 * dims of each head). inv_freq has rope_dim/2 entries (model_rope_freqs);
 * cos and sin are multiplied by mscale (m->rope.mscale: 1 unless yarn). */
void attn_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t rope_dim, enum rope_kind kind, int32_t pos,
               const float *inv_freq, float mscale);

/* g[i] = silu(g[i]) * u[i]. */
void attn_swiglu(float *g, const float *u, int64_t n);

/* g[i] = gelu_tanh(g[i]) * u[i], with gelu_tanh(x) = 0.5 x (1 + tanh(
 * sqrt(2/pi) (x + 0.044715 x^3))): PyTorch's gelu(approximate="tanh"),
 * Gemma's hidden activation (libm tanhf: the reference). */
void attn_geglu(float *g, const float *u, int64_t n);

/* c * tanh(x / c) (c > 0): Gemma 2's soft-capping of logits (libm tanhf). */
float attn_softcap_ref(float x, float c);

/* The soft-cap of an attention score, c * attn_tanh(x / c): tanh through
 * attn_exp, so that the SIMD kernels compute the same bits. */
float attn_tanh(float x);
static inline float attn_softcap(float x, float c) { return c * attn_tanh(x / c); }

/* One query head over positions [p_lo, n_pos) of one sequence (p_lo > 0: a
 * sliding window, whose earlier blocks are never read). K/V rows are
 * stored as the pool type kv->type says (backend/kvtype.h: K rows as
 * kv_k_rows, V rows as kv_v_rows): IEEE half floats, as llama.cpp stores
 * them by default (half the memory and bandwidth of f32), or quantized in
 * groups of 32 (q8, q4). K/V rows are found through the block table:
 * position p lives in block table[p / block_size], slot p % block_size, at
 * k_base + block * block_stride + slot * k_row_stride (v_base and
 * v_row_stride for V), all counted in 2-byte pool words: every row of every
 * type is a whole number of them (34- and 20-byte groups), so the f16
 * strides are element counts, as they always were.
 *
 * This is the reference, and it fixes the arithmetic every attention kernel
 * must reproduce bit for bit (so a row's result never depends on the batch
 * or the kernel that ran it), with k[p][i] and v[p][i] the row's values as
 * kv_dequantize_row gives them (for f16, the widened half):
 *   qs[i]  = q[i] * scale
 *   s[p]   = fma chain over i ascending: s = fma(k[p][i], qs[i], s), from 0;
 *            then attn_softcap(s, kv->softcap) when kv->softcap > 0
 *   (positions p < p_lo take no part: e[p] = 0, as if skipped)
 *   m      = max s[p]
 *   e[p]   = attn_exp(s[p] - m)
 *   P[k]   = sum of e[p] over p = k, k+8, k+16, ... in that order, from 0
 *   sum    = ((P0 + P4) + (P2 + P6)) + ((P1 + P5) + (P3 + P7))
 *   o[i]   = fma chain over p ascending: o = fma(e[p], v[p][i], o), from 0
 *   out[i] = o[i] * (1 / sum)
 * scores is scratch of n_pos floats. A quantized head's row is read in
 * place, a group at a time (never a full-precision copy of the context). */
struct attn_kv_view {
    const uint16_t *k_base, *v_base; /* pool base (2-byte words) already offset to this layer and kv head */
    int64_t block_stride;            /* words between consecutive blocks */
    int64_t row_stride;              /* words between consecutive K slots (and V slots, unless v_row_stride) */
    int32_t block_size;
    const int32_t *table;
    enum kv_type type;    /* the pool type (zero: f16) */
    int64_t v_row_stride; /* words between consecutive V slots; 0: row_stride */
    float softcap;        /* > 0: scores soft-capped (model_ops.attn_softcap); 0: not */
};
void attn_head(float *out, const float *q, int32_t head_dim, const struct attn_kv_view *kv, int32_t p_lo, int32_t n_pos,
               float scale, float *scores);
/* e^x by a fixed polynomial (relative error ~2e-7); identical to the SIMD
 * kernels' exp on every input. */
float attn_exp(float x);

/* AVX2+FMA SwiGLU and GeGLU (attn_avx2.c); call only when attn_have_avx2(). */
void attn_swiglu_avx2(float *g, const float *u, int64_t n);
void attn_geglu_avx2(float *g, const float *u, int64_t n);

/* attn_head for a tile of query tokens over one KV head, each token with
 * its own block table and length (attn_tile_avx2.c; AVX2+FMA, call only
 * when attn_have_avx2()). Every (token, query head) row gets exactly
 * attn_head's result. Where tokens of the tile read the same KV block (a
 * shared prompt prefix, the tokens of one prefill chunk), its rows are
 * fetched and widened once for all of them. Tokens that share blocks should
 * be adjacent in `toks` (only adjacent ones are found). `kv->table` is
 * unused. scratch: attn_tile_scratch_floats(...) floats (any alignment). */
struct attn_tile_tok {
    const float *q;       /* group * head_dim query floats */
    float *out;           /* group * head_dim output floats */
    const int32_t *table; /* block table covering [p_lo, n_pos) (earlier entries are not read) */
    int32_t n_pos;        /* positions attended end here (causal: own position + 1) */
    int32_t p_lo;         /* and start here (0, or where a sliding window starts) */
};
int64_t attn_tile_scratch_floats(int32_t n_tok, int32_t group, int32_t head_dim, int32_t max_pos, int32_t block_size);
void attn_tile_avx2(const struct attn_tile_tok *toks, int32_t n_tok, int32_t group, int32_t head_dim,
                    const struct attn_kv_view *kv, float scale, float *scratch);
/* The same with 16-lane AVX-512 inner loops (attn_tile_avx512.c; call
 * only when attn_have_avx512()): bit for bit the same results. */
void attn_tile_avx512(const struct attn_tile_tok *toks, int32_t n_tok, int32_t group, int32_t head_dim,
                      const struct attn_kv_view *kv, float scale, float *scratch);
bool attn_have_avx2(void);
bool attn_have_avx512(void);

#endif
