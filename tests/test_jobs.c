/* test_jobs.c — the jobs module: request parsing (every accepted shape,
 * defaults, escapes, every bad-input case with its code, line and field),
 * result/error lines read back as JSON, the line reader on a 2 MB line,
 * resume over torn and corrupt files, id sets, and allocation failures.
 *
 * Output lines are checked twice: by an independent jsmn in strict mode
 * compiled into this file, and by the module's own strict reader, which also
 * lets the checks look fields up by path. */
#define JSMN_STATIC
#define JSMN_STRICT
#include <jsmn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "jobs/job.h"
#include "base/json.h"
#include "engine/jsonmode.h"
#include "support/testutil.h"

/* ---- helpers: JSON read-back ------------------------------------------------------ */

/* Strict jsmn (this file's copy) must accept the whole line as one value. */
static bool strict_jsmn_ok(const char *s, size_t n)
{
    jsmn_parser p;
    jsmn_init(&p);
    int count = jsmn_parse(&p, s, n, NULL, 0);
    if (count <= 0) return false;
    jsmntok_t *t = malloc((size_t)count * sizeof *t);
    jsmn_init(&p);
    int got = jsmn_parse(&p, s, n, t, (unsigned)count);
    bool ok = got == count && t[0].type == JSMN_OBJECT && t[0].start == 0 && (size_t)t[0].end == n;
    free(t);
    return ok;
}

struct doc {
    struct json_doc j;
    bool ok;
};

/* Parses one output line (which must end in exactly one "\n"). */
static void doc_open(struct doc *d, const char *line, size_t len)
{
    memset(d, 0, sizeof *d);
    CHECK_MSG(len > 0 && line[len - 1] == '\n', "line does not end in \\n");
    CHECK_MSG(memchr(line, '\n', len - 1) == NULL, "line holds a \\n before its end");
    size_t n = len - 1;
    CHECK_MSG(strict_jsmn_ok(line, n), "strict jsmn rejects: %.*s", (int)(n > 300 ? 300 : n), line);
    const char *why;
    size_t where;
    d->ok = json_parse(line, n, &d->j, &why, &where) == KVB_OK;
    CHECK_MSG(d->ok, "not valid JSON (%s at %zu): %.*s", why ? why : "?", where, (int)(n > 300 ? 300 : n), line);
}

static void doc_close(struct doc *d) { json_free(&d->j); }

/* Token at a path such as "response.body.choices[0].message.content", or -1. */
static int doc_at(const struct doc *d, const char *path)
{
    if (!d->ok) return -1;
    int cur = 0;
    const char *p = path;
    while (*p) {
        if (*p == '.') p++;
        if (*p == '[') {
            int idx = atoi(p + 1);
            p = strchr(p, ']') + 1;
            if (json_kind(&d->j, cur) != JSON_ARRAY || idx >= d->j.tok[cur].size) return -1;
            int i = cur + 1;
            for (int k = 0; k < idx; k++) i = json_skip(&d->j, i);
            cur = i;
            continue;
        }
        char key[64];
        size_t k = 0;
        while (*p && *p != '.' && *p != '[' && k < sizeof key - 1) key[k++] = *p++;
        key[k] = '\0';
        cur = json_get(&d->j, cur, key);
        if (cur < 0) return -1;
    }
    return cur;
}

/* Decoded string at path (malloc'd; "" when absent or not a string). */
static char *doc_str(const struct doc *d, const char *path)
{
    int i = doc_at(d, path);
    if (i < 0 || json_kind(&d->j, i) != JSON_STRING) {
        char *e = malloc(1);
        e[0] = '\0';
        return e;
    }
    char *s;
    size_t n;
    if (json_str_dup(&d->j, i, &s, &n) != KVB_OK) abort();
    char *c = malloc(n + 1);
    memcpy(c, s, n + 1);
    kvb_free(s);
    return c;
}

static bool doc_str_is(const struct doc *d, const char *path, const char *want)
{
    char *s = doc_str(d, path);
    bool eq = strcmp(s, want) == 0;
    if (!eq) fprintf(stderr, "  %s = '%s', want '%s'\n", path, s, want);
    free(s);
    return eq;
}

static double doc_num(const struct doc *d, const char *path)
{
    int i = doc_at(d, path);
    if (i < 0 || json_kind(&d->j, i) != JSON_NUMBER) return NAN;
    char buf[64];
    int n = d->j.tok[i].end - d->j.tok[i].start;
    if (n >= (int)sizeof buf) return NAN;
    memcpy(buf, d->j.src + d->j.tok[i].start, (size_t)n);
    buf[n] = '\0';
    return strtod(buf, NULL);
}

static bool doc_is_null(const struct doc *d, const char *path)
{
    int i = doc_at(d, path);
    return i >= 0 && json_kind(&d->j, i) == JSON_NULL;
}

/* ---- helpers: parsing ------------------------------------------------------------- */

static void parse_ok(const char *line, struct job_request *r)
{
    struct job_error e;
    memset(&e, 0, sizeof e);
    enum kvb_status st = job_parse_line(line, strlen(line), 3, r, &e);
    CHECK_MSG(st == KVB_OK, "rejected (%s): %s\n  line: %s", e.code ? e.code : "?", e.message, line);
}

/* The line must fail with `code`; the message must name line `ln` and, when
 * param is non-NULL, the field (in quotes), which must also be e.param. */
static void expect_err_at(const char *line, uint64_t ln, const char *code, const char *param)
{
    struct job_request r;
    struct job_error e;
    memset(&e, 0, sizeof e);
    enum kvb_status st = job_parse_line(line, strlen(line), ln, &r, &e);
    CHECK_MSG(st == KVB_ERR_FORMAT, "accepted: %s", line);
    if (st == KVB_ERR_FORMAT) {
        CHECK_MSG(e.code && strcmp(e.code, code) == 0, "code %s, want %s: %s", e.code, code, line);
        char want[64];
        snprintf(want, sizeof want, "line %llu: ", (unsigned long long)ln);
        CHECK_MSG(strncmp(e.message, want, strlen(want)) == 0, "message '%s' lacks '%s'", e.message, want);
        CHECK_EQ_INT(e.line_no, ln);
        if (param) {
            char quoted[160];
            snprintf(quoted, sizeof quoted, "'%s'", param);
            CHECK_MSG(strstr(e.message, quoted) != NULL, "message '%s' does not name %s", e.message, quoted);
            CHECK_MSG(strcmp(e.param, param) == 0, "param '%s', want '%s'", e.param, param);
        }
    }
    job_request_free(&r);
}

static void expect_err(const char *line, const char *code, const char *param)
{
    expect_err_at(line, 7, code, param);
}

#define CHAT_PRE "{\"custom_id\":\"c1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define COMP_PRE "{\"custom_id\":\"p1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"hi\""

/* ---- parsing: bad input ------------------------------------------------------------- */

static void test_bad_json(void)
{
    expect_err("{\"custom_id\": \"a\",", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"prompt\":\"x\",}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"prompt\":tru}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"prompt\":[\"x\" \"y\"]}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\" \"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\\x\",\"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\\u12\",\"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\tb\",\"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"prompt\":\"x\"} {}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"max_tokens\":01,\"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"max_tokens\":1.,\"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":\"a\",\"max_tokens\":-,\"prompt\":\"x\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{custom_id:\"a\"}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("{\"custom_id\":'a'}", JOB_ERR_INVALID_JSON, NULL);
    expect_err("", JOB_ERR_INVALID_JSON, NULL);
    expect_err("   ", JOB_ERR_INVALID_JSON, NULL);
    expect_err("\"unterminated", JOB_ERR_INVALID_JSON, NULL);
    /* a NUL byte in the middle of a line is not JSON either */
    {
        const char line[] = "{\"custom_id\":\"a\0b\",\"prompt\":\"x\"}";
        struct job_request r;
        struct job_error e;
        CHECK(job_parse_line(line, sizeof line - 1, 9, &r, &e) == KVB_ERR_FORMAT);
        CHECK(strcmp(e.code, JOB_ERR_INVALID_JSON) == 0);
        CHECK(strncmp(e.message, "line 9: invalid JSON", 20) == 0);
        job_request_free(&r);
    }
    /* nesting: deep but within the limit is fine; past it is refused, not a crash */
    {
        size_t depth = 100000;
        char *s = malloc(depth * 2 + 64);
        size_t n = (size_t)sprintf(s, "{\"custom_id\":\"d\",\"prompt\":\"x\",\"metadata\":");
        for (size_t k = 0; k < depth; k++) s[n++] = '[';
        for (size_t k = 0; k < depth; k++) s[n++] = ']';
        s[n++] = '}';
        s[n] = '\0';
        expect_err(s, JOB_ERR_INVALID_JSON, NULL);
        n = (size_t)sprintf(s, "{\"custom_id\":\"d\",\"prompt\":\"x\",\"metadata\":");
        for (size_t k = 0; k < 200; k++) s[n++] = '[';
        for (size_t k = 0; k < 200; k++) s[n++] = ']';
        s[n++] = '}';
        s[n] = '\0';
        struct job_request r;
        parse_ok(s, &r);
        job_request_free(&r);
        free(s);
    }
}

static void test_bad_shape(void)
{
    expect_err("[1,2]", JOB_ERR_INVALID_REQUEST, NULL);
    expect_err("\"just a string\"", JOB_ERR_INVALID_REQUEST, NULL);
    expect_err("42", JOB_ERR_INVALID_REQUEST, NULL);
    expect_err("{\"prompt\":\"x\"}", JOB_ERR_MISSING_FIELD, "custom_id");
    expect_err("{\"custom_id\":null,\"prompt\":\"x\"}", JOB_ERR_MISSING_FIELD, "custom_id");
    expect_err("{\"custom_id\":5,\"prompt\":\"x\"}", JOB_ERR_INVALID_TYPE, "custom_id");
    expect_err("{\"custom_id\":[\"a\"],\"prompt\":\"x\"}", JOB_ERR_INVALID_TYPE, "custom_id");
    expect_err("{\"custom_id\":\"\",\"prompt\":\"x\"}", JOB_ERR_INVALID_VALUE, "custom_id");
    expect_err("{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}",
               JOB_ERR_INVALID_VALUE, "method");
    expect_err("{\"custom_id\":\"a\",\"method\":1,\"body\":{\"prompt\":\"x\"}}", JOB_ERR_INVALID_TYPE, "method");
    expect_err("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":\"x\"}}",
               JOB_ERR_INVALID_VALUE, "url");
    expect_err("{\"custom_id\":\"a\",\"url\":\"v1/completions\",\"body\":{\"prompt\":\"x\"}}", JOB_ERR_INVALID_VALUE,
               "url");
    {
        /* a long bad value is quoted only in part */
        char line[1024], url[600];
        memset(url, 'u', sizeof url - 1);
        url[sizeof url - 1] = '\0';
        snprintf(line, sizeof line, "{\"custom_id\":\"a\",\"url\":\"%s\",\"body\":{\"prompt\":\"x\"}}", url);
        expect_err(line, JOB_ERR_INVALID_VALUE, "url");
        struct job_request r;
        struct job_error e;
        CHECK(job_parse_line(line, strlen(line), 1, &r, &e) == KVB_ERR_FORMAT);
        CHECK(strstr(e.message, "uuu...") != NULL && strlen(e.message) < 200);
        job_request_free(&r);
    }
    expect_err("{\"custom_id\":\"a\",\"url\":7,\"body\":{\"prompt\":\"x\"}}", JOB_ERR_INVALID_TYPE, "url");
    expect_err("{\"custom_id\":\"a\",\"url\":\"/v1/chat/completions\",\"body\":\"x\"}", JOB_ERR_INVALID_TYPE, "body");
    expect_err("{\"custom_id\":\"a\",\"url\":\"/v1/chat/completions\",\"body\":{\"prompt\":\"x\"}}",
               JOB_ERR_MISSING_FIELD, "body.messages");
    expect_err("{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"messages\":[]}}", JOB_ERR_MISSING_FIELD,
               "body.prompt");
    expect_err("{\"custom_id\":\"a\",\"max_tokens\":5}", JOB_ERR_MISSING_FIELD, "messages");
    expect_err("{\"custom_id\":\"a\",\"body\":{}}", JOB_ERR_MISSING_FIELD, "body.messages");
    expect_err("{\"custom_id\":\"a\",\"prompt\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"y\"}]}",
               JOB_ERR_INVALID_REQUEST, "prompt");
}

static void test_bad_messages(void)
{
    const char *pre = "{\"custom_id\":\"a\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":";
    char line[1024];
#define MSGS(m) (snprintf(line, sizeof line, "%s%s}}", pre, m), line)
    expect_err(MSGS("[]"), JOB_ERR_INVALID_VALUE, "body.messages");
    expect_err(MSGS("{}"), JOB_ERR_INVALID_TYPE, "body.messages");
    expect_err(MSGS("\"hi\""), JOB_ERR_INVALID_TYPE, "body.messages");
    expect_err(MSGS("[\"hi\"]"), JOB_ERR_INVALID_TYPE, "body.messages[0]");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\",\"content\":\"b\"}]"),
               JOB_ERR_INVALID_VALUE, "body.messages[1].role");
    expect_err(MSGS("[{\"role\":\"User\",\"content\":\"a\"}]"), JOB_ERR_INVALID_VALUE, "body.messages[0].role");
    expect_err(MSGS("[{\"content\":\"a\"}]"), JOB_ERR_MISSING_FIELD, "body.messages[0].role");
    expect_err(MSGS("[{\"role\":1,\"content\":\"a\"}]"), JOB_ERR_INVALID_TYPE, "body.messages[0].role");
    expect_err(MSGS("[{\"role\":\"user\"}]"), JOB_ERR_MISSING_FIELD, "body.messages[0].content");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":null}]"), JOB_ERR_INVALID_TYPE, "body.messages[0].content");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":5}]"), JOB_ERR_INVALID_TYPE, "body.messages[0].content");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":[\"x\"]}]"), JOB_ERR_INVALID_TYPE, "body.messages[0].content[0]");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\","
                    "\"image_url\":{\"url\":\"http://x\"}}]}]"),
               JOB_ERR_INVALID_VALUE, "body.messages[0].content[1].type");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]"), JOB_ERR_MISSING_FIELD,
               "body.messages[0].content[0].type");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]"), JOB_ERR_MISSING_FIELD,
               "body.messages[0].content[0].text");
    expect_err(MSGS("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]"), JOB_ERR_INVALID_TYPE,
               "body.messages[0].content[0].text");
