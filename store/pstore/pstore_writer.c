/* pstore_writer.c — the thread that turns queued puts into LMDB writes, so
 * that the engine never waits on compression or on the disk.
 *
 * One wake-up = one batch: up to WRITER_BATCH puts (it waits up to
 * WRITER_LINGER_MS for a batch to fill, TOUCH_LINGER_MS when only LRU
 * touches are queued, unless a flush or close is waiting), plus every
 * queued touch and damaged-value removal. The batch is compressed outside
 * any transaction (after a read transaction has skipped the keys already
 * present), then written in ONE write transaction, because a commit costs
 * an fsync and holds LMDB's single-writer lock that other processes sharing
 * the directory wait on. The writer compresses with a small pool of its own
 * (opts.n_threads) so that it keeps up with a fast prefill; the engine
 * thread never compresses. After a commit that leaves the store over its
 * cap, GC trims it to 9/10 of the cap, so that it does not run again for
 * the next handful of puts.
 *
 * Any write failure (map full, disk full, I/O error, ...) aborts the batch
 * and turns writing off for the rest of the process with one warning:
 * retrying every batch against a full disk would only slow the job down. */
#include <errno.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "base/tpool.h"
#include "store/pstore/pstore_internal.h"

#define WRITER_BATCH 64
#define WRITER_LINGER_MS 50
#define TOUCH_LINGER_MS 1000
#define GC_TRIM_NUM 9 /* GC trims to 9/10 of the cap */
#define GC_TRIM_DEN 10
#define GC_MAX_PER_TXN 20000u

/* A queued put is the writer's from the moment it is queued: this frees it
 * (handing borrowed data back) wherever it ends, written, dropped or left
 * at close. */
void pstore_item_free(struct pstore_put_item *it)
{
    if (!it) return;
    if (it->release) it->release(it->release_ctx, it->data);
    kvb_free(it);
}

/* ---- queues (engine side, mu held) ------------------------------------------------ */

void pstore_queue_touch_locked(struct pstore *ps, const struct pstore_key *key)
{
    if (ps->stats.writing_disabled) return;
    if (ps->n_touches == ps->cap_touches) {
        /* A lost touch only makes LRU slightly less exact: drop, never block. */
        if (ps->cap_touches >= PSTORE_TOUCH_MAX) return;
        size_t nc = ps->cap_touches ? 2 * ps->cap_touches : 64;
        struct pstore_key *p = kvb_realloc(ps->touches, nc * sizeof *p);
        if (!p) return;
        ps->touches = p;
        ps->cap_touches = nc;
    }
    ps->touches[ps->n_touches++] = *key;
}

void pstore_queue_damage_locked(struct pstore *ps, const struct pstore_key *key, uint64_t hash, size_t len)
{
    if (ps->stats.writing_disabled) return;
    for (size_t i = 0; i < ps->n_damage; i++)
        if (!memcmp(ps->damage[i].key.b, key->b, 16)) return;
    if (ps->n_damage == ps->cap_damage) {
        /* Left behind, it is found again by the next load or by verify. */
        if (ps->cap_damage >= PSTORE_DAMAGE_MAX) return;
        size_t nc = ps->cap_damage ? 2 * ps->cap_damage : 8;
        struct pstore_damage *p = kvb_realloc(ps->damage, nc * sizeof *p);
        if (!p) return;
        ps->damage = p;
        ps->cap_damage = nc;
    }
    ps->damage[ps->n_damage++] = (struct pstore_damage){*key, hash, len};
}

/* A full disk can come back as EIO from LMDB's writes (tmpfs does): say so
 * when the cache's filesystem has next to nothing left. */
static bool disk_nearly_full(const char *dir)
{
    struct statvfs vfs;
    return statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize < ((uint64_t)16 << 20);
}

