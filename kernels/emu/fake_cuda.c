/* fake_cuda.c — a host-memory stand-in for the parts of the CUDA runtime
 * and cuBLAS that kvbatch uses, so that be_cuda.c, the emulated kernels
 * (cuda_emu.h) and the GPU tests run end to end on a machine without a GPU.
 *
 * "Device" memory is malloc'd host memory: under AddressSanitizer an
 * out-of-bounds kernel access is reported like any other. Fresh device
 * allocations are filled with 0xff bytes (NaN as f32, bf16 and fp16), so
 * reading memory nobody wrote shows up as NaN rather than as a lucky zero.
 * Streams are as lazy as CUDA allows: work queued on a created stream
 * (kernel launches from cuda_emu.cc, async copies and sets, GEMMs, graph
 * launches, event waits) is recorded with its arguments' values as of the
 * call and runs only when something forces it — a synchronisation of that
 * stream, of an event recorded on it, or of the device; a wait on such an
 * event by another stream's work that itself runs; cudaFree and
 * cudaFreeHost, which synchronise in CUDA too. A synchronous cudaMemcpy
 * forces nothing, as it does not for CUDA's non-blocking streams. So a
 * missing synchronisation or event wait shows up as stale data (or a NaN
 * from never-written memory), and a host buffer reused before its copy
 * ran as a wrong result. Work on the legacy stream (0) runs at once. Under
 * stream capture (CUDA graphs) the same records go into the graph, run
 * in order when it is launched — so a captured pointer that goes stale
 * shows up as a wrong result. Calls that real CUDA refuses during capture
 * (allocation, synchronous copies, synchronisation, events) fail and
 * invalidate the capture. cublasGemmEx follows cuBLAS's documented
 * column-major definition (C = alpha op(A) op(B) + beta C, element (i, j) of
 * C at C[i + j*ldc], op(A) = A or Aᵀ with A[i + p*lda] / A[p + i*lda]),
 * written independently of kernels/k_gemm.c so that it checks k_gemm.c's
 * leading dimensions against the definition. It supports only the types
 * kvbatch uses (bf16 or f32 inputs, f32 output, f32 compute).
 *
 * Knobs (environment): FAKE_CUDA_DEVICES (default 1) devices present,
 * FAKE_CUDA_MEM_MB device memory (default 4096): cudaMalloc fails with
 * cudaErrorMemoryAllocation beyond it, to exercise out-of-memory messages. */
#include <math.h>
#include <stdbool.h>
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

static struct fake_graph *capture; /* while capturing */
static int capture_broken;

/* Appends an operation to the graph being captured; takes arg. */
static void graph_append(void (*run)(void *), void (*drop)(void *), void *arg)
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

/* ---- streams ------------------------------------------------------------------- */

struct fake_stream {
    struct fake_op *ops; /* queued: ops[head..n) */
    int head, n, cap;
    uint64_t queued, done; /* counts since creation */
    int running;
    struct fake_stream *next; /* all streams, for device-wide synchronisation */
};

static struct fake_stream *streams;
static cudaStream_t capture_stream;

static void op_drop(struct fake_op *o)
{
    if (o->drop) o->drop(o->arg);
    else free(o->arg);
}

/* Runs s's work until `until` operations have run. */
static void stream_run(struct fake_stream *s, uint64_t until)
{
    if (!s) return;
    if (s->running) {
        fprintf(stderr, "fake CUDA: streams wait on each other in a cycle\n");
        abort();
    }
    s->running = 1;
    while (s->done < until && s->head < s->n) {
        struct fake_op o = s->ops[s->head++];
        s->done++;
        o.run(o.arg);
        op_drop(&o);
    }
    if (s->head == s->n) s->head = s->n = 0;
    s->running = 0;
}

static void device_run(void)
{
    for (struct fake_stream *s = streams; s; s = s->next) stream_run(s, s->queued);
}

/* Where every asynchronous operation goes: the graph being captured on
 * stream st, st's queue, or (legacy stream) straight to running. Takes arg. */
