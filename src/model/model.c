/* model.c — binds GGUF tensors and metadata to struct model (see model.h). */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "model/arch.h"
#include "model/model_internal.h"

/* What model_load keeps while it binds: the tensors bound so far, so that
 * model_check can name any tensor of the file that was not. */
struct model_load_state {
    const struct gguf_tensor **bound;
    uint64_t n_bound, cap;
    bool survey; /* model_survey: a tensor's type is reported apart, not here */
};

static enum kvb_status get_hp_u32(const struct gguf_file *f, const char *arch, const char *suffix, bool required,
                                  uint32_t dflt, int32_t *out, struct kvb_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v = dflt;
    enum kvb_status st = gguf_get_u32(f, key, &v, err);
    if (st == KVB_ERR_NOT_FOUND) {
        if (required) return kvb_errf(err, KVB_ERR_FORMAT, "model is missing required key '%s'", key);
        v = dflt;
    } else if (st != KVB_OK) {
        return st;
    }
    if (v > INT32_MAX) return kvb_errf(err, KVB_ERR_FORMAT, "key '%s' value %u is out of range", key, v);
    *out = (int32_t)v;
    return KVB_OK;
}

/* Looks up `name`; checks its shape is (ne0, ne1) (ne1 = 0 for 1-D). */
static enum kvb_status find_tensor(const struct model *m, const char *name, int64_t ne0, int64_t ne1, bool required,
                                   const struct gguf_tensor **out, struct kvb_err *err)
{
    const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    *out = NULL;
    if (!t) {
        if (!required) return KVB_OK;
        return kvb_errf(err, KVB_ERR_FORMAT, "model is missing tensor '%s'", name);
    }
    bool ok = (int64_t)t->ne[0] == ne0 && (ne1 == 0 ? t->n_dims == 1 || t->ne[1] == 1 : (int64_t)t->ne[1] == ne1);
    for (uint32_t d = 2; d < t->n_dims; d++) ok = ok && t->ne[d] == 1;
    if (!ok)
        return kvb_errf(err, KVB_ERR_FORMAT, "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)ne0,
                        (long long)(ne1 ? ne1 : 1));
    if (!quant_type_supported(t->type) && !(m->load && m->load->survey)) {
        const struct ggml_type_traits *tr = ggml_type_get_traits(t->type);
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "tensor '%s' has type %s, which kvbatch cannot compute with", name,
                        tr ? tr->name : "?");
    }
    struct model_load_state *ls = m->load;
    if (ls && ls->n_bound < ls->cap) ls->bound[ls->n_bound++] = t;
    *out = t;
    return KVB_OK;
}

static enum kvb_status bind_matrix(struct model *m, const char *name, int64_t n_in, int64_t n_out, bool required,
                                   struct mm_weight *w, struct kvb_err *err)
{
    const struct gguf_tensor *t;
    KVB_FORWARD_IF_ERROR(find_tensor(m, name, n_in, n_out, required, &t, err));
    memset(w, 0, sizeof *w);
    if (!t) return KVB_OK;
    uint64_t rb;
    if (!ggml_type_row_bytes(t->type, (uint64_t)n_in, &rb))
        return kvb_errf(err, KVB_ERR_FORMAT, "tensor '%s': row of %lld is not whole blocks", name, (long long)n_in);
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->data = t->data;
    w->row_bytes = (size_t)rb;
    w->packed = 0;
    m->weight_bytes += t->n_bytes;
    return KVB_OK;
}

/* The stacked matrices of n_expert experts, a 3-D tensor of shape
 * (n_in, n_out, n_expert), as one matrix of n_expert * n_out rows. */
static enum kvb_status bind_experts(struct model *m, const char *name, int64_t n_in, int64_t n_out, int64_t n_expert,
                                    struct mm_weight *w, struct kvb_err *err)
{
    const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) return kvb_errf(err, KVB_ERR_FORMAT, "model is missing tensor '%s'", name);
    if (t->ne[3] != 1 || (int64_t)t->ne[0] != n_in || (int64_t)t->ne[1] != n_out || (int64_t)t->ne[2] != n_expert)
        return kvb_errf(err, KVB_ERR_FORMAT, "tensor '%s' has shape [%llu, %llu, %llu], expected [%lld, %lld, %lld]",
                        name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (long long)n_in, (long long)n_out, (long long)n_expert);
    if (!quant_type_supported(t->type) && !(m->load && m->load->survey)) {
        const struct ggml_type_traits *tr = ggml_type_get_traits(t->type);
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "tensor '%s' has type %s, which kvbatch cannot compute with", name,
                        tr ? tr->name : "?");
    }
    uint64_t rb;
    if (!ggml_type_row_bytes(t->type, (uint64_t)n_in, &rb))
        return kvb_errf(err, KVB_ERR_FORMAT, "tensor '%s': row of %lld is not whole blocks", name, (long long)n_in);
    struct model_load_state *ls = m->load;
    if (ls && ls->n_bound < ls->cap) ls->bound[ls->n_bound++] = t;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out * n_expert;
    w->data = t->data;
    w->row_bytes = (size_t)rb;
    m->weight_bytes += t->n_bytes;
    return KVB_OK;
}

