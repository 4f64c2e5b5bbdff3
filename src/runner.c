/* runner.c — the run loop of `kvbatch run` (see runner.h).
 *
 * Requests in flight live in a fixed table of slots (the look-ahead window);
 * each slot holds one input request and its n choices, and each choice is
 * one scheduler sequence (user id = slot * JOB_MAX_N + choice). A slot is
 * written out and freed when its last choice finishes. */
#include "runner.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "backend.h"
#include "backend_select.h"
#include "chat.h"
#include "cli_files.h"
#include "cli_util.h"
#include "job.h"
#include "job_shard.h"
#include "jsonmode.h"
#include "metrics.h"
#include "model.h"
#include "pstore.h"
#include "scheduler.h"
#include "tok.h"

/* The one piece of global state: set by the signal handler, read by the loop. */
static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) { stop_signal = sig; }

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
    struct job_buf text;
    struct tok_stream ts;
    int32_t n_tokens;
    enum job_finish finish;
    bool done;
    bool cut_at_stop; /* text was cut at a stop string: bytes held back are dropped */
    int32_t cached;       /* prompt tokens reused from the in-run prefix tree */
    int32_t cached_store; /* prompt tokens loaded from the persistent store */
    double t_admit, t_first, t_end;
    int32_t preemptions, restored_tokens; /* the scheduler's, at its end */
    /* logprobs, when asked: token texts live in arena */
    struct job_buf arena;
    struct lp_entry *lp;
    int32_t n_lp, cap_lp;
    struct lp_top *top;
    int32_t n_top, cap_top;
};

struct slot {
    bool used;
    struct job_request req;
    int32_t n_prompt;
    int32_t n_done;
    double t_submit;
    struct choice ch[JOB_MAX_N];
};

struct runner {
    const struct run_opts *o;
    struct model *model;
    struct tok *tok;
    struct chat_template tmpl;
    bool have_tmpl;
    char tmpl_error[sizeof(struct kvb_err)];
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
    struct jsonmode_vocab *json_vocab; /* token bytes for JSON mode, built on first use */
    uint64_t plan_hash;          /* with --shard: shard_plan_out.hash, recorded in the run's settings */
    struct metrics_db *db;
    int64_t run_id;
    struct pstore *ps;           /* persistent prefix cache, or NULL */
    struct pstore_model pm;
    struct job_buf line;
    float *scratch;              /* (n_vocab) for logprobs */
    bool write_failed;
    /* progress and totals */
    int64_t total_lines, lines_done, skipped;
    struct metrics_totals tot;
    double t0, last_progress;
    double unix_minus_mono; /* wall clock minus cli_now() at start: the metrics' wall-clock times */
    int32_t n_ctx;
    int32_t max_batch, max_step; /* o's, or the defaults for the backend in use */
    int64_t created;
    bool out_cut;        /* setup's last step cuts the output to out_cut_at bytes */
    uint64_t out_cut_at;
};

/* ---- output ------------------------------------------------------------------- */

/* False when the line is not on disk (this write or an earlier one failed):
 * then the request is not counted or recorded, since a --resume runs it
 * again. */
static bool write_line(struct runner *r)
{
    if (r->write_failed) return false;
    if (fwrite(r->line.data, 1, r->line.len, r->out) != r->line.len || fflush(r->out) != 0) {
        fprintf(stderr, "\nkvbatch run: cannot write %s: %s\n", r->o->output_path, strerror(errno));
        r->write_failed = true;
        return false;
    }
    return true;
}

static void record_metrics(struct runner *r, const struct metrics_request *mr)
{
    if (!r->db) return;
    struct kvb_err err = {{0}};
    if (metrics_request_add(r->db, r->run_id, mr, &err) != KVB_OK)
        fprintf(stderr, "\nkvbatch run: warning: metrics: %s\n", err.msg);
}

static void emit_error(struct runner *r, const char *custom_id, size_t id_len, const struct job_error *e,
                       int status)
{
    struct job_key key;
    job_key_error(custom_id, id_len, e, &key);
    r->lines_done++;
    if (job_idset_contains(r->done_keys, key.hex, JOB_KEY_LEN)) {
        r->skipped++;
        return;
    }
    r->line.len = 0;
    if (job_format_error(&r->line, custom_id, id_len, e) != KVB_OK || !write_line(r)) return;
    r->tot.requests_total++;
    r->tot.requests_failed++;
    struct metrics_request mr = {
        .custom_id = custom_id,
        .input_line = (int64_t)e->line_no,
        .error_code = e->code,
        .error_message = e->message,
        .status_code = status,
        .ended_at = cli_now() + r->unix_minus_mono,
    };
    record_metrics(r, &mr);
}

