/* job_parse.c — one JSONL input line → struct job_request, or a job_error
 * that names the line number and the field.
 *
 * The order of checks decides which error a line with several faults gets:
 * JSON syntax, then the top-level shape (object, custom_id, method, url,
 * body), then the prompt (messages or prompt), then sampling fields in the
 * order of the table below. custom_id is read first so that error lines can
 * carry it. Defaults and ranges are documented in job.h. */
#include "jobs/job.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"

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
    for (int32_t i = 0; i < r->n_prompts; i++) {
        kvb_free(r->prompts[i].text);
        kvb_free(r->prompts[i].ids);
    }
    kvb_free(r->prompts);
    kvb_free(r->stop_token_ids);
    for (int i = 0; i < r->n_stop; i++) kvb_free(r->stop[i]);
    kvb_free(r->logit_bias);
    kvb_free(r->json_schema);
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
    r->skip_special_tokens = true;
    r->add_generation_prompt = true;
}

/* ---- parse context and error helpers ------------------------------------------ */

struct pctx {
    const struct json_doc *j;
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
    int i = json_get(c->j, obj, name);
    if (i >= 0 && json_kind(c->j, i) == JSON_NULL) return -1;
    return i;
}

static int get_float(struct pctx *c, int obj, const char *name, double lo, bool lo_open, double hi,
                     float *out, uint32_t given_bit)
{
    int i = lookup(c, obj, name);
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, name, path);
    if (json_kind(c->j, i) != JSON_NUMBER) return fail_type(c, path, "a number");
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
    if (json_kind(c->j, i) != JSON_NUMBER) return fail_type(c, path, "an integer");
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
    if (json_kind(c->j, i) != JSON_NUMBER) return fail_type(c, path, "an integer");
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

static int get_bool(struct pctx *c, int obj, const char *name, bool *out, bool *present)
{
    if (present) *present = false;
    int i = lookup(c, obj, name);
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, name, path);
    enum json_kind k = json_kind(c->j, i);
    if (k != JSON_TRUE && k != JSON_FALSE) return fail_type(c, path, "a boolean");
    *out = k == JSON_TRUE;
    if (present) *present = true;
    return 0;
}

static int get_string(struct pctx *c, int obj, const char *name, char **out, size_t *out_len,
                      bool *present)
{
    if (present) *present = false;
    int i = lookup(c, obj, name);
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, name, path);
    if (json_kind(c->j, i) != JSON_STRING) return fail_type(c, path, "a string");
    if (json_str_dup(c->j, i, out, out_len) != KVB_OK) return fail_nomem(c);
    if (present) *present = true;
    return 0;
}

/* ---- messages and prompt ---------------------------------------------------------- */

static int check_members(struct pctx *c, int obj, const char *path, const char *const *names, size_t n);
static void key_name(const struct pctx *c, int k, char *buf, size_t cap);
static int fail_unknown(struct pctx *c, const char *path, const char *name, const char *extra);

