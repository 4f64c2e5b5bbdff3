/* jinja_value.c — values as Python and jinja2 treat them: truth, equality
 * and order, str() and repr(), len, iteration, attribute and item access
 * (the sandbox's order), slicing, arithmetic, `in`, json.dumps (for
 * transformers' tojson) and values read from JSON text. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "text/jinja_internal.h"

void jdepth_enter(struct jrt *rt)
{
    if (++rt->depth > rt->lim->max_depth)
        jfail(&rt->f, KVB_ERR_RANGE, "the template nested calls, loops or values deeper than %u levels",
              rt->lim->max_depth);
}

static _Noreturn void type_error(struct jrt *rt, const char *fmt, const char *a, const char *b)
{
    jfail(&rt->f, KVB_ERR_FORMAT, fmt, a, b);
}

const char *jv_type(struct jv v)
{
    switch (v.k) {
    case JK_UNDEF: return "Undefined";
    case JK_NONE: return "NoneType";
    case JK_BOOL: return "bool";
    case JK_INT: return "int";
    case JK_FLOAT: return "float";
    case JK_STR: return v.u.s->markup ? "Markup" : "str";
    case JK_LIST:
        switch (v.sub) {
        case JL_TUPLE: return "tuple";
        case JL_GEN: return "generator";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_REVERSED: return "list_reverseiterator";
        default: return "list";
        }
    case JK_DICT: return v.sub == JD_NS ? "Namespace" : "dict";
    case JK_FUNC: return "builtin_function_or_method";
    case JK_MACRO: return "Macro";
    case JK_LOOP: return "LoopContext";
    default: return "object";
    }
}

/* ---- undefined --------------------------------------------------------------------- */

struct jv jv_undef_named(struct jrt *rt, const char *name)
{
    struct jundef *u = ja_alloc(&rt->ar, sizeof *u);
    u->why = JU_NAME;
    u->name = name;
    return jv_undef(u);
}

struct jv jv_undef_hint(struct jrt *rt, const char *hint)
{
    struct jundef *u = ja_alloc(&rt->ar, sizeof *u);
    u->why = JU_HINT;
    u->name = hint;
    return jv_undef(u);
}

struct jv jv_undef_attr(struct jrt *rt, struct jv obj, const struct jstr *name, enum jundef_why why)
{
    struct jundef *u = ja_alloc(&rt->ar, sizeof *u);
    u->why = (uint8_t)why;
    u->name = ja_strndup(&rt->ar, name->s, name->len < 200 ? name->len : 200);
    u->type = jv_type(obj);
    return jv_undef(u);
}

void jv_undef_fail(struct jrt *rt, struct jv v)
{
    const struct jundef *u = v.u.u;
    if (!u) jfail(&rt->f, KVB_ERR_FORMAT, "a value is undefined");
    switch (u->why) {
    case JU_NAME: jfail(&rt->f, KVB_ERR_FORMAT, "'%s' is undefined", u->name);
    case JU_ATTR: jfail(&rt->f, KVB_ERR_FORMAT, "'%s object' has no attribute '%s'", u->type, u->name);
    case JU_ITEM: jfail(&rt->f, KVB_ERR_FORMAT, "'%s object' has no element %s", u->type, u->name);
    default: jfail(&rt->f, KVB_ERR_FORMAT, "%s", u->name);
    }
}

/* ---- containers ---------------------------------------------------------------------- */

struct jlist *jlist_new(struct jrt *rt, size_t n)
{
    if (n > rt->lim->max_memory / sizeof(struct jv))
        jfail(&rt->f, KVB_ERR_RANGE, "a list of %zu items passes the memory bound", n);
    jstep(rt, n / 8); /* filling it costs */
    struct jlist *l = ja_alloc(&rt->ar, sizeof *l);
    l->n = n;
    l->v = ja_alloc(&rt->ar, (n ? n : 1) * sizeof *l->v); /* never NULL: memcpy of 0 items stays defined */
    return l;
}

struct jdict *jdict_new(struct jrt *rt, size_t cap)
{
    struct jdict *d = ja_alloc(&rt->ar, sizeof *d);
    if (!cap) cap = 1; /* never NULL arrays: memcpy of 0 items stays defined */
    d->k = ja_alloc(&rt->ar, cap * sizeof *d->k);
    d->v = ja_alloc(&rt->ar, cap * sizeof *d->v);
    d->cap = cap;
    return d;
}

/* Python's dict key equality (1 == 1.0 == True; str by bytes). */
static bool key_eq(struct jrt *rt, struct jv a, struct jv b)
{
    if (a.k == JK_STR && b.k == JK_STR) return jstr_eq(a.u.s, b.u.s);
    if (a.k == JK_STR || b.k == JK_STR) return false;
    return jv_eq(rt, a, b);
}

static long find_key(struct jrt *rt, const struct jdict *d, struct jv k)
{
    jstep(rt, 1 + d->n / 16); /* lookups are linear: their cost counts */
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(rt, d->k[i], k)) return (long)i;
    return -1;
}

