/* test_tokenizer.c — the tokenizer against the reference's published test
 * vectors: for every NAME.gguf in $KVB_TESTDATA/tokenizer (fetched by
 * scripts/fetch-testdata.sh from llama.cpp's sources), each input of
 * NAME.gguf.inp must encode (no BOS/EOS, special-token text as plain text)
 * to exactly the ids on its line of NAME.gguf.out. Also: decode(encode(x))
 * == x, special-token parsing, end-of-generation ids, the streaming decoder,
 * and refusal of tokenizers kvbatch does not implement. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "model/gguf.h"
#include "support/gguf_write.h"
#include "support/testutil.h"
#include "text/tok.h"
#include "text/tok_pre.h"

static const char k_sep[] = "\n__ggml_vocab_test__\n";

/* Prints s with control and non-ASCII bytes escaped, at most 120 bytes. */
static void print_escaped(const char *s, size_t n)
{
    fputc('"', stderr);
    for (size_t i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c == '\t') fputs("\\t", stderr);
        else if (c < 0x20 || c >= 0x7F) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputs(n > 120 ? "\"..." : "\"", stderr);
}

static void print_ids(const char *what, const int32_t *v, size_t n)
{
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", v[i]);
    fputc('\n', stderr);
}

/* Parses one .out line ("" or " 1 2 3") into ids; returns the count. */
static size_t parse_ids(const char *line, size_t len, int32_t *out, size_t cap)
{
    size_t n = 0;
    char buf[16];
    size_t i = 0;
    while (i < len) {
        while (i < len && line[i] == ' ') i++;
        size_t b = 0;
        while (i < len && line[i] != ' ' && b < sizeof buf - 1) buf[b++] = line[i++];
        buf[b] = '\0';
        if (b && n < cap) out[n++] = (int32_t)strtol(buf, NULL, 10);
    }
    return n;
}

static int32_t *encode(const struct tok *t, const char *s, size_t len, unsigned flags, size_t *n)
{
    int32_t *ids = NULL;
    struct kvb_err err = {{0}};
    enum kvb_status st = tok_encode(t, s, len, flags, &ids, n, &err);
    CHECK_MSG(st == KVB_OK, "tok_encode: %s", err.msg);
    return ids;
}

static bool contains(const int32_t *v, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == id) return true;
    return false;
}

/* Runs every vector of one vocab; returns false when the vocab is missing. */
static void check_vectors(const char *dir, const char *name)
{
    char path[1600], inp_path[1700], out_path[1700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    size_t inp_len = 0, out_len = 0;
    char *inp = tu_read_file(inp_path, &inp_len);
    char *outs = tu_read_file(out_path, &out_len);
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(inp && outs, "%s: missing .inp/.out", name);
    CHECK_MSG(gguf_open(path, &f, &err) == KVB_OK, "%s: %s", name, err.msg);
    if (f) CHECK_MSG(tok_load(f, &t, &err) == KVB_OK, "%s: %s", name, err.msg);
    gguf_close(f); /* the tokenizer must not need the file any more */
    if (!inp || !outs || !t) goto done;

    size_t n_total = 0, n_pass = 0, n_rt = 0, n_rt_pass = 0;
    const char *p = inp, *end = inp + inp_len, *line = outs, *lend = outs + out_len;
    clock_t t0 = clock();
    for (;;) {
        const char *sep = strstr(p, k_sep);
        if (!sep || sep > end) break;
        size_t len = (size_t)(sep - p);
        const char *nl = memchr(line, '\n', (size_t)(lend - line));
        if (!nl) nl = lend;
        int32_t want[512];
        size_t n_want = parse_ids(line, (size_t)(nl - line), want, 512);
        size_t n_got = 0;
        int32_t *got = encode(t, p, len, 0, &n_got);
        n_total++;
        if (got && n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0) {
            n_pass++;
        } else if (n_total - n_pass <= 5) {
            fprintf(stderr, "%s: vector %zu mismatch\n    input: ", name, n_total);
            print_escaped(p, len);
            fputc('\n', stderr);
            print_ids("expected", want, n_want);
            print_ids("got     ", got, n_got);
        }
        /* decode(encode(x)) == x (all vectors are valid UTF-8) */
        char *back = NULL;
        size_t back_len = 0;
        if (got && tok_decode(t, got, n_got, &back, &back_len) == KVB_OK) {
            n_rt++;
            if (back_len == len && memcmp(back, p, len) == 0) {
                n_rt_pass++;
            } else if (n_rt - n_rt_pass <= 3) {
                fprintf(stderr, "%s: vector %zu does not round-trip\n    input: ", name, n_total);
                print_escaped(p, len);
                fputs("\n    back:  ", stderr);
                print_escaped(back, back_len);
                fputc('\n', stderr);
            }
        }
        kvb_free(back);
        kvb_free(got);
        p = sep + sizeof k_sep - 1;
        line = nl < lend ? nl + 1 : lend;
    }
    double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("%-28s %zu/%zu vectors exact, %zu/%zu round-trip (%.1f ms)\n", name, n_pass, n_total, n_rt_pass, n_rt, ms);
    CHECK(n_total > 0);
    CHECK_EQ_INT(n_pass, n_total);
    CHECK_EQ_INT(n_rt_pass, n_total);
done:
    tok_free(t);
    free(inp);
    free(outs);
}

static struct tok *load(const char *dir, const char *name)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    struct kvb_err err = {{0}};
    if (gguf_open(path, &f, &err) == KVB_OK) tok_load(f, &t, &err);
    gguf_close(f);
    CHECK_MSG(t != NULL, "%s: %s", name, err.msg);
    return t;
}

