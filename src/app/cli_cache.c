/* cli_cache.c — `kvbatch cache stats|verify|gc|clear`: looks after a
 * persistent prefix cache directory (store/pstore.h) outside of any run.
 * Safe to use while jobs are running on the same directory: LMDB keeps one
 * writer at a time, and every change here is a removal. A directory that
 * holds no cache is reported, never created. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "app/cli.h"
#include "app/cli_util.h"
#include "model/model.h"
#include "store/pstore/pstore.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch cache stats  [--cache-dir DIR]\n"
               "       kvbatch cache verify [--cache-dir DIR]\n"
               "       kvbatch cache gc     [--max-size SIZE] [--cache-dir DIR]\n"
               "       kvbatch cache clear  [--model PATH | --fingerprint HEX] [--cache-dir DIR]\n"
               "\n"
               "Manages the persistent prefix cache: the compressed KV blocks of prompt prefixes\n"
               "that `kvbatch run` keeps so that later runs skip prefilling them.\n"
               "\n"
               "  stats    entries, stored and uncompressed bytes, compression ratio, data file and\n"
               "           map size, and the same per model (name, fingerprint, KV type, shape)\n"
               "  verify   checks the LMDB file's own structure (pages, tree, free list), then\n"
               "           decodes every value and checks its header, model, tokens, checksum and\n"
               "           key; removes the bad ones, the entries that hung below them, and values\n"
               "           or records left without their other half; repairs child counts\n"
               "  gc       evicts least recently used blocks (leaves of the prefix tree first, so\n"
               "           every chain that remains is whole) until the stored bytes fit SIZE\n"
               "  clear    removes every entry, or only those of one model (a file whose\n"
               "           structure is damaged is moved to DIR/damaged-TIME/ instead)\n"
               "\n"
               "      --cache-dir DIR     the cache (default: $KVBATCH_CACHE_DIR, else\n"
               "                          $XDG_CACHE_HOME/kvbatch, else ~/.cache/kvbatch)\n"
               "      --max-size SIZE     gc: the size to trim to, e.g. 512M, 2G (default: 10G, or\n"
               "                          less when the disk cannot hold that much)\n"
               "      --model PATH        clear: the GGUF whose entries go (its weights are hashed\n"
               "                          to find its fingerprint, which takes a moment)\n"
               "      --fingerprint HEX   clear: the same by the 32-hex fingerprint `stats` shows\n"
               "                          (for a model file that no longer exists)\n"
               "  -h, --help              this text\n"
               "\n"
               "LMDB reuses freed pages but does not shrink data.mdb; to give the disk space\n"
               "back, remove the directory when no job is using it.\n"
               "\n"
               "A damaged value is a miss: verify removes it and exits 0. Damage to the file's\n"
               "structure (a truncated or overwritten data.mdb) is not repairable in place:\n"
               "verify, stats and gc report it and exit 1; `kvbatch run` and `cache clear` move\n"
               "the file to DIR/damaged-TIME/ and start an empty cache.\n"
               "\n"
               "Exit status: 0 done (verify: also when it found and removed damaged values), 1\n"
               "the cache's structure is damaged, or the cache or the model could not be read or\n"
               "written, 2 bad command line.\n");
}

enum cache_sub { SUB_STATS, SUB_VERIFY, SUB_GC, SUB_CLEAR };

struct cache_args {
    const char *sub, *dir, *model_path, *fingerprint;
    enum cache_sub which;
    uint64_t max_size;
    bool have_max;
};

/* Reads the command line into *a: -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, struct cache_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (cli_opt_is(o, "--cache-dir")) {
            if (!(a->dir = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(o, "--max-size")) {
            const char *val = cli_opt_value(argc, argv, &i);
            if (!val || !cli_parse_size("--max-size", val, &a->max_size)) return CLI_EXIT_USAGE;
            a->have_max = true;
        } else if (cli_opt_is(o, "--model")) {
            if (!(a->model_path = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(o, "--fingerprint")) {
            if (!(a->fingerprint = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
        } else if (o[0] == '-' && o[1] != '\0') {
            fprintf(stderr, "kvbatch cache: unknown option '%s' (see --help)\n", o);
            return CLI_EXIT_USAGE;
        } else if (!a->sub) {
            a->sub = o;
        } else {
            fprintf(stderr, "kvbatch cache: unexpected argument '%s' (see --help)\n", o);
            return CLI_EXIT_USAGE;
        }
    }
    if (!a->sub) {
        fprintf(stderr, "kvbatch cache: no subcommand given\n");
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    static const char *const names[] = {"stats", "verify", "gc", "clear"};
    int w = 0;
    while (w < 4 && strcmp(a->sub, names[w])) w++;
    if (w == 4) {
        fprintf(stderr, "kvbatch cache: unknown subcommand '%s' (stats, verify, gc or clear)\n", a->sub);
        return CLI_EXIT_USAGE;
    }
    a->which = (enum cache_sub)w;
    if (a->have_max && a->which != SUB_GC) {
        fprintf(stderr, "kvbatch cache: --max-size goes with gc\n");
        return CLI_EXIT_USAGE;
    }
    if ((a->model_path || a->fingerprint) && a->which != SUB_CLEAR) {
        fprintf(stderr, "kvbatch cache: --model and --fingerprint go with clear\n");
        return CLI_EXIT_USAGE;
    }
    if (a->model_path && a->fingerprint) {
        fprintf(stderr, "kvbatch cache: give --model or --fingerprint, not both\n");
        return CLI_EXIT_USAGE;
    }
    return -1;
}

/* The subcommand on an open store; what it prints goes to stdout. */
static enum kvb_status run_sub(struct pstore *ps, const struct cache_args *a, struct kvb_err *err)
{
    enum kvb_status rs = KVB_OK;
    uint64_t n = 0;
    switch (a->which) {
    case SUB_STATS: rs = pstore_print_stats(ps, stdout, err); break;
    case SUB_VERIFY: rs = pstore_verify(ps, stdout, &n, err); break;
    case SUB_GC:
        rs = pstore_gc(ps, a->have_max ? a->max_size : pstore_max_size(ps), &n, err);
        if (rs == KVB_OK) printf("evicted %llu blocks\n", (unsigned long long)n);
        if (rs == KVB_OK) rs = pstore_print_stats(ps, stdout, err);
        break;
    case SUB_CLEAR:
        rs = pstore_clear(ps, a->fingerprint, &n, err);
        if (rs == KVB_OK) {
            if (a->fingerprint) printf("removed %llu blocks of model %s\n", (unsigned long long)n, a->fingerprint);
            else printf("removed %llu blocks\n", (unsigned long long)n);
        }
        break;
    }
    return rs;
}

