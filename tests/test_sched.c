/* test_sched.c — the scheduler on the real model: every request's tokens are
 * identical whatever max_batch, max_step_tokens, submission order, and pool
 * size (including a pool so small that sequences are preempted and
 * recomputed); a shared prefix is computed once; max_tokens and stop from the
 * callback end sequences. Skips (77) without the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "backend.h"
#include "model.h"
#include "scheduler.h"
#include "testutil.h"
#include "tok.h"

#define NREQ 12
#define MAXGEN 10

static struct model *M;
static struct tok *T;
static int32_t *prompts[NREQ];
static size_t n_prompts[NREQ];

struct result {
    int32_t toks[MAXGEN];
    int32_t n;
    int finished;
    enum sched_finish why;
    int32_t cached;
};

struct ctx {
    struct result res[NREQ];
    uint64_t stop_id;      /* finish this request after its 3rd token (tests on_token stop) */
};

static bool on_token(void *user, const struct sched_seq_info *info, int32_t tok)
{
    struct ctx *c = user;
    struct result *r = &c->res[info->user_id];
    if (r->n < MAXGEN) r->toks[r->n++] = tok;
    CHECK(info->tokens[info->n_prompt + info->n_generated - 1] == tok);
    return info->user_id == c->stop_id && info->n_generated == 3;
}

static void on_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    struct ctx *c = user;
    c->res[info->user_id].finished++;
    c->res[info->user_id].why = why;
    c->res[info->user_id].cached = info->cached_tokens;
}

struct run_cfg {
    int32_t max_batch, max_step, n_blocks;
    bool shuffle;
};

static struct sched_stats run(const struct run_cfg *cfg, struct ctx *c)
{
    struct be_cpu_opts bo = {.n_threads = 0, .block_size = 16, .n_blocks = cfg->n_blocks};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(be_cpu_create(M, &bo, &be, &err) == KVB_OK, "%s", err.msg);
    struct sched_opts so = {.max_batch = cfg->max_batch, .max_step_tokens = cfg->max_step, .n_ctx = 256};
    struct sched_callbacks cb = {.user = c, .on_token = on_token, .on_finish = on_finish};
    struct sched *s = NULL;
    CHECK_MSG(sched_create(be, M->hp.n_vocab, &so, &cb, &s, &err) == KVB_OK, "%s", err.msg);
    int order[NREQ];
    for (int i = 0; i < NREQ; i++) order[i] = i;
    if (cfg->shuffle)
        for (int i = NREQ - 1; i > 0; i--) {
            int j = (i * 7 + 3) % (i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    for (int k = 0; k < NREQ; k++) {
        int i = order[k];
        struct sampler_params sp;
        sampler_params_default(&sp);
        sp.temperature = i % 2 ? 0.0f : 0.9f; /* greedy and seeded sampling both */
        sp.seed = 1000 + (uint64_t)i;
        CHECK(sched_submit(s, (uint64_t)i, prompts[i], (int32_t)n_prompts[i], i == 5 ? 4 : MAXGEN, &sp, &err) == KVB_OK);
    }
    int guard = 0;
    while (!sched_idle(s) && guard++ < 10000) CHECK_MSG(sched_step(s, &err) == KVB_OK, "%s", err.msg);
    struct sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    be_free(be);
    return st;
}

int main(void)
{
    const char *path = tu_env("KVB_MODEL");
    if (!path || access(path, R_OK) != 0) tu_skip("model not fetched (scripts/fetch-model.sh)");
    struct kvb_err err = {{0}};
    CHECK_MSG(model_load(path, &M, &err) == KVB_OK, "%s", err.msg);
    CHECK(tok_load(M->gguf, &T, &err) == KVB_OK);
    const char *sys = "You are a careful assistant for a library. Answer in one short sentence, "
                      "cite the shelf number when you know it, and never invent book titles. ";
    const char *qs[NREQ] = {"Where are the atlases?", "Do you have poetry?", "When do you open?",
                            "Is there a quiet room?", "Can I print here?", "Where is history?",
                            "Do you lend films?", "Is wifi free?", "Where are maps of Spain?",
                            "Who runs the book club?", "Are there children's books?", "Can I donate books?"};
    size_t shared_tokens = 0;
    for (int i = 0; i < NREQ; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s%s", i == 11 ? "" : sys, qs[i]); /* one request shares nothing */
        CHECK(tok_encode(T, buf, strlen(buf), 0, &prompts[i], &n_prompts[i], NULL) == KVB_OK);
    }
    {
        int32_t *sp_ids;
        CHECK(tok_encode(T, sys, strlen(sys), 0, &sp_ids, &shared_tokens, NULL) == KVB_OK);
        kvb_free(sp_ids);
    }

    struct run_cfg cfgs[] = {
        {1, 512, 64, false},  /* one at a time: the reference */
        {8, 512, 64, false},
        {12, 7, 64, true},    /* tiny step budget, shuffled */
        {12, 64, 18, true},   /* pool too small for all: preemption */
    };
    struct ctx ref = {.stop_id = 7};
    struct sched_stats st0 = run(&cfgs[0], &ref);
    for (int i = 0; i < NREQ; i++) {
        CHECK_EQ_INT(ref.res[i].finished, 1);
        int32_t want = i == 5 ? 4 : i == 7 ? 3 : MAXGEN;
        /* EOS may end a request early, but never past its limit. */
        CHECK(ref.res[i].n <= want);
        if (i == 7) CHECK_EQ_INT(ref.res[i].why, SCHED_FINISH_STOP);
        if (i == 5) CHECK(ref.res[i].n == 4 ? ref.res[i].why == SCHED_FINISH_LENGTH : true);
    }
    printf("reference: %lld prompt tokens, %lld cached, %lld prefill computed, %lld steps\n",
           (long long)st0.prompt_tokens, (long long)st0.cached_tokens, (long long)st0.prefill_computed,
           (long long)st0.steps);
    /* Shared system prompt computed once: prefill is at most the unique
     * tokens plus one block per request. */
    int64_t unique = st0.prompt_tokens - (int64_t)(NREQ - 2) * (int64_t)(shared_tokens / 16 * 16);
    CHECK_MSG(st0.prefill_computed <= unique + NREQ * 16, "prefill %lld > unique %lld + one block each",
              (long long)st0.prefill_computed, (long long)unique);

    for (size_t c = 1; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        struct ctx got = {.stop_id = 7};
        struct sched_stats st = run(&cfgs[c], &got);
        printf("config %zu (batch %d, step %d, blocks %d%s): %lld steps, %lld preemptions, %lld prefill computed\n", c,
               cfgs[c].max_batch, cfgs[c].max_step, cfgs[c].n_blocks, cfgs[c].shuffle ? ", shuffled" : "",
               (long long)st.steps, (long long)st.preemptions, (long long)st.prefill_computed);
        for (int i = 0; i < NREQ; i++) {
            CHECK_EQ_INT(got.res[i].finished, 1);
            CHECK_MSG(got.res[i].n == ref.res[i].n &&
                          memcmp(got.res[i].toks, ref.res[i].toks, sizeof(int32_t) * (size_t)ref.res[i].n) == 0,
                      "config %zu: request %d differs from the one-at-a-time run", c, i);
        }
        if (c == 3) CHECK_MSG(st.preemptions > 0, "the small pool was expected to force preemption");
        if (c == 2) CHECK(st.steps > st0.steps / 4);
    }
    for (int i = 0; i < NREQ; i++) kvb_free(prompts[i]);
    tok_free(T);
    model_free(M);
    return tu_finish();
}
