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
 * rounding (exp(s - m) is rescaled here instead of computed once).
 *
 * KV types: the kernel is instantiated per pool type (KT), whose K and V
 * row formats (KK, KV: the q4 pool's K rows are q8) fix the loads and the
 * slot strides. A lane's dimensions
 * lane + 32 j are element `lane` of the head's group j, so for q8 and q4 a
 * lane reads one int8 (or one nibble) of each group plus the group's fp16
 * scale (and minimum), the same two bytes for the whole warp, and
 * dequantizes it in registers exactly as kv_dequantize_row does.
 *
 * The store quantizes with kvtype.h's formulas. Every operation there is
 * written as the IEEE operation it is (__fdiv_rn, __fmul_rn, __fsub_rn,
 * rintf, __float2half_rn) so that no compiler flag — --use_fast_math,
 * -prec-div=false, --fmad — can turn a division into a reciprocal or fuse
 * a product: the bytes must be kv_quantize_row's. */
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

/* Bytes of n elements of a row of type KT (n whole groups for q8 and q4). */
template <int KT> __device__ __forceinline__ static int64_t kv_bytes(int64_t n)
{
    if (KT == KCU_KV_Q8) return n / KCU_KV_GROUP * KCU_KV_Q8_BYTES;
    if (KT == KCU_KV_Q4) return n / KCU_KV_GROUP * KCU_KV_Q4_BYTES;
    return n * 2;
}

/* The row formats of pool type KT (kvtype.h's kv_k_rows / kv_v_rows). */
#define KT_K(KT) ((KT) == KCU_KV_Q4 ? KCU_KV_Q8 : (KT))
#define KT_V(KT) (KT)

/* Element i of the head row at `row` of format KT, as kv_dequantize_row
 * gives it. */
template <int KT> __device__ __forceinline__ static float kv_elem(const uint8_t *row, int32_t i)
{
    if (KT == KCU_KV_F16) return h2f(reinterpret_cast<const uint16_t *>(row)[i]);
    const int32_t j = i % KCU_KV_GROUP;
    const uint8_t *g = row + (int64_t)(i / KCU_KV_GROUP) * (KT == KCU_KV_Q8 ? KCU_KV_Q8_BYTES : KCU_KV_Q4_BYTES);
    const float d = h2f(reinterpret_cast<const uint16_t *>(g)[0]);
    if (KT == KCU_KV_Q8) return d * (float)reinterpret_cast<const int8_t *>(g + 2)[j];
    const float m = h2f(reinterpret_cast<const uint16_t *>(g)[1]);
    const uint8_t b = g[4 + j % (KCU_KV_GROUP / 2)];
    return fmaf(d, (float)(j < KCU_KV_GROUP / 2 ? b & 15 : b >> 4), m);
}

/* PER_LANE = head dims per lane (head_dim <= 32 * PER_LANE): a compile-time
 * count so the per-lane arrays stay in registers, sized to the head so that
 * a 64-wide head does not pay for 256 in registers and occupancy. KT: the
 * pool's KV type. */
template <int PER_LANE, int KT>
__global__ static void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(struct attn_args a)
{
    __shared__ float qs[KCU_ATTN_MAX_HEAD_DIM];
    __shared__ float wm[ATTN_WARPS], wl[ATTN_WARPS];
    __shared__ float wacc[ATTN_WARPS][KCU_ATTN_MAX_HEAD_DIM];

    const int32_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, g = h / a.group;
    const int32_t hd = a.head_dim, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const struct kcu_paged *kv = &a.kv;
    const int32_t bs = kv->block_size; /* 32-bit: p / bs and p % bs run per position */
    constexpr int KK = KT_K(KT), KV = KT_V(KT);
    const int64_t rk = kv_bytes<KK>(kv->kv_dim), rv = kv_bytes<KV>(kv->kv_dim); /* bytes per K, V row */
    const int64_t lay = (int64_t)kv->layer * bs * (rk + rv); /* the layer's K rows, then its V rows */
    const int64_t k_off = lay + kv_bytes<KK>((int64_t)g * hd), v_off = lay + bs * rk + kv_bytes<KV>((int64_t)g * hd);
    const int32_t *table = kv->blocks + kv->tok_table[t];
    const int32_t n_pos = kv->tok_pos[t] + 1;
    /* A sliding window's first position: earlier blocks are never read. */
    const int32_t p_lo = kv->window > 0 && n_pos > kv->window ? n_pos - kv->window : 0;
    const float cap = kv->softcap;

    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = a.q[(int64_t)t * a.q_ld + (int64_t)h * hd + i];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) acc[j] = 0.0f;

    for (int32_t p0 = p_lo + warp; p0 < n_pos; p0 += ATTN_WARPS * ATTN_UNROLL) {
        float kr[ATTN_UNROLL][PER_LANE], vr[ATTN_UNROLL][PER_LANE];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int32_t p = p0 + u * ATTN_WARPS;
            const uint8_t *kb = kv->pool, *vb = kv->pool;
            if (p < n_pos) {
                const uint8_t *blk = kv->pool + (int64_t)table[p / bs] * kv->block_bytes;
                kb = blk + k_off + (int64_t)(p % bs) * rk;
                vb = blk + v_off + (int64_t)(p % bs) * rv;
            }
#pragma unroll
            for (int j = 0; j < PER_LANE; j++) {
                const int32_t i = lane + 32 * j;
                const bool in = p < n_pos && i < hd;
                kr[u][j] = in ? kv_elem<KK>(kb, i) : 0.0f;
                vr[u][j] = in ? kv_elem<KV>(vb, i) : 0.0f;
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
            float s = d * a.scale;
            if (cap > 0) s = cap * tanhf(s / cap); /* attn_softcap's expression, with the device's tanh */
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

    /* Warp 0 always has position p_lo, so M is finite; a warp that had no
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
    uint16_t *blk = reinterpret_cast<uint16_t *>(kv.pool + (int64_t)table[p / bs] * kv.block_bytes);
    uint16_t *kd = blk + ((int64_t)kv.layer * 2 * bs + p % bs) * kvd;
    uint16_t *vd = blk + (((int64_t)kv.layer * 2 + 1) * bs + p % bs) * kvd;
    for (int32_t i = threadIdx.x; i < kvd; i += blockDim.x) {
        kd[i] = __half_as_ushort(__float2half_rn(k[(int64_t)t * ld + i]));
        vd[i] = __half_as_ushort(__float2half_rn(v[(int64_t)t * ld + i]));
    }
}

/* kvtype.c's scale_fp16 and min_fp16: a scale or minimum past the fp16
 * range becomes the largest finite half, never infinity (a NaN scale, from
 * inf - inf, becomes 65504 there too: the comparison is false). */
__device__ __forceinline__ static uint16_t scale_fp16(float d)
{
    return __half_as_ushort(__float2half_rn(d < 65504.0f ? d : 65504.0f));
}
__device__ __forceinline__ static uint16_t min_fp16(float m)
{
    return __half_as_ushort(__float2half_rn(m < -65504.0f ? -65504.0f : m > 65504.0f ? 65504.0f : m));
}

/* kvq8_quantize_group by one warp, lane i holding x[i]. The group's
 * max |x| by a butterfly of fmaxf, which is exact and ignores NaN as the
 * reference's loop from 0 does; every lane ends with the same value. */
__device__ static void q8_group(uint8_t *g, float x, int32_t lane)
{
    float amax = fabsf(x);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    amax = fmaxf(0.0f, amax);
    const uint16_t dh = scale_fp16(__fdiv_rn(amax, 127.0f));
    const float d = h2f(dh);
    const float inv = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float q = rintf(__fmul_rn(x, inv));
    if (lane == 0) reinterpret_cast<uint16_t *>(g)[0] = dh;
    reinterpret_cast<int8_t *>(g + 2)[lane] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}

/* kvq4_quantize_group by one warp: min and max by butterflies (fminf and
 * fmaxf skip NaN, as the reference's loops do), then lane j < 16 packs its
 * nibble with lane j + 16's. */
__device__ static void q4_group(uint8_t *g, float x, int32_t lane)
{
    float lo = x, hi = x;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, off));
    }
    const uint16_t dh = scale_fp16(__fdiv_rn(__fsub_rn(hi, lo), 15.0f)),
                   mh = min_fp16(__fadd_rn(lo, 0.0f)); /* +0 for a -0 minimum, as kvtype.c */
    const float d = h2f(dh), m = h2f(mh);
    const float inv = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    float q = rintf(__fmul_rn(__fsub_rn(x, m), inv));
    q = q > 15.0f ? 15.0f : q < 0.0f ? 0.0f : q;
    const float hi_q = __shfl_xor_sync(0xffffffffu, q, 16); /* lane j + 16's, for lane j */
    if (lane == 0) {
        reinterpret_cast<uint16_t *>(g)[0] = dh;
        reinterpret_cast<uint16_t *>(g)[1] = mh;
    }
    if (lane < KCU_KV_GROUP / 2) g[4 + lane] = (uint8_t)((uint8_t)q | (uint8_t)hi_q << 4);
}

