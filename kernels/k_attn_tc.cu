/* k_attn_tc.cu — paged attention on tensor cores (WMMA, fp16 in, f32
 * accumulate), for head sizes 64 and 128 (see kernels.h for the contract).
 *
 * k_attn.cu gives each (token, query head) a thread block of its own that
 * reads the sequence's K/V rows: a prefill chunk of T tokens reads them
 * T x group times, and every q·k product is a warp-wide shuffle reduction.
 * Here one thread block takes a tile of consecutive tokens of one sequence
 * (the caller's `tiles`) and one KV head, i.e. up to 64 rows of
 * (token, query head of the group), and walks the positions in chunks of
 * ATC_CHUNK: the chunk's K and V rows are loaded into shared memory once
 * for all rows, S = Q·Kᵀ and P·V are 16x16x16 matrix products, and an
 * online softmax (f32, one lane per row) runs between them. A decode token
 * is a tile of one token: its group's query heads still share each K/V
 * load.
 *
 * Batch independence: a row's result depends on its own query and on the
 * positions up to its own, visited in chunks that always start at 0 and
 * advance by ATC_CHUNK; chunks past its position (when a tile mate is
 * further along) are fully masked and leave its running max, sum and
 * output bit for bit unchanged (scaled by exp(0) = 1, plus 0). Which tile a
 * token lands in, and beside whom, does not change its bits.
 *
 * Precision: Q (pre-multiplied by the softmax scale) and the probabilities
 * P are rounded to fp16 for the products, as K and V already are; scores,
 * the softmax and the output are f32.
 *
 * Quantized K/V (q8, q4): each chunk is dequantized as it is loaded, by
 * kvtype.h's formulas (q8 d * q, q4 fmaf(d, q, m), both in f32), then
 * rounded to fp16 into the same shared tiles, so the products and
 * everything after are the f16 kernel's. That rounding is the one
 * difference from kcu_attn, which uses the dequantized values exactly: a
 * q8 value has up to 18 significant bits, a q4 value up to 24, fp16 keeps
 * 11 (relative error <= 2^-11 per element, the size of the rounding of Q
 * and P). Values past the fp16 range (only from scales clamped at 65504)
 * saturate at +-65504. The alternatives cost more than they give here:
 * exact integer products would need a per-group rescale of every 16x16
 * score tile, and an f32 tile halves the positions per chunk; the
 * rounding is deterministic, so batch independence is unchanged. */
#include "kernels/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>

using namespace nvcuda;

#define ATC_WARPS 4
#define ATC_ROWS (ATC_WARPS * 16) /* rows of one tile: tokens x query heads of the group */
#define ATC_CHUNK 32              /* positions per step of the walk */

struct atc_args {
    float *out;
    uint16_t *out_bf16;
    const float *q;
    int64_t q_ld;
    struct kcu_paged kv;
    const int32_t *tiles; /* (n_tiles, 2): first token, token count */
    int32_t n_head_kv, group;
    float scale;
};

/* Shared memory of one block. Q is staged through `kv` before the walk
 * starts (each warp keeps its rows' Q in fragments), so it needs no room
 * of its own. Rows are padded by 8 halves: 16-byte aligned for WMMA, and
 * consecutive rows start in different banks. */
template <int HD> struct atc_smem {
    union {
        uint16_t q[ATC_ROWS][HD + 8];
        struct {
            uint16_t k[ATC_CHUNK][HD + 8];
            uint16_t v[ATC_CHUNK][HD + 8];
        } kv;
    } u;
    float s[ATC_WARPS][16][ATC_CHUNK];    /* scores of the chunk */
    uint16_t p[ATC_WARPS][16][ATC_CHUNK]; /* probabilities, fp16 */
    float pv[ATC_WARPS][16][16];          /* one 16-column slice of P·V */
    float corr[ATC_WARPS][16];            /* this chunk's rescaling of each row */
    float l[ATC_WARPS][16];               /* each row's softmax sum */
};