#undef MSGS
    /* shorthand paths have no "body." */
    expect_err("{\"custom_id\":\"a\",\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", JOB_ERR_INVALID_VALUE,
               "messages[0].role");
}

static void test_bad_prompt(void)
{
    const char *pre = "{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":";
    char line[512];
#define PR(p) (snprintf(line, sizeof line, "%s%s}}", pre, p), line)
    expect_err(PR("5"), JOB_ERR_INVALID_TYPE, "body.prompt");
    expect_err(PR("{}"), JOB_ERR_INVALID_TYPE, "body.prompt");
    expect_err(PR("[]"), JOB_ERR_INVALID_VALUE, "body.prompt");
    expect_err(PR("[true]"), JOB_ERR_INVALID_TYPE, "body.prompt[0]");
    /* a list holds prompts of one kind; token ids are integers >= 0; no empty lists */
    expect_err(PR("[\"a\",[1]]"), JOB_ERR_INVALID_TYPE, "body.prompt[1]");
    expect_err(PR("[[1],\"a\"]"), JOB_ERR_INVALID_TYPE, "body.prompt[1]");
    expect_err(PR("[1,\"a\"]"), JOB_ERR_INVALID_TYPE, "body.prompt[1]");
    expect_err(PR("[1,2.5]"), JOB_ERR_INVALID_TYPE, "body.prompt[1]");
    expect_err(PR("[1,-2]"), JOB_ERR_INVALID_VALUE, "body.prompt[1]");
    expect_err(PR("[1,3e10]"), JOB_ERR_INVALID_VALUE, "body.prompt[1]");
    expect_err(PR("[[1,2],[]]"), JOB_ERR_INVALID_VALUE, "body.prompt[1]");
    expect_err(PR("[[1,[2]]]"), JOB_ERR_INVALID_TYPE, "body.prompt[0][1]");
    {
        char many[1200] = "[";
        for (int k = 0; k <= JOB_MAX_PROMPTS; k++) strcat(many, k ? ",\"p\"" : "\"p\"");
        strcat(many, "]");
        char big[1400];
        snprintf(big, sizeof big, "%s%s}}", pre, many);
        expect_err(big, JOB_ERR_INVALID_VALUE, "body.prompt");
    }
#undef PR
}

