/* pstore.c — the engine's side of the persistent prefix cache: opening the
 * LMDB environment, loading a chain of blocks (one read transaction, values
 * decoded in parallel straight into the caller's buffers), the cheap
 * presence check, and handing puts to the writer thread (pstore_writer.c).
 *
 * Nothing here ever waits on the disk for a put, and nothing here turns a
 * cache problem into a job failure: a damaged value is a miss (counted,
 * logged once, queued for removal), a full disk is a warning. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "base/tpool.h"
#include "store/pstore/pstore_internal.h"

#define DEFAULT_CAP ((uint64_t)10 << 30)
#define MIB ((uint64_t)1 << 20)

/* mkdir -p: every missing component, 0755. */
static int mkdir_p(const char *dir)
{
    size_t n = strlen(dir);
    char *p = kvb_strndup(dir, n);
    if (!p) return ENOMEM;
    int rc = 0;
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = errno;
        p[i] = c;
    }
    struct stat st;
    if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) rc = ENOTDIR;
    kvb_free(p);
    return rc;
}

/* The cap may not exceed what the disk can give: the data file as it is plus
 * the free space, keeping a tenth of the free space for everything else. */
static uint64_t effective_cap(const char *dir, uint64_t want)
{
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return want;
    uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/data.mdb", dir);
    struct stat st;
    uint64_t have = n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    uint64_t disk = have + avail - avail / 10;
    return want < disk ? want : disk;
}

/* ---- opening, and a damaged file ------------------------------------------------- */

static int env_open(struct pstore *ps)
{
    int rc = mdb_env_create(&ps->env);
    if (rc) {
        ps->env = NULL;
        return rc;
    }
    /* An assertion LMDB trips on a file damaged under this process is a
     * fault of a guarded read (pstore_guard.c), not an abort(). */
    mdb_env_set_assert(ps->env, pstore_guard_assert);
    /* NOTLS: the engine thread and the writer thread each run transactions.
     * NOMETASYNC: a crash may lose the last commit but never corrupts, and
     * it halves the fsyncs; losing a cache write costs only a recompute. */
    if (!(rc = mdb_env_set_maxdbs(ps->env, 8)) && !(rc = mdb_env_set_mapsize(ps->env, (size_t)ps->map_size)))
        rc = mdb_env_open(ps->env, ps->dir, MDB_NOTLS | MDB_NOMETASYNC, 0644);
    if (rc) {
        mdb_env_close(ps->env); /* LMDB: a failed open leaves a handle only good for closing */
        ps->env = NULL;
    }
    return rc;
}

/* Errors of mdb_env_open that a damaged data file produces (bad meta page;
 * a page count that cannot be mapped). */
static bool open_error_may_be_damage(int rc)
{
    return rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == ENOMEM || rc == EINVAL ||
           rc == EFBIG || rc == EOVERFLOW;
}

/* Moves the damaged data file (and its lock file, so that a process still
 * holding the old file keeps its own locks) into DIR/damaged-TIME/. Only
 * the file that was checked: when another process moved it first, there
 * is nothing to do. lockfd (or -1) serialises this against other
 * processes' opens; it is left held exclusively. 0, or an errno (where
 * names the step). */