/* The steps of atc_kernel that read best on their own, inlined into it. The
 * two WMMA products stay in the kernel: as helpers they changed the code
 * nvcc generates (register numbering, and so the SASS), which these do not. */

/* Q rows, scaled, as fp16: row r = token t0 + r / G, query head g*G + r % G. */
template <int HD>
__device__ __forceinline__ static void atc_stage_q(atc_smem<HD> &sm, const struct atc_args &a, int32_t t0, int32_t g,
                                                   int32_t n_rows)
{
    const int32_t G = a.group;
    for (int32_t i = threadIdx.x; i < ATC_ROWS * HD; i += blockDim.x) {
        const int32_t r = i / HD, d = i % HD;
        float x = 0.0f;
        if (r < n_rows) x = a.q[(int64_t)(t0 + r / G) * a.q_ld + (int64_t)(g * G + r % G) * HD + d] * a.scale;
        sm.u.q[r][d] = __half_as_ushort(__float2half_rn(x));
    }
}

/* The row formats of pool type KT (kvtype.h's kv_k_rows / kv_v_rows: the
 * q4 pool's K rows are q8). */
#define ATC_K(KT) ((KT) == KCU_KV_Q4 ? KCU_KV_Q8 : (KT))
#define ATC_V(KT) (KT)

/* Bytes of n elements of a row of format KT (n whole groups for q8 and q4). */
template <int KT> __device__ __forceinline__ static int64_t atc_bytes(int64_t n)
{
    if (KT == KCU_KV_Q8) return n / KCU_KV_GROUP * KCU_KV_Q8_BYTES;
    if (KT == KCU_KV_Q4) return n / KCU_KV_GROUP * KCU_KV_Q4_BYTES;
    return n * 2;
}

/* Elements [d, d + 8) of the quantized head row at `row` (d a multiple of
 * 8, so inside one group), dequantized as kv_dequantize_row does and
 * rounded to fp16, saturating; packed as one 16-byte store. */
template <int KT> __device__ __forceinline__ static uint4 atc_dequant8(const uint8_t *row, int32_t d)
{
    const int32_t j0 = d % KCU_KV_GROUP;
    const uint8_t *g = row + (int64_t)(d / KCU_KV_GROUP) * (KT == KCU_KV_Q8 ? KCU_KV_Q8_BYTES : KCU_KV_Q4_BYTES);
    const uint16_t *gh = reinterpret_cast<const uint16_t *>(g);
    const float dd = __half2float(__ushort_as_half(gh[0]));
    uint16_t h[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int32_t j = j0 + e;
        float x;
        if (KT == KCU_KV_Q8) {
            x = dd * (float)reinterpret_cast<const int8_t *>(g + 2)[j];
        } else {
            const uint8_t b = g[4 + j % (KCU_KV_GROUP / 2)];
            x = fmaf(dd, (float)(j < KCU_KV_GROUP / 2 ? b & 15 : b >> 4), __half2float(__ushort_as_half(gh[1])));
        }
        x = fminf(fmaxf(x, -65504.0f), 65504.0f);
        h[e] = __half_as_ushort(__float2half_rn(x));
    }
    return make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16, h[4] | (uint32_t)h[5] << 16,
                      h[6] | (uint32_t)h[7] << 16);
}

/* The chunk of positions [c0, c0 + ATC_CHUNK) of the K and V rows at
 * k_off, v_off (bytes: the head in the layer's first K and V rows) of each
 * position's block, into shared memory as fp16.
 * f16: 8 halves (16 bytes) per load, head offsets and rows being multiples
 * of 8 halves; q8, q4: 8 elements of one group per item, dequantized. */
