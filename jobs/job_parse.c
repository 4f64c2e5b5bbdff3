/* job_parse.c — one JSONL input line → struct job_request, or a job_error
 * that names the line number and the field.
 *
 * The order of checks decides which error a line with several faults gets:
 * JSON syntax, then the top-level shape (object, custom_id, method, url,
 * body), then the prompt (messages or prompt), then sampling fields in the
 * order of the table below. custom_id is read first so that error lines can
 * carry it. Defaults and ranges are documented in job.h. */
#include "job.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "job_json.h"
#include "jsonmode.h"

void job_error_setf(struct job_error *e, const char *code, uint64_t line_no, const char *param,
                    const char *fmt, ...)
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
    kvb_free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) kvb_free(r->stop[i]);
    kvb_free(r->logit_bias);
    jsonmode_schema_free(r->json_schema);
    memset(r, 0, sizeof *r);
}

static void request_defaults(struct job_request *r, uint64_t line_no)
{
    memset(r, 0, sizeof *r);
    r->line_no = line_no;
    r->max_tokens = JOB_DEFAULT_MAX_TOKENS;
    r->temperature = JOB_DEFAULT_TEMPERATURE;
    r->top_p = JOB_DEFAULT_TOP_P;
    r->top_k = 0;
    r->min_p = 0.0f;
    r->seed = JOB_DEFAULT_SEED;
    r->presence_penalty = 0.0f;
    r->frequency_penalty = 0.0f;
    r->repetition_penalty = 1.0f;
    r->n = 1;
}

/* ---- parse context and error helpers ------------------------------------------ */

struct pctx {
    const struct job_json *j;
    struct job_request *r;
    struct job_error *err;
    uint64_t line;
    const char *prefix; /* "body." or "" for the shorthand */
};

/* Each helper below returns 0 when the field is fine (possibly absent),
 * -1 after filling c->err for a bad line, and -2 when memory ran out. */
#define PATH_MAX_ 128

/* out = base + suffix, cut to fit (paths only label errors). out may not
 * alias base. */
static void path_sub(char *out, const char *base, const char *suffix)
{
    size_t n = strnlen(base, PATH_MAX_ - 1), m = strlen(suffix);
    if (m > PATH_MAX_ - 1 - n) m = PATH_MAX_ - 1 - n;
    memcpy(out, base, n);
    memcpy(out + n, suffix, m);
    out[n + m] = '\0';
}

static void path_idx(char *out, const char *base, int k)
{
    char sfx[16];
    snprintf(sfx, sizeof sfx, "[%d]", k);
    path_sub(out, base, sfx);
}

static void path_of(const struct pctx *c, const char *name, char *out)
{
    path_sub(out, c->prefix, name);
}

static int fail(struct pctx *c, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct pctx *c, const char *code, const char *param, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    job_error_setf(c->err, code, c->line, param, "%s", msg);
    return -1;
}

static int fail_type(struct pctx *c, const char *path, const char *what)
{
    return fail(c, JOB_ERR_INVALID_TYPE, path, "field '%s' must be %s", path, what);
}

static int fail_missing(struct pctx *c, const char *path)
{
    return fail(c, JOB_ERR_MISSING_FIELD, path, "missing field '%s'", path);
}

static int fail_nomem(struct pctx *c)
{
    job_error_setf(c->err, JOB_ERR_SERVER, c->line, NULL, "out of memory while reading the line");
    return -2;
}

/* A short excerpt of token i's raw text for messages ("got '…'"). */
static void excerpt(const struct pctx *c, int i, char *out, size_t cap)
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
static double number_value(const struct pctx *c, int i)
{
    return strtod(c->j->src + c->j->tok[i].start, NULL);
}

/* The value token of `name` in object `obj`, or -1 when absent or null
 * (null means "not given", job.h). */
