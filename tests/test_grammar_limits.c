/* test_grammar_limits.c — the grammar compiler's limits (engine/grammar.h),
 * each met just under and just over, and the shapes that once took a job
 * down (issue 27):
 *   - groups nested 100,000 deep (the recursive parser overflowed the stack)
 *     are refused naming GRAMMAR_MAX_NEST; GRAMMAR_MAX_NEST deep compiles;
 *   - a chain of 2,000 rules, each the next one's first item, needed a stack
 *     deeper than GRAMMAR_MAX_DEPTH before the first byte: the matcher could
 *     not start and said "out of memory"; now refused naming the limit,
 *     while 1,000 compiles and matches;
 *   - 4,097 alternatives open at the start (a choice of 4,097 strings) are
 *     refused naming GRAMMAR_MAX_STACKS; 4,096 compile; the choice writer
 *     refuses 4,097 strings itself;
 *   - a chain of 300,000 rules each the next one's whole body: the
 *     left-recursion check walked it recursively (a stack overflow); it
 *     compiles now and matches;
 *   - a root that derives no string (root ::= root: the fuzz crash) is
 *     refused; alternatives that can never end are dropped, so no prefix
 *     the grammar accepts is a dead end;
 *   - 30,000 different character classes compile (their sets are hashed);
 *     elements past GRAMMAR_MAX_ELEMS are refused;
 *   - every allocation of a constraint's compile failing in turn (schema,
 *     regex, choice to GBNF; GBNF to grammar; the matcher's start): each
 *     ends in KVB_ERR_NOMEM or succeeds, never a crash, a leak (ASan) or
 *     another error, so a request out of memory is a 500 line and no more. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "engine/grammar.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_schema.h"
#include "support/testutil.h"

static enum kvb_status compile_buf(const struct kvb_buf *b, struct grammar **g, char *msg, size_t cap)
{
    return grammar_compile(b->data, b->len, g, msg, cap);
}

static void put(struct kvb_buf *b, const char *s)
{
    const size_t n = strlen(s);
    CHECK(kvb_buf_reserve(b, n + 1) == KVB_OK);
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
}

static void putf(struct kvb_buf *b, const char *fmt, unsigned x, unsigned y)
{
    char tmp[128];
    snprintf(tmp, sizeof tmp, fmt, x, y);
    put(b, tmp);
}

/* Compiles b and expects a refusal whose message holds want. */
static void refused(const struct kvb_buf *b, const char *what, const char *want)
{
    struct grammar *g = NULL;
    char msg[300] = "";
    const enum kvb_status st = compile_buf(b, &g, msg, sizeof msg);
    CHECK_MSG(st == KVB_ERR_FORMAT && !g, "%s: compiled (status %d)", what, (int)st);
    CHECK_MSG(strstr(msg, want) != NULL, "%s: message [%s] lacks [%s]", what, msg, want);
    grammar_free(g);
}

/* Compiles b, expects success, and checks s against it. */
static void accepted(const struct kvb_buf *b, const char *what, const char *s, enum grammar_match want)
{
    struct grammar *g = NULL;
    char msg[300] = "";
    const enum kvb_status st = compile_buf(b, &g, msg, sizeof msg);
    CHECK_MSG(st == KVB_OK && g, "%s: refused: %s", what, msg);
    if (g) CHECK_MSG(grammar_check(g, s, strlen(s)) == want, "%s: [%.40s] not matched as expected", what, s);
    grammar_free(g);
}

static void nested_groups(unsigned depth, struct kvb_buf *b)
{
    b->len = 0;
    put(b, "root ::= ");
    for (unsigned i = 0; i < depth; i++) put(b, "(");
    put(b, "\"a\"");
    for (unsigned i = 0; i < depth; i++) put(b, ")");
}

static void test_nesting(void)
{
    struct kvb_buf b = {0};
    nested_groups(100000, &b);
    refused(&b, "100,000 nested groups", "nest deeper than");
    nested_groups(GRAMMAR_MAX_NEST + 1, &b);
    refused(&b, "GRAMMAR_MAX_NEST + 1 nested groups", "nest deeper than");
    nested_groups(GRAMMAR_MAX_NEST, &b);
    accepted(&b, "GRAMMAR_MAX_NEST nested groups", "a", GRAMMAR_FULL);
    kvb_buf_free(&b);
    printf("nesting: groups %d deep compile, deeper ones are refused\n", GRAMMAR_MAX_NEST);
}

/* r0 ::= r1 "a", ..., r(n-1) ::= "a": n rules deep before the first byte. */
static void left_chain(unsigned n, struct kvb_buf *b)
{
    b->len = 0;
    put(b, "root ::= r0\n");
    for (unsigned i = 0; i + 1 < n; i++) putf(b, "r%u ::= r%u \"a\"\n", i, i + 1);
    putf(b, "r%u ::= \"a\"%.0u\n", n - 1, 0);
}

