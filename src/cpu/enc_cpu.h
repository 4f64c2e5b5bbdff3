/* enc_cpu.h — the CPU backend's forward pass for encoders
 * (model_ops.encoder: bert), apart from the llama layer's in be_cpu.c.
 * Private to src/cpu/ (and the tests): be_cpu.c creates one for an encoder model and hands
 * it every batch.
 *
 * An encoder's sequence attends to all of its tokens, so each sequence of
 * a batch must be whole (position 0 on, every token in this pass); its K
 * and V never leave the pass, so no KV pool is read or written. The
 * output is the last layer's rows (BE_HIDDEN_*) — an encoder has no head
 * (BE_LOGITS_* other than NONE is KVB_ERR_INVALID_ARG).
 *
 * Ownership: borrows the model, the thread pool and the matmul context
 * (be_cpu.c's, which must outlive it); owns packed copies of the weights
 * and its scratch. */
#ifndef KVB_ENC_CPU_H
#define KVB_ENC_CPU_H

#include "backend/backend.h"
#include "base/status.h"
#include "base/tpool.h"
#include "model/model.h"
#include "model/quant.h"

struct cpu_enc;

enum kvb_status cpu_enc_create(const struct model *m, struct tpool *pool, struct mm_ctx *mm, struct cpu_enc **out,
                               struct kvb_err *err);
void cpu_enc_free(struct cpu_enc *e); /* accepts NULL */
enum kvb_status cpu_enc_forward(struct cpu_enc *e, const struct be_batch *batch, struct kvb_err *err);

/* The pass's pieces, also the references of the CUDA backend's encoder
 * kernels (tests/test_cuda_enc.c): y = LayerNorm(x) * w + b over n
 * elements, statistics in double (y may be x); GELU by erf,
 * 0.5 z (1 + erf(z / sqrt 2)) in float. */
void enc_layer_norm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps);
float enc_gelu(float z);

#endif
