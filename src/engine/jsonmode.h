/* jsonmode.h — `response_format` json_object and json_schema: which next
 * tokens keep a request's output a JSON object (one a schema allows).
 *
 * Two layers. A jsonmode_state recognises, a byte at a time, prefixes of
 * one JSON object (RFC 8259: the top level an object, strings with their
 * escapes, numbers, true/false/null, nesting up to JSONMODE_MAX_DEPTH).
 * Whitespace is held to what pretty printers write, so that a model cannot
 * pad with newlines until max_tokens (the usual failure of a small model
 * held to JSON): at most JSONMODE_MAX_LEAD_WS byte before the object, none
 * between a key and its colon, at most one space after the colon, and
 * elsewhere one newline (no carriage return) with spaces or tabs, at most
 * JSONMODE_MAX_WS bytes in a run. Nothing may follow the closing brace but
 * the end of generation.
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

#include "base/status.h"
#include "text/tok.h"

#define JSONMODE_MAX_DEPTH 64  /* open objects and arrays */
#define JSONMODE_MAX_WS 24     /* consecutive whitespace bytes outside strings (indentation) */
#define JSONMODE_MAX_LEAD_WS 1 /* before the object: the space a SentencePiece token may carry */

/* ---- schemas (response_format json_schema) ----------------------------------
 * A compiled schema: plain arrays, built by jsonmode_schema_compile
 * (jsonmode_schema.c) and read here. Node 0 is the root, an object. What a
 * node allows:
 *   ANY     any JSON value (inside it nothing is checked but the grammar);
 *   OBJECT  an object whose keys are among its properties, each at most once,
 *           every required one present (any_object: any object at all);
 *   ARRAY   an array of min_items..max_items values of node `items`;
 *   SCALAR  a string, number, integer, boolean or null, as `types` says;
 *   ENUM    one of n literal JSON texts (strings, true, false, null), byte for byte.
 * Keys are matched byte for byte against property names (no escapes). */
#define JSONMODE_MAX_FRAMES 16 /* objects and arrays a schema may nest */
#define JSONMODE_MAX_PROPS 64  /* properties of one object; literals of one enum */

enum jsonmode_kind { JSK_ANY, JSK_OBJECT, JSK_ARRAY, JSK_SCALAR, JSK_ENUM };
enum jsonmode_type { JST_STRING = 1, JST_NUMBER = 2, JST_INTEGER = 4, JST_BOOLEAN = 8, JST_NULL = 16 };

struct jsonmode_text {
    uint32_t off, len; /* bytes[off .. off + len) of the schema */
};

struct jsonmode_node {
    uint8_t kind;                  /* enum jsonmode_kind */
    uint8_t types;                 /* SCALAR: enum jsonmode_type bits */
    bool any_object;               /* OBJECT: no properties listed, any object */
    uint16_t n;                    /* OBJECT: properties; ENUM: literals */
    uint32_t first;                /* OBJECT: props[first ..]; ENUM: lits[first ..] */
    uint64_t required;             /* OBJECT: bit i = props[first + i] is required */
    int32_t items;                 /* ARRAY: the items' node */
    uint32_t min_items, max_items; /* ARRAY */
};

struct jsonmode_prop {
    struct jsonmode_text name; /* raw bytes of the key */
    int32_t node;
};

/* Owns every array (kvb_malloc'd); jsonmode_schema_free frees them all. */
struct jsonmode_schema {
    struct jsonmode_node *nodes;
    int32_t n_nodes;
    struct jsonmode_prop *props;
    int32_t n_props;
    struct jsonmode_text *lits; /* ENUM literals as JSON text, e.g. "\"red\"" or "true" */
    int32_t n_lits;
    char *bytes;
    size_t n_bytes;
};
void jsonmode_schema_free(struct jsonmode_schema *s); /* accepts NULL */

/* Compiles a response_format's json_schema.schema, given as its JSON text
 * text[0..len) (path names it in errors). The subset: type (string, number,
 * integer, boolean, null, object, array, or a list of the scalar ones),
 * properties, required, additionalProperties false (also the default where
 * properties are listed; with none listed it allows only {}), items,
 * minItems, maxItems, enum or const (of strings, true, false, null; a type
 * beside them keeps the values of that type); the annotations description,
 * title, default, examples and $schema are ignored; any other keyword is
 * refused. The root describes an object; objects and arrays nest at most 16
 * deep. Returns KVB_OK (*out owned by the caller: jsonmode_schema_free),
 * KVB_ERR_FORMAT with the field in err_path and the reason in msg, or
 * KVB_ERR_NOMEM. */
enum kvb_status jsonmode_schema_compile(const char *text, size_t len, const char *path, struct jsonmode_schema **out,
                                        char *err_path, size_t path_cap, char *msg, size_t msg_cap);

struct jsonmode_frame { /* an object or array a schema node constrains */
    uint64_t seen;      /* object: properties given */
    int16_t node;
    int16_t prop;   /* object: the property whose value is next, -1 none */
    uint16_t count; /* array: values begun */
};

struct jsonmode_state {
    uint64_t arrays; /* bit d set: the container at depth d (0-based) is an array */
    uint8_t depth;   /* containers open */
    uint8_t mode;    /* what may come next (jsonmode.c) */
    uint8_t sub;     /* position inside a literal, or hex digits of a \u escape */
    uint8_t lit;     /* which literal: true, false, null */
    uint8_t ws;      /* whitespace bytes in the current run */
    bool nl;         /* the current whitespace run has its newline */
    bool key;        /* the string being read is an object key */
    /* With a schema: */
    const struct jsonmode_schema *schema; /* borrowed; NULL: any object */
    uint8_t n_frames;                     /* containers constrained: frames[0 .. n_frames) */
    uint8_t free_depth;                   /* nonzero: containers this deep and deeper are free (an ANY value) */
    uint8_t vmode;                        /* the scalar being read: 0 free, 1 integer, 2 an enum literal */
    uint16_t cpos;                        /* bytes of the key or enum literal read */
    int16_t vnode;                        /* the ENUM node being matched */
    uint64_t cand;                        /* properties or literals still matching */
    struct jsonmode_frame frames[JSONMODE_MAX_FRAMES]; /* last: only n_frames are live */
};

/* schema NULL: any JSON object. The schema must outlive the state. */
void jsonmode_init(struct jsonmode_state *s, const struct jsonmode_schema *schema);
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
int32_t jsonmode_vocab_eog(const struct jsonmode_vocab *v); /* the first end-of-generation token */

bool jsonmode_allows(const struct jsonmode_vocab *v, const struct jsonmode_state *s, int32_t token);
/* Sets logits[i] = -INFINITY for every token i not allowed in state s;
 * returns how many are left allowed. */
int32_t jsonmode_mask(const struct jsonmode_vocab *v, const struct jsonmode_state *s, float *logits);
/* Moves s past token. A token that was not allowed leaves s where nothing
 * but the end of generation is (the caller did not ask first). */
void jsonmode_accept(const struct jsonmode_vocab *v, struct jsonmode_state *s, int32_t token);

#endif
