/* metrics_combine.c — one report over the latest runs of several metrics
 * databases (see metrics_report_combined in metrics.h). The runs' rows are
 * copied into a temporary database of the same schema as run 1 (sources
 * staged as runs 2..n+1), whose row is then filled with the sums, and the
 * ordinary report is printed for it: one code path for both reports. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/metrics/metrics.h"
#include "store/metrics/metrics_internal.h"
#include "store/metrics/metrics_report.h"
#include "store/metrics/metrics_report_internal.h"

/* Runs one statement with up to two bound parameters (text, int). */
static int exec_bound(sqlite3 *sql, const char *q, const char *text, int64_t num)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(sql, q, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    if (text) sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, num);
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

#define RUN_COLS                                                                                                       \
    "job_file, output_file, model, model_fingerprint, backend, settings, started_at, ended_at, status,"                \
    " requests_total, requests_ok, requests_failed, prompt_tokens, completion_tokens, cached_tokens_run,"              \
    " cached_tokens_store, prefill_tokens_computed, store_bytes_read, store_bytes_written, wall_seconds"
#define REQ_COLS                                                                                                       \
    "custom_id, input_line, prompt_tokens, cached_tokens_run, cached_tokens_store, completion_tokens, queue_s,"        \
    " ttft_s, tpot_s, e2e_s, finish_reason, error_code, status_code, error_message, submitted_at, started_at,"         \
    " first_token_at, ended_at, preemptions, restored_tokens"

/* A sum that is NULL unless every run has the column (totals are NULL until a run ends). */
#define ALL_SUM(c) "CASE WHEN count(" c ") = count(*) THEN sum(" c ") END"

/* Copies the latest run of `path` into db as run `as`. */
static enum kvb_status copy_latest(sqlite3 *sql, const char *path, int64_t as, struct kvb_err *err)
{
    /* Opening it the usual way first gives the usual messages for a
     * missing file or someone else's database. */
    struct metrics_db *src = NULL;
    KVB_FORWARD_IF_ERROR(metrics_open_existing(path, &src, err));
    metrics_close(src);
    int rc = exec_bound(sql, "ATTACH DATABASE ?1 AS src", path, 0);
    if (rc != SQLITE_OK) return metrics_sql_err(sql, path, err, rc, "attaching");
    sqlite3_stmt *st = NULL;
    int64_t latest = -1;
    rc = sqlite3_prepare_v2(sql, "SELECT max(id) FROM src.runs", -1, &st, NULL);
    if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        latest = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    enum kvb_status ret = KVB_OK;
    if (rc != SQLITE_OK) ret = metrics_sql_err(sql, path, err, rc, "reading its runs");
    else if (latest < 0) ret = kvb_errf(err, KVB_ERR_NOT_FOUND, "no runs recorded in %s", path);
    char q[1024];
    if (ret == KVB_OK) {
        snprintf(q, sizeof q,
                 "INSERT INTO main.runs (id, " RUN_COLS ") SELECT ?2, " RUN_COLS " FROM src.runs WHERE id = %lld",
                 (long long)latest);
        rc = exec_bound(sql, q, NULL, as);
        if (rc == SQLITE_OK) {
            snprintf(q, sizeof q,
                     "INSERT INTO main.requests (run_id, " REQ_COLS ") SELECT 1, " REQ_COLS
                     " FROM src.requests WHERE run_id = %lld",
                     (long long)latest);
            rc = exec_bound(sql, q, NULL, 0);
        }
        if (rc != SQLITE_OK) ret = metrics_sql_err(sql, path, err, rc, "copying its latest run");
    }
    exec_bound(sql, "DETACH DATABASE src", NULL, 0);
    return ret;
}

/* What the staged runs (2..n+1, from paths[0..n)) say of themselves in
 * their settings: which shard of how many, and the plan's hash. */
struct staged {
    long index, count; /* shard index / count; count 1: not sharded */
    char plan[24];     /* hex hash of the split, "" when not recorded */
    bool resumed;
    double started;
    char output[512];
};

/* Refuses combinations that would print wrong sums (the same run twice, one
 * shard twice, shards of different splits) and warns on out about ones that
 * print partial sums (missing shards, resumed runs). */
