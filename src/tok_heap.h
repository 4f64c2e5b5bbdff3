/* tok_heap.h — binary min-heap of candidate merges ("bigrams") shared by the
 * two BPE flavours. Lower prio pops first (byte-level BPE: merge rank;
 * SentencePiece: minus the token score), ties by the leftmost position, which
 * is the order the reference tokenizer merges in. */
#ifndef KVB_TOK_HEAP_H
#define KVB_TOK_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct tok_bigram {
    double prio;          /* exact for int ranks and for negated float scores */
    int32_t left, right;  /* symbol indices */
    size_t size;          /* bytes of left + right when the bigram was made */
};

struct tok_heap {
    struct tok_bigram *v;
    size_t n, cap;
};

enum kvb_status tok_heap_push(struct tok_heap *h, struct tok_bigram b);
/* Removes the first bigram into *out; false when empty. */
bool tok_heap_pop(struct tok_heap *h, struct tok_bigram *out);
void tok_heap_free(struct tok_heap *h);

#endif