void fake_cuda_enqueue(cudaStream_t st, void (*run)(void *), void (*drop)(void *), void *arg)
{
    if (capture && st == capture_stream) {
        graph_append(run, drop, arg);
        return;
    }
    struct fake_stream *s = (struct fake_stream *)st;
    if (!s) {
        struct fake_op o = {run, drop, arg};
        run(arg);
        op_drop(&o);
        return;
    }
    if (s->head > 0 && s->n == s->cap) { /* compact before growing */
        memmove(s->ops, s->ops + s->head, sizeof *s->ops * (size_t)(s->n - s->head));
        s->n -= s->head;
        s->head = 0;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        struct fake_op *ops = realloc(s->ops, sizeof *ops * (size_t)cap);
        if (!ops) {
            fprintf(stderr, "fake CUDA: out of memory for a stream's queue\n");
            abort();
        }
        s->ops = ops;
        s->cap = cap;
    }
    s->ops[s->n++] = (struct fake_op){run, drop, arg};
    s->queued++;
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
    (void)mode;
    if (capture || !s) return fail(cudaErrorIllegalState);
    capture_stream = s;
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
    if (s != capture_stream) return fail(cudaErrorIllegalState);
    struct fake_graph *g = capture;
    capture = NULL;
    capture_stream = NULL;
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

static void run_graph(void *a)
{
    struct fake_graph *g = a;
    for (int i = 0; i < g->n; i++) g->ops[i].run(g->ops[i].arg);
}

static void drop_graph(void *a) { graph_unref(a); }

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (capture) return fail(cudaErrorStreamCaptureUnsupported); /* kvbatch never nests graphs */
    struct fake_graph *g = (struct fake_graph *)exec;
    g->refs++; /* until it has run: the executable may be destroyed before */
    fake_cuda_enqueue(s, run_graph, drop_graph, g);
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
    p->multiProcessorCount = 4; /* small, so that be_cuda picks kcu_attn for the smallest steps */
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
    device_run(); /* cudaFree synchronises: queued work may still use p */
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
    device_run(); /* as cudaFree: a queued copy may still use p */
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

static cudaError_t queue_copy(cudaStream_t st, void (*run)(void *), void *dst, const void *src, size_t bytes, int value)
{
    struct copy_op *o = malloc(sizeof *o);
    if (!o) return fail(cudaErrorMemoryAllocation);
    *o = (struct copy_op){dst, src, bytes, value};
    fake_cuda_enqueue(st, run, NULL, o);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    return queue_copy(s, run_copy, dst, src, bytes, 0);
}

cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    return queue_copy(s, run_set, p, NULL, bytes, v);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags; /* kvbatch's streams are all non-blocking */
    struct fake_stream *n = calloc(1, sizeof *n);
    if (!n) return fail(cudaErrorMemoryAllocation);
    n->next = streams;
    streams = n;
    *s = (cudaStream_t)n;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    struct fake_stream *s = (struct fake_stream *)st;
    if (!s) return fail(cudaErrorInvalidValue);
    stream_run(s, s->queued); /* CUDA finishes queued work first */
    for (struct fake_stream **pp = &streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    free(s->ops);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    struct fake_stream *s = (struct fake_stream *)st;
    if (s) stream_run(s, s->queued);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    device_run();
    return cudaSuccess;
}

/* ---- events: a point in one stream's queue ---------------------------------------- */

struct fake_event {
    struct fake_stream *s; /* NULL: nothing recorded, or recorded on the legacy stream */
    uint64_t at;           /* operations of s that precede it */
};

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    struct fake_event *n = calloc(1, sizeof *n);
    if (!n) return fail(cudaErrorMemoryAllocation);
    *e = (cudaEvent_t)n;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported; /* kvbatch captures no events */
    struct fake_event *ev = (struct fake_event *)e;
    ev->s = (struct fake_stream *)st;
    ev->at = ev->s ? ev->s->queued : 0;
    return cudaSuccess;
}

struct wait_op {
    struct fake_stream *s;
    uint64_t at;
};

static void run_wait(void *a)
{
    struct wait_op *w = a;
    stream_run(w->s, w->at);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    const struct fake_event *ev = (const struct fake_event *)e;
    if (!ev->s) return cudaSuccess; /* nothing to wait for */
    struct wait_op *w = malloc(sizeof *w);
    if (!w) return fail(cudaErrorMemoryAllocation);
    *w = (struct wait_op){ev->s, ev->at};
    fake_cuda_enqueue(st, run_wait, NULL, w);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    const struct fake_event *ev = (const struct fake_event *)e;
    stream_run(ev->s, ev->at);
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

struct fake_blas {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    struct fake_blas *b = calloc(1, sizeof *b);
    if (!b) return CUBLAS_STATUS_ALLOC_FAILED;
    *h = (cublasHandle_t)b;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    ((struct fake_blas *)h)->stream = s;
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

static float f32(const void *base, int64_t i)
{
    float f;
    memcpy(&f, (const char *)base + 4 * i, 4);
    return f;
}

/* One GEMM, arguments by value (a captured one runs later). */
struct gemm_op {
    bool f32; /* A and B are f32, else bf16 */
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
    float (*const ld)(const void *, int64_t) = o->f32 ? f32 : bf16;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                const float a = transa == CUBLAS_OP_N ? ld(A, i + (int64_t)p * lda) : ld(A, p + (int64_t)i * lda);
                const float b = transb == CUBLAS_OP_N ? ld(B, p + (int64_t)j * ldb) : ld(B, j + (int64_t)p * ldb);
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
    (void)algo;
    const bool is_f32 = Atype == CUDA_R_32F && Btype == CUDA_R_32F;
    if (!(is_f32 || (Atype == CUDA_R_16BF && Btype == CUDA_R_16BF)) || Ctype != CUDA_R_32F ||
        computeType != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    /* cuBLAS's own argument checks: the leading dimensions must cover the
     * stored rows of each column-major operand. */
    const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* Host pointer mode: alpha and beta are read now, as cuBLAS does. */
    const struct gemm_op o = {
        is_f32, transa, transb, m, n, k, lda, ldb, ldc, *(const float *)alpha, *(const float *)beta, A, B, C};
    struct gemm_op *rec = malloc(sizeof *rec);
    if (!rec) return CUBLAS_STATUS_ALLOC_FAILED;
    *rec = o;
    fake_cuda_enqueue(((struct fake_blas *)handle)->stream, run_gemm, NULL, rec);
    return CUBLAS_STATUS_SUCCESS;
}
