/* test_pstore_realkv.c — the cache codec on real K/V: prefills a prompt on
 * the default model with the CPU backend, reads its full blocks out of the
 * pool, and measures what the persistent cache would store: compression
 * ratio (lossless at several zstd levels, and lossy8 with its error), bytes
 * per token, and restore speed (decoding blocks, one thread and all
 * threads) against the prefill speed that produced them. Then checks that
 * the blocks survive a store round trip bit for bit.
 * Skips (77) when the model has not been fetched. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "cpu/be_cpu.h"
#include "engine/gen.h"
#include "model/model.h"
#include "store/pstore/pstore.h"
#include "store/pstore/pstore_internal.h"
#include "support/testutil.h"
#include "text/tok.h"

static double now(void) { return kvb_clock_s(); }

static const char *TEXT =
    "The Lindqvist survey of coastal wetlands, carried out between 1998 and 2004, recorded the nesting "
    "sites of forty-two bird species along the northern shore. Its authors noted that reed beds, once "
    "cut every winter for thatch, had spread inland after the practice stopped, and that the spread "
    "favoured warblers and bitterns at the expense of waders, which need open mud. A second section "
    "describes the tidal gates built in 1961: they kept salt water out of the polders but also starved "
    "the marsh of sediment, so that by the time of the survey parts of it lay half a metre lower than "
    "the sea at high tide. The report closes with a table of water levels, a map of the gates, and a "
    "recommendation that two of them be opened on a trial basis, which the regional board accepted in "
    "2006. Later monitoring found that sediment returned within three years, that waders came back to "
    "the eastern flats, and that the warblers held their ground in the older reed beds.";

/* The prefilled blocks every measurement below reads. */
struct realkv {
    const struct model *M;
    struct pstore_model pm;
    struct pstore_shape s;
    const int32_t *ids; /* (n_blocks * B) tokens */
    int32_t n_blocks, B;
    uint8_t *kv;      /* (n_blocks, raw) bytes: the blocks as the pool holds them */
    size_t raw;       /* bytes per block */
    double t_prefill; /* seconds for the prefill that produced them */
};

/* Describes the model to the store and copies the n_blocks full blocks out
 * of the backend's pool into r->kv. */
static void capture_blocks(struct realkv *r, struct backend *be, struct kvb_err *err)
{
    const struct model *M = r->M;
    const int32_t B = r->B, n_blocks = r->n_blocks;
    struct pstore_model pm = {.name = M->name,
                              .dtype = PSTORE_DTYPE_F16,
                              .block_size = B,
                              .n_layer = M->hp.n_layer,
                              .kv_dim = M->hp.n_head_kv * M->hp.head_dim};
    memcpy(pm.fingerprint, M->fingerprint, 33);
    r->pm = pm;
    CHECK(pstore_shape_init(&r->pm, &r->s, err) == KVB_OK);
    CHECK_EQ_INT(r->s.raw_len, be->block_bytes);
    size_t raw = (size_t)r->s.raw_len;
    r->raw = raw;
    r->kv = malloc(raw * (size_t)n_blocks);
    for (int32_t i = 0; i < n_blocks; i++) CHECK(be->kv_block_read(be, i, r->kv + (size_t)i * raw) == KVB_OK);
    printf("%s: %d layers, kv_dim %d, %d blocks of %d tokens (%zu bytes each); prefill %.0f tokens/s\n", M->name,
           (int)pm.n_layer, (int)pm.kv_dim, (int)n_blocks, (int)B, raw, n_blocks * B / r->t_prefill);
}

/* Adds block i's decoding error (out against the original) to the sums of
 * squared error *se and squared value *sx, and the largest error relative
 * to its row's largest value to *maxrel. */
static void add_block_error(const struct realkv *r, int32_t i, const uint8_t *out, double *se, double *sx,
                            double *maxrel)
{
    const struct pstore_model pm = r->pm;
    const size_t raw = r->raw;
    const uint16_t *a = (const uint16_t *)(r->kv + (size_t)i * raw), *b = (const uint16_t *)out;
    for (size_t row = 0; row < raw / 2 / (size_t)pm.kv_dim; row++) {
        double amax = 0;
        for (int j = 0; j < pm.kv_dim; j++)
            amax = fmax(amax, fabs(kvb_fp16_to_f32(a[row * (size_t)pm.kv_dim + (size_t)j])));
        for (int j = 0; j < pm.kv_dim; j++) {
            size_t k = row * (size_t)pm.kv_dim + (size_t)j;
            double x = kvb_fp16_to_f32(a[k]), d = x - kvb_fp16_to_f32(b[k]);
            *se += d * d;
            *sx += x * x;
            if (amax > 0) *maxrel = fmax(*maxrel, fabs(d) / amax);
        }
    }
}

