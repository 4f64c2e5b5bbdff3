/* runner_output.c — what the run loop writes for a finished line: its
 * result or error line (jobs/job.h formats them), the metrics row, and the
 * logprobs recorded while it ran (see runner_internal.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "app/cli_util.h"
#include "app/runner_internal.h"
#include "base/alloc.h"
#include "engine/logprobs.h"
#include "model/model.h"

/* ---- output ------------------------------------------------------------------- */

/* False when the line is not on disk (this write or an earlier one failed):
 * then the request is not counted or recorded, since a --resume runs it
 * again. */
bool runner_write_line(struct runner *r)
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

/* The error line for an input line; q (NULL when the line gave none) is
 * where its custom_id comes from. */
void runner_emit_error(struct runner *r, const struct job_request *q, const struct job_error *e, int status)
{
    const char *custom_id = q ? q->custom_id : NULL;
    const size_t id_len = q ? q->custom_id_len : 0;
    struct job_key key;
    job_key_error(custom_id, id_len, e, &key);
    r->lines_done++;
    if (job_idset_contains(r->done_keys, key.hex, JOB_KEY_LEN)) {
        r->skipped++;
        return;
    }
    r->line.len = 0;
    if (job_format_error_json(&r->line, custom_id, id_len, q ? q->custom_id_json : NULL, q ? q->custom_id_json_len : 0,
                              e) != KVB_OK ||
        !runner_write_line(r))
        return;
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
    kvb_buf_free(&c->text);
    kvb_buf_free(&c->arena);
    kvb_free(c->lp);
    kvb_free(c->top);
    kvb_free(c->ps);
    kvb_free(c->pids);
    memset(c, 0, sizeof *c);
}

void runner_free_slot(struct runner *r, struct slot *s)
{
    crashlog_track((int32_t)(s - r->slots), 0, 0);
    if (r->isolating == s) r->isolating = NULL;
    if (r->held == s) r->held = NULL;
    if (s->ch)
        for (int32_t i = 0; i < s->n_choices; i++) free_choice(&s->ch[i]);
    kvb_free(s->ch);
    s->ch = NULL;
    kvb_free(s->vals);
    s->vals = NULL;
    admit_plan_free(&s->plan);
    job_request_free(&s->req);
    s->used = false;
    r->n_used--;
}

/* The metrics row of a request whose result line was written, timed from
 * its choices' views, and the run's totals. */
