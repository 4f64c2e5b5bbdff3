/* cli_generate.c — `kvbatch generate`: one prompt, streamed completion on
 * stdout, prefill and decode speed on stderr. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cli.h"
#include "cli_llm.h"
#include "cli_util.h"
#include "gen.h"
#include "jsonmode.h"
#include "sampler.h"
#include "tok.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvbatch generate [options] --prompt TEXT\n"
        "\n"
        "Generates a completion of one prompt with the CPU backend and prints it on\n"
        "stdout as it is produced; prefill and decode speed go to stderr.\n"
        "\n"
        "  -m, --model PATH        GGUF model (default: $KVBATCH_MODEL or\n"
        "                          models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
        "  -p, --prompt TEXT       the prompt; '-' or absent reads standard input\n"
        "  -f, --file PATH         read the prompt from a file\n"
        "      --prompt-ids LIST   the prompt as token ids (\"1 2 3\"), no template, no BOS\n"
        "      --chat              wrap the prompt as a user turn in the model's chat template\n"
        "      --system TEXT       system message for --chat (default: the template's own)\n"
        "      --chat-template NAME  chatml | llama3 | llama31 | llama2 | mistral | mistral-v3 |\n"
        "                          mistral-tekken | zephyr | gemma (default: detected)\n"
        "  -n, --max-tokens N      tokens to generate at most (default 128)\n"
        "      --temperature T     0 = greedy (default 0.8)\n"
        "      --top-k K           keep the K most likely tokens, 0 = off (default 40)\n"
        "      --top-p P           nucleus sampling, 1 = off (default 0.95)\n"
        "      --min-p P           drop tokens below P x the top probability, 0 = off (default 0.05)\n"
        "      --repeat-penalty R  repetition penalty, 1 = off (default 1)\n"
        "      --presence-penalty X, --frequency-penalty X  OpenAI-style penalties (default 0)\n"
        "      --seed S            sampling seed; the same seed gives the same text (default 0)\n"
        "      --ignore-eos        keep generating past end-of-generation tokens\n"
        "      --json              the output is one JSON object (as response_format json_object)\n"
        "  -t, --threads N         worker threads (default: all cores)\n"
        "  -c, --ctx N             context length (default: min(model's, 4096))\n"
        "      --batch N           most prompt tokens per forward pass (default 512)\n"
        "      --print-ids         print generated token ids instead of text\n"
        "      --device DEV        auto | cpu | cuda | cuda:N (default auto: a CUDA device when usable)\n"
        "      --scalar            use the plain C reference kernels (slow; for checking)\n"
        "  -q, --quiet             no speed report on stderr\n"
        "  -h, --help              this text\n");
}

int cli_generate(int argc, char **argv)
{
    char model_path[PATH_MAX];
    cli_default_model(model_path, sizeof model_path);
    struct cli_llm_opts lo = {.model_path = model_path};
    const char *prompt = NULL, *prompt_file = NULL, *prompt_ids = NULL, *system = NULL, *tmpl = NULL;
    bool chat = false, ignore_eos = false, print_ids = false, quiet = false, json = false;
    int64_t n_predict = 128, batch = 512, v;
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
#define VAL() do { if (!(val = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_EXIT_OK; }
        else if (!strcmp(a, "-m") || cli_opt_is(a, "--model")) { VAL(); lo.model_path = val; }
        else if (!strcmp(a, "-p") || cli_opt_is(a, "--prompt")) { VAL(); prompt = val; }
        else if (!strcmp(a, "-f") || cli_opt_is(a, "--file")) { VAL(); prompt_file = val; }
        else if (cli_opt_is(a, "--prompt-ids")) { VAL(); prompt_ids = val; }
        else if (!strcmp(a, "--chat")) chat = true;
        else if (cli_opt_is(a, "--system")) { VAL(); system = val; }
        else if (cli_opt_is(a, "--chat-template")) { VAL(); tmpl = val; chat = true; }
        else if (!strcmp(a, "-n") || cli_opt_is(a, "--max-tokens")) { VAL(); if (!cli_parse_i64(a, val, 0, 1 << 24, &n_predict)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--temperature")) { VAL(); if (!cli_parse_f32(a, val, 0, 100, &sp.temperature)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--top-k")) { VAL(); if (!cli_parse_i64(a, val, 0, INT32_MAX, &v)) return CLI_EXIT_USAGE; sp.top_k = (int32_t)v; }
        else if (cli_opt_is(a, "--top-p")) { VAL(); if (!cli_parse_f32(a, val, 1e-6f, 1, &sp.top_p)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--min-p")) { VAL(); if (!cli_parse_f32(a, val, 0, 1, &sp.min_p)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--repeat-penalty")) { VAL(); if (!cli_parse_f32(a, val, 0.01f, 100, &sp.repetition_penalty)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--presence-penalty")) { VAL(); if (!cli_parse_f32(a, val, -2, 2, &sp.presence_penalty)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--frequency-penalty")) { VAL(); if (!cli_parse_f32(a, val, -2, 2, &sp.frequency_penalty)) return CLI_EXIT_USAGE; }
        else if (cli_opt_is(a, "--seed")) { VAL(); if (!cli_parse_i64(a, val, 0, INT64_MAX, &v)) return CLI_EXIT_USAGE; sp.seed = (uint64_t)v; }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "-t") || cli_opt_is(a, "--threads")) { VAL(); if (!cli_parse_i64(a, val, 1, 1024, &v)) return CLI_EXIT_USAGE; lo.n_threads = (int)v; }
        else if (!strcmp(a, "-c") || cli_opt_is(a, "--ctx")) { VAL(); if (!cli_parse_i64(a, val, 16, 1 << 20, &v)) return CLI_EXIT_USAGE; lo.n_ctx = (int32_t)v; }
        else if (cli_opt_is(a, "--batch")) { VAL(); if (!cli_parse_i64(a, val, 1, 1 << 16, &batch)) return CLI_EXIT_USAGE; }
        else if (!strcmp(a, "--print-ids")) print_ids = true;
        else if (!strcmp(a, "--scalar")) lo.scalar = true;
        else if (cli_opt_is(a, "--device")) { VAL(); lo.device = val; }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = true;
        else { fprintf(stderr, "kvbatch generate: unknown option '%s' (see --help)\n", a); return CLI_EXIT_USAGE; }
#undef VAL
    }
    if (json && ignore_eos) {
        fprintf(stderr, "kvbatch generate: --json ends at the object's end; it cannot go with --ignore-eos\n");
        return CLI_EXIT_USAGE;
    }

    char *owned_prompt = NULL;
    if (!prompt_ids) {
        if (prompt_file) {
            owned_prompt = cli_read_file(prompt_file, NULL);
            if (!owned_prompt) { perror(prompt_file); return CLI_EXIT_FAIL; }
            prompt = owned_prompt;
        } else if (!prompt || !strcmp(prompt, "-")) {
            owned_prompt = cli_read_stream(stdin, NULL);
            if (!owned_prompt) { fprintf(stderr, "kvbatch generate: cannot read standard input\n"); return CLI_EXIT_FAIL; }
            prompt = owned_prompt;
        }
    }

    int rc = CLI_EXIT_FAIL;
    struct cli_llm llm;
    struct gen_ctx *g = NULL;
    struct sampler *smp = NULL;
    struct jsonmode_vocab *jv = NULL;
    int32_t *ids = NULL, *out_ids = NULL;
    size_t n_ids = 0;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    struct kvb_err err = {{0}};
    if (!cli_llm_open(&lo, &llm)) goto done;
    if (prompt_ids) {
        int prc = cli_llm_prompt_ids(&llm, "generate", prompt_ids, &ids, &n_ids);
        if (prc != CLI_EXIT_OK) {
            rc = prc;
            goto done;
        }
    } else if (!cli_llm_prompt(&llm, prompt, chat, system, tmpl, &ids, &n_ids)) {
        goto done;
    }
    if (n_ids == 0) {
        fprintf(stderr, "kvbatch generate: the prompt is empty\n");
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    if ((int64_t)n_ids + n_predict > llm.n_ctx) {
        int64_t room = llm.n_ctx - (int64_t)n_ids;
        if (room <= 0) {
            fprintf(stderr, "kvbatch generate: the prompt has %zu tokens; the context holds %d (raise --ctx)\n", n_ids, llm.n_ctx);
            goto done;
        }
        n_predict = room;
    }
    if (json && jsonmode_vocab_create(llm.tok, &jv, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch generate: --json: %s\n", err.msg);
        goto done;
    }
    sp.json = jv;
    if (gen_create(llm.model, llm.be, llm.n_ctx, (int32_t)batch, &g, &err) != KVB_OK ||
        sampler_create(&sp, llm.model->hp.n_vocab, &smp) != KVB_OK) {
        fprintf(stderr, "kvbatch generate: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    float *logits = kvb_malloc(sizeof(float) * (size_t)llm.model->hp.n_vocab);
    out_ids = kvb_malloc(sizeof(int32_t) * (size_t)(n_predict + 1));
    if (!logits || !out_ids) {
        fprintf(stderr, "kvbatch generate: out of memory\n");
        kvb_free(logits);
        goto done;
    }

    double t0 = cli_now();
    if (gen_feed(g, ids, (int32_t)n_ids, NULL, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch generate: prefill failed: %s\n", err.msg);
        kvb_free(logits);
        goto done;
    }
    double t1 = cli_now();
    struct tok_stream ts;
    tok_stream_init(&ts, llm.tok);
    ts.at_start = false; /* a continuation keeps its leading space (SentencePiece) */
    int64_t n_gen = 0;
    bool failed = false;
    while (n_gen < n_predict) {
        const int32_t nv = llm.model->hp.n_vocab;
        memcpy(logits, gen_logits(g), sizeof(float) * (size_t)nv);
        const int32_t bad = sampler_first_nonfinite(logits, nv);
        if (bad >= 0) {
            fprintf(stderr, "\nkvbatch generate: the model's logits are not finite (%s at token id %d of %d) after "
                    "%lld generated tokens: the model's weights or the backend are broken\n",
                    isnan(logits[bad]) ? "NaN" : logits[bad] > 0 ? "+inf" : "-inf", bad, nv, (long long)n_gen);
            failed = true;
            break;
        }
        int32_t next;
        enum kvb_status sst = sampler_sample(smp, logits, &next);
        if (sst != KVB_OK) {
            fprintf(stderr, "\nkvbatch generate: sampling failed after %lld tokens: %s\n", (long long)n_gen,
                    kvb_strerror(sst));
            failed = true;
            break;
        }
        sampler_accept(smp, next);
        out_ids[n_gen++] = next;
        if (!ignore_eos && tok_is_eog(llm.tok, next)) break;
        if (!print_ids) {
            size_t before = text_len;
            if (tok_stream_push(llm.tok, &ts, next, &text, &text_len, &text_cap) != KVB_OK) {
                fprintf(stderr, "\nkvbatch generate: out of memory decoding the output\n");
                failed = true;
                break;
            }
            fwrite(text + before, 1, text_len - before, stdout);
            fflush(stdout);
        }
        if (n_gen == n_predict) break;
        if (gen_feed(g, &next, 1, NULL, &err) != KVB_OK) {
            fprintf(stderr, "\nkvbatch generate: decode failed: %s\n", err.msg);
            failed = true;
            break;
        }
    }
    double t2 = cli_now();
    kvb_free(logits);
    if (print_ids) {
        for (int64_t i = 0; i < n_gen; i++) printf(i ? " %d" : "%d", out_ids[i]);
        printf("\n");
    } else {
        size_t before = text_len;
        if (tok_stream_flush(llm.tok, &ts, &text, &text_len, &text_cap) == KVB_OK)
            fwrite(text + before, 1, text_len - before, stdout);
        printf("\n");
    }
    fflush(stdout);
    if (!quiet) {
        /* Decode speed counts the forward passes after the first sampled token. */
        int64_t n_dec = n_gen > 1 ? n_gen - 1 : 0;
        fprintf(stderr, "kvbatch: %s on %s, %s kernels, %d threads\n", llm.model->name, llm.be->name,
                be_kernels_name(llm.be), be_threads(llm.be));
        fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s)\n", n_ids, t1 - t0, (double)n_ids / (t1 - t0));
        fprintf(stderr, "decode:  %lld tokens in %.3f s (%.1f tok/s)\n", (long long)n_dec, t2 - t1,
                n_dec > 0 ? (double)n_dec / (t2 - t1) : 0.0);
    }
    rc = failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
done:
    kvb_free(text);
    kvb_free(out_ids);
    kvb_free(ids);
    sampler_free(smp);
    jsonmode_vocab_free(jv); /* after the sampler that borrows it */
    gen_free(g);
    cli_llm_close(&llm);
    free(owned_prompt);
    return rc;
}
