/* grammar_schema.c — the walker: a JSON Schema read as a conjunction of
 * schema objects (a "view": the schema, the parts of its allOf, the targets
 * of its $refs), each keyword taken from the one part that gives it, and
 * written as GBNF rules, one per schema compiled (g<N>), one per $ref'd
 * definition (shared, so recursion is a rule calling itself). See
 * grammar_schema.h for what is held; everything else is refused by name. */
#include "engine/grammar_schema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_schema_int.h"

#define MAX_VIEW GS_MAX_VIEW
#define PATH GS_PATH

const char *const gs_kw_names[K_COUNT] = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "pattern",
                                          "format",
                                          "minLength",
                                          "maxLength",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "additionalItems"};
static const char *const annotations[] = {"description", "title",       "default",      "examples",  "$schema",
                                          "$id",         "$comment",    "readOnly",     "writeOnly", "deprecated",
                                          "$defs",       "definitions", "discriminator"};

struct view {
    int n;
    int tok[MAX_VIEW];
    uint32_t skip[MAX_VIEW]; /* bit K: keyword K of this part is dealt with already */
};

void gs_sub_path(char *out, const char *base, const char *key)
{
    snprintf(out, GS_PATH, "%.*s.%.*s", 180, base, 70, key);
}
#define sub_path gs_sub_path

static int32_t compile(struct gs *g, const struct view *v, const char *path, int depth, unsigned *types);
#define compile_tok gs_compile_tok

static bool is_annotation(const struct json_doc *j, int k)
{
    for (size_t a = 0; a < sizeof annotations / sizeof annotations[0]; a++)
        if (json_str_eq(j, k, annotations[a])) return true;
    return false;
}

static int kw_index(const struct json_doc *j, int k)
{
    for (int w = 0; w < K_COUNT; w++)
        if (json_str_eq(j, k, gs_kw_names[w])) return w;
    return -1;
}

/* ---- $ref --------------------------------------------------------------------------------- */

/* The token a "#..." JSON pointer names, or -1 with the error set. */
static int resolve_ref(struct gs *g, int at, const char *path)
{
    const struct json_doc *j = g->j;
    char *ref = NULL;
    size_t n = 0;
    if (json_kind(j, at) != JSON_STRING) return gs_fail(g, path, "field '%s' must be a string", path);
    if (json_str_dup(j, at, &ref, &n) != KVB_OK) return gs_nomem(g);
    int cur = 0;
    if (n == 0 || ref[0] != '#') {
        gs_fail(g, path, "field '%s': only references inside the schema (\"#...\") are supported, not '%.80s'", path,
                ref);
        cur = -1;
    }
    size_t i = 1;
    while (cur >= 0 && i < n) {
        if (ref[i] != '/') {
            gs_fail(g, path, "field '%s': '%.80s' is not a JSON pointer (\"#/$defs/Name\")", path, ref);
            cur = -1;
            break;
        }
        size_t e = ++i;
        while (e < n && ref[e] != '/') e++;
        char seg[256];
        size_t w = 0;
        for (size_t k = i; k < e && w + 1 < sizeof seg; k++) {
            if (ref[k] == '~' && k + 1 < e && (ref[k + 1] == '0' || ref[k + 1] == '1')) {
                seg[w++] = ref[k + 1] == '0' ? '~' : '/';
                k++;
            } else if (ref[k] == '%') { /* URI fragments may percent-encode */
                int hv = 0;
                if (k + 2 < e && sscanf(ref + k + 1, "%2x", (unsigned *)&hv) == 1) seg[w++] = (char)hv, k += 2;
                else seg[w++] = '%';
            } else {
                seg[w++] = ref[k];
            }
        }
        seg[w] = '\0';
        int next = -1;
        if (json_kind(j, cur) == JSON_OBJECT) {
            next = json_get(j, cur, seg);
        } else if (json_kind(j, cur) == JSON_ARRAY) {
            char *endp;
            const long idx = strtol(seg, &endp, 10);
            if (*seg && !*endp && idx >= 0 && idx < j->tok[cur].size) {
                next = cur + 1;
                for (long m = 0; m < idx; m++) next = json_skip(j, next);
            }
        }
        if (next < 0) {
            gs_fail(g, path, "field '%s': the reference '%.80s' names nothing in the schema", path, ref);
            cur = -1;
            break;
        }
        cur = next;
        i = e;
    }
    kvb_free(ref);
    return cur;
}