template <int HD, int KT>
__device__ __forceinline__ static void atc_load_chunk(atc_smem<HD> &sm, const struct kcu_paged *kv,
                                                      const int32_t *table, int32_t c0, int32_t n_pos, int64_t k_off,
                                                      int64_t v_off)
{
    constexpr int KK = ATC_K(KT), KV = ATC_V(KT);
    const int32_t bs = kv->block_size;
    const int64_t rk = atc_bytes<KK>(kv->kv_dim), rv = atc_bytes<KV>(kv->kv_dim);
    for (int32_t i = threadIdx.x; i < ATC_CHUNK * HD / 8; i += blockDim.x) {
        const int32_t c = i / (HD / 8), d = i % (HD / 8) * 8, p = c0 + c;
        uint4 kx = make_uint4(0, 0, 0, 0), vx = kx; /* past the end: zeros, masked anyway */
        if (p < n_pos) {
            const uint8_t *blk = kv->pool + (int64_t)table[p / bs] * kv->block_bytes;
            const uint8_t *kr = blk + k_off + (int64_t)(p % bs) * rk, *vr = blk + v_off + (int64_t)(p % bs) * rv;
            if (KT == KCU_KV_F16) {
                kx = *reinterpret_cast<const uint4 *>(kr + 2 * d);
                vx = *reinterpret_cast<const uint4 *>(vr + 2 * d);
            } else {
                kx = atc_dequant8<KK>(kr, d);
                vx = atc_dequant8<KV>(vr, d);
            }
        }
        *reinterpret_cast<uint4 *>(&sm.u.kv.k[c][d]) = kx;
        *reinterpret_cast<uint4 *>(&sm.u.kv.v[c][d]) = vx;
    }
}

/* Online softmax of the chunk's scores: lanes r and r + 16 (half 0 and 1)
 * take row r's positions [0, 16) and [16, 32), positions past my_pos
 * masked; updates the row's running max m and sum l, writes P (fp16) and
 * the row's rescaling of O. The halves' partial max and sum are combined
 * with one exchange; a + b == b + a, so both lanes agree. */
template <int HD>
__device__ __forceinline__ static void atc_softmax(atc_smem<HD> &sm, int32_t warp, int32_t lane, int32_t half,
                                                   int32_t c0, int32_t my_pos, float &m, float &l)
{
    const int r = lane % 16, cb = half * (ATC_CHUNK / 2);
    float cmax = -INFINITY;
    for (int c = cb; c < cb + ATC_CHUNK / 2; c++)
        if (c0 + c <= my_pos) cmax = fmaxf(cmax, sm.s[warp][r][c]);
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 16));
    const float m_new = fmaxf(m, cmax);
    /* A row with nothing to see yet (only padding rows: every
     * real row sees position 0 in the first chunk) stays at 0. */
    const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = cb; c < cb + ATC_CHUNK / 2; c++) {
        const float e = c0 + c <= my_pos ? expf(sm.s[warp][r][c] - m_new) : 0.0f;
        sum += e;
        sm.p[warp][r][c] = __half_as_ushort(__float2half_rn(e));
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    l = l * corr + sum;
    m = m_new;
    if (half == 0) sm.corr[warp][r] = corr;
}

/* The warp's rows of the output, O / l, as f32 or bf16. */
template <int HD>
__device__ __forceinline__ static void atc_store(const struct atc_args &a, const atc_smem<HD> &sm,
                                                 const float (&o)[HD / 16][8], int32_t warp, int32_t lane, int32_t t0,
                                                 int32_t g, int32_t n_rows)
{
    const int32_t G = a.group;
#pragma unroll
    for (int n = 0; n < HD / 16; n++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int idx = lane * 8 + e, r = warp * 16 + idx / 16, col = n * 16 + idx % 16;
            if (r >= n_rows) continue;
            const float x = o[n][e] / sm.l[warp][idx / 16];
            const int64_t at =
                (int64_t)(t0 + r / G) * ((int64_t)a.n_head_kv * G * HD) + (int64_t)(g * G + r % G) * HD + col;
            if (a.out) a.out[at] = x;
            else a.out_bf16[at] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
        }
}

