/* model_check.c — a model that loads is a model kvbatch computes as its
 * authors do (see model.h, model_load).
 *
 * An allowlist, not a denylist: each `<arch>.*` key is either read by the
 * loader (the common keys below, or those the architecture's description
 * lists: model/arch.h), or named here with the one value that leaves the
 * arithmetic of the llama layer alone (a logit scale of 1, no soft-capping,
 * causal attention, a sliding window no shorter than the context...). Any
 * other key, or another value, fails the load naming both: a key written
 * for a variant kvbatch does not implement must not be silently ignored.
 * Keys outside the architecture's namespace (general.*, tokenizer.*,
 * quantize.*) describe the file, not the computation, and pass, but for
 * split.count: kvbatch reads single-file models only. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/model_internal.h"

/* Keys the loader reads (model.c, model_rope.c); their values are checked there. */
static const char *const read_keys[] = {
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scale_linear",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.attn_factor",
    "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
    "rope.scaling.yarn_log_multiplier",
    /* Descriptive only: whether the scaled model was fine-tuned, and the
     * layout of the original checkpoint the converter undid. */
    "rope.scaling.finetuned",
    "tensor_data_layout",
    /* A LayerNorm epsilon: convert_hf_to_gguf and Ollama's converter copy
     * one from a config that has layer_norm_eps/layer_norm_epsilon/
     * norm_epsilon next to rms_norm_eps, but every architecture kvbatch runs
     * normalizes with RMSNorm only (transformers reads rms_norm_eps, llama.cpp
     * layer_norm_rms_epsilon), so it is never part of the arithmetic. */
    "attention.layer_norm_epsilon",
};

enum neutral { N_ZERO, N_ONE, N_TRUE, N_FALSE, N_WINDOW, N_ATTN_SCALE, N_HEAD_DIM };

/* Keys that change the computation unless they hold the neutral value. */
static const struct {
    const char *suffix;
    enum neutral want;
    const char *what;
} neutral_keys[] = {
    {"logit_scale", N_ONE, "output logit scaling"},
    {"embedding_scale", N_ONE, "embedding scaling"},
    {"residual_scale", N_ONE, "residual scaling"},
    {"attention.scale", N_ATTN_SCALE, "an attention scale other than 1/sqrt(head_dim)"},
    {"attention.output_scale", N_ONE, "attention output scaling"},
    {"attn_logit_softcapping", N_ZERO, "attention logit soft-capping"},
    {"final_logit_softcapping", N_ZERO, "final logit soft-capping"},
    {"attention.clamp_kqv", N_ZERO, "clamping of Q/K/V"},
    {"attention.max_alibi_bias", N_ZERO, "ALiBi position biases"},
    {"attention.causal", N_TRUE, "non-causal attention"},
    {"attention.sliding_window", N_WINDOW, "sliding-window attention"},
    {"use_parallel_residual", N_FALSE, "parallel residual blocks"},
    {"expert_count", N_ZERO, "mixture of experts"},
    {"expert_used_count", N_ZERO, "mixture of experts"},
    /* Ollama's converter writes the config's head_dim here as well as in
     * attention.key_length; llama.cpp reads only the latter. */
    {"attention.head_dim", N_HEAD_DIM, "a head size other than attention.key_length"},
};

const char *model_key(const struct model *m, const char *suffix, char *buf, size_t size)
{
    struct gguf_str arch = {0, ""};
    gguf_get_str(m->gguf, "general.architecture", &arch, NULL);
    snprintf(buf, size, "%.*s.%s", (int)(arch.len > 32 ? 32 : arch.len), arch.ptr, suffix);
    return buf;
}

enum kvb_status model_opt_f32(const struct model *m, const char *suffix, float dflt, bool *given, float *out,
                              struct kvb_err *err)
{
    char key[128];
    model_key(m, suffix, key, sizeof key);
    /* Looked up without err first: an absent key is the usual case and must
     * leave no message behind in a load that succeeds. */
    enum kvb_status st = gguf_get_f32(m->gguf, key, out, NULL);
    if (given) *given = st == KVB_OK;
    if (st == KVB_ERR_NOT_FOUND) {
        *out = dflt;
        return KVB_OK;
    }
    return st == KVB_OK ? st : gguf_get_f32(m->gguf, key, out, err);
}

