/* cuda_emu.h — just enough of the CUDA C++ device language to run
 * the kernels/ .cu files on the CPU, for checking their logic (indexing, reductions,
 * barriers, warp shuffles) on machines without a GPU. Not for speed, and not
 * a model of GPU floating point (expf, cosf… are the host's).
 *
 * emu.sh rewrites each `kernel<<<grid, block, smem, stream>>>(args)` into
 * emu_launch(grid, block, stream, std::bind(kernel, args)) and force-includes
 * this header. A launch is queued on its stream (fake_cuda.c) and, when it
 * runs, runs the blocks one after another; inside a block every
 * CUDA thread is a fiber (ucontext) scheduled round-robin, so
 * __syncthreads() and __shfl_xor_sync() are real barriers (block-wide and
 * per warp) and a missing one shows up as a wrong result or a deadlock
 * report. `__shared__` variables become function statics, reused block after
 * block as shared memory is. Kernels must use 1-D grids and blocks of at most
 * EMU_MAX_THREADS threads, a multiple of 32 when they shuffle. */
#ifndef KVB_CUDA_EMU_H
#define KVB_CUDA_EMU_H

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <type_traits>

#include <cublas_v2.h> /* first, so that they see CUDA's own definitions of these: */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(n)

#define EMU_MAX_THREADS 1024

struct emu_dim {
    unsigned x, y, z;
};
extern emu_dim threadIdx, blockIdx, blockDim, gridDim; /* set for the running fiber */

void emu_launch(unsigned grid, unsigned block, cudaStream_t stream, const std::function<void()> &fn);
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);

/* 16-bit floats travel as their bits (uint16_t). The CUDA headers that
 * cublas_v2.h pulls in declare __half and __nv_bfloat16 already (included
 * above); the device intrinsics the kernels use are then
 * replaced by macros over kvbatch's own conversions (round to nearest even,
 * as the device's _rn intrinsics). */
extern "C" {
float kvb_fp16_to_f32(uint16_t h);
uint16_t kvb_f32_to_fp16(float f);
uint16_t kvb_f32_to_bf16(float f);
}
static inline float emu_uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define __ushort_as_half(u) ((uint16_t)(u))
#define __half_as_ushort(h) ((uint16_t)(h))
#define __half2float(h) kvb_fp16_to_f32(h)
#define __float2half_rn(f) kvb_f32_to_fp16(f)
#define __float2bfloat16_rn(f) kvb_f32_to_bf16(f)
#define __bfloat16_as_ushort(b) ((uint16_t)(b))
#define __uint_as_float(u) emu_uint_as_float(u)
/* The IEEE-rounded arithmetic intrinsics (which no nvcc flag turns into
 * approximations or fused forms) are the host's plain operations: g++
 * compiles these files without FMA contraction (ISO C++ mode) and without
 * fast-math. */
#define __fdiv_rn(a, b) ((float)(a) / (float)(b))
#define __fmul_rn(a, b) ((float)(a) * (float)(b))
#define __fsub_rn(a, b) ((float)(a) - (float)(b))
#define __fadd_rn(a, b) ((float)(a) + (float)(b))

/* WMMA (mma.h), 16x16x16 shapes only. As on the GPU, a fragment is spread
 * over the warp: each lane loads and stores only its share of the tile
 * (elements i*16+j with (i*16+j) % 32 == lane; CUDA's layout is another,
 * unspecified one, which kvbatch's kernels never rely on) at its own time,
 * and mma_sync gathers the shares through a per-warp exchange, between warp
 * barriers. A load reads before the warp meets, a store writes after: so
 * memory a lane reads into a fragment before another lane has written it,
 * or a stored tile read before a __syncwarp, gives wrong results. The products are an f32 dot
 * product per element, k in order. */
#include <vector_functions.h>
void emu_wmma_exchange(const float *a, const float *b, const float *c, float *d);
namespace nvcuda
{
namespace wmma
{
struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuda_emu: WMMA 16x16x16 only");
    float x[256]; /* element i*16+j: A (m, k), B (k, n), C (m, n); this lane's share valid */
};

inline bool emu_mine(int idx) { return idx % 32 == (int)(threadIdx.x % 32); }

template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
}

template <typename Use, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __half, Layout> &f, const __half *p, unsigned ldm)
{
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    const bool col = std::is_same<Layout, col_major>::value;
    for (int i = 0; i < 256; i++) {
        const int r = i / 16, c = i % 16;
        f.x[i] = emu_mine(i) ? kvb_fp16_to_f32(col ? h[c * ldm + r] : h[r * ldm + c]) : NAN;
    }
    __syncwarp();
}

/* The warp meets first, then each lane stores its share and goes on: what
 * other lanes stored is there only after a __syncwarp. */
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l)
{
    __syncwarp();
    for (int i = 0; i < 256; i++) {
        const int r = i / 16, c = i % 16;
        if (emu_mine(i)) (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[i];
    }
}

template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, __half, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __half, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    emu_wmma_exchange(a.x, b.x, c.x, d.x);
}
} // namespace wmma
} // namespace nvcuda

#endif
