/* test_cuda_enc.c — the CUDA backend's encoder pass (bert), on a GPU or on
 * the emulated device (kernels/emu/emu.sh):
 *  - each kernel of k_enc.cu against its C reference, the CPU backend's own
 *    functions: kcu_enc_embed and kcu_add_layernorm against the sums of
 *    enc_cpu.c then enc_layer_norm (f32 statistics vs double: within 2e-5
 *    of a result of order one; their bf16 copy bit for bit the rounding of
 *    the f32 result), kcu_gelu_erf_bf16 against bf16(enc_gelu) (within one
 *    bf16 step: the device's erff may differ from the host's by an ulp),
 *    kcu_enc_attn against enc_attn per (sequence, head) for three sequences
 *    of 1, 13 and 40 tokens in one step, head sizes 64 and 96 (within
 *    2e-5); changing every row of the middle sequence leaves the other two
 *    bit for bit (sequences never see each other); kcu_enc_attn_bf16 is the
 *    rounding of kcu_enc_attn's result;
 *  - the backend: a BERT-shaped model (2 layers, 256 wide, 4 heads of 64,
 *    FFN 512, 128 positions, 2 token types, a [SEP] so that a pair's second
 *    text takes type 1, a one-output classifier: a cross-encoder) with F32
 *    and with F16 weights, written as llama.cpp's converter names its
 *    tensors; four sequences of 37, 5, 64 and 1 tokens in one step, all
 *    rows (BE_HIDDEN_ALL) and the last row (BE_HIDDEN_LAST): every hidden
 *    row against the CPU backend's (NMSE < 1e-3, the bar of the decoders'
 *    hidden rows in test_cuda_backend.c: the CUDA backend multiplies in
 *    bf16), mean- and cls-pooled vectors (cosine >= 0.999) and the
 *    cross-encoder's logit (pool_rank_logit, within 2 % of the logits'
 *    spread); deterministic mode: a sequence's rows bit-identical alone
 *    and beside the others; logits asked of an encoder and a sequence not
 *    starting at position 0 are refused with a message.
 *
 * Skips (77) when built without CUDA or without a usable device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/testutil.h"

#ifdef KVBATCH_HAVE_CUDA

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "cpu/be_cpu.h"
#include "cpu/enc_attn.h"
#include "cpu/enc_cpu.h"
#include "engine/pool.h"
#include "kernels/be_cuda.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "support/gguf_write.h"

static uint64_t rng_state = 2024;

/* Uniform in [-a, a). */
static float rnd_f(float a) { return a * (float)((double)(kvb_splitmix64(&rng_state) >> 11) * 0x1.0p-52 - 1.0); }

static void fill(float *x, int64_t n, float a, float mean)
{
    for (int64_t i = 0; i < n; i++) x[i] = mean + rnd_f(a);
}

#define CU(expr)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));                     \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static void *dev_put(const void *host, size_t bytes)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 1));
    if (host) CU(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    else CU(cudaMemset(d, 0, bytes ? bytes : 1));
    return d;
}

