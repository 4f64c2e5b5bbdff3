/* grammar_regex.h — a regular expression (the ECMA-262 subset JSON Schema's
 * `pattern` uses, and guided_regex) turned into GBNF rules.
 *
 * The GBNF is llama.cpp's: character classes and literals are over Unicode
 * code points (\xHH, \uHHHH and \UHHHHHHHH name code points, not bytes), so
 * an engine reading it decodes UTF-8 first. The rules are right-linear (one
 * per state of a deterministic automaton: `P-7 ::= [a-z] P-8 | "-" P-2 | ""`),
 * so a pushdown recogniser keeps one stack of depth one while it reads them,
 * and every prefix the rules accept can still be completed (dead states are
 * pruned).
 *
 * The subset: alternation, concatenation, groups ( ), (?: ) and (?<name> )
 * (captures are only groups), quantifiers * + ? {n} {n,} {n,m} (lazy forms
 * match the same strings), classes [...] and [^...] with ranges, . (any code
 * point but \n \r U+2028 U+2029), \d \D \w \W \s \S (ECMA's ASCII \d and \w,
 * ECMA's \s), escapes \t \n \v \f \r \0 \cX \xHH \uHHHH (surrogate pairs
 * joined) \u{H..} and escaped punctuation, anchors ^ and $ (start and end of
 * the string; there is no multiline flag). Refused by name: lookahead and
 * lookbehind, back-references (\1, \k<name>), word boundaries (\b \B),
 * Unicode property escapes (\p \P), empty classes [] and [^], unknown
 * letter escapes, counts above GREGEX_MAX_COUNT, and automata past the size
 * limits below.
 *
 * Errors: KVB_ERR_FORMAT with the reason in msg (the regex's syntax, or a
 * refused feature named), KVB_ERR_NOMEM. out is appended to; on error its
 * length is put back. */
#ifndef KVB_GRAMMAR_REGEX_H
#define KVB_GRAMMAR_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

/* flags */
#define GREGEX_WHOLE 0 /* guided_regex: the output is exactly one match, written as it is (UTF-8) */
/* JSON Schema's `pattern`: the rules read the content of a JSON string (no
 * quotes), and the decoded string must contain a match (search semantics:
 * unanchored unless ^ or $ say otherwise). Each code point has one written
 * form: '"', '\\' and control characters escaped (\" \\ \b \f \n \r \t,
 * others \u00XX with either case of hex), '/' raw or as \/, every other
 * code point raw. So the decoded string is exactly what the automaton read. */
#define GREGEX_JSON_CONTENT 1

#define GREGEX_MAX_COUNT 1000    /* n and m of {n,m} */
#define GREGEX_MAX_NFA 20000     /* states of the nondeterministic automaton */
#define GREGEX_MAX_DFA 4000      /* states of the deterministic one */
#define GREGEX_MAX_RULES 40000   /* states once a length bound is applied */
#define GREGEX_NO_MAX UINT32_MAX /* max_len: no upper bound */

/* re[0..len) (UTF-8) into rules whose entry is named rule_prefix (others
 * rule_prefix-N; the prefix is [a-zA-Z0-9-]+). */
enum kvb_status gregex_to_gbnf(const char *re, size_t len, int flags, const char *rule_prefix, struct kvb_buf *out,
                               char *msg, size_t msg_cap);

/* The same, intersected with a length: the matched string (the decoded
 * string, in GREGEX_JSON_CONTENT) has min_len..max_len code points
 * (max_len GREGEX_NO_MAX: no bound). The intersection is exact; when it
 * needs more than GREGEX_MAX_RULES rules it is refused (msg says so). */
enum kvb_status gregex_to_gbnf_len(const char *re, size_t len, int flags, uint32_t min_len, uint32_t max_len,
                                   const char *rule_prefix, struct kvb_buf *out, char *msg, size_t msg_cap);

#endif
