/* test_grammar_json.c — JSON outputs (response_format json_object and
 * json_schema) through the grammar engine: the GBNF grammar_schema.h writes,
 * compiled by grammar.h. Ported from test_jsonmode.c (the byte recogniser
 * it replaced), its cases kept as the regression net of the whitespace
 * policy: the same texts must be accepted and refused as before.
 *
 * The recogniser against a separate recursive-descent validator written
 * here: on hand-picked cases, on random objects (every prefix must be
 * accepted, the whole complete) and on random one-byte mutations of them
 * (complete exactly when the validator says the text is one JSON object).
 * Then, with the default model's tokenizer, the sampler under the grammar
 * drawing from random logits: every output that ends is one JSON object
 * (the schema's), and every token it takes keeps the output a prefix of
 * one. Skips the tokenizer part without $KVB_MODEL.
 *
 * What changed: strings hold valid UTF-8 only (GBNF's characters are code
 * points; jsonmode let any byte through and the output writer replaced
 * it). The schema
 * subset grew (grammar_schema.h): what jsonmode refused and is now held is
 * checked to compile. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "base/rng.h"
#include "engine/grammar.h"
#include "engine/grammar_schema.h"
#include "engine/sampler.h"
#include "jobs/job.h"
#include "support/testutil.h"

/* The whitespace policy (grammar_schema.h, as jsonmode.h had it). */
#define JSON_MAX_WS GSCHEMA_MAX_WS /* consecutive whitespace bytes outside strings */
#define JSON_MAX_LEAD_WS 1         /* before the object */
#define JSONV_MAX_DEPTH 64         /* the validator's nesting bound (the generator stays far below it) */
#include "text/tok.h"

/* ---- an independent validator: is s[0..n) exactly one JSON object, with at
 * most JSON_MAX_WS whitespace bytes in a row outside strings, nesting at
 * most JSONV_MAX_DEPTH, nothing after the object? ---------------------- */

struct rd {
    const unsigned char *s;
    size_t n, i;
    int depth;
};

/* Whitespace as JSON mode allows it: before the object, at most
 * JSON_MAX_LEAD_WS bytes; after a colon, at most one space; elsewhere
 * at most one newline with spaces or tabs, JSON_MAX_WS bytes in all;
 * never a carriage return. */
static bool rd_ws_max(struct rd *r, int max)
{
    int k = 0, nl = 0;
    while (r->i < r->n && strchr(" \t\n\r", r->s[r->i]) && r->s[r->i]) {
        if (r->s[r->i] == '\r' || (r->s[r->i] == '\n' && ++nl > 1)) return false;
        r->i++;
        if (++k > max) return false;
    }
    return true;
}

static bool rd_ws(struct rd *r) { return rd_ws_max(r, JSON_MAX_WS); }

static bool rd_after_colon(struct rd *r)
{
    if (r->i < r->n && r->s[r->i] == ' ') r->i++;
    return r->i >= r->n || !strchr(" \t\n\r", r->s[r->i]) || !r->s[r->i];
}

static bool rd_lit(struct rd *r, const char *w)
{
    size_t m = strlen(w);
    if (r->n - r->i < m || memcmp(r->s + r->i, w, m) != 0) return false;
    r->i += m;
    return true;
}

static bool rd_string(struct rd *r)
{
    if (r->i >= r->n || r->s[r->i] != '"') return false;
    r->i++;
    while (r->i < r->n) {
        unsigned char c = r->s[r->i++];
        if (c == '"') return true;
        if (c < 0x20) return false;
        if (c >= 0x80) { /* the grammar's characters are code points: only valid UTF-8 (jsonmode took any byte) */
            size_t bad;
            const size_t len = json_utf8_seq(r->s + r->i - 1, r->n - r->i + 1, &bad);
            if (len == 0) return false;
            r->i += len - 1;
            continue;
        }
        if (c != '\\') continue;
        if (r->i >= r->n) return false;
        c = r->s[r->i++];
        if (c == 'u') {
            for (int k = 0; k < 4; k++, r->i++)
                if (r->i >= r->n || !strchr("0123456789abcdefABCDEF", r->s[r->i]) || !r->s[r->i]) return false;
        } else if (!c || !strchr("\"\\/bfnrt", c)) {
            return false;
        }
    }
    return false;
}

