/* job_parse_constraint.c — the output constraints a request may carry
 * besides response_format: structured_outputs {json | json_object | regex |
 * choice | grammar} (vLLM's current form) and the older guided_json,
 * guided_regex, guided_choice and guided_grammar. At most one constraint a
 * request, response_format's included: a second is an error naming both.
 * The texts are kept as written for the engine to compile (app/admit.c);
 * only their JSON shape is checked here. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "jobs/job_parse_internal.h"

/* Claims the request's one constraint for the field at path. */
static int claim(struct jp_ctx *c, const char *path, enum job_constraint kind)
{
    struct job_request *r = c->r;
    if (r->constraint != JOB_CONSTRAINT_NONE)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path,
                       "fields '%s' and '%s' both constrain the output; a request takes one", r->constraint_param,
                       path);
    r->constraint = (uint8_t)kind;
    snprintf(r->constraint_param, sizeof r->constraint_param, "%s", path);
    return 0;
}

int jp_claim_constraint(struct jp_ctx *c, const char *path, enum job_constraint kind) { return claim(c, path, kind); }

/* A JSON Schema given as an object (its text as written) or as a string
 * holding its text (decoded). */
static int take_schema(struct jp_ctx *c, int i, const char *path)
{
    struct job_request *r = c->r;
    const enum json_kind k = json_kind(c->j, i);
    if (k == JSON_STRING) {
        if (json_str_dup(c->j, i, &r->json_schema, &r->json_schema_len) != KVB_OK) return jp_fail_nomem(c);
    } else if (k == JSON_OBJECT || k == JSON_TRUE || k == JSON_FALSE) { /* the engine names what it refuses */
        const int from = c->j->tok[i].start, to = c->j->tok[i].end;
        r->json_schema_len = (size_t)(to - from);
        r->json_schema = kvb_strndup(c->j->src + from, r->json_schema_len);
        if (!r->json_schema) return jp_fail_nomem(c);
    } else {
        return jp_fail_type(c, path, "a JSON Schema (an object, or a string holding one)");
    }
    r->json_object = true;
    r->given |= JOB_GIVEN_RESPONSE_FORMAT;
    return 0;
}

static int take_choice(struct jp_ctx *c, int i, const char *path)
{
    struct job_request *r = c->r;
    if (json_kind(c->j, i) != JSON_ARRAY || c->j->tok[i].size == 0)
        return jp_fail_type(c, path, "a non-empty array of strings");
    int k = i + 1;
    for (int m = 0; m < c->j->tok[i].size; m++, k = json_skip(c->j, k)) {
        if (json_kind(c->j, k) != JSON_STRING) {
            char sub[JP_PATH_MAX];
            jp_path_idx(sub, path, m);
            return jp_fail_type(c, sub, "a string");
        }
    }
    const int from = c->j->tok[i].start, to = c->j->tok[i].end;
    r->constraint_len = (size_t)(to - from);
    r->constraint_text = kvb_strndup(c->j->src + from, r->constraint_len);
    return r->constraint_text ? 0 : jp_fail_nomem(c);
}

/* One constraint field: value token i, kind, at path. JSON null is as absent. */
static int take(struct jp_ctx *c, int i, const char *path, enum job_constraint kind, bool object_flag)
{
    struct job_request *r = c->r;
    const enum json_kind k = json_kind(c->j, i);
    if (k == JSON_NULL) return 0;
    if (object_flag) { /* structured_outputs.json_object: true */
        if (k == JSON_FALSE) return 0;
        if (k != JSON_TRUE) return jp_fail_type(c, path, "a boolean");
    }
    int rc = claim(c, path, kind);
    if (rc) return rc;
    if (object_flag) {
        r->json_object = true;
        r->given |= JOB_GIVEN_RESPONSE_FORMAT;
        return 0;
    }
    if (kind == JOB_CONSTRAINT_JSON) return take_schema(c, i, path);
    if (kind == JOB_CONSTRAINT_CHOICE) return take_choice(c, i, path);
    if (k != JSON_STRING) return jp_fail_type(c, path, "a string");
    if (json_str_dup(c->j, i, &r->constraint_text, &r->constraint_len) != KVB_OK) return jp_fail_nomem(c);
    if (r->constraint_len == 0 && kind == JOB_CONSTRAINT_GRAMMAR)
        return jp_fail(c, JOB_ERR_INVALID_VALUE, path, "field '%s' is an empty grammar", path);
    return 0;
}

static const struct {
    const char *name; /* under structured_outputs; guided_<name> at the top */
    enum job_constraint kind;
    bool object_flag;
} forms[] = {
    {"json", JOB_CONSTRAINT_JSON, false},       {"json_object", JOB_CONSTRAINT_JSON, true},
    {"regex", JOB_CONSTRAINT_REGEX, false},     {"choice", JOB_CONSTRAINT_CHOICE, false},
    {"grammar", JOB_CONSTRAINT_GRAMMAR, false},
};

int jp_parse_constraints(struct jp_ctx *c, int obj)
{
    char path[JP_PATH_MAX], sub[JP_PATH_MAX];
    int i = jp_lookup(c, obj, "structured_outputs");
    if (i >= 0 && json_kind(c->j, i) != JSON_NULL) {
        jp_path_of(c, "structured_outputs", path);
        if (json_kind(c->j, i) != JSON_OBJECT) return jp_fail_type(c, path, "an object");
        static const char *const names[] = {"json", "json_object", "regex", "choice", "grammar"};
        int rc = jp_check_members(c, i, path, names, sizeof names / sizeof names[0]);
        if (rc) return rc;
        for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
            const int v = jp_lookup(c, i, forms[f].name);
            if (v < 0) continue;
            jp_path_sub(sub, path, ".");
            snprintf(sub + strlen(sub), sizeof sub - strlen(sub), "%s", forms[f].name);
            if ((rc = take(c, v, sub, forms[f].kind, forms[f].object_flag))) return rc;
        }
    }
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        if (forms[f].object_flag) continue;
        char name[32];
        snprintf(name, sizeof name, "guided_%s", forms[f].name);
        const int v = jp_lookup(c, obj, name);
        if (v < 0) continue;
        jp_path_of(c, name, path);
        int rc = take(c, v, path, forms[f].kind, false);
        if (rc) return rc;
    }
    return 0;
}
