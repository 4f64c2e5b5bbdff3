/* sched_store.c — loads and spills of prompt blocks between the KV pool and
 * the persistent store, with the copies queued beside compute where the
 * backend can (see sched_store.h). */
#include "engine/sched_store.h"

#include <pthread.h>
#include <string.h>

#include "base/alloc.h"

#define MAX_LOAD 256  /* blocks of one load; also the load ring's size */
#define MAX_SPILL 256 /* spills queued between two hand-overs before one is forced */
/* Spill buffers in all: the spills of a step, those the store's writer is
 * encoding (a batch), and as many as its queue holds. Beyond: a miss. */
#define EXTRA_BUFS (MAX_SPILL + 64)

struct spill {
    struct pstore_key key, parent;
    bool has_parent;
    int32_t block; /* held until handed over */
    uint8_t *buf;  /* the block's bytes; lent to the store at hand-over */
    bool scored;   /* its prompt scores are in spill_scores, stored with it */
};

struct sstore {
    struct backend *be;
    struct kv_alloc *kv;
    struct pstore *ps;
    const struct pstore_model *pm;
    int32_t B;
    int64_t bb;    /* bytes of one block */
    bool async;    /* the backend queues copies */
    bool copies;   /* copies queued since the last wait */
    uint8_t *ring; /* load staging */
    int32_t cap_ring, ring_used;
    /* Spill buffers, one block each, lent to the store (pstore_put_borrowed)
     * instead of copied: a GPU's spills would otherwise cost the engine
     * thread a memcpy of every block. The store's writer hands them back. */
    pthread_mutex_t mu;  /* guards free_bufs / n_free */
    uint8_t **free_bufs; /* (max_bufs) */
    int32_t n_free, n_bufs, max_bufs;
    struct spill *spills;
    int32_t *spill_tok;          /* (cap_spill, B) */
    struct pscore *spill_scores; /* (cap_spill, B): a spill's prompt scores, when it has them */
    int32_t n_spill, cap_spill;
    enum kvb_status fail; /* a wait that failed outside sstore_after_step, reported there */
    struct kvb_err fail_err;
    int64_t spilled;
};

enum kvb_status sstore_create(struct backend *be, struct kv_alloc *kv, struct pstore *ps, const struct pstore_model *pm,
                              struct sstore **out)
{
    struct sstore *x = kvb_calloc(1, sizeof *x);
    if (!x) return KVB_ERR_NOMEM;
    x->be = be;
    x->kv = kv;
    x->ps = ps;
    x->pm = pm;
    x->B = be->block_size;
    x->bb = be->block_bytes;
    x->async = be->kv_read_async && be->kv_write_async && be->kv_copies_wait;
    const uint64_t queued = pstore_queue_bytes(ps) / (uint64_t)(x->bb > 0 ? x->bb : 1);
    x->max_bufs = (int32_t)(EXTRA_BUFS + (queued < 1000000 ? queued : 1000000));
    x->free_bufs = kvb_calloc((size_t)x->max_bufs, sizeof *x->free_bufs);
    if (!x->free_bufs || pthread_mutex_init(&x->mu, NULL) != 0) {
        kvb_free(x->free_bufs);
        kvb_free(x);
        return KVB_ERR_NOMEM;
    }
    *out = x;
    return KVB_OK;
}

/* The store's writer (or a put dropped at once) hands a buffer back. */
static void put_back(void *ctx, const void *buf)
{
    struct sstore *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->free_bufs[x->n_free++] = (uint8_t *)buf;
    pthread_mutex_unlock(&x->mu);
}

/* A spill buffer: a returned one, else a new one while under max_bufs. */
static uint8_t *get_buf(struct sstore *x)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&x->mu);
    if (x->n_free > 0) b = x->free_bufs[--x->n_free];
    pthread_mutex_unlock(&x->mu);
    if (!b && x->n_bufs < x->max_bufs && (b = be_host_alloc(x->be, (size_t)x->bb))) x->n_bufs++;
    return b;
}

