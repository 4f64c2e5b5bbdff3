/* test_sched.c — the scheduler on the real model: every request's tokens are
 * identical whatever max_batch, max_step_tokens, submission order, and pool
 * size (including a pool so small that sequences are preempted and
 * recomputed), and whether greedy choices are made by the backend
 * (BE_LOGITS_ARGMAX, through a wrapper that gives the CPU backend that
 * ability the way the CUDA backend has it) or by the sampler; a shared
 * prefix is computed once; max_tokens and stop from the callback end
 * sequences; a logits row that is not finite (NaN, an infinity) ends its
 * sequence with SCHED_FINISH_ERROR and a message, never with a made-up
 * token, and leaves the others as they were. Skips (77) without the model. */
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
#include "support/testutil.h"
#include "text/tok.h"

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
    char error[200];
};

struct ctx {
    struct result res[NREQ];
    uint64_t stop_id; /* finish this request after its 3rd token (tests on_token stop) */
    int no_logits;    /* tokens whose on_token saw info->logits NULL */
};

static bool on_token(void *user, const struct sched_seq_info *info, int32_t tok)
{
    struct ctx *c = user;
    struct result *r = &c->res[info->user_id];
    if (r->n < MAXGEN) r->toks[r->n++] = tok;
    CHECK(info->tokens[info->n_prompt + info->n_generated - 1] == tok);
    c->no_logits += info->logits == NULL;
    return info->user_id == c->stop_id && info->n_generated == 3;
}

static void on_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    struct ctx *c = user;
    c->res[info->user_id].finished++;
    c->res[info->user_id].why = why;
    c->res[info->user_id].cached = info->cached_tokens;
    CHECK((why == SCHED_FINISH_ERROR) == (info->error != NULL));
    snprintf(c->res[info->user_id].error, sizeof c->res[0].error, "%s", info->error ? info->error : "");
}

struct run_cfg {
    int32_t max_batch, max_step, n_blocks;
    bool shuffle;
    bool argmax;      /* through the greedy-choosing wrapper below */
    bool want_logits; /* every request asks for its logits */
    int poison;       /* through the wrapper, which spoils request POISONED's 3rd row: 1 all NaN, 2 one +inf */
};

/* The request that shares nothing: its positions are the only ones below
 * the shared system prompt's length, so the wrapper can find its rows. */
#define POISONED 11

/* ---- a backend that makes greedy choices itself -------------------------------- */

/* Wraps the CPU backend: a BE_LOGITS_ARGMAX sequence is run as
 * BE_LOGITS_LAST into a buffer of its own and reduced with sampler_greedy;
 * the other rows are packed into the caller's logits as the seam says. */
struct wrap {
    struct backend be;
    struct backend *inner;
    int poison;
    float *buf; /* (max rows, n_vocab) */
    struct be_seq *seqs;
    int32_t cap_rows, cap_seqs;
};

static enum kvb_status wrap_forward(struct backend *be, const struct be_batch *b, float *logits, struct kvb_err *err)
{
    struct wrap *w = be->impl;
    const int64_t nv = M->hp.n_vocab;
    struct be_batch_shape sh;
    KVB_FORWARD_IF_ERROR(be_batch_check(be, M->hp.n_vocab, b, &sh, err));
    const int64_t rows = sh.n_out + sh.n_argmax;
    if (rows > w->cap_rows || b->n_seqs > w->cap_seqs) {
        kvb_free(w->buf);
        kvb_free(w->seqs);
        w->buf = kvb_malloc(sizeof(float) * (size_t)(rows * nv));
        w->seqs = kvb_malloc(sizeof *w->seqs * (size_t)b->n_seqs);
        KVB_RETURN_IF(!w->buf || !w->seqs, KVB_ERR_NOMEM);
        w->cap_rows = (int32_t)rows;
        w->cap_seqs = b->n_seqs;
    }
    for (int32_t i = 0; i < b->n_seqs; i++) {
        w->seqs[i] = b->seqs[i];
        if (w->seqs[i].logits == BE_LOGITS_ARGMAX) w->seqs[i].logits = BE_LOGITS_LAST;
    }
    struct be_batch inner = {w->seqs, b->n_seqs, NULL, b->hidden};
    KVB_FORWARD_IF_ERROR(w->inner->forward(w->inner, &inner, w->buf, err));
    int64_t r = 0, host = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct be_seq *q = &b->seqs[i];
        const int64_t n = q->logits == BE_LOGITS_ALL                                     ? q->n_tokens
                          : q->logits == BE_LOGITS_LAST || q->logits == BE_LOGITS_ARGMAX ? 1
                                                                                         : 0;
        if (w->poison && n == 1 && q->pos + q->n_tokens == (int32_t)n_prompts[POISONED] + 2) {
            float *row = w->buf + r * nv;
            if (w->poison == 1)
                for (int64_t k = 0; k < nv; k++) row[k] = NAN;
            else row[nv / 2] = INFINITY;
        }
        if (q->logits == BE_LOGITS_ARGMAX) {
            if (sampler_greedy(w->buf + r * nv, (int32_t)nv, &b->argmax[i]) != KVB_OK) b->argmax[i] = -1;
        } else if (n > 0) {
            memcpy(logits + host * nv, w->buf + r * nv, sizeof(float) * (size_t)(n * nv));
            host += n;
        }
        r += n;
    }
    return KVB_OK;
}

