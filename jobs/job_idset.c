/* job_idset.c — a set of byte strings, for duplicate custom_id detection and
 * for the keys a resumed run skips.
 *
 * Open addressing with linear probing over 64-bit xxh3 hashes; the table
 * stays at most 70% full. Strings are copied into 64 KiB chunks (a long id
 * gets a chunk of its own), so memory is a few words per id plus the ids'
 * bytes, and freeing is one pass over the chunk list. Nothing is ever
 * removed, which is all a batch run needs. */
#include "jobs/job.h"

#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"

#define CHUNK_BYTES ((size_t)64 << 10)

struct slot {
    uint64_t hash;
    const char *id; /* NULL: empty slot */
    size_t len;
};

struct chunk {
    struct chunk *next;
    size_t used, cap;
    char data[]; /* cap bytes */
};

struct job_idset {
    struct slot *slots;
    size_t mask; /* slot count - 1 (a power of two) */
    size_t count;
    struct chunk *chunks;
};

enum kvb_status job_idset_create(struct job_idset **out)
{
    *out = NULL;
    struct job_idset *s = kvb_calloc(1, sizeof *s);
    if (!s) return KVB_ERR_NOMEM;
    s->slots = kvb_calloc(64, sizeof *s->slots);
    if (!s->slots) {
        kvb_free(s);
        return KVB_ERR_NOMEM;
    }
    s->mask = 63;
    *out = s;
    return KVB_OK;
}

void job_idset_free(struct job_idset *s)
{
    if (!s) return;
    for (struct chunk *c = s->chunks, *next; c; c = next) {
        next = c->next;
        kvb_free(c);
    }
    kvb_free(s->slots);
    kvb_free(s);
}

size_t job_idset_count(const struct job_idset *s) { return s->count; }

static size_t find(const struct job_idset *s, uint64_t h, const char *id, size_t len)
{
    size_t i = (size_t)h & s->mask;
    for (;;) {
        const struct slot *sl = &s->slots[i];
        if (!sl->id || (sl->hash == h && sl->len == len && memcmp(sl->id, id, len) == 0)) return i;
        i = (i + 1) & s->mask;
    }
}

bool job_idset_contains(const struct job_idset *s, const char *id, size_t len)
{
    uint64_t h = XXH3_64bits(id, len);
    return s->slots[find(s, h, id, len)].id != NULL;
}

static enum kvb_status grow(struct job_idset *s)
{
    size_t n = (s->mask + 1) * 2;
    struct slot *ns = kvb_calloc(n, sizeof *ns);
    if (!ns) return KVB_ERR_NOMEM;
    for (size_t i = 0; i <= s->mask; i++) {
        if (!s->slots[i].id) continue;
        size_t j = (size_t)s->slots[i].hash & (n - 1);
        while (ns[j].id) j = (j + 1) & (n - 1);
        ns[j] = s->slots[i];
    }
    kvb_free(s->slots);
    s->slots = ns;
    s->mask = n - 1;
    return KVB_OK;
}

/* Copies id into chunk storage. The copy is not NUL-terminated: ids are
 * compared by length. */
static const char *store(struct job_idset *s, const char *id, size_t len)
{
    struct chunk *c = s->chunks;
    if (!c || c->cap - c->used < len) {
        size_t cap = len > CHUNK_BYTES / 4 ? len : CHUNK_BYTES;
        struct chunk *nc = kvb_malloc(sizeof *nc + cap);
        if (!nc) return NULL;
        nc->used = 0;
        nc->cap = cap;
        if (cap == len && c) {
            /* a long id's own chunk goes second, so the current chunk stays
             * the one short ids keep filling */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            s->chunks = nc;
        }
        c = nc;
    }
    char *p = c->data + c->used;
    memcpy(p, id, len);
    c->used += len;
    return p;
}

enum kvb_status job_idset_add(struct job_idset *s, const char *id, size_t len, bool *added)
{
    if (added) *added = false;
    uint64_t h = XXH3_64bits(id, len);
    size_t i = find(s, h, id, len);
    if (s->slots[i].id) return KVB_OK;
    if ((s->count + 1) * 10 > (s->mask + 1) * 7) {
        KVB_FORWARD_IF_ERROR(grow(s));
        i = find(s, h, id, len);
    }
    const char *p = store(s, id, len);
    if (!p) return KVB_ERR_NOMEM;
    s->slots[i] = (struct slot){.hash = h, .id = p, .len = len};
    s->count++;
    if (added) *added = true;
    return KVB_OK;
}
