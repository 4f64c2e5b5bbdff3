/* pool.h — what a pooled request's vector becomes: an embedding (L2
 * normalised unless asked not to, cut to the dimensions asked for) or a
 * reranker's relevance score (the model's classification head).
 *
 * The pooling itself (mean, first or last final-norm hidden state) is the
 * scheduler's (SCHED_POOL_*, engine/scheduler.h): it sees the rows as they
 * come out of the backend. This module is the arithmetic after it, the same
 * whichever backend computed the rows, and the names of the poolings.
 *
 * Nothing here allocates but pool_rank_logit's scratch; nothing is kept. */
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
 * Normalize() does; also what OpenAI's `dimensions` asks of the first n
 * values of a normalised vector. */
void pool_normalize(float *v, int32_t n);

/* A reranker's logit from its pooled hidden state h (n_embd floats):
 * x = tanh(cls·h + cls_b) when the model has cls, then z = cls_out·x +
 * cls_out_b (model.h). One output (a cross-encoder): *logit = z0; two
 * (llama.cpp's Qwen3-Reranker file, the LM head's rows of "yes" and
 * "no"): *logit = z_yes - z_no, whose sigmoid is softmax(z)[0], the
 * probability of "yes". Other counts: KVB_ERR_UNSUPPORTED. KVB_ERR_NOMEM. */
enum kvb_status pool_rank_logit(const struct model *m, const float *h, float *logit, struct kvb_err *err);

/* The score vLLM's score and rerank endpoints return for a logit: its
 * sigmoid (sentence-transformers' CrossEncoder default for one label). */
float pool_sigmoid(float logit);

/* Cosine similarity of a[0..n) and b[0..n) (0 when either is zero): the
 * score of an embedding model's pair, as vLLM computes it. */
float pool_cosine(const float *a, const float *b, int32_t n);

#endif
