/* arch_qwen3moe.c — "qwen3moe": Qwen3-MoE (30B-A3B, 235B-A22B), computed
 * as transformers' Qwen3MoeForCausalLM computes them.
 *
 * The Qwen3 attention (arch_qwen3.c: an RMSNorm of each Q and K head before
 * RoPE, NeoX RoPE, biases only when the file has them) with a mixture of
 * experts for the FFN of every layer: softmax routing over
 * `expert_count` experts, the top `expert_used_count` renormalised, each
 * expert `expert_feed_forward_length` wide (model_moe.c says why
 * renormalised, and what the converter leaves out). */
#include "model/arch.h"

const struct arch_desc arch_qwen3moe = {
    .name = "qwen3moe",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_OPTIONAL,
    .qk_norm = ARCH_REQUIRED,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_OPTIONAL,
    .moe = ARCH_REQUIRED,
    .moe_norm_topk = true,
    .moe_ff_key = true,
};
