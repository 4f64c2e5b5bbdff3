/* jsonmode_schema.c — a request's response_format json_schema compiled into
 * the node arrays JSON mode reads. See jsonmode_schema_compile in jsonmode.h
 * for the subset; anything outside it is refused by name, never ignored, so
 * an output is never held to less than what was asked. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "engine/jsonmode.h"

#define MAX_NODES 4096
#define MAX_BYTES (1u << 20)
#define MAX_TEXT 1024 /* bytes of one property name or enum value */

struct builder {
    const struct json_doc *j;
    struct jsonmode_schema *s;
    int32_t cap_nodes, cap_props, cap_lits;
    size_t cap_bytes;
    char *path; /* the error's field, PATH chars */
    char *msg;  /* the error's text, MSG chars */
    size_t path_cap, msg_cap;
    bool oom;
};

/* The error: its field (path) and message; -1. */
static int fail(struct builder *b, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct builder *b, const char *path, const char *fmt, ...)
{
    snprintf(b->path, b->path_cap, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, b->msg_cap, fmt, ap);
    va_end(ap);
    return -1;
}

static bool grow(void **p, int64_t need, int64_t *cap, size_t elem)
{
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = kvb_realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static int32_t new_node(struct builder *b)
{
    int64_t cap = b->cap_nodes;
    if (b->s->n_nodes >= MAX_NODES || !grow((void **)&b->s->nodes, b->s->n_nodes + 1, &cap, sizeof *b->s->nodes)) {
        b->oom = b->s->n_nodes < MAX_NODES;
        return -1;
    }
    b->cap_nodes = (int32_t)cap;
    memset(&b->s->nodes[b->s->n_nodes], 0, sizeof b->s->nodes[0]);
    return b->s->n_nodes++;
}

/* Copies n bytes into the schema's byte store; the text naming them. */
static bool add_bytes(struct builder *b, const char *p, size_t n, struct jsonmode_text *out, const char *path)
{
    int64_t cap = (int64_t)b->cap_bytes;
    if (b->s->n_bytes + n > MAX_BYTES) {
        fail(b, path, "field '%s': the schema's names and values exceed 1 MiB", path);
        return false;
    }
    if (!grow((void **)&b->s->bytes, (int64_t)(b->s->n_bytes + n), &cap, 1)) {
        b->oom = true;
        return false;
    }
    b->cap_bytes = (size_t)cap;
    if (n) memcpy(b->s->bytes + b->s->n_bytes, p, n);
    *out = (struct jsonmode_text){(uint32_t)b->s->n_bytes, (uint32_t)n};
    b->s->n_bytes += n;
    return true;
}

/* out = base.key, cut to fit (paths only label errors). */
static void sub_path(char *out, size_t cap, const char *base, const char *key)
{
    const size_t n = strnlen(base, cap - 1);
    memcpy(out, base, n);
    size_t m = 0;
    if (n + 1 < cap) {
        out[n] = '.';
        m = strnlen(key, cap - n - 2);
        memcpy(out + n + 1, key, m);
        m++;
    }
    out[n + m] = '\0';
}

/* A whole number in [lo, hi] at token i. */
static bool count_at(const struct json_doc *j, int i, double lo, double hi, uint32_t *out)
{
    if (json_kind(j, i) != JSON_NUMBER) return false;
    double v = strtod(j->src + j->tok[i].start, NULL);
    if (!(v >= lo && v <= hi) || v != (double)(uint32_t)v) return false;
    *out = (uint32_t)v;
    return true;
}

static const char *const annotations[] = {"description", "title",    "default",  "examples",  "$schema",
                                          "$id",         "$comment", "readOnly", "writeOnly", "deprecated"};
static const char *const understood[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const"};

static int compile(struct builder *b, int i, const char *path, int depth);

static int type_bits(struct builder *b, int t, const char *path, unsigned *bits)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"string", JST_STRING},
                 {"number", JST_NUMBER},
                 {"integer", JST_INTEGER},
                 {"boolean", JST_BOOLEAN},
                 {"null", JST_NULL},
                 {"object", 32},
                 {"array", 64}};
    const struct json_doc *j = b->j;
    const int n = json_kind(j, t) == JSON_ARRAY ? j->tok[t].size : 1;
    int k = json_kind(j, t) == JSON_ARRAY ? t + 1 : t;
    *bits = 0;
    for (int m = 0; m < n; m++, k = json_skip(j, k)) {
        size_t w = 0;
        if (json_kind(j, k) == JSON_STRING)
            while (w < sizeof names / sizeof names[0] && !json_str_eq(j, k, names[w].name)) w++;
        if (json_kind(j, k) != JSON_STRING || w == sizeof names / sizeof names[0])
            return fail(b, path,
                        "field '%s' must name JSON types (string, number, integer, boolean, null, object, "
                        "array)",
                        path);
        *bits |= names[w].bit;
    }
    if (*bits == 0) return fail(b, path, "field '%s' names no type", path);
    if ((*bits & (32 | 64)) && (n > 1 || (*bits & (*bits - 1))))
        return fail(b, path,
                    "field '%s': a list of types may hold only string, number, integer, boolean and "
                    "null",
                    path);
    return 0;
}

