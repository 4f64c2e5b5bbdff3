/* pstore_db.c — every change to the cache's LMDB databases, inside a
 * transaction the caller owns: insert, touch, delete, least-recently-used
 * garbage collection and the orphan sweep, with the record layouts they use.
 *
 * Databases (named, in one environment):
 *   blocks: key16 -> encoded value (pstore_codec.c)
 *   meta:   key16 -> struct pstore_meta (parent, model identity, last use,
 *           sizes, child count)
 *   models: identity16 -> struct pstore_model_rec
 *   info:   "totals" -> struct pstore_totals
 * The invariant everything here keeps: every meta entry's parent exists
 * (inserts whose parent is absent are refused, only leaves are evicted, and
 * deleting a damaged entry is followed by a sweep that removes what hung
 * below it). So a block that is in the store is reachable by a lookup that
 * walks its chain, and the size cap never strands unreachable bytes.
 *
 * Child counts are kept on insert and delete, and recomputed from a scan
 * whenever one is made anyway (GC, sweep), which also repairs any drift.
 * Functions return LMDB codes (0 = success). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "store/pstore/pstore_bytes.h"
#include "store/pstore/pstore_internal.h"

/* ---- transactions ------------------------------------------------------------ */

/* The calling thread's guarded region (pstore_guard.c) is told what to
 * undo should the map fault: the open transaction, the held lock. */
static void guard_note(MDB_txn *txn, bool locked)
{
    struct pstore_guard *g = pstore_guard_current();
    if (!g) return;
    g->txn = txn;
    g->env_locked = locked;
}

int pstore_txn_begin(struct pstore *ps, bool write, MDB_txn **txn)
{
    *txn = NULL;
    if (atomic_load(&ps->broken)) return MDB_PANIC; /* the file faulted under this process: off */
    for (int tries = 0;; tries++) {
        pthread_rwlock_rdlock(&ps->env_lock);
        guard_note(NULL, true);
        int rc = mdb_txn_begin(ps->env, NULL, write ? 0 : MDB_RDONLY, txn);
        if (rc == 0) {
            guard_note(*txn, true);
            return 0;
        }
        *txn = NULL;
        pthread_rwlock_unlock(&ps->env_lock);
        guard_note(NULL, false);
        if (rc != MDB_MAP_RESIZED || tries >= 3) return rc;
        /* Another process grew the map beyond ours: adopt its size. Only
         * legal with no transaction of ours open, hence the write lock. */
        pthread_rwlock_wrlock(&ps->env_lock);
        guard_note(NULL, true);
        rc = mdb_env_set_mapsize(ps->env, 0);
        pthread_rwlock_unlock(&ps->env_lock);
        guard_note(NULL, false);
        if (rc) return rc;
    }
}

void pstore_txn_abort(struct pstore *ps, MDB_txn *txn)
{
    if (!txn) return;
    mdb_txn_abort(txn);
    guard_note(NULL, true);
    pthread_rwlock_unlock(&ps->env_lock);
    guard_note(NULL, false);
}

int pstore_txn_commit(struct pstore *ps, MDB_txn *txn)
{
    int rc = mdb_txn_commit(txn); /* frees txn even when it fails */
    guard_note(NULL, true);
    pthread_rwlock_unlock(&ps->env_lock);
    guard_note(NULL, false);
    return rc;
}

enum kvb_status pstore_lmdb_status(struct kvb_err *err, int rc, const char *what)
{
    enum kvb_status st;
    switch (rc) {
    case 0: return KVB_OK;
    case ENOMEM: st = KVB_ERR_NOMEM; break;
    case MDB_NOTFOUND: st = KVB_ERR_NOT_FOUND; break;
    case MDB_INVALID:
    case MDB_CORRUPTED:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
    case MDB_BAD_VALSIZE: st = KVB_ERR_FORMAT; break;
    default: st = KVB_ERR_IO; break;
    }
    return kvb_errf(err, st, "%s: %s%s", what, mdb_strerror(rc), pstore_lmdb_hint(rc));
}

