/* fake_cuda.c — a host-memory stand-in for the parts of the CUDA runtime
 * and cuBLAS that kvbatch uses, so that be_cuda.c, the emulated kernels
 * (cuda_emu.h) and the GPU tests run end to end on a machine without a GPU.
 *
 * "Device" memory is malloc'd host memory: under AddressSanitizer an
 * out-of-bounds kernel access is reported like any other. Fresh device
 * allocations are filled with 0xff bytes (NaN as f32, bf16 and fp16), so
 * reading memory nobody wrote shows up as NaN rather than as a lucky zero.
 * Everything is synchronous, except under stream capture (CUDA graphs):
 * then kernel launches (cuda_emu.cc), async copies and sets, and GEMMs are
 * recorded with their arguments' values as of the call, and run in order
 * when the instantiated graph is launched — so a captured pointer that
 * goes stale shows up as a wrong result. Calls that real CUDA refuses
 * during capture (allocation, synchronous copies, synchronisation) fail
 * and invalidate the capture. cublasGemmEx follows cuBLAS's documented
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

/* ---- stream capture ------------------------------------------------------------ */

struct fake_op {
    void (*run)(void *arg);
    void (*drop)(void *arg); /* NULL: free(arg) */
    void *arg;
};

struct fake_graph {
    struct fake_op *ops;
    int n, cap;
    int refs; /* the graph and each executable made from it */
};

static struct fake_graph *capture;   /* while capturing */
static int capture_broken;

int fake_cuda_capturing(void) { return capture != NULL; }

/* Appends an operation to the graph being captured; takes arg. */
void fake_cuda_record(void (*run)(void *), void (*drop)(void *), void *arg)
{
    if (capture->n == capture->cap) {
        int cap = capture->cap ? capture->cap * 2 : 64;
        struct fake_op *ops = realloc(capture->ops, sizeof *ops * (size_t)cap);
        if (!ops) {
            capture_broken = 1;
            if (drop) drop(arg);
            else free(arg);
            return;
        }
        capture->ops = ops;
        capture->cap = cap;
    }
    capture->ops[capture->n++] = (struct fake_op){run, drop, arg};
}

static void graph_unref(struct fake_graph *g)
{
    if (!g || --g->refs > 0) return;
    for (int i = 0; i < g->n; i++) {
        if (g->ops[i].drop) g->ops[i].drop(g->ops[i].arg);
        else free(g->ops[i].arg);
    }
    free(g->ops);
    free(g);
}

/* What real CUDA refuses while a capture is open. */
static int refused_in_capture(void)
{
    if (!capture) return 0;
    capture_broken = 1;
    last_error = cudaErrorStreamCaptureUnsupported;
    return 1;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    (void)s;
    (void)mode;
    if (capture) return fail(cudaErrorIllegalState);
    capture = calloc(1, sizeof *capture);
    if (!capture) return fail(cudaErrorMemoryAllocation);
    capture->refs = 1;
    capture_broken = 0;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    (void)s;
    if (!capture) return fail(cudaErrorIllegalState);
    struct fake_graph *g = capture;
    capture = NULL;
    if (capture_broken) {
        graph_unref(g);
        *graph = NULL;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = (cudaGraph_t)g;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    if (!graph) return fail(cudaErrorInvalidValue);
    struct fake_graph *g = (struct fake_graph *)graph;
    g->refs++;
    *exec = (cudaGraphExec_t)g;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    (void)s;
    if (capture) return fail(cudaErrorStreamCaptureUnsupported); /* kvbatch never nests graphs */
    struct fake_graph *g = (struct fake_graph *)exec;
    for (int i = 0; i < g->n; i++) g->ops[i].run(g->ops[i].arg);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    graph_unref((struct fake_graph *)exec);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    graph_unref((struct fake_graph *)graph);
    return cudaSuccess;
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
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
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
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    struct hdr *h = (struct hdr *)p - 1;
    mem_used -= h->bytes;
    free(h);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
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
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

struct copy_op {
    void *dst;
    const void *src;
    size_t bytes;
    int value; /* memset */
};

static void run_copy(void *a)
{
    struct copy_op *o = a;
    if (o->bytes) memmove(o->dst, o->src, o->bytes);
}

static void run_set(void *a)
{
    struct copy_op *o = a;
    memset(o->dst, o->value, o->bytes);
}

static cudaError_t record_copy(void (*run)(void *), void *dst, const void *src, size_t bytes, int value)
{
    struct copy_op *o = malloc(sizeof *o);
    if (!o) return fail(cudaErrorMemoryAllocation);
    *o = (struct copy_op){dst, src, bytes, value};
    fake_cuda_record(run, NULL, o);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)s;
    (void)kind;
    if (capture) return record_copy(run_copy, dst, src, bytes, 0);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    (void)s;
    if (capture) return record_copy(run_set, p, NULL, bytes, v);
    memset(p, v, bytes);
    return cudaSuccess;
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
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}

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
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorIllegalState: return "the operation is not permitted in the current state";
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
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
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

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *workspace, size_t bytes)
{
    (void)h;
    return workspace || !bytes ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
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

/* One GEMM, arguments by value (a captured one runs later). */
struct gemm_op {
    cublasOperation_t transa, transb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const void *A, *B;
    void *C;
};

static void gemm_now(const struct gemm_op *o)
{
    const cublasOperation_t transa = o->transa, transb = o->transb;
    const int m = o->m, n = o->n, k = o->k, lda = o->lda, ldb = o->ldb, ldc = o->ldc;
    const void *A = o->A, *B = o->B;
    const float al = o->alpha, be = o->beta;
    float *c = o->C;
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
}

static void run_gemm(void *a) { gemm_now(a); }

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
    /* Host pointer mode: alpha and beta are read now, as cuBLAS does. */
    const struct gemm_op o = {transa, transb, m, n, k, lda, ldb, ldc, *(const float *)alpha, *(const float *)beta,
                              A, B, C};
    if (capture) {
        struct gemm_op *rec = malloc(sizeof *rec);
        if (!rec) return CUBLAS_STATUS_ALLOC_FAILED;
        *rec = o;
        fake_cuda_record(run_gemm, NULL, rec);
        return CUBLAS_STATUS_SUCCESS;
    }
    gemm_now(&o);
    return CUBLAS_STATUS_SUCCESS;
}