/* One thread block per token of pool type KT (q8 or q4); its warps take
 * the row's groups in turn, K's (in KT's K row format) then V's. */
template <int KT>
__global__ static void kv_store_q_kernel(struct kcu_paged kv, const float *k, const float *v, int64_t ld)
{
    constexpr int KK = KT_K(KT), KV = KT_V(KT);
    constexpr int32_t gk = KK == KCU_KV_Q8 ? KCU_KV_Q8_BYTES : KCU_KV_Q4_BYTES;
    constexpr int32_t gv = KV == KCU_KV_Q8 ? KCU_KV_Q8_BYTES : KCU_KV_Q4_BYTES;
    const int32_t t = blockIdx.x, p = kv.tok_pos[t], bs = kv.block_size;
    const int32_t n_g = kv.kv_dim / KCU_KV_GROUP;
    const int64_t rk = (int64_t)n_g * gk, rv = (int64_t)n_g * gv;
    const int32_t *table = kv.blocks + kv.tok_table[t];
    uint8_t *lay = kv.pool + (int64_t)table[p / bs] * kv.block_bytes + (int64_t)kv.layer * bs * (rk + rv);
    uint8_t *kd = lay + (int64_t)(p % bs) * rk;
    uint8_t *vd = lay + bs * rk + (int64_t)(p % bs) * rv;
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    for (int32_t w = warp; w < 2 * n_g; w += n_warps) { /* warp-uniform */
        const bool is_v = w >= n_g;
        const int32_t gi = is_v ? w - n_g : w;
        const float x = (is_v ? v : k)[(int64_t)t * ld + (int64_t)gi * KCU_KV_GROUP + lane];
        uint8_t *g = is_v ? vd + (int64_t)gi * gv : kd + (int64_t)gi * gk;
        if ((is_v ? KV : KK) == KCU_KV_Q8) q8_group(g, x, lane);
        else q4_group(g, x, lane);
    }
}

