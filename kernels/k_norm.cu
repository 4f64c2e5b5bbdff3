/* k_norm.cu — RMSNorm, one thread block per (row, sub-row) (see kernels.h).
 *
 * The sum of squares is reduced in a fixed order — each thread sums its
 * strided elements in index order, then a fixed shared-memory tree — so the
 * result for a row is the same whatever else is in the batch. It differs from
 * the CPU's sequential sum by rounding only. */
#include "kernels/kernels.h"

#include <cuda_bf16.h>

#define NORM_THREADS 256

/* The result as stored: f32 as is, or rounded to bf16 (a GEMM's input:
 * the same bits as kcu_f32_to_bf16 of the f32 result, one launch less). */
__device__ static void put(float *p, float v) { *p = v; }
__device__ static void put(uint16_t *p, float v) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <typename OutT>
__global__ static void rmsnorm_kernel(OutT *out, int64_t out_ld, const float *x, int64_t x_ld, const int32_t *rows,
                                      int32_t n_sub, int32_t n, const float *w, float eps)
{
    __shared__ float part[NORM_THREADS];
    const int32_t r = blockIdx.x / n_sub, j = blockIdx.x % n_sub;
    const float *src = x + (int64_t)(rows ? rows[r] : r) * x_ld + (int64_t)j * n;
    OutT *dst = out + (int64_t)r * out_ld + (int64_t)j * n;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += NORM_THREADS) ss += src[i] * src[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    /* Same expression as attn_rmsnorm. Every thread has read what it
     * writes below before the barriers above, so out may alias x. */
    const float scale = 1.0f / sqrtf(part[0] / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += NORM_THREADS) put(&dst[i], src[i] * scale * w[i]);
}

extern "C" cudaError_t kcu_rmsnorm(float *out, int64_t out_ld, const float *x, int64_t x_ld, const int32_t *rows,
                                   int32_t n_rows, int32_t n_sub, int32_t n, const float *w, float eps,
                                   cudaStream_t stream)
{
    if (n_rows < 0 || n_sub <= 0 || n <= 0) return n_rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    if ((int64_t)n_rows * n_sub > 0x7fffffff) return cudaErrorInvalidValue;
    rmsnorm_kernel<float><<<n_rows * n_sub, NORM_THREADS, 0, stream>>>(out, out_ld, x, x_ld, rows, n_sub, n, w, eps);
    return cudaGetLastError();
}

/* kcu_rmsnorm_add: the same reduction, the result added to y's row. */
__global__ static void rmsnorm_add_kernel(float *y, const float *x, int32_t n, const float *w, float eps)
{
    __shared__ float part[NORM_THREADS];
    const float *src = x + (int64_t)blockIdx.x * n;
    float *dst = y + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += NORM_THREADS) ss += src[i] * src[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float scale = 1.0f / sqrtf(part[0] / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += NORM_THREADS) dst[i] += src[i] * scale * w[i];
}

extern "C" cudaError_t kcu_rmsnorm_add(float *y, const float *x, int32_t n_rows, int32_t n, const float *w, float eps,
                                       cudaStream_t stream)
{
    if (n_rows < 0 || n <= 0) return n_rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    rmsnorm_add_kernel<<<n_rows, NORM_THREADS, 0, stream>>>(y, x, n, w, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_rmsnorm_bf16(uint16_t *out, int64_t out_ld, const float *x, int64_t x_ld,
                                        const int32_t *rows, int32_t n_rows, int32_t n, const float *w, float eps,
                                        cudaStream_t stream)
{
    if (n_rows < 0 || n <= 0) return n_rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    rmsnorm_kernel<uint16_t><<<n_rows, NORM_THREADS, 0, stream>>>(out, out_ld, x, x_ld, rows, 1, n, w, eps);
    return cudaGetLastError();
}
