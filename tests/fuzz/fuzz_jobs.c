/* fuzz_jobs.c — libFuzzer target for the JSONL request parser and the
 * output writer: whatever bytes arrive, parsing ends in a request or an
 * error, and the line written for it is one valid JSON object.
 *
 * Properties checked (a violation traps, so the replay test fails too):
 *   - job_parse_line returns KVB_OK or KVB_ERR_FORMAT (no crash, no leak);
 *   - an accepted request keeps every documented range, and its strings are
 *     valid UTF-8 with no NUL inside and a NUL after;
 *   - an error names its line number first;
 *   - custom_id is kept exactly: no NUL inside its exact form, and the line
 *     written for it carries the input's custom_id text byte for byte;
 *   - the result or error line for it ends in exactly one "\n", is accepted
 *     by an independent strict jsmn and by the module's strict reader, and
 *     is the same bytes when written twice;
 *   - the same bytes read through job_reader (small max_line) split into
 *     lines that each parse without crashing.
 * This file is test code, so it may stop the process when a property fails. */
#define JSMN_STATIC
#define JSMN_STRICT
#include <jsmn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "jobs/job.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_jobs: %s:%d: %s\n", __FILE__, __LINE__, #c);                                         \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

static void check_text(const char *s, size_t n)
{
    REQUIRE(s != NULL);
    REQUIRE(s[n] == '\0');
    size_t i = 0;
    while (i < n) {
        size_t bad = 0, k = json_utf8_seq((const unsigned char *)s + i, n - i, &bad);
        REQUIRE(k > 0);
        REQUIRE(s[i] != '\0');
        i += k;
    }
}

/* The exact form (json_str_dup_exact): NUL-terminated, no NUL inside,
 * with the text as written beside it. */
static void check_custom_id(const struct job_request *r)
{
    REQUIRE(r->custom_id[r->custom_id_len] == '\0' && strlen(r->custom_id) == r->custom_id_len);
    REQUIRE(r->custom_id_json != NULL && r->custom_id_json[r->custom_id_json_len] == '\0');
}

static void check_request(const struct job_request *r)
{
    check_custom_id(r);
    REQUIRE(r->custom_id_len > 0);
    if (r->model) check_text(r->model, strlen(r->model));
    if (r->url == JOB_URL_CHAT) {
        REQUIRE(r->n_messages >= 1 && r->messages && !r->prompt);
        for (size_t k = 0; k < r->n_messages; k++) {
            check_text(r->messages[k].content, r->messages[k].content_len);
            REQUIRE(r->messages[k].role <= JOB_ROLE_DEVELOPER);
        }
    } else if (job_url_pooled(r->url)) { /* embeddings' inputs; score's and rerank's two sides */
        REQUIRE(!r->messages && r->prompts && r->n_prompts >= 1 && r->n_prompts <= JOB_MAX_INPUTS);
        REQUIRE(r->max_tokens == 0 && r->dimensions >= 0 && r->top_n >= 0);
        for (int32_t k = 0; k < r->n_prompts; k++) {
            const struct job_prompt *p = &r->prompts[k];
            REQUIRE(!p->text != !p->ids);
            if (p->text) check_text(p->text, p->text_len);
            else REQUIRE(p->n_ids >= 1 && r->url == JOB_URL_EMBEDDINGS);
        }
        if (r->url == JOB_URL_EMBEDDINGS) {
            REQUIRE(!r->docs && r->n_docs == 0);
        } else {
            REQUIRE(r->docs && r->n_docs >= 1 && r->n_docs <= JOB_MAX_INPUTS);
            REQUIRE(r->url == JOB_URL_SCORE ? r->n_prompts == 1 || r->n_prompts == r->n_docs : r->n_prompts == 1);
            for (int32_t k = 0; k < r->n_docs; k++) check_text(r->docs[k].text, r->docs[k].text_len);
        }
    } else {
        REQUIRE(r->url == JOB_URL_COMPLETION && !r->messages && r->prompts);
        REQUIRE(r->n_prompts >= 1 && r->n_prompts <= JOB_MAX_PROMPTS && r->prompt == r->prompts[0].text);
        for (int32_t k = 0; k < r->n_prompts; k++) {
            const struct job_prompt *p = &r->prompts[k];
            REQUIRE(!p->text != !p->ids);
            if (p->text) check_text(p->text, p->text_len);
            else REQUIRE(p->n_ids >= 1);
            for (int32_t m = 0; m < p->n_ids; m++) REQUIRE(p->ids[m] >= 0);
        }
    }
    REQUIRE(r->min_tokens >= 0 && r->min_tokens <= r->max_tokens);
    REQUIRE(r->n_stop_token_ids >= 0 && r->n_stop_token_ids <= JOB_MAX_STOP_TOKEN_IDS);
    for (int32_t k = 0; k < r->n_stop_token_ids; k++) REQUIRE(r->stop_token_ids[k] >= 0);
    REQUIRE(!(r->ignore_eos && r->json_object));
    REQUIRE(!r->continue_final_message || (r->url == JOB_URL_CHAT && !r->add_generation_prompt &&
                                           r->messages[r->n_messages - 1].role == JOB_ROLE_ASSISTANT));
    REQUIRE(r->max_tokens >= 1 || job_url_pooled(r->url));
    REQUIRE(r->temperature >= 0.0f && r->temperature <= 2.0f);
    REQUIRE(r->top_p > 0.0f && r->top_p <= 1.0f);
    REQUIRE(r->top_k >= 0);
    REQUIRE(r->min_p >= 0.0f && r->min_p <= 1.0f);
    REQUIRE(r->n_stop >= 0 && r->n_stop <= JOB_MAX_STOP);
    for (int k = 0; k < r->n_stop; k++) {
        check_text(r->stop[k], r->stop_len[k]);
        REQUIRE(r->stop_len[k] > 0);
    }
    REQUIRE(r->presence_penalty >= -2.0f && r->presence_penalty <= 2.0f);
    REQUIRE(r->frequency_penalty >= -2.0f && r->frequency_penalty <= 2.0f);
    REQUIRE(r->repetition_penalty > 0.0f && r->repetition_penalty <= 2.0f);
    REQUIRE(r->n >= 1 && r->n <= JOB_MAX_N);
    REQUIRE(r->top_logprobs >= 0 && r->top_logprobs <= JOB_MAX_TOP_LOGPROBS);
    REQUIRE(!r->json_schema || (r->json_object && strlen(r->json_schema) == r->json_schema_len));
    REQUIRE(r->n_logit_bias >= 0 && r->n_logit_bias <= JOB_MAX_LOGIT_BIAS);
    REQUIRE(r->n_logit_bias == 0 || r->logit_bias);
    for (int32_t k = 0; k < r->n_logit_bias; k++) {
        REQUIRE(r->logit_bias[k].token >= 0);
        REQUIRE(r->logit_bias[k].value >= -100.0f && r->logit_bias[k].value <= 100.0f);
        for (int32_t m = 0; m < k; m++) REQUIRE(r->logit_bias[m].token != r->logit_bias[k].token);
    }
}

