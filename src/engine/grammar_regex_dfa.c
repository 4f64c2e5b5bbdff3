/* grammar_regex_dfa.c — the regex's automaton made deterministic (subset
 * construction over the code-point intervals its classes cut the alphabet
 * into), crossed with a length counter when the match's length is bounded,
 * pruned of states that cannot reach a match, and written as right-linear
 * GBNF (grammar_regex.h). Deterministic rules keep a recogniser's work per
 * byte constant; pruning keeps every accepted prefix completable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_regex_int.h"

#define MAX_CELLS (64u << 20) /* states x lengths the product may index */

static bool grow(void **p, int64_t need, int64_t *cap, size_t elem)
{
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = kvb_realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

struct ivec {
    int32_t *v;
    int64_t n, cap;
};

static bool push(struct ivec *a, int32_t x)
{
    if (!grow((void **)&a->v, a->n + 1, &a->cap, sizeof *a->v)) return false;
    a->v[a->n++] = x;
    return true;
}

/* ---- the alphabet: atoms are intervals no class boundary cuts ------------------------- */

struct alphabet {
    uint32_t *lo; /* atom k is lo[k] .. lo[k + 1] - 1 */
    int32_t n;
    uint64_t *bits; /* set s contains atom k: bits[s * words + k / 64] bit k % 64 */
    int32_t words;
};

static int cmp_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int32_t atom_of(const struct alphabet *al, uint32_t cp)
{
    int32_t a = 0, b = al->n - 1; /* the last atom whose lo <= cp */
    while (a < b) {
        const int32_t m = (a + b + 1) / 2;
        if (al->lo[m] <= cp) a = m;
        else b = m - 1;
    }
    return a;
}

static bool alphabet_build(const struct gr_nfa *nfa, struct alphabet *al)
{
    const size_t nb = (size_t)nfa->n_ivs * 2 + 2;
    uint32_t *b = kvb_malloc(nb * sizeof *b);
    if (!b) return false;
    size_t k = 0;
    b[k++] = 0;
    b[k++] = GR_MAX_CP + 1;
    for (uint32_t i = 0; i < nfa->n_ivs; i++) {
        b[k++] = nfa->ivs[i].lo;
        b[k++] = nfa->ivs[i].hi + 1;
    }
    qsort(b, k, sizeof *b, cmp_u32);
    size_t w = 0;
    for (size_t i = 0; i < k; i++)
        if (w == 0 || b[i] != b[w - 1]) b[w++] = b[i];
    al->lo = b;
    al->n = (int32_t)w - 1; /* the last boundary, GR_MAX_CP + 1, opens no atom */
    al->words = (al->n + 63) / 64;
    al->bits = kvb_calloc((size_t)(nfa->n_sets ? nfa->n_sets : 1) * (size_t)al->words, sizeof *al->bits);
    if (!al->bits) return false;
    for (int32_t s = 0; s < nfa->n_sets; s++) {
        uint64_t *row = al->bits + (size_t)s * (size_t)al->words;
        for (uint32_t i = nfa->sets[s].off; i < nfa->sets[s].off + nfa->sets[s].n; i++) {
            const int32_t a0 = atom_of(al, nfa->ivs[i].lo), a1 = atom_of(al, nfa->ivs[i].hi);
            for (int32_t a = a0; a <= a1; a++) row[a / 64] |= (uint64_t)1 << (a % 64);
        }
    }
    return true;
}

static bool has_atom(const struct alphabet *al, int32_t set, int32_t a)
{
    return (al->bits[(size_t)set * (size_t)al->words + (size_t)(a / 64)] >> (a % 64)) & 1u;
}

/* ---- closure over empty moves, with the anchors ------------------------------------------
 * Mode 0 reads on; mode 1 has passed a '$' and may only reach the end. The
 * set kept is the mode-0 states that have a character edge (what the next
 * character can move), and whether the accept state was reached. */

struct closer {
    const struct gr_nfa *nfa;
    int32_t *off; /* (n_states + 1): out-edges of s are by_from[off[s] .. off[s + 1]) */
    int32_t *by_from;
    uint32_t *mark; /* (2 n_states) stamp of the last visit */
    uint32_t stamp;
    struct ivec todo;
    bool *has_char; /* (n_states) */
};

static bool closer_init(struct closer *c, const struct gr_nfa *nfa)
{
    const size_t n = (size_t)nfa->n_states;
    c->nfa = nfa;
    c->off = kvb_calloc(n + 1, sizeof *c->off);
    c->by_from = kvb_malloc(((size_t)nfa->n_edges + 1) * sizeof *c->by_from);
    c->mark = kvb_calloc(2 * n + 1, sizeof *c->mark);
    c->has_char = kvb_calloc(n + 1, sizeof *c->has_char);
    if (!c->off || !c->by_from || !c->mark || !c->has_char) return false;
    for (int32_t i = 0; i < nfa->n_edges; i++) c->off[nfa->edges[i].from + 1]++;
    for (size_t s = 0; s < n; s++) c->off[s + 1] += c->off[s];
    int32_t *fill = kvb_malloc((n + 1) * sizeof *fill);
    if (!fill) return false;
    memcpy(fill, c->off, (n + 1) * sizeof *fill);
    for (int32_t i = 0; i < nfa->n_edges; i++) {
        c->by_from[fill[nfa->edges[i].from]++] = i;
        if (nfa->edges[i].kind == GE_SET) c->has_char[nfa->edges[i].from] = true;
    }
    kvb_free(fill);
    return true;
}

static void closer_free(struct closer *c)
{
    kvb_free(c->off);
    kvb_free(c->by_from);
    kvb_free(c->mark);
    kvb_free(c->has_char);
    kvb_free(c->todo.v);
}

/* kernel[0..n) closed; the kept states into *set (sorted), *accept. */
static bool closure(struct closer *c, const int32_t *kernel, int64_t n, bool at_start, struct ivec *set, bool *accept)
{
    c->stamp++;
    c->todo.n = 0;
    set->n = 0;
    *accept = false;
    for (int64_t i = 0; i < n; i++) {
        const int32_t s = kernel[i];
        if (c->mark[2 * s] == c->stamp) continue;
        c->mark[2 * s] = c->stamp;
        if (!push(&c->todo, 2 * s)) return false;
    }
    while (c->todo.n) {
        const int32_t sm = c->todo.v[--c->todo.n], s = sm / 2, mode = sm % 2;
        if (s == c->nfa->accept) *accept = true;
        if (mode == 0 && c->has_char[s] && !push(set, s)) return false;
        for (int32_t k = c->off[s]; k < c->off[s + 1]; k++) {
            const struct gr_edge *e = &c->nfa->edges[c->by_from[k]];
            int32_t to_mode = mode;
            if (e->kind == GE_SET || (e->kind == GE_BOL && !at_start)) continue;
            if (e->kind == GE_EOL) to_mode = 1;
            const int32_t key = 2 * e->to + to_mode;
            if (c->mark[key] == c->stamp) continue;
            c->mark[key] = c->stamp;
            if (!push(&c->todo, key)) return false;
        }
    }
    if (set->n > 1) qsort(set->v, (size_t)set->n, sizeof *set->v, cmp_u32);
    return true;
}

/* ---- subset construction -------------------------------------------------------------- */

struct dfa {
    struct ivec pool; /* the states' NFA sets, one after another */
    struct ivec off;  /* state d's set is pool[off[d] .. off[d + 1]) */
    struct ivec acc;  /* accepting (0/1) */
    int32_t *hash;    /* open addressing: state + 1, 0 empty */
    int64_t hash_cap;
    /* transitions: from, to, and the atoms (as interval lists in ivs) */
    struct ivec t_from, t_to, t_off; /* t_off: ivs[t_off[t] .. t_off[t + 1]) */
    struct gr_iv *ivs;
    int64_t n_ivs, cap_ivs;
};

static uint64_t hash_set(const int32_t *v, int64_t n, bool acc, bool start)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(acc * 2 + start);
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
    return h;
}

