/* test_moe.c — the mixture-of-experts FFN on the CPU (src/cpu/moe.c) and the
 * loading of MoE files (src/model/model_moe.c), on synthetic models
 * (support/synth.h) of the layouts kvbatch reads: qwen3moe, olmoe, qwen2moe
 * (with its shared expert) and Mixtral's ("llama" with experts).
 *  - the grouped layer (tokens gathered by expert, one pass over each
 *    expert's weights) is bit for bit a token-at-a-time computation written
 *    here from the definition: routing (softmax, top-k, renormalised or not),
 *    each chosen expert's SwiGLU through the public product call, the
 *    weighted sum in ascending expert id — for single tokens, a decode-sized
 *    step and a prefill-sized one, scalar and SIMD kernels;
 *  - through the backend, a sequence's logits are the same bits alone,
 *    beside other sequences in one step (other blocks, other thread counts)
 *    and fed in chunks: its output does not depend on the batch;
 *  - the SIMD path agrees with the scalar reference;
 *  - a file that says what kvbatch does not compute is refused naming the
 *    key or the tensor.
 * The transformers reference for each architecture is pytest_hf_ref.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/tpool.h"
#include "cpu/attn.h"
#include "cpu/be_cpu.h"
#include "cpu/moe.h"
#include "engine/gen.h"
#include "model/model.h"
#include "model/quant.h"
#include "support/gguf_write.h"
#include "support/synth.h"
#include "support/testutil.h"

static char dir[256];

static struct model *write_load(const char *name, const struct synth_opts *o)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    struct kvb_err err = {{0}};
    CHECK_MSG(synth_model_write(path, o, &err) == KVB_OK, "%s", err.msg);
    struct model *m = NULL;
    CHECK_MSG(model_load(path, &m, &err) == KVB_OK, "%s: %s", name, err.msg);
    return m;
}

/* qwen3moe: 16 experts of 64, top 4, renormalised. */
static void opts_qwen3moe(struct synth_opts *o, enum ggml_type t)
{
    synth_opts_default(o);
    o->arch = "qwen3moe";
    o->n_embd = 128;
    o->n_ff = 192;
    o->head_dim = 64; /* twice n_embd / n_head, as Qwen3-30B-A3B's */
    o->n_expert = 16;
    o->n_expert_used = 4;
    o->n_ff_exp = 64;
    o->matrix_type = t;
    o->embd_type = GGML_TYPE_Q8_0;
    o->router_gain = 2.0f;
}

/* ---- the layer against a token-at-a-time computation ------------------------------ */

/* Routing from its definition (transformers' routers): softmax, top k by
 * probability (ties: the lower id), renormalised when norm. */
static void ref_route(const float *logits, int32_t ne, int32_t k, bool norm, int32_t *sel, float *w)
{
    float p[256], mx = logits[0], sum = 0;
    for (int32_t i = 1; i < ne; i++) mx = fmaxf(mx, logits[i]);
    for (int32_t i = 0; i < ne; i++) sum += p[i] = expf(logits[i] - mx);
    for (int32_t i = 0; i < ne; i++) p[i] /= sum;
    bool used[256] = {false};
    float tot = 0;
    for (int32_t j = 0; j < k; j++) {
        int32_t b = -1;
        for (int32_t i = 0; i < ne; i++)
            if (!used[i] && (b < 0 || p[i] > p[b])) b = i;
        used[b] = true;
        sel[j] = b;
        tot += w[j] = p[b];
    }
    for (int32_t j = 0; j < k && norm; j++) w[j] /= tot;
}

/* Expert x's rows of a stacked matrix, as the file holds them. */
static struct mm_weight expert(const struct mm_weight *stack, int64_t x, int64_t rows)
{
    struct mm_weight v = *stack;
    v.n_out = rows;
    v.data = (const uint8_t *)stack->data + (size_t)(x * rows) * stack->row_bytes;
    return v;
}

