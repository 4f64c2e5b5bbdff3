/* kv.c — refcounted KV block ids with a free stack and, for models with
 * sliding-window layers, the pages behind each block (see kv.h). */
#include "engine/kv.h"

#include "base/alloc.h"

struct kv_alloc {
    int32_t n;
    int32_t *refs;     /* (n) */
    bool *cached;      /* (n) */
    int32_t *free_ids; /* stack of FREE ids */
    int32_t n_free;
    /* Pages (G > 1 only). */
    int32_t G, n_global, n_pages;
    int32_t *pages;      /* (n, G) each block's pages, -1: none */
    int32_t *free_pages; /* stack of free pages */
    int32_t n_free_pages;
    int32_t *wref;       /* (n) holders of the window part */
    bool *win;           /* (n) the window part is there */
    int32_t *prev, *nxt; /* (n) the loose list, least recently loosened first */
    int32_t head, tail, n_loose;
    void (*map)(void *arg, int32_t block, const int32_t *pages);
    void *map_arg;
};

static enum kvb_status create(int32_t n_blocks, struct kv_alloc **out)
{
    if (n_blocks <= 0) return KVB_ERR_INVALID_ARG;
    struct kv_alloc *a = kvb_calloc(1, sizeof *a);
    if (!a) return KVB_ERR_NOMEM;
    a->n = n_blocks;
    a->G = 1;
    a->head = a->tail = -1;
    a->refs = kvb_calloc((size_t)n_blocks, sizeof *a->refs);
    a->cached = kvb_calloc((size_t)n_blocks, sizeof *a->cached);
    a->free_ids = kvb_calloc((size_t)n_blocks, sizeof *a->free_ids);
    if (!a->refs || !a->cached || !a->free_ids) {
        kv_alloc_free(a);
        return KVB_ERR_NOMEM;
    }
    /* Low ids on top so a fresh pool hands out 0, 1, 2, …: easier to read in logs. */
    for (int32_t i = 0; i < n_blocks; i++) a->free_ids[i] = n_blocks - 1 - i;
    a->n_free = n_blocks;
    *out = a;
    return KVB_OK;
}

enum kvb_status kv_alloc_create(int32_t n_blocks, struct kv_alloc **out) { return create(n_blocks, out); }

enum kvb_status kv_alloc_create_paged(int32_t n_blocks, int32_t n_pages, int32_t n_groups, int32_t n_global,
                                      void (*map)(void *arg, int32_t block, const int32_t *pages), void *arg,
                                      struct kv_alloc **out)
{
    if (n_groups < 2 || n_global < 0 || n_global >= n_groups || n_pages < n_groups || !map) return KVB_ERR_INVALID_ARG;
    struct kv_alloc *a;
    KVB_FORWARD_IF_ERROR(create(n_blocks, &a));
    a->G = n_groups;
    a->n_global = n_global;
    a->n_pages = n_pages;
    a->map = map;
    a->map_arg = arg;
    a->pages = kvb_malloc(sizeof *a->pages * (size_t)n_blocks * (size_t)n_groups);
    a->free_pages = kvb_malloc(sizeof *a->free_pages * (size_t)n_pages);
    a->wref = kvb_calloc((size_t)n_blocks, sizeof *a->wref);
    a->win = kvb_calloc((size_t)n_blocks, sizeof *a->win);
    a->prev = kvb_malloc(sizeof *a->prev * (size_t)n_blocks);
    a->nxt = kvb_malloc(sizeof *a->nxt * (size_t)n_blocks);
    if (!a->pages || !a->free_pages || !a->wref || !a->win || !a->prev || !a->nxt) {
        kv_alloc_free(a);
        return KVB_ERR_NOMEM;
    }
    for (int64_t i = 0; i < (int64_t)n_blocks * n_groups; i++) a->pages[i] = -1;
    for (int32_t i = 0; i < n_pages; i++) a->free_pages[i] = n_pages - 1 - i;
    a->n_free_pages = n_pages;
    for (int32_t i = 0; i < n_blocks; i++) a->prev[i] = a->nxt[i] = -1;
    *out = a;
    return KVB_OK;
}

void kv_alloc_free(struct kv_alloc *a)
{
    if (!a) return;
    kvb_free(a->refs);
    kvb_free(a->cached);
    kvb_free(a->free_ids);
    kvb_free(a->pages);
    kvb_free(a->free_pages);
    kvb_free(a->wref);
    kvb_free(a->win);
    kvb_free(a->prev);
    kvb_free(a->nxt);
    kvb_free(a);
}

