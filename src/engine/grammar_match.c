/* grammar_match.c — the recogniser: interned stacks, interned states and
 * memoised byte transitions (grammar.h has the design).
 *
 * A stack is a node (pos, parent): pos the element to match next, parent
 * the rest of the stack (GM_NIL at the bottom), so stacks share their
 * tails and a node id names a whole stack. Expanding a node walks the
 * rules until every stack's top is a byte set (a "ready" node) or a stack
 * runs out (the grammar complete); a reference that ends its alternative
 * pops before it pushes (llama.cpp's tail call), so x* and right recursion
 * do not grow stacks. Nodes met twice in one expansion are expanded once,
 * which also ends loops through rules that can match nothing. A state is
 * the sorted set of ready nodes plus that completion flag, interned, with
 * a 256-entry transition row allocated the first time a byte is asked.
 *
 * Not here: the vocabulary and token masks (grammar_mask.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar_internal.h"

static uint32_t hash2(uint32_t a, uint32_t b)
{
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32);
}

static bool grow(struct grammar_matcher *m, void **ptr, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = kvb_realloc(*ptr, (size_t)nc * elem);
    if (!np) return false;
    m->bytes += (size_t)(nc - *cap) * elem;
    *ptr = np;
    *cap = nc;
    return true;
}

/* Rebuilds an open-addressing table of ids at twice the size. */
static bool rehash(struct grammar_matcher *m, uint32_t **tab, uint32_t *cap, uint32_t n,
                   uint32_t (*key)(const struct grammar_matcher *, uint32_t))
{
    const uint32_t nc = *cap ? *cap * 2 : 256;
    uint32_t *t = kvb_malloc(sizeof *t * nc);
    if (!t) return false;
    memset(t, 0xff, sizeof *t * nc);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = key(m, i) & (nc - 1);
        while (t[h] != GM_NIL) h = (h + 1) & (nc - 1);
        t[h] = i;
    }
    m->bytes += sizeof *t * (nc - *cap);
    kvb_free(*tab);
    *tab = t;
    *cap = nc;
    return true;
}

static uint32_t node_key(const struct grammar_matcher *m, uint32_t i)
{
    return hash2(m->nodes[i].pos, m->nodes[i].parent);
}

/* The node (pos, parent); GM_NIL when it would be deeper than
 * GRAMMAR_MAX_DEPTH or memory runs out. */
