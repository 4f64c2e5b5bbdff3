/* moe.c — the mixture-of-experts FFN on the CPU (see moe.h).
 *
 * A step's n_tok tokens each choose k experts: n_tok * k "routed rows".
 * They are numbered grouped by expert (expert 0's rows first, in token
 * order), so that each expert's inputs lie contiguous and one kernel call
 * per (expert, range of weight rows) computes the expert for all of its
 * tokens, reading those weight rows once. A shared expert (qwen2moe) is one
 * more group, of every token. The kernels (matmul_impl.h) are called
 * directly, over a list of (matrix, input rows, row range) items that the
 * threads take first come, first served: a decode step has a few tokens on
 * each of many experts, and one pool run for all of them costs less than
 * one run per expert. Which thread computes an item never changes its
 * result.
 *
 * Under 16-bit activations (mm_ctx_set_act16) every quantized product reads
 * each input row twice, its 8-bit rounding and its residual's, as two tokens
 * (matmul_impl.h, mm_act16_residual), and the two outputs are added as
 * matmul.c adds them. So each expert's group of n routed rows is 2n rows in
 * the quantized inputs and in the products' outputs: the roundings first
 * (hi_at), then the residuals (lo_at); the shared expert's n_tok likewise.
 * Float rows and float weights keep one row per routed row.
 *
 * The stacked expert matrices the kernels read as stored (no packed form,
 * Q4_K among them) are copied out of the file's mapping into anonymous
 * memory backed by 2 MiB pages: a step streams most of the experts' bytes
 * once, and through the file's 4 KiB pages (a TLB miss every 4 KiB) the
 * decode steps of a Qwen3-30B-A3B-shaped Q4_K file took 8 % (batch 32) to
 * 14 % (batch 1) more CPU time (scripts/moe-bench-cpu.py). */
#include "cpu/moe.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "base/alloc.h"
#include "base/tpool.h"
#include "cpu/attn.h"
#include "cpu/matmul_impl.h"

/* Weight rows per work item: whole 16-row panels of the SIMD kernels, and
 * enough items that a decode step's few experts still split evenly. */
#define ITEM_ROWS 64
/* Below this many rows the per-row work (input forms, activations, sums)
 * runs on the calling thread: a pool run costs more than it saves. */
#define PAR_ROWS_MIN 16

/* One layer's experts as the kernels read them. */
struct moe_layer {
    struct mm_weight *gate, *up, *down;       /* (n_expert) each: expert e's matrices */
    struct mm_weight sh_gate, sh_up, sh_down; /* the shared expert (data NULL: none) */
};

/* Rows [r0, r1) of w for the `in` rows, into y (in.n_tok rows of w->n_out). */
struct moe_item {
    const struct mm_weight *w;
    struct mm_input in;
    float *y;
    int64_t r0, r1;
};

struct cpu_moe {
    const struct model *m;
    struct mm_ctx *mm;
    struct tpool *pool;
    const struct mm_kernels *k;
    int nth;
    bool simd;
    struct moe_layer *layers; /* (n_layer); NULL arrays for dense layers */
    void **owned;             /* packed copies */
    int64_t n_owned, cap_owned;
    bool need_xf, need_hf; /* some layer's gate/up, down matrices are float (read the float rows) */
    bool act16;            /* the mm context's 16-bit activations: two rows per routed row (above) */

    /* Scratch, grown to the largest step seen (cap_tok tokens). "Rows" are
     * the routed rows (n_tok * k) for the routed experts, tokens for the
     * shared one. */
    int64_t cap_tok;
    float *xn;         /* (n_tok, n_embd) the FFN inputs */
    float *logits;     /* (n_tok, n_expert) */
    float *sg;         /* (n_tok) the shared expert's gate logit */
    int32_t *sel;      /* (n_tok, k) chosen experts, ascending */
    float *wts;        /* (n_tok, k) their weights */
    int32_t *slot_row; /* (n_tok, k) the routed row of each choice */
    int32_t *start;    /* (n_expert + 1) first routed row of each expert */
    int32_t *fill;     /* (n_expert) */
    int32_t *hi_at;    /* (n_tok * k) act16: a routed row's place in xq, hq and the outputs; */
    int32_t *lo_at;    /*   its residual's place (start[x] + r and start[x + 1] + r) */
    float *xr;         /* (n_tok, n_embd) act16: the residuals of the FFN inputs */
    uint8_t *xqt, *xq; /* (n_tok | n_tok * k, xq_stride) quantized inputs: per token, per routed row */
    float *xft, *xf;   /* likewise, float (xf_stride), when need_xf */
    float *g, *u;      /* (n_tok * k, n_ff_exp) gate and up outputs; g becomes the activation */
    float *gs, *us;    /* (n_tok, n_ff_shexp) the shared expert's */
    uint8_t *hq, *hqs; /* quantized down inputs (hq_stride, hqs_stride) */
    float *hf, *hfs;   /* float down inputs (hf_stride, hfs_stride), when need_hf */
    float *yd, *ys;    /* (n_tok * k | n_tok, n_embd) down outputs */
    size_t xq_stride, hq_stride, hqs_stride;
    int64_t xf_stride, hf_stride, hfs_stride;
    struct moe_item *items;
    int64_t n_items, cap_items;
    size_t need_scratch;
    void **scratch; /* (nth) kernel scratch */
    size_t *scratch_cap;
};