static int lookup(const struct pctx *c, int obj, const char *name)
{
    int i = job_json_get(c->j, obj, name);
    if (i >= 0 && job_json_kind(c->j, i) == JOB_JSON_NULL) return -1;
    return i;
}

static int get_float(struct pctx *c, int obj, const char *name, double lo, bool lo_open, double hi,
                     float *out, uint32_t given_bit)
{
    int i = lookup(c, obj, name);
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, name, path);
    if (job_json_kind(c->j, i) != JOB_JSON_NUMBER) return fail_type(c, path, "a number");
    double v = number_value(c, i);
    /* Range-check the double first (a huge double cast to float is undefined),
     * then the float itself: 1e-50 is > 0 but becomes 0.0f. */
    bool in = (lo_open ? v > lo : v >= lo) && v <= hi;
    float f = in ? (float)v : 0.0f;
    if (in && lo_open && !(f > (float)lo)) in = false;
    if (!in) {
        char got[48];
        excerpt(c, i, got, sizeof got);
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be in %c%g, %g] (got %s)", path,
                    lo_open ? '(' : '[', lo, hi, got);
    }
    *out = f;
    c->r->given |= given_bit;
    return 0;
}

/* Integer fields accept any JSON number with an integral value (16, 16.0,
 * 1.6e1), as lenient OpenAI-compatible servers do; 16.5 is a type error. */
static int get_int(struct pctx *c, int obj, const char *name, int64_t lo, int64_t hi, int64_t *out,
                   bool *present)
{
    *present = false;
    int i = lookup(c, obj, name);
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, name, path);
    if (job_json_kind(c->j, i) != JOB_JSON_NUMBER) return fail_type(c, path, "an integer");
    double v = number_value(c, i);
    if (isfinite(v) && v != floor(v)) return fail_type(c, path, "an integer");
    if (!(v >= (double)lo && v <= (double)hi)) {
        char got[48];
        excerpt(c, i, got, sizeof got);
        if (hi == INT32_MAX)
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be at least %lld (got %s)",
                        path, (long long)lo, got);
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must be between %lld and %lld (got %s)",
                    path, (long long)lo, (long long)hi, got);
    }
    *out = (int64_t)v;
    *present = true;
    return 0;
}

/* The seed: any integer in [-2^63, 2^64), read exactly (a double would lose
 * the low bits of a large seed and change the sample). */
static int get_seed(struct pctx *c, int obj)
{
    int i = lookup(c, obj, "seed");
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, "seed", path);
    if (job_json_kind(c->j, i) != JOB_JSON_NUMBER) return fail_type(c, path, "an integer");
    const jsmntok_t *t = &c->j->tok[i];
    const char *s = c->j->src + t->start;
    size_t n = (size_t)(t->end - t->start);
    bool plain = true;
    for (size_t k = (s[0] == '-'); k < n; k++)
        if (s[k] < '0' || s[k] > '9') plain = false;
    if (!plain) {
        /* 42.0 or 4.2e1: integral doubles are fine, and exact below 2^53 */
        double v = number_value(c, i);
        if (!isfinite(v) || v != floor(v)) return fail_type(c, path, "an integer");
        if (!(v >= -9007199254740992.0 && v <= 9007199254740992.0))
            return fail(c, JOB_ERR_INVALID_VALUE, path,
                        "field '%s' must be written as plain digits when this large", path);
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
    return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must fit in 64 bits", path);
}

static int get_string(struct pctx *c, int obj, const char *name, char **out, size_t *out_len,
                      bool *present)
{
    if (present) *present = false;
    int i = lookup(c, obj, name);
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, name, path);
    if (job_json_kind(c->j, i) != JOB_JSON_STRING) return fail_type(c, path, "a string");
    if (job_json_str_dup(c->j, i, out, out_len) != KVB_OK) return fail_nomem(c);
    if (present) *present = true;
    return 0;
}

/* ---- messages and prompt ---------------------------------------------------------- */

