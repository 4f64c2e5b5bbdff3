/* grammar_regex_int.h — what the two halves of grammar_regex share: the
 * parser and automaton (grammar_regex.c) and the deterministic automaton and
 * its GBNF (grammar_regex_dfa.c). Not a public interface. */
#ifndef KVB_GRAMMAR_REGEX_INT_H
#define KVB_GRAMMAR_REGEX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

#define GR_MAX_CP 0x10FFFFu

struct gr_iv {
    uint32_t lo, hi; /* code points lo..hi, inclusive */
};

enum gr_edge_kind { GE_EPS, GE_SET, GE_BOL, GE_EOL };

struct gr_edge {
    int32_t from, to;
    uint8_t kind; /* enum gr_edge_kind */
    int32_t set;  /* GE_SET: sets[set] */
};

struct gr_set {
    uint32_t off, n; /* ivs[off .. off + n): sorted, disjoint, not adjacent */
};

/* The nondeterministic automaton: states 0..n_states, start and accept. */
struct gr_nfa {
    struct gr_edge *edges;
    int32_t n_edges, cap_edges;
    int32_t n_states, start, accept;
    struct gr_iv *ivs;
    uint32_t n_ivs, cap_ivs;
    struct gr_set *sets;
    int32_t n_sets, cap_sets;
};

struct gr_err {
    char *msg;
    size_t cap;
    bool oom;
};

int gr_fail(struct gr_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The regex re[0..len) as an automaton (*nfa zeroed by the caller; free
 * with gr_nfa_free). JSON content mode wraps it in "any string" on each
 * side (search semantics); whole mode does not. 0, or -1 with e filled. */
int gr_build_nfa(const char *re, size_t len, bool search, struct gr_nfa *nfa, struct gr_err *e);
void gr_nfa_free(struct gr_nfa *nfa);

/* The automaton as right-linear GBNF rules (grammar_regex.h). */
int gr_emit(const struct gr_nfa *nfa, bool json_content, uint32_t min_len, uint32_t max_len, const char *prefix,
            struct kvb_buf *out, struct gr_err *e);

/* Appends text to out; false when out of memory. */
bool gr_put(struct kvb_buf *out, const char *s, size_t n);
bool gr_puts(struct kvb_buf *out, const char *s);
/* Appends one code point as GBNF writes it inside "..." or [...]. */
bool gr_put_cp(struct kvb_buf *out, uint32_t cp);

#endif
