/* grammar_parse.c — llama.cpp's GBNF text into a struct grammar: rules of
 * byte-set elements (grammar_internal.h).
 *
 * Read as llama.cpp's parser reads it (llama-grammar.cpp: the same spaces,
 * comments, escapes and repetition rewrites), then lowered to bytes: a
 * literal becomes one element per UTF-8 byte, a character class a byte set
 * when it is all ASCII and otherwise a generated rule whose alternatives are
 * the UTF-8 byte-range sequences of its code points (the split regex
 * engines use). Repetitions become generated rules as llama.cpp writes them:
 * S{m,n} → S (m times) S'(n-m), S'(x) ::= S S'(x-1) | ; S{m,} → S (m times)
 * S', S' ::= S S' | . Then the checks: every rule defined once, a root, and
 * no left recursion that would grow a stack (grammar.h).
 *
 * Not here: llama.cpp's token terminals (<[id]>, <text>, !<...>), refused by name. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar_internal.h"

struct gp_vec { /* a growable element list */
    struct grammar_elem *e;
    uint32_t n, cap;
};

struct gp_rule {
    struct gp_vec body;
    char *name;      /* the GBNF name; NULL for a generated rule (messages name its origin) */
    uint32_t origin; /* the user rule a generated one came from (itself if none) */
    bool defined;
};

struct gp {
    const char *src, *end;
    struct gp_rule *rules;
    uint32_t n_rules, cap_rules;
    uint64_t (*sets)[4];
    uint32_t n_sets, cap_sets;
    uint32_t *set_hash; /* open addressing over the sets' ids, UINT32_MAX empty */
    uint32_t set_hash_cap;
    int32_t single[256]; /* the singleton set of each byte, -1 none yet */
    uint32_t nest;       /* groups open around the parse position (GRAMMAR_MAX_NEST) */
    uint32_t any_rule;   /* the rule for '.', UINT32_MAX before the first */
    uint32_t *names;     /* open addressing over the named rules' ids, UINT32_MAX empty */
    uint32_t names_cap, n_names;
    size_t total; /* elements in all rules (GRAMMAR_MAX_ELEMS) */
    enum kvb_status st;
    char *msg;
    size_t msg_cap;
};

static bool gp_failf(struct gp *p, enum kvb_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool gp_failf(struct gp *p, enum kvb_status st, const char *fmt, ...)
{
    if (p->st != KVB_OK) return false;
    p->st = st;
    if (p->msg && p->msg_cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->msg, p->msg_cap, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool gp_nomem(struct gp *p) { return gp_failf(p, KVB_ERR_NOMEM, "out of memory compiling the grammar"); }

/* "line L column C" of a position, for messages. */
static bool gp_fail_at(struct gp *p, const char *pos, const char *what)
{
    int line = 1, col = 1;
    for (const char *c = p->src; c < pos && c < p->end; c++) {
        if (*c == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return gp_failf(p, KVB_ERR_FORMAT, "grammar line %d column %d: %s", line, col, what);
}

static bool grow(void **ptr, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 8;
    while (nc < need) nc *= 2;
    void *np = kvb_realloc(*ptr, (size_t)nc * elem);
    if (!np) return false;
    *ptr = np;
    *cap = nc;
    return true;
}

static bool vec_push(struct gp *p, struct gp_vec *v, enum grammar_elem_type type, uint32_t val)
{
    if (++p->total > GRAMMAR_MAX_ELEMS)
        return gp_failf(p, KVB_ERR_FORMAT, "grammar: more than %d elements once repetitions are expanded",
                        GRAMMAR_MAX_ELEMS);
    if (!grow((void **)&v->e, &v->cap, v->n + 1, sizeof *v->e)) return gp_nomem(p);
    v->e[v->n++] = (struct grammar_elem){.type = type, .val = val};
    return true;
}

/* ---- byte sets ---------------------------------------------------------- */

static uint32_t set_hash(const uint64_t set[4])
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4; i++) h = (h ^ set[i]) * 0xff51afd7ed558ccdull;
    return (uint32_t)(h >> 32);
}

/* A grammar of many classes has many sets: looked up by hash, so reading
 * it stays linear in its size. */
static bool set_hash_grow(struct gp *p)
{
    const uint32_t nc = p->set_hash_cap ? p->set_hash_cap * 2 : 256;
    uint32_t *t = kvb_malloc(sizeof *t * nc);
    if (!t) return gp_nomem(p);
    memset(t, 0xff, sizeof *t * nc);
    for (uint32_t i = 0; i < p->n_sets; i++) {
        uint32_t h = set_hash(p->sets[i]) & (nc - 1);
        while (t[h] != UINT32_MAX) h = (h + 1) & (nc - 1);
        t[h] = i;
    }
    kvb_free(p->set_hash);
    p->set_hash = t;
    p->set_hash_cap = nc;
    return true;
}

static int32_t set_add(struct gp *p, const uint64_t set[4])
{
    if (2 * (p->n_sets + 1) > p->set_hash_cap && !set_hash_grow(p)) return -1;
    const uint32_t mask = p->set_hash_cap - 1;
    uint32_t h = set_hash(set) & mask;
    for (; p->set_hash[h] != UINT32_MAX; h = (h + 1) & mask)
        if (!memcmp(p->sets[p->set_hash[h]], set, sizeof p->sets[0])) return (int32_t)p->set_hash[h];
    if (!grow((void **)&p->sets, &p->cap_sets, p->n_sets + 1, sizeof *p->sets)) return gp_nomem(p), -1;
    memcpy(p->sets[p->n_sets], set, sizeof p->sets[0]);
    p->set_hash[h] = p->n_sets;
    return (int32_t)p->n_sets++;
}

static int32_t set_range(struct gp *p, unsigned lo, unsigned hi)
{
    if (lo == hi && p->single[lo] >= 0) return p->single[lo];
    uint64_t set[4] = {0};
    for (unsigned b = lo; b <= hi; b++) set[b >> 6] |= 1ull << (b & 63);
    int32_t id = set_add(p, set);
    if (lo == hi && id >= 0) p->single[lo] = id;
    return id;
}

/* ---- rules -------------------------------------------------------------- */

static uint32_t rule_new(struct gp *p, const char *name, size_t len, uint32_t origin)
{
    if (!grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules)) return gp_nomem(p), UINT32_MAX;
    struct gp_rule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = kvb_strndup(name, len);
        if (!r->name) return gp_nomem(p), UINT32_MAX;
    }
    r->origin = origin == UINT32_MAX ? p->n_rules : origin;
    return p->n_rules++;
}

static uint32_t name_hash(const char *name, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)name[i]) * 16777619u;
    return h;
}

