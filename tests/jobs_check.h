/* jobs_check.h — what the jobs tests share (test_jobs.c, test_job_output.c):
 * reading output lines back as JSON, twice (an independent jsmn in strict
 * mode compiled into each test, and the module's own strict reader, which
 * also lets the checks look fields up by path), and parsing a line that
 * must pass or must fail with a given code and field. Static helpers: each
 * test includes this once, before anything that includes jsmn.h. */
#ifndef KVB_TESTS_JOBS_CHECK_H
#define KVB_TESTS_JOBS_CHECK_H

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
#include "base/json.h"
#include "jobs/job.h"
#include "support/testutil.h"

/* ---- helpers: JSON read-back ------------------------------------------------------ */

/* Strict jsmn (this file's copy) must accept the whole line as one value. */
static inline bool strict_jsmn_ok(const char *s, size_t n)
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
static inline void doc_open(struct doc *d, const char *line, size_t len)
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

static inline void doc_close(struct doc *d) { json_free(&d->j); }

/* Token at a path such as "response.body.choices[0].message.content", or -1. */
static inline int doc_at(const struct doc *d, const char *path)
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
static inline char *doc_str(const struct doc *d, const char *path)
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

static inline bool doc_str_is(const struct doc *d, const char *path, const char *want)
{
    char *s = doc_str(d, path);
    bool eq = strcmp(s, want) == 0;
    if (!eq) fprintf(stderr, "  %s = '%s', want '%s'\n", path, s, want);
    free(s);
    return eq;
}

static inline double doc_num(const struct doc *d, const char *path)
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

static inline bool doc_is_null(const struct doc *d, const char *path)
{
    int i = doc_at(d, path);
    return i >= 0 && json_kind(&d->j, i) == JSON_NULL;
}

/* ---- helpers: parsing ------------------------------------------------------------- */

static inline void parse_ok(const char *line, struct job_request *r)
{
    struct job_error e;
    memset(&e, 0, sizeof e);
    enum kvb_status st = job_parse_line(line, strlen(line), 3, r, &e);
    CHECK_MSG(st == KVB_OK, "rejected (%s): %s\n  line: %s", e.code ? e.code : "?", e.message, line);
}

/* The line must fail with `code`; the message must name line `ln` and, when
 * param is non-NULL, the field (in quotes), which must also be e.param. */
static inline void expect_err_at(const char *line, uint64_t ln, const char *code, const char *param)
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

static inline void expect_err(const char *line, const char *code, const char *param)
{
    expect_err_at(line, 7, code, param);
}

#define CHAT_PRE                                                                                                       \
    "{\"custom_id\":\"c1\",\"method\":\"POST\",\"url\":\"/v1/chat/"                                                    \
    "completions\",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define COMP_PRE "{\"custom_id\":\"p1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"hi\""

/* ---- parsing: bad input ------------------------------------------------------------- */

/* ---- files ---------------------------------------------------------------------------- */

static inline char *tmp_path(void)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvb_test_jobs_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) tu_skip("mkstemp failed");
    close(fd);
    return path;
}

static inline void write_file(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static inline void append_result(struct kvb_buf *b, const char *cid)
{
    struct job_choice ch = {.text = "ok", .text_len = 2};
    struct job_result res = {.custom_id = cid,
                             .custom_id_len = strlen(cid),
                             .url = JOB_URL_CHAT,
                             .model = "m",
                             .choices = &ch,
                             .n_choices = 1,
                             .prompt_tokens = 1,
                             .completion_tokens = 1};
    CHECK(job_format_result(b, &res) == KVB_OK);
}

#endif
