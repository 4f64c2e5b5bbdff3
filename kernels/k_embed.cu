/* k_embed.cu — embedding lookup: gathers each token's row of the bf16
 * embedding table into the f32 activations (see kernels.h). bf16 -> f32 is
 * exact (a shift), so the only difference from the CPU backend is the bf16
 * rounding of the table made once at upload. */
#include "kernels/kernels.h"

__global__ static void embed_kernel(float *out, const uint16_t *table, const int32_t *tokens, int32_t n_embd)
{
    const int32_t t = blockIdx.x;
    const uint16_t *row = table + (int64_t)tokens[t] * n_embd;
    float *dst = out + (int64_t)t * n_embd;
    for (int32_t i = threadIdx.x; i < n_embd; i += blockDim.x) dst[i] = __uint_as_float((uint32_t)row[i] << 16);
}

extern "C" cudaError_t kcu_embed(float *out, const uint16_t *table, const int32_t *tokens, int32_t n_tok,
                                 int32_t n_embd, cudaStream_t stream)
{
    if (n_tok < 0 || n_embd < 0) return cudaErrorInvalidValue;
    if (n_tok == 0 || n_embd == 0) return cudaSuccess;
    embed_kernel<<<n_tok, 256, 0, stream>>>(out, table, tokens, n_embd);
    return cudaGetLastError();
}
