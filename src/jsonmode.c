/* jsonmode.c — the JSON-object recogniser and the token mask built on it
 * (see jsonmode.h). */
#include "jsonmode.h"

#include <math.h>
#include <string.h>

#include "alloc.h"

enum mode {
    M_START,     /* before the top-level object: whitespace, '{' */
    M_OBJ_FIRST, /* after '{': whitespace, a key, '}' */
    M_OBJ_KEY,   /* after ',' in an object: whitespace, a key */
    M_COLON,     /* after a key: whitespace, ':' */
    M_VALUE,     /* after ':' or ',' in an array: whitespace, a value */
    M_ARR_FIRST, /* after '[': whitespace, a value, ']' */
    M_AFTER,     /* after a value inside a container: whitespace, ',', its closer */
    M_STR,       /* inside a string */
    M_ESC,       /* after a backslash */
    M_HEX,       /* inside \uXXXX (sub: digits seen) */
    M_NEG,       /* after a number's '-' */
    M_ZERO,      /* a number's integer part is 0 */
    M_INT,       /* integer digits 1-9… */
    M_DOT,       /* after '.' */
    M_FRAC,      /* fraction digits */
    M_EXP,       /* after 'e' */
    M_EXP_SIGN,  /* after the exponent's sign */
    M_EXP_DIGIT, /* exponent digits */
    M_LIT,       /* inside true / false / null (lit, sub) */
    M_DONE,      /* the object is closed */
    M_BROKEN,    /* a token that was not allowed got accepted */
};

static const char *const literals[3] = {"true", "false", "null"};

void jsonmode_init(struct jsonmode_state *s) { memset(s, 0, sizeof *s); /* M_START */ }

bool jsonmode_complete(const struct jsonmode_state *s) { return s->mode == M_DONE; }

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static bool in_array(const struct jsonmode_state *s) { return (s->arrays >> (s->depth - 1)) & 1u; }

static bool push(struct jsonmode_state *s, bool array)
{
    if (s->depth == JSONMODE_MAX_DEPTH) return false;
    if (array) s->arrays |= (uint64_t)1 << s->depth;
    else s->arrays &= ~((uint64_t)1 << s->depth);
    s->depth++;
    s->mode = array ? M_ARR_FIRST : M_OBJ_FIRST;
    return true;
}

static void pop(struct jsonmode_state *s)
{
    s->depth--;
    s->mode = s->depth == 0 ? M_DONE : M_AFTER;
}

/* A value ended (string, number, literal): what follows it. */
static void value_done(struct jsonmode_state *s) { s->mode = M_AFTER; }

/* The first byte of a value. */
static bool value_start(struct jsonmode_state *s, unsigned char c)
{
    switch (c) {
    case '{': return push(s, false);
    case '[': return push(s, true);
    case '"':
        s->mode = M_STR;
        s->key = false;
        return true;
    case '-': s->mode = M_NEG; return true;
    case '0': s->mode = M_ZERO; return true;
    case 't': case 'f': case 'n':
        s->mode = M_LIT;
        s->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->sub = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = M_INT;
            return true;
        }
        return false;
    }
}

static bool step(struct jsonmode_state *s, unsigned char c)
{
    /* Whitespace where the grammar allows it, in runs of bounded length. */
    switch (s->mode) {
    case M_START: case M_OBJ_FIRST: case M_OBJ_KEY: case M_COLON: case M_VALUE: case M_ARR_FIRST: case M_AFTER:
        if (is_ws(c)) return ++s->ws <= JSONMODE_MAX_WS;
        s->ws = 0;
        break;
    default:
        break;
    }
    switch (s->mode) {
    case M_START:
        return c == '{' && push(s, false);
    case M_OBJ_FIRST:
    case M_OBJ_KEY:
        if (c == '}' && s->mode == M_OBJ_FIRST) {
            pop(s);
            return true;
        }
        if (c != '"') return false;
        s->mode = M_STR;
        s->key = true;
        return true;
    case M_COLON:
        if (c != ':') return false;
        s->mode = M_VALUE;
        return true;
    case M_ARR_FIRST:
        if (c == ']') {
            pop(s);
            return true;
        }
        return value_start(s, c);
    case M_VALUE:
        return value_start(s, c);
    case M_AFTER:
        if (c == ',') {
            s->mode = in_array(s) ? M_VALUE : M_OBJ_KEY;
            return true;
        }
        if (c == (in_array(s) ? ']' : '}')) {
            pop(s);
            return true;
        }
        return false;
    case M_STR:
        if (c == '"') {
            if (s->key) s->mode = M_COLON;
            else value_done(s);
            return true;
        }
        if (c == '\\') {
            s->mode = M_ESC;
            return true;
        }
        return c >= 0x20; /* control characters must be escaped */
    case M_ESC:
        if (c == 'u') {
            s->mode = M_HEX;
            s->sub = 0;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return false;
        s->mode = M_STR;
        return true;
    case M_HEX:
        if (!is_hex(c)) return false;
        if (++s->sub == 4) s->mode = M_STR;
        return true;
    case M_NEG:
        if (c == '0') s->mode = M_ZERO;
        else if (c >= '1' && c <= '9') s->mode = M_INT;
        else return false;
        return true;
    case M_ZERO:
    case M_INT:
    case M_FRAC:
        if (is_digit(c) && s->mode != M_ZERO) return true;
        if (c == '.' && s->mode != M_FRAC) {
            s->mode = M_DOT;
            return true;
        }
        if (c == 'e' || c == 'E') {
            s->mode = M_EXP;
            return true;
        }
        value_done(s); /* the number ended: the byte belongs to what follows */
        return step(s, c);
    case M_DOT:
        if (!is_digit(c)) return false;
        s->mode = M_FRAC;
        return true;
    case M_EXP:
    case M_EXP_SIGN:
        if ((c == '+' || c == '-') && s->mode == M_EXP) {
            s->mode = M_EXP_SIGN;
            return true;
        }
        if (!is_digit(c)) return false;
        s->mode = M_EXP_DIGIT;
        return true;
    case M_EXP_DIGIT:
        if (is_digit(c)) return true;
        value_done(s);
        return step(s, c);
    case M_LIT:
        if (c != (unsigned char)literals[s->lit][s->sub]) return false;
        if (literals[s->lit][++s->sub] == '\0') value_done(s);
        return true;
    default: /* M_DONE, M_BROKEN */
        return false;
    }
}

bool jsonmode_feed(struct jsonmode_state *s, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!step(s, (unsigned char)bytes[i])) return false;
    return true;
}

