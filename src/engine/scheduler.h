/* scheduler.h — the batch engine's scheduler: continuous batching of many
 * sequences over one backend, with paged KV blocks shared through the radix
 * prefix tree.
 *
 * The caller submits tokenized requests (sched_submit) and calls sched_step
 * until sched_idle. Each step packs decode tokens of running sequences and
 * prefill chunks (under max_step_tokens) into one forward pass, samples the
 * sequences whose last token was fed, and reports tokens and completions
 * through callbacks. A finished sequence's place is refilled on the next step.
 *
 * Order: among waiting requests (the caller bounds how many it submits ahead:
 * the look-ahead window) the scheduler admits first those with the longest
 * prefix already cached, and holds back a request while a running prefill
 * would give it more shared blocks than are cached now — so a prefix shared by
 * many requests is computed once even when the input is shuffled.
 *
 * Memory: when blocks run out, unreferenced cached blocks are evicted (LRU);
 * when still short, the most recently admitted sequence is preempted: its
 * blocks are released and it is recomputed later from its tokens so far. Its
 * sampler state is kept, so its output does not change.
 *
 * Determinism: a request's tokens depend only on its own prompt and sampling
 * parameters — the backend's results are batch-independent and reused KV
 * blocks hold bit-identical values.
 *
 * Ownership: the scheduler borrows the backend (whose KV pool it manages,
 * and which must outlive it: sched_free hands staging memory back to it)
 * and copies each submitted prompt; callbacks receive pointers valid only
 * during the call. */
#ifndef KVB_SCHED_H
#define KVB_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "engine/pscore.h"
#include "engine/sampler.h"
#include "store/pstore/pstore.h"

struct sched;

struct sched_opts {
    int32_t max_batch;       /* most sequences running at once (default 128) */
    int32_t max_step_tokens; /* most tokens in one forward pass (default 512) */
    int32_t n_ctx;           /* most positions one sequence may reach */
};

/* What a callback sees of a sequence. */
struct sched_seq_info {
    uint64_t user_id;      /* the id given at submit */
    const int32_t *tokens; /* prompt followed by generated tokens */
    int32_t n_prompt;
    int32_t n_generated;
    int32_t cached_tokens;   /* prompt tokens reused from the prefix tree at (first) admission */
    int32_t store_tokens;    /* prompt tokens loaded from the persistent store at (first) admission */
    int32_t preemptions;     /* times it was preempted so far */
    int32_t restored_tokens; /* positions whose K/V its preemptions dropped: rebuilt at readmission,
                                * from the prefix tree or the store where they were still there,
                                * else recomputed */
    double t_submit, t_admit, t_first_token, t_end; /* monotonic seconds */
    const float *logits;                            /* on_token only: the logits the token was sampled from (n_vocab);
                                * NULL when the backend chose it (see sched_submit) */
    const char *error;                              /* on_finish with SCHED_FINISH_ERROR: why, one line naming the cause
                                * (valid during the call); NULL otherwise */
    const struct pscore *prompt_scores;             /* SCHED_SCORE_PROMPT: (n_prompt) the prompt's scores, [0]
                                         * pscore_none; complete from the first on_token on, and at
                                         * on_finish unless SCHED_FINISH_ERROR; else NULL */
    int32_t scored_tokens;                          /* SCHED_SCORE_PROMPT: prompt scores taken from a cache (in-run or
                                * store) rather than computed, at (first) admission */
};

enum sched_finish { SCHED_FINISH_STOP = 0, SCHED_FINISH_LENGTH, SCHED_FINISH_ERROR };

struct sched_callbacks {
    void *user;
    /* Called for each sampled token (already appended to info->tokens).
     * Return true to finish the sequence now (EOS or a stop string). */
    bool (*on_token)(void *user, const struct sched_seq_info *info, int32_t token);
    /* Called once when a sequence ends. SCHED_FINISH_ERROR: the sequence
     * could not go on (its logits were not finite, the sampler failed, or
     * it could not be requeued after preemption); info->error says which. */
    void (*on_finish)(void *user, const struct sched_seq_info *info, enum sched_finish why);
};

struct sched_stats {
    int64_t prompt_tokens;        /* submitted */
    int64_t cached_tokens;        /* reused from the prefix tree at admission */
    int64_t store_tokens;         /* loaded from the persistent store at admission */
    int64_t store_blocks_spilled; /* prompt blocks handed to the store */
    double store_load_s;          /* time spent loading from the store */
    int64_t prefill_computed;     /* prompt (and recomputed) tokens pushed through forward */
    int64_t scored_tokens;        /* prompt scores computed (SCHED_SCORE_PROMPT) */
    int64_t scored_cached;        /* prompt scores taken from a cache instead */
    int64_t decode_tokens;        /* generated tokens fed back */
    int64_t steps;
    int64_t preemptions;
    int64_t seq_kv_peak;        /* the most KV bytes one sequence held at once (with sliding-window
                                    layers: full-attention layers for every position, windowed ones
                                    for the window only) */
    int32_t seq_kv_peak_tokens; /* that sequence's length then */
    int32_t running, waiting;
};

enum kvb_status sched_create(struct backend *be, int32_t n_vocab, const struct sched_opts *o,
                             const struct sched_callbacks *cb, struct sched **out, struct kvb_err *err);
void sched_free(struct sched *s); /* accepts NULL; drops unfinished sequences silently */

/* Attaches a persistent prefix store (borrowed; must outlive the scheduler,
 * whose sched_free waits for the store's writer):
 * at admission, prompt blocks the prefix tree does not hold are looked up
 * there and loaded instead of prefilled; full prompt blocks that are computed
 * are handed to it (sched_store.h: copied out beside the next step, handed
 * over after it; all handed over once nothing runs, so an idle scheduler
 * has nothing in flight). Call before the first submit. KVB_ERR_NOMEM
 * leaves the scheduler without a store. */
enum kvb_status sched_set_store(struct sched *s, struct pstore *ps, const struct pstore_model *pm);

/* sched_submit's flags. */
enum {
    /* on_token must see the logits (for logprobs); without it, a greedy
     * request (sampler_is_greedy) on a backend that can choose the token
     * itself (backend.argmax) gets info->logits NULL — and the same tokens,
     * the choice being made from the same logits by the same rule. */
    SCHED_WANT_LOGITS = 1u,
    /* Score every prompt token (info->prompt_scores): for echo and
     * prompt_logprobs. Scores come with cached prefix blocks where those
     * were stored with them; a block cached without them ends the reused
     * prefix for this request (it is computed again, and its scores kept
     * with it from then on). */
    SCHED_SCORE_PROMPT = 2u,
};

/* Queues a request. max_tokens: most tokens to generate (the context may cut
 * it shorter: finish LENGTH); 0 only with SCHED_SCORE_PROMPT (the prompt is
 * scored, nothing generated: finish LENGTH). The prompt must fit: n_prompt <
 * n_ctx, otherwise KVB_ERR_RANGE. flags: SCHED_* above. */
enum kvb_status sched_submit(struct sched *s, uint64_t user_id, const int32_t *prompt, int32_t n_prompt,
                             int32_t max_tokens, const struct sampler_params *sp, unsigned flags, struct kvb_err *err);

/* Runs one step. Returns an error only when the backend fails. */
enum kvb_status sched_step(struct sched *s, struct kvb_err *err);

bool sched_idle(const struct sched *s); /* nothing waiting or running */
void sched_get_stats(const struct sched *s, struct sched_stats *out);

#endif
