/* synth.c — random but well-scaled llama-family GGUF models (see synth.h).
 *
 * Quantized blocks are random bytes whose scale fields are then set so that
 * every weight type yields matrices of about the same spread (standard
 * deviation ~ 1/sqrt(n_in)); the forward pass then keeps activations of
 * order one through any number of layers, whatever the type mix. */
#include "support/synth.h"
#include "base/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "support/gguf_write.h"

void synth_opts_default(struct synth_opts *o)
{
    memset(o, 0, sizeof *o);
    o->arch = "llama";
    o->n_layer = 2;
    o->n_embd = 64;
    o->n_ff = 128;
    o->n_head = 4;
    o->n_head_kv = 2;
    o->n_ctx = 2048;
    o->matrix_type = GGML_TYPE_Q8_0;
    o->embd_type = GGML_TYPE_Q8_0;
    o->norm_type = GGML_TYPE_F32;
    o->tied_output = 1;
    o->seed = 1;
}

struct rng {
    uint64_t s;
};

/* splitmix64: plenty for test weights, identical on every machine */
static uint64_t rnd(struct rng *r) { return kvb_splitmix64(&r->s); }

/* Uniform in [-1, 1). */
static float rnd_sym(struct rng *r) { return (float)((double)(rnd(r) >> 11) * 0x1.0p-52 - 1.0); }

static void put_half(uint8_t *p, float v)
{
    uint16_t h = kvb_f32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Fills n_rows rows of n_in elements of `type` with values of spread sigma. */
static enum kvb_status fill_tensor(uint8_t *dst, enum ggml_type type, int64_t n_in, int64_t n_rows, float sigma,
                                   float mean, struct rng *r)
{
    const struct ggml_type_traits *tr = ggml_type_get_traits(type);
    if (!tr) return KVB_ERR_UNSUPPORTED;
    const int64_t n = n_in * n_rows;
    const float u = sigma * 1.7320508f; /* uniform on [-u, u] has std sigma */
    switch (type) {
    case GGML_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            float v = mean + u * rnd_sym(r);
            memcpy(dst + 4 * i, &v, 4);
        }
        return KVB_OK;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) put_half(dst + 2 * i, mean + u * rnd_sym(r));
        return KVB_OK;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t b = kvb_f32_to_bf16(mean + u * rnd_sym(r));
            memcpy(dst + 2 * i, &b, 2);
        }
        return KVB_OK;
    default: break;
    }
    const int64_t n_blocks = n / tr->block_elems;
    for (int64_t i = 0; i < n_blocks * (int64_t)tr->block_bytes; i += 8) {
        uint64_t v = rnd(r);
        memcpy(dst + i, &v, (size_t)(n_blocks * tr->block_bytes - i < 8 ? n_blocks * tr->block_bytes - i : 8));
    }
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *p = dst + b * tr->block_bytes;
        /* Divisors: the standard deviation of the block's integer codes. */
        switch (type) {
        case GGML_TYPE_Q4_0: put_half(p, sigma / 4.6f); break;
        case GGML_TYPE_Q4_1:
            put_half(p, sigma / 4.6f);
            put_half(p + 2, -7.5f * sigma / 4.6f);
            break;
        case GGML_TYPE_Q5_0: put_half(p, sigma / 9.2f); break;
        case GGML_TYPE_Q5_1:
            put_half(p, sigma / 9.2f);
            put_half(p + 2, -15.5f * sigma / 9.2f);
            break;
        case GGML_TYPE_Q8_0: put_half(p, sigma / 74.0f); break;
        case GGML_TYPE_Q4_K: {
            /* w = d*sc*q - dmin*m with q in 0..15, sc and m in 0..63. */
            float d = sigma / (32.0f * 4.6f);
            put_half(p, d);
            put_half(p + 2, d * 7.5f);
            break;
        }
        case GGML_TYPE_Q6_K: put_half(p + 208, sigma / (18.5f * 64.0f)); break;
        default: return KVB_ERR_UNSUPPORTED;
        }
    }
    (void)mean;
    return KVB_OK;
}

static enum kvb_status add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type, int64_t n_in,
                                  int64_t n_rows, float sigma, float mean, struct rng *r, struct kvb_err *err)
{
    uint64_t ne[2] = {(uint64_t)n_in, (uint64_t)n_rows};
    void *data = NULL;
    enum kvb_status st = gguf_writer_add_tensor(w, name, type, n_rows > 1 ? 2 : 1, ne, NULL, &data);
    if (st != KVB_OK) return kvb_errf(err, st, "synth: cannot add tensor '%s'", name);
    st = fill_tensor(data, type, n_in, n_rows, sigma, mean, r);
    if (st != KVB_OK) return kvb_errf(err, st, "synth: cannot fill '%s' of type %u", name, (unsigned)type);
    return KVB_OK;
}

/* GPT-2's byte-level alphabet: printable bytes stand for themselves, the
 * others are shifted to U+0100 and up, so every byte is one visible char. */
static void byte_token(int b, char out[4])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static enum kvb_status add_vocab(struct gguf_writer *w)
{
    enum { N = 259 };
    static const char *specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    char bytes[256][4];
    const char *toks[N];
    int32_t types[N];
    for (int b = 0; b < 256; b++) {
        byte_token(b, bytes[b]);
        toks[b] = bytes[b];
        types[b] = 1;
    }
    for (int i = 0; i < 3; i++) {
        toks[256 + i] = specials[i];
        types[256 + i] = 3;
    }
    gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_add_str(w, "tokenizer.ggml.pre", "gpt-2");
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, N);
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_VTYPE_INT32, types, N);
    gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
    gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 256);
    gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 258);
    gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    return gguf_writer_add_str(w, "tokenizer.chat_template",
                               "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                               "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                               "{{ '<|im_start|>assistant\n' }}{% endif %}");
}

