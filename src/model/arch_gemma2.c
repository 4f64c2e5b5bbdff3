/* arch_gemma2.c — "gemma2": Gemma 2 (2B, 9B, 27B), computed as
 * transformers' Gemma2ForCausalLM computes them.
 *
 * The Gemma 3 layer (arch_gemma3.c: post-attention and post-FFN norms,
 * GeGLU with tanh GELU, embeddings times sqrt(hidden), norms written with
 * Gemma's +1 folded in by the converter, NeoX RoPE) without the Q/K norms,
 * with one RoPE for every layer, and with soft-capping: each attention score
 * s becomes c tanh(s / c) with c = `attn_logit_softcapping` (50), after the
 * query scale and before the mask, and each logit likewise with
 * `final_logit_softcapping` (30). Every other layer, starting with the
 * first, attends through a window of `attention.sliding_window` (4096 when
 * absent, as in llama.cpp; the pattern key may say otherwise). The output
 * head is always the embedding (the converter writes no output.weight, and
 * llama.cpp reads none). RoPE scaling, which transformers would apply to
 * every layer, is not computed for gemma2: no released model has it. */
#include <math.h>

#include "model/arch.h"
#include "model/model_internal.h"

static const char *const keys[] = {
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    NULL,
};

static enum kvb_status read_gemma2(struct model *m, struct kvb_err *err)
{
    if (m->rope.type != ROPE_SCALING_NONE || m->rope.mscale != 1.0f) {
        char key[128];
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "model key '%s': RoPE scaling on gemma2 is not computed by kvbatch",
                        model_key(m, "rope.scaling.type", key, sizeof key));
    }
    m->ops.embd_scale = (float)sqrt((double)m->hp.n_embd);
    m->ops.attn_scale = gemma_attn_scale(m, 46);
    m->ops.rope_base_swa = m->hp.rope_base;
    KVB_FORWARD_IF_ERROR(model_read_swa(m, 4096, 2, err));
    KVB_FORWARD_IF_ERROR(model_read_softcap(m, "attn_logit_softcapping", &m->ops.attn_softcap, err));
    return model_read_softcap(m, "final_logit_softcapping", &m->ops.final_softcap, err);
}

const struct arch_desc arch_gemma2 = {
    .name = "gemma2",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_GELU_TANH,
    .qkv_bias = ARCH_ABSENT,
    .qk_norm = ARCH_ABSENT,
    .post_norms = ARCH_REQUIRED,
    .output = ARCH_ABSENT,
    .keys = keys,
    .read = read_gemma2,
};
