/* be_cpu.c — the CPU backend: one forward pass over a packed batch, every
 * weight matrix applied to all of the step's tokens at once (so each weight
 * is read once per step), attention read through per-sequence block tables, in tiles
 * of tokens that read shared KV blocks once (attn_tile_*.c).
 *
 * KV pool layout, per page: [layer][K | V][slot][n_head_kv * head_dim], each
 * row stored as the pool's KV type says (fp16, or q8/q4 groups, a q4 pool's
 * K rows at q8: backend/kvtype.h), quantized once when the token's K and V
 * are written. A page is a whole block — all layers, one contiguous span,
 * which is what the persistent cache copies in and out — unless the model
 * has sliding-window layers: then a block is one page per group of layers
 * (backend.h's paging) and each step looks its pages up per group (c->map),
 * so that attention and the K/V store of a layer read the pages of that
 * layer's group. */
#include "cpu/be_cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/tpool.h"
#include "cpu/attn.h"
#include "cpu/enc_cpu.h"
#include "cpu/moe.h"
#include "model/model.h"

/* A layer's matrices as the matmul kernels read them: packed copies where
 * the kernels have a packed form (see mm_pack_weight), else the model's. */
struct cpu_layer_w {
    struct mm_weight wq, wk, wv, wo, w_gate, w_up, w_down;
};

struct cpu_be {
    struct backend be;
    const struct model *m;
    struct tpool *pool;
    struct mm_ctx *mm;
    struct cpu_layer_w *lw; /* (n_layer) */
    struct mm_weight output;
    void **packed;       /* (n_packed) owned buffers behind lw and output */
    struct cpu_moe *moe; /* the experts of the MoE layers, or NULL */
    int n_packed;
    uint16_t *kv;             /* (n_pages, page_words) 2-byte words, rows stored as be.kv_type */
    int64_t page_words;       /* words of a page: layers_per_group * layer_words */
    int32_t *map;             /* (n_logical, n_groups) each block's pages; NULL with one group */
    int32_t *lgroup, *lindex; /* (n_layer) each layer's group, its index in the group's page */
    int32_t *gtab;            /* (n_groups, cap_tab) the step's tables of pages, per group */
    int64_t cap_tab, n_tab;
    int32_t *seq_tab;                   /* (cap_keys) each sequence's offset in a group's part of gtab */
    int64_t kv_dim;                     /* n_head_kv * head_dim (elements of a K or V row) */
    int64_t k_row_words, v_row_words;   /* words of a stored K row, V row (kv_row_bytes(kv_k_rows(t), kv_dim) / 2) */
    int64_t k_head_words, v_head_words; /* words of one KV head's part of a K row, a V row */
    int64_t layer_words;                /* words of one layer's part of a block: bs K rows, bs V rows */
    float *inv_freq;                    /* (rope_dim / 2) */
    float *inv_freq_swa;                /* (rope_dim / 2) the windowed layers' (model_rope_freqs_swa) */
    bool simd;                          /* AVX2 attention/activation kernels (else the scalar reference) */
    bool avx512;                        /* attention inner loops in AVX-512 (same results, twice the lanes) */

    /* Per-step scratch, grown to the largest step seen. */
    int64_t cap_tok;
    float *x, *q, *k, *v, *att, *tmp, *gate, *up;
    int32_t *tok_pos, *tok_seq;
    int32_t *tile_order;  /* step's tokens in attention-tile order */
    struct seq_key *keys; /* (cap_keys) sort keys of the step's sequences */
    int32_t cap_keys;
    int64_t n_tiles;
    int64_t cap_out;
    float *out_rows;     /* normalised rows whose logits are wanted */
    int64_t cap_scores;  /* per thread */
    float *scores;       /* (n_threads, cap_scores) */
    struct cpu_enc *enc; /* an encoder's forward pass (enc_cpu.c): no llama layer, no KV pool */
};

