/* runner_pool.c — pooled lines in the run loop: embeddings, score and
 * rerank (see runner_internal.h). Each item of a line (an input, a pair,
 * or one side of an embedding model's pair) is one pooled scheduler
 * sequence, unless the persistent results cache already holds its result
 * for exactly its token ids; its pooled state becomes the item's result
 * (an embedding, normalised unless --no-normalize; a reranker's logit) and
 * goes to that cache; the line is written once all its items are done. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "app/cli_util.h"
#include "app/runner_internal.h"
#include "base/alloc.h"
#include "engine/pool.h"
#include "model/model.h"

static unsigned sched_flag(enum model_pooling p)
{
    return p == MODEL_POOL_MEAN ? SCHED_POOL_MEAN : p == MODEL_POOL_CLS ? SCHED_POOL_CLS : SCHED_POOL_LAST;
}

bool runner_pool_setup(struct runner *r)
{
    const struct model *m = r->model;
    r->normalize = !r->o->no_normalize;
    if (r->o->pooling) {
        pool_parse(r->o->pooling, false, &r->embed_pool); /* checked by the CLI */
    } else if (m->pooling == MODEL_POOL_MEAN || m->pooling == MODEL_POOL_CLS || m->pooling == MODEL_POOL_LAST) {
        r->embed_pool = m->pooling;
    } else {
        r->embed_pool = MODEL_POOL_NONE;
        snprintf(r->no_embed, sizeof r->no_embed,
                 m->pooling == MODEL_POOL_RANK
                     ? "this model is a reranker (its file's pooling_type is rank): it scores pairs "
                       "(/v1/score, /v1/rerank); for embeddings of its hidden states run with --pooling mean|cls|last"
                     : "the model does not say how to pool its hidden states into an embedding (its file has no "
                       "pooling_type: a generative model): run with --pooling mean|cls|last (last for a decoder "
                       "embedder such as Qwen3-Embedding, mean for most others)");
    }
    /* a causal reranker reads its last token, an encoder its first ([CLS]),
     * as llama.cpp's rank pooling does */
    r->pair_flag = m->ops.encoder ? SCHED_POOL_CLS : SCHED_POOL_LAST;
    r->pool_cfg = (struct admit_pool_cfg){
        .embed = r->embed_pool != MODEL_POOL_NONE,
        .no_embed = r->no_embed,
        .rank = m->n_cls_out > 0,
        .n_embd = m->hp.n_embd,
        .encoder_pairs = m->ops.encoder,
    };
    if (!r->o->quiet && (r->o->pooling || m->pooling != MODEL_POOL_NONE))
        fprintf(stderr, "kvbatch run: pooling: embeddings %s%s%s\n",
                r->embed_pool ? pool_name(r->embed_pool) : "not made",
                r->embed_pool && !r->normalize ? " (not normalised)" : "",
                r->pool_cfg.rank ? "; scores by the model's classification head" : "");
    return true;
}

/* What else a result depends on besides the model and the tokens. */
struct space_params {
    uint32_t kind;                /* 1: an embedding, 2: a pair's logit */
    uint32_t pooling;             /* enum model_pooling */
    uint32_t normalize;           /* 1 when normalised */
    uint32_t kv_type;             /* the KV cache's element type: it changes the arithmetic */
    char arith[PSTORE_ARITH_MAX]; /* the backend's arithmetic (backend.h), zero-filled */
};

/* The params' bytes: without an arithmetic name, those of the struct before
 * the field existed, so results stored by the reference arithmetic keep
 * their keys. */
static size_t params_bytes(const struct space_params *p)
{
    return p->arith[0] ? sizeof *p : offsetof(struct space_params, arith);
}

void runner_pool_store(struct runner *r)
{
    if (!r->ps) return;
    struct space_params e = {1, (uint32_t)r->embed_pool, r->normalize, (uint32_t)r->be->kv_type, {0}};
    struct space_params p = {2, (uint32_t)MODEL_POOL_RANK, 0, (uint32_t)r->be->kv_type, {0}};
    if (r->be->arith) {
        snprintf(e.arith, sizeof e.arith, "%s", r->be->arith);
        snprintf(p.arith, sizeof p.arith, "%s", r->be->arith);
    }
    struct kvb_err err = {{0}};
    r->have_rspace = pstore_rspace_init(&r->rs_embed, r->model->fingerprint, &e, params_bytes(&e), &err) == KVB_OK &&
                     pstore_rspace_init(&r->rs_pair, r->model->fingerprint, &p, params_bytes(&p), &err) == KVB_OK;
}

