/* enc_cpu.c — an encoder's forward pass on the CPU (see enc_cpu.h), as
 * transformers' BertModel computes it:
 *   x = LayerNorm(tok_embd[t] + pos_embd[p] + type_embd[type])
 *   per layer: a = softmax(Q K^T / sqrt(hd)) V over the whole sequence,
 *              Q, K, V with their biases;
 *              x = LayerNorm(x + a Wo + bo);
 *              x = LayerNorm(x + GELU(x Wup + bup) Wdown + bdown)
 * and x of the last layer is the hidden state. The matrix products are the
 * llama layer's kernels (quantized weights take int8 activations, float
 * ones float); the norm, bias, GELU and residual work of each token runs as
 * the next product's input (mm_set_input_fn), on its threads. Attention is
 * plain float arithmetic, split over (sequence, head) pairs: a token's
 * result depends on its own sequence only, never on the batch around it. */
#include "cpu/enc_cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "cpu/attn.h"
#include "cpu/enc_attn.h"

struct enc_layer_w {
    struct mm_weight wq, wk, wv, wo, w_up, w_down;
};

struct cpu_enc {
    const struct model *m;
    struct tpool *pool;
    struct mm_ctx *mm;
    struct enc_layer_w *lw; /* (n_layer) packed copies, or the model's */
    void **owned;           /* (n_owned) their buffers */
    int n_owned;
    /* scratch, grown to the largest step */
    int64_t cap_tok;
    float *x, *q, *k, *v, *att, *tmp, *up; /* (cap_tok, n_embd) each; up: (cap_tok, n_ff) */
    int32_t *tok_seq, *tok_pos;            /* (cap_tok) */
    int64_t cap_scores;
    float *scores; /* (n_threads, cap_scores) enc_attn's scratch per thread */
    bool avx2;     /* enc_attn_avx2 (else the reference) */
};

void cpu_enc_free(struct cpu_enc *e)
{
    if (!e) return;
    for (int i = 0; i < e->n_owned; i++) kvb_free(e->owned[i]);
    kvb_free(e->owned);
    kvb_free(e->lw);
    float *bufs[] = {e->x, e->q, e->k, e->v, e->att, e->tmp, e->up, e->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvb_free(bufs[i]);
    kvb_free(e->tok_seq);
    kvb_free(e->tok_pos);
    kvb_free(e);
}

static enum kvb_status pack(struct cpu_enc *e, const struct mm_weight *w, struct mm_weight *out)
{
    void *owned = NULL;
    KVB_FORWARD_IF_ERROR(mm_pack_weight(e->mm, w, out, &owned));
    if (owned) e->owned[e->n_owned++] = owned;
    return KVB_OK;
}

enum kvb_status cpu_enc_create(const struct model *m, struct tpool *pool, struct mm_ctx *mm, struct cpu_enc **out,
                               struct kvb_err *err)
{
    struct cpu_enc *e = kvb_calloc(1, sizeof *e);
    const int n_layer = m->hp.n_layer;
    if (!e || !(e->lw = kvb_calloc((size_t)n_layer, sizeof *e->lw)) ||
        !(e->owned = kvb_calloc((size_t)n_layer * 6, sizeof *e->owned))) {
        cpu_enc_free(e);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the encoder");
    }
    e->m = m;
    e->pool = pool;
    e->mm = mm;
    e->avx2 = strcmp(mm_ctx_impl_name(mm), "scalar") != 0 && attn_have_avx2();
    enum kvb_status st = KVB_OK;
    for (int l = 0; l < n_layer && st == KVB_OK; l++) {
        const struct model_layer *L = &m->layers[l];
        struct enc_layer_w *W = &e->lw[l];
        const struct mm_weight *src[6] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_up, &L->w_down};
        struct mm_weight *dst[6] = {&W->wq, &W->wk, &W->wv, &W->wo, &W->w_up, &W->w_down};
        for (int i = 0; i < 6 && st == KVB_OK; i++) st = pack(e, src[i], dst[i]);
    }
    if (st != KVB_OK) {
        cpu_enc_free(e);
        return kvb_errf(err, st, "cannot rearrange the encoder's weights for the kernels");
    }
    *out = e;
    return KVB_OK;
}