/* ---- creation ------------------------------------------------------------------ */

static enum kvb_status keep_owned(struct cpu_moe *moe, void *p)
{
    if (moe->n_owned == moe->cap_owned) {
        int64_t cap = moe->cap_owned ? 2 * moe->cap_owned : 256;
        void **o = kvb_realloc(moe->owned, sizeof *o * (size_t)cap);
        if (!o) return KVB_ERR_NOMEM;
        moe->owned = o;
        moe->cap_owned = cap;
    }
    moe->owned[moe->n_owned++] = p;
    return KVB_OK;
}

/* Rows [e * n_rows, (e + 1) * n_rows) of w (one expert of a stack, or all
 * of an unstacked matrix with e = 0), packed for the kernels where they have
 * a packed form; the file's pages are then released. */
static enum kvb_status view_of(struct cpu_moe *moe, const struct mm_weight *w, int64_t e, int64_t n_rows,
                               struct mm_weight *out)
{
    struct mm_weight v = *w;
    v.n_out = n_rows;
    v.data = (const uint8_t *)w->data + (size_t)e * (size_t)n_rows * w->row_bytes;
    void *owned = NULL;
    KVB_FORWARD_IF_ERROR(mm_pack_weight(moe->mm, &v, out, &owned));
    if (owned) {
        enum kvb_status st = keep_owned(moe, owned);
        if (st != KVB_OK) {
            kvb_free(owned);
            return st;
        }
        gguf_release_pages(moe->m->gguf, v.data, (size_t)n_rows * v.row_bytes);
    }
    return KVB_OK;
}

