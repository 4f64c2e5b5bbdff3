/* job_parse_pool.c — the bodies of the pooled endpoints: OpenAI's
 * /v1/embeddings, vLLM's /v1/score and /v1/rerank (see job.h).
 *
 * Each endpoint has its own fields; a field of another endpoint (a
 * temperature on an embeddings line) is refused by name like any field
 * kvbatch does not read, and those that mean nothing offline (user, ...)
 * are ignored as everywhere (job_field_ignored). */
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "jobs/job.h"
#include "jobs/job_parse_internal.h"

static const char *const embed_fields[] = {
    "input", "model", "encoding_format", "dimensions", "add_special_tokens", "truncate_prompt_tokens"};
static const char *const score_fields[] = {"text_1",         "text_2",     "model",   "truncate_prompt_tokens",
                                           "use_activation", "activation", "softmax", "mm_processor_kwargs"};
static const char *const rerank_fields[] = {
    "query",   "documents",          "top_n", "model", "truncate_prompt_tokens", "use_activation", "activation",
    "softmax", "mm_processor_kwargs"};

/* Refuses members of the body that the endpoint does not take. */
static int check_fields(struct jp_ctx *c, int obj)
{
    const struct job_request *r = c->r;
    const char *const *names = r->url == JOB_URL_EMBEDDINGS ? embed_fields
                               : r->url == JOB_URL_SCORE    ? score_fields
                                                            : rerank_fields;
    const size_t n = r->url == JOB_URL_EMBEDDINGS ? sizeof embed_fields / sizeof *embed_fields
                     : r->url == JOB_URL_SCORE    ? sizeof score_fields / sizeof *score_fields
                                                  : sizeof rerank_fields / sizeof *rerank_fields;
    int k = obj + 1;
    for (int m = 0; m < c->j->tok[obj].size; m++, k = json_skip(c->j, k + 1)) {
        char name[64], path[JP_PATH_MAX];
        jp_key_name(c, k, name, sizeof name);
        if (r->shorthand && (!strcmp(name, "custom_id") || !strcmp(name, "method") || !strcmp(name, "url"))) continue;
        if (job_field_ignored(name)) continue;
        bool known = false;
        for (size_t f = 0; f < n && !known; f++) known = !strcmp(name, names[f]);
        if (known) continue;
        jp_path_of(c, name, path);
        return jp_fail(c, JOB_ERR_UNSUPPORTED_FIELD, path,
                       "field '%s' is not one %s takes (README: Request fields lists those that are)", path,
                       job_url_name(r->url));
    }
    return 0;
}

/* A required field: its token, or a missing_field error. */
static int need(struct jp_ctx *c, int obj, const char *name, int *out)
{
    *out = jp_lookup(c, obj, name);
    if (*out >= 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, name, path);
    return jp_fail_missing(c, path);
}

/* Texts: a string (when one is allowed) or a list of 1..JOB_MAX_INPUTS
 * strings, into (*out, *n) as text prompts. */
static int parse_texts(struct jp_ctx *c, int i, const char *name, bool one, bool many, struct job_prompt **out,
                       int32_t *n)
{
    char path[JP_PATH_MAX];
    jp_path_of(c, name, path);
    const enum json_kind k = json_kind(c->j, i);
    const bool list = k == JSON_ARRAY;
    if (!(list && many) && !(k == JSON_STRING && one))
        return jp_fail_type(c, path,
                            one && many ? "a string or a list of strings"
                            : one       ? "a string"
                                        : "a list of strings");
    const int cnt = list ? c->j->tok[i].size : 1;
    if (cnt == 0) return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
    if (cnt > JOB_MAX_INPUTS)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d texts; at most %d are allowed", path, cnt,
                       JOB_MAX_INPUTS);
    *out = kvb_calloc((size_t)cnt, sizeof **out);
    if (!*out) return jp_fail_nomem(c);
    for (int q = 0, t = list ? i + 1 : i; q < cnt; q++, t = json_skip(c->j, t)) {
        char ipath[JP_PATH_MAX];
        if (list) jp_path_idx(ipath, path, q);
        else jp_path_sub(ipath, path, "");
        if (json_kind(c->j, t) != JSON_STRING) /* vLLM's multimodal parts are refused here */
            return jp_fail_type(c, ipath, "a string");
        if (json_str_dup(c->j, t, &(*out)[q].text, &(*out)[q].text_len) != KVB_OK) return jp_fail_nomem(c);
        *n = q + 1;
    }
    return 0;
}

