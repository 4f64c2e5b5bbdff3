/* moe.h — the CPU backend's mixture-of-experts FFN (model/model.h, struct
 * model_moe: what a MoE layer computes).
 *
 * One call computes a MoE layer's FFN for all of a step's tokens: the
 * router's logits, each token's top-k experts and weights, then the tokens
 * grouped by expert, so that each chosen expert's weights are read once per
 * step however many tokens chose it — batching is where a MoE model pays
 * off. Every chosen expert's gate and up products run in one pool run, the
 * activations in a second, every down product in a third; each token then
 * sums its k expert outputs, each times its routing weight.
 *
 * Determinism: every product row comes from the matmul kernels, whose
 * result for one (token, row) never depends on the other tokens of the call
 * or the thread split (model/quant.h); a token's routing reads only its own
 * logits; its sum runs over its experts in ascending expert id. So a
 * token's output is bit for bit the same whatever else the step holds.
 *
 * Ownership: struct cpu_moe owns the experts' matrices in the form the
 * kernels read (packed copies where they have one, else copies in huge
 * pages; the file's pages released) and its scratch; it borrows the model, the matmul context and
 * the thread pool, which must outlive it. */
#ifndef KVB_MOE_H
#define KVB_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

struct mm_ctx;
struct tpool;
struct cpu_moe;

/* For a model with m->ops.moe.n_expert > 0. simd: the activations in AVX2
 * (as the dense FFN of the backend computes them), else the scalar
 * reference. Errors: KVB_ERR_NOMEM. */
enum kvb_status cpu_moe_create(const struct model *m, struct mm_ctx *mm, struct tpool *pool, bool simd,
                               struct cpu_moe **out, struct kvb_err *err);
void cpu_moe_free(struct cpu_moe *moe); /* accepts NULL */

/* The FFN of MoE layer `layer` (m->layers[layer].moe) for n_tok tokens:
 * make(arg, t, dst) writes token t's FFN input (n_embd floats), with
 * mm_set_input_fn's contract (called once per token, perhaps on the pool's
 * threads, before anything is written to out); out gets n_tok rows of
 * n_embd. Uses the matmul context's input. Errors: KVB_ERR_NOMEM. */
enum kvb_status cpu_moe_forward(struct cpu_moe *moe, int layer, int64_t n_tok,
                                void (*make)(void *arg, int64_t t, float *dst), void *arg, float *out,
                                struct kvb_err *err);

/* One token's routing (the step cpu_moe_forward takes per token; also the
 * reference of the CUDA backend's kcu_moe_route): p (ne) holds the router
 * logits and is overwritten; p = softmax(logits) in float; the k largest p
 * (ties: the lower id), divided by their sum (summed in descending order)
 * when norm; sel and wts (k) get them by ascending expert id, the order a
 * token's expert outputs are summed in. */
void cpu_moe_route(float *p, int32_t ne, int32_t k, bool norm, int32_t *sel, float *wts);

#endif
