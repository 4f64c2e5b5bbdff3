/* test_attn.c — the tiled attention kernel against the scalar reference,
 * bit for bit, over tile shapes the engine produces: sequences sharing a
 * prompt prefix, the tokens of one prefill chunk, unrelated sequences, a
 * token alone, odd head sizes and block sizes, for every KV type (f16, q8,
 * q4), with and without a sliding window and score soft-capping (Gemma).
 * Blocks before a window are a poisoned block (NaN rows), which a kernel
 * that read them would carry into its output. Bitwise equality here is what makes a request's output independent
 * of the batch it ran in. The reference itself is checked, for the
 * quantized types, against attention written from its documented formula
 * over kv_dequantize_row's values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "cpu/attn.h"
#include "support/testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int use_avx512;
static float frand(void) /* [-1, 1) */
{
    kvb_xorshift64(&rng);
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

struct pool {
    uint16_t *kv; /* (n_blocks, [K rows][V rows]), bs rows each */
    int32_t n_blocks, bs, kv_dim;
    int64_t k_row_words, v_row_words;   /* 2-byte words of a K row, a V row */
    int64_t k_head_words, v_head_words; /* of one head's part of them */
    int64_t block_words;
    enum kv_type type; /* the pool type (a q4 pool's K rows are q8) */
};

/* Random rows, stored as t by the reference quantizer. Every 7th row is
 * constant, some of them zero (a q4 group of equal values, a q8 group of
 * zeros: scale 0); every 5th has an outlier (a wide group). */
static void pool_init(struct pool *p, int32_t n_blocks, int32_t bs, int32_t kv_dim, int32_t hd, enum kv_type t)
{
    p->n_blocks = n_blocks;
    p->bs = bs;
    p->kv_dim = kv_dim;
    p->type = t;
    p->k_row_words = kv_row_bytes(kv_k_rows(t), kv_dim) / 2;
    p->v_row_words = kv_row_bytes(kv_v_rows(t), kv_dim) / 2;
    p->k_head_words = kv_row_bytes(kv_k_rows(t), hd) / 2;
    p->v_head_words = kv_row_bytes(kv_v_rows(t), hd) / 2;
    p->block_words = (int64_t)bs * (p->k_row_words + p->v_row_words);
    const int64_t n_rows = (int64_t)n_blocks * 2 * bs;
    p->kv = malloc((size_t)(n_blocks * p->block_words) * sizeof(uint16_t));
    float *row = malloc(sizeof(float) * (size_t)kv_dim);
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t b = r / (2 * bs), ri = r % (2 * bs); /* row ri of block b: K rows, then V rows */
        const bool is_v = ri >= bs;
        for (int32_t i = 0; i < kv_dim; i++) row[i] = 2.0f * frand();
        if (t != KV_F16 && r % 7 == 3)
            for (int32_t i = 0; i < kv_dim; i++) row[i] = r % 14 == 3 ? 0.0f : 0.75f;
        if (t != KV_F16 && r % 5 == 1) row[r % kv_dim] = 40.0f;
        uint16_t *dst = p->kv + b * p->block_words +
                        (is_v ? bs * p->k_row_words + (ri - bs) * p->v_row_words : ri * p->k_row_words);
        kv_quantize_row(is_v ? kv_v_rows(t) : kv_k_rows(t), dst, row, kv_dim);
    }
    free(row);
}

/* attn.h's formula, written out over whole dequantized rows: what
 * attn_head must equal for every type. */
