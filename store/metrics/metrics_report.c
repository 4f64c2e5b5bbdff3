/* metrics_report.c — reading side of the metrics store: every figure of one
 * run gathered into a struct metrics_summary (metrics_report.h), its human
 * text form (`kvbatch report DB [--run ID]`), and the list of runs
 * (`--list`). The JSON and CSV forms of the same struct are in
 * metrics_export.c, the HTML page in metrics_html.c.
 *
 * Counts and sums come from SQL; percentiles are computed here in C from the
 * raw per-request values (SQLite has no percentile function, and computing
 * them ourselves pins down the method: nearest rank, see metrics_percentile).
 * A run that never reached metrics_run_end (still running, or its process
 * was killed) has no totals in its runs row; its counts are then derived from
 * its request rows and the report says so. Nothing here writes the database
 * except the flush of the handle's own buffered rows. */
#include "store/metrics/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "store/metrics/metrics_internal.h"
#include "store/metrics/metrics_report.h"
#include "store/metrics/metrics_report_internal.h"

/* Error codes shown by name in a report; the rest are summed into one line. */
#define REPORT_TOP_ERRORS 5

/* SQL condition for a failed request row: ok = a 2xx status and no error
 * code, the same rule as metrics_run_end's derived totals. */
#define OK_ROW "(error_code IS NULL AND status_code BETWEEN 200 AND 299)"
#define FAILED_ROW "NOT " OK_ROW

/* Nearest-rank method: for n sorted values x[1..n] the p-th percentile is
 * x[ceil(p * n / 100)]. It is always one of the observed values (no
 * interpolation), so "p95 = 1.2 s" means some request really took 1.2 s.
 * The rank is computed in integers so that 1..100 gives p95 = 95 exactly. */
double metrics_percentile(const double *sorted, size_t n, unsigned pct)
{
    if (n == 0) return NAN;
    if (pct < 1) pct = 1;
    if (pct > 100) pct = 100;
    size_t rank = (size_t)(((unsigned long long)pct * n + 99) / 100); /* ceil(pct * n / 100), >= 1 */
    return sorted[rank - 1];
}

/* One run's row, read once; strings copied so statements can be finalized. */
struct run_row {
    int64_t id;
    char *job_file, *output_file, *model, *fingerprint, *backend, *settings, *status;
    double started_at, ended_at;
    bool ended, has_totals, settings_json;
    struct metrics_totals t;
};

static void run_row_free(struct run_row *r)
{
    kvb_free(r->job_file);
    kvb_free(r->output_file);
    kvb_free(r->model);
    kvb_free(r->fingerprint);
    kvb_free(r->backend);
    kvb_free(r->settings);
    kvb_free(r->status);
}

/* Copies text column `col` (NULL stays NULL); false only when out of memory. */
static bool col_dup(sqlite3_stmt *st, int col, char **out)
{
    const unsigned char *s = sqlite3_column_text(st, col);
    *out = NULL;
    if (!s) return true;
    *out = kvb_strndup((const char *)s, (size_t)sqlite3_column_bytes(st, col));
    return *out != NULL;
}

static enum kvb_status sql_fail(struct metrics_db *db, struct kvb_err *err, int rc, const char *what)
{
    return metrics_sql_err(metrics_sqlite(db), metrics_path(db), err, rc, what);
}

