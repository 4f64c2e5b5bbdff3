/* admit.c — a parsed request made ready to run (see admit.h). */
#include "app/admit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "engine/grammar.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_schema.h"
#include "model/model.h"
#include "text/tok.h"

/* The text of token id (control tokens as their text), kvb_malloc'd; NULL
 * for no token. */
static char *token_text(const struct tok *tok, int32_t id)
{
    if (id < 0) return NULL;
    char buf[256];
    size_t n = tok_piece(tok, id, true, buf, sizeof buf);
    if (n >= sizeof buf) return NULL; /* no special token is that long */
    return kvb_strndup(buf, n);
}

/* A template file's text, kvb_malloc'd; KVB_ERR_NOT_FOUND when there is no
 * such file. */
static enum kvb_status read_template_file(const char *path, char **out, size_t *len, struct kvb_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? KVB_ERR_NOT_FOUND
                               : kvb_errf(err, KVB_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    enum { CAP = 4 << 20 }; /* far past the compiler's bound, which then names the size */
    char *buf = kvb_malloc(CAP + 1);
    size_t n = buf ? fread(buf, 1, CAP, f) : 0;
    const bool bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        kvb_free(buf);
        return kvb_errf(err, buf ? KVB_ERR_IO : KVB_ERR_NOMEM, "cannot read %s", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KVB_OK;
}

/* The names of the model's own templates (tokenizer.chat_template.NAME),
 * comma-separated into buf. */
static void named_templates(const struct model *m, char *buf, size_t cap)
{
    static const char pre[] = "tokenizer.chat_template.";
    size_t o = 0;
    buf[0] = '\0';
    for (uint64_t i = 0; i < gguf_n_kv(m->gguf) && o + 1 < cap; i++) {
        const struct gguf_kv *kv = gguf_kv_at(m->gguf, i);
        if (kv->key.len <= sizeof pre - 1 || memcmp(kv->key.ptr, pre, sizeof pre - 1) != 0) continue;
        int w = snprintf(buf + o, cap - o, "%s%.*s", o ? ", " : "", (int)(kv->key.len - (sizeof pre - 1)),
                         kv->key.ptr + sizeof pre - 1);
        if (w > 0) o += (size_t)w;
    }
}

enum kvb_status admit_template_choose(const struct model *m, const struct tok *tok, const char *name,
                                      struct chat_template *out, bool *have, char *why, size_t why_cap,
                                      struct kvb_err *err)
{
    struct kvb_err e = {{0}};
    enum kvb_status st;
    struct gguf_str src;
    *have = false;
    if (why_cap) why[0] = '\0';
    memset(out, 0, sizeof *out);
    if (name) {
        char key[256];
        snprintf(key, sizeof key, "tokenizer.chat_template.%s", name);
        if (chat_template_from_name(name, out, &e) == KVB_OK) {
            /* a built-in family */
        } else if (gguf_get_str(m->gguf, key, &src, NULL) == KVB_OK) {
            if (chat_template_from_text(src.ptr, (size_t)src.len, key, out, &e) != KVB_OK) {
                chat_template_free(out);
                return kvb_errf(err, KVB_ERR_INVALID_ARG, "the model's template %s: %s", name, e.msg);
            }
        } else {
            char *text = NULL;
            size_t len = 0;
            st = read_template_file(name, &text, &len, &e);
            if (st == KVB_ERR_NOT_FOUND) {
                char names[512];
                named_templates(m, names, sizeof names);
                return kvb_errf(err, KVB_ERR_INVALID_ARG,
                                "unknown chat template \"%.100s\" (known: %s); the model's own named templates: %s; "
                                "nor is it a file",
                                name, chat_builtin_names(), names[0] ? names : "none");
            }
            if (st == KVB_OK) st = chat_template_from_text(text, len, name, out, &e);
            kvb_free(text);
            if (st != KVB_OK) {
                chat_template_free(out);
                return kvb_errf(err, KVB_ERR_INVALID_ARG, "%s", e.msg);
            }
        }
        *have = true;
    } else if (gguf_get_str(m->gguf, "tokenizer.chat_template", &src, NULL) != KVB_OK) {
        snprintf(e.msg, sizeof e.msg, "the model has no chat template (run with --chat-template NAME or FILE)");
    } else if (chat_template_from_text(src.ptr, (size_t)src.len, "tokenizer.chat_template", out, &e) != KVB_OK) {
        chat_template_free(out);
        memset(out, 0, sizeof *out);
        char msg[sizeof e.msg];
        snprintf(msg, sizeof msg, "%s", e.msg);
        snprintf(e.msg, sizeof e.msg,
                 "the model's chat template cannot be used: %.400s (run with --chat-template NAME or FILE)", msg);
    } else {
        *have = true;
    }
    if (*have && out->jinja && tok) {
        char *bos = token_text(tok, tok_bos(tok)), *eos = token_text(tok, tok_eos(tok));
        st = chat_template_set_tokens(out, bos, eos);
        kvb_free(bos);
        kvb_free(eos);
        if (st != KVB_OK) {
            chat_template_free(out);
            return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
        }
    }
    if (!*have && why_cap) snprintf(why, why_cap, "%s", e.msg);
    return KVB_OK;
}

int64_t admit_clock(void)
{
    const char *e = getenv("SOURCE_DATE_EPOCH");
    if (e && *e) {
        char *end;
        errno = 0;
        long long v = strtoll(e, &end, 10);
        if (!errno && !*end && v > 0) return v;
    }
    return (int64_t)time(NULL);
}

void admit_template_label(const struct admit_ctx *ctx, const struct job_request *q, char *buf, size_t cap)
{
    if (q->chat_template) {
        char h[17];
        chat_text_hash(q->chat_template, q->chat_template_len, h);
        snprintf(buf, cap, "request@%.12s", h);
    } else {
        chat_template_describe(ctx->tmpl, buf, cap);
    }
}

int32_t admit_n_ctx(const struct model *m, int32_t asked)
{
    if (asked > 0) return asked;
    return m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
}

enum kvb_status admit_ctx_init(struct admit_ctx *ctx, const struct tok *tok, const struct chat_template *tmpl,
                               const char *tmpl_error, int32_t n_vocab, int32_t n_ctx)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->tok = tok;
    ctx->tmpl = tmpl;
    ctx->tmpl_error = tmpl_error ? tmpl_error : "no chat template";
    ctx->n_vocab = n_vocab;
    ctx->n_ctx = n_ctx;
    const int32_t bos = tok_bos(tok), eos = tok_eos(tok);
    ctx->bos_text = token_text(tok, bos);
    ctx->eos_text = token_text(tok, eos);
    if ((bos >= 0 && !ctx->bos_text) || (eos >= 0 && !ctx->eos_text)) return KVB_ERR_NOMEM;
    const int32_t nt = tok_n_vocab(tok);
    int32_t n = 0;
    for (int32_t i = 0; i < nt; i++) n += tok_is_eog(tok, i);
    ctx->eog = kvb_malloc(sizeof *ctx->eog * (size_t)(n ? n : 1));
    if (!ctx->eog) return KVB_ERR_NOMEM;
    for (int32_t i = 0; i < nt; i++)
        if (tok_is_eog(tok, i)) ctx->eog[ctx->n_eog++] = i;
    return KVB_OK;
}

void admit_ctx_free(struct admit_ctx *ctx)
{
    if (!ctx) return;
    kvb_free(ctx->eog);
    kvb_free(ctx->bos_text);
    kvb_free(ctx->eos_text);
    grammar_vocab_free(ctx->gvocab);
    memset(ctx, 0, sizeof *ctx);
}

void admit_plan_free(struct admit_plan *plan)
{
    if (!plan) return;
    for (int32_t k = 0; k < plan->n_prompts; k++) kvb_free(plan->prompts[k].ids);
    kvb_free(plan->prompts);
    kvb_free(plan->bias);
    kvb_free(plan->ban);
    grammar_free(plan->grammar);
    memset(plan, 0, sizeof *plan);
}

bool admit_is_stop_token(const struct job_request *q, int32_t token)
{
    for (int32_t k = 0; k < q->n_stop_token_ids; k++)
        if (q->stop_token_ids[k] == token) return true;
    return false;
}

enum kvb_status admit_check_length(const struct job_line *ln, struct job_error *e)
{
    if (!ln->too_long) return KVB_OK;
    job_error_setf(e, JOB_ERR_INVALID_REQUEST, ln->line_no, NULL, "the line is %llu bytes, longer than the limit",
                   (unsigned long long)ln->full_len);
    return KVB_ERR_FORMAT;
}

enum kvb_status admit_check_unique(struct job_idset *seen, const struct job_request *q, struct job_error *e)
{
    bool added = false;
    if (job_idset_add(seen, q->custom_id, q->custom_id_len, &added) != KVB_OK) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, "custom_id", "out of memory");
        return KVB_ERR_NOMEM;
    }
    if (!added) {
        job_error_setf(e, JOB_ERR_DUPLICATE_CUSTOM_ID, q->line_no, "custom_id",
                       "custom_id '%.200s' was already used by an earlier line (the first one is run)", q->custom_id);
        return KVB_ERR_FORMAT;
    }
    return KVB_OK;
}