void pstore_disable_writing_locked(struct pstore *ps, int rc, const char *what)
{
    ps->stats.writing_disabled = true;
    const bool full = rc == ENOSPC || rc == EDQUOT || (rc == EIO && disk_nearly_full(ps->dir));
    const char *hint = rc == MDB_MAP_FULL ? "; lower --cache-max-size, or trim with `kvbatch cache gc`"
                       : full             ? "; the disk is full: free space or lower --cache-max-size"
                       : rc == ENOMEM     ? "; the machine is short of memory (or the cache file is damaged: `kvbatch "
                                            "cache verify` checks it)"
                       : *pstore_lmdb_hint(rc) ? "; the cache file looks damaged: `kvbatch cache verify` checks it, "
                                                 "and the next `kvbatch run` moves a damaged file aside"
                                               : "";
    if (!ps->warned_write && !ps->opts.quiet)
        fprintf(stderr,
                "kvbatch: persistent cache: %s in %s: %s; writing to the cache is off for the rest of "
                "this run (loads go on)%s\n",
                what, ps->dir, mdb_strerror(rc), hint);
    ps->warned_write = true;
}

/* ---- one batch ------------------------------------------------------------------------ */

struct batch {
    struct pstore_put_item *items[WRITER_BATCH];
    int n;
    uint8_t *enc[WRITER_BATCH]; /* encoded value, NULL when the key was present */
    size_t enc_len[WRITER_BATCH];
    uint64_t raw_len[WRITER_BATCH];
    struct pstore_shape shape[WRITER_BATCH];
    uint8_t present[WRITER_BATCH];
    struct pstore_model_rec recs[WRITER_BATCH]; /* models to record, at most one per item */
    int n_recs;
    struct pstore_key *touches;
    size_t n_touches, cap_touches;
    struct pstore_damage *damage;
    size_t n_damage, cap_damage;
};

static bool has_work(const struct pstore *ps) { return ps->q_n || ps->n_touches || ps->n_damage; }

/* Moves queued work into b (mu held). false when the copy could not grow:
 * the work stays queued for the next wake-up. */
static bool take(struct pstore *ps, struct batch *b)
{
    b->n = 0;
    b->n_recs = 0;
    if (ps->n_touches > b->cap_touches) {
        struct pstore_key *p = kvb_realloc(b->touches, ps->n_touches * sizeof *p);
        if (!p) return false;
        b->touches = p;
        b->cap_touches = ps->n_touches;
    }
    if (ps->n_damage > b->cap_damage) {
        struct pstore_damage *p = kvb_realloc(b->damage, ps->n_damage * sizeof *p);
        if (!p) return false;
        b->damage = p;
        b->cap_damage = ps->n_damage;
    }
    if (ps->n_touches) memcpy(b->touches, ps->touches, ps->n_touches * sizeof *b->touches);
    b->n_touches = ps->n_touches;
    ps->n_touches = 0;
    if (ps->n_damage) memcpy(b->damage, ps->damage, ps->n_damage * sizeof *b->damage);
    b->n_damage = ps->n_damage;
    ps->n_damage = 0;
    while (ps->q_head && b->n < WRITER_BATCH) {
        struct pstore_put_item *it = ps->q_head;
        ps->q_head = it->next;
        if (!ps->q_head) ps->q_tail = NULL;
        ps->q_n--;
        ps->q_bytes -= it->alloc_len;
        int i = b->n++;
        b->items[i] = it;
        b->enc[i] = NULL;
        b->present[i] = 0;
        struct pstore_known_model *km = &ps->models[it->model];
        b->shape[i] = km->shape;
        b->raw_len[i] = km->shape.raw_len;
        if (!km->recorded) {
            /* Marked now: a failed batch turns writing off for good anyway. */
            km->recorded = true;
            b->recs[b->n_recs++] = km->rec;
        }
    }
    return true;
}

static void release(struct batch *b)
{
    for (int i = 0; i < b->n; i++) {
        kvb_free(b->enc[i]);
        pstore_item_free(b->items[i]);
        b->enc[i] = NULL;
    }
    b->n = 0;
}

