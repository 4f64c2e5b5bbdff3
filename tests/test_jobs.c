/* test_jobs.c — the jobs module's request parsing: every accepted shape,
 * defaults, escapes, every bad-input case with its code, line and field;
 * allocation failures; the example job. Output lines, the reader, id sets
 * and resume: test_job_output.c. */
#include "jobs_check.h" /* first: it compiles this test's own strict jsmn */

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
    expect_err(
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/images/generations\",\"body\":{\"prompt\":\"x\"}}",
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

/* Scoring: echo on completions, prompt_logprobs on both; max_tokens 0 only with them. */
static void test_scoring_fields(void)
{
    char line[1024];
#define CH(f) (snprintf(line, sizeof line, "%s,%s}}", CHAT_PRE, f), line)
#define CO(f) (snprintf(line, sizeof line, "%s,%s}}", COMP_PRE, f), line)
    expect_err(CH("\"echo\":true"), JOB_ERR_INVALID_VALUE, "body.echo");
    expect_err(CO("\"echo\":\"yes\""), JOB_ERR_INVALID_TYPE, "body.echo");
    expect_err(CO("\"max_tokens\":0"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CO("\"max_tokens\":0,\"echo\":false"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CH("\"max_tokens\":0,\"echo\":true"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CO("\"max_tokens\":0,\"prompt_logprobs\":null"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CO("\"max_tokens\":-1,\"echo\":true"), JOB_ERR_INVALID_VALUE, "body.max_tokens");
    expect_err(CO("\"prompt_logprobs\":21"), JOB_ERR_INVALID_VALUE, "body.prompt_logprobs");
    expect_err(CH("\"prompt_logprobs\":-1"), JOB_ERR_INVALID_VALUE, "body.prompt_logprobs");
    expect_err(CH("\"prompt_logprobs\":true"), JOB_ERR_INVALID_TYPE, "body.prompt_logprobs");
    {
        struct job_request r;
        parse_ok(CO("\"echo\":true,\"logprobs\":1,\"max_tokens\":0"), &r);
        CHECK(r.echo && r.logprobs && r.top_logprobs == 1 && r.max_tokens == 0 && r.prompt_logprobs == -1 &&
              job_scores_prompt(&r));
        job_request_free(&r);
        parse_ok(CO("\"echo\":true,\"max_tokens\":0"), &r); /* the prompt back, nothing scored */
        CHECK(r.echo && !r.logprobs && r.max_tokens == 0 && !job_scores_prompt(&r));
        job_request_free(&r);
        parse_ok(CH("\"prompt_logprobs\":5,\"max_completion_tokens\":0"), &r);
        CHECK(!r.echo && r.prompt_logprobs == 5 && r.max_tokens == 0 && job_scores_prompt(&r));
        job_request_free(&r);
        parse_ok(CO("\"prompt_logprobs\":null"), &r);
        CHECK(r.prompt_logprobs == -1 && !job_scores_prompt(&r));
        job_request_free(&r);
    }
#undef CH
#undef CO
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
        CHECK(r.messages == NULL && r.n_messages == 0);       /* the rest is dropped */
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
    expect_err(CH("\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]"), JOB_ERR_INVALID_VALUE,
               "body.stop");
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
    expect_err(CO("\"suffix\":\"end\""), JOB_ERR_INVALID_VALUE, "body.suffix");
    expect_err(CO("\"best_of\":3"), JOB_ERR_INVALID_VALUE, "body.best_of");
    {
        struct job_request r;
        parse_ok(CH("\"response_format\":{\"type\":\"json_object\"},\"tools\":[],\"logit_bias\":{},"
                    "\"stream\":false,\"user\":\"u\",\"n\":2,\"best_of\":2"),
                 &r);
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
        parse_ok(
            CH("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,"
               "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"),
            &r);
        /* the schema is kept as written; the engine compiles it (test_grammar_schema) */
        static const char sc[] =
            "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
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
    expect_err_at("{\"custom_id\":\"s\",\"prompt\":\"x\",\"top_p\":2}", 123456789012ULL, JOB_ERR_INVALID_VALUE,
                  "top_p");
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
    uint32_t all = JOB_GIVEN_MODEL | JOB_GIVEN_MAX_TOKENS | JOB_GIVEN_TEMPERATURE | JOB_GIVEN_TOP_P | JOB_GIVEN_TOP_K |
                   JOB_GIVEN_MIN_P | JOB_GIVEN_SEED | JOB_GIVEN_STOP | JOB_GIVEN_PRESENCE_PENALTY |
                   JOB_GIVEN_FREQUENCY_PENALTY | JOB_GIVEN_REPETITION_PENALTY | JOB_GIVEN_N | JOB_GIVEN_LOGPROBS |
                   JOB_GIVEN_TOP_LOGPROBS;
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
    expect_err(
        "{\"custom_id\":\"v\",\"prompt\":\"x\",\"ignore_eos\":true,\"response_format\":{\"type\":\"json_object\"}}",
        JOB_ERR_INVALID_VALUE, "ignore_eos");

    /* a logit_bias key whose raw bytes are not UTF-8 decodes longer than it
     * is written (three bytes each): refused, not copied past the key's buffer */
    expect_err("{\"custom_id\":\"v\",\"prompt\":\"x\",\"logit_bias\":{"
               "\"1\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\":1}}",
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
    snprintf(line, sizeof line,
             "{\"custom_id\":\"t\",%s,\"add_generation_prompt\":false,\"continue_final_message\":true}", conv);
    parse_ok(line, &r);
    CHECK(!r.add_generation_prompt && r.continue_final_message);
    job_request_free(&r);
    snprintf(line, sizeof line, "{\"custom_id\":\"t\",%s,\"continue_final_message\":true}", conv);
    expect_err(line, JOB_ERR_INVALID_VALUE, "continue_final_message");
    expect_err(
        "{\"custom_id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"add_generation_prompt\":false,"
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
    static const struct {
        const char *line, *code, *param;
    } refused[] = {
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"chat_template\":\"{{x}}\"}", JOB_ERR_UNSUPPORTED_FIELD,
         "chat_template"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"max_token\":3}", JOB_ERR_UNSUPPORTED_FIELD, "max_token"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_decoding_backend\":\"xgrammar\"}", JOB_ERR_UNSUPPORTED_FIELD,
         "guided_decoding_backend"},
        {"{\"custom_id\":\"u\",\"body\":{\"prompt\":\"x\"},\"temperature\":0}", JOB_ERR_UNSUPPORTED_FIELD,
         "temperature"},
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
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
         "\"schema\":"
         "{\"type\":\"object\"},\"x\":1}}}",
         JOB_ERR_UNSUPPORTED_FIELD, "response_format.json_schema.x"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"messages\":[]}", JOB_ERR_INVALID_REQUEST, "prompt"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        expect_err(refused[k].line, refused[k].code, refused[k].param);
}

/* structured_outputs and guided_*: read and kept as written, one a request. */
static void test_constraints(void)
{
    struct job_request r;
    parse_ok("{\"custom_id\":\"g\",\"prompt\":\"x\",\"guided_regex\":\"[a-z]+\\\\d\"}", &r);
    CHECK(r.constraint == JOB_CONSTRAINT_REGEX && strcmp(r.constraint_text, "[a-z]+\\d") == 0);
    CHECK(strcmp(r.constraint_param, "guided_regex") == 0);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"g\",\"body\":{\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"a\",\"b\\\"c\"]}}}",
             &r);
    CHECK(r.constraint == JOB_CONSTRAINT_CHOICE && strcmp(r.constraint_text, "[\"a\",\"b\\\"c\"]") == 0);
    CHECK(strcmp(r.constraint_param, "body.structured_outputs.choice") == 0);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"g\",\"prompt\":\"x\",\"structured_outputs\":{\"grammar\":\"root ::= \\\"a\\\"\"}}", &r);
    CHECK(r.constraint == JOB_CONSTRAINT_GRAMMAR && strcmp(r.constraint_text, "root ::= \"a\"") == 0);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"g\",\"prompt\":\"x\",\"guided_json\":\"{\\\"type\\\":\\\"object\\\"}\"}", &r);
    CHECK(r.constraint == JOB_CONSTRAINT_JSON && r.json_object && strcmp(r.json_schema, "{\"type\":\"object\"}") == 0);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"g\",\"prompt\":\"x\",\"structured_outputs\":{\"json\":{\"type\":\"object\"}}}", &r);
    CHECK(r.constraint == JOB_CONSTRAINT_JSON && strcmp(r.json_schema, "{\"type\":\"object\"}") == 0);
    job_request_free(&r);
    parse_ok(
        "{\"custom_id\":\"g\",\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":true},\"guided_regex\":null}",
        &r);
    CHECK(r.constraint == JOB_CONSTRAINT_JSON && r.json_object && !r.json_schema);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"g\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", &r);
    CHECK(r.constraint == JOB_CONSTRAINT_JSON && strcmp(r.constraint_param, "response_format") == 0);
    job_request_free(&r);
    static const struct {
        const char *line, *code, *param;
    } bad[] = {
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]}",
         JOB_ERR_INVALID_VALUE, "guided_choice"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"},\"guided_grammar\":"
         "\"root ::= \\\"a\\\"\"}",
         JOB_ERR_INVALID_VALUE, "guided_grammar"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"structured_outputs\":{\"regex\":\"a\",\"choice\":[\"a\"]}}",
         JOB_ERR_INVALID_VALUE, "structured_outputs.choice"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"structured_outputs\":{\"whitespace_pattern\":\" \"}}",
         JOB_ERR_UNSUPPORTED_FIELD, "structured_outputs.whitespace_pattern"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"structured_outputs\":[]}", JOB_ERR_INVALID_TYPE,
         "structured_outputs"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_choice\":[]}", JOB_ERR_INVALID_TYPE, "guided_choice"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_choice\":[\"a\",1]}", JOB_ERR_INVALID_TYPE,
         "guided_choice[1]"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_regex\":3}", JOB_ERR_INVALID_TYPE, "guided_regex"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_grammar\":\"\"}", JOB_ERR_INVALID_VALUE, "guided_grammar"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_json\":3}", JOB_ERR_INVALID_TYPE, "guided_json"},
        {"{\"custom_id\":\"u\",\"prompt\":\"x\",\"guided_regex\":\"a\",\"ignore_eos\":true}", JOB_ERR_INVALID_VALUE,
         "ignore_eos"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) expect_err(bad[k].line, bad[k].code, bad[k].param);
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
    CHECK_MSG(strcmp(r.prompt, "[\xef\xbf\xbd][\xef\xbf\xbd][\xef\xbf\xbd"
                               "A][\xef\xbf\xbd][\xef\xbf\xbd\xef\xbf\xbd]") == 0,
              "%s", r.prompt);
    CHECK(strlen(r.prompt) == r.prompt_len);
    job_request_free(&r);
    parse_ok(
        "{\"custom_id\":\"e\",\"prompt\":\"[\xff][\xc0\x80][\xe2\x82][\xed\xa0\x80][\xf4\x90\x80\x80][\xe2\x82\xac]\"}",
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
    static const struct {
        const char *json;
        const char *exact;
    } ids[] = {
        {"x\\ud800", "x\xed\xa0\x80"},
        {"x\\udfff", "x\xed\xbf\xbf"},
        {"x\\ud800\\u0041", "x\xed\xa0\x80"
                            "A"},
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
        CHECK_MSG(r.custom_id_json && strcmp(r.custom_id_json, ids[k].json) == 0, "custom_id %s as written",
                  ids[k].json);
        job_key_custom_id(r.custom_id, r.custom_id_len, &keys[k]);
        for (size_t m = 0; m < k; m++)
            CHECK_MSG(strcmp(keys[m].hex, keys[k].hex) != 0, "ids %zu and %zu share a key", m, k);
        /* both kinds of line carry the id exactly as written */
        struct kvb_buf b = {0};
        struct job_choice ch = {.text = "t", .text_len = 1};
        struct job_result res = {.custom_id = r.custom_id,
                                 .custom_id_len = r.custom_id_len,
                                 .custom_id_json = r.custom_id_json,
                                 .custom_id_json_len = r.custom_id_json_len,
                                 .url = JOB_URL_COMPLETION,
                                 .model = "m",
                                 .choices = &ch,
                                 .n_choices = 1};
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
    struct job_result res = {
        .custom_id = "f", .custom_id_len = 1, .url = JOB_URL_CHAT, .model = "m", .choices = &ch, .n_choices = 1};
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
    CHECK_MSG(
        strcmp(codes, "9:invalid_json 10:missing_field 11:duplicate_custom_id 12:invalid_value 13:invalid_value ") == 0,
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
    test_scoring_fields();
    test_defaults();
    test_openai_chat();
    test_openai_completion();
    test_constraints();
    test_shorthand();
    test_request_fields();
    test_escapes();
    test_alloc_failures();
    test_example_job();
    return tu_finish();
}
