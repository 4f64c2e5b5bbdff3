/* runner_internal.h — what the files of the run loop share (runner.c: the
 * loop, admission and the scheduler's callbacks; runner_output.c: result
 * and error lines, their metrics rows, logprobs). Private to src/app/. */
#ifndef KVB_RUNNER_INTERNAL_H
#define KVB_RUNNER_INTERNAL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "app/admit.h"
#include "app/runner.h"
#include "base/crashlog.h"
#include "engine/pscore.h"
#include "engine/scheduler.h"
#include "jobs/job.h"
#include "model/model.h"
#include "store/metrics/metrics.h"
#include "store/pstore/pstore.h"
#include "store/pstore/pstore_results.h"
#include "text/chat.h"
#include "text/tok.h"

struct lp_top {
    size_t off, len;
    float lp;
};

struct lp_entry {
    size_t off, len;
    float lp;
    int32_t top_start, n_top;
};

struct choice {
    struct kvb_buf text;
    struct tok_stream ts;
    int32_t n_tokens;
    enum job_finish finish;
    bool done;
    bool cut_at_stop;     /* text was cut at a stop string: bytes held back are dropped */
    int32_t cached;       /* prompt tokens reused from the in-run prefix tree */
    int32_t cached_store; /* prompt tokens loaded from the persistent store */
    double t_admit, t_first, t_end;
    int32_t preemptions, restored_tokens; /* the scheduler's, at its end */
    /* logprobs, when asked: token texts live in arena */
    struct kvb_buf arena;
    struct lp_entry *lp;
    int32_t n_lp, cap_lp;
    struct lp_top *top;
    int32_t n_top, cap_top;
    /* the prompt's scores (echo with logprobs, prompt_logprobs): kept by a prompt's first choice */
    struct pscore *ps; /* (n_ps) */
    int32_t *pids;     /* (n_ps) the prompt's token ids */
    int32_t n_ps;
};

/* A prompt as the result line shows it: its text (echo; text offsets count
 * from its start) and, when asked, its scores in the job format's forms. */
struct prompt_view {
    struct kvb_buf text;
    int64_t text_cp;                /* code points of text */
    int32_t n;                      /* prompt tokens scored; 0: no scores */
    struct job_token_logprob *echo; /* (n) echo with logprobs: the prompt's tokens, [0] none */
    struct job_top_logprob *echo_top;
    struct job_prompt_logprob *plp; /* (n) prompt_logprobs, [0] null */
    struct job_rank_logprob *plp_e;
    struct kvb_buf arena; /* the token texts */
};

/* A scheduler user id is slot * RUNNER_UID_SPAN + the sequence's index in
 * its line (a choice, or an item of a pooled line). */
#define RUNNER_UID_SPAN ((uint64_t)JOB_MAX_INPUTS)
_Static_assert(JOB_MAX_INPUTS >= JOB_MAX_CHOICES, "a line's sequences fit its span of user ids");

struct slot {
    bool used;
    struct job_request req;
    struct admit_plan plan; /* its prompts' token ids are freed once submitted; their lengths stay */
    int32_t n_choices;      /* plan.n_choices */
    int32_t n_done;
    bool failed;        /* a choice could not be completed: the line is a 500 error */
    char fail_msg[320]; /* the first failure's cause */
    double t_submit;
    struct choice *ch;  /* (n_choices) */
    uint64_t line_hash; /* crashlog_hash of its input line */
    /* pooled lines (embeddings, score, rerank; runner_pool.c): ch[i] times
     * and counts item i */
    enum admit_item item;  /* what its sequences are */
    int32_t width;         /* floats of one item's result: n_embd, or 1 (a pair's logit) */
    float *vals;           /* (n_choices, width) */
    int32_t result_hits;   /* items answered by the persistent results cache */
    int64_t result_tokens; /* their prompt tokens */
};

/* KVBATCH_TEST_CRASH=CUSTOM_ID:token|step makes the process crash (SIGSEGV)
 * while that request runs, for the tests of the crash journal: "token" in
 * the request's own callback, by writing through a null pointer (its line is
 * named), "step" just before a forward pass it takes part in, by raise (no
 * line is named unless it runs alone). CUSTOM_ID:queue makes the scheduler's
 * refusal of one of its choices (its second, or its only one) happen, as
 * running out of memory would, for the test that the line fails alone.
 * Test-only; nothing else reads it. */
enum test_crash { TEST_CRASH_NONE = 0, TEST_CRASH_TOKEN, TEST_CRASH_STEP, TEST_CRASH_QUEUE };