static void free_choice(struct choice *c)
{
    job_buf_free(&c->text);
    job_buf_free(&c->arena);
    kvb_free(c->lp);
    kvb_free(c->top);
    memset(c, 0, sizeof *c);
}

static void free_slot(struct runner *r, struct slot *s)
{
    for (int i = 0; i < JOB_MAX_N; i++) free_choice(&s->ch[i]);
    job_request_free(&s->req);
    s->used = false;
    r->n_used--;
}

static void emit_result(struct runner *r, struct slot *s)
{
    const struct job_request *q = &s->req;
    struct job_choice jc[JOB_MAX_N];
    struct job_token_logprob *tl[JOB_MAX_N] = {0};
    struct job_top_logprob *tt[JOB_MAX_N] = {0};
    int64_t completion = 0;
    bool oom = false;
    for (int i = 0; i < q->n; i++) {
        struct choice *c = &s->ch[i];
        completion += c->n_tokens;
        jc[i] = (struct job_choice){.text = c->text.data ? c->text.data : "", .text_len = c->text.len,
                                    .finish = c->finish, .has_logprobs = q->logprobs};
        if (!q->logprobs) continue;
        tl[i] = kvb_calloc((size_t)c->n_lp + 1, sizeof *tl[i]);
        tt[i] = kvb_calloc((size_t)c->n_top + 1, sizeof *tt[i]);
        if (!tl[i] || !tt[i]) {
            oom = true;
            continue;
        }
        for (int32_t k = 0; k < c->n_top; k++)
            tt[i][k] = (struct job_top_logprob){c->arena.data + c->top[k].off, c->top[k].len, c->top[k].lp};
        for (int32_t k = 0; k < c->n_lp; k++)
            tl[i][k] = (struct job_token_logprob){c->arena.data + c->lp[k].off, c->lp[k].len, c->lp[k].lp,
                                                  tt[i] + c->lp[k].top_start, (size_t)c->lp[k].n_top};
        jc[i].logprobs = tl[i];
        jc[i].n_logprobs = (size_t)c->n_lp;
    }
    struct job_result res = {
        .custom_id = q->custom_id,
        .custom_id_len = q->custom_id_len,
        .url = q->url,
        .model = q->model ? q->model : r->model->name,
        .created = r->created,
        .choices = jc,
        .n_choices = (size_t)q->n,
        .prompt_tokens = s->n_prompt,
        .completion_tokens = completion,
        .cached_tokens = s->ch[0].cached + s->ch[0].cached_store,
    };
    r->line.len = 0;
    bool written;
    if (!oom && job_format_result(&r->line, &res) == KVB_OK) {
        written = write_line(r);
    } else {
        struct job_error e;
        job_error_setf(&e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory while formatting the result");
        r->line.len = 0;
        written = job_format_error(&r->line, q->custom_id, q->custom_id_len, &e) == KVB_OK && write_line(r);
    }
    for (int i = 0; i < q->n; i++) {
        kvb_free(tl[i]);
        kvb_free(tt[i]);
    }
    if (!written) {
        r->lines_done++;
        return;
    }
    /* Metrics: the request as a whole, timed from its first choice's view. */
    double first = INFINITY, end = 0, admit = INFINITY;
    int64_t preemptions = 0, restored = 0;
    for (int i = 0; i < q->n; i++) {
        if (s->ch[i].t_first > 0 && s->ch[i].t_first < first) first = s->ch[i].t_first;
        if (s->ch[i].t_end > end) end = s->ch[i].t_end;
        if (s->ch[i].t_admit < admit) admit = s->ch[i].t_admit;
        preemptions += s->ch[i].preemptions;
        restored += s->ch[i].restored_tokens;
    }
    const double wall = r->unix_minus_mono;
    struct metrics_request mr = {
        .custom_id = q->custom_id,
        .input_line = (int64_t)q->line_no,
        .prompt_tokens = s->n_prompt,
        .cached_tokens_run = s->ch[0].cached,
        .cached_tokens_store = s->ch[0].cached_store,
        .completion_tokens = completion,
        .has_timing = true,
        .queue_s = admit - s->t_submit,
        .ttft_s = isfinite(first) ? first - s->t_submit : end - s->t_submit,
        .tpot_s = completion >= 2 && isfinite(first) ? (end - first) / (double)(completion - 1) : 0,
        .e2e_s = end - s->t_submit,
        .finish_reason = s->ch[0].finish == JOB_FINISH_LENGTH ? "length" : "stop",
        .status_code = 200,
        .submitted_at = s->t_submit + wall,
        .started_at = admit + wall,
        .first_token_at = isfinite(first) ? first + wall : 0,
        .ended_at = end + wall,
        .preemptions = preemptions,
        .restored_tokens = restored,
    };
    record_metrics(r, &mr);
    r->tot.requests_total++;
    r->tot.requests_ok++;
    r->tot.prompt_tokens += s->n_prompt;
    r->tot.completion_tokens += completion;
    r->tot.cached_tokens_run += s->ch[0].cached;
    r->tot.cached_tokens_store += s->ch[0].cached_store;
    r->lines_done++;
}

/* ---- scheduler callbacks ------------------------------------------------------- */

static enum kvb_status lp_push(struct runner *r, struct choice *c, int32_t token, const float *logits, int k)
{
    const int32_t nv = r->model->hp.n_vocab;
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < nv; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int32_t i = 0; i < nv; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    if (c->n_lp == c->cap_lp) {
        int32_t cap = c->cap_lp ? c->cap_lp * 2 : 32;
        struct lp_entry *ne = kvb_realloc(c->lp, sizeof *ne * (size_t)cap);
        if (!ne) return KVB_ERR_NOMEM;
        c->lp = ne;
        c->cap_lp = cap;
    }
    if (c->n_top + k > c->cap_top) {
        int32_t cap = (c->cap_top ? c->cap_top * 2 : 64) + k;
        struct lp_top *nt = kvb_realloc(c->top, sizeof *nt * (size_t)cap);
        if (!nt) return KVB_ERR_NOMEM;
        c->top = nt;
        c->cap_top = cap;
    }
    char piece[256];
    size_t pl = tok_piece(r->tok, token, true, piece, sizeof piece);
    if (pl > sizeof piece) pl = sizeof piece;
    struct lp_entry *e = &c->lp[c->n_lp];
    e->off = c->arena.len;
    e->len = pl;
    e->lp = (float)((double)logits[token] - lse);
    e->top_start = c->n_top;
    e->n_top = 0;
    /* The k best by logit (ties: lower id), by repeated selection: k <= 20. */
    int32_t best[JOB_MAX_TOP_LOGPROBS];
    int nb = 0;
    for (int32_t i = 0; i < nv; i++) {
        if (nb < k || logits[i] > logits[best[nb - 1]]) {
            int j = nb < k ? nb++ : k - 1;
            while (j > 0 && logits[i] > logits[best[j - 1]]) {
                best[j] = best[j - 1];
                j--;
            }
            best[j] = i;
        }
    }
    /* Append all texts to the arena after choosing, since the arena may move. */
    struct job_buf *a = &c->arena;
    size_t need = a->len + pl + (size_t)nb * sizeof piece;
    if (need > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4096;
        while (cap < need) cap *= 2;
        char *nd = kvb_realloc(a->data, cap);
        if (!nd) return KVB_ERR_NOMEM;
        a->data = nd;
        a->cap = cap;
    }
    memcpy(a->data + a->len, piece, pl);
    a->len += pl;
    for (int j = 0; j < nb; j++) {
        size_t l = tok_piece(r->tok, best[j], true, a->data + a->len, sizeof piece);
        if (l > sizeof piece) l = sizeof piece;
        c->top[c->n_top++] = (struct lp_top){a->len, l, (float)((double)logits[best[j]] - lse)};
        a->len += l;
        e->n_top++;
    }
    c->n_lp++;
    return KVB_OK;
}

static bool cb_token(void *user, const struct sched_seq_info *info, int32_t token)
{
    struct runner *r = user;
    struct slot *s = &r->slots[info->user_id / JOB_MAX_N];
    struct choice *c = &s->ch[info->user_id % JOB_MAX_N];
    const struct job_request *q = &s->req;
    c->n_tokens++;
    if (c->n_tokens == 1) c->t_first = info->t_first_token;
    if (q->logprobs && info->logits && lp_push(r, c, token, info->logits, q->top_logprobs) != KVB_OK)
        fprintf(stderr, "\nkvbatch run: warning: out of memory recording logprobs of '%s'\n", q->custom_id);
    if (tok_is_eog(r->tok, token)) {
        c->finish = JOB_FINISH_STOP;
        return true;
    }
    size_t before = c->text.len;
    if (tok_stream_push(r->tok, &c->ts, token, &c->text.data, &c->text.len, &c->text.cap) != KVB_OK) return false;
    for (int i = 0; i < q->n_stop; i++) {
        size_t sl = q->stop_len[i];
        if (c->text.len < sl) continue;
        size_t from = before + 1 > sl ? before + 1 - sl : 0;
        for (size_t p = from; p + sl <= c->text.len; p++) {
            if (memcmp(c->text.data + p, q->stop[i], sl) == 0) {
                c->text.len = p; /* the stop string is not part of the output, as in OpenAI's API */
                c->finish = JOB_FINISH_STOP;
                c->cut_at_stop = true;
                return true;
            }
        }
    }
    return false;
}

static void cb_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    struct runner *r = user;
    struct slot *s = &r->slots[info->user_id / JOB_MAX_N];
    struct choice *c = &s->ch[info->user_id % JOB_MAX_N];
    c->done = true;
    c->cached = info->cached_tokens;
    c->cached_store = info->store_tokens;
    c->t_admit = info->t_admit;
    c->t_end = info->t_end;
    c->preemptions = info->preemptions;
    c->restored_tokens = info->restored_tokens;
    if (why == SCHED_FINISH_LENGTH) c->finish = JOB_FINISH_LENGTH;
    if (!c->cut_at_stop) tok_stream_flush(r->tok, &c->ts, &c->text.data, &c->text.len, &c->text.cap);
    if (++s->n_done < s->req.n) return;
    if (why == SCHED_FINISH_ERROR) {
        struct job_error e;
        job_error_setf(&e, JOB_ERR_SERVER, s->req.line_no, NULL, "the request could not be scheduled");
        emit_error(r, s->req.custom_id, s->req.custom_id_len, &e, 500);
    } else {
        emit_result(r, s);
    }
    free_slot(r, s);
}

