/* metrics.c — the SQLite metrics store (see metrics.h): opening, the
 * schema, and the runs table.
 *
 * Opening validates identity (application id, schema version) before writing
 * anything, then brings the schema up to date inside one BEGIN IMMEDIATE
 * transaction so that two processes opening a fresh file at once cannot both
 * create it. Request rows are queued and written by metrics_writer.c's
 * thread, through a connection of its own, so that the caller never waits on
 * another process's lock; run rows are written here, at the start and end of
 * a run, where waiting is bounded and harmless.
 *
 * This file does not read reports; that is metrics_report.c. */
#include "store/metrics/metrics.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "base/alloc.h"
#include "store/metrics/metrics_internal.h"

/* 'KVBM' — marks the file as a kvbatch metrics database (PRAGMA application_id). */
#define METRICS_APP_ID 0x4B56424D

/* How long a write waits for another process's lock before failing. A batch
 * holds the lock for milliseconds, so this is generous. */
#define METRICS_BUSY_TIMEOUT_MS 10000

/* Schema migrations: migrations[v] takes a database from schema version v to
 * v + 1. Version 0 is the empty file, so migrations[0] creates everything.
 * To change the schema: append one entry (additive ALTERs where possible),
 * bump METRICS_SCHEMA_VERSION, keep the old entries unchanged. */
static const char *const migrations[METRICS_SCHEMA_VERSION] = {
    /* 0 -> 1 */
    "CREATE TABLE runs ("
    "  id INTEGER PRIMARY KEY,"
    "  job_file TEXT, output_file TEXT, model TEXT, model_fingerprint TEXT, backend TEXT,"
    "  settings TEXT,"            /* JSON object text */
    "  started_at REAL NOT NULL," /* unix seconds */
    "  ended_at REAL,"            /* NULL until the run ends */
    "  status TEXT NOT NULL DEFAULT 'running'"
    "    CHECK (status IN ('running','ok','interrupted','failed')),"
    /* totals: NULL until the run ends */
    "  requests_total INTEGER, requests_ok INTEGER, requests_failed INTEGER,"
    "  prompt_tokens INTEGER, completion_tokens INTEGER,"
    "  cached_tokens_run INTEGER, cached_tokens_store INTEGER, prefill_tokens_computed INTEGER,"
    "  store_bytes_read INTEGER, store_bytes_written INTEGER,"
    "  wall_seconds REAL"
    ");"
    "CREATE TABLE requests ("
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  custom_id TEXT, input_line INTEGER,"
    "  prompt_tokens INTEGER NOT NULL, cached_tokens_run INTEGER NOT NULL,"
    "  cached_tokens_store INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
    "  queue_s REAL, ttft_s REAL, tpot_s REAL, e2e_s REAL," /* seconds; NULL = not measured */
    "  finish_reason TEXT, error_code TEXT, status_code INTEGER"
    ");"
    "CREATE INDEX requests_run_id ON requests(run_id);",
    /* 1 -> 2: who runs a run (pid, host, boot, process start), so that a
     * later open can tell a run whose process is gone, and the status
     * 'died' for those. SQLite cannot alter a CHECK, so the table is
     * rebuilt (requests refer to it by name, which the rename keeps). */
    "CREATE TABLE runs_v2 ("
    "  id INTEGER PRIMARY KEY,"
    "  job_file TEXT, output_file TEXT, model TEXT, model_fingerprint TEXT, backend TEXT,"
    "  settings TEXT,"
    "  started_at REAL NOT NULL,"
    "  ended_at REAL,"
    "  status TEXT NOT NULL DEFAULT 'running'"
    "    CHECK (status IN ('running','ok','interrupted','failed','died')),"
    "  requests_total INTEGER, requests_ok INTEGER, requests_failed INTEGER,"
    "  prompt_tokens INTEGER, completion_tokens INTEGER,"
    "  cached_tokens_run INTEGER, cached_tokens_store INTEGER, prefill_tokens_computed INTEGER,"
    "  store_bytes_read INTEGER, store_bytes_written INTEGER,"
    "  wall_seconds REAL,"
    "  pid INTEGER, host TEXT," /* the process that runs it */
    "  boot_id TEXT,"           /* the machine's boot (Linux), to tell a reboot */
    "  proc_start INTEGER"      /* the process's start (clock ticks after boot), to tell a reused pid */
    ");"
    "INSERT INTO runs_v2 (id, job_file, output_file, model, model_fingerprint, backend, settings, started_at,"
    "  ended_at, status, requests_total, requests_ok, requests_failed, prompt_tokens, completion_tokens,"
    "  cached_tokens_run, cached_tokens_store, prefill_tokens_computed, store_bytes_read, store_bytes_written,"
    "  wall_seconds)"
    " SELECT id, job_file, output_file, model, model_fingerprint, backend, settings, started_at,"
    "  ended_at, status, requests_total, requests_ok, requests_failed, prompt_tokens, completion_tokens,"
    "  cached_tokens_run, cached_tokens_store, prefill_tokens_computed, store_bytes_read, store_bytes_written,"
    "  wall_seconds FROM runs;"
    "DROP TABLE runs;"
    "ALTER TABLE runs_v2 RENAME TO runs;",
    /* 2 -> 3: what a picture of the run needs (times on one clock), and what
     * explains a slow or failed request */
    "ALTER TABLE requests ADD COLUMN submitted_at REAL;" /* unix seconds; NULL = not known */
    "ALTER TABLE requests ADD COLUMN started_at REAL;"
    "ALTER TABLE requests ADD COLUMN first_token_at REAL;"
    "ALTER TABLE requests ADD COLUMN ended_at REAL;"
    "ALTER TABLE requests ADD COLUMN preemptions INTEGER;"
    "ALTER TABLE requests ADD COLUMN restored_tokens INTEGER;"
    "ALTER TABLE requests ADD COLUMN error_message TEXT;",
};

