/* jinja_lex.c — the template's text into tokens, as jinja2's lexer splits it
 * with transformers' settings: trim_blocks (one newline after a block or
 * comment tag is dropped), lstrip_blocks (spaces and tabs from the start of
 * a line to a block or comment tag are dropped), `-` and `+` on tags, raw
 * blocks, newlines normalised to "\n" and one trailing newline dropped.
 * Comments produce no token; text between tags is one JT_DATA token. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "text/jinja_internal.h"

struct lex {
    struct jinja_template *t;
    const char *s;
    size_t n, pos;
    uint32_t line;
    bool line_starting; /* the last match ended with a newline */
    struct jtoks *out;
    char bal[256]; /* open brackets inside a tag */
    int nbal;
};

static _Noreturn void lfail(struct lex *L, const char *fmt, const char *arg)
{
    L->t->f.line = L->line;
    jfail(&L->t->f, KVB_ERR_FORMAT, fmt, arg);
}

static struct jtok *push(struct lex *L, enum jt type)
{
    struct jtoks *o = L->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        struct jtok *v = ja_alloc(&L->t->ar, cap * sizeof *v);
        if (o->n) memcpy(v, o->v, o->n * sizeof *v);
        o->v = v;
        o->cap = cap;
    }
    struct jtok *k = &o->v[o->n++];
    memset(k, 0, sizeof *k);
    k->type = (uint8_t)type;
    k->line = L->line;
    return k;
}

static void count_lines(struct lex *L, size_t a, size_t b)
{
    for (size_t i = a; i < b; i++) L->line += L->s[i] == '\n';
}

/* Python's \s (str.isspace) at s[i]: its byte length, or 0. */
static size_t space_at(const char *s, size_t n, size_t i)
{
    size_t j = i;
    uint32_t c = ju_decode(s, n, &j);
    return ju_isspace(c) ? j - i : 0;
}

static size_t skip_spaces(const char *s, size_t n, size_t i)
{
    size_t k;
    while (i < n && (k = space_at(s, n, i)) > 0) i += k;
    return i;
}

/* Length of text[0..n) once trailing white space is stripped (str.rstrip). */
static size_t rstrip_len(const char *s, size_t n)
{
    size_t end = 0, i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t c = ju_decode(s, n, &j);
        if (!ju_isspace(c)) end = j;
        i = j;
    }
    return end;
}

/* Whether s[a..b) is all white space and not empty. */
static bool all_space(const char *s, size_t a, size_t b)
{
    if (a >= b) return false;
    return skip_spaces(s, b, a) == b;
}

/* Emits text s[a..b) before a tag whose sign is sign ('-', '+' or 0),
 * lstrip applying unless the tag is a variable's. */
static void emit_data(struct lex *L, size_t a, size_t b, char sign, bool lstrip)
{
    size_t end = b;
    if (sign == '-') {
        end = a + rstrip_len(L->s + a, b - a);
    } else if (sign != '+' && lstrip) {
        size_t l = a;
        for (size_t i = b; i > a; i--)
            if (L->s[i - 1] == '\n') {
                l = i;
                break;
            }
        if ((l > a || L->line_starting) && all_space(L->s, l, b)) end = l;
    }
    if (end > a) {
        struct jtok *k = push(L, JT_DATA);
        k->s = L->s + a;
        k->n = end - a;
    }
    count_lines(L, a, b);
}

/* The end of a block or comment tag at L->pos ("%}" or "#}" as close):
 * returns the position after it (with the white space it trims), or 0 when
 * none is there. */
static size_t tag_end(struct lex *L, size_t i, char close)
{
    const char *s = L->s;
    size_t n = L->n;
    if (i + 2 < n && (s[i] == '+' || s[i] == '-') && s[i + 1] == close && s[i + 2] == '}') {
        if (s[i] == '+') return i + 3;
        return skip_spaces(s, n, i + 3);
    }
    if (i + 1 < n && s[i] == close && s[i + 1] == '}') {
        size_t j = i + 2;
        if (j < n && s[j] == '\n') j++; /* trim_blocks */
        return j;
    }
    return 0;
}

