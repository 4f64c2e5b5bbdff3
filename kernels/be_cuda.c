/* be_cuda.c — the CUDA backend (see be_cuda.h): weights uploaded once as
 * bf16, one forward pass per step on one stream (persistent-cache copies on
 * two more, beside it), KV in a device pool with
 * the CPU backend's layout.
 *
 * The step mirrors be_cpu.c operation for operation, reading the same
 * fields of struct model (model_ops and the layers'; never the
 * architecture's name): embedding (scaled when model_ops says); per layer
 * RMSNorm (none when the layer has no pre-norm: olmo2), Q|K|V projection
 * (+ bias, Q/K norm per head or over the whole Q and K when the layer has
 * them), RoPE (the windowed layers' own frequencies), K/V stored into
 * their slots (fp16, or quantized to q8 / q4 by the store kernel itself),
 * paged attention over the stored rows (windowed, soft-capped), output
 * projection + residual (through the post-attention norm when the layer has
 * one, times model_ops.resid_scale when set: granite), RMSNorm, gate|up
 * projection, SwiGLU or GeGLU, down projection + residual (likewise; in a
 * mixture-of-experts layer the experts of be_cuda_moe.c instead); then
 * final norm, output head, logit divisor and final soft-cap for the rows
 * whose logits are wanted. Q, K and V are one stacked weight [wq; wk; wv] and gate and up one
 * [w_gate; w_up], so each is a single GEMM whose output row holds the parts
 * side by side; the kernels read the parts through row strides. An encoder
 * (model_ops.encoder: bert) runs its own pass instead (be_cuda_enc.c) and
 * has no KV pool.
 *
 * Host C only: CUDA runtime and cuBLAS through their C APIs, kernels through
 * kernels.h. cudaError_t and cublasStatus_t become kvbatch statuses here, at
 * the edge, with the library's text kept in the message. */
#include "kernels/be_cuda.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/kvtype.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "base/tpool.h"
#include "kernels/be_cuda_internal.h"
#include "kernels/be_cuda_moe.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "model/quant.h"

/* kernels.h numbers the KV types without including backend/kvtype.h. */
_Static_assert(KCU_KV_F16 == KV_F16 && KCU_KV_Q8 == KV_Q8 && KCU_KV_Q4 == KV_Q4, "KV type numbers");
_Static_assert(KCU_KV_GROUP == KV_QGROUP && KCU_KV_Q8_BYTES == sizeof(struct kvq8_group) &&
                   KCU_KV_Q4_BYTES == sizeof(struct kvq4_group),
               "KV group layouts");

/* One layer's weights on the device. */
struct cu_layer {
    float *attn_norm, *ffn_norm; /* (n_embd), or NULL: no pre-norm (olmo2) */
    uint16_t *wqkv;              /* (q_dim + 2*kv_dim, n_embd) bf16: wq rows, then wk, then wv */
    float *bqkv;                 /* (q_dim + 2*kv_dim) qwen2 bias, or NULL */
    float *q_norm, *k_norm;      /* (head_dim) qwen3, gemma3; (q_dim), (kv_dim) olmo2; or NULL */
    float *post_attn_norm;       /* (n_embd) gemma, olmo2, or NULL */
    float *post_ffn_norm;        /* (n_embd) gemma, olmo2, or NULL */
    uint16_t *wo;                /* (n_embd, q_dim) bf16 */
    uint16_t *wgu;               /* (2*n_ff, n_embd) bf16: w_gate rows, then w_up; NULL in a MoE layer */
    uint16_t *wdown;             /* (n_embd, n_ff) bf16; NULL in a MoE layer */
};

/* What the device work of a step depends on besides the index values:
 * tokens, logits rows (greedy ones included), greedy rows, attention
 * tiles (0 when the per-(token, head) kernel runs), and hidden-state rows
 * (BE_HIDDEN_*). */
struct step_shape {
    int64_t n_tok, n_out, n_am, n_tiles, n_hid;
};

/* A step enqueues ~10 launches per layer; for small steps the host's
 * launch rate, not the GPU, sets the pace. With graphs on, a step shape
 * (struct step_shape) seen before is captured once into a graph and
 * replayed with one launch: decode steps repeat their shape step after
 * step. Slots are reused least recently used first; all are dropped when
 * the step buffers or the index buffer move (their addresses are in the
 * graphs). If capturing fails for any reason, graphs are switched off for
 * this backend and the step runs as usual: they are an optimisation. */
#define GRAPH_SLOTS 16
#define GRAPH_MAX_TOK 1024 /* larger steps are prefill chunks: launch-bound they are not */

struct graph_slot {
    struct step_shape sh;
    int seen;             /* steps of this shape so far */
    cudaGraphExec_t exec; /* NULL until captured */
    uint64_t last_use;
};

struct cuda_be {
    struct backend be;
    const struct model *m;
    int device;
    bool det;
    cudaStream_t stream;
    /* Persistent-cache copies run on streams of their own, so that the
     * copy engines move blocks while the compute stream works: spills
     * (device to host) and restores (host to device) each in order. A
     * forward pass waits on the device for restores queued before it
     * (h2d_done), a spill for the passes before it (step_done). */
    cudaStream_t d2h, h2d;
    cudaEvent_t h2d_done, step_done;
    bool h2d_queued; /* restores queued since the last forward */
    cublasHandle_t blas;
    struct tpool *pool; /* host threads for the engine's sampling (host_parallel) */
    void *blas_ws;      /* cuBLAS workspace, set explicitly so captured GEMMs keep it */
    bool graphs;        /* CUDA graphs for repeated step shapes (see struct graph_slot) */
    struct graph_slot gslots[GRAPH_SLOTS];
    uint64_t graph_clock;
    int64_t graph_launches;
    char graph_off[160];            /* why graphs were switched off, or "" */
    int64_t q_dim, kv_dim, qkv_dim; /* n_head*hd, n_head_kv*hd, q_dim + 2*kv_dim */
    enum kv_type kv_type;           /* how the pool stores K/V rows */
    int32_t attn_tile;              /* tokens per tensor-core attention tile; 0: kcu_attn instead */
    int32_t n_sm;                   /* multiprocessors: below that many tiles x KV heads, kcu_attn */
    char kernels_name[96];          /* be.kernels */

    struct cu_layer *layers;  /* (n_layer) host array of device pointers */
    struct cu_moe *moe;       /* the MoE layers' experts (be_cuda_moe.h), or NULL */
    uint16_t *tok_embd;       /* (n_vocab, n_embd) bf16 */
    uint16_t *output;         /* (n_vocab, n_embd) bf16; == tok_embd when tied */
    float *output_norm;       /* (n_embd) */
    float *inv_freq;          /* (rope_dim / 2) */
    float *inv_freq_swa;      /* (rope_dim / 2) the windowed layers' (model_rope_freqs_swa) */
    uint8_t *kv;              /* (n_pages, be.page_bytes) as kv_type (backend.h's paging) */
    int32_t *map;             /* (n_logical, n_groups) host: each block's pages; NULL with one group */
    int32_t *lgroup, *lindex; /* (n_layer) each layer's group, its index in the group's page */

    /* Per-step device scratch, grown to the largest step seen. Row counts
     * are rounded up to BE_CUDA_DET_ROWS so deterministic GEMM tiles fit. */
    int64_t cap_tok, cap_out;
    float *x;      /* (cap_tok, n_embd) residual stream */
    float *proj;   /* (cap_tok, n_embd) a projection's output on its way through a post-norm */
    float *qkv;    /* (cap_tok, qkv_dim) */
    float *gu;     /* (cap_tok, 2*n_ff) */
    uint16_t *xb;  /* (cap_tok, max(n_embd, q_dim, n_ff)) bf16 GEMM input */
    float *logits; /* (cap_out, n_vocab) */
    float *hidden; /* (cap_tok, n_embd) final-norm rows of BE_HIDDEN_* sequences, f32 */
    /* Step indices: tokens | positions | table offsets | output rows |
     * greedy rows | block tables, uploaded in one copy from pinned memory;
     * then the greedy choices, copied back into the same buffer. */
    int64_t cap_idx; /* int32 entries */
    int32_t *h_idx;  /* pinned host */
    int32_t *d_idx;  /* device */