static int set_aside(struct pstore *ps, int lockfd, const struct pstore_check *c, char *moved, size_t cap,
                     const char **where)
{
    char data[4200], lock[4200], to[4200];
    snprintf(data, sizeof data, "%s/data.mdb", ps->dir);
    snprintf(lock, sizeof lock, "%s/lock.mdb", ps->dir);
    moved[0] = '\0';
    if (lockfd >= 0) {
        while (flock(lockfd, LOCK_EX) != 0 && errno == EINTR) {}
    }
    int rc = 0;
    struct stat st;
    *where = "looking at the file";
    if (stat(data, &st) != 0) {
        rc = errno == ENOENT ? 0 : errno; /* gone: moved by another process */
        goto out;
    }
    if ((uint64_t)st.st_dev != c->dev || (uint64_t)st.st_ino != c->ino) goto out; /* another file now */
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    *where = "making a directory for it";
    for (int i = 1;; i++) {
        if (i == 1) snprintf(moved, cap, "%s/damaged-%s", ps->dir, stamp);
        else snprintf(moved, cap, "%s/damaged-%s-%d", ps->dir, stamp, i);
        if (mkdir(moved, 0755) == 0) break;
        if (errno != EEXIST || i >= 100) {
            rc = errno;
            moved[0] = '\0';
            goto out;
        }
    }
    *where = "moving it";
    snprintf(to, sizeof to, "%s/data.mdb", moved);
    if (rename(data, to) != 0) {
        rc = errno;
        rmdir(moved);
        moved[0] = '\0';
        goto out;
    }
    snprintf(to, sizeof to, "%s/lock.mdb", moved);
    if (rename(lock, to) != 0) unlink(lock); /* a stale lock file is rebuilt by the next open */
out:
    return rc; /* still holding the lock exclusively: the caller opens anew under it */
}

/* Opens the environment and checks the file's structure (pstore_check.c)
 * before anything reads it through the map. A damaged file is moved aside
 * and an empty cache started in its place, or, with opts.keep_damaged, the
 * open fails with KVB_ERR_FORMAT saying so.
 *
 * DIR/kvbatch.lock orders this between processes: held exclusively while
 * the meta pages are read and LMDB opens the file (mdb_env_open trusts the
 * page size it finds: a zero divides by zero; and the first opener of a
 * fresh directory writes the meta pages, which another must not see half
 * written), shared while the tree is walked (under a read transaction, so
 * other processes' commits cannot disturb it), exclusive again to move a
 * damaged file. A directory where it cannot be created goes without. */
static enum kvb_status open_checked(struct pstore *ps, struct kvb_err *err)
{
    char lockpath[4200];
    snprintf(lockpath, sizeof lockpath, "%s/kvbatch.lock", ps->dir);
    int lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    enum kvb_status st = KVB_OK;
    char data[4200];
    snprintf(data, sizeof data, "%s/data.mdb", ps->dir);
    for (int attempt = 0;; attempt++) {
        if (lockfd >= 0) {
            while (flock(lockfd, LOCK_EX) != 0 && errno == EINTR) {}
        }
        struct pstore_check c = {0};
        /* The meta pages first, by pread: what mdb_env_open would trust. */
        pstore_file_check(data, &c);
        int rc = c.damaged ? 0 : env_open(ps);
        if (lockfd >= 0) flock(lockfd, LOCK_SH);
        if (c.damaged) {
            /* handled below */
        } else if (rc == 0) {
            /* Reader slots left by killed processes would pin old pages
             * (and grow the file) until cleared. */
            int dead = 0;
            mdb_reader_check(ps->env, &dead);
            int crc = pstore_env_check(ps->env, &c);
            ps->stats.checked = crc == 0;
            ps->stats.check_pages = c.pages_read;
            ps->stats.check_seconds = c.seconds;
            if (crc != 0 && crc != ENOTSUP && !ps->opts.quiet)
                fprintf(stderr, "kvbatch: persistent cache: could not check %s (%s); using it unchecked\n", data,
                        mdb_strerror(crc));
            if (crc != 0 || !c.damaged) break;
        } else {
            if (rc == MDB_VERSION_MISMATCH) {
                st = kvb_errf(err, KVB_ERR_UNSUPPORTED,
                              "%s was written by another version of LMDB (or its lock "
                              "file by a program using one): kvbatch cannot use it; give another --cache-dir, or "
                              "remove %s when no other program uses it",
                              data, ps->dir);
                break;
            }
            if (open_error_may_be_damage(rc)) pstore_file_check(data, &c);
            if (!c.damaged) {
                st = pstore_lmdb_status(err, rc, ps->dir);
                break;
            }
        }
        /* Damaged. */
        if (ps->env) {
            mdb_env_close(ps->env);
            ps->env = NULL;
        }
        if (ps->opts.keep_damaged || attempt > 0) {
            st = kvb_errf(err, KVB_ERR_FORMAT,
                          "%s is damaged: %s. This is the file's own structure, not one value: "
                          "kvbatch cannot read it safely. `kvbatch run` moves such a file aside and starts an empty "
                          "cache; or remove %s when no job uses it",
                          data, c.why, ps->dir);
            break;
        }
        char moved[4200];
        const char *where = "";
        int mrc = set_aside(ps, lockfd, &c, moved, sizeof moved, &where);
        if (mrc) {
            st = kvb_errf(err, KVB_ERR_FORMAT,
                          "%s is damaged (%s) and could not be moved aside (%s: %s): remove "
                          "%s when no job uses it, or give another --cache-dir",
                          data, c.why, where, strerror(mrc), ps->dir);
            break;
        }
        ps->stats.set_aside = true;
        /* Said even when quiet: files moved on disk. */
        if (moved[0])
            fprintf(stderr,
                    "kvbatch: persistent cache: %s is damaged (%s). Moved it to %s/ and started an empty "
                    "cache: results are not affected, the prefixes it held are computed again. Remove %s when "
                    "you no longer need it.\n",
                    data, c.why, moved, moved);
        else if (!ps->opts.quiet)
            fprintf(stderr,
                    "kvbatch: persistent cache: %s was damaged (%s); another process has moved it aside "
                    "already\n",
                    data, c.why);
    }
    if (lockfd >= 0) close(lockfd); /* drops the lock */
    return st;
}