/* One codec setting: encodes every block, decodes them all for 0.3 s at
 * least (the first pass checks them: lossless bit for bit, lossy8 within
 * 3% relative RMS), and prints ratio and speeds. out: raw bytes of scratch. */
static void codec_measure(const struct realkv *r, int level, bool lossy, uint8_t *out)
{
    const int32_t B = r->B, n_blocks = r->n_blocks;
    const size_t raw = r->raw;
    const int32_t *ids = r->ids;
    struct pstore_codec cod = {0};
    size_t total = 0;
    uint8_t **vals = malloc(sizeof(uint8_t *) * (size_t)n_blocks);
    size_t *lens = malloc(sizeof(size_t) * (size_t)n_blocks);
    double te = now();
    for (int32_t i = 0; i < n_blocks; i++) {
        const uint8_t *v;
        CHECK(pstore_codec_encode(&cod, &r->s, ids + (size_t)i * B, r->kv + (size_t)i * raw, NULL, level, lossy, &v,
                                  &lens[i], NULL) == KVB_OK);
        vals[i] = malloc(lens[i]);
        memcpy(vals[i], v, lens[i]);
        total += lens[i];
    }
    te = now() - te;
    double se = 0, sx = 0, maxrel = 0;
    double td = now();
    int reps = 0;
    do {
        for (int32_t i = 0; i < n_blocks; i++) {
            CHECK(pstore_codec_decode(&cod, &r->s, ids + (size_t)i * B, true, vals[i], lens[i], out, NULL, NULL) ==
                  KVB_OK);
            if (reps) continue;
            if (!lossy) CHECK(!memcmp(r->kv + (size_t)i * raw, out, raw));
            add_block_error(r, i, out, &se, &sx, &maxrel);
        }
        reps++;
    } while (now() - td < 0.3);
    td = (now() - td) / reps;
    printf("  %-8s zstd %2d: ratio %.3fx, %.0f stored bytes/token; encode %.0f MB/s, decode %.0f MB/s = "
           "%.0f tokens/s restored (one thread)",
           lossy ? "lossy8" : "lossless", level, (double)raw * n_blocks / (double)total, (double)total / (n_blocks * B),
           raw * n_blocks / te / 1e6, raw * n_blocks / td / 1e6, n_blocks * B / td);
    if (lossy) printf("; error: relative RMS %.4f, max / row max %.4f", sqrt(se / sx), maxrel);
    printf("\n");
    if (lossy) CHECK(sqrt(se / sx) < 0.03);
    for (int32_t i = 0; i < n_blocks; i++) free(vals[i]);
    free(vals);
    free(lens);
    pstore_codec_free(&cod);
}

/* Writer throughput: 8 more chains (other first token), timed from the
 * first put until all are on disk; 8 x 13 blocks fit the put queue. keys:
 * room for n_blocks; written0: blocks the store had written before. */
static void writer_throughput(const struct realkv *r, struct pstore *ps, struct pstore_key *keys, uint64_t written0)
{
    const int32_t B = r->B, n_blocks = r->n_blocks;
    const size_t raw = r->raw;
    struct pstore_stats st;
    int32_t *ids2 = malloc(sizeof(int32_t) * (size_t)n_blocks * (size_t)B);
    memcpy(ids2, r->ids, sizeof(int32_t) * (size_t)n_blocks * (size_t)B);
    double tw = now();
    for (int c = 0; c < 8; c++) {
        ids2[0] = 1000 + c;
        pstore_chain_keys(&r->pm, ids2, n_blocks, keys);
        for (int32_t i = 0; i < n_blocks; i++)
            CHECK(pstore_put(ps, &r->pm, &keys[i], i ? &keys[i - 1] : NULL, ids2 + (size_t)i * B,
                             r->kv + (size_t)i * raw) == KVB_OK);
    }
    double tq = now() - tw;
    pstore_flush(ps);
    tw = now() - tw;
    pstore_get_stats(ps, &st);
    CHECK_EQ_INT(st.blocks_written - written0, 8 * n_blocks);
    CHECK_EQ_INT(st.blocks_dropped, 0);
    printf("writer: %d blocks (%.1f MB raw) queued in %.1f ms (engine side), on disk after %.0f ms = %.0f MB/s, "
           "%.0f tokens/s\n",
           8 * (int)n_blocks, 8.0 * n_blocks * raw / 1e6, tq * 1e3, tw * 1e3, 8.0 * n_blocks * raw / tw / 1e6,
           8.0 * n_blocks * B / tw);
    free(ids2);
}

