/* job_parse.c — one JSONL input line → struct job_request, or a job_error
 * that names the line number and the field.
 *
 * The order of checks decides which error a line with several faults gets:
 * JSON syntax, then the top-level shape (object, custom_id, method, url,
 * body), then the prompt (messages or prompt), then sampling fields in the
 * order of the table below. custom_id is read first so that error lines can
 * carry it. Defaults and ranges are documented in job.h; the fields
 * themselves are read in job_parse_fields.c. */
#include "jobs/job.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "jobs/job_parse_internal.h"

void job_error_setf(struct job_error *e, const char *code, uint64_t line_no, const char *param, const char *fmt, ...)
{
    if (!e) return;
    e->code = code;
    e->line_no = line_no;
    e->by_line = false;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    int k = snprintf(e->message, sizeof e->message, "line %llu: ", (unsigned long long)line_no);
    if (k < 0 || (size_t)k >= sizeof e->message) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message + k, sizeof e->message - (size_t)k, fmt, ap);
    va_end(ap);
}

const char *job_role_name(enum job_role r)
{
    switch (r) {
    case JOB_ROLE_SYSTEM: return "system";
    case JOB_ROLE_USER: return "user";
    case JOB_ROLE_ASSISTANT: return "assistant";
    case JOB_ROLE_DEVELOPER: return "developer";
    }
    return "?";
}

void job_request_free(struct job_request *r)
{
    if (!r) return;
    kvb_free(r->custom_id);
    kvb_free(r->custom_id_json);
    kvb_free(r->model);
    for (size_t i = 0; i < r->n_messages; i++) kvb_free(r->messages[i].content);
    kvb_free(r->messages);
    for (int32_t i = 0; i < r->n_prompts; i++) {
        kvb_free(r->prompts[i].text);
        kvb_free(r->prompts[i].ids);
    }
    kvb_free(r->prompts);
    kvb_free(r->stop_token_ids);
    for (int i = 0; i < r->n_stop; i++) kvb_free(r->stop[i]);
    kvb_free(r->logit_bias);
    kvb_free(r->json_schema);
    kvb_free(r->constraint_text);
    kvb_free(r->chat_template);
    kvb_free(r->chat_template_kwargs);
    memset(r, 0, sizeof *r);
}

static void request_defaults(struct job_request *r, uint64_t line_no)
{
    memset(r, 0, sizeof *r);
    r->line_no = line_no;
    r->max_tokens = JOB_DEFAULT_MAX_TOKENS;
    r->prompt_logprobs = -1;
    r->temperature = JOB_DEFAULT_TEMPERATURE;
    r->top_p = JOB_DEFAULT_TOP_P;
    r->top_k = 0;
    r->min_p = 0.0f;
    r->seed = JOB_DEFAULT_SEED;
    r->presence_penalty = 0.0f;
    r->frequency_penalty = 0.0f;
    r->repetition_penalty = 1.0f;
    r->n = 1;
    r->skip_special_tokens = true;
    r->add_generation_prompt = true;
}

/* ---- parse context and error helpers ------------------------------------------ */

/* out = base + suffix, cut to fit (paths only label errors). out may not
 * alias base. */
void jp_path_sub(char *out, const char *base, const char *suffix)
{
    size_t n = strnlen(base, JP_PATH_MAX - 1), m = strlen(suffix);
    if (m > JP_PATH_MAX - 1 - n) m = JP_PATH_MAX - 1 - n;
    memcpy(out, base, n);
    memcpy(out + n, suffix, m);
    out[n + m] = '\0';
}

void jp_path_idx(char *out, const char *base, int k)
{
    char sfx[16];
    snprintf(sfx, sizeof sfx, "[%d]", k);
    jp_path_sub(out, base, sfx);
}

void jp_path_of(const struct jp_ctx *c, const char *name, char *out) { jp_path_sub(out, c->prefix, name); }

int jp_fail(struct jp_ctx *c, const char *code, const char *param, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    job_error_setf(c->err, code, c->line, param, "%s", msg);
    return -1;
}