void jdict_set(struct jrt *rt, struct jdict *d, struct jv k, struct jv v)
{
    if (k.k == JK_LIST && k.sub != JL_TUPLE) type_error(rt, "unhashable type: '%s'%s", jv_type(k), "");
    if (k.k == JK_DICT) type_error(rt, "unhashable type: '%s'%s", jv_type(k), "");
    long at = find_key(rt, d, k);
    if (at >= 0) {
        d->v[at] = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        struct jv *nk = ja_alloc(&rt->ar, cap * sizeof *nk), *nv = ja_alloc(&rt->ar, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

bool jdict_get(struct jrt *rt, const struct jdict *d, struct jv k, struct jv *out)
{
    long at = find_key(rt, d, k);
    if (at < 0) return false;
    *out = d->v[at];
    return true;
}

bool jdict_gets(const struct jdict *d, const char *key, size_t n, struct jv *out)
{
    for (size_t i = 0; i < d->n; i++) {
        const struct jv k = d->k[i];
        if (k.k == JK_STR && k.u.s->len == n && memcmp(k.u.s->s, key, n) == 0) {
            *out = d->v[i];
            return true;
        }
    }
    return false;
}

/* ---- truth, equality, order ------------------------------------------------------------ */

bool jv_truthy(struct jrt *rt, struct jv v)
{
    (void)rt;
    switch (v.k) {
    case JK_UNDEF:
    case JK_NONE: return false;
    case JK_BOOL: return v.u.b;
    case JK_INT: return v.u.i != 0;
    case JK_FLOAT: return v.u.f != 0;
    case JK_STR: return v.u.s->len > 0;
    case JK_LIST: return v.sub == JL_GEN || v.sub == JL_REVERSED || v.u.l->n > 0;
    case JK_DICT: return v.sub == JD_NS || v.u.d->n > 0;
    default: return true;
    }
}

static bool is_num(struct jv v) { return v.k == JK_BOOL || v.k == JK_INT || v.k == JK_FLOAT; }
static double num_f(struct jv v) { return v.k == JK_FLOAT ? v.u.f : v.k == JK_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t num_i(struct jv v) { return v.k == JK_INT ? v.u.i : (int64_t)v.u.b; }

bool jv_eq(struct jrt *rt, struct jv a, struct jv b)
{
    if (is_num(a) && is_num(b)) {
        if (a.k != JK_FLOAT && b.k != JK_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case JK_UNDEF:
    case JK_NONE: return true;
    case JK_STR: jstep(rt, a.u.s->len / 256); return jstr_eq(a.u.s, b.u.s);
    case JK_LIST: {
        if (a.sub == JL_GEN || a.sub == JL_REVERSED || b.sub == JL_GEN || b.sub == JL_REVERSED) return a.u.l == b.u.l;
        if (a.sub != b.sub) return false;
        if (a.u.l->n != b.u.l->n) return false;
        jdepth_enter(rt);
        bool eq = true;
        for (size_t i = 0; i < a.u.l->n && eq; i++) eq = jv_eq(rt, a.u.l->v[i], b.u.l->v[i]);
        jdepth_leave(rt);
        return eq;
    }
    case JK_DICT: {
        if (a.sub == JD_NS || b.sub == JD_NS) return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n) return false;
        jdepth_enter(rt);
        bool eq = true;
        for (size_t i = 0; i < a.u.d->n && eq; i++) {
            struct jv other;
            eq = jdict_get(rt, b.u.d, a.u.d->k[i], &other) && jv_eq(rt, a.u.d->v[i], other);
        }
        jdepth_leave(rt);
        return eq;
    }
    case JK_FUNC: return a.u.fn == b.u.fn;
    case JK_MACRO: return a.u.m == b.u.m;
    case JK_LOOP: return a.u.lp == b.u.lp;
    default: return false;
    }
}

int jv_cmp(struct jrt *rt, struct jv a, struct jv b, const char *op)
{
    if (a.k == JK_UNDEF) jv_undef_fail(rt, a);
    if (b.k == JK_UNDEF) jv_undef_fail(rt, b);
    if (is_num(a) && is_num(b)) {
        if (a.k != JK_FLOAT && b.k != JK_FLOAT) return num_i(a) < num_i(b) ? -1 : num_i(a) > num_i(b);
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y ? 1 : 0; /* NaN compares as neither: 0 */
    }
    if (a.k == JK_STR && b.k == JK_STR) {
        jstep(rt, (a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len) / 256);
        return jstr_cmp(a.u.s, b.u.s);
    }
    if (a.k == JK_LIST && b.k == JK_LIST && a.sub == b.sub && (a.sub == JL_LIST || a.sub == JL_TUPLE)) {
        jdepth_enter(rt);
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(rt, a.u.l->v[i], b.u.l->v[i])) continue;
            int c = jv_cmp(rt, a.u.l->v[i], b.u.l->v[i], op);
            jdepth_leave(rt);
            return c;
        }
        jdepth_leave(rt);
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "'%s' not supported between instances of '%s' and '%s'", op, jv_type(a), jv_type(b));
    jfail(&rt->f, KVB_ERR_FORMAT, "%s", msg);
}

/* ---- str() and repr() ------------------------------------------------------------------- */

static void repr_str(struct jsb *b, const struct jstr *s)
{
    bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    const char q = has_sq && !has_dq ? '"' : '\'';
    jsb_putc(b, q);
    size_t i = 0;
    while (i < s->len) {
        size_t at = i;
        uint32_t c = ju_decode(s->s, s->len, &i);
        const bool user = jstr_user_at(s, at);
        char tmp[16];
        const char *esc = NULL;
        if (c == (uint32_t)q) esc = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\t') esc = "\\t";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            esc = tmp;
        } else if (c >= 0x80 && !ju_isprintable(c)) {
            if (c < 0x100) snprintf(tmp, sizeof tmp, "\\x%02x", c);
            else if (c < 0x10000) snprintf(tmp, sizeof tmp, "\\u%04x", c);
            else snprintf(tmp, sizeof tmp, "\\U%08x", c);
            esc = tmp;
        }
        if (esc) jsb_put(b, esc, strlen(esc), user);
        else jsb_put_slice(b, s, at, i - at);
    }
    jsb_putc(b, q);
}

static void to_text(struct jrt *rt, struct jsb *b, struct jv v, bool repr);

static void seq_text(struct jrt *rt, struct jsb *b, const struct jlist *l, size_t from, const char *open,
                     const char *close, bool tuple)
{
    jsb_puts(b, open);
    for (size_t i = from; i < l->n; i++) {
        if (i > from) jsb_puts(b, ", ");
        to_text(rt, b, l->v[i], true);
    }
    if (tuple && l->n - from == 1) jsb_putc(b, ',');
    jsb_puts(b, close);
}

static void dict_text(struct jrt *rt, struct jsb *b, const struct jdict *d)
{
    jsb_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jsb_puts(b, ", ");
        to_text(rt, b, d->k[i], true);
        jsb_puts(b, ": ");
        to_text(rt, b, d->v[i], true);
    }
    jsb_putc(b, '}');
}

