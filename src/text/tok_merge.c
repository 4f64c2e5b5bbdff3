/* tok_merge.c — see tok_merge.h. */
#include "text/tok_merge.h"

#include "base/alloc.h"
#include "base/unicode.h"

/* Merges between two looks at the cancel flag. */
#define POLL_EVERY 4096

/* The order of the heap: the least key, then the leftmost symbol. The key
 * sits in the entry so that a sift reads one array, not the symbols. */
static bool before(struct tok_merge_pair a, struct tok_merge_pair b)
{
    return a.key < b.key || (a.key == b.key && a.sym < b.sym);
}

static void place(struct tok_merge *m, int32_t at, struct tok_merge_pair e)
{
    m->heap[at] = e;
    m->sym[e.sym].hpos = at;
}

/* A 4-ary heap: half the levels of a binary one, and the four children
 * of a node share a cache line, which matters once a word's heap is far
 * larger than the caches. */
#define ARITY 4

static void sift_up(struct tok_merge *m, int32_t at)
{
    const struct tok_merge_pair e = m->heap[at];
    while (at > 0) {
        int32_t parent = (at - 1) / ARITY;
        if (!before(e, m->heap[parent])) break;
        place(m, at, m->heap[parent]);
        at = parent;
    }
    place(m, at, e);
}

static void sift_down(struct tok_merge *m, int32_t at)
{
    const struct tok_merge_pair e = m->heap[at];
    for (;;) {
        const int32_t first = ARITY * at + 1;
        if (first >= m->heap_n) break;
        const int32_t last = first + ARITY <= m->heap_n ? first + ARITY : m->heap_n;
        int32_t c = first;
        for (int32_t k = first + 1; k < last; k++)
            if (before(m->heap[k], m->heap[c])) c = k;
        if (!before(m->heap[c], e)) break;
        place(m, at, m->heap[c]);
        at = c;
    }
    place(m, at, e);
}

static void heap_remove(struct tok_merge *m, int32_t sym)
{
    int32_t at = m->sym[sym].hpos;
    if (at < 0) return;
    m->sym[sym].hpos = -1;
    const struct tok_merge_pair last = m->heap[--m->heap_n];
    if (at == m->heap_n) return;
    place(m, at, last);
    if (at > 0 && before(last, m->heap[(at - 1) / ARITY])) sift_up(m, at);
    else sift_down(m, at);
}

/* Keys the pair that starts at symbol i anew (its right neighbour changed). */
static void rekey(struct tok_merge *m, int32_t i, tok_merge_key_fn key_of, void *user)
{
    const int32_t r = m->sym[i].next;
    uint32_t k;
    if (r < 0 || !key_of(user, i, r, tok_merge_end(m, r), &k)) {
        heap_remove(m, i);
        return;
    }
    int32_t at = m->sym[i].hpos;
    if (at < 0) {
        at = m->heap_n++;
        m->heap[at] = (struct tok_merge_pair){k, i};
        sift_up(m, at);
        return;
    }
    const uint32_t old = m->heap[at].key;
    m->heap[at].key = k;
    if (k < old) sift_up(m, at);
    else if (k > old) sift_down(m, at);
}

static enum kvb_status grow(struct tok_merge *m, size_t n)
{
    if (n <= m->cap) return KVB_OK;
    /* Doubling keeps a run of ever longer words linear; the pages a word
     * does not reach are never touched, so they cost address space only. */
    size_t nc = n > 2 * m->cap ? n : 2 * m->cap;
    if (nc > (size_t)INT32_MAX) nc = n;
    struct tok_merge_sym *ns = kvb_realloc(m->sym, nc * sizeof *ns);
    if (!ns) return KVB_ERR_NOMEM;
    m->sym = ns;
    struct tok_merge_pair *nh = kvb_realloc(m->heap, nc * sizeof *nh);
    if (!nh) return KVB_ERR_NOMEM; /* sym is larger than cap says: harmless */
    m->heap = nh;
    m->cap = nc;
    return KVB_OK;
}

enum kvb_status tok_merge_start(struct tok_merge *m, const char *word, size_t n, bool utf8)
{
    if (n == 0 || n > (size_t)INT32_MAX) return KVB_ERR_RANGE;
    KVB_FORWARD_IF_ERROR(grow(m, n));
    m->n = (int32_t)n;
    m->heap_n = 0;
    int32_t prev = -1;
    for (size_t off = 0; off < n;) {
        size_t cl = utf8 ? unicode_utf8_len((unsigned char)word[off]) : 1;
        if (cl > n - off) cl = n - off;
        m->sym[off].prev = prev;
        m->sym[off].hpos = -1;
        if (prev >= 0) m->sym[prev].next = (int32_t)off;
        prev = (int32_t)off;
        off += cl;
    }
    m->sym[prev].next = -1;
    return KVB_OK;
}

enum kvb_status tok_merge_run(struct tok_merge *m, tok_merge_key_fn key_of, void *user, const struct tok_limits *lim)
{
    const volatile sig_atomic_t *cancel = lim ? lim->cancel : NULL;
    /* Every pair keyed, then the heap built bottom-up in linear time. */
    uint32_t work = 0;
    for (int32_t i = 0; m->sym[i].next >= 0; i = m->sym[i].next) {
        const int32_t r = m->sym[i].next;
        uint32_t k;
        if (key_of(user, i, r, tok_merge_end(m, r), &k)) place(m, m->heap_n++, (struct tok_merge_pair){k, i});
        if (++work % (POLL_EVERY * 16) == 0 && cancel && *cancel) return KVB_ERR_CANCELLED;
    }
    for (int32_t at = m->heap_n > 1 ? (m->heap_n - 2) / ARITY : -1; at >= 0; at--) sift_down(m, at);

    work = 0;
    while (m->heap_n > 0) {
        if (++work % POLL_EVERY == 0 && cancel && *cancel) return KVB_ERR_CANCELLED;
        const int32_t l = m->heap[0].sym, r = m->sym[l].next;
        heap_remove(m, r); /* the pair right of r is gone with it */
        const int32_t rn = m->sym[r].next;
        m->sym[l].next = rn;
        if (rn >= 0) m->sym[rn].prev = l;
        rekey(m, l, key_of, user);
        if (m->sym[l].prev >= 0) rekey(m, m->sym[l].prev, key_of, user);
    }
    return KVB_OK;
}

void tok_merge_free(struct tok_merge *m)
{
    if (!m) return;
    kvb_free(m->sym);
    kvb_free(m->heap);
    *m = (struct tok_merge){0};
}