/* ---- views -------------------------------------------------------------------------------- */

static bool only_ref(const struct json_doc *j, int tok)
{
    if (json_kind(j, tok) != JSON_OBJECT) return false;
    bool ref = false;
    int k = tok + 1;
    for (int m = 0; m < j->tok[tok].size; m++, k = json_skip(j, k + 1)) {
        if (json_str_eq(j, k, "$ref")) ref = true;
        else if (!is_annotation(j, k)) return false;
    }
    return ref;
}

/* The parts allOf and $ref bring in, added to the view. */
static int flatten(struct gs *g, struct view *v, const char *path)
{
    const struct json_doc *j = g->j;
    for (int p = 0; p < v->n; p++) {
        const int t = v->tok[p];
        if (json_kind(j, t) == JSON_TRUE) continue;
        if (json_kind(j, t) == JSON_FALSE)
            return gs_fail(g, path, "field '%s': the schema false allows no value", path);
        if (json_kind(j, t) != JSON_OBJECT) return gs_fail(g, path, "field '%s' must be a schema (an object)", path);
        const int all = (v->skip[p] >> K_ALLOF) & 1 ? -1 : json_get(j, t, "allOf");
        const int ref = (v->skip[p] >> K_REF) & 1 ? -1 : json_get(j, t, "$ref");
        v->skip[p] |= 1u << K_ALLOF | 1u << K_REF;
        char sub[PATH];
        if (all >= 0) {
            sub_path(sub, path, "allOf");
            if (json_kind(j, all) != JSON_ARRAY || j->tok[all].size == 0)
                return gs_fail(g, sub, "field '%s' must be a non-empty array of schemas", sub);
            int k = all + 1;
            for (int m = 0; m < j->tok[all].size; m++, k = json_skip(j, k)) {
                if (v->n == MAX_VIEW)
                    return gs_fail(g, sub, "field '%s': allOf and $ref bring in more than %d schemas (or a cycle)", sub,
                                   MAX_VIEW);
                v->tok[v->n] = k;
                v->skip[v->n++] = 0;
            }
        }
        if (ref >= 0) {
            sub_path(sub, path, "$ref");
            const int target = resolve_ref(g, ref, sub);
            if (target < 0) return -1;
            if (v->n == MAX_VIEW)
                return gs_fail(g, sub, "field '%s': allOf and $ref bring in more than %d schemas (or a cycle)", sub,
                               MAX_VIEW);
            v->tok[v->n] = target;
            v->skip[v->n++] = 0;
        }
    }
    return 0;
}

/* Every keyword of the view; unknown ones refused, repeated ones merged or refused. */
static int gather(struct gs *g, const struct view *v, struct kws *kw, const char *path)
{
    const struct json_doc *j = g->j;
    memset(kw, 0, sizeof *kw);
    for (int w = 0; w < K_COUNT; w++) kw->at[w] = -1;
    for (int p = 0; p < v->n; p++) {
        const int t = v->tok[p];
        if (json_kind(j, t) != JSON_OBJECT) continue;
        int k = t + 1;
        for (int m = 0; m < j->tok[t].size; m++, k = json_skip(j, k + 1)) {
            const int w = kw_index(j, k);
            if (w < 0) {
                if (is_annotation(j, k)) continue;
                const int len = j->tok[k].end - j->tok[k].start;
                return gs_fail(g, path, "field '%s': keyword '%.*s' is not supported", path, len < 60 ? len : 60,
                               j->src + j->tok[k].start);
            }
            if ((v->skip[p] >> w) & 1) continue;
            if (w == K_TYPE) kw->types[kw->n_types++] = k + 1;
            else if (w == K_PROPS) kw->props[kw->n_props++] = k + 1;
            else if (w == K_REQ) kw->reqs[kw->n_reqs++] = k + 1;
            else if (kw->at[w] >= 0)
                return gs_fail(g, path,
                               "field '%s': '%s' is given by two schemas of an allOf or $ref, which kvbatch does not "
                               "merge",
                               path, gs_kw_names[w]);
            kw->at[w] = k + 1;
            kw->from[w] = p;
        }
    }
    return 0;
}

