/* metrics.h — the SQLite metrics store: one row per run, one row per request.
 *
 * A run of `kvbatch run` leaves a queryable trace in a SQLite database (WAL
 * mode, so readers never block the writer and `kvbatch report` can look at a
 * run while it is going). Two tables:
 *
 *   runs      one row per run: job and output files, model and its fingerprint,
 *             backend, settings (JSON text), start/end (unix seconds, REAL),
 *             status ('running', 'ok', 'interrupted', 'failed', 'died'),
 *             totals, and the process running it (pid, host, boot id,
 *             process start time).
 *   requests  one row per finished request (or rejected input line), indexed
 *             by run_id: token counts split by where the prompt prefix came
 *             from (in-run radix cache vs persistent LMDB store), latencies,
 *             wall-clock submit/start/first-token/end times, preemptions and
 *             the positions they dropped, finish reason, error code and
 *             message, HTTP-style status code.
 *
 * The columns are documented for users in README.md ("Metrics database");
 * schema version 2 added who runs a run (pid, host, boot id, process start) and
 * the status "died"; version 3 the wall-clock times, preemptions, restored_tokens
 * and error_message (NULL in rows written by version 1).
 *
 * Request rows are queued in memory and written in batches, one transaction
 * per batch (every 256 rows or every 2 s by default, and on flush/run end):
 * a transaction per row would cost an fsync-ish WAL commit per request. The
 * handle writes them from a thread (and a connection) of its own, so adding
 * a row never waits on SQLite: while another process holds the write lock,
 * rows queue up and are written when it is free (a failed batch is tried
 * again about a second later). Flushing, ending a run and closing wait for
 * the queue, at most metrics_set_drain_timeout seconds (default
 * METRICS_DRAIN_SECONDS), and then say how many rows could not be written
 * and why.
 *
 * Several processes may share one database file: each holds its own handle,
 * writes take SQLite's write lock only for the length of one batch, and a busy
 * lock is waited for (busy_timeout) rather than failed. A handle itself is NOT
 * thread-safe: use one handle per thread, or lock around every call.
 *
 * The schema carries an application id (PRAGMA application_id, 'KVBM') and a
 * schema version (PRAGMA user_version). Opening upgrades an older kvbatch
 * schema step by step; a newer one, or a database belonging to something
 * else, is refused with a message rather than written into.
 *
 * A request counts as ok when its status_code is 2xx and it has no
 * error_code; everything else counts as failed (derived totals, report).
 *
 * Errors: every call returns an enum kvb_status and, when `err` is non-NULL,
 * fills err->msg with the database path and SQLite's own message. SQLite codes
 * map to KVB_ERR_IO (cannot open, busy past the timeout, disk full, read-only),
 * KVB_ERR_FORMAT (not a database, corrupt, not a kvbatch database, schema
 * mismatch), KVB_ERR_UNSUPPORTED (schema written by a newer kvbatch),
 * KVB_ERR_NOT_FOUND (no such run), KVB_ERR_NOMEM.
 */
#ifndef KVB_METRICS_H
#define KVB_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

/* Schema version this build writes (PRAGMA user_version). */
#define METRICS_SCHEMA_VERSION 3

/* Default batching of request rows (see metrics_set_batching). */
#define METRICS_BATCH_ROWS 256
#define METRICS_BATCH_SECONDS 2.0
/* Most request rows held in memory while the database refuses writes. */
#define METRICS_MAX_PENDING 65536
/* How long flush, run end and close wait for queued rows by default. */
#define METRICS_DRAIN_SECONDS 30.0

/* Passed as run_id to metrics_report: the run with the highest id. */
#define METRICS_RUN_LATEST ((int64_t)-1)

struct metrics_db; /* opaque handle: one SQLite connection plus the row buffer */

enum metrics_run_status {
    METRICS_RUN_RUNNING = 0, /* begun, not ended (or the process died) */
    METRICS_RUN_OK,          /* the job ran to the end (some lines may have failed) */
    METRICS_RUN_INTERRUPTED, /* stopped by SIGINT/SIGTERM; --resume continues it */
    METRICS_RUN_FAILED,      /* could not go on (I/O error, model error, …) */
    METRICS_RUN_DIED         /* its process ended without recording an end (killed, out of memory,
                                crashed, machine lost); set by a later open, see metrics_open */
};

/* The text stored in runs.status: "running", "ok", "interrupted", "failed", "died". */
const char *metrics_run_status_name(enum metrics_run_status st);

/* What a run is. Every string is copied; NULL is stored as SQL NULL. */
struct metrics_run_info {
    const char *job_file;          /* input JSONL path as given */
    const char *output_file;       /* output JSONL path as given */
    const char *model;             /* model path or name */
    const char *model_fingerprint; /* hex identity of the weights (same as the prefix store's) */
    const char *backend;           /* "cpu", "cuda", … */
    const char *settings;          /* JSON object text of the run's settings (not validated) */
};