/* The path of prompt k in errors: "prompt" for one, "prompt[k]" in a list. */
static void prompt_param(const struct job_request *q, int32_t k, char *out, size_t cap)
{
    const char *pre = q->shorthand ? "" : "body.";
    if (q->url == JOB_URL_CHAT) snprintf(out, cap, "%smessages", pre);
    else if (q->n_prompts > 1) snprintf(out, cap, "%sprompt[%d]", pre, k);
    else snprintf(out, cap, "%sprompt", pre);
}

/* The chat template applied to q's messages (the request's own template
 * when it brings one): the text to tokenize, the user's spans in it, and
 * whether the template wrote BOS itself. */
static enum kvb_status render_chat(const struct admit_ctx *ctx, const struct job_request *q, struct jinja_output *out,
                                   bool *writes_bos, struct job_error *e)
{
    char param[64];
    prompt_param(q, 0, param, sizeof param);
    const struct chat_template *t = ctx->tmpl;
    struct chat_template own = {0};
    struct kvb_err err = {{0}};
    enum kvb_status st;
    if (q->chat_template) {
        st = chat_template_from_text(q->chat_template, q->chat_template_len, "request", &own, &err);
        if (st == KVB_OK) st = chat_template_set_tokens(&own, ctx->bos_text, ctx->eos_text);
        if (st != KVB_OK) {
            chat_template_free(&own);
            if (st == KVB_ERR_NOMEM) goto oom;
            snprintf(param, sizeof param, "%schat_template", q->shorthand ? "" : "body.");
            job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param, "%s", err.msg);
            return KVB_ERR_FORMAT;
        }
        t = &own;
    } else if (!t) {
        job_error_setf(e, JOB_ERR_INVALID_REQUEST, q->line_no, param, "%s", ctx->tmpl_error);
        return KVB_ERR_FORMAT;
    }
    *writes_bos = chat_template_writes_bos(t);
    struct chat_msg *msgs = kvb_calloc(q->n_messages, sizeof *msgs);
    if (!msgs) {
        chat_template_free(&own);
        goto oom;
    }
    for (size_t i = 0; i < q->n_messages; i++)
        msgs[i] = (struct chat_msg){job_role_name(q->messages[i].role), q->messages[i].content};
    const struct chat_input in = {.msgs = msgs,
                                  .n = q->n_messages,
                                  .add_generation_prompt = q->add_generation_prompt,
                                  .continue_final_message = q->continue_final_message,
                                  .kwargs_json = q->chat_template_kwargs,
                                  .kwargs_len = q->chat_template_kwargs_len,
                                  .now = ctx->now};
    st = chat_render(t, &in, out, &err);
    kvb_free(msgs);
    chat_template_free(&own);
    if (st == KVB_ERR_NOMEM) goto oom;
    if (st != KVB_OK) {
        if (strncmp(err.msg, "chat_template_kwargs", 20) == 0) /* a kwarg it refuses names that field */
            snprintf(param, sizeof param, "%schat_template_kwargs", q->shorthand ? "" : "body.");
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param, "%s", err.msg);
        return KVB_ERR_FORMAT;
    }
    return KVB_OK;
