/* grammar.h — output constraints as one compiled grammar: llama.cpp's GBNF
 * read into a pushdown recogniser over bytes, and the per-token mask the
 * sampler applies (JSON object and schema, regex, choice and GBNF requests
 * all arrive here as GBNF text; grammar_schema.h and grammar_regex.h write it).
 *
 * GBNF (llama.cpp grammars/README.md): rules `name ::= body`, names of
 * letters, digits and '-'; bodies of "literals" (escapes \n \r \t \" \\ \[
 * \] \xHH \uHHHH \UHHHHHHHH), [character classes] (ranges a-z, [^...]
 * negation, the same escapes), `.` any character, rule names, ( groups ),
 * alternation |, and the postfix * + ? {m} {m,} {m,n}; # starts a comment
 * to the end of the line; newlines end a rule unless inside ( ) or after |.
 * The start rule is `root`. Characters are Unicode code points, matched as
 * their UTF-8 bytes (a class is compiled to byte sequences), so a token may
 * end inside a character. Surrogates and bytes that are not UTF-8 never match.
 *
 * Refused at compile time, by name: an undefined rule, a rule defined twice,
 * a missing root, left recursion (a rule that can reach itself before
 * matching a byte with something left to match after: its stacks would
 * grow without end; loops through rules that match nothing in tail
 * position, as (x*)* makes, are fine), a root that matches no string (root
 * ::= root; every way through it needing a rule that never ends), a
 * repetition bound over GRAMMAR_MAX_REPEAT (llama.cpp reads a larger one as
 * unbounded), groups nested deeper than GRAMMAR_MAX_NEST, a grammar over
 * GRAMMAR_MAX_ELEMS elements, a start the recogniser could not hold (a
 * stack deeper than GRAMMAR_MAX_DEPTH before the first byte, or more than
 * GRAMMAR_MAX_STACKS alternatives open at once), llama.cpp's token
 * terminals (<[id]>). Alternatives that can never end (they need a rule
 * that never ends) are dropped, so that every prefix the grammar accepts
 * can still be completed. Nothing in the compiler recurses on the text's
 * shape deeper than GRAMMAR_MAX_NEST, and its cost is linear in its size.
 *
 * The recogniser is llama.cpp's design: a state is a set of stacks of
 * positions in the rules, each stack's top a byte set to match next (a
 * stack that has run out is the grammar complete). Stacks are interned
 * (shared tails), states are interned sets of them, and byte transitions
 * are memoised, so a state is a small integer and a token's bytes cost a
 * table lookup each once seen. A stack deeper than GRAMMAR_MAX_DEPTH
 * positions, or a state of more than GRAMMAR_MAX_STACKS stacks (a very
 * ambiguous grammar), does not continue: the byte that would need it is
 * not allowed.
 *
 * The mask: a grammar_vocab holds every token's bytes in a trie; the mask
 * of a state walks the trie once, pruning at the first byte the state
 * refuses, and is cached per state (the adaptive cache of xgrammar, keyed
 * by the interned state), so the states that recur — inside a string,
 * between fields — cost a lookup. End-of-generation tokens are allowed
 * exactly when the grammar is complete, control tokens (no bytes) never.
 * Results never depend on what is cached: caches are bounded
 * (GRAMMAR_CACHE_BYTES per matcher) and dropped whole when full.
 *
 * Ownership: a grammar is immutable once compiled and may be shared by
 * threads and requests (grammar_free). A vocab copies what it needs from
 * the tokenizer (freed after if the caller likes), immutable, shareable.
 * A matcher is one request's recogniser and caches: single-threaded,
 * borrows its grammar and vocab, which must outlive it. */
#ifndef KVB_GRAMMAR_H
#define KVB_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "text/tok.h"

#define GRAMMAR_MAX_TEXT (8u << 20)     /* bytes of a request's constraint text (schema, regex, choices, GBNF) */
#define GRAMMAR_MAX_ELEMS (1 << 20)     /* compiled elements (after repetitions are expanded) */
#define GRAMMAR_MAX_NEST 1024           /* groups ( ) inside groups in GBNF text */
#define GRAMMAR_MAX_CHOICES 4096        /* strings of a choice constraint (GRAMMAR_MAX_STACKS) */
#define GRAMMAR_MAX_REPEAT 2000         /* m and n of {m,n} (llama.cpp's threshold) */
#define GRAMMAR_MAX_DEPTH 1024          /* positions on one stack (nesting) */
#define GRAMMAR_MAX_STACKS 4096         /* stacks in one state (ambiguity) */
#define GRAMMAR_CACHE_BYTES (32u << 20) /* a matcher's memoised states, transitions and masks */