static enum kvb_status check_staged(sqlite3 *sql, const char *const *paths, int n, FILE *warn, struct kvb_err *err)
{
    if (n < 1) return KVB_OK;
    struct staged *r = calloc((size_t)n, sizeof *r);
    if (!r) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        sql,
        "SELECT id, coalesce(json_extract(settings, '$.shard'), '0/1'), coalesce(json_extract(settings,"
        " '$.shard_plan'), ''), coalesce(json_extract(settings, '$.resume'), 0), started_at, coalesce(output_file, '')"
        " FROM runs WHERE id > 1 AND json_valid(settings) ORDER BY id",
        -1, &st, NULL);
    for (int i = 0; i < n; i++) r[i].count = 1;
    while (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        int64_t k = sqlite3_column_int64(st, 0) - 2;
        if (k < 0 || k >= n) continue;
        const char *sh = (const char *)sqlite3_column_text(st, 1);
        if (!sh || sscanf(sh, "%ld/%ld", &r[k].index, &r[k].count) != 2 || r[k].count < 1) r[k].count = 1;
        const char *plan = (const char *)sqlite3_column_text(st, 2);
        snprintf(r[k].plan, sizeof r[k].plan, "%s", plan && strspn(plan, "0") != strlen(plan) ? plan : "");
        r[k].resumed = sqlite3_column_int(st, 3) != 0;
        r[k].started = sqlite3_column_double(st, 4);
        const char *o = (const char *)sqlite3_column_text(st, 5);
        snprintf(r[k].output, sizeof r[k].output, "%s", o ? o : "");
    }
    sqlite3_finalize(st);
    enum kvb_status ret =
        rc == SQLITE_OK ? KVB_OK : metrics_sql_err(sql, "the combined report", err, rc, "reading settings");
    bool sharded = false;
    for (int i = 0; i < n; i++) sharded |= r[i].count > 1;
    for (int i = 0; i < n && ret == KVB_OK; i++) {
        for (int j = 0; j < i && ret == KVB_OK; j++) {
            if (r[i].started == r[j].started && !strcmp(r[i].output, r[j].output))
                ret = kvb_errf(err, KVB_ERR_INVALID_ARG, "%s and %s hold the same run: it would be counted twice",
                               paths[j], paths[i]);
            else if (sharded && r[i].count == r[j].count && r[i].index == r[j].index)
                ret = kvb_errf(err, KVB_ERR_INVALID_ARG, "%s and %s are both shard %ld of %ld", paths[j], paths[i],
                               r[i].index, r[i].count);
            else if (sharded && r[i].count != r[j].count)
                ret = kvb_errf(err, KVB_ERR_INVALID_ARG,
                               "%s is shard %ld of %ld but %s is shard %ld of %ld: runs of "
                               "different splits cannot be summed",
                               paths[j], r[j].index, r[j].count, paths[i], r[i].index, r[i].count);
            else if (sharded && r[i].plan[0] && r[j].plan[0] && strcmp(r[i].plan, r[j].plan))
                ret = kvb_errf(err, KVB_ERR_INVALID_ARG,
                               "%s and %s planned different splits of the job (plan %s vs "
                               "%s): their lines may overlap or be missing; run every shard on the same job file, "
                               "model and --chat-template",
                               paths[j], paths[i], r[j].plan, r[i].plan);
        }
    }
    if (ret == KVB_OK && sharded && n < r[0].count && warn)
        fprintf(warn, "warning: %d of %ld shards given: the sums cover only them\n", n, r[0].count);
    for (int i = 0; i < n && ret == KVB_OK; i++)
        if (r[i].resumed && warn)
            fprintf(warn,
                    "warning: %s: its latest run resumed an earlier one (--resume); the requests that one "
                    "finished are counted there, not here\n",
                    paths[i]);
    free(r);
    return ret;
}

