/* pstore_admin.c — managing a cache directory (`kvbatch cache ...`):
 * statistics with a per-model breakdown, a full verification that also
 * repairs, size trimming, and clearing all or one model's entries.
 *
 * These run next to jobs that may be using the same directory. verify
 * therefore decodes under short read transactions (a batch each: they do
 * not block other processes' writers, and do not pin freed pages for long)
 * and takes the write lock only for the removals, and it only ever
 * deletes: a value another process replaced in between is at worst
 * recomputed by a later run. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/tpool.h"
#include "store/pstore/pstore_internal.h"
#include "store/pstore/pstore_results.h"

#define GC_MAX_PER_TXN 20000u
#define VERIFY_BATCH 256
#define VERIFY_SHOW 10

static void fmt_size(char *buf, size_t cap, uint64_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)n);
    else snprintf(buf, cap, "%.1f %s", v, units[u]);
}

static const char *dtype_name(int dt)
{
    switch (dt) {
    case PSTORE_DTYPE_F16: return "f16";
    case PSTORE_DTYPE_F32: return "f32";
    case PSTORE_DTYPE_Q8: return "q8";
    case PSTORE_DTYPE_Q4: return "q4";
    default: return "?";
    }
}

static uint64_t file_size(const struct pstore *ps, const char *name)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", ps->dir, name);
    struct stat st;
    return n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* ---- stats ----------------------------------------------------------------------- */

struct model_sum {
    uint8_t identity[16];
    uint64_t n, bytes, raw;
};

enum kvb_status pstore_print_stats(struct pstore *ps, FILE *out, struct kvb_err *err)
{
    if (!ps || !out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL argument");
    pstore_flush(ps);
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, false, &txn);
    if (rc) return pstore_lmdb_status(err, rc, "cache stats");
    struct pstore_totals t;
    struct pstore_model_rec *recs = NULL;
    size_t n_recs = 0, n_sums = 0, cap_sums = 0;
    struct model_sum *sums = NULL;
    MDB_cursor *cur = NULL;
    if ((rc = pstore_totals_get(ps, txn, &t)) || (rc = pstore_model_recs_load(ps, txn, &recs, &n_recs)) ||
        (rc = mdb_cursor_open(txn, ps->db_meta, &cur)))
        goto done;
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct pstore_meta m;
        if (!pstore_meta_unpack(v.mv_data, v.mv_size, &m)) continue;
        size_t i = 0;
        while (i < n_sums && memcmp(sums[i].identity, m.identity, 16)) i++;
        if (i == n_sums) {
            if (n_sums == cap_sums) {
                size_t nc = cap_sums ? 2 * cap_sums : 4;
                struct model_sum *p = kvb_realloc(sums, nc * sizeof *p);
                if (!p) {
                    rc = ENOMEM;
                    break;
                }
                sums = p;
                cap_sums = nc;
            }
            memset(&sums[n_sums], 0, sizeof *sums);
            memcpy(sums[n_sums++].identity, m.identity, 16);
        }
        sums[i].n++;
        sums[i].bytes += m.value_len;
        sums[i].raw += m.raw_len;
    }
    if (rc != MDB_NOTFOUND) goto done;
    rc = 0;
    MDB_envinfo info;
    mdb_env_info(ps->env, &info);

    char a[32], b[32], c[32], d[32];
    fprintf(out, "cache directory  %s\n", ps->dir);
    fprintf(out, "entries          %llu blocks\n", (unsigned long long)t.entries);
    fmt_size(a, sizeof a, t.bytes);
    fmt_size(b, sizeof b, t.raw);
    fprintf(out, "stored           %s (raw %s", a, b);
    if (t.bytes) fprintf(out, ", compression ratio %.2fx", (double)t.raw / (double)t.bytes);
    fprintf(out, ")\n");
    fmt_size(a, sizeof a, file_size(ps, "data.mdb"));
    fmt_size(b, sizeof b, (uint64_t)info.me_mapsize);
    fmt_size(c, sizeof c, ps->cap);
    fprintf(out, "data file        %s (map %s; size cap %s)\n", a, b, c);
    if (n_sums) fprintf(out, "per model:\n");
    for (size_t i = 0; i < n_sums; i++) {
        const struct pstore_model_rec *r = NULL;
        for (size_t j = 0; j < n_recs && !r; j++)
            if (!memcmp(recs[j].identity, sums[i].identity, 16)) r = &recs[j];
        fmt_size(a, sizeof a, sums[i].bytes);
        snprintf(d, sizeof d, "%.2fx", sums[i].bytes ? (double)sums[i].raw / (double)sums[i].bytes : 0.0);
        if (r) {
            fprintf(out, "  %s  [%s, KV %s, block %d, %d layers x %d]: %llu blocks, %s, ratio %s\n",
                    r->name[0] ? r->name : "(unnamed)", r->fingerprint, dtype_name(r->dtype), (int)r->block_size,
                    (int)r->n_layer, (int)r->kv_dim, (unsigned long long)sums[i].n, a, d);
        } else {
            char hex[33];
            pstore_hex16(sums[i].identity, hex);
            fprintf(out, "  (unrecorded model, identity %s): %llu blocks, %s, ratio %s\n", hex,
                    (unsigned long long)sums[i].n, a, d);
        }
    }
