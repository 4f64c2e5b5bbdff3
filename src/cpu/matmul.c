/* matmul.c — the matrix-product context: implementation choice, input
 * buffers, per-thread scratch and the split of output rows over threads.
 *
 * The arithmetic lives in the implementations behind struct mm_kernels
 * (matmul_impl.h). This file decides who computes which rows: each thread
 * takes one contiguous range of output rows for all tokens, so the way rows
 * are split (and so the thread count) never changes how a single output
 * element is computed. It also decides when an input is made: its rows (a
 * copy, or a caller's callback) and the quantized forms the weights of an
 * mm_apply*() read are made in one parallel pass just before that product,
 * once per input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/tpool.h"
#include "cpu/matmul_impl.h"
#include "model/quant.h"

/* Rows are handed to threads in multiples of this, so that every thread
 * sees whole row panels of the SIMD kernels (performance only). */
#define ROW_GRAIN 16
/* Below this many tokens the input is quantized on the calling thread: a
 * parallel run costs more than quantizing a few rows. */
#define PAR_QUANT_MIN_TOK 8

struct mm_ctx {
    struct tpool *pool; /* borrowed */
    int nth;
    enum mm_impl impl;
    const struct mm_kernels *k;

    float *xf;     /* (n_tok, xf_stride) float copy of the input */
    size_t xf_cap; /* bytes */
    uint8_t *xq;   /* (n_tok, xq_stride) quantized input */
    size_t xq_cap; /* bytes */
    struct mm_input in;
    bool have_input;
    bool have_xq;        /* n_in was a whole number of 32-blocks */
    unsigned forms_made; /* forms of xq quantized from this input so far */
    bool xf_made;        /* xf holds the input's rows */
    const float *src;    /* mm_set_input's rows, or NULL: made by make() */
    void (*make)(void *arg, int64_t t, float *dst);
    void *make_arg;

    void **scratch;      /* [nth] per-thread buffers */
    size_t *scratch_cap; /* [nth] bytes */

    /* Two-level activations (mm_ctx_set_act16): xq holds 2 n_tok tokens,
     * the input's rounding in [0, n_tok) and its residual's in [n_tok,
     * 2 n_tok); xr the residual rows (made with the first form, kept for
     * forms made later). */
    bool act16;
    float *xr;
    size_t xr_cap;
    float **ysum;     /* [nth] per-thread: both halves' outputs of a row block */
    size_t *ysum_cap; /* [nth] bytes */
};

static bool cpu_has_avx2(void) { return cpu_features().avx2; }
static bool cpu_has_avx512(void) { return cpu_features().avx512; }
static bool cpu_has_amx(void) { return mm_amx_built && cpu_features().amx; }

bool mm_impl_available(enum mm_impl impl)
{
    switch (impl) {
    case MM_IMPL_AUTO:
    case MM_IMPL_SCALAR: return true;
    case MM_IMPL_AVX2: return cpu_has_avx2();
    case MM_IMPL_AVX512: return cpu_has_avx512();
    case MM_IMPL_AMX: return cpu_has_amx();
    }
    return false;
}

static const char *const impl_names[] = {"auto", "scalar", "avx2", "avx512", "amx"};

bool mm_impl_parse(const char *name, enum mm_impl *out)
{
    for (size_t i = 0; name && i < sizeof impl_names / sizeof impl_names[0]; i++)
        if (!strcmp(name, impl_names[i])) {
            *out = (enum mm_impl)i;
            return true;
        }
    return false;
}

const char *mm_impl_label(enum mm_impl impl)
{
    return (unsigned)impl < sizeof impl_names / sizeof impl_names[0] ? impl_names[impl] : "?";
}

/* Why `impl` cannot run here. */
static const char *why_not(enum mm_impl impl)
{
    if (impl != MM_IMPL_AMX) return "this CPU does not have it";
    if (!cpu_features().amx_cpu) return "this CPU has no AMX (amx_tile, amx_int8, amx_bf16 with AVX-512 VNNI)";
    if (!mm_amx_built) return "this kvbatch was built by a compiler without AMX support";
    return "the operating system refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
}