/* ---- admission of input lines --------------------------------------------------- */

/* The prompt's tokens, or false with e filled. At most max_ids of them:
 * more is found without tokenizing all of a long prompt (tok.h), and the
 * shard plan, which must not depend on --ctx, passes its own bound. A
 * signal stops a long tokenization (the caller sees stop_signal). */
static bool tokenize_prompt(struct runner *r, const struct job_request *q, size_t max_ids, int32_t **ids,
                            size_t *n, struct job_error *e)
{
    struct kvb_err err = {{0}};
    unsigned flags = tok_wants_bos(r->tok) ? TOK_ADD_BOS : 0;
    const struct tok_limits lim = {.max_ids = max_ids, .cancel = &stop_signal};
    enum kvb_status st;
    if (q->url == JOB_URL_CHAT) {
        if (!r->have_tmpl) {
            job_error_setf(e, JOB_ERR_INVALID_REQUEST, q->line_no, "messages", "%s", r->tmpl_error);
            return false;
        }
        struct chat_msg *msgs = kvb_calloc(q->n_messages, sizeof *msgs);
        if (!msgs) goto oom;
        for (size_t i = 0; i < q->n_messages; i++) {
            enum job_role role = q->messages[i].role == JOB_ROLE_DEVELOPER ? JOB_ROLE_SYSTEM : q->messages[i].role;
            msgs[i] = (struct chat_msg){job_role_name(role), q->messages[i].content};
        }
        char *text = NULL;
        st = chat_apply(&r->tmpl, msgs, q->n_messages, true, &text, &err);
        kvb_free(msgs);
        if (st == KVB_ERR_NOMEM) goto oom;
        if (st != KVB_OK) {
            job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, "messages", "%s", err.msg);
            return false;
        }
        st = tok_encode_with(r->tok, text, strlen(text), flags | TOK_PARSE_SPECIAL, &lim, ids, n, &err);
        kvb_free(text);
    } else {
        st = tok_encode_with(r->tok, q->prompt, q->prompt_len, flags, &lim, ids, n, &err);
    }
    if (st == KVB_ERR_NOMEM) goto oom;
    if (st == KVB_ERR_RANGE) {
        job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, q->url == JOB_URL_CHAT ? "messages" : "prompt",
                       "%s; the context holds %d (prompt plus at least one generated token)", err.msg, r->n_ctx);
        return false;
    }
    if (st != KVB_OK) {
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, q->url == JOB_URL_CHAT ? "messages" : "prompt", "%s",
                       err.msg);
        return false;
    }
    if (*n == 0) {
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, "prompt", "the prompt is empty");
        kvb_free(*ids);
        return false;
    }
    return true;