done:
    if (cur) mdb_cursor_close(cur);
    pstore_txn_abort(ps, txn);
    kvb_free(recs);
    kvb_free(sums);
    if (rc == 0) pstore_results_print(ps, out);
    return rc ? pstore_lmdb_status(err, rc, "cache stats") : KVB_OK;
}

/* ---- verify ------------------------------------------------------------------------ */

struct vshape {
    struct pstore_shape s;
    bool ok;
};

struct vitem {
    struct pstore_key key;
    const uint8_t *val;
    size_t len;
    struct pstore_meta meta;
    int shape;       /* index into shapes */
    const char *why; /* NULL = good */
};

struct bad {
    struct pstore_key key;
    const char *why;
};

struct vjob {
    struct pstore *ps;
    const struct vshape *shapes;
    struct vitem *items;
    int n;
    uint8_t **bufs; /* per thread, max raw_len */
    atomic_int next;
};

static void verify_worker(void *arg, int ith, int nth)
{
    struct vjob *j = arg;
    (void)nth;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) return;
        struct vitem *it = &j->items[i];
        if (it->why) continue;
        const struct pstore_shape *s = &j->shapes[it->shape].s;
        if (pstore_codec_decode(&j->ps->rcodec[ith], s, NULL, true, it->val, it->len, j->bufs[ith], NULL, NULL) !=
            KVB_OK) {
            it->why = "value does not decode (damaged, truncated, other version or model)";
            continue;
        }
        /* The value's tokens and the recorded parent must give its key back:
         * this catches a value filed under the wrong key and a broken link. */
        struct pstore_hdr h;
        pstore_hdr_parse(it->val, it->len, &h, NULL);
        struct pstore_key k;
        pstore_key_next_le(it->meta.has_parent ? it->meta.parent.b : s->identity, h.tokens, s->block_size, &k);
        if (memcmp(k.b, it->key.b, 16)) it->why = "key does not match the value's tokens and parent";
    }
}

static int push_bad(struct bad **b, size_t *n, size_t *cap, const struct pstore_key *key, const char *why)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        struct bad *p = kvb_realloc(*b, nc * sizeof *p);
        if (!p) return ENOMEM;
        *b = p;
        *cap = nc;
    }
    (*b)[(*n)++] = (struct bad){*key, why};
    return 0;
}

static void run_vjob(struct pstore *ps, struct vjob *j)
{
    atomic_store(&j->next, 0);
    if (ps->pool && j->n > 1) tpool_run(ps->pool, verify_worker, j);
    else verify_worker(j, 0, 1);
}

/* One batch of values: from the first key after `last` (or the first key),
 * in its own read transaction, so that a long verify does not keep other
 * processes' freed pages from being reused. *done when the end is reached. */
