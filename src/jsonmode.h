/* jsonmode.h — `response_format: {"type": "json_object"}`: which next
 * tokens keep a request's output a JSON object.
 *
 * Two layers. A jsonmode_state recognises, a byte at a time, prefixes of
 * one JSON object (RFC 8259: the top level an object, strings with their
 * escapes, numbers, true/false/null, nesting up to JSONMODE_MAX_DEPTH).
 * Whitespace between tokens is allowed but runs of it are capped at
 * JSONMODE_MAX_WS bytes, so that a model cannot pad with newlines until
 * max_tokens (the usual failure of unconstrained padding). Nothing may
 * follow the closing brace but the end of generation.
 *
 * A jsonmode_vocab holds every token's bytes, so that a token is allowed
 * when its bytes keep the output a prefix of an object. An end-of-generation
 * token is allowed exactly when the object is complete; other tokens without
 * bytes (control tokens) never are, since they would let the output stall.
 * Bytes inside strings are not checked as UTF-8: the output writer replaces
 * invalid sequences with U+FFFD, which keeps the JSON valid. A request's
 * stop strings still cut the output where they match (as in OpenAI's API),
 * as max_tokens does: such an output is a prefix of an object.
 *
 * Ownership: a vocab copies what it needs from the tokenizer (which may be
 * freed after), is immutable once built and may be shared between threads
 * and requests; jsonmode_vocab_free frees it. A state is a plain value: copy
 * it to try bytes without committing them. */
#ifndef KVB_JSONMODE_H
#define KVB_JSONMODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tok.h"

#define JSONMODE_MAX_DEPTH 64 /* open objects and arrays */
#define JSONMODE_MAX_WS 64    /* consecutive whitespace bytes outside strings */

struct jsonmode_state {
    uint64_t arrays; /* bit d set: the container at depth d (0-based) is an array */
    uint8_t depth;   /* containers open */
    uint8_t mode;    /* what may come next (jsonmode.c) */
    uint8_t sub;     /* position inside a literal, or hex digits of a \u escape */
    uint8_t lit;     /* which literal: true, false, null */
    uint8_t ws;      /* whitespace bytes in the current run */
    bool key;        /* the string being read is an object key */
};

void jsonmode_init(struct jsonmode_state *s);
/* Feeds n bytes. false when one of them cannot continue a JSON object (s is
 * then left part-way: feed a copy to try). */
bool jsonmode_feed(struct jsonmode_state *s, const char *bytes, size_t n);
/* The object is closed: only the end of generation may follow. */
bool jsonmode_complete(const struct jsonmode_state *s);

struct jsonmode_vocab;

/* KVB_ERR_NOMEM, or KVB_ERR_UNSUPPORTED when the vocabulary has no
 * end-of-generation token (an object could never end). */
enum kvb_status jsonmode_vocab_create(const struct tok *t, struct jsonmode_vocab **out, struct kvb_err *err);
void jsonmode_vocab_free(struct jsonmode_vocab *v); /* accepts NULL */
int32_t jsonmode_vocab_size(const struct jsonmode_vocab *v);

bool jsonmode_allows(const struct jsonmode_vocab *v, const struct jsonmode_state *s, int32_t token);
/* Sets logits[i] = -INFINITY for every token i not allowed in state s;
 * returns how many are left allowed. */
int32_t jsonmode_mask(const struct jsonmode_vocab *v, const struct jsonmode_state *s, float *logits);
/* Moves s past token. A token that was not allowed leaves s where nothing
 * but the end of generation is (the caller did not ask first). */
void jsonmode_accept(const struct jsonmode_vocab *v, struct jsonmode_state *s, int32_t token);

#endif