static void dev_get(void *host, const void *dev, size_t bytes)
{
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static float bf(uint16_t b) { return kvb_bf16_to_f32(b); }

static double max_abs_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

/* xb holds exactly the bf16 rounding of x. */
static bool bf16_of(const uint16_t *xb, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (xb[i] != kvb_f32_to_bf16(x[i])) return false;
    return true;
}

/* ---- kernels ---------------------------------------------------------------------------- */

static void test_embed(int32_t n_tok, int32_t n, bool types)
{
    enum { V = 20, P = 16, T = 2 };
    const float eps = 1e-12f;
    uint16_t *tok_tab = kvb_malloc(sizeof(uint16_t) * V * (size_t)n);
    float *pos_tab = kvb_malloc(sizeof(float) * P * (size_t)n), *type_tab = kvb_malloc(sizeof(float) * T * (size_t)n);
    float *w = kvb_malloc(sizeof(float) * (size_t)n), *b = kvb_malloc(sizeof(float) * (size_t)n);
    float *ref = kvb_malloc(sizeof(float) * (size_t)n_tok * n), *got = kvb_malloc(sizeof(float) * (size_t)n_tok * n);
    uint16_t *gotb = kvb_malloc(sizeof(uint16_t) * (size_t)n_tok * n);
    int32_t tok[64], pos[64], ty[64];
    for (int64_t i = 0; i < (int64_t)V * n; i++) tok_tab[i] = kvb_f32_to_bf16(rnd_f(1.0f));
    fill(pos_tab, (int64_t)P * n, 0.5f, 0);
    fill(type_tab, (int64_t)T * n, 0.5f, 0);
    fill(w, n, 0.2f, 1.0f);
    fill(b, n, 0.1f, 0);
    for (int32_t t = 0; t < n_tok; t++) {
        tok[t] = (int32_t)(kvb_splitmix64(&rng_state) % V);
        pos[t] = t % P;
        ty[t] = t > n_tok / 2;
        float *r = ref + (int64_t)t * n;
        for (int32_t i = 0; i < n; i++) { /* enc_cpu.c's embed: token, position, type, then the norm */
            r[i] = bf(tok_tab[(int64_t)tok[t] * n + i]) + pos_tab[(int64_t)pos[t] * n + i];
            if (types) r[i] += type_tab[(int64_t)ty[t] * n + i];
        }
        enc_layer_norm(r, r, w, b, n, eps);
    }
    void *d_tok_tab = dev_put(tok_tab, sizeof(uint16_t) * V * (size_t)n);
    float *d_pos = dev_put(pos_tab, sizeof(float) * P * (size_t)n),
          *d_ty = dev_put(type_tab, sizeof(float) * T * (size_t)n);
    float *d_w = dev_put(w, sizeof(float) * (size_t)n), *d_b = dev_put(b, sizeof(float) * (size_t)n);
    int32_t *d_t = dev_put(tok, sizeof tok), *d_p = dev_put(pos, sizeof pos), *d_y = dev_put(ty, sizeof ty);
    float *d_x = dev_put(NULL, sizeof(float) * (size_t)n_tok * n);
    uint16_t *d_xb = dev_put(NULL, sizeof(uint16_t) * (size_t)n_tok * n);
    CU(kcu_enc_embed(d_x, d_xb, d_tok_tab, d_pos, types ? d_ty : NULL, d_t, d_p, d_y, n_tok, n, d_w, d_b, eps, 0));
    dev_get(got, d_x, sizeof(float) * (size_t)n_tok * n);
    dev_get(gotb, d_xb, sizeof(uint16_t) * (size_t)n_tok * n);
    const double d = max_abs_diff(got, ref, (int64_t)n_tok * n);
    const bool exact_b = bf16_of(gotb, got, (int64_t)n_tok * n);
    CHECK_MSG(d <= 2e-5, "kcu_enc_embed n_tok %d n %d types %d: max |d| %.3g", n_tok, n, types, d);
    CHECK_MSG(exact_b, "kcu_enc_embed: the bf16 copy is not the rounding of the f32 result");
    printf("kcu_enc_embed n_tok %d n %d %s: max |d| vs enc_layer_norm %.3g, bf16 copy %s ok\n", n_tok, n,
           types ? "with types" : "no types", d, exact_b ? "exact" : "WRONG");
    void *dev[] = {d_tok_tab, d_pos, d_ty, d_w, d_b, d_t, d_p, d_y, d_x, d_xb};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    void *host[] = {tok_tab, pos_tab, type_tab, w, b, ref, got, gotb};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) kvb_free(host[i]);
}

