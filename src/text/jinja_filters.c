/* jinja_filters.c — jinja2's filters and tests, with transformers' tojson
 * (json.dumps with ensure_ascii, indent, separators and sort_keys), each as
 * jinja2 3.1 defines it (filters.py and tests.py read as the
 * specification): the same defaults, the same treatment of undefined
 * values, the same one-shot generators where jinja2 returns one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

enum ffn {
    F_ABS,
    F_ATTR,
    F_BATCH,
    F_CAPITALIZE,
    F_CENTER,
    F_COUNT,
    F_D,
    F_DEFAULT,
    F_DICTSORT,
    F_E,
    F_ESCAPE,
    F_FIRST,
    F_FLOAT,
    F_FORCEESCAPE,
    F_FORMAT,
    F_GROUPBY,
    F_INDENT,
    F_INT,
    F_ITEMS,
    F_JOIN,
    F_LAST,
    F_LENGTH,
    F_LIST,
    F_LOWER,
    F_MAP,
    F_MAX,
    F_MIN,
    F_REJECT,
    F_REJECTATTR,
    F_REPLACE,
    F_REVERSE,
    F_ROUND,
    F_SAFE,
    F_SELECT,
    F_SELECTATTR,
    F_SLICE,
    F_SORT,
    F_STRING,
    F_SUM,
    F_TITLE,
    F_TOJSON,
    F_TRIM,
    F_TRUNCATE,
    F_UNIQUE,
    F_UPPER,
    F_WORDCOUNT,
    F_COUNT_
};

static const char *const k_filters[F_COUNT_] = {
    "abs",      "attr",   "batch",      "capitalize", "center",     "count",       "d",       "default",
    "dictsort", "e",      "escape",     "first",      "float",      "forceescape", "format",  "groupby",
    "indent",   "int",    "items",      "join",       "last",       "length",      "list",    "lower",
    "map",      "max",    "min",        "reject",     "rejectattr", "replace",     "reverse", "round",
    "safe",     "select", "selectattr", "slice",      "sort",       "string",      "sum",     "title",
    "tojson",   "trim",   "truncate",   "unique",     "upper",      "wordcount",
};

enum tfn {
    T_BOOLEAN,
    T_CALLABLE,
    T_DEFINED,
    T_DIVISIBLEBY,
    T_EQ,
    T_EQUALTO,
    T_ESCAPED,
    T_EVEN,
    T_FALSE,
    T_FILTER,
    T_FLOAT,
    T_GE,
    T_GT,
    T_IN,
    T_INTEGER,
    T_ITERABLE,
    T_LE,
    T_LOWER,
    T_LT,
    T_MAPPING,
    T_NE,
    T_NONE,
    T_NUMBER,
    T_ODD,
    T_SAMEAS,
    T_SEQUENCE,
    T_STRING,
    T_TEST,
    T_TRUE,
    T_UNDEFINED,
    T_UPPER,
    T_OP_EQ,
    T_OP_NE,
    T_OP_LT,
    T_OP_LE,
    T_OP_GT,
    T_OP_GE,
    T_GREATERTHAN,
    T_LESSTHAN,
    T_COUNT_
};

static const char *const k_tests[T_COUNT_] = {
    "boolean", "callable", "defined", "divisibleby", "eq",   "equalto",     "escaped",  "even",
    "false",   "filter",   "float",   "ge",          "gt",   "in",          "integer",  "iterable",
    "le",      "lower",    "lt",      "mapping",     "ne",   "none",        "number",   "odd",
    "sameas",  "sequence", "string",  "test",        "true", "undefined",   "upper",    "==",
    "!=",      "<",        "<=",      ">",           ">=",   "greaterthan", "lessthan",
};

static int find(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0) return i;
    return -1;
}

int jfilter_find(const char *name, size_t n) { return find(k_filters, F_COUNT_, name, n); }
int jtest_find(const char *name, size_t n) { return find(k_tests, T_COUNT_, name, n); }

/* ---- helpers ---------------------------------------------------------------------------- */

static struct jv str_lit(struct jrt *rt, const char *s) { return jv_str(jstr_lit(&rt->ar, s)); }

static bool is_num(struct jv v) { return v.k == JK_BOOL || v.k == JK_INT || v.k == JK_FLOAT; }

/* A dotted attribute path ("a.b", or an int) looked up item-first per part,
 * as jinja2's make_attrgetter does. */
static struct jv attr_path(struct jrt *rt, struct jv item, struct jv attr, struct jv dflt)
{
    if (attr.k == JK_INT || attr.k == JK_BOOL) return jv_getitem(rt, item, attr);
    const struct jstr *path = jv_soft_str(rt, attr);
    size_t start = 0;
    for (size_t i = 0; i <= path->len; i++) {
        if (i < path->len && path->s[i] != '.') continue;
        const struct jstr *part = jstr_sub(&rt->ar, path, start, i - start);
        struct jv key = jv_str(part);
        /* an all-digit part is an index */
        bool digits = part->len > 0;
        for (size_t k = 0; k < part->len; k++) digits = digits && part->s[k] >= '0' && part->s[k] <= '9';
        if (digits && part->len < 18) {
            char num[20];
            memcpy(num, part->s, part->len);
            num[part->len] = '\0';
            key = jv_int(strtoll(num, NULL, 10));
        }
        item = jv_getitem(rt, item, key);
        if (jgiven(dflt) && dflt.k != JK_NONE && item.k == JK_UNDEF) item = dflt;
        start = i + 1;
    }
    return item;
}

static struct jv lower_if_str(struct jrt *rt, struct jv v, bool case_sensitive)
{
    if (!case_sensitive && v.k == JK_STR) return jv_str(jstr_case(rt, v.u.s, JC_LOWER));
    return v;
}

static struct jv gen(struct jlist *l) { return jv_list(l, JL_GEN); }

