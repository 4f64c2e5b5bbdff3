/* scheduler.c — continuous batching over paged KV with radix prefix sharing
 * (see scheduler.h for the policy). One struct seq per request; `waiting` and
 * `running` are small arrays of pointers (bounded by the caller's look-ahead
 * window and max_batch), so linear scans are cheaper than anything clever. */
#include "engine/scheduler.h"
#include "base/clock.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/crashlog.h"
#include "engine/kv.h"
#include "engine/radix.h"
#include "engine/sched_store.h"

struct seq {
    uint64_t user_id;
    int32_t *tokens; /* prompt then generated */
    int32_t n_tokens, cap_tokens, n_prompt, max_tokens;
    int32_t n_computed; /* tokens whose K/V are in the blocks */
    int32_t *blocks;
    int32_t n_blocks, cap_blocks;
    int32_t w_lo;            /* paged KV: blocks [w_lo, n_blocks) are those whose window part q holds */
    int64_t kv_peak;         /* the most KV bytes q has held at once */
    int32_t n_new;           /* tokens fed in the current step */
    struct pstore_key *keys; /* (n_prompt / B) chain keys, when a store is attached */
    int32_t n_spilled;       /* prompt blocks already handed to (or found in) the store */
    int32_t store_tokens;
    int32_t cached_tokens;
    bool admitted_once;
    int32_t preemptions;     /* times preempted */
    int32_t restored_tokens; /* positions whose K/V those preemptions dropped */
    uint64_t admit_seq;      /* admission order, for choosing whom to preempt */
    struct sampler *smp;
    bool greedy_on_backend; /* the backend makes the choice (BE_LOGITS_ARGMAX) */
    double t_submit, t_admit, t_first, t_end;
    /* SCHED_SCORE_PROMPT */
    bool score;
    struct pscore *pscores;   /* (n_prompt): [t] the score of prompt token t */
    int32_t n_have;           /* pscores[0..n_have) are known (pscores[0]: none) */
    int32_t n_block_scored;   /* leading blocks whose scores are kept with the block */
    int32_t scored_cached;    /* scores taken from a cache at (first) admission */
    int32_t cow_at, cow_orig; /* blocks[cow_at] is a private copy of shared block cow_orig (held), for
                                 recomputing one position of it; -1: none */
};

struct sched {
    struct backend *be;
    int32_t n_vocab, B;
    int32_t W; /* paged KV (kv_paged): the windowed layers' window in positions; 0 otherwise */
    struct sched_opts o;
    struct sched_callbacks cb;
    struct kv_alloc *kv;
    struct radix *radix;
    struct seq **waiting, **running;
    int32_t n_waiting, cap_waiting, n_running;
    uint64_t admit_counter;
    float *logits;  /* (max_batch, n_vocab) */
    float *scratch; /* (n_scratch, n_vocab) sampler input, one row per sampling thread */
    int32_t n_scratch;
    int32_t *samp_row;  /* (max_batch) logits row of each batch entry, -1: none */
    int32_t *samp_tok;  /* (max_batch) its sampled token */
    int32_t *samp_amax; /* (max_batch) the backend's greedy choices (be_batch.argmax) */
    int32_t *samp_bad;  /* (max_batch) why the entry has no token: SAMP_* below */
    struct be_seq *bseqs;
    struct seq **bsrc; /* seq behind each be_seq */
    struct sched_stats st;
    struct pstore *ps; /* optional persistent store */
    const struct pstore_model *pm;
    struct sstore *io; /* the traffic with it */
    /* Prompt scores (SCHED_SCORE_PROMPT), kept with KV blocks: a block's
     * record is a function of the tokens up to its end, as its K/V are. */
    int32_t n_ids;            /* block ids: be->n_logical (with pages), else be->n_blocks */
    struct pscore **bscore;   /* (n_ids) B records each, allocated on first use */
    uint8_t *bscored;         /* (n_ids) bscore[id] holds the block's current tokens' scores */
    int32_t score_rows;       /* logits rows for scoring per step; 0 until a request scores */
    void *cow_stage;          /* host memory for copying one block (be_host_alloc) */
    struct score_task *tasks; /* (score_rows) the step's rows to score */
    int32_t n_tasks;
};

/* One logits row to turn into a prompt score. */
struct score_task {
    struct seq *q;
    int32_t row, t; /* the row (position t - 1) scores prompt token t */
};

/* Logits rows a step may give to scoring, beyond one row per sequence. */
#define SCORE_ROWS 128

static double now_s(void) { return kvb_clock_s(); }

static void seq_free(struct seq *q)
{
    if (!q) return;
    sampler_free(q->smp);
    kvb_free(q->pscores);
    kvb_free(q->keys);
    kvb_free(q->tokens);
    kvb_free(q->blocks);
    kvb_free(q);
}

/* kv.h's map callback: a block's pages, to the backend. */
static void tell_backend(void *arg, int32_t block, const int32_t *pages)
{
    struct backend *be = arg;
    be->kv_map(be, block, pages);
}

