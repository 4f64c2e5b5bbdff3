/* pstore_check.c — a structural check of the cache's LMDB file, made when a
 * store is opened, before anything else reads it.
 *
 * LMDB trusts its file. It keeps no checksums, and it reads pages through a
 * shared map: a truncated data.mdb makes it touch pages past the end of the
 * file (SIGBUS), one overwritten branch page sends it after garbage page
 * numbers (SIGSEGV, or MDB_CURSOR_FULL), a damaged free list hands the
 * writer pages that are still in use. The values carry their own checksums
 * (pstore_codec.c) and a bad one is only a miss; the structure that leads
 * to them has none. So this walks the latest committed snapshot of the file
 * with pread — never through the map, so a short or damaged file cannot
 * fault here — and checks every fact that LMDB relies on when it reads,
 * writes, allocates or frees:
 *   - the meta pages: flags, magic, format version, page size; the one the
 *     lock file names holds that transaction, the other is older;
 *   - every branch and leaf page of every database (the free list, the main
 *     database and the named ones inside it): its own page number, flags
 *     (branch above, leaf at the tree's depth), bounds, node offsets and
 *     sizes inside the page, keys in order within the page and within the
 *     range its parent gives it, each page reached once and inside the file;
 *   - every overflow run (a value too big for a leaf): header page number,
 *     flags and page count, all of it inside the file;
 *   - the free list: record lengths, page numbers in range, sorted as LMDB
 *     merges them, none listed twice, none in use;
 *   - the counts each database record keeps (pages by kind, entries).
 * Value bytes are not read: the codec checks those on every load.
 *
 * The walk holds a read transaction, so what it reads is one snapshot even
 * while other processes commit: LMDB does not reuse a page that a reader's
 * snapshot may still see. Damage it finds is therefore never a transient
 * state of a live writer.
 *
 * Cost: a pread of one page per branch or leaf page and of 16 bytes per
 * overflow run (those in page order, by several threads: a cold disk serves
 * many at once); linear in entries, not in bytes stored (pstore.h has
 * figures).
 *
 * The on-disk format is LMDB 0.9's (MDB_DATA_VERSION 1) on a little-endian
 * 64-bit machine. Built against anything else, the check says ENOTSUP and
 * the store is used unchecked. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "store/pstore/pstore_internal.h"

#if MDB_VERSION_MAJOR == 0 && MDB_VERSION_MINOR == 9 && SIZE_MAX == UINT64_MAX && defined(__BYTE_ORDER__) &&           \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FORMAT_KNOWN 1
#else
#define FORMAT_KNOWN 0
#endif

/* ---- LMDB 0.9's layout (mdb.c), as bytes ---------------------------------------
 * Page header (16 bytes): u64 pgno, u16 pad, u16 flags, u16 lower, u16 upper
 * (an overflow page keeps a u32 page count where lower/upper would be).
 * A branch or leaf page has (lower - 16) / 2 u16 node offsets from byte 16.
 * Node: u16 lo, u16 hi, u16 flags, u16 ksize, key, then (leaf) the data:
 * lo | hi << 16 bytes inline, or a u64 overflow page number (F_BIGDATA), or
 * a database record (F_SUBDATA). In a branch, lo | hi << 16 | flags << 32
 * is the child's page number.
 * Meta page: header, then u32 magic, u32 version, u64 address, u64 mapsize,
 * two database records (free list, main), u64 last page, u64 txnid.
 * Database record (48 bytes): u32 pad (the meta's free-list record keeps
 * the page size here), u16 flags, u16 depth, u64 branch, leaf and overflow
 * page counts, u64 entries, u64 root (all ones when empty). */
#define PAGEHDR 16u
#define P_BRANCH 0x01u
#define P_LEAF 0x02u
#define P_OVERFLOW 0x04u
#define P_META 0x08u
#define F_BIGDATA 0x01u
#define F_SUBDATA 0x02u
#define NODEHDR 8u
#define DBREC 48u
#define META_OFF PAGEHDR
#define META_LEN 136u
#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_DATA_VERSION 1u
#define NO_PAGE UINT64_MAX
#define MAX_DEPTH 32u /* LMDB's CURSOR_STACK */
#define MAX_KEY 511u  /* LMDB's default MDB_MAXKEYSIZE */
/* Database flags kvbatch's named databases never have (they are created
 * with none); the free list is MDB_INTEGERKEY. */
#define DB_PERSISTENT_FLAGS 0x7eu

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

struct dbrec {
    uint16_t flags, depth;
    uint64_t branch, leaf, overflow, entries, root;
};

static void dbrec_parse(const uint8_t *p, struct dbrec *d)
{
    d->flags = rd16(p + 4);
    d->depth = rd16(p + 6);
    d->branch = rd64(p + 8);
    d->leaf = rd64(p + 16);
    d->overflow = rd64(p + 24);
    d->entries = rd64(p + 32);
    d->root = rd64(p + 40);
}

