/* json.c — strict JSON checking, jsmn tokenizing, string unescaping and
 * string escaping (see json.h for why the strict pass exists).
 *
 * This file holds the program's only copy of jsmn, compiled static. */
#define JSMN_STATIC
#include <jsmn.h>

#include "base/json.h"

#include <string.h>

#include "base/alloc.h"

/* ---- UTF-8 ------------------------------------------------------------------ */

size_t json_utf8_seq(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      /* no overlongs */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;      /* no overlongs */
        else if (c == 0xF4) hi = 0x8F; /* nothing past U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    for (; k < need; k++) {
        unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
        if (k >= n || s[k] < lo_k || s[k] > hi_k) {
            *bad = k;
            return 0;
        }
    }
    return need;
}

/* ---- strict syntax check ---------------------------------------------------- */

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Scans the string starting at s[*i] == '"'; leaves *i past the closing quote.
 * Byte values >= 0x80 are not checked here: bad UTF-8 is repaired on decode. */
static const char *scan_string(const unsigned char *s, size_t n, size_t *i)
{
    size_t p = *i + 1;
    for (;;) {
        if (p >= n) {
            *i = p;
            return "unterminated string";
        }
        unsigned char c = s[p];
        if (c == '"') break;
        if (c < 0x20) {
            *i = p;
            return "control character inside a string (escape it)";
        }
        if (c == '\\') {
            if (p + 1 >= n) {
                *i = p;
                return "unterminated string";
            }
            unsigned char e = s[p + 1];
            if (e == 'u') {
                for (int k = 0; k < 4; k++) {
                    if (p + 2 + k >= n || !is_hex(s[p + 2 + k])) {
                        *i = p;
                        return "bad \\u escape";
                    }
                }
                p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) {
                *i = p;
                return "invalid escape in string";
            }
            p += 2;
            continue;
        }
        p++;
    }
    *i = p + 1;
    return NULL;
}

static const char *scan_number(const unsigned char *s, size_t n, size_t *i)
{
    size_t p = *i;
    if (s[p] == '-') p++;
    if (p >= n || !is_digit(s[p])) {
        *i = p;
        return "bad number";
    }
    if (s[p] == '0') {
        p++;
    } else {
        while (p < n && is_digit(s[p])) p++;
    }
    if (p < n && s[p] == '.') {
        p++;
        if (p >= n || !is_digit(s[p])) {
            *i = p;
            return "bad number";
        }
        while (p < n && is_digit(s[p])) p++;
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < n && (s[p] == '+' || s[p] == '-')) p++;
        if (p >= n || !is_digit(s[p])) {
            *i = p;
            return "bad number";
        }
        while (p < n && is_digit(s[p])) p++;
    }
    *i = p;
    return NULL;
}

static const char *scan_literal(const unsigned char *s, size_t n, size_t *i)
{
    static const char *const lits[] = {"true", "false", "null"};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (n - *i >= l && memcmp(s + *i, lits[k], l) == 0) {
            *i += l;
            return NULL;
        }
    }
    return "expected a value";
}

enum chk_state {
    CHK_VALUE,          /* a value must come */
    CHK_VALUE_OR_CLOSE, /* just after '[' */
    CHK_KEY,            /* after ',' in an object */
    CHK_KEY_OR_CLOSE,   /* just after '{' */
    CHK_AFTER_VALUE,    /* ',' or the container's close, or the end at depth 0 */
};

/* A value-level scan after which no further token may follow: the whole
 * text must be one JSON value. Iterative, so deep nesting costs only the
 * fixed stack below. */
