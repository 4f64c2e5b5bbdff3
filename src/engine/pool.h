/* pool.h — what a pooled request's vector becomes: an embedding (L2
 * normalised unless asked not to, cut to the dimensions asked for) or a
 * reranker's relevance score (the model's classification head).
 *
 * The pooling itself (mean, first or last final-norm hidden state) is the
 * scheduler's (SCHED_POOL_*, engine/scheduler.h): it sees the rows as they
 * come out of the backend. This module is the arithmetic after it, the same
 * whichever backend computed the rows, and the names of the poolings.
 *
 * Nothing here allocates but pool_rank_score's scratch; nothing is kept. */
#ifndef KVB_POOL_H
#define KVB_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

/* "none", "mean", "cls", "last", "rank". */
const char *pool_name(enum model_pooling p);
/* The pooling named s ("mean", "cls", "last"; "rank" too when rank is
 * true): false when it is none of them. */
bool pool_parse(const char *s, bool rank, enum model_pooling *out);

/* Divides v by its L2 norm (computed in double); a zero vector stays as it
 * is. What OpenAI's embeddings are and what sentence-transformers'
 * Normalize() does. */
void pool_normalize(float *v, int32_t n);

/* OpenAI's `dimensions`: keeps the first n of v's values and normalises
 * them again (a vector that was not normalised stays unnormalised, cut). */
void pool_truncate(float *v, int32_t n, bool normalized);

/* A reranker's score from its pooled hidden state h (n_embd floats):
 * x = tanh(cls·h + cls_b) when the model has cls, then the logits
 * z = cls_out·x + cls_out_b (model.h). One logit (a cross-encoder): the
 * score is sigmoid(z0), as vLLM's score and rerank endpoints return it
 * (sentence-transformers' CrossEncoder default for one label); two
 * (llama.cpp's Qwen3-Reranker file, rows "yes" and "no" of the LM head):
 * softmax(z)[0], the probability of "yes" — sigmoid(z_yes - z_no). Other
 * counts: KVB_ERR_UNSUPPORTED. KVB_ERR_NOMEM. */
enum kvb_status pool_rank_score(const struct model *m, const float *h, float *score, struct kvb_err *err);

#endif