    /* An encoder's pass (be_cuda_enc.c), run instead of the llama layer's;
     * NULL for every other model. An encoder has no KV pool (kv NULL). */
    struct cuda_enc *enc;
};

static void graphs_clear(struct cuda_be *c);

/* ---- foreign errors ------------------------------------------------------------ */

static enum kvb_status cu_status(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return KVB_OK;
    case cudaErrorMemoryAllocation: return KVB_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDevice: return KVB_ERR_UNSUPPORTED;
    case cudaErrorInvalidValue: return KVB_ERR_INTERNAL; /* a launcher refused a shape: our bug */
    default: return KVB_ERR_IO;
    }
}

enum kvb_status cu_check(cudaError_t e, struct kvb_err *err, const char *what)
{
    if (e == cudaSuccess) return KVB_OK;
    return kvb_errf(err, cu_status(e), "CUDA: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

enum kvb_status blas_check(cublasStatus_t s, struct kvb_err *err, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return KVB_OK;
    enum kvb_status st = KVB_ERR_IO;
    if (s == CUBLAS_STATUS_ALLOC_FAILED) st = KVB_ERR_NOMEM;
    else if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH) st = KVB_ERR_UNSUPPORTED;
    else if (s == CUBLAS_STATUS_INVALID_VALUE) st = KVB_ERR_INTERNAL;
    return kvb_errf(err, st, "cuBLAS: %s: %s", what, cublasGetStatusString(s));
}

static double mib(int64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* ---- availability ----------------------------------------------------------------- */

bool be_cuda_available(int device, char *why, size_t cap)
{
    char dummy[8];
    if (!why) {
        why = dummy;
        cap = sizeof dummy;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, cap, "%s", cudaGetErrorString(e));
        return false;
    }
    if (n == 0) {
        snprintf(why, cap, "no CUDA device");
        return false;
    }
    if (device < 0 || device >= n) {
        snprintf(why, cap, "device %d asked for, %d present", device, n);
        return false;
    }
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        snprintf(why, cap, "%s", cudaGetErrorString(e));
        return false;
    }
    if (p.major < 8) {
        snprintf(why, cap, "%s has compute capability %d.%d; kvbatch's bf16 kernels need 8.0 or newer", p.name, p.major,
                 p.minor);
        return false;
    }
    if (why != dummy) snprintf(why, cap, "%s", p.name);
    return true;
}

int64_t be_cuda_free_memory(int device)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) return -1;
    if (cudaSetDevice(device) != cudaSuccess) return -1;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
    return (int64_t)free_b;
}

int64_t be_cuda_weight_bytes(const struct model *m)
{
    if (m->ops.encoder) return cuda_enc_weight_bytes(m);
    const struct model_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, f = hp->n_ff;
    int64_t per_layer = 2 * ((qd + 2 * kvd) * e + e * qd);
    const struct model_layer *L = &m->layers[0];
    if (L->attn_norm) per_layer += 4 * e;
    if (L->ffn_norm) per_layer += 4 * e;
    if (L->bq) per_layer += 4 * (qd + 2 * kvd);
    if (L->q_norm) per_layer += m->ops.qk_norm_whole ? 4 * (qd + kvd) : 4 * 2 * (int64_t)hp->head_dim;
    if (L->post_attn_norm) per_layer += 4 * e;
    if (L->post_ffn_norm) per_layer += 4 * e;
    int64_t total = per_layer * hp->n_layer + 2 * (int64_t)hp->n_vocab * e + 4 * e;
    for (int l = 0; l < hp->n_layer; l++) /* the FFN: dense, or experts (be_cuda_moe.c) */
        total += m->layers[l].moe ? cu_moe_weight_bytes(m, l) : 2 * (2 * f * e + e * f);
    if (m->output.data != m->tok_embd.data) total += 2 * (int64_t)hp->n_vocab * e;
    return total;
}

/* ---- teardown ------------------------------------------------------------------------ */

static void free_scratch(struct cuda_be *c)
{
    void *bufs[] = {c->x, c->proj, c->qkv, c->gu, c->xb, c->logits, c->hidden};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    c->x = c->proj = c->qkv = c->gu = c->logits = c->hidden = NULL;
    c->xb = NULL;
    c->cap_tok = c->cap_out = 0;
}

static void cuda_free(struct backend *be)
{
    struct cuda_be *c = (struct cuda_be *)be;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->d2h) cudaStreamSynchronize(c->d2h);
    if (c->h2d) cudaStreamSynchronize(c->h2d);
    graphs_clear(c);
    cuda_enc_free(c->enc);
    cudaFree(c->blas_ws);
    free_scratch(c);
    cu_moe_free(c->moe);
    if (c->layers) {
        for (int l = 0; l < c->m->hp.n_layer; l++) {
            struct cu_layer *L = &c->layers[l];
            void *bufs[] = {L->attn_norm, L->ffn_norm,       L->wqkv,          L->bqkv, L->q_norm, L->k_norm,
                            L->wo,        L->post_attn_norm, L->post_ffn_norm, L->wgu,  L->wdown};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
        }
        kvb_free(c->layers);
    }
    if (c->output != c->tok_embd) cudaFree(c->output);
    cudaFree(c->tok_embd);
    cudaFree(c->output_norm);
    cudaFree(c->inv_freq);
    cudaFree(c->inv_freq_swa);
    cudaFree(c->kv);
    kvb_free(c->map);
    kvb_free(c->lgroup);
    kvb_free(c->lindex);
    cudaFree(c->d_idx);
    if (c->h_idx) cudaFreeHost(c->h_idx);
    if (c->blas) cublasDestroy(c->blas);
    tpool_free(c->pool);
    if (c->h2d_done) cudaEventDestroy(c->h2d_done);
    if (c->step_done) cudaEventDestroy(c->step_done);
    if (c->d2h) cudaStreamDestroy(c->d2h);
    if (c->h2d) cudaStreamDestroy(c->h2d);
    if (c->stream) cudaStreamDestroy(c->stream);
    kvb_free(c);
}

/* ---- weight upload ----------------------------------------------------------------- */

enum kvb_status dev_alloc(void *pp, int64_t bytes, const char *what, struct kvb_err *err)
{
    void **p = pp;
    cudaError_t e = cudaMalloc(p, (size_t)(bytes > 0 ? bytes : 1));
    if (e == cudaSuccess) return KVB_OK;
    *p = NULL;
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* clear it: an allocation failure is not sticky */
        return kvb_errf(err, KVB_ERR_NOMEM, "CUDA: out of device memory for %s (%.1f MiB)", what, mib(bytes));
    }
    return cu_check(e, err, what);
}

/* Dequantizes `w` (n_out rows of n_in) into bf16 rows and copies them to
 * dst (row-major, n_in per row). */
enum kvb_status upload_matrix(struct uploader *u, uint16_t *dst, const struct mm_weight *w, const char *name,
                              struct kvb_err *err)
{
    const int64_t n_in = w->n_in;
    const int64_t rows_per_chunk = u->cap / n_in;
    for (int64_t r0 = 0; r0 < w->n_out; r0 += rows_per_chunk) {
        const int64_t nr = w->n_out - r0 < rows_per_chunk ? w->n_out - r0 : rows_per_chunk;
        for (int64_t r = 0; r < nr; r++) {
            const uint8_t *src = (const uint8_t *)w->data + (size_t)(r0 + r) * w->row_bytes;
            uint16_t *out = u->stage + r * n_in;
            if (w->type == GGML_TYPE_BF16) { /* bf16 -> f32 -> bf16 is the identity */
                memcpy(out, src, (size_t)n_in * 2);
                continue;
            }
            enum kvb_status st = quant_dequant_row(w->type, src, u->row, n_in);
            if (st != KVB_OK) return kvb_errf(err, st, "%s: cannot dequantize type %u", name, (unsigned)w->type);
            for (int64_t i = 0; i < n_in; i++) out[i] = kvb_f32_to_bf16(u->row[i]);
        }
        KVB_FORWARD_IF_ERROR(cu_check(
            cudaMemcpy(dst + r0 * n_in, u->stage, (size_t)(nr * n_in) * 2, cudaMemcpyHostToDevice), err, name));
    }
    return KVB_OK;
}