static const struct pstore_rspace *space_of(const struct runner *r, const struct slot *s)
{
    return s->item == ADMIT_ITEM_PAIR ? &r->rs_pair : &r->rs_embed;
}

static void emit(struct runner *r, struct slot *s);

/* Item i was answered by the results cache. */
static void cached_item(struct runner *r, struct slot *s, int32_t i, int32_t n_tokens)
{
    struct choice *c = &s->ch[i];
    c->done = true;
    c->cached_store = n_tokens;
    c->t_admit = c->t_end = cli_now();
    s->result_hits++;
    s->result_tokens += n_tokens;
    r->result_hits++;
    r->result_tokens += n_tokens;
    s->n_done++;
}

bool runner_pool_submit(struct runner *r, struct slot *s)
{
    const int32_t n = s->n_choices;
    s->width = s->item == ADMIT_ITEM_PAIR ? 1 : r->model->hp.n_embd;
    s->vals = kvb_malloc(sizeof(float) * (size_t)n * (size_t)s->width);
    if (!s->vals) {
        fprintf(stderr, "\nkvbatch run: out of memory for '%s'\n", s->req.custom_id);
        return false;
    }
    r->pooled_seqs += n;
    const unsigned flag = s->item == ADMIT_ITEM_PAIR ? r->pair_flag : sched_flag(r->embed_pool);
    for (int32_t i = 0; i < n; i++) {
        const struct admit_prompt *p = &s->plan.prompts[i];
        if (r->have_rspace) {
            struct pstore_key key;
            bool hit = false;
            pstore_result_key(space_of(r, s), p->ids, p->n, &key);
            struct kvb_err err = {{0}};
            if (pstore_result_get(r->ps, space_of(r, s), &key, p->ids, p->n, s->vals + (int64_t)i * s->width, s->width,
                                  &hit, &err) == KVB_OK &&
                hit) {
                cached_item(r, s, i, p->n);
                continue;
            }
        }
        const uint64_t uid = (uint64_t)(s - r->slots) * RUNNER_UID_SPAN + (uint64_t)i;
        struct kvb_err err = {{0}};
        if (sched_submit(r->sched, uid, p->ids, p->n, 0, NULL, flag, &err) != KVB_OK) {
            fprintf(stderr, "\nkvbatch run: cannot queue '%s': %s\n", s->req.custom_id, err.msg);
            return false;
        }
    }
    for (int32_t k = 0; k < s->plan.n_prompts; k++) {
        kvb_free(s->plan.prompts[k].ids);
        s->plan.prompts[k].ids = NULL;
    }
    if (s->n_done == s->n_choices) emit(r, s); /* all from the cache */
    return true;
}

/* Marks the line failed (the first cause kept): written as a 500 error. */
static void fail(struct slot *s, const char *why)
{
    if (s->failed) return;
    s->failed = true;
    snprintf(s->fail_msg, sizeof s->fail_msg, "%.*s", (int)sizeof s->fail_msg - 1, why);
}

/* The item's result from its pooled state, into s->vals and the results
 * cache. */
static void item_result(struct runner *r, struct slot *s, int32_t i, const struct sched_seq_info *info)
{
    float *v = s->vals + (int64_t)i * s->width;
    const int32_t e = r->model->hp.n_embd;
    for (int32_t k = 0; k < e; k++)
        if (!isfinite(info->pooled[k])) {
            fail(s, "the model's hidden states are not finite: the model's weights or the backend are broken");
            return;
        }
    if (s->item == ADMIT_ITEM_PAIR) {
        struct kvb_err err = {{0}};
        if (pool_rank_logit(r->model, info->pooled, v, &err) != KVB_OK) {
            fail(s, err.msg);
            return;
        }
    } else {
        memcpy(v, info->pooled, sizeof(float) * (size_t)e);
        if (r->normalize) pool_normalize(v, e);
    }
    if (!r->have_rspace) return;
    struct pstore_key key;
    pstore_result_key(space_of(r, s), info->tokens, info->n_prompt, &key);
    struct kvb_err err = {{0}};
    pstore_result_put(r->ps, space_of(r, s), &key, info->tokens, info->n_prompt, v, s->width, &err);
}

