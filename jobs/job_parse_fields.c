/* job_parse_fields.c — the request fields of one line: messages, the
 * prompt, stop strings, the sampling fields (OpenAI's and vLLM's), logit
 * bias and the output form. See job_parse_internal.h for the helpers and
 * the return convention. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "jobs/job.h"
#include "jobs/job_parse_internal.h"

/* ---- messages and prompt ---------------------------------------------------------- */

static int parse_role(struct jp_ctx *c, int msg, const char *mpath, enum job_role *role)
{
    char path[JP_PATH_MAX];
    jp_path_sub(path, mpath, ".role");
    int i = json_get(c->j, msg, "role");
    if (i < 0) return jp_fail_missing(c, path);
    if (json_kind(c->j, i) != JSON_STRING) return jp_fail_type(c, path, "a string");
    static const struct {
        const char *name;
        enum job_role role;
    } roles[] = {
        {"system", JOB_ROLE_SYSTEM},
        {"user", JOB_ROLE_USER},
        {"assistant", JOB_ROLE_ASSISTANT},
        {"developer", JOB_ROLE_DEVELOPER},
    };
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        if (json_str_eq(c->j, i, roles[k].name)) {
            *role = roles[k].role;
            return 0;
        }
    }
    char got[48];
    jp_excerpt(c, i, got, sizeof got);
    return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                   "field '%s' must be one of system, user, assistant, developer (got '%s')", path, got);
}

/* content: a string, or an array of {"type":"text","text":…} parts joined
 * with "\n" (vLLM's rule, so results match a vLLM run of the same file). */
static int parse_content(struct jp_ctx *c, int msg, const char *mpath, enum job_role role, struct job_message *m)
{
    char path[JP_PATH_MAX];
    jp_path_sub(path, mpath, ".content");
    int i = json_get(c->j, msg, "content");
    if (i < 0) return jp_fail_missing(c, path);
    enum json_kind k = json_kind(c->j, i);
    if (k == JSON_NULL && role == JOB_ROLE_ASSISTANT) {
        /* an assistant turn that only called tools has null content */
        m->content = kvb_strndup("", 0);
        if (!m->content) return jp_fail_nomem(c);
        m->content_len = 0;
        return 0;
    }
    if (k == JSON_STRING) {
        if (json_str_dup(c->j, i, &m->content, &m->content_len) != KVB_OK) return jp_fail_nomem(c);
        return 0;
    }
    if (k != JSON_ARRAY) return jp_fail_type(c, path, "a string or an array of text parts");

    /* Two passes: check every part and size the result, then copy. */
    size_t total = 0;
    int nparts = c->j->tok[i].size, p = i + 1;
    for (int q = 0; q < nparts; q++) {
        char ppath[JP_PATH_MAX];
        jp_path_idx(ppath, path, q);
        if (json_kind(c->j, p) != JSON_OBJECT) return jp_fail_type(c, ppath, "an object");
        char tpath[JP_PATH_MAX];
        jp_path_sub(tpath, ppath, ".type");
        int ty = json_get(c->j, p, "type");
        if (ty < 0) return jp_fail_missing(c, tpath);
        if (json_kind(c->j, ty) != JSON_STRING) return jp_fail_type(c, tpath, "a string");
        if (!json_str_eq(c->j, ty, "text")) {
            char got[48];
            jp_excerpt(c, ty, got, sizeof got);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, tpath,
                           "field '%s' must be \"text\" (got '%s'; only text content is supported)", tpath, got);
        }
        jp_path_sub(tpath, ppath, ".text");
        int tx = json_get(c->j, p, "text");
        if (tx < 0) return jp_fail_missing(c, tpath);
        if (json_kind(c->j, tx) != JSON_STRING) return jp_fail_type(c, tpath, "a string");
        static const char *const part_fields[] = {"type", "text"};
        int rc = jp_check_members(c, p, ppath, part_fields, 2);
        if (rc) return rc;
        total += json_str_decode(c->j, tx, NULL) + (q > 0);
        p = json_skip(c->j, p);
    }
    char *buf = kvb_malloc(total + 1);
    if (!buf) return jp_fail_nomem(c);
    size_t o = 0;
    p = i + 1;
    for (int q = 0; q < nparts; q++) {
        if (q > 0) buf[o++] = '\n';
        o += json_str_decode(c->j, json_get(c->j, p, "text"), buf + o);
        p = json_skip(c->j, p);
    }
    buf[o] = '\0';
    m->content = buf;
    m->content_len = o;
    return 0;
}