/* upload_matrix for be_cuda_moe.c, which uploads the experts' slices. */
static enum kvb_status put_matrix(void *u, uint16_t *dst, const struct mm_weight *w, const char *name,
                                  struct kvb_err *err)
{
    return upload_matrix(u, dst, w, name, err);
}

/* Uploads n matrices with the same n_in stacked row-wise into one new
 * device array. */
static enum kvb_status upload_stacked(struct uploader *u, uint16_t **dst, const struct mm_weight *const *w, int n,
                                      int64_t n_in, const int64_t *n_out, const char *name, struct kvb_err *err)
{
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        if (w[i]->n_in != n_in || w[i]->n_out != n_out[i])
            return kvb_errf(err, KVB_ERR_FORMAT, "%s: part %d is %lld x %lld, expected %lld x %lld", name, i,
                            (long long)w[i]->n_out, (long long)w[i]->n_in, (long long)n_out[i], (long long)n_in);
        rows += n_out[i];
    }
    KVB_FORWARD_IF_ERROR(dev_alloc(dst, rows * n_in * 2, name, err));
    rows = 0;
    for (int i = 0; i < n; i++) {
        KVB_FORWARD_IF_ERROR(upload_matrix(u, *dst + rows * n_in, w[i], name, err));
        rows += n_out[i];
    }
    return KVB_OK;
}

enum kvb_status upload_f32(float **dst, const float *src, int64_t n, const char *name, struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(dev_alloc(dst, n * 4, name, err));
    return cu_check(cudaMemcpy(*dst, src, (size_t)n * 4, cudaMemcpyHostToDevice), err, name);
}

static enum kvb_status upload_weights(struct cuda_be *c, struct uploader *u, struct kvb_err *err)
{
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd, f = hp->n_ff, qd = c->q_dim, kvd = c->kv_dim;
    char name[64];
    c->layers = kvb_calloc((size_t)hp->n_layer, sizeof *c->layers);
    if (!c->layers) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    for (int l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        struct cu_layer *D = &c->layers[l];
        snprintf(name, sizeof name, "layer %d attention weights", l);
        const struct mm_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
        const int64_t qkv_out[3] = {qd, kvd, kvd};
        KVB_FORWARD_IF_ERROR(upload_stacked(u, &D->wqkv, qkv, 3, e, qkv_out, name, err));
        const struct mm_weight *wo[1] = {&L->wo};
        const int64_t wo_out[1] = {e};
        KVB_FORWARD_IF_ERROR(upload_stacked(u, &D->wo, wo, 1, qd, wo_out, name, err));
        snprintf(name, sizeof name, "layer %d FFN weights", l);
        const struct mm_weight *gu[2] = {&L->w_gate, &L->w_up};
        const int64_t gu_out[2] = {f, f};
        if (!L->moe) KVB_FORWARD_IF_ERROR(upload_stacked(u, &D->wgu, gu, 2, e, gu_out, name, err));
        const struct mm_weight *wd[1] = {&L->w_down};
        const int64_t wd_out[1] = {e};
        if (!L->moe) KVB_FORWARD_IF_ERROR(upload_stacked(u, &D->wdown, wd, 1, f, wd_out, name, err));
        snprintf(name, sizeof name, "layer %d norms and biases", l);
        if (L->attn_norm) KVB_FORWARD_IF_ERROR(upload_f32(&D->attn_norm, L->attn_norm, e, name, err));
        if (L->ffn_norm) KVB_FORWARD_IF_ERROR(upload_f32(&D->ffn_norm, L->ffn_norm, e, name, err));
        if (L->bq) {
            KVB_FORWARD_IF_ERROR(dev_alloc(&D->bqkv, c->qkv_dim * 4, name, err));
            KVB_FORWARD_IF_ERROR(
                cu_check(cudaMemcpy(D->bqkv, L->bq, (size_t)qd * 4, cudaMemcpyHostToDevice), err, name));
            KVB_FORWARD_IF_ERROR(
                cu_check(cudaMemcpy(D->bqkv + qd, L->bk, (size_t)kvd * 4, cudaMemcpyHostToDevice), err, name));
            KVB_FORWARD_IF_ERROR(
                cu_check(cudaMemcpy(D->bqkv + qd + kvd, L->bv, (size_t)kvd * 4, cudaMemcpyHostToDevice), err, name));
        }
        if (L->q_norm) { /* per head, or over the whole rows (olmo2) */
            const bool whole = m->ops.qk_norm_whole;
            KVB_FORWARD_IF_ERROR(upload_f32(&D->q_norm, L->q_norm, whole ? qd : hp->head_dim, name, err));
            KVB_FORWARD_IF_ERROR(upload_f32(&D->k_norm, L->k_norm, whole ? kvd : hp->head_dim, name, err));
        }
        if (L->post_attn_norm) KVB_FORWARD_IF_ERROR(upload_f32(&D->post_attn_norm, L->post_attn_norm, e, name, err));
        if (L->post_ffn_norm) KVB_FORWARD_IF_ERROR(upload_f32(&D->post_ffn_norm, L->post_ffn_norm, e, name, err));
    }
    if (m->ops.moe.n_expert > 0) KVB_FORWARD_IF_ERROR(cu_moe_create(m, put_matrix, u, &c->moe, err));
    const struct mm_weight *te[1] = {&m->tok_embd};
    const int64_t te_out[1] = {hp->n_vocab};
    KVB_FORWARD_IF_ERROR(upload_stacked(u, &c->tok_embd, te, 1, e, te_out, "token embeddings", err));
    if (m->output.data == m->tok_embd.data) {
        c->output = c->tok_embd;
    } else {
        const struct mm_weight *ow[1] = {&m->output};
        KVB_FORWARD_IF_ERROR(upload_stacked(u, &c->output, ow, 1, e, te_out, "output head", err));
    }
    KVB_FORWARD_IF_ERROR(upload_f32(&c->output_norm, m->output_norm, e, "output norm", err));
    float *inv = kvb_malloc(sizeof(float) * (size_t)(hp->rope_dim / 2 + 1));
    if (!inv) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    model_rope_freqs(m, inv); /* the CPU backend's frequencies, scaling included */
    enum kvb_status st = upload_f32(&c->inv_freq, inv, hp->rope_dim / 2 + 1, "RoPE frequencies", err);
    model_rope_freqs_swa(m, inv);
    if (st == KVB_OK) st = upload_f32(&c->inv_freq_swa, inv, hp->rope_dim / 2 + 1, "RoPE frequencies", err);
    kvb_free(inv);
    return st;
}

/* ---- step ----------------------------------------------------------------------------- */

#define BLAS_WORKSPACE ((int64_t)32 << 20)

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

static enum kvb_status ensure_step(struct cuda_be *c, int64_t n_tok, int64_t n_out, int64_t n_idx, struct kvb_err *err)
{
    const struct model_hparams *hp = &c->m->hp;
    const int64_t e = hp->n_embd, f = hp->n_ff;
    if (n_tok > c->cap_tok || n_out > c->cap_out) {
        const int64_t nt = round_up(n_tok > c->cap_tok ? n_tok : c->cap_tok, BE_CUDA_DET_ROWS);
        const int64_t no = round_up(n_out > c->cap_out ? n_out : c->cap_out, BE_CUDA_DET_ROWS);
        int64_t wide = e > c->q_dim ? e : c->q_dim;
        if (f > wide) wide = f;
        graphs_clear(c); /* they hold the old buffers' addresses */
        free_scratch(c);
        struct {
            void *p;
            int64_t bytes;
        } b[] = {
            {&c->x, nt * e * 4},
            {&c->proj, nt * e * 4},
            {&c->qkv, nt * c->qkv_dim * 4},
            {&c->gu, nt * 2 * f * 4},
            {&c->xb, (nt > no ? nt : no) * wide * 2},
            {&c->logits, no * hp->n_vocab * 4},
            {&c->hidden, nt * e * 4},
        };
        int64_t total = 0;
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) total += b[i].bytes;
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
            enum kvb_status st = dev_alloc(b[i].p, b[i].bytes, "step buffers", err);
            /* Zeroed so that the padding rows of deterministic GEMM tiles
             * hold numbers, not stale bits. */
            if (st == KVB_OK)
                st = cu_check(cudaMemsetAsync(*(void **)b[i].p, 0, (size_t)b[i].bytes, c->stream), err, "step buffers");
            if (st != KVB_OK) {
                free_scratch(c);
                if (st != KVB_ERR_NOMEM) return st;
                return kvb_errf(err, st,
                                "CUDA: out of device memory: a %lld-token step needs %.1f MiB of scratch "
                                "beside the weights and the KV pool: lower the tokens per step or --kv-mem",
                                (long long)n_tok, mib(total));
            }
        }
        c->cap_tok = nt;
        c->cap_out = no;
    }
    if (c->moe) KVB_FORWARD_IF_ERROR(cu_moe_reserve(c->moe, c->cap_tok, c->stream, err));
    if (n_idx > c->cap_idx) {
        const int64_t ni = round_up(n_idx > 2 * c->cap_idx ? n_idx : 2 * c->cap_idx, 4096); /* few moves: see graphs */
        graphs_clear(c);
        if (c->h_idx) cudaFreeHost(c->h_idx);
        cudaFree(c->d_idx);
        c->h_idx = NULL;
        c->d_idx = NULL;
        c->cap_idx = 0;
        KVB_FORWARD_IF_ERROR(cu_check(cudaHostAlloc((void **)&c->h_idx, (size_t)ni * 4, cudaHostAllocDefault), err,
                                      "pinned step indices"));
        KVB_FORWARD_IF_ERROR(dev_alloc(&c->d_idx, ni * 4, "step indices", err));
        c->cap_idx = ni;
    }
    return KVB_OK;
}

