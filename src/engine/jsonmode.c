/* jsonmode.c — the JSON-object recogniser and the token mask built on it
 * (see jsonmode.h). */
#include "engine/jsonmode.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "base/alloc.h"

enum mode {
    M_START,     /* before the top-level object: whitespace, '{' */
    M_OBJ_FIRST, /* after '{': whitespace, a key, '}' */
    M_OBJ_KEY,   /* after ',' in an object: whitespace, a key */
    M_COLON,     /* after a key: whitespace, ':' */
    M_VALUE,     /* after ':' or ',' in an array: whitespace, a value */
    M_ARR_FIRST, /* after '[': whitespace, a value, ']' */
    M_AFTER,     /* after a value inside a container: whitespace, ',', its closer */
    M_STR,       /* inside a string */
    M_ESC,       /* after a backslash */
    M_HEX,       /* inside \uXXXX (sub: digits seen) */
    M_NEG,       /* after a number's '-' */
    M_ZERO,      /* a number's integer part is 0 */
    M_INT,       /* integer digits 1-9… */
    M_DOT,       /* after '.' */
    M_FRAC,      /* fraction digits */
    M_EXP,       /* after 'e' */
    M_EXP_SIGN,  /* after the exponent's sign */
    M_EXP_DIGIT, /* exponent digits */
    M_LIT,       /* inside true / false / null (lit, sub) */
    M_DONE,      /* the object is closed */
    M_BROKEN,    /* a token that was not allowed got accepted */
};

static const char *const literals[3] = {"true", "false", "null"};

enum { V_FREE, V_INTEGER, V_ENUM };

void jsonmode_schema_free(struct jsonmode_schema *s)
{
    if (!s) return;
    kvb_free(s->nodes);
    kvb_free(s->props);
    kvb_free(s->lits);
    kvb_free(s->bytes);
    kvb_free(s);
}

void jsonmode_init(struct jsonmode_state *s, const struct jsonmode_schema *schema)
{
    memset(s, 0, offsetof(struct jsonmode_state, frames)); /* M_START */
    s->schema = schema;
}

bool jsonmode_complete(const struct jsonmode_state *s) { return s->mode == M_DONE; }

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static bool in_array(const struct jsonmode_state *s) { return (s->arrays >> (s->depth - 1)) & 1u; }

/* ---- the schema's part ------------------------------------------------------------
 * Checked only while the innermost open container is a constrained one
 * (frames[depth - 1]); inside an ANY value (free_depth) only the grammar
 * is. */

static bool constrained(const struct jsonmode_state *s)
{
    return s->schema && s->free_depth == 0 && s->depth > 0 && s->depth == s->n_frames;
}

static struct jsonmode_frame *top(struct jsonmode_state *s) { return &s->frames[s->n_frames - 1]; }

static const struct jsonmode_node *node_at(const struct jsonmode_state *s, int32_t i) { return &s->schema->nodes[i]; }

/* The node of the value about to begin in the innermost container. */
static int32_t expected_node(struct jsonmode_state *s)
{
    const struct jsonmode_frame *f = top(s);
    const struct jsonmode_node *n = node_at(s, f->node);
    if (n->kind == JSK_ARRAY) return n->items;
    return s->schema->props[n->first + (uint32_t)f->prop].node;
}

/* Text i of a node's list: its property names or its enum literals. */
static const struct jsonmode_text *text_at(const struct jsonmode_schema *sc, const struct jsonmode_node *n, int i)
{
    return n->kind == JSK_OBJECT ? &sc->props[n->first + (uint32_t)i].name : &sc->lits[n->first + (uint32_t)i];
}

/* The candidates among n's texts whose byte at pos is c. */
static uint64_t filter(const struct jsonmode_schema *sc, const struct jsonmode_node *n, uint64_t cand, uint16_t pos,
                       unsigned char c)
{
    uint64_t keep = 0;
    for (uint64_t m = cand; m; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        const struct jsonmode_text *t = text_at(sc, n, i);
        if (pos < t->len && (unsigned char)sc->bytes[t->off + pos] == c) keep |= (uint64_t)1 << i;
    }
    return keep;
}

