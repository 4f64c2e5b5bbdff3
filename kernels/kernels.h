/* kernels.h — the CUDA kernels of the CUDA backend, behind a plain C interface.
 *
 * Each kernel family lives in its own .cu file (k_embed, k_norm, k_rope,
 * k_act, k_attn, k_sample, k_enc, k_moe) and is reached through a launcher declared here: it takes
 * device pointers and a stream, enqueues the kernel and returns the launch
 * status (cudaSuccess, or e.g. cudaErrorInvalidValue for a shape the kernel
 * cannot take). Launchers never synchronise; errors raised while a kernel
 * runs surface at the next synchronising call. A zero-sized call enqueues
 * nothing and returns cudaSuccess.
 *
 * Every kernel has a plain C reference in src/ that tests/test_cuda_kernels.c
 * compares it with (named beside each launcher). Without a GPU, the same
 * tests run with the kernels compiled for the CPU over a small CUDA
 * emulation (kernels/emu/emu.sh): that checks their logic, not the device. Activations are f32;
 * GEMM inputs bf16; KV fp16 or quantized (q8, q4: struct kcu_paged) — all
 * 16-bit types travel as uint16_t so that this header needs no CUDA C++
 * types.
 *
 * Data layouts are row-major. "ld" is the distance in elements between the
 * starts of consecutive rows, so a kernel can read e.g. the K part of a
 * fused Q|K|V row without a copy. */
#ifndef KVB_KERNELS_H
#define KVB_KERNELS_H

#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- k_embed.cu ------------------------------------------------------------- */

/* out[t][i] = table[tokens[t]][i] (bf16 -> f32, exact).
 * table (n_vocab, n_embd) bf16; tokens (n_tok) must be in range (checked on
 * the host); out (n_tok, n_embd). Reference: kvb_bf16_to_f32 per element. */
cudaError_t kcu_embed(float *out, const uint16_t *table, const int32_t *tokens, int32_t n_tok, int32_t n_embd,
                      cudaStream_t stream);

/* y[i] *= s for i < n (Gemma's embedding scale). Reference: the loop in be_cpu.c. */
cudaError_t kcu_scale(float *y, int64_t n, float s, cudaStream_t stream);

/* ---- k_norm.cu -------------------------------------------------------------- */

/* RMSNorm over sub-rows of n elements: for r < n_rows and j < n_sub,
 *   src = x + (rows ? rows[r] : r) * x_ld + j * n
 *   dst = out + r * out_ld + j * n
 *   dst[i] = src[i] / sqrt(mean(src^2) + eps) * w[i]
 * n_sub > 1 is the per-head Q/K norm of qwen3 (one row per token, n_sub heads
 * of n = head_dim); `rows` gathers the rows whose logits are wanted. out may
 * alias x when rows is NULL and out_ld == x_ld. The sum of squares is reduced
 * in a fixed order, so a row's result does not depend on the other rows.
 * Reference: attn_rmsnorm. */
cudaError_t kcu_rmsnorm(float *out, int64_t out_ld, const float *x, int64_t x_ld, const int32_t *rows, int32_t n_rows,
                        int32_t n_sub, int32_t n, const float *w, float eps, cudaStream_t stream);

/* kcu_rmsnorm with n_sub = 1 whose result is stored rounded to bf16: the
 * next GEMM's input, bit for bit what kcu_f32_to_bf16 would make of the f32
 * result. Reference: attn_rmsnorm, then kvb_f32_to_bf16. */
cudaError_t kcu_rmsnorm_bf16(uint16_t *out, int64_t out_ld, const float *x, int64_t x_ld, const int32_t *rows,
                             int32_t n_rows, int32_t n, const float *w, float eps, cudaStream_t stream);

/* y[r][i] += rmsnorm(x[r])[i] for r < n_rows, i < n (rows n apart in both):
 * the post-attention / post-FFN norm of Gemma, applied to a projection's
 * output as it joins the residual stream. The norm is kcu_rmsnorm's, in the
 * same fixed order. Reference: attn_rmsnorm, then the add (be_cpu.c's
 * add_residual). */
cudaError_t kcu_rmsnorm_add(float *y, const float *x, int32_t n_rows, int32_t n, const float *w, float eps,
                            cudaStream_t stream);

/* ---- k_rope.cu -------------------------------------------------------------- */