enum db_kind { DB_FREE, DB_MAIN, DB_NAMED };

/* A named database found in the main one, walked after it. */
struct named {
    char name[64];
    struct dbrec rec;
};

/* A value on overflow pages, checked after the trees. */
struct ovrun {
    uint64_t pg, need; /* first page, pages its size needs */
    uint64_t hdr_pgno; /* read from its header: */
    uint32_t hdr_pages;
    uint16_t hdr_flags;
    int16_t rc;  /* 0, -1 (past the end of the file), or an errno */
    uint32_t db; /* index into walk.sums */
};

struct dbsum {
    char name[80];
    uint64_t expect, found; /* overflow pages: the record's count, the pages found */
};

struct bound {
    const uint8_t *k; /* NULL: unbounded */
    size_t n;
};

struct walk {
    int fd;
    uint32_t psize;
    uint64_t last_pg;    /* the meta's last page */
    uint64_t txnid;      /* the snapshot's transaction */
    uint64_t file_pages; /* whole pages in the file */
    uint64_t n_ref;      /* pages a tree may use: min(last_pg + 1, file_pages) */
    uint8_t *used;       /* bitmap, n_ref bits: reached by a tree */
    uint8_t *freed;      /* bitmap, last_pg + 1 bits: listed free */
    uint8_t *pages;      /* (MAX_DEPTH) page buffers, one per tree level */
    uint8_t *idl;        /* a free-list record read off overflow pages */
    size_t idl_cap;
    struct named *named;
    size_t n_named, cap_named;
    /* overflow runs of the main and named databases, whose headers are read
     * after the trees, in page order and in parallel (a cold disk answers
     * many reads at once far faster than one after another) */
    struct ovrun *runs;
    size_t n_runs, cap_runs;
    struct dbsum *sums; /* per database, for the deferred overflow counts */
    size_t n_sums;
    /* the database being walked */
    const char *db_name;
    enum db_kind kind;
    struct dbrec rec;
    uint64_t n_branch, n_leaf, n_overflow, n_entries;
    uint64_t last_free_key;
    struct pstore_check *out;
};

/* Records the first damage found; returns MDB_CORRUPTED for the caller to
 * pass up. */
__attribute__((format(printf, 2, 3))) static int bad(struct walk *w, const char *fmt, ...)
{
    if (!w->out->damaged) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->out->why, sizeof w->out->why, fmt, ap);
        va_end(ap);
        w->out->damaged = true;
    }
    return MDB_CORRUPTED;
}

