/* pstore_results.c — results kept beside the prefix blocks (see
 * pstore_results.h): their value codec, the held puts and uses, the
 * batched write with least-recently-used trimming, and what `cache
 * stats|verify|clear` do with them.
 *
 * Databases (in the store's environment):
 *   results:     key16 -> value (the codec below)
 *   results_age: key16 -> u64 stamp of its last use
 *   results_lru: u64 big-endian stamp ‖ key16 -> "" (oldest first)
 *   info:        "rtotals" -> u64 entries, u64 bytes, u64 clock
 * kept in step by every change here. */
#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "store/pstore/pstore_bytes.h"
#include "store/pstore/pstore_internal.h"
#include "store/pstore/pstore_results.h"

#define RESULT_MAGIC "KVBR"
#define RESULT_VERSION 1u
#define RESULT_HDR 48u  /* magic 4, version 2, flags 2, space 16, fingerprint 16, n_tokens 4, n_values 4 */
#define HOLD_MAX 256    /* puts held before a write */
#define TOUCH_MAX 4096u /* uses held before a write */
#define CAP_SHARE 4     /* results may take 1 / CAP_SHARE of the store's cap */

struct held {
    struct pstore_key key;
    uint8_t *val; /* encoded */
    size_t len;
};

struct pstore_results {
    MDB_dbi db_val, db_age, db_lru;
    struct held held[HOLD_MAX];
    int n_held;
    struct pstore_key *touches;
    size_t n_touches, cap_touches;
    struct pstore_key *damaged;
    size_t n_damaged, cap_damaged;
    bool writing_off;
    struct pstore_results_stats st;
};

static const char RTOTALS_KEY[] = "rtotals";

/* ---- spaces, keys, values --------------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool fp_bytes(const char *fp, uint8_t out[16])
{
    for (int i = 0; i < 16; i++) {
        const int hi = hexval(fp[2 * i]), lo = hi < 0 ? -1 : hexval(fp[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return fp[32] == '\0';
}

enum kvb_status pstore_rspace_init(struct pstore_rspace *sp, const char *fingerprint, const void *params,
                                   size_t n_params, struct kvb_err *err)
{
    memset(sp, 0, sizeof *sp);
    if (!fingerprint || !fp_bytes(fingerprint, sp->fp))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "model fingerprint is not 32 hex digits");
    XXH3_state_t *st = XXH3_createState();
    if (!st) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    uint8_t head[24 + 16 + 4];
    memcpy(head, "kvbatch results space\0\0\0", 24);
    memcpy(head + 24, sp->fp, 16);
    put_u32(head + 40, RESULT_VERSION);
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, head, sizeof head);
    if (n_params) XXH3_128bits_update(st, params, n_params);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    XXH3_freeState(st);
    memcpy(sp->id, c.digest, 16);
    return KVB_OK;
}

void pstore_result_key(const struct pstore_rspace *sp, const int32_t *tokens, int32_t n, struct pstore_key *out)
{
    /* the chain key of one "block" of n tokens from the space, then the count */
    struct pstore_key k;
    pstore_key_next(sp->id, tokens, (uint32_t)n, &k);
    uint8_t b[16 + 4];
    memcpy(b, k.b, 16);
    put_u32(b + 16, (uint32_t)n);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b, sizeof b));
    memcpy(out->b, c.digest, 16);
}

static size_t value_len(int32_t n_tokens, int32_t n_vals) { return RESULT_HDR + 4u * (size_t)(n_tokens + n_vals) + 8u; }