/* JSON types named by a "type" value, GT_* bits. */
static int type_bits(struct gs *g, int t, const char *path, unsigned *bits)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"string", GT_STR}, {"number", GT_NUM | GT_INT}, {"integer", GT_INT}, {"boolean", GT_BOOL},
                 {"null", GT_NULL},  {"object", GT_OBJ},          {"array", GT_ARR}};
    const struct json_doc *j = g->j;
    const bool list = json_kind(j, t) == JSON_ARRAY;
    const int n = list ? j->tok[t].size : 1;
    int k = list ? t + 1 : t;
    *bits = 0;
    for (int m = 0; m < n; m++, k = json_skip(j, k)) {
        size_t w = 0;
        if (json_kind(j, k) == JSON_STRING)
            while (w < sizeof names / sizeof names[0] && !json_str_eq(j, k, names[w].name)) w++;
        if (json_kind(j, k) != JSON_STRING || w == sizeof names / sizeof names[0])
            return gs_fail(g, path,
                           "field '%s' must name JSON types (string, number, integer, boolean, null, object, array)",
                           path);
        *bits |= names[w].bit;
    }
    if (*bits == 0) return gs_fail(g, path, "field '%s' names no type", path);
    return 0;
}

/* The types the view allows: "type" intersected, else those its keywords are for. */
static int view_types(struct gs *g, const struct kws *kw, const char *path, unsigned *out)
{
    unsigned bits = GT_ALL;
    char sub[PATH];
    sub_path(sub, path, "type");
    for (int i = 0; i < kw->n_types; i++) {
        unsigned b;
        if (type_bits(g, kw->types[i], sub, &b) < 0) return -1;
        bits &= b;
    }
    if (kw->n_types == 0) {
        unsigned implied = 0;
        if (kw->at[K_PATTERN] >= 0 || kw->at[K_FORMAT] >= 0 || kw->at[K_MINL] >= 0 || kw->at[K_MAXL] >= 0)
            implied |= GT_STR;
        if (kw->at[K_MIN] >= 0 || kw->at[K_MAX] >= 0 || kw->at[K_XMIN] >= 0 || kw->at[K_XMAX] >= 0)
            implied |= GT_NUM | GT_INT;
        if (kw->n_props || kw->n_reqs || kw->at[K_ADDL] >= 0) implied |= GT_OBJ;
        if (kw->at[K_ITEMS] >= 0 || kw->at[K_PREFIX] >= 0 || kw->at[K_MINI] >= 0 || kw->at[K_MAXI] >= 0 ||
            kw->at[K_ADDITEMS] >= 0)
            implied |= GT_ARR;
        if (implied) bits = implied; /* keywords of one kind say what is meant (stricter than JSON Schema) */
    }
    *out = bits;
    return 0;
}

/* ---- scalars ------------------------------------------------------------------------------ */

/* A whole number in [lo, hi] at token i. */
static bool count_at(const struct json_doc *j, int i, double hi, uint32_t *out)
{
    if (json_kind(j, i) != JSON_NUMBER) return false;
    const double v = strtod(j->src + j->tok[i].start, NULL);
    if (!(v >= 0 && v <= hi) || v != floor(v)) return false;
    *out = (uint32_t)v;
    return true;
}

int gs_get_count(struct gs *g, const struct kws *kw, int w, const char *path, uint32_t *out)
{
    if (kw->at[w] < 0) return 0;
    char sub[PATH];
    sub_path(sub, path, gs_kw_names[w]);
    if (!count_at(g->j, kw->at[w], 4294967294.0, out))
        return gs_fail(g, sub, "field '%s' must be a whole number, at least 0", sub);
    return 1;
}