static void to_text(struct jrt *rt, struct jsb *b, struct jv v, bool repr)
{
    jstep(rt, 1);
    char tmp[64];
    switch (v.k) {
    case JK_UNDEF:
        if (repr) jsb_puts(b, "Undefined");
        return;
    case JK_NONE: jsb_puts(b, "None"); return;
    case JK_BOOL: jsb_puts(b, v.u.b ? "True" : "False"); return;
    case JK_INT: jsb_printf(b, "%lld", (long long)v.u.i); return;
    case JK_FLOAT:
        jfmt_float(v.u.f, tmp, sizeof tmp);
        jsb_puts(b, tmp);
        return;
    case JK_STR:
        if (!repr) jsb_put_str(b, v.u.s);
        else {
            if (v.u.s->markup) jsb_puts(b, "Markup(");
            repr_str(b, v.u.s);
            if (v.u.s->markup) jsb_putc(b, ')');
        }
        return;
    case JK_LIST:
        jdepth_enter(rt);
        switch (v.sub) {
        case JL_TUPLE: seq_text(rt, b, v.u.l, 0, "(", ")", true); break;
        case JL_ITEMS: seq_text(rt, b, v.u.l, 0, "dict_items([", "])", false); break;
        case JL_KEYS: seq_text(rt, b, v.u.l, 0, "dict_keys([", "])", false); break;
        case JL_VALUES: seq_text(rt, b, v.u.l, 0, "dict_values([", "])", false); break;
        case JL_GEN: jsb_puts(b, "<generator object>"); break;
        case JL_REVERSED: jsb_puts(b, "<list_reverseiterator object>"); break;
        default: seq_text(rt, b, v.u.l, 0, "[", "]", false);
        }
        jdepth_leave(rt);
        return;
    case JK_DICT:
        jdepth_enter(rt);
        if (v.sub == JD_NS) jsb_puts(b, "<Namespace ");
        dict_text(rt, b, v.u.d);
        if (v.sub == JD_NS) jsb_putc(b, '>');
        jdepth_leave(rt);
        return;
    case JK_FUNC: jsb_printf(b, "<built-in function %s>", v.u.fn->name); return;
    case JK_MACRO: jsb_printf(b, "<Macro '%s'>", v.u.m->name); return;
    case JK_LOOP: jsb_puts(b, "<LoopContext>"); return;
    default: return;
    }
}

void jv_str_to(struct jrt *rt, struct jsb *b, struct jv v) { to_text(rt, b, v, false); }
void jv_repr_to(struct jrt *rt, struct jsb *b, struct jv v) { to_text(rt, b, v, true); }

const struct jstr *jv_to_str(struct jrt *rt, struct jv v)
{
    if (v.k == JK_STR) return v.u.s;
    struct jsb b;
    jsb_init(&b, &rt->ar);
    to_text(rt, &b, v, false);
    return jsb_finish(&b);
}

/* ---- len, iteration ---------------------------------------------------------------------- */

int64_t jv_len(struct jrt *rt, struct jv v)
{
    switch (v.k) {
    case JK_UNDEF: return 0;
    case JK_STR: jstep_bytes(rt, v.u.s->len); return (int64_t)ju_cplen(v.u.s->s, v.u.s->len);
    case JK_LIST:
        if (v.sub == JL_GEN || v.sub == JL_REVERSED) break;
        return (int64_t)v.u.l->n;
    case JK_DICT:
        if (v.sub == JD_NS) break;
        return (int64_t)v.u.d->n;
    default: break;
    }
    type_error(rt, "object of type '%s' has no len()%s", jv_type(v), "");
}

static struct jlist *str_chars(struct jrt *rt, const struct jstr *s)
{
    jstep_bytes(rt, s->len * 8); /* a value per character */
    size_t n = ju_cplen(s->s, s->len);
    struct jlist *l = jlist_new(rt, n);
    size_t i = 0;
    for (size_t k = 0; k < n; k++) {
        size_t at = i;
        ju_decode(s->s, s->len, &i);
        l->v[k] = jv_str(jstr_sub(&rt->ar, s, at, i - at));
    }
    return l;
}

struct jlist *jv_iter(struct jrt *rt, struct jv v)
{
    switch (v.k) {
    case JK_UNDEF: return jlist_new(rt, 0);
    case JK_STR: return str_chars(rt, v.u.s);
    case JK_LIST: {
        struct jlist *src = v.u.l;
        if (v.sub != JL_GEN && v.sub != JL_REVERSED) return src;
        struct jlist *l = jlist_new(rt, src->n - src->pos);
        memcpy(l->v, src->v + src->pos, l->n * sizeof *l->v);
        src->pos = src->n; /* consumed */
        return l;
    }
    case JK_DICT: {
        if (v.sub == JD_NS) break;
        struct jlist *l = jlist_new(rt, v.u.d->n);
        memcpy(l->v, v.u.d->k, l->n * sizeof *l->v);
        return l;
    }
    default: break;
    }
    type_error(rt, "'%s' object is not iterable%s", jv_type(v), "");
}

