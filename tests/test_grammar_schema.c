/* test_grammar_schema.c — JSON Schema and regex to GBNF (grammar_schema.h,
 * grammar_regex.h).
 *
 * Without arguments, the unit tests: refusals name their keyword, accepted
 * schemas compile and stay the same text run after run, the regex subset's
 * refusals; and where the grammar engine is built (grammar.h), the GBNF
 * checked by brute force: integer ranges against arithmetic, number ranges
 * against strtod, regexes against a backtracking matcher written here,
 * length-bounded patterns, whitespace against JSON mode's rules.
 *
 * With arguments it is the tool tests/pytest_schema_corpus.py drives:
 *   --schema FILE        the GBNF of the schema in FILE, or "ERR field: why" (exit 3)
 *   --regex FLAGS FILE   the GBNF of the regex in FILE (FLAGS 0 whole, 1 JSON content)
 *   --check GBNF INPUTS  each line of INPUTS (hex bytes) fed byte by byte:
 *                        "full", "prefix" or "reject N" (N bytes were accepted) */
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_schema.h"
#include "support/testutil.h"

#if __has_include("engine/grammar.h")
#include "engine/grammar.h"
#define HAVE_ENGINE 1
#else
#define HAVE_ENGINE 0
#endif

static int tool_schema(const char *file)
{
    size_t n;
    char *s = tu_read_file(file, &n);
    if (!s) return 2;
    struct kvb_buf b = {0};
    char path[256], msg[512];
    const enum kvb_status st = gschema_to_gbnf(s, n, "schema", &b, path, sizeof path, msg, sizeof msg);
    free(s);
    if (st != KVB_OK) {
        printf("ERR %s: %s\n", path, msg);
        return 3;
    }
    fwrite(b.data, 1, b.len, stdout);
    kvb_buf_free(&b);
    return 0;
}

static int tool_regex(const char *flags, const char *file)
{
    size_t n;
    char *s = tu_read_file(file, &n);
    if (!s) return 2;
    struct kvb_buf b = {0};
    char msg[512];
    const enum kvb_status st = gregex_to_gbnf(s, n, atoi(flags), "root", &b, msg, sizeof msg);
    free(s);
    if (st != KVB_OK) {
        printf("ERR regex: %s\n", msg);
        return 3;
    }
    fwrite(b.data, 1, b.len, stdout);
    kvb_buf_free(&b);
    return 0;
}

#if HAVE_ENGINE
static struct grammar *compile_or_fail(const char *gbnf, size_t n)
{
    struct grammar *g = NULL;
    char msg[512];
    const enum kvb_status st = grammar_compile(gbnf, n, &g, msg, sizeof msg);
    if (st != KVB_OK) {
        fprintf(stderr, "grammar_compile: %s\n", msg);
        return NULL;
    }
    return g;
}

static int tool_check(const char *gfile, const char *ifile)
{
    size_t gn;
    char *gt = tu_read_file(gfile, &gn);
    if (!gt) return 2;
    struct grammar *g = compile_or_fail(gt, gn);
    free(gt);
    if (!g) {
        printf("grammar-error\n");
        return 2;
    }
    struct grammar_matcher *m = NULL;
    if (grammar_matcher_create(g, NULL, &m) != KVB_OK) return 2;
    FILE *f = fopen(ifile, "r");
    if (!f) return 2;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        grammar_matcher_reset(m);
        size_t pos = 0;
        bool ok = true;
        for (ssize_t i = 0; i + 1 < len; i += 2, pos++) {
            unsigned v;
            sscanf(line + i, "%2x", &v);
            const char c = (char)v;
            if (!grammar_matcher_feed(m, &c, 1)) {
                ok = false;
                break;
            }
        }
        if (!ok) printf("reject %zu\n", pos);
        else printf(grammar_matcher_complete(m) ? "full\n" : "prefix\n");
    }
    free(line);
    fclose(f);
    grammar_matcher_free(m);
    grammar_free(g);
    return 0;
}
#endif

/* ---- unit tests ------------------------------------------------------------------------ */

static char *to_gbnf(const char *schema, char *path, char *msg)
{
    struct kvb_buf b = {0};
    const enum kvb_status st = gschema_to_gbnf(schema, schema ? strlen(schema) : 0, "s", &b, path, 256, msg, 512);
    if (st != KVB_OK) {
        kvb_buf_free(&b);
        return NULL;
    }
    return b.data;
}

