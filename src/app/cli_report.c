/* cli_report.c — `kvbatch report DB... [--run ID] [--list] [--format F]
 * [--html FILE]`: prints the summary of one run recorded in a metrics
 * database, or the list of its runs, or one summary of the latest runs of
 * several databases (shards), as text, JSON or CSV; and/or writes an HTML
 * page with charts. It only reads: a missing database is an error, never
 * created. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "store/metrics/metrics.h"
#include "store/metrics/metrics_report.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch report DB [--run ID] [--list] [--format F] [--html FILE]\n"
               "       kvbatch report DB DB... [--format F] [--html FILE]\n"
               "\n"
               "Summarises a run recorded in the metrics database DB (the --metrics file of\n"
               "`kvbatch run`; by default kvbatch.db beside the output file): status, start and\n"
               "end, requests ok/failed with the most frequent error codes, tokens in and out,\n"
               "throughput over wall time, p50/p95/p99 of queue time, time to first token, time\n"
               "per output token and end-to-end time (nearest-rank percentiles), preemptions,\n"
               "prefix reuse from the in-run cache and from the persistent cache, and cache\n"
               "bytes read and written. A run that has not ended is summarised from the rows\n"
               "written so far.\n"
               "\n"
               "  DB               the SQLite metrics database (must exist). Several: the latest\n"
               "                   run of each, summarised as one (counts summed, percentiles\n"
               "                   over all requests, wall time from first start to last end)\n"
               "      --run ID     the run to summarise (default: the latest run)\n"
               "      --list       print one line per run (id, start, status, ok/requests, wall\n"
               "                   time, model, job) instead of a summary\n"
               "      --format F   text (default), json (one object) or csv (a header line and\n"
               "                   one row; with --list, one row per run): the same figures as\n"
               "                   the text, in a layout README.md documents\n"
               "      --json       the same as --format json\n"
               "      --html FILE  write one self-contained page (no script, nothing fetched):\n"
               "                   throughput and running/waiting sequences over time, latency\n"
               "                   distributions, prefix reuse, errors, the slowest requests,\n"
               "                   one row per run; several DBs are drawn one line each. '-' is\n"
               "                   stdout. Without --format, nothing else is printed\n"
               "  -h, --help       this text\n"
               "\n"
               "Exit status: 0 printed, 1 the database cannot be read, the run does not exist or\n"
               "FILE cannot be written, 2 bad command line.\n");
}

/* Whether argv[i] is a database path (not an option or an option's value). */
static bool is_path_arg(char **argv, int i)
{
    const char *a = argv[i];
    if (a[0] == '-' && a[1] != '\0') return false;
    /* the value of a separate "--run ID", "--format F", "--html FILE" */
    if (i > 1 && (!strcmp(argv[i - 1], "--run") || !strcmp(argv[i - 1], "--format") || !strcmp(argv[i - 1], "--html")))
        return false;
    return true;
}

/* Writes the page to FILE through a temporary file beside it, renamed into
 * place when complete: a failed report never leaves half a page. */
static enum kvb_status write_html(const char *file, const char *const *paths, int n, int64_t run_id,
                                  struct kvb_err *err)
{
    if (!strcmp(file, "-")) return metrics_report_html(paths, n, run_id, stdout, err);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", file, (long)getpid()) >= (int)sizeof tmp)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "--html %s: path too long", file);
    FILE *f = fopen(tmp, "w");
    if (!f) return kvb_errf(err, KVB_ERR_IO, "--html %s: cannot write: %s", file, strerror(errno));
    enum kvb_status st = metrics_report_html(paths, n, run_id, f, err);
    bool bad = ferror(f);
    if (fclose(f) != 0) bad = true;
    if (st == KVB_OK && bad) st = kvb_errf(err, KVB_ERR_IO, "--html %s: cannot write: %s", file, strerror(errno));
    if (st == KVB_OK && rename(tmp, file) != 0)
        st = kvb_errf(err, KVB_ERR_IO, "--html %s: cannot rename %s into place: %s", file, tmp, strerror(errno));
    if (st != KVB_OK) unlink(tmp);
    return st;
}

