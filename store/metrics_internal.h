/* metrics_internal.h — what metrics.c, metrics_report.c and
 * metrics_combine.c share and nothing else: the raw connection, the
 * SQLite-to-kvb_status translation, the labelled report. */
#ifndef KVB_METRICS_INTERNAL_H
#define KVB_METRICS_INTERNAL_H

#include <sqlite3.h>

#include "metrics.h"

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

#endif