/* A stable merge sort of n values by keys (Python's sorted is stable). */
static void sort_by(struct jrt *rt, struct jv *vals, struct jv *keys, size_t n, bool reverse)
{
    if (n < 2) return;
    struct jv *tv = ja_alloc(&rt->ar, n * sizeof *tv), *tk = ja_alloc(&rt->ar, n * sizeof *tk);
    for (size_t w = 1; w < n; w *= 2) {
        jstep(rt, n / 8 + 1);
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                int c = jv_cmp(rt, keys[j], keys[i], "<");
                bool take_right = reverse ? c > 0 : c < 0;
                if (take_right) {
                    tv[o] = vals[j];
                    tk[o++] = keys[j++];
                } else {
                    tv[o] = vals[i];
                    tk[o++] = keys[i++];
                }
            }
            while (i < mid) {
                tv[o] = vals[i];
                tk[o++] = keys[i++];
            }
            while (j < hi) {
                tv[o] = vals[j];
                tk[o++] = keys[j++];
            }
        }
        memcpy(vals, tv, n * sizeof *vals);
        memcpy(keys, tk, n * sizeof *keys);
    }
}

/* ---- tojson --------------------------------------------------------------------------------- */

static struct jv f_tojson(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    struct jv arg[4];
    jbind(rt, "tojson", a, names, 4, arg);
    struct jtojson o = {.indent = -1};
    o.ensure_ascii = jgiven(arg[0]) && jv_truthy(rt, arg[0]);
    o.sort_keys = jgiven(arg[3]) && jv_truthy(rt, arg[3]);
    if (jgiven(arg[1]) && arg[1].k != JK_NONE) {
        if (arg[1].k == JK_STR) o.indent_str = arg[1].u.s;
        else {
            o.indent = jv_to_int(rt, arg[1], "tojson indent");
            if (o.indent < 0) o.indent = 0;
            if (o.indent > 1000)
                jfail(&rt->f, KVB_ERR_RANGE, "tojson: an indent of %lld is too large", (long long)o.indent);
        }
    }
    if (jgiven(arg[2]) && arg[2].k != JK_NONE) {
        struct jlist *seps = jv_iter(rt, arg[2]);
        if (seps->n != 2 || seps->v[0].k != JK_STR || seps->v[1].k != JK_STR)
            jfail(&rt->f, KVB_ERR_FORMAT, "tojson: separators must be a pair of strings");
        o.item_sep = seps->v[0].u.s;
        o.key_sep = seps->v[1].u.s;
    }
    struct jsb b;
    jsb_init(&b, &rt->ar);
    jv_tojson(rt, &b, in, &o);
    return jv_str(jsb_finish(&b));
}

/* ---- map / select ------------------------------------------------------------------------------ */

static struct jv f_map(struct jrt *rt, struct jv in, const struct jargs *a)
{
    struct jlist *items = jv_truthy(rt, in) ? jv_iter(rt, in) : jlist_new(rt, 0);
    struct jlist *out = jlist_new(rt, items->n);
    size_t attr_k = a->nkw;
    for (size_t k = 0; k < a->nkw; k++)
        if (jstr_eqc(a->kwname[k], "attribute")) attr_k = k;
    if (a->npos == 0 && attr_k < a->nkw) {
        struct jv dflt = jv_missing();
        for (size_t k = 0; k < a->nkw; k++) {
            if (k == attr_k) continue;
            if (jstr_eqc(a->kwname[k], "default")) dflt = a->kw[k];
            else
                jfail(&rt->f, KVB_ERR_FORMAT, "unexpected keyword argument '%.*s'", (int)a->kwname[k]->len,
                      a->kwname[k]->s);
        }
        for (size_t i = 0; i < items->n; i++) out->v[i] = attr_path(rt, items->v[i], a->kw[attr_k], dflt);
        return gen(out);
    }
    if (a->npos == 0) jfail(&rt->f, KVB_ERR_FORMAT, "map requires a filter argument");
    const struct jstr *fname = jv_soft_str(rt, a->pos[0]);
    int id = jfilter_find(fname->s, fname->len);
    char name[80];
    snprintf(name, sizeof name, "%.*s", (int)(fname->len < 64 ? fname->len : 64), fname->s);
    if (id < 0) jfail(&rt->f, KVB_ERR_FORMAT, "no filter named '%s'", name);
    struct jargs rest = *a;
    rest.pos = a->pos + 1;
    rest.npos = a->npos - 1;
    for (size_t i = 0; i < items->n; i++) out->v[i] = jfilter_call(rt, id, name, items->v[i], &rest);
    return gen(out);
}

static struct jv f_select(struct jrt *rt, struct jv in, const struct jargs *a, bool attr, bool reject)
{
    struct jlist *items = jv_truthy(rt, in) ? jv_iter(rt, in) : jlist_new(rt, 0);
    size_t off = attr ? 1 : 0;
    if (attr && a->npos < 1) jfail(&rt->f, KVB_ERR_FORMAT, "missing parameter for attribute name");
    int test = -1;
    char name[80] = "";
    if (a->npos > off) {
        const struct jstr *tn = jv_soft_str(rt, a->pos[off]);
        snprintf(name, sizeof name, "%.*s", (int)(tn->len < 64 ? tn->len : 64), tn->s);
        test = jtest_find(tn->s, tn->len);
        if (test < 0) jfail(&rt->f, KVB_ERR_FORMAT, "no test named '%s'", name);
    }
    struct jargs rest = *a;
    rest.pos = a->pos + off + 1;
    rest.npos = a->npos > off + 1 ? a->npos - off - 1 : 0;
    struct jlist *out = jlist_new(rt, items->n);
    out->n = 0;
    for (size_t i = 0; i < items->n; i++) {
        struct jv x = attr ? attr_path(rt, items->v[i], a->pos[0], jv_missing()) : items->v[i];
        bool ok = test >= 0 ? jtest_call(rt, test, name, x, &rest) : jv_truthy(rt, x);
        if (ok != reject) out->v[out->n++] = items->v[i];
    }
    return gen(out);
}

/* ---- small filters ----------------------------------------------------------------------------- */