int cli_report(int argc, char **argv)
{
    int n_paths = 0;
    int64_t run_id = METRICS_RUN_LATEST;
    bool list = false, format_given = false;
    enum metrics_format fmt = METRICS_FORMAT_TEXT;
    const char *html = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (cli_opt_is(a, "--run")) {
            const char *val = cli_opt_value(argc, argv, &i);
            if (!val || !cli_parse_i64("--run", val, 1, INT64_MAX, &run_id)) return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--list")) {
            list = true;
        } else if (cli_opt_is(a, "--format")) {
            const char *val = cli_opt_value(argc, argv, &i);
            if (!val) return CLI_EXIT_USAGE;
            if (!metrics_format_parse(val, &fmt)) {
                fprintf(stderr, "kvbatch report: --format '%s': expected text, json or csv\n", val);
                return CLI_EXIT_USAGE;
            }
            format_given = true;
        } else if (!strcmp(a, "--json")) {
            fmt = METRICS_FORMAT_JSON;
            format_given = true;
        } else if (cli_opt_is(a, "--html")) {
            html = cli_opt_value(argc, argv, &i);
            if (!html) return CLI_EXIT_USAGE;
            if (!*html) {
                fprintf(stderr, "kvbatch report: --html needs a file name ('-' for stdout)\n");
                return CLI_EXIT_USAGE;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "kvbatch report: unknown option '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        } else {
            n_paths++;
        }
    }
    if (n_paths == 0) {
        fprintf(stderr, "kvbatch report: no database given\n");
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (list && run_id != METRICS_RUN_LATEST) {
        fprintf(stderr, "kvbatch report: --list and --run do not go together\n");
        return CLI_EXIT_USAGE;
    }
    if (n_paths > 1 && (list || run_id != METRICS_RUN_LATEST)) {
        fprintf(stderr, "kvbatch report: --list and --run take one database (several are summarised together)\n");
        return CLI_EXIT_USAGE;
    }
    if (html && list) {
        fprintf(stderr, "kvbatch report: --html draws a run, --list lists runs: give one of them\n");
        return CLI_EXIT_USAGE;
    }
    if (html && !strcmp(html, "-") && format_given) {
        fprintf(stderr, "kvbatch report: --html - and --format both write to stdout: give one of them\n");
        return CLI_EXIT_USAGE;
    }
    const bool print = !html || format_given;

    const char **paths = kvb_calloc((size_t)n_paths, sizeof *paths);
    if (!paths) {
        fprintf(stderr, "kvbatch report: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    for (int i = 1, k = 0; i < argc; i++)
        if (is_path_arg(argv, i)) paths[k++] = argv[i];

    struct kvb_err err = {{0}};
    enum kvb_status st = KVB_OK;
    if (print && n_paths > 1) {
        st = metrics_report_combined_format(paths, n_paths, fmt, stdout, stderr, &err);
    } else if (print) {
        struct metrics_db *db = NULL;
        st = metrics_open_existing(paths[0], &db, &err);
        if (st == KVB_OK) {
            st = list ? metrics_list_runs_format(db, fmt, stdout, NULL, &err)
                      : metrics_report_format(db, run_id, fmt, stdout, &err);
            metrics_close(db);
        }
    }
    if (st == KVB_OK && html) {
        st = write_html(html, paths, n_paths, run_id, &err);
        if (st == KVB_OK && strcmp(html, "-") != 0) fprintf(stderr, "kvbatch report: wrote %s\n", html);
    }
    kvb_free(paths);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbatch report: %s\n", err.msg);
        return CLI_EXIT_FAIL;
    }
    if (fflush(stdout) != 0) {
        perror("kvbatch report: writing the report");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
