/* test_metrics.c — the SQLite metrics store (store/metrics.h) and
 * `kvbatch report` (src/cli_report.c).
 *
 * Covers: schema creation and identity, reopening, batched request writes
 * (rows stay in memory until a batch is due, one transaction per batch),
 * totals given and derived, nearest-rank percentiles on known data, the
 * report's figures, two handles writing one file from two threads, refusal of
 * foreign / newer / non-SQLite files and of a missing directory, the CLI's
 * exit codes, and allocation failures. Everything lives in a fresh temporary
 * directory that is removed at the end. */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "app/cli.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "store/metrics/metrics.h"
#include "support/testutil.h"

static char tmpdir[256];

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmpdir, name); }

static double mono(void) { return kvb_clock_s(); }

/* Runs one query returning one integer on a separate raw connection: an
 * outside view of what was committed. Returns -1 on error. */
static long long raw_int(const char *path, const char *q)
{
    sqlite3 *s = NULL;
    long long v = -1;
    if (sqlite3_open_v2(path, &s, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(s, 5000);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s, q, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        else fprintf(stderr, "raw_int(%s): %s\n", q, sqlite3_errmsg(s));
        sqlite3_finalize(st);
    }
    sqlite3_close(s);
    return v;
}

static int raw_exec(const char *path, const char *q)
{
    sqlite3 *s = NULL;
    int rc = sqlite3_open_v2(path, &s, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_exec(s, q, NULL, NULL, NULL);
    sqlite3_close(s);
    return rc;
}

static struct metrics_request ok_row(int i)
{
    struct metrics_request r = {
        .custom_id = NULL,
        .input_line = i,
        .prompt_tokens = 100,
        .cached_tokens_run = 25,
        .cached_tokens_store = 10,
        .completion_tokens = 50,
        .has_timing = true,
        .queue_s = i * 1e-5,
        .ttft_s = i * 1e-3,
        .tpot_s = i * 1e-4,
        .e2e_s = i * 1e-2,
        .finish_reason = (i % 4) ? "stop" : "length",
        .error_code = NULL,
        .status_code = 200,
    };
    return r;
}

/* Shows an error message when KVB_TEST_VERBOSE is set (to read them). */
static void note(const struct kvb_err *err)
{
    if (getenv("KVB_TEST_VERBOSE")) fprintf(stderr, "  message: %s\n", err->msg);
}

/* ---- schema ------------------------------------------------------------------ */

static void test_schema(void)
{
    char path[512];
    path_in(path, sizeof path, "schema.db");
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    CHECK(db != NULL);
    CHECK(strcmp(metrics_path(db), path) == 0);
    metrics_close(db);

    CHECK_EQ_INT(raw_int(path, "PRAGMA user_version"), METRICS_SCHEMA_VERSION);
    CHECK_EQ_INT(raw_int(path, "PRAGMA application_id"), 0x4B56424D);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name IN ('runs','requests')"),
                 2);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM sqlite_master WHERE type='index' AND tbl_name='requests'"), 1);
    CHECK_EQ_INT(raw_int(path, "SELECT journal_mode='wal' FROM pragma_journal_mode"), 1);
    /* every column the issue names exists */
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN ('job_file','output_file',"
                               "'model','model_fingerprint','backend','settings','started_at','ended_at','status',"
                               "'requests_total','requests_ok','requests_failed','prompt_tokens','completion_tokens',"
                               "'cached_tokens_run','cached_tokens_store','prefill_tokens_computed',"
                               "'store_bytes_read','store_bytes_written','wall_seconds')"),
                 20);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM pragma_table_info('requests') WHERE name IN ('run_id','custom_id',"
                               "'input_line','prompt_tokens','cached_tokens_run','cached_tokens_store',"
                               "'completion_tokens','queue_s','ttft_s','tpot_s','e2e_s','finish_reason',"
                               "'error_code','status_code')"),
                 14);

    /* reopening keeps what is there */
    db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    int64_t id = 0;
    CHECK_EQ_INT(metrics_run_begin(db, &(struct metrics_run_info){.model = "m"}, &id, &err), KVB_OK);
    CHECK_EQ_INT(id, 1);
    metrics_close(db);
    db = NULL;
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_OK);
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &id, &err), KVB_OK);
    CHECK_EQ_INT(id, 2);
    metrics_close(db);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM runs WHERE status='running'"), 2);
}

/* ---- batching ----------------------------------------------------------------- */

/* Polls the counters until cond holds (the writer thread is asynchronous),
 * at most 5 s. */
#define WAIT_FOR(db, c, cond)                                                                                          \
    do {                                                                                                               \
        double t_ = mono();                                                                                            \
        for (;;) {                                                                                                     \
            metrics_get_counters(db, &(c));                                                                            \
            if ((cond) || mono() - t_ > 5.0) break;                                                                    \
            nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);                                                   \
        }                                                                                                              \
    } while (0)

