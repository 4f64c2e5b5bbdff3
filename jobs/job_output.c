/* job_output.c — result and error lines in the OpenAI Batch output format,
 * and the deterministic keys that name them.
 *
 * Every line is one JSON object ending in "\n", valid whatever bytes the
 * model produced: strings are escaped here and invalid UTF-8 becomes U+FFFD.
 * Keys are hashes (XXH3-128) of the custom_id, or of the line number for
 * lines without a usable one, so a rerun writes the same ids and resume can
 * recognise what is done. Field order follows what OpenAI writes, which
 * makes diffs against OpenAI or vLLM output easy to read. */
#include "jobs/job.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "base/json.h"
#include "base/unicode.h"

/* ---- keys -------------------------------------------------------------------------- */

/* Separate seeds keep the two key spaces apart: no custom_id can hash to the
 * key of a line number. The values are arbitrary but fixed forever, since
 * output files written earlier are resumed by them. */
#define KEY_SEED_CUSTOM_ID 0x6b7662617463682dULL /* "kvbatch-" */
#define KEY_SEED_LINE 0x6b766261746c696eULL      /* "kvbatlin" */

static void key_hex(XXH128_hash_t h, struct job_key *out)
{
    static const char digits[] = "0123456789abcdef";
    uint64_t parts[2] = {h.high64, h.low64};
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 16; k++) out->hex[p * 16 + k] = digits[(parts[p] >> (60 - 4 * k)) & 15];
    out->hex[JOB_KEY_LEN] = '\0';
}

void job_key_custom_id(const char *custom_id, size_t len, struct job_key *out)
{
    key_hex(XXH3_128bits_withSeed(custom_id, len, KEY_SEED_CUSTOM_ID), out);
}

void job_key_line(uint64_t line_no, struct job_key *out)
{
    unsigned char b[8];
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)(line_no >> (8 * k)); /* fixed byte order */
    key_hex(XXH3_128bits_withSeed(b, sizeof b, KEY_SEED_LINE), out);
}

void job_key_error(const char *custom_id, size_t len, const struct job_error *e, struct job_key *out)
{
    if (!custom_id || e->by_line || (e->code && strcmp(e->code, JOB_ERR_DUPLICATE_CUSTOM_ID) == 0))
        job_key_line(e->line_no, out);
    else job_key_custom_id(custom_id, len, out);
}

/* ---- writer ------------------------------------------------------------------------ */

/* A writer over a kvb_buf that remembers the first allocation failure, so
 * the formatters read as straight-line code and check once at the end. */
struct w {
    struct kvb_buf *b;
    size_t start;
    bool oom;
};

static bool reserve(struct w *w, size_t extra)
{
    if (!w->oom && kvb_buf_reserve(w->b, extra) != KVB_OK) w->oom = true;
    return !w->oom;
}

static void put(struct w *w, const char *s, size_t n)
{
    if (!reserve(w, n)) return;
    memcpy(w->b->data + w->b->len, s, n);
    w->b->len += n;
}

static void puts_(struct w *w, const char *s) { put(w, s, strlen(s)); }

static void put_i64(struct w *w, int64_t v)
{
    char t[24];
    int n = snprintf(t, sizeof t, "%lld", (long long)v);
    put(w, t, (size_t)n);
}

/* Logprobs as OpenAI writes them: JSON has no -inf, so anything at or below
 * -9999 (and NaN) is -9999.0. %.9g round-trips a float. */
static void put_logprob(struct w *w, float lp)
{
    double v = lp;
    if (!(v > -9999.0)) v = -9999.0;
    char t[40];
    int n = snprintf(t, sizeof t, "%.9g", v);
    for (int k = 0; k < n; k++)
        if (t[k] == ',') t[k] = '.'; /* in case a caller changed LC_NUMERIC after all */
    put(w, t, (size_t)n);
}

static void put_str(struct w *w, const char *s, size_t n)
{
    if (!w->oom && json_put_string(w->b, s, n) != KVB_OK) w->oom = true;
}

/* A custom_id: as written in the input (json, the text between its quotes,
 * already valid JSON string text) when the caller has it, else escaped. */
static void put_custom_id(struct w *w, const char *id, size_t len, const char *json, size_t json_len)
{
    if (json) {
        put(w, "\"", 1);
        put(w, json, json_len);
        put(w, "\"", 1);
    } else if (id) {
        put_str(w, id, len);
    } else {
        puts_(w, "null");
    }
}

static void put_cstr_or_null(struct w *w, const char *s)
{
    if (s) put_str(w, s, strlen(s));
    else puts_(w, "null");
}

