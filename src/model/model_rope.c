/* model_rope.c — RoPE scaling: which one a file asks for, and the frequency
 * of each rotary pair under it (see model.h, struct model_rope).
 *
 * Definitions, from the two implementations that produce and run these
 * files: llama.cpp's convert_hf_to_gguf.py writes Hugging Face's
 * `rope_scaling` as the keys read here, and transformers'
 * modeling_rope_utils.py is how the model's authors compute it.
 *  - rope_freqs.weight (Llama 3.x, "llama3" type): pair i's frequency is
 *    divided by factors[i]; the converter precomputes HF's smoothed factors.
 *  - linear: every frequency divided by `factor`.
 *  - yarn: with dim = rope_dim and corr(b) = dim * ln(orig_ctx / (2 pi b)) /
 *    (2 ln base), low = max(0, floor(corr(beta_fast))), high = min(dim - 1,
 *    ceil(corr(beta_slow))), pair i keeps its frequency with weight
 *    e = 1 - clamp((i - low) / (high - low), 0, 1) (0.001 for high - low
 *    when they are equal) and takes frequency / factor with weight 1 - e. cos and sin are
 *    multiplied by the attention factor: `yarn_attn_factor` when the file
 *    gives it (HF's `attention_factor`, used as given), else
 *    0.1 ln(factor) + 1 (1 for factor <= 1). The legacy
 *    `rope.scaling.attn_factor` multiplies it, as in llama.cpp.
 * A type without `rope.scaling.type` but with a factor is linear (llama.cpp
 * reads it so); type "none" never scales. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/model_internal.h"

static enum kvb_status refuse_f32(const struct model *m, const char *suffix, float v, const char *why,
                                  struct kvb_err *err)
{
    char key[128];
    return kvb_errf(err, KVB_ERR_UNSUPPORTED, "model key '%s' = %g: %s", model_key(m, suffix, key, sizeof key),
                    (double)v, why);
}

static enum kvb_status bad_f32(const struct model *m, const char *suffix, float v, const char *why, struct kvb_err *err)
{
    char key[128];
    return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g: %s", model_key(m, suffix, key, sizeof key), (double)v,
                    why);
}

static enum kvb_status read_type(struct model *m, bool *given, struct kvb_err *err)
{
    char key[128];
    struct gguf_str s;
    enum kvb_status st = gguf_get_str(m->gguf, model_key(m, "rope.scaling.type", key, sizeof key), &s, NULL);
    *given = st == KVB_OK;
    if (st == KVB_ERR_NOT_FOUND) return KVB_OK;
    if (st != KVB_OK) return gguf_get_str(m->gguf, key, &s, err);
    if (gguf_str_eq(s, "none")) m->rope.type = ROPE_SCALING_NONE;
    else if (gguf_str_eq(s, "linear")) m->rope.type = ROPE_SCALING_LINEAR;
    else if (gguf_str_eq(s, "yarn")) m->rope.type = ROPE_SCALING_YARN;
    else
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' = \"%.*s\": kvbatch computes RoPE scaling none, linear and yarn only", key,
                        (int)(s.len > 32 ? 32 : s.len), s.ptr);
    return KVB_OK;
}

static enum kvb_status read_yarn(struct model *m, struct kvb_err *err)
{
    struct model_rope *r = &m->rope;
    struct model_hparams *hp = &m->hp;
    char key[128];
    uint32_t orig = 0;
    enum kvb_status st =
        gguf_get_u32(m->gguf, model_key(m, "rope.scaling.original_context_length", key, sizeof key), &orig, NULL);
    if (st == KVB_ERR_NOT_FOUND) {
        /* llama.cpp's fallback, and transformers' (standardize_rope_params
         * takes max_position_embeddings, which the converter writes as the
         * context length): the file's context length, when it has one. */
        char ctx_key[128];
        if (!gguf_find(m->gguf, model_key(m, "context_length", ctx_key, sizeof ctx_key)))
            return kvb_errf(err, KVB_ERR_FORMAT,
                            "yarn scaling without '%s' needs '%s' to fall back on, and the file has neither", key,
                            ctx_key);
        orig = (uint32_t)hp->n_ctx_train;
    } else if (st != KVB_OK) {
        return gguf_get_u32(m->gguf, key, &orig, err);
    }
    if (orig < 2 || orig > INT32_MAX)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u is not a usable context length", key, orig);
    r->orig_ctx = (int32_t)orig;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.yarn_beta_fast", 32.0f, NULL, &r->beta_fast, err));
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.yarn_beta_slow", 1.0f, NULL, &r->beta_slow, err));
    if (!isfinite(r->beta_fast) || r->beta_fast <= 0)
        return bad_f32(m, "rope.scaling.yarn_beta_fast", r->beta_fast, "must be a positive number", err);
    if (!isfinite(r->beta_slow) || r->beta_slow <= 0)
        return bad_f32(m, "rope.scaling.yarn_beta_slow", r->beta_slow, "must be a positive number", err);
    if (!(hp->rope_base > 1.0f))
        return bad_f32(m, "rope.freq_base", hp->rope_base, "yarn needs a RoPE base above 1", err);
    float ext, log_mul, attn;
    bool attn_given;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.yarn_ext_factor", 1.0f, NULL, &ext, err));
    if (ext != 1.0f)
        return refuse_f32(m, "rope.scaling.yarn_ext_factor", ext,
                          "kvbatch computes yarn as transformers does, with the full ramp (1)", err);
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.yarn_log_multiplier", 0.0f, NULL, &log_mul, err));
    if (log_mul != 0.0f)
        return refuse_f32(m, "rope.scaling.yarn_log_multiplier", log_mul,
                          "yarn with an mscale_all_dim is not computed by kvbatch", err);
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.yarn_attn_factor", 1.0f, &attn_given, &attn, err));
    if (attn_given) {
        if (!isfinite(attn) || attn <= 0)
            return bad_f32(m, "rope.scaling.yarn_attn_factor", attn, "must be a positive number", err);
        r->mscale = attn;
    } else {
        r->mscale = r->factor <= 1.0f ? 1.0f : (float)(0.1 * log((double)r->factor) + 1.0);
    }
    return KVB_OK;
}