static uint32_t node_get(struct grammar_matcher *m, uint32_t pos, uint32_t parent)
{
    if (2 * (m->n_nodes + 1) > m->node_hash_cap && !rehash(m, &m->node_hash, &m->node_hash_cap, m->n_nodes, node_key)) {
        m->hit |= GM_HIT_NOMEM;
        return GM_NIL;
    }
    const uint32_t mask = m->node_hash_cap - 1;
    uint32_t h = hash2(pos, parent) & mask;
    for (; m->node_hash[h] != GM_NIL; h = (h + 1) & mask) {
        const struct gm_node *n = &m->nodes[m->node_hash[h]];
        if (n->pos == pos && n->parent == parent) return m->node_hash[h];
    }
    const uint32_t depth = parent == GM_NIL ? 1 : m->nodes[parent].depth + 1;
    if (depth > GRAMMAR_MAX_DEPTH) {
        m->hit |= GM_HIT_DEPTH;
        return GM_NIL;
    }
    if (!grow(m, (void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes)) {
        m->hit |= GM_HIT_NOMEM;
        return GM_NIL;
    }
    m->nodes[m->n_nodes] = (struct gm_node){pos, parent, depth, 0};
    m->node_hash[h] = m->n_nodes;
    return m->n_nodes++;
}

static bool seen(struct grammar_matcher *m, uint32_t node)
{
    if (m->nodes[node].stamp == m->stamp) return true;
    m->nodes[node].stamp = m->stamp;
    return false;
}

static bool work_push(struct grammar_matcher *m, uint32_t *n, uint32_t pos, uint32_t parent)
{
    if (!grow(m, (void **)&m->work, &m->cap_work, *n + 2, sizeof *m->work)) return false;
    m->work[(*n)++] = pos;
    m->work[(*n)++] = parent;
    return true;
}

/* Adds to m->out the ready nodes reachable from (pos, parent) and sets
 * *accept when a stack runs out; nodes stamped this round are skipped.
 * false: out of memory. */
static bool expand(struct grammar_matcher *m, uint32_t pos0, uint32_t parent0, bool *accept)
{
    const struct grammar *g = m->g;
    uint32_t nw = 0;
    if (!work_push(m, &nw, pos0, parent0)) return false;
    while (nw) {
        uint32_t parent = m->work[--nw], pos = m->work[--nw];
        for (;;) {
            const struct grammar_elem e = g->elems[pos];
            if (e.type == GE_END || e.type == GE_ALT) {
                if (parent == GM_NIL) {
                    *accept = true;
                    break;
                }
                pos = m->nodes[parent].pos; /* a REF's continuation or a byte set: the next turn dedupes it */
                parent = m->nodes[parent].parent;
                continue;
            }
            const uint32_t n = node_get(m, pos, parent);
            if (n == GM_NIL || seen(m, n)) break; /* too deep (or no memory), or done already */
            if (e.type == GE_BYTES) {
                if (!grow(m, (void **)&m->out, &m->cap_out, m->n_out + 1, sizeof *m->out)) return false;
                m->out[m->n_out++] = n;
                break;
            }
            const struct grammar_elem nx = g->elems[pos + 1];
            uint32_t cont = parent;
            if (nx.type != GE_END && nx.type != GE_ALT && (cont = node_get(m, pos + 1, parent)) == GM_NIL) break;
            for (uint32_t a = g->rule_start[e.val];; a++) {
                if (a == g->rule_start[e.val] || g->elems[a - 1].type == GE_ALT)
                    if (!work_push(m, &nw, a, cont)) return false;
                if (g->elems[a].type == GE_END) break;
            }
            break;
        }
    }
    return true;
}

static int cmp_u32(const void *x, const void *y)
{
    const uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

static uint32_t state_key(const struct grammar_matcher *m, uint32_t i)
{
    const struct gm_state *s = &m->states[i];
    uint32_t h = s->accept ? 0x51ed27u : 0x1234567u;
    for (uint32_t k = 0; k < s->n; k++) h = hash2(h, m->pool[s->off + k]);
    return h;
}

/* Interns the state of m->out[0 .. n_out) and accept; GM_DEAD when empty,
 * over GRAMMAR_MAX_STACKS or out of memory. */
static uint32_t state_intern(struct grammar_matcher *m, bool accept)
{
    const uint32_t n = m->n_out;
    if (n > GRAMMAR_MAX_STACKS) m->hit |= GM_HIT_STACKS;
    if ((n == 0 && !accept) || n > GRAMMAR_MAX_STACKS) return GM_DEAD;
    if (n) qsort(m->out, n, sizeof *m->out, cmp_u32);
    uint32_t h = accept ? 0x51ed27u : 0x1234567u;
    for (uint32_t k = 0; k < n; k++) h = hash2(h, m->out[k]);
    if (2 * (m->n_states + 1) > m->state_hash_cap &&
        !rehash(m, &m->state_hash, &m->state_hash_cap, m->n_states, state_key)) {
        m->hit |= GM_HIT_NOMEM;
        return GM_DEAD;
    }
    const uint32_t mask = m->state_hash_cap - 1;
    uint32_t slot = h & mask;
    for (; m->state_hash[slot] != GM_NIL; slot = (slot + 1) & mask) {
        const struct gm_state *s = &m->states[m->state_hash[slot]];
        if (s->n == n && s->accept == accept && (n == 0 || !memcmp(m->pool + s->off, m->out, sizeof *m->out * n)))
            return m->state_hash[slot];
    }
    if (!grow(m, (void **)&m->states, &m->cap_states, m->n_states + 1, sizeof *m->states) ||
        !grow(m, (void **)&m->pool, &m->cap_pool, m->n_pool + n, sizeof *m->pool)) {
        m->hit |= GM_HIT_NOMEM;
        return GM_DEAD;
    }
    if (n) memcpy(m->pool + m->n_pool, m->out, sizeof *m->out * n);
    m->states[m->n_states] = (struct gm_state){.off = m->n_pool, .n = n, .accept = accept};
    m->n_pool += n;
    m->state_hash[slot] = m->n_states;
    return m->n_states++;
}

uint32_t gm_step(struct grammar_matcher *m, uint32_t s, uint8_t b)
{
    if (m->states[s].next && m->states[s].next[b] != GM_UNKNOWN) return m->states[s].next[b];
    const struct grammar *g = m->g;
    m->stamp++;
    m->n_out = 0;
    bool accept = false, ok = true;
    for (uint32_t k = 0; k < m->states[s].n && ok; k++) {
        const struct gm_node nd = m->nodes[m->pool[m->states[s].off + k]];
        const uint64_t *set = g->sets[g->elems[nd.pos].val];
        if (set[b >> 6] >> (b & 63) & 1) ok = expand(m, nd.pos + 1, nd.parent, &accept);
    }
    const uint32_t r = ok ? state_intern(m, accept) : GM_DEAD;
    if (!ok) return GM_DEAD; /* out of memory: not memoised, the next ask may fare better */
    if (!m->states[s].next) {
        uint32_t *row = kvb_malloc(sizeof *row * 256);
        if (!row) return r;
        for (int i = 0; i < 256; i++) row[i] = GM_UNKNOWN;
        m->states[s].next = row;
        m->bytes += sizeof *row * 256;
    }
    m->states[s].next[b] = r;
    return r;
}

/* The start state; GM_DEAD only when out of memory. */
static uint32_t start_state(struct grammar_matcher *m)
{
    m->stamp++;
    m->n_out = 0;
    bool accept = false;
    for (uint32_t a = m->g->rule_start[m->g->root];; a++) {
        if (a == m->g->rule_start[m->g->root] || m->g->elems[a - 1].type == GE_ALT)
            if (!expand(m, a, GM_NIL, &accept)) {
                m->hit |= GM_HIT_NOMEM;
                return GM_DEAD;
            }
        if (m->g->elems[a].type == GE_END) break;
    }
    return state_intern(m, accept);
}

static void drop_tables(struct grammar_matcher *m)
{
    for (uint32_t i = 0; i < m->n_states; i++) {
        kvb_free(m->states[i].next);
        kvb_free(m->states[i].mask);
    }
    kvb_free(m->nodes);
    kvb_free(m->node_hash);
    kvb_free(m->states);
    kvb_free(m->state_hash);
    kvb_free(m->pool);
    m->nodes = NULL;
    m->node_hash = m->state_hash = m->pool = NULL;
    m->states = NULL;
    m->n_nodes = m->cap_nodes = m->node_hash_cap = 0;
    m->n_states = m->cap_states = m->state_hash_cap = 0;
    m->n_pool = m->cap_pool = 0;
    m->bytes = (size_t)(m->cap_work + m->cap_out + m->cap_walk) * sizeof(uint32_t);
}

void gm_maybe_flush(struct grammar_matcher *m)
{
    if (m->bytes <= m->cache_cap || m->dead) return;
    /* Keep the current state's stacks as position lists, bottom first. */
    const struct gm_state cur = m->states[m->cur];
    size_t total = 0;
    for (uint32_t k = 0; k < cur.n; k++) total += m->nodes[m->pool[cur.off + k]].depth + 1;
    uint32_t *save = kvb_malloc(sizeof *save * (total + 1));
    if (!save) return; /* keep going over budget rather than lose the state */
    size_t w = 0;
    for (uint32_t k = 0; k < cur.n; k++) {
        uint32_t n = m->pool[cur.off + k];
        const uint32_t d = m->nodes[n].depth;
        save[w] = d;
        for (uint32_t i = d; i >= 1; i--, n = m->nodes[n].parent) save[w + i] = m->nodes[n].pos;
        w += d + 1;
    }
    const bool accept = cur.accept;
    drop_tables(m);
    m->st.flushes++;
    m->n_out = 0;
    bool ok = true;
    for (size_t r = 0; r < w && ok; r += save[r] + 1) {
        uint32_t n = GM_NIL;
        for (uint32_t i = 1; i <= save[r] && ok; i++) ok = (n = node_get(m, save[r + i], n)) != GM_NIL;
        ok = ok && grow(m, (void **)&m->out, &m->cap_out, m->n_out + 1, sizeof *m->out);
        if (ok) m->out[m->n_out++] = n;
    }
    kvb_free(save);
    m->cur = ok ? state_intern(m, accept) : GM_DEAD;
    if (m->cur == GM_DEAD) m->dead = true; /* out of memory: end the output rather than break the grammar */
}

enum kvb_status grammar_matcher_create(const struct grammar *g, const struct grammar_vocab *v,
                                       struct grammar_matcher **out)
{
    *out = NULL;
    if (!g) return KVB_ERR_INVALID_ARG;
    struct grammar_matcher *m = kvb_calloc(1, sizeof *m);
    if (!m) return KVB_ERR_NOMEM;
    m->g = g;
    m->v = v;
    m->cache_cap = GRAMMAR_CACHE_BYTES;
    m->cur = start_state(m);
    if (m->cur == GM_DEAD) {
        /* grammar_compile checked the start: only memory can fail here */
        const enum kvb_status st = m->hit & GM_HIT_NOMEM ? KVB_ERR_NOMEM : KVB_ERR_RANGE;
        grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return KVB_OK;
}

enum kvb_status gm_check_start(const struct grammar *g, char *msg, size_t cap)
{
    struct grammar_matcher *m = kvb_calloc(1, sizeof *m);
    if (!m) return KVB_ERR_NOMEM;
    m->g = g;
    m->cache_cap = GRAMMAR_CACHE_BYTES;
    const uint32_t s = start_state(m);
    const uint8_t hit = m->hit;
    grammar_matcher_free(m);
    if (hit & GM_HIT_NOMEM) {
        if (msg && cap) snprintf(msg, cap, "out of memory compiling the grammar");
        return KVB_ERR_NOMEM;
    }
    if (hit & GM_HIT_DEPTH) {
        if (msg && cap)
            snprintf(msg, cap,
                     "grammar: rules nest more than %d deep before the first character (each rule's first item "
                     "another rule): the recogniser's limit",
                     GRAMMAR_MAX_DEPTH);
        return KVB_ERR_FORMAT;
    }
    if (hit & GM_HIT_STACKS) {
        if (msg && cap)
            snprintf(msg, cap,
                     "grammar: more than %d alternatives are open at its start (the recogniser's limit); "
                     "factor common parts out of the alternatives",
                     GRAMMAR_MAX_STACKS);
        return KVB_ERR_FORMAT;
    }
    if (s == GM_DEAD) { /* cannot be, after the productivity check: said rather than assumed */
        if (msg && cap) snprintf(msg, cap, "grammar: it matches no string");
        return KVB_ERR_FORMAT;
    }
    return KVB_OK;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    if (!m) return;
    drop_tables(m);
    kvb_free(m->work);
    kvb_free(m->out);
    kvb_free(m->walk);
    kvb_free(m);
}

void grammar_matcher_set_cache_bytes(struct grammar_matcher *m, size_t cap) { m->cache_cap = cap; }

void grammar_matcher_reset(struct grammar_matcher *m)
{
    m->dead = false;
    uint32_t s = start_state(m); /* interned already: a lookup */
    if (s == GM_DEAD) {
        m->dead = true;
        return;
    }
    m->cur = s;
}

bool grammar_matcher_feed(struct grammar_matcher *m, const char *bytes, size_t n)
{
    if (m->dead) return false;
    gm_maybe_flush(m);
    uint32_t s = m->cur;
    for (size_t i = 0; i < n; i++)
        if ((s = gm_step(m, s, (uint8_t)bytes[i])) == GM_DEAD) return false;
    m->cur = s;
    return true;
}

bool grammar_matcher_complete(const struct grammar_matcher *m) { return !m->dead && m->states[m->cur].accept; }

enum grammar_match grammar_check(const struct grammar *g, const char *s, size_t n)
{
    struct grammar_matcher *m;
    if (grammar_matcher_create(g, NULL, &m) != KVB_OK) return GRAMMAR_NONE;
    enum grammar_match r = !grammar_matcher_feed(m, s, n) ? GRAMMAR_NONE
                           : grammar_matcher_complete(m)  ? GRAMMAR_FULL
                                                          : GRAMMAR_PREFIX;
    grammar_matcher_free(m);
    return r;
}

void grammar_matcher_stats(const struct grammar_matcher *m, struct grammar_stats *out)
{
    *out = m->st;
    out->states = m->n_states;
    out->cache_bytes = m->bytes;
}
