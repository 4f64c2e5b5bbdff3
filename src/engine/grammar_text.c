/* grammar_text.c — GBNF written by kvbatch itself: literals, and vLLM's
 * choice constraint as an alternation of them. (JSON Schema and regex are
 * grammar_schema.c's and grammar_regex.c's.) */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "engine/grammar.h"

enum kvb_status grammar_put_literal(struct kvb_buf *out, const char *s, size_t n)
{
    KVB_FORWARD_IF_ERROR(kvb_buf_reserve(out, 4 * n + 3));
    char *d = out->data + out->len;
    *d++ = '"';
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *d++ = '\\';
            *d++ = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            static const char hex[] = "0123456789abcdef";
            *d++ = '\\';
            *d++ = 'x';
            *d++ = hex[c >> 4];
            *d++ = hex[c & 15];
        } else {
            *d++ = (char)c; /* UTF-8 as it is: GBNF reads code points */
        }
    }
    *d++ = '"';
    *d = 0;
    out->len = (size_t)(d - out->data);
    return KVB_OK;
}

enum kvb_status grammar_choice_gbnf(const char *json_array, size_t len, struct kvb_buf *out, char *msg, size_t cap)
{
    struct json_doc j;
    const char *why = NULL;
    size_t where = 0;
    enum kvb_status st = json_parse(json_array, len, &j, &why, &where);
    if (st != KVB_OK) {
        snprintf(msg, cap, "choice: not JSON (%s)", why ? why : kvb_strerror(st));
        return st == KVB_ERR_NOMEM ? st : KVB_ERR_FORMAT;
    }
    if (json_kind(&j, 0) != JSON_ARRAY || j.tok[0].size == 0) {
        json_free(&j);
        snprintf(msg, cap, "choice must be a non-empty array of strings");
        return KVB_ERR_FORMAT;
    }
    if (j.tok[0].size > GRAMMAR_MAX_CHOICES) {
        /* each string is a stack the recogniser holds at the start */
        snprintf(msg, cap, "%d choices; at most %d are allowed", j.tok[0].size, GRAMMAR_MAX_CHOICES);
        json_free(&j);
        return KVB_ERR_FORMAT;
    }
    const size_t len0 = out->len;
    st = kvb_buf_reserve(out, 16);
    if (st == KVB_OK) {
        memcpy(out->data + out->len, "root ::= ", 10);
        out->len += 9;
    }
    int k = 1;
    for (int m = 0; m < j.tok[0].size && st == KVB_OK; m++, k = json_skip(&j, k)) {
        if (json_kind(&j, k) != JSON_STRING) {
            snprintf(msg, cap, "choice %d is not a string", m);
            st = KVB_ERR_FORMAT;
            break;
        }
        char *s = NULL;
        size_t n = 0;
        st = json_str_dup(&j, k, &s, &n);
        if (st == KVB_OK && m > 0) st = kvb_buf_reserve(out, 4);
        if (st == KVB_OK && m > 0) {
            memcpy(out->data + out->len, " | ", 4);
            out->len += 3;
        }
        if (st == KVB_OK) st = grammar_put_literal(out, s, n);
        kvb_free(s);
    }
    if (st == KVB_OK) st = kvb_buf_reserve(out, 2);
    if (st == KVB_OK) {
        out->data[out->len++] = '\n';
        out->data[out->len] = 0;
    } else {
        out->len = len0;
    }
    json_free(&j);
    return st;
}
