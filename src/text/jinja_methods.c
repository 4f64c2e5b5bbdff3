/* jinja_methods.c — what templates call on values and as globals: the
 * methods of str, dict and list (the sandbox lets through those that change
 * nothing; append, pop, update … are undefined values whose call fails, as
 * in the immutable sandbox), str.format, and the globals range, dict,
 * namespace, raise_exception, strftime_now, cycler and joiner. Strings keep
 * their user-text spans through every method. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_internal.h"

/* ---- arguments ----------------------------------------------------------------------- */

void jbind(struct jrt *rt, const char *what, const struct jargs *a, const char *const *names, size_t n, struct jv *out)
{
    for (size_t i = 0; i < n; i++) out[i] = jv_missing();
    if (a->npos > n)
        jfail(&rt->f, KVB_ERR_FORMAT, "%s() takes at most %zu argument%s (%zu given)", what, n, n == 1 ? "" : "s",
              a->npos);
    for (size_t i = 0; i < a->npos; i++) out[i] = a->pos[i];
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i;
        for (i = 0; i < n; i++)
            if (jstr_eqc(a->kwname[k], names[i])) break;
        if (i == n)
            jfail(&rt->f, KVB_ERR_FORMAT, "%s() got an unexpected keyword argument '%.*s'", what,
                  (int)(a->kwname[k]->len < 64 ? a->kwname[k]->len : 64), a->kwname[k]->s);
        if (i < a->npos) jfail(&rt->f, KVB_ERR_FORMAT, "%s() got multiple values for argument '%s'", what, names[i]);
        out[i] = a->kw[k];
    }
}

const struct jstr *jv_soft_str(struct jrt *rt, struct jv v)
{
    if (v.k == JK_UNDEF) return jstr_lit(&rt->ar, "");
    return jv_to_str(rt, v);
}

int64_t jv_to_int(struct jrt *rt, struct jv v, const char *what)
{
    if (v.k == JK_INT) return v.u.i;
    if (v.k == JK_BOOL) return v.u.b;
    if (v.k == JK_UNDEF) jv_undef_fail(rt, v);
    jfail(&rt->f, KVB_ERR_FORMAT, "%s: an integer is required, not %s", what, jv_type(v));
}

static const struct jstr *want_str(struct jrt *rt, struct jv v, const char *what)
{
    if (v.k == JK_STR) return v.u.s;
    if (v.k == JK_UNDEF) jv_undef_fail(rt, v);
    jfail(&rt->f, KVB_ERR_FORMAT, "%s: a string is required, not %s", what, jv_type(v));
}

/* ---- strings ----------------------------------------------------------------------------- */

static bool in_chars(const struct jstr *chars, uint32_t c)
{
    if (!chars) return ju_isspace(c);
    for (size_t i = 0; i < chars->len;)
        if (ju_decode(chars->s, chars->len, &i) == c) return true;
    return false;
}

const struct jstr *jstr_strip(struct jrt *rt, const struct jstr *s, const struct jstr *chars, enum jstrip how)
{
    jstep_bytes(rt, s->len * (chars ? 1 + chars->len : 1));
    size_t a = 0, e = s->len;
    if (how != JS_RIGHT)
        while (a < e) {
            size_t i = a;
            if (!in_chars(chars, ju_decode(s->s, s->len, &i))) break;
            a = i;
        }
    if (how != JS_LEFT) {
        /* the end of the last code point not stripped */
        size_t last = a;
        for (size_t i = a; i < e;) {
            uint32_t c = ju_decode(s->s, e, &i);
            if (!in_chars(chars, c)) last = i;
        }
        e = last;
    }
    return jstr_sub(&rt->ar, s, a, e - a);
}

static bool final_sigma(const struct jstr *s, size_t at, size_t after)
{
    /* preceded by a cased letter, not followed by one (case-ignorables skipped) */
    bool before = false;
    size_t i = 0, prev_cased_end = 0;
    (void)prev_cased_end;
    while (i < at) {
        uint32_t c = ju_decode(s->s, at, &i);
        if (ju_iscased(c)) before = true;
        else if (!ju_iscaseignorable(c)) before = false;
    }
    if (!before) return false;
    for (size_t j = after; j < s->len;) {
        uint32_t c = ju_decode(s->s, s->len, &j);
        if (ju_iscaseignorable(c)) continue;
        return !ju_iscased(c);
    }
    return true;
}

const struct jstr *jstr_case(struct jrt *rt, const struct jstr *s, enum jcasefn how)
{
    struct jsb b;
    jsb_init(&b, &rt->ar);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->len;) {
        size_t at = i;
        uint32_t c = ju_decode(s->s, s->len, &i);
        const bool user = jstr_user_at(s, at);
        uint32_t m[3];
        int nm;
        enum ju_case k;
        switch (how) {
        case JC_UPPER: k = JU_UPPER; break;
        case JC_LOWER: k = JU_LOWER; break;
        case JC_CAPITALIZE: k = first ? JU_TITLE : JU_LOWER; break;
        default: k = prev_cased ? JU_LOWER : JU_TITLE; break;
        }
        if (k == JU_LOWER && c == 0x3A3 && final_sigma(s, at, i)) {
            m[0] = 0x3C2;
            nm = 1;
        } else {
            nm = ju_case(c, k, m);
        }
        if (nm == 1 && m[0] == c) jsb_put_slice(&b, s, at, i - at);
        else
            for (int j = 0; j < nm; j++) jsb_put_cp(&b, m[j], user);
        prev_cased = ju_iscased(c);
        first = false;
    }
    return jsb_finish(&b);
}

