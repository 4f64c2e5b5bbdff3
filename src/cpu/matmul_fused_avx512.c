/* matmul_fused_avx512.c — the few-token path (decode, n_tok <= FUSED_T) of
 * the AVX-512 products: each weight group is unpacked in registers
 * (matmul_avx512_wgroup.h) and used at once for every token, so the weights
 * stream through once, with software prefetch, and the path is bound by
 * memory bandwidth. Same arithmetic per output element as the panel path
 * (matmul_panel_avx512.c); layout: matmul_avx512.c. */
#include "cpu/matmul_avx512_wgroup.h"

/* How far ahead the fused path prefetches weights (bytes), and into L2
 * (T1): a longer distance keeps more lines in flight than one core's L1
 * fill buffers hold, and the prefetches themselves then stall (perf: a
 * quarter of the MoE bench's batch-1 decode sat on them at 8 KiB, T0).
 * Measured on the 2-core test machine, one thread, CPU time: the MoE bench
 * model (Q4_K experts, rows of 1152 bytes, 64-row work items) decoded 16.7
 * tokens per CPU-second at 8 KiB T0, 21 at 2 KiB (T0 or T1), 19.5 at 4 KiB,
 * 20.2 at 1 KiB; after the faster Q4_K scales, 26.5 at 2 KiB T1, 25.7 T0,
 * 21.3 at 8 KiB. A 4096 x 8192 Q4_0 product streamed from memory: 1.71 ms
 * against 2.02 at 8 KiB. -D to tune elsewhere. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

/* The float step of one group of S steps for T tokens (fused path). */
static inline __attribute__((always_inline)) void fused_group(const int T, const int S, const __m512i *st, __m512 dw,
                                                              __m512 mw, int has_min, const uint8_t *x0,
                                                              size_t x_stride, size_t qo, size_t meta, size_t ng64,
                                                              const __m512i *start, __m512 *facc)
{
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *xt = x0 + t * x_stride;
        __m512i acc = start[t];
#pragma GCC unroll 8
        for (int s = 0; s < S; s++) acc = _mm512_dpbusd_epi32(acc, st[s], _mm512_load_si512(xt + qo + 64 * s));
        __m512 sxs = has_min ? _mm512_load_ps(xt + meta + ng64) : _mm512_setzero_ps();
        facc[t] = group_fma(facc[t], acc, dw, _mm512_load_ps(xt + meta), has_min, mw, sxs);
    }
}