static void cpu_free(struct backend *be)
{
    struct cpu_be *c = (struct cpu_be *)be;
    if (!c) return;
    cpu_moe_free(c->moe);
    cpu_enc_free(c->enc);
    for (int i = 0; i < c->n_packed; i++) kvb_free(c->packed[i]);
    kvb_free(c->packed);
    kvb_free(c->lw);
    mm_ctx_free(c->mm);
    tpool_free(c->pool);
    kvb_free(c->kv);
    kvb_free(c->inv_freq);
    kvb_free(c->inv_freq_swa);
    kvb_free(c->map);
    kvb_free(c->lgroup);
    kvb_free(c->lindex);
    kvb_free(c->gtab);
    kvb_free(c->seq_tab);
    float *bufs[] = {c->x, c->q, c->k, c->v, c->att, c->tmp, c->gate, c->up, c->out_rows, c->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvb_free(bufs[i]);
    kvb_free(c->tok_pos);
    kvb_free(c->tok_seq);
    kvb_free(c->tile_order);
    kvb_free(c->keys);
    kvb_free(c);
}

static enum kvb_status grow(float **p, int64_t n)
{
    float *np = kvb_aligned_alloc(64, sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!np) return KVB_ERR_NOMEM;
    kvb_free(*p);
    *p = np;
    return KVB_OK;
}

static enum kvb_status ensure_tokens(struct cpu_be *c, int64_t n_tok)
{
    if (n_tok <= c->cap_tok) return KVB_OK;
    const struct model_hparams *hp = &c->m->hp;
    const int64_t e = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    KVB_FORWARD_IF_ERROR(grow(&c->x, n_tok * e));
    KVB_FORWARD_IF_ERROR(grow(&c->q, n_tok * qd));
    KVB_FORWARD_IF_ERROR(grow(&c->k, n_tok * c->kv_dim));
    KVB_FORWARD_IF_ERROR(grow(&c->v, n_tok * c->kv_dim));
    KVB_FORWARD_IF_ERROR(grow(&c->att, n_tok * qd));
    KVB_FORWARD_IF_ERROR(grow(&c->tmp, n_tok * (e > qd ? e : qd)));
    KVB_FORWARD_IF_ERROR(grow(&c->gate, n_tok * hp->n_ff));
    KVB_FORWARD_IF_ERROR(grow(&c->up, n_tok * hp->n_ff));
    int32_t *pp = kvb_realloc(c->tok_pos, sizeof(int32_t) * (size_t)n_tok);
    if (!pp) return KVB_ERR_NOMEM;
    c->tok_pos = pp;
    int32_t *ps = kvb_realloc(c->tok_seq, sizeof(int32_t) * (size_t)n_tok);
    if (!ps) return KVB_ERR_NOMEM;
    c->tok_seq = ps;
    int32_t *po = kvb_realloc(c->tile_order, sizeof(int32_t) * (size_t)n_tok);
    if (!po) return KVB_ERR_NOMEM;
    c->tile_order = po;
    c->cap_tok = n_tok;
    return KVB_OK;
}

/* ---- attention, parallel over (tile of tokens, KV head) ---------------------- */

/* Tokens per attention tile: enough that a shared prefix block is fetched
 * once for many tokens, few enough that the tile's scores stay in L2 and a
 * decode step of 32 sequences still splits into work for every thread. */
#define ATTN_TILE 16

struct seq_key {
    const int32_t *table;
    int32_t n_blocks, idx;
    int64_t start; /* its first token in the step */
};

/* Lexicographic on the block table: sequences that share prefix blocks end
 * up next to each other, so they land in the same tiles. */
static int seq_key_cmp(const void *pa, const void *pb)
{
    const struct seq_key *a = pa, *b = pb;
    const int32_t n = a->n_blocks < b->n_blocks ? a->n_blocks : b->n_blocks;
    for (int32_t i = 0; i < n; i++)
        if (a->table[i] != b->table[i]) return a->table[i] < b->table[i] ? -1 : 1;
    if (a->n_blocks != b->n_blocks) return a->n_blocks < b->n_blocks ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Orders the step's tokens for tiling (c->tile_order) and cuts the order
 * into c->n_tiles tiles of near-equal size. Only which tokens share a tile
 * depends on this; no token's arithmetic does. */
static enum kvb_status plan_tiles(struct cpu_be *c, const struct be_batch *batch, int64_t n_tok)
{
    if (batch->n_seqs > c->cap_keys) {
        struct seq_key *k = kvb_realloc(c->keys, sizeof *k * (size_t)batch->n_seqs);
        if (!k) return KVB_ERR_NOMEM;
        c->keys = k;
        c->cap_keys = batch->n_seqs;
    }
    int64_t t = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        c->keys[i] = (struct seq_key){batch->seqs[i].block_table, batch->seqs[i].n_blocks, i, t};
        t += batch->seqs[i].n_tokens;
    }
    qsort(c->keys, (size_t)batch->n_seqs, sizeof *c->keys, seq_key_cmp);
    int64_t o = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++)
        for (int32_t j = 0; j < batch->seqs[c->keys[i].idx].n_tokens; j++)
            c->tile_order[o++] = (int32_t)(c->keys[i].start + j);
    c->n_tiles = (n_tok + ATTN_TILE - 1) / ATTN_TILE;
    return KVB_OK;
}

struct attn_job {
    struct cpu_be *c;
    const struct be_batch *batch;
    int layer;
    int64_t n_tok;
    int64_t n_items;   /* tiles x KV heads */
    atomic_llong next; /* next item to take */
};