enum kvb_status sched_create(struct backend *be, int32_t n_vocab, const struct sched_opts *o,
                             const struct sched_callbacks *cb, struct sched **out, struct kvb_err *err)
{
    struct sched *s = kvb_calloc(1, sizeof *s);
    if (!s) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    s->be = be;
    s->n_vocab = n_vocab;
    s->B = be->block_size;
    s->o = *o;
    if (s->o.max_batch <= 0) s->o.max_batch = 128;
    if (s->o.max_step_tokens <= 0) s->o.max_step_tokens = 512;
    if (s->o.max_step_tokens < s->o.max_batch) s->o.max_step_tokens = s->o.max_batch;
    if (s->o.n_ctx <= 0) s->o.n_ctx = 2048;
    s->cb = *cb;
    int32_t mb = s->o.max_batch;
    const bool paged = be->n_groups > 1 && be->kv_map;
    s->W = paged ? be->window : 0;
    s->n_ids = paged ? be->n_logical : be->n_blocks;
    if ((paged ? kv_alloc_create_paged(be->n_logical, be->n_pages, be->n_groups, be->n_global_groups, tell_backend, be,
                                       &s->kv)
               : kv_alloc_create(be->n_blocks, &s->kv)) != KVB_OK ||
        radix_create(s->B, s->kv, &s->radix) != KVB_OK || !(s->running = kvb_calloc((size_t)mb, sizeof *s->running)) ||
        !(s->logits = kvb_malloc(sizeof(float) * (size_t)n_vocab * (size_t)mb)) ||
        !(s->scratch = kvb_malloc(sizeof(float) * (size_t)n_vocab * (size_t)(s->n_scratch = be_threads(be)))) ||
        !(s->samp_row = kvb_calloc((size_t)mb, sizeof *s->samp_row)) ||
        !(s->samp_tok = kvb_calloc((size_t)mb, sizeof *s->samp_tok)) ||
        !(s->samp_amax = kvb_calloc((size_t)mb, sizeof *s->samp_amax)) ||
        !(s->samp_bad = kvb_calloc((size_t)mb, sizeof *s->samp_bad)) ||
        !(s->bseqs = kvb_calloc((size_t)mb, sizeof *s->bseqs)) ||
        !(s->bsrc = kvb_calloc((size_t)mb, sizeof *s->bsrc)) ||
        !(s->bscore = kvb_calloc((size_t)s->n_ids, sizeof *s->bscore)) ||
        !(s->bscored = kvb_calloc((size_t)s->n_ids, sizeof *s->bscored))) {
        sched_free(s);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the scheduler");
    }
    /* A sequence at full context must fit in the pool by itself, or
     * preemption could never make room for it. */
    int32_t need = (s->o.n_ctx + s->B - 1) / s->B;
    if (paged) { /* in whole blocks' worth of pages: its global parts, and window parts for a window and a step */
        const int64_t win = (s->W + s->o.max_step_tokens + 2 * s->B - 1) / s->B;
        const int64_t pages = (int64_t)need * be->n_global_groups +
                              (win < need ? win : need) * (int64_t)(be->n_groups - be->n_global_groups);
        need = (int32_t)((pages + be->n_groups - 1) / be->n_groups);
    }
    if (need > be->n_blocks) {
        sched_free(s);
        return kvb_errf(err, KVB_ERR_RANGE,
                        "the KV pool holds %d blocks of %d tokens (%lld tokens) but one sequence may reach %d "
                        "tokens: raise --kv-mem or lower the context",
                        be->n_blocks, s->B, (long long)be->n_blocks * s->B, s->o.n_ctx);
    }
    *out = s;
    return KVB_OK;
}

void sched_free(struct sched *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_waiting; i++) seq_free(s->waiting[i]);
    for (int32_t i = 0; i < s->n_running; i++) seq_free(s->running[i]);
    kvb_free(s->waiting);
    kvb_free(s->running);
    kvb_free(s->logits);
    kvb_free(s->scratch);
    kvb_free(s->samp_row);
    kvb_free(s->samp_tok);
    kvb_free(s->samp_amax);
    kvb_free(s->samp_bad);
    kvb_free(s->bseqs);
    kvb_free(s->bsrc);
    for (int32_t i = 0; s->bscore && i < s->n_ids; i++) kvb_free(s->bscore[i]);
    kvb_free(s->bscore);
    kvb_free(s->bscored);
    kvb_free(s->tasks);
    if (s->cow_stage) be_host_free(s->be, s->cow_stage);
    sstore_free(s->io); /* before the allocator: it releases the blocks it holds */
    radix_free(s->radix);
    kv_alloc_free(s->kv);
    kvb_free(s);
}

enum kvb_status sched_set_store(struct sched *s, struct pstore *ps, const struct pstore_model *pm)
{
    if (!ps) return KVB_OK;
    KVB_FORWARD_IF_ERROR(sstore_create(s->be, s->kv, ps, pm, &s->io));
    s->ps = ps;
    s->pm = pm;
    return KVB_OK;
}

/* KV bytes q holds now: global parts of all its blocks, window parts of
 * those in its window (every part without pages). */
static int64_t seq_kv_bytes(const struct sched *s, const struct seq *q)
{
    const struct backend *be = s->be;
    if (!s->W) return (int64_t)q->n_blocks * be->block_bytes;
    return be->page_bytes * ((int64_t)q->n_blocks * be->n_global_groups +
                             (int64_t)(q->n_blocks - q->w_lo) * (be->n_groups - be->n_global_groups));
}

static void note_kv(struct sched *s, struct seq *q)
{
    const int64_t b = seq_kv_bytes(s, q);
    if (b > q->kv_peak) q->kv_peak = b;
    if (b > s->st.seq_kv_peak) {
        s->st.seq_kv_peak = b;
        s->st.seq_kv_peak_tokens = q->n_tokens;
    }
}

/* The first block whose window part a token at position pos reads: its
 * windowed layers attend positions > pos - W. */
static int32_t window_first(const struct sched *s, int32_t pos)
{
    if (!s->W) return 0;
    const int32_t lo = pos + 1 - s->W;
    return lo > 0 ? lo / s->B : 0;
}

/* q's window has moved on to its next position: the window parts of blocks
 * wholly behind it are no longer q's to hold (they go loose: kept for a
 * later request that extends the prefix there, until pages run short). */
static void window_advance(struct sched *s, struct seq *q)
{
    const int32_t first = window_first(s, q->n_computed);
    while (q->w_lo < first && q->w_lo < q->n_blocks) {
        if (q->w_lo == q->cow_at) kv_window_drop(s->kv, q->cow_orig);
        kv_window_drop(s->kv, q->blocks[q->w_lo++]);
    }
}

/* Of the m blocks q reuses from the tree ([0, m), referenced), the longest
 * prefix it can compute on from: where every block of the window of its
 * next position still has its window part. The rest is let go; the window
 * parts of the kept window are held. Returns the blocks kept. */
static int32_t window_trim(struct sched *s, struct seq *q, int32_t m)
{
    int32_t k = m;
    for (bool moved = s->W > 0; moved && k > 0;) {
        moved = false;
        for (int32_t j = k - 1; j >= window_first(s, k * s->B); j--)
            if (!kv_window(s->kv, q->blocks[j])) {
                k = j;
                moved = true;
                break;
            }
    }
    for (int32_t j = k; j < m; j++) kv_unref(s->kv, q->blocks[j]);
    q->w_lo = window_first(s, k * s->B);
    if (q->w_lo > k) q->w_lo = k;
    for (int32_t j = q->w_lo; j < k; j++) kv_window_hold(s->kv, q->blocks[j]);
    return k;
}