static int parse_role(struct pctx *c, int msg, const char *mpath, enum job_role *role)
{
    char path[PATH_MAX_];
    path_sub(path, mpath, ".role");
    int i = job_json_get(c->j, msg, "role");
    if (i < 0) return fail_missing(c, path);
    if (job_json_kind(c->j, i) != JOB_JSON_STRING) return fail_type(c, path, "a string");
    static const struct { const char *name; enum job_role role; } roles[] = {
        {"system", JOB_ROLE_SYSTEM},
        {"user", JOB_ROLE_USER},
        {"assistant", JOB_ROLE_ASSISTANT},
        {"developer", JOB_ROLE_DEVELOPER},
    };
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        if (job_json_str_eq(c->j, i, roles[k].name)) {
            *role = roles[k].role;
            return 0;
        }
    }
    char got[48];
    excerpt(c, i, got, sizeof got);
    return fail(c, JOB_ERR_INVALID_VALUE, path,
                "field '%s' must be one of system, user, assistant, developer (got '%s')", path, got);
}

/* content: a string, or an array of {"type":"text","text":…} parts joined
 * with "\n" (vLLM's rule, so results match a vLLM run of the same file). */
static int parse_content(struct pctx *c, int msg, const char *mpath, enum job_role role,
                         struct job_message *m)
{
    char path[PATH_MAX_];
    path_sub(path, mpath, ".content");
    int i = job_json_get(c->j, msg, "content");
    if (i < 0) return fail_missing(c, path);
    enum job_json_kind k = job_json_kind(c->j, i);
    if (k == JOB_JSON_NULL && role == JOB_ROLE_ASSISTANT) {
        /* an assistant turn that only called tools has null content */
        m->content = kvb_strndup("", 0);
        if (!m->content) return fail_nomem(c);
        m->content_len = 0;
        return 0;
    }
    if (k == JOB_JSON_STRING) {
        if (job_json_str_dup(c->j, i, &m->content, &m->content_len) != KVB_OK) return fail_nomem(c);
        return 0;
    }
    if (k != JOB_JSON_ARRAY) return fail_type(c, path, "a string or an array of text parts");

    /* Two passes: check every part and size the result, then copy. */
    size_t total = 0;
    int nparts = c->j->tok[i].size, p = i + 1;
    for (int q = 0; q < nparts; q++) {
        char ppath[PATH_MAX_];
        path_idx(ppath, path, q);
        if (job_json_kind(c->j, p) != JOB_JSON_OBJECT) return fail_type(c, ppath, "an object");
        char tpath[PATH_MAX_];
        path_sub(tpath, ppath, ".type");
        int ty = job_json_get(c->j, p, "type");
        if (ty < 0) return fail_missing(c, tpath);
        if (job_json_kind(c->j, ty) != JOB_JSON_STRING) return fail_type(c, tpath, "a string");
        if (!job_json_str_eq(c->j, ty, "text")) {
            char got[48];
            excerpt(c, ty, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, tpath,
                        "field '%s' must be \"text\" (got '%s'; only text content is supported)", tpath, got);
        }
        path_sub(tpath, ppath, ".text");
        int tx = job_json_get(c->j, p, "text");
        if (tx < 0) return fail_missing(c, tpath);
        if (job_json_kind(c->j, tx) != JOB_JSON_STRING) return fail_type(c, tpath, "a string");
        total += job_json_str_decode(c->j, tx, NULL) + (q > 0);
        p = job_json_skip(c->j, p);
    }
    char *buf = kvb_malloc(total + 1);
    if (!buf) return fail_nomem(c);
    size_t o = 0;
    p = i + 1;
    for (int q = 0; q < nparts; q++) {
        if (q > 0) buf[o++] = '\n';
        o += job_json_str_decode(c->j, job_json_get(c->j, p, "text"), buf + o);
        p = job_json_skip(c->j, p);
    }
    buf[o] = '\0';
    m->content = buf;
    m->content_len = o;
    return 0;
}