/* ---- access ------------------------------------------------------------------------------ */

struct jv jv_getattr(struct jrt *rt, struct jv obj, const struct jstr *name)
{
    if (obj.k == JK_UNDEF) jv_undef_fail(rt, obj);
    struct jv out;
    if (name->len > 0 && name->s[0] == '_') { /* the sandbox: no underscore attributes */
        if (obj.k == JK_DICT && obj.sub == JD_DICT && jdict_gets(obj.u.d, name->s, name->len, &out)) return out;
        return jv_undef_attr(rt, obj, name, JU_ATTR);
    }
    if (obj.k == JK_LOOP && jloop_attr(rt, obj.u.lp, name, &out)) return out;
    if (obj.k == JK_DICT && obj.sub == JD_NS) {
        if (jdict_gets(obj.u.d, name->s, name->len, &out)) return out;
        return jv_undef_attr(rt, obj, name, JU_ATTR);
    }
    if (jmethod_get(rt, obj, name, &out)) return out;
    if (obj.k == JK_DICT && jdict_gets(obj.u.d, name->s, name->len, &out)) return out;
    return jv_undef_attr(rt, obj, name, JU_ATTR);
}

/* Python's index into n items (negative from the end): false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

struct jv jv_getitem(struct jrt *rt, struct jv obj, struct jv key)
{
    if (obj.k == JK_UNDEF) jv_undef_fail(rt, obj);
    struct jv out;
    size_t at;
    const bool int_key = key.k == JK_INT || key.k == JK_BOOL;
    switch (obj.k) {
    case JK_DICT:
        if (obj.sub == JD_DICT) {
            if ((key.k == JK_LIST && key.sub != JL_TUPLE) || key.k == JK_DICT) break; /* unhashable */
            if (jdict_get(rt, obj.u.d, key, &out)) return out;
        }
        break;
    case JK_LIST:
        if ((obj.sub == JL_LIST || obj.sub == JL_TUPLE) && int_key && norm_index(num_i(key), obj.u.l->n, &at))
            return obj.u.l->v[at];
        break;
    case JK_STR:
        if (int_key) {
            const struct jstr *s = obj.u.s;
            jstep_bytes(rt, s->len);
            size_t n = ju_cplen(s->s, s->len);
            if (norm_index(num_i(key), n, &at)) {
                size_t a = ju_offset(s->s, s->len, at), e = a;
                ju_decode(s->s, s->len, &e);
                return jv_str(jstr_sub(&rt->ar, s, a, e - a));
            }
        }
        break;
    default: break;
    }
    if (key.k == JK_STR) return jv_getattr(rt, obj, key.u.s);
    return jv_undef_attr(rt, obj, jv_to_str(rt, key), JU_ITEM);
}

static bool slice_arg(struct jrt *rt, struct jv v, int64_t *out)
{
    if (v.k == JK_NONE) return false;
    if (v.k == JK_INT || v.k == JK_BOOL) {
        *out = num_i(v);
        return true;
    }
    if (v.k == JK_UNDEF) jv_undef_fail(rt, v);
    type_error(rt, "slice indices must be integers or None, not %s%s", jv_type(v), "");
}

struct jv jv_slice(struct jrt *rt, struct jv obj, struct jv start, struct jv stop, struct jv step)
{
    if (obj.k == JK_UNDEF) jv_undef_fail(rt, obj);
    int64_t st = 1, a, b;
    bool has_a = slice_arg(rt, start, &a), has_b = slice_arg(rt, stop, &b);
    if (slice_arg(rt, step, &st) && st == 0) jfail(&rt->f, KVB_ERR_FORMAT, "slice step cannot be zero");
    size_t n;
    const struct jstr *s = NULL;
    if (obj.k == JK_STR) {
        s = obj.u.s;
        jstep_bytes(rt, s->len);
        n = ju_cplen(s->s, s->len);
    } else if (obj.k == JK_LIST && (obj.sub == JL_LIST || obj.sub == JL_TUPLE)) {
        n = obj.u.l->n;
    } else {
        return jv_undef_hint(rt, "the value cannot be sliced");
    }
    /* Python's slice.indices */
    const int64_t len = (int64_t)n;
    int64_t lo, hi;
    if (st > 0) {
        lo = !has_a ? 0 : a < 0 ? (a + len < 0 ? 0 : a + len) : (a > len ? len : a);
        hi = !has_b ? len : b < 0 ? (b + len < 0 ? 0 : b + len) : (b > len ? len : b);
    } else {
        lo = !has_a ? len - 1 : a < 0 ? (a + len < 0 ? -1 : a + len) : (a >= len ? len - 1 : a);
        hi = !has_b ? -1 : b < 0 ? (b + len < 0 ? -1 : b + len) : (b >= len ? len - 1 : b);
    }
    size_t count = 0;
    if (st > 0 && hi > lo) count = (size_t)((hi - lo + st - 1) / st);
    if (st < 0 && lo > hi) count = (size_t)((lo - hi + (-st) - 1) / (-st));
    if (s) {
        if (st == 1) {
            size_t x = ju_offset(s->s, s->len, (size_t)lo), y = ju_offset(s->s, s->len, (size_t)(lo + (int64_t)count));
            return jv_str(jstr_sub(&rt->ar, s, x, y - x));
        }
        struct jlist *chars = str_chars(rt, s);
        struct jsb bb;
        jsb_init(&bb, &rt->ar);
        for (size_t k = 0; k < count; k++) jsb_put_str(&bb, chars->v[lo + (int64_t)k * st].u.s);
        return jv_str(jsb_finish(&bb));
    }
    struct jlist *l = jlist_new(rt, count);
    for (size_t k = 0; k < count; k++) l->v[k] = obj.u.l->v[lo + (int64_t)k * st];
    return jv_list(l, (enum jl)obj.sub);
}

