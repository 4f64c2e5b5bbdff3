/* radix.c — block-granular prefix tree over token ids (see radix.h).
 *
 * Nodes live in one array (ids reused through a free list). Children are not
 * stored per node: one open-addressing hash table maps (parent id, the
 * block's tokens) to the child, so a lookup costs one hash of B tokens per
 * block whatever the fan-out (a root with thousands of distinct documents is
 * the RAG case). Eviction scans for the least recently used evictable leaf;
 * it runs at most once per block allocated when the pool is full, and a scan
 * of a few thousand nodes costs far less than prefilling one block. */
#include "engine/radix.h"

#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"

struct node {
    int32_t parent; /* node id, -1 for children of the root */
    int32_t block;  /* KV block id; -1 marks an unused slot */
    int32_t n_children;
    uint64_t hash;     /* hash(parent, tokens) */
    uint64_t last_use; /* recency clock */
    int32_t *tokens;   /* (B) */
};

struct radix {
    int32_t B;
    struct kv_alloc *kv;
    struct node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *free_nodes;
    int32_t n_free_nodes;
    int32_t n_live;
    int32_t *table;      /* open addressing: node id or -1 (empty) or -2 (deleted) */
    uint64_t table_cap;  /* power of two */
    uint64_t table_used; /* live + deleted slots */
    uint64_t clock;
};

static uint64_t block_hash(int32_t parent, const int32_t *tokens, int32_t B)
{
    return XXH3_64bits_withSeed(tokens, sizeof(int32_t) * (size_t)B, (uint64_t)(int64_t)parent + 0x9e3779b97f4a7c15ull);
}

enum kvb_status radix_create(int32_t block_size, struct kv_alloc *kv, struct radix **out)
{
    if (block_size <= 0) return KVB_ERR_INVALID_ARG;
    struct radix *r = kvb_calloc(1, sizeof *r);
    if (!r) return KVB_ERR_NOMEM;
    r->B = block_size;
    r->kv = kv;
    r->table_cap = 1024;
    r->table = kvb_malloc(sizeof(int32_t) * r->table_cap);
    if (!r->table) {
        kvb_free(r);
        return KVB_ERR_NOMEM;
    }
    memset(r->table, 0xff, sizeof(int32_t) * r->table_cap); /* all -1 */
    *out = r;
    return KVB_OK;
}

void radix_free(struct radix *r)
{
    if (!r) return;
    for (int32_t i = 0; i < r->n_nodes; i++) kvb_free(r->nodes[i].tokens);
    kvb_free(r->nodes);
    kvb_free(r->free_nodes);
    kvb_free(r->table);
    kvb_free(r);
}

static int32_t find_child(const struct radix *r, int32_t parent, const int32_t *tokens)
{
    uint64_t h = block_hash(parent, tokens, r->B);
    for (uint64_t i = h & (r->table_cap - 1);; i = (i + 1) & (r->table_cap - 1)) {
        int32_t id = r->table[i];
        if (id == -1) return -1;
        if (id >= 0) {
            const struct node *nd = &r->nodes[id];
            if (nd->hash == h && nd->parent == parent &&
                memcmp(nd->tokens, tokens, sizeof(int32_t) * (size_t)r->B) == 0)
                return id;
        }
    }
}

static void table_put(struct radix *r, int32_t id)
{
    for (uint64_t i = r->nodes[id].hash & (r->table_cap - 1);; i = (i + 1) & (r->table_cap - 1)) {
        if (r->table[i] < 0) {
            if (r->table[i] == -1) r->table_used++;
            r->table[i] = id;
            return;
        }
    }
}

static void table_remove(struct radix *r, int32_t id)
{
    for (uint64_t i = r->nodes[id].hash & (r->table_cap - 1);; i = (i + 1) & (r->table_cap - 1)) {
        if (r->table[i] == id) {
            r->table[i] = -2;
            return;
        }
        if (r->table[i] == -1) return;
    }
}

/* Keeps the load (live + tombstones) under 1/2; rebuilds without tombstones. */
static enum kvb_status table_reserve(struct radix *r)
{
    if ((r->table_used + 1) * 2 <= r->table_cap) return KVB_OK;
    uint64_t cap = r->table_cap;
    while ((uint64_t)(r->n_live + 1) * 4 > cap) cap *= 2;
    int32_t *t = kvb_malloc(sizeof(int32_t) * cap);
    if (!t) return KVB_ERR_NOMEM;
    memset(t, 0xff, sizeof(int32_t) * cap);
    kvb_free(r->table);
    r->table = t;
    r->table_cap = cap;
    r->table_used = 0;
    for (int32_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].block >= 0) table_put(r, i);
    return KVB_OK;
}

