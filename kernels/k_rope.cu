/* k_rope.cu — rotary position embedding in place over Q or K rows (see
 * kernels.h). One thread block per token, one thread per (head, pair).
 * theta = (float)pos * inv_freq[i] and cosf/sinf times mscale as in attn_rope
 * (RoPE scaling lives in the frequencies and mscale: model_rope_freqs); the
 * device's cosf/sinf (not the fast __cosf intrinsics) are within 2 ulp of
 * the host's, so results match the CPU to rounding. */
#include "kernels/kernels.h"

__global__ static void rope_kernel(float *x, int64_t ld, int32_t n_heads, int32_t head_dim, int32_t rope_dim, int neox,
                                   const int32_t *tok_pos, const float *inv_freq, float mscale)
{
    const int32_t t = blockIdx.x, half = rope_dim / 2;
    const float pos = (float)tok_pos[t];
    float *row = x + (int64_t)t * ld;
    for (int32_t k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int32_t h = k / half, i = k % half;
        const float theta = pos * inv_freq[i];
        const float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
        float *v = row + (int64_t)h * head_dim;
        const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

extern "C" cudaError_t kcu_rope(float *x, int64_t ld, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                                int32_t rope_dim, int neox, const int32_t *tok_pos, const float *inv_freq, float mscale,
                                cudaStream_t stream)
{
    if (n_tok < 0 || n_heads < 0 || rope_dim < 0 || rope_dim > head_dim) return cudaErrorInvalidValue;
    if (n_tok == 0 || n_heads == 0 || rope_dim < 2) return cudaSuccess;
    rope_kernel<<<n_tok, 128, 0, stream>>>(x, ld, n_heads, head_dim, rope_dim, neox, tok_pos, inv_freq, mscale);
    return cudaGetLastError();
}
