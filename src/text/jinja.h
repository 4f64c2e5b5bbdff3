/* jinja.h — a Jinja2 interpreter for chat templates, rendering them as
 * Hugging Face transformers does (apply_chat_template: an
 * ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
 * loopcontrols extension, its own tojson, raise_exception, strftime_now,
 * dict and namespace).
 *
 * What it holds (everything real chat templates use):
 *   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.*,
 *               break/continue), set (names, tuples, namespace attributes,
 *               block set with filters), macro (defaults, varargs, kwargs,
 *               caller), call blocks, filter blocks, with, raw, generation
 *               (transformers' tag: renders its body), comments, whitespace
 *               control (-, +, trim_blocks, lstrip_blocks), the trailing
 *               newline dropped;
 *   expressions literals (strings with Python escapes, ints, floats, lists,
 *               tuples, dicts), attribute and subscript access (jinja2's
 *               order: attribute first for `.`, item first for `[]`),
 *               slices, calls (keywords, *args, **kwargs), ~ + - * / // %
 *               **, comparisons (chained), in / not in, and / or / not,
 *               `x if c else y`, filters and `is` tests;
 *   filters     abs attr batch capitalize center count default (d) dictsort
 *               e escape first float forceescape format groupby indent int
 *               items join last length list lower map max min reject
 *               rejectattr replace reverse round safe select selectattr
 *               slice sort string sum title tojson trim truncate unique
 *               upper wordcount (tojson with transformers' ensure_ascii,
 *               indent, separators and sort_keys);
 *   tests       boolean callable defined divisibleby eq equalto escaped even
 *               false filter float ge gt in integer iterable le lower lt
 *               mapping ne none number odd sameas sequence string test true
 *               undefined upper (and ==, !=, <, <=, >, >=, greaterthan,
 *               lessthan);
 *   methods     str: capitalize casefold center count endswith find format
 *               index isalnum isalpha isdecimal isdigit islower isnumeric
 *               isspace isupper join ljust lower lstrip removeprefix
 *               removesuffix replace rfind rindex rjust rsplit rstrip split
 *               splitlines startswith strip swapcase title upper zfill;
 *               dict: get items keys values copy; list: count index copy;
 *               loop.cycle, loop.changed;
 *   globals     range (at most 100000 items, as the sandbox), dict,
 *               namespace, raise_exception, strftime_now, cycler, joiner.
 * Values follow Python: str() and repr() of lists, dicts, floats (shortest
 * round trip), booleans and None as Python prints them; undefined values as
 * jinja2's default Undefined (printed as "", false, empty when iterated, an
 * error when called, indexed or used in arithmetic); map/select/items give
 * one-shot generators, as jinja2's do; lists and dicts cannot be changed
 * (the immutable sandbox: append, pop, update … are errors when called).
 * Not held (each an error naming it): extends/include/import/block (a chat
 * template is one text), recursive for loops, autoescape, line statements,
 * i18n, the filters wordwrap, striptags, urlize, xmlattr, filesizeformat,
 * pprint, random and urlencode. Integers are 64-bit (Python's are
 * unbounded: an overflow is an error). Unicode case mapping follows the
 * tables of scripts/gen-jinja-case.py (Python's); isalpha/isdigit use the
 * general categories of base/unicode.h.
 *
 * A template is untrusted input. Every render is bounded (struct
 * jinja_limits): the output size, the memory its values take, the
 * evaluation steps (a loop of 10^9 iterations stops at the step bound), the
 * nesting of calls, loops and values; parsing bounds the source size and the
 * nesting of expressions and statements. Reaching a bound is an error with
 * the reason, never a hang or a crash; so is raise_exception, with its
 * message.
 *
 * User text: the render keeps track of which bytes of the output came from
 * strings of the user's data (struct jinja_input.user_json: messages,
 * request kwargs), through every string operation (concatenation, slicing,
 * strip, replace, split, join, case changes, tojson, format …), and returns
 * them as spans, so the caller can tokenize the template's own text with
 * its special tokens and the user's text as plain text.
 *
 * Ownership: jinja_compile returns a template the caller frees with
 * jinja_free; it is immutable and may be rendered by several threads at
 * once. jinja_render fills a struct jinja_output the caller frees with
 * jinja_output_free. Errors: KVB_ERR_FORMAT (a syntax error at compile
 * time; at render time the template raised or failed, e.g. called an
 * undefined value), KVB_ERR_RANGE (a bound was reached), KVB_ERR_NOMEM,
 * KVB_ERR_INVALID_ARG (bad arguments, e.g. user_json not a JSON object);
 * err says what, with the template's name and line. */
