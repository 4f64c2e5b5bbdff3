/* arch_llama.c — "llama": Llama 2/3, SmolLM2, TinyLlama, Mistral, and the
 * many fine-tunes converted as LlamaForCausalLM.
 *
 * The plain pre-norm layer: RMSNorm, attention, residual; RMSNorm, SwiGLU
 * FFN, residual. convert_hf_to_gguf permutes Q and K rows so that RoPE
 * rotates adjacent pairs (ROPE_NORM). Biases and per-head Q/K norms are
 * taken when a file has them (llama.cpp binds them optionally for llama);
 * the output head is tied to the embeddings when output.weight is absent.
 * RoPE scaling (linear, yarn, Llama 3's rope_freqs) is the common loader's. */
#include "model/arch.h"

const struct arch_desc arch_llama = {
    .name = "llama",
    .rope = ROPE_NORM,
    .act = MODEL_ACT_SILU,
    .qkv_bias = ARCH_OPTIONAL,
    .qk_norm = ARCH_OPTIONAL,
    .post_norms = ARCH_ABSENT,
    .output = ARCH_OPTIONAL,
};
