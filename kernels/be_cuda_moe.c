/* be_cuda_moe.c — the CUDA backend's mixture-of-experts FFN (see
 * be_cuda_moe.h). Host C: device memory, cuBLAS and the k_moe kernels
 * through kernels.h. */
#include "kernels/be_cuda_moe.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/be_cuda.h"
#include "kernels/kernels.h"
#include "model/quant.h"

/* One MoE layer's weights on the device. */
struct cu_moe_layer {
    float *router;     /* (n_expert + has_shared, n_embd) f32: ffn_gate_inp rows, then ffn_gate_inp_shexp */
    uint16_t *wgu;     /* (n_expert, 2 * n_ff_exp, n_embd) bf16: expert x's gate rows, then its up rows */
    uint16_t *wdown;   /* (n_expert * n_embd, n_ff_exp) bf16: expert x's rows from x * n_embd */
    uint16_t *sh_gu;   /* (2 * n_ff_shexp, n_embd) the shared expert's gate rows, then up; or NULL */
    uint16_t *sh_down; /* (n_embd, n_ff_shexp), or NULL */
};

struct cu_moe {
    const struct model *m;
    struct cu_moe_layer *layers; /* (n_layer); all NULL for a dense layer */
    int32_t n_router;            /* router rows: n_expert, + 1 with a shared expert */
    int64_t wide;                /* max(n_ff_exp, n_ff_shexp) */

    /* Scratch for cap_tok tokens; "rows" are the routed rows (cap_tok * k),
     * plus one deterministic tile of room past the last. */
    int64_t cap_tok, cap_rows;
    float *xn;           /* (cap_tok, n_embd) the FFN input, f32 (the router's) */
    uint16_t *xb;        /* (cap_tok, n_embd) the same in bf16 (the experts') */
    float *logits;       /* (cap_tok, n_router) */
    int32_t *sel, *slot; /* (cap_tok * k) each choice's expert, its routed row */
    float *wts;          /* (cap_tok * k) */
    int32_t *start;      /* (n_expert + 1) device */
    int32_t *h_start;    /* (n_expert + 1) pinned host: the counts, read back */
    int32_t *row_tok;    /* (cap_rows) */
    uint16_t *xg;        /* (cap_rows, n_embd) gathered inputs */
    float *gu;           /* (cap_rows, 2 * wide) gate|up outputs */
    uint16_t *hb;        /* (cap_rows, wide) activations, bf16 */
    float *yd;           /* (cap_rows, n_embd) the experts' outputs */
    float *ys;           /* (cap_tok, n_embd) the shared expert's, or NULL */
};

int64_t cu_moe_weight_bytes(const struct model *m, int layer)
{
    const struct model_moe *mo = &m->ops.moe;
    if (mo->n_expert <= 0 || !m->layers[layer].moe) return 0;
    const int64_t e = m->hp.n_embd, ne = mo->n_expert, fe = mo->n_ff_exp, fs = mo->n_ff_shexp;
    return 2 * ne * 3 * fe * e + 4 * (ne + (fs > 0)) * e + 2 * 3 * fs * e;
}

static void free_scratch(struct cu_moe *mo)
{
    void *bufs[] = {mo->xn,      mo->xb, mo->logits, mo->sel, mo->slot, mo->wts, mo->start,
                    mo->row_tok, mo->xg, mo->gu,     mo->hb,  mo->yd,   mo->ys};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    if (mo->h_start) cudaFreeHost(mo->h_start);
    mo->xn = mo->logits = mo->wts = mo->gu = mo->yd = mo->ys = NULL;
    mo->xb = mo->xg = mo->hb = NULL;
    mo->sel = mo->slot = mo->start = mo->h_start = mo->row_tok = NULL;
    mo->cap_tok = mo->cap_rows = 0;
}

void cu_moe_free(struct cu_moe *mo)
{
    if (!mo) return;
    free_scratch(mo);
    if (mo->layers)
        for (int l = 0; l < mo->m->hp.n_layer; l++) {
            struct cu_moe_layer *L = &mo->layers[l];
            void *bufs[] = {L->router, L->wgu, L->wdown, L->sh_gu, L->sh_down};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
        }
    kvb_free(mo->layers);
    kvb_free(mo);
}