static bool bit_get(const uint8_t *b, uint64_t i) { return (b[i >> 3] >> (i & 7)) & 1; }
static void bit_set(uint8_t *b, uint64_t i) { b[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* Reads len bytes at off; 0, EIO/errno, or -1 when the file ends first. */
static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno ? errno : EIO;
        if (n == 0) return -1;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static void mark_kind(struct walk *w, uint64_t pg, uint8_t kind)
{
    if (w->out->kinds && pg < w->out->n_kinds) w->out->kinds[pg] = kind;
}

/* A page a tree refers to: in range, inside the file, not reached before. */
static int claim(struct walk *w, uint64_t pg, uint64_t n, const char *what)
{
    if (pg < 2 || pg > w->last_pg || n > w->last_pg + 1 - pg)
        return bad(w, "%s: %s refers to page %llu%s, outside the file's %llu pages", w->db_name, what,
                   (unsigned long long)pg, n > 1 ? " and on" : "", (unsigned long long)(w->last_pg + 1));
    if (pg + n > w->file_pages)
        return bad(w,
                   "%s: %s at page %llu lies past the end of the file (%llu whole pages of %u bytes): "
                   "the file is truncated",
                   w->db_name, what, (unsigned long long)(pg + n - 1), (unsigned long long)w->file_pages, w->psize);
    for (uint64_t i = pg; i < pg + n; i++) {
        if (bit_get(w->used, i))
            return bad(w, "%s: %s: page %llu is reached twice", w->db_name, what, (unsigned long long)i);
        bit_set(w->used, i);
    }
    return 0;
}

/* LMDB's default comparison: bytes, then length. */
static int key_cmp_mem(const uint8_t *a, size_t na, const uint8_t *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    return c ? c : (na < nb ? -1 : na > nb);
}

static int key_cmp(const struct walk *w, const uint8_t *a, size_t na, const uint8_t *b, size_t nb)
{
    if (w->kind == DB_FREE) { /* MDB_INTEGERKEY: 8-byte txnids (sizes checked before) */
        uint64_t x = rd64(a), y = rd64(b);
        return x < y ? -1 : x > y;
    }
    return key_cmp_mem(a, na, b, nb);
}

/* One free-list record: u64 count, then that many page numbers, strictly
 * descending (LMDB merges them in that order and would hand out a page
 * twice otherwise), each free once. */
static int free_record(struct walk *w, uint64_t pg, const uint8_t *key, const uint8_t *d, uint64_t len)
{
    uint64_t txnid = rd64(key);
    if (txnid > w->txnid)
        return bad(w, "free list (page %llu): a record of transaction %llu, after the file's last (%llu)",
                   (unsigned long long)pg, (unsigned long long)txnid, (unsigned long long)w->txnid);
    if (len < 8 || len % 8)
        return bad(w, "free list: record of transaction %llu has %llu bytes", (unsigned long long)txnid,
                   (unsigned long long)len);
    uint64_t n = rd64(d);
    if (n > len / 8 - 1)
        return bad(w, "free list (page %llu): record of transaction %llu claims %llu pages in %llu bytes",
                   (unsigned long long)pg, (unsigned long long)txnid, (unsigned long long)n, (unsigned long long)len);
    for (uint64_t i = 1; i <= n; i++) {
        uint64_t p = rd64(d + 8 * i);
        if (p < 2 || p > w->last_pg)
            return bad(w, "free list (page %llu): page %llu out of range (the file has %llu pages)",
                       (unsigned long long)pg, (unsigned long long)p, (unsigned long long)(w->last_pg + 1));
        if (i > 1 && p >= rd64(d + 8 * (i - 1)))
            return bad(w, "free list (page %llu): record of transaction %llu is not in descending order",
                       (unsigned long long)pg, (unsigned long long)txnid);
        if (bit_get(w->freed, p)) return bad(w, "free list: page %llu is listed free twice", (unsigned long long)p);
        bit_set(w->freed, p);
    }
    return 0;
}

/* An overflow run holding a value of dsize bytes; content (NULL: skipped)
 * receives the value, for free-list records. */
static int overflow(struct walk *w, uint64_t pg, uint64_t dsize, uint8_t *content)
{
    uint64_t need = (PAGEHDR - 1 + dsize) / w->psize + 1;
    int rc = claim(w, pg, 1, "an overflow value");
    if (rc) return rc;
    uint8_t h[PAGEHDR];
    rc = read_at(w->fd, h, sizeof h, pg * w->psize);
    if (rc)
        return rc < 0 ? bad(w, "%s: overflow page %llu is past the end of the file", w->db_name, (unsigned long long)pg)
                      : rc;
    w->out->pages_read++;
    uint32_t npages = rd32(h + 12);
    if (rd64(h) != pg || rd16(h + 10) != P_OVERFLOW || npages < need)
        return bad(w,
                   "%s: overflow page %llu is overwritten (it says page %llu, flags 0x%x, %u pages; "
                   "%llu expected)",
                   w->db_name, (unsigned long long)pg, (unsigned long long)rd64(h), (unsigned)rd16(h + 10), npages,
                   (unsigned long long)need);
    mark_kind(w, pg, PSTORE_PAGE_OVERFLOW_HEAD);
    if (npages > 1) {
        if ((rc = claim(w, pg + 1, npages - 1, "an overflow value"))) return rc;
        for (uint64_t i = pg + 1; i < pg + npages; i++) mark_kind(w, i, PSTORE_PAGE_OVERFLOW);
    }
    w->n_overflow += npages;
    if (content && (rc = read_at(w->fd, content, (size_t)dsize, pg * w->psize + PAGEHDR)))
        return rc < 0 ? bad(w, "%s: overflow value at page %llu runs past the end of the file", w->db_name,
                            (unsigned long long)pg)
                      : rc;
    return 0;
}

/* An overflow run of a main or named database: its first page and the
 * pages its size needs are claimed now, the header is read later
 * (overflow_headers). */
static int overflow_defer(struct walk *w, uint64_t pg, uint64_t dsize)
{
    uint64_t need = (PAGEHDR - 1 + dsize) / w->psize + 1;
    int rc = claim(w, pg, 1, "an overflow value");
    if (rc) return rc;
    if (need > 1 && (pg + need > w->last_pg + 1 || pg + need > w->file_pages))
        return claim(w, pg + 1, need - 1, "an overflow value"); /* says which bound it crosses */
    if (w->n_runs == w->cap_runs) {
        size_t nc = w->cap_runs ? 2 * w->cap_runs : 256;
        struct ovrun *p = kvb_realloc(w->runs, nc * sizeof *p);
        if (!p) return ENOMEM;
        w->runs = p;
        w->cap_runs = nc;
    }
    w->runs[w->n_runs++] = (struct ovrun){.pg = pg, .need = need, .db = (uint32_t)(w->n_sums - 1)};
    return 0;
}

static int leaf_node(struct walk *w, uint64_t pg, const uint8_t *page, const uint8_t *node, uint32_t room)
{
    uint16_t flags = rd16(node + 4), ks = rd16(node + 6);
    uint64_t dsize = (uint64_t)rd16(node) | ((uint64_t)rd16(node + 2) << 16);
    const uint8_t *key = node + NODEHDR, *data = key + ks;
    (void)page;
    uint32_t allowed = w->kind == DB_MAIN ? F_SUBDATA : F_BIGDATA;
    if (flags & ~allowed)
        return bad(w, "%s: leaf page %llu: a node with flags 0x%x", w->db_name, (unsigned long long)pg,
                   (unsigned)flags);
    if (w->kind == DB_FREE && ks != 8)
        return bad(w, "free list: leaf page %llu: a key of %u bytes", (unsigned long long)pg, (unsigned)ks);
    w->n_entries++;
    if (flags & F_BIGDATA) {
        if (NODEHDR + ks + 8u > room)
            return bad(w, "%s: leaf page %llu: a node runs past the page", w->db_name, (unsigned long long)pg);
        uint8_t *content = NULL;
        if (w->kind == DB_FREE) {
            if (dsize > (uint64_t)w->file_pages * w->psize)
                return bad(w, "free list: leaf page %llu: a record of %llu bytes", (unsigned long long)pg,
                           (unsigned long long)dsize);
            if (dsize > w->idl_cap) {
                uint8_t *p = kvb_realloc(w->idl, (size_t)dsize);
                if (!p) return ENOMEM;
                w->idl = p;
                w->idl_cap = (size_t)dsize;
            }
            content = w->idl;
        }
        if (!content) return overflow_defer(w, rd64(data), dsize);
        int rc = overflow(w, rd64(data), dsize, content);
        if (rc) return rc;
        return free_record(w, pg, key, content, dsize);
    }
    if (NODEHDR + ks + dsize > room)
        return bad(w, "%s: leaf page %llu: a node runs past the page", w->db_name, (unsigned long long)pg);
    if (w->kind == DB_FREE) return free_record(w, pg, key, data, dsize);
    if (w->kind == DB_MAIN) {
        /* Only named databases live in the main one: mdb_dbi_open reads them. */
        if (!(flags & F_SUBDATA) || dsize != DBREC)
            return bad(w, "main database: leaf page %llu: an entry that is not a database record",
                       (unsigned long long)pg);
        if (w->n_named == w->cap_named) {
            size_t nc = w->cap_named ? 2 * w->cap_named : 8;
            struct named *p = kvb_realloc(w->named, nc * sizeof *p);
            if (!p) return ENOMEM;
            w->named = p;
            w->cap_named = nc;
        }
        struct named *nd = &w->named[w->n_named++];
        size_t n = ks < sizeof nd->name - 1 ? ks : sizeof nd->name - 1;
        for (size_t i = 0; i < n; i++) nd->name[i] = key[i] >= 0x20 && key[i] < 0x7f ? (char)key[i] : '?';
        nd->name[n] = '\0';
        dbrec_parse(data, &nd->rec);
    }
    return 0;
}

/* The page pg at tree level `level` (0 = root) of the current database,
 * whose keys must lie in [lo, hi). */
static int walk_page(struct walk *w, uint64_t pg, unsigned level, struct bound lo, struct bound hi)
{
    const bool is_leaf = level + 1u == w->rec.depth;
    int rc = claim(w, pg, 1, is_leaf ? "a leaf page" : "a branch page");
    if (rc) return rc;
    uint8_t *p = w->pages + (size_t)level * w->psize;
    rc = read_at(w->fd, p, w->psize, pg * w->psize);
    if (rc)
        return rc < 0 ? bad(w, "%s: page %llu is past the end of the file", w->db_name, (unsigned long long)pg) : rc;
    w->out->pages_read++;
    mark_kind(w, pg, is_leaf ? PSTORE_PAGE_LEAF : PSTORE_PAGE_BRANCH);
    uint16_t flags = rd16(p + 10), lower = rd16(p + 12), upper = rd16(p + 14);
    if (rd64(p) != pg)
        return bad(w, "%s: page %llu is overwritten (it calls itself page %llu)", w->db_name, (unsigned long long)pg,
                   (unsigned long long)rd64(p));
    if (flags != (is_leaf ? P_LEAF : P_BRANCH))
        return bad(w, "%s: page %llu has flags 0x%x where a %s page belongs (depth %u of %u)", w->db_name,
                   (unsigned long long)pg, (unsigned)flags, is_leaf ? "leaf" : "branch", level + 1u,
                   (unsigned)w->rec.depth);
    if (lower < PAGEHDR || lower > upper || upper > w->psize || (lower - PAGEHDR) % 2)
        return bad(w, "%s: page %llu: bounds %u..%u do not fit a page of %u bytes", w->db_name, (unsigned long long)pg,
                   (unsigned)lower, (unsigned)upper, w->psize);
    unsigned n = (lower - PAGEHDR) / 2u;
    if (n == 0) return bad(w, "%s: page %llu is empty", w->db_name, (unsigned long long)pg);
    if (is_leaf) w->n_leaf++;
    else w->n_branch++;
    const uint8_t *prev = NULL;
    size_t prev_n = 0;
    for (unsigned i = 0; i < n; i++) {
        uint16_t off = rd16(p + PAGEHDR + 2u * i);
        if (off < upper || off % 2 || (uint32_t)off + NODEHDR > w->psize)
            return bad(w, "%s: page %llu: node %u at offset %u lies outside the page's node area", w->db_name,
                       (unsigned long long)pg, i, (unsigned)off);
        const uint8_t *node = p + off;
        uint32_t room = w->psize - off;
        uint16_t ks = rd16(node + 6);
        /* LMDB never stores an empty key (mdb_put refuses one), except as a
         * branch's ignored first. */
        if (ks > MAX_KEY || NODEHDR + (uint32_t)ks > room || (ks == 0 && (is_leaf || i > 0)))
            return bad(w, "%s: page %llu: node %u has a key of %u bytes", w->db_name, (unsigned long long)pg, i,
                       (unsigned)ks);
        if (w->kind == DB_FREE && !(is_leaf == false && i == 0) && ks != 8)
            return bad(w, "free list: page %llu: a key of %u bytes", (unsigned long long)pg, (unsigned)ks);
        const uint8_t *key = node + NODEHDR;
        /* A branch's first key is never compared (LMDB searches from the
         * second); every other key is in order and inside [lo, hi). */
        if (is_leaf || i > 0) {
            if (prev && key_cmp(w, prev, prev_n, key, ks) >= 0)
                return bad(w, "%s: page %llu: keys out of order at node %u", w->db_name, (unsigned long long)pg, i);
            if (lo.k && key_cmp(w, key, ks, lo.k, lo.n) < 0)
                return bad(w, "%s: page %llu: a key below the range its parent gives", w->db_name,
                           (unsigned long long)pg);
            if (hi.k && key_cmp(w, key, ks, hi.k, hi.n) >= 0)
                return bad(w, "%s: page %llu: a key above the range its parent gives", w->db_name,
                           (unsigned long long)pg);
            prev = key;
            prev_n = ks;
        }
        if (is_leaf) {
            if ((rc = leaf_node(w, pg, p, node, room))) return rc;
            continue;
        }
        uint64_t child = (uint64_t)rd16(node) | ((uint64_t)rd16(node + 2) << 16) | ((uint64_t)rd16(node + 4) << 32);
        struct bound clo = lo, chi = hi;
        if (i > 0) clo = (struct bound){key, ks};
        if (i + 1 < n) {
            uint16_t noff = rd16(p + PAGEHDR + 2u * (i + 1));
            if (noff < upper || noff % 2 || (uint32_t)noff + NODEHDR > w->psize)
                return bad(w, "%s: page %llu: node %u at offset %u lies outside the page's node area", w->db_name,
                           (unsigned long long)pg, i + 1, (unsigned)noff);
            uint16_t nks = rd16(p + noff + 6);
            if (nks == 0 || nks > MAX_KEY || NODEHDR + (uint32_t)nks > w->psize - noff)
                return bad(w, "%s: page %llu: node %u has a key of %u bytes", w->db_name, (unsigned long long)pg, i + 1,
                           (unsigned)nks);
            if (w->kind == DB_FREE && nks != 8)
                return bad(w, "free list: page %llu: a key of %u bytes", (unsigned long long)pg, (unsigned)nks);
            chi = (struct bound){p + noff + NODEHDR, nks};
        }
        if ((rc = walk_page(w, child, level + 1u, clo, chi))) return rc;
    }
    return 0;
}

static int walk_db(struct walk *w, const char *name, enum db_kind kind, const struct dbrec *rec)
{
    struct dbsum *sum = &w->sums[w->n_sums++];
    snprintf(sum->name, sizeof sum->name, "%s", name);
    sum->expect = rec->overflow;
    sum->found = 0;
    name = sum->name;
    w->db_name = name;
    w->kind = kind;
    w->rec = *rec;
    w->n_branch = w->n_leaf = w->n_overflow = w->n_entries = 0;
    if (kind != DB_FREE && (rec->flags & DB_PERSISTENT_FLAGS))
        return bad(w, "%s: database flags 0x%x, which kvbatch never sets", name, (unsigned)rec->flags);
    if (rec->root == NO_PAGE) {
        if (rec->depth || rec->branch || rec->leaf || rec->overflow || rec->entries)
            return bad(w, "%s: an empty database with depth %u and %llu entries", name, (unsigned)rec->depth,
                       (unsigned long long)rec->entries);
        return 0;
    }
    if (rec->depth == 0 || rec->depth > MAX_DEPTH) return bad(w, "%s: tree depth %u", name, (unsigned)rec->depth);
    int rc = walk_page(w, rec->root, 0, (struct bound){NULL, 0}, (struct bound){NULL, 0});
    if (rc) return rc;
    if (w->n_branch != rec->branch || w->n_leaf != rec->leaf || w->n_entries != rec->entries)
        return bad(w,
                   "%s: the database record counts %llu branch and %llu leaf pages and %llu entries; "
                   "the tree holds %llu, %llu and %llu",
                   name, (unsigned long long)rec->branch, (unsigned long long)rec->leaf,
                   (unsigned long long)rec->entries, (unsigned long long)w->n_branch, (unsigned long long)w->n_leaf,
                   (unsigned long long)w->n_entries);
    sum->found += w->n_overflow; /* the free list's own; deferred runs add theirs later */
    return 0;
}

struct hdr_job {
    int fd;
    uint32_t psize;
    struct ovrun *runs;
    size_t n;
    _Atomic size_t next;
};

static void *hdr_worker(void *arg)
{
    struct hdr_job *j = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 64);
        if (i >= j->n) return NULL;
        size_t end = i + 64 < j->n ? i + 64 : j->n;
        for (; i < end; i++) {
            struct ovrun *r = &j->runs[i];
            uint8_t h[PAGEHDR];
            int rc = read_at(j->fd, h, sizeof h, r->pg * j->psize);
            r->rc = (int16_t)(rc > 0 ? (rc < INT16_MAX ? rc : EIO) : rc);
            if (rc) continue;
            r->hdr_pgno = rd64(h);
            r->hdr_flags = rd16(h + 10);
            r->hdr_pages = rd32(h + 12);
        }
    }
}

