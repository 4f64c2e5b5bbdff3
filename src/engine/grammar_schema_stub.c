/* grammar_schema_stub.c — TEMPORARY (h4): json_object as GBNF, jsonmode's
 * whitespace policy, until h5's grammar_schema.c lands. */
#include <stdio.h>
#include <string.h>

#include "engine/grammar_schema.h"

static enum kvb_status put(struct kvb_buf *b, const char *s)
{
    const size_t n = strlen(s);
    KVB_FORWARD_IF_ERROR(kvb_buf_reserve(b, n + 1));
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
    return KVB_OK;
}

enum kvb_status gschema_to_gbnf(const char *schema_json, size_t len, const char *path, struct kvb_buf *out,
                                char *err_path, size_t path_cap, char *msg, size_t msg_cap)
{
    if (schema_json && len) {
        snprintf(err_path, path_cap, "%s", path);
        snprintf(msg, msg_cap, "json_schema is not compiled yet on this branch");
        return KVB_ERR_UNSUPPORTED;
    }
    KVB_FORWARD_IF_ERROR(put(out,
                             "root ::= [ \\t\\n]? object\n"
                             "object ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
                             "member ::= string \":\" \" \"? value\n"
                             "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
                             "array ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
                             "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
                             "[0-9a-fA-F]{4} ) )* \"\\\"\"\n"
                             "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"));
    /* ws-K: K whitespace bytes so far, no newline; wn-K: the newline seen. */
    char line[160];
    KVB_FORWARD_IF_ERROR(put(out, "ws ::= ws-0\n"));
    for (int k = 0; k <= 24; k++) {
        if (k < 24)
            snprintf(line, sizeof line,
                     "ws-%d ::= \"\" | [ \\t] ws-%d | \"\\n\" wn-%d\nwn-%d ::= \"\" | [ \\t] wn-%d\n", k, k + 1, k + 1,
                     k, k + 1);
        else snprintf(line, sizeof line, "ws-%d ::= \"\"\nwn-%d ::= \"\"\n", k, k);
        KVB_FORWARD_IF_ERROR(put(out, line));
    }
    return KVB_OK;
}