/* Marks items whose key already holds an acceptable value (so they are not
 * compressed for nothing). A failed read only means compressing them all. */
static void mark_present(struct pstore *ps, struct batch *b)
{
    MDB_txn *txn;
    if (b->n == 0 || pstore_txn_begin(ps, false, &txn)) return;
    for (int i = 0; i < b->n; i++) {
        MDB_val k = {16, b->items[i]->key.b}, v;
        b->present[i] = mdb_get(txn, ps->db_blocks, &k, &v) == 0 &&
                        pstore_value_acceptable(ps, v.mv_data, v.mv_size, b->items[i]->annex_len);
    }
    pstore_txn_abort(ps, txn);
}

struct outcome {
    uint64_t written, bytes, raw, dropped, evicted;
};

/* The write transaction: records, inserts, touches, removals. */
static int write_batch(struct pstore *ps, struct batch *b, struct outcome *o, struct pstore_totals *t,
                       const char **what)
{
    MDB_txn *txn;
    *what = "starting a write transaction";
    int rc = pstore_txn_begin(ps, true, &txn);
    if (rc) return rc;
    *what = "writing";
    struct outcome mine = {0};
    if ((rc = pstore_totals_get(ps, txn, t))) goto fail;
    for (int i = 0; i < b->n_recs; i++)
        if ((rc = pstore_model_rec_put(ps, txn, &b->recs[i]))) goto fail;
    for (int i = 0; i < b->n; i++) {
        struct pstore_put_item *it = b->items[i];
        if (!b->enc[i]) {
            if (b->present[i] && (rc = pstore_db_touch(ps, txn, t, &it->key))) goto fail;
            if (!b->present[i]) mine.dropped++; /* could not be encoded */
            continue;
        }
        enum pstore_insert_result res;
        rc = pstore_db_insert(ps, txn, t, &it->key, it->has_parent ? &it->parent : NULL, b->shape[i].identity,
                              b->enc[i], b->enc_len[i], b->raw_len[i], it->annex_len, &res);
        if (rc) goto fail;
        if (res == PSTORE_INSERTED || res == PSTORE_REPLACED) {
            mine.written++;
            mine.bytes += b->enc_len[i];
            mine.raw += b->raw_len[i];
        } else if (res == PSTORE_NO_PARENT) {
            mine.dropped++;
        }
    }
    for (size_t i = 0; i < b->n_touches; i++)
        if ((rc = pstore_db_touch(ps, txn, t, &b->touches[i]))) goto fail;
    bool deleted = false;
    for (size_t i = 0; i < b->n_damage; i++) {
        const struct pstore_damage *d = &b->damage[i];
        MDB_val k = {16, (void *)d->key.b}, v;
        rc = mdb_get(txn, ps->db_blocks, &k, &v);
        if (rc == MDB_NOTFOUND) continue;
        if (rc) goto fail;
        /* Only the bytes found bad: another process may have replaced them. */
        if (v.mv_size != d->len || XXH3_64bits(v.mv_data, v.mv_size) != d->hash) continue;
        bool found;
        if ((rc = pstore_db_delete(ps, txn, t, &d->key, &found))) goto fail;
        deleted = true;
    }
    if (deleted) {
        /* What hung below a removed block is unreachable now: remove it too,
         * so that every entry left has its whole chain. */
        uint64_t n_removed;
        *what = "removing damaged values";
        if ((rc = pstore_db_sweep(ps, txn, t, &n_removed, NULL))) goto fail;
    }
    if ((rc = pstore_totals_put(ps, txn, t))) goto fail;
    *what = "committing";
    if ((rc = pstore_txn_commit(ps, txn))) return rc;
    o->written += mine.written;
    o->bytes += mine.bytes;
    o->raw += mine.raw;
    o->dropped += mine.dropped;
    return 0;
fail:
    pstore_txn_abort(ps, txn);
    return rc;
}

