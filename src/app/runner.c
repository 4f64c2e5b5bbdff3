/* runner.c — the run loop of `kvbatch run` (see runner.h).
 *
 * Requests in flight live in a fixed table of slots (the look-ahead window);
 * each slot holds one input line and its choices (n per prompt, prompt by
 * prompt), and each choice is one scheduler sequence (user id = slot *
 * RUNNER_UID_SPAN + choice); a pooled line's sequences (embeddings, score,
 * rerank: runner_pool.c) are numbered the same way. A slot is written out and freed when its last
 * choice finishes. What a line needs before it can run (tokens, checks,
 * sampler parameters) is admit.c's. */
#include "app/runner.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "app/admit.h"
#include "app/backend_select.h"
#include "app/cli_files.h"
#include "app/cli_util.h"
#include "app/runner_internal.h"
#include "backend/backend.h"
#include "base/alloc.h"
#include "base/crashlog.h"
#include "base/json.h"
#include "engine/grammar.h"
#include "engine/scheduler.h"
#include "jobs/job.h"
#include "jobs/job_shard.h"
#include "model/model.h"
#include "store/metrics/metrics.h"
#include "store/pstore/pstore.h"
#include "text/chat.h"
#include "text/tok.h"

/* The one piece of global state: set by the signal handler, read by the loop. */
static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) { stop_signal = sig; }

/* ---- scheduler callbacks ------------------------------------------------------- */

/* Marks the slot's line as failed (the first cause is kept): when its last
 * choice ends it is written as a 500 error line, and the job goes on. */
static void fail_slot(struct slot *s, const char *why)
{
    if (s->failed) return;
    s->failed = true;
    snprintf(s->fail_msg, sizeof s->fail_msg, "%s", why);
}

/* Appends token's text to the choice: with skip_special_tokens false a
 * control token (one whose text is only shown when asked) adds its text,
 * after any bytes held back for an unfinished character. False when out of
 * memory (the line is failed). */
static bool push_text(struct runner *r, struct slot *s, struct choice *c, int32_t token)
{
    struct kvb_buf *t = &c->text;
    const enum kvb_status st = s->req.skip_special_tokens
                                   ? tok_stream_push(r->tok, &c->ts, token, &t->data, &t->len, &t->cap)
                                   : tok_stream_push_special(r->tok, &c->ts, token, &t->data, &t->len, &t->cap);
    if (st != KVB_OK) fail_slot(s, "out of memory while decoding the output");
    return st == KVB_OK;
}

/* vLLM's rules for where an output ends: an end-of-generation token (unless
 * ignore_eos) or one of stop_token_ids ends it, its text kept only with
 * include_stop_str_in_output; stop strings are looked for once min_tokens
 * are out (before, end-of-generation and stop tokens cannot be drawn: the
 * sampler's ban) and cut the text before the string, or after it with
 * include_stop_str_in_output. */
static bool test_crash_is(const struct runner *r, const struct job_request *q, enum test_crash where)
{
    return r->test_crash == where && q->custom_id_len == r->test_crash_id_len &&
           memcmp(q->custom_id, r->test_crash_id, q->custom_id_len) == 0;
}

static bool on_token(struct runner *r, const struct sched_seq_info *info, int32_t token);

static bool cb_token(void *user, const struct sched_seq_info *info, int32_t token)
{
    crashlog_mark_uid(info->user_id); /* a crash in here is this request's */
    const bool stop = on_token(user, info, token);
    crashlog_mark_uid(UINT64_MAX);
    return stop;
}

static bool on_token(struct runner *r, const struct sched_seq_info *info, int32_t token)
{
    struct slot *s = &r->slots[info->user_id / RUNNER_UID_SPAN];
    struct choice *c = &s->ch[info->user_id % RUNNER_UID_SPAN];
    const struct job_request *q = &s->req;
    if (s->failed) return true; /* a sibling choice failed: the line is an error whatever this one does */
    if (test_crash_is(r, q, TEST_CRASH_TOKEN)) *r->test_crash_null = 1; /* a real fault, as a bug would make */
    c->n_tokens++;
    if (c->n_tokens == 1) c->t_first = info->t_first_token;
    if (q->logprobs && !info->logits) {
        fail_slot(s, "internal error: the logits for logprobs were not returned");
        return true;
    }
    if (q->logprobs && runner_lp_push(r, c, token, info->logits, q->top_logprobs) != KVB_OK) {
        fail_slot(s, "out of memory while recording logprobs");
        return true;
    }
    if ((!q->ignore_eos && tok_is_eog(r->tok, token)) || admit_is_stop_token(q, token)) {
        if (q->include_stop_str_in_output && !push_text(r, s, c, token)) return true;
        c->finish = JOB_FINISH_STOP;
        return true;
    }
    size_t before = c->text.len;
    if (!push_text(r, s, c, token)) return true;
    if (c->n_tokens < q->min_tokens) return false;
    for (int i = 0; i < q->n_stop; i++) {
        size_t sl = q->stop_len[i];
        if (c->text.len < sl) continue;
        size_t from = before + 1 > sl ? before + 1 - sl : 0;
        for (size_t p = from; p + sl <= c->text.len; p++) {
            if (memcmp(c->text.data + p, q->stop[i], sl) == 0) {
                /* the stop string is not part of the output, as in OpenAI's API, unless asked */
                c->text.len = q->include_stop_str_in_output ? p + sl : p;
                c->finish = JOB_FINISH_STOP;
                c->cut_at_stop = true;
                return true;
            }
        }
    }
    return false;
}

static void on_finish(struct runner *r, const struct sched_seq_info *info, enum sched_finish why);