/* One request's outcome. Strings are copied at metrics_request_add; NULL is
 * stored as SQL NULL. */
struct metrics_request {
    const char *custom_id;       /* NULL when the input line had none */
    int64_t input_line;          /* 1-based line number in the job file */
    int64_t prompt_tokens;       /* tokens of the templated prompt */
    int64_t cached_tokens_run;   /* prompt tokens reused from the in-run prefix cache (radix tree) */
    int64_t cached_tokens_store; /* prompt tokens reused from the persistent store (LMDB) */
    int64_t completion_tokens;   /* tokens generated */
    /* Latencies, seconds. Stored only when has_timing (a request rejected at
     * parse time has none): queue_s from read to first scheduled, ttft_s from
     * read to first output token, e2e_s from read to last token. tpot_s is the
     * mean interval between output tokens, (last - first) / (completion - 1),
     * and is stored only when completion_tokens >= 2 (no interval otherwise). */
    bool has_timing;
    double queue_s, ttft_s, tpot_s, e2e_s;
    const char *finish_reason; /* "stop", "length", … or NULL */
    const char *error_code;    /* NULL on success, else e.g. "invalid_json" */
    const char *error_message; /* NULL on success, else the message of its error line */
    int status_code;           /* 200 on success, 400 for a bad line, 500 … */
    /* Wall-clock times, unix seconds (0, negative or not finite: unknown,
     * stored as NULL): submitted_at when the line was read and queued for
     * the scheduler, started_at when it was first admitted (its prefill
     * began), first_token_at when its first output token was sampled,
     * ended_at when it finished — for a rejected line, when its error line
     * was written. Independent of has_timing. */
    double submitted_at, started_at, first_token_at, ended_at;
    int64_t preemptions;     /* times the scheduler preempted it (0 when never scheduled) */
    int64_t restored_tokens; /* positions whose K/V those preemptions dropped (rebuilt later) */
};

/* Totals recorded at run end. */
struct metrics_totals {
    int64_t requests_total, requests_ok, requests_failed;
    int64_t prompt_tokens, completion_tokens;
    int64_t cached_tokens_run;                     /* prompt tokens reused from the in-run prefix cache */
    int64_t cached_tokens_store;                   /* prompt tokens reused from the persistent store */
    int64_t prefill_tokens_computed;               /* prompt tokens that went through a forward pass */
    int64_t store_bytes_read, store_bytes_written; /* persistent store traffic, bytes */
    double wall_seconds;                           /* the run's wall time (monotonic clock) */
};

/* Counters of this handle's buffered writes (for logs and tests). */
struct metrics_counters {
    int64_t rows_pending;    /* request rows queued, not yet written */
    int64_t rows_written;    /* request rows committed by this handle */
    int64_t batches_written; /* transactions that committed request rows */
    int64_t flush_failures;  /* write attempts that failed (their rows stayed queued) */
    int64_t rows_refused;    /* rows not queued: METRICS_MAX_PENDING were waiting */
};

/* Opens the database at `path`, creating the file and the schema if absent,
 * upgrading an older kvbatch schema; sets WAL mode and a busy timeout.
 * Runs still 'running' that were begun on this machine by a process that
 * is gone (no such pid, a pid reused by a later process, or a reboot since)
 * are marked 'died'; runs of other machines are left as they are. That is
 * best effort and never waits for a lock (a busy file is left for the next
 * open).
 * On success *out owns the connection until metrics_close(). On failure *out
 * is NULL. A path in a missing directory gives KVB_ERR_IO naming the
 * directory; a file that is not SQLite gives KVB_ERR_FORMAT. */
enum kvb_status metrics_open(const char *path, struct metrics_db **out, struct kvb_err *err);

/* As metrics_open, but the file must already exist and hold a kvbatch metrics
 * schema (for readers such as `kvbatch report`): nothing is created.
 * KVB_ERR_IO when the file is missing, KVB_ERR_FORMAT when it is not ours. */
enum kvb_status metrics_open_existing(const char *path, struct metrics_db **out, struct kvb_err *err);

/* Writes any queued rows (waiting at most the drain timeout, or not at all
 * when a flush already gave up; errors ignored: call metrics_flush or
 * metrics_run_end first to know), then closes. Runs still 'running' stay
 * so. Accepts NULL. */
void metrics_close(struct metrics_db *db);

/* The path the handle was opened with; valid until metrics_close(). */
const char *metrics_path(const struct metrics_db *db);

/* Batching of request rows: a batch (every row queued then) is written
 * when `max_rows` rows are queued or when the oldest queued row is
 * `max_seconds` old (by the handle's writer thread; nothing to call).
 * max_rows >= 1, max_seconds >= 0. */