/* The named databases, made when missing: one write transaction, guarded
 * like every other (the file was just checked, but another process may be
 * at it already). */
static enum kvb_status open_dbs(struct pstore *ps, struct kvb_err *err)
{
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) {
        pstore_guard_fault(ps, &g, "opening it");
        return kvb_errf(err, KVB_ERR_IO, "%s/data.mdb changed while it was being opened", ps->dir);
    }
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, true, &txn);
    if (!rc && ((rc = mdb_dbi_open(txn, "blocks", MDB_CREATE, &ps->db_blocks)) ||
                (rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &ps->db_meta)) ||
                (rc = mdb_dbi_open(txn, "models", MDB_CREATE, &ps->db_models)) ||
                (rc = mdb_dbi_open(txn, "info", MDB_CREATE, &ps->db_info))))
        pstore_txn_abort(ps, txn);
    else if (!rc) rc = pstore_txn_commit(ps, txn);
    pstore_guard_pop(&g);
    return pstore_lmdb_status(err, rc, ps->dir);
}

enum kvb_status pstore_open(const char *dir, const struct pstore_opts *opts, struct pstore **out, struct kvb_err *err)
{
    if (!out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL out");
    *out = NULL;
    char defdir[4096];
    if (!dir || !*dir) {
        pstore_default_dir(defdir, sizeof defdir);
        dir = defdir;
    }
    struct pstore *ps = kvb_calloc(1, sizeof *ps);
    if (!ps) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    if (opts) ps->opts = *opts;
    if (ps->opts.zstd_level < ZSTD_minCLevel() || ps->opts.zstd_level > ZSTD_maxCLevel()) {
        kvb_free(ps);
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "zstd level %d out of range %d..%d", opts->zstd_level,
                        ZSTD_minCLevel(), ZSTD_maxCLevel());
    }
    ps->dir = kvb_strndup(dir, strlen(dir));
    if (!ps->dir) {
        kvb_free(ps);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    pthread_rwlock_init(&ps->env_lock, NULL);
    pthread_mutex_init(&ps->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ps->cv_work, &ca);
    pthread_cond_init(&ps->cv_idle, &ca);
    pthread_condattr_destroy(&ca);

    enum kvb_status st = KVB_OK;
    int rc = mkdir_p(dir);
    if (rc) {
        st = kvb_errf(err, rc == ENOMEM ? KVB_ERR_NOMEM : KVB_ERR_IO, "cache directory %s: %s", dir, strerror(rc));
        goto fail;
    }
    ps->cap = effective_cap(dir, ps->opts.max_size ? ps->opts.max_size : DEFAULT_CAP);
    /* The map is address space, not disk: twice the cap leaves room for
     * LMDB's page overhead, free-list fragmentation and pages held by long
     * readers (verify) while GC keeps the data at the cap. */
    ps->map_size = ps->opts.map_size;
    if (!ps->map_size) {
        uint64_t a = 2 * ps->cap, b = ps->cap + 256 * MIB;
        ps->map_size = a > b ? a : b;
    }
    ps->map_size = (ps->map_size + MIB - 1) / MIB * MIB;

    pstore_guard_install();
    if ((st = open_checked(ps, err)) != KVB_OK) goto fail;
    if ((st = open_dbs(ps, err)) != KVB_OK) goto fail;
    if ((st = pstore_writer_start(ps, err)) != KVB_OK) goto fail;
    *out = ps;
    return KVB_OK;
fail:
    pstore_close(ps);
    return st;
}

void pstore_close(struct pstore *ps)
{
    if (!ps) return;
    pstore_writer_stop(ps);
    tpool_free(ps->pool);
    for (int i = 0; i < ps->n_rcodec; i++) pstore_codec_free(&ps->rcodec[i]);
    kvb_free(ps->rcodec);
    tpool_free(ps->wpool);
    for (int i = 0; i < ps->n_wcodec; i++) pstore_codec_free(&ps->wcodec[i]);
    kvb_free(ps->wcodec);
    if (ps->env) mdb_env_close(ps->env);
    for (struct pstore_put_item *it = ps->q_head, *nx; it; it = nx) {
        nx = it->next;
        pstore_item_free(it);
    }
    kvb_free(ps->models);
    kvb_free(ps->touches);
    kvb_free(ps->damage);
    pthread_cond_destroy(&ps->cv_work);
    pthread_cond_destroy(&ps->cv_idle);
    pthread_mutex_destroy(&ps->mu);
    pthread_rwlock_destroy(&ps->env_lock);
    kvb_free(ps->dir);
    kvb_free(ps);
}

uint64_t pstore_max_size(const struct pstore *ps) { return ps ? ps->cap : 0; }

uint64_t pstore_queue_bytes(const struct pstore *ps)
{
    return !ps ? 0 : ps->opts.queue_bytes ? ps->opts.queue_bytes : PSTORE_QUEUE_MAX_BYTES;
}

/* ---- models ------------------------------------------------------------------- */

int pstore_model_index_locked(struct pstore *ps, const struct pstore_model *m, struct kvb_err *err)
{
    struct pstore_shape s;
    if (pstore_shape_init(m, &s, err) != KVB_OK) return -1;
    for (int i = 0; i < ps->n_models; i++)
        if (!memcmp(ps->models[i].shape.identity, s.identity, 16)) return i;
    if (ps->n_models == ps->cap_models) {
        int nc = ps->cap_models ? 2 * ps->cap_models : 4;
        struct pstore_known_model *p = kvb_realloc(ps->models, (size_t)nc * sizeof *p);
        if (!p) {
            kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
            return -1;
        }
        ps->models = p;
        ps->cap_models = nc;
    }
    struct pstore_known_model *k = &ps->models[ps->n_models];
    memset(k, 0, sizeof *k);
    k->shape = s;
    memcpy(k->rec.identity, s.identity, 16);
    for (int i = 0; i < 32; i++) {
        char c = m->fingerprint[i];
        k->rec.fingerprint[i] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
    }
    snprintf(k->rec.name, sizeof k->rec.name, "%s", m->name ? m->name : "");
    k->rec.dtype = m->dtype;
    k->rec.block_size = m->block_size;
    k->rec.n_layer = m->n_layer;
    k->rec.kv_dim = m->kv_dim;
    return ps->n_models++;
}

/* ---- loading --------------------------------------------------------------------- */

enum kvb_status pstore_readers_ensure(struct pstore *ps, struct kvb_err *err)
{
    if (ps->rcodec) return KVB_OK;
    int n = ps->opts.n_threads > 0 ? ps->opts.n_threads : tpool_cpu_count();
    if (n > 1) {
        enum kvb_status st = tpool_create(n, &ps->pool);
        if (st != KVB_OK) return kvb_errf(err, st, "cache decompression threads: %s", kvb_strerror(st));
        n = tpool_size(ps->pool);
    }
    ps->rcodec = kvb_calloc((size_t)n, sizeof *ps->rcodec);
    if (!ps->rcodec) {
        tpool_free(ps->pool);
        ps->pool = NULL;
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    ps->n_rcodec = n;
    return KVB_OK;
}

struct load_job {
    struct pstore *ps;
    const struct pstore_shape *s;
    const int32_t *tokens; /* tokens of block 0 of the batch */
    const MDB_val *vals;
    void *const *dst;
    const struct pstore_annex *annex; /* (n) or NULL */
    enum kvb_status *status;
    int32_t n;
    atomic_int next;
    atomic_int first_fail; /* no block after it needs decoding */
    atomic_int fault_sig;  /* a decoding thread's read of the map faulted (pstore_guard.c): its signal */
};

/* Decodes values straight from the map: in a guarded region of this
 * thread, so a value whose pages went away under the process (the file
 * truncated by another) ends this worker, not the process. */
static void load_worker(void *arg, int ith, int nth)
{
    struct load_job *j = arg;
    (void)nth;
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) {
        atomic_store(&j->fault_sig, g.sig ? g.sig : 1);
        atomic_store(&j->first_fail, -1); /* nothing of this load is used */
        return;
    }
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n || i > atomic_load(&j->first_fail)) break;
        j->status[i] = pstore_codec_decode(&j->ps->rcodec[ith], j->s, j->tokens + (size_t)i * j->s->block_size,
                                           j->ps->opts.lossy8, j->vals[i].mv_data, j->vals[i].mv_size, j->dst[i],
                                           j->annex ? &j->annex[i] : NULL, NULL);
        if (j->status[i] != KVB_OK) {
            int f = atomic_load(&j->first_fail);
            while (i < f && !atomic_compare_exchange_weak(&j->first_fail, &f, i)) {}
        }
    }
    pstore_guard_pop(&g);
}

