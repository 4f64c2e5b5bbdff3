/* sampler.h — next-token selection with per-request seeded randomness.
 *
 * Pipeline (in this order, as llama.cpp/vLLM apply them): the min_tokens ban,
 * logit bias, repetition,
 * presence and frequency penalties over the tokens seen so far → temperature
 * → top-k → top-p → min-p → draw. temperature == 0 is greedy argmax (ties go to
 * the lowest id) and ignores the truncation settings.
 *
 * Determinism: the RNG is a private xoshiro-style generator seeded from
 * params.seed only, so the same seed, logits and history give the same token
 * on every machine and whatever else runs in the batch.
 *
 * Constrained output (params.grammar: JSON, regex, choice or a GBNF
 * grammar, compiled by engine/grammar.h): the token is drawn as usual; when
 * it would leave the grammar, the draw is repeated over the logits with
 * every such token masked out. Accepting or redrawing keeps each allowed
 * token's chance proportional to its probability (the first draw is a
 * rejection sampler of the masked distribution), and a mask (cached per
 * grammar state) is paid only when the model's own choice would break it.
 *
 * Ownership: struct sampler owns its history and scratch; logits passed in
 * are modified in place (penalties, scaling) and not retained. */
#ifndef KVB_SAMPLER_H
#define KVB_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

struct grammar;
struct grammar_vocab;

struct sampler_params {
    float temperature;        /* 0 = greedy; default 1 */
    int32_t top_k;            /* <= 0: disabled */
    float top_p;              /* in (0, 1]; 1 = disabled */
    float min_p;              /* in [0, 1); 0 = disabled */
    float repetition_penalty; /* 1 = disabled; >1 discourages repeats (CTRL style) */
    float presence_penalty;   /* OpenAI semantics, 0 = disabled */
    float frequency_penalty;  /* OpenAI semantics, 0 = disabled */
    uint64_t seed;
    const struct grammar *grammar;      /* non-NULL: the output is held to this grammar (grammar.h); borrowed,
                                           must outlive the sampler, which keeps its own matcher */
    const struct grammar_vocab *gvocab; /* with grammar: the tokenizer's bytes; borrowed */
    const struct sampler_bias *bias;    /* n_bias additions to logits before anything else
                                          (OpenAI's logit_bias); copied by sampler_create */
    int32_t n_bias;
    const int32_t *ban; /* n_ban token ids that cannot be drawn while fewer than ban_until tokens have
                            been accepted (vLLM's min_tokens: end of generation and stop_token_ids);
                            copied by sampler_create */
    int32_t n_ban;
    int32_t ban_until;
};

struct sampler_bias {
    int32_t token; /* < n_vocab */
    float value;   /* added to the token's logit; -100 bans it in practice, +100 all but forces it */
};

void sampler_params_default(struct sampler_params *p);

struct sampler;

enum kvb_status sampler_create(const struct sampler_params *p, int32_t n_vocab, struct sampler **out);
void sampler_free(struct sampler *s); /* accepts NULL */
/* Resets history and RNG to the state right after create. */
void sampler_reset(struct sampler *s);

/* Records a token as seen for the penalties (prompt tokens count for the
 * repetition penalty only if the caller accepts them) and, with a grammar, as
 * part of the output: accept generated tokens only there. */
void sampler_accept(struct sampler *s, int32_t token);

/* Picks the next token from logits[n_vocab] (modified in place). Does not
 * accept it: call sampler_accept with the result. */
enum kvb_status sampler_sample(struct sampler *s, float *logits, int32_t *out_token);

/* Whether sampler_sample with these parameters is the plain argmax of the
 * raw logits whatever the history (temperature 0, no penalty, bias or grammar): then the
 * choice may be made where the logits are (sampler_greedy's rule) and the
 * sampler only told of it (sampler_accept). */
bool sampler_is_greedy(const struct sampler_params *p);

/* The greedy choice: the lowest id holding the largest logit that is not
 * NaN. KVB_ERR_INVALID_ARG (and *out_token = -1) when every logit is NaN or
 * -inf. The C reference of the CUDA backend's device-side argmax. */
enum kvb_status sampler_greedy(const float *logits, int32_t n_vocab, int32_t *out_token);

/* The first index in logits[n_vocab] holding NaN or an infinity, or -1
 * when all are finite. A model's raw logits are always finite; anything
 * else means broken weights or a broken backend, and sampling from them
 * would only hide it. */
int32_t sampler_first_nonfinite(const float *logits, int32_t n_vocab);

/* log-softmax of raw logits at `token` (for OpenAI-style logprobs). */
float sampler_logprob(const float *logits, int32_t n_vocab, int32_t token);

#endif