/* The candidate exactly pos bytes long, or -1. */
static int exact(const struct jsonmode_schema *sc, const struct jsonmode_node *n, uint64_t cand, uint16_t pos)
{
    for (uint64_t m = cand; m; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        if (text_at(sc, n, i)->len == pos) return i;
    }
    return -1;
}

static bool enter_frame(struct jsonmode_state *s, int32_t node)
{
    if (s->n_frames == JSONMODE_MAX_FRAMES) return false;
    s->frames[s->n_frames++] = (struct jsonmode_frame){0, (int16_t)node, -1, 0};
    return true;
}

/* A value begins with byte c where node `ni` is expected (ANY: anything).
 * Called before the grammar takes c. */
static bool sch_value_start(struct jsonmode_state *s, int32_t ni, unsigned char c)
{
    const struct jsonmode_node *n = node_at(s, ni);
    s->vmode = V_FREE;
    switch (n->kind) {
    case JSK_ANY: return true;
    case JSK_OBJECT:
    case JSK_ARRAY: return c == (n->kind == JSK_OBJECT ? '{' : '[');
    case JSK_ENUM: {
        uint64_t all = n->n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n) - 1);
        s->cand = filter(s->schema, n, all, 0, c);
        s->cpos = 1;
        s->vnode = (int16_t)ni;
        s->vmode = V_ENUM;
        return s->cand != 0;
    }
    default: { /* SCALAR */
        const unsigned ty = n->types;
        if (c == '"') return ty & JST_STRING;
        if (c == '-' || is_digit(c)) {
            if (!(ty & JST_NUMBER)) s->vmode = V_INTEGER;
            return ty & (JST_NUMBER | JST_INTEGER);
        }
        if (c == 't' || c == 'f') return ty & JST_BOOLEAN;
        if (c == 'n') return ty & JST_NULL;
        return false;
    }
    }
}

/* One more byte of a scalar value (after its first). */
static bool sch_value_byte(struct jsonmode_state *s, unsigned char c)
{
    if (s->vmode == V_INTEGER) return c != '.' && c != 'e' && c != 'E';
    if (s->vmode != V_ENUM) return true;
    s->cand = filter(s->schema, node_at(s, s->vnode), s->cand, s->cpos, c);
    s->cpos++;
    return s->cand != 0;
}

/* A scalar value ended: an enum literal must be whole. */
static bool sch_value_end(struct jsonmode_state *s)
{
    const bool ok = s->vmode != V_ENUM || exact(s->schema, node_at(s, s->vnode), s->cand, s->cpos) >= 0;
    s->vmode = V_FREE;
    return ok;
}

static uint64_t unseen(const struct jsonmode_state *s, const struct jsonmode_frame *f)
{
    const struct jsonmode_node *n = node_at(s, f->node);
    const uint64_t all = n->n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n) - 1);
    return all & ~f->seen;
}

/* ---- the grammar ------------------------------------------------------------------ */

static bool push(struct jsonmode_state *s, bool array)
{
    if (s->depth == JSONMODE_MAX_DEPTH) return false;
    if (array) s->arrays |= (uint64_t)1 << s->depth;
    else s->arrays &= ~((uint64_t)1 << s->depth);
    s->depth++;
    s->mode = array ? M_ARR_FIRST : M_OBJ_FIRST;
    return true;
}

/* A value ended (string, number, literal, container): what follows it. */
static bool value_done(struct jsonmode_state *s)
{
    s->mode = M_AFTER;
    if (!constrained(s)) return true;
    if (!sch_value_end(s)) return false;
    top(s)->prop = -1;
    return true;
}