const struct jstr *jstr_replace(struct jrt *rt, const struct jstr *s, const struct jstr *old, const struct jstr *new_,
                                int64_t count)
{
    jstep_bytes(rt, s->len);
    struct jsb b;
    jsb_init(&b, &rt->ar);
    int64_t done = 0;
    if (old->len == 0) { /* Python inserts new between every character (and at both ends) */
        size_t i = 0;
        while (true) {
            if (count >= 0 && done >= count) {
                jsb_put_slice(&b, s, i, s->len - i);
                break;
            }
            jsb_put_str(&b, new_);
            done++;
            jstep(rt, 1);
            if (i >= s->len) break;
            size_t at = i;
            ju_decode(s->s, s->len, &i);
            jsb_put_slice(&b, s, at, i - at);
        }
        return jsb_finish(&b);
    }
    size_t i = 0;
    while (i <= s->len) {
        const char *m = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!m) {
            jsb_put_slice(&b, s, i, s->len - i);
            break;
        }
        size_t at = (size_t)(m - s->s);
        jsb_put_slice(&b, s, i, at - i);
        jsb_put_str(&b, new_);
        jstep(rt, 1);
        done++;
        i = at + old->len;
    }
    return jsb_finish(&b);
}

struct jlist *jstr_splitlines(struct jrt *rt, const struct jstr *s, bool keepends)
{
    jstep_bytes(rt, s->len);
    struct jv *items = NULL;
    size_t n = 0, cap = 0, start = 0;
    for (size_t i = 0; i < s->len;) {
        size_t at = i;
        uint32_t c = ju_decode(s->s, s->len, &i);
        if (!ju_islinebreak(c)) continue;
        if (c == '\r' && i < s->len && s->s[i] == '\n') i++;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            struct jv *ni = ja_alloc(&rt->ar, cap * sizeof *ni);
            if (n) memcpy(ni, items, n * sizeof *ni);
            items = ni;
        }
        items[n++] = jv_str(jstr_sub(&rt->ar, s, start, (keepends ? i : at) - start));
        start = i;
    }
    struct jlist *l = jlist_new(rt, n + (start < s->len));
    if (n) memcpy(l->v, items, n * sizeof *items);
    if (start < s->len) l->v[n] = jv_str(jstr_sub(&rt->ar, s, start, s->len - start));
    return l;
}

struct pieces {
    struct jv *v;
    size_t n, cap;
};

static void piece_push(struct jrt *rt, struct pieces *p, struct jv v)
{
    jstep(rt, 1);
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 8;
        struct jv *nv = ja_alloc(&rt->ar, p->cap * sizeof *nv);
        if (p->n) memcpy(nv, p->v, p->n * sizeof *nv);
        p->v = nv;
    }
    p->v[p->n++] = v;
}

static struct jv pieces_list(struct jrt *rt, struct pieces *p, bool reverse)
{
    struct jlist *l = jlist_new(rt, p->n);
    for (size_t i = 0; i < p->n; i++) l->v[i] = p->v[reverse ? p->n - 1 - i : i];
    return jv_list(l, JL_LIST);
}

/* str.split / str.rsplit */
static struct jv str_split(struct jrt *rt, const struct jstr *s, struct jv sepv, int64_t maxsplit, bool right)
{
    jstep_bytes(rt, s->len);
    struct pieces p = {0};
    if (!jgiven(sepv) || sepv.k == JK_NONE) {
        /* runs of white space; none at the ends */
        size_t *starts = ja_alloc(&rt->ar, (s->len + 1) * sizeof *starts),
               *ends = ja_alloc(&rt->ar, (s->len + 1) * sizeof *ends);
        size_t nw = 0;
        for (size_t i = 0; i < s->len;) {
            size_t at = i;
            if (ju_isspace(ju_decode(s->s, s->len, &i))) continue;
            size_t e = i;
            while (e < s->len) {
                size_t j = e;
                if (ju_isspace(ju_decode(s->s, s->len, &j))) break;
                e = j;
            }
            starts[nw] = at;
            ends[nw++] = e;
            i = e;
        }
        if (maxsplit < 0 || (size_t)maxsplit >= nw) {
            for (size_t w = 0; w < nw; w++)
                piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, starts[w], ends[w] - starts[w])));
            return pieces_list(rt, &p, false);
        }
        if (!right) {
            for (int64_t w = 0; w < maxsplit; w++)
                piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, starts[w], ends[w] - starts[w])));
            /* the rest, from the next word to the end, as it is */
            piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, starts[maxsplit], s->len - starts[maxsplit])));
            return pieces_list(rt, &p, false);
        }
        for (int64_t w = 0; w < maxsplit; w++) {
            size_t k = nw - 1 - (size_t)w;
            piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, starts[k], ends[k] - starts[k])));
        }
        size_t last = ends[nw - 1 - (size_t)maxsplit];
        piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, 0, last)));
        return pieces_list(rt, &p, true);
    }
    const struct jstr *sep = want_str(rt, sepv, "split");
    if (sep->len == 0) jfail(&rt->f, KVB_ERR_FORMAT, "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *m = (maxsplit < 0 || done < maxsplit) ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
            if (!m) break;
            size_t at = (size_t)(m - s->s);
            piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, i, at - i)));
            i = at + sep->len;
            done++;
        }
        piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, i, s->len - i)));
        return pieces_list(rt, &p, false);
    }
    size_t e = s->len;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
        size_t found = (size_t)-1;
        if (e >= sep->len)
            for (size_t k = e - sep->len + 1; k-- > 0;)
                if (memcmp(s->s + k, sep->s, sep->len) == 0) {
                    found = k;
                    break;
                }
        if (found == (size_t)-1) break;
        piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, found + sep->len, e - found - sep->len)));
        e = found;
        done++;
    }
    piece_push(rt, &p, jv_str(jstr_sub(&rt->ar, s, 0, e)));
    return pieces_list(rt, &p, true);
}

/* Byte range [*a, *e) of code points [start, end) of s (Python's slice rules). */
static void cp_range(struct jrt *rt, const struct jstr *s, struct jv start, struct jv end, size_t *a, size_t *e)
{
    jstep_bytes(rt, s->len);
    int64_t n = (int64_t)ju_cplen(s->s, s->len), lo = 0, hi = n;
    if (jgiven(start) && start.k != JK_NONE) lo = jv_to_int(rt, start, "slice");
    if (jgiven(end) && end.k != JK_NONE) hi = jv_to_int(rt, end, "slice");
    if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
    if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    if (hi < lo) hi = lo;
    *a = ju_offset(s->s, s->len, (size_t)lo);
    *e = ju_offset(s->s, s->len, (size_t)hi);
}