static enum kvb_status cu_fail(cudaError_t e, const char *what, struct kvb_err *err)
{
    if (e == cudaSuccess) return KVB_OK;
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky */
        return kvb_errf(err, KVB_ERR_NOMEM, "CUDA: out of device memory for %s", what);
    }
    return kvb_errf(err, KVB_ERR_IO, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

static enum kvb_status alloc_dev(void *pp, int64_t bytes, const char *what, struct kvb_err *err)
{
    void **p = pp;
    cudaError_t e = cudaMalloc(p, (size_t)(bytes > 0 ? bytes : 1));
    if (e != cudaSuccess) *p = NULL;
    return cu_fail(e, what, err);
}

/* Rows [r0, r0 + n) of w, as their own matrix. */
static struct mm_weight rows_of(const struct mm_weight *w, int64_t r0, int64_t n)
{
    struct mm_weight v = *w;
    v.n_out = n;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    return v;
}

static enum kvb_status check_shape(const struct mm_weight *w, int64_t n_out, int64_t n_in, const char *what, int l,
                                   struct kvb_err *err)
{
    if (w->data && w->n_out == n_out && w->n_in == n_in) return KVB_OK;
    return kvb_errf(err, KVB_ERR_FORMAT, "layer %d: %s is %lld x %lld, expected %lld x %lld", l, what,
                    (long long)w->n_out, (long long)w->n_in, (long long)n_out, (long long)n_in);
}

/* rows (n, e) of src stacked into dst (f32), dequantized on the host. */
static enum kvb_status put_f32_rows(float *dst, const struct mm_weight *w, float *row, struct kvb_err *err)
{
    for (int64_t r = 0; r < w->n_out; r++) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        enum kvb_status st = quant_dequant_row(w->type, src, row, w->n_in);
        if (st != KVB_OK) return kvb_errf(err, st, "router: cannot dequantize type %u", (unsigned)w->type);
        KVB_FORWARD_IF_ERROR(
            cu_fail(cudaMemcpy(dst + r * w->n_in, row, (size_t)w->n_in * 4, cudaMemcpyHostToDevice), "router", err));
    }
    return KVB_OK;
}

