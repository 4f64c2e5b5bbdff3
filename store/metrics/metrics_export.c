/* metrics_export.c — the JSON and CSV forms of `kvbatch report` (see
 * metrics_report.h): the same struct metrics_summary as the text form, so
 * the three carry the same figures. The layouts are a promise to scripts
 * and are documented in README.md ("kvbatch report"): add fields at the end,
 * never rename or repurpose one without bumping METRICS_REPORT_FORMAT_VERSION.
 *
 * Units: latencies in milliseconds (as the text form), times in unix
 * seconds, rates per second, shares as fractions of the prompt tokens.
 * A figure that is not known is null in JSON and an empty field in CSV —
 * never 0, which would read as a measurement. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "store/metrics/metrics_report.h"
#include "store/metrics/metrics_report_internal.h"

bool metrics_format_parse(const char *name, enum metrics_format *out)
{
    static const struct {
        const char *name;
        enum metrics_format fmt;
    } names[] = {{"text", METRICS_FORMAT_TEXT}, {"json", METRICS_FORMAT_JSON}, {"csv", METRICS_FORMAT_CSV}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name && !strcmp(name, names[i].name)) {
            *out = names[i].fmt;
            return true;
        }
    return false;
}

/* ---- pieces ---------------------------------------------------------------------- */

void metrics_json_str(FILE *out, const char *s)
{
    if (!s) {
        fputs("null", out);
        return;
    }
    struct kvb_buf b = {0};
    if (json_put_string(&b, s, strlen(s)) == KVB_OK) fwrite(b.data, 1, b.len, out);
    else fputs("null", out); /* out of memory: a null rather than broken JSON */
    kvb_buf_free(&b);
}

void metrics_json_num(FILE *out, double v)
{
    if (!isfinite(v)) fputs("null", out);
    else if (v == floor(v) && fabs(v) < 1e15) fprintf(out, "%.0f", v);
    else fprintf(out, "%.15g", v);
}

static void json_int(FILE *out, int64_t v) { fprintf(out, "%lld", (long long)v); }

void metrics_csv_str(FILE *out, const char *s)
{
    if (!s) return;
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (const char *p = s; *p; p++) {
        if (*p == '"') fputc('"', out);
        fputc(*p, out);
    }
    fputc('"', out);
}

void metrics_csv_num(FILE *out, double v)
{
    if (isfinite(v)) metrics_json_num(out, v);
}

static double ms(double seconds) { return 1e3 * seconds; }

/* part / whole, NAN when whole is 0. */
static double share(int64_t part, int64_t whole) { return whole > 0 ? (double)part / (double)whole : NAN; }

static double per_s(const struct metrics_summary *s, int64_t v)
{
    return s->has_wall ? (double)v / s->t.wall_seconds : NAN;
}

/* ---- JSON -------------------------------------------------------------------------- */

static void json_dist(FILE *out, const char *name, const struct metrics_dist *d, bool last)
{
    fprintf(out, "    \"%s\": {\"p50\": ", name);
    metrics_json_num(out, ms(d->p50));
    fputs(", \"p95\": ", out);
    metrics_json_num(out, ms(d->p95));
    fputs(", \"p99\": ", out);
    metrics_json_num(out, ms(d->p99));
    fputs(", \"max\": ", out);
    metrics_json_num(out, ms(d->max));
    fprintf(out, ", \"n\": %zu}%s\n", d->n, last ? "" : ",");
}

static void json_share(FILE *out, const char *name, int64_t part, int64_t whole, bool last)
{
    fprintf(out, "    \"%s\": {\"tokens\": %lld, \"share\": ", name, (long long)part);
    metrics_json_num(out, share(part, whole));
    fprintf(out, "}%s\n", last ? "" : ",");
}

static void json_field_str(FILE *out, const char *name, const char *v)
{
    fprintf(out, "    \"%s\": ", name);
    metrics_json_str(out, v);
    fputs(",\n", out);
}