static void ref_layer(const struct model *m, int layer, struct mm_ctx *mm, bool simd, const float *x, float *out)
{
    const struct model_layer *L = &m->layers[layer];
    const struct model_moe *mo = &m->ops.moe;
    const int64_t e = m->hp.n_embd, fe = mo->n_ff_exp;
    float logits[256], w[64], g[2048], u[2048], y[2048];
    int32_t sel[64];
    CHECK(mm_matmul(mm, &L->w_router, x, 1, logits) == KVB_OK);
    ref_route(logits, mo->n_expert, mo->n_expert_used, mo->norm_topk, sel, w);
    /* summed in ascending expert id: order the choices so */
    for (int32_t j = 1; j < mo->n_expert_used; j++)
        for (int32_t q = j; q > 0 && sel[q - 1] > sel[q]; q--) {
            int32_t s = sel[q];
            sel[q] = sel[q - 1];
            sel[q - 1] = s;
            float t = w[q];
            w[q] = w[q - 1];
            w[q - 1] = t;
        }
    for (int32_t j = 0; j < mo->n_expert_used; j++) {
        struct mm_weight wg = expert(&L->w_gate_exps, sel[j], fe), wu = expert(&L->w_up_exps, sel[j], fe);
        struct mm_weight wd = expert(&L->w_down_exps, sel[j], e);
        CHECK(mm_matmul(mm, &wg, x, 1, g) == KVB_OK);
        CHECK(mm_matmul(mm, &wu, x, 1, u) == KVB_OK);
        if (simd) attn_swiglu_avx2(g, u, fe);
        else attn_swiglu(g, u, fe);
        CHECK(mm_matmul(mm, &wd, g, 1, y) == KVB_OK);
        for (int64_t i = 0; i < e; i++) {
            const float wy = y[i] * w[j];
            out[i] = j == 0 ? wy : out[i] + wy;
        }
    }
    if (mo->n_ff_shexp > 0) { /* plus sigmoid(gate . x) times the shared expert */
        float sg;
        CHECK(mm_matmul(mm, &L->w_shexp_gate, x, 1, &sg) == KVB_OK);
        CHECK(mm_matmul(mm, &L->w_gate_shexp, x, 1, g) == KVB_OK);
        CHECK(mm_matmul(mm, &L->w_up_shexp, x, 1, u) == KVB_OK);
        if (simd) attn_swiglu_avx2(g, u, mo->n_ff_shexp);
        else attn_swiglu(g, u, mo->n_ff_shexp);
        CHECK(mm_matmul(mm, &L->w_down_shexp, g, 1, y) == KVB_OK);
        const float s = 1.0f / (1.0f + expf(-sg));
        for (int64_t i = 0; i < e; i++) {
            const float sy = y[i] * s;
            out[i] += sy;
        }
    }
}

struct rows_in {
    const float *x;
    int64_t e;
};

static void copy_row(void *arg, int64_t t, float *dst)
{
    const struct rows_in *a = arg;
    memcpy(dst, a->x + t * a->e, sizeof(float) * (size_t)a->e);
}

static void check_layer(const char *label, const struct model *m, enum mm_impl impl, bool act16)
{
    if (!mm_impl_available(impl)) return;
    struct tpool *pool = NULL;
    struct mm_ctx *mm = NULL;
    struct cpu_moe *moe = NULL;
    struct kvb_err err = {{0}};
    CHECK(tpool_create(2, &pool) == KVB_OK);
    CHECK(mm_ctx_create(pool, impl, &mm, &err) == KVB_OK);
    mm_ctx_set_act16(mm, act16); /* the reference's dense products then take 16 bits too */
    const bool simd = impl != MM_IMPL_SCALAR && attn_have_avx2();
    CHECK_MSG(cpu_moe_create(m, mm, pool, simd, &moe, &err) == KVB_OK, "%s", err.msg);
    const int64_t e = m->hp.n_embd;
    const int64_t sizes[] = {1, 3, 7, 40};
    uint64_t s = 7;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t n = sizes[si];
        float *x = kvb_malloc(sizeof(float) * (size_t)(n * e)), *got = kvb_malloc(sizeof(float) * (size_t)(n * e));
        float *want = kvb_malloc(sizeof(float) * (size_t)e);
        for (int64_t i = 0; i < n * e; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5) * 3.0f;
        }
        struct rows_in in = {x, e};
        for (int l = 0; l < m->hp.n_layer; l++) {
            CHECK_MSG(cpu_moe_forward(moe, l, n, copy_row, &in, got, &err) == KVB_OK, "%s", err.msg);
            int bad = 0;
            for (int64_t t = 0; t < n; t++) {
                ref_layer(m, l, mm, simd, x + t * e, want);
                bad += memcmp(want, got + t * e, sizeof(float) * (size_t)e) != 0;
            }
            CHECK_MSG(bad == 0, "%s (%s%s), layer %d, %lld tokens: %d tokens differ from one at a time", label,
                      mm_ctx_impl_name(mm), act16 ? ", 16-bit activations" : "", l, (long long)n, bad);
        }
        kvb_free(x);
        kvb_free(got);
        kvb_free(want);
    }
    cpu_moe_free(moe);
    mm_ctx_free(mm);
    tpool_free(pool);
}