static void test_add_layernorm(int32_t rows, int32_t n, bool with_y)
{
    const float eps = 1e-5f;
    const int64_t sz = (int64_t)rows * n;
    float *x = kvb_malloc(sizeof(float) * (size_t)sz), *y = kvb_malloc(sizeof(float) * (size_t)sz);
    float *ref = kvb_malloc(sizeof(float) * (size_t)sz), *got = kvb_malloc(sizeof(float) * (size_t)sz);
    float *bias = kvb_malloc(sizeof(float) * (size_t)n), *w = kvb_malloc(sizeof(float) * (size_t)n),
          *b = kvb_malloc(sizeof(float) * (size_t)n);
    uint16_t *gotb = kvb_malloc(sizeof(uint16_t) * (size_t)sz);
    fill(x, sz, 2.0f, 0.3f); /* an offset: the mean matters */
    fill(y, sz, 1.0f, 0);
    fill(bias, n, 0.2f, 0);
    fill(w, n, 0.2f, 1.0f);
    fill(b, n, 0.1f, 0);
    for (int32_t r = 0; r < rows; r++) { /* enc_cpu.c's make_residual_row */
        float *xt = ref + (int64_t)r * n;
        memcpy(xt, x + (int64_t)r * n, sizeof(float) * (size_t)n);
        if (with_y)
            for (int32_t i = 0; i < n; i++) xt[i] += y[(int64_t)r * n + i] + bias[i];
        enc_layer_norm(xt, xt, w, b, n, eps);
    }
    float *d_x = dev_put(x, sizeof(float) * (size_t)sz), *d_y = dev_put(y, sizeof(float) * (size_t)sz);
    float *d_bias = dev_put(bias, sizeof(float) * (size_t)n), *d_w = dev_put(w, sizeof(float) * (size_t)n),
          *d_b = dev_put(b, sizeof(float) * (size_t)n);
    uint16_t *d_xb = dev_put(NULL, sizeof(uint16_t) * (size_t)sz);
    CU(kcu_add_layernorm(d_x, d_xb, with_y ? d_y : NULL, with_y ? d_bias : NULL, rows, n, d_w, d_b, eps, 0));
    dev_get(got, d_x, sizeof(float) * (size_t)sz);
    dev_get(gotb, d_xb, sizeof(uint16_t) * (size_t)sz);
    const double d = max_abs_diff(got, ref, sz);
    const bool exact_b = bf16_of(gotb, got, sz);
    CHECK_MSG(d <= 2e-5, "kcu_add_layernorm rows %d n %d: max |d| %.3g", rows, n, d);
    CHECK(exact_b);
    printf("kcu_add_layernorm rows %d n %d %s: max |d| vs enc_layer_norm %.3g, bf16 copy %s ok\n", rows, n,
           with_y ? "x + y + bias" : "x alone", d, exact_b ? "exact" : "WRONG");
    void *dev[] = {d_x, d_y, d_bias, d_w, d_b, d_xb};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    void *host[] = {x, y, ref, got, bias, w, b, gotb};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) kvb_free(host[i]);
}

static void test_gelu(int32_t n_tok, int32_t n)
{
    const int64_t sz = (int64_t)n_tok * n;
    float *up = kvb_malloc(sizeof(float) * (size_t)sz), *bias = kvb_malloc(sizeof(float) * (size_t)n);
    uint16_t *got = kvb_malloc(sizeof(uint16_t) * (size_t)sz);
    fill(up, sz, 4.0f, 0);
    fill(bias, n, 0.5f, 0);
    float *d_up = dev_put(up, sizeof(float) * (size_t)sz), *d_bias = dev_put(bias, sizeof(float) * (size_t)n);
    uint16_t *d_out = dev_put(NULL, sizeof(uint16_t) * (size_t)sz);
    CU(kcu_gelu_erf_bf16(d_out, d_up, d_bias, n_tok, n, 0));
    dev_get(got, d_out, sizeof(uint16_t) * (size_t)sz);
    int64_t exact = 0, far = 0;
    for (int64_t k = 0; k < sz; k++) {
        const uint16_t r = kvb_f32_to_bf16(enc_gelu(up[k] + bias[k % n]));
        if (r == got[k]) exact++;
        else if (abs((int)(int16_t)r - (int)(int16_t)got[k]) > 1 || ((r ^ got[k]) & 0x8000)) far++;
    }
    CHECK_MSG(far == 0, "kcu_gelu_erf_bf16: %lld values more than one bf16 step from bf16(enc_gelu)", (long long)far);
    printf("kcu_gelu_erf_bf16 %d x %d: %lld/%lld exactly bf16(enc_gelu), none further than one bf16 step ok\n", n_tok,
           n, (long long)exact, (long long)sz);
    cudaFree(d_up);
    cudaFree(d_bias);
    cudaFree(d_out);
    kvb_free(up);
    kvb_free(bias);
    kvb_free(got);
}

