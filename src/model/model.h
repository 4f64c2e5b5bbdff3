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
    MODEL_ACT_SILU = 0,  /* x sigmoid(x): SwiGLU (llama, qwen) */
    MODEL_ACT_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GeGLU (gemma) */
    MODEL_ACT_GELU_ERF   /* 0.5 x (1 + erf(x / sqrt(2))): BERT's ungated FFN */
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
    int32_t orig_ctx;           /* yarn, LongRoPE: the context before extension */
    float beta_fast, beta_slow; /* yarn: ramp bounds, in rotations over orig_ctx */
    float mscale;               /* multiplies cos and sin (yarn's attention factor); 1 otherwise */
    const float *freq_factors;  /* (rope_dim/2) divisors of each pair's frequency (Llama 3.1's
                                  rope_freqs.weight; LongRoPE's set in use), or NULL */
    /* LongRoPE (phi3): rope_factors_long/short.weight, (rope_dim/2) divisors each, and
       orig_ctx the context they were trained around. freq_factors is the short set unless
       model_set_ctx chose the long one (long_factors). NULL when the file has none. */
    const float *factors_long, *factors_short;
    bool long_factors;
};

/* How the model pools its final hidden states into one vector per input
 * (`<arch>.pooling_type`, numbered as llama.cpp and gguf-py number them):
 * embedding models and rerankers. NONE: the file says nothing (a
 * generative model; `run --pooling` may still pool it). RANK: a reranker,
 * its pooled state (the last token's for a causal model, the first's for
 * an encoder) goes through the classification head below. */
enum model_pooling { MODEL_POOL_NONE = 0, MODEL_POOL_MEAN, MODEL_POOL_CLS, MODEL_POOL_LAST, MODEL_POOL_RANK };

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

/* Mixture of experts: a MoE layer's FFN is n_expert SwiGLU experts (the
 * model's activation), each n_ff_exp wide, of which each token runs the
 * n_expert_used its router ranks highest. The router is a matrix of
 * n_expert rows over the FFN input; its logits go through a softmax over
 * all experts, the top n_expert_used probabilities are taken (ties: the
 * lower expert id) and, when norm_topk, divided by their sum; the FFN's
 * output is the sum of the chosen experts' outputs, each times its weight
 * (model_moe.c says which architecture does what, and where that is
 * written). */
struct model_moe {
    int32_t n_expert;      /* experts per MoE layer; 0: a dense model */
    int32_t n_expert_used; /* k, 1 <= k <= n_expert */
    int32_t n_ff_exp;      /* inner size of one expert */
    bool norm_topk;        /* the k weights are renormalised to sum to 1 */
    int32_t n_ff_shexp;    /* inner size of the shared expert, which every token runs and adds
                              times sigmoid(its gate logit) (qwen2moe); 0: none */
};

/* What the forward pass computes beyond the llama layer, resolved at load
 * from the architecture's description (model/arch.h) and the file's keys;
 * the backends consult these fields and the per-layer ones in struct
 * model_layer, never the architecture's name. Zero is the llama layer for
 * every field but the two scales, which the loader always sets. */
struct model_ops {
    enum model_act act;   /* the FFN gate's activation */
    float embd_scale;     /* token embeddings are multiplied by it (1: as stored) */
    float attn_scale;     /* scores are q.k times this (1/sqrt(head_dim) unless the architecture
                            says otherwise) */
    float attn_softcap;   /* > 0: each score s becomes c tanh(s / c) before the softmax */
    float final_softcap;  /* > 0: each logit likewise */
    int32_t n_swa;        /* > 0: a windowed layer (model_layer.swa) attends at position p to the
                            positions p - n_swa < q <= p only */
    float rope_base_swa;  /* RoPE base of the windowed layers, which take no RoPE scaling */
    float resid_scale;    /* != 0: attention and FFN outputs are multiplied by it before the
                            residual add (granite's residual_multiplier); 0: as llama (x1) */
    float logit_div;      /* != 0: logits are divided by it (the `logit_scale` key: granite's
                            logits_scaling), before any soft-cap; 0: as llama */
    bool qk_norm_whole;   /* q_norm / k_norm RMSNorm the whole Q (n_head*head_dim) and K
                            (n_head_kv*head_dim) rows, not each head (olmo2) */
    bool swa_same_rope;   /* windowed layers rotate as the global ones (phi3: one RoPE for all
                            layers); false: with rope_base_swa, unscaled (gemma3, olmo3) */
    struct model_moe moe; /* the experts of the MoE layers (model_layer.moe); n_expert 0: none */
    /* An encoder (bert): no llama layer at all — bidirectional attention
     * over the whole sequence, learned absolute position and token-type
     * embeddings, LayerNorm after each residual add, an ungated GELU FFN,
     * biases everywhere, no RoPE and no output norm or head (struct
     * model_encoder; the backends compute it apart from the llama layer). */
    bool encoder;
};