#ifndef KVB_JINJA_H
#define KVB_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct jinja_template;

struct jinja_limits {
    size_t max_source;  /* template bytes (default 256 KiB; real chat templates are under 20 KiB) */
    uint32_t max_nest;  /* nesting of expressions and blocks in the source, chains of operators,
                           filters and attributes counted (default 200) */
    size_t max_output;  /* bytes one render may write (default 16 MiB) */
    size_t max_memory;  /* bytes one render's values may take (default 256 MiB) */
    uint64_t max_steps; /* evaluation steps of one render (default 10 million: about 0.1 s) */
    uint32_t max_depth; /* nesting of evaluation at render time: statements, expressions, macro
                           calls, loops, values printed or compared (default 1000) */
};

/* The defaults above. */
void jinja_limits_default(struct jinja_limits *lim);

/* Compiles src[0..len) (UTF-8). name labels errors ("model", a file name).
 * lim NULL: the defaults. */
enum kvb_status jinja_compile(const char *src, size_t len, const char *name, const struct jinja_limits *lim,
                              struct jinja_template **out, struct kvb_err *err);
void jinja_free(struct jinja_template *t); /* accepts NULL */

/* Whether the template's source text contains s (transformers checks that a
 * template names the field continue_final_message continues). */
bool jinja_source_contains(const struct jinja_template *t, const char *s);

/* A variable whose value is a string of the template's side (not user
 * text): bos_token, eos_token. */
struct jinja_strvar {
    const char *name;
    const char *value; /* NUL-terminated */
};

/* A chat message, given without a copy: its strings are read in place
 * while the render runs. */
struct jinja_msg {
    const char *role;
    const char *content;
    size_t content_len;
};

struct jinja_input {
    const struct jinja_strvar *strs; /* (n_strs) set first */
    size_t n_strs;
    /* The variable "messages": a list of {"role", "content"} dicts (user
     * text), built over the caller's strings (a message of megabytes is
     * not copied to be rendered). NULL: none (or given in user_json). */
    const struct jinja_msg *msgs;
    size_t n_msgs;
    /* A JSON object whose members are variables (they replace strs of the
     * same name): messages, add_generation_prompt, tools, request kwargs.
     * Its strings (keys included) are user text. NULL: none. */
    const char *user_json;
    size_t user_json_len;
    int64_t now; /* strftime_now's time (unix seconds, local time zone); 0: the clock's */
};

/* Bytes [off, off+len) of the output came from user text. */
struct jinja_span {
    size_t off, len;
};

struct jinja_output {
    char *text; /* (len) bytes, NUL-terminated */
    size_t len;
    struct jinja_span *user; /* (n_user) sorted, disjoint, not adjacent */
    size_t n_user;
};

/* Renders t with in's variables within lim (NULL: the template's). The
 * output, memory and step bounds grow with the input, so that a message of
 * megabytes renders where a template would refuse to amplify a small one:
 * the output by twice the input's bytes, the memory by four times, the
 * steps by one per byte (four copies of it built). On error out holds
 * nothing to free. */
enum kvb_status jinja_render(const struct jinja_template *t, const struct jinja_input *in,
                             const struct jinja_limits *lim, struct jinja_output *out, struct kvb_err *err);
void jinja_output_free(struct jinja_output *o); /* accepts a zeroed one */

#endif
