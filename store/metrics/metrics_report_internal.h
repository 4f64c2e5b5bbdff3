/* metrics_report_internal.h — what the reading side of the metrics store
 * shares among its own files (metrics_report.c, metrics_export.c,
 * metrics_combine.c, metrics_html.c) and nothing else: JSON and CSV
 * writing, one row of the list of runs, the combined database. */
#ifndef KVB_METRICS_REPORT_INTERNAL_H
#define KVB_METRICS_REPORT_INTERNAL_H

#include <stdio.h>

#include "store/metrics/metrics_report.h"

/* JSON pieces: a string literal (NULL: null; invalid UTF-8 as U+FFFD), a
 * number (not finite: null). */
void metrics_json_str(FILE *out, const char *s);
void metrics_json_num(FILE *out, double v);

/* One CSV field, quoted when it holds a comma, quote, CR or LF (RFC 4180);
 * NULL is the empty field. */
void metrics_csv_str(FILE *out, const char *s);
void metrics_csv_num(FILE *out, double v); /* not finite: empty */

/* The JSON form of a summary (metrics_summary_print). */
void metrics_summary_json(const struct metrics_summary *s, const struct metrics_combined_info *combined, FILE *out);

/* One run as --list shows it; strings borrowed, NULL when not recorded. */
struct metrics_run_list_row {
    int64_t id;
    double started_at, ended_at, wall_seconds;
    bool ended, has_wall;
    const char *status, *model, *job_file, *output_file, *backend;
    int64_t requests_ok, requests_total;
};
void metrics_run_list_json(const struct metrics_run_list_row *r, FILE *out);
void metrics_run_list_csv_header(FILE *out);
void metrics_run_list_csv_row(const struct metrics_run_list_row *r, FILE *out);

/* Builds the combination of the latest runs of paths[0..n) in a temporary
 * database (metrics_combine.c): on success *db is open on it, run 1 is the
 * sum, and tmp_dir (at least 64 bytes) names the directory to hand to
 * metrics_combined_close. Warnings ("warning: …\n" lines) go to `warn`
 * (NULL: dropped). */
enum kvb_status metrics_combined_open(const char *const *paths, int n, FILE *warn, struct metrics_db **db,
                                      char *tmp_dir, struct kvb_err *err);
void metrics_combined_close(struct metrics_db *db, const char *tmp_dir);

/* Local time as "YYYY-MM-DD HH:MM:SS +ZZZZ" (as the text report prints it). */
void metrics_fmt_time(char *buf, size_t cap, double unix_s);

#endif