static enum kvb_status push_waiting(struct sched *s, struct seq *q)
{
    if (s->n_waiting == s->cap_waiting) {
        int32_t cap = s->cap_waiting ? s->cap_waiting * 2 : 64;
        struct seq **nw = kvb_realloc(s->waiting, sizeof *nw * (size_t)cap);
        if (!nw) return KVB_ERR_NOMEM;
        s->waiting = nw;
        s->cap_waiting = cap;
    }
    s->waiting[s->n_waiting++] = q;
    return KVB_OK;
}

/* Room for scoring: the logits buffer grows by SCORE_ROWS rows (once). */
static enum kvb_status scoring_ensure(struct sched *s)
{
    if (s->score_rows) return KVB_OK;
    const int32_t rows = SCORE_ROWS < s->o.max_step_tokens ? SCORE_ROWS : s->o.max_step_tokens;
    float *lg = kvb_realloc(s->logits, sizeof(float) * (size_t)s->n_vocab * (size_t)(s->o.max_batch + rows));
    if (!lg) return KVB_ERR_NOMEM;
    s->logits = lg;
    if (!(s->tasks = kvb_malloc(sizeof *s->tasks * (size_t)rows))) return KVB_ERR_NOMEM;
    s->score_rows = rows;
    return KVB_OK;
}