static int run_cmp(const void *a, const void *b)
{
    uint64_t x = ((const struct ovrun *)a)->pg, y = ((const struct ovrun *)b)->pg;
    return x < y ? -1 : x > y;
}

#define HDR_THREADS 8

/* The deferred overflow runs: headers read (in page order; by several
 * threads when there are many), then checked and their pages claimed. */
static int overflow_headers(struct walk *w)
{
    if (w->n_runs > 1) qsort(w->runs, w->n_runs, sizeof *w->runs, run_cmp);
    struct hdr_job job = {.fd = w->fd, .psize = w->psize, .runs = w->runs, .n = w->n_runs};
    atomic_init(&job.next, 0);
    pthread_t th[HDR_THREADS];
    int n_th = 0;
    if (w->n_runs >= 1024)
        for (; n_th < HDR_THREADS - 1; n_th++)
            if (pthread_create(&th[n_th], NULL, hdr_worker, &job) != 0) break;
    hdr_worker(&job);
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    w->out->pages_read += w->n_runs;
    for (size_t i = 0; i < w->n_runs; i++) {
        const struct ovrun *r = &w->runs[i];
        w->db_name = w->sums[r->db].name;
        if (r->rc < 0)
            return bad(w, "%s: overflow page %llu is past the end of the file", w->db_name, (unsigned long long)r->pg);
        if (r->rc > 0) return r->rc;
        if (r->hdr_pgno != r->pg || r->hdr_flags != P_OVERFLOW || r->hdr_pages < r->need)
            return bad(w,
                       "%s: overflow page %llu is overwritten (it says page %llu, flags 0x%x, %u pages; "
                       "%llu expected)",
                       w->db_name, (unsigned long long)r->pg, (unsigned long long)r->hdr_pgno, (unsigned)r->hdr_flags,
                       r->hdr_pages, (unsigned long long)r->need);
        mark_kind(w, r->pg, PSTORE_PAGE_OVERFLOW_HEAD);
        if (r->hdr_pages > 1) {
            int rc = claim(w, r->pg + 1, r->hdr_pages - 1ull, "an overflow value");
            if (rc) return rc;
            for (uint64_t p = r->pg + 1; p < r->pg + r->hdr_pages; p++) mark_kind(w, p, PSTORE_PAGE_OVERFLOW);
        }
        w->sums[r->db].found += r->hdr_pages;
    }
    for (size_t i = 0; i < w->n_sums; i++)
        if (w->sums[i].found != w->sums[i].expect)
            return bad(w, "%s: the database record counts %llu overflow pages, the tree holds %llu", w->sums[i].name,
                       (unsigned long long)w->sums[i].expect, (unsigned long long)w->sums[i].found);
    return 0;
}

