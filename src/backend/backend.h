/* backend.h — the seam between the engine and the hardware that runs the model.
 *
 * A backend owns the KV block storage (host memory for the CPU, device memory
 * for CUDA) and runs one forward pass over a packed batch: any mix of prefill
 * chunks and single decode tokens from different sequences. Block *ids* and
 * their refcounts are managed above the backend (kv.h); the backend only
 * stores K/V at (block id, slot) and reads them back through each sequence's
 * block table.
 *
 * Everything above this header is backend-agnostic. A backend is created by
 * its own constructor (cpu/be_cpu.h, kernels/be_cuda.h) and freed through
 * its vtable; app/backend_select.h picks one. */
#ifndef KVB_BACKEND_H
#define KVB_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/kvtype.h"
#include "base/status.h"
#include "model/quant.h"

struct model;

/* One sequence's part of a step. */
struct be_seq {
    const int32_t *tokens; /* (n_tokens) new tokens, at positions pos..pos+n_tokens-1 */
    int32_t n_tokens;
    int32_t pos;                /* tokens of this sequence already in the KV cache */
    const int32_t *block_table; /* KV block ids covering positions [0, pos + n_tokens) */
    int32_t n_blocks;
    /* BE_LOGITS_ARGMAX (only when the backend's `argmax` says it can): the
     * last token's greedy choice instead of its logits row, written to
     * batch->argmax[i]: the lowest id holding the largest logit that is not
     * NaN (sampler_greedy's rule), -1 when every logit is NaN or -inf. It
     * takes no row in the logits output: on a GPU the row never crosses to
     * the host, which for a 128 K vocabulary is most of what a decode step
     * would copy back.
     * BE_HIDDEN_LAST / BE_HIDDEN_ALL (pooling: embeddings, rerankers): no
     * logits row but the final-norm hidden state — the last layer's
     * output after the model's final norm, the row the output head would
     * read, what transformers' base model returns as last_hidden_state —
     * of the last token / of every token, n_embd floats a row, written to
     * batch->hidden in sequence order. */
    enum { BE_LOGITS_NONE = 0, BE_LOGITS_LAST, BE_LOGITS_ALL, BE_LOGITS_ARGMAX, BE_HIDDEN_LAST, BE_HIDDEN_ALL } logits;
};

struct be_batch {
    const struct be_seq *seqs;
    int32_t n_seqs;
    int32_t *argmax; /* (n_seqs) out, entries of BE_LOGITS_ARGMAX sequences; NULL when none asks */
    float *hidden;   /* (n_hidden, n_embd) out, the rows of BE_HIDDEN_* sequences; NULL when none asks */
};

struct backend {
    const char *name;    /* "cpu", "cuda" */
    const char *kernels; /* which kernels run, for logs ("avx512", "scalar", …); NULL: name */
    /* The arithmetic its results are the bits of (NULL: the CPU's avx512
     * kernels'; "cuda", "cpu avx2", …: another, whose results differ in the
     * last bits). The persistent store keeps what one arithmetic computed
     * from answering for another (pstore_model.arith), so an output is the
     * same bits whether its prefix was computed or loaded. */
    const char *arith;
    /* Bits each activation keeps in the products with quantized weights:
     * 8 or 16 on the CPU (--activations; mm_ctx_set_act16), 0 where they
     * stay floating point (CUDA). For logs and the run's settings. */
    int act_bits;
    int n_threads;        /* host threads doing the work (0: not applicable) */
    int32_t block_size;   /* tokens per KV block */
    int32_t n_blocks;     /* blocks in the pool */
    int64_t block_bytes;  /* bytes of K+V of one block, all layers */
    enum kv_type kv_type; /* how the pool stores K/V rows (backend/kvtype.h) */
    bool argmax;          /* forward takes BE_LOGITS_ARGMAX */
    void *impl;

    /* Paging, for a model with sliding-window layers (be_kv_layout): a
     * block (what block tables name; block_bytes, the unit of the
     * persistent store) is n_groups pages of page_bytes, one per group of
     * layers: groups [0, n_global_groups) hold full-attention layers, the
     * others windowed layers, whose pages a block may lose once no
     * sequence's window reaches it (the scheduler's kv.h says when). With
     * one group (every model without windowed layers) a page is the block
     * and nothing below is used: n_pages = n_logical = n_blocks. */
    int32_t n_groups, n_global_groups;
    int64_t page_bytes;
    int32_t n_pages;   /* n_blocks * n_groups: the pool */
    int32_t n_logical; /* block ids are [0, n_logical): n_pages when n_groups > 1 (blocks that lost
                          their windowed pages cost less than n_groups pages), else n_blocks */
    int32_t window;    /* n_groups > 1: the windowed layers' window in positions (model_ops.n_swa) */
    /* n_groups > 1: block `block`'s pages from now on, one per group (-1:
     * the group's page dropped: never read). A backend starts with block
     * b < n_blocks on pages b * n_groups + g (so that a user of the first
     * n_blocks ids, such as engine/gen.h, needs no map) and the rest on
     * none. */
    void (*kv_map)(struct backend *be, int32_t block, const int32_t *pages);