/* Python's int(str, base) for what templates pass: optional white space,
 * sign, digits with underscores, a 0x/0o/0b prefix with base 0 or its own. */
static bool parse_int(const struct jstr *s, int64_t base, int64_t *out)
{
    const struct jstr tmp = *s;
    size_t i = 0, n = tmp.len;
    while (i < n && ju_isspace((unsigned char)tmp.s[i])) i++;
    while (n > i && ju_isspace((unsigned char)tmp.s[n - 1])) n--;
    bool neg = false;
    if (i < n && (tmp.s[i] == '+' || tmp.s[i] == '-')) neg = tmp.s[i++] == '-';
    if (i + 1 < n && tmp.s[i] == '0') {
        char p = (char)(tmp.s[i + 1] | 32);
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) {
            base = pb;
            i += 2;
            if (i < n && tmp.s[i] == '_') i++;
        }
    }
    if (base == 0) base = 10;
    if (i >= n) return false;
    __int128 v = 0;
    bool prev_us = true;
    for (; i < n; i++) {
        char c = tmp.s[i];
        if (c == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'z') ? (c | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        v = v * base + d;
        if (v > INT64_MAX) return false;
        prev_us = false;
    }
    if (prev_us) return false;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return true;
}

static bool parse_float(const struct jstr *s, double *out)
{
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < s->len && k + 1 < sizeof buf; i++)
        if (s->s[i] != '_') buf[k++] = s->s[i];
    if (k + 1 >= sizeof buf) return false;
    buf[k] = '\0';
    char *p = buf;
    while (*p && ju_isspace((unsigned char)*p)) p++;
    if (!*p) return false;
    char *end;
    double d = strtod(p, &end);
    if (end == p) return false;
    while (*end && ju_isspace((unsigned char)*end)) end++;
    if (*end) return false;
    /* strtod takes hex floats and "infinity" forms Python does not: fine for templates */
    *out = d;
    return true;
}

static struct jv f_int(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"default", "base"};
    struct jv arg[2];
    jbind(rt, "int", a, names, 2, arg);
    struct jv dflt = jgiven(arg[0]) ? arg[0] : jv_int(0);
    int64_t base = jgiven(arg[1]) ? jv_to_int(rt, arg[1], "int") : 10;
    int64_t v;
    double d;
    switch (in.k) {
    case JK_INT: return in;
    case JK_BOOL: return jv_int(in.u.b);
    case JK_FLOAT:
        if (isnan(in.u.f) || isinf(in.u.f) || fabs(in.u.f) >= 9.2e18) return dflt;
        return jv_int((int64_t)in.u.f);
    case JK_STR:
        if (parse_int(in.u.s, base, &v)) return jv_int(v);
        if (parse_float(in.u.s, &d) && !isnan(d) && !isinf(d) && fabs(d) < 9.2e18) return jv_int((int64_t)d);
        return dflt;
    default: return dflt;
    }
}

static struct jv f_float(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"default"};
    struct jv arg[1];
    jbind(rt, "float", a, names, 1, arg);
    struct jv dflt = jgiven(arg[0]) ? arg[0] : jv_float(0.0);
    double d;
    switch (in.k) {
    case JK_FLOAT: return in;
    case JK_INT: return jv_float((double)in.u.i);
    case JK_BOOL: return jv_float(in.u.b);
    case JK_STR: return parse_float(in.u.s, &d) ? jv_float(d) : dflt;
    default: return dflt;
    }
}

static struct jv f_round(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"precision", "method"};
    struct jv arg[2];
    jbind(rt, "round", a, names, 2, arg);
    int64_t prec = jgiven(arg[0]) ? jv_to_int(rt, arg[0], "round") : 0;
    const struct jstr *method = jgiven(arg[1]) ? jv_soft_str(rt, arg[1]) : NULL;
    if (method && !jstr_eqc(method, "common") && !jstr_eqc(method, "ceil") && !jstr_eqc(method, "floor"))
        jfail(&rt->f, KVB_ERR_FORMAT, "method must be common, ceil or floor");
    if (in.k == JK_UNDEF) jv_undef_fail(rt, in);
    if (!is_num(in)) jfail(&rt->f, KVB_ERR_FORMAT, "type %s doesn't define __round__ method", jv_type(in));
    if (prec > 300 || prec < -300) jfail(&rt->f, KVB_ERR_FORMAT, "round: precision out of range");
    double x = in.k == JK_FLOAT ? in.u.f : in.k == JK_INT ? (double)in.u.i : in.u.b;
    if (method && !jstr_eqc(method, "common")) {
        double p = pow(10.0, (double)prec);
        return jv_float((jstr_eqc(method, "ceil") ? ceil(x * p) : floor(x * p)) / p);
    }
    if (in.k != JK_FLOAT && prec >= 0) return jv_int(in.k == JK_INT ? in.u.i : in.u.b);
    if (isnan(x) || isinf(x)) return jv_float(x);
    if (prec >= 0) { /* correctly rounded, half to even, as Python's round */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        return jv_float(strtod(buf, NULL));
    }
    double p = pow(10.0, (double)-prec);
    double r = nearbyint(x / p) * p;
    return in.k == JK_FLOAT ? jv_float(r) : jv_int((int64_t)r);
}

