/* fuzz_schema.c — libFuzzer target for the JSON Schema compiler
 * (grammar_schema.h): response_format's json_schema, structured_outputs.json
 * and guided_json, turned into GBNF, then compiled by the grammar engine.
 *
 * Input: the schema's text (any bytes: the compiler must refuse what is not
 * a JSON object it holds).
 * Properties checked (a violation traps, so the replay test fails too):
 *   - the compiler returns KVB_OK, or KVB_ERR_FORMAT with a message and the
 *     field it is about, and on a refusal leaves the output buffer as it
 *     was; no crash, leak or undefined behaviour (ASan, UBSan), no recursion
 *     the input can deepen past the compiler's nesting limits;
 *   - compiling the same schema twice writes the same GBNF;
 *   - the GBNF it writes is accepted by grammar_compile, unless that names
 *     one of its size limits, and a matcher can start on it;
 *   - the grammar never accepts the empty output, nor a top value that is
 *     not an object (the first byte of a sentence is '{' or whitespace).
 * This file is test code, so it may stop the process when a property fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "engine/grammar.h"
#include "engine/grammar_schema.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_schema: %s:%d: %s\n", __FILE__, __LINE__, #c);                                       \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

static bool is_limit(const char *msg)
{
    return strstr(msg, "elements") || strstr(msg, "nest") || strstr(msg, "alternatives are open");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    struct kvb_buf a = {0}, b = {0};
    REQUIRE(kvb_buf_reserve(&a, 8) == KVB_OK);
    memcpy(a.data, "keep", 5);
    a.len = 4;
    char path[256] = "", msg[400] = "";
    const enum kvb_status st = gschema_to_gbnf(s, size, "schema", &a, path, sizeof path, msg, sizeof msg);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
    if (st != KVB_OK) {
        REQUIRE(msg[0] != 0 && path[0] != 0);
        REQUIRE(a.len == 4 && memcmp(a.data, "keep", 4) == 0);
        kvb_buf_free(&a);
        return 0;
    }
    REQUIRE(gschema_to_gbnf(s, size, "schema", &b, path, sizeof path, msg, sizeof msg) == KVB_OK);
    REQUIRE(a.len == b.len + 4 && memcmp(a.data + 4, b.data, b.len) == 0);
    struct grammar *g = NULL;
    char cmsg[300] = "";
    const enum kvb_status cst = grammar_compile(b.data, b.len, &g, cmsg, sizeof cmsg);
    if (cst != KVB_OK) fprintf(stderr, "fuzz_schema: grammar_compile: %s\n", cmsg);
    REQUIRE(cst == KVB_OK || (cst == KVB_ERR_FORMAT && is_limit(cmsg)));
    if (g) {
        struct grammar_matcher *m = NULL;
        REQUIRE(grammar_matcher_create(g, NULL, &m) == KVB_OK);
        REQUIRE(!grammar_matcher_complete(m)); /* never the empty output */
        for (int c = 0; c < 256; c++) {
            const char ch = (char)c;
            if (c == '{' || c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
            REQUIRE(!grammar_matcher_feed(m, &ch, 1)); /* the top value is an object */
        }
        grammar_matcher_free(m);
    }
    grammar_free(g);
    kvb_buf_free(&a);
    kvb_buf_free(&b);
    return 0;
}