/* A message is role and content; "name" is allowed and, as in the chat
 * templates kvbatch knows, not rendered; an assistant's "tool_calls" may be
 * an empty list and its "refusal" null. Anything else is refused. */
static int check_message_members(struct jp_ctx *c, int msg, const char *mpath)
{
    static const char *const names[] = {"role", "content", "name"};
    int k = msg + 1;
    for (int m = 0; m < c->j->tok[msg].size; m++, k = json_skip(c->j, k + 1)) {
        const int v = k + 1;
        const enum json_kind kind = json_kind(c->j, v);
        if ((json_str_eq(c->j, k, "tool_calls") &&
             (kind == JSON_NULL || (kind == JSON_ARRAY && c->j->tok[v].size == 0))) ||
            (json_str_eq(c->j, k, "refusal") && kind == JSON_NULL))
            continue;
        bool known = false;
        for (size_t f = 0; f < 3 && !known; f++) known = json_str_eq(c->j, k, names[f]);
        if (known) continue;
        char name[64], sub[JP_PATH_MAX], dotted[72];
        jp_key_name(c, k, name, sizeof name);
        snprintf(dotted, sizeof dotted, ".%s", name);
        jp_path_sub(sub, mpath, dotted);
        return jp_fail_unknown(c, sub, name,
                               !strcmp(name, "tool_calls") || !strcmp(name, "tool_call_id") ||
                                       !strcmp(name, "function_call")
                                   ? "no tool calling"
                                   : NULL);
    }
    if (json_get(c->j, msg, "name") >= 0 && json_kind(c->j, json_get(c->j, msg, "name")) != JSON_STRING) {
        char path[JP_PATH_MAX];
        jp_path_sub(path, mpath, ".name");
        return jp_fail_type(c, path, "a string");
    }
    return 0;
}

int jp_parse_messages(struct jp_ctx *c, int arr)
{
    char path[JP_PATH_MAX];
    jp_path_of(c, "messages", path);
    if (json_kind(c->j, arr) != JSON_ARRAY) return jp_fail_type(c, path, "an array of messages");
    int n = c->j->tok[arr].size;
    if (n == 0) return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
    c->r->messages = kvb_calloc((size_t)n, sizeof *c->r->messages);
    if (!c->r->messages) return jp_fail_nomem(c);
    int i = arr + 1;
    for (int k = 0; k < n; k++) {
        char mpath[JP_PATH_MAX];
        jp_path_idx(mpath, path, k);
        if (json_kind(c->j, i) != JSON_OBJECT) return jp_fail_type(c, mpath, "an object");
        struct job_message *m = &c->r->messages[k];
        int rc = parse_role(c, i, mpath, &m->role);
        if (rc) return rc;
        if ((rc = check_message_members(c, i, mpath))) return rc;
        rc = parse_content(c, i, mpath, m->role, m);
        if (rc) return rc;
        c->r->n_messages = (size_t)k + 1; /* only filled messages are freed */
        i = json_skip(c->j, i);
    }
    return 0;
}

/* A token-id prompt: array token i of integers >= 0 (checked against the
 * vocabulary later), at least one. */