static void test_refusals(void)
{
    static const struct {
        const char *schema, *want;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":3}}}", "multipleOf"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}", "uniqueItems"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", "patternProperties"},
        {"{\"type\":\"object\",\"minProperties\":1}", "minProperties"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{\"type\":\"null\"}}}}", "'not'"},
        {"{\"type\":\"object\",\"if\":{},\"then\":{}}", "'if'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=x)y\"}}}", "lookahead"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}}}",
         "back-reference"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?<n>a)\\\\k<n>\"}}}",
         "back-references by name"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"\\\\bx\"}}}", "word boundary"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"\\\\p{L}\"}}}",
         "Unicode property"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"hostname\"}}}",
         "format 'hostname'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"x\"}}}",
         "format beside pattern"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":1e-70}}}", "too many digits"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}}}",
         "above maxLength"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":5000}}}", "maxLength"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"maxItems\":5000}}}", "maxItems"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"http://x/y.json\"}}}", "only references inside"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/missing\"}}}", "names nothing"},
        {"{\"$defs\":{\"A\":{\"anyOf\":[{\"$ref\":\"#/$defs/A\"},{\"type\":\"null\"}]}},\"type\":\"object\","
         "\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}}}",
         "cycle"},
        {"{\"type\":\"object\",\"allOf\":[{\"properties\":{\"a\":{\"minLength\":1}}},{\"properties\":{\"a\":{}}}]}",
         "listed twice"},
        {"{\"type\":\"object\",\"allOf\":[{\"minProperties\":1}]}", "minProperties"},
        {"{\"allOf\":[{\"type\":\"object\",\"additionalProperties\":false},{\"additionalProperties\":true}]}",
         "'additionalProperties' is given by two"},
        {"{\"type\":\"string\"}", "must describe an object"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"null\"}]}", "must describe an object"},
        {"{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{\"a\":{}}}", "does not list"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"additionalItems\":false}}}",
         "additionalItems"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"[\"}}}", "not closed"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"a{2000}\"}}}", "counts above"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}}}",
         "no integer"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,2],\"minimum\":3}}}", "beside enum"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"contains\":{}}}}", "contains"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"contentEncoding\":\"base64\"}}}",
         "contentEncoding"},
        {"{\"type\":\"object\",\"unevaluatedProperties\":false}", "unevaluatedProperties"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false}}", "allows no value"},
        {"{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^a\"}}", "propertyNames"},
        {"{\"type\":\"object\",\"dependentRequired\":{}}", "dependentRequired"},
        {"{\"type\":\"object\"", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256], msg[512];
        char *g = to_gbnf(cases[i].schema, path, msg);
        CHECK_MSG(g == NULL, "accepted: %s", cases[i].schema);
        free(g);
        if (!g)
            CHECK_MSG(strstr(msg, cases[i].want) != NULL, "%s: '%s' lacks '%s'", cases[i].schema, msg, cases[i].want);
    }
}

static const char *const accepted[] = {
    NULL, /* json_object */
    "{\"type\":\"object\"}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":[\"integer\",\"null\"]}},"
    "\"required\":[\"a\"]}",
    "{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"red\",\"green\",1,2.5,null,true,{\"x\":[1]}]}}}",
    "{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$"
    "ref\":\"#/$defs/N\"},{\"type\":\"null\"}]}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/N\"}",
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date-time\"},\"u\":{\"type\":"
    "\"string\",\"format\":\"uri\",\"minLength\":1,\"maxLength\":2083}}}",
    "{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{"
    "\"type\":\"string\"}],\"minItems\":2,\"maxItems\":2}}}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1}}",
    "{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":true}",
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,5}$\","
    "\"maxLength\":7}}}",
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}},\"required\":[\"k\"]},{\"type\":"
    "\"object\",\"properties\":{\"k\":{\"const\":\"b\"},\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":0}},"
    "\"required\":[\"k\",\"n\"]}]}",
};