static bool affix(struct jrt *rt, const struct jstr *s, struct jv what, size_t a, size_t e, bool end)
{
    if (what.k == JK_LIST && what.sub == JL_TUPLE) {
        for (size_t i = 0; i < what.u.l->n; i++)
            if (affix(rt, s, what.u.l->v[i], a, e, end)) return true;
        return false;
    }
    const struct jstr *x = want_str(rt, what, end ? "endswith" : "startswith");
    if (x->len > e - a) return false;
    return memcmp(s->s + (end ? e - x->len : a), x->s, x->len) == 0;
}

static int64_t cp_index(const struct jstr *s, size_t byte_off) { return (int64_t)ju_cplen(s->s, byte_off); }

static struct jv str_find(struct jrt *rt, const struct jstr *s, struct jv *arg, bool rev, bool count)
{
    const struct jstr *sub = want_str(rt, arg[0], "find");
    size_t a, e;
    cp_range(rt, s, arg[1], arg[2], &a, &e);
    jstep(rt, (e - a) / 64);
    if (count) {
        if (sub->len == 0) return jv_int((int64_t)ju_cplen(s->s + a, e - a) + 1);
        int64_t k = 0;
        for (size_t i = a; i + sub->len <= e;) {
            const char *m = memmem(s->s + i, e - i, sub->s, sub->len);
            if (!m) break;
            k++;
            i = (size_t)(m - s->s) + sub->len;
        }
        return jv_int(k);
    }
    if (sub->len > e - a) return jv_int(-1);
    if (!rev) {
        const char *m = memmem(s->s + a, e - a, sub->s, sub->len);
        return jv_int(m ? cp_index(s, (size_t)(m - s->s)) : -1);
    }
    for (size_t k = e - sub->len + 1; k-- > a;)
        if (memcmp(s->s + k, sub->s, sub->len) == 0) return jv_int(cp_index(s, k));
    return jv_int(-1);
}

static struct jv str_pad(struct jrt *rt, const struct jstr *s, struct jv *arg, int how /* -1 left, 0 center, 1 right */)
{
    int64_t width = jv_to_int(rt, arg[0], "width");
    const struct jstr *fill = jgiven(arg[1]) ? want_str(rt, arg[1], "fillchar") : NULL;
    if (fill && ju_cplen(fill->s, fill->len) != 1)
        jfail(&rt->f, KVB_ERR_FORMAT, "The fill character must be exactly one character long");
    int64_t len = (int64_t)ju_cplen(s->s, s->len);
    if (width <= len) return jv_str(s);
    if ((uint64_t)width > rt->lim->max_memory / 4)
        jfail(&rt->f, KVB_ERR_RANGE, "a padding width of %lld passes the memory bound", (long long)width);
    int64_t marg = width - len, left;
    if (how < 0) left = 0;
    else if (how > 0) left = marg;
    else left = marg / 2 + (marg & width & 1);
    struct jsb b;
    jsb_init(&b, &rt->ar);
    for (int64_t i = 0; i < left; i++) fill ? jsb_put_str(&b, fill) : jsb_putc(&b, ' ');
    jsb_put_str(&b, s);
    for (int64_t i = 0; i < marg - left; i++) fill ? jsb_put_str(&b, fill) : jsb_putc(&b, ' ');
    return jv_str(jsb_finish(&b));
}

static struct jv str_pred(struct jrt *rt, const struct jstr *s, const char *name)
{
    jstep_bytes(rt, s->len * 4);
    if (s->len == 0) return jv_bool(false);
    bool all = true, any_cased = false;
    for (size_t i = 0; i < s->len && all;) {
        uint32_t c = ju_decode(s->s, s->len, &i);
        if (!strcmp(name, "isspace")) all = ju_isspace(c);
        else if (!strcmp(name, "isalpha")) all = ju_isalpha(c);
        else if (!strcmp(name, "isdigit") || !strcmp(name, "isdecimal") || !strcmp(name, "isnumeric"))
            all = ju_isdigit(c);
        else if (!strcmp(name, "isalnum")) all = ju_isalnum(c);
        else if (!strcmp(name, "islower")) {
            if (ju_isupper(c)) all = false;
            if (ju_iscased(c)) any_cased = true;
        } else if (!strcmp(name, "isupper")) {
            if (ju_islower(c)) all = false;
            if (ju_iscased(c)) any_cased = true;
        }
    }
    if (!strcmp(name, "islower") || !strcmp(name, "isupper")) return jv_bool(all && any_cased);
    return jv_bool(all);
}

static struct jv str_join(struct jrt *rt, const struct jstr *sep, struct jv items)
{
    struct jlist *l = jv_iter(rt, items);
    struct jsb b;
    jsb_init(&b, &rt->ar);
    for (size_t i = 0; i < l->n; i++) {
        if (i) jsb_put_str(&b, sep);
        if (l->v[i].k != JK_STR)
            jfail(&rt->f, KVB_ERR_FORMAT, "sequence item %zu: expected str instance, %s found", i, jv_type(l->v[i]));
        jsb_put_str(&b, l->v[i].u.s);
    }
    return jv_str(jsb_finish(&b));
}

/* ---- str.format -------------------------------------------------------------------------- */

/* format(v, spec) for the spec mini-language's common forms:
 * [[fill]align][sign][0][width][,][.precision][type]. */