static void test_batching(void)
{
    char path[512];
    path_in(path, sizeof path, "batch.db");
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    if (!db) return;
    /* Size only: a slow machine must not make the time trigger fire. */
    CHECK_EQ_INT(metrics_set_batching(db, METRICS_BATCH_ROWS, 600.0), KVB_OK);
    CHECK_EQ_INT(metrics_set_batching(db, 0, 1.0), KVB_ERR_INVALID_ARG);
    CHECK_EQ_INT(metrics_set_batching(db, 10, -1.0), KVB_ERR_INVALID_ARG);
    CHECK_EQ_INT(metrics_set_drain_timeout(db, -1.0), KVB_ERR_INVALID_ARG);
    int64_t run = 0;
    CHECK_EQ_INT(metrics_run_begin(db, &(struct metrics_run_info){.job_file = "j.jsonl"}, &run, &err), KVB_OK);
    /* the run row is written at once: another process sees it */
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM runs"), 1);

    struct metrics_counters c;
    double t0 = mono();
    char id[32];
    for (int i = 1; i <= 1000; i++) {
        struct metrics_request r = ok_row(i);
        snprintf(id, sizeof id, "req-%d", i);
        r.custom_id = id;
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
        if (i == METRICS_BATCH_ROWS - 1) {
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL); /* nothing is due: nothing happens */
            metrics_get_counters(db, &c);
            CHECK_EQ_INT(c.rows_pending, METRICS_BATCH_ROWS - 1);
            CHECK_EQ_INT(c.batches_written, 0);
            CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests"), 0);
        }
        if (i == METRICS_BATCH_ROWS) {
            /* due: the writer thread writes the batch by itself */
            WAIT_FOR(db, c, c.batches_written == 1);
            CHECK_EQ_INT(c.rows_pending, 0);
            CHECK_EQ_INT(c.batches_written, 1);
            CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests"), METRICS_BATCH_ROWS);
        }
    }
    /* A batch takes everything queued when it is due: rows that arrived
     * while the previous one was being written ride along. What is left
     * is less than a batch, waiting for more or for its age. */
    WAIT_FOR(db, c, c.rows_pending < METRICS_BATCH_ROWS);
    CHECK(c.rows_pending < METRICS_BATCH_ROWS);
    CHECK(c.batches_written >= 1 && c.batches_written <= 1000 / METRICS_BATCH_ROWS);
    CHECK_EQ_INT(c.rows_written + c.rows_pending, 1000);
    CHECK_EQ_INT(c.flush_failures, 0);
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err), KVB_OK);
    double dt = mono() - t0;
    metrics_get_counters(db, &c);
    CHECK_EQ_INT(c.rows_written, 1000);
    CHECK(c.batches_written <= 1000 / METRICS_BATCH_ROWS + 1);
    CHECK_EQ_INT(c.rows_pending, 0);
    /* A hang guard, not a speed test: the batching itself is checked by
     * the transaction count above (4 transactions take milliseconds). */
    CHECK_MSG(dt < 10.0, "1000 rows took %.2f s", dt);
    fprintf(stderr, "batching: 1000 rows in %d transactions, %.1f ms\n", (int)c.batches_written, dt * 1e3);

    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests WHERE run_id=1"), 1000);
    CHECK_EQ_INT(raw_int(path, "SELECT count(DISTINCT custom_id) FROM requests"), 1000);
    CHECK_EQ_INT(raw_int(path, "SELECT input_line FROM requests WHERE custom_id='req-777'"), 777);
    /* derived totals */
    CHECK_EQ_INT(raw_int(path, "SELECT requests_total FROM runs WHERE id=1"), 1000);
    CHECK_EQ_INT(raw_int(path, "SELECT requests_ok FROM runs WHERE id=1"), 1000);
    CHECK_EQ_INT(raw_int(path, "SELECT requests_failed FROM runs WHERE id=1"), 0);
    CHECK_EQ_INT(raw_int(path, "SELECT prompt_tokens FROM runs WHERE id=1"), 100000);
    CHECK_EQ_INT(raw_int(path, "SELECT completion_tokens FROM runs WHERE id=1"), 50000);
    CHECK_EQ_INT(raw_int(path, "SELECT cached_tokens_run FROM runs WHERE id=1"), 25000);
    CHECK_EQ_INT(raw_int(path, "SELECT cached_tokens_store FROM runs WHERE id=1"), 10000);
    CHECK_EQ_INT(raw_int(path, "SELECT prefill_tokens_computed FROM runs WHERE id=1"), 65000);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM runs WHERE id=1 AND status='ok' AND ended_at >= started_at"), 1);

    /* time trigger: a row left alone is written once it is old enough, with
     * no further call (the writer thread keeps the time) */
    CHECK_EQ_INT(metrics_set_batching(db, 1000, 0.05), KVB_OK);
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &run, &err), KVB_OK);
    struct metrics_request r = ok_row(1);
    CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    metrics_get_counters(db, &c);
    CHECK_EQ_INT(c.rows_pending, 2);
    WAIT_FOR(db, c, c.rows_pending == 0);
    CHECK_EQ_INT(c.rows_pending, 0);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests WHERE run_id=2"), 2);

    /* ending a run that does not exist */
    CHECK_EQ_INT(metrics_run_end(db, 9999, METRICS_RUN_OK, NULL, &err), KVB_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "9999") != NULL);

    /* rows queued at close are written */
    CHECK_EQ_INT(metrics_set_batching(db, 1000, 600.0), KVB_OK);
    CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    metrics_close(db);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests WHERE run_id=2"), 3);
}

/* Holds another connection's write lock for `hold` seconds. */
struct holder {
    const char *path;
    double hold;
    volatile int locked;
};

