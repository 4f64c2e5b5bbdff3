/* metrics_writer.c — the request rows of a metrics database, written by a
 * thread of their own so that the caller (the engine) never waits on
 * SQLite.
 *
 * A write waits for SQLite's write lock, and another process may hold it
 * for as long as it likes (a `sqlite3` shell in a transaction, a report
 * copying the file): on the engine thread every batch would wait out the
 * busy timeout, and a 12 s job took 67 s while another process held the
 * lock for 60 s. Here metrics_writer_add only appends to a queue in memory;
 * the thread writes a batch (one transaction) when METRICS_BATCH_ROWS rows
 * are queued or the oldest has waited METRICS_BATCH_SECONDS, through a
 * connection of its own, and a batch that fails stays at the head of the
 * queue and is tried again a little later, with the rows that arrived
 * meanwhile queued behind it: nothing is lost while the lock is busy, only
 * late. metrics_writer_drain waits, bounded, until the queue is empty; what
 * is still queued after it is counted and the reason kept, so the caller can
 * say how many rows could not be written and why.
 *
 * The queue holds at most METRICS_MAX_PENDING rows; past that rows are
 * refused (counted), so that a database that never comes back cannot eat
 * memory. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "store/metrics/metrics_internal.h"

/* One queued request row. Strings live in the buffer's pool; NO_STR stands
 * for SQL NULL. */
#define NO_STR SIZE_MAX
struct row {
    int64_t run_id, input_line;
    int64_t prompt_tokens, cached_tokens_run, cached_tokens_store, completion_tokens;
    double queue_s, ttft_s, tpot_s, e2e_s;
    bool has_timing, has_tpot;
    int status_code;
    size_t custom_id, finish_reason, error_code, error_message; /* offsets into pool, or NO_STR */
    double submitted_at, started_at, first_token_at, ended_at;  /* unix seconds; <= 0: NULL */
    int64_t preemptions, restored_tokens;
};

struct rowbuf {
    struct row *rows;
    size_t n, cap;
    char *pool;
    size_t pool_len, pool_cap;
};

/* After a failed batch, the next try waits this long (or less, for a
 * drain): the busy timeout itself already waited. */
#define RETRY_SECONDS 1.0

struct metrics_writer {
    char *path;
    pthread_mutex_t mu;     /* everything below but the connection */
    pthread_cond_t cv_work; /* the thread: rows queued, a drain, stop */
    pthread_cond_t cv_done; /* drains: an attempt finished */
    struct rowbuf queue;    /* rows added and not yet taken by the thread */
    struct rowbuf batch;    /* rows being written, or that failed and wait for a retry */
    double oldest_at;       /* monotonic time of the oldest queued or batched row */
    double retry_at;        /* after a failure: not before this (unless draining) */
    int batch_rows;
    double batch_seconds;
    int busy_ms;
    double deadline;   /* > 0 while a drain waits: attempts keep their busy wait inside it */
    int draining;      /* drains waiting */
    uint64_t attempts; /* write attempts finished */
    bool started, stop, busy;
    pthread_t thread;
    struct metrics_counters counters; /* rows_pending computed on read */
    int64_t rows_refused;
    char last_err[sizeof(struct kvb_err)]; /* why the last attempt failed ("" after a success) */
    /* the thread's (or, without one, the caller's) connection */
    sqlite3 *sql;
    sqlite3_stmt *st_begin, *st_commit, *st_rollback, *st_insert;
};

static double now_mono(void) { return kvb_clock_s(); }