static bool names_grow(struct gp *p)
{
    const uint32_t nc = p->names_cap ? p->names_cap * 2 : 256;
    uint32_t *t = kvb_malloc(sizeof *t * nc);
    if (!t) return gp_nomem(p);
    memset(t, 0xff, sizeof *t * nc);
    for (uint32_t i = 0; i < p->names_cap; i++) {
        const uint32_t id = p->names[i];
        if (id == UINT32_MAX) continue;
        uint32_t h = name_hash(p->rules[id].name, strlen(p->rules[id].name)) & (nc - 1);
        while (t[h] != UINT32_MAX) h = (h + 1) & (nc - 1);
        t[h] = id;
    }
    kvb_free(p->names);
    p->names = t;
    p->names_cap = nc;
    return true;
}

/* The named rule's id, made (undefined yet) on first mention. */
static uint32_t rule_find(struct gp *p, const char *name, size_t len)
{
    if (2 * (p->n_names + 1) > p->names_cap && !names_grow(p)) return UINT32_MAX;
    const uint32_t mask = p->names_cap - 1;
    uint32_t h = name_hash(name, len) & mask;
    for (; p->names[h] != UINT32_MAX; h = (h + 1) & mask) {
        const char *n = p->rules[p->names[h]].name;
        if (strncmp(n, name, len) == 0 && n[len] == 0) return p->names[h];
    }
    const uint32_t id = rule_new(p, name, len, UINT32_MAX);
    if (id != UINT32_MAX) {
        p->names[h] = id;
        p->n_names++;
    }
    return id;
}

/* The named rule's id, or UINT32_MAX when there is none. */
static uint32_t rule_lookup(const struct gp *p, const char *name)
{
    if (!p->names_cap) return UINT32_MAX;
    const size_t len = strlen(name);
    const uint32_t mask = p->names_cap - 1;
    for (uint32_t h = name_hash(name, len) & mask; p->names[h] != UINT32_MAX; h = (h + 1) & mask)
        if (strcmp(p->rules[p->names[h]].name, name) == 0) return p->names[h];
    return UINT32_MAX;
}

/* A rule for a group, class or repetition inside rule `origin`'s body. It
 * has no name of its own (a grammar of a million of them would spend more
 * on names than on rules); messages name the user's rule it came from. */
static uint32_t rule_gen(struct gp *p, uint32_t origin) { return rule_new(p, NULL, 0, p->rules[origin].origin); }

/* The name messages give rule r: its own, or its origin's. */
static const char *rule_name(const struct gp *p, uint32_t r) { return p->rules[p->rules[r].origin].name; }

static bool rule_set(struct gp *p, uint32_t id, struct gp_vec *body)
{
    if (id == UINT32_MAX) return false;
    p->rules[id].body = *body;
    p->rules[id].defined = true;
    memset(body, 0, sizeof *body);
    return true;
}

/* ---- code points to UTF-8 byte sequences -------------------------------- */