/* GPT-2: <|endoftext|> parsed or not, BOS/EOS, control pieces, bad UTF-8. */
static void specials_gpt2(const struct tok *g)
{
    const char *s = "a<|endoftext|>b";
    size_t n = 0;
    int32_t *ids = encode(g, s, strlen(s), TOK_PARSE_SPECIAL, &n);
    CHECK(ids && n == 3 && ids[1] == 50256);
    kvb_free(ids);
    ids = encode(g, s, strlen(s), 0, &n);
    CHECK(ids && n > 3 && !contains(ids, n, 50256));
    kvb_free(ids);
    CHECK(!tok_wants_bos(g));
    CHECK_EQ_INT(tok_eos(g), 50256);
    CHECK(tok_is_eog(g, 50256));
    CHECK(!tok_is_eog(g, 11));
    CHECK_EQ_INT(tok_find(g, "<|endoftext|>"), 50256);
    CHECK_EQ_INT(tok_find(g, "no such token text"), -1);
    ids = encode(g, "hi", 2, TOK_ADD_BOS | TOK_ADD_EOS, &n);
    CHECK(ids && n == 3 && ids[0] == 50256 && ids[2] == 50256);
    kvb_free(ids);
    /* rendering of a control token */
    char buf[32];
    CHECK_EQ_INT(tok_piece(g, 50256, false, buf, sizeof buf), 0);
    CHECK_EQ_INT(tok_piece(g, 50256, true, buf, sizeof buf), 13);
    CHECK(memcmp(buf, "<|endoftext|>", 13) == 0);
    /* invalid UTF-8 is read as U+FFFD per bad byte, as the reference does */
    int32_t *a = encode(g, "x\xff", 2, 0, &n);
    size_t m = 0;
    int32_t *b = encode(g, "x\xEF\xBF\xBD", 4, 0, &m);
    CHECK(a && b && n == m && memcmp(a, b, n * sizeof *a) == 0);
    kvb_free(a);
    kvb_free(b);
}

/* A long prompt must encode in well under a second. */
static void encode_speed_gpt2(const struct tok *g)
{
    size_t big_len = 0, n = 0;
    char *big = kvb_malloc(64 * 1024);
    while (big && big_len + 80 < 64 * 1024) {
        static const char k_para[] = "The quick brown fox jumps over 13 lazy dogs; naïve café, 東京 🚀!\n\t";
        memcpy(big + big_len, k_para, sizeof k_para - 1);
        big_len += sizeof k_para - 1;
    }
    clock_t t0 = clock();
    int32_t *ids = big ? encode(g, big, big_len, 0, &n) : NULL;
    double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("gpt-2: %zu bytes -> %zu tokens in %.2f ms\n", big_len, n, ms);
    CHECK(ids && n > 10000);
    CHECK_MSG(ms < 1000.0, "encoding took %.1f ms", ms);
    kvb_free(ids);
    kvb_free(big);
}

/* Llama SPM: BOS/EOS, and the dummy-prefix space after a special token. */
static void specials_llama_spm(const struct tok *l)
{
    CHECK(tok_wants_bos(l));
    CHECK_EQ_INT(tok_bos(l), 1);
    CHECK_EQ_INT(tok_eos(l), 2);
    CHECK(tok_is_eog(l, 2));
    size_t n = 0;
    int32_t *ids = encode(l, "Hello", 5, TOK_ADD_BOS, &n);
    CHECK(ids && n >= 2 && ids[0] == 1);
    kvb_free(ids);
    /* after a special token the dummy-prefix space is added again */
    const char *s = "a</s>b";
    ids = encode(l, s, strlen(s), TOK_PARSE_SPECIAL, &n);
    size_t na = 0, nb = 0;
    int32_t *ia = encode(l, "a", 1, 0, &na), *ib = encode(l, "b", 1, 0, &nb);
    CHECK(ids && ia && ib && n == na + 1 + nb && ids[na] == 2);
    if (ids && ia && ib && n == na + 1 + nb)
        CHECK(memcmp(ids, ia, na * 4) == 0 && memcmp(ids + na + 1, ib, nb * 4) == 0);
    kvb_free(ids);
    kvb_free(ia);
    kvb_free(ib);
}

