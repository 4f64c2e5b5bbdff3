/* test_metrics_report.c — what the metrics store records per request since
 * schema 2 (wall-clock times, preemptions, error messages), the upgrade of a
 * schema-1 database, the series the HTML report draws (store/metrics_series.h)
 * held to hand-computed cases, the SVG writer's refusal to print non-finite
 * numbers, the summary/CSV/JSON forms of `kvbatch report` against known
 * rows, and the HTML page's structure. (Parsing the JSON and CSV and
 * loading the page in a browser are tests/pytest_report*.py.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/metrics/metrics.h"
#include "store/metrics/metrics_report.h"
#include "store/metrics/metrics_series.h"
#include "store/metrics/svg_chart.h"
#include "support/testutil.h"

static char tmpdir[256];

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmpdir, name); }

static int raw_exec(const char *path, const char *q)
{
    sqlite3 *s = NULL;
    int rc = sqlite3_open_v2(path, &s, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_exec(s, q, NULL, NULL, NULL);
    if (rc != SQLITE_OK) fprintf(stderr, "raw_exec: %s\n", sqlite3_errmsg(s));
    sqlite3_close(s);
    return rc;
}

/* One value of a query, as text (into buf) — "NULL" for SQL NULL. */
static const char *raw_text(const char *path, const char *q, char *buf, size_t cap)
{
    sqlite3 *s = NULL;
    snprintf(buf, cap, "(error)");
    if (sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s, q, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            snprintf(buf, cap, "%s", t ? (const char *)t : "NULL");
        } else {
            fprintf(stderr, "raw_text(%s): %s\n", q, sqlite3_errmsg(s));
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(s);
    return buf;
}

/* Runs f into a memory buffer and returns it (malloc'd, NUL-terminated). */
static char *capture(enum kvb_status (*f)(void *, FILE *), void *arg, enum kvb_status *st)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    *st = f(arg, m);
    fclose(m);
    return buf;
}

/* ---- schema 2: what a row records ------------------------------------------------ */

static void test_new_columns(void)
{
    char path[512], buf[256];
    path_in(path, sizeof path, "cols.db");
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    int64_t run = 0;
    CHECK_EQ_INT(metrics_run_begin(db, NULL, &run, &err), KVB_OK);
    struct metrics_request ok = {
        .custom_id = "a",
        .input_line = 1,
        .prompt_tokens = 40,
        .cached_tokens_run = 16,
        .completion_tokens = 8,
        .has_timing = true,
        .queue_s = 0.5,
        .ttft_s = 1,
        .tpot_s = 0.25,
        .e2e_s = 2.75,
        .finish_reason = "length",
        .status_code = 200,
        .submitted_at = 1000.25,
        .started_at = 1000.75,
        .first_token_at = 1001.25,
        .ended_at = 1003.0,
        .preemptions = 2,
        .restored_tokens = 70,
    };
    struct metrics_request bad = {
        .input_line = 2,
        .error_code = "invalid_json",
        .error_message = "line 2: invalid JSON at byte 3",
        .status_code = 400,
        .ended_at = 1000.5,
    };
    CHECK_EQ_INT(metrics_request_add(db, run, &ok, &err), KVB_OK);
    CHECK_EQ_INT(metrics_request_add(db, run, &bad, &err), KVB_OK);
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err), KVB_OK);
    metrics_close(db);
    CHECK(!strcmp(raw_text(path, "SELECT user_version FROM pragma_user_version", buf, sizeof buf), "3"));
    CHECK(!strcmp(raw_text(path,
                           "SELECT submitted_at || '/' || started_at || '/' || first_token_at || '/' || "
                           "ended_at || '/' || preemptions || '/' || restored_tokens FROM requests "
                           "WHERE input_line = 1",
                           buf, sizeof buf),
                  "1000.25/1000.75/1001.25/1003.0/2/70"));
    /* a rejected line: a message and an end time, no other time */
    CHECK(!strcmp(raw_text(path, "SELECT error_message FROM requests WHERE input_line = 2", buf, sizeof buf),
                  "line 2: invalid JSON at byte 3"));
    CHECK(!strcmp(raw_text(path,
                           "SELECT coalesce(submitted_at, 'NULL') || coalesce(started_at, 'NULL') || "
                           "ended_at FROM requests WHERE input_line = 2",
                           buf, sizeof buf),
                  "NULLNULL1000.5"));
    CHECK(!strcmp(raw_text(path, "SELECT error_message FROM requests WHERE input_line = 1", buf, sizeof buf), "NULL"));
}

/* A database written by schema 1 (the kvbatch before this one) is upgraded
 * in place when opened; its rows keep their figures and read NULL where
 * schema 2 added columns, and the report says the times are not recorded. */