static void test_bad_sampling(void)
{
    char line[1024];
#define CH(f) (snprintf(line, sizeof line, "%s,%s}}", CHAT_PRE, f), line)
#define CO(f) (snprintf(line, sizeof line, "%s,%s}}", COMP_PRE, f), line)
    /* wrong types, with the exact message the issue asks for */
    {
        struct job_request r;
        struct job_error e;
        const char *l = CH("\"temperature\":\"0.7\"");
        CHECK(job_parse_line(l, strlen(l), 7, &r, &e) == KVB_ERR_FORMAT);
        CHECK_MSG(strcmp(e.message, "line 7: field 'body.temperature' must be a number") == 0, "%s", e.message);
        CHECK(strcmp(e.code, JOB_ERR_INVALID_TYPE) == 0);
        CHECK(r.custom_id && strcmp(r.custom_id, "c1") == 0); /* kept for the error line */
        CHECK(r.messages == NULL && r.n_messages == 0);        /* the rest is dropped */
        job_request_free(&r);
    }
    expect_err(CH("\"temperature\":true"), JOB_ERR_INVALID_TYPE, "body.temperature");
    expect_err(CH("\"max_tokens\":\"16\""), JOB_ERR_INVALID_TYPE, "body.max_tokens");
    expect_err(CH("\"max_tokens\":1.5"), JOB_ERR_INVALID_TYPE, "body.max_tokens");
    expect_err(CH("\"top_k\":[1]"), JOB_ERR_INVALID_TYPE, "body.top_k");
    expect_err(CH("\"seed\":\"1\""), JOB_ERR_INVALID_TYPE, "body.seed");
    expect_err(CH("\"seed\":1.5"), JOB_ERR_INVALID_TYPE, "body.seed");
    expect_err(CH("\"stop\":5"), JOB_ERR_INVALID_TYPE, "body.stop");
    expect_err(CH("\"stop\":[\"a\",1]"), JOB_ERR_INVALID_TYPE, "body.stop[1]");
    expect_err(CH("\"model\":5"), JOB_ERR_INVALID_TYPE, "body.model");
    expect_err(CH("\"n\":\"2\""), JOB_ERR_INVALID_TYPE, "body.n");
    expect_err(CH("\"logprobs\":1"), JOB_ERR_INVALID_TYPE, "body.logprobs");
    expect_err(CO("\"logprobs\":true"), JOB_ERR_INVALID_TYPE, "body.logprobs");
    expect_err(CH("\"presence_penalty\":{}"), JOB_ERR_INVALID_TYPE, "body.presence_penalty");

    /* out of range */
    expect_err(CH("\"max_tokens\":-5"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CH("\"max_tokens\":0"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CH("\"max_tokens\":3000000000"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CH("\"max_completion_tokens\":-1"), JOB_ERR_INVALID_VALUE, "body.max_completion_tokens");
    expect_err(CH("\"temperature\":-0.1"), JOB_ERR_INVALID_VALUE, "body.temperature");
    expect_err(CH("\"temperature\":2.5"), JOB_ERR_INVALID_VALUE, "body.temperature");
    expect_err(CH("\"temperature\":1e400"), JOB_ERR_INVALID_VALUE, "body.temperature");
    expect_err(CH("\"top_p\":0"), JOB_ERR_INVALID_VALUE, "body.top_p");
    expect_err(CH("\"top_p\":1.01"), JOB_ERR_INVALID_VALUE, "body.top_p");
    expect_err(CH("\"top_p\":-1"), JOB_ERR_INVALID_VALUE, "body.top_p");
    expect_err(CH("\"top_p\":1e-50"), JOB_ERR_INVALID_VALUE, "body.top_p"); /* 0 as a float */
    expect_err(CH("\"repetition_penalty\":1e-60"), JOB_ERR_INVALID_VALUE, "body.repetition_penalty");
    expect_err(CH("\"top_k\":-2"), JOB_ERR_INVALID_VALUE, "body.top_k");
    expect_err(CH("\"min_p\":1.5"), JOB_ERR_INVALID_VALUE, "body.min_p");
    expect_err(CH("\"min_p\":-0.5"), JOB_ERR_INVALID_VALUE, "body.min_p");
    expect_err(CH("\"n\":0"), JOB_ERR_INVALID_VALUE, "body.n");
    expect_err(CH("\"n\":17"), JOB_ERR_INVALID_VALUE, "body.n");
    expect_err(CH("\"presence_penalty\":2.5"), JOB_ERR_INVALID_VALUE, "body.presence_penalty");
    expect_err(CH("\"frequency_penalty\":-3"), JOB_ERR_INVALID_VALUE, "body.frequency_penalty");
    expect_err(CH("\"repetition_penalty\":0"), JOB_ERR_INVALID_VALUE, "body.repetition_penalty");
    expect_err(CH("\"repetition_penalty\":3"), JOB_ERR_INVALID_VALUE, "body.repetition_penalty");
    expect_err(CH("\"seed\":18446744073709551616"), JOB_ERR_INVALID_VALUE, "body.seed");
    expect_err(CH("\"seed\":-9223372036854775809"), JOB_ERR_INVALID_VALUE, "body.seed");
    expect_err(CH("\"seed\":1e300"), JOB_ERR_INVALID_VALUE, "body.seed");
    expect_err(CH("\"stop\":\"\""), JOB_ERR_INVALID_VALUE, "body.stop");
    expect_err(CH("\"stop\":[\"a\",\"\"]"), JOB_ERR_INVALID_VALUE, "body.stop[1]");
    expect_err(CH("\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]"), JOB_ERR_INVALID_VALUE, "body.stop");
    expect_err(CH("\"top_logprobs\":3"), JOB_ERR_INVALID_VALUE, "body.top_logprobs");
    expect_err(CH("\"logprobs\":true,\"top_logprobs\":21"), JOB_ERR_INVALID_VALUE, "body.top_logprobs");
    expect_err(CO("\"logprobs\":21"), JOB_ERR_INVALID_VALUE, "body.logprobs");
    expect_err(CO("\"logprobs\":-1"), JOB_ERR_INVALID_VALUE, "body.logprobs");
    /* output forms kvbatch does not make are refused by name, not ignored */
    expect_err(CH("\"response_format\":\"json\""), JOB_ERR_INVALID_TYPE, "body.response_format");
    expect_err(CH("\"response_format\":{}"), JOB_ERR_MISSING_FIELD, "body.response_format.type");
    expect_err(CH("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}"), JOB_ERR_MISSING_FIELD,
               "body.response_format.json_schema.schema");
    expect_err(CH("\"response_format\":{\"type\":\"xml\"}"), JOB_ERR_INVALID_VALUE, "body.response_format.type");
    expect_err(CH("\"tools\":[{\"type\":\"function\"}]"), JOB_ERR_INVALID_VALUE, "body.tools");
    expect_err(CH("\"functions\":[{}]"), JOB_ERR_INVALID_VALUE, "body.functions");
    expect_err(CH("\"logit_bias\":[1]"), JOB_ERR_INVALID_TYPE, "body.logit_bias");
    expect_err(CH("\"logit_bias\":{\"abc\":1}"), JOB_ERR_INVALID_VALUE, "body.logit_bias");
    expect_err(CH("\"logit_bias\":{\"-5\":1}"), JOB_ERR_INVALID_VALUE, "body.logit_bias");
    expect_err(CH("\"logit_bias\":{\" 5\":1}"), JOB_ERR_INVALID_VALUE, "body.logit_bias");
    expect_err(CH("\"logit_bias\":{\"+5\":1}"), JOB_ERR_INVALID_VALUE, "body.logit_bias");
    expect_err(CH("\"logit_bias\":{\"99999999999\":1}"), JOB_ERR_INVALID_VALUE, "body.logit_bias");
    expect_err(CH("\"logit_bias\":{\"7\":101}"), JOB_ERR_INVALID_VALUE, "body.logit_bias.7");
    expect_err(CH("\"logit_bias\":{\"7\":\"1\"}"), JOB_ERR_INVALID_TYPE, "body.logit_bias.7");
    expect_err(CO("\"echo\":true"), JOB_ERR_INVALID_VALUE, "body.echo");
    expect_err(CO("\"suffix\":\"end\""), JOB_ERR_INVALID_VALUE, "body.suffix");
    expect_err(CO("\"best_of\":3"), JOB_ERR_INVALID_VALUE, "body.best_of");
    {
        struct job_request r;
        parse_ok(CH("\"response_format\":{\"type\":\"json_object\"},\"tools\":[],\"logit_bias\":{},"
                    "\"stream\":false,\"user\":\"u\",\"n\":2,\"best_of\":2"), &r);
        CHECK(r.json_object && (r.given & JOB_GIVEN_RESPONSE_FORMAT));
        CHECK(r.n_logit_bias == 0 && !(r.given & JOB_GIVEN_LOGIT_BIAS));
        job_request_free(&r);
        parse_ok(CH("\"logit_bias\":{\"50256\":-100,\"7\":2.5,\"50256\":3}"), &r);
        CHECK_EQ_INT(r.n_logit_bias, 2); /* a repeated id keeps its last bias */
        CHECK(r.n_logit_bias == 2 && r.logit_bias[0].token == 50256 && r.logit_bias[0].value == 3.0f &&
              r.logit_bias[1].token == 7 && r.logit_bias[1].value == 2.5f);
        job_request_free(&r);
        parse_ok(CO("\"response_format\":{\"type\":\"text\"},\"echo\":false,\"suffix\":null"), &r);
        CHECK(!r.json_object && !r.json_schema);
        job_request_free(&r);
        parse_ok(CH("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,"
                    "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"),
                 &r);
        /* the schema is kept as written; the engine compiles it (test_jsonmode) */
        static const char sc[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
        CHECK(r.json_object && r.json_schema && r.json_schema_len == sizeof sc - 1 && strcmp(r.json_schema, sc) == 0);
        job_request_free(&r);
        /* whatever it is: a schema that is not an object is the engine's to refuse */
        parse_ok(CH("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":\"x\\u0041\"}}"), &r);
        CHECK(r.json_schema && strcmp(r.json_schema, "\"x\\u0041\"") == 0);
        job_request_free(&r);
    }
    /* shorthand: fields at top level, paths without "body." */
    expect_err("{\"custom_id\":\"s\",\"prompt\":\"x\",\"temperature\":-1}", JOB_ERR_INVALID_VALUE, "temperature");
    expect_err("{\"custom_id\":\"s\",\"prompt\":\"x\",\"max_tokens\":-5}", JOB_ERR_INVALID_VALUE, "max_tokens");
    /* the line number is whatever the caller says */
    expect_err_at("{\"custom_id\":\"s\",\"prompt\":\"x\",\"top_p\":2}", 123456789012ULL, JOB_ERR_INVALID_VALUE, "top_p");
#undef CH
#undef CO
}

/* ---- parsing: accepted shapes --------------------------------------------------------- */

static void test_defaults(void)
{
    struct job_request r;
    parse_ok("{\"custom_id\":\"d\",\"prompt\":\"x\"}", &r);
    CHECK(r.url == JOB_URL_COMPLETION);
    CHECK(r.shorthand);
    CHECK(r.given == 0);
    CHECK_EQ_INT(r.line_no, 3);
    CHECK(r.model == NULL);
    CHECK_EQ_INT(r.max_tokens, 256);
    CHECK(r.temperature == 1.0f);
    CHECK(r.top_p == 1.0f);
    CHECK_EQ_INT(r.top_k, 0);
    CHECK(r.min_p == 0.0f);
    CHECK(r.seed == 0);
    CHECK_EQ_INT(r.n_stop, 0);
    CHECK(r.presence_penalty == 0.0f && r.frequency_penalty == 0.0f);
    CHECK(r.repetition_penalty == 1.0f);
    CHECK_EQ_INT(r.n, 1);
    CHECK(!r.logprobs);
    CHECK_EQ_INT(r.top_logprobs, 0);
    job_request_free(&r);

    /* null means "not given" */
    parse_ok("{\"custom_id\":\"d\",\"prompt\":\"x\",\"temperature\":null,\"max_tokens\":null,\"stop\":null,"
             "\"seed\":null,\"model\":null,\"logprobs\":null,\"method\":null,\"url\":null}",
             &r);
    CHECK(r.given == 0);
    CHECK(r.temperature == 1.0f);
    CHECK_EQ_INT(r.max_tokens, 256);
    job_request_free(&r);
}

static void test_openai_chat(void)
{
    struct job_request r;
    parse_ok("{\"custom_id\":\"req-1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
             "\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"Hello!\"},{\"role\":\"assistant\",\"content\":\"Hi.\"},"
             "{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"Bye\",\"name\":\"bob\"}],"
             "\"max_tokens\":32,\"temperature\":0.2,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":1234,"
             "\"stop\":[\"\\n\\n\",\"END\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
             "\"repetition_penalty\":1.1,\"n\":3,\"logprobs\":true,\"top_logprobs\":5,"
             "\"stream\":false,\"metadata\":{\"a\":[1,{\"b\":null}]},\"response_format\":{\"type\":\"text\"}}}",
             &r);
    CHECK(r.url == JOB_URL_CHAT);
    CHECK(!r.shorthand);
    CHECK(strcmp(r.custom_id, "req-1") == 0 && r.custom_id_len == 5);
    CHECK(r.model && strcmp(r.model, "gpt-4o-mini") == 0);
    CHECK_EQ_INT(r.n_messages, 5);
    if (r.n_messages == 5) {
        CHECK(r.messages[0].role == JOB_ROLE_SYSTEM && strcmp(r.messages[0].content, "Be brief.") == 0);
        CHECK(r.messages[1].role == JOB_ROLE_USER && strcmp(r.messages[1].content, "Hello!") == 0);
        CHECK_EQ_INT(r.messages[1].content_len, 6);
        CHECK(r.messages[2].role == JOB_ROLE_ASSISTANT);
        CHECK(r.messages[3].role == JOB_ROLE_DEVELOPER);
        CHECK(strcmp(job_role_name(r.messages[3].role), "developer") == 0);
        CHECK(strcmp(r.messages[4].content, "Bye") == 0);
    }
    CHECK(r.prompt == NULL);
    CHECK_EQ_INT(r.max_tokens, 32);
    CHECK(r.temperature == 0.2f && r.top_p == 0.9f && r.min_p == 0.05f);
    CHECK_EQ_INT(r.top_k, 40);
    CHECK(r.seed == 1234);
    CHECK_EQ_INT(r.n_stop, 2);
    if (r.n_stop == 2) {
        CHECK(strcmp(r.stop[0], "\n\n") == 0 && r.stop_len[0] == 2);
        CHECK(strcmp(r.stop[1], "END") == 0);
    }
    CHECK(r.presence_penalty == 0.5f && r.frequency_penalty == -0.5f && r.repetition_penalty == 1.1f);
    CHECK_EQ_INT(r.n, 3);
    CHECK(r.logprobs);
    CHECK_EQ_INT(r.top_logprobs, 5);
    uint32_t all = JOB_GIVEN_MODEL | JOB_GIVEN_MAX_TOKENS | JOB_GIVEN_TEMPERATURE | JOB_GIVEN_TOP_P |
                   JOB_GIVEN_TOP_K | JOB_GIVEN_MIN_P | JOB_GIVEN_SEED | JOB_GIVEN_STOP |
                   JOB_GIVEN_PRESENCE_PENALTY | JOB_GIVEN_FREQUENCY_PENALTY | JOB_GIVEN_REPETITION_PENALTY |
                   JOB_GIVEN_N | JOB_GIVEN_LOGPROBS | JOB_GIVEN_TOP_LOGPROBS;
    CHECK(r.given == all);
    job_request_free(&r);
    CHECK(r.custom_id == NULL && r.messages == NULL);

    /* content as text parts, joined with "\n"; an empty parts array is "" */
    parse_ok("{\"custom_id\":\"parts\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\","
             "\"content\":[{\"type\":\"text\",\"text\":\"first\"},{\"text\":\"second\",\"type\":\"text\"}]},"
             "{\"role\":\"user\",\"content\":[]},{\"role\":\"assistant\",\"content\":null}]}}",
             &r);
    CHECK_EQ_INT(r.n_messages, 3);
    if (r.n_messages == 3) {
        CHECK(strcmp(r.messages[0].content, "first\nsecond") == 0);
        CHECK_EQ_INT(r.messages[0].content_len, 12);
        CHECK(strcmp(r.messages[1].content, "") == 0);
        CHECK(strcmp(r.messages[2].content, "") == 0);
    }
    job_request_free(&r);

    /* url and method may be left out of the batch form: url follows the body */
    parse_ok("{\"custom_id\":\"nourl\",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}}", &r);
    CHECK(r.url == JOB_URL_CHAT && !r.shorthand);
    job_request_free(&r);

    /* chat logprobs false with no top_logprobs; max_completion_tokens wins */
    parse_ok(CHAT_PRE ",\"logprobs\":false,\"max_tokens\":10,\"max_completion_tokens\":20}}", &r);
    CHECK(!r.logprobs && (r.given & JOB_GIVEN_LOGPROBS));
    CHECK_EQ_INT(r.max_tokens, 20);
    job_request_free(&r);
    parse_ok(CHAT_PRE ",\"max_completion_tokens\":20,\"max_tokens\":10}}", &r);
    CHECK_EQ_INT(r.max_tokens, 20);
    job_request_free(&r);
}

static void test_openai_completion(void)
{
    struct job_request r;
    parse_ok(COMP_PRE ",\"max_tokens\":16,\"stop\":\"\\n\",\"logprobs\":3,\"top_k\":-1,\"seed\":-1,"
                      "\"echo\":false,\"best_of\":1,\"suffix\":null}}",
             &r);
    CHECK(r.url == JOB_URL_COMPLETION);
    CHECK(r.prompt && strcmp(r.prompt, "hi") == 0 && r.prompt_len == 2);
    CHECK(r.messages == NULL);
    CHECK_EQ_INT(r.max_tokens, 16);
    CHECK_EQ_INT(r.n_stop, 1);
    if (r.n_stop == 1) CHECK(strcmp(r.stop[0], "\n") == 0);
    CHECK(r.logprobs);
    CHECK_EQ_INT(r.top_logprobs, 3);
    CHECK_EQ_INT(r.top_k, 0); /* vLLM's -1 = off */
    CHECK(r.given & JOB_GIVEN_TOP_K);
    CHECK(r.seed == UINT64_MAX);
    job_request_free(&r);

    parse_ok("{\"custom_id\":\"arr\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[\"one "
             "prompt\"],\"logprobs\":0}}",
             &r);
    CHECK(r.prompt && strcmp(r.prompt, "one prompt") == 0);
    CHECK(r.logprobs && r.top_logprobs == 0);
    job_request_free(&r);

    /* empty prompt text is allowed (the model continues from BOS) */
    parse_ok("{\"custom_id\":\"e\",\"prompt\":\"\"}", &r);
    CHECK(r.prompt && r.prompt_len == 0);
    job_request_free(&r);

    /* integer fields take integral numbers in any notation; seeds exactly */
    parse_ok("{\"custom_id\":\"i\",\"prompt\":\"x\",\"max_tokens\":16.0,\"n\":2e0,\"seed\":18446744073709551615}", &r);
    CHECK_EQ_INT(r.max_tokens, 16);
    CHECK_EQ_INT(r.n, 2);
    CHECK(r.seed == UINT64_MAX);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"i\",\"prompt\":\"x\",\"seed\":9007199254740993}", &r);
    CHECK(r.seed == 9007199254740993ULL); /* not rounded through a double */
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"i\",\"prompt\":\"x\",\"temperature\":0.5000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000001,\"top_p\":1.0000000000000000000000000000000000000000000000"
             "00000000000000000000000000000000000}",
             &r);
    CHECK(r.temperature == 0.5f && r.top_p == 1.0f);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"i\",\"prompt\":\"x\",\"seed\":4.2e1}", &r);
    CHECK(r.seed == 42);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"i\",\"prompt\":\"x\",\"seed\":-9223372036854775808}", &r);
    CHECK(r.seed == (uint64_t)1 << 63);
    job_request_free(&r);
    /* boundary values are inside the ranges */
    parse_ok("{\"custom_id\":\"b\",\"prompt\":\"x\",\"temperature\":0,\"top_p\":1,\"min_p\":1,\"n\":16,"
             "\"presence_penalty\":-2,\"frequency_penalty\":2,\"repetition_penalty\":2,\"max_tokens\":2147483647}",
             &r);
    CHECK(r.temperature == 0.0f && r.top_p == 1.0f && r.min_p == 1.0f && r.n == 16);
    CHECK_EQ_INT(r.max_tokens, 2147483647);
    job_request_free(&r);
}