static enum kvb_status read_run(struct metrics_db *db, int64_t run_id, struct run_row *r, struct kvb_err *err)
{
    static const char cols[] =
        "SELECT id, job_file, output_file, model, model_fingerprint, backend, settings, started_at, ended_at,"
        " status, requests_total, requests_ok, requests_failed, prompt_tokens, completion_tokens,"
        " cached_tokens_run, cached_tokens_store, prefill_tokens_computed, store_bytes_read,"
        " store_bytes_written, wall_seconds, coalesce(json_valid(settings), 0) FROM runs ";
    char q[sizeof cols + 64];
    snprintf(q, sizeof q, "%s%s", cols, run_id == METRICS_RUN_LATEST ? "ORDER BY id DESC LIMIT 1" : "WHERE id=?1");
    sqlite3 *sql = metrics_sqlite(db);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(sql, q, -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "reading runs");
    if (run_id != METRICS_RUN_LATEST) sqlite3_bind_int64(st, 1, run_id);
    rc = sqlite3_step(st);
    enum kvb_status ks = KVB_OK;
    if (rc == SQLITE_DONE) {
        if (run_id == METRICS_RUN_LATEST)
            ks = kvb_errf(err, KVB_ERR_NOT_FOUND, "%s: no runs recorded yet", metrics_path(db));
        else
            ks = kvb_errf(err, KVB_ERR_NOT_FOUND, "%s: no run with id %lld (--list shows the runs)", metrics_path(db),
                          (long long)run_id);
    } else if (rc != SQLITE_ROW) {
        ks = sql_fail(db, err, rc, "reading runs");
    } else {
        memset(r, 0, sizeof *r);
        r->id = sqlite3_column_int64(st, 0);
        bool ok = col_dup(st, 1, &r->job_file) && col_dup(st, 2, &r->output_file) && col_dup(st, 3, &r->model) &&
                  col_dup(st, 4, &r->fingerprint) && col_dup(st, 5, &r->backend) && col_dup(st, 6, &r->settings) &&
                  col_dup(st, 9, &r->status);
        r->started_at = sqlite3_column_double(st, 7);
        r->ended = sqlite3_column_type(st, 8) != SQLITE_NULL;
        r->ended_at = sqlite3_column_double(st, 8);
        r->has_totals = sqlite3_column_type(st, 10) != SQLITE_NULL;
        int64_t *v[] = {
            &r->t.requests_total,    &r->t.requests_ok,        &r->t.requests_failed,     &r->t.prompt_tokens,
            &r->t.completion_tokens, &r->t.cached_tokens_run,  &r->t.cached_tokens_store, &r->t.prefill_tokens_computed,
            &r->t.store_bytes_read,  &r->t.store_bytes_written};
        for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++) *v[i] = sqlite3_column_int64(st, 10 + i);
        r->t.wall_seconds = sqlite3_column_double(st, 20);
        r->settings_json = sqlite3_column_int(st, 21) != 0;
        if (!ok) {
            run_row_free(r);
            ks = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory reading a run", metrics_path(db));
        }
    }
    sqlite3_finalize(st);
    return ks;
}

/* For a run without totals: counts and token sums from its request rows.
 * ok = a 2xx status and no error code, the same rule as metrics_run_end. */
static enum kvb_status derive_totals(struct metrics_db *db, struct run_row *r, struct kvb_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        metrics_sqlite(db),
        "SELECT count(*), total(ok), total(prompt_tokens), total(completion_tokens), total(cached_tokens_run),"
        " total(cached_tokens_store)"
        " FROM (SELECT *, " OK_ROW " AS ok FROM requests WHERE run_id=?1)",
        -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, r->id);
        rc = sqlite3_step(st);
    }
    if (rc == SQLITE_ROW) {
        struct metrics_totals *t = &r->t;
        t->requests_total = sqlite3_column_int64(st, 0);
        t->requests_ok = sqlite3_column_int64(st, 1);
        t->requests_failed = t->requests_total - t->requests_ok;
        t->prompt_tokens = sqlite3_column_int64(st, 2);
        t->completion_tokens = sqlite3_column_int64(st, 3);
        t->cached_tokens_run = sqlite3_column_int64(st, 4);
        t->cached_tokens_store = sqlite3_column_int64(st, 5);
        t->prefill_tokens_computed = t->prompt_tokens - t->cached_tokens_run - t->cached_tokens_store;
        if (t->prefill_tokens_computed < 0) t->prefill_tokens_computed = 0;
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "summing request rows");
    return KVB_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Loads the non-NULL values of REAL column `col` of a run's requests, sorted;
 * *vals is kvb_malloc'd (NULL when n == 0). `col` is one of our own names. */