static void test_upgrade_from_v1(void)
{
    char path[512], buf[256];
    path_in(path, sizeof path, "v1.db");
    CHECK_EQ_INT(
        raw_exec(
            path,
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
            "INSERT INTO runs (id, job_file, started_at, status) VALUES (1, 'old.jsonl', 1000, 'running');"
            "INSERT INTO requests VALUES (1, 'x', 1, 10, 0, 0, 5, 0.01, 0.1, 0.02, 0.2, 'stop', NULL, 200);"
            "PRAGMA application_id = 1263944269; PRAGMA user_version = 1;"),
        SQLITE_OK);
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_OK);
    if (!db) return;
    struct metrics_summary s;
    CHECK_EQ_INT(metrics_summary_load(db, METRICS_RUN_LATEST, NULL, &s, &err), KVB_OK);
    CHECK_EQ_INT(s.t.requests_total, 1);
    CHECK_EQ_INT(s.ttft.n, 1);
    CHECK(fabs(s.ttft.p50 - 0.1) < 1e-12);
    CHECK_EQ_INT(s.rows_with_preemptions, 0);
    metrics_summary_free(&s);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    CHECK_EQ_INT(metrics_report(db, METRICS_RUN_LATEST, m, &err), KVB_OK);
    fclose(m);
    CHECK_MSG(strstr(text, "preemptions          - (not recorded"), "%s", text);
    free(text);
    metrics_close(db);
    CHECK(!strcmp(raw_text(path, "SELECT user_version FROM pragma_user_version", buf, sizeof buf), "3"));
    CHECK(!strcmp(raw_text(path, "SELECT coalesce(ended_at, 'NULL') || coalesce(preemptions, 'NULL') FROM requests",
                           buf, sizeof buf),
                  "NULLNULL"));
    /* The page says why there is no chart over time rather than drawing an empty one. */
    const char *paths[1] = {path};
    char *page = NULL;
    m = open_memstream(&page, &len);
    CHECK_EQ_INT(metrics_report_html(paths, 1, METRICS_RUN_LATEST, m, &err), KVB_OK);
    fclose(m);
    CHECK(page && strstr(page, "No per-request times in this database"));
    free(page);
}

/* ---- series --------------------------------------------------------------------------- */

static bool near(double a, double b) { return fabs(a - b) < 1e-9; }

static void test_series(void)
{
    const struct series_bins b = {.t0 = 0, .dt = 1, .nbins = 4};
    /* queued at 0, admitted at 0.5, first token at 1, ended at 3 (5 tokens);
     * 10 prompt tokens computed over [0.5, 1) */
    struct series_req r[2] = {
        {.submitted = 0, .started = 0.5, .first = 1, .ended = 3, .prefill_tokens = 10, .output_tokens = 5},
        /* no times at all (a schema-1 row, a rejected line): nothing */
        {.submitted = NAN, .started = NAN, .first = NAN, .ended = NAN, .prefill_tokens = 7, .output_tokens = 3},
    };
    double run[4], wait[4], out[4], pre[4];
    series_occupancy(&b, r, 2, run, wait);
    CHECK(near(run[0], 0.5) && near(run[1], 1) && near(run[2], 1) && near(run[3], 0));
    CHECK(near(wait[0], 0.5) && near(wait[1], 0) && near(wait[2], 0) && near(wait[3], 0));
    series_throughput(&b, r, 2, out, pre);
    /* the first token at 1, the other 4 over (1, 3]: 2 per second */
    CHECK_MSG(near(out[0], 0) && near(out[1], 3) && near(out[2], 2) && near(out[3], 0), "%g %g %g %g", out[0], out[1],
              out[2], out[3]);
    CHECK(near(pre[0], 10) && near(pre[1], 0));

    /* Tokens are conserved: summed over the bins (times dt), every output
     * token inside the range counts once, whatever the bin width. */
    const struct series_bins fine = {.t0 = 0, .dt = 0.3, .nbins = 11};
    double o2[11], p2[11];
    series_throughput(&fine, r, 1, o2, p2);
    double so = 0, sp = 0;
    for (int k = 0; k < 11; k++) {
        so += o2[k] * fine.dt;
        sp += p2[k] * fine.dt;
    }
    CHECK(near(so, 5) && near(sp, 10));

    /* parts outside the bins are dropped; a point lands in its bin */
    double acc[4] = {0};
    series_add_interval(&b, -1, 1.5, 2, acc);
    CHECK(near(acc[0], 2) && near(acc[1], 1) && near(acc[2], 0));
    series_add_interval(&b, 2.5, 2.5, 3, acc);
    CHECK(near(acc[2], 3));
    series_add_interval(&b, 3, 1, 1, acc); /* reversed: nothing */
    series_add_interval(&b, NAN, 1, 1, acc);
    CHECK(near(acc[0], 2) && near(acc[1], 1) && near(acc[3], 0));
}