template <int HD, int KT> __global__ static void __launch_bounds__(ATC_WARPS * 32) atc_kernel(struct atc_args a)
{
    __shared__ __align__(128) atc_smem<HD> sm;
    const int32_t tile = blockIdx.x / a.n_head_kv, g = blockIdx.x % a.n_head_kv;
    const int32_t t0 = a.tiles[2 * tile], n_t = a.tiles[2 * tile + 1], G = a.group;
    const int32_t n_rows = n_t * G;
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const struct kcu_paged *kv = &a.kv;
    const int32_t bs = kv->block_size;
    const int64_t rk = atc_bytes<ATC_K(KT)>(kv->kv_dim), rv = atc_bytes<ATC_V(KT)>(kv->kv_dim);
    const int64_t lay = (int64_t)kv->layer * bs * (rk + rv); /* the layer's K rows, then its V rows */
    const int64_t k_off = lay + atc_bytes<ATC_K(KT)>((int64_t)g * HD);
    const int64_t v_off = lay + bs * rk + atc_bytes<ATC_V(KT)>((int64_t)g * HD);
    const int32_t *table = kv->blocks + kv->tok_table[t0];
    const int32_t pos0 = kv->tok_pos[t0];
    const int32_t n_pos = pos0 + n_t; /* positions the tile's last token sees */

    atc_stage_q<HD>(sm, a, t0, g, n_rows);
    __syncthreads();
    const bool active = warp * 16 < n_rows; /* warp-uniform */
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> qf[HD / 16];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wmma::load_matrix_sync(qf[kk], reinterpret_cast<const __half *>(&sm.u.q[warp * 16][kk * 16]), HD + 8);
    /* This lane's share of the output: element e of slice n is row
     * (lane*8 + e) / 16, column n*16 + (lane*8 + e) % 16 of the warp's rows. */
    float o[HD / 16][8];
#pragma unroll
    for (int n = 0; n < HD / 16; n++)
#pragma unroll
        for (int e = 0; e < 8; e++) o[n][e] = 0.0f;
    /* The softmax takes two lanes per row: lanes r and r + 16 take row r's
     * positions [0, 16) and [16, 32) of each chunk, and keep the same m, l. */
    float m = -INFINITY, l = 0.0f;
    const int32_t my_row = warp * 16 + lane % 16, half = lane / 16;
    const int32_t my_pos = my_row < n_rows ? pos0 + my_row / G : -1;
    __syncthreads(); /* Q is in fragments: its staging becomes the K/V chunk */

    for (int32_t c0 = 0; c0 < n_pos; c0 += ATC_CHUNK) {
        atc_load_chunk<HD, KT>(sm, kv, table, c0, n_pos, k_off, v_off);
        __syncthreads();
        if (active) {
            /* S = Q·Kᵀ for the warp's 16 rows and the chunk's positions. */
#pragma unroll
            for (int n = 0; n < ATC_CHUNK / 16; n++) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
                wmma::fill_fragment(sf, 0.0f);
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> kf;
                    wmma::load_matrix_sync(kf, reinterpret_cast<const __half *>(&sm.u.kv.k[n * 16][kk * 16]), HD + 8);
                    wmma::mma_sync(sf, qf[kk], kf, sf);
                }
                wmma::store_matrix_sync(&sm.s[warp][0][n * 16], sf, ATC_CHUNK, wmma::mem_row_major);
            }
            __syncwarp();
            atc_softmax<HD>(sm, warp, lane, half, c0, my_pos, m, l);
            __syncwarp();
            /* O = O * corr + P·V, one 16-column slice at a time. */
#pragma unroll
            for (int n = 0; n < HD / 16; n++) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
                wmma::fill_fragment(of, 0.0f);
#pragma unroll
                for (int kk = 0; kk < ATC_CHUNK / 16; kk++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pf;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vf;
                    wmma::load_matrix_sync(pf, reinterpret_cast<const __half *>(&sm.p[warp][0][kk * 16]), ATC_CHUNK);
                    wmma::load_matrix_sync(vf, reinterpret_cast<const __half *>(&sm.u.kv.v[kk * 16][n * 16]), HD + 8);
                    wmma::mma_sync(of, pf, vf, of);
                }
                wmma::store_matrix_sync(&sm.pv[warp][0][0], of, 16, wmma::mem_row_major);
                __syncwarp();
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int idx = lane * 8 + e, r = idx / 16, col = idx % 16;
                    o[n][e] = o[n][e] * sm.corr[warp][r] + sm.pv[warp][r][col];
                }
                __syncwarp();
            }
        }
        __syncthreads(); /* the next chunk overwrites K and V */
    }

    if (!active) return;
    if (half == 0) sm.l[warp][lane] = l;
    __syncwarp();
    atc_store<HD>(a, sm, o, warp, lane, t0, g, n_rows);
}