/* ---- meta pages ------------------------------------------------------------------ */

struct meta {
    bool ok; /* flags, magic and version as LMDB requires */
    uint32_t psize;
    uint64_t last_pg, txnid;
    struct dbrec free_db, main_db;
};

static void meta_parse(const uint8_t *page, struct meta *m)
{
    const uint8_t *b = page + META_OFF;
    m->ok = (rd16(page + 10) & P_META) && rd32(b) == LMDB_MAGIC && rd32(b + 4) == LMDB_DATA_VERSION;
    m->psize = rd32(b + 24);
    dbrec_parse(b + 24, &m->free_db);
    dbrec_parse(b + 72, &m->main_db);
    m->last_pg = rd64(b + 120);
    m->txnid = rd64(b + 128);
}

static bool psize_ok(uint32_t ps) { return ps >= 512 && ps <= 65536 && (ps & (ps - 1)) == 0; }

/* Pages a sound file may have past its end: pages LMDB allocated and
 * freed again in its last transactions are counted in the last page but
 * never written. A file shorter than that is truncated. */
static uint64_t tail_slack(uint64_t file_pages) { return file_pages > (1u << 18) ? file_pages : (1u << 18); }

/* Reads both meta pages. 0, -1 (file too short), or an errno. */
static int metas_read(int fd, uint64_t file_size, struct meta m[2], struct pstore_check *c)
{
    uint8_t buf[PAGEHDR + META_LEN];
    memset(m, 0, 2 * sizeof *m);
    int rc = read_at(fd, buf, sizeof buf, 0);
    if (rc) return rc;
    meta_parse(buf, &m[0]);
    if (!m[0].ok || !psize_ok(m[0].psize)) return 0;
    if (file_size < 2ull * m[0].psize) return -1;
    if ((rc = read_at(fd, buf, sizeof buf, m[0].psize))) return rc;
    meta_parse(buf, &m[1]);
    (void)c;
    return 0;
}