static int32_t n_dfa(const struct dfa *d) { return (int32_t)d->acc.n; }

static bool rehash(struct dfa *d, int64_t cap);

/* The state for (set, acc); start marks the first state, which alone passes
 * '^'. Its index, or -1 (out of memory) or -2 (too many states). */
static int32_t dfa_state(struct dfa *d, const struct ivec *set, bool acc, bool start)
{
    if (d->hash_cap < 2 * (n_dfa(d) + 1) && !rehash(d, d->hash_cap ? d->hash_cap * 2 : 256)) return -1;
    const uint64_t h = hash_set(set->v, set->n, acc, start);
    int64_t slot = (int64_t)(h & (uint64_t)(d->hash_cap - 1));
    for (; d->hash[slot]; slot = (slot + 1) & (d->hash_cap - 1)) {
        const int32_t s = d->hash[slot] - 1;
        const int64_t n = d->off.v[s + 1] - d->off.v[s];
        if (s == 0 ? !start : start) continue;
        if (n == set->n && d->acc.v[s] == acc &&
            (n == 0 || memcmp(d->pool.v + d->off.v[s], set->v, (size_t)n * sizeof *set->v) == 0))
            return s;
    }
    if (n_dfa(d) >= GREGEX_MAX_DFA) return -2;
    for (int64_t i = 0; i < set->n; i++)
        if (!push(&d->pool, set->v[i])) return -1;
    if (d->off.n == 0 && !push(&d->off, 0)) return -1;
    if (!push(&d->off, (int32_t)d->pool.n) || !push(&d->acc, acc)) return -1;
    d->hash[slot] = n_dfa(d);
    return n_dfa(d) - 1;
}