/* ---- arithmetic --------------------------------------------------------------------------- */

static const char *op_sym(enum jop op)
{
    switch (op) {
    case JO_ADD: return "+";
    case JO_SUB: return "-";
    case JO_MUL: return "*";
    case JO_DIV: return "/";
    case JO_FLOORDIV: return "//";
    case JO_MOD: return "%";
    case JO_POW: return "** or pow()";
    default: return "?";
    }
}

static _Noreturn void unsupported(struct jrt *rt, enum jop op, struct jv a, struct jv b)
{
    char msg[200];
    if (op == JO_ADD && a.k == JK_STR)
        snprintf(msg, sizeof msg, "can only concatenate str (not \"%s\") to str", jv_type(b));
    else if (op == JO_ADD && a.k == JK_LIST && a.sub == JL_LIST)
        snprintf(msg, sizeof msg, "can only concatenate list (not \"%s\") to list", jv_type(b));
    else
        snprintf(msg, sizeof msg, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), jv_type(a),
                 jv_type(b));
    jfail(&rt->f, KVB_ERR_FORMAT, "%s", msg);
}

/* markupsafe.escape into b. */
static void put_escaped(struct jrt *rt, struct jsb *b, struct jv v)
{
    const struct jstr *s = jv_to_str(rt, v);
    if (v.k == JK_STR && s->markup) {
        jsb_put_str(b, s);
        return;
    }
    for (size_t i = 0; i < s->len; i++) {
        const char c = s->s[i];
        const char *e = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '\'' ? "&#39;"
                        : c == '"'  ? "&#34;"
                                    : NULL;
        if (e) jsb_put(b, e, strlen(e), jstr_user_at(s, i));
        else jsb_put_slice(b, s, i, 1);
    }
}

static struct jv repeat(struct jrt *rt, struct jv seq, int64_t times)
{
    if (times < 0) times = 0;
    if (seq.k == JK_STR) {
        const struct jstr *s = seq.u.s;
        if (s->len && (uint64_t)times > rt->lim->max_memory / s->len)
            jfail(&rt->f, KVB_ERR_RANGE, "a string repeated %lld times passes the memory bound", (long long)times);
        struct jsb b;
        jsb_init(&b, &rt->ar);
        for (int64_t k = 0; k < times; k++) {
            jstep(rt, 1);
            jsb_put_str(&b, s);
        }
        return jv_str(jsb_finish(&b));
    }
    const struct jlist *l = seq.u.l;
    if (l->n && (uint64_t)times > rt->lim->max_memory / (l->n * sizeof(struct jv)))
        jfail(&rt->f, KVB_ERR_RANGE, "a list repeated %lld times passes the memory bound", (long long)times);
    struct jlist *r = jlist_new(rt, l->n * (size_t)times);
    for (int64_t k = 0; k < times; k++) {
        jstep(rt, 1);
        if (l->n) memcpy(r->v + (size_t)k * l->n, l->v, l->n * sizeof *l->v);
    }
    return jv_list(r, (enum jl)seq.sub);
}

static struct jv str_mod(struct jrt *rt, const struct jstr *fmt, struct jv args);

static struct jv int_result(struct jrt *rt, __int128 r)
{
    if (r > INT64_MAX || r < INT64_MIN)
        jfail(&rt->f, KVB_ERR_RANGE, "integer overflow (kvbatch's integers are 64-bit)");
    return jv_int((int64_t)r);
}

