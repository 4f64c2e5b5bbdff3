/* fake_cuda.c — a host-memory stand-in for the parts of the CUDA runtime
 * and cuBLAS that kvbatch uses, so that be_cuda.c, the emulated kernels
 * (cuda_emu.h) and the GPU tests run end to end on a machine without a GPU.
 *
 * "Device" memory is malloc'd host memory: under AddressSanitizer an
 * out-of-bounds kernel access is reported like any other. Fresh device
 * allocations are filled with 0xff bytes (NaN as f32, bf16 and fp16), so
 * reading memory nobody wrote shows up as NaN rather than as a lucky zero.
 * Everything is synchronous. cublasGemmEx follows cuBLAS's documented
 * column-major definition (C = alpha op(A) op(B) + beta C, element (i, j) of
 * C at C[i + j*ldc], op(A) = A or Aᵀ with A[i + p*lda] / A[p + i*lda]),
 * written independently of kernels/k_gemm.c so that it checks k_gemm.c's
 * leading dimensions against the definition. It supports only the types
 * kvbatch uses (bf16 inputs, f32 output, f32 compute).
 *
 * Knobs (environment): FAKE_CUDA_DEVICES (default 1) devices present,
 * FAKE_CUDA_MEM_MB device memory (default 4096): cudaMalloc fails with
 * cudaErrorMemoryAllocation beyond it, to exercise out-of-memory messages. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

static size_t mem_used;
static cudaError_t last_error = cudaSuccess;

static size_t mem_total(void)
{
    const char *s = getenv("FAKE_CUDA_MEM_MB");
    return (size_t)(s ? atol(s) : 4096) << 20;
}

static cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

/* Each allocation carries its size in a header, for the accounting. */
struct hdr {
    size_t bytes;
    size_t pad;
};

cudaError_t cudaGetDeviceCount(int *count)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    *count = s ? atoi(s) : 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    int n;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "fake CUDA device (host emulation)");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = mem_total();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    int n;
    cudaGetDeviceCount(&n);
    return device >= 0 && device < n ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    *total_b = mem_total();
    *free_b = *total_b > mem_used ? *total_b - mem_used : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = NULL;
    if (mem_used + bytes > mem_total()) return fail(cudaErrorMemoryAllocation);
    struct hdr *h = malloc(sizeof *h + bytes);
    if (!h) return fail(cudaErrorMemoryAllocation);
    h->bytes = bytes;
    memset(h + 1, 0xff, bytes);
    mem_used += bytes;
    *p = h + 1;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    struct hdr *h = (struct hdr *)p - 1;
    mem_used -= h->bytes;
    free(h);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags)
{
    (void)flags;
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)s;
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    (void)s;
    return cudaMemset(p, v, bytes);
}

static int stream_obj;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    *s = (cudaStream_t)&stream_obj;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unknown error (fake CUDA)";
    }
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}

/* ---- cuBLAS -------------------------------------------------------------------- */

static int blas_obj;

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = (cublasHandle_t)&blas_obj;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    (void)h;
    (void)s;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_<other> (fake)";
    }
}

static float bf16(const void *base, int64_t i)
{
    uint16_t b;
    memcpy(&b, (const char *)base + 2 * i, 2);
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)handle;
    (void)algo;
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    /* cuBLAS's own argument checks: the leading dimensions must cover the
     * stored rows of each column-major operand. */
    const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    float *c = C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                const float a = transa == CUBLAS_OP_N ? bf16(A, i + (int64_t)p * lda) : bf16(A, p + (int64_t)i * lda);
                const float b = transb == CUBLAS_OP_N ? bf16(B, p + (int64_t)j * ldb) : bf16(B, j + (int64_t)p * ldb);
                s += a * b;
            }
            float *cij = &c[i + (int64_t)j * ldc];
            *cij = be == 0.0f ? al * s : al * s + be * *cij; /* beta = 0: C is not read (may hold NaN) */
        }
    return CUBLAS_STATUS_SUCCESS;
}
