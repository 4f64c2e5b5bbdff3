/* job_json.h — internal to jobs/: the JSON reading shared by the request
 * parser and the resume scanner. Not a public header; nothing outside jobs/
 * should include it (other modules that write JSON use job_buf_json_string).
 *
 * jsmn tokenizes, but it is lenient by design: it accepts trailing commas,
 * missing commas between array items, bare words such as `tru` and invalid
 * escapes. A batch job must tell a broken line from a good one, so
 * job_json_parse first runs a strict RFC 8259 syntax check over the bytes and
 * only then lets jsmn build the token tree. jsmn's code is compiled once, as
 * static functions inside job_json.c (JSMN_STATIC), so it can never clash
 * with another copy elsewhere in the program; this header sees only its
 * types (JSMN_HEADER).
 *
 * Ownership: struct job_json borrows the source bytes (they must outlive it)
 * and owns its token array (job_json_free). */
#ifndef KVB_JOB_JSON_H
#define KVB_JOB_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef JSMN_HEADER
#define JSMN_HEADER
#endif
#include <jsmn.h>

#include "base/status.h"

#define JOB_JSON_MAX_DEPTH 256 /* nesting deeper than this is refused (the checker's stack) */
#define JOB_JSON_MAX_LEN ((size_t)1 << 30) /* jsmn counts positions in int */

struct job_json {
    const char *src;   /* borrowed */
    size_t len;
    jsmntok_t *tok;    /* tok[0] is the root value */
    int ntok;
};

/* Checks and tokenizes src[0..len). KVB_OK; KVB_ERR_FORMAT with a short
 * reason and the byte offset where the syntax broke (*why is static text);
 * KVB_ERR_NOMEM. On error j holds nothing to free (job_json_free is still
 * safe). */
enum kvb_status job_json_parse(const char *src, size_t len, struct job_json *j, const char **why,
                               size_t *where);
void job_json_free(struct job_json *j);

/* Index just past token i's whole subtree. */
int job_json_skip(const struct job_json *j, int i);

/* Value index of key in object token obj (the last one when a key repeats,
 * as most JSON readers do), or -1. Keys are compared after unescaping. */
int job_json_get(const struct job_json *j, int obj, const char *key);

/* Token kinds as JSON sees them. */
enum job_json_kind {
    JOB_JSON_OBJECT,
    JOB_JSON_ARRAY,
    JOB_JSON_STRING,
    JOB_JSON_NUMBER,
    JOB_JSON_TRUE,
    JOB_JSON_FALSE,
    JOB_JSON_NULL,
};
enum job_json_kind job_json_kind(const struct job_json *j, int i);

/* True when string token i unescapes to exactly lit. */
bool job_json_str_eq(const struct job_json *j, int i, const char *lit);

/* Unescapes string token i into a new kvb_malloc'd NUL-terminated buffer
 * (see job.h for the U+FFFD rules). KVB_ERR_NOMEM. */
enum kvb_status job_json_str_dup(const struct job_json *j, int i, char **out, size_t *out_len);

/* The exact form, for identities (custom_id): distinct JSON strings give
 * distinct bytes. A lone surrogate escape keeps its code point (three bytes
 * in UTF-8's pattern, which is not valid UTF-8), \u0000 becomes C0 80 (no
 * NUL inside), and raw bytes that are not valid UTF-8 are refused
 * (KVB_ERR_FORMAT: the string could not be echoed back as it was written).
 * KVB_ERR_NOMEM. */
enum kvb_status job_json_str_dup_exact(const struct job_json *j, int i, char **out, size_t *out_len);

/* Unescaped length of string token i, and the bytes written into dst
 * (which must hold that many) when dst is non-NULL. */
size_t job_json_str_decode(const struct job_json *j, int i, char *dst);

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when s starts
 * with an invalid one; then *bad gets the length of its maximal ill-formed
 * subpart (Unicode §3.9), the bytes one U+FFFD replaces. n must be > 0. */
size_t job_utf8_seq(const unsigned char *s, size_t n, size_t *bad);

#endif