static enum kvb_status load_sorted(struct metrics_db *db, int64_t run_id, const char *col, double **vals, size_t *n,
                                   struct kvb_err *err)
{
    char q[128];
    snprintf(q, sizeof q, "SELECT %s FROM requests WHERE run_id=?1 AND %s IS NOT NULL", col, col);
    *vals = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(metrics_sqlite(db), q, -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "reading request latencies");
    sqlite3_bind_int64(st, 1, run_id);
    double *v = NULL;
    size_t len = 0, cap = 0;
    enum kvb_status ks = KVB_OK;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (len == cap) {
            cap = cap ? cap * 2 : 1024;
            double *nv = kvb_realloc(v, cap * sizeof *nv);
            if (!nv) {
                ks = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory reading request latencies", metrics_path(db));
                break;
            }
            v = nv;
        }
        v[len++] = sqlite3_column_double(st, 0);
    }
    if (ks == KVB_OK && rc != SQLITE_DONE) ks = sql_fail(db, err, rc, "reading request latencies");
    sqlite3_finalize(st);
    if (ks != KVB_OK) {
        kvb_free(v);
        return ks;
    }
    if (len) qsort(v, len, sizeof *v, cmp_double);
    *vals = v;
    *n = len;
    return KVB_OK;
}

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

void metrics_fmt_time(char *buf, size_t cap, double unix_s)
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    if (!localtime_r(&t, &tm) || !strftime(buf, cap, "%Y-%m-%d %H:%M:%S %z", &tm)) snprintf(buf, cap, "%.0f", unix_s);
}

static void fmt_bytes(char *buf, size_t cap, int64_t b)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (b < 1024) {
        snprintf(buf, cap, "%lld B", (long long)b);
        return;
    }
    double v = (double)b;
    int u = -1;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, "%.1f %s (%lld bytes)", v, units[u], (long long)b);
}

static void print_share(FILE *out, const char *label, int64_t part, int64_t whole)
{
    if (whole > 0)
        fprintf(out, "  %-18s %10lld of %lld prompt tokens (%.1f %%)\n", label, (long long)part, (long long)whole,
                100.0 * (double)part / (double)whole);
    else fprintf(out, "  %-18s %10lld of 0 prompt tokens\n", label, (long long)part);
}

/* ---- loading the summary ------------------------------------------------------ */

static void counts_free(struct metrics_count *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++) {
        kvb_free(c[i].key);
        kvb_free(c[i].example);
    }
    kvb_free(c);
}

/* Every (key, count[, example]) of a GROUP BY over text expression `expr`
 * of a run's requests that satisfy `where`, most frequent first, ties by
 * key. `example`, when non-NULL, is a text expression taken from the row
 * with the smallest input_line of each group (SQLite's rule for a bare
 * column beside one min()). `expr`, `where`, `example` are our own SQL. */
static enum kvb_status load_counts(struct metrics_db *db, int64_t run_id, const char *expr, const char *where,
                                   const char *example, struct metrics_count **out, size_t *n_out, struct kvb_err *err)
{
    char q[768];
    snprintf(q, sizeof q,
             "SELECT %s AS k, count(*) AS n, min(input_line), %s FROM requests WHERE run_id=?1 AND (%s)"
             " GROUP BY k ORDER BY n DESC, k",
             expr, example ? example : "NULL", where);
    *out = NULL;
    *n_out = 0;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(metrics_sqlite(db), q, -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "counting request outcomes");
    sqlite3_bind_int64(st, 1, run_id);
    struct metrics_count *c = NULL;
    size_t n = 0, cap = 0;
    enum kvb_status ks = KVB_OK;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            struct metrics_count *nc = kvb_realloc(c, cap * sizeof *nc);
            if (!nc) {
                ks = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory counting request outcomes", metrics_path(db));
                break;
            }
            c = nc;
        }
        struct metrics_count *e = &c[n];
        memset(e, 0, sizeof *e);
        e->n = sqlite3_column_int64(st, 1);
        n++;
        if (!col_dup(st, 0, &e->key) || !col_dup(st, 3, &e->example)) {
            ks = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory counting request outcomes", metrics_path(db));
            break;
        }
    }
    if (ks == KVB_OK && rc != SQLITE_DONE) ks = sql_fail(db, err, rc, "counting request outcomes");
    sqlite3_finalize(st);
    if (ks != KVB_OK) {
        counts_free(c, n);
        return ks;
    }
    *out = c;
    *n_out = n;
    return KVB_OK;
}