void cpu_moe_free(struct cpu_moe *moe)
{
    if (!moe) return;
    for (int64_t i = 0; i < moe->n_owned; i++) kvb_free(moe->owned[i]);
    kvb_free(moe->owned);
    if (moe->layers)
        for (int l = 0; l < moe->m->hp.n_layer; l++) {
            kvb_free(moe->layers[l].gate);
            kvb_free(moe->layers[l].up);
            kvb_free(moe->layers[l].down);
        }
    kvb_free(moe->layers);
    void *bufs[] = {moe->xn, moe->logits, moe->sg, moe->sel, moe->wts,   moe->slot_row, moe->start, moe->fill, moe->xqt,
                    moe->xq, moe->xft,    moe->xf, moe->g,   moe->u,     moe->gs,       moe->us,    moe->hq,   moe->hqs,
                    moe->hf, moe->hfs,    moe->yd, moe->ys,  moe->items, moe->hi_at,    moe->lo_at, moe->xr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvb_free(bufs[i]);
    if (moe->scratch)
        for (int i = 0; i < moe->nth; i++) kvb_free(moe->scratch[i]);
    kvb_free(moe->scratch);
    kvb_free(moe->scratch_cap);
    kvb_free(moe);
}

static bool is_float(const struct mm_weight *w) { return w->data && !mm_type_is_quantized(w->type); }

/* The size of a huge page: the copies below are aligned to it and padded to
 * whole ones, so that every byte of them can lie in one. */
#define HUGE_PAGE ((size_t)2 << 20)

/* w (a whole stack of experts) read from a copy in anonymous memory the
 * kernel is asked to back with huge pages, when the kernels read w's rows
 * as stored (a type they pack gets its own copy in view_of); the file's
 * pages are released. Without room for the copy, or without
 * MADV_HUGEPAGE, w stays in the file's pages (only slower). The bytes are
 * the same, so no result changes. */
static enum kvb_status huge_copy(struct cpu_moe *moe, const struct mm_weight *w, struct mm_weight *out)
{
    *out = *w;
#ifdef MADV_HUGEPAGE
    if (!w->data || w->packed || (moe->k->packs && moe->k->packs(w->type))) return KVB_OK;
    const size_t n = w->row_bytes * (size_t)w->n_out, cap = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    uint8_t *buf = kvb_aligned_alloc(HUGE_PAGE, cap);
    if (!buf) return KVB_OK;
    enum kvb_status st = keep_owned(moe, buf);
    if (st != KVB_OK) {
        kvb_free(buf);
        return st;
    }
    (void)madvise(buf, cap, MADV_HUGEPAGE); /* advice: refused, the copy is still right */
    memcpy(buf, w->data, n);
    gguf_release_pages(moe->m->gguf, w->data, n);
    out->data = buf;
#else
    (void)moe;
#endif
    return KVB_OK;
}

static enum kvb_status prepare_layer(struct cpu_moe *moe, const struct model_layer *file_layer, struct moe_layer *ML)
{
    const struct model_moe *mo = &moe->m->ops.moe;
    const int64_t e = moe->m->hp.n_embd;
    /* The layer as read: the stacks in huge pages where they are copied. */
    struct model_layer copy = *file_layer;
    const struct model_layer *L = &copy;
    KVB_FORWARD_IF_ERROR(huge_copy(moe, &file_layer->w_gate_exps, &copy.w_gate_exps));
    KVB_FORWARD_IF_ERROR(huge_copy(moe, &file_layer->w_up_exps, &copy.w_up_exps));
    KVB_FORWARD_IF_ERROR(huge_copy(moe, &file_layer->w_down_exps, &copy.w_down_exps));
    ML->gate = kvb_calloc((size_t)mo->n_expert, sizeof *ML->gate);
    ML->up = kvb_calloc((size_t)mo->n_expert, sizeof *ML->up);
    ML->down = kvb_calloc((size_t)mo->n_expert, sizeof *ML->down);
    if (!ML->gate || !ML->up || !ML->down) return KVB_ERR_NOMEM;
    for (int64_t x = 0; x < mo->n_expert; x++) {
        KVB_FORWARD_IF_ERROR(view_of(moe, &L->w_gate_exps, x, mo->n_ff_exp, &ML->gate[x]));
        KVB_FORWARD_IF_ERROR(view_of(moe, &L->w_up_exps, x, mo->n_ff_exp, &ML->up[x]));
        KVB_FORWARD_IF_ERROR(view_of(moe, &L->w_down_exps, x, e, &ML->down[x]));
    }
    if (mo->n_ff_shexp > 0) {
        KVB_FORWARD_IF_ERROR(view_of(moe, &L->w_gate_shexp, 0, mo->n_ff_shexp, &ML->sh_gate));
        KVB_FORWARD_IF_ERROR(view_of(moe, &L->w_up_shexp, 0, mo->n_ff_shexp, &ML->sh_up));
        KVB_FORWARD_IF_ERROR(view_of(moe, &L->w_down_shexp, 0, e, &ML->sh_down));
    }
    moe->need_xf |=
        is_float(&L->w_gate_exps) || is_float(&L->w_up_exps) || is_float(&L->w_gate_shexp) || is_float(&L->w_up_shexp);
    moe->need_hf |= is_float(&L->w_down_exps) || is_float(&L->w_down_shexp);
    return KVB_OK;
}

enum kvb_status cpu_moe_create(const struct model *m, struct mm_ctx *mm, struct tpool *pool, bool simd,
                               struct cpu_moe **out, struct kvb_err *err)
{
    const struct model_moe *mo = &m->ops.moe;
    *out = NULL;
    if (mo->n_expert <= 0 || mo->n_expert_used <= 0 || mo->n_expert_used > mo->n_expert)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "cpu_moe_create: the model has no usable experts");
    struct cpu_moe *moe = kvb_calloc(1, sizeof *moe);
    if (!moe) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    moe->m = m;
    moe->mm = mm;
    moe->pool = pool;
    moe->k = mm_ctx_kernels(mm);
    moe->nth = tpool_size(pool);
    moe->simd = simd;
    moe->act16 = mm_ctx_act16(mm);
    moe->layers = kvb_calloc((size_t)m->hp.n_layer, sizeof *moe->layers);
    moe->scratch = kvb_calloc((size_t)moe->nth, sizeof *moe->scratch);
    moe->scratch_cap = kvb_calloc((size_t)moe->nth, sizeof *moe->scratch_cap);
    moe->start = kvb_calloc((size_t)mo->n_expert + 1, sizeof *moe->start);
    moe->fill = kvb_calloc((size_t)mo->n_expert, sizeof *moe->fill);
    enum kvb_status st =
        moe->layers && moe->scratch && moe->scratch_cap && moe->start && moe->fill ? KVB_OK : KVB_ERR_NOMEM;
    for (int l = 0; l < m->hp.n_layer && st == KVB_OK; l++)
        if (m->layers[l].moe) st = prepare_layer(moe, &m->layers[l], &moe->layers[l]);
    if (st != KVB_OK) {
        cpu_moe_free(moe);
        return kvb_errf(err, st, "cannot prepare the experts' weights for the %s kernels", moe->k->name);
    }
    *out = moe;
    return KVB_OK;
}