static void format_value(struct jrt *rt, struct jsb *b, struct jv v, const struct jstr *spec)
{
    if (spec->len == 0) {
        jv_str_to(rt, b, v);
        return;
    }
    const char *p = spec->s, *end = spec->s + spec->len;
    uint32_t fill = ' ';
    char align = 0, sign = '-', type = 0;
    bool zero = false, comma = false;
    int64_t width = -1, prec = -1;
    size_t i0 = 0;
    uint32_t c0 = ju_decode(p, spec->len, &i0);
    if (p + i0 < end && p[i0] && strchr("<>=^", p[i0])) {
        fill = c0;
        align = p[i0];
        p += i0 + 1;
    } else if (*p && strchr("<>=^", *p)) {
        align = *p++;
    }
    if (p < end && *p && strchr("+- ", *p)) sign = *p++;
    if (p < end && *p == '0') {
        zero = true;
        p++;
    }
    while (p < end && *p >= '0' && *p <= '9') {
        width = (width < 0 ? 0 : width * 10) + (*p++ - '0');
        if (width > 100000) jfail(&rt->f, KVB_ERR_FORMAT, "a format width over 100000 is not supported");
    }
    if (p < end && *p == ',') {
        comma = true;
        p++;
    }
    if (p < end && *p == '.') {
        p++;
        prec = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            prec = prec * 10 + (*p++ - '0');
            if (prec > 300) jfail(&rt->f, KVB_ERR_FORMAT, "a format precision over 300 is not supported");
        }
    }
    if (p < end) type = *p++;
    if (p != end || width > 100000 || prec > 300)
        jfail(&rt->f, KVB_ERR_FORMAT, "invalid or unsupported format specifier");
    struct jsb body;
    jsb_init(&body, &rt->ar);
    char tmp[1024]; /* %.300f of 1e308: 610 bytes */
    if (v.k == JK_STR) {
        if (type && type != 's')
            jfail(&rt->f, KVB_ERR_FORMAT, "unknown format code '%c' for object of type 'str'", type);
        const struct jstr *s = v.u.s;
        size_t n = s->len;
        if (prec >= 0) n = ju_offset(s->s, s->len, (size_t)prec);
        jsb_put_slice(&body, s, 0, n);
        if (!align) align = '<';
    } else if (v.k == JK_INT || v.k == JK_BOOL || v.k == JK_FLOAT) {
        const bool is_int = v.k != JK_FLOAT;
        if (is_int && (!type || strchr("dbxXo", type))) {
            long long x = v.k == JK_INT ? v.u.i : v.u.b;
            unsigned long long ux = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
            char digits[80];
            if (type == 'b') {
                int k = 0;
                char rev[70];
                do rev[k++] = (char)('0' + (ux & 1));
                while (ux >>= 1);
                for (int j = 0; j < k; j++) digits[j] = rev[k - 1 - j];
                digits[k] = '\0';
            } else {
                snprintf(digits, sizeof digits,
                         type == 'x'   ? "%llx"
                         : type == 'X' ? "%llX"
                         : type == 'o' ? "%llo"
                                       : "%llu",
                         ux);
            }
            if (x < 0) jsb_putc(&body, '-');
            else if (sign != '-') jsb_putc(&body, sign);
            if (comma) {
                size_t nd = strlen(digits);
                for (size_t k = 0; k < nd; k++) {
                    if (k && (nd - k) % 3 == 0) jsb_putc(&body, ',');
                    jsb_putc(&body, digits[k]);
                }
            } else jsb_puts(&body, digits);
        } else {
            double d = v.k == JK_FLOAT ? v.u.f : (double)(v.k == JK_INT ? v.u.i : v.u.b);
            if (!type && prec < 0) {
                jfmt_float(d, tmp, sizeof tmp);
                if (d >= 0 && sign != '-') jsb_putc(&body, sign);
                jsb_puts(&body, tmp);
            } else {
                char t = type ? type : 'g';
                if (!t || !strchr("eEfFgG%", t))
                    jfail(&rt->f, KVB_ERR_FORMAT, "unknown format code '%c' for a number", t);
                double x = t == '%' ? d * 100 : d;
                char cf[16];
                snprintf(cf, sizeof cf, "%%%s.%d%c",
                         sign == '+'   ? "+"
                         : sign == ' ' ? " "
                                       : "",
                         (int)(prec < 0 ? 6 : prec), t == '%' ? 'f' : t);
                snprintf(tmp, sizeof tmp, cf, x);
                jsb_puts(&body, tmp);
                if (t == '%') jsb_putc(&body, '%');
            }
        }
        if (!align) align = zero ? '=' : '>';
        if (zero && fill == ' ') fill = '0';
    } else {
        jv_str_to(rt, &body, v);
        if (!align) align = '<';
    }
    const struct jstr *s = jsb_finish(&body);
    int64_t len = (int64_t)ju_cplen(s->s, s->len), pad = width > len ? width - len : 0;
    int64_t left = align == '<' ? 0 : align == '^' ? pad / 2 : align == '=' ? 0 : pad;
    size_t sign_len = 0;
    if (align == '=' && s->len && strchr("+- ", s->s[0])) sign_len = 1;
    jsb_put_slice(b, s, 0, sign_len);
    for (int64_t i = 0; i < left + (align == '=' ? pad : 0); i++) jsb_put_cp(b, fill, false);
    jsb_put_slice(b, s, sign_len, s->len - sign_len);
    for (int64_t i = 0; i < pad - left - (align == '=' ? pad : 0); i++) jsb_put_cp(b, fill, false);
}