static void attn_worker(void *arg, int ith, int nth)
{
    (void)nth;
    struct attn_job *j = arg;
    struct cpu_be *c = j->c;
    const struct model_hparams *hp = &c->m->hp;
    const int32_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const float scale = c->m->ops.attn_scale;
    const int32_t window = c->m->layers[j->layer].swa ? c->m->ops.n_swa : 0;
    const int64_t lw = (int64_t)c->lindex[j->layer] * c->layer_words;
    const int32_t *gt = c->gtab + (int64_t)c->lgroup[j->layer] * c->n_tab;
    float *scratch = c->scores + (int64_t)ith * c->cap_scores;
    const int64_t bs = c->be.block_size;
    /* Items are taken first come, first served: under causal prefill later
     * tiles cost more, and which thread runs an item cannot change its
     * result. */
    for (int64_t it; (it = atomic_fetch_add(&j->next, 1)) < j->n_items;) {
        const int64_t tile = it / hp->n_head_kv;
        const int32_t g = (int32_t)(it % hp->n_head_kv);
        const int64_t lo = j->n_tok * tile / c->n_tiles, hi = j->n_tok * (tile + 1) / c->n_tiles;
        struct attn_kv_view view = {
            .k_base = c->kv + lw + (int64_t)g * c->k_head_words,
            .v_base = c->kv + lw + bs * c->k_row_words + (int64_t)g * c->v_head_words,
            .block_stride = c->page_words,
            .row_stride = c->k_row_words,
            .v_row_stride = c->v_row_words,
            .block_size = (int32_t)bs,
            .type = c->be.kv_type,
            .softcap = c->m->ops.attn_softcap,
        };
        struct attn_tile_tok toks[ATTN_TILE];
        for (int64_t i = lo; i < hi; i++) {
            const int64_t t = c->tile_order[i];
            const int64_t off = t * hp->n_head * hd + (int64_t)g * group * hd;
            const int32_t p_lo = window > 0 && c->tok_pos[t] + 1 > window ? c->tok_pos[t] + 1 - window : 0;
            toks[i - lo] = (struct attn_tile_tok){c->q + off, c->att + off, gt + c->seq_tab[c->tok_seq[t]],
                                                  c->tok_pos[t] + 1, p_lo};
        }
        if (c->avx512) {
            attn_tile_avx512(toks, (int32_t)(hi - lo), group, hd, &view, scale, scratch);
            continue;
        }
        if (c->simd) {
            attn_tile_avx2(toks, (int32_t)(hi - lo), group, hd, &view, scale, scratch);
            continue;
        }
        for (int64_t i = 0; i < hi - lo; i++) {
            view.table = toks[i].table;
            for (int32_t h = 0; h < group; h++)
                attn_head(toks[i].out + (int64_t)h * hd, toks[i].q + (int64_t)h * hd, hd, &view, toks[i].p_lo,
                          toks[i].n_pos, scale, scratch);
        }
    }
}

/* One layer's attention over the pool. Splitting a KV head's query heads
 * across threads when there are few items (a batch-1 decode has 3 items
 * for 2 threads) was tried: the duplicated K transposes cost more than the
 * better balance gained (decode 156-159 vs 162-164 tok/s). */
static void attn_run(struct cpu_be *c, const struct be_batch *batch, int layer, int64_t n_tok)
{
    struct attn_job job = {c, batch, layer, n_tok, c->n_tiles * c->m->hp.n_head_kv, 0};
    tpool_run(c->pool, attn_worker, &job);
}

/* ---- forward ------------------------------------------------------------------ */

/* ---- per-token work around the matrix products -------------------------------- */

/* Below this many tokens a step's per-token preparation runs on the calling
 * thread: a pool run costs more than it saves. */
#define PAR_PREP_MIN_TOK 8

/* The input of Q/K/V or gate/up for token t: first the pending residual
 * (add: the previous product's rows, or NULL; RMSNormed with `post` first
 * when the layer has a post-attention / post-FFN norm, then times the
 * residual scale when the model has one), then RMSNorm (or the row as it
 * is, for a layer without pre-norms). Runs on the matmul's threads
 * (mm_set_input_fn); token t's rows are its own. */
struct norm_in {
    struct cpu_be *c;
    const float *norm; /* (e), or NULL: no pre-norm */
    float *add;        /* (n_tok, e) or NULL */
    const float *post; /* (e) or NULL */
    int32_t e;
    float eps;
    float scale; /* model_ops.resid_scale (0: none) */
};

/* x[t] += add[t], normalised by post first when there is one and scaled
 * when scale is not 0: transformers' residual + post(out) * multiplier. */
static void add_residual(float *xt, float *add_t, const float *post, float scale, int32_t e, float eps)
{
    if (post) attn_rmsnorm(add_t, add_t, post, e, eps);
    if (scale != 0.0f)
        for (int32_t i = 0; i < e; i++) add_t[i] *= scale;
    for (int32_t i = 0; i < e; i++) xt[i] += add_t[i];
}

static void make_norm_row(void *arg, int64_t t, float *dst)
{
    const struct norm_in *a = arg;
    float *xt = a->c->x + t * a->e;
    if (a->add) add_residual(xt, a->add + t * a->e, a->post, a->scale, a->e, a->eps);
    if (a->norm) attn_rmsnorm(dst, xt, a->norm, a->e, a->eps);
    else memcpy(dst, xt, sizeof(float) * (size_t)a->e);
}