static void remove_store_dir(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

/* Through a store: put, flush, load in parallel, bit-exact; then the
 * writer's throughput. */
static void store_roundtrip(const struct realkv *r, struct kvb_err *err)
{
    const int32_t B = r->B, n_blocks = r->n_blocks;
    const size_t raw = r->raw;
    const int32_t *ids = r->ids;
    char dir[] = "/tmp/kvb_pstore_realkv_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    struct pstore *ps = NULL;
    struct pstore_opts po = {.quiet = true};
    CHECK_MSG(pstore_open(dir, &po, &ps, err) == KVB_OK, "%s", err->msg);
    struct pstore_key *keys = malloc(sizeof *keys * (size_t)n_blocks);
    pstore_chain_keys(&r->pm, ids, n_blocks, keys);
    for (int32_t i = 0; i < n_blocks; i++)
        CHECK(pstore_put(ps, &r->pm, &keys[i], i ? &keys[i - 1] : NULL, ids + (size_t)i * B, r->kv + (size_t)i * raw) ==
              KVB_OK);
    pstore_flush(ps);
    uint8_t *back = malloc(raw * (size_t)n_blocks);
    void **dst = malloc(sizeof(void *) * (size_t)n_blocks);
    for (int32_t i = 0; i < n_blocks; i++) dst[i] = back + (size_t)i * raw;
    int32_t got = 0;
    CHECK(pstore_load_chain(ps, &r->pm, ids, keys, 0, n_blocks, dst, &got, err) == KVB_OK); /* warms the pool */
    double tl = now();
    CHECK(pstore_load_chain(ps, &r->pm, ids, keys, 0, n_blocks, dst, &got, err) == KVB_OK);
    tl = now() - tl;
    CHECK_EQ_INT(got, n_blocks);
    CHECK(!memcmp(back, r->kv, raw * (size_t)n_blocks));
    struct pstore_stats st;
    pstore_get_stats(ps, &st);
    printf("store: %d blocks written (%.3fx), chain of %d loaded in %.2f ms = %.0f tokens/s (all threads) vs "
           "prefill %.0f tokens/s\n",
           (int)st.blocks_written, (double)st.raw_bytes_written / (double)st.bytes_written, (int)n_blocks, tl * 1e3,
           n_blocks * B / tl, n_blocks * B / r->t_prefill);
    writer_throughput(r, ps, keys, st.blocks_written);
    pstore_close(ps);
    remove_store_dir(dir);
    free(keys);
    free(back);
    free(dst);
}

int main(void)
{
    const char *path = tu_env("KVB_MODEL");
    if (!path || access(path, R_OK) != 0) tu_skip("model not fetched (scripts/fetch-model.sh)");
    struct kvb_err err = {{0}};
    struct model *M = NULL;
    struct tok *T = NULL;
    if (model_load(path, &M, &err) != KVB_OK) tu_skip(err.msg);
    CHECK_MSG(tok_load(M->gguf, &T, &err) == KVB_OK, "%s", err.msg);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(tok_encode(T, TEXT, strlen(TEXT), 0, &ids, &n_ids, NULL) == KVB_OK);
    const int32_t B = 16;
    int32_t n_blocks = (int32_t)(n_ids / (size_t)B);
    struct be_cpu_opts bo = {.n_threads = 0, .block_size = B, .n_blocks = n_blocks + 4};
    struct backend *be = NULL;
    CHECK_MSG(be_cpu_create(M, &bo, &be, &err) == KVB_OK, "%s", err.msg);
    struct gen_ctx *g = NULL;
    CHECK(gen_create(M, be, (n_blocks + 4) * B, 512, &g, &err) == KVB_OK);
    double t0 = now();
    CHECK(gen_feed(g, ids, n_blocks * B, NULL, &err) == KVB_OK);
    struct realkv r = {.M = M, .ids = ids, .n_blocks = n_blocks, .B = B, .t_prefill = now() - t0};
    capture_blocks(&r, be, &err);
    uint8_t *out = malloc(r.raw);

    const struct {
        int level;
        bool lossy;
    } cfg[] = {{1, false}, {3, false}, {9, false}, {19, false}, {3, true}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) codec_measure(&r, cfg[c].level, cfg[c].lossy, out);
    store_roundtrip(&r, &err);

    free(r.kv);
    free(out);
    kvb_free(ids);
    gen_free(g);
    be_free(be);
    tok_free(T);
    model_free(M);
    return tu_finish();
}