static void cb_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    crashlog_mark_uid(info->user_id);
    on_finish(user, info, why);
    crashlog_mark_uid(UINT64_MAX);
}

static void on_finish(struct runner *r, const struct sched_seq_info *info, enum sched_finish why)
{
    struct slot *s = &r->slots[info->user_id / RUNNER_UID_SPAN];
    if (job_url_pooled(s->req.url)) {
        runner_pool_finish(r, s, info, why);
        return;
    }
    struct choice *c = &s->ch[info->user_id % RUNNER_UID_SPAN];
    c->done = true;
    c->cached = info->cached_tokens;
    c->cached_store = info->store_tokens;
    c->t_admit = info->t_admit;
    c->t_end = info->t_end;
    c->preemptions = info->preemptions;
    c->restored_tokens = info->restored_tokens;
    if (why == SCHED_FINISH_LENGTH) c->finish = JOB_FINISH_LENGTH;
    if (why == SCHED_FINISH_ERROR) fail_slot(s, info->error ? info->error : "internal error in the scheduler");
    /* a prompt's scores are the same for all its choices: its first keeps them */
    if (why != SCHED_FINISH_ERROR && (info->user_id % RUNNER_UID_SPAN) % (uint64_t)s->req.n == 0 &&
        runner_keep_scores(c, info) != KVB_OK)
        fail_slot(s, "out of memory while keeping the prompt's scores");
    /* The bytes held back for a character the output ended inside of (cut
     * by max_tokens, or ended by the model mid-character) are not flushed
     * as U+FFFD: the text ends at the last whole character, as OpenAI's API
     * and vLLM end it. The token ids and logprobs still carry every byte. */
    tok_stream_init(&c->ts, r->tok);
    if (++s->n_done < s->n_choices) return;
    if (s->failed) {
        struct job_error e;
        job_error_setf(&e, JOB_ERR_SERVER, s->req.line_no, NULL, "%s", s->fail_msg);
        runner_emit_error(r, &s->req, &e, 500);
    } else {
        runner_emit_result(r, s);
    }
    runner_free_slot(r, s);
}

/* ---- admission of input lines --------------------------------------------------- */

/* The first prompt's tokens for the shard plan (no context check: the plan
 * must not depend on --ctx). */
static bool prompt_of(void *user, const struct job_request *q, int32_t **ids, size_t *n)
{
    struct runner *r = user;
    struct job_error e;
    /* a line that crashed an earlier run is not tokenized again, here either */
    if (crashlog_find(r->hist.blamed, r->hist.n_blamed, q->line_no, 0)) return false;
    /* No prompt longer than the model's context is worth grouping: one
     * that runs at all (--ctx past it) is planned as a line by number. */
    const size_t max_ids = r->model->hp.n_ctx_train > 0 ? (size_t)r->model->hp.n_ctx_train : (size_t)1 << 20;
    crashlog_mark_line(q->line_no, 0, 'r');
    const bool ok = admit_prompt_ids(&r->admit, q, 0, max_ids, ids, n, &e) == KVB_OK;
    crashlog_mark_line(0, 0, 0);
    return ok;
}

/* --shard: which lines are this shard's (job_shard.h). The plan reads the
 * whole input through r->in, which is then rewound for the run: one open
 * file, so both read the same bytes, and it must be a regular file. */
static bool plan_shard(struct runner *r)
{
    const struct run_opts *o = r->o;
    struct stat sb;
    if (fstat(fileno(r->in), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr,
                "kvbatch run: --shard needs the job as a regular file (every shard reads all of it "
                "to plan, then again to run); %s is %s\n",
                o->input_path, r->in == stdin ? "standard input" : "a pipe or device");
        return false;
    }
    const long start = ftell(r->in);
    const double t0 = cli_now();
    struct kvb_err err = {{0}};
    struct shard_plan_out plan;
    /* Every shard must plan alike, on whatever day it runs: a template's
     * strftime_now reads a fixed date here (the run itself reads the clock). */
    const int64_t now = r->admit.now;
    r->admit.now = 86400;
    enum kvb_status st =
        shard_plan(r->in, o->shard_index, o->shard_count, r->model->hp.n_ctx_train, prompt_of, r, &plan, &err);
    r->admit.now = now;
    clearerr(r->in);
    if (st == KVB_OK && (start < 0 || fseek(r->in, start, SEEK_SET) != 0))
        st = kvb_errf(&err, KVB_ERR_IO, "cannot rewind %s: %s", o->input_path, strerror(errno));
    if (st != KVB_OK) {
        kvb_free(plan.mine);
        fprintf(stderr, "kvbatch run: --shard: %s\n", err.msg);
        return false;
    }
    r->mine = plan.mine;
    r->n_plan_lines = plan.n_lines;
    r->plan_hash = plan.hash;
    const int64_t n_mine = plan.n_mine;
    r->total_lines = n_mine;
    if (!o->quiet)
        fprintf(stderr,
                "kvbatch run: shard %d of %d (0-based): %lld of %lld lines, grouped by shared prompt prefix "
                "(planned in %.1f s)\n",
                o->shard_index, o->shard_count, (long long)n_mine, (long long)r->n_plan_lines, cli_now() - t0);
    return true;
}

static struct slot *free_slot_ptr(struct runner *r)
{
    for (int32_t i = 0; i < r->n_slots; i++)
        if (!r->slots[i].used) return &r->slots[i];
    return NULL;
}

/* An admitted line that cannot run: its error line (400, or 500 for the
 * server's own failures), and its request freed. True: the job goes on. */
