/* matmul_decode_amx.c — products of a few tokens (decode) with weights in
 * the AMX panel form (matmul_amx_impl.h), on the AVX-512 VNNI units.
 *
 * A tile product would spend a 512-byte B tile (stored, then loaded) on one
 * token's 512 multiplies; decode is bound by the weight stream, so here the
 * panel's bytes go straight from memory into vpdpbusd, vectorised over the
 * panel's 16 rows: one load of a unit's nibbles serves 16 rows, and each
 * token's input dword is a broadcast. The integer sum of each unit (lane L of
 * group g) is the one the AVX-512 lane holds (stored unsigned values times
 * the input, minus bias times the lane sum of the input: the same integer),
 * and the float steps are theirs in their order (matmul_amx.c says why that
 * makes the results equal bit for bit). Lanes are taken one at a time, so a
 * lane's sums for the 1 to 8 tokens of a pass stay in registers; the 16
 * lanes are added at the end by reduce16's tree, vectorised over the rows. */
#include <string.h>

#include "cpu/matmul_amx_impl.h"

/* How far ahead the next panel is prefetched while one is computed: the
 * units of a panel are read lane by lane (strided), so the hardware
 * prefetcher is helped along with a linear sweep of the next panel, into
 * L2 (T1): into L1 (T0) the sweep overran the fill buffers and perf put
 * three quarters of Gemma 3 270M's Q8_0 head on the prefetch instruction;
 * T1 took a decode token from 24.4 to 21.6 ms of CPU time (one thread).
 * Starting the sweep 2-8 KiB ahead instead of at the next panel was slower,
 * 16-24 KiB the same. */
#define PREFETCH_PER_UNIT 320

static inline __m512i bcast_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32((int)v);
}

