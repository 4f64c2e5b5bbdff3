/* kv.h — the KV block allocator: which of the backend's n_blocks are free,
 * and how many sequences hold each one.
 *
 * A block id is either FREE (on the free list), or HELD (refcount > 0: one or
 * more sequences' block tables name it), or CACHED (refcount 0 but still
 * named by the radix tree, so a later request may take it back). Only FREE
 * blocks are handed out; turning CACHED blocks into FREE ones is the radix
 * tree's eviction (radix.h), which calls kv_release. The storage itself
 * belongs to the backend; this module only counts.
 *
 * Not thread-safe: the scheduler owns it. */
#ifndef KVB_KV_H
#define KVB_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

struct kv_alloc;

enum kvb_status kv_alloc_create(int32_t n_blocks, struct kv_alloc **out);
void kv_alloc_free(struct kv_alloc *a); /* accepts NULL */

int32_t kv_n_free(const struct kv_alloc *a);

/* Takes a FREE block (refcount becomes 1, not cached); -1 when none is free. */
int32_t kv_take(struct kv_alloc *a);
void kv_ref(struct kv_alloc *a, int32_t id);
/* Drops one reference. At zero the block becomes FREE unless it is cached. */
void kv_unref(struct kv_alloc *a, int32_t id);
int32_t kv_refcount(const struct kv_alloc *a, int32_t id);

/* Marks a block as named by the radix tree (kept at refcount 0). */
void kv_set_cached(struct kv_alloc *a, int32_t id, bool cached);

#endif