enum kvb_status pstore_load_chain(struct pstore *ps, const struct pstore_model *m, const int32_t *tokens,
                                  const struct pstore_key *keys, int32_t from, int32_t n, void *const *dst,
                                  int32_t *n_loaded, struct kvb_err *err)
{
    return pstore_load_chain_annex(ps, m, tokens, keys, from, n, dst, NULL, n_loaded, err);
}

enum kvb_status pstore_load_chain_annex(struct pstore *ps, const struct pstore_model *m, const int32_t *tokens,
                                        const struct pstore_key *keys, int32_t from, int32_t n, void *const *dst,
                                        const struct pstore_annex *annex, int32_t *n_loaded, struct kvb_err *err)
{
    if (n_loaded) *n_loaded = 0;
    if (!ps || !m || !tokens || !keys || !dst || !n_loaded || from < 0)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "pstore_load_chain: bad argument");
    if (from >= n || atomic_load(&ps->broken)) return KVB_OK; /* a store turned off after a fault: a miss */
    struct pstore_shape s;
    KVB_FORWARD_IF_ERROR(pstore_shape_init(m, &s, err));
    KVB_FORWARD_IF_ERROR(pstore_readers_ensure(ps, err));
    int32_t want = n - from;
    MDB_val *vals = kvb_malloc((size_t)want * sizeof *vals);
    enum kvb_status *status = kvb_malloc((size_t)want * sizeof *status);
    if (!vals || !status) {
        kvb_free(vals);
        kvb_free(status);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) { /* the file changed under this process: a miss, and the store off */
        pstore_guard_fault(ps, &g, "loading a prefix");
        kvb_free(vals);
        kvb_free(status);
        return KVB_OK;
    }
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, false, &txn);
    if (rc) {
        pstore_guard_pop(&g);
        kvb_free(vals);
        kvb_free(status);
        return atomic_load(&ps->broken) ? KVB_OK : pstore_lmdb_status(err, rc, "cache read");
    }
    enum kvb_status st = KVB_OK;
    int32_t cnt = 0;
    for (; cnt < want; cnt++) {
        MDB_val k = {16, (void *)keys[from + cnt].b};
        rc = mdb_get(txn, ps->db_blocks, &k, &vals[cnt]);
        if (rc == MDB_NOTFOUND) break;
        if (rc) {
            st = pstore_lmdb_status(err, rc, "cache read");
            break;
        }
    }
    struct load_job job = {ps, &s, tokens + (size_t)from * s.block_size, vals, dst, annex, status, cnt, 0, cnt, 0};
    if (cnt == 1 || !ps->pool) load_worker(&job, 0, 1);
    else if (cnt > 1) tpool_run(ps->pool, load_worker, &job);
    const int fault = atomic_load(&job.fault_sig);
    int32_t ok = 0;
    uint64_t bytes = 0;
    while (!fault && ok < cnt && status[ok] == KVB_OK) bytes += vals[ok++].mv_size;

    bool damaged = false;
    struct kvb_err derr = {{0}};
    uint64_t bad_hash = 0;
    if (!fault && ok < cnt && status[ok] != KVB_ERR_NOT_FOUND) {
        /* Decode it again for the message: failures are rare, and the
         * parallel path keeps no per-block messages. */
        enum kvb_status dst_st =
            pstore_codec_decode(&ps->rcodec[0], &s, tokens + (size_t)(from + ok) * s.block_size, ps->opts.lossy8,
                                vals[ok].mv_data, vals[ok].mv_size, dst[ok], annex ? &annex[ok] : NULL, &derr);
        if (dst_st == KVB_ERR_FORMAT) damaged = true;
        else if (dst_st != KVB_OK && dst_st != KVB_ERR_NOT_FOUND && st == KVB_OK)
            st = kvb_errf(err, dst_st, "cache read: %s", derr.msg);
        if (damaged) bad_hash = XXH3_64bits(vals[ok].mv_data, vals[ok].mv_size); /* before ps->mu: it reads the map */
    }
    pstore_txn_abort(ps, txn);
    pstore_guard_pop(&g);
    if (fault) {
        pstore_guard_off(ps, fault, "", "decoding a cached block");
        kvb_free(vals);
        kvb_free(status);
        return KVB_OK;
    }
    pthread_mutex_lock(&ps->mu);
    ps->stats.blocks_loaded += (uint64_t)ok;
    ps->stats.bytes_read += bytes;
    for (int32_t i = 0; i < ok; i++) pstore_queue_touch_locked(ps, &keys[from + i]);
    if (damaged) {
        ps->stats.damaged++;
        pstore_queue_damage_locked(ps, &keys[from + ok], bad_hash, vals[ok].mv_size);
        if (!ps->warned_damage && !ps->opts.quiet) {
            char hex[33];
            pstore_hex16(keys[from + ok].b, hex);
            fprintf(stderr,
                    "kvbatch: persistent cache: damaged value %s in %s (%s): treated as a miss and removed; "
                    "further damage is counted, not logged\n",
                    hex, ps->dir, derr.msg);
        }
        ps->warned_damage = true;
    }
    pthread_cond_signal(&ps->cv_work);
    pthread_mutex_unlock(&ps->mu);
    kvb_free(vals);
    kvb_free(status);
    *n_loaded = ok;
    return st;
}

