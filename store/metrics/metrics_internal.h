/* metrics_internal.h — what metrics.c, metrics_report.c and
 * metrics_combine.c share and nothing else: the raw connection, the
 * SQLite-to-kvb_status translation, the labelled report. */
#ifndef KVB_METRICS_INTERNAL_H
#define KVB_METRICS_INTERNAL_H

#include <sqlite3.h>

#include "store/metrics/metrics.h"

/* The handle's connection; owned by the handle. */
sqlite3 *metrics_sqlite(struct metrics_db *db);

/* The kvb_status for a SQLite result code. */
enum kvb_status metrics_sql_status(int rc);

/* Fills err with "path: what: sqlite message (code text)" and returns the
 * translated status. `sql` may be NULL (then only the code's text is used). */
enum kvb_status metrics_sql_err(sqlite3 *sql, const char *path, struct kvb_err *err, int rc, const char *what);

/* Wall-clock time, unix seconds with a fraction. */
double metrics_now_unix(void);

/* metrics_report with `label` in place of "run N" on its first line (NULL:
 * "run N"): for a run that is not one of the database's own
 * (metrics_combine.c). */
enum kvb_status metrics_report_as(struct metrics_db *db, int64_t run_id, const char *label, FILE *out,
                                  struct kvb_err *err);

/* ---- the request-row writer (metrics_writer.c) ---------------------------------- */

/* Queues request rows and writes them from a thread of its own, through a
 * connection of its own, so that adding a row never waits on SQLite. */
struct metrics_writer;

/* Nothing is opened or started until the first row. */
enum kvb_status metrics_writer_create(const char *path, int batch_rows, double batch_seconds, int busy_ms,
                                      struct metrics_writer **out, struct kvb_err *err);
/* Drains (at most drain_seconds), then stops the thread; rows still queued
 * are lost. Accepts NULL. */
void metrics_writer_free(struct metrics_writer *w, double drain_seconds);
/* Queues one row (copied). KVB_ERR_RANGE past METRICS_MAX_PENDING queued
 * rows (counted as refused), KVB_ERR_NOMEM. Never waits on the database. */
enum kvb_status metrics_writer_add(struct metrics_writer *w, int64_t run_id, const struct metrics_request *req,
                                   struct kvb_err *err);
/* Waits until every queued row is written, at most `seconds`: KVB_ERR_IO
 * with how many rows are left and why the last attempt failed. */
enum kvb_status metrics_writer_drain(struct metrics_writer *w, double seconds, struct kvb_err *err);
void metrics_writer_set_batching(struct metrics_writer *w, int rows, double seconds);
void metrics_writer_set_busy_timeout(struct metrics_writer *w, int ms);
void metrics_writer_counters(struct metrics_writer *w, struct metrics_counters *out);

/* Runs a statement that returns no rows (or whose rows are ignored) and
 * resets it: SQLITE_OK or the step's error code. */
int metrics_step_reset(sqlite3_stmt *st);

#endif
