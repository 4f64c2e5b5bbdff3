/* k_sample.cu — the greedy choice over logits rows on the device (see
 * kernels.h), so that a greedy decode step copies one int per sequence to
 * the host instead of a row of n_vocab floats.
 *
 * The rule is sampler_greedy's, exactly: the largest value that is not NaN,
 * the lowest index among equals, none (-1) when every value is NaN or -inf.
 * Comparisons are exact, so the order of the reduction cannot change the
 * answer: each thread scans its strided indices upwards with a strict `>`,
 * and the tree below breaks ties by index. */
#include "kernels/kernels.h"

#define ARGMAX_THREADS 256

/* (v, i) beside (w, j): which one the rule picks. i < 0 means none. */
__device__ static bool argmax_takes(float v, int32_t i, float w, int32_t j)
{
    if (j < 0) return false;
    if (i < 0) return true;
    return w > v || (w == v && j < i);
}

__global__ static void argmax_kernel(int32_t *out, const float *x, int64_t ld, const int32_t *rows, int32_t n)
{
    __shared__ float val[ARGMAX_THREADS];
    __shared__ int32_t at[ARGMAX_THREADS];
    const float *row = x + (int64_t)(rows ? rows[blockIdx.x] : (int32_t)blockIdx.x) * ld;
    float best = -INFINITY;
    int32_t best_i = -1;
    for (int32_t i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        const float v = row[i];
        if (v > best) { /* NaN never wins; -inf never counts */
            best = v;
            best_i = i;
        }
    }
    val[threadIdx.x] = best;
    at[threadIdx.x] = best_i;
    __syncthreads();
    for (int s = ARGMAX_THREADS / 2; s > 0; s >>= 1) {
        const int t = threadIdx.x;
        if (t < s && argmax_takes(val[t], at[t], val[t + s], at[t + s])) {
            val[t] = val[t + s];
            at[t] = at[t + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = at[0];
}

extern "C" cudaError_t kcu_argmax(int32_t *out, const float *x, int64_t ld, const int32_t *rows, int32_t n_rows,
                                  int32_t n, cudaStream_t stream)
{
    if (n_rows < 0 || n <= 0 || ld < n) return n_rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    argmax_kernel<<<n_rows, ARGMAX_THREADS, 0, stream>>>(out, x, ld, rows, n);
    return cudaGetLastError();
}