static int parse_ids(struct jp_ctx *c, int i, const char *path, struct job_prompt *p)
{
    const int n = c->j->tok[i].size;
    if (n == 0)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be an empty list of token ids", path);
    p->ids = kvb_malloc(sizeof *p->ids * (size_t)n);
    if (!p->ids) return jp_fail_nomem(c);
    for (int k = 0, t = i + 1; k < n; k++, t++) {
        char ipath[JP_PATH_MAX];
        jp_path_idx(ipath, path, k);
        if (json_kind(c->j, t) != JSON_NUMBER) return jp_fail_type(c, ipath, "a token id (an integer)");
        const double v = jp_number_value(c, t);
        if (v != floor(v)) return jp_fail_type(c, ipath, "a token id (an integer)");
        if (!(v >= 0 && v <= INT32_MAX))
            return jp_fail(c, JOB_ERR_INVALID_VALUE, ipath, "field '%s' is not a token id (got %.17g)", ipath, v);
        p->ids[k] = (int32_t)v;
        p->n_ids = k + 1;
    }
    return 0;
}

/* prompt, as OpenAI's completions take it: a string, a list of strings, a
 * list of token ids, or a list of lists of token ids. Each prompt gets its
 * own n choices, written prompt by prompt. */
int jp_parse_prompt(struct jp_ctx *c, int i)
{
    struct job_request *r = c->r;
    char path[JP_PATH_MAX];
    jp_path_of(c, "prompt", path);
    const char *what = "a string, a list of strings, a list of token ids or a list of lists of token ids";
    enum json_kind k = json_kind(c->j, i);
    int n = 1, first = i;
    bool list = false, single_ids = false;
    if (k == JSON_ARRAY) {
        n = c->j->tok[i].size;
        if (n == 0) return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
        enum json_kind k0 = json_kind(c->j, i + 1);
        if (k0 == JSON_NUMBER) {
            single_ids = true; /* one prompt of token ids */
            n = 1;
        } else {
            list = true;
            first = i + 1;
        }
    } else if (k != JSON_STRING) {
        return jp_fail_type(c, path, what);
    }
    if (n > JOB_MAX_PROMPTS)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d prompts; at most %d are allowed", path, n,
                       JOB_MAX_PROMPTS);
    r->prompts = kvb_calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return jp_fail_nomem(c);
    enum json_kind want = list ? json_kind(c->j, first) : k;
    for (int q = 0, t = first; q < n; q++, t = json_skip(c->j, t)) {
        char ppath[JP_PATH_MAX];
        if (list) jp_path_idx(ppath, path, q);
        else jp_path_sub(ppath, path, "");
        r->n_prompts = q + 1; /* only filled prompts are freed */
        struct job_prompt *p = &r->prompts[q];
        const enum json_kind kt = json_kind(c->j, t);
        if (single_ids) {
            int rc = parse_ids(c, i, path, p);
            if (rc) return rc;
        } else if (kt != want || (kt != JSON_STRING && kt != JSON_ARRAY)) {
            /* a list holds prompts of one kind, as OpenAI's types say */
            return jp_fail_type(c, ppath, list ? (want == JSON_ARRAY ? "a list of token ids" : "a string") : what);
        } else if (kt == JSON_ARRAY) {
            int rc = parse_ids(c, t, ppath, p);
            if (rc) return rc;
        } else if (json_str_dup(c->j, t, &p->text, &p->text_len) != KVB_OK) {
            return jp_fail_nomem(c);
        }
    }
    r->prompt = r->prompts[0].text;
    r->prompt_len = r->prompts[0].text_len;
    return 0;
}

