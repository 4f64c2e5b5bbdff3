/* grammar_schema.h — TEMPORARY stand-in (h4) for h5's JSON Schema → GBNF
 * compiler, with its signature; replaced by h5's file at the merge. Only
 * json_object (schema NULL or len 0) is written here. */
#ifndef KVB_GRAMMAR_SCHEMA_H
#define KVB_GRAMMAR_SCHEMA_H

#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

enum kvb_status gschema_to_gbnf(const char *schema_json, size_t len, const char *path, struct kvb_buf *out,
                                char *err_path, size_t path_cap, char *msg, size_t msg_cap);

#endif