/* A step enqueues some forty launches per layer; rather than test each
 * one inline, the first failure is recorded (what failed, and the CUDA or
 * cuBLAS status) and the step stops at the end of that layer. */
struct step {
    struct cuda_be *c;
    cudaError_t ce;
    cublasStatus_t bs;
    const char *what; /* NULL while all is well */
};

static void step_cu(struct step *s, cudaError_t e, const char *what)
{
    if (e != cudaSuccess && !s->what) {
        s->ce = e;
        s->what = what;
    }
}

/* y = x · wᵀ (see k_gemm.c). In deterministic mode always on whole tiles of
 * BE_CUDA_DET_ROWS rows: the buffers have room for the padding rows. */
static void step_gemm(struct step *s, float *y, const uint16_t *x, const uint16_t *w, int64_t n_tok, int64_t n_in,
                      int64_t n_out, bool acc, const char *what)
{
    const int64_t tile = s->c->det ? BE_CUDA_DET_ROWS : n_tok;
    for (int64_t r = 0; r < n_tok && !s->what; r += tile) {
        cublasStatus_t b =
            (acc ? kcu_gemm_bf16_acc : kcu_gemm_bf16)(s->c->blas, y + r * n_out, x + r * n_in, w, tile, n_in, n_out);
        if (b != CUBLAS_STATUS_SUCCESS) {
            s->bs = b;
            s->what = what;
        }
    }
}

static enum kvb_status step_status(const struct step *s, struct kvb_err *err)
{
    if (!s->what) return KVB_OK;
    if (s->bs != CUBLAS_STATUS_SUCCESS) return blas_check(s->bs, err, s->what);
    return cu_check(s->ce, err, s->what);
}

/* Copies the logits rows the host asked for (all but the greedy ones) into
 * `logits`, packed in sequence order: one copy per run of adjacent rows. */
static void download_rows(struct step *s, const struct be_batch *batch, float *logits)
{
    const struct cuda_be *c = s->c;
    const int64_t nv = c->m->hp.n_vocab;
    int64_t dev = 0, host = 0, run_dev = 0, run_n = 0; /* next device row, next host row, pending run */
    for (int32_t i = 0; i <= batch->n_seqs; i++) {
        const struct be_seq *sq = i < batch->n_seqs ? &batch->seqs[i] : NULL;
        const int64_t n = !sq                                                              ? 0
                          : sq->logits == BE_LOGITS_ALL                                    ? sq->n_tokens
                          : sq->logits == BE_LOGITS_LAST || sq->logits == BE_LOGITS_ARGMAX ? 1
                                                                                           : 0;
        const bool down = sq && (sq->logits == BE_LOGITS_ALL || sq->logits == BE_LOGITS_LAST);
        if (down && run_n > 0 && run_dev + run_n == dev) {
            run_n += n;
        } else if (down || !sq) {
            if (run_n > 0)
                step_cu(s,
                        cudaMemcpyAsync(logits + host * nv, c->logits + run_dev * nv, (size_t)(run_n * nv) * 4,
                                        cudaMemcpyDeviceToHost, c->stream),
                        "download logits");
            host += run_n;
            run_dev = dev;
            run_n = n;
        }
        dev += n;
    }
}

/* Where a step's indices live in h_idx / d_idx (int32 entries):
 *   tokens | positions | table offsets | output rows | greedy rows |
 *   greedy choices | hidden rows | attention tiles (room for n_tok) |
 *   block tables
 * With n_groups groups of layers (backend.h's paging) the table offsets
 * are n_groups arrays, one per group (token t's offset into that group's
 * tables), and the block tables n_groups of them, of pages, one after
 * another. Every offset but the end depends only on (n_tok, n_out, n_am,
 * n_hid) and the backend's n_groups, so a captured graph's pointers hold for
 * any later step of the same shape; the block tables, whose length varies
 * from step to step, come last. The whole
 * span is uploaded (the choices' part is overwritten on the device) and
 * the choices come back alone. */
struct step_layout {
    int64_t tok, pos, tab, rows, arows, amax, hrows, tiles, blocks, end;
};

static void layout_of(const struct step_shape *sh, int32_t n_groups, int64_t n_tab, struct step_layout *o)
{
    o->tok = 0;
    o->pos = sh->n_tok;
    o->tab = 2 * sh->n_tok;
    o->rows = (2 + n_groups) * sh->n_tok;
    o->arows = o->rows + sh->n_out;
    o->amax = o->arows + sh->n_am;
    o->hrows = o->amax + sh->n_am;
    o->tiles = o->hrows + sh->n_hid;
    o->blocks = o->tiles + 2 * sh->n_tok;
    o->end = o->blocks + n_groups * n_tab;
}

/* The input of a layer's Q|K|V or gate|up GEMM, bf16 in xb: the residual
 * stream RMSNormed by w, or as it is when the layer has no pre-norm
 * (olmo2). */
static void pre_norm(struct step *s, const float *w, int64_t n_tok, const char *what)
{
    struct cuda_be *c = s->c;
    const struct model_hparams *hp = &c->m->hp;
    if (w)
        step_cu(s,
                kcu_rmsnorm_bf16(c->xb, hp->n_embd, c->x, hp->n_embd, NULL, (int32_t)n_tok, hp->n_embd, w, hp->rms_eps,
                                 c->stream),
                what);
    else step_cu(s, kcu_f32_to_bf16(c->xb, c->x, n_tok * hp->n_embd, c->stream), what);
}

static void join_proj(struct step *s, int64_t n_tok, const float *post, const char *what_post);

/* x += post(xb · wᵀ) * resid_scale, as be_cpu.c's add_residual: the output
 * or down projection joining the residual stream, through the layer's
 * post-norm when it has one (gemma, olmo2) and times model_ops.resid_scale
 * when that is set (granite). Plain llama folds the add into the GEMM. */
static void join_residual(struct step *s, const uint16_t *w, int64_t n_tok, int64_t n_in, const float *post,
                          const char *what, const char *what_post)
{
    struct cuda_be *c = s->c;
    const struct model_hparams *hp = &c->m->hp;
    const int64_t e = hp->n_embd;
    const float rs = c->m->ops.resid_scale;
    if (!post && rs == 0.0f) {
        step_gemm(s, c->x, c->xb, w, n_tok, n_in, e, true, what);
        return;
    }
    step_gemm(s, c->proj, c->xb, w, n_tok, n_in, e, false, what);
    join_proj(s, n_tok, post, what_post);
}

/* x += post(proj) * resid_scale: join_residual's add, for an output
 * already in proj (the experts' sum). */