static enum kvb_status load_dist(struct metrics_db *db, int64_t run_id, const char *col, struct metrics_dist *d,
                                 struct kvb_err *err)
{
    double *v;
    size_t n;
    KVB_FORWARD_IF_ERROR(load_sorted(db, run_id, col, &v, &n, err));
    d->n = n;
    d->p50 = metrics_percentile(v, n, 50);
    d->p95 = metrics_percentile(v, n, 95);
    d->p99 = metrics_percentile(v, n, 99);
    d->max = n ? v[n - 1] : NAN;
    kvb_free(v);
    return KVB_OK;
}

static enum kvb_status load_preemptions(struct metrics_db *db, struct metrics_summary *s, struct kvb_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        metrics_sqlite(db),
        "SELECT count(preemptions), total(preemptions > 0), total(preemptions), total(restored_tokens)"
        " FROM requests WHERE run_id=?1",
        -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, s->run_id);
        rc = sqlite3_step(st);
    }
    if (rc == SQLITE_ROW) {
        s->rows_with_preemptions = sqlite3_column_int64(st, 0);
        s->preempted_requests = sqlite3_column_int64(st, 1);
        s->preemptions = sqlite3_column_int64(st, 2);
        s->restored_tokens = sqlite3_column_int64(st, 3);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "summing preemptions");
    return KVB_OK;
}

void metrics_summary_free(struct metrics_summary *s)
{
    if (!s) return;
    kvb_free(s->label);
    kvb_free(s->status);
    kvb_free(s->job_file);
    kvb_free(s->output_file);
    kvb_free(s->model);
    kvb_free(s->fingerprint);
    kvb_free(s->backend);
    kvb_free(s->settings);
    counts_free(s->errors, s->n_errors);
    counts_free(s->finish, s->n_finish);
    memset(s, 0, sizeof *s);
}

enum kvb_status metrics_summary_load(struct metrics_db *db, int64_t run_id, const char *label,
                                     struct metrics_summary *s, struct kvb_err *err)
{
    memset(s, 0, sizeof *s);
    KVB_FORWARD_IF_ERROR(metrics_flush(db, err));
    struct run_row r;
    KVB_FORWARD_IF_ERROR(read_run(db, run_id, &r, err));
    enum kvb_status st = KVB_OK;
    if (!r.has_totals) st = derive_totals(db, &r, err);
    /* The strings move from the row to the summary. */
    s->run_id = r.id;
    s->status = r.status;
    s->job_file = r.job_file;
    s->output_file = r.output_file;
    s->model = r.model;
    s->fingerprint = r.fingerprint;
    s->backend = r.backend;
    s->settings = r.settings;
    s->settings_json = r.settings_json;
    s->started_at = r.started_at;
    s->ended_at = r.ended_at;
    s->ended = r.ended;
    s->has_totals = r.has_totals;
    s->has_wall = r.has_totals && r.t.wall_seconds > 0;
    s->t = r.t;
    char buf[48];
    if (!label) snprintf(buf, sizeof buf, "run %lld", (long long)r.id);
    s->label = kvb_strndup(label ? label : buf, strlen(label ? label : buf));
    if (st == KVB_OK && !s->label)
        st = kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory reading a run", metrics_path(db));
    /* A failure without an error code is named by its status code. */
    if (st == KVB_OK)
        st = load_counts(db, s->run_id, "coalesce(error_code, 'status ' || status_code)", FAILED_ROW, "error_message",
                         &s->errors, &s->n_errors, err);
    if (st == KVB_OK)
        st = load_counts(db, s->run_id, "finish_reason", "finish_reason IS NOT NULL", NULL, &s->finish, &s->n_finish,
                         err);
    if (st == KVB_OK) st = load_dist(db, s->run_id, "queue_s", &s->queue, err);
    if (st == KVB_OK) st = load_dist(db, s->run_id, "ttft_s", &s->ttft, err);
    if (st == KVB_OK) st = load_dist(db, s->run_id, "tpot_s", &s->tpot, err);
    if (st == KVB_OK) st = load_dist(db, s->run_id, "e2e_s", &s->e2e, err);
    if (st == KVB_OK) st = load_preemptions(db, s, err);
    if (st != KVB_OK) metrics_summary_free(s);
    return st;
}

