/* tok_heap.c — see tok_heap.h. */
#include "tok_heap.h"

#include "alloc.h"

static bool before(const struct tok_bigram *a, const struct tok_bigram *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

enum kvb_status tok_heap_push(struct tok_heap *h, struct tok_bigram b)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        struct tok_bigram *nv = kvb_realloc(h->v, nc * sizeof *nv);
        if (!nv) return KVB_ERR_NOMEM;
        h->v = nv;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&b, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
    return KVB_OK;
}

bool tok_heap_pop(struct tok_heap *h, struct tok_bigram *out)
{
    if (h->n == 0) return false;
    *out = h->v[0];
    struct tok_bigram last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;
        if (!before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return true;
}

void tok_heap_free(struct tok_heap *h)
{
    if (!h) return;
    kvb_free(h->v);
    *h = (struct tok_heap){0};
}