void model_value_str(const struct gguf_value *v, char *buf, size_t size)
{
    switch (v->type) {
    case GGUF_VTYPE_UINT8:
    case GGUF_VTYPE_UINT16:
    case GGUF_VTYPE_UINT32:
    case GGUF_VTYPE_UINT64: snprintf(buf, size, "%llu", (unsigned long long)v->v.u64); break;
    case GGUF_VTYPE_INT8:
    case GGUF_VTYPE_INT16:
    case GGUF_VTYPE_INT32:
    case GGUF_VTYPE_INT64: snprintf(buf, size, "%lld", (long long)v->v.i64); break;
    case GGUF_VTYPE_FLOAT32:
    case GGUF_VTYPE_FLOAT64: snprintf(buf, size, "%g", v->v.f64); break;
    case GGUF_VTYPE_BOOL: snprintf(buf, size, "%s", v->v.b ? "true" : "false"); break;
    case GGUF_VTYPE_STRING:
        snprintf(buf, size, "\"%.*s\"", (int)(v->v.str.len > 40 ? 40 : v->v.str.len), v->v.str.ptr);
        break;
    case GGUF_VTYPE_ARRAY: snprintf(buf, size, "an array of %llu", (unsigned long long)v->v.arr.n); break;
    default: snprintf(buf, size, "?"); break;
    }
}

/* The value as a number, when it is one. */
static bool value_num(const struct gguf_value *v, double *out)
{
    switch (v->type) {
    case GGUF_VTYPE_UINT8:
    case GGUF_VTYPE_UINT16:
    case GGUF_VTYPE_UINT32:
    case GGUF_VTYPE_UINT64: *out = (double)v->v.u64; return true;
    case GGUF_VTYPE_INT8:
    case GGUF_VTYPE_INT16:
    case GGUF_VTYPE_INT32:
    case GGUF_VTYPE_INT64: *out = (double)v->v.i64; return true;
    case GGUF_VTYPE_FLOAT32:
    case GGUF_VTYPE_FLOAT64: *out = v->v.f64; return true;
    case GGUF_VTYPE_BOOL: *out = v->v.b; return true;
    default: return false;
    }
}

static bool is_neutral(const struct model *m, enum neutral want, const struct gguf_value *v)
{
    double x;
    if (v->type == GGUF_VTYPE_BOOL) return want == N_TRUE ? v->v.b : want == N_FALSE ? !v->v.b : false;
    if (!value_num(v, &x)) return false;
    switch (want) {
    case N_ZERO: return x == 0;
    case N_ONE: return x == 1;
    case N_TRUE:
    case N_FALSE: return false;
    case N_WINDOW: return x == 0 || x >= (double)m->n_ctx_max; /* a window the context cannot exceed */
    case N_ATTN_SCALE: return x == 0 || fabs(x * sqrt((double)m->hp.head_dim) - 1.0) < 1e-6; /* 0: the default */
    case N_HEAD_DIM: return x == (double)m->hp.head_dim;
    }
    return false;
}

static enum kvb_status check_arch_key(const struct model *m, const char *key, const struct gguf_value *v,
                                      struct kvb_err *err)
{
    const char *suffix = strchr(key, '.') + 1;
    for (size_t i = 0; i < sizeof read_keys / sizeof read_keys[0]; i++)
        if (!strcmp(suffix, read_keys[i])) return KVB_OK;
    for (const char *const *k = m->arch && m->arch->keys ? m->arch->keys : NULL; k && *k; k++)
        if (!strcmp(suffix, *k)) return KVB_OK;
    char val[64];
    model_value_str(v, val, sizeof val);
    for (size_t i = 0; i < sizeof neutral_keys / sizeof neutral_keys[0]; i++) {
        if (strcmp(suffix, neutral_keys[i].suffix)) continue;
        if (is_neutral(m, neutral_keys[i].want, v)) return KVB_OK;
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' = %s asks for %s, which kvbatch does not compute for %s", key, val,
                        neutral_keys[i].what, m->arch ? m->arch->name : "this architecture");
    }
    return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                    "model key '%s' = %s is not one kvbatch computes (refused rather than ignored)", key, val);
}

void model_reason_add(struct model_reasons *r, const char *why)
{
    r->n++;
    if (r->each) r->each(r->arg, why);
}

/* A failed check: reported to r and the caller goes on (r set), or returned. */
static enum kvb_status refusal(struct model_reasons *r, enum kvb_status st, struct kvb_err *err)
{
    if (!r || st == KVB_OK) return st;
    model_reason_add(r, err->msg);
    return KVB_OK;
}

