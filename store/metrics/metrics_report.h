/* metrics_report.h — reading a run back out of the metrics store: the
 * figures of `kvbatch report` gathered in one struct, and the forms they are
 * printed in (text for people; JSON and CSV for programs, whose layout is
 * stable and documented in README.md, "kvbatch report"; a self-contained
 * HTML page with charts).
 *
 * The text form (metrics_report in metrics.h) is one rendering of struct
 * metrics_summary; JSON and CSV are two more of the same struct, so the
 * three always carry the same figures. Everything here only reads the
 * database (apart from the flush of the handle's own buffered rows and the
 * schema upgrade any open does). Strings in a summary are owned by it
 * (metrics_summary_free). */
#ifndef KVB_METRICS_REPORT_H
#define KVB_METRICS_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "store/metrics/metrics.h"

/* Version of the JSON and CSV layouts (the "kvbatch_report" key; CSV has no
 * header line for it, its columns only grow at the end). Bumped only when a
 * field changes meaning or goes away. */
#define METRICS_REPORT_FORMAT_VERSION 1

enum metrics_format { METRICS_FORMAT_TEXT = 0, METRICS_FORMAT_JSON, METRICS_FORMAT_CSV };

/* "text", "json", "csv" -> the format; false for anything else. */
bool metrics_format_parse(const char *name, enum metrics_format *out);

/* One outcome and how often it happened: an error code (a failure without
 * one is keyed "status N") or a finish reason. */
struct metrics_count {
    char *key;
    int64_t n;
    char *example; /* errors: the message of the earliest such line (NULL when not recorded) */
};

/* Nearest-rank percentiles of one latency over a run's requests, seconds;
 * all NAN when n == 0. */
struct metrics_dist {
    size_t n;
    double p50, p95, p99, max;
};

struct metrics_summary {
    int64_t run_id;
    char *label; /* first line of the text form: "run N", or "all of them" for a combination */
    char *status, *job_file, *output_file, *model, *fingerprint, *backend, *settings; /* NULL: not recorded */
    bool settings_json;          /* settings is well-formed JSON (the JSON form embeds it as an object) */
    double started_at, ended_at; /* unix seconds; ended_at only when `ended` */
    bool ended;
    bool has_totals; /* the run recorded its totals; false: t is derived from its request rows */
    bool has_wall;   /* t.wall_seconds is known and > 0 (throughput is over it) */
    struct metrics_totals t;
    struct metrics_count *errors; /* every failure key, most frequent first (ties by key) */
    size_t n_errors;
    struct metrics_count *finish; /* every finish reason, most frequent first */
    size_t n_finish;
    struct metrics_dist queue, ttft, tpot, e2e;
    /* Preemptions, from the rows that record them (schema 2 on): */
    int64_t rows_with_preemptions; /* rows that carry the column; 0: not recorded */
    int64_t preempted_requests;    /* requests preempted at least once */
    int64_t preemptions;           /* times, summed */
    int64_t restored_tokens;       /* positions their preemptions dropped, summed */
};

/* Reads every figure of run `run_id` (METRICS_RUN_LATEST: the latest).
 * label NULL gives "run N". Errors as metrics_report. On success the caller
 * frees s with metrics_summary_free; on failure s holds nothing to free. */
enum kvb_status metrics_summary_load(struct metrics_db *db, int64_t run_id, const char *label,
                                     struct metrics_summary *s, struct kvb_err *err);
void metrics_summary_free(struct metrics_summary *s); /* accepts a zeroed struct */

/* Writes s in format fmt. Text: the human summary (metrics_report).
 * JSON: one object, documented in README.md, ending in "\n". CSV: a header
 * line and one row (metrics_summary_csv_header, metrics_summary_csv_row).
 * `combined` (may be NULL): the databases a combination was made of and its
 * warnings (lines of text) go in JSON's "combined" member and in CSV's last
 * two columns. */
struct metrics_combined_info {
    const char *const *paths;
    int n_paths;
    const char *warnings; /* "warning: …\n" lines, or NULL */
};
void metrics_summary_print(const struct metrics_summary *s, enum metrics_format fmt,
                           const struct metrics_combined_info *combined, FILE *out);
void metrics_summary_csv_header(FILE *out);
void metrics_summary_csv_row(const struct metrics_summary *s, const struct metrics_combined_info *combined, FILE *out);

/* metrics_report in format fmt. */
enum kvb_status metrics_report_format(struct metrics_db *db, int64_t run_id, enum metrics_format fmt, FILE *out,
                                      struct kvb_err *err);

/* metrics_report_combined in format fmt. The warnings go, for text, on out
 * before the summary (as metrics_report_combined); for JSON into the object;
 * for CSV into its warnings column and to `warn` (stderr, say; NULL: not). */
enum kvb_status metrics_report_combined_format(const char *const *paths, int n, enum metrics_format fmt, FILE *out,
                                               FILE *warn, struct kvb_err *err);

/* metrics_list_runs in format fmt: JSON {"kvbatch_runs": 1, "runs": [...]},
 * CSV a header and one row per run (README.md). */
enum kvb_status metrics_list_runs_format(struct metrics_db *db, enum metrics_format fmt, FILE *out, int64_t *n_runs,
                                         struct kvb_err *err);

/* Writes one self-contained HTML page (inline CSS and SVG; no script, no
 * font, image or style fetched from anywhere) about the runs of `paths`:
 * with one database, run `run_id` (METRICS_RUN_LATEST: the latest) and a
 * table of every run in it; with several, the latest run of each, summed
 * as metrics_report_combined does, each drawn as its own line. Charts:
 * throughput over time, running/waiting sequences over time, latency
 * distributions (time to first token, per output token, end to end, queue),
 * prefix reuse, error counts, and a table of the slowest requests
 * (metrics_html.c says how each is derived). Errors as the text report's. */
enum kvb_status metrics_report_html(const char *const *paths, int n, int64_t run_id, FILE *out, struct kvb_err *err);

#endif