static void test_accepted(void)
{
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        char path[256], msg[512];
        char *a = to_gbnf(accepted[i], path, msg);
        CHECK_MSG(a != NULL, "refused %s: %s: %s", accepted[i] ? accepted[i] : "(json_object)", path, msg);
        char *b = to_gbnf(accepted[i], path, msg);
        CHECK(a && b && strcmp(a, b) == 0); /* the same text each time: grammars can be cached by it */
        CHECK(a && strstr(a, "\nroot ::= ") != NULL);
#if HAVE_ENGINE
        struct grammar *g = a ? compile_or_fail(a, strlen(a)) : NULL;
        CHECK_MSG(g != NULL, "the engine refuses the GBNF of %s", accepted[i] ? accepted[i] : "(json_object)");
        grammar_free(g);
#endif
        free(a);
        free(b);
    }
}

static void test_regex_refusals(void)
{
    static const struct {
        const char *re, *want;
    } cases[] = {
        {"a(?!b)", "lookahead"},       {"(?<=a)b", "lookbehind"},   {"\\B", "word boundary"},   {"[]", "empty classes"},
        {"a**", "nothing to repeat"},  {"*a", "nothing to repeat"}, {"(a", "not closed"},       {"a)", "unmatched"},
        {"[z-a]", "out of order"},     {"\\q", "escape \\q"},       {"a{3,2}", "out of order"}, {"^*", "anchor"},
        {"\\uD800", "lone surrogate"}, {"x{1001}", "counts above"}, {"(?i)a", "group (?i"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kvb_buf b = {0};
        char msg[256];
        const enum kvb_status st =
            gregex_to_gbnf(cases[i].re, strlen(cases[i].re), GREGEX_WHOLE, "r", &b, msg, sizeof msg);
        CHECK_MSG(st == KVB_ERR_FORMAT, "accepted regex %s", cases[i].re);
        if (st != KVB_OK)
            CHECK_MSG(strstr(msg, cases[i].want) != NULL, "%s: '%s' lacks '%s'", cases[i].re, msg, cases[i].want);
        CHECK(b.len == 0);
        kvb_buf_free(&b);
    }
    /* the length intersection says when it is too large, rather than dropping the bound */
    struct kvb_buf b = {0};
    char msg[256];
    const char *re = "[a-z]*(x|y)[a-z]*(u|v)[a-z]*";
    enum kvb_status st = gregex_to_gbnf_len(re, strlen(re), GREGEX_JSON_CONTENT, 0, 2000000, "r", &b, msg, sizeof msg);
    CHECK(st == KVB_ERR_FORMAT && strstr(msg, "length") != NULL);
    st = gregex_to_gbnf_len("abc", 3, GREGEX_WHOLE, 4, 10, "r", &b, msg, sizeof msg);
    CHECK(st == KVB_ERR_FORMAT && strstr(msg, "no string matches") != NULL);
    kvb_buf_free(&b);
}

/* Failed allocations at every point: out of memory is reported as such, never as a bad schema. */
static void test_alloc_failures(void)
{
    static const char *const schemas[] = {
        "{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":-5},"
        "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/N\"},{\"type\":\"null\"}]},\"s\":{\"type\":\"string\","
        "\"pattern\":\"^[a-z]+\\\\d$\",\"maxLength\":9}},\"required\":[\"v\"],\"additionalProperties\":{\"type\":"
        "\"boolean\"}}},\"$ref\":\"#/$defs/N\"}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"prefixItems\":[{\"enum\":[1,\"x\"]}],"
        "\"items\":{\"type\":\"string\",\"format\":\"date\"},\"maxItems\":3}}}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        int ok_at = -1;
        for (long n = 0; n < 20000 && ok_at < 0; n++) {
            struct kvb_buf b = {0};
            char path[256], msg[512];
            kvb_alloc_fail_after(n);
            const enum kvb_status st =
                gschema_to_gbnf(schemas[i], strlen(schemas[i]), "s", &b, path, sizeof path, msg, sizeof msg);
            kvb_alloc_fail_after(-1);
            CHECK_MSG(st == KVB_OK || st == KVB_ERR_NOMEM, "schema %zu, failing allocation %ld: %s %s", i, n,
                      kvb_strerror(st), msg);
            if (st == KVB_OK) ok_at = (int)n;
            kvb_buf_free(&b);
        }
        CHECK(ok_at > 0);
    }
}

#if HAVE_ENGINE
/* ---- with the engine: the grammars checked by brute force ------------------------------ */