/* ---- presence and puts ----------------------------------------------------------- */

bool pstore_contains(struct pstore *ps, const struct pstore_key *key) { return pstore_contains_annex(ps, key, 0); }

bool pstore_contains_annex(struct pstore *ps, const struct pstore_key *key, size_t annex_len)
{
    if (!ps || !key) return false;
    bool queued = false;
    pthread_mutex_lock(&ps->mu);
    for (struct pstore_put_item *it = ps->q_head; it && !queued; it = it->next)
        queued = !memcmp(it->key.b, key->b, 16) && (annex_len == 0 || it->annex_len == annex_len);
    pthread_mutex_unlock(&ps->mu);
    if (queued) return true;
    if (atomic_load(&ps->broken)) return false;
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) {
        pstore_guard_fault(ps, &g, "looking a block up");
        return false;
    }
    MDB_txn *txn;
    bool have = false;
    if (!pstore_txn_begin(ps, false, &txn)) {
        MDB_val k = {16, (void *)key->b}, v;
        have = mdb_get(txn, ps->db_blocks, &k, &v) == 0 && pstore_value_acceptable(ps, v.mv_data, v.mv_size, annex_len);
        pstore_txn_abort(ps, txn);
    }
    pstore_guard_pop(&g);
    return have;
}

/* Whether a put of one block (sz bytes queued) with `ahead` more already
 * promised fits the queue's bounds now. Called with ps->mu held. */