/* Rotates, in place, n_heads heads of head_dim floats in each of n_tok rows
 * (row t starts at x + t * ld) by the position tok_pos[t]: the first rope_dim
 * dims of each head, in pairs (2i, 2i+1) when neox == 0 (llama) or
 * (i, i + rope_dim/2) when neox != 0 (qwen). inv_freq (rope_dim/2) on the
 * device, scaling included (model_rope_freqs); cos and sin are multiplied by
 * mscale (yarn's attention factor, else 1). Reference: attn_rope. */
cudaError_t kcu_rope(float *x, int64_t ld, int32_t n_tok, int32_t n_heads, int32_t head_dim, int32_t rope_dim, int neox,
                     const int32_t *tok_pos, const float *inv_freq, float mscale, cudaStream_t stream);

/* ---- k_act.cu --------------------------------------------------------------- */

/* out[t][i] = silu(gu[t][i]) * gu[t][n_ff + i]: gu holds each token's gate
 * and up projections side by side (n_tok, 2 * n_ff); out is (n_tok, n_ff).
 * Reference: attn_swiglu. */
cudaError_t kcu_swiglu(float *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream);
/* The same, stored rounded to bf16 (the down projection's input). */
cudaError_t kcu_swiglu_bf16(uint16_t *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream);

/* The same with GeGLU: out[t][i] = gelu_tanh(gate) * up, the tanh GELU by
 * the device's tanhf. Reference: attn_geglu. */
cudaError_t kcu_geglu(float *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream);
cudaError_t kcu_geglu_bf16(uint16_t *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream);

/* x[r * ld + i] = cap * tanh(x[r * ld + i] / cap) for r < n_rows, i < n
 * (cap > 0): Gemma 2's final logit soft-cap. Reference: attn_softcap_ref. */
cudaError_t kcu_softcap(float *x, int64_t ld, int32_t n_rows, int32_t n, float cap, cudaStream_t stream);

/* y[i] += x[i] for i < n (the residual add). Reference: the loop in be_cpu.c. */
cudaError_t kcu_add(float *y, const float *x, int64_t n, cudaStream_t stream);

/* y[r * ld + i] += b[i] for r < n_rows, i < n (qwen2's Q/K/V bias). */
cudaError_t kcu_add_bias(float *y, int64_t ld, const float *b, int32_t n_rows, int32_t n, cudaStream_t stream);

/* y[i] = bf16(x[i]), round to nearest even. Reference: kvb_f32_to_bf16. */
cudaError_t kcu_f32_to_bf16(uint16_t *y, const float *x, int64_t n, cudaStream_t stream);

/* ---- k_sample.cu ------------------------------------------------------------ */

/* out[r] = the greedy choice over row (rows ? rows[r] : r) of x (n floats,
 * rows ld apart): the lowest index holding the largest value that is not
 * NaN, -1 when every value is NaN or -inf. Reference: sampler_greedy
 * (identical results: the comparisons are exact). */
cudaError_t kcu_argmax(int32_t *out, const float *x, int64_t ld, const int32_t *rows, int32_t n_rows, int32_t n,
                       cudaStream_t stream);

/* ---- k_attn.cu -------------------------------------------------------------- */

/* The largest head_dim the attention kernel takes. */
#define KCU_ATTN_MAX_HEAD_DIM 256

/* How the pool stores K/V rows (backend/kvtype.h, whose enum kv_type has
 * the same values; be_cuda.c asserts it). Row formats: fp16, or groups of
 * KCU_KV_GROUP elements with an fp16 scale and 32 int8 (q8: 34 bytes), or
 * an fp16 scale, an fp16 minimum and 16 bytes of nibbles (q4: 20 bytes).
 * Pool types: f16 and q8 store K and V rows in that format; the q4 pool
 * stores V rows as q4 and K rows as q8 (kvtype.h's kv_k_rows / kv_v_rows:
 * 4-bit keys cost too much accuracy). Kept as plain numbers here so that
 * this header needs nothing but CUDA's. */
#define KCU_KV_F16 0
#define KCU_KV_Q8 1
#define KCU_KV_Q4 2
#define KCU_KV_GROUP 32
#define KCU_KV_Q8_BYTES 34 /* one group */
#define KCU_KV_Q4_BYTES 20