static inline __attribute__((always_inline)) void fused_rows_t(const enum ggml_type type, const int T,
                                                               const struct mm_weight *w, const struct mm_input *in,
                                                               int64_t t0, float *y, int64_t r0, int64_t r1,
                                                               void *scratch)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type_super(type);
    size_t xoff;
    const struct lay l = input_form(type, in->n_in, &xoff);
    const int64_t ng = l.ng;
    const size_t ng64 = (size_t)ng * 64, sx_off = l.qbytes + 2 * ng64;
    const uint8_t *x0 = in->xq + xoff + (size_t)t0 * in->xq_stride;
    /* The integer start values depend on the token only: computed once,
     * start[g * T + t]. */
    __m512i *start = scratch;
    const __m512i kneg4 = type_kneg(type, wt.bias), kneg = _mm512_set1_epi32(-wt.bias);
    for (int64_t g = 0; g < ng; g++)
        for (int t = 0; t < T; t++) {
            int s4 = g >= l.n8 && g < l.n8 + l.n4;
            start[g * T + t] = wt.bias ? _mm512_mullo_epi32(_mm512_load_si512(x0 + t * in->xq_stride + sx_off + 64 * g),
                                                            s4 ? kneg4 : kneg)
                                       : _mm512_setzero_si512();
        }
    const uint8_t *end = (const uint8_t *)w->data + (size_t)r1 * w->row_bytes;
    /* The first rows too: the hardware prefetcher needs a while to notice. */
    for (const uint8_t *p = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
         p < end && p < (const uint8_t *)w->data + (size_t)r0 * w->row_bytes + PREFETCH_BYTES; p += 64)
        _mm_prefetch((const char *)p, _MM_HINT_T0);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        /* Weights are read once: ask for them well ahead so that the memory
         * stream never waits on the arithmetic. */
        if (r + 1 < r1 && row + w->row_bytes + PREFETCH_BYTES < end)
            for (size_t o = 0; o < w->row_bytes; o += 64)
                _mm_prefetch((const char *)row + PREFETCH_BYTES + o, _MM_HINT_T1);
        __m512 facc[FUSED_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[t] = _mm512_setzero_ps();
        const uint8_t *src = row;
        int64_t g = 0;
        size_t qo = 0;
        for (int64_t i = 0; i < l.n8; i++, g++, qo += 512) {
            __m512i st[8];
            __m512 dw, mw;
            wgroup8_any(type, w->packed != 0, src, st, &dw, &mw);
            fused_group(T, 8, st, dw, mw, wt.has_min, x0, in->xq_stride, qo, l.qbytes + 64 * g, ng64, start + g * T,
                        facc);
            src += 16 * wt.block_bytes;
        }
        for (int64_t i = 0; i < l.n4; i++, g++, qo += 256) {
            __m512i st[4];
            __m512 dw, mw;
            wgroup_any(type, src, k_quant ? 8 : i == l.n4 - 1 ? l.last4 : GROUP_BLOCKS, st, &dw, &mw);
            fused_group(T, 4, st, dw, mw, wt.has_min, x0, in->xq_stride, qo, l.qbytes + 64 * g, ng64, start + g * T,
                        facc);
            src = group_src(src, k_quant, wt.block_bytes, 1);
        }
        if (l.n1) {
            __m512i st;
            __m512 dw, mw;
            wgroup1(type, src, l.last1, &st, &dw, &mw);
            fused_group(T, 1, &st, dw, mw, wt.has_min, x0, in->xq_stride, qo, l.qbytes + 64 * g, ng64, start + g * T,
                        facc);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[(t0 + t) * w->n_out + r] = reduce16(facc[t]);
    }
}

#define FUSED_TYPE(T_)                                                                                                 \
    switch (w->type) {                                                                                                 \
    case GGML_TYPE_Q4_0: fused_rows_t(GGML_TYPE_Q4_0, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q4_1: fused_rows_t(GGML_TYPE_Q4_1, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q5_0: fused_rows_t(GGML_TYPE_Q5_0, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q5_1: fused_rows_t(GGML_TYPE_Q5_1, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q8_0: fused_rows_t(GGML_TYPE_Q8_0, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q4_K: fused_rows_t(GGML_TYPE_Q4_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q6_K: fused_rows_t(GGML_TYPE_Q6_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q2_K: fused_rows_t(GGML_TYPE_Q2_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q3_K: fused_rows_t(GGML_TYPE_Q3_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_Q5_K: fused_rows_t(GGML_TYPE_Q5_K, T_, w, in, t0, y, r0, r1, scratch); break;                       \
    case GGML_TYPE_IQ4_NL: fused_rows_t(GGML_TYPE_IQ4_NL, T_, w, in, t0, y, r0, r1, scratch); break;                   \
    case GGML_TYPE_IQ4_XS: fused_rows_t(GGML_TYPE_IQ4_XS, T_, w, in, t0, y, r0, r1, scratch); break;                   \
    default: break;                                                                                                    \
    }

void mm_avx512_rows_fused(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                          void *scratch)
{
    for (int64_t t0 = 0; t0 < in->n_tok; t0 += FUSED_T) {
        int64_t tt = in->n_tok - t0 < FUSED_T ? in->n_tok - t0 : FUSED_T;
        if (tt == 1) FUSED_TYPE(1)
        else if (tt == 2) FUSED_TYPE(2)
        else FUSED_TYPE(3)
    }
}
