/* json.h — JSON reading and string writing: the request parser and resume
 * scanner (jobs/), the output constraints' schema compiler (engine/) and the
 * report's JSON form (store/metrics) all read or write JSON through here, so
 * strictness and escaping are decided once.
 *
 * jsmn tokenizes, but it is lenient by design: it accepts trailing commas,
 * missing commas between array items, bare words such as `tru` and invalid
 * escapes. A batch job must tell a broken line from a good one, so
 * json_parse first runs a strict RFC 8259 syntax check over the bytes and
 * only then lets jsmn build the token tree. jsmn's code is compiled once, as
 * static functions inside json.c (JSMN_STATIC), so it can never clash
 * with another copy elsewhere in the program; this header sees only its
 * types (JSMN_HEADER).
 *
 * Ownership: struct json_doc borrows the source bytes (they must outlive it)
 * and owns its token array (json_free). */
#ifndef KVB_BASE_JSON_H
#define KVB_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef JSMN_HEADER
#define JSMN_HEADER
#endif
#include <jsmn.h>

#include "base/buf.h"
#include "base/status.h"

#define JSON_MAX_DEPTH 256             /* nesting deeper than this is refused (the checker's stack) */
#define JSON_MAX_LEN ((size_t)1 << 30) /* jsmn counts positions in int */

struct json_doc {
    const char *src; /* borrowed */
    size_t len;
    jsmntok_t *tok; /* tok[0] is the root value */
    int ntok;
};

/* Checks and tokenizes src[0..len). KVB_OK; KVB_ERR_FORMAT with a short
 * reason and the byte offset where the syntax broke (*why is static text);
 * KVB_ERR_NOMEM. On error j holds nothing to free (json_free is still
 * safe). */
enum kvb_status json_parse(const char *src, size_t len, struct json_doc *j, const char **why, size_t *where);
void json_free(struct json_doc *j);

/* Index just past token i's whole subtree. */
int json_skip(const struct json_doc *j, int i);

/* Value index of key in object token obj (the last one when a key repeats,
 * as most JSON readers do), or -1. Keys are compared after unescaping. */
int json_get(const struct json_doc *j, int obj, const char *key);

/* Token kinds as JSON sees them. */
enum json_kind {
    JSON_OBJECT,
    JSON_ARRAY,
    JSON_STRING,
    JSON_NUMBER,
    JSON_TRUE,
    JSON_FALSE,
    JSON_NULL,
};
enum json_kind json_kind(const struct json_doc *j, int i);

/* True when string token i unescapes to exactly lit. */
bool json_str_eq(const struct json_doc *j, int i, const char *lit);

/* Unescapes string token i into a new kvb_malloc'd NUL-terminated buffer
 * (see job.h for the U+FFFD rules). KVB_ERR_NOMEM. */
enum kvb_status json_str_dup(const struct json_doc *j, int i, char **out, size_t *out_len);

/* The exact form, for identities (custom_id): distinct JSON strings give
 * distinct bytes. A lone surrogate escape keeps its code point (three bytes
 * in UTF-8's pattern, which is not valid UTF-8), \u0000 becomes C0 80 (no
 * NUL inside), and raw bytes that are not valid UTF-8 are refused
 * (KVB_ERR_FORMAT: the string could not be echoed back as it was written).
 * KVB_ERR_NOMEM. */
enum kvb_status json_str_dup_exact(const struct json_doc *j, int i, char **out, size_t *out_len);

/* Unescaped length of string token i, and the bytes written into dst
 * (which must hold that many) when dst is non-NULL. */
size_t json_str_decode(const struct json_doc *j, int i, char *dst);

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when s starts
 * with an invalid one; then *bad gets the length of its maximal ill-formed
 * subpart (Unicode §3.9), the bytes one U+FFFD replaces. n must be > 0. */
size_t json_utf8_seq(const unsigned char *s, size_t n, size_t *bad);

/* Appends s[0..n) to b as a JSON string, quotes included: control
 * characters, '"' and '\\' escaped, valid UTF-8 kept as it is, each maximal
 * ill-formed subpart (json_utf8_seq) replaced by U+FFFD, so the result is
 * valid JSON whatever the bytes. KVB_ERR_NOMEM leaves b->len as it was. */
enum kvb_status json_put_string(struct kvb_buf *b, const char *s, size_t n);

#endif