struct metrics_db {
    sqlite3 *sql;
    char *path;
    /* statements reused for the life of the handle */
    sqlite3_stmt *st_insert_run, *st_end_run, *st_end_run_derived;
    struct metrics_writer *writer; /* request rows: queued, written by its thread */
    int busy_ms;
    double drain_seconds;
    bool drain_failed; /* a drain gave up: close does not wait again */
};

/* ---- small helpers --------------------------------------------------------- */

double metrics_now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *metrics_run_status_name(enum metrics_run_status st)
{
    switch (st) {
    case METRICS_RUN_RUNNING: return "running";
    case METRICS_RUN_OK: return "ok";
    case METRICS_RUN_INTERRUPTED: return "interrupted";
    case METRICS_RUN_FAILED: return "failed";
    case METRICS_RUN_DIED: return "died";
    }
    return "failed";
}

enum kvb_status metrics_sql_status(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_OK: return KVB_OK;
    case SQLITE_NOMEM: return KVB_ERR_NOMEM;
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_SCHEMA:
    case SQLITE_MISMATCH:
    case SQLITE_ERROR: /* "no such table/column": the file's schema is not what we expect */ return KVB_ERR_FORMAT;
    case SQLITE_CONSTRAINT:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG: return KVB_ERR_INVALID_ARG;
    case SQLITE_MISUSE:
    case SQLITE_INTERNAL: return KVB_ERR_INTERNAL;
    default: /* CANTOPEN, IOERR, FULL, BUSY, LOCKED, READONLY, PERM, PROTOCOL, … */ return KVB_ERR_IO;
    }
}

enum kvb_status metrics_sql_err(sqlite3 *sql, const char *path, struct kvb_err *err, int rc, const char *what)
{
    /* sqlite3_errmsg describes the most recent failure on the connection,
     * which is the one we are reporting; errstr names the code. */
    const char *msg = sql ? sqlite3_errmsg(sql) : sqlite3_errstr(rc);
    const char *code = sqlite3_errstr(rc);
    if ((rc & 0xff) == SQLITE_BUSY)
        return kvb_errf(err, KVB_ERR_IO, "%s: %s: %s (another process held the lock past the busy timeout)", path, what,
                        msg);
    if (strcmp(msg, code) == 0) return kvb_errf(err, metrics_sql_status(rc), "%s: %s: %s", path, what, msg);
    return kvb_errf(err, metrics_sql_status(rc), "%s: %s: %s (%s)", path, what, msg, code);
}

static enum kvb_status db_err(struct metrics_db *db, struct kvb_err *err, int rc, const char *what)
{
    return metrics_sql_err(db->sql, db->path, err, rc, what);
}

