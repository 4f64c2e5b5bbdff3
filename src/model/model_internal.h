/* model_internal.h — what the three files of the model module share
 * (model.c binds tensors, model_rope.c reads the RoPE scaling, model_check.c
 * refuses what kvbatch does not compute). Not for use outside src/model*.c. */
#ifndef KVB_MODEL_INTERNAL_H
#define KVB_MODEL_INTERNAL_H

#include "model/model.h"

/* The key `<arch>.<suffix>` (arch: general.architecture) into buf. */
const char *model_key(const struct model *m, const char *suffix, char *buf, size_t size);

/* Reads `<arch>.rope.scaling.*` (and the legacy `rope.scale_linear`) into
 * m->rope and sets m->n_ctx_max. m->hp must be loaded; m->rope.freq_factors
 * is bound by model.c. Values outside what kvbatch computes are
 * KVB_ERR_UNSUPPORTED naming the key and its value. */
enum kvb_status model_rope_load(struct model *m, struct kvb_err *err);

/* After hyperparameters and RoPE scaling are read, before any weight is
 * bound (so that a variant is named by its key, not by a tensor it lacks:
 * Mixtral has no blk.N.ffn_gate.weight): every `<arch>.*` key is one
 * kvbatch computes, or has the value that leaves the arithmetic alone;
 * context, RoPE base and epsilon are usable. */
enum kvb_status model_check_keys(const struct model *m, struct kvb_err *err);

/* After weights are bound: every tensor was bound (bound[0..n_bound)); the
 * vocabulary and special token ids agree with the embedding. */
enum kvb_status model_check(const struct model *m, const struct gguf_tensor *const *bound, uint64_t n_bound,
                            struct kvb_err *err);

/* The float key `<arch>.<suffix>` into *out, or dflt when the file has none
 * (*given, when non-NULL, says which). An absent key leaves no message in
 * err; a present one of another type is KVB_ERR_FORMAT naming it. */
enum kvb_status model_opt_f32(const struct model *m, const char *suffix, float dflt, bool *given, float *out,
                              struct kvb_err *err);

/* Sliding-window attention as `<arch>.attention.sliding_window` (the
 * window, dflt_window when absent: 0 for none) and
 * `<arch>.attention.sliding_window_pattern` (a period n: layer l is
 * windowed unless l % n == n - 1, llama.cpp's set_swa_pattern and
 * transformers' layer_types; or one bool per layer) describe it; dflt_period
 * stands for an absent pattern. Sets m->ops.n_swa and the layers' swa flags;
 * a window that covers the whole context is kept (it costs nothing and
 * changes nothing). Values that cannot be right are KVB_ERR_FORMAT naming
 * the key. */
enum kvb_status model_read_swa(struct model *m, uint32_t dflt_window, uint32_t dflt_period, struct kvb_err *err);

/* A soft-cap key (`<arch>.<suffix>`, absent: 0 = none) into *out;
 * negative or non-finite is KVB_ERR_FORMAT naming it. */
enum kvb_status model_read_softcap(const struct model *m, const char *suffix, float *out, struct kvb_err *err);

/* Gemma's query scale as llama.cpp computes it (arch_gemma3.c): the
 * 1/sqrt(query_pre_attn_scalar) of the released configs, which is
 * hidden / heads for the 27B model (n_layer_27b layers), else head_dim. */
float gemma_attn_scale(const struct model *m, int32_t n_layer_27b);

/* Every reason a file is refused, for model_survey: each one to `each`,
 * counted in n. */
struct model_reasons {
    void (*each)(void *arg, const char *why);
    void *arg;
    int n;
};
void model_reason_add(struct model_reasons *r, const char *why);

/* model_check_keys' key loop and model_check, reporting every refused key,
 * vocabulary mismatch and unbound tensor to r and going on (KVB_OK unless
 * something other than a refusal failed). */
enum kvb_status model_check_keys_all(const struct model *m, struct model_reasons *r, struct kvb_err *err);
enum kvb_status model_check_tensors_all(const struct model *m, const struct gguf_tensor *const *bound, uint64_t n_bound,
                                        struct model_reasons *r, struct kvb_err *err);

/* "value" of a scalar metadata entry for messages: 42, 0.5, true, "yarn". */
void model_value_str(const struct gguf_value *v, char *buf, size_t size);

#endif