static enum kvb_status check_keys(const struct model *m, struct model_reasons *r, struct kvb_err *err)
{
    char prefix[64];
    model_key(m, "", prefix, sizeof prefix); /* "llama." */
    const size_t pl = strlen(prefix);
    for (uint64_t i = 0; i < gguf_n_kv(m->gguf); i++) {
        const struct gguf_kv *kv = gguf_kv_at(m->gguf, i);
        char key[160];
        if (kv->key.len >= sizeof key) {
            if (kv->key.len > pl && !memcmp(kv->key.ptr, prefix, pl))
                KVB_FORWARD_IF_ERROR(
                    refusal(r,
                            kvb_errf(err, KVB_ERR_UNSUPPORTED, "model key '%.*s...' is not one kvbatch computes", 100,
                                     kv->key.ptr),
                            err));
            continue;
        }
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (!strncmp(key, prefix, pl)) {
            KVB_FORWARD_IF_ERROR(refusal(r, check_arch_key(m, key, &kv->val, err), err));
        } else if (!strcmp(key, "split.count")) {
            double n;
            if (value_num(&kv->val, &n) && n > 1)
                KVB_FORWARD_IF_ERROR(refusal(r,
                                             kvb_errf(err, KVB_ERR_UNSUPPORTED,
                                                      "model key 'split.count' = %g: this is one part of a split "
                                                      "model; kvbatch reads single-file models (join the parts with "
                                                      "llama-gguf-split --merge)",
                                                      n),
                                             err));
        }
    }
    return KVB_OK;
}

static enum kvb_status check_tensors(const struct model *m, const struct gguf_tensor *const *bound, uint64_t n_bound,
                                     struct model_reasons *r, struct kvb_err *err)
{
    if (n_bound == gguf_n_tensors(m->gguf)) return KVB_OK; /* each bound name is distinct and in the file */
    for (uint64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        bool found = false;
        for (uint64_t j = 0; j < n_bound && !found; j++) found = bound[j] == t;
        if (!found)
            KVB_FORWARD_IF_ERROR(
                refusal(r,
                        kvb_errf(err, KVB_ERR_UNSUPPORTED,
                                 "model tensor '%.*s' is not one kvbatch computes with (refused rather than ignored)",
                                 (int)(t->name.len > 96 ? 96 : t->name.len), t->name.ptr),
                        err));
    }
    return KVB_OK;
}

/* Token ids the tokenizer and the sampler use must name rows of the embedding. */
static enum kvb_status check_vocab(const struct model *m, struct kvb_err *err)
{
    const int32_t nv = m->hp.n_vocab;
    const struct gguf_value *toks = gguf_find(m->gguf, "tokenizer.ggml.tokens");
    if (toks && toks->type == GGUF_VTYPE_ARRAY && toks->v.arr.n != (uint64_t)nv)
        return kvb_errf(err, KVB_ERR_FORMAT,
                        "model key 'tokenizer.ggml.tokens' has %llu tokens but token_embd.weight has %d rows",
                        (unsigned long long)toks->v.arr.n, nv);
    char key[128];
    uint32_t n;
    if (gguf_get_u32(m->gguf, model_key(m, "vocab_size", key, sizeof key), &n, NULL) == KVB_OK && n != (uint32_t)nv)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u but token_embd.weight has %d rows", key, n, nv);
    static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
                                      "tokenizer.ggml.unknown_token_id"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        const struct gguf_value *v = gguf_find(m->gguf, ids[i]);
        double x;
        if (v && value_num(v, &x) && (x < 0 || x >= nv))
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g is outside the vocabulary of %d tokens", ids[i],
                            x, nv);
    }
    return KVB_OK;
}

enum kvb_status model_check_keys_all(const struct model *m, struct model_reasons *r, struct kvb_err *err)
{
    return check_keys(m, r, err);
}

enum kvb_status model_check_tensors_all(const struct model *m, const struct gguf_tensor *const *bound, uint64_t n_bound,
                                        struct model_reasons *r, struct kvb_err *err)
{
    enum kvb_status st = refusal(r, check_vocab(m, err), err);
    return st != KVB_OK ? st : check_tensors(m, bound, n_bound, r, err);
}

enum kvb_status model_check_keys(const struct model *m, struct kvb_err *err)
{
    const struct model_hparams *hp = &m->hp;
    char key[128];
    if (hp->n_ctx_train < 2)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %d: a context must hold at least 2 tokens",
                        model_key(m, "context_length", key, sizeof key), hp->n_ctx_train);
    if (!isfinite(hp->rope_base) || hp->rope_base <= 0)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a positive number",
                        model_key(m, "rope.freq_base", key, sizeof key), (double)hp->rope_base);
    if (!isfinite(hp->rms_eps) || hp->rms_eps < 0)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a non-negative number",
                        model_key(m, "attention.layer_norm_rms_epsilon", key, sizeof key), (double)hp->rms_eps);
    return check_keys(m, NULL, err);
}

enum kvb_status model_check(const struct model *m, const struct gguf_tensor *const *bound, uint64_t n_bound,
                            struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(check_vocab(m, err));
    return check_tensors(m, bound, n_bound, NULL, err);
}