static enum kvb_status finish(struct w *w)
{
    if (w->oom) {
        w->b->len = w->start;
        return KVB_ERR_NOMEM;
    }
    return KVB_OK;
}

/* ---- logprobs ------------------------------------------------------------------------ */

static void put_bytes(struct w *w, const char *s, size_t n)
{
    puts_(w, "[");
    for (size_t k = 0; k < n; k++) {
        if (k) puts_(w, ",");
        put_i64(w, (unsigned char)s[k]);
    }
    puts_(w, "]");
}

static void put_chat_logprobs(struct w *w, const struct job_choice *ch)
{
    puts_(w, "{\"content\":[");
    for (size_t t = 0; t < ch->n_logprobs; t++) {
        const struct job_token_logprob *lp = &ch->logprobs[t];
        if (t) puts_(w, ",");
        puts_(w, "{\"token\":");
        put_str(w, lp->token, lp->token_len);
        puts_(w, ",\"logprob\":");
        put_logprob(w, lp->logprob);
        puts_(w, ",\"bytes\":");
        put_bytes(w, lp->token, lp->token_len);
        puts_(w, ",\"top_logprobs\":[");
        for (size_t a = 0; a < lp->n_top; a++) {
            const struct job_top_logprob *tp = &lp->top[a];
            if (a) puts_(w, ",");
            puts_(w, "{\"token\":");
            put_str(w, tp->token, tp->token_len);
            puts_(w, ",\"logprob\":");
            put_logprob(w, tp->logprob);
            puts_(w, ",\"bytes\":");
            put_bytes(w, tp->token, tp->token_len);
            puts_(w, "}");
        }
        puts_(w, "]}");
    }
    puts_(w, "],\"refusal\":null}");
}

/* The legacy completions shape: parallel arrays, alternatives as a map from
 * token text to logprob, text_offset in bytes from the start of the text. */
/* A token's text in a completion's logprobs: itself when it is valid UTF-8,
 * else "bytes:\xNN..." as OpenAI writes a token that splits a character —
 * so that two such tokens stay two keys of a top_logprobs object. */
static void put_token(struct w *w, const char *s, size_t n)
{
    size_t i = 0, bad;
    while (i < n) {
        const size_t k = json_utf8_seq((const unsigned char *)s + i, n - i, &bad);
        if (!k) break;
        i += k;
    }
    if (i == n) {
        put_str(w, s, n);
        return;
    }
    static const char hexd[] = "0123456789abcdef";
    puts_(w, "\"bytes:");
    for (i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        const char e[5] = {'\\', '\\', 'x', hexd[c >> 4], hexd[c & 15]};
        put(w, e, 5);
    }
    puts_(w, "\"");
}

static void put_completion_logprobs(struct w *w, const struct job_choice *ch)
{
    puts_(w, "{\"tokens\":[");
    for (size_t t = 0; t < ch->n_logprobs; t++) {
        if (t) puts_(w, ",");
        put_token(w, ch->logprobs[t].token, ch->logprobs[t].token_len);
    }
    puts_(w, "],\"token_logprobs\":[");
    for (size_t t = 0; t < ch->n_logprobs; t++) {
        if (t) puts_(w, ",");
        if (ch->logprobs[t].none) puts_(w, "null");
        else put_logprob(w, ch->logprobs[t].logprob);
    }
    puts_(w, "],\"top_logprobs\":[");
    for (size_t t = 0; t < ch->n_logprobs; t++) {
        const struct job_token_logprob *lp = &ch->logprobs[t];
        if (t) puts_(w, ",");
        if (lp->none) {
            puts_(w, "null");
            continue;
        }
        puts_(w, "{");
        for (size_t a = 0; a < lp->n_top; a++) {
            if (a) puts_(w, ",");
            put_token(w, lp->top[a].token, lp->top[a].token_len);
            puts_(w, ":");
            put_logprob(w, lp->top[a].logprob);
        }
        puts_(w, "}");
    }
    puts_(w, "],\"text_offset\":[");
    int64_t off = ch->text_offset0;
    for (size_t t = 0; t < ch->n_logprobs; t++) {
        if (t) puts_(w, ",");
        put_i64(w, off);
        off += (int64_t)unicode_code_points(ch->logprobs[t].token, ch->logprobs[t].token_len);
    }
    puts_(w, "]}");
}

