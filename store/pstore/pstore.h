/* pstore.h — the persistent prefix cache: KV blocks of prompt prefixes,
 * compressed with zstd, kept in an LMDB environment that any later run, in
 * any process, can read.
 *
 * Keys. Block i of a prompt is named by a chained hash:
 *   key[0] = H(seed, tokens of block 0), key[i] = H(key[i-1], tokens of block i)
 * where seed = H(model fingerprint, KV dtype, block size, format version). A
 * key therefore names a whole prefix, a lookup walks the chain until the
 * first miss, and two models (or block sizes, or formats) never share keys.
 *
 * Values. A header (magic, format version, model identity, shape, dtype,
 * the block's token ids, raw and compressed lengths, checksum of the raw
 * bytes) followed by zstd of the byte-shuffled K/V of the block for all
 * layers. A reader checks every field; a value that fails is a miss, is
 * removed, and is logged — never fed to the model. A hash collision is caught
 * by the stored token ids.
 *
 * Writes go through a writer thread that batches them into LMDB write
 * transactions (and compresses them), so the engine never waits on disk.
 * Several processes may share one directory (LMDB: one writer at a time,
 * many readers). A size cap is kept by least-recently-used eviction of
 * leaves only, so every block that remains is reachable (its parent chain is
 * whole). Full disk or map-full turns writing off for the rest of the run
 * with a warning; reading goes on.
 *
 * The LMDB file itself has no checksums, and LMDB follows whatever page
 * numbers it finds: a truncated or overwritten data.mdb would crash every
 * process that reads it. So opening first checks the file's structure
 * (pstore_check.c: meta pages, every branch and leaf page, overflow
 * headers, the free list; by pread, under a read transaction, so neither
 * damage nor other processes' commits can disturb it). A damaged file is
 * moved to DIR/damaged-TIME/ with a message and an empty cache started in
 * its place (or, with opts.keep_damaged, the open fails). The check reads
 * each branch/leaf page and 16 bytes of each value's first overflow page
 * (those by 8 threads): linear in entries, not bytes. 40k values (a 10 GiB
 * cache of SmolLM2-135M blocks is about that) took 42k reads: 55 ms from
 * the page cache, 0.7 s cold on the development VM's disk.
 *
 * Damage that comes while a process has the file open (another process
 * truncates or overwrites it) cannot be checked for ahead: every read of
 * the map runs guarded (pstore_guard.c), and a fault there (SIGBUS, SIGSEGV,
 * an LMDB assertion) is a miss that turns the store off for the rest of the
 * process (reads miss, puts are dropped, pstore_stats.map_faults counts it,
 * one warning). pstore_open installs the handler for SIGBUS and SIGSEGV;
 * faults outside the store's reads go on to the handler that was there
 * before, so install a crash handler (the run's journal) before opening a
 * store, or it sees the store's own faults first.
 *
 * Thread-safety: one struct pstore is used by one engine thread; the writer
 * and decompression threads are internal.
 *
 * Ownership: pstore_put copies what it is given. Buffers passed to
 * pstore_load_chain are the caller's. */
#ifndef KVB_PSTORE_H
#define KVB_PSTORE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

/* 2: values may carry an annex (the prompt scores); 3: K/V may be stored
 * quantized (dtypes q8, q4), their groups' scales apart from their quants */
#define PSTORE_FORMAT_VERSION 3

struct pstore;

/* Bytes a caller keeps with a block's value, checked like the rest of it
 * (its own checksum) but not compressed and not interpreted: the scheduler
 * stores a block's prompt scores so (engine/pscore.h). For loads, data is
 * where it goes and len how long it must be. */
struct pstore_annex {
    void *data;
    size_t len;
};

struct pstore_key {
    uint8_t b[16];
};