static void test_enc_attn(int32_t n_head, int32_t hd)
{
    enum { NS = 3 };
    static const int32_t lens[NS] = {1, 13, 40};
    const int32_t n_tok = 54, e = n_head * hd;
    const int64_t ld = 3 * (int64_t)e;
    const float scale = 1.0f / sqrtf((float)hd);
    float *qkv = kvb_malloc(sizeof(float) * (size_t)(n_tok * ld));
    float *ref = kvb_malloc(sizeof(float) * (size_t)(n_tok * ld)); /* enc_attn writes at the same stride */
    float *got = kvb_malloc(sizeof(float) * (size_t)n_tok * e), *got2 = kvb_malloc(sizeof(float) * (size_t)n_tok * e);
    uint16_t *gotb = kvb_malloc(sizeof(uint16_t) * (size_t)n_tok * e);
    float *scratch = kvb_aligned_alloc(32, sizeof(float) * (size_t)enc_attn_scratch_floats(40, hd));
    int32_t lo[54], n[54];
    for (int32_t s = 0, t = 0; s < NS; s++)
        for (int32_t j = 0; j < lens[s]; j++, t++) {
            lo[t] = t - j;
            n[t] = lens[s];
        }
    fill(qkv, n_tok * ld, 2.0f, 0);
    for (int32_t s = 0, t0 = 0; s < NS; t0 += lens[s++])
        for (int32_t h = 0; h < n_head; h++) {
            const int64_t o = t0 * ld + (int64_t)h * hd;
            enc_attn(ref + o, qkv + o, qkv + o + e, qkv + o + 2 * e, ld, lens[s], hd, scale, scratch);
        }
    float *d_qkv = dev_put(qkv, sizeof(float) * (size_t)(n_tok * ld));
    int32_t *d_lo = dev_put(lo, sizeof lo), *d_n = dev_put(n, sizeof n);
    float *d_out = dev_put(NULL, sizeof(float) * (size_t)n_tok * e);
    uint16_t *d_outb = dev_put(NULL, sizeof(uint16_t) * (size_t)n_tok * e);
    CU(kcu_enc_attn(d_out, d_qkv, ld, e, 2 * e, d_lo, d_n, n_tok, n_head, hd, scale, 0));
    CU(kcu_enc_attn_bf16(d_outb, d_qkv, ld, e, 2 * e, d_lo, d_n, n_tok, n_head, hd, scale, 0));
    dev_get(got, d_out, sizeof(float) * (size_t)n_tok * e);
    dev_get(gotb, d_outb, sizeof(uint16_t) * (size_t)n_tok * e);
    double d = 0;
    for (int32_t t = 0; t < n_tok; t++) {
        const double dt = max_abs_diff(got + (int64_t)t * e, ref + t * ld, e);
        if (!(dt <= d)) d = dt;
    }
    const bool exact_b = bf16_of(gotb, got, (int64_t)n_tok * e);
    CHECK_MSG(d <= 2e-5, "kcu_enc_attn %d heads of %d: max |d| vs enc_attn %.3g", n_head, hd, d);
    CHECK(exact_b);
    /* The middle sequence changed entirely: the others' rows stay. */
    for (int64_t t = 1; t < 14; t++)
        for (int64_t i = 0; i < ld; i++) qkv[t * ld + i] = rnd_f(3.0f);
    CU(cudaMemcpy(d_qkv, qkv, sizeof(float) * (size_t)(n_tok * ld), cudaMemcpyHostToDevice));
    CU(kcu_enc_attn(d_out, d_qkv, ld, e, 2 * e, d_lo, d_n, n_tok, n_head, hd, scale, 0));
    dev_get(got2, d_out, sizeof(float) * (size_t)n_tok * e);
    const bool kept = !memcmp(got, got2, sizeof(float) * (size_t)e) &&
                      !memcmp(got + 14 * e, got2 + 14 * e, sizeof(float) * (size_t)(n_tok - 14) * e);
    const bool moved = memcmp(got + e, got2 + e, sizeof(float) * (size_t)13 * e) != 0;
    CHECK_MSG(kept && moved, "kcu_enc_attn: sequences of one step see each other (kept %d, changed %d)", kept, moved);
    printf("kcu_enc_attn %d heads of %d, sequences of 1, 13, 40 tokens: max |d| vs enc_attn %.3g, bf16 %s, "
           "other sequences' rows %s when one changes ok\n",
           n_head, hd, d, exact_b ? "exact" : "WRONG", kept ? "bit-identical" : "CHANGED");
    void *dev[] = {d_qkv, d_lo, d_n, d_out, d_outb};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    void *host[] = {qkv, ref, got, got2, gotb, scratch};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) kvb_free(host[i]);
}