static enum kvb_status grow(float **p, int64_t n)
{
    float *np = kvb_aligned_alloc(64, sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!np) return KVB_ERR_NOMEM;
    kvb_free(*p);
    *p = np;
    return KVB_OK;
}

static enum kvb_status ensure(struct cpu_enc *e, int64_t n_tok, int32_t max_len)
{
    const struct model_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd;
    if (n_tok > e->cap_tok) {
        float **bufs[] = {&e->x, &e->q, &e->k, &e->v, &e->att, &e->tmp};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) KVB_FORWARD_IF_ERROR(grow(bufs[i], n_tok * d));
        KVB_FORWARD_IF_ERROR(grow(&e->up, n_tok * hp->n_ff));
        int32_t *s = kvb_realloc(e->tok_seq, sizeof *s * (size_t)n_tok), *p;
        if (!s) return KVB_ERR_NOMEM;
        e->tok_seq = s;
        if (!(p = kvb_realloc(e->tok_pos, sizeof *p * (size_t)n_tok))) return KVB_ERR_NOMEM;
        e->tok_pos = p;
        e->cap_tok = n_tok;
    }
    const int64_t need = enc_attn_scratch_floats(max_len, hp->head_dim);
    if (need > e->cap_scores) {
        KVB_FORWARD_IF_ERROR(grow(&e->scores, need * tpool_size(e->pool)));
        e->cap_scores = need;
    }
    return KVB_OK;
}