static enum kvb_status upload_layer(struct cu_moe *mo, int l, cu_moe_put_fn put, void *ctx, float *row,
                                    struct kvb_err *err)
{
    const struct model *m = mo->m;
    const struct model_layer *L = &m->layers[l];
    const struct model_moe *mm = &m->ops.moe;
    struct cu_moe_layer *D = &mo->layers[l];
    const int64_t e = m->hp.n_embd, ne = mm->n_expert, fe = mm->n_ff_exp, fs = mm->n_ff_shexp;
    char name[64];
    snprintf(name, sizeof name, "layer %d experts", l);
    KVB_FORWARD_IF_ERROR(check_shape(&L->w_router, ne, e, "ffn_gate_inp", l, err));
    KVB_FORWARD_IF_ERROR(check_shape(&L->w_gate_exps, ne * fe, e, "ffn_gate_exps", l, err));
    KVB_FORWARD_IF_ERROR(check_shape(&L->w_up_exps, ne * fe, e, "ffn_up_exps", l, err));
    KVB_FORWARD_IF_ERROR(check_shape(&L->w_down_exps, ne * e, fe, "ffn_down_exps", l, err));
    KVB_FORWARD_IF_ERROR(alloc_dev(&D->router, (int64_t)mo->n_router * e * 4, name, err));
    KVB_FORWARD_IF_ERROR(put_f32_rows(D->router, &L->w_router, row, err));
    KVB_FORWARD_IF_ERROR(alloc_dev(&D->wgu, ne * 2 * fe * e * 2, name, err));
    KVB_FORWARD_IF_ERROR(alloc_dev(&D->wdown, ne * e * fe * 2, name, err));
    for (int64_t x = 0; x < ne; x++) { /* one expert slice at a time: [gate_x; up_x] */
        const struct mm_weight g = rows_of(&L->w_gate_exps, x * fe, fe), u = rows_of(&L->w_up_exps, x * fe, fe);
        KVB_FORWARD_IF_ERROR(put(ctx, D->wgu + x * 2 * fe * e, &g, name, err));
        KVB_FORWARD_IF_ERROR(put(ctx, D->wgu + (x * 2 + 1) * fe * e, &u, name, err));
    }
    KVB_FORWARD_IF_ERROR(put(ctx, D->wdown, &L->w_down_exps, name, err)); /* expert x's rows from x * e already */
    if (fs > 0) {
        snprintf(name, sizeof name, "layer %d shared expert", l);
        KVB_FORWARD_IF_ERROR(check_shape(&L->w_shexp_gate, 1, e, "ffn_gate_inp_shexp", l, err));
        KVB_FORWARD_IF_ERROR(check_shape(&L->w_gate_shexp, fs, e, "ffn_gate_shexp", l, err));
        KVB_FORWARD_IF_ERROR(check_shape(&L->w_up_shexp, fs, e, "ffn_up_shexp", l, err));
        KVB_FORWARD_IF_ERROR(check_shape(&L->w_down_shexp, e, fs, "ffn_down_shexp", l, err));
        KVB_FORWARD_IF_ERROR(put_f32_rows(D->router + ne * e, &L->w_shexp_gate, row, err));
        KVB_FORWARD_IF_ERROR(alloc_dev(&D->sh_gu, 2 * fs * e * 2, name, err));
        KVB_FORWARD_IF_ERROR(alloc_dev(&D->sh_down, e * fs * 2, name, err));
        KVB_FORWARD_IF_ERROR(put(ctx, D->sh_gu, &L->w_gate_shexp, name, err));
        KVB_FORWARD_IF_ERROR(put(ctx, D->sh_gu + fs * e, &L->w_up_shexp, name, err));
        KVB_FORWARD_IF_ERROR(put(ctx, D->sh_down, &L->w_down_shexp, name, err));
    }
    return KVB_OK;
}

enum kvb_status cu_moe_create(const struct model *m, cu_moe_put_fn put, void *put_ctx, struct cu_moe **out,
                              struct kvb_err *err)
{
    const struct model_moe *mm = &m->ops.moe;
    *out = NULL;
    if (mm->n_expert <= 0 || mm->n_expert_used <= 0 || mm->n_expert_used > mm->n_expert || mm->n_ff_exp <= 0)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "cu_moe_create: the model has no usable experts");
    struct cu_moe *mo = kvb_calloc(1, sizeof *mo);
    float *row = kvb_malloc(sizeof(float) * (size_t)m->hp.n_embd);
    if (mo) mo->layers = kvb_calloc((size_t)m->hp.n_layer, sizeof *mo->layers);
    if (!mo || !row || !mo->layers) {
        kvb_free(row);
        if (mo) kvb_free(mo->layers);
        kvb_free(mo);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    mo->m = m;
    mo->n_router = mm->n_expert + (mm->n_ff_shexp > 0);
    mo->wide = mm->n_ff_exp > mm->n_ff_shexp ? mm->n_ff_exp : mm->n_ff_shexp;
    enum kvb_status st = KVB_OK;
    for (int l = 0; l < m->hp.n_layer && st == KVB_OK; l++)
        if (m->layers[l].moe) st = upload_layer(mo, l, put, put_ctx, row, err);
    kvb_free(row);
    if (st != KVB_OK) {
        cu_moe_free(mo);
        return st;
    }
    *out = mo;
    return KVB_OK;
}

