/* test_jobs_pool.c — the pooled endpoints in the job format: /v1/embeddings
 * (OpenAI's), /v1/score and /v1/rerank (vLLM's run-batch forms), read from
 * both the batch form and the shorthand, every field read or refused by
 * name; and their result lines: OpenAI's CreateEmbeddingResponse (floats
 * that give back the same float32, base64 of the little-endian bytes),
 * vLLM's ScoreResponse and RerankResponse (results by decreasing score,
 * ties by index, the best top_n). The Python tests hold these lines to the
 * openai types; here each field is checked by path. */
#include <math.h>
#include <string.h>

#include "jobs_check.h"

#define EMB_PRE "{\"custom_id\":\"e1\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{"

static void test_embeddings(void)
{
    struct job_request r;
    parse_ok(EMB_PRE "\"input\":\"hello\",\"model\":\"m\",\"user\":\"u\",\"encoding_format\":\"float\"}}", &r);
    CHECK(r.url == JOB_URL_EMBEDDINGS && r.n_prompts == 1 && !strcmp(r.prompts[0].text, "hello"));
    CHECK(!r.base64 && r.dimensions == 0 && r.add_special_tokens && r.max_tokens == 0 && !strcmp(r.model, "m"));
    job_request_free(&r);
    parse_ok(EMB_PRE "\"input\":[\"a\",\"b\",\"c\"],\"encoding_format\":\"base64\",\"dimensions\":8,"
                     "\"add_special_tokens\":false}}",
             &r);
    CHECK(r.n_prompts == 3 && r.base64 && r.dimensions == 8 && !r.add_special_tokens);
    job_request_free(&r);
    parse_ok(EMB_PRE "\"input\":[1,2,3]}}", &r);
    CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 3 && !r.prompts[0].text);
    job_request_free(&r);
    parse_ok(EMB_PRE "\"input\":[[1,2],[3]]}}", &r);
    CHECK(r.n_prompts == 2 && r.prompts[1].n_ids == 1);
    job_request_free(&r);
    /* the shorthand, and the url inferred from "input" */
    parse_ok("{\"custom_id\":\"s\",\"input\":\"x\",\"dimensions\":4}", &r);
    CHECK(r.url == JOB_URL_EMBEDDINGS && r.shorthand && r.dimensions == 4);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"s\",\"body\":{\"input\":[\"x\"]}}", &r);
    CHECK(r.url == JOB_URL_EMBEDDINGS && !r.shorthand);
    job_request_free(&r);

    expect_err(EMB_PRE "\"model\":\"m\"}}", JOB_ERR_MISSING_FIELD, "body.input");
    expect_err(EMB_PRE "\"input\":\"\"}}", JOB_ERR_INVALID_VALUE, "body.input");
    expect_err(EMB_PRE "\"input\":[\"a\",\"\"]}}", JOB_ERR_INVALID_VALUE, "body.input[1]");
    expect_err(EMB_PRE "\"input\":[]}}", JOB_ERR_INVALID_VALUE, "body.input");
    expect_err(EMB_PRE "\"input\":5}}", JOB_ERR_INVALID_TYPE, "body.input");
    expect_err(EMB_PRE "\"input\":[\"a\",[1]]}}", JOB_ERR_INVALID_TYPE, "body.input[1]");
    expect_err(EMB_PRE "\"input\":[1,-2]}}", JOB_ERR_INVALID_VALUE, "body.input[1]");
    expect_err(EMB_PRE "\"input\":\"x\",\"encoding_format\":\"int8\"}}", JOB_ERR_INVALID_VALUE, "body.encoding_format");
    expect_err(EMB_PRE "\"input\":\"x\",\"encoding_format\":1}}", JOB_ERR_INVALID_TYPE, "body.encoding_format");
    expect_err(EMB_PRE "\"input\":\"x\",\"dimensions\":0}}", JOB_ERR_INVALID_VALUE, "body.dimensions");
    expect_err(EMB_PRE "\"input\":\"x\",\"dimensions\":1.5}}", JOB_ERR_INVALID_TYPE, "body.dimensions");
    expect_err(EMB_PRE "\"input\":\"x\",\"temperature\":0}}", JOB_ERR_UNSUPPORTED_FIELD, "body.temperature");
    expect_err(EMB_PRE "\"input\":\"x\",\"bogus\":0}}", JOB_ERR_UNSUPPORTED_FIELD, "body.bogus");
    expect_err(EMB_PRE "\"input\":\"x\",\"truncate_prompt_tokens\":8}}", JOB_ERR_UNSUPPORTED_FIELD,
               "body.truncate_prompt_tokens");
    expect_err("{\"custom_id\":\"s\",\"input\":\"x\",\"prompt\":\"y\"}", JOB_ERR_INVALID_REQUEST, "url");
    {
        /* OpenAI's bound: 2048 inputs */
        static char line[2049 * 4 + 128];
        strcpy(line, EMB_PRE "\"input\":[");
        for (int k = 0; k < 2049; k++) strcat(line, k ? ",\"a\"" : "\"a\"");
        strcat(line, "]}}");
        expect_err(line, JOB_ERR_INVALID_VALUE, "body.input");
    }
}