oom:
    job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
    return KVB_ERR_NOMEM;
}

enum kvb_status admit_prompt_text(const struct admit_ctx *ctx, const struct job_request *q, int32_t k,
                                  struct admit_text *out, struct job_error *e)
{
    memset(out, 0, sizeof *out);
    const unsigned bos = tok_wants_bos(ctx->tok) ? TOK_ADD_BOS : 0;
    if (q->url == JOB_URL_CHAT) {
        struct jinja_output o;
        bool writes_bos = false;
        KVB_FORWARD_IF_ERROR(render_chat(ctx, q, &o, &writes_bos, e));
        out->owned = o.text;
        out->text = o.text;
        out->len = o.len;
        out->flags = (writes_bos ? 0 : bos) | TOK_PARSE_SPECIAL; /* the template's control-token text is tokens */
        if (o.n_user) {
            out->plain = kvb_calloc(o.n_user, sizeof *out->plain);
            if (!out->plain) {
                jinja_output_free(&o);
                memset(out, 0, sizeof *out);
                job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
                return KVB_ERR_NOMEM;
            }
            for (size_t i = 0; i < o.n_user; i++) out->plain[i] = (struct tok_span){o.user[i].off, o.user[i].len};
            out->n_plain = o.n_user;
        }
        kvb_free(o.user);
    } else if (!q->prompts[k].ids) {
        out->text = q->prompts[k].text;
        out->len = q->prompts[k].text_len;
        out->flags = bos; /* a completion prompt's "<|im_start|>" is plain text, as in vLLM */
    }
    return KVB_OK;
}