/* Every field works or is refused by name (job.h): vLLM's sampling
 * extensions, prompt lists and token ids, the chat templating switches,
 * fields ignored on purpose, and refusals of everything else. */
static void test_request_fields(void)
{
    struct job_request r;
    parse_ok("{\"custom_id\":\"v\",\"prompt\":\"x\",\"max_tokens\":9,\"ignore_eos\":true,\"min_tokens\":9,"
             "\"stop_token_ids\":[7,0,7],\"include_stop_str_in_output\":true,\"skip_special_tokens\":false,"
             "\"spaces_between_special_tokens\":false,\"use_beam_search\":false}",
             &r);
    CHECK(r.ignore_eos && r.min_tokens == 9 && r.include_stop_str_in_output && !r.skip_special_tokens);
    CHECK(r.n_stop_token_ids == 3 && r.stop_token_ids[0] == 7 && r.stop_token_ids[1] == 0);
    CHECK(r.given & JOB_GIVEN_MIN_TOKENS && r.given & JOB_GIVEN_STOP_TOKEN_IDS);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"v\",\"prompt\":\"x\"}", &r); /* defaults */
    CHECK(!r.ignore_eos && r.min_tokens == 0 && r.n_stop_token_ids == 0 && !r.include_stop_str_in_output);
    CHECK(r.skip_special_tokens && r.n_prompts == 1 && r.prompts[0].text == r.prompt);
    job_request_free(&r);
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"min_tokens\":300}", JOB_ERR_INVALID_VALUE, "min_tokens");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"max_tokens\":4,\"min_tokens\":5}", JOB_ERR_INVALID_VALUE,
               "min_tokens");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"min_tokens\":-1}", JOB_ERR_INVALID_VALUE, "min_tokens");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"ignore_eos\":1}", JOB_ERR_INVALID_TYPE, "ignore_eos");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"stop_token_ids\":5}", JOB_ERR_INVALID_TYPE, "stop_token_ids");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"stop_token_ids\":[-5]}", JOB_ERR_INVALID_VALUE,
               "stop_token_ids[0]");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"use_beam_search\":true}", JOB_ERR_INVALID_VALUE,
               "use_beam_search");
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"ignore_eos\":true,\"response_format\":{\"type\":\"json_object\"}}",
               JOB_ERR_INVALID_VALUE, "ignore_eos");

    /* a logit_bias key whose raw bytes are not UTF-8 decodes longer than it
     * is written (three bytes each): refused, not copied past the key's buffer */
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"logit_bias\":{\"1\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\":1}}",
               JOB_ERR_INVALID_VALUE, "logit_bias");

    /* prompt lists and token ids: one set of choices per prompt */
    parse_ok("{\"custom_id\":\"l\",\"prompt\":[\"a\",\"\",\"bc\"],\"n\":2}", &r);
    CHECK(r.n_prompts == 3 && strcmp(r.prompts[2].text, "bc") == 0 && r.prompts[1].text_len == 0);
    CHECK(r.prompt == r.prompts[0].text && !r.prompts[0].ids);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"l\",\"prompt\":[5,0,2147483647]}", &r);
    CHECK(r.n_prompts == 1 && !r.prompt && r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == INT32_MAX);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"l\",\"prompt\":[[5],[1,2.0]]}", &r);
    CHECK(r.n_prompts == 2 && r.prompts[1].n_ids == 2 && r.prompts[1].ids[1] == 2 && r.prompts[0].ids[0] == 5);
    job_request_free(&r);

    /* chat templating switches */
    const char *conv = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\","
                       "\"name\":\"bot\",\"tool_calls\":[],\"refusal\":null}]";
    char line[512];
    snprintf(line, sizeof line, "{\"custom_id\":\"t\",%s,\"add_generation_prompt\":false,\"continue_final_message\":true}",
             conv);
    parse_ok(line, &r);
    CHECK(!r.add_generation_prompt && r.continue_final_message);
    job_request_free(&r);
    snprintf(line, sizeof line, "{\"custom_id\":\"t\",%s,\"continue_final_message\":true}", conv);
    expect_err(line, JOB_ERR_INVALID_VALUE, "continue_final_message");
    expect_err("{\"custom_id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"add_generation_prompt\":false,"
               "\"continue_final_message\":true}",
               JOB_ERR_INVALID_VALUE, "continue_final_message");
    expect_err("{\"custom_id\":\"t\",\"prompt\":\"a\",\"add_generation_prompt\":false}", JOB_ERR_UNSUPPORTED_FIELD,
               "add_generation_prompt");

    /* ignored on purpose, whatever their value */
    parse_ok("{\"custom_id\":\"i\",\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
             "\"user\":\"u\",\"store\":false,\"metadata\":{\"k\":\"v\"},\"service_tier\":\"auto\",\"priority\":3}",
             &r);
    job_request_free(&r);
    CHECK(job_field_ignored("stream") && !job_field_ignored("ignore_eos") && !job_field_ignored("chat_template"));
    parse_ok("{\"custom_id\":\"i\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\","
             "\"tools\":[],\"parallel_tool_calls\":true,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
             "{\"name\":\"n\",\"strict\":true,\"schema\":{\"type\":\"object\"}}}}",
             &r);
    job_request_free(&r);

    /* everything else is refused by name, wherever it is */
    static const struct { const char *line, *code, *param; } refused[] = {
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"chat_template\":\"{{x}}\"}", JOB_ERR_UNSUPPORTED_FIELD, "chat_template"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"max_token\":3}", JOB_ERR_UNSUPPORTED_FIELD, "max_token"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_json\":{}}", JOB_ERR_UNSUPPORTED_FIELD, "guided_json"},
        {"{\"custom_id\":\"u\",\"body\":{\"prompt\":\"x\"},\"temperature\":0}", JOB_ERR_UNSUPPORTED_FIELD, "temperature"},
        {"{\"custom_id\":\"u\",\"body\":{\"prompt\":\"x\",\"top_logprobs\":2}}", JOB_ERR_UNSUPPORTED_FIELD,
         "body.top_logprobs"},
        {"{\"custom_id\":\"u\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"\"}",
         JOB_ERR_UNSUPPORTED_FIELD, "suffix"},
        {"{\"custom_id\":\"u\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_call_id\":\"1\"}]}",
         JOB_ERR_UNSUPPORTED_FIELD, "messages[0].tool_call_id"},
        {"{\"custom_id\":\"u\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{}]}]}",
         JOB_ERR_UNSUPPORTED_FIELD, "messages[0].tool_calls"},
        {"{\"custom_id\":\"u\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\","
         "\"cache_control\":{}}]}]}",
         JOB_ERR_UNSUPPORTED_FIELD, "messages[0].content[0].cache_control"},
        {"{\"custom_id\":\"u\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}",
         JOB_ERR_INVALID_VALUE, "tool_choice"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"response_format\":{\"type\":\"text\",\"extra\":1}}",
         JOB_ERR_UNSUPPORTED_FIELD, "response_format.extra"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
         "{\"type\":\"object\"},\"x\":1}}}",
         JOB_ERR_UNSUPPORTED_FIELD, "response_format.json_schema.x"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"messages\":[]}", JOB_ERR_INVALID_REQUEST, "prompt"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        expect_err(refused[k].line, refused[k].code, refused[k].param);
}