const char *pstore_lmdb_hint(int rc)
{
    switch (rc) {
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_CURSOR_FULL:
    case MDB_PAGE_FULL:
    case MDB_INVALID:
        return " (the cache file looks damaged: `kvbatch cache verify` checks it; the next `kvbatch run` moves a "
               "damaged file aside and starts an empty cache)";
    default: return "";
    }
}

/* ---- records --------------------------------------------------------------------- */

#define META_HAS_PARENT 1u

void pstore_meta_pack(const struct pstore_meta *m, uint8_t out[PSTORE_META_LEN])
{
    memcpy(out, m->has_parent ? m->parent.b : (const uint8_t[16]){0}, 16);
    memcpy(out + 16, m->identity, 16);
    put_u64(out + 32, m->last_used);
    put_u64(out + 40, m->value_len);
    put_u64(out + 48, m->raw_len);
    put_u32(out + 56, m->n_children);
    put_u32(out + 60, m->has_parent ? META_HAS_PARENT : 0);
}

bool pstore_meta_unpack(const void *p, size_t len, struct pstore_meta *m)
{
    const uint8_t *b = p;
    if (len != PSTORE_META_LEN) return false;
    uint32_t flags = get_u32(b + 60);
    if (flags & ~META_HAS_PARENT) return false;
    memcpy(m->parent.b, b, 16);
    m->has_parent = (flags & META_HAS_PARENT) != 0;
    memcpy(m->identity, b + 16, 16);
    m->last_used = get_u64(b + 32);
    m->value_len = get_u64(b + 40);
    m->raw_len = get_u64(b + 48);
    m->n_children = get_u32(b + 56);
    return true;
}

static int meta_get(struct pstore *ps, MDB_txn *txn, const struct pstore_key *key, struct pstore_meta *m, bool *found)
{
    MDB_val k = {16, (void *)key->b}, v;
    int rc = mdb_get(txn, ps->db_meta, &k, &v);
    *found = false;
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    /* A malformed record reads as absent; the sweep and verify remove it. */
    *found = pstore_meta_unpack(v.mv_data, v.mv_size, m);
    return 0;
}

static int meta_put(struct pstore *ps, MDB_txn *txn, const struct pstore_key *key, const struct pstore_meta *m)
{
    uint8_t buf[PSTORE_META_LEN];
    pstore_meta_pack(m, buf);
    MDB_val k = {16, (void *)key->b}, v = {sizeof buf, buf};
    return mdb_put(txn, ps->db_meta, &k, &v, 0);
}

static const char TOTALS_KEY[] = "totals";