static void test_left_chain(void)
{
    struct kvb_buf b = {0};
    left_chain(2000, &b);
    refused(&b, "a left chain of 2,000 rules", "nest more than");
    left_chain(1000, &b);
    char *as = malloc(1001);
    CHECK(as != NULL);
    memset(as, 'a', 1000);
    as[1000] = 0;
    accepted(&b, "a left chain of 1,000 rules", as, GRAMMAR_FULL);
    free(as);
    kvb_buf_free(&b);
    printf("left chains: 1,000 rules deep compile, 2,000 are refused by the depth limit\n");
}

static void alternatives(unsigned n, struct kvb_buf *b)
{
    b->len = 0;
    put(b, "root ::= ");
    for (unsigned i = 0; i < n; i++) putf(b, i ? " | \"c%u\"%.0u" : "\"c%u\"%.0u", i, 0);
}

static void test_width(void)
{
    struct kvb_buf b = {0};
    alternatives(GRAMMAR_MAX_STACKS + 1, &b);
    refused(&b, "GRAMMAR_MAX_STACKS + 1 alternatives", "alternatives are open");
    alternatives(GRAMMAR_MAX_STACKS, &b);
    accepted(&b, "GRAMMAR_MAX_STACKS alternatives", "c4095", GRAMMAR_FULL);

    /* the choice writer says so itself, in its own terms */
    struct kvb_buf json = {0};
    for (unsigned n = GRAMMAR_MAX_CHOICES; n <= GRAMMAR_MAX_CHOICES + 1; n++) {
        json.len = 0;
        put(&json, "[");
        for (unsigned i = 0; i < n; i++) putf(&json, i ? ",\"c%u\"%.0u" : "\"c%u\"%.0u", i, 0);
        put(&json, "]");
        struct kvb_buf g = {0};
        char msg[200] = "";
        const enum kvb_status st = grammar_choice_gbnf(json.data, json.len, &g, msg, sizeof msg);
        if (n == GRAMMAR_MAX_CHOICES) {
            CHECK_MSG(st == KVB_OK, "%u choices: %s", n, msg);
            accepted(&g, "the largest choice", "c17", GRAMMAR_FULL);
        } else {
            CHECK_MSG(st == KVB_ERR_FORMAT && strstr(msg, "at most 4096"), "%u choices: [%s]", n, msg);
        }
        kvb_buf_free(&g);
    }
    kvb_buf_free(&json);
    kvb_buf_free(&b);
    printf("width: %d alternatives and choices compile, one more is refused\n", GRAMMAR_MAX_STACKS);
}

static void test_long_chain(void)
{
    /* each rule the whole body of the one before: a path of 300,000 left
     * edges for the left-recursion check, but a stack of depth one */
    struct kvb_buf b = {0};
    put(&b, "root ::= r0\n");
    const unsigned n = 300000;
    for (unsigned i = 0; i + 1 < n; i++) putf(&b, "r%u ::= r%u\n", i, i + 1);
    putf(&b, "r%u ::= \"a\"%.0u\n", n - 1, 0);
    accepted(&b, "a chain of 300,000 rules", "a", GRAMMAR_FULL);
    /* the same chain as a cycle back to r0 that adds nothing: a tail loop */
    putf(&b, "r%u ::= r0 | \"b\"%.0u\n", n, 0);
    putf(&b, "x ::= r%u%.0u\n", n, 0);
    accepted(&b, "a chain of 300,000 rules with an unused cycle", "b", GRAMMAR_NONE);
    kvb_buf_free(&b);
    printf("long chains: 300,000 rules compile\n");
}

static void text(struct kvb_buf *b, const char *s)
{
    b->len = 0;
    put(b, s);
}

static void test_productive(void)
{
    struct kvb_buf b = {0};
    text(&b, "root ::=root  ");
    refused(&b, "the fuzz crash's grammar", "matches no string");
    text(&b, "root ::= \"a\" x\nx ::= \"b\" x");
    refused(&b, "a root that never ends", "matches no string");
    text(&b, "root ::= x | y\nx ::= y \"a\"\ny ::= x \"b\"");
    refused(&b, "mutual left recursion", "left-recursive");
    /* a dead alternative is dropped: "bc..." can never end, so "b" is no prefix */
    text(&b, "root ::= \"a\" | \"b\" x\nx ::= \"c\" x");
    accepted(&b, "a dead alternative", "a", GRAMMAR_FULL);
    accepted(&b, "a dead alternative", "b", GRAMMAR_NONE);
    accepted(&b, "a dead alternative", "bc", GRAMMAR_NONE);
    /* a recursion with a way out is kept */
    text(&b, "root ::= \"b\" x\nx ::= \"c\" x | \"d\"");
    accepted(&b, "a recursion that ends", "bccd", GRAMMAR_FULL);
    accepted(&b, "a recursion that ends", "bcc", GRAMMAR_PREFIX);
    kvb_buf_free(&b);
    printf("productivity: a root that derives nothing is refused, dead alternatives dropped\n");
}