static uint8_t *encode(const struct pstore_rspace *sp, const int32_t *tokens, int32_t n_tokens, const float *vals,
                       int32_t n_vals, size_t *len)
{
    *len = value_len(n_tokens, n_vals);
    uint8_t *v = kvb_malloc(*len);
    if (!v) return NULL;
    memcpy(v, RESULT_MAGIC, 4);
    put_u16(v + 4, RESULT_VERSION);
    put_u16(v + 6, 0);
    memcpy(v + 8, sp->id, 16);
    memcpy(v + 24, sp->fp, 16);
    put_u32(v + 40, (uint32_t)n_tokens);
    put_u32(v + 44, (uint32_t)n_vals);
    uint8_t *p = v + RESULT_HDR;
    for (int32_t i = 0; i < n_tokens; i++, p += 4) put_u32(p, (uint32_t)tokens[i]);
    for (int32_t i = 0; i < n_vals; i++, p += 4) {
        uint32_t bits;
        memcpy(&bits, &vals[i], 4);
        put_u32(p, bits);
    }
    put_u64(p, XXH3_64bits(v, (size_t)(p - v)));
    return v;
}

/* Checks a value in itself (magic, version, sizes, checksum): false when
 * damaged. */
static bool value_sound(const uint8_t *v, size_t len)
{
    if (len < RESULT_HDR + 8 || memcmp(v, RESULT_MAGIC, 4) || get_u16(v + 4) != RESULT_VERSION || get_u16(v + 6))
        return false;
    const uint32_t nt = get_u32(v + 40), nv = get_u32(v + 44);
    if (nt > PSTORE_RESULT_MAX_TOKENS || nv > PSTORE_RESULT_MAX_VALUES || len != value_len((int32_t)nt, (int32_t)nv))
        return false;
    return get_u64(v + len - 8) == XXH3_64bits(v, len - 8);
}

/* Whether a sound value answers for these tokens in sp with n_vals values;
 * copies them out when it does. */
static bool value_matches(const uint8_t *v, const struct pstore_rspace *sp, const int32_t *tokens, int32_t n_tokens,
                          float *vals, int32_t n_vals)
{
    if (memcmp(v + 8, sp->id, 16) || get_u32(v + 40) != (uint32_t)n_tokens || get_u32(v + 44) != (uint32_t)n_vals)
        return false;
    const uint8_t *p = v + RESULT_HDR;
    for (int32_t i = 0; i < n_tokens; i++, p += 4)
        if (get_u32(p) != (uint32_t)tokens[i]) return false; /* a hash collision: a miss */
    for (int32_t i = 0; i < n_vals; i++, p += 4) {
        const uint32_t bits = get_u32(p);
        memcpy(&vals[i], &bits, 4);
    }
    return true;
}

/* ---- opening and closing ------------------------------------------------------------ */

int pstore_results_open(struct pstore *ps, MDB_txn *txn)
{
    struct pstore_results *r = kvb_calloc(1, sizeof *r);
    if (!r) return ENOMEM;
    int rc;
    if ((rc = mdb_dbi_open(txn, "results", MDB_CREATE, &r->db_val)) ||
        (rc = mdb_dbi_open(txn, "results_age", MDB_CREATE, &r->db_age)) ||
        (rc = mdb_dbi_open(txn, "results_lru", MDB_CREATE, &r->db_lru))) {
        kvb_free(r);
        return rc;
    }
    ps->res = r;
    return 0;
}

void pstore_results_close(struct pstore *ps)
{
    struct pstore_results *r = ps ? ps->res : NULL;
    if (!r) return;
    if (ps->env) pstore_results_flush(ps, NULL);
    for (int i = 0; i < r->n_held; i++) kvb_free(r->held[i].val);
    kvb_free(r->touches);
    kvb_free(r->damaged);
    kvb_free(r);
    ps->res = NULL;
}

/* ---- totals ------------------------------------------------------------------------- */

struct rtotals {
    uint64_t entries, bytes, clock;
};

