/* arch_granite.c — "granite": IBM Granite 3.x dense models (2B, 8B),
 * computed as transformers' GraniteForCausalLM computes them.
 *
 * The llama layer (the converter is llama's: Q/K rows permuted for adjacent
 * RoPE pairs, tied output when output.weight is absent, llama's RoPE
 * scaling) with four multipliers, each a key the converter writes when the
 * config's value is non-zero:
 *  - `embedding_scale` (embedding_multiplier): token embeddings times it;
 *  - `attention.scale` (attention_multiplier): the scores' scale, in place
 *    of 1/sqrt(head_dim);
 *  - `residual_scale` (residual_multiplier): the attention and FFN outputs
 *    times it before each residual add;
 *  - `logit_scale` (logits_scaling): the logits divided by it.
 * Absent (or 0), each is neutral, as llama.cpp reads them; `logit_scale`
 * is required, as llama.cpp requires it (the converter always has one to
 * write: GraniteConfig's default is 1). llama.cpp also reads
 * `rope.scaling.finetuned` = false as "no RoPE at all"; transformers always
 * rotates, so such a file is refused. */
#include <math.h>

#include "model/arch.h"
#include "model/model_internal.h"

static const char *const keys[] = {
    "attention.scale", "embedding_scale", "residual_scale", "logit_scale", NULL,
};

/* An optional multiplier: absent or 0 leaves *out alone; else finite. */
static enum kvb_status read_mult(struct model *m, const char *suffix, float *out, struct kvb_err *err)
{
    float v;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, suffix, 0.0f, NULL, &v, err));
    if (!isfinite(v)) {
        char key[128];
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a finite number",
                        model_key(m, suffix, key, sizeof key), (double)v);
    }
    if (v != 0.0f) *out = v;
    return KVB_OK;
}

static enum kvb_status read_granite(struct model *m, struct kvb_err *err)
{
    char key[128];
    const struct gguf_value *ft = gguf_find(m->gguf, model_key(m, "rope.scaling.finetuned", key, sizeof key));
    if (ft && ft->type == GGUF_VTYPE_BOOL && !ft->v.b)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' = false: llama.cpp reads it as a granite without RoPE, which transformers "
                        "does not compute, nor does kvbatch",
                        key);
    bool given;
    float div;
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "logit_scale", 0.0f, &given, &div, err));
    if (!given)
        return kvb_errf(err, KVB_ERR_FORMAT, "model is missing required key '%s'",
                        model_key(m, "logit_scale", key, sizeof key));
    if (!isfinite(div) || div <= 0)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a positive number",
                        model_key(m, "logit_scale", key, sizeof key), (double)div);
    m->ops.logit_div = div;
    KVB_FORWARD_IF_ERROR(read_mult(m, "embedding_scale", &m->ops.embd_scale, err));
    KVB_FORWARD_IF_ERROR(read_mult(m, "attention.scale", &m->ops.attn_scale, err));
    return read_mult(m, "residual_scale", &m->ops.resid_scale, err);
}

const struct arch_desc arch_granite = {
    .name = "granite",
    .rope = ROPE_NORM,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_ABSENT,
    .qk_norm = ARCH_ABSENT,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_OPTIONAL,
    .keys = keys,
    .read = read_granite,
};
