/* be_cuda_enc.c — an encoder's forward pass on the CUDA backend (see
 * be_cuda_internal.h), operation for operation as the CPU's (enc_cpu.c),
 * which is transformers' BertModel:
 *   x = LayerNorm(tok_embd[t] + pos_embd[p] + type_embd[type])
 *   per layer: QKV = x Wqkv + b (one GEMM over [wq; wk; wv]);
 *              a = softmax(Q K^T * scale) V over the token's own sequence;
 *              x = LayerNorm(x + a Wo + bo);
 *              x = LayerNorm(x + GELU(x Wup + bup) Wdown + bdown)
 * and x of the last layer is the hidden state (no final norm, no head: a
 * cross-encoder's head is applied by the engine, pool_rank_logit). Five
 * launches and four GEMMs a layer; every norm and activation writes the
 * next GEMM's bf16 input itself. Weights bf16 and GEMM inputs bf16, as the
 * llama layer's on this backend; the position and token-type tables, norms
 * and biases f32.
 *
 * No KV pool: K and V live in the step's QKV rows and never leave the
 * pass. Not captured into CUDA graphs: encoder steps are whole sequences,
 * of shapes that rarely repeat. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/be_cuda.h"
#include "kernels/be_cuda_internal.h"
#include "kernels/kernels.h"
#include "model/quant.h"

struct enc_layer {
    uint16_t *wqkv, *wo, *w_up, *w_down; /* bf16: (3e, e), (e, e), (f, e), (e, f) */
    float *bqkv, *bo, *b_up, *b_down;    /* (3e), (e), (f), (e) */
    float *ln_attn, *ln_attn_b, *ln_out, *ln_out_b;
};

struct cuda_enc {
    const struct model *m;
    cublasHandle_t blas;
    cudaStream_t stream;
    bool det;
    struct enc_layer *layers;
    uint16_t *tok_embd;          /* (n_vocab, e) bf16 */
    float *pos_embd, *type_embd; /* (n_pos, e), (n_types, e) or NULL */
    float *embd_norm, *embd_norm_b;
    /* scratch, grown to the largest step (rows rounded up to BE_CUDA_DET_ROWS) */
    int64_t cap_tok;
    float *x, *qkv, *proj, *up; /* (cap, e), (cap, 3e), (cap, e), (cap, f) */
    uint16_t *xb;               /* (cap, max(e, f)) the next GEMM's input */
    int32_t *h_idx, *d_idx;     /* tokens | positions | types | first row | rows of each token's sequence */
};

int64_t cuda_enc_weight_bytes(const struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd, f = hp->n_ff;
    const int64_t per_layer = 2 * (3 * e * e + e * e + 2 * e * f) + 4 * (3 * e + e + f + e + 4 * e);
    return per_layer * hp->n_layer + 2 * (int64_t)hp->n_vocab * e +
           4 * ((int64_t)m->enc.n_pos + (m->enc.type_embd.data ? m->enc.n_types : 0) + 2) * e;
}

static void free_scratch(struct cuda_enc *c)
{
    void *bufs[] = {c->x, c->qkv, c->proj, c->up, c->xb, c->d_idx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    if (c->h_idx) cudaFreeHost(c->h_idx);
    c->x = c->qkv = c->proj = c->up = NULL;
    c->xb = NULL;
    c->h_idx = c->d_idx = NULL;
    c->cap_tok = 0;
}

void cuda_enc_free(struct cuda_enc *c)
{
    if (!c) return;
    free_scratch(c);
    for (int l = 0; c->layers && l < c->m->hp.n_layer; l++) {
        struct enc_layer *L = &c->layers[l];
        void *bufs[] = {L->wqkv, L->wo,     L->w_up,    L->w_down,    L->bqkv,   L->bo,
                        L->b_up, L->b_down, L->ln_attn, L->ln_attn_b, L->ln_out, L->ln_out_b};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    }
    kvb_free(c->layers);
    void *bufs[] = {c->tok_embd, c->pos_embd, c->type_embd, c->embd_norm, c->embd_norm_b};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    kvb_free(c);
}

/* n matrices of n_in columns stacked row-wise into one new bf16 array. */
static enum kvb_status upload_rows(struct uploader *u, uint16_t **dst, const struct mm_weight *const *w, int n,
                                   const char *name, struct kvb_err *err)
{
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += w[i]->n_out;
    KVB_FORWARD_IF_ERROR(dev_alloc(dst, rows * w[0]->n_in * 2, name, err));
    rows = 0;
    for (int i = 0; i < n; i++) {
        KVB_FORWARD_IF_ERROR(upload_matrix(u, *dst + rows * w[0]->n_in, w[i], name, err));
        rows += w[i]->n_out;
    }
    return KVB_OK;
}

/* A table of f32 rows (positions, token types), dequantized on the host as
 * enc_cpu.c reads them. */
static enum kvb_status upload_table(float **dst, const struct mm_weight *w, const char *name, struct kvb_err *err)
{
    const int64_t n = w->n_in * w->n_out;
    float *h = kvb_malloc(sizeof(float) * (size_t)n);
    if (!h) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for %s", name);
    enum kvb_status st = KVB_OK;
    for (int64_t r = 0; r < w->n_out && st == KVB_OK; r++)
        st = quant_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, h + r * w->n_in, w->n_in);
    if (st != KVB_OK) st = kvb_errf(err, st, "%s: cannot dequantize type %u", name, (unsigned)w->type);
    else st = upload_f32(dst, h, n, name, err);
    kvb_free(h);
    return st;
}