/* Where each token of a step lives in the paged KV pool. The pool has the
 * CPU backend's layout: block b starts at pool + b * block_bytes and holds
 * [layer][K | V][slot][row], a row being kv_dim elements stored in the
 * pool type's K or V row format (kv_row_bytes: 2 * kv_dim bytes for f16,
 * kv_dim / 32 groups in order along kv_dim for q8 and q4), so one layer
 * takes block_size * (K row bytes + V row bytes) and block_bytes is
 * n_layer times that (be_block_bytes). Token t of the step is at position tok_pos[t] of a sequence
 * whose block table starts at blocks + tok_table[t]; position p is in block
 * table[p / block_size], slot p % block_size. */
struct kcu_paged {
    uint8_t *pool; /* (n_blocks, block_bytes) */
    int64_t block_bytes;
    int32_t kv_type; /* pool type: KCU_KV_F16, KCU_KV_Q8 or KCU_KV_Q4 */
    int32_t block_size;
    int32_t kv_dim; /* n_head_kv * head_dim; a multiple of KCU_KV_GROUP for q8 and q4 */
    int32_t layer;
    int32_t n_tok;
    const int32_t *tok_pos;   /* (n_tok) */
    const int32_t *tok_table; /* (n_tok) offsets into blocks */
    const int32_t *blocks;    /* concatenated block tables */
    /* Attention only (the store ignores them; zero: plain causal attention): */
    int32_t window; /* > 0: token t attends positions (tok_pos[t] - window, tok_pos[t]] only, and never
                       reads a block wholly before them */
    float softcap;  /* > 0: each score s (after the scale) becomes softcap * tanh(s / softcap) */
};

/* Writes each token's K and V rows (k + t*ld, v + t*ld; kv_dim floats each)
 * into its slot of layer kv->layer in the pool type's row formats: f16
 * rounded to nearest even, q8 and q4 group by group with kvtype.h's formulas (one warp per
 * group: the group's max and min by shuffles, which are exact, then the
 * same IEEE divisions, roundings and clamps). cudaErrorInvalidValue for an
 * unknown type or a kv_dim that is not whole groups. Reference:
 * kv_quantize_row (bit for bit; for f16 the store loop of be_cpu.c,
 * kvb_f32_to_fp16). */
cudaError_t kcu_kv_store(const struct kcu_paged *kv, const float *k, const float *v, int64_t ld, cudaStream_t stream);

/* Causal attention for every (token, query head) of a step, prefill chunks
 * and decode tokens mixed: token t attends to positions [0, tok_pos[t]] of
 * its sequence, or the last kv->window of them, soft-capped when
 * kv->softcap > 0 (its own K/V and those of earlier tokens of the step must
 * be stored first). Query head h reads KV head h / (n_head / n_head_kv).
 * q: head h of token t at q + t * q_ld + h * head_dim.
 * out: (n_tok, n_head * head_dim). softmax in f32 with scale `scale`.
 * One thread block per (token, head) with a fixed split of positions over
 * its warps: a token's result does not depend on the rest of the batch.
 * cudaErrorInvalidValue when head_dim > KCU_ATTN_MAX_HEAD_DIM or n_head is
 * not a multiple of n_head_kv, or a quantized kv_type with head_dim not a
 * multiple of KCU_KV_GROUP. Quantized rows are read as they are stored:
 * each lane takes element j of each group its dimensions fall in and
 * dequantizes it with kvtype.h's formula (q8: d * q, q4: fmaf(d, q, m)),
 * so the products see exactly kv_dequantize_row's values; nothing is
 * dequantized into a copy. Reference: attn_head (f16); for q8 and q4
 * kv_dequantize_row, then attn_head's arithmetic on those floats. */
cudaError_t kcu_attn(float *out, const float *q, int64_t q_ld, const struct kcu_paged *kv, int32_t n_head,
                     int32_t n_head_kv, int32_t head_dim, float scale, cudaStream_t stream);
/* The same, stored rounded to bf16 (the output projection's input): bit
 * for bit kcu_f32_to_bf16 of kcu_attn's result. */
cudaError_t kcu_attn_bf16(uint16_t *out, const float *q, int64_t q_ld, const struct kcu_paged *kv, int32_t n_head,
                          int32_t n_head_kv, int32_t head_dim, float scale, cudaStream_t stream);

/* ---- k_attn_tc.cu ----------------------------------------------------------- */

/* Tokens per tile of kcu_attn_tc for this head layout (64 / group), or 0
 * when it does not take it (head_dim other than 64 or 128): use kcu_attn.
 * It takes no window and no soft-cap (cudaErrorInvalidValue): kcu_attn
 * computes those. */