static struct grammar *schema_grammar(const char *schema)
{
    char path[256], msg[512];
    char *t = to_gbnf(schema, path, msg);
    CHECK_MSG(t != NULL, "%s: %s", schema, msg);
    struct grammar *g = t ? compile_or_fail(t, strlen(t)) : NULL;
    CHECK_MSG(!t || g, "engine refuses the GBNF of %s", schema);
    free(t);
    return g;
}

static bool full(const struct grammar *g, const char *s) { return grammar_check(g, s, strlen(s)) == GRAMMAR_FULL; }

/* Integer bounds: every integer in a window against arithmetic. */
static void test_int_ranges(void)
{
    static const struct {
        const char *kw;
        long lo, hi; /* inclusive; LONG_MIN/LONG_MAX unbounded */
    } cases[] = {
        {"\"minimum\":0,\"maximum\":150", 0, 150},
        {"\"minimum\":-120,\"maximum\":1234", -120, 1234},
        {"\"exclusiveMinimum\":99,\"exclusiveMaximum\":1000", 100, 999},
        {"\"maximum\":-37", -1000000, -37},
        {"\"minimum\":7", 7, 1000000},
        {"\"minimum\":-5", -5, 1000000},
        {"\"minimum\":-1000,\"maximum\":-999", -1000, -999},
        {"\"minimum\":0.5,\"maximum\":9.5", 1, 9},
        {"\"minimum\":1000,\"maximum\":1000", 1000, 1000},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char schema[256];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",%s}},\"required\":[\"v\"]}",
                 cases[c].kw);
        struct grammar *g = schema_grammar(schema);
        if (!g) continue;
        int bad = 0;
        for (long v = -2100; v <= 2100 && bad < 5; v++) {
            char doc[64];
            snprintf(doc, sizeof doc, "{\"v\":%ld}", v);
            const bool want = v >= cases[c].lo && v <= cases[c].hi;
            if (full(g, doc) != want) {
                CHECK_MSG(false, "%s: %s %s", cases[c].kw, doc, want ? "refused" : "accepted");
                bad++;
            }
        }
        CHECK(!full(g, "{\"v\":-0}") && !full(g, "{\"v\":01}") && !full(g, "{\"v\":1.0}"));
        grammar_free(g);
    }
}