    /* Runs the batch. Writes logits rows (n_vocab floats each) into `logits`
     * in sequence order: one row for BE_LOGITS_LAST, n_tokens rows for
     * BE_LOGITS_ALL, none for BE_LOGITS_NONE. */
    enum kvb_status (*forward)(struct backend *be, const struct be_batch *batch, float *logits, struct kvb_err *err);
    /* Copy one block's K/V (block_bytes, layout [layer][K|V][slot][row], see be_block_bytes;
     * with pages, its pages in group order, each [layer of the group][K|V][slot][row])
     * out of / into the pool: how the persistent cache spills and restores. Every
     * page of the block must be there. */
    enum kvb_status (*kv_block_read)(struct backend *be, int32_t block, void *dst);
    enum kvb_status (*kv_block_write)(struct backend *be, int32_t block, const void *src);
    void (*free)(struct backend *be);
    /* Optional (NULL: the caller runs fn(arg, 0, 1) itself): runs
     * fn(arg, i, n) for i in [0, n) on the backend's host threads while no
     * forward pass is running; returns when all have returned. Lets the
     * scheduler sample a step's sequences in parallel on threads that
     * would otherwise wait. */
    void (*host_parallel)(struct backend *be, void (*fn)(void *arg, int ith, int nth), void *arg);
    /* Optional (NULL: kvb_aligned_alloc / kvb_free): host memory that
     * kv_block_read/write copy fastest from and to — page-locked for a GPU,
     * which copies it by DMA at full bus speed where ordinary memory goes
     * through a bounce buffer. For the staging of persistent-cache blocks;
     * host_free takes what host_alloc gave (NULL accepted). */
    void *(*host_alloc)(struct backend *be, size_t bytes);
    void (*host_free)(struct backend *be, void *p);
    /* Optional, all three or none (NULL: kv_block_read/write, which return
     * when done): block copies queued beside compute, for a GPU's copy
     * engines. kv_read_async queues a copy of the block, as every forward
     * pass so far left it, into dst; kv_write_async queues a copy of src
     * into the block, which every later forward pass sees (the device
     * waits for it, the host does not). Until kv_copies_wait returns, dst
     * holds nothing yet and src must stay as it is; the caller also keeps
     * forward passes from writing a block being read. Both take host_alloc
     * memory. kv_copies_wait returns once every queued copy is done, with
     * the first failure among them. */
    enum kvb_status (*kv_read_async)(struct backend *be, int32_t block, void *dst);
    enum kvb_status (*kv_write_async)(struct backend *be, int32_t block, const void *src);
    enum kvb_status (*kv_copies_wait)(struct backend *be, struct kvb_err *err);
    /* Optional: writes into buf[cap] one line on how the backend ran that
     * the run summary should show (e.g. CUDA graphs used, or why not);
     * leaves buf empty when there is nothing to say. */
    void (*summary)(struct backend *be, char *buf, size_t cap);
};

/* Totals of a checked batch. */
struct be_batch_shape {
    int64_t n_tok;    /* tokens in the step */
    int64_t n_out;    /* logits rows asked for */
    int64_t n_argmax; /* BE_LOGITS_ARGMAX sequences */
    int64_t n_hidden; /* hidden-state rows asked for (BE_HIDDEN_*) */
    int64_t n_tab;    /* block-table entries over all sequences */
    int32_t max_end;  /* largest pos + n_tokens */
};

/* Validates a batch for `be` (positive lengths, block tables long enough and
 * in range, token ids below n_vocab, BE_LOGITS_ARGMAX only where the backend
 * takes it and with batch->argmax to write to, BE_HIDDEN_* only with
 * batch->hidden) and sums its shape. KVB_ERR_INVALID_ARG
 * or KVB_ERR_RANGE with a message naming the sequence. */
enum kvb_status be_batch_check(const struct backend *be, int32_t n_vocab, const struct be_batch *b,
                               struct be_batch_shape *out, struct kvb_err *err);

/* Bytes of one KV block as every backend lays it out (K then V of each
 * layer, each block_size rows of kv_dim elements, K rows stored as
 * kv_k_rows(kv_type) and V rows as kv_v_rows(kv_type): a q4 pool's K rows
 * are q8): the unit of the KV pool and of the persistent store's values. */
int64_t be_block_bytes(const struct model *m, int32_t block_size, enum kv_type kv_type);

/* How a model's KV blocks are cut into pages (struct backend's paging):
 * full-attention layers, in layer order, then windowed layers, in groups of
 * layers_per_group = gcd(how many of each) layers, so that a page has the
 * same size in both. One group of every layer for a model without windowed
 * layers: its page is the block, byte for byte. */
struct be_kv_layout {
    int32_t n_groups, n_global_groups, layers_per_group;
    int64_t page_bytes;
};
void be_kv_layout(const struct model *m, int32_t block_size, enum kv_type kv_type, struct be_kv_layout *out);
/* Layer l's group and its index inside the group's page. */
void be_layer_group(const struct model *m, const struct be_kv_layout *lo, int32_t l, int32_t *group, int32_t *index);
/* Sets be's paging fields for n_blocks blocks of the model (a backend's
 * constructor calls it, after block_size). */
void be_paging_init(struct backend *be, const struct model *m, int32_t n_blocks, enum kv_type kv_type);

static inline const char *be_kernels_name(const struct backend *be) { return be->kernels ? be->kernels : be->name; }
/* "8-bit", "16-bit" or "float": act_bits in words, for logs and settings. */
static inline const char *be_acts_name(const struct backend *be)
{
    return be->act_bits == 16 ? "16-bit" : be->act_bits == 8 ? "8-bit" : "float";
}
static inline int be_threads(const struct backend *be) { return be->n_threads > 0 ? be->n_threads : 1; }

void *be_host_alloc(struct backend *be, size_t bytes); /* NULL when out of memory */
void be_host_free(struct backend *be, void *p);

static inline void be_free(struct backend *be)
{
    if (be) be->free(be);
}

#endif
