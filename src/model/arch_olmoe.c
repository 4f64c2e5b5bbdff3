/* arch_olmoe.c — "olmoe": OLMoE (1B-7B), computed as transformers'
 * OlmoeForCausalLM computes it.
 *
 * The llama layer with an RMSNorm over the whole Q projection and over the
 * whole K projection (OlmoeAttention's q_norm and k_norm: hidden and
 * kv-heads x head_dim wide, before the heads are split and rotated), NeoX
 * RoPE (the converter does not permute OLMoE's rows), no biases, its own
 * output head, and a mixture of experts for the FFN of every layer:
 * softmax routing over `expert_count` experts, the top `expert_used_count`
 * taken as they are (not renormalised), each expert `feed_forward_length`
 * wide (model_moe.c). OLMoE's clip_qkv is null in the released config; the
 * converter writes no clamp for olmoe, and a file with one is refused
 * (model_check.c, `attention.clamp_kqv`). */
#include "model/arch.h"

const struct arch_desc arch_olmoe = {
    .name = "olmoe",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_ABSENT,
    .qk_norm = ARCH_REQUIRED,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_REQUIRED,
    .qk_norm_whole = true,
    .moe = ARCH_REQUIRED,
    .moe_norm_topk = false,
};