static bool queue_full_locked(struct pstore *ps, size_t sz, uint64_t ahead)
{
    const uint64_t max_bytes = pstore_queue_bytes(ps);
    const uint64_t max_items =
        PSTORE_QUEUE_MAX_ITEMS * (max_bytes > PSTORE_QUEUE_MAX_BYTES ? max_bytes / PSTORE_QUEUE_MAX_BYTES : 1);
    const uint64_t n = ps->q_n + ahead;
    return n >= max_items || (n > 0 && ps->q_bytes + (ahead + 1) * sz > max_bytes);
}

static size_t put_size(const struct pstore_shape *s)
{
    return sizeof(struct pstore_put_item) + (size_t)s->block_size * sizeof(int32_t) + (size_t)s->raw_len;
}

bool pstore_put_admit(struct pstore *ps, const struct pstore_model *m, int32_t ahead)
{
    if (!ps || !m) return false;
    struct kvb_err err;
    pthread_mutex_lock(&ps->mu);
    int mi = pstore_model_index_locked(ps, m, &err);
    bool ok = mi >= 0 && !ps->stats.writing_disabled &&
              !queue_full_locked(ps, put_size(&ps->models[mi].shape), ahead > 0 ? (uint64_t)ahead : 0);
    if (!ok) ps->stats.blocks_dropped++;
    pthread_mutex_unlock(&ps->mu);
    return ok;
}