void admit_text_free(struct admit_text *t)
{
    if (!t) return;
    kvb_free(t->owned);
    kvb_free(t->plain);
    memset(t, 0, sizeof *t);
}

enum kvb_status admit_prompt_ids(const struct admit_ctx *ctx, const struct job_request *q, int32_t k, size_t max_ids,
                                 int32_t **ids, size_t *n, struct job_error *e)
{
    struct tok_limits lim = {.max_ids = max_ids, .cancel = ctx->cancel};
    *ids = NULL;
    *n = 0;
    char param[64];
    prompt_param(q, k, param, sizeof param);
    struct kvb_err err = {{0}};
    struct admit_text t;
    KVB_FORWARD_IF_ERROR(admit_prompt_text(ctx, q, k, &t, e));
    if (!t.text) {
        /* token ids are used as given, as vLLM does: no BOS added */
        const struct job_prompt *p = &q->prompts[k];
        for (int32_t i = 0; i < p->n_ids; i++) {
            if (p->ids[i] < ctx->n_vocab) continue;
            job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                           "token id %d is not in the vocabulary (%d tokens)", p->ids[i], ctx->n_vocab);
            return KVB_ERR_FORMAT;
        }
        if (max_ids > 0 && (size_t)p->n_ids > max_ids) {
            job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, param,
                           "the prompt has %d tokens; the context holds %zu (prompt plus at least one generated "
                           "token)",
                           p->n_ids, max_ids + 1);
            return KVB_ERR_FORMAT;
        }
        *ids = kvb_malloc(sizeof **ids * (size_t)p->n_ids);
        if (!*ids) goto oom;
        memcpy(*ids, p->ids, sizeof **ids * (size_t)p->n_ids);
        *n = (size_t)p->n_ids;
        return KVB_OK;
    }
    lim.plain = t.plain;
    lim.n_plain = t.n_plain;
    enum kvb_status st = tok_encode_with(ctx->tok, t.text, t.len, t.flags, &lim, ids, n, &err);
    admit_text_free(&t);
    if (st == KVB_ERR_NOMEM) goto oom;
    if (st == KVB_ERR_CANCELLED) return st;
    if (st == KVB_ERR_RANGE) {
        job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, param,
                       "%s; the context holds %zu (prompt plus at least one generated token)", err.msg, max_ids + 1);
        return KVB_ERR_FORMAT;
    }
    if (st != KVB_OK) {
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param, "%s", err.msg);
        return KVB_ERR_FORMAT;
    }
    if (*n == 0) {
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param, "the prompt is empty");
        kvb_free(*ids);
        *ids = NULL;
        return KVB_ERR_FORMAT;
    }
    return KVB_OK;
oom:
    kvb_free(*ids);
    *ids = NULL;
    job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
    return KVB_ERR_NOMEM;
}

/* Token ids the request names (logit_bias, stop_token_ids) must be in the
 * vocabulary. */
static enum kvb_status check_ids(const struct admit_ctx *ctx, const struct job_request *q, struct job_error *e)
{
    const char *pre = q->shorthand ? "" : "body.";
    char param[64];
    for (int32_t k = 0; k < q->n_logit_bias; k++) {
        if (q->logit_bias[k].token < ctx->n_vocab) continue;
        snprintf(param, sizeof param, "%slogit_bias", pre);
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                       "logit_bias token %d is not in the vocabulary (%d tokens)", q->logit_bias[k].token,
                       ctx->n_vocab);
        return KVB_ERR_FORMAT;
    }
    for (int32_t k = 0; k < q->n_stop_token_ids; k++) {
        if (q->stop_token_ids[k] < ctx->n_vocab) continue;
        snprintf(param, sizeof param, "%sstop_token_ids[%d]", pre, k);
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                       "stop token %d is not in the vocabulary (%d tokens)", q->stop_token_ids[k], ctx->n_vocab);
        return KVB_ERR_FORMAT;
    }
    return KVB_OK;
}

