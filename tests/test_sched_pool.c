/* test_sched_pool.c — pooled requests (SCHED_POOL_*: embeddings, rerank
 * scores) through the scheduler on the real model:
 *  - the pooled vector of every prompt is, bit for bit, what one forward
 *    pass of the whole prompt gives (BE_HIDDEN_ALL rows: their mean summed
 *    in double in position order, the first row, the last row), whatever
 *    the step budget (chunked prefill), the batch, the order, a pool so
 *    small that sequences are preempted, and generating requests beside
 *    them;
 *  - last-token pooling reuses a shared prefix (cached_tokens > 0, prefill
 *    computed below the prompt tokens) and still gives the same bits; mean
 *    pooling does not reuse (its hidden states are not in a KV block);
 *  - the hidden row of BE_HIDDEN_LAST is the row the output head reads: the
 *    logits of the same step are the output matrix times it;
 *  - combinations that mean nothing are refused.
 * Skips (77) without the model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "cpu/be_cpu.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "model/quant.h"
#include "support/testutil.h"
#include "text/tok.h"

#define NREQ 10
#define NGEN 3 /* generating requests mixed in */

static struct model *M;
static struct tok *T;
static int32_t *prompts[NREQ];
static size_t n_prompts[NREQ];
static float *ref[3][NREQ]; /* [mean, cls, last][request] */

static const unsigned POOLS[3] = {SCHED_POOL_MEAN, SCHED_POOL_CLS, SCHED_POOL_LAST};

struct ctx {
    float *got[NREQ + NGEN];
    int finished[NREQ + NGEN];
    int32_t cached[NREQ + NGEN];
    int32_t e;
};

static bool on_token(void *user, const struct sched_seq_info *info, int32_t tok)
{
    (void)user;
    (void)tok;
    CHECK_MSG(info->user_id >= NREQ, "a pooled request %llu got a token", (unsigned long long)info->user_id);
    return false;
}

static void on_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    struct ctx *c = user;
    const uint64_t id = info->user_id;
    c->finished[id]++;
    c->cached[id] = info->cached_tokens;
    if (id >= NREQ) {
        CHECK(info->pooled == NULL);
        return;
    }
    CHECK_EQ_INT(why, SCHED_FINISH_STOP);
    CHECK_EQ_INT(info->n_generated, 0);
    CHECK_MSG(info->pooled != NULL, "request %llu finished without its pooled vector", (unsigned long long)id);
    if (info->pooled) memcpy(c->got[id], info->pooled, sizeof(float) * (size_t)c->e);
}

static struct backend *make_be(int32_t n_blocks)
{
    struct be_cpu_opts bo = {.n_threads = 0, .block_size = 16, .n_blocks = n_blocks};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(be_cpu_create(M, &bo, &be, &err) == KVB_OK, "%s", err.msg);
    return be;
}

/* The references: each prompt alone, one forward pass, every hidden row. */
static void make_refs(void)
{
    const int32_t e = M->hp.n_embd;
    struct backend *be = make_be(64);
    for (int i = 0; i < NREQ && be; i++) {
        const int32_t n = (int32_t)n_prompts[i];
        int32_t table[32];
        for (int32_t k = 0; k < 32; k++) table[k] = k;
        float *rows = kvb_malloc(sizeof(float) * (size_t)(n * e));
        struct be_seq s = {.tokens = prompts[i],
                           .n_tokens = n,
                           .pos = 0,
                           .block_table = table,
                           .n_blocks = (n + 15) / 16,
                           .logits = BE_HIDDEN_ALL};
        struct be_batch b = {&s, 1, NULL, rows};
        struct kvb_err err = {{0}};
        CHECK_MSG(be->forward(be, &b, NULL, &err) == KVB_OK, "%s", err.msg);
        for (int p = 0; p < 3; p++) ref[p][i] = kvb_malloc(sizeof(float) * (size_t)e);
        for (int32_t k = 0; k < e; k++) {
            double acc = 0;
            for (int32_t t = 0; t < n; t++) acc += rows[(int64_t)t * e + k];
            ref[0][i][k] = (float)(acc / n);
        }
        memcpy(ref[1][i], rows, sizeof(float) * (size_t)e);
        memcpy(ref[2][i], rows + (int64_t)(n - 1) * e, sizeof(float) * (size_t)e);
        kvb_free(rows);
    }
    be_free(be);
}

struct cfg {
    int32_t max_batch, max_step, n_blocks;
    bool shuffle, mixed;
};

/* Every prompt pooled as pools[i % 3] (so each pooling meets the others),
 * plus NGEN generating requests when mixed; the pooled vectors against the
 * references bit for bit. */