int jp_fail_type(struct jp_ctx *c, const char *path, const char *what)
{
    return jp_fail(c, JOB_ERR_INVALID_TYPE, path, "field '%s' must be %s", path, what);
}

int jp_fail_missing(struct jp_ctx *c, const char *path)
{
    return jp_fail(c, JOB_ERR_MISSING_FIELD, path, "missing field '%s'", path);
}

int jp_fail_nomem(struct jp_ctx *c)
{
    job_error_setf(c->err, JOB_ERR_SERVER, c->line, NULL, "out of memory while reading the line");
    return -2;
}

/* A short excerpt of token i's raw text for messages ("got '…'"). */
void jp_excerpt(const struct jp_ctx *c, int i, char *out, size_t cap)
{
    const jsmntok_t *t = &c->j->tok[i];
    size_t n = (size_t)(t->end - t->start);
    if (n + 1 > cap) {
        n = cap - 4;
        memcpy(out, c->j->src + t->start, n);
        memcpy(out + n, "...", 4);
        return;
    }
    memcpy(out, c->j->src + t->start, n);
    out[n] = '\0';
}

/* ---- typed field readers -------------------------------------------------------- */

/* Reads number token i as a double, in place: the syntax pass guarantees a
 * well-formed number, and inside an object it is always followed by ',',
 * '}', ']' or whitespace, none of which can extend a number for strtod, so
 * strtod stops exactly at the token's end without a NUL-terminated copy. */
double jp_number_value(const struct jp_ctx *c, int i) { return strtod(c->j->src + c->j->tok[i].start, NULL); }

/* The value token of `name` in object `obj`, or -1 when absent or null
 * (null means "not given", job.h). */
int jp_lookup(const struct jp_ctx *c, int obj, const char *name)
{
    int i = json_get(c->j, obj, name);
    if (i >= 0 && json_kind(c->j, i) == JSON_NULL) return -1;
    return i;
}

int jp_get_float(struct jp_ctx *c, int obj, const char *name, double lo, bool lo_open, double hi, float *out,
                 uint32_t given_bit)
{
    int i = jp_lookup(c, obj, name);
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, name, path);
    if (json_kind(c->j, i) != JSON_NUMBER) return jp_fail_type(c, path, "a number");
    double v = jp_number_value(c, i);
    /* Range-check the double first (a huge double cast to float is undefined),
     * then the float itself: 1e-50 is > 0 but becomes 0.0f. */
    bool in = (lo_open ? v > lo : v >= lo) && v <= hi;
    float f = in ? (float)v : 0.0f;
    if (in && lo_open && !(f > (float)lo)) in = false;
    if (!in) {
        char got[48];
        jp_excerpt(c, i, got, sizeof got);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be in %c%g, %g] (got %s)", path,
                       lo_open ? '(' : '[', lo, hi, got);
    }
    *out = f;
    c->r->given |= given_bit;
    return 0;
}

/* Integer fields accept any JSON number with an integral value (16, 16.0,
 * 1.6e1), as lenient OpenAI-compatible servers do; 16.5 is a type error. */
int jp_get_int(struct jp_ctx *c, int obj, const char *name, int64_t lo, int64_t hi, int64_t *out, bool *present)
{
    *present = false;
    int i = jp_lookup(c, obj, name);
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, name, path);
    if (json_kind(c->j, i) != JSON_NUMBER) return jp_fail_type(c, path, "an integer");
    double v = jp_number_value(c, i);
    if (isfinite(v) && v != floor(v)) return jp_fail_type(c, path, "an integer");
    if (!(v >= (double)lo && v <= (double)hi)) {
        char got[48];
        jp_excerpt(c, i, got, sizeof got);
        if (hi == INT32_MAX)
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be at least %lld (got %s)", path,
                           (long long)lo, got);
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be between %lld and %lld (got %s)", path,
                       (long long)lo, (long long)hi, got);
    }
    *out = (int64_t)v;
    *present = true;
    return 0;
}

