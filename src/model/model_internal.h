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

/* Binders (model.c): the tensor `name` as a matrix of n_out rows of n_in
 * (a weight the kernels read) or as an f32 vector of n, checked for its
 * shape and type and counted as bound; absent and not required: zeroed /
 * NULL. Errors name the tensor. For descriptions with their own layout
 * (arch.h, bind). */
enum kvb_status model_bind_matrix(struct model *m, const char *name, int64_t n_in, int64_t n_out, bool required,
                                  struct mm_weight *w, struct kvb_err *err);
enum kvb_status model_bind_vector(struct model *m, const char *name, int64_t n, bool required, const float **out,
                                  struct kvb_err *err);

/* "value" of a scalar metadata entry for messages: 42, 0.5, true, "yarn". */
void model_value_str(const struct gguf_value *v, char *buf, size_t size);

#endif
