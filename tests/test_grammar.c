/* test_grammar.c — the GBNF engine (engine/grammar.h).
 *
 * The compiler's refusals, each naming what is wrong; sentences and
 * non-sentences of small grammars and of llama.cpp's grammars/ files
 * (tests/data/gbnf); then, with the default model's tokenizer, random walks
 * through those grammars where at every state the mask (the trie walk,
 * cached per state) is compared with a per-token check of the whole
 * vocabulary (grammar_allows on a matcher that never built a mask) and, for
 * a sample of tokens, with a fresh matcher fed the whole text; the same
 * again with a cache small enough to be flushed every few steps.
 *
 * `test_grammar --check FILE`: reads lines of hex-encoded bytes on stdin and
 * prints FULL, PREFIX or NONE for each, for tests/pytest_grammar.py to hold
 * against its independent checker (tests/gbnf_check.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/rng.h"
#include "engine/grammar.h"
#include "support/testutil.h"
#include "text/tok.h"

static struct grammar *compile(const char *text)
{
    struct grammar *g = NULL;
    char msg[256];
    enum kvb_status st = grammar_compile(text, strlen(text), &g, msg, sizeof msg);
    CHECK_MSG(st == KVB_OK, "compile [%s]: %s", text, msg);
    return g;
}

static void test_refusals(void)
{
    static const struct {
        const char *gbnf, *want;
    } cases[] = {
        {"", "no rule named root"},
        {"roo ::= \"a\"", "no rule named root"},
        {"root ::= a", "rule 'a' is used but never defined"},
        {"root ::= \"a\"\nroot ::= \"b\"", "rule 'root' is defined twice"},
        {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
        {"root ::= e\ne ::= t | e \"+\" t\nt ::= [0-9]", "rule 'e' is left-recursive"},
        {"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "rule 'a' is left-recursive"},
        {"root ::= <think> \"a\"", "token terminals"},
        {"root ::= \"\\q\"", "line 1 column 11: unknown escape"},
        {"root ::= \"a\"{3000}", "repetition count over 2000"},
        {"root ::= \"a\"{3,2}", "n below m"},
        {"root ::= \"abc", "unexpected end"},
        {"root ::= [a-", "unexpected end"},
        {"root ::= [z-a]", "end before its start"},
        {"root ::= \"a\" )", "expecting a newline"},
        {"root ::= (\"a\"", "expecting ')'"},
        {"root ::= * \"a\"", "expecting an item"},
        {"root \"a\"", "expecting ::="},
        {"root ::= \"\\xZZ\"", "expecting 2 hex digits"},
        {"root ::= [\\uD800-\\uDFFF]", "matches nothing"},
        {"root ::= \"\xff\"", "not UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = NULL;
        char msg[256] = "";
        enum kvb_status st = grammar_compile(cases[i].gbnf, strlen(cases[i].gbnf), &g, msg, sizeof msg);
        CHECK_MSG(st == KVB_ERR_FORMAT && !g, "[%s] compiled (%d)", cases[i].gbnf, (int)st);
        CHECK_MSG(strstr(msg, cases[i].want), "[%s]: message [%s] lacks [%s]", cases[i].gbnf, msg, cases[i].want);
        grammar_free(g);
    }
    printf("refusals: %zu grammars refused by name\n", sizeof cases / sizeof cases[0]);
}

static const char *match_name(enum grammar_match m)
{
    return m == GRAMMAR_FULL ? "FULL" : m == GRAMMAR_PREFIX ? "PREFIX" : "NONE";
}

static void test_matches(void)
{
    static const struct {
        const char *gbnf, *text;
        enum grammar_match want;
    } cases[] = {
        {"root ::= \"abc\"", "abc", GRAMMAR_FULL},
        {"root ::= \"abc\"", "ab", GRAMMAR_PREFIX},
        {"root ::= \"abc\"", "", GRAMMAR_PREFIX},
        {"root ::= \"abc\"", "abd", GRAMMAR_NONE},
        {"root ::= \"abc\"", "abcd", GRAMMAR_NONE},
        {"root ::= \"a\" | \"b\" | \"\"", "", GRAMMAR_FULL},
        {"root ::= [a-c]+", "abcabc", GRAMMAR_FULL},
        {"root ::= [a-c]+", "abd", GRAMMAR_NONE},
        {"root ::= [^a-c]", "d", GRAMMAR_FULL},
        {"root ::= [^a-c]", "a", GRAMMAR_NONE},
        {"root ::= [^a-c]", "\xc3\xa9", GRAMMAR_FULL},
        {"root ::= [^a-c]", "\xc3", GRAMMAR_PREFIX},
        {"root ::= [^a-c]", "\xed\xa0\x80", GRAMMAR_NONE}, /* a surrogate */
        {"root ::= [^a-c]", "\xc0\x80", GRAMMAR_NONE},     /* overlong */
        {"root ::= .", "\xf0\x9f\x98\x80", GRAMMAR_FULL},
        {"root ::= .", "\xf4\x90\x80\x80", GRAMMAR_NONE}, /* over U+10FFFF */
        {"root ::= . .", "\n\x7f", GRAMMAR_FULL},
        {"root ::= [ぁ-ゟ]+", "ひらがな", GRAMMAR_FULL},
        {"root ::= [ぁ-ゟ]+", "カ", GRAMMAR_NONE},
        {"root ::= \"\\u00e9\\U0001F600\\x41\"",
         "\xc3\xa9\xf0\x9f\x98\x80"
         "A",
         GRAMMAR_FULL},
        {"root ::= [\\x00-\\x1f\\\\\\]\\-]*", "\\]-\x01", GRAMMAR_FULL},
        {"root ::= \"a\"{2,3}", "a", GRAMMAR_PREFIX},
        {"root ::= \"a\"{2,3}", "aa", GRAMMAR_FULL},
        {"root ::= \"a\"{2,3}", "aaa", GRAMMAR_FULL},
        {"root ::= \"a\"{2,3}", "aaaa", GRAMMAR_NONE},
        {"root ::= \"ab\"{2}", "abab", GRAMMAR_FULL},
        {"root ::= \"ab\"{2}", "abb", GRAMMAR_NONE},
        {"root ::= \"a\"{2,}", "aaaaaaa", GRAMMAR_FULL},
        {"root ::= \"a\"{0}", "", GRAMMAR_FULL},
        {"root ::= (\"x\" | \"y\")? \"z\"", "z", GRAMMAR_FULL},
        {"root ::= (\"x\" | \"y\")? \"z\"", "yz", GRAMMAR_FULL},
        {"root ::= (\"x\" | \"y\")? \"z\"", "xyz", GRAMMAR_NONE},
        {"root ::= a*\na ::= \"\" | \"q\"", "qqq", GRAMMAR_FULL}, /* a loop through nothing ends */
        {"root ::= (\"a\"*)*", "aaa", GRAMMAR_FULL},
        {"root ::= \"(\" root \")\" | \"\"", "((()))", GRAMMAR_FULL},
        {"root ::= \"(\" root \")\" | \"\"", "(()", GRAMMAR_PREFIX},
        {"root ::= \"(\" root \")\" | \"\"", "())", GRAMMAR_NONE},
        {"root ::= x # comment\n\n# more\nx ::=\n  \"a\" |\n  \"b\"\n", "b", GRAMMAR_FULL},
        {"root ::= (\n \"a\"\n \"b\" )", "ab", GRAMMAR_FULL},
        {"root ::= \"a\" \"b\"\r\n", "ab", GRAMMAR_FULL},
        {"root ::= [a-z-]+", "a-b", GRAMMAR_FULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = compile(cases[i].gbnf);
        if (!g) continue;
        enum grammar_match got = grammar_check(g, cases[i].text, strlen(cases[i].text));
        CHECK_MSG(got == cases[i].want, "[%s] on [%s]: %s, want %s", cases[i].gbnf, cases[i].text, match_name(got),
                  match_name(cases[i].want));
        grammar_free(g);
    }
    printf("matches: %zu texts\n", sizeof cases / sizeof cases[0]);
}