/* The closer of the innermost container: allowed by its schema? */
static bool close_ok(struct jsonmode_state *s)
{
    if (!constrained(s)) return true;
    const struct jsonmode_frame *f = top(s);
    const struct jsonmode_node *n = node_at(s, f->node);
    if (n->kind == JSK_ARRAY) return f->count >= n->min_items;
    return n->any_object || (n->required & ~f->seen) == 0;
}

static bool pop(struct jsonmode_state *s)
{
    if (!close_ok(s)) return false;
    if (constrained(s)) s->n_frames--;
    if (s->free_depth == s->depth) s->free_depth = 0; /* the ANY value that opened here is done */
    s->depth--;
    if (s->depth == 0) {
        s->mode = M_DONE;
        return true;
    }
    return value_done(s);
}

/* The first byte of a value. */
static bool value_start(struct jsonmode_state *s, unsigned char c)
{
    int32_t ni = -1;
    if (constrained(s)) {
        ni = expected_node(s);
        if (!sch_value_start(s, ni, c)) return false;
        struct jsonmode_frame *f = top(s);
        if (node_at(s, f->node)->kind == JSK_ARRAY) {
            if (f->count >= node_at(s, f->node)->max_items) return false;
            f->count++;
        }
    }
    switch (c) {
    case '{':
    case '[':
        if (!push(s, c == '[')) return false;
        if (ni >= 0) {
            const struct jsonmode_node *n = node_at(s, ni);
            if (n->kind == JSK_ANY || (n->kind == JSK_OBJECT && n->any_object)) s->free_depth = s->depth;
            else if (!enter_frame(s, ni)) return false;
        }
        return true;
    case '"':
        s->mode = M_STR;
        s->key = false;
        return true;
    case '-': s->mode = M_NEG; return true;
    case '0': s->mode = M_ZERO; return true;
    case 't':
    case 'f':
    case 'n':
        s->mode = M_LIT;
        s->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->sub = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = M_INT;
            return true;
        }
        return false;
    }
}

/* Bytes inside a scalar value, past its first: the schema's say too. */
static bool scalar_byte(struct jsonmode_state *s, unsigned char c) { return !constrained(s) || sch_value_byte(s, c); }

