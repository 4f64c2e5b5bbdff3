/* arch_qwen3.c — "qwen3": Qwen3 dense. The llama layer with an RMSNorm of
 * each Q and K head before RoPE (always present), no biases unless the
 * file has them, and NeoX RoPE. */
#include "model/arch.h"

const struct arch_desc arch_qwen3 = {
    .name = "qwen3",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_OPTIONAL,
    .qk_norm = ARCH_REQUIRED,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_OPTIONAL,
};