enum kvb_status synth_model_write(const char *path, const struct synth_opts *o, struct kvb_err *err)
{
    const int32_t hd = o->head_dim > 0 ? o->head_dim : o->n_embd / o->n_head;
    const int64_t e = o->n_embd, q = (int64_t)o->n_head * hd, kv = (int64_t)o->n_head_kv * hd;
    const int64_t n_vocab = 259;
    if (o->n_layer <= 0 || o->n_embd <= 0 || o->n_head <= 0 || o->n_head_kv <= 0 || o->n_head % o->n_head_kv)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "synth: implausible shape");
    struct gguf_writer *w = NULL;
    KVB_FORWARD_IF_ERROR(gguf_writer_create(&w, err));
    struct rng r = {o->seed};
    char key[128];
    const char *a = o->arch ? o->arch : "llama";
    gguf_writer_add_str(w, "general.architecture", a);
    gguf_writer_add_str(w, "general.name", "kvbatch synthetic test model");
#define KEY(s) (snprintf(key, sizeof key, "%s." s, a), key)
    gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)o->n_layer);
    gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)(o->n_ctx > 0 ? o->n_ctx : 2048));
    gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)o->n_embd);
    gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)o->n_ff);
    gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)o->n_head);
    gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)o->n_head_kv);
    gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)hd);
    gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    gguf_writer_add_f32(w, KEY("rope.freq_base"), 10000.0f);
    gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    const bool gemma2 = !strcmp(a, "gemma2"), gemma3 = !strcmp(a, "gemma3");
    if ((gemma2 || gemma3) && o->n_swa > 0) gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)o->n_swa);
    if (gemma2 && o->attn_softcap > 0) gguf_writer_add_f32(w, KEY("attn_logit_softcapping"), o->attn_softcap);
    if ((gemma2 || gemma3) && o->final_softcap > 0)
        gguf_writer_add_f32(w, KEY("final_logit_softcapping"), o->final_softcap);
#undef KEY
    enum kvb_status st = add_vocab(w);
    const bool bias = !strcmp(a, "qwen2"), qk_norm = !strcmp(a, "qwen3") || gemma3, post = gemma2 || gemma3;
    if (st == KVB_OK) st = add_tensor(w, "token_embd.weight", o->embd_type, e, n_vocab, 1.0f, 0, &r, err);
    if (st == KVB_OK) st = add_tensor(w, "output_norm.weight", o->norm_type, e, 1, 0.1f, 1.0f, &r, err);
    if (st == KVB_OK && !o->tied_output && !gemma2) /* gemma2's output is always the embedding */
        st = add_tensor(w, "output.weight", o->embd_type, e, n_vocab, 1.0f / sqrtf((float)e), 0, &r, err);
    for (int l = 0; l < o->n_layer && st == KVB_OK; l++) {
        enum ggml_type mt =
            o->layer_types && o->n_layer_types > 0 ? o->layer_types[l % o->n_layer_types] : o->matrix_type;
        const float si = 1.0f / sqrtf((float)e), sf = 1.0f / sqrtf((float)o->n_ff), sq = 1.0f / sqrtf((float)q);
        char nm[96];
#define T(name, type, nin, nrows, sigma, mean)                                                                         \
    if (st == KVB_OK)                                                                                                  \
    st = (snprintf(nm, sizeof nm, "blk.%d." name, l), add_tensor(w, nm, type, nin, nrows, sigma, mean, &r, err))
        T("attn_norm.weight", o->norm_type, e, 1, 0.1f, 1.0f);
        T("attn_q.weight", mt, e, q, si, 0);
        T("attn_k.weight", mt, e, kv, si, 0);
        T("attn_v.weight", mt, e, kv, si, 0);
        T("attn_output.weight", mt, q, e, sq, 0);
        if (bias) {
            T("attn_q.bias", GGML_TYPE_F32, q, 1, 0.1f, 0);
            T("attn_k.bias", GGML_TYPE_F32, kv, 1, 0.1f, 0);
            T("attn_v.bias", GGML_TYPE_F32, kv, 1, 0.1f, 0);
        }
        if (qk_norm) {
            T("attn_q_norm.weight", o->norm_type, hd, 1, 0.1f, 1.0f);
            T("attn_k_norm.weight", o->norm_type, hd, 1, 0.1f, 1.0f);
        }
        if (post) {
            T("post_attention_norm.weight", o->norm_type, e, 1, 0.1f, 1.0f);
            T("post_ffw_norm.weight", o->norm_type, e, 1, 0.1f, 1.0f);
        }
        T("ffn_norm.weight", o->norm_type, e, 1, 0.1f, 1.0f);
        T("ffn_gate.weight", mt, e, o->n_ff, si, 0);
        T("ffn_up.weight", mt, e, o->n_ff, si, 0);
        T("ffn_down.weight", mt, o->n_ff, e, sf, 0);
#undef T
    }
    if (st == KVB_OK) st = gguf_writer_write_file(w, path, err);
    gguf_writer_free(w);
    return st;
}