/* The GBNF of q's constraint into g; KVB_ERR_FORMAT with the field in
 * param and the reason in msg. */
static enum kvb_status constraint_gbnf(const struct job_request *q, struct kvb_buf *g, char *param, size_t param_cap,
                                       char *msg, size_t msg_cap)
{
    snprintf(param, param_cap, "%s", q->constraint_param);
    switch ((enum job_constraint)q->constraint) {
    case JOB_CONSTRAINT_JSON:
        return gschema_to_gbnf(q->json_schema, q->json_schema ? q->json_schema_len : 0, q->constraint_param, g, param,
                               param_cap, msg, msg_cap);
    case JOB_CONSTRAINT_REGEX:
        return gregex_to_gbnf(q->constraint_text, q->constraint_len, GREGEX_WHOLE, "root", g, msg, msg_cap);
    case JOB_CONSTRAINT_CHOICE: return grammar_choice_gbnf(q->constraint_text, q->constraint_len, g, msg, msg_cap);
    case JOB_CONSTRAINT_GRAMMAR:
        KVB_FORWARD_IF_ERROR(kvb_buf_reserve(g, q->constraint_len + 1));
        memcpy(g->data, q->constraint_text, q->constraint_len);
        g->len = q->constraint_len;
        g->data[g->len] = 0;
        return KVB_OK;
    default: return KVB_OK;
    }
}

enum kvb_status admit_constraint(const struct job_request *q, struct grammar **out, struct job_error *e)
{
    *out = NULL;
    if (q->constraint == JOB_CONSTRAINT_NONE) return KVB_OK;
    char param[sizeof e->param] = "", msg[320] = "";
    struct kvb_buf g = {0};
    /* The budget of the text itself, before any work on it: the compilers
     * hold what they read several times over (a regex as code points, a
     * schema as JSON tokens). */
    const size_t text_len =
        q->constraint == JOB_CONSTRAINT_JSON ? (q->json_schema ? q->json_schema_len : 0) : q->constraint_len;
    enum kvb_status st = KVB_OK;
    if (text_len > GRAMMAR_MAX_TEXT) {
        snprintf(msg, sizeof msg, "the constraint is %zu bytes; at most %u are allowed", text_len,
                 (unsigned)GRAMMAR_MAX_TEXT);
        st = KVB_ERR_FORMAT;
    }
    if (st == KVB_OK) st = constraint_gbnf(q, &g, param, sizeof param, msg, sizeof msg);
    if (st == KVB_OK) {
        char cmsg[300] = "";
        st = grammar_compile(g.data, g.len, out, cmsg, sizeof cmsg);
        if (st != KVB_OK && q->constraint == JOB_CONSTRAINT_GRAMMAR) snprintf(msg, sizeof msg, "%s", cmsg);
        else if (st != KVB_OK) /* kvbatch wrote that GBNF: a refusal is a limit (or a bug), named as such */
            snprintf(msg, sizeof msg, "the constraint's compiled grammar was refused: %s", cmsg);
    }
    kvb_buf_free(&g);
    if (st == KVB_ERR_NOMEM) {
        job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory while reading the line");
    } else if (st != KVB_OK) {
        if (!param[0]) snprintf(param, sizeof param, "%s", q->constraint_param);
        if (strncmp(msg, "field", 5) != 0) { /* name the field unless the message does */
            char full[sizeof msg + sizeof param + 16];
            snprintf(full, sizeof full, "field '%s': %s", param, msg);
            job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param, "%s", full);
        } else {
            job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param, "%s", msg);
        }
        e->by_line = true;
        st = KVB_ERR_FORMAT; /* a refusal, whatever its code: the line is bad */
    }
    return st;
}

