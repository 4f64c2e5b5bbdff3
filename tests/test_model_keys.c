/* test_model_keys.c — a model that loads is computed as its authors compute
 * it (model_check.c, model_rope.c). For each GGUF key or tensor that would
 * change the arithmetic of a llama/qwen2/qwen3 forward pass, a file that
 * carries it (written from a small synthetic model) is refused with a
 * message naming the key and its value; metadata that contradicts itself
 * is refused naming the key; the value that leaves the arithmetic alone is
 * accepted and gives the very same logits; the RoPE scalings kvbatch
 * computes load with the parameters the file gives. phi3, granite and olmo2
 * files: what each requires and refuses, and LongRoPE's factor set and
 * fingerprint following the run's context (model_set_ctx). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "cpu/be_cpu.h"
#include "engine/gen.h"
#include "model/model.h"
#include "support/gguf_write.h"
#include "support/synth.h"
#include "support/testutil.h"

static char dir[256], good[512], bad[512];

/* One change to a copy of `good`: set (or replace) keys, drop a key, add a
 * tensor, or poke one float of a tensor. */
struct edit {
    const char *key[3]; /* keys set, with val[i] */
    struct gguf_value val[3];
    const char *drop;         /* a key removed */
    const char *drop_tensors; /* tensors whose name holds this are left out */
    int tokens_delta;         /* tokenizer.ggml.tokens shortened (<0) or lengthened (>0) */
    const char *add_tensor;   /* an extra F32 tensor of add_n values add_fill */
    int64_t add_n;
    float add_fill;
    const char *poke_tensor; /* an F32 tensor whose element 0 becomes poke_value */
    float poke_value;
};

#define U32(x)                                                                                                         \
    {                                                                                                                  \
        .type = GGUF_VTYPE_UINT32, .v.u64 = (x)                                                                        \
    }
#define F32(x)                                                                                                         \
    {                                                                                                                  \
        .type = GGUF_VTYPE_FLOAT32, .v.f64 = (x)                                                                       \
    }
#define I32(x)                                                                                                         \
    {                                                                                                                  \
        .type = GGUF_VTYPE_INT32, .v.i64 = (x)                                                                         \
    }
#define BOOL(x)                                                                                                        \
    {                                                                                                                  \
        .type = GGUF_VTYPE_BOOL, .v.b = (x)                                                                            \
    }
#define STR(s)                                                                                                         \
    {                                                                                                                  \
        .type = GGUF_VTYPE_STRING, .v.str = { sizeof(s) - 1, s }                                                       \
    }

static bool is_set(const struct edit *e, const char *key)
{
    for (int i = 0; i < 3; i++)
        if (e->key[i] && !strcmp(e->key[i], key)) return true;
    return false;
}

static void write_tokens(struct gguf_writer *w, const struct gguf_kv *kv, int delta)
{
    const uint64_t n = kv->val.v.arr.n, nn = (uint64_t)((int64_t)n + delta);
    char **s = kvb_calloc(nn, sizeof *s);
    for (uint64_t i = 0; i < nn; i++) {
        if (i < n) {
            const struct gguf_str *t = &kv->val.v.arr.items[i].v.str;
            s[i] = kvb_malloc(t->len + 1);
            memcpy(s[i], t->ptr, t->len);
            s[i][t->len] = 0;
        } else {
            s[i] = kvb_malloc(32);
            snprintf(s[i], 32, "[PAD%llu]", (unsigned long long)i);
        }
    }
    CHECK(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)s, nn) == KVB_OK);
    for (uint64_t i = 0; i < nn; i++) kvb_free(s[i]);
    kvb_free(s);
}