static bool step(struct jsonmode_state *s, unsigned char c)
{
    /* Whitespace where the grammar allows it, as pretty printers write it
     * (jsonmode.h). */
    switch (s->mode) {
    case M_START:
    case M_OBJ_FIRST:
    case M_OBJ_KEY:
    case M_COLON:
    case M_VALUE:
    case M_ARR_FIRST:
    case M_AFTER:
        if (!is_ws(c)) {
            s->ws = 0;
            s->nl = false;
            break;
        }
        if (s->mode == M_COLON || c == '\r') return false;
        if (s->mode == M_START) return ++s->ws <= JSONMODE_MAX_LEAD_WS;
        if (s->mode == M_VALUE && !in_array(s)) return c == ' ' && ++s->ws <= 1; /* after a colon */
        if (c == '\n') {
            if (s->nl) return false;
            s->nl = true;
        }
        return ++s->ws <= JSONMODE_MAX_WS;
    default: break;
    }
    switch (s->mode) {
    case M_START:
        if (c != '{' || !push(s, false)) return false;
        if (!s->schema) return true;
        if (s->schema->nodes[0].any_object) {
            s->free_depth = 1;
            return true;
        }
        return enter_frame(s, 0);
    case M_OBJ_FIRST:
    case M_OBJ_KEY:
        if (c == '}' && s->mode == M_OBJ_FIRST) return pop(s);
        if (c != '"') return false;
        s->mode = M_STR;
        s->key = true;
        if (constrained(s)) { /* a key: one of the properties not given yet */
            s->cand = unseen(s, top(s));
            s->cpos = 0;
            return s->cand != 0;
        }
        return true;
    case M_COLON:
        if (c != ':') return false;
        s->mode = M_VALUE;
        return true;
    case M_ARR_FIRST:
        if (c == ']') return pop(s);
        return value_start(s, c);
    case M_VALUE: return value_start(s, c);
    case M_AFTER:
        if (c == ',') {
            const bool arr = in_array(s);
            s->mode = arr ? M_VALUE : M_OBJ_KEY;
            if (!constrained(s)) return true;
            const struct jsonmode_frame *f = top(s);
            return arr ? f->count < node_at(s, f->node)->max_items : unseen(s, f) != 0;
        }
        if (c == (in_array(s) ? ']' : '}')) return pop(s);
        return false;
    case M_STR:
        if (s->key && constrained(s)) {
            if (c == '"') {
                const int which = exact(s->schema, node_at(s, top(s)->node), s->cand, s->cpos);
                if (which < 0) return false;
                top(s)->prop = (int16_t)which;
                top(s)->seen |= (uint64_t)1 << which;
                s->mode = M_COLON;
                return true;
            }
            if (c == '\\' || c < 0x20) return false; /* property names are matched as written */
            s->cand = filter(s->schema, node_at(s, top(s)->node), s->cand, s->cpos, c);
            s->cpos++;
            return s->cand != 0;
        }
        if (!s->key && !scalar_byte(s, c)) return false;
        if (c == '"') {
            if (s->key) {
                s->mode = M_COLON;
                return true;
            }
            return value_done(s);
        }
        if (c == '\\') {
            s->mode = M_ESC;
            return true;
        }
        return c >= 0x20; /* control characters must be escaped */
    case M_ESC:
        if (!s->key && !scalar_byte(s, c)) return false;
        if (c == 'u') {
            s->mode = M_HEX;
            s->sub = 0;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return false;
        s->mode = M_STR;
        return true;
    case M_HEX:
        if (!s->key && !scalar_byte(s, c)) return false;
        if (!is_hex(c)) return false;
        if (++s->sub == 4) s->mode = M_STR;
        return true;
    case M_NEG:
        if (!scalar_byte(s, c)) return false;
        if (c == '0') s->mode = M_ZERO;
        else if (c >= '1' && c <= '9') s->mode = M_INT;
        else return false;
        return true;
    case M_ZERO:
    case M_INT:
    case M_FRAC:
        if (is_digit(c) && s->mode != M_ZERO) return scalar_byte(s, c);
        if (c == '.' && s->mode != M_FRAC) {
            s->mode = M_DOT;
            return scalar_byte(s, c);
        }
        if (c == 'e' || c == 'E') {
            s->mode = M_EXP;
            return scalar_byte(s, c);
        }
        /* the number ended: the byte belongs to what follows */
        return value_done(s) && step(s, c);
    case M_DOT:
        if (!is_digit(c)) return false;
        s->mode = M_FRAC;
        return scalar_byte(s, c);
    case M_EXP:
    case M_EXP_SIGN:
        if ((c == '+' || c == '-') && s->mode == M_EXP) {
            s->mode = M_EXP_SIGN;
            return scalar_byte(s, c);
        }
        if (!is_digit(c)) return false;
        s->mode = M_EXP_DIGIT;
        return scalar_byte(s, c);
    case M_EXP_DIGIT:
        if (is_digit(c)) return scalar_byte(s, c);
        return value_done(s) && step(s, c);
    case M_LIT:
        if (c != (unsigned char)literals[s->lit][s->sub]) return false;
        if (!scalar_byte(s, c)) return false;
        if (literals[s->lit][++s->sub] == '\0') return value_done(s);
        return true;
    default: /* M_DONE, M_BROKEN */ return false;
    }
}

bool jsonmode_feed(struct jsonmode_state *s, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!step(s, (unsigned char)bytes[i])) return false;
    return true;
}

/* ---- tokens -------------------------------------------------------------------------- */

struct jsonmode_vocab {
    int32_t n;
    uint32_t *off; /* (n + 1) token i's bytes: bytes[off[i] .. off[i+1]) */
    char *bytes;
    uint8_t *eog; /* (n) 1: an end-of-generation token */
};