static void finish_match(struct lex *L, size_t from, size_t to)
{
    count_lines(L, from, to);
    L->line_starting = to > from && L->s[to - 1] == '\n';
    L->pos = to;
}

static bool is_ident_start(unsigned char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80; }
static bool is_ident(unsigned char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }

/* Digits with single underscores between them, from s[i]; returns the end
 * (i when there is no digit). */
static size_t digits(const char *s, size_t n, size_t i, int base)
{
    size_t j = i;
    bool need = true;
    while (j < n) {
        char c = s[j];
        int v = (c >= '0' && c <= '9') ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'f') ? (c | 32) - 'a' + 10 : 99;
        if (v < base) {
            j++;
            need = false;
        } else if (c == '_' && !need && j + 1 < n) {
            char d = s[j + 1];
            int w = (d >= '0' && d <= '9') ? d - '0' : ((d | 32) >= 'a' && (d | 32) <= 'f') ? (d | 32) - 'a' + 10 : 99;
            if (w >= base) break;
            j++;
            need = true;
        } else break;
    }
    return need && j > i ? j - 1 : j;
}

static void copy_digits(const char *s, size_t a, size_t b, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = a; i < b && k + 1 < cap; i++)
        if (s[i] != '_') out[k++] = s[i];
    out[k] = '\0';
}

/* A number at L->pos: jinja2's float rule first, then its integer rule. */
static bool lex_number(struct lex *L)
{
    const char *s = L->s;
    size_t n = L->n, i = L->pos;
    if (!(s[i] >= '0' && s[i] <= '9')) return false;
    /* float: digits, then (.digits)? e[+-]digits, or .digits; not after a '.' */
    if (!(i > 0 && s[i - 1] == '.')) {
        size_t a = digits(s, n, i, 10), j = a, end = 0;
        if (j < n && s[j] == '.') {
            size_t f = digits(s, n, j + 1, 10);
            if (f > j + 1) {
                end = f;
                j = f;
            }
        }
        if (j < n && (s[j] | 32) == 'e') {
            size_t k = j + 1;
            if (k < n && (s[k] == '+' || s[k] == '-')) k++;
            size_t e = digits(s, n, k, 10);
            if (e > k) end = e;
        }
        if (end) {
            char buf[128];
            copy_digits(s, i, end, buf, sizeof buf);
            struct jtok *k = push(L, JT_FLOAT);
            k->f = strtod(buf, NULL);
            finish_match(L, i, end);
            return true;
        }
    }
    int base = 10;
    size_t start = i, end;
    if (s[i] == '0' && i + 1 < n && ((s[i + 1] | 32) == 'b' || (s[i + 1] | 32) == 'o' || (s[i + 1] | 32) == 'x')) {
        base = (s[i + 1] | 32) == 'b' ? 2 : (s[i + 1] | 32) == 'o' ? 8 : 16;
        size_t j = i + 2;
        if (j < n && s[j] == '_') j++;
        end = digits(s, n, j, base);
        if (end == j) base = 10; /* "0x" alone: the decimal zero */
        else start = i + 2;
    }
    if (base == 10) {
        if (s[i] == '0') { /* 0(_?0)* */
            end = i + 1;
            while (end < n && (s[end] == '0' || (s[end] == '_' && end + 1 < n && s[end + 1] == '0')))
                end += s[end] == '_' ? 2 : 1;
        } else end = digits(s, n, i, 10);
    }
    char buf[128];
    copy_digits(s, start, end, buf, sizeof buf);
    errno = 0;
    unsigned long long v = strtoull(buf, NULL, base);
    if (errno || v > (unsigned long long)INT64_MAX) lfail(L, "the integer %s is too large", buf);
    struct jtok *k = push(L, JT_INT);
    k->i = (int64_t)v;
    finish_match(L, i, end);
    return true;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c |= 32;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A string literal at L->pos, decoded as Python's unicode-escape does. */
static bool lex_string(struct lex *L)
{
    const char *s = L->s;
    size_t n = L->n, i = L->pos;
    const char q = s[i];
    if (q != '\'' && q != '"') return false;
    size_t j = i + 1;
    while (j < n && s[j] != q) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
    if (j >= n) return false; /* unterminated: an unexpected char, as jinja2 says */
    struct jsb b;
    jsb_init(&b, &L->t->ar);
    for (size_t k = i + 1; k < j;) {
        char c = s[k];
        if (c != '\\' || k + 1 >= j) {
            jsb_putc(&b, c);
            k++;
            continue;
        }
        char e = s[k + 1];
        k += 2;
        switch (e) {
        case '\n': break;
        case '\\': jsb_putc(&b, '\\'); break;
        case '\'': jsb_putc(&b, '\''); break;
        case '"': jsb_putc(&b, '"'); break;
        case 'a': jsb_putc(&b, '\a'); break;
        case 'b': jsb_putc(&b, '\b'); break;
        case 'f': jsb_putc(&b, '\f'); break;
        case 'n': jsb_putc(&b, '\n'); break;
        case 'r': jsb_putc(&b, '\r'); break;
        case 't': jsb_putc(&b, '\t'); break;
        case 'v': jsb_putc(&b, '\v'); break;
        case 'x':
        case 'u':
        case 'U': {
            int want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int d = 0; d < want; d++) {
                int h = k + (size_t)d < j ? hexval(s[k + (size_t)d]) : -1;
                if (h < 0)
                    lfail(L, "truncated \\%s escape in a string", e == 'x' ? "xXX" : e == 'u' ? "uXXXX" : "UXXXXXXXX");
                v = v * 16 + (uint32_t)h;
            }
            k += (size_t)want;
            if (v > 0x10FFFF) lfail(L, "illegal Unicode character%s in a string", "");
            jsb_put_cp(&b, v, false);
            break;
        }
        case 'N': lfail(L, "named Unicode escapes (\\N{...}) are not supported%s", ""); break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && k < j && s[k] >= '0' && s[k] <= '7'; d++) v = v * 8 + (uint32_t)(s[k++] - '0');
                jsb_put_cp(&b, v, false);
            } else { /* an unknown escape stays as written */
                jsb_putc(&b, '\\');
                jsb_putc(&b, e);
            }
        }
    }
    const struct jstr *str = jsb_finish(&b);
    struct jtok *k = push(L, JT_STRING);
    k->s = str->s;
    k->n = str->len;
    finish_match(L, i, j + 1);
    return true;
}