static int verify_batch(struct pstore *ps, struct vjob *job, const struct pstore_model_rec *recs, size_t n_recs,
                        uint8_t *last, size_t *last_len, bool *done, struct bad **bad, size_t *n_bad, size_t *cap_bad,
                        uint64_t *n_checked)
{
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, false, &txn);
    if (rc) return rc;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, ps->db_blocks, &cur))) {
        pstore_txn_abort(ps, txn);
        return rc;
    }
    MDB_val k = {*last_len, last}, v;
    if (*last_len == 0) {
        rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    } else {
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc == 0 && k.mv_size == *last_len && !memcmp(k.mv_data, last, *last_len))
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    job->n = 0;
    for (; rc == 0 && job->n < VERIFY_BATCH; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        memcpy(last, k.mv_data, k.mv_size); /* LMDB keys are at most 511 bytes */
        *last_len = k.mv_size;
        if (k.mv_size != 16) continue; /* not a key this store writes */
        (*n_checked)++;
        struct vitem *it = &job->items[job->n++];
        memset(it, 0, sizeof *it);
        memcpy(it->key.b, k.mv_data, 16);
        it->val = v.mv_data;
        it->len = v.mv_size;
        MDB_val mv;
        int r2 = mdb_get(txn, ps->db_meta, &k, &mv);
        if (r2 && r2 != MDB_NOTFOUND) {
            rc = r2;
            break;
        }
        if (r2 || !pstore_meta_unpack(mv.mv_data, mv.mv_size, &it->meta)) {
            it->why = "value without a valid meta record";
            continue;
        }
        if (it->meta.value_len != v.mv_size) {
            it->why = "meta record gives another value size";
            continue;
        }
        it->shape = -1;
        for (size_t i = 0; i < n_recs; i++)
            if (!memcmp(recs[i].identity, it->meta.identity, 16)) it->shape = (int)i;
        if (it->shape < 0 || !job->shapes[it->shape].ok) it->why = "model not recorded (or its record is damaged)";
    }
    *done = rc == MDB_NOTFOUND;
    if (rc == 0 || rc == MDB_NOTFOUND) {
        rc = 0;
        run_vjob(ps, job); /* the values are valid until the transaction ends */
        for (int i = 0; i < job->n && rc == 0; i++)
            if (job->items[i].why) rc = push_bad(bad, n_bad, cap_bad, &job->items[i].key, job->items[i].why);
    }
    mdb_cursor_close(cur);
    pstore_txn_abort(ps, txn);
    return rc;
}