static int string_expr(struct gs *g, const struct kws *kw, const char *path, struct kvb_buf *b)
{
    const struct json_doc *j = g->j;
    uint32_t mn = 0, mx = GREGEX_NO_MAX;
    char sub[PATH];
    if (gs_get_count(g, kw, K_MINL, path, &mn) < 0 || gs_get_count(g, kw, K_MAXL, path, &mx) < 0) return -1;
    if (mx != GREGEX_NO_MAX && mn > mx) {
        sub_path(sub, path, "minLength");
        return gs_fail(g, sub, "field '%s' is above maxLength", sub);
    }
    char *re = NULL;
    size_t re_len = 0;
    const char *what = NULL;
    if (kw->at[K_PATTERN] >= 0 && kw->at[K_FORMAT] >= 0) {
        sub_path(sub, path, "format");
        return gs_fail(g, sub, "field '%s': format beside pattern is not supported", sub);
    }
    if (kw->at[K_PATTERN] >= 0) {
        sub_path(sub, path, "pattern");
        if (json_kind(j, kw->at[K_PATTERN]) != JSON_STRING) return gs_fail(g, sub, "field '%s' must be a string", sub);
        if (json_str_dup(j, kw->at[K_PATTERN], &re, &re_len) != KVB_OK) return gs_nomem(g);
        what = "pattern";
    } else if (kw->at[K_FORMAT] >= 0) {
        sub_path(sub, path, "format");
        const int f = kw->at[K_FORMAT];
        const char *fre = json_kind(j, f) == JSON_STRING
                              ? gs_format_regex(j->src + j->tok[f].start, (size_t)(j->tok[f].end - j->tok[f].start))
                              : NULL;
        if (!fre) {
            const int len = j->tok[f].end - j->tok[f].start;
            return gs_fail(g, sub,
                           "field '%s': format '%.*s' is not supported (date, time, date-time, email, uuid, uri, "
                           "ipv4, ipv6 are)",
                           sub, len < 40 ? len : 40, j->src + j->tok[f].start);
        }
        re = kvb_strndup(fre, strlen(fre));
        if (!re) return gs_nomem(g);
        re_len = strlen(fre);
        what = "format";
    }
    if (re) {
        char prefix[32], msg[256];
        snprintf(prefix, sizeof prefix, "p%d", gs_new_id(g));
        const size_t mark = g->out->len;
        const enum kvb_status st =
            gregex_to_gbnf_len(re, re_len, GREGEX_JSON_CONTENT, mn, mx, prefix, g->out, msg, sizeof msg);
        kvb_free(re);
        if (st == KVB_ERR_NOMEM) return gs_nomem(g);
        if (st != KVB_OK) return gs_fail(g, sub, "field '%s': %s", sub, msg);
        if (g->out->len > GSCHEMA_MAX_BYTES) {
            g->out->len = mark;
            return gs_fail(g, sub, "field '%s': the %s's grammar is too large", sub, what);
        }
        return gs_putf(g, b, "\"\\\"\" %s \"\\\"\"", prefix) ? 0 : -1;
    }
    if (mn == 0 && mx == GREGEX_NO_MAX) return gs_need_str(g) && gs_put(g, b, "str") ? 0 : -1;
    if (mn > GSCHEMA_MAX_COUNT || (mx != GREGEX_NO_MAX && mx > GSCHEMA_MAX_COUNT)) {
        sub_path(sub, path, mn > GSCHEMA_MAX_COUNT ? "minLength" : "maxLength");
        return gs_fail(g, sub, "field '%s': lengths above %d are not supported without a pattern", sub,
                       GSCHEMA_MAX_COUNT);
    }
    if (!gs_need_lchr(g)) return -1;
    bool ok = mx == GREGEX_NO_MAX ? gs_putf(g, b, "\"\\\"\" lchr{%u,} \"\\\"\"", mn)
                                  : gs_putf(g, b, "\"\\\"\" lchr{%u,%u} \"\\\"\"", mn, mx);
    return ok ? 0 : -1;
}

/* A bound at token i: its value, whole (or not). */
static int bound_at(struct gs *g, int i, const char *path, double *v)
{
    if (json_kind(g->j, i) != JSON_NUMBER) return gs_fail(g, path, "field '%s' must be a number", path);
    *v = strtod(g->j->src + g->j->tok[i].start, NULL);
    if (!(fabs(*v) <= 4e18)) return gs_fail(g, path, "field '%s' is out of range (at most 4e18 in size)", path);
    return 0;
}

struct bounds {
    bool has_lo, has_hi, lo_ex, hi_ex;
    double lo, hi;
    int lo_tok, hi_tok; /* the numbers' tokens, for exact decimals */
};