void metrics_summary_json(const struct metrics_summary *s, const struct metrics_combined_info *combined, FILE *out)
{
    const struct metrics_totals *t = &s->t;
    fprintf(out, "{\n  \"kvbatch_report\": %d,\n  \"run\": {\n", METRICS_REPORT_FORMAT_VERSION);
    fprintf(out, "    \"id\": %lld,\n", (long long)s->run_id);
    json_field_str(out, "label", s->label);
    json_field_str(out, "status", s->status);
    json_field_str(out, "job_file", s->job_file);
    json_field_str(out, "output_file", s->output_file);
    json_field_str(out, "model", s->model);
    json_field_str(out, "model_fingerprint", s->fingerprint);
    json_field_str(out, "backend", s->backend);
    fputs("    \"settings\": ", out);
    if (s->settings && s->settings_json) fputs(s->settings, out);
    else metrics_json_str(out, s->settings); /* not JSON: kept as the text it is */
    fputs(",\n    \"started_at\": ", out);
    metrics_json_num(out, s->started_at);
    fputs(",\n    \"ended_at\": ", out);
    metrics_json_num(out, s->ended ? s->ended_at : NAN);
    fputs(",\n    \"wall_seconds\": ", out);
    metrics_json_num(out, s->has_wall ? t->wall_seconds : NAN);
    fprintf(out, ",\n    \"totals_recorded\": %s\n  },\n", s->has_totals ? "true" : "false");

    fprintf(out, "  \"requests\": {\"total\": %lld, \"ok\": %lld, \"failed\": %lld},\n", (long long)t->requests_total,
            (long long)t->requests_ok, (long long)t->requests_failed);
    fputs("  \"errors\": [", out);
    for (size_t i = 0; i < s->n_errors; i++) {
        fputs(i ? ",\n    {\"code\": " : "\n    {\"code\": ", out);
        metrics_json_str(out, s->errors[i].key);
        fputs(", \"count\": ", out);
        json_int(out, s->errors[i].n);
        fputs(", \"example_message\": ", out);
        metrics_json_str(out, s->errors[i].example);
        fputc('}', out);
    }
    fputs(s->n_errors ? "\n  ],\n" : "],\n", out);
    fputs("  \"finish_reasons\": [", out);
    for (size_t i = 0; i < s->n_finish; i++) {
        fputs(i ? ", {\"reason\": " : "{\"reason\": ", out);
        metrics_json_str(out, s->finish[i].key);
        fputs(", \"count\": ", out);
        json_int(out, s->finish[i].n);
        fputc('}', out);
    }
    fputs("],\n", out);
    fprintf(out, "  \"tokens\": {\"prompt\": %lld, \"completion\": %lld, \"total\": %lld},\n",
            (long long)t->prompt_tokens, (long long)t->completion_tokens,
            (long long)(t->prompt_tokens + t->completion_tokens));
    fputs("  \"throughput\": {\"completion_tokens_per_s\": ", out);
    metrics_json_num(out, per_s(s, t->completion_tokens));
    fputs(", \"total_tokens_per_s\": ", out);
    metrics_json_num(out, per_s(s, t->prompt_tokens + t->completion_tokens));
    fputs(", \"requests_per_s\": ", out);
    metrics_json_num(out, per_s(s, t->requests_total));
    fputs("},\n  \"latency_ms\": {\n", out);
    json_dist(out, "queue", &s->queue, false);
    json_dist(out, "ttft", &s->ttft, false);
    json_dist(out, "tpot", &s->tpot, false);
    json_dist(out, "e2e", &s->e2e, true);
    fputs("  },\n  \"preemptions\": ", out);
    if (s->rows_with_preemptions == 0 && t->requests_total > 0) fputs("null,\n", out);
    else
        fprintf(out, "{\"requests\": %lld, \"times\": %lld, \"restored_tokens\": %lld},\n",
                (long long)s->preempted_requests, (long long)s->preemptions, (long long)s->restored_tokens);
    fprintf(out, "  \"prefix_reuse\": {\n    \"prompt_tokens\": %lld,\n", (long long)t->prompt_tokens);
    json_share(out, "in_run_cache", t->cached_tokens_run, t->prompt_tokens, false);
    json_share(out, "persistent_store", t->cached_tokens_store, t->prompt_tokens, false);
    json_share(out, "computed", t->prefill_tokens_computed, t->prompt_tokens, true);
    fputs("  },\n  \"store\": ", out);
    if (s->has_totals)
        fprintf(out, "{\"bytes_read\": %lld, \"bytes_written\": %lld}", (long long)t->store_bytes_read,
                (long long)t->store_bytes_written);
    else fputs("null", out);
    if (combined) {
        fputs(",\n  \"combined\": {\"databases\": [", out);
        for (int i = 0; i < combined->n_paths; i++) {
            if (i) fputs(", ", out);
            metrics_json_str(out, combined->paths[i]);
        }
        fputs("], \"warnings\": [", out);
        /* one string per "warning: " line, without the prefix and newline */
        const char *w = combined->warnings ? combined->warnings : "";
        for (int k = 0; *w; k++) {
            const char *nl = strchr(w, '\n');
            size_t len = nl ? (size_t)(nl - w) : strlen(w);
            static const char pre[] = "warning: ";
            const char *text = w;
            if (len >= sizeof pre - 1 && !strncmp(w, pre, sizeof pre - 1)) {
                text += sizeof pre - 1;
                len -= sizeof pre - 1;
            }
            char *line = kvb_strndup(text, len);
            if (k) fputs(", ", out);
            metrics_json_str(out, line ? line : "");
            kvb_free(line);
            w = nl ? nl + 1 : w + strlen(w);
        }
        fputs("]}", out);
    }
    fputs("\n}\n", out);
}

