/* tok_merge.h — the merge loop both BPE flavours share: the symbols of one
 * word merge pairwise, the pair with the lowest key first and the leftmost
 * on ties, until no two neighbours form a pair that has a key. Byte-level
 * BPE keys a pair by its merge rank, SentencePiece by the merged token's
 * score (higher first); the caller's key function says which.
 *
 * Memory is what makes this its own file: a word may be a whole document
 * without a space in it. A symbol is named by the offset of its first byte,
 * and the state is five int32 per byte of the word (its neighbours, its
 * pair's place in the heap; one heap slot of key and symbol), reused from
 * word to word. The heap is indexed: a merge re-keys the pairs on either
 * side in place instead of pushing new entries beside stale ones, so it
 * never holds more than one entry per symbol. The order of merges, and so
 * the result, is exactly that of the lazy heap the reference uses. */
#ifndef KVB_TOK_MERGE_H
#define KVB_TOK_MERGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/tok_internal.h"

/* One byte of the word; meaningful where a symbol starts. */
struct tok_merge_sym {
    int32_t prev, next; /* the neighbouring symbols; -1 at the ends */
    int32_t hpos;       /* the place in the heap of the pair (this, next); -1: it has no key */
};

struct tok_merge_pair {
    uint32_t key;
    int32_t sym; /* its left symbol */
};

struct tok_merge {
    struct tok_merge_sym *sym;   /* (cap) */
    struct tok_merge_pair *heap; /* (cap) the pairs that have a key, least (key, sym) first */
    int32_t n, heap_n;           /* bytes of the word; pairs in the heap */
    size_t cap;
};

/* The key of merging the word's symbols [a, b) and [b, c) into *key, or
 * false when they do not merge. */
typedef bool (*tok_merge_key_fn)(void *user, int32_t a, int32_t b, int32_t c, uint32_t *key);

/* Sets up a word of n bytes (n >= 1; KVB_ERR_NOMEM, KVB_ERR_RANGE past
 * INT32_MAX): its first symbols are its single bytes, or, with utf8, its
 * characters by their lead byte (unicode_utf8_len, cut short at the end). */
enum kvb_status tok_merge_start(struct tok_merge *m, const char *word, size_t n, bool utf8);

/* Merges until no pair has a key. KVB_ERR_CANCELLED when lim's cancel flag
 * is raised (polled every few thousand merges), KVB_ERR_NOMEM never: the
 * memory was taken by tok_merge_start. */
enum kvb_status tok_merge_run(struct tok_merge *m, tok_merge_key_fn key_of, void *user, const struct tok_limits *lim);

/* The symbols after the run: for (i = 0; i >= 0; i = m->sym[i].next), each
 * the bytes [i, tok_merge_end(m, i)). */
static inline int32_t tok_merge_end(const struct tok_merge *m, int32_t i)
{
    return m->sym[i].next >= 0 ? m->sym[i].next : m->n;
}

void tok_merge_free(struct tok_merge *m); /* accepts a zeroed one */

#endif
