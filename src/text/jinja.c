/* jinja.c — the Jinja interpreter's entry points (see jinja.h): compile a
 * template (normalise newlines, tokenize, parse), render it (variables from
 * the caller, output with its user-text spans), and the bounds. A failure
 * anywhere inside unwinds here (jfail's longjmp) and frees the arena. */
#include "text/jinja.h"

#include <string.h>

#include "base/alloc.h"
#include "text/jinja_internal.h"

void jinja_limits_default(struct jinja_limits *lim)
{
    lim->max_source = 256 * 1024;
    lim->max_nest = 200;
    lim->max_output = 16u << 20;
    lim->max_memory = 256u << 20;
    lim->max_steps = 10 * 1000 * 1000;
    lim->max_depth = 1000;
}

enum kvb_status jinja_compile(const char *src, size_t len, const char *name, const struct jinja_limits *lim,
                              struct jinja_template **out, struct kvb_err *err)
{
    *out = NULL;
    struct jinja_limits L;
    if (lim) L = *lim;
    else jinja_limits_default(&L);
    if (!name) return jinja_compile(src, len, "(template)", lim, out, err);
    if (!src && len) return kvb_errf(err, KVB_ERR_INVALID_ARG, "template %s: no text", name);
    if (len > L.max_source)
        return kvb_errf(err, KVB_ERR_RANGE, "template %s: %zu bytes, more than the %zu a template may have", name, len,
                        L.max_source);
    struct jinja_template *t = kvb_calloc(1, sizeof *t);
    if (!t) return kvb_errf(err, KVB_ERR_NOMEM, "template %s: out of memory", name);
    t->lim = L;
    t->f.err = err;
    t->f.name = name;
    t->ar.f = &t->f;
    t->ar.limit = (64u << 20) + 64 * len;
    int code = setjmp(t->f.jb);
    if (code) {
        ja_free_all(&t->ar);
        kvb_free(t);
        return (enum kvb_status)code;
    }
    t->name = ja_strndup(&t->ar, t->f.name, strlen(t->f.name));
    t->f.name = t->name;
    /* jinja2 reads "\r\n" and "\r" as "\n" and drops one trailing newline */
    char *s = ja_alloc(&t->ar, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = '\0';
    t->src = s;
    t->src_len = n;
    struct jtoks toks = {0};
    jlex(t, &toks);
    jparse(t, &toks);
    t->symstr = ja_alloc(&t->ar, (t->nsym + 1) * sizeof *t->symstr);
    for (uint32_t i = 0; i < t->nsym; i++) {
        struct jstr *y = ja_alloc(&t->ar, sizeof *y);
        y->s = t->syms[i].s;
        y->len = (uint32_t)t->syms[i].n;
        t->symstr[i] = y;
    }
    t->f.err = NULL;
    *out = t;
    return KVB_OK;
}

void jinja_free(struct jinja_template *t)
{
    if (!t) return;
    ja_free_all(&t->ar);
    kvb_free(t);
}

bool jinja_source_contains(const struct jinja_template *t, const char *s)
{
    return t && memmem(t->src, t->src_len, s, strlen(s)) != NULL;
}

static void set_var(struct jrt *rt, const char *name, size_t n, struct jv v)
{
    int64_t sym = jsym_find(rt->t, name, n);
    if (sym >= 0) rt->ctx[sym] = v; /* a name the template never uses cannot matter */
}

enum kvb_status jinja_render(const struct jinja_template *t, const struct jinja_input *in,
                             const struct jinja_limits *lim, struct jinja_output *out, struct kvb_err *err)
{
    memset(out, 0, sizeof *out);
    if (!t) return kvb_errf(err, KVB_ERR_INVALID_ARG, "jinja_render: no template");
    struct jinja_limits L = lim ? *lim : t->lim;
    if (in) { /* the bounds grow with the input (jinja.h) */
        size_t bytes = in->user_json_len;
        for (size_t i = 0; i < in->n_msgs; i++) bytes += in->msgs[i].content_len;
        L.max_output += 2 * bytes;
        L.max_memory += 4 * bytes;
        L.max_steps += bytes;
    }
    struct jrt *rt = kvb_calloc(1, sizeof *rt);
    if (!rt) return kvb_errf(err, KVB_ERR_NOMEM, "template %s: out of memory", t->name);
    rt->t = t;
    rt->lim = &L;
    rt->f.err = err;
    rt->f.name = t->name;
    rt->ar.f = &rt->f;
    rt->ar.limit = L.max_memory;
    rt->ar.steps = &rt->steps;
    rt->ar.max_steps = L.max_steps;
    int code = setjmp(rt->f.jb);
    if (code) {
        if (rt->json) json_free(rt->json);
        kvb_free(rt->out_heap);
        ja_free_all(&rt->ar);
        kvb_free(rt);
        return (enum kvb_status)code;
    }
    rt->ctx = ja_alloc(&rt->ar, (t->nsym + 1) * sizeof *rt->ctx);
    if (in) {
        for (size_t i = 0; i < in->n_strs; i++)
            if (in->strs[i].name && in->strs[i].value)
                set_var(rt, in->strs[i].name, strlen(in->strs[i].name),
                        jv_str(jstr_new(&rt->ar, in->strs[i].value, strlen(in->strs[i].value), false)));
        if (in->msgs) {
            struct jlist *l = jlist_new(rt, in->n_msgs);
            for (size_t i = 0; i < in->n_msgs; i++) {
                const struct jinja_msg *m = &in->msgs[i];
                if (m->content_len > UINT32_MAX / 2)
                    jfail(&rt->f, KVB_ERR_RANGE, "a message of %zu bytes is too long", m->content_len);
                struct jdict *d = jdict_new(rt, 2);
                jdict_set(rt, d, jv_str(jstr_lit(&rt->ar, "role")),
                          jv_str(jstr_new(&rt->ar, m->role, strlen(m->role), true)));
                struct jstr *c = ja_alloc(&rt->ar, sizeof *c); /* the caller's bytes, in place */
                c->s = m->content;
                c->len = (uint32_t)m->content_len;
                if (m->content_len) {
                    struct jsp *sp = ja_alloc(&rt->ar, sizeof *sp);
                    sp->b = (uint32_t)m->content_len;
                    c->sp = sp;
                    c->nsp = 1;
                }
                jdict_set(rt, d, jv_str(jstr_lit(&rt->ar, "content")), jv_str(c));
                l->v[i] = jv_dict(d, JD_DICT);
            }
            set_var(rt, "messages", 8, jv_list(l, JL_LIST));
        }
        if (in->user_json) {
            struct jv vars = jv_from_json(rt, in->user_json, in->user_json_len, true, "the template's variables");
            if (vars.k != JK_DICT) jfail(&rt->f, KVB_ERR_INVALID_ARG, "the template's variables are not a JSON object");
            for (size_t i = 0; i < vars.u.d->n; i++)
                set_var(rt, vars.u.d->k[i].u.s->s, vars.u.d->k[i].u.s->len, vars.u.d->v[i]);
        }
        rt->now = in->now;
    }
    /* the output grows on the heap (realloc, not the arena's doubling
     * copies) and is handed over as it is */
    struct jsb b;
    jsb_init(&b, &rt->ar);
    b.limit = L.max_output;
    b.what = "the output";
    b.heap = &rt->out_heap;
    rt->out = &b;
    jexec_root(rt);
    rt->f.line = 0;
    if (!b.p) jsb_reserve(&b, 0); /* an empty output still gets a buffer for its NUL */
    struct jinja_span *sp = b.nsp ? kvb_calloc(b.nsp, sizeof *sp) : NULL;
    if (b.nsp && !sp) jfail(&rt->f, KVB_ERR_NOMEM, "out of memory");
    char *text = b.p;
    rt->out_heap = NULL;
    text[b.len] = '\0';
    for (size_t i = 0; i < b.nsp; i++) sp[i] = (struct jinja_span){b.sp[i].a, b.sp[i].b - b.sp[i].a};
    out->text = text;
    out->len = b.len;
    out->user = sp;
    out->n_user = b.nsp;
    ja_free_all(&rt->ar);
    kvb_free(rt);
    return KVB_OK;
}

void jinja_output_free(struct jinja_output *o)
{
    if (!o) return;
    kvb_free(o->text);
    kvb_free(o->user);
    memset(o, 0, sizeof *o);
}
