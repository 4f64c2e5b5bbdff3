/* test_job_output.c — the jobs module's output side: result and error lines
 * read back as JSON (see jobs_check.h), their deterministic keys, logprobs,
 * the line reader on a 2 MB line, id sets, and resume over torn and corrupt
 * files. */
#include "jobs_check.h" /* first: it compiles this test's own strict jsmn */

#include <unistd.h>

#include "jobs/job.h"
#include "support/testutil.h"

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
    for (int k = 0; k < JOB_KEY_LEN; k++)
        CHECK((a.hex[k] >= '0' && a.hex[k] <= '9') || (a.hex[k] >= 'a' && a.hex[k] <= 'f'));
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
        .custom_id = "c",
        .custom_id_len = 1,
        .url = JOB_URL_COMPLETION,
        .model = "m",
        .created = 5,
        .choices = &ch,
        .n_choices = 1,
        .prompt_tokens = 3,
        .completion_tokens = 2,
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
    struct job_choice ch = {.text = "\xe2\x82\xac!",
                            .text_len = 4,
                            .finish = JOB_FINISH_LENGTH,
                            .has_logprobs = true,
                            .logprobs = lp,
                            .n_logprobs = 3};
    struct job_result res = {
        .custom_id = "lp", .custom_id_len = 2, .url = JOB_URL_CHAT, .model = "m", .choices = &ch, .n_choices = 1};
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
    CHECK(doc_str_is(&d, P(".tokens[0]"), "bytes:\\xe2\\x82")); /* a split character, as OpenAI writes it */
    CHECK(doc_str_is(&d, P(".tokens[1]"), "bytes:\\xac"));
    CHECK(fabs(doc_num(&d, P(".token_logprobs[1]")) + 0.5) < 1e-7);
    CHECK(doc_num(&d, P(".token_logprobs[2]")) == -9999.0);
    CHECK(doc_num(&d, P(".top_logprobs[0].X")) == -1.5);
    /* offsets in code points from the prompt's start: "€" counts once, where its first byte is */
    CHECK(doc_num(&d, P(".text_offset[0]")) == 0);
    CHECK(doc_num(&d, P(".text_offset[1]")) == 1);
    CHECK(doc_num(&d, P(".text_offset[2]")) == 1);
    CHECK(doc_at(&d, P(".content")) < 0);
    doc_close(&d);
    ch.text_offset0 = 5; /* a prompt of five code points, not echoed */
    b.len = 0;
    CHECK(job_format_result(&b, &res) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_num(&d, P(".text_offset[0]")) == 5 && doc_num(&d, P(".text_offset[2]")) == 6);
    doc_close(&d);

    /* an echoed prompt's first token has no score: null in both lists */
    lp[0].none = true;
    b.len = 0;
    CHECK(job_format_result(&b, &res) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_is_null(&d, P(".token_logprobs[0]")) && doc_is_null(&d, P(".top_logprobs[0]")));
    CHECK(fabs(doc_num(&d, P(".token_logprobs[1]")) + 0.5) < 1e-7);
    doc_close(&d);
#undef P

    /* vLLM's prompt_logprobs: in the choice for completions, at the top for chat */
    struct job_rank_logprob e1[2] = {{7, -2.5f, 3, "a", 1}, {9, -0.25f, 1, "\"", 1}};
    struct job_prompt_logprob plp[2] = {{NULL, 0}, {e1, 2}};
    ch.prompt_logprobs = plp;
    ch.n_prompt_logprobs = 2;
    b.len = 0;
    CHECK(job_format_result(&b, &res) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_is_null(&d, "response.body.choices[0].prompt_logprobs[0]"));
    CHECK(doc_num(&d, "response.body.choices[0].prompt_logprobs[1].7.logprob") == -2.5);
    CHECK(doc_num(&d, "response.body.choices[0].prompt_logprobs[1].7.rank") == 3);
    CHECK(doc_str_is(&d, "response.body.choices[0].prompt_logprobs[1].9.decoded_token", "\""));
    CHECK(doc_at(&d, "response.body.prompt_logprobs") < 0);
    doc_close(&d);
    ch.prompt_logprobs = NULL;
    res.url = JOB_URL_CHAT;
    res.prompt_logprobs = plp;
    res.n_prompt_logprobs = 2;
    b.len = 0;
    CHECK(job_format_result(&b, &res) == KVB_OK);
    doc_open(&d, b.data, b.len);
    CHECK(doc_num(&d, "response.body.prompt_logprobs[1].9.logprob") == -0.25);
    CHECK(doc_at(&d, "response.body.choices[0].prompt_logprobs") < 0);
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
    job_error_setf(&e, JOB_ERR_DUPLICATE_CUSTOM_ID, 40, "custom_id", "custom_id '%s' was already used on line %d", "q",
                   3);
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

int main(void)
{
    test_keys();
    test_result_chat();
    test_result_completion();
    test_logprobs();
    test_error_lines();
    test_reader_basic();
    test_reader_long();
    test_idset();
    test_resume();
    return tu_finish();
}