/* A norm weight, bias or frequency factor that is NaN or infinite makes
 * every logit so; cheap to refuse at load, where the message can name it. */
static enum kvb_status check_finite(const char *name, const float *v, int64_t n, struct kvb_err *err)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return kvb_errf(err, KVB_ERR_FORMAT, "tensor '%s' holds a non-finite value (%g at %lld)", name,
                            (double)v[i], (long long)i);
    return KVB_OK;
}

/* A vector the forward pass reads as f32: borrowed when stored as F32,
 * converted into a model-owned buffer otherwise. */
static enum kvb_status bind_vector(struct model *m, const char *name, int64_t n, bool required, const float **out,
                                   struct kvb_err *err)
{
    const struct gguf_tensor *t;
    *out = NULL;
    KVB_FORWARD_IF_ERROR(find_tensor(m, name, n, 0, required, &t, err));
    if (!t) return KVB_OK;
    m->weight_bytes += t->n_bytes;
    if (t->type == GGML_TYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        *out = t->data;
        return check_finite(name, *out, n, err);
    }
    void **no = kvb_realloc(m->owned, sizeof *no * (size_t)(m->n_owned + 1));
    if (!no) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory converting '%s'", name);
    m->owned = no;
    float *buf = kvb_malloc(sizeof(float) * (size_t)n);
    if (!buf) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory converting '%s'", name);
    m->owned[m->n_owned++] = buf;
    enum kvb_status st = quant_dequant_row(t->type, t->data, buf, n);
    if (st != KVB_OK) return kvb_errf(err, st, "cannot convert tensor '%s' to f32", name);
    *out = buf;
    return check_finite(name, buf, n, err);
}

static enum kvb_status load_hparams(struct model *m, struct kvb_err *err)
{
    const struct gguf_file *f = m->gguf;
    struct gguf_str arch;
    enum kvb_status st = gguf_get_str(f, "general.architecture", &arch, err);
    if (st == KVB_ERR_NOT_FOUND) return kvb_errf(err, KVB_ERR_FORMAT, "model has no 'general.architecture' key");
    KVB_FORWARD_IF_ERROR(st);
    m->arch = arch_find(arch.ptr, arch.len);
    if (!m->arch)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "architecture '%.*s' is not supported (kvbatch runs %s)",
                        (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, arch_names());
    const char *a = m->arch->name;
    struct model_hparams *hp = &m->hp;
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "embedding_length", true, 0, &hp->n_embd, err));
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "feed_forward_length", true, 0, &hp->n_ff, err));
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "block_count", true, 0, &hp->n_layer, err));
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "attention.head_count", true, 0, &hp->n_head, err));
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "attention.head_count_kv", false, (uint32_t)hp->n_head, &hp->n_head_kv, err));
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "context_length", false, 2048, &hp->n_ctx_train, err));
    if (hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->n_layer > 4096)
        return kvb_errf(err, KVB_ERR_FORMAT,
                        "implausible hyperparameters: embd %d ff %d layers %d heads %d kv heads %d", hp->n_embd,
                        hp->n_ff, hp->n_layer, hp->n_head, hp->n_head_kv);
    KVB_FORWARD_IF_ERROR(
        get_hp_u32(f, a, "attention.key_length", false, (uint32_t)(hp->n_embd / hp->n_head), &hp->head_dim, err));
    int32_t v_len;
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "attention.value_length", false, (uint32_t)hp->head_dim, &v_len, err));
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "rope.dimension_count", false, (uint32_t)hp->head_dim, &hp->rope_dim, err));
    if (hp->head_dim <= 0 || hp->head_dim % 2 || hp->rope_dim <= 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return kvb_errf(err, KVB_ERR_FORMAT,
                        "implausible head_dim %d / rope dims %d ('%s.attention.key_length', "
                        "'%s.rope.dimension_count')",
                        hp->head_dim, hp->rope_dim, a, a);
    if (v_len != hp->head_dim)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s.attention.value_length' = %d differs from the key length %d, which kvbatch "
                        "does not compute",
                        a, v_len, hp->head_dim);
    /* Partial rotary embedding: only where the architecture defines one
     * (phi3); elsewhere transformers rotates the whole head, so a shorter
     * count is a file kvbatch would compute differently from its authors. */
    if (hp->rope_dim != hp->head_dim && !m->arch->partial_rope)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s.rope.dimension_count' = %d: a partial rotary embedding (head size %d) is not "
                        "computed by kvbatch",
                        a, hp->rope_dim, hp->head_dim);
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.freq_base", 10000.0f, NULL, &hp->rope_base, err));
    /* Required, as llama.cpp requires it for these architectures: there is
     * no default the authors share (transformers' configs default to 1e-6,
     * kvbatch used to take 1e-5), and every converter writes it. */
    char eps_key[128];
    const char *eps_name = m->arch->encoder ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon";
    snprintf(eps_key, sizeof eps_key, "%s.%s", a, eps_name);
    if (!gguf_find(f, eps_key)) return kvb_errf(err, KVB_ERR_FORMAT, "model is missing required key '%s'", eps_key);
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, eps_name, 0.0f, NULL, m->arch->encoder ? &m->enc.ln_eps : &hp->rms_eps, err));
    hp->rope = m->arch->rope;
    /* What the description fixes; its read hook (after the weights' shapes
     * are known, see model_load) sets what the file's keys decide. */
    m->ops = (struct model_ops){
        .act = m->arch->act,
        .embd_scale = 1.0f,
        .attn_scale = 1.0f / sqrtf((float)hp->head_dim), /* the backends' expression, as it always was */
        .rope_base_swa = hp->rope_base,
        .qk_norm_whole = m->arch->qk_norm_whole,
        .encoder = m->arch->encoder,
    };
    m->layers = kvb_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    int32_t pooling;
    KVB_FORWARD_IF_ERROR(get_hp_u32(f, a, "pooling_type", false, MODEL_POOL_NONE, &pooling, err));
    if (pooling > MODEL_POOL_RANK)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "model key '%s.pooling_type' = %d is not a pooling kvbatch knows", a,
                        pooling);
    m->pooling = (enum model_pooling)pooling;
    return model_read_moe(m, err);
}