int pstore_totals_get(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t)
{
    MDB_val k = {sizeof TOTALS_KEY - 1, (void *)TOTALS_KEY}, v;
    memset(t, 0, sizeof *t);
    int rc = mdb_get(txn, ps->db_info, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (v.mv_size == 32) {
        const uint8_t *b = v.mv_data;
        t->entries = get_u64(b);
        t->bytes = get_u64(b + 8);
        t->raw = get_u64(b + 16);
        t->clock = get_u64(b + 24);
    }
    return 0;
}

int pstore_totals_put(struct pstore *ps, MDB_txn *txn, const struct pstore_totals *t)
{
    uint8_t b[32];
    put_u64(b, t->entries);
    put_u64(b + 8, t->bytes);
    put_u64(b + 16, t->raw);
    put_u64(b + 24, t->clock);
    MDB_val k = {sizeof TOTALS_KEY - 1, (void *)TOTALS_KEY}, v = {sizeof b, b};
    return mdb_put(txn, ps->db_info, &k, &v, 0);
}

/* models record: u32 dtype, block_size, n_layer, kv_dim; 32 fingerprint
 * bytes; then the name (no NUL). */
int pstore_model_rec_put(struct pstore *ps, MDB_txn *txn, const struct pstore_model_rec *r)
{
    uint8_t b[16 + 32 + sizeof r->name];
    size_t nl = strnlen(r->name, sizeof r->name - 1);
    put_u32(b, (uint32_t)r->dtype);
    put_u32(b + 4, (uint32_t)r->block_size);
    put_u32(b + 8, (uint32_t)r->n_layer);
    put_u32(b + 12, (uint32_t)r->kv_dim);
    memcpy(b + 16, r->fingerprint, 32);
    memcpy(b + 48, r->name, nl);
    MDB_val k = {16, (void *)r->identity}, v = {48 + nl, b};
    int rc = mdb_put(txn, ps->db_models, &k, &v, MDB_NOOVERWRITE);
    return rc == MDB_KEYEXIST ? 0 : rc;
}

int pstore_model_recs_load(struct pstore *ps, MDB_txn *txn, struct pstore_model_rec **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, ps->db_models, &cur);
    if (rc) return rc;
    size_t cap = 0;
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 16 || v.mv_size < 48 || v.mv_size > 48 + sizeof((*out)->name) - 1) continue;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 8;
            struct pstore_model_rec *p = kvb_realloc(*out, nc * sizeof *p);
            if (!p) {
                rc = ENOMEM;
                break;
            }
            *out = p;
            cap = nc;
        }
        struct pstore_model_rec *r = &(*out)[(*n)++];
        const uint8_t *b = v.mv_data;
        memcpy(r->identity, k.mv_data, 16);
        r->dtype = (enum pstore_dtype)get_u32(b);
        r->block_size = (int32_t)get_u32(b + 4);
        r->n_layer = (int32_t)get_u32(b + 8);
        r->kv_dim = (int32_t)get_u32(b + 12);
        memcpy(r->fingerprint, b + 16, 32);
        r->fingerprint[32] = '\0';
        memcpy(r->name, b + 48, v.mv_size - 48);
        r->name[v.mv_size - 48] = '\0';
    }
    mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND) rc = 0;
    if (rc) {
        kvb_free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- entries ------------------------------------------------------------------------ */

bool pstore_value_acceptable(const struct pstore *ps, const uint8_t *val, size_t len, size_t annex_len)
{
    struct pstore_hdr h;
    if (pstore_hdr_parse(val, len, &h, NULL) != KVB_OK) return false;
    return (!(h.flags & PSTORE_FLAG_LOSSY8) || ps->opts.lossy8) && pstore_hdr_has_annex(&h, annex_len);
}

static void sub_clamped(uint64_t *a, uint64_t b) { *a = *a > b ? *a - b : 0; }

int pstore_db_insert(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, const struct pstore_key *key,
                     const struct pstore_key *parent, const uint8_t identity[16], const uint8_t *val, size_t len,
                     uint64_t raw_len, size_t annex_len, enum pstore_insert_result *res)
{
    MDB_val k = {16, (void *)key->b}, v;
    struct pstore_meta m;
    bool found;
    int rc = meta_get(ps, txn, key, &m, &found);
    if (rc) return rc;
    if (found) {
        rc = mdb_get(txn, ps->db_blocks, &k, &v);
        if (rc && rc != MDB_NOTFOUND) return rc;
        m.last_used = ++t->clock;
        if (rc == 0 && pstore_value_acceptable(ps, v.mv_data, v.mv_size, annex_len)) {
            *res = PSTORE_PRESENT;
            return meta_put(ps, txn, key, &m);
        }
        /* Lossy (and we are lossless), without the annex ours has, or
         * malformed: ours is better. The entry keeps its place in the tree. */
        v = (MDB_val){len, (void *)val};
        if ((rc = mdb_put(txn, ps->db_blocks, &k, &v, 0))) return rc;
        sub_clamped(&t->bytes, m.value_len);
        sub_clamped(&t->raw, m.raw_len);
        t->bytes += len;
        t->raw += raw_len;
        m.value_len = len;
        m.raw_len = raw_len;
        *res = PSTORE_REPLACED;
        return meta_put(ps, txn, key, &m);
    }

    struct pstore_meta pm;
    if (parent) {
        rc = meta_get(ps, txn, parent, &pm, &found);
        if (rc) return rc;
        if (!found) {
            *res = PSTORE_NO_PARENT;
            return 0;
        }
    }
    /* Overwrites a value left without its meta record (a bug's trace). */
    v = (MDB_val){len, (void *)val};
    if ((rc = mdb_put(txn, ps->db_blocks, &k, &v, 0))) return rc;
    memset(&m, 0, sizeof m);
    m.has_parent = parent != NULL;
    if (parent) m.parent = *parent;
    memcpy(m.identity, identity, 16);
    m.last_used = ++t->clock;
    m.value_len = len;
    m.raw_len = raw_len;
    if ((rc = meta_put(ps, txn, key, &m))) return rc;
    if (parent) {
        /* Using a child uses its prefix: the parent counts as used now too. */
        pm.n_children++;
        pm.last_used = t->clock;
        if ((rc = meta_put(ps, txn, parent, &pm))) return rc;
    }
    t->entries++;
    t->bytes += len;
    t->raw += raw_len;
    *res = PSTORE_INSERTED;
    return 0;
}

int pstore_db_touch(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, const struct pstore_key *key)
{
    struct pstore_meta m;
    bool found;
    int rc = meta_get(ps, txn, key, &m, &found);
    if (rc || !found) return rc;
    m.last_used = ++t->clock;
    return meta_put(ps, txn, key, &m);
}

int pstore_db_delete(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, const struct pstore_key *key,
                     bool *found)
{
    MDB_val k = {16, (void *)key->b};
    struct pstore_meta m;
    bool has_meta;
    int rc = meta_get(ps, txn, key, &m, &has_meta);
    if (rc) return rc;
    *found = false;
    if (has_meta) {
        sub_clamped(&t->entries, 1);
        sub_clamped(&t->bytes, m.value_len);
        sub_clamped(&t->raw, m.raw_len);
        if (m.has_parent) {
            struct pstore_meta pm;
            bool pf;
            if ((rc = meta_get(ps, txn, &m.parent, &pm, &pf))) return rc;
            if (pf && pm.n_children > 0) {
                pm.n_children--;
                if ((rc = meta_put(ps, txn, &m.parent, &pm))) return rc;
            }
        }
    }
    rc = mdb_del(txn, ps->db_meta, &k, NULL);
    if (rc == 0) *found = true;
    else if (rc != MDB_NOTFOUND) return rc;
    rc = mdb_del(txn, ps->db_blocks, &k, NULL);
    if (rc == 0) *found = true;
    else if (rc != MDB_NOTFOUND) return rc;
    return 0;
}

/* ---- whole-tree passes ------------------------------------------------------------- */

struct ent {
    struct pstore_meta m;
    struct pstore_key key;
    int64_t parent;    /* index of the parent entry, -1 when none or missing */
    uint32_t children; /* recomputed from the scan */
    uint8_t state;
};

static int ent_cmp(const void *a, const void *b)
{
    return memcmp(((const struct ent *)a)->key.b, ((const struct ent *)b)->key.b, 16);
}

static int64_t ent_find(const struct ent *e, size_t n, const struct pstore_key *key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = memcmp(e[mid].key.b, key->b, 16);
        if (c == 0) return (int64_t)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* Reads every meta record, sorted by key, with parent indices and child
 * counts. Malformed records are left out (the sweep deletes them). LMDB
 * already returns keys in order, so the sort is a no-op safety net. */
static int scan(struct pstore *ps, MDB_txn *txn, struct ent **out, size_t *n_out, struct pstore_key **bad,
                size_t *n_bad)
{
    *out = NULL;
    *n_out = 0;
    if (bad) *bad = NULL, *n_bad = 0;
    MDB_stat stt;
    int rc = mdb_stat(txn, ps->db_meta, &stt);
    if (rc) return rc;
    size_t cap = stt.ms_entries ? (size_t)stt.ms_entries : 1, n = 0, cap_bad = 0;
    struct ent *e = kvb_malloc(cap * sizeof *e);
    if (!e) return ENOMEM;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, ps->db_meta, &cur))) {
        kvb_free(e);
        return rc;
    }
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct pstore_meta m;
        if (k.mv_size != 16 || !pstore_meta_unpack(v.mv_data, v.mv_size, &m)) {
            if (!bad || k.mv_size != 16) continue;
            if (*n_bad == cap_bad) {
                size_t nc = cap_bad ? 2 * cap_bad : 16;
                struct pstore_key *p = kvb_realloc(*bad, nc * sizeof *p);
                if (!p) {
                    rc = ENOMEM;
                    break;
                }
                *bad = p;
                cap_bad = nc;
            }
            memcpy((*bad)[(*n_bad)++].b, k.mv_data, 16);
            continue;
        }
        if (n == cap) { /* another writer cannot add entries inside our txn; still, be safe */
            struct ent *p = kvb_realloc(e, 2 * cap * sizeof *e);
            if (!p) {
                rc = ENOMEM;
                break;
            }
            e = p;
            cap *= 2;
        }
        e[n].m = m;
        memcpy(e[n].key.b, k.mv_data, 16);
        e[n].parent = -1;
        e[n].children = 0;
        e[n].state = 0;
        n++;
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) {
        kvb_free(e);
        if (bad) kvb_free(*bad), *bad = NULL, *n_bad = 0;
        return rc;
    }
    qsort(e, n, sizeof *e, ent_cmp);
    for (size_t i = 0; i < n; i++) {
        if (!e[i].m.has_parent) continue;
        e[i].parent = ent_find(e, n, &e[i].m.parent);
        if (e[i].parent >= 0) e[e[i].parent].children++;
    }
    *out = e;
    *n_out = n;
    return 0;
}

