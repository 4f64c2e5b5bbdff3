/* matmul_panel_avx512.c — the many-token path (prefill) of the AVX-512
 * products: a panel of PANEL_ROWS weight rows is unpacked into scratch once
 * and R x T micro-kernel tiles reuse it from L1 for every token, so the path
 * is bound by vpdpbusd, not by memory. Same arithmetic per output element as
 * the fused path (matmul_fused_avx512.c); layout: matmul_avx512.c. */
#include "cpu/matmul_avx512_wgroup.h"

#define TILE_R 4 /* rows per micro-kernel */
#define TILE_T 3 /* tokens per micro-kernel */
/* Tokens whose quantized input is kept hot while one panel is applied. */
#define TOKEN_BUDGET_BYTES (512 * 1024)

/* ---- one weight row, unpacked into the panel ------------------------------------ */

static inline __attribute__((always_inline)) void unpack_row_t(enum ggml_type type, int packed, const uint8_t *row,
                                                               const struct lay *lp, uint8_t *out)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type_super(type);
    const struct lay l = *lp;
    const uint8_t *src = row;
    for (int64_t g = 0; g < l.n8; g++) {
        __m512i st[8];
        __m512 dw, mw;
        wgroup8_any(type, packed, src, st, &dw, &mw);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) _mm512_store_si512(out + 64 * k, st[k]);
        _mm512_store_ps(out + 512, dw);
        _mm512_store_ps(out + 576, mw);
        src += 16 * wt.block_bytes;
        out += 640;
    }
    for (int64_t g = 0; g < l.n4; g++) {
        __m512i st[4];
        __m512 dw, mw;
        wgroup_any(type, src, k_quant ? 8 : g == l.n4 - 1 ? l.last4 : GROUP_BLOCKS, st, &dw, &mw);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) _mm512_store_si512(out + 64 * k, st[k]);
        _mm512_store_ps(out + 256, dw);
        _mm512_store_ps(out + 320, mw);
        src = group_src(src, k_quant, wt.block_bytes, 1);
        out += 384;
    }
    if (l.n1) {
        __m512i st;
        __m512 dw, mw;
        wgroup1(type, src, l.last1, &st, &dw, &mw);
        _mm512_store_si512(out, st);
        _mm512_store_ps(out + 64, dw);
        _mm512_store_ps(out + 128, mw);
    }
}

/* Row unpacking for the panel path, one instance per type. */
static void unpack_row(enum ggml_type type, int packed, const uint8_t *row, const struct lay *l, uint8_t *out)
{
    switch (type) {
    case GGML_TYPE_Q4_0: unpack_row_t(GGML_TYPE_Q4_0, packed, row, l, out); break;
    case GGML_TYPE_Q4_1: unpack_row_t(GGML_TYPE_Q4_1, packed, row, l, out); break;
    case GGML_TYPE_Q5_0: unpack_row_t(GGML_TYPE_Q5_0, packed, row, l, out); break;
    case GGML_TYPE_Q5_1: unpack_row_t(GGML_TYPE_Q5_1, packed, row, l, out); break;
    case GGML_TYPE_Q8_0: unpack_row_t(GGML_TYPE_Q8_0, packed, row, l, out); break;
    case GGML_TYPE_Q4_K: unpack_row_t(GGML_TYPE_Q4_K, packed, row, l, out); break;
    case GGML_TYPE_Q6_K: unpack_row_t(GGML_TYPE_Q6_K, packed, row, l, out); break;
    case GGML_TYPE_Q2_K: unpack_row_t(GGML_TYPE_Q2_K, packed, row, l, out); break;
    case GGML_TYPE_Q3_K: unpack_row_t(GGML_TYPE_Q3_K, packed, row, l, out); break;
    case GGML_TYPE_Q5_K: unpack_row_t(GGML_TYPE_Q5_K, packed, row, l, out); break;
    case GGML_TYPE_IQ4_NL: unpack_row_t(GGML_TYPE_IQ4_NL, packed, row, l, out); break;
    case GGML_TYPE_IQ4_XS: unpack_row_t(GGML_TYPE_IQ4_XS, packed, row, l, out); break;
    default: break;
    }
}