static void check_line(const char *s, size_t len, const struct job_request *r)
{
    REQUIRE(len >= 2 && s[len - 1] == '\n');
    REQUIRE(memchr(s, '\n', len - 1) == NULL);
    size_t n = len - 1;
    jsmn_parser p;
    jsmn_init(&p);
    int count = jsmn_parse(&p, s, n, NULL, 0);
    REQUIRE(count > 0);
    jsmntok_t *t = malloc((size_t)count * sizeof *t);
    REQUIRE(t != NULL);
    jsmn_init(&p);
    REQUIRE(jsmn_parse(&p, s, n, t, (unsigned)count) == count);
    REQUIRE(t[0].type == JSMN_OBJECT && t[0].start == 0 && (size_t)t[0].end == n);
    free(t);
    struct json_doc j;
    const char *why;
    size_t where;
    REQUIRE(json_parse(s, n, &j, &why, &where) == KVB_OK);
    REQUIRE(json_get(&j, 0, "id") >= 0);
    REQUIRE(json_get(&j, 0, "response") >= 0);
    const int cid = json_get(&j, 0, "custom_id");
    REQUIRE(cid >= 0);
    if (r->custom_id) {
        const size_t n_cid = (size_t)(j.tok[cid].end - j.tok[cid].start);
        REQUIRE(json_kind(&j, cid) == JSON_STRING && n_cid == r->custom_id_json_len &&
                memcmp(s + j.tok[cid].start, r->custom_id_json, n_cid) == 0);
    } else {
        REQUIRE(json_kind(&j, cid) == JSON_NULL);
    }
    json_free(&j);
}

/* A result as the engine would write it: the prompt text echoed as each
 * choice, cut into pseudo-tokens at arbitrary byte positions (so partial
 * UTF-8 reaches the logprobs writer). */