int metrics_step_reset(sqlite3_stmt *st)
{
    int rc;
    do rc = sqlite3_step(st);
    while (rc == SQLITE_ROW);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Reads one integer pragma (application_id, user_version). */
static int pragma_int(sqlite3 *sql, const char *name, int64_t *out)
{
    char q[64];
    snprintf(q, sizeof q, "PRAGMA %s", name);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(sql, q, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        *out = 0;
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

/* ---- open / schema ---------------------------------------------------------- */

/* What the file is, as far as the schema is concerned. */
enum schema_state { SCHEMA_EMPTY, SCHEMA_OURS };

/* Reads identity and version; refuses foreign or newer databases. Reads only. */
static enum kvb_status schema_check(struct metrics_db *db, enum schema_state *state, int64_t *version,
                                    struct kvb_err *err)
{
    int64_t app_id = 0, ver = 0, n_tables = 0;
    int rc = pragma_int(db->sql, "application_id", &app_id);
    if (rc != SQLITE_OK) {
        if ((rc & 0xff) == SQLITE_NOTADB)
            return kvb_errf(err, KVB_ERR_FORMAT, "%s: not a SQLite database (%s)", db->path, sqlite3_errmsg(db->sql));
        return db_err(db, err, rc, "reading the database header");
    }
    rc = pragma_int(db->sql, "user_version", &ver);
    if (rc != SQLITE_OK) return db_err(db, err, rc, "reading the schema version");
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(db->sql, "SELECT count(*) FROM sqlite_master", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            n_tables = sqlite3_column_int64(st, 0);
            rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
    }
    if (rc != SQLITE_OK) return db_err(db, err, rc, "reading the schema");

    if (app_id != 0 && app_id != METRICS_APP_ID)
        return kvb_errf(
            err, KVB_ERR_FORMAT,
            "%s: not a kvbatch metrics database (SQLite application id 0x%08llx belongs to another program)", db->path,
            (unsigned long long)(uint32_t)app_id);
    if (app_id == 0) {
        if (n_tables != 0 || ver != 0)
            return kvb_errf(err, KVB_ERR_FORMAT,
                            "%s: not a kvbatch metrics database (a SQLite database holding other tables)", db->path);
        *state = SCHEMA_EMPTY;
        *version = 0;
        return KVB_OK;
    }
    if (ver > METRICS_SCHEMA_VERSION)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "%s: metrics schema version %lld was written by a newer kvbatch (this one knows up to %d)",
                        db->path, (long long)ver, METRICS_SCHEMA_VERSION);
    if (ver < 1) return kvb_errf(err, KVB_ERR_FORMAT, "%s: kvbatch metrics database with no schema version", db->path);
    *state = SCHEMA_OURS;
    *version = ver;
    return KVB_OK;
}

/* Sets WAL mode. Changing the journal mode needs a moment of exclusive
 * access, and a second process opening the same fresh file can make it
 * report SQLITE_BUSY without waiting, so retry for a while. */
static enum kvb_status set_wal(struct metrics_db *db, struct kvb_err *err)
{
    int rc = SQLITE_OK;
    for (int tries = 0; tries < METRICS_BUSY_TIMEOUT_MS / 10; tries++) {
        rc = sqlite3_exec(db->sql, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
        if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (rc != SQLITE_OK) return db_err(db, err, rc, "setting WAL mode");
    return KVB_OK;
}

/* Brings the schema to METRICS_SCHEMA_VERSION inside one write transaction,
 * re-checking the version under the lock (another process may have done it). */
static enum kvb_status schema_upgrade(struct metrics_db *db, struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(set_wal(db, err));
    int rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc != SQLITE_OK) return db_err(db, err, rc, "locking the database to create its schema");
    enum schema_state state;
    int64_t ver;
    enum kvb_status st = schema_check(db, &state, &ver, err);
    for (int64_t v = ver; st == KVB_OK && v < METRICS_SCHEMA_VERSION; v++) {
        rc = sqlite3_exec(db->sql, migrations[v], NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            char what[64];
            snprintf(what, sizeof what, "upgrading the schema from version %lld", (long long)v);
            st = db_err(db, err, rc, what);
        }
    }
    if (st == KVB_OK && ver < METRICS_SCHEMA_VERSION) {
        char q[96];
        snprintf(q, sizeof q, "PRAGMA application_id=%d; PRAGMA user_version=%d", METRICS_APP_ID,
                 METRICS_SCHEMA_VERSION);
        rc = sqlite3_exec(db->sql, q, NULL, NULL, NULL);
        if (rc != SQLITE_OK) st = db_err(db, err, rc, "writing the schema version");
    }
    if (st == KVB_OK) {
        rc = sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) st = db_err(db, err, rc, "committing the schema");
    }
    if (st != KVB_OK) sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
    return st;
}

static enum kvb_status prepare(struct metrics_db *db, const char *q, sqlite3_stmt **st, struct kvb_err *err)
{
    int rc = sqlite3_prepare_v3(db->sql, q, -1, SQLITE_PREPARE_PERSISTENT, st, NULL);
    if (rc != SQLITE_OK) return db_err(db, err, rc, "preparing a statement");
    return KVB_OK;
}

static enum kvb_status prepare_all(struct metrics_db *db, struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(prepare(
        db,
        "INSERT INTO runs (job_file, output_file, model, model_fingerprint, backend, settings,"
        " started_at, status, pid, host, boot_id, proc_start) VALUES (?1,?2,?3,?4,?5,?6,?7,'running',?8,?9,?10,?11)",
        &db->st_insert_run, err));
    KVB_FORWARD_IF_ERROR(
        prepare(db,
                "UPDATE runs SET status=?1, ended_at=?2, requests_total=?4, requests_ok=?5, requests_failed=?6,"
                " prompt_tokens=?7, completion_tokens=?8, cached_tokens_run=?9, cached_tokens_store=?10,"
                " prefill_tokens_computed=?11, store_bytes_read=?12, store_bytes_written=?13, wall_seconds=?14"
                " WHERE id=?3",
                &db->st_end_run, err));
    /* ok = a 2xx status and no error code; the same rule as metrics_report. */
    KVB_FORWARD_IF_ERROR(
        prepare(db,
                "UPDATE runs SET status=?1, ended_at=?2, wall_seconds=?2-started_at,"
                " (requests_total, requests_ok, requests_failed, prompt_tokens, completion_tokens,"
                "  cached_tokens_run, cached_tokens_store, prefill_tokens_computed, store_bytes_read,"
                "  store_bytes_written) ="
                " (SELECT count(*), total(ok), count(*) - total(ok), total(prompt_tokens),"
                "  total(completion_tokens), total(cached_tokens_run), total(cached_tokens_store),"
                "  max(0, total(prompt_tokens) - total(cached_tokens_run) - total(cached_tokens_store)), 0, 0"
                "  FROM (SELECT *, (error_code IS NULL AND status_code BETWEEN 200 AND 299) AS ok"
                "        FROM requests WHERE run_id=?3))"
                " WHERE id=?3",
                &db->st_end_run_derived, err));
    return KVB_OK;
}

/* Turns a failed sqlite3_open_v2 into a message that says what to fix. */
static enum kvb_status open_failed(struct metrics_db *db, int rc, struct kvb_err *err)
{
    const char *slash = strrchr(db->path, '/');
    if ((rc & 0xff) == SQLITE_CANTOPEN && slash && slash != db->path) {
        char dir[4096];
        size_t n = (size_t)(slash - db->path);
        if (n < sizeof dir) {
            memcpy(dir, db->path, n);
            dir[n] = '\0';
            struct stat sb;
            if (stat(dir, &sb) != 0)
                return kvb_errf(err, KVB_ERR_IO, "%s: cannot create the metrics database: directory %s: %s", db->path,
                                dir, strerror(errno));
            if (!S_ISDIR(sb.st_mode))
                return kvb_errf(err, KVB_ERR_IO, "%s: cannot create the metrics database: %s is not a directory",
                                db->path, dir);
        }
    }
    return db_err(db, err, rc, "cannot open the metrics database");
}

/* ---- runs whose process is gone ------------------------------------------------------------ */

/* Who this process is, as a run records it. */
struct proc_id {
    pid_t pid;
    char host[256];
    char boot_id[64];    /* "" when unknown */
    int64_t start_ticks; /* -1 when unknown */
};

/* Field 22 of /proc/PID/stat (start time, clock ticks after boot), or -1. */
static int64_t proc_start_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name (field 2) is in parentheses and may hold anything:
     * count fields after its last ')'. */
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    if (field != 22) return -1;
    char *end;
    long long v = strtoll(p, &end, 10);
    return end == p ? -1 : (int64_t)v;
}

static void proc_id_self(struct proc_id *id)
{
    memset(id, 0, sizeof *id);
    id->pid = getpid();
    if (gethostname(id->host, sizeof id->host - 1) != 0) id->host[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(id->boot_id, sizeof id->boot_id, f)) id->boot_id[0] = '\0';
        id->boot_id[strcspn(id->boot_id, "\n")] = '\0';
        fclose(f);
    }
    id->start_ticks = proc_start_ticks(id->pid);
}