static void join_proj(struct step *s, int64_t n_tok, const float *post, const char *what_post)
{
    struct cuda_be *c = s->c;
    const struct model_hparams *hp = &c->m->hp;
    const int64_t e = hp->n_embd;
    const float rs = c->m->ops.resid_scale;
    if (!post && rs == 0.0f) {
        step_cu(s, kcu_add(c->x, c->proj, n_tok * e, c->stream), "residual add");
        return;
    }
    if (rs == 0.0f) {
        step_cu(s, kcu_rmsnorm_add(c->x, c->proj, (int32_t)n_tok, (int32_t)e, post, hp->rms_eps, c->stream), what_post);
        return;
    }
    if (post)
        step_cu(s,
                kcu_rmsnorm(c->proj, e, c->proj, e, NULL, (int32_t)n_tok, 1, (int32_t)e, post, hp->rms_eps, c->stream),
                what_post);
    step_cu(s, kcu_scale(c->proj, n_tok * e, rs, c->stream), "residual scale");
    step_cu(s, kcu_add(c->x, c->proj, n_tok * e, c->stream), "residual add");
}

/* Enqueues the step's device work — embedding to output head and greedy
 * choices — for a step of this shape whose indices are in d_idx. Reads
 * nothing from the host: what it enqueues can be captured once and
 * replayed (see struct graph_slot). */
static void enqueue_compute(struct step *s, const struct step_shape *sh)
{
    struct cuda_be *c = s->c;
    const struct model_hparams *hp = &c->m->hp;
    const int64_t e = hp->n_embd, f = hp->n_ff, hd = hp->head_dim;
    const int64_t qd = c->q_dim, kvd = c->kv_dim, qkvd = c->qkv_dim;
    const int64_t n_tok = sh->n_tok, n_out = sh->n_out, n_am = sh->n_am;
    struct step_layout lo;
    layout_of(sh, c->be.n_groups, 0, &lo);
    const int32_t *d_pos = c->d_idx + lo.pos, *d_tab = c->d_idx + lo.tab, *d_rows = c->d_idx + lo.rows;
    struct kcu_paged pg = {
        .pool = c->kv,
        .block_bytes = c->be.page_bytes,
        .kv_type = (int32_t)c->kv_type,
        .block_size = c->be.block_size,
        .kv_dim = (int32_t)kvd,
        .layer = 0,
        .n_tok = (int32_t)n_tok,
        .tok_pos = d_pos,
        .tok_table = d_tab,
        .blocks = c->d_idx + lo.blocks,
    };
    const int32_t nt = (int32_t)n_tok, ne = (int32_t)e, nh = hp->n_head, nkv = hp->n_head_kv, h = (int32_t)hd;
    const int neox = hp->rope == ROPE_NEOX;
    const struct model_ops *mo = &c->m->ops;
    const float eps = hp->rms_eps, scale = mo->attn_scale;
    pg.softcap = mo->attn_softcap;
    cudaStream_t cs = c->stream;

    /* Ten launches per layer for the llama layer: norms, SwiGLU and
     * attention write the next GEMM's bf16 input themselves, the residual
     * adds ride in the output and down projections (beta = 1), and Q and K
     * (adjacent in each fused row) are rotated by one RoPE launch. A
     * post-norm or a residual scale takes the add out of the GEMM
     * (join_residual). */
    step_cu(s, kcu_embed(c->x, c->tok_embd, c->d_idx + lo.tok, nt, ne, cs), "embedding");
    if (mo->embd_scale != 1.0f) step_cu(s, kcu_scale(c->x, n_tok * e, mo->embd_scale, cs), "embedding scale");
    for (int l = 0; l < hp->n_layer && !s->what; l++) {
        const struct cu_layer *L = &c->layers[l];
        const bool swa = c->m->layers[l].swa;
        const bool own_rope = swa && !mo->swa_same_rope; /* the windowed layers' own frequencies (not phi3) */
        float *q = c->qkv, *k = c->qkv + qd, *v = c->qkv + qd + kvd; /* rows of qkvd floats */
        pre_norm(s, L->attn_norm, n_tok, "attention norm");
        step_gemm(s, c->qkv, c->xb, L->wqkv, n_tok, e, qkvd, false, "QKV projection");
        if (L->bqkv) step_cu(s, kcu_add_bias(c->qkv, qkvd, L->bqkv, nt, (int32_t)qkvd, cs), "QKV bias");
        if (L->q_norm && mo->qk_norm_whole) { /* olmo2: over all of Q, all of K */
            step_cu(s, kcu_rmsnorm(q, qkvd, q, qkvd, NULL, nt, 1, (int32_t)qd, L->q_norm, eps, cs), "Q norm");
            step_cu(s, kcu_rmsnorm(k, qkvd, k, qkvd, NULL, nt, 1, (int32_t)kvd, L->k_norm, eps, cs), "K norm");
        } else if (L->q_norm) {
            step_cu(s, kcu_rmsnorm(q, qkvd, q, qkvd, NULL, nt, nh, h, L->q_norm, eps, cs), "Q norm");
            step_cu(s, kcu_rmsnorm(k, qkvd, k, qkvd, NULL, nt, nkv, h, L->k_norm, eps, cs), "K norm");
        }
        step_cu(s,
                kcu_rope(q, qkvd, nt, nh + nkv, h, hp->rope_dim, neox, d_pos, own_rope ? c->inv_freq_swa : c->inv_freq,
                         own_rope ? 1.0f : c->m->rope.mscale, cs),
                "RoPE");
        /* All of the step's K/V go in before attention reads any, so the
         * tokens of one prefill chunk see each other causally. */
        pg.layer = c->lindex[l];
        pg.tok_table = d_tab + (int64_t)c->lgroup[l] * n_tok;
        pg.window = swa ? mo->n_swa : 0;
        step_cu(s, kcu_kv_store(&pg, k, v, qkvd, cs), "KV store");
        if (sh->n_tiles > 0)
            step_cu(
                s,
                kcu_attn_tc_bf16(c->xb, q, qkvd, &pg, c->d_idx + lo.tiles, (int32_t)sh->n_tiles, nh, nkv, h, scale, cs),
                "attention");
        else step_cu(s, kcu_attn_bf16(c->xb, q, qkvd, &pg, nh, nkv, h, scale, cs), "attention");
        join_residual(s, L->wo, n_tok, qd, L->post_attn_norm, "output projection", "post-attention norm");

        if (c->m->layers[l].moe) { /* the experts (be_cuda_moe.c), then the same residual join */
            struct cu_moe_run mr = {cs, c->blas, c->det, cudaSuccess, CUBLAS_STATUS_SUCCESS, NULL};
            cu_moe_ffn(c->moe, &mr, l, c->x, L->ffn_norm, n_tok, c->proj);
            if (mr.what && !s->what) {
                s->ce = mr.ce;
                s->bs = mr.bs;
                s->what = mr.what;
            }
            join_proj(s, n_tok, L->post_ffn_norm, "post-FFN norm");
            continue;
        }
        pre_norm(s, L->ffn_norm, n_tok, "FFN norm");
        step_gemm(s, c->gu, c->xb, L->wgu, n_tok, e, 2 * f, false, "gate/up projection");
        if (mo->act == MODEL_ACT_GELU_TANH) step_cu(s, kcu_geglu_bf16(c->xb, c->gu, nt, (int32_t)f, cs), "GeGLU");
        else step_cu(s, kcu_swiglu_bf16(c->xb, c->gu, nt, (int32_t)f, cs), "SwiGLU");
        join_residual(s, L->wdown, n_tok, f, L->post_ffn_norm, "down projection", "post-FFN norm");
    }
    if (n_out > 0 && !s->what) {
        step_cu(s, kcu_rmsnorm_bf16(c->xb, e, c->x, e, d_rows, (int32_t)n_out, ne, c->output_norm, eps, cs),
                "output norm");
        step_gemm(s, c->logits, c->xb, c->output, n_out, e, hp->n_vocab, false, "output head");
        /* granite's logits_scaling: times the reciprocal, which differs from
         * be_cpu.c's division by at most an ulp, far below the bf16 rounding
         * of the head's weights and input. */
        if (mo->logit_div != 0.0f)
            step_cu(s, kcu_scale(c->logits, n_out * hp->n_vocab, 1.0f / mo->logit_div, cs), "logit scale");
        if (mo->final_softcap > 0)
            step_cu(s, kcu_softcap(c->logits, hp->n_vocab, (int32_t)n_out, hp->n_vocab, mo->final_softcap, cs),
                    "final soft-cap");
        if (n_am > 0)
            step_cu(s,
                    kcu_argmax(c->d_idx + lo.amax, c->logits, hp->n_vocab, c->d_idx + lo.arows, (int32_t)n_am,
                               hp->n_vocab, cs),
                    "greedy choice");
    }
    /* Hidden-state rows (pooling): the final norm in f32, into `hidden`
     * in sequence order, no head. */
    if (sh->n_hid > 0 && !s->what)
        step_cu(
            s,
            kcu_rmsnorm(c->hidden, e, c->x, e, c->d_idx + lo.hrows, (int32_t)sh->n_hid, 1, ne, c->output_norm, eps, cs),
            "output norm (hidden states)");
}