static int verify_scan(struct pstore *ps, struct vjob *job, struct vshape **shapes_out, struct bad **bad, size_t *n_bad,
                       size_t *cap_bad, uint64_t *n_checked)
{
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, false, &txn);
    if (rc) return rc;
    struct pstore_model_rec *recs = NULL;
    size_t n_recs = 0;
    rc = pstore_model_recs_load(ps, txn, &recs, &n_recs);
    pstore_txn_abort(ps, txn);
    if (rc) return rc;
    struct vshape *shapes = kvb_calloc(n_recs ? n_recs : 1, sizeof *shapes);
    *shapes_out = shapes;
    if (!shapes) {
        kvb_free(recs);
        return ENOMEM;
    }
    uint64_t max_raw = 1;
    for (size_t i = 0; i < n_recs; i++) {
        struct pstore_model m = {.name = recs[i].name,
                                 .dtype = recs[i].dtype,
                                 .block_size = recs[i].block_size,
                                 .n_layer = recs[i].n_layer,
                                 .kv_dim = recs[i].kv_dim};
        memcpy(m.fingerprint, recs[i].fingerprint, 33);
        shapes[i].ok =
            pstore_shape_init(&m, &shapes[i].s, NULL) == KVB_OK && !memcmp(shapes[i].s.identity, recs[i].identity, 16);
        if (shapes[i].ok && shapes[i].s.raw_len > max_raw) max_raw = shapes[i].s.raw_len;
    }
    for (int t = 0; t < ps->n_rcodec && rc == 0; t++)
        if (!(job->bufs[t] = kvb_malloc((size_t)max_raw))) rc = ENOMEM;
    job->shapes = shapes;

    /* Every value: decodes, has its meta record and a known model, and its
     * key follows from its tokens. */
    uint8_t last[512];
    size_t last_len = 0;
    bool done = false;
    while (rc == 0 && !done)
        rc = verify_batch(ps, job, recs, n_recs, last, &last_len, &done, bad, n_bad, cap_bad, n_checked);
    kvb_free(recs);
    if (rc) return rc;

    /* Every meta record has its value. */
    if ((rc = pstore_txn_begin(ps, false, &txn))) return rc;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, ps->db_meta, &cur))) {
        pstore_txn_abort(ps, txn);
        return rc;
    }
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        MDB_val bv;
        int r2 = mdb_get(txn, ps->db_blocks, &k, &bv);
        if (r2 == MDB_NOTFOUND && k.mv_size == 16) {
            struct pstore_key key;
            memcpy(key.b, k.mv_data, 16);
            r2 = push_bad(bad, n_bad, cap_bad, &key, "meta record without a value");
        }
        if (r2 && r2 != MDB_NOTFOUND) {
            rc = r2;
            break;
        }
    }
    if (rc == MDB_NOTFOUND) rc = 0;
    mdb_cursor_close(cur);
    pstore_txn_abort(ps, txn);
    return rc;
}

enum kvb_status pstore_verify(struct pstore *ps, FILE *out, uint64_t *n_bad_out, struct kvb_err *err)
{
    if (n_bad_out) *n_bad_out = 0;
    if (!ps) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL store");
    pstore_flush(ps);
    KVB_FORWARD_IF_ERROR(pstore_readers_ensure(ps, err));
    struct vjob job = {.ps = ps};
    job.items = kvb_malloc(VERIFY_BATCH * sizeof *job.items);
    job.bufs = kvb_calloc((size_t)ps->n_rcodec, sizeof *job.bufs);
    struct vshape *shapes = NULL;
    struct bad *bad = NULL;
    size_t n_bad = 0, cap_bad = 0;
    uint64_t n_checked = 0, n_orphans = 0, n_fixed = 0, n_gone = 0;
    struct pstore_totals t = {0};
    int rc = (!job.items || !job.bufs) ? ENOMEM : 0;
    const char *what = "cache verify (reading)";
    if (rc == 0) rc = verify_scan(ps, &job, &shapes, &bad, &n_bad, &cap_bad, &n_checked);