static void wait_copies(struct sstore *x)
{
    if (!x->copies) return;
    x->copies = false;
    struct kvb_err e = {{0}};
    enum kvb_status st = x->be->kv_copies_wait(x->be, &e);
    if (st != KVB_OK && x->fail == KVB_OK) {
        x->fail = st;
        x->fail_err = e;
    }
}

static void release_spills(struct sstore *x)
{
    for (int32_t i = 0; i < x->n_spill; i++) {
        kv_window_drop(x->kv, x->spills[i].block);
        kv_unref(x->kv, x->spills[i].block);
        if (x->spills[i].buf) put_back(x, x->spills[i].buf);
    }
    x->n_spill = 0;
}

/* Everything queued lands; spilled blocks go to the store (unless a copy
 * failed: then their bytes are not to be trusted) and are released. */
static void finish(struct sstore *x)
{
    wait_copies(x);
    x->ring_used = 0;
    if (x->fail == KVB_OK)
        for (int32_t i = 0; i < x->n_spill; i++) {
            struct spill *sp = &x->spills[i];
            const struct pstore_annex an = {x->spill_scores + (int64_t)i * x->B, sizeof(struct pscore) * (size_t)x->B};
            pstore_put_borrowed_annex(x->ps, x->pm, &sp->key, sp->has_parent ? &sp->parent : NULL,
                                      x->spill_tok + (int64_t)i * x->B, sp->buf, sp->scored ? &an : NULL, put_back, x);
            sp->buf = NULL; /* the store's until it hands it back */
            x->spilled++;
        }
    release_spills(x);
}

void sstore_free(struct sstore *x)
{
    if (!x) return;
    wait_copies(x); /* no copy may still be landing in memory about to be freed */
    release_spills(x);
    pstore_flush(x->ps); /* every lent buffer comes back */
    for (int32_t i = 0; i < x->n_free; i++) be_host_free(x->be, x->free_bufs[i]);
    pthread_mutex_destroy(&x->mu);
    kvb_free(x->free_bufs);
    be_host_free(x->be, x->ring);
    kvb_free(x->spills);
    kvb_free(x->spill_tok);
    kvb_free(x->spill_scores);
    kvb_free(x);
}

/* The load ring comes from the backend (page-locked on a GPU, where
 * allocating is slow): grown by doubling up to MAX_LOAD blocks, so a run
 * allocates it a few times at most. The caller has made sure no copy uses
 * the old ring. need <= MAX_LOAD. */
static bool grow_ring(struct sstore *x, int32_t need)
{
    if (need <= x->cap_ring) return true;
    int32_t c = x->cap_ring * 2 > need ? x->cap_ring * 2 : need;
    if (c > MAX_LOAD) c = MAX_LOAD;
    uint8_t *nb = be_host_alloc(x->be, (size_t)x->bb * (size_t)c);
    if (!nb) return false;
    be_host_free(x->be, x->ring);
    x->ring = nb;
    x->cap_ring = c;
    return true;
}

int32_t sstore_load(struct sstore *x, const int32_t *tokens, const struct pstore_key *keys, int32_t from, int32_t n,
                    const int32_t *blocks, struct pscore *scores)
{
    if (n <= 0) return 0;
    if (n > MAX_LOAD) n = MAX_LOAD;
    if (x->ring_used + n > x->cap_ring) {
        /* Reusing the ring: what earlier loads queued from it must have landed. */
        wait_copies(x);
        x->ring_used = 0;
        /* Room for two loads of this size, so the next one overlaps this one's copies. */
        if (!grow_ring(x, 2 * n < MAX_LOAD ? 2 * n : MAX_LOAD)) return 0;
    }
    void *dst[MAX_LOAD];
    for (int32_t i = 0; i < n; i++) dst[i] = x->ring + (int64_t)(x->ring_used + i) * x->bb;
    int32_t got = 0;
    /* A store failure is a miss from where it happened: the blocks before
     * it were read and checked (and counted as loaded). */
    struct pstore_annex an[MAX_LOAD];
    for (int32_t i = 0; scores && i < n; i++)
        an[i] = (struct pstore_annex){scores + (int64_t)i * x->B, sizeof(struct pscore) * (size_t)x->B};
    pstore_load_chain_annex(x->ps, x->pm, tokens, keys, from, from + n, dst, scores ? an : NULL, &got, NULL);
    for (int32_t i = 0; i < got; i++) {
        enum kvb_status st = x->async ? x->be->kv_write_async(x->be, blocks[i], dst[i])
                                      : x->be->kv_block_write(x->be, blocks[i], dst[i]);
        if (st != KVB_OK) {
            got = i;
            break;
        }
    }
    if (x->async && got > 0) {
        x->copies = true;
        x->ring_used += n;
    }
    return got;
}