/* ---- the text form ---------------------------------------------------------------- */

/* "label key n, key n, …": at most `top` keys, the rest summed; nothing
 * when there are none. */
static void print_counts(FILE *out, const char *label, const struct metrics_count *c, size_t n, size_t top)
{
    if (n == 0) return;
    int64_t rest_n = 0;
    for (size_t i = 0; i < n; i++) {
        if (i < top) fprintf(out, "%s%s %lld", i ? ", " : label, or_dash(c[i].key), (long long)c[i].n);
        else rest_n += c[i].n;
    }
    if (n > top) fprintf(out, ", %lld others %lld", (long long)(n - top), (long long)rest_n);
    fputc('\n', out);
}

static void print_dist(FILE *out, const char *label, const struct metrics_dist *d)
{
    if (d->n == 0) fprintf(out, "  %-18s %10s %10s %10s %10s %8d\n", label, "-", "-", "-", "-", 0);
    else
        fprintf(out, "  %-18s %10.2f %10.2f %10.2f %10.2f %8zu\n", label, 1e3 * d->p50, 1e3 * d->p95, 1e3 * d->p99,
                1e3 * d->max, d->n);
}

static void print_text(const struct metrics_summary *s, FILE *out)
{
    const struct metrics_totals *t = &s->t;
    char buf[64];
    fprintf(out, "%s: %s\n", s->label, or_dash(s->status));
    fprintf(out, "  job                %s\n", or_dash(s->job_file));
    fprintf(out, "  output             %s\n", or_dash(s->output_file));
    fprintf(out, "  model              %s\n", or_dash(s->model));
    if (s->fingerprint) fprintf(out, "  model fingerprint  %s\n", s->fingerprint);
    fprintf(out, "  backend            %s\n", or_dash(s->backend));
    if (s->settings) fprintf(out, "  settings           %s\n", s->settings);
    metrics_fmt_time(buf, sizeof buf, s->started_at);
    fprintf(out, "  started            %s\n", buf);
    if (s->ended) {
        metrics_fmt_time(buf, sizeof buf, s->ended_at);
        fprintf(out, "  ended              %s\n", buf);
    } else if (s->status && !strcmp(s->status, "died")) {
        fprintf(out, "  ended              - (its process died without recording an end: killed, out of memory, "
                     "or crashed; `kvbatch run --resume` continues the job)\n");
    } else {
        fprintf(out, "  ended              - (still running, or its process died on another machine)\n");
    }
    if (s->has_wall) fprintf(out, "  wall time          %.2f s\n", t->wall_seconds);
    if (!s->has_totals)
        fprintf(out, "  (no totals recorded: figures below come from the request rows written so far)\n");

    fprintf(out, "requests             %lld total: %lld ok, %lld failed\n", (long long)t->requests_total,
            (long long)t->requests_ok, (long long)t->requests_failed);
    print_counts(out, "  errors             ", s->errors, s->n_errors, REPORT_TOP_ERRORS);
    print_counts(out, "  finish reasons     ", s->finish, s->n_finish, 8);
    int64_t total_tokens = t->prompt_tokens + t->completion_tokens;
    fprintf(out, "tokens               prompt %lld, completion %lld, total %lld\n", (long long)t->prompt_tokens,
            (long long)t->completion_tokens, (long long)total_tokens);
    if (s->has_wall)
        fprintf(out, "throughput           %.1f completion tok/s, %.1f total tok/s, %.2f requests/s (over wall time)\n",
                (double)t->completion_tokens / t->wall_seconds, (double)total_tokens / t->wall_seconds,
                (double)t->requests_total / t->wall_seconds);
    else fprintf(out, "throughput           - (no wall time recorded)\n");

    fprintf(out, "latency (ms)         %10s %10s %10s %10s %8s\n", "p50", "p95", "p99", "max", "n");
    print_dist(out, "queue", &s->queue);
    print_dist(out, "time to 1st token", &s->ttft);
    print_dist(out, "time per out token", &s->tpot);
    print_dist(out, "end to end", &s->e2e);
    if (s->rows_with_preemptions == 0 && t->requests_total > 0)
        fprintf(out, "preemptions          - (not recorded by the kvbatch that wrote this run)\n");
    else
        fprintf(out, "preemptions          %lld requests preempted, %lld times, %lld positions restored\n",
                (long long)s->preempted_requests, (long long)s->preemptions, (long long)s->restored_tokens);
    fprintf(out, "prefix reuse\n");
    print_share(out, "in-run cache", t->cached_tokens_run, t->prompt_tokens);
    print_share(out, "persistent store", t->cached_tokens_store, t->prompt_tokens);
    print_share(out, "prefill computed", t->prefill_tokens_computed, t->prompt_tokens);
    if (s->has_totals) {
        char rd[64], wr[64];
        fmt_bytes(rd, sizeof rd, t->store_bytes_read);
        fmt_bytes(wr, sizeof wr, t->store_bytes_written);
        fprintf(out, "store                read %s, written %s\n", rd, wr);
    } else {
        fprintf(out, "store                - (recorded when the run ends)\n");
    }
}