void enc_layer_norm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps)
{
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    const double inv = 1.0 / sqrt(var / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = (float)(((double)x[i] - mean) * inv) * w[i] + b[i];
}

float enc_gelu(float z) { return 0.5f * z * (1.0f + erff(z * (float)M_SQRT1_2)); }

/* ---- per-token work, run as the next product's input --------------------------- */

struct row_job {
    struct cpu_enc *e;
    const float *bias;        /* the previous product's bias */
    const float *ln_w, *ln_b; /* the LayerNorm after the residual add; NULL: no add (layer 0) */
    float eps;
};

/* x[t] = LayerNorm(x[t] + tmp[t] + bias), the new residual, also the input. */
static void make_residual_row(void *arg, int64_t t, float *dst)
{
    const struct row_job *j = arg;
    struct cpu_enc *e = j->e;
    const int64_t d = e->m->hp.n_embd;
    float *xt = e->x + t * d;
    if (j->ln_w) {
        const float *at = e->tmp + t * d;
        for (int64_t i = 0; i < d; i++) xt[i] += at[i] + j->bias[i];
        enc_layer_norm(xt, xt, j->ln_w, j->ln_b, d, j->eps);
    }
    memcpy(dst, xt, sizeof(float) * (size_t)d);
}

/* GELU(up[t] + b_up), the input of the down projection. */
static void make_gelu_row(void *arg, int64_t t, float *dst)
{
    const struct row_job *j = arg;
    const int64_t f = j->e->m->hp.n_ff;
    const float *u = j->e->up + t * f;
    for (int64_t i = 0; i < f; i++) { dst[i] = enc_gelu(u[i] + j->bias[i]); }
}

/* ---- attention ---------------------------------------------------------------------- */

struct attn_job {
    struct cpu_enc *e;
    const struct be_batch *batch;
    const int64_t *start; /* (n_seqs) first token of each sequence in the step */
    const struct model_layer *L;
    int64_t n_items; /* sequences x heads */
    atomic_llong next;
};

static void attn_worker(void *arg, int ith, int nth)
{
    (void)nth;
    struct attn_job *j = arg;
    struct cpu_enc *e = j->e;
    const struct model_hparams *hp = &e->m->hp;
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const float scale = e->m->ops.attn_scale;
    float *scratch = e->scores + (int64_t)ith * e->cap_scores;
    for (int64_t it; (it = atomic_fetch_add(&j->next, 1)) < j->n_items;) {
        const int32_t seq = (int32_t)(it / hp->n_head), h = (int32_t)(it % hp->n_head);
        const int64_t off = j->start[seq] * d + h * hd;
        const int32_t n = j->batch->seqs[seq].n_tokens;
        if (e->avx2) enc_attn_avx2(e->att + off, e->q + off, e->k + off, e->v + off, d, n, (int32_t)hd, scale, scratch);
        else enc_attn(e->att + off, e->q + off, e->k + off, e->v + off, d, n, (int32_t)hd, scale, scratch);
    }
}

/* Q, K, V biases, every token (split between threads). */
struct bias_job {
    struct cpu_enc *e;
    const struct model_layer *L;
    int64_t n_tok;
};

static void bias_worker(void *arg, int ith, int nth)
{
    const struct bias_job *j = arg;
    const int64_t d = j->e->m->hp.n_embd;
    for (int64_t t = j->n_tok * ith / nth; t < j->n_tok * (ith + 1) / nth; t++)
        for (int64_t i = 0; i < d; i++) {
            j->e->q[t * d + i] += j->L->bq[i];
            j->e->k[t * d + i] += j->L->bk[i];
            j->e->v[t * d + i] += j->L->bv[i];
        }
}

/* The last layer's residual, made once for every token. */
struct final_job {
    struct row_job rj;
    int64_t n_tok;
};

static void final_worker(void *arg, int ith, int nth)
{
    struct final_job *j = arg;
    const int64_t d = j->rj.e->m->hp.n_embd;
    for (int64_t t = j->n_tok * ith / nth; t < j->n_tok * (ith + 1) / nth; t++) {
        float *xt = j->rj.e->x + t * d;
        const float *at = j->rj.e->tmp + t * d;
        for (int64_t i = 0; i < d; i++) xt[i] += at[i] + j->rj.bias[i];
        enc_layer_norm(xt, xt, j->rj.ln_w, j->rj.ln_b, d, j->rj.eps);
    }
}

/* ---- the pass ------------------------------------------------------------------------- */

/* The summed, normalised embeddings of every token. Token type 1 from the
 * position after the sequence's first separator on (model.h). */
static enum kvb_status embed(struct cpu_enc *e, const struct be_batch *batch, float *row)
{
    const struct model *m = e->m;
    const struct model_encoder *enc = &m->enc;
    const int64_t d = m->hp.n_embd;
    int64_t t = 0;
    for (int32_t s = 0; s < batch->n_seqs; s++) {
        const struct be_seq *sq = &batch->seqs[s];
        int32_t type = 0;
        for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
            float *xt = e->x + t * d;
            const struct mm_weight *pe = &enc->pos_embd;
            KVB_FORWARD_IF_ERROR(model_embed(m, sq->tokens[j], xt));
            KVB_FORWARD_IF_ERROR(
                quant_dequant_row(pe->type, (const char *)pe->data + (size_t)j * pe->row_bytes, row, d));
            for (int64_t i = 0; i < d; i++) xt[i] += row[i];
            if (enc->type_embd.data) {
                const int32_t ty = type < enc->n_types ? type : enc->n_types - 1;
                const struct mm_weight *te = &enc->type_embd;
                KVB_FORWARD_IF_ERROR(
                    quant_dequant_row(te->type, (const char *)te->data + (size_t)ty * te->row_bytes, row, d));
                for (int64_t i = 0; i < d; i++) xt[i] += row[i];
            }
            enc_layer_norm(xt, xt, enc->embd_norm, enc->embd_norm_b, d, enc->ln_eps);
            if (sq->tokens[j] == enc->sep_token) type = 1;
            e->tok_seq[t] = s;
            e->tok_pos[t] = j;
        }
    }
    return KVB_OK;
}

