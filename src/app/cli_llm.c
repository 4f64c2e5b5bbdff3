/* cli_llm.c — model + tokenizer + backend set-up for single-sequence commands. */
#include "app/cli_llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/admit.h"
#include "app/backend_select.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "base/tpool.h"
#include "text/chat.h"

bool cli_llm_open(const struct cli_llm_opts *o, struct cli_llm *l)
{
    struct kvb_err err = {{0}};
    memset(l, 0, sizeof *l);
    enum kvb_status st = model_load(o->model_path, &l->model, &err);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbatch: cannot load model: %s\n", err.msg);
        if (st == KVB_ERR_IO)
            fprintf(stderr, "hint: run scripts/fetch-model.sh to download the default model, or pass --model PATH\n");
        return false;
    }
    st = tok_load(l->model->gguf, &l->tok, &err);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbatch: cannot load tokenizer from %s: %s\n", o->model_path, err.msg);
        return false;
    }
    int32_t n_ctx = o->n_ctx;
    if (n_ctx <= 0) n_ctx = l->model->hp.n_ctx_train < 4096 ? l->model->hp.n_ctx_train : 4096;
    if (n_ctx > l->model->n_ctx_max)
        fprintf(stderr, "kvbatch: warning: context %d is longer than the model was trained for (%d%s)\n", n_ctx,
                l->model->n_ctx_max, l->model->n_ctx_max > l->model->hp.n_ctx_train ? ", with its RoPE scaling" : "");
    l->n_ctx = n_ctx;
    model_set_ctx(l->model, n_ctx);
    struct be_select_opts bo = {.device = o->device,
                                .n_threads = o->n_threads,
                                .block_size = 16,
                                .kv_mem = be_block_bytes(l->model, 16, o->kv_type) * (uint64_t)((n_ctx + 15) / 16),
                                .n_ctx = n_ctx,
                                .kernels = o->kernels,
                                .kv_type = o->kv_type,
                                .act16 = o->act16};
    st = be_select_create(l->model, &bo, &l->be, &err);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbatch: cannot start the backend: %s\n", err.msg);
        return false;
    }
    return true;
}

void cli_llm_close(struct cli_llm *l)
{
    be_free(l->be);
    tok_free(l->tok);
    model_free(l->model);
    memset(l, 0, sizeof *l);
}

bool cli_llm_prompt(const struct cli_llm *l, const char *prompt, bool chat, const char *system,
                    const char *template_name, int32_t **ids, size_t *n)
{
    struct kvb_err err = {{0}};
    unsigned flags = tok_wants_bos(l->tok) ? TOK_ADD_BOS : 0;
    if (!chat) {
        if (tok_encode(l->tok, prompt, strlen(prompt), flags, ids, n, &err) == KVB_OK) return true;
        fprintf(stderr, "kvbatch: cannot tokenize the prompt: %s\n", err.msg);
        return false;
    }
    /* the template run would choose (admit.h), rendered as run renders a
     * one-turn chat line */
    struct chat_template tmpl = {0};
    bool have = false;
    char why[sizeof err.msg];
    if (admit_template_choose(l->model, l->tok, template_name, &tmpl, &have, why, sizeof why, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch: --chat-template: %s\n", err.msg);
        return false;
    }
    if (!have) {
        fprintf(stderr, "kvbatch: %s\n", why);
        return false;
    }
    struct chat_msg msgs[2];
    size_t nm = 0;
    if (system) msgs[nm++] = (struct chat_msg){"system", system};
    msgs[nm++] = (struct chat_msg){"user", prompt};
    const struct chat_input in = {.msgs = msgs, .n = nm, .add_generation_prompt = true, .now = admit_clock()};
    struct jinja_output o;
    enum kvb_status st = chat_render(&tmpl, &in, &o, &err);
    if (chat_template_writes_bos(&tmpl)) flags = 0;
    chat_template_free(&tmpl);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbatch: chat template: %s\n", err.msg);
        return false;
    }
    struct tok_span *plain = o.n_user ? calloc(o.n_user, sizeof *plain) : NULL;
    for (size_t i = 0; plain && i < o.n_user; i++) plain[i] = (struct tok_span){o.user[i].off, o.user[i].len};
    const struct tok_limits lim = {.plain = plain, .n_plain = plain ? o.n_user : 0};
    st = tok_encode_with(l->tok, o.text, o.len, flags | TOK_PARSE_SPECIAL, &lim, ids, n, &err);
    free(plain);
    jinja_output_free(&o);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbatch: cannot tokenize the prompt: %s\n", err.msg);
        return false;
    }
    return true;
}

int cli_llm_prompt_ids(const struct cli_llm *l, const char *cmd, const char *list, int32_t **ids, size_t *n)
{
    const int32_t nv = l->model->hp.n_vocab;
    *n = 0;
    /* every id takes at least one character and one separator */
    *ids = kvb_malloc(sizeof(int32_t) * (strlen(list) / 2 + 1));
    if (!*ids) {
        fprintf(stderr, "kvbatch %s: out of memory\n", cmd);
        return CLI_EXIT_FAIL;
    }
    for (const char *s = list; *s;) {
        if (*s == ' ' || *s == ',' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        char *end;
        long t = strtol(s, &end, 10);
        const char *why = NULL;
        if (end == s || (*end && !strchr(" ,\n\t\r", *end))) why = "not a token id";
        else if (t < 0 || t >= nv) why = "outside the vocabulary";
        if (why) {
            int len = (int)strcspn(s, " ,\n\t\r");
            fprintf(stderr, "kvbatch %s: --prompt-ids: '%.*s' (item %zu of the list) is %s (ids are 0..%d)\n", cmd,
                    len > 20 ? 20 : len, s, *n + 1, why, nv - 1);
            kvb_free(*ids);
            *ids = NULL;
            *n = 0;
            return CLI_EXIT_USAGE;
        }
        (*ids)[(*n)++] = (int32_t)t;
        s = end;
    }
    return CLI_EXIT_OK;
}