/* The input of the down projection for token t: the gate's activation
 * times up (SwiGLU or GeGLU: model_ops.act), element by element, so a row
 * alone gives the same bits. */
struct swiglu_in {
    struct cpu_be *c;
    int64_t n_ff;
};

static void make_swiglu_row(void *arg, int64_t t, float *dst)
{
    const struct swiglu_in *a = arg;
    float *g = a->c->gate + t * a->n_ff;
    const float *u = a->c->up + t * a->n_ff;
    if (a->c->m->ops.act == MODEL_ACT_GELU_TANH) {
        if (a->c->simd) attn_geglu_avx2(g, u, a->n_ff);
        else attn_geglu(g, u, a->n_ff);
    } else {
        if (a->c->simd) attn_swiglu_avx2(g, u, a->n_ff);
        else attn_swiglu(g, u, a->n_ff);
    }
    memcpy(dst, g, sizeof(float) * (size_t)a->n_ff);
}

/* After Q, K and V: biases, Q/K norms, RoPE, and the token's K and V into its
 * KV slot (before attention, so tokens of one step see each other
 * causally). Each token's rows and slot are its own: tokens split freely. */
struct prep_job {
    struct cpu_be *c;
    const struct be_batch *batch;
    const struct model_layer *L;
    int layer;
};

static void prep_tokens(const struct prep_job *j, int64_t t0, int64_t t1)
{
    struct cpu_be *c = j->c;
    const struct model_hparams *hp = &c->m->hp;
    const struct model_layer *L = j->L;
    const int64_t hd = hp->head_dim, qd = (int64_t)hp->n_head * hd, kvd = c->kv_dim, bs = c->be.block_size;
    for (int64_t t = t0; t < t1; t++) {
        float *qt = c->q + t * qd, *kt = c->k + t * kvd, *vt = c->v + t * kvd;
        if (L->bq) {
            for (int64_t i = 0; i < qd; i++) qt[i] += L->bq[i];
            for (int64_t i = 0; i < kvd; i++) kt[i] += L->bk[i];
            for (int64_t i = 0; i < kvd; i++) vt[i] += L->bv[i];
        }
        if (L->q_norm && c->m->ops.qk_norm_whole) {
            attn_rmsnorm(qt, qt, L->q_norm, (int32_t)qd, hp->rms_eps);
            attn_rmsnorm(kt, kt, L->k_norm, (int32_t)kvd, hp->rms_eps);
        } else if (L->q_norm) {
            for (int32_t h = 0; h < hp->n_head; h++)
                attn_rmsnorm(qt + h * hd, qt + h * hd, L->q_norm, (int32_t)hd, hp->rms_eps);
            for (int32_t h = 0; h < hp->n_head_kv; h++)
                attn_rmsnorm(kt + h * hd, kt + h * hd, L->k_norm, (int32_t)hd, hp->rms_eps);
        }
        /* Windowed layers rotate with their own, unscaled frequencies
         * (unless the model rotates every layer alike). */
        const bool own = L->swa && !c->m->ops.swa_same_rope;
        const float *inv_freq = own ? c->inv_freq_swa : c->inv_freq;
        const float mscale = own ? 1.0f : c->m->rope.mscale;
        attn_rope(qt, hp->n_head, (int32_t)hd, hp->rope_dim, hp->rope, c->tok_pos[t], inv_freq, mscale);
        attn_rope(kt, hp->n_head_kv, (int32_t)hd, hp->rope_dim, hp->rope, c->tok_pos[t], inv_freq, mscale);
        const int32_t p = c->tok_pos[t];
        const int32_t *gt = c->gtab + (int64_t)c->lgroup[j->layer] * c->n_tab + c->seq_tab[c->tok_seq[t]];
        uint16_t *lay = c->kv + (int64_t)gt[p / bs] * c->page_words + (int64_t)c->lindex[j->layer] * c->layer_words;
        uint16_t *kd = lay + (p % bs) * c->k_row_words;
        uint16_t *vd = lay + bs * c->k_row_words + (p % bs) * c->v_row_words;
        /* The reference conversion itself (for f16, kvb_f32_to_fp16_n): a
         * row's bytes are a pure function of its values, whoever writes it. */
        kv_quantize_row(kv_k_rows(c->be.kv_type), kd, kt, kvd);
        kv_quantize_row(kv_v_rows(c->be.kv_type), vd, vt, kvd);
    }
}

static void prep_worker(void *arg, int ith, int nth)
{
    const struct prep_job *j = arg;
    int64_t n = 0;
    for (int32_t i = 0; i < j->batch->n_seqs; i++) n += j->batch->seqs[i].n_tokens;
    prep_tokens(j, n * ith / nth, n * (ith + 1) / nth);
}