oom:
    job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
    return false;
}

static bool tokenize_request(struct runner *r, const struct job_request *q, int32_t **ids, size_t *n,
                             struct job_error *e)
{
    if (!tokenize_prompt(r, q, (size_t)r->n_ctx - 1, ids, n, e)) return false;
    if ((int64_t)*n >= r->n_ctx) {
        job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, q->url == JOB_URL_CHAT ? "messages" : "prompt",
                       "the prompt has %zu tokens; the context holds %d (prompt plus at least one generated token)",
                       *n, r->n_ctx);
        kvb_free(*ids);
        return false;
    }
    return true;
}

static bool prompt_of(void *user, const struct job_request *q, int32_t **ids, size_t *n)
{
    /* No prompt longer than the model's context is worth grouping: one
     * that runs at all (--ctx past it) is planned as a line by number. */
    const struct runner *r = user;
    const size_t max_ids = r->model->hp.n_ctx_train > 0 ? (size_t)r->model->hp.n_ctx_train : (size_t)1 << 20;
    struct job_error e;
    return tokenize_prompt(user, q, max_ids, ids, n, &e);
}

/* --shard: which lines are this shard's (job_shard.h). The plan reads the
 * whole input through r->in, which is then rewound for the run: one open
 * file, so both read the same bytes, and it must be a regular file. */