/* ---- a BERT-shaped model ------------------------------------------------------------------ */

enum { E = 256, HEADS = 4, FF = 512, LAYERS = 2, NPOS = 128, VOCAB = 300, SEP = 102, BS = 16, POOL = 16 };

static enum kvb_status add_t(struct gguf_writer *w, const char *name, enum ggml_type type, int64_t n_in, int64_t n_rows,
                             float a, float mean, struct kvb_err *err)
{
    uint64_t ne[2] = {(uint64_t)n_in, (uint64_t)n_rows};
    void *data = NULL;
    enum kvb_status st = gguf_writer_add_tensor(w, name, type, n_rows > 1 ? 2 : 1, ne, NULL, &data);
    if (st != KVB_OK) return kvb_errf(err, st, "cannot add %s", name);
    for (int64_t i = 0; i < n_in * n_rows; i++) {
        const float v = mean + rnd_f(a);
        if (type == GGML_TYPE_F16) ((uint16_t *)data)[i] = kvb_f32_to_fp16(v);
        else ((float *)data)[i] = v;
    }
    return KVB_OK;
}

/* Keys and tensor names as llama.cpp's converter writes a BERT
 * cross-encoder (conversion/bert.py); matrices and embeddings of `type`,
 * 1-D tensors F32. Uniform weights of spread ~1/sqrt(n_in) (Q and K a bit
 * wider, so that attention is far from uniform). */
