/* k_enc.cu — the kernels of an encoder's pass (BERT; see kernels.h): the
 * summed embeddings and LayerNorm, the residual add with its bias and
 * LayerNorm, the bias and erf GELU between the FFN's projections, and
 * attention over each sequence's own rows of the step.
 *
 * LayerNorm: one thread block per row. The sum is written to the row first
 * (each thread its own elements, read back only by itself), then the mean
 * and the variance of the deviations are reduced in a fixed order — each
 * thread's strided elements in index order, then a fixed shared-memory
 * tree — so a row's result does not depend on the rest of the batch. The
 * CPU (enc_cpu.c's enc_layer_norm) sums in double: the two agree to float
 * rounding.
 *
 * Attention: kcu_attn's scheme (k_attn.cu) over f32 rows of the step
 * instead of the paged pool: one thread block of ENC_WARPS warps per
 * (token, head); warp w takes keys w, w + W, … of the token's sequence with
 * an online softmax, its lanes splitting the head's dimensions; the warps
 * are merged in warp order. A token reads only the rows [lo, lo + n) the
 * host gave it: sequences in one step never see each other. */
#include "kernels/kernels.h"

#include <cuda_bf16.h>
#include <math.h>

#define LN_THREADS 256
#define ENC_WARPS 8

__device__ static void put(float *p, float v) { *p = v; }
__device__ static void put(uint16_t *p, float v) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

/* Sum of every thread's v, in a fixed order; every thread gets it. */
__device__ static float block_sum(float v, float *part)
{
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = LN_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float r = part[0];
    __syncthreads(); /* part is reused by the next reduction */
    return r;
}

/* x = LayerNorm(x) * w + b over the n elements of this block's row, which
 * the calling thread has just written (its own strided elements); also
 * bf16 into xb when it is set. */
__device__ static void ln_row(float *x, uint16_t *xb, int32_t n, const float *w, const float *b, float eps)
{
    __shared__ float part[LN_THREADS];
    float s = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += LN_THREADS) s += x[i];
    const float mean = block_sum(s, part) / (float)n;
    float v = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += LN_THREADS) v += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / sqrtf(block_sum(v, part) / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += LN_THREADS) {
        const float y = (x[i] - mean) * inv * w[i] + b[i];
        x[i] = y;
        if (xb) put(&xb[i], y);
    }
}

__global__ static void enc_embed_kernel(float *x, uint16_t *xb, const uint16_t *tok_table, const float *pos_table,
                                        const float *type_table, const int32_t *tokens, const int32_t *pos,
                                        const int32_t *types, int32_t n, const float *w, const float *b, float eps)
{
    const int32_t t = blockIdx.x;
    const uint16_t *te = tok_table + (int64_t)tokens[t] * n;
    const float *pe = pos_table + (int64_t)pos[t] * n;
    const float *ye = type_table ? type_table + (int64_t)types[t] * n : NULL;
    float *row = x + (int64_t)t * n;
    for (int32_t i = threadIdx.x; i < n; i += LN_THREADS) {
        float v = __uint_as_float((uint32_t)te[i] << 16) + pe[i]; /* enc_cpu.c's order: token, position, type */
        if (ye) v += ye[i];
        row[i] = v;
    }
    ln_row(row, xb ? xb + (int64_t)t * n : NULL, n, w, b, eps);
}

__global__ static void add_layernorm_kernel(float *x, uint16_t *xb, const float *y, const float *bias, int32_t n,
                                            const float *w, const float *b, float eps)
{
    const int64_t r = blockIdx.x;
    float *row = x + r * n;
    for (int32_t i = threadIdx.x; i < n; i += LN_THREADS) {
        float v = row[i];
        if (y) v += y[r * n + i] + (bias ? bias[i] : 0.0f); /* enc_cpu.c: x += (a + bias) */
        row[i] = v;
    }
    ln_row(row, xb ? xb + r * n : NULL, n, w, b, eps);
}

__global__ static void gelu_erf_bias_kernel(uint16_t *out, const float *up, const float *bias, int32_t n, int64_t total)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        const float z = up[k] + (bias ? bias[k % n] : 0.0f);
        put(&out[k], 0.5f * z * (1.0f + erff(z * 0.70710678118654752440f))); /* enc_gelu's expression */
    }
}

struct enc_attn_args {
    float *out;         /* f32 output, or NULL when out_bf16 is set */
    uint16_t *out_bf16; /* the same values rounded to bf16 (a GEMM's input) */
    const float *qkv;
    int64_t ld, k_off, v_off;
    const int32_t *tok_lo, *tok_n;
    int32_t n_head, hd;
    float scale;
};

