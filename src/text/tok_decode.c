/* tok_decode.c — ids back to text: tok_piece (one token's bytes), the
 * streaming decoder and tok_decode.
 *
 * A token's bytes follow the reference's token_to_piece: control and unknown
 * tokens are empty unless rendering specials, user-defined ones are their
 * text, byte tokens <0xNN> are that byte, normal tokens are their text with
 * "▁" → " " (SentencePiece) or mapped back through GPT-2's byte table
 * (byte-level BPE). Unused/undefined tokens are empty.
 *
 * The stream turns those bytes into text that is always valid UTF-8: a
 * sequence cut between tokens is held back until complete, and bytes that
 * can never form a character become U+FFFD (one per maximal ill-formed
 * subpart, as WHATWG decoders do). */
#include <string.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "text/tok_internal.h"

/* Bounded writer: counts every byte, stores those that fit. */
struct sink {
    char *buf;
    size_t cap, n;
};

static void put(struct sink *s, const char *p, size_t len)
{
    if (s->n < s->cap) {
        size_t room = s->cap - s->n;
        memcpy(s->buf + s->n, p, len < room ? len : room);
    }
    s->n += len;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 0;
}

size_t tok_piece(const struct tok *t, int32_t id, bool render_special, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab) return 0;
    const struct tok_entry *e = &t->tokens[id];
    const char *text = t->text + e->off;
    struct sink s = {buf, buf ? cap : 0, 0};
    const uint32_t special = TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL;
    if ((e->attr & special) && !render_special) return 0;
    if (e->attr & (special | TOK_ATTR_USER_DEFINED)) {
        put(&s, text, e->len);
    } else if (e->attr & TOK_ATTR_NORMAL) {
        if (t->kind == TOK_KIND_SPM || t->kind == TOK_KIND_WPM) { /* "▁" is a space (WordPiece: a word's start) */
            for (size_t i = 0; i < e->len;) {
                if (i + 3 <= e->len && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
                    put(&s, " ", 1);
                    i += 3;
                } else {
                    put(&s, text + i, 1);
                    i++;
                }
            }
        } else {
            for (size_t i = 0; i < e->len;) {
                size_t at = i;
                uint32_t cpt = unicode_decode_lenient(text, e->len, &i);
                int b = tok_cpt_to_byte(cpt);
                if (b >= 0) {
                    char c = (char)b;
                    put(&s, &c, 1);
                } else { /* a vocab entry outside the byte alphabet: shown as the reference shows it */
                    static const char k_hex[] = "0123456789abcdef";
                    put(&s, "[UNK_BYTE_0x", 12);
                    for (size_t j = at; j < i; j++) {
                        char hx[2] = {k_hex[(unsigned char)text[j] >> 4], k_hex[(unsigned char)text[j] & 15]};
                        put(&s, hx, 2);
                    }
                    put(&s, text, e->len);
                    put(&s, "]", 1);
                }
            }
        }
    } else if ((e->attr & TOK_ATTR_BYTE) && e->len >= 5) {
        char c = (char)(hexval(text[3]) * 16 + hexval(text[4]));
        put(&s, &c, 1);
    }
    return s.n;
}

/* ---- stream ---------------------------------------------------------------------- */

void tok_stream_init(struct tok_stream *s, const struct tok *t)
{
    memset(s, 0, sizeof *s);
    s->at_start = t->add_space_prefix;
}

/* Appends n bytes to *out, keeping room for (and writing) a NUL after them. */
static enum kvb_status append(char **out, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc < *len + n + 1) nc *= 2;
        char *nb = kvb_realloc(*out, nc);
        if (!nb) return KVB_ERR_NOMEM;
        *out = nb;
        *cap = nc;
    }
    if (n) memcpy(*out + *len, p, n);
    *len += n;
    (*out)[*len] = '\0';
    return KVB_OK;
}

static const char k_fffd[3] = {'\xEF', '\xBF', '\xBD'};

/* Expected length of the sequence led by b (0: b cannot lead) and the valid
 * range of its second byte (RFC 3629 table: no overlongs, no surrogates). */