static bool plan_shard(struct runner *r)
{
    const struct run_opts *o = r->o;
    struct stat sb;
    if (fstat(fileno(r->in), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "kvbatch run: --shard needs the job as a regular file (every shard reads all of it "
                "to plan, then again to run); %s is %s\n", o->input_path,
                r->in == stdin ? "standard input" : "a pipe or device");
        return false;
    }
    const long start = ftell(r->in);
    const double t0 = cli_now();
    struct kvb_err err = {{0}};
    struct shard_plan_out plan;
    enum kvb_status st = shard_plan(r->in, o->shard_index, o->shard_count, r->model->hp.n_ctx_train, prompt_of, r,
                                    &plan, &err);
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
        fprintf(stderr, "kvbatch run: shard %d of %d (0-based): %lld of %lld lines, grouped by shared prompt prefix "
                "(planned in %.1f s)\n", o->shard_index, o->shard_count, (long long)n_mine,
                (long long)r->n_plan_lines, cli_now() - t0);
    return true;
}

static struct slot *free_slot_ptr(struct runner *r)
{
    for (int32_t i = 0; i < r->n_slots; i++)
        if (!r->slots[i].used) return &r->slots[i];
    return NULL;
}

/* An admitted line that cannot run: its error line (400, or 500 for the
 * server's own failures), and its request and tokens freed. True: the job
 * goes on. */
