/* jinja_str.c — the Jinja interpreter's memory and text: the failure
 * unwinding, the arena, strings with their user-text spans and the builder
 * that keeps those spans through every operation, and the pieces of Python's
 * str semantics the filters need (code points, white space, case mapping,
 * float repr). See jinja_internal.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "text/jinja_internal.h"

/* ---- failure -------------------------------------------------------------------- */

void jfail(struct jfail *f, enum kvb_status st, const char *fmt, ...)
{
    if (f->err) {
        char msg[sizeof f->err->msg - 96];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (f->line) snprintf(f->err->msg, sizeof f->err->msg, "template %.64s, line %u: %s", f->name, f->line, msg);
        else snprintf(f->err->msg, sizeof f->err->msg, "template %.64s: %s", f->name, msg);
    }
    longjmp(f->jb, (int)st);
}

/* ---- arena ---------------------------------------------------------------------- */

struct ja_chunk {
    struct ja_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

enum { JA_CHUNK = 64 * 1024 };

void *ja_alloc(struct jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct ja_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JA_CHUNK / 4 ? n : JA_CHUNK;
        if (a->total + cap + sizeof *c > a->limit)
            jfail(a->f, KVB_ERR_RANGE, "the template's values passed the memory bound of %zu MiB", a->limit >> 20);
        c = kvb_malloc(sizeof *c + cap);
        if (!c) jfail(a->f, KVB_ERR_NOMEM, "out of memory");
        a->total += cap + sizeof *c;
        c->cap = cap;
        c->used = 0;
        if (cap == JA_CHUNK || !a->head) {
            c->next = a->head;
            a->head = c;
        } else { /* a big block: keep the current chunk's free room in front */
            c->next = a->head->next;
            a->head->next = c;
            c->used = n;
            memset(c->data, 0, n);
            return c->data;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free_all(struct jarena *a)
{
    struct ja_chunk *c = a->head;
    while (c) {
        struct ja_chunk *next = c->next;
        kvb_free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

char *ja_strndup(struct jarena *a, const char *s, size_t n)
{
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- strings --------------------------------------------------------------------- */

const struct jstr *jstr_new(struct jarena *ar, const char *s, size_t n, bool user)
{
    if (n > UINT32_MAX / 2) jfail(ar->f, KVB_ERR_RANGE, "a string of %zu bytes is too long", n);
    struct jstr *r = ja_alloc(ar, sizeof *r);
    r->s = ja_strndup(ar, s, n);
    r->len = (uint32_t)n;
    if (user && n > 0) {
        struct jsp *sp = ja_alloc(ar, sizeof *sp);
        sp->a = 0;
        sp->b = (uint32_t)n;
        r->sp = sp;
        r->nsp = 1;
    }
    return r;
}

const struct jstr *jstr_lit(struct jarena *ar, const char *s)
{
    struct jstr *r = ja_alloc(ar, sizeof *r);
    r->s = s;
    r->len = (uint32_t)strlen(s);
    return r;
}

/* The spans of s within [off, off+n), shifted to start at 0. */
static size_t clip_spans(const struct jstr *s, size_t off, size_t n, struct jsp *out)
{
    size_t k = 0;
    for (uint32_t i = 0; i < s->nsp; i++) {
        size_t a = s->sp[i].a, b = s->sp[i].b;
        if (b <= off || a >= off + n) continue;
        if (a < off) a = off;
        if (b > off + n) b = off + n;
        if (out) out[k] = (struct jsp){(uint32_t)(a - off), (uint32_t)(b - off)};
        k++;
    }
    return k;
}

const struct jstr *jstr_sub(struct jarena *ar, const struct jstr *s, size_t off, size_t n)
{
    if (off == 0 && n == s->len) return s;
    struct jstr *r = ja_alloc(ar, sizeof *r);
    r->s = s->s + off;
    r->len = (uint32_t)n;
    r->markup = s->markup;
    size_t k = clip_spans(s, off, n, NULL);
    if (k) {
        struct jsp *sp = ja_alloc(ar, k * sizeof *sp);
        clip_spans(s, off, n, sp);
        r->sp = sp;
        r->nsp = (uint32_t)k;
    }
    return r;
}

bool jstr_user_at(const struct jstr *s, size_t off)
{
    size_t lo = 0, hi = s->nsp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->sp[mid].b <= off) lo = mid + 1;
        else if (s->sp[mid].a > off) hi = mid;
        else return true;
    }
    return false;
}

bool jstr_eq(const struct jstr *a, const struct jstr *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->s, b->s, a->len) == 0);
}

bool jstr_eqc(const struct jstr *a, const char *c)
{
    size_t n = strlen(c);
    return a->len == n && memcmp(a->s, c, n) == 0;
}

int jstr_cmp(const struct jstr *a, const struct jstr *b)
{
    /* UTF-8's byte order is code point order, which is Python's. */
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->s, b->s, n) : 0;
    if (c) return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

/* ---- builder --------------------------------------------------------------------- */

void jsb_init(struct jsb *b, struct jarena *ar)
{
    memset(b, 0, sizeof *b);
    b->ar = ar;
}

/* The steps of appending n bytes (see struct jarena). */
static void charge(struct jarena *a, size_t n)
{
    if (!a->steps) return;
    *a->steps += 1 + n / 4;
    if (*a->steps > a->max_steps)
        jfail(a->f, KVB_ERR_RANGE, "the template ran past %llu evaluation steps (a loop that does not end?)",
              (unsigned long long)a->max_steps);
}

static void jsb_grow(struct jsb *b, size_t n)
{
    charge(b->ar, n);
    if (b->len + n < b->len) jfail(b->ar->f, KVB_ERR_RANGE, "a string is too long");
    if (b->limit && b->len + n > b->limit)
        jfail(b->ar->f, KVB_ERR_RANGE, "%s passed %zu bytes", b->what ? b->what : "a string", b->limit);
    if (b->len + n > UINT32_MAX / 2) jfail(b->ar->f, KVB_ERR_RANGE, "a string passed 2 GiB");
    if (b->len + n + 1 <= b->cap) return;
    const size_t need = b->len + n + 1;
    size_t cap = b->cap ? b->cap * 2 : 64;
    if (!b->len && need > cap) cap = need + 16; /* a first piece that is big: just it */
    while (cap < need) cap *= 2;
    if (b->heap) {
        if (b->ar->total + cap > b->ar->limit)
            jfail(b->ar->f, KVB_ERR_RANGE, "the template's values passed the memory bound of %zu MiB",
                  b->ar->limit >> 20);
        char *p = kvb_realloc(b->p, cap);
        if (!p) jfail(b->ar->f, KVB_ERR_NOMEM, "out of memory");
        b->p = *b->heap = p;
        b->cap = cap;
        return;
    }
    char *p = ja_alloc(b->ar, cap);
    if (b->len) memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
}

void jsb_reserve(struct jsb *b, size_t n)
{
    if (b->len + n + 1 <= b->cap) return;
    if (!b->len && !b->heap) { /* exactly what is asked for */
        b->p = ja_alloc(b->ar, n + 1);
        b->cap = n + 1;
        return;
    }
    jsb_grow(b, n);
}

static void add_span(struct jsb *b, size_t a, size_t e)
{
    if (a == e) return;
    if (b->nsp && b->sp[b->nsp - 1].b == a) {
        b->sp[b->nsp - 1].b = (uint32_t)e;
        return;
    }
    if (b->nsp == b->capsp) {
        size_t cap = b->capsp ? b->capsp * 2 : 4;
        struct jsp *sp = ja_alloc(b->ar, cap * sizeof *sp);
        if (b->nsp) memcpy(sp, b->sp, b->nsp * sizeof *sp);
        b->sp = sp;
        b->capsp = cap;
    }
    b->sp[b->nsp++] = (struct jsp){(uint32_t)a, (uint32_t)e};
}

void jsb_put(struct jsb *b, const char *s, size_t n, bool user)
{
    if (n == 0) return;
    jsb_grow(b, n);
    memcpy(b->p + b->len, s, n);
    if (user) add_span(b, b->len, b->len + n);
    b->len += n;
}

void jsb_putc(struct jsb *b, char c) { jsb_put(b, &c, 1, false); }
void jsb_puts(struct jsb *b, const char *s) { jsb_put(b, s, strlen(s), false); }

void jsb_printf(struct jsb *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) jsb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1, false);
}

