/* fuzz_regex.c — libFuzzer target for the regex compiler (grammar_regex.h):
 * the text of guided_regex / structured_outputs.regex and of a JSON Schema
 * `pattern`, turned into GBNF, then compiled by the grammar engine.
 *
 * Input: one byte of options (bit 0: JSON content mode, as a pattern; bit
 * 1: a length bound, from the next two bytes: min and max code points),
 * then the regex's bytes (any bytes: the compiler must refuse what is not
 * UTF-8).
 * Properties checked (a violation traps, so the replay test fails too):
 *   - the compiler returns KVB_OK, or KVB_ERR_FORMAT with a message, and on
 *     a refusal leaves the output buffer as it was; no crash, leak or
 *     undefined behaviour (ASan, UBSan), no recursion the input can deepen;
 *   - compiling the same regex twice writes the same GBNF (no state kept;
 *     checked for outputs up to 64 KiB, which keeps the slowest units, near
 *     the automaton limits, inside the fuzzer's timeout when instrumented);
 *   - the GBNF it writes is accepted by grammar_compile, unless that names
 *     one of its size limits, and a matcher can start on it;
 *   - with a length bound: a string of 0 code points is a sentence exactly
 *     when the bound allows it and the regex accepts "" (checked against the
 *     unbounded grammar).
 * This file is test code, so it may stop the process when a property fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "engine/grammar.h"
#include "engine/grammar_regex.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_regex: %s:%d: %s\n", __FILE__, __LINE__, #c);                                        \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

#define DETERMINISM_MAX (64u << 10) /* GBNF bytes up to which the regex is compiled twice and compared */

/* A refusal of kvbatch's own GBNF is allowed only for a size limit. */
static bool is_limit(const char *msg)
{
    return strstr(msg, "elements") || strstr(msg, "nest") || strstr(msg, "alternatives are open");
}

static enum kvb_status to_gbnf(const char *re, size_t n, int flags, bool bounded, uint32_t lo, uint32_t hi,
                               struct kvb_buf *b, char *msg, size_t cap)
{
    return bounded ? gregex_to_gbnf_len(re, n, flags, lo, hi, "root", b, msg, cap)
                   : gregex_to_gbnf(re, n, flags, "root", b, msg, cap);
}

/* The compiled grammar of b (NULL when refused for a limit). */
static struct grammar *compile(const struct kvb_buf *b)
{
    struct grammar *g = NULL;
    char msg[300] = "";
    const enum kvb_status st = grammar_compile(b->data, b->len, &g, msg, sizeof msg);
    if (st != KVB_OK) fprintf(stderr, "fuzz_regex: grammar_compile: %s\n", msg);
    REQUIRE(st == KVB_OK || (st == KVB_ERR_FORMAT && is_limit(msg)));
    if (g) {
        struct grammar_matcher *m = NULL;
        REQUIRE(grammar_matcher_create(g, NULL, &m) == KVB_OK);
        grammar_matcher_free(m);
    }
    return g;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int flags = data[0] & 1 ? GREGEX_JSON_CONTENT : GREGEX_WHOLE;
    const bool bounded = data[0] & 2;
    size_t off = 1;
    uint32_t lo = 0, hi = GREGEX_NO_MAX;
    if (bounded) {
        if (size < 3) return 0;
        lo = data[1] % 64;
        hi = data[2] == 255 ? GREGEX_NO_MAX : data[2] % 64;
        off = 3;
    }
    const char *re = (const char *)data + off;
    const size_t n = size - off;

    struct kvb_buf a = {0}, b = {0};
    REQUIRE(kvb_buf_reserve(&a, 8) == KVB_OK);
    memcpy(a.data, "keep", 5);
    a.len = 4;
    char msg[300] = "";
    const enum kvb_status st = to_gbnf(re, n, flags, bounded, lo, hi, &a, msg, sizeof msg);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
    if (st != KVB_OK) {
        REQUIRE(msg[0] != 0);
        REQUIRE(a.len == 4 && memcmp(a.data, "keep", 4) == 0); /* the length is put back */
        kvb_buf_free(&a);
        return 0;
    }
    if (a.len - 4 <= DETERMINISM_MAX) { /* the second compile doubles a slow unit's time: small outputs only */
        REQUIRE(to_gbnf(re, n, flags, bounded, lo, hi, &b, msg, sizeof msg) == KVB_OK);
        REQUIRE(a.len == b.len + 4 && memcmp(a.data + 4, b.data, b.len) == 0);
    } else {
        REQUIRE(kvb_buf_reserve(&b, a.len - 4 + 1) == KVB_OK);
        memcpy(b.data, a.data + 4, a.len - 4 + 1);
        b.len = a.len - 4;
    }
    struct grammar *g = compile(&b);
    if (g && bounded && flags == GREGEX_WHOLE) {
        struct kvb_buf u = {0};
        char umsg[300] = "";
        if (to_gbnf(re, n, flags, false, 0, 0, &u, umsg, sizeof umsg) == KVB_OK) {
            struct grammar *ug = compile(&u);
            if (ug) {
                const bool empty_ok = grammar_check(ug, "", 0) == GRAMMAR_FULL;
                REQUIRE((grammar_check(g, "", 0) == GRAMMAR_FULL) == (empty_ok && lo == 0));
            }
            grammar_free(ug);
        }
        kvb_buf_free(&u);
    }
    grammar_free(g);
    kvb_buf_free(&a);
    kvb_buf_free(&b);
    return 0;
}
