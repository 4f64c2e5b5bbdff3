/* grammar_regex.c — the regex parser and its nondeterministic automaton
 * (Thompson's construction); grammar_regex_dfa.c makes it deterministic and
 * writes the GBNF. See grammar_regex.h for the subset; whatever is outside
 * it is refused by name here, so a constraint is never weakened. */
#include "engine/grammar_regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "engine/grammar_regex_int.h"

#define MAX_NEST 100   /* groups inside groups */
#define MAX_AST 100000 /* nodes of the parsed regex */

int gr_fail(struct gr_err *e, const char *fmt, ...)
{
    if (e->msg && e->cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, e->cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

bool gr_put(struct kvb_buf *out, const char *s, size_t n)
{
    if (kvb_buf_reserve(out, n + 1) != KVB_OK) return false;
    memcpy(out->data + out->len, s, n);
    out->len += n;
    out->data[out->len] = '\0';
    return true;
}

bool gr_puts(struct kvb_buf *out, const char *s) { return gr_put(out, s, strlen(s)); }

bool gr_put_cp(struct kvb_buf *out, uint32_t cp)
{
    char t[16];
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) {
        t[0] = (char)cp;
        t[1] = '\0';
    } else if (cp <= 0xFF) {
        snprintf(t, sizeof t, "\\x%02X", cp);
    } else if (cp <= 0xFFFF) {
        snprintf(t, sizeof t, "\\u%04X", cp);
    } else {
        snprintf(t, sizeof t, "\\U%08X", cp);
    }
    return gr_puts(out, t);
}

static bool grow(void **p, int64_t need, int64_t cap, size_t elem, int64_t *new_cap)
{
    *new_cap = cap;
    if (need <= cap) return true;
    int64_t c = cap ? cap : 64;
    while (c < need) c *= 2;
    void *q = kvb_realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *new_cap = c;
    return true;
}

/* ---- interval sets ------------------------------------------------------------------ */

struct ivlist {
    struct gr_iv *v;
    int64_t n, cap;
};

static bool iv_add(struct ivlist *l, uint32_t lo, uint32_t hi)
{
    if (!grow((void **)&l->v, l->n + 1, l->cap, sizeof *l->v, &l->cap)) return false;
    l->v[l->n++] = (struct gr_iv){lo, hi};
    return true;
}

static int iv_cmp(const void *a, const void *b)
{
    const struct gr_iv *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorted, merged, surrogates taken out (they are not characters UTF-8 can write). */
static bool iv_normalize(struct ivlist *l)
{
    struct ivlist t = {0};
    for (int64_t i = 0; i < l->n; i++) {
        const struct gr_iv v = l->v[i];
        if (v.lo > v.hi) continue;
        if (v.lo < 0xD800 && !iv_add(&t, v.lo, v.hi < 0xD800 ? v.hi : 0xD7FF)) goto oom;
        if (v.hi > 0xDFFF && !iv_add(&t, v.lo > 0xE000 ? v.lo : 0xE000, v.hi)) goto oom;
    }
    if (t.n) qsort(t.v, (size_t)t.n, sizeof *t.v, iv_cmp);
    int64_t w = 0;
    for (int64_t i = 0; i < t.n; i++) {
        if (w && t.v[i].lo <= t.v[w - 1].hi + 1) {
            if (t.v[i].hi > t.v[w - 1].hi) t.v[w - 1].hi = t.v[i].hi;
        } else {
            t.v[w++] = t.v[i];
        }
    }
    t.n = w;
    kvb_free(l->v);
    *l = t;
    return true;
oom:
    kvb_free(t.v);
    return false;
}

/* l becomes its complement among all code points (l normalized). */
static bool iv_negate(struct ivlist *l)
{
    struct ivlist t = {0};
    uint32_t next = 0;
    for (int64_t i = 0; i < l->n; i++) {
        if (l->v[i].lo > next && !iv_add(&t, next, l->v[i].lo - 1)) goto oom;
        next = l->v[i].hi + 1;
    }
    if (next <= GR_MAX_CP && !iv_add(&t, next, GR_MAX_CP)) goto oom;
    kvb_free(l->v);
    *l = t;
    return iv_normalize(l);
oom:
    kvb_free(t.v);
    return false;
}

/* ---- the parser: regex text to a tree ------------------------------------------------- */

enum rkind { R_SET, R_CAT, R_ALT, R_REP, R_EMPTY, R_BOL, R_EOL };

struct rnode {
    uint8_t kind;
    int32_t first, next; /* CAT/ALT: children first, first->next, ...; REP: first */
    uint32_t min, max;   /* REP: max UINT32_MAX unbounded */
    int32_t set;         /* SET: the NFA's sets[set] */
};

struct parser {
    const uint32_t *cp; /* the regex as code points */
    size_t n, i;
    struct rnode *nodes;
    int64_t n_nodes, cap_nodes;
    struct gr_nfa *nfa; /* sets are stored there */
    struct gr_err *e;
    int nest;
};

static int32_t new_rnode(struct parser *p, uint8_t kind)
{
    if (p->n_nodes >= MAX_AST) return gr_fail(p->e, "the regex is too long (more than %d parts)", MAX_AST);
    if (!grow((void **)&p->nodes, p->n_nodes + 1, p->cap_nodes, sizeof *p->nodes, &p->cap_nodes)) {
        p->e->oom = true;
        return -1;
    }
    p->nodes[p->n_nodes] = (struct rnode){.kind = kind, .first = -1, .next = -1, .set = -1};
    return (int32_t)p->n_nodes++;
}

/* Stores a normalized interval list as a set of the NFA: its index, or -1. */
static int32_t store_set(struct parser *p, struct ivlist *l)
{
    struct gr_nfa *a = p->nfa;
    int64_t cap = a->cap_sets, icap = a->cap_ivs;
    if (!iv_normalize(l) || !grow((void **)&a->sets, a->n_sets + 1, cap, sizeof *a->sets, &cap)) goto oom;
    a->cap_sets = (int32_t)cap;
    if (!grow((void **)&a->ivs, (int64_t)a->n_ivs + l->n, icap, sizeof *a->ivs, &icap)) goto oom;
    a->cap_ivs = (uint32_t)icap;
    if (l->n) memcpy(a->ivs + a->n_ivs, l->v, (size_t)l->n * sizeof *l->v);
    a->sets[a->n_sets] = (struct gr_set){a->n_ivs, (uint32_t)l->n};
    a->n_ivs += (uint32_t)l->n;
    kvb_free(l->v);
    *l = (struct ivlist){0};
    return a->n_sets++;
oom:
    kvb_free(l->v);
    *l = (struct ivlist){0};
    p->e->oom = true;
    return -1;
}

static int32_t set_node(struct parser *p, struct ivlist *l)
{
    const int32_t s = store_set(p, l);
    if (s < 0) return -1;
    const int32_t k = new_rnode(p, R_SET);
    if (k >= 0) p->nodes[k].set = s;
    return k;
}

static bool at_end(const struct parser *p) { return p->i >= p->n; }
static uint32_t peek(const struct parser *p) { return p->i < p->n ? p->cp[p->i] : 0; }

static bool is_hexd(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static uint32_t hexv(uint32_t c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* k hex digits at p->i, or -1. */
static int64_t hex_digits(struct parser *p, int k)
{
    uint32_t v = 0;
    for (int d = 0; d < k; d++) {
        if (p->i + (size_t)d >= p->n || !is_hexd(p->cp[p->i + (size_t)d])) return -1;
        v = v * 16 + hexv(p->cp[p->i + (size_t)d]);
    }
    p->i += (size_t)k;
    return v;
}

/* The classes \d \w \s (upper case: their complements) into l. */
static bool class_escape(uint32_t c, struct ivlist *l)
{
    static const struct gr_iv space[] = {{9, 13},          {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                                         {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                         {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    struct ivlist t = {0};
    bool ok = true;
    switch (c | 32) {
    case 'd': ok = iv_add(&t, '0', '9'); break;
    case 'w': ok = iv_add(&t, '0', '9') && iv_add(&t, 'A', 'Z') && iv_add(&t, 'a', 'z') && iv_add(&t, '_', '_'); break;
    default:
        for (size_t k = 0; ok && k < sizeof space / sizeof space[0]; k++) ok = iv_add(&t, space[k].lo, space[k].hi);
        break;
    }
    if (ok) ok = iv_normalize(&t);
    if (ok && c < 'a') ok = iv_negate(&t);
    for (int64_t k = 0; ok && k < t.n; k++) ok = iv_add(l, t.v[k].lo, t.v[k].hi);
    kvb_free(t.v);
    return ok;
}

/* After a backslash: a single code point (*cp, returns 1), a class added to
 * l (returns 2), or -1. in_class: inside [...], where \b is a backspace. */
static int parse_escape(struct parser *p, bool in_class, uint32_t *cp, struct ivlist *l)
{
    if (at_end(p)) return gr_fail(p->e, "the regex ends in a lone backslash");
    const uint32_t c = p->cp[p->i++];
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        if (!class_escape(c, l)) {
            p->e->oom = true;
            return -1;
        }
        return 2;
    case 't': *cp = '\t'; return 1;
    case 'n': *cp = '\n'; return 1;
    case 'v': *cp = '\v'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 1;
        }
        return gr_fail(p->e, "the word boundary \\b is not supported");
    case 'B': return gr_fail(p->e, "the word boundary \\B is not supported");
    case 'p':
    case 'P': return gr_fail(p->e, "Unicode property escapes (\\%c{...}) are not supported", (char)c);
    case 'k': return gr_fail(p->e, "back-references by name (\\k<name>) are not supported");
    case 'c':
        if (!at_end(p) && ((peek(p) | 32) >= 'a' && (peek(p) | 32) <= 'z')) {
            *cp = p->cp[p->i++] % 32;
            return 1;
        }
        return gr_fail(p->e, "\\c must be followed by a letter");
    case 'x': {
        const int64_t v = hex_digits(p, 2);
        if (v < 0) return gr_fail(p->e, "\\x must be followed by two hex digits");
        *cp = (uint32_t)v;
        return 1;
    }
    case 'u': {
        if (peek(p) == '{') {
            p->i++;
            uint32_t v = 0;
            int d = 0;
            while (!at_end(p) && is_hexd(peek(p)) && d < 8) v = v * 16 + hexv(p->cp[p->i++]), d++;
            if (d == 0 || peek(p) != '}' || v > GR_MAX_CP) return gr_fail(p->e, "bad \\u{...} escape");
            p->i++;
            *cp = v;
        } else {
            const int64_t v = hex_digits(p, 4);
            if (v < 0) return gr_fail(p->e, "\\u must be followed by four hex digits");
            *cp = (uint32_t)v;
            if (v >= 0xD800 && v <= 0xDBFF && p->i + 1 < p->n && p->cp[p->i] == '\\' && p->cp[p->i + 1] == 'u') {
                const size_t save = p->i;
                p->i += 2;
                const int64_t lo = hex_digits(p, 4);
                if (lo >= 0xDC00 && lo <= 0xDFFF)
                    *cp = 0x10000 + (((uint32_t)v - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                else p->i = save;
            }
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return gr_fail(p->e, "a lone surrogate (\\u%04X) is not a character", *cp);
        return 1;
    }
    case '0':
        if (!at_end(p) && peek(p) >= '0' && peek(p) <= '9') return gr_fail(p->e, "octal escapes are not supported");
        *cp = 0;
        return 1;
    default:
        if (c >= '1' && c <= '9') {
            if (in_class) return gr_fail(p->e, "octal escapes are not supported");
            return gr_fail(p->e, "back-references (\\%c) are not supported", (char)c);
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return gr_fail(p->e, "the escape \\%c is not supported", (char)c);
        *cp = c; /* escaped punctuation stands for itself */
        return 1;
    }
}

/* [...] after its '[' */
static int32_t parse_class(struct parser *p)
{
    bool neg = false;
    if (peek(p) == '^') neg = true, p->i++;
    if (peek(p) == ']') return gr_fail(p->e, "empty classes ([] and [^]) are not supported");
    struct ivlist l = {0};
    while (!at_end(p) && peek(p) != ']') {
        uint32_t a = p->cp[p->i++], b;
        int r = 1;
        if (a == '\\' && (r = parse_escape(p, true, &a, &l)) < 0) goto fail;
        if (r == 1 && peek(p) == '-' && p->i + 1 < p->n && p->cp[p->i + 1] != ']') {
            p->i++;
            b = p->cp[p->i++];
            int r2 = 1;
            if (b == '\\' && (r2 = parse_escape(p, true, &b, &l)) < 0) goto fail;
            if (r2 == 2) {
                gr_fail(p->e, "a class escape cannot end a range");
                goto fail;
            }
            if (b < a) {
                gr_fail(p->e, "the range %c-%c in a class is out of order", (char)(a < 128 ? a : '?'),
                        (char)(b < 128 ? b : '?'));
                goto fail;
            }
            if (!iv_add(&l, a, b)) goto oom;
        } else if (r == 1 && !iv_add(&l, a, a)) {
            goto oom;
        }
    }
    if (at_end(p)) {
        gr_fail(p->e, "a class [ is not closed");
        goto fail;
    }
    p->i++;
    if (!iv_normalize(&l) || (neg && !iv_negate(&l))) goto oom;
    if (l.n == 0) {
        gr_fail(p->e, "the class matches no character");
        goto fail;
    }
    return set_node(p, &l);
oom:
    p->e->oom = true;
fail:
    kvb_free(l.v);
    return -1;
}

static int32_t parse_alt(struct parser *p);

/* {n}, {n,}, {n,m} at '{': true when it is one (Annex B: otherwise a literal). */
static bool parse_count(struct parser *p, uint32_t *mn, uint32_t *mx)
{
    size_t j = p->i + 1;
    uint64_t a = 0, b;
    int da = 0, db = 0;
    while (j < p->n && p->cp[j] >= '0' && p->cp[j] <= '9' && da < 10) a = a * 10 + (p->cp[j++] - '0'), da++;
    if (da == 0) return false;
    b = a;
    if (j < p->n && p->cp[j] == ',') {
        j++;
        b = UINT32_MAX;
        if (j < p->n && p->cp[j] >= '0' && p->cp[j] <= '9') {
            b = 0;
            while (j < p->n && p->cp[j] >= '0' && p->cp[j] <= '9' && db < 10) b = b * 10 + (p->cp[j++] - '0'), db++;
        }
    }
    if (j >= p->n || p->cp[j] != '}') return false;
    p->i = j + 1;
    *mn = a > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)a;
    *mx = b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
    return true;
}

static bool is_quant_start(const struct parser *p)
{
    const uint32_t c = peek(p);
    if (c == '*' || c == '+' || c == '?') return true;
    if (c != '{') return false;
    struct parser q = *p;
    uint32_t a, b;
    return parse_count(&q, &a, &b);
}

/* One atom: a node, or -1. */
static int32_t parse_atom(struct parser *p)
{
    const uint32_t c = p->cp[p->i++];
    struct ivlist l = {0};
    uint32_t cp = c;
    switch (c) {
    case '^': return new_rnode(p, R_BOL);
    case '$': return new_rnode(p, R_EOL);
    case '(': {
        if (++p->nest > MAX_NEST) return gr_fail(p->e, "groups nest deeper than %d", MAX_NEST);
        if (peek(p) == '?') {
            p->i++;
            const uint32_t d = peek(p);
            if (d == ':') {
                p->i++;
            } else if (d == '=' || d == '!') {
                return gr_fail(p->e, "lookahead (?%c...) is not supported", (char)d);
            } else if (d == '<' && p->i + 1 < p->n && (p->cp[p->i + 1] == '=' || p->cp[p->i + 1] == '!')) {
                return gr_fail(p->e, "lookbehind (?<%c...) is not supported", (char)p->cp[p->i + 1]);
            } else if (d == '<') {
                while (!at_end(p) && peek(p) != '>') p->i++;
                if (at_end(p)) return gr_fail(p->e, "a group name (?<name> is not closed");
                p->i++;
            } else {
                return gr_fail(p->e, "the group (?%c is not supported", (char)(d < 128 && d >= 32 ? d : '?'));
            }
        }
        const int32_t k = parse_alt(p);
        if (k < 0) return -1;
        if (peek(p) != ')') return gr_fail(p->e, "a group ( is not closed");
        p->i++;
        p->nest--;
        return k;
    }
    case ')': return gr_fail(p->e, "unmatched )");
    case '[': return parse_class(p);
    case '.':
        if (!iv_add(&l, 0, GR_MAX_CP) || !iv_normalize(&l)) goto oom;
        {
            struct ivlist nl = {0};
            if (!iv_add(&nl, '\n', '\n') || !iv_add(&nl, '\r', '\r') || !iv_add(&nl, 0x2028, 0x2029) ||
                !iv_normalize(&nl) || !iv_negate(&nl)) {
                kvb_free(nl.v);
                goto oom;
            }
            kvb_free(l.v);
            l = nl;
        }
        return set_node(p, &l);
    case '*':
    case '+':
    case '?': return gr_fail(p->e, "nothing to repeat before '%c'", (char)c);
    case '\\': {
        const int r = parse_escape(p, false, &cp, &l);
        if (r < 0) {
            kvb_free(l.v);
            return -1;
        }
        if (r == 2) return set_node(p, &l);
        break;
    }
    default: break;
    }
    if (!iv_add(&l, cp, cp)) goto oom;
    return set_node(p, &l);
oom:
    kvb_free(l.v);
    p->e->oom = true;
    return -1;
}

static int32_t parse_term(struct parser *p)
{
    if (peek(p) == '{' && is_quant_start(p)) return gr_fail(p->e, "nothing to repeat before '{'");
    const int32_t a = parse_atom(p);
    if (a < 0 || !is_quant_start(p)) return a;
    const uint8_t ak = p->nodes[a].kind;
    if (ak == R_BOL || ak == R_EOL) return gr_fail(p->e, "an anchor (^ or $) cannot be repeated");
    uint32_t mn = 0, mx = UINT32_MAX;
    const uint32_t q = peek(p);
    if (q == '{') {
        parse_count(p, &mn, &mx);
        if (mx != UINT32_MAX && mn > mx) return gr_fail(p->e, "the count {%u,%u} is out of order", mn, mx);
        if (mn > GREGEX_MAX_COUNT || (mx != UINT32_MAX && mx > GREGEX_MAX_COUNT))
            return gr_fail(p->e, "counts above %d in {n,m} are not supported", GREGEX_MAX_COUNT);
    } else {
        p->i++;
        mn = q == '+';
        mx = q == '?' ? 1 : UINT32_MAX;
    }
    if (peek(p) == '?') p->i++; /* lazy: the same strings */
    if (is_quant_start(p)) return gr_fail(p->e, "nothing to repeat (two quantifiers in a row)");
    const int32_t r = new_rnode(p, R_REP);
    if (r < 0) return -1;
    p->nodes[r].first = a;
    p->nodes[r].min = mn;
    p->nodes[r].max = mx;
    return r;
}

static int32_t parse_cat(struct parser *p)
{
    const int32_t k = new_rnode(p, R_CAT);
    if (k < 0) return -1;
    int32_t last = -1;
    while (!at_end(p) && peek(p) != '|' && peek(p) != ')') {
        const int32_t t = parse_term(p);
        if (t < 0) return -1;
        if (last < 0) p->nodes[k].first = t;
        else p->nodes[last].next = t;
        last = t;
    }
    return k;
}

static int32_t parse_alt(struct parser *p)
{
    const int32_t k = new_rnode(p, R_ALT);
    if (k < 0) return -1;
    int32_t last = -1;
    for (;;) {
        const int32_t t = parse_cat(p);
        if (t < 0) return -1;
        if (last < 0) p->nodes[k].first = t;
        else p->nodes[last].next = t;
        last = t;
        if (peek(p) != '|' || at_end(p)) break;
        p->i++;
    }
    return k;
}

/* ---- Thompson's construction ---------------------------------------------------------- */

struct frag {
    int32_t in, out;
};

static int32_t new_state(struct parser *p)
{
    if (p->nfa->n_states >= GREGEX_MAX_NFA)
        return gr_fail(p->e, "the regex needs more than %d automaton states (counts too large)", GREGEX_MAX_NFA);
    return p->nfa->n_states++;
}

static bool add_edge(struct parser *p, int32_t from, int32_t to, uint8_t kind, int32_t set)
{
    struct gr_nfa *a = p->nfa;
    int64_t cap = a->cap_edges;
    if (!grow((void **)&a->edges, a->n_edges + 1, cap, sizeof *a->edges, &cap)) {
        p->e->oom = true;
        return false;
    }
    a->cap_edges = (int32_t)cap;
    a->edges[a->n_edges++] = (struct gr_edge){from, to, kind, set};
    return true;
}

static int build(struct parser *p, int32_t k, struct frag *f);

/* child repeated min..max times. */
static int build_rep(struct parser *p, const struct rnode *r, struct frag *f)
{
    const int32_t s = new_state(p);
    if (s < 0) return -1;
    int32_t cur = s;
    struct frag c;
    for (uint32_t i = 0; i < r->min; i++) {
        if (build(p, r->first, &c) < 0 || !add_edge(p, cur, c.in, GE_EPS, -1)) return -1;
        cur = c.out;
    }
    if (r->max == UINT32_MAX) {
        const int32_t loop = new_state(p);
        if (loop < 0 || build(p, r->first, &c) < 0) return -1;
        if (!add_edge(p, cur, loop, GE_EPS, -1) || !add_edge(p, loop, c.in, GE_EPS, -1) ||
            !add_edge(p, c.out, loop, GE_EPS, -1))
            return -1;
        *f = (struct frag){s, loop};
        return 0;
    }
    const int32_t end = new_state(p);
    if (end < 0) return -1;
    for (uint32_t i = r->min; i < r->max; i++) {
        if (build(p, r->first, &c) < 0 || !add_edge(p, cur, c.in, GE_EPS, -1) || !add_edge(p, cur, end, GE_EPS, -1))
            return -1;
        cur = c.out;
    }
    if (!add_edge(p, cur, end, GE_EPS, -1)) return -1;
    *f = (struct frag){s, end};
    return 0;
}

static int build(struct parser *p, int32_t k, struct frag *f)
{
    const struct rnode *r = &p->nodes[k];
    const int32_t s = new_state(p);
    if (s < 0) return -1;
    switch (r->kind) {
    case R_SET:
    case R_BOL:
    case R_EOL: {
        const int32_t e = new_state(p);
        const uint8_t kind = r->kind == R_SET ? GE_SET : r->kind == R_BOL ? GE_BOL : GE_EOL;
        if (e < 0 || !add_edge(p, s, e, kind, r->set)) return -1;
        *f = (struct frag){s, e};
        return 0;
    }
    case R_CAT: {
        int32_t cur = s;
        for (int32_t c = r->first; c >= 0; c = p->nodes[c].next) {
            struct frag g;
            if (build(p, c, &g) < 0 || !add_edge(p, cur, g.in, GE_EPS, -1)) return -1;
            cur = g.out;
        }
        *f = (struct frag){s, cur};
        return 0;
    }
    case R_ALT: {
        const int32_t e = new_state(p);
        if (e < 0) return -1;
        for (int32_t c = r->first; c >= 0; c = p->nodes[c].next) {
            struct frag g;
            if (build(p, c, &g) < 0 || !add_edge(p, s, g.in, GE_EPS, -1) || !add_edge(p, g.out, e, GE_EPS, -1))
                return -1;
        }
        *f = (struct frag){s, e};
        return 0;
    }
    case R_REP: {
        struct frag g;
        if (build_rep(p, r, &g) < 0 || !add_edge(p, s, g.in, GE_EPS, -1)) return -1;
        *f = (struct frag){s, g.out};
        return 0;
    }
    default: *f = (struct frag){s, s}; return 0;
    }
}

void gr_nfa_free(struct gr_nfa *nfa)
{
    if (!nfa) return;
    kvb_free(nfa->edges);
    kvb_free(nfa->ivs);
    kvb_free(nfa->sets);
    memset(nfa, 0, sizeof *nfa);
}

/* The regex's text as code points (*out kvb_malloc'd), or -1 on bad UTF-8. */
static int decode(const char *re, size_t len, uint32_t **out, size_t *n, struct gr_err *e)
{
    *out = kvb_malloc((len ? len : 1) * sizeof **out);
    if (!*out) {
        e->oom = true;
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        size_t bad;
        const size_t m = json_utf8_seq((const unsigned char *)re + i, len - i, &bad);
        if (m == 0) return gr_fail(e, "the regex is not valid UTF-8 (at byte %zu)", i);
        const unsigned char *u = (const unsigned char *)re + i;
        uint32_t c = m == 1   ? u[0]
                     : m == 2 ? (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F)
                     : m == 3 ? (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F)
                              : (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
                                    (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
        (*out)[k++] = c;
        i += m;
    }
    *n = k;
    return 0;
}

int gr_build_nfa(const char *re, size_t len, bool search, struct gr_nfa *nfa, struct gr_err *e)
{
    uint32_t *cp = NULL;
    size_t n = 0;
    int rc = -1;
    struct parser p = {.nfa = nfa, .e = e};
    if (decode(re, len, &cp, &n, e) < 0) goto done;
    p.cp = cp;
    p.n = n;
    const int32_t root = parse_alt(&p);
    if (root < 0) goto done;
    if (!at_end(&p)) {
        gr_fail(e, "unmatched )");
        goto done;
    }
    struct frag f;
    if (build(&p, root, &f) < 0) goto done;
    nfa->start = f.in;
    nfa->accept = f.out;
    if (search) { /* any string on each side: a loop over every code point */
        struct ivlist l = {0};
        if (!iv_add(&l, 0, GR_MAX_CP)) {
            e->oom = true;
            goto done;
        }
        const int32_t any = store_set(&p, &l), a = new_state(&p), b = new_state(&p);
        if (any < 0 || a < 0 || b < 0) goto done;
        if (!add_edge(&p, a, a, GE_SET, any) || !add_edge(&p, a, f.in, GE_EPS, -1) ||
            !add_edge(&p, f.out, b, GE_EPS, -1) || !add_edge(&p, b, b, GE_SET, any))
            goto done;
        nfa->start = a;
        nfa->accept = b;
    }
    rc = 0;
done:
    kvb_free(cp);
    kvb_free(p.nodes);
    return rc;
}

static enum kvb_status run(const char *re, size_t len, int flags, uint32_t min_len, uint32_t max_len,
                           const char *rule_prefix, struct kvb_buf *out, char *msg, size_t msg_cap)
{
    struct gr_err e = {msg, msg_cap, false};
    struct gr_nfa nfa = {0};
    const size_t mark = out->len;
    if (msg && msg_cap) msg[0] = '\0';
    int rc = gr_build_nfa(re, len, flags == GREGEX_JSON_CONTENT, &nfa, &e);
    if (rc == 0) rc = gr_emit(&nfa, flags == GREGEX_JSON_CONTENT, min_len, max_len, rule_prefix, out, &e);
    gr_nfa_free(&nfa);
    if (rc == 0) return KVB_OK;
    out->len = mark;
    if (out->data) out->data[mark] = '\0';
    return e.oom ? KVB_ERR_NOMEM : KVB_ERR_FORMAT;
}

enum kvb_status gregex_to_gbnf(const char *re, size_t len, int flags, const char *rule_prefix, struct kvb_buf *out,
                               char *msg, size_t msg_cap)
{
    return run(re, len, flags, 0, GREGEX_NO_MAX, rule_prefix, out, msg, msg_cap);
}

enum kvb_status gregex_to_gbnf_len(const char *re, size_t len, int flags, uint32_t min_len, uint32_t max_len,
                                   const char *rule_prefix, struct kvb_buf *out, char *msg, size_t msg_cap)
{
    if (max_len != GREGEX_NO_MAX && min_len > max_len) {
        snprintf(msg, msg_cap, "the length bounds %u..%u are out of order", min_len, max_len);
        return KVB_ERR_FORMAT;
    }
    return run(re, len, flags, min_len, max_len, rule_prefix, out, msg, msg_cap);
}