    if (rc == 0) {
        what = "cache verify (removing)";
        MDB_txn *txn;
        rc = pstore_txn_begin(ps, true, &txn);
        if (rc == 0) {
            rc = pstore_totals_get(ps, txn, &t);
            for (size_t i = 0; i < n_bad && rc == 0; i++) {
                bool found;
                rc = pstore_db_delete(ps, txn, &t, &bad[i].key, &found);
                n_gone += found;
            }
            /* What hung below a removed entry is unreachable: remove it too,
             * and recompute the child counts and totals from what is left. */
            if (rc == 0) rc = pstore_db_sweep(ps, txn, &t, &n_orphans, &n_fixed);
            if (rc == 0) rc = pstore_totals_put(ps, txn, &t);
            if (rc == 0) rc = pstore_txn_commit(ps, txn);
            else pstore_txn_abort(ps, txn);
        }
    }
    if (job.bufs)
        for (int i = 0; i < ps->n_rcodec; i++) kvb_free(job.bufs[i]);
    kvb_free(job.bufs);
    kvb_free(job.items);
    kvb_free(shapes);
    if (rc) {
        kvb_free(bad);
        return pstore_lmdb_status(err, rc, what);
    }
    if (out) {
        /* pstore_open checked it (a damaged one does not get this far). */
        if (ps->stats.checked)
            fprintf(out, "structure: sound (%llu pages and overflow headers checked in %.0f ms)\n",
                    (unsigned long long)ps->stats.check_pages, ps->stats.check_seconds * 1e3);
        else fprintf(out, "structure: not checked (this build does not know the LMDB file format)\n");
        for (size_t i = 0; i < n_bad && i < VERIFY_SHOW; i++) {
            char hex[33];
            pstore_hex16(bad[i].key.b, hex);
            fprintf(out, "bad %s: %s\n", hex, bad[i].why);
        }
        if (n_bad > VERIFY_SHOW) fprintf(out, "... and %zu more\n", n_bad - VERIFY_SHOW);
        char a[32];
        fmt_size(a, sizeof a, t.bytes);
        fprintf(out,
                "checked %llu values: %zu bad, %llu unreachable entries below them removed, "
                "%llu child counts repaired; %llu entries (%s) remain\n",
                (unsigned long long)n_checked, n_bad, (unsigned long long)n_orphans, (unsigned long long)n_fixed,
                (unsigned long long)t.entries, a);
    }
    pthread_mutex_lock(&ps->mu);
    ps->stats.damaged += n_bad;
    pthread_mutex_unlock(&ps->mu);
    if (n_bad_out) *n_bad_out = n_bad + n_orphans;
    kvb_free(bad);
    (void)n_gone;
    uint64_t n_bad_results = 0;
    KVB_FORWARD_IF_ERROR(pstore_results_verify(ps, out ? out : stderr, &n_bad_results, err));
    if (n_bad_out) *n_bad_out += n_bad_results;
    return KVB_OK;
}

/* ---- gc and clear ------------------------------------------------------------------ */

enum kvb_status pstore_gc(struct pstore *ps, uint64_t max_size, uint64_t *n_evicted, struct kvb_err *err)
{
    if (n_evicted) *n_evicted = 0;
    if (!ps) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL store");
    pstore_flush(ps);
    uint64_t total = 0;
    for (;;) {
        MDB_txn *txn;
        int rc = pstore_txn_begin(ps, true, &txn);
        if (rc) return pstore_lmdb_status(err, rc, "cache gc");
        struct pstore_totals t;
        uint64_t n = 0;
        if ((rc = pstore_totals_get(ps, txn, &t)) || (rc = pstore_db_gc(ps, txn, &t, max_size, GC_MAX_PER_TXN, &n)) ||
            (rc = pstore_totals_put(ps, txn, &t))) {
            pstore_txn_abort(ps, txn);
            return pstore_lmdb_status(err, rc, "cache gc");
        }
        if ((rc = pstore_txn_commit(ps, txn))) return pstore_lmdb_status(err, rc, "cache gc");
        total += n;
        if (n_evicted) *n_evicted = total;
        pthread_mutex_lock(&ps->mu);
        ps->stats.evicted += n;
        pthread_mutex_unlock(&ps->mu);
        if (n < GC_MAX_PER_TXN) return KVB_OK;
    }
}