static int parse_messages(struct pctx *c, int arr)
{
    char path[PATH_MAX_];
    path_of(c, "messages", path);
    if (job_json_kind(c->j, arr) != JOB_JSON_ARRAY) return fail_type(c, path, "an array of messages");
    int n = c->j->tok[arr].size;
    if (n == 0) return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
    c->r->messages = kvb_calloc((size_t)n, sizeof *c->r->messages);
    if (!c->r->messages) return fail_nomem(c);
    int i = arr + 1;
    for (int k = 0; k < n; k++) {
        char mpath[PATH_MAX_];
        path_idx(mpath, path, k);
        if (job_json_kind(c->j, i) != JOB_JSON_OBJECT) return fail_type(c, mpath, "an object");
        struct job_message *m = &c->r->messages[k];
        int rc = parse_role(c, i, mpath, &m->role);
        if (rc) return rc;
        rc = parse_content(c, i, mpath, m->role, m);
        if (rc) return rc;
        c->r->n_messages = (size_t)k + 1; /* only filled messages are freed */
        i = job_json_skip(c->j, i);
    }
    return 0;
}

/* prompt: a string, or an array holding exactly one string (the form
 * OpenAI clients send for a single prompt). Several prompts in one line, or
 * token-id prompts, are refused with a message saying what to do instead. */
static int parse_prompt(struct pctx *c, int i)
{
    char path[PATH_MAX_];
    path_of(c, "prompt", path);
    enum job_json_kind k = job_json_kind(c->j, i);
    if (k == JOB_JSON_ARRAY) {
        int n = c->j->tok[i].size;
        if (n == 0) return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
        enum job_json_kind k0 = job_json_kind(c->j, i + 1);
        if (k0 == JOB_JSON_NUMBER || k0 == JOB_JSON_ARRAY)
            return fail(c, JOB_ERR_INVALID_VALUE, path,
                        "field '%s' holds token ids, which are not supported; give the text", path);
        if (n > 1)
            return fail(c, JOB_ERR_INVALID_VALUE, path,
                        "field '%s' holds %d prompts; put one prompt per line", path, n);
        if (k0 != JOB_JSON_STRING) return fail_type(c, path, "a string or an array of one string");
        i = i + 1;
    } else if (k != JOB_JSON_STRING) {
        return fail_type(c, path, "a string or an array of one string");
    }
    if (job_json_str_dup(c->j, i, &c->r->prompt, &c->r->prompt_len) != KVB_OK) return fail_nomem(c);
    return 0;
}

static int parse_stop(struct pctx *c, int obj)
{
    int i = lookup(c, obj, "stop");
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, "stop", path);
    struct job_request *r = c->r;
    enum job_json_kind k = job_json_kind(c->j, i);
    int first, n;
    if (k == JOB_JSON_STRING) {
        first = i;
        n = 1;
    } else if (k == JOB_JSON_ARRAY) {
        first = i + 1;
        n = c->j->tok[i].size;
        if (n > JOB_MAX_STOP)
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d strings; at most %d are allowed",
                        path, n, JOB_MAX_STOP);
    } else {
        return fail_type(c, path, "a string or an array of strings");
    }
    for (int q = 0, t = first; q < n; q++, t++) {
        char spath[PATH_MAX_];
        if (k == JOB_JSON_ARRAY) path_idx(spath, path, q);
        else path_sub(spath, path, "");
        if (job_json_kind(c->j, t) != JOB_JSON_STRING) return fail_type(c, spath, "a string");
        if (c->j->tok[t].end == c->j->tok[t].start)
            return fail(c, JOB_ERR_INVALID_VALUE, spath, "field '%s' must not be an empty string", spath);
        if (job_json_str_dup(c->j, t, &r->stop[q], &r->stop_len[q]) != KVB_OK) return fail_nomem(c);
        r->n_stop = q + 1;
    }
    r->given |= JOB_GIVEN_STOP;
    return 0;
}