int cli_cache(int argc, char **argv)
{
    struct cache_args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc >= 0) return prc;

    char defdir[4096], path[4200];
    if (!a.dir) {
        pstore_default_dir(defdir, sizeof defdir);
        a.dir = defdir;
    }
    int pn = snprintf(path, sizeof path, "%s/data.mdb", a.dir);
    struct stat st;
    if (pn < 0 || (size_t)pn >= sizeof path) {
        fprintf(stderr, "kvbatch cache: directory name too long\n");
        return CLI_EXIT_USAGE;
    }
    if (stat(path, &st) != 0) {
        printf("no cache in %s (nothing to %s)\n", a.dir, a.which == SUB_STATS ? "show" : "do");
        return CLI_EXIT_OK;
    }

    struct kvb_err err = {{0}};
    char fp[33];
    if (a.model_path) {
        struct model *m = NULL;
        if (model_load(a.model_path, &m, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch cache: %s\n", err.msg);
            return CLI_EXIT_FAIL;
        }
        snprintf(fp, sizeof fp, "%s", m->fingerprint);
        model_free(m);
        a.fingerprint = fp;
    }

    /* A file whose own structure is damaged is reported, not moved, except
     * by clear, whose point is an empty cache. */
    struct pstore_opts opts = {.keep_damaged = a.which != SUB_CLEAR};
    struct pstore *ps = NULL;
    enum kvb_status os = pstore_open(a.dir, &opts, &ps, &err);
    if (os != KVB_OK) {
        if (a.which == SUB_VERIFY && os == KVB_ERR_FORMAT) printf("damaged: %s\n", err.msg);
        else fprintf(stderr, "kvbatch cache %s: %s\n", a.sub, err.msg);
        return CLI_EXIT_FAIL;
    }
    enum kvb_status rs = run_sub(ps, &a, &err);
    pstore_close(ps);
    if (rs != KVB_OK) {
        fprintf(stderr, "kvbatch cache %s: %s\n", a.sub, err.msg);
        return rs == KVB_ERR_INVALID_ARG ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (fflush(stdout) != 0) {
        perror("kvbatch cache: writing the output");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