static struct timespec abs_time(double mono_s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)floor(mono_s);
    ts.tv_nsec = (long)((mono_s - floor(mono_s)) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* ---- buffers ------------------------------------------------------------------------ */

static void rowbuf_free(struct rowbuf *b)
{
    kvb_free(b->rows);
    kvb_free(b->pool);
    memset(b, 0, sizeof *b);
}

static size_t pool_add(struct rowbuf *b, const char *s, size_t n, bool *oom)
{
    if (!s) return NO_STR;
    if (b->pool_len + n + 1 > b->pool_cap) {
        size_t cap = b->pool_cap ? b->pool_cap : 4096;
        while (cap < b->pool_len + n + 1) cap *= 2;
        char *p = kvb_realloc(b->pool, cap);
        if (!p) {
            *oom = true;
            return NO_STR;
        }
        b->pool = p;
        b->pool_cap = cap;
    }
    memcpy(b->pool + b->pool_len, s, n);
    b->pool[b->pool_len + n] = '\0';
    b->pool_len += n + 1;
    return b->pool_len - n - 1;
}

static bool rowbuf_reserve(struct rowbuf *b, size_t n)
{
    if (n <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < n) cap *= 2;
    struct row *p = kvb_realloc(b->rows, cap * sizeof *p);
    if (!p) return false;
    b->rows = p;
    b->cap = cap;
    return true;
}

/* Appends src's rows to dst (strings copied); false when out of memory
 * (dst unchanged). */
static bool rowbuf_append(struct rowbuf *dst, const struct rowbuf *src)
{
    size_t n0 = dst->n, p0 = dst->pool_len;
    if (!rowbuf_reserve(dst, dst->n + src->n)) return false;
    bool oom = false;
    for (size_t i = 0; i < src->n && !oom; i++) {
        struct row r = src->rows[i];
        size_t *s[4] = {&r.custom_id, &r.finish_reason, &r.error_code, &r.error_message};
        for (int k = 0; k < 4; k++)
            if (*s[k] != NO_STR) {
                const char *str = src->pool + *s[k];
                *s[k] = pool_add(dst, str, strlen(str), &oom);
            }
        dst->rows[dst->n++] = r;
    }
    if (oom) {
        dst->n = n0;
        dst->pool_len = p0;
    }
    return !oom;
}

/* ---- one attempt ------------------------------------------------------------------------ */

static enum kvb_status wsql_err(struct metrics_writer *w, struct kvb_err *err, int rc, const char *what)
{
    return metrics_sql_err(w->sql, w->path, err, rc, what);
}

static void close_conn(struct metrics_writer *w)
{
    sqlite3_finalize(w->st_begin);
    sqlite3_finalize(w->st_commit);
    sqlite3_finalize(w->st_rollback);
    sqlite3_finalize(w->st_insert);
    sqlite3_close(w->sql);
    w->st_begin = w->st_commit = w->st_rollback = w->st_insert = NULL;
    w->sql = NULL;
}

static enum kvb_status open_conn(struct metrics_writer *w, struct kvb_err *err)
{
    if (w->sql) return KVB_OK;
    int rc = sqlite3_open_v2(w->path, &w->sql, SQLITE_OPEN_READWRITE, NULL);
    const char *what = "opening a connection for request rows";
    if (rc == SQLITE_OK) rc = sqlite3_exec(w->sql, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(w->sql, "BEGIN IMMEDIATE", -1, SQLITE_PREPARE_PERSISTENT, &w->st_begin, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_prepare_v3(w->sql, "COMMIT", -1, SQLITE_PREPARE_PERSISTENT, &w->st_commit, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(w->sql, "ROLLBACK", -1, SQLITE_PREPARE_PERSISTENT, &w->st_rollback, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(
            w->sql,
            "INSERT INTO requests (run_id, custom_id, input_line, prompt_tokens, cached_tokens_run,"
            " cached_tokens_store, completion_tokens, queue_s, ttft_s, tpot_s, e2e_s, finish_reason,"
            " error_code, status_code, error_message, submitted_at, started_at, first_token_at, ended_at,"
            " preemptions, restored_tokens)"
            " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21)",
            -1, SQLITE_PREPARE_PERSISTENT, &w->st_insert, NULL);
    if (rc != SQLITE_OK) {
        enum kvb_status st = wsql_err(w, err, rc, what);
        close_conn(w);
        return st;
    }
    return KVB_OK;
}

static int bind_str(sqlite3_stmt *st, int i, const struct rowbuf *b, size_t off)
{
    /* STATIC: the pool is not touched until the statement is reset. */
    return off == NO_STR ? sqlite3_bind_null(st, i) : sqlite3_bind_text(st, i, b->pool + off, -1, SQLITE_STATIC);
}

static int bind_time(sqlite3_stmt *st, int i, bool present, double v)
{
    return present && isfinite(v) ? sqlite3_bind_double(st, i, v) : sqlite3_bind_null(st, i);
}

static int insert_row(struct metrics_writer *w, const struct rowbuf *b, const struct row *r)
{
    sqlite3_stmt *st = w->st_insert;
    int rc = sqlite3_bind_int64(st, 1, r->run_id);
    if (rc == SQLITE_OK) rc = bind_str(st, 2, b, r->custom_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 3, r->input_line);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 4, r->prompt_tokens);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 5, r->cached_tokens_run);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 6, r->cached_tokens_store);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 7, r->completion_tokens);
    if (rc == SQLITE_OK) rc = bind_time(st, 8, r->has_timing, r->queue_s);
    if (rc == SQLITE_OK) rc = bind_time(st, 9, r->has_timing, r->ttft_s);
    if (rc == SQLITE_OK) rc = bind_time(st, 10, r->has_timing && r->has_tpot, r->tpot_s);
    if (rc == SQLITE_OK) rc = bind_time(st, 11, r->has_timing, r->e2e_s);
    if (rc == SQLITE_OK) rc = bind_str(st, 12, b, r->finish_reason);
    if (rc == SQLITE_OK) rc = bind_str(st, 13, b, r->error_code);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 14, r->status_code);
    if (rc == SQLITE_OK) rc = bind_str(st, 15, b, r->error_message);
    if (rc == SQLITE_OK) rc = bind_time(st, 16, r->submitted_at > 0, r->submitted_at);
    if (rc == SQLITE_OK) rc = bind_time(st, 17, r->started_at > 0, r->started_at);
    if (rc == SQLITE_OK) rc = bind_time(st, 18, r->first_token_at > 0, r->first_token_at);
    if (rc == SQLITE_OK) rc = bind_time(st, 19, r->ended_at > 0, r->ended_at);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 20, r->preemptions);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 21, r->restored_tokens);
    if (rc == SQLITE_OK) rc = metrics_step_reset(st);
    return rc;
}