/* enum (or const: single) at token vals: the literals whose kind `types`
 * allows (0: any), which must leave at least one. */
static int compile_enum(struct builder *b, int32_t ni, int vals, bool single, unsigned types, const char *path)
{
    const struct json_doc *j = b->j;
    if (!single && json_kind(j, vals) != JSON_ARRAY) return fail(b, path, "field '%s' must be an array", path);
    const int n = single ? 1 : j->tok[vals].size;
    if (n < 1 || n > JSONMODE_MAX_PROPS) return fail(b, path, "field '%s' must hold 1 to 64 values", path);
    int64_t cap = b->cap_lits;
    if (!grow((void **)&b->s->lits, b->s->n_lits + n, &cap, sizeof *b->s->lits)) {
        b->oom = true;
        return -1;
    }
    b->cap_lits = (int32_t)cap;
    b->s->nodes[ni].kind = JSK_ENUM;
    b->s->nodes[ni].first = (uint32_t)b->s->n_lits;
    int kept = 0, k = single ? vals : vals + 1;
    for (int m = 0; m < n; m++, k = json_skip(j, k)) {
        const enum json_kind kind = json_kind(j, k);
        const char *src = j->src + j->tok[k].start;
        size_t len = (size_t)(j->tok[k].end - j->tok[k].start);
        unsigned bit;
        if (kind == JSON_STRING) { /* the token's text is inside the quotes */
            src--;
            len += 2;
            bit = JST_STRING;
        } else if (kind == JSON_TRUE || kind == JSON_FALSE) {
            bit = JST_BOOLEAN;
        } else if (kind == JSON_NULL) {
            bit = JST_NULL;
        } else {
            return fail(b, path, "field '%s': only strings, true, false and null are supported as values", path);
        }
        if (len > MAX_TEXT) return fail(b, path, "field '%s' holds a value longer than 1024 bytes", path);
        if (types && !(types & bit)) continue; /* the schema's type rules it out */
        for (int e = 0; e < kept; e++) {
            const struct jsonmode_text *t = &b->s->lits[b->s->nodes[ni].first + (uint32_t)e];
            if (t->len == len && memcmp(b->s->bytes + t->off, src, len) == 0)
                return fail(b, path, "field '%s' repeats a value", path);
        }
        if (!add_bytes(b, src, len, &b->s->lits[b->s->n_lits], path)) return -1;
        b->s->n_lits++;
        kept++;
    }
    if (kept == 0) return fail(b, path, "field '%s': no value has the schema's type", path);
    b->s->nodes[ni].n = (uint16_t)kept;
    return 0;
}