enum kvb_status cuda_enc_create(const struct model *m, cublasHandle_t blas, cudaStream_t stream, bool det,
                                struct uploader *u, struct cuda_enc **out, struct kvb_err *err)
{
    const struct model_hparams *hp = &m->hp;
    const struct model_encoder *enc = &m->enc;
    const int64_t e = hp->n_embd, f = hp->n_ff;
    *out = NULL;
    if ((int64_t)hp->n_head * hp->head_dim != e)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "CUDA backend: an encoder's heads (%d x %d) must make its width %d",
                        hp->n_head, hp->head_dim, hp->n_embd);
    struct cuda_enc *c = kvb_calloc(1, sizeof *c);
    if (!c || !(c->layers = kvb_calloc((size_t)hp->n_layer, sizeof *c->layers))) {
        kvb_free(c);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    c->m = m;
    c->blas = blas;
    c->stream = stream;
    c->det = det;
    enum kvb_status st = KVB_OK;
    char name[64];
    for (int l = 0; l < hp->n_layer && st == KVB_OK; l++) {
        const struct model_layer *L = &m->layers[l];
        struct enc_layer *D = &c->layers[l];
        snprintf(name, sizeof name, "encoder layer %d weights", l);
        const struct mm_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *wo[1] = {&L->wo}, *wu[1] = {&L->w_up},
                               *wd[1] = {&L->w_down};
        st = upload_rows(u, &D->wqkv, qkv, 3, name, err);
        if (st == KVB_OK) st = upload_rows(u, &D->wo, wo, 1, name, err);
        if (st == KVB_OK) st = upload_rows(u, &D->w_up, wu, 1, name, err);
        if (st == KVB_OK) st = upload_rows(u, &D->w_down, wd, 1, name, err);
        snprintf(name, sizeof name, "encoder layer %d norms and biases", l);
        if (st == KVB_OK) st = dev_alloc(&D->bqkv, 3 * e * 4, name, err);
        const float *bs[3] = {L->bq, L->bk, L->bv};
        for (int i = 0; i < 3 && st == KVB_OK; i++)
            st = cu_check(cudaMemcpy(D->bqkv + i * e, bs[i], (size_t)e * 4, cudaMemcpyHostToDevice), err, name);
        struct {
            float **dst;
            const float *src;
            int64_t n;
        } v[] = {{&D->bo, L->bo, e},
                 {&D->b_up, L->b_up, f},
                 {&D->b_down, L->b_down, e},
                 {&D->ln_attn, L->ln_attn, e},
                 {&D->ln_attn_b, L->ln_attn_b, e},
                 {&D->ln_out, L->ln_out, e},
                 {&D->ln_out_b, L->ln_out_b, e}};
        for (size_t i = 0; i < sizeof v / sizeof v[0] && st == KVB_OK; i++)
            st = upload_f32(v[i].dst, v[i].src, v[i].n, name, err);
    }
    const struct mm_weight *te[1] = {&m->tok_embd};
    if (st == KVB_OK) st = upload_rows(u, &c->tok_embd, te, 1, "token embeddings", err);
    if (st == KVB_OK) st = upload_table(&c->pos_embd, &enc->pos_embd, "position embeddings", err);
    if (st == KVB_OK && enc->type_embd.data)
        st = upload_table(&c->type_embd, &enc->type_embd, "token type embeddings", err);
    if (st == KVB_OK) st = upload_f32(&c->embd_norm, enc->embd_norm, e, "embedding norm", err);
    if (st == KVB_OK) st = upload_f32(&c->embd_norm_b, enc->embd_norm_b, e, "embedding norm", err);
    if (st != KVB_OK) {
        cuda_enc_free(c);
        return st;
    }
    *out = c;
    return KVB_OK;
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

static enum kvb_status ensure(struct cuda_enc *c, int64_t n_tok, struct kvb_err *err)
{
    if (n_tok <= c->cap_tok) return KVB_OK;
    const int64_t e = c->m->hp.n_embd, f = c->m->hp.n_ff;
    const int64_t nt = round_up(n_tok, BE_CUDA_DET_ROWS);
    free_scratch(c);
    struct {
        void *p;
        int64_t bytes;
    } b[] = {
        {&c->x, nt * e * 4},  {&c->qkv, nt * 3 * e * 4},          {&c->proj, nt * e * 4},
        {&c->up, nt * f * 4}, {&c->xb, nt * (e > f ? e : f) * 2}, {&c->d_idx, nt * 5 * 4},
    };
    enum kvb_status st = KVB_OK;
    for (size_t i = 0; i < sizeof b / sizeof b[0] && st == KVB_OK; i++) {
        st = dev_alloc(b[i].p, b[i].bytes, "encoder step buffers", err);
        /* zeroed: the padding rows of deterministic GEMM tiles hold numbers */
        if (st == KVB_OK)
            st = cu_check(cudaMemsetAsync(*(void **)b[i].p, 0, (size_t)b[i].bytes, c->stream), err,
                          "encoder step buffers");
    }
    if (st == KVB_OK)
        st = cu_check(cudaHostAlloc((void **)&c->h_idx, (size_t)nt * 5 * 4, cudaHostAllocDefault), err,
                      "pinned encoder indices");
    if (st != KVB_OK) {
        free_scratch(c);
        if (st == KVB_ERR_NOMEM)
            return kvb_errf(err, st,
                            "CUDA: out of device memory for a %lld-token encoder step: lower the tokens per step",
                            (long long)n_tok);
        return st;
    }
    c->cap_tok = nt;
    return KVB_OK;
}

/* As be_cuda.c's step: the first failure is kept, the rest skipped. */
struct enc_step {
    cudaError_t ce;
    cublasStatus_t bs;
    const char *what;
};

static void cu(struct enc_step *s, cudaError_t e, const char *what)
{
    if (e != cudaSuccess && !s->what) {
        s->ce = e;
        s->what = what;
    }
}

/* y = x · wᵀ, on whole tiles of BE_CUDA_DET_ROWS rows in deterministic mode. */
static void gemm(struct cuda_enc *c, struct enc_step *s, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok,
                 int64_t n_in, int64_t n_out, const char *what)
{
    const int64_t tile = c->det ? BE_CUDA_DET_ROWS : n_tok;
    for (int64_t r = 0; r < n_tok && !s->what; r += tile) {
        cublasStatus_t b = kcu_gemm_bf16(c->blas, y + r * n_out, x + r * n_in, w, tile, n_in, n_out);
        if (b != CUBLAS_STATUS_SUCCESS) {
            s->bs = b;
            s->what = what;
        }
    }
}

enum kvb_status cuda_enc_forward(struct cuda_enc *c, const struct be_batch *batch, struct kvb_err *err)
{
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_encoder *enc = &m->enc;
    const int64_t e = hp->n_embd, f = hp->n_ff;
    int64_t n_tok = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *sq = &batch->seqs[i];
        if (sq->pos != 0)
            return kvb_errf(err, KVB_ERR_INVALID_ARG,
                            "sequence %d starts at position %d: an encoder computes whole sequences in one pass", i,
                            sq->pos);
        if (sq->logits != BE_LOGITS_NONE && sq->logits != BE_HIDDEN_ALL && sq->logits != BE_HIDDEN_LAST)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d asks for logits: an encoder has no head", i);
        if (sq->n_tokens > enc->n_pos)
            return kvb_errf(err, KVB_ERR_RANGE, "sequence %d has %d tokens; the encoder has %d positions", i,
                            sq->n_tokens, enc->n_pos);
        n_tok += sq->n_tokens;
    }
    if (n_tok == 0) return KVB_OK;
    if (n_tok > 0x7fffffff / hp->n_head)
        return kvb_errf(err, KVB_ERR_RANGE, "an encoder step of %lld tokens is too large", (long long)n_tok);
    KVB_FORWARD_IF_ERROR(ensure(c, n_tok, err));

    /* Indices: each token's id, position, type (1 after its sequence's
     * first separator, as enc_cpu.c), and its sequence's rows. */
    int32_t *tok = c->h_idx, *pos = tok + n_tok, *type = pos + n_tok, *lo = type + n_tok, *len = lo + n_tok;
    for (int32_t i = 0, t = 0; i < batch->n_seqs; i++) {
        const struct be_seq *sq = &batch->seqs[i];
        const int32_t first = t;
        int32_t ty = 0;
        for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
            tok[t] = sq->tokens[j];
            pos[t] = j;
            type[t] = ty < enc->n_types ? ty : enc->n_types - 1;
            lo[t] = first;
            len[t] = sq->n_tokens;
            if (sq->tokens[j] == enc->sep_token) ty = 1;
        }
    }
    const int32_t nt = (int32_t)n_tok, ne = (int32_t)e, nf = (int32_t)f;
    const int32_t *d_tok = c->d_idx, *d_pos = d_tok + n_tok, *d_type = d_pos + n_tok, *d_lo = d_type + n_tok,
                  *d_len = d_lo + n_tok;
    const float eps = enc->ln_eps;
    cudaStream_t cs = c->stream;
    struct enc_step s = {cudaSuccess, CUBLAS_STATUS_SUCCESS, NULL};
    cu(&s, cudaMemcpyAsync(c->d_idx, c->h_idx, (size_t)n_tok * 5 * 4, cudaMemcpyHostToDevice, cs),
       "upload encoder indices");
    cu(&s,
       kcu_enc_embed(c->x, c->xb, c->tok_embd, c->pos_embd, c->type_embd, d_tok, d_pos, d_type, nt, ne, c->embd_norm,
                     c->embd_norm_b, eps, cs),
       "encoder embeddings");
    for (int l = 0; l < hp->n_layer && !s.what; l++) {
        const struct enc_layer *L = &c->layers[l];
        gemm(c, &s, c->qkv, c->xb, L->wqkv, n_tok, e, 3 * e, "encoder QKV projection");
        cu(&s, kcu_add_bias(c->qkv, 3 * e, L->bqkv, nt, 3 * ne, cs), "encoder QKV bias");
        cu(&s,
           kcu_enc_attn_bf16(c->xb, c->qkv, 3 * e, e, 2 * e, d_lo, d_len, nt, hp->n_head, hp->head_dim,
                             m->ops.attn_scale, cs),
           "encoder attention");
        gemm(c, &s, c->proj, c->xb, L->wo, n_tok, e, e, "encoder output projection");
        cu(&s, kcu_add_layernorm(c->x, c->xb, c->proj, L->bo, nt, ne, L->ln_attn, L->ln_attn_b, eps, cs),
           "encoder attention norm");
        gemm(c, &s, c->up, c->xb, L->w_up, n_tok, e, f, "encoder up projection");
        cu(&s, kcu_gelu_erf_bf16(c->xb, c->up, L->b_up, nt, nf, cs), "encoder GELU");
        gemm(c, &s, c->proj, c->xb, L->w_down, n_tok, f, e, "encoder down projection");
        cu(&s, kcu_add_layernorm(c->x, c->xb, c->proj, L->b_down, nt, ne, L->ln_out, L->ln_out_b, eps, cs),
           "encoder output norm");
    }
    /* The rows pooling reads, in sequence order: one copy per sequence. */
    int64_t hr = 0, t = 0;
    for (int32_t i = 0; i < batch->n_seqs && !s.what; i++) {
        const struct be_seq *sq = &batch->seqs[i];
        const int64_t n = sq->logits == BE_HIDDEN_ALL ? sq->n_tokens : sq->logits == BE_HIDDEN_LAST ? 1 : 0;
        const int64_t from = sq->logits == BE_HIDDEN_LAST ? t + sq->n_tokens - 1 : t;
        if (n > 0)
            cu(&s,
               cudaMemcpyAsync(batch->hidden + hr * e, c->x + from * e, (size_t)(n * e) * 4, cudaMemcpyDeviceToHost,
                               cs),
               "download hidden states");
        hr += n;
        t += sq->n_tokens;
    }
    /* Always: the pinned indices may be refilled only once copied. */
    cu(&s, cudaStreamSynchronize(cs), "encoder step");
    if (!s.what) return KVB_OK;
    if (s.bs != CUBLAS_STATUS_SUCCESS) return blas_check(s.bs, err, s.what);
    return cu_check(s.ce, err, s.what);
}
