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
    fprintf(f,
        "usage: kvbatch cache stats  [--cache-dir DIR]\n"
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

int cli_cache(int argc, char **argv)
{
    const char *sub = NULL, *dir = NULL, *model_path = NULL, *fingerprint = NULL;
    uint64_t max_size = 0;
    bool have_max = false;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (cli_opt_is(a, "--cache-dir")) {
            if (!(dir = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--max-size")) {
            const char *val = cli_opt_value(argc, argv, &i);
            if (!val || !cli_parse_size("--max-size", val, &max_size)) return CLI_EXIT_USAGE;
            have_max = true;
        } else if (cli_opt_is(a, "--model")) {
            if (!(model_path = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--fingerprint")) {
            if (!(fingerprint = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "kvbatch cache: unknown option '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        } else if (!sub) {
            sub = a;
        } else {
            fprintf(stderr, "kvbatch cache: unexpected argument '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
    }
    if (!sub) {
        fprintf(stderr, "kvbatch cache: no subcommand given\n");
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    bool is_stats = !strcmp(sub, "stats"), is_verify = !strcmp(sub, "verify"), is_gc = !strcmp(sub, "gc"),
         is_clear = !strcmp(sub, "clear");
    if (!is_stats && !is_verify && !is_gc && !is_clear) {
        fprintf(stderr, "kvbatch cache: unknown subcommand '%s' (stats, verify, gc or clear)\n", sub);
        return CLI_EXIT_USAGE;
    }
    if (have_max && !is_gc) {
        fprintf(stderr, "kvbatch cache: --max-size goes with gc\n");
        return CLI_EXIT_USAGE;
    }
    if ((model_path || fingerprint) && !is_clear) {
        fprintf(stderr, "kvbatch cache: --model and --fingerprint go with clear\n");
        return CLI_EXIT_USAGE;
    }
    if (model_path && fingerprint) {
        fprintf(stderr, "kvbatch cache: give --model or --fingerprint, not both\n");
        return CLI_EXIT_USAGE;
    }

    char defdir[4096], path[4200];
    if (!dir) {
        pstore_default_dir(defdir, sizeof defdir);
        dir = defdir;
    }
    int pn = snprintf(path, sizeof path, "%s/data.mdb", dir);
    struct stat st;
    if (pn < 0 || (size_t)pn >= sizeof path) {
        fprintf(stderr, "kvbatch cache: directory name too long\n");
        return CLI_EXIT_USAGE;
    }
    if (stat(path, &st) != 0) {
        printf("no cache in %s (nothing to %s)\n", dir, is_stats ? "show" : "do");
        return CLI_EXIT_OK;
    }

    struct kvb_err err = {{0}};
    char fp[33];
    if (model_path) {
        struct model *m = NULL;
        if (model_load(model_path, &m, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch cache: %s\n", err.msg);
            return CLI_EXIT_FAIL;
        }
        snprintf(fp, sizeof fp, "%s", m->fingerprint);
        model_free(m);
        fingerprint = fp;
    }

    /* A file whose own structure is damaged is reported, not moved, except
     * by clear, whose point is an empty cache. */
    struct pstore_opts opts = {.keep_damaged = !is_clear};
    struct pstore *ps = NULL;
    enum kvb_status os = pstore_open(dir, &opts, &ps, &err);
    if (os != KVB_OK) {
        if (is_verify && os == KVB_ERR_FORMAT) printf("damaged: %s\n", err.msg);
        else fprintf(stderr, "kvbatch cache %s: %s\n", sub, err.msg);
        return CLI_EXIT_FAIL;
    }
    enum kvb_status rs = KVB_OK;
    if (is_stats) {
        rs = pstore_print_stats(ps, stdout, &err);
    } else if (is_verify) {
        uint64_t n_bad = 0;
        rs = pstore_verify(ps, stdout, &n_bad, &err);
    } else if (is_gc) {
        uint64_t n = 0, cap = have_max ? max_size : pstore_max_size(ps);
        rs = pstore_gc(ps, cap, &n, &err);
        if (rs == KVB_OK) printf("evicted %llu blocks\n", (unsigned long long)n);
        if (rs == KVB_OK) rs = pstore_print_stats(ps, stdout, &err);
    } else {
        uint64_t n = 0;
        rs = pstore_clear(ps, fingerprint, &n, &err);
        if (rs == KVB_OK) {
            if (fingerprint) printf("removed %llu blocks of model %s\n", (unsigned long long)n, fingerprint);
            else printf("removed %llu blocks\n", (unsigned long long)n);
        }
    }
    pstore_close(ps);
    if (rs != KVB_OK) {
        fprintf(stderr, "kvbatch cache %s: %s\n", sub, err.msg);
        return rs == KVB_ERR_INVALID_ARG ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (fflush(stdout) != 0) {
        perror("kvbatch cache: writing the output");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