/* Page of group g of block b. */
static inline int32_t page_of(const struct cpu_be *c, int32_t b, int32_t g)
{
    return c->map ? c->map[(int64_t)b * c->be.n_groups + g] : b;
}

/* The step's page tables: for each group, each sequence's blocks' pages
 * (with one group, the blocks themselves). */
static enum kvb_status step_tables(struct cpu_be *c, const struct be_batch *batch, int64_t n_tab)
{
    const int32_t G = c->be.n_groups;
    if (n_tab > c->cap_tab) {
        int32_t *t = kvb_realloc(c->gtab, sizeof(int32_t) * (size_t)(n_tab * G));
        if (!t) return KVB_ERR_NOMEM;
        c->gtab = t;
        c->cap_tab = n_tab;
    }
    int32_t *st = kvb_realloc(c->seq_tab, sizeof(int32_t) * (size_t)(batch->n_seqs ? batch->n_seqs : 1));
    if (!st) return KVB_ERR_NOMEM;
    c->seq_tab = st;
    c->n_tab = n_tab;
    int64_t off = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *s = &batch->seqs[i];
        c->seq_tab[i] = (int32_t)off;
        for (int32_t g = 0; g < G; g++)
            for (int32_t b = 0; b < s->n_blocks; b++) c->gtab[g * n_tab + off + b] = page_of(c, s->block_table[b], g);
        off += s->n_blocks;
    }
    return KVB_OK;
}

static enum kvb_status cpu_forward(struct backend *be, const struct be_batch *batch, float *logits, struct kvb_err *err)
{
    struct cpu_be *c = (struct cpu_be *)be;
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd, hd = hp->head_dim;
    const int64_t bs = be->block_size;
    struct be_batch_shape sh;
    KVB_FORWARD_IF_ERROR(be_batch_check(be, hp->n_vocab, batch, &sh, err));
    if (c->enc) return cpu_enc_forward(c->enc, batch, err);
    const int64_t n_tok = sh.n_tok, n_out = sh.n_out;
    const int32_t max_pos = sh.max_end;
    if (n_tok == 0) return KVB_OK;
    if (ensure_tokens(c, n_tok) != KVB_OK)
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for a %lld-token step", (long long)n_tok);
    /* Per thread: a tile's attention scratch (the scalar path needs less). */
    const int64_t need_scores =
        attn_tile_scratch_floats(ATTN_TILE, hp->n_head / hp->n_head_kv, (int32_t)hd, max_pos, (int32_t)bs);
    if (need_scores > c->cap_scores) {
        if (grow(&c->scores, need_scores * tpool_size(c->pool)) != KVB_OK)
            return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for attention scores");
        c->cap_scores = need_scores;
    }
    if (n_out > c->cap_out) {
        if (grow(&c->out_rows, n_out * e) != KVB_OK) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
        c->cap_out = n_out;
    }