static void test_shorthand(void)
{
    struct job_request r;
    parse_ok("{\"custom_id\":\"s1\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}", &r);
    CHECK(r.url == JOB_URL_COMPLETION && r.shorthand);
    CHECK(strcmp(r.prompt, "Once upon a time") == 0);
    CHECK_EQ_INT(r.max_tokens, 8);
    CHECK(r.temperature == 0.0f);
    job_request_free(&r);

    parse_ok("{\"custom_id\":\"s2\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"seed\":9,"
             "\"model\":\"m\"}",
             &r);
    CHECK(r.url == JOB_URL_CHAT && r.shorthand);
    CHECK_EQ_INT(r.n_messages, 1);
    CHECK(r.seed == 9 && strcmp(r.model, "m") == 0);
    job_request_free(&r);

    /* a shorthand line may still name its url, which then decides; a field
     * of the other endpoint is refused rather than ignored */
    parse_ok("{\"custom_id\":\"s3\",\"url\":\"/v1/completions\",\"prompt\":\"x\"}", &r);
    CHECK(r.url == JOB_URL_COMPLETION);
    job_request_free(&r);
    expect_err("{\"custom_id\":\"s3\",\"url\":\"/v1/completions\",\"prompt\":\"x\",\"messages\":[]}",
               JOB_ERR_UNSUPPORTED_FIELD, "messages");

    /* keys written with escapes, repeated keys (last wins), whitespace, CRLF */
    parse_ok(" { \"custom_id\" : \"s4\" , \"\\u0070rompt\" : \"first\" , \"prompt\":\"second\",\n"
             "\"temp\\u0065rature\":0.5 } \r",
             &r);
    CHECK(r.prompt && strcmp(r.prompt, "second") == 0);
    CHECK(r.temperature == 0.5f);
    job_request_free(&r);
}

static void test_escapes(void)
{
    struct job_request r;
    /* plain escapes */
    parse_ok("{\"custom_id\":\"e\",\"prompt\":\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\"}", &r);
    CHECK(strcmp(r.prompt, "a\"b\\c/d\be\ff\ng\rh\ti") == 0);
    job_request_free(&r);
    /* \u: BMP, surrogate pairs, and raw UTF-8 passed through */
    parse_ok("{\"custom_id\":\"\\ud83d\\ude00id\",\"prompt\":\"caf\\u00e9 \\u20AC \\ud83d\\ude00 \xe6\x97\xa5\"}", &r);
    CHECK(strcmp(r.prompt, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xe6\x97\xa5") == 0);
    CHECK(strcmp(r.custom_id, "\xf0\x9f\x98\x80id") == 0);
    job_request_free(&r);
    /* damaged text becomes U+FFFD (job.h): lone high, lone low, high + non-low,
     * \u0000, raw bytes that are not UTF-8 */
    parse_ok("{\"custom_id\":\"e\",\"prompt\":\"[\\ud83d][\\ude00][\\ud83d\\u0041][\\u0000][\\ud83d\\ud83d]\"}", &r);
    CHECK_MSG(strcmp(r.prompt, "[\xef\xbf\xbd][\xef\xbf\xbd][\xef\xbf\xbd" "A][\xef\xbf\xbd][\xef\xbf\xbd\xef\xbf\xbd]") == 0,
              "%s", r.prompt);
    CHECK(strlen(r.prompt) == r.prompt_len);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"e\",\"prompt\":\"[\xff][\xc0\x80][\xe2\x82][\xed\xa0\x80][\xf4\x90\x80\x80][\xe2\x82\xac]\"}",
             &r);
    /* maximal subparts: C0 and 80 are one each; E2 82 is one; ED A0 80 is three;
     * F4 90 80 80 is four (F4 90 is out of range after F4) */
    const char *want = "[\xef\xbf\xbd][\xef\xbf\xbd\xef\xbf\xbd][\xef\xbf\xbd][\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd]"
                       "[\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd][\xe2\x82\xac]";
    CHECK_MSG(strcmp(r.prompt, want) == 0, "%s", r.prompt);
    job_request_free(&r);

    /* custom_id is never repaired (job.h): lone surrogates keep their code
     * points, so "x\ud800" and "x\udfff" stay two ids; \u0000 is C0 80; the
     * text as written is kept beside it for the output lines */
    static const struct { const char *json; const char *exact; } ids[] = {
        {"x\\ud800", "x\xed\xa0\x80"},
        {"x\\udfff", "x\xed\xbf\xbf"},
        {"x\\ud800\\u0041", "x\xed\xa0\x80" "A"},
        {"x\\ufffd", "x\xef\xbf\xbd"},
        {"x\\u0000y", "x\xc0\x80y"},
        {"q\\\"\\\\\\/", "q\"\\/"},
        {"\\ud83d\\ude00", "\xf0\x9f\x98\x80"},
    };
    struct job_key keys[sizeof ids / sizeof ids[0]];
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        char line[128];
        snprintf(line, sizeof line, "{\"custom_id\":\"%s\",\"prompt\":\"x\"}", ids[k].json);
        parse_ok(line, &r);
        CHECK_MSG(r.custom_id && strcmp(r.custom_id, ids[k].exact) == 0 && r.custom_id_len == strlen(ids[k].exact),
                  "custom_id %s", ids[k].json);
        CHECK_MSG(r.custom_id_json && strcmp(r.custom_id_json, ids[k].json) == 0, "custom_id %s as written", ids[k].json);
        job_key_custom_id(r.custom_id, r.custom_id_len, &keys[k]);
        for (size_t m = 0; m < k; m++) CHECK_MSG(strcmp(keys[m].hex, keys[k].hex) != 0, "ids %zu and %zu share a key", m, k);
        /* both kinds of line carry the id exactly as written */
        struct kvb_buf b = {0};
        struct job_choice ch = {.text = "t", .text_len = 1};
        struct job_result res = {.custom_id = r.custom_id, .custom_id_len = r.custom_id_len,
                                 .custom_id_json = r.custom_id_json, .custom_id_json_len = r.custom_id_json_len,
                                 .url = JOB_URL_COMPLETION, .model = "m", .choices = &ch, .n_choices = 1};
        CHECK(job_format_result(&b, &res) == KVB_OK);
        struct job_error e;
        job_error_setf(&e, JOB_ERR_SERVER, 1, NULL, "x");
        CHECK(job_format_error_json(&b, r.custom_id, r.custom_id_len, r.custom_id_json, r.custom_id_json_len, &e) ==
              KVB_OK);
        char want_id[96];
        snprintf(want_id, sizeof want_id, "\"custom_id\":\"%s\",", ids[k].json);
        const char *first = b.data ? strstr(b.data, want_id) : NULL;
        CHECK_MSG(first && strstr(first + 1, want_id), "custom_id %s not echoed as written in both lines", ids[k].json);
        CHECK(strict_jsmn_ok(b.data, strchr(b.data, '\n') - b.data));
        kvb_buf_free(&b);
        job_request_free(&r);
    }
    /* raw bytes that are not UTF-8 cannot be echoed as JSON: refused by name */
    expect_err("{\"custom_id\":\"a\xff\",\"prompt\":\"x\"}", JOB_ERR_INVALID_VALUE, "custom_id");
}

/* ---- output ------------------------------------------------------------------------- */

static void test_keys(void)
{
    struct job_key a, b, c, l1, l2;
    job_key_custom_id("abc", 3, &a);
    job_key_custom_id("abc", 3, &b);
    job_key_custom_id("abd", 3, &c);
    job_key_line(1, &l1);
    job_key_line(2, &l2);
    CHECK(strlen(a.hex) == JOB_KEY_LEN);
    CHECK(strcmp(a.hex, b.hex) == 0);
    CHECK(strcmp(a.hex, c.hex) != 0);
    CHECK(strcmp(l1.hex, l2.hex) != 0);
    for (int k = 0; k < JOB_KEY_LEN; k++) CHECK((a.hex[k] >= '0' && a.hex[k] <= '9') || (a.hex[k] >= 'a' && a.hex[k] <= 'f'));
    struct job_error e = {.code = JOB_ERR_INVALID_VALUE, .line_no = 2};
    struct job_key k;
    job_key_error("abc", 3, &e, &k);
    CHECK(strcmp(k.hex, a.hex) == 0);
    job_key_error(NULL, 0, &e, &k);
    CHECK(strcmp(k.hex, l2.hex) == 0);
    e.by_line = true; /* a line that did not parse */
    job_key_error("abc", 3, &e, &k);
    CHECK(strcmp(k.hex, l2.hex) == 0);
    e.by_line = false;
    e.code = JOB_ERR_DUPLICATE_CUSTOM_ID;
    job_key_error("abc", 3, &e, &k);
    CHECK(strcmp(k.hex, l2.hex) == 0);
}