/* The seed: any integer in [-2^63, 2^64), read exactly (a double would lose
 * the low bits of a large seed and change the sample). */
int jp_get_seed(struct jp_ctx *c, int obj)
{
    int i = jp_lookup(c, obj, "seed");
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, "seed", path);
    if (json_kind(c->j, i) != JSON_NUMBER) return jp_fail_type(c, path, "an integer");
    const jsmntok_t *t = &c->j->tok[i];
    const char *s = c->j->src + t->start;
    size_t n = (size_t)(t->end - t->start);
    bool plain = true;
    for (size_t k = (s[0] == '-'); k < n; k++)
        if (s[k] < '0' || s[k] > '9') plain = false;
    if (!plain) {
        /* 42.0 or 4.2e1: integral doubles are fine, and exact below 2^53 */
        double v = jp_number_value(c, i);
        if (!isfinite(v) || v != floor(v)) return jp_fail_type(c, path, "an integer");
        if (!(v >= -9007199254740992.0 && v <= 9007199254740992.0))
            return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be written as plain digits when this large",
                           path);
        c->r->seed = (uint64_t)(int64_t)v;
        c->r->given |= JOB_GIVEN_SEED;
        return 0;
    }
    char buf[32];
    if (n >= sizeof buf) goto range;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    if (buf[0] == '-') {
        long long v = strtoll(buf, NULL, 10);
        if (errno) goto range;
        c->r->seed = (uint64_t)v;
    } else {
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno) goto range;
        c->r->seed = (uint64_t)v;
    }
    c->r->given |= JOB_GIVEN_SEED;
    return 0;
range:
    return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must fit in 64 bits", path);
}

int jp_get_bool(struct jp_ctx *c, int obj, const char *name, bool *out, bool *present)
{
    if (present) *present = false;
    int i = jp_lookup(c, obj, name);
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, name, path);
    enum json_kind k = json_kind(c->j, i);
    if (k != JSON_TRUE && k != JSON_FALSE) return jp_fail_type(c, path, "a boolean");
    *out = k == JSON_TRUE;
    if (present) *present = true;
    return 0;
}

int jp_get_string(struct jp_ctx *c, int obj, const char *name, char **out, size_t *out_len, bool *present)
{
    if (present) *present = false;
    int i = jp_lookup(c, obj, name);
    if (i < 0) return 0;
    char path[JP_PATH_MAX];
    jp_path_of(c, name, path);
    if (json_kind(c->j, i) != JSON_STRING) return jp_fail_type(c, path, "a string");
    if (json_str_dup(c->j, i, out, out_len) != KVB_OK) return jp_fail_nomem(c);
    if (present) *present = true;
    return 0;
}

/* ---- which fields exist --------------------------------------------------------------- */

enum { F_CHAT = 1, F_COMP = 2, F_BOTH = 3 };

/* Every body field kvbatch reads, and for which endpoints. */
static const struct {
    const char *name;
    unsigned where;
} body_fields[] = {
    {"messages", F_CHAT},
    {"prompt", F_COMP},
    {"model", F_BOTH},
    {"max_tokens", F_BOTH},
    {"max_completion_tokens", F_BOTH},
    {"temperature", F_BOTH},
    {"top_p", F_BOTH},
    {"top_k", F_BOTH},
    {"min_p", F_BOTH},
    {"seed", F_BOTH},
    {"stop", F_BOTH},
    {"presence_penalty", F_BOTH},
    {"frequency_penalty", F_BOTH},
    {"repetition_penalty", F_BOTH},
    {"n", F_BOTH},
    {"logprobs", F_BOTH},
    {"top_logprobs", F_CHAT},
    {"response_format", F_BOTH},
    {"structured_outputs", F_BOTH},
    {"guided_json", F_BOTH},
    {"guided_regex", F_BOTH},
    {"guided_choice", F_BOTH},
    {"guided_grammar", F_BOTH},
    {"logit_bias", F_BOTH},
    {"best_of", F_BOTH},
    {"echo", F_BOTH},
    {"suffix", F_COMP},
    {"tools", F_CHAT},
    {"functions", F_CHAT},
    {"tool_choice", F_CHAT},
    {"function_call", F_CHAT},
    {"ignore_eos", F_BOTH},
    {"min_tokens", F_BOTH},
    {"stop_token_ids", F_BOTH},
    {"prompt_logprobs", F_BOTH},
    {"include_stop_str_in_output", F_BOTH},
    {"skip_special_tokens", F_BOTH},
    {"spaces_between_special_tokens", F_BOTH},
    {"use_beam_search", F_BOTH},
    {"add_generation_prompt", F_CHAT},
    {"continue_final_message", F_CHAT},
    {"chat_template", F_CHAT},
    {"chat_template_kwargs", F_CHAT},
};

