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
#include "store/metrics/metrics.h"
#include "store/pstore/pstore.h"
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

/* Records the logprob of token (and the k most likely alternatives) for c. */
enum kvb_status runner_lp_push(struct runner *r, struct choice *c, int32_t token, const float *logits, int k);

#endif