static bool refuse(struct runner *r, struct job_request *q, int32_t *ids, const struct job_error *e)
{
    emit_error(r, q->custom_id, q->custom_id_len, e, strcmp(e->code, JOB_ERR_SERVER) ? 400 : 500);
    kvb_free(ids);
    job_request_free(q);
    return true;
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
    struct job_error e;
    struct slot *s = free_slot_ptr(r);
    if (ln.too_long) {
        job_error_setf(&e, JOB_ERR_INVALID_REQUEST, ln.line_no, NULL, "the line is %llu bytes, longer than the limit",
                       (unsigned long long)ln.full_len);
        emit_error(r, NULL, 0, &e, 400);
        return true;
    }
    struct job_request *q = &s->req;
    enum kvb_status st = job_parse_line(ln.data, ln.len, ln.line_no, q, &e);
    if (st != KVB_OK) {
        emit_error(r, q->custom_id, q->custom_id_len, &e, st == KVB_ERR_NOMEM ? 500 : 400);
        job_request_free(q);
        return true;
    }
    bool added = false;
    if (job_idset_add(r->seen_ids, q->custom_id, q->custom_id_len, &added) != KVB_OK) {
        job_error_setf(&e, JOB_ERR_SERVER, ln.line_no, "custom_id", "out of memory");
        emit_error(r, q->custom_id, q->custom_id_len, &e, 500);
        job_request_free(q);
        return true;
    }
    if (!added) {
        job_error_setf(&e, JOB_ERR_DUPLICATE_CUSTOM_ID, ln.line_no, "custom_id",
                       "custom_id '%.200s' was already used by an earlier line (the first one is run)", q->custom_id);
        emit_error(r, q->custom_id, q->custom_id_len, &e, 400);
        job_request_free(q);
        return true;
    }
    struct job_key key;
    job_key_custom_id(q->custom_id, q->custom_id_len, &key);
    if (job_idset_contains(r->done_keys, key.hex, JOB_KEY_LEN)) {
        r->skipped++;
        r->lines_done++;
        job_request_free(q);
        return true;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (!tokenize_request(r, q, &ids, &n, &e)) {
        if (stop_signal) { /* cut short: no error line, so that --resume runs it */
            job_request_free(q);
            return true;
        }
        return refuse(r, q, NULL, &e);
    }
    const int32_t n_vocab = r->model->hp.n_vocab;
    for (int32_t k = 0; k < q->n_logit_bias; k++) {
        if (q->logit_bias[k].token < n_vocab) continue;
        job_error_setf(&e, JOB_ERR_INVALID_VALUE, ln.line_no, "logit_bias",
                       "logit_bias token %d is not in the vocabulary (%d tokens)", q->logit_bias[k].token, n_vocab);
        return refuse(r, q, ids, &e);
    }
    if (q->json_object && !r->json_vocab) { /* built for the first request that asks */
        struct kvb_err jerr = {{0}};
        enum kvb_status jst = jsonmode_vocab_create(r->tok, &r->json_vocab, &jerr);
        if (jst != KVB_OK) {
            job_error_setf(&e, jst == KVB_ERR_NOMEM ? JOB_ERR_SERVER : JOB_ERR_INVALID_VALUE, ln.line_no,
                           "response_format", "JSON mode: %s", jerr.msg);
            return refuse(r, q, ids, &e);
        }
    }
    struct sampler_bias *bias = q->n_logit_bias ? kvb_malloc(sizeof *bias * (size_t)q->n_logit_bias) : NULL;
    if (q->n_logit_bias && !bias) {
        job_error_setf(&e, JOB_ERR_SERVER, ln.line_no, NULL, "out of memory");
        return refuse(r, q, ids, &e);
    }
    for (int32_t k = 0; k < q->n_logit_bias; k++)
        bias[k] = (struct sampler_bias){q->logit_bias[k].token, q->logit_bias[k].value};
    s->used = true;
    r->n_used++;
    s->n_prompt = (int32_t)n;
    s->n_done = 0;
    s->t_submit = cli_now();
    for (int i = 0; i < q->n; i++) {
        tok_stream_init(&s->ch[i].ts, r->tok);
        struct sampler_params sp;
        sampler_params_default(&sp);
        sp.temperature = q->temperature;
        sp.top_k = q->top_k;
        sp.top_p = q->top_p;
        sp.min_p = q->min_p < 0.999999f ? q->min_p : 0.999999f; /* min_p = 1 means "top token only" */
        sp.repetition_penalty = q->repetition_penalty;
        sp.presence_penalty = q->presence_penalty;
        sp.frequency_penalty = q->frequency_penalty;
        sp.json = q->json_object ? r->json_vocab : NULL;
        sp.json_schema = q->json_schema;
        sp.bias = bias;
        sp.n_bias = bias ? q->n_logit_bias : 0;
        /* Choice i of n draws from seed + i, so n > 1 gives n different samples
         * and choice 0 equals the n = 1 result. */
        sp.seed = q->seed + (uint64_t)i;
        uint64_t uid = (uint64_t)(s - r->slots) * JOB_MAX_N + (uint64_t)i;
        if (sched_submit(r->sched, uid, ids, (int32_t)n, q->max_tokens, &sp, q->logprobs, &err) != KVB_OK) {
            /* Only out of memory can get here (the context was checked). */
            fprintf(stderr, "\nkvbatch run: cannot queue '%s': %s\n", q->custom_id, err.msg);
            kvb_free(ids);
            kvb_free(bias);
            return false;
        }
    }
    kvb_free(ids);
    kvb_free(bias); /* each sampler keeps a copy */
    return true;
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
    double reuse = st.prompt_tokens ? 100.0 * (double)(st.cached_tokens + st.store_tokens) / (double)st.prompt_tokens : 0;
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
    struct pstore_opts po = {.max_size = o->cache_max_size, .zstd_level = o->cache_level, .lossy8 = o->cache_lossy8,
                             .n_threads = o->n_threads, .quiet = o->quiet, .queue_bytes = o->cache_buffer};
    struct kvb_err err = {{0}};
    if (pstore_open(dir, &po, &r->ps, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: warning: persistent cache off: %s\n", err.msg);
        r->ps = NULL;
        return;
    }
    const struct model_hparams *hp = &r->model->hp;
    memcpy(r->pm.fingerprint, r->model->fingerprint, sizeof r->pm.fingerprint);
    r->pm.name = r->model->name;
    r->pm.dtype = PSTORE_DTYPE_F16;
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
     * chat lines then fail one by one with this message. */
    enum kvb_status st;
    if (o->chat_template) {
        st = chat_template_from_name(o->chat_template, &r->tmpl, &err);
        if (st != KVB_OK) {
            fprintf(stderr, "kvbatch run: --chat-template: %s\n", err.msg);
            return false;
        }
    } else {
        struct gguf_str src;
        st = gguf_get_str(r->model->gguf, "tokenizer.chat_template", &src, &err);
        if (st == KVB_OK) st = chat_template_detect(src.ptr, (size_t)src.len, &r->tmpl, &err);
        else snprintf(err.msg, sizeof err.msg, "the model has no chat template (run with --chat-template NAME)");
    }
    r->have_tmpl = st == KVB_OK;
    if (!r->have_tmpl) snprintf(r->tmpl_error, sizeof r->tmpl_error, "%s", err.msg);

    r->n_ctx = o->n_ctx > 0 ? o->n_ctx : (r->model->hp.n_ctx_train < 4096 ? r->model->hp.n_ctx_train : 4096);
    if (o->shard_count > 1 && !plan_shard(r)) return false;
    struct be_select_opts bo = {.device = o->device, .n_threads = o->n_threads, .block_size = o->block_size,
                                .kv_mem = o->kv_mem, .n_ctx = r->n_ctx, .scalar = o->scalar,
                                .deterministic = o->deterministic, .cuda_graphs = o->cuda_graphs};
    if (be_select_create(r->model, &bo, &r->be, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot start the backend: %s\n", err.msg);
        return false;
    }
    /* A GPU wants many sequences and large steps to be busy; a CPU gains
     * little beyond these and holds more logits rows for nothing. */
    const bool gpu = strcmp(r->be->name, "cpu") != 0;
    r->max_batch = o->max_batch > 0 ? o->max_batch : gpu ? 256 : 128;
    r->max_step = o->max_step_tokens > 0 ? o->max_step_tokens : gpu ? 4096 : 512;
    struct sched_opts so = {.max_batch = r->max_batch, .max_step_tokens = r->max_step, .n_ctx = r->n_ctx};
    struct sched_callbacks cb = {.user = r, .on_token = cb_token, .on_finish = cb_finish};
    if (sched_create(r->be, r->model->hp.n_vocab, &so, &cb, &r->sched, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: %s\n", err.msg);
        return false;
    }
    if (!o->no_cache) open_store(r);
    r->n_slots = o->lookahead > 0 ? o->lookahead : (r->max_batch * 4 > 256 ? r->max_batch * 4 : 256);
    r->slots = kvb_calloc((size_t)r->n_slots, sizeof *r->slots);
    if (!r->slots) {
        fprintf(stderr, "kvbatch run: out of memory\n");
        return false;
    }
    if (!open_output(r)) return false;

    char mpath[4096];
    if (o->metrics_path) snprintf(mpath, sizeof mpath, "%s", o->metrics_path);
    else if (metrics_default_path(o->output_path, mpath, sizeof mpath) != KVB_OK) snprintf(mpath, sizeof mpath, "kvbatch.db");
    if (metrics_open(mpath, &r->db, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot open the metrics database: %s\n", err.msg);
        return false;
    }
    char settings[512];
    snprintf(settings, sizeof settings,
             "{\"threads\":%d,\"max_batch\":%d,\"max_step_tokens\":%d,\"kv_mem\":%llu,\"block_size\":%d,"
             "\"ctx\":%d,\"lookahead\":%d,\"resume\":%s,\"kernels\":\"%s\",\"shard\":\"%d/%d\","
             "\"shard_plan\":\"%016llx\"}",
             be_threads(r->be), r->max_batch, r->max_step,
             (unsigned long long)((uint64_t)r->be->n_blocks * (uint64_t)r->be->block_bytes), o->block_size,
             r->n_ctx, r->n_slots, o->resume ? "true" : "false", be_kernels_name(r->be), o->shard_index,
             o->shard_count > 1 ? o->shard_count : 1, (unsigned long long)r->plan_hash);
    struct metrics_run_info ri = {.job_file = o->input_path, .output_file = o->output_path,
                                  .model = o->model_path, .model_fingerprint = r->model->fingerprint,
                                  .backend = r->be->name, .settings = settings};
    if (metrics_run_begin(r->db, &ri, &r->run_id, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: cannot record the run: %s\n", err.msg);
        return false;
    }
    if (!cut_output(r)) {
        metrics_run_end(r->db, r->run_id, METRICS_RUN_FAILED, &r->tot, NULL);
        return false;
    }
    if (!o->quiet)
        fprintf(stderr, "kvbatch run: %s on %s (%s kernels, %d threads), %d KV blocks of %d tokens, batch %d, run %lld\n",
                r->model->name, r->be->name, be_kernels_name(r->be), be_threads(r->be), r->be->n_blocks,
                o->block_size, r->max_batch, (long long)r->run_id);
    return true;
}

static void teardown(struct runner *r)
{
    for (int32_t i = 0; i < r->n_slots; i++)
        if (r->slots[i].used) free_slot(r, &r->slots[i]);
    kvb_free(r->slots);
    kvb_free(r->mine);
    sched_free(r->sched);
    jsonmode_vocab_free(r->json_vocab); /* after the samplers that borrow it */
    pstore_close(r->ps); /* writes what is still queued */
    be_free(r->be);
    chat_template_free(&r->tmpl);
    tok_free(r->tok);
    model_free(r->model);
    job_reader_free(r->reader);
    job_idset_free(r->done_keys);
    job_idset_free(r->seen_ids);
    job_buf_free(&r->line);
    if (r->in && r->in != stdin) fclose(r->in);
    if (r->out && fclose(r->out) != 0 && !r->write_failed) {
        fprintf(stderr, "kvbatch run: cannot close %s: %s\n", r->o->output_path, strerror(errno));
        r->write_failed = true;
    }
    metrics_close(r->db);
}

int run_job(const struct run_opts *o)
{
    struct runner r;
    memset(&r, 0, sizeof r);
    r.o = o;
    r.t0 = cli_now();
    {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r.unix_minus_mono = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - r.t0;
    }
    r.created = (int64_t)time(NULL);
    stop_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    struct sigaction old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int rc = CLI_EXIT_FAIL;
    bool eof = false, fatal = false;
    if (!setup(&r)) goto out;
    while (!fatal && !r.write_failed && !stop_signal) {
        /* Keep the window full: the scheduler can only group by prefix what it
         * has been given. */
        while (!eof && !fatal && !stop_signal && r.n_used < r.n_slots) {
            if (!admit_line(&r, &eof)) fatal = true;
        }
        if (sched_idle(r.sched)) {
            if (eof) break;
            continue;
        }
        struct kvb_err err = {{0}};
        if (sched_step(r.sched, &err) != KVB_OK) {
            fprintf(stderr, "\nkvbatch run: forward pass failed: %s\n", err.msg);
            fatal = true;
        }
        progress(&r, false);
    }
    progress(&r, true);
    struct sched_stats st;
    sched_get_stats(r.sched, &st);
    r.tot.prefill_tokens_computed = st.prefill_computed;
    struct pstore_stats pst = {0};
    if (r.ps) {
        pstore_flush(r.ps);
        pstore_get_stats(r.ps, &pst);
        r.tot.store_bytes_read = (int64_t)pst.bytes_read;
        r.tot.store_bytes_written = (int64_t)pst.bytes_written;
    }
    r.tot.wall_seconds = cli_now() - r.t0;
    enum metrics_run_status status = fatal || r.write_failed ? METRICS_RUN_FAILED
                                     : stop_signal            ? METRICS_RUN_INTERRUPTED
                                                              : METRICS_RUN_OK;
    struct kvb_err err = {{0}};
    if (metrics_run_end(r.db, r.run_id, status, &r.tot, &err) != KVB_OK)
        fprintf(stderr, "kvbatch run: warning: metrics: %s\n", err.msg);
    if (!o->quiet) {
        /* Reuse per request (as the metrics record it); computed counts the
         * work, recomputation after preemption included. */
        fprintf(stderr,
                "kvbatch run: %s: %lld requests (%lld ok, %lld failed, %lld already done), %lld prompt tokens "
                "(%lld reused in-run, %lld from the cache, %lld computed), %lld generated, %.1f s\n",
                metrics_run_status_name(status), (long long)r.tot.requests_total, (long long)r.tot.requests_ok,
                (long long)r.tot.requests_failed, (long long)r.skipped, (long long)r.tot.prompt_tokens,
                (long long)r.tot.cached_tokens_run, (long long)r.tot.cached_tokens_store, (long long)st.prefill_computed,
                (long long)r.tot.completion_tokens,
                r.tot.wall_seconds);
    }
    if (!o->quiet && r.ps) {
        fprintf(stderr,
                "kvbatch run: cache: %lld prompt tokens restored in %.3f s (%.0f tok/s), %llu KiB read; "
                "%llu blocks written, %llu KiB (%.2fx compression)%s\n",
                (long long)st.store_tokens, st.store_load_s,
                st.store_load_s > 0 ? (double)st.store_tokens / st.store_load_s : 0.0,
                (unsigned long long)(pst.bytes_read >> 10), (unsigned long long)pst.blocks_written,
                (unsigned long long)(pst.bytes_written >> 10),
                pst.bytes_written ? (double)pst.raw_bytes_written / (double)pst.bytes_written : 0.0,
                pst.writing_disabled ? ", writing turned off" : "");
        if (pst.blocks_dropped > 0 && !pst.writing_disabled)
            fprintf(stderr,
                    "kvbatch run: cache: %llu computed blocks not stored: the writer fell behind (raise "
                    "--cache-buffer) or their chain was cut short\n",
                    (unsigned long long)pst.blocks_dropped);
    }
    if (!o->quiet && r.be && r.be->summary) {
        char line[256] = "";
        r.be->summary(r.be, line, sizeof line);
        if (line[0]) fprintf(stderr, "kvbatch run: %s: %s\n", r.be->name, line);
    }
    if (stop_signal) {
        fprintf(stderr, "kvbatch run: interrupted by signal %d; %lld requests in flight were dropped; "
                        "rerun with --resume to finish\n", (int)stop_signal, (long long)r.n_used);
        rc = 128 + stop_signal;
    } else {
        rc = fatal || r.write_failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    }
out:
    teardown(&r);
    if (r.write_failed && rc == CLI_EXIT_OK) rc = CLI_EXIT_FAIL;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}
