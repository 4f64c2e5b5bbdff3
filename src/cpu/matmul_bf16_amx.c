/* matmul_bf16_amx.c — products with F16 and BF16 weights on the AMX tile
 * unit (TDPBF16PS), for every token count.
 *
 * The split. An F16 weight w is exactly wh + wl with wh, wl bf16 (wh: w cut
 * to 8 significant bits; wl = w - wh has at most 3 and is exact, |wl| <
 * 2^-7 |w|); a BF16 weight is wh alone. An input x (float) becomes xh =
 * bf16(x) and xl = bf16(x - xh), both rounded to nearest even, so that x -
 * xh - xl is at most 2^-16 |x|. The tiles add, in fp32, wh * xh and the
 * cross products wh * xl (+ wl * xh for F16): three tile products per 32
 * inputs for F16, two for BF16. Left out per product: (x - xh - xl) * w and,
 * F16, wl * xl, so each product is off by at most 3.02 * 2^-16 |w x| (F16)
 * or 1.01 * 2^-16 |w x| (BF16), plus the tile unit's rounding of its sums.
 * test_quant (bf16_tol) holds every output to that bound against the exact
 * product. In practice (bench_bf16, BERT and Qwen3 shapes, Gaussian inputs):
 * RMS error 3-6e-7 of sum |w x| against 1.4e-8 for the AVX-512 kernels —
 * about 2^-21, far below what storing the weights as F16 costs (2^-12 per
 * weight) — but not the AVX-512 results.
 *
 * Not the AVX-512 bits, and no AVX-512 twin. The tile unit's dot product of
 * 16 pairs is not a chain of fp32 additions (measured here: it matches no
 * order of rounded adds; its error stays under 7 ulp of the sum of |terms|),
 * so no vector code can give its bits. Determinism holds another way: every
 * token count, one token (decode) included, runs on the tiles, and a C
 * element depends only on its row of A and its column of B, so each
 * output's value is fixed by (type, n_in) alone, as matmul_impl.h requires.
 * Inputs and products too small for a normal bf16 or fp32 (below 2^-126)
 * count as zero (the tile unit's DAZ/FTZ).
 *
 * The layout. A tiles are 16 weight rows x 32 inputs (F16: dword j of a row
 * pairs input j with input 16 + j, which needs no shuffle; BF16: the stored
 * pairs, read straight from the weights), B tiles 32 inputs x up to 16
 * tokens (one column per token, paired the same way), C tiles 16 rows x the
 * tokens. One output's order: per 32-input block in order, wh * xh into one
 * C tile, and the cross products (wh * xl, then wl * xh) into a second; the
 * two are added at the end.
 *
 * Weights are converted on the fly from their stored rows (no copy, the
 * mmap'd weights are read as they are), 16 rows at a time, a few rows after
 * each block's tile products so that the vector units convert while the
 * tile unit multiplies: for many tokens the next panel while this one is
 * used, for a few (decode) two blocks ahead into a ring kept in L1. The
 * input of a chunk of tokens is split once per thread into B tiles. */
#include "cpu/matmul_bf16_amx.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <string.h>

#include "cpu/transpose16_avx512.h"

#define NT 16                  /* tokens per tile (B columns) */
#define TILE 1024              /* bytes of one tile: 16 rows of 64 */
#define B_BUDGET (1024 * 1024) /* bytes of split input kept per chunk */
#define NR 16                  /* weight rows per panel (A rows, C rows) */
#define PREFETCH_BLOCKS 8      /* how far ahead in a row the conversion prefetches */
#define RING_SLOTS 4           /* blocks of A tiles in flight for a few tokens */

/* Tile registers (immediates). */
#define C0H 0 /* token tile 0, hh */
#define C0X 1 /* token tile 0, hl and lh */
#define C1H 2
#define C1X 3
#define TAH 4 /* weights, hi */
#define TAL 5 /* weights, lo (F16) */
#define TBH 6 /* input, hi */
#define TBL 7 /* input, lo */

struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

struct bscratch {
    int64_t chunk; /* tokens per chunk, a multiple of 2 * NT */
    size_t x;      /* [chunk / NT][kp][2][TILE]: the chunk's split input (B tiles) */
    size_t w;      /* [2][kp][2][TILE]: two panels' weights (A tiles): one used, one made */
    size_t c;      /* float [4][NR][16]: stored C tiles */
    size_t total;
};