enum kvb_status metrics_set_batching(struct metrics_db *db, int max_rows, double max_seconds);

/* How long one write waits for another process's lock before that attempt
 * fails (default 10000 ms): the writer thread then tries again; run begin
 * and end fail with KVB_ERR_IO. ms >= 0. */
enum kvb_status metrics_set_busy_timeout(struct metrics_db *db, int ms);

/* How long flush, run end and close wait for queued rows (default
 * METRICS_DRAIN_SECONDS). seconds >= 0. */
enum kvb_status metrics_set_drain_timeout(struct metrics_db *db, double seconds);

/* Inserts a runs row with status 'running' and started_at = now; writes it at
 * once (not buffered) so a concurrent reader sees the run. *run_id receives
 * the new id. */
enum kvb_status metrics_run_begin(struct metrics_db *db, const struct metrics_run_info *info, int64_t *run_id,
                                  struct kvb_err *err);

/* Queues one request row of run `run_id` (copied) for the writer thread;
 * never waits on the database. KVB_OK when queued; past METRICS_MAX_PENDING
 * queued rows further rows are refused (KVB_ERR_RANGE, counted) so that a
 * dead database cannot eat memory; KVB_ERR_NOMEM. Write failures are not
 * reported here but by the next flush or run end (and counted). The run id
 * is not checked (a row of a missing run is written all the same). */
enum kvb_status metrics_request_add(struct metrics_db *db, int64_t run_id, const struct metrics_request *req,
                                    struct kvb_err *err);

/* Waits until every queued row is written, at most the drain timeout:
 * KVB_ERR_IO saying how many rows are still queued and why the last write
 * failed (they stay queued). */
enum kvb_status metrics_flush(struct metrics_db *db, struct kvb_err *err);

/* Flushes, then sets the run's status, ended_at = now and totals — also
 * when the flush timed out (then KVB_ERR_IO saying how many rows could not
 * be written and why, and that the end is recorded). With
 * totals == NULL the request counts and token sums are computed from the
 * run's request rows, prefill_tokens_computed is set to prompt minus both
 * cached counts, store bytes to 0 and wall_seconds to ended_at - started_at.
 * KVB_ERR_NOT_FOUND if there is no such run. */
enum kvb_status metrics_run_end(struct metrics_db *db, int64_t run_id, enum metrics_run_status status,
                                const struct metrics_totals *totals, struct kvb_err *err);

void metrics_get_counters(const struct metrics_db *db, struct metrics_counters *out);

/* Writes "kvbatch.db" in the directory of `output_file` into buf (the default
 * --metrics path). KVB_ERR_RANGE if it does not fit in `cap`. */
enum kvb_status metrics_default_path(const char *output_file, char *buf, size_t cap);

/* ---- reading (metrics_report.c) ------------------------------------------ */

/* Nearest-rank percentile of `sorted` (ascending, n values): the value at
 * 1-based rank ceil(pct/100 * n), computed in integers; pct in 1..100.
 * Returns NAN when n == 0. */
double metrics_percentile(const double *sorted, size_t n, unsigned pct);

/* Prints a human summary of run `run_id` (METRICS_RUN_LATEST for the most
 * recent): identity, status, times, request counts and top error codes,
 * tokens, throughput, p50/p95/p99/max (milliseconds) of queue time, time to
 * first token, time per output token and end-to-end time, prefix reuse from
 * the in-run cache and from the persistent store, store traffic. Buffered
 * rows of this handle are flushed first. KVB_ERR_NOT_FOUND when the run does not exist or the
 * database holds no run. A run that never ended has its totals derived from
 * its request rows, and the report says so. */
enum kvb_status metrics_report(struct metrics_db *db, int64_t run_id, FILE *out, struct kvb_err *err);

/* Prints one line per run (id, start, status, requests ok/total, wall time,
 * model, job), oldest first, or a line saying that there are none.
 * *n_runs (if non-NULL) receives the number of runs. */
enum kvb_status metrics_list_runs(struct metrics_db *db, FILE *out, int64_t *n_runs, struct kvb_err *err);

/* metrics_report of the latest run of each of n databases taken as one run
 * (the shards of a job, `kvbatch run --shard`): counts and tokens summed,
 * percentiles over all request rows, wall time from the first start to the
 * last end, status the worst of them (metrics_combine.c). The databases
 * are only read; the combination is built in a temporary file, removed
 * before returning. KVB_ERR_NOT_FOUND when a database holds no run;
 * KVB_ERR_INVALID_ARG when the sums would be wrong: one run given twice,
 * one shard twice, or shards of different splits (other N, or another plan
 * hash: `shard_plan` in the runs' settings). Missing shards and resumed
 * runs, whose sums are partial, get a "warning:" line on out. */
enum kvb_status metrics_report_combined(const char *const *paths, int n, FILE *out, struct kvb_err *err);

#endif