static int parse_stop(struct jp_ctx *c, int obj)
{
    int i = jp_lookup(c, obj, "stop");
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, "stop", path);
    struct job_request *r = c->r;
    enum json_kind k = json_kind(c->j, i);
    int first, n;
    if (k == JSON_STRING) {
        first = i;
        n = 1;
    } else if (k == JSON_ARRAY) {
        first = i + 1;
        n = c->j->tok[i].size;
        if (n > JOB_MAX_STOP)
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d strings; at most %d are allowed", path,
                           n, JOB_MAX_STOP);
    } else {
        return jp_fail_type(c, path, "a string or an array of strings");
    }
    for (int q = 0, t = first; q < n; q++, t++) {
        char spath[JP_PATH_MAX];
        if (k == JSON_ARRAY) jp_path_idx(spath, path, q);
        else jp_path_sub(spath, path, "");
        if (json_kind(c->j, t) != JSON_STRING) return jp_fail_type(c, spath, "a string");
        if (c->j->tok[t].end == c->j->tok[t].start)
            return jp_fail(c, JOB_ERR_INVALID_VALUE, spath, "field '%s' must not be an empty string", spath);
        if (json_str_dup(c->j, t, &r->stop[q], &r->stop_len[q]) != KVB_OK) return jp_fail_nomem(c);
        r->n_stop = q + 1;
    }
    r->given |= JOB_GIVEN_STOP;
    return 0;
}

/* ---- sampling fields ------------------------------------------------------------- */

/* stop_token_ids: a list of token ids (checked against the vocabulary by the
 * caller); duplicates are harmless. */
static int parse_stop_token_ids(struct jp_ctx *c, int obj)
{
    struct job_request *r = c->r;
    int i = jp_lookup(c, obj, "stop_token_ids");
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, "stop_token_ids", path);
    if (json_kind(c->j, i) != JSON_ARRAY) return jp_fail_type(c, path, "a list of token ids");
    const int n = c->j->tok[i].size;
    if (n > JOB_MAX_STOP_TOKEN_IDS)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d ids; at most %d are allowed", path, n,
                       JOB_MAX_STOP_TOKEN_IDS);
    r->given |= JOB_GIVEN_STOP_TOKEN_IDS;
    if (n == 0) return 0;
    struct job_prompt ids = {0};
    int rc = parse_ids(c, i, path, &ids);
    r->stop_token_ids = ids.ids;
    r->n_stop_token_ids = ids.n_ids;
    return rc;
}

/* vLLM's extensions to the sampling fields and chat's templating switches
 * (see job_request). */
