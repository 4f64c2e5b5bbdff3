/* grammar_schema_obj.c — objects and arrays of a schema as grammar rules
 * (grammar_schema.h): the order properties may come in, which keys may be
 * added, and how many items of which schema an array holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar_schema.h"
#include "engine/grammar_schema_int.h"

#define MAX_PROPS 1024

struct prop {
    char *name; /* decoded */
    size_t len;
    int32_t pair; /* its rule: key, colon, value */
    bool required;
};

struct objc {
    struct prop *p;
    int n;
    int extras;    /* 0 none, 1 any key not listed */
    int32_t xpair; /* extras: the rule of one added key and its value */
    char xval[24]; /* extras: the value's rule */
};

static void objc_free(struct objc *o)
{
    for (int i = 0; i < o->n; i++) kvb_free(o->p[i].name);
    kvb_free(o->p);
}

static int new_rule(struct gs *g, int32_t id, struct kvb_buf *body, const char *path)
{
    char name[24];
    snprintf(name, sizeof name, "g%d", id);
    const int rc = gs_rule(g, name, body, path);
    body->len = 0;
    return rc;
}

/* The listed properties (from every part), their values compiled. */
static int collect_props(struct gs *g, const struct kws *kw, const char *path, int depth, struct objc *o,
                         struct kvb_buf *bp)
{
    const struct json_doc *j = g->j;
    char sub[GS_PATH];
    for (int q = 0; q < kw->n_props; q++) {
        const int props = kw->props[q];
        gs_sub_path(sub, path, "properties");
        if (json_kind(j, props) != JSON_OBJECT) return gs_fail(g, sub, "field '%s' must be an object", sub);
        int k = props + 1;
        for (int m = 0; m < j->tok[props].size; m++, k = json_skip(j, k + 1)) {
            if (o->n == MAX_PROPS) return gs_fail(g, sub, "field '%s' lists more than %d properties", sub, MAX_PROPS);
            struct prop *pr = kvb_realloc(o->p, (size_t)(o->n + 1) * sizeof *o->p);
            if (!pr) return gs_nomem(g);
            o->p = pr;
            struct prop *p = &o->p[o->n];
            memset(p, 0, sizeof *p);
            if (json_str_dup(j, k, &p->name, &p->len) != KVB_OK) return gs_nomem(g);
            o->n++;
            char ppath[GS_PATH];
            char key[64];
            snprintf(key, sizeof key, "%.60s", p->name);
            gs_sub_path(ppath, sub, key);
            for (int e = 0; e < o->n - 1; e++)
                if (o->p[e].len == p->len && memcmp(o->p[e].name, p->name, p->len) == 0)
                    return gs_fail(g, ppath, "field '%s' is listed twice", ppath);
            unsigned t;
            g->opened++;
            const int32_t val = gs_compile_tok(g, k + 1, ppath, depth + 1, &t);
            g->opened--;
            if (val == -2) return gs_fail(g, ppath, "field '%s' can hold no value", ppath);
            if (val < 0) return -1;
            /* the pair: the key as JSON writes it, the colon, a space at most, the value */
            struct kvb_buf key_json = {0};
            if (json_put_string(&key_json, p->name, p->len) != KVB_OK) return gs_nomem(g);
            const bool ok = gs_put_lit(g, bp, key_json.data, key_json.len) && gs_putf(g, bp, " \":\" \" \"? g%d", val);
            kvb_buf_free(&key_json);
            if (!ok) return -1;
            p->pair = gs_new_id(g);
            if (new_rule(g, p->pair, bp, ppath) < 0) return -1;
        }
    }
    return 0;
}

static int collect(struct gs *g, const struct kws *kw, const char *path, int depth, struct objc *o)
{
    const struct json_doc *j = g->j;
    char sub[GS_PATH];
    struct kvb_buf b = {0};
    const int rc = collect_props(g, kw, path, depth, o, &b);
    kvb_buf_free(&b);
    if (rc < 0) return -1;
    for (int q = 0; q < kw->n_reqs; q++) {
        const int req = kw->reqs[q];
        gs_sub_path(sub, path, "required");
        if (json_kind(j, req) != JSON_ARRAY) return gs_fail(g, sub, "field '%s' must be an array of names", sub);
        int r = req + 1;
        for (int m = 0; m < j->tok[req].size; m++, r = json_skip(j, r)) {
            int w = 0;
            if (json_kind(j, r) == JSON_STRING) {
                char *name;
                size_t len;
                if (json_str_dup(j, r, &name, &len) != KVB_OK) return gs_nomem(g);
                while (w < o->n && !(o->p[w].len == len && memcmp(o->p[w].name, name, len) == 0)) w++;
                kvb_free(name);
            }
            if (json_kind(j, r) != JSON_STRING || w == o->n)
                return gs_fail(g, sub, "field '%s' names a property the object does not list", sub);
            o->p[w].required = true;
        }
    }
    return 0;
}