static bool refuse(struct runner *r, struct job_request *q, const struct job_error *e)
{
    runner_emit_error(r, q, e, strcmp(e->code, JOB_ERR_SERVER) ? 400 : 500);
    job_request_free(q);
    return true;
}

/* Submits every choice of a prepared slot to the scheduler, then frees the
 * prompts' token ids (the scheduler copies them). A choice the scheduler
 * cannot take (out of memory for its sequence or sampler) fails its line,
 * not the job: with none queued the line is written as a 500 error now;
 * otherwise the choices queued end at their first token and the line is
 * written as a 500 error when the last of them finishes. Always true (the
 * job goes on); kept a bool for its callers' loop. */
static bool submit_slot(struct runner *r, struct slot *s)
{
    const struct job_request *q = &s->req;
    s->t_submit = cli_now();
    if (job_url_pooled(q->url)) return runner_pool_submit(r, s);
    for (int32_t i = 0; i < s->n_choices; i++) {
        tok_stream_init(&s->ch[i].ts, r->tok);
        struct sampler_params sp;
        admit_choice_params(&s->plan, q, i, &sp);
        const struct admit_prompt *p = &s->plan.prompts[i / q->n];
        uint64_t uid = (uint64_t)(s - r->slots) * RUNNER_UID_SPAN + (uint64_t)i;
        struct kvb_err err = {{0}};
        const unsigned flags = (q->logprobs ? SCHED_WANT_LOGITS : 0) | (job_scores_prompt(q) ? SCHED_SCORE_PROMPT : 0);
        const bool inject = test_crash_is(r, q, TEST_CRASH_QUEUE) && i == (s->n_choices > 1 ? 1 : 0);
        if (inject) kvb_errf(&err, KVB_ERR_NOMEM, "out of memory (injected by KVBATCH_TEST_CRASH)");
        if (inject || sched_submit(r->sched, uid, p->ids, p->n, q->max_tokens, &sp, flags, &err) != KVB_OK) {
            char why[sizeof s->fail_msg];
            snprintf(why, sizeof why, "cannot queue the request: %.280s", err.msg);
            fail_slot(s, why);
            s->n_choices = i; /* the ones queued; those after i hold nothing yet */
            if (i == 0) {
                struct job_error e;
                job_error_setf(&e, JOB_ERR_SERVER, q->line_no, NULL, "%s", s->fail_msg);
                runner_emit_error(r, q, &e, 500);
                runner_free_slot(r, s);
                return true;
            }
            break;
        }
    }
    for (int32_t k = 0; k < s->plan.n_prompts; k++) {
        kvb_free(s->plan.prompts[k].ids);
        s->plan.prompts[k].ids = NULL;
    }
    return true;
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    }
    return "a fatal signal";
}

/* The error for a line that crashed an earlier run (crashlog.h): it is
 * not run again, so that a resume can finish the job. */
static void crashed_error(const struct crashlog_line *b, uint64_t line_no, struct job_error *e)
{
    job_error_setf(e, JOB_ERR_SERVER, line_no, NULL,
                   "this line crashed kvbatch (signal %d, %s) in an earlier run%s; it is not run again, so that the "
                   "job can finish (a bug: please report it with the line)",
                   b->sig, signal_name(b->sig), b->phase == 'p' ? " while it was being read" : "");
}

/* Whether the model can run a generating line (chat, completion): not an
 * encoder, nor a reranker's file, whose head is its classifier (llama.cpp's
 * converter drops a Qwen3-Reranker's LM head for cls.output). */
static bool generates(const struct runner *r, const struct job_request *q, struct job_error *e)
{
    const struct model *m = r->model;
    if (m->ops.encoder) {
        job_error_setf(e, JOB_ERR_INVALID_REQUEST, q->line_no, "url",
                       "this model is an encoder (bidirectional, no LM head): it takes /v1/embeddings, /v1/score and "
                       "/v1/rerank lines, not %s",
                       job_url_name(q->url));
        return false;
    }
    if (m->pooling != MODEL_POOL_RANK) return true;
    job_error_setf(e, JOB_ERR_INVALID_REQUEST, q->line_no, "url",
                   "this model is a reranker (its file's pooling_type is rank): it takes /v1/score and /v1/rerank "
                   "lines, not %s",
                   job_url_name(q->url));
    return false;
}

/* One line: parse, checks, preparation, then submission (or, for a line
 * that was in flight at a crash naming none, held to run alone). */