static void *hold_lock(void *p)
{
    struct holder *h = p;
    sqlite3 *other = NULL;
    sqlite3_open(h->path, &other);
    if (sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
        h->locked = 1;
        nanosleep(&(struct timespec){(time_t)h->hold, (long)((h->hold - (double)(time_t)h->hold) * 1e9)}, NULL);
        sqlite3_exec(other, "COMMIT", NULL, NULL, NULL);
    } else {
        h->locked = -1;
    }
    sqlite3_close(other);
    return NULL;
}

/* A write lock held elsewhere past the busy timeout: adding rows never
 * waits for it; the writer's attempts fail and are counted, the rows stay
 * queued, a flush with a short drain timeout says how many rows could not
 * be written and why, and once the lock is free a flush writes them. */
static void test_busy(void)
{
    char path[512];
    path_in(path, sizeof path, "busy.db");
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    if (!db) return;
    CHECK_EQ_INT(metrics_set_batching(db, 8, 600.0), KVB_OK);
    CHECK_EQ_INT(metrics_set_busy_timeout(db, 250), KVB_OK);
    CHECK_EQ_INT(metrics_set_drain_timeout(db, 0.3), KVB_OK);
    int64_t run = 0;
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &run, &err), KVB_OK);

    sqlite3 *other = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &other), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    struct metrics_request r = ok_row(1);
    double worst = 0;
    for (int i = 0; i < 9; i++) {
        double t0 = mono();
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
        if (mono() - t0 > worst) worst = mono() - t0;
    }
    /* An add that waited for the lock would wait the busy timeout (250 ms)
     * at least: half of it is the bound, whatever the machine's load. */
    CHECK_MSG(worst < 0.125, "adding a row waited %.3f s", worst);
    struct metrics_counters c;
    WAIT_FOR(db, c, c.flush_failures >= 1);
    CHECK(c.flush_failures >= 1);
    CHECK_EQ_INT(c.rows_pending, 9);
    CHECK_EQ_INT(metrics_flush(db, &err), KVB_ERR_IO);
    CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "locked") &&
                  strstr(err.msg, "9 request rows could not be written"),
              "%s", err.msg);
    note(&err);
    CHECK_EQ_INT(sqlite3_exec(other, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(other);
    CHECK_EQ_INT(metrics_flush(db, &err), KVB_OK);
    metrics_get_counters(db, &c);
    CHECK_EQ_INT(c.rows_pending, 0);
    CHECK_EQ_INT(c.rows_written, 9);
    CHECK_EQ_INT(metrics_set_busy_timeout(db, -1), KVB_ERR_INVALID_ARG);

    /* the lock held across the run's end: the end says how many rows are
     * missing and why; close, once the lock is free, still writes them */
    CHECK_EQ_INT(sqlite3_open(path, &other), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err), KVB_ERR_IO);
    CHECK_MSG(strstr(err.msg, "5 request rows could not be written") && strstr(err.msg, "end of a run"), "%s", err.msg);
    note(&err);
    CHECK_EQ_INT(sqlite3_exec(other, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(other);
    metrics_close(db);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests"), 14);
}

/* Issue 18: another process holding the write lock for longer than a batch
 * interval stalled generation (every due batch waited the busy timeout on
 * the engine thread). Adding rows must take microseconds while the lock is
 * held; the rows catch up when it is released; nothing is lost. */
static void test_lock_does_not_stall(void)
{
    char path[512];
    path_in(path, sizeof path, "stall.db");
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    if (!db) return;
    CHECK_EQ_INT(metrics_set_batching(db, 16, 0.05), KVB_OK);
    CHECK_EQ_INT(metrics_set_busy_timeout(db, 400), KVB_OK); /* shorter than the hold: attempts fail and retry */
    int64_t run = 0;
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &run, &err), KVB_OK);
    struct holder h = {path, 1.5, 0};
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, hold_lock, &h), 0);
    while (!h.locked) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    CHECK_EQ_INT(h.locked, 1);
    double t0 = mono(), worst = 0;
    int n = 0;
    /* ~1.2 s of "generation": a row every millisecond */
    while (mono() - t0 < 1.2) {
        struct metrics_request r = ok_row(++n);
        double a = mono();
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
        if (mono() - a > worst) worst = mono() - a;
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    }
    struct metrics_counters c;
    metrics_get_counters(db, &c);
    fprintf(stderr, "lock held 1.5 s: %d rows added, slowest add %.2f ms, %lld rows queued, %lld failed attempts\n", n,
            worst * 1e3, (long long)c.rows_pending, (long long)c.flush_failures);
    /* Waiting for the lock would cost the busy timeout (400 ms) at least. */
    CHECK_MSG(worst < 0.2, "adding a row waited %.3f s while another process held the lock", worst);
    CHECK(c.rows_pending > 16);
    pthread_join(th, NULL);
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err), KVB_OK);
    metrics_close(db);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests"), n);
    CHECK_EQ_INT(raw_int(path, "SELECT requests_total FROM runs"), n);
}

/* ---- percentiles ------------------------------------------------------------------ */

