/* quant_blocks.h — private: reading fields of ggml weight blocks.
 *
 * Small inline readers shared by the reference dequantizer (quant.c) and the
 * scalar product path (matmul_scalar.c), so that the two cannot disagree
 * about where a scale or a bit lives. Loads go through memcpy because GGUF
 * blocks sit at any byte offset. Little-endian hosts only (as is GGUF). */
#ifndef KVB_QUANT_BLOCKS_H
#define KVB_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "base/dtype.h"

static inline uint16_t qb_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t qb_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float qb_half(const uint8_t *p) { return kvb_fp16_to_f32(qb_u16(p)); }

/* Q4_K packs 8 six-bit scales and 8 six-bit mins into 12 bytes: sub-blocks
 * 0..3 use the low 6 bits of bytes 0..3 (scale) and 4..7 (min); sub-blocks
 * 4..7 take their low 4 bits from bytes 8..11 and their top 2 bits from the
 * spare high bits of bytes 0..7. */
static inline void qb_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The unsigned 6-bit value (0..63) of element e (0..255) of a Q6_K block:
 * each 128-element half n uses ql[64n..64n+63] and qh[32n..32n+31]; its four
 * 32-element quarters take low/high nibbles of the first/second 32 ql bytes
 * and successive 2-bit fields of the qh bytes. */
static inline int qb_q6k_value(const uint8_t *b, int e)
{
    const uint8_t *ql = b, *qh = b + 128;
    int n = e / 128, quarter = (e % 128) / 32, l = e % 32;
    int lo = (ql[64 * n + 32 * (quarter & 1) + l] >> (4 * (quarter >> 1))) & 0x0F;
    int hi = (qh[32 * n + l] >> (2 * quarter)) & 3;
    return lo | hi << 4;
}

#endif