void metrics_summary_print(const struct metrics_summary *s, enum metrics_format fmt,
                           const struct metrics_combined_info *combined, FILE *out)
{
    switch (fmt) {
    case METRICS_FORMAT_JSON: metrics_summary_json(s, combined, out); return;
    case METRICS_FORMAT_CSV:
        metrics_summary_csv_header(out);
        metrics_summary_csv_row(s, combined, out);
        return;
    case METRICS_FORMAT_TEXT: break;
    }
    print_text(s, out);
}

enum kvb_status metrics_report_format(struct metrics_db *db, int64_t run_id, enum metrics_format fmt, FILE *out,
                                      struct kvb_err *err)
{
    struct metrics_summary s;
    KVB_FORWARD_IF_ERROR(metrics_summary_load(db, run_id, NULL, &s, err));
    metrics_summary_print(&s, fmt, NULL, out);
    metrics_summary_free(&s);
    return KVB_OK;
}

enum kvb_status metrics_report(struct metrics_db *db, int64_t run_id, FILE *out, struct kvb_err *err)
{
    return metrics_report_format(db, run_id, METRICS_FORMAT_TEXT, out, err);
}

enum kvb_status metrics_report_as(struct metrics_db *db, int64_t run_id, const char *label, FILE *out,
                                  struct kvb_err *err)
{
    struct metrics_summary s;
    KVB_FORWARD_IF_ERROR(metrics_summary_load(db, run_id, label, &s, err));
    print_text(&s, out);
    metrics_summary_free(&s);
    return KVB_OK;
}

/* ---- the list of runs ----------------------------------------------------------- */