static void test_sizes(void)
{
    /* 30,000 different classes in a row: each a new byte set */
    struct kvb_buf b = {0};
    put(&b, "root ::= ");
    for (unsigned i = 0; i < 30000; i++) {
        const unsigned lo = 0x21 + i % 90, hi = lo + 1 + (i / 90) % 4, one = 0x21 + i / 360 % 90;
        char tmp[64];
        snprintf(tmp, sizeof tmp, "[\\x%02x-\\x%02x\\x%02x] ", lo, hi, one);
        put(&b, tmp);
    }
    struct grammar *g = NULL;
    char msg[300] = "";
    CHECK_MSG(compile_buf(&b, &g, msg, sizeof msg) == KVB_OK, "30,000 classes: %s", msg);
    grammar_free(g);
    /* elements past the budget: a literal of 1,000 bytes repeated 1,100 times */
    text(&b, "root ::= \"");
    for (unsigned i = 0; i < 1000; i++) put(&b, "x");
    put(&b, "\"{1100}");
    refused(&b, "more than GRAMMAR_MAX_ELEMS elements", "elements");
    kvb_buf_free(&b);
    printf("sizes: many classes compile, past GRAMMAR_MAX_ELEMS is refused\n");
}

/* One compile with the Nth allocation failing: KVB_OK or KVB_ERR_NOMEM only.
 * Returns whether it got through. */
static bool compile_failing(int form, const char *text, long n)
{
    struct kvb_buf b = {0};
    char msg[300] = "", path[256] = "";
    kvb_alloc_fail_after(n);
    enum kvb_status st = form == 0
                             ? gschema_to_gbnf(text, strlen(text), "schema", &b, path, sizeof path, msg, sizeof msg)
                         : form == 1 ? gregex_to_gbnf(text, strlen(text), GREGEX_WHOLE, "root", &b, msg, sizeof msg)
                         : form == 2 ? grammar_choice_gbnf(text, strlen(text), &b, msg, sizeof msg)
                                     : kvb_buf_reserve(&b, strlen(text) + 1);
    if (form == 3 && st == KVB_OK) {
        memcpy(b.data, text, strlen(text) + 1);
        b.len = strlen(text);
    }
    struct grammar *g = NULL;
    if (st == KVB_OK) st = grammar_compile(b.data, b.len, &g, msg, sizeof msg);
    struct grammar_matcher *m = NULL;
    if (st == KVB_OK) st = grammar_matcher_create(g, NULL, &m);
    if (st == KVB_OK && !grammar_matcher_feed(m, "{", 1) && form == 0)
        st = KVB_ERR_NOMEM; /* a refusal for lack of memory */
    kvb_alloc_fail_after(-1);
    CHECK_MSG(st == KVB_OK || st == KVB_ERR_NOMEM, "form %d, allocation %ld failing: status %d (%s)", form, n, (int)st,
              msg);
    grammar_matcher_free(m);
    grammar_free(g);
    kvb_buf_free(&b);
    return st == KVB_OK;
}

static void test_alloc_failures(void)
{
    static const char *const texts[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":900},"
        "\"b\":{\"type\":\"string\",\"pattern\":\"^[a-z]{2,5}$\"},\"c\":{\"enum\":[1,\"x\",[true]]}},"
        "\"required\":[\"a\"]}",
        "(ab|c[0-9]{2,4})+x?",
        "[\"yes\",\"no\",\"caf\\u00e9\"]",
        "root ::= item (\",\" item)*\nitem ::= [a-z\\u00e0-\\u00ff]+ | \"(\" root \")\" | \"x\"{2,5}\n",
    };
    int total = 0;
    for (int form = 0; form < 4; form++) {
        long n = 0;
        while (!compile_failing(form, texts[form], n) && n < 100000) n++;
        CHECK_MSG(n < 100000, "form %d never compiled", form);
        total += (int)n;
    }
    printf("allocation failures: %d failing allocations, each out of memory and nothing else\n", total);
}

int main(void)
{
    test_nesting();
    test_left_chain();
    test_width();
    test_long_chain();
    test_productive();
    test_sizes();
    test_alloc_failures();
    return tu_finish();
}
