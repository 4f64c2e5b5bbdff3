/* tok_map.c — see tok_map.h. xxHash gives a good spread on short keys; the
 * full 64-bit hash is stored so most probes never touch the key bytes. */
#include "text/tok_map.h"

#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"

enum kvb_status tok_map_init(struct tok_map *m, size_t max_keys)
{
    size_t cap = 16;
    while (cap < max_keys * 2) cap *= 2; /* load factor <= 1/2 keeps probes short */
    m->slots = kvb_calloc(cap, sizeof *m->slots);
    if (!m->slots) return KVB_ERR_NOMEM;
    m->mask = cap - 1;
    m->n = 0;
    return KVB_OK;
}

void tok_map_free(struct tok_map *m)
{
    if (!m) return;
    kvb_free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->n = 0;
}

bool tok_map_put(struct tok_map *m, const char *key, size_t len, int32_t val)
{
    if (!m->slots || m->n + 1 > (m->mask + 1) / 2) return false;
    uint64_t h = XXH3_64bits(key, len);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        struct tok_map_slot *s = &m->slots[i];
        if (!s->key) {
            s->hash = h;
            s->key = key;
            s->len = (uint32_t)len;
            s->val = val;
            m->n++;
            return true;
        }
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) return false;
    }
}

int32_t tok_map_get(const struct tok_map *m, const char *key, size_t len)
{
    if (!m->slots) return -1;
    uint64_t h = XXH3_64bits(key, len);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_map_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) return s->val;
    }
}