/* Queues a put; data is copied unless release is set (then it is borrowed
 * and handed back through release, also on every drop). */
static enum kvb_status put_item(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                                const struct pstore_key *parent, const int32_t *tokens, const void *data,
                                const struct pstore_annex *annex, void (*release)(void *ctx, const void *data),
                                void *ctx)
{
    const size_t an = annex && annex->data ? annex->len : 0;
    struct kvb_err err;
    if (!ps || !m || !key || !tokens || !data || an > PSTORE_MAX_ANNEX) {
        if (release && data) release(ctx, data);
        return KVB_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&ps->mu);
    int mi = pstore_model_index_locked(ps, m, &err);
    if (mi < 0) {
        pthread_mutex_unlock(&ps->mu);
        if (release) release(ctx, data);
        return KVB_ERR_INVALID_ARG;
    }
    const struct pstore_shape *s = &ps->models[mi].shape;
    size_t tok_bytes = (size_t)s->block_size * sizeof(int32_t);
    size_t sz = put_size(s) + an;
    if (ps->stats.writing_disabled || queue_full_locked(ps, sz, 0)) {
        ps->stats.blocks_dropped++;
        pthread_mutex_unlock(&ps->mu);
        if (release) release(ctx, data);
        return KVB_OK;
    }
    size_t raw_len = (size_t)s->raw_len;
    pthread_mutex_unlock(&ps->mu);

    /* Copy outside the lock: the writer may be taking a batch meanwhile. */
    struct pstore_put_item *it = kvb_malloc(release ? sizeof *it + tok_bytes + an : sz);
    if (!it) {
        pthread_mutex_lock(&ps->mu);
        ps->stats.blocks_dropped++;
        pthread_mutex_unlock(&ps->mu);
        if (release) release(ctx, data);
        return KVB_OK;
    }
    it->next = NULL;
    it->key = *key;
    it->has_parent = parent != NULL;
    if (parent) it->parent = *parent;
    else memset(&it->parent, 0, sizeof it->parent);
    it->model = mi;
    it->tokens = (int32_t *)(it + 1);
    it->alloc_len = sz;
    it->release = release;
    it->release_ctx = ctx;
    memcpy(it->tokens, tokens, tok_bytes);
    uint8_t *own = (uint8_t *)it->tokens + tok_bytes; /* the annex, then (not borrowed) the data */
    it->annex = an ? own : NULL;
    it->annex_len = an;
    if (an) memcpy(own, annex->data, an);
    if (release) {
        it->data = data;
    } else {
        memcpy(own + an, data, raw_len);
        it->data = own + an;
    }

    pthread_mutex_lock(&ps->mu);
    if (ps->q_tail) ps->q_tail->next = it;
    else ps->q_head = it;
    ps->q_tail = it;
    ps->q_n++;
    ps->q_bytes += sz;
    pthread_cond_signal(&ps->cv_work);
    pthread_mutex_unlock(&ps->mu);
    return KVB_OK;
}