static int compile_object(struct builder *b, int32_t ni, int props, int req, int addl, const char *path, int depth)
{
    const struct json_doc *j = b->j;
    char sub[256];
    struct jsonmode_node *nd = &b->s->nodes[ni];
    nd->kind = JSK_OBJECT;
    if (addl >= 0 && json_kind(j, addl) != JSON_FALSE) {
        sub_path(sub, sizeof sub, path, "additionalProperties");
        return fail(b, sub, "field '%s': only false is supported (no property beyond those listed)", sub);
    }
    if (req >= 0 && json_kind(j, req) != JSON_ARRAY) {
        sub_path(sub, sizeof sub, path, "required");
        return fail(b, sub, "field '%s' must be an array of names", sub);
    }
    if (props < 0) {
        if (req >= 0 && j->tok[req].size > 0) {
            sub_path(sub, sizeof sub, path, "required");
            return fail(b, sub, "field '%s' names properties the object does not list", sub);
        }
        /* No properties listed: any object, unless none may be added (then only {}). */
        nd->any_object = addl < 0;
        return 0;
    }
    sub_path(sub, sizeof sub, path, "properties");
    if (json_kind(j, props) != JSON_OBJECT) return fail(b, sub, "field '%s' must be an object", sub);
    const int n = j->tok[props].size;
    if (n > JSONMODE_MAX_PROPS) return fail(b, sub, "field '%s' lists more than 64 properties", sub);
    int64_t cap = b->cap_props;
    if (!grow((void **)&b->s->props, b->s->n_props + n, &cap, sizeof *b->s->props)) {
        b->oom = true;
        return -1;
    }
    b->cap_props = (int32_t)cap;
    const uint32_t first = (uint32_t)b->s->n_props;
    b->s->n_props += n; /* reserved here: the properties' own schemas add theirs after */
    nd->first = first;
    nd->n = (uint16_t)n;
    int k = props + 1;
    for (int m = 0; m < n; m++, k = json_skip(j, k + 1)) {
        const char *name = j->src + j->tok[k].start;
        const size_t len = (size_t)(j->tok[k].end - j->tok[k].start);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(len < 60 ? len : 60), name);
        char ppath[256];
        sub_path(ppath, sizeof ppath, sub, key);
        if (memchr(name, '\\', len))
            return fail(b, ppath, "field '%s': property names with escapes are not supported", ppath);
        for (int e = 0; e < m; e++) {
            const struct jsonmode_text *t = &b->s->props[first + (uint32_t)e].name;
            if (t->len == len && memcmp(b->s->bytes + t->off, name, len) == 0)
                return fail(b, ppath, "field '%s' is listed twice", ppath);
        }
        if (len > MAX_TEXT)
            return fail(b, ppath, "field '%s': property names longer than 1024 bytes are not supported", ppath);
        struct jsonmode_text t;
        if (!add_bytes(b, name, len, &t, ppath)) return -1;
        b->s->props[first + (uint32_t)m].name = t;
        const int32_t child = compile(b, k + 1, ppath, depth);
        if (child < 0) return -1;
        b->s->props[first + (uint32_t)m].node = child;
    }
    if (req >= 0) {
        sub_path(sub, sizeof sub, path, "required");
        int r = req + 1;
        for (int m = 0; m < j->tok[req].size; m++, r = json_skip(j, r)) {
            int w = 0;
            if (json_kind(j, r) == JSON_STRING) {
                const size_t len = (size_t)(j->tok[r].end - j->tok[r].start);
                for (; w < n; w++) {
                    const struct jsonmode_text *t = &b->s->props[first + (uint32_t)w].name;
                    if (t->len == len && memcmp(b->s->bytes + t->off, j->src + j->tok[r].start, len) == 0) break;
                }
            }
            if (json_kind(j, r) != JSON_STRING || w == n)
                return fail(b, sub, "field '%s' names a property the object does not list", sub);
            b->s->nodes[ni].required |= (uint64_t)1 << w;
        }
    }
    return 0;
}