enum kvb_status sched_submit(struct sched *s, uint64_t user_id, const int32_t *prompt, int32_t n_prompt,
                             int32_t max_tokens, const struct sampler_params *sp, unsigned flags, struct kvb_err *err)
{
    const bool want_logits = flags & SCHED_WANT_LOGITS, score = flags & SCHED_SCORE_PROMPT;
    if (n_prompt <= 0) return kvb_errf(err, KVB_ERR_INVALID_ARG, "empty prompt");
    if (score && scoring_ensure(s) != KVB_OK) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for scoring");
    if (n_prompt >= s->o.n_ctx)
        return kvb_errf(err, KVB_ERR_RANGE, "prompt of %d tokens does not fit the context of %d", n_prompt, s->o.n_ctx);
    struct seq *q = kvb_calloc(1, sizeof *q);
    if (!q) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    int64_t cap = (int64_t)n_prompt + (max_tokens > 0 ? max_tokens : 0);
    if (cap > s->o.n_ctx) cap = s->o.n_ctx;
    q->user_id = user_id;
    q->cap_tokens = (int32_t)cap;
    q->tokens = kvb_malloc(sizeof(int32_t) * (size_t)cap);
    q->cap_blocks = (int32_t)((cap + s->B - 1) / s->B);
    q->blocks = kvb_malloc(sizeof(int32_t) * (size_t)q->cap_blocks);
    /* the sampler's own refusal (a constraint its recogniser cannot start) is said as such, not as memory */
    const enum kvb_status sst = q->tokens && q->blocks ? sampler_create(sp, s->n_vocab, &q->smp) : KVB_ERR_NOMEM;
    if (sst != KVB_OK || push_waiting(s, q) != KVB_OK) {
        seq_free(q);
        if (sst != KVB_OK && sst != KVB_ERR_NOMEM)
            return kvb_errf(err, sst, "the sampler could not start: %s", kvb_strerror(sst));
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    memcpy(q->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    q->n_tokens = q->n_prompt = n_prompt;
    q->cow_at = q->cow_orig = -1;
    if (score) {
        q->score = true;
        q->pscores = kvb_malloc(sizeof *q->pscores * (size_t)n_prompt);
        if (!q->pscores) { /* it is queued: take it back out */
            s->n_waiting--;
            seq_free(q);
            return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
        }
        pscore_none(&q->pscores[0]);
        q->n_have = 1;
    }
    if (s->ps && n_prompt >= s->B) {
        int32_t nk = n_prompt / s->B;
        q->keys = kvb_malloc(sizeof *q->keys * (size_t)nk);
        if (q->keys) pstore_chain_keys(s->pm, q->tokens, nk, q->keys); /* no keys: no store for q */
    }
    q->max_tokens = max_tokens < 0 ? 0 : max_tokens;
    q->greedy_on_backend = s->be->argmax && !want_logits && sampler_is_greedy(sp);
    q->t_submit = now_s();
    s->st.prompt_tokens += n_prompt;
    return KVB_OK;
}

static void info_of(const struct seq *q, struct sched_seq_info *info, const float *logits)
{
    *info = (struct sched_seq_info){
        .error = NULL,
        .user_id = q->user_id,
        .tokens = q->tokens,
        .n_prompt = q->n_prompt,
        .n_generated = q->n_tokens - q->n_prompt,
        .cached_tokens = q->cached_tokens,
        .store_tokens = q->store_tokens,
        .preemptions = q->preemptions,
        .restored_tokens = q->restored_tokens,
        .t_submit = q->t_submit,
        .t_admit = q->t_admit,
        .t_first_token = q->t_first,
        .t_end = q->t_end,
        .logits = logits,
        .prompt_scores = q->score ? q->pscores : NULL,
        .scored_tokens = q->scored_cached,
    };
}

/* Whether q's next chunk scores prompt tokens (its logits rows all come back). */
static bool seq_scoring(const struct seq *q) { return q->score && q->n_have < q->n_prompt; }

/* The positions q is to have computed: all its tokens, except for a request
 * that only scores its prompt, whose last token's row would score nothing. */
static int32_t seq_end(const struct seq *q) { return q->score && q->max_tokens == 0 ? q->n_prompt - 1 : q->n_tokens; }

static void release_blocks(struct sched *s, struct seq *q)
{
    for (int32_t i = q->w_lo; i < q->n_blocks; i++) kv_window_drop(s->kv, q->blocks[i]);
    if (q->cow_orig >= 0 && q->cow_at >= q->w_lo) kv_window_drop(s->kv, q->cow_orig);
    for (int32_t i = 0; i < q->n_blocks; i++) kv_unref(s->kv, q->blocks[i]);
    if (q->cow_orig >= 0) kv_unref(s->kv, q->cow_orig);
    q->cow_at = q->cow_orig = -1;
    q->n_blocks = 0;
    q->w_lo = 0;
    q->n_computed = 0;
    q->n_block_scored = 0;
}

static void remove_running(struct sched *s, int32_t idx)
{
    memmove(&s->running[idx], &s->running[idx + 1], sizeof *s->running * (size_t)(s->n_running - idx - 1));
    s->n_running--;
}

static void finish(struct sched *s, int32_t idx, enum sched_finish why, const char *error)
{
    struct seq *q = s->running[idx];
    q->t_end = now_s();
    struct sched_seq_info info;
    info_of(q, &info, NULL);
    info.error = error;
    release_blocks(s, q);
    remove_running(s, idx);
    if (s->cb.on_finish) s->cb.on_finish(s->cb.user, &info, why);
    seq_free(q);
}

/* Common prefix of two token arrays in whole blocks. */
static int32_t shared_blocks(const int32_t *a, int32_t na, const int32_t *b, int32_t nb, int32_t B)
{
    int32_t n = na < nb ? na : nb, k = 0;
    while ((k + 1) * B <= n && memcmp(a + (int64_t)k * B, b + (int64_t)k * B, sizeof(int32_t) * (size_t)B) == 0) k++;
    return k;
}

/* Whether a running prefill would give q more shared blocks than the cache
 * holds now: then q should wait for it. */
static bool better_to_wait(const struct sched *s, const struct seq *q, int32_t cached_blocks)
{
    for (int32_t i = 0; i < s->n_running; i++) {
        const struct seq *r = s->running[i];
        if (r->n_computed >= r->n_prompt) continue; /* its prompt blocks are all inserted */
        if (seq_scoring(q) && !r->score) continue;  /* its blocks would come without scores */
        if (shared_blocks(q->tokens, q->n_tokens - 1, r->tokens, r->n_prompt, s->B) > cached_blocks) return true;
    }
    return false;
}

static int32_t load_from_store(struct sched *s, struct seq *q, int32_t limit);

/* The whole blocks of q's prefix the tree could give it now: for a request
 * still to be scored, only those that carry scores (or that q's own scores
 * already cover). */
static int32_t cached_prefix(const struct sched *s, const struct seq *q)
{
    if (!seq_scoring(q)) return radix_peek(s->radix, q->tokens, q->n_tokens - 1);
    const int32_t want = q->n_prompt / s->B;
    int32_t *ids = want > 0 ? kvb_malloc(sizeof *ids * (size_t)want) : NULL;
    if (!ids) return 0;
    const int32_t n = radix_blocks(s->radix, q->tokens, want, ids);
    int32_t k = 0;
    while (k < n && (s->bscored[ids[k]] || (k + 1) * s->B <= q->n_have)) k++;
    kvb_free(ids);
    return k;
}

/* A free block, evicting a cached one if need be; -1 when none. Whatever
 * scores it held belonged to its old tokens. */
static int32_t take_block(struct sched *s)
{
    int32_t id = kv_take(s->kv);
    if (id < 0 && kv_evict_windows(s->kv, 1) > 0) id = kv_take(s->kv);
    if (id < 0 && radix_evict(s->radix, 1) > 0) id = kv_take(s->kv);
    if (id >= 0) s->bscored[id] = 0;
    return id;
}

/* Keeps q's block k's scores (from q->pscores) with the block. */
static void keep_block_scores(struct sched *s, struct seq *q, int32_t k)
{
    const int32_t id = q->blocks[k];
    if (s->bscored[id]) return;
    if (!s->bscore[id] && !(s->bscore[id] = kvb_malloc(sizeof(struct pscore) * (size_t)s->B))) return;
    memcpy(s->bscore[id], q->pscores + (int64_t)k * s->B, sizeof(struct pscore) * (size_t)s->B);
    s->bscored[id] = 1;
}

/* Where the prefix tree holds q's newly scored blocks (from block `first` on) in other
 * blocks (computed beside q by a request that did not score, so q could not
 * reuse them), the scores go to those too: they are the same tokens', and
 * the tree's blocks are the ones later requests find. */
static void share_scores(struct sched *s, const struct seq *q, int32_t first)
{
    int32_t *ids = kvb_malloc(sizeof *ids * (size_t)q->n_block_scored);
    if (!ids) return; /* sharing is an optimisation */
    const int32_t n = radix_blocks(s->radix, q->tokens, q->n_block_scored, ids);
    for (int32_t k = first; k < n; k++) {
        const int32_t id = ids[k];
        if (id == q->blocks[k] || s->bscored[id] || !s->bscored[q->blocks[k]]) continue;
        if (!s->bscore[id] && !(s->bscore[id] = kvb_malloc(sizeof(struct pscore) * (size_t)s->B))) continue;
        memcpy(s->bscore[id], s->bscore[q->blocks[k]], sizeof(struct pscore) * (size_t)s->B);
        s->bscored[id] = 1;
    }
    kvb_free(ids);
}

/* Replaces q's last block, a shared one, by a private copy of it, so that
 * its last position can be computed again (for the logits row that scores
 * the token after it) without writing into a block others read. The shared
 * block stays held and comes back once that position is done
 * (cow_restore): the copy's bytes are the same, and the prefix tree knows
 * the original. False when no block or memory could be had. */
static bool cow_last(struct sched *s, struct seq *q)
{
    const int32_t k = q->n_blocks - 1, orig = q->blocks[k];
    if (!s->cow_stage && !(s->cow_stage = be_host_alloc(s->be, (size_t)s->be->block_bytes))) return false;
    const int32_t id = take_block(s);
    if (id < 0) return false;
    struct kvb_err err;
    /* Loads from the store may still be landing in orig (queued copies). */
    if ((s->be->kv_copies_wait && s->be->kv_copies_wait(s->be, &err) != KVB_OK) ||
        s->be->kv_block_read(s->be, orig, s->cow_stage) != KVB_OK ||
        s->be->kv_block_write(s->be, id, s->cow_stage) != KVB_OK) {
        kv_unref(s->kv, id);
        return false;
    }
    q->blocks[k] = id;
    q->cow_at = k;
    q->cow_orig = orig;
    return true;
}

/* Puts the shared block back in place of q's copy once the position it was
 * copied for has been computed. */
static void cow_restore(struct sched *s, struct seq *q)
{
    if (q->cow_orig < 0) return;
    if (q->cow_at >= q->w_lo) kv_window_drop(s->kv, q->blocks[q->cow_at]);
    kv_unref(s->kv, q->blocks[q->cow_at]);
    q->blocks[q->cow_at] = q->cow_orig;
    q->cow_at = q->cow_orig = -1;
}

/* Admission of a scoring request whose prompt scores are not all known:
 * the reused prefix ends at the first block without them (a block q's own
 * scores already cover is fine); scores of the reused blocks are copied to
 * q. Then where to compute from: the first unscored token t needs the
 * logits of position t - 1, so when the reused prefix ends exactly at t,
 * its last position is computed again, in a private copy of its block.
 * Returns the blocks reused from the prefix tree. */
static int32_t admit_scoring(struct sched *s, struct seq *q, int32_t *loaded)
{
    const int32_t B = s->B;
    int32_t m = radix_match(s->radix, q->tokens, q->n_prompt, q->blocks, q->cap_blocks);
    for (int32_t k = 0; k < m; k++)
        if (!s->bscored[q->blocks[k]] && (k + 1) * B > q->n_have) {
            for (int32_t j = k; j < m; j++) kv_unref(s->kv, q->blocks[j]);
            m = k;
            break;
        }
    m = window_trim(s, q, m);
    q->n_blocks = m;
    *loaded = load_from_store(s, q, q->n_prompt);
    for (int32_t k = 0; k < q->n_blocks; k++) {
        if ((k + 1) * B <= q->n_have) continue;
        memcpy(q->pscores + (int64_t)k * B, s->bscore[q->blocks[k]], sizeof(struct pscore) * (size_t)B);
        q->n_have = (k + 1) * B;
        if (!q->admitted_once) {
            q->scored_cached += B - (k == 0);
            s->st.scored_cached += B - (k == 0);
        }
    }
    if (q->n_have > q->n_prompt) q->n_have = q->n_prompt;
    const int32_t hit = q->n_blocks * B;
    q->n_computed = hit;
    /* the row of position hit - 1 is wanted: for the score of token hit, or
     * (all scores known, a fresh request that generates) to sample from */
    const bool want_row =
        hit > 0 && hit >= q->n_have && (hit < q->n_prompt || (hit == q->n_tokens && q->max_tokens > 0));
    if (want_row) {
        /* The copy is a block beyond q's own, held while its shared original
         * is too: only when the pool still holds q at its longest beside it,
         * so that preempting every other sequence always makes room for q
         * (the bound sched_create checks for one sequence). */
        if (q->cap_blocks + 1 <= s->be->n_blocks && cow_last(s, q)) {
            q->n_computed = hit - 1;
        } else { /* compute the whole block again instead */
            if (q->n_blocks - 1 >= q->w_lo) kv_window_drop(s->kv, q->blocks[q->n_blocks - 1]);
            kv_unref(s->kv, q->blocks[--q->n_blocks]);
            if (q->w_lo > q->n_blocks) q->w_lo = q->n_blocks;
            q->n_computed = q->n_blocks * B;
        }
    }
    q->n_block_scored = 0;
    return m < q->n_blocks ? m : q->n_blocks; /* a block given up for want of a copy was not reused */
}

static void admit(struct sched *s)
{
    if (s->n_running >= s->o.max_batch || s->n_waiting == 0) return;
    /* Score every waiting request once per step by its cached prefix. */
    int32_t *score = kvb_malloc(sizeof(int32_t) * (size_t)s->n_waiting);
    if (!score) return; /* try again next step */
    for (int32_t i = 0; i < s->n_waiting; i++) score[i] = cached_prefix(s, s->waiting[i]);
    while (s->n_running < s->o.max_batch) {
        int32_t best = -1;
        for (int32_t i = 0; i < s->n_waiting; i++) {
            if (score[i] < 0) continue;
            if (best >= 0 && score[i] <= score[best]) continue; /* ties: earliest submitted */
            if (better_to_wait(s, s->waiting[i], score[i])) continue;
            best = i;
        }
        if (best < 0) break;
        struct seq *q = s->waiting[best];
        /* Memory check: the blocks its prompt still needs must exist as free
         * or evictable blocks, or admitting it would only cause preemption. */
        int32_t need = (q->n_tokens + s->B - 1) / s->B - score[best];
        int32_t avail = kv_n_free(s->kv) + radix_n_cached(s->radix);
        if (s->W) { /* window parts: loose ones are taken back; a long prompt holds a window's worth */
            const struct backend *be = s->be;
            const int32_t nw = be->n_groups - be->n_global_groups, win = (s->W + s->o.max_step_tokens) / s->B + 2;
            avail += (int32_t)((int64_t)kv_n_loose(s->kv) * nw / be->n_groups);
            if (need > win)
                need = (int32_t)(((int64_t)need * be->n_global_groups + (int64_t)win * nw) / be->n_groups + 1);
        }
        if (need > avail && s->n_running > 0) break;
        memmove(&s->waiting[best], &s->waiting[best + 1], sizeof *s->waiting * (size_t)(s->n_waiting - best - 1));
        memmove(&score[best], &score[best + 1], sizeof *score * (size_t)(s->n_waiting - best - 1));
        s->n_waiting--;
        /* Reuse cached blocks, always leaving at least one token to compute
         * so the step yields logits. */
        int32_t m, loaded;
        if (q->score && q->n_have < q->n_prompt) {
            m = admit_scoring(s, q, &loaded);
        } else {
            m = radix_match(s->radix, q->tokens, q->n_tokens - 1, q->blocks, q->cap_blocks);
            m = window_trim(s, q, m);
            q->n_blocks = m;
            loaded = load_from_store(s, q, q->n_tokens - 1);
            q->n_computed = q->n_blocks * s->B;
        }
        window_advance(s, q); /* what was loaded beyond the window goes loose */
        note_kv(s, q);
        if (q->n_spilled < q->n_blocks) q->n_spilled = q->n_blocks;
        if (!q->admitted_once) {
            q->cached_tokens = m * s->B;
            q->store_tokens = loaded * s->B;
            q->t_admit = now_s();
            q->admitted_once = true;
            s->st.cached_tokens += q->cached_tokens;
            s->st.store_tokens += q->store_tokens;
        }
        q->admit_seq = ++s->admit_counter;
        s->running[s->n_running++] = q;
        if (q->max_tokens == 0 && (!q->score || q->n_have >= q->n_prompt))
            finish(s, s->n_running - 1, SCHED_FINISH_LENGTH, NULL);
    }
    kvb_free(score);
}

/* Loads the prompt blocks after the q->n_blocks the prefix tree gave, as
 * far as the store has them within the first `limit` tokens, into fresh KV
 * blocks, and shares them through the tree. A scoring request that still
 * needs scores takes only blocks stored with theirs. Returns blocks loaded. */
static int32_t load_from_store(struct sched *s, struct seq *q, int32_t limit)
{
    if (!s->ps || !q->keys) return 0;
    const int32_t from = q->n_blocks;
    int32_t want = limit / s->B;
    if (want > q->n_prompt / s->B) want = q->n_prompt / s->B; /* only prompt blocks are stored */
    if (want - from > 256) want = from + 256; /* one load's worth; the rest next admission or computed */
    if (want <= from) return 0;
    /* Blocks to land in; eviction of cached blocks is fine, preemption is not
     * worth it for an optimisation. */
    int32_t got = 0;
    while (from + got < want) {
        int32_t id = take_block(s);
        if (id < 0) break;
        q->blocks[from + got++] = id;
    }
    const bool scored = q->score && q->n_have < q->n_prompt;
    struct pscore *sc = NULL;
    if (scored) {
        for (int32_t i = 0; i < got; i++) {
            const int32_t id = q->blocks[from + i];
            if (!s->bscore[id] && !(s->bscore[id] = kvb_malloc(sizeof(struct pscore) * (size_t)s->B))) {
                for (int32_t j = i; j < got; j++) kv_unref(s->kv, q->blocks[from + j]);
                got = i;
                break;
            }
        }
        sc = kvb_malloc(sizeof *sc * (size_t)s->B * (size_t)(got ? got : 1));
        if (!sc) {
            for (int32_t i = 0; i < got; i++) kv_unref(s->kv, q->blocks[from + i]);
            return 0;
        }
    }
    const double t0 = now_s();
    const int32_t n_loaded = sstore_load(s->io, q->tokens, q->keys, from, got, q->blocks + from, sc);
    for (int32_t i = 0; sc && i < n_loaded; i++) {
        const int32_t id = q->blocks[from + i];
        memcpy(s->bscore[id], sc + (int64_t)i * s->B, sizeof *sc * (size_t)s->B);
        s->bscored[id] = 1;
    }
    kvb_free(sc);
    s->st.store_load_s += now_s() - t0;
    for (int32_t i = n_loaded; i < got; i++) kv_unref(s->kv, q->blocks[from + i]);
    q->n_blocks = from + n_loaded;
    if (n_loaded > 0) radix_insert(s->radix, q->tokens, q->n_blocks, q->blocks);
    return n_loaded;
}

/* Hands q's newly computed full prompt blocks to the store. */
static void spill_to_store(struct sched *s, struct seq *q)
{
    if (!s->ps || !q->keys) return;
    int32_t full = (q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt) / s->B;
    for (int32_t i = q->n_spilled; i < full; i++) {
        const int32_t id = q->blocks[i];
        sstore_spill(s->io, q->tokens, q->keys, i, id, q->score && s->bscored[id] ? s->bscore[id] : NULL);
    }
    if (full > q->n_spilled) q->n_spilled = full;
}

/* Puts the most recently admitted running sequence back to waiting. */
static void preempt_youngest(struct sched *s)
{
    int32_t y = 0;
    for (int32_t i = 1; i < s->n_running; i++)
        if (s->running[i]->admit_seq > s->running[y]->admit_seq) y = i;
    struct seq *q = s->running[y];
    q->preemptions++;
    q->restored_tokens += q->n_computed;
    release_blocks(s, q);
    remove_running(s, y);
    if (push_waiting(s, q) != KVB_OK) {
        /* Cannot requeue: end it rather than lose track of it. */
        q->t_end = now_s();
        struct sched_seq_info info;
        info_of(q, &info, NULL);
        info.error = "out of memory: a preempted sequence could not be queued again";
        if (s->cb.on_finish) s->cb.on_finish(s->cb.user, &info, SCHED_FINISH_ERROR);
        seq_free(q);
    }
    s->st.preemptions++;
}

/* Gives q blocks up to position `end`; false when the pool cannot, even
 * after eviction (the caller then preempts). */
static bool grow_blocks(struct sched *s, struct seq *q, int32_t end)
{
    int32_t need = (end + s->B - 1) / s->B;
    while (q->n_blocks < need) {
        int32_t id = take_block(s);
        if (id < 0) return false;
        q->blocks[q->n_blocks++] = id;
    }
    note_kv(s, q);
    return true;
}

static int seq_order(const struct seq *a, const struct seq *b) { return a->admit_seq < b->admit_seq ? -1 : 1; }

static void score_worker(void *arg, int ith, int nth)
{
    struct sched *s = arg;
    for (int32_t i = ith; i < s->n_tasks; i += nth) {
        const struct score_task *t = &s->tasks[i];
        const float *row = s->logits + (int64_t)t->row * s->n_vocab;
        if (sampler_first_nonfinite(row, s->n_vocab) >= 0) {
            t->q->pscores[t->t].rank = -1;
            continue;
        }
        pscore_of(row, s->n_vocab, t->q->tokens[t->t], &t->q->pscores[t->t]);
    }
}

/* After a scoring chunk's forward pass: what q's rows scored. False when a
 * row was not finite (q must end in error). */
static bool after_scoring(struct sched *s, struct seq *q, int32_t pos)
{
    int32_t upto = pos + q->n_new + 1; /* rows pos..pos+n_new-1 scored tokens up to pos+n_new */
    if (upto > q->n_prompt) upto = q->n_prompt;
    for (int32_t t = q->n_have; t < upto; t++)
        if (q->pscores[t].rank < 0) return false;
    if (upto > q->n_have) {
        s->st.scored_tokens += upto - q->n_have;
        q->n_have = upto;
    }
    return true;
}

/* After any forward pass of a scoring request: its full computed prompt
 * blocks whose scores are all known go with the block (and to the tree's
 * blocks of the same tokens, share_scores). Also after chunks that score
 * nothing: the scores can be complete before the prompt's last position is
 * computed (a chunk ending at n_prompt - 1 scores up to the last token),
 * and that position completes the last block. */
static void keep_scored_blocks(struct sched *s, struct seq *q)
{
    const int32_t lim = q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt, first = q->n_block_scored;
    while ((q->n_block_scored + 1) * s->B <= lim && (q->n_block_scored + 1) * s->B <= q->n_have)
        keep_block_scores(s, q, q->n_block_scored++);
    if (q->n_block_scored > first) share_scores(s, q, first);
}

/* samp_row of a batch entry whose token the backend chose (BE_LOGITS_ARGMAX). */
#define ROW_ON_BACKEND (-2)

/* samp_bad: why a batch entry that was to be sampled has no token. Such a
 * sequence ends with SCHED_FINISH_ERROR rather than with a made-up token:
 * a model whose logits are NaN must not pass for one that said nothing. */
enum { SAMP_OK = 0, SAMP_NONFINITE, SAMP_NO_CHOICE, SAMP_FAILED };

/* Samples the batch entries whose logits came back, each with its own
 * sampler (its own seed and history), so which thread samples which entry
 * cannot change a token. Thread ith uses scratch row ith: the sampler
 * rewrites its input, and the logits must stay as they were for logprobs. */
struct sample_job {
    struct sched *s;
    int32_t nb;
};

static void sample_worker(void *arg, int ith, int nth)
{
    struct sample_job *j = arg;
    struct sched *s = j->s;
    const int n = nth < s->n_scratch ? nth : s->n_scratch; /* threads that have a scratch row */
    if (ith >= n) return;
    float *scratch = s->scratch + (int64_t)ith * s->n_vocab;
    for (int32_t b = ith; b < j->nb; b += n) {
        if (s->samp_row[b] < 0) continue;
        const float *row = s->logits + (int64_t)s->samp_row[b] * s->n_vocab;
        crashlog_mark_uid(s->bsrc[b]->user_id); /* a crash in the sampler is this sequence's */
        s->samp_bad[b] = SAMP_OK;
        if (sampler_first_nonfinite(row, s->n_vocab) >= 0) {
            s->samp_bad[b] = SAMP_NONFINITE;
            continue;
        }
        memcpy(scratch, row, sizeof(float) * (size_t)s->n_vocab);
        if (sampler_sample(s->bsrc[b]->smp, scratch, &s->samp_tok[b]) != KVB_OK) s->samp_bad[b] = SAMP_FAILED;
    }
    crashlog_mark_uid(UINT64_MAX);
}

/* The message for a batch entry that got no token (samp_bad). */
static void sample_failure(const struct sched *s, int32_t b, const float *row, char *out, size_t cap)
{
    switch (s->samp_bad[b]) {
    case SAMP_NONFINITE: {
        const int32_t at = sampler_first_nonfinite(row, s->n_vocab);
        const float v = row[at];
        snprintf(out, cap,
                 "the model's logits are not finite (%s at token id %d of %d): the model's weights or "
                 "the backend are broken",
                 isnan(v) ? "NaN"
                 : v > 0  ? "+inf"
                          : "-inf",
                 at, s->n_vocab);
        break;
    }
    case SAMP_NO_CHOICE:
        snprintf(out, cap,
                 "the backend found no token to choose (every logit NaN or -inf): the model's weights or "
                 "the backend are broken");
        break;
    default: snprintf(out, cap, "the sampler failed (out of memory, or no token it may choose)"); break;
    }
}

/* Orders the running sequences (oldest first: they are closest to
 * finishing and their memory is sunk) and gives each its tokens for this
 * step, decodes first (one token each), then prefill chunks, under the
 * step's token budget and scoring rows; preempts when blocks run out. */
static enum kvb_status pack_step(struct sched *s, struct kvb_err *err)
{
    for (int32_t i = 1; i < s->n_running; i++)
        for (int32_t j = i; j > 0 && seq_order(s->running[j], s->running[j - 1]) < 0; j--) {
            struct seq *t = s->running[j];
            s->running[j] = s->running[j - 1];
            s->running[j - 1] = t;
        }

    /* Decodes first (one token each), then prefill chunks, under the budget. */
    int32_t budget = s->o.max_step_tokens, score_left = s->score_rows;
    for (int32_t i = 0; i < s->n_running; i++) s->running[i]->n_new = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
            struct seq *q = s->running[i];
            int32_t left = seq_end(q) - q->n_computed;
            bool decode = left == 1;
            if ((pass == 0) != decode || q->n_new || left <= 0) continue;
            int32_t take = left < budget ? left : budget;
            if (seq_scoring(q)) { /* every row comes back: they share a bound of their own */
                if (score_left == 0) continue;
                if (take > score_left) take = score_left;
            }
            while (!grow_blocks(s, q, q->n_computed + take)) {
                /* Spills not yet handed to the store hold their blocks: hand
                 * them over before taking anything from a sequence. */
                if (s->io && sstore_pending(s->io)) {
                    KVB_FORWARD_IF_ERROR(sstore_after_step(s->io, err));
                    continue;
                }
                /* Out of blocks: preempt the youngest; if that is q itself, stop. */
                struct seq *victim = s->running[0];
                for (int32_t k = 1; k < s->n_running; k++)
                    if (s->running[k]->admit_seq > victim->admit_seq) victim = s->running[k];
                bool self = victim == q;
                if (s->n_running == 1) return kvb_errf(err, KVB_ERR_INTERNAL, "KV pool too small for one sequence");
                preempt_youngest(s);
                if (self) {
                    take = 0;
                    break;
                }
                /* running[] shifted: find q again */
                for (i = 0; i < s->n_running && s->running[i] != q; i++) {}
            }
            if (take == 0) {
                i = s->n_running;
                break;
            }
            q->n_new = take;
            budget -= take;
            if (seq_scoring(q)) score_left -= take;
        }
    }

    return KVB_OK;
}