static int parse_embeddings(struct jp_ctx *c, int body)
{
    struct job_request *r = c->r;
    char path[JP_PATH_MAX];
    int i, rc;
    if ((rc = need(c, body, "input", &i))) return rc;
    if ((rc = jp_parse_prompt(c, i, "input", JOB_MAX_INPUTS))) return rc;
    for (int32_t k = 0; k < r->n_prompts; k++)
        if (r->prompts[k].text && r->prompts[k].text_len == 0) { /* OpenAI refuses an empty string */
            if (r->n_prompts > 1) {
                jp_path_of(c, "input", path);
                char ipath[JP_PATH_MAX];
                jp_path_idx(ipath, path, k);
                return jp_fail(c, JOB_ERR_INVALID_VALUE, ipath, "field '%s' must not be empty", ipath);
            }
            jp_path_of(c, "input", path);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
        }
    i = jp_lookup(c, body, "encoding_format");
    if (i >= 0) {
        jp_path_of(c, "encoding_format", path);
        if (json_kind(c->j, i) != JSON_STRING) return jp_fail_type(c, path, "a string");
        if (json_str_eq(c->j, i, "base64")) r->base64 = true;
        else if (!json_str_eq(c->j, i, "float"))
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be \"float\" or \"base64\"", path);
    }
    int64_t v;
    bool present;
    if ((rc = jp_get_int(c, body, "dimensions", 1, INT32_MAX, &v, &present))) return rc;
    if (present) r->dimensions = (int32_t)v; /* checked against the model's width by the caller */
    return jp_get_bool(c, body, "add_special_tokens", &r->add_special_tokens, NULL);
}

/* vLLM's use_activation, and its older names activation and softmax (the
 * newest one given wins). */
static int parse_activation(struct jp_ctx *c, int body)
{
    static const char *const names[] = {"softmax", "activation", "use_activation"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        int rc = jp_get_bool(c, body, names[k], &c->r->use_activation, NULL);
        if (rc) return rc;
    }
    return 0;
}

static int parse_score(struct jp_ctx *c, int body)
{
    struct job_request *r = c->r;
    int i1, i2, rc;
    if ((rc = need(c, body, "text_1", &i1)) || (rc = need(c, body, "text_2", &i2))) return rc;
    if ((rc = parse_texts(c, i1, "text_1", true, true, &r->prompts, &r->n_prompts))) return rc;
    if ((rc = parse_texts(c, i2, "text_2", true, true, &r->docs, &r->n_docs))) return rc;
    if (r->n_prompts > 1 && r->n_prompts != r->n_docs) {
        char path[JP_PATH_MAX];
        jp_path_of(c, "text_1", path);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                       "field '%s' holds %d texts and text_2 %d: pairs are 1:1, 1:N or N:N (vLLM's rule)", path,
                       r->n_prompts, r->n_docs);
    }
    return parse_activation(c, body);
}

static int parse_rerank(struct jp_ctx *c, int body)
{
    struct job_request *r = c->r;
    int iq, id, rc;
    if ((rc = need(c, body, "query", &iq)) || (rc = need(c, body, "documents", &id))) return rc;
    if ((rc = parse_texts(c, iq, "query", true, false, &r->prompts, &r->n_prompts))) return rc;
    if ((rc = parse_texts(c, id, "documents", false, true, &r->docs, &r->n_docs))) return rc;
    int64_t v;
    bool present;
    if ((rc = jp_get_int(c, body, "top_n", 0, INT32_MAX, &v, &present))) return rc;
    if (present) r->top_n = (int32_t)v;
    return parse_activation(c, body);
}

int jp_parse_pooled(struct jp_ctx *c, int body)
{
    struct job_request *r = c->r;
    int rc = r->url == JOB_URL_EMBEDDINGS ? parse_embeddings(c, body)
             : r->url == JOB_URL_SCORE    ? parse_score(c, body)
                                          : parse_rerank(c, body);
    if (rc) return rc;
    if ((rc = check_fields(c, body))) return rc;
    char path[JP_PATH_MAX];
    int i = jp_lookup(c, body, "truncate_prompt_tokens");
    if (i >= 0) { /* vLLM cuts prompts to this length; kvbatch never cuts a prompt */
        jp_path_of(c, "truncate_prompt_tokens", path);
        return jp_fail(c, JOB_ERR_UNSUPPORTED_FIELD, path,
                       "field '%s' is not supported by kvbatch (prompts are never cut; a prompt too long for the "
                       "context is an error line)",
                       path);
    }
    i = jp_lookup(c, body, "mm_processor_kwargs");
    if (i >= 0) {
        jp_path_of(c, "mm_processor_kwargs", path);
        return jp_fail(c, JOB_ERR_UNSUPPORTED_FIELD, path, "field '%s' is not supported by kvbatch (text only)", path);
    }
    bool present;
    if ((rc = jp_get_string(c, body, "model", &r->model, NULL, &present))) return rc;
    if (present) r->given |= JOB_GIVEN_MODEL;
    r->max_tokens = 0;
    return 0;
}