static int parse_role(struct pctx *c, int msg, const char *mpath, enum job_role *role)
{
    char path[PATH_MAX_];
    path_sub(path, mpath, ".role");
    int i = json_get(c->j, msg, "role");
    if (i < 0) return fail_missing(c, path);
    if (json_kind(c->j, i) != JSON_STRING) return fail_type(c, path, "a string");
    static const struct { const char *name; enum job_role role; } roles[] = {
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
    int i = json_get(c->j, msg, "content");
    if (i < 0) return fail_missing(c, path);
    enum json_kind k = json_kind(c->j, i);
    if (k == JSON_NULL && role == JOB_ROLE_ASSISTANT) {
        /* an assistant turn that only called tools has null content */
        m->content = kvb_strndup("", 0);
        if (!m->content) return fail_nomem(c);
        m->content_len = 0;
        return 0;
    }
    if (k == JSON_STRING) {
        if (json_str_dup(c->j, i, &m->content, &m->content_len) != KVB_OK) return fail_nomem(c);
        return 0;
    }
    if (k != JSON_ARRAY) return fail_type(c, path, "a string or an array of text parts");

    /* Two passes: check every part and size the result, then copy. */
    size_t total = 0;
    int nparts = c->j->tok[i].size, p = i + 1;
    for (int q = 0; q < nparts; q++) {
        char ppath[PATH_MAX_];
        path_idx(ppath, path, q);
        if (json_kind(c->j, p) != JSON_OBJECT) return fail_type(c, ppath, "an object");
        char tpath[PATH_MAX_];
        path_sub(tpath, ppath, ".type");
        int ty = json_get(c->j, p, "type");
        if (ty < 0) return fail_missing(c, tpath);
        if (json_kind(c->j, ty) != JSON_STRING) return fail_type(c, tpath, "a string");
        if (!json_str_eq(c->j, ty, "text")) {
            char got[48];
            excerpt(c, ty, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, tpath,
                        "field '%s' must be \"text\" (got '%s'; only text content is supported)", tpath, got);
        }
        path_sub(tpath, ppath, ".text");
        int tx = json_get(c->j, p, "text");
        if (tx < 0) return fail_missing(c, tpath);
        if (json_kind(c->j, tx) != JSON_STRING) return fail_type(c, tpath, "a string");
        static const char *const part_fields[] = {"type", "text"};
        int rc = check_members(c, p, ppath, part_fields, 2);
        if (rc) return rc;
        total += json_str_decode(c->j, tx, NULL) + (q > 0);
        p = json_skip(c->j, p);
    }
    char *buf = kvb_malloc(total + 1);
    if (!buf) return fail_nomem(c);
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
static int check_message_members(struct pctx *c, int msg, const char *mpath)
{
    static const char *const names[] = {"role", "content", "name"};
    int k = msg + 1;
    for (int m = 0; m < c->j->tok[msg].size; m++, k = json_skip(c->j, k + 1)) {
        const int v = k + 1;
        const enum json_kind kind = json_kind(c->j, v);
        if ((json_str_eq(c->j, k, "tool_calls") && (kind == JSON_NULL ||
                                                        (kind == JSON_ARRAY && c->j->tok[v].size == 0))) ||
            (json_str_eq(c->j, k, "refusal") && kind == JSON_NULL))
            continue;
        bool known = false;
        for (size_t f = 0; f < 3 && !known; f++) known = json_str_eq(c->j, k, names[f]);
        if (known) continue;
        char name[64], sub[PATH_MAX_], dotted[72];
        key_name(c, k, name, sizeof name);
        snprintf(dotted, sizeof dotted, ".%s", name);
        path_sub(sub, mpath, dotted);
        return fail_unknown(c, sub, name,
                            !strcmp(name, "tool_calls") || !strcmp(name, "tool_call_id") || !strcmp(name, "function_call")
                                ? "no tool calling"
                                : NULL);
    }
    if (json_get(c->j, msg, "name") >= 0 && json_kind(c->j, json_get(c->j, msg, "name")) != JSON_STRING) {
        char path[PATH_MAX_];
        path_sub(path, mpath, ".name");
        return fail_type(c, path, "a string");
    }
    return 0;
}

static int parse_messages(struct pctx *c, int arr)
{
    char path[PATH_MAX_];
    path_of(c, "messages", path);
    if (json_kind(c->j, arr) != JSON_ARRAY) return fail_type(c, path, "an array of messages");
    int n = c->j->tok[arr].size;
    if (n == 0) return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
    c->r->messages = kvb_calloc((size_t)n, sizeof *c->r->messages);
    if (!c->r->messages) return fail_nomem(c);
    int i = arr + 1;
    for (int k = 0; k < n; k++) {
        char mpath[PATH_MAX_];
        path_idx(mpath, path, k);
        if (json_kind(c->j, i) != JSON_OBJECT) return fail_type(c, mpath, "an object");
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
static int parse_ids(struct pctx *c, int i, const char *path, struct job_prompt *p)
{
    const int n = c->j->tok[i].size;
    if (n == 0) return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be an empty list of token ids", path);
    p->ids = kvb_malloc(sizeof *p->ids * (size_t)n);
    if (!p->ids) return fail_nomem(c);
    for (int k = 0, t = i + 1; k < n; k++, t++) {
        char ipath[PATH_MAX_];
        path_idx(ipath, path, k);
        if (json_kind(c->j, t) != JSON_NUMBER) return fail_type(c, ipath, "a token id (an integer)");
        const double v = number_value(c, t);
        if (v != floor(v)) return fail_type(c, ipath, "a token id (an integer)");
        if (!(v >= 0 && v <= INT32_MAX))
            return fail(c, JOB_ERR_INVALID_VALUE, ipath, "field '%s' is not a token id (got %.17g)", ipath, v);
        p->ids[k] = (int32_t)v;
        p->n_ids = k + 1;
    }
    return 0;
}

/* prompt, as OpenAI's completions take it: a string, a list of strings, a
 * list of token ids, or a list of lists of token ids. Each prompt gets its
 * own n choices, written prompt by prompt. */
static int parse_prompt(struct pctx *c, int i)
{
    struct job_request *r = c->r;
    char path[PATH_MAX_];
    path_of(c, "prompt", path);
    const char *what = "a string, a list of strings, a list of token ids or a list of lists of token ids";
    enum json_kind k = json_kind(c->j, i);
    int n = 1, first = i;
    bool list = false, single_ids = false;
    if (k == JSON_ARRAY) {
        n = c->j->tok[i].size;
        if (n == 0) return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' must not be empty", path);
        enum json_kind k0 = json_kind(c->j, i + 1);
        if (k0 == JSON_NUMBER) {
            single_ids = true; /* one prompt of token ids */
            n = 1;
        } else {
            list = true;
            first = i + 1;
        }
    } else if (k != JSON_STRING) {
        return fail_type(c, path, what);
    }
    if (n > JOB_MAX_PROMPTS)
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d prompts; at most %d are allowed", path, n,
                    JOB_MAX_PROMPTS);
    r->prompts = kvb_calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return fail_nomem(c);
    enum json_kind want = list ? json_kind(c->j, first) : k;
    for (int q = 0, t = first; q < n; q++, t = json_skip(c->j, t)) {
        char ppath[PATH_MAX_];
        if (list) path_idx(ppath, path, q);
        else path_sub(ppath, path, "");
        r->n_prompts = q + 1; /* only filled prompts are freed */
        struct job_prompt *p = &r->prompts[q];
        const enum json_kind kt = json_kind(c->j, t);
        if (single_ids) {
            int rc = parse_ids(c, i, path, p);
            if (rc) return rc;
        } else if (kt != want || (kt != JSON_STRING && kt != JSON_ARRAY)) {
            /* a list holds prompts of one kind, as OpenAI's types say */
            return fail_type(c, ppath, list ? (want == JSON_ARRAY ? "a list of token ids" : "a string") : what);
        } else if (kt == JSON_ARRAY) {
            int rc = parse_ids(c, t, ppath, p);
            if (rc) return rc;
        } else if (json_str_dup(c->j, t, &p->text, &p->text_len) != KVB_OK) {
            return fail_nomem(c);
        }
    }
    r->prompt = r->prompts[0].text;
    r->prompt_len = r->prompts[0].text_len;
    return 0;
}

static int parse_stop(struct pctx *c, int obj)
{
    int i = lookup(c, obj, "stop");
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, "stop", path);
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
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d strings; at most %d are allowed",
                        path, n, JOB_MAX_STOP);
    } else {
        return fail_type(c, path, "a string or an array of strings");
    }
    for (int q = 0, t = first; q < n; q++, t++) {
        char spath[PATH_MAX_];
        if (k == JSON_ARRAY) path_idx(spath, path, q);
        else path_sub(spath, path, "");
        if (json_kind(c->j, t) != JSON_STRING) return fail_type(c, spath, "a string");
        if (c->j->tok[t].end == c->j->tok[t].start)
            return fail(c, JOB_ERR_INVALID_VALUE, spath, "field '%s' must not be an empty string", spath);
        if (json_str_dup(c->j, t, &r->stop[q], &r->stop_len[q]) != KVB_OK) return fail_nomem(c);
        r->n_stop = q + 1;
    }
    r->given |= JOB_GIVEN_STOP;
    return 0;
}

