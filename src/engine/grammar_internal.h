/* grammar_internal.h — the compiled grammar and the matcher's tables, shared
 * by grammar_parse.c (GBNF → elements), grammar_match.c (stacks, states,
 * byte transitions) and grammar_mask.c (vocabulary trie, token masks).
 * Nothing outside src/engine/grammar*.c includes it. */
#ifndef KVB_GRAMMAR_INTERNAL_H
#define KVB_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"

/* An element of a rule body. A rule is its alternatives one after another,
 * each ended by GE_ALT, the last by GE_END. */
enum grammar_elem_type { GE_END, GE_ALT, GE_REF, GE_BYTES };

struct grammar_elem {
    uint32_t type : 2; /* enum grammar_elem_type */
    uint32_t val : 30; /* GE_REF: the rule; GE_BYTES: the byte set */
};

struct grammar {
    struct grammar_elem *elems;
    uint32_t n_elems;
    uint32_t *rule_start; /* rule r's body: elems[rule_start[r] ..] */
    uint32_t n_rules;
    uint64_t (*sets)[4]; /* byte sets: bit b of sets[i] = byte b matches */
    uint32_t n_sets;
    uint32_t root;
};

#define GM_NIL UINT32_MAX           /* no node (the bottom of a stack) */
#define GM_DEAD UINT32_MAX          /* a transition nothing continues */
#define GM_UNKNOWN (UINT32_MAX - 1) /* a transition not computed yet */

struct gm_node { /* one interned stack: top position over a shared tail */
    uint32_t pos, parent, depth, stamp;
};

struct gm_state {      /* an interned set of stacks */
    uint32_t off, n;   /* its ready nodes (top a GE_BYTES) are pool[off .. off + n), sorted */
    uint32_t *next;    /* [256] byte transitions, NULL until the first is asked for */
    uint8_t *mask;     /* the token mask (grammar_vocab bits), NULL until asked for */
    int32_t n_allowed; /* tokens the mask allows */
    bool accept;       /* an empty stack is among them: the grammar is complete */
};

struct grammar_matcher {
    const struct grammar *g;
    const struct grammar_vocab *v;
    struct gm_node *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *node_hash; /* open addressing over nodes, GM_NIL empty */
    uint32_t node_hash_cap;
    struct gm_state *states;
    uint32_t n_states, cap_states;
    uint32_t *state_hash;
    uint32_t state_hash_cap;
    uint32_t *pool; /* the states' node lists */
    uint32_t n_pool, cap_pool;
    uint32_t cur;                  /* the current state */
    bool dead;                     /* a refused token was accepted: only the end of generation is left */
    uint32_t stamp;                /* marks nodes seen in one expansion */
    uint32_t *work, cap_work;      /* scratch: expansion work list (pairs) */
    uint32_t *out, n_out, cap_out; /* scratch: the ready nodes being collected */
    uint32_t *walk, cap_walk;      /* scratch: states along the trie walk, one per depth */
    uint8_t hit;                   /* GM_HIT_*: limits met since the flags were cleared */
    size_t bytes;                  /* what the caches hold */
    size_t cache_cap;              /* flush above this (GRAMMAR_CACHE_BYTES) */
    struct grammar_stats st;
};

#define GM_HIT_DEPTH 1  /* a stack would have gone past GRAMMAR_MAX_DEPTH */
#define GM_HIT_STACKS 2 /* a state would have held more than GRAMMAR_MAX_STACKS stacks */
#define GM_HIT_NOMEM 4  /* an allocation failed */

/* The state reached from state s by byte b, GM_DEAD when none; memoised.
 * GM_DEAD also when memory runs out (the caller sees a refusal). */
uint32_t gm_step(struct grammar_matcher *m, uint32_t s, uint8_t b);
/* Drops every cache when over GRAMMAR_CACHE_BYTES, keeping the current state
 * (renumbered). Call only where no state id is held but m->cur. */
void gm_maybe_flush(struct grammar_matcher *m);

/* Whether g's start state can be built within the matcher's limits (see
 * grammar_compile): KVB_OK; KVB_ERR_FORMAT with msg naming the limit;
 * KVB_ERR_NOMEM. */
enum kvb_status gm_check_start(const struct grammar *g, char *msg, size_t cap);

#endif