void jsb_put_slice(struct jsb *b, const struct jstr *s, size_t off, size_t n)
{
    if (n == 0) return;
    const size_t at = b->len;
    jsb_grow(b, n);
    memcpy(b->p + at, s->s + off, n);
    b->len += n;
    for (uint32_t i = 0; i < s->nsp; i++) {
        size_t a = s->sp[i].a, e = s->sp[i].b;
        if (e <= off || a >= off + n) continue;
        if (a < off) a = off;
        if (e > off + n) e = off + n;
        add_span(b, at + a - off, at + e - off);
    }
}

void jsb_put_str(struct jsb *b, const struct jstr *s) { jsb_put_slice(b, s, 0, s->len); }

void jsb_put_cp(struct jsb *b, uint32_t c, bool user)
{
    char tmp[4];
    size_t n = unicode_encode(c, tmp);
    jsb_put(b, tmp, n, user);
}

const struct jstr *jsb_finish(struct jsb *b)
{
    struct jstr *r = ja_alloc(b->ar, sizeof *r);
    r->s = b->p ? b->p : "";
    r->len = (uint32_t)b->len;
    r->sp = b->sp;
    r->nsp = (uint32_t)b->nsp;
    struct jarena *ar = b->ar;
    size_t limit = b->limit;
    const char *what = b->what;
    jsb_init(b, ar);
    b->limit = limit;
    b->what = what;
    return r;
}

