/* matmul_amx.c — matrix products on the AMX tile unit (TDPBSSD), with the
 * AVX-512 VNNI kernels' results bit for bit: the kernel table, the input,
 * the packed panel form of the wide types, and the tile path. The pieces:
 * matmul_amx_impl.h.
 *
 * Entered only after matmul.c checked the CPU and the kernel's permission
 * for the tile state (cpu_features().amx). Who computes what: packed
 * weights (Q4_0, Q4_1, Q8_0) of many tokens (prefill chunks, batched decode)
 * run on tiles, of DECODE_MAX_TOK tokens or fewer in matmul_decode_amx.c;
 * F16 and BF16 weights run on BF16 tiles at every token count
 * (matmul_bf16_amx.c: NOT the AVX-512 results, a stated bound instead, see
 * there); everything else (F32 weights, the stored types: see AMX_STORED) in
 * the AVX-512 code, unchanged.
 *
 * What follows, "the AVX-512 ones bit for bit", is about the quantized
 * types only.
 *
 * Why the results are the AVX-512 ones. The AVX-512 kernels (matmul_avx512.c)
 * give each output element (row r, token t) 16 float lanes; a row is cut into
 * groups, and in each group lane L holds the exact integer dot product of one
 * "unit" of the row (a 32-block, half of one, or 4 elements, depending on the
 * group's kind) and takes one float step:
 *
 *   acc[L] = fma(float(isum[L]), dw[L] * xs[L], acc[L])   [then fma(mw[L], sxs[L], acc[L])]
 *
 * then the 16 lanes are added by one fixed tree. The integer isum of a unit
 * is exact whatever unit computes it, so this file computes it on tiles, one
 * tile product per unit: C[t][r] = the unit's dot product for 16 tokens x 16
 * rows, K = 32 bytes (units of 16 or 4 elements read 32 bytes of the input
 * against weights padded with zeros). It then runs the same float step with
 * the same operands, only vectorised over the 16 rows instead of over the
 * lanes (IEEE operations are per element, so which elements share a vector
 * cannot change a result), keeps acc[t][L] as vectors over rows, and adds
 * the lanes by the same tree. The per-lane scales (dw, mw) are the values
 * the AVX-512 group code makes (from stored rows: the same inline functions,
 * matmul_avx512_wgroup.h; from packed ones: the same conversions), and the
 * per-lane input scales (xs, sxs) are read from the AVX-512 form of the
 * input, which is kept beside the natural one the tiles read.
 *
 * One difference in the integer step: the AVX-512 code multiplies unsigned
 * weights (stored value + bias) by signed inputs and removes bias * sum(x);
 * the tiles take signed weights (the stored value minus its bias) and
 * signed inputs, so no correction is needed: the same integer either way.
 * Lanes whose AVX-512 weights are high nibbles kept in place (x 16) get their
 * tile sum multiplied by 16, which is what the AVX-512 lane holds.
 *
 * Weights: a panel of 16 rows is unpacked once per call (and per token
 * chunk) into B tiles, one per unit: B[k][4n + i] = weight (row n, byte
 * 4k + i of the unit), signed, 8 rows x 64 bytes; plus dw and mw of each unit
 * as 16 floats over the rows. From packed weights that is a few masks per
 * unit; from stored ones, the AVX-512 group code per row and a transpose.
 *
 * What the tile unit costs, measured here (one core): the tile product of a
 * unit (16 x 16 x 32) about 4 ns, storing its result about 4 ns in L1 but 17
 * ns outside L1 (so results go to a small ring read at once), its 48 vector
 * operations of float steps about 10 ns, and the two overlap little: about
 * 18-25 ns a unit, against about 38 ns for the same work in the AVX-512
 * kernels. Whole products, unpacking and input included (bench_amx, one
 * thread, timed in CPU time on a loaded machine, Q4_0 on Llama-3.2-3B shapes,
 * 512 tokens): 400-430 GOP/s against 250-350 for the AVX-512 kernels, a
 * layer's products 1.25-1.4x faster; the tile unit idles most of the time,
 * as every 32-element unit needs its own float steps to stay exact. */
#include <stdbool.h>

#include "cpu/matmul_impl.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <string.h>

#include "cpu/matmul_amx_impl.h"
#include "cpu/matmul_bf16_amx.h"
#include "cpu/transpose16_avx512.h"

const bool mm_amx_built = true;

/* F16 and BF16 weights: on BF16 tiles at every token count
 * (matmul_bf16_amx.c). */
static bool bf16_tiles(enum ggml_type t) { return t == GGML_TYPE_F16 || t == GGML_TYPE_BF16; }

