/* gen.h — one sequence run on a backend: chunked prefill and token-by-token
 * decode. This is what `kvbatch generate` and `kvbatch logits` use; the batch
 * engine drives the backend directly with many sequences.
 *
 * The sequence owns blocks 0..n-1 of the backend's pool in order, so a
 * backend must not be shared with another user while a gen_ctx uses it.
 * Ownership: gen_ctx borrows the model and backend; its logits buffer is
 * owned and valid until the next call. */
#ifndef KVB_GEN_H
#define KVB_GEN_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model.h"

struct gen_ctx;

/* n_ctx: the most positions the sequence may reach (<= pool capacity).
 * chunk: the most tokens pushed through one forward call during prefill. */
enum kvb_status gen_create(const struct model *m, struct backend *be, int32_t n_ctx, int32_t chunk,
                           struct gen_ctx **out, struct kvb_err *err);
void gen_free(struct gen_ctx *g); /* accepts NULL */

/* Appends tokens (prefill). When all_logits is non-NULL it receives
 * n * n_vocab floats, the logits after each token; the last row is always
 * available from gen_logits(). KVB_ERR_RANGE when n_ctx would be exceeded. */
enum kvb_status gen_feed(struct gen_ctx *g, const int32_t *tokens, int32_t n, float *all_logits, struct kvb_err *err);
const float *gen_logits(const struct gen_ctx *g); /* (n_vocab), after the last fed token */

#endif