/* ---- scratch ------------------------------------------------------------------- */

static enum kvb_status grow_bytes(void **p, size_t n)
{
    void *np = kvb_aligned_alloc(64, n > 0 ? (n + 63) & ~(size_t)63 : 64);
    if (!np) return KVB_ERR_NOMEM;
    kvb_free(*p);
    *p = np;
    return KVB_OK;
}

/* The forms of the quantized input a weight type is read through (as
 * matmul.c decides them); 0 for float weights (they read the float rows)
 * and for none (data NULL). */
static unsigned forms_of(const struct mm_kernels *k, const struct mm_weight *w)
{
    if (!w->data || !mm_type_is_quantized(w->type)) return 0;
    return k->forms_of ? k->forms_of(w->type) : 1u;
}

static size_t quant_stride(const struct mm_kernels *k, int64_t n_in) { return n_in % 32 == 0 ? k->act_bytes(n_in) : 0; }

static enum kvb_status ensure(struct cpu_moe *moe, int64_t n_tok)
{
    if (n_tok <= moe->cap_tok) return KVB_OK;
    const struct model *m = moe->m;
    const struct model_moe *mo = &m->ops.moe;
    const int64_t e = m->hp.n_embd, ne = mo->n_expert, k = mo->n_expert_used;
    const int64_t fe = mo->n_ff_exp, fs = mo->n_ff_shexp, nr = n_tok * k, ns = fs > 0 ? n_tok : 0;
    moe->xq_stride = quant_stride(moe->k, e);
    moe->hq_stride = quant_stride(moe->k, fe);
    moe->hqs_stride = quant_stride(moe->k, fs);
    moe->xf_stride = (e + 15) & ~(int64_t)15;
    moe->hf_stride = (fe + 15) & ~(int64_t)15;
    moe->hfs_stride = (fs + 15) & ~(int64_t)15;
    const size_t f = sizeof(float), i32 = sizeof(int32_t);
    const int64_t m2 = moe->act16 ? 2 : 1; /* rows per routed row in the quantized inputs and the outputs */
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->xn, (size_t)(n_tok * e) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->logits, (size_t)(n_tok * ne) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->sg, (size_t)n_tok * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->sel, (size_t)nr * i32));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->wts, (size_t)nr * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->slot_row, (size_t)nr * i32));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->xqt, (size_t)(m2 * n_tok) * moe->xq_stride));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->xq, (size_t)(m2 * nr) * moe->xq_stride));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->g, (size_t)(m2 * nr * fe) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->u, (size_t)(m2 * nr * fe) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->hq, (size_t)(m2 * nr) * moe->hq_stride));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->yd, (size_t)(m2 * nr * e) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->gs, (size_t)(m2 * ns * fs) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->us, (size_t)(m2 * ns * fs) * f));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->hqs, (size_t)(m2 * ns) * moe->hqs_stride));
    KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->ys, (size_t)(m2 * ns * e) * f));
    if (moe->act16) {
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->hi_at, (size_t)nr * i32));
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->lo_at, (size_t)nr * i32));
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->xr, (size_t)(n_tok * e) * f));
    }
    if (moe->need_xf) {
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->xft, (size_t)(n_tok * moe->xf_stride) * f));
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->xf, (size_t)(nr * moe->xf_stride) * f));
    }
    if (moe->need_hf) {
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->hf, (size_t)(nr * moe->hf_stride) * f));
        KVB_FORWARD_IF_ERROR(grow_bytes((void **)&moe->hfs, (size_t)(ns * moe->hfs_stride) * f));
    }
    moe->cap_tok = n_tok;
    return KVB_OK;
}

/* ---- routing ------------------------------------------------------------------- */

/* Token t's experts and weights from its logits, as transformers' routers
 * compute them: p = softmax(logits) in float; the k largest p (ties: the
 * lower id), in descending order; divided by their sum (summed in that
 * order) when norm. Stored by ascending expert id, the order the token's
 * outputs are summed in (transformers adds them expert by expert too). */
