/* test_jsonmode.c — JSON mode (response_format json_object).
 *
 * The byte recogniser against a separate recursive-descent validator written
 * here: on hand-picked cases, on random objects (every prefix must be
 * accepted, the whole complete) and on random one-byte mutations of them
 * (complete exactly when the validator says the text is one JSON object).
 * Then, with the default model's tokenizer, the sampler in JSON mode drawing
 * from random logits: every output that ends is one JSON object, and every
 * token it takes keeps the output a prefix of one. Skips the tokenizer part
 * without $KVB_MODEL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "jsonmode.h"
#include "sampler.h"
#include "testutil.h"
#include "tok.h"

/* ---- an independent validator: is s[0..n) exactly one JSON object, with at
 * most JSONMODE_MAX_WS whitespace bytes in a row outside strings, nesting at
 * most JSONMODE_MAX_DEPTH, nothing after the object? ---------------------- */

struct rd {
    const unsigned char *s;
    size_t n, i;
    int depth;
};

static bool rd_ws(struct rd *r)
{
    int k = 0;
    while (r->i < r->n && strchr(" \t\n\r", r->s[r->i]) && r->s[r->i]) {
        r->i++;
        if (++k > JSONMODE_MAX_WS) return false;
    }
    return true;
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
    if (++r->depth > JSONMODE_MAX_DEPTH) return false;
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
            if (!rd_string(r) || !rd_ws(r) || r->i >= r->n || r->s[r->i++] != ':' || !rd_ws(r)) return false;
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
    return rd_ws(&r) && r.i < n && s[r.i] == '{' && rd_container(&r, false) && r.i == n;
}

/* What the recogniser makes of s: -1 rejected, 0 a prefix, 1 complete. */
static int recognise(const char *s, size_t n)
{
    struct jsonmode_state st;
    jsonmode_init(&st);
    if (!jsonmode_feed(&st, s, n)) return -1;
    return jsonmode_complete(&st) ? 1 : 0;
}