/* Rows [r0, r0 + n) of w, as a matrix of their own: how a fused tensor
 * (attn_qkv, phi3's gate-up ffn_up) becomes the layer's matrices. Rows of
 * every type are whole blocks, so a row range is a contiguous span. */
static struct mm_weight row_view(const struct mm_weight *w, int64_t r0, int64_t n)
{
    struct mm_weight v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.n_out = n;
    return v;
}

/* Layer l's Q, K and V: three tensors, or one attn_qkv where the
 * architecture writes it. */
static enum kvb_status bind_qkv(struct model *m, int l, struct model_layer *L, struct kvb_err *err)
{
    const struct model_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd, q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    char nm[96];
    snprintf(nm, sizeof nm, "blk.%d.attn_qkv.weight", l);
    if (m->arch->fused_qkv != ARCH_ABSENT &&
        (m->arch->fused_qkv == ARCH_REQUIRED || gguf_find_tensor(m->gguf, nm) != NULL)) {
        struct mm_weight w;
        KVB_FORWARD_IF_ERROR(bind_matrix(m, nm, e, q + 2 * kv, true, &w, err));
        L->wq = row_view(&w, 0, q);
        L->wk = row_view(&w, q, kv);
        L->wv = row_view(&w, q + kv, kv);
        return KVB_OK;
    }
    snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
    KVB_FORWARD_IF_ERROR(bind_matrix(m, nm, e, q, true, &L->wq, err));
    snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", l);
    KVB_FORWARD_IF_ERROR(bind_matrix(m, nm, e, kv, true, &L->wk, err));
    snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
    return bind_matrix(m, nm, e, kv, true, &L->wv, err);
}

/* Layer l's gate and up projections: two tensors, or (fused_gate_up) the
 * gate rows and then the up rows of ffn_up, as transformers' gate_up_proj
 * chunks them. */
static enum kvb_status bind_gate_up(struct model *m, int l, struct model_layer *L, struct kvb_err *err)
{
    const struct model_hparams *hp = &m->hp;
    char nm[96];
    snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", l);
    if (m->arch->fused_gate_up) {
        struct mm_weight w;
        KVB_FORWARD_IF_ERROR(bind_matrix(m, nm, hp->n_embd, 2 * (int64_t)hp->n_ff, true, &w, err));
        L->w_gate = row_view(&w, 0, hp->n_ff);
        L->w_up = row_view(&w, hp->n_ff, hp->n_ff);
        return KVB_OK;
    }
    char gn[96];
    snprintf(gn, sizeof gn, "blk.%d.ffn_gate.weight", l);
    KVB_FORWARD_IF_ERROR(bind_matrix(m, gn, hp->n_embd, hp->n_ff, true, &L->w_gate, err));
    return bind_matrix(m, nm, hp->n_embd, hp->n_ff, true, &L->w_up, err);
}