static const char *check_syntax(const unsigned char *s, size_t n, size_t *where)
{
    char stack[JSON_MAX_DEPTH];
    int depth = 0;
    enum chk_state st = CHK_VALUE;
    size_t i = 0;
    const char *why = NULL;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) {
            if (st == CHK_AFTER_VALUE && depth == 0) return NULL;
            *where = i;
            return i == 0 || (depth == 0 && st == CHK_VALUE) ? "no JSON value" : "unexpected end of line";
        }
        unsigned char c = s[i];
        switch (st) {
        case CHK_VALUE:
        case CHK_VALUE_OR_CLOSE:
            if (st == CHK_VALUE_OR_CLOSE && c == ']') {
                depth--;
                i++;
                st = CHK_AFTER_VALUE;
                break;
            }
            if (c == '{' || c == '[') {
                if (depth == JSON_MAX_DEPTH) {
                    *where = i;
                    return "nesting too deep";
                }
                stack[depth++] = (char)c;
                i++;
                st = c == '{' ? CHK_KEY_OR_CLOSE : CHK_VALUE_OR_CLOSE;
                break;
            }
            if (c == '"') why = scan_string(s, n, &i);
            else if (c == '-' || is_digit(c)) why = scan_number(s, n, &i);
            else why = scan_literal(s, n, &i);
            if (why) {
                *where = i;
                return why;
            }
            st = CHK_AFTER_VALUE;
            break;
        case CHK_KEY:
        case CHK_KEY_OR_CLOSE:
            if (st == CHK_KEY_OR_CLOSE && c == '}') {
                depth--;
                i++;
                st = CHK_AFTER_VALUE;
                break;
            }
            if (c != '"') {
                *where = i;
                return "expected a string key";
            }
            why = scan_string(s, n, &i);
            if (why) {
                *where = i;
                return why;
            }
            while (i < n && is_ws(s[i])) i++;
            if (i >= n || s[i] != ':') {
                *where = i;
                return "expected ':' after a key";
            }
            i++;
            st = CHK_VALUE;
            break;
        case CHK_AFTER_VALUE:
            if (depth == 0) {
                *where = i;
                return "unexpected text after the JSON value";
            }
            if (c == ',') {
                i++;
                st = stack[depth - 1] == '{' ? CHK_KEY : CHK_VALUE;
            } else if ((c == '}' && stack[depth - 1] == '{') || (c == ']' && stack[depth - 1] == '[')) {
                depth--;
                i++;
            } else {
                *where = i;
                return stack[depth - 1] == '{' ? "expected ',' or '}'" : "expected ',' or ']'";
            }
            break;
        }
    }
}

/* ---- tokens ------------------------------------------------------------------ */

int json_skip(const struct json_doc *j, int i)
{
    /* Iterative: `pending` counts the subtrees still to pass over. An object
     * token's size counts keys, and each key token has its value as its one
     * child, so sizes add up the same way for objects and arrays. */
    int pending = 1;
    while (pending > 0 && i < j->ntok) {
        pending += j->tok[i].size - 1;
        i++;
    }
    return i;
}

enum kvb_status json_parse(const char *src, size_t len, struct json_doc *j, const char **why, size_t *where)
{
    memset(j, 0, sizeof *j);
    *why = NULL;
    *where = 0;
    if (len > JSON_MAX_LEN) {
        *why = "line longer than 1 GiB";
        return KVB_ERR_FORMAT;
    }
    *why = check_syntax((const unsigned char *)src, len, where);
    if (*why) return KVB_ERR_FORMAT;

    jsmn_parser p;
    jsmn_init(&p);
    int count = jsmn_parse(&p, src, len, NULL, 0);
    if (count <= 0) goto disagree;
    jsmntok_t *tok = kvb_malloc((size_t)count * sizeof *tok);
    if (!tok) return KVB_ERR_NOMEM;
    jsmn_init(&p);
    int got = jsmn_parse(&p, src, len, tok, (unsigned)count);
    if (got != count) {
        kvb_free(tok);
        goto disagree;
    }
    j->src = src;
    j->len = len;
    j->tok = tok;
    j->ntok = count;
    /* The checker accepted the text, so jsmn must have built one tree that
     * covers all tokens; anything else would be a jsmn quirk we do not
     * understand, and a line we do not understand is refused, not guessed. */
    if (json_skip(j, 0) != count) {
        json_free(j);
        goto disagree;
    }
    return KVB_OK;
disagree:
    *why = "JSON not understood by the tokenizer";
    return KVB_ERR_FORMAT;
}

