/* pstore_internal.h — what the pstore_*.c files share and nobody else sees:
 * the value codec with reusable contexts, the model identity and key chain,
 * the LMDB record layouts and primitive operations (insert, delete, garbage
 * collection, orphan sweep), the writer thread, and struct pstore itself.
 *
 * Layering: pstore_codec.c and pstore_keys.c know nothing of LMDB;
 * pstore_db.c owns every record layout and every change to the databases;
 * pstore_writer.c decides when changes happen; pstore.c and pstore_admin.c
 * are the public entry points. Functions in the database layer return LMDB
 * return codes (0, MDB_* or an errno); the public entry points translate them
 * into kvb_status with mdb_strerror's text (pstore_lmdb_status). */
#ifndef KVB_PSTORE_INTERNAL_H
#define KVB_PSTORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zstd.h>

#include "base/dtype.h"
#include "store/pstore/pstore.h"

/* ---- value format ------------------------------------------------------------
 * All integers little-endian. Offsets:
 *    0  magic "KVBC"
 *    4  u16 format version (PSTORE_FORMAT_VERSION)
 *    6  u16 flags (PSTORE_FLAG_*; unknown bits are an error)
 *    8  16-byte model identity (pstore_shape_init)
 *   24  u32 dtype, u32 block_size, u32 n_layer, u32 kv_dim
 *   40  u64 raw length (bytes of the block as the pool holds it)
 *   48  u64 payload length (bytes fed to zstd: raw length, or the lossy8 rows)
 *   56  u64 compressed length (bytes of the zstd frame that follows)
 *   64  u64 XXH3-64 of the payload (before compression)
 *   72  i32 tokens[block_size]
 *   72+4B  u64 XXH3-64 of bytes [0, 72+4B): the header checksum
 *   80+4B  zstd frame of comp_len bytes;
 * with PSTORE_FLAG_ANNEX, after the frame:
 *          u32 annex length A, A bytes (the caller's, stored as given: the
 *          scheduler's prompt scores), u64 XXH3-64 of those A bytes.
 * The value ends exactly there (where the frame does, without an annex).
 * Payload, lossless: the raw bytes shuffled (byte 0 of every element, then
 * byte 1, ...). Lossy8: rows = n_layer*2*block_size rows of kv_dim elements;
 * first every row's f16 scale (u16 each), then every row's kv_dim int8
 * values; element = q * scale. */
#define PSTORE_MAGIC "KVBC"
#define PSTORE_HDR_FIXED 72u
#define PSTORE_FLAG_LOSSY8 0x0001u
#define PSTORE_FLAG_ANNEX 0x0002u
#define PSTORE_FLAGS_KNOWN (PSTORE_FLAG_LOSSY8 | PSTORE_FLAG_ANNEX)
#define PSTORE_MAX_ANNEX ((uint64_t)1 << 24) /* far above what a block's scores take (B x 168 bytes) */
/* Refuse shapes whose raw block would exceed this: no real model comes near
 * (Llama 70B, 80 layers x 1024 x 2 x 16 tokens x f32 = 10 MiB), and it keeps
 * every size computation far from overflow. */
#define PSTORE_MAX_RAW ((uint64_t)1 << 30)
#define PSTORE_MAX_BLOCK 4096u

/* f16 <-> f32 for the lossy8 rows, inline because a block has ~10^5
 * elements and the calls dominated. Normal numbers take the short path;
 * everything else goes to dtype.c, so the results equal kvb_fp16_to_f32 and
 * kvb_f32_to_fp16 bit for bit (test_pstore checks all 65536 halves). */