/* ---- the micro-kernels ----------------------------------------------------------- */

/* reduce16 of four vectors at once, result i in lane i: the same pairs are
 * added at every level (v[j] + v[j+8], then + 4, + 2, + 1), so each result
 * is bit for bit reduce16's, for a quarter of the shuffles. */
static inline __m128 reduce16x4(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 c = _mm512_add_ps(b, _mm512_permute_ps(b, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 d = _mm512_add_ps(c, _mm512_movehdup_ps(c));
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), d));
}

struct qtile {
    const uint8_t *w; /* first panel row */
    size_t w_stride;  /* bytes per panel row */
    const uint8_t *x; /* first token (its form for this type) */
    size_t x_stride;  /* bytes per token */
    const struct lay *l;
    __m512i kshift4; /* log2 of the per-lane bias in S4 groups (see type_kshift) */
    __m512i kshift;  /* the same in S8 and S1 groups (one bias for all lanes) */
    int bias, has_min;
    float *y; /* y[t * ldy + r] */
    int64_t ldy;
};

/* One group of S steps (the g-th of the row; steps at qo in the input, the
 * weight group at wo in a panel row) for R rows x T tokens. */
static inline __attribute__((always_inline)) void seg_q(const int R, const int T, const int S, const struct qtile *a,
                                                        int64_t g, size_t qo, size_t wo, __m512i kshift,
                                                        __m512 facc[TILE_R][TILE_T])
{
    const int64_t ng = a->l->ng;
    const size_t xs_off = a->l->qbytes + 64 * (size_t)g, sxs_off = xs_off + (size_t)ng * 64,
                 sx_off = sxs_off + (size_t)ng * 64;
    const uint8_t *wg = a->w + wo;
    const uint8_t *xg = a->x + qo;
    __m512i acc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m512i b0 = _mm512_setzero_si512();
        if (a->bias)
            b0 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                  _mm512_sllv_epi32(_mm512_load_si512(a->x + t * a->x_stride + sx_off), kshift));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = b0;
    }
#pragma GCC unroll 8
    for (int s = 0; s < S; s++) {
        __m512i wv[TILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = _mm512_load_si512(wg + r * a->w_stride + 64 * s);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512i xv = _mm512_load_si512(xg + t * a->x_stride + 64 * s);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv[r], xv);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *xt = a->x + t * a->x_stride;
        __m512 xs = _mm512_load_ps(xt + xs_off);
        __m512 sxs = a->has_min ? _mm512_load_ps(xt + sxs_off) : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *wr = wg + r * a->w_stride;
            facc[r][t] = group_fma(facc[r][t], acc[r][t], _mm512_load_ps(wr + 64 * S), xs, a->has_min,
                                   _mm512_load_ps(wr + 64 * S + 64), sxs);
        }
    }
}

/* R rows x T tokens of unpacked panel, all groups. Loops over r and t are
 * unrolled at each constant (R, T). */