enum kvb_status mm_impl_resolve(enum mm_impl impl, enum mm_impl *out, struct kvb_err *err)
{
    const char *from = "";
    if (impl == MM_IMPL_AUTO) {
        const char *env = getenv("KVBATCH_KERNELS");
        if (env && *env && strcmp(env, "auto")) {
            if (!mm_impl_parse(env, &impl))
                return kvb_errf(err, KVB_ERR_INVALID_ARG,
                                "KVBATCH_KERNELS='%s': expected auto, amx, avx512, avx2 or scalar", env);
            from = "KVBATCH_KERNELS=";
        } else {
            impl = cpu_has_amx()      ? MM_IMPL_AMX
                   : cpu_has_avx512() ? MM_IMPL_AVX512
                   : cpu_has_avx2()   ? MM_IMPL_AVX2
                                      : MM_IMPL_SCALAR;
        }
    }
    if ((unsigned)impl >= sizeof impl_names / sizeof impl_names[0])
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "unknown matmul implementation %d", (int)impl);
    if (!mm_impl_available(impl))
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "%s%s kernels cannot run here: %s", from, impl_names[impl],
                        why_not(impl));
    *out = impl;
    return KVB_OK;
}

enum kvb_status mm_ctx_create(struct tpool *pool, enum mm_impl impl, struct mm_ctx **out, struct kvb_err *err)
{
    if (!pool || !out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "mm_ctx_create: NULL argument");
    KVB_FORWARD_IF_ERROR(mm_impl_resolve(impl, &impl, err));
    const struct mm_kernels *k;
    switch (impl) {
    case MM_IMPL_SCALAR: k = &mm_kernels_scalar; break;
    case MM_IMPL_AVX2: k = &mm_kernels_avx2; break;
    case MM_IMPL_AVX512: k = &mm_kernels_avx512; break;
    case MM_IMPL_AMX: k = &mm_kernels_amx; break;
    default: return kvb_errf(err, KVB_ERR_INVALID_ARG, "mm_ctx_create: unknown impl %d", (int)impl);
    }
    struct mm_ctx *c = kvb_calloc(1, sizeof *c);
    if (!c) return kvb_errf(err, KVB_ERR_NOMEM, "mm_ctx_create: out of memory");
    c->pool = pool;
    c->nth = tpool_size(pool);
    c->impl = impl;
    c->k = k;
    c->scratch = kvb_calloc((size_t)c->nth, sizeof *c->scratch);
    c->scratch_cap = kvb_calloc((size_t)c->nth, sizeof *c->scratch_cap);
    c->ysum = kvb_calloc((size_t)c->nth, sizeof *c->ysum);
    c->ysum_cap = kvb_calloc((size_t)c->nth, sizeof *c->ysum_cap);
    if (!c->scratch || !c->scratch_cap || !c->ysum || !c->ysum_cap) {
        mm_ctx_free(c);
        return kvb_errf(err, KVB_ERR_NOMEM, "mm_ctx_create: out of memory");
    }
    *out = c;
    return KVB_OK;
}

void mm_ctx_free(struct mm_ctx *ctx)
{
    if (!ctx) return;
    if (ctx->scratch)
        for (int i = 0; i < ctx->nth; i++) kvb_free(ctx->scratch[i]);
    kvb_free(ctx->scratch);
    kvb_free(ctx->scratch_cap);
    if (ctx->ysum)
        for (int i = 0; i < ctx->nth; i++) kvb_free(ctx->ysum[i]);
    kvb_free(ctx->ysum);
    kvb_free(ctx->ysum_cap);
    kvb_free(ctx->xf);
    kvb_free(ctx->xq);
    kvb_free(ctx->xr);
    kvb_free(ctx);
}

const char *mm_ctx_impl_name(const struct mm_ctx *ctx) { return ctx->k->name; }

void mm_ctx_set_act16(struct mm_ctx *ctx, bool on)
{
    ctx->act16 = on;
    ctx->have_input = false; /* the buffers' layout changes with it */
}

bool mm_ctx_act16(const struct mm_ctx *ctx) { return ctx->act16; }

const struct mm_kernels *mm_ctx_kernels(const struct mm_ctx *ctx) { return ctx->k; }

/* Grows an aligned buffer to at least `need` bytes (contents not kept). */
static enum kvb_status grow(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf) return KVB_OK;
    size_t n = need + need / 4 + 64; /* headroom: shapes vary from step to step */
    n = (n + 63) & ~(size_t)63;
    void *p = kvb_aligned_alloc(64, n);
    if (!p) return KVB_ERR_NOMEM;
    kvb_free(*buf);
    *buf = p;
    *cap = n;
    return KVB_OK;
}

/* Makes the float copy of the input (if not made yet) and quantizes the
 * forms named, token by token: a form is made when a weight first needs it
 * (make_forms). */
