/* fuzz_admit.c — libFuzzer target for admission: one input line through
 * everything `kvbatch run` does before the scheduler sees it — parse
 * (job_parse_line), the checks that need the model, the prompt's tokens
 * (chat template, encoding, token ids), and the samplers of every choice.
 *
 * The tokenizer is the default model's ($KVB_MODEL, else
 * models/SmolLM2-135M-Instruct.Q4_1.gguf) when it is there, else that of a
 * small synthetic model written by src/synth.c into a temporary file, so the
 * replayed corpus always runs. The context is small (256), so that context
 * errors are reached too.
 *
 * Properties checked (a violation traps, so the replay test fails too):
 *   - every line ends in KVB_OK or an error with a code and a message that
 *     names its line first; no crash, no leak (ASan), no undefined behaviour;
 *   - an admitted line has 1..JOB_MAX_CHOICES choices, n per prompt, each
 *     prompt 1..n_ctx-1 token ids inside the vocabulary;
 *   - each choice's sampler parameters are accepted by sampler_create, and
 *     its sampler draws a token in the vocabulary from a logits row, twice
 *     (the min_tokens ban, JSON mode and logit_bias included), never a
 *     banned one while the ban holds;
 *   - the error line for a refused line is written.
 * This file is test code, so it may stop the process when a property fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/admit.h"
#include "base/alloc.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "jobs/job.h"
#include "model/gguf.h"
#include "support/synth.h"
#include "text/chat.h"
#include "text/tok.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_admit: %s:%d: %s\n", __FILE__, __LINE__, #c);                                        \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

#define N_CTX 256

static struct {
    bool ready;
    struct tok *tok;
    struct chat_template tmpl;
    bool have_tmpl;
    struct admit_ctx ctx;
    float *logits; /* (n_vocab) a fixed, varied row */
} F;

static bool load_tokenizer(const char *path)
{
    struct gguf_file *g = NULL;
    struct kvb_err err = {{0}};
    if (access(path, R_OK) != 0 || gguf_open(path, &g, &err) != KVB_OK) return false;
    bool ok = tok_load(g, &F.tok, &err) == KVB_OK;
    struct gguf_str src;
    if (ok && gguf_get_str(g, "tokenizer.chat_template", &src, &err) == KVB_OK) { /* the model's own, as run */
        char bos[64], eos[64];
        size_t nb = tok_bos(F.tok) >= 0 ? tok_piece(F.tok, tok_bos(F.tok), true, bos, sizeof bos - 1) : 0;
        size_t ne = tok_eos(F.tok) >= 0 ? tok_piece(F.tok, tok_eos(F.tok), true, eos, sizeof eos - 1) : 0;
        bos[nb < sizeof bos ? nb : sizeof bos - 1] = '\0';
        eos[ne < sizeof eos ? ne : sizeof eos - 1] = '\0';
        F.have_tmpl =
            chat_template_from_text(src.ptr, (size_t)src.len, "tokenizer.chat_template", &F.tmpl, &err) == KVB_OK &&
            chat_template_set_tokens(&F.tmpl, bos, eos) == KVB_OK;
    }
    gguf_close(g);
    return ok;
}

static void setup(void)
{
    const char *env = getenv("KVB_MODEL");
    bool ok = load_tokenizer(env && env[0] ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!ok) { /* no model fetched: a synthetic one */
        char path[] = "/tmp/kvb-fuzz-admit-XXXXXX";
        int fd = mkstemp(path);
        REQUIRE(fd >= 0);
        close(fd);
        struct synth_opts so;
        synth_opts_default(&so);
        struct kvb_err err = {{0}};
        REQUIRE(synth_model_write(path, &so, &err) == KVB_OK);
        ok = load_tokenizer(path);
        unlink(path);
        REQUIRE(ok);
    }
    if (!F.have_tmpl) F.have_tmpl = chat_template_from_name("chatml", &F.tmpl, NULL) == KVB_OK;
    const int32_t nv = tok_n_vocab(F.tok);
    REQUIRE(admit_ctx_init(&F.ctx, F.tok, F.have_tmpl ? &F.tmpl : NULL, "no template", nv, N_CTX) == KVB_OK);
    F.logits = malloc(sizeof(float) * (size_t)nv);
    REQUIRE(F.logits);
    uint32_t x = 12345;
    for (int32_t i = 0; i < nv; i++) {
        x = x * 1664525u + 1013904223u;
        F.logits[i] = (float)(x >> 8) / (float)(1 << 24) * 8.0f - 4.0f;
    }
    F.ready = true;
}