static int rtotals_get(struct pstore *ps, MDB_txn *txn, struct rtotals *t)
{
    MDB_val k = {sizeof RTOTALS_KEY - 1, (void *)RTOTALS_KEY}, v;
    memset(t, 0, sizeof *t);
    int rc = mdb_get(txn, ps->db_info, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (v.mv_size == 24) {
        const uint8_t *b = v.mv_data;
        t->entries = get_u64(b);
        t->bytes = get_u64(b + 8);
        t->clock = get_u64(b + 16);
    }
    return 0;
}

static int rtotals_put(struct pstore *ps, MDB_txn *txn, const struct rtotals *t)
{
    uint8_t b[24];
    put_u64(b, t->entries);
    put_u64(b + 8, t->bytes);
    put_u64(b + 16, t->clock);
    MDB_val k = {sizeof RTOTALS_KEY - 1, (void *)RTOTALS_KEY}, v = {sizeof b, b};
    return mdb_put(txn, ps->db_info, &k, &v, 0);
}

/* ---- records -------------------------------------------------------------------------- */

static void lru_key(uint64_t stamp, const struct pstore_key *key, uint8_t out[24])
{
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(stamp >> (56 - 8 * i)); /* big-endian: oldest first */
    memcpy(out + 8, key->b, 16);
}

/* Gives key the next stamp (its age record and its place in the LRU). */
static int stamp(struct pstore *ps, MDB_txn *txn, struct rtotals *t, const struct pstore_key *key, bool had)
{
    struct pstore_results *r = ps->res;
    MDB_val k = {16, (void *)key->b}, v;
    uint8_t lk[24];
    int rc;
    if (had && (rc = mdb_get(txn, r->db_age, &k, &v)) == 0 && v.mv_size == 8) {
        lru_key(get_u64(v.mv_data), key, lk);
        MDB_val l = {sizeof lk, lk};
        rc = mdb_del(txn, r->db_lru, &l, NULL);
        if (rc && rc != MDB_NOTFOUND) return rc;
    } else if (had && rc && rc != MDB_NOTFOUND) {
        return rc;
    }
    uint8_t age[8];
    put_u64(age, ++t->clock);
    MDB_val a = {sizeof age, age};
    if ((rc = mdb_put(txn, r->db_age, &k, &a, 0))) return rc;
    lru_key(t->clock, key, lk);
    MDB_val l = {sizeof lk, lk}, empty = {0, NULL};
    return mdb_put(txn, r->db_lru, &l, &empty, 0);
}

/* Removes key's value and records; *found says whether a value was there. */
static int remove_one(struct pstore *ps, MDB_txn *txn, struct rtotals *t, const struct pstore_key *key, bool *found)
{
    struct pstore_results *r = ps->res;
    MDB_val k = {16, (void *)key->b}, v;
    *found = false;
    int rc = mdb_get(txn, r->db_val, &k, &v);
    if (rc == 0) {
        const size_t len = v.mv_size;
        if ((rc = mdb_del(txn, r->db_val, &k, NULL))) return rc;
        *found = true;
        if (t->entries) t->entries--;
        t->bytes = t->bytes > len ? t->bytes - len : 0;
    } else if (rc != MDB_NOTFOUND) {
        return rc;
    }
    rc = mdb_get(txn, r->db_age, &k, &v);
    if (rc == 0 && v.mv_size == 8) {
        uint8_t lk[24];
        lru_key(get_u64(v.mv_data), key, lk);
        MDB_val l = {sizeof lk, lk};
        rc = mdb_del(txn, r->db_lru, &l, NULL);
        if (rc && rc != MDB_NOTFOUND) return rc;
    } else if (rc && rc != MDB_NOTFOUND) {
        return rc;
    }
    rc = mdb_del(txn, r->db_age, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Removes the least recently used results until they take at most cap bytes. */
static int trim(struct pstore *ps, MDB_txn *txn, struct rtotals *t, uint64_t cap)
{
    struct pstore_results *r = ps->res;
    int rc = 0;
    while (t->bytes > cap && rc == 0) {
        MDB_cursor *cur;
        if ((rc = mdb_cursor_open(txn, r->db_lru, &cur))) return rc;
        MDB_val k, v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        struct pstore_key key;
        const bool ok = rc == 0 && k.mv_size == 24;
        if (ok) memcpy(key.b, (const uint8_t *)k.mv_data + 8, 16);
        if (rc == 0 && !ok) rc = mdb_cursor_del(cur, 0); /* a malformed record: drop it */
        mdb_cursor_close(cur);
        if (rc == MDB_NOTFOUND) return 0; /* nothing left to trim: the totals drifted */
        if (rc || !ok) continue;
        bool found;
        rc = remove_one(ps, txn, t, &key, &found);
        if (rc == 0 && found) r->st.evicted++;
    }
    return rc;
}

/* ---- gets, puts, writes ---------------------------------------------------------------- */

static void note_key(struct pstore_key **v, size_t *n, size_t *cap, const struct pstore_key *key)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        struct pstore_key *p = kvb_realloc(*v, nc * sizeof *p);
        if (!p) return; /* a use or a removal lost: an optimisation, or a retry next load */
        *v = p;
        *cap = nc;
    }
    (*v)[(*n)++] = *key;
}

enum kvb_status pstore_result_get(struct pstore *ps, const struct pstore_rspace *sp, const struct pstore_key *key,
                                  const int32_t *tokens, int32_t n_tokens, float *vals, int32_t n_vals, bool *hit,
                                  struct kvb_err *err)
{
    *hit = false;
    struct pstore_results *r = ps ? ps->res : NULL;
    if (!r) return KVB_OK;
    for (int i = 0; i < r->n_held; i++)
        if (!memcmp(r->held[i].key.b, key->b, 16) &&
            value_matches(r->held[i].val, sp, tokens, n_tokens, vals, n_vals)) {
            *hit = true;
            r->st.hits++;
            note_key(&r->touches, &r->n_touches, &r->cap_touches, key); /* written after the put: newer */
            return KVB_OK;
        }
    if (atomic_load(&ps->broken)) { /* turned off after a fault (pstore_guard.c): a miss */
        r->st.misses++;
        return KVB_OK;
    }
    /* The value is read straight from the map: in a guarded region, so a
     * file damaged under the run makes this a miss, not a crash. */
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) {
        pstore_guard_fault(ps, &g, "looking a result up");
        *hit = false; /* vals may be half written: the caller computes them */
        r->st.misses++;
        return KVB_OK;
    }
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, false, &txn);
    if (rc) {
        pstore_guard_pop(&g);
        return pstore_lmdb_status(err, rc, "cache read");
    }
    MDB_val k = {16, (void *)key->b}, v;
    rc = mdb_get(txn, r->db_val, &k, &v);
    if (rc == 0) {
        if (!value_sound(v.mv_data, v.mv_size)) {
            r->st.damaged++;
            note_key(&r->damaged, &r->n_damaged, &r->cap_damaged, key);
        } else {
            *hit = value_matches(v.mv_data, sp, tokens, n_tokens, vals, n_vals);
        }
    }
    pstore_txn_abort(ps, txn);
    pstore_guard_pop(&g);
    if (rc && rc != MDB_NOTFOUND) return pstore_lmdb_status(err, rc, "cache read");
    if (*hit) {
        r->st.hits++;
        note_key(&r->touches, &r->n_touches, &r->cap_touches, key);
        if (r->n_touches >= TOUCH_MAX) return pstore_results_flush(ps, err);
    } else {
        r->st.misses++;
    }
    return KVB_OK;
}