static struct bscratch bscratch_of(int64_t n_in, int64_t n_tok)
{
    struct bscratch s;
    const int64_t kp = (n_in + 31) / 32;
    const size_t per_tile = (size_t)kp * 2 * TILE;
    int64_t chunk = (int64_t)(B_BUDGET / per_tile) / (2 * NT) * (2 * NT);
    if (chunk < 2 * NT) chunk = 2 * NT;
    const int64_t need = (n_tok + NT - 1) / NT * NT;
    if (chunk > need) chunk = need;
    s.chunk = chunk;
    s.x = 0;
    s.w = s.x + (size_t)((chunk + NT - 1) / NT) * per_tile;
    s.c = s.w + (size_t)kp * 4 * TILE;
    s.total = s.c + 4 * NR * 16 * sizeof(float);
    return s;
}

size_t mm_amx_bf16_scratch(const struct mm_weight *w, int64_t n_tok) { return bscratch_of(w->n_in, n_tok).total; }

static inline __mmask16 mask16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

static inline __mmask32 mask32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1);
}

/* fp32 bit patterns rounded to the nearest bf16 (ties to even). */
static inline __m512i rne_bf16(__m512i v)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(v, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(0x7FFF)), lsb);
    return _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
}

/* Two vectors of bf16-valued fp32 -> dword j = (a[j], b[j]): how the F16
 * path pairs the 32 inputs of a block (element j with element 16 + j), which
 * costs no shuffle. */
static inline __m512i pair_ab(__m512i a, __m512i b) { return _mm512_or_si512(b, _mm512_srli_epi32(a, 16)); }

/* ... -> the 32 bf16 in order (dword j = elements 2j, 2j + 1): how BF16
 * weights are stored, and so how the BF16 path pairs its inputs. */
static inline __m512i pair_seq(__m512i a, __m512i b)
{
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(a, odd, b);
}

/* Tokens [t0, t0 + mt) -> a token tile's B tiles of MT columns, per block hi
 * then lo: row j (4 * MT bytes), column t = pair j of token t's block (zero
 * past mt and past n_in). */
static void x_tiles(const struct mm_input *in, int f16, int64_t t0, int mt, int MT, uint8_t *b)
{
    const int64_t n_in = in->n_in, kp = (n_in + 31) / 32;
    for (int64_t kb = 0; kb < kp; kb++) {
        __m512i h[16], l[16];
        const int64_t k = 32 * kb;
        for (int t = 0; t < 16; t++) {
            if (t >= mt) {
                h[t] = l[t] = _mm512_setzero_si512();
                continue;
            }
            const float *x = in->xf + (t0 + t) * in->xf_stride + k;
            const __m512 x0 = _mm512_maskz_loadu_ps(mask16(n_in - k), x);
            const __m512 x1 = _mm512_maskz_loadu_ps(mask16(n_in - k - 16), x + 16);
            const __m512i h0 = rne_bf16(_mm512_castps_si512(x0)), h1 = rne_bf16(_mm512_castps_si512(x1));
            const __m512i l0 = rne_bf16(_mm512_castps_si512(_mm512_sub_ps(x0, _mm512_castsi512_ps(h0))));
            const __m512i l1 = rne_bf16(_mm512_castps_si512(_mm512_sub_ps(x1, _mm512_castsi512_ps(h1))));
            h[t] = f16 ? pair_ab(h0, h1) : pair_seq(h0, h1);
            l[t] = f16 ? pair_ab(l0, l1) : pair_seq(l0, l1);
        }
        transpose16(h);
        transpose16(l);
        uint8_t *bh = b + (size_t)kb * 2 * TILE;
        const __mmask16 cols = mask16(MT);
        for (int j = 0; j < 16; j++) {
            _mm512_mask_storeu_epi32(bh + 4 * MT * j, cols, h[j]);
            _mm512_mask_storeu_epi32(bh + TILE + 4 * MT * j, cols, l[j]);
        }
    }
}

/* F16 rows [p, p + rp) -> the panel's A tiles, per block hi then lo: row n,
 * dword j = (element j, element 16 + j) of row n's block (zero past rp and
 * past n_in). hi is the f16 value cut to 8 significant bits, lo the rest
 * (exact). Made a block at a time (wconv_block) between the tile products
 * of the panel before, so that the vector units convert while the tile unit
 * multiplies. */