void sstore_spill(struct sstore *x, const int32_t *tokens, const struct pstore_key *keys, int32_t i, int32_t block,
                  const struct pscore *scores)
{
    if (pstore_contains_annex(x->ps, &keys[i], scores ? sizeof(struct pscore) * (size_t)x->B : 0)) return;
    if (x->n_spill == x->cap_spill) {
        /* Hand the queued spills over first: their staging is then free to
         * move, and the queue never outgrows MAX_SPILL. */
        finish(x);
        if (x->cap_spill < MAX_SPILL) {
            const int32_t c = x->cap_spill ? 2 * x->cap_spill : 32;
            struct spill *ns = kvb_realloc(x->spills, sizeof *ns * (size_t)c);
            if (ns) x->spills = ns;
            int32_t *nt = kvb_realloc(x->spill_tok, sizeof *nt * (size_t)c * (size_t)x->B);
            if (nt) x->spill_tok = nt;
            struct pscore *nc = kvb_realloc(x->spill_scores, sizeof *nc * (size_t)c * (size_t)x->B);
            if (nc) x->spill_scores = nc;
            if (ns && nt && nc) x->cap_spill = c;
        }
        if (x->n_spill == x->cap_spill) return; /* no memory: a miss next run, nothing worse */
    }
    /* A block the store's queue has no room for (counting the spills held
     * for it) would be dropped at hand-over: skip the copy and its buffer,
     * so staging stays within --cache-buffer. No buffer: every one is
     * queued in the store, which is behind; the same. */
    if (!pstore_put_admit(x->ps, x->pm, x->n_spill)) return;
    uint8_t *dst = get_buf(x);
    if (!dst) return;
    enum kvb_status st = x->async ? x->be->kv_read_async(x->be, block, dst) : x->be->kv_block_read(x->be, block, dst);
    if (st != KVB_OK) {
        put_back(x, dst);
        return;
    }
    x->copies |= x->async;
    kv_ref(x->kv, block); /* all its pages stay until the copy is done */
    kv_window_hold(x->kv, block);
    struct spill *sp = &x->spills[x->n_spill];
    sp->key = keys[i];
    sp->has_parent = i > 0;
    if (i > 0) sp->parent = keys[i - 1];
    sp->block = block;
    sp->buf = dst;
    sp->scored = scores != NULL;
    if (scores) memcpy(x->spill_scores + (int64_t)x->n_spill * x->B, scores, sizeof *scores * (size_t)x->B);
    memcpy(x->spill_tok + (int64_t)x->n_spill * x->B, tokens + (int64_t)i * x->B, sizeof(int32_t) * (size_t)x->B);
    x->n_spill++;
}

enum kvb_status sstore_after_step(struct sstore *x, struct kvb_err *err)
{
    finish(x);
    if (x->fail == KVB_OK) return KVB_OK;
    enum kvb_status st = x->fail;
    x->fail = KVB_OK;
    return kvb_errf(err, st, "persistent cache: block copies failed: %s", x->fail_err.msg);
}

bool sstore_pending(const struct sstore *x) { return x->copies || x->n_spill > 0; }
int64_t sstore_blocks_spilled(const struct sstore *x) { return x->spilled; }