enum kvb_status pstore_result_put(struct pstore *ps, const struct pstore_rspace *sp, const struct pstore_key *key,
                                  const int32_t *tokens, int32_t n_tokens, const float *vals, int32_t n_vals,
                                  struct kvb_err *err)
{
    struct pstore_results *r = ps ? ps->res : NULL;
    if (!r) return KVB_OK;
    if (n_tokens < 0 || n_tokens > PSTORE_RESULT_MAX_TOKENS || n_vals <= 0 || n_vals > PSTORE_RESULT_MAX_VALUES)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "a result of %d values from %d tokens is beyond the store's limits",
                        n_vals, n_tokens);
    if (r->writing_off || atomic_load(&ps->broken)) {
        r->st.dropped++;
        return KVB_OK;
    }
    size_t len;
    uint8_t *v = encode(sp, tokens, n_tokens, vals, n_vals, &len);
    if (!v) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    r->held[r->n_held++] = (struct held){*key, v, len};
    return r->n_held == HOLD_MAX ? pstore_results_flush(ps, err) : KVB_OK;
}

static int write_held(struct pstore *ps, MDB_txn *txn, uint64_t *written)
{
    struct pstore_results *r = ps->res;
    struct rtotals t;
    int rc = rtotals_get(ps, txn, &t);
    for (size_t i = 0; rc == 0 && i < r->n_damaged; i++) {
        bool found;
        rc = remove_one(ps, txn, &t, &r->damaged[i], &found);
    }
    for (int i = 0; rc == 0 && i < r->n_held; i++) {
        const struct held *h = &r->held[i];
        MDB_val k = {16, (void *)h->key.b}, v = {h->len, h->val}, old;
        rc = mdb_get(txn, r->db_val, &k, &old);
        const bool had = rc == 0;
        if (rc && rc != MDB_NOTFOUND) break;
        if (had) { /* another process (or an earlier put) wrote it: replace, keep the totals right */
            t.bytes = t.bytes > old.mv_size ? t.bytes - old.mv_size : 0;
            if (t.entries) t.entries--;
        }
        if ((rc = mdb_put(txn, r->db_val, &k, &v, 0))) break;
        t.entries++;
        t.bytes += h->len;
        rc = stamp(ps, txn, &t, &h->key, had);
        (*written)++;
    }
    for (size_t i = 0; rc == 0 && i < r->n_touches; i++) {
        MDB_val k = {16, (void *)r->touches[i].b}, v;
        rc = mdb_get(txn, r->db_val, &k, &v);
        if (rc == MDB_NOTFOUND) { /* removed meanwhile */
            rc = 0;
            continue;
        }
        if (rc == 0) rc = stamp(ps, txn, &t, &r->touches[i], true);
    }
    const uint64_t cap = pstore_max_size(ps) / CAP_SHARE;
    if (rc == 0) rc = trim(ps, txn, &t, cap);
    if (rc == 0) rc = rtotals_put(ps, txn, &t);
    return rc;
}