/* The forward pass's batch from what pack_step gave; its length. */
static int32_t batch_of_step(struct sched *s)
{
    int32_t nb = 0;
    for (int32_t i = 0; i < s->n_running; i++) {
        struct seq *q = s->running[i];
        if (!q->n_new) continue;
        bool last = q->n_computed + q->n_new == q->n_tokens;
        s->bseqs[nb] = (struct be_seq){
            .tokens = q->tokens + q->n_computed,
            .n_tokens = q->n_new,
            .pos = q->n_computed,
            .block_table = q->blocks,
            .n_blocks = q->n_blocks,
            .logits = seq_scoring(q)         ? BE_LOGITS_ALL
                      : !last                ? BE_LOGITS_NONE
                      : q->greedy_on_backend ? BE_LOGITS_ARGMAX
                                             : BE_LOGITS_LAST,
        };
        s->bsrc[nb++] = q;
        if (q->n_new > 1 || q->n_computed < q->n_prompt) s->st.prefill_computed += q->n_new;
        else s->st.decode_tokens += 1;
    }
    return nb;
}

/* Where each batch entry's logits rows are (samp_row), and the rows that
 * score prompt tokens (s->tasks); the rows sampled from. */
static int32_t rows_of_step(struct sched *s, int32_t nb)
{
    int32_t row = 0;
    s->n_tasks = 0;
    for (int32_t b = 0; b < nb; b++) {
        if (s->bseqs[b].logits == BE_LOGITS_ALL) { /* a scoring chunk: every row scores the token after it */
            struct seq *q = s->bsrc[b];
            for (int32_t j = 0; j < q->n_new; j++)
                if (q->n_computed + j + 1 < q->n_prompt)
                    s->tasks[s->n_tasks++] = (struct score_task){q, row + j, q->n_computed + j + 1};
            row += q->n_new;
            s->samp_row[b] = q->n_computed + q->n_new == q->n_tokens ? row - 1 : -1;
            s->samp_bad[b] = SAMP_OK;
            continue;
        }
        s->samp_row[b] = s->bseqs[b].logits == BE_LOGITS_LAST ? row++ : -1;
        s->samp_bad[b] = SAMP_OK;
        if (s->bseqs[b].logits != BE_LOGITS_ARGMAX) continue;
        s->samp_row[b] = ROW_ON_BACKEND;
        s->samp_tok[b] = s->samp_amax[b];
        if (s->samp_amax[b] < 0 || s->samp_amax[b] >= s->n_vocab) s->samp_bad[b] = SAMP_NO_CHOICE;
    }
    return row;
}

