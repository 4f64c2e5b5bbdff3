/* k_attn.cu — paged attention over block tables, and the store of each new
 * token's K/V into its slot (see kernels.h for the contracts).
 *
 * Attention: one thread block of ATTN_WARPS warps per (token, query head).
 * Warp w takes positions w, w + W, w + 2W, … (W = ATTN_WARPS) in ascending
 * order and keeps an online softmax (running max m, running sum l, running
 * weighted V sum) in f32; its 32 lanes split the head's dimensions, and a
 * q·k dot product is reduced with an xor butterfly, which leaves the same bits
 * in every lane. The warps' partial results are then merged in warp order.
 * Every step of that is fixed by (n_pos, head_dim) alone, so a token's output
 * does not depend on the batch it runs in. K and V rows of ATTN_UNROLL
 * positions are loaded before any of them is used, so that a warp has several
 * loads in flight instead of waiting on one row at a time.
 *
 * The CPU reference (attn_head) is the two-pass softmax; the two agree to
 * rounding (exp(s - m) is rescaled here instead of computed once). */
#include "kernels/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#define ATTN_WARPS 8
#define ATTN_UNROLL 4

struct attn_args {
    float *out;         /* f32 output, or NULL when out_bf16 is set */
    uint16_t *out_bf16; /* the same values rounded to bf16 (a GEMM's input) */
    const float *q;
    int64_t q_ld;
    struct kcu_paged kv;
    int32_t n_head, group, head_dim;
    float scale;
};

__device__ static float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* PER_LANE = head dims per lane (head_dim <= 32 * PER_LANE): a compile-time
 * count so the per-lane arrays stay in registers, sized to the head so that
 * a 64-wide head does not pay for 256 in registers and occupancy. */
template <int PER_LANE> __global__ static void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(struct attn_args a)
{
    __shared__ float qs[KCU_ATTN_MAX_HEAD_DIM];
    __shared__ float wm[ATTN_WARPS], wl[ATTN_WARPS];
    __shared__ float wacc[ATTN_WARPS][KCU_ATTN_MAX_HEAD_DIM];

    const int32_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, g = h / a.group;
    const int32_t hd = a.head_dim, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const struct kcu_paged *kv = &a.kv;
    const int32_t bs = kv->block_size; /* 32-bit: p / bs and p % bs run per position */
    const int64_t kvd = kv->kv_dim;
    const int64_t k_off = (int64_t)kv->layer * 2 * bs * kvd + (int64_t)g * hd;
    const int64_t v_off = ((int64_t)kv->layer * 2 + 1) * bs * kvd + (int64_t)g * hd;
    const int32_t *table = kv->blocks + kv->tok_table[t];
    const int32_t n_pos = kv->tok_pos[t] + 1;

    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = a.q[(int64_t)t * a.q_ld + (int64_t)h * hd + i];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) acc[j] = 0.0f;

    for (int32_t p0 = warp; p0 < n_pos; p0 += ATTN_WARPS * ATTN_UNROLL) {
        float kr[ATTN_UNROLL][PER_LANE], vr[ATTN_UNROLL][PER_LANE];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int32_t p = p0 + u * ATTN_WARPS;
            const uint16_t *base = kv->pool;
            if (p < n_pos) base += (int64_t)table[p / bs] * kv->block_elems + (int64_t)(p % bs) * kvd;
#pragma unroll
            for (int j = 0; j < PER_LANE; j++) {
                const int32_t i = lane + 32 * j;
                const bool in = p < n_pos && i < hd;
                kr[u][j] = in ? h2f(base[k_off + i]) : 0.0f;
                vr[u][j] = in ? h2f(base[v_off + i]) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int32_t p = p0 + u * ATTN_WARPS;
            if (p >= n_pos) break; /* warp-uniform: every lane leaves together */
            float d = 0.0f;
#pragma unroll
            for (int j = 0; j < PER_LANE; j++) {
                const int32_t i = lane + 32 * j;
                if (i < hd) d += qs[i] * kr[u][j];
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
            const float s = d * a.scale;
            const float m_new = fmaxf(m, s);
            const float corr = expf(m - m_new); /* 0 on the first position (m = -inf) */
            const float e = expf(s - m_new);
            l = l * corr + e;
#pragma unroll
            for (int j = 0; j < PER_LANE; j++) acc[j] = acc[j] * corr + e * vr[u][j];
            m = m_new;
        }
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

    /* Warp 0 always has position 0, so M is finite; a warp that had no
     * position (m = -inf, l = 0, acc = 0) adds exactly 0. */
    float M = wm[0];
    for (int w = 1; w < ATTN_WARPS; w++) M = fmaxf(M, wm[w]);
    float L = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++) L += wl[w] * expf(wm[w] - M);
    const float inv = 1.0f / L;
    const int64_t o = (int64_t)t * a.n_head * hd + (int64_t)h * hd;
    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) s += wacc[w][i] * expf(wm[w] - M);
        if (a.out) a.out[o + i] = s * inv;
        else a.out_bf16[o + i] = __bfloat16_as_ushort(__float2bfloat16_rn(s * inv));
    }
}