static bool rehash(struct dfa *d, int64_t cap)
{
    int32_t *h = kvb_calloc((size_t)cap, sizeof *h);
    if (!h) return false;
    for (int32_t s = 0; s < n_dfa(d); s++) {
        const int64_t o = d->off.v[s];
        uint64_t x = hash_set(d->pool.v + o, d->off.v[s + 1] - o, d->acc.v[s], s == 0);
        int64_t slot = (int64_t)(x & (uint64_t)(cap - 1));
        while (h[slot]) slot = (slot + 1) & (cap - 1);
        h[slot] = s + 1;
    }
    kvb_free(d->hash);
    d->hash = h;
    d->hash_cap = cap;
    return true;
}

static void dfa_free(struct dfa *d)
{
    kvb_free(d->pool.v);
    kvb_free(d->off.v);
    kvb_free(d->acc.v);
    kvb_free(d->hash);
    kvb_free(d->t_from.v);
    kvb_free(d->t_to.v);
    kvb_free(d->t_off.v);
    kvb_free(d->ivs);
}

/* Transitions of state s: one per distinct target, its atoms merged into intervals. */
static int expand(struct dfa *d, struct closer *c, const struct alphabet *al, int32_t s, int32_t *target,
                  struct ivec *kernel, struct ivec *set, struct gr_err *e)
{
    const struct gr_nfa *nfa = c->nfa;
    for (int32_t a = 0; a < al->n; a++) {
        kernel->n = 0;
        for (int32_t i = d->off.v[s]; i < d->off.v[s + 1]; i++) {
            const int32_t q = d->pool.v[i];
            for (int32_t k = c->off[q]; k < c->off[q + 1]; k++) {
                const struct gr_edge *ed = &nfa->edges[c->by_from[k]];
                if (ed->kind == GE_SET && has_atom(al, ed->set, a) && !push(kernel, ed->to)) goto oom;
            }
        }
        target[a] = -1;
        if (kernel->n == 0) continue;
        bool acc;
        if (!closure(c, kernel->v, kernel->n, false, set, &acc)) goto oom;
        if (set->n == 0 && !acc) continue;
        const int32_t t = dfa_state(d, set, acc, false);
        if (t == -1) goto oom;
        if (t == -2) return gr_fail(e, "the regex needs more than %d automaton states", GREGEX_MAX_DFA);
        target[a] = t;
    }
    for (int32_t a = 0; a < al->n; a++) {
        const int32_t t = target[a];
        if (t < 0) continue;
        if (!push(&d->t_from, s) || !push(&d->t_to, t) || (d->t_off.n == 0 && !push(&d->t_off, 0))) goto oom;
        for (int32_t b = a; b < al->n; b++) {
            if (target[b] != t) continue;
            const uint32_t lo = al->lo[b], hi = al->lo[b + 1] - 1;
            target[b] = -1;
            if (b > a && d->n_ivs > d->t_off.v[d->t_off.n - 1] && d->ivs[d->n_ivs - 1].hi + 1 == lo) {
                d->ivs[d->n_ivs - 1].hi = hi;
                continue;
            }
            if (!grow((void **)&d->ivs, d->n_ivs + 1, &d->cap_ivs, sizeof *d->ivs)) goto oom;
            d->ivs[d->n_ivs++] = (struct gr_iv){lo, hi};
        }
        if (!push(&d->t_off, (int32_t)d->n_ivs)) goto oom;
    }
    return 0;
oom:
    e->oom = true;
    return -1;
}