/* After the pass: each sequence's new tokens counted, its scores kept, its
 * full blocks shared and spilled, its sampled token accepted or its end. */
static void after_step(struct sched *s, int32_t nb)
{
    for (int32_t b = 0; b < nb; b++) {
        struct seq *q = s->bsrc[b];
        const int32_t pos = q->n_computed;
        q->n_computed += q->n_new;
        cow_restore(s, q); /* before the tree sees q's blocks: it knows the original */
        if (s->bseqs[b].logits == BE_LOGITS_ALL && !after_scoring(s, q, pos)) {
            int32_t idx = 0;
            while (s->running[idx] != q) idx++;
            finish(s, idx, SCHED_FINISH_ERROR,
                   "the model's logits are not finite while scoring the prompt: the "
                   "model's weights or the backend are broken");
            continue;
        }
        if (q->score) keep_scored_blocks(s, q); /* before the store gets them */
        int32_t full = q->n_computed / s->B;
        if (full > 0 && radix_insert(s->radix, q->tokens, full, q->blocks) != KVB_OK) {
            /* Sharing is an optimisation: carry on without it. */
        }
        spill_to_store(s, q);
        window_advance(s, q);
        if (q->score && q->max_tokens == 0 && q->n_computed >= seq_end(q)) { /* scored: nothing to generate */
            int32_t idx = 0;
            while (s->running[idx] != q) idx++;
            finish(s, idx, SCHED_FINISH_LENGTH, NULL);
            continue;
        }
        if (s->samp_row[b] == -1) continue;
        const float *lg = s->samp_row[b] >= 0 ? s->logits + (int64_t)s->samp_row[b] * s->n_vocab : NULL;
        if (s->samp_bad[b] != SAMP_OK) {
            char why[160];
            sample_failure(s, b, lg, why, sizeof why);
            int32_t idx = 0;
            while (s->running[idx] != q) idx++;
            finish(s, idx, SCHED_FINISH_ERROR, why);
            continue;
        }
        const int32_t tok = s->samp_tok[b];
        sampler_accept(q->smp, tok);
        q->tokens[q->n_tokens++] = tok;
        if (q->n_tokens - q->n_prompt == 1) q->t_first = now_s();
        struct sched_seq_info info;
        info_of(q, &info, lg);
        bool stop = s->cb.on_token && s->cb.on_token(s->cb.user, &info, tok);
        int32_t idx = 0;
        while (s->running[idx] != q) idx++;
        if (stop) finish(s, idx, SCHED_FINISH_STOP, NULL);
        else if (q->n_tokens - q->n_prompt >= q->max_tokens || q->n_tokens >= q->cap_tokens)
            finish(s, idx, SCHED_FINISH_LENGTH, NULL);
    }
}