/* ---- tokens -------------------------------------------------------------------------- */

struct jsonmode_vocab {
    int32_t n;
    uint32_t *off;  /* (n + 1) token i's bytes: bytes[off[i] .. off[i+1]) */
    char *bytes;
    uint8_t *eog;   /* (n) 1: an end-of-generation token */
};

void jsonmode_vocab_free(struct jsonmode_vocab *v)
{
    if (!v) return;
    kvb_free(v->off);
    kvb_free(v->bytes);
    kvb_free(v->eog);
    kvb_free(v);
}

int32_t jsonmode_vocab_size(const struct jsonmode_vocab *v) { return v ? v->n : 0; }

enum kvb_status jsonmode_vocab_create(const struct tok *t, struct jsonmode_vocab **out, struct kvb_err *err)
{
    *out = NULL;
    struct jsonmode_vocab *v = kvb_calloc(1, sizeof *v);
    const int32_t n = tok_n_vocab(t);
    if (v) {
        v->n = n;
        v->off = kvb_malloc(sizeof *v->off * ((size_t)n + 1));
        v->eog = kvb_calloc((size_t)n ? (size_t)n : 1, 1);
    }
    if (!v || !v->off || !v->eog) {
        jsonmode_vocab_free(v);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the JSON mode's vocabulary");
    }
    /* Two passes: sizes, then bytes. */
    char piece[256];
    size_t total = 0;
    bool any_eog = false;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = (uint32_t)total;
        v->eog[i] = tok_is_eog(t, i);
        any_eog |= v->eog[i];
        if (!v->eog[i]) total += tok_piece(t, i, false, piece, sizeof piece);
    }
    v->off[n] = (uint32_t)total;
    v->bytes = kvb_malloc(total ? total : 1);
    if (!v->bytes) {
        jsonmode_vocab_free(v);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the JSON mode's vocabulary");
    }
    for (int32_t i = 0; i < n; i++) {
        const size_t len = v->off[i + 1] - v->off[i];
        if (len == 0) continue;
        char *dst = v->bytes + v->off[i];
        if (len <= sizeof piece) {
            tok_piece(t, i, false, piece, sizeof piece);
            memcpy(dst, piece, len);
        } else {
            tok_piece(t, i, false, dst, len); /* a token longer than the scratch */
        }
    }
    if (!any_eog) {
        jsonmode_vocab_free(v);
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "the vocabulary has no end-of-generation token");
    }
    *out = v;
    return KVB_OK;
}

bool jsonmode_allows(const struct jsonmode_vocab *v, const struct jsonmode_state *s, int32_t token)
{
    if (token < 0 || token >= v->n) return false;
    if (v->eog[token]) return s->mode == M_DONE || s->mode == M_BROKEN;
    const uint32_t a = v->off[token], b = v->off[token + 1];
    if (a == b) return false;
    struct jsonmode_state t = *s;
    return jsonmode_feed(&t, v->bytes + a, b - a);
}

int32_t jsonmode_mask(const struct jsonmode_vocab *v, const struct jsonmode_state *s, float *logits)
{
    int32_t left = 0;
    for (int32_t i = 0; i < v->n; i++) {
        if (jsonmode_allows(v, s, i)) left++;
        else logits[i] = -INFINITY;
    }
    return left;
}

void jsonmode_accept(const struct jsonmode_vocab *v, struct jsonmode_state *s, int32_t token)
{
    if (s->mode == M_BROKEN) return;
    if (!jsonmode_allows(v, s, token)) {
        s->mode = M_BROKEN;
        return;
    }
    if (!v->eog[token]) jsonmode_feed(s, v->bytes + v->off[token], v->off[token + 1] - v->off[token]);
}