static struct jv f_indent(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"width", "first", "blank"};
    struct jv arg[3];
    jbind(rt, "indent", a, names, 3, arg);
    const struct jstr *s = jv_soft_str(rt, in);
    const struct jstr *ind;
    if (jgiven(arg[0]) && arg[0].k == JK_STR) ind = arg[0].u.s;
    else {
        int64_t w = jgiven(arg[0]) ? jv_to_int(rt, arg[0], "indent") : 4;
        if (w < 0) w = 0;
        if (w > 10000) jfail(&rt->f, KVB_ERR_RANGE, "indent: a width of %lld is too large", (long long)w);
        struct jsb b;
        jsb_init(&b, &rt->ar);
        for (int64_t i = 0; i < w; i++) jsb_putc(&b, ' ');
        ind = jsb_finish(&b);
    }
    const bool first = jgiven(arg[1]) && jv_truthy(rt, arg[1]), blank = jgiven(arg[2]) && jv_truthy(rt, arg[2]);
    struct jsb t;
    jsb_init(&t, &rt->ar);
    jsb_put_str(&t, s);
    jsb_putc(&t, '\n'); /* jinja2's quirk for splitlines */
    struct jlist *lines = jstr_splitlines(rt, jsb_finish(&t), false);
    struct jsb b;
    jsb_init(&b, &rt->ar);
    if (first) jsb_put_str(&b, ind);
    for (size_t i = 0; i < lines->n; i++) {
        const struct jstr *ln = lines->v[i].u.s;
        if (i) {
            jsb_putc(&b, '\n');
            if (blank || ln->len) jsb_put_str(&b, ind);
        }
        jsb_put_str(&b, ln);
    }
    struct jstr *r = (struct jstr *)jsb_finish(&b);
    r->markup = s->markup;
    return jv_str(r);
}

static struct jv f_truncate(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"length", "killwords", "end", "leeway"};
    struct jv arg[4];
    jbind(rt, "truncate", a, names, 4, arg);
    const struct jstr *s = jv_soft_str(rt, in);
    int64_t length = jgiven(arg[0]) ? jv_to_int(rt, arg[0], "truncate") : 255;
    const bool killwords = jgiven(arg[1]) && jv_truthy(rt, arg[1]);
    const struct jstr *end = jgiven(arg[2]) ? jv_soft_str(rt, arg[2]) : jstr_lit(&rt->ar, "...");
    int64_t leeway = jgiven(arg[3]) && arg[3].k != JK_NONE ? jv_to_int(rt, arg[3], "truncate") : 5;
    int64_t endlen = (int64_t)ju_cplen(end->s, end->len), n = (int64_t)ju_cplen(s->s, s->len);
    if (length < endlen)
        jfail(&rt->f, KVB_ERR_FORMAT, "expected length >= %lld, got %lld", (long long)endlen, (long long)length);
    if (leeway < 0) jfail(&rt->f, KVB_ERR_FORMAT, "expected leeway >= 0");
    if (n <= length + leeway) return jv_str(s);
    size_t cut = ju_offset(s->s, s->len, (size_t)(length - endlen));
    struct jsb b;
    jsb_init(&b, &rt->ar);
    if (killwords) jsb_put_slice(&b, s, 0, cut);
    else {
        size_t sp = cut;
        while (sp > 0 && s->s[sp - 1] != ' ') sp--;
        jsb_put_slice(&b, s, 0, sp ? sp - 1 : cut);
    }
    jsb_put_str(&b, end);
    return jv_str(jsb_finish(&b));
}

/* jinja2's title: words begin after "-", white space or an opening bracket;
 * each piece's first character upper-cased, the rest lower-cased. */
static struct jv f_title(struct jrt *rt, struct jv in)
{
    const struct jstr *s = jv_soft_str(rt, in);
    struct jsb b;
    jsb_init(&b, &rt->ar);
    bool in_sep = true; /* pieces alternate: words and separator runs */
    size_t piece = 0;
    for (size_t i = 0; i <= s->len;) {
        size_t at = i;
        bool sep = false;
        if (i < s->len) {
            uint32_t c = ju_decode(s->s, s->len, &i);
            sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju_isspace(c);
        }
        if (at == s->len || sep != in_sep) {
            if (at > piece) { /* the piece [piece, at) */
                const struct jstr *p = jstr_sub(&rt->ar, s, piece, at - piece);
                size_t k = 0;
                ju_decode(p->s, p->len, &k);
                jsb_put_str(&b, jstr_case(rt, jstr_sub(&rt->ar, p, 0, k), JC_UPPER));
                jsb_put_str(&b, jstr_case(rt, jstr_sub(&rt->ar, p, k, p->len - k), JC_LOWER));
            }
            piece = at;
            in_sep = sep;
        }
        if (at == s->len) break;
    }
    return jv_str(jsb_finish(&b));
}

static struct jv escape_str(struct jrt *rt, struct jv in, bool force)
{
    if (in.k == JK_STR && in.u.s->markup && !force) return in;
    const struct jstr *s = jv_soft_str(rt, in);
    struct jsb b;
    jsb_init(&b, &rt->ar);
    for (size_t i = 0; i < s->len; i++) {
        const char c = s->s[i];
        const char *e = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '\'' ? "&#39;"
                        : c == '"'  ? "&#34;"
                                    : NULL;
        if (e) jsb_put(&b, e, strlen(e), jstr_user_at(s, i));
        else jsb_put_slice(&b, s, i, 1);
    }
    struct jstr *r = (struct jstr *)jsb_finish(&b);
    r->markup = true;
    return jv_str(r);
}

