/* matmul_float_avx512.c — AVX-512 products with F32, F16 and BF16 weights:
 * R x T tiles of FMAs over the float copy of the input (mm_input.xf), each
 * output reduced by the same reduce16 as the quantized paths. */
#include "cpu/matmul_avx512_impl.h"

#define FTILE_R 4
#define FTILE_T 4

static inline __m512 load_w16(enum ggml_type type, const uint8_t *row, int64_t k, __mmask16 m)
{
    switch (type) {
    case GGML_TYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
    case GGML_TYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * k)), 16));
    default: return _mm512_maskz_loadu_ps(m, row + 4 * k);
    }
}

struct ftile {
    enum ggml_type type;
    const uint8_t *w;
    size_t w_stride;
    const float *x;
    int64_t x_stride;
    int64_t n_in;
    float *y;
    int64_t ldy;
};

static inline __attribute__((always_inline)) void tile_f(const int R, const int T, const struct ftile *a)
{
    __m512 facc[FTILE_R][FTILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < a->n_in; k += 16) {
        /* The input copy is zero-padded to 16; only the weights need a mask. */
        __mmask16 m = a->n_in - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (a->n_in - k)) - 1);
        __m512 wv[FTILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = load_w16(a->type, a->w + r * a->w_stride, k, m);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_load_ps(a->x + t * a->x_stride + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) facc[r][t] = _mm512_fmadd_ps(wv[r], xv, facc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[t * a->ldy + r] = reduce16(facc[r][t]);
}

/* clang-format off */ /* a table of cases */
#define FCASE(R_, T_) \
    case (R_) * 8 + (T_): tile_f(R_, T_, a); break;

static void tile_f_any(int R, int T, const struct ftile *a)
{
    switch (R * 8 + T) {
        FCASE(1, 1) FCASE(1, 2) FCASE(1, 3) FCASE(1, 4)
        FCASE(2, 1) FCASE(2, 2) FCASE(2, 3) FCASE(2, 4)
        FCASE(3, 1) FCASE(3, 2) FCASE(3, 3) FCASE(3, 4)
        FCASE(4, 1) FCASE(4, 2) FCASE(4, 3) FCASE(4, 4)
    default: break;
    }
}
/* clang-format on */

void mm_avx512_rows_float(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += FTILE_R) {
        int rr = (int)(r1 - r < FTILE_R ? r1 - r : FTILE_R);
        for (int64_t t0 = 0; t0 < in->n_tok; t0 += FTILE_T) {
            int tt = (int)(in->n_tok - t0 < FTILE_T ? in->n_tok - t0 : FTILE_T);
            struct ftile a = {w->type,
                              (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                              w->row_bytes,
                              in->xf + t0 * in->xf_stride,
                              in->xf_stride,
                              in->n_in,
                              y + t0 * w->n_out + r,
                              w->n_out};
            tile_f_any(rr, tt, &a);
        }
    }
}