void cpu_moe_route(float *p, int32_t ne, int32_t k, bool norm, int32_t *sel, float *wts)
{
    float mx = p[0]; /* p holds the logits; the probabilities replace them */
    for (int32_t i = 1; i < ne; i++) mx = p[i] > mx ? p[i] : mx;
    float sum = 0.0f;
    for (int32_t i = 0; i < ne; i++) {
        p[i] = expf(p[i] - mx);
        sum += p[i];
    }
    for (int32_t i = 0; i < ne; i++) p[i] /= sum;
    /* Selection by rank (k is small): each pass takes the largest p left
     * and marks it taken (-1: below every probability). */
    float tsum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        int32_t b = 0;
        for (int32_t i = 1; i < ne; i++)
            if (p[i] > p[b]) b = i;
        sel[j] = b;
        wts[j] = p[b];
        tsum += p[b];
        p[b] = -1.0f;
    }
    if (norm)
        for (int32_t j = 0; j < k; j++) wts[j] /= tsum;
    for (int32_t j = 1; j < k; j++) /* insertion sort by expert id */
        for (int32_t q = j; q > 0 && sel[q - 1] > sel[q]; q--) {
            int32_t s = sel[q];
            sel[q] = sel[q - 1];
            sel[q - 1] = s;
            float w = wts[q];
            wts[q] = wts[q - 1];
            wts[q - 1] = w;
        }
}

/* ---- per-row work ---------------------------------------------------------------- */

/* The router's input rows are made once, by mm_set_input_fn's caller-supplied
 * maker, and kept for the experts. */
struct keep_in {
    void (*make)(void *arg, int64_t t, float *dst);
    void *arg;
    float *xn;
    int64_t e;
};

static void keep_row(void *arg, int64_t t, float *dst)
{
    const struct keep_in *a = arg;
    a->make(a->arg, t, dst);
    memcpy(a->xn + t * a->e, dst, sizeof(float) * (size_t)a->e);
}

struct rows_job {
    struct cpu_moe *moe;
    int64_t n;       /* tokens (inputs, sums) or routed rows + shared rows (activations) */
    int64_t nr;      /* routed rows (n_tok * k) */
    unsigned forms;  /* inputs: of every gate and up; activations: of the routed down */
    unsigned forms2; /* activations: of the shared down */
    bool floats, floats2;
    /* act16: which outputs have a residual's half to add (their weights are
     * quantized): activations: routed gate, up, shared gate, up; sums:
     * routed down (lo[0]), shared down (lo[1]). */
    bool lo[4];
    float *out;
};

/* Where routed row r's rounding and residual lie (act16), or r alone. */
static inline int64_t hi_of(const struct cpu_moe *moe, int64_t r) { return moe->act16 ? moe->hi_at[r] : r; }

/* Token t's input: quantized once (and copied as floats, when some matrix
 * reads those) per token, then copied into the routed rows of its k
 * choices. */
static void input_rows(const struct rows_job *j, int64_t t0, int64_t t1)
{
    struct cpu_moe *moe = j->moe;
    const int64_t e = moe->m->hp.n_embd, k = moe->m->ops.moe.n_expert_used;
    const size_t qs = moe->xq_stride;
    for (int64_t t = t0; t < t1; t++) {
        const float *x = moe->xn + t * e;
        const int32_t *rows = moe->slot_row + t * k;
        if (j->forms) {
            uint8_t *q = moe->xqt + (size_t)t * qs;
            moe->k->quantize(x, e, j->forms, q);
            for (int64_t c = 0; c < k; c++) memcpy(moe->xq + (size_t)hi_of(moe, rows[c]) * qs, q, qs);
            if (moe->act16) { /* the residual's rounding: after the step's n_tok roundings, and per routed row */
                float *r = moe->xr + t * e;
                uint8_t *q2 = moe->xqt + (size_t)(j->n + t) * qs;
                mm_act16_residual(x, e, r);
                moe->k->quantize(r, e, j->forms, q2);
                for (int64_t c = 0; c < k; c++) memcpy(moe->xq + (size_t)moe->lo_at[rows[c]] * qs, q2, qs);
            }
        }
        if (j->floats) {
            float *xf = moe->xft + t * moe->xf_stride;
            memcpy(xf, x, sizeof(float) * (size_t)e);
            memset(xf + e, 0, sizeof(float) * (size_t)(moe->xf_stride - e));
            for (int64_t c = 0; c < k; c++)
                memcpy(moe->xf + rows[c] * moe->xf_stride, xf, sizeof(float) * (size_t)moe->xf_stride);
        }
    }
}

/* a += b, element by element: the second half of a product under act16. */
static void add_half(float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) a[i] = a[i] + b[i];
}

/* act(gate) * up in place of gate (n wide), then the down product's input:
 * its rounding into q and, with q2 (act16), its residual's into q2, made in
 * r (n floats of scratch). */
static void act_row(const struct cpu_moe *moe, float *g, const float *u, int64_t n, unsigned forms, uint8_t *q,
                    uint8_t *q2, float *r, float *f, int64_t f_stride)
{
    if (moe->m->ops.act == MODEL_ACT_GELU_TANH) {
        if (moe->simd) attn_geglu_avx2(g, u, n);
        else attn_geglu(g, u, n);
    } else {
        if (moe->simd) attn_swiglu_avx2(g, u, n);
        else attn_swiglu(g, u, n);
    }
    if (forms) moe->k->quantize(g, n, forms, q);
    if (forms && q2) {
        mm_act16_residual(g, n, r);
        moe->k->quantize(r, n, forms, q2);
    }
    if (f) {
        memcpy(f, g, sizeof(float) * (size_t)n);
        memset(f + n, 0, sizeof(float) * (size_t)(f_stride - n));
    }
}