static struct jv str_format(struct jrt *rt, const struct jstr *fmt, const struct jargs *a)
{
    struct jsb b;
    jsb_init(&b, &rt->ar);
    size_t auto_idx = 0;
    bool used_auto = false, used_manual = false;
    for (size_t i = 0; i < fmt->len; i++) {
        char c = fmt->s[i];
        if (c == '}') {
            if (i + 1 < fmt->len && fmt->s[i + 1] == '}') {
                jsb_putc(&b, '}');
                i++;
                continue;
            }
            jfail(&rt->f, KVB_ERR_FORMAT, "Single '}' encountered in format string");
        }
        if (c != '{') {
            jsb_put_slice(&b, fmt, i, 1);
            continue;
        }
        if (i + 1 < fmt->len && fmt->s[i + 1] == '{') {
            jsb_putc(&b, '{');
            i++;
            continue;
        }
        size_t e = i + 1;
        int depth = 1;
        while (e < fmt->len && depth) {
            if (fmt->s[e] == '{') depth++;
            else if (fmt->s[e] == '}') depth--;
            if (depth) e++;
        }
        if (e >= fmt->len) jfail(&rt->f, KVB_ERR_FORMAT, "expected '}' before end of string");
        /* field: name[.attr|[key]]*[!conv][:spec] */
        const char *f = fmt->s + i + 1, *fe = fmt->s + e;
        const char *colon = NULL, *bang = NULL;
        int br = 0;
        for (const char *q = f; q < fe; q++) {
            if (*q == '[') br++;
            else if (*q == ']') br--;
            else if (!br && *q == '!' && !bang && !colon) bang = q;
            else if (!br && *q == ':' && !colon) {
                colon = q;
                break;
            }
        }
        const char *name_end = bang ? bang : colon ? colon : fe;
        const char *q = f;
        while (q < name_end && *q != '.' && *q != '[') q++;
        struct jv v;
        if (q == f) {
            if (used_manual)
                jfail(&rt->f, KVB_ERR_FORMAT,
                      "cannot switch from manual field specification to automatic field numbering");
            used_auto = true;
            if (auto_idx >= a->npos)
                jfail(&rt->f, KVB_ERR_FORMAT, "Replacement index %zu out of range for positional args tuple", auto_idx);
            v = a->pos[auto_idx++];
        } else if (*f >= '0' && *f <= '9') {
            if (used_auto)
                jfail(&rt->f, KVB_ERR_FORMAT,
                      "cannot switch from automatic field numbering to manual field specification");
            used_manual = true;
            size_t idx = (size_t)strtoul(f, NULL, 10);
            if (idx >= a->npos)
                jfail(&rt->f, KVB_ERR_FORMAT, "Replacement index %zu out of range for positional args tuple", idx);
            v = a->pos[idx];
        } else {
            size_t k;
            for (k = 0; k < a->nkw; k++)
                if (a->kwname[k]->len == (size_t)(q - f) && memcmp(a->kwname[k]->s, f, (size_t)(q - f)) == 0) break;
            if (k == a->nkw) jfail(&rt->f, KVB_ERR_FORMAT, "KeyError: '%.*s'", (int)(q - f < 64 ? q - f : 64), f);
            v = a->kw[k];
        }
        while (q < name_end) { /* .attr and [key], through the sandbox */
            if (*q == '.') {
                const char *s2 = ++q;
                while (q < name_end && *q != '.' && *q != '[') q++;
                v = jv_getattr(rt, v, jstr_new(&rt->ar, s2, (size_t)(q - s2), false));
            } else {
                const char *s2 = ++q;
                while (q < name_end && *q != ']') q++;
                struct jv key;
                char *endp;
                long long iv = strtoll(s2, &endp, 10);
                if (endp == q && q > s2) key = jv_int(iv);
                else key = jv_str(jstr_new(&rt->ar, s2, (size_t)(q - s2), false));
                v = jv_getitem(rt, v, key);
                if (q < name_end) q++;
            }
            if (v.k == JK_UNDEF) jv_undef_fail(rt, v);
        }
        if (bang) {
            char conv = bang + 1 < fe ? bang[1] : 0;
            if (conv == 'r' || conv == 'a') {
                struct jsb rb;
                jsb_init(&rb, &rt->ar);
                jv_repr_to(rt, &rb, v);
                v = jv_str(jsb_finish(&rb));
            } else if (conv == 's') v = jv_str(jv_to_str(rt, v));
            else jfail(&rt->f, KVB_ERR_FORMAT, "unknown conversion specifier in a format string");
        }
        const struct jstr *spec =
            colon ? jstr_new(&rt->ar, colon + 1, (size_t)(fe - colon - 1), false) : jstr_lit(&rt->ar, "");
        if (memchr(spec->s, '{', spec->len)) jfail(&rt->f, KVB_ERR_FORMAT, "nested format fields are not supported");
        format_value(rt, &b, v, spec);
        i = e;
    }
    return jv_str(jsb_finish(&b));
}

/* ---- methods ------------------------------------------------------------------------------ */

static const char *const k_str_methods[] = {
    "capitalize", "center",       "count",        "endswith",  "find",     "format",  "index", "isalnum", "isalpha",
    "isdecimal",  "isdigit",      "islower",      "isnumeric", "isspace",  "isupper", "join",  "ljust",   "lower",
    "lstrip",     "removeprefix", "removesuffix", "replace",   "rfind",    "rindex",  "rjust", "rsplit",  "rstrip",
    "split",      "splitlines",   "startswith",   "strip",     "swapcase", "title",   "upper", "zfill",   "casefold",
    NULL};