static char *source_file(const char *rel, size_t *len)
{
    const char *dir = tu_env("KVB_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ".", rel);
    return tu_read_file(path, len);
}

static struct grammar *compile_file(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/gbnf/%s", name);
    size_t len = 0;
    char *text = source_file(rel, &len);
    CHECK_MSG(text, "cannot read %s", rel);
    if (!text) return NULL;
    struct grammar *g = NULL;
    char msg[256];
    CHECK_MSG(grammar_compile(text, len, &g, msg, sizeof msg) == KVB_OK, "%s: %s", name, msg);
    kvb_free(text);
    return g;
}

static void test_files(void)
{
    static const struct {
        const char *file, *text;
        enum grammar_match want;
    } cases[] = {
        {"json.gbnf", "{\"a\": [1, 2.5e3, true, null, {\"b\": \"\\u00e9x\"}]}", GRAMMAR_FULL},
        {"json.gbnf", "{\"a\": 01}", GRAMMAR_NONE},
        {"json.gbnf", "{\"a\":\n  [", GRAMMAR_PREFIX},
        {"json.gbnf", "[1]", GRAMMAR_NONE},
        {"json_arr.gbnf", "[\n{\"a\": 1},\n{}]", GRAMMAR_FULL},
        {"arithmetic.gbnf", "x*2=(1+y)\n", GRAMMAR_FULL},
        {"arithmetic.gbnf", "x=1+\n", GRAMMAR_NONE},
        {"list.gbnf", "- one\n- two\n", GRAMMAR_FULL},
        {"list.gbnf", "- one\r\n", GRAMMAR_NONE},
        {"chess.gbnf", "1. e4 e5\n2. Nf3 Nc6\n", GRAMMAR_FULL},
        {"chess.gbnf", "1. e4 e9", GRAMMAR_NONE},
        {"japanese.gbnf", "ひらがな カタカナ", GRAMMAR_FULL},
        {"english.gbnf", "Hello world.", GRAMMAR_FULL},
        {"c.gbnf", "int main(int argc){return 0;}", GRAMMAR_FULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = compile_file(cases[i].file);
        if (!g) continue;
        enum grammar_match got = grammar_check(g, cases[i].text, strlen(cases[i].text));
        CHECK_MSG(got == cases[i].want, "%s on [%s]: %s, want %s", cases[i].file, cases[i].text, match_name(got),
                  match_name(cases[i].want));
        grammar_free(g);
    }
    printf("llama.cpp grammars: %zu texts\n", sizeof cases / sizeof cases[0]);
}

/* ---- masks against per-token checks, on the real vocabulary -------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* One walk of steps tokens; returns the states checked. */
static int walk(const struct grammar *g, const struct grammar_vocab *v, const struct tok *t, int steps,
                size_t cache_cap)
{
    const int32_t n = grammar_vocab_size(v);
    struct grammar_matcher *a = NULL;
    CHECK(grammar_matcher_create(g, v, &a) == KVB_OK);
    if (!a) return 0;
    if (cache_cap) grammar_matcher_set_cache_bytes(a, cache_cap);
    float *logits = kvb_malloc(sizeof *logits * (size_t)n);
    int32_t *allowed = kvb_malloc(sizeof *allowed * (size_t)n);
    char text[4096];
    size_t n_text = 0;
    int checked = 0;
    for (int step = 0; step < steps; step++) {
        for (int32_t i = 0; i < n; i++) logits[i] = 0.0f;
        const int32_t count = grammar_mask(a, logits);
        /* c: the same text, never masked, so allows walks the bytes. */
        struct grammar_matcher *c = NULL;
        CHECK(grammar_matcher_create(g, v, &c) == KVB_OK);
        if (!c) break;
        CHECK(grammar_matcher_feed(c, text, n_text));
        int32_t n_allowed = 0, diffs = 0;
        for (int32_t i = 0; i < n; i++) {
            const bool m = logits[i] > -INFINITY, b = grammar_allows(c, i);
            if (m != b && diffs++ < 3) {
                char piece[64];
                size_t len = tok_piece(t, i, false, piece, sizeof piece - 1);
                piece[len] = 0;
                CHECK_MSG(false, "after [%.*s]: token %d [%s] mask %d, per-token check %d", (int)n_text, text, i, piece,
                          m, b);
            }
            if (m) allowed[n_allowed++] = i;
        }
        CHECK_EQ_INT(count, n_allowed);
        CHECK_MSG(grammar_allows(a, grammar_vocab_eog(v)) == grammar_matcher_complete(c),
                  "after [%.*s]: end of generation allowed %d, complete %d", (int)n_text, text,
                  grammar_allows(a, grammar_vocab_eog(v)), grammar_matcher_complete(c));
        /* A sample against fresh matchers fed the whole text. */
        for (int k = 0; k < 64; k++) {
            const int32_t i = (int32_t)rnd((uint32_t)n);
            char piece[256];
            const size_t len = tok_is_eog(t, i) ? 0 : tok_piece(t, i, false, piece, sizeof piece);
            if (len == 0 || n_text + len > sizeof text) continue;
            memcpy(text + n_text, piece, len);
            const bool fresh = grammar_check(g, text, n_text + len) != GRAMMAR_NONE;
            CHECK_MSG(fresh == (logits[i] > -INFINITY), "after [%.*s]: token %d fresh %d mask %d", (int)n_text, text, i,
                      fresh, logits[i] > -INFINITY);
        }
        grammar_matcher_free(c);
        checked++;
        /* Next: often a one-byte token (structure), else any allowed one. */
        int32_t pick = -1;
        for (int tries = 0; tries < 40 && pick < 0 && rnd(3) == 0; tries++) {
            int32_t cand = allowed[rnd((uint32_t)n_allowed)];
            char piece[8];
            if (!tok_is_eog(t, cand) && tok_piece(t, cand, false, piece, sizeof piece) == 1) pick = cand;
        }
        if (pick < 0 && n_allowed) pick = allowed[rnd((uint32_t)n_allowed)];
        if (pick < 0 || tok_is_eog(t, pick)) break;
        char piece[256];
        const size_t len = tok_piece(t, pick, false, piece, sizeof piece);
        if (n_text + len > sizeof text) break;
        memcpy(text + n_text, piece, len);
        n_text += len;
        grammar_accept(a, pick);
        CHECK_MSG(grammar_check(g, text, n_text) != GRAMMAR_NONE, "[%.*s] is no prefix", (int)n_text, text);
    }
    struct grammar_stats st;
    grammar_matcher_stats(a, &st);
    if (cache_cap && checked > 8)
        CHECK_MSG(st.flushes > 0, "a %zu-byte cache was never flushed (%d states)", cache_cap, checked);
    grammar_matcher_free(a);
    kvb_free(logits);
    kvb_free(allowed);
    return checked;
}

static void test_masks(const struct tok *t)
{
    struct grammar_vocab *v = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(grammar_vocab_create(t, &v, &err) == KVB_OK, "%s", err.msg);
    if (!v) return;
    static const char *files[] = {"json.gbnf", "arithmetic.gbnf", "list.gbnf", "chess.gbnf", "japanese.gbnf", "c.gbnf"};
    static const char *inline_g[] = {
        "root ::= \"positive\" | \"negative\" | \"neutral\"",
        "root ::= [0-9]{3} \"-\" [0-9]{4}",
        "root ::= \"{\\\"n\\\": \" [1-9] [0-9]* \"}\"",
    };
    int states = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0] + sizeof inline_g / sizeof inline_g[0]; f++) {
        const bool is_file = f < sizeof files / sizeof files[0];
        struct grammar *g = is_file ? compile_file(files[f]) : compile(inline_g[f - sizeof files / sizeof files[0]]);
        if (!g) continue;
        for (int seed = 0; seed < 3; seed++) states += walk(g, v, t, 24, 0);
        if (is_file) states += walk(g, v, t, 24, 8u << 10); /* flushed every few steps */
        grammar_free(g);
    }
    printf("masks: %d states, each mask equal to the per-token check over %d tokens\n", states, grammar_vocab_size(v));
    grammar_vocab_free(v);
}

static int check_mode(const char *file)
{
    size_t len = 0;
    char *text = tu_read_file(file, &len);
    if (!text) return fprintf(stderr, "cannot read %s\n", file), 2;
    struct grammar *g = NULL;
    char msg[256];
    if (grammar_compile(text, len, &g, msg, sizeof msg) != KVB_OK) return printf("ERROR %s\n", msg), 0;
    kvb_free(text);
    static char line[1 << 20], bytes[1 << 19];
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        for (size_t i = 0; line[i] && line[i + 1] && line[i] != '\n'; i += 2) {
            unsigned x;
            sscanf(line + i, "%2x", &x);
            bytes[n++] = (char)x;
        }
        printf("%s\n", match_name(grammar_check(g, bytes, n)));
    }
    grammar_free(g);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--check")) return check_mode(argv[2]);
    test_refusals();
    test_matches();
    test_files();
    bool absent = false;
    struct tok *t = tu_model_tokenizer(&absent);
    if (absent) printf("tokenizer part skipped: KVB_MODEL not present\n");
    if (t) test_masks(t);
    tok_free(t);
    return tu_finish();
}
