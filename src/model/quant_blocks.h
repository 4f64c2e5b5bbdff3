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

/* Q5_K: {half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}. The
 * 5-bit value (0..31) of element e: sub-block s = e / 32 takes its low 4
 * bits from the low (s even) or high nibbles of qs[32(s/2)..+31], as Q4_K,
 * and its fifth bit from bit s of qh[e % 32]. Scales and mins as Q4_K's. */
static inline int qb_q5k_value(const uint8_t *b, int e)
{
    int s = e / 32, l = e % 32;
    int lo = (b[48 + 32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
    return lo | ((b[16 + l] >> s) & 1) << 4;
}

/* Q2_K: {u8 scales[16]; u8 qs[64]; half d; half dmin}. Element e's 2-bit
 * value: each 128-element half n uses qs[32n..32n+31], its four 32-element
 * quarters j successive 2-bit fields (bits 2j, 2j+1). scales[e / 16] holds
 * the scale (low nibble) and the min (high nibble) of its 16 elements. */
static inline int qb_q2k_value(const uint8_t *qs, int e)
{
    int n = e / 128, j = (e % 128) / 32, l = e % 32;
    return (qs[32 * n + l] >> (2 * j)) & 3;
}

/* Q3_K: {u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d}. Element e's value
 * is its 2-bit field (laid out as Q2_K's, in qs at byte 32) minus 4 unless
 * bit e / 32 of hmask[e % 32] is set; returned here offset by 4, as the
 * unsigned 3-bit value (low | hbit << 2), 0..7. */
static inline int qb_q3k_value(const uint8_t *b, int e)
{
    return qb_q2k_value(b + 32, e) | ((b[e % 32] >> (e / 32)) & 1) << 2;
}

/* Q3_K's 16 six-bit scales (each minus 32: -32..31) in its 12 bytes: scale
 * i takes its low 4 bits from the low (i < 8) or high nibble of byte i % 8
 * and its top 2 bits from bits 2(i/4), 2(i/4)+1 of byte 8 + i % 4. */
static inline int qb_q3k_scale(const uint8_t *sc, int i)
{
    int lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
    int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* IQ4_NL and IQ4_XS map each 4-bit index to this non-uniform grid of int8
 * values (ggml's kvalues_iq4nl), spelled once here for the tables of the
 * scalar and SIMD paths. */
#define QB_IQ4_GRID -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113

static inline int qb_iq4_value(int idx)
{
    static const int8_t grid[16] = {QB_IQ4_GRID};
    return grid[idx & 0x0F];
}

/* IQ4_XS: {half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]} over 8
 * sub-blocks of 32. Sub-block ib's six-bit scale (minus 32: -32..31) takes
 * its low 4 bits from nibble ib % 2 of scales_l[ib / 2] and its top 2 bits
 * from bits 2ib, 2ib+1 of scales_h; its indexes are laid out as one IQ4_NL
 * block in qs[16ib..16ib+15] (low nibbles elements 0..15, high 16..31). */
static inline int qb_iq4xs_scale(const uint8_t *b, int ib)
{
    int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    int hi = (qb_u16(b + 2) >> (2 * ib)) & 3;
    return (lo | hi << 4) - 32;
}

#endif