static void test_layer_exact(void)
{
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_F16, GGML_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct synth_opts o;
        opts_qwen3moe(&o, types[i]);
        if (types[i] == GGML_TYPE_Q4_K) o.down_type = GGML_TYPE_Q6_K; /* as Q4_K_M files mix them */
        o.n_embd = types[i] == GGML_TYPE_Q4_K ? 256 : 128;
        o.n_ff_exp = types[i] == GGML_TYPE_Q4_K ? 256 : 64;
        char name[64];
        snprintf(name, sizeof name, "layer-%s", ggml_type_get_traits(types[i])->name);
        struct model *m = write_load(name, &o);
        if (!m) continue;
        CHECK_EQ_INT(m->ops.moe.n_expert, 16);
        CHECK_EQ_INT(m->ops.moe.n_expert_used, 4);
        CHECK_EQ_INT(m->ops.moe.n_ff_exp, o.n_ff_exp);
        CHECK(m->ops.moe.norm_topk);
        CHECK(m->layers[0].moe && m->layers[0].w_gate_exps.n_out == 16 * o.n_ff_exp && !m->layers[0].w_gate.data);
        check_layer(name, m, MM_IMPL_SCALAR, false);
        check_layer(name, m, MM_IMPL_AVX2, false);
        check_layer(name, m, MM_IMPL_AVX512, false);
        check_layer(name, m, MM_IMPL_SCALAR, true);
        check_layer(name, m, MM_IMPL_AUTO, true);
        model_free(m);
    }
    /* olmoe: not renormalised; every expert of 8 chosen by some token */
    struct synth_opts o;
    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.arch = "olmoe";
    o.head_dim = 0;
    o.n_ff = 96;
    o.n_ff_exp = 0;
    o.n_expert = 8;
    o.n_expert_used = 8;
    struct model *m = write_load("layer-olmoe", &o);
    if (m) {
        CHECK(!m->ops.moe.norm_topk && m->ops.qk_norm_whole && m->ops.moe.n_ff_exp == 96);
        check_layer("olmoe", m, MM_IMPL_SCALAR, false);
        check_layer("olmoe", m, MM_IMPL_AUTO, false);
        check_layer("olmoe", m, MM_IMPL_AUTO, true);
        model_free(m);
    }
    /* qwen2moe: a shared expert (Q4_0, wider than the routed ones), not renormalised */
    opts_qwen3moe(&o, GGML_TYPE_Q4_0);
    o.arch = "qwen2moe";
    o.head_dim = 0;
    o.n_ff_shexp = 320;
    m = write_load("layer-qwen2moe", &o);
    if (m) {
        CHECK(!m->ops.moe.norm_topk && m->ops.moe.n_ff_shexp == 320 && m->layers[1].w_down_shexp.n_in == 320);
        check_layer("qwen2moe", m, MM_IMPL_SCALAR, false);
        check_layer("qwen2moe", m, MM_IMPL_AUTO, false);
        check_layer("qwen2moe", m, MM_IMPL_SCALAR, true);
        check_layer("qwen2moe", m, MM_IMPL_AUTO, true);
        model_free(m);
    }
}

/* ---- through the backend ----------------------------------------------------------- */

static struct backend *make_be(const struct model *m, enum mm_impl impl, int threads)
{
    struct be_cpu_opts bo = {.n_threads = threads, .block_size = 16, .n_blocks = 64, .impl = impl};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(be_cpu_create(m, &bo, &be, &err) == KVB_OK, "%s", err.msg);
    return be;
}

static float *prompt_logits(const struct model *m, struct backend *be, const int32_t *ids, int32_t n, int chunk)
{
    float *all = kvb_malloc(sizeof(float) * (size_t)m->hp.n_vocab * (size_t)n);
    struct gen_ctx *g = NULL;
    CHECK(gen_create(m, be, 512, chunk, &g, NULL) == KVB_OK);
    CHECK(gen_feed(g, ids, n, all, NULL) == KVB_OK);
    gen_free(g);
    return all;
}