static void rewrite(const char *src, const char *dst, const struct edit *e)
{
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    CHECK(gguf_open(src, &f, NULL) == KVB_OK);
    CHECK(gguf_writer_create(&w, NULL) == KVB_OK);
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if ((e->drop && !strcmp(key, e->drop)) || is_set(e, key)) continue;
        if (e->tokens_delta && !strcmp(key, "tokenizer.ggml.tokens")) write_tokens(w, kv, e->tokens_delta);
        else CHECK(gguf_writer_add_value(w, key, &kv->val) == KVB_OK);
    }
    for (int i = 0; i < 3; i++)
        if (e->key[i]) CHECK_MSG(gguf_writer_add_value(w, e->key[i], &e->val[i]) == KVB_OK, "%s", e->key[i]);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (e->drop_tensors && strstr(name, e->drop_tensors)) continue;
        void *data = NULL;
        CHECK(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, &data) == KVB_OK);
        if (e->poke_tensor && !strcmp(name, e->poke_tensor) && t->type == GGML_TYPE_F32 && data)
            memcpy(data, &e->poke_value, sizeof(float));
    }
    if (e->add_tensor) {
        float *v = kvb_malloc(sizeof(float) * (size_t)e->add_n);
        for (int64_t i = 0; i < e->add_n; i++) v[i] = e->add_fill;
        const uint64_t ne[1] = {(uint64_t)e->add_n};
        CHECK(gguf_writer_add_tensor(w, e->add_tensor, GGML_TYPE_F32, 1, ne, v, NULL) == KVB_OK);
        kvb_free(v);
    }
    struct kvb_err err = {{0}};
    CHECK_MSG(gguf_writer_write_file(w, dst, &err) == KVB_OK, "%s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
}

static int n_refused;

/* The edited file is refused with status `want` and a message holding each phrase. */
static void refused(const struct edit *e, enum kvb_status want, const char *phrase, const char *phrase2)
{
    rewrite(good, bad, e);
    struct model *m = NULL;
    struct kvb_err err = {{0}};
    enum kvb_status st = model_load(bad, &m, &err);
    CHECK_MSG(st == want, "'%s': status %s, expected %s (%s)", phrase, kvb_strerror(st), kvb_strerror(want), err.msg);
    CHECK_MSG(strstr(err.msg, phrase) != NULL, "message '%s' lacks '%s'", err.msg, phrase);
    if (phrase2) CHECK_MSG(strstr(err.msg, phrase2) != NULL, "message '%s' lacks '%s'", err.msg, phrase2);
    printf("refused: %s\n", err.msg);
    n_refused++;
    model_free(m);
}

static float *logits_of(const char *path, struct model **keep)
{
    struct model *m = NULL;
    struct kvb_err err = {{0}};
    if (model_load(path, &m, &err) != KVB_OK) {
        CHECK_MSG(0, "%s: %s", path, err.msg);
        return NULL;
    }
    struct be_cpu_opts o = {.n_threads = 2, .block_size = 16, .n_blocks = 8, .impl = MM_IMPL_AUTO};
    struct backend *be = NULL;
    CHECK_MSG(be_cpu_create(m, &o, &be, &err) == KVB_OK, "%s", err.msg);
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 53 + 7) % m->hp.n_vocab;
    float *out = kvb_malloc(sizeof(float) * (size_t)m->hp.n_vocab * N);
    struct gen_ctx *g = NULL;
    CHECK(gen_create(m, be, 128, 512, &g, &err) == KVB_OK);
    CHECK_MSG(gen_feed(g, ids, N, out, &err) == KVB_OK, "%s", err.msg);
    gen_free(g);
    be_free(be);
    if (keep) *keep = m;
    else model_free(m);
    return out;
}

/* The fingerprint of a file that must load. */
static const char *fingerprint_of(const char *path)
{
    static char fp[33];
    struct model *m = NULL;
    struct kvb_err err = {{0}};
    fp[0] = 0;
    CHECK_MSG(model_load(path, &m, &err) == KVB_OK, "%s: %s", path, err.msg);
    if (m) memcpy(fp, m->fingerprint, sizeof fp);
    model_free(m);
    return fp;
}

/* The edited file loads and computes exactly what the original does. */
static void accepted_same(const struct edit *e, const char *label, const float *ref, size_t n)
{
    rewrite(good, bad, e);
    float *got = logits_of(bad, NULL);
    CHECK_MSG(got && memcmp(got, ref, n * sizeof(float)) == 0, "%s: logits differ from the plain model", label);
    kvb_free(got);
}

