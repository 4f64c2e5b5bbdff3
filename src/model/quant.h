/* quant.h — weight block formats: reference dequantization, and the
 * quantized matrix products the forward pass runs on.
 *
 * Block layouts are ggml's (see dtype.h for sizes). quant_dequant_row() is
 * the plain reference: it is what every fast path is tested against.
 *
 * Products: y[t][r] = sum_k W[r][k] * x[t][k] for tokens t < n_tok and rows
 * r < n_out. For quantized weights the input is first quantized per token to
 * 8-bit blocks of 32 (scale + sum per block); products then run in integer
 * arithmetic. The CONTRACT that the batch engine relies on for determinism:
 * the float result for one (t, r) is bit-for-bit the same whatever n_tok,
 * whichever other tokens share the call, and however many threads run —
 * i.e. no reduction order may depend on the batch or on the thread split.
 * The scalar and SIMD implementations may differ from each other (within
 * a small tolerance); each is deterministic on its own.
 *
 * Ownership: struct mm_ctx owns its scratch buffers (grown on demand) and
 * borrows the thread pool, which must outlive it. Weights are borrowed. */
#ifndef KVB_QUANT_H
#define KVB_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

struct tpool;

/* Whether kvbatch can compute with `type` (dequantize and multiply). */
bool quant_type_supported(enum ggml_type type);

/* Dequantizes n elements (a whole number of blocks) of `type` from src into
 * dst. Returns KVB_ERR_UNSUPPORTED for types without support,
 * KVB_ERR_INVALID_ARG when n is not a whole number of blocks. */
enum kvb_status quant_dequant_row(enum ggml_type type, const void *src, float *dst, int64_t n);

struct mm_weight {
    enum ggml_type type;
    int64_t n_in;     /* columns: elements per row (ne[0] in GGUF) */
    int64_t n_out;    /* rows (ne[1] in GGUF) */
    const void *data; /* n_out rows of row_bytes each */
    size_t row_bytes;
    /* 0: rows as stored in GGUF. Otherwise the rows were rearranged by
     * mm_pack_weight() for one implementation, which alone may read them. */
    uint32_t packed;
};

enum mm_impl {
    MM_IMPL_AUTO = 0, /* best the CPU supports, chosen at run time */
    MM_IMPL_SCALAR,   /* plain C reference path */
    MM_IMPL_AVX2,     /* AVX2+FMA (+F16C); refused when the CPU lacks it */
    MM_IMPL_AVX512,   /* AVX-512 F/BW/VL + VNNI; refused when the CPU lacks it */
    MM_IMPL_AMX       /* AMX int8 tiles (+ AVX-512); refused without AMX or the kernel's tile permission */
};

struct mm_ctx;

enum kvb_status mm_ctx_create(struct tpool *pool, enum mm_impl impl, struct mm_ctx **out, struct kvb_err *err);
void mm_ctx_free(struct mm_ctx *ctx); /* accepts NULL */
/* "scalar", "avx2", "avx512" or "amx" (what AUTO resolved to). */
const char *mm_ctx_impl_name(const struct mm_ctx *ctx);

/* Activations of the products with quantized weights. By default (off) each
 * token's row is rounded to 8 bits per 32-block (d = amax / 127), as
 * llama.cpp's CPU kernels round it: a block with one large element keeps
 * the small ones at a few bits, which moves outputs near a tie (the real
 * Gemma 3 270M file: 3 % of top-1 tokens differ from float arithmetic).
 * On: the residual that rounding leaves (x - d q, below d / 2) is rounded
 * the same way, each weight row is multiplied by both (read once for both:
 * the pair is two tokens to the kernels) and the two products are added,
 * y = W (d q) + W (d' q'): about 16 bits of each activation. It costs about
 * twice the integer work where a product is compute bound (prefill, batched
 * steps) and little where it is bound by reading the weights (batch-1
 * decode). Outputs stay independent of batch, split and threads; they are
 * other bits than the 8-bit ones, so the persistent store keys them apart
 * (struct backend.arith). Float weights (F32/F16/BF16) read the float rows
 * either way. Set before mm_set_input*(): it drops the current input. */