/* Writes b in one transaction, waiting at most busy_ms for the lock. */
static enum kvb_status write_rows(struct metrics_writer *w, const struct rowbuf *b, int busy_ms, struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(open_conn(w, err));
    sqlite3_busy_timeout(w->sql, busy_ms);
    int rc = metrics_step_reset(w->st_begin);
    if (rc != SQLITE_OK) return wsql_err(w, err, rc, "locking the database to write request rows");
    for (size_t i = 0; rc == SQLITE_OK && i < b->n; i++) rc = insert_row(w, b, &b->rows[i]);
    sqlite3_clear_bindings(w->st_insert);
    if (rc == SQLITE_OK) rc = metrics_step_reset(w->st_commit);
    if (rc != SQLITE_OK) {
        enum kvb_status st = wsql_err(w, err, rc, "writing request rows");
        metrics_step_reset(w->st_rollback);
        return st;
    }
    return KVB_OK;
}

/* Takes the queue into the batch and writes it. Called with mu held, by
 * the thread (or, without one, by a drain); releases mu while writing. */
static void attempt_locked(struct metrics_writer *w)
{
    if (w->batch.n == 0) {
        struct rowbuf t = w->batch;
        w->batch = w->queue;
        w->queue = t;
        w->queue.n = w->queue.pool_len = 0;
    } else if (w->queue.n && rowbuf_append(&w->batch, &w->queue)) {
        w->queue.n = w->queue.pool_len = 0;
    }
    int busy_ms = w->busy_ms;
    if (w->deadline > 0) {
        double left = w->deadline - now_mono();
        int ms = left > 0 ? (int)(left * 1e3) : 0;
        if (ms < busy_ms) busy_ms = ms;
    }
    w->busy = true;
    pthread_mutex_unlock(&w->mu);
    struct kvb_err e = {{0}};
    enum kvb_status st = write_rows(w, &w->batch, busy_ms, &e);
    pthread_mutex_lock(&w->mu);
    w->busy = false;
    w->attempts++;
    if (st == KVB_OK) {
        w->counters.rows_written += (int64_t)w->batch.n;
        w->counters.batches_written++;
        w->batch.n = w->batch.pool_len = 0;
        w->last_err[0] = '\0';
        w->retry_at = 0;
        if (w->queue.n) w->oldest_at = now_mono(); /* near enough: they came during the write */
    } else {
        w->counters.flush_failures++;
        snprintf(w->last_err, sizeof w->last_err, "%s", e.msg);
        w->retry_at = now_mono() + RETRY_SECONDS;
    }
    pthread_cond_broadcast(&w->cv_done);
}