static const char *const k_dict_methods[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const k_list_methods[] = {"count", "index", "copy", NULL};
static const char *const k_unsafe[] = {"append", "clear", "pop",     "popitem", "setdefault", "update",
                                       "insert", "sort",  "reverse", "extend",  "remove",     NULL};

static const char *find_name(const char *const *names, const struct jstr *n)
{
    for (const char *const *p = names; *p; p++)
        if (jstr_eqc(n, *p)) return *p;
    return NULL;
}

bool jmethod_get(struct jrt *rt, struct jv obj, const struct jstr *name, struct jv *out)
{
    const char *m = NULL;
    if (obj.k == JK_STR) m = find_name(k_str_methods, name);
    else if (obj.k == JK_DICT && obj.sub == JD_DICT) m = find_name(k_dict_methods, name);
    else if (obj.k == JK_LIST && (obj.sub == JL_LIST || obj.sub == JL_TUPLE)) m = find_name(k_list_methods, name);
    if (!m && ((obj.k == JK_DICT && obj.sub == JD_DICT) || (obj.k == JK_LIST && obj.sub == JL_LIST))) {
        const char *u = find_name(k_unsafe, name);
        if (u && (obj.k == JK_LIST ? strcmp(u, "popitem") && strcmp(u, "setdefault") && strcmp(u, "update")
                                   : strcmp(u, "append") && strcmp(u, "insert") && strcmp(u, "sort") &&
                                         strcmp(u, "reverse") && strcmp(u, "extend") && strcmp(u, "remove"))) {
            struct jsb b;
            jsb_init(&b, &rt->ar);
            jsb_printf(&b, "access to attribute '%s' of '%s' object is unsafe.", u, jv_type(obj));
            const struct jstr *h = jsb_finish(&b);
            *out = jv_undef_hint(rt, ja_strndup(&rt->ar, h->s, h->len));
            return true;
        }
    }
    if (!m) return false;
    struct jfunc *fn = ja_alloc(&rt->ar, sizeof *fn);
    fn->id = JF_METHOD;
    fn->self = obj;
    fn->name = m;
    *out = (struct jv){.k = JK_FUNC, .u.fn = fn};
    return true;
}

#define BIND(...)                                                                                                      \
    static const char *const names_[] = {__VA_ARGS__};                                                                 \
    struct jv arg[sizeof names_ / sizeof names_[0]];                                                                   \
    jbind(rt, m, a, names_, sizeof names_ / sizeof names_[0], arg)

static struct jv str_method(struct jrt *rt, const char *m, const struct jstr *s, const struct jargs *a)
{
    if (!strcmp(m, "format")) return str_format(rt, s, a);
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize") ||
        !strcmp(m, "casefold")) {
        jbind(rt, m, a, NULL, 0, NULL);
        enum jcasefn k = !strcmp(m, "upper")        ? JC_UPPER
                         : !strcmp(m, "title")      ? JC_TITLE
                         : !strcmp(m, "capitalize") ? JC_CAPITALIZE
                                                    : JC_LOWER;
        return jv_str(jstr_case(rt, s, k));
    }
    if (!strcmp(m, "swapcase")) {
        jbind(rt, m, a, NULL, 0, NULL);
        struct jsb b;
        jsb_init(&b, &rt->ar);
        for (size_t i = 0; i < s->len;) {
            size_t at = i;
            uint32_t c = ju_decode(s->s, s->len, &i), mm[3];
            int n = ju_case(c, ju_isupper(c) ? JU_LOWER : ju_islower(c) ? JU_UPPER : JU_LOWER, mm);
            if (!ju_iscased(c)) jsb_put_slice(&b, s, at, i - at);
            else
                for (int j = 0; j < n; j++) jsb_put_cp(&b, mm[j], jstr_user_at(s, at));
        }
        return jv_str(jsb_finish(&b));
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        BIND("chars");
        const struct jstr *chars = jgiven(arg[0]) && arg[0].k != JK_NONE ? want_str(rt, arg[0], m) : NULL;
        return jv_str(jstr_strip(rt, s, chars, m[0] == 'l' ? JS_LEFT : m[0] == 'r' ? JS_RIGHT : JS_BOTH));
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        BIND("sep", "maxsplit");
        int64_t maxsplit = jgiven(arg[1]) ? jv_to_int(rt, arg[1], m) : -1;
        return str_split(rt, s, arg[0], maxsplit, m[0] == 'r');
    }
    if (!strcmp(m, "splitlines")) {
        BIND("keepends");
        return jv_list(jstr_splitlines(rt, s, jgiven(arg[0]) && jv_truthy(rt, arg[0])), JL_LIST);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        BIND("prefix", "start", "end");
        if (!jgiven(arg[0])) jfail(&rt->f, KVB_ERR_FORMAT, "%s() takes at least 1 argument (0 given)", m);
        size_t x, y;
        cp_range(rt, s, arg[1], arg[2], &x, &y);
        return jv_bool(affix(rt, s, arg[0], x, y, m[0] == 'e'));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") ||
        !strcmp(m, "count")) {
        BIND("sub", "start", "end");
        if (!jgiven(arg[0])) jfail(&rt->f, KVB_ERR_FORMAT, "%s() takes at least 1 argument (0 given)", m);
        struct jv r = str_find(rt, s, arg, m[0] == 'r', !strcmp(m, "count"));
        if ((!strcmp(m, "index") || !strcmp(m, "rindex")) && r.u.i < 0)
            jfail(&rt->f, KVB_ERR_FORMAT, "substring not found");
        return r;
    }
    if (!strcmp(m, "replace")) {
        BIND("old", "new", "count");
        if (!jgiven(arg[1])) jfail(&rt->f, KVB_ERR_FORMAT, "replace() takes at least 2 arguments");
        return jv_str(jstr_replace(rt, s, want_str(rt, arg[0], m), want_str(rt, arg[1], m),
                                   jgiven(arg[2]) ? jv_to_int(rt, arg[2], m) : -1));
    }
    if (!strcmp(m, "join")) {
        BIND("iterable");
        if (!jgiven(arg[0])) jfail(&rt->f, KVB_ERR_FORMAT, "join() takes exactly one argument (0 given)");
        return str_join(rt, s, arg[0]);
    }
    if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust")) {
        BIND("width", "fillchar");
        return str_pad(rt, s, arg, m[0] == 'c' ? 0 : m[0] == 'l' ? -1 : 1);
    }
    if (!strcmp(m, "zfill")) {
        BIND("width");
        int64_t w = jv_to_int(rt, arg[0], m), len = (int64_t)ju_cplen(s->s, s->len);
        if (w <= len) return jv_str(s);
        if ((uint64_t)w > rt->lim->max_memory / 4)
            jfail(&rt->f, KVB_ERR_RANGE, "a zfill width passes the memory bound");
        struct jsb b;
        jsb_init(&b, &rt->ar);
        size_t sign = s->len && (s->s[0] == '+' || s->s[0] == '-');
        jsb_put_slice(&b, s, 0, sign);
        for (int64_t i = 0; i < w - len; i++) jsb_putc(&b, '0');
        jsb_put_slice(&b, s, sign, s->len - sign);
        return jv_str(jsb_finish(&b));
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        BIND("affix");
        const struct jstr *x = want_str(rt, arg[0], m);
        const bool suffix = m[6] == 's';
        if (x->len <= s->len && memcmp(s->s + (suffix ? s->len - x->len : 0), x->s, x->len) == 0)
            return jv_str(jstr_sub(&rt->ar, s, suffix ? 0 : x->len, s->len - x->len));
        return jv_str(s);
    }
    jbind(rt, m, a, NULL, 0, NULL);
    return str_pred(rt, s, m);
}