extern "C" int32_t kcu_attn_tc_tile_tokens(int32_t n_head, int32_t n_head_kv, int32_t head_dim)
{
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || (head_dim != 64 && head_dim != 128)) return 0;
    const int32_t group = n_head / n_head_kv;
    return group <= ATC_ROWS ? ATC_ROWS / group : 0;
}

template <int KT>
static cudaError_t atc_launch_t(const struct atc_args &a, int32_t head_dim, unsigned grid, cudaStream_t stream)
{
    if (head_dim == 64) atc_kernel<64, KT><<<grid, ATC_WARPS * 32, 0, stream>>>(a);
    else atc_kernel<128, KT><<<grid, ATC_WARPS * 32, 0, stream>>>(a);
    return cudaGetLastError();
}

static cudaError_t atc_launch(float *out, uint16_t *out_bf16, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                              const int32_t *tiles, int32_t n_tiles, int32_t n_head, int32_t n_head_kv,
                              int32_t head_dim, float scale, cudaStream_t stream)
{
    if (kcu_attn_tc_tile_tokens(n_head, n_head_kv, head_dim) == 0 || n_tiles < 0 || kv->block_size <= 0 ||
        kv->window > 0 || kv->softcap > 0 || kv->kv_dim != n_head_kv * head_dim ||
        (kv->kv_type != KCU_KV_F16 && kv->kv_type != KCU_KV_Q8 && kv->kv_type != KCU_KV_Q4))
        return cudaErrorInvalidValue; /* head_dim 64 and 128 are whole groups */
    if (n_tiles == 0) return cudaSuccess;
    if ((int64_t)n_tiles * n_head_kv > 0x7fffffff) return cudaErrorInvalidValue;
    struct atc_args a = {out, out_bf16, q, q_ld, *kv, tiles, n_head_kv, n_head / n_head_kv, scale};
    const unsigned grid = (unsigned)(n_tiles * n_head_kv);
    if (kv->kv_type == KCU_KV_Q8) return atc_launch_t<KCU_KV_Q8>(a, head_dim, grid, stream);
    if (kv->kv_type == KCU_KV_Q4) return atc_launch_t<KCU_KV_Q4>(a, head_dim, grid, stream);
    return atc_launch_t<KCU_KV_F16>(a, head_dim, grid, stream);
}

extern "C" cudaError_t kcu_attn_tc(float *out, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                                   const int32_t *tiles, int32_t n_tiles, int32_t n_head, int32_t n_head_kv,
                                   int32_t head_dim, float scale, cudaStream_t stream)
{
    return atc_launch(out, NULL, q, q_ld, kv, tiles, n_tiles, n_head, n_head_kv, head_dim, scale, stream);
}

extern "C" cudaError_t kcu_attn_tc_bf16(uint16_t *out, const float *q, int64_t q_ld, const struct kcu_paged *kv,
                                        const int32_t *tiles, int32_t n_tiles, int32_t n_head, int32_t n_head_kv,
                                        int32_t head_dim, float scale, cudaStream_t stream)
{
    return atc_launch(NULL, out, q, q_ld, kv, tiles, n_tiles, n_head, n_head_kv, head_dim, scale, stream);
}