static int get_bounds(struct gs *g, const struct kws *kw, const char *path, struct bounds *bd)
{
    const struct json_doc *j = g->j;
    char sub[PATH];
    memset(bd, 0, sizeof *bd);
    static const int which[4] = {K_MIN, K_MAX, K_XMIN, K_XMAX};
    bool draft4_lo = false, draft4_hi = false;
    for (int w = 0; w < 4; w++) {
        const int at = kw->at[which[w]];
        if (at < 0) continue;
        sub_path(sub, path, gs_kw_names[which[w]]);
        const bool is_x = which[w] == K_XMIN || which[w] == K_XMAX, is_lo = which[w] == K_MIN || which[w] == K_XMIN;
        if (is_x && (json_kind(j, at) == JSON_TRUE || json_kind(j, at) == JSON_FALSE)) { /* draft 4 */
            if (json_kind(j, at) == JSON_TRUE) {
                if (is_lo) draft4_lo = true;
                else draft4_hi = true;
            }
            continue;
        }
        double v = 0;
        if (bound_at(g, at, sub, &v) < 0) return -1;
        if (is_lo) {
            if (!bd->has_lo || v > bd->lo || (v == bd->lo && is_x)) bd->lo = v, bd->lo_ex = is_x, bd->lo_tok = at;
            bd->has_lo = true;
        } else {
            if (!bd->has_hi || v < bd->hi || (v == bd->hi && is_x)) bd->hi = v, bd->hi_ex = is_x, bd->hi_tok = at;
            bd->has_hi = true;
        }
    }
    /* draft 4: exclusiveMinimum true makes minimum exclusive */
    if (draft4_lo && kw->at[K_MIN] >= 0 && bd->lo == strtod(j->src + j->tok[kw->at[K_MIN]].start, NULL))
        bd->lo_ex = true;
    if (draft4_hi && kw->at[K_MAX] >= 0 && bd->hi == strtod(j->src + j->tok[kw->at[K_MAX]].start, NULL))
        bd->hi_ex = true;
    return 0;
}

static int int_expr(struct gs *g, const struct bounds *bd, const char *path, struct kvb_buf *b)
{
    if (!bd->has_lo && !bd->has_hi) return gs_need_int(g) && gs_put(g, b, "int") ? 0 : -1;
    int64_t lo = 0, hi = 0;
    if (bd->has_lo) lo = (int64_t)(bd->lo_ex ? floor(bd->lo) + 1 : ceil(bd->lo));
    if (bd->has_hi) hi = (int64_t)(bd->hi_ex ? ceil(bd->hi) - 1 : floor(bd->hi));
    if (bd->has_lo && bd->has_hi && lo > hi)
        return gs_fail(g, path, "field '%s': no integer is within the bounds", path);
    return gs_int_range(g, b, bd->has_lo, lo, bd->has_hi, hi) ? 0 : -1;
}

static int num_expr(struct gs *g, const struct bounds *bd, const char *path, struct kvb_buf *b)
{
    if (!bd->has_lo && !bd->has_hi) return gs_need_num(g) && gs_put(g, b, "num") ? 0 : -1;
    if (bd->has_lo && bd->has_hi && (bd->lo > bd->hi || (bd->lo == bd->hi && (bd->lo_ex || bd->hi_ex))))
        return gs_fail(g, path, "field '%s': no number is within the bounds", path);
    struct gs_dec lo, hi;
    const jsmntok_t *lt = bd->has_lo ? &g->j->tok[bd->lo_tok] : NULL, *ht = bd->has_hi ? &g->j->tok[bd->hi_tok] : NULL;
    if ((lt && !gs_dec_parse(g->j->src + lt->start, (size_t)(lt->end - lt->start), &lo)) ||
        (ht && !gs_dec_parse(g->j->src + ht->start, (size_t)(ht->end - ht->start), &hi)))
        return gs_fail(g, path, "field '%s': a bound has too many digits to hold exactly", path);
    return gs_num_range(g, b, lt ? &lo : NULL, bd->lo_ex, ht ? &hi : NULL, bd->hi_ex) ? 0 : -1;
}