struct wconv {
    const struct mm_weight *w;
    int64_t rp;
    int64_t kb, kp;      /* the next block to make, and how many there are */
    int64_t slots, slot; /* dst holds `slots` blocks; block kb goes to slot kb % slots */
    const uint8_t *row0; /* the panel's first row */
    uint8_t *dst;
};

static inline void wconv_start(struct wconv *cv, const struct mm_weight *w, int64_t p, int64_t rp, uint8_t *dst,
                               int64_t slots)
{
    cv->w = w;
    cv->rp = rp;
    cv->kb = cv->slot = 0;
    cv->kp = (w->n_in + 31) / 32;
    cv->slots = slots;
    cv->row0 = (const uint8_t *)w->data + (size_t)p * w->row_bytes;
    cv->dst = dst;
}

/* One row's 32 inputs (f0: elements 0..15, f1: 16..31) -> its hi and lo A tile rows. */
static inline void split_row(__m512 f0, __m512 f1, uint8_t *ah)
{
    const __m512i cut = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i h0 = _mm512_and_si512(_mm512_castps_si512(f0), cut);
    const __m512i h1 = _mm512_and_si512(_mm512_castps_si512(f1), cut);
    const __m512 l0 = _mm512_sub_ps(f0, _mm512_castsi512_ps(h0)), l1 = _mm512_sub_ps(f1, _mm512_castsi512_ps(h1));
    _mm512_store_si512(ah, pair_ab(h0, h1));
    _mm512_store_si512(ah + TILE, pair_ab(_mm512_castps_si512(l0), _mm512_castps_si512(l1)));
}

/* Makes the next block of the panel (all its 16 rows), if any is left. */
static inline void wconv_block(struct wconv *cv)
{
    if (cv->kb >= cv->kp) return;
    const struct mm_weight *w = cv->w;
    const int64_t k = 32 * cv->kb;
    const size_t rb = w->row_bytes;
    const uint8_t *src = cv->row0 + 2 * (size_t)k;
    uint8_t *ah = cv->dst + (size_t)cv->slot * 2 * TILE;
    if (cv->rp == NR && k + 32 <= w->n_in) { /* the bulk: whole rows of a whole block */
        const int pf = k + 32 * PREFETCH_BLOCKS < w->n_in;
#pragma GCC unroll 16
        for (int n = 0; n < NR; n++) {
            const uint8_t *r = src + (size_t)n * rb;
            if (pf) _mm_prefetch((const char *)(r + 64 * PREFETCH_BLOCKS), _MM_HINT_T0);
            split_row(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r)),
                      _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 32))), ah + 64 * n);
        }
    } else {
        const __mmask16 m0 = mask16(w->n_in - k), m1 = mask16(w->n_in - k - 16);
        for (int64_t n = 0; n < NR; n++) {
            if (n < cv->rp) {
                const uint8_t *r = src + (size_t)n * rb;
                split_row(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, r)),
                          _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, r + 32)), ah + 64 * n);
            } else {
                _mm512_store_si512(ah + 64 * n, _mm512_setzero_si512());
                _mm512_store_si512(ah + TILE + 64 * n, _mm512_setzero_si512());
            }
        }
    }
    cv->kb++;
    if (++cv->slot == cv->slots) cv->slot = 0;
}

static inline void wconv_all(struct wconv *cv)
{
    while (cv->kb < cv->kp) wconv_block(cv);
}

/* BF16 rows [p, p + rp), block kb: where its A tile is read (pointer and
 * row stride). Whole blocks of whole panels straight from the weights; a
 * partial block or panel is copied, zero-padded, into `a`. */
static inline const uint8_t *w_tile_bf16(const struct mm_weight *w, int64_t p, int64_t rp, int64_t kb, uint8_t *a,
                                         size_t *stride)
{
    const uint8_t *src = (const uint8_t *)w->data + (size_t)p * w->row_bytes + 64 * (size_t)kb;
    const int64_t left = w->n_in - 32 * kb;
    if (rp == NR && left >= 32) {
        *stride = w->row_bytes;
        return src;
    }
    for (int64_t n = 0; n < NR; n++)
        _mm512_store_si512(a + 64 * n, n < rp ? _mm512_maskz_loadu_epi16(mask32(left), src + (size_t)n * w->row_bytes)
                                              : _mm512_setzero_si512());
    *stride = 64;
    return a;
}

/* One block kb: token tile 0's hh product into C0H, its cross products
 * (hl, then lh for F16) into C0X; token tile 1 (if TWO) into C1H, C1X. */