static void test_percentiles(void)
{
    double v[100];
    for (int i = 0; i < 100; i++) v[i] = i + 1;
    CHECK(metrics_percentile(v, 100, 50) == 50);
    CHECK(metrics_percentile(v, 100, 95) == 95);
    CHECK(metrics_percentile(v, 100, 99) == 99);
    CHECK(metrics_percentile(v, 100, 100) == 100);
    CHECK(metrics_percentile(v, 100, 1) == 1);
    CHECK(metrics_percentile(v, 10, 95) == 10); /* rank ceil(9.5) = 10 */
    CHECK(metrics_percentile(v, 10, 50) == 5);  /* rank 5 */
    CHECK(metrics_percentile(v, 3, 50) == 2);   /* rank ceil(1.5) = 2 */
    CHECK(metrics_percentile(v, 1, 99) == 1);
    CHECK(isnan(metrics_percentile(v, 0, 50)));
}

/* ---- report ------------------------------------------------------------------------ */

/* The numbers after `label` on the line that contains it. */
static int figures(const char *text, const char *label, double *out, int max)
{
    const char *p = strstr(text, label);
    if (!p) return 0;
    p += strlen(label);
    int n = 0;
    while (n < max) {
        char *end;
        double d = strtod(p, &end);
        if (end == p) break;
        out[n++] = d;
        p = end;
    }
    return n;
}

static char *report_text(struct metrics_db *db, int64_t run, enum kvb_status *st)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    struct kvb_err err = {{0}};
    *st = metrics_report(db, run, f, &err);
    fclose(f);
    if (*st != KVB_OK && getenv("KVB_TEST_VERBOSE")) fprintf(stderr, "report: %s\n", err.msg);
    return buf;
}

static void fill_report_db(const char *path)
{
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    if (!db) return;
    int64_t run = 0;
    struct metrics_run_info info = {
        .job_file = "jobs/examples/rag.jsonl",
        .output_file = "out.jsonl",
        .model = "SmolLM2-135M",
        .model_fingerprint = "abc123",
        .backend = "cpu",
        .settings = "{\"max_batch\":32}",
    };
    CHECK_EQ_INT(metrics_run_begin(db, &info, &run, &err), KVB_OK);
    for (int i = 1; i <= 100; i++) {
        struct metrics_request r = ok_row(i);
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    }
    const char *codes[] = {"invalid_json", "missing_custom_id", "invalid_json"};
    for (int i = 0; i < 3; i++) {
        struct metrics_request r = {.input_line = 200 + i, .error_code = codes[i], .status_code = 400};
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    }
    struct metrics_totals t = {
        .requests_total = 103,
        .requests_ok = 100,
        .requests_failed = 3,
        .prompt_tokens = 10000,
        .completion_tokens = 5000,
        .cached_tokens_run = 2500,
        .cached_tokens_store = 1000,
        .prefill_tokens_computed = 6500,
        .store_bytes_read = 1048576,
        .store_bytes_written = 3 * 1048576,
        .wall_seconds = 10.0,
    };
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, &t, &err), KVB_OK);

    /* a second run that never ends (its process "died") */
    CHECK_EQ_INT(metrics_run_begin(db, &info, &run, &err), KVB_OK);
    for (int i = 1; i <= 10; i++) {
        struct metrics_request r = ok_row(i);
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    }
    struct metrics_request bad = {.input_line = 11, .error_code = "context_length_exceeded", .status_code = 400};
    CHECK_EQ_INT(metrics_request_add(db, run, &bad, &err), KVB_OK);
    /* one token: a time to first token but no interval between tokens */
    struct metrics_request one = ok_row(12);
    one.completion_tokens = 1;
    one.status_code = 500; /* counted as failed by the 2xx rule, with no error code */
    CHECK_EQ_INT(metrics_request_add(db, run, &one, &err), KVB_OK);
    metrics_close(db);
    /* rejected lines have no timings; one-token requests no tpot */
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests WHERE error_code IS NOT NULL AND ttft_s IS NULL"
                               " AND e2e_s IS NULL AND queue_s IS NULL AND tpot_s IS NULL"),
                 4);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests WHERE tpot_s IS NULL"), 5);
}