/* ---- CUDA graphs ------------------------------------------------------------------------- */

static void graphs_clear(struct cuda_be *c)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (c->gslots[i].exec) cudaGraphExecDestroy(c->gslots[i].exec);
        memset(&c->gslots[i], 0, sizeof c->gslots[i]);
    }
}

static struct graph_slot *graph_slot_of(struct cuda_be *c, const struct step_shape *sh)
{
    struct graph_slot *lru = &c->gslots[0];
    c->graph_clock++;
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        struct graph_slot *g = &c->gslots[i];
        if (g->seen && !memcmp(&g->sh, sh, sizeof *sh)) {
            g->last_use = c->graph_clock;
            return g;
        }
        if (g->last_use < lru->last_use) lru = g;
    }
    if (lru->exec) cudaGraphExecDestroy(lru->exec);
    *lru = (struct graph_slot){.sh = *sh, .last_use = c->graph_clock};
    return lru;
}

/* Captures the compute of a step of g's shape into g->exec. false (graphs
 * now off) when CUDA or cuBLAS would not have it. */
static bool graph_capture(struct cuda_be *c, struct graph_slot *g)
{
    cudaGraph_t graph = NULL;
    struct step cap = {c, cudaSuccess, CUBLAS_STATUS_SUCCESS, NULL};
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        enqueue_compute(&cap, &g->sh);
        e = cudaStreamEndCapture(c->stream, &graph);
    }
    if (e == cudaSuccess && !cap.what) e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e == cudaSuccess && !cap.what && g->exec) return true;
    snprintf(c->graph_off, sizeof c->graph_off, "capture failed: %s", cap.what ? cap.what : cudaGetErrorString(e));
    cudaGetLastError(); /* the failure is handled: the step runs without */
    g->exec = NULL;
    c->graphs = false;
    graphs_clear(c);
    return false;
}

static enum kvb_status cuda_forward(struct backend *be, const struct be_batch *batch, float *logits,
                                    struct kvb_err *err)
{
    struct cuda_be *c = (struct cuda_be *)be;
    const struct model_hparams *hp = &c->m->hp;
    struct be_batch_shape sh;
    KVB_FORWARD_IF_ERROR(be_batch_check(be, hp->n_vocab, batch, &sh, err));
    if (c->enc) {
        KVB_FORWARD_IF_ERROR(cu_check(cudaSetDevice(c->device), err, "select device"));
        return cuda_enc_forward(c->enc, batch, err);
    }
    const int64_t n_tok = sh.n_tok, n_am = sh.n_argmax, n_out = sh.n_out + n_am, n_tab = sh.n_tab;
    if (n_tok == 0) return KVB_OK;
    if (n_tok > 0x7fffffff / hp->n_head)
        return kvb_errf(err, KVB_ERR_RANGE, "a step of %lld tokens is too large", (long long)n_tok);
    KVB_FORWARD_IF_ERROR(cu_check(cudaSetDevice(c->device), err, "select device"));
    struct step_shape ss = {n_tok, n_out, n_am, 0, sh.n_hidden};
    struct step_layout lo;
    const int32_t G = be->n_groups;
    layout_of(&ss, G, n_tab, &lo);
    KVB_FORWARD_IF_ERROR(ensure_step(c, n_tok, n_out, lo.end, err));

    /* Step indices. Output rows are every row the head computes, greedy
     * ones included; `arows` says which of them are greedy. */
    int32_t *tok = c->h_idx + lo.tok, *pos = c->h_idx + lo.pos, *tab = c->h_idx + lo.tab;
    int32_t *rows = c->h_idx + lo.rows, *arows = c->h_idx + lo.arows, *blocks = c->h_idx + lo.blocks;
    int32_t *tiles = c->h_idx + lo.tiles, *hrows = c->h_idx + lo.hrows;
    const int32_t *h_amax = c->h_idx + lo.amax;
    int64_t t = 0, r = 0, nb = 0, na = 0, nh = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *sq = &batch->seqs[i];
        /* Tensor-core attention tiles: runs of the sequence's tokens. */
        for (int32_t j = 0; c->attn_tile > 0 && j < sq->n_tokens; j += c->attn_tile) {
            tiles[2 * ss.n_tiles] = (int32_t)t + j;
            tiles[2 * ss.n_tiles + 1] = sq->n_tokens - j < c->attn_tile ? sq->n_tokens - j : c->attn_tile;
            ss.n_tiles++;
        }
        for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
            tok[t] = sq->tokens[j];
            pos[t] = sq->pos + j;
            for (int32_t g = 0; g < G; g++) tab[g * n_tok + t] = (int32_t)(g * n_tab + nb);
            const bool last = j == sq->n_tokens - 1;
            if (sq->logits == BE_LOGITS_ARGMAX && last) arows[na++] = (int32_t)r;
            if (sq->logits == BE_LOGITS_ALL ||
                ((sq->logits == BE_LOGITS_LAST || sq->logits == BE_LOGITS_ARGMAX) && last))
                rows[r++] = (int32_t)t;
            if (sq->logits == BE_HIDDEN_ALL || (sq->logits == BE_HIDDEN_LAST && last)) hrows[nh++] = (int32_t)t;
        }
        if (!c->map) memcpy(blocks + nb, sq->block_table, sizeof(int32_t) * (size_t)sq->n_blocks);
        for (int32_t g = 0; c->map && g < G; g++) /* the pages of each group */
            for (int32_t b = 0; b < sq->n_blocks; b++)
                blocks[g * n_tab + nb + b] = c->map[(int64_t)sq->block_table[b] * G + g];
        nb += sq->n_blocks;
    }
    /* Too few tiles to fill the GPU (a few decode tokens): the tensor-core
     * kernel would run one busy warp per block on a handful of
     * multiprocessors, where kcu_attn spreads every head's positions over
     * eight warps. Not in deterministic mode, where a token must always go
     * through the same kernel. */
    if (!c->det && ss.n_tiles * hp->n_head_kv < c->n_sm) ss.n_tiles = 0;
    cudaStream_t cs = c->stream;
    struct step s = {c, cudaSuccess, CUBLAS_STATUS_SUCCESS, NULL};

    /* Restored blocks this pass may read: the device waits, not the host. */
    if (c->h2d_queued) {
        step_cu(&s, cudaStreamWaitEvent(cs, c->h2d_done, 0), "wait for restored blocks");
        c->h2d_queued = false;
    }
    step_cu(&s, cudaMemcpyAsync(c->d_idx, c->h_idx, (size_t)lo.end * 4, cudaMemcpyHostToDevice, cs), "upload indices");
    bool done = false;
    if (c->graphs && n_tok <= GRAPH_MAX_TOK && !s.what) {
        struct graph_slot *g = graph_slot_of(c, &ss);
        /* The first step of a shape runs as usual (it also warms cuBLAS's
         * choice of kernels up); the second is captured. */
        if (!g->exec && ++g->seen >= 2) graph_capture(c, g);
        if (g->exec) {
            step_cu(&s, cudaGraphLaunch(g->exec, cs), "graph launch");
            c->graph_launches++;
            done = true;
        }
    }
    if (!done) enqueue_compute(&s, &ss);
    if (n_am > 0 && !s.what)
        step_cu(&s, cudaMemcpyAsync((void *)h_amax, c->d_idx + lo.amax, (size_t)n_am * 4, cudaMemcpyDeviceToHost, cs),
                "download greedy choices");
    if (n_out > 0 && !s.what) download_rows(&s, batch, logits);
    if (nh > 0 && !s.what)
        step_cu(&s,
                cudaMemcpyAsync(batch->hidden, c->hidden, (size_t)(nh * hp->n_embd) * 4, cudaMemcpyDeviceToHost, cs),
                "download hidden states");
    /* Always synchronise, failed or not: the pinned index buffer may only be
     * refilled once this step's copy of it is done. */
    step_cu(&s, cudaStreamSynchronize(cs), "step");
    if (!s.what && n_am > 0) {
        na = 0;
        for (int32_t i = 0; i < batch->n_seqs; i++)
            if (batch->seqs[i].logits == BE_LOGITS_ARGMAX) batch->argmax[i] = h_amax[na++];
    }
    return step_status(&s, err);
}