static int utf8_put(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return out[0] = (uint8_t)(0xc0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 63));
        out[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 63));
    out[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

/* Appends to alt one alternative per byte-range sequence of [lo, hi], all
 * of one encoded length (Go's regexp/syntax and Rust's utf8-ranges split). */
static bool utf8_seqs(struct gp *p, struct gp_vec *alt, uint32_t lo, uint32_t hi, bool *first)
{
    uint8_t a[4], b[4];
    const int n = utf8_put(lo, a);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_seqs(p, alt, lo, lo | m, first) && utf8_seqs(p, alt, (lo | m) + 1, hi, first);
            if ((hi & m) != m)
                return utf8_seqs(p, alt, lo, (hi & ~m) - 1, first) && utf8_seqs(p, alt, hi & ~m, hi, first);
        }
    }
    utf8_put(hi, b);
    if (!*first && !vec_push(p, alt, GE_ALT, 0)) return false;
    *first = false;
    for (int i = 0; i < n; i++) {
        int32_t s = set_range(p, a[i], b[i]);
        if (s < 0 || !vec_push(p, alt, GE_BYTES, (uint32_t)s)) return false;
    }
    return true;
}

struct cp_range {
    uint32_t lo, hi;
};

static int cmp_range(const void *x, const void *y)
{
    const struct cp_range *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Sorts and merges r[0..n), complements it if asked and takes the
 * surrogates out (never valid UTF-8), into dst; returns dst's count. r and
 * dst hold n + 3 each. */
static uint32_t ranges_normalise(struct cp_range *r, uint32_t n, bool negate, struct cp_range *dst)
{
    qsort(r, n, sizeof *r, cmp_range);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi) r[k - 1].hi = r[i].hi;
        } else {
            r[k++] = r[i];
        }
    }
    if (negate) {
        uint32_t m = 0, next = 0;
        for (uint32_t i = 0; i < k; i++) {
            if (r[i].lo > next) dst[m++] = (struct cp_range){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10ffff) dst[m++] = (struct cp_range){next, 0x10ffff};
        memcpy(r, dst, sizeof *r * m);
        k = m;
    }
    uint32_t out = 0;
    for (uint32_t i = 0; i < k; i++) {
        struct cp_range x = r[i];
        if (x.hi > 0x10ffff) x.hi = 0x10ffff;
        if (x.lo > x.hi) continue;
        if (x.lo <= 0xdfff && x.hi >= 0xd800) {
            if (x.lo < 0xd800) dst[out++] = (struct cp_range){x.lo, 0xd7ff};
            if (x.hi > 0xdfff) dst[out++] = (struct cp_range){0xe000, x.hi};
        } else {
            dst[out++] = x;
        }
    }
    return out;
}

/* Emits into seq what matches one code point of the ranges: a byte set when
 * all are ASCII, else a reference to a generated rule. */
static bool emit_class(struct gp *p, uint32_t rule, struct gp_vec *seq, const struct cp_range *r, uint32_t n)
{
    uint64_t ascii[4] = {0};
    bool any_ascii = false, any_multi = false;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t c = r[i].lo; c <= r[i].hi && c < 0x80; c++) ascii[c >> 6] |= 1ull << (c & 63), any_ascii = true;
        any_multi |= r[i].hi >= 0x80;
    }
    if (!any_ascii && !any_multi)
        return gp_failf(p, KVB_ERR_FORMAT, "grammar: rule '%s' has a character class that matches nothing",
                        rule_name(p, rule));
    int32_t s = any_ascii ? set_add(p, ascii) : 0;
    if (s < 0) return false;
    if (!any_multi) return vec_push(p, seq, GE_BYTES, (uint32_t)s);
    struct gp_vec alt = {0};
    bool first = true, ok = true;
    if (any_ascii) {
        ok = vec_push(p, &alt, GE_BYTES, (uint32_t)s);
        first = false;
    }
    static const uint32_t bounds[][2] = {{0x80, 0x7ff}, {0x800, 0xffff}, {0x10000, 0x10ffff}};
    for (uint32_t i = 0; i < n && ok; i++)
        for (int b = 0; b < 3 && ok; b++) {
            uint32_t lo = r[i].lo > bounds[b][0] ? r[i].lo : bounds[b][0];
            uint32_t hi = r[i].hi < bounds[b][1] ? r[i].hi : bounds[b][1];
            if (lo <= hi) ok = utf8_seqs(p, &alt, lo, hi, &first);
        }
    ok = ok && vec_push(p, &alt, GE_END, 0);
    uint32_t id = ok ? rule_gen(p, rule) : UINT32_MAX;
    ok = ok && rule_set(p, id, &alt) && vec_push(p, seq, GE_REF, id);
    kvb_free(alt.e);
    return ok;
}

/* ---- the text ----------------------------------------------------------- */

static char at(const struct gp *p, const char *pos) { return pos < p->end ? *pos : 0; }

static bool is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static const char *skip_space(const struct gp *p, const char *pos, bool newline_ok)
{
    for (;;) {
        const char c = at(p, pos);
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            pos++;
        } else if (c == '#') {
            while (pos < p->end && *pos != '\r' && *pos != '\n') pos++;
        } else {
            return pos;
        }
    }
}

static const char *parse_hex(struct gp *p, const char *pos, int size, uint32_t *cp)
{
    uint32_t v = 0;
    for (int i = 0; i < size; i++) {
        const char c = at(p, pos + i);
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            char what[64];
            snprintf(what, sizeof what, "expecting %d hex digits", size);
            return gp_fail_at(p, pos, what), NULL;
        }
        v = v << 4 | (uint32_t)d;
    }
    if (v > 0x10ffff) return gp_fail_at(p, pos, "code point over U+10FFFF"), NULL;
    *cp = v;
    return pos + size;
}

