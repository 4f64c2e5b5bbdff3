/* tok_map.h — string → int32 hash map for the tokenizer (token text → id,
 * "left right" merge → rank).
 *
 * Fixed capacity chosen at init (open addressing, linear probing, never
 * resized: the tokenizer knows its key count up front). Keys are NOT copied:
 * they must stay valid and unchanged for the map's lifetime (the tokenizer
 * keeps them in its own arena). Read-only use is thread-safe. */
#ifndef KVB_TOK_MAP_H
#define KVB_TOK_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct tok_map_slot {
    uint64_t hash;
    const char *key; /* NULL = empty slot */
    uint32_t len;
    int32_t val;
};

struct tok_map {
    struct tok_map_slot *slots;
    size_t mask; /* capacity - 1, capacity a power of two */
    size_t n;
};

/* Room for up to max_keys keys. KVB_ERR_NOMEM on failure. */
enum kvb_status tok_map_init(struct tok_map *m, size_t max_keys);
void tok_map_free(struct tok_map *m); /* accepts a zeroed map */

/* Inserts key → val unless the key is present (then returns false and keeps
 * the first value, as the reference does for duplicate merges). Inserting
 * past max_keys is a caller bug and returns false. */
bool tok_map_put(struct tok_map *m, const char *key, size_t len, int32_t val);
/* The value stored for key, or -1. */
int32_t tok_map_get(const struct tok_map *m, const char *key, size_t len);

#endif