static int enum_expr(struct gs *g, const struct kws *kw, unsigned types, const char *path, struct kvb_buf *b,
                     unsigned *out_types)
{
    const struct json_doc *j = g->j;
    const bool single = kw->at[K_ENUM] < 0;
    const int at = single ? kw->at[K_CONST] : kw->at[K_ENUM];
    char sub[PATH];
    sub_path(sub, path, single ? "const" : "enum");
    if (!single && (json_kind(j, at) != JSON_ARRAY || j->tok[at].size == 0))
        return gs_fail(g, sub, "field '%s' must be a non-empty array", sub);
    for (int w = 0; w < K_COUNT; w++) {
        if (w == K_TYPE || w == K_ENUM || w == K_CONST || w == K_ANYOF || w == K_ONEOF || kw->at[w] < 0) continue;
        return gs_fail(g, sub, "field '%s': '%s' beside enum or const is not supported", sub, gs_kw_names[w]);
    }
    if (kw->n_props || kw->n_reqs) return gs_fail(g, sub, "field '%s': properties beside enum or const", sub);
    const int n = single ? 1 : j->tok[at].size;
    int k = single ? at : at + 1, kept = 0;
    *out_types = 0;
    bool ok = gs_put(g, b, "(");
    for (int m = 0; ok && m < n; m++, k = json_skip(j, k)) {
        unsigned bit;
        switch (json_kind(j, k)) {
        case JSON_STRING: bit = GT_STR; break;
        case JSON_NUMBER: {
            const double v = strtod(j->src + j->tok[k].start, NULL);
            bit = v == floor(v) && fabs(v) < 9e15 ? GT_INT : GT_NUM;
            break;
        }
        case JSON_TRUE:
        case JSON_FALSE: bit = GT_BOOL; break;
        case JSON_NULL: bit = GT_NULL; break;
        case JSON_OBJECT: bit = GT_OBJ; break;
        default: bit = GT_ARR; break;
        }
        if (!(types & bit)) continue; /* the schema's type rules it out */
        ok = (kept == 0 || gs_put(g, b, " | ")) && gs_put_value_lit(g, b, k);
        kept++;
        *out_types |= bit;
    }
    if (!ok) return -1;
    if (kept == 0) return gs_fail(g, sub, "field '%s': no value has the schema's type", sub);
    return gs_put(g, b, ")") ? 0 : -1;
}

/* True when the view, its keyword w aside, holds nothing but annotations. */
static bool rest_empty(const struct json_doc *j, const struct view *v, int w)
{
    for (int p = 0; p < v->n; p++) {
        const int t = v->tok[p];
        if (json_kind(j, t) != JSON_OBJECT) continue;
        int k = t + 1;
        for (int m = 0; m < j->tok[t].size; m++, k = json_skip(j, k + 1)) {
            const int x = kw_index(j, k);
            if (x < 0 || x == w || ((v->skip[p] >> x) & 1)) continue; /* annotation (gather refused the rest) */
            return false;
        }
    }
    return true;
}

/* ---- one schema ----------------------------------------------------------------------------- */

/* The alternatives of anyOf/oneOf, each conjoined with the rest of the view. */
static int32_t compile_any_of(struct gs *g, const struct view *v, const struct kws *kw, const char *path, int depth,
                              unsigned *types)
{
    const struct json_doc *j = g->j;
    if (kw->at[K_ANYOF] >= 0 && kw->at[K_ONEOF] >= 0)
        return gs_fail(g, path, "field '%s': anyOf beside oneOf is not supported", path);
    const int w = kw->at[K_ANYOF] >= 0 ? K_ANYOF : K_ONEOF, at = kw->at[w];
    char sub[PATH];
    sub_path(sub, path, gs_kw_names[w]);
    if (json_kind(j, at) != JSON_ARRAY || j->tok[at].size == 0)
        return gs_fail(g, sub, "field '%s' must be a non-empty array of schemas", sub);
    struct kvb_buf body = {0};
    int alts = 0, k = at + 1;
    *types = 0;
    for (int m = 0; m < j->tok[at].size; m++, k = json_skip(j, k)) {
        char bpath[PATH];
        snprintf(bpath, sizeof bpath, "%.200s[%d]", sub, m);
        struct view bv = *v;
        bv.skip[kw->from[w]] |= 1u << w;
        if (bv.n == MAX_VIEW) {
            kvb_buf_free(&body);
            return gs_fail(g, sub, "field '%s': schemas nest too deeply", sub);
        }
        bv.tok[bv.n] = k;
        bv.skip[bv.n++] = 0;
        unsigned t = 0;
        int32_t r;
        if (rest_empty(j, v, w)) r = compile_tok(g, k, bpath, depth, &t); /* a branch alone: its $ref may be shared */
        else r = compile(g, &bv, bpath, depth, &t);
        if (r == -1) {
            kvb_buf_free(&body);
            return -1;
        }
        if (r == -2) continue; /* this branch allows nothing beside the rest */
        if (!((alts == 0 || gs_put(g, &body, " | ")) && gs_putf(g, &body, "g%d", r))) {
            kvb_buf_free(&body);
            return -1;
        }
        alts++;
        *types |= t;
    }
    int32_t id = -2;
    if (alts == 0) {
        gs_fail(g, sub, "field '%s': no branch can hold a value", sub);
    } else {
        id = gs_new_id(g);
        char name[24];
        snprintf(name, sizeof name, "g%d", id);
        if (gs_rule(g, name, &body, path) < 0) id = -1;
    }
    kvb_buf_free(&body);
    return id;
}