/* Quantized products of stored (not packed) weights run on tiles from this
 * many tokens; fewer go to the AVX-512 code (its decode path streams the
 * weights once). */
#define AMX_MIN_TOK 4

/* Whether stored weights (Q5_0, Q5_1, Q4_K, Q6_K: types with no packed form
 * here) go to the tiles at all. Off: unpacking a stored panel for the tiles
 * (the AVX-512 group code per row, then a transpose) costs more than the
 * tiles save. Measured on one core, CPU time, calls interleaved, 2048-wide
 * rows: the tiles took 1.2-1.4x the AVX-512 kernels' time at 512 tokens
 * (Q4_K, Q6_K, Q5_0, Q5_1), 1.5-1.6x at 32, 2-2.4x at 4-8; the MoE bench
 * model (Q4_K) decoded a 32-sequence batch at 48 tokens per CPU-second with
 * them, 78 without. Both give the same results bit for bit (the top of this
 * file), so this choice is speed only. -DAMX_STORED=1 to measure again. */
#ifndef AMX_STORED
#define AMX_STORED 0
#endif

#define NT 16     /* tokens per tile */
#define BTILE 512 /* one B tile: 8 rows of 64 bytes (K = 32) */

#define RING 8 /* tile results in flight (matmul loop, below) */

/* Tile registers: four C (results), two A (input), two B (weights). Plain
 * numbers: the intrinsics paste them into the instruction's text. */
#define TC0 0
#define TC1 1
#define TC2 2
#define TC3 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* ---- the input -------------------------------------------------------------------- */

static size_t act_bytes(int64_t n_in) { return avx_bytes(n_in) + nat_bytes(n_in); }

static unsigned forms_of(enum ggml_type type) { return mm_kernels_avx512.forms_of(type) | FORM_NAT; }

/* One block of 32 floats -> 32 int8: the same operations as the AVX-512
 * input (matmul_avx512.c, q8_block), so the same values. */
static inline __m256i q8_block(const float *x)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m512 a0 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, vid), lo), hi);
    __m512 a1 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, vid), lo), hi);
    __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a0));
    __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a1));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
}

static void quantize(const float *x, int64_t n_in, unsigned forms, void *dst)
{
    if (forms & 3u) mm_kernels_avx512.quantize(x, n_in, forms & 3u, dst);
    if (!(forms & FORM_NAT)) return;
    uint8_t *q = (uint8_t *)dst + avx_bytes(n_in);
    for (int64_t b = 0; b < n_in / 32; b++) _mm256_store_si256((__m256i *)(q + 32 * b), q8_block(x + 32 * b));
    memset(q + n_in, 0, nat_bytes(n_in) - (size_t)n_in);
}

/* ---- units: which bytes of a row lane L of group g reads ------------------------- */

/* Byte offset of lane L's unit of group g in a natural row (nb blocks), or
 * 0 for a lane with no unit (its weights are zero, any input will do). */
static int64_t unit_offset(const struct lay *l, int64_t nb, int64_t g, int L)
{
    int sub;
    const int64_t blk = unit_block(l, nb, g, L, &sub);
    const int S = group_steps(l, g);
    return blk < 0 ? 0 : 32 * blk + (S == 4 ? 16 * sub : S == 1 ? 4 * sub : 0);
}

static inline bool unit_present(const struct lay *l, int64_t nb, int64_t g, int L)
{
    int sub;
    return unit_block(l, nb, g, L, &sub) >= 0;
}

/* ---- scratch --------------------------------------------------------------------- */

/* Tokens of input kept hot while the panels of a thread's rows are applied
 * (the weights of a panel are unpacked once per chunk). */
#define CHUNK_BYTES (1536 * 1024)

/* Per-thread scratch of the tile path, offsets in bytes (all 64-byte
 * multiples). The input of a chunk of tokens is copied into tile order:
 * per token tile, block-major int8 (A tiles load 16 rows of 32 bytes at a
 * stride of 32, wherever the unit starts) and the per-lane xs (and sxs) as
 * 16 floats over the tile's tokens. */
struct amx_scratch {
    int64_t chunk;   /* tokens per chunk, a multiple of NT */
    size_t xa_tile;  /* bytes of one token tile's int8: nb * 512 + 64 */
    size_t xs_tile;  /* bytes of one token tile's xs (then sxs): ng * 16 lanes * NT floats */
    size_t facc;     /* float [chunk / NT][NT][16 lanes][NR]: the token tiles' lane sums */
    size_t cbuf;     /* int32 [RING][NT][NR]: the ring of tile results */
    size_t xa, xs;   /* the chunk's input, [chunk / NT] tiles each */
    size_t rowt;     /* one panel's rows as the AVX-512 code unpacks them: [NR][wbytes] */
    size_t btile;    /* [ng][16 lanes] B tiles */
    size_t dwt, mwt; /* float [ng][16 lanes][NR]: dw and mw per row */
    size_t uoff;     /* struct unit [16 * ng] (the tile loop) */
    size_t total;
};