static void test_report(void)
{
    char path[512];
    path_in(path, sizeof path, "report.db");
    fill_report_db(path);
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_OK);
    if (!db) return;

    enum kvb_status st;
    char *txt = report_text(db, 1, &st);
    CHECK_EQ_INT(st, KVB_OK);
    if (getenv("KVB_TEST_VERBOSE")) fputs(txt, stderr);
    double f[8];
    CHECK(strstr(txt, "run 1: ok") != NULL);
    CHECK(strstr(txt, "jobs/examples/rag.jsonl") != NULL);
    CHECK(strstr(txt, "SmolLM2-135M") != NULL);
    CHECK(strstr(txt, "abc123") != NULL);
    CHECK(strstr(txt, "{\"max_batch\":32}") != NULL);
    CHECK(strstr(txt, "103 total: 100 ok, 3 failed") != NULL);
    CHECK(strstr(txt, "errors             invalid_json 2, missing_custom_id 1") != NULL);
    CHECK(strstr(txt, "finish reasons     stop 75, length 25") != NULL);
    CHECK(strstr(txt, "prompt 10000, completion 5000, total 15000") != NULL);
    CHECK(strstr(txt, "wall time          10.00 s") != NULL);
    CHECK(strstr(txt, "500.0 completion tok/s, 1500.0 total tok/s, 10.30 requests/s") != NULL);
    /* ttft_s = i ms for i = 1..100: nearest-rank p50/p95/p99 = 50/95/99 ms */
    CHECK_EQ_INT(figures(txt, "time to 1st token", f, 5), 5);
    CHECK(f[0] == 50.0 && f[1] == 95.0 && f[2] == 99.0 && f[3] == 100.0 && f[4] == 100);
    CHECK_EQ_INT(figures(txt, "time per out token", f, 5), 5);
    CHECK(f[0] == 5.0 && f[1] == 9.5 && f[2] == 9.9);
    CHECK_EQ_INT(figures(txt, "end to end", f, 5), 5);
    CHECK(f[0] == 500.0 && f[1] == 950.0 && f[2] == 990.0);
    CHECK_EQ_INT(figures(txt, "queue", f, 5), 5);
    CHECK(f[4] == 100);
    CHECK(strstr(txt, "2500 of 10000 prompt tokens (25.0 %)") != NULL);
    CHECK(strstr(txt, "1000 of 10000 prompt tokens (10.0 %)") != NULL);
    CHECK(strstr(txt, "6500 of 10000 prompt tokens (65.0 %)") != NULL);
    CHECK(strstr(txt, "read 1.0 MiB (1048576 bytes), written 3.0 MiB (3145728 bytes)") != NULL);
    free(txt);

    /* the latest run is the unfinished one: figures from its rows */
    txt = report_text(db, METRICS_RUN_LATEST, &st);
    CHECK_EQ_INT(st, KVB_OK);
    if (getenv("KVB_TEST_VERBOSE")) fputs(txt, stderr);
    CHECK(strstr(txt, "run 2: running") != NULL);
    CHECK(strstr(txt, "no totals recorded") != NULL);
    CHECK(strstr(txt, "12 total: 10 ok, 2 failed") != NULL);
    CHECK(strstr(txt, "errors             context_length_exceeded 1, status 500 1") != NULL);
    CHECK(strstr(txt, "store                - (recorded when the run ends)") != NULL);
    CHECK(strstr(txt, "prompt 1100, completion 501") != NULL);
    CHECK(strstr(txt, "275 of 1100 prompt tokens (25.0 %)") != NULL);
    CHECK_EQ_INT(figures(txt, "time to 1st token", f, 5), 5);
    CHECK(f[0] == 6.0 && f[1] == 12.0 && f[4] == 11); /* 1..10 and 12 ms: rank 6 and 11 */
    CHECK_EQ_INT(figures(txt, "time per out token", f, 5), 5);
    CHECK(f[4] == 10);
    free(txt);

    txt = report_text(db, 42, &st);
    CHECK_EQ_INT(st, KVB_ERR_NOT_FOUND);
    free(txt);

    /* list */
    char *buf = NULL;
    size_t len = 0;
    FILE *fl = open_memstream(&buf, &len);
    int64_t n = -1;
    CHECK_EQ_INT(metrics_list_runs(db, fl, &n, &err), KVB_OK);
    fclose(fl);
    CHECK_EQ_INT(n, 2);
    CHECK(strstr(buf, "100/103") != NULL);
    CHECK(strstr(buf, "10/12") != NULL);
    CHECK(strstr(buf, "running") != NULL);
    if (getenv("KVB_TEST_VERBOSE")) fputs(buf, stderr);
    free(buf);
    metrics_close(db);

    /* an empty database: clear messages */
    path_in(path, sizeof path, "empty.db");
    db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    if (!db) return;
    buf = NULL;
    fl = open_memstream(&buf, &len);
    CHECK_EQ_INT(metrics_list_runs(db, fl, &n, &err), KVB_OK);
    fclose(fl);
    CHECK_EQ_INT(n, 0);
    CHECK(strstr(buf, "no runs recorded") != NULL);
    free(buf);
    txt = report_text(db, METRICS_RUN_LATEST, &st);
    CHECK_EQ_INT(st, KVB_ERR_NOT_FOUND);
    free(txt);
    metrics_close(db);
}

/* ---- two handles, two threads, one file ------------------------------------------------ */

#define CONC_ROWS 3000

struct conc_arg {
    const char *path;
    pthread_barrier_t *barrier;
    enum kvb_status st;
    int64_t run;
    struct kvb_err err;
};

static void *conc_writer(void *p)
{
    struct conc_arg *a = p;
    struct metrics_db *db = NULL;
    pthread_barrier_wait(a->barrier); /* open the fresh file at the same moment */
    a->st = metrics_open(a->path, &db, &a->err);
    if (a->st != KVB_OK) return NULL;
    /* small batches: many interleaved write transactions */
    metrics_set_batching(db, 16, 2.0);
    a->st = metrics_run_begin(db, NULL, &a->run, &a->err);
    for (int i = 1; a->st == KVB_OK && i <= CONC_ROWS; i++) {
        struct metrics_request r = ok_row(i);
        a->st = metrics_request_add(db, a->run, &r, &a->err);
    }
    if (a->st == KVB_OK) a->st = metrics_run_end(db, a->run, METRICS_RUN_OK, NULL, &a->err);
    metrics_close(db);
    return NULL;
}