static void test_refused_keys(void)
{
    /* RoPE variants kvbatch does not compute. */
    refused(&(struct edit){.key = {"llama.rope.scaling.type"}, .val = {STR("longrope")}}, KVB_ERR_UNSUPPORTED,
            "llama.rope.scaling.type", "longrope");
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.yarn_ext_factor"},
                           .val = {STR("yarn"), F32(4), F32(0.5)}},
            KVB_ERR_UNSUPPORTED, "llama.rope.scaling.yarn_ext_factor", "0.5");
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.yarn_log_multiplier"},
                           .val = {STR("yarn"), F32(4), F32(0.1)}},
            KVB_ERR_UNSUPPORTED, "llama.rope.scaling.yarn_log_multiplier", "0.1");
    refused(&(struct edit){.key = {"llama.rope.dimension_count"}, .val = {U32(8)}}, KVB_ERR_UNSUPPORTED,
            "llama.rope.dimension_count", "= 8");
    refused(&(struct edit){.key = {"llama.attention.value_length"}, .val = {U32(32)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.value_length", "= 32");
    /* Windowing, capping, multipliers, other attention. */
    refused(&(struct edit){.key = {"llama.attention.sliding_window"}, .val = {U32(256)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.sliding_window", "= 256");
    refused(&(struct edit){.key = {"llama.attention.sliding_window_pattern"}, .val = {U32(2)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.sliding_window_pattern", "= 2");
    refused(&(struct edit){.key = {"llama.attn_logit_softcapping"}, .val = {F32(50)}}, KVB_ERR_UNSUPPORTED,
            "llama.attn_logit_softcapping", "50");
    refused(&(struct edit){.key = {"llama.final_logit_softcapping"}, .val = {F32(30)}}, KVB_ERR_UNSUPPORTED,
            "llama.final_logit_softcapping", "30");
    refused(&(struct edit){.key = {"llama.logit_scale"}, .val = {F32(0.5)}}, KVB_ERR_UNSUPPORTED, "llama.logit_scale",
            "0.5");
    refused(&(struct edit){.key = {"llama.embedding_scale"}, .val = {F32(12)}}, KVB_ERR_UNSUPPORTED,
            "llama.embedding_scale", "12");
    refused(&(struct edit){.key = {"llama.residual_scale"}, .val = {F32(0.25)}}, KVB_ERR_UNSUPPORTED,
            "llama.residual_scale", "0.25");
    refused(&(struct edit){.key = {"llama.attention.scale"}, .val = {F32(0.125)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.scale", "0.125");
    refused(&(struct edit){.key = {"llama.attention.causal"}, .val = {BOOL(false)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.causal", "false");
    refused(&(struct edit){.key = {"llama.use_parallel_residual"}, .val = {BOOL(true)}}, KVB_ERR_UNSUPPORTED,
            "llama.use_parallel_residual", "true");
    /* Experts without a count of experts per token: no routing to compute. */
    refused(&(struct edit){.key = {"llama.expert_count"}, .val = {U32(8)}}, KVB_ERR_FORMAT, "llama.expert_used_count",
            "llama.expert_count");
    refused(&(struct edit){.key = {"llama.attention.max_alibi_bias"}, .val = {F32(8)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.max_alibi_bias", "8");
    refused(&(struct edit){.key = {"llama.attention.clamp_kqv"}, .val = {F32(8)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.clamp_kqv", "8");
    refused(&(struct edit){.key = {"llama.attention.temperature_length"}, .val = {U32(8192)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.temperature_length", "8192");
    refused(&(struct edit){.key = {"llama.rope.freq_base_swa"}, .val = {F32(10000)}}, KVB_ERR_UNSUPPORTED,
            "llama.rope.freq_base_swa", "10000");
    refused(&(struct edit){.key = {"split.count"}, .val = {U32(3)}}, KVB_ERR_UNSUPPORTED, "split.count", "3");
    /* A mixture of experts (Mixtral: llama.expert_count 8) is computed from
     * its experts' tensors: a file that says so and has only a dense FFN is
     * refused naming the first expert tensor it lacks (the router). */
    refused(&(struct edit){.key = {"llama.expert_count", "llama.expert_used_count"},
                           .val = {U32(8), U32(2)},
                           .drop_tensors = "ffn_gate.weight"},
            KVB_ERR_FORMAT, "blk.0.ffn_gate_inp.weight", "missing");
    /* Ollama's converter also writes the head size as attention.head_dim:
     * a value other than the key length is a head kvbatch does not compute. */
    refused(&(struct edit){.key = {"llama.attention.head_dim"}, .val = {U32(32)}}, KVB_ERR_UNSUPPORTED,
            "llama.attention.head_dim", "= 32");
    /* Tensors nothing reads. */
    refused(&(struct edit){.add_tensor = "blk.0.attn_output.bias", .add_n = 64}, KVB_ERR_UNSUPPORTED,
            "blk.0.attn_output.bias", NULL);
    refused(&(struct edit){.add_tensor = "blk.1.post_attention_norm.weight", .add_n = 64, .add_fill = 1},
            KVB_ERR_UNSUPPORTED, "blk.1.post_attention_norm.weight", NULL);
}

static void test_inconsistent(void)
{
    refused(&(struct edit){.key = {"llama.context_length"}, .val = {U32(0)}}, KVB_ERR_FORMAT, "llama.context_length",
            "= 0");
    refused(&(struct edit){.key = {"llama.context_length"}, .val = {U32(1)}}, KVB_ERR_FORMAT, "llama.context_length",
            "= 1");
    refused(&(struct edit){.key = {"llama.rope.dimension_count"}, .val = {U32(0)}}, KVB_ERR_FORMAT,
            "llama.rope.dimension_count", NULL);
    refused(&(struct edit){.key = {"llama.rope.freq_base"}, .val = {F32(-1)}}, KVB_ERR_FORMAT, "llama.rope.freq_base",
            "-1");
    refused(&(struct edit){.key = {"llama.rope.freq_base"}, .val = {F32(INFINITY)}}, KVB_ERR_FORMAT,
            "llama.rope.freq_base", "inf");
    refused(&(struct edit){.key = {"llama.attention.layer_norm_rms_epsilon"}, .val = {F32(NAN)}}, KVB_ERR_FORMAT,
            "llama.attention.layer_norm_rms_epsilon", "nan");
    refused(&(struct edit){.key = {"tokenizer.ggml.eos_token_id"}, .val = {U32(9999)}}, KVB_ERR_FORMAT,
            "tokenizer.ggml.eos_token_id", "9999");
    refused(&(struct edit){.key = {"llama.vocab_size"}, .val = {U32(300)}}, KVB_ERR_FORMAT, "llama.vocab_size", "300");
    refused(&(struct edit){.tokens_delta = -3}, KVB_ERR_FORMAT, "tokenizer.ggml.tokens", "256 tokens");
    refused(&(struct edit){.tokens_delta = 5}, KVB_ERR_FORMAT, "tokenizer.ggml.tokens", "264 tokens");
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor"},
                           .val = {STR("linear"), F32(-2)}},
            KVB_ERR_FORMAT, "llama.rope.scaling.factor", "-2");
    refused(&(struct edit){.add_tensor = "rope_freqs.weight", .add_n = 8, .add_fill = 0}, KVB_ERR_FORMAT,
            "rope_freqs.weight", NULL);
    refused(&(struct edit){.poke_tensor = "output_norm.weight", .poke_value = NAN}, KVB_ERR_FORMAT,
            "output_norm.weight", "non-finite");
    /* llama.cpp requires the RMS epsilon; kvbatch has no default the
     * authors share (transformers' is 1e-6, llama.cpp's fallback 1e-5). */
    refused(&(struct edit){.drop = "llama.attention.layer_norm_rms_epsilon"}, KVB_ERR_FORMAT,
            "llama.attention.layer_norm_rms_epsilon", "missing");
    /* Positive, finite parameters whose frequencies are not: pair 0 would
     * rotate by 1/1e-39 = inf per position, every logit NaN. */
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor"},
                           .val = {STR("linear"), F32(1e-39)}},
            KVB_ERR_FORMAT, "llama.rope.scaling.factor", "frequency");
    refused(&(struct edit){.add_tensor = "rope_freqs.weight", .add_n = 8, .add_fill = 1e-39f}, KVB_ERR_FORMAT,
            "rope_freqs.weight", "frequency");
    refused(&(struct edit){.key = {"llama.rope.freq_base"}, .val = {F32(1e-45)}}, KVB_ERR_FORMAT,
            "model key 'llama.rope.freq_base' = 1.4013e-45 gives", "frequency of inf");
    /* Values of the wrong type, and a factors tensor of the wrong length. */
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor"},
                           .val = {STR("linear"), STR("4")}},
            KVB_ERR_FORMAT, "llama.rope.scaling.factor", NULL);
    refused(&(struct edit){.key = {"llama.rope.scaling.type"}, .val = {U32(2)}}, KVB_ERR_FORMAT,
            "llama.rope.scaling.type", NULL);
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.original_context_length"},
                           .val = {STR("yarn"), F32(4), STR("8192")}},
            KVB_ERR_FORMAT, "llama.rope.scaling.original_context_length", NULL);
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.yarn_beta_fast"},
                           .val = {STR("yarn"), F32(4), F32(NAN)}},
            KVB_ERR_FORMAT, "llama.rope.scaling.yarn_beta_fast", "nan");
    refused(&(struct edit){.key = {"llama.rope.scaling.attn_factor"}, .val = {F32(-1)}}, KVB_ERR_FORMAT,
            "llama.rope.scaling.attn_factor", "-1");
    refused(&(struct edit){.add_tensor = "rope_freqs.weight", .add_n = 4, .add_fill = 1}, KVB_ERR_FORMAT,
            "rope_freqs.weight", "shape");
    refused(&(struct edit){.key = {"llama.context_length"}, .val = {I32(-5)}}, KVB_ERR_FORMAT, "llama.context_length",
            NULL);
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.original_context_length"},
                           .val = {STR("yarn"), F32(4), U32(4000000000u)}},
            KVB_ERR_FORMAT, "llama.rope.scaling.original_context_length", "4000000000");
    /* The factor under GGUF's first name and its current one, disagreeing. */
    refused(&(struct edit){.key = {"llama.rope.scale_linear", "llama.rope.scaling.factor"}, .val = {F32(2), F32(4)}},
            KVB_ERR_FORMAT, "llama.rope.scale_linear", "disagree");
    /* yarn without its original context falls back to the file's context
     * length (llama.cpp's rule), not to kvbatch's default when there is none. */
    refused(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor"},
                           .val = {STR("yarn"), F32(4)},
                           .drop = "llama.context_length"},
            KVB_ERR_FORMAT, "llama.rope.scaling.original_context_length", "llama.context_length");
}

static void test_neutral_and_scaled(void)
{
    struct model *m = NULL;
    float *ref = logits_of(good, &m);
    if (!ref || !m) return;
    const size_t n = (size_t)m->hp.n_vocab * 24;
    CHECK(m->rope.type == ROPE_SCALING_NONE && m->rope.mscale == 1.0f && m->n_ctx_max == m->hp.n_ctx_train);
    char fp[33];
    memcpy(fp, m->fingerprint, sizeof fp);
    model_free(m);
    accepted_same(&(struct edit){.key = {"llama.logit_scale", "llama.attention.causal", "llama.expert_count"},
                                 .val = {F32(1), BOOL(true), U32(0)}},
                  "neutral values", ref, n);
    accepted_same(
        &(struct edit){.key = {"llama.attention.sliding_window", "llama.attention.scale", "llama.tensor_data_layout"},
                       .val = {U32(2048), F32(0.25) /* 1/sqrt(16) */, STR("Meta AI original pth")}},
        "window as long as the context", ref, n);
    accepted_same(
        &(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor"}, .val = {STR("none"), F32(4)}},
        "scaling type none", ref, n);
    accepted_same(&(struct edit){.add_tensor = "rope_freqs.weight", .add_n = 8, .add_fill = 1}, "rope factors of 1",
                  ref, n);
    /* Keys other writers add that leave these architectures' arithmetic
     * alone: Ollama's attention.head_dim equal to the key length, and the
     * LayerNorm epsilon both converters copy from a config that has one
     * (llama, qwen2, qwen3 normalize with RMSNorm only). */
    accepted_same(&(struct edit){.key = {"llama.attention.head_dim", "llama.attention.layer_norm_epsilon"},
                                 .val = {U32(16), F32(1e-5)}},
                  "head_dim and layer_norm_epsilon", ref, n);
    /* A scaling by 1 is no scaling: same logits, same fingerprint as the
     * file without it (transformers: linear and yarn with factor 1 leave
     * every frequency and the attention factor at 1). */
    accepted_same(
        &(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor"}, .val = {STR("linear"), F32(1)}},
        "linear factor 1", ref, n);
    CHECK_MSG(!strcmp(fingerprint_of(bad), fp), "linear factor 1 changes the fingerprint");
    accepted_same(&(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                         "llama.rope.scaling.original_context_length"},
                                 .val = {STR("yarn"), F32(1), U32(512)}},
                  "yarn factor 1", ref, n);
    CHECK_MSG(!strcmp(fingerprint_of(bad), fp), "yarn factor 1 changes the fingerprint");

    /* The scalings kvbatch computes load with what the file says, change the
     * logits, and name themselves in the fingerprint. */
    rewrite(good, bad,
            &(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.original_context_length"},
                           .val = {STR("yarn"), F32(4), U32(512)}});
    float *yarn = logits_of(bad, &m);
    if (m) {
        CHECK(m->rope.type == ROPE_SCALING_YARN && m->rope.factor == 4.0f && m->rope.orig_ctx == 512);
        CHECK(m->rope.beta_fast == 32.0f && m->rope.beta_slow == 1.0f);
        CHECK(fabsf(m->rope.mscale - (float)(0.1 * log(4.0) + 1.0)) < 1e-6f);
        CHECK_EQ_INT(m->n_ctx_max, 2048); /* 512 x 4, no longer than the file's context */
        CHECK(strcmp(fp, m->fingerprint) != 0);
        model_free(m);
    }
    CHECK(yarn && memcmp(yarn, ref, n * sizeof(float)) != 0);
    kvb_free(yarn);
    rewrite(good, bad,
            &(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.original_context_length"},
                           .val = {STR("yarn"), F32(8), U32(1024)}});
    m = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(model_load(bad, &m, &err) == KVB_OK, "%s", err.msg);
    if (m) CHECK_EQ_INT(m->n_ctx_max, 8192);
    model_free(m);
    /* An extension past what an int32 counts is capped, not wrapped. */
    rewrite(good, bad,
            &(struct edit){.key = {"llama.rope.scaling.type", "llama.rope.scaling.factor",
                                   "llama.rope.scaling.original_context_length"},
                           .val = {STR("yarn"), F32(1e30), U32(4096)}});
    m = NULL;
    CHECK_MSG(model_load(bad, &m, &err) == KVB_OK, "%s", err.msg);
    if (m) CHECK_EQ_INT(m->n_ctx_max, INT32_MAX);
    model_free(m);
    /* Both names agreeing are one factor. */
    rewrite(good, bad,
            &(struct edit){.key = {"llama.rope.scale_linear", "llama.rope.scaling.factor"}, .val = {F32(2), F32(2)}});
    m = NULL;
    CHECK_MSG(model_load(bad, &m, &err) == KVB_OK, "%s", err.msg);
    if (m) CHECK(m->rope.type == ROPE_SCALING_LINEAR && m->rope.factor == 2.0f);
    model_free(m);
    /* A factor with no type is linear, as llama.cpp reads it. */
    rewrite(good, bad, &(struct edit){.key = {"llama.rope.scale_linear"}, .val = {F32(2)}});
    m = NULL;
    CHECK_MSG(model_load(bad, &m, &err) == KVB_OK, "%s", err.msg);
    if (m) CHECK(m->rope.type == ROPE_SCALING_LINEAR && m->rope.factor == 2.0f);
    model_free(m);
    kvb_free(ref);
}

/* The logits of `m` (loaded) over 24 tokens, on a fresh CPU backend. */
static float *logits_model(const struct model *m)
{
    struct be_cpu_opts o = {.n_threads = 2, .block_size = 16, .n_blocks = 8, .impl = MM_IMPL_AUTO};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(be_cpu_create(m, &o, &be, &err) == KVB_OK, "%s", err.msg);
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 53 + 7) % m->hp.n_vocab;
    float *out = kvb_malloc(sizeof(float) * (size_t)m->hp.n_vocab * N);
    struct gen_ctx *g = NULL;
    CHECK(gen_create(m, be, 128, 512, &g, &err) == KVB_OK);
    CHECK_MSG(gen_feed(g, ids, N, out, &err) == KVB_OK, "%s", err.msg);
    gen_free(g);
    be_free(be);
    return out;
}

/* phi3 (arch_phi3.c): partial rotary loads; LongRoPE's set follows the
 * run's context (model_set_ctx) and so does the fingerprint; its keys and
 * tensors are refused when they contradict each other. */
static void test_phi3(void)
{
    struct synth_opts so;
    synth_opts_default(&so); /* 4 heads of 16 over 2 */
    so.arch = "phi3";
    so.rope_dim = 8;
    so.longrope_orig = 64;
    so.n_ctx = 1024;
    struct kvb_err err = {{0}};
    CHECK_MSG(synth_model_write(good, &so, &err) == KVB_OK, "%s", err.msg);
    struct model *m = NULL;
    CHECK_MSG(model_load(good, &m, &err) == KVB_OK, "phi3: %s", err.msg);
    if (!m) return;
    const size_t n = (size_t)m->hp.n_vocab * 24;
    char fp_short[33], fp_long[33];
    memcpy(fp_short, m->fingerprint, sizeof fp_short);
    CHECK(m->rope.freq_factors == m->rope.factors_short && m->hp.rope_dim == 8 && m->hp.head_dim == 16);
    model_set_ctx(m, 64); /* within the original context: still short */
    CHECK(!strcmp(m->fingerprint, fp_short) && m->rope.freq_factors == m->rope.factors_short);
    float *s1 = logits_model(m);
    model_set_ctx(m, 65);
    memcpy(fp_long, m->fingerprint, sizeof fp_long);
    CHECK_MSG(strcmp(fp_long, fp_short) != 0, "the long set keeps the short set's fingerprint");
    CHECK(m->rope.freq_factors == m->rope.factors_long);
    float *l1 = logits_model(m);
    model_set_ctx(m, 4096);
    CHECK(!strcmp(m->fingerprint, fp_long));
    model_set_ctx(m, 32);
    CHECK(!strcmp(m->fingerprint, fp_short));
    float *s2 = logits_model(m);
    CHECK_MSG(memcmp(s1, s2, n * sizeof(float)) == 0, "phi3: short-set logits differ after a round trip");
    CHECK_MSG(memcmp(s1, l1, n * sizeof(float)) != 0, "phi3: the long factors change nothing");
    kvb_free(s1);
    kvb_free(s2);
    kvb_free(l1);
    model_free(m);
    CHECK_MSG(!strcmp(fingerprint_of(good), fp_short), "phi3: a load gives another fingerprint");

    refused(
        &(struct edit){.key = {"phi3.rope.scaling.type", "phi3.rope.scaling.factor"}, .val = {STR("linear"), F32(2)}},
        KVB_ERR_UNSUPPORTED, "phi3.rope.scaling.type", NULL);
    refused(&(struct edit){.drop = "phi3.rope.scaling.original_context_length"}, KVB_ERR_FORMAT,
            "phi3.rope.scaling.original_context_length", NULL);
    refused(&(struct edit){.drop_tensors = "rope_factors_short"}, KVB_ERR_FORMAT, "rope_factors_short.weight",
            "not the other");
    refused(&(struct edit){.poke_tensor = "rope_factors_long.weight", .poke_value = -1}, KVB_ERR_FORMAT,
            "rope_factors_long.weight", "positive");
    refused(&(struct edit){.key = {"phi3.attention.sliding_window_pattern"}, .val = {U32(2)}}, KVB_ERR_UNSUPPORTED,
            "phi3.attention.sliding_window_pattern", NULL);
    refused(&(struct edit){.add_tensor = "rope_freqs.weight", .add_n = 4, .add_fill = 1}, KVB_ERR_FORMAT,
            "rope_freqs.weight", "LongRoPE");
    /* Without attn_qkv the three matrices are looked for. */
    refused(&(struct edit){.drop_tensors = "attn_qkv"}, KVB_ERR_FORMAT, "blk.0.attn_q.weight", NULL);
}

/* granite (arch_granite.c) and olmo2 (arch_olmo2.c): what they require and
 * refuse; a partial rotary embedding stays refused where the architecture
 * defines none. */
static void test_granite_olmo2(void)
{
    struct synth_opts so;
    synth_opts_default(&so);
    so.arch = "granite";
    struct kvb_err err = {{0}};
    CHECK_MSG(synth_model_write(good, &so, &err) == KVB_OK, "%s", err.msg);
    struct model *m = NULL;
    CHECK_MSG(model_load(good, &m, &err) == KVB_OK, "granite: %s", err.msg);
    if (m)
        CHECK(m->ops.embd_scale == 12.0f && m->ops.attn_scale == 1.0f / 16 && m->ops.resid_scale == 0.22f &&
              m->ops.logit_div == 8.0f);
    model_free(m);
    refused(&(struct edit){.drop = "granite.logit_scale"}, KVB_ERR_FORMAT, "granite.logit_scale", "missing");
    refused(&(struct edit){.key = {"granite.logit_scale"}, .val = {F32(0)}}, KVB_ERR_FORMAT, "granite.logit_scale",
            NULL);
    refused(&(struct edit){.key = {"granite.rope.scaling.finetuned"}, .val = {BOOL(false)}}, KVB_ERR_UNSUPPORTED,
            "granite.rope.scaling.finetuned", NULL);
    refused(&(struct edit){.key = {"granite.final_logit_softcapping"}, .val = {F32(30)}}, KVB_ERR_UNSUPPORTED,
            "granite.final_logit_softcapping", NULL);
    refused(&(struct edit){.key = {"granite.rope.dimension_count"}, .val = {U32(8)}}, KVB_ERR_UNSUPPORTED,
            "granite.rope.dimension_count", "partial");

    synth_opts_default(&so);
    so.arch = "olmo2";
    CHECK_MSG(synth_model_write(good, &so, &err) == KVB_OK, "%s", err.msg);
    m = NULL;
    CHECK_MSG(model_load(good, &m, &err) == KVB_OK, "olmo2: %s", err.msg);
    if (m) CHECK(m->ops.qk_norm_whole && !m->layers[0].attn_norm && !m->layers[1].ffn_norm);
    model_free(m);
    refused(&(struct edit){.add_tensor = "blk.0.attn_norm.weight", .add_n = 64, .add_fill = 1}, KVB_ERR_UNSUPPORTED,
            "blk.0.attn_norm.weight", NULL);
    refused(&(struct edit){.drop_tensors = "blk.1.post_ffw_norm"}, KVB_ERR_FORMAT, "blk.1.post_ffw_norm.weight", NULL);
    refused(&(struct edit){.add_tensor = "blk.0.attn_q.bias", .add_n = 64}, KVB_ERR_UNSUPPORTED, "blk.0.attn_q.bias",
            NULL);
    /* OLMo 3's window: without a pattern every fourth layer is global (llama.cpp's load_swa_pattern(4)). */
    rewrite(good, bad, &(struct edit){.key = {"olmo2.attention.sliding_window"}, .val = {U32(16)}});
    m = NULL;
    CHECK_MSG(model_load(bad, &m, &err) == KVB_OK, "olmo2 with a window: %s", err.msg);
    if (m) CHECK(m->ops.n_swa == 16 && m->layers[0].swa && m->layers[1].swa && !m->ops.swa_same_rope);
    model_free(m);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvb-test-keys-XXXXXX");
    if (!mkdtemp(dir)) tu_skip("cannot make a temporary directory");
    snprintf(good, sizeof good, "%s/good.gguf", dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    struct synth_opts so;
    synth_opts_default(&so); /* 64 wide, 4 heads of 16, vocabulary 259 */
    so.norm_type = GGML_TYPE_F32;
    struct kvb_err err = {{0}};
    CHECK_MSG(synth_model_write(good, &so, &err) == KVB_OK, "%s", err.msg);
    test_refused_keys();
    test_inconsistent();
    test_neutral_and_scaled();
    test_phi3();
    test_granite_olmo2();
    printf("%d files refused, each naming its key or tensor\n", n_refused);
    unlink(good);
    unlink(bad);
    rmdir(dir);
    return tu_finish();
}