/* Llama SPM: byte-fallback tokens, streamed and decoded. */
static void byte_fallback_llama_spm(const struct tok *l)
{
    /* byte fallback and the stream: an emoji split over <0xNN> tokens */
    const char *emoji = "\xF0\x9F\xA6\x99"; /* 🦙 */
    size_t n = 0;
    int32_t *ids = encode(l, emoji, 4, 0, &n);
    CHECK(ids != NULL);
    struct tok_stream ts;
    tok_stream_init(&ts, l);
    char *out = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; ids && i < n; i++) {
        size_t before = len;
        CHECK(tok_stream_push(l, &ts, ids[i], &out, &len, &cap) == KVB_OK);
        if (i > 0 && i + 1 < n) CHECK_EQ_INT(len, before); /* held back until complete */
    }
    CHECK(tok_stream_flush(l, &ts, &out, &len, &cap) == KVB_OK);
    CHECK(len == 4 && out && memcmp(out, emoji, 4) == 0);
    kvb_free(out);
    kvb_free(ids);
    /* an incomplete sequence at the very end becomes U+FFFD */
    int32_t b0 = tok_find(l, "<0xF0>"), b1 = tok_find(l, "<0x9F>"), hi = tok_find(l, "▁hi");
    CHECK(b0 >= 0 && b1 >= 0 && hi >= 0);
    int32_t seq[3] = {hi, b0, b1};
    char *txt = NULL;
    size_t tl = 0;
    CHECK(tok_decode(l, seq, 3, &txt, &tl) == KVB_OK);
    CHECK(txt && tl == 5 && memcmp(txt, "hi\xEF\xBF\xBD", 5) == 0);
    kvb_free(txt);
}

static void specials_phi3(const struct tok *p3)
{
    int32_t end = tok_find(p3, "<|end|>");
    CHECK(end >= 0 && tok_is_eog(p3, end));
    CHECK(tok_is_eog(p3, tok_find(p3, "<|endoftext|>")));
    /* Phi-3 strips white space after its special tokens */
    const char *s = "<|user|>\nHi<|end|>\n";
    size_t n = 0, nh = 0;
    int32_t *ids = encode(p3, s, strlen(s), TOK_PARSE_SPECIAL, &n);
    int32_t *hi = encode(p3, "Hi", 2, 0, &nh);
    CHECK(ids && hi && n == nh + 2 && ids[0] == tok_find(p3, "<|user|>") && ids[n - 1] == end);
    kvb_free(ids);
    kvb_free(hi);
}

/* StarCoder: a FIM special token only when asked to parse them. */
static void specials_starcoder(const struct tok *sc)
{
    size_t n = 0;
    const char *s = "<fim_prefix>x";
    int32_t *ids = encode(sc, s, strlen(s), TOK_PARSE_SPECIAL, &n);
    CHECK(ids && n >= 2 && ids[0] == 1);
    kvb_free(ids);
    ids = encode(sc, s, strlen(s), 0, &n);
    CHECK(ids && !contains(ids, n, 1));
    kvb_free(ids);
}

/* Special tokens, BOS/EOS, end of generation, on the real vocabularies. */
static void check_specials(const char *dir)
{
    struct tok *g = load(dir, "ggml-vocab-gpt-2.gguf");
    if (g) {
        specials_gpt2(g);
        encode_speed_gpt2(g);
    }
    tok_free(g);

    struct tok *l = load(dir, "ggml-vocab-llama-spm.gguf");
    if (l) {
        specials_llama_spm(l);
        byte_fallback_llama_spm(l);
    }
    tok_free(l);

    struct tok *p3 = load(dir, "ggml-vocab-phi-3.gguf");
    if (p3) specials_phi3(p3);
    tok_free(p3);

    struct tok *sc = load(dir, "ggml-vocab-starcoder.gguf");
    if (sc) specials_starcoder(sc);
    tok_free(sc);
}

/* clang-format off */ /* generated vectors: one per line */
/* Pre-tokenizer splits with no vocabulary vectors above (Llama 3, Qwen2, the
 * default split) checked word by word. Expected word lengths (in code points)
 * come from Python's `regex` module running the reference's regex lists,
 * chunk by chunk as the reference does. */