/* ---- sampling fields ------------------------------------------------------------- */

static int parse_sampling(struct pctx *c, int obj)
{
    struct job_request *r = c->r;
    int64_t v;
    bool present;
    int rc;

    /* max_completion_tokens is OpenAI's newer name; when both are given it
     * wins, as in vLLM. */
    rc = get_int(c, obj, "max_tokens", 1, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present) {
        r->max_tokens = (int32_t)v;
        r->given |= JOB_GIVEN_MAX_TOKENS;
    }
    rc = get_int(c, obj, "max_completion_tokens", 1, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present) {
        r->max_tokens = (int32_t)v;
        r->given |= JOB_GIVEN_MAX_TOKENS;
    }

    if ((rc = get_float(c, obj, "temperature", 0.0, false, 2.0, &r->temperature, JOB_GIVEN_TEMPERATURE)))
        return rc;
    if ((rc = get_float(c, obj, "top_p", 0.0, true, 1.0, &r->top_p, JOB_GIVEN_TOP_P))) return rc;

    /* top_k: vLLM clients send -1 for "off"; it means the same as 0 here. */
    rc = get_int(c, obj, "top_k", -1, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present) {
        r->top_k = v < 0 ? 0 : (int32_t)v;
        r->given |= JOB_GIVEN_TOP_K;
    }
    if ((rc = get_float(c, obj, "min_p", 0.0, false, 1.0, &r->min_p, JOB_GIVEN_MIN_P))) return rc;
    if ((rc = get_seed(c, obj))) return rc;
    if ((rc = parse_stop(c, obj))) return rc;
    if ((rc = get_float(c, obj, "presence_penalty", -2.0, false, 2.0, &r->presence_penalty,
                        JOB_GIVEN_PRESENCE_PENALTY)))
        return rc;
    if ((rc = get_float(c, obj, "frequency_penalty", -2.0, false, 2.0, &r->frequency_penalty,
                        JOB_GIVEN_FREQUENCY_PENALTY)))
        return rc;
    /* repetition_penalty divides logits, so 0 and below make no sense; above
     * 2 the output is unreadable, and a cap catches a misplaced field. */
    if ((rc = get_float(c, obj, "repetition_penalty", 0.0, true, 2.0, &r->repetition_penalty,
                        JOB_GIVEN_REPETITION_PENALTY)))
        return rc;

    rc = get_int(c, obj, "n", 1, JOB_MAX_N, &v, &present);
    if (rc) return rc;
    if (present) {
        r->n = (int32_t)v;
        r->given |= JOB_GIVEN_N;
    }

    char path[PATH_MAX_];
    path_of(c, "logprobs", path);
    int lp = lookup(c, obj, "logprobs");
    if (r->url == JOB_URL_CHAT) {
        /* chat: "logprobs": bool, "top_logprobs": 0..20 (needs logprobs true) */
        if (lp >= 0) {
            enum job_json_kind k = job_json_kind(c->j, lp);
            if (k != JOB_JSON_TRUE && k != JOB_JSON_FALSE) return fail_type(c, path, "a boolean");
            r->logprobs = k == JOB_JSON_TRUE;
            r->given |= JOB_GIVEN_LOGPROBS;
        }
        rc = get_int(c, obj, "top_logprobs", 0, JOB_MAX_TOP_LOGPROBS, &v, &present);
        if (rc) return rc;
        if (present) {
            if (!r->logprobs) {
                path_of(c, "top_logprobs", path);
                return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' needs \"logprobs\": true", path);
            }
            r->top_logprobs = (int32_t)v;
            r->given |= JOB_GIVEN_TOP_LOGPROBS;
        }
    } else {
        /* completions: "logprobs": k asks for the chosen token's logprob and
         * the k most likely alternatives. */
        rc = get_int(c, obj, "logprobs", 0, JOB_MAX_TOP_LOGPROBS, &v, &present);
        if (rc) return rc;
        if (present) {
            r->logprobs = true;
            r->top_logprobs = (int32_t)v;
            r->given |= JOB_GIVEN_LOGPROBS | JOB_GIVEN_TOP_LOGPROBS;
        }
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], …}, at most
 * JOB_MAX_LOGIT_BIAS entries; a repeated id keeps its last bias. Ids are
 * checked against the vocabulary by the caller, who knows it. */