enum kvb_status cu_moe_reserve(struct cu_moe *mo, int64_t cap_tok, cudaStream_t stream, struct kvb_err *err)
{
    if (cap_tok <= mo->cap_tok) return KVB_OK;
    const struct model *m = mo->m;
    const int64_t e = m->hp.n_embd, k = m->ops.moe.n_expert_used, ne = m->ops.moe.n_expert;
    const int64_t nr = cap_tok * k, rows = nr + BE_CUDA_DET_ROWS;
    free_scratch(mo);
    struct {
        void *p;
        int64_t bytes;
    } b[] = {
        {&mo->xn, cap_tok * e * 4},
        {&mo->xb, cap_tok * e * 2},
        {&mo->logits, cap_tok * mo->n_router * 4},
        {&mo->sel, nr * 4},
        {&mo->slot, nr * 4},
        {&mo->wts, nr * 4},
        {&mo->start, (ne + 1) * 4},
        {&mo->row_tok, rows * 4},
        {&mo->xg, rows * e * 2},
        {&mo->gu, rows * 2 * mo->wide * 4},
        {&mo->hb, rows * mo->wide * 2},
        {&mo->yd, rows * e * 4},
        {&mo->ys, m->ops.moe.n_ff_shexp > 0 ? cap_tok * e * 4 : 0},
    };
    int64_t total = 0;
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) total += b[i].bytes;
    enum kvb_status st = KVB_OK;
    for (size_t i = 0; i < sizeof b / sizeof b[0] && st == KVB_OK; i++) {
        if (b[i].bytes == 0) continue;
        st = alloc_dev(b[i].p, b[i].bytes, "the experts' step buffers", err);
        /* Zeroed: deterministic tiles read rows past the routed ones. */
        if (st == KVB_OK)
            st = cu_fail(cudaMemsetAsync(*(void **)b[i].p, 0, (size_t)b[i].bytes, stream), "the experts' step buffers",
                         err);
    }
    if (st == KVB_OK)
        st = cu_fail(cudaHostAlloc((void **)&mo->h_start, (size_t)(ne + 1) * 4, cudaHostAllocDefault),
                     "pinned expert counts", err);
    if (st != KVB_OK) {
        free_scratch(mo);
        if (st != KVB_ERR_NOMEM) return st;
        return kvb_errf(err, st,
                        "CUDA: out of device memory: the experts of a %lld-token step need %.1f MiB of scratch: "
                        "lower the tokens per step or --kv-mem",
                        (long long)cap_tok, (double)total / (1024.0 * 1024.0));
    }
    mo->cap_tok = cap_tok;
    mo->cap_rows = rows;
    return KVB_OK;
}

/* ---- forward ----------------------------------------------------------------------- */

static void run_cu(struct cu_moe_run *r, cudaError_t e, const char *what)
{
    if (e != cudaSuccess && !r->what) {
        r->ce = e;
        r->what = what;
    }
}

static void run_blas(struct cu_moe_run *r, cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS && !r->what) {
        r->bs = s;
        r->what = what;
    }
}

/* y = x · wᵀ over n rows, on whole deterministic tiles when asked (the
 * buffers have the room; see be_cuda_moe.h). */
static void gemm(struct cu_moe_run *r, float *y, const uint16_t *x, const uint16_t *w, int64_t n, int64_t n_in,
                 int64_t n_out, const char *what)
{
    const int64_t tile = r->det ? BE_CUDA_DET_ROWS : n;
    for (int64_t i = 0; i < n && !r->what; i += tile)
        run_blas(r, kcu_gemm_bf16(r->blas, y + i * n_out, x + i * n_in, w, tile, n_in, n_out), what);
}

static void act(struct cu_moe_run *r, const struct model *m, uint16_t *out, const float *gu, int64_t n, int64_t n_ff)
{
    if (m->ops.act == MODEL_ACT_GELU_TANH)
        run_cu(r, kcu_geglu_bf16(out, gu, (int32_t)n, (int32_t)n_ff, r->stream), "experts' GeGLU");
    else run_cu(r, kcu_swiglu_bf16(out, gu, (int32_t)n, (int32_t)n_ff, r->stream), "experts' SwiGLU");
}