/* ---- added keys: any name but the listed ones ---------------------------------------------
 * A trie of the listed names; at each node the key may go on with a child,
 * leave every name with another character (then anything: krest), or end
 * where no name ends. Escapes are allowed only once the key has left the
 * names (stricter than JSON, never weaker). */

struct tnode {
    uint32_t cp;
    int first, next; /* children */
    bool end;
};

static uint32_t cp_at(const char *s, size_t n, size_t *adv)
{
    size_t bad;
    const unsigned char *u = (const unsigned char *)s;
    const size_t m = json_utf8_seq(u, n, &bad);
    if (m == 0) {
        *adv = bad ? bad : 1;
        return 0xFFFD;
    }
    *adv = m;
    if (m == 1) return u[0];
    if (m == 2) return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (m == 3) return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

static bool put_cp(struct gs *g, struct kvb_buf *b, uint32_t cp)
{
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
        return gs_putf(g, b, "%c", (char)cp);
    if (cp <= 0xFF) return gs_putf(g, b, "\\x%02X", cp);
    if (cp <= 0xFFFF) return gs_putf(g, b, "\\u%04X", cp);
    return gs_putf(g, b, "\\U%08X", cp);
}

static int key_rules(struct gs *g, const struct objc *o, const char *path, int32_t *root_rule)
{
    struct tnode *t = kvb_calloc(1, sizeof *t);
    int nt = 1, rc = -1;
    if (!t) return gs_nomem(g);
    t[0] = (struct tnode){0, -1, -1, false};
    for (int i = 0; i < o->n; i++) {
        int cur = 0;
        for (size_t k = 0; k < o->p[i].len;) {
            size_t adv;
            const uint32_t cp = cp_at(o->p[i].name + k, o->p[i].len - k, &adv);
            k += adv;
            int c = t[cur].first;
            while (c >= 0 && t[c].cp != cp) c = t[c].next;
            if (c < 0) {
                struct tnode *nt2 = kvb_realloc(t, (size_t)(nt + 1) * sizeof *t);
                if (!nt2) goto oom;
                t = nt2;
                t[nt] = (struct tnode){cp, -1, t[cur].first, false};
                t[cur].first = nt;
                c = nt++;
            }
            cur = c;
        }
        t[cur].end = true;
    }
    if (!gs_need_keyrest(g)) goto done;
    const int32_t base = g->next_id;
    g->next_id += nt;
    struct kvb_buf b = {0};
    bool ok = true;
    for (int n = 0; ok && n < nt; n++) {
        int alts = 0;
        for (int c = t[n].first; ok && c >= 0; c = t[c].next, alts++)
            ok = (alts == 0 || gs_put(g, &b, " | ")) && gs_put(g, &b, "\"") && put_cp(g, &b, t[c].cp) &&
                 gs_putf(g, &b, "\" g%d", base + c);
        ok = ok && (alts == 0 || gs_put(g, &b, " | ")) && gs_put(g, &b, "[^\"\\\\\\x00-\\x1F");
        for (int c = t[n].first; ok && c >= 0; c = t[c].next) ok = put_cp(g, &b, t[c].cp);
        ok = ok && gs_put(g, &b, "] krest");
        if (ok && !t[n].end) ok = gs_put(g, &b, " | \"\\\"\"");
        if (ok && new_rule(g, base + n, &b, path) < 0) {
            kvb_buf_free(&b);
            goto done;
        }
    }
    kvb_buf_free(&b);
    if (!ok) goto done;
    *root_rule = base;
    rc = 0;
    goto done;
oom:
    g->oom = true;
done:
    kvb_free(t);
    return rc;
}

/* ---- the orders properties come in ---------------------------------------------------------- */

/* Up to GSCHEMA_ANY_ORDER properties: one rule per set S of those given,
 * after the first; the object's opening as body. */
static int any_order(struct gs *g, const struct objc *o, const char *path, struct kvb_buf *out)
{
    const int n = o->n;
    const uint32_t full = (1u << n) - 1;
    uint32_t req = 0;
    for (int i = 0; i < n; i++)
        if (o->p[i].required) req |= 1u << i;
    const int32_t base = g->next_id;
    g->next_id += (int32_t)full + 1;
    struct kvb_buf b = {0};
    bool ok = true;
    for (uint32_t s = 0; ok && s <= full; s++) {
        if (s == 0 && !o->extras) continue; /* reached only after an added key */
        ok = gs_put(g, &b, "ws (");
        int alts = 0;
        if ((req & ~s) == 0) ok = ok && gs_put(g, &b, "\"}\""), alts++;
        if (s != full || o->extras) {
            ok = ok && (alts == 0 || gs_put(g, &b, " | ")) && gs_put(g, &b, "\",\" ws (");
            int inner = 0;
            for (int i = 0; ok && i < n; i++) {
                if (s >> i & 1) continue;
                ok = (inner++ == 0 || gs_put(g, &b, " | ")) &&
                     gs_putf(g, &b, "g%d g%d", o->p[i].pair, base + (s | 1u << i));
            }
            if (o->extras)
                ok = ok && (inner++ == 0 || gs_put(g, &b, " | ")) && gs_putf(g, &b, "g%d g%d", o->xpair, base + s);
            ok = ok && gs_put(g, &b, ")");
        }
        ok = ok && gs_put(g, &b, ")");
        if (ok && new_rule(g, base + (int32_t)s, &b, path) < 0) {
            kvb_buf_free(&b);
            return -1;
        }
    }
    kvb_buf_free(&b);
    ok = ok && gs_put(g, out, "\"{\" ws (");
    int alts = 0;
    if (req == 0) ok = ok && gs_put(g, out, "\"}\""), alts++;
    for (int i = 0; ok && i < n; i++)
        ok = (alts++ == 0 || gs_put(g, out, " | ")) && gs_putf(g, out, "g%d g%d", o->p[i].pair, base + (1u << i));
    if (o->extras) ok = ok && (alts++ == 0 || gs_put(g, out, " | ")) && gs_putf(g, out, "g%d g%d", o->xpair, base);
    return ok && gs_put(g, out, ")") ? 0 : -1;
}

/* More properties: the schema's order, optional ones left out at will,
 * added keys after the listed ones. A_i: after something, next candidate
 * i; F_i: the first given is i or later. */
static int in_order(struct gs *g, const struct objc *o, const char *path, struct kvb_buf *out)
{
    const int n = o->n;
    const int32_t a = g->next_id, f = a + n + 1;
    g->next_id += 2 * (n + 1);
    struct kvb_buf b = {0};
    bool ok = true, f_live[MAX_PROPS + 1];
    for (int i = n; ok && i >= 0; i--) {
        if (i == n) {
            ok = o->extras ? gs_putf(g, &b, "ws (\"}\" | \",\" ws g%d g%d)", o->xpair, a + n)
                           : gs_put(g, &b, "ws \"}\"");
        } else {
            ok = gs_putf(g, &b, "ws \",\" ws g%d g%d", o->p[i].pair, a + i + 1);
            if (ok && !o->p[i].required) ok = gs_putf(g, &b, " | g%d", a + i + 1);
        }
        if (ok && new_rule(g, a + i, &b, path) < 0) goto fail;
        f_live[i] = i < n || o->extras;
        if (!f_live[i]) continue;
        if (i == n) ok = gs_putf(g, &b, "g%d g%d", o->xpair, a + n);
        else ok = gs_putf(g, &b, "g%d g%d", o->p[i].pair, a + i + 1);
        if (ok && i < n && !o->p[i].required && f_live[i + 1]) ok = gs_putf(g, &b, " | g%d", f + i + 1);
        if (ok && new_rule(g, f + i, &b, path) < 0) goto fail;
    }
    kvb_buf_free(&b);
    bool any_req = false;
    for (int i = 0; i < n; i++) any_req |= o->p[i].required;
    ok = ok && gs_put(g, out, "\"{\" ws (");
    if (!any_req) ok = ok && gs_put(g, out, "\"}\" | ");
    return ok && gs_putf(g, out, "g%d)", f) ? 0 : -1;
fail:
    kvb_buf_free(&b);
    return -1;
}

int gs_object_expr(struct gs *g, const struct kws *kw, const char *path, int depth, struct kvb_buf *out)
{
    const struct json_doc *j = g->j;
    struct objc o = {0};
    int rc = -1;
    char sub[GS_PATH];
    if (!gs_need_ws(g) || collect(g, kw, path, depth, &o) < 0) goto done;
    const int addl = kw->at[K_ADDL];
    /* added keys: additionalProperties true or a schema; absent: none where
     * properties are listed (JSON mode's rule), any where none are */
    bool free_values = false;
    if (addl < 0) {
        o.extras = kw->n_props == 0; /* "properties": {} lists none: only {} */
        free_values = true;
    } else if (json_kind(j, addl) == JSON_FALSE) {
        o.extras = 0;
    } else if (json_kind(j, addl) == JSON_TRUE || (json_kind(j, addl) == JSON_OBJECT && j->tok[addl].size == 0)) {
        o.extras = 1;
        free_values = true;
    } else {
        o.extras = 1;
        unsigned t;
        gs_sub_path(sub, path, "additionalProperties");
        g->opened++;
        const int32_t r = gs_compile_tok(g, addl, sub, depth + 1, &t);
        g->opened--;
        if (r == -2) {
            o.extras = 0; /* no value fits: no key may be added */
        } else if (r < 0) {
            goto done;
        }
        snprintf(o.xval, sizeof o.xval, "g%d", r);
    }
    if (o.extras && free_values && !gs_need_any(g, GSCHEMA_MAX_DEPTH - depth - 1, o.xval)) goto done;
    if (o.n == 0) {
        if (!o.extras) {
            rc = gs_put(g, out, "\"{\" ws \"}\"") ? 0 : -1;
            goto done;
        }
        if (!gs_need_str(g)) goto done;
        rc = gs_putf(g, out, "\"{\" ws (\"}\" | str \":\" \" \"? %s (ws \",\" ws str \":\" \" \"? %s)* ws \"}\")",
                     o.xval, o.xval)
                 ? 0
                 : -1;
        goto done;
    }
    if (o.extras) {
        int32_t key = 0;
        if (key_rules(g, &o, path, &key) < 0) goto done;
        struct kvb_buf b = {0};
        o.xpair = gs_new_id(g);
        const bool ok = gs_putf(g, &b, "\"\\\"\" g%d \":\" \" \"? %s", key, o.xval);
        if (!ok || new_rule(g, o.xpair, &b, path) < 0) {
            kvb_buf_free(&b);
            goto done;
        }
        kvb_buf_free(&b);
    }
    rc = o.n <= GSCHEMA_ANY_ORDER ? any_order(g, &o, path, out) : in_order(g, &o, path, out);
done:
    objc_free(&o);
    return rc;
}

/* "(ws \",\" ws item)" repeated lo..hi times (hi UINT32_MAX: no bound), nothing when hi is 0. */
static bool put_rep(struct gs *g, struct kvb_buf *b, const char *item, uint32_t lo, uint32_t hi)
{
    if (hi == 0) return true;
    if (!gs_putf(g, b, "(ws \",\" ws %s)", item)) return false;
    if (hi == UINT32_MAX)
        return lo == 0 ? gs_put(g, b, "* ") : lo == 1 ? gs_put(g, b, "+ ") : gs_putf(g, b, "{%u,} ", lo);
    if (lo == 0 && hi == 1) return gs_put(g, b, "? ");
    if (lo == hi) return gs_putf(g, b, "{%u} ", lo);
    return gs_putf(g, b, "{%u,%u} ", lo, hi);
}

/* ---- arrays --------------------------------------------------------------------------------- */

int gs_array_expr(struct gs *g, const struct kws *kw, const char *path, int depth, struct kvb_buf *out)
{
    const struct json_doc *j = g->j;
    char sub[GS_PATH];
    uint32_t mn = 0, mx = UINT32_MAX;
    if (gs_get_count(g, kw, K_MINI, path, &mn) < 0 || gs_get_count(g, kw, K_MAXI, path, &mx) < 0) return -1;
    if (!gs_need_ws(g)) return -1;
    /* the prefix's rules */
    int32_t pre[256];
    int k = 0;
    /* draft 4-7 tuples: items as an array is the prefix, additionalItems the rest */
    const bool tuple = kw->at[K_ITEMS] >= 0 && json_kind(j, kw->at[K_ITEMS]) == JSON_ARRAY;
    if (tuple && kw->at[K_PREFIX] >= 0) {
        gs_sub_path(sub, path, "items");
        return gs_fail(g, sub, "field '%s': items as an array beside prefixItems", sub);
    }
    if (!tuple && kw->at[K_ADDITEMS] >= 0) {
        gs_sub_path(sub, path, "additionalItems");
        return gs_fail(g, sub, "field '%s' is only supported beside items given as an array", sub);
    }
    const int pat = tuple ? kw->at[K_ITEMS] : kw->at[K_PREFIX];
    if (pat >= 0) {
        gs_sub_path(sub, path, tuple ? "items" : "prefixItems");
        if (json_kind(j, pat) != JSON_ARRAY) return gs_fail(g, sub, "field '%s' must be an array of schemas", sub);
        if (j->tok[pat].size > 256) return gs_fail(g, sub, "field '%s' holds more than 256 schemas", sub);
        int t = pat + 1;
        for (int m = 0; m < j->tok[pat].size; m++, t = json_skip(j, t)) {
            char ipath[GS_PATH];
            snprintf(ipath, sizeof ipath, "%.200s[%d]", sub, m);
            unsigned ty;
            g->opened++;
            pre[k] = gs_compile_tok(g, t, ipath, depth + 1, &ty);
            g->opened--;
            if (pre[k] == -2) { /* nothing fits here: the array ends before it */
                if (mx > (uint32_t)k) mx = (uint32_t)k;
                break;
            }
            if (pre[k] < 0) return -1;
            k++;
        }
    }
    /* the items after the prefix */
    char item[24] = "";
    const int it = tuple ? kw->at[K_ADDITEMS] : kw->at[K_ITEMS];
    gs_sub_path(sub, path, tuple ? "additionalItems" : "items");
    if (it < 0 || json_kind(j, it) == JSON_TRUE) {
        if (!gs_need_any(g, GSCHEMA_MAX_DEPTH - depth - 1, item)) return -1;
    } else if (json_kind(j, it) != JSON_FALSE) {
        unsigned ty;
        g->opened++;
        const int32_t r = gs_compile_tok(g, it, sub, depth + 1, &ty);
        g->opened--;
        if (r == -1) return -1;
        if (r >= 0) snprintf(item, sizeof item, "g%d", r);
    }
    if (!item[0] && mx > (uint32_t)k) mx = (uint32_t)k;
    if ((uint32_t)k > mx) k = (int)mx;
    if (mn > mx) {
        gs_sub_path(sub, path, "minItems");
        return gs_fail(g, sub, "field '%s' asks for more items than the schema allows", sub);
    }
    if ((mx != UINT32_MAX && mx - (uint32_t)k > GSCHEMA_MAX_COUNT) || mn > GSCHEMA_MAX_COUNT + (uint32_t)k) {
        gs_sub_path(sub, path, mx != UINT32_MAX && mx - (uint32_t)k > GSCHEMA_MAX_COUNT ? "maxItems" : "minItems");
        return gs_fail(g, sub, "field '%s': counts above %d are not supported", sub, GSCHEMA_MAX_COUNT);
    }
    /* states after i items (1..k), the last one the tail of free items */
    struct kvb_buf b = {0};
    const int32_t base = g->next_id;
    g->next_id += k + 1;
    bool ok = true;
    const uint32_t lo2 = mn > (uint32_t)k ? mn - (uint32_t)k : 0;
    for (int i = 1; ok && i <= k; i++) {
        if (i < k) {
            int alts = 0;
            if ((uint32_t)i >= mn) ok = gs_put(g, &b, "ws \"]\""), alts++;
            if ((uint32_t)i < mx)
                ok = ok && (alts == 0 || gs_put(g, &b, " | ")) &&
                     gs_putf(g, &b, "ws \",\" ws g%d g%d", pre[i], base + i + 1);
        } else if (item[0] && mx > (uint32_t)k) {
            ok = put_rep(g, &b, item, lo2, mx == UINT32_MAX ? UINT32_MAX : mx - (uint32_t)k) &&
                 gs_put(g, &b, "ws \"]\"");
        } else {
            ok = gs_put(g, &b, "ws \"]\"");
        }
        if (ok && new_rule(g, base + i, &b, path) < 0) {
            kvb_buf_free(&b);
            return -1;
        }
    }
    kvb_buf_free(&b);
    ok = ok && gs_put(g, out, "\"[\" ws (");
    int alts = 0;
    if (mn == 0) ok = ok && gs_put(g, out, "\"]\""), alts++;
    if (ok && mx >= 1) {
        if (k > 0) {
            ok = (alts == 0 || gs_put(g, out, " | ")) && gs_putf(g, out, "g%d g%d", pre[0], base + 1);
        } else { /* no prefix: the first free item, then the rest */
            const uint32_t lo = mn > 1 ? mn - 1 : 0;
            ok = (alts == 0 || gs_put(g, out, " | ")) && gs_putf(g, out, "%s ", item) &&
                 put_rep(g, out, item, lo, mx == UINT32_MAX ? UINT32_MAX : mx - 1) && gs_put(g, out, "ws \"]\"");
        }
    }
    return ok && gs_put(g, out, ")") ? 0 : -1;
}