/* Fields that mean nothing to an offline batch (how a reply is delivered,
 * who asked, how a server should queue or bill it). Kept short on purpose:
 * anything that could change the output is read or refused instead. */
static const char *const ignored_fields[] = {
    "stream",
    "stream_options",
    "user",
    "store",
    "metadata",
    "service_tier",
    "priority",
    "prompt_cache_key",
    "safety_identifier",
    "parallel_tool_calls",
    "cache_salt",
};

bool job_field_ignored(const char *name)
{
    for (size_t k = 0; k < sizeof ignored_fields / sizeof ignored_fields[0]; k++)
        if (strcmp(name, ignored_fields[k]) == 0) return true;
    return false;
}

/* Why a few well-known fields are refused, for a message that helps. */
static const char *refusal_hint(const char *name)
{
    static const struct {
        const char *name, *hint;
    } hints[] = {
        {"guided_decoding_backend", "kvbatch has one constrained-decoding engine"},
        {"guided_whitespace_pattern", "JSON outputs follow kvbatch's whitespace policy (README)"},
        {"truncate_prompt_tokens", "prompts are never cut; a prompt too long for --ctx is an error line"},
    };
    for (size_t k = 0; k < sizeof hints / sizeof hints[0]; k++)
        if (strcmp(name, hints[k].name) == 0) return hints[k].hint;
    return NULL;
}

/* The key of object member token k (a string), decoded into buf for
 * comparison; an over-long key is cut (it matches no field then). */
void jp_key_name(const struct jp_ctx *c, int k, char *buf, size_t cap)
{
    const size_t n = json_str_decode(c->j, k, NULL);
    if (n + 1 > cap) {
        memcpy(buf, "(a long key)", 13);
        return;
    }
    json_str_decode(c->j, k, buf);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = '?';
}

int jp_fail_unknown(struct jp_ctx *c, const char *path, const char *name, const char *extra)
{
    const char *hint = extra ? extra : refusal_hint(name);
    return jp_fail(c, JOB_ERR_UNSUPPORTED_FIELD, path, "field '%s' is not supported by kvbatch (%s)", path,
                   hint ? hint : "README: Request fields lists those that are");
}

/* Refuses any member of the body (or the shorthand's top level, which also
 * holds custom_id, method and url) that kvbatch does not read and does not
 * ignore on purpose. */
static int check_body_fields(struct jp_ctx *c, int obj)
{
    const struct job_request *r = c->r;
    const unsigned mine = r->url == JOB_URL_CHAT ? F_CHAT : F_COMP;
    int k = obj + 1;
    for (int m = 0; m < c->j->tok[obj].size; m++, k = json_skip(c->j, k + 1)) {
        char name[64], path[JP_PATH_MAX];
        jp_key_name(c, k, name, sizeof name);
        if (r->shorthand && (!strcmp(name, "custom_id") || !strcmp(name, "method") || !strcmp(name, "url"))) continue;
        if (job_field_ignored(name)) continue;
        unsigned where = 0;
        for (size_t f = 0; f < sizeof body_fields / sizeof body_fields[0] && !where; f++)
            if (!strcmp(name, body_fields[f].name)) where = body_fields[f].where;
        if (where & mine) continue;
        jp_path_of(c, name, path);
        if (where)
            return jp_fail(c, JOB_ERR_UNSUPPORTED_FIELD, path, "field '%s' belongs to %s, not %s", path,
                           where == F_CHAT ? "/v1/chat/completions" : "/v1/completions",
                           mine == F_CHAT ? "/v1/chat/completions" : "/v1/completions");
        return jp_fail_unknown(c, path, name, NULL);
    }
    return 0;
}