static const struct {
    enum tok_split split;
    const char *text;
    const char *lens;
} k_split_cases[] = {
    {TOK_SPLIT_DEFAULT, "Hello world", "5 6"},
    {TOK_SPLIT_DEFAULT, " Hello  world!  ", "6 1 6 1 2"},
    {TOK_SPLIT_DEFAULT, "I'm here, we'LL see 'RE 'Ve", "1 1 1 5 1 3 1 2 4 1 1 2 1 1 2"},
    {TOK_SPLIT_DEFAULT, "x'Re y'd", "1 1 2 2 1 1"},
    {TOK_SPLIT_DEFAULT, "123456789 1,234.5", "3 3 3 1 1 1 3 1 1"},
    {TOK_SPLIT_DEFAULT, "\x09""\x09""foo\x0A""\x0A""  bar  \x0A""", "1 1 3 3 4 3"},
    {TOK_SPLIT_DEFAULT, "a\x0D""\x0A""\x0D""\x0A"" b", "1 4 2"},
    {TOK_SPLIT_DEFAULT, "!!!\x0A""\x0A""?? \x0D""\x0A""", "3 2 2 3"},
    {TOK_SPLIT_DEFAULT, "3.14159e10", "1 1 3 2 1 2"},
    {TOK_SPLIT_DEFAULT, "\xC2""\xBD""\xC2""\xB2""\xC2""\xB3"" \xD9""\xA3""\xD9""\xA4""\xD9""\xA5""\xD9""\xA6""\xD9""\xA7"" \xE2""\x85""\xAB""", "3 1 5 1 1"},
    {TOK_SPLIT_DEFAULT, "a\xC2""\xA0""b x \xE3""\x80""\x80"" y\xE2""\x80""\xA8""z", "1 1 1 2 2 2 1 1"},
    {TOK_SPLIT_DEFAULT, "\xF0""\x9F""\x98""\x80""\xF0""\x9F""\x98""\x80"" \xF0""\x9F""\x9A""\x80""\xE2""\x80""\x8D""\xF0""\x9F""\x8C""\xAB""\xEF""\xB8""\x8F""", "2 5"},
    {TOK_SPLIT_DEFAULT, "\xC3""\xA9""\xCC""\x81""a \xC3""\x9F"" \xD0""\x96""\xD0""\xB6"" \xE4""\xB8""\xAD""\xE6""\x96""\x87"" \xE0""\xB8""\x81""\xE0""\xB8""\xB1""", "1 1 1 2 3 3 2 1"},
    {TOK_SPLIT_DEFAULT, "$+<=>^~|`@#%&*", "8 1 5"},
    {TOK_SPLIT_DEFAULT, "  \x1C""\x0B""\x0C""\xC2""\x85"" end", "1 2 3 4"},
    {TOK_SPLIT_DEFAULT, "'s's 'S'", "1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_DEFAULT, "1234567890123", "3 3 3 3 1"},
    {TOK_SPLIT_DEFAULT, "ab12cd345ef6789", "2 2 2 3 2 3 1"},
    {TOK_SPLIT_DEFAULT, "\xEF""\xBF""\xBD""/\xE2""\x80""\x8B""\xE2""\x80""\x94""#`[\xE2""\x80""\x8B""\xE3""\x80""\x80""''", "1 1 1 2 1 1 1 1 2"},
    {TOK_SPLIT_DEFAULT, "[%\x0C""\xC2""\x85""\xE2""\x80""\x9D""'M`5Em}\xE2""\x82""\xAC""\xE4""\xB8""\xAD""\x1C""Z", "2 2 2 1 1 1 2 1 1 1 1 1"},
    {TOK_SPLIT_DEFAULT, "+`\x7F""\xC2""\xB2""\xC2""\x85""\x7F""V\x0B""b\xF0""\x9F""\x98""\x80""{Ss", "1 2 1 1 1 1 1 1 1 1 2"},
    {TOK_SPLIT_DEFAULT, "'\xC7""\x85""\x0D""\xE2""\x80""\xA8""", "1 1 2"},
    {TOK_SPLIT_DEFAULT, "\xE2""\x80""\x94""#8|", "2 1 1"},
    {TOK_SPLIT_DEFAULT, "\xE2""\x80""\x8D""']\x0A""\x1C""4(a\xC3""\xA9""T@\x7F""2", "1 2 1 1 1 1 3 1 1 1"},
    {TOK_SPLIT_GPT2, "Hello world", "5 6"},
    {TOK_SPLIT_GPT2, " Hello  world!  ", "6 1 6 1 2"},
    {TOK_SPLIT_GPT2, "I'm here, we'LL see 'RE 'Ve", "1 2 5 1 3 1 2 4 2 2 2 2"},
    {TOK_SPLIT_GPT2, "x'Re y'd", "1 1 2 2 2"},
    {TOK_SPLIT_GPT2, "123456789 1,234.5", "9 2 1 3 1 1"},
    {TOK_SPLIT_GPT2, "\x09""\x09""foo\x0A""\x0A""  bar  \x0A""", "1 1 3 3 4 3"},
    {TOK_SPLIT_GPT2, "a\x0D""\x0A""\x0D""\x0A"" b", "1 4 2"},
    {TOK_SPLIT_GPT2, "!!!\x0A""\x0A""?? \x0D""\x0A""", "3 1 1 2 3"},
    {TOK_SPLIT_GPT2, "3.14159e10", "1 1 5 1 2"},
    {TOK_SPLIT_GPT2, "\xC2""\xBD""\xC2""\xB2""\xC2""\xB3"" \xD9""\xA3""\xD9""\xA4""\xD9""\xA5""\xD9""\xA6""\xD9""\xA7"" \xE2""\x85""\xAB""", "3 6 2"},
    {TOK_SPLIT_GPT2, "a\xC2""\xA0""b x \xE3""\x80""\x80"" y\xE2""\x80""\xA8""z", "1 1 1 2 2 2 1 1"},
    {TOK_SPLIT_GPT2, "\xF0""\x9F""\x98""\x80""\xF0""\x9F""\x98""\x80"" \xF0""\x9F""\x9A""\x80""\xE2""\x80""\x8D""\xF0""\x9F""\x8C""\xAB""\xEF""\xB8""\x8F""", "2 5"},
    {TOK_SPLIT_GPT2, "\xC3""\xA9""\xCC""\x81""a \xC3""\x9F"" \xD0""\x96""\xD0""\xB6"" \xE4""\xB8""\xAD""\xE6""\x96""\x87"" \xE0""\xB8""\x81""\xE0""\xB8""\xB1""", "1 1 1 2 3 3 2 1"},
    {TOK_SPLIT_GPT2, "$+<=>^~|`@#%&*", "14"},
    {TOK_SPLIT_GPT2, "  \x1C""\x0B""\x0C""\xC2""\x85"" end", "1 2 3 4"},
    {TOK_SPLIT_GPT2, "'s's 'S'", "2 2 2 1 1"},
    {TOK_SPLIT_GPT2, "1234567890123", "13"},
    {TOK_SPLIT_GPT2, "ab12cd345ef6789", "2 2 2 3 2 4"},
    {TOK_SPLIT_DIGITS, "Hello world", "5 6"},
    {TOK_SPLIT_DIGITS, " Hello  world!  ", "6 1 6 1 2"},
    {TOK_SPLIT_DIGITS, "I'm here, we'LL see 'RE 'Ve", "1 2 5 1 3 1 2 4 2 2 2 2"},
    {TOK_SPLIT_DIGITS, "x'Re y'd", "1 1 2 2 2"},
    {TOK_SPLIT_DIGITS, "123456789 1,234.5", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_DIGITS, "\x09""\x09""foo\x0A""\x0A""  bar  \x0A""", "1 1 3 3 4 3"},
    {TOK_SPLIT_DIGITS, "a\x0D""\x0A""\x0D""\x0A"" b", "1 4 2"},
    {TOK_SPLIT_DIGITS, "!!!\x0A""\x0A""?? \x0D""\x0A""", "3 1 1 2 3"},
    {TOK_SPLIT_DIGITS, "3.14159e10", "1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_DIGITS, "\xC2""\xBD""\xC2""\xB2""\xC2""\xB3"" \xD9""\xA3""\xD9""\xA4""\xD9""\xA5""\xD9""\xA6""\xD9""\xA7"" \xE2""\x85""\xAB""", "1 1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_DIGITS, "a\xC2""\xA0""b x \xE3""\x80""\x80"" y\xE2""\x80""\xA8""z", "1 1 1 2 2 2 1 1"},
    {TOK_SPLIT_DIGITS, "\xF0""\x9F""\x98""\x80""\xF0""\x9F""\x98""\x80"" \xF0""\x9F""\x9A""\x80""\xE2""\x80""\x8D""\xF0""\x9F""\x8C""\xAB""\xEF""\xB8""\x8F""", "2 5"},
    {TOK_SPLIT_DIGITS, "\xC3""\xA9""\xCC""\x81""a \xC3""\x9F"" \xD0""\x96""\xD0""\xB6"" \xE4""\xB8""\xAD""\xE6""\x96""\x87"" \xE0""\xB8""\x81""\xE0""\xB8""\xB1""", "1 1 1 2 3 3 2 1"},
    {TOK_SPLIT_DIGITS, "$+<=>^~|`@#%&*", "14"},
    {TOK_SPLIT_DIGITS, "  \x1C""\x0B""\x0C""\xC2""\x85"" end", "1 2 3 4"},
    {TOK_SPLIT_DIGITS, "'s's 'S'", "2 2 2 1 1"},
    {TOK_SPLIT_DIGITS, "1234567890123", "1 1 1 1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_DIGITS, "ab12cd345ef6789", "2 1 1 2 1 1 1 2 1 1 1 1"},
    {TOK_SPLIT_LLAMA3, "Hello world", "5 6"},
    {TOK_SPLIT_LLAMA3, " Hello  world!  ", "6 1 6 1 2"},
    {TOK_SPLIT_LLAMA3, "I'm here, we'LL see 'RE 'Ve", "1 2 5 1 3 3 4 2 2 2 2"},
    {TOK_SPLIT_LLAMA3, "x'Re y'd", "1 3 2 2"},
    {TOK_SPLIT_LLAMA3, "123456789 1,234.5", "3 3 3 1 1 1 3 1 1"},
    {TOK_SPLIT_LLAMA3, "\x09""\x09""foo\x0A""\x0A""  bar  \x0A""", "1 4 2 1 4 3"},
    {TOK_SPLIT_LLAMA3, "a\x0D""\x0A""\x0D""\x0A"" b", "1 4 2"},
    {TOK_SPLIT_LLAMA3, "!!!\x0A""\x0A""?? \x0D""\x0A""", "5 2 3"},
    {TOK_SPLIT_LLAMA3, "3.14159e10", "1 1 3 2 1 2"},
    {TOK_SPLIT_LLAMA3, "\xC2""\xBD""\xC2""\xB2""\xC2""\xB3"" \xD9""\xA3""\xD9""\xA4""\xD9""\xA5""\xD9""\xA6""\xD9""\xA7"" \xE2""\x85""\xAB""", "3 1 3 2 1 1"},
    {TOK_SPLIT_LLAMA3, "a\xC2""\xA0""b x \xE3""\x80""\x80"" y\xE2""\x80""\xA8""z", "1 2 2 2 2 2"},
    {TOK_SPLIT_LLAMA3, "\xF0""\x9F""\x98""\x80""\xF0""\x9F""\x98""\x80"" \xF0""\x9F""\x9A""\x80""\xE2""\x80""\x8D""\xF0""\x9F""\x8C""\xAB""\xEF""\xB8""\x8F""", "2 5"},
    {TOK_SPLIT_LLAMA3, "\xC3""\xA9""\xCC""\x81""a \xC3""\x9F"" \xD0""\x96""\xD0""\xB6"" \xE4""\xB8""\xAD""\xE6""\x96""\x87"" \xE0""\xB8""\x81""\xE0""\xB8""\xB1""", "1 2 2 3 3 2 1"},
    {TOK_SPLIT_LLAMA3, "$+<=>^~|`@#%&*", "14"},
    {TOK_SPLIT_LLAMA3, "  \x1C""\x0B""\x0C""\xC2""\x85"" end", "1 2 3 4"},
    {TOK_SPLIT_LLAMA3, "'s's 'S'", "2 2 2 1 1"},
    {TOK_SPLIT_LLAMA3, "1234567890123", "3 3 3 3 1"},
    {TOK_SPLIT_LLAMA3, "ab12cd345ef6789", "2 2 2 3 2 3 1"},
    {TOK_SPLIT_LLAMA3, "\xEF""\xBF""\xBD""/\xE2""\x80""\x8B""\xE2""\x80""\x94""#`[\xE2""\x80""\x8B""\xE3""\x80""\x80""''", "8 1 2"},
    {TOK_SPLIT_LLAMA3, "[%\x0C""\xC2""\x85""\xE2""\x80""\x9D""'M`5Em}\xE2""\x82""\xAC""\xE4""\xB8""\xAD""\x1C""Z", "2 1 1 2 1 1 1 2 2 1 2"},
    {TOK_SPLIT_LLAMA3, "+`\x7F""\xC2""\xB2""\xC2""\x85""\x7F""V\x0B""b\xF0""\x9F""\x98""\x80""{Ss", "3 1 1 2 2 2 2"},
    {TOK_SPLIT_LLAMA3, "'\xC7""\x85""\x0D""\xE2""\x80""\xA8""", "2 1 1"},
    {TOK_SPLIT_LLAMA3, "\xE2""\x80""\x94""#8|", "2 1 1"},
    {TOK_SPLIT_LLAMA3, "\xE2""\x80""\x8D""']\x0A""\x1C""4(a\xC3""\xA9""T@\x7F""2", "4 1 1 4 2 1"},
    {TOK_SPLIT_QWEN2, "Hello world", "5 6"},
    {TOK_SPLIT_QWEN2, " Hello  world!  ", "6 1 6 1 2"},
    {TOK_SPLIT_QWEN2, "I'm here, we'LL see 'RE 'Ve", "1 2 5 1 3 3 4 2 2 2 2"},
    {TOK_SPLIT_QWEN2, "x'Re y'd", "1 3 2 2"},
    {TOK_SPLIT_QWEN2, "123456789 1,234.5", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_QWEN2, "\x09""\x09""foo\x0A""\x0A""  bar  \x0A""", "1 4 2 1 4 3"},
    {TOK_SPLIT_QWEN2, "a\x0D""\x0A""\x0D""\x0A"" b", "1 4 2"},
    {TOK_SPLIT_QWEN2, "!!!\x0A""\x0A""?? \x0D""\x0A""", "5 2 3"},
    {TOK_SPLIT_QWEN2, "3.14159e10", "1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_QWEN2, "\xC2""\xBD""\xC2""\xB2""\xC2""\xB3"" \xD9""\xA3""\xD9""\xA4""\xD9""\xA5""\xD9""\xA6""\xD9""\xA7"" \xE2""\x85""\xAB""", "1 1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_QWEN2, "a\xC2""\xA0""b x \xE3""\x80""\x80"" y\xE2""\x80""\xA8""z", "1 2 2 2 2 2"},
    {TOK_SPLIT_QWEN2, "\xF0""\x9F""\x98""\x80""\xF0""\x9F""\x98""\x80"" \xF0""\x9F""\x9A""\x80""\xE2""\x80""\x8D""\xF0""\x9F""\x8C""\xAB""\xEF""\xB8""\x8F""", "2 5"},
    {TOK_SPLIT_QWEN2, "\xC3""\xA9""\xCC""\x81""a \xC3""\x9F"" \xD0""\x96""\xD0""\xB6"" \xE4""\xB8""\xAD""\xE6""\x96""\x87"" \xE0""\xB8""\x81""\xE0""\xB8""\xB1""", "1 2 2 3 3 2 1"},
    {TOK_SPLIT_QWEN2, "$+<=>^~|`@#%&*", "14"},
    {TOK_SPLIT_QWEN2, "  \x1C""\x0B""\x0C""\xC2""\x85"" end", "1 2 3 4"},
    {TOK_SPLIT_QWEN2, "'s's 'S'", "2 2 2 1 1"},
    {TOK_SPLIT_QWEN2, "1234567890123", "1 1 1 1 1 1 1 1 1 1 1 1 1"},
    {TOK_SPLIT_QWEN2, "ab12cd345ef6789", "2 1 1 2 1 1 1 2 1 1 1 1"},
    {TOK_SPLIT_QWEN2, "\xEF""\xBF""\xBD""/\xE2""\x80""\x8B""\xE2""\x80""\x94""#`[\xE2""\x80""\x8B""\xE3""\x80""\x80""''", "8 1 2"},
    {TOK_SPLIT_QWEN2, "[%\x0C""\xC2""\x85""\xE2""\x80""\x9D""'M`5Em}\xE2""\x82""\xAC""\xE4""\xB8""\xAD""\x1C""Z", "2 1 1 2 1 1 1 2 2 1 2"},
    {TOK_SPLIT_QWEN2, "+`\x7F""\xC2""\xB2""\xC2""\x85""\x7F""V\x0B""b\xF0""\x9F""\x98""\x80""{Ss", "3 1 1 2 2 2 2"},
    {TOK_SPLIT_QWEN2, "'\xC7""\x85""\x0D""\xE2""\x80""\xA8""", "2 1 1"},
    {TOK_SPLIT_QWEN2, "\xE2""\x80""\x94""#8|", "2 1 1"},
    {TOK_SPLIT_QWEN2, "\xE2""\x80""\x8D""']\x0A""\x1C""4(a\xC3""\xA9""T@\x7F""2", "4 1 1 4 2 1"},
};
/* clang-format on */

static void check_splits(void)
{
    struct tok_pre_words w = {0};
    size_t bad = 0;
    for (size_t c = 0; c < sizeof k_split_cases / sizeof k_split_cases[0]; c++) {
        const char *s = k_split_cases[c].text;
        size_t len = strlen(s), n = 0;
        uint32_t cpts[256];
        for (size_t pos = 0; pos < len && n < 256;) cpts[n++] = unicode_decode_lenient(s, len, &pos);
        CHECK(tok_pre_split(k_split_cases[c].split, cpts, n, &w) == KVB_OK);
        char got[512] = "";
        size_t gl = 0, prev = 0;
        for (size_t i = 0; i < w.n && gl + 8 < sizeof got; i++) {
            gl += (size_t)snprintf(got + gl, sizeof got - gl, i ? " %zu" : "%zu", w.ends[i] - prev);
            prev = w.ends[i];
        }
        if (strcmp(got, k_split_cases[c].lens) != 0 && ++bad <= 5) {
            fprintf(stderr, "split %d of ", (int)k_split_cases[c].split);
            print_escaped(s, len);
            fprintf(stderr, ": expected [%s], got [%s]\n", k_split_cases[c].lens, got);
        }
    }
    CHECK_EQ_INT(bad, 0);
    tok_pre_words_free(&w);
}

/* Every allocation failure during load and encode comes back as
 * KVB_ERR_NOMEM, with nothing leaked (run under ASan to see leaks). */
static void check_alloc_failures(const char *dir)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/ggml-vocab-phi-3.gguf", dir);
    struct gguf_file *f = NULL;
    struct kvb_err err = {{0}};
    if (gguf_open(path, &f, &err) != KVB_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    bool loaded = false;
    for (long k = 0; k < 200 && !loaded; k++) {
        struct tok *t = NULL;
        kvb_alloc_fail_after(k);
        enum kvb_status st = tok_load(f, &t, &err);
        kvb_alloc_fail_after(-1);
        if (st == KVB_OK) {
            loaded = true;
            const char *text = "<|user|>\nHello  w\xC3\xb6rld \xF0\x9F\xA6\x99<|end|>\n";
            bool encoded = false;
            for (long j = 0; j < 200 && !encoded; j++) {
                int32_t *ids = NULL;
                size_t n = 0;
                kvb_alloc_fail_after(j);
                enum kvb_status es = tok_encode(t, text, strlen(text), TOK_PARSE_SPECIAL, &ids, &n, &err);
                char *back = NULL;
                enum kvb_status ds = es == KVB_OK ? tok_decode(t, ids, n, &back, NULL) : KVB_OK;
                kvb_alloc_fail_after(-1);
                if (es == KVB_OK && ds == KVB_OK) encoded = true;
                else CHECK_EQ_INT(es == KVB_OK ? ds : es, KVB_ERR_NOMEM);
                kvb_free(back);
                kvb_free(ids);
            }
            CHECK(encoded);
        } else {
            CHECK_EQ_INT(st, KVB_ERR_NOMEM);
            CHECK(t == NULL);
        }
        tok_free(t);
    }
    CHECK(loaded);
    gguf_close(f);
}

/* Tokenizers kvbatch does not implement are refused with their name. */
static void check_refusals(void)
{
    static const char *const k_tokens[] = {"a", "b", "ab"};
    static const char *const k_merges[] = {"a b"};
    static const struct {
        const char *model, *pre, *expect;
    } k_cases[] = {
        {"bert", NULL, "bert"},
        {"t5", NULL, "t5"},
        {"rwkv", NULL, "rwkv"},
        {"gpt2", "tekken-like", "tekken-like"},
    };
    for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++) {
        struct gguf_writer *w = NULL;
        struct kvb_err err = {{0}};
        CHECK(gguf_writer_create(&w, &err) == KVB_OK);
        if (!w) continue;
        gguf_writer_add_str(w, "general.architecture", "llama");
        gguf_writer_add_str(w, "tokenizer.ggml.model", k_cases[c].model);
        if (k_cases[c].pre) gguf_writer_add_str(w, "tokenizer.ggml.pre", k_cases[c].pre);
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", k_tokens, 3);
        gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", k_merges, 1);
        void *mem = NULL;
        uint64_t size = 0;
        CHECK(gguf_writer_write_memory(w, &mem, &size, &err) == KVB_OK);
        struct gguf_file *f = NULL;
        if (mem) CHECK_MSG(gguf_open_memory(mem, size, &f, &err) == KVB_OK, "%s", err.msg);
        struct tok *t = NULL;
        if (f) {
            enum kvb_status st = tok_load(f, &t, &err);
            CHECK_EQ_INT(st, KVB_ERR_UNSUPPORTED);
            CHECK_MSG(strstr(err.msg, k_cases[c].expect) != NULL, "message '%s' should name '%s'", err.msg,
                      k_cases[c].expect);
            CHECK(t == NULL);
        }
        tok_free(t);
        gguf_close(f);
        kvb_free(mem);
        gguf_writer_free(w);
    }
}

int main(void)
{
    const char *td = tu_env("KVB_TESTDATA");
    check_refusals();
    check_splits();
    if (!td) {
        fprintf(stderr, "KVB_TESTDATA not set\n");
        tu_failures++;
        return tu_finish();
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tokenizer", td);
    /* The vocabularies this tokenizer handles, named rather than listed from
     * the directory: the test data cache is shared by every checkout on the
     * machine, and a newer one may have added vocabularies this one refuses. */
    static const char *const k_vocabs[] = {
        "ggml-vocab-gpt-2.gguf", "ggml-vocab-starcoder.gguf", "ggml-vocab-llama-spm.gguf",
        "ggml-vocab-phi-3.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
    };
    for (size_t i = 0; i < sizeof k_vocabs / sizeof k_vocabs[0]; i++) {
        char path[1600];
        snprintf(path, sizeof path, "%s/%s", dir, k_vocabs[i]);
        if (access(path, R_OK) != 0) {
            CHECK_MSG(false, "cannot read %s: the tokenizer vectors are fetched by scripts/setup.sh --test", path);
            continue;
        }
        check_vectors(dir, k_vocabs[i]);
    }
    check_specials(dir);
    check_alloc_failures(dir);
    return tu_finish();
}
