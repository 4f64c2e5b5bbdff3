/* fuzz_grammar.c — libFuzzer target for the GBNF compiler and recogniser.
 *
 * Input: GBNF text, then optionally a NUL byte and a string to match.
 * Properties checked (a violation traps, so the replay test fails too):
 *   - grammar_compile returns KVB_OK or KVB_ERR_FORMAT with a message (no
 *     crash, no leak, no endless loop: left recursion is refused);
 *   - on a compiled grammar, feeding the string byte by byte and all at
 *     once agree, a refused byte leaves the matcher where it was, and
 *     grammar_check agrees with the matcher;
 *   - the same with a cache small enough to be flushed on every call.
 * This file is test code, so it may stop the process when a property fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_grammar: %s:%d: %s\n", __FILE__, __LINE__, #c);                                      \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

static enum grammar_match walk(const struct grammar *g, const char *s, size_t n, size_t cache)
{
    struct grammar_matcher *m = NULL;
    REQUIRE(grammar_matcher_create(g, NULL, &m) == KVB_OK);
    if (cache) grammar_matcher_set_cache_bytes(m, cache);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        const bool was = grammar_matcher_complete(m);
        ok = grammar_matcher_feed(m, s + i, 1);
        if (!ok) REQUIRE(grammar_matcher_complete(m) == was); /* unchanged */
    }
    enum grammar_match r = !ok ? GRAMMAR_NONE : grammar_matcher_complete(m) ? GRAMMAR_FULL : GRAMMAR_PREFIX;
    grammar_matcher_free(m);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    const size_t glen = nul ? (size_t)(nul - text) : size;
    const char *s = nul ? nul + 1 : "";
    const size_t n = nul ? size - glen - 1 : 0;
    struct grammar *g = NULL;
    char msg[256] = "";
    enum kvb_status st = grammar_compile(text, glen, &g, msg, sizeof msg);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT);
    REQUIRE(st == KVB_OK ? g != NULL : (g == NULL && msg[0]));
    if (!g) return 0;
    const enum grammar_match whole = grammar_check(g, s, n);
    REQUIRE(walk(g, s, n, 0) == whole);
    REQUIRE(walk(g, s, n, 1) == whole);
    grammar_free(g);
    return 0;
}
