/* k_act.cu — elementwise kernels: SwiGLU and GeGLU, residual add, bias add,
 * scaling, soft-capping and the f32 -> bf16 conversion that feeds every GEMM
 * (see kernels.h). Grid-stride
 * loops over 64-bit indices: a 4096-token step through a 14336-wide FFN has
 * more elements than a 32-bit int counts comfortably. */
#include "kernels/kernels.h"

#include <cuda_bf16.h>

#define ACT_THREADS 256

static unsigned act_grid(int64_t n)
{
    int64_t b = (n + ACT_THREADS - 1) / ACT_THREADS;
    return (unsigned)(b < 65536 ? b : 65536);
}

__device__ static void put(float *p, float v) { *p = v; }
__device__ static void put(uint16_t *p, float v) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

/* The gate's activation: SiLU (attn_swiglu's expression) or tanh GELU
 * (attn_geglu's). */
template <bool GELU> __device__ static float gate_act(float g)
{
    if (GELU) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

template <typename OutT, bool GELU>
__global__ static void swiglu_kernel(OutT *out, const float *gu, int32_t n_ff, int64_t n)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / n_ff, i = k % n_ff;
        const float g = gu[t * 2 * n_ff + i], u = gu[t * 2 * n_ff + n_ff + i];
        put(&out[k], gate_act<GELU>(g) * u);
    }
}

__global__ static void scale_kernel(float *y, int64_t n, float s)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
        y[k] *= s;
}

__global__ static void softcap_kernel(float *x, int64_t ld, int32_t n, int64_t total, float cap)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        float *p = x + (k / n) * ld + k % n;
        *p = cap * tanhf(*p / cap); /* attn_softcap_ref's expression */
    }
}

__global__ static void add_kernel(float *y, const float *x, int64_t n)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
        y[k] += x[k];
}

__global__ static void add_bias_kernel(float *y, int64_t ld, const float *b, int32_t n, int64_t total)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x)
        y[(k / n) * ld + k % n] += b[k % n];
}

__global__ static void to_bf16_kernel(uint16_t *y, const float *x, int64_t n)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
        y[k] = __bfloat16_as_ushort(__float2bfloat16_rn(x[k]));
}

extern "C" cudaError_t kcu_swiglu(float *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream)
{
    if (n_tok < 0 || n_ff < 0) return cudaErrorInvalidValue;
    const int64_t n = (int64_t)n_tok * n_ff;
    if (n == 0) return cudaSuccess;
    swiglu_kernel<float, false><<<act_grid(n), ACT_THREADS, 0, stream>>>(out, gu, n_ff, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_swiglu_bf16(uint16_t *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream)
{
    if (n_tok < 0 || n_ff < 0) return cudaErrorInvalidValue;
    const int64_t n = (int64_t)n_tok * n_ff;
    if (n == 0) return cudaSuccess;
    swiglu_kernel<uint16_t, false><<<act_grid(n), ACT_THREADS, 0, stream>>>(out, gu, n_ff, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_geglu(float *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream)
{
    if (n_tok < 0 || n_ff < 0) return cudaErrorInvalidValue;
    const int64_t n = (int64_t)n_tok * n_ff;
    if (n == 0) return cudaSuccess;
    swiglu_kernel<float, true><<<act_grid(n), ACT_THREADS, 0, stream>>>(out, gu, n_ff, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_geglu_bf16(uint16_t *out, const float *gu, int32_t n_tok, int32_t n_ff, cudaStream_t stream)
{
    if (n_tok < 0 || n_ff < 0) return cudaErrorInvalidValue;
    const int64_t n = (int64_t)n_tok * n_ff;
    if (n == 0) return cudaSuccess;
    swiglu_kernel<uint16_t, true><<<act_grid(n), ACT_THREADS, 0, stream>>>(out, gu, n_ff, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_scale(float *y, int64_t n, float s, cudaStream_t stream)
{
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    scale_kernel<<<act_grid(n), ACT_THREADS, 0, stream>>>(y, n, s);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_softcap(float *x, int64_t ld, int32_t n_rows, int32_t n, float cap, cudaStream_t stream)
{
    if (n_rows < 0 || n < 0 || !(cap > 0)) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n_rows * n;
    if (total == 0) return cudaSuccess;
    softcap_kernel<<<act_grid(total), ACT_THREADS, 0, stream>>>(x, ld, n, total, cap);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_add(float *y, const float *x, int64_t n, cudaStream_t stream)
{
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    add_kernel<<<act_grid(n), ACT_THREADS, 0, stream>>>(y, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_add_bias(float *y, int64_t ld, const float *b, int32_t n_rows, int32_t n,
                                    cudaStream_t stream)
{
    if (n_rows < 0 || n < 0) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n_rows * n;
    if (total == 0) return cudaSuccess;
    add_bias_kernel<<<act_grid(total), ACT_THREADS, 0, stream>>>(y, ld, b, n, total);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_f32_to_bf16(uint16_t *y, const float *x, int64_t n, cudaStream_t stream)
{
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    to_bf16_kernel<<<act_grid(n), ACT_THREADS, 0, stream>>>(y, x, n);
    return cudaGetLastError();
}