/* LongRoPE's two factor sets (one tensor each for every layer, as the
 * converter writes them); the short one until model_set_ctx says. */
static enum kvb_status bind_longrope(struct model *m, struct kvb_err *err)
{
    struct model_rope *r = &m->rope;
    const int32_t half = m->hp.rope_dim / 2;
    const bool req = m->arch->longrope == ARCH_REQUIRED;
    KVB_FORWARD_IF_ERROR(bind_vector(m, "rope_factors_long.weight", half, req, &r->factors_long, err));
    KVB_FORWARD_IF_ERROR(bind_vector(m, "rope_factors_short.weight", half, req, &r->factors_short, err));
    if ((r->factors_long != NULL) != (r->factors_short != NULL))
        return kvb_errf(err, KVB_ERR_FORMAT,
                        "model has one of 'rope_factors_long.weight' and "
                        "'rope_factors_short.weight' but not the other");
    if (!r->factors_long) return KVB_OK;
    if (r->freq_factors)
        return kvb_errf(err, KVB_ERR_FORMAT, "model has both 'rope_freqs.weight' and LongRoPE factors");
    char key[128];
    if (r->orig_ctx < 1)
        return kvb_errf(err, KVB_ERR_FORMAT, "LongRoPE factors need '%s', which the file does not have",
                        model_key(m, "rope.scaling.original_context_length", key, sizeof key));
    r->freq_factors = r->factors_short;
    r->long_factors = false;
    return KVB_OK;
}

/* A reranker's classification head (model.h), when the file has one. */
static enum kvb_status bind_cls_head(struct model *m, struct kvb_err *err)
{
    const int64_t e = m->hp.n_embd;
    KVB_FORWARD_IF_ERROR(bind_matrix(m, "cls.weight", e, e, false, &m->cls, err));
    KVB_FORWARD_IF_ERROR(bind_vector(m, "cls.bias", e, false, &m->cls_b, err));
    const struct gguf_tensor *co = gguf_find_tensor(m->gguf, "cls.output.weight");
    if (co) {
        if (co->ne[1] == 0 || co->ne[1] > 4096)
            return kvb_errf(err, KVB_ERR_FORMAT, "tensor 'cls.output.weight' has %llu rows",
                            (unsigned long long)co->ne[1]);
        m->n_cls_out = (int32_t)co->ne[1];
        KVB_FORWARD_IF_ERROR(bind_matrix(m, "cls.output.weight", e, m->n_cls_out, true, &m->cls_out, err));
        KVB_FORWARD_IF_ERROR(bind_vector(m, "cls.output.bias", m->n_cls_out, false, &m->cls_out_b, err));
    }
    if ((m->cls.data || m->cls_b) && !co)
        return kvb_errf(err, KVB_ERR_FORMAT, "model has tensor 'cls.weight' but no 'cls.output.weight'");
    if (m->cls_b && !m->cls.data) return kvb_errf(err, KVB_ERR_FORMAT, "model has 'cls.bias' but no 'cls.weight'");
    if (m->pooling == MODEL_POOL_RANK && !co) {
        char key[128];
        return kvb_errf(err, KVB_ERR_FORMAT,
                        "model key '%s' = rank (a reranker) but the file has no classification head "
                        "'cls.output.weight'",
                        model_key(m, "pooling_type", key, sizeof key));
    }
    return KVB_OK;
}

enum kvb_status model_bind_matrix(struct model *m, const char *name, int64_t n_in, int64_t n_out, bool required,
                                  struct mm_weight *w, struct kvb_err *err)
{
    return bind_matrix(m, name, n_in, n_out, required, w, err);
}

enum kvb_status model_bind_vector(struct model *m, const char *name, int64_t n, bool required, const float **out,
                                  struct kvb_err *err)
{
    return bind_vector(m, name, n, required, out, err);
}

