/* pscore.h — a prompt token's score: its log-probability given the tokens
 * before it, its rank, and the PSCORE_TOPK most likely tokens at that
 * position. What `echo` and `prompt_logprobs` report, and what the
 * scheduler keeps beside the KV block that holds the token (in-run and in
 * the persistent store), since it is a function of the tokens up to and
 * including it, exactly as the block's K/V are.
 *
 * A score is a pure function of one logits row and the token, so a score
 * read from a cache equals the one computed, bit for bit, whenever the
 * backend's rows are (the CPU's are, whatever the batch). The record has a
 * fixed size and no padding, so it is stored as it is held; its bytes are
 * little-endian, as every machine kvbatch runs on. */
#ifndef KVB_PSCORE_H
#define KVB_PSCORE_H

#include <stdint.h>

#define PSCORE_TOPK 20 /* the most any request may ask for (top_logprobs, logprobs, prompt_logprobs) */

struct pscore {
    float logprob;               /* of the token; meaningless when rank is 0 */
    int32_t rank;                /* 1 + how many tokens had a larger logit; 0: no score (position 0) */
    int32_t top_id[PSCORE_TOPK]; /* best first, ties to the lower id */
    float top_lp[PSCORE_TOPK];
};

/* The score of `token` from the logits row before it (n_vocab floats; the
 * caller has checked they are finite). */
void pscore_of(const float *row, int32_t n_vocab, int32_t token, struct pscore *out);

/* The record of position 0, which has no score. */
void pscore_none(struct pscore *out);

#endif