struct jv jv_binop(struct jrt *rt, enum jop op, struct jv a, struct jv b)
{
    if (a.k == JK_UNDEF) jv_undef_fail(rt, a);
    if (b.k == JK_UNDEF) jv_undef_fail(rt, b);
    if (is_num(a) && is_num(b)) {
        const bool ints = a.k != JK_FLOAT && b.k != JK_FLOAT;
        const int64_t x = ints ? num_i(a) : 0, y = ints ? num_i(b) : 0;
        const double fx = num_f(a), fy = num_f(b);
        switch (op) {
        case JO_ADD: return ints ? int_result(rt, (__int128)x + y) : jv_float(fx + fy);
        case JO_SUB: return ints ? int_result(rt, (__int128)x - y) : jv_float(fx - fy);
        case JO_MUL: return ints ? int_result(rt, (__int128)x * y) : jv_float(fx * fy);
        case JO_DIV:
            if (fy == 0) jfail(&rt->f, KVB_ERR_FORMAT, ints ? "division by zero" : "float division by zero");
            return jv_float(fx / fy);
        case JO_FLOORDIV:
            if (ints) {
                if (y == 0) jfail(&rt->f, KVB_ERR_FORMAT, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return int_result(rt, -(__int128)x);
                int64_t q = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0))) q--;
                return jv_int(q);
            }
            if (fy == 0) jfail(&rt->f, KVB_ERR_FORMAT, "float floor division by zero");
            return jv_float(floor(fx / fy));
        case JO_MOD:
            if (ints) {
                if (y == 0) jfail(&rt->f, KVB_ERR_FORMAT, "integer division or modulo by zero");
                if (y == -1) return jv_int(0);
                int64_t r = x % y;
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return jv_int(r);
            }
            if (fy == 0) jfail(&rt->f, KVB_ERR_FORMAT, "float modulo");
            {
                double r = fmod(fx, fy);
                if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
                else if (r == 0) r = copysign(0.0, fy);
                return jv_float(r);
            }
        case JO_POW:
            if (ints && y >= 0) {
                __int128 r = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    jstep(rt, 1);
                    if (e & 1) {
                        r *= base;
                        if (r > INT64_MAX || r < INT64_MIN) int_result(rt, r);
                    }
                    if (e > 1) {
                        base *= base;
                        if (base > INT64_MAX || base < INT64_MIN) int_result(rt, base);
                    }
                }
                return jv_int((int64_t)r);
            }
            if (fx == 0 && fy < 0) jfail(&rt->f, KVB_ERR_FORMAT, "0.0 cannot be raised to a negative power");
            return jv_float(pow(fx, fy));
        default: break;
        }
    }
    if (op == JO_ADD && a.k == JK_STR && b.k == JK_STR) {
        struct jsb s;
        jsb_init(&s, &rt->ar);
        const bool markup = a.u.s->markup || b.u.s->markup;
        if (markup && !a.u.s->markup) put_escaped(rt, &s, a);
        else jsb_put_str(&s, a.u.s);
        if (markup && !b.u.s->markup) put_escaped(rt, &s, b);
        else jsb_put_str(&s, b.u.s);
        struct jstr *r = (struct jstr *)jsb_finish(&s);
        r->markup = markup;
        return jv_str(r);
    }
    if (op == JO_ADD && a.k == JK_LIST && b.k == JK_LIST && a.sub == b.sub && (a.sub == JL_LIST || a.sub == JL_TUPLE)) {
        struct jlist *r = jlist_new(rt, a.u.l->n + b.u.l->n);
        if (a.u.l->n) memcpy(r->v, a.u.l->v, a.u.l->n * sizeof *r->v);
        if (b.u.l->n) memcpy(r->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *r->v);
        return jv_list(r, (enum jl)a.sub);
    }
    if (op == JO_MUL) {
        const bool seq_a = a.k == JK_STR || (a.k == JK_LIST && (a.sub == JL_LIST || a.sub == JL_TUPLE));
        const bool seq_b = b.k == JK_STR || (b.k == JK_LIST && (b.sub == JL_LIST || b.sub == JL_TUPLE));
        if (seq_a && (b.k == JK_INT || b.k == JK_BOOL)) return repeat(rt, a, num_i(b));
        if (seq_b && (a.k == JK_INT || a.k == JK_BOOL)) return repeat(rt, b, num_i(a));
    }
    if (op == JO_MOD && a.k == JK_STR) return str_mod(rt, a.u.s, b);
    unsupported(rt, op, a, b);
}

/* "fmt" % args with %s %r %d %i %f %x %% (Python's printf-style formatting,
 * the conversions templates use). */
static struct jv str_mod(struct jrt *rt, const struct jstr *fmt, struct jv args)
{
    struct jv one[1] = {args};
    const struct jv *av = one;
    size_t an = 1, used = 0;
    const bool mapping = args.k == JK_DICT && args.sub == JD_DICT;
    if (args.k == JK_LIST && args.sub == JL_TUPLE) {
        av = args.u.l->v;
        an = args.u.l->n;
    }
    struct jsb b;
    jsb_init(&b, &rt->ar);
    for (size_t i = 0; i < fmt->len; i++) {
        if (fmt->s[i] != '%') {
            jsb_put_slice(&b, fmt, i, 1);
            continue;
        }
        if (++i >= fmt->len) jfail(&rt->f, KVB_ERR_FORMAT, "incomplete format");
        if (fmt->s[i] == '%') {
            jsb_putc(&b, '%');
            continue;
        }
        struct jv v;
        if (fmt->s[i] == '(' && mapping) {
            size_t e = i + 1;
            while (e < fmt->len && fmt->s[e] != ')') e++;
            if (e >= fmt->len) jfail(&rt->f, KVB_ERR_FORMAT, "incomplete format key");
            if (!jdict_gets(args.u.d, fmt->s + i + 1, e - i - 1, &v))
                jfail(&rt->f, KVB_ERR_FORMAT, "format key not found");
            i = e + 1;
            if (i >= fmt->len) jfail(&rt->f, KVB_ERR_FORMAT, "incomplete format");
        } else {
            if (used >= an) jfail(&rt->f, KVB_ERR_FORMAT, "not enough arguments for format string");
            v = av[used++];
        }
        char spec[32];
        size_t k = 0;
        while (i < fmt->len && fmt->s[i] && strchr("-+ #0123456789.", fmt->s[i]) && k + 2 < sizeof spec)
            spec[k++] = fmt->s[i++];
        if (i >= fmt->len) jfail(&rt->f, KVB_ERR_FORMAT, "incomplete format");
        const char conv = fmt->s[i];
        spec[k] = '\0';
        for (size_t d = 0, num = 0; d <= k; d++) { /* widths and precisions stay small */
            if (d < k && spec[d] >= '0' && spec[d] <= '9') num = num * 10 + (size_t)(spec[d] - '0');
            else num = 0;
            if (num > 100) jfail(&rt->f, KVB_ERR_FORMAT, "a format width or precision over 100 is not supported");
        }
        char cf[48], out[512];
        if (conv == 's' || conv == 'r') {
            if (k) jfail(&rt->f, KVB_ERR_FORMAT, "format flags with %%%c are not supported", conv);
            if (conv == 's') jv_str_to(rt, &b, v);
            else jv_repr_to(rt, &b, v);
        } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
            if (!is_num(v)) type_error(rt, "%%%s format: a number is required, not %s", "d", jv_type(v));
            snprintf(cf, sizeof cf, "%%%sll%c", spec, conv == 'i' ? 'd' : conv);
            snprintf(out, sizeof out, cf, (long long)(v.k == JK_FLOAT ? (int64_t)v.u.f : num_i(v)));
            jsb_puts(&b, out);
        } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
            if (!is_num(v)) type_error(rt, "must be real number, not %s%s", jv_type(v), "");
            snprintf(cf, sizeof cf, "%%%s%c", spec, conv);
            snprintf(out, sizeof out, cf, num_f(v));
            jsb_puts(&b, out);
        } else {
            char c[2] = {conv, 0};
            jfail(&rt->f, KVB_ERR_FORMAT, "unsupported format character '%s'", c);
        }
    }
    if (!mapping && used < an && !(an == 1 && args.k != JK_LIST))
        jfail(&rt->f, KVB_ERR_FORMAT, "not all arguments converted during string formatting");
    return jv_str(jsb_finish(&b));
}