static int del_entry(struct pstore *ps, MDB_txn *txn, const struct pstore_key *key)
{
    MDB_val k = {16, (void *)key->b};
    int rc = mdb_del(txn, ps->db_meta, &k, NULL);
    if (rc && rc != MDB_NOTFOUND) return rc;
    rc = mdb_del(txn, ps->db_blocks, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Writes back child counts that differ from the stored ones. */
static int fix_counts(struct pstore *ps, MDB_txn *txn, struct ent *e, size_t n, uint64_t *n_fixed)
{
    for (size_t i = 0; i < n; i++) {
        if (e[i].state == 2 || e[i].m.n_children == e[i].children) continue;
        e[i].m.n_children = e[i].children;
        int rc = meta_put(ps, txn, &e[i].key, &e[i].m);
        if (rc) return rc;
        if (n_fixed) (*n_fixed)++;
    }
    return 0;
}

/* Min-heap of entry indices: orphans first, then least recently used, then
 * key order so that eviction is deterministic. */
struct heap {
    uint32_t *a;
    size_t n;
    const struct ent *e;
};

static bool heap_less(const struct heap *h, uint32_t x, uint32_t y)
{
    const struct ent *a = &h->e[x], *b = &h->e[y];
    bool oa = a->m.has_parent && a->parent < 0, ob = b->m.has_parent && b->parent < 0;
    if (oa != ob) return oa;
    if (a->m.last_used != b->m.last_used) return a->m.last_used < b->m.last_used;
    return memcmp(a->key.b, b->key.b, 16) < 0;
}

static void heap_push(struct heap *h, uint32_t x)
{
    size_t i = h->n++;
    h->a[i] = x;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(h, h->a[i], h->a[p])) break;
        uint32_t t = h->a[i];
        h->a[i] = h->a[p];
        h->a[p] = t;
        i = p;
    }
}