static int parse_logit_bias(struct pctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[PATH_MAX_], sub[PATH_MAX_];
    path_of(c, "logit_bias", path);
    int i = lookup(c, obj, "logit_bias");
    if (i < 0) return 0;
    if (job_json_kind(c->j, i) != JOB_JSON_OBJECT) return fail_type(c, path, "an object of token ids and biases");
    const int n = c->j->tok[i].size;
    if (n > JOB_MAX_LOGIT_BIAS)
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' has %d entries, more than %d", path, n,
                    JOB_MAX_LOGIT_BIAS);
    if (n == 0) return 0;
    r->logit_bias = kvb_malloc(sizeof *r->logit_bias * (size_t)n);
    if (!r->logit_bias) return fail_nomem(c);
    int k = i + 1;
    for (int m = 0; m < n; m++, k = job_json_skip(c->j, k + 1)) {
        char key[16] = "";
        const int klen = c->j->tok[k].end - c->j->tok[k].start;
        if (klen > 0 && klen < (int)sizeof key) job_json_str_decode(c->j, k, key);
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || *end || id > INT32_MAX) { /* digits only: strtol takes " +5" */
            char got[48];
            excerpt(c, k, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': key '%s' is not a token id", path, got);
        }
        char dotted[sizeof key + 1];
        snprintf(dotted, sizeof dotted, ".%s", key);
        path_sub(sub, path, dotted);
        if (job_json_kind(c->j, k + 1) != JOB_JSON_NUMBER) return fail_type(c, sub, "a number");
        const double v = number_value(c, k + 1);
        if (!(v >= -100.0 && v <= 100.0))
            return fail(c, JOB_ERR_INVALID_VALUE, sub, "field '%s' must be in [-100, 100]", sub);
        int at = 0;
        while (at < r->n_logit_bias && r->logit_bias[at].token != (int32_t)id) at++;
        r->logit_bias[at] = (struct job_logit_bias){(int32_t)id, (float)v};
        if (at == r->n_logit_bias) r->n_logit_bias++;
    }
    r->given |= JOB_GIVEN_LOGIT_BIAS;
    return 0;
}

/* response_format, logit_bias, and the fields kvbatch does not implement
 * whose silent omission would change what the caller gets back, which are
 * refused by name: tools and functions (tool calls), echo, suffix and a
 * best_of above n. Fields that change nothing in an offline batch (stream,
 * user, store, metadata, service_tier, …) and unknown ones are ignored, as
 * vLLM does. */