/* ---- code points ------------------------------------------------------------------- */

uint32_t ju_decode(const char *s, size_t n, size_t *pos) { return unicode_decode_lenient(s, n, pos); }

size_t ju_cplen(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; k++) ju_decode(s, n, &i);
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t cp)
{
    size_t i = 0;
    for (size_t k = 0; k < cp && i < n; k++) ju_decode(s, n, &i);
    return i;
}

bool ju_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool ju_islinebreak(uint32_t c)
{
    return (c >= 0x0A && c <= 0x0D) || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool ju_isprintable(uint32_t c)
{
    if (c == ' ') return true;
    switch (unicode_category(c)) {
    case UNICODE_CAT_UNDEF:
    case UNICODE_CAT_CONTROL:
    case UNICODE_CAT_SEPARATOR: return false;
    default: return true;
    }
}

bool ju_isalpha(uint32_t c)
{
    return c < 0x80 ? ((c | 32) >= 'a' && (c | 32) <= 'z') : unicode_category(c) == UNICODE_CAT_LETTER;
}
bool ju_isdigit(uint32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : unicode_category(c) == UNICODE_CAT_NUMBER; }
bool ju_isalnum(uint32_t c) { return ju_isalpha(c) || ju_isdigit(c); }

static const struct jcase_row *case_row(uint32_t c)
{
    size_t lo = 0, hi = jcase_nrows;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (jcase_rows[mid].cp < c) lo = mid + 1;
        else if (jcase_rows[mid].cp > c) hi = mid;
        else return &jcase_rows[mid];
    }
    return NULL;
}

int ju_case(uint32_t c, enum ju_case k, uint32_t out[3])
{
    const struct jcase_row *r = case_row(c);
    if (!r) {
        out[0] = c;
        return 1;
    }
    uint32_t m = k == JU_UPPER ? r->upper : k == JU_LOWER ? r->lower : r->title;
    if (!(m & 0x80000000u)) {
        out[0] = m;
        return 1;
    }
    const uint32_t *x = jcase_multi[m & 0x7FFFFFFFu];
    int n = 0;
    for (int i = 0; i < 3 && x[i]; i++) out[n++] = x[i];
    return n;
}

bool ju_iscased(uint32_t c)
{
    size_t lo = 0, hi = jcase_ncased;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (jcase_cased[mid][1] < c) lo = mid + 1;
        else if (jcase_cased[mid][0] > c) hi = mid;
        else return true;
    }
    return false;
}

/* A cased code point that lower() changes is upper case; one that upper()
 * changes, lower case (close to Python's properties for what templates meet). */
bool ju_isupper(uint32_t c)
{
    uint32_t m[3];
    return ju_iscased(c) && (ju_case(c, JU_LOWER, m) != 1 || m[0] != c);
}

bool ju_islower(uint32_t c)
{
    uint32_t m[3];
    return ju_iscased(c) && !ju_isupper(c) && (ju_case(c, JU_UPPER, m) != 1 || m[0] != c || c < 0x80);
}

bool ju_iscaseignorable(uint32_t c)
{
    if (c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xB7 || c == 0x2019) return true;
    enum unicode_cat k = unicode_category(c);
    return k == UNICODE_CAT_MARK || (k == UNICODE_CAT_CONTROL && c >= 0x80);
}

/* ---- float repr --------------------------------------------------------------------- */

void jfmt_float(double d, char *buf, size_t cap)
{
    if (isnan(d)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        snprintf(buf, cap, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    /* The shortest digits that read back as d, then Python's layout: fixed
     * point for exponents -4..15, else d.ddde+XX. */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
            else out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        out[o] = '\0';
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        strcat(out, e);
    }
    snprintf(buf, cap, "%s", out);
}