/* The element type of the K/V rows; part of the key seed, so entries of
 * two types never answer for each other. Q8 and Q4 are backend/kvtype.h's
 * pools of groups of 32 elements (q8 groups: fp16 scale and 32 int8, 34
 * bytes; q4 groups: fp16 scale and minimum and 32 nibbles, 20 bytes), stored
 * as the pool holds them: Q8 K and V rows of q8 groups, Q4 K rows of q8
 * groups and V rows of q4 ones; kv_dim is a multiple of 32. */
enum pstore_dtype { PSTORE_DTYPE_F16 = 1, PSTORE_DTYPE_F32 = 2, PSTORE_DTYPE_Q8 = 3, PSTORE_DTYPE_Q4 = 4 };
#define PSTORE_QGROUP 32    /* elements per Q8/Q4 group */
#define PSTORE_ARITH_MAX 32 /* bytes of pstore_model.arith, its terminator included */

/* What is stored: the identity of the model and the shape of one block. */
struct pstore_model {
    char fingerprint[33];    /* the model's weight fingerprint, 32 hex digits */
    const char *name;        /* human name for `cache stats` (copied) */
    enum pstore_dtype dtype; /* element type of the K/V data */
    int32_t block_size;      /* tokens per block */
    int32_t n_layer;
    int32_t kv_dim; /* n_head_kv * head_dim */
    /* The arithmetic that computed the blocks, when it is not the CPU's
     * reference one (NULL or "": every kernel set that gives the scalar
     * kernels' bits). A backend whose results differ in the last bits
     * (CUDA, the CPU's BF16 tiles) names its own, so that a prefix it
     * stored never answers for another's: a request's output stays the same
     * bits whether its prefix was computed or loaded. At most 31 bytes. */
    const char *arith;
    /* raw block bytes = n_layer * 2 * block_size * row bytes (kv_dim *
     * sizeof(dtype), or kv_dim / 32 groups); layout [layer][K|V][slot][row],
     * as the backend's pool holds it. */
};

struct pstore_opts {
    uint64_t max_size;    /* cap on stored bytes; 0 = 10 GiB. Also kept under free disk space. */
    int zstd_level;       /* 0 = default (3) */
    bool lossy8;          /* store f16/f32 K/V as int8 with a per-row scale (lossy; off by default;
                             Q8/Q4 values are stored as they are whatever this says) */
    int n_threads;        /* decompression threads (loads) and compression threads (writer); 0 = one per CPU */
    bool quiet;           /* no warnings on stderr (they are still counted) */
    uint64_t map_size;    /* LMDB map (address space) in bytes; 0 = automatic: max(2 x cap,
                           cap + 256 MiB). Tests set it small to provoke map-full. */
    bool keep_damaged;    /* a data file whose structure is damaged makes pstore_open fail (KVB_ERR_FORMAT,
                           saying where) instead of being moved aside: for `cache verify` and `stats` */
    uint64_t queue_bytes; /* puts waiting to be compressed and written, at most (raw bytes); beyond
                             it a put is dropped rather than waited for. 0 = 64 MiB. A GPU spills
                             faster than zstd compresses: a cold run wanting every block stored
                             needs room for them. */
};

struct pstore_stats {
    uint64_t blocks_loaded, bytes_read;     /* values read and accepted (compressed bytes) */
    uint64_t blocks_written, bytes_written; /* values written (compressed bytes) */
    uint64_t raw_bytes_written;             /* the same values uncompressed */
    uint64_t blocks_dropped;                /* puts not written (queue full, writing off,
                                                    parent no longer stored) */
    uint64_t damaged;                       /* values found bad and removed (loads, verify) */
    uint64_t evicted;                       /* values removed by the size cap */
    uint64_t map_faults;                    /* reads of the file that faulted (it was changed under this
                                                    process): the store is off after the first */
    bool writing_disabled;                  /* after map-full / disk-full */
    bool set_aside;                         /* open found the file damaged and moved it aside */
    bool checked;                           /* the open-time structural check ran (not: another LMDB
                                                    format, or the file could not be read) */
    uint64_t check_pages;                   /* pages (and overflow headers) the open-time check read */
    double check_seconds;                   /* and how long it took */
};