__global__ static void kv_store_kernel(struct kcu_paged kv, const float *k, const float *v, int64_t ld)
{
    const int32_t t = blockIdx.x, p = kv.tok_pos[t], bs = kv.block_size;
    const int64_t kvd = kv.kv_dim;
    const int32_t *table = kv.blocks + kv.tok_table[t];
    uint16_t *blk = kv.pool + (int64_t)table[p / bs] * kv.block_elems;
    uint16_t *kd = blk + ((int64_t)kv.layer * 2 * bs + p % bs) * kvd;
    uint16_t *vd = blk + (((int64_t)kv.layer * 2 + 1) * bs + p % bs) * kvd;
    for (int32_t i = threadIdx.x; i < kvd; i += blockDim.x) {
        kd[i] = __half_as_ushort(__float2half_rn(k[(int64_t)t * ld + i]));
        vd[i] = __half_as_ushort(__float2half_rn(v[(int64_t)t * ld + i]));
    }
}

extern "C" cudaError_t kcu_kv_store(const struct kcu_paged *kv, const float *k, const float *v, int64_t ld,
                                    cudaStream_t stream)
{
    if (kv->n_tok < 0 || kv->block_size <= 0 || kv->kv_dim <= 0) return cudaErrorInvalidValue;
    if (kv->n_tok == 0) return cudaSuccess;
    kv_store_kernel<<<kv->n_tok, 128, 0, stream>>>(*kv, k, v, ld);
    return cudaGetLastError();
}

static cudaError_t attn_launch(float *out, uint16_t *out_bf16, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                               int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale, cudaStream_t stream)
{
    if (kv->n_tok < 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 ||
        head_dim > KCU_ATTN_MAX_HEAD_DIM || kv->block_size <= 0 || kv->kv_dim != n_head_kv * head_dim)
        return cudaErrorInvalidValue;
    if (kv->n_tok == 0) return cudaSuccess;
    if ((int64_t)kv->n_tok * n_head > 0x7fffffff) return cudaErrorInvalidValue;
    struct attn_args a = {out, out_bf16, q, q_ld, *kv, n_head, n_head / n_head_kv, head_dim, scale};
    const unsigned grid = (unsigned)(kv->n_tok * n_head);
    if (head_dim <= 64) attn_kernel<2><<<grid, ATTN_WARPS * 32, 0, stream>>>(a);
    else if (head_dim <= 128) attn_kernel<4><<<grid, ATTN_WARPS * 32, 0, stream>>>(a);
    else attn_kernel<8><<<grid, ATTN_WARPS * 32, 0, stream>>>(a);
    return cudaGetLastError();
}

extern "C" cudaError_t kcu_attn(float *out, const float *q, int64_t q_ld, const struct kcu_paged *kv, int32_t n_head,
                                int32_t n_head_kv, int32_t head_dim, float scale, cudaStream_t stream)
{
    return attn_launch(out, NULL, q, q_ld, kv, n_head, n_head_kv, head_dim, scale, stream);
}

extern "C" cudaError_t kcu_attn_bf16(uint16_t *out, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                                     int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale,
                                     cudaStream_t stream)
{
    return attn_launch(NULL, out, q, q_ld, kv, n_head, n_head_kv, head_dim, scale, stream);
}