bool jv_in(struct jrt *rt, struct jv item, struct jv c)
{
    switch (c.k) {
    case JK_UNDEF: return false;
    case JK_STR:
        if (item.k == JK_UNDEF) jv_undef_fail(rt, item);
        if (item.k != JK_STR)
            type_error(rt, "'in <string>' requires string as left operand, not %s%s", jv_type(item), "");
        if (item.u.s->len == 0) return true;
        jstep(rt, c.u.s->len / 64);
        return memmem(c.u.s->s, c.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    case JK_LIST: {
        struct jlist *l = c.sub == JL_GEN || c.sub == JL_REVERSED ? c.u.l : NULL;
        if (l) { /* a generator is consumed up to the match */
            while (l->pos < l->n) {
                jstep(rt, 1);
                if (jv_eq(rt, l->v[l->pos++], item)) return true;
            }
            return false;
        }
        jstep(rt, c.u.l->n / 16);
        const size_t from = 0;
        if (c.sub == JL_ITEMS || c.sub == JL_KEYS || c.sub == JL_VALUES || c.sub == JL_LIST || c.sub == JL_TUPLE)
            for (size_t i = from; i < c.u.l->n; i++)
                if (jv_eq(rt, c.u.l->v[i], item)) return true;
        return false;
    }
    case JK_DICT: {
        if (c.sub == JD_NS) break;
        struct jv out;
        if ((item.k == JK_LIST && item.sub != JL_TUPLE) || item.k == JK_DICT)
            type_error(rt, "unhashable type: '%s'%s", jv_type(item), "");
        return jdict_get(rt, c.u.d, item, &out);
    }
    default: break;
    }
    type_error(rt, "argument of type '%s' is not iterable%s", jv_type(c), "");
}

/* ---- json.dumps ------------------------------------------------------------------------------ */

static void json_str(struct jsb *b, const struct jstr *s, bool ensure_ascii)
{
    jsb_putc(b, '"');
    size_t i = 0;
    while (i < s->len) {
        size_t at = i;
        uint32_t c = ju_decode(s->s, s->len, &i);
        const bool user = jstr_user_at(s, at);
        char tmp[16];
        const char *esc = NULL;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
                if (c >= 0x10000) {
                    uint32_t v = c - 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (esc) jsb_put(b, esc, strlen(esc), user);
        else jsb_put_slice(b, s, at, i - at);
    }
    jsb_putc(b, '"');
}

static void json_float(struct jsb *b, double d)
{
    char tmp[64];
    if (isnan(d)) jsb_puts(b, "NaN");
    else if (isinf(d)) jsb_puts(b, d < 0 ? "-Infinity" : "Infinity");
    else {
        jfmt_float(d, tmp, sizeof tmp);
        jsb_puts(b, tmp);
    }
}

static void json_newline(struct jsb *b, const struct jtojson *o, int level)
{
    jsb_putc(b, '\n');
    for (int i = 0; i < level; i++) {
        if (o->indent_str) jsb_put_str(b, o->indent_str);
        else
            for (int64_t k = 0; k < o->indent; k++) jsb_putc(b, ' ');
    }
}

static void json_sep(struct jsb *b, const struct jstr *s, const char *def)
{
    if (s) jsb_put_str(b, s);
    else jsb_puts(b, def);
}

static void json_value(struct jrt *rt, struct jsb *b, struct jv v, const struct jtojson *o, int level);

/* A dict key as json.dumps writes it (str, or int/float/bool/None turned into text). */
static void json_key(struct jrt *rt, struct jsb *b, struct jv k, const struct jtojson *o)
{
    switch (k.k) {
    case JK_STR: json_str(b, k.u.s, o->ensure_ascii); return;
    case JK_INT: jsb_printf(b, "\"%lld\"", (long long)k.u.i); return;
    case JK_BOOL: jsb_puts(b, k.u.b ? "\"true\"" : "\"false\""); return;
    case JK_NONE: jsb_puts(b, "\"null\""); return;
    case JK_FLOAT:
        jsb_putc(b, '"');
        json_float(b, k.u.f);
        jsb_putc(b, '"');
        return;
    default: type_error(rt, "keys must be str, int, float, bool or None, not %s%s", jv_type(k), "");
    }
}

static void json_value(struct jrt *rt, struct jsb *b, struct jv v, const struct jtojson *o, int level)
{
    jstep(rt, 1);
    const bool pretty = o->indent >= 0 || o->indent_str;
    switch (v.k) {
    case JK_NONE: jsb_puts(b, "null"); return;
    case JK_BOOL: jsb_puts(b, v.u.b ? "true" : "false"); return;
    case JK_INT: jsb_printf(b, "%lld", (long long)v.u.i); return;
    case JK_FLOAT: json_float(b, v.u.f); return;
    case JK_STR: json_str(b, v.u.s, o->ensure_ascii); return;
    case JK_LIST: {
        if (v.sub != JL_LIST && v.sub != JL_TUPLE) break;
        const struct jlist *l = v.u.l;
        if (l->n == 0) {
            jsb_puts(b, "[]");
            return;
        }
        jdepth_enter(rt);
        jsb_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) json_sep(b, o->item_sep, pretty ? "," : ", ");
            if (pretty) json_newline(b, o, level + 1);
            json_value(rt, b, l->v[i], o, level + 1);
        }
        if (pretty) json_newline(b, o, level);
        jsb_putc(b, ']');
        jdepth_leave(rt);
        return;
    }
    case JK_DICT: {
        if (v.sub != JD_DICT) break;
        const struct jdict *d = v.u.d;
        if (d->n == 0) {
            jsb_puts(b, "{}");
            return;
        }
        jdepth_enter(rt);
        size_t *order = ja_alloc(&rt->ar, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                jstep(rt, i / 8);
                while (j > 0 && jv_cmp(rt, d->k[x], d->k[order[j - 1]], "<") < 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        jsb_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) json_sep(b, o->item_sep, pretty ? "," : ", ");
            if (pretty) json_newline(b, o, level + 1);
            json_key(rt, b, d->k[order[i]], o);
            json_sep(b, o->key_sep, ": ");
            json_value(rt, b, d->v[order[i]], o, level + 1);
        }
        if (pretty) json_newline(b, o, level);
        jsb_putc(b, '}');
        jdepth_leave(rt);
        return;
    }
    default: break;
    }
    type_error(rt, "Object of type %s is not JSON serializable%s", jv_type(v), "");
}