static bool digits(struct rd *r)
{
    size_t a = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    return r->i > a;
}

static bool rd_number(struct rd *r)
{
    if (r->i < r->n && r->s[r->i] == '-') r->i++;
    if (r->i < r->n && r->s[r->i] == '0') r->i++;
    else if (!(r->i < r->n && r->s[r->i] >= '1' && r->s[r->i] <= '9') || !digits(r)) return false;
    if (r->i < r->n && r->s[r->i] == '.') {
        r->i++;
        if (!digits(r)) return false;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (!digits(r)) return false;
    }
    return true;
}

static bool rd_value(struct rd *r);

static bool rd_container(struct rd *r, bool array)
{
    if (++r->depth > JSONV_MAX_DEPTH) return false;
    r->i++; /* { or [ */
    if (!rd_ws(r)) return false;
    const unsigned char close = array ? ']' : '}';
    if (r->i < r->n && r->s[r->i] == close) {
        r->i++;
        r->depth--;
        return true;
    }
    for (;;) {
        if (!array) {
            if (!rd_string(r) || r->i >= r->n || r->s[r->i++] != ':' || !rd_after_colon(r)) return false;
        }
        if (!rd_value(r) || !rd_ws(r) || r->i >= r->n) return false;
        unsigned char c = r->s[r->i++];
        if (c == close) break;
        if (c != ',' || !rd_ws(r)) return false;
    }
    r->depth--;
    return true;
}

static bool rd_value(struct rd *r)
{
    if (r->i >= r->n) return false;
    switch (r->s[r->i]) {
    case '{': return rd_container(r, false);
    case '[': return rd_container(r, true);
    case '"': return rd_string(r);
    case 't': return rd_lit(r, "true");
    case 'f': return rd_lit(r, "false");
    case 'n': return rd_lit(r, "null");
    default: return rd_number(r);
    }
}

static bool is_object(const char *s, size_t n)
{
    struct rd r = {(const unsigned char *)s, n, 0, 0};
    return rd_ws_max(&r, JSON_MAX_LEAD_WS) && r.i < n && s[r.i] == '{' && rd_container(&r, false) && r.i == n;
}

static struct grammar *g_object; /* json_object's grammar, compiled in main */

static struct grammar *compile_gbnf_of(const char *schema, size_t len)
{
    struct kvb_buf b = {0};
    char path[128] = "", msg[320] = "";
    enum kvb_status st = gschema_to_gbnf(schema, len, "schema", &b, path, sizeof path, msg, sizeof msg);
    CHECK_MSG(st == KVB_OK, "%s: %s", path, msg);
    struct grammar *g = NULL;
    if (st == KVB_OK) {
        st = grammar_compile(b.data, b.len, &g, msg, sizeof msg);
        CHECK_MSG(st == KVB_OK, "the GBNF of [%s]: %s", schema ? schema : "json_object", msg);
    }
    kvb_buf_free(&b);
    return g;
}

static int recognise_g(const struct grammar *g, const char *s, size_t n)
{
    enum grammar_match m = grammar_check(g, s, n);
    return m == GRAMMAR_FULL ? 1 : m == GRAMMAR_PREFIX ? 0 : -1;
}

/* What the recogniser makes of s: -1 rejected, 0 a prefix, 1 complete. */
static int recognise(const char *s, size_t n) { return recognise_g(g_object, s, n); }

