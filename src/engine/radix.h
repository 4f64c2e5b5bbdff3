/* radix.h — the in-run prefix cache: a tree whose edges are full blocks of
 * token ids and whose nodes name the KV block holding those tokens' K/V.
 *
 * A request walks the tree with its prompt; every full block that matches is
 * reused (a reference is taken on its KV block) and only the rest is
 * prefilled. Blocks computed by a request are inserted when they are full, so
 * requests that run later — or concurrently, a step behind — share them.
 * Blocks no sequence holds stay in the tree and are evicted least recently
 * used, leaves first (a block is never evicted while a descendant remains,
 * so every cached path is whole).
 *
 * Ownership: borrows the kv_alloc (which must outlive it); block ids are
 * the allocator's. Not thread-safe: the scheduler owns it. */
#ifndef KVB_RADIX_H
#define KVB_RADIX_H

#include <stdint.h>

#include "base/status.h"
#include "engine/kv.h"

struct radix;

enum kvb_status radix_create(int32_t block_size, struct kv_alloc *kv, struct radix **out);
void radix_free(struct radix *r); /* accepts NULL; leaves block refcounts as they are */

/* Longest cached prefix of tokens[0..n), in whole blocks, at most max_blocks.
 * Writes the matched block ids to blocks_out, takes one reference on each
 * and marks them recently used; returns how many matched. */
int32_t radix_match(struct radix *r, const int32_t *tokens, int32_t n, int32_t *blocks_out, int32_t max_blocks);

/* Same walk without taking references or touching recency. */
int32_t radix_peek(const struct radix *r, const int32_t *tokens, int32_t n);

/* The block ids the tree names for the first n_blocks full blocks of
 * tokens, as far as it has them (no references, no recency): how many. */
int32_t radix_blocks(const struct radix *r, const int32_t *tokens, int32_t n_blocks, int32_t *blocks_out);

/* Registers the first n_blocks full blocks of tokens, held in block_ids
 * (block i holds tokens [i*B, (i+1)*B)). Blocks already in the tree are left
 * as they are (the caller's duplicate simply stays uncached). Returns
 * KVB_ERR_NOMEM only on allocation failure (the tree stays consistent). */
enum kvb_status radix_insert(struct radix *r, const int32_t *tokens, int32_t n_blocks, const int32_t *block_ids);

/* Evicts unreferenced cached blocks, least recently used leaves first, until
 * the allocator has at least `want_free` free blocks or nothing more can go.
 * Returns the number of blocks evicted. */
int32_t radix_evict(struct radix *r, int32_t want_free);

int32_t radix_n_cached(const struct radix *r); /* blocks named by the tree */

#endif