struct quant_job {
    struct mm_ctx *ctx;
    bool make_xf;   /* the float copy is still to be made */
    bool make_xr;   /* the residual rows too (act16) */
    unsigned forms; /* forms to quantize from it (and from the residual, act16) */
};

void mm_act16_residual(const float *x, int64_t n_in, float *r)
{
    for (int64_t b = 0; b < n_in / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            float v = xb[j] * id;
            if (!(v >= -127.0f)) v = -127.0f;
            if (v > 127.0f) v = 127.0f;
            float q = nearbyintf(v);
            float dq = d * q;
            r[32 * b + j] = xb[j] - dq;
        }
    }
}

static void quant_tokens(struct mm_ctx *c, const struct quant_job *j, int64_t t0, int64_t t1)
{
    const struct mm_input *in = &c->in;
    for (int64_t t = t0; t < t1; t++) {
        float *xf = c->xf + t * in->xf_stride;
        if (j->make_xf) {
            if (c->src) memcpy(xf, c->src + t * in->n_in, (size_t)in->n_in * sizeof(float));
            else c->make(c->make_arg, t, xf);
            memset(xf + in->n_in, 0, (size_t)(in->xf_stride - in->n_in) * sizeof(float));
        }
        if (!j->forms) continue;
        c->k->quantize(xf, in->n_in, j->forms, c->xq + (size_t)t * in->xq_stride);
        if (c->act16) {
            float *xr = c->xr + t * in->xf_stride;
            if (j->make_xr) mm_act16_residual(xf, in->n_in, xr);
            c->k->quantize(xr, in->n_in, j->forms, c->xq + (size_t)(in->n_tok + t) * in->xq_stride);
        }
    }
}

static void quant_worker(void *arg, int ith, int nth)
{
    struct quant_job *j = arg;
    int64_t n = j->ctx->in.n_tok;
    int64_t t0 = n * ith / nth, t1 = n * (ith + 1) / nth;
    quant_tokens(j->ctx, j, t0, t1);
}

/* Sets up the input's buffers; the rows are made later (make_forms). */
static enum kvb_status input_begin(struct mm_ctx *ctx, int64_t n_in, int64_t n_tok)
{
    ctx->have_input = false;
    int64_t xf_stride = (n_in + 15) & ~(int64_t)15;
    bool q = n_in % 32 == 0;
    size_t xq_stride = q ? ctx->k->act_bytes(n_in) : 0;
    size_t n = (size_t)(n_tok > 0 ? n_tok : 1);
    KVB_FORWARD_IF_ERROR(grow((void **)&ctx->xf, &ctx->xf_cap, n * (size_t)xf_stride * sizeof(float)));
    if (q) KVB_FORWARD_IF_ERROR(grow((void **)&ctx->xq, &ctx->xq_cap, (ctx->act16 ? 2 : 1) * n * xq_stride));
    if (q && ctx->act16)
        KVB_FORWARD_IF_ERROR(grow((void **)&ctx->xr, &ctx->xr_cap, n * (size_t)xf_stride * sizeof(float)));
    ctx->in = (struct mm_input){n_in, n_tok, ctx->xf, xf_stride, ctx->xq, xq_stride};
    ctx->have_xq = q;
    ctx->forms_made = 0;
    ctx->xf_made = false;
    ctx->have_input = true;
    return KVB_OK;
}

enum kvb_status mm_set_input(struct mm_ctx *ctx, const float *x, int64_t n_in, int64_t n_tok)
{
    if (!ctx || (!x && n_tok > 0) || n_in <= 0 || n_tok < 0) return KVB_ERR_INVALID_ARG;
    KVB_FORWARD_IF_ERROR(input_begin(ctx, n_in, n_tok));
    /* A plain copy, on this thread: cheaper than a pool run at any size the
     * forward pass uses. */
    ctx->src = x;
    struct quant_job j = {ctx, true, false, 0};
    quant_tokens(ctx, &j, 0, n_tok);
    ctx->xf_made = true;
    return KVB_OK;
}

enum kvb_status mm_set_input_fn(struct mm_ctx *ctx, int64_t n_in, int64_t n_tok,
                                void (*make)(void *arg, int64_t t, float *dst), void *arg)
{
    if (!ctx || !make || n_in <= 0 || n_tok < 0) return KVB_ERR_INVALID_ARG;
    KVB_FORWARD_IF_ERROR(input_begin(ctx, n_in, n_tok));
    ctx->src = NULL;
    ctx->make = make;
    ctx->make_arg = arg;
    return KVB_OK;
}