static inline float pstore_h2f(uint16_t h)
{
    uint32_t e = (h >> 10) & 0x1f;
    if (e == 0 || e == 0x1f) return kvb_fp16_to_f32(h);
    uint32_t bits = ((uint32_t)(h & 0x8000) << 16) | (((uint32_t)h & 0x7fff) << 13);
    bits += (uint32_t)(127 - 15) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t pstore_f2h(float f)
{
    uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    uint32_t absx = x & 0x7fffffffu;
    /* [2^-14, 65520): the result is a normal half, rounding cannot reach Inf */
    if (absx < 0x38800000u || absx >= 0x477ff000u) return kvb_f32_to_fp16(f);
    uint32_t r = absx - ((uint32_t)(127 - 15) << 23);
    r += 0xfffu + ((r >> 13) & 1u); /* round to nearest even; a carry bumps the exponent, correctly */
    return (uint16_t)(((x >> 16) & 0x8000u) | (r >> 13));
}

static inline size_t pstore_hdr_len(uint32_t block_size) { return PSTORE_HDR_FIXED + 4u * (size_t)block_size + 8u; }

/* A checked pstore_model in the form the codec uses. */
struct pstore_shape {
    uint8_t identity[16]; /* XXH3-128 of fingerprint, dtype, shape, format version */
    enum pstore_dtype dtype;
    uint32_t block_size, n_layer, kv_dim;
    uint32_t esize; /* bytes per element (f16, f32); 1 for the grouped types */
    /* Q8/Q4: bytes per group of PSTORE_QGROUP elements in K rows and in V
     * rows (34 for q8 groups, 20 for q4); 0 otherwise */
    uint32_t k_gbytes, v_gbytes;
    uint64_t n_rows;  /* n_layer * 2 * block_size */
    uint64_t raw_len; /* n_rows * kv_dim * esize, or n_layer * block_size * kv_dim / 32 * (k_gbytes + v_gbytes) */
};

/* Checks m (positive shape, known dtype, raw size within PSTORE_MAX_RAW,
 * fingerprint 32 hex digits) and fills s. KVB_ERR_INVALID_ARG otherwise. */
enum kvb_status pstore_shape_init(const struct pstore_model *m, struct pstore_shape *s, struct kvb_err *err);

/* A parsed header: the fixed fields after the magic, version, flags, length
 * and header-checksum checks, which need no model. tokens points into the
 * value (block_size little-endian i32, unaligned). */
struct pstore_hdr {
    uint16_t version, flags;
    uint8_t identity[16];
    uint32_t dtype, block_size, n_layer, kv_dim;
    uint64_t raw_len, payload_len, comp_len, payload_sum;
    const uint8_t *tokens;
    const uint8_t *frame; /* comp_len bytes */
    const uint8_t *annex; /* annex_len bytes after the frame (PSTORE_FLAG_ANNEX), else NULL */
    uint64_t annex_len, annex_sum;
};
enum kvb_status pstore_hdr_parse(const uint8_t *val, size_t len, struct pstore_hdr *h, struct kvb_err *err);
/* Token j of a parsed header. */
int32_t pstore_hdr_token(const struct pstore_hdr *h, uint32_t j);

/* Reusable codec state: one per thread. Zero-initialise, then free. */
struct pstore_codec {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    uint8_t *scratch; /* payload before compression / after decompression */
    size_t scratch_cap;
    uint8_t *out; /* the last encoded value */
    size_t out_cap;
    float *row; /* lossy8: one row widened to f32 (row_cap bytes) */
    size_t row_cap;
};
void pstore_codec_free(struct pstore_codec *c);
/* Encodes into c->out; *val is valid until the next call on c. A lossy8
 * request for a block that int8 rows cannot represent (Inf/NaN, or a scale
 * beyond f16) is encoded lossless instead: the flags say which. */
enum kvb_status pstore_codec_encode(struct pstore_codec *c, const struct pstore_shape *s, const int32_t *tokens,
                                    const void *data, const struct pstore_annex *annex, int zstd_level, bool lossy8,
                                    const uint8_t **val, size_t *val_len, struct kvb_err *err);
/* Decodes val into dst (s->raw_len bytes). tokens non-NULL: a value for
 * other tokens is KVB_ERR_NOT_FOUND; allow_lossy false: a lossy8 value is
 * KVB_ERR_NOT_FOUND too; annex non-NULL: a value without an annex of exactly
 * annex->len bytes is KVB_ERR_NOT_FOUND as well (all sound, just not what
 * was asked), and one with it has the annex copied to annex->data. Anything
 * malformed is KVB_ERR_FORMAT. dst and the annex may hold garbage after a
 * failure. */
enum kvb_status pstore_codec_decode(struct pstore_codec *c, const struct pstore_shape *s, const int32_t *tokens,
                                    bool allow_lossy, const uint8_t *val, size_t len, void *dst,
                                    const struct pstore_annex *annex, struct kvb_err *err);
/* Whether a parsed value carries an annex of `len` bytes (len 0: whether it
 * needs none: always true). */
static inline bool pstore_hdr_has_annex(const struct pstore_hdr *h, size_t len)
{
    return len == 0 || (h->annex && h->annex_len == len);
}

/* ---- keys ------------------------------------------------------------------ */

/* key = XXH3-128(prev || tokens as little-endian i32), canonical bytes. The
 * chain's first prev is the model identity. */
void pstore_key_next(const uint8_t prev[16], const int32_t *tokens, uint32_t n, struct pstore_key *out);
/* As pstore_key_next with tokens still in value bytes (little-endian). */
void pstore_key_next_le(const uint8_t prev[16], const uint8_t *tokens_le, uint32_t n, struct pstore_key *out);
/* 32 lowercase hex digits + NUL. */
void pstore_hex16(const uint8_t b[16], char out[33]);

/* ---- LMDB records ------------------------------------------------------------ */

/* meta: key16 -> this (PSTORE_META_LEN bytes, little-endian). */
#define PSTORE_META_LEN 64u
struct pstore_meta {
    struct pstore_key parent;
    bool has_parent;      /* false for block 0 of a chain */
    uint8_t identity[16]; /* the model identity, for per-model stats and clear */
    uint64_t last_used;   /* the store's logical clock at the last insert/load */
    uint64_t value_len;   /* bytes of the stored value */
    uint64_t raw_len;     /* bytes of the block uncompressed */
    uint32_t n_children;  /* entries whose parent is this one */
};
void pstore_meta_pack(const struct pstore_meta *m, uint8_t out[PSTORE_META_LEN]);
bool pstore_meta_unpack(const void *p, size_t len, struct pstore_meta *m);

/* models: identity16 -> the shape, fingerprint and name (for stats, verify
 * and clear --model). */
struct pstore_model_rec {
    uint8_t identity[16];
    char fingerprint[33];
    char name[128];
    enum pstore_dtype dtype;
    int32_t block_size, n_layer, kv_dim;
};

/* info: "totals" -> these, kept in step with blocks/meta by every change. */
struct pstore_totals {
    uint64_t entries; /* meta records */
    uint64_t bytes;   /* sum of value_len: what the size cap is about */
    uint64_t raw;     /* sum of raw_len */
    uint64_t clock;   /* logical clock for last_used */
};

struct pstore;

/* Transactions. Every transaction holds ps->env_lock for reading, because
 * adopting a map grown by another process (MDB_MAP_RESIZED) may only happen
 * while this process has no transaction open. */
int pstore_txn_begin(struct pstore *ps, bool write, MDB_txn **txn);
void pstore_txn_abort(struct pstore *ps, MDB_txn *txn);
int pstore_txn_commit(struct pstore *ps, MDB_txn *txn);
enum kvb_status pstore_lmdb_status(struct kvb_err *err, int rc, const char *what);
/* What to do about an LMDB code that means a damaged file ("" for others):
 * appended to messages. */
const char *pstore_lmdb_hint(int rc);

int pstore_totals_get(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t);
int pstore_totals_put(struct pstore *ps, MDB_txn *txn, const struct pstore_totals *t);
int pstore_model_rec_put(struct pstore *ps, MDB_txn *txn, const struct pstore_model_rec *r);
/* All model records (kvb_malloc'd array, *n of them). */
int pstore_model_recs_load(struct pstore *ps, MDB_txn *txn, struct pstore_model_rec **out, size_t *n);

enum pstore_insert_result {
    PSTORE_INSERTED, /* new entry */
    PSTORE_REPLACED, /* an unacceptable value (lossy for a lossless store, malformed) replaced */
    PSTORE_PRESENT,  /* already there: touched */
    PSTORE_NO_PARENT /* parent absent: not inserted, so no entry is ever an orphan */
};
/* Whether an existing value is good enough to keep instead of a new one:
 * parsable header, and lossless unless the store accepts lossy values. */
bool pstore_value_acceptable(const struct pstore *ps, const uint8_t *val, size_t len, size_t annex_len);
/* annex_len: that of the value inserted; a stored value without such an
 * annex is not acceptable (pstore_value_acceptable) and is replaced. */
int pstore_db_insert(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, const struct pstore_key *key,
                     const struct pstore_key *parent, const uint8_t identity[16], const uint8_t *val, size_t len,
                     uint64_t raw_len, size_t annex_len, enum pstore_insert_result *res);
int pstore_db_touch(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, const struct pstore_key *key);
/* Deletes value and meta of key (whichever exist) and decrements the
 * parent's child count. *found: whether anything was there. */
int pstore_db_delete(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, const struct pstore_key *key,
                     bool *found);
/* Evicts least recently used leaves (orphans first) until t->bytes <=
 * target, at most max_evict of them. */
int pstore_db_gc(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, uint64_t target, uint64_t max_evict,
                 uint64_t *n_evicted);
/* Removes every entry whose parent chain is broken (missing parent, parent
 * of another model, cycle), recomputes child counts and the totals from what
 * remains. *n_removed: entries removed, *n_fixed: child counts corrected. */
int pstore_db_sweep(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, uint64_t *n_removed, uint64_t *n_fixed);

/* ---- structural check of data.mdb (pstore_check.c) ---------------------------- */

/* What a page is, as the check found it (tests: which overwrites must be
 * caught). */
enum pstore_page_kind {
    PSTORE_PAGE_UNREACHED = 0, /* not in the snapshot: stale, past the end, or leaked */
    PSTORE_PAGE_META,
    PSTORE_PAGE_BRANCH,
    PSTORE_PAGE_LEAF,
    PSTORE_PAGE_OVERFLOW_HEAD, /* first page of a value too big for a leaf: has a header */
    PSTORE_PAGE_OVERFLOW,      /* the rest of such a value: value bytes only */
    PSTORE_PAGE_FREE
};

struct pstore_check {
    bool damaged; /* the structure is broken; why says where and how */
    char why[256];
    uint64_t pages_read; /* branch/leaf pages plus overflow headers read */
    uint64_t file_pages, last_pg;
    double seconds;
    uint64_t dev, ino; /* the file checked (to move exactly that one aside) */
    uint8_t *kinds;    /* optional (caller's, n_kinds): enum pstore_page_kind per page */
    size_t n_kinds;
};

/* Walks the latest committed snapshot of env's data file with pread (so
 * damage cannot fault here) under a read transaction (so other processes'
 * commits cannot make it look damaged). 0: the check ran and c->damaged
 * says what it found; otherwise an LMDB code or errno and nothing is known
 * (ENOTSUP: built against an LMDB whose file format this does not know).
 * Keeps c->kinds/n_kinds, clears the rest. */
int pstore_env_check(MDB_env *env, struct pstore_check *c);
/* What the meta pages and the size alone say about a data file that LMDB
 * refused to open (bad meta page, impossible size). Sets c->damaged/why
 * and c->dev/ino only. */
void pstore_file_check(const char *path, struct pstore_check *c);

/* ---- the store ---------------------------------------------------------------- */

struct pstore_put_item {
    struct pstore_put_item *next;
    struct pstore_key key, parent;
    bool has_parent;
    int model;            /* index into ps->models */
    int32_t *tokens;      /* block_size, inside this allocation */
    const uint8_t *data;  /* raw_len: inside this allocation, or the caller's (pstore_put_borrowed) */
    const uint8_t *annex; /* annex_len bytes inside this allocation, or NULL */
    size_t annex_len;
    size_t alloc_len; /* for the queue's byte bound (borrowed data counted too: it is held) */
    void (*release)(void *ctx, const void *data); /* borrowed data: handed back by pstore_item_free */
    void *release_ctx;
};

/* Frees a queued put, handing borrowed data back first. */
void pstore_item_free(struct pstore_put_item *it);

struct pstore_damage {
    struct pstore_key key;
    uint64_t hash; /* XXH3-64 of the bad value: only that value is deleted */
    size_t len;
};

struct pstore_known_model {
    struct pstore_shape shape;
    struct pstore_model_rec rec;
    bool recorded; /* the writer has put rec into the models database */
};

struct pstore {
    char *dir;
    struct pstore_opts opts;
    uint64_t cap; /* effective size cap (opts, free disk) */
    uint64_t map_size;
    MDB_env *env;
    MDB_dbi db_blocks, db_meta, db_models, db_info;
    pthread_rwlock_t env_lock;

    pthread_mutex_t mu;     /* everything below up to the readers */
    pthread_cond_t cv_work; /* writer: something queued, or stop */
    pthread_cond_t cv_idle; /* flush: the writer finished a batch */
    struct pstore_stats stats;
    bool warned_damage, warned_write, warned_fault;
    atomic_bool broken; /* the map faulted (pstore_guard.c): every read a miss, no writes */
    struct pstore_known_model *models;
    int n_models, cap_models;
    struct pstore_put_item *q_head, *q_tail;
    size_t q_n, q_bytes;
    struct pstore_key *touches;
    size_t n_touches, cap_touches;
    struct pstore_damage *damage;
    size_t n_damage, cap_damage;
    bool stop, busy;
    int flushing;
    pthread_t writer;
    bool writer_started; /* engine side: joined at close */
    bool writer_running; /* false once the thread has ended */
    /* writer thread only: compression helpers (created on first use) */
    struct tpool *wpool;
    struct pstore_codec *wcodec; /* one per wpool thread, or one */
    int n_wcodec;

    /* readers (engine thread only) */
    struct tpool *pool;
    struct pstore_codec *rcodec; /* one per pool thread (or one without a pool) */
    int n_rcodec;
};

/* ---- reads of the map that a damaged file cannot crash (pstore_guard.c) --------
 * Every stretch of code that reads LMDB's map (a transaction, a value
 * decoded from it) runs in a region:
 *     struct pstore_guard g;
 *     pstore_guard_push(&g);
 *     if (sigsetjmp(g.jb, 1)) { pstore_guard_fault(ps, &g, "loading"); ...a miss...; }
 *     ... pstore_txn_begin ... reads ... pstore_txn_abort ...
 *     pstore_guard_pop(&g);
 * A SIGBUS or SIGSEGV in the region (the file truncated or overwritten under
 * this process), or an LMDB assertion, comes back from sigsetjmp as 1;
 * pstore_guard_fault then ends the transaction the region has open and
 * turns the store off (ps->broken). Locals changed inside the region and
 * read after a fault must be volatile. */
struct pstore_guard {
    sigjmp_buf jb;
    struct pstore_guard *prev; /* the region this one is inside, on this thread */
    MDB_txn *volatile txn;     /* the transaction open in it (pstore_txn_*), or NULL */
    volatile bool env_locked;  /* ps->env_lock held by it */
    volatile int sig;          /* after a fault: SIGBUS, SIGSEGV, or SIGABRT for an LMDB assertion */
    char what[200];            /* the assertion's text, or "" */
};
/* Installs the fault handler (once per process; pstore_open). */
void pstore_guard_install(void);
void pstore_guard_push(struct pstore_guard *g);
void pstore_guard_pop(struct pstore_guard *g); /* on leaving the region normally (a fault pops it) */
/* The innermost region of this thread, or NULL. */
struct pstore_guard *pstore_guard_current(void);
/* LMDB's assertion hook (mdb_env_set_assert): jumps out of the region, or
 * returns (LMDB then aborts) outside one. */
void pstore_guard_assert(MDB_env *env, const char *msg);
/* After a fault: ends g's transaction, releases the environment lock, and
 * turns the store off (pstore_guard_off). doing names what was under way. */
void pstore_guard_fault(struct pstore *ps, struct pstore_guard *g, const char *doing);
/* Turns the store off after a fault (a decoding thread's, which has no
 * transaction of its own): reads are misses, puts are dropped, one warning. */
void pstore_guard_off(struct pstore *ps, int sig, const char *what, const char *doing);

/* The writer thread (pstore_writer.c). */
enum kvb_status pstore_writer_start(struct pstore *ps, struct kvb_err *err);
void pstore_writer_stop(struct pstore *ps); /* writes what is queued, joins */
/* Queue bounds (pstore_opts.queue_bytes): beyond them puts are dropped
 * (counted), never waited for. Items: 256 per 64 MiB of bytes. */
#define PSTORE_QUEUE_MAX_ITEMS 256u
#define PSTORE_QUEUE_MAX_BYTES ((size_t)64 << 20)
#define PSTORE_TOUCH_MAX 8192u
#define PSTORE_DAMAGE_MAX 1024u
/* Called with ps->mu held. */
void pstore_queue_touch_locked(struct pstore *ps, const struct pstore_key *key);
/* hash: XXH3-64 of the bad value (taken from the map before ps->mu is
 * locked: a fault must not happen with it held), len its length. */
void pstore_queue_damage_locked(struct pstore *ps, const struct pstore_key *key, uint64_t hash, size_t len);
/* Turns writing off for the rest of the process, warning once. mu held. */
void pstore_disable_writing_locked(struct pstore *ps, int rc, const char *what);

/* Model index for m (registering it), or -1 with err set. mu held. */
int pstore_model_index_locked(struct pstore *ps, const struct pstore_model *m, struct kvb_err *err);

/* Decoding threads for a load or a verify (created on first use). */
enum kvb_status pstore_readers_ensure(struct pstore *ps, struct kvb_err *err);

#endif