/* Refuses members of object token obj (at path) outside names[n]. */
int jp_check_members(struct jp_ctx *c, int obj, const char *path, const char *const *names, size_t n)
{
    int k = obj + 1;
    for (int m = 0; m < c->j->tok[obj].size; m++, k = json_skip(c->j, k + 1)) {
        char name[64], sub[JP_PATH_MAX], dotted[72];
        jp_key_name(c, k, name, sizeof name);
        bool known = false;
        for (size_t f = 0; f < n && !known; f++) known = !strcmp(name, names[f]);
        if (known) continue;
        snprintf(dotted, sizeof dotted, "%s%s", path[0] ? "." : "", name);
        jp_path_sub(sub, path, dotted);
        return jp_fail_unknown(c, sub, name, NULL);
    }
    return 0;
}

/* ---- the line ------------------------------------------------------------------------ */

static int parse_root(struct jp_ctx *c)
{
    const struct json_doc *j = c->j;
    struct job_request *r = c->r;
    if (json_kind(j, 0) != JSON_OBJECT)
        return jp_fail(c, JOB_ERR_INVALID_REQUEST, NULL, "the line must be a JSON object");

    int i = json_get(j, 0, "custom_id");
    if (i < 0 || json_kind(j, i) == JSON_NULL) return jp_fail_missing(c, "custom_id");
    if (json_kind(j, i) != JSON_STRING) return jp_fail_type(c, "custom_id", "a string");
    if (j->tok[i].end == j->tok[i].start)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, "custom_id", "field 'custom_id' must not be empty");
    enum kvb_status st = json_str_dup_exact(j, i, &r->custom_id, &r->custom_id_len);
    if (st == KVB_ERR_FORMAT)
        return jp_fail(
            c, JOB_ERR_INVALID_VALUE, "custom_id",
            "field 'custom_id' holds bytes that are not valid UTF-8 (it could not be echoed back as written)");
    if (st != KVB_OK) return jp_fail_nomem(c);
    r->custom_id_json_len = (size_t)(j->tok[i].end - j->tok[i].start);
    r->custom_id_json = kvb_strndup(j->src + j->tok[i].start, r->custom_id_json_len);
    if (!r->custom_id_json) return jp_fail_nomem(c);

    i = jp_lookup(c, 0, "method");
    if (i >= 0) {
        if (json_kind(j, i) != JSON_STRING) return jp_fail_type(c, "method", "a string");
        if (!json_str_eq(j, i, "POST")) {
            char got[48];
            jp_excerpt(c, i, got, sizeof got);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, "method", "field 'method' must be \"POST\" (got '%s')", got);
        }
    }

    bool url_given = false;
    i = jp_lookup(c, 0, "url");
    if (i >= 0) {
        if (json_kind(j, i) != JSON_STRING) return jp_fail_type(c, "url", "a string");
        if (json_str_eq(j, i, "/v1/chat/completions")) {
            r->url = JOB_URL_CHAT;
        } else if (json_str_eq(j, i, "/v1/completions")) {
            r->url = JOB_URL_COMPLETION;
        } else {
            char got[48];
            jp_excerpt(c, i, got, sizeof got);
            return jp_fail(c, JOB_ERR_INVALID_VALUE, "url",
                           "field 'url' must be \"/v1/chat/completions\" or \"/v1/completions\" (got '%s')", got);
        }
        url_given = true;
    }

    int body = jp_lookup(c, 0, "body");
    if (body >= 0) {
        if (json_kind(j, body) != JSON_OBJECT) return jp_fail_type(c, "body", "an object");
        c->prefix = "body.";
    } else {
        body = 0;
        c->prefix = "";
        r->shorthand = true;
    }

    int msgs = jp_lookup(c, body, "messages");
    int prompt = jp_lookup(c, body, "prompt");
    char path[JP_PATH_MAX];
    if (!url_given) {
        if (msgs >= 0 && prompt >= 0) {
            jp_path_of(c, "prompt", path);
            return jp_fail(c, JOB_ERR_INVALID_REQUEST, path,
                           "both 'messages' and 'prompt' are given; set 'url' to choose chat or completion");
        }
        if (msgs < 0 && prompt < 0) {
            jp_path_of(c, "messages", path);
            return jp_fail(c, JOB_ERR_MISSING_FIELD, path, "missing field '%smessages' or '%sprompt'", c->prefix,
                           c->prefix);
        }
        r->url = msgs >= 0 ? JOB_URL_CHAT : JOB_URL_COMPLETION;
    }
    int rc;
    if (!r->shorthand) {
        static const char *const top[] = {"custom_id", "method", "url", "body"};
        if ((rc = jp_check_members(c, 0, "", top, 4))) return rc;
    }
    if (r->url == JOB_URL_CHAT) {
        if (msgs < 0) {
            jp_path_of(c, "messages", path);
            return jp_fail_missing(c, path);
        }
        if ((rc = jp_parse_messages(c, msgs))) return rc;
    } else {
        if (prompt < 0) {
            jp_path_of(c, "prompt", path);
            return jp_fail_missing(c, path);
        }
        if ((rc = jp_parse_prompt(c, prompt))) return rc;
    }
    if ((rc = check_body_fields(c, body))) return rc;

    bool present;
    if ((rc = jp_get_string(c, body, "model", &r->model, NULL, &present))) return rc;
    if (present) r->given |= JOB_GIVEN_MODEL;
    if ((rc = jp_parse_sampling(c, body))) return rc;
    return jp_parse_output_form(c, body);
}

