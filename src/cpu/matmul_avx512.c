/* matmul_avx512.c — matrix products with AVX-512 and VNNI (vpdpbusd).
 *
 * Entered only after matmul.c checked the CPU (avx512f/bw/vl/vnni).
 *
 * Layout idea. A row is cut into "groups" of 16 int32 lanes. The quantized
 * input and the weights of a group are rearranged into S "steps" of 64 bytes
 * in which every lane carries 4 bytes of one scale unit (a block of 32, or
 * half of one), the same unit in every step, so S vpdpbusd accumulate each
 * unit's integer dot product in its own lane with no horizontal work, and one
 * float step per group applies the 16 per-lane scales:
 *
 *   facc += float(isum) * (dw * dx)      [+ mw * dx*sum(qx) for types with a min]
 *
 * The float step costs as much as the integer steps of a short group, so the
 * wider the group the better. Three kinds:
 *  - S8, 16 blocks: lane L is block L, step s its dword s (Q4_0, Q4_1, Q8_0);
 *  - S4, 8 blocks: lane L is half (L>>2)&1 of block 2*(L&3) + (L>>3), step s
 *    dword s of that half. The half-block lanes are what the 16-element
 *    scales (and Q2_K's mins) of Q2_K, Q3_K and Q6_K need; every other type
 *    (Q5_x, IQ4_NL, the other K-quants, IQ4_XS: one 256-element super-block
 *    per group) keeps it too, and the "wide" types use it for a remainder of
 *    3 to 8 blocks;
 *  - S1, 1 or 2 blocks in natural order: lane L is dword L&7 of block L>>3.
 * A "wide" row (Q4_0, Q4_1, Q8_0) is S8 groups, then at most two S4 groups,
 * then at most one S1 group: n_embd 576 = 18 blocks is one S8 and one S1,
 * where 8-block groups only would have padded it to 24 blocks. A "narrow"
 * row is S4 groups only. The quantized input holds both forms, one after
 * the other.
 *
 * vpdpbusd wants unsigned weights, so signed types are read with their
 * stored offset (nibble = q + 8, q + 16, q + 32; Q3_K as q + 4; Q8_0 as
 * q ^ 0x80 = q + 128; the IQ4 grid looked up as value + 128) and offset *
 * (the input's lane sums) is removed exactly in the integer start value.
 *
 * Two paths, one arithmetic:
 *  - few tokens (decode, n_tok <= FUSED_T): each weight group is unpacked in
 *    registers and used at once; the kernel streams the weights once, with
 *    software prefetch, and is bound by memory bandwidth;
 *  - many tokens (prefill): a panel of rows is unpacked into scratch once and
 *    R x T tiles reuse it from L1 for every token (compute-bound).
 * Determinism: every output element runs the same float operations in the
 * same order (its groups in row order, then one fixed 16-lane reduction tree)
 * in both paths and every tile shape, for any batch and any thread split; the
 * tests check this bit for bit.
 *
 * This file: the quantized input, packed rows and the kernel table;
 * matmul_avx512_impl.h lists the other pieces. */
#include <string.h>

#include "cpu/matmul_avx512_wgroup.h"

/* ---- the input: per token, the wide form then the narrow one (struct lay) ---- */

static size_t act_bytes(int64_t n_in) { return lay_of(n_in / 32, 1).tbytes + lay_of(n_in / 32, 0).tbytes; }

/* One block of 32 floats -> 32 int8 and its scale. Same formula and
 * rounding as the scalar path (matmul_scalar.c). */
static inline __m256i q8_block(const float *x, float *d_out)
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
    *d_out = d;
    return _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
}

/* Where the next group of one form of a token goes. */
struct qcur {
    uint8_t *q;      /* next step */
    float *xs, *sxs; /* next group's lanes */
    int32_t *sx;
};

static struct qcur qcur_at(uint8_t *form, const struct lay *l)
{
    struct qcur c;
    c.q = form;
    c.xs = (float *)(form + l->qbytes);
    c.sxs = c.xs + l->ng * 16;
    c.sx = (int32_t *)(c.sxs + l->ng * 16);
    return c;
}

/* Stores S steps of one group and its per-lane xs, sxs, sx; advances c. */
static inline void put_group(struct qcur *c, const __m512i *st, int S, __m512 xsv)
{
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < S; k++) {
        _mm512_storeu_si512(c->q + 64 * k, st[k]);
        s = _mm512_dpbusd_epi32(s, ones, st[k]);
    }
    _mm512_storeu_ps(c->xs, xsv);
    _mm512_storeu_ps(c->sxs, _mm512_mul_ps(xsv, _mm512_cvtepi32_ps(s)));
    _mm512_storeu_si512(c->sx, s);
    c->q += 64 * S;
    c->xs += 16;
    c->sxs += 16;
    c->sx += 16;
}

/* An S4 group of the n <= 8 quantized blocks at nat/d. */
static void put_s4(struct qcur *c, const __m256i *nat, const float *d, int n)
{
    __m256i b8[GROUP_BLOCKS];
    float d8[GROUP_BLOCKS];
    for (int b = 0; b < GROUP_BLOCKS; b++) {
        b8[b] = b < n ? nat[b] : _mm256_setzero_si256();
        d8[b] = b < n ? d[b] : 0.0f;
    }
    __m512i z[4], st[4];
    for (int m = 0; m < 4; m++) z[m] = pair512(b8[2 * m], b8[2 * m + 1]);
    to_steps(z, st);
    put_group(c, st, 4, per_lane(_mm256_loadu_ps(d8)));
}