static enum kvb_status write_bert(const char *path, enum ggml_type type, struct kvb_err *err)
{
    struct gguf_writer *w = NULL;
    KVB_FORWARD_IF_ERROR(gguf_writer_create(&w, err));
    gguf_writer_add_str(w, "general.architecture", "bert");
    gguf_writer_add_str(w, "general.name", "kvbatch synthetic bert");
    gguf_writer_add_u32(w, "bert.block_count", LAYERS);
    gguf_writer_add_u32(w, "bert.context_length", NPOS);
    gguf_writer_add_u32(w, "bert.embedding_length", E);
    gguf_writer_add_u32(w, "bert.feed_forward_length", FF);
    gguf_writer_add_u32(w, "bert.attention.head_count", HEADS);
    gguf_writer_add_f32(w, "bert.attention.layer_norm_epsilon", 1e-12f);
    gguf_writer_add_bool(w, "bert.attention.causal", false);
    gguf_writer_add_u32(w, "bert.pooling_type", MODEL_POOL_RANK);
    gguf_writer_add_u32(w, "tokenizer.ggml.token_type_count", 2);
    gguf_writer_add_u32(w, "tokenizer.ggml.seperator_token_id", SEP);
    const float si = 1.7f / sqrtf((float)E), sf = 1.7f / sqrtf((float)FF);
    enum kvb_status st = add_t(w, "token_embd.weight", type, E, VOCAB, 1.0f, 0, err);
    if (st == KVB_OK) st = add_t(w, "position_embd.weight", type, E, NPOS, 0.5f, 0, err);
    if (st == KVB_OK) st = add_t(w, "token_types.weight", type, E, 2, 0.5f, 0, err);
    if (st == KVB_OK) st = add_t(w, "token_embd_norm.weight", GGML_TYPE_F32, E, 1, 0.2f, 1.0f, err);
    if (st == KVB_OK) st = add_t(w, "token_embd_norm.bias", GGML_TYPE_F32, E, 1, 0.1f, 0, err);
    char nm[96];
    for (int l = 0; l < LAYERS && st == KVB_OK; l++) {
#define T(name, ty, nin, nrows, a, mean)                                                                               \
    if (st == KVB_OK) st = (snprintf(nm, sizeof nm, "blk.%d." name, l), add_t(w, nm, ty, nin, nrows, a, mean, err))
        T("attn_q.weight", type, E, E, 2 * si, 0);
        T("attn_q.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
        T("attn_k.weight", type, E, E, 2 * si, 0);
        T("attn_k.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
        T("attn_v.weight", type, E, E, si, 0);
        T("attn_v.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
        T("attn_output.weight", type, E, E, si, 0);
        T("attn_output.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
        T("attn_output_norm.weight", GGML_TYPE_F32, E, 1, 0.2f, 1.0f);
        T("attn_output_norm.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
        T("ffn_up.weight", type, E, FF, si, 0);
        T("ffn_up.bias", GGML_TYPE_F32, FF, 1, 0.1f, 0);
        T("ffn_down.weight", type, FF, E, sf, 0);
        T("ffn_down.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
        T("layer_output_norm.weight", GGML_TYPE_F32, E, 1, 0.2f, 1.0f);
        T("layer_output_norm.bias", GGML_TYPE_F32, E, 1, 0.1f, 0);
#undef T
    }
    /* the classifier (one label), as the converter renames it */
    if (st == KVB_OK) st = add_t(w, "cls.output.weight", type, E, 1, si, 0, err);
    if (st == KVB_OK) st = add_t(w, "cls.output.bias", GGML_TYPE_F32, 1, 1, 0.1f, 0, err);
    if (st == KVB_OK) st = gguf_writer_write_file(w, path, err);
    gguf_writer_free(w);
    return st;
}

static struct backend *make_be(const struct model *m, bool cuda, bool det)
{
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    enum kvb_status st;
    if (cuda) {
        struct be_cuda_opts o = {.device = 0, .block_size = BS, .n_blocks = POOL, .deterministic = det};
        st = be_cuda_create(m, &o, &be, &err);
    } else {
        struct be_cpu_opts o = {.n_threads = 0, .block_size = BS, .n_blocks = POOL, .impl = MM_IMPL_AUTO};
        st = be_cpu_create(m, &o, &be, &err);
    }
    CHECK_MSG(st == KVB_OK, "%s backend: %s", cuda ? "cuda" : "cpu", err.msg);
    return st == KVB_OK ? be : NULL;
}

static double nmse(const float *got, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static double cosine(const float *a, const float *b, int64_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

/* The step: four sequences, a [SEP] in the first (a pair: type 1 after
 * it) and the third; every row of 0, 2 and 3, the last row of 1. */
enum { NSEQ = 4, ROWS = 37 + 1 + 64 + 1 };
static const int32_t LENS[NSEQ] = {37, 5, 64, 1};
static int32_t toks[NSEQ][64];
static int32_t tables[NSEQ][4];

static void make_batch(struct be_seq *s)
{
    for (int i = 0; i < NSEQ; i++) {
        for (int j = 0; j < LENS[i]; j++) toks[i][j] = 1 + (int32_t)(kvb_splitmix64(&rng_state) % (VOCAB - 1));
        for (int j = 0; j < LENS[i]; j++)
            if (toks[i][j] == SEP) toks[i][j] = SEP + 1;
        for (int b = 0; b < 4; b++) tables[i][b] = i * 4 + b;
        s[i] = (struct be_seq){.tokens = toks[i],
                               .n_tokens = LENS[i],
                               .pos = 0,
                               .block_table = tables[i],
                               .n_blocks = (LENS[i] + BS - 1) / BS,
                               .logits = i == 1 ? BE_HIDDEN_LAST : BE_HIDDEN_ALL};
    }
    toks[0][15] = SEP;
    toks[2][40] = SEP;
}

static void check_backend(const char *dir, const char *label, enum ggml_type type)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, label);
    struct kvb_err err = {{0}};
    struct model *m = NULL;
    if (write_bert(path, type, &err) != KVB_OK || model_load(path, &m, &err) != KVB_OK) {
        CHECK_MSG(0, "%s: %s", label, err.msg);
        unlink(path);
        return;
    }
    CHECK(m->ops.encoder && m->n_cls_out == 1);
    struct backend *cpu = make_be(m, false, false), *gpu = make_be(m, true, false), *det = make_be(m, true, true);
    float *hc = kvb_calloc((size_t)ROWS * E, sizeof(float)), *hg = kvb_calloc((size_t)ROWS * E, sizeof(float));
    float *h1 = kvb_calloc((size_t)64 * E, sizeof(float)), *h2 = kvb_calloc((size_t)ROWS * E, sizeof(float));
    struct be_seq s[NSEQ];
    make_batch(s);
    if (cpu && gpu && det && hc && hg && h1 && h2) {
        struct be_batch bc = {s, NSEQ, NULL, hc}, bg = {s, NSEQ, NULL, hg};
        CHECK_MSG(cpu->forward(cpu, &bc, NULL, &err) == KVB_OK, "cpu: %s", err.msg);
        CHECK_MSG(gpu->forward(gpu, &bg, NULL, &err) == KVB_OK, "cuda: %s", err.msg);
        const double all = nmse(hg, hc, (int64_t)ROWS * E);
        double worst = 0;
        for (int r = 0; r < ROWS; r++) {
            const double x = nmse(hg + (int64_t)r * E, hc + (int64_t)r * E, E);
            if (!(x <= worst)) worst = x;
        }
        CHECK_MSG(all < 1e-3 && worst < 1e-3, "%s: hidden rows NMSE %.3g (worst row %.3g)", label, all, worst);
        /* pooled as the scheduler pools: mean of a sequence's rows, its first row */
        double cmin_mean = 1, cmin_cls = 1, dlogit = 0, spread = 0;
        int64_t r0 = 0;
        for (int i = 0; i < NSEQ; i++) {
            const int64_t nr = s[i].logits == BE_HIDDEN_ALL ? LENS[i] : 1;
            float mc[E], mg[E];
            for (int k = 0; k < E; k++) {
                double a = 0, b = 0;
                for (int64_t r = 0; r < nr; r++) {
                    a += hc[(r0 + r) * E + k];
                    b += hg[(r0 + r) * E + k];
                }
                mc[k] = (float)(a / (double)nr);
                mg[k] = (float)(b / (double)nr);
            }
            const double cm = cosine(mg, mc, E), cc = cosine(hg + r0 * E, hc + r0 * E, E);
            if (cm < cmin_mean) cmin_mean = cm;
            if (s[i].logits == BE_HIDDEN_ALL && cc < cmin_cls) cmin_cls = cc;
            float zc = 0, zg = 0;
            CHECK(pool_rank_logit(m, hc + r0 * E, &zc, &err) == KVB_OK);
            CHECK(pool_rank_logit(m, hg + r0 * E, &zg, &err) == KVB_OK);
            if (fabs(zc - zg) > dlogit) dlogit = fabs(zc - zg);
            if (fabs(zc) > spread) spread = fabs(zc);
            r0 += nr;
        }
        CHECK_MSG(cmin_mean >= 0.999 && cmin_cls >= 0.999, "%s: pooled cosine mean %.7f cls %.7f", label, cmin_mean,
                  cmin_cls);
        CHECK_MSG(dlogit <= 0.02 * (spread > 1 ? spread : 1), "%s: cross-encoder logit differs by %.3g", label, dlogit);
        printf("%s: %d hidden rows of 4 sequences (37 all, 5 last, 64 all, 1 all) vs cpu: NMSE %.3g, worst row %.3g; "
               "pooled cosine min mean %.7f cls %.7f; cross-encoder logit max |d| %.3g (|logit| up to %.3g) ok\n",
               label, ROWS, all, worst, cmin_mean, cmin_cls, dlogit, spread);

        /* deterministic mode: the 64-token sequence alone and in the step */
        struct be_seq one = s[2];
        struct be_batch b1 = {&one, 1, NULL, h1}, b2 = {s, NSEQ, NULL, h2};
        CHECK_MSG(det->forward(det, &b1, NULL, &err) == KVB_OK, "det alone: %s", err.msg);
        CHECK_MSG(det->forward(det, &b2, NULL, &err) == KVB_OK, "det mixed: %s", err.msg);
        const bool same = !memcmp(h1, h2 + (int64_t)(37 + 1) * E, sizeof(float) * 64 * E);
        CHECK_MSG(same, "%s: deterministic mode: a sequence's rows change beside others", label);
        printf("%s: deterministic mode, 64-token sequence alone and beside 3 others: %s ok\n", label,
               same ? "bit-identical" : "DIFFERENT");

        /* what an encoder refuses */
        struct be_seq bad = s[1];
        bad.logits = BE_LOGITS_LAST;
        struct be_batch bb = {&bad, 1, NULL, h1};
        float lg[VOCAB];
        CHECK(gpu->forward(gpu, &bb, lg, &err) == KVB_ERR_INVALID_ARG && strstr(err.msg, "no head"));
        printf("%s: logits asked: %s\n", label, err.msg);
        bad.logits = BE_HIDDEN_LAST;
        bad.pos = 3;
        CHECK(gpu->forward(gpu, &bb, NULL, &err) == KVB_ERR_INVALID_ARG && strstr(err.msg, "whole sequences"));
        printf("%s: position 3: %s\n", label, err.msg);
        /* no KV pool behind the blocks */
        uint8_t blk[16];
        CHECK(gpu->kv_block_read(gpu, 0, blk) == KVB_ERR_INVALID_ARG);
    }
    be_free(cpu);
    be_free(gpu);
    be_free(det);
    kvb_free(hc);
    kvb_free(hg);
    kvb_free(h1);
    kvb_free(h2);
    model_free(m);
    unlink(path);
}

int main(void)
{
    char why[256];
    if (!be_cuda_available(0, why, sizeof why)) tu_skip(why);
    printf("device 0: %s\n", why);

    test_embed(7, 300, true);
    test_embed(5, 768, false);
    test_add_layernorm(5, 300, true);
    test_add_layernorm(3, 1024, true);
    test_add_layernorm(2, 256, false);
    test_gelu(3, 700);
    test_enc_attn(4, 64);
    test_enc_attn(2, 96);

    char dir[] = "/tmp/kvb_cuda_enc_XXXXXX";
    if (!mkdtemp(dir)) tu_skip("cannot make a temporary directory");
    check_backend(dir, "bert-f32", GGML_TYPE_F32);
    check_backend(dir, "bert-f16", GGML_TYPE_F16);
    rmdir(dir);
    return tu_finish();
}

#else

int main(void) { tu_skip("built without CUDA (configure with -DKVBATCH_CUDA=ON)"); }

#endif