static size_t pending(const struct metrics_writer *w) { return w->queue.n + w->batch.n; }

static void *writer_main(void *arg)
{
    struct metrics_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (pending(w) == 0) {
            if (w->stop) break;
            pthread_cond_wait(&w->cv_work, &w->mu);
            continue;
        }
        double now = now_mono();
        double due_at = w->draining || w->stop ? now : w->oldest_at + w->batch_seconds;
        if (!w->draining && !w->stop && pending(w) >= (size_t)w->batch_rows) due_at = now;
        if (w->retry_at > due_at && !w->stop) due_at = w->retry_at;
        if (w->stop && w->deadline > 0 && now >= w->deadline) break; /* closing, and out of time */
        if (w->stop && w->deadline == 0) break;
        if (due_at > now) {
            struct timespec ts = abs_time(due_at);
            pthread_cond_timedwait(&w->cv_work, &w->mu, &ts);
            continue;
        }
        attempt_locked(w);
    }
    pthread_cond_broadcast(&w->cv_done);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- the interface ------------------------------------------------------------------------ */

enum kvb_status metrics_writer_create(const char *path, int batch_rows, double batch_seconds, int busy_ms,
                                      struct metrics_writer **out, struct kvb_err *err)
{
    *out = NULL;
    struct metrics_writer *w = kvb_calloc(1, sizeof *w);
    if (!w) return kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory opening the metrics database", path);
    w->path = kvb_strndup(path, strlen(path));
    if (!w->path) {
        kvb_free(w);
        return kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory opening the metrics database", path);
    }
    w->batch_rows = batch_rows;
    w->batch_seconds = batch_seconds;
    w->busy_ms = busy_ms;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv_work, &ca);
    pthread_cond_init(&w->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    *out = w;
    return KVB_OK;
}

/* Waits until nothing is pending or `seconds` have passed (an attempt
 * under way when they do is waited for: its busy wait ends by then). Mu
 * held. */
static void drain_locked(struct metrics_writer *w, double seconds)
{
    double deadline = now_mono() + (seconds > 0 ? seconds : 0);
    w->draining++;
    if (w->deadline == 0 || deadline < w->deadline) w->deadline = deadline;
    w->retry_at = 0;
    pthread_cond_broadcast(&w->cv_work);
    const uint64_t a0 = w->attempts;
    for (;;) {
        double now = now_mono();
        if (pending(w) == 0 && !w->busy) break;
        /* At least one attempt, even with no time to wait (its busy wait is
         * then zero): a close after a drain that gave up still writes what
         * it can. */
        if (!w->busy && now >= deadline && w->attempts > a0) break;
        if (w->started) {
            struct timespec ts = abs_time(w->busy || now + 0.05 > deadline ? now + 0.05 : deadline);
            pthread_cond_timedwait(&w->cv_done, &w->mu, &ts);
        } else if (w->retry_at > now) {
            /* No thread (none could be started): write from here, pausing
             * between failed attempts as the thread would. */
            double until = w->retry_at < deadline ? w->retry_at : deadline;
            pthread_mutex_unlock(&w->mu);
            struct timespec ts = {(time_t)(until - now), (long)((until - now - floor(until - now)) * 1e9)};
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&w->mu);
        } else {
            attempt_locked(w);
        }
    }
    if (--w->draining == 0) w->deadline = 0;
}

void metrics_writer_free(struct metrics_writer *w, double drain_seconds)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    if (pending(w) > 0) drain_locked(w, drain_seconds);
    w->stop = true;
    w->deadline = 0;
    pthread_cond_broadcast(&w->cv_work);
    bool started = w->started;
    pthread_mutex_unlock(&w->mu);
    if (started) pthread_join(w->thread, NULL);
    close_conn(w);
    rowbuf_free(&w->queue);
    rowbuf_free(&w->batch);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_done);
    pthread_mutex_destroy(&w->mu);
    kvb_free(w->path);
    kvb_free(w);
}