static int clear_model(struct pstore *ps, MDB_txn *txn, const char *fp, uint64_t *n_removed)
{
    struct pstore_model_rec *recs;
    size_t n_recs;
    int rc = pstore_model_recs_load(ps, txn, &recs, &n_recs);
    if (rc) return rc;
    struct pstore_totals t;
    struct pstore_key *keys = NULL;
    size_t n_keys = 0, cap_keys = 0;
    MDB_cursor *cur = NULL;
    if ((rc = pstore_totals_get(ps, txn, &t)) || (rc = mdb_cursor_open(txn, ps->db_meta, &cur))) goto done;
    MDB_val k, v;
    /* Collect first: deleting under a live cursor is legal in LMDB but
     * harder to read. A chain never mixes models, so removing all of one
     * model's entries strands nothing. */
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct pstore_meta m;
        if (k.mv_size != 16 || !pstore_meta_unpack(v.mv_data, v.mv_size, &m)) continue;
        bool mine = false;
        for (size_t i = 0; i < n_recs && !mine; i++)
            mine = !memcmp(recs[i].identity, m.identity, 16) && !strcmp(recs[i].fingerprint, fp);
        if (!mine) continue;
        if (n_keys == cap_keys) {
            size_t nc = cap_keys ? 2 * cap_keys : 64;
            struct pstore_key *p = kvb_realloc(keys, nc * sizeof *p);
            if (!p) {
                rc = ENOMEM;
                break;
            }
            keys = p;
            cap_keys = nc;
        }
        memcpy(keys[n_keys++].b, k.mv_data, 16);
    }
    mdb_cursor_close(cur);
    cur = NULL;
    if (rc != MDB_NOTFOUND) goto done;
    rc = 0;
    for (size_t i = 0; i < n_keys && rc == 0; i++) {
        bool found;
        rc = pstore_db_delete(ps, txn, &t, &keys[i], &found);
        *n_removed += found;
    }
    for (size_t i = 0; i < n_recs && rc == 0; i++) {
        if (strcmp(recs[i].fingerprint, fp)) continue;
        MDB_val mk = {16, recs[i].identity};
        rc = mdb_del(txn, ps->db_models, &mk, NULL);
        if (rc == MDB_NOTFOUND) rc = 0;
    }
    if (rc == 0) rc = pstore_totals_put(ps, txn, &t);
done:
    if (cur) mdb_cursor_close(cur);
    kvb_free(keys);
    kvb_free(recs);
    return rc;
}

enum kvb_status pstore_clear(struct pstore *ps, const char *fingerprint, uint64_t *n_removed, struct kvb_err *err)
{
    uint64_t n = 0;
    if (n_removed) *n_removed = 0;
    if (!ps) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL store");
    char fp[33];
    if (fingerprint) {
        size_t len = strlen(fingerprint);
        bool hex = len == 32;
        for (size_t i = 0; i < len && hex; i++) {
            char c = fingerprint[i];
            fp[i] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
            hex = (fp[i] >= '0' && fp[i] <= '9') || (fp[i] >= 'a' && fp[i] <= 'f');
        }
        if (!hex) return kvb_errf(err, KVB_ERR_INVALID_ARG, "fingerprint '%s' is not 32 hex digits", fingerprint);
        fp[32] = '\0';
    }
    pstore_flush(ps);
    pstore_results_flush(ps, NULL); /* nothing held back past the clear */
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, true, &txn);
    if (rc) return pstore_lmdb_status(err, rc, "cache clear");
    if (fingerprint) {
        rc = clear_model(ps, txn, fp, &n);
        if (rc == 0) rc = pstore_results_clear_txn(ps, txn, fp, &n);
    } else {
        MDB_stat st;
        struct pstore_totals t;
        if (!(rc = mdb_stat(txn, ps->db_meta, &st)) && !(rc = pstore_totals_get(ps, txn, &t)) &&
            !(rc = mdb_drop(txn, ps->db_blocks, 0)) && !(rc = mdb_drop(txn, ps->db_meta, 0)) &&
            !(rc = mdb_drop(txn, ps->db_models, 0))) {
            n = st.ms_entries;
            t = (struct pstore_totals){0, 0, 0, t.clock};
            rc = pstore_totals_put(ps, txn, &t);
        }
        if (rc == 0) rc = pstore_results_clear_txn(ps, txn, NULL, &n);
    }
    if (rc) {
        pstore_txn_abort(ps, txn);
        return pstore_lmdb_status(err, rc, "cache clear");
    }
    if ((rc = pstore_txn_commit(ps, txn))) return pstore_lmdb_status(err, rc, "cache clear");
    if (n_removed) *n_removed = n;
    /* This process's writer must record the model again if it puts more. */
    pthread_mutex_lock(&ps->mu);
    for (int i = 0; i < ps->n_models; i++)
        if (!fingerprint || !strcmp(ps->models[i].rec.fingerprint, fp)) ps->models[i].recorded = false;
    pthread_mutex_unlock(&ps->mu);
    return KVB_OK;
}