static struct sched_stats run(const struct cfg *cfg, int rot, struct ctx *c)
{
    const int32_t e = M->hp.n_embd;
    struct backend *be = make_be(cfg->n_blocks);
    struct sched_opts so = {.max_batch = cfg->max_batch, .max_step_tokens = cfg->max_step, .n_ctx = 64, .n_hidden = e};
    struct sched_callbacks cb = {.user = c, .on_token = on_token, .on_finish = on_finish};
    struct sched *s = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(sched_create(be, M->hp.n_vocab, &so, &cb, &s, &err) == KVB_OK, "%s", err.msg);
    memset(c, 0, sizeof *c);
    c->e = e;
    for (int i = 0; i < NREQ; i++) c->got[i] = kvb_calloc((size_t)e, sizeof(float));
    for (int k = 0; k < NREQ + (cfg->mixed ? NGEN : 0); k++) {
        const int i = cfg->shuffle ? (k * 7 + 3) % (NREQ + (cfg->mixed ? NGEN : 0)) : k;
        if (i < NREQ) {
            CHECK_MSG(sched_submit(s, (uint64_t)i, prompts[i], (int32_t)n_prompts[i], 0, NULL, POOLS[(i + rot) % 3],
                                   &err) == KVB_OK,
                      "%s", err.msg);
        } else {
            struct sampler_params sp;
            sampler_params_default(&sp);
            sp.temperature = 0;
            const int j = i - NREQ;
            CHECK(sched_submit(s, (uint64_t)i, prompts[j], (int32_t)n_prompts[j], 24, &sp, 0, &err) == KVB_OK);
        }
    }
    int guard = 0;
    while (s && !sched_idle(s) && guard++ < 10000) CHECK_MSG(sched_step(s, &err) == KVB_OK, "%s", err.msg);
    struct sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    be_free(be);
    for (int i = 0; i < NREQ; i++) {
        CHECK_EQ_INT(c->finished[i], 1);
        const int p = (i + rot) % 3;
        CHECK_MSG(memcmp(c->got[i], ref[p][i], sizeof(float) * (size_t)e) == 0,
                  "batch %d step %d blocks %d%s%s: request %d (%s pooling) differs from its one-pass reference",
                  cfg->max_batch, cfg->max_step, cfg->n_blocks, cfg->shuffle ? " shuffled" : "",
                  cfg->mixed ? " mixed" : "", i,
                  p == 0   ? "mean"
                  : p == 1 ? "cls"
                           : "last");
        kvb_free(c->got[i]);
    }
    for (int i = NREQ; cfg->mixed && i < NREQ + NGEN; i++) CHECK_EQ_INT(c->finished[i], 1);
    return st;
}

/* The hidden row is what the head reads: logits = output · hidden. */
static void check_head_input(void)
{
    const int32_t e = M->hp.n_embd, nv = M->hp.n_vocab, n = (int32_t)n_prompts[0];
    struct backend *be = make_be(16);
    int32_t table[16];
    for (int32_t k = 0; k < 16; k++) table[k] = k;
    float *h = kvb_malloc(sizeof(float) * (size_t)e), *lg = kvb_malloc(sizeof(float) * (size_t)nv);
    float *row = kvb_malloc(sizeof(float) * (size_t)e);
    struct be_seq s[2] = {
        {.tokens = prompts[0], .n_tokens = n, .block_table = table, .n_blocks = 8, .logits = BE_LOGITS_LAST},
        {.tokens = prompts[0], .n_tokens = n, .block_table = table + 8, .n_blocks = 8, .logits = BE_HIDDEN_LAST},
    };
    struct be_batch b = {s, 2, NULL, h};
    struct kvb_err err = {{0}};
    CHECK_MSG(be->forward(be, &b, lg, &err) == KVB_OK, "%s", err.msg);
    double se = 0, ss = 0;
    const struct mm_weight *w = &M->output;
    for (int32_t v = 0; v < nv; v++) {
        CHECK(quant_dequant_row(w->type, (const char *)w->data + (size_t)v * w->row_bytes, row, e) == KVB_OK);
        double z = 0;
        for (int32_t k = 0; k < e; k++) z += (double)row[k] * h[k];
        se += (z - lg[v]) * (z - lg[v]);
        ss += z * z;
    }
    /* The CPU's head quantizes its input row to 8 bits per block: close, not equal. */
    printf("logits vs output . hidden: nmse %.2e\n", se / ss);
    CHECK_MSG(se / ss < 1e-3, "logits are not the output head applied to the hidden row (nmse %.3e)", se / ss);
    kvb_free(h);
    kvb_free(lg);
    kvb_free(row);
    be_free(be);
}