#define SCORE_PRE "{\"custom_id\":\"s1\",\"url\":\"/v1/score\",\"body\":{"
#define RERANK_PRE "{\"custom_id\":\"r1\",\"url\":\"/v1/rerank\",\"body\":{"

static void test_score_rerank(void)
{
    struct job_request r;
    parse_ok(SCORE_PRE "\"text_1\":\"q\",\"text_2\":[\"a\",\"b\"],\"model\":\"m\",\"priority\":0}}", &r);
    CHECK(r.url == JOB_URL_SCORE && r.n_prompts == 1 && r.n_docs == 2 && !strcmp(r.docs[1].text, "b"));
    CHECK(r.use_activation && r.max_tokens == 0);
    job_request_free(&r);
    parse_ok(SCORE_PRE "\"text_1\":[\"q1\",\"q2\"],\"text_2\":[\"a\",\"b\"],\"use_activation\":false}}", &r);
    CHECK(r.n_prompts == 2 && !r.use_activation);
    job_request_free(&r);
    parse_ok(SCORE_PRE "\"text_1\":\"q\",\"text_2\":\"a\",\"softmax\":false}}", &r); /* vLLM's older name */
    CHECK(r.n_docs == 1 && !r.use_activation);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"s\",\"text_1\":\"q\",\"text_2\":\"a\"}", &r);
    CHECK(r.url == JOB_URL_SCORE && r.shorthand);
    job_request_free(&r);
    parse_ok("{\"custom_id\":\"s\",\"url\":\"/score\",\"body\":{\"text_1\":\"q\",\"text_2\":\"a\"}}", &r);
    CHECK(r.url == JOB_URL_SCORE);
    job_request_free(&r);

    expect_err(SCORE_PRE "\"text_1\":\"q\"}}", JOB_ERR_MISSING_FIELD, "body.text_2");
    expect_err(SCORE_PRE "\"text_1\":[\"a\",\"b\"],\"text_2\":[\"a\",\"b\",\"c\"]}}", JOB_ERR_INVALID_VALUE,
               "body.text_1");
    expect_err(SCORE_PRE "\"text_1\":\"q\",\"text_2\":[\"a\",{\"content\":[]}]}}", JOB_ERR_INVALID_TYPE,
               "body.text_2[1]");
    expect_err(SCORE_PRE "\"text_1\":\"q\",\"text_2\":[]}}", JOB_ERR_INVALID_VALUE, "body.text_2");
    expect_err(SCORE_PRE "\"text_1\":\"q\",\"text_2\":\"a\",\"top_n\":1}}", JOB_ERR_UNSUPPORTED_FIELD, "body.top_n");
    expect_err(SCORE_PRE "\"text_1\":\"q\",\"text_2\":\"a\",\"mm_processor_kwargs\":{}}}", JOB_ERR_UNSUPPORTED_FIELD,
               "body.mm_processor_kwargs");
    expect_err(SCORE_PRE "\"text_1\":\"q\",\"text_2\":\"a\",\"use_activation\":1}}", JOB_ERR_INVALID_TYPE,
               "body.use_activation");

    parse_ok(RERANK_PRE "\"query\":\"q\",\"documents\":[\"a\",\"b\",\"c\"],\"top_n\":2}}", &r);
    CHECK(r.url == JOB_URL_RERANK && r.n_prompts == 1 && r.n_docs == 3 && r.top_n == 2);
    job_request_free(&r);
    static const char *const routes[] = {"/rerank", "/v2/rerank"};
    for (int k = 0; k < 2; k++) {
        char line[256];
        snprintf(line, sizeof line,
                 "{\"custom_id\":\"r\",\"url\":\"%s\",\"body\":{\"query\":\"q\",\"documents\":[\"a\"]}}", routes[k]);
        parse_ok(line, &r);
        CHECK(r.url == JOB_URL_RERANK);
        job_request_free(&r);
    }
    parse_ok("{\"custom_id\":\"r\",\"query\":\"q\",\"documents\":[\"a\"]}", &r);
    CHECK(r.url == JOB_URL_RERANK && r.shorthand);
    job_request_free(&r);
    expect_err(RERANK_PRE "\"query\":[\"q\"],\"documents\":[\"a\"]}}", JOB_ERR_INVALID_TYPE, "body.query");
    expect_err(RERANK_PRE "\"query\":\"q\",\"documents\":\"a\"}}", JOB_ERR_INVALID_TYPE, "body.documents");
    expect_err(RERANK_PRE "\"query\":\"q\"}}", JOB_ERR_MISSING_FIELD, "body.documents");
    expect_err(RERANK_PRE "\"query\":\"q\",\"documents\":[\"a\"],\"top_n\":-1}}", JOB_ERR_INVALID_VALUE, "body.top_n");
    expect_err(RERANK_PRE "\"query\":\"q\",\"documents\":[\"a\"],\"input\":\"x\"}}", JOB_ERR_UNSUPPORTED_FIELD,
               "body.input");
    expect_err("{\"custom_id\":\"r\",\"query\":\"q\",\"documents\":[\"a\"],\"text_1\":\"q\"}", JOB_ERR_INVALID_REQUEST,
               "url");
}