static enum kvb_status load_weights(struct model *m, struct kvb_err *err)
{
    struct model_hparams *hp = &m->hp;
    const struct gguf_tensor *emb = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return kvb_errf(err, KVB_ERR_FORMAT, "model is missing tensor 'token_embd.weight'");
    if (emb->ne[1] == 0 || emb->ne[1] > INT32_MAX)
        return kvb_errf(err, KVB_ERR_FORMAT, "token_embd.weight has an implausible vocabulary size");
    hp->n_vocab = (int32_t)emb->ne[1];
    if (m->arch->bind) { /* a layout of its own (an encoder) */
        KVB_FORWARD_IF_ERROR(m->arch->bind(m, err));
        return bind_cls_head(m, err);
    }
    const int64_t e = hp->n_embd, q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    KVB_FORWARD_IF_ERROR(bind_matrix(m, "token_embd.weight", e, hp->n_vocab, true, &m->tok_embd, err));
    KVB_FORWARD_IF_ERROR(bind_vector(m, "output_norm.weight", e, true, &m->output_norm, err));
    if (m->arch->output != ARCH_ABSENT)
        KVB_FORWARD_IF_ERROR(
            bind_matrix(m, "output.weight", e, hp->n_vocab, m->arch->output == ARCH_REQUIRED, &m->output, err));
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;

    for (int l = 0; l < hp->n_layer; l++) {
        struct model_layer *L = &m->layers[l];
        char nm[96];
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        const struct arch_desc *d = m->arch;
        if (!d->no_pre_norms)
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_norm.weight"), e, true, &L->attn_norm, err));
        KVB_FORWARD_IF_ERROR(bind_qkv(m, l, L, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("attn_output.weight"), q, e, true, &L->wo, err));
        if (d->qkv_bias != ARCH_ABSENT) {
            bool req = d->qkv_bias == ARCH_REQUIRED;
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_q.bias"), q, req, &L->bq, err));
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_k.bias"), kv, req, &L->bk, err));
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_v.bias"), kv, req, &L->bv, err));
            /* The backends add all three or none. */
            if ((L->bq != NULL) != (L->bk != NULL) || (L->bq != NULL) != (L->bv != NULL))
                return kvb_errf(err, KVB_ERR_FORMAT, "layer %d has some of the Q/K/V biases but not all three", l);
        }
        if (d->qk_norm != ARCH_ABSENT) {
            bool req = d->qk_norm == ARCH_REQUIRED;
            const int64_t qn = d->qk_norm_whole ? q : hp->head_dim, kn = d->qk_norm_whole ? kv : hp->head_dim;
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_q_norm.weight"), qn, req, &L->q_norm, err));
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_k_norm.weight"), kn, req, &L->k_norm, err));
            if ((L->q_norm != NULL) != (L->k_norm != NULL))
                return kvb_errf(err, KVB_ERR_FORMAT, "layer %d has one of the Q/K norms but not the other", l);
        }
        if (d->post_norms != ARCH_ABSENT) {
            bool req = d->post_norms == ARCH_REQUIRED;
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("post_attention_norm.weight"), e, req, &L->post_attn_norm, err));
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("post_ffw_norm.weight"), e, req, &L->post_ffn_norm, err));
        }
        if (!d->no_pre_norms) KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("ffn_norm.weight"), e, true, &L->ffn_norm, err));
        const struct model_moe *moe = &m->ops.moe;
        L->moe = moe->n_expert > 0;
        if (L->moe) {
            const int64_t ne = moe->n_expert, fe = moe->n_ff_exp;
            KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_gate_inp.weight"), e, ne, true, &L->w_router, err));
            KVB_FORWARD_IF_ERROR(bind_experts(m, NAME("ffn_gate_exps.weight"), e, fe, ne, &L->w_gate_exps, err));
            KVB_FORWARD_IF_ERROR(bind_experts(m, NAME("ffn_up_exps.weight"), e, fe, ne, &L->w_up_exps, err));
            KVB_FORWARD_IF_ERROR(bind_experts(m, NAME("ffn_down_exps.weight"), fe, e, ne, &L->w_down_exps, err));
            if (moe->n_ff_shexp > 0) {
                const int64_t fs = moe->n_ff_shexp;
                KVB_FORWARD_IF_ERROR(
                    bind_matrix(m, NAME("ffn_gate_inp_shexp.weight"), e, 1, true, &L->w_shexp_gate, err));
                KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_gate_shexp.weight"), e, fs, true, &L->w_gate_shexp, err));
                KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_up_shexp.weight"), e, fs, true, &L->w_up_shexp, err));
                KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_down_shexp.weight"), fs, e, true, &L->w_down_shexp, err));
            }
        } else {
            KVB_FORWARD_IF_ERROR(bind_gate_up(m, l, L, err));
            KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_down.weight"), hp->n_ff, e, true, &L->w_down, err));
        }