/* Page of group g of block b. */
static int32_t page_of(const struct cuda_be *c, int32_t b, int32_t g)
{
    return c->map ? c->map[(int64_t)b * c->be.n_groups + g] : b;
}

/* A block's pages, in group order, between the pool and host memory on
 * `stream`; KVB_ERR_INVALID_ARG for a block without all its pages. */
static enum kvb_status block_pages_copy(struct cuda_be *c, int32_t block, void *host, bool to_device,
                                        cudaStream_t stream)
{
    const struct backend *be = &c->be;
    if (block < 0 || block >= be->n_logical || !c->kv) return KVB_ERR_INVALID_ARG; /* an encoder has no pool */
    for (int32_t g = 0; g < be->n_groups; g++)
        if (page_of(c, block, g) < 0) return KVB_ERR_INVALID_ARG;
    cudaError_t e = cudaSuccess;
    for (int32_t g = 0; g < be->n_groups && e == cudaSuccess; g++) {
        uint8_t *dev = c->kv + (int64_t)page_of(c, block, g) * be->page_bytes;
        uint8_t *h = (uint8_t *)host + (int64_t)g * be->page_bytes;
        e = to_device ? cudaMemcpyAsync(dev, h, (size_t)be->page_bytes, cudaMemcpyHostToDevice, stream)
                      : cudaMemcpyAsync(h, dev, (size_t)be->page_bytes, cudaMemcpyDeviceToHost, stream);
    }
    return cu_status(e);
}

static enum kvb_status cuda_block_copy(struct backend *be, int32_t block, void *host, bool to_device)
{
    struct cuda_be *c = (struct cuda_be *)be;
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cu_status(e);
    KVB_FORWARD_IF_ERROR(block_pages_copy(c, block, host, to_device, c->stream));
    return cu_status(cudaStreamSynchronize(c->stream));
}

static void cuda_kv_map(struct backend *be, int32_t block, const int32_t *pages)
{
    struct cuda_be *c = (struct cuda_be *)be;
    if (!c->map || block < 0 || block >= be->n_logical) return;
    memcpy(c->map + (int64_t)block * be->n_groups, pages, sizeof(int32_t) * (size_t)be->n_groups);
}

static void cuda_host_parallel(struct backend *be, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    tpool_run(((struct cuda_be *)be)->pool, fn, arg);
}

static void cuda_summary(struct backend *be, char *buf, size_t cap)
{
    const struct cuda_be *c = be->impl;
    if (c->graph_off[0])
        snprintf(buf, cap, "CUDA graphs switched off (%s); %lld steps had run from graphs", c->graph_off,
                 (long long)c->graph_launches);
    else if (c->graphs) snprintf(buf, cap, "%lld steps ran from CUDA graphs", (long long)c->graph_launches);
}

static void *cuda_host_alloc(struct backend *be, size_t bytes)
{
    void *p = NULL;
    if (cudaSetDevice(((struct cuda_be *)be)->device) != cudaSuccess ||
        cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller goes on without staging */
        return NULL;
    }
    return p;
}

static void cuda_host_free(struct backend *be, void *p)
{
    (void)be;
    if (p) cudaFreeHost(p);
}

static enum kvb_status cuda_read_async(struct backend *be, int32_t block, void *dst)
{
    struct cuda_be *c = (struct cuda_be *)be;
    /* Ordered after every pass so far (each has returned, but saying so
     * costs nothing and keeps this right should passes ever overlap). */
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaEventRecord(c->step_done, c->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->d2h, c->step_done, 0);
    if (e != cudaSuccess) return cu_status(e);
    return block_pages_copy(c, block, dst, false, c->d2h);
}

static enum kvb_status cuda_write_async(struct backend *be, int32_t block, const void *src)
{
    struct cuda_be *c = (struct cuda_be *)be;
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cu_status(e);
    KVB_FORWARD_IF_ERROR(block_pages_copy(c, block, (void *)src, true, c->h2d));
    e = cudaEventRecord(c->h2d_done, c->h2d);
    if (e == cudaSuccess) c->h2d_queued = true;
    return cu_status(e);
}

static enum kvb_status cuda_copies_wait(struct backend *be, struct kvb_err *err)
{
    struct cuda_be *c = (struct cuda_be *)be;
    KVB_FORWARD_IF_ERROR(cu_check(cudaSetDevice(c->device), err, "select device"));
    /* Both streams, whatever the first says: the caller reuses the host
     * buffers of either once this returns. The first failure is reported. */
    enum kvb_status st = cu_check(cudaStreamSynchronize(c->h2d), err, "restore copies");
    struct kvb_err e2 = {{0}};
    enum kvb_status st2 = cu_check(cudaStreamSynchronize(c->d2h), &e2, "spill copies");
    if (st == KVB_OK && st2 != KVB_OK) st = kvb_errf(err, st2, "%s", e2.msg);
    return st;
}

static enum kvb_status cuda_block_read(struct backend *be, int32_t block, void *dst)
{
    return cuda_block_copy(be, block, dst, false);
}

static enum kvb_status cuda_block_write(struct backend *be, int32_t block, const void *src)
{
    return cuda_block_copy(be, block, (void *)src, true);
}

/* ---- creation ---------------------------------------------------------------------------- */

/* A MoE step reads its experts' row counts back on the host mid-step
 * (be_cuda_moe.h), which a captured graph cannot: such models run without
 * graphs, and the summary says why. */
static bool moe_off_graphs(struct cuda_be *c, const struct model *m)
{
    if (m->ops.moe.n_expert <= 0) return false;
    snprintf(c->graph_off, sizeof c->graph_off,
             "a mixture-of-experts step sizes its experts' GEMMs from routing read back on the host");
    return true;
}

static void name_kernels(struct cuda_be *c)
{
    /* The KV type only when quantized: the f16 name stays what it was. */
    char kv[16] = "";
    if (c->kv_type != KV_F16) snprintf(kv, sizeof kv, ", KV %s", kv_type_name(c->kv_type));
    snprintf(c->kernels_name, sizeof c->kernels_name, "cuda bf16 cuBLAS, %s attention%s%s%s",
             c->attn_tile ? "tensor-core" : "f32", c->det ? ", deterministic tiles" : "", c->graphs ? ", graphs" : "",
             kv);
    c->be.kernels = c->kernels_name;
}