enum kvb_status admit_prepare(struct admit_ctx *ctx, const struct job_request *q, struct grammar *grammar,
                              struct admit_plan *plan, struct job_error *e)
{
    memset(plan, 0, sizeof *plan);
    plan->grammar = grammar;
    enum kvb_status st = KVB_ERR_FORMAT;
    const int32_t np = q->url == JOB_URL_CHAT ? 1 : q->n_prompts;
    if (np < 1 || (int64_t)np * q->n > JOB_MAX_CHOICES) {
        char param[64];
        snprintf(param, sizeof param, "%sn", q->shorthand ? "" : "body.");
        job_error_setf(e, JOB_ERR_INVALID_VALUE, q->line_no, param,
                       "%d prompts with n = %d make %lld choices; at most %d are allowed in one line", np, q->n,
                       (long long)np * q->n, JOB_MAX_CHOICES);
        goto fail;
    }
    st = check_ids(ctx, q, e);
    if (st != KVB_OK) goto fail;
    plan->prompts = kvb_calloc((size_t)np, sizeof *plan->prompts);
    if (!plan->prompts) goto oom;
    for (int32_t k = 0; k < np; k++) {
        int32_t *ids;
        size_t n;
        st = admit_prompt_ids(ctx, q, k, ctx->n_ctx > 0 ? (size_t)ctx->n_ctx - 1 : 0, &ids, &n, e);
        if (st != KVB_OK) goto fail;
        plan->prompts[k] = (struct admit_prompt){ids, (int32_t)n};
        plan->n_prompts = k + 1;
        if (ctx->n_ctx > 0 && (int64_t)n >= ctx->n_ctx) {
            char param[64];
            prompt_param(q, k, param, sizeof param);
            job_error_setf(e, JOB_ERR_CONTEXT_LENGTH, q->line_no, param,
                           "the prompt has %zu tokens; the context holds %d (prompt plus at least one generated token)",
                           n, ctx->n_ctx);
            st = KVB_ERR_FORMAT;
            goto fail;
        }
    }
    plan->n_choices = np * q->n;
    if (plan->grammar && !ctx->gvocab) { /* built for the first request that asks */
        struct kvb_err gerr = {{0}};
        st = grammar_vocab_create(ctx->tok, &ctx->gvocab, &gerr);
        if (st != KVB_OK) {
            job_error_setf(e, st == KVB_ERR_NOMEM ? JOB_ERR_SERVER : JOB_ERR_INVALID_VALUE, q->line_no,
                           q->constraint_param, "constrained output: %s", gerr.msg);
            st = st == KVB_ERR_NOMEM ? KVB_ERR_NOMEM : KVB_ERR_FORMAT;
            goto fail;
        }
    }
    if (q->n_logit_bias) {
        plan->bias = kvb_malloc(sizeof *plan->bias * (size_t)q->n_logit_bias);
        if (!plan->bias) goto oom;
        for (int32_t k = 0; k < q->n_logit_bias; k++)
            plan->bias[k] = (struct sampler_bias){q->logit_bias[k].token, q->logit_bias[k].value};
    }
    int32_t n_ban = 0;
    if (q->min_tokens > 0) {
        plan->ban = kvb_malloc(sizeof *plan->ban * (size_t)(ctx->n_eog + q->n_stop_token_ids + 1));
        if (!plan->ban) goto oom;
        if (!q->ignore_eos)
            for (int32_t k = 0; k < ctx->n_eog; k++) plan->ban[n_ban++] = ctx->eog[k];
        for (int32_t k = 0; k < q->n_stop_token_ids; k++) plan->ban[n_ban++] = q->stop_token_ids[k];
    }
    struct sampler_params *sp = &plan->sp;
    sampler_params_default(sp);
    sp->temperature = q->temperature;
    sp->top_k = q->top_k;
    sp->top_p = q->top_p;
    sp->min_p = q->min_p < 0.999999f ? q->min_p : 0.999999f; /* min_p = 1 means "top token only" */
    sp->repetition_penalty = q->repetition_penalty;
    sp->presence_penalty = q->presence_penalty;
    sp->frequency_penalty = q->frequency_penalty;
    sp->grammar = plan->grammar;
    sp->gvocab = plan->grammar ? ctx->gvocab : NULL;
    sp->bias = plan->bias;
    sp->n_bias = plan->bias ? q->n_logit_bias : 0;
    sp->ban = plan->ban;
    sp->n_ban = n_ban;
    sp->ban_until = n_ban ? q->min_tokens : 0;
    sp->seed = q->seed;
    return KVB_OK;
oom:
    job_error_setf(e, JOB_ERR_SERVER, q->line_no, NULL, "out of memory");
    st = KVB_ERR_NOMEM;
fail:
    admit_plan_free(plan);
    return st;
}

void admit_choice_params(const struct admit_plan *plan, const struct job_request *q, int32_t c,
                         struct sampler_params *out)
{
    *out = plan->sp;
    /* Sample i of a prompt draws from seed + i, so n > 1 gives n different
     * samples and sample 0 equals the n = 1 result; every prompt of a list
     * starts from the same seed, as if each were a line of its own. */
    out->seed = q->seed + (uint64_t)(c % q->n);
}
