/* main.c — the kvbatch command line: dispatches to one cli_* per command. */
#include <stdio.h>
#include <string.h>

#include "app/cli.h"
#include "app/cli_util.h"
#include "base/cpu.h"
#include "kvb_build_info.h"
#include "model/quant.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
};

static const struct command commands[] = {
    {"run", cli_run, "run a JSONL job of requests (OpenAI Batch format) to a JSONL result file"},
    {"render", cli_render, "print each request's prompt as run prefills it: the templated text, its token ids"},
    {"generate", cli_generate, "complete one prompt (streamed to stdout)"},
    {"tokenize", cli_tokenize, "print the token ids of a text"},
    {"logits", cli_logits, "write the raw logits of a prompt (for checking against a reference)"},
    {"info", cli_info, "say what a model file is: architecture, sizes, weight types, window, template"},
    {"cache", cli_cache, "inspect and manage the persistent prefix cache (stats, verify, gc, clear)"},
    {"report", cli_report, "summarise a run recorded in a metrics database (or several shards' runs as one)"},
};

static void usage(FILE *f)
{
    fprintf(f, "kvbatch — offline batch runner for large language models\n"
               "\n"
               "usage: kvbatch COMMAND [options]     (kvbatch COMMAND --help for its options)\n"
               "       kvbatch --version             version, git revision and build options\n"
               "\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n"
               "The default model is models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-model.sh\n"
               "downloads it) or $KVBATCH_MODEL.\n"
               "Exit status: 0 success, 1 the work could not be done, 2 bad command line,\n"
               "3 (render) some lines are bad, 128+N interrupted by signal N. The man page\n"
               "(man kvbatch) has every command's help.\n");
}

static void version(void)
{
    const struct cpu_features cf = cpu_features();
    printf("kvbatch %s (git %s)\n", KVB_VERSION, KVB_GIT_REV);
#ifdef KVBATCH_HAVE_CUDA
    const char *cuda = "CUDA backend built in";
#else
    const char *cuda = "no CUDA backend";
#endif
    printf("%s; %s\n", cuda, KVB_BUILD_OPTS);
    enum mm_impl best = MM_IMPL_SCALAR;
    struct kvb_err err = {{0}};
    const bool env_ok = mm_impl_resolve(MM_IMPL_AUTO, &best, &err) == KVB_OK;
    printf("CPU kernels this machine runs: %s (AVX2 %s, AVX-512 VNNI %s, AMX %s)\n", env_ok ? mm_impl_label(best) : "?",
           cf.avx2 ? "yes" : "no", cf.avx512 ? "yes" : "no",
           mm_impl_available(MM_IMPL_AMX) ? "yes"
           : cf.amx_cpu                   ? "in the CPU, but not usable here"
                                          : "no");
    if (!env_ok) printf("%s\n", err.msg);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        version();
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvbatch: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