static void check_batching(const char *label, const struct model *m)
{
    int32_t ids[48], other[30], third[5];
    for (int i = 0; i < 48; i++) ids[i] = (i * 37 + 11) % 256;
    for (int i = 0; i < 30; i++) other[i] = (i * 91 + 3) % 256;
    for (int i = 0; i < 5; i++) third[i] = (i * 13 + 200) % 256;
    const int64_t nv = m->hp.n_vocab;
    struct backend *be = make_be(m, MM_IMPL_AUTO, 2);
    float *whole = prompt_logits(m, be, ids, 48, 512);
    float *chunked = prompt_logits(m, be, ids, 48, 5);
    CHECK_MSG(memcmp(whole, chunked, sizeof(float) * (size_t)(nv * 48)) == 0, "%s: chunked prefill differs", label);

    /* Beside two other sequences in one step, on other blocks, on 3 threads. */
    struct backend *be3 = make_be(m, MM_IMPL_AUTO, 3);
    int32_t tab_a[16], tab_b[16], tab_c[16];
    for (int i = 0; i < 16; i++) {
        tab_a[i] = 40 + i;
        tab_b[i] = 3 + i;
        tab_c[i] = 20 + i;
    }
    struct be_seq seqs[3] = {
        {.tokens = other, .n_tokens = 30, .pos = 0, .block_table = tab_b, .n_blocks = 16, .logits = BE_LOGITS_LAST},
        {.tokens = ids, .n_tokens = 48, .pos = 0, .block_table = tab_a, .n_blocks = 16, .logits = BE_LOGITS_ALL},
        {.tokens = third, .n_tokens = 5, .pos = 0, .block_table = tab_c, .n_blocks = 16, .logits = BE_LOGITS_LAST},
    };
    struct be_batch b = {seqs, 3, NULL, NULL};
    float *out = kvb_malloc(sizeof(float) * (size_t)(nv * 50));
    struct kvb_err err = {{0}};
    CHECK_MSG(be3->forward(be3, &b, out, &err) == KVB_OK, "%s", err.msg);
    CHECK_MSG(memcmp(whole, out + nv, sizeof(float) * (size_t)(nv * 48)) == 0, "%s: batched logits differ from alone",
              label);
    /* Decode: one token of each sequence in one step, against the sequence's
     * own next step alone. */
    int32_t next = 77;
    struct be_seq dec[3] = {
        {.tokens = &next, .n_tokens = 1, .pos = 30, .block_table = tab_b, .n_blocks = 16, .logits = BE_LOGITS_LAST},
        {.tokens = &next, .n_tokens = 1, .pos = 48, .block_table = tab_a, .n_blocks = 16, .logits = BE_LOGITS_LAST},
        {.tokens = &next, .n_tokens = 1, .pos = 5, .block_table = tab_c, .n_blocks = 16, .logits = BE_LOGITS_LAST},
    };
    struct be_batch db = {dec, 3, NULL, NULL};
    CHECK_MSG(be3->forward(be3, &db, out, &err) == KVB_OK, "%s", err.msg);
    struct be_batch one = {&dec[1], 1, NULL, NULL};
    CHECK_MSG(be3->forward(be3, &one, out + 3 * nv, &err) == KVB_OK, "%s", err.msg);
    CHECK_MSG(memcmp(out + nv, out + 3 * nv, sizeof(float) * (size_t)nv) == 0,
              "%s: a decode step's logits depend on the batch", label);

    /* The scalar reference agrees with the SIMD path. */
    struct backend *ref = make_be(m, MM_IMPL_SCALAR, 2);
    float *slow = prompt_logits(m, ref, ids, 48, 512);
    double num = 0, den = 0;
    int top = 0;
    for (int64_t t = 0; t < 48; t++) {
        int32_t a = 0, c = 0;
        for (int64_t i = 0; i < nv; i++) {
            double d = (double)whole[t * nv + i] - slow[t * nv + i];
            num += d * d;
            den += (double)slow[t * nv + i] * slow[t * nv + i];
            if (whole[t * nv + i] > whole[t * nv + a]) a = (int32_t)i;
            if (slow[t * nv + i] > slow[t * nv + c]) c = (int32_t)i;
        }
        top += a == c;
    }
    printf("%s: simd (%s) vs scalar NMSE %.3g, top-1 %d/48\n", label, be_cpu_impl_name(be), num / den, top);
    /* int8 activations re-quantized at every layer, and a routing decision
     * that a last-bit difference can flip: quantization-noise distance */
    CHECK_MSG(num / den < 3e-2, "%s: NMSE %.3g", label, num / den);
    kvb_free(slow);
    be_free(ref);
    kvb_free(out);
    kvb_free(whole);
    kvb_free(chunked);
    be_free(be);
    be_free(be3);
}