/* An encoder's tensors beyond the per-layer ones (model_ops.encoder). */
struct model_encoder {
    struct mm_weight pos_embd;  /* (n_pos, n_embd): row p is position p's */
    struct mm_weight type_embd; /* (n_types, n_embd), or data NULL */
    int32_t n_pos, n_types;
    const float *embd_norm, *embd_norm_b; /* (n_embd) LayerNorm of the summed embeddings */
    float ln_eps;                         /* `<arch>.attention.layer_norm_epsilon` */
    int32_t sep_token;                    /* positions after the first of these in a sequence are token type 1
                          (a pair's second text, as a BERT tokenizer marks it); -1: all 0 */
};

struct model_layer {
    bool swa;                        /* attends through the sliding window (model_ops.n_swa) */
    const float *attn_norm;          /* (n_embd), or NULL: attention reads the residual stream as
                                        it is (olmo2, which norms only after) */
    struct mm_weight wq, wk, wv, wo; /* (n_head*hd, n_embd) (n_head_kv*hd, n_embd) x2, (n_embd, n_head*hd) */
    const float *bq, *bk, *bv;       /* Q/K/V biases (q_dim, kv_dim, kv_dim) or NULL */
    const float *q_norm, *k_norm;    /* RMSNorm of each Q / K head (head_dim), or of the whole
                                        rows (q_dim, kv_dim: model_ops.qk_norm_whole), or NULL */
    const float *post_attn_norm;     /* (n_embd) RMSNorm of the attention output before the
                                        residual add, or NULL */
    const float *ffn_norm;           /* (n_embd), or NULL as attn_norm */
    struct mm_weight w_gate, w_up;   /* (n_ff, n_embd); rows of one fused tensor when the file
                                        has one (phi3's ffn_up: gate rows, then up rows), as
                                        wq/wk/wv may be (attn_qkv) */
    struct mm_weight w_down;         /* (n_embd, n_ff) */
    const float *post_ffn_norm;      /* (n_embd) RMSNorm of the FFN output before the residual
                                        add, or NULL */

    /* A mixture of experts (model_ops.moe), which w_gate, w_up and w_down
     * are not bound in (data NULL). */
    bool moe;                                  /* the FFN is these experts */
    struct mm_weight w_router;                 /* (n_expert, n_embd) ffn_gate_inp: one logit per expert */
    struct mm_weight w_gate_exps, w_up_exps;   /* (n_expert * n_ff_exp, n_embd): the experts' matrices
                                                  stacked, expert e's rows from e * n_ff_exp */
    struct mm_weight w_down_exps;              /* (n_expert * n_embd, n_ff_exp): expert e's from e * n_embd */
    struct mm_weight w_shexp_gate;             /* (1, n_embd) ffn_gate_inp_shexp: the shared expert's gate */
    struct mm_weight w_gate_shexp, w_up_shexp; /* (n_ff_shexp, n_embd) the shared expert, or unbound */
    struct mm_weight w_down_shexp;             /* (n_embd, n_ff_shexp) */
    /* encoder (bert) layers: biases of the output, up and down projections,
     * and the LayerNorms after the attention's and the FFN's residual adds
     * (weights and biases, n_embd each); NULL otherwise */
    const float *bo, *b_up, *b_down;
    const float *ln_attn, *ln_attn_b, *ln_out, *ln_out_b;
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
    struct model_encoder enc;   /* ops.encoder only */
    enum model_pooling pooling; /* `<arch>.pooling_type`; NONE when absent */
    /* The classification head of a reranker (llama.cpp's graph for pooling
     * RANK): x = tanh(cls·h + cls_b) when cls is there, then
     * cls_out·x + cls_out_b. Each part optional (data NULL when absent);
     * llama.cpp's converter writes a Qwen3-Reranker's as cls_out alone,
     * the LM head's rows of "yes" and "no". */
    struct mm_weight cls;      /* (n_embd, n_embd) */
    const float *cls_b;        /* (n_embd) */
    struct mm_weight cls_out;  /* (n_cls_out, n_embd) */
    const float *cls_out_b;    /* (n_cls_out) */
    int32_t n_cls_out;         /* rows of cls_out; 0 without one */
    uint64_t weight_bytes;     /* bytes of all tensors, for reports */
    char name[128];            /* general.name or the file's base name */
    char fingerprint[33];      /* 128-bit hex identity of the weights: hash of every tensor's
                                    name, type, shape and bytes, plus the hyperparameters
                                    (and the LongRoPE set model_set_ctx chose) */
    char fingerprint_file[33]; /* the fingerprint as loaded, before model_set_ctx */
    void **owned;              /* f32 conversions owned by the model */
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

/* Fixes what a run computes that depends on the longest sequence it holds
 * (n_ctx positions), before any backend is created for the model: LongRoPE's
 * factor set (phi3), the long one when n_ctx exceeds the original context
 * (rope.scaling.original_context_length), else the short one — as
 * llama.cpp chooses by its context, and as transformers computes every
 * sequence no longer than the original context (short) and every sequence
 * longer than it (long: transformers decides by the sequence's own length,
 * which a run sharing post-RoPE KV blocks across sequences cannot). The
 * fingerprint then says which set (the persistent cache must not mix them).
 * A model without LongRoPE is left as it is. */
void model_set_ctx(struct model *m, int32_t n_ctx);

/* Dequantizes the embedding row of `token` into out (n_embd floats). */
enum kvb_status model_embed(const struct model *m, int32_t token, float *out);

#endif