enum kvb_status be_cuda_create(const struct model *m, const struct be_cuda_opts *o, struct backend **out,
                               struct kvb_err *err)
{
    *out = NULL;
    if (o->block_size <= 0 || o->n_blocks <= 0)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "block size %d and block count %d must be positive", o->block_size,
                        o->n_blocks);
    /* Refused before the device is looked at: what the model needs does not
     * depend on the machine, and the message should say so everywhere. */
    char why[256];
    if (!be_cuda_available(o->device, why, sizeof why))
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "no CUDA device: %s", why);
    const struct model_hparams *hp = &m->hp;
    if (hp->head_dim > KCU_ATTN_MAX_HEAD_DIM || hp->n_head % hp->n_head_kv)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "CUDA backend: head_dim %d / %d heads over %d KV heads not supported "
                        "(head_dim <= %d, whole groups)",
                        hp->head_dim, hp->n_head, hp->n_head_kv, KCU_ATTN_MAX_HEAD_DIM);
    KVB_FORWARD_IF_ERROR(kv_type_check(o->kv_type, hp->head_dim, err));

    struct cuda_be *c = kvb_calloc(1, sizeof *c);
    if (!c) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    c->m = m;
    c->device = o->device;
    c->det = o->deterministic;
    c->graphs = o->graphs && !moe_off_graphs(c, m);
    c->kv_type = o->kv_type;
    c->be.name = "cuda";
    c->be.arith = "cuda"; /* not the CPU's bits: its KV blocks and results are kept apart in the store */
    /* The tensor-core kernel computes neither windows nor soft-caps. */
    const bool plain_attn = m->ops.n_swa == 0 && !(m->ops.attn_softcap > 0);
    c->attn_tile = o->attn_warp || !plain_attn || m->ops.encoder
                       ? 0
                       : kcu_attn_tc_tile_tokens(hp->n_head, hp->n_head_kv, hp->head_dim);
    name_kernels(c);
    c->be.impl = c;
    c->be.forward = cuda_forward;
    c->be.kv_block_read = cuda_block_read;
    c->be.kv_block_write = cuda_block_write;
    c->be.kv_read_async = cuda_read_async;
    c->be.kv_write_async = cuda_write_async;
    c->be.kv_copies_wait = cuda_copies_wait;
    c->be.free = cuda_free;
    c->be.host_parallel = cuda_host_parallel;
    c->be.host_alloc = cuda_host_alloc;
    c->be.summary = cuda_summary;
    c->be.host_free = cuda_host_free;
    c->be.argmax = true;
    c->be.block_size = o->block_size;
    c->be.n_blocks = o->n_blocks;
    c->be.block_bytes = be_block_bytes(m, o->block_size, o->kv_type); /* same pool layout as the CPU */
    be_paging_init(&c->be, m, o->n_blocks, o->kv_type);
    c->be.kv_map = cuda_kv_map;
    {
        struct be_kv_layout klo;
        be_kv_layout(m, o->block_size, o->kv_type, &klo);
        c->lgroup = kvb_malloc(sizeof(int32_t) * (size_t)hp->n_layer);
        c->lindex = kvb_malloc(sizeof(int32_t) * (size_t)hp->n_layer);
        if (klo.n_groups > 1) c->map = kvb_malloc(sizeof(int32_t) * (size_t)c->be.n_logical * (size_t)klo.n_groups);
        if (!c->lgroup || !c->lindex || (klo.n_groups > 1 && !c->map)) {
            kvb_free(c->lgroup);
            kvb_free(c->lindex);
            kvb_free(c->map);
            kvb_free(c);
            return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
        }
        for (int32_t l = 0; l < hp->n_layer; l++) be_layer_group(m, &klo, l, &c->lgroup[l], &c->lindex[l]);
        for (int64_t i = 0; c->map && i < (int64_t)c->be.n_logical * klo.n_groups; i++)
            c->map[i] = i < (int64_t)c->be.n_pages ? (int32_t)i : -1;
    }
    c->be.kv_type = o->kv_type;
    c->q_dim = (int64_t)hp->n_head * hp->head_dim;
    c->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    c->qkv_dim = c->q_dim + 2 * c->kv_dim;

    enum kvb_status st = tpool_create(o->n_threads, &c->pool);
    if (st != KVB_OK) {
        kvb_free(c);
        return kvb_errf(err, st, "cannot start %d host threads", o->n_threads);
    }
    c->be.n_threads = tpool_size(c->pool);
    st = cu_check(cudaSetDevice(o->device), err, "select device");
    struct cudaDeviceProp prop;
    if (st == KVB_OK) st = cu_check(cudaGetDeviceProperties(&prop, o->device), err, "device properties");
    if (st == KVB_OK) c->n_sm = prop.multiProcessorCount;
    if (st == KVB_OK) st = cu_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), err, "create stream");
    if (st == KVB_OK) st = cu_check(cudaStreamCreateWithFlags(&c->d2h, cudaStreamNonBlocking), err, "create stream");
    if (st == KVB_OK) st = cu_check(cudaStreamCreateWithFlags(&c->h2d, cudaStreamNonBlocking), err, "create stream");
    if (st == KVB_OK)
        st = cu_check(cudaEventCreateWithFlags(&c->h2d_done, cudaEventDisableTiming), err, "create event");
    if (st == KVB_OK)
        st = cu_check(cudaEventCreateWithFlags(&c->step_done, cudaEventDisableTiming), err, "create event");
    if (st == KVB_OK) st = blas_check(cublasCreate(&c->blas), err, "create handle");
    if (st == KVB_OK) st = blas_check(cublasSetStream(c->blas, c->stream), err, "set stream");
    /* After cublasSetStream, which resets the workspace to cuBLAS's pool:
     * an explicit one stays the same for captured GEMMs (32 MiB, what cuBLAS
     * itself takes on Hopper). */
    if (st == KVB_OK) st = dev_alloc(&c->blas_ws, BLAS_WORKSPACE, "cuBLAS workspace", err);
    if (st == KVB_OK) st = blas_check(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE), err, "set workspace");
    const int64_t w_bytes = be_cuda_weight_bytes(m);
    const int64_t kv_bytes = c->be.block_bytes * o->n_blocks;
    if (st == KVB_OK) {
        const int64_t free_b = be_cuda_free_memory(o->device);
        if (free_b >= 0 && w_bytes > free_b)
            st = kvb_errf(err, KVB_ERR_NOMEM,
                          "CUDA: the weights need %.1f MiB of device memory as bf16, device %d has "
                          "%.1f MiB free: use a smaller model or another GPU",
                          mib(w_bytes), o->device, mib(free_b));
    }
    /* Host staging for the upload: 64 MiB of pinned bf16 rows. */
    struct uploader u = {NULL, 0, NULL};
    if (st == KVB_OK) {
        int64_t max_in = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
        if (c->q_dim > max_in) max_in = c->q_dim;
        if (m->ops.moe.n_ff_exp > max_in) max_in = m->ops.moe.n_ff_exp; /* the experts' down rows */
        if (m->ops.moe.n_ff_shexp > max_in) max_in = m->ops.moe.n_ff_shexp;
        u.cap = (int64_t)32 << 20;
        if (u.cap < max_in) u.cap = max_in;
        u.row = kvb_malloc(sizeof(float) * (size_t)max_in);
        st = u.row ? cu_check(cudaHostAlloc((void **)&u.stage, (size_t)u.cap * 2, cudaHostAllocDefault), err,
                              "pinned upload buffer")
                   : kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    if (st == KVB_OK && m->ops.encoder) st = cuda_enc_create(m, c->blas, c->stream, c->det, &u, &c->enc, err);
    else if (st == KVB_OK) st = upload_weights(c, &u, err);
    if (u.stage) cudaFreeHost(u.stage);
    kvb_free(u.row);
    if (st == KVB_OK && !c->enc) {
        cudaError_t e = cudaMalloc((void **)&c->kv, (size_t)kv_bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            c->kv = NULL;
            const int64_t free_b = be_cuda_free_memory(o->device);
            st = kvb_errf(err, KVB_ERR_NOMEM,
                          "CUDA: the KV pool of %d blocks needs %.1f MiB of device memory, %.1f MiB "
                          "are free after %.1f MiB of weights: lower --kv-mem",
                          o->n_blocks, mib(kv_bytes), mib(free_b), mib(w_bytes));
        } else {
            st = cu_check(e, err, "KV pool");
        }
    }
    if (st == KVB_OK && !c->enc) st = cu_check(cudaMemsetAsync(c->kv, 0, (size_t)kv_bytes, c->stream), err, "KV pool");
    if (st == KVB_OK) st = cu_check(cudaDeviceSynchronize(), err, "upload");
    if (st != KVB_OK) {
        cuda_free(&c->be);
        return st;
    }
    *out = &c->be;
    return KVB_OK;
}

int64_t be_cuda_graph_launches(const struct backend *be, const char **why_off)
{
    const struct cuda_be *c = be->impl;
    if (why_off) *why_off = c->graph_off[0] ? c->graph_off : NULL;
    return c->graph_launches;
}

void be_cuda_set_graphs(struct backend *be, bool on)
{
    struct cuda_be *c = be->impl;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    graphs_clear(c);
    c->graph_off[0] = '\0';
    c->graphs = on && !moe_off_graphs(c, c->m);
    name_kernels(c);
    c->graph_launches = 0;
}