/* Node for the schema at token i (path names it in errors), or -1. */
static int compile(struct builder *b, int i, const char *path, int depth)
{
    const struct json_doc *j = b->j;
    const int32_t ni = new_node(b);
    if (ni < 0) {
        if (!b->oom) fail(b, path, "field '%s': the schema has too many parts", path);
        return -1;
    }
    if (json_kind(j, i) == JSON_TRUE) return ni; /* true: anything (JSK_ANY) */
    if (json_kind(j, i) != JSON_OBJECT) return fail(b, path, "field '%s' must be a schema (an object)", path);
    int type = -1, props = -1, req = -1, addl = -1, items = -1, min = -1, max = -1, en = -1, cn = -1;
    int k = i + 1;
    for (int m = 0; m < j->tok[i].size; m++, k = json_skip(j, k + 1)) {
        int *slot[] = {&type, &props, &req, &addl, &items, &min, &max, &en, &cn};
        size_t w = 0;
        while (w < sizeof understood / sizeof understood[0] && !json_str_eq(j, k, understood[w])) w++;
        if (w < sizeof understood / sizeof understood[0]) {
            *slot[w] = k + 1;
            continue;
        }
        size_t a = 0;
        while (a < sizeof annotations / sizeof annotations[0] && !json_str_eq(j, k, annotations[a])) a++;
        if (a < sizeof annotations / sizeof annotations[0]) continue;
        char key[48];
        snprintf(key, sizeof key, "%.*s",
                 (int)(j->tok[k].end - j->tok[k].start < 40 ? j->tok[k].end - j->tok[k].start : 40),
                 j->src + j->tok[k].start);
        return fail(b, path,
                    "field '%s': keyword '%s' is not supported (kvbatch holds outputs to type, properties, "
                    "required, items, minItems, maxItems, enum and const)",
                    path, key);
    }
    char sub[256];
    if (en >= 0 && cn >= 0) return fail(b, path, "field '%s': give enum or const, not both", path);
    if (en >= 0 || cn >= 0) {
        unsigned types = 0;
        if (type >= 0) {
            sub_path(sub, sizeof sub, path, "type");
            if (type_bits(b, type, sub, &types) < 0) return -1;
        }
        sub_path(sub, sizeof sub, path, en >= 0 ? "enum" : "const");
        return compile_enum(b, ni, en >= 0 ? en : cn, en < 0, types, sub) < 0 ? -1 : ni;
    }
    unsigned bits = 0;
    if (type >= 0) {
        sub_path(sub, sizeof sub, path, "type");
        if (type_bits(b, type, sub, &bits) < 0) return -1;
    } else if (props >= 0 || req >= 0 || addl >= 0) {
        bits = 32;
    } else if (items >= 0 || min >= 0 || max >= 0) {
        bits = 64;
    } else {
        return ni; /* no constraint: anything */
    }
    if (bits & (32 | 64)) {
        if (depth + 1 > JSONMODE_MAX_FRAMES)
            return fail(b, path, "field '%s': objects and arrays nest deeper than 16", path);
    }
    if (bits == 32) return compile_object(b, ni, props, req, addl, path, depth + 1) < 0 ? -1 : ni;
    if (bits == 64) {
        b->s->nodes[ni].kind = JSK_ARRAY;
        b->s->nodes[ni].min_items = 0;
        b->s->nodes[ni].max_items = UINT16_MAX;
        if (min >= 0 && !count_at(j, min, 0, UINT16_MAX, &b->s->nodes[ni].min_items)) {
            sub_path(sub, sizeof sub, path, "minItems");
            return fail(b, sub, "field '%s' must be a whole number from 0 to 65535", sub);
        }
        if (max >= 0 && !count_at(j, max, 0, UINT16_MAX, &b->s->nodes[ni].max_items)) {
            sub_path(sub, sizeof sub, path, "maxItems");
            return fail(b, sub, "field '%s' must be a whole number from 0 to 65535", sub);
        }
        if (b->s->nodes[ni].min_items > b->s->nodes[ni].max_items) {
            sub_path(sub, sizeof sub, path, "minItems");
            return fail(b, sub, "field '%s' is above maxItems", sub);
        }
        sub_path(sub, sizeof sub, path, "items");
        int32_t child = -1;
        if (items >= 0) {
            child = compile(b, items, sub, depth + 1);
        } else if ((child = new_node(b)) < 0 && !b->oom) {
            fail(b, path, "field '%s': the schema has too many parts", path);
        }
        if (child < 0) return -1;
        b->s->nodes[ni].items = child;
        return ni;
    }
    if (props >= 0 || items >= 0) return fail(b, path, "field '%s': properties or items given for a scalar type", path);
    b->s->nodes[ni].kind = JSK_SCALAR;
    b->s->nodes[ni].types = (uint8_t)bits;
    return ni;
}

enum kvb_status jsonmode_schema_compile(const char *text, size_t len, const char *path, struct jsonmode_schema **out,
                                        char *err_path, size_t path_cap, char *msg, size_t msg_cap)
{
    *out = NULL;
    struct json_doc j;
    const char *why;
    size_t where;
    enum kvb_status st = json_parse(text, len, &j, &why, &where);
    if (st == KVB_ERR_NOMEM) return st;
    struct builder b = {.j = &j, .path = err_path, .msg = msg, .path_cap = path_cap, .msg_cap = msg_cap};
    if (st != KVB_OK) {
        fail(&b, path, "field '%s' is not valid JSON: %s at byte %zu", path, why, where);
        return KVB_ERR_FORMAT;
    }
    st = KVB_ERR_NOMEM;
    b.s = kvb_calloc(1, sizeof *b.s);
    if (!b.s) goto done;
    if (compile(&b, 0, path, 0) < 0) {
        st = b.oom ? KVB_ERR_NOMEM : KVB_ERR_FORMAT;
    } else if (b.s->nodes[0].kind != JSK_OBJECT) {
        fail(&b, path, "field '%s' must describe an object (\"type\": \"object\")", path);
        st = KVB_ERR_FORMAT;
    } else {
        *out = b.s;
        b.s = NULL;
        st = KVB_OK;
    }
done:
    jsonmode_schema_free(b.s);
    json_free(&j);
    return st;
}