static struct amx_scratch scratch_of(const struct lay *l, int64_t n_tok, int has_min)
{
    struct amx_scratch s;
    s.xa_tile = (size_t)l->ng * 16 * 512 + 64;
    s.xs_tile = (size_t)l->ng * 16 * NT * 4 * (has_min ? 2 : 1);
    int64_t chunk = (int64_t)(CHUNK_BYTES / (s.xa_tile + s.xs_tile)) * NT;
    const int64_t need = (n_tok + NT - 1) / NT * NT;
    if (chunk < NT) chunk = NT;
    if (chunk > need) chunk = need;
    s.chunk = chunk;
    size_t o = 0;
    s.facc = o;
    o += (size_t)(chunk / NT) * NT * 16 * NR * 4;
    s.cbuf = o;
    o += (size_t)RING * NT * NR * 4;
    s.xa = o;
    o += (size_t)(chunk / NT) * s.xa_tile;
    s.xs = o;
    o += (size_t)(chunk / NT) * s.xs_tile;
    s.rowt = o;
    o += (size_t)NR * l->wbytes;
    s.btile = o;
    o += (size_t)l->ng * 16 * BTILE;
    s.dwt = o;
    o += (size_t)l->ng * 16 * NR * 4;
    s.mwt = o;
    o += (size_t)l->ng * 16 * NR * 4;
    s.uoff = o;
    o += ((size_t)l->ng * 16 * 8 + 63) & ~(size_t)63; /* sizeof (struct unit) is 8 */
    s.total = o;
    return s;
}

static bool on_tiles(const struct mm_weight *w, int64_t n_tok);

static size_t scratch_bytes(const struct mm_weight *w, int64_t n_tok)
{
    if (bf16_tiles(w->type)) return mm_amx_bf16_scratch(w, n_tok);
    size_t a = mm_kernels_avx512.scratch_bytes(w, n_tok);
    if (w->packed == PACK_TAG && decode_scratch_bytes() > a) a = decode_scratch_bytes();
    if (!on_tiles(w, n_tok)) return a;
    if (w->packed == PACK_TAG && n_tok % NT && n_tok % NT <= DECODE_T) n_tok -= n_tok % NT;
    size_t xoff;
    const struct lay l = input_form(w->type, w->n_in, &xoff);
    size_t b = scratch_of(&l, n_tok, wtype_of(w->type).has_min).total;
    return a > b ? a : b;
}

/* ---- weights: one panel of rows -> B tiles and per-row scales -------------------- */

/* One row's groups, as the AVX-512 panel path unpacks them: per group its
 * steps (S x 64 bytes), dw (64), mw (64). */
static inline __attribute__((always_inline)) void unpack_row_t(enum ggml_type type, int packed, const uint8_t *row,
                                                               const struct lay *lp, uint8_t *out)
{
    struct wtype wt = wtype_of(type);
    int k_quant = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
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
    default: break;
    }
}

struct panel {
    enum ggml_type type;
    const struct lay *l;
    int64_t nb;
    int has_min;
    uint8_t *rowt, *btile;
    float *dwt, *mwt;
};

