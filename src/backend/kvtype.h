/* kvtype.h — how K/V rows are stored in the KV pool and the persistent
 * store: IEEE half floats, or quantized in groups of KV_QGROUP elements.
 *
 * An enum kv_type names a row format (f16, q8, q4) and also a pool type
 * (--kv-type): which format the pool's K rows and V rows use. The f16 and
 * q8 pools store both as that format; the q4 pool stores V rows as q4 and
 * K rows as q8 (kv_k_rows, kv_v_rows). Keys at 4 bits cost SmolLM2-135M
 * 7.0 % perplexity (4-bit V alone 0.85 %, 4-bit K alone 7.1 %; a Hadamard
 * rotation of each K group before quantizing still 4.1 %): K has outlier
 * channels, which widen their groups' steps for every other channel, and
 * the softmax's exponent magnifies score errors. V errors are averaged over
 * the attended positions instead. So q4 is 4-bit V with 8-bit K, as
 * llama.cpp users pair -ctk q8_0 -ctv q4_x, KIVI gives K more care than V,
 * and KVQuant finds the keys the sensitive half. A block of one layer is
 * [K rows][V rows], block_size rows each, of their own sizes.
 *
 * A row is one token's K (or V) over every KV head of one layer, kv_dim =
 * n_head_kv * head_dim elements; the quantized types cut it into groups of
 * KV_QGROUP consecutive elements, so a head's head_dim elements are whole
 * groups (kv_type_check refuses a head_dim that is not a multiple). The
 * scheme is llama.cpp's per-block one (q8_0, and q4_1's scale and minimum):
 * each group carries its own fp16 scale, so quantizing a row needs that row
 * alone. That is what keeps outputs independent of batch, chunking and cache
 * state: a row's stored bytes are a pure function of its float values,
 * computed when the row is written and never again (per-channel schemes such
 * as KIVI's keys would rescale a block as its slots fill, or need a
 * full-precision window whose contents depend on how far a sequence got).
 *
 *   q8, per group (struct kvq8_group, 34 bytes for 32 elements):
 *     amax = max |x[i]|;  d = fp16(min(amax / 127, 65504));  D = float(d)
 *     q[i] = D == 0 ? 0 : clamp(rint(x[i] * (1 / D)), -127, 127)
 *     value[i] = D * (float)q[i]                       (exact in float)
 *   q4, per group (struct kvq4_group, 20 bytes for 32 elements):
 *     lo = min x[i], hi = max x[i];  d = fp16(min((hi - lo) / 15, 65504))
 *     m = fp16(clamp(lo + 0, -65504, 65504))   (+0 where the minimum is -0)
 *     D = float(d), M = float(m)
 *     q[i] = D == 0 ? 0 : clamp(rint((x[i] - M) * (1 / D)), 0, 15)
 *     value[i] = fmaf(D, (float)q[i], M)               (one rounding)
 *     byte j of qs holds element j in its low nibble, element j + 16 in
 *     its high nibble (llama.cpp's q4 layout: one shift or mask per half)
 * rint is round-to-nearest-even (the SIMD and CUDA conversions' default);
 * fp16() rounds to nearest even (kvb_f32_to_fp16). Every kernel that reads
 * or writes a quantized row reproduces these values bit for bit; attention
 * then runs attn_head's arithmetic (cpu/attn.h) on value[i] where the f16
 * type has the widened half. */
#ifndef KVB_KVTYPE_H
#define KVB_KVTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

enum kv_type { KV_F16 = 0, KV_Q8 = 1, KV_Q4 = 2 };
#define KV_N_TYPES 3
#define KV_QGROUP 32

struct kvq8_group {
    uint16_t d; /* fp16 scale */
    int8_t q[KV_QGROUP];
};

struct kvq4_group {
    uint16_t d, m; /* fp16 scale and minimum */
    uint8_t qs[KV_QGROUP / 2];
};

_Static_assert(sizeof(struct kvq8_group) == 34, "q8 group is 34 bytes");
_Static_assert(sizeof(struct kvq4_group) == 20, "q4 group is 20 bytes");

/* "f16", "q8", "q4". */
const char *kv_type_name(enum kv_type t);
/* Parses a name kv_type_name gives; false for anything else. */
bool kv_type_parse(const char *s, enum kv_type *out);
/* Bytes of a row of n elements (n a multiple of KV_QGROUP for q8 and q4). */
int64_t kv_row_bytes(enum kv_type t, int64_t n);
/* The row formats of a pool of type t: its K rows and its V rows (the q4
 * pool's K rows are q8; see above). */
static inline enum kv_type kv_k_rows(enum kv_type t) { return t == KV_Q4 ? KV_Q8 : t; }
static inline enum kv_type kv_v_rows(enum kv_type t) { return t; }
/* KVB_OK when rows of heads of head_dim elements can be stored as t;
 * KVB_ERR_UNSUPPORTED naming head_dim otherwise. */
enum kvb_status kv_type_check(enum kv_type t, int32_t head_dim, struct kvb_err *err);

/* The reference conversions (scalar). n as for kv_row_bytes; dst holds
 * kv_row_bytes(t, n) bytes (quantize) or n floats (dequantize). For KV_F16
 * they are kvb_f32_to_fp16_n / kvb_fp16_to_f32. */
void kv_quantize_row(enum kv_type t, void *dst, const float *src, int64_t n);
void kv_dequantize_row(enum kv_type t, float *dst, const void *src, int64_t n);
/* One group, for kernels that work a group at a time. */
void kvq8_quantize_group(struct kvq8_group *g, const float *x);
void kvq4_quantize_group(struct kvq4_group *g, const float *x);

#endif
