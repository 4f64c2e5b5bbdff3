/* matmul_bf16_amx.h — private to matmul_amx.c: F16 and BF16 weights on the
 * AMX tile unit (TDPBF16PS), for every token count. matmul_bf16_amx.c says
 * how the operands are split, what the results are off by, and why they do
 * not depend on the token count. Both functions exist in every build; they
 * compute only where the AMX flags were given (matmul_amx.c calls them only
 * there). */
#ifndef KVB_MATMUL_BF16_AMX_H
#define KVB_MATMUL_BF16_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/matmul_impl.h"

/* Per-thread scratch of mm_amx_rows_bf16 for w and n_tok tokens. */
size_t mm_amx_bf16_scratch(const struct mm_weight *w, int64_t n_tok);

/* y[t * w->n_out + r] for every token t and rows r0 <= r < r1; w is F16 or
 * BF16 (stored rows), the input's float copy in->xf is read. */
void mm_amx_rows_bf16(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                      void *scratch);

#endif