static inline __attribute__((always_inline)) void decode_t(const enum ggml_type type, const int T,
                                                           const struct mm_weight *w, const struct mm_input *in,
                                                           int64_t t0, float *y, int64_t r0, int64_t r1, float *facc)
{
    size_t xoff;
    const struct lay l = input_form(type, in->n_in, &xoff);
    const int64_t nb = in->n_in / 32, ng = l.ng;
    const struct wtype wt = wtype_of(type);
    const int q8 = type == GGML_TYPE_Q8_0, bs = wide_bs(type), nq = bs - (type == GGML_TYPE_Q4_1 ? 4 : 2);
    const size_t natoff = avx_bytes(in->n_in);
    const uint8_t *xn[DECODE_T], *xa[DECODE_T];
    for (int t = 0; t < T; t++) {
        xn[t] = in->xq + (size_t)(t0 + t) * in->xq_stride + natoff;
        xa[t] = in->xq + (size_t)(t0 + t) * in->xq_stride + xoff;
    }
    const size_t xs_off = l.qbytes, sxs_off = xs_off + (size_t)ng * 64, sx_off = sxs_off + (size_t)ng * 64;
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    const uint8_t *end = (const uint8_t *)w->data + (size_t)r1 * w->row_bytes;
    for (int64_t p = r0; p < r1; p += NR) {
        const int64_t rp = r1 - p < NR ? r1 - p : NR;
        const __mmask16 mrows = (__mmask16)((1u << rp) - 1);
        const uint8_t *pd = (const uint8_t *)w->data + (size_t)p * w->row_bytes;
        const uint8_t *pf = pd + (size_t)rp * w->row_bytes; /* the next panel */
        if (p == r0)
            for (const uint8_t *q = pd; q < pf && q < pd + 8192; q += 64) _mm_prefetch((const char *)q, _MM_HINT_T0);
        for (int L = 0; L < 16; L++) {
            __m512 acc[DECODE_T];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
            for (int64_t g = 0; g < ng; g++) {
                for (int k = 0; k < PREFETCH_PER_UNIT && pf < end; k += 64, pf += 64)
                    _mm_prefetch((const char *)pf, _MM_HINT_T1);
                const int S = group_steps(&l, g);
                int sub;
                const int64_t blk = unit_block(&l, nb, g, L, &sub);
                __m512i isum[DECODE_T];
                __m512 dw = _mm512_setzero_ps(), mw = _mm512_setzero_ps();
                int x16 = 0;
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) isum[t] = _mm512_setzero_si512();
                if (blk >= 0 && S == 8) { /* the bulk: all 8 dwords of a block */
                    const uint8_t *o = pd + (size_t)(blk * rp * bs);
                    __m512i v[8];
                    if (q8) {
#pragma GCC unroll 8
                        for (int d = 0; d < 8; d++)
                            v[d] = _mm512_xor_si512(_mm512_maskz_loadu_epi32(mrows, o + 4 * rp * d), flip);
                    } else {
#pragma GCC unroll 4
                        for (int d = 0; d < 4; d++) {
                            const __m512i q = _mm512_maskz_loadu_epi32(mrows, o + 4 * rp * d);
                            v[d] = _mm512_and_si512(q, m4);
                            v[d + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                        }
                    }
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++) {
                        int32_t sx;
                        memcpy(&sx, xa[t] + sx_off + 64 * g + 4 * L, 4);
                        __m512i a = _mm512_set1_epi32(-wt.bias * sx);
                        const uint8_t *x = xn[t] + 32 * blk;
#pragma GCC unroll 8
                        for (int d = 0; d < 8; d++) a = _mm512_dpbusd_epi32(a, v[d], bcast_u32(x + 4 * d));
                        isum[t] = a;
                    }
                    dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mrows, o + rp * nq));
                    if (wt.has_min) mw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mrows, o + rp * nq + 2 * rp));
                } else if (blk >= 0) { /* S4 and S1 units (rows whose blocks are not a multiple of 16) */
                    const uint8_t *o = pd + (size_t)(blk * rp * bs);
                    /* which stored dwords the unit reads, and the input's dword of each */
                    const int n = S == 8 ? 8 : S == 4 ? 4 : 1, first = S == 8 ? 0 : S == 4 ? 4 * sub : sub;
                    for (int t = 0; t < T; t++) {
                        int32_t sx;
                        memcpy(&sx, xa[t] + sx_off + 64 * g + 4 * L, 4);
                        isum[t] = _mm512_set1_epi32(-wt.bias * sx);
                    }
                    for (int i = 0; i < n; i++) {
                        const int d = first + i; /* element dword of the block: 0..7 */
                        __m512i v;
                        if (q8) {
                            v = _mm512_xor_si512(_mm512_maskz_loadu_epi32(mrows, o + 4 * rp * d), flip);
                        } else {
                            v = _mm512_maskz_loadu_epi32(mrows, o + 4 * rp * (d & 3));
                            v = _mm512_and_si512(d < 4 ? v : _mm512_srli_epi16(v, 4), m4);
                        }
                        for (int t = 0; t < T; t++)
                            isum[t] = _mm512_dpbusd_epi32(isum[t], v, bcast_u32(xn[t] + 32 * blk + 4 * d));
                    }
                    dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mrows, o + rp * nq));
                    if (!q8 && S == 4 && sub) { /* high nibbles kept x 16 in the AVX-512 lane */
                        dw = _mm512_mul_ps(dw, _mm512_set1_ps(0.0625f));
                        x16 = 1;
                    }
                    if (wt.has_min) mw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mrows, o + rp * nq + 2 * rp));
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    float xs, sxs;
                    memcpy(&xs, xa[t] + xs_off + 64 * g + 4 * L, 4);
                    __m512i is = x16 ? _mm512_slli_epi32(isum[t], 4) : isum[t];
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(xs)), acc[t]);
                    if (wt.has_min) {
                        memcpy(&sxs, xa[t] + sxs_off + 64 * g + 4 * L, 4);
                        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sxs), acc[t]);
                    }
                }
            }
            for (int t = 0; t < T; t++) _mm512_store_ps(facc + 256 * t + 16 * L, acc[t]);
        }
        /* reduce16's tree over the lanes, vectorised over the rows */
        for (int t = 0; t < T; t++) {
            const float *f = facc + 256 * t;
            __m512 a[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                a[i] = _mm512_add_ps(_mm512_load_ps(f + 16 * i), _mm512_load_ps(f + 16 * (i + 8)));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) a[i] = _mm512_add_ps(a[i], a[i + 4]);
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) a[i] = _mm512_add_ps(a[i], a[i + 2]);
            _mm512_mask_storeu_ps(y + (t0 + t) * w->n_out + p, mrows, _mm512_add_ps(a[0], a[1]));
        }
    }
}

#define DECODE_TYPE(T_)                                                                                                \
    switch (w->type) {                                                                                                 \
    case GGML_TYPE_Q4_0: decode_t(GGML_TYPE_Q4_0, T_, w, in, t0, y, r0, r1, scratch); break;                           \
    case GGML_TYPE_Q4_1: decode_t(GGML_TYPE_Q4_1, T_, w, in, t0, y, r0, r1, scratch); break;                           \
    case GGML_TYPE_Q8_0: decode_t(GGML_TYPE_Q8_0, T_, w, in, t0, y, r0, r1, scratch); break;                           \
    default: break;                                                                                                    \
    }

void mm_amx_rows_decode(const struct mm_weight *w, const struct mm_input *in, int64_t t_from, float *y, int64_t r0,
                        int64_t r1, void *scratch)
{
    for (int64_t t0 = t_from; t0 < in->n_tok; t0 += DECODE_T) {
        switch (in->n_tok - t0 < DECODE_T ? in->n_tok - t0 : DECODE_T) {
        case 1: DECODE_TYPE(1) break;
        case 2: DECODE_TYPE(2) break;
        case 3: DECODE_TYPE(3) break;
        case 4: DECODE_TYPE(4) break;
        case 5: DECODE_TYPE(5) break;
        case 6: DECODE_TYPE(6) break;
        case 7: DECODE_TYPE(7) break;
        default: DECODE_TYPE(8) break;
        }
    }
}
