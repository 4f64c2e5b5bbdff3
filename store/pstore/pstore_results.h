/* pstore_results.h — finished results kept in the persistent cache beside
 * the prefix blocks: a short vector of floats that a computation made from
 * one exact sequence of token ids (an embedding, a reranker's logit), so
 * that the next run over a mostly unchanged corpus computes only the
 * chunks that changed. Part of the pstore module (pstore.h opens and
 * closes the store); this header is the results' half of its interface.
 *
 * Spaces and keys. What else a result depends on besides the tokens (the
 * model's weights, how the hidden states were pooled, whether the vector
 * was normalised, the KV cache's element type...) the caller hashes into a
 * space (pstore_rspace_init): two results of the same tokens in different
 * spaces never answer for each other. key = XXH3-128(space ‖ tokens as
 * little-endian i32 ‖ their count).
 *
 * Values. "KVBR", u16 format version, u16 flags (0), the 16-byte space, the
 * model fingerprint (16 bytes, for `cache clear --model`), u32 token count,
 * u32 value count, the tokens (i32 LE), the values (f32 LE), u64 XXH3-64 of
 * all the bytes before it. A reader checks every field against what it
 * asked for; a value that fails is a miss and is removed, never returned.
 *
 * Writes. A put is held in memory — where gets already find it — and
 * written with the others in one LMDB write transaction when 256 are
 * pending, at pstore_results_flush and at pstore_close: a result costs
 * nothing like a KV block (a few KiB, no compression), so the writer thread
 * is not needed. Reads are one read transaction each.
 *
 * Size. Results are kept in least-recently-used order (a hit counts as a
 * use, written with the next batch) and may take a quarter of the store's
 * size cap; past it the least recently used are removed at write time.
 * `kvbatch cache stats|verify|clear` count, check and remove them with the
 * blocks.
 *
 * Thread-safety: the engine thread only, like pstore_load_chain. */
#ifndef KVB_PSTORE_RESULTS_H
#define KVB_PSTORE_RESULTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "store/pstore/pstore.h"

#define PSTORE_RESULT_MAX_VALUES 65536   /* floats in one result */
#define PSTORE_RESULT_MAX_TOKENS 1048576 /* tokens it was computed from */

struct pstore_rspace {
    uint8_t id[16];
    uint8_t fp[16]; /* the model fingerprint's bytes */
};

/* The space of results of model `fingerprint` (32 hex digits) computed as
 * params[0..n_params) says (bytes the caller chooses; hashed, not kept).
 * KVB_ERR_INVALID_ARG for a fingerprint that is not 32 hex digits. */
enum kvb_status pstore_rspace_init(struct pstore_rspace *sp, const char *fingerprint, const void *params,
                                   size_t n_params, struct kvb_err *err);

/* The key of the result of tokens[0..n) in sp. */
void pstore_result_key(const struct pstore_rspace *sp, const int32_t *tokens, int32_t n, struct pstore_key *out);

/* Looks key up (held puts first, then the database): *hit true with the
 * n_vals values in vals when there is a sound value for exactly these
 * tokens and this many values in sp. A miss is KVB_OK with *hit false; a
 * damaged value is a miss (counted, removed with the next write). Errors of
 * the database itself return a status (the caller treats them as a miss). */
enum kvb_status pstore_result_get(struct pstore *ps, const struct pstore_rspace *sp, const struct pstore_key *key,
                                  const int32_t *tokens, int32_t n_tokens, float *vals, int32_t n_vals, bool *hit,
                                  struct kvb_err *err);

/* Holds a result for writing (copied). A full disk or map turns result
 * writing off with a warning, as for blocks; KVB_ERR_INVALID_ARG for sizes
 * beyond the limits above, KVB_ERR_NOMEM. */
enum kvb_status pstore_result_put(struct pstore *ps, const struct pstore_rspace *sp, const struct pstore_key *key,
                                  const int32_t *tokens, int32_t n_tokens, const float *vals, int32_t n_vals,
                                  struct kvb_err *err);

/* Writes every held put (and use) now. KVB_OK also when writing is off. */
enum kvb_status pstore_results_flush(struct pstore *ps, struct kvb_err *err);

struct pstore_results_stats {
    uint64_t hits, misses;     /* this process's gets */
    uint64_t written, dropped; /* puts written; puts not written (writing off, an error) */
    uint64_t damaged, evicted; /* values found bad and removed; removed by the size cap */
};
void pstore_results_get_stats(const struct pstore *ps, struct pstore_results_stats *out);

#endif