/* Whether the process that began a run on this machine is gone: the
 * machine rebooted since, or no process has that pid, or the one that has
 * it started at another time (the pid was reused). */
static bool run_process_gone(const struct proc_id *me, int64_t pid, const char *boot_id, int64_t start, bool has_start)
{
    if (pid <= 0 || pid > INT32_MAX) return false;
    if (boot_id && me->boot_id[0] && strcmp(boot_id, me->boot_id) != 0) return true;
    if (has_start) {
        int64_t now = proc_start_ticks((pid_t)pid);
        if (now >= 0) return now != start;
        /* no /proc entry: gone, unless /proc is not there at all */
        if (me->start_ticks >= 0) return true;
    }
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Marks runs still 'running' whose process, on this machine, is gone as
 * 'died' (killed, out of memory, crashed, machine lost). Runs begun on
 * other machines are left alone: nothing here can tell. Best effort, and
 * never waits for a lock: a busy database is left for the next open. */
static void mark_dead_runs(struct metrics_db *db)
{
    struct proc_id me;
    proc_id_self(&me);
    if (!me.host[0]) return;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db->sql,
                           "SELECT id, pid, boot_id, proc_start FROM runs WHERE status='running'"
                           " AND pid IS NOT NULL AND host=?1",
                           -1, &q, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_text(q, 1, me.host, -1, SQLITE_STATIC);
    int64_t dead[64];
    int n = 0;
    while (n < 64 && sqlite3_step(q) == SQLITE_ROW) {
        const char *boot = (const char *)sqlite3_column_text(q, 2);
        bool has_start = sqlite3_column_type(q, 3) != SQLITE_NULL;
        if (run_process_gone(&me, sqlite3_column_int64(q, 1), boot, sqlite3_column_int64(q, 3), has_start))
            dead[n++] = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    if (n == 0) return;
    sqlite3_busy_timeout(db->sql, 0);
    sqlite3_stmt *u = NULL;
    if (sqlite3_prepare_v2(db->sql, "UPDATE runs SET status='died' WHERE id=?1 AND status='running'", -1, &u, NULL) ==
            SQLITE_OK &&
        sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
        for (int i = 0; i < n; i++) {
            sqlite3_bind_int64(u, 1, dead[i]);
            metrics_step_reset(u);
        }
        if (sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
            sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
    }
    sqlite3_finalize(u);
    sqlite3_busy_timeout(db->sql, db->busy_ms);
}

static enum kvb_status open_common(const char *path, bool create, struct metrics_db **out, struct kvb_err *err)
{
    *out = NULL;
    if (!path || !*path) return kvb_errf(err, KVB_ERR_INVALID_ARG, "metrics database path is empty");
    if (!create) {
        /* SQLite would say only "unable to open database file". */
        struct stat sb;
        if (stat(path, &sb) != 0)
            return kvb_errf(err, KVB_ERR_IO, "%s: cannot open the metrics database: %s", path, strerror(errno));
        if (S_ISDIR(sb.st_mode)) return kvb_errf(err, KVB_ERR_IO, "%s: is a directory, not a metrics database", path);
    }
    struct metrics_db *db = kvb_calloc(1, sizeof *db);
    if (!db) return kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory opening the metrics database", path);
    db->path = kvb_strndup(path, strlen(path));
    if (!db->path) {
        kvb_free(db);
        return kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory opening the metrics database", path);
    }
    db->busy_ms = METRICS_BUSY_TIMEOUT_MS;
    db->drain_seconds = METRICS_DRAIN_SECONDS;

    int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
    int rc = sqlite3_open_v2(path, &db->sql, flags, NULL);
    enum kvb_status st = KVB_OK;
    if (rc != SQLITE_OK) st = open_failed(db, rc, err);
    if (st == KVB_OK) {
        sqlite3_busy_timeout(db->sql, METRICS_BUSY_TIMEOUT_MS);
        enum schema_state state;
        int64_t ver;
        /* One read transaction, so the three reads in schema_check see one
         * snapshot: read one by one, they could see another process's
         * freshly committed tables but the header from before it, and call
         * our own schema foreign. */
        rc = sqlite3_exec(db->sql, "BEGIN", NULL, NULL, NULL);
        st = rc == SQLITE_OK ? schema_check(db, &state, &ver, err) : db_err(db, err, rc, "starting a read transaction");
        if (rc == SQLITE_OK) sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL);
        if (st == KVB_OK && state == SCHEMA_EMPTY && !create)
            st = kvb_errf(err, KVB_ERR_FORMAT, "%s: not a kvbatch metrics database (no schema; is it empty?)", path);
        if (st == KVB_OK && ver < METRICS_SCHEMA_VERSION) st = schema_upgrade(db, err);
    }
    if (st == KVB_OK) {
        /* NORMAL is durable enough in WAL mode (a power cut may lose the last
         * batch, never corrupt the file) and avoids an fsync per commit. */
        rc = sqlite3_exec(db->sql, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
        if (rc != SQLITE_OK) st = db_err(db, err, rc, "setting synchronous mode");
    }
    if (st == KVB_OK) st = prepare_all(db, err);
    if (st == KVB_OK)
        st = metrics_writer_create(path, METRICS_BATCH_ROWS, METRICS_BATCH_SECONDS, db->busy_ms, &db->writer, err);
    if (st == KVB_OK) mark_dead_runs(db);
    if (st != KVB_OK) {
        metrics_close(db);
        return st;
    }
    *out = db;
    return KVB_OK;
}

enum kvb_status metrics_open(const char *path, struct metrics_db **out, struct kvb_err *err)
{
    return open_common(path, true, out, err);
}

enum kvb_status metrics_open_existing(const char *path, struct metrics_db **out, struct kvb_err *err)
{
    return open_common(path, false, out, err);
}

void metrics_close(struct metrics_db *db)
{
    if (!db) return;
    /* A drain that already gave up said how many rows were lost. */
    metrics_writer_free(db->writer, db->drain_failed ? 0 : db->drain_seconds);
    sqlite3_finalize(db->st_insert_run);
    sqlite3_finalize(db->st_end_run);
    sqlite3_finalize(db->st_end_run_derived);
    sqlite3_close(db->sql); /* NULL is a no-op; every statement is finalized above */
    kvb_free(db->path);
    kvb_free(db);
}

const char *metrics_path(const struct metrics_db *db) { return db->path; }

sqlite3 *metrics_sqlite(struct metrics_db *db) { return db->sql; }

enum kvb_status metrics_set_batching(struct metrics_db *db, int max_rows, double max_seconds)
{
    KVB_RETURN_IF(max_rows < 1 || max_rows > METRICS_MAX_PENDING, KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(!(max_seconds >= 0), KVB_ERR_INVALID_ARG); /* also refuses NaN */
    metrics_writer_set_batching(db->writer, max_rows, max_seconds);
    return KVB_OK;
}

enum kvb_status metrics_set_busy_timeout(struct metrics_db *db, int ms)
{
    KVB_RETURN_IF(ms < 0, KVB_ERR_INVALID_ARG);
    db->busy_ms = ms;
    sqlite3_busy_timeout(db->sql, ms);
    metrics_writer_set_busy_timeout(db->writer, ms);
    return KVB_OK;
}

enum kvb_status metrics_set_drain_timeout(struct metrics_db *db, double seconds)
{
    KVB_RETURN_IF(!(seconds >= 0), KVB_ERR_INVALID_ARG);
    db->drain_seconds = seconds;
    return KVB_OK;
}

void metrics_get_counters(const struct metrics_db *db, struct metrics_counters *out)
{
    metrics_writer_counters(db->writer, out);
}

/* ---- runs -------------------------------------------------------------------- */

static int bind_text_or_null(sqlite3_stmt *st, int i, const char *s)
{
    return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i);
}

enum kvb_status metrics_run_begin(struct metrics_db *db, const struct metrics_run_info *info, int64_t *run_id,
                                  struct kvb_err *err)
{
    static const struct metrics_run_info none;
    if (!info) info = &none;
    sqlite3_stmt *st = db->st_insert_run;
    int rc = bind_text_or_null(st, 1, info->job_file);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 2, info->output_file);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 3, info->model);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 4, info->model_fingerprint);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 5, info->backend);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 6, info->settings);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 7, metrics_now_unix());
    struct proc_id me;
    proc_id_self(&me);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 8, (int64_t)me.pid);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 9, me.host[0] ? me.host : NULL);
    if (rc == SQLITE_OK) rc = bind_text_or_null(st, 10, me.boot_id[0] ? me.boot_id : NULL);
    if (rc == SQLITE_OK)
        rc = me.start_ticks >= 0 ? sqlite3_bind_int64(st, 11, me.start_ticks) : sqlite3_bind_null(st, 11);
    if (rc == SQLITE_OK) rc = metrics_step_reset(st);
    /* The insert runs in autocommit mode, so last_insert_rowid is ours:
     * a handle is used by one thread at a time. */
    if (rc == SQLITE_OK) *run_id = sqlite3_last_insert_rowid(db->sql);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_OK) return db_err(db, err, rc, "recording the start of a run");
    return KVB_OK;
}