static struct jv f_sort_like(struct jrt *rt, int id, struct jv in, const struct jargs *a)
{
    /* sort, dictsort, unique, min, max */
    struct jv arg[4];
    if (id == F_DICTSORT) {
        static const char *const names[] = {"case_sensitive", "by", "reverse"};
        jbind(rt, "dictsort", a, names, 3, arg);
        if (in.k != JK_DICT || in.sub != JD_DICT)
            jfail(&rt->f, KVB_ERR_FORMAT, "dictsort: a mapping is required, not %s", jv_type(in));
        const bool cs = jgiven(arg[0]) && jv_truthy(rt, arg[0]);
        int pos = 0;
        if (jgiven(arg[1])) {
            const struct jstr *by = jv_soft_str(rt, arg[1]);
            if (jstr_eqc(by, "value")) pos = 1;
            else if (!jstr_eqc(by, "key"))
                jfail(&rt->f, KVB_ERR_FORMAT, "You can only sort by either \"key\" or \"value\"");
        }
        const struct jdict *d = in.u.d;
        struct jv *vals = ja_alloc(&rt->ar, (d->n + 1) * sizeof *vals),
                  *keys = ja_alloc(&rt->ar, (d->n + 1) * sizeof *keys);
        for (size_t i = 0; i < d->n; i++) {
            struct jlist *pair = jlist_new(rt, 2);
            pair->v[0] = d->k[i];
            pair->v[1] = d->v[i];
            vals[i] = jv_list(pair, JL_TUPLE);
            keys[i] = lower_if_str(rt, pos ? d->v[i] : d->k[i], cs);
        }
        sort_by(rt, vals, keys, d->n, jgiven(arg[2]) && jv_truthy(rt, arg[2]));
        struct jlist *l = jlist_new(rt, d->n);
        if (d->n) memcpy(l->v, vals, d->n * sizeof *vals);
        return jv_list(l, JL_LIST);
    }
    struct jlist *items;
    bool cs, reverse = false;
    struct jv attr;
    if (id == F_SORT) {
        static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
        jbind(rt, "sort", a, names, 3, arg);
        reverse = jgiven(arg[0]) && jv_truthy(rt, arg[0]);
        cs = jgiven(arg[1]) && jv_truthy(rt, arg[1]);
        attr = arg[2];
    } else {
        static const char *const names[] = {"case_sensitive", "attribute"};
        jbind(rt, k_filters[id], a, names, 2, arg);
        cs = jgiven(arg[0]) && jv_truthy(rt, arg[0]);
        attr = arg[1];
    }
    items = jv_iter(rt, in);
    const size_t n = items->n;
    struct jv *vals = ja_alloc(&rt->ar, (n + 1) * sizeof *vals), *keys = ja_alloc(&rt->ar, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        vals[i] = items->v[i];
        struct jv k = items->v[i];
        if (jgiven(attr) && attr.k != JK_NONE) {
            if (id == F_SORT && attr.k == JK_STR && memchr(attr.u.s->s, ',', attr.u.s->len)) {
                /* several attributes: a list of keys */
                struct jv comma = str_lit(rt, ",");
                struct jfunc split = {.id = JF_METHOD, .self = attr, .name = "split"};
                struct jargs sa = {.pos = &comma, .npos = 1};
                struct jv parts = jfunc_call(rt, &split, &sa);
                struct jlist *pl = parts.u.l, *kl = jlist_new(rt, pl->n);
                for (size_t p = 0; p < pl->n; p++)
                    kl->v[p] = lower_if_str(rt, attr_path(rt, k, pl->v[p], jv_missing()), cs);
                keys[i] = jv_list(kl, JL_LIST);
                continue;
            }
            k = attr_path(rt, k, attr, jv_missing());
        }
        keys[i] = lower_if_str(rt, k, cs);
    }
    if (id == F_SORT) {
        sort_by(rt, vals, keys, n, reverse);
        struct jlist *l = jlist_new(rt, n);
        if (n) memcpy(l->v, vals, n * sizeof *vals);
        return jv_list(l, JL_LIST);
    }
    if (id == F_UNIQUE) {
        struct jlist *out = jlist_new(rt, n);
        out->n = 0;
        for (size_t i = 0; i < n; i++) {
            bool seen = false;
            jstep(rt, i / 16);
            for (size_t j = 0; j < i && !seen; j++) seen = jv_eq(rt, keys[j], keys[i]);
            if (!seen) out->v[out->n++] = vals[i];
        }
        return gen(out);
    }
    /* min / max: the first of the extreme keys */
    if (n == 0) return jv_undef_hint(rt, "No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
        int c = jv_cmp(rt, keys[i], keys[best], id == F_MAX ? ">" : "<");
        if (id == F_MAX ? c > 0 : c < 0) best = i;
    }
    return vals[best];
}

static struct jv f_groupby(struct jrt *rt, struct jv in, const struct jargs *a)
{
    static const char *const names[] = {"attribute", "default", "case_sensitive"};
    struct jv arg[3];
    jbind(rt, "groupby", a, names, 3, arg);
    const bool cs = jgiven(arg[2]) && jv_truthy(rt, arg[2]);
    struct jlist *items = jv_iter(rt, in);
    const size_t n = items->n;
    struct jv *vals = ja_alloc(&rt->ar, (n + 1) * sizeof *vals), *keys = ja_alloc(&rt->ar, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        vals[i] = items->v[i];
        keys[i] = lower_if_str(rt, attr_path(rt, items->v[i], arg[0], arg[1]), cs);
    }
    sort_by(rt, vals, keys, n, false);
    struct jlist *groups = jlist_new(rt, n);
    groups->n = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && jv_eq(rt, keys[j], keys[i])) j++;
        struct jlist *members = jlist_new(rt, j - i);
        memcpy(members->v, vals + i, (j - i) * sizeof *vals);
        struct jlist *g = jlist_new(rt, 2);
        g->v[0] = cs ? keys[i] : attr_path(rt, vals[i], arg[0], arg[1]);
        g->v[1] = jv_list(members, JL_LIST);
        groups->v[groups->n++] = jv_list(g, JL_TUPLE);
        i = j;
    }
    return jv_list(groups, JL_LIST);
}