/* Rows [r0, r1) of the activations: routed rows first, then the shared
 * expert's (one per token). */
static void act_rows(const struct rows_job *j, int64_t r0, int64_t r1)
{
    struct cpu_moe *moe = j->moe;
    const struct model_moe *mo = &moe->m->ops.moe;
    const int64_t nr = j->nr, fe = mo->n_ff_exp, fs = mo->n_ff_shexp;
    for (int64_t r = r0; r < r1; r++) {
        if (r < nr) {
            const int64_t hi = hi_of(moe, r), lo = moe->act16 ? moe->lo_at[r] : -1;
            float *g = moe->g + hi * fe, *u = moe->u + hi * fe;
            if (j->lo[0]) add_half(g, moe->g + lo * fe, fe);
            if (j->lo[1]) add_half(u, moe->u + lo * fe, fe);
            act_row(moe, g, u, fe, j->forms, moe->hq + (size_t)hi * moe->hq_stride,
                    lo >= 0 ? moe->hq + (size_t)lo * moe->hq_stride : NULL, lo >= 0 ? moe->g + lo * fe : NULL,
                    j->floats ? moe->hf + r * moe->hf_stride : NULL, moe->hf_stride);
        } else {
            const int64_t t = r - nr, n_tok = j->n - nr, lo = n_tok + t; /* the shared expert: one row a token */
            float *g = moe->gs + t * fs, *u = moe->us + t * fs;
            if (j->lo[2]) add_half(g, moe->gs + lo * fs, fs);
            if (j->lo[3]) add_half(u, moe->us + lo * fs, fs);
            act_row(moe, g, u, fs, j->forms2, moe->hqs + (size_t)t * moe->hqs_stride,
                    moe->act16 ? moe->hqs + (size_t)lo * moe->hqs_stride : NULL, moe->act16 ? moe->gs + lo * fs : NULL,
                    j->floats2 ? moe->hfs + t * moe->hfs_stride : NULL, moe->hfs_stride);
        }
    }
}

/* Token t's output: its experts' outputs times their weights, summed in
 * ascending expert id (each product rounded, then added, as transformers'
 * index_add_ of the weighted rows does), then the shared expert's times
 * sigmoid(its gate logit) (Qwen2MoeSparseMoeBlock: experts + shared). */
static void sum_rows(const struct rows_job *j, int64_t t0, int64_t t1)
{
    struct cpu_moe *moe = j->moe;
    const int64_t e = moe->m->hp.n_embd, k = moe->m->ops.moe.n_expert_used;
    const bool shared = moe->m->ops.moe.n_ff_shexp > 0;
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->out + t * e;
        for (int64_t c = 0; c < k; c++) {
            const float w = moe->wts[t * k + c];
            const int64_t rr = moe->slot_row[t * k + c];
            float *y = moe->yd + hi_of(moe, rr) * e;
            if (j->lo[0]) add_half(y, moe->yd + (int64_t)moe->lo_at[rr] * e, e);
            if (c == 0)
                for (int64_t i = 0; i < e; i++) o[i] = y[i] * w;
            else
                for (int64_t i = 0; i < e; i++) {
                    const float wy = y[i] * w;
                    o[i] += wy;
                }
        }
        if (shared) {
            const float s = 1.0f / (1.0f + expf(-moe->sg[t]));
            float *y = moe->ys + t * e;
            if (j->lo[1]) add_half(y, moe->ys + (j->n + t) * e, e);
            for (int64_t i = 0; i < e; i++) {
                const float sy = y[i] * s;
                o[i] += sy;
            }
        }
    }
}

static void (*const row_fns[])(const struct rows_job *, int64_t, int64_t) = {input_rows, act_rows, sum_rows};

struct rows_run {
    const struct rows_job *job;
    int fn;
};

static void rows_worker(void *arg, int ith, int nth)
{
    const struct rows_run *r = arg;
    const int64_t n = r->job->n;
    row_fns[r->fn](r->job, n * ith / nth, n * (ith + 1) / nth);
}

static void run_rows(struct cpu_moe *moe, const struct rows_job *j, int fn, int64_t n_rows_work)
{
    if (n_rows_work >= PAR_ROWS_MIN && moe->nth > 1) {
        struct rows_run r = {j, fn};
        tpool_run(moe->pool, rows_worker, &r);
    } else {
        row_fns[fn](j, 0, j->n);
    }
}