/* Rows [p, p + rp) of w -> B tiles and per-row scales (rows past rp: zero). */
static void unpack_panel(const struct mm_weight *w, const struct panel *pn, int64_t p, int64_t rp)
{
    const struct lay *l = pn->l;
    const int bias = wtype_of(w->type).bias;
    for (int64_t i = 0; i < NR; i++) {
        uint8_t *o = pn->rowt + (size_t)i * l->wbytes;
        if (i < rp)
            unpack_row(w->type, w->packed != 0, (const uint8_t *)w->data + (size_t)(p + i) * w->row_bytes, l, o);
        else memset(o, 0, l->wbytes);
    }
    size_t wo = 0;
    for (int64_t g = 0; g < l->ng; g++) {
        const int S = group_steps(l, g);
        const unsigned x16 = x16_lanes(w->type, S);
        for (int s = 0; s < S; s++) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int n = 0; n < 16; n++) r[n] = _mm512_load_si512(pn->rowt + (size_t)n * l->wbytes + wo + 64 * s);
            transpose16(r);
            for (int L = 0; L < 16; L++) {
                __m512i v = r[L];
                uint8_t *bt = pn->btile + unit_index(l, g, L) * BTILE;
                if (!unit_present(l, pn->nb, g, L)) { /* zero weights, as the AVX-512 lane has */
                    _mm512_store_si512(bt + 64 * s, _mm512_setzero_si512());
                    continue;
                }
                /* A lane kept x 16 has nibble * 16 and bias * 16: the nibble minus the bias. */
                if (x16 >> L & 1) v = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
                v = _mm512_sub_epi8(v, _mm512_set1_epi8((char)bias));
                _mm512_store_si512(bt + 64 * s, v);
            }
        }
        for (int L = 0; L < 16; L++)
            for (int s = S; s < 8; s++)
                _mm512_store_si512(pn->btile + unit_index(l, g, L) * BTILE + 64 * s, _mm512_setzero_si512());
        for (int m = 0; m < (pn->has_min ? 2 : 1); m++) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int n = 0; n < 16; n++)
                r[n] = _mm512_load_si512(pn->rowt + (size_t)n * l->wbytes + wo + 64 * S + 64 * m);
            transpose16(r);
            for (int L = 0; L < 16; L++) _mm512_store_si512((m ? pn->mwt : pn->dwt) + unit_index(l, g, L) * NR, r[L]);
        }
        wo += (size_t)64 * S + 128;
    }
}

/* ---- packed rows: the panel form (matmul_amx_impl.h) ------------------------------ */

static int packs(enum ggml_type type) { return type_wide(type); }

static void pack_rows(const struct mm_weight *w, int64_t r0, int64_t r1, uint8_t *dst)
{
    const int bs = wide_bs(w->type), nq = bs - (w->type == GGML_TYPE_Q4_1 ? 4 : 2), qoff = bs - nq;
    const int64_t nb = w->n_in / 32;
    for (int64_t p = r0; p < r1; p += NR) { /* r0 is a multiple of NR (matmul.c splits so) */
        const int64_t rp = w->n_out - p < NR ? w->n_out - p : NR;
        uint8_t *pd = dst + (size_t)(p - r0) * w->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = pd + (size_t)(b * rp * bs);
            for (int64_t n = 0; n < rp; n++) {
                const uint8_t *blk = (const uint8_t *)w->data + (size_t)(p + n) * w->row_bytes + (size_t)(b * bs);
                for (int s = 0; s < nq / 4; s++) memcpy(o + 4 * (rp * s + n), blk + qoff + 4 * s, 4);
                memcpy(o + rp * nq + 2 * n, blk, 2);                             /* d */
                if (qoff == 4) memcpy(o + rp * nq + 2 * rp + 2 * n, blk + 2, 2); /* m */
            }
        }
    }
}

/* Rows [p, p + rp) of a packed weight -> B tiles and per-row scales, the
 * same values unpack_panel makes from stored rows. */