enum kvb_status metrics_run_end(struct metrics_db *db, int64_t run_id, enum metrics_run_status status,
                                const struct metrics_totals *t, struct kvb_err *err)
{
    /* The rows first (derived totals count them), waiting a bounded time;
     * the end is recorded even when some rows could not be written, so the
     * run does not stay 'running'. */
    struct kvb_err ferr = {{0}};
    enum kvb_status fst = metrics_flush(db, &ferr);
    sqlite3_stmt *st = t ? db->st_end_run : db->st_end_run_derived;
    int rc = sqlite3_bind_text(st, 1, metrics_run_status_name(status), -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 2, metrics_now_unix());
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 3, run_id);
    if (t) {
        const int64_t v[] = {
            t->requests_total,    t->requests_ok,        t->requests_failed,     t->prompt_tokens,
            t->completion_tokens, t->cached_tokens_run,  t->cached_tokens_store, t->prefill_tokens_computed,
            t->store_bytes_read,  t->store_bytes_written};
        for (int i = 0; rc == SQLITE_OK && i < (int)(sizeof v / sizeof v[0]); i++)
            rc = sqlite3_bind_int64(st, 4 + i, v[i]);
        if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 14, t->wall_seconds);
    }
    if (rc == SQLITE_OK) rc = metrics_step_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_OK) {
        enum kvb_status est = db_err(db, err, rc, "recording the end of a run");
        if (fst != KVB_OK && err) {
            char end[sizeof err->msg];
            snprintf(end, sizeof end, "%s", err->msg);
            int n = snprintf(err->msg, sizeof err->msg, "%.250s; and %.250s", ferr.msg, end);
            (void)n;
        }
        return est;
    }
    if (sqlite3_changes(db->sql) == 0)
        return kvb_errf(err, KVB_ERR_NOT_FOUND, "%s: no run %lld to end", db->path, (long long)run_id);
    if (fst != KVB_OK) return kvb_errf(err, fst, "%s (the run's end is recorded)", ferr.msg);
    return KVB_OK;
}

/* ---- request rows (written by metrics_writer.c) ------------------------------------------ */

enum kvb_status metrics_flush(struct metrics_db *db, struct kvb_err *err)
{
    enum kvb_status st = metrics_writer_drain(db->writer, db->drain_seconds, err);
    if (st != KVB_OK) {
        db->drain_failed = true;
        kvb_err_wrap(err, st, "%s", db->path);
    }
    return st;
}

enum kvb_status metrics_request_add(struct metrics_db *db, int64_t run_id, const struct metrics_request *req,
                                    struct kvb_err *err)
{
    return metrics_writer_add(db->writer, run_id, req, err);
}

enum kvb_status metrics_default_path(const char *output_file, char *buf, size_t cap)
{
    static const char name[] = "kvbatch.db";
    const char *slash = output_file ? strrchr(output_file, '/') : NULL;
    size_t dir = slash ? (size_t)(slash - output_file) + 1 : 0;
    KVB_RETURN_IF(dir + sizeof name > cap, KVB_ERR_RANGE);
    if (dir) memcpy(buf, output_file, dir);
    memcpy(buf + dir, name, sizeof name);
    return KVB_OK;
}