/* ---- CSV ------------------------------------------------------------------------------ */

static const char *const csv_columns[] = {
    "run_id",
    "label",
    "status",
    "job_file",
    "output_file",
    "model",
    "model_fingerprint",
    "backend",
    "settings",
    "started_at",
    "ended_at",
    "wall_seconds",
    "totals_recorded",
    "requests_total",
    "requests_ok",
    "requests_failed",
    "errors",
    "finish_reasons",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "completion_tokens_per_s",
    "total_tokens_per_s",
    "requests_per_s",
    "queue_p50_ms",
    "queue_p95_ms",
    "queue_p99_ms",
    "queue_max_ms",
    "queue_n",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "ttft_max_ms",
    "ttft_n",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "tpot_p99_ms",
    "tpot_max_ms",
    "tpot_n",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "e2e_max_ms",
    "e2e_n",
    "preempted_requests",
    "preemptions",
    "restored_tokens",
    "cached_tokens_run",
    "cached_tokens_store",
    "prefill_tokens_computed",
    "cached_share_run",
    "cached_share_store",
    "computed_share",
    "store_bytes_read",
    "store_bytes_written",
    "databases",
    "warnings", /* a combination's: paths ';'-separated, warnings one per line; else empty */
};

void metrics_summary_csv_header(FILE *out)
{
    for (size_t i = 0; i < sizeof csv_columns / sizeof csv_columns[0]; i++)
        fprintf(out, "%s%s", i ? "," : "", csv_columns[i]);
    fputs("\r\n", out);
}

/* "key=n;key=n" of every count (keys are error codes, "status N" or finish
 * reasons: no '=' or ';' in them). */
static void csv_counts(FILE *out, const struct metrics_count *c, size_t n)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += strlen(c[i].key ? c[i].key : "-") + 24;
    char *buf = kvb_malloc(len + 1), *p = buf;
    if (!buf) return;
    *p = '\0';
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%s=%lld", i ? ";" : "", c[i].key ? c[i].key : "-", (long long)c[i].n);
    metrics_csv_str(out, buf);
    kvb_free(buf);
}

static void csv_sep_int(FILE *out, int64_t v) { fprintf(out, ",%lld", (long long)v); }

static void csv_sep_num(FILE *out, double v)
{
    fputc(',', out);
    metrics_csv_num(out, v);
}

static void csv_sep_str(FILE *out, const char *s)
{
    fputc(',', out);
    metrics_csv_str(out, s);
}

static void csv_dist(FILE *out, const struct metrics_dist *d)
{
    csv_sep_num(out, ms(d->p50));
    csv_sep_num(out, ms(d->p95));
    csv_sep_num(out, ms(d->p99));
    csv_sep_num(out, ms(d->max));
    fprintf(out, ",%zu", d->n);
}

/* The warning lines of a combination without their "warning: ", one per
 * line (a CSV field may hold newlines; a warning may hold ';'), into a
 * kvb_malloc'd string. */
static char *warnings_joined(const char *w)
{
    static const char pre[] = "warning: ";
    char *j = kvb_malloc(strlen(w ? w : "") + 1), *p = j;
    if (!j) return NULL;
    for (const char *c = w ? w : ""; *c;) {
        const char *nl = strchr(c, '\n');
        size_t len = nl ? (size_t)(nl - c) : strlen(c);
        if (len >= sizeof pre - 1 && !strncmp(c, pre, sizeof pre - 1)) {
            c += sizeof pre - 1;
            len -= sizeof pre - 1;
        }
        if (p != j) *p++ = '\n';
        memcpy(p, c, len);
        p += len;
        c += len;
        if (*c == '\n') c++;
    }
    *p = '\0';
    return j;
}

