/* tok_wpm.c — WordPiece (`tokenizer.ggml.model` = "bert"): BERT's
 * tokenizer as transformers' BertTokenizer and the tokenizers crate run
 * it, over the vocabulary as llama.cpp's converter stores it (a word's
 * first piece with a leading "▁", continuation pieces without BERT's "##").
 *
 * One fragment of raw text (no special tokens inside) at a time:
 *  1. normalize (BertNormalizer): drop NUL, U+FFFD and control characters
 *     (general category C*, but tab, newline and carriage return, which
 *     are white space); white space (those three, space, category Z*, and
 *     the White_Space property) separates words; CJK ideographs are words of
 *     their own; with strip_accents the canonical decomposition, nonspacing
 *     marks (Mn) dropped; with lowercase Python's str.lower();
 *  2. pre-tokenize (BertPreTokenizer): each punctuation character (ASCII
 *     punctuation and symbols, category P*) is a word of its own;
 *  3. WordPiece: the longest vocabulary piece at each point of the word,
 *     left to right; a word with a part no piece covers, or longer than 100
 *     characters (max_input_chars_per_word), is the unknown token.
 * The order of 1's steps is BertNormalizer's (strip accents, then lower),
 * so "İ" (I + combining dot) becomes "i". */
#include <string.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "text/tok_internal.h"

#define WPM_MAX_WORD_CHARS 100 /* max_input_chars_per_word */

static bool is_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* BERT's punctuation: ASCII 33-47, 58-64, 91-96, 123-126, or category P*. */
static bool is_punct(uint32_t c)
{
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
    return unicode_category(c) == UNICODE_CAT_PUNCT;
}

static bool is_space(uint32_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || unicode_category(c) == UNICODE_CAT_SEPARATOR ||
           unicode_is_whitespace(c);
}

/* Control for BertNormalizer: every C* category (also unassigned) but the
 * three white-space controls. */
static bool is_control(uint32_t c)
{
    if (c == '\t' || c == '\n' || c == '\r') return false;
    const enum unicode_cat k = unicode_category(c);
    return k == UNICODE_CAT_CONTROL || k == UNICODE_CAT_UNDEF;
}

/* A word being built: its UTF-8 after a leading "▁" (so the first piece's
 * lookup needs no copy), and its length in characters. */
struct word {
    char *b;
    size_t n, cap;
    size_t chars;
};

static enum kvb_status word_put(struct word *w, uint32_t c)
{
    if (w->n + 4 > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        char *nb = kvb_realloc(w->b, cap);
        if (!nb) return KVB_ERR_NOMEM;
        w->b = nb;
        w->cap = cap;
    }
    w->n += unicode_encode(c, w->b + w->n);
    w->chars++;
    return KVB_OK;
}

static void word_reset(struct word *w)
{
    w->n = 3; /* "▁" */
    w->chars = 0;
}

/* The pieces of one word (in w->b[3..n)), or the unknown token. */
static enum kvb_status word_encode(const struct tok *t, const struct word *w, struct tok_ids *out)
{
    if (w->chars == 0) return KVB_OK;
    const size_t before = out->n;
    bool ok = w->chars <= WPM_MAX_WORD_CHARS;
    /* i: where the next piece starts (bytes into b); the first piece's
     * lookup includes the "▁" before it, the others' do not */
    for (size_t i = 3; ok && i < w->n;) {
        const size_t from = i == 3 ? 0 : i;
        size_t end = w->n - from > t->max_len ? from + t->max_len : w->n;
        int32_t id = -1;
        for (; end > i; end--) {
            if (end < w->n && (w->b[end] & 0xC0) == 0x80) continue; /* not inside a character */
            id = tok_map_get(&t->vocab, w->b + from, end - from);
            if (id >= 0) break;
        }
        if (id < 0) {
            ok = false;
            break;
        }
        KVB_FORWARD_IF_ERROR(tok_ids_push(out, id));
        i = end;
    }
    if (ok) return KVB_OK;
    out->n = before;
    return t->unk >= 0 ? tok_ids_push(out, t->unk) : KVB_OK;
}

/* One normalized character into the words. */
static enum kvb_status put_char(const struct tok *t, struct word *w, uint32_t c, struct tok_ids *out)
{
    if (t->wpm_lowercase) {
        uint32_t lo[2];
        const size_t n = unicode_lower(c, lo);
        for (size_t k = 0; k < n; k++) KVB_FORWARD_IF_ERROR(word_put(w, lo[k]));
        return KVB_OK;
    }
    return word_put(w, c);
}

enum kvb_status tok_wpm_encode(const struct tok *t, const char *text, size_t len, const struct tok_limits *lim,
                               struct tok_ids *out)
{
    struct word w = {0};
    enum kvb_status st = KVB_OK;
    if (!(w.b = kvb_malloc(w.cap = 64))) return KVB_ERR_NOMEM;
    memcpy(w.b, "\xe2\x96\x81", 3);
    word_reset(&w);
    for (size_t pos = 0; pos < len && st == KVB_OK;) {
        if ((pos & 0xFFF) == 0 && tok_cancelled(lim)) {
            st = KVB_ERR_CANCELLED;
            break;
        }
        const uint32_t c = unicode_decode_lenient(text, len, &pos);
        if (c == 0 || c == UNICODE_REPLACEMENT || is_control(c)) continue;
        if (is_space(c)) {
            st = word_encode(t, &w, out);
            word_reset(&w);
            continue;
        }
        uint32_t d[UNICODE_NFD_MAX];
        const size_t nd = t->wpm_strip_accents ? unicode_nfd(c, d) : (d[0] = c, 1);
        for (size_t k = 0; k < nd && st == KVB_OK; k++) {
            if (t->wpm_strip_accents && unicode_is_mn(d[k])) continue;
            if (is_punct(d[k]) || is_cjk(d[k])) { /* a word of its own */
                st = word_encode(t, &w, out);
                word_reset(&w);
                if (st == KVB_OK) st = put_char(t, &w, d[k], out);
                if (st == KVB_OK) st = word_encode(t, &w, out);
                word_reset(&w);
            } else {
                st = put_char(t, &w, d[k], out);
            }
        }
        if (st == KVB_OK && lim->max_ids && out->n > lim->max_ids) st = KVB_ERR_RANGE;
    }
    if (st == KVB_OK) st = word_encode(t, &w, out);
    kvb_free(w.b);
    return st;
}