static void test_cases(void)
{
    static const struct {
        const char *s;
        int want; /* -1 rejected, 0 prefix, 1 complete */
    } cases[] = {
        {"{}", 1},
        {" { }", 1},
        {"\n{}", 1},
        {" \n{}", -1},
        {"{\"a\" :1}", -1},
        {"{\"a\":  1}", -1},
        {"{\"a\":\n1}", -1},
        {"{\n\n}", -1},
        {"{\r\n}", -1},
        {"{\n\t\"a\": [\n  1,\n  2\n ]\n}", 1},
        {"{\"a\":1}", 1},
        {"{\"a\": [1, 2.5, -0.5e+3, true, false, null, \"x\"]}", 1},
        {"{\"k\":{\"n\":{}}}", 1},
        {"{\"e\":\"\\u00e9\\n\\\"\\\\\\/\"}", 1},
        {"{\"a\":0}", 1},
        {"{\"a\":-0}", 1},
        {"{\"a\":1E5}", 1},
        {"{\"\xc3\xa9\":\"\xe6\x97\xa5\"}", 1},
        {"{\"a\":[]}", 1},
        {"{\"a\":[[],{}]}", 1},
        {"{", 0},
        {"{\"a", 0},
        {"{\"a\":", 0},
        {"{\"a\":1", 0},
        {"{\"a\":1.", 0},
        {"{\"a\":tr", 0},
        {"{\"a\":\"\\u00", 0},
        {"{\"a\":1e", 0},
        {"{\"a\":-", 0},
        {"", 0},
        {" ", 0},
        {"   ", -1},
        {"[]", -1},
        {"\"a\"", -1},
        {"1", -1},
        {"{}x", -1},
        {"{} ", -1},
        {"{,}", -1},
        {"{\"a\":1,}", -1},
        {"{\"a\":01}", -1},
        {"{\"a\":1.e3}", -1},
        {"{\"a\":.5}", -1},
        {"{\"a\":+1}", -1},
        {"{\"a\":tru}", -1},
        {"{\"a\":\"\\x\"}", -1},
        {"{\"a\":\"\t\"}", -1},
        {"{a:1}", -1},
        {"{\"a\" 1}", -1},
        {"{\"a\":1]", -1},
        {"{\"a\":[1}", -1},
        {"{\"a\":\"\\u12G4\"}", -1},
        {"{\"a\":NaN}", -1},
        {"{\"a\":1 2}", -1},
        {"{}{}", -1},
        {"```json\n{}", -1},
        {"{\"a\":--1}", -1},
        {"{\"a\":1e+}", -1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *s = cases[k].s;
        int got = recognise(s, strlen(s));
        CHECK_MSG(got == cases[k].want, "[%s]: %d, want %d", s, got, cases[k].want);
        CHECK_MSG(is_object(s, strlen(s)) == (cases[k].want == 1), "validator on [%s]", s);
    }
    /* Bounds: 64 levels and 24 whitespace bytes pass, one more does not. */
    char deep[300];
    size_t n = 0;
    deep[n++] = '{';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    deep[n++] = ':';
    for (int d = 1; d < GSCHEMA_MAX_DEPTH; d++) deep[n++] = '[';
    CHECK(recognise(deep, n) == 0);
    deep[n++] = '[';
    CHECK(recognise(deep, n) == -1);
    char ws[200];
    memset(ws, ' ', sizeof ws);
    CHECK(recognise(ws, JSON_MAX_LEAD_WS) == 0);
    CHECK(recognise(ws, JSON_MAX_LEAD_WS + 1) == -1);
    ws[0] = '{';
    CHECK(recognise(ws, JSON_MAX_WS + 1) == 0); /* inside the object: the longer bound */
    CHECK(recognise(ws, JSON_MAX_WS + 2) == -1);
    printf("cases: %zu hand-picked texts, depth and whitespace bounds\n", sizeof cases / sizeof cases[0]);
}

/* ---- random objects ------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) { return (uint32_t)(kvb_xorshift64(&rng) % n); }

struct buf {
    char s[4096];
    size_t n;
};

static void put(struct buf *b, const char *t)
{
    size_t m = strlen(t);
    if (b->n + m < sizeof b->s) {
        memcpy(b->s + b->n, t, m);
        b->n += m;
    }
}

static void gen_ws(struct buf *b)
{
    static const char *const w[] = {"", "", "", " ", "\n", "\n  ", "\t", "\n\t\t"};
    put(b, w[rnd(8)]);
}

static void gen_string(struct buf *b)
{
    static const char *const parts[] = {
        "a", "key", " ", "\\n", "\\\"", "\\\\", "\\u00e9", "\\uD83D\\uDE00", "\xc3\xa9", "\xf0\x9f\x98\x80",
        "/", "\\/", "0", "{",   "]",    ":"};
    put(b, "\"");
    for (int k = (int)rnd(5); k > 0; k--) put(b, parts[rnd(16)]);
    put(b, "\"");
}

static void gen_value(struct buf *b, int depth);

static void gen_container(struct buf *b, int depth, bool array)
{
    put(b, array ? "[" : "{");
    gen_ws(b);
    int n = depth > 5 ? 0 : (int)rnd(4);
    for (int k = 0; k < n; k++) {
        if (k) {
            put(b, ",");
            gen_ws(b);
        }
        if (!array) {
            gen_string(b);
            put(b, rnd(2) ? ":" : ": ");
        }
        gen_value(b, depth + 1);
        gen_ws(b);
    }
    put(b, array ? "]" : "}");
}

static void gen_value(struct buf *b, int depth)
{
    static const char *const nums[] = {"0", "-0", "7", "-12", "3.25", "1e9", "-2.5E-3", "10e+2", "0.0", "123456789"};
    switch (rnd(8)) {
    case 0: gen_container(b, depth, false); break;
    case 1: gen_container(b, depth, true); break;
    case 2:
    case 3: gen_string(b); break;
    case 4:
    case 5: put(b, nums[rnd(10)]); break;
    default: put(b, rnd(3) == 0 ? "true" : rnd(2) ? "false" : "null"); break;
    }
}

static void test_random(void)
{
    int n_ok = 0, n_mut = 0, n_mut_complete = 0;
    for (int it = 0; it < 3000; it++) {
        struct buf b = {.n = 0};
        if (rnd(2)) put(&b, rnd(2) ? " " : "\n");
        gen_container(&b, 0, false);
        CHECK_MSG(is_object(b.s, b.n), "generator made a non-object: [%.*s]", (int)b.n, b.s);
        struct grammar_matcher *st = NULL;
        CHECK(grammar_matcher_create(g_object, NULL, &st) == KVB_OK);
        bool fine = st != NULL;
        for (size_t i = 0; i < b.n && fine; i++) {
            fine = grammar_matcher_feed(st, b.s + i, 1) && (i + 1 == b.n || !grammar_matcher_complete(st));
        }
        CHECK_MSG(fine && grammar_matcher_complete(st), "[%.*s] not recognised", (int)b.n, b.s);
        grammar_matcher_free(st);
        n_ok += fine;
        /* Mutations: a byte replaced, inserted or removed. */
        static const char alphabet[] = "{}[]\",:0123456789-+.eEtrufalsn \n\\u\x01\xc3";
        for (int m = 0; m < 4; m++) {
            struct buf c = b;
            size_t at = rnd((uint32_t)c.n);
            int kind = (int)rnd(3);
            char ch = alphabet[rnd(sizeof alphabet - 1)];
            if (kind == 0) {
                c.s[at] = ch;
            } else if (kind == 1 && c.n + 1 < sizeof c.s) {
                memmove(c.s + at + 1, c.s + at, c.n - at);
                c.s[at] = ch;
                c.n++;
            } else if (c.n > 1) {
                memmove(c.s + at, c.s + at + 1, c.n - at - 1);
                c.n--;
            }
            const bool valid = is_object(c.s, c.n);
            const int got = recognise(c.s, c.n);
            CHECK_MSG((got == 1) == valid, "mutated [%.*s]: recogniser %d, validator %d", (int)c.n, c.s, got, valid);
            n_mut++;
            n_mut_complete += valid;
        }
    }
    printf("random: %d objects recognised byte by byte; %d mutations agree with the validator (%d still objects)\n",
           n_ok, n_mut, n_mut_complete);
}