/* The default directory: $KVBATCH_CACHE_DIR, else $XDG_CACHE_HOME/kvbatch,
 * else $HOME/.cache/kvbatch. */
void pstore_default_dir(char *buf, size_t cap);

/* Opens (creating the directory and environment if needed). dir NULL or ""
 * = pstore_default_dir; opts NULL = all defaults. A data file whose LMDB
 * structure is damaged is moved aside (message on stderr, even when quiet:
 * it moves files) and an empty cache started; when it cannot be moved, or
 * opts.keep_damaged, KVB_ERR_FORMAT with a message saying what is damaged
 * and what to do. A file written by another LMDB version is
 * KVB_ERR_UNSUPPORTED and left alone. One process must not open
 * the same directory twice at once (LMDB's rule: closing one handle would
 * drop the other's locks); other processes may. */
enum kvb_status pstore_open(const char *dir, const struct pstore_opts *opts, struct pstore **out, struct kvb_err *err);
/* Writes everything still queued, then closes. Accepts NULL. */
void pstore_close(struct pstore *ps);

/* keys[i] for the first n_blocks full blocks of tokens (block_size each). */
void pstore_chain_keys(const struct pstore_model *m, const int32_t *tokens, int32_t n_blocks, struct pstore_key *keys);

/* Loads consecutive blocks from..n-1 of a chain (keys from pstore_chain_keys,
 * tokens the same prompt) into dst[0..], each raw block bytes long, stopping
 * at the first miss or damaged value. *n_loaded = blocks loaded (0..n-from).
 * One read transaction; values decompressed in parallel. Errors other than
 * misses (e.g. the environment became unreadable) return a status, and the
 * caller treats them as a miss from there: *n_loaded still counts the
 * blocks loaded before it. dst[i] past *n_loaded may hold garbage.
 * A lossy8 value is a miss unless the store was opened with lossy8 (so a
 * lossless run's outputs never depend on a lossy run's); a lossless store
 * replaces such a value when it puts the block. A damaged value is removed
 * together with the entries below it (unreachable from now on). */
enum kvb_status pstore_load_chain(struct pstore *ps, const struct pstore_model *m, const int32_t *tokens,
                                  const struct pstore_key *keys, int32_t from, int32_t n, void *const *dst,
                                  int32_t *n_loaded, struct kvb_err *err);

/* pstore_load_chain where annex[0..n-from) is non-NULL: only values with an
 * annex of exactly annex[i].len bytes count (one without is a miss, which
 * ends the chain; it is not damage), and the annex is copied to
 * annex[i].data. NULL: annexes are neither asked for nor in the way. */
enum kvb_status pstore_load_chain_annex(struct pstore *ps, const struct pstore_model *m, const int32_t *tokens,
                                        const struct pstore_key *keys, int32_t from, int32_t n, void *const *dst,
                                        const struct pstore_annex *annex, int32_t *n_loaded, struct kvb_err *err);

/* Whether the store already holds key (a cheap check before copying a block
 * out of the backend to put it). Also true while the put is still queued;
 * a lossy8 value counts only for a store opened with lossy8. */
bool pstore_contains(struct pstore *ps, const struct pstore_key *key);
/* The same, counting only values (or queued puts) with an annex of
 * annex_len bytes (0: any). */
bool pstore_contains_annex(struct pstore *ps, const struct pstore_key *key, size_t annex_len);

/* Queues block `index` of a chain for writing: its key, its parent's key
 * (NULL for block 0), its tokens (block_size) and raw data. Copies all; never
 * blocks on disk. Returns KVB_OK also when the put is dropped (counted):
 * when the queue is full (256 puts or 64 MiB waiting), when writing is off,
 * or, at write time, when the parent is not in the store (so no entry is
 * ever unreachable): put a chain's blocks in order. KVB_ERR_INVALID_ARG for
 * a bad model or NULL arguments. */
enum kvb_status pstore_put(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                           const struct pstore_key *parent, const int32_t *tokens, const void *data);