void jv_tojson(struct jrt *rt, struct jsb *b, struct jv v, const struct jtojson *o) { json_value(rt, b, v, o, 0); }

/* ---- from JSON ----------------------------------------------------------------------------- */

static struct jv from_tok(struct jrt *rt, const struct json_doc *j, int *i, bool user)
{
    const int at = *i;
    const jsmntok_t *t = &j->tok[at];
    switch (json_kind(j, at)) {
    case JSON_NULL: *i = at + 1; return jv_none();
    case JSON_TRUE: *i = at + 1; return jv_bool(true);
    case JSON_FALSE: *i = at + 1; return jv_bool(false);
    case JSON_NUMBER: {
        *i = at + 1;
        char buf[64];
        int n = t->end - t->start;
        if (n >= (int)sizeof buf) n = (int)sizeof buf - 1;
        memcpy(buf, j->src + t->start, (size_t)n);
        buf[n] = '\0';
        if (strpbrk(buf, ".eE")) return jv_float(strtod(buf, NULL));
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno) jfail(&rt->f, KVB_ERR_RANGE, "the integer %s is too large (kvbatch's are 64-bit)", buf);
        return jv_int(v);
    }
    case JSON_STRING: {
        *i = at + 1;
        size_t n = json_str_decode(j, at, NULL);
        char *p = ja_alloc(&rt->ar, n + 1);
        json_str_decode(j, at, p);
        struct jstr *s = ja_alloc(&rt->ar, sizeof *s);
        s->s = p;
        s->len = (uint32_t)n;
        if (user && n) {
            struct jsp *sp = ja_alloc(&rt->ar, sizeof *sp);
            sp->b = (uint32_t)n;
            s->sp = sp;
            s->nsp = 1;
        }
        return jv_str(s);
    }
    case JSON_ARRAY: {
        struct jlist *l = jlist_new(rt, (size_t)t->size);
        *i = at + 1;
        for (int k = 0; k < t->size; k++) l->v[k] = from_tok(rt, j, i, user);
        return jv_list(l, JL_LIST);
    }
    case JSON_OBJECT: {
        struct jdict *d = jdict_new(rt, (size_t)t->size);
        *i = at + 1;
        for (int k = 0; k < t->size; k++) {
            struct jv key = from_tok(rt, j, i, user);
            struct jv val = from_tok(rt, j, i, user);
            jdict_set(rt, d, key, val);
        }
        return jv_dict(d, JD_DICT);
    }
    }
    return jv_none();
}

struct jv jv_from_json(struct jrt *rt, const char *s, size_t n, bool user, const char *what)
{
    /* The document's tokens are freed here, or by the render's unwinding
     * when converting fails (rt->json). */
    struct json_doc *j = ja_alloc(&rt->ar, sizeof *j);
    const char *why = NULL;
    size_t where = 0;
    enum kvb_status st = json_parse(s, n, j, &why, &where);
    if (st == KVB_ERR_NOMEM) jfail(&rt->f, KVB_ERR_NOMEM, "out of memory");
    if (st != KVB_OK) jfail(&rt->f, KVB_ERR_INVALID_ARG, "%s is not JSON (%s at byte %zu)", what, why, where);
    rt->json = j;
    int i = 0;
    struct jv v = from_tok(rt, j, &i, user);
    json_free(j);
    rt->json = NULL;
    return v;
}