/* One character of a literal or class: an escape or a UTF-8 sequence. */
static const char *parse_char(struct gp *p, const char *pos, uint32_t *cp)
{
    const unsigned char c = (unsigned char)at(p, pos);
    if (pos >= p->end) return gp_fail_at(p, pos, "unexpected end of the grammar"), NULL;
    if (c == '\\') {
        switch (at(p, pos + 1)) {
        case 'x': return parse_hex(p, pos + 2, 2, cp);
        case 'u': return parse_hex(p, pos + 2, 4, cp);
        case 'U': return parse_hex(p, pos + 2, 8, cp);
        case 't': *cp = '\t'; return pos + 2;
        case 'r': *cp = '\r'; return pos + 2;
        case 'n': *cp = '\n'; return pos + 2;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-': *cp = (unsigned char)pos[1]; return pos + 2;
        default: return gp_fail_at(p, pos, "unknown escape"), NULL;
        }
    }
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (c == 0) return gp_fail_at(p, pos, "NUL byte in the grammar"), NULL;
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
    for (int i = 1; i < n; i++) {
        const unsigned char d = (unsigned char)at(p, pos + i);
        if ((d & 0xc0) != 0x80) n = 0;
        v = v << 6 | (d & 63u);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (n == 0 || v < min_cp[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return gp_fail_at(p, pos, "the grammar text is not UTF-8"), NULL;
    *cp = v;
    return pos + n;
}

static const char *parse_literal(struct gp *p, const char *pos, struct gp_vec *seq)
{
    while (at(p, pos) != '"') {
        uint32_t cp;
        if (!(pos = parse_char(p, pos, &cp))) return NULL;
        uint8_t b[4];
        const int n = utf8_put(cp, b);
        for (int i = 0; i < n; i++) {
            int32_t s = set_range(p, b[i], b[i]);
            if (s < 0 || !vec_push(p, seq, GE_BYTES, (uint32_t)s)) return NULL;
        }
    }
    return pos + 1;
}

static const char *parse_class(struct gp *p, const char *pos, uint32_t rule, struct gp_vec *seq)
{
    bool negate = false;
    if (at(p, pos) == '^') negate = true, pos++;
    struct cp_range *r = NULL;
    uint32_t n = 0, cap = 0;
    while (pos && at(p, pos) != ']') {
        uint32_t lo, hi;
        if (!(pos = parse_char(p, pos, &lo))) break;
        hi = lo;
        if (at(p, pos) == '-' && at(p, pos + 1) != ']' && pos + 1 < p->end) {
            const char *at_hi = pos + 1;
            if (!(pos = parse_char(p, at_hi, &hi))) break;
            if (hi < lo) pos = (gp_fail_at(p, at_hi, "character range's end before its start"), NULL);
        }
        if (pos && !grow((void **)&r, &cap, n + 4, sizeof *r)) pos = (gp_nomem(p), NULL);
        if (pos) r[n++] = (struct cp_range){lo, hi};
    }
    struct cp_range *dst = pos ? kvb_malloc(sizeof *dst * (n + 3)) : NULL;
    if (pos && !dst) pos = (gp_nomem(p), NULL);
    if (pos && !grow((void **)&r, &cap, n + 3, sizeof *r)) pos = (gp_nomem(p), NULL);
    if (pos) {
        uint32_t k = ranges_normalise(r, n, negate, dst);
        if (!emit_class(p, rule, seq, dst, k)) pos = NULL;
    }
    kvb_free(r);
    kvb_free(dst);
    return pos ? pos + 1 : NULL;
}

/* S{min,max} over seq[start ..), max UINT32_MAX for no bound, as llama.cpp rewrites it. */
static bool repeat(struct gp *p, uint32_t rule, struct gp_vec *seq, uint32_t start, uint32_t min, uint32_t max)
{
    const uint32_t len = seq->n - start;
    struct grammar_elem *prev = kvb_malloc(sizeof *prev * (len ? len : 1));
    if (!prev) return gp_nomem(p);
    if (len) memcpy(prev, seq->e + start, sizeof *prev * len); /* an empty item ("" ?) has no elements at all */
    bool ok = true;
    if (min == 0) {
        seq->n = start;
        p->total -= len;
    }
    for (uint32_t i = 1; i < min && ok; i++)
        for (uint32_t j = 0; j < len && ok; j++) ok = vec_push(p, seq, prev[j].type, prev[j].val);
    const bool no_max = max == UINT32_MAX;
    const uint32_t n_opt = no_max ? 1 : max - min;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n_opt && ok; i++) {
        const uint32_t id = rule_gen(p, rule);
        struct gp_vec body = {0};
        ok = id != UINT32_MAX;
        for (uint32_t j = 0; j < len && ok; j++) ok = vec_push(p, &body, prev[j].type, prev[j].val);
        if (ok && (i > 0 || no_max)) ok = vec_push(p, &body, GE_REF, no_max ? id : last);
        ok = ok && vec_push(p, &body, GE_ALT, 0) && vec_push(p, &body, GE_END, 0) && rule_set(p, id, &body);
        kvb_free(body.e);
        last = id;
    }
    if (ok && n_opt > 0) ok = vec_push(p, seq, GE_REF, last);
    kvb_free(prev);
    return ok;
}

static const char *parse_uint(struct gp *p, const char *pos, uint32_t *v)
{
    uint64_t x = 0;
    if (!(at(p, pos) >= '0' && at(p, pos) <= '9')) return gp_fail_at(p, pos, "expecting a number"), NULL;
    for (; at(p, pos) >= '0' && at(p, pos) <= '9'; pos++) {
        x = x * 10 + (uint64_t)(*pos - '0');
        if (x > GRAMMAR_MAX_REPEAT) {
            char what[96];
            snprintf(what, sizeof what, "repetition count over %d", GRAMMAR_MAX_REPEAT);
            return gp_fail_at(p, pos, what), NULL;
        }
    }
    *v = (uint32_t)x;
    return pos;
}

/* {m} {m,} {m,n}: pos just past '{'. */
static const char *parse_braces(struct gp *p, const char *pos, bool nested, uint32_t *min, uint32_t *max)
{
    pos = skip_space(p, pos, nested);
    if (!(pos = parse_uint(p, pos, min))) return NULL;
    pos = skip_space(p, pos, nested);
    *max = *min;
    if (at(p, pos) == ',') {
        pos = skip_space(p, pos + 1, nested);
        *max = UINT32_MAX;
        if (at(p, pos) >= '0' && at(p, pos) <= '9') {
            if (!(pos = parse_uint(p, pos, max))) return NULL;
            pos = skip_space(p, pos, nested);
            if (*max < *min) return gp_fail_at(p, pos, "repetition {m,n} with n below m"), NULL;
        }
    }
    if (at(p, pos) != '}') return gp_fail_at(p, pos, "expecting '}'"), NULL;
    return pos + 1;
}

static const char *parse_alternates(struct gp *p, const char *pos, uint32_t rule, bool nested);

static const char *parse_sequence(struct gp *p, const char *pos, uint32_t rule, struct gp_vec *seq, bool nested)
{
    uint32_t start = seq->n;
    bool have = false;
    while (pos && pos < p->end) {
        const char c = *pos;
        uint32_t min = 0, max = UINT32_MAX;
        if (c == '"' || c == '[' || c == '.' || c == '(' || is_word(c)) {
            start = seq->n;
            have = true;
            if (c == '"') {
                pos = parse_literal(p, pos + 1, seq);
            } else if (c == '[') {
                pos = parse_class(p, pos + 1, rule, seq);
            } else if (c == '.') {
                if (p->any_rule == UINT32_MAX) {
                    struct gp_vec tmp = {0};
                    const struct cp_range all = {0, 0x10ffff};
                    if (emit_class(p, rule, &tmp, &all, 1)) p->any_rule = tmp.e[0].val;
                    p->total -= tmp.n;
                    kvb_free(tmp.e);
                }
                pos = p->any_rule != UINT32_MAX && vec_push(p, seq, GE_REF, p->any_rule) ? pos + 1 : NULL;
            } else if (c == '(') {
                /* The one recursion on the text's shape: bounded, so that no
                 * input can exhaust the stack. */
                if (p->nest >= GRAMMAR_MAX_NEST) {
                    char what[96];
                    snprintf(what, sizeof what, "groups ( ) nest deeper than %d", GRAMMAR_MAX_NEST);
                    return gp_fail_at(p, pos, what), NULL;
                }
                const uint32_t id = rule_gen(p, rule);
                p->nest++;
                pos = id == UINT32_MAX ? NULL : parse_alternates(p, skip_space(p, pos + 1, true), id, true);
                p->nest--;
                if (pos && at(p, pos) != ')') pos = (gp_fail_at(p, pos, "expecting ')'"), NULL);
                if (pos && !vec_push(p, seq, GE_REF, id)) pos = NULL;
                if (pos) pos++;
            } else {
                const char *name = pos;
                while (is_word(at(p, pos))) pos++;
                const uint32_t id = rule_find(p, name, (size_t)(pos - name));
                if (id == UINT32_MAX || !vec_push(p, seq, GE_REF, id)) pos = NULL;
            }
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (!have) return gp_fail_at(p, pos, "expecting an item before */+/?/{"), NULL;
            if (c == '+') min = 1;
            if (c == '?') max = 1;
            pos = c == '{' ? parse_braces(p, pos + 1, nested, &min, &max) : pos + 1;
            if (pos && !repeat(p, rule, seq, start, min, max)) pos = NULL;
        } else if (c == '<' || c == '!') {
            return gp_fail_at(p, pos, "token terminals (<[id]>, <text>, !<...>) are not supported"), NULL;
        } else {
            break;
        }
        if (pos) pos = skip_space(p, pos, nested);
    }
    return pos;
}

static const char *parse_alternates(struct gp *p, const char *pos, uint32_t rule, bool nested)
{
    struct gp_vec v = {0};
    pos = parse_sequence(p, pos, rule, &v, nested);
    while (pos && at(p, pos) == '|') {
        pos = vec_push(p, &v, GE_ALT, 0) ? skip_space(p, pos + 1, true) : NULL;
        if (pos) pos = parse_sequence(p, pos, rule, &v, nested);
    }
    if (pos && !(vec_push(p, &v, GE_END, 0) && rule_set(p, rule, &v))) pos = NULL;
    kvb_free(v.e);
    return pos;
}

static const char *parse_rule(struct gp *p, const char *pos)
{
    const char *name = pos;
    while (is_word(at(p, pos))) pos++;
    if (pos == name) return gp_fail_at(p, pos, "expecting a rule name"), NULL;
    const size_t len = (size_t)(pos - name);
    pos = skip_space(p, pos, false);
    if (!(at(p, pos) == ':' && at(p, pos + 1) == ':' && at(p, pos + 2) == '='))
        return gp_fail_at(p, pos, "expecting ::="), NULL;
    const uint32_t id = rule_find(p, name, len);
    if (id == UINT32_MAX) return NULL;
    if (p->rules[id].defined)
        return gp_failf(p, KVB_ERR_FORMAT, "grammar: rule '%s' is defined twice", p->rules[id].name), NULL;
    pos = parse_alternates(p, skip_space(p, pos + 3, true), id, false);
    if (!pos) return NULL;
    if (at(p, pos) == '\r') pos += at(p, pos + 1) == '\n' ? 2 : 1;
    else if (at(p, pos) == '\n') pos++;
    else if (pos < p->end) return gp_fail_at(p, pos, "expecting a newline or the end after a rule"), NULL;
    return skip_space(p, pos, true);
}

/* ---- checks and the compiled form --------------------------------------- */

static void left_edges(const struct gp *p, const bool *nullable, uint32_t r, uint32_t *to, bool *grows, uint32_t *n)
{
    const struct gp_vec *b = &p->rules[r].body;
    bool blocked = false;
    for (uint32_t i = 0; i < b->n; i++) {
        const struct grammar_elem e = b->e[i];
        if (e.type == GE_ALT || e.type == GE_END) {
            blocked = false;
            continue;
        }
        if (blocked) continue;
        if (e.type == GE_BYTES) {
            blocked = true;
            continue;
        }
        if (to) {
            to[*n] = e.val;
            grows[*n] = !(b->e[i + 1].type == GE_ALT || b->e[i + 1].type == GE_END);
        }
        (*n)++;
        blocked = !nullable[e.val];
    }
}

/* The rules that derive something, as the least fixpoint of "a rule with
 * an alternative whose references are all to such rules": nullable ones
 * (bytes_ok false: alternatives without bytes, deriving "") or productive
 * ones (bytes_ok true: deriving some string). Each alternative keeps a
 * count of references not yet known; a rule found known decrements the
 * alternatives that name it. Linear in the grammar's size whatever order
 * its rules come in (a round-robin fixpoint is quadratic on a chain written
 * backwards). */
static bool derive(struct gp *p, bool bytes_ok, bool *known)
{
    const uint32_t nr = p->n_rules;
    uint32_t n_alts = 0, n_refs = 0;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < p->rules[r].body.n; i++) {
            const enum grammar_elem_type t = p->rules[r].body.e[i].type;
            n_alts += t == GE_ALT || t == GE_END;
            n_refs += t == GE_REF;
        }
    uint32_t *need = kvb_malloc(sizeof *need * (n_alts + 1)), *alt_rule = kvb_malloc(sizeof *alt_rule * (n_alts + 1));
    uint32_t *occ_off = kvb_calloc(nr + 2, sizeof *occ_off), *occ = kvb_malloc(sizeof *occ * (n_refs + 1));
    uint32_t *queue = kvb_malloc(sizeof *queue * (nr + 1));
    const bool ok = need && alt_rule && occ_off && occ && queue;
    if (ok) {
        /* occurrences of each rule, as alternatives naming it (with repeats) */
        for (uint32_t r = 0; r < nr; r++)
            for (uint32_t i = 0; i < p->rules[r].body.n; i++)
                if (p->rules[r].body.e[i].type == GE_REF) occ_off[p->rules[r].body.e[i].val + 2]++;
        for (uint32_t x = 0; x < nr; x++) occ_off[x + 2] += occ_off[x + 1];
        uint32_t a = 0, nq = 0;
        for (uint32_t r = 0; r < nr; r++) {
            uint32_t refs = 0;
            bool bytes = false;
            for (uint32_t i = 0; i < p->rules[r].body.n; i++) {
                const struct grammar_elem e = p->rules[r].body.e[i];
                if (e.type == GE_REF) {
                    refs++;
                    occ[occ_off[e.val + 1]++] = a;
                } else if (e.type == GE_BYTES) {
                    bytes = true;
                } else {
                    alt_rule[a] = r;
                    need[a] = bytes && !bytes_ok ? UINT32_MAX : refs;
                    if (need[a] == 0 && !known[r]) known[r] = true, queue[nq++] = r;
                    a++;
                    refs = 0;
                    bytes = false;
                }
            }
        }
        for (uint32_t qi = 0; qi < nq; qi++) { /* occ_off[x + 1] is now where x's occurrences end */
            const uint32_t x = queue[qi];
            for (uint32_t k = occ_off[x]; k < occ_off[x + 1]; k++) {
                const uint32_t alt = occ[k];
                if (need[alt] == UINT32_MAX || --need[alt] > 0 || known[alt_rule[alt]]) continue;
                known[alt_rule[alt]] = true;
                queue[nq++] = alt_rule[alt];
            }
        }
    }
    kvb_free(need);
    kvb_free(alt_rule);
    kvb_free(occ_off);
    kvb_free(occ);
    kvb_free(queue);
    return ok ? true : gp_nomem(p);
}

struct tarjan {
    const uint32_t *off, *to;
    uint32_t *index, *low, *comp, *stack, *call, *edge;
    bool *on;
    uint32_t next, sp, n_comp;
};

static void scc_visit(struct tarjan *t, uint32_t v, uint32_t *csp)
{
    t->index[v] = t->low[v] = t->next++;
    t->stack[t->sp++] = v;
    t->on[v] = true;
    t->edge[v] = t->off[v];
    t->call[(*csp)++] = v;
}

/* Tarjan's strongly connected components from r, with the recursion kept
 * on an explicit stack (call, with each vertex's next edge in edge): a
 * chain of rules as long as the grammar may be would overflow the
 * machine's. */
static void strongconnect(struct tarjan *t, uint32_t r)
{
    uint32_t csp = 0;
    scc_visit(t, r, &csp);
    while (csp) {
        const uint32_t v = t->call[csp - 1];
        if (t->edge[v] < t->off[v + 1]) {
            const uint32_t w = t->to[t->edge[v]++];
            if (t->index[w] == UINT32_MAX) scc_visit(t, w, &csp);
            else if (t->on[w] && t->index[w] < t->low[v]) t->low[v] = t->index[w];
            continue;
        }
        if (t->low[v] == t->index[v]) {
            uint32_t w;
            do {
                w = t->stack[--t->sp];
                t->on[w] = false;
                t->comp[w] = t->n_comp;
            } while (w != v);
            t->n_comp++;
        }
        if (--csp) {
            const uint32_t u = t->call[csp - 1];
            if (t->low[v] < t->low[u]) t->low[u] = t->low[v];
        }
    }
}

/* A rule that reaches itself before any byte, through a reference that is
 * not the last of its alternative, would stack without end: refused. Tail
 * loops (x*, with x able to match nothing) only revisit a stack and end. */
static bool check_left_recursion(struct gp *p)
{
    const uint32_t nr = p->n_rules;
    bool *nullable = kvb_calloc(nr, sizeof *nullable);
    uint32_t *off = kvb_calloc(nr + 1, sizeof *off);
    if (!nullable || !off) return kvb_free(nullable), kvb_free(off), gp_nomem(p);
    if (!derive(p, false, nullable)) return kvb_free(nullable), kvb_free(off), false;
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t n = 0;
        left_edges(p, nullable, r, NULL, NULL, &n);
        off[r + 1] = off[r] + n;
    }
    const uint32_t ne = off[nr];
    uint32_t *to = kvb_malloc(sizeof *to * (ne + 1)), *idx = kvb_malloc(sizeof *idx * 6 * nr);
    bool *grows = kvb_malloc(ne + 1), *on = kvb_calloc(nr, 1);
    bool ok = to && idx && grows && on;
    if (!ok) gp_nomem(p);
    for (uint32_t r = 0; ok && r < nr; r++) {
        uint32_t n = off[r];
        left_edges(p, nullable, r, to, grows, &n);
    }
    if (ok) {
        struct tarjan t = {.off = off,
                           .to = to,
                           .index = idx,
                           .low = idx + nr,
                           .comp = idx + 2 * nr,
                           .stack = idx + 3 * nr,
                           .call = idx + 4 * nr,
                           .edge = idx + 5 * nr,
                           .on = on};
        for (uint32_t r = 0; r < nr; r++) t.index[r] = UINT32_MAX;
        for (uint32_t r = 0; r < nr; r++)
            if (t.index[r] == UINT32_MAX) strongconnect(&t, r);
        for (uint32_t r = 0; r < nr && ok; r++)
            for (uint32_t e = off[r]; e < off[r + 1] && ok; e++)
                if (grows[e] && t.comp[to[e]] == t.comp[r])
                    ok = gp_failf(p, KVB_ERR_FORMAT,
                                  "grammar: rule '%s' is left-recursive (it can reach itself before matching a "
                                  "character); rewrite it with repetition, e.g. a ::= b (\"+\" b)*",
                                  rule_name(p, r));
    }
    kvb_free(nullable);
    kvb_free(off);
    kvb_free(to);
    kvb_free(idx);
    kvb_free(grows);
    kvb_free(on);
    return ok;
}

