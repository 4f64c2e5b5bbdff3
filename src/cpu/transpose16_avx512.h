/* transpose16_avx512.h — private to src/cpu: the 16 x 16 dword transpose
 * the AMX kernels (matmul_amx.c, matmul_bf16_amx.c) use to turn rows into
 * tile columns. Include only from files compiled with AVX-512F. */
#ifndef KVB_TRANSPOSE16_AVX512_H
#define KVB_TRANSPOSE16_AVX512_H

#include <immintrin.h>

/* 16 x 16 dwords: r[i] lane j -> r[j] lane i. */
static inline void transpose16(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* Now 128-bit lane k of r[4a + c] holds column 4k + c of rows 4a..4a+3;
     * two rounds of 128-bit shuffles put the four pieces of each column in
     * one vector. */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], _MM_SHUFFLE(3, 1, 3, 1));
        t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], _MM_SHUFFLE(2, 0, 2, 0));
        r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], _MM_SHUFFLE(3, 1, 3, 1));
        r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

#endif