static void drop_held(struct pstore_results *r)
{
    for (int i = 0; i < r->n_held; i++) kvb_free(r->held[i].val);
    r->n_held = 0;
    r->n_touches = 0;
    r->n_damaged = 0;
}

enum kvb_status pstore_results_flush(struct pstore *ps, struct kvb_err *err)
{
    struct pstore_results *r = ps ? ps->res : NULL;
    if (!r || (!r->n_held && !r->n_touches && !r->n_damaged)) return KVB_OK;
    if (r->writing_off || atomic_load(&ps->broken)) {
        r->st.dropped += (uint64_t)r->n_held;
        drop_held(r);
        return KVB_OK;
    }
    /* The write transaction reads the map (B-tree pages, old values): in a
     * guarded region, as the writer's batches (pstore_writer.c). */
    struct pstore_guard g;
    pstore_guard_push(&g);
    if (sigsetjmp(g.jb, 1)) {
        pstore_guard_fault(ps, &g, "writing results");
        r->st.dropped += (uint64_t)r->n_held;
        r->writing_off = true;
        drop_held(r);
        return KVB_OK;
    }
    MDB_txn *txn;
    uint64_t written = 0;
    int rc = pstore_txn_begin(ps, true, &txn);
    if (rc == 0) {
        rc = write_held(ps, txn, &written);
        if (rc) pstore_txn_abort(ps, txn);
        else rc = pstore_txn_commit(ps, txn);
    }
    pstore_guard_pop(&g);
    if (rc == 0) {
        r->st.written += written;
    } else {
        /* As for blocks: the cache is an optimisation, a failed write turns
         * writing off and the run goes on. */
        r->st.dropped += (uint64_t)r->n_held;
        r->writing_off = true;
        pthread_mutex_lock(&ps->mu);
        pstore_disable_writing_locked(ps, rc, "writing results");
        pthread_mutex_unlock(&ps->mu);
    }
    drop_held(r);
    (void)err;
    return KVB_OK;
}

