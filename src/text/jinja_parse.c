/* jinja_parse.c — tokens into the syntax tree, with jinja2's grammar and
 * precedence (its parser.py read as a specification): statements for, if,
 * set, macro, call, filter, with, print, raw (in the lexer), break and
 * continue (the loopcontrols extension), generation (transformers' tag);
 * expressions from the conditional down to primaries, postfix access, calls,
 * filters and tests. Nesting is bounded (jinja_limits.max_nest), so a
 * hostile template cannot exhaust the stack. Filters and tests are looked up
 * here: an unknown one is a syntax error unless it sits where jinja2 only
 * fails when it runs (in an if block or a conditional expression). */
#include <stdio.h>
#include <string.h>

#include "text/jinja_internal.h"

struct parser {
    struct jinja_template *t;
    const struct jtok *tok;
    size_t n, pos;
    uint32_t nest;
    uint32_t loops; /* for bodies around the statement being parsed (break/continue) */
};

static _Noreturn void pfail(struct parser *P, const char *fmt, const char *arg)
{
    P->t->f.line = P->tok[P->pos < P->n ? P->pos : P->n - 1].line;
    jfail(&P->t->f, KVB_ERR_FORMAT, fmt, arg);
}

static const struct jtok *cur(struct parser *P) { return &P->tok[P->pos]; }
static const struct jtok *peek(struct parser *P) { return &P->tok[P->pos + 1 < P->n ? P->pos + 1 : P->n - 1]; }
static const struct jtok *next(struct parser *P)
{
    const struct jtok *k = cur(P);
    if (k->type != JT_EOF) P->pos++;
    return k;
}

static bool tok_is_name(const struct jtok *k, const char *s)
{
    return k->type == JT_NAME && k->n == strlen(s) && memcmp(k->s, s, k->n) == 0;
}
static bool tok_is_op(const struct jtok *k, const char *op) { return k->type == JT_OP && strcmp(k->op, op) == 0; }
static bool is_name(struct parser *P, const char *s) { return tok_is_name(cur(P), s); }
static bool is_op(struct parser *P, const char *op) { return tok_is_op(cur(P), op); }

static bool skip_name(struct parser *P, const char *s)
{
    if (!is_name(P, s)) return false;
    next(P);
    return true;
}
static bool skip_op(struct parser *P, const char *op)
{
    if (!is_op(P, op)) return false;
    next(P);
    return true;
}

static const char *describe(struct parser *P, const struct jtok *k, char *buf, size_t cap)
{
    (void)P;
    switch (k->type) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_NAME: snprintf(buf, cap, "%.*s", (int)(k->n < 64 ? k->n : 64), k->s); return buf;
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default: snprintf(buf, cap, "%s", k->op); return buf;
    }
}

static _Noreturn void unexpected(struct parser *P, const char *wanted)
{
    char buf[80], msg[200];
    const struct jtok *k = cur(P);
    if (k->type == JT_EOF) snprintf(msg, sizeof msg, "unexpected end of template, expected '%s'", wanted);
    else snprintf(msg, sizeof msg, "expected '%s', got '%s'", wanted, describe(P, k, buf, sizeof buf));
    pfail(P, "%s", msg);
}

static void expect_op(struct parser *P, const char *op)
{
    if (!skip_op(P, op)) unexpected(P, op);
}
static void expect_type(struct parser *P, enum jt type, const char *what)
{
    if (cur(P)->type != type) unexpected(P, what);
    next(P);
}
static const struct jtok *expect_name(struct parser *P)
{
    if (cur(P)->type != JT_NAME) unexpected(P, "name");
    return next(P);
}

static void enter(struct parser *P)
{
    if (++P->nest > P->t->lim.max_nest) {
        char n[16];
        snprintf(n, sizeof n, "%u", P->t->lim.max_nest);
        pfail(P, "expressions or blocks nested deeper than %s levels", n);
    }
}
static void leave(struct parser *P) { P->nest--; }

/* ---- symbols ------------------------------------------------------------------------ */

static uint64_t sym_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int64_t jsym_find(const struct jinja_template *t, const char *s, size_t n)
{
    if (!t->symslot_cap) return -1;
    const size_t mask = t->symslot_cap - 1;
    for (size_t k = sym_hash(s, n) & mask;; k = (k + 1) & mask) {
        uint32_t v = t->symslot[k];
        if (!v) return -1;
        const struct jsym *y = &t->syms[v - 1];
        if (y->n == n && memcmp(y->s, s, n) == 0) return v - 1;
    }
}

/* An open-addressing table (slots hold symbol + 1) keeps interning linear
 * in the source: a hostile template may use a hundred thousand names. */