int32_t radix_peek(const struct radix *r, const int32_t *tokens, int32_t n)
{
    int32_t parent = -1, k = 0;
    for (; (k + 1) * r->B <= n; k++) {
        int32_t c = find_child(r, parent, tokens + (int64_t)k * r->B);
        if (c < 0) break;
        parent = c;
    }
    return k;
}

int32_t radix_blocks(const struct radix *r, const int32_t *tokens, int32_t n_blocks, int32_t *blocks_out)
{
    int32_t parent = -1, k = 0;
    for (; k < n_blocks; k++) {
        int32_t c = find_child(r, parent, tokens + (int64_t)k * r->B);
        if (c < 0) break;
        blocks_out[k] = r->nodes[c].block;
        parent = c;
    }
    return k;
}

int32_t radix_match(struct radix *r, const int32_t *tokens, int32_t n, int32_t *blocks_out, int32_t max_blocks)
{
    int32_t parent = -1, k = 0;
    r->clock++;
    for (; k < max_blocks && (k + 1) * r->B <= n; k++) {
        int32_t c = find_child(r, parent, tokens + (int64_t)k * r->B);
        if (c < 0) break;
        r->nodes[c].last_use = r->clock;
        blocks_out[k] = r->nodes[c].block;
        kv_ref(r->kv, r->nodes[c].block);
        parent = c;
    }
    return k;
}

static enum kvb_status new_node(struct radix *r, int32_t *out)
{
    if (r->n_free_nodes > 0) {
        *out = r->free_nodes[--r->n_free_nodes];
        return KVB_OK;
    }
    if (r->n_nodes == r->cap_nodes) {
        int32_t cap = r->cap_nodes ? r->cap_nodes * 2 : 256;
        struct node *nn = kvb_realloc(r->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return KVB_ERR_NOMEM;
        r->nodes = nn;
        int32_t *nf = kvb_realloc(r->free_nodes, sizeof *nf * (size_t)cap);
        if (!nf) return KVB_ERR_NOMEM;
        r->free_nodes = nf;
        r->cap_nodes = cap;
    }
    r->nodes[r->n_nodes].tokens = NULL;
    *out = r->n_nodes++;
    return KVB_OK;
}

enum kvb_status radix_insert(struct radix *r, const int32_t *tokens, int32_t n_blocks, const int32_t *block_ids)
{
    int32_t parent = -1;
    r->clock++;
    for (int32_t k = 0; k < n_blocks; k++) {
        const int32_t *bt = tokens + (int64_t)k * r->B;
        int32_t c = find_child(r, parent, bt);
        if (c < 0) {
            KVB_FORWARD_IF_ERROR(table_reserve(r));
            KVB_FORWARD_IF_ERROR(new_node(r, &c));
            struct node *nd = &r->nodes[c];
            if (!nd->tokens) {
                nd->tokens = kvb_malloc(sizeof(int32_t) * (size_t)r->B);
                if (!nd->tokens) {
                    r->free_nodes[r->n_free_nodes++] = c;
                    nd->block = -1;
                    return KVB_ERR_NOMEM;
                }
            }
            memcpy(nd->tokens, bt, sizeof(int32_t) * (size_t)r->B);
            nd->parent = parent;
            nd->block = block_ids[k];
            nd->n_children = 0;
            nd->hash = block_hash(parent, bt, r->B);
            table_put(r, c);
            if (parent >= 0) r->nodes[parent].n_children++;
            kv_set_cached(r->kv, block_ids[k], true);
            r->n_live++;
        } else if (r->nodes[c].block != block_ids[k]) {
            /* The tree holds these tokens in another block (two sequences
             * computed the same prefix side by side). Hanging this
             * sequence's later blocks below that node would keep it from
             * eviction once its own holder is gone, with no reference on it
             * from this sequence: stop here. */
            r->nodes[c].last_use = r->clock;
            break;
        }
        r->nodes[c].last_use = r->clock;
        parent = c;
    }
    return KVB_OK;
}

int32_t radix_evict(struct radix *r, int32_t want_free)
{
    int32_t evicted = 0;
    while (kv_n_free(r->kv) < want_free) {
        int32_t best = -1;
        for (int32_t i = 0; i < r->n_nodes; i++) {
            const struct node *nd = &r->nodes[i];
            if (nd->block < 0 || nd->n_children > 0 || kv_refcount(r->kv, nd->block) > 0) continue;
            if (best < 0 || nd->last_use < r->nodes[best].last_use) best = i;
        }
        if (best < 0) break;
        struct node *nd = &r->nodes[best];
        table_remove(r, best);
        if (nd->parent >= 0) r->nodes[nd->parent].n_children--;
        kv_set_cached(r->kv, nd->block, false);
        nd->block = -1;
        r->free_nodes[r->n_free_nodes++] = best;
        r->n_live--;
        evicted++;
    }
    return evicted;
}

int32_t radix_n_cached(const struct radix *r) { return r->n_live; }