static void test_result_chat(void)
{
    struct job_choice ch[2] = {
        {.text = "Hello \"you\"\n\tthere \xff\x01 \xf0\x9f\x98\x80", .finish = JOB_FINISH_STOP},
        {.text = "Second", .finish = JOB_FINISH_LENGTH},
    };
    ch[0].text_len = strlen(ch[0].text);
    ch[1].text_len = strlen(ch[1].text);
    struct job_result res = {
        .custom_id = "req-\"1\"",
        .url = JOB_URL_CHAT,
        .model = "SmolLM2-135M-Instruct",
        .created = 1700000000,
        .choices = ch,
        .n_choices = 2,
        .prompt_tokens = 21,
        .completion_tokens = 9,
        .cached_tokens = 16,
    };
    res.custom_id_len = strlen(res.custom_id);
    struct kvb_buf b = {0};
    CHECK(job_format_result(&b, &res) == KVB_OK);
    struct doc d;
    doc_open(&d, b.data, b.len);
    struct job_key key;
    job_key_custom_id(res.custom_id, res.custom_id_len, &key);
    char want[64];
    snprintf(want, sizeof want, "batch_req_%s", key.hex);
    CHECK(doc_str_is(&d, "id", want));
    CHECK(doc_str_is(&d, "custom_id", "req-\"1\""));
    CHECK(doc_num(&d, "response.status_code") == 200);
    snprintf(want, sizeof want, "req_%s", key.hex);
    CHECK(doc_str_is(&d, "response.request_id", want));
    snprintf(want, sizeof want, "chatcmpl-%s", key.hex);
    CHECK(doc_str_is(&d, "response.body.id", want));
    CHECK(doc_str_is(&d, "response.body.object", "chat.completion"));
    CHECK(doc_num(&d, "response.body.created") == 1700000000);
    CHECK(doc_str_is(&d, "response.body.model", "SmolLM2-135M-Instruct"));
    CHECK(doc_num(&d, "response.body.choices[0].index") == 0);
    CHECK(doc_str_is(&d, "response.body.choices[0].message.role", "assistant"));
    CHECK(doc_str_is(&d, "response.body.choices[0].message.content",
                     "Hello \"you\"\n\tthere \xef\xbf\xbd\x01 \xf0\x9f\x98\x80"));
    CHECK(doc_str_is(&d, "response.body.choices[0].finish_reason", "stop"));
    CHECK(doc_is_null(&d, "response.body.choices[0].logprobs"));
    CHECK(doc_num(&d, "response.body.choices[1].index") == 1);
    CHECK(doc_str_is(&d, "response.body.choices[1].message.content", "Second"));
    CHECK(doc_str_is(&d, "response.body.choices[1].finish_reason", "length"));
    CHECK(doc_num(&d, "response.body.usage.prompt_tokens") == 21);
    CHECK(doc_num(&d, "response.body.usage.completion_tokens") == 9);
    CHECK(doc_num(&d, "response.body.usage.total_tokens") == 30);
    CHECK(doc_num(&d, "response.body.usage.prompt_tokens_details.cached_tokens") == 16);
    CHECK(doc_is_null(&d, "response.body.system_fingerprint"));
    CHECK(doc_is_null(&d, "error"));
    /* control characters are escaped as \u00XX */
    CHECK(strstr(b.data, "\\u0001") != NULL);
    doc_close(&d);

    /* deterministic: the same result gives the same bytes; created is the only clock */
    struct kvb_buf b2 = {0};
    CHECK(job_format_result(&b2, &res) == KVB_OK);
    CHECK(b.len == b2.len && memcmp(b.data, b2.data, b.len) == 0);
    /* appending: a second line lands after the first */
    res.created = 1700000001;
    CHECK(job_format_result(&b2, &res) == KVB_OK);
    CHECK(b2.len == 2 * b.len);
    CHECK(memcmp(b2.data, b.data, b.len) == 0);
    kvb_buf_free(&b);
    kvb_buf_free(&b2);
}

static void test_result_completion(void)
{
    struct job_choice ch = {.text = " Paris.", .text_len = 7, .finish = JOB_FINISH_STOP};
    struct job_result res = {
        .custom_id = "c", .custom_id_len = 1, .url = JOB_URL_COMPLETION, .model = "m", .created = 5,
        .choices = &ch, .n_choices = 1, .prompt_tokens = 3, .completion_tokens = 2,
        .system_fingerprint = "kvbatch-0.1.0",
    };
    struct kvb_buf b = {0};
    CHECK(job_format_result(&b, &res) == KVB_OK);
    struct doc d;
    doc_open(&d, b.data, b.len);
    struct job_key key;
    job_key_custom_id("c", 1, &key);
    char want[64];
    snprintf(want, sizeof want, "cmpl-%s", key.hex);
    CHECK(doc_str_is(&d, "response.body.id", want));
    CHECK(doc_str_is(&d, "response.body.object", "text_completion"));
    CHECK(doc_str_is(&d, "response.body.choices[0].text", " Paris."));
    CHECK(doc_at(&d, "response.body.choices[0].message") < 0);
    CHECK(doc_num(&d, "response.body.usage.total_tokens") == 5);
    CHECK(doc_num(&d, "response.body.usage.prompt_tokens_details.cached_tokens") == 0);
    CHECK(doc_str_is(&d, "response.body.system_fingerprint", "kvbatch-0.1.0"));
    doc_close(&d);
    kvb_buf_free(&b);
}

static void test_logprobs(void)
{
    /* "€" split across two byte-level tokens: "token" shows U+FFFD, "bytes"
     * keeps the exact bytes */
    struct job_top_logprob top0[2] = {{"\xe2\x82", 2, -0.25f}, {"X", 1, -1.5f}};
    struct job_top_logprob top1[1] = {{"\xac", 1, -0.5f}};
    struct job_token_logprob lp[3] = {
        {.token = "\xe2\x82", .token_len = 2, .logprob = -0.25f, .top = top0, .n_top = 2},
        {.token = "\xac", .token_len = 1, .logprob = -0.5f, .top = top1, .n_top = 1},
        {.token = "!", .token_len = 1, .logprob = -INFINITY, .top = NULL, .n_top = 0},
    };
    struct job_choice ch = {.text = "\xe2\x82\xac!", .text_len = 4, .finish = JOB_FINISH_LENGTH,
                            .has_logprobs = true, .logprobs = lp, .n_logprobs = 3};
    struct job_result res = {.custom_id = "lp", .custom_id_len = 2, .url = JOB_URL_CHAT, .model = "m",
                             .choices = &ch, .n_choices = 1};
    struct kvb_buf b = {0};
    CHECK(job_format_result(&b, &res) == KVB_OK);
    struct doc d;
    doc_open(&d, b.data, b.len);
    const char *base = "response.body.choices[0].logprobs";
    char p[160];
#define P(s) (snprintf(p, sizeof p, "%s%s", base, s), p)
    CHECK(doc_str_is(&d, "response.body.choices[0].message.content", "\xe2\x82\xac!"));
    CHECK(doc_str_is(&d, P(".content[0].token"), "\xef\xbf\xbd"));
    CHECK(fabs(doc_num(&d, P(".content[0].logprob")) + 0.25) < 1e-7);
    CHECK(doc_num(&d, P(".content[0].bytes[0]")) == 0xe2);
    CHECK(doc_num(&d, P(".content[0].bytes[1]")) == 0x82);
    CHECK(doc_at(&d, P(".content[0].bytes[2]")) < 0);
    CHECK(doc_str_is(&d, P(".content[0].top_logprobs[1].token"), "X"));
    CHECK(doc_num(&d, P(".content[0].top_logprobs[1].logprob")) == -1.5);
    CHECK(doc_num(&d, P(".content[0].top_logprobs[1].bytes[0]")) == 'X');
    CHECK(doc_num(&d, P(".content[1].bytes[0]")) == 0xac);
    CHECK(doc_num(&d, P(".content[2].logprob")) == -9999.0);
    CHECK(doc_at(&d, P(".content[2].top_logprobs")) >= 0);
    CHECK(doc_at(&d, P(".content[2].top_logprobs[0]")) < 0);
    CHECK(doc_is_null(&d, P(".refusal")));
    doc_close(&d);

    /* the completions shape */
    lp[2].logprob = NAN;
    res.url = JOB_URL_COMPLETION;
    b.len = 0;
    CHECK(job_format_result(&b, &res) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_str_is(&d, P(".tokens[2]"), "!"));
    CHECK(fabs(doc_num(&d, P(".token_logprobs[1]")) + 0.5) < 1e-7);
    CHECK(doc_num(&d, P(".token_logprobs[2]")) == -9999.0);
    CHECK(doc_num(&d, P(".top_logprobs[0].X")) == -1.5);
    CHECK(doc_num(&d, P(".text_offset[0]")) == 0);
    CHECK(doc_num(&d, P(".text_offset[1]")) == 2);
    CHECK(doc_num(&d, P(".text_offset[2]")) == 3);
    CHECK(doc_at(&d, P(".content")) < 0);
#undef P
    doc_close(&d);
    kvb_buf_free(&b);
}