static int parse_output_form(struct pctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[PATH_MAX_], sub[PATH_MAX_];
    int i = lookup(c, obj, "response_format");
    if (i >= 0) {
        path_of(c, "response_format", path);
        if (job_json_kind(c->j, i) != JOB_JSON_OBJECT) return fail_type(c, path, "an object");
        path_sub(sub, path, ".type");
        int t = job_json_get(c->j, i, "type");
        if (t < 0) return fail_missing(c, sub);
        if (job_json_kind(c->j, t) != JOB_JSON_STRING) return fail_type(c, sub, "a string");
        if (job_json_str_eq(c->j, t, "json_object")) {
            r->json_object = true;
            r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        } else if (job_json_str_eq(c->j, t, "json_schema")) {
            char js_path[PATH_MAX_], sc_path[PATH_MAX_];
            path_sub(js_path, path, ".json_schema");
            const int js = lookup(c, i, "json_schema");
            if (js < 0) return fail_missing(c, js_path);
            if (job_json_kind(c->j, js) != JOB_JSON_OBJECT) return fail_type(c, js_path, "an object");
            path_sub(sc_path, js_path, ".schema");
            const int sc = lookup(c, js, "schema");
            if (sc < 0) return fail_missing(c, sc_path);
            char epath[PATH_MAX_] = "", emsg[320] = "";
            int rc = job_schema_compile(c->j, sc, sc_path, &r->json_schema, epath, sizeof epath, emsg, sizeof emsg);
            if (rc == -2) return fail_nomem(c);
            if (rc) return fail(c, JOB_ERR_INVALID_VALUE, epath, "%s", emsg);
            r->json_object = true;
            r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        } else if (!job_json_str_eq(c->j, t, "text")) {
            char got[48];
            excerpt(c, t, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, sub,
                        "field '%s' must be \"text\", \"json_object\" or \"json_schema\" (got '%s')", sub, got);
        }
    }
    static const char *const tool_fields[] = {"tools", "functions"};
    for (int k = 0; k < 2; k++) {
        i = lookup(c, obj, tool_fields[k]);
        if (i >= 0 && !(job_json_kind(c->j, i) == JOB_JSON_ARRAY && c->j->tok[i].size == 0)) {
            path_of(c, tool_fields[k], path);
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': tool calling is not supported by kvbatch", path);
        }
    }
    int rc = parse_logit_bias(c, obj);
    if (rc) return rc;
    i = lookup(c, obj, "echo");
    if (i >= 0 && job_json_kind(c->j, i) != JOB_JSON_FALSE) {
        path_of(c, "echo", path);
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' is not supported by kvbatch (only false)", path);
    }
    i = lookup(c, obj, "suffix");
    if (i >= 0 && !(job_json_kind(c->j, i) == JOB_JSON_STRING && job_json_str_eq(c->j, i, ""))) {
        path_of(c, "suffix", path);
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' (insertion) is not supported by kvbatch", path);
    }
    int64_t v;
    bool present;
    rc = get_int(c, obj, "best_of", 1, INT32_MAX, &v, &present);
    if (rc) return rc;
    if (present && v > r->n) {
        path_of(c, "best_of", path);
        return fail(c, JOB_ERR_INVALID_VALUE, path,
                    "field '%s' above n is not supported by kvbatch (it returns every choice it makes)", path);
    }
    return 0;
}

/* ---- the line ------------------------------------------------------------------------ */