    /* Embeddings and per-token bookkeeping. */
    int64_t t = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *s = &batch->seqs[i];
        for (int32_t j = 0; j < s->n_tokens; j++, t++) {
            c->tok_pos[t] = s->pos + j;
            c->tok_seq[t] = i;
            float *xt = c->x + t * e;
            KVB_FORWARD_IF_ERROR(model_embed(m, s->tokens[j], xt));
            if (m->ops.embd_scale != 1.0f)
                for (int64_t k = 0; k < e; k++) xt[k] *= m->ops.embd_scale;
        }
    }

    if (plan_tiles(c, batch, n_tok) != KVB_OK || step_tables(c, batch, sh.n_tab) != KVB_OK)
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");

    struct prep_job prep = {c, batch, NULL, 0};
    struct norm_in nin = {c, NULL, NULL, NULL, (int32_t)e, hp->rms_eps, m->ops.resid_scale};
    struct swiglu_in sin = {c, hp->n_ff};
    for (int l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct cpu_layer_w *W = &c->lw[l];
        /* The previous layer's FFN output (in tmp) is added to the residual
         * as each token's normalised row is made for Q, K and V. */
        nin.norm = L->attn_norm;
        nin.add = l > 0 ? c->tmp : NULL;
        nin.post = l > 0 ? m->layers[l - 1].post_ffn_norm : NULL;
        KVB_FORWARD_IF_ERROR(mm_set_input_fn(c->mm, e, n_tok, make_norm_row, &nin));
        /* Q, K and V in one pool run: fewer thread hand-offs per token. */
        const struct mm_weight *qkv_w[3] = {&W->wq, &W->wk, &W->wv};
        float *const qkv_y[3] = {c->q, c->k, c->v};
        KVB_FORWARD_IF_ERROR(mm_apply_n(c->mm, qkv_w, qkv_y, 3));
        prep.L = L;
        prep.layer = l;
        if (n_tok >= PAR_PREP_MIN_TOK) tpool_run(c->pool, prep_worker, &prep);
        else prep_tokens(&prep, 0, n_tok);
        attn_run(c, batch, l, n_tok);
        KVB_FORWARD_IF_ERROR(mm_matmul(c->mm, &W->wo, c->att, n_tok, c->tmp));

        nin.norm = L->ffn_norm;
        nin.add = c->tmp;
        nin.post = L->post_attn_norm;
        if (L->moe) { /* the experts take the normalised rows as they are made */
            KVB_FORWARD_IF_ERROR(cpu_moe_forward(c->moe, l, n_tok, make_norm_row, &nin, c->tmp, err));
            continue;
        }
        KVB_FORWARD_IF_ERROR(mm_set_input_fn(c->mm, e, n_tok, make_norm_row, &nin));
        const struct mm_weight *gu_w[2] = {&W->w_gate, &W->w_up};
        float *const gu_y[2] = {c->gate, c->up};
        KVB_FORWARD_IF_ERROR(mm_apply_n(c->mm, gu_w, gu_y, 2));
        KVB_FORWARD_IF_ERROR(mm_set_input_fn(c->mm, hp->n_ff, n_tok, make_swiglu_row, &sin));
        KVB_FORWARD_IF_ERROR(mm_apply(c->mm, &W->w_down, c->tmp));
    }
    const float *last_post = m->layers[hp->n_layer - 1].post_ffn_norm;
    for (int64_t i = 0; i < n_tok; i++)
        add_residual(c->x + i * e, c->tmp + i * e, last_post, m->ops.resid_scale, (int32_t)e, hp->rms_eps);

    /* Final norm and output head, only for the rows whose logits are wanted;
     * hidden-state rows (pooling) are the same normalised rows, written
     * out instead of going through the head. */
    int64_t r = 0, hr = 0;
    t = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *s = &batch->seqs[i];
        for (int32_t j = 0; j < s->n_tokens; j++, t++) {
            const bool last = j == s->n_tokens - 1;
            bool want = s->logits == BE_LOGITS_ALL || (s->logits == BE_LOGITS_LAST && last);
            if (want) attn_rmsnorm(c->out_rows + (r++) * e, c->x + t * e, m->output_norm, (int32_t)e, hp->rms_eps);
            bool hidden = s->logits == BE_HIDDEN_ALL || (s->logits == BE_HIDDEN_LAST && last);
            if (hidden) attn_rmsnorm(batch->hidden + (hr++) * e, c->x + t * e, m->output_norm, (int32_t)e, hp->rms_eps);
        }
    }
    if (n_out > 0) KVB_FORWARD_IF_ERROR(mm_matmul(c->mm, &c->output, c->out_rows, n_out, logits));
    const float div = m->ops.logit_div;
    if (div != 0.0f)
        for (int64_t i = 0; i < n_out * hp->n_vocab; i++) logits[i] /= div;
    const float cap = m->ops.final_softcap;
    if (cap > 0)
        for (int64_t i = 0; i < n_out * hp->n_vocab; i++) logits[i] = attn_softcap_ref(logits[i], cap);
    return KVB_OK;
}

static void cpu_host_parallel(struct backend *be, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    tpool_run(((struct cpu_be *)be)->pool, fn, arg);
}

/* A block's pages in group order, out of (to_pool false) or into the pool. */
static enum kvb_status block_copy(struct cpu_be *c, int32_t block, void *host, bool to_pool)
{
    if (block < 0 || block >= c->be.n_logical || !c->kv) return KVB_ERR_INVALID_ARG; /* an encoder has no pool */
    for (int32_t g = 0; g < c->be.n_groups; g++)
        if (page_of(c, block, g) < 0) return KVB_ERR_INVALID_ARG;
    for (int32_t g = 0; g < c->be.n_groups; g++) {
        uint16_t *page = c->kv + (int64_t)page_of(c, block, g) * c->page_words;
        char *h = (char *)host + (size_t)g * (size_t)c->be.page_bytes;
        if (to_pool) memcpy(page, h, (size_t)c->be.page_bytes);
        else memcpy(h, page, (size_t)c->be.page_bytes);
    }
    return KVB_OK;
}

static enum kvb_status cpu_block_read(struct backend *be, int32_t block, void *dst)
{
    return block_copy((struct cpu_be *)be, block, dst, false);
}

static enum kvb_status cpu_block_write(struct backend *be, int32_t block, const void *src)
{
    return block_copy((struct cpu_be *)be, block, (void *)src, true);
}

static void cpu_kv_map(struct backend *be, int32_t block, const int32_t *pages)
{
    struct cpu_be *c = (struct cpu_be *)be;
    if (!c->map || block < 0 || block >= be->n_logical) return;
    memcpy(c->map + (int64_t)block * be->n_groups, pages, sizeof(int32_t) * (size_t)be->n_groups);
}

/* One weight into the form the kernels read; a new buffer is kept, and the
 * file's copy leaves resident memory (read again only if something else,
 * such as the CUDA backend's upload, touches it): the model is held once,
 * not twice. */
