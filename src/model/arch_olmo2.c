/* arch_olmo2.c — "olmo2": OLMo 2 (1B-32B), computed as transformers'
 * Olmo2ForCausalLM computes them; the converter also writes OLMo 3 under
 * this name (below).
 *
 * The layer norms only after: attention reads the residual stream as it is,
 * its output is RMSNormed (post_attention_norm) and added; the SwiGLU FFN
 * likewise (post_ffw_norm) — no attn_norm, no ffn_norm. Q and K are each
 * RMSNormed over the whole projection (attn_q_norm of n_head * head_dim,
 * attn_k_norm of n_head_kv * head_dim) before RoPE, not per head as in
 * Qwen 3. NeoX RoPE (the converter is TextModel's: no permutation). The
 * output head is tied to the embeddings when output.weight is absent, as
 * transformers computes a tied config (llama.cpp requires the tensor).
 *
 * OLMo 3 (Olmo3ForCausalLM, converted as olmo2): the same layer with
 * sliding-window attention on the layers `attention.sliding_window_pattern`
 * marks (the converter always writes it; without it every fourth layer is
 * global, llama.cpp's load_swa_pattern(4)), whose RoPE is unscaled with base
 * `rope.freq_base_swa` (absent: the global base), as transformers'
 * per-layer-type rotary embedding computes it. */
#include <math.h>

#include "model/arch.h"
#include "model/model_internal.h"

static const char *const keys[] = {
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.freq_base_swa",
    NULL,
};

static enum kvb_status read_olmo2(struct model *m, struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(model_read_swa(m, 0, 4, err));
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, "rope.freq_base_swa", m->hp.rope_base, NULL, &m->ops.rope_base_swa, err));
    if (!isfinite(m->ops.rope_base_swa) || m->ops.rope_base_swa <= 0) {
        char key[128];
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a positive number",
                        model_key(m, "rope.freq_base_swa", key, sizeof key), (double)m->ops.rope_base_swa);
    }
    return KVB_OK;
}

const struct arch_desc arch_olmo2 = {
    .name = "olmo2",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_ABSENT,
    .qk_norm = ARCH_REQUIRED,
    .post_norms = ARCH_REQUIRED,
    .output = ARCH_OPTIONAL,
    .no_pre_norms = true,
    .qk_norm_whole = true,
    .keys = keys,
    .read = read_olmo2,
};