static unsigned forms_of(const struct mm_ctx *ctx, enum ggml_type type)
{
    if (!mm_type_is_quantized(type)) return 0;
    return ctx->k->forms_of ? ctx->k->forms_of(type) : 1u;
}

/* Makes the float rows if they are still to be made and quantizes the forms
 * that `need` names and nobody made yet, in one pass over the tokens. */
static void make_forms(struct mm_ctx *ctx, unsigned need)
{
    unsigned missing = need & ~ctx->forms_made;
    if ((!missing && ctx->xf_made) || ctx->in.n_tok == 0) {
        ctx->xf_made = true;
        return;
    }
    struct quant_job j = {ctx, !ctx->xf_made, ctx->act16 && missing && !ctx->forms_made, missing};
    if (ctx->in.n_tok >= PAR_QUANT_MIN_TOK && ctx->nth > 1) tpool_run(ctx->pool, quant_worker, &j);
    else quant_tokens(ctx, &j, 0, ctx->in.n_tok);
    ctx->xf_made = true;
    ctx->forms_made |= missing;
}

static enum kvb_status check_weight(const struct mm_ctx *ctx, const struct mm_weight *w)
{
    if (!w || !w->data || w->n_out <= 0) return KVB_ERR_INVALID_ARG;
    if (!quant_type_supported(w->type)) return KVB_ERR_UNSUPPORTED;
    if (!ctx->have_input || w->n_in != ctx->in.n_in) return KVB_ERR_INVALID_ARG;
    uint64_t rb;
    if (!ggml_type_row_bytes((uint32_t)w->type, (uint64_t)w->n_in, &rb) || w->row_bytes < rb)
        return KVB_ERR_INVALID_ARG;
    if (mm_type_is_quantized(w->type) && !ctx->have_xq) return KVB_ERR_INVALID_ARG;
    if (w->packed && w->packed != ctx->k->pack_tag) return KVB_ERR_INVALID_ARG;
    return KVB_OK;
}

struct apply_job {
    struct mm_ctx *ctx;
    const struct mm_weight *const *w;
    float *const *y;
    int n;
};

/* Rows of one block computed for both halves of the input at once (the
 * weights are read once for both), in blocks small enough for the thread's
 * ysum buffer. */
static int64_t act16_block(int64_t n_tok)
{
    int64_t r = ((int64_t)1 << 20) / (2 * n_tok * ROW_GRAIN * (int64_t)sizeof(float));
    return (r < 1 ? 1 : r) * ROW_GRAIN;
}

/* y = W (d1 q1) + W (d2 q2): the products of the input's rounding and of its
 * residual's, added in that order, element by element. */
static void rows_act16(struct mm_ctx *c, const struct mm_weight *w, float *y, int64_t r0, int64_t r1, int ith)
{
    int64_t n = c->in.n_tok;
    struct mm_input in2 = c->in;
    in2.n_tok = 2 * n;
    float *t = c->ysum[ith];
    int64_t blk = act16_block(n);
    for (int64_t a = r0; a < r1; a += blk) {
        int64_t m = r1 - a < blk ? r1 - a : blk;
        struct mm_weight v = *w;
        v.data = (const uint8_t *)w->data + (size_t)a * w->row_bytes;
        v.n_out = m;
        c->k->rows(&v, &in2, t, 0, m, c->scratch[ith]);
        for (int64_t tk = 0; tk < n; tk++)
            for (int64_t i = 0; i < m; i++) y[tk * w->n_out + a + i] = t[tk * m + i] + t[(n + tk) * m + i];
    }
}

static void apply_worker(void *arg, int ith, int nth)
{
    struct apply_job *j = arg;
    for (int i = 0; i < j->n; i++) {
        const struct mm_weight *w = j->w[i];
        /* Whole grains per thread; the last thread takes the remainder. */
        int64_t grains = (w->n_out + ROW_GRAIN - 1) / ROW_GRAIN;
        int64_t g0 = grains * ith / nth, g1 = grains * (ith + 1) / nth;
        int64_t r0 = g0 * ROW_GRAIN, r1 = g1 * ROW_GRAIN;
        if (r1 > w->n_out) r1 = w->n_out;
        if (r0 >= r1) continue;
        if (j->ctx->act16 && mm_type_is_quantized(w->type)) rows_act16(j->ctx, w, j->y[i], r0, r1, ith);
        else j->ctx->k->rows(w, &j->ctx->in, j->y[i], r0, r1, j->ctx->scratch[ith]);
    }
}