static enum kvb_status pack_one(struct cpu_be *c, const struct mm_weight *w, struct mm_weight *out)
{
    void *owned = NULL;
    if (!w->data) { /* not bound: a MoE layer's dense FFN */
        *out = *w;
        return KVB_OK;
    }
    KVB_FORWARD_IF_ERROR(mm_pack_weight(c->mm, w, out, &owned));
    if (owned) {
        c->packed[c->n_packed++] = owned;
        gguf_release_pages(c->m->gguf, w->data, (size_t)w->n_out * w->row_bytes);
    }
    return KVB_OK;
}

/* The model's matrices stay as mapped from the GGUF file (the CUDA backend
 * and the embedding lookup read those); the CPU kernels get packed copies,
 * made once here (about the size of the model, in a fraction of a second). */
static enum kvb_status pack_weights(struct cpu_be *c)
{
    const struct model *m = c->m;
    const int n_layer = m->hp.n_layer;
    c->lw = kvb_calloc((size_t)n_layer, sizeof *c->lw);
    c->packed = kvb_calloc((size_t)n_layer * 7 + 1, sizeof *c->packed);
    if (!c->lw || !c->packed) return KVB_ERR_NOMEM;
    for (int l = 0; l < n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        struct cpu_layer_w *W = &c->lw[l];
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->wq, &W->wq));
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->wk, &W->wk));
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->wv, &W->wv));
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->wo, &W->wo));
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->w_gate, &W->w_gate));
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->w_up, &W->w_up));
        KVB_FORWARD_IF_ERROR(pack_one(c, &L->w_down, &W->w_down));
    }
    return pack_one(c, &m->output, &c->output);
}

/* Whether some matrix of m is F16 or BF16: under the amx kernels those run
 * on BF16 tiles, whose results are not the other kernel sets' bits
 * (matmul_bf16_amx.c), so the store must keep them apart. Every matrix the
 * kernels read is looked at (a vector-shaped one, such as a router, too:
 * erring towards a separate key costs only a cache miss). */
static bool has_bf16_tile_weights(const struct model *m)
{
#define BF16_TILED(w) ((w).data && ((w).type == GGML_TYPE_F16 || (w).type == GGML_TYPE_BF16))
    if (BF16_TILED(m->output) || BF16_TILED(m->cls) || BF16_TILED(m->cls_out)) return true;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        if (BF16_TILED(L->wq) || BF16_TILED(L->wk) || BF16_TILED(L->wv) || BF16_TILED(L->wo) || BF16_TILED(L->w_gate) ||
            BF16_TILED(L->w_up) || BF16_TILED(L->w_down) || BF16_TILED(L->w_router) || BF16_TILED(L->w_gate_exps) ||
            BF16_TILED(L->w_up_exps) || BF16_TILED(L->w_down_exps) || BF16_TILED(L->w_shexp_gate) ||
            BF16_TILED(L->w_gate_shexp) || BF16_TILED(L->w_up_shexp) || BF16_TILED(L->w_down_shexp))
            return true;
    }
    return false;
#undef BF16_TILED
}