enum kvb_status pstore_put(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                           const struct pstore_key *parent, const int32_t *tokens, const void *data)
{
    return put_item(ps, m, key, parent, tokens, data, NULL, NULL, NULL);
}

enum kvb_status pstore_put_borrowed(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                                    const struct pstore_key *parent, const int32_t *tokens, const void *data,
                                    void (*release)(void *ctx, const void *data), void *ctx)
{
    return pstore_put_borrowed_annex(ps, m, key, parent, tokens, data, NULL, release, ctx);
}

enum kvb_status pstore_put_borrowed_annex(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                                          const struct pstore_key *parent, const int32_t *tokens, const void *data,
                                          const struct pstore_annex *annex,
                                          void (*release)(void *ctx, const void *data), void *ctx)
{
    if (!release) return KVB_ERR_INVALID_ARG;
    return put_item(ps, m, key, parent, tokens, data, annex, release, ctx);
}

void pstore_flush(struct pstore *ps)
{
    if (!ps) return;
    pthread_mutex_lock(&ps->mu);
    ps->flushing++;
    pthread_cond_signal(&ps->cv_work);
    while (ps->writer_running && (ps->q_n || ps->n_touches || ps->n_damage || ps->busy))
        pthread_cond_wait(&ps->cv_idle, &ps->mu);
    ps->flushing--;
    pthread_mutex_unlock(&ps->mu);
}

void pstore_get_stats(const struct pstore *ps, struct pstore_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!ps) return;
    /* The mutex is the only thing written; the struct is not const-defined. */
    pthread_mutex_t *mu = (pthread_mutex_t *)&ps->mu;
    pthread_mutex_lock(mu);
    *out = ps->stats;
    pthread_mutex_unlock(mu);
}
