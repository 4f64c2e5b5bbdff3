/* kv.c — refcounted KV block ids with a free stack (see kv.h). */
#include "engine/kv.h"

#include "base/alloc.h"

struct kv_alloc {
    int32_t n;
    int32_t *refs;     /* (n) */
    bool *cached;      /* (n) */
    int32_t *free_ids; /* stack of FREE ids */
    int32_t n_free;
};

enum kvb_status kv_alloc_create(int32_t n_blocks, struct kv_alloc **out)
{
    if (n_blocks <= 0) return KVB_ERR_INVALID_ARG;
    struct kv_alloc *a = kvb_calloc(1, sizeof *a);
    if (!a) return KVB_ERR_NOMEM;
    a->n = n_blocks;
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

void kv_alloc_free(struct kv_alloc *a)
{
    if (!a) return;
    kvb_free(a->refs);
    kvb_free(a->cached);
    kvb_free(a->free_ids);
    kvb_free(a);
}

int32_t kv_n_free(const struct kv_alloc *a) { return a->n_free; }

int32_t kv_take(struct kv_alloc *a)
{
    if (a->n_free == 0) return -1;
    int32_t id = a->free_ids[--a->n_free];
    a->refs[id] = 1;
    a->cached[id] = false;
    return id;
}

void kv_ref(struct kv_alloc *a, int32_t id) { a->refs[id]++; }

void kv_unref(struct kv_alloc *a, int32_t id)
{
    if (a->refs[id] <= 0) return; /* a double release is a caller bug; never corrupt the stack */
    if (--a->refs[id] == 0 && !a->cached[id]) a->free_ids[a->n_free++] = id;
}

int32_t kv_refcount(const struct kv_alloc *a, int32_t id) { return a->refs[id]; }

void kv_set_cached(struct kv_alloc *a, int32_t id, bool cached)
{
    if (a->cached[id] == cached) return;
    a->cached[id] = cached;
    if (!cached && a->refs[id] == 0) a->free_ids[a->n_free++] = id;
}