static const char *const k_ops2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char k_ops1[] = "+-/*%~[](){}><=.:|,;";

static bool lex_op(struct lex *L)
{
    const char *s = L->s + L->pos;
    size_t left = L->n - L->pos;
    size_t len = 0;
    for (size_t k = 0; k < sizeof k_ops2 / sizeof k_ops2[0] && !len; k++)
        if (left >= 2 && s[0] == k_ops2[k][0] && s[1] == k_ops2[k][1]) len = 2;
    if (!len && strchr(k_ops1, s[0]) && s[0]) len = 1;
    if (!len) return false;
    if (len == 1) {
        char c = s[0];
        if (c == '(' || c == '[' || c == '{') {
            if (L->nbal == (int)sizeof L->bal) lfail(L, "brackets nested too deeply%s", "");
            L->bal[L->nbal++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (c == ')' || c == ']' || c == '}') {
            char want[2] = {c, 0};
            if (L->nbal == 0) lfail(L, "unexpected '%s'", want);
            if (L->bal[--L->nbal] != c) lfail(L, "unexpected '%s'", want);
        }
    }
    struct jtok *k = push(L, JT_OP);
    memcpy(k->op, s, len);
    finish_match(L, L->pos, L->pos + len);
    return true;
}

/* The inside of a {% %} or {{ }} tag, up to and past its end. */
static void lex_tag(struct lex *L, bool block)
{
    L->nbal = 0;
    for (;;) {
        const char *s = L->s;
        size_t n = L->n, i = L->pos;
        if (i >= n) lfail(L, "unexpected end of template: a %s is not closed", block ? "{% tag" : "{{ tag");
        if (L->nbal == 0) {
            size_t e = 0;
            if (block) e = tag_end(L, i, '%');
            else if (s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}') e = skip_spaces(s, n, i + 3);
            else if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') e = i + 2;
            if (e) {
                push(L, block ? JT_BLOCK_END : JT_VAR_END);
                finish_match(L, i, e);
                return;
            }
        }
        size_t sp = skip_spaces(s, n, i);
        if (sp > i) {
            finish_match(L, i, sp);
            continue;
        }
        if (lex_number(L)) continue;
        if (is_ident_start((unsigned char)s[i])) {
            size_t j = i + 1;
            while (j < n && is_ident((unsigned char)s[j])) j++;
            struct jtok *k = push(L, JT_NAME);
            k->s = s + i;
            k->n = j - i;
            finish_match(L, i, j);
            continue;
        }
        if (lex_string(L)) continue;
        if (lex_op(L)) continue;
        char c[8] = {s[i], 0};
        if ((unsigned char)s[i] < 0x20) snprintf(c, sizeof c, "\\x%02x", (unsigned char)s[i]);
        lfail(L, "unexpected char '%s'", c);
    }
}

/* {% raw %} at i (its sign already read): returns the position after the
 * opening tag, or 0 when this {% is not a raw tag. */
static size_t raw_open(struct lex *L, size_t i)
{
    const char *s = L->s;
    size_t n = L->n, j = i + 2;
    if (j < n && (s[j] == '-' || s[j] == '+')) j++;
    j = skip_spaces(s, n, j);
    if (n - j < 3 || memcmp(s + j, "raw", 3) != 0) return 0;
    j = skip_spaces(s, n, j + 3);
    if (j + 2 < n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') return skip_spaces(s, n, j + 3);
    if (j + 1 < n && s[j] == '%' && s[j + 1] == '}') return j + 2;
    return 0;
}

/* The end of a raw block from L->pos: the data before it and the tag. */
static void raw_body(struct lex *L)
{
    const char *s = L->s;
    size_t n = L->n;
    for (size_t i = L->pos; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t j = i + 2;
        char sign = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) sign = s[j++];
        j = skip_spaces(s, n, j);
        if (n - j < 6 || memcmp(s + j, "endraw", 6) != 0) continue;
        j = skip_spaces(s, n, j + 6);
        size_t e = tag_end(L, j, '%');
        if (!e) continue;
        emit_data(L, L->pos, i, sign, true);
        finish_match(L, i, e);
        return;
    }
    lfail(L, "missing end of raw directive%s", "");
}

void jlex(struct jinja_template *t, struct jtoks *out)
{
    struct lex L = {.t = t, .s = t->src, .n = t->src_len, .line = 1, .line_starting = true, .out = out};
    const char *s = L.s;
    size_t n = L.n;
    while (L.pos < n) {
        size_t i = L.pos;
        while (i + 1 < n && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#'))) i++;
        if (i + 1 >= n) { /* the rest is text */
            struct jtok *k = push(&L, JT_DATA);
            k->s = s + L.pos;
            k->n = n - L.pos;
            count_lines(&L, L.pos, n);
            break;
        }
        const char kind = s[i + 1];
        size_t after = i + 2;
        char sign = 0;
        if (after < n && (s[after] == '-' || s[after] == '+')) sign = s[after++];
        if (kind == '%') {
            size_t r = raw_open(&L, i);
            if (r) {
                emit_data(&L, L.pos, i, sign, true);
                finish_match(&L, i, r);
                raw_body(&L);
                continue;
            }
        }
        emit_data(&L, L.pos, i, sign, kind != '{');
        finish_match(&L, i, after);
        if (kind == '#') {
            size_t j = after, e = 0;
            for (; j + 1 < n; j++) {
                if (s[j] == '#' && s[j + 1] == '}') {
                    e = tag_end(&L, j, '#');
                    break;
                }
                if ((s[j] == '-' || s[j] == '+') && j + 2 < n && s[j + 1] == '#' && s[j + 2] == '}') {
                    e = tag_end(&L, j, '#');
                    break;
                }
            }
            if (!e) lfail(&L, "missing end of comment tag%s", "");
            finish_match(&L, after, e);
            continue;
        }
        push(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN);
        lex_tag(&L, kind == '%');
    }
    push(&L, JT_EOF);
}
