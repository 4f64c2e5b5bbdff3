/* arch_qwen2moe.c — "qwen2moe": Qwen1.5-MoE-A2.7B and Qwen2-57B-A14B,
 * computed as transformers' Qwen2MoeForCausalLM computes them.
 *
 * The Qwen2 attention (arch_qwen2.c: Q/K/V biases, NeoX RoPE) with a
 * mixture of experts for the FFN of every layer: softmax routing over
 * `expert_count` experts, the top `expert_used_count` taken as they are
 * (not renormalised), each expert `expert_feed_forward_length` wide, plus
 * a shared expert `expert_shared_feed_forward_length` wide that every
 * token runs, added times the sigmoid of its own gate's logit
 * (model_moe.c). The output head is its own (llama.cpp requires
 * output.weight). */
#include "model/arch.h"

const struct arch_desc arch_qwen2moe = {
    .name = "qwen2moe",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_OPTIONAL,
    .qk_norm = ARCH_ABSENT,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_REQUIRED,
    .moe = ARCH_REQUIRED,
    .moe_norm_topk = false,
    .moe_ff_key = true,
    .moe_shared = true,
};
