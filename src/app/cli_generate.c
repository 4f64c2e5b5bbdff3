/* cli_generate.c — `kvbatch generate`: one prompt, streamed completion on
 * stdout, prefill and decode speed on stderr. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "app/cli_llm.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "engine/gen.h"
#include "engine/grammar.h"
#include "engine/grammar_schema.h"
#include "engine/sampler.h"
#include "text/tok.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch generate [options] --prompt TEXT\n"
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
               "      --chat-template NAME|FILE  as for run (default: the model's tokenizer.chat_template)\n"
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
               "      --grammar FILE      the output is a sentence of FILE's GBNF grammar (llama.cpp's format)\n"
               "  -t, --threads N         worker threads (default: all cores)\n"
               "  -c, --ctx N             context length (default: min(model's, 4096))\n"
               "      --batch N           most prompt tokens per forward pass (default 512)\n"
               "      --print-ids         print generated token ids instead of text\n"
               "      --device DEV        auto | cpu | cuda | cuda:N (default auto: a CUDA device when usable)\n"
               "      --kv-type T         KV cache rows: f16 | q8 | q4 (default f16; q4: 4-bit V, 8-bit K)\n"
               "      --kernels K         CPU kernels: auto | amx | avx512 | avx2 | scalar (default auto: the\n"
               "                          best this CPU runs; KVBATCH_KERNELS overrides auto)\n"
               "      --scalar            the same as --kernels scalar (the slow reference)\n"
               "      --activations N     8 | 16: bits the CPU keeps of each activation in products with\n"
               "                          quantized weights (default 8; 16: near float, about twice the\n"
               "                          prefill time; see run --help)\n"
               "  -q, --quiet             no speed report on stderr\n"
               "  -h, --help              this text\n");
}

/* What the command line asks for. */
struct gen_args {
    char model_path[PATH_MAX];
    struct cli_llm_opts lo;
    const char *prompt, *prompt_file, *prompt_ids, *system, *tmpl, *grammar_file;
    bool chat, ignore_eos, print_ids, quiet, json;
    int64_t n_predict, batch;
    struct sampler_params sp;
};

/* --json and --grammar: one of them, never with --ignore-eos. */
static bool constraint_args_ok(const struct gen_args *ga)
{
    if ((ga->json || ga->grammar_file) && ga->ignore_eos) {
        fprintf(stderr, "kvbatch generate: --%s ends where its grammar does; it cannot go with --ignore-eos\n",
                ga->json ? "json" : "grammar");
        return false;
    }
    if (ga->json && ga->grammar_file) {
        fprintf(stderr, "kvbatch generate: --json and --grammar both constrain the output; give one\n");
        return false;
    }
    return true;
}