/* ---- result lines ---------------------------------------------------------------------- */

static void format(const struct job_pool_result *res, struct doc *d, struct kvb_buf *b)
{
    b->len = 0;
    CHECK(job_format_pooled(b, res) == KVB_OK);
    CHECK(b->len > 0 && b->data[b->len - 1] == '\n');
    doc_open(d, b->data, b->len);
}

static void test_output(void)
{
    struct kvb_buf b = {0};
    struct doc d;
    const float v[6] = {1.0f, -0.5f, 0.1f, 3.4028235e38f, 1e-45f, -0.0f};
    struct job_pool_result res = {.custom_id = "e1",
                                  .custom_id_len = 2,
                                  .url = JOB_URL_EMBEDDINGS,
                                  .model = "m",
                                  .values = v,
                                  .n_items = 2,
                                  .dim = 3,
                                  .prompt_tokens = 7};
    format(&res, &d, &b);
    CHECK(doc_str_is(&d, "response.body.object", "list"));
    CHECK(doc_str_is(&d, "response.body.data[1].object", "embedding"));
    CHECK(doc_num(&d, "response.body.data[1].index") == 1);
    CHECK(doc_str_is(&d, "response.body.model", "m"));
    CHECK(doc_num(&d, "response.body.usage.prompt_tokens") == 7 &&
          doc_num(&d, "response.body.usage.total_tokens") == 7);
    CHECK(doc_at(&d, "response.body.usage.completion_tokens") < 0 && doc_at(&d, "response.body.id") < 0);
    /* every float comes back as the same float32 */
    for (int i = 0; i < 6; i++) {
        char path[64];
        snprintf(path, sizeof path, "response.body.data[%d].embedding[%d]", i / 3, i % 3);
        const float got = (float)doc_num(&d, path);
        CHECK_MSG(memcmp(&got, &v[i], 4) == 0 || (got == 0 && v[i] == 0), "%s: %.9g vs %.9g", path, (double)got,
                  (double)v[i]);
    }
    CHECK(doc_is_null(&d, "error"));
    doc_close(&d);
    /* base64: 1.0f, -0.5f, 0.1f little-endian is 00 00 80 3f 00 00 00 bf cd cc cc 3d */
    res.base64 = true;
    format(&res, &d, &b);
    CHECK(doc_str_is(&d, "response.body.data[0].embedding", "AACAPwAAAL/NzMw9"));
    doc_close(&d);
    res.dim = 1; /* 4 bytes: one '=' of padding... */
    format(&res, &d, &b);
    CHECK(doc_str_is(&d, "response.body.data[0].embedding", "AACAPw=="));
    doc_close(&d);
    res.dim = 2; /* ...8 bytes: one */
    format(&res, &d, &b);
    CHECK(doc_str_is(&d, "response.body.data[0].embedding", "AACAPwAAAL8="));
    doc_close(&d);

    /* score: in input order */
    const float s[4] = {0.25f, 0.75f, 0.5f, 0.75f};
    struct job_prompt docs[4] = {{.text = "a", .text_len = 1},
                                 {.text = "b\"", .text_len = 2},
                                 {.text = "c", .text_len = 1},
                                 {.text = "d", .text_len = 1}};
    res = (struct job_pool_result){.custom_id = "s1",
                                   .custom_id_len = 2,
                                   .url = JOB_URL_SCORE,
                                   .model = "m",
                                   .created = 42,
                                   .values = s,
                                   .n_items = 4,
                                   .prompt_tokens = 9,
                                   .cached_tokens = 3};
    format(&res, &d, &b);
    CHECK(doc_str_is(&d, "response.body.object", "list") && doc_num(&d, "response.body.created") == 42);
    CHECK(doc_str_is(&d, "response.body.data[2].object", "score") && doc_num(&d, "response.body.data[2].score") == 0.5);
    CHECK(doc_num(&d, "response.body.usage.prompt_tokens") == 9 &&
          doc_num(&d, "response.body.usage.prompt_tokens_details.cached_tokens") == 3);
    char *id = doc_str(&d, "response.body.id");
    CHECK(!strncmp(id, "score-", 6) && strlen(id) == 6 + JOB_KEY_LEN);
    free(id);
    doc_close(&d);
    /* rerank: by decreasing score, ties by index, the best top_n, documents echoed */
    res.url = JOB_URL_RERANK;
    res.docs = docs;
    res.top_n = 3;
    format(&res, &d, &b);
    CHECK(doc_num(&d, "response.body.results[0].index") == 1 && doc_num(&d, "response.body.results[1].index") == 3);
    CHECK(doc_num(&d, "response.body.results[2].index") == 2 && doc_at(&d, "response.body.results[3]") < 0);
    CHECK(doc_str_is(&d, "response.body.results[0].document.text", "b\""));
    CHECK(doc_num(&d, "response.body.results[2].relevance_score") == 0.5);
    CHECK(doc_num(&d, "response.body.usage.total_tokens") == 9);
    doc_close(&d);
    res.top_n = 0;
    format(&res, &d, &b);
    CHECK(doc_num(&d, "response.body.results[3].index") == 0);
    doc_close(&d);
    /* a value that JSON cannot hold makes no line */
    const float bad[2] = {1.0f, NAN};
    res.values = bad;
    res.n_items = 2;
    b.len = 0;
    CHECK(job_format_pooled(&b, &res) == KVB_ERR_INVALID_ARG && b.len == 0);
    kvb_buf_free(&b);
}

int main(void)
{
    test_embeddings();
    test_score_rerank();
    test_output();
    return tu_finish();
}