int32_t kv_n_free(const struct kv_alloc *a)
{
    if (a->G == 1) return a->n_free;
    const int32_t by_pages = a->n_free_pages / a->G;
    return a->n_free < by_pages ? a->n_free : by_pages;
}

bool kv_paged(const struct kv_alloc *a) { return a->G > 1; }

static void tell_map(struct kv_alloc *a, int32_t id) { a->map(a->map_arg, id, a->pages + (int64_t)id * a->G); }

static void loose_unlink(struct kv_alloc *a, int32_t id)
{
    if (a->prev[id] >= 0) a->nxt[a->prev[id]] = a->nxt[id];
    else a->head = a->nxt[id];
    if (a->nxt[id] >= 0) a->prev[a->nxt[id]] = a->prev[id];
    else a->tail = a->prev[id];
    a->prev[id] = a->nxt[id] = -1;
    a->n_loose--;
}

/* Gives the pages of groups [g0, G) of id back to the pool. */
static void free_pages_of(struct kv_alloc *a, int32_t id, int32_t g0)
{
    for (int32_t g = g0; g < a->G; g++) {
        int32_t *p = &a->pages[(int64_t)id * a->G + g];
        if (*p >= 0) a->free_pages[a->n_free_pages++] = *p;
        *p = -1;
    }
}

/* A block nobody holds or caches: its id and pages are free. */
static void release(struct kv_alloc *a, int32_t id)
{
    a->free_ids[a->n_free++] = id;
    if (a->G == 1) return;
    if (a->win[id] && a->wref[id] == 0) loose_unlink(a, id);
    a->win[id] = false;
    a->wref[id] = 0;
    free_pages_of(a, id, 0);
    tell_map(a, id);
}

int32_t kv_take(struct kv_alloc *a)
{
    if (a->n_free == 0 || (a->G > 1 && a->n_free_pages < a->G)) return -1;
    int32_t id = a->free_ids[--a->n_free];
    a->refs[id] = 1;
    a->cached[id] = false;
    if (a->G > 1) {
        for (int32_t g = 0; g < a->G; g++) a->pages[(int64_t)id * a->G + g] = a->free_pages[--a->n_free_pages];
        a->win[id] = true;
        a->wref[id] = 1;
        tell_map(a, id);
    }
    return id;
}

void kv_ref(struct kv_alloc *a, int32_t id) { a->refs[id]++; }

void kv_unref(struct kv_alloc *a, int32_t id)
{
    if (a->refs[id] <= 0) return; /* a double release is a caller bug; never corrupt the stack */
    if (--a->refs[id] == 0 && !a->cached[id]) release(a, id);
}

int32_t kv_refcount(const struct kv_alloc *a, int32_t id) { return a->refs[id]; }

void kv_set_cached(struct kv_alloc *a, int32_t id, bool cached)
{
    if (a->cached[id] == cached) return;
    a->cached[id] = cached;
    if (!cached && a->refs[id] == 0) release(a, id);
}

bool kv_window(const struct kv_alloc *a, int32_t id) { return a->G == 1 || a->win[id]; }

void kv_window_hold(struct kv_alloc *a, int32_t id)
{
    if (a->G == 1 || !a->win[id]) return; /* holding what is not there is a caller bug */
    if (a->wref[id]++ == 0) loose_unlink(a, id);
}

void kv_window_drop(struct kv_alloc *a, int32_t id)
{
    if (a->G == 1 || !a->win[id] || a->wref[id] <= 0) return;
    if (--a->wref[id] > 0) return;
    a->prev[id] = a->tail;
    a->nxt[id] = -1;
    if (a->tail >= 0) a->nxt[a->tail] = id;
    else a->head = id;
    a->tail = id;
    a->n_loose++;
}

int32_t kv_evict_windows(struct kv_alloc *a, int32_t want_free)
{
    int32_t n = 0;
    if (a->n_free < want_free) return 0; /* short of ids, not pages: only the tree's eviction helps */
    while (a->G > 1 && kv_n_free(a) < want_free && a->head >= 0) {
        const int32_t id = a->head;
        loose_unlink(a, id);
        a->win[id] = false;
        free_pages_of(a, id, a->n_global);
        tell_map(a, id);
        n++;
    }
    return n;
}

int32_t kv_n_loose(const struct kv_alloc *a) { return a->n_loose; }

int32_t kv_pages_used(const struct kv_alloc *a) { return a->G == 1 ? a->n - a->n_free : a->n_pages - a->n_free_pages; }