uint32_t jsym_intern(struct jinja_template *t, const char *s, size_t n)
{
    const size_t mask = t->symslot_cap - 1;
    if (t->symslot_cap) {
        for (size_t k = sym_hash(s, n) & mask;; k = (k + 1) & mask) {
            uint32_t v = t->symslot[k];
            if (!v) break;
            const struct jsym *y = &t->syms[v - 1];
            if (y->n == n && memcmp(y->s, s, n) == 0) return v - 1;
        }
    }
    if (t->nsym == t->symcap) {
        size_t cap = t->symcap ? t->symcap * 2 : 64;
        struct jsym *ns = ja_alloc(&t->ar, cap * sizeof *ns);
        if (t->nsym) memcpy(ns, t->syms, t->nsym * sizeof *ns);
        uint32_t *slot = ja_alloc(&t->ar, 2 * cap * sizeof *slot);
        for (uint32_t i = 0; i < t->nsym; i++) {
            size_t k = sym_hash(ns[i].s, ns[i].n) & (2 * cap - 1);
            while (slot[k]) k = (k + 1) & (2 * cap - 1);
            slot[k] = i + 1;
        }
        t->syms = ns;
        t->symcap = cap;
        t->symslot = slot;
        t->symslot_cap = 2 * cap;
    }
    struct jsym *y = &t->syms[t->nsym];
    y->s = ja_strndup(&t->ar, s, n);
    y->n = n;
    y->global = 0;
    for (int g = 0; g < JG_COUNT_; g++)
        if (strlen(jglobal_name(g)) == n && memcmp(jglobal_name(g), s, n) == 0) y->global = g + 1;
    size_t k = sym_hash(s, n) & (t->symslot_cap - 1);
    while (t->symslot[k]) k = (k + 1) & (t->symslot_cap - 1);
    t->symslot[k] = t->nsym + 1;
    return t->nsym++;
}

/* ---- nodes -------------------------------------------------------------------------- */