static bool admit_one(struct runner *r, const struct job_line *ln, uint64_t hash)
{
    struct job_error e;
    struct slot *s = free_slot_ptr(r);
    if (admit_check_length(ln, &e) != KVB_OK) {
        runner_emit_error(r, NULL, &e, 400);
        return true;
    }
    const struct crashlog_line *blamed = crashlog_find(r->hist.blamed, r->hist.n_blamed, ln->line_no, hash);
    if (blamed && blamed->phase == 'p') { /* it crashed the parser: not even that again */
        crashed_error(blamed, ln->line_no, &e);
        runner_emit_error(r, NULL, &e, 500);
        return true;
    }
    struct job_request *q = &s->req;
    crashlog_mark_line(ln->line_no, hash, 'p');
    enum kvb_status st = job_parse_line(ln->data, ln->len, ln->line_no, q, &e);
    struct grammar *schema = NULL;
    if (st == KVB_OK) st = admit_constraint(q, &schema, &e); /* part of reading the line: see admit.h */
    crashlog_mark_line(ln->line_no, hash, 'r');
    if (st != KVB_OK) {
        runner_emit_error(r, q, &e, st == KVB_ERR_NOMEM ? 500 : 400);
        job_request_free(q);
        return true;
    }
    if (admit_check_unique(r->seen_ids, q, &e) != KVB_OK) {
        grammar_free(schema);
        return refuse(r, q, &e);
    }
    struct job_key key;
    job_key_custom_id(q->custom_id, q->custom_id_len, &key);
    if (job_idset_contains(r->done_keys, key.hex, JOB_KEY_LEN)) {
        r->skipped++;
        r->lines_done++;
        grammar_free(schema);
        job_request_free(q);
        return true;
    }
    if (blamed) {
        crashed_error(blamed, ln->line_no, &e);
        grammar_free(schema);
        return refuse(r, q, &e);
    }
    if (!job_url_pooled(q->url) && !generates(r, q, &e)) {
        grammar_free(schema);
        return refuse(r, q, &e);
    }
    const enum kvb_status pst = job_url_pooled(q->url)
                                    ? admit_prepare_pooled(&r->admit, &r->pool_cfg, q, &s->plan, &s->item, &e)
                                    : admit_prepare(&r->admit, q, schema, &s->plan, &e);
    if (job_url_pooled(q->url)) grammar_free(schema); /* none: a pooled line has no output constraint */
    if (pst != KVB_OK) {                              /* the plan owns the grammar now */
        if (stop_signal) {                            /* cut short: no error line, so that --resume runs it */
            job_request_free(q);
            return true;
        }
        return refuse(r, q, &e);
    }
    s->n_choices = s->plan.n_choices;
    s->ch = kvb_calloc((size_t)s->n_choices, sizeof *s->ch);
    if (!s->ch) {
        admit_plan_free(&s->plan);
        job_error_setf(&e, JOB_ERR_SERVER, ln->line_no, NULL, "out of memory");
        return refuse(r, q, &e);
    }
    s->used = true;
    r->n_used++;
    s->n_done = 0;
    s->failed = false;
    s->line_hash = hash;
    if (crashlog_find(r->hist.suspects, r->hist.n_suspects, ln->line_no, hash)) {
        r->held = s; /* tracked once it runs, alone */
        return true;
    }
    crashlog_track((int32_t)(s - r->slots), ln->line_no, hash);
    return submit_slot(r, s);
}

/* Reads input lines until one request is submitted, the window is full, or
 * the input ends (*eof). Returns false on a fatal error. */
static bool admit_line(struct runner *r, bool *eof)
{
    struct job_line ln;
    bool got;
    struct kvb_err err = {{0}};
    enum kvb_status rst = job_reader_next(r->reader, &ln, &got, &err);
    if (rst != KVB_OK) {
        if (rst == KVB_ERR_CANCELLED && stop_signal) return true; /* a signal cut a read from a pipe short */
        fprintf(stderr, "\nkvbatch run: cannot read %s: %s\n", r->o->input_path, err.msg);
        return false;
    }
    if (!got) {
        *eof = true;
        return true;
    }
    if (r->mine && (ln.line_no > (uint64_t)r->n_plan_lines || !r->mine[ln.line_no - 1]))
        return true; /* another shard's line (or one written after the plan) */
    if (job_line_is_blank(ln.data, ln.len)) {
        r->lines_done++; /* counted so done reaches the line total */
        return true;
    }
    const bool ok = admit_one(r, &ln, crashlog_hash(ln.data, ln.len));
    crashlog_mark_line(0, 0, 0);
    return ok;
}

/* The held line (r->held) runs now, alone: the scheduler is idle. */
static bool run_held(struct runner *r)
{
    struct slot *s = r->held;
    r->held = NULL;
    r->isolating = s;
    crashlog_track((int32_t)(s - r->slots), s->req.line_no, s->line_hash);
    return submit_slot(r, s);
}

/* ---- progress -------------------------------------------------------------------- */

static void progress(struct runner *r, bool final)
{
    if (r->o->quiet) return;
    double now = cli_now();
    bool tty = isatty(STDERR_FILENO);
    if (!final && now - r->last_progress < (tty ? 0.5 : 5.0)) return;
    r->last_progress = now;
    struct sched_stats st;
    sched_get_stats(r->sched, &st);
    double el = now - r->t0;
    double tps = el > 0 ? (double)(st.prefill_computed + st.decode_tokens) / el : 0;
    /* sequences answered by the results cache reuse all their tokens */
    const double all = (double)(st.prompt_tokens + r->result_tokens);
    double reuse = all > 0 ? 100.0 * (double)(st.cached_tokens + st.store_tokens + r->result_tokens) / all : 0;
    char total[32] = "?", eta[32] = "?";
    if (r->total_lines >= 0) {
        snprintf(total, sizeof total, "%lld", (long long)r->total_lines);
        int64_t left = r->total_lines - r->lines_done;
        if (r->lines_done > r->skipped && left >= 0)
            snprintf(eta, sizeof eta, "%.0fs", el / (double)(r->lines_done - r->skipped) * (double)left);
    }
    fprintf(stderr, "%s[%lld/%s lines] %.1f tok/s, %d running, prefix reuse %.0f%%, ETA %s%s", tty ? "\r" : "",
            (long long)r->lines_done, total, tps, st.running, reuse, eta, tty && !final ? "   " : "\n");
    if (tty && final) fputc('\n', stderr);
}

/* Lines in a regular file (for done/total); -1 when not knowable cheaply. */
static int64_t count_lines(FILE *f)
{
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) return -1;
    long pos = ftell(f);
    char buf[1 << 16];
    int64_t n = 0, last = '\n';
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < got; i++) n += buf[i] == '\n';
        last = buf[got - 1];
    }
    if (last != '\n') n++;
    clearerr(f);
    fseek(f, pos, SEEK_SET);
    return n;
}