static struct jv f_batch_slice(struct jrt *rt, int id, struct jv in, const struct jargs *a)
{
    static const char *const bnames[] = {"linecount", "fill_with"}, *const snames[] = {"slices", "fill_with"};
    struct jv arg[2];
    jbind(rt, k_filters[id], a, id == F_BATCH ? bnames : snames, 2, arg);
    int64_t count = jv_to_int(rt, arg[0], k_filters[id]);
    struct jlist *items = jv_iter(rt, in);
    const bool fill = jgiven(arg[1]) && arg[1].k != JK_NONE;
    if (count <= 0) jfail(&rt->f, KVB_ERR_FORMAT, "%s: the count must be positive", k_filters[id]);
    if ((uint64_t)count > items->n + 100000)
        jfail(&rt->f, KVB_ERR_RANGE, "%s: a count of %lld is too large", k_filters[id], (long long)count);
    struct jlist *out;
    if (id == F_BATCH) {
        size_t nb = (items->n + (size_t)count - 1) / (size_t)count;
        out = jlist_new(rt, nb);
        for (size_t b = 0; b < nb; b++) {
            size_t lo = b * (size_t)count, hi = lo + (size_t)count < items->n ? lo + (size_t)count : items->n;
            struct jlist *g = jlist_new(rt, fill ? (size_t)count : hi - lo);
            for (size_t i = 0; i < g->n; i++) g->v[i] = lo + i < hi ? items->v[lo + i] : arg[1];
            out->v[b] = jv_list(g, JL_LIST);
        }
        return gen(out);
    }
    const size_t len = items->n, per = len / (size_t)count, extra = len % (size_t)count;
    out = jlist_new(rt, (size_t)count);
    size_t offset = 0;
    for (size_t k = 0; k < (size_t)count; k++) {
        size_t start = offset + k * per;
        if (k < extra) offset++;
        size_t end = offset + (k + 1) * per;
        const bool add = fill && k >= extra;
        struct jlist *g = jlist_new(rt, end - start + add);
        memcpy(g->v, items->v + start, (end - start) * sizeof *g->v);
        if (add) g->v[end - start] = arg[1];
        out->v[k] = jv_list(g, JL_LIST);
    }
    return gen(out);
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

static void no_args(struct jrt *rt, const char *name, const struct jargs *a) { jbind(rt, name, a, NULL, 0, NULL); }

struct jv jfilter_call(struct jrt *rt, int id, const char *name, struct jv in, struct jargs *a)
{
    jstep(rt, 1);
    struct jv arg[4];
    switch ((enum ffn)id) {
    case F_ABS:
        no_args(rt, name, a);
        if (in.k == JK_INT) return in.u.i < 0 ? jv_binop(rt, JO_SUB, jv_int(0), in) : in;
        if (in.k == JK_BOOL) return jv_int(in.u.b);
        if (in.k == JK_FLOAT) return jv_float(fabs(in.u.f));
        if (in.k == JK_UNDEF) jv_undef_fail(rt, in);
        jfail(&rt->f, KVB_ERR_FORMAT, "bad operand type for abs(): '%s'", jv_type(in));
    case F_ATTR: {
        static const char *const names[] = {"name"};
        jbind(rt, name, a, names, 1, arg);
        const struct jstr *n = jv_soft_str(rt, arg[0]);
        struct jv out;
        if (in.k == JK_UNDEF) jv_undef_fail(rt, in);
        if (in.k == JK_DICT && in.sub == JD_NS) return jv_getattr(rt, in, n);
        if (!(n->len && n->s[0] == '_') && jmethod_get(rt, in, n, &out)) return out;
        return jv_undef_attr(rt, in, n, JU_ATTR);
    }
    case F_BATCH:
    case F_SLICE: return f_batch_slice(rt, id, in, a);
    case F_CAPITALIZE: no_args(rt, name, a); return jv_str(jstr_case(rt, jv_soft_str(rt, in), JC_CAPITALIZE));
    case F_UPPER: no_args(rt, name, a); return jv_str(jstr_case(rt, jv_soft_str(rt, in), JC_UPPER));
    case F_LOWER: no_args(rt, name, a); return jv_str(jstr_case(rt, jv_soft_str(rt, in), JC_LOWER));
    case F_TITLE: no_args(rt, name, a); return f_title(rt, in);
    case F_CENTER: {
        static const char *const names[] = {"width"};
        jbind(rt, name, a, names, 1, arg);
        struct jv w = jgiven(arg[0]) ? arg[0] : jv_int(80);
        struct jfunc fn = {.id = JF_METHOD, .self = jv_str(jv_soft_str(rt, in)), .name = "center"};
        struct jargs ca = {.pos = &w, .npos = 1};
        return jfunc_call(rt, &fn, &ca);
    }
    case F_COUNT:
    case F_LENGTH: no_args(rt, name, a); return jv_int(jv_len(rt, in));
    case F_D:
    case F_DEFAULT: {
        static const char *const names[] = {"default_value", "boolean"};
        jbind(rt, name, a, names, 2, arg);
        struct jv d = jgiven(arg[0]) ? arg[0] : str_lit(rt, "");
        const bool boolean = jgiven(arg[1]) && jv_truthy(rt, arg[1]);
        if (in.k == JK_UNDEF || (boolean && !jv_truthy(rt, in))) return d;
        return in;
    }
    case F_DICTSORT:
    case F_SORT:
    case F_UNIQUE:
    case F_MIN:
    case F_MAX: return f_sort_like(rt, id, in, a);
    case F_E:
    case F_ESCAPE: no_args(rt, name, a); return escape_str(rt, in, false);
    case F_FORCEESCAPE: no_args(rt, name, a); return escape_str(rt, in, true);
    case F_FIRST: {
        no_args(rt, name, a);
        if (in.k == JK_LIST && (in.sub == JL_GEN || in.sub == JL_REVERSED)) {
            struct jlist *l = in.u.l;
            if (l->pos < l->n) return l->v[l->pos++];
            return jv_undef_hint(rt, "No first item, sequence was empty.");
        }
        struct jlist *l = jv_iter(rt, in);
        return l->n ? l->v[0] : jv_undef_hint(rt, "No first item, sequence was empty.");
    }
    case F_LAST: {
        no_args(rt, name, a);
        if (in.k == JK_LIST && (in.sub == JL_GEN || in.sub == JL_ITEMS || in.sub == JL_KEYS || in.sub == JL_VALUES ||
                                in.sub == JL_REVERSED))
            jfail(&rt->f, KVB_ERR_FORMAT, "'%s' object is not reversible", jv_type(in));
        struct jlist *l = jv_iter(rt, in);
        return l->n ? l->v[l->n - 1] : jv_undef_hint(rt, "No last item, sequence was empty.");
    }
    case F_FLOAT: return f_float(rt, in, a);
    case F_INT: return f_int(rt, in, a);
    case F_FORMAT: {
        const struct jstr *s = jv_soft_str(rt, in);
        if (a->npos && a->nkw)
            jfail(&rt->f, KVB_ERR_FORMAT, "can't handle positional and keyword arguments at the same time");
        struct jv args;
        if (a->nkw) {
            struct jdict *d = jdict_new(rt, a->nkw);
            for (size_t k = 0; k < a->nkw; k++) jdict_set(rt, d, jv_str(a->kwname[k]), a->kw[k]);
            args = jv_dict(d, JD_DICT);
        } else {
            struct jlist *l = jlist_new(rt, a->npos);
            if (a->npos) memcpy(l->v, a->pos, a->npos * sizeof *l->v);
            args = jv_list(l, JL_TUPLE);
        }
        return jv_binop(rt, JO_MOD, jv_str(s), args);
    }
    case F_GROUPBY: return f_groupby(rt, in, a);
    case F_INDENT: return f_indent(rt, in, a);
    case F_ITEMS: {
        no_args(rt, name, a);
        if (in.k == JK_UNDEF) return gen(jlist_new(rt, 0));
        if (in.k != JK_DICT || in.sub != JD_DICT)
            jfail(&rt->f, KVB_ERR_FORMAT, "Can only get item pairs from a mapping.");
        struct jlist *l = jlist_new(rt, in.u.d->n);
        for (size_t i = 0; i < l->n; i++) {
            struct jlist *pair = jlist_new(rt, 2);
            pair->v[0] = in.u.d->k[i];
            pair->v[1] = in.u.d->v[i];
            l->v[i] = jv_list(pair, JL_TUPLE);
        }
        return gen(l);
    }
    case F_JOIN: {
        static const char *const names[] = {"d", "attribute"};
        jbind(rt, name, a, names, 2, arg);
        const struct jstr *sep = jgiven(arg[0]) ? jv_to_str(rt, arg[0]) : jstr_lit(&rt->ar, "");
        struct jlist *l = jv_iter(rt, in);
        struct jsb b;
        jsb_init(&b, &rt->ar);
        for (size_t i = 0; i < l->n; i++) {
            if (i) jsb_put_str(&b, sep);
            struct jv v = l->v[i];
            if (jgiven(arg[1]) && arg[1].k != JK_NONE) v = attr_path(rt, v, arg[1], jv_missing());
            jv_str_to(rt, &b, v);
        }
        return jv_str(jsb_finish(&b));
    }
    case F_LIST: {
        no_args(rt, name, a);
        struct jlist *src = jv_iter(rt, in), *l = jlist_new(rt, src->n);
        if (src->n) memcpy(l->v, src->v, src->n * sizeof *l->v);
        return jv_list(l, JL_LIST);
    }
    case F_MAP: return f_map(rt, in, a);
    case F_SELECT: return f_select(rt, in, a, false, false);
    case F_REJECT: return f_select(rt, in, a, false, true);
    case F_SELECTATTR: return f_select(rt, in, a, true, false);
    case F_REJECTATTR: return f_select(rt, in, a, true, true);
    case F_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        jbind(rt, name, a, names, 3, arg);
        if (!jgiven(arg[1])) jfail(&rt->f, KVB_ERR_FORMAT, "replace: missing the new string");
        int64_t count = jgiven(arg[2]) && arg[2].k != JK_NONE ? jv_to_int(rt, arg[2], name) : -1;
        return jv_str(jstr_replace(rt, jv_soft_str(rt, in), jv_to_str(rt, arg[0]), jv_to_str(rt, arg[1]), count));
    }
    case F_REVERSE: {
        no_args(rt, name, a);
        if (in.k == JK_STR) return jv_slice(rt, in, jv_none(), jv_none(), jv_int(-1));
        if (in.k == JK_LIST && in.sub == JL_GEN) { /* reversed() refuses it: jinja2 makes a list */
            struct jlist *src = jv_iter(rt, in), *l = jlist_new(rt, src->n);
            for (size_t i = 0; i < src->n; i++) l->v[i] = src->v[src->n - 1 - i];
            return jv_list(l, JL_LIST);
        }
        if (in.k == JK_DICT && in.sub == JD_NS) jfail(&rt->f, KVB_ERR_FORMAT, "argument must be iterable");
        struct jlist *src = jv_iter(rt, in), *l = jlist_new(rt, src->n);
        for (size_t i = 0; i < src->n; i++) l->v[i] = src->v[src->n - 1 - i];
        return jv_list(l, JL_REVERSED);
    }
    case F_ROUND: return f_round(rt, in, a);
    case F_SAFE: {
        no_args(rt, name, a);
        const struct jstr *s = jv_to_str(rt, in);
        struct jstr *r = ja_alloc(&rt->ar, sizeof *r);
        *r = *s;
        r->markup = true;
        return jv_str(r);
    }
    case F_STRING: {
        no_args(rt, name, a);
        if (in.k == JK_STR) return in;
        return jv_str(jv_soft_str(rt, in));
    }
    case F_SUM: {
        static const char *const names[] = {"attribute", "start"};
        jbind(rt, name, a, names, 2, arg);
        struct jv acc = jgiven(arg[1]) ? arg[1] : jv_int(0);
        struct jlist *l = jv_iter(rt, in);
        for (size_t i = 0; i < l->n; i++) {
            struct jv v = l->v[i];
            if (jgiven(arg[0]) && arg[0].k != JK_NONE) v = attr_path(rt, v, arg[0], jv_missing());
            acc = jv_binop(rt, JO_ADD, acc, v);
        }
        return acc;
    }
    case F_TOJSON: return f_tojson(rt, in, a);
    case F_TRIM: {
        static const char *const names[] = {"chars"};
        jbind(rt, name, a, names, 1, arg);
        const struct jstr *chars = jgiven(arg[0]) && arg[0].k != JK_NONE ? jv_to_str(rt, arg[0]) : NULL;
        return jv_str(jstr_strip(rt, jv_soft_str(rt, in), chars, JS_BOTH));
    }
    case F_TRUNCATE: return f_truncate(rt, in, a);
    case F_WORDCOUNT: {
        no_args(rt, name, a);
        const struct jstr *s = jv_soft_str(rt, in);
        int64_t words = 0;
        bool in_word = false;
        for (size_t i = 0; i < s->len;) {
            uint32_t c = ju_decode(s->s, s->len, &i);
            bool w = c == '_' || ju_isalnum(c);
            if (w && !in_word) words++;
            in_word = w;
        }
        return jv_int(words);
    }
    case F_COUNT_: break;
    }
    jfail(&rt->f, KVB_ERR_FORMAT, "no filter named '%s'", name);
}