static int gc_to_cap(struct pstore *ps, struct pstore_totals *t, struct outcome *o, const char **what)
{
    uint64_t target = ps->cap / GC_TRIM_DEN * GC_TRIM_NUM;
    *what = "evicting to the size cap";
    while (t->bytes > ps->cap) {
        MDB_txn *txn;
        int rc = pstore_txn_begin(ps, true, &txn);
        if (rc) return rc;
        uint64_t n = 0;
        if ((rc = pstore_totals_get(ps, txn, t)) || (rc = pstore_db_gc(ps, txn, t, target, GC_MAX_PER_TXN, &n)) ||
            (rc = pstore_totals_put(ps, txn, t))) {
            pstore_txn_abort(ps, txn);
            return rc;
        }
        if ((rc = pstore_txn_commit(ps, txn))) return rc;
        o->evicted += n;
        if (n < GC_MAX_PER_TXN) break; /* at the target, or nothing left to evict */
    }
    return 0;
}

struct enc_job {
    struct pstore *ps;
    struct batch *b;
    atomic_int next;
};

static void enc_worker(void *arg, int ith, int nth)
{
    struct enc_job *j = arg;
    struct batch *b = j->b;
    (void)nth;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= b->n) return;
        if (b->present[i]) continue;
        const uint8_t *v;
        size_t len;
        struct pstore_put_item *it = b->items[i];
        const struct pstore_annex an = {(void *)it->annex, it->annex_len};
        if (pstore_codec_encode(&j->ps->wcodec[ith], &b->shape[i], it->tokens, it->data, &an, j->ps->opts.zstd_level,
                                j->ps->opts.lossy8, &v, &len, NULL) != KVB_OK)
            continue; /* counted as dropped by write_batch */
        b->enc[i] = kvb_malloc(len);
        if (!b->enc[i]) continue;
        memcpy(b->enc[i], v, len);
        b->enc_len[i] = len;
    }
}

/* Compression threads, so that one writer keeps up with a GPU's prefill
 * (one thread does ~0.5 GB/s at level 3). Without them: one codec. */
static bool encoders_ensure(struct pstore *ps)
{
    if (ps->wcodec) return true;
    int n = ps->opts.n_threads > 0 ? ps->opts.n_threads : tpool_cpu_count();
    if (n > 1 && tpool_create(n, &ps->wpool) == KVB_OK) n = tpool_size(ps->wpool);
    else n = 1;
    ps->wcodec = kvb_calloc((size_t)n, sizeof *ps->wcodec);
    if (!ps->wcodec) {
        tpool_free(ps->wpool);
        ps->wpool = NULL;
        return false;
    }
    ps->n_wcodec = n;
    return true;
}

/* One batch, in a guarded region (pstore_guard.c): a file truncated or
 * overwritten under this process turns the store off and drops the batch,
 * instead of crashing the writer's thread and the process with it. */
static void process(struct pstore *ps, struct batch *b)
{
    struct outcome o = {0};
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) {
        pstore_guard_fault(ps, &g, "writing");
        pthread_mutex_lock(&ps->mu);
        ps->stats.blocks_dropped += (uint64_t)b->n;
        pthread_mutex_unlock(&ps->mu);
        return;
    }
    mark_present(ps, b);
    int to_encode = 0;
    for (int i = 0; i < b->n; i++) to_encode += !b->present[i];
    if (to_encode && encoders_ensure(ps)) {
        struct enc_job job = {ps, b, 0};
        if (to_encode > 1 && ps->wpool) tpool_run(ps->wpool, enc_worker, &job);
        else enc_worker(&job, 0, 1);
    }
    struct pstore_totals t;
    const char *what = "";
    int rc = write_batch(ps, b, &o, &t, &what);
    if (rc) {
        for (int i = 0; i < b->n; i++) o.dropped += !b->present[i];
    } else {
        rc = gc_to_cap(ps, &t, &o, &what);
    }
    pstore_guard_pop(&g);

    pthread_mutex_lock(&ps->mu);
    if (rc && !atomic_load(&ps->broken)) pstore_disable_writing_locked(ps, rc, what);
    ps->stats.blocks_written += o.written;
    ps->stats.bytes_written += o.bytes;
    ps->stats.raw_bytes_written += o.raw;
    ps->stats.blocks_dropped += o.dropped;
    ps->stats.evicted += o.evicted;
    pthread_mutex_unlock(&ps->mu);
}