#define BLOCK()                                                                                                        \
    do {                                                                                                               \
        size_t as = 64;                                                                                                \
        const uint8_t *ak = F16 ? wa + (size_t)(kb % slots) * 2 * TILE : w_tile_bf16(w, p, rp, kb, wa, &as);           \
        _tile_loadd(TAH, ak, as);                                                                                      \
        if (F16) _tile_loadd(TAL, ak + TILE, 64);                                                                      \
        _tile_loadd(TBH, x0 + (size_t)kb * 2 * TILE, bs);                                                              \
        _tile_loadd(TBL, x0 + (size_t)kb * 2 * TILE + TILE, bs);                                                       \
        _tile_dpbf16ps(C0H, TAH, TBH);                                                                                 \
        _tile_dpbf16ps(C0X, TAH, TBL);                                                                                 \
        if (F16) _tile_dpbf16ps(C0X, TAL, TBH);                                                                        \
        if (++*tick == per) {                                                                                          \
            *tick = 0;                                                                                                 \
            wconv_block(cv);                                                                                           \
        }                                                                                                              \
        if (TWO) {                                                                                                     \
            _tile_loadd(TBH, x1 + (size_t)kb * 2 * TILE, bs);                                                          \
            _tile_loadd(TBL, x1 + (size_t)kb * 2 * TILE + TILE, bs);                                                   \
            _tile_dpbf16ps(C1H, TAH, TBH);                                                                             \
            _tile_dpbf16ps(C1X, TAH, TBL);                                                                             \
            if (F16) _tile_dpbf16ps(C1X, TAL, TBH);                                                                    \
        }                                                                                                              \
    } while (0)

static inline __attribute__((always_inline)) void panel_t(const int F16, const int TWO, const struct mm_weight *w,
                                                          int64_t p, int64_t rp, int64_t kp, uint8_t *wa, int64_t slots,
                                                          const uint8_t *x0, const uint8_t *x1, size_t bs, float *c,
                                                          struct wconv *cv, int64_t per, int64_t *tick)
{
    _tile_zero(C0H);
    _tile_zero(C0X);
    if (TWO) {
        _tile_zero(C1H);
        _tile_zero(C1X);
    }
    for (int64_t kb = 0; kb < kp; kb++) BLOCK();
    _tile_stored(C0H, c, 64);
    _tile_stored(C0X, c + 256, 64);
    if (TWO) {
        _tile_stored(C1H, c + 512, 64);
        _tile_stored(C1X, c + 768, 64);
    }
}

static void panel(int f16, int two, const struct mm_weight *w, int64_t p, int64_t rp, int64_t kp, uint8_t *wa,
                  int64_t slots, const uint8_t *x0, const uint8_t *x1, size_t bs, float *c, struct wconv *cv,
                  int64_t per, int64_t *tick)
{
    if (f16) {
        if (two) panel_t(1, 1, w, p, rp, kp, wa, slots, x0, x1, bs, c, cv, per, tick);
        else panel_t(1, 0, w, p, rp, kp, wa, slots, x0, x1, bs, c, cv, per, tick);
    } else {
        if (two) panel_t(0, 1, w, p, rp, kp, wa, slots, x0, x1, bs, c, cv, per, tick);
        else panel_t(0, 0, w, p, rp, kp, wa, slots, x0, x1, bs, c, cv, per, tick);
    }
}

/* C (rows: the panel's weight rows; columns: tokens), hh + cross products ->
 * y rows [p, p + rp) of the tile's mt tokens. */
static inline void out_tile(const float *ce, const float *co, int mt, int64_t rp, float *y, int64_t ldy)
{
    __m512i r[16];
#pragma GCC unroll 16
    for (int n = 0; n < 16; n++)
        r[n] = _mm512_castps_si512(_mm512_add_ps(_mm512_load_ps(ce + 16 * n), _mm512_load_ps(co + 16 * n)));
    transpose16(r);
    const __mmask16 m = mask16(rp);
    for (int t = 0; t < mt; t++) _mm512_mask_storeu_ps(y + t * ldy, m, _mm512_castsi512_ps(r[t]));
}