static int determinize(const struct gr_nfa *nfa, struct dfa *d, struct gr_err *e)
{
    struct closer c = {0};
    struct alphabet al = {0};
    struct ivec kernel = {0}, set = {0};
    int32_t *target = NULL;
    int rc = -1;
    if (!closer_init(&c, nfa) || !alphabet_build(nfa, &al)) goto oom;
    target = kvb_malloc(((size_t)al.n + 1) * sizeof *target);
    if (!target || !push(&kernel, nfa->start)) goto oom;
    bool acc;
    if (!closure(&c, kernel.v, kernel.n, true, &set, &acc) || dfa_state(d, &set, acc, true) < 0) goto oom;
    for (int32_t s = 0; s < n_dfa(d); s++)
        if (expand(d, &c, &al, s, target, &kernel, &set, e) < 0) goto done;
    rc = 0;
    goto done;
oom:
    e->oom = true;
done:
    closer_free(&c);
    kvb_free(al.lo);
    kvb_free(al.bits);
    kvb_free(kernel.v);
    kvb_free(set.v);
    kvb_free(target);
    return rc;
}

/* ---- the length product, pruning, and the rules --------------------------------------- */

struct product {
    struct ivec st_d, st_n;   /* product state p = (DFA state st_d, length st_n) */
    struct ivec e_from, e_to; /* edges, and the DFA transition each follows */
    struct ivec e_t;
    int32_t *id; /* (n_dfa * (cap + 1)) product state or -1 */
    bool *live;
    bool *terminal; /* live, and the match can only end here: no rule of its own */
    int32_t *name;  /* rule number of a live state that is not terminal */
};

static void product_free(struct product *p)
{
    kvb_free(p->st_d.v);
    kvb_free(p->st_n.v);
    kvb_free(p->e_from.v);
    kvb_free(p->e_to.v);
    kvb_free(p->e_t.v);
    kvb_free(p->id);
    kvb_free(p->live);
    kvb_free(p->terminal);
    kvb_free(p->name);
}