static int parse_root(struct pctx *c)
{
    const struct job_json *j = c->j;
    struct job_request *r = c->r;
    if (job_json_kind(j, 0) != JOB_JSON_OBJECT)
        return fail(c, JOB_ERR_INVALID_REQUEST, NULL, "the line must be a JSON object");

    int i = job_json_get(j, 0, "custom_id");
    if (i < 0 || job_json_kind(j, i) == JOB_JSON_NULL) return fail_missing(c, "custom_id");
    if (job_json_kind(j, i) != JOB_JSON_STRING) return fail_type(c, "custom_id", "a string");
    if (j->tok[i].end == j->tok[i].start)
        return fail(c, JOB_ERR_INVALID_VALUE, "custom_id", "field 'custom_id' must not be empty");
    enum kvb_status st = job_json_str_dup_exact(j, i, &r->custom_id, &r->custom_id_len);
    if (st == KVB_ERR_FORMAT)
        return fail(c, JOB_ERR_INVALID_VALUE, "custom_id",
                    "field 'custom_id' holds bytes that are not valid UTF-8 (it could not be echoed back as written)");
    if (st != KVB_OK) return fail_nomem(c);
    r->custom_id_json_len = (size_t)(j->tok[i].end - j->tok[i].start);
    r->custom_id_json = kvb_strndup(j->src + j->tok[i].start, r->custom_id_json_len);
    if (!r->custom_id_json) return fail_nomem(c);

    i = lookup(c, 0, "method");
    if (i >= 0) {
        if (job_json_kind(j, i) != JOB_JSON_STRING) return fail_type(c, "method", "a string");
        if (!job_json_str_eq(j, i, "POST")) {
            char got[48];
            excerpt(c, i, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, "method", "field 'method' must be \"POST\" (got '%s')", got);
        }
    }

    bool url_given = false;
    i = lookup(c, 0, "url");
    if (i >= 0) {
        if (job_json_kind(j, i) != JOB_JSON_STRING) return fail_type(c, "url", "a string");
        if (job_json_str_eq(j, i, "/v1/chat/completions")) {
            r->url = JOB_URL_CHAT;
        } else if (job_json_str_eq(j, i, "/v1/completions")) {
            r->url = JOB_URL_COMPLETION;
        } else {
            char got[48];
            excerpt(c, i, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, "url",
                        "field 'url' must be \"/v1/chat/completions\" or \"/v1/completions\" (got '%s')", got);
        }
        url_given = true;
    }

    int body = lookup(c, 0, "body");
    if (body >= 0) {
        if (job_json_kind(j, body) != JOB_JSON_OBJECT) return fail_type(c, "body", "an object");
        c->prefix = "body.";
    } else {
        body = 0;
        c->prefix = "";
        r->shorthand = true;
    }

    int msgs = lookup(c, body, "messages");
    int prompt = lookup(c, body, "prompt");
    char path[PATH_MAX_];
    if (!url_given) {
        if (msgs >= 0 && prompt >= 0) {
            path_of(c, "prompt", path);
            return fail(c, JOB_ERR_INVALID_REQUEST, path,
                        "both 'messages' and 'prompt' are given; set 'url' to choose chat or completion");
        }
        if (msgs < 0 && prompt < 0) {
            path_of(c, "messages", path);
            return fail(c, JOB_ERR_MISSING_FIELD, path, "missing field '%smessages' or '%sprompt'",
                        c->prefix, c->prefix);
        }
        r->url = msgs >= 0 ? JOB_URL_CHAT : JOB_URL_COMPLETION;
    }
    int rc;
    if (r->url == JOB_URL_CHAT) {
        if (msgs < 0) {
            path_of(c, "messages", path);
            return fail_missing(c, path);
        }
        if ((rc = parse_messages(c, msgs))) return rc;
    } else {
        if (prompt < 0) {
            path_of(c, "prompt", path);
            return fail_missing(c, path);
        }
        if ((rc = parse_prompt(c, prompt))) return rc;
    }

    bool present;
    if ((rc = get_string(c, body, "model", &r->model, NULL, &present))) return rc;
    if (present) r->given |= JOB_GIVEN_MODEL;
    if ((rc = parse_sampling(c, body))) return rc;
    return parse_output_form(c, body);
}

enum kvb_status job_parse_line(const char *line, size_t len, uint64_t line_no,
                               struct job_request *out, struct job_error *err)
{
    request_defaults(out, line_no);
    struct job_json j;
    const char *why;
    size_t where;
    enum kvb_status st = job_json_parse(line, len, &j, &why, &where);
    if (st == KVB_ERR_NOMEM) {
        job_error_setf(err, JOB_ERR_SERVER, line_no, NULL, "out of memory while reading the line");
        return st;
    }
    if (st != KVB_OK) {
        job_error_setf(err, JOB_ERR_INVALID_JSON, line_no, NULL, "invalid JSON at byte %zu: %s", where + 1,
                       why);
        if (err) err->by_line = true;
        return KVB_ERR_FORMAT;
    }
    struct pctx c = {.j = &j, .r = out, .err = err, .line = line_no, .prefix = ""};
    int rc = parse_root(&c);
    job_json_free(&j);
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
