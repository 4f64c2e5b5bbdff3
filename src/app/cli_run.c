/* cli_run.c — `kvbatch run`: option parsing; the work is in runner.c. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/backend_select.h"
#include "app/cli.h"
#include "app/cli_files.h"
#include "app/cli_util.h"
#include "app/runner.h"
#include "jobs/job_shard.h"
#include "store/metrics/metrics.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch run --input JOBS.jsonl --output RESULTS.jsonl [options]\n"
               "\n"
               "Runs every request of a JSONL job (OpenAI Batch format, or the shorthand\n"
               "{\"custom_id\":…, \"prompt\"|\"messages\"|\"input\":…}) and writes one result line per\n"
               "non-blank input line, as requests finish. Bad lines become error lines that\n"
               "name the line and field; the job goes on. Requests that share a prompt\n"
               "prefix share its KV cache, and are run close together to make that happen.\n"
               "\n"
               "  -m, --model PATH         GGUF model (default: $KVBATCH_MODEL or\n"
               "                           models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
               "  -i, --input PATH         the job file ('-' = standard input)\n"
               "  -o, --output PATH        the result file ('-' = standard output), replaced unless --resume,\n"
               "                           and only once the run has started; never the input, the model\n"
               "                           or the metrics database, even through a link\n"
               "      --metrics DB         SQLite metrics database (default: kvbatch.db beside the output,\n"
               "                           in the working directory for '-o -')\n"
               "      --resume             keep the results already in the output (a regular file), run the rest\n"
               "      --shard I/N | auto   run shard I (0-based) of N: every shard reads the whole job and\n"
               "                           takes its share, requests sharing a prompt prefix kept together;\n"
               "                           auto: from a Slurm job array (SLURM_ARRAY_TASK_ID/_COUNT/_MIN) or\n"
               "                           a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, KVBATCH_SHARD_COUNT).\n"
               "                           Give each shard its own --output and --metrics\n"
               "  -t, --threads N          worker threads (default: all cores)\n"
               "      --max-batch N        sequences running at once (default 128 on the CPU, 256 on a GPU)\n"
               "      --max-step-tokens N  tokens per forward pass, prefill chunks and decodes together\n"
               "                           (default 512 on the CPU, 4096 on a GPU: large steps keep it busy)\n"
               "      --kv-mem SIZE        memory for the KV cache, e.g. 512M, 2G (default: 1G on the CPU,\n"
               "                           90%% of what the weights leave free on a GPU)\n"
               "      --kv-type T          how the KV cache stores K/V rows: f16 (default), q8 (8-bit groups\n"
               "                           of 32 with an fp16 scale) or q4 (V in 4-bit groups, K in 8-bit: the\n"
               "                           keys are the sensitive half): the same --kv-mem holds ~1.9x or\n"
               "                           ~2.4x the tokens; outputs differ slightly from f16's\n"
               "      --device DEV         auto | cpu | cuda | cuda:N (default auto: a CUDA device when usable)\n"
               "      --deterministic      GPU: results independent of batch composition (slower)\n"
               "      --cuda-graphs        GPU: replay repeated step shapes (decode) from CUDA graphs\n"
               "      --block-size N       tokens per KV block (default 16)\n"
               "  -c, --ctx N              most tokens per sequence, prompt + output (default: min(model's, 4096))\n"
               "      --lookahead N        requests read ahead to group shared prefixes (default max(256, 4 x batch))\n"
               "      --chat-template NAME|FILE  the chat template (default: the model's own Jinja template,\n"
               "                           tokenizer.chat_template): one of the model's named templates, a\n"
               "                           Jinja file, or a built-in family: chatml | llama3 | llama31 |\n"
               "                           llama2 | mistral | mistral-v3 | mistral-tekken | zephyr | gemma\n"
               "      --cache-dir DIR      persistent prefix cache (default: $KVBATCH_CACHE_DIR, else\n"
               "                           $XDG_CACHE_HOME/kvbatch, else ~/.cache/kvbatch)\n"
               "      --no-cache           do not read or write the persistent prefix cache\n"
               "      --cache-max-size SIZE  cap on the cache (default 10G, never more than free disk)\n"
               "      --cache-level N      zstd level for cache values, 1..19 (default 3)\n"
               "      --cache-lossy8       store cached K/V as 8-bit (~2.3x smaller, lossy: outputs may change)\n"
               "      --cache-buffer SIZE  blocks waiting to be compressed and written, at most (default 64M);\n"
               "                           beyond it blocks are not stored, never waited for: raise it when the\n"
               "                           run summary says blocks were not stored\n"
               "      --pooling P          how /v1/embeddings lines pool the final hidden states: mean | cls |\n"
               "                           last (default: the model's own pooling_type; a generative model has\n"
               "                           none and needs this option for embeddings)\n"
               "      --no-normalize       embeddings as pooled, not L2-normalised\n"
               "      --kernels K          CPU kernels: auto (default: the best this CPU runs, amx > avx512 >\n"
               "                           avx2 > scalar; KVBATCH_KERNELS overrides it) | amx | avx512 | avx2 |\n"
               "                           scalar (the slow reference). Each is deterministic; they differ in\n"
               "                           the last bits (amx = avx512 but for F16/BF16 weights), and the\n"
               "                           persistent cache keeps each one's apart. One this CPU cannot run\n"
               "                           is an error\n"
               "      --scalar             the same as --kernels scalar\n"
               "      --activations N      bits the CPU keeps of each activation in products with quantized\n"
               "                           weights: 8 (default; llama.cpp's rounding, fastest) or 16 (the\n"
               "                           8-bit rounding plus its residual, two products: outputs within a\n"
               "                           hair of float arithmetic, for evaluations and embeddings; about\n"
               "                           twice the prefill time, batch-1 decode a few %% slower). The\n"
               "                           persistent cache keeps the two apart; CUDA's stay float\n"
               "  -q, --quiet              no progress or summary on stderr\n"
               "  -h, --help               this text\n"
               "\n"
               "Exit status: 0 the job ran to the end (even if some lines were bad); 1 it could not\n"
               "run (model, input or output unusable); 2 bad command line; 128+N interrupted by\n"
               "signal N (results so far are on disk: rerun with --resume).\n");
}

static const char *env_of(const char *name) { return getenv(name); }

int cli_run(int argc, char **argv)
{
    char model_path[PATH_MAX];
    cli_default_model(model_path, sizeof model_path);
    struct run_opts o = {
        .model_path = model_path,
        .block_size = 16,
    };
    int64_t v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
#define INT(lo, hi, dst)                                                                                               \
    do {                                                                                                               \
        CLI_VAL();                                                                                                     \
        if (!cli_parse_i64(a, val, lo, hi, &v)) return CLI_EXIT_USAGE;                                                 \
        dst = (int32_t)v;                                                                                              \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "-m") || cli_opt_is(a, "--model")) {
            CLI_VAL();
            o.model_path = val;
        } else if (!strcmp(a, "-i") || cli_opt_is(a, "--input")) {
            CLI_VAL();
            o.input_path = val;
        } else if (!strcmp(a, "-o") || cli_opt_is(a, "--output")) {
            CLI_VAL();
            o.output_path = val;
        } else if (cli_opt_is(a, "--metrics")) {
            CLI_VAL();
            o.metrics_path = val;
        } else if (cli_opt_is(a, "--shard")) {
            CLI_VAL();
            struct kvb_err err = {{0}};
            if (shard_parse(val, env_of, &o.shard_index, &o.shard_count, &err) != KVB_OK) {
                fprintf(stderr, "kvbatch run: %s\n", err.msg);
                return CLI_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--resume")) o.resume = true;
        else if (!strcmp(a, "-t") || cli_opt_is(a, "--threads")) INT(1, 1024, o.n_threads);
        else if (cli_opt_is(a, "--max-batch")) INT(1, 4096, o.max_batch);
        else if (cli_opt_is(a, "--max-step-tokens")) INT(1, 1 << 20, o.max_step_tokens);
        else if (cli_opt_is(a, "--block-size")) INT(1, 1024, o.block_size);
        else if (!strcmp(a, "-c") || cli_opt_is(a, "--ctx")) INT(16, 1 << 20, o.n_ctx);
        else if (cli_opt_is(a, "--lookahead")) INT(1, 1 << 20, o.lookahead);
        else if (cli_opt_is(a, "--kv-mem")) {
            CLI_VAL();
            if (!cli_parse_size(a, val, &o.kv_mem)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--kv-type")) {
            CLI_VAL();
            if (!cli_parse_kv_type(a, val, &o.kv_type)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--chat-template")) {
            CLI_VAL();
            o.chat_template = val;
        } else if (cli_opt_is(a, "--cache-dir")) {
            CLI_VAL();
            o.cache_dir = val;
        } else if (!strcmp(a, "--no-cache")) o.no_cache = true;
        else if (cli_opt_is(a, "--cache-max-size")) {
            CLI_VAL();
            if (!cli_parse_size(a, val, &o.cache_max_size)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--cache-level")) {
            int32_t lvl;
            INT(1, 19, lvl);
            o.cache_level = lvl;
        } else if (!strcmp(a, "--cache-lossy8")) o.cache_lossy8 = true;
        else if (cli_opt_is(a, "--cache-buffer")) {
            CLI_VAL();
            if (!cli_parse_size(a, val, &o.cache_buffer)) return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--scalar")) o.kernels = MM_IMPL_SCALAR;
        else if (cli_opt_is(a, "--kernels")) {
            CLI_VAL();
            if (!cli_parse_kernels(a, val, &o.kernels)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--activations")) {
            CLI_VAL();
            if (!cli_parse_activations(a, val, &o.act16)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--pooling")) {
            CLI_VAL();
            if (strcmp(val, "mean") && strcmp(val, "cls") && strcmp(val, "last")) {
                fprintf(stderr, "kvbatch run: --pooling expects mean, cls or last, got '%s'\n", val);
                return CLI_EXIT_USAGE;
            }
            o.pooling = val;
        } else if (!strcmp(a, "--no-normalize")) o.no_normalize = true;
        else if (cli_opt_is(a, "--device")) {
            CLI_VAL();
            if (!be_select_device_valid(val)) {
                fprintf(stderr, "kvbatch run: --device expects auto, cpu, cuda or cuda:N, got '%s'\n", val);
                return CLI_EXIT_USAGE;
            }
            o.device = val;
        } else if (!strcmp(a, "--deterministic")) o.deterministic = true;
        else if (!strcmp(a, "--cuda-graphs")) o.cuda_graphs = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o.quiet = true;
        else {
            fprintf(stderr, "kvbatch run: unknown option '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
#undef INT
    }
    if (o.cache_lossy8 && o.kv_type != KV_F16) {
        /* q8/q4 blocks are stored exactly as the pool holds them; re-rounding
         * them to 8 bits would only add error to what is already small. */
        fprintf(stderr,
                "kvbatch run: --cache-lossy8 applies to --kv-type f16 only (%s blocks are stored as they are)\n",
                kv_type_name(o.kv_type));
        return CLI_EXIT_USAGE;
    }
    if (!o.input_path || !o.output_path) {
        fprintf(stderr, "kvbatch run: --input and --output are required (see --help)\n");
        return CLI_EXIT_USAGE;
    }
    /* The runner opens the metrics database at this path: the check below
     * must look at the same one. */
    char mpath[PATH_MAX];
    if (!o.metrics_path) {
        if (metrics_default_path(strcmp(o.output_path, "-") ? o.output_path : "", mpath, sizeof mpath) != KVB_OK) {
            fprintf(stderr, "kvbatch run: the output path is too long to put kvbatch.db beside it (give --metrics)\n");
            return CLI_EXIT_USAGE;
        }
        o.metrics_path = mpath;
    }
    struct cli_run_files files = {.input = o.input_path,
                                  .output = o.output_path,
                                  .metrics = o.metrics_path,
                                  .model = o.model_path,
                                  .resume = o.resume};
    struct kvb_err err = {{0}};
    if (cli_files_check(&files, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch run: %s\n", err.msg);
        return CLI_EXIT_USAGE;
    }
    return run_job(&o);
}