/* A grammar whose root derives no string (root ::= root, or every way
 * through it needing a rule that never ends) is refused: its recogniser
 * could never finish. Otherwise the alternatives that need such a rule are
 * dropped (no string goes through them), so that every prefix the grammar
 * accepts can still be completed: a generation never walks into a dead end
 * to run until max_tokens. */
static bool check_productive(struct gp *p, uint32_t root)
{
    bool *prod = kvb_calloc(p->n_rules, sizeof *prod);
    if (!prod) return gp_nomem(p);
    bool ok = derive(p, true, prod);
    if (ok && !prod[root])
        ok = gp_failf(p, KVB_ERR_FORMAT,
                      "grammar: rule 'root' matches no string: every way through it needs a rule that never ends "
                      "(as in a ::= \"x\" a, or root ::= root, with no other alternative)");
    for (uint32_t r = 0; ok && r < p->n_rules; r++) {
        if (!prod[r]) continue; /* unreachable from root once the rest is pruned */
        struct gp_vec *b = &p->rules[r].body;
        uint32_t w = 0, start = 0;
        bool keep = true;
        for (uint32_t i = 0; i < b->n; i++) {
            const struct grammar_elem e = b->e[i];
            if (e.type == GE_REF && !prod[e.val]) keep = false;
            if (e.type != GE_ALT && e.type != GE_END) continue;
            if (keep) {
                memmove(b->e + w, b->e + start, sizeof *b->e * (i + 1 - start));
                w += i + 1 - start;
            }
            start = i + 1;
            keep = true;
        }
        /* a productive rule keeps an alternative; the last one kept ends the body */
        b->e[w - 1].type = GE_END;
        p->total -= b->n - w;
        b->n = w;
    }
    kvb_free(prod);
    return ok;
}