/* Number bounds (whole numbers): decimals against strtod. */
static void test_num_ranges(void)
{
    static const struct {
        const char *kw;
        double lo, hi;
        bool lo_ex, hi_ex;
    } cases[] = {
        {"\"minimum\":0,\"maximum\":1", 0, 1, false, false},
        {"\"minimum\":-2,\"maximum\":3", -2, 3, false, false},
        {"\"exclusiveMinimum\":0", 0, 1e300, true, false},
        {"\"exclusiveMaximum\":0", -1e300, 0, false, true},
        {"\"minimum\":10,\"exclusiveMaximum\":11", 10, 11, false, true},
        {"\"exclusiveMinimum\":-3,\"maximum\":-1", -3, -1, true, false},
        {"\"minimum\":0.25,\"maximum\":0.75", 0.25, 0.75, false, false},
        {"\"exclusiveMinimum\":0.25,\"exclusiveMaximum\":2.5", 0.25, 2.5, true, true},
        {"\"minimum\":-1.5,\"exclusiveMaximum\":1.25", -1.5, 1.25, false, true},
        {"\"exclusiveMinimum\":-2.75,\"maximum\":-0.1", -2.75, -0.1, true, false},
        {"\"minimum\":2.5e-1,\"maximum\":3.1E0", 0.25, 3.1, false, false},
        {"\"exclusiveMaximum\":0.001", -1e300, 0.001, false, true},
        {"\"minimum\":1.999", 1.999, 1e300, false, false},
    };
    static const char *const nums[] = {"0",    "0.0",  "0.5",  "1",    "1.0",  "1.00", "1.01", "-0.5", "-1",
                                       "-2",   "-2.0", "-2.1", "3",    "3.0",  "3.5",  "10",   "10.0", "10.99",
                                       "11",   "11.0", "-3",   "-3.0", "-2.9", "-1.0", "-0.9", "2.5",  "0.001",
                                       "99.5", "-7",   "12",   "5",    "-0.0", "00",   "1.",   ".5",   "1e2"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char schema[256];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\",%s}},\"required\":[\"v\"]}",
                 cases[c].kw);
        struct grammar *g = schema_grammar(schema);
        if (!g) continue;
        static const char *const fr[] = {"",      ".0", ".00", ".001",  ".01",  ".1",  ".099", ".25",   ".249",
                                         ".2501", ".5", ".75", ".7501", ".749", ".99", ".999", ".9991", ".0001"};
        for (int ip = -4; ip <= 4; ip++) { /* a grid of decimals around the bounds */
            for (size_t f = 0; f < sizeof fr / sizeof fr[0]; f++) {
                for (int neg = 0; neg < 2; neg++) {
                    if (neg && ip > 0) continue;
                    char n[32], doc[64];
                    snprintf(n, sizeof n, "%s%d%s", neg && ip == 0 ? "-" : "", ip, fr[f]);
                    const double v = strtod(n, NULL);
                    const bool in = (cases[c].lo_ex ? v > cases[c].lo : v >= cases[c].lo) &&
                                    (cases[c].hi_ex ? v < cases[c].hi : v <= cases[c].hi);
                    const bool negzero = n[0] == '-' && v == 0;
                    snprintf(doc, sizeof doc, "{\"v\":%s}", n);
                    CHECK_MSG(full(g, doc) == (in && !negzero), "%s: %s", cases[c].kw, doc);
                }
            }
        }
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
            const char *n = nums[i];
            const double v = strtod(n, NULL);
            const bool wellformed = strcmp(n, "00") && strcmp(n, "1.") && strcmp(n, ".5") && strcmp(n, "1e2") &&
                                    strcmp(n, "-0.0"); /* exponents and -0 are not written for bounded numbers */
            const bool in = (cases[c].lo_ex ? v > cases[c].lo : v >= cases[c].lo) &&
                            (cases[c].hi_ex ? v < cases[c].hi : v <= cases[c].hi);
            char doc[64];
            snprintf(doc, sizeof doc, "{\"v\":%s}", n);
            CHECK_MSG(full(g, doc) == (wellformed && in), "%s: %s", cases[c].kw, doc);
        }
        grammar_free(g);
    }
}

/* Regexes against POSIX extended regexes on the subset both read alike,
 * strings over a small alphabet: whole match, search, length bounds. */
static void test_regex_vs_posix(void)
{
    static const char *const res[] = {
        "a(b|c)*x", "^[a-c]{2,3}$",    "(ab|a)(c|bcd)?", "x[0-9]+|y",         "^a|b$",
        "[^ab]{2}", "(a|b)*a(a|b){2}", "a?b?c?",         "^(0|[1-9][0-9]*)$", "a{2}b{0,2}c{1,}"};
    const char alpha[] = "abcxy019";
    uint64_t seed = 12345;
    for (size_t r = 0; r < sizeof res / sizeof res[0]; r++) {
        for (int mode = 0; mode < 3; mode++) { /* whole; JSON content (search); content with length 2..4 */
            struct kvb_buf b = {0};
            char msg[256];
            enum kvb_status st;
            if (mode == 0) {
                st = gregex_to_gbnf(res[r], strlen(res[r]), GREGEX_WHOLE, "root", &b, msg, sizeof msg);
            } else {
                struct kvb_buf inner = {0};
                st = gregex_to_gbnf_len(res[r], strlen(res[r]), GREGEX_JSON_CONTENT, mode == 2 ? 2 : 0,
                                        mode == 2 ? 4 : GREGEX_NO_MAX, "pat", &inner, msg, sizeof msg);
                if (st == KVB_OK) {
                    const char *head = "root ::= \"\\\"\" pat \"\\\"\"\n";
                    kvb_buf_reserve(&b, strlen(head) + inner.len + 1);
                    memcpy(b.data, head, strlen(head));
                    memcpy(b.data + strlen(head), inner.data, inner.len);
                    b.len = strlen(head) + inner.len;
                    b.data[b.len] = 0;
                }
                kvb_buf_free(&inner);
            }
            CHECK_MSG(st == KVB_OK, "%s: %s", res[r], msg);
            struct grammar *g = st == KVB_OK ? compile_or_fail(b.data, b.len) : NULL;
            kvb_buf_free(&b);
            if (!g) continue;
            char anchored[128];
            snprintf(anchored, sizeof anchored, mode == 0 ? "^(%s)$" : "%s", res[r]);
            regex_t px;
            CHECK(regcomp(&px, anchored, REG_EXTENDED | REG_NOSUB) == 0);
            int bad = 0;
            for (int t = 0; t < 3000 && bad < 5; t++) {
                char s[16], q[20];
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                const int n = (int)((seed >> 33) % 8);
                for (int i = 0; i < n; i++) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    s[i] = alpha[(seed >> 33) % (sizeof alpha - 1)];
                }
                s[n] = 0;
                bool want = regexec(&px, s, 0, NULL, 0) == 0;
                if (mode == 2) want = want && n >= 2 && n <= 4;
                snprintf(q, sizeof q, mode == 0 ? "%s" : "\"%s\"", s);
                if (full(g, q) != want) {
                    CHECK_MSG(false, "regex %s mode %d: '%s' %s", res[r], mode, s, want ? "refused" : "accepted");
                    bad++;
                }
            }
            regfree(&px);
            grammar_free(g);
        }
    }
}