int32_t kcu_attn_tc_tile_tokens(int32_t n_head, int32_t n_head_kv, int32_t head_dim);

/* kcu_attn's result (same contract, same arguments) on tensor cores: Q
 * (times scale) and the softmax weights rounded to fp16 for the products,
 * so it matches the C reference to fp16 rounding, not f32. tiles
 * (n_tiles, 2): first token and token count of each tile, consecutive
 * tokens of one sequence at consecutive positions, at most
 * kcu_attn_tc_tile_tokens of them; every token of the step in exactly one
 * tile. A token's bits do not depend on its tile or its tile mates.
 * Quantized K/V (q8, q4) are dequantized with kvtype.h's formulas as each
 * chunk is loaded into shared memory, and rounded to fp16 there (saturated
 * at +-65504) for the products: a q8 value d * q has up to 18 significant
 * bits and a q4 value fmaf(d, q, m) up to 24, which fp16 does not hold, so
 * this kernel sees them to fp16 rounding, like Q and P (kcu_attn sees them
 * exactly). cudaErrorInvalidValue for a layout it does not take. */
cudaError_t kcu_attn_tc(float *out, const float *q, int64_t q_ld, const struct kcu_paged *kv, const int32_t *tiles,
                        int32_t n_tiles, int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale,
                        cudaStream_t stream);
cudaError_t kcu_attn_tc_bf16(uint16_t *out, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                             const int32_t *tiles, int32_t n_tiles, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                             float scale, cudaStream_t stream);

/* ---- k_enc.cu (encoders: BERT) ---------------------------------------------- */

/* x[t] = LayerNorm(tok_table[tokens[t]] + pos_table[pos[t]] + type_table[types[t]]) * w + b
 * over n elements, and the same rounded to bf16 into xb (n apart; NULL:
 * not written): the encoder's input. tok_table (n_vocab, n) bf16,
 * pos_table (n_pos, n) and type_table (n_types, n) f32, type_table NULL
 * when the model has none (types is then not read). The statistics are
 * f32, reduced in a fixed order per row. Reference: the sum in enc_cpu.c's
 * embed, then enc_layer_norm (its statistics in double: equal to float
 * rounding). */
cudaError_t kcu_enc_embed(float *x, uint16_t *xb, const uint16_t *tok_table, const float *pos_table,
                          const float *type_table, const int32_t *tokens, const int32_t *pos, const int32_t *types,
                          int32_t n_tok, int32_t n, const float *w, const float *b, float eps, cudaStream_t stream);

/* x[r] = LayerNorm(x[r] + y[r] + bias) * w + b for r < n_rows (rows of n,
 * contiguous), and bf16 into xb (NULL: not written): a projection and its
 * bias joining the residual stream of an encoder (BERT's post-norm). y
 * NULL: LayerNorm of x alone; bias NULL: none. Reference: enc_cpu.c's
 * make_residual_row (the add, then enc_layer_norm). */
cudaError_t kcu_add_layernorm(float *x, uint16_t *xb, const float *y, const float *bias, int32_t n_rows, int32_t n,
                              const float *w, const float *b, float eps, cudaStream_t stream);

/* out[t][i] = bf16(gelu_erf(up[t][i] + bias[i])) for t < n_tok, i < n (bias
 * NULL: none), GELU by the device's erff: the input of an encoder's down
 * projection. Reference: enc_gelu. */
cudaError_t kcu_gelu_erf_bf16(uint16_t *out, const float *up, const float *bias, int32_t n_tok, int32_t n,
                              cudaStream_t stream);

/* Bidirectional attention over the rows of the step: for token t and head
 * h, q = qkv + t * ld + h * head_dim attends to the keys qkv + p * ld +
 * k_off + h * head_dim and values at v_off, for p in [tok_lo[t],
 * tok_lo[t] + tok_n[t]) — the rows of t's own sequence, so sequences in
 * one step never see each other (tok_n[t] >= 1). out: (n_tok, n_head *
 * head_dim). softmax in f32 with scale `scale`, online per warp with a
 * fixed split of keys, as kcu_attn: a token's result does not depend on
 * the batch. cudaErrorInvalidValue when head_dim > KCU_ATTN_MAX_HEAD_DIM.
 * Reference: enc_attn. */