enum kvb_status job_parse_line(const char *line, size_t len, uint64_t line_no, struct job_request *out,
                               struct job_error *err)
{
    request_defaults(out, line_no);
    struct json_doc j;
    const char *why;
    size_t where;
    enum kvb_status st = json_parse(line, len, &j, &why, &where);
    if (st == KVB_ERR_NOMEM) {
        job_error_setf(err, JOB_ERR_SERVER, line_no, NULL, "out of memory while reading the line");
        return st;
    }
    if (st != KVB_OK) {
        job_error_setf(err, JOB_ERR_INVALID_JSON, line_no, NULL, "invalid JSON at byte %zu: %s", where + 1, why);
        if (err) err->by_line = true;
        return KVB_ERR_FORMAT;
    }
    struct jp_ctx c = {.j = &j, .r = out, .err = err, .line = line_no, .prefix = ""};
    int rc = parse_root(&c);
    json_free(&j);
    if (rc == 0) return KVB_OK;

    /* On error keep only custom_id, which the error line reports; the line
     * is keyed by its number, since the custom_id belongs to the first line
     * that uses it in a request that parses (a later line, maybe). */
    if (err) err->by_line = true;
    char *cid = out->custom_id, *cid_json = out->custom_id_json;
    size_t cid_len = out->custom_id_len, cid_json_len = out->custom_id_json_len;
    if (!cid_json) { /* the exact form alone is no use to an error line */
        kvb_free(cid);
        cid = NULL;
        cid_len = 0;
    }
    out->custom_id = out->custom_id_json = NULL;
    job_request_free(out);
    request_defaults(out, line_no);
    out->custom_id = cid;
    out->custom_id_len = cid_len;
    out->custom_id_json = cid_json;
    out->custom_id_json_len = cid_json_len;
    return rc == -2 ? KVB_ERR_NOMEM : KVB_ERR_FORMAT;
}