/* The checks on the meta pages that need no tree: what pstore_file_check
 * can say about a file that LMDB refused to open. */
static bool metas_judge(const struct meta m[2], uint64_t file_size, struct pstore_check *c)
{
    for (int i = 0; i < 2; i++) {
        if (!m[i].ok) {
            snprintf(c->why, sizeof c->why, "meta page %d is overwritten (no LMDB header)", i);
            return false;
        }
        if (!psize_ok(m[i].psize) || m[i].psize != m[0].psize) {
            snprintf(c->why, sizeof c->why, "meta page %d gives a page size of %u bytes", i, m[i].psize);
            return false;
        }
    }
    const struct meta *cur = &m[m[0].txnid < m[1].txnid];
    uint64_t file_pages = file_size / cur->psize;
    if (cur->last_pg < 1 || cur->last_pg >= file_pages + tail_slack(file_pages)) {
        snprintf(c->why, sizeof c->why,
                 "the meta page counts %llu pages of %u bytes but the file holds %llu: "
                 "the file is truncated or the meta page is overwritten",
                 (unsigned long long)(cur->last_pg + 1), cur->psize, (unsigned long long)file_pages);
        return false;
    }
    return true;
}

void pstore_file_check(const char *path, struct pstore_check *c)
{
    memset(c->why, 0, sizeof c->why);
    c->damaged = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    struct meta m[2];
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        c->dev = (uint64_t)st.st_dev;
        c->ino = (uint64_t)st.st_ino;
        int rc = metas_read(fd, (uint64_t)st.st_size, m, c);
        if (rc == -1) {
            snprintf(c->why, sizeof c->why, "the file has %llu bytes, less than its two meta pages: it is truncated",
                     (unsigned long long)st.st_size);
            c->damaged = true;
        } else if (rc == 0) {
            c->damaged = !metas_judge(m, (uint64_t)st.st_size, c);
        }
    }
    close(fd);
}

