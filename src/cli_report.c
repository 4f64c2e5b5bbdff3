/* cli_report.c — `kvbatch report DB... [--run ID] [--list]`: prints the
 * summary of one run recorded in a metrics database, or the list of its
 * runs, or one summary of the latest runs of several databases (shards). It
 * only reads: a missing database is an error, never created. */
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "cli.h"
#include "cli_util.h"
#include "metrics.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvbatch report DB [--run ID] [--list]\n"
        "       kvbatch report DB DB...   (the shards of one job, as one run)\n"
        "\n"
        "Summarises a run recorded in the metrics database DB (the --metrics file of\n"
        "`kvbatch run`; by default kvbatch.db beside the output file): status, start and\n"
        "end, requests ok/failed with the most frequent error codes, tokens in and out,\n"
        "throughput over wall time, p50/p95/p99 of queue time, time to first token, time\n"
        "per output token and end-to-end time (nearest-rank percentiles), prefix reuse\n"
        "from the in-run cache and from the persistent cache, and cache bytes read and\n"
        "written. A run that has not ended is summarised from the rows written so far.\n"
        "\n"
        "  DB               the SQLite metrics database (must exist). Several: the latest\n"
        "                   run of each, summarised as one (counts summed, percentiles over\n"
        "                   all requests, wall time from first start to last end)\n"
        "      --run ID     the run to summarise (default: the latest run)\n"
        "      --list       print one line per run (id, start, status, ok/requests, wall\n"
        "                   time, model, job) instead of a summary\n"
        "  -h, --help       this text\n"
        "\n"
        "Exit status: 0 printed, 1 the database cannot be read or the run does not exist,\n"
        "2 bad command line.\n");
}

/* Whether argv[i] is a database path (not an option or an option's value). */
static bool is_path_arg(char **argv, int i)
{
    const char *a = argv[i];
    if (a[0] == '-' && a[1] != '\0') return false;
    /* the value of a separate "--run ID" */
    return !(i > 1 && !strcmp(argv[i - 1], "--run"));
}

int cli_report(int argc, char **argv)
{
    int n_paths = 0;
    int64_t run_id = METRICS_RUN_LATEST;
    bool list = false;

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

    struct kvb_err err = {{0}};
    enum kvb_status st;
    if (n_paths > 1) {
        const char **paths = kvb_calloc((size_t)n_paths, sizeof *paths);
        if (!paths) {
            fprintf(stderr, "kvbatch report: out of memory\n");
            return CLI_EXIT_FAIL;
        }
        for (int i = 1, k = 0; i < argc; i++)
            if (is_path_arg(argv, i)) paths[k++] = argv[i];
        st = metrics_report_combined(paths, n_paths, stdout, &err);
        kvb_free(paths);
    } else {
        const char *path = NULL;
        for (int i = 1; i < argc && !path; i++)
            if (is_path_arg(argv, i)) path = argv[i];
        struct metrics_db *db = NULL;
        st = metrics_open_existing(path, &db, &err);
        if (st == KVB_OK) {
            st = list ? metrics_list_runs(db, stdout, NULL, &err) : metrics_report(db, run_id, stdout, &err);
            metrics_close(db);
        }
    }
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
