/* matmul_amx_impl.h — private to the matmul*_amx.c files: the packed panel
 * form of the weights, the natural form of the input, and which bytes each
 * AVX-512 lane (unit) reads.
 *
 * The pieces:
 *  - matmul_amx.c         the kernel table, input, packing, the tile path
 *                         (products of AMX_MIN_TOK tokens or more);
 *  - matmul_decode_amx.c  products of a few tokens (decode) with packed
 *                         weights, on the AVX-512 VNNI units.
 * Both compute every output with the AVX-512 kernels' float operations on
 * the same exact integer sums (the top of matmul_amx.c says why that makes
 * them equal bit for bit). Compile with the AMX and AVX-512 flags (CMake
 * gives them to every src/ file named *_amx.c). */
#ifndef KVB_MATMUL_AMX_IMPL_H
#define KVB_MATMUL_AMX_IMPL_H

#include "cpu/matmul_avx512_wgroup.h"

#define NR 16       /* weight rows per panel */
#define FORM_NAT 4u /* the natural int8 form of the input (the AVX-512 forms are bits 1 and 2) */

/* The packed form, for the wide types (Q4_0, Q4_1, Q8_0): rows in panels of
 * 16 (the last panel: the rows left, rp), in the same bytes as stored: per
 * panel, per block of 32, the quantized bytes of its rp rows interleaved by
 * dword (dword s of row n at 4 * (rp * s + n)), then the rp f16 scales
 * (and, Q4_1, the rp f16 mins). Block b of the panel of rows [p, p + rp)
 * starts at p * row_bytes + b * rp * block_bytes. A B tile is a few masks of
 * contiguous bytes, and one load gives a unit's nibbles for 16 rows. */
#define PACK_TAG 0xA3Cu

/* One quantized input token: the AVX-512 token (both of its forms), then
 * the natural form: int8 q[n_in] (blocks of 32 in order, the values the
 * AVX-512 forms hold), zero-padded by 64 bytes. */
static inline size_t avx_bytes(int64_t n_in) { return mm_kernels_avx512.act_bytes(n_in); }
static inline size_t nat_bytes(int64_t n_in) { return ((size_t)n_in + 64 + 63) & ~(size_t)63; }

/* The kind of group g: its steps, 8 (S8), 4 (S4) or 1 (S1) (matmul_avx512.c). */
static inline int group_steps(const struct lay *l, int64_t g) { return g < l->n8 ? 8 : g < l->n8 + l->n4 ? 4 : 1; }

/* Which unit of the natural row (nb blocks) lane L of group g is: its
 * block, and within it the half (S4 groups) or dword (S1 groups) in *sub;
 * -1: no unit (a lane past the row's end, whose weights and scales are 0). */
static inline int64_t unit_block(const struct lay *l, int64_t nb, int64_t g, int L, int *sub)
{
    int64_t blk;
    if (g < l->n8) {
        blk = 16 * g + L;
        *sub = 0;
    } else if (g < l->n8 + l->n4) {
        blk = 16 * l->n8 + 8 * (g - l->n8) + 2 * (L & 3) + (L >> 3);
        *sub = (L >> 2) & 1;
    } else {
        blk = 16 * l->n8 + 8 * l->n4 + (L >> 3);
        *sub = L & 7;
    }
    return blk < nb ? blk : -1;
}

/* Where unit (lane L of group g) keeps its B tile, scales and input in the
 * tile path: lane-major, so that a lane's units follow each other. */
static inline size_t unit_index(const struct lay *l, int64_t g, int L) { return (size_t)L * (size_t)l->ng + (size_t)g; }

/* Lanes whose AVX-512 weights are high nibbles kept x 16 (S4 groups of
 * Q4_0, Q4_1 and Q4_K: matmul_avx512_wgroup.h): their integer sum is 16
 * times the plain one, and their dw a sixteenth. */
static inline unsigned x16_lanes(enum ggml_type type, int steps)
{
    if (steps != 4) return 0;
    if (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1) return HI_NIB_LANES;
    if (type == GGML_TYPE_Q4_K) return 0xFF00u;
    return 0;
}

/* Packed weights of at most DECODE_MAX_TOK tokens go to the VNNI kernel,
 * DECODE_T tokens per pass over the weights; more tokens to the tiles.
 * Measured on 3072 x 3072 Q4_0 (one core): at 4 to 8 tokens the VNNI kernel
 * takes 0.7 of the AVX-512 kernels' time and the tiles 1.0-1.3 of it, at 16
 * both about 0.85, at 32 the tiles 0.9 and the VNNI kernel 1.1. */
#define DECODE_T 8
#define DECODE_MAX_TOK 16

/* y rows [r0, r1) of tokens [t_from, n_tok), w packed (PACK_TAG);
 * scratch: decode_scratch_bytes() (matmul_decode_amx.c). */
void mm_amx_rows_decode(const struct mm_weight *w, const struct mm_input *in, int64_t t_from, float *y, int64_t r0,
                        int64_t r1, void *scratch);
static inline size_t decode_scratch_bytes(void) { return (size_t)DECODE_T * 16 * NR * 4; }

#endif
