/* test_tok_smollm.c — the tokenizer of the default model (SmolLM2, byte-level
 * BPE with the "smollm" pre-tokenizer: digits one by one, then GPT-2's split).
 *
 * Checks that decode(encode(x)) == x on mixed text, exact ids for a few
 * strings (computed independently with Hugging Face `tokenizers` configured
 * like SmolLM2's tokenizer.json), the ChatML special tokens with and without
 * TOK_PARSE_SPECIAL, and the streaming decoder on an emoji split over byte
 * tokens. Skips when $KVB_MODEL is absent. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "model/gguf.h"
#include "support/testutil.h"
#include "text/tok.h"

static int32_t *encode(const struct tok *t, const char *s, unsigned flags, size_t *n)
{
    int32_t *ids = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(tok_encode(t, s, strlen(s), flags, &ids, n, &err) == KVB_OK, "%s", err.msg);
    return ids;
}

static bool contains(const int32_t *v, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == id) return true;
    return false;
}

static const char *const k_corpus[] = {
    "Hello, world! This is a plain ASCII sentence.",
    "Ça va? Déjà vu — naïve façade, coöperate, Ærøskøbing, straße.",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 😀 👍🏽 👩‍👩‍👧‍👦 🏳️‍🌈 🦙 ❤️ 1️⃣",
    "def f(x):\n\tif x > 0:\n\t\treturn x * 2\n    else:\n        return -x\n",
    "Numbers: 1234567 and 3.14159, 1,000,000.00, 0x1F, 1e-9, ½ ² ٣",
    "   leading spaces, trailing spaces   ",
    "line one\nline two\r\nline three\n\n\nafter blank lines\n",
    "tabs\tand\t\ttabs\t\t\t",
    "<|im_start|>user\nHi<|im_end|>\n",
    "I'm sure you'll see they've 'RE-done it; we'd, it's, I've.",
    "    ",
    "\n",
    "",
    "    return {'key': [1, 2, 3], \"other\": None}  # comment\n",
    "$ echo \"hi\" | grep -E '^h' && ls -la ~/.config/*.json",
    "a\u00a0b\u3000c\u2028d \u200b e",
};

static const struct {
    const char *text;
    int32_t ids[40];
    size_t n;
} k_expected[] = {
    {"Hello, world! This is a plain ASCII sentence.", {19556, 28, 905, 17, 669, 314, 253, 9079, 39799, 6330, 30}, 11},
    {"Numbers: 1234567 and 3.14159, 1,000,000.00",
     {39006, 42, 216, 33,  34, 35, 36, 37, 38, 39, 284, 216, 35, 30, 33, 36, 33,
      37,    41, 28,  216, 33, 28, 32, 32, 32, 28, 32,  32,  32, 30, 32, 32},
     33},
    {"Ça va? Déjà vu — naïve façade, straße.",
     {142, 225, 81, 46316, 47, 422, 2756, 90, 16739, 386, 101, 1841, 15486, 46494, 40852, 28, 4040, 34878, 85, 30},
     20},
    {"日本語のテキストと中文文本，한국어",
     {23274, 115, 40993, 179,   120,   248,   26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226,
      7365,  118, 28589, 29184, 29184, 40993, 12831, 33085, 246, 181,   130, 251,   183, 240,   129},
     30},
    {"Emoji: 👩‍👩‍👧‍👦 🦙",
     {10809, 33777, 42,  15107, 235, 119, 321,   231, 10813, 235,   119, 321,
      231,   10813, 235, 117,   321, 231, 10813, 235, 116,   15107, 116, 243},
     24},
    {"def f(x):\n\tif x > 0:\n\t\treturn x * 2\n",
     {1604, 275, 24, 104, 727, 198, 197, 342, 1792, 2986, 216, 32, 42, 3354, 197, 5406, 1792, 1672, 216, 34, 198},
     21},
    {"I'm sure you'll see they've 'RE-done it",
     {57, 5248, 2090, 346, 3060, 963, 502, 3543, 637, 3256, 29, 22744, 357},
     13},
    {"   leading spaces, trailing spaces   ", {256, 2899, 5600, 28, 35079, 5600, 333}, 7},
    {"line one\nline two\r\nline three\n\n\nafter blank lines\n",
     {1311, 582, 198, 1311, 827, 201, 198, 1311, 1296, 1116, 198, 9110, 8884, 3204, 198},
     15},
    {"tabs\tand\t\ttabs\t\t\t", {100, 7366, 197, 397, 197, 197, 100, 7366, 27655}, 9},
    {"x  \n\n  y   ", {104, 256, 8866, 329, 333}, 5},
    {"<|im_start|>user\nHi<|im_end|>\n",
     {44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46, 198},
     18},
};

int main(void)
{
    bool absent = false;
    struct tok *t = tu_model_tokenizer(&absent);
    if (absent) tu_skip("KVB_MODEL not present (scripts/fetch-model.sh downloads it)");
    if (!t) return tu_finish();

    /* decode(encode(x)) == x */
    for (size_t c = 0; c < sizeof k_corpus / sizeof k_corpus[0]; c++) {
        size_t n = 0, back_len = 0;
        int32_t *ids = encode(t, k_corpus[c], 0, &n);
        char *back = NULL;
        CHECK(ids && tok_decode(t, ids, n, &back, &back_len) == KVB_OK);
        CHECK_MSG(back && back_len == strlen(k_corpus[c]) && memcmp(back, k_corpus[c], back_len) == 0,
                  "round trip of \"%s\" gave \"%s\"", k_corpus[c], back ? back : "(null)");
        kvb_free(back);
        kvb_free(ids);
    }

    /* exact ids */
    for (size_t c = 0; c < sizeof k_expected / sizeof k_expected[0]; c++) {
        size_t n = 0;
        int32_t *ids = encode(t, k_expected[c].text, 0, &n);
        bool same = ids && n == k_expected[c].n && memcmp(ids, k_expected[c].ids, n * sizeof *ids) == 0;
        CHECK_MSG(same, "ids of \"%s\" differ (got %zu ids)", k_expected[c].text, n);
        if (!same && ids) {
            fprintf(stderr, "    got:");
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fputc('\n', stderr);
        }
        kvb_free(ids);
    }

    /* ChatML special tokens */
    CHECK_EQ_INT(tok_find(t, "<|im_start|>"), 1);
    CHECK_EQ_INT(tok_find(t, "<|im_end|>"), 2);
    CHECK(tok_is_eog(t, 2));
    CHECK(tok_is_eog(t, tok_eos(t)));
    CHECK(!tok_is_eog(t, 1));
    const char *chat = "<|im_start|>user\nHi<|im_end|>\n";
    size_t n = 0;
    int32_t *ids = encode(t, chat, TOK_PARSE_SPECIAL, &n);
    static const int32_t k_chat[] = {1, 4093, 198, 26843, 2, 198};
    CHECK(ids && n == 6 && memcmp(ids, k_chat, sizeof k_chat) == 0);
    kvb_free(ids);
    ids = encode(t, chat, 0, &n);
    CHECK(ids && n > 6 && !contains(ids, n, 1) && !contains(ids, n, 2));
    kvb_free(ids);
    ids = encode(t, "x", TOK_ADD_BOS, &n);
    CHECK(ids && n == 2 && ids[0] == tok_bos(t));
    kvb_free(ids);

    /* the stream holds back an emoji split over byte tokens until complete */
    static const char k_llama[] = "\xF0\x9F\xA6\x99"; /* 🦙 */
    ids = encode(t, k_llama, 0, &n);
    CHECK(ids && n == 3);
    struct tok_stream ts;
    tok_stream_init(&ts, t);
    char *out = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; ids && i < n; i++) {
        CHECK(tok_stream_push(t, &ts, ids[i], &out, &len, &cap) == KVB_OK);
        CHECK_EQ_INT(len, i + 1 < n ? 0 : 4);
    }
    CHECK(tok_stream_flush(t, &ts, &out, &len, &cap) == KVB_OK);
    CHECK(len == 4 && out && memcmp(out, k_llama, 4) == 0);
    /* a control token renders as nothing in the stream */
    CHECK(tok_stream_push(t, &ts, 2, &out, &len, &cap) == KVB_OK);
    CHECK_EQ_INT(len, 4);
    /* cut short: the pending bytes become one U+FFFD */
    if (ids && n == 3) {
        CHECK(tok_stream_push(t, &ts, ids[0], &out, &len, &cap) == KVB_OK);
        CHECK(tok_stream_push(t, &ts, ids[1], &out, &len, &cap) == KVB_OK);
        CHECK_EQ_INT(len, 4);
        CHECK(tok_stream_flush(t, &ts, &out, &len, &cap) == KVB_OK);
        CHECK(len == 7 && memcmp(out + 4, "\xEF\xBF\xBD", 3) == 0);
    }
    kvb_free(out);
    kvb_free(ids);

    tok_free(t);
    return tu_finish();
}