/* ---- sampling fields ------------------------------------------------------------- */

/* stop_token_ids: a list of token ids (checked against the vocabulary by the
 * caller); duplicates are harmless. */
static int parse_stop_token_ids(struct pctx *c, int obj)
{
    struct job_request *r = c->r;
    int i = lookup(c, obj, "stop_token_ids");
    if (i < 0) return 0;
    char path[PATH_MAX_];
    path_of(c, "stop_token_ids", path);
    if (json_kind(c->j, i) != JSON_ARRAY) return fail_type(c, path, "a list of token ids");
    const int n = c->j->tok[i].size;
    if (n > JOB_MAX_STOP_TOKEN_IDS)
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' holds %d ids; at most %d are allowed", path, n,
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
static int parse_vllm(struct pctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[PATH_MAX_];
    bool present;
    int rc;
    if ((rc = get_bool(c, obj, "ignore_eos", &r->ignore_eos, NULL))) return rc;
    int64_t v;
    if ((rc = get_int(c, obj, "min_tokens", 0, INT32_MAX, &v, &present))) return rc;
    if (present) {
        if (v > r->max_tokens) {
            path_of(c, "min_tokens", path);
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' (%lld) must not exceed max_tokens (%d%s)", path,
                        (long long)v, r->max_tokens, r->given & JOB_GIVEN_MAX_TOKENS ? "" : ", the default");
        }
        r->min_tokens = (int32_t)v;
        r->given |= JOB_GIVEN_MIN_TOKENS;
    }
    if ((rc = parse_stop_token_ids(c, obj))) return rc;
    if ((rc = get_bool(c, obj, "include_stop_str_in_output", &r->include_stop_str_in_output, NULL))) return rc;
    if ((rc = get_bool(c, obj, "skip_special_tokens", &r->skip_special_tokens, NULL))) return rc;
    /* spaces_between_special_tokens: special tokens' texts are joined with
     * no spaces whatever its value, as fast tokenizers (and so vLLM with
     * one) do; read for its type only. */
    bool spaces = true;
    if ((rc = get_bool(c, obj, "spaces_between_special_tokens", &spaces, NULL))) return rc;
    bool beam = false;
    if ((rc = get_bool(c, obj, "use_beam_search", &beam, NULL))) return rc;
    if (beam) {
        path_of(c, "use_beam_search", path);
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': beam search is not supported by kvbatch", path);
    }
    if (r->url != JOB_URL_CHAT) return 0;
    if ((rc = get_bool(c, obj, "add_generation_prompt", &r->add_generation_prompt, NULL))) return rc;
    if ((rc = get_bool(c, obj, "continue_final_message", &r->continue_final_message, NULL))) return rc;
    if (r->continue_final_message) {
        path_of(c, "continue_final_message", path);
        if (r->add_generation_prompt)
            return fail(c, JOB_ERR_INVALID_VALUE, path,
                        "field '%s' needs \"add_generation_prompt\": false (the final message is continued, "
                        "not answered)", path);
        if (r->messages[r->n_messages - 1].role != JOB_ROLE_ASSISTANT)
            return fail(c, JOB_ERR_INVALID_VALUE, path,
                        "field '%s' needs the last message to be the assistant's (the one to continue)", path);
    }
    return 0;
}

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
            enum json_kind k = json_kind(c->j, lp);
            if (k != JSON_TRUE && k != JSON_FALSE) return fail_type(c, path, "a boolean");
            r->logprobs = k == JSON_TRUE;
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
    return parse_vllm(c, obj);
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
    if (json_kind(c->j, i) != JSON_OBJECT) return fail_type(c, path, "an object of token ids and biases");
    const int n = c->j->tok[i].size;
    if (n > JOB_MAX_LOGIT_BIAS)
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' has %d entries, more than %d", path, n,
                    JOB_MAX_LOGIT_BIAS);
    if (n == 0) return 0;
    r->logit_bias = kvb_malloc(sizeof *r->logit_bias * (size_t)n);
    if (!r->logit_bias) return fail_nomem(c);
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
            excerpt(c, k, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': key '%s' is not a token id", path, got);
        }
        char dotted[sizeof key + 1];
        snprintf(dotted, sizeof dotted, ".%s", key);
        path_sub(sub, path, dotted);
        if (json_kind(c->j, k + 1) != JSON_NUMBER) return fail_type(c, sub, "a number");
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