static void naive_head(float *out, const float *q, int32_t hd, const struct attn_kv_view *kv, int32_t p_lo,
                       int32_t n_pos, float scale)
{
    float *s = malloc(sizeof(float) * (size_t)n_pos), *row = malloc(sizeof(float) * (size_t)hd);
    float *qs = malloc(sizeof(float) * (size_t)hd);
    for (int32_t i = 0; i < hd; i++) qs[i] = q[i] * scale;
    float m = -INFINITY, part[8] = {0};
    for (int32_t p = p_lo; p < n_pos; p++) {
        const int64_t off =
            (int64_t)kv->table[p / kv->block_size] * kv->block_stride + (p % kv->block_size) * kv->row_stride;
        kv_dequantize_row(kv_k_rows(kv->type), row, kv->k_base + off, hd);
        s[p] = 0.0f;
        for (int32_t i = 0; i < hd; i++) s[p] = fmaf(row[i], qs[i], s[p]);
        if (kv->softcap > 0) s[p] = kv->softcap * attn_tanh(s[p] / kv->softcap);
        m = fmaxf(m, s[p]);
    }
    for (int32_t p = 0; p < n_pos; p++) {
        s[p] = p < p_lo ? 0.0f : attn_exp(s[p] - m);
        part[p % 8] += s[p];
    }
    const float inv =
        1.0f / (((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7])));
    for (int32_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int32_t p = p_lo; p < n_pos; p++) {
        const int64_t off =
            (int64_t)kv->table[p / kv->block_size] * kv->block_stride + (p % kv->block_size) * kv->v_row_stride;
        kv_dequantize_row(kv_v_rows(kv->type), row, kv->v_base + off, hd);
        for (int32_t i = 0; i < hd; i++) out[i] = fmaf(s[p], row[i], out[i]);
    }
    for (int32_t i = 0; i < hd; i++) out[i] *= inv;
    free(s);
    free(row);
    free(qs);
}

/* Window and soft-cap of the cases run_case runs (shapes() sets them). */
static int32_t g_window;
static float g_cap;

/* One tile: n_tok tokens with given tables and lengths, every KV head;
 * under a window (g_window), each token's blocks wholly before it are
 * pointed at the pool's last block, which is NaN. */
static int run_case(const char *name, const struct pool *pl, int32_t G, int32_t hd, int32_t n_kv, int32_t n_tok,
                    int32_t *const *tables_in, const int32_t *n_pos)
{
    int32_t p_lo[64] = {0}, tab[64][24], *tables[64];
    for (int32_t t = 0; t < n_tok; t++) {
        tables[t] = tab[t];
        memcpy(tab[t], tables_in[t], sizeof tab[t]);
        p_lo[t] = g_window > 0 && n_pos[t] > g_window ? n_pos[t] - g_window : 0;
        for (int32_t b = 0; (b + 1) * pl->bs <= p_lo[t]; b++) tables[t][b] = pl->n_blocks - 1;
    }
    const int32_t qd = G * n_kv * hd;
    int32_t max_pos = 0;
    for (int32_t t = 0; t < n_tok; t++)
        if (n_pos[t] > max_pos) max_pos = n_pos[t];
    float *q = malloc(sizeof(float) * (size_t)(n_tok * qd));
    float *ref = malloc(sizeof(float) * (size_t)(n_tok * qd));
    float *got = malloc(sizeof(float) * (size_t)(n_tok * qd));
    float *got512 = malloc(sizeof(float) * (size_t)(n_tok * qd));
    float *naive = malloc(sizeof(float) * (size_t)(n_tok * qd));
    float *scores = malloc(sizeof(float) * (size_t)max_pos);
    float *scratch = kvb_malloc(sizeof(float) * (size_t)attn_tile_scratch_floats(n_tok, G, hd, max_pos, pl->bs) + 3);
    for (int32_t i = 0; i < n_tok * qd; i++) q[i] = 3.0f * frand();
    memset(got, 0xff, sizeof(float) * (size_t)(n_tok * qd));
    const float scale = 1.0f / sqrtf((float)hd);
    int bad = 0;
    for (int32_t g = 0; g < n_kv; g++) {
        struct attn_kv_view kv = {
            .k_base = pl->kv + (int64_t)g * pl->k_head_words,
            .v_base = pl->kv + (int64_t)pl->bs * pl->k_row_words + (int64_t)g * pl->v_head_words,
            .block_stride = pl->block_words,
            .row_stride = pl->k_row_words,
            .block_size = pl->bs,
            .type = pl->type,
            .v_row_stride = pl->v_row_words,
            .softcap = g_cap,
        };
        struct attn_tile_tok toks[64];
        for (int32_t t = 0; t < n_tok; t++) {
            const int64_t off = (int64_t)t * qd + (int64_t)g * G * hd;
            toks[t] = (struct attn_tile_tok){q + off, got + off, tables[t], n_pos[t], p_lo[t]};
            kv.table = tables[t];
            for (int32_t h = 0; h < G; h++) {
                attn_head(ref + off + h * hd, q + off + h * hd, hd, &kv, p_lo[t], n_pos[t], scale, scores);
                naive_head(naive + off + h * hd, q + off + h * hd, hd, &kv, p_lo[t], n_pos[t], scale);
            }
        }
        /* an odd scratch address: the kernel aligns for itself */
        attn_tile_avx2(toks, n_tok, G, hd, &kv, scale, (float *)((char *)scratch + 4));
        if (use_avx512) {
            for (int32_t t = 0; t < n_tok; t++) toks[t].out = got512 + (int64_t)t * qd + (int64_t)g * G * hd;
            attn_tile_avx512(toks, n_tok, G, hd, &kv, scale, (float *)((char *)scratch + 4));
        }
    }
    for (int32_t i = 0; i < n_tok * qd && !bad; i++)
        if (memcmp(&ref[i], &naive[i], sizeof(float)) != 0 || !isfinite(ref[i])) {
            CHECK_MSG(0, "%s %s (G=%d hd=%d bs=%d tokens=%d): element %d: reference %.9g, formula %.9g", name,
                      kv_type_name(pl->type), G, hd, pl->bs, n_tok, i, (double)ref[i], (double)naive[i]);
            bad = 1;
        }
    for (int32_t i = 0; i < n_tok * qd && use_avx512 && !bad; i++)
        if (memcmp(&ref[i], &got512[i], sizeof(float)) != 0) {
            CHECK_MSG(0, "%s %s (G=%d hd=%d bs=%d tokens=%d): element %d: AVX-512 tile %.9g, reference %.9g", name,
                      kv_type_name(pl->type), G, hd, pl->bs, n_tok, i, (double)got512[i], (double)ref[i]);
            bad = 1;
        }
    for (int32_t i = 0; i < n_tok * qd && !bad; i++)
        if (memcmp(&ref[i], &got[i], sizeof(float)) != 0) {
            CHECK_MSG(0, "%s %s (G=%d hd=%d bs=%d tokens=%d): element %d: tile %.9g, reference %.9g", name,
                      kv_type_name(pl->type), G, hd, pl->bs, n_tok, i, (double)got[i], (double)ref[i]);
            bad = 1;
        }
    free(q);
    free(ref);
    free(got);
    free(got512);
    free(naive);
    free(scores);
    kvb_free(scratch);
    return bad;
}