static uint32_t heap_pop(struct heap *h)
{
    uint32_t top = h->a[0];
    h->a[0] = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && heap_less(h, h->a[l], h->a[m])) m = l;
        if (r < h->n && heap_less(h, h->a[r], h->a[m])) m = r;
        if (m == i) break;
        uint32_t t = h->a[i];
        h->a[i] = h->a[m];
        h->a[m] = t;
        i = m;
    }
    return top;
}

int pstore_db_gc(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, uint64_t target, uint64_t max_evict,
                 uint64_t *n_evicted)
{
    *n_evicted = 0;
    if (t->bytes <= target) return 0;
    struct ent *e;
    size_t n;
    int rc = scan(ps, txn, &e, &n, NULL, NULL);
    if (rc) return rc;
    if (n > UINT32_MAX) {
        kvb_free(e);
        return ENOMEM;
    }
    struct heap h = {kvb_malloc((n ? n : 1) * sizeof(uint32_t)), 0, e};
    if (!h.a) {
        kvb_free(e);
        return ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        if (e[i].children == 0) heap_push(&h, (uint32_t)i);
    while (t->bytes > target && h.n > 0 && *n_evicted < max_evict) {
        uint32_t i = heap_pop(&h);
        if ((rc = del_entry(ps, txn, &e[i].key))) break;
        e[i].state = 2;
        sub_clamped(&t->entries, 1);
        sub_clamped(&t->bytes, e[i].m.value_len);
        sub_clamped(&t->raw, e[i].m.raw_len);
        (*n_evicted)++;
        int64_t p = e[i].parent;
        if (p >= 0 && --e[p].children == 0) heap_push(&h, (uint32_t)p);
    }
    if (rc == 0) rc = fix_counts(ps, txn, e, n, NULL);
    kvb_free(h.a);
    kvb_free(e);
    return rc;
}

enum { ST_UNKNOWN = 0, ST_OK = 1, ST_BAD = 2, ST_VISITING = 3 };

int pstore_db_sweep(struct pstore *ps, MDB_txn *txn, struct pstore_totals *t, uint64_t *n_removed, uint64_t *n_fixed)
{
    *n_removed = 0;
    if (n_fixed) *n_fixed = 0;
    struct ent *e;
    size_t n, n_badmeta;
    struct pstore_key *badmeta;
    int rc = scan(ps, txn, &e, &n, &badmeta, &n_badmeta);
    if (rc) return rc;
    size_t *stack = kvb_malloc((n ? n : 1) * sizeof *stack);
    if (!stack) {
        kvb_free(e);
        kvb_free(badmeta);
        return ENOMEM;
    }
    /* Walk each chain up to a known entry, a root, or a break; everything on
     * the way shares the outcome (links already passed were sound). */
    for (size_t i = 0; i < n; i++) {
        if (e[i].state != ST_UNKNOWN) continue;
        size_t sp = 0, j = i;
        uint8_t st;
        for (;;) {
            if (e[j].state == ST_OK || e[j].state == ST_BAD) {
                st = e[j].state;
                break;
            }
            if (e[j].state == ST_VISITING) { /* a cycle: no root above */
                st = ST_BAD;
                break;
            }
            e[j].state = ST_VISITING;
            stack[sp++] = j;
            if (!e[j].m.has_parent) {
                st = ST_OK;
                break;
            }
            int64_t p = e[j].parent;
            if (p < 0 || memcmp(e[p].m.identity, e[j].m.identity, 16) != 0) {
                st = ST_BAD;
                break;
            }
            j = (size_t)p;
        }
        while (sp > 0) e[stack[--sp]].state = st;
    }
    kvb_free(stack);

    struct pstore_totals nt = {0, 0, 0, t->clock};
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (e[i].state == ST_BAD) {
            rc = del_entry(ps, txn, &e[i].key);
            (*n_removed)++;
        } else {
            nt.entries++;
            nt.bytes += e[i].m.value_len;
            nt.raw += e[i].m.raw_len;
        }
    }
    for (size_t i = 0; i < n_badmeta && rc == 0; i++) {
        rc = del_entry(ps, txn, &badmeta[i]);
        (*n_removed)++;
    }
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) e[i].children = 0;
        for (size_t i = 0; i < n; i++)
            if (e[i].state == ST_OK && e[i].parent >= 0) e[e[i].parent].children++;
        rc = fix_counts(ps, txn, e, n, n_fixed);
    }
    if (rc == 0) *t = nt;
    kvb_free(e);
    kvb_free(badmeta);
    return rc;
}