static int32_t compile(struct gs *g, const struct view *v0, const char *path, int depth, unsigned *types)
{
    struct view v = *v0;
    struct kws kw;
    *types = 0;
    if (++g->nest > GSCHEMA_MAX_NEST) {
        g->nest--;
        return gs_fail(g, path, "field '%s': schemas nest deeper than %d", path, GSCHEMA_MAX_NEST);
    }
    int32_t id = -1;
    struct kvb_buf body = {0};
    if (flatten(g, &v, path) < 0 || gather(g, &v, &kw, path) < 0) goto done;
    if (kw.at[K_ANYOF] >= 0 || kw.at[K_ONEOF] >= 0) {
        id = compile_any_of(g, &v, &kw, path, depth, types);
        goto done;
    }
    unsigned bits;
    if (view_types(g, &kw, path, &bits) < 0) goto done;
    if (bits == 0) {
        gs_fail(g, path, "field '%s': no JSON type satisfies every part of the schema", path);
        id = -2;
        goto done;
    }
    int alts = 0;
    bool ok = true;
#define ALT() (ok = ok && (alts++ == 0 || gs_put(g, &body, " | ")))
    if (kw.at[K_ENUM] >= 0 || kw.at[K_CONST] >= 0) {
        if (kw.at[K_ENUM] >= 0 && kw.at[K_CONST] >= 0) {
            gs_fail(g, path, "field '%s': give enum or const, not both", path);
            goto done;
        }
        if (enum_expr(g, &kw, bits, path, &body, types) < 0) goto done;
        alts = 1;
    } else if (bits == GT_ALL && kw.at[K_ADDL] < 0 && !kw.n_props && !kw.n_reqs && kw.at[K_ITEMS] < 0 &&
               kw.at[K_PREFIX] < 0 && kw.at[K_ADDITEMS] < 0 && kw.at[K_MINI] < 0 && kw.at[K_MAXI] < 0 &&
               kw.at[K_PATTERN] < 0 && kw.at[K_FORMAT] < 0 && kw.at[K_MINL] < 0 && kw.at[K_MAXL] < 0 &&
               kw.at[K_MIN] < 0 && kw.at[K_MAX] < 0 && kw.at[K_XMIN] < 0 && kw.at[K_XMAX] < 0) {
        char any[16]; /* no constraint: any value */
        ok = gs_need_any(g, GSCHEMA_MAX_DEPTH - depth, any) && gs_put(g, &body, any);
        *types = GT_ALL;
        alts = 1;
    } else {
        *types = bits;
        if (bits & GT_STR) {
            ALT();
            if (!ok || string_expr(g, &kw, path, &body) < 0) goto done;
        }
        if (bits & (GT_NUM | GT_INT)) {
            struct bounds bd;
            ALT();
            if (!ok || get_bounds(g, &kw, path, &bd) < 0) goto done;
            if ((bits & GT_NUM ? num_expr(g, &bd, path, &body) : int_expr(g, &bd, path, &body)) < 0) goto done;
        }
        if (bits & GT_BOOL) ALT(), ok = ok && gs_put(g, &body, "\"true\" | \"false\"");
        if (bits & GT_NULL) ALT(), ok = ok && gs_put(g, &body, "\"null\"");
        if (bits & GT_OBJ) {
            ALT();
            if (!ok || gs_object_expr(g, &kw, path, depth, &body) < 0) goto done;
        }
        if (bits & GT_ARR) {
            ALT();
            if (!ok || gs_array_expr(g, &kw, path, depth, &body) < 0) goto done;
        }
    }
#undef ALT
    if (!ok) goto done;
    id = gs_new_id(g);
    char name[24];
    snprintf(name, sizeof name, "g%d", id);
    if (gs_rule(g, name, &body, path) < 0) id = -1;
done:
    kvb_buf_free(&body);
    g->nest--;
    return id;
}