static void shapes(int32_t G, int32_t hd, int32_t bs, enum kv_type type)
{
    const int32_t n_kv = 2, max_blocks = 24;
    struct pool pl;
    pool_init(&pl, 97, bs, n_kv * hd, hd, type);
    /* Block 96: NaN in every row (f16 0x7e00; a quantized row's scale). */
    for (int64_t w = 0; w < pl.block_words; w++) pl.kv[96 * pl.block_words + w] = 0x7e00;
    int32_t tab[32][24];
    int32_t *tables[32];
    int32_t n_pos[32];
    for (int32_t t = 0; t < 32; t++) tables[t] = tab[t];

    /* 1. Requests over one shared prefix (blocks 0..6), each with its own
     *    tail blocks, decoding one token each at different lengths. */
    for (int32_t t = 0; t < 20; t++) {
        for (int32_t b = 0; b < max_blocks; b++) tab[t][b] = b < 7 ? b : 7 + (t * 3 + b) % 89;
        n_pos[t] = 7 * bs + 1 + (t * 5) % (3 * bs);
    }
    run_case("shared prefix", &pl, G, hd, n_kv, 20, tables, n_pos);

    /* 2. A prefill chunk: consecutive positions of one sequence. */
    for (int32_t t = 0; t < 16; t++) {
        for (int32_t b = 0; b < max_blocks; b++) tab[t][b] = (b * 7 + 3) % 96;
        n_pos[t] = 2 * bs - 5 + t > 0 ? 2 * bs - 5 + t : 1 + t; /* a token attends at least itself */
    }
    run_case("prefill chunk", &pl, G, hd, n_kv, 16, tables, n_pos);

    /* 3. Unrelated sequences (no block in common), one with a single position. */
    for (int32_t t = 0; t < 5; t++) {
        for (int32_t b = 0; b < max_blocks; b++) tab[t][b] = (t * 19 + b * 5) % 96;
        n_pos[t] = t == 2 ? 1 : 3 * bs + t * 7;
    }
    run_case("unrelated", &pl, G, hd, n_kv, 5, tables, n_pos);

    /* 4. A token alone (batch-1 decode), long and short. */
    n_pos[0] = 11 * bs + 3;
    run_case("alone", &pl, G, hd, n_kv, 1, tables, n_pos);
    n_pos[0] = 1;
    run_case("alone, first position", &pl, G, hd, n_kv, 1, tables, n_pos);

    /* 5. Mixed: a shared prefix split between runs, a prefill chunk and a
     *    decode of another sequence in one tile. */
    for (int32_t t = 0; t < 12; t++) {
        for (int32_t b = 0; b < max_blocks; b++) tab[t][b] = b < 3 ? b : t < 6 ? 40 + b : 60 + (t + b) % 30;
        n_pos[t] = t < 6 ? 3 * bs + 2 + t : 5 * bs + (t % 3);
    }
    run_case("mixed", &pl, G, hd, n_kv, 12, tables, n_pos);
    free(pl.kv);
}