enum kvb_status metrics_writer_add(struct metrics_writer *w, int64_t run_id, const struct metrics_request *req,
                                   struct kvb_err *err)
{
    pthread_mutex_lock(&w->mu);
    enum kvb_status st = KVB_OK;
    if (pending(w) >= METRICS_MAX_PENDING) {
        w->rows_refused++;
        st = kvb_errf(err, KVB_ERR_RANGE, "%s: %d request rows wait to be written (%s); row of line %lld dropped",
                      w->path, METRICS_MAX_PENDING, w->last_err[0] ? w->last_err : "the database is slow",
                      (long long)req->input_line);
        goto out;
    }
    struct rowbuf *q = &w->queue;
    if (!rowbuf_reserve(q, q->n + 1)) {
        st = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory buffering a request row", w->path);
        goto out;
    }
    size_t mark = q->pool_len;
    bool oom = false;
    struct row *r = &q->rows[q->n];
    r->custom_id = req->custom_id ? pool_add(q, req->custom_id, strlen(req->custom_id), &oom) : NO_STR;
    r->finish_reason = req->finish_reason ? pool_add(q, req->finish_reason, strlen(req->finish_reason), &oom) : NO_STR;
    r->error_code = req->error_code ? pool_add(q, req->error_code, strlen(req->error_code), &oom) : NO_STR;
    r->error_message = req->error_message ? pool_add(q, req->error_message, strlen(req->error_message), &oom) : NO_STR;
    if (oom) {
        q->pool_len = mark;
        st = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory buffering a request row", w->path);
        goto out;
    }
    r->run_id = run_id;
    r->input_line = req->input_line;
    r->prompt_tokens = req->prompt_tokens;
    r->cached_tokens_run = req->cached_tokens_run;
    r->cached_tokens_store = req->cached_tokens_store;
    r->completion_tokens = req->completion_tokens;
    r->has_timing = req->has_timing;
    r->has_tpot = req->completion_tokens >= 2;
    r->queue_s = req->queue_s;
    r->ttft_s = req->ttft_s;
    r->tpot_s = req->tpot_s;
    r->e2e_s = req->e2e_s;
    r->status_code = req->status_code;
    r->submitted_at = req->submitted_at;
    r->started_at = req->started_at;
    r->first_token_at = req->first_token_at;
    r->ended_at = req->ended_at;
    r->preemptions = req->preemptions;
    r->restored_tokens = req->restored_tokens;
    if (pending(w) == 0) w->oldest_at = now_mono();
    q->n++;
    if (!w->started) {
        /* Started on the first row: a handle that only reads never has one.
         * Without it (no thread to be had), drains write from the caller. */
        w->started = pthread_create(&w->thread, NULL, writer_main, w) == 0;
    }
    if (pending(w) >= (size_t)w->batch_rows) pthread_cond_signal(&w->cv_work);
    else if (pending(w) == 1) pthread_cond_signal(&w->cv_work); /* arm the age trigger */
out:
    pthread_mutex_unlock(&w->mu);
    return st;
}

enum kvb_status metrics_writer_drain(struct metrics_writer *w, double seconds, struct kvb_err *err)
{
    pthread_mutex_lock(&w->mu);
    double t0 = now_mono();
    if (pending(w) > 0 || w->busy) drain_locked(w, seconds);
    enum kvb_status st = KVB_OK;
    size_t left = pending(w);
    if (left > 0)
        st = kvb_errf(err, KVB_ERR_IO, "%zu request rows could not be written in %.0f s: %s", left, now_mono() - t0,
                      w->last_err[0] ? w->last_err : "no attempt finished");
    pthread_mutex_unlock(&w->mu);
    return st;
}

void metrics_writer_set_batching(struct metrics_writer *w, int rows, double seconds)
{
    pthread_mutex_lock(&w->mu);
    w->batch_rows = rows;
    w->batch_seconds = seconds;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
}

void metrics_writer_set_busy_timeout(struct metrics_writer *w, int ms)
{
    pthread_mutex_lock(&w->mu);
    w->busy_ms = ms;
    pthread_mutex_unlock(&w->mu);
}

void metrics_writer_counters(struct metrics_writer *w, struct metrics_counters *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->counters;
    out->rows_pending = (int64_t)pending(w);
    out->rows_refused = w->rows_refused;
    pthread_mutex_unlock(&w->mu);
}