static bool build(struct gp *p, struct grammar *g)
{
    g->n_rules = p->n_rules;
    g->n_elems = (uint32_t)p->total;
    g->rule_start = kvb_malloc(sizeof *g->rule_start * (p->n_rules + 1));
    g->elems = kvb_malloc(sizeof *g->elems * (p->total + 1));
    if (!g->rule_start || !g->elems) return gp_nomem(p);
    uint32_t k = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        g->rule_start[r] = k;
        memcpy(g->elems + k, p->rules[r].body.e, sizeof *g->elems * p->rules[r].body.n);
        k += p->rules[r].body.n;
    }
    g->rule_start[p->n_rules] = k;
    g->n_elems = k;
    g->sets = p->sets;
    g->n_sets = p->n_sets;
    p->sets = NULL;
    return true;
}

static bool parse_all(struct gp *p, uint32_t *root)
{
    const char *pos = skip_space(p, p->src, true);
    while (pos && pos < p->end) pos = parse_rule(p, pos);
    if (!pos) return false;
    for (uint32_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].defined)
            return gp_failf(p, KVB_ERR_FORMAT, "grammar: rule '%s' is used but never defined", p->rules[r].name);
    if (!check_left_recursion(p)) return false;
    *root = rule_lookup(p, "root");
    if (*root == UINT32_MAX) return gp_failf(p, KVB_ERR_FORMAT, "grammar: no rule named root (the start rule)");
    return check_productive(p, *root);
}

