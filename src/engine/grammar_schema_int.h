/* grammar_schema_int.h — what the schema compiler's files share: the
 * walker over the schema (grammar_schema.c) and the terminals it writes
 * (grammar_schema_lex.c: whitespace, strings, numbers and their ranges,
 * formats, literals, free values). Not a public interface. */
#ifndef KVB_GRAMMAR_SCHEMA_INT_H
#define KVB_GRAMMAR_SCHEMA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/json.h"
#include "base/status.h"

/* What a compiled schema may produce (its JSON types). */
enum {
    GT_STR = 1,
    GT_NUM = 2, /* numbers that are not integers */
    GT_INT = 4,
    GT_BOOL = 8,
    GT_NULL = 16,
    GT_OBJ = 32,
    GT_ARR = 64,
    GT_ALL = 127
};

#define GS_PATH 256    /* a field's path in messages */
#define GS_MAX_VIEW 16 /* schemas one allOf/$ref conjunction holds */

/* Keywords with a value of their own, index = K_*. */
enum {
    K_TYPE,
    K_PROPS,
    K_REQ,
    K_ADDL,
    K_ITEMS,
    K_PREFIX,
    K_MINI,
    K_MAXI,
    K_ENUM,
    K_CONST,
    K_ANYOF,
    K_ONEOF,
    K_ALLOF,
    K_REF,
    K_PATTERN,
    K_FORMAT,
    K_MINL,
    K_MAXL,
    K_MIN,
    K_MAX,
    K_XMIN,
    K_XMAX,
    K_ADDITEMS,
    K_COUNT
};
/* The keywords of a view: where each is (value token), merged ones listed. */
struct kws {
    int at[K_COUNT];   /* value token, -1 absent (the last part's for merged ones) */
    int from[K_COUNT]; /* the part it came from */
    int types[GS_MAX_VIEW], n_types;
    int props[GS_MAX_VIEW], n_props;
    int reqs[GS_MAX_VIEW], n_reqs;
};

struct gs_def {
    int tok;    /* the definition's schema */
    int32_t id; /* its rule */
    int opened; /* containers open when it began compiling */
    bool busy;  /* still compiling (a reference now is recursion) */
    unsigned types;
};

struct gs {
    const struct json_doc *j;
    struct kvb_buf *out; /* the rules */
    int32_t next_id;     /* generated rules g<id> */
    struct gs_def *defs;
    int n_defs, cap_defs;
    bool have_any[GSCHEMA_MAX_DEPTH + 1]; /* jv<K> written */
    bool have_ws, have_str, have_lstr, have_num, have_int, have_keyrest;
    int opened; /* objects and arrays being compiled around this point */
    int nest;   /* schemas being compiled around this point */
    char *err_path, *msg;
    size_t path_cap, msg_cap;
    bool oom;
};

/* Error: the field and the reason; returns -1. */
int gs_fail(struct gs *g, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Out of memory (b->oom); returns -1. */
int gs_nomem(struct gs *g);

/* Appending text; false (and g->oom) when out of memory. */
bool gs_put(struct gs *g, struct kvb_buf *b, const char *s);
bool gs_putf(struct gs *g, struct kvb_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* bytes as one GBNF literal "..." (quotes included). */
bool gs_put_lit(struct gs *g, struct kvb_buf *b, const char *s, size_t n);
/* A finished rule: "name ::= body\n" into g->out (size-checked). */
int gs_rule(struct gs *g, const char *name, const struct kvb_buf *body, const char *path);
int32_t gs_new_id(struct gs *g);

/* Names of the shared rules, written on first use: "ws" (whitespace
 * between tokens), "str" (any string), "lchr" (one counted character),
 * "num", "int", "jv<K>" (any value with K containers left), "krest" (the
 * rest of a key after it left every listed name). */
bool gs_need_ws(struct gs *g);
bool gs_need_str(struct gs *g);
bool gs_need_lchr(struct gs *g);
bool gs_need_num(struct gs *g);
bool gs_need_int(struct gs *g);
bool gs_need_keyrest(struct gs *g);
/* Any value with `budget` containers left (0: scalars only); its name into name[16]. */
bool gs_need_any(struct gs *g, int budget, char *name);

/* Integers lo..hi (has_lo/has_hi false: unbounded that side) as an
 * expression appended to b. */
bool gs_int_range(struct gs *g, struct kvb_buf *b, bool has_lo, int64_t lo, bool has_hi, int64_t hi);
/* A decimal bound read exactly from its JSON text: |value| = ip.fd. */
struct gs_dec {
    uint64_t ip;
    char fd[40]; /* fraction digits, no trailing zeros */
    bool neg;
};
/* False when the number has too many digits to hold (integer part past
 * 2^60, or 38 fraction digits). */
bool gs_dec_parse(const char *s, size_t n, struct gs_dec *d);
/* Decimals between lo and hi (NULL: unbounded; exclusive flags), written
 * without an exponent (and never as -0). */
bool gs_num_range(struct gs *g, struct kvb_buf *b, const struct gs_dec *lo, bool lo_ex, const struct gs_dec *hi,
                  bool hi_ex);

/* The regex (anchored) JSON Schema's format `name` stands for, or NULL. */
const char *gs_format_regex(const char *name, size_t n);

/* JSON value token i written as a literal expression (enum/const): strings
 * and numbers as written, containers with whitespace between parts. */
bool gs_put_value_lit(struct gs *g, struct kvb_buf *b, int i);

/* out = base.key (paths only label errors; out has GS_PATH chars). */
void gs_sub_path(char *out, const char *base, const char *key);
/* The schema at token tok (a lone $ref shares its definition's rule): its
 * rule's number, -1 on error, -2 when it can hold no value; *types what it
 * may produce. depth: containers open around the value. */
int32_t gs_compile_tok(struct gs *g, int tok, const char *path, int depth, unsigned *types);
/* The object or array a view's keywords describe, as an expression into b. */
int gs_object_expr(struct gs *g, const struct kws *kw, const char *path, int depth, struct kvb_buf *b);
int gs_array_expr(struct gs *g, const struct kws *kw, const char *path, int depth, struct kvb_buf *b);
/* A count keyword (minItems...): 1 and *out when given, 0 absent, -1 error. */
int gs_get_count(struct gs *g, const struct kws *kw, int w, const char *path, uint32_t *out);
extern const char *const gs_kw_names[];

#endif