static int cross(const struct dfa *d, uint32_t min_len, uint32_t max_len, struct product *p, struct gr_err *e)
{
    const bool bounded = max_len != GREGEX_NO_MAX;
    const uint64_t cap = bounded ? max_len : min_len;
    if ((uint64_t)n_dfa(d) * (cap + 1) > MAX_CELLS)
        return gr_fail(e, "the length bound %llu is too large for this pattern", (unsigned long long)cap);
    p->id = kvb_malloc((size_t)n_dfa(d) * (size_t)(cap + 1) * sizeof *p->id);
    if (!p->id) goto oom;
    memset(p->id, 0xFF, (size_t)n_dfa(d) * (size_t)(cap + 1) * sizeof *p->id);
    /* transitions of DFA state s: t_first[s] .. (they were made in order of s) */
    if (!push(&p->st_d, 0) || !push(&p->st_n, 0)) goto oom;
    p->id[0] = 0;
    int64_t t = 0;
    int32_t *t_first = kvb_malloc(((size_t)n_dfa(d) + 1) * sizeof *t_first);
    if (!t_first) goto oom;
    for (int32_t s = 0; s <= n_dfa(d); s++) {
        while (t < d->t_from.n && d->t_from.v[t] < s) t++;
        t_first[s] = (int32_t)t;
    }
    for (int64_t q = 0; q < p->st_d.n; q++) {
        const int32_t s = p->st_d.v[q];
        const uint32_t n = (uint32_t)p->st_n.v[q];
        if (bounded && n >= max_len) continue;
        const uint32_t n2 = bounded || n + 1 <= cap ? n + 1 : (uint32_t)cap;
        for (int32_t k = t_first[s]; k < t_first[s + 1]; k++) {
            const int32_t to = d->t_to.v[k];
            int32_t *slot = &p->id[(size_t)to * (size_t)(cap + 1) + n2];
            if (*slot < 0) {
                if (p->st_d.n >= GREGEX_MAX_RULES) {
                    kvb_free(t_first);
                    return gr_fail(e, "the pattern crossed with its length bounds needs more than %d rules",
                                   GREGEX_MAX_RULES);
                }
                *slot = (int32_t)p->st_d.n;
                if (!push(&p->st_d, to) || !push(&p->st_n, (int32_t)n2)) goto oom_t;
            }
            if (!push(&p->e_from, (int32_t)q) || !push(&p->e_to, *slot) || !push(&p->e_t, k)) goto oom_t;
        }
    }
    kvb_free(t_first);
    /* live: a match is reachable (backwards from the accepting states) */
    const int64_t np = p->st_d.n;
    p->live = kvb_calloc((size_t)np, sizeof *p->live);
    int32_t *roff = kvb_calloc((size_t)np + 1, sizeof *roff), *rin = kvb_malloc(((size_t)p->e_from.n + 1) * 4);
    struct ivec todo = {0};
    bool ok = p->live && roff && rin;
    for (int64_t k = 0; ok && k < p->e_from.n; k++) roff[p->e_to.v[k] + 1]++;
    for (int64_t q = 0; ok && q < np; q++) roff[q + 1] += roff[q];
    for (int64_t k = 0; ok && k < p->e_from.n; k++) rin[roff[p->e_to.v[k]]++] = (int32_t)k;
    for (int64_t q = np; ok && q > 0; q--) roff[q] = roff[q - 1];
    if (ok) roff[0] = 0;
    for (int64_t q = 0; ok && q < np; q++) {
        if (d->acc.v[p->st_d.v[q]] && (uint32_t)p->st_n.v[q] >= min_len) {
            p->live[q] = true;
            ok = push(&todo, (int32_t)q);
        }
    }
    while (ok && todo.n) {
        const int32_t q = todo.v[--todo.n];
        for (int32_t k = roff[q]; k < roff[q + 1]; k++) {
            const int32_t f = p->e_from.v[rin[k]];
            if (!p->live[f]) {
                p->live[f] = true;
                ok = push(&todo, f);
            }
        }
    }
    kvb_free(roff);
    kvb_free(rin);
    kvb_free(todo.v);
    if (!ok) goto oom;
    return 0;
oom_t:
    kvb_free(t_first);
oom:
    e->oom = true;
    return -1;
}

static bool in_set(const struct gr_iv *v, int64_t n, uint32_t cp)
{
    for (int64_t i = 0; i < n; i++)
        if (cp >= v[i].lo && cp <= v[i].hi) return true;
    return false;
}

/* A class [..] of intervals v[0..n), code points from..to only; false
 * (nothing written) when none is left, *ok false when out of memory. */
static bool put_class(struct kvb_buf *out, const struct gr_iv *v, int64_t n, uint32_t from, uint32_t to, bool *ok)
{
    int64_t count = 0;
    uint32_t one = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t lo = v[i].lo > from ? v[i].lo : from, hi = v[i].hi < to ? v[i].hi : to;
        if (lo > hi) continue;
        count += (int64_t)(hi - lo) + 1;
        one = lo;
    }
    if (count == 0) return false;
    if (count == 1) {
        *ok = *ok && gr_puts(out, "\"") && gr_put_cp(out, one) && gr_puts(out, "\"");
        return true;
    }
    *ok = *ok && gr_puts(out, "[");
    for (int64_t i = 0; *ok && i < n; i++) {
        const uint32_t lo = v[i].lo > from ? v[i].lo : from, hi = v[i].hi < to ? v[i].hi : to;
        if (lo > hi) continue;
        *ok = gr_put_cp(out, lo) && (lo == hi || (gr_puts(out, "-") && gr_put_cp(out, hi)));
    }
    *ok = *ok && gr_puts(out, "]");
    return true;
}

/* The class as it reads inside a JSON string (grammar_regex.h: one written
 * form per code point), or as it is. */