/* ---- set-up and the loop ------------------------------------------------------------ */

/* The persistent cache is an optimisation: when it cannot be opened the job
 * runs without it, with a warning. */
static void open_store(struct runner *r)
{
    const struct run_opts *o = r->o;
    char dir[4096];
    if (o->cache_dir) snprintf(dir, sizeof dir, "%s", o->cache_dir);
    else pstore_default_dir(dir, sizeof dir);
    struct pstore_opts po = {.max_size = o->cache_max_size,
                             .zstd_level = o->cache_level,
                             .lossy8 = o->cache_lossy8,
                             .n_threads = o->n_threads,
                             .quiet = o->quiet,
                             .queue_bytes = o->cache_buffer};
    struct kvb_err err = {{0}};
    if (pstore_open(dir, &po, &r->ps, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: warning: persistent cache off: %s\n", err.msg);
        r->ps = NULL;
        return;
    }
    const struct model_hparams *hp = &r->model->hp;
    memcpy(r->pm.fingerprint, r->model->fingerprint, sizeof r->pm.fingerprint);
    r->pm.name = r->model->name;
    r->pm.arith = r->be->arith;
    /* The pool's bytes are what is stored, so the KV type names the entries:
     * a q8 run never reads an f16 run's blocks, nor the other way round. */
    r->pm.dtype = r->be->kv_type == KV_Q8   ? PSTORE_DTYPE_Q8
                  : r->be->kv_type == KV_Q4 ? PSTORE_DTYPE_Q4
                                            : PSTORE_DTYPE_F16;
    r->pm.block_size = o->block_size;
    r->pm.n_layer = hp->n_layer;
    r->pm.kv_dim = hp->n_head_kv * hp->head_dim;
    if (sched_set_store(r->sched, r->ps, &r->pm) != KVB_OK) {
        fprintf(stderr, "kvbatch run: warning: persistent cache off: out of memory\n");
        pstore_close(r->ps);
        r->ps = NULL;
        return;
    }
    if (!o->quiet) fprintf(stderr, "kvbatch run: persistent prefix cache in %s\n", dir);
}

/* Opens the output without emptying it (cli_files.h): setup cuts it last,
 * so a run that cannot start leaves earlier results alone. */
static bool open_output(struct runner *r)
{
    const struct run_opts *o = r->o;
    struct kvb_err err = {{0}};
    r->out_cut = !o->resume;
    r->out_cut_at = 0;
    if (o->resume) {
        struct job_resume_info info;
        if (job_resume_scan(o->output_path, r->done_keys, &info, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch run: cannot resume from %s: %s\n", o->output_path, err.msg);
            return false;
        }
        r->out_cut = info.torn;
        r->out_cut_at = info.truncate_at;
        if (!o->quiet && info.lines_ok)
            fprintf(stderr, "kvbatch run: resuming: %llu results already in %s\n", (unsigned long long)info.lines_ok,
                    o->output_path);
    }
    if (cli_output_open(o->output_path, &r->out, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: %s\n", err.msg);
        return false;
    }
    return true;
}

/* The last step of setup, after everything that can fail: empty the output
 * (or cut a resumed one's torn last line). */
static bool cut_output(struct runner *r)
{
    const struct run_opts *o = r->o;
    struct kvb_err err = {{0}};
    if (!r->out_cut) return true;
    if (cli_output_cut(r->out, o->output_path, r->out_cut_at, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: %s\n", err.msg);
        return false;
    }
    if (o->resume && !o->quiet)
        fprintf(stderr, "kvbatch run: %s ended in a torn line; cut it at byte %llu\n", o->output_path,
                (unsigned long long)r->out_cut_at);
    return true;
}

/* The crash journal beside the output (crashlog.h): what earlier runs left
 * (with --resume), read before anything tokenizes a line. No journal for an
 * output that is not a regular file, where a resume means nothing. */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static void journal_read(struct runner *r)
{
    const struct run_opts *o = r->o;
    struct stat sb;
    if (!strcmp(o->output_path, "-") || (stat(o->output_path, &sb) == 0 && !S_ISREG(sb.st_mode))) return;
    if (snprintf(r->journal_path, sizeof r->journal_path, "%s.journal", o->output_path) >= (int)sizeof r->journal_path)
        return;
    /* never write over a file the run reads (the journal is emptied on a fresh run) */
    if (same_file(r->journal_path, o->input_path) || same_file(r->journal_path, o->model_path) ||
        same_file(r->journal_path, o->metrics_path)) {
        fprintf(stderr, "kvbatch run: warning: %s is also the input, the model or the metrics; no crash journal\n",
                r->journal_path);
        return;
    }
    r->journal = true;
    if (!o->resume) return;
    struct kvb_err err = {{0}};
    if (crashlog_read(r->journal_path, &r->hist, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: warning: %s; lines that crashed an earlier run may crash this one\n", err.msg);
        return;
    }
    if (o->quiet || !r->hist.n_crashes) return;
    fprintf(stderr,
            "kvbatch run: %s records %d crash%s: lines named by a crash (%zu) get an error line instead of "
            "running again; lines in flight at a crash naming none (%zu) run one at a time\n",
            r->journal_path, r->hist.n_crashes, r->hist.n_crashes == 1 ? "" : "es", r->hist.n_blamed,
            r->hist.n_suspects);
}

static bool setup(struct runner *r)
{
    const struct run_opts *o = r->o;
    struct kvb_err err = {{0}};
    r->in = strcmp(o->input_path, "-") ? fopen(o->input_path, "rb") : stdin;
    if (!r->in) {
        fprintf(stderr, "kvbatch run: cannot open %s: %s\n", o->input_path, strerror(errno));
        return false;
    }
    r->total_lines = count_lines(r->in);
    if (job_reader_create(r->in, 0, &r->reader, &err) != KVB_OK || job_idset_create(&r->done_keys) != KVB_OK ||
        job_idset_create(&r->seen_ids) != KVB_OK) {
        fprintf(stderr, "kvbatch run: %s\n", err.msg[0] ? err.msg : "out of memory");
        return false;
    }
    if (model_load(o->model_path, &r->model, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot load model: %s\n", err.msg);
        return false;
    }
    if (tok_load(r->model->gguf, &r->tok, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot load the tokenizer: %s\n", err.msg);
        return false;
    }
    /* A model without a usable template can still run completion lines;
     * chat lines then fail one by one with its message. */
    if (admit_template_choose(r->model, r->tok, o->chat_template, &r->tmpl, &r->have_tmpl, r->tmpl_error,
                              sizeof r->tmpl_error, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: --chat-template: %s\n", err.msg);
        return false;
    }
    r->n_ctx = admit_n_ctx(r->model, o->n_ctx);
    model_set_ctx(r->model, r->n_ctx); /* before anything reads the fingerprint or computes */
    journal_read(r);
    if (admit_ctx_init(&r->admit, r->tok, r->have_tmpl ? &r->tmpl : NULL, r->tmpl_error, r->model->hp.n_vocab,
                       r->n_ctx) != KVB_OK) {
        fprintf(stderr, "kvbatch run: out of memory\n");
        return false;
    }
    r->admit.cancel = &stop_signal;
    r->admit.now = admit_clock(); /* one date for every line of the run (strftime_now) */
    chat_template_describe(r->have_tmpl ? &r->tmpl : NULL, r->tmpl_label, sizeof r->tmpl_label);
    if (o->shard_count > 1 && !plan_shard(r)) return false;
    struct be_select_opts bo = {.device = o->device,
                                .n_threads = o->n_threads,
                                .block_size = o->block_size,
                                .kv_mem = o->kv_mem,
                                .n_ctx = r->n_ctx,
                                .kernels = o->kernels,
                                .deterministic = o->deterministic,
                                .cuda_graphs = o->cuda_graphs,
                                .kv_type = o->kv_type,
                                .act16 = o->act16};
    if (be_select_create(r->model, &bo, &r->be, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot start the backend: %s\n", err.msg);
        return false;
    }
    /* A GPU wants many sequences and large steps to be busy; a CPU gains
     * little beyond these and holds more logits rows for nothing. */
    const bool gpu = strcmp(r->be->name, "cpu") != 0;
    r->max_batch = o->max_batch > 0 ? o->max_batch : gpu ? 256 : 128;
    r->max_step = o->max_step_tokens > 0 ? o->max_step_tokens : gpu ? 4096 : 512;
    if (!runner_pool_setup(r)) return false;
    struct sched_opts so = {.max_batch = r->max_batch,
                            .max_step_tokens = r->max_step,
                            .n_ctx = r->n_ctx,
                            .n_hidden = r->model->hp.n_embd,
                            .bidirectional = r->model->ops.encoder};
    struct sched_callbacks cb = {.user = r, .on_token = cb_token, .on_finish = cb_finish};
    if (sched_create(r->be, r->model->hp.n_vocab, &so, &cb, &r->sched, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: %s\n", err.msg);
        return false;
    }
    r->n_slots = o->lookahead > 0 ? o->lookahead : (r->max_batch * 4 > 256 ? r->max_batch * 4 : 256);
    r->slots = kvb_calloc((size_t)r->n_slots, sizeof *r->slots);
    if (!r->slots) {
        fprintf(stderr, "kvbatch run: out of memory\n");
        return false;
    }
    if (r->journal) {
        if (crashlog_open(r->journal_path, r->n_slots, RUNNER_UID_SPAN, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch run: warning: %s; a line that crashes the process would crash a resume too\n",
                    err.msg);
            r->journal = false;
        }
    }
    /* After the journal: the store's fault handler (pstore_guard.c) goes
     * on top of the journal's, so that a fault of a cache read the store
     * turns into a miss is not first recorded as a crash. */
    if (!o->no_cache) open_store(r);
    runner_pool_store(r);
    if (!open_output(r)) return false;

    char mpath[4096];
    if (o->metrics_path) snprintf(mpath, sizeof mpath, "%s", o->metrics_path);
    else if (metrics_default_path(o->output_path, mpath, sizeof mpath) != KVB_OK)
        snprintf(mpath, sizeof mpath, "kvbatch.db");
    if (metrics_open(mpath, &r->db, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot open the metrics database: %s\n", err.msg);
        return false;
    }
    char settings[1024];
    snprintf(settings, sizeof settings,
             "{\"threads\":%d,\"max_batch\":%d,\"max_step_tokens\":%d,\"kv_mem\":%llu,\"block_size\":%d,"
             "\"ctx\":%d,\"lookahead\":%d,\"resume\":%s,\"kernels\":\"%s\",\"shard\":\"%d/%d\","
             "\"shard_plan\":\"%016llx\",\"kv_type\":\"%s\",\"activations\":\"%s\"}",
             be_threads(r->be), r->max_batch, r->max_step,
             (unsigned long long)((uint64_t)r->be->n_blocks * (uint64_t)r->be->block_bytes), o->block_size, r->n_ctx,
             r->n_slots, o->resume ? "true" : "false", be_kernels_name(r->be), o->shard_index,
             o->shard_count > 1 ? o->shard_count : 1, (unsigned long long)r->plan_hash, kv_type_name(r->be->kv_type),
             be_acts_name(r->be));
    { /* the chat template used (a path may hold any byte: JSON-escaped) */
        struct kvb_buf lb = {0};
        size_t at = strlen(settings);
        if (at > 0 && json_put_string(&lb, r->tmpl_label, strlen(r->tmpl_label)) == KVB_OK &&
            at + lb.len + 20 < sizeof settings)
            snprintf(settings + at - 1, sizeof settings - at + 1, ",\"chat_template\":%.*s}", (int)lb.len, lb.data);
        kvb_buf_free(&lb);
    }
    struct metrics_run_info ri = {.job_file = o->input_path,
                                  .output_file = o->output_path,
                                  .model = o->model_path,
                                  .model_fingerprint = r->model->fingerprint,
                                  .backend = r->be->name,
                                  .settings = settings};
    if (metrics_run_begin(r->db, &ri, &r->run_id, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot record the run: %s\n", err.msg);
        return false;
    }
    if (!cut_output(r)) {
        metrics_run_end(r->db, r->run_id, METRICS_RUN_FAILED, &r->tot, NULL);
        return false;
    }
    if (!o->resume) crashlog_restart(); /* a fresh job: what earlier runs recorded is of no use now */
    if (!o->quiet)
        fprintf(
            stderr,
            "kvbatch run: %s on %s (%s kernels, %s activations, %d threads), %d %s KV blocks of %d tokens, batch %d, "
            "run %lld\n"
            "kvbatch run: chat template %s\n",
            r->model->name, r->be->name, be_kernels_name(r->be), be_acts_name(r->be), be_threads(r->be),
            r->be->n_blocks, kv_type_name(r->be->kv_type), o->block_size, r->max_batch, (long long)r->run_id,
            r->have_tmpl ? r->tmpl_label : r->tmpl_error);
    return true;
}

static void teardown(struct runner *r)
{
    crashlog_history_free(&r->hist);
    for (int32_t i = 0; i < r->n_slots; i++)
        if (r->slots[i].used) runner_free_slot(r, &r->slots[i]);
    kvb_free(r->slots);
    kvb_free(r->mine);
    sched_free(r->sched);
    admit_ctx_free(&r->admit); /* after the samplers that borrow its JSON-mode table */
    pstore_close(r->ps);       /* writes what is still queued */
    be_free(r->be);
    chat_template_free(&r->tmpl);
    tok_free(r->tok);
    model_free(r->model);
    job_reader_free(r->reader);
    job_idset_free(r->done_keys);
    job_idset_free(r->seen_ids);
    kvb_buf_free(&r->line);
    if (r->in && r->in != stdin) fclose(r->in);
    if (r->out && fclose(r->out) != 0 && !r->write_failed) {
        fprintf(stderr, "kvbatch run: cannot close %s: %s\n", r->o->output_path, strerror(errno));
        r->write_failed = true;
    }
    metrics_close(r->db);
}

/* The clocks, and the test hook KVBATCH_TEST_CRASH=ID:token|step|queue (a
 * request that crashes the process, for the crash journal's tests, or whose
 * queueing fails). */
static void runner_start(struct runner *r, const struct run_opts *o)
{
    memset(r, 0, sizeof *r);
    r->o = o;
    r->t0 = cli_now();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->unix_minus_mono = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - r->t0;
    r->created = (int64_t)time(NULL);
    const char *tc = getenv("KVBATCH_TEST_CRASH");
    const char *colon = tc ? strrchr(tc, ':') : NULL;
    if (colon) {
        r->test_crash = !strcmp(colon + 1, "token")   ? TEST_CRASH_TOKEN
                        : !strcmp(colon + 1, "step")  ? TEST_CRASH_STEP
                        : !strcmp(colon + 1, "queue") ? TEST_CRASH_QUEUE
                                                      : TEST_CRASH_NONE;
        r->test_crash_id = tc;
        r->test_crash_id_len = (size_t)(colon - tc);
    }
}

/* Reads, admits and steps until the job is done, a signal came or something
 * failed; true when that was fatal. */
static bool run_loop(struct runner *r)
{
    bool eof = false, fatal = false;
    while (!fatal && !r->write_failed && !stop_signal) {
        /* Keep the window full: the scheduler can only group by prefix what it
         * has been given. */
        while (!eof && !fatal && !stop_signal && r->n_used < r->n_slots && !r->held && !r->isolating) {
            if (!admit_line(r, &eof)) fatal = true;
        }
        if (sched_idle(r->sched)) {
            if (r->held && !fatal && !stop_signal) {
                if (!run_held(r)) fatal = true;
                continue;
            }
            if (eof || fatal || stop_signal) break;
            continue;
        }
        if (r->test_crash == TEST_CRASH_STEP)
            for (int32_t i = 0; i < r->n_slots; i++)
                if (r->slots[i].used && r->slots[i].n_done == 0 &&
                    test_crash_is(r, &r->slots[i].req, TEST_CRASH_STEP) && r->slots[i].ch[0].n_tokens > 0)
                    raise(SIGSEGV);
        struct kvb_err err = {{0}};
        if (sched_step(r->sched, &err) != KVB_OK) {
            fprintf(stderr, "\nkvbatch run: forward pass failed: %s\n", err.msg);
            fatal = true;
        }
        progress(r, false);
    }
    progress(r, true);
    return fatal;
}

/* The closing lines on stderr: requests and tokens, the cache's traffic, the
 * backend's own summary. */
static void print_summary(const struct runner *r, enum metrics_run_status status, const struct sched_stats *st,
                          const struct pstore_stats *pst)
{
    /* Reuse per request (as the metrics record it); computed counts the
     * work, recomputation after preemption included. */
    fprintf(stderr,
            "kvbatch run: %s: %lld requests (%lld ok, %lld failed, %lld already done), %lld prompt tokens "
            "(%lld reused in-run, %lld from the cache, %lld computed), %lld generated, %.1f s\n",
            metrics_run_status_name(status), (long long)r->tot.requests_total, (long long)r->tot.requests_ok,
            (long long)r->tot.requests_failed, (long long)r->skipped, (long long)r->tot.prompt_tokens,
            (long long)r->tot.cached_tokens_run, (long long)r->tot.cached_tokens_store, (long long)st->prefill_computed,
            (long long)r->tot.completion_tokens, r->tot.wall_seconds);
    if (r->pooled_seqs > 0)
        fprintf(stderr,
                "kvbatch run: pooled: %lld sequences (embeddings, scores), %lld answered by the results cache "
                "(%lld prompt tokens not computed)\n",
                (long long)r->pooled_seqs, (long long)r->result_hits, (long long)r->result_tokens);
    if (r->be->window > 0 && st->seq_kv_peak > 0) { /* sliding-window layers: what a sequence really holds */
        const struct backend *be = r->be;
        const int64_t full = (int64_t)(st->seq_kv_peak_tokens + be->block_size - 1) / be->block_size * be->block_bytes;
        int32_t n_swa = 0;
        for (int32_t l = 0; l < r->model->hp.n_layer; l++) n_swa += r->model->layers[l].swa;
        fprintf(stderr,
                "kvbatch run: KV per sequence: at most %.1f MiB held, at %d tokens (%.1f MiB on every layer): its "
                "%d windowed layers of %d hold a %d-position window and a step, not the whole sequence\n",
                (double)st->seq_kv_peak / (1024.0 * 1024.0), st->seq_kv_peak_tokens, (double)full / (1024.0 * 1024.0),
                n_swa, r->model->hp.n_layer, be->window);
    }
    if (r->ps) {
        fprintf(stderr,
                "kvbatch run: cache: %lld prompt tokens restored in %.3f s (%.0f tok/s), %llu KiB read; "
                "%llu blocks written, %llu KiB (%.2fx compression)%s\n",
                (long long)st->store_tokens, st->store_load_s,
                st->store_load_s > 0 ? (double)st->store_tokens / st->store_load_s : 0.0,
                (unsigned long long)(pst->bytes_read >> 10), (unsigned long long)pst->blocks_written,
                (unsigned long long)(pst->bytes_written >> 10),
                pst->bytes_written ? (double)pst->raw_bytes_written / (double)pst->bytes_written : 0.0,
                pst->writing_disabled ? ", writing turned off" : "");
        if (pst->blocks_dropped > 0 && !pst->writing_disabled)
            fprintf(stderr,
                    "kvbatch run: cache: %llu computed blocks not stored: the writer fell behind (raise "
                    "--cache-buffer) or their chain was cut short\n",
                    (unsigned long long)pst->blocks_dropped);
    }
    if (r->be && r->be->summary) {
        char line[256] = "";
        r->be->summary(r->be, line, sizeof line);
        if (line[0]) fprintf(stderr, "kvbatch run: %s: %s\n", r->be->name, line);
    }
}

/* Records the run's end (totals, status) in the metrics and closes the crash
 * journal; the exit code. */
static int finish_run(struct runner *r, bool fatal)
{
    struct sched_stats st;
    sched_get_stats(r->sched, &st);
    r->tot.prefill_tokens_computed = st.prefill_computed;
    struct pstore_stats pst = {0};
    if (r->ps) {
        pstore_flush(r->ps);
        pstore_get_stats(r->ps, &pst);
        r->tot.store_bytes_read = (int64_t)pst.bytes_read;
        r->tot.store_bytes_written = (int64_t)pst.bytes_written;
    }
    r->tot.wall_seconds = cli_now() - r->t0;
    enum metrics_run_status status = fatal || r->write_failed ? METRICS_RUN_FAILED
                                     : stop_signal            ? METRICS_RUN_INTERRUPTED
                                                              : METRICS_RUN_OK;
    struct kvb_err err = {{0}};
    if (metrics_run_end(r->db, r->run_id, status, &r->tot, &err) != KVB_OK)
        fprintf(stderr, "kvbatch run: warning: metrics: %s\n", err.msg);
    /* a finished job leaves nothing to resume, so no journal either */
    crashlog_close(metrics_run_status_name(status), status == METRICS_RUN_OK);
    if (!r->o->quiet) print_summary(r, status, &st, &pst);
    if (stop_signal) {
        fprintf(stderr,
                "kvbatch run: interrupted by signal %d; %lld requests in flight were dropped; "
                "rerun with --resume to finish\n",
                (int)stop_signal, (long long)r->n_used);
        return 128 + stop_signal;
    }
    return fatal || r->write_failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

int run_job(const struct run_opts *o)
{
    struct runner r;
    runner_start(&r, o);
    stop_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    struct sigaction old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int rc = CLI_EXIT_FAIL;
    if (setup(&r)) rc = finish_run(&r, run_loop(&r));
    crashlog_close("failed", false); /* when setup failed after opening it; else already closed */
    teardown(&r);
    if (r.write_failed && rc == CLI_EXIT_OK) rc = CLI_EXIT_FAIL;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}