/* A schema at token tok: a lone $ref shares its definition's rule. */
int32_t gs_compile_tok(struct gs *g, int tok, const char *path, int depth, unsigned *types)
{
    const struct json_doc *j = g->j;
    if (only_ref(j, tok)) {
        char sub[PATH];
        sub_path(sub, path, "$ref");
        const int target = resolve_ref(g, json_get(j, tok, "$ref"), sub);
        if (target < 0) return -1;
        for (int d = 0; d < g->n_defs; d++) {
            if (g->defs[d].tok != target) continue;
            if (g->defs[d].busy && g->defs[d].opened == g->opened)
                return gs_fail(g, sub, "field '%s': a $ref cycle that opens no object or array", sub);
            *types = g->defs[d].busy ? GT_ALL : g->defs[d].types; /* recursion: an object or array (opened) */
            return g->defs[d].id;
        }
        if (g->n_defs == g->cap_defs) {
            const int cap = g->cap_defs ? g->cap_defs * 2 : 16;
            struct gs_def *nd = kvb_realloc(g->defs, (size_t)cap * sizeof *nd);
            if (!nd) return gs_nomem(g);
            g->defs = nd;
            g->cap_defs = cap;
        }
        const int d = g->n_defs++;
        g->defs[d] = (struct gs_def){target, gs_new_id(g), g->opened, true, 0};
        const int32_t id = g->defs[d].id;
        unsigned t = 0;
        const int32_t body = compile_tok(g, target, sub, 1, &t);
        g->defs[d].busy = false;
        g->defs[d].types = t;
        *types = t;
        if (body < 0) return body;
        char name[24], ref[24];
        snprintf(name, sizeof name, "g%d", id);
        snprintf(ref, sizeof ref, "g%d", body);
        struct kvb_buf b = {0};
        const int rc = gs_put(g, &b, ref) ? gs_rule(g, name, &b, sub) : -1;
        kvb_buf_free(&b);
        return rc < 0 ? -1 : id;
    }
    struct view v = {.n = 1, .tok = {tok}};
    return compile(g, &v, path, depth, types);
}

enum kvb_status gschema_to_gbnf(const char *schema_json, size_t len, const char *path, struct kvb_buf *out,
                                char *err_path, size_t path_cap, char *msg, size_t msg_cap)
{
    struct gs g = {.out = out, .err_path = err_path, .msg = msg, .path_cap = path_cap, .msg_cap = msg_cap};
    const size_t mark = out->len;
    if (err_path && path_cap) err_path[0] = '\0';
    if (msg && msg_cap) msg[0] = '\0';
    if (!schema_json || len == 0) { /* json_object: any object */
        char any[16];
        if (gs_need_any(&g, GSCHEMA_MAX_DEPTH, any) &&
            gs_putf(&g, out, "root ::= [ \\t\\n]? jo%d\n", GSCHEMA_MAX_DEPTH))
            return KVB_OK;
        out->len = mark;
        return KVB_ERR_NOMEM;
    }
    /* Its strings are written into the GBNF as they are: bytes that are
     * not UTF-8 would make kvbatch's own grammar one the engine refuses. */
    for (size_t i = 0, step = 0; i < len; i += step) {
        size_t ill;
        step = (unsigned char)schema_json[i] < 0x80
                   ? 1
                   : json_utf8_seq((const unsigned char *)schema_json + i, len - i, &ill);
        if (step == 0) {
            gs_fail(&g, path, "field '%s' is not valid UTF-8 (byte %zu)", path, i);
            return KVB_ERR_FORMAT;
        }
    }
    struct json_doc j;
    const char *why;
    size_t where;
    enum kvb_status st = json_parse(schema_json, len, &j, &why, &where);
    if (st == KVB_ERR_NOMEM) return st;
    if (st != KVB_OK) {
        gs_fail(&g, path, "field '%s' is not valid JSON: %s at byte %zu", path, why, where);
        return KVB_ERR_FORMAT;
    }
    g.j = &j;
    unsigned types = 0;
    const int32_t r = compile_tok(&g, 0, path, 0, &types);
    st = KVB_OK;
    if (r < 0) {
        st = g.oom ? KVB_ERR_NOMEM : KVB_ERR_FORMAT;
    } else if (types & ~(unsigned)GT_OBJ) {
        gs_fail(&g, path, "field '%s' must describe an object (\"type\": \"object\")", path);
        st = KVB_ERR_FORMAT;
    } else if (!gs_putf(&g, out, "root ::= [ \\t\\n]? g%d\n", r)) {
        st = KVB_ERR_NOMEM;
    }
    if (st != KVB_OK) {
        out->len = mark;
        if (out->data) out->data[mark] = '\0';
    }
    kvb_free(g.defs);
    json_free(&j);
    return st;
}