/* ---- SVG --------------------------------------------------------------------------------- */

static void test_svg(void)
{
    CHECK(near(svg_nice_step(10, 5), 2));
    CHECK(near(svg_nice_step(0.7, 5), 0.2));
    CHECK(near(svg_nice_step(3000, 100), 50));
    struct svg_axis a = {.lo = 3, .hi = 97};
    svg_axis_fit(&a);
    CHECK(near(a.lo, 0) && near(a.hi, 100));
    struct svg_axis l = {.lo = 0.3, .hi = 4200, .log = true};
    svg_axis_fit(&l);
    CHECK(near(l.lo, 0.1) && near(l.hi, 10000));

    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    struct svg_plot p;
    svg_plot_init(&p, m, 300, 200);
    p.x.hi = 10;
    p.y.hi = 5;
    p.x.title = "x <units> & \"more\"";
    svg_plot_begin(&p, "t");
    const double xs[5] = {0, 1, NAN, 3, INFINITY}, ys[5] = {1, NAN, 2, 3, 4};
    svg_plot_line(&p, xs, ys, 5, "#000", NULL, false, 0, "a");
    svg_plot_line(&p, xs, ys, 5, "#000", "4 2", true, 10, "b");
    svg_plot_rug(&p, xs, 5, "#c00", NULL);
    svg_plot_vline(&p, NAN, "#000", "never", 0);
    svg_plot_end(&p);
    fclose(m);
    CHECK_MSG(!strstr(buf, "nan") && !strstr(buf, "inf") && !strstr(buf, "NaN"), "%s", buf);
    CHECK(strstr(buf, "x &lt;units&gt; &amp; &quot;more&quot;"));
    CHECK(!strstr(buf, "never"));
    free(buf);
}

/* ---- summary, CSV and JSON against known rows ------------------------------------------ */

/* A run of 20 requests with e2e = 0.1 .. 2.0 s, two failures, preemptions on two. */
static void make_run(const char *path)
{
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open(path, &db, &err), KVB_OK);
    int64_t run = 0;
    struct metrics_run_info info = {
        .job_file = "night, \"one\".jsonl", .model = "m", .backend = "cpu", .settings = "{\"max_batch\":4}"};
    CHECK_EQ_INT(metrics_run_begin(db, &info, &run, &err), KVB_OK);
    const double t0 = (double)time(NULL);
    for (int i = 1; i <= 20; i++) {
        struct metrics_request r = {
            .input_line = i,
            .prompt_tokens = 30,
            .cached_tokens_run = 16,
            .completion_tokens = 4,
            .has_timing = true,
            .queue_s = 0.01 * i,
            .ttft_s = 0.05 * i,
            .tpot_s = 0.01,
            .e2e_s = 0.1 * i,
            .finish_reason = i % 5 ? "stop" : "length",
            .status_code = 200,
            .submitted_at = t0,
            .started_at = t0 + 0.01 * i,
            .first_token_at = t0 + 0.05 * i,
            .ended_at = t0 + 0.1 * i,
            .preemptions = i == 7   ? 3
                           : i == 9 ? 1
                                    : 0,
            .restored_tokens = i == 7 ? 90 : 0,
        };
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    }
    for (int i = 21; i <= 22; i++) {
        struct metrics_request r = {.input_line = i,
                                    .error_code = i == 21 ? "invalid_json" : NULL,
                                    .error_message = "line 21: broken",
                                    .status_code = i == 21 ? 400 : 500,
                                    .ended_at = t0 + 0.5};
        CHECK_EQ_INT(metrics_request_add(db, run, &r, &err), KVB_OK);
    }
    CHECK_EQ_INT(metrics_run_end(db, run, METRICS_RUN_OK, NULL, &err), KVB_OK);
    metrics_close(db);
}

static enum kvb_status csv_of(void *path, FILE *out)
{
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    enum kvb_status st = metrics_open_existing(path, &db, &err);
    if (st == KVB_OK) st = metrics_report_format(db, METRICS_RUN_LATEST, METRICS_FORMAT_CSV, out, &err);
    metrics_close(db);
    return st;
}

static enum kvb_status html_of(void *path, FILE *out)
{
    struct kvb_err err = {{0}};
    const char *paths[1] = {path};
    return metrics_report_html(paths, 1, METRICS_RUN_LATEST, out, &err);
}

/* Splits one CSV record (RFC 4180 quoting) into fields; returns the count. */
static int csv_split(const char *line, char fields[][256], int max)
{
    int n = 0;
    const char *p = line;
    while (n < max) {
        char *f = fields[n++];
        size_t k = 0;
        if (*p == '"') {
            for (p++; *p && !(*p == '"' && p[1] != '"'); p++) {
                if (*p == '"') p++;
                if (k < 255) f[k++] = *p;
            }
            if (*p == '"') p++;
        } else {
            while (*p && *p != ',' && *p != '\r' && *p != '\n')
                if (k < 255) f[k++] = *p++;
                else p++;
        }
        f[k] = '\0';
        if (*p != ',') break;
        p++;
    }
    return n;
}