enum kvb_status metrics_combined_open(const char *const *paths, int n, FILE *warn, struct metrics_db **out,
                                      char *tmp_dir, struct kvb_err *err)
{
    *out = NULL;
    tmp_dir[0] = '\0';
    if (n < 1 || !paths) return kvb_errf(err, KVB_ERR_INVALID_ARG, "no database given");
    char dir[] = "/tmp/kvbatch-report-XXXXXX", path[64];
    if (!mkdtemp(dir)) return kvb_errf(err, KVB_ERR_IO, "cannot make a temporary directory in /tmp");
    snprintf(tmp_dir, 64, "%s", dir);
    snprintf(path, sizeof path, "%s/combined.db", dir);
    struct metrics_db *db = NULL;
    enum kvb_status st = metrics_open(path, &db, err);
    sqlite3 *sql = st == KVB_OK ? metrics_sqlite(db) : NULL;
    if (st == KVB_OK) {
        int rc = exec_bound(sql, "INSERT INTO runs (id, started_at) VALUES (1, 0)", NULL, 0);
        if (rc != SQLITE_OK) st = metrics_sql_err(sql, path, err, rc, "staging");
    }
    for (int i = 0; i < n && st == KVB_OK; i++) st = copy_latest(sql, paths[i], 2 + i, err);
    if (st == KVB_OK) st = check_staged(sql, paths, n, warn, err);
    if (st == KVB_OK) {
        /* Run 1 = the sum of the others. The worst status wins; wall time
         * spans the first start to the last end (shards run side by side). */
        /* clang-format off */ /* one SQL statement, laid out as SQL */
        int rc = exec_bound(sql,
            "UPDATE runs SET (job_file, output_file, model, model_fingerprint, backend, started_at, ended_at, status,"
            " requests_total, requests_ok, requests_failed, prompt_tokens, completion_tokens, cached_tokens_run,"
            " cached_tokens_store, prefill_tokens_computed, store_bytes_read, store_bytes_written, wall_seconds) ="
            " (SELECT group_concat(DISTINCT job_file), group_concat(output_file, ', '), group_concat(DISTINCT model),"
            "  group_concat(DISTINCT model_fingerprint), group_concat(DISTINCT backend), min(started_at),"
            "  CASE WHEN count(ended_at) = count(*) THEN max(ended_at) END,"
            "  CASE WHEN sum(status = 'failed') > 0 THEN 'failed' WHEN sum(status = 'died') > 0 THEN 'died'"
            "  WHEN sum(status = 'interrupted') > 0 THEN"
            "  'interrupted' WHEN sum(status = 'running') > 0 THEN 'running' ELSE 'ok' END, "
            ALL_SUM("requests_total") ", " ALL_SUM("requests_ok") ", " ALL_SUM("requests_failed") ", "
            ALL_SUM("prompt_tokens") ", " ALL_SUM("completion_tokens") ", " ALL_SUM("cached_tokens_run") ", "
            ALL_SUM("cached_tokens_store") ", " ALL_SUM("prefill_tokens_computed") ", "
            ALL_SUM("store_bytes_read") ", " ALL_SUM("store_bytes_written") ","
            "  CASE WHEN count(ended_at) = count(*) AND count(wall_seconds) = count(*)"
            "  THEN max(ended_at) - min(started_at) END"
            "  FROM runs WHERE id > 1) WHERE id = 1", NULL, 0);
        /* clang-format on */
        if (rc == SQLITE_OK) rc = exec_bound(sql, "DELETE FROM runs WHERE id > 1", NULL, 0);
        if (rc != SQLITE_OK) st = metrics_sql_err(sql, path, err, rc, "combining");
    }
    if (st != KVB_OK) {
        metrics_combined_close(db, tmp_dir);
        tmp_dir[0] = '\0';
        return st;
    }
    *out = db;
    return KVB_OK;
}

void metrics_combined_close(struct metrics_db *db, const char *tmp_dir)
{
    metrics_close(db);
    if (!tmp_dir || !tmp_dir[0]) return;
    const char *suffix[3] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char p[96];
        snprintf(p, sizeof p, "%s/combined.db%s", tmp_dir, suffix[i]);
        unlink(p);
    }
    rmdir(tmp_dir);
}

enum kvb_status metrics_report_combined_format(const char *const *paths, int n, enum metrics_format fmt, FILE *out,
                                               FILE *warn, struct kvb_err *err)
{
    /* JSON and CSV carry the warnings inside: collect them first. */
    char *wbuf = NULL;
    size_t wlen = 0;
    FILE *wf = fmt == METRICS_FORMAT_TEXT ? out : open_memstream(&wbuf, &wlen);
    if (!wf) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    struct metrics_db *db = NULL;
    char tmp[64];
    enum kvb_status st = metrics_combined_open(paths, n, wf, &db, tmp, err);
    if (fmt != METRICS_FORMAT_TEXT) {
        fclose(wf); /* wbuf now holds the warnings */
        if (fmt == METRICS_FORMAT_CSV && warn && wbuf) fputs(wbuf, warn);
    }
    if (st == KVB_OK && fmt == METRICS_FORMAT_TEXT) {
        fprintf(out, "combined: the latest run of each of %d databases:", n);
        for (int i = 0; i < n; i++) fprintf(out, " %s", paths[i]);
        fputc('\n', out);
    }
    struct metrics_summary s;
    if (st == KVB_OK) st = metrics_summary_load(db, 1, "all of them", &s, err);
    if (st == KVB_OK) {
        struct metrics_combined_info ci = {.paths = paths, .n_paths = n, .warnings = wbuf};
        metrics_summary_print(&s, fmt, &ci, out);
        metrics_summary_free(&s);
    }
    free(wbuf); /* open_memstream's buffer is malloc'd */
    metrics_combined_close(db, tmp);
    return st;
}

enum kvb_status metrics_report_combined(const char *const *paths, int n, FILE *out, struct kvb_err *err)
{
    return metrics_report_combined_format(paths, n, METRICS_FORMAT_TEXT, out, NULL, err);
}
