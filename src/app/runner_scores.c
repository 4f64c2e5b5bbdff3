/* runner_scores.c — a prompt's scores (sched_seq_info.prompt_scores, kept by
 * the prompt's first choice) as the job format writes them: the echoed
 * prompt's tokens before the generated ones in a completion's logprobs, and
 * vLLM's prompt_logprobs; and the prompt as text, which echo puts before
 * the output and from which OpenAI counts text offsets. */
#include <string.h>

#include "app/runner_internal.h"
#include "base/alloc.h"
#include "base/unicode.h"

#define PIECE_MAX 256 /* bytes of one token's text kept, as for generated tokens' logprobs */

static size_t piece_len(const struct runner *r, int32_t id)
{
    size_t n = tok_piece(r->tok, id, true, NULL, 0);
    return n < PIECE_MAX ? n : PIECE_MAX;
}

/* Appends token id's text to the arena (sized beforehand); its place. */
static const char *piece(const struct runner *r, struct kvb_buf *a, int32_t id, size_t *len)
{
    char *at = a->data + a->len;
    *len = piece_len(r, id);
    tok_piece(r->tok, id, true, at, *len);
    a->len += *len;
    return at;
}

/* The prompt's text: as given, or its token ids decoded with control
 * tokens shown (as `kvbatch render` shows them). */
static enum kvb_status prompt_text(const struct runner *r, const struct job_prompt *p, struct prompt_view *v)
{
    v->text.len = 0;
    if (p->text) {
        if (kvb_buf_reserve(&v->text, p->text_len + 1) != KVB_OK) return KVB_ERR_NOMEM;
        memcpy(v->text.data, p->text, p->text_len);
        v->text.len = p->text_len;
        return KVB_OK;
    }
    struct tok_stream ts;
    tok_stream_init(&ts, r->tok);
    for (int32_t k = 0; k < p->n_ids; k++)
        KVB_FORWARD_IF_ERROR(
            tok_stream_push_special(r->tok, &ts, p->ids[k], &v->text.data, &v->text.len, &v->text.cap));
    return tok_stream_flush(r->tok, &ts, &v->text.data, &v->text.len, &v->text.cap);
}

enum kvb_status runner_prompt_view(struct runner *r, const struct job_request *q, int32_t k, const struct choice *c,
                                   struct prompt_view *v)
{
    memset(v, 0, sizeof *v);
    if (q->url != JOB_URL_CHAT && (q->echo || q->logprobs) && prompt_text(r, &q->prompts[k], v) != KVB_OK) goto oom;
    v->text_cp = (int64_t)unicode_code_points(v->text.data, v->text.len);
    if (!c->ps) return KVB_OK; /* the text is all that was asked */
    const int32_t n = c->n_ps, ke = q->echo && q->logprobs ? q->top_logprobs : -1, kp = q->prompt_logprobs;
    v->n = n;
    /* the arena's size first, so that pointers into it stay put */
    size_t bytes = 1;
    for (int32_t t = 0; t < n; t++) {
        const size_t own = piece_len(r, c->pids[t]);
        if (ke >= 0) bytes += own;
        if (kp >= 0 && t > 0) bytes += own;
        for (int a = 0; t > 0 && a < PSCORE_TOPK; a++) {
            if (c->ps[t].top_id[a] < 0) break;
            const size_t l = piece_len(r, c->ps[t].top_id[a]);
            bytes += (a < ke ? l : 0) + (a < kp ? l : 0);
        }
    }
    if (kvb_buf_reserve(&v->arena, bytes) != KVB_OK) goto oom;
    if (ke >= 0) {
        v->echo = kvb_calloc((size_t)n, sizeof *v->echo);
        v->echo_top = kvb_calloc((size_t)n * (size_t)(ke ? ke : 1), sizeof *v->echo_top);
        if (!v->echo || !v->echo_top) goto oom;
        for (int32_t t = 0; t < n; t++) {
            struct job_token_logprob *e = &v->echo[t];
            e->token = piece(r, &v->arena, c->pids[t], &e->token_len);
            e->none = t == 0;
            if (t == 0) continue;
            e->logprob = c->ps[t].logprob;
            struct job_top_logprob *tops = v->echo_top + (size_t)t * (size_t)(ke ? ke : 1);
            for (int a = 0; a < ke && c->ps[t].top_id[a] >= 0; a++) {
                tops[a].token = piece(r, &v->arena, c->ps[t].top_id[a], &tops[a].token_len);
                tops[a].logprob = c->ps[t].top_lp[a];
                e->n_top++;
            }
            e->top = tops;
        }
    }
    if (kp >= 0) {
        v->plp = kvb_calloc((size_t)n, sizeof *v->plp);
        v->plp_e = kvb_calloc((size_t)n * (size_t)(kp + 1), sizeof *v->plp_e);
        if (!v->plp || !v->plp_e) goto oom;
        for (int32_t t = 1; t < n; t++) {
            struct job_rank_logprob *e = v->plp_e + (size_t)t * (size_t)(kp + 1);
            const struct pscore *ps = &c->ps[t];
            size_t m = 0;
            e[m].id = c->pids[t];
            e[m].logprob = ps->logprob;
            e[m].rank = ps->rank;
            e[m].token = piece(r, &v->arena, c->pids[t], &e[m].token_len);
            m++;
            for (int a = 0; a < kp && ps->top_id[a] >= 0; a++) {
                if (ps->top_id[a] == c->pids[t]) continue; /* listed first already */
                e[m].id = ps->top_id[a];
                e[m].logprob = ps->top_lp[a];
                e[m].rank = a + 1;
                e[m].token = piece(r, &v->arena, ps->top_id[a], &e[m].token_len);
                m++;
            }
            v->plp[t] = (struct job_prompt_logprob){e, m};
        }
    }
    return KVB_OK;
oom:
    runner_prompt_view_free(v);
    return KVB_ERR_NOMEM;
}

void runner_prompt_view_free(struct prompt_view *v)
{
    kvb_buf_free(&v->text);
    kvb_buf_free(&v->arena);
    kvb_free(v->echo);
    kvb_free(v->echo_top);
    kvb_free(v->plp);
    kvb_free(v->plp_e);
    memset(v, 0, sizeof *v);
}

enum kvb_status runner_keep_scores(struct choice *c, const struct sched_seq_info *info)
{
    if (!info->prompt_scores || c->ps) return KVB_OK;
    const size_t n = (size_t)info->n_prompt;
    c->ps = kvb_malloc(sizeof *c->ps * n);
    c->pids = kvb_malloc(sizeof *c->pids * n);
    if (!c->ps || !c->pids) {
        kvb_free(c->ps);
        kvb_free(c->pids);
        c->ps = NULL;
        c->pids = NULL;
        return KVB_ERR_NOMEM;
    }
    memcpy(c->ps, info->prompt_scores, sizeof *c->ps * n);
    memcpy(c->pids, info->tokens, sizeof *c->pids * n);
    c->n_ps = info->n_prompt;
    return KVB_OK;
}