static void test_summary_forms(void)
{
    char path[512];
    path_in(path, sizeof path, "forms.db");
    make_run(path);
    struct kvb_err err = {{0}};
    struct metrics_db *db = NULL;
    CHECK_EQ_INT(metrics_open_existing(path, &db, &err), KVB_OK);
    struct metrics_summary s;
    CHECK_EQ_INT(metrics_summary_load(db, METRICS_RUN_LATEST, NULL, &s, &err), KVB_OK);
    metrics_close(db);
    CHECK_EQ_INT(s.t.requests_total, 22);
    CHECK_EQ_INT(s.t.requests_failed, 2);
    CHECK_EQ_INT(s.n_errors, 2); /* invalid_json and "status 500" */
    CHECK(s.n_errors == 2 && !strcmp(s.errors[0].key, "invalid_json") && !strcmp(s.errors[1].key, "status 500"));
    CHECK(s.n_errors == 2 && s.errors[0].example && !strcmp(s.errors[0].example, "line 21: broken"));
    /* nearest rank over 20 values: p50 = 10th, p95 = 19th, p99 = 20th */
    CHECK(near(s.e2e.p50, 1.0) && near(s.e2e.p95, 1.9) && near(s.e2e.p99, 2.0) && near(s.e2e.max, 2.0));
    CHECK_EQ_INT(s.preempted_requests, 2);
    CHECK_EQ_INT(s.preemptions, 4);
    CHECK_EQ_INT(s.restored_tokens, 90);
    CHECK(s.settings_json);
    metrics_summary_free(&s);

    enum kvb_status st;
    char *csv = capture(csv_of, path, &st);
    CHECK_EQ_INT(st, KVB_OK);
    const char *row = csv ? strstr(csv, "\r\n") : NULL;
    CHECK(row != NULL);
    if (row) {
        static char head[80][256], vals[80][256];
        int nh = csv_split(csv, head, 80), nv = csv_split(row + 2, vals, 80);
        CHECK_EQ_INT(nh, nv);
        for (int i = 0; i < nh && i < nv; i++) {
            if (!strcmp(head[i], "job_file")) CHECK_MSG(!strcmp(vals[i], "night, \"one\".jsonl"), "%s", vals[i]);
            if (!strcmp(head[i], "errors")) CHECK_MSG(!strcmp(vals[i], "invalid_json=1;status 500=1"), "%s", vals[i]);
            if (!strcmp(head[i], "e2e_p95_ms")) CHECK_MSG(near(atof(vals[i]), 1900), "%s", vals[i]);
            if (!strcmp(head[i], "preemptions")) CHECK_EQ_INT(atoi(vals[i]), 4);
            if (!strcmp(head[i], "store_bytes_read")) CHECK_EQ_INT(atoi(vals[i]), 0);
        }
    }
    free(csv);

    char *page = capture(html_of, path, &st);
    CHECK_EQ_INT(st, KVB_OK);
    if (page) {
        static const char *const want[] = {"Throughput over time",
                                           "Running and waiting sequences",
                                           "Latency",
                                           "time to first token",
                                           "time per output token",
                                           "end to end",
                                           "Prefix reuse",
                                           "Errors",
                                           "invalid_json",
                                           "line 21: broken",
                                           "Slowest requests",
                                           "Runs",
                                           "night, &quot;one&quot;.jsonl"};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(page, want[i]), "%s", want[i]);
        /* self-contained and drawable: no reference out, nothing non-finite */
        CHECK(!strstr(page, "http:") && !strstr(page, "https:") && !strstr(page, "<script") && !strstr(page, "<link"));
        CHECK(!strstr(page, "nan") && !strstr(page, "inf\"") && !strstr(page, "NaN"));
        int open = 0, close = 0;
        for (const char *p = page; (p = strstr(p, "<svg")); p++) open++;
        for (const char *p = page; (p = strstr(p, "</svg>")); p++) close++;
        CHECK_EQ_INT(open, close);
        CHECK(open >= 7);
        /* the slowest request (line 20, 2000 ms) heads its table */
        const char *slow = strstr(page, "Slowest requests");
        const char *first = slow ? strstr(slow, "<tr><td>") : NULL;
        CHECK_MSG(first && !strncmp(first, "<tr><td>20</td>", 15) && strstr(first, "<td>2.00 s</td>"), "%.200s",
                  first ? first : "(none)");
    }
    free(page);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvb_metrics_report_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_new_columns();
    test_upgrade_from_v1();
    test_series();
    test_svg();
    test_summary_forms();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return tu_finish();
}
