/* arch_gemma3.c — "gemma3": Gemma 3 text models (270M to 27B), computed as
 * transformers' Gemma3ForCausalLM computes them.
 *
 * Per layer: RMSNorm, attention, RMSNorm of its output (post_attention_norm),
 * residual; RMSNorm, GeGLU FFN (tanh GELU), RMSNorm of its output
 * (post_ffw_norm), residual. Each Q and K head is RMSNormed before RoPE;
 * RoPE is NeoX (rotate-half: the converter does not permute Gemma's rows).
 * Embeddings are multiplied by sqrt(hidden), in float32 (transformers'
 * Gemma3TextScaledWordEmbedding multiplies by the scale cast to the weights'
 * dtype: f32 for the float32 reference).
 *
 * Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter adds the 1
 * to every *norm.weight when it writes the file (Gemma3Model.norm_shift), so
 * the file's norms are plain RMSNorm weights — nothing to add here.
 *
 * Layers alternate between sliding-window and global attention: the window
 * is `attention.sliding_window` (none when absent or 0), the pattern
 * `attention.sliding_window_pattern` or, as the converter writes none,
 * every sixth layer global (transformers' default sliding_window_pattern
 * 6, llama.cpp's load_swa_pattern(6)). Windowed layers rotate with their own
 * base, `rope.freq_base_swa` (default 10000: rope_local_base_freq) and no
 * RoPE scaling; global layers with `rope.freq_base` and the file's scaling
 * (the 4B-27B files' linear factor 8), as transformers' per-layer-type
 * rotary embedding does.
 *
 * The query scale is query_pre_attn_scalar^-0.5, which no GGUF key carries;
 * llama.cpp computes it from the model's size (27B: hidden / heads, else
 * head_dim), which is what every released Gemma 3 config says, and so does
 * kvbatch. `final_logit_softcapping` caps the logits when the file has it;
 * attention soft-capping was removed in Gemma 3 (the key must be absent or
 * 0, model_check.c). */
#include <math.h>

#include "model/arch.h"
#include "model/model_internal.h"

static const char *const keys[] = {
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.freq_base_swa",
    "final_logit_softcapping",
    NULL,
};

/* llama.cpp's gemma2/gemma3 query scale: 1/sqrt(hidden / heads) for the
 * 27B models (their query_pre_attn_scalar), 1/sqrt(head_dim) otherwise. */
float gemma_attn_scale(const struct model *m, int32_t n_layer_27b)
{
    const struct model_hparams *hp = &m->hp;
    const double qpas = hp->n_layer == n_layer_27b ? (double)(hp->n_embd / hp->n_head) : (double)hp->head_dim;
    return (float)(1.0 / sqrt(qpas));
}

static enum kvb_status read_gemma3(struct model *m, struct kvb_err *err)
{
    m->ops.embd_scale = (float)sqrt((double)m->hp.n_embd);
    m->ops.attn_scale = gemma_attn_scale(m, 62);
    KVB_FORWARD_IF_ERROR(model_read_swa(m, 0, 6, err));
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.freq_base_swa", 10000.0f, NULL, &m->ops.rope_base_swa, err));
    if (!isfinite(m->ops.rope_base_swa) || m->ops.rope_base_swa <= 0) {
        char key[128];
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a positive number",
                        model_key(m, "rope.freq_base_swa", key, sizeof key), (double)m->ops.rope_base_swa);
    }
    return model_read_softcap(m, "final_logit_softcapping", &m->ops.final_softcap, err);
}

const struct arch_desc arch_gemma3 = {
    .name = "gemma3",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_GELU_TANH,
    .qkv_bias = ARCH_ABSENT,
    .qk_norm = ARCH_REQUIRED,
    .post_norms = ARCH_REQUIRED,
    .output = ARCH_OPTIONAL,
    .keys = keys,
    .read = read_gemma3,
};