void metrics_summary_csv_row(const struct metrics_summary *s, const struct metrics_combined_info *combined, FILE *out)
{
    const struct metrics_totals *t = &s->t;
    const bool have_pre = !(s->rows_with_preemptions == 0 && t->requests_total > 0);
    fprintf(out, "%lld", (long long)s->run_id);
    csv_sep_str(out, s->label);
    csv_sep_str(out, s->status);
    csv_sep_str(out, s->job_file);
    csv_sep_str(out, s->output_file);
    csv_sep_str(out, s->model);
    csv_sep_str(out, s->fingerprint);
    csv_sep_str(out, s->backend);
    csv_sep_str(out, s->settings);
    csv_sep_num(out, s->started_at);
    csv_sep_num(out, s->ended ? s->ended_at : NAN);
    csv_sep_num(out, s->has_wall ? t->wall_seconds : NAN);
    csv_sep_str(out, s->has_totals ? "true" : "false");
    csv_sep_int(out, t->requests_total);
    csv_sep_int(out, t->requests_ok);
    csv_sep_int(out, t->requests_failed);
    fputc(',', out);
    csv_counts(out, s->errors, s->n_errors);
    fputc(',', out);
    csv_counts(out, s->finish, s->n_finish);
    csv_sep_int(out, t->prompt_tokens);
    csv_sep_int(out, t->completion_tokens);
    csv_sep_int(out, t->prompt_tokens + t->completion_tokens);
    csv_sep_num(out, per_s(s, t->completion_tokens));
    csv_sep_num(out, per_s(s, t->prompt_tokens + t->completion_tokens));
    csv_sep_num(out, per_s(s, t->requests_total));
    csv_dist(out, &s->queue);
    csv_dist(out, &s->ttft);
    csv_dist(out, &s->tpot);
    csv_dist(out, &s->e2e);
    csv_sep_num(out, have_pre ? (double)s->preempted_requests : NAN);
    csv_sep_num(out, have_pre ? (double)s->preemptions : NAN);
    csv_sep_num(out, have_pre ? (double)s->restored_tokens : NAN);
    csv_sep_int(out, t->cached_tokens_run);
    csv_sep_int(out, t->cached_tokens_store);
    csv_sep_int(out, t->prefill_tokens_computed);
    csv_sep_num(out, share(t->cached_tokens_run, t->prompt_tokens));
    csv_sep_num(out, share(t->cached_tokens_store, t->prompt_tokens));
    csv_sep_num(out, share(t->prefill_tokens_computed, t->prompt_tokens));
    csv_sep_num(out, s->has_totals ? (double)t->store_bytes_read : NAN);
    csv_sep_num(out, s->has_totals ? (double)t->store_bytes_written : NAN);
    fputc(',', out);
    if (combined) {
        size_t len = 1;
        for (int i = 0; i < combined->n_paths; i++) len += strlen(combined->paths[i]) + 1;
        char *dbs = kvb_malloc(len), *p = dbs;
        for (int i = 0; dbs && i < combined->n_paths; i++) p += sprintf(p, "%s%s", i ? ";" : "", combined->paths[i]);
        if (dbs) *p = '\0';
        metrics_csv_str(out, dbs);
        kvb_free(dbs);
        char *w = warnings_joined(combined->warnings);
        csv_sep_str(out, w);
        kvb_free(w);
    } else {
        fputc(',', out);
    }
    fputs("\r\n", out);
}

/* ---- the list of runs ------------------------------------------------------------------ */

void metrics_run_list_json(const struct metrics_run_list_row *r, FILE *out)
{
    fprintf(out, "\n  {\"id\": %lld, \"status\": ", (long long)r->id);
    metrics_json_str(out, r->status);
    fputs(", \"started_at\": ", out);
    metrics_json_num(out, r->started_at);
    fputs(", \"ended_at\": ", out);
    metrics_json_num(out, r->ended ? r->ended_at : NAN);
    fputs(", \"wall_seconds\": ", out);
    metrics_json_num(out, r->has_wall ? r->wall_seconds : NAN);
    fprintf(out, ", \"requests_ok\": %lld, \"requests_total\": %lld, \"model\": ", (long long)r->requests_ok,
            (long long)r->requests_total);
    metrics_json_str(out, r->model);
    fputs(", \"backend\": ", out);
    metrics_json_str(out, r->backend);
    fputs(", \"job_file\": ", out);
    metrics_json_str(out, r->job_file);
    fputs(", \"output_file\": ", out);
    metrics_json_str(out, r->output_file);
    fputc('}', out);
}

void metrics_run_list_csv_header(FILE *out)
{
    fputs("run_id,status,started_at,ended_at,wall_seconds,requests_ok,requests_total,model,backend,job_file,"
          "output_file\r\n",
          out);
}

void metrics_run_list_csv_row(const struct metrics_run_list_row *r, FILE *out)
{
    fprintf(out, "%lld", (long long)r->id);
    csv_sep_str(out, r->status);
    csv_sep_num(out, r->started_at);
    csv_sep_num(out, r->ended ? r->ended_at : NAN);
    csv_sep_num(out, r->has_wall ? r->wall_seconds : NAN);
    csv_sep_int(out, r->requests_ok);
    csv_sep_int(out, r->requests_total);
    csv_sep_str(out, r->model);
    csv_sep_str(out, r->backend);
    csv_sep_str(out, r->job_file);
    csv_sep_str(out, r->output_file);
    fputs("\r\n", out);
}