/* Input forms: bit 1 the wide one, bit 2 the narrow one. */
#define FORM_WIDE 1u
#define FORM_NARROW 2u

static unsigned forms_of(enum ggml_type type) { return type_wide(type) ? FORM_WIDE : FORM_NARROW; }

/* Both forms can be written in one pass over the row: the wide form's S8
 * groups and the narrow form's S4 groups both start at multiples of 8
 * blocks, so each run of 16 blocks is quantized once and stored in each
 * form asked for. */
static void quantize(const float *x, int64_t n_in, unsigned forms, void *dst)
{
    int64_t nb = n_in / 32;
    const int w = (forms & FORM_WIDE) != 0, n = (forms & FORM_NARROW) != 0;
    struct lay wide = lay_of(nb, 1), narrow = lay_of(nb, 0);
    struct qcur cw = qcur_at(dst, &wide), cn = qcur_at((uint8_t *)dst + wide.tbytes, &narrow);
    __m256i nat[16];
    float d[16];
    int64_t blk = 0;
    for (int64_t i = 0; i < wide.n8; i++, blk += 16) {
        for (int b = 0; b < 16; b++) nat[b] = q8_block(x + 32 * (blk + b), &d[b]);
        if (w) {
            __m512i st[8];
            blocks16_to_steps(nat, st);
            put_group(&cw, st, 8, _mm512_loadu_ps(d));
        }
        if (n) {
            put_s4(&cn, nat, d, GROUP_BLOCKS);
            put_s4(&cn, nat + GROUP_BLOCKS, d + GROUP_BLOCKS, GROUP_BLOCKS);
        }
    }
    int r = (int)(nb - blk); /* < 16 */
    for (int b = 0; b < r; b++) nat[b] = q8_block(x + 32 * (blk + b), &d[b]);
    if (n)
        for (int b = 0; b < r; b += GROUP_BLOCKS) put_s4(&cn, nat + b, d + b, r - b < 8 ? r - b : 8);
    if (!w) return;
    int b = 0;
    for (int64_t i = 0; i < wide.n4; i++, b += GROUP_BLOCKS)
        put_s4(&cw, nat + b, d + b, i == wide.n4 - 1 ? wide.last4 : GROUP_BLOCKS);
    if (wide.n1) {
        int two = wide.last1 == 2;
        __m512i st = pair512(nat[b], two ? nat[b + 1] : _mm256_setzero_si256());
        __m512 xsv = _mm512_mask_mov_ps(_mm512_set1_ps(d[b]), 0xFF00, _mm512_set1_ps(two ? d[b + 1] : 0.0f));
        put_group(&cw, &st, 1, xsv);
    }
}

/* ---- packed rows (the form: matmul_avx512_wgroup.h, at wgroup8_packed) ----- */

#define PACK_TAG 0x512u

static int packs(enum ggml_type type) { return type_wide(type); }

static void pack_rows(const struct mm_weight *w, int64_t r0, int64_t r1, uint8_t *dst)
{
    const int bs = wide_bs(w->type);
    const int64_t n8 = lay_of(w->n_in / 32, 1).n8;
    for (int64_t r = r0; r < r1; r++, dst += w->row_bytes) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        memcpy(dst, row, w->row_bytes); /* S4 and S1 groups stay as stored */
        for (int64_t g = 0; g < n8; g++) {
            const uint8_t *src = row + (size_t)(16 * bs) * (size_t)g;
            uint8_t *o = dst + (size_t)(16 * bs) * (size_t)g;
            size_t scale_off;
            if (w->type == GGML_TYPE_Q8_0) {
                __m512i st[8];
                q8_steps(src, st);
                for (int k = 0; k < 8; k++) _mm512_storeu_si512(o + 64 * k, st[k]);
                scale_off = 512;
            } else {
                __m512i t[4];
                q4_transposed(src, bs, t);
                for (int k = 0; k < 4; k++) _mm512_storeu_si512(o + 64 * k, t[k]);
                scale_off = 256;
            }
            for (int b = 0; b < 16; b++) {
                memcpy(o + scale_off + 2 * b, src + bs * b, 2);                                         /* d */
                if (w->type == GGML_TYPE_Q4_1) memcpy(o + scale_off + 32 + 2 * b, src + bs * b + 2, 2); /* m */
            }
        }
    }
}

/* ---- table ----------------------------------------------------------------------------- */

static size_t scratch_bytes(const struct mm_weight *w, int64_t n_tok)
{
    if (!mm_type_is_quantized(w->type)) return 0;
    size_t xoff;
    const struct lay l = input_form(w->type, w->n_in, &xoff);
    if (n_tok <= FUSED_T) return (size_t)FUSED_T * (size_t)l.ng * sizeof(__m512i);
    return (size_t)PANEL_ROWS * l.wbytes;
}

static void rows(const struct mm_weight *w, const struct mm_input *in, float *y, int64_t r0, int64_t r1, void *scratch)
{
    if (!mm_type_is_quantized(w->type)) mm_avx512_rows_float(w, in, y, r0, r1);
    else if (in->n_tok <= FUSED_T) mm_avx512_rows_fused(w, in, y, r0, r1, scratch);
    else mm_avx512_rows_panel(w, in, y, r0, r1, scratch);
}

const struct mm_kernels mm_kernels_avx512 = {"avx512", act_bytes, forms_of, quantize, scratch_bytes,
                                             rows,     PACK_TAG,  packs,    pack_rows};