static int parse_vllm(struct jp_ctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[JP_PATH_MAX];
    bool present;
    int rc;
    if ((rc = jp_get_bool(c, obj, "ignore_eos", &r->ignore_eos, NULL))) return rc;
    int64_t v;
    if ((rc = jp_get_int(c, obj, "min_tokens", 0, INT32_MAX, &v, &present))) return rc;
    if (present) {
        if (v > r->max_tokens) {
            jp_path_of(c, "min_tokens", path);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' (%lld) must not exceed max_tokens (%d%s)", path,
                           (long long)v, r->max_tokens, r->given & JOB_GIVEN_MAX_TOKENS ? "" : ", the default");
        }
        r->min_tokens = (int32_t)v;
        r->given |= JOB_GIVEN_MIN_TOKENS;
    }
    if ((rc = parse_stop_token_ids(c, obj))) return rc;
    if ((rc = jp_get_bool(c, obj, "include_stop_str_in_output", &r->include_stop_str_in_output, NULL))) return rc;
    if ((rc = jp_get_bool(c, obj, "skip_special_tokens", &r->skip_special_tokens, NULL))) return rc;
    /* spaces_between_special_tokens: special tokens' texts are joined with
     * no spaces whatever its value, as fast tokenizers (and so vLLM with
     * one) do; read for its type only. */
    bool spaces = true;
    if ((rc = jp_get_bool(c, obj, "spaces_between_special_tokens", &spaces, NULL))) return rc;
    bool beam = false;
    if ((rc = jp_get_bool(c, obj, "use_beam_search", &beam, NULL))) return rc;
    if (beam) {
        jp_path_of(c, "use_beam_search", path);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': beam search is not supported by kvbatch", path);
    }
    if (r->url != JOB_URL_CHAT) return 0;
    if ((rc = jp_get_bool(c, obj, "add_generation_prompt", &r->add_generation_prompt, NULL))) return rc;
    if ((rc = jp_get_bool(c, obj, "continue_final_message", &r->continue_final_message, NULL))) return rc;
    if (r->continue_final_message) {
        jp_path_of(c, "continue_final_message", path);
        if (r->add_generation_prompt)
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                           "field '%s' needs \"add_generation_prompt\": false (the final message is continued, "
                           "not answered)",
                           path);
        if (r->messages[r->n_messages - 1].role != JOB_ROLE_ASSISTANT)
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                           "field '%s' needs the last message to be the assistant's (the one to continue)", path);
    }
    /* chat_template: the request's own Jinja text (JSON null: none) */
    const int t = jp_lookup(c, obj, "chat_template");
    if (t >= 0 && json_kind(c->j, t) != JSON_NULL &&
        (rc = jp_get_string(c, obj, "chat_template", &r->chat_template, &r->chat_template_len, NULL)))
        return rc;
    /* chat_template_kwargs: kept as written; the template decides what its
     * members mean, and the engine refuses the names it reserves */
    const int k = jp_lookup(c, obj, "chat_template_kwargs");
    if (k >= 0 && json_kind(c->j, k) != JSON_NULL) {
        jp_path_of(c, "chat_template_kwargs", path);
        if (json_kind(c->j, k) != JSON_OBJECT) return jp_fail_type(c, path, "an object");
        const int from = c->j->tok[k].start, to = c->j->tok[k].end;
        r->chat_template_kwargs_len = (size_t)(to - from);
        r->chat_template_kwargs = kvb_strndup(c->j->src + from, r->chat_template_kwargs_len);
        if (!r->chat_template_kwargs) return jp_fail_nomem(c);
    }
    return 0;
}

