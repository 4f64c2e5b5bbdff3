/* kv.h — the KV block allocator: which of the backend's blocks are free,
 * how many sequences hold each one and, for a model with sliding-window
 * layers, which pages each block has.
 *
 * A block id is either FREE (on the free list), or HELD (refcount > 0: one or
 * more sequences' block tables name it), or CACHED (refcount 0 but still
 * named by the radix tree, so a later request may take it back). Only FREE
 * blocks are handed out; turning CACHED blocks into FREE ones is the radix
 * tree's eviction (radix.h), which calls kv_set_cached. The storage itself
 * belongs to the backend; this module only counts.
 *
 * Pages (backend.h's paging: kv_alloc_create_paged). A block is then
 * n_groups pages of the backend's pool: its global part (groups
 * [0, n_global): the full-attention layers) for as long as the block lives,
 * and its window part (the other groups: the windowed layers) for as long as
 * some sequence's window reaches the block — a sequence holds it
 * (kv_window_hold) from when it takes or reuses the block until its window
 * has moved past (kv_window_drop) — or until it is evicted: a window part
 * nobody holds is LOOSE, still there for a later request that extends the
 * prefix at that point, and taken back, least recently loosened first, when
 * pages run short (kv_evict_windows). Every change of a block's pages is
 * told to the backend through the map callback. Without pages a block is
 * its own storage and the window calls change nothing.
 *
 * Not thread-safe: the scheduler owns it. */
#ifndef KVB_KV_H
#define KVB_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

struct kv_alloc;

/* n_blocks blocks, each its own storage. */
enum kvb_status kv_alloc_create(int32_t n_blocks, struct kv_alloc **out);

/* Block ids [0, n_blocks) over n_pages pages, a block being n_groups pages
 * of which [n_global, n_groups) are its window part (n_global <
 * n_groups). map(arg, block, pages) is called with a block's n_groups page
 * ids (-1: none) whenever they change; the callee copies them. */
enum kvb_status kv_alloc_create_paged(int32_t n_blocks, int32_t n_pages, int32_t n_groups, int32_t n_global,
                                      void (*map)(void *arg, int32_t block, const int32_t *pages), void *arg,
                                      struct kv_alloc **out);
void kv_alloc_free(struct kv_alloc *a); /* accepts NULL */

/* Blocks kv_take can hand out now, without evicting anything. */
int32_t kv_n_free(const struct kv_alloc *a);

/* Takes a FREE block with all its pages (refcount 1, not cached, its window
 * part held once); -1 when there is no id or not enough free pages. */
int32_t kv_take(struct kv_alloc *a);
void kv_ref(struct kv_alloc *a, int32_t id);
/* Drops one reference. At zero the block becomes FREE unless it is cached;
 * a FREE block's pages go back to the pool. */
void kv_unref(struct kv_alloc *a, int32_t id);
int32_t kv_refcount(const struct kv_alloc *a, int32_t id);

/* Marks a block as named by the radix tree (kept at refcount 0). */
void kv_set_cached(struct kv_alloc *a, int32_t id, bool cached);

/* Whether the allocator has pages (window parts) at all. */
bool kv_paged(const struct kv_alloc *a);
/* Whether block id has its window part (always, without pages). */
bool kv_window(const struct kv_alloc *a, int32_t id);
/* One more / one fewer holder of id's window part (which must be there to
 * be held). A part that loses its last holder is LOOSE. */
void kv_window_hold(struct kv_alloc *a, int32_t id);
void kv_window_drop(struct kv_alloc *a, int32_t id);
/* Frees LOOSE window parts, least recently loosened first, until kv_n_free
 * reaches want_free or none is left; returns how many were freed. */
int32_t kv_evict_windows(struct kv_alloc *a, int32_t want_free);
/* LOOSE window parts (each worth n_groups - n_global pages). */
int32_t kv_n_loose(const struct kv_alloc *a);
/* Pages in use (held, cached or loose), for reports. */
int32_t kv_pages_used(const struct kv_alloc *a);

#endif