/* ---- the thread ------------------------------------------------------------------------- */

static void *writer_main(void *arg)
{
    struct pstore *ps = arg;
    struct batch *b = kvb_calloc(1, sizeof *b);
    pthread_mutex_lock(&ps->mu);
    for (;;) {
        while (!ps->stop && !has_work(ps)) pthread_cond_wait(&ps->cv_work, &ps->mu);
        if (!has_work(ps)) break; /* stop, and nothing left */
        /* Let the batch fill. Touches and removals alone wait longer: each
         * write transaction costs an fsync, and they can ride along with
         * the next puts. */
        struct timespec start;
        clock_gettime(CLOCK_MONOTONIC, &start);
        while (ps->q_n < WRITER_BATCH && !ps->stop && !ps->flushing) {
            long ms = ps->q_n ? WRITER_LINGER_MS : TOUCH_LINGER_MS;
            struct timespec dl = start;
            dl.tv_sec += ms / 1000;
            dl.tv_nsec += (ms % 1000) * 1000000L;
            if (dl.tv_nsec >= 1000000000L) {
                dl.tv_sec++;
                dl.tv_nsec -= 1000000000L;
            }
            if (pthread_cond_timedwait(&ps->cv_work, &ps->mu, &dl) == ETIMEDOUT) {
                /* a put may have arrived and shortened the wait: re-check */
                if (ps->q_n == 0 || ms == WRITER_LINGER_MS) break;
            }
        }
        if (!b || !take(ps, b)) {
            /* No memory for even the batch: drop what is queued, keep going. */
            while (ps->q_head) {
                struct pstore_put_item *it = ps->q_head;
                ps->q_head = it->next;
                pstore_item_free(it);
                ps->stats.blocks_dropped++;
            }
            ps->q_tail = NULL;
            ps->q_n = ps->q_bytes = 0;
            ps->n_touches = ps->n_damage = 0;
            pthread_cond_broadcast(&ps->cv_idle);
            continue;
        }
        if (ps->stats.writing_disabled) {
            ps->stats.blocks_dropped += (uint64_t)b->n;
            release(b);
            pthread_cond_broadcast(&ps->cv_idle);
            continue;
        }
        ps->busy = true;
        pthread_mutex_unlock(&ps->mu);
        process(ps, b);
        release(b);
        pthread_mutex_lock(&ps->mu);
        ps->busy = false;
        pthread_cond_broadcast(&ps->cv_idle);
    }
    ps->writer_running = false;
    pthread_cond_broadcast(&ps->cv_idle);
    pthread_mutex_unlock(&ps->mu);
    if (b) {
        kvb_free(b->touches);
        kvb_free(b->damage);
        kvb_free(b);
    }
    return NULL;
}

enum kvb_status pstore_writer_start(struct pstore *ps, struct kvb_err *err)
{
    ps->writer_running = true;
    int rc = pthread_create(&ps->writer, NULL, writer_main, ps);
    if (rc) {
        ps->writer_running = false;
        return kvb_errf(err, KVB_ERR_IO, "cannot start the cache writer thread: %s", strerror(rc));
    }
    ps->writer_started = true;
    return KVB_OK;
}

void pstore_writer_stop(struct pstore *ps)
{
    if (!ps->writer_started) return;
    pthread_mutex_lock(&ps->mu);
    ps->stop = true;
    pthread_cond_broadcast(&ps->cv_work);
    pthread_mutex_unlock(&ps->mu);
    pthread_join(ps->writer, NULL);
    ps->writer_started = false;
}