static struct jv dict_method(struct jrt *rt, const char *m, struct jdict *d, const struct jargs *a)
{
    if (!strcmp(m, "get")) {
        BIND("key", "default");
        if (!jgiven(arg[0])) jfail(&rt->f, KVB_ERR_FORMAT, "get expected at least 1 argument, got 0");
        struct jv out;
        if ((arg[0].k == JK_LIST && arg[0].sub != JL_TUPLE) || arg[0].k == JK_DICT)
            jfail(&rt->f, KVB_ERR_FORMAT, "unhashable type: '%s'", jv_type(arg[0]));
        if (jdict_get(rt, d, arg[0], &out)) return out;
        return jgiven(arg[1]) ? arg[1] : jv_none();
    }
    jbind(rt, m, a, NULL, 0, NULL);
    if (!strcmp(m, "copy")) {
        struct jdict *c = jdict_new(rt, d->n);
        for (size_t i = 0; i < d->n; i++) jdict_set(rt, c, d->k[i], d->v[i]);
        return jv_dict(c, JD_DICT);
    }
    struct jlist *l = jlist_new(rt, d->n);
    enum jl sub = !strcmp(m, "items") ? JL_ITEMS : !strcmp(m, "keys") ? JL_KEYS : JL_VALUES;
    for (size_t i = 0; i < d->n; i++) {
        if (sub == JL_ITEMS) {
            struct jlist *pair = jlist_new(rt, 2);
            pair->v[0] = d->k[i];
            pair->v[1] = d->v[i];
            l->v[i] = jv_list(pair, JL_TUPLE);
        } else {
            l->v[i] = sub == JL_KEYS ? d->k[i] : d->v[i];
        }
    }
    return jv_list(l, sub);
}

static struct jv list_method(struct jrt *rt, const char *m, struct jv self, const struct jargs *a)
{
    struct jlist *l = self.u.l;
    if (!strcmp(m, "copy")) {
        jbind(rt, m, a, NULL, 0, NULL);
        struct jlist *c = jlist_new(rt, l->n);
        if (l->n) memcpy(c->v, l->v, l->n * sizeof *c->v);
        return jv_list(c, (enum jl)self.sub);
    }
    BIND("value", "start", "stop");
    if (!jgiven(arg[0])) jfail(&rt->f, KVB_ERR_FORMAT, "%s() takes at least 1 argument", m);
    jstep(rt, l->n / 16);
    if (!strcmp(m, "count")) {
        int64_t k = 0;
        for (size_t i = 0; i < l->n; i++) k += jv_eq(rt, l->v[i], arg[0]);
        return jv_int(k);
    }
    for (size_t i = 0; i < l->n; i++)
        if (jv_eq(rt, l->v[i], arg[0])) return jv_int((int64_t)i);
    jfail(&rt->f, KVB_ERR_FORMAT, "value is not in list");
}

/* ---- globals ------------------------------------------------------------------------------- */

static const char *const k_globals[JG_COUNT_] = {
    [JG_RANGE] = "range",           [JG_DICT] = "dict",
    [JG_NAMESPACE] = "namespace",   [JG_RAISE] = "raise_exception",
    [JG_STRFTIME] = "strftime_now", [JG_CYCLER] = "cycler",
    [JG_JOINER] = "joiner",
};

const char *jglobal_name(int g) { return (unsigned)g < JG_COUNT_ ? k_globals[g] : ""; }

struct jv jglobal_value(struct jrt *rt, int g)
{
    static const enum jfn ids[JG_COUNT_] = {
        [JG_RANGE] = JF_G_RANGE,  [JG_DICT] = JF_G_DICT,         [JG_NAMESPACE] = JF_G_NAMESPACE,
        [JG_RAISE] = JF_G_RAISE,  [JG_STRFTIME] = JF_G_STRFTIME, [JG_CYCLER] = JF_G_CYCLER,
        [JG_JOINER] = JF_G_JOINER};
    struct jfunc *fn = ja_alloc(&rt->ar, sizeof *fn);
    fn->id = (uint16_t)ids[g];
    fn->name = k_globals[g];
    return (struct jv){.k = JK_FUNC, .u.fn = fn};
}

enum { MAX_RANGE = 100000 }; /* jinja2's sandbox */

