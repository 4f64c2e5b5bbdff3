/* be_cuda.h — the CUDA backend: the forward pass of backend.h on an NVIDIA
 * GPU (compute capability 8.0 or newer), with cuBLAS GEMMs.
 *
 * What it does: at creation every weight matrix is dequantized on the host
 * (quant_dequant_row) to bf16 and uploaded once; norms and biases go up as
 * f32. Activations stay f32 on the device and are rounded to bf16 just
 * before each GEMM, which accumulates in f32. The KV block pool lives in
 * device memory with the CPU backend's layout
 * ([block][layer][K|V][slot][row]), each row stored as the kv_type option
 * says (backend/kvtype.h: fp16, or q8 / q4 groups — the q4 pool's K rows
 * are q8, its V rows q4 — quantized by the store
 * kernel as kv_quantize_row does, byte for byte, and read by the attention
 * kernels as they are: no dequantized copy), so kv_block_read /
 * kv_block_write copy block_bytes as they are and a persistent-cache value
 * written by one backend is read by the other. One stream; per step the token ids,
 * positions and block tables go up in one copy from pinned memory, and the
 * logits rows come back to the host (the engine samples there, on the
 * backend's host threads) — except for greedy requests (BE_LOGITS_ARGMAX),
 * whose choice is made on the device (kcu_argmax) and comes back alone. The
 * persistent cache's blocks go through page-locked host staging
 * (host_alloc), so their copies run at full bus speed. With graphs on, a
 * step whose shape was seen before replays a captured CUDA graph of its
 * device work (one launch instead of ~17 per layer); the index upload,
 * the downloads and the synchronisation stay outside it.
 *
 * Not bit-identical to the CPU backend: bf16 weights and activations keep 8
 * significant bits where the CPU computes with the stored quantized values
 * and 8-bit-quantized activations, and reductions run in another order. The
 * two agree to about 1e-4 normalised error in the logits.
 *
 * Errors: CUDA and cuBLAS failures become kvbatch statuses with the
 * library's own text in err->msg — out of device memory → KVB_ERR_NOMEM
 * (saying how much was needed, and --kv-mem when the KV pool is what does not
 * fit), no device / driver too old / GPU too old → KVB_ERR_UNSUPPORTED, any
 * other device failure → KVB_ERR_IO.
 *
 * Ownership: the model must outlive the backend (norm vectors are read from
 * it at creation only, but the name is kept). be_free() releases every
 * device and pinned allocation. A backend is used from one thread at a time. */
#ifndef KVB_BE_CUDA_H
#define KVB_BE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model.h"

/* Whether CUDA device `device` exists and can run kvbatch's kernels. When
 * not, writes the reason (the CUDA runtime's message, "no CUDA device", or
 * the compute capability) into why[cap] (why may be NULL). */
bool be_cuda_available(int device, char *why, size_t cap);

struct be_cuda_opts {
    int device;         /* CUDA device index, >= 0 */
    int32_t block_size; /* tokens per KV block, > 0 */
    int32_t n_blocks;   /* KV pool size in blocks, > 0 */
    int n_threads;      /* host threads for the engine's sampling (host_parallel); <= 0: one per CPU */
    /* Batch-invariant GEMMs: every GEMM runs on fixed tiles of
     * BE_CUDA_DET_ROWS token rows (the last one padded), so that cuBLAS
     * picks the same kernel and reduction order whatever the step's size and
     * a token's logits do not depend on what shares its batch. Costs weight
     * re-reads when a step has more than BE_CUDA_DET_ROWS tokens. */
    bool deterministic;
    /* CUDA graphs: a step shape seen before is replayed from a captured
     * graph, one launch instead of ~17 per layer (decode steps repeat their
     * shape). Same results bit for bit; switched off by itself, with the
     * reason kept, if a capture fails, and never on for a mixture of
     * experts (its steps read their routing back on the host: be_cuda_moe.h). */
    bool graphs;
    /* Attention by kcu_attn (a thread block per token and head, f32
     * products) even where the tensor-core kernel takes the head size (64,
     * 128): for comparing the two. */
    bool attn_warp;
    /* KV pool rows (backend/kvtype.h); KV_F16 when zeroed. q8 and q4 need a
     * head_dim that is whole groups of 32 (KVB_ERR_UNSUPPORTED otherwise). */
    enum kv_type kv_type;
};

#define BE_CUDA_DET_ROWS 128

/* Creates the backend (see above). KVB_ERR_UNSUPPORTED "no CUDA device: …"
 * when be_cuda_available() says no, and for shapes the kernels cannot take
 * (head_dim > 256). The model must outlive the backend. */
enum kvb_status be_cuda_create(const struct model *m, const struct be_cuda_opts *o, struct backend **out,
                               struct kvb_err *err);

/* Steps run from a captured graph so far; *why_off (may be NULL) is the
 * reason graphs were switched off, or NULL. `be` must be a CUDA backend. */
int64_t be_cuda_graph_launches(const struct backend *be, const char **why_off);
/* Turns graphs on or off from the next step (dropping those captured) and
 * resets the count above: for measuring both on one backend. */
void be_cuda_set_graphs(struct backend *be, bool on);

/* Bytes of device memory free on `device` now (cudaMemGetInfo), to size the
 * KV pool from a fraction of it; -1 when the device cannot be queried. */
int64_t be_cuda_free_memory(int device);

/* Bytes of device memory the weights take once uploaded as bf16 (f32 for
 * norms and biases): what must fit beside the KV pool. */
int64_t be_cuda_weight_bytes(const struct model *m);

#endif