enum kvb_status sched_step(struct sched *s, struct kvb_err *err)
{
    admit(s);
    if (s->n_running == 0) return s->io ? sstore_after_step(s->io, err) : KVB_OK;
    KVB_FORWARD_IF_ERROR(pack_step(s, err));
    const int32_t nb = batch_of_step(s);
    if (nb == 0) return KVB_OK;
    struct be_batch batch = {s->bseqs, nb, s->samp_amax};
    KVB_FORWARD_IF_ERROR(s->be->forward(s->be, &batch, s->logits, err));
    s->st.steps++;
    /* The previous step's spills were copied out during this pass. */
    if (s->io) KVB_FORWARD_IF_ERROR(sstore_after_step(s->io, err));

    const int32_t row = rows_of_step(s, nb);
    if (s->n_tasks > 0) {
        if (s->be->host_parallel && s->n_tasks > 1) s->be->host_parallel(s->be, score_worker, s);
        else score_worker(s, 0, 1);
    }
    struct sample_job job = {s, nb};
    if (s->be->host_parallel && row > 1) s->be->host_parallel(s->be, sample_worker, &job);
    else sample_worker(&job, 0, 1);

    after_step(s, nb);
    /* Nothing left to overlap the spills with: hand them over now, so that
     * an idle scheduler has nothing in flight. */
    if (s->n_running == 0 && s->io) return sstore_after_step(s->io, err);
    return KVB_OK;
}

bool sched_idle(const struct sched *s) { return s->n_waiting == 0 && s->n_running == 0; }
void sched_get_stats(const struct sched *s, struct sched_stats *out)
{
    *out = s->st;
    if (s->io) out->store_blocks_spilled = sstore_blocks_spilled(s->io);
    out->running = s->n_running;
    out->waiting = s->n_waiting;
}