enum kvb_status mm_apply_n(struct mm_ctx *ctx, const struct mm_weight *const *w, float *const *y, int n)
{
    if (!ctx || (n > 0 && (!w || !y)) || n < 0) return KVB_ERR_INVALID_ARG;
    size_t need = 0;
    unsigned forms = 0;
    bool wide = false;
    for (int i = 0; i < n; i++) {
        KVB_FORWARD_IF_ERROR(check_weight(ctx, w[i]));
        forms |= forms_of(ctx, w[i]->type);
        if (!y[i]) return KVB_ERR_INVALID_ARG;
        bool two = ctx->act16 && mm_type_is_quantized(w[i]->type);
        size_t s = ctx->k->scratch_bytes(w[i], (two ? 2 : 1) * ctx->in.n_tok);
        if (s > need) need = s;
        if (two) wide = true;
    }
    if (n == 0 || ctx->in.n_tok == 0) return KVB_OK;
    for (int i = 0; i < ctx->nth; i++) KVB_FORWARD_IF_ERROR(grow(&ctx->scratch[i], &ctx->scratch_cap[i], need));
    if (wide) {
        size_t yb = (size_t)(2 * ctx->in.n_tok * act16_block(ctx->in.n_tok)) * sizeof(float);
        for (int i = 0; i < ctx->nth; i++) KVB_FORWARD_IF_ERROR(grow((void **)&ctx->ysum[i], &ctx->ysum_cap[i], yb));
    }
    make_forms(ctx, forms);
    struct apply_job j = {ctx, w, y, n};
    tpool_run(ctx->pool, apply_worker, &j);
    return KVB_OK;
}

enum kvb_status mm_apply(struct mm_ctx *ctx, const struct mm_weight *w, float *y) { return mm_apply_n(ctx, &w, &y, 1); }

enum kvb_status mm_matmul(struct mm_ctx *ctx, const struct mm_weight *w, const float *x, int64_t n_tok, float *y)
{
    if (!w) return KVB_ERR_INVALID_ARG;
    KVB_FORWARD_IF_ERROR(mm_set_input(ctx, x, w->n_in, n_tok));
    return mm_apply(ctx, w, y);
}

struct pack_job {
    const struct mm_kernels *k;
    const struct mm_weight *w;
    uint8_t *dst;
};

static void pack_worker(void *arg, int ith, int nth)
{
    struct pack_job *j = arg;
    /* Whole grains: a packed form may interleave the rows of a grain. */
    int64_t grains = (j->w->n_out + ROW_GRAIN - 1) / ROW_GRAIN;
    int64_t r0 = grains * ith / nth * ROW_GRAIN, r1 = grains * (ith + 1) / nth * ROW_GRAIN;
    if (r1 > j->w->n_out) r1 = j->w->n_out;
    if (r0 < r1) j->k->pack_rows(j->w, r0, r1, j->dst + (size_t)r0 * j->w->row_bytes);
}

enum kvb_status mm_pack_weight(struct mm_ctx *ctx, const struct mm_weight *w, struct mm_weight *out, void **owned)
{
    if (!ctx || !w || !out || !owned || !w->data || w->n_out <= 0 || w->n_in <= 0) return KVB_ERR_INVALID_ARG;
    *owned = NULL;
    *out = *w;
    if (w->packed) return w->packed == ctx->k->pack_tag ? KVB_OK : KVB_ERR_INVALID_ARG;
    if (!ctx->k->packs || !ctx->k->packs(w->type) || w->n_in % 32 != 0) return KVB_OK;
    uint64_t rb;
    if (!ggml_type_row_bytes((uint32_t)w->type, (uint64_t)w->n_in, &rb) || w->row_bytes < rb)
        return KVB_ERR_INVALID_ARG;
    if (w->row_bytes != rb) return KVB_OK; /* padded rows: read as they are */
    uint8_t *buf = kvb_aligned_alloc(64, (w->row_bytes * (size_t)w->n_out + 63) & ~(size_t)63);
    if (!buf) return KVB_ERR_NOMEM;
    struct pack_job j = {ctx->k, w, buf};
    tpool_run(ctx->pool, pack_worker, &j);
    out->data = buf;
    out->packed = ctx->k->pack_tag;
    *owned = buf;
    return KVB_OK;
}