void json_free(struct json_doc *j)
{
    if (!j) return;
    kvb_free(j->tok);
    memset(j, 0, sizeof *j);
}

enum json_kind json_kind(const struct json_doc *j, int i)
{
    const jsmntok_t *t = &j->tok[i];
    switch (t->type) {
    case JSMN_OBJECT: return JSON_OBJECT;
    case JSMN_ARRAY: return JSON_ARRAY;
    case JSMN_STRING: return JSON_STRING;
    default: break;
    }
    switch (j->src[t->start]) {
    case 't': return JSON_TRUE;
    case 'f': return JSON_FALSE;
    case 'n': return JSON_NULL;
    default: return JSON_NUMBER; /* the checker allowed nothing else */
    }
}

/* ---- strings ----------------------------------------------------------------- */

static unsigned hex4(const unsigned char *s)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = s[k];
        v = v * 16 + (unsigned)(is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static size_t put_cp(char *dst, uint32_t cp)
{
    unsigned char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (dst) memcpy(dst, b, n);
    return n;
}

/* Unescapes string token i into dst (when non-NULL) and returns the length.
 * exact (for identities such as custom_id, job.h): a lone surrogate is kept
 * as the three bytes UTF-8's pattern gives its code point, \u0000 becomes
 * C0 80, and raw bytes that are not valid UTF-8 set *bad (no replacement),
 * so distinct JSON strings always decode to distinct bytes with no NUL.
 * Otherwise all three become U+FFFD. */
static size_t str_decode(const struct json_doc *j, int i, char *dst, bool exact, bool *bad_utf8)
{
    const unsigned char *s = (const unsigned char *)j->src + j->tok[i].start;
    size_t n = (size_t)(j->tok[i].end - j->tok[i].start), o = 0, p = 0;
    while (p < n) {
        unsigned char c = s[p];
        if (c == '\\') {
            unsigned char e = s[p + 1]; /* the checker guarantees a full escape */
            if (e != 'u') {
                char out;
                switch (e) {
                case 'b': out = '\b'; break;
                case 'f': out = '\f'; break;
                case 'n': out = '\n'; break;
                case 'r': out = '\r'; break;
                case 't': out = '\t'; break;
                default: out = (char)e; break; /* \" \\ \/ */
                }
                if (dst) dst[o] = out;
                o++;
                p += 2;
                continue;
            }
            uint32_t cp = hex4(s + p + 2);
            p += 6;
            if (exact && cp == 0) {
                if (dst) memcpy(dst + o, "\xC0\x80", 2);
                o += 2;
                continue;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                /* A high surrogate joins a following low one; alone it is
                 * damaged text and becomes U+FFFD (job.h). */
                if (p + 6 <= n && s[p] == '\\' && s[p + 1] == 'u') {
                    uint32_t lo = hex4(s + p + 2);
                    if (lo >= 0xDC00 && lo <= 0xDFFF) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        p += 6;
                    } else if (!exact) {
                        cp = 0xFFFD;
                    }
                } else if (!exact) {
                    cp = 0xFFFD;
                }
            } else if (!exact && ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0)) {
                cp = 0xFFFD; /* lone low surrogate; NUL would cut C strings short */
            }
            o += put_cp(dst ? dst + o : NULL, cp);
            continue;
        }
        if (c < 0x80) {
            if (dst) dst[o] = (char)c;
            o++;
            p++;
            continue;
        }
        size_t bad = 0, k = json_utf8_seq(s + p, n - p, &bad);
        if (k) {
            if (dst) memcpy(dst + o, s + p, k);
            o += k;
            p += k;
        } else {
            if (exact) *bad_utf8 = true;
            o += put_cp(dst ? dst + o : NULL, 0xFFFD);
            p += bad;
        }
    }
    return o;
}

size_t json_str_decode(const struct json_doc *j, int i, char *dst) { return str_decode(j, i, dst, false, NULL); }

