/* sched_store.h — the scheduler's traffic with the persistent store: loading
 * stored prompt blocks into KV blocks, and spilling computed ones.
 *
 * Both go through host staging memory from the backend (be_host_alloc:
 * page-locked on a GPU). Where the backend copies blocks asynchronously
 * (backend.kv_read_async and friends), the copies run beside compute:
 *
 *   spill: the block is copied out on the backend's copy queue while the
 *     next forward pass runs; sstore_after_step, called once that pass
 *     has returned, waits for the copies (long done by then) and lends the
 *     buffers to the store (pstore_put_borrowed: no copy on this thread),
 *     whose writer hands them back once compressed. Until the hand-over
 *     the block is held (kv_ref), so no eviction can hand it to a sequence
 *     that would overwrite it.
 *   load: the store's values are decompressed into staging, and the copies
 *     into the pool are queued; the next forward pass waits for them on the
 *     device, not the host, so decoding the next sequence's blocks overlaps
 *     them. Staging is a ring: a load reuses memory only after
 *     sstore_after_step (or, when the ring is full, after waiting).
 *
 * Without those hooks the copies are kv_block_read/write and return when
 * done; spills are still handed over at sstore_after_step, so the CPU runs
 * the same path.
 *
 * Ownership: borrows the backend, the block allocator, the store and its
 * model (all must outlive it: sstore_free waits for the store to hand its
 * buffers back). Failures to stage or store are misses, never
 * errors: the cache is an optimisation. Not thread-safe (the scheduler's). */
#ifndef KVB_SCHED_STORE_H
#define KVB_SCHED_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "engine/kv.h"
#include "engine/pscore.h"
#include "store/pstore/pstore.h"

struct sstore;

enum kvb_status sstore_create(struct backend *be, struct kv_alloc *kv, struct pstore *ps, const struct pstore_model *pm,
                              struct sstore **out);
/* Waits for copies in flight, drops the spills not yet handed over
 * (releasing their blocks), and waits for the store's writer to be done
 * with the buffers lent to it (pstore_flush). Accepts NULL. */
void sstore_free(struct sstore *x);

/* Fills blocks[0..n) (taken by the caller) with chain blocks from..from+n-1
 * of `tokens` (keys from pstore_chain_keys), stopping at the first miss.
 * scores non-NULL (n x block_size records): only blocks stored with their
 * prompt scores count, and those land there. Returns how many it filled;
 * the caller keeps the others. n <= 256. */
int32_t sstore_load(struct sstore *x, const int32_t *tokens, const struct pstore_key *keys, int32_t from, int32_t n,
                    const int32_t *blocks, struct pscore *scores);

/* Queues chain block i of `tokens` (held in KV block `block`) for the
 * store, unless the store has it already — with scores (block_size
 * records, copied), unless it has it with them; such a put replaces a
 * stored value without them. */
void sstore_spill(struct sstore *x, const int32_t *tokens, const struct pstore_key *keys, int32_t i, int32_t block,
                  const struct pscore *scores);

/* Waits for the queued copies, hands the spilled blocks to the store and
 * releases them. Call after each forward pass, and when nothing runs.
 * Fails only when the backend's copies failed (then what was loaded since
 * the last call may be wrong too). */
enum kvb_status sstore_after_step(struct sstore *x, struct kvb_err *err);

bool sstore_pending(const struct sstore *x);           /* copies or spills not yet finished */
int64_t sstore_blocks_spilled(const struct sstore *x); /* handed to the store */

#endif