enum kvb_status grammar_compile(const char *gbnf, size_t len, struct grammar **out, char *msg, size_t cap)
{
    *out = NULL;
    if (msg && cap) msg[0] = 0;
    struct gp p = {.src = gbnf ? gbnf : "",
                   .end = (gbnf ? gbnf : "") + (gbnf ? len : 0),
                   .any_rule = UINT32_MAX,
                   .msg = msg,
                   .msg_cap = cap};
    for (int i = 0; i < 256; i++) p.single[i] = -1;
    struct grammar *g = kvb_calloc(1, sizeof *g);
    if (!g) gp_nomem(&p);
    if (g) parse_all(&p, &g->root);
    if (p.st == KVB_OK) build(&p, g);
    /* What the recogniser's limits would cut at its very start (a stack
     * deeper than GRAMMAR_MAX_DEPTH before the first byte, more than
     * GRAMMAR_MAX_STACKS alternatives open at once) would make a request
     * that can produce nothing, or less than its grammar says: refused
     * here, by name, so that the line gets an error and not an empty output. */
    if (p.st == KVB_OK) p.st = gm_check_start(g, msg, cap);
    for (uint32_t r = 0; r < p.n_rules; r++) {
        kvb_free(p.rules[r].body.e);
        kvb_free(p.rules[r].name);
    }
    kvb_free(p.rules);
    kvb_free(p.sets);
    kvb_free(p.set_hash);
    kvb_free(p.names);
    if (p.st != KVB_OK) {
        grammar_free(g);
        return p.st;
    }
    *out = g;
    return KVB_OK;
}

void grammar_free(struct grammar *g)
{
    if (!g) return;
    kvb_free(g->elems);
    kvb_free(g->rule_start);
    kvb_free(g->sets);
    kvb_free(g);
}