int jp_parse_sampling(struct jp_ctx *c, int obj)
{
    struct job_request *r = c->r;
    int64_t v;
    bool present;
    int rc;

    /* max_completion_tokens is OpenAI's newer name; when both are given it
     * wins, as in vLLM. 0 scores the prompt without generating, for a
     * request that asks for prompt scores (lm-evaluation-harness sends it
     * with echo); the fields themselves are read with the output form. */
    const int ie = jp_lookup(c, obj, "echo"), ip = jp_lookup(c, obj, "prompt_logprobs");
    const bool scoring = (r->url == JOB_URL_COMPLETION && ie >= 0 && json_kind(c->j, ie) == JSON_TRUE) ||
                         (ip >= 0 && json_kind(c->j, ip) != JSON_NULL);
    const int64_t lo = scoring ? 0 : 1;
    rc = jp_get_int(c, obj, "max_tokens", lo, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present) {
        r->max_tokens = (int32_t)v;
        r->given |= JOB_GIVEN_MAX_TOKENS;
    }
    rc = jp_get_int(c, obj, "max_completion_tokens", lo, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present) {
        r->max_tokens = (int32_t)v;
        r->given |= JOB_GIVEN_MAX_TOKENS;
    }

    if ((rc = jp_get_float(c, obj, "temperature", 0.0, false, 2.0, &r->temperature, JOB_GIVEN_TEMPERATURE))) return rc;
    if ((rc = jp_get_float(c, obj, "top_p", 0.0, true, 1.0, &r->top_p, JOB_GIVEN_TOP_P))) return rc;

    /* top_k: vLLM clients send -1 for "off"; it means the same as 0 here. */
    rc = jp_get_int(c, obj, "top_k", -1, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present) {
        r->top_k = v < 0 ? 0 : (int32_t)v;
        r->given |= JOB_GIVEN_TOP_K;
    }
    if ((rc = jp_get_float(c, obj, "min_p", 0.0, false, 1.0, &r->min_p, JOB_GIVEN_MIN_P))) return rc;
    if ((rc = jp_get_seed(c, obj))) return rc;
    if ((rc = parse_stop(c, obj))) return rc;
    if ((rc = jp_get_float(c, obj, "presence_penalty", -2.0, false, 2.0, &r->presence_penalty,
                           JOB_GIVEN_PRESENCE_PENALTY)))
        return rc;
    if ((rc = jp_get_float(c, obj, "frequency_penalty", -2.0, false, 2.0, &r->frequency_penalty,
                           JOB_GIVEN_FREQUENCY_PENALTY)))
        return rc;
    /* repetition_penalty divides logits, so 0 and below make no sense; above
     * 2 the output is unreadable, and a cap catches a misplaced field. */
    if ((rc = jp_get_float(c, obj, "repetition_penalty", 0.0, true, 2.0, &r->repetition_penalty,
                           JOB_GIVEN_REPETITION_PENALTY)))
        return rc;

    rc = jp_get_int(c, obj, "n", 1, JOB_MAX_N, &v, &present);
    if (rc) return rc;
    if (present) {
        r->n = (int32_t)v;
        r->given |= JOB_GIVEN_N;
    }

    char path[JP_PATH_MAX];
    jp_path_of(c, "logprobs", path);
    int lp = jp_lookup(c, obj, "logprobs");
    if (r->url == JOB_URL_CHAT) {
        /* chat: "logprobs": bool, "top_logprobs": 0..20 (needs logprobs true) */
        if (lp >= 0) {
            enum json_kind k = json_kind(c->j, lp);
            if (k != JSON_TRUE && k != JSON_FALSE) return jp_fail_type(c, path, "a boolean");
            r->logprobs = k == JSON_TRUE;
            r->given |= JOB_GIVEN_LOGPROBS;
        }
        rc = jp_get_int(c, obj, "top_logprobs", 0, JOB_MAX_TOP_LOGPROBS, &v, &present);
        if (rc) return rc;
        if (present) {
            if (!r->logprobs) {
                jp_path_of(c, "top_logprobs", path);
                return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' needs \"logprobs\": true", path);
            }
            r->top_logprobs = (int32_t)v;
            r->given |= JOB_GIVEN_TOP_LOGPROBS;
        }
    } else {
        /* completions: "logprobs": k asks for the chosen token's logprob and
         * the k most likely alternatives. */
        rc = jp_get_int(c, obj, "logprobs", 0, JOB_MAX_TOP_LOGPROBS, &v, &present);
        if (rc) return rc;
        if (present) {
            r->logprobs = true;
            r->top_logprobs = (int32_t)v;
            r->given |= JOB_GIVEN_LOGPROBS | JOB_GIVEN_TOP_LOGPROBS;
        }
    }
    return parse_vllm(c, obj);
}

/* logit_bias: {"token id": bias in [-100, 100], …}, at most
 * JOB_MAX_LOGIT_BIAS entries; a repeated id keeps its last bias. Ids are
 * checked against the vocabulary by the caller, who knows it. */
