/* matmul_impl.h — private: the table each matrix-product implementation fills.
 *
 * matmul.c owns the context, the buffers and the thread split; an
 * implementation (matmul_scalar.c, matmul_avx2.c, matmul_avx512.c) owns the
 * byte layout of one quantized input token (in one or several forms), the
 * loop that computes a contiguous range of output rows for every token, and
 * optionally a packed arrangement of weight rows it reads faster. Keeping
 * the split at "rows [r0, r1) of all tokens" is what lets the determinism
 * contract hold: an implementation computes each output element with a
 * sequence of float operations fixed by (type, n_in) alone, so neither the
 * thread split nor the other tokens of the call can change it. */
#ifndef KVB_MATMUL_IMPL_H
#define KVB_MATMUL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/quant.h"

/* The input as left by mm_set_input(). */
struct mm_input {
    int64_t n_in, n_tok;
    const float *xf;   /* (n_tok, xf_stride): copy of x, zero-padded; for float weights */
    int64_t xf_stride; /* floats per token, a multiple of 16 */
    const uint8_t *xq; /* (n_tok, xq_stride): the implementation's quantized form */
    size_t xq_stride;  /* bytes per token, a multiple of 64 */
};

struct mm_kernels {
    const char *name;
    /* Bytes of one quantized token of n_in elements (n_in % 32 == 0), a
     * multiple of 64, holding every form (below). */
    size_t (*act_bytes)(int64_t n_in);
    /* The forms of the quantized input (a bit mask) that rows() reads for
     * weights of this type. An implementation may keep several arrangements
     * of one token (each in its own place within act_bytes); matmul.c makes
     * only those some weight reads, once per input. NULL: one form, bit 1. */
    unsigned (*forms_of)(enum ggml_type type);
    /* Quantizes one token (n_in floats, n_in % 32 == 0) into the `forms` of
     * its act_bytes(n_in) bytes at dst (64-byte aligned). */
    void (*quantize)(const float *x, int64_t n_in, unsigned forms, void *dst);
    /* Per-thread scratch `rows` needs for w (may be 0). */
    size_t (*scratch_bytes)(const struct mm_weight *w, int64_t n_tok);
    /* y[t * w->n_out + r] for all tokens t and rows r0 <= r < r1. scratch is
     * 64-byte aligned and scratch_bytes(w, n_tok) long. */
    void (*rows)(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1, void *scratch);
    /* Optional (NULL: no packed forms). pack_tag is the nonzero value
     * mm_weight.packed takes for this implementation's packed rows;
     * packs(type) says whether it has a packed form of that type; pack_rows
     * writes rows [r0, r1) of w, packed, to dst (row_bytes each, same size
     * as stored). rows() then reads them with the same arithmetic. r0 is a
     * multiple of 16 and r1 one too or n_out (matmul.c splits so): a packed
     * form may interleave the rows of a 16-row panel. */
    uint32_t pack_tag;
    int (*packs)(enum ggml_type type);
    void (*pack_rows)(const struct mm_weight *w, int64_t r0, int64_t r1, uint8_t *dst);
};

extern const struct mm_kernels mm_kernels_scalar;
extern const struct mm_kernels mm_kernels_avx2;   /* matmul_avx2.c: AVX2+FMA+F16C */
extern const struct mm_kernels mm_kernels_avx512; /* matmul_avx512.c: AVX-512 F/BW/VL/VNNI */
extern const struct mm_kernels mm_kernels_amx;    /* matmul_amx.c: AMX-INT8 tiles + the above */
/* Whether matmul_amx.c was compiled with the AMX flags (else its table is empty). */
extern const bool mm_amx_built;

/* The implementation ctx resolved to, for code of this folder that runs the
 * kernels over a split of its own (moe.c: many small products in one pool
 * run); the determinism contract above is the kernels', so it holds there. */
struct mm_ctx;
const struct mm_kernels *mm_ctx_kernels(const struct mm_ctx *ctx);

/* What the 8-bit rounding of x (n_in floats, n_in % 32 == 0) leaves out:
 * r = x - d q per 32-block, with d and q as every implementation's
 * quantize() makes them (d = amax / 127, q rounded to nearest even in
 * [-127, 127]). Under mm_ctx_set_act16 a product reads r's own rounding as
 * a second token and adds the two outputs (t(x) + t(r), in that order);
 * moe.c lays its rows out the same way. */
void mm_act16_residual(const float *x, int64_t n_in, float *r);

/* Whether a type's weights are read through the quantized input (true) or
 * the float copy (false). */
static inline int mm_type_is_quantized(enum ggml_type t)
{
    return !(t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16);
}

#endif
