/* metrics_html_internal.h — private to store/metrics: what the HTML page
 * (metrics_html.c) reads from a database (metrics_html_data.c): each drawn
 * run's rows, latencies and summary, and the slowest requests. */
#ifndef KVB_METRICS_HTML_INTERNAL_H
#define KVB_METRICS_HTML_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "store/metrics/metrics.h"
#include "store/metrics/metrics_report.h"
#include "store/metrics/metrics_series.h"

#define HTML_SLOWEST 15  /* rows of the slowest-requests table */
#define HTML_MAX_RUNS 40 /* rows of the runs table of one database (the latest ones) */
/* ok = a 2xx status and no error code (as everywhere else) */
#define FAILED_ROW "NOT (error_code IS NULL AND status_code BETWEEN 200 AND 299)"

/* the latencies drawn, in the order of the columns load_rows reads (ttft_s, tpot_s, e2e_s, queue_s) */
enum { LAT_TTFT, LAT_TPOT, LAT_E2E, LAT_QUEUE, N_LAT };

struct slow_row {
    int run; /* index into the drawn runs */
    int64_t line, prompt, cached_run, cached_store, completion, preemptions, restored;
    bool has_preemptions;
    double queue, ttft, tpot, e2e;
    char *custom_id, *finish;
    int status;
};

/* One run drawn on the page. */
struct html_run {
    const char *db_path; /* borrowed */
    char name[160];      /* its legend label */
    const char *color;
    struct metrics_summary sum;
    struct series_req *req; /* rows with a start time (charts over time) */
    size_t n_req;
    double *fail_at; /* end time of each failed row that has one */
    size_t n_fail;
    double *lat[N_LAT]; /* sorted, seconds */
    size_t n_lat[N_LAT];
    double t0, t_last; /* the run's start; the latest time of any of its rows */
};

/* Frees what a run's rows own (accepts a zeroed run). */
void html_run_free(struct html_run *r);
/* The run's rows (r->sum.run_id of db): times for the charts, sorted
 * latencies, failures. KVB_ERR_NOMEM; an SQL failure as metrics_sql_err
 * translates it. */
enum kvb_status html_load_rows(struct metrics_db *db, struct html_run *r, struct kvb_err *err);
void html_slow_free(struct slow_row *s, size_t n);
/* Appends run ri's (run_id of db) HTML_SLOWEST slowest rows to *rows. */
enum kvb_status html_load_slowest(struct metrics_db *db, int ri, int64_t run_id, struct slow_row **rows, size_t *n,
                                  struct kvb_err *err);
/* Ids of db's runs, the latest HTML_MAX_RUNS, oldest first (*ids kvb_malloc'd). */
enum kvb_status html_list_run_ids(struct metrics_db *db, int64_t **ids, size_t *n, struct kvb_err *err);

#endif
