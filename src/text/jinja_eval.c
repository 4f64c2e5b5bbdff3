/* jinja_eval.c — runs the syntax tree: scopes as jinja2 has them (a for
 * loop's body, a macro, a call, filter or set block and `with` get their
 * own; if does not; a loop body starts afresh at each iteration), loops with
 * jinja2's `loop` (filtered lazily as jinja2 does, so loop.last looks one
 * item ahead), macros with defaults, varargs, kwargs and caller, and every
 * expression. Each node run is a step against the bound; every nesting of
 * runs counts against the depth bound. */
#include <string.h>

#include "text/jinja_internal.h"

/* ---- scopes -------------------------------------------------------------------------- */

static struct jframe *frame_new(struct jrt *rt, struct jframe *parent)
{
    struct jframe *f = ja_alloc(&rt->ar, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(struct jrt *rt, struct jframe *f, uint32_t sym, struct jv v)
{
    jstep(rt, f->n / 16); /* the scan costs */
    for (uint32_t i = 0; i < f->n; i++)
        if (f->sym[i] == sym) {
            f->val[i] = v;
            return;
        }
    if (f->n == f->cap) {
        uint32_t cap = f->cap ? f->cap * 2 : 4;
        uint32_t *ns = ja_alloc(&rt->ar, cap * sizeof *ns);
        struct jv *nv = ja_alloc(&rt->ar, cap * sizeof *nv);
        if (f->n) {
            memcpy(ns, f->sym, f->n * sizeof *ns);
            memcpy(nv, f->val, f->n * sizeof *nv);
        }
        f->sym = ns;
        f->val = nv;
        f->cap = cap;
    }
    f->sym[f->n] = sym;
    f->val[f->n] = v;
    f->n++;
}

static struct jv lookup(struct jrt *rt, struct jframe *f, uint32_t sym)
{
    for (; f; f = f->parent) {
        jstep(rt, f->n / 16);
        for (uint32_t i = f->n; i-- > 0;)
            if (f->sym[i] == sym) return f->val[i];
    }
    const struct jv c = rt->ctx[sym];
    if (c.k != JK_UNDEF || c.u.u) return c;
    const struct jsym *y = &rt->t->syms[sym];
    if (y->global) return jglobal_value(rt, y->global - 1);
    return jv_undef_named(rt, y->s);
}

/* ---- loops ---------------------------------------------------------------------------- */

struct jloop {
    struct jlist *src;
    size_t src_pos; /* next source item to look at */
    const struct jnode *fornode;
    struct jframe *parent; /* the frame the loop runs in (its filter test sees it) */
    struct jv *buf;        /* items that passed the filter, in order */
    size_t nbuf, capbuf;
    size_t index0; /* the current item: buf[index0] */
    struct jv last_changed;
    bool has_changed;
};

static void assign(struct jrt *rt, const struct jnode *target, struct jv v, struct jframe *f);

/* Looks at source items until one passes the loop's filter: false when the
 * source is exhausted. */
static bool produce(struct jrt *rt, struct jloop *lp)
{
    while (lp->src_pos < lp->src->n) {
        struct jv item = lp->src->v[lp->src_pos++];
        jstep(rt, 1);
        bool pass = true;
        if (lp->fornode->e) {
            struct jframe *tf = frame_new(rt, lp->parent);
            assign(rt, lp->fornode->a, item, tf);
            pass = jv_truthy(rt, jeval(rt, lp->fornode->e, tf));
        }
        if (!pass) continue;
        if (lp->nbuf == lp->capbuf) {
            size_t cap = lp->capbuf ? lp->capbuf * 2 : 16;
            struct jv *nb = ja_alloc(&rt->ar, cap * sizeof *nb);
            if (lp->nbuf) memcpy(nb, lp->buf, lp->nbuf * sizeof *nb);
            lp->buf = nb;
            lp->capbuf = cap;
        }
        lp->buf[lp->nbuf++] = item;
        return true;
    }
    return false;
}

static bool has_next(struct jrt *rt, struct jloop *lp) { return lp->index0 + 1 < lp->nbuf || produce(rt, lp); }

static size_t loop_length(struct jrt *rt, struct jloop *lp)
{
    while (produce(rt, lp)) {}
    return lp->nbuf;
}

struct jv jloop_cycle(struct jrt *rt, struct jloop *lp, struct jargs *a)
{
    if (a->npos == 0) jfail(&rt->f, KVB_ERR_FORMAT, "no items for cycling given");
    return a->pos[lp->index0 % a->npos];
}

struct jv jloop_changed(struct jrt *rt, struct jloop *lp, struct jargs *a)
{
    struct jlist *l = jlist_new(rt, a->npos);
    if (a->npos) memcpy(l->v, a->pos, a->npos * sizeof *l->v);
    struct jv v = jv_list(l, JL_TUPLE);
    if (lp->has_changed && jv_eq(rt, lp->last_changed, v)) return jv_bool(false);
    lp->last_changed = v;
    lp->has_changed = true;
    return jv_bool(true);
}

static struct jv loop_func(struct jrt *rt, struct jloop *lp, enum jfn id, const char *name)
{
    struct jfunc *fn = ja_alloc(&rt->ar, sizeof *fn);
    fn->id = (uint16_t)id;
    fn->self = (struct jv){.k = JK_LOOP, .u.lp = lp};
    fn->name = name;
    return (struct jv){.k = JK_FUNC, .u.fn = fn};
}

bool jloop_attr(struct jrt *rt, struct jloop *lp, const struct jstr *name, struct jv *out)
{
    const int64_t i0 = (int64_t)lp->index0;
    if (jstr_eqc(name, "index")) *out = jv_int(i0 + 1);
    else if (jstr_eqc(name, "index0")) *out = jv_int(i0);
    else if (jstr_eqc(name, "first")) *out = jv_bool(i0 == 0);
    else if (jstr_eqc(name, "last")) *out = jv_bool(!has_next(rt, lp));
    else if (jstr_eqc(name, "length")) *out = jv_int((int64_t)loop_length(rt, lp));
    else if (jstr_eqc(name, "revindex")) *out = jv_int((int64_t)loop_length(rt, lp) - i0);
    else if (jstr_eqc(name, "revindex0")) *out = jv_int((int64_t)loop_length(rt, lp) - i0 - 1);
    else if (jstr_eqc(name, "depth")) *out = jv_int(1);
    else if (jstr_eqc(name, "depth0")) *out = jv_int(0);
    else if (jstr_eqc(name, "previtem"))
        *out = i0 == 0 ? jv_undef_hint(rt, "there is no previous item") : lp->buf[i0 - 1];
    else if (jstr_eqc(name, "nextitem"))
        *out = has_next(rt, lp) ? lp->buf[i0 + 1] : jv_undef_hint(rt, "there is no next item");
    else if (jstr_eqc(name, "cycle")) *out = loop_func(rt, lp, JF_LOOP_CYCLE, "cycle");
    else if (jstr_eqc(name, "changed")) *out = loop_func(rt, lp, JF_LOOP_CHANGED, "changed");
    else return false;
    return true;
}

/* ---- assignment --------------------------------------------------------------------------- */

static void assign(struct jrt *rt, const struct jnode *target, struct jv v, struct jframe *f)
{
    if (target->kind == JN_NAME) {
        frame_set(rt, f, target->sym, v);
        return;
    }
    if (target->kind == JN_NSREF) {
        struct jv ns = lookup(rt, f, target->sym);
        if (ns.k != JK_DICT || ns.sub != JD_NS)
            jfail(&rt->f, KVB_ERR_FORMAT, "cannot assign attribute on non-namespace object");
        const struct jstr *attr = rt->t->symstr[target->sym2];
        if (attr->len && attr->s[0] == '_')
            jfail(&rt->f, KVB_ERR_FORMAT, "chat templates cannot store underscore-prefixed attributes on a namespace");
        jdict_set(rt, ns.u.d, jv_str(attr), v);
        return;
    }
    /* a tuple of targets: unpack as Python does */
    struct jlist *items = jv_iter(rt, v);
    if (items->n != target->nkid) {
        if (items->n > target->nkid)
            jfail(&rt->f, KVB_ERR_FORMAT, "too many values to unpack (expected %u)", target->nkid);
        jfail(&rt->f, KVB_ERR_FORMAT, "not enough values to unpack (expected %u, got %zu)", target->nkid, items->n);
    }
    for (uint32_t i = 0; i < target->nkid; i++) assign(rt, target->kid[i], items->v[i], f);
}

/* ---- calls ----------------------------------------------------------------------------------- */

static void eval_args(struct jrt *rt, const struct jnode *n, struct jframe *f, struct jargs *a, size_t extra_pos)
{
    size_t npos = n->nkid, nkw = n->nkv;
    struct jlist *star = NULL;
    struct jdict *dstar = NULL;
    if (n->c) {
        struct jv v = jeval(rt, n->c, f);
        star = jv_iter(rt, v);
        npos += star->n;
    }
    if (n->d) {
        struct jv v = jeval(rt, n->d, f);
        if (v.k != JK_DICT) jfail(&rt->f, KVB_ERR_FORMAT, "argument after ** must be a mapping, not %s", jv_type(v));
        dstar = v.u.d;
        nkw += dstar->n;
    }
    a->pos = ja_alloc(&rt->ar, (npos + extra_pos + 1) * sizeof *a->pos);
    a->npos = 0;
    for (uint32_t i = 0; i < n->nkid; i++) a->pos[extra_pos + a->npos++] = jeval(rt, n->kid[i], f);
    for (size_t i = 0; star && i < star->n; i++) a->pos[extra_pos + a->npos++] = star->v[i];
    a->npos += extra_pos;
    a->kwname = ja_alloc(&rt->ar, (nkw + 1) * sizeof *a->kwname);
    a->kw = ja_alloc(&rt->ar, (nkw + 1) * sizeof *a->kw);
    a->nkw = 0;
    for (uint32_t i = 0; i < n->nkv; i++) {
        a->kwname[a->nkw] = rt->t->symstr[n->kwsym[i]];
        a->kw[a->nkw++] = jeval(rt, n->kv[i], f);
    }
    for (size_t i = 0; dstar && i < dstar->n; i++) {
        if (dstar->k[i].k != JK_STR) jfail(&rt->f, KVB_ERR_FORMAT, "keywords must be strings");
        a->kwname[a->nkw] = dstar->k[i].u.s;
        a->kw[a->nkw++] = dstar->v[i];
    }
}

static void exec_body(struct jrt *rt, const struct jnode *body, struct jframe *f, int *ctl);

/* Runs body with its output captured into a string. */
static const struct jstr *capture(struct jrt *rt, const struct jnode *body, struct jframe *f)
{
    struct jsb b, *saved = rt->out;
    jsb_init(&b, &rt->ar);
    rt->out = &b;
    int ctl = 0;
    exec_body(rt, body, f, &ctl);
    rt->out = saved;
    return jsb_finish(&b);
}

static struct jv call_macro(struct jrt *rt, const struct jmacro *m, struct jargs *a)
{
    const struct jnode *n = m->n;
    jdepth_enter(rt);
    struct jframe *f = frame_new(rt, m->closure);
    const uint32_t nparam = n->nkid, ndef = n->nkv;
    bool *given = ja_alloc(&rt->ar, nparam + 1);
    if (a->npos > nparam && !(n->flags & JF_USES_VARARGS))
        jfail(&rt->f, KVB_ERR_FORMAT, "macro '%s' takes not more than %u argument(s)", m->name, nparam);
    for (uint32_t i = 0; i < nparam && i < a->npos; i++) {
        frame_set(rt, f, n->kid[i]->sym, a->pos[i]);
        given[i] = true;
    }
    struct jdict *kwargs = (n->flags & JF_USES_KWARGS) ? jdict_new(rt, 0) : NULL;
    bool caller_given = false;
    for (size_t k = 0; k < a->nkw; k++) {
        const struct jstr *name = a->kwname[k];
        uint32_t i;
        for (i = 0; i < nparam; i++)
            if (jstr_eq(rt->t->symstr[n->kid[i]->sym], name)) break;
        if (i < nparam) {
            if (given[i])
                jfail(&rt->f, KVB_ERR_FORMAT, "macro '%s' got multiple values for argument '%.*s'", m->name,
                      (int)name->len, name->s);
            frame_set(rt, f, n->kid[i]->sym, a->kw[k]);
            given[i] = true;
        } else if (jstr_eqc(name, "caller") && (n->flags & JF_USES_CALLER)) {
            frame_set(rt, f, rt->t->well[JW_CALLER], a->kw[k]);
            caller_given = true;
        } else if (kwargs) {
            jdict_set(rt, kwargs, jv_str(name), a->kw[k]);
        } else if (jstr_eqc(name, "caller")) {
            jfail(&rt->f, KVB_ERR_FORMAT, "macro '%s' was invoked with two values for the special caller argument",
                  m->name);
        } else {
            jfail(&rt->f, KVB_ERR_FORMAT, "macro '%s' takes no keyword argument '%.*s'", m->name, (int)name->len,
                  name->s);
        }
    }
    for (uint32_t i = 0; i < nparam; i++) {
        if (given[i]) continue;
        const uint32_t first_def = nparam - ndef;
        struct jv v;
        if (i >= first_def) {
            v = jeval(rt, n->kv[i - first_def], f);
        } else {
            const char *pname = rt->t->syms[n->kid[i]->sym].s;
            struct jsb b;
            jsb_init(&b, &rt->ar);
            jsb_printf(&b, "parameter '%s' was not provided", pname);
            const struct jstr *hint = jsb_finish(&b);
            v = jv_undef_hint(rt, ja_strndup(&rt->ar, hint->s, hint->len));
        }
        frame_set(rt, f, n->kid[i]->sym, v);
    }
    if ((n->flags & JF_USES_CALLER) && !caller_given)
        frame_set(rt, f, rt->t->well[JW_CALLER], jv_undef_hint(rt, "No caller defined"));
    if (kwargs) frame_set(rt, f, rt->t->well[JW_KWARGS], jv_dict(kwargs, JD_DICT));
    if (n->flags & JF_USES_VARARGS) {
        size_t extra = a->npos > nparam ? a->npos - nparam : 0;
        struct jlist *l = jlist_new(rt, extra);
        for (size_t i = 0; i < extra; i++) l->v[i] = a->pos[nparam + i];
        frame_set(rt, f, rt->t->well[JW_VARARGS], jv_list(l, JL_TUPLE));
    }
    const struct jstr *s = capture(rt, n->c, f);
    jdepth_leave(rt);
    return jv_str(s);
}

struct jv jcall(struct jrt *rt, struct jv callee, struct jargs *a)
{
    switch (callee.k) {
    case JK_FUNC: return jfunc_call(rt, callee.u.fn, a);
    case JK_MACRO: return call_macro(rt, callee.u.m, a);
    case JK_UNDEF: jv_undef_fail(rt, callee);
    default: break;
    }
    jfail(&rt->f, KVB_ERR_FORMAT, "'%s' object is not callable", jv_type(callee));
}

/* ---- expressions --------------------------------------------------------------------------- */

static struct jv eval_filter(struct jrt *rt, const struct jnode *n, struct jframe *f)
{
    struct jv in = n->a ? jeval(rt, n->a, f) : rt->filter_input;
    const char *name = rt->t->syms[n->sym].s;
    if (n->flags & JF_UNKNOWN) jfail(&rt->f, KVB_ERR_FORMAT, "no filter named '%s' found", name);
    struct jargs a;
    eval_args(rt, n, f, &a, 0);
    return jfilter_call(rt, n->fid, name, in, &a);
}

static struct jv eval_test(struct jrt *rt, const struct jnode *n, struct jframe *f)
{
    struct jv in = jeval(rt, n->a, f);
    const char *name = rt->t->syms[n->sym].s;
    if (n->flags & JF_UNKNOWN) jfail(&rt->f, KVB_ERR_FORMAT, "no test named '%s' found", name);
    struct jargs a;
    eval_args(rt, n, f, &a, 0);
    return jv_bool(jtest_call(rt, n->fid, name, in, &a));
}

static bool compare(struct jrt *rt, enum jop op, struct jv a, struct jv b)
{
    switch (op) {
    case JO_EQ: return jv_eq(rt, a, b);
    case JO_NE: return !jv_eq(rt, a, b);
    case JO_LT: return jv_cmp(rt, a, b, "<") < 0;
    case JO_LE: return jv_cmp(rt, a, b, "<=") <= 0;
    case JO_GT: return jv_cmp(rt, a, b, ">") > 0;
    case JO_GE: return jv_cmp(rt, a, b, ">=") >= 0;
    case JO_IN: return jv_in(rt, a, b);
    case JO_NOTIN: return !jv_in(rt, a, b);
    default: return false;
    }
}

/* a + b + c + …: the operands left to right, then, when they are all plain
 * strings (the common case: '<|im_start|>' + role + '\n' + content + …),
 * one string built once rather than one copy per "+" (a message of
 * megabytes would be copied at each); otherwise Python's additions in
 * order. */
static struct jv eval_add_chain(struct jrt *rt, const struct jnode *n, struct jframe *f)
{
    uint32_t k = 1;
    for (const struct jnode *x = n; x->kind == JN_BIN && x->op == JO_ADD; x = x->a) k++;
    struct jv *ops = ja_alloc(&rt->ar, k * sizeof *ops);
    const struct jnode **rights = ja_alloc(&rt->ar, k * sizeof *rights);
    const struct jnode *x = n;
    for (uint32_t i = k - 1; i > 0; i--, x = x->a) rights[i] = x->b;
    ops[0] = jeval(rt, x, f); /* the leftmost operand */
    for (uint32_t i = 1; i < k; i++) ops[i] = jeval(rt, rights[i], f);
    bool plain = true;
    size_t total = 0;
    for (uint32_t i = 0; i < k && plain; i++) {
        plain = ops[i].k == JK_STR && !ops[i].u.s->markup;
        if (plain) total += ops[i].u.s->len;
    }
    if (!plain) {
        struct jv acc = ops[0];
        for (uint32_t i = 1; i < k; i++) acc = jv_binop(rt, JO_ADD, acc, ops[i]);
        return acc;
    }
    struct jsb b;
    jsb_init(&b, &rt->ar);
    jsb_reserve(&b, total);
    for (uint32_t i = 0; i < k; i++) jsb_put_str(&b, ops[i].u.s);
    return jv_str(jsb_finish(&b));
}

static struct jv eval_inner(struct jrt *rt, const struct jnode *n, struct jframe *f)
{
    switch (n->kind) {
    case JN_CONST: return n->cv;
    case JN_NAME: return lookup(rt, f, n->sym);
    case JN_LIST:
    case JN_TUPLE: {
        struct jlist *l = jlist_new(rt, n->nkid);
        for (uint32_t i = 0; i < n->nkid; i++) l->v[i] = jeval(rt, n->kid[i], f);
        return jv_list(l, n->kind == JN_LIST ? JL_LIST : JL_TUPLE);
    }
    case JN_DICT: {
        struct jdict *d = jdict_new(rt, n->nkid);
        for (uint32_t i = 0; i < n->nkid; i++) {
            struct jv k = jeval(rt, n->kid[i], f);
            jdict_set(rt, d, k, jeval(rt, n->kv[i], f));
        }
        return jv_dict(d, JD_DICT);
    }
    case JN_GETATTR: {
        struct jv obj = jeval(rt, n->a, f);
        return jv_getattr(rt, obj, rt->t->symstr[n->sym]);
    }
    case JN_GETITEM: {
        struct jv obj = jeval(rt, n->a, f);
        if (n->b->kind == JN_SLICE) {
            const struct jnode *s = n->b;
            struct jv a = s->a ? jeval(rt, s->a, f) : jv_none(), b = s->b ? jeval(rt, s->b, f) : jv_none(),
                      c = s->c ? jeval(rt, s->c, f) : jv_none();
            return jv_slice(rt, obj, a, b, c);
        }
        return jv_getitem(rt, obj, jeval(rt, n->b, f));
    }
    case JN_SLICE: jfail(&rt->f, KVB_ERR_FORMAT, "a slice outside of a subscript");
    case JN_CALL: {
        struct jv callee = jeval(rt, n->a, f);
        struct jargs a;
        eval_args(rt, n, f, &a, 0);
        return jcall(rt, callee, &a);
    }
    case JN_FILTER: return eval_filter(rt, n, f);
    case JN_TEST: return eval_test(rt, n, f);
    case JN_NOT: return jv_bool(!jv_truthy(rt, jeval(rt, n->a, f)));
    case JN_NEG:
    case JN_POS: {
        struct jv v = jeval(rt, n->a, f);
        if (v.k == JK_UNDEF) jv_undef_fail(rt, v);
        if (v.k == JK_INT || v.k == JK_BOOL) {
            int64_t i = v.k == JK_INT ? v.u.i : v.u.b;
            if (n->kind == JN_POS) return jv_int(i);
            return jv_binop(rt, JO_SUB, jv_int(0), jv_int(i));
        }
        if (v.k == JK_FLOAT) return jv_float(n->kind == JN_NEG ? -v.u.f : v.u.f);
        jfail(&rt->f, KVB_ERR_FORMAT, "bad operand type for unary %s: '%s'", n->kind == JN_NEG ? "-" : "+", jv_type(v));
    }
    case JN_AND: {
        struct jv a = jeval(rt, n->a, f);
        return jv_truthy(rt, a) ? jeval(rt, n->b, f) : a;
    }
    case JN_OR: {
        struct jv a = jeval(rt, n->a, f);
        return jv_truthy(rt, a) ? a : jeval(rt, n->b, f);
    }
    case JN_BIN: {
        if (n->op == JO_ADD && n->a->kind == JN_BIN && n->a->op == JO_ADD) return eval_add_chain(rt, n, f);
        struct jv a = jeval(rt, n->a, f);
        return jv_binop(rt, (enum jop)n->op, a, jeval(rt, n->b, f));
    }
    case JN_CONCAT: {
        struct jsb b;
        jsb_init(&b, &rt->ar);
        for (uint32_t i = 0; i < n->nkid; i++) jv_str_to(rt, &b, jeval(rt, n->kid[i], f));
        return jv_str(jsb_finish(&b));
    }
    case JN_CMP: {
        struct jv left = jeval(rt, n->a, f);
        for (uint32_t i = 0; i < n->nkid; i++) {
            struct jv right = jeval(rt, n->kid[i], f);
            if (!compare(rt, (enum jop)n->kwsym[i], left, right)) return jv_bool(false);
            left = right;
        }
        return jv_bool(true);
    }
    case JN_COND:
        if (jv_truthy(rt, jeval(rt, n->a, f))) return jeval(rt, n->b, f);
        if (n->c) return jeval(rt, n->c, f);
        return jv_undef_hint(rt, "the inline if-expression evaluated to false and no else section was defined");
    default: jfail(&rt->f, KVB_ERR_INTERNAL, "node %d is not an expression", n->kind);
    }
}

struct jv jeval(struct jrt *rt, const struct jnode *n, struct jframe *f)
{
    jstep(rt, 1);
    jdepth_enter(rt);
    const uint32_t line = rt->f.line;
    rt->f.line = n->line;
    struct jv v = eval_inner(rt, n, f);
    rt->f.line = line;
    jdepth_leave(rt);
    return v;
}

/* ---- statements ------------------------------------------------------------------------------ */

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

static void exec(struct jrt *rt, const struct jnode *n, struct jframe *f, int *ctl);

static void exec_body(struct jrt *rt, const struct jnode *body, struct jframe *f, int *ctl)
{
    if (!body) return;
    if (body->kind != JN_BODY) {
        exec(rt, body, f, ctl);
        return;
    }
    for (uint32_t i = 0; i < body->nkid && *ctl == CTL_NONE; i++) exec(rt, body->kid[i], f, ctl);
}

static void exec_for(struct jrt *rt, const struct jnode *n, struct jframe *f, int *ctl)
{
    struct jv it = jeval(rt, n->b, f);
    struct jloop *lp = ja_alloc(&rt->ar, sizeof *lp);
    lp->src = jv_iter(rt, it);
    lp->fornode = n;
    lp->parent = f;
    if (n->e) f->captured = true; /* the filter runs in it while the loop lives */
    const struct jv loopv = {.k = JK_LOOP, .u.lp = lp};
    bool any = false;
    jdepth_enter(rt);
    struct jframe *body = NULL;
    if (produce(rt, lp)) {
        for (;;) {
            any = true;
            jstep(rt, 1);
            /* each iteration starts afresh; its frame is reused unless something kept it */
            if (!body || body->captured) body = frame_new(rt, f);
            else body->n = 0;
            assign(rt, n->a, lp->buf[lp->index0], body);
            frame_set(rt, body, rt->t->well[JW_LOOP], loopv);
            int c = CTL_NONE;
            exec_body(rt, n->c, body, &c);
            if (c == CTL_BREAK) break;
            if (!has_next(rt, lp)) break;
            lp->index0++;
        }
    }
    jdepth_leave(rt);
    if (!any && n->d) exec_body(rt, n->d, frame_new(rt, f), ctl);
}

static void exec_inner(struct jrt *rt, const struct jnode *n, struct jframe *f, int *ctl)
{
    switch (n->kind) {
    case JN_BODY: exec_body(rt, n, f, ctl); return;
    case JN_TEXT: jsb_put_str(rt->out, n->cv.u.s); return;
    case JN_PRINT: jv_str_to(rt, rt->out, jeval(rt, n->a, f)); return;
    case JN_IF:
        if (jv_truthy(rt, jeval(rt, n->a, f))) exec_body(rt, n->b, f, ctl);
        else exec_body(rt, n->c, f, ctl);
        return;
    case JN_FOR: exec_for(rt, n, f, ctl); return;
    case JN_SET: assign(rt, n->a, jeval(rt, n->b, f), f); return;
    case JN_SETBLK: {
        struct jframe *inner = frame_new(rt, f);
        struct jv v = jv_str(capture(rt, n->c, inner));
        if (n->b) {
            struct jv saved = rt->filter_input;
            rt->filter_input = v;
            v = jeval(rt, n->b, inner);
            rt->filter_input = saved;
        }
        assign(rt, n->a, v, f);
        return;
    }
    case JN_MACRO: {
        struct jmacro *m = ja_alloc(&rt->ar, sizeof *m);
        m->n = n;
        m->closure = f;
        f->captured = true;
        m->name = rt->t->syms[n->sym].s;
        frame_set(rt, f, n->sym, (struct jv){.k = JK_MACRO, .u.m = m});
        return;
    }
    case JN_CALLBLK: {
        struct jmacro *m = ja_alloc(&rt->ar, sizeof *m);
        m->n = n;
        m->closure = f;
        f->captured = true;
        m->name = "caller";
        const struct jnode *call = n->a;
        struct jv callee = jeval(rt, call->a, f);
        struct jargs a;
        eval_args(rt, call, f, &a, 0);
        /* the caller goes in as a keyword argument, as jinja2 passes it */
        const struct jstr **names = ja_alloc(&rt->ar, (a.nkw + 1) * sizeof *names);
        struct jv *vals = ja_alloc(&rt->ar, (a.nkw + 1) * sizeof *vals);
        if (a.nkw) {
            memcpy(names, a.kwname, a.nkw * sizeof *names);
            memcpy(vals, a.kw, a.nkw * sizeof *vals);
        }
        names[a.nkw] = rt->t->symstr[rt->t->well[JW_CALLER]];
        vals[a.nkw] = (struct jv){.k = JK_MACRO, .u.m = m};
        a.kwname = names;
        a.kw = vals;
        a.nkw++;
        jv_str_to(rt, rt->out, jcall(rt, callee, &a));
        return;
    }
    case JN_FILTBLK: {
        struct jframe *inner = frame_new(rt, f);
        struct jv saved = rt->filter_input;
        rt->filter_input = jv_str(capture(rt, n->c, inner));
        struct jv v = jeval(rt, n->a, inner);
        rt->filter_input = saved;
        jv_str_to(rt, rt->out, v);
        return;
    }
    case JN_WITH: {
        struct jframe *inner = frame_new(rt, f);
        struct jv *vals = ja_alloc(&rt->ar, (n->nkv + 1) * sizeof *vals);
        for (uint32_t i = 0; i < n->nkv; i++) vals[i] = jeval(rt, n->kv[i], f);
        for (uint32_t i = 0; i < n->nkid; i++) assign(rt, n->kid[i], vals[i], inner);
        exec_body(rt, n->c, inner, ctl);
        return;
    }
    case JN_SCOPE: {
        int c = CTL_NONE;
        exec_body(rt, n->c, frame_new(rt, f), &c);
        return;
    }
    case JN_BREAK: *ctl = CTL_BREAK; return;
    case JN_CONTINUE: *ctl = CTL_CONTINUE; return;
    default: jfail(&rt->f, KVB_ERR_INTERNAL, "node %d is not a statement", n->kind);
    }
}

static void exec(struct jrt *rt, const struct jnode *n, struct jframe *f, int *ctl)
{
    jstep(rt, 1);
    jdepth_enter(rt);
    rt->f.line = n->line;
    exec_inner(rt, n, f, ctl);
    jdepth_leave(rt);
}

void jexec_root(struct jrt *rt)
{
    int ctl = CTL_NONE;
    exec_body(rt, rt->t->root, frame_new(rt, NULL), &ctl);
}