static enum kvb_status wrap_read(struct backend *be, int32_t block, void *dst)
{
    struct backend *in = ((struct wrap *)be->impl)->inner;
    return in->kv_block_read(in, block, dst);
}

static enum kvb_status wrap_write(struct backend *be, int32_t block, const void *src)
{
    struct backend *in = ((struct wrap *)be->impl)->inner;
    return in->kv_block_write(in, block, src);
}

static void wrap_parallel(struct backend *be, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    struct backend *in = ((struct wrap *)be->impl)->inner;
    in->host_parallel(in, fn, arg);
}

static void wrap_free(struct backend *be)
{
    struct wrap *w = be->impl;
    be_free(w->inner);
    kvb_free(w->buf);
    kvb_free(w->seqs);
    kvb_free(w);
}

static struct backend *wrap_create(struct backend *inner, bool argmax, int poison)
{
    struct wrap *w = kvb_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->inner = inner;
    w->poison = poison;
    w->be = *inner;
    w->be.name = "cpu+argmax";
    w->be.impl = w;
    w->be.argmax = argmax;
    w->be.forward = wrap_forward;
    w->be.kv_block_read = wrap_read;
    w->be.kv_block_write = wrap_write;
    w->be.host_parallel = wrap_parallel;
    w->be.free = wrap_free;
    return &w->be;
}

static struct sched_stats run(const struct run_cfg *cfg, struct ctx *c)
{
    struct be_cpu_opts bo = {.n_threads = 0, .block_size = 16, .n_blocks = cfg->n_blocks};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(be_cpu_create(M, &bo, &be, &err) == KVB_OK, "%s", err.msg);
    if (cfg->argmax || cfg->poison) {
        struct backend *w = wrap_create(be, cfg->argmax, cfg->poison);
        CHECK(w != NULL);
        if (w) be = w;
    }
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
        CHECK(sched_submit(s, (uint64_t)i, prompts[i], (int32_t)n_prompts[i], i == 5 ? 4 : MAXGEN, &sp,
                           cfg->want_logits ? SCHED_WANT_LOGITS : 0, &err) == KVB_OK);
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
    const char *qs[NREQ] = {
        "Where are the atlases?",   "Do you have poetry?",     "When do you open?",           "Is there a quiet room?",
        "Can I print here?",        "Where is history?",       "Do you lend films?",          "Is wifi free?",
        "Where are maps of Spain?", "Who runs the book club?", "Are there children's books?", "Can I donate books?"};
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
        {1, 512, 64, false, false, false, 0},                                     /* one at a time: the reference */
        {8, 512, 64, false, false, false, 0}, {12, 7, 64, true, false, false, 0}, /* tiny step budget, shuffled */
        {12, 64, 18, true, false, false, 0},  /* pool too small for all: preemption */
        {8, 512, 64, false, true, false, 0},  /* greedy choices made by the backend */
        {12, 64, 18, true, true, false, 0},   /* ... with preemption */
        {8, 512, 64, false, true, true, 0},   /* ... unless the logits are wanted */
        {8, 512, 64, false, false, false, 1}, /* request POISONED's logits turn NaN */
        {8, 512, 64, false, true, false, 1},  /* ... where the backend chooses greedy tokens */
        {8, 512, 64, false, false, false, 2}, /* ... one logit turns +inf */
    };
    struct ctx ref = {.stop_id = 7};
    struct sched_stats st0 = run(&cfgs[0], &ref);
    CHECK_MSG(ref.res[POISONED].n >= 3, "request %d ends before its 3rd token: the poison checks see nothing",
              POISONED);
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
            if (cfgs[c].poison && i == POISONED && ref.res[i].n >= 3) {
                /* two good tokens, then an error that names the cause */
                CHECK_EQ_INT(got.res[i].why, SCHED_FINISH_ERROR);
                CHECK_EQ_INT(got.res[i].n, 2);
                CHECK(memcmp(got.res[i].toks, ref.res[i].toks, 2 * sizeof(int32_t)) == 0);
                const bool backend_chose = cfgs[c].argmax && i % 2 == 1;
                CHECK_MSG(strstr(got.res[i].error, backend_chose ? "no token to choose" : "not finite") != NULL,
                          "config %zu: error '%s'", c, got.res[i].error);
                if (!backend_chose)
                    CHECK(strstr(got.res[i].error, cfgs[c].poison == 1 ? "NaN at token id 0 " : "+inf at") != NULL);
                continue;
            }
            CHECK_MSG(got.res[i].n == ref.res[i].n &&
                          memcmp(got.res[i].toks, ref.res[i].toks, sizeof(int32_t) * (size_t)ref.res[i].n) == 0,
                      "config %zu: request %d differs from the one-at-a-time run", c, i);
        }
        if (c == 3 || c == 5) CHECK_MSG(st.preemptions > 0, "the small pool was expected to force preemption");
        /* The greedy requests (odd ids) see no logits exactly when the
         * backend chose their tokens. */
        int greedy_tokens = 0;
        for (int i = 1; i < NREQ; i += 2) greedy_tokens += got.res[i].n;
        if (!cfgs[c].poison) CHECK_EQ_INT(got.no_logits, cfgs[c].argmax && !cfgs[c].want_logits ? greedy_tokens : 0);
        if (c == 2) CHECK(st.steps > st0.steps / 4);
    }
    for (int i = 0; i < NREQ; i++) kvb_free(prompts[i]);
    tok_free(T);
    model_free(M);
    return tu_finish();
}