static void test_concurrent(void)
{
    char path[512];
    path_in(path, sizeof path, "shared.db");
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    struct conc_arg a[2] = {{.path = path, .barrier = &barrier}, {.path = path, .barrier = &barrier}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK_EQ_INT(pthread_create(&th[i], NULL, conc_writer, &a[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&barrier);
    for (int i = 0; i < 2; i++) CHECK_MSG(a[i].st == KVB_OK, "writer %d: %s", i, a[i].err.msg);
    CHECK(a[0].run != a[1].run);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM runs WHERE status='ok'"), 2);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM requests"), 2 * CONC_ROWS);
    CHECK_EQ_INT(raw_int(path, "SELECT min(requests_total) FROM runs"), CONC_ROWS);
}

/* ---- refusals ---------------------------------------------------------------------- */

static void test_bad_files(void)
{
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    char path[512];

    /* not SQLite at all */
    path_in(path, sizeof path, "notes.txt");
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 200; i++) fputs("this is not a database, just some text\n", f);
    fclose(f);
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_ERR_FORMAT);
    CHECK(db == NULL);
    CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "not a SQLite database"), "%s", err.msg);
    note(&err);
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_ERR_FORMAT);

    /* a short non-database file */
    path_in(path, sizeof path, "short.txt");
    f = fopen(path, "w");
    fputs("hello\n", f);
    fclose(f);
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "not a SQLite database"), "%s", err.msg);
    note(&err);

    /* another program's SQLite database */
    path_in(path, sizeof path, "other.db");
    CHECK_EQ_INT(raw_exec(path, "CREATE TABLE notes(x)"), SQLITE_OK);
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "not a kvbatch metrics database"), "%s", err.msg);
    note(&err);
    CHECK_EQ_INT(raw_int(path, "SELECT count(*) FROM sqlite_master"), 1); /* untouched */
    path_in(path, sizeof path, "other_app.db");
    CHECK_EQ_INT(raw_exec(path, "PRAGMA application_id=1234; CREATE TABLE t(x)"), SQLITE_OK);
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "another program"), "%s", err.msg);
    note(&err);

    /* a kvbatch database from the future */
    path_in(path, sizeof path, "future.db");
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    metrics_close(db);
    db = NULL;
    CHECK_EQ_INT(raw_exec(path, "PRAGMA user_version=99"), SQLITE_OK);
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "newer kvbatch") && strstr(err.msg, "99"), "%s", err.msg);
    note(&err);

    /* a missing directory */
    path_in(path, sizeof path, "no/such/dir/m.db");
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_ERR_IO);
    CHECK(db == NULL);
    CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "No such file or directory"), "%s", err.msg);
    note(&err);

    /* open_existing creates nothing */
    path_in(path, sizeof path, "absent.db");
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_ERR_IO);
    CHECK_MSG(strstr(err.msg, path) != NULL, "%s", err.msg);
    note(&err);
    CHECK(access(path, F_OK) != 0);
    /* an empty file is not ours for a reader */
    path_in(path, sizeof path, "zero.db");
    fclose(fopen(path, "w"));
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "not a kvbatch metrics database"), "%s", err.msg);
    note(&err);
    /* ... but a writer may initialise it */
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    metrics_close(db);
    db = NULL;
    CHECK_EQ_INT(metrics_open(NULL, &db, &err), KVB_ERR_INVALID_ARG);

    char buf[64];
    CHECK_EQ_INT(metrics_default_path("out/results.jsonl", buf, sizeof buf), KVB_OK);
    CHECK(strcmp(buf, "out/kvbatch.db") == 0);
    CHECK_EQ_INT(metrics_default_path("results.jsonl", buf, sizeof buf), KVB_OK);
    CHECK(strcmp(buf, "kvbatch.db") == 0);
    CHECK_EQ_INT(metrics_default_path("/a/very/long/dir/r.jsonl", buf, 12), KVB_ERR_RANGE);
}

/* ---- the command ------------------------------------------------------------------- */