void runner_result_metrics(struct runner *r, const struct slot *s, int64_t prompt_tokens, int64_t completion,
                           int64_t cached_run, int64_t cached_store)
{
    const struct job_request *q = &s->req;
    const int32_t nc = s->n_choices;
    double first = INFINITY, end = 0, admit = INFINITY;
    int64_t preemptions = 0, restored = 0;
    for (int32_t i = 0; i < nc; i++) {
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
        .prompt_tokens = prompt_tokens,
        .cached_tokens_run = cached_run,
        .cached_tokens_store = cached_store,
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
    r->tot.prompt_tokens += prompt_tokens;
    r->tot.completion_tokens += completion;
    r->tot.cached_tokens_run += cached_run;
    r->tot.cached_tokens_store += cached_store;
    r->lines_done++;
}

void runner_emit_result(struct runner *r, struct slot *s)
{
    const struct job_request *q = &s->req;
    const int32_t nc = s->n_choices;
    /* Each prompt as the line shows it (echo's text, the scores' forms). */
    const int32_t np = s->plan.n_prompts;
    struct prompt_view *views = kvb_calloc((size_t)np, sizeof *views);
    struct kvb_buf *texts = q->echo ? kvb_calloc((size_t)nc, sizeof *texts) : NULL;
    bool oom = !views || (q->echo && !texts);
    for (int32_t k = 0; k < np && !oom; k++) oom = runner_prompt_view(r, q, k, &s->ch[k * q->n], &views[k]) != KVB_OK;
    /* One allocation for the choices and their logprob views. */
    size_t n_lp = 0, n_top = 0;
    for (int32_t i = 0; i < nc && !oom; i++) {
        n_lp += (size_t)s->ch[i].n_lp + (q->echo && q->logprobs ? (size_t)views[i / q->n].n : 0);
        n_top += (size_t)s->ch[i].n_top;
    }
    struct job_choice *jc = kvb_calloc((size_t)nc, sizeof *jc);
    struct job_token_logprob *tl = kvb_calloc(n_lp + 1, sizeof *tl);
    struct job_top_logprob *tt = kvb_calloc(n_top + 1, sizeof *tt);
    oom = oom || !jc || !tl || !tt;
    int64_t completion = 0, prompt_tokens = 0, cached_run = 0, cached_store = 0;
    for (int32_t k = 0; k < s->plan.n_prompts; k++) {
        const struct choice *first = &s->ch[k * q->n]; /* a prompt's reuse is seen by its first choice */
        prompt_tokens += s->plan.prompts[k].n;
        cached_run += first->cached;
        cached_store += first->cached_store;
    }
    size_t at_lp = 0, at_top = 0;
    for (int32_t i = 0; i < nc && !oom; i++) {
        const struct choice *c = &s->ch[i];
        const struct prompt_view *v = &views[i / q->n];
        jc[i] = (struct job_choice){.text = c->text.data ? c->text.data : "",
                                    .text_len = c->text.len,
                                    .finish = c->finish,
                                    .has_logprobs = q->logprobs,
                                    .text_offset0 = q->echo ? 0 : v->text_cp};
        if (q->echo) { /* the prompt, then what was generated */
            struct kvb_buf *t = &texts[i];
            if (kvb_buf_reserve(t, v->text.len + c->text.len + 1) != KVB_OK) {
                oom = true;
                break;
            }
            if (v->text.len) memcpy(t->data, v->text.data, v->text.len);
            if (c->text.len) memcpy(t->data + v->text.len, c->text.data, c->text.len);
            t->len = v->text.len + c->text.len;
            jc[i].text = t->data;
            jc[i].text_len = t->len;
        }
        if (v->plp && q->url != JOB_URL_CHAT) {
            jc[i].prompt_logprobs = v->plp;
            jc[i].n_prompt_logprobs = (size_t)v->n;
        }
        if (!q->logprobs) continue;
        jc[i].logprobs = tl + at_lp;
        if (q->echo && v->echo) {
            memcpy(tl + at_lp, v->echo, sizeof *tl * (size_t)v->n);
            at_lp += (size_t)v->n;
            jc[i].n_logprobs = (size_t)v->n;
        }
        struct job_top_logprob *top = tt + at_top;
        for (int32_t k = 0; k < c->n_top; k++)
            top[k] = (struct job_top_logprob){c->arena.data + c->top[k].off, c->top[k].len, c->top[k].lp};
        for (int32_t k = 0; k < c->n_lp; k++)
            tl[at_lp + (size_t)k] =
                (struct job_token_logprob){c->arena.data + c->lp[k].off, c->lp[k].len,           c->lp[k].lp,
                                           top + c->lp[k].top_start,     (size_t)c->lp[k].n_top, false};
        jc[i].n_logprobs += (size_t)c->n_lp;
        at_lp += (size_t)c->n_lp;
        at_top += (size_t)c->n_top;
    }
    for (int32_t i = 0; i < nc; i++) completion += s->ch[i].n_tokens;
    struct job_result res = {
        .custom_id = q->custom_id,
        .custom_id_len = q->custom_id_len,
        .custom_id_json = q->custom_id_json,
        .custom_id_json_len = q->custom_id_json_len,
        .url = q->url,
        .model = q->model ? q->model : r->model->name,
        .created = r->created,
        .choices = jc,
        .n_choices = (size_t)nc,
        .prompt_tokens = prompt_tokens,
        .completion_tokens = completion,
        .cached_tokens = cached_run + cached_store,
        .prompt_logprobs = q->url == JOB_URL_CHAT && !oom ? views[0].plp : NULL,
        .n_prompt_logprobs = q->url == JOB_URL_CHAT && !oom ? (size_t)views[0].n : 0,
    };
    r->line.len = 0;
    bool written;
    if (!oom && job_format_result(&r->line, &res) == KVB_OK) {
        written = runner_write_line(r);
    } else {
        struct job_error e;
        job_error_setf(&e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory while formatting the result");
        r->line.len = 0;
        written = job_format_error_json(&r->line, q->custom_id, q->custom_id_len, q->custom_id_json,
                                        q->custom_id_json_len, &e) == KVB_OK &&
                  runner_write_line(r);
    }
    kvb_free(jc);
    kvb_free(tl);
    kvb_free(tt);
    for (int32_t k = 0; views && k < np; k++) runner_prompt_view_free(&views[k]);
    kvb_free(views);
    for (int32_t i = 0; texts && i < nc; i++) kvb_buf_free(&texts[i]);
    kvb_free(texts);
    if (!written) {
        r->lines_done++;
        return;
    }
    runner_result_metrics(r, s, prompt_tokens, completion, cached_run, cached_store);
}

enum kvb_status runner_lp_push(struct runner *r, struct choice *c, int32_t token, const float *logits, int k)
{
    const int32_t nv = r->model->hp.n_vocab;
    const double lse = logprobs_lse(logits, nv);
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
    int32_t best[JOB_MAX_TOP_LOGPROBS];
    const int nb = logprobs_top(logits, nv, k, best); /* k = 0: the chosen token alone */
    /* Append all texts to the arena after choosing, since the arena may move. */
    struct kvb_buf *a = &c->arena;
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
