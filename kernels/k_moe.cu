/* k_moe.cu — the mixture-of-experts kernels (see kernels.h): each token's
 * routing from its router logits, the plan that numbers the routed rows
 * grouped by expert, the gather of the experts' input rows and the weighted
 * sum of their outputs back into token order. The products themselves are
 * cuBLAS GEMMs, one per expert over its rows (be_cuda_moe.c).
 *
 * Each result is computed by one thread in a fixed order (a token's routing,
 * an expert's rows, an output element's sum over its experts), so it depends
 * on nothing but its own inputs: no atomics, no order that varies with the
 * batch. */
#include "kernels/kernels.h"

#include <cuda_bf16.h>

#define MOE_THREADS 256
#define PLAN_THREADS 256

static unsigned moe_grid(int64_t n)
{
    int64_t b = (n + MOE_THREADS - 1) / MOE_THREADS;
    return (unsigned)(b < 65536 ? b : 65536);
}

/* Whether expert a ranks before expert b: the larger probability, ties to
 * the lower id (the CPU's selection: strictly larger replaces). */
__device__ static bool ranks_before(float pa, int32_t a, float pb, int32_t b) { return pa > pb || (pa == pb && a < b); }

/* One thread per token: softmax over the experts (max, exps summed in
 * expert order, divisions), the k highest by rank, each pick the best
 * expert ranked after the previous one (no marks to keep), renormalised
 * when norm, then sorted by expert id — cpu_moe_route's steps. */
__global__ static void route_kernel(int32_t *sel, float *wts, const float *logits, int64_t ld, int32_t n_tok,
                                    int32_t n_expert, int32_t k, int norm)
{
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n_tok; t += (int64_t)gridDim.x * blockDim.x) {
        const float *l = logits + t * ld;
        int32_t *s = sel + t * k;
        float *w = wts + t * k;
        float mx = l[0];
        for (int32_t i = 1; i < n_expert; i++) mx = l[i] > mx ? l[i] : mx;
        float sum = 0.0f;
        for (int32_t i = 0; i < n_expert; i++) sum += expf(l[i] - mx);
        float tsum = 0.0f, prev_p = 0.0f;
        int32_t prev = -1;
        for (int32_t j = 0; j < k; j++) {
            int32_t b = -1;
            float pb = 0.0f;
            for (int32_t i = 0; i < n_expert; i++) {
                const float p = expf(l[i] - mx) / sum;
                if (prev >= 0 && !ranks_before(prev_p, prev, p, i)) continue; /* taken already */
                if (b < 0 || ranks_before(p, i, pb, b)) {
                    b = i;
                    pb = p;
                }
            }
            s[j] = b;
            w[j] = pb;
            tsum += pb;
            prev = b;
            prev_p = pb;
        }
        if (norm)
            for (int32_t j = 0; j < k; j++) w[j] /= tsum;
        for (int32_t j = 1; j < k; j++) /* insertion sort by expert id */
            for (int32_t q = j; q > 0 && s[q - 1] > s[q]; q--) {
                const int32_t si = s[q];
                s[q] = s[q - 1];
                s[q - 1] = si;
                const float wi = w[q];
                w[q] = w[q - 1];
                w[q - 1] = wi;
            }
    }
}

/* One block. Thread e (strided over the experts) counts expert e's routed
 * rows, thread 0 makes the offsets, then thread e numbers expert e's rows
 * in token order. start[e + 1] holds the count in between: global memory
 * written before __syncthreads is seen by the whole block after it. */
__global__ static void plan_kernel(int32_t *start, int32_t *slot, int32_t *row_tok, const int32_t *sel, int64_t nr,
                                   int32_t k, int32_t n_expert)
{
    for (int32_t e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int32_t n = 0;
        for (int64_t i = 0; i < nr; i++) n += sel[i] == e;
        start[e + 1] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        start[0] = 0;
        for (int32_t e = 0; e < n_expert; e++) start[e + 1] += start[e];
    }
    __syncthreads();
    for (int32_t e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int32_t r = start[e];
        for (int64_t i = 0; i < nr; i++)
            if (sel[i] == e) {
                slot[i] = r;
                row_tok[r] = (int32_t)(i / k);
                r++;
            }
    }
}

__global__ static void gather_kernel(uint16_t *xg, const uint16_t *x, int64_t ld, const int32_t *row_tok, int32_t n,
                                     int64_t total)
{
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < total; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = q / n, i = q % n;
        xg[r * n + i] = x[row_tok[r] * ld + i];
    }
}

/* out[t][i]: token t's experts in ascending id, each product rounded and
 * then added (c = 0 assigns), then the shared expert's times its gate's
 * sigmoid — the CPU's sum_rows expression for expression. */
__global__ static void combine_kernel(float *out, const float *yd, const int32_t *slot, const float *wts, int32_t k,
                                      int32_t n, const float *ys, const float *sg, int64_t sg_ld, int64_t total)
{
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < total; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = q / n, i = q % n;
        float o = 0.0f;
        for (int32_t c = 0; c < k; c++) {
            const float wy = yd[(int64_t)slot[t * k + c] * n + i] * wts[t * k + c];
            if (c == 0) o = wy;
            else o += wy;
        }
        if (ys) {
            const float s = 1.0f / (1.0f + expf(-sg[t * sg_ld]));
            const float sy = ys[t * n + i] * s;
            o += sy;
        }
        out[q] = o;
    }
}

extern "C" cudaError_t kcu_moe_route(int32_t *sel, float *wts, const float *logits, int64_t ld, int32_t n_tok,
                                     int32_t n_expert, int32_t k, int norm, cudaStream_t stream)
{
    if (n_tok < 0 || n_expert <= 0 || k <= 0 || k > n_expert || ld < n_expert) return cudaErrorInvalidValue;
    if (n_tok == 0) return cudaSuccess;
    route_kernel<<<moe_grid(n_tok), MOE_THREADS, 0, stream>>>(sel, wts, logits, ld, n_tok, n_expert, k, norm);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_moe_plan(int32_t *start, int32_t *slot, int32_t *row_tok, const int32_t *sel, int32_t n_tok,
                                    int32_t k, int32_t n_expert, cudaStream_t stream)
{
    if (n_tok < 0 || k <= 0 || n_expert <= 0 || (int64_t)n_tok * k > 0x7fffffff) return cudaErrorInvalidValue;
    plan_kernel<<<1, PLAN_THREADS, 0, stream>>>(start, slot, row_tok, sel, (int64_t)n_tok * k, k, n_expert);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_moe_gather(uint16_t *xg, const uint16_t *x, int64_t ld, const int32_t *row_tok,
                                      int32_t n_rows, int32_t n, cudaStream_t stream)
{
    if (n_rows < 0 || n < 0 || ld < n) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n_rows * n;
    if (total == 0) return cudaSuccess;
    gather_kernel<<<moe_grid(total), MOE_THREADS, 0, stream>>>(xg, x, ld, row_tok, n, total);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_moe_combine(float *out, const float *yd, const int32_t *slot, const float *wts,
                                       int32_t n_tok, int32_t k, int32_t n, const float *ys, const float *sg,
                                       int64_t sg_ld, cudaStream_t stream)
{
    if (n_tok < 0 || k <= 0 || n < 0 || (ys && !sg)) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n_tok * n;
    if (total == 0) return cudaSuccess;
    combine_kernel<<<moe_grid(total), MOE_THREADS, 0, stream>>>(out, yd, slot, wts, k, n, ys, sg, sg_ld, total);
    return cudaGetLastError();
}