static struct jnode *node(struct parser *P, enum jn kind, uint32_t line)
{
    struct jnode *n = ja_alloc(&P->t->ar, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    n->fid = -1;
    return n;
}

struct vec {
    struct jnode **v;
    uint32_t n, cap;
};

static void vpush(struct parser *P, struct vec *v, struct jnode *x)
{
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = ja_alloc(&P->t->ar, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

struct uvec {
    uint32_t *v;
    uint32_t n, cap;
};

static void upush(struct parser *P, struct uvec *v, uint32_t x)
{
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 4;
        uint32_t *nv = ja_alloc(&P->t->ar, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static uint32_t sym_of(struct parser *P, const struct jtok *k) { return jsym_intern(P->t, k->s, k->n); }

/* ---- expressions ------------------------------------------------------------------- */

static struct jnode *parse_expression(struct parser *P, bool with_condexpr);
static struct jnode *parse_tuple(struct parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                                 bool explicit_parens, bool with_namespace);
static struct jnode *parse_primary(struct parser *P, bool with_namespace);
static struct jnode *parse_postfix(struct parser *P, struct jnode *n);
static struct jnode *parse_filter_expr(struct parser *P, struct jnode *n);
static struct jnode *parse_unary(struct parser *P, bool with_filter);

static struct jnode *parse_condexpr(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct jnode *e1 = parse_expression(P, false);
    uint32_t chain = 0;
    while (skip_name(P, "if")) {
        enter(P);
        chain++;
        struct jnode *e2 = parse_expression(P, false);
        struct jnode *e3 = NULL;
        if (skip_name(P, "else")) {
            enter(P);
            e3 = parse_condexpr(P);
            leave(P);
        }
        struct jnode *c = node(P, JN_COND, line);
        c->a = e2;
        c->b = e1;
        c->c = e3;
        e1 = c;
        line = cur(P)->line;
    }
    P->nest -= chain;
    return e1;
}

static struct jnode *parse_not(struct parser *P);

static struct jnode *parse_and(struct parser *P)
{
    struct jnode *left = parse_not(P);
    uint32_t chain = 0;
    while (is_name(P, "and")) {
        uint32_t line = next(P)->line;
        enter(P);
        chain++;
        struct jnode *n = node(P, JN_AND, line);
        n->a = left;
        n->b = parse_not(P);
        left = n;
    }
    P->nest -= chain;
    return left;
}

static struct jnode *parse_or(struct parser *P)
{
    struct jnode *left = parse_and(P);
    uint32_t chain = 0;
    while (is_name(P, "or")) {
        uint32_t line = next(P)->line;
        enter(P);
        chain++;
        struct jnode *n = node(P, JN_OR, line);
        n->a = left;
        n->b = parse_and(P);
        left = n;
    }
    P->nest -= chain;
    return left;
}

static struct jnode *parse_math1(struct parser *P);

static struct jnode *parse_compare(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct jnode *first = parse_math1(P);
    struct vec ops = {0};
    struct uvec kinds = {0};
    for (;;) {
        const struct jtok *k = cur(P);
        int op = -1;
        if (tok_is_op(k, "==")) op = JO_EQ;
        else if (tok_is_op(k, "!=")) op = JO_NE;
        else if (tok_is_op(k, "<")) op = JO_LT;
        else if (tok_is_op(k, "<=")) op = JO_LE;
        else if (tok_is_op(k, ">")) op = JO_GT;
        else if (tok_is_op(k, ">=")) op = JO_GE;
        else if (tok_is_name(k, "in")) op = JO_IN;
        else if (tok_is_name(k, "not") && tok_is_name(peek(P), "in")) {
            next(P);
            op = JO_NOTIN;
        }
        if (op < 0) break;
        next(P);
        upush(P, &kinds, (uint32_t)op);
        vpush(P, &ops, parse_math1(P));
    }
    if (!ops.n) return first;
    struct jnode *n = node(P, JN_CMP, line);
    n->a = first;
    n->kid = ops.v;
    n->nkid = ops.n;
    n->kwsym = kinds.v;
    n->nkv = kinds.n;
    return n;
}

static struct jnode *parse_not(struct parser *P)
{
    if (is_name(P, "not")) {
        uint32_t line = next(P)->line;
        enter(P);
        struct jnode *n = node(P, JN_NOT, line);
        n->a = parse_not(P);
        leave(P);
        return n;
    }
    return parse_compare(P);
}

static struct jnode *binop(struct parser *P, enum jop op, struct jnode *a, struct jnode *b, uint32_t line)
{
    struct jnode *n = node(P, JN_BIN, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static struct jnode *parse_pow(struct parser *P)
{
    struct jnode *left = parse_unary(P, true);
    uint32_t chain = 0;
    while (is_op(P, "**")) {
        uint32_t line = next(P)->line;
        enter(P);
        chain++;
        left = binop(P, JO_POW, left, parse_unary(P, true), line);
    }
    P->nest -= chain;
    return left;
}

static struct jnode *parse_math2(struct parser *P)
{
    struct jnode *left = parse_pow(P);
    uint32_t chain = 0;
    for (;;) {
        int op = is_op(P, "*")    ? JO_MUL
                 : is_op(P, "/")  ? JO_DIV
                 : is_op(P, "//") ? JO_FLOORDIV
                 : is_op(P, "%")  ? JO_MOD
                                  : -1;
        if (op < 0) break;
        uint32_t line = next(P)->line;
        enter(P);
        chain++;
        left = binop(P, (enum jop)op, left, parse_pow(P), line);
    }
    P->nest -= chain;
    return left;
}

static struct jnode *parse_concat(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct jnode *first = parse_math2(P);
    if (!is_op(P, "~")) return first;
    struct vec args = {0};
    vpush(P, &args, first);
    while (skip_op(P, "~")) vpush(P, &args, parse_math2(P));
    struct jnode *n = node(P, JN_CONCAT, line);
    n->kid = args.v;
    n->nkid = args.n;
    return n;
}

static struct jnode *parse_math1(struct parser *P)
{
    struct jnode *left = parse_concat(P);
    uint32_t chain = 0;
    for (;;) {
        int op = is_op(P, "+") ? JO_ADD : is_op(P, "-") ? JO_SUB : -1;
        if (op < 0) break;
        uint32_t line = next(P)->line;
        enter(P);
        chain++;
        left = binop(P, (enum jop)op, left, parse_concat(P), line);
    }
    P->nest -= chain;
    return left;
}

static struct jnode *parse_unary(struct parser *P, bool with_filter)
{
    const struct jtok *k = cur(P);
    struct jnode *n;
    enter(P);
    if (tok_is_op(k, "-") || tok_is_op(k, "+")) {
        next(P);
        n = node(P, tok_is_op(k, "-") ? JN_NEG : JN_POS, k->line);
        n->a = parse_unary(P, false);
    } else {
        n = parse_primary(P, false);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    leave(P);
    return n;
}

static struct jnode *parse_list(struct parser *P)
{
    uint32_t line = next(P)->line;
    struct vec items = {0};
    while (!is_op(P, "]")) {
        if (items.n) expect_op(P, ",");
        if (is_op(P, "]")) break;
        vpush(P, &items, parse_expression(P, true));
    }
    expect_op(P, "]");
    struct jnode *n = node(P, JN_LIST, line);
    n->kid = items.v;
    n->nkid = items.n;
    return n;
}

static struct jnode *parse_dict(struct parser *P)
{
    uint32_t line = next(P)->line;
    struct vec keys = {0}, vals = {0};
    while (!is_op(P, "}")) {
        if (keys.n) expect_op(P, ",");
        if (is_op(P, "}")) break;
        vpush(P, &keys, parse_expression(P, true));
        expect_op(P, ":");
        vpush(P, &vals, parse_expression(P, true));
    }
    expect_op(P, "}");
    struct jnode *n = node(P, JN_DICT, line);
    n->kid = keys.v;
    n->nkid = keys.n;
    n->kv = vals.v;
    n->nkv = vals.n;
    return n;
}

static struct jnode *parse_primary(struct parser *P, bool with_namespace)
{
    const struct jtok *k = cur(P);
    struct jnode *n;
    char buf[80];
    switch (k->type) {
    case JT_NAME:
        next(P);
        if (tok_is_name(k, "true") || tok_is_name(k, "True") || tok_is_name(k, "false") || tok_is_name(k, "False")) {
            n = node(P, JN_CONST, k->line);
            n->cv = jv_bool(tok_is_name(k, "true") || tok_is_name(k, "True"));
        } else if (tok_is_name(k, "none") || tok_is_name(k, "None")) {
            n = node(P, JN_CONST, k->line);
            n->cv = jv_none();
        } else if (with_namespace && is_op(P, ".")) {
            next(P);
            const struct jtok *attr = expect_name(P);
            n = node(P, JN_NSREF, k->line);
            n->sym = sym_of(P, k);
            n->sym2 = sym_of(P, attr);
        } else {
            n = node(P, JN_NAME, k->line);
            n->sym = sym_of(P, k);
        }
        return n;
    case JT_STRING: {
        next(P);
        n = node(P, JN_CONST, k->line);
        if (cur(P)->type != JT_STRING) {
            struct jstr *s = ja_alloc(&P->t->ar, sizeof *s);
            s->s = k->s;
            s->len = (uint32_t)k->n;
            n->cv = jv_str(s);
            return n;
        }
        struct jsb b;
        jsb_init(&b, &P->t->ar);
        jsb_put(&b, k->s, k->n, false);
        while (cur(P)->type == JT_STRING) {
            jsb_put(&b, cur(P)->s, cur(P)->n, false);
            next(P);
        }
        n->cv = jv_str(jsb_finish(&b));
        return n;
    }
    case JT_INT:
    case JT_FLOAT:
        next(P);
        n = node(P, JN_CONST, k->line);
        n->cv = k->type == JT_INT ? jv_int(k->i) : jv_float(k->f);
        return n;
    case JT_OP:
        if (tok_is_op(k, "(")) {
            next(P);
            enter(P);
            n = parse_tuple(P, false, true, NULL, true, false);
            leave(P);
            expect_op(P, ")");
            return n;
        }
        if (tok_is_op(k, "[")) {
            enter(P);
            n = parse_list(P);
            leave(P);
            return n;
        }
        if (tok_is_op(k, "{")) {
            enter(P);
            n = parse_dict(P);
            leave(P);
            return n;
        }
        break;
    default: break;
    }
    pfail(P, "unexpected '%s'", describe(P, k, buf, sizeof buf));
}

static bool is_tuple_end(struct parser *P, const char *extra_end)
{
    const struct jtok *k = cur(P);
    if (k->type == JT_VAR_END || k->type == JT_BLOCK_END || tok_is_op(k, ")")) return true;
    return extra_end && tok_is_name(k, extra_end);
}

static struct jnode *parse_tuple(struct parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                                 bool explicit_parens, bool with_namespace)
{
    uint32_t line = cur(P)->line;
    struct vec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n) expect_op(P, ",");
        if (is_tuple_end(P, extra_end)) break;
        vpush(P, &args, simplified ? parse_primary(P, with_namespace) : parse_expression(P, with_condexpr));
        if (is_op(P, ",")) is_tuple = true;
        else break;
        line = cur(P)->line;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char buf[80];
            pfail(P, "expected an expression, got '%s'", describe(P, cur(P), buf, sizeof buf));
        }
    }
    struct jnode *n = node(P, JN_TUPLE, line);
    n->kid = args.v;
    n->nkid = args.n;
    return n;
}

static struct jnode *parse_expression(struct parser *P, bool with_condexpr)
{
    enter(P);
    struct jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return n;
}

/* Call arguments into n (kid[], kwsym[]/kv[], c = *args, d = **kwargs). */
static void parse_call_args(struct parser *P, struct jnode *n)
{
    expect_op(P, "(");
    struct vec args = {0}, kwv = {0};
    struct uvec kws = {0};
    bool require_comma = false;
    while (!is_op(P, ")")) {
        if (require_comma) {
            expect_op(P, ",");
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*")) {
            if (n->c || n->d) pfail(P, "invalid syntax for function call expression%s", "");
            next(P);
            n->c = parse_expression(P, true);
        } else if (is_op(P, "**")) {
            if (n->d) pfail(P, "invalid syntax for function call expression%s", "");
            next(P);
            n->d = parse_expression(P, true);
        } else if (cur(P)->type == JT_NAME && tok_is_op(peek(P), "=")) {
            if (n->d) pfail(P, "invalid syntax for function call expression%s", "");
            const struct jtok *k = next(P);
            next(P);
            upush(P, &kws, sym_of(P, k));
            vpush(P, &kwv, parse_expression(P, true));
        } else {
            if (n->c || n->d || kws.n) pfail(P, "invalid syntax for function call expression%s", "");
            vpush(P, &args, parse_expression(P, true));
        }
        require_comma = true;
    }
    expect_op(P, ")");
    n->kid = args.v;
    n->nkid = args.n;
    n->kwsym = kws.v;
    n->kv = kwv.v;
    n->nkv = kws.n;
}

static struct jnode *parse_call(struct parser *P, struct jnode *callee)
{
    struct jnode *n = node(P, JN_CALL, cur(P)->line);
    n->a = callee;
    enter(P);
    parse_call_args(P, n);
    leave(P);
    return n;
}

/* A dotted filter or test name. */
static void dotted_name(struct parser *P, char *buf, size_t cap, uint32_t *sym)
{
    const struct jtok *k = expect_name(P);
    struct jsb b;
    jsb_init(&b, &P->t->ar);
    jsb_put(&b, k->s, k->n, false);
    while (is_op(P, ".")) {
        next(P);
        const struct jtok *part = expect_name(P);
        jsb_putc(&b, '.');
        jsb_put(&b, part->s, part->n, false);
    }
    const struct jstr *s = jsb_finish(&b);
    snprintf(buf, cap, "%.*s", (int)s->len, s->s);
    *sym = jsym_intern(P->t, s->s, s->len);
}

static struct jnode *parse_filter(struct parser *P, struct jnode *in, bool start_inline)
{
    uint32_t chain = 0;
    while (is_op(P, "|") || start_inline) {
        enter(P);
        chain++;
        if (!start_inline) next(P);
        uint32_t line = cur(P)->line;
        struct jnode *n = node(P, JN_FILTER, line);
        char name[128];
        dotted_name(P, name, sizeof name, &n->sym);
        n->fid = jfilter_find(P->t->syms[n->sym].s, P->t->syms[n->sym].n);
        if (n->fid < 0) n->flags |= JF_UNKNOWN;
        n->a = in;
        if (is_op(P, "(")) {
            enter(P);
            parse_call_args(P, n);
            leave(P);
        }
        in = n;
        start_inline = false;
    }
    P->nest -= chain;
    return in;
}

static struct jnode *parse_test(struct parser *P, struct jnode *in)
{
    uint32_t line = next(P)->line; /* "is" */
    bool negated = skip_name(P, "not");
    struct jnode *n = node(P, JN_TEST, line);
    char name[128];
    dotted_name(P, name, sizeof name, &n->sym);
    n->fid = jtest_find(P->t->syms[n->sym].s, P->t->syms[n->sym].n);
    if (n->fid < 0) n->flags |= JF_UNKNOWN;
    n->a = in;
    const struct jtok *k = cur(P);
    if (tok_is_op(k, "(")) {
        enter(P);
        parse_call_args(P, n);
        leave(P);
    } else if ((k->type == JT_NAME || k->type == JT_STRING || k->type == JT_INT || k->type == JT_FLOAT ||
                tok_is_op(k, "(") || tok_is_op(k, "[") || tok_is_op(k, "{")) &&
               !tok_is_name(k, "else") && !tok_is_name(k, "or") && !tok_is_name(k, "and")) {
        if (tok_is_name(k, "is")) pfail(P, "you cannot chain multiple tests with is%s", "");
        enter(P);
        struct jnode *arg = parse_postfix(P, parse_primary(P, false));
        leave(P);
        n->kid = ja_alloc(&P->t->ar, sizeof *n->kid);
        n->kid[0] = arg;
        n->nkid = 1;
    }
    if (!negated) return n;
    struct jnode *no = node(P, JN_NOT, line);
    no->a = n;
    return no;
}

/* [a], [a:b:c], [a, b] after the object */
static struct jnode *parse_subscribed(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct jnode *parts[3] = {NULL, NULL, NULL};
    if (is_op(P, ":")) {
        next(P);
    } else {
        struct jnode *e = parse_expression(P, true);
        if (!is_op(P, ":")) return e;
        next(P);
        parts[0] = e;
    }
    if (!is_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) parts[1] = parse_expression(P, true);
    if (is_op(P, ":")) {
        next(P);
        if (!is_op(P, "]") && !is_op(P, ",")) parts[2] = parse_expression(P, true);
    }
    struct jnode *n = node(P, JN_SLICE, line);
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    return n;
}

static struct jnode *parse_subscript(struct parser *P, struct jnode *obj)
{
    const struct jtok *k = next(P);
    if (tok_is_op(k, ".")) {
        const struct jtok *a = next(P);
        if (a->type == JT_NAME) {
            struct jnode *n = node(P, JN_GETATTR, k->line);
            n->a = obj;
            n->sym = sym_of(P, a);
            return n;
        }
        if (a->type != JT_INT) pfail(P, "expected name or number%s", "");
        struct jnode *c = node(P, JN_CONST, a->line);
        c->cv = jv_int(a->i);
        struct jnode *n = node(P, JN_GETITEM, k->line);
        n->a = obj;
        n->b = c;
        return n;
    }
    /* "[" */
    enter(P);
    struct vec args = {0};
    while (!is_op(P, "]")) {
        if (args.n) expect_op(P, ",");
        vpush(P, &args, parse_subscribed(P));
    }
    expect_op(P, "]");
    leave(P);
    struct jnode *n = node(P, JN_GETITEM, k->line);
    n->a = obj;
    if (args.n == 1) {
        n->b = args.v[0];
    } else {
        struct jnode *t = node(P, JN_TUPLE, k->line);
        t->kid = args.v;
        t->nkid = args.n;
        n->b = t;
    }
    return n;
}

/* Each link of a chain (a.b.c, x|f|g, a + b + c …) deepens the tree: the
 * chains count against the nesting bound like brackets do. */
static struct jnode *parse_postfix(struct parser *P, struct jnode *n)
{
    uint32_t chain = 0;
    for (;;) {
        if (!is_op(P, ".") && !is_op(P, "[") && !is_op(P, "(")) break;
        enter(P);
        chain++;
        if (is_op(P, "(")) n = parse_call(P, n);
        else n = parse_subscript(P, n);
    }
    P->nest -= chain;
    return n;
}

static struct jnode *parse_filter_expr(struct parser *P, struct jnode *n)
{
    uint32_t chain = 0;
    for (;;) {
        if (!is_op(P, "|") && !is_name(P, "is") && !is_op(P, "(")) break;
        enter(P);
        chain++;
        if (is_op(P, "|")) n = parse_filter(P, n, false);
        else if (is_name(P, "is")) n = parse_test(P, n);
        else n = parse_call(P, n);
    }
    P->nest -= chain;
    return n;
}

/* ---- statements ------------------------------------------------------------------- */

static struct jnode *subparse(struct parser *P, const char *const *end_tokens);

static bool at_end_token(struct parser *P, const char *const *end_tokens)
{
    for (const char *const *e = end_tokens; e && *e; e++)
        if (is_name(P, *e)) return true;
    return false;
}

static struct jnode *parse_statements(struct parser *P, const char *const *end_tokens, bool drop_needle)
{
    skip_op(P, ":");
    expect_type(P, JT_BLOCK_END, "end of statement block");
    struct jnode *body = subparse(P, end_tokens);
    if (cur(P)->type == JT_EOF) {
        char msg[160];
        snprintf(msg, sizeof msg, "unexpected end of template; jinja was looking for '%s'", end_tokens[0]);
        pfail(P, "%s", msg);
    }
    if (drop_needle) next(P);
    return body;
}

static bool can_assign(const struct jnode *n)
{
    if (n->kind == JN_NAME || n->kind == JN_NSREF) return true;
    if (n->kind != JN_TUPLE) return false;
    for (uint32_t i = 0; i < n->nkid; i++)
        if (!can_assign(n->kid[i])) return false;
    return true;
}

static struct jnode *parse_assign_target(struct parser *P, bool name_only, const char *extra_end, bool with_ns)
{
    struct jnode *t;
    if (name_only) {
        const struct jtok *k = expect_name(P);
        t = node(P, JN_NAME, k->line);
        t->sym = sym_of(P, k);
        return t;
    }
    t = parse_tuple(P, true, true, extra_end, false, with_ns);
    if (!can_assign(t)) pfail(P, "can't assign to %s", t->kind == JN_CONST ? "'const'" : "that");
    /* the names true, false, none … parse as constants and are refused above */
    return t;
}

static void parse_signature(struct parser *P, struct jnode *n)
{
    struct vec args = {0}, defs = {0};
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (args.n) expect_op(P, ",");
        vpush(P, &args, parse_assign_target(P, true, NULL, false));
        if (skip_op(P, "=")) vpush(P, &defs, parse_expression(P, true));
        else if (defs.n) pfail(P, "non-default argument follows default argument%s", "");
    }
    expect_op(P, ")");
    n->kid = args.v;
    n->nkid = args.n;
    n->kv = defs.v;
    n->nkv = defs.n;
}

/* Whether the body names sym (caller, varargs, kwargs: what a macro takes
 * only when its body uses it). */
static bool names_sym(const struct jnode *n, uint32_t sym, uint32_t depth)
{
    if (!n || depth > 10000) return false;
    if (n->kind == JN_NAME && n->sym == sym) return true;
    if (names_sym(n->a, sym, depth + 1) || names_sym(n->b, sym, depth + 1) || names_sym(n->c, sym, depth + 1) ||
        names_sym(n->d, sym, depth + 1) || names_sym(n->e, sym, depth + 1))
        return true;
    for (uint32_t i = 0; i < n->nkid; i++)
        if (names_sym(n->kid[i], sym, depth + 1)) return true;
    if (n->kv && n->kind != JN_CMP)
        for (uint32_t i = 0; i < n->nkv; i++)
            if (names_sym(n->kv[i], sym, depth + 1)) return true;
    return false;
}

static void mark_macro_uses(struct parser *P, struct jnode *n)
{
    const uint32_t *w = P->t->well;
    if (names_sym(n->c, w[JW_CALLER], 0)) n->flags |= JF_USES_CALLER;
    if (names_sym(n->c, w[JW_VARARGS], 0)) n->flags |= JF_USES_VARARGS;
    if (names_sym(n->c, w[JW_KWARGS], 0)) n->flags |= JF_USES_KWARGS;
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR_ONLY[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF_ONLY[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};

static struct jnode *parse_for(struct parser *P, uint32_t line)
{
    struct jnode *n = node(P, JN_FOR, line);
    n->a = parse_assign_target(P, false, "in", false);
    if (!skip_name(P, "in")) unexpected(P, "in");
    n->b = parse_tuple(P, false, false, "recursive", false, false);
    if (skip_name(P, "if")) n->e = parse_expression(P, true);
    if (is_name(P, "recursive")) pfail(P, "recursive for loops are not supported%s", "");
    P->loops++;
    n->c = parse_statements(P, END_FOR, false);
    P->loops--;
    if (tok_is_name(next(P), "else")) n->d = parse_statements(P, END_FOR_ONLY, true);
    return n;
}

static struct jnode *parse_if(struct parser *P, uint32_t line)
{
    struct jnode *top = node(P, JN_IF, line), *n = top;
    const uint32_t nest = P->nest;
    for (;;) {
        n->a = parse_tuple(P, false, false, NULL, false, false);
        n->b = parse_statements(P, END_IF, false);
        const struct jtok *k = next(P);
        if (tok_is_name(k, "elif")) {
            enter(P); /* an elif is an if inside the else */
            struct jnode *e = node(P, JN_IF, k->line);
            n->c = e;
            n = e;
            continue;
        }
        if (tok_is_name(k, "else")) n->c = parse_statements(P, END_IF_ONLY, true);
        P->nest = nest;
        return top;
    }
}

static struct jnode *parse_statement(struct parser *P)
{
    const struct jtok *k = cur(P);
    char buf[80];
    if (k->type != JT_NAME) pfail(P, "tag name expected, got '%s'", describe(P, k, buf, sizeof buf));
    const uint32_t line = k->line;
    if (tok_is_name(k, "for")) {
        next(P);
        return parse_for(P, line);
    }
    if (tok_is_name(k, "if")) {
        next(P);
        return parse_if(P, line);
    }
    if (tok_is_name(k, "set")) {
        next(P);
        struct jnode *target = parse_assign_target(P, false, NULL, true);
        if (skip_op(P, "=")) {
            struct jnode *n = node(P, JN_SET, line);
            n->a = target;
            n->b = parse_tuple(P, false, true, NULL, false, false);
            return n;
        }
        struct jnode *n = node(P, JN_SETBLK, line);
        n->a = target;
        n->b = parse_filter(P, NULL, false);
        const uint32_t loops = P->loops;
        n->c = parse_statements(P, END_SET, true);
        P->loops = loops;
        return n;
    }
    if (tok_is_name(k, "macro")) {
        next(P);
        struct jnode *n = node(P, JN_MACRO, line);
        n->sym = parse_assign_target(P, true, NULL, false)->sym;
        parse_signature(P, n);
        const uint32_t loops = P->loops;
        P->loops = 0;
        n->c = parse_statements(P, END_MACRO, true);
        P->loops = loops;
        mark_macro_uses(P, n);
        return n;
    }
    if (tok_is_name(k, "call")) {
        next(P);
        struct jnode *n = node(P, JN_CALLBLK, line);
        if (is_op(P, "(")) parse_signature(P, n);
        n->a = parse_expression(P, true);
        if (n->a->kind != JN_CALL) pfail(P, "expected call%s", "");
        const uint32_t loops = P->loops;
        P->loops = 0;
        n->c = parse_statements(P, END_CALL, true);
        P->loops = loops;
        mark_macro_uses(P, n);
        return n;
    }
    if (tok_is_name(k, "filter")) {
        next(P);
        struct jnode *n = node(P, JN_FILTBLK, line);
        n->a = parse_filter(P, NULL, true);
        n->c = parse_statements(P, END_FILTER, true);
        return n;
    }
    if (tok_is_name(k, "with")) {
        next(P);
        struct jnode *n = node(P, JN_WITH, line);
        struct vec targets = {0}, values = {0};
        while (cur(P)->type != JT_BLOCK_END) {
            if (targets.n) expect_op(P, ",");
            vpush(P, &targets, parse_assign_target(P, false, NULL, false));
            expect_op(P, "=");
            vpush(P, &values, parse_expression(P, true));
        }
        n->kid = targets.v;
        n->nkid = targets.n;
        n->kv = values.v;
        n->nkv = values.n;
        n->c = parse_statements(P, END_WITH, true);
        return n;
    }
    if (tok_is_name(k, "print")) {
        next(P);
        struct vec items = {0};
        while (cur(P)->type != JT_BLOCK_END) {
            if (items.n) expect_op(P, ",");
            struct jnode *p = node(P, JN_PRINT, line);
            p->a = parse_expression(P, true);
            vpush(P, &items, p);
        }
        struct jnode *n = node(P, JN_BODY, line);
        n->kid = items.v;
        n->nkid = items.n;
        return n;
    }
    if (tok_is_name(k, "break") || tok_is_name(k, "continue")) {
        next(P);
        if (!P->loops) pfail(P, "'%s' outside of a loop", tok_is_name(k, "break") ? "break" : "continue");
        return node(P, tok_is_name(k, "break") ? JN_BREAK : JN_CONTINUE, line);
    }
    if (tok_is_name(k, "generation")) {
        next(P);
        struct jnode *n = node(P, JN_SCOPE, line);
        const uint32_t loops = P->loops;
        P->loops = 0;
        n->c = parse_statements(P, END_GEN, true);
        P->loops = loops;
        return n;
    }
    static const char *const k_unsupported[] = {"extends", "include", "import", "from", "block", "autoescape"};
    for (size_t i = 0; i < sizeof k_unsupported / sizeof k_unsupported[0]; i++)
        if (tok_is_name(k, k_unsupported[i]))
            pfail(P, "the '%s' tag is not supported (a chat template is one text)", k_unsupported[i]);
    snprintf(buf, sizeof buf, "%.*s", (int)(k->n < 64 ? k->n : 64), k->s);
    pfail(P, "encountered unknown tag '%s'", buf);
}

static struct jnode *subparse(struct parser *P, const char *const *end_tokens)
{
    enter(P);
    struct vec body = {0};
    uint32_t line = cur(P)->line;
    for (;;) {
        const struct jtok *k = cur(P);
        if (k->type == JT_EOF) break;
        if (k->type == JT_DATA) {
            struct jnode *n = node(P, JN_TEXT, k->line);
            struct jstr *s = ja_alloc(&P->t->ar, sizeof *s);
            s->s = k->s;
            s->len = (uint32_t)k->n;
            n->cv = jv_str(s);
            vpush(P, &body, n);
            next(P);
        } else if (k->type == JT_VAR_BEGIN) {
            next(P);
            struct jnode *n = node(P, JN_PRINT, k->line);
            n->a = parse_tuple(P, false, true, NULL, false, false);
            expect_type(P, JT_VAR_END, "end of print statement");
            vpush(P, &body, n);
        } else if (k->type == JT_BLOCK_BEGIN) {
            next(P);
            if (at_end_token(P, end_tokens)) break;
            vpush(P, &body, parse_statement(P));
            expect_type(P, JT_BLOCK_END, "end of statement block");
        } else {
            char buf[80];
            pfail(P, "unexpected '%s'", describe(P, k, buf, sizeof buf));
        }
    }
    leave(P);
    struct jnode *n = node(P, JN_BODY, line);
    n->kid = body.v;
    n->nkid = body.n;
    return n;
}

/* Unknown filters and tests: jinja2 refuses them when it compiles, except
 * inside an if statement or a conditional expression ("soft" frames, which
 * end where a loop, macro, call, filter or set block begins its own), where
 * they fail only when they run. */
static void check_unknown(struct parser *P, const struct jnode *n, bool soft, uint32_t depth)
{
    if (!n || depth > 100000) return;
    if ((n->kind == JN_FILTER || n->kind == JN_TEST) && (n->flags & JF_UNKNOWN) && !soft) {
        P->t->f.line = n->line;
        jfail(&P->t->f, KVB_ERR_FORMAT, "no %s named '%s'", n->kind == JN_FILTER ? "filter" : "test",
              P->t->syms[n->sym].s);
    }
    bool s_a = soft, s_b = soft, s_c = soft, s_d = soft, s_e = soft, s_kid = soft, s_kv = soft;
    switch (n->kind) {
    case JN_IF:
    case JN_COND: s_a = s_b = s_c = true; break;
    case JN_FOR: s_c = s_d = s_e = false; break;
    case JN_MACRO:
    case JN_CALLBLK: s_c = s_kid = s_kv = false; break;
    case JN_FILTBLK:
    case JN_SETBLK: s_b = s_c = s_a = false; break;
    case JN_WITH:
    case JN_SCOPE: s_c = false; break;
    default: break;
    }
    check_unknown(P, n->a, s_a, depth + 1);
    check_unknown(P, n->b, s_b, depth + 1);
    check_unknown(P, n->c, s_c, depth + 1);
    check_unknown(P, n->d, s_d, depth + 1);
    check_unknown(P, n->e, s_e, depth + 1);
    for (uint32_t i = 0; i < n->nkid; i++) check_unknown(P, n->kid[i], s_kid, depth + 1);
    if (n->kind != JN_CMP)
        for (uint32_t i = 0; i < n->nkv; i++) check_unknown(P, n->kv[i], s_kv, depth + 1);
}

void jparse(struct jinja_template *t, const struct jtoks *toks)
{
    struct parser P = {.t = t, .tok = toks->v, .n = toks->n};
    static const char *const well[JW_COUNT_] = {
        [JW_LOOP] = "loop", [JW_CALLER] = "caller", [JW_VARARGS] = "varargs", [JW_KWARGS] = "kwargs"};
    for (int w = 0; w < JW_COUNT_; w++) t->well[w] = jsym_intern(t, well[w], strlen(well[w]));
    t->root = subparse(&P, NULL);
    if (cur(&P)->type != JT_EOF) {
        char buf[80];
        pfail(&P, "unexpected '%s'", describe(&P, cur(&P), buf, sizeof buf));
    }
    check_unknown(&P, t->root, false, 0);
    t->f.line = 0;
}