static void check_refusals(void)
{
    struct backend *be = make_be(16);
    struct sched_opts so = {.n_ctx = 64, .n_hidden = M->hp.n_embd};
    struct sched_callbacks cb = {.on_finish = on_finish};
    struct sched *s = NULL;
    struct kvb_err err = {{0}};
    CHECK(sched_create(be, M->hp.n_vocab, &so, &cb, &s, &err) == KVB_OK);
    struct sampler_params sp;
    sampler_params_default(&sp);
    const int32_t *p = prompts[0];
    CHECK(sched_submit(s, 0, p, 8, 0, NULL, SCHED_POOL_MEAN | SCHED_POOL_LAST, &err) == KVB_ERR_INVALID_ARG);
    CHECK(sched_submit(s, 0, p, 8, 4, &sp, SCHED_POOL_MEAN, &err) == KVB_ERR_INVALID_ARG);
    CHECK(sched_submit(s, 0, p, 8, 0, NULL, SCHED_POOL_MEAN | SCHED_SCORE_PROMPT, &err) == KVB_ERR_INVALID_ARG);
    CHECK(sched_submit(s, 0, p, 8, 4, NULL, 0, &err) == KVB_ERR_INVALID_ARG);
    int32_t *longp = kvb_calloc(65, sizeof *longp);
    CHECK(sched_submit(s, 0, longp, 65, 0, NULL, SCHED_POOL_LAST, &err) == KVB_ERR_RANGE);
    sched_free(s);
    /* without n_hidden */
    so.n_hidden = 0;
    CHECK(sched_create(be, M->hp.n_vocab, &so, &cb, &s, &err) == KVB_OK);
    CHECK(sched_submit(s, 0, p, 8, 0, NULL, SCHED_POOL_LAST, &err) == KVB_ERR_INVALID_ARG);
    sched_free(s);
    /* a bidirectional scheduler takes nothing but pooled requests */
    so.n_hidden = M->hp.n_embd;
    so.bidirectional = true;
    CHECK(sched_create(be, M->hp.n_vocab, &so, &cb, &s, &err) == KVB_OK);
    CHECK(sched_submit(s, 0, p, 8, 4, &sp, 0, &err) == KVB_ERR_INVALID_ARG);
    sched_free(s);
    kvb_free(longp);
    be_free(be);
}

int main(void)
{
    const char *path = tu_env("KVB_MODEL");
    if (!path || access(path, R_OK) != 0) tu_skip("model not fetched (scripts/fetch-model.sh)");
    struct kvb_err err = {{0}};
    CHECK_MSG(model_load(path, &M, &err) == KVB_OK, "%s", err.msg);
    CHECK(tok_load(M->gguf, &T, &err) == KVB_OK);
    const char *inst = "Instruct: Given a question about the library, retrieve the passage that answers it.\nQuery: ";
    const char *qs[NREQ] = {"Where are the atlases kept?",
                            "Do you have poetry in translation?",
                            "When do you open on Sundays?",
                            "Is there a quiet reading room?",
                            "Can I print and scan documents here?",
                            "Where is the local history collection?",
                            "Do you lend films and music?",
                            "Passages are split into chunks of about two hundred tokens before they are embedded.",
                            "Where are the maps of Spain?",
                            "Who runs the book club on Thursdays?"};
    for (int i = 0; i < NREQ; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s%s", i == 7 ? "" : inst, qs[i]);
        CHECK(tok_encode(T, buf, strlen(buf), 0, &prompts[i], &n_prompts[i], NULL) == KVB_OK);
    }
    make_refs();
    check_head_input();
    check_refusals();

    const struct cfg cfgs[] = {
        {1, 512, 64, false, false}, /* one at a time */
        {8, 512, 64, false, true},  /* batched, generating requests beside */
        {10, 7, 64, true, true},    /* tiny step budget: every prompt in chunks */
        {10, 40, 6, true, true},    /* pool too small for all: preemption */
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++)
        for (int rot = 0; rot < 3; rot++) {
            struct ctx c;
            struct sched_stats st = run(&cfgs[k], rot, &c);
            printf("config %zu rotation %d: %lld prompt tokens, %lld cached, %lld prefill computed, %lld steps, %lld "
                   "preemptions\n",
                   k, rot, (long long)st.prompt_tokens, (long long)st.cached_tokens, (long long)st.prefill_computed,
                   (long long)st.steps, (long long)st.preemptions);
            if (k == 3 && rot == 0) CHECK_MSG(st.preemptions > 0, "the small pool was expected to force preemption");
            /* Last-token pooling reuses the shared instruction; the others
             * recompute it. */
            if (k == 1) {
                int64_t last_cached = 0, other_cached = 0;
                for (int i = 0; i < NREQ; i++) {
                    if ((i + rot) % 3 == 2) last_cached += c.cached[i];
                    else other_cached += c.cached[i];
                }
                CHECK_MSG(last_cached > 0, "rotation %d: last-token pooling reused no prefix", rot);
                CHECK_EQ_INT(other_cached, 0);
            }
        }
    for (int i = 0; i < NREQ; i++) {
        kvb_free(prompts[i]);
        for (int p = 0; p < 3; p++) kvb_free(ref[p][i]);
    }
    tok_free(T);
    model_free(M);
    return tu_finish();
}