static void write_result(const struct job_request *r, struct kvb_buf *b)
{
    if (job_url_pooled(r->url)) { /* made-up values: each item's index, some of them negative */
        const int32_t n = r->url == JOB_URL_EMBEDDINGS ? r->n_prompts : r->n_docs, dim = 3;
        float vals[JOB_MAX_INPUTS * 3];
        for (int32_t i = 0; i < n * dim; i++) vals[i] = (float)(i % 7) - 2.5f;
        struct job_pool_result res = {.custom_id = r->custom_id,
                                      .custom_id_len = r->custom_id_len,
                                      .custom_id_json = r->custom_id_json,
                                      .custom_id_json_len = r->custom_id_json_len,
                                      .url = r->url,
                                      .model = r->model ? r->model : "fuzz",
                                      .created = 1,
                                      .values = vals,
                                      .n_items = n,
                                      .dim = dim,
                                      .base64 = r->base64,
                                      .docs = r->docs,
                                      .top_n = r->top_n,
                                      .prompt_tokens = 5};
        REQUIRE(job_format_pooled(b, &res) == KVB_OK);
        return;
    }
    const char *text = r->prompt ? r->prompt : r->messages ? r->messages[r->n_messages - 1].content : "ids";
    size_t len = r->prompt ? r->prompt_len : r->messages ? r->messages[r->n_messages - 1].content_len : 3;
    size_t ntok = len < 64 ? len : 64;
    struct job_token_logprob lp[64];
    struct job_top_logprob top[64][2];
    for (size_t k = 0; k < ntok; k++) {
        size_t start = k * len / ntok, end = (k + 1) * len / ntok;
        lp[k] = (struct job_token_logprob){
            .token = text + start, .token_len = end - start, .logprob = -(float)k / 3.0f, .top = top[k], .n_top = 2};
        top[k][0] = (struct job_top_logprob){text + start, end - start, lp[k].logprob};
        top[k][1] = (struct job_top_logprob){text, end - start, -1e30f};
    }
    struct job_choice ch[JOB_MAX_N];
    for (int c = 0; c < r->n; c++)
        ch[c] = (struct job_choice){.text = text,
                                    .text_len = len,
                                    .finish = c & 1 ? JOB_FINISH_LENGTH : JOB_FINISH_STOP,
                                    .has_logprobs = r->logprobs,
                                    .logprobs = lp,
                                    .n_logprobs = ntok};
    struct job_result res = {.custom_id = r->custom_id,
                             .custom_id_len = r->custom_id_len,
                             .custom_id_json = r->custom_id_json,
                             .custom_id_json_len = r->custom_id_json_len,
                             .url = r->url,
                             .model = r->model ? r->model : "fuzz",
                             .created = 1,
                             .choices = ch,
                             .n_choices = (size_t)r->n,
                             .prompt_tokens = (int64_t)len,
                             .completion_tokens = 1};
    REQUIRE(job_format_result(b, &res) == KVB_OK);
}

static void one_line(const char *data, size_t size, uint64_t line_no)
{
    struct job_request r;
    struct job_error e;
    enum kvb_status st = job_parse_line(data, size, line_no, &r, &e);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
    struct kvb_buf b = {0}, b2 = {0};
    if (st == KVB_OK) {
        check_request(&r);
        write_result(&r, &b);
        write_result(&r, &b2);
    } else {
        char want[32];
        snprintf(want, sizeof want, "line %llu: ", (unsigned long long)line_no);
        REQUIRE(strncmp(e.message, want, strlen(want)) == 0);
        REQUIRE(e.code != NULL);
        if (r.custom_id) check_custom_id(&r);
        REQUIRE(job_format_error_json(&b, r.custom_id, r.custom_id_len, r.custom_id_json, r.custom_id_json_len, &e) ==
                KVB_OK);
        REQUIRE(job_format_error_json(&b2, r.custom_id, r.custom_id_len, r.custom_id_json, r.custom_id_json_len, &e) ==
                KVB_OK);
    }
    check_line(b.data, b.len, &r);
    REQUIRE(b.len == b2.len && memcmp(b.data, b2.data, b.len) == 0);
    kvb_buf_free(&b);
    kvb_buf_free(&b2);
    job_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one_line((const char *)data, size, 1);

    if (size == 0) return 0;
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f) return 0;
    struct job_reader *rd;
    if (job_reader_create(f, 1 + size / 2, &rd, NULL) == KVB_OK) {
        struct job_line l;
        bool got;
        uint64_t total = 0;
        while (job_reader_next(rd, &l, &got, NULL) == KVB_OK && got) {
            REQUIRE(l.len <= l.full_len && l.offset == total);
            total += l.full_len + l.terminated;
            if (!l.too_long && !job_line_is_blank(l.data, l.len)) one_line(l.data, l.len, l.line_no + 1);
        }
        REQUIRE(total == size);
        job_reader_free(rd);
    }
    fclose(f);
    return 0;
}