static void unpack_panel_packed(const struct mm_weight *w, const struct panel *pn, int64_t p, int64_t rp)
{
    const struct lay *l = pn->l;
    const int bs = wide_bs(w->type), q8 = w->type == GGML_TYPE_Q8_0, nq = bs - (w->type == GGML_TYPE_Q4_1 ? 4 : 2);
    const __m512i bias = _mm512_set1_epi8(w->type == GGML_TYPE_Q4_0 ? 8 : 0), m4 = _mm512_set1_epi8(0x0F);
    const __mmask16 mrows = (__mmask16)((1u << rp) - 1);
    const uint8_t *pd = (const uint8_t *)w->data + (size_t)p * w->row_bytes;
    /* Full S8 groups of full panels (the bulk): straight-line. */
    if (rp == NR)
        for (int64_t g = 0; g < l->n8; g++)
            for (int L = 0; L < 16; L++) {
                const uint8_t *o = pd + (size_t)((16 * g + L) * NR * bs);
                const size_t u = unit_index(l, g, L);
                uint8_t *bt = pn->btile + u * BTILE;
                float *dwt = pn->dwt + u * NR, *mwt = pn->mwt + u * NR;
                if (q8) {
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) _mm512_store_si512(bt + 64 * k, _mm512_loadu_si512(o + 64 * k));
                } else {
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        const __m512i v = _mm512_loadu_si512(o + 64 * k);
                        _mm512_store_si512(bt + 64 * k, _mm512_sub_epi8(_mm512_and_si512(v, m4), bias));
                        _mm512_store_si512(bt + 256 + 64 * k,
                                           _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), bias));
                    }
                }
                _mm512_store_ps(dwt, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + NR * nq))));
                if (pn->has_min)
                    _mm512_store_ps(mwt, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + NR * nq + 2 * NR))));
            }
    for (int64_t g = rp == NR ? l->n8 : 0; g < l->ng; g++) {
        const int S = group_steps(l, g);
        for (int L = 0; L < 16; L++) {
            int sub;
            const int64_t blk = unit_block(l, pn->nb, g, L, &sub);
            const size_t u = unit_index(l, g, L);
            uint8_t *bt = pn->btile + u * BTILE;
            float *dwt = pn->dwt + u * NR, *mwt = pn->mwt + u * NR;
            if (blk < 0) { /* no unit: zero weights and scales, as the AVX-512 lane has */
                for (int k = 0; k < 8; k++) _mm512_store_si512(bt + 64 * k, _mm512_setzero_si512());
                _mm512_store_ps(dwt, _mm512_setzero_ps());
                _mm512_store_ps(mwt, _mm512_setzero_ps());
                continue;
            }
            const uint8_t *o = pd + (size_t)(blk * rp * bs);
            __m512i row[8];
            if (q8) {
                /* S8: dwords 0..7; S4 half h: 4h..4h+3; S1: dword sub */
                const int first = S == 8 ? 0 : S == 4 ? 4 * sub : sub, n = S == 8 ? 8 : S == 4 ? 4 : 1;
                for (int k = 0; k < 8; k++)
                    row[k] = k < n ? _mm512_maskz_loadu_epi32(mrows, o + 4 * rp * (first + k)) : _mm512_setzero_si512();
            } else {
                /* nibble dword s: low nibbles are elements 4s.., high ones 16 + 4s.. */
                __m512i lo[4], hi[4];
                for (int s = 0; s < 4; s++) {
                    __m512i v = _mm512_maskz_loadu_epi32(mrows, o + 4 * rp * s);
                    lo[s] = _mm512_sub_epi8(_mm512_and_si512(v, m4), bias);
                    hi[s] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), bias);
                }
                for (int k = 0; k < 8; k++) row[k] = _mm512_setzero_si512();
                if (S == 8)
                    for (int s = 0; s < 4; s++) row[s] = lo[s], row[4 + s] = hi[s];
                else if (S == 4)
                    for (int s = 0; s < 4; s++) row[s] = sub ? hi[s] : lo[s];
                else row[0] = sub < 4 ? lo[sub] : hi[sub - 4];
            }
            /* rows past rp read as zero bytes, which the bias made -bias: clear them */
            for (int k = 0; k < 8; k++) _mm512_store_si512(bt + 64 * k, _mm512_maskz_mov_epi32(mrows, row[k]));
            __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mrows, o + rp * nq));
            /* an S4 lane of high nibbles: dw / 16 as the AVX-512 group has it (matmul_avx512_wgroup.h) */
            if (!q8 && S == 4 && sub) d = _mm512_mul_ps(d, _mm512_set1_ps(0.0625f));
            _mm512_store_ps(dwt, d);
            _mm512_store_ps(mwt, pn->has_min ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mrows, o + rp * nq + 2 * rp))
                                             : _mm512_setzero_ps());
        }
    }
}

/* ---- the input of a chunk, in tile order ---------------------------------------- */

/* Tokens [t0, t0 + mt) -> one token tile of MT rows: per unit (lane-major,
 * unit_index), the 32 input bytes from its unit's start for each token
 * (rows past mt zero; an S4 or S1 unit's bytes past its own end meet zero
 * weights), so that each A tile is 512 contiguous bytes and a lane's tiles
 * follow each other; and its xs (then sxs) over the tokens, from the type's
 * AVX-512 form. */
static void input_tile(const struct mm_input *in, const struct lay *l, size_t xoff, size_t natoff, int has_min,
                       int64_t t0, int mt, int MT, uint8_t *xa, float *xs)
{
    const int64_t nb = in->n_in / 32, ng = l->ng, nu = 16 * ng;
    for (int L = 0; L < 16; L++)
        for (int64_t g = 0; g < ng; g++) {
            const size_t u = unit_index(l, g, L);
            const int64_t off = unit_offset(l, nb, g, L);
            for (int t = 0; t < MT; t++)
                _mm256_store_si256((__m256i *)(xa + 512 * u + 32 * t),
                                   t < mt
                                       ? _mm256_loadu_si256((
                                             const __m256i *)(in->xq + (size_t)(t0 + t) * in->xq_stride + natoff + off))
                                       : _mm256_setzero_si256());
        }
    for (int t = 0; t < NT; t++) {
        const float *a = (const float *)(in->xq + (size_t)(t0 + (t < mt ? t : 0)) * in->xq_stride + xoff + l->qbytes);
        for (int L = 0; L < 16; L++)
            for (int64_t g = 0; g < ng; g++) {
                const size_t u = unit_index(l, g, L);
                xs[u * NT + t] = t < mt ? a[16 * g + L] : 0.0f;
                if (has_min) xs[(nu + u) * NT + t] = t < mt ? a[nu + 16 * g + L] : 0.0f;
            }
    }
}

