/* be_cuda_internal.h — what be_cuda.c shares with the other host files of
 * the CUDA backend (private to kernels/): its error edge (CUDA and cuBLAS
 * statuses become kvbatch statuses, the library's text in the message),
 * device allocation and the weight upload (dequantized to bf16 on the host
 * through a pinned staging area); and the encoder's pass (be_cuda_enc.c),
 * which be_cuda.c runs instead of the llama layer for a model with
 * model_ops.encoder.
 *
 * Ownership: a struct cuda_enc borrows the model, the cuBLAS handle and the
 * stream (be_cuda.c's, which outlive it) and owns its device weights and
 * scratch. */
#ifndef KVB_BE_CUDA_INTERNAL_H
#define KVB_BE_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model.h"

/* Host side of the upload: a pinned staging area for bf16 rows and one f32
 * row (the widest input) for quant_dequant_row. */
struct uploader {
    uint16_t *stage; /* pinned, cap elements */
    int64_t cap;
    float *row; /* (max_in) */
};

enum kvb_status cu_check(cudaError_t e, struct kvb_err *err, const char *what);
enum kvb_status blas_check(cublasStatus_t s, struct kvb_err *err, const char *what);
/* cudaMalloc of `bytes` (at least 1) into *pp; an allocation failure is
 * KVB_ERR_NOMEM naming `what` and the size, and is not left sticky. */
enum kvb_status dev_alloc(void *pp, int64_t bytes, const char *what, struct kvb_err *err);
/* w (n_out rows of n_in, any weight type) as bf16 rows into dst. */
enum kvb_status upload_matrix(struct uploader *u, uint16_t *dst, const struct mm_weight *w, const char *name,
                              struct kvb_err *err);
/* A new device copy of n floats. */
enum kvb_status upload_f32(float **dst, const float *src, int64_t n, const char *name, struct kvb_err *err);

/* ---- be_cuda_enc.c: an encoder's pass (bert) ---- */

struct cuda_enc;

/* Uploads the encoder's weights (matrices and the token embedding bf16,
 * positions, token types, norms and biases f32). det: GEMMs on whole tiles
 * of BE_CUDA_DET_ROWS rows, as be_cuda.c's deterministic mode. */
enum kvb_status cuda_enc_create(const struct model *m, cublasHandle_t blas, cudaStream_t stream, bool det,
                                struct uploader *u, struct cuda_enc **out, struct kvb_err *err);
void cuda_enc_free(struct cuda_enc *e); /* accepts NULL; the stream must be idle */
/* One pass over whole sequences (position 0, every token; BE_LOGITS_NONE or
 * BE_HIDDEN_*, as enc_cpu.c takes them): the last layer's rows of the
 * BE_HIDDEN_* sequences into batch->hidden, in sequence order. */
enum kvb_status cuda_enc_forward(struct cuda_enc *e, const struct be_batch *batch, struct kvb_err *err);
/* Device bytes of the encoder's weights. */
int64_t cuda_enc_weight_bytes(const struct model *m);

#endif
