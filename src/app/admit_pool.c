/* admit_pool.c — a pooled line (embeddings, score, rerank) made ready to
 * run: its sequences' token ids and the checks that need the model (see
 * admit.h, admit_prepare_pooled). */
#include <stdio.h>
#include <string.h>

#include "app/admit.h"
#include "base/alloc.h"
#include "text/tok.h"

/* The path of field `name` (item k of a list of n, or the field itself). */
static void item_param(const struct job_request *q, const char *name, int32_t k, int32_t n, char *out, size_t cap)
{
    const char *pre = q->shorthand ? "" : "body.";
    if (n > 1) snprintf(out, cap, "%s%s[%d]", pre, name, k);
    else snprintf(out, cap, "%s%s", pre, name);
}

static enum kvb_status fail(struct job_error *e, const struct job_request *q, const char *code, const char *param,
                            const char *msg)
{
    job_error_setf(e, code, q->line_no, param, "%s", msg);
    return KVB_ERR_FORMAT;
}

/* Token ids of text (flags for tok_encode), at most the context. */
static enum kvb_status text_ids(const struct admit_ctx *ctx, const struct job_request *q, const char *text, size_t len,
                                unsigned flags, const char *param, struct admit_prompt *out, struct job_error *e)
{
    const size_t max_ids = ctx->n_ctx > 0 ? (size_t)ctx->n_ctx : 0;
    const struct tok_limits lim = {.max_ids = max_ids, .cancel = ctx->cancel};
    struct kvb_err err = {{0}};
    int32_t *ids = NULL;
    size_t n = 0;
    enum kvb_status st = tok_encode_with(ctx->tok, text, len, flags, &lim, &ids, &n, &err);
    if (st == KVB_ERR_NOMEM) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
        return st;
    }
    if (st == KVB_ERR_CANCELLED) return st;
    if (st == KVB_ERR_RANGE) {
        job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, param, "%s; the context holds %zu", err.msg, max_ids);
        return KVB_ERR_FORMAT;
    }
    if (st != KVB_OK) return fail(e, q, JOB_ERR_INVALID_VALUE, param, err.msg);
    if (n == 0) {
        kvb_free(ids);
        return fail(e, q, JOB_ERR_INVALID_VALUE, param, "the text gives no tokens");
    }
    *out = (struct admit_prompt){ids, (int32_t)n};
    return KVB_OK;
}

/* Input k of an embeddings line: its text tokenized, or its ids as given. */
static enum kvb_status input_ids(const struct admit_ctx *ctx, const struct job_request *q, const struct job_prompt *p,
                                 const char *name, int32_t k, int32_t n_items, unsigned flags, struct admit_prompt *out,
                                 struct job_error *e)
{
    char param[64];
    item_param(q, name, k, n_items, param, sizeof param);
    if (p->text) return text_ids(ctx, q, p->text, p->text_len, flags, param, out, e);
    for (int32_t i = 0; i < p->n_ids; i++)
        if (p->ids[i] >= ctx->n_vocab) {
            job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                           "token id %d is not in the vocabulary (%d tokens)", p->ids[i], ctx->n_vocab);
            return KVB_ERR_FORMAT;
        }
    if (ctx->n_ctx > 0 && p->n_ids > ctx->n_ctx) {
        job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, param, "the input has %d tokens; the context holds %d",
                       p->n_ids, ctx->n_ctx);
        return KVB_ERR_FORMAT;
    }
    int32_t *ids = kvb_malloc(sizeof *ids * (size_t)p->n_ids);
    if (!ids) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
        return KVB_ERR_NOMEM;
    }
    memcpy(ids, p->ids, sizeof *ids * (size_t)p->n_ids);
    *out = (struct admit_prompt){ids, p->n_ids};
    return KVB_OK;
}

/* An encoder's pair, as a BERT tokenizer encodes one: a's ids with BOS and
 * EOS ([CLS] a [SEP]), then b's with EOS (b [SEP]). */
static enum kvb_status encoder_pair(const struct admit_ctx *ctx, const struct job_request *q,
                                    const struct job_prompt *a, const struct job_prompt *b, unsigned flags,
                                    const char *param, struct admit_prompt *out, struct job_error *e)
{
    struct admit_prompt pa, pb;
    KVB_FORWARD_IF_ERROR(text_ids(ctx, q, a->text, a->text_len, flags, param, &pa, e));
    enum kvb_status st = text_ids(ctx, q, b->text, b->text_len, flags & ~(unsigned)TOK_ADD_BOS, param, &pb, e);
    if (st != KVB_OK) {
        kvb_free(pa.ids);
        return st;
    }
    if (ctx->n_ctx > 0 && pa.n + pb.n > ctx->n_ctx) {
        job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, param, "the pair has %d tokens; the context holds %d",
                       pa.n + pb.n, ctx->n_ctx);
        st = KVB_ERR_FORMAT;
    }
    int32_t *ids = st == KVB_OK ? kvb_malloc(sizeof *ids * (size_t)(pa.n + pb.n)) : NULL;
    if (st == KVB_OK && !ids) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
        st = KVB_ERR_NOMEM;
    }
    if (st == KVB_OK) {
        memcpy(ids, pa.ids, sizeof *ids * (size_t)pa.n);
        memcpy(ids + pa.n, pb.ids, sizeof *ids * (size_t)pb.n);
        *out = (struct admit_prompt){ids, pa.n + pb.n};
    }
    kvb_free(pa.ids);
    kvb_free(pb.ids);
    return st;
}