void mm_amx_rows_bf16(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                      void *scratch)
{
    const int f16 = w->type == GGML_TYPE_F16;
    const int64_t kp = (in->n_in + 31) / 32;
    const struct bscratch sc = bscratch_of(in->n_in, in->n_tok);
    uint8_t *s = scratch;
    const size_t x_tile = (size_t)kp * 2 * TILE;
    float *c = (float *)(s + sc.c);
    memset(c, 0, 4 * NR * 16 * sizeof(float)); /* columns past MT are never written */
    /* Fewer than 16 tokens: B and C tiles of that many columns (a column's
     * result does not depend on the others). */
    const int MT = in->n_tok < NT ? (int)in->n_tok : NT;
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = C0H; i <= C1X; i++) cfg.colsb[i] = (uint16_t)(4 * MT), cfg.rows[i] = NR;
    for (int i = TAH; i <= TAL; i++) cfg.colsb[i] = 64, cfg.rows[i] = NR;
    for (int i = TBH; i <= TBL; i++) cfg.colsb[i] = (uint16_t)(4 * MT), cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    for (int64_t c0 = 0; c0 < in->n_tok; c0 += sc.chunk) {
        const int64_t c1 = c0 + sc.chunk < in->n_tok ? c0 + sc.chunk : in->n_tok;
        const int64_t ntt = (c1 - c0 + NT - 1) / NT;
        for (int64_t i = 0; i < ntt; i++) {
            const int64_t t0 = c0 + NT * i;
            x_tiles(in, f16, t0, (int)(c1 - t0 < NT ? c1 - t0 : NT), MT, s + sc.x + (size_t)i * x_tile);
        }
        /* F16, many tokens: panel p's A tiles are in wa[cur], and the next
         * panel's are made into wa[!cur] a few rows after each block's tile
         * products. A few tokens (two token tiles or less): each block is
         * made two blocks ahead into a ring of RING_SLOTS (kept in L1). */
        uint8_t *wa[2] = {s + sc.w, s + sc.w + (size_t)kp * 2 * TILE};
        const int ring = ntt <= 2;
        const int64_t slots = ring ? RING_SLOTS : kp;
        /* a block is made every `per` blocks' tile products: every one
         * (ring), or once per token tile pair (next panel) */
        const int64_t per = ring ? 1 : (ntt + 1) / 2;
        int64_t tick = 0;
        int cur = 0;
        struct wconv cv;
        wconv_start(&cv, w, r0, r1 - r0 < NR ? r1 - r0 : NR, wa[0], slots);
        if (!f16) cv.kp = 0; /* BF16: read as stored */
        if (ring) {
            wconv_block(&cv);
            wconv_block(&cv);
        } else wconv_all(&cv);
        for (int64_t p = r0; p < r1; p += NR) {
            const int64_t rp = r1 - p < NR ? r1 - p : NR;
            if (!ring) {
                if (p + NR < r1) wconv_start(&cv, w, p + NR, r1 - p - NR < NR ? r1 - p - NR : NR, wa[!cur], slots);
                if (p + NR >= r1 || !f16) cv.kp = 0;
                tick = 0;
            }
            for (int64_t i = 0; i < ntt; i += 2) {
                const int two = i + 1 < ntt;
                const uint8_t *x0 = s + sc.x + (size_t)i * x_tile;
                panel(f16, two, w, p, rp, kp, wa[cur], slots, x0, x0 + x_tile, (size_t)(4 * MT), c, &cv, per, &tick);
                const int64_t t0 = c0 + NT * i;
                out_tile(c, c + 256, (int)(c1 - t0 < NT ? c1 - t0 : NT), rp, y + t0 * w->n_out + p, w->n_out);
                if (two)
                    out_tile(c + 512, c + 768, (int)(c1 - t0 - NT < NT ? c1 - t0 - NT : NT), rp,
                             y + (t0 + NT) * w->n_out + p, w->n_out);
            }
            if (ring) {
                if (p + NR < r1 && f16) {
                    wconv_start(&cv, w, p + NR, r1 - p - NR < NR ? r1 - p - NR : NR, wa[0], slots);
                    wconv_block(&cv);
                    wconv_block(&cv);
                }
            } else {
                wconv_all(&cv);
                cur = !cur;
            }
        }
    }
    _tile_release();
}

#else

size_t mm_amx_bf16_scratch(const struct mm_weight *w, int64_t n_tok)
{
    (void)w;
    (void)n_tok;
    return 0;
}

void mm_amx_rows_bf16(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                      void *scratch)
{
    (void)w, (void)in, (void)y, (void)r0, (void)r1, (void)scratch;
}

#endif
