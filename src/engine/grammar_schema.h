/* grammar_schema.h — a JSON Schema (response_format json_schema) or JSON
 * object mode (json_object) written as GBNF text for the grammar engine
 * (grammar.h), with root rule `root`.
 *
 * Whitespace is what JSON mode (the recogniser this replaced) allowed, so
 * the outputs json_object and the old schema subset produced stay byte for
 * byte what they were: at most
 * one space, tab or newline before the top value; none between a key and
 * its colon; at most one space after the colon; elsewhere one newline at
 * most among spaces and tabs, GSCHEMA_MAX_WS bytes in a run; nothing after
 * the closing brace. Containers nest at most GSCHEMA_MAX_DEPTH deep where
 * the schema leaves values free (counted from the root, or from the root of
 * a $ref'd definition); recursive definitions nest as deep as the engine's
 * stack (GRAMMAR_MAX_DEPTH).
 *
 * The top value is an object (as JSON mode has always held it: a
 * completed object cannot be mistaken for the prefix of a longer value, and
 * batch extraction jobs ask for objects); a root that may be anything else
 * is refused. An anyOf of objects is an object.
 *
 * What is held, by construction:
 *   type (one or a list), enum and const (any JSON values; each matched as
 *   written in the schema, strings and numbers byte for byte (a string the
 *   schema escapes also as json_put_string writes it), objects and arrays
 *   with JSON mode's whitespace between their parts);
 *   anyOf, and oneOf held as anyOf (an output matching two branches is
 *   accepted; the branches Pydantic writes for unions are told apart by a
 *   const or a type); allOf merged into one schema where each keyword comes
 *   from one part (properties and required united, type intersected;
 *   otherwise refused by name); $ref to "#", "#/$defs/...",
 *   "#/definitions/..." or any JSON pointer into the document, recursion
 *   included (a cycle that opens no object or array is refused);
 *   objects: properties, required, additionalProperties (false, true or a
 *   schema; false where properties are listed and it is absent, as JSON
 *   mode has held it; with no properties listed, any object). Objects of
 *   up to GSCHEMA_ANY_ORDER properties take them in any order, each at
 *   most once, every required one present; larger objects take them in the
 *   schema's order (what Pydantic writes and models follow), optional ones
 *   left out at will. Extra keys (additionalProperties true or a schema)
 *   may come anywhere in the first kind, after the listed ones in the
 *   second; never a listed name, and written without escapes until they
 *   differ from every listed name;
 *   arrays: items (a schema, true, false), prefixItems, minItems, maxItems
 *   (at most GSCHEMA_MAX_COUNT); draft 4-7 tuples (items as an array,
 *   additionalItems) as prefixItems and items;
 *   strings: minLength, maxLength (code points of the decoded string, at
 *   most GSCHEMA_MAX_COUNT without a pattern), pattern (grammar_regex.h,
 *   search semantics; pattern and format strings are read with one written
 *   form per character: only '"', '\\' and control characters escaped, so
 *   the decoded string is what the pattern sees), format date, time,
 *   date-time, email, uuid, uri, ipv4, ipv6 (as grammars: RFC 3339 with T
 *   and Z in upper case and valid days of month; a common subset of email
 *   addresses and URIs). A pattern or format beside minLength/maxLength is
 *   intersected with them exactly; pattern beside format is refused;
 *   integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (also
 *   draft-04's boolean form) as digit-range grammars; numbers: the same
 *   bounds, read exactly as the decimals the schema writes (a bounded
 *   number is written without an exponent; a bound with more digits than
 *   that holds is refused).
 * Ignored as annotations: title, description, default, examples, $schema,
 * $id, $comment, readOnly, writeOnly, deprecated, $defs, definitions,
 * discriminator (OpenAPI's; the branches' consts hold it). Anything else is
 * refused by name, never dropped.
 *
 * JSON strings in free positions take every escape RFC 8259 allows; where a
 * length is counted, \uXXXX escapes must be characters (lone surrogates are
 * not). Property names are written as the schema gives them, encoded the
 * way json_put_string encodes (so a name without escapes is its own bytes).
 *
 * Errors: KVB_ERR_FORMAT with the schema's field in err_path (path names
 * the schema itself, e.g. "response_format.json_schema.schema") and the
 * reason in msg; KVB_ERR_NOMEM. out is appended to; on error its length is
 * put back. */
#ifndef KVB_GRAMMAR_SCHEMA_H
#define KVB_GRAMMAR_SCHEMA_H

#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

#define GSCHEMA_MAX_DEPTH 64         /* containers where the schema leaves values free */
#define GSCHEMA_MAX_WS 24            /* whitespace bytes in one run between tokens (indentation) */
#define GSCHEMA_ANY_ORDER 8          /* properties an object takes in any order */
#define GSCHEMA_MAX_COUNT 2000       /* minItems, maxItems, minLength, maxLength (GRAMMAR_MAX_REPEAT) */
#define GSCHEMA_MAX_NEST 64          /* schemas inside schemas while compiling */
#define GSCHEMA_MAX_BYTES (8u << 20) /* the GBNF written */

/* schema_json[0..len) into GBNF; schema_json NULL or len 0: any JSON
 * object (json_object). */
enum kvb_status gschema_to_gbnf(const char *schema_json, size_t len, const char *path, struct kvb_buf *out,
                                char *err_path, size_t path_cap, char *msg, size_t msg_cap);

#endif