static void test_cases(void)
{
    static const struct {
        const char *s;
        int want; /* -1 rejected, 0 prefix, 1 complete */
    } cases[] = {
        {"{}", 1}, {" \n{ }", 1}, {"{\"a\":1}", 1}, {"{\"a\": [1, 2.5, -0.5e+3, true, false, null, \"x\"]}", 1},
        {"{\"k\":{\"n\":{}}}", 1}, {"{\"e\":\"\\u00e9\\n\\\"\\\\\\/\"}", 1}, {"{\"a\":0}", 1}, {"{\"a\":-0}", 1},
        {"{\"a\":1E5}", 1}, {"{\"\xc3\xa9\":\"\xe6\x97\xa5\"}", 1}, {"{\"a\":[]}", 1}, {"{\"a\":[[],{}]}", 1},
        {"{", 0}, {"{\"a", 0}, {"{\"a\":", 0}, {"{\"a\":1", 0}, {"{\"a\":1.", 0}, {"{\"a\":tr", 0},
        {"{\"a\":\"\\u00", 0}, {"{\"a\":1e", 0}, {"{\"a\":-", 0}, {"", 0}, {"   ", 0},
        {"[]", -1}, {"\"a\"", -1}, {"1", -1}, {"{}x", -1}, {"{} ", -1}, {"{,}", -1}, {"{\"a\":1,}", -1},
        {"{\"a\":01}", -1}, {"{\"a\":1.e3}", -1}, {"{\"a\":.5}", -1}, {"{\"a\":+1}", -1}, {"{\"a\":tru}", -1},
        {"{\"a\":\"\\x\"}", -1}, {"{\"a\":\"\t\"}", -1}, {"{a:1}", -1}, {"{\"a\" 1}", -1}, {"{\"a\":1]", -1},
        {"{\"a\":[1}", -1}, {"{\"a\":\"\\u12G4\"}", -1}, {"{\"a\":NaN}", -1}, {"{\"a\":1 2}", -1}, {"{}{}", -1},
        {"```json\n{}", -1}, {"{\"a\":--1}", -1}, {"{\"a\":1e+}", -1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *s = cases[k].s;
        int got = recognise(s, strlen(s));
        CHECK_MSG(got == cases[k].want, "[%s]: %d, want %d", s, got, cases[k].want);
        CHECK_MSG(is_object(s, strlen(s)) == (cases[k].want == 1), "validator on [%s]", s);
    }
    /* Bounds: 64 levels and 64 whitespace bytes pass, one more does not. */
    char deep[300];
    size_t n = 0;
    deep[n++] = '{';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    deep[n++] = ':';
    for (int d = 1; d < JSONMODE_MAX_DEPTH; d++) deep[n++] = '[';
    CHECK(recognise(deep, n) == 0);
    deep[n++] = '[';
    CHECK(recognise(deep, n) == -1);
    char ws[200];
    memset(ws, ' ', sizeof ws);
    CHECK(recognise(ws, JSONMODE_MAX_WS) == 0);
    CHECK(recognise(ws, JSONMODE_MAX_WS + 1) == -1);
    ws[JSONMODE_MAX_WS] = '{';
    CHECK(recognise(ws, JSONMODE_MAX_WS + 1) == 0);
    printf("cases: %zu hand-picked texts, depth and whitespace bounds\n", sizeof cases / sizeof cases[0]);
}

/* ---- random objects ------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

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
    static const char *const w[] = {"", "", "", " ", "\n", "\n  ", "\t", "\r\n"};
    put(b, w[rnd(8)]);
}

static void gen_string(struct buf *b)
{
    static const char *const parts[] = {"a", "key", " ", "\\n", "\\\"", "\\\\", "\\u00e9", "\\uD83D\\uDE00",
                                        "\xc3\xa9", "\xf0\x9f\x98\x80", "/", "\\/", "0", "{", "]", ":"};
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
            gen_ws(b);
            put(b, ":");
            gen_ws(b);
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
    case 2: case 3: gen_string(b); break;
    case 4: case 5: put(b, nums[rnd(10)]); break;
    default: put(b, rnd(3) == 0 ? "true" : rnd(2) ? "false" : "null"); break;
    }
}

static void test_random(void)
{
    int n_ok = 0, n_mut = 0, n_mut_complete = 0;
    for (int it = 0; it < 3000; it++) {
        struct buf b = {.n = 0};
        gen_ws(&b);
        gen_container(&b, 0, false);
        CHECK_MSG(is_object(b.s, b.n), "generator made a non-object: [%.*s]", (int)b.n, b.s);
        struct jsonmode_state st;
        jsonmode_init(&st);
        bool fine = true;
        for (size_t i = 0; i < b.n && fine; i++) {
            fine = jsonmode_feed(&st, b.s + i, 1) && (i + 1 == b.n || !jsonmode_complete(&st));
        }
        CHECK_MSG(fine && jsonmode_complete(&st), "[%.*s] not recognised", (int)b.n, b.s);
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

/* ---- the sampler in JSON mode on the real vocabulary ------------------------ */

static void test_sampling(const struct tok *t)
{
    struct jsonmode_vocab *v = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(jsonmode_vocab_create(t, &v, &err) == KVB_OK, "%s", err.msg);
    if (!v) return;
    const int32_t n_vocab = tok_n_vocab(t);
    float *logits = kvb_malloc(sizeof(float) * (size_t)n_vocab);
    int ended = 0, runs = 0;
    for (int run = 0; run < 24; run++, runs++) {
        struct sampler_params p;
        sampler_params_default(&p);
        p.temperature = run % 4 == 0 ? 0.0f : 1.0f;
        p.top_k = run % 3 == 1 ? 40 : 0;
        p.seed = (uint64_t)run;
        p.json = v;
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
            CHECK_MSG(recognise(out, n_out) >= 0, "run %d: [%.*s] is no prefix of an object", run, (int)n_out, out);
        }
        if (eog) {
            ended++;
            CHECK_MSG(is_object(out, n_out), "run %d ended on [%.*s]", run, (int)n_out, out);
        }
        sampler_free(s);
    }
    printf("sampling: %d of %d runs on random logits ended, each on one JSON object\n", ended, runs);
    CHECK(ended > 0);
    kvb_free(logits);
    jsonmode_vocab_free(v);
}

int main(void)
{
    test_cases();
    test_random();
    bool absent = false;
    struct tok *t = tu_model_tokenizer(&absent);
    if (absent) printf("tokenizer part skipped: KVB_MODEL not present\n");
    if (t) test_sampling(t);
    tok_free(t);
    return tu_finish();
}