static bool put_expr(struct kvb_buf *out, const struct gr_iv *v, int64_t n, bool json)
{
    bool ok = true;
    if (!json) {
        put_class(out, v, n, 0, GR_MAX_CP, &ok);
        return ok;
    }
    static const struct {
        uint32_t cp;
        const char *text;
    } esc[] = {{'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'/', "\"\\\\/\""}, {8, "\"\\\\b\""},
               {9, "\"\\\\t\""},      {10, "\"\\\\n\""},      {12, "\"\\\\f\""},  {13, "\"\\\\r\""}};
    int alts = 0;
    const size_t mark = out->len;
    ok = gr_puts(out, "(");
    static const struct gr_iv raw[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, GR_MAX_CP}};
    { /* the code points written raw: one class over the three ranges */
        struct kvb_buf tmp = {0};
        bool any = false;
        bool tok = gr_puts(&tmp, "[");
        int64_t count = 0;
        uint32_t one = 0;
        for (size_t r = 0; r < 3; r++) {
            for (int64_t i = 0; i < n; i++) {
                const uint32_t lo = v[i].lo > raw[r].lo ? v[i].lo : raw[r].lo;
                const uint32_t hi = v[i].hi < raw[r].hi ? v[i].hi : raw[r].hi;
                if (lo > hi) continue;
                any = true;
                count += (int64_t)(hi - lo) + 1;
                one = lo;
                tok = tok && gr_put_cp(&tmp, lo) && (lo == hi || (gr_puts(&tmp, "-") && gr_put_cp(&tmp, hi)));
            }
        }
        tok = tok && gr_puts(&tmp, "]");
        if (any && count == 1) ok = ok && gr_puts(out, "\"") && gr_put_cp(out, one) && gr_puts(out, "\"");
        else if (any) ok = ok && tok && gr_put(out, tmp.data, tmp.len);
        alts += any;
        kvb_buf_free(&tmp);
    }
    for (size_t k = 0; k < sizeof esc / sizeof esc[0]; k++) {
        if (!in_set(v, n, esc[k].cp)) continue;
        ok = ok && (alts == 0 || gr_puts(out, " | ")) && gr_puts(out, esc[k].text);
        alts++;
    }
    for (uint32_t hi = 0; hi < 2; hi++) { /* other control characters: \u00XX */
        char cls[64];
        size_t w = 0;
        for (uint32_t lo = 0; lo < 16; lo++) {
            const uint32_t c = hi * 16 + lo;
            if (c == 8 || c == 9 || c == 10 || c == 12 || c == 13 || !in_set(v, n, c)) continue;
            const char *hexd = "0123456789abcdef";
            cls[w++] = hexd[lo];
            if (lo >= 10) cls[w++] = (char)(hexd[lo] - 32);
        }
        if (w == 0) continue;
        cls[w] = '\0';
        char t[96];
        snprintf(t, sizeof t, "\"\\\\u00%u\" [%s]", hi, cls);
        ok = ok && (alts == 0 || gr_puts(out, " | ")) && gr_puts(out, t);
        alts++;
    }
    if (ok && alts == 1) { /* one alternative needs no parentheses */
        memmove(out->data + mark, out->data + mark + 1, out->len - mark - 1);
        out->len--;
        out->data[out->len] = '\0';
        return true;
    }
    return ok && gr_puts(out, ")");
}

static bool put_name(struct kvb_buf *out, const char *prefix, int32_t k)
{
    char t[32];
    if (k == 0) return gr_puts(out, prefix);
    snprintf(t, sizeof t, "-%d", k);
    return gr_puts(out, prefix) && gr_puts(out, t);
}

/* When a length bound copies each DFA state, a class written many times
 * is written once as its own rule (prefix-cT for transition T) and
 * referred to: the grammar stays small and the engine compiles each class
 * once. */
#define SHARE_MIN_TEXT 16 /* bytes of a class's text worth a rule of its own */