cudaError_t kcu_enc_attn(float *out, const float *qkv, int64_t ld, int64_t k_off, int64_t v_off, const int32_t *tok_lo,
                         const int32_t *tok_n, int32_t n_tok, int32_t n_head, int32_t head_dim, float scale,
                         cudaStream_t stream);
/* The same, stored rounded to bf16 (the output projection's input). */
cudaError_t kcu_enc_attn_bf16(uint16_t *out, const float *qkv, int64_t ld, int64_t k_off, int64_t v_off,
                              const int32_t *tok_lo, const int32_t *tok_n, int32_t n_tok, int32_t n_head,
                              int32_t head_dim, float scale, cudaStream_t stream);

/* ---- k_moe.cu --------------------------------------------------------------- */

/* A mixture-of-experts layer (model.h, struct model_moe) in four kernels
 * around the experts' GEMMs: route, plan, gather, (GEMMs), combine. A step
 * of n_tok tokens has nr = n_tok * k routed rows, numbered by expert
 * (expert 0's first, each expert's in token order) so that one GEMM per
 * expert runs over contiguous rows. */

/* Token t's experts from its router logits (logits + t * ld, n_expert
 * floats): p = softmax over all experts, the k largest p (ties: the lower
 * id), divided by their sum when norm != 0; stored in sel / wts (n_tok, k)
 * by ascending expert id, the order they are summed in. One thread per
 * token. Reference: cpu_moe_route (the same steps; expf is the device's). */
cudaError_t kcu_moe_route(int32_t *sel, float *wts, const float *logits, int64_t ld, int32_t n_tok, int32_t n_expert,
                          int32_t k, int norm, cudaStream_t stream);

/* The routed rows grouped by expert, from sel (n_tok, k): start
 * (n_expert + 1) the first row of each expert and the total (nr); slot
 * (n_tok, k) the row of each choice; row_tok (nr) the token of each row.
 * One thread block (one thread per expert, in token order). Reference: the
 * counting in cpu_moe_forward. */
cudaError_t kcu_moe_plan(int32_t *start, int32_t *slot, int32_t *row_tok, const int32_t *sel, int32_t n_tok, int32_t k,
                         int32_t n_expert, cudaStream_t stream);

/* xg[r][i] = x[row_tok[r] * ld + i] for r < n_rows, i < n (bf16 bits,
 * copied): the experts' input rows. */
cudaError_t kcu_moe_gather(uint16_t *xg, const uint16_t *x, int64_t ld, const int32_t *row_tok, int32_t n_rows,
                           int32_t n, cudaStream_t stream);

/* out[t][i] = sum over c < k of yd[slot[t][c]][i] * wts[t][c] (in c order,
 * each product rounded, then added), then, when ys is not NULL,
 * + ys[t][i] * (1 / (1 + exp(-sg[t * sg_ld]))) (qwen2moe's shared expert);
 * yd (nr, n), ys (n_tok, n), out (n_tok, n). Reference: the CPU's sum_rows
 * (tests/test_cuda_kernels.c repeats it). */
cudaError_t kcu_moe_combine(float *out, const float *yd, const int32_t *slot, const float *wts, int32_t n_tok,
                            int32_t k, int32_t n, const float *ys, const float *sg, int64_t sg_ld, cudaStream_t stream);

/* ---- k_gemm.c (cuBLAS) ------------------------------------------------------ */

/* y = x · wᵀ: x (n_tok, n_in) bf16, w (n_out, n_in) bf16 as GGUF stores a
 * weight (one row per output), y (n_tok, n_out) f32; f32 accumulation.
 * The handle's stream is used. Reference: a dot product per (t, r). */
cublasStatus_t kcu_gemm_bf16(cublasHandle_t h, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok,
                             int64_t n_in, int64_t n_out);
/* y += x · wᵀ (beta = 1): the residual add folded into the GEMM. */
cublasStatus_t kcu_gemm_bf16_acc(cublasHandle_t h, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok,
                                 int64_t n_in, int64_t n_out);
/* The same product all in f32 (x, w, y f32; no tensor-core rounding): the
 * MoE router, whose top-k choice is discrete, so its logits are computed
 * as the CPU backend computes them from f32 router weights. */
cublasStatus_t kcu_gemm_f32(cublasHandle_t h, float *y, const float *x, const float *w, int64_t n_tok, int64_t n_in,
                            int64_t n_out);

#ifdef __cplusplus
}
#endif

#endif