/* ---- the whole check ------------------------------------------------------------------- */

static double now_s(void) { return kvb_clock_s(); }

/* One attempt at txnid T's snapshot: 0 (c->damaged says the outcome),
 * EAGAIN when a newer commit overwrote the meta page meanwhile, or an
 * errno. */
static int check_snapshot(int fd, uint32_t env_psize, uint64_t txnid, struct pstore_check *c)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return errno;
    uint64_t file_size = (uint64_t)st.st_size;
    c->dev = (uint64_t)st.st_dev;
    c->ino = (uint64_t)st.st_ino;
    struct meta m[2];
    int rc = metas_read(fd, file_size, m, c);
    if (rc == -1) {
        snprintf(c->why, sizeof c->why, "the file has %llu bytes, less than its two meta pages: it is truncated",
                 (unsigned long long)file_size);
        c->damaged = true;
        return 0;
    }
    if (rc) return rc;
    /* A reader takes the meta page in slot txnid & 1 (the lock file names
     * the transaction); the writer takes the one with the higher txnid. */
    const struct meta *cur = &m[txnid & 1], *other = &m[(txnid & 1) ^ 1];
    if (cur->ok && cur->txnid > txnid) return EAGAIN;
    if (other->ok && other->txnid > txnid) return EAGAIN;
    if (!metas_judge(m, file_size, c)) {
        c->damaged = true;
        return 0;
    }
    if (cur->txnid != txnid) {
        snprintf(c->why, sizeof c->why, "the lock file names transaction %llu but the meta pages hold %llu and %llu",
                 (unsigned long long)txnid, (unsigned long long)m[0].txnid, (unsigned long long)m[1].txnid);
        c->damaged = true;
        return 0;
    }
    uint64_t fp = file_size / cur->psize;
    if (cur->last_pg < 1 || cur->last_pg >= fp + tail_slack(fp)) {
        snprintf(c->why, sizeof c->why,
                 "the meta page counts %llu pages of %u bytes but the file holds %llu: "
                 "the file is truncated or the meta page is overwritten",
                 (unsigned long long)(cur->last_pg + 1), cur->psize, (unsigned long long)fp);
        c->damaged = true;
        return 0;
    }
    if (cur->psize != env_psize) {
        snprintf(c->why, sizeof c->why, "meta page gives %u-byte pages, LMDB opened it with %u", cur->psize, env_psize);
        c->damaged = true;
        return 0;
    }

    struct walk w = {.fd = fd, .psize = cur->psize, .last_pg = cur->last_pg, .txnid = txnid, .out = c};
    w.file_pages = file_size / w.psize;
    w.n_ref = cur->last_pg + 1 < w.file_pages ? cur->last_pg + 1 : w.file_pages;
    c->file_pages = w.file_pages;
    c->last_pg = cur->last_pg;
    w.used = kvb_calloc((size_t)(cur->last_pg / 8 + 1), 1);
    w.freed = kvb_calloc((size_t)(cur->last_pg / 8 + 1), 1);
    w.pages = kvb_malloc((size_t)MAX_DEPTH * w.psize);
    if (!w.used || !w.freed || !w.pages) {
        rc = ENOMEM;
        goto done;
    }
    for (uint64_t i = 0; i < 2 && i <= cur->last_pg; i++) {
        bit_set(w.used, i);
        mark_kind(&w, i, PSTORE_PAGE_META);
    }
    struct dbsum first[2];
    w.sums = first;
    if ((rc = walk_db(&w, "free list", DB_FREE, &cur->free_db))) goto done;
    if ((rc = walk_db(&w, "main database", DB_MAIN, &cur->main_db))) goto done;
    /* Now that the named databases are known: room for their sums. */
    struct dbsum *sums = kvb_calloc(w.n_named + 2, sizeof *sums);
    if (!sums) {
        rc = ENOMEM;
        goto done;
    }
    memcpy(sums, first, sizeof first);
    w.sums = sums;
    for (size_t i = 0; i < w.n_named; i++) {
        char name[80];
        snprintf(name, sizeof name, "database '%s'", w.named[i].name);
        if ((rc = walk_db(&w, name, DB_NAMED, &w.named[i].rec))) goto done;
    }
    if ((rc = overflow_headers(&w))) goto done;
    /* A free page that a tree uses would be handed out and overwritten. */
    for (uint64_t p = 2; p <= cur->last_pg; p++) {
        if (!bit_get(w.freed, p)) continue;
        mark_kind(&w, p, PSTORE_PAGE_FREE);
        if (p < w.n_ref && bit_get(w.used, p)) {
            rc = bad(&w, "free list: page %llu is listed free but in use", (unsigned long long)p);
            goto done;
        }
    }