static int write_rules(const struct dfa *d, const struct product *p, bool json, uint32_t min_len, const char *prefix,
                       struct kvb_buf *out, struct gr_err *e)
{
    bool ok = true;
    const bool share = p->st_d.n > n_dfa(d);
    uint8_t *named = share ? kvb_calloc((size_t)d->t_from.n + 1, 1) : NULL; /* 1 shared, 2 inline */
    struct kvb_buf ex = {0};
    if (share && !named) goto oom;
    int64_t k = 0;
    for (int64_t q = 0; ok && q < p->st_d.n; q++) {
        if (!p->live[q] || (q > 0 && p->terminal[q])) continue;
        ok = put_name(out, prefix, p->name[q]) && gr_puts(out, " ::= ");
        int alts = 0;
        while (k < p->e_from.n && p->e_from.v[k] < q) k++;
        for (; ok && k < p->e_from.n && p->e_from.v[k] == q; k++) {
            const int32_t to = p->e_to.v[k], t = p->e_t.v[k];
            if (!p->live[to]) continue;
            ok = alts == 0 || gr_puts(out, " | ");
            if (share && named[t] == 1) {
                char ref[48];
                snprintf(ref, sizeof ref, "%s-c%d", prefix, t);
                ok = ok && gr_puts(out, ref);
            } else {
                ex.len = 0;
                ok = ok && put_expr(&ex, d->ivs + d->t_off.v[t], d->t_off.v[t + 1] - d->t_off.v[t], json);
                if (ok && share && ex.len >= SHARE_MIN_TEXT) {
                    char ref[48];
                    snprintf(ref, sizeof ref, "%s-c%d", prefix, t);
                    named[t] = 1;
                    ok = gr_puts(out, ref);
                } else {
                    ok = ok && gr_put(out, ex.data, ex.len);
                }
            }
            ok = ok && (p->terminal[to] || (gr_puts(out, " ") && put_name(out, prefix, p->name[to])));
            alts++;
        }
        if (ok && d->acc.v[p->st_d.v[q]] && (uint32_t)p->st_n.v[q] >= min_len)
            ok = (alts == 0 || gr_puts(out, " | ")) && gr_puts(out, "\"\"");
        ok = ok && gr_puts(out, "\n");
    }
    for (int64_t t = 0; ok && share && t < d->t_from.n; t++) { /* the shared classes */
        if (named[t] != 1) continue;
        char head[64];
        snprintf(head, sizeof head, "%s-c%lld ::= ", prefix, (long long)t);
        ok = gr_puts(out, head) && put_expr(out, d->ivs + d->t_off.v[t], d->t_off.v[t + 1] - d->t_off.v[t], json) &&
             gr_puts(out, "\n");
    }
    kvb_free(named);
    kvb_buf_free(&ex);
    if (!ok) e->oom = true;
    return ok ? 0 : -1;
oom:
    e->oom = true;
    return -1;
}

int gr_emit(const struct gr_nfa *nfa, bool json_content, uint32_t min_len, uint32_t max_len, const char *prefix,
            struct kvb_buf *out, struct gr_err *e)
{
    struct dfa d = {0};
    struct product p = {0};
    int rc = determinize(nfa, &d, e);
    if (rc == 0) rc = cross(&d, min_len, max_len, &p, e);
    if (rc == 0 && !p.live[0]) {
        rc = max_len != GREGEX_NO_MAX || min_len
                 ? gr_fail(e, "no string matches the pattern within the length bounds %u..%u", min_len, max_len)
                 : gr_fail(e, "no string matches the pattern");
    }
    if (rc == 0) {
        p.name = kvb_malloc(((size_t)p.st_d.n + 1) * sizeof *p.name);
        if (!p.name) {
            e->oom = true;
            rc = -1;
        }
    }
    if (rc == 0) {
        p.terminal = kvb_calloc((size_t)p.st_d.n + 1, sizeof *p.terminal);
        if (!p.terminal) {
            e->oom = true;
            rc = -1;
        }
    }
    if (rc == 0) {
        for (int64_t q = 0; q < p.st_d.n; q++) p.terminal[q] = p.live[q];
        for (int64_t k = 0; k < p.e_from.n; k++)
            if (p.live[p.e_to.v[k]]) p.terminal[p.e_from.v[k]] = false;
        int32_t next = 0;
        for (int64_t q = 0; q < p.st_d.n; q++) p.name[q] = p.live[q] && (q == 0 || !p.terminal[q]) ? next++ : -1;
        rc = write_rules(&d, &p, json_content, min_len, prefix, out, e);
    }
    product_free(&p);
    dfa_free(&d);
    return rc;
}
