/* model_moe.c — the keys of a mixture-of-experts model (see model.h,
 * struct model_moe, and model_internal.h).
 *
 * What each architecture computes, from its transformers modeling file, and
 * what llama.cpp's converter writes for it:
 *  - Mixtral ("llama" with `expert_count` > 0; MixtralSparseMoeBlock):
 *    softmax over the experts, top-k, the k weights renormalised (always);
 *    an expert is `feed_forward_length` wide.
 *  - Qwen3-MoE ("qwen3moe"; Qwen3MoeSparseMoeBlock): softmax, top-k,
 *    renormalised when the config's norm_topk_prob is true. The converter
 *    does not write norm_topk_prob; llama.cpp renormalises always (and
 *    transformers' GGUF loader sets norm_topk_prob for these files), as the
 *    released Qwen3-MoE configs say. An expert is
 *    `expert_feed_forward_length` wide (llama.cpp: feed_forward_length /
 *    expert_used_count when absent). No shared expert. Every layer is a MoE
 *    layer (decoder_sparse_step 1, no mlp_only_layers, as in the released
 *    models: the converter writes neither and llama.cpp reads neither).
 *  - OLMoE ("olmoe"; OlmoeSparseMoeBlock): softmax, top-k, not
 *    renormalised (norm_topk_prob false in OLMoE's config, and llama.cpp
 *    never renormalises for olmoe); `feed_forward_length` wide.
 *  - Qwen1.5-MoE / Qwen2-MoE ("qwen2moe"; Qwen2MoeSparseMoeBlock): softmax,
 *    top-k, not renormalised (norm_topk_prob false in the released configs;
 *    llama.cpp never renormalises for qwen2moe), `expert_feed_forward_length`
 *    wide, plus a shared expert that every token runs,
 *    `expert_shared_feed_forward_length` wide (llama.cpp: feed_forward_length
 *    when absent), whose output is added times sigmoid(ffn_gate_inp_shexp . x).
 * `expert_weights_norm`, `expert_gating_func` and `expert_weights_scale`
 * are accepted only at the value the architecture computes (llama.cpp
 * reads the first two only for other architectures): a file that says
 * otherwise is refused naming the key rather than computed differently
 * from what it says. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/model_internal.h"

/* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (gguf-py ExpertGatingFuncType). */
#define GATING_SOFTMAX 1u
/* Beyond any released model (DeepSeek-V3: 256); a larger count is a damaged file. */
#define MAX_EXPERTS 4096

bool model_moe_key(const struct arch_desc *d, const char *suffix)
{
    static const char *const keys[] = {"expert_count", "expert_used_count", "expert_weights_norm", "expert_gating_func",
                                       "expert_weights_scale"};
    if (!d || d->moe == ARCH_ABSENT) return false;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(suffix, keys[i])) return true;
    if (d->moe_shared && !strcmp(suffix, "expert_shared_feed_forward_length")) return true;
    return d->moe_ff_key && !strcmp(suffix, "expert_feed_forward_length");
}

static enum kvb_status get_count(const struct model *m, const char *suffix, uint32_t dflt, uint32_t *out,
                                 struct kvb_err *err)
{
    char key[128];
    *out = dflt;
    enum kvb_status st = gguf_get_u32(m->gguf, model_key(m, suffix, key, sizeof key), out, NULL);
    if (st == KVB_ERR_NOT_FOUND) {
        *out = dflt;
        return KVB_OK;
    }
    return st == KVB_OK ? st : gguf_get_u32(m->gguf, key, out, err);
}