/* pstore_put without copying data: the store reads it until the put is
 * encoded or dropped, then calls release(ctx, data) — exactly once, from
 * the writer thread, or from this call when the put is dropped at once.
 * The caller must not change or free data before that. For a caller whose
 * block buffers are expensive to copy (a GPU engine's pinned staging, a
 * block at a time). */
enum kvb_status pstore_put_borrowed(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                                    const struct pstore_key *parent, const int32_t *tokens, const void *data,
                                    void (*release)(void *ctx, const void *data), void *ctx);

/* pstore_put_borrowed with an annex (copied; NULL: none) stored with the
 * value. A stored value of the key without this annex is replaced by the
 * new one, as a lossy8 one is by a lossless store. */
enum kvb_status pstore_put_borrowed_annex(struct pstore *ps, const struct pstore_model *m, const struct pstore_key *key,
                                          const struct pstore_key *parent, const int32_t *tokens, const void *data,
                                          const struct pstore_annex *annex,
                                          void (*release)(void *ctx, const void *data), void *ctx);

/* Whether a put of one of m's blocks would be queued now, when `ahead`
 * more puts the caller has promised (staged, not yet put) are counted
 * first. When not, the block counts as dropped, as pstore_put would count
 * it: the caller skips it. Lets a caller skip preparing (e.g. copying off a
 * device) a block the store would drop. */
bool pstore_put_admit(struct pstore *ps, const struct pstore_model *m, int32_t ahead);

/* Waits until every queued put (and LRU touch, and damaged-value removal)
 * is written (tests, end of run; pstore_close does it too). */
void pstore_flush(struct pstore *ps);

void pstore_get_stats(const struct pstore *ps, struct pstore_stats *out);

/* The effective size cap in bytes (opts.max_size, or 10 GiB, lowered to
 * what the disk can hold), and the directory. */
uint64_t pstore_max_size(const struct pstore *ps);
/* The queue's bound in bytes (pstore_opts.queue_bytes or its default). */
uint64_t pstore_queue_bytes(const struct pstore *ps);

/* ---- management (kvbatch cache …) ------------------------------------------- */

/* Entries, bytes, compression ratio, per-model breakdown. */
enum kvb_status pstore_print_stats(struct pstore *ps, FILE *out, struct kvb_err *err);
/* Checks every value (header, tokens, checksum, decompression); removes the
 * bad ones and those whose parent is missing. Reports counts. */
enum kvb_status pstore_verify(struct pstore *ps, FILE *out, uint64_t *n_bad, struct kvb_err *err);
/* Evicts least recently used leaves until the stored bytes are <= max_size. */
enum kvb_status pstore_gc(struct pstore *ps, uint64_t max_size, uint64_t *n_evicted, struct kvb_err *err);
/* Removes every entry, or only those of one model (fingerprint non-NULL). */
enum kvb_status pstore_clear(struct pstore *ps, const char *fingerprint, uint64_t *n_removed, struct kvb_err *err);

/* ---- the value codec (exposed for tests and the fuzz target) --------------- */

/* Encodes one block into a kvb_malloc'd value. */
enum kvb_status pstore_value_encode(const struct pstore_model *m, const int32_t *tokens, const void *data,
                                    int zstd_level, bool lossy8, uint8_t **out, size_t *out_len, struct kvb_err *err);
/* Decodes and checks a value against the model, and (if tokens non-NULL)
 * against the expected token ids; writes raw block bytes into dst.
 * KVB_ERR_FORMAT (message says which check failed) for anything wrong;
 * KVB_ERR_NOT_FOUND for a sound value that stands for other tokens (a hash
 * collision): a miss, but not damage. Accepts lossy8 values (the store
 * itself reads them only when opened with lossy8). dst may hold garbage
 * after a failure. */
enum kvb_status pstore_value_decode(const struct pstore_model *m, const int32_t *tokens, const uint8_t *val, size_t len,
                                    void *dst, struct kvb_err *err);

#endif