/* ---- the products -------------------------------------------------------------- */

struct prod_job {
    struct cpu_moe *moe;
    atomic_llong next;
};

static void prod_worker(void *arg, int ith, int nth)
{
    (void)nth;
    struct prod_job *j = arg;
    struct cpu_moe *moe = j->moe;
    for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < moe->n_items;) {
        const struct moe_item *it = &moe->items[i];
        moe->k->rows(it->w, &it->in, it->y, it->r0, it->r1, moe->scratch[ith]);
    }
}

/* Appends the items of w over the n rows of input that start at row r0 of
 * (xq, xf) (pass 0: counts them and the scratch they need). */
static void add_items(struct cpu_moe *moe, int pass, const struct mm_weight *w, int64_t n_in, int64_t n, int64_t r0,
                      const uint8_t *xq, size_t xq_stride, const float *xf, int64_t xf_stride, float *y)
{
    /* act16: a quantized product reads both halves of the group as 2n tokens;
     * every product writes its outputs in the group's 2n rows (a float one
     * the first n only) */
    const int64_t m2 = moe->act16 ? 2 : 1, nt = mm_type_is_quantized(w->type) ? m2 * n : n;
    if (pass == 0) {
        const size_t s = moe->k->scratch_bytes(w, nt);
        moe->need_scratch = s > moe->need_scratch ? s : moe->need_scratch;
        moe->n_items += (w->n_out + ITEM_ROWS - 1) / ITEM_ROWS;
        return;
    }
    const struct mm_input in = {
        n_in, nt, xf ? xf + r0 * xf_stride : NULL, xf_stride, xq + (size_t)(m2 * r0) * xq_stride, xq_stride};
    for (int64_t r = 0; r < w->n_out; r += ITEM_ROWS)
        moe->items[moe->n_items++] =
            (struct moe_item){w, in, y + m2 * r0 * w->n_out, r, r + ITEM_ROWS < w->n_out ? r + ITEM_ROWS : w->n_out};
}

/* One pool run for one phase: every chosen expert's gate and up products
 * and the shared expert's (down false), or their down products. */
static enum kvb_status run_products(struct cpu_moe *moe, const struct moe_layer *ML, int64_t n_tok, bool down)
{
    const struct model_moe *mo = &moe->m->ops.moe;
    const int64_t e = moe->m->hp.n_embd, fe = mo->n_ff_exp, fs = mo->n_ff_shexp;
    for (int pass = 0; pass < 2; pass++) {
        moe->n_items = 0;
        if (pass == 0) moe->need_scratch = 0;
        for (int32_t x = 0; x < mo->n_expert; x++) {
            const int64_t r0 = moe->start[x], n = moe->start[x + 1] - r0;
            if (n == 0) continue;
            if (down) {
                add_items(moe, pass, &ML->down[x], fe, n, r0, moe->hq, moe->hq_stride, moe->hf, moe->hf_stride,
                          moe->yd);
            } else {
                add_items(moe, pass, &ML->gate[x], e, n, r0, moe->xq, moe->xq_stride, moe->xf, moe->xf_stride, moe->g);
                add_items(moe, pass, &ML->up[x], e, n, r0, moe->xq, moe->xq_stride, moe->xf, moe->xf_stride, moe->u);
            }
        }
        if (ML->sh_gate.data) {
            if (down) {
                add_items(moe, pass, &ML->sh_down, fs, n_tok, 0, moe->hqs, moe->hqs_stride, moe->hfs, moe->hfs_stride,
                          moe->ys);
            } else {
                add_items(moe, pass, &ML->sh_gate, e, n_tok, 0, moe->xqt, moe->xq_stride, moe->xft, moe->xf_stride,
                          moe->gs);
                add_items(moe, pass, &ML->sh_up, e, n_tok, 0, moe->xqt, moe->xq_stride, moe->xft, moe->xf_stride,
                          moe->us);
            }
        }
        if (pass == 0) {
            if (moe->n_items > moe->cap_items) {
                struct moe_item *it = kvb_realloc(moe->items, sizeof *it * (size_t)moe->n_items);
                if (!it) return KVB_ERR_NOMEM;
                moe->items = it;
                moe->cap_items = moe->n_items;
            }
            for (int i = 0; i < moe->nth; i++) {
                if (moe->scratch[i] && moe->scratch_cap[i] >= moe->need_scratch) continue;
                KVB_FORWARD_IF_ERROR(grow_bytes(&moe->scratch[i], moe->need_scratch));
                moe->scratch_cap[i] = moe->need_scratch;
            }
        }
    }
    struct prod_job j = {moe, 0};
    if (moe->n_items > 0) tpool_run(moe->pool, prod_worker, &j);
    return KVB_OK;
}

