/* model.h — a decoder-only transformer's hyperparameters and weights, read
 * from a GGUF file.
 *
 * Weights are not copied: struct mm_weight points into the GGUF mapping,
 * which struct model keeps open (owns) until model_free. The few small vectors
 * the forward pass wants as f32 (norm weights, biases) are converted into
 * buffers the model owns when the file stores them in another type.
 *
 * Architectures: one description each under src/model/arch_<name>.c (see
 * model/arch.h for what a description says); the loader resolves it into
 * the fields below, which are all the backends read. Anything else is
 * KVB_ERR_UNSUPPORTED naming the architecture. Every tensor keeps its own type
 * (files named for one quantization mix several); a type kvbatch cannot
 * compute with is refused naming the tensor. */
#ifndef KVB_MODEL_H
#define KVB_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "model/gguf.h"
#include "model/quant.h"

struct arch_desc;

/* The FFN's gate activation: down(act(gate(x)) * up(x)). */
enum model_act {
    MODEL_ACT_SILU = 0, /* x sigmoid(x): SwiGLU (llama, qwen) */
    MODEL_ACT_GELU_TANH /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GeGLU (gemma) */
};

enum rope_kind {
    ROPE_NORM = 0, /* rotate pairs (x[2i], x[2i+1]): llama as GGUF stores it */
    ROPE_NEOX      /* rotate pairs (x[i], x[i + d/2]): qwen2/qwen3 */
};

/* RoPE context extension, as `<arch>.rope.scaling.*` and the `rope_freqs`
 * tensor describe it (see model_rope.c for the definitions and where they
 * come from). The base frequency of pair i is rope_base^(-2i/rope_dim); */
enum rope_scaling {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR, /* every frequency divided by factor */
    ROPE_SCALING_YARN    /* NTK-by-parts blend of interpolated and original frequencies */
};

struct model_rope {
    enum rope_scaling type;
    float factor;               /* context extension factor (linear, yarn); 1 when none */
    int32_t orig_ctx;           /* yarn: the context before extension */
    float beta_fast, beta_slow; /* yarn: ramp bounds, in rotations over orig_ctx */
    float mscale;               /* multiplies cos and sin (yarn's attention factor); 1 otherwise */
    const float *freq_factors;  /* (rope_dim/2) divisors of each pair's frequency (Llama 3.1's
                                  rope_freqs.weight), or NULL */
};

struct model_hparams {
    int32_t n_vocab;
    int32_t n_ctx_train; /* context length the model was trained for */
    int32_t n_embd;      /* hidden size */
    int32_t n_ff;        /* feed-forward inner size */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* n_embd / n_head unless the file says otherwise */
    int32_t rope_dim; /* dimensions rotated per head (<= head_dim) */
    float rope_base;
    float rms_eps;
    enum rope_kind rope;
};

/* What the forward pass computes beyond the llama layer, resolved at load
 * from the architecture's description (model/arch.h) and the file's keys;
 * the backends consult these fields and the per-layer ones in struct
 * model_layer, never the architecture's name. Zero is the llama layer for
 * every field but the two scales, which the loader always sets. */
struct model_ops {
    enum model_act act;  /* the FFN gate's activation */
    float embd_scale;    /* token embeddings are multiplied by it (1: as stored) */
    float attn_scale;    /* scores are q.k times this (1/sqrt(head_dim) unless the architecture
                            says otherwise) */
    float attn_softcap;  /* > 0: each score s becomes c tanh(s / c) before the softmax */
    float final_softcap; /* > 0: each logit likewise */
    int32_t n_swa;       /* > 0: a windowed layer (model_layer.swa) attends at position p to the
                            positions p - n_swa < q <= p only */
    float rope_base_swa; /* RoPE base of the windowed layers, which take no RoPE scaling */
};

struct model_layer {
    bool swa;                        /* attends through the sliding window (model_ops.n_swa) */
    const float *attn_norm;          /* (n_embd) */
    struct mm_weight wq, wk, wv, wo; /* (n_head*hd, n_embd) (n_head_kv*hd, n_embd) x2, (n_embd, n_head*hd) */
    const float *bq, *bk, *bv;       /* Q/K/V biases (q_dim, kv_dim, kv_dim) or NULL */
    const float *q_norm, *k_norm;    /* RMSNorm of each Q / K head (head_dim) or NULL */
    const float *post_attn_norm;     /* (n_embd) RMSNorm of the attention output before the
                                        residual add, or NULL */
    const float *ffn_norm;           /* (n_embd) */
    struct mm_weight w_gate, w_up;   /* (n_ff, n_embd) */
    struct mm_weight w_down;         /* (n_embd, n_ff) */
    const float *post_ffn_norm;      /* (n_embd) RMSNorm of the FFN output before the residual
                                        add, or NULL */
};

struct model {
    const struct arch_desc *arch; /* the architecture's description (NULL: built by hand) */
    struct model_hparams hp;
    struct model_ops ops;
    struct gguf_file *gguf;    /* owned */
    struct mm_weight tok_embd; /* (n_vocab, n_embd): one row per token */
    const float *output_norm;  /* (n_embd) */
    struct mm_weight output;   /* (n_vocab, n_embd); == tok_embd when tied */
    bool tied_output;
    struct model_rope rope;     /* scaling of the rotary embedding (type NONE: plain RoPE) */
    int32_t n_ctx_max;          /* longest context the model is computed for: n_ctx_train, or
                                    the extended context when the RoPE is scaled */
    struct model_layer *layers; /* (n_layer), owned */
    uint64_t weight_bytes;      /* bytes of all tensors, for reports */
    char name[128];             /* general.name or the file's base name */
    char fingerprint[33];       /* 128-bit hex identity of the weights: hash of every tensor's
                                    name, type, shape and bytes, plus the hyperparameters */
    void **owned;               /* f32 conversions owned by the model */
    int n_owned;
    struct model_load_state *load; /* model_load's own, NULL once loaded */
};

/* Loads and checks the model. Every `<arch>.*` key and every tensor of the
 * file is either computed or the load fails naming it (KVB_ERR_UNSUPPORTED),
 * so a model that loads is computed as its authors compute it; metadata that
 * contradicts itself (vocabulary vs embedding rows, a context of 1, a
 * non-finite RoPE base, ...) is KVB_ERR_FORMAT naming the key. */
enum kvb_status model_load(const char *path, struct model **out, struct kvb_err *err);
void model_free(struct model *m); /* accepts NULL */

/* Every reason model_load would refuse the file at `path` (where model_load
 * stops at the first): the architecture, each key, each tensor, each weight
 * type it cannot compute with, each as one line to each(arg, why). Checks
 * that depend on an earlier one (the tensors on the shapes) are skipped when
 * it failed. Returns the number of reasons (0: the file loads), or -1 when
 * the file is not a readable GGUF (err says why). */
int model_survey(const char *path, void (*each)(void *arg, const char *why), void *arg, struct kvb_err *err);

/* The angle per position of each rotary pair, with the scaling applied:
 * fills inv_freq[0 .. rope_dim/2). Both backends rotate by
 * theta = (float)pos * inv_freq[i] and multiply cos/sin by m->rope.mscale. */
void model_rope_freqs(const struct model *m, float *inv_freq);
/* The same for the windowed layers: base ops.rope_base_swa, no scaling
 * (mscale 1), as transformers' per-layer-type RoPE computes them. */
void model_rope_freqs_swa(const struct model *m, float *inv_freq);

/* Dequantizes the embedding row of `token` into out (n_embd floats). */
enum kvb_status model_embed(const struct model *m, int32_t token, float *out);

#endif