/* ---- the tile loop --------------------------------------------------------------- */

struct tjob {
    const struct lay *l;
    int64_t ng;
    int has_min;
    const uint8_t *xa;        /* the token tile's block-major input */
    const float *xs;          /* its per-lane xs (then sxs) */
    int mt;                   /* tokens in the tile (<= NT) */
    const struct unit *units; /* [16 * ng], lane-major */
    const uint8_t *btile;
    const float *dwt, *mwt;
    float *facc;
    int32_t *cbuf;
    float *y; /* y[t * ldy + r], r < rp */
    int64_t ldy;
    int64_t rp;
};

/* Units are taken lane by lane (unit u = lane L of group g, u = L * ng + g),
 * so that one lane's float steps follow each other with its 16 sums in
 * registers. What unit u reads, precomputed once per call. */
struct unit {
    uint8_t L;    /* its lane */
    uint8_t x16;  /* its AVX-512 lane holds nibbles x 16 */
    uint8_t last; /* g == ng - 1: the lane's sums are complete */
    uint8_t pad;
};

/* The tile product of unit u (in C tile c, A/B tiles a, b), then, two
 * units later, its store to ring slot `slot`; the float step reads the slot
 * two units after that. Storing a C tile right after its product stalls
 * until the product is done (perf: most of the loop's time sat on the
 * instruction after the tile store); two units later it is long done, and
 * the tile unit works while the vector units run the float steps. The ring
 * stays in L1 (a tile store to memory outside L1 is four times slower). */
#define UNIT_DP(c, a, b, un)                                                                                           \
    do {                                                                                                               \
        _tile_loadd(a, j->xa + (size_t)((un)-j->units) * 512, 32);                                                     \
        _tile_loadd(b, j->btile + (size_t)((un)-j->units) * BTILE, 64);                                                \
        _tile_zero(c);                                                                                                 \
        _tile_dpbssd(c, a, b);                                                                                         \
    } while (0)
#define UNIT_STORE(c, slot) _tile_stored(c, ring + 256 * ((slot)&7), 64)

/* The float step of one unit for the tile's 16 tokens from its tile result
 * c: acc[t] is a vector over the panel's rows. */
static inline __attribute__((always_inline)) void unit_float(const struct tjob *j, size_t k, const int32_t *c,
                                                             const int has_min, const int x16, const int MT,
                                                             __m512 acc[NT])
{
    const __m512 dw = _mm512_load_ps(j->dwt + 16 * k);
    const __m512 mw = has_min ? _mm512_load_ps(j->mwt + 16 * k) : _mm512_setzero_ps();
    const float *xs = j->xs + (size_t)k * NT;
    const float *sxs = xs + (size_t)j->ng * 16 * NT;
#pragma GCC unroll 16
    for (int t = 0; t < MT; t++) {
        __m512i is = _mm512_load_si512(c + 16 * t);
        if (x16) is = _mm512_slli_epi32(is, 4);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(xs[t])), acc[t]);
        if (has_min) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sxs[t]), acc[t]);
    }
}

/* A unit's float step; after a lane's last group its sums go to facc. */
static inline __attribute__((always_inline)) void unit_step(const struct tjob *j, const struct unit *un,
                                                            const int32_t *c, const int has_min, const int MT,
                                                            __m512 acc[NT])
{
    const size_t u = (size_t)(un - j->units);
    if (un->x16) unit_float(j, u, c, has_min, 1, MT, acc);
    else unit_float(j, u, c, has_min, 0, MT, acc);
    if (un->last) {
        const int L = un->L;
#pragma GCC unroll 16
        for (int t = 0; t < MT; t++) {
            _mm512_store_ps(j->facc + 256 * t + 16 * L, acc[t]);
            acc[t] = _mm512_setzero_ps();
        }
    }
}

/* The lanes of acc[t] added by reduce16's tree (matmul_avx512_impl.h),
 * vectorised over the rows. */
static inline void tile_store(const struct tjob *j)
{
    const __mmask16 m = j->rp >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << j->rp) - 1);
    for (int t = 0; t < j->mt; t++) {
        const float *f = j->facc + 256 * t;
        __m512 a[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[i] = _mm512_add_ps(_mm512_load_ps(f + 16 * i), _mm512_load_ps(f + 16 * (i + 8)));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[i] = _mm512_add_ps(a[i], a[i + 4]);
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) a[i] = _mm512_add_ps(a[i], a[i + 2]);
        _mm512_mask_storeu_ps(j->y + t * j->ldy, m, _mm512_add_ps(a[0], a[1]));
    }
}