/* ---- schemas ------------------------------------------------------------------ */

static struct grammar *compile_schema(const char *text) { return compile_gbnf_of(text, strlen(text)); }

static const char PERSON[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"city\":{\"enum\":[\"Paris\",\"Rome\",\"Par\",null]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"string\"},\"minItems\":1,\"maxItems\":2},\"extra\":{\"type\":\"object\"},\"score\":{\"type\":[\"number\","
    "\"null\"]},\"any\":{},\"pets\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":"
    "{\"kind\":{\"const\":\"cat\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"kind\"]}}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static int recognise_with_n(const struct grammar *sc, const char *s, size_t n) { return recognise_g(sc, s, n); }

static int recognise_with(const struct grammar *sc, const char *s) { return recognise_with_n(sc, s, strlen(s)); }

/* Whether the schema compiler refuses text (KVB_ERR_FORMAT or
 * KVB_ERR_UNSUPPORTED), with the field in path and the reason in msg. */
static bool schema_refused(const char *text, size_t len, const char *at, char *path, size_t path_cap, char *msg,
                           size_t msg_cap)
{
    struct kvb_buf b = {0};
    enum kvb_status st = gschema_to_gbnf(text, len, at, &b, path, path_cap, msg, msg_cap);
    kvb_buf_free(&b);
    return st == KVB_ERR_FORMAT || st == KVB_ERR_UNSUPPORTED;
}

/* Refused schemas name the keyword or field, under the path given. */
static void test_schema_refusals(void)
{
    static const struct {
        const char *schema, *part;
    } bad[] = {
        {"{\"type\":\"string\"}", "must describe an object"},
        {"{\"anyOf\":[]}", "'schema.anyOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}}}", "minItems"},
        {"{\"type\":\"objekt\"}", "must name JSON types"},
        {"{\"type\":\"object\",\"required\":\"a\"}", "array of names"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[\"x\"],\"const\":\"x\"}}}", "not both"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\",\"enum\":[\"x\"]}}}", "no value has"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"color\"}}}", "'color'"},
    };
    /* What jsonmode refused and the schema compiler now holds. */
    static const char *const held[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":true}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,2]}}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":[\"object\",\"null\"]}}}",
        "{\"type\":\"object\",\"properties\":{\"a\\\"b\":{}}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\"}}}",
    };
    for (size_t k = 0; k < sizeof held / sizeof held[0]; k++) {
        struct grammar *g = compile_schema(held[k]);
        CHECK_MSG(g != NULL, "[%s] not held", held[k]);
        grammar_free(g);
    }
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        struct grammar *b = NULL;
        char path[128], msg[320] = "";
        CHECK_MSG(schema_refused(bad[k].schema, strlen(bad[k].schema), "schema", path, sizeof path, msg, sizeof msg) &&
                      !b && strstr(msg, bad[k].part),
                  "[%s] gave [%s]", bad[k].schema, msg);
    }
    { /* the error names the keyword's field under the path it was given */
        static const char bad_items[] =
            "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}}}";
        char path[128] = "", msg[320] = "";
        CHECK(schema_refused(bad_items, sizeof bad_items - 1, "body.response_format.json_schema.schema", path,
                             sizeof path, msg, sizeof msg));
        CHECK_MSG(strcmp(path, "body.response_format.json_schema.schema.properties.a.minItems") == 0, "path [%s]",
                  path);
        /* the job format keeps whatever was written: text that is no schema is refused here */
        CHECK(schema_refused("\"x\"", 3, "s", path, sizeof path, msg, sizeof msg));
        CHECK(schema_refused("{\"type\":", 9, "s", path, sizeof path, msg, sizeof msg) &&
              strstr(msg, "not valid JSON"));
    }
    printf("schemas: %zu refused\n", sizeof bad / sizeof bad[0]);
}

static void test_schema_cases(void)
{
    struct grammar *sc = compile_schema(PERSON);
    if (!sc) return;
    static const struct {
        const char *s;
        int want;
    } cases[] = {
        {"{\"name\":\"Ann\",\"age\":30}", 1},
        {"{\"age\": -4, \"name\": \"\\u00e9\"}", 1},        /* any order, escapes in values */
        {"{\"name\":\"A\",\"age\":1,\"city\":\"Par\"}", 1}, /* a literal that prefixes another */
        {"{\"name\":\"A\",\"age\":1,\"city\":\"Paris\"}", 1},
        {"{\"name\":\"A\",\"age\":1,\"city\":null}", 1},
        {"{\"name\":\"A\",\"age\":1,\"tags\":[\"x\",\"y\"]}", 1},
        {"{\"name\":\"A\",\"age\":1,\"extra\":{\"q\":[1,{\"r\":null}]}}", 1}, /* any object */
        {"{\"name\":\"A\",\"age\":1,\"any\":[true,{\"z\":1.5e3}]}", 1},       /* anything */
        {"{\"name\":\"A\",\"age\":1,\"score\":2.5}", 1},
        {"{\"name\":\"A\",\"age\":1,\"score\":null}", 1},
        {"{\"name\":\"A\",\"age\":1,\"pets\":[{\"kind\":\"cat\",\"ok\":true},{\"kind\":\"cat\"}]}", 1},
        {"{\"name\":\"A\",\"age\":1,\"pets\":[]}", 1},
        {"{\"name\":\"A\"", 0},
        {"{\"name\":\"A\",\"age\":1,\"city\":\"Pa", 0},
        {"{}", -1}, /* required missing */
        {"{\"name\":\"A\"}", -1},
        {"{\"nam\":", -1}, /* not a property */
        {"{\"names\"", -1},
        {"{\"na\\u006de\"", -1},             /* property names as written */
        {"{\"name\":1", -1},                 /* wrong type */
        {"{\"name\":\"A\",\"age\":1.5", -1}, /* integer */
        {"{\"name\":\"A\",\"age\":1e3", -1},
        {"{\"name\":\"A\",\"name\":", -1}, /* each property once */
        {"{\"name\":\"A\",\"age\":1,\"city\":\"Berlin\"", -1},
        {"{\"name\":\"A\",\"age\":1,\"city\":\"Pari\"}", -1},
        {"{\"name\":\"A\",\"age\":1,\"city\":true", -1},
        {"{\"name\":\"A\",\"age\":1,\"tags\":[]", -1},            /* minItems */
        {"{\"name\":\"A\",\"age\":1,\"tags\":[\"a\",\"b\",", -1}, /* maxItems */
        {"{\"name\":\"A\",\"age\":1,\"tags\":[1", -1},
        {"{\"name\":\"A\",\"age\":1,\"extra\":[", -1},
        {"{\"name\":\"A\",\"age\":1,\"score\":\"x", -1},
        {"{\"name\":\"A\",\"age\":1,\"pets\":[{\"ok\":true}", -1}, /* nested required */
        {"{\"name\":\"A\",\"age\":1,\"pets\":[{\"kind\":\"dog\"", -1},
        {"{\"name\":\"A\",\"age\":1,\"other\":", -1}, /* additionalProperties false */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int got = recognise_with(sc, cases[k].s);
        CHECK_MSG(got == cases[k].want, "schema [%s]: %d, want %d", cases[k].s, got, cases[k].want);
    }
    /* Every property given: only the closer may follow. */
    const char *full = "{\"name\":\"A\",\"age\":1,\"city\":null,\"tags\":[\"t\"],\"extra\":{},\"score\":1,"
                       "\"any\":0,\"pets\":[]";
    char buf[256];
    snprintf(buf, sizeof buf, "%s,", full);
    CHECK(recognise_with(sc, full) == 0 && recognise_with(sc, buf) == -1);
    grammar_free(sc);

    /* Found in review: enum and type together (the type rules values out),
     * additionalProperties false without properties (only {}), an empty
     * property name. */
    static const struct {
        const char *schema, *text;
        int want;
    } more[] = {
        {"{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\",\"enum\":[\"red\",null]}}}", "{\"c\":null",
         -1},
        {"{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\",\"enum\":[\"red\",null]}}}",
         "{\"c\":\"red\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"object\",\"additionalProperties\":false}}}",
         "{\"m\":{}}", 1},
        {"{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"object\",\"additionalProperties\":false}}}",
         "{\"m\":{\"", -1},
        {"{\"type\":\"object\",\"properties\":{}}", "{}", 1},
        {"{\"type\":\"object\",\"properties\":{}}", "{\"", -1},
        {"{\"type\":\"object\",\"properties\":{\"\":{\"type\":\"string\"}}}", "{\"\":\"x\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"object\"}}}", "{\"m\":{\"any\":[1]}}", 1},
    };
    for (size_t k = 0; k < sizeof more / sizeof more[0]; k++) {
        struct grammar *m = compile_schema(more[k].schema);
        if (!m) continue;
        const int got = recognise_with(m, more[k].text);
        CHECK_MSG(got == more[k].want, "[%s] under [%s]: %d, want %d", more[k].text, more[k].schema, got, more[k].want);
        grammar_free(m);
    }
    printf("schemas: %zu texts against one schema, %zu against others\n", sizeof cases / sizeof cases[0],
           sizeof more / sizeof more[0]);
}

/* ---- the sampler in JSON mode on the real vocabulary ------------------------ */

static void test_sampling(const struct tok *t, const struct grammar *sc)
{
    struct grammar_vocab *v = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(grammar_vocab_create(t, &v, &err) == KVB_OK, "%s", err.msg);
    if (!v) return;
    const int32_t n_vocab = tok_n_vocab(t);
    float *logits = kvb_malloc(sizeof(float) * (size_t)n_vocab);
    /* One-byte tokens that close strings and containers, or make numbers:
     * pushed up now and then so that outputs end within the step budget. */
    int32_t structural[32];
    int n_structural = 0;
    for (int32_t i = 0; i < n_vocab && n_structural < 32; i++) {
        char piece[8];
        if (tok_piece(t, i, false, piece, sizeof piece) == 1 && strchr("\"}],:0123456789", piece[0]) && piece[0])
            structural[n_structural++] = i;
    }
    int ended = 0, runs = 0;
    for (int run = 0; run < 16; run++, runs++) {
        struct sampler_params p;
        sampler_params_default(&p);
        p.temperature = run % 4 == 0 ? 0.0f : 1.0f;
        p.top_k = run % 3 == 1 ? 40 : 0;
        p.seed = (uint64_t)run;
        p.grammar = sc ? sc : g_object;
        p.gvocab = v;
        CHECK(!sampler_is_greedy(&p));
        struct sampler *s = NULL;
        CHECK(sampler_create(&p, n_vocab, &s) == KVB_OK);
        if (!s) break;
        char out[8192];
        size_t n_out = 0;
        bool eog = false;
        for (int step = 0; step < 400 && !eog; step++) {
            /* Noise, with the end of generation and structural bytes made
             * likely now and then, so outputs both end and nest. */
            for (int32_t i = 0; i < n_vocab; i++) logits[i] = (float)rnd(1000) / 100.0f;
            if (step > 20 && rnd(4) == 0)
                for (int32_t i = 0; i < n_vocab; i++)
                    if (tok_is_eog(t, i)) logits[i] = 40.0f;
            if (sc && rnd(2) == 0)
                for (int k = 0; k < n_structural; k++) logits[structural[k]] += 12.0f;
            int32_t tok = -1;
            CHECK(sampler_sample(s, logits, &tok) == KVB_OK);
            if (tok < 0) break;
            sampler_accept(s, tok);
            if (tok_is_eog(t, tok)) {
                eog = true;
                break;
            }
            char piece[256];
            size_t len = tok_piece(t, tok, false, piece, sizeof piece);
            CHECK_MSG(len > 0, "token %d has no bytes", tok);
            if (n_out + len > sizeof out) break;
            memcpy(out + n_out, piece, len);
            n_out += len;
            CHECK_MSG(sc ? recognise_with_n(sc, out, n_out) >= 0 : recognise(out, n_out) >= 0,
                      "run %d: [%.*s] is no prefix of an object", run, (int)n_out, out);
        }
        if (eog) {
            ended++;
            CHECK_MSG(is_object(out, n_out), "run %d ended on [%.*s]", run, (int)n_out, out);
            if (sc)
                CHECK_MSG(recognise_with_n(sc, out, n_out) == 1, "run %d ended on [%.*s], not the schema's", run,
                          (int)n_out, out);
        }
        sampler_free(s);
    }
    printf("sampling%s: %d of %d runs on random logits ended, each on one JSON object%s\n", sc ? " (schema)" : "",
           ended, runs, sc ? " the schema allows" : "");
    CHECK(ended > 0);
    kvb_free(logits);
    grammar_vocab_free(v);
}

int main(void)
{
    g_object = compile_gbnf_of(NULL, 0);
    if (!g_object) return tu_finish();
    test_cases();
    test_random();
    test_schema_cases();
    test_schema_refusals();
    bool absent = false;
    struct tok *t = tu_model_tokenizer(&absent);
    if (absent) printf("tokenizer part skipped: KVB_MODEL not present\n");
    if (t) {
        test_sampling(t, NULL);
        struct grammar *sc = compile_schema(PERSON);
        if (sc) test_sampling(t, sc);
        grammar_free(sc);
    }
    tok_free(t);
    grammar_free(g_object);
    return tu_finish();
}