done:
    if (w.sums != first) kvb_free(w.sums);
    kvb_free(w.runs);
    kvb_free(w.used);
    kvb_free(w.freed);
    kvb_free(w.pages);
    kvb_free(w.idl);
    kvb_free(w.named);
    if (rc == MDB_CORRUPTED) rc = 0; /* reported through c */
    return rc;
}

int pstore_env_check(MDB_env *env, struct pstore_check *c)
{
    uint8_t *kinds = c->kinds;
    size_t n_kinds = c->n_kinds;
    memset(c, 0, sizeof *c);
    c->kinds = kinds;
    c->n_kinds = n_kinds;
    if (kinds) memset(kinds, 0, n_kinds);
    if (!FORMAT_KNOWN) return ENOTSUP;
    double t0 = now_s();
    int fd;
    int rc = mdb_env_get_fd(env, &fd);
    if (rc) return rc;
    MDB_stat est;
    if ((rc = mdb_env_stat(env, &est))) return rc;
    /* EAGAIN: a commit overwrote a meta page between our transaction's
     * start and the read. A meta page that stays ahead of the lock file's
     * transaction while no commit happens is damage, not a race. */
    uint64_t first_txnid = 0;
    for (int tries = 0;; tries++) {
        MDB_txn *txn;
        rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
        if (rc == MDB_MAP_RESIZED && tries < 20) {
            /* Another process grew the map: adopt its size. */
            if ((rc = mdb_env_set_mapsize(env, 0))) return rc;
            continue;
        }
        if (rc == MDB_MAP_RESIZED) {
            /* Adopting the size did not help: the meta page a reader takes
             * counts more pages than the newest one maps. */
            snprintf(c->why, sizeof c->why,
                     "the meta pages disagree about the file's size (the one readers use "
                     "counts more pages than the newest)");
            c->damaged = true;
            rc = 0;
            break;
        }
        if (rc) return rc;
        uint64_t txnid = mdb_txn_id(txn);
        if (tries == 0) first_txnid = txnid;
        c->pages_read = 0;
        if (kinds) memset(kinds, 0, n_kinds);
        rc = check_snapshot(fd, est.ms_psize, txnid, c);
        mdb_txn_abort(txn);
        if (rc != EAGAIN) break;
        if (tries >= 20) {
            if (txnid == first_txnid) {
                snprintf(c->why, sizeof c->why, "a meta page claims a later transaction than the lock file's %llu",
                         (unsigned long long)txnid);
                c->damaged = true;
                rc = 0;
            }
            break;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    c->seconds = now_s() - t0;
    return rc;
}