/* The units of lanes [L0, L0 + nl) of one token tile of MT rows (1, 2, 4,
 * 8 or 16; rows past mt are zero), nl * ng a multiple of 4. Unit k runs in
 * C tile k % 4 at step k, is stored to ring slot k % 8 at step k + 2 and
 * has its float step at step k + 4 (so the float steps keep unit order). */
static inline __attribute__((always_inline)) void tile_lanes_t(const struct tjob *j, int L0, int nl, const int has_min,
                                                               const int MT)
{
    const int64_t nu = (int64_t)nl * j->ng;
    const struct unit *un = j->units + (size_t)L0 * (size_t)j->ng;
    int32_t *ring = j->cbuf;
    __m512 acc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < MT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t k = 0; k <= nu; k += 4) {
        const int cur = k < nu, prev = k >= 4;
        if (cur) UNIT_DP(TC0, TA0, TB0, un + k);
        if (prev) UNIT_STORE(TC2, k - 2);
        if (prev) unit_step(j, un + k - 4, ring + 256 * ((k - 4) & 7), has_min, MT, acc);
        if (cur) UNIT_DP(TC1, TA1, TB1, un + k + 1);
        if (prev) UNIT_STORE(TC3, k - 1);
        if (prev) unit_step(j, un + k - 3, ring + 256 * ((k - 3) & 7), has_min, MT, acc);
        if (cur) UNIT_DP(TC2, TA0, TB0, un + k + 2);
        if (cur) UNIT_STORE(TC0, k);
        if (prev) unit_step(j, un + k - 2, ring + 256 * ((k - 2) & 7), has_min, MT, acc);
        if (cur) UNIT_DP(TC3, TA1, TB1, un + k + 3);
        if (cur) UNIT_STORE(TC1, k + 1);
        if (prev) unit_step(j, un + k - 1, ring + 256 * ((k - 1) & 7), has_min, MT, acc);
    }
}

#define TILE_LANES(MT_)                                                                                                \
    do {                                                                                                               \
        if (j->has_min) tile_lanes_t(j, L0, nl, 1, MT_);                                                               \
        else tile_lanes_t(j, L0, nl, 0, MT_);                                                                          \
    } while (0)

static void tile_lanes(const struct tjob *j, int L0, int nl, int MT)
{
    switch (MT) {
    case 1: TILE_LANES(1); break;
    case 2: TILE_LANES(2); break;
    case 4: TILE_LANES(4); break;
    case 8: TILE_LANES(8); break;
    default: TILE_LANES(16); break;
    }
}