void jsonmode_vocab_free(struct jsonmode_vocab *v)
{
    if (!v) return;
    kvb_free(v->off);
    kvb_free(v->bytes);
    kvb_free(v->eog);
    kvb_free(v);
}

int32_t jsonmode_vocab_size(const struct jsonmode_vocab *v) { return v ? v->n : 0; }

int32_t jsonmode_vocab_eog(const struct jsonmode_vocab *v)
{
    for (int32_t i = 0; i < v->n; i++)
        if (v->eog[i]) return i;
    return -1; /* jsonmode_vocab_create refuses such a vocabulary */
}

enum kvb_status jsonmode_vocab_create(const struct tok *t, struct jsonmode_vocab **out, struct kvb_err *err)
{
    *out = NULL;
    struct jsonmode_vocab *v = kvb_calloc(1, sizeof *v);
    const int32_t n = tok_n_vocab(t);
    if (v) {
        v->n = n;
        v->off = kvb_malloc(sizeof *v->off * ((size_t)n + 1));
        v->eog = kvb_calloc((size_t)n ? (size_t)n : 1, 1);
    }
    if (!v || !v->off || !v->eog) {
        jsonmode_vocab_free(v);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the JSON mode's vocabulary");
    }
    /* Two passes: sizes, then bytes. */
    char piece[256];
    size_t total = 0;
    bool any_eog = false;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = (uint32_t)total;
        v->eog[i] = tok_is_eog(t, i);
        any_eog |= v->eog[i];
        if (!v->eog[i]) total += tok_piece(t, i, false, piece, sizeof piece);
    }
    v->off[n] = (uint32_t)total;
    v->bytes = kvb_malloc(total ? total : 1);
    if (!v->bytes) {
        jsonmode_vocab_free(v);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory for the JSON mode's vocabulary");
    }
    for (int32_t i = 0; i < n; i++) {
        const size_t len = v->off[i + 1] - v->off[i];
        if (len == 0) continue;
        char *dst = v->bytes + v->off[i];
        if (len <= sizeof piece) {
            tok_piece(t, i, false, piece, sizeof piece);
            memcpy(dst, piece, len);
        } else {
            tok_piece(t, i, false, dst, len); /* a token longer than the scratch */
        }
    }
    if (!any_eog) {
        jsonmode_vocab_free(v);
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "the vocabulary has no end-of-generation token");
    }
    *out = v;
    return KVB_OK;
}

/* Only the live frames: a mask tries every token on a copy. */
static void copy_state(struct jsonmode_state *dst, const struct jsonmode_state *src)
{
    memcpy(dst, src, offsetof(struct jsonmode_state, frames) + sizeof src->frames[0] * src->n_frames);
}

bool jsonmode_allows(const struct jsonmode_vocab *v, const struct jsonmode_state *s, int32_t token)
{
    if (token < 0 || token >= v->n) return false;
    if (v->eog[token]) return s->mode == M_DONE || s->mode == M_BROKEN;
    const uint32_t a = v->off[token], b = v->off[token + 1];
    if (a == b) return false;
    struct jsonmode_state t;
    copy_state(&t, s);
    return jsonmode_feed(&t, v->bytes + a, b - a);
}

int32_t jsonmode_mask(const struct jsonmode_vocab *v, const struct jsonmode_state *s, float *logits)
{
    int32_t left = 0;
    for (int32_t i = 0; i < v->n; i++) {
        if (jsonmode_allows(v, s, i)) left++;
        else logits[i] = -INFINITY;
    }
    return left;
}

void jsonmode_accept(const struct jsonmode_vocab *v, struct jsonmode_state *s, int32_t token)
{
    if (s->mode == M_BROKEN) return;
    if (!jsonmode_allows(v, s, token)) {
        s->mode = M_BROKEN;
        return;
    }
    if (!v->eog[token]) jsonmode_feed(s, v->bytes + v->off[token], v->off[token + 1] - v->off[token]);
}