/* Runs cli_report with stdout and stderr sent to files; returns its exit code. */
static int run_cli(char *out, size_t cap, int argc, char **argv)
{
    char opath[512], epath[512];
    path_in(opath, sizeof opath, "cli.out");
    path_in(epath, sizeof epath, "cli.err");
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(opath, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(epath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = cli_report(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(fo);
    close(fe);
    size_t n1 = 0, n2 = 0;
    char *o = tu_read_file(opath, &n1), *e = tu_read_file(epath, &n2);
    snprintf(out, cap, "%s%s", o ? o : "", e ? e : "");
    free(o);
    free(e);
    return rc;
}

static void test_cli(void)
{
    char db[512], missing[512], out[8192];
    path_in(db, sizeof db, "report.db"); /* written by test_report */
    path_in(missing, sizeof missing, "missing.db");
#define ARGV(...) (char *[]){"report", __VA_ARGS__, NULL}
#define RUN(...) run_cli(out, sizeof out, (int)(sizeof ARGV(__VA_ARGS__) / sizeof(char *)) - 1, ARGV(__VA_ARGS__))
    CHECK_EQ_INT(RUN("--help"), 0);
    CHECK(strstr(out, "--run ID") && strstr(out, "--list"));
    CHECK_EQ_INT(run_cli(out, sizeof out, 1, (char *[]){"report", NULL}), 2);
    CHECK_EQ_INT(RUN(db, "--bogus"), 2);
    CHECK_EQ_INT(RUN(db, "--run", "abc"), 2);
    CHECK_EQ_INT(RUN(db, "--run"), 2);
    /* Several databases: one report of their latest runs (pytest_shard checks
     * the sums and the shard checks), but never one run counted twice. */
    CHECK_EQ_INT(RUN(db, db), 1);
    CHECK_MSG(strstr(out, "same run") != NULL, "%s", out);
    char other[512];
    path_in(other, sizeof other, "second-run.db");
    struct metrics_db *m = NULL;
    int64_t run = 0;
    struct metrics_run_info ri = {.output_file = "other.jsonl", .settings = "{\"shard\":\"0/1\"}"};
    CHECK(metrics_open(other, &m, NULL) == KVB_OK && metrics_run_begin(m, &ri, &run, NULL) == KVB_OK);
    metrics_close(m);
    CHECK_EQ_INT(RUN(db, other), 0);
    CHECK_MSG(strstr(out, "combined: the latest run of each of 2 databases") != NULL, "%s", out);
    CHECK_EQ_INT(RUN(db, db, "--list"), 2);
    CHECK_EQ_INT(RUN(db, "--run", "1", db), 2);
    CHECK_EQ_INT(RUN(db, missing), 1);
    CHECK_EQ_INT(RUN(db, "--list", "--run", "1"), 2);
    CHECK_EQ_INT(RUN(missing), 1);
    CHECK_MSG(strstr(out, missing) != NULL, "%s", out);
    CHECK(access(missing, F_OK) != 0);
    CHECK_EQ_INT(RUN(db, "--run", "77"), 1);
    CHECK_MSG(strstr(out, "no run with id 77") != NULL, "%s", out);
    CHECK_EQ_INT(RUN(db), 0);
    CHECK(strstr(out, "run 2: running") != NULL);
    CHECK_EQ_INT(RUN(db, "--run=1"), 0);
    CHECK(strstr(out, "run 1: ok") != NULL);
    CHECK_EQ_INT(RUN("--run", "1", db), 0);
    CHECK(strstr(out, "run 1: ok") != NULL);
    CHECK_EQ_INT(RUN(db, "--list"), 0);
    CHECK(strstr(out, "100/103") != NULL);
    char notdb[512];
    path_in(notdb, sizeof notdb, "notes.txt");
    CHECK_EQ_INT(RUN(notdb), 1);
    CHECK_MSG(strstr(out, "not a SQLite database") != NULL, "%s", out);
#undef RUN
#undef ARGV
}

/* ---- runs whose process died --------------------------------------------------------------- */

static long long raw_status_is(const char *path, int64_t id, const char *status)
{
    char q[160];
    snprintf(q, sizeof q, "SELECT count(*) FROM runs WHERE id=%lld AND status='%s'", (long long)id, status);
    return raw_int(path, q);
}

/* Issue 18: a killed run stayed 'running' forever. The next open on that
 * database marks runs whose process is gone as 'died' (killed, a reused
 * pid, a reboot), leaves live ones and other machines' alone, and the
 * report says what happened and how to continue. Also: a version-1 file
 * (no pid columns, no 'died') is upgraded with its rows kept. */
static void test_died_runs(void)
{
    char path[512];
    path_in(path, sizeof path, "died.db");
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    if (!db) return;
    int64_t mine = 0;
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &mine, &err), KVB_OK); /* this process: alive */

    /* a child that begins a run, writes rows and is killed */
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct metrics_db *c = NULL;
        int64_t run = 0;
        if (metrics_open(path, &c, NULL) != KVB_OK || metrics_run_begin(c, NULL, &run, NULL) != KVB_OK) _exit(1);
        for (int i = 1; i <= 3; i++) {
            struct metrics_request r = ok_row(i);
            metrics_request_add(c, run, &r, NULL);
        }
        metrics_flush(c, NULL);
        raise(SIGKILL);
        _exit(2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    const int64_t killed = mine + 1;
    CHECK_EQ_INT(raw_status_is(path, killed, "running"), 1);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char q[1024];
    /* this process's pid but another start time: the pid was reused */
    snprintf(q, sizeof q,
             "INSERT INTO runs (id, started_at, status, pid, host, boot_id, proc_start)"
             " SELECT 100, 0, 'running', pid, host, boot_id, proc_start + 1 FROM runs WHERE id=%lld;"
             /* a boot since */
             "INSERT INTO runs (id, started_at, status, pid, host, boot_id, proc_start)"
             " SELECT 101, 0, 'running', pid, host, 'another-boot', proc_start FROM runs WHERE id=%lld;"
             /* another machine: cannot tell, left alone */
             "INSERT INTO runs (id, started_at, status, pid, host) VALUES (102, 0, 'running', 1, 'elsewhere.example');"
             /* recorded before pids were: left alone */
             "INSERT INTO runs (id, started_at, status) VALUES (103, 0, 'running');",
             (long long)mine, (long long)mine);
    CHECK_EQ_INT(raw_exec(path, q), SQLITE_OK);
    metrics_close(db);

    db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    CHECK_EQ_INT(raw_status_is(path, mine, "running"), 1);
    CHECK_EQ_INT(raw_status_is(path, killed, "died"), 1);
    CHECK_EQ_INT(raw_status_is(path, 100, "died"), 1);
    CHECK_EQ_INT(raw_status_is(path, 101, "died"), 1);
    CHECK_EQ_INT(raw_status_is(path, 102, "running"), 1);
    CHECK_EQ_INT(raw_status_is(path, 103, "running"), 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK_EQ_INT(metrics_report(db, killed, f, &err), KVB_OK);
    fclose(f);
    CHECK_MSG(buf && strstr(buf, ": died") && strstr(buf, "--resume") && strstr(buf, "3 total"), "%s", buf);
    free(buf);
    metrics_close(db);

    /* a version-1 database with a run left 'running' */
    char old[512];
    path_in(old, sizeof old, "v1.db");
    CHECK_EQ_INT(
        raw_exec(
            old,
            "PRAGMA journal_mode=WAL;"
            "CREATE TABLE runs (id INTEGER PRIMARY KEY, job_file TEXT, output_file TEXT, model TEXT,"
            " model_fingerprint TEXT, backend TEXT, settings TEXT, started_at REAL NOT NULL, ended_at REAL,"
            " status TEXT NOT NULL DEFAULT 'running' CHECK (status IN ('running','ok','interrupted','failed')),"
            " requests_total INTEGER, requests_ok INTEGER, requests_failed INTEGER, prompt_tokens INTEGER,"
            " completion_tokens INTEGER, cached_tokens_run INTEGER, cached_tokens_store INTEGER,"
            " prefill_tokens_computed INTEGER, store_bytes_read INTEGER, store_bytes_written INTEGER, wall_seconds "
            "REAL);"
            "CREATE TABLE requests (run_id INTEGER NOT NULL REFERENCES runs(id), custom_id TEXT, input_line INTEGER,"
            " prompt_tokens INTEGER NOT NULL, cached_tokens_run INTEGER NOT NULL, cached_tokens_store INTEGER NOT NULL,"
            " completion_tokens INTEGER NOT NULL, queue_s REAL, ttft_s REAL, tpot_s REAL, e2e_s REAL,"
            " finish_reason TEXT, error_code TEXT, status_code INTEGER);"
            "CREATE INDEX requests_run_id ON requests(run_id);"
            "INSERT INTO runs (id, job_file, started_at, ended_at, status, requests_total) VALUES (1, 'a.jsonl', 5, 9, "
            "'ok', 2);"
            "INSERT INTO runs (id, job_file, started_at) VALUES (2, 'b.jsonl', 10);"
            "INSERT INTO requests (run_id, prompt_tokens, cached_tokens_run, cached_tokens_store, completion_tokens)"
            " VALUES (1, 5, 0, 0, 3), (1, 6, 0, 0, 4);"
            "PRAGMA application_id=1263944269; PRAGMA user_version=1;"),
        SQLITE_OK);
    db = NULL;
    CHECK_MSG(metrics_open(old, &db, &err) == KVB_OK, "%s", err.msg);
    CHECK_EQ_INT(raw_int(old, "PRAGMA user_version"), METRICS_SCHEMA_VERSION);
    CHECK_EQ_INT(raw_int(old, "SELECT count(*) FROM runs"), 2);
    CHECK_EQ_INT(raw_int(old, "SELECT requests_total FROM runs WHERE id=1 AND job_file='a.jsonl' AND status='ok'"), 2);
    CHECK_EQ_INT(raw_status_is(old, 2, "running"), 1); /* no pid: cannot tell */
    CHECK_EQ_INT(raw_int(old, "SELECT count(*) FROM requests JOIN runs ON runs.id = requests.run_id"), 2);
    int64_t run = 0;
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &run, &err), KVB_OK);
    CHECK_EQ_INT(run, 3);
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err), KVB_OK);
    CHECK_EQ_INT(raw_int(old, "SELECT count(*) FROM runs WHERE id=3 AND pid IS NOT NULL AND host IS NOT NULL"), 1);
    metrics_close(db);
}