void pstore_results_get_stats(const struct pstore *ps, struct pstore_results_stats *out)
{
    memset(out, 0, sizeof *out);
    if (ps && ps->res) *out = ps->res->st;
}

/* ---- management ------------------------------------------------------------------------- */

int pstore_results_clear_txn(struct pstore *ps, MDB_txn *txn, const char *fp, uint64_t *n_removed)
{
    struct pstore_results *r = ps->res;
    if (!r) return 0;
    struct rtotals t;
    int rc = rtotals_get(ps, txn, &t);
    if (rc) return rc;
    if (!fp) {
        MDB_stat st;
        if ((rc = mdb_stat(txn, r->db_val, &st)) || (rc = mdb_drop(txn, r->db_val, 0)) ||
            (rc = mdb_drop(txn, r->db_age, 0)) || (rc = mdb_drop(txn, r->db_lru, 0)))
            return rc;
        *n_removed += st.ms_entries;
        t = (struct rtotals){0, 0, t.clock};
        return rtotals_put(ps, txn, &t);
    }
    uint8_t want[16];
    if (!fp_bytes(fp, want)) return EINVAL;
    struct pstore_key *keys = NULL;
    size_t n = 0, cap = 0;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, r->db_val, &cur))) return rc;
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 16 || v.mv_size < RESULT_HDR || memcmp((const uint8_t *)v.mv_data + 24, want, 16)) continue;
        struct pstore_key key;
        memcpy(key.b, k.mv_data, 16);
        const size_t before = n;
        note_key(&keys, &n, &cap, &key);
        if (n == before) {
            rc = ENOMEM;
            break;
        }
    }
    mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND) rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        bool found;
        rc = remove_one(ps, txn, &t, &keys[i], &found);
        *n_removed += found;
    }
    kvb_free(keys);
    return rc ? rc : rtotals_put(ps, txn, &t);
}

void pstore_results_print(struct pstore *ps, FILE *out)
{
    if (!ps->res) return;
    MDB_txn *txn;
    struct rtotals t;
    if (pstore_txn_begin(ps, false, &txn)) return;
    const int rc = rtotals_get(ps, txn, &t);
    pstore_txn_abort(ps, txn);
    if (rc) return;
    fprintf(out, "results (embeddings, scores): %llu, %.1f MiB (at most %.1f MiB: a quarter of the cap)\n",
            (unsigned long long)t.entries, (double)t.bytes / (1 << 20),
            (double)(pstore_max_size(ps) / CAP_SHARE) / (1 << 20));
}

enum kvb_status pstore_results_verify(struct pstore *ps, FILE *out, uint64_t *n_bad, struct kvb_err *err)
{
    struct pstore_results *r = ps->res;
    *n_bad = 0;
    if (!r) return KVB_OK;
    MDB_txn *txn;
    int rc = pstore_txn_begin(ps, false, &txn);
    if (rc) return pstore_lmdb_status(err, rc, "cache verify");
    MDB_cursor *cur;
    uint64_t n = 0;
    if ((rc = mdb_cursor_open(txn, r->db_val, &cur)) == 0) {
        MDB_val k, v;
        for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            n++;
            if (k.mv_size == 16 && value_sound(v.mv_data, v.mv_size)) continue;
            struct pstore_key key;
            memset(key.b, 0, 16);
            memcpy(key.b, k.mv_data, k.mv_size < 16 ? k.mv_size : 16);
            note_key(&r->damaged, &r->n_damaged, &r->cap_damaged, &key);
            (*n_bad)++;
        }
        mdb_cursor_close(cur);
    }
    pstore_txn_abort(ps, txn);
    if (rc != MDB_NOTFOUND && rc) return pstore_lmdb_status(err, rc, "cache verify");
    r->st.damaged += *n_bad;
    fprintf(out, "results: %llu checked, %llu damaged (removed)\n", (unsigned long long)n, (unsigned long long)*n_bad);
    return pstore_results_flush(ps, err);
}