enum kvb_status metrics_list_runs_format(struct metrics_db *db, enum metrics_format fmt, FILE *out, int64_t *n_runs,
                                         struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(metrics_flush(db, err));
    if (n_runs) *n_runs = 0;
    /* A run without totals (never ended) counts its request rows instead. */
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(metrics_sqlite(db),
                                "SELECT id, started_at, status,"
                                " coalesce(requests_ok, (SELECT count(*) FROM requests WHERE run_id=runs.id AND " OK_ROW
                                ")),"
                                " coalesce(requests_total, (SELECT count(*) FROM requests WHERE run_id=runs.id)),"
                                " wall_seconds, model, job_file, ended_at, output_file, backend FROM runs ORDER BY id",
                                -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "listing runs");
    int64_t n = 0;
    if (fmt == METRICS_FORMAT_JSON)
        fprintf(out, "{\"kvbatch_runs\": %d, \"database\": ", METRICS_REPORT_FORMAT_VERSION);
    if (fmt == METRICS_FORMAT_JSON) {
        metrics_json_str(out, metrics_path(db));
        fprintf(out, ", \"runs\": [");
    }
    if (fmt == METRICS_FORMAT_CSV) metrics_run_list_csv_header(out);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct metrics_run_list_row row = {
            .id = sqlite3_column_int64(st, 0),
            .started_at = sqlite3_column_double(st, 1),
            .status = (const char *)sqlite3_column_text(st, 2),
            .requests_ok = sqlite3_column_int64(st, 3),
            .requests_total = sqlite3_column_int64(st, 4),
            .has_wall = sqlite3_column_type(st, 5) != SQLITE_NULL,
            .wall_seconds = sqlite3_column_double(st, 5),
            .model = (const char *)sqlite3_column_text(st, 6),
            .job_file = (const char *)sqlite3_column_text(st, 7),
            .ended = sqlite3_column_type(st, 8) != SQLITE_NULL,
            .ended_at = sqlite3_column_double(st, 8),
            .output_file = (const char *)sqlite3_column_text(st, 9),
            .backend = (const char *)sqlite3_column_text(st, 10),
        };
        if (fmt == METRICS_FORMAT_JSON) {
            if (n) fputc(',', out);
            metrics_run_list_json(&row, out);
        } else if (fmt == METRICS_FORMAT_CSV) {
            metrics_run_list_csv_row(&row, out);
        } else {
            if (n == 0)
                fprintf(out, "%6s  %-25s  %-11s  %17s  %10s  %s\n", "id", "started", "status", "ok/requests", "wall",
                        "model / job");
            char when[64], wall[32];
            metrics_fmt_time(when, sizeof when, row.started_at);
            if (!row.has_wall) snprintf(wall, sizeof wall, "-");
            else snprintf(wall, sizeof wall, "%.1f s", row.wall_seconds);
            char counts[48];
            snprintf(counts, sizeof counts, "%lld/%lld", (long long)row.requests_ok, (long long)row.requests_total);
            fprintf(out, "%6lld  %-25s  %-11s  %17s  %10s  %s  %s\n", (long long)row.id, when, or_dash(row.status),
                    counts, wall, or_dash(row.model), or_dash(row.job_file));
        }
        n++;
    }
    sqlite3_finalize(st);
    if (fmt == METRICS_FORMAT_JSON) fprintf(out, "]}\n");
    if (rc != SQLITE_DONE) return sql_fail(db, err, rc, "listing runs");
    if (n == 0 && fmt == METRICS_FORMAT_TEXT) fprintf(out, "no runs recorded in %s\n", metrics_path(db));
    if (n_runs) *n_runs = n;
    return KVB_OK;
}

enum kvb_status metrics_list_runs(struct metrics_db *db, FILE *out, int64_t *n_runs, struct kvb_err *err)
{
    return metrics_list_runs_format(db, METRICS_FORMAT_TEXT, out, n_runs, err);
}