/* ---- allocation failures ---------------------------------------------------------- */

static void test_alloc_failures(void)
{
    char path[512];
    path_in(path, sizeof path, "oom.db");
    int completed = 0;
    for (long n = 0; n < 40 && !completed; n++) {
        struct kvb_err err = {{0}};
        struct metrics_db *db = NULL;
        kvb_alloc_fail_after(n);
        enum kvb_status st = metrics_open(path, &db, &err);
        int64_t run = 0;
        if (st == KVB_OK) st = metrics_run_begin(db, NULL, &run, &err);
        for (int i = 1; st == KVB_OK && i <= 300; i++) {
            struct metrics_request r = ok_row(i);
            r.custom_id = "some-id";
            st = metrics_request_add(db, run, &r, &err);
        }
        if (st == KVB_OK) st = metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err);
        if (st == KVB_OK) {
            FILE *f = fopen("/dev/null", "w");
            st = metrics_report(db, run, f, &err);
            fclose(f);
        }
        metrics_close(db);
        kvb_alloc_fail_after(-1);
        CHECK_MSG(st == KVB_OK || st == KVB_ERR_NOMEM, "fail after %ld: %s", n, kvb_strerror(st));
        if (st == KVB_OK) completed = 1;
    }
    CHECK(completed);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/kvb_metrics_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_schema();
    test_batching();
    test_busy();
    test_lock_does_not_stall();
    test_percentiles();
    test_report();
    test_concurrent();
    test_died_runs();
    test_bad_files();
    test_cli();
    test_alloc_failures();

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (!getenv("KVB_KEEP_TMP") && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return tu_finish();
}