static int parse_logit_bias(struct jp_ctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[JP_PATH_MAX], sub[JP_PATH_MAX];
    jp_path_of(c, "logit_bias", path);
    int i = jp_lookup(c, obj, "logit_bias");
    if (i < 0) return 0;
    if (json_kind(c->j, i) != JSON_OBJECT) return jp_fail_type(c, path, "an object of token ids and biases");
    const int n = c->j->tok[i].size;
    if (n > JOB_MAX_LOGIT_BIAS)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' has %d entries, more than %d", path, n,
                       JOB_MAX_LOGIT_BIAS);
    if (n == 0) return 0;
    r->logit_bias = kvb_malloc(sizeof *r->logit_bias * (size_t)n);
    if (!r->logit_bias) return jp_fail_nomem(c);
    int k = i + 1;
    for (int m = 0; m < n; m++, k = json_skip(c->j, k + 1)) {
        char key[16] = "";
        /* the decoded length: raw bytes that are not UTF-8 decode to three each */
        const size_t klen = json_str_decode(c->j, k, NULL);
        if (klen > 0 && klen < sizeof key) json_str_decode(c->j, k, key);
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || *end || id > INT32_MAX) { /* digits only: strtol takes " +5" */
            char got[48];
            jp_excerpt(c, k, got, sizeof got);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': key '%s' is not a token id", path, got);
        }
        char dotted[sizeof key + 1];
        snprintf(dotted, sizeof dotted, ".%s", key);
        jp_path_sub(sub, path, dotted);
        if (json_kind(c->j, k + 1) != JSON_NUMBER) return jp_fail_type(c, sub, "a number");
        const double v = jp_number_value(c, k + 1);
        if (!(v >= -100.0 && v <= 100.0))
            return jp_fail(c, JOB_ERR_INVALID_VALUE, sub, "field '%s' must be in [-100, 100]", sub);
        int at = 0;
        while (at < r->n_logit_bias && r->logit_bias[at].token != (int32_t)id) at++;
        r->logit_bias[at] = (struct job_logit_bias){(int32_t)id, (float)v};
        if (at == r->n_logit_bias) r->n_logit_bias++;
    }
    r->given |= JOB_GIVEN_LOGIT_BIAS;
    return 0;
}

/* response_format, logit_bias, and the fields kvbatch implements only at
 * their no-op values, refused by name otherwise: tools and functions (tool
 * calls; tool_choice and function_call only "none" or "auto"), echo, suffix
 * and a best_of above n. Which fields exist at all is check_body_fields'. */
/* response_format: json_object or json_schema (its schema kept as written), or text. */
static int parse_response_format(struct jp_ctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[JP_PATH_MAX], sub[JP_PATH_MAX];
    int i = jp_lookup(c, obj, "response_format");
    if (i >= 0) {
        jp_path_of(c, "response_format", path);
        if (json_kind(c->j, i) != JSON_OBJECT) return jp_fail_type(c, path, "an object");
        static const char *const rf_fields[] = {"type", "json_schema"};
        int rc = jp_check_members(c, i, path, rf_fields, 2);
        if (rc) return rc;
        jp_path_sub(sub, path, ".type");
        int t = json_get(c->j, i, "type");
        if (t < 0) return jp_fail_missing(c, sub);
        if (json_kind(c->j, t) != JSON_STRING) return jp_fail_type(c, sub, "a string");
        if (json_str_eq(c->j, t, "json_object")) {
            if ((rc = jp_claim_constraint(c, path, JOB_CONSTRAINT_JSON))) return rc;
            r->json_object = true;
            r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        } else if (json_str_eq(c->j, t, "json_schema")) {
            char js_path[JP_PATH_MAX], sc_path[JP_PATH_MAX];
            jp_path_sub(js_path, path, ".json_schema");
            const int js = jp_lookup(c, i, "json_schema");
            if (js < 0) return jp_fail_missing(c, js_path);
            if (json_kind(c->j, js) != JSON_OBJECT) return jp_fail_type(c, js_path, "an object");
            /* name, description and strict describe the schema to OpenAI's
             * models; kvbatch always holds the output to it */
            static const char *const js_fields[] = {"name", "description", "schema", "strict"};
            if ((rc = jp_check_members(c, js, js_path, js_fields, 4))) return rc;
            jp_path_sub(sc_path, js_path, ".schema");
            const int sc = jp_lookup(c, js, "schema");
            if (sc < 0) return jp_fail_missing(c, sc_path);
            if ((rc = jp_claim_constraint(c, sc_path, JOB_CONSTRAINT_JSON))) return rc;
            /* kept as written, whatever it is: the engine compiles it and
             * names what it refuses (gschema_to_gbnf), so the job
             * format needs to know nothing of what a schema constrains */
            const int quote = json_kind(c->j, sc) == JSON_STRING; /* jsmn's span leaves out the quotes */
            const int from = c->j->tok[sc].start - quote, to = c->j->tok[sc].end + quote;
            r->json_schema_len = (size_t)(to - from);
            r->json_schema = kvb_strndup(c->j->src + from, r->json_schema_len);
            if (!r->json_schema) return jp_fail_nomem(c);
            r->json_object = true;
            r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        } else if (!json_str_eq(c->j, t, "text")) {
            char got[48];
            jp_excerpt(c, t, got, sizeof got);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, sub,
                           "field '%s' must be \"text\", \"json_object\" or \"json_schema\" (got '%s')", sub, got);
        }
    }
    return 0;
}