struct grammar;

/* Compiles GBNF text gbnf[0..len). Returns KVB_OK (*out owned by the
 * caller: grammar_free), KVB_ERR_FORMAT with a message naming the line and
 * column or the rule (msg may be NULL), or KVB_ERR_NOMEM. */
enum kvb_status grammar_compile(const char *gbnf, size_t len, struct grammar **out, char *msg, size_t cap);
void grammar_free(struct grammar *g); /* accepts NULL */

/* Whole-string check without a vocabulary (tests, tools): GRAMMAR_FULL when
 * s[0..n) is a sentence of the grammar, GRAMMAR_PREFIX when it is a proper
 * prefix of one, GRAMMAR_NONE otherwise; KVB_ERR_NOMEM aside (then NONE). */
enum grammar_match { GRAMMAR_NONE, GRAMMAR_PREFIX, GRAMMAR_FULL };
enum grammar_match grammar_check(const struct grammar *g, const char *s, size_t n);

/* GBNF writing (grammar_text.c). Appends s[0..n) as a GBNF literal,
 * quotes included, escaping '"', '\\' and control bytes; KVB_ERR_NOMEM. */
enum kvb_status grammar_put_literal(struct kvb_buf *out, const char *s, size_t n);
/* vLLM's choice: json_array[0..len) is a JSON array of strings; appends
 * `root ::= "a" | "b" ...`. KVB_ERR_FORMAT (msg) when it is not a
 * non-empty array of strings; KVB_ERR_NOMEM. */
enum kvb_status grammar_choice_gbnf(const char *json_array, size_t len, struct kvb_buf *out, char *msg, size_t cap);

struct grammar_vocab;

/* KVB_ERR_NOMEM, or KVB_ERR_UNSUPPORTED when the vocabulary has no
 * end-of-generation token (a grammar could never end). */
enum kvb_status grammar_vocab_create(const struct tok *t, struct grammar_vocab **out, struct kvb_err *err);
void grammar_vocab_free(struct grammar_vocab *v); /* accepts NULL */
int32_t grammar_vocab_size(const struct grammar_vocab *v);
int32_t grammar_vocab_eog(const struct grammar_vocab *v); /* the first end-of-generation token */

struct grammar_matcher;

/* v may be NULL for byte-only use (grammar_matcher_feed; no token calls).
 * KVB_ERR_NOMEM; KVB_ERR_RANGE when the start state is past the recogniser's
 * limits (never for a grammar grammar_compile accepted: it checks that). */
enum kvb_status grammar_matcher_create(const struct grammar *g, const struct grammar_vocab *v,
                                       struct grammar_matcher **out);
void grammar_matcher_free(struct grammar_matcher *m); /* accepts NULL */
/* Caps what m's caches may hold (default GRAMMAR_CACHE_BYTES; tests set it
 * low to exercise the flush). */
void grammar_matcher_set_cache_bytes(struct grammar_matcher *m, size_t cap);
/* Back to the start of the grammar; caches are kept. */
void grammar_matcher_reset(struct grammar_matcher *m);

/* Feeds n bytes: true and m moved past them, or false and m unchanged when
 * one of them cannot continue a sentence. */
bool grammar_matcher_feed(struct grammar_matcher *m, const char *bytes, size_t n);
/* The bytes so far are a sentence of the grammar (the end of generation may follow). */
bool grammar_matcher_complete(const struct grammar_matcher *m);

/* Token calls need the vocab given to grammar_matcher_create. */
bool grammar_allows(struct grammar_matcher *m, int32_t token);
/* Sets logits[i] = -INFINITY for every token i < grammar_vocab_size not
 * allowed now; returns how many are left allowed. */
int32_t grammar_mask(struct grammar_matcher *m, float *logits);
/* Moves m past token. A token that was not allowed leaves m where nothing
 * but the end of generation is (the caller did not ask first). */
void grammar_accept(struct grammar_matcher *m, int32_t token);

struct grammar_stats {
    uint64_t masks;     /* grammar_mask calls */
    uint64_t mask_hits; /* of them answered from the cache */
    uint64_t mask_ns;   /* time inside grammar_mask */
    uint64_t allows;    /* grammar_allows calls */
    uint64_t flushes;   /* times the caches were dropped for GRAMMAR_CACHE_BYTES */
    uint32_t states;    /* states interned now */
    size_t cache_bytes; /* memory the caches hold now */
};
void grammar_matcher_stats(const struct grammar_matcher *m, struct grammar_stats *out);

#endif