enum kvb_status be_cpu_create(const struct model *m, const struct be_cpu_opts *opts, struct backend **out,
                              struct kvb_err *err)
{
    if (opts->block_size <= 0 || opts->n_blocks <= 0)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "block size %d and block count %d must be positive", opts->block_size,
                        opts->n_blocks);
    KVB_FORWARD_IF_ERROR(kv_type_check(opts->kv_type, m->hp.head_dim, err));
    enum mm_impl impl; /* AUTO resolved (KVBATCH_KERNELS or the best), so attention follows the matmuls */
    KVB_FORWARD_IF_ERROR(mm_impl_resolve(opts->impl, &impl, err));
    struct cpu_be *c = kvb_calloc(1, sizeof *c);
    if (!c) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    const struct model_hparams *hp = &m->hp;
    c->m = m;
    c->be.name = "cpu";
    c->be.impl = c;
    c->be.forward = cpu_forward;
    c->be.free = cpu_free;
    c->be.host_parallel = cpu_host_parallel;
    c->be.kv_block_read = cpu_block_read;
    c->be.kv_block_write = cpu_block_write;
    c->be.block_size = opts->block_size;
    c->be.n_blocks = opts->n_blocks;
    c->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    c->simd = impl != MM_IMPL_SCALAR && attn_have_avx2();
    c->avx512 = c->simd && impl != MM_IMPL_AVX2 && attn_have_avx512();
    c->be.block_bytes = be_block_bytes(m, opts->block_size, opts->kv_type);
    be_paging_init(&c->be, m, opts->n_blocks, opts->kv_type);
    c->be.kv_map = cpu_kv_map;
    c->page_words = c->be.page_bytes / 2;
    c->k_row_words = kv_row_bytes(kv_k_rows(opts->kv_type), c->kv_dim) / 2;
    c->v_row_words = kv_row_bytes(kv_v_rows(opts->kv_type), c->kv_dim) / 2;
    c->k_head_words = kv_row_bytes(kv_k_rows(opts->kv_type), hp->head_dim) / 2;
    c->v_head_words = kv_row_bytes(kv_v_rows(opts->kv_type), hp->head_dim) / 2;
    c->layer_words = (int64_t)opts->block_size * (c->k_row_words + c->v_row_words);
    c->be.kv_type = opts->kv_type;
    enum kvb_status st = tpool_create(opts->n_threads, &c->pool);
    if (st != KVB_OK) {
        cpu_free(&c->be);
        return kvb_errf(err, st, "cannot start %d threads", opts->n_threads);
    }
    st = mm_ctx_create(c->pool, impl, &c->mm, err);
    if (st != KVB_OK) {
        cpu_free(&c->be);
        return st;
    }
    c->be.kernels = mm_ctx_impl_name(c->mm);
    /* The kernel sets give different bits (their sums run in other orders;
     * amx is avx512's bits except on F16/BF16 matrices, has_bf16_tile_weights),
     * so the persistent store keys each apart. avx512's is the unnamed one: the
     * keys caches had before the store knew of arithmetics. */
    const bool a16 = opts->act16;
    switch (impl) {
    case MM_IMPL_SCALAR: c->be.arith = a16 ? "cpu scalar act16" : "cpu scalar"; break;
    case MM_IMPL_AVX2: c->be.arith = a16 ? "cpu avx2 act16" : "cpu avx2"; break;
    case MM_IMPL_AMX:
        c->be.arith =
            has_bf16_tile_weights(m) ? (a16 ? "cpu amx bf16 act16" : "cpu amx bf16") : (a16 ? "cpu act16" : NULL);
        break;
    default: c->be.arith = a16 ? "cpu act16" : NULL; break;
    }
    mm_ctx_set_act16(c->mm, a16);
    c->be.act_bits = a16 ? 16 : 8;
    c->be.n_threads = tpool_size(c->pool);
    if (m->ops.encoder) { /* its own pass, which keeps K and V to itself: no pool */
        st = cpu_enc_create(m, c->pool, c->mm, &c->enc, err);
        if (st != KVB_OK) {
            cpu_free(&c->be);
            return st;
        }
        *out = &c->be;
        return KVB_OK;
    }
    st = pack_weights(c);
    if (st != KVB_OK) {
        cpu_free(&c->be);
        return kvb_errf(err, st, "cannot rearrange the weights for the %s kernels (out of memory)",
                        mm_ctx_impl_name(c->mm));
    }
    if (m->ops.moe.n_expert > 0) {
        st = cpu_moe_create(m, c->mm, c->pool, c->simd, &c->moe, err);
        if (st != KVB_OK) {
            cpu_free(&c->be);
            return st;
        }
    }
    size_t kv_bytes = (size_t)c->be.block_bytes * (size_t)opts->n_blocks;
    c->kv = kvb_aligned_alloc(64, kv_bytes);
    struct be_kv_layout lo;
    be_kv_layout(m, opts->block_size, opts->kv_type, &lo);
    c->lgroup = kvb_malloc(sizeof(int32_t) * (size_t)hp->n_layer);
    c->lindex = kvb_malloc(sizeof(int32_t) * (size_t)hp->n_layer);
    bool map_ok = true;
    if (lo.n_groups > 1) {
        c->map = kvb_malloc(sizeof(int32_t) * (size_t)c->be.n_logical * (size_t)lo.n_groups);
        map_ok = c->map != NULL;
        for (int64_t i = 0; map_ok && i < (int64_t)c->be.n_logical * lo.n_groups; i++)
            c->map[i] = i < (int64_t)c->be.n_pages ? (int32_t)i : -1;
    }
    for (int32_t l = 0; c->lgroup && c->lindex && l < hp->n_layer; l++)
        be_layer_group(m, &lo, l, &c->lgroup[l], &c->lindex[l]);
    if (!c->lgroup || !c->lindex || !map_ok) {
        cpu_free(&c->be);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    c->inv_freq = kvb_malloc(sizeof(float) * (size_t)(hp->rope_dim / 2 + 1));
    c->inv_freq_swa = kvb_malloc(sizeof(float) * (size_t)(hp->rope_dim / 2 + 1));
    if (!c->kv || !c->inv_freq || !c->inv_freq_swa) {
        cpu_free(&c->be);
        return kvb_errf(err, KVB_ERR_NOMEM, "cannot allocate %zu MiB of KV cache (lower --kv-mem or the context)",
                        kv_bytes >> 20);
    }
    model_rope_freqs(m, c->inv_freq);
    model_rope_freqs_swa(m, c->inv_freq_swa);
    *out = &c->be;
    return KVB_OK;
}

const char *be_cpu_impl_name(const struct backend *be) { return mm_ctx_impl_name(((const struct cpu_be *)be)->mm); }