static void put_prompt_logprobs(struct w *w, const struct job_prompt_logprob *p, size_t n)
{
    puts_(w, "[");
    for (size_t t = 0; t < n; t++) {
        if (t) puts_(w, ",");
        if (!p[t].n) {
            puts_(w, "null");
            continue;
        }
        puts_(w, "{");
        for (size_t a = 0; a < p[t].n; a++) {
            const struct job_rank_logprob *e = &p[t].e[a];
            if (a) puts_(w, ",");
            puts_(w, "\"");
            put_i64(w, e->id);
            puts_(w, "\":{\"logprob\":");
            put_logprob(w, e->logprob);
            puts_(w, ",\"rank\":");
            put_i64(w, e->rank);
            puts_(w, ",\"decoded_token\":");
            put_str(w, e->token, e->token_len);
            puts_(w, "}");
        }
        puts_(w, "}");
    }
    puts_(w, "]");
}

/* ---- lines ---------------------------------------------------------------------------- */

enum kvb_status job_format_result(struct kvb_buf *out, const struct job_result *r)
{
    struct w w = {.b = out, .start = out->len};
    struct job_key key;
    job_key_custom_id(r->custom_id, r->custom_id_len, &key);
    bool chat = r->url == JOB_URL_CHAT;

    puts_(&w, "{\"id\":\"batch_req_");
    puts_(&w, key.hex);
    puts_(&w, "\",\"custom_id\":");
    put_custom_id(&w, r->custom_id, r->custom_id_len, r->custom_id_json, r->custom_id_json_len);
    puts_(&w, ",\"response\":{\"status_code\":200,\"request_id\":\"req_");
    puts_(&w, key.hex);
    puts_(&w, chat ? "\",\"body\":{\"id\":\"chatcmpl-" : "\",\"body\":{\"id\":\"cmpl-");
    puts_(&w, key.hex);
    puts_(&w,
          chat ? "\",\"object\":\"chat.completion\",\"created\":" : "\",\"object\":\"text_completion\",\"created\":");
    put_i64(&w, r->created);
    puts_(&w, ",\"model\":");
    put_cstr_or_null(&w, r->model);
    puts_(&w, ",\"choices\":[");
    for (size_t c = 0; c < r->n_choices; c++) {
        const struct job_choice *ch = &r->choices[c];
        if (c) puts_(&w, ",");
        puts_(&w, "{\"index\":");
        put_i64(&w, (int64_t)c);
        if (chat) {
            puts_(&w, ",\"message\":{\"role\":\"assistant\",\"content\":");
            put_str(&w, ch->text, ch->text_len);
            puts_(&w, "}");
        } else {
            puts_(&w, ",\"text\":");
            put_str(&w, ch->text, ch->text_len);
        }
        puts_(&w, ",\"logprobs\":");
        if (!ch->has_logprobs) puts_(&w, "null");
        else if (chat) put_chat_logprobs(&w, ch);
        else put_completion_logprobs(&w, ch);
        puts_(&w, ",\"finish_reason\":");
        puts_(&w, ch->finish == JOB_FINISH_LENGTH ? "\"length\"" : "\"stop\"");
        if (!chat && ch->prompt_logprobs) {
            puts_(&w, ",\"prompt_logprobs\":");
            put_prompt_logprobs(&w, ch->prompt_logprobs, ch->n_prompt_logprobs);
        }
        puts_(&w, "}");
    }
    puts_(&w, "],\"usage\":{\"prompt_tokens\":");
    put_i64(&w, r->prompt_tokens);
    puts_(&w, ",\"completion_tokens\":");
    put_i64(&w, r->completion_tokens);
    puts_(&w, ",\"total_tokens\":");
    put_i64(&w, r->prompt_tokens + r->completion_tokens);
    puts_(&w, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    put_i64(&w, r->cached_tokens);
    puts_(&w, "}},\"system_fingerprint\":");
    put_cstr_or_null(&w, r->system_fingerprint);
    if (chat && r->prompt_logprobs) {
        puts_(&w, ",\"prompt_logprobs\":");
        put_prompt_logprobs(&w, r->prompt_logprobs, r->n_prompt_logprobs);
    }
    puts_(&w, "}},\"error\":null}\n");
    return finish(&w);
}

enum kvb_status job_format_error(struct kvb_buf *out, const char *custom_id, size_t custom_id_len,
                                 const struct job_error *e)
{
    return job_format_error_json(out, custom_id, custom_id_len, NULL, 0, e);
}

enum kvb_status job_format_error_json(struct kvb_buf *out, const char *custom_id, size_t custom_id_len,
                                      const char *custom_id_json, size_t custom_id_json_len, const struct job_error *e)
{
    struct w w = {.b = out, .start = out->len};
    struct job_key key;
    job_key_error(custom_id, custom_id_len, e, &key);
    const char *code = e->code ? e->code : JOB_ERR_SERVER;
    bool server = strcmp(code, JOB_ERR_SERVER) == 0;

    puts_(&w, "{\"id\":\"batch_req_");
    puts_(&w, key.hex);
    puts_(&w, "\",\"custom_id\":");
    put_custom_id(&w, custom_id, custom_id_len, custom_id ? custom_id_json : NULL, custom_id_json_len);
    puts_(&w, server ? ",\"response\":{\"status_code\":500" : ",\"response\":{\"status_code\":400");
    puts_(&w, ",\"request_id\":\"req_");
    puts_(&w, key.hex);
    puts_(&w, "\",\"body\":{\"error\":{\"message\":");
    put_str(&w, e->message, strnlen(e->message, sizeof e->message));
    puts_(&w, server ? ",\"type\":\"server_error\",\"param\":" : ",\"type\":\"invalid_request_error\",\"param\":");
    if (e->param[0]) put_str(&w, e->param, strnlen(e->param, sizeof e->param));
    else puts_(&w, "null");
    puts_(&w, ",\"code\":");
    put_cstr_or_null(&w, code);
    /* OpenAI's BatchError: code, message, and the param and line at fault */
    puts_(&w, "}}},\"error\":{\"code\":");
    put_cstr_or_null(&w, code);
    puts_(&w, ",\"message\":");
    put_str(&w, e->message, strnlen(e->message, sizeof e->message));
    puts_(&w, ",\"param\":");
    if (e->param[0]) put_str(&w, e->param, strnlen(e->param, sizeof e->param));
    else puts_(&w, "null");
    puts_(&w, ",\"line\":");
    if (e->line_no) put_i64(&w, (int64_t)e->line_no);
    else puts_(&w, "null");
    puts_(&w, "}}\n");
    return finish(&w);
}

/* ---- embeddings, scores, reranking ------------------------------------------------------ */

/* A float that must be finite (the caller checked): 9 significant digits
 * give back the same float32. */
static void put_f32(struct w *w, float f)
{
    char t[40];
    int n = snprintf(t, sizeof t, "%.9g", (double)f);
    for (int k = 0; k < n; k++)
        if (t[k] == ',') t[k] = '.';
    put(w, t, (size_t)n);
}

/* Base64 (RFC 4648, padded) of the n floats' little-endian bytes, quoted. */
static void put_b64_f32(struct w *w, const float *v, int32_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t nb = (size_t)n * 4, out = (nb + 2) / 3 * 4;
    if (!reserve(w, out + 2)) return;
    char *d = w->b->data + w->b->len;
    *d++ = '"';
    uint32_t acc = 0;
    int have = 0;
    for (size_t i = 0; i < nb; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i / 4], 4);
        acc = acc << 8 | ((bits >> (8 * (i % 4))) & 0xff); /* byte i%4 of the value, lowest first */
        if (++have == 3) {
            *d++ = tab[acc >> 18 & 63];
            *d++ = tab[acc >> 12 & 63];
            *d++ = tab[acc >> 6 & 63];
            *d++ = tab[acc & 63];
            acc = 0;
            have = 0;
        }
    }
    if (have == 1) {
        acc <<= 16;
        *d++ = tab[acc >> 18 & 63];
        *d++ = tab[acc >> 12 & 63];
        *d++ = '=';
        *d++ = '=';
    } else if (have == 2) {
        acc <<= 8;
        *d++ = tab[acc >> 18 & 63];
        *d++ = tab[acc >> 12 & 63];
        *d++ = tab[acc >> 6 & 63];
        *d++ = '=';
    }
    *d++ = '"';
    w->b->len = (size_t)(d - w->b->data);
}

