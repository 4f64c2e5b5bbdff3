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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0.5}}}", "whole numbers"},
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
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":[{}]}}}", "prefixItems"},
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

#if HAVE_ENGINE
#include "grammar_schema_engine.inc"
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
#if HAVE_ENGINE
    test_with_engine();
#endif
    return tu_finish();
}
