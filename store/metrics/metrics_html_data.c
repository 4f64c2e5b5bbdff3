/* metrics_html_data.c — the rows the HTML page draws, read from a metrics
 * database (see metrics_html_internal.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "base/alloc.h"
#include "store/metrics/metrics_html_internal.h"
#include "store/metrics/metrics_internal.h"
#include "store/metrics/metrics_report_internal.h"

static enum kvb_status sql_fail(struct metrics_db *db, struct kvb_err *err, int rc, const char *what)
{
    return metrics_sql_err(metrics_sqlite(db), metrics_path(db), err, rc, what);
}

static enum kvb_status oom(struct metrics_db *db, struct kvb_err *err)
{
    return kvb_errf(err, KVB_ERR_NOMEM, "%s: out of memory drawing the report", metrics_path(db));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Appends v to a growing array; false when out of memory. */
static bool push_double(double **v, size_t *n, size_t *cap, double x)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        double *nv = kvb_realloc(*v, c * sizeof *nv);
        if (!nv) return false;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return true;
}

static double col_or_nan(sqlite3_stmt *st, int i)
{
    return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

void html_run_free(struct html_run *r)
{
    metrics_summary_free(&r->sum);
    kvb_free(r->req);
    kvb_free(r->fail_at);
    for (int k = 0; k < N_LAT; k++) kvb_free(r->lat[k]);
}

/* The request rows of run r->sum.run_id: times, tokens, latencies. */
enum kvb_status html_load_rows(struct metrics_db *db, struct html_run *r, struct kvb_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        metrics_sqlite(db),
        "SELECT submitted_at, started_at, first_token_at, ended_at,"
        " max(0, prompt_tokens - cached_tokens_run - cached_tokens_store), completion_tokens, " FAILED_ROW ","
        " ttft_s, tpot_s, e2e_s, queue_s, coalesce(preemptions, 0) FROM requests WHERE run_id=?1",
        -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "reading request rows");
    sqlite3_bind_int64(st, 1, r->sum.run_id);
    size_t cap_req = 0, cap_fail = 0, cap_lat[N_LAT] = {0};
    enum kvb_status ks = KVB_OK;
    r->t0 = r->sum.started_at;
    r->t_last = r->t0;
    while (ks == KVB_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct series_req q = {col_or_nan(st, 0),           col_or_nan(st, 1),           col_or_nan(st, 2),
                               col_or_nan(st, 3),           sqlite3_column_int64(st, 4), sqlite3_column_int64(st, 5),
                               sqlite3_column_int64(st, 11)};
        bool failed = sqlite3_column_int(st, 6) != 0;
        for (int k = 0; k < N_LAT && ks == KVB_OK; k++) {
            double v = col_or_nan(st, 7 + k);
            if (isfinite(v) && !push_double(&r->lat[k], &r->n_lat[k], &cap_lat[k], v)) ks = oom(db, err);
        }
        if (isfinite(q.ended) && q.ended > r->t_last) r->t_last = q.ended;
        if (failed && isfinite(q.ended) && !push_double(&r->fail_at, &r->n_fail, &cap_fail, q.ended)) ks = oom(db, err);
        if (ks != KVB_OK || !isfinite(q.started)) continue;
        if (r->n_req == cap_req) {
            cap_req = cap_req ? cap_req * 2 : 256;
            struct series_req *nr = kvb_realloc(r->req, cap_req * sizeof *nr);
            if (!nr) {
                ks = oom(db, err);
                continue;
            }
            r->req = nr;
        }
        r->req[r->n_req++] = q;
    }
    if (ks == KVB_OK && rc != SQLITE_DONE) ks = sql_fail(db, err, rc, "reading request rows");
    sqlite3_finalize(st);
    for (int k = 0; k < N_LAT; k++)
        if (r->n_lat[k]) qsort(r->lat[k], r->n_lat[k], sizeof(double), cmp_double);
    return ks;
}

void html_slow_free(struct slow_row *s, size_t n)
{
    for (size_t i = 0; s && i < n; i++) {
        kvb_free(s[i].custom_id);
        kvb_free(s[i].finish);
    }
    kvb_free(s);
}

static char *dup_col(sqlite3_stmt *st, int i, bool *ok)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    if (!t) return NULL;
    char *d = kvb_strndup((const char *)t, (size_t)sqlite3_column_bytes(st, i));
    if (!d) *ok = false;
    return d;
}

/* Appends run `ri`'s HTML_SLOWEST slowest rows to *rows. */
enum kvb_status html_load_slowest(struct metrics_db *db, int ri, int64_t run_id, struct slow_row **rows, size_t *n,
                                  struct kvb_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        metrics_sqlite(db),
        "SELECT input_line, custom_id, prompt_tokens, cached_tokens_run, cached_tokens_store, completion_tokens,"
        " queue_s, ttft_s, tpot_s, e2e_s, preemptions, restored_tokens, finish_reason, status_code"
        " FROM requests WHERE run_id=?1 AND e2e_s IS NOT NULL ORDER BY e2e_s DESC LIMIT ?2",
        -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "reading the slowest requests");
    sqlite3_bind_int64(st, 1, run_id);
    sqlite3_bind_int(st, 2, HTML_SLOWEST);
    struct slow_row *nr = kvb_realloc(*rows, (*n + HTML_SLOWEST) * sizeof *nr);
    if (!nr) {
        sqlite3_finalize(st);
        return oom(db, err);
    }
    *rows = nr;
    bool ok = true;
    while (ok && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct slow_row *s = &nr[(*n)++];
        memset(s, 0, sizeof *s);
        s->run = ri;
        s->line = sqlite3_column_int64(st, 0);
        s->custom_id = dup_col(st, 1, &ok);
        s->prompt = sqlite3_column_int64(st, 2);
        s->cached_run = sqlite3_column_int64(st, 3);
        s->cached_store = sqlite3_column_int64(st, 4);
        s->completion = sqlite3_column_int64(st, 5);
        s->queue = col_or_nan(st, 6);
        s->ttft = col_or_nan(st, 7);
        s->tpot = col_or_nan(st, 8);
        s->e2e = col_or_nan(st, 9);
        s->has_preemptions = sqlite3_column_type(st, 10) != SQLITE_NULL;
        s->preemptions = sqlite3_column_int64(st, 10);
        s->restored = sqlite3_column_int64(st, 11);
        s->finish = dup_col(st, 12, &ok);
        s->status = sqlite3_column_int(st, 13);
    }
    sqlite3_finalize(st);
    if (!ok) return oom(db, err);
    if (rc != SQLITE_DONE) return sql_fail(db, err, rc, "reading the slowest requests");
    return KVB_OK;
}

/* Ids of the runs of one database, latest HTML_MAX_RUNS, oldest first. */
enum kvb_status html_list_run_ids(struct metrics_db *db, int64_t **ids, size_t *n, struct kvb_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc =
        sqlite3_prepare_v2(metrics_sqlite(db),
                           "SELECT id FROM (SELECT id FROM runs ORDER BY id DESC LIMIT ?1) ORDER BY id", -1, &st, NULL);
    if (rc != SQLITE_OK) return sql_fail(db, err, rc, "listing runs");
    sqlite3_bind_int(st, 1, HTML_MAX_RUNS);
    *ids = kvb_malloc(HTML_MAX_RUNS * sizeof **ids);
    *n = 0;
    if (!*ids) {
        sqlite3_finalize(st);
        return oom(db, err);
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < HTML_MAX_RUNS) (*ids)[(*n)++] = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return sql_fail(db, err, rc, "listing runs");
    return KVB_OK;
}