static void rows_amx(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1,
                     uint8_t *scratch)
{
    size_t xoff;
    const struct lay l = input_form(w->type, in->n_in, &xoff);
    const int64_t nb = in->n_in / 32;
    const struct wtype wt = wtype_of(w->type);
    const struct amx_scratch sc = scratch_of(&l, in->n_tok, wt.has_min);
    struct unit *units = (struct unit *)(scratch + sc.uoff);
    for (int L = 0; L < 16; L++)
        for (int64_t g = 0; g < l.ng; g++)
            units[unit_index(&l, g, L)] = (struct unit){
                (uint8_t)L, (uint8_t)(x16_lanes(w->type, group_steps(&l, g)) >> L & 1), (uint8_t)(g == l.ng - 1), 0};
    /* Lanes are taken nl at a time over every token tile of a chunk, so
     * that their B tiles (nl * ng of them, at most 32 where it can) stay in
     * L1 while the token tiles' A tiles stream past; nl * ng is kept a
     * multiple of 4 (the tile loop's step). */
    int nl = 16;
    while (nl > 1 && nl * l.ng > 32 && (nl / 2 * l.ng) % 4 == 0) nl /= 2;
    const struct panel pn = {w->type,
                             &l,
                             nb,
                             wt.has_min,
                             scratch + sc.rowt,
                             scratch + sc.btile,
                             (float *)(scratch + sc.dwt),
                             (float *)(scratch + sc.mwt)};
    const size_t natoff = avx_bytes(in->n_in);

    /* Fewer than 16 tokens: tiles of MT rows, a power of two (the float
     * steps are compiled per MT). */
    int MT = NT;
    while (MT / 2 >= in->n_tok) MT /= 2;
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = TC0; i <= TC3; i++) cfg.colsb[i] = 64, cfg.rows[i] = (uint8_t)MT;
    for (int i = TA0; i <= TA1; i++) cfg.colsb[i] = 32, cfg.rows[i] = (uint8_t)MT;
    for (int i = TB0; i <= TB1; i++) cfg.colsb[i] = 64, cfg.rows[i] = 8;
    _tile_loadconfig(&cfg);

    for (int64_t c0 = 0; c0 < in->n_tok; c0 += sc.chunk) {
        const int64_t c1 = c0 + sc.chunk < in->n_tok ? c0 + sc.chunk : in->n_tok;
        for (int64_t t0 = c0; t0 < c1; t0 += NT) {
            const int64_t i = (t0 - c0) / NT;
            input_tile(in, &l, xoff, natoff, wt.has_min, t0, (int)(c1 - t0 < NT ? c1 - t0 : NT), MT,
                       scratch + sc.xa + (size_t)i * sc.xa_tile, (float *)(scratch + sc.xs + (size_t)i * sc.xs_tile));
        }
        for (int64_t p = r0; p < r1; p += NR) {
            const int64_t rp = r1 - p < NR ? r1 - p : NR;
            if (w->packed) unpack_panel_packed(w, &pn, p, rp);
            else unpack_panel(w, &pn, p, rp);
            for (int L0 = 0; L0 < 16 + nl; L0 += nl) /* a last pass adds the lanes of each token tile */
                for (int64_t t0 = c0; t0 < c1; t0 += NT) {
                    const int64_t i = (t0 - c0) / NT;
                    struct tjob j = {&l,
                                     l.ng,
                                     wt.has_min,
                                     scratch + sc.xa + (size_t)i * sc.xa_tile,
                                     (const float *)(scratch + sc.xs + (size_t)i * sc.xs_tile),
                                     (int)(c1 - t0 < NT ? c1 - t0 : NT),
                                     units,
                                     pn.btile,
                                     pn.dwt,
                                     pn.mwt,
                                     (float *)(scratch + sc.facc) + (size_t)i * NT * 16 * NR,
                                     (int32_t *)(scratch + sc.cbuf),
                                     y + t0 * w->n_out + p,
                                     w->n_out,
                                     rp};
                    if (L0 < 16) tile_lanes(&j, L0, nl, MT);
                    else tile_store(&j);
                }
        }
    }
    _tile_release();
}

/* Which code computes w for n_tok tokens: packed weights (whose form only
 * this file knows) go to the decode kernel for a few tokens and to the tiles
 * from there on; stored ones to the AVX-512 code (as float weights always
 * do), or with AMX_STORED to the tiles from AMX_MIN_TOK tokens. */
/* The types the tile path was written and tested for; the others (Q2_K,
 * Q3_K, Q5_K, IQ4_NL, IQ4_XS: super-blocks whose scales it does not unpack)
 * run the AVX-512 kernels, which give the same results. */
static bool tile_type(enum ggml_type t)
{
    switch (t) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q6_K: return true;
    default: return false;
    }
}

static bool on_tiles(const struct mm_weight *w, int64_t n_tok)
{
    if (!tile_type(w->type)) return false;
    return w->packed == PACK_TAG ? n_tok > DECODE_MAX_TOK : AMX_STORED && n_tok >= AMX_MIN_TOK;
}

static void rows(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1, void *scratch)
{
    if (bf16_tiles(w->type)) {
        mm_amx_rows_bf16(w, in, y, r0, r1, scratch);
        return;
    }
    if (!on_tiles(w, in->n_tok)) {
        if (w->packed == PACK_TAG) mm_amx_rows_decode(w, in, 0, y, r0, r1, scratch);
        else mm_kernels_avx512.rows(w, in, y, r0, r1, scratch);
        return;
    }
    /* Packed weights: whole tiles of 16 tokens on the tiles, a remainder of
     * up to DECODE_T tokens in one pass of the VNNI kernel (a tile of a few
     * tokens costs as much as a full one). */
    const int64_t rem = w->packed == PACK_TAG ? in->n_tok % NT : 0;
    if (rem == 0 || rem > DECODE_T) {
        rows_amx(w, in, y, r0, r1, scratch);
        return;
    }
    struct mm_input full = *in;
    full.n_tok -= rem;
    rows_amx(w, &full, y, r0, r1, scratch);
    mm_amx_rows_decode(w, in, full.n_tok, y, r0, r1, scratch);
}

const struct mm_kernels mm_kernels_amx = {"amx", act_bytes, forms_of, quantize, scratch_bytes,
                                          rows,  PACK_TAG,  packs,    pack_rows};

#else /* a compiler without AMX: the table exists, matmul.c never uses it */

const bool mm_amx_built = false;
const struct mm_kernels mm_kernels_amx = {"amx", NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};

#endif