static void test_error_lines(void)
{
    struct kvb_buf b = {0};
    /* an unparseable line: no custom_id, keyed by line number */
    struct job_request r;
    struct job_error e;
    const char *bad = "{\"custom_id\":\"x\",";
    CHECK(job_parse_line(bad, strlen(bad), 12, &r, &e) == KVB_ERR_FORMAT);
    CHECK(r.custom_id == NULL);
    CHECK(job_format_error(&b, r.custom_id, r.custom_id_len, &e) == KVB_OK);
    job_request_free(&r);
    struct doc d;
    doc_open(&d, b.data, b.len);
    struct job_key key;
    job_key_line(12, &key);
    char want[64];
    snprintf(want, sizeof want, "batch_req_%s", key.hex);
    CHECK(doc_str_is(&d, "id", want));
    CHECK(doc_is_null(&d, "custom_id"));
    CHECK(doc_num(&d, "response.status_code") == 400);
    snprintf(want, sizeof want, "req_%s", key.hex);
    CHECK(doc_str_is(&d, "response.request_id", want));
    CHECK(doc_str_is(&d, "response.body.error.type", "invalid_request_error"));
    CHECK(doc_str_is(&d, "response.body.error.code", "invalid_json"));
    CHECK(doc_is_null(&d, "response.body.error.param"));
    CHECK(doc_str_is(&d, "error.code", "invalid_json"));
    CHECK(doc_is_null(&d, "error.param")); /* the fields of OpenAI's BatchError */
    CHECK(doc_num(&d, "error.line") == 12);
    char *msg = doc_str(&d, "error.message");
    CHECK_MSG(strncmp(msg, "line 12: invalid JSON", 21) == 0, "%s", msg);
    free(msg);
    doc_close(&d);

    /* a bad field: custom_id kept, param named; keyed by line, as a later
     * line that parses may use the same custom_id and needs its own key */
    b.len = 0;
    const char *bad2 = "{\"custom_id\":\"q\\\"7\",\"prompt\":\"x\",\"top_p\":5}";
    CHECK(job_parse_line(bad2, strlen(bad2), 3, &r, &e) == KVB_ERR_FORMAT);
    CHECK(e.by_line);
    CHECK(job_format_error(&b, r.custom_id, r.custom_id_len, &e) == KVB_OK);
    doc_open(&d, b.data, b.len);
    job_key_line(3, &key);
    snprintf(want, sizeof want, "batch_req_%s", key.hex);
    CHECK(doc_str_is(&d, "id", want));
    CHECK(doc_str_is(&d, "custom_id", "q\"7"));
    CHECK(doc_str_is(&d, "response.body.error.param", "top_p"));
    CHECK(doc_str_is(&d, "response.body.error.code", "invalid_value"));
    CHECK(doc_str_is(&d, "error.message", e.message));
    CHECK(doc_str_is(&d, "error.param", "top_p"));
    CHECK(doc_num(&d, "error.line") == 3);
    doc_close(&d);
    job_request_free(&r);

    /* the caller's own errors: duplicate (keyed by line), context, server */
    b.len = 0;
    job_error_setf(&e, JOB_ERR_DUPLICATE_CUSTOM_ID, 40, "custom_id", "custom_id '%s' was already used on line %d", "q", 3);
    CHECK(strcmp(e.message, "line 40: custom_id 'q' was already used on line 3") == 0);
    CHECK(job_format_error(&b, "q", 1, &e) == KVB_OK);
    doc_open(&d, b.data, b.len);
    job_key_line(40, &key);
    snprintf(want, sizeof want, "batch_req_%s", key.hex);
    CHECK(doc_str_is(&d, "id", want));
    CHECK(doc_str_is(&d, "custom_id", "q"));
    CHECK(doc_str_is(&d, "error.code", "duplicate_custom_id"));
    doc_close(&d);

    b.len = 0;
    job_error_setf(&e, JOB_ERR_SERVER, 41, NULL, "out of memory \xff");
    CHECK(job_format_error(&b, "s", 1, &e) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_num(&d, "response.status_code") == 500);
    CHECK(doc_str_is(&d, "response.body.error.type", "server_error"));
    CHECK(doc_str_is(&d, "error.message", "line 41: out of memory \xef\xbf\xbd"));
    doc_close(&d);

    /* a message cut at 512 bytes in the middle of a character stays valid JSON */
    b.len = 0;
    char longmsg[1200];
    for (size_t k = 0; k + 2 < sizeof longmsg; k += 2) memcpy(longmsg + k, "\xc3\xa9", 2);
    longmsg[sizeof longmsg - 2] = '\0';
    job_error_setf(&e, JOB_ERR_CONTEXT_LENGTH, 1, "messages", "%s", longmsg);
    CHECK(job_format_error(&b, "c", 1, &e) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_str_is(&d, "error.code", "context_length_exceeded"));
    doc_close(&d);
    kvb_buf_free(&b);

    /* json_put_string on its own */
    struct kvb_buf s = {0};
    CHECK(json_put_string(&s, "a\x7f\x1f\"", 4) == KVB_OK);
    CHECK(s.len == 12 && memcmp(s.data, "\"a\x7f\\u001f\\\"\"", 12) == 0);
    s.len = 0;
    CHECK(json_put_string(&s, "\\\b\f\n\r\t\0/", 8) == KVB_OK);
    CHECK_MSG(s.len == 21 && memcmp(s.data, "\"\\\\\\b\\f\\n\\r\\t\\u0000/\"", 21) == 0, "%.*s", (int)s.len, s.data);
    kvb_buf_free(&s);
}

/* ---- reader ------------------------------------------------------------------------ */

static FILE *file_with(const char *data, size_t n)
{
    FILE *f = tmpfile();
    if (!f) tu_skip("tmpfile() failed");
    if (n && fwrite(data, 1, n, f) != n) tu_skip("tmpfile write failed");
    rewind(f);
    return f;
}

static void test_reader_basic(void)
{
    const char data[] = "{\"a\":1}\n\n  \t\r\nx\r\nlast";
    FILE *f = file_with(data, sizeof data - 1);
    struct job_reader *r;
    CHECK(job_reader_create(f, 0, &r, NULL) == KVB_OK);
    struct job_line l;
    bool got;
    const char *want[] = {"{\"a\":1}", "", "  \t\r", "x\r", "last"};
    uint64_t offs[] = {0, 8, 9, 14, 17};
    for (int k = 0; k < 5; k++) {
        CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK);
        CHECK(got);
        if (!got) break;
        CHECK_EQ_INT(l.line_no, k + 1);
        CHECK_EQ_INT(l.offset, offs[k]);
        CHECK(l.len == strlen(want[k]) && memcmp(l.data, want[k], l.len) == 0);
        CHECK(l.full_len == l.len && !l.too_long);
        CHECK(l.terminated == (k < 4));
        CHECK(job_line_is_blank(l.data, l.len) == (k == 1 || k == 2));
    }
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK);
    CHECK(!got);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK);
    CHECK(!got);
    job_reader_free(r);
    fclose(f);

    /* empty input; input of just "\n" */
    f = file_with("", 0);
    CHECK(job_reader_create(f, 0, &r, NULL) == KVB_OK);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && !got);
    job_reader_free(r);
    fclose(f);
    f = file_with("\n", 1);
    CHECK(job_reader_create(f, 0, &r, NULL) == KVB_OK);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && got && l.len == 0 && l.terminated);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && !got);
    job_reader_free(r);
    fclose(f);
    CHECK(job_reader_create(NULL, 0, &r, NULL) == KVB_ERR_INVALID_ARG);
    job_reader_free(NULL);
}

/* A 2 MB request line goes through the reader and the parser; a line over
 * max_line comes back flagged, cut, and the next line is intact. */
static void test_reader_long(void)
{
    size_t big = 2u << 20;
    const char *head = "{\"custom_id\":\"big\",\"prompt\":\"";
    const char *tail = "\",\"max_tokens\":4}\n{\"custom_id\":\"next\",\"prompt\":\"n\"}\n";
    size_t hl = strlen(head), tl = strlen(tail);
    char *data = malloc(hl + big + tl);
    memcpy(data, head, hl);
    for (size_t k = 0; k < big; k++) data[hl + k] = (char)('a' + k % 26);
    memcpy(data + hl + big, tail, tl);
    size_t first_len = hl + big + strlen("\",\"max_tokens\":4}");

    FILE *f = file_with(data, hl + big + tl);
    struct job_reader *r;
    CHECK(job_reader_create(f, 0, &r, NULL) == KVB_OK);
    struct job_line l;
    bool got;
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && got);
    CHECK_EQ_INT(l.len, first_len);
    CHECK(l.terminated && !l.too_long);
    CHECK(memcmp(l.data, data, first_len) == 0);
    struct job_request req;
    struct job_error e;
    CHECK(job_parse_line(l.data, l.len, l.line_no, &req, &e) == KVB_OK);
    CHECK_EQ_INT(req.prompt_len, big);
    CHECK(req.prompt && req.prompt[big - 1] == (char)('a' + (big - 1) % 26));
    job_request_free(&req);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && got);
    CHECK_EQ_INT(l.line_no, 2);
    CHECK_EQ_INT(l.offset, first_len + 1);
    CHECK(job_parse_line(l.data, l.len, l.line_no, &req, &e) == KVB_OK);
    CHECK(strcmp(req.custom_id, "next") == 0);
    job_request_free(&req);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && !got);
    job_reader_free(r);

    /* the same file with max_line 1000 */
    rewind(f);
    CHECK(job_reader_create(f, 1000, &r, NULL) == KVB_OK);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && got);
    CHECK(l.too_long && l.terminated);
    CHECK_EQ_INT(l.len, 1000);
    CHECK_EQ_INT(l.full_len, first_len);
    CHECK(memcmp(l.data, data, 1000) == 0);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && got);
    CHECK(!l.too_long && l.line_no == 2 && l.offset == first_len + 1);
    CHECK(l.len == strlen("{\"custom_id\":\"next\",\"prompt\":\"n\"}"));
    job_reader_free(r);
    fclose(f);

    /* an over-long last line without "\n" */
    f = file_with(data, hl + big);
    CHECK(job_reader_create(f, 4096, &r, NULL) == KVB_OK);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && got);
    CHECK(l.too_long && !l.terminated && l.len == 4096 && l.full_len == hl + big);
    CHECK(job_reader_next(r, &l, &got, NULL) == KVB_OK && !got);
    job_reader_free(r);
    fclose(f);
    free(data);
}

/* ---- id sets ------------------------------------------------------------------------- */

static void test_idset(void)
{
    struct job_idset *s;
    CHECK(job_idset_create(&s) == KVB_OK);
    bool added;
    CHECK(job_idset_add(s, "a", 1, &added) == KVB_OK && added);
    CHECK(job_idset_add(s, "a", 1, &added) == KVB_OK && !added);
    CHECK(job_idset_add(s, "", 0, &added) == KVB_OK && added);
    CHECK(job_idset_add(s, "a\0b", 3, &added) == KVB_OK && added);
    CHECK(job_idset_contains(s, "a\0b", 3));
    CHECK(!job_idset_contains(s, "a\0c", 3));
    CHECK(job_idset_contains(s, "", 0));
    char *longid = malloc(100000);
    memset(longid, 'z', 100000);
    CHECK(job_idset_add(s, longid, 100000, &added) == KVB_OK && added);
    CHECK(job_idset_add(s, longid, 99999, &added) == KVB_OK && added);
    char id[32];
    for (int k = 0; k < 100000; k++) {
        int n = snprintf(id, sizeof id, "req-%d", k);
        CHECK(job_idset_add(s, id, (size_t)n, NULL) == KVB_OK);
    }
    CHECK_EQ_INT(job_idset_count(s), 100005);
    CHECK(job_idset_contains(s, longid, 100000));
    int missing = 0;
    for (int k = 0; k < 100000; k++) {
        int n = snprintf(id, sizeof id, "req-%d", k);
        if (!job_idset_contains(s, id, (size_t)n)) missing++;
    }
    CHECK_EQ_INT(missing, 0);
    CHECK(!job_idset_contains(s, "req-100000", 10));
    free(longid);
    job_idset_free(s);
    job_idset_free(NULL);
}

/* ---- resume --------------------------------------------------------------------------- */

static char *tmp_path(void)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvb_test_jobs_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) tu_skip("mkstemp failed");
    close(fd);
    return path;
}