enum kvb_status cpu_enc_forward(struct cpu_enc *e, const struct be_batch *batch, struct kvb_err *err)
{
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd;
    int64_t n_tok = 0;
    int32_t max_len = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *s = &batch->seqs[i];
        if (s->pos != 0)
            return kvb_errf(err, KVB_ERR_INVALID_ARG,
                            "sequence %d starts at position %d: an encoder computes whole sequences in one pass", i,
                            s->pos);
        if (s->logits != BE_LOGITS_NONE && s->logits != BE_HIDDEN_ALL && s->logits != BE_HIDDEN_LAST)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d asks for logits: an encoder has no head", i);
        if (s->n_tokens > m->enc.n_pos)
            return kvb_errf(err, KVB_ERR_RANGE, "sequence %d has %d tokens; the encoder has %d positions", i,
                            s->n_tokens, m->enc.n_pos);
        n_tok += s->n_tokens;
        if (s->n_tokens > max_len) max_len = s->n_tokens;
    }
    if (n_tok == 0) return KVB_OK;
    int64_t *start = kvb_malloc(sizeof *start * (size_t)batch->n_seqs);
    float *row = kvb_malloc(sizeof(float) * (size_t)d);
    enum kvb_status st = !start || !row ? KVB_ERR_NOMEM : ensure(e, n_tok, max_len);
    if (st != KVB_OK) {
        kvb_free(start);
        kvb_free(row);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for a %lld-token encoder step", (long long)n_tok);
    }
    for (int32_t i = 0, t = 0; i < batch->n_seqs; t += batch->seqs[i++].n_tokens) start[i] = t;
    st = embed(e, batch, row);
    kvb_free(row);

    struct row_job rj = {e, NULL, NULL, NULL, m->enc.ln_eps};
    for (int l = 0; l < hp->n_layer && st == KVB_OK; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct enc_layer_w *W = &e->lw[l];
        /* input: the residual (after the previous layer's FFN add and norm) */
        if (l > 0) {
            const struct model_layer *P = &m->layers[l - 1];
            rj = (struct row_job){e, P->b_down, P->ln_out, P->ln_out_b, m->enc.ln_eps};
        }
        st = mm_set_input_fn(e->mm, d, n_tok, make_residual_row, &rj);
        const struct mm_weight *qkv_w[3] = {&W->wq, &W->wk, &W->wv};
        float *const qkv_y[3] = {e->q, e->k, e->v};
        if (st == KVB_OK) st = mm_apply_n(e->mm, qkv_w, qkv_y, 3);
        if (st != KVB_OK) break;
        struct bias_job bj = {e, L, n_tok};
        tpool_run(e->pool, bias_worker, &bj);
        struct attn_job aj = {e, batch, start, L, (int64_t)batch->n_seqs * hp->n_head, 0};
        tpool_run(e->pool, attn_worker, &aj);
        st = mm_matmul(e->mm, &W->wo, e->att, n_tok, e->tmp);
        rj = (struct row_job){e, L->bo, L->ln_attn, L->ln_attn_b, m->enc.ln_eps};
        if (st == KVB_OK) st = mm_set_input_fn(e->mm, d, n_tok, make_residual_row, &rj);
        if (st == KVB_OK) st = mm_apply(e->mm, &W->w_up, e->up);
        rj = (struct row_job){e, L->b_up, NULL, NULL, 0};
        if (st == KVB_OK) st = mm_set_input_fn(e->mm, hp->n_ff, n_tok, make_gelu_row, &rj);
        if (st == KVB_OK) st = mm_apply(e->mm, &W->w_down, e->tmp);
    }
    kvb_free(start);
    if (st != KVB_OK) return kvb_errf(err, st, "encoder step: %s", kvb_strerror(st));
    const struct model_layer *last = &m->layers[hp->n_layer - 1];
    struct final_job fj = {{e, last->b_down, last->ln_out, last->ln_out_b, m->enc.ln_eps}, n_tok};
    tpool_run(e->pool, final_worker, &fj);

    /* the rows pooling reads */
    int64_t hr = 0, t = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *s = &batch->seqs[i];
        if (s->logits == BE_HIDDEN_ALL) {
            memcpy(batch->hidden + hr * d, e->x + t * d, sizeof(float) * (size_t)(s->n_tokens * d));
            hr += s->n_tokens;
        } else if (s->logits == BE_HIDDEN_LAST) {
            memcpy(batch->hidden + hr * d, e->x + (t + s->n_tokens - 1) * d, sizeof(float) * (size_t)d);
            hr++;
        }
        t += s->n_tokens;
    }
    return KVB_OK;
}