void cu_moe_ffn(struct cu_moe *mo, struct cu_moe_run *r, int layer, const float *x, const float *norm, int64_t n_tok,
                float *out)
{
    const struct model *m = mo->m;
    const struct model_moe *mm = &m->ops.moe;
    const struct cu_moe_layer *L = &mo->layers[layer];
    const int64_t e = m->hp.n_embd, ne = mm->n_expert, k = mm->n_expert_used, fe = mm->n_ff_exp;
    const int64_t fs = mm->n_ff_shexp, nr = n_tok * k;
    const int32_t nt = (int32_t)n_tok;
    cudaStream_t cs = r->stream;
    if (r->what || n_tok <= 0) return;
    if (!L->wgu || n_tok > mo->cap_tok) {
        run_cu(r, cudaErrorInvalidValue, "experts: not a MoE layer, or a step past the reserved size");
        return;
    }

    /* The input: normed in f32 for the router, in bf16 for the experts. */
    const float *xin = x;
    if (norm) {
        run_cu(r, kcu_rmsnorm(mo->xn, e, x, e, NULL, nt, 1, (int32_t)e, norm, m->hp.rms_eps, cs), "FFN norm");
        xin = mo->xn;
    }
    run_cu(r, kcu_f32_to_bf16(mo->xb, xin, n_tok * e, cs), "FFN norm");
    const int64_t tile = r->det ? BE_CUDA_DET_ROWS : n_tok;
    for (int64_t i = 0; i < n_tok && !r->what; i += tile)
        run_blas(r, kcu_gemm_f32(r->blas, mo->logits + i * mo->n_router, xin + i * e, L->router, tile, e, mo->n_router),
                 "router");

    /* Routing, the rows by expert, and the counts back on the host. */
    run_cu(r, kcu_moe_route(mo->sel, mo->wts, mo->logits, mo->n_router, nt, (int32_t)ne, (int32_t)k, mm->norm_topk, cs),
           "expert routing");
    run_cu(r, kcu_moe_plan(mo->start, mo->slot, mo->row_tok, mo->sel, nt, (int32_t)k, (int32_t)ne, cs), "expert plan");
    run_cu(r, cudaMemcpyAsync(mo->h_start, mo->start, (size_t)(ne + 1) * 4, cudaMemcpyDeviceToHost, cs),
           "expert counts");
    run_cu(r, cudaStreamSynchronize(cs), "expert counts");
    if (r->what) return;
    if (mo->h_start[ne] != nr) {
        run_cu(r, cudaErrorInvalidValue, "expert plan: the routed rows do not add up");
        return;
    }

    /* The routed experts: gate|up per expert, the activation, down. */
    run_cu(r, kcu_moe_gather(mo->xg, mo->xb, e, mo->row_tok, (int32_t)nr, (int32_t)e, cs), "experts' inputs");
    for (int64_t j = 0; j < ne && !r->what; j++) {
        const int64_t r0 = mo->h_start[j], n = mo->h_start[j + 1] - r0;
        if (n > 0)
            gemm(r, mo->gu + r0 * 2 * fe, mo->xg + r0 * e, L->wgu + j * 2 * fe * e, n, e, 2 * fe, "experts' gate/up");
    }
    act(r, m, mo->hb, mo->gu, nr, fe);
    for (int64_t j = 0; j < ne && !r->what; j++) {
        const int64_t r0 = mo->h_start[j], n = mo->h_start[j + 1] - r0;
        if (n > 0) gemm(r, mo->yd + r0 * e, mo->hb + r0 * fe, L->wdown + j * e * fe, n, fe, e, "experts' down");
    }
    /* The shared expert over every token (its buffers reused: the routed
     * experts' are done with them). */
    if (fs > 0) {
        gemm(r, mo->gu, mo->xb, L->sh_gu, n_tok, e, 2 * fs, "shared expert gate/up");
        act(r, m, mo->hb, mo->gu, n_tok, fs);
        gemm(r, mo->ys, mo->hb, L->sh_down, n_tok, fs, e, "shared expert down");
    }
    run_cu(r,
           kcu_moe_combine(out, mo->yd, mo->slot, mo->wts, nt, (int32_t)k, (int32_t)e, fs > 0 ? mo->ys : NULL,
                           fs > 0 ? mo->logits + ne : NULL, mo->n_router, cs),
           "experts' sum");
}