void runner_pool_finish(struct runner *r, struct slot *s, const struct sched_seq_info *info, enum sched_finish why)
{
    const int32_t i = (int32_t)(info->user_id % RUNNER_UID_SPAN);
    struct choice *c = &s->ch[i];
    c->done = true;
    c->cached = info->cached_tokens;
    c->cached_store = info->store_tokens;
    c->t_admit = info->t_admit;
    c->t_end = info->t_end;
    c->preemptions = info->preemptions;
    c->restored_tokens = info->restored_tokens;
    if (why == SCHED_FINISH_ERROR || !info->pooled)
        fail(s, info->error ? info->error : "internal error: the pooled state was not returned");
    else if (!s->failed) item_result(r, s, i, info);
    if (++s->n_done < s->n_choices) return;
    emit(r, s);
}

/* The line's values as its endpoint returns them: embeddings cut to their
 * dimensions (and normalised again), scores through the activation. */
static float *line_values(const struct runner *r, const struct slot *s, int32_t *n_items, int32_t *dim)
{
    const struct job_request *q = &s->req;
    const int32_t e = r->model->hp.n_embd;
    if (q->url == JOB_URL_EMBEDDINGS) {
        const int32_t d = q->dimensions > 0 ? q->dimensions : e;
        float *out = kvb_malloc(sizeof(float) * (size_t)s->n_choices * (size_t)d);
        if (!out) return NULL;
        for (int32_t i = 0; i < s->n_choices; i++) {
            memcpy(out + (int64_t)i * d, s->vals + (int64_t)i * e, sizeof(float) * (size_t)d);
            if (d < e && r->normalize) pool_normalize(out + (int64_t)i * d, d);
        }
        *n_items = s->n_choices;
        *dim = d;
        return out;
    }
    const int32_t np = q->n_docs; /* pairs: one per text_2 / document */
    float *out = kvb_malloc(sizeof(float) * (size_t)np);
    if (!out) return NULL;
    for (int32_t i = 0; i < np; i++) {
        if (s->item == ADMIT_ITEM_PAIR) {
            out[i] = q->use_activation ? pool_sigmoid(s->vals[i]) : s->vals[i];
        } else { /* embeddings of text_1 (the query) first, then of text_2 */
            const float *a = s->vals + (int64_t)(q->n_prompts == 1 ? 0 : i) * e;
            const float *b = s->vals + (int64_t)(q->n_prompts + i) * e;
            out[i] = pool_cosine(a, b, e);
        }
    }
    *n_items = np;
    *dim = 1;
    return out;
}

static void emit(struct runner *r, struct slot *s)
{
    const struct job_request *q = &s->req;
    int64_t prompt_tokens = 0, cached_run = 0, cached_store = 0;
    for (int32_t i = 0; i < s->n_choices; i++) {
        prompt_tokens += s->plan.prompts[i].n;
        cached_run += s->ch[i].cached;
        cached_store += s->ch[i].cached_store;
    }
    int32_t n_items = 0, dim = 0;
    float *vals = s->failed ? NULL : line_values(r, s, &n_items, &dim);
    struct job_error e;
    bool written = false;
    r->line.len = 0;
    if (!s->failed && vals) {
        struct job_pool_result res = {
            .custom_id = q->custom_id,
            .custom_id_len = q->custom_id_len,
            .custom_id_json = q->custom_id_json,
            .custom_id_json_len = q->custom_id_json_len,
            .url = q->url,
            .model = q->model ? q->model : r->model->name,
            .created = r->created,
            .values = vals,
            .n_items = n_items,
            .dim = dim,
            .base64 = q->base64,
            .docs = q->docs,
            .top_n = q->top_n,
            .prompt_tokens = prompt_tokens,
            .cached_tokens = cached_run + cached_store,
        };
        const enum kvb_status st = job_format_pooled(&r->line, &res);
        if (st == KVB_OK) written = runner_write_line(r);
        else
            fail(s, st == KVB_ERR_NOMEM ? "out of memory while formatting the result"
                                        : "a result is not finite: the model's weights or the backend are broken");
    } else if (!s->failed) {
        fail(s, "out of memory while formatting the result");
    }
    kvb_free(vals);
    if (s->failed) {
        job_error_setf(&e, JOB_ERR_SERVER, q->line_no, NULL, "%s", s->fail_msg);
        runner_emit_error(r, q, &e, 500);
    } else if (written) {
        runner_result_metrics(r, s, prompt_tokens, 0, cached_run, cached_store);
    } else {
        r->lines_done++;
    }
    runner_free_slot(r, s);
}