#undef NAME
    }
    KVB_FORWARD_IF_ERROR(bind_vector(m, "rope_freqs.weight", hp->rope_dim / 2, false, &m->rope.freq_factors, err));
    if (m->arch->longrope != ARCH_ABSENT) KVB_FORWARD_IF_ERROR(bind_longrope(m, err));
    return bind_cls_head(m, err);
}

/* One set of per-frequency divisors (name: its tensor), as model_rope_freqs
 * would apply it. */
static enum kvb_status check_factor_set(const struct model *mm, const float *ff, const char *name, struct kvb_err *err)
{
    struct model view = *mm; /* the model computing with this set */
    view.rope.freq_factors = ff;
    const struct model *m = &view;
    const int32_t half = m->hp.rope_dim / 2;
    for (int32_t i = 0; ff && i < half; i++)
        if (!(ff[i] > 0))
            return kvb_errf(err, KVB_ERR_FORMAT, "tensor '%s' holds %g at %d; factors must be positive", name,
                            (double)ff[i], i);
    /* Each parameter can be positive and finite and their quotient not (a
     * factor of 1e-39 divides a frequency of 1 into inf): every angle, and
     * so every logit, would be NaN. Named here, with what produced it. */
    float inv_freq[4096], unfactored[4096];
    if (half > (int32_t)(sizeof inv_freq / sizeof inv_freq[0]))
        return kvb_errf(err, KVB_ERR_FORMAT, "implausible rope dims %d", m->hp.rope_dim);
    model_rope_freqs(m, inv_freq);
    struct model plain = *m; /* a view without the factors tensor, to tell which one is to blame */
    plain.rope.freq_factors = NULL;
    model_rope_freqs(&plain, unfactored);
    for (int32_t i = 0; i < half; i++) {
        if (isfinite(inv_freq[i])) continue;
        char key[128], key2[128];
        const char *fk = gguf_find(m->gguf, model_key(m, "rope.scaling.factor", key2, sizeof key2))
                             ? "rope.scaling.factor"
                             : "rope.scale_linear";
        if (ff && isfinite(unfactored[i]))
            return kvb_errf(err, KVB_ERR_FORMAT,
                            "tensor '%s' holds %g at %d, which gives that rotary pair a frequency of %g", name,
                            (double)ff[i], i, (double)inv_freq[i]);
        if (m->rope.type == ROPE_SCALING_NONE)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g gives rotary pair %d a frequency of %g",
                            model_key(m, "rope.freq_base", key, sizeof key), (double)m->hp.rope_base, i,
                            (double)inv_freq[i]);
        return kvb_errf(err, KVB_ERR_FORMAT, "model keys '%s' = %g and '%s' = %g give rotary pair %d a frequency of %g",
                        model_key(m, "rope.freq_base", key, sizeof key), (double)m->hp.rope_base,
                        model_key(m, fk, key2, sizeof key2), (double)m->rope.factor, i, (double)inv_freq[i]);
    }
    return KVB_OK;
}

static enum kvb_status check_freq_factors(const struct model *m, struct kvb_err *err)
{
    const struct model_rope *r = &m->rope;
    if (!r->factors_long) return check_factor_set(m, r->freq_factors, "rope_freqs.weight", err);
    KVB_FORWARD_IF_ERROR(check_factor_set(m, r->factors_short, "rope_factors_short.weight", err));
    return check_factor_set(m, r->factors_long, "rope_factors_long.weight", err);
}

/* Identity of the weights, independent of the file's path and metadata
 * order: what the persistent cache and the metrics key on. Hashing all the
 * bytes (~10 GB/s) costs little next to reading them for the first forward. */