template <int PER_LANE> __global__ static void __launch_bounds__(ENC_WARPS * 32) enc_attn_kernel(struct enc_attn_args a)
{
    __shared__ float qs[KCU_ATTN_MAX_HEAD_DIM];
    __shared__ float wm[ENC_WARPS], wl[ENC_WARPS];
    __shared__ float wacc[ENC_WARPS][KCU_ATTN_MAX_HEAD_DIM];
    const int32_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, hd = a.hd;
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t lo = a.tok_lo[t], n = a.tok_n[t];
    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = a.qkv[(int64_t)t * a.ld + (int64_t)h * hd + i];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) acc[j] = 0.0f;
    for (int32_t p = warp; p < n; p += ENC_WARPS) {
        const float *kr = a.qkv + (int64_t)(lo + p) * a.ld + a.k_off + (int64_t)h * hd;
        const float *vr = a.qkv + (int64_t)(lo + p) * a.ld + a.v_off + (int64_t)h * hd;
        float d = 0.0f, vv[PER_LANE];
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            const int32_t i = lane + 32 * j;
            vv[j] = i < hd ? vr[i] : 0.0f;
            if (i < hd) d += qs[i] * kr[i];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        const float s = d * a.scale; /* enc_attn's order: the dot product, then the scale */
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new); /* 0 on a warp's first key (m = -inf) */
        const float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) acc[j] = acc[j] * corr + e * vv[j];
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        const int32_t i = lane + 32 * j;
        if (i < hd) wacc[warp][i] = acc[j];
    }
    __syncthreads();
    /* n >= 1: warp 0 has key 0, so M is finite; a warp with no key
     * (m = -inf, l = 0, acc = 0) adds exactly 0. */
    float M = wm[0];
    for (int w = 1; w < ENC_WARPS; w++) M = fmaxf(M, wm[w]);
    float L = 0.0f;
    for (int w = 0; w < ENC_WARPS; w++) L += wl[w] * expf(wm[w] - M);
    const float inv = 1.0f / L;
    const int64_t o = (int64_t)t * a.n_head * hd + (int64_t)h * hd;
    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ENC_WARPS; w++) s += wacc[w][i] * expf(wm[w] - M);
        if (a.out) put(&a.out[o + i], s * inv);
        else put(&a.out_bf16[o + i], s * inv);
    }
}

extern "C" cudaError_t kcu_enc_embed(float *x, uint16_t *xb, const uint16_t *tok_table, const float *pos_table,
                                     const float *type_table, const int32_t *tokens, const int32_t *pos,
                                     const int32_t *types, int32_t n_tok, int32_t n, const float *w, const float *b,
                                     float eps, cudaStream_t stream)
{
    if (n_tok < 0 || n <= 0) return n_tok == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (n_tok == 0) return cudaSuccess;
    enc_embed_kernel<<<n_tok, LN_THREADS, 0, stream>>>(x, xb, tok_table, pos_table, type_table, tokens, pos, types, n,
                                                       w, b, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_add_layernorm(float *x, uint16_t *xb, const float *y, const float *bias, int32_t n_rows,
                                         int32_t n, const float *w, const float *b, float eps, cudaStream_t stream)
{
    if (n_rows < 0 || n <= 0) return n_rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    add_layernorm_kernel<<<n_rows, LN_THREADS, 0, stream>>>(x, xb, y, bias, n, w, b, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_gelu_erf_bf16(uint16_t *out, const float *up, const float *bias, int32_t n_tok, int32_t n,
                                         cudaStream_t stream)
{
    if (n_tok < 0 || n < 0) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n_tok * n;
    if (total == 0) return cudaSuccess;
    const int64_t blocks = (total + 255) / 256;
    const unsigned grid = (unsigned)(blocks < 65536 ? blocks : 65536);
    gelu_erf_bias_kernel<<<grid, 256, 0, stream>>>(out, up, bias, n, total);
    return cudaGetLastError();
}

static cudaError_t enc_attn_launch(const struct enc_attn_args &a, int32_t n_tok, cudaStream_t stream)
{
    if (n_tok < 0 || a.n_head <= 0 || a.hd <= 0 || a.hd > KCU_ATTN_MAX_HEAD_DIM) return cudaErrorInvalidValue;
    if (n_tok == 0) return cudaSuccess;
    if ((int64_t)n_tok * a.n_head > 0x7fffffff) return cudaErrorInvalidValue;
    const unsigned grid = (unsigned)(n_tok * a.n_head), block = ENC_WARPS * 32;
    if (a.hd <= 32) enc_attn_kernel<1><<<grid, block, 0, stream>>>(a);
    else if (a.hd <= 64) enc_attn_kernel<2><<<grid, block, 0, stream>>>(a);
    else if (a.hd <= 128) enc_attn_kernel<4><<<grid, block, 0, stream>>>(a);
    else enc_attn_kernel<8><<<grid, block, 0, stream>>>(a);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_enc_attn(float *out, const float *qkv, int64_t ld, int64_t k_off, int64_t v_off,
                                    const int32_t *tok_lo, const int32_t *tok_n, int32_t n_tok, int32_t n_head,
                                    int32_t head_dim, float scale, cudaStream_t stream)
{
    const struct enc_attn_args a = {out, NULL, qkv, ld, k_off, v_off, tok_lo, tok_n, n_head, head_dim, scale};
    return enc_attn_launch(a, n_tok, stream);
}

extern "C" cudaError_t kcu_enc_attn_bf16(uint16_t *out, const float *qkv, int64_t ld, int64_t k_off, int64_t v_off,
                                         const int32_t *tok_lo, const int32_t *tok_n, int32_t n_tok, int32_t n_head,
                                         int32_t head_dim, float scale, cudaStream_t stream)
{
    const struct enc_attn_args a = {NULL, out, qkv, ld, k_off, v_off, tok_lo, tok_n, n_head, head_dim, scale};
    return enc_attn_launch(a, n_tok, stream);
}