/* JSON mode's whitespace and nesting, through the json_object grammar. */
static void test_json_object_policy(void)
{
    struct grammar *g = NULL;
    {
        char path[256], msg[512];
        char *t = to_gbnf(NULL, path, msg);
        g = t ? compile_or_fail(t, strlen(t)) : NULL;
        free(t);
    }
    CHECK(g != NULL);
    if (!g) return;
    static const struct {
        const char *s;
        bool ok;
    } cases[] = {
        {"{}", true},
        {" {}", true},
        {"\n{}", true},
        {"  {}", false},
        {"{} ", false},
        {"[]", false},
        {"{\"a\":1}", true},
        {"{\"a\" :1}", false},
        {"{\"a\": 1}", true},
        {"{\"a\":  1}", false},
        {"{\"a\":\n1}", false},
        {"{\n  \"a\": 1\n}", true},
        {"{\n\n}", false},
        {"{\r\n}", false},
        {"{\t\t}", true},
        {"{\"a\":[1 , 2]}", true},
        {"{\"a\":\"\\u00e9\\/\"}", true},
        {"{\"a\":\"\\x\"}", false},
        {"{\"a\":\"\t\"}", false},
        {"{\"a\":01}", false},
        {"{\"a\":-0.5e+3}", true},
        {"{\"a\":tru}", false},
        {"{\"a\":1,}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_MSG(full(g, cases[i].s) == cases[i].ok, "json_object: '%s'", cases[i].s);
    char run[64];
    snprintf(run, sizeof run, "{\n%*s}", GSCHEMA_MAX_WS - 1, "");
    CHECK(full(g, run));
    snprintf(run, sizeof run, "{\n%*s}", GSCHEMA_MAX_WS, "");
    CHECK(!full(g, run));
    char deep[200]; /* 64 containers nest, 65 do not */
    for (int d = 64; d <= 65; d++) {
        int k = 0;
        deep[k++] = '{';
        deep[k++] = '"';
        deep[k++] = 'a';
        deep[k++] = '"';
        deep[k++] = ':';
        for (int i = 1; i < d; i++) deep[k++] = '[';
        for (int i = 1; i < d; i++) deep[k++] = ']';
        deep[k++] = '}';
        deep[k] = 0;
        CHECK_MSG(full(g, deep) == (d == 64), "nesting %d", d);
    }
    grammar_free(g);
}

static void test_with_engine(void)
{
    test_int_ranges();
    test_num_ranges();
    test_regex_vs_posix();
    test_json_object_policy();
}
#endif

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--schema") == 0) return tool_schema(argv[2]);
    if (argc == 4 && strcmp(argv[1], "--regex") == 0) return tool_regex(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "--check") == 0) {
#if HAVE_ENGINE
        return tool_check(argv[2], argv[3]);
#else
        fprintf(stderr, "built without the grammar engine (engine/grammar.h)\n");
        return 77;
#endif
    }
    test_refusals();
    test_accepted();
    test_regex_refusals();
    test_alloc_failures();
#if HAVE_ENGINE
    test_with_engine();
#endif
    return tu_finish();
}