/* Every shape, plain, under a sliding window (windows that cut a block,
 * that match a block, of one position) and soft-capped (Gemma 2's 50 on
 * scores made larger, and a cap small enough to bite everywhere). */
static void shapes_all(int32_t G, int32_t hd, int32_t bs, enum kv_type type)
{
    static const struct {
        int32_t window;
        float cap;
    } v[] = {{0, 0.0f}, {37, 0.0f}, {0, 2.0f}, {0, 50.0f}, {0, 0.25f}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        g_window = v[i].window;
        g_cap = v[i].cap;
        shapes(G, hd, bs, type);
    }
    g_window = 2 * bs;
    g_cap = 2.0f;
    shapes(G, hd, bs, type);
    g_window = 1;
    g_cap = 0.0f;
    shapes(G, hd, bs, type);
    g_window = 0;
}

int main(void)
{
    if (!attn_have_avx2()) tu_skip("no AVX2 on this CPU");
    use_avx512 = attn_have_avx512();
    printf("checking the AVX2%s kernel against the reference\n", use_avx512 ? " and AVX-512" : "");
    /* SmolLM2 (G 3, hd 64), Llama-style (G 4 or 8, hd 128), multi-head
     * (G 1), groups past one register chunk (G 9), head sizes that are not a
     * multiple of 8, block sizes that are not a multiple of 8. */
    const int32_t cfg[][3] = {{3, 64, 16}, {1, 64, 16}, {4, 128, 16}, {8, 64, 32}, {9, 16, 16}, {2, 12, 16},
                              {3, 64, 5},  {5, 24, 12}, {3, 64, 1},   {7, 40, 8},  {6, 32, 16}, {16, 64, 16}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) shapes_all(cfg[i][0], cfg[i][1], cfg[i][2], KV_F16);
    /* The quantized types: heads of whole 32-element groups only
     * (kv_type_check refuses the rest). */
    for (int t = KV_Q8; t <= KV_Q4; t++)
        for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
            if (cfg[i][1] % KV_QGROUP == 0) shapes_all(cfg[i][0], cfg[i][1], cfg[i][2], (enum kv_type)t);

    /* attn_exp is the scalar twin of the kernels' exp: spot values. */
    CHECK(attn_exp(0.0f) == 1.0f);
    CHECK(fabsf(attn_exp(-1.0f) - 0.36787944f) < 1e-7f);
    CHECK(attn_exp(-200.0f) < 1e-37f);
    /* attn_tanh is tanh to the soft-cap's needs. */
    for (float x = -30.0f; x <= 30.0f; x += 0.37f)
        CHECK_MSG(fabsf(attn_tanh(x) - tanhf(x)) < 3e-7f, "attn_tanh(%g) = %.9g, tanhf %.9g", (double)x,
                  (double)attn_tanh(x), (double)tanhf(x));
    CHECK(attn_tanh(0.0f) == 0.0f && attn_tanh(1e30f) == 1.0f && attn_tanh(-1e30f) == -1.0f);
    return tu_finish();
}