/* ---- tests --------------------------------------------------------------------------------------- */

static bool is_sequence(struct jv v)
{
    switch (v.k) {
    case JK_UNDEF:
    case JK_STR: return true;
    case JK_LIST: return v.sub == JL_LIST || v.sub == JL_TUPLE;
    case JK_DICT: return v.sub == JD_DICT;
    case JK_LOOP: return false;
    default: return false;
    }
}

bool jtest_call(struct jrt *rt, int id, const char *name, struct jv in, struct jargs *a)
{
    jstep(rt, 1);
    struct jv arg[1];
    static const char *const one[] = {"other"};
    switch ((enum tfn)id) {
    case T_BOOLEAN: no_args(rt, name, a); return in.k == JK_BOOL;
    case T_CALLABLE: no_args(rt, name, a); return in.k == JK_FUNC || in.k == JK_MACRO;
    case T_DEFINED: no_args(rt, name, a); return in.k != JK_UNDEF;
    case T_UNDEFINED: no_args(rt, name, a); return in.k == JK_UNDEF;
    case T_DIVISIBLEBY: {
        static const char *const names[] = {"num"};
        jbind(rt, name, a, names, 1, arg);
        struct jv r = jv_binop(rt, JO_MOD, in, arg[0]);
        return jv_eq(rt, r, jv_int(0));
    }
    case T_EQ:
    case T_EQUALTO:
    case T_OP_EQ: jbind(rt, name, a, one, 1, arg); return jv_eq(rt, in, arg[0]);
    case T_NE:
    case T_OP_NE: jbind(rt, name, a, one, 1, arg); return !jv_eq(rt, in, arg[0]);
    case T_LT:
    case T_OP_LT:
    case T_LESSTHAN: jbind(rt, name, a, one, 1, arg); return jv_cmp(rt, in, arg[0], "<") < 0;
    case T_LE:
    case T_OP_LE: jbind(rt, name, a, one, 1, arg); return jv_cmp(rt, in, arg[0], "<=") <= 0;
    case T_GT:
    case T_OP_GT:
    case T_GREATERTHAN: jbind(rt, name, a, one, 1, arg); return jv_cmp(rt, in, arg[0], ">") > 0;
    case T_GE:
    case T_OP_GE: jbind(rt, name, a, one, 1, arg); return jv_cmp(rt, in, arg[0], ">=") >= 0;
    case T_ESCAPED: no_args(rt, name, a); return in.k == JK_STR && in.u.s->markup;
    case T_EVEN:
    case T_ODD: {
        no_args(rt, name, a);
        struct jv r = jv_binop(rt, JO_MOD, in, jv_int(2));
        return jv_eq(rt, r, jv_int(id == T_EVEN ? 0 : 1));
    }
    case T_FALSE: no_args(rt, name, a); return in.k == JK_BOOL && !in.u.b;
    case T_TRUE: no_args(rt, name, a); return in.k == JK_BOOL && in.u.b;
    case T_FILTER:
    case T_TEST: {
        no_args(rt, name, a);
        if (in.k != JK_STR) return false;
        return id == T_FILTER ? jfilter_find(in.u.s->s, in.u.s->len) >= 0 : jtest_find(in.u.s->s, in.u.s->len) >= 0;
    }
    case T_FLOAT: no_args(rt, name, a); return in.k == JK_FLOAT;
    case T_INTEGER: no_args(rt, name, a); return in.k == JK_INT;
    case T_NUMBER: no_args(rt, name, a); return is_num(in);
    case T_IN: {
        static const char *const names[] = {"seq"};
        jbind(rt, name, a, names, 1, arg);
        return jv_in(rt, in, arg[0]);
    }
    case T_ITERABLE:
        no_args(rt, name, a);
        return in.k == JK_UNDEF || in.k == JK_STR || in.k == JK_LIST || (in.k == JK_DICT && in.sub == JD_DICT) ||
               in.k == JK_LOOP;
    case T_LOWER:
    case T_UPPER: {
        no_args(rt, name, a);
        const struct jstr *s = jv_soft_str(rt, in);
        struct jfunc fn = {.id = JF_METHOD, .self = jv_str(s), .name = id == T_LOWER ? "islower" : "isupper"};
        struct jargs none = {0};
        return jfunc_call(rt, &fn, &none).u.b;
    }
    case T_MAPPING: no_args(rt, name, a); return in.k == JK_DICT && in.sub == JD_DICT;
    case T_NONE: no_args(rt, name, a); return in.k == JK_NONE;
    case T_SAMEAS: {
        jbind(rt, name, a, one, 1, arg);
        struct jv o = arg[0];
        if (in.k != o.k) return false;
        switch (in.k) {
        case JK_NONE: return true;
        case JK_BOOL: return in.u.b == o.u.b;
        case JK_INT: return in.u.i == o.u.i && in.u.i >= -5 && in.u.i <= 256; /* CPython's cached ints */
        case JK_STR: return in.u.s == o.u.s;
        case JK_LIST: return in.u.l == o.u.l;
        case JK_DICT: return in.u.d == o.u.d;
        default: return false;
        }
    }
    case T_SEQUENCE: no_args(rt, name, a); return is_sequence(in);
    case T_STRING: no_args(rt, name, a); return in.k == JK_STR;
    case T_COUNT_: break;
    }
    jfail(&rt->f, KVB_ERR_FORMAT, "no test named '%s'", name);
}
