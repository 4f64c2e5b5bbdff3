/* synth.h — writes small llama-family GGUF models with random weights.
 *
 * For tests (every weight type through the whole forward pass, damaged
 * models for the loader) and for machines that cannot download anything
 * (a GPU box gets its test model from `kvbatch` itself). The weights are
 * random but well-scaled, so activations stay finite through many layers;
 * the text such a model writes is noise. The tokenizer is a byte-level BPE
 * vocabulary of the 256 byte tokens plus the ChatML special tokens and no
 * merges, so the file works with every command.
 *
 * Ownership: nothing is retained; the file at `path` is the output. */
#ifndef KVB_SYNTH_H
#define KVB_SYNTH_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

struct synth_opts {
    const char *arch; /* "llama" (default), "qwen2", "qwen3", "gemma2", "gemma3" */
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim; /* head_dim 0: n_embd / n_head */
    int32_t n_ctx;                                              /* context_length written (default 2048) */
    enum ggml_type matrix_type;                                 /* type of the attention/FFN matrices */
    enum ggml_type embd_type;                                   /* token_embd (and tied output) */
    enum ggml_type norm_type;                                   /* 1-D tensors: F32 normally */
    int tied_output;                                            /* 1: no output.weight */
    /* Per-layer type overrides: when non-NULL, layer l's matrices use
     * layer_types[l % n_layer_types] (mixing types inside one file, as the
     * quantized files on the hub do). */
    const enum ggml_type *layer_types;
    int n_layer_types;
    uint64_t seed;
    /* gemma2 / gemma3: the sliding window (0: gemma3 none, gemma2 the
     * loader's 4096) and soft-caps (0: keys not written). */
    int32_t n_swa;
    float attn_softcap, final_softcap;
};

/* Fills o with a tiny default: 2 layers, 64 wide, 4 heads / 2 KV heads,
 * FFN 128, Q8_0 matrices and embeddings, F32 norms, tied output. */
void synth_opts_default(struct synth_opts *o);

/* Writes the model; the vocabulary has 256 + 3 tokens. */
enum kvb_status synth_model_write(const char *path, const struct synth_opts *o, struct kvb_err *err);

#endif
