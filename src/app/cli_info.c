/* cli_info.c — `kvbatch info MODEL`: what a GGUF file is, as kvbatch reads
 * it: the architecture and what its layer computes (norm placement,
 * activation, scales, soft-caps, sliding-window pattern), sizes, the weight
 * types, context and RoPE, the tokenizer and the chat template run would
 * use. For a file kvbatch refuses, every reason (model_survey), not only
 * the first one a load stops at. Reads metadata and maps the weights; runs
 * nothing. */
#include <stdio.h>
#include <string.h>

#include "app/admit.h"
#include "app/cli.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "model/arch.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/tok.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch info [options] [MODEL]\n"
               "\n"
               "Says what a GGUF model file is, as kvbatch reads it: architecture and what its\n"
               "layer computes (norms, activation, scales, soft-caps, which layers attend\n"
               "through a sliding window), sizes, weight types, context, RoPE, tokenizer and\n"
               "the chat template `kvbatch run` would use. For a file kvbatch cannot run, it\n"
               "lists every reason (each key, tensor and weight type it does not compute).\n"
               "\n"
               "  -m, --model PATH   the file (or give it as the argument; default: $KVBATCH_MODEL,\n"
               "                     else models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
               "      --chat-template NAME  report this template instead of the detected one\n"
               "  -h, --help         this text\n"
               "\n"
               "Exit status: 0 kvbatch runs the file, 1 it refuses it (the reasons are printed)\n"
               "or cannot read it, 2 bad usage.\n");
}

static void print_reason(void *arg, const char *why)
{
    int *n = arg;
    printf("  %d. %s\n", ++*n, why);
}

static const char *yes(bool b) { return b ? "yes" : "no"; }

static void print_types(const struct model *m)
{
    struct type_use {
        enum ggml_type t;
        uint64_t n, bytes;
    } mix[64];
    int n_mix = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        int k = 0;
        while (k < n_mix && mix[k].t != t->type) k++;
        if (k == n_mix) {
            if (n_mix == 64) continue;
            mix[n_mix++] = (struct type_use){t->type, 0, 0};
        }
        mix[k].n++;
        mix[k].bytes += t->n_bytes;
    }
    printf("weights:       %.1f MiB in %llu tensors:", (double)m->weight_bytes / (1024.0 * 1024.0),
           (unsigned long long)gguf_n_tensors(m->gguf));
    for (int k = 0; k < n_mix; k++) {
        const struct ggml_type_traits *tr = ggml_type_get_traits(mix[k].t);
        printf("%s %s x%llu (%.1f MiB)", k ? "," : "", tr ? tr->name : "?", (unsigned long long)mix[k].n,
               (double)mix[k].bytes / (1024.0 * 1024.0));
    }
    printf("\n");
}

static void print_window(const struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    int32_t n_swa = 0;
    for (int l = 0; l < hp->n_layer; l++) n_swa += m->layers[l].swa;
    if (m->ops.n_swa <= 0 || n_swa == 0) {
        printf("attention:     every layer global (no sliding window)\n");
        return;
    }
    printf("attention:     sliding window of %d positions on %d of %d layers; global layers:", m->ops.n_swa, n_swa,
           hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++)
        if (!m->layers[l].swa) printf(" %d", l);
    if (n_swa == hp->n_layer) printf(" none");
    printf("\n               windowed layers' RoPE base %g, unscaled\n", (double)m->ops.rope_base_swa);
}

static void print_rope(const struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    const struct model_rope *r = &m->rope;
    printf("RoPE:          %s pairs, %d of %d head dims, base %g",
           hp->rope == ROPE_NEOX ? "NeoX (rotate-half)" : "adjacent", hp->rope_dim, hp->head_dim,
           (double)hp->rope_base);
    if (r->type == ROPE_SCALING_LINEAR) printf(", linear scaling x%g", (double)r->factor);
    if (r->type == ROPE_SCALING_YARN)
        printf(", yarn x%g over %d (betas %g/%g)", (double)r->factor, r->orig_ctx, (double)r->beta_fast,
               (double)r->beta_slow);
    if (r->freq_factors) printf(", per-frequency factors (rope_freqs)");
    if (r->mscale != 1.0f) printf(", attention factor %g", (double)r->mscale);
    printf("\n");
}