/* response_format, logit_bias, and the fields kvbatch implements only at
 * their no-op values, refused by name otherwise: tools and functions (tool
 * calls; tool_choice and function_call only "none" or "auto"), echo, suffix
 * and a best_of above n. Which fields exist at all is check_body_fields'. */
static int parse_output_form(struct pctx *c, int obj)
{
    struct job_request *r = c->r;
    char path[PATH_MAX_], sub[PATH_MAX_];
    int i = lookup(c, obj, "response_format");
    if (i >= 0) {
        path_of(c, "response_format", path);
        if (json_kind(c->j, i) != JSON_OBJECT) return fail_type(c, path, "an object");
        static const char *const rf_fields[] = {"type", "json_schema"};
        int rc = check_members(c, i, path, rf_fields, 2);
        if (rc) return rc;
        path_sub(sub, path, ".type");
        int t = json_get(c->j, i, "type");
        if (t < 0) return fail_missing(c, sub);
        if (json_kind(c->j, t) != JSON_STRING) return fail_type(c, sub, "a string");
        if (json_str_eq(c->j, t, "json_object")) {
            r->json_object = true;
            r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        } else if (json_str_eq(c->j, t, "json_schema")) {
            char js_path[PATH_MAX_], sc_path[PATH_MAX_];
            path_sub(js_path, path, ".json_schema");
            const int js = lookup(c, i, "json_schema");
            if (js < 0) return fail_missing(c, js_path);
            if (json_kind(c->j, js) != JSON_OBJECT) return fail_type(c, js_path, "an object");
            /* name, description and strict describe the schema to OpenAI's
             * models; kvbatch always holds the output to it */
            static const char *const js_fields[] = {"name", "description", "schema", "strict"};
            if ((rc = check_members(c, js, js_path, js_fields, 4))) return rc;
            path_sub(sc_path, js_path, ".schema");
            const int sc = lookup(c, js, "schema");
            if (sc < 0) return fail_missing(c, sc_path);
            /* kept as written, whatever it is: the engine compiles it and
             * names what it refuses (jsonmode_schema_compile), so the job
             * format needs to know nothing of what a schema constrains */
            const int quote = json_kind(c->j, sc) == JSON_STRING; /* jsmn's span leaves out the quotes */
            const int from = c->j->tok[sc].start - quote, to = c->j->tok[sc].end + quote;
            r->json_schema_len = (size_t)(to - from);
            r->json_schema = kvb_strndup(c->j->src + from, r->json_schema_len);
            if (!r->json_schema) return fail_nomem(c);
            r->json_object = true;
            r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        } else if (!json_str_eq(c->j, t, "text")) {
            char got[48];
            excerpt(c, t, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, sub,
                        "field '%s' must be \"text\", \"json_object\" or \"json_schema\" (got '%s')", sub, got);
        }
    }
    static const char *const tool_fields[] = {"tools", "functions"};
    for (int k = 0; k < 2; k++) {
        i = lookup(c, obj, tool_fields[k]);
        if (i >= 0 && !(json_kind(c->j, i) == JSON_ARRAY && c->j->tok[i].size == 0)) {
            path_of(c, tool_fields[k], path);
            return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s': tool calling is not supported by kvbatch", path);
        }
    }
    /* With no tools there is nothing to call: "none" and "auto" mean the same */
    static const char *const choice_fields[] = {"tool_choice", "function_call"};
    for (int k = 0; k < 2; k++) {
        i = lookup(c, obj, choice_fields[k]);
        if (i >= 0 && !(json_kind(c->j, i) == JSON_STRING &&
                        (json_str_eq(c->j, i, "none") || json_str_eq(c->j, i, "auto")))) {
            path_of(c, choice_fields[k], path);
            return fail(c, JOB_ERR_INVALID_VALUE, path,
                        "field '%s': tool calling is not supported by kvbatch (only \"none\" or \"auto\")", path);
        }
    }
    int rc = parse_logit_bias(c, obj);
    if (rc) return rc;
    i = lookup(c, obj, "echo");
    if (i >= 0 && json_kind(c->j, i) != JSON_FALSE) {
        path_of(c, "echo", path);
        return fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' is not supported by kvbatch (only false)", path);
    }
    i = lookup(c, obj, "suffix");
    if (i >= 0 && !(json_kind(c->j, i) == JSON_STRING && json_str_eq(c->j, i, ""))) {
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
    if (r->ignore_eos && r->json_object) {
        path_of(c, "ignore_eos", path);
        return fail(c, JOB_ERR_INVALID_VALUE, path,
                    "field '%s' cannot go with response_format: the JSON output ends where the object does", path);
    }
    return 0;
}

/* ---- which fields exist --------------------------------------------------------------- */

enum { F_CHAT = 1, F_COMP = 2, F_BOTH = 3 };

/* Every body field kvbatch reads, and for which endpoints. */
static const struct { const char *name; unsigned where; } body_fields[] = {
    {"messages", F_CHAT}, {"prompt", F_COMP}, {"model", F_BOTH},
    {"max_tokens", F_BOTH}, {"max_completion_tokens", F_BOTH}, {"temperature", F_BOTH}, {"top_p", F_BOTH},
    {"top_k", F_BOTH}, {"min_p", F_BOTH}, {"seed", F_BOTH}, {"stop", F_BOTH}, {"presence_penalty", F_BOTH},
    {"frequency_penalty", F_BOTH}, {"repetition_penalty", F_BOTH}, {"n", F_BOTH}, {"logprobs", F_BOTH},
    {"top_logprobs", F_CHAT}, {"response_format", F_BOTH}, {"logit_bias", F_BOTH}, {"best_of", F_BOTH},
    {"echo", F_BOTH}, {"suffix", F_COMP}, {"tools", F_CHAT}, {"functions", F_CHAT}, {"tool_choice", F_CHAT},
    {"function_call", F_CHAT}, {"ignore_eos", F_BOTH}, {"min_tokens", F_BOTH}, {"stop_token_ids", F_BOTH},
    {"include_stop_str_in_output", F_BOTH}, {"skip_special_tokens", F_BOTH},
    {"spaces_between_special_tokens", F_BOTH}, {"use_beam_search", F_BOTH}, {"add_generation_prompt", F_CHAT},
    {"continue_final_message", F_CHAT},
};

/* Fields that mean nothing to an offline batch (how a reply is delivered,
 * who asked, how a server should queue or bill it). Kept short on purpose:
 * anything that could change the output is read or refused instead. */
static const char *const ignored_fields[] = {
    "stream", "stream_options", "user", "store", "metadata", "service_tier", "priority", "prompt_cache_key",
    "safety_identifier", "parallel_tool_calls", "cache_salt",
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
    static const struct { const char *name, *hint; } hints[] = {
        {"chat_template", "kvbatch does not run Jinja templates; choose a family with --chat-template NAME"},
        {"chat_template_kwargs", "kvbatch does not run Jinja templates"},
        {"guided_json", "use response_format json_schema"},
        {"guided_regex", "constrained decoding other than JSON is not supported"},
        {"guided_choice", "constrained decoding other than JSON is not supported"},
        {"guided_grammar", "constrained decoding other than JSON is not supported"},
        {"prompt_logprobs", "logprobs of the prompt are not computed"},
        {"truncate_prompt_tokens", "prompts are never cut; a prompt too long for --ctx is an error line"},
    };
    for (size_t k = 0; k < sizeof hints / sizeof hints[0]; k++)
        if (strcmp(name, hints[k].name) == 0) return hints[k].hint;
    return NULL;
}

/* The key of object member token k (a string), decoded into buf for
 * comparison; an over-long key is cut (it matches no field then). */
static void key_name(const struct pctx *c, int k, char *buf, size_t cap)
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

static int fail_unknown(struct pctx *c, const char *path, const char *name, const char *extra)
{
    const char *hint = extra ? extra : refusal_hint(name);
    return fail(c, JOB_ERR_UNSUPPORTED_FIELD, path, "field '%s' is not supported by kvbatch (%s)", path,
                hint ? hint : "README: Request fields lists those that are");
}

/* Refuses any member of the body (or the shorthand's top level, which also
 * holds custom_id, method and url) that kvbatch does not read and does not
 * ignore on purpose. */
static int check_body_fields(struct pctx *c, int obj)
{
    const struct job_request *r = c->r;
    const unsigned mine = r->url == JOB_URL_CHAT ? F_CHAT : F_COMP;
    int k = obj + 1;
    for (int m = 0; m < c->j->tok[obj].size; m++, k = json_skip(c->j, k + 1)) {
        char name[64], path[PATH_MAX_];
        key_name(c, k, name, sizeof name);
        if (r->shorthand && (!strcmp(name, "custom_id") || !strcmp(name, "method") || !strcmp(name, "url"))) continue;
        if (job_field_ignored(name)) continue;
        unsigned where = 0;
        for (size_t f = 0; f < sizeof body_fields / sizeof body_fields[0] && !where; f++)
            if (!strcmp(name, body_fields[f].name)) where = body_fields[f].where;
        if (where & mine) continue;
        path_of(c, name, path);
        if (where)
            return fail(c, JOB_ERR_UNSUPPORTED_FIELD, path, "field '%s' belongs to %s, not %s", path,
                        where == F_CHAT ? "/v1/chat/completions" : "/v1/completions",
                        mine == F_CHAT ? "/v1/chat/completions" : "/v1/completions");
        return fail_unknown(c, path, name, NULL);
    }
    return 0;
}

/* Refuses members of object token obj (at path) outside names[n]. */
static int check_members(struct pctx *c, int obj, const char *path, const char *const *names, size_t n)
{
    int k = obj + 1;
    for (int m = 0; m < c->j->tok[obj].size; m++, k = json_skip(c->j, k + 1)) {
        char name[64], sub[PATH_MAX_], dotted[72];
        key_name(c, k, name, sizeof name);
        bool known = false;
        for (size_t f = 0; f < n && !known; f++) known = !strcmp(name, names[f]);
        if (known) continue;
        snprintf(dotted, sizeof dotted, "%s%s", path[0] ? "." : "", name);
        path_sub(sub, path, dotted);
        return fail_unknown(c, sub, name, NULL);
    }
    return 0;
}

/* ---- the line ------------------------------------------------------------------------ */

static int parse_root(struct pctx *c)
{
    const struct json_doc *j = c->j;
    struct job_request *r = c->r;
    if (json_kind(j, 0) != JSON_OBJECT)
        return fail(c, JOB_ERR_INVALID_REQUEST, NULL, "the line must be a JSON object");

    int i = json_get(j, 0, "custom_id");
    if (i < 0 || json_kind(j, i) == JSON_NULL) return fail_missing(c, "custom_id");
    if (json_kind(j, i) != JSON_STRING) return fail_type(c, "custom_id", "a string");
    if (j->tok[i].end == j->tok[i].start)
        return fail(c, JOB_ERR_INVALID_VALUE, "custom_id", "field 'custom_id' must not be empty");
    enum kvb_status st = json_str_dup_exact(j, i, &r->custom_id, &r->custom_id_len);
    if (st == KVB_ERR_FORMAT)
        return fail(c, JOB_ERR_INVALID_VALUE, "custom_id",
                    "field 'custom_id' holds bytes that are not valid UTF-8 (it could not be echoed back as written)");
    if (st != KVB_OK) return fail_nomem(c);
    r->custom_id_json_len = (size_t)(j->tok[i].end - j->tok[i].start);
    r->custom_id_json = kvb_strndup(j->src + j->tok[i].start, r->custom_id_json_len);
    if (!r->custom_id_json) return fail_nomem(c);

    i = lookup(c, 0, "method");
    if (i >= 0) {
        if (json_kind(j, i) != JSON_STRING) return fail_type(c, "method", "a string");
        if (!json_str_eq(j, i, "POST")) {
            char got[48];
            excerpt(c, i, got, sizeof got);
            return fail(c, JOB_ERR_INVALID_VALUE, "method", "field 'method' must be \"POST\" (got '%s')", got);
        }
    }

    bool url_given = false;
    i = lookup(c, 0, "url");
    if (i >= 0) {
        if (json_kind(j, i) != JSON_STRING) return fail_type(c, "url", "a string");
        if (json_str_eq(j, i, "/v1/chat/completions")) {
            r->url = JOB_URL_CHAT;
        } else if (json_str_eq(j, i, "/v1/completions")) {
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
        if (json_kind(j, body) != JSON_OBJECT) return fail_type(c, "body", "an object");
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
    if (!r->shorthand) {
        static const char *const top[] = {"custom_id", "method", "url", "body"};
        if ((rc = check_members(c, 0, "", top, 4))) return rc;
    }
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
    if ((rc = check_body_fields(c, body))) return rc;

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
    struct json_doc j;
    const char *why;
    size_t where;
    enum kvb_status st = json_parse(line, len, &j, &why, &where);
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