static enum kvb_status compute_fingerprint(struct model *m)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st) return KVB_ERR_NOMEM;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, &m->hp, sizeof m->hp);
    /* Scaling is metadata, not weights, yet it changes every K: hashed when
     * present (field by field, no padding), so unscaled models keep the
     * fingerprint they always had. The factors tensor is hashed below. */
    const struct model_rope *r = &m->rope;
    if (r->type != ROPE_SCALING_NONE || r->mscale != 1.0f) {
        const uint32_t type = (uint32_t)r->type;
        const float fv[4] = {r->factor, r->beta_fast, r->beta_slow, r->mscale};
        XXH3_128bits_update(st, &type, sizeof type);
        XXH3_128bits_update(st, &r->orig_ctx, sizeof r->orig_ctx);
        XXH3_128bits_update(st, fv, sizeof fv);
    }
    /* Likewise what an architecture computes beyond the llama layer: hashed
     * only when it does (the llama, qwen2 and qwen3 fingerprints stay as
     * they were), field by field. */
    const struct model_ops *o = &m->ops;
    bool swa = false;
    for (int l = 0; l < m->hp.n_layer; l++) swa = swa || m->layers[l].swa;
    if (o->act != MODEL_ACT_SILU || o->embd_scale != 1.0f || o->attn_scale != 1.0f / sqrtf((float)m->hp.head_dim) ||
        o->attn_softcap != 0.0f || o->final_softcap != 0.0f || o->n_swa != 0 || swa) {
        const uint32_t act = (uint32_t)o->act;
        const int32_t iv[1] = {o->n_swa};
        const float fv[5] = {o->embd_scale, o->attn_scale, o->attn_softcap, o->final_softcap, o->rope_base_swa};
        XXH3_128bits_update(st, &act, sizeof act);
        XXH3_128bits_update(st, iv, sizeof iv);
        XXH3_128bits_update(st, fv, sizeof fv);
        for (int l = 0; l < m->hp.n_layer; l++) {
            const uint8_t w = m->layers[l].swa;
            XXH3_128bits_update(st, &w, 1);
        }
    }
    /* The variations added with phi3, granite and olmo2, likewise only when
     * set (the architectures before them keep their fingerprints). */
    if (o->resid_scale != 0.0f || o->logit_div != 0.0f || o->qk_norm_whole || o->swa_same_rope) {
        const float fv2[2] = {o->resid_scale, o->logit_div};
        const uint8_t bv[2] = {o->qk_norm_whole, o->swa_same_rope};
        XXH3_128bits_update(st, fv2, sizeof fv2);
        XXH3_128bits_update(st, bv, sizeof bv);
    }
    /* The experts' routing, likewise. */
    const struct model_moe *moe = &o->moe;
    if (moe->n_expert > 0) {
        const int32_t mv[6] = {moe->n_expert,  moe->n_expert_used, moe->n_ff_exp,
                               moe->norm_topk, o->qk_norm_whole,   moe->n_ff_shexp};
        XXH3_128bits_update(st, mv, sizeof mv);
    }
    if (o->encoder) { /* an encoder's metadata that changes its arithmetic */
        const int32_t ev[2] = {m->enc.n_types, m->enc.sep_token};
        XXH3_128bits_update(st, ev, sizeof ev);
        XXH3_128bits_update(st, &m->enc.ln_eps, sizeof m->enc.ln_eps);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        XXH3_128bits_update(st, t->name.ptr, (size_t)t->name.len);
        uint32_t type = (uint32_t)t->type;
        XXH3_128bits_update(st, &type, sizeof type);
        XXH3_128bits_update(st, t->ne, sizeof t->ne);
        XXH64_hash_t h = XXH3_64bits(t->data, (size_t)t->n_bytes);
        XXH3_128bits_update(st, &h, sizeof h);
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    snprintf(m->fingerprint, sizeof m->fingerprint, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    memcpy(m->fingerprint_file, m->fingerprint, sizeof m->fingerprint);
    return KVB_OK;
}

enum kvb_status model_load(const char *path, struct model **out, struct kvb_err *err)
{
    struct model *m = kvb_calloc(1, sizeof *m);
    if (!m) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    struct model_load_state ls = {0};
    enum kvb_status st = gguf_open(path, &m->gguf, err);
    if (st == KVB_OK) st = load_hparams(m, err);
    if (st == KVB_OK) st = model_rope_load(m, err);
    if (st == KVB_OK && m->arch->read) st = m->arch->read(m, err);
    if (st == KVB_OK) st = model_check_keys(m, err);
    if (st == KVB_OK) {
        ls.cap = gguf_n_tensors(m->gguf);
        ls.bound = kvb_calloc(ls.cap ? ls.cap : 1, sizeof *ls.bound);
        if (!ls.bound) st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
        m->load = &ls;
    }
    if (st == KVB_OK) st = load_weights(m, err);
    if (st == KVB_OK) st = check_freq_factors(m, err);
    if (st == KVB_OK) st = model_check(m, ls.bound, ls.n_bound, err);
    m->load = NULL;
    kvb_free(ls.bound);
    if (st == KVB_OK && compute_fingerprint(m) != KVB_OK) st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    if (st != KVB_OK) {
        kvb_err_wrap(err, st, "%s", path);
        model_free(m);
        return st;
    }
    struct gguf_str name;
    if (gguf_get_str(m->gguf, "general.name", &name, NULL) == KVB_OK) {
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len > 127 ? 127 : name.len), name.ptr);
    } else {
        const char *base = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    }
    *out = m;
    return KVB_OK;
}