static size_t seq_len(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Writes the complete characters of p[0..n) to out; an unfinished final
 * sequence is kept in s->pending (or, when final, written as U+FFFD). */
static enum kvb_status emit_utf8(struct tok_stream *s, const unsigned char *p, size_t n, bool final, char **out,
                                 size_t *len, size_t *cap)
{
    size_t i = 0, run = 0; /* run: start of valid bytes not yet appended */
    s->n_pending = 0;
    while (i < n) {
        unsigned char lo, hi;
        size_t need = seq_len(p[i], &lo, &hi);
        if (need == 1) {
            i++;
            continue;
        }
        size_t k = 1; /* bytes of the sequence seen valid so far */
        bool bad = need == 0;
        while (!bad && k < need && i + k < n) {
            unsigned char c = p[i + k];
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) bad = true;
            else k++;
        }
        if (!bad && k == need) {
            i += need;
            continue;
        }
        KVB_FORWARD_IF_ERROR(append(out, len, cap, (const char *)p + run, i - run));
        if (!bad && !final) { /* ran out of bytes mid-sequence: wait for the next token */
            memcpy(s->pending, p + i, n - i);
            s->n_pending = (int)(n - i);
            return KVB_OK;
        }
        KVB_FORWARD_IF_ERROR(append(out, len, cap, k_fffd, 3));
        i += k;
        run = i;
    }
    return append(out, len, cap, (const char *)p + run, n - run);
}

enum kvb_status tok_stream_push(const struct tok *t, struct tok_stream *s, int32_t id, char **out, size_t *len,
                                size_t *cap)
{
    unsigned char small[128];
    size_t np = (size_t)s->n_pending;
    size_t pl = tok_piece(t, id, false, NULL, 0);
    unsigned char *b = small;
    if (np + pl > sizeof small) {
        b = kvb_malloc(np + pl);
        if (!b) return KVB_ERR_NOMEM;
    }
    memcpy(b, s->pending, np);
    tok_piece(t, id, false, (char *)b + np, pl);
    unsigned char *p = b;
    size_t n = np + pl;
    if (s->at_start && pl > 0) { /* SentencePiece: the dummy-prefix space is not part of the text */
        if (np == 0 && p[0] == ' ') {
            p++;
            n--;
        }
        s->at_start = false;
    }
    enum kvb_status st = emit_utf8(s, p, n, false, out, len, cap);
    if (b != small) kvb_free(b);
    return st;
}

enum kvb_status tok_stream_flush(const struct tok *t, struct tok_stream *s, char **out, size_t *len, size_t *cap)
{
    (void)t;
    unsigned char p[sizeof s->pending];
    size_t n = (size_t)s->n_pending;
    memcpy(p, s->pending, n);
    s->n_pending = 0;
    return emit_utf8(s, p, n, true, out, len, cap);
}

enum kvb_status tok_stream_push_special(const struct tok *t, struct tok_stream *s, int32_t id, char **out, size_t *len,
                                        size_t *cap)
{
    const size_t shown = tok_piece(t, id, true, NULL, 0);
    if (tok_piece(t, id, false, NULL, 0) > 0 || shown == 0) return tok_stream_push(t, s, id, out, len, cap);
    /* a control token: what is held back cannot be completed by it */
    KVB_FORWARD_IF_ERROR(tok_stream_flush(t, s, out, len, cap));
    char small[256];
    char *piece = shown <= sizeof small ? small : kvb_malloc(shown);
    if (!piece) return KVB_ERR_NOMEM;
    tok_piece(t, id, true, piece, shown);
    enum kvb_status st = append(out, len, cap, piece, shown);
    if (piece != small) kvb_free(piece);
    return st;
}

enum kvb_status tok_decode(const struct tok *t, const int32_t *ids, size_t n, char **out, size_t *out_len)
{
    struct tok_stream s;
    tok_stream_init(&s, t);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    enum kvb_status st = append(&buf, &len, &cap, "", 0); /* "" even for no ids */
    for (size_t i = 0; i < n && st == KVB_OK; i++) st = tok_stream_push(t, &s, ids[i], &buf, &len, &cap);
    if (st == KVB_OK) st = tok_stream_flush(t, &s, &buf, &len, &cap);
    if (st != KVB_OK) {
        kvb_free(buf);
        *out = NULL;
        if (out_len) *out_len = 0;
        return st;
    }
    *out = buf;
    if (out_len) *out_len = len;
    return KVB_OK;
}