static void test_batching(void)
{
    struct synth_opts o;
    opts_qwen3moe(&o, GGML_TYPE_Q4_K);
    o.n_embd = 256;
    o.n_ff_exp = 256;
    o.down_type = GGML_TYPE_Q6_K;
    o.n_layer = 3;
    struct model *m = write_load("qwen3moe-q4k", &o);
    if (m) check_batching("qwen3moe Q4_K/Q6_K", m);
    model_free(m);

    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.arch = "olmoe";
    o.head_dim = 0;
    o.n_ff_exp = 0;
    o.n_ff = 64;
    o.n_expert = 32;
    o.n_expert_used = 8;
    m = write_load("olmoe-q8", &o);
    if (m) check_batching("olmoe Q8_0", m);
    model_free(m);

    opts_qwen3moe(&o, GGML_TYPE_F16);
    o.arch = "llama";
    o.head_dim = 0;
    o.n_ff_exp = 0;
    o.n_ff = 96;
    o.n_expert = 8;
    o.n_expert_used = 2;
    m = write_load("mixtral-f16", &o);
    if (m) {
        CHECK(m->ops.moe.norm_topk && m->ops.moe.n_ff_exp == 96);
        check_batching("mixtral F16", m);
    }
    model_free(m);

    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.arch = "qwen2moe";
    o.head_dim = 0;
    o.n_ff_shexp = 0; /* the key unwritten: feed_forward_length wide, as llama.cpp reads it */
    m = write_load("qwen2moe-q8", &o);
    if (m) {
        CHECK(m->ops.moe.n_ff_shexp == o.n_ff);
        check_batching("qwen2moe Q8_0", m);
    }
    model_free(m);
}

/* ---- refusals ------------------------------------------------------------------ */

static const char *extra_what;

static void add_extra(struct gguf_writer *w, const char *arch)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, extra_what);
    if (!strcmp(extra_what, "expert_weights_norm")) gguf_writer_add_bool(w, key, false);
    else if (!strcmp(extra_what, "expert_weights_scale")) gguf_writer_add_f32(w, key, 2.5f);
    else gguf_writer_add_u32(w, key, 2);
}

static void expect_refusal(const char *name, const struct synth_opts *o, enum kvb_status want, const char *needle)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    struct kvb_err err = {{0}};
    CHECK_MSG(synth_model_write(path, o, &err) == KVB_OK, "%s", err.msg);
    struct model *m = NULL;
    enum kvb_status st = model_load(path, &m, &err);
    CHECK_MSG(st == want && strstr(err.msg, needle), "%s: status %d, '%s' (want %d naming '%s')", name, (int)st,
              err.msg, (int)want, needle);
    model_free(m);
}

static void test_refusals(void)
{
    struct synth_opts o;
    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.n_expert = 0; /* a qwen3moe file without experts */
    expect_refusal("no-experts", &o, KVB_ERR_FORMAT, "qwen3moe.expert_count");
    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.n_expert_used = 17;
    expect_refusal("too-many-used", &o, KVB_ERR_FORMAT, "qwen3moe.expert_used_count");
    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.extra_keys = add_extra;
    extra_what = "expert_weights_norm";
    expect_refusal("norm-false", &o, KVB_ERR_UNSUPPORTED, "qwen3moe.expert_weights_norm");
    extra_what = "expert_gating_func";
    expect_refusal("sigmoid", &o, KVB_ERR_UNSUPPORTED, "qwen3moe.expert_gating_func");
    extra_what = "expert_weights_scale";
    expect_refusal("scaled", &o, KVB_ERR_UNSUPPORTED, "qwen3moe.expert_weights_scale");
    extra_what = "expert_shared_count"; /* qwen2moe's shared expert: not in these architectures */
    expect_refusal("shared", &o, KVB_ERR_UNSUPPORTED, "qwen3moe.expert_shared_count");
    /* Mixtral's experts are feed_forward_length wide: a stack of another width is named */
    opts_qwen3moe(&o, GGML_TYPE_Q8_0);
    o.arch = "llama";
    o.head_dim = 0;
    o.n_ff_exp = 32;
    expect_refusal("mixtral-width", &o, KVB_ERR_FORMAT, "blk.0.ffn_gate_exps.weight");
    /* a dense llama file that names a used count without experts */
    synth_opts_default(&o);
    o.extra_keys = add_extra;
    extra_what = "expert_used_count";
    expect_refusal("dense-used", &o, KVB_ERR_FORMAT, "llama.expert_used_count");
    /* a dense qwen3 file with experts keys: not a MoE architecture */
    synth_opts_default(&o);
    o.arch = "qwen3";
    o.extra_keys = add_extra;
    extra_what = "expert_count";
    expect_refusal("qwen3-experts", &o, KVB_ERR_UNSUPPORTED, "qwen3.expert_count");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvb_test_moe_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0) return 1;
    test_layer_exact();
    test_batching();
    test_refusals();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return tu_finish();
}