/* ---- the layer ----------------------------------------------------------------- */

enum kvb_status cpu_moe_forward(struct cpu_moe *moe, int layer, int64_t n_tok,
                                void (*make)(void *arg, int64_t t, float *dst), void *arg, float *out,
                                struct kvb_err *err)
{
    const struct model *m = moe->m;
    const struct model_layer *L = &m->layers[layer];
    const struct moe_layer *ML = &moe->layers[layer];
    const struct model_moe *mo = &m->ops.moe;
    const int64_t e = m->hp.n_embd, ne = mo->n_expert, k = mo->n_expert_used, nr = n_tok * k;
    const bool shared = ML->sh_gate.data != NULL;
    if (!L->moe || !ML->gate) return kvb_errf(err, KVB_ERR_INVALID_ARG, "layer %d is not a MoE layer", layer);
    if (n_tok <= 0) return KVB_OK;
    if (ensure(moe, n_tok) != KVB_OK)
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the experts of a %lld-token step", (long long)n_tok);

    /* The router's logits (and the shared expert's gate); the input rows
     * are kept for the experts. */
    struct keep_in kin = {make, arg, moe->xn, e};
    const struct mm_weight *rw[2] = {&L->w_router, &L->w_shexp_gate};
    float *const ry[2] = {moe->logits, moe->sg};
    enum kvb_status st = mm_set_input_fn(moe->mm, e, n_tok, keep_row, &kin);
    if (st == KVB_OK) st = mm_apply_n(moe->mm, rw, ry, shared ? 2 : 1);
    if (st != KVB_OK) return kvb_errf(err, st, "layer %d: the router's product failed", layer);

    /* Each token's experts, then the routed rows numbered by expert. */
    for (int64_t t = 0; t < n_tok; t++)
        cpu_moe_route(moe->logits + t * ne, (int32_t)ne, (int32_t)k, mo->norm_topk, moe->sel + t * k, moe->wts + t * k);
    memset(moe->start, 0, sizeof *moe->start * (size_t)(ne + 1));
    for (int64_t i = 0; i < nr; i++) moe->start[moe->sel[i] + 1]++;
    for (int64_t x = 0; x < ne; x++) {
        moe->start[x + 1] += moe->start[x];
        moe->fill[x] = moe->start[x];
    }
    for (int64_t i = 0; i < nr; i++) moe->slot_row[i] = moe->fill[moe->sel[i]]++;
    if (moe->act16)
        for (int64_t i = 0; i < nr; i++) {
            const int32_t r = moe->slot_row[i], x = moe->sel[i];
            moe->hi_at[r] = r + moe->start[x];
            moe->lo_at[r] = r + moe->start[x + 1];
        }

    /* Inputs of the gate and up products, in the forms their types read;
     * the activations as the down products' input; the products; the sums. */
    const unsigned xforms = forms_of(moe->k, &ML->gate[0]) | forms_of(moe->k, &ML->up[0]) |
                            forms_of(moe->k, &ML->sh_gate) | forms_of(moe->k, &ML->sh_up);
    const unsigned dforms = forms_of(moe->k, &ML->down[0]), sforms = forms_of(moe->k, &ML->sh_down);
    if ((xforms && !moe->xq_stride) || (dforms && !moe->hq_stride) || (sforms && !moe->hqs_stride))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "layer %d: expert rows are not whole blocks of 32", layer);
    const bool xfloats =
        is_float(&ML->gate[0]) || is_float(&ML->up[0]) || is_float(&ML->sh_gate) || is_float(&ML->sh_up);
    struct rows_job rj = {moe, n_tok, nr, xforms, 0, xfloats, false, {false, false, false, false}, out};
    run_rows(moe, &rj, 0, nr);
    if (run_products(moe, ML, n_tok, false) != KVB_OK)
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the experts' products");
    const int64_t na = nr + (shared ? n_tok : 0);
    const bool a16 = moe->act16;
    rj = (struct rows_job){moe,
                           na,
                           nr,
                           dforms,
                           sforms,
                           is_float(&ML->down[0]),
                           is_float(&ML->sh_down),
                           {a16 && forms_of(moe->k, &ML->gate[0]), a16 && forms_of(moe->k, &ML->up[0]),
                            a16 && forms_of(moe->k, &ML->sh_gate), a16 && forms_of(moe->k, &ML->sh_up)},
                           out};
    run_rows(moe, &rj, 1, na);
    if (run_products(moe, ML, n_tok, true) != KVB_OK)
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the experts' products");
    rj = (struct rows_job){moe, n_tok, nr, 0, 0, false, false, {a16 && dforms, a16 && sforms, false, false}, out};
    run_rows(moe, &rj, 2, nr);
    return KVB_OK;
}
