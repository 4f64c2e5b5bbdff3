/* arch_phi3.c — "phi3": Phi-3 (mini, small, medium), Phi-3.5-mini, Phi-4
 * and Phi-4-mini, computed as transformers' Phi3ForCausalLM computes them.
 *
 * The llama layer (pre-norms, SwiGLU, NeoX RoPE: the converter does not
 * permute Phi's rows) in the converter's layout: Q, K and V rows in one
 * blk.N.attn_qkv (transformers' qkv_proj, cut in that order), gate and up
 * rows in one blk.N.ffn_up (gate_up_proj, chunked gate first), bound as row
 * ranges of those tensors (model.c), so the backends see the usual matrices.
 *
 * RoPE may rotate only the first `rope.dimension_count` dims of each head
 * (Phi-4-mini's partial_rotary_factor 0.75: rotate-half within them).
 * LongRoPE (the 128k models, Phi-3.5, Phi-4-mini): every frequency is
 * divided by a per-pair factor, the short set (rope_factors_short.weight)
 * or the long one (rope_factors_long.weight), and cos/sin are multiplied by
 * the attention factor the converter writes as `rope.scaling.attn_factor`
 * (sqrt(1 + ln(s) / ln(orig)), s = context / original context, as
 * transformers derives it; model_rope.c reads it). transformers picks the
 * set by the sequence's length (long past `original_max_position_embeddings`
 * = `rope.scaling.original_context_length`); kvbatch by the run's context,
 * as llama.cpp does (model_set_ctx in model.h says why and what it means).
 *
 * `attention.sliding_window`: every layer attends through the window when
 * it is set, with the same RoPE as without one (transformers'
 * sliding-window mask for Phi-3-mini-4k's 2047;
 * llama.cpp turns Phi's window off, transformers does not). The converter
 * writes 0 where the config has none (Phi-4). No RoPE scaling type: the
 * Phi-3 converter writes none, and transformers computes Phi-3 with the
 * default RoPE or LongRoPE only. */
#include "model/arch.h"
#include "model/model_internal.h"

static const char *const keys[] = {
    "attention.sliding_window",
    NULL,
};

static enum kvb_status read_phi3(struct model *m, struct kvb_err *err)
{
    char key[128];
    if (m->rope.type != ROPE_SCALING_NONE)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s': phi3 is computed with LongRoPE factors or no RoPE scaling, not linear or "
                        "yarn scaling",
                        model_key(m, "rope.scaling.type", key, sizeof key));
    uint32_t orig = 0;
    enum kvb_status st =
        gguf_get_u32(m->gguf, model_key(m, "rope.scaling.original_context_length", key, sizeof key), &orig, NULL);
    if (st == KVB_OK) {
        if (orig < 1 || orig > INT32_MAX)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u is not a usable context length", key, orig);
        m->rope.orig_ctx = (int32_t)orig;
    } else if (st != KVB_ERR_NOT_FOUND) {
        return gguf_get_u32(m->gguf, key, &orig, err);
    }
    /* Period 0: every layer windowed (llama.cpp's set_swa_pattern(0)), each
     * rotating as without a window (Phi-3 has one RoPE). */
    m->ops.swa_same_rope = true;
    return model_read_swa(m, 0, 0, err);
}

const struct arch_desc arch_phi3 = {
    .name = "phi3",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_ABSENT,
    .qk_norm = ARCH_ABSENT,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_OPTIONAL,
    .fused_qkv = ARCH_OPTIONAL,
    .fused_gate_up = true,
    .partial_rope = true,
    .longrope = ARCH_OPTIONAL,
    .keys = keys,
    .read = read_phi3,
};