enum kvb_status model_rope_load(struct model *m, struct kvb_err *err)
{
    struct model_rope *r = &m->rope;
    struct model_hparams *hp = &m->hp;
    r->type = ROPE_SCALING_NONE;
    r->factor = 1.0f;
    r->orig_ctx = 0;
    r->beta_fast = r->beta_slow = 0.0f;
    r->mscale = 1.0f;
    bool type_given, factor_given, legacy_given;
    KVB_FORWARD_IF_ERROR(read_type(m, &type_given, err));
    float factor, legacy;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.factor", 1.0f, &factor_given, &factor, err));
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scale_linear", 1.0f, &legacy_given, &legacy, err));
    const char *factor_key = factor_given ? "rope.scaling.factor" : "rope.scale_linear";
    /* Both names (GGUF's first and its current one): llama.cpp reads the
     * current one, but a file whose two factors disagree contradicts itself. */
    if (factor_given && legacy_given && factor != legacy && !(isnan(factor) && isnan(legacy))) {
        char k1[128], k2[128];
        return kvb_errf(err, KVB_ERR_FORMAT, "model keys '%s' = %g and '%s' = %g disagree on the RoPE scaling factor",
                        model_key(m, "rope.scaling.factor", k1, sizeof k1), (double)factor,
                        model_key(m, "rope.scale_linear", k2, sizeof k2), (double)legacy);
    }
    if (!factor_given) factor = legacy;
    if (!type_given && (factor_given || legacy_given) && factor != 1.0f) r->type = ROPE_SCALING_LINEAR;
    if (r->type != ROPE_SCALING_NONE) {
        if (!isfinite(factor) || factor <= 0) return bad_f32(m, factor_key, factor, "must be a positive number", err);
        r->factor = factor;
    }
    if (r->type == ROPE_SCALING_YARN) KVB_FORWARD_IF_ERROR(read_yarn(m, err));
    /* A factor of 1 scales nothing: linear divides by 1, and yarn blends
     * each frequency with itself at an attention factor of ln(1)/10 + 1 = 1
     * (unless the file gives one). Read as no scaling, so such a file
     * keeps the fingerprint of the same weights without the keys. */
    if (r->factor == 1.0f && r->type != ROPE_SCALING_NONE) {
        r->type = ROPE_SCALING_NONE; /* mscale stays: yarn_attn_factor, when given, still applies */
        r->orig_ctx = 0;
        r->beta_fast = r->beta_slow = 0.0f;
    }
    float attn_factor;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.scaling.attn_factor", 1.0f, NULL, &attn_factor, err));
    if (!isfinite(attn_factor) || attn_factor <= 0)
        return bad_f32(m, "rope.scaling.attn_factor", attn_factor, "must be a positive number", err);
    r->mscale *= attn_factor;

    m->n_ctx_max = hp->n_ctx_train;
    if (r->type == ROPE_SCALING_YARN) {
        double ext_ctx = (double)r->orig_ctx * (double)r->factor;
        if (ext_ctx > (double)m->n_ctx_max) m->n_ctx_max = ext_ctx >= (double)INT32_MAX ? INT32_MAX : (int32_t)ext_ctx;
    }
    return KVB_OK;
}

static double yarn_corr_dim(double dim, double orig_ctx, double rotations, double base)
{
    return dim * log(orig_ctx / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

void model_rope_freqs(const struct model *m, float *inv_freq)
{
    const struct model_hparams *hp = &m->hp;
    const struct model_rope *r = &m->rope;
    const int32_t half = hp->rope_dim / 2;
    double low = 0, high = 0;
    if (r->type == ROPE_SCALING_YARN) {
        const double dim = hp->rope_dim, base = hp->rope_base;
        low = floor(yarn_corr_dim(dim, r->orig_ctx, r->beta_fast, base));
        high = ceil(yarn_corr_dim(dim, r->orig_ctx, r->beta_slow, base));
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
    }
    for (int32_t i = 0; i < half; i++) {
        double f = pow((double)hp->rope_base, -2.0 * i / (double)hp->rope_dim);
        if (r->freq_factors) f /= (double)r->freq_factors[i];
        if (r->type == ROPE_SCALING_LINEAR) {
            f /= (double)r->factor;
        } else if (r->type == ROPE_SCALING_YARN) {
            /* transformers' linear_ramp_factor: max += 0.001 only when the
             * bounds meet. (ggml takes max(0.001, high - low), which differs
             * when high < low: betas given in the wrong order, or an
             * original context under 2 pi.) */
            double ramp = ((double)i - low) / (high != low ? high - low : 0.001);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double keep = 1.0 - ramp; /* weight of the original (extrapolated) frequency */
            f = f / (double)r->factor * (1.0 - keep) + f * keep;
        }
        inv_freq[i] = (float)f;
    }
}

void model_rope_freqs_swa(const struct model *m, float *inv_freq)
{
    const struct model_hparams *hp = &m->hp;
    for (int32_t i = 0; i < hp->rope_dim / 2; i++)
        inv_freq[i] = (float)pow((double)m->ops.rope_base_swa, -2.0 * i / (double)hp->rope_dim);
}