enum kvb_status json_str_dup(const struct json_doc *j, int i, char **out, size_t *out_len)
{
    size_t n = json_str_decode(j, i, NULL);
    char *d = kvb_malloc(n + 1);
    if (!d) return KVB_ERR_NOMEM;
    json_str_decode(j, i, d);
    d[n] = '\0';
    *out = d;
    if (out_len) *out_len = n;
    return KVB_OK;
}

enum kvb_status json_str_dup_exact(const struct json_doc *j, int i, char **out, size_t *out_len)
{
    bool bad = false;
    size_t n = str_decode(j, i, NULL, true, &bad);
    if (bad) return KVB_ERR_FORMAT;
    char *d = kvb_malloc(n + 1);
    if (!d) return KVB_ERR_NOMEM;
    str_decode(j, i, d, true, &bad);
    d[n] = '\0';
    *out = d;
    if (out_len) *out_len = n;
    return KVB_OK;
}

bool json_str_eq(const struct json_doc *j, int i, const char *lit)
{
    const jsmntok_t *t = &j->tok[i];
    if (t->type != JSMN_STRING) return false;
    const char *s = j->src + t->start;
    size_t n = (size_t)(t->end - t->start), l = strlen(lit);
    if (!memchr(s, '\\', n)) return n == l && memcmp(s, lit, n) == 0;
    /* Escaped text: decode into a small buffer; a literal we compare with is
     * short, so anything that decodes longer cannot match. */
    char buf[64];
    if (l >= sizeof buf || n > 6 * sizeof buf) return false;
    size_t dl = json_str_decode(j, i, NULL);
    if (dl != l) return false;
    json_str_decode(j, i, buf);
    return memcmp(buf, lit, l) == 0;
}

int json_get(const struct json_doc *j, int obj, const char *key)
{
    if (obj < 0 || obj >= j->ntok || j->tok[obj].type != JSMN_OBJECT) return -1;
    int found = -1, i = obj + 1;
    for (int k = 0; k < j->tok[obj].size; k++) {
        if (json_str_eq(j, i, key)) found = i + 1;
        i = json_skip(j, i + 1);
    }
    return found;
}

/* ---- writing ------------------------------------------------------------------------- */

static void put(struct kvb_buf *b, const char *s, size_t n) /* room reserved by the caller */
{
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

enum kvb_status json_put_string(struct kvb_buf *b, const char *s, size_t n)
{
    static const char hexd[] = "0123456789abcdef";
    const size_t start = b->len;
    /* worst case 6 output bytes per input byte (\u00XX); reserve per run of
     * plain bytes instead to keep large texts cheap */
    if (kvb_buf_reserve(b, n + 2) != KVB_OK) return KVB_ERR_NOMEM;
    put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && u[run] >= 0x20 && u[run] < 0x80 && u[run] != '"' && u[run] != '\\') run++;
        const char *piece = s + i;
        size_t len = run - i;
        char e[7] = {'\\', 0, 0, 0, 0, 0, 0};
        if (len) {
            i = run;
        } else if (u[i] < 0x80) {
            len = 2;
            switch (u[i]) {
            case '"': e[1] = '"'; break;
            case '\\': e[1] = '\\'; break;
            case '\b': e[1] = 'b'; break;
            case '\f': e[1] = 'f'; break;
            case '\n': e[1] = 'n'; break;
            case '\r': e[1] = 'r'; break;
            case '\t': e[1] = 't'; break;
            default:
                e[1] = 'u';
                e[2] = '0';
                e[3] = '0';
                e[4] = hexd[u[i] >> 4];
                e[5] = hexd[u[i] & 15];
                len = 6;
                break;
            }
            piece = e;
            i++;
        } else {
            size_t bad = 0;
            len = json_utf8_seq(u + i, n - i, &bad);
            if (len) {
                i += len;
            } else {
                piece = "\xEF\xBF\xBD"; /* U+FFFD */
                len = 3;
                i += bad;
            }
        }
        if (kvb_buf_reserve(b, len + 1) != KVB_OK) {
            b->len = start;
            return KVB_ERR_NOMEM;
        }
        put(b, piece, len);
    }
    put(b, "\"", 1); /* the +1 above */
    return KVB_OK;
}