/* -1 when the command should run, else the exit status (--help, bad usage). */
static int parse_args(int argc, char **argv, struct gen_args *ga)
{
    cli_default_model(ga->model_path, sizeof ga->model_path);
    ga->lo = (struct cli_llm_opts){.model_path = ga->model_path};
    ga->n_predict = 128;
    ga->batch = 512;
    struct sampler_params *sp = &ga->sp;
    sampler_params_default(sp);
    sp->temperature = 0.8f;
    sp->top_k = 40;
    sp->top_p = 0.95f;
    sp->min_p = 0.05f;
    int64_t v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "-m") || cli_opt_is(a, "--model")) {
            CLI_VAL();
            ga->lo.model_path = val;
        } else if (!strcmp(a, "-p") || cli_opt_is(a, "--prompt")) {
            CLI_VAL();
            ga->prompt = val;
        } else if (!strcmp(a, "-f") || cli_opt_is(a, "--file")) {
            CLI_VAL();
            ga->prompt_file = val;
        } else if (cli_opt_is(a, "--prompt-ids")) {
            CLI_VAL();
            ga->prompt_ids = val;
        } else if (!strcmp(a, "--chat")) ga->chat = true;
        else if (cli_opt_is(a, "--system")) {
            CLI_VAL();
            ga->system = val;
        } else if (cli_opt_is(a, "--chat-template")) {
            CLI_VAL();
            ga->tmpl = val;
            ga->chat = true;
        } else if (!strcmp(a, "-n") || cli_opt_is(a, "--max-tokens")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 0, 1 << 24, &ga->n_predict)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--temperature")) {
            CLI_VAL();
            if (!cli_parse_f32(a, val, 0, 100, &sp->temperature)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--top-k")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 0, INT32_MAX, &v)) return CLI_EXIT_USAGE;
            sp->top_k = (int32_t)v;
        } else if (cli_opt_is(a, "--top-p")) {
            CLI_VAL();
            if (!cli_parse_f32(a, val, 1e-6f, 1, &sp->top_p)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--min-p")) {
            CLI_VAL();
            if (!cli_parse_f32(a, val, 0, 1, &sp->min_p)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--repeat-penalty")) {
            CLI_VAL();
            if (!cli_parse_f32(a, val, 0.01f, 100, &sp->repetition_penalty)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--presence-penalty")) {
            CLI_VAL();
            if (!cli_parse_f32(a, val, -2, 2, &sp->presence_penalty)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--frequency-penalty")) {
            CLI_VAL();
            if (!cli_parse_f32(a, val, -2, 2, &sp->frequency_penalty)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--seed")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 0, INT64_MAX, &v)) return CLI_EXIT_USAGE;
            sp->seed = (uint64_t)v;
        } else if (!strcmp(a, "--ignore-eos")) ga->ignore_eos = true;
        else if (!strcmp(a, "--json")) ga->json = true;
        else if (cli_opt_is(a, "--grammar")) {
            CLI_VAL();
            ga->grammar_file = val;
        } else if (!strcmp(a, "-t") || cli_opt_is(a, "--threads")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 1, 1024, &v)) return CLI_EXIT_USAGE;
            ga->lo.n_threads = (int)v;
        } else if (!strcmp(a, "-c") || cli_opt_is(a, "--ctx")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 16, 1 << 20, &v)) return CLI_EXIT_USAGE;
            ga->lo.n_ctx = (int32_t)v;
        } else if (cli_opt_is(a, "--batch")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 1, 1 << 16, &ga->batch)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--kv-type")) {
            CLI_VAL();
            if (!cli_parse_kv_type(a, val, &ga->lo.kv_type)) return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--print-ids")) ga->print_ids = true;
        else if (!strcmp(a, "--scalar")) ga->lo.kernels = MM_IMPL_SCALAR;
        else if (cli_opt_is(a, "--kernels")) {
            CLI_VAL();
            if (!cli_parse_kernels(a, val, &ga->lo.kernels)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--activations")) {
            CLI_VAL();
            if (!cli_parse_activations(a, val, &ga->lo.act16)) return CLI_EXIT_USAGE;
        } else if (cli_opt_is(a, "--device")) {
            CLI_VAL();
            ga->lo.device = val;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) ga->quiet = true;
        else {
            fprintf(stderr, "kvbatch generate: unknown option '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
    }
    return constraint_args_ok(ga) ? -1 : CLI_EXIT_USAGE;
}

/* --json or --grammar FILE compiled, with the tokenizer's vocabulary;
 * false after saying why. */
static bool load_grammar(const struct gen_args *ga, const struct tok *tok, struct grammar **g,
                         struct grammar_vocab **gv)
{
    struct kvb_buf text = {0};
    char msg[320] = "", path[8];
    enum kvb_status st = KVB_OK;
    if (ga->json) {
        st = gschema_to_gbnf(NULL, 0, "--json", &text, path, sizeof path, msg, sizeof msg);
    } else {
        text.data = cli_read_file(ga->grammar_file, &text.len);
        if (!text.data) {
            fprintf(stderr, "kvbatch generate: --grammar: cannot read '%s'\n", ga->grammar_file);
            return false;
        }
    }
    if (st == KVB_OK) st = grammar_compile(text.data, text.len, g, msg, sizeof msg);
    if (ga->json) kvb_buf_free(&text);
    else free(text.data);
    struct kvb_err err = {{0}};
    if (st == KVB_OK) st = grammar_vocab_create(tok, gv, &err);
    else snprintf(err.msg, sizeof err.msg, "%s", msg);
    if (st != KVB_OK) fprintf(stderr, "kvbatch generate: --%s: %s\n", ga->json ? "json" : "grammar", err.msg);
    return st == KVB_OK;
}

/* One generation in progress: what the decode loop reads and writes. */
struct gen_run {
    const struct gen_args *ga;
    struct cli_llm *llm;
    struct gen_ctx *g;
    struct sampler *smp;
    float *logits;    /* (n_vocab) */
    int32_t *out_ids; /* (n_predict + 1) */
    int64_t n_predict, n_gen;
    struct tok_stream ts;
    char *text;
    size_t text_len, text_cap;
};

/* Samples and feeds tokens until n_predict, an end of generation or a
 * failure (said on stderr: false). The text goes to stdout as it comes. */
static bool decode(struct gen_run *gr)
{
    const struct gen_args *ga = gr->ga;
    struct cli_llm *llm = gr->llm;
    const int32_t nv = llm->model->hp.n_vocab;
    struct kvb_err err = {{0}};
    while (gr->n_gen < gr->n_predict) {
        memcpy(gr->logits, gen_logits(gr->g), sizeof(float) * (size_t)nv);
        const int32_t bad = sampler_first_nonfinite(gr->logits, nv);
        if (bad >= 0) {
            fprintf(stderr,
                    "\nkvbatch generate: the model's logits are not finite (%s at token id %d of %d) after "
                    "%lld generated tokens: the model's weights or the backend are broken\n",
                    isnan(gr->logits[bad]) ? "NaN"
                    : gr->logits[bad] > 0  ? "+inf"
                                           : "-inf",
                    bad, nv, (long long)gr->n_gen);
            return false;
        }
        int32_t next;
        enum kvb_status sst = sampler_sample(gr->smp, gr->logits, &next);
        if (sst != KVB_OK) {
            fprintf(stderr, "\nkvbatch generate: sampling failed after %lld tokens: %s\n", (long long)gr->n_gen,
                    kvb_strerror(sst));
            return false;
        }
        sampler_accept(gr->smp, next);
        gr->out_ids[gr->n_gen++] = next;
        if (!ga->ignore_eos && tok_is_eog(llm->tok, next)) break;
        if (!ga->print_ids) {
            size_t before = gr->text_len;
            if (tok_stream_push(llm->tok, &gr->ts, next, &gr->text, &gr->text_len, &gr->text_cap) != KVB_OK) {
                fprintf(stderr, "\nkvbatch generate: out of memory decoding the output\n");
                return false;
            }
            fwrite(gr->text + before, 1, gr->text_len - before, stdout);
            fflush(stdout);
        }
        if (gr->n_gen == gr->n_predict) break;
        if (gen_feed(gr->g, &next, 1, NULL, &err) != KVB_OK) {
            fprintf(stderr, "\nkvbatch generate: decode failed: %s\n", err.msg);
            return false;
        }
    }
    return true;
}

/* The rest of the output (ids, or text held back), then the speeds. */
static void finish_output(struct gen_run *gr, size_t n_ids, double t0, double t1, double t2)
{
    const struct gen_args *ga = gr->ga;
    if (ga->print_ids) {
        for (int64_t i = 0; i < gr->n_gen; i++) printf(i ? " %d" : "%d", gr->out_ids[i]);
        printf("\n");
    } else {
        size_t before = gr->text_len;
        if (tok_stream_flush(gr->llm->tok, &gr->ts, &gr->text, &gr->text_len, &gr->text_cap) == KVB_OK)
            fwrite(gr->text + before, 1, gr->text_len - before, stdout);
        printf("\n");
    }
    fflush(stdout);
    if (ga->quiet) return;
    /* Decode speed counts the forward passes after the first sampled token. */
    int64_t n_dec = gr->n_gen > 1 ? gr->n_gen - 1 : 0;
    fprintf(stderr, "kvbatch: %s on %s, %s kernels, %s activations, %d threads\n", gr->llm->model->name,
            gr->llm->be->name, be_kernels_name(gr->llm->be), be_acts_name(gr->llm->be), be_threads(gr->llm->be));
    fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s)\n", n_ids, t1 - t0, (double)n_ids / (t1 - t0));
    fprintf(stderr, "decode:  %lld tokens in %.3f s (%.1f tok/s)\n", (long long)n_dec, t2 - t1,
            n_dec > 0 ? (double)n_dec / (t2 - t1) : 0.0);
}

int cli_generate(int argc, char **argv)
{
    struct gen_args ga = {0};
    int prc = parse_args(argc, argv, &ga);
    if (prc >= 0) return prc;
    const char *prompt = ga.prompt;
    char *owned_prompt = NULL;
    if (!ga.prompt_ids) {
        if (ga.prompt_file) {
            owned_prompt = cli_read_file(ga.prompt_file, NULL);
            if (!owned_prompt) {
                perror(ga.prompt_file);
                return CLI_EXIT_FAIL;
            }
            prompt = owned_prompt;
        } else if (!prompt || !strcmp(prompt, "-")) {
            owned_prompt = cli_read_stream(stdin, NULL);
            if (!owned_prompt) {
                fprintf(stderr, "kvbatch generate: cannot read standard input\n");
                return CLI_EXIT_FAIL;
            }
            prompt = owned_prompt;
        }
    }

    int rc = CLI_EXIT_FAIL;
    struct cli_llm llm;
    struct gen_run gr = {.ga = &ga, .llm = &llm, .n_predict = ga.n_predict};
    struct grammar_vocab *gv = NULL;
    struct grammar *gram = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    struct kvb_err err = {{0}};
    if (!cli_llm_open(&ga.lo, &llm)) goto done;
    if (ga.prompt_ids) {
        prc = cli_llm_prompt_ids(&llm, "generate", ga.prompt_ids, &ids, &n_ids);
        if (prc != CLI_EXIT_OK) {
            rc = prc;
            goto done;
        }
    } else if (!cli_llm_prompt(&llm, prompt, ga.chat, ga.system, ga.tmpl, &ids, &n_ids)) {
        goto done;
    }
    if (n_ids == 0) {
        fprintf(stderr, "kvbatch generate: the prompt is empty\n");
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    if ((int64_t)n_ids + gr.n_predict > llm.n_ctx) {
        int64_t room = llm.n_ctx - (int64_t)n_ids;
        if (room <= 0) {
            fprintf(stderr, "kvbatch generate: the prompt has %zu tokens; the context holds %d (raise --ctx)\n", n_ids,
                    llm.n_ctx);
            goto done;
        }
        gr.n_predict = room;
    }
    if ((ga.json || ga.grammar_file) && !load_grammar(&ga, llm.tok, &gram, &gv)) goto done;
    ga.sp.grammar = gram;
    ga.sp.gvocab = gv;
    if (gen_create(llm.model, llm.be, llm.n_ctx, (int32_t)ga.batch, &gr.g, &err) != KVB_OK ||
        sampler_create(&ga.sp, llm.model->hp.n_vocab, &gr.smp) != KVB_OK) {
        fprintf(stderr, "kvbatch generate: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    gr.logits = kvb_malloc(sizeof(float) * (size_t)llm.model->hp.n_vocab);
    gr.out_ids = kvb_malloc(sizeof(int32_t) * (size_t)(gr.n_predict + 1));
    if (!gr.logits || !gr.out_ids) {
        fprintf(stderr, "kvbatch generate: out of memory\n");
        goto done;
    }

    double t0 = cli_now();
    if (gen_feed(gr.g, ids, (int32_t)n_ids, NULL, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch generate: prefill failed: %s\n", err.msg);
        goto done;
    }
    double t1 = cli_now();
    tok_stream_init(&gr.ts, llm.tok);
    gr.ts.at_start = false; /* a continuation keeps its leading space (SentencePiece) */
    bool ok = decode(&gr);
    double t2 = cli_now();
    finish_output(&gr, n_ids, t0, t1, t2);
    rc = ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
done:
    kvb_free(gr.logits);
    kvb_free(gr.text);
    kvb_free(gr.out_ids);
    kvb_free(ids);
    sampler_free(gr.smp);
    grammar_vocab_free(gv); /* after the sampler that borrows them */
    grammar_free(gram);
    gen_free(gr.g);
    cli_llm_close(&llm);
    free(owned_prompt);
    return rc;
}