/* The survey's last part: every tensor whose type kvbatch cannot compute
 * with, one reason per type (how many, and the first). */
static void survey_types(const struct model *m, struct model_reasons *r)
{
    const uint64_t n = gguf_n_tensors(m->gguf);
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        if (quant_type_supported(t->type)) continue;
        bool seen = false;
        for (uint64_t j = 0; j < i && !seen; j++) seen = gguf_tensor_at(m->gguf, j)->type == t->type;
        if (seen) continue;
        uint64_t count = 0;
        for (uint64_t j = i; j < n; j++) count += gguf_tensor_at(m->gguf, j)->type == t->type;
        const struct ggml_type_traits *tr = ggml_type_get_traits(t->type);
        char why[256];
        char tn[32];
        if (tr) snprintf(tn, sizeof tn, "%s", tr->name);
        else snprintf(tn, sizeof tn, "%u", (unsigned)t->type);
        snprintf(why, sizeof why, "%llu tensor%s of type %s, which kvbatch cannot compute with (the first: '%.*s')",
                 (unsigned long long)count, count == 1 ? "" : "s", tn, (int)(t->name.len > 96 ? 96 : t->name.len),
                 t->name.ptr);
        model_reason_add(r, why);
    }
}

int model_survey(const char *path, void (*each)(void *arg, const char *why), void *arg, struct kvb_err *err)
{
    struct model_reasons r = {each, arg, 0};
    struct model *m = kvb_calloc(1, sizeof *m);
    if (!m) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory"), -1;
    if (gguf_open(path, &m->gguf, err) != KVB_OK) {
        kvb_free(m);
        return -1;
    }
    struct kvb_err e = {{0}};
    struct model_load_state ls = {.survey = true};
    enum kvb_status st = load_hparams(m, &e);
    if (st == KVB_OK) st = model_rope_load(m, &e);
    if (st == KVB_OK && m->arch->read) st = m->arch->read(m, &e);
    if (st != KVB_OK) model_reason_add(&r, e.msg);
    /* The keys with what was read; the tensors only when the architecture
     * and its shapes are known. */
    if (m->arch && m->layers) {
        if (st == KVB_OK) {
            const struct model_hparams *hp = &m->hp;
            if (hp->n_ctx_train < 2 || !isfinite(hp->rope_base) || hp->rope_base <= 0 || !isfinite(hp->rms_eps) ||
                hp->rms_eps < 0) {
                model_check_keys(m, &e); /* says which */
                model_reason_add(&r, e.msg);
            }
        }
        model_check_keys_all(m, &r, &e);
        ls.cap = gguf_n_tensors(m->gguf);
        ls.bound = kvb_calloc(ls.cap ? ls.cap : 1, sizeof *ls.bound);
        m->load = &ls;
        if (st == KVB_OK && ls.bound) {
            if (load_weights(m, &e) != KVB_OK) {
                model_reason_add(&r, e.msg);
            } else {
                if (check_freq_factors(m, &e) != KVB_OK) model_reason_add(&r, e.msg);
                model_check_tensors_all(m, ls.bound, ls.n_bound, &r, &e);
            }
        }
        m->load = NULL;
        kvb_free(ls.bound);
    }
    survey_types(m, &r);
    model_free(m);
    return r.n;
}

void model_set_ctx(struct model *m, int32_t n_ctx)
{
    struct model_rope *r = &m->rope;
    if (!r->factors_long) return;
    const bool want_long = n_ctx > r->orig_ctx;
    if (want_long == r->long_factors) return;
    r->long_factors = want_long;
    r->freq_factors = want_long ? r->factors_long : r->factors_short;
    /* The file's fingerprint is the short set's (what a load gives); the
     * long set's is derived from it, so both are stable and distinct. */
    if (!want_long) {
        memcpy(m->fingerprint, m->fingerprint_file, sizeof m->fingerprint);
        return;
    }
    char buf[64];
    const int n = snprintf(buf, sizeof buf, "%s+longrope-long", m->fingerprint_file);
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)n);
    snprintf(m->fingerprint, sizeof m->fingerprint, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

void model_free(struct model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) kvb_free(m->owned[i]);
    kvb_free(m->owned);
    kvb_free(m->layers);
    gguf_close(m->gguf);
    kvb_free(m);
}

enum kvb_status model_embed(const struct model *m, int32_t token, float *out)
{
    if (token < 0 || token >= m->hp.n_vocab) return KVB_ERR_INVALID_ARG;
    const struct mm_weight *w = &m->tok_embd;
    return quant_dequant_row(w->type, (const char *)w->data + (size_t)token * w->row_bytes, out, w->n_in);
}