static inline __attribute__((always_inline)) void tile_q(const int R, const int T, const struct qtile *a)
{
    const struct lay *l = a->l;
    __m512 facc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    int64_t g = 0;
    size_t qo = 0, wo = 0;
    for (int64_t i = 0; i < l->n8; i++, g++, qo += 512, wo += 640) seg_q(R, T, 8, a, g, qo, wo, a->kshift, facc);
    for (int64_t i = 0; i < l->n4; i++, g++, qo += 256, wo += 384) seg_q(R, T, 4, a, g, qo, wo, a->kshift4, facc);
    if (l->n1) seg_q(R, T, 1, a, g, qo, wo, a->kshift, facc);
    if (R == 4) {
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            _mm_storeu_ps(a->y + t * a->ldy, reduce16x4(facc[0][t], facc[1][t], facc[2][t], facc[3][t]));
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[t * a->ldy + r] = reduce16(facc[r][t]);
}

/* clang-format off */ /* a table of cases */
#define QCASE(R_, T_) \
    case (R_) * 8 + (T_): tile_q(R_, T_, a); break;

static void tile_q_any(int R, int T, const struct qtile *a)
{
    switch (R * 8 + T) {
        QCASE(1, 1) QCASE(1, 2) QCASE(1, 3)
        QCASE(2, 1) QCASE(2, 2) QCASE(2, 3)
        QCASE(3, 1) QCASE(3, 2) QCASE(3, 3)
        QCASE(4, 1) QCASE(4, 2) QCASE(4, 3)
    default: break;
    }
}
/* clang-format on */

/* R rows against n whole tiles of TILE_T tokens, one after another in one
 * loop: with 576 inputs a tile is only 3 groups of work, and calling it
 * through the dispatch once per tile left its set-up and reduction
 * unoverlapped. Same arithmetic per output as tile_q alone. */
static inline __attribute__((always_inline)) void tile_q_row_run(const int R, struct qtile a, int64_t n)
{
    for (int64_t k = 0; k < n; k++) {
        tile_q(R, TILE_T, &a);
        a.x += TILE_T * a.x_stride;
        a.y += TILE_T * a.ldy;
    }
}

static void tile_q_rows(int R, const struct qtile *a, int64_t n)
{
    switch (R) {
    case 1: tile_q_row_run(1, *a, n); break;
    case 2: tile_q_row_run(2, *a, n); break;
    case 3: tile_q_row_run(3, *a, n); break;
    case 4: tile_q_row_run(4, *a, n); break;
    default: break;
    }
}

/* ---- the row loop ------------------------------------------------------------------ */

static inline __m512i uniform_kshift(int bias)
{
    return _mm512_set1_epi32(bias > 0 ? __builtin_ctz((unsigned)bias) : 0);
}

void mm_avx512_rows_panel(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                          uint8_t *panel)
{
    struct wtype wt = wtype_of(w->type);
    size_t xoff;
    const struct lay l = input_form(w->type, in->n_in, &xoff);
    const size_t prow = l.wbytes;
    const uint8_t *xq = in->xq + xoff;
    int64_t tchunk = (int64_t)(TOKEN_BUDGET_BYTES / in->xq_stride) / TILE_T * TILE_T;
    if (tchunk < TILE_T) tchunk = TILE_T;
    for (int64_t c0 = 0; c0 < in->n_tok; c0 += tchunk) {
        int64_t c1 = c0 + tchunk < in->n_tok ? c0 + tchunk : in->n_tok;
        for (int64_t p = r0; p < r1; p += PANEL_ROWS) {
            int64_t rp = r1 - p < PANEL_ROWS ? r1 - p : PANEL_ROWS;
            for (int64_t i = 0; i < rp; i++)
                unpack_row(w->type, w->packed != 0, (const uint8_t *)w->data + (size_t)(p + i) * w->row_bytes, &l,
                           panel + (size_t)i * prow);
            const int64_t n_whole = (c1 - c0) / TILE_T, t_tail = c0 + n_whole * TILE_T;
            for (int64_t i = 0; i < rp; i += TILE_R) {
                int rr = (int)(rp - i < TILE_R ? rp - i : TILE_R);
                struct qtile a = {panel + (size_t)i * prow,
                                  prow,
                                  xq + (size_t)c0 * in->xq_stride,
                                  in->xq_stride,
                                  &l,
                                  type_kshift(w->type, wt.bias),
                                  uniform_kshift(wt.bias),
                                  wt.bias,
                                  wt.has_min,
                                  y + c0 * w->n_out + p + i,
                                  w->n_out};
                tile_q_rows(rr, &a, n_whole);
                if (t_tail < c1) {
                    a.x = xq + (size_t)t_tail * in->xq_stride;
                    a.y = y + t_tail * w->n_out + p + i;
                    tile_q_any(rr, (int)(c1 - t_tail), &a);
                }
            }
        }
    }
}