static bool banned(const struct sampler_params *sp, int32_t t)
{
    for (int32_t i = 0; i < sp->n_ban; i++)
        if (sp->ban[i] == t) return true;
    return false;
}

static void check_plan(const struct job_request *q, const struct admit_plan *p)
{
    const int32_t nv = F.ctx.n_vocab;
    REQUIRE(p->n_prompts >= 1 && p->n_choices == p->n_prompts * q->n && p->n_choices <= JOB_MAX_CHOICES);
    REQUIRE(q->url != JOB_URL_CHAT || p->n_prompts == 1);
    for (int32_t k = 0; k < p->n_prompts; k++) {
        REQUIRE(p->prompts[k].n >= 1 && p->prompts[k].n < N_CTX && p->prompts[k].ids);
        for (int32_t i = 0; i < p->prompts[k].n; i++) REQUIRE(p->prompts[k].ids[i] >= 0 && p->prompts[k].ids[i] < nv);
    }
    float *row = malloc(sizeof(float) * (size_t)nv);
    REQUIRE(row);
    for (int32_t c = 0; c < p->n_choices; c++) {
        struct sampler_params sp;
        admit_choice_params(p, q, c, &sp);
        REQUIRE(sp.seed == q->seed + (uint64_t)(c % q->n));
        struct sampler *s = NULL;
        REQUIRE(sampler_create(&sp, nv, &s) == KVB_OK);
        for (int step = 0; step < 2; step++) {
            memcpy(row, F.logits, sizeof(float) * (size_t)nv);
            int32_t t = -1;
            REQUIRE(sampler_sample(s, row, &t) == KVB_OK);
            REQUIRE(t >= 0 && t < nv);
            if (step < sp.ban_until && !sp.grammar) REQUIRE(!banned(&sp, t));
            sampler_accept(s, t);
        }
        sampler_free(s);
        if (c >= 3) break; /* the others differ only in their seed */
    }
    free(row);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!F.ready) setup();
    const char *line = (const char *)data;
    const char *nl = memchr(line, '\n', size);
    if (nl) size = (size_t)(nl - line); /* one line, as the reader gives it */
    struct job_request q;
    struct job_error e;
    struct kvb_buf b = {0};
    enum kvb_status st = job_parse_line(line, size, 3, &q, &e);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
    struct grammar *schema = NULL;
    if (st == KVB_OK) st = admit_constraint(&q, &schema, &e);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
    REQUIRE(!schema || (st == KVB_OK && q.constraint != JOB_CONSTRAINT_NONE));
    if (st == KVB_OK) {
        struct admit_plan plan;
        st = admit_prepare(&F.ctx, &q, schema, &plan, &e);
        REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
        if (st == KVB_OK) {
            check_plan(&q, &plan);
            /* the shard plan's view of each prompt: the same tokens */
            for (int32_t k = 0; k < plan.n_prompts; k++) {
                int32_t *ids = NULL;
                size_t n = 0;
                REQUIRE(admit_prompt_ids(&F.ctx, &q, k, N_CTX - 1, &ids, &n, &e) == KVB_OK);
                REQUIRE((int32_t)n == plan.prompts[k].n && memcmp(ids, plan.prompts[k].ids, sizeof *ids * n) == 0);
                kvb_free(ids);
            }
            admit_plan_free(&plan);
        }
    }
    if (st != KVB_OK) {
        REQUIRE(e.code != NULL && strncmp(e.message, "line 3: ", 8) == 0);
        REQUIRE(job_format_error_json(&b, q.custom_id, q.custom_id_len, q.custom_id_json, q.custom_id_json_len, &e) ==
                KVB_OK);
        REQUIRE(b.len > 0 && b.data[b.len - 1] == '\n');
    }
    kvb_buf_free(&b);
    job_request_free(&q);
    return 0;
}