/* Pair k of a score or rerank line: one side's text followed by the other's. */
static enum kvb_status pair_ids(const struct admit_ctx *ctx, const struct admit_pool_cfg *cfg,
                                const struct job_request *q, int32_t k, unsigned flags, struct admit_prompt *out,
                                struct job_error *e)
{
    const struct job_prompt *a = &q->prompts[q->n_prompts == 1 ? 0 : k], *b = &q->docs[k];
    char param[64];
    item_param(q, q->url == JOB_URL_SCORE ? "text_2" : "documents", k, q->url == JOB_URL_RERANK ? 2 : q->n_docs, param,
               sizeof param);
    if (cfg->encoder_pairs) return encoder_pair(ctx, q, a, b, flags, param, out, e);
    char *text = kvb_malloc(a->text_len + b->text_len + 1);
    if (!text) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
        return KVB_ERR_NOMEM;
    }
    memcpy(text, a->text, a->text_len);
    memcpy(text + a->text_len, b->text, b->text_len);
    text[a->text_len + b->text_len] = '\0';
    enum kvb_status st = text_ids(ctx, q, text, a->text_len + b->text_len, flags | TOK_PARSE_SPECIAL, param, out, e);
    kvb_free(text);
    return st;
}

enum kvb_status admit_prepare_pooled(struct admit_ctx *ctx, const struct admit_pool_cfg *cfg,
                                     const struct job_request *q, struct admit_plan *plan, enum admit_item *kind,
                                     struct job_error *e)
{
    memset(plan, 0, sizeof *plan);
    char param[64];
    const bool pairs = q->url != JOB_URL_EMBEDDINGS && cfg->rank;
    *kind = pairs ? ADMIT_ITEM_PAIR : ADMIT_ITEM_EMBED;
    if (!pairs && !cfg->embed) {
        item_param(q,
                   q->url == JOB_URL_EMBEDDINGS ? "input"
                   : q->url == JOB_URL_SCORE    ? "text_1"
                                                : "query",
                   0, 1, param, sizeof param);
        return fail(e, q, JOB_ERR_INVALID_REQUEST, param, cfg->no_embed);
    }
    if (q->dimensions > cfg->n_embd) {
        item_param(q, "dimensions", 0, 1, param, sizeof param);
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                       "field '%s' = %d is above the model's embedding width %d", param, q->dimensions, cfg->n_embd);
        return KVB_ERR_FORMAT;
    }
    const int32_t n = q->url == JOB_URL_EMBEDDINGS ? q->n_prompts : pairs ? q->n_docs : q->n_prompts + q->n_docs;
    if (n > JOB_MAX_INPUTS) { /* both sides of a score line, each within the bound */
        item_param(q, "text_2", 0, 1, param, sizeof param);
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                       "the line's texts make %d sequences; at most %d are allowed in one line", n, JOB_MAX_INPUTS);
        return KVB_ERR_FORMAT;
    }
    plan->prompts = kvb_calloc((size_t)n, sizeof *plan->prompts);
    if (!plan->prompts) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
        return KVB_ERR_NOMEM;
    }
    const unsigned flags = q->add_special_tokens ? (tok_wants_bos(ctx->tok) ? TOK_ADD_BOS : 0) |
                                                       (tok_wants_eos(ctx->tok) ? TOK_ADD_EOS : 0)
                                                 : 0;
    enum kvb_status st = KVB_OK;
    for (int32_t k = 0; k < n && st == KVB_OK; k++) {
        if (pairs) {
            st = pair_ids(ctx, cfg, q, k, flags, &plan->prompts[k], e);
        } else if (q->url == JOB_URL_EMBEDDINGS) {
            st = input_ids(ctx, q, &q->prompts[k], "input", k, q->n_prompts, flags, &plan->prompts[k], e);
        } else { /* both sides of the pairs, text_1's (the query's) first */
            const bool first = k < q->n_prompts;
            const char *name = q->url == JOB_URL_SCORE ? (first ? "text_1" : "text_2") : first ? "query" : "documents";
            const int32_t i = first ? k : k - q->n_prompts, of = first ? q->n_prompts : q->n_docs;
            st = input_ids(ctx, q, first ? &q->prompts[i] : &q->docs[i], name, i,
                           q->url == JOB_URL_RERANK && !first ? 2 : of, flags, &plan->prompts[k], e);
        }
        if (st == KVB_OK) plan->n_prompts = k + 1;
    }
    if (st != KVB_OK) {
        admit_plan_free(plan);
        return st;
    }
    plan->n_choices = n;
    return KVB_OK;
}
