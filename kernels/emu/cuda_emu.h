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

#endif