int jp_parse_output_form(struct jp_ctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[JP_PATH_MAX];
    int i;
    int crc = parse_response_format(c, obj);
    if (!crc) crc = jp_parse_constraints(c, obj);
    if (crc) return crc;
    static const char *const tool_fields[] = {"tools", "functions"};
    for (int k = 0; k < 2; k++) {
        i = jp_lookup(c, obj, tool_fields[k]);
        if (i >= 0 && !(json_kind(c->j, i) == JSON_ARRAY && c->j->tok[i].size == 0)) {
            jp_path_of(c, tool_fields[k], path);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': tool calling is not supported by kvbatch",
                           path);
        }
    }
    /* With no tools there is nothing to call: "none" and "auto" mean the same */
    static const char *const choice_fields[] = {"tool_choice", "function_call"};
    for (int k = 0; k < 2; k++) {
        i = jp_lookup(c, obj, choice_fields[k]);
        if (i >= 0 &&
            !(json_kind(c->j, i) == JSON_STRING && (json_str_eq(c->j, i, "none") || json_str_eq(c->j, i, "auto")))) {
            jp_path_of(c, choice_fields[k], path);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                           "field '%s': tool calling is not supported by kvbatch (only \"none\" or \"auto\")", path);
        }
    }
    int rc = parse_logit_bias(c, obj);
    if (rc) return rc;
    i = jp_lookup(c, obj, "echo");
    if (i >= 0 && r->url == JOB_URL_COMPLETION) {
        bool present;
        if ((rc = jp_get_bool(c, obj, "echo", &r->echo, &present))) return rc;
        if (r->echo) r->given |= JOB_GIVEN_ECHO;
    } else if (i >= 0 && json_kind(c->j, i) != JSON_FALSE) { /* vLLM's chat echo repeats the last message */
        jp_path_of(c, "echo", path);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                       "field '%s' is not supported by kvbatch on chat requests (only false)", path);
    }
    i = jp_lookup(c, obj, "prompt_logprobs");
    if (i >= 0 && json_kind(c->j, i) != JSON_NULL) {
        int64_t k;
        bool present;
        if ((rc = jp_get_int(c, obj, "prompt_logprobs", 0, JOB_MAX_TOP_LOGPROBS, &k, &present))) return rc;
        r->prompt_logprobs = (int32_t)k;
        r->given |= JOB_GIVEN_PROMPT_LOGPROBS;
    }
    i = jp_lookup(c, obj, "suffix");
    if (i >= 0 && !(json_kind(c->j, i) == JSON_STRING && json_str_eq(c->j, i, ""))) {
        jp_path_of(c, "suffix", path);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' (insertion) is not supported by kvbatch", path);
    }
    int64_t v;
    bool present;
    rc = jp_get_int(c, obj, "best_of", 1, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present && v > r->n) {
        jp_path_of(c, "best_of", path);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                       "field '%s' above n is not supported by kvbatch (it returns every choice it makes)", path);
    }
    if (r->ignore_eos && r->constraint != JOB_CONSTRAINT_NONE) {
        jp_path_of(c, "ignore_eos", path);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                       "field '%s' cannot go with '%s': a constrained output ends where its grammar does", path,
                       r->constraint_param);
    }
    return 0;
}
