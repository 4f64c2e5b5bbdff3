/* logprobs.h — the log-probabilities a request's logprobs fields report:
 * log-softmax of one step's logits and its k most likely tokens. Pure
 * functions of the logits, so a token's logprob is the same whatever
 * computed them. */
#ifndef KVB_LOGPROBS_H
#define KVB_LOGPROBS_H

#include <stdint.h>

/* log(sum_i exp(logits[i])), in double, stable (the max is taken out). A
 * token's logprob is logits[t] - this. */
double logprobs_lse(const float *logits, int32_t n_vocab);

/* The k most likely tokens (k <= 64), best first, ties to the lower id, into
 * best[0..return). k = 0 gives none. */
int logprobs_top(const float *logits, int32_t n_vocab, int k, int32_t *best);

#endif