/* vLLM's UsageInfo for score lines; rerank's has the two counts. */
static void put_pool_usage(struct w *w, const struct job_pool_result *r)
{
    puts_(w, "\"usage\":{\"prompt_tokens\":");
    put_i64(w, r->prompt_tokens);
    puts_(w, ",\"total_tokens\":");
    put_i64(w, r->prompt_tokens);
    if (r->url == JOB_URL_SCORE) {
        puts_(w, ",\"completion_tokens\":0,\"prompt_tokens_details\":{\"cached_tokens\":");
        put_i64(w, r->cached_tokens);
        puts_(w, "}");
    }
    puts_(w, "}");
}

static void put_embeddings(struct w *w, const struct job_pool_result *r)
{
    puts_(w, "{\"object\":\"list\",\"data\":[");
    for (int32_t i = 0; i < r->n_items; i++) {
        const float *v = r->values + (int64_t)i * r->dim;
        puts_(w, i ? ",{\"object\":\"embedding\",\"index\":" : "{\"object\":\"embedding\",\"index\":");
        put_i64(w, i);
        puts_(w, ",\"embedding\":");
        if (r->base64) {
            put_b64_f32(w, v, r->dim);
        } else {
            puts_(w, "[");
            for (int32_t k = 0; k < r->dim; k++) {
                if (k) put(w, ",", 1);
                put_f32(w, v[k]);
            }
            puts_(w, "]");
        }
        puts_(w, "}");
    }
    puts_(w, "],\"model\":");
    put_cstr_or_null(w, r->model);
    puts_(w, ",\"usage\":{\"prompt_tokens\":");
    put_i64(w, r->prompt_tokens);
    puts_(w, ",\"total_tokens\":");
    put_i64(w, r->prompt_tokens);
    puts_(w, "}}");
}