static void print_layer(const struct model *m)
{
    const struct model_layer *L = &m->layers[0];
    const struct model_ops *o = &m->ops;
    printf("layer:         RMSNorm (eps %g) before attention and FFN%s; %s FFN; Q/K/V biases %s; "
           "per-head Q/K norms %s\n",
           (double)m->hp.rms_eps, L->post_attn_norm ? ", and after each (post-norms)" : "",
           o->act == MODEL_ACT_GELU_TANH ? "GeGLU (tanh GELU)" : "SwiGLU", yes(L->bq != NULL), yes(L->q_norm != NULL));
    printf("scales:        embeddings x%g; scores x%g", (double)o->embd_scale, (double)o->attn_scale);
    if (o->attn_softcap > 0) printf(", soft-capped at %g", (double)o->attn_softcap);
    if (o->final_softcap > 0) printf("; logits soft-capped at %g", (double)o->final_softcap);
    printf("; output head %s\n", m->tied_output ? "tied to the embeddings" : "its own");
}

static void print_text(const struct model *m, const char *template_name)
{
    struct tok *t = NULL;
    struct kvb_err err = {{0}};
    struct gguf_str tm = {0, ""};
    gguf_get_str(m->gguf, "tokenizer.ggml.model", &tm, NULL);
    if (tok_load(m->gguf, &t, &err) != KVB_OK) {
        printf("tokenizer:     '%.*s', refused: %s\n", (int)tm.len, tm.ptr, err.msg);
    } else {
        printf("tokenizer:     '%.*s', %d tokens, BOS %d (%s), EOS %d\n", (int)tm.len, tm.ptr, tok_n_vocab(t),
               tok_bos(t), tok_wants_bos(t) ? "added" : "not added", tok_eos(t));
    }
    struct chat_template tmpl;
    bool have = false;
    char why[256];
    /* a template's special tokens are read through the tokenizer (none when it was refused) */
    enum kvb_status st = admit_template_choose(m, t, template_name, &tmpl, &have, why, sizeof why, &err);
    tok_free(t);
    if (st != KVB_OK) {
        printf("chat template: %s\n", err.msg);
        return;
    }
    if (have) {
        printf("chat template: %s (%s)\n", chat_template_name(&tmpl),
               template_name ? "named on the command line" : "detected from tokenizer.chat_template");
        chat_template_free(&tmpl);
    } else {
        printf("chat template: none: %s; completion requests run\n", why);
    }
}

int cli_info(int argc, char **argv)
{
    const char *path = NULL, *template_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (cli_opt_is(a, "-m") || cli_opt_is(a, "--model")) {
            CLI_VAL();
            path = val;
        } else if (cli_opt_is(a, "--chat-template")) {
            CLI_VAL();
            template_name = val;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "kvbatch info: unknown option '%s'\n", a);
            usage(stderr);
            return CLI_EXIT_USAGE;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "kvbatch info: one model at a time ('%s' and '%s')\n", path, a);
            return CLI_EXIT_USAGE;
        }
    }
    char def[4096];
    if (!path) {
        cli_default_model(def, sizeof def);
        path = def;
    }
    struct kvb_err err = {{0}};
    struct model *m = NULL;
    printf("file:          %s\n", path);
    if (model_load(path, &m, &err) != KVB_OK) {
        struct kvb_err e2 = {{0}};
        int n = 0;
        printf("kvbatch refuses this file:\n");
        if (model_survey(path, print_reason, &n, &e2) < 0) {
            printf("  1. %s\n", e2.msg);
            return CLI_EXIT_FAIL;
        }
        if (n == 0) printf("  1. %s\n", err.msg); /* something the survey does not repeat (memory) */
        printf("(kvbatch runs %s)\n", arch_names());
        return CLI_EXIT_FAIL;
    }
    const struct model_hparams *hp = &m->hp;
    printf("name:          %s\n", m->name);
    printf("architecture:  %s\n", m->arch->name);
    printf("sizes:         %d layers, hidden %d, FFN %d, %d query / %d KV heads of %d, vocabulary %d\n", hp->n_layer,
           hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_vocab);
    print_types(m);
    printf("context:       %d trained", hp->n_ctx_train);
    if (m->n_ctx_max != hp->n_ctx_train) printf(", %d with its RoPE scaling", m->n_ctx_max);
    printf("\n");
    print_rope(m);
    print_window(m);
    print_layer(m);
    print_text(m, template_name);
    printf("fingerprint:   %s\n", m->fingerprint);
    model_free(m);
    return CLI_EXIT_OK;
}
