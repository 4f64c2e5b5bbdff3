/* arch_qwen2.c — "qwen2": Qwen2 and Qwen2.5. The llama layer with Q/K/V
 * biases (always present) and NeoX RoPE (rotate-half: the converter does
 * not permute Qwen's rows). */
#include "model/arch.h"

const struct arch_desc arch_qwen2 = {
    .name = "qwen2",
    .rope = ROPE_NEOX,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_REQUIRED,
    .qk_norm = ARCH_OPTIONAL,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_OPTIONAL,
};
