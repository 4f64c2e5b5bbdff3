/* arch.h — what one model architecture changes in the transformer layer,
 * said once, in one file per architecture (arch_<name>.c).
 *
 * The forward pass of every architecture kvbatch runs is the llama layer
 * plus a handful of variations: where the norms sit, which activation
 * gates the FFN, how the embeddings, queries and logits are scaled or
 * capped, which layers attend through a sliding window and with which
 * RoPE base, which optional tensors (biases, Q/K norms) exist. A
 * description names those variations for one `general.architecture`:
 * the constant ones as fields, the ones a file's keys decide through its
 * `read` hook, which fills struct model_ops and the per-layer fields of
 * struct model (model.h). The backends read only those fields — never the
 * architecture's name — so a new architecture is a new description (and a
 * reference case in tests/pytest_hf_ref.py), not a branch in each backend.
 * A variation no backend computes yet is a new field of struct model_ops
 * (zero meaning "as llama"), implemented once in each backend.
 *
 * The loader (model.c) does what is common: the llama keys and tensors,
 * RoPE scaling (model_rope.c), the refusal of every key and tensor nobody
 * read (model_check.c, which also accepts the keys a description lists).
 *
 * Descriptions are constant data; nothing here owns memory. */
#ifndef KVB_ARCH_H
#define KVB_ARCH_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "model/model.h"

/* Whether a group of tensors is bound: absent (a file that has one is
 * refused, naming it), optional (used when the file has it) or required
 * (a file without it is refused). */
enum arch_need { ARCH_ABSENT = 0, ARCH_OPTIONAL, ARCH_REQUIRED };

struct arch_desc {
    const char *name;    /* general.architecture, and the prefix of its keys */
    enum rope_kind rope; /* how RoPE pairs dimensions in the file's Q/K rows */
    enum model_act act;  /* the FFN gate's activation */
    /* Per-layer tensor groups beyond the llama layer (model.h, struct model_layer). */
    enum arch_need qkv_bias;   /* blk.N.attn_{q,k,v}.bias */
    enum arch_need qk_norm;    /* blk.N.attn_{q,k}_norm.weight: RMSNorm of each head */
    enum arch_need post_norms; /* blk.N.post_attention_norm / post_ffw_norm: RMSNorm of the
                                  attention and FFN outputs before the residual add */
    enum arch_need output;     /* output.weight (absent or optional: tied to token_embd) */
    /* Keys `<name>.<suffix>` that `read` reads, beyond the common ones
     * (model_check.c's table): NULL-terminated, or NULL. */
    const char *const *keys;
    /* Reads those keys into m->ops and the layers' flags, after the common
     * hyperparameters; NULL when there are none. Errors name the key. */
    enum kvb_status (*read)(struct model *m, struct kvb_err *err);
};

/* The description of `general.architecture` = name[0..len), or NULL. */
const struct arch_desc *arch_find(const char *name, size_t len);

/* "llama, qwen2, ..." — the architectures kvbatch runs, for messages. */
const char *arch_names(void);

/* The descriptions, one per arch_<name>.c. */
extern const struct arch_desc arch_llama, arch_qwen2, arch_qwen3, arch_gemma2, arch_gemma3;

#endif