static void write_file(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void append_result(struct kvb_buf *b, const char *cid)
{
    struct job_choice ch = {.text = "ok", .text_len = 2};
    struct job_result res = {.custom_id = cid, .custom_id_len = strlen(cid), .url = JOB_URL_CHAT, .model = "m",
                             .choices = &ch, .n_choices = 1, .prompt_tokens = 1, .completion_tokens = 1};
    CHECK(job_format_result(b, &res) == KVB_OK);
}

static bool has_key_cid(struct job_idset *s, const char *cid)
{
    struct job_key k;
    job_key_custom_id(cid, strlen(cid), &k);
    return job_idset_contains(s, k.hex, JOB_KEY_LEN);
}

static void test_resume(void)
{
    char *path = tmp_path();
    struct kvb_buf b = {0};
    append_result(&b, "r1");
    struct job_error e;
    job_error_setf(&e, JOB_ERR_INVALID_JSON, 2, NULL, "invalid JSON");
    CHECK(job_format_error(&b, NULL, 0, &e) == KVB_OK);
    append_result(&b, "r3");
    size_t before_corrupt = b.len;
    const char corrupt[] = "{\"id\":\"batch_req_0123\", garbage\n";
    struct kvb_buf f = {0};
    /* file = r1, err(line 2), r3, corrupt, r5, torn half of r6 */
    f.data = malloc(b.len + 4096);
    memcpy(f.data, b.data, before_corrupt);
    f.len = before_corrupt;
    f.cap = b.len + 4096;
    memcpy(f.data + f.len, corrupt, sizeof corrupt - 1);
    f.len += sizeof corrupt - 1;
    append_result(&f, "r5");
    size_t good_end = f.len;
    struct kvb_buf t = {0};
    append_result(&t, "r6");
    memcpy(f.data + f.len, t.data, t.len / 2);
    f.len += t.len / 2;
    write_file(path, f.data, f.len);

    struct job_idset *keys;
    CHECK(job_idset_create(&keys) == KVB_OK);
    struct job_resume_info info;
    struct kvb_err err;
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK_EQ_INT(info.lines_ok, 4);
    CHECK_EQ_INT(info.lines_bad, 1);
    CHECK_EQ_INT(info.first_bad_line, 4);
    CHECK(info.torn);
    CHECK_EQ_INT(info.truncate_at, good_end);
    CHECK_EQ_INT(info.size, f.len);
    CHECK(has_key_cid(keys, "r1") && has_key_cid(keys, "r3") && has_key_cid(keys, "r5"));
    CHECK(!has_key_cid(keys, "r6"));
    struct job_key lk;
    job_key_line(2, &lk);
    CHECK(job_idset_contains(keys, lk.hex, JOB_KEY_LEN));
    CHECK_EQ_INT(job_idset_count(keys), 4);
    job_idset_free(keys);

    /* after truncating at truncate_at and appending r6, the file is clean */
    CHECK(truncate(path, (off_t)info.truncate_at) == 0);
    FILE *fp = fopen(path, "ab");
    CHECK(fp && fwrite(t.data, 1, t.len, fp) == t.len);
    if (fp) fclose(fp);
    CHECK(job_idset_create(&keys) == KVB_OK);
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK(!info.torn && info.lines_ok == 5 && info.lines_bad == 1);
    CHECK_EQ_INT(info.truncate_at, info.size);
    CHECK(has_key_cid(keys, "r6"));
    job_idset_free(keys);

    /* a complete last line that is not valid (a crash's zero-filled tail,
     * then a stray newline): torn, cut after the last good line */
    memcpy(f.data + good_end, "\0\0\0\0\0\0\n\0\0\0", 10);
    f.len = good_end + 10;
    write_file(path, f.data, f.len);
    CHECK(job_idset_create(&keys) == KVB_OK);
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK(info.torn && info.truncate_at == good_end && info.lines_ok == 4 && info.lines_bad == 1);
    job_idset_free(keys);

    /* a clean file */
    write_file(path, b.data, b.len);
    CHECK(job_idset_create(&keys) == KVB_OK);
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK(!info.torn && info.lines_ok == 3 && info.lines_bad == 0 && info.first_bad_line == 0);
    CHECK(info.truncate_at == b.len && info.size == b.len);
    job_idset_free(keys);

    /* only a torn line: truncate to 0 */
    write_file(path, t.data, t.len - 1);
    CHECK(job_idset_create(&keys) == KVB_OK);
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK(info.torn && info.truncate_at == 0 && info.lines_ok == 0);
    job_idset_free(keys);

    /* valid JSON that is not an output line counts as bad */
    write_file(path, "{\"id\":\"batch_req_XYZ\"}\n[1]\n", 28);
    CHECK(job_idset_create(&keys) == KVB_OK);
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK(info.torn && info.truncate_at == 0 && info.lines_ok == 0);
    job_idset_free(keys);

    /* no file yet */
    unlink(path);
    CHECK(job_idset_create(&keys) == KVB_OK);
    CHECK(job_resume_scan(path, keys, &info, &err) == KVB_OK);
    CHECK(info.size == 0 && !info.torn && info.lines_ok == 0);
    CHECK(job_resume_scan("/proc/nonexistent-dir/x/y", keys, &info, &err) == KVB_OK);
    CHECK(job_resume_scan("/", keys, &info, &err) != KVB_OK); /* a directory cannot be read */
    job_idset_free(keys);

    free(f.data);
    kvb_buf_free(&b);
    kvb_buf_free(&t);
}

/* ---- allocation failures ----------------------------------------------------------------- */

/* Fail the Nth allocation for every N the call makes: each run must end in
 * KVB_OK or KVB_ERR_NOMEM with nothing leaked (ASan build) and no crash. */
static void test_alloc_failures(void)
{
    const char *line = "{\"custom_id\":\"f\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":["
                       "{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                       "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],\"stop\":[\"x\",\"y\"],\"model\":\"m\"}}";
    int nomem = 0, ok = 0;
    for (long n = 0; n < 40; n++) {
        struct job_request r;
        struct job_error e;
        kvb_alloc_fail_after(n);
        enum kvb_status st = job_parse_line(line, strlen(line), 1, &r, &e);
        kvb_alloc_fail_after(-1);
        CHECK(st == KVB_OK || st == KVB_ERR_NOMEM);
        if (st == KVB_ERR_NOMEM) {
            nomem++;
            CHECK(strcmp(e.code, JOB_ERR_SERVER) == 0);
        } else {
            ok++;
        }
        job_request_free(&r);
    }
    CHECK(nomem > 5 && ok > 0);

    struct job_choice ch = {.text = "hello", .text_len = 5};
    struct job_result res = {.custom_id = "f", .custom_id_len = 1, .url = JOB_URL_CHAT, .model = "m",
                             .choices = &ch, .n_choices = 1};
    struct kvb_buf b = {0};
    kvb_alloc_fail_after(0);
    CHECK(job_format_result(&b, &res) == KVB_ERR_NOMEM);
    kvb_alloc_fail_after(-1);
    CHECK(b.len == 0);
    CHECK(job_format_result(&b, &res) == KVB_OK);
    size_t one = b.len;
    /* growing an existing buffer fails: the first line stays, nothing half-written */
    char big[5000];
    memset(big, 'q', sizeof big);
    ch.text = big;
    ch.text_len = sizeof big;
    kvb_alloc_fail_after(0);
    CHECK(job_format_result(&b, &res) == KVB_ERR_NOMEM);
    kvb_alloc_fail_after(-1);
    CHECK(b.len == one);
    kvb_buf_free(&b);

    /* resume over a small file, failing each allocation in turn */
    char *path = tmp_path();
    struct kvb_buf fb = {0};
    for (int k = 0; k < 40; k++) {
        char cid[16];
        snprintf(cid, sizeof cid, "id%d", k);
        append_result(&fb, cid);
    }
    write_file(path, fb.data, fb.len);
    kvb_buf_free(&fb);
    int rnomem = 0;
    for (long n = 0; n < 30; n++) {
        struct job_idset *keys;
        CHECK(job_idset_create(&keys) == KVB_OK);
        struct job_resume_info info;
        struct kvb_err err;
        kvb_alloc_fail_after(n);
        enum kvb_status st = job_resume_scan(path, keys, &info, &err);
        kvb_alloc_fail_after(-1);
        CHECK(st == KVB_OK || st == KVB_ERR_NOMEM);
        if (st == KVB_OK) CHECK(info.lines_ok == 40 && !info.torn);
        rnomem += st == KVB_ERR_NOMEM;
        job_idset_free(keys);
    }
    CHECK(rnomem > 3);
    unlink(path);

    struct job_idset *s;
    kvb_alloc_fail_after(0);
    CHECK(job_idset_create(&s) == KVB_ERR_NOMEM);
    kvb_alloc_fail_after(1);
    CHECK(job_idset_create(&s) == KVB_ERR_NOMEM);
    kvb_alloc_fail_after(-1);
    CHECK(job_idset_create(&s) == KVB_OK);
    kvb_alloc_fail_after(0);
    CHECK(job_idset_add(s, "x", 1, NULL) == KVB_ERR_NOMEM);
    kvb_alloc_fail_after(-1);
    CHECK(!job_idset_contains(s, "x", 1));
    CHECK(job_idset_count(s) == 0);
    job_idset_free(s);
}

/* ---- the example job ------------------------------------------------------------------ */

static void test_example_job(void)
{
    const char *src = tu_env("KVB_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/jobs/examples/chat-mixed.jsonl", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "note: %s not found, example check skipped\n", path);
        return;
    }
    struct job_reader *r;
    CHECK(job_reader_create(f, 0, &r, NULL) == KVB_OK);
    struct job_idset *seen;
    CHECK(job_idset_create(&seen) == KVB_OK);
    struct job_line l;
    bool got;
    int ok = 0, blank = 0, chat = 0, comp = 0, shorthand = 0;
    char codes[512] = "";
    while (job_reader_next(r, &l, &got, NULL) == KVB_OK && got) {
        if (job_line_is_blank(l.data, l.len)) {
            blank++;
            continue;
        }
        struct job_request req;
        struct job_error e;
        enum kvb_status st = job_parse_line(l.data, l.len, l.line_no, &req, &e);
        if (st == KVB_OK) {
            bool added;
            CHECK(job_idset_add(seen, req.custom_id, req.custom_id_len, &added) == KVB_OK);
            if (added) {
                ok++;
                chat += req.url == JOB_URL_CHAT;
                comp += req.url == JOB_URL_COMPLETION;
                shorthand += req.shorthand;
                CHECK(req.max_tokens <= 48);
            } else {
                job_error_setf(&e, JOB_ERR_DUPLICATE_CUSTOM_ID, l.line_no, "custom_id", "duplicate");
                st = KVB_ERR_FORMAT;
            }
        }
        if (st != KVB_OK) {
            char one[64];
            snprintf(one, sizeof one, "%llu:%s ", (unsigned long long)l.line_no, e.code);
            strncat(codes, one, sizeof codes - strlen(codes) - 1);
        }
        job_request_free(&req);
    }
    CHECK_EQ_INT(ok, 8);
    CHECK_EQ_INT(blank, 1);
    CHECK(chat >= 5 && comp >= 3 && shorthand == 2);
    CHECK_MSG(strcmp(codes, "9:invalid_json 10:missing_field 11:duplicate_custom_id 12:invalid_value 13:invalid_value ") == 0,
              "%s", codes);
    job_idset_free(seen);
    job_reader_free(r);
    fclose(f);
}

int main(void)
{
    test_bad_json();
    test_bad_shape();
    test_bad_messages();
    test_bad_prompt();
    test_bad_sampling();
    test_defaults();
    test_openai_chat();
    test_openai_completion();
    test_shorthand();
    test_request_fields();
    test_escapes();
    test_keys();
    test_result_chat();
    test_result_completion();
    test_logprobs();
    test_error_lines();
    test_reader_basic();
    test_reader_long();
    test_idset();
    test_resume();
    test_alloc_failures();
    test_example_job();
    return tu_finish();
}