struct runner {
    const struct run_opts *o;
    struct model *model;
    struct tok *tok;
    struct chat_template tmpl;
    bool have_tmpl;
    char tmpl_error[sizeof(struct kvb_err)];
    char tmpl_label[256]; /* chat_template_describe's name for it (settings, summary) */
    struct backend *be;
    struct sched *sched;
    struct slot *slots;
    int32_t n_slots, n_used;
    FILE *in, *out;
    struct job_reader *reader;
    struct job_idset *done_keys; /* resume: keys already in the output */
    struct job_idset *seen_ids;  /* custom_ids met in this input */
    uint8_t *mine;               /* with --shard: mine[k] = line k+1 is this shard's; else NULL */
    int64_t n_plan_lines;
    struct admit_ctx admit; /* what admit_prepare needs (owns the grammars' vocabulary) */
    bool journal;           /* a crash journal is open (crashlog.h) */
    char journal_path[4200];
    struct crashlog_history hist; /* what earlier runs' journal says (resume) */
    struct slot *held;            /* a line to run alone (it was in flight at a crash): waits for an idle
                                    scheduler, and nothing else is admitted meanwhile */
    struct slot *isolating;       /* the line running alone; nothing else is admitted until it ends */
    enum test_crash test_crash;
    const char *test_crash_id;
    size_t test_crash_id_len;
    volatile int *test_crash_null; /* NULL: what TEST_CRASH_TOKEN writes through */
    uint64_t plan_hash;            /* with --shard: shard_plan_out.hash, recorded in the run's settings */
    struct metrics_db *db;
    int64_t run_id;
    struct pstore *ps; /* persistent prefix cache, or NULL */
    struct pstore_model pm;
    /* pooling (runner_pool.c) */
    struct admit_pool_cfg pool_cfg;
    enum model_pooling embed_pool; /* how embeddings pool (NONE: they cannot be made) */
    unsigned pair_flag;            /* SCHED_POOL_* of a reranker's pair */
    bool normalize;                /* embeddings L2-normalised */
    char no_embed[320];            /* pool_cfg.no_embed's text */
    bool have_rspace;              /* results are kept (a store, and spaces for them) */
    struct pstore_rspace rs_embed, rs_pair;
    int64_t result_hits, result_tokens; /* sequences the results cache answered, and their tokens */
    int64_t pooled_seqs;                /* sequences of pooled lines */
    struct kvb_buf line;
    bool write_failed;
    /* progress and totals */
    int64_t total_lines, lines_done, skipped;
    struct metrics_totals tot;
    double t0, last_progress;
    double unix_minus_mono; /* wall clock minus cli_now() at start: the metrics' wall-clock times */
    int32_t n_ctx;
    int32_t max_batch, max_step; /* o's, or the defaults for the backend in use */
    int64_t created;
    bool out_cut; /* setup's last step cuts the output to out_cut_at bytes */
    uint64_t out_cut_at;
};

/* The error line for an input line; q (NULL when the line gave none) is
 * where its custom_id comes from. status: 400 or 500. */
void runner_emit_error(struct runner *r, const struct job_request *q, const struct job_error *e, int status);
/* The result line of a slot whose choices all finished, and its metrics row. */
void runner_emit_result(struct runner *r, struct slot *s);
void runner_free_slot(struct runner *r, struct slot *s);
/* Prompt k of q as its result shows it, from the scores choice c kept
 * (runner_keep_scores); free with runner_prompt_view_free. KVB_ERR_NOMEM. */
enum kvb_status runner_prompt_view(struct runner *r, const struct job_request *q, int32_t k, const struct choice *c,
                                   struct prompt_view *v);
void runner_prompt_view_free(struct prompt_view *v);
/* Keeps info's prompt scores and ids in c (once). KVB_ERR_NOMEM. */
enum kvb_status runner_keep_scores(struct choice *c, const struct sched_seq_info *info);

/* Writes r->line to the output (and flushes it); false (and the run's write
 * failed) when it cannot. */
bool runner_write_line(struct runner *r);
/* The metrics row of a slot whose result line was written, and the totals. */
void runner_result_metrics(struct runner *r, const struct slot *s, int64_t prompt_tokens, int64_t completion,
                           int64_t cached_run, int64_t cached_store);

/* ---- pooled lines (runner_pool.c) ---- */
/* Decides how the run pools (options, model); false with a message printed
 * when the options cannot apply. Before the scheduler is made. */
bool runner_pool_setup(struct runner *r);
/* The results cache's spaces, once the store is open. */
void runner_pool_store(struct runner *r);
/* Submits a prepared pooled slot's items (those the results cache does not
 * answer); writes its line at once when it answers all. False on a fatal
 * error. */
bool runner_pool_submit(struct runner *r, struct slot *s);
/* A pooled slot's sequence ended. */
void runner_pool_finish(struct runner *r, struct slot *s, const struct sched_seq_info *info, enum sched_finish why);

/* Records the logprob of token (and the k most likely alternatives) for c. */
enum kvb_status runner_lp_push(struct runner *r, struct choice *c, int32_t token, const float *logits, int k);

#endif