static bool kv_type_ok(int32_t kv_type, int64_t n)
{
    if (kv_type == KCU_KV_F16) return true;
    return (kv_type == KCU_KV_Q8 || kv_type == KCU_KV_Q4) && n % KCU_KV_GROUP == 0;
}

extern "C" cudaError_t kcu_kv_store(const struct kcu_paged *kv, const float *k, const float *v, int64_t ld,
                                    cudaStream_t stream)
{
    if (kv->n_tok < 0 || kv->block_size <= 0 || kv->kv_dim <= 0 || !kv_type_ok(kv->kv_type, kv->kv_dim))
        return cudaErrorInvalidValue;
    if (kv->n_tok == 0) return cudaSuccess;
    if (kv->kv_type == KCU_KV_Q8) kv_store_q_kernel<KCU_KV_Q8><<<kv->n_tok, 128, 0, stream>>>(*kv, k, v, ld);
    else if (kv->kv_type == KCU_KV_Q4) kv_store_q_kernel<KCU_KV_Q4><<<kv->n_tok, 128, 0, stream>>>(*kv, k, v, ld);
    else kv_store_kernel<<<kv->n_tok, 128, 0, stream>>>(*kv, k, v, ld);
    return cudaGetLastError();
}

template <int KT> static cudaError_t attn_launch_t(const struct attn_args &a, unsigned grid, cudaStream_t stream)
{
    if (a.head_dim <= 64) attn_kernel<2, KT><<<grid, ATTN_WARPS * 32, 0, stream>>>(a);
    else if (a.head_dim <= 128) attn_kernel<4, KT><<<grid, ATTN_WARPS * 32, 0, stream>>>(a);
    else attn_kernel<8, KT><<<grid, ATTN_WARPS * 32, 0, stream>>>(a);
    return cudaGetLastError();
}

static cudaError_t attn_launch(float *out, uint16_t *out_bf16, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                               int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale, cudaStream_t stream)
{
    if (kv->n_tok < 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 ||
        head_dim > KCU_ATTN_MAX_HEAD_DIM || kv->block_size <= 0 || kv->kv_dim != n_head_kv * head_dim ||
        !kv_type_ok(kv->kv_type, head_dim))
        return cudaErrorInvalidValue;
    if (kv->n_tok == 0) return cudaSuccess;
    if ((int64_t)kv->n_tok * n_head > 0x7fffffff) return cudaErrorInvalidValue;
    struct attn_args a = {out, out_bf16, q, q_ld, *kv, n_head, n_head / n_head_kv, head_dim, scale};
    const unsigned grid = (unsigned)(kv->n_tok * n_head);
    if (kv->kv_type == KCU_KV_Q8) return attn_launch_t<KCU_KV_Q8>(a, grid, stream);
    if (kv->kv_type == KCU_KV_Q4) return attn_launch_t<KCU_KV_Q4>(a, grid, stream);
    return attn_launch_t<KCU_KV_F16>(a, grid, stream);
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