static struct jv g_range(struct jrt *rt, const struct jargs *a)
{
    if (a->nkw) jfail(&rt->f, KVB_ERR_FORMAT, "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3) jfail(&rt->f, KVB_ERR_FORMAT, "range expected 1 to 3 arguments, got %zu", a->npos);
    int64_t start = 0, stop, step = 1;
    if (a->npos == 1) stop = jv_to_int(rt, a->pos[0], "range");
    else {
        start = jv_to_int(rt, a->pos[0], "range");
        stop = jv_to_int(rt, a->pos[1], "range");
        if (a->npos == 3) step = jv_to_int(rt, a->pos[2], "range");
    }
    if (step == 0) jfail(&rt->f, KVB_ERR_FORMAT, "range() arg 3 must not be zero");
    __int128 n = 0;
    if (step > 0 && stop > start) n = ((__int128)stop - start + step - 1) / step;
    if (step < 0 && start > stop) n = ((__int128)start - stop - step - 1) / -step;
    if (n > MAX_RANGE)
        jfail(&rt->f, KVB_ERR_RANGE, "range too big: the sandbox blocks ranges larger than %d items", MAX_RANGE);
    struct jlist *l = jlist_new(rt, (size_t)n);
    for (size_t i = 0; i < (size_t)n; i++) l->v[i] = jv_int(start + (int64_t)i * step);
    return jv_list(l, JL_LIST);
}

/* dict(...) and namespace(...): a mapping or pairs, then keywords. */
static struct jdict *build_dict(struct jrt *rt, const struct jargs *a, const char *what, bool ns)
{
    if (a->npos > 1) jfail(&rt->f, KVB_ERR_FORMAT, "%s expected at most 1 argument, got %zu", what, a->npos);
    struct jdict *d = jdict_new(rt, 0);
    if (a->npos == 1) {
        struct jv src = a->pos[0];
        if (src.k == JK_DICT) {
            for (size_t i = 0; i < src.u.d->n; i++) jdict_set(rt, d, src.u.d->k[i], src.u.d->v[i]);
        } else {
            struct jlist *items = jv_iter(rt, src);
            for (size_t i = 0; i < items->n; i++) {
                struct jlist *pair = jv_iter(rt, items->v[i]);
                if (pair->n != 2)
                    jfail(&rt->f, KVB_ERR_FORMAT, "%s update sequence element #%zu has length %zu; 2 is required", what,
                          i, pair->n);
                jdict_set(rt, d, pair->v[0], pair->v[1]);
            }
        }
    }
    for (size_t k = 0; k < a->nkw; k++) jdict_set(rt, d, jv_str(a->kwname[k]), a->kw[k]);
    if (ns)
        for (size_t i = 0; i < d->n; i++)
            if (d->k[i].k == JK_STR && d->k[i].u.s->len && d->k[i].u.s->s[0] == '_')
                jfail(&rt->f, KVB_ERR_FORMAT,
                      "chat templates cannot store underscore-prefixed attributes on a namespace");
    return d;
}

static struct jv g_strftime(struct jrt *rt, const struct jargs *a)
{
    static const char *const names[] = {"format"};
    struct jv arg[1];
    jbind(rt, "strftime_now", a, names, 1, arg);
    const struct jstr *fmt = want_str(rt, arg[0], "strftime_now");
    char f[256], out[1024];
    if (fmt->len >= sizeof f) jfail(&rt->f, KVB_ERR_FORMAT, "strftime_now: the format is too long");
    memcpy(f, fmt->s, fmt->len);
    f[fmt->len] = '\0';
    time_t now = rt->now ? (time_t)rt->now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t n = strftime(out, sizeof out, f, &tm);
    return jv_str(jstr_new(&rt->ar, out, n, false));
}

struct jv jfunc_call(struct jrt *rt, const struct jfunc *fn, struct jargs *a)
{
    switch ((enum jfn)fn->id) {
    case JF_G_RANGE: return g_range(rt, a);
    case JF_G_DICT: return jv_dict(build_dict(rt, a, "dict", false), JD_DICT);
    case JF_G_NAMESPACE: return jv_dict(build_dict(rt, a, "namespace", true), JD_NS);
    case JF_G_RAISE: {
        static const char *const names[] = {"message"};
        struct jv arg[1];
        jbind(rt, "raise_exception", a, names, 1, arg);
        const struct jstr *msg = jv_soft_str(rt, arg[0]);
        jfail(&rt->f, KVB_ERR_FORMAT, "raise_exception: %.*s", (int)(msg->len < 400 ? msg->len : 400), msg->s);
    }
    case JF_G_STRFTIME: return g_strftime(rt, a);
    case JF_G_CYCLER: {
        if (a->nkw) jfail(&rt->f, KVB_ERR_FORMAT, "cycler() takes no keyword arguments");
        if (!a->npos) jfail(&rt->f, KVB_ERR_FORMAT, "at least one item has to be provided");
        struct jdict *st = jdict_new(rt, 2);
        struct jlist *items = jlist_new(rt, a->npos);
        memcpy(items->v, a->pos, a->npos * sizeof *items->v);
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "items")), jv_list(items, JL_TUPLE));
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "current")), a->pos[0]);
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "pos")), jv_int(0));
        /* a cycler is a namespace-like object: current, next(), reset() */
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "next")), jv_none());
        struct jfunc *nx = ja_alloc(&rt->ar, sizeof *nx), *rs = ja_alloc(&rt->ar, sizeof *rs);
        nx->id = JF_CYCLER_NEXT;
        nx->name = "next";
        nx->self = jv_dict(st, JD_NS);
        rs->id = JF_CYCLER_RESET;
        rs->name = "reset";
        rs->self = jv_dict(st, JD_NS);
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "next")), (struct jv){.k = JK_FUNC, .u.fn = nx});
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "reset")), (struct jv){.k = JK_FUNC, .u.fn = rs});
        return jv_dict(st, JD_NS);
    }
    case JF_CYCLER_NEXT:
    case JF_CYCLER_RESET: {
        struct jdict *st = fn->self.u.d;
        struct jv items, pos;
        jdict_gets(st, "items", 5, &items);
        jdict_gets(st, "pos", 3, &pos);
        int64_t p = fn->id == JF_CYCLER_RESET ? 0 : pos.u.i;
        struct jv rv = items.u.l->v[p];
        if (fn->id == JF_CYCLER_NEXT) p = (p + 1) % (int64_t)items.u.l->n;
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "pos")), jv_int(p));
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "current")), items.u.l->v[p]);
        return fn->id == JF_CYCLER_NEXT ? rv : jv_none();
    }
    case JF_G_JOINER: {
        static const char *const names[] = {"sep"};
        struct jv arg[1];
        jbind(rt, "joiner", a, names, 1, arg);
        struct jdict *st = jdict_new(rt, 2);
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "sep")), jgiven(arg[0]) ? arg[0] : jv_str(jstr_lit(&rt->ar, ", ")));
        jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "used")), jv_bool(false));
        struct jfunc *j = ja_alloc(&rt->ar, sizeof *j);
        j->id = JF_JOINER_CALL;
        j->name = "joiner";
        j->self = jv_dict(st, JD_NS);
        return (struct jv){.k = JK_FUNC, .u.fn = j};
    }
    case JF_JOINER_CALL: {
        struct jdict *st = fn->self.u.d;
        struct jv used, sep;
        jdict_gets(st, "used", 4, &used);
        jdict_gets(st, "sep", 3, &sep);
        if (!used.u.b) {
            jdict_set(rt, st, jv_str(jstr_lit(&rt->ar, "used")), jv_bool(true));
            return jv_str(jstr_lit(&rt->ar, ""));
        }
        return sep;
    }
    case JF_LOOP_CYCLE: return jloop_cycle(rt, fn->self.u.lp, a);
    case JF_LOOP_CHANGED: return jloop_changed(rt, fn->self.u.lp, a);
    case JF_METHOD:
        if (fn->self.k == JK_STR) return str_method(rt, fn->name, fn->self.u.s, a);
        if (fn->self.k == JK_DICT) return dict_method(rt, fn->name, fn->self.u.d, a);
        if (fn->self.k == JK_LIST) return list_method(rt, fn->name, fn->self, a);
        break;
    }
    jfail(&rt->f, KVB_ERR_INTERNAL, "unknown function");
}
