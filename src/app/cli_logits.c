/* cli_logits.c — `kvbatch logits`: the raw logits after every prompt token,
 * written as little-endian float32 [n_tokens][n_vocab]. It exists so that an
 * independent reference (tests/pytest_ref_logits.py, tests/pytest_hf_ref.py)
 * can check the forward pass number by number; --prompt-ids lets such a
 * reference feed exactly the ids it feeds its own model. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "app/cli.h"
#include "app/cli_llm.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "engine/gen.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch logits (--prompt TEXT | --prompt-ids LIST) --out FILE [options]\n"
               "\n"
               "Runs the prompt through the model and writes the logits after each of\n"
               "its tokens to FILE as little-endian float32, shape [n_tokens][n_vocab].\n"
               "Prints the prompt's token ids on stdout.\n"
               "\n"
               "  -m, --model PATH       GGUF model (default as for generate)\n"
               "  -p, --prompt TEXT      the prompt (tokenized without BOS unless the model asks for it)\n"
               "      --prompt-ids LIST  the prompt as token ids (\"1 2 3\"), taken as they are: no BOS\n"
               "  -o, --out FILE         where to write the logits\n"
               "  -t, --threads N        worker threads (default: all cores)\n"
               "  -c, --ctx N            context of the run (default min(trained context, 4096)): the\n"
               "                         longest prompt, and what LongRoPE's factor set follows\n"
               "      --batch N          most tokens per forward pass (default 512)\n"
               "      --device DEV       auto | cpu | cuda | cuda:N (default auto)\n"
               "      --kv-type T        KV cache rows: f16 | q8 | q4 (default f16; q4: 4-bit V, 8-bit K)\n"
               "      --kernels K        CPU kernels: auto | amx | avx512 | avx2 | scalar (default auto)\n"
               "      --scalar           the same as --kernels scalar (the slow reference)\n"
               "      --activations N    8 | 16: bits the CPU keeps of each activation in products with\n"
               "                         quantized weights (default 8; 16: near float; see run --help)\n"
               "  -h, --help             this text\n");
}

int cli_logits(int argc, char **argv)
{
    char model_path[PATH_MAX];
    cli_default_model(model_path, sizeof model_path);
    struct cli_llm_opts lo = {.model_path = model_path};
    const char *prompt = NULL, *prompt_ids = NULL, *out_path = NULL;
    int64_t batch = 512, v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "-m") || cli_opt_is(a, "--model")) {
            CLI_VAL();
            lo.model_path = val;
        } else if (!strcmp(a, "-p") || cli_opt_is(a, "--prompt")) {
            CLI_VAL();
            prompt = val;
        } else if (cli_opt_is(a, "--prompt-ids")) {
            CLI_VAL();
            prompt_ids = val;
        } else if (!strcmp(a, "-o") || cli_opt_is(a, "--out")) {
            CLI_VAL();
            out_path = val;
        } else if (!strcmp(a, "-t") || cli_opt_is(a, "--threads")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 1, 1024, &v)) return CLI_EXIT_USAGE;
            lo.n_threads = (int)v;
        } else if (!strcmp(a, "-c") || cli_opt_is(a, "--ctx")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 2, 1 << 20, &v)) return CLI_EXIT_USAGE;
            lo.n_ctx = (int32_t)v;
        } else if (cli_opt_is(a, "--batch")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 1, 1 << 16, &batch)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--kv-type")) {
            CLI_VAL();
            if (!cli_parse_kv_type(a, val, &lo.kv_type)) return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--scalar")) lo.kernels = MM_IMPL_SCALAR;
        else if (cli_opt_is(a, "--kernels")) {
            CLI_VAL();
            if (!cli_parse_kernels(a, val, &lo.kernels)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--activations")) {
            CLI_VAL();
            if (!cli_parse_activations(a, val, &lo.act16)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--device")) {
            CLI_VAL();
            lo.device = val;
        } else {
            fprintf(stderr, "kvbatch logits: unknown option '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
    }
    if (!prompt == !prompt_ids || !out_path) {
        fprintf(stderr, "kvbatch logits: one of --prompt and --prompt-ids, and --out, are required (see --help)\n");
        return CLI_EXIT_USAGE;
    }
    int rc = CLI_EXIT_FAIL;
    struct cli_llm llm;
    struct gen_ctx *g = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    float *all = NULL;
    FILE *f = NULL;
    struct kvb_err err = {{0}};
    if (!cli_llm_open(&lo, &llm)) goto done;
    if (prompt_ids) {
        int prc = cli_llm_prompt_ids(&llm, "logits", prompt_ids, &ids, &n);
        if (prc != CLI_EXIT_OK) {
            rc = prc;
            goto done;
        }
    } else if (!cli_llm_prompt(&llm, prompt, false, NULL, NULL, &ids, &n)) {
        goto done;
    }
    if (n == 0 || (int64_t)n > llm.n_ctx) {
        fprintf(stderr, "kvbatch logits: the prompt has %zu tokens (must be 1..%d)\n", n, llm.n_ctx);
        goto done;
    }
    const size_t nv = (size_t)llm.model->hp.n_vocab;
    all = kvb_malloc(sizeof(float) * nv * n);
    if (!all || gen_create(llm.model, llm.be, llm.n_ctx, (int32_t)batch, &g, &err) != KVB_OK ||
        gen_feed(g, ids, (int32_t)n, all, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch logits: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    f = fopen(out_path, "wb");
    bool wrote = f && fwrite(all, sizeof(float), nv * n, f) == nv * n;
    if (f && fclose(f) != 0) wrote = false;
    f = NULL;
    if (!wrote) {
        perror(out_path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    rc = CLI_EXIT_OK;
done:
    if (f) fclose(f);
    kvb_free(all);
    kvb_free(ids);
    gen_free(g);
    cli_llm_close(&llm);
    return rc;
}