void mm_ctx_set_act16(struct mm_ctx *ctx, bool on);
bool mm_ctx_act16(const struct mm_ctx *ctx);

/* Two-step form so several weights with the same n_in share one quantized
 * input (Q/K/V; gate/up): mm_set_input() copies/quantizes x (n_tok rows of
 * n_in floats) into ctx scratch; mm_apply() computes y (n_tok rows of
 * w->n_out floats) from it. w->n_in must equal the n_in given to set_input. */
enum kvb_status mm_set_input(struct mm_ctx *ctx, const float *x, int64_t n_in, int64_t n_tok);
enum kvb_status mm_apply(struct mm_ctx *ctx, const struct mm_weight *w, float *y);

/* mm_set_input() for an input whose rows are computed: make(arg, t, dst)
 * writes token t's n_in floats to dst. It runs once per token, on the
 * pool's threads (tokens split between them), when the first mm_apply*()
 * after this call needs the input, so the work that produces a matmul's input
 * (a norm, an activation, a residual add) runs in parallel with no pool run
 * of its own. make may also update state that belongs to token t alone. It
 * is never called when no mm_apply*() follows. */
enum kvb_status mm_set_input_fn(struct mm_ctx *ctx, int64_t n_in, int64_t n_tok,
                                void (*make)(void *arg, int64_t t, float *dst), void *arg);

/* Both steps at once. */
enum kvb_status mm_matmul(struct mm_ctx *ctx, const struct mm_weight *w, const float *x, int64_t n_tok, float *y);

/* mm_apply() for n weights that share the input set by mm_set_input() (Q, K
 * and V; gate and up), in one parallel run instead of n: y[i] gets n_tok rows
 * of w[i]->n_out floats. Results are bit-identical to n mm_apply() calls. */
enum kvb_status mm_apply_n(struct mm_ctx *ctx, const struct mm_weight *const *w, float *const *y, int n);

/* Rearranges w's rows into the form ctx's implementation reads fastest
 * (same size, same results bit for bit: only the per-step unpacking gets
 * cheaper). On success *out describes the packed copy and *owned is its
 * buffer, which the caller frees with kvb_free() after the last use of *out;
 * where the implementation has no packed form for w's type, *out = *w and
 * *owned = NULL. A packed weight is refused (KVB_ERR_INVALID_ARG) by any
 * other implementation. Errors: KVB_ERR_INVALID_ARG, KVB_ERR_NOMEM. */
enum kvb_status mm_pack_weight(struct mm_ctx *ctx, const struct mm_weight *w, struct mm_weight *out, void **owned);

/* Whether this CPU can run `impl` (AUTO and SCALAR: always). */
bool mm_impl_available(enum mm_impl impl);

/* "auto", "amx", "avx512", "avx2", "scalar" <-> enum mm_impl (false: none of them). */
bool mm_impl_parse(const char *name, enum mm_impl *out);
const char *mm_impl_label(enum mm_impl impl);

/* What `impl` means here: AUTO is the environment's KVBATCH_KERNELS when it
 * is set to something other than "auto" (so that a test run can force one
 * implementation on everything that asks for AUTO), else the best this CPU
 * runs (amx, avx512, avx2, scalar in that order). KVB_ERR_UNSUPPORTED, with
 * the reason (no such unit, the kernel refused AMX's tile state, a build
 * without AMX), when the result cannot run here; KVB_ERR_INVALID_ARG for a
 * KVBATCH_KERNELS value that names none. mm_ctx_create resolves with it. */
enum kvb_status mm_impl_resolve(enum mm_impl impl, enum mm_impl *out, struct kvb_err *err);

#endif
