/* test_swa.c — sliding-window layers in the paged KV pool (backend.h's
 * paging, engine/kv.h's window parts), on a synthetic gemma3 model (6
 * layers, 5 of them windowed over 32 positions, blocks of 8, so a page is
 * one layer and a block six pages):
 *  - every request's logits, at every token it samples, are bit-identical
 *    whatever the batch (1 or 4 at once), the chunking of prefills, and the
 *    pool: one big enough for every block, and one of 20 blocks' pages, too
 *    small to hold one 300-token sequence's full KV (38 blocks) but enough
 *    for its full-attention layers plus a window on the others: the
 *    windowed layers' pages of blocks behind every window were taken back
 *    and reused;
 *  - the KV a sequence held at most (sched_stats.seq_kv_peak) is its
 *    full-attention pages for every position and windowed pages for a
 *    window and a step, not its full KV;
 *  - a request extending another's prompt past the window reuses it (its
 *    cached tokens) when the window parts it needs are there, and gets the
 *    logits of a request computed alone;
 *  - through the persistent store: a second run loads the prompts' blocks
 *    (all pages of each) and gives the same logits;
 *  - gen.h (one sequence, no scheduler) gives the scheduler's logits.
 * No model file needed (synth.h writes it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "cpu/be_cpu.h"
#include "engine/gen.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "store/pstore/pstore.h"
#include "support/synth.h"
#include "support/testutil.h"

#define NREQ 6
#define MAXGEN 8
#define BS 8
#define WIN 32

static struct model *M;
static int32_t prompts[NREQ][400];
static int32_t n_prompt[NREQ];

struct out {
    int32_t toks[NREQ][MAXGEN];
    uint64_t logit_hash[NREQ][MAXGEN];
    int32_t n[NREQ];
    int32_t cached[NREQ], stored[NREQ];
};

static bool on_token(void *user, const struct sched_seq_info *info, int32_t tok)
{
    struct out *o = user;
    const int i = (int)info->user_id;
    CHECK(info->logits != NULL);
    if (o->n[i] < MAXGEN && info->logits) {
        o->logit_hash[i][o->n[i]] = XXH3_64bits(info->logits, sizeof(float) * (size_t)M->hp.n_vocab);
        o->toks[i][o->n[i]++] = tok;
    }
    return false;
}

static void on_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    struct out *o = user;
    CHECK_MSG(why != SCHED_FINISH_ERROR, "request %llu: %s", (unsigned long long)info->user_id, info->error);
    o->cached[info->user_id] = info->cached_tokens;
    o->stored[info->user_id] = info->store_tokens;
}

struct cfg {
    int32_t max_batch, max_step, n_blocks;
    const char *cache_dir;
};

static struct sched_stats run(const struct cfg *c, struct out *o)
{
    memset(o, 0, sizeof *o);
    struct be_cpu_opts bo = {.n_threads = 2, .block_size = BS, .n_blocks = c->n_blocks};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(be_cpu_create(M, &bo, &be, &err) == KVB_OK, "%s", err.msg);
    CHECK(be->n_groups == 6 && be->n_global_groups == 1 && be->window == WIN);
    struct sched_opts so = {.max_batch = c->max_batch, .max_step_tokens = c->max_step, .n_ctx = 512};
    struct sched_callbacks cb = {.user = o, .on_token = on_token, .on_finish = on_finish};
    struct sched *s = NULL;
    CHECK_MSG(sched_create(be, M->hp.n_vocab, &so, &cb, &s, &err) == KVB_OK, "%s", err.msg);
    struct pstore *ps = NULL;
    struct pstore_model pm = {.name = M->name,
                              .dtype = PSTORE_DTYPE_F16,
                              .block_size = BS,
                              .n_layer = M->hp.n_layer,
                              .kv_dim = M->hp.n_head_kv * M->hp.head_dim};
    memcpy(pm.fingerprint, M->fingerprint, sizeof pm.fingerprint);
    if (c->cache_dir) {
        struct pstore_opts po = {.quiet = true};
        CHECK_MSG(pstore_open(c->cache_dir, &po, &ps, &err) == KVB_OK, "%s", err.msg);
        CHECK(sched_set_store(s, ps, &pm) == KVB_OK);
    }
    for (int i = 0; i < NREQ; i++) {
        struct sampler_params sp;
        sampler_params_default(&sp);
        sp.temperature = 0.0f;
        CHECK(sched_submit(s, (uint64_t)i, prompts[i], n_prompt[i], MAXGEN, &sp, SCHED_WANT_LOGITS, &err) == KVB_OK);
    }
    while (!sched_idle(s)) CHECK_MSG(sched_step(s, &err) == KVB_OK, "%s", err.msg);
    struct sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    if (ps) pstore_flush(ps);
    pstore_close(ps);
    be_free(be);
    return st;
}

static void check_same(const char *what, const struct out *ref, const struct out *got)
{
    for (int i = 0; i < NREQ; i++) {
        CHECK_MSG(got->n[i] == ref->n[i], "%s: request %d made %d tokens, reference %d", what, i, got->n[i], ref->n[i]);
        for (int j = 0; j < ref->n[i] && j < got->n[i]; j++)
            if (got->logit_hash[i][j] != ref->logit_hash[i][j] || got->toks[i][j] != ref->toks[i][j]) {
                CHECK_MSG(0, "%s: request %d, token %d: logits differ from the reference run", what, i, j);
                break;
            }
    }
}

int main(void)
{
    char dir[] = "/tmp/kvb_swa_XXXXXX";
    if (!mkdtemp(dir)) tu_skip("cannot make a temporary directory");
    char path[512];
    snprintf(path, sizeof path, "%s/g3.gguf", dir);
    struct synth_opts so;
    synth_opts_default(&so);
    so.arch = "gemma3";
    so.n_layer = 6;
    so.n_embd = 128;
    so.n_head = 4;
    so.n_head_kv = 1;
    so.head_dim = 64;
    so.n_ff = 256;
    so.n_swa = WIN;
    so.seed = 21;
    struct kvb_err err = {{0}};
    CHECK_MSG(synth_model_write(path, &so, &err) == KVB_OK, "%s", err.msg);
    CHECK_MSG(model_load(path, &M, &err) == KVB_OK, "%s", err.msg);
    if (!M) return tu_finish();

    /* Prompts: random bytes; 1 shares 200 tokens with 0; 2 is 0's prompt
     * and 60 more tokens (it extends 0 past the window); 3-5 their own. */
    uint64_t r = 99;
    for (int i = 0; i < NREQ; i++) {
        n_prompt[i] = 250 + 17 * i;
        for (int j = 0; j < n_prompt[i]; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i][j] = (int32_t)((r >> 33) % 256);
        }
    }
    memcpy(prompts[1], prompts[0], sizeof(int32_t) * 200);
    n_prompt[2] = n_prompt[0] + 60;
    memcpy(prompts[2], prompts[0], sizeof(int32_t) * (size_t)n_prompt[0]);

    struct out ref, got;
    const struct cfg alone = {1, 512, 512, NULL};
    struct sched_stats st = run(&alone, &ref);
    printf("alone, big pool: peak KV of one sequence %lld bytes at %d tokens\n", (long long)st.seq_kv_peak,
           st.seq_kv_peak_tokens);

    /* Batched, chunked, big pool. */
    const struct cfg batched = {4, 40, 512, NULL};
    st = run(&batched, &got);
    check_same("batch 4, chunks of 40", &ref, &got);

    /* The small pool: 20 blocks of pages (120 pages), where a 300-token
     * sequence's full KV is 38 blocks. */
    const struct cfg small = {3, 40, 20, NULL};
    st = run(&small, &got);
    check_same("20-block pool", &ref, &got);
    const int64_t page = 8 * BS * 2 * 64 / 8 * 2; /* one layer: BS rows of K and V, 64 f16 each */
    const int32_t longest = n_prompt[2] + MAXGEN;
    const int64_t full = (int64_t)((longest + BS - 1) / BS) * 6 * page;
    const int64_t bound = ((int64_t)((longest + BS - 1) / BS) * 1 + (int64_t)((WIN + 40) / BS + 2) * 5) * page;
    printf("20-block pool: peak KV of one sequence %lld bytes at %d tokens (full KV of %d tokens: %lld, bound "
           "%lld); %lld preemptions\n",
           (long long)st.seq_kv_peak, st.seq_kv_peak_tokens, longest, (long long)full, (long long)bound,
           (long long)st.preemptions);
    CHECK_MSG(st.seq_kv_peak <= bound, "a sequence held %lld bytes of KV, more than %lld", (long long)st.seq_kv_peak,
              (long long)bound);
    CHECK(st.seq_kv_peak < full / 2);

    /* Request 2 after request 0, in one batch-1 run: it reuses 0's prompt
     * only where the window parts it needs remain; with a big pool they do. */
    CHECK_MSG(ref.cached[2] >= n_prompt[0] - BS, "request 2 reused %d tokens of the %d it shares", ref.cached[2],
              n_prompt[0]);

    /* The persistent store: first run spills, second loads. */
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    const struct cfg stored = {2, 64, 512, cache};
    st = run(&stored, &got);
    check_same("store, first run", &ref, &got);
    st = run(&stored, &got);
    check_same("store, second run", &ref, &got);
    int32_t loaded = 0;
    for (int i = 0; i < NREQ; i++) loaded += got.stored[i];
    printf("store, second run: %d prompt tokens loaded\n", loaded);
    CHECK(loaded > 0);
    const struct cfg stored_small = {3, 40, 20, cache};
    st = run(&stored_small, &got);
    check_same("store, 20-block pool", &ref, &got);

    /* gen.h: one sequence on the backend's own pages. */
    {
        struct be_cpu_opts bo = {.n_threads = 2, .block_size = BS, .n_blocks = 64};
        struct backend *be = NULL;
        CHECK(be_cpu_create(M, &bo, &be, &err) == KVB_OK);
        struct gen_ctx *g = NULL;
        CHECK(gen_create(M, be, 512, 40, &g, &err) == KVB_OK);
        CHECK(gen_feed(g, prompts[3], n_prompt[3], NULL, &err) == KVB_OK);
        CHECK_MSG(XXH3_64bits(gen_logits(g), sizeof(float) * (size_t)M->hp.n_vocab) == ref.logit_hash[3][0],
                  "gen.h's logits differ from the scheduler's");
        gen_free(g);
        be_free(be);
    }

    model_free(M);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tu_finish();
}