/* The optional keys that must hold what the architecture computes. */
static enum kvb_status check_routing_keys(const struct model *m, struct kvb_err *err)
{
    const struct arch_desc *d = m->arch;
    char key[128];
    bool norm;
    enum kvb_status st = gguf_get_bool(m->gguf, model_key(m, "expert_weights_norm", key, sizeof key), &norm, NULL);
    if (st == KVB_OK && norm != d->moe_norm_topk)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' = %s: %s renormalises the top-k routing weights %s, and kvbatch computes "
                        "it so",
                        key, norm ? "true" : "false", d->name, d->moe_norm_topk ? "always" : "never");
    if (st != KVB_OK && st != KVB_ERR_NOT_FOUND) return gguf_get_bool(m->gguf, key, &norm, err);
    uint32_t gating;
    KVB_FORWARD_IF_ERROR(get_count(m, "expert_gating_func", GATING_SOFTMAX, &gating, err));
    if (gating != GATING_SOFTMAX)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' = %u: only softmax routing (1) is computed by kvbatch for %s",
                        model_key(m, "expert_gating_func", key, sizeof key), gating, d->name);
    float scale;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "expert_weights_scale", 1.0f, NULL, &scale, err));
    if (scale != 0.0f && scale != 1.0f) /* llama.cpp: 0 (unset) and 1 leave the weights alone */
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' = %g: scaled routing weights are not computed by kvbatch for %s",
                        model_key(m, "expert_weights_scale", key, sizeof key), (double)scale, d->name);
    return KVB_OK;
}

enum kvb_status model_read_moe(struct model *m, struct kvb_err *err)
{
    const struct arch_desc *d = m->arch;
    struct model_moe *moe = &m->ops.moe;
    memset(moe, 0, sizeof *moe);
    if (d->moe == ARCH_ABSENT) return KVB_OK;
    char key[128], key2[128];
    uint32_t n_expert, n_used;
    KVB_FORWARD_IF_ERROR(get_count(m, "expert_count", 0, &n_expert, err));
    KVB_FORWARD_IF_ERROR(get_count(m, "expert_used_count", 0, &n_used, err));
    if (n_expert == 0) {
        if (d->moe == ARCH_REQUIRED)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' is missing or 0: %s is a mixture of experts",
                            model_key(m, "expert_count", key, sizeof key), d->name);
        if (n_used != 0)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u without experts ('%s' is 0)",
                            model_key(m, "expert_used_count", key, sizeof key), n_used,
                            model_key(m, "expert_count", key2, sizeof key2));
        return KVB_OK; /* dense */
    }
    if (n_expert > MAX_EXPERTS)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u is implausible (at most %d)",
                        model_key(m, "expert_count", key, sizeof key), n_expert, MAX_EXPERTS);
    if (n_used == 0 || n_used > n_expert)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u must be between 1 and '%s' = %u",
                        model_key(m, "expert_used_count", key, sizeof key), n_used,
                        model_key(m, "expert_count", key2, sizeof key2), n_expert);
    uint32_t n_ff_exp = (uint32_t)m->hp.n_ff;
    if (d->moe_ff_key) {
        KVB_FORWARD_IF_ERROR(get_count(m, "expert_feed_forward_length", (uint32_t)m->hp.n_ff / n_used, &n_ff_exp, err));
        if (n_ff_exp == 0 || n_ff_exp > INT32_MAX)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u is not a usable expert size",
                            model_key(m, "expert_feed_forward_length", key, sizeof key), n_ff_exp);
    }
    uint32_t n_ff_shexp = 0;
    if (d->moe_shared) {
        KVB_FORWARD_IF_ERROR(get_count(m, "expert_shared_feed_forward_length", (uint32_t)m->hp.n_ff, &n_ff_shexp, err));
        if (n_ff_shexp == 0 || n_ff_shexp > INT32_MAX)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u is not a usable shared expert size",
                            model_key(m, "expert_shared_feed_forward_length", key, sizeof key), n_ff_shexp);
    }
    KVB_FORWARD_IF_ERROR(check_routing_keys(m, err));
    moe->n_expert = (int32_t)n_expert;
    moe->n_expert_used = (int32_t)n_used;
    moe->n_ff_exp = (int32_t)n_ff_exp;
    moe->norm_topk = d->moe_norm_topk;
    moe->n_ff_shexp = (int32_t)n_ff_shexp;
    return KVB_OK;
}