static void put_scores(struct w *w, const struct job_pool_result *r, const char *key)
{
    puts_(w, "{\"id\":\"score-");
    puts_(w, key);
    puts_(w, "\",\"object\":\"list\",\"created\":");
    put_i64(w, r->created);
    puts_(w, ",\"model\":");
    put_cstr_or_null(w, r->model);
    puts_(w, ",\"data\":[");
    for (int32_t i = 0; i < r->n_items; i++) {
        puts_(w, i ? ",{\"index\":" : "{\"index\":");
        put_i64(w, i);
        puts_(w, ",\"object\":\"score\",\"score\":");
        put_f32(w, r->values[i]);
        puts_(w, "}");
    }
    puts_(w, "],");
    put_pool_usage(w, r);
    puts_(w, "}");
}

static void put_rerank(struct w *w, const struct job_pool_result *r, const char *key, const int32_t *order)
{
    puts_(w, "{\"id\":\"rerank-");
    puts_(w, key);
    puts_(w, "\",\"model\":");
    put_cstr_or_null(w, r->model);
    puts_(w, ",");
    put_pool_usage(w, r);
    puts_(w, ",\"results\":[");
    const int32_t n = r->top_n > 0 && r->top_n < r->n_items ? r->top_n : r->n_items;
    for (int32_t k = 0; k < n; k++) {
        const int32_t i = order[k];
        puts_(w, k ? ",{\"index\":" : "{\"index\":");
        put_i64(w, i);
        puts_(w, ",\"document\":{\"text\":");
        put_str(w, r->docs[i].text, r->docs[i].text_len);
        puts_(w, "},\"relevance_score\":");
        put_f32(w, r->values[i]);
        puts_(w, "}");
    }
    puts_(w, "]}");
}

enum kvb_status job_format_pooled(struct kvb_buf *out, const struct job_pool_result *r)
{
    const int64_t nv = r->url == JOB_URL_EMBEDDINGS ? (int64_t)r->n_items * r->dim : r->n_items;
    for (int64_t i = 0; i < nv; i++)
        if (!isfinite(r->values[i])) return KVB_ERR_INVALID_ARG;
    int32_t *order = NULL;
    if (r->url == JOB_URL_RERANK) { /* by decreasing score, ties by index: an insertion sort is stable */
        order = kvb_malloc(sizeof *order * (size_t)(r->n_items ? r->n_items : 1));
        if (!order) return KVB_ERR_NOMEM;
        for (int32_t i = 0; i < r->n_items; i++) {
            int32_t k = i;
            while (k > 0 && r->values[order[k - 1]] < r->values[i]) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = i;
        }
    }
    struct w w = {.b = out, .start = out->len};
    struct job_key key;
    job_key_custom_id(r->custom_id, r->custom_id_len, &key);
    puts_(&w, "{\"id\":\"batch_req_");
    puts_(&w, key.hex);
    puts_(&w, "\",\"custom_id\":");
    put_custom_id(&w, r->custom_id, r->custom_id_len, r->custom_id_json, r->custom_id_json_len);
    puts_(&w, ",\"response\":{\"status_code\":200,\"request_id\":\"req_");
    puts_(&w, key.hex);
    puts_(&w, "\",\"body\":");
    if (r->url == JOB_URL_EMBEDDINGS) put_embeddings(&w, r);
    else if (r->url == JOB_URL_SCORE) put_scores(&w, r, key.hex);
    else put_rerank(&w, r, key.hex, order);
    puts_(&w, "},\"error\":null}\n");
    kvb_free(order);
    return finish(&w);
}
