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
    /* Partial rotary embedding: no architecture kvbatch runs defines one
     * (transformers rotates the whole head), so a shorter count is a file
     * kvbatch would compute differently from its authors. */
    if (hp->rope_dim != hp->head_dim)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s.rope.dimension_count' = %d: a partial rotary embedding (head size %d) is not "
                        "computed by kvbatch",
                        a, hp->rope_dim, hp->head_dim);
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.freq_base", 10000.0f, NULL, &hp->rope_base, err));
    /* Required, as llama.cpp requires it for these architectures: there is
     * no default the authors share (transformers' configs default to 1e-6,
     * kvbatch used to take 1e-5), and every converter writes it. */
    char eps_key[128];
    snprintf(eps_key, sizeof eps_key, "%s.attention.layer_norm_rms_epsilon", a);
    if (!gguf_find(f, eps_key)) return kvb_errf(err, KVB_ERR_FORMAT, "model is missing required key '%s'", eps_key);
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "attention.layer_norm_rms_epsilon", 0.0f, NULL, &hp->rms_eps, err));
    hp->rope = m->arch->rope;
    /* What the description fixes; its read hook (after the weights' shapes
     * are known, see model_load) sets what the file's keys decide. */
    m->ops = (struct model_ops){
        .act = m->arch->act,
        .embd_scale = 1.0f,
        .attn_scale = 1.0f / sqrtf((float)hp->head_dim), /* the backends' expression, as it always was */
        .rope_base_swa = hp->rope_base,
    };
    m->layers = kvb_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    return KVB_OK;
}

static enum kvb_status load_weights(struct model *m, struct kvb_err *err)
{
    struct model_hparams *hp = &m->hp;
    const struct gguf_tensor *emb = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return kvb_errf(err, KVB_ERR_FORMAT, "model is missing tensor 'token_embd.weight'");
    if (emb->ne[1] == 0 || emb->ne[1] > INT32_MAX)
        return kvb_errf(err, KVB_ERR_FORMAT, "token_embd.weight has an implausible vocabulary size");
    hp->n_vocab = (int32_t)emb->ne[1];
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
        KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_norm.weight"), e, true, &L->attn_norm, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("attn_q.weight"), e, q, true, &L->wq, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("attn_k.weight"), e, kv, true, &L->wk, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("attn_v.weight"), e, kv, true, &L->wv, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("attn_output.weight"), q, e, true, &L->wo, err));
        const struct arch_desc *d = m->arch;
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
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_q_norm.weight"), hp->head_dim, req, &L->q_norm, err));
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("attn_k_norm.weight"), hp->head_dim, req, &L->k_norm, err));
            if ((L->q_norm != NULL) != (L->k_norm != NULL))
                return kvb_errf(err, KVB_ERR_FORMAT, "layer %d has one of the Q/K norms but not the other", l);
        }
        if (d->post_norms != ARCH_ABSENT) {
            bool req = d->post_norms == ARCH_REQUIRED;
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("post_attention_norm.weight"), e, req, &L->post_attn_norm, err));
            KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("post_ffw_norm.weight"), e, req, &L->post_ffn_norm, err));
        }
        KVB_FORWARD_IF_ERROR(bind_vector(m, NAME("ffn_norm.weight"), e, true, &L->ffn_norm, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_gate.weight"), e, hp->n_ff, true, &L->w_gate, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_up.weight"), e, hp->n_ff, true, &L->w_up, err));
        KVB_FORWARD_IF_ERROR(bind_matrix(m, NAME("ffn_down.weight"), hp->n_ff, e, true, &L->w_down, err));
#undef NAME
    }
    return bind_vector(m, "rope_freqs.weight", hp->rope_dim / 2, false, &m->rope.freq_factors, err);
}

static enum kvb_status check_freq_factors(const struct model *m, struct kvb_err *err)
{
    const float *ff = m->rope.freq_factors;
    const int32_t half = m->hp.rope_dim / 2;
    for (int32_t i = 0; ff && i < half; i++)
        if (!(ff[i] > 0))
            return kvb_errf(err, KVB_ERR_FORMAT, "tensor 'rope_freqs.weight' holds %g at %d; factors must be positive",
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
                            "tensor 'rope_freqs.weight' holds %g at %d, which gives that rotary pair a frequency "
                            "of %g",
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
