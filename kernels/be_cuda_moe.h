/* be_cuda_moe.h — the CUDA backend's mixture-of-experts FFN (model/model.h,
 * struct model_moe: what a MoE layer computes; src/cpu/moe.h is the CPU's).
 * Used by be_cuda.c only.
 *
 * The experts' merged tensors (ffn_{gate,up,down}_exps) are uploaded as
 * bf16, like every weight of the backend, one expert slice at a time: each
 * expert's gate and up rows stacked [gate; up] (one GEMM gives both, side
 * by side, as the dense FFN's), its down rows as stored. The router (and
 * qwen2moe's shared-expert gate, one more row) is uploaded as f32: the
 * top-k choice is discrete, and the CPU backend computes its logits from
 * the file's f32 rows in f32.
 *
 * One call computes a MoE layer's FFN for a step's tokens on the device:
 * the FFN norm, the router's logits (f32 GEMM), each token's top-k experts
 * and weights (kcu_moe_route), the routed rows numbered by expert
 * (kcu_moe_plan), their inputs gathered (kcu_moe_gather), one bf16 GEMM per
 * expert with rows over its tokens for gate|up, the activation over all
 * routed rows, one GEMM per expert for down, the shared expert over every
 * token, and each token's weighted sum (kcu_moe_combine). The per-expert
 * row counts are read back on the host (one small copy and a stream
 * synchronisation per MoE layer) to size the GEMMs, so a step with MoE
 * layers cannot be captured into a CUDA graph: the backend runs such models
 * without graphs.
 *
 * Determinism: in deterministic mode every GEMM runs on whole tiles of
 * BE_CUDA_DET_ROWS rows from the expert's first row (the rows past an
 * expert's end are recomputed by the next expert's GEMM, which comes
 * later on the stream; the buffers have one tile of room past the last);
 * routing and sums are per token in a fixed order. So a token's result
 * does not depend on the rest of the step, as for the dense layers.
 *
 * Ownership: struct cu_moe owns its device weights and scratch; it borrows
 * the model, which must outlive it. Errors: creation and reserve return a
 * status; the forward records the first failing call in struct cu_moe_run
 * (be_cuda.c's step does the same) and stops. */
#ifndef KVB_BE_CUDA_MOE_H
#define KVB_BE_CUDA_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "base/status.h"
#include "model/model.h"

struct cu_moe;

/* Uploads w (n_out rows of n_in) as bf16 rows to dst (be_cuda.c's
 * upload_matrix, with its staging buffer as ctx). */
typedef enum kvb_status (*cu_moe_put_fn)(void *ctx, uint16_t *dst, const struct mm_weight *w, const char *name,
                                         struct kvb_err *err);

/* Device bytes of layer `layer`'s experts, router and shared expert (0 for
 * a dense layer). */
int64_t cu_moe_weight_bytes(const struct model *m, int layer);

/* For a model with m->ops.moe.n_expert > 0: uploads every MoE layer's
 * weights. Errors: KVB_ERR_NOMEM (host or device), KVB_ERR_FORMAT for an
 * expert tensor of the wrong shape, the upload's. */
enum kvb_status cu_moe_create(const struct model *m, cu_moe_put_fn put, void *put_ctx, struct cu_moe **out,
                              struct kvb_err *err);
void cu_moe_free(struct cu_moe *mo); /* accepts NULL; the device must be idle */

/* Scratch for steps of up to cap_tok tokens (the backend's rounded
 * capacity), zeroed on `stream`. Errors: KVB_ERR_NOMEM. */
enum kvb_status cu_moe_reserve(struct cu_moe *mo, int64_t cap_tok, cudaStream_t stream, struct kvb_err *err);

/* What a forward call runs on, and its first failure (what NULL: none). */
struct cu_moe_run {
    cudaStream_t stream;
    cublasHandle_t blas; /* on `stream` */
    bool det;            /* GEMMs on whole BE_CUDA_DET_ROWS tiles */
    cudaError_t ce;
    cublasStatus_t bs;
    const char *what;
};

/* The FFN of MoE layer `layer` for n_tok <= cap_tok tokens: x (n_tok,
 * n_embd) the residual stream on the device, norm its FFN RMSNorm weight
 * (device, or NULL: as it is), out (n_tok, n_embd) f32 the FFN's output,
 * before any post-norm or residual add. Synchronises `stream` once (the
 * experts' row counts); not for graph capture. */
void cu_moe_ffn(struct cu_moe *mo, struct cu_moe_run *r, int layer, const float *x, const float *norm, int64_t n_tok,
                float *out);

#endif
