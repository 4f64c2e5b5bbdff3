/* chat.h — chat templates: the model's own Jinja template, rendered as
 * Hugging Face transformers renders it (text/jinja.h), or one of nine
 * built-in families applied in C (for model files that carry no template).
 *
 * The model's template is tokenizer.chat_template from its GGUF (or a named
 * one, tokenizer.chat_template.NAME), rendered with the messages,
 * add_generation_prompt, tools and documents as none, the vocabulary's
 * bos_token and eos_token, and the request's chat_template_kwargs, exactly
 * as apply_chat_template passes them; continue_final_message follows
 * transformers (a tag appended to the final message marks where the text
 * is cut). The rendered text says which bytes are the user's (message
 * contents, kwargs): those are tokenized as plain text, the template's own
 * control-token text as control tokens.
 *
 * The built-in families are recognised by name (chat_template_from_name);
 * chat_template_detect still recognises a family from a template's text.
 *
 * Ownership: chat_apply returns a kvb_malloc'd NUL-terminated string, caller
 * frees. A struct chat_template owns what it holds (its default system
 * prompt, the compiled Jinja template, the token strings) until
 * chat_template_free; it is immutable once made and may be used by several
 * threads. chat_render fills a struct jinja_output the caller frees with
 * jinja_output_free. */
#ifndef KVB_CHAT_H
#define KVB_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "text/jinja.h"

enum chat_family {
    CHAT_CHATML = 0, /* <|im_start|>role\n…<|im_end|>\n (SmolLM2, Qwen2) */
    CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|> */
    CHAT_LLAMA2,     /* [INST] <<SYS>>…<</SYS>> … [/INST] (Llama 2) */
    CHAT_ZEPHYR,     /* <|system|>\n…</s>\n<|user|>\n… (TinyLlama-chat) */
    CHAT_GEMMA,      /* <start_of_turn>user\n…<end_of_turn>\n */
    CHAT_LLAMA31,    /* Llama 3's turns after a system turn that always opens with the knowledge-cutoff
                         and date lines of Llama 3.1 / 3.2 / 3.3 */
    CHAT_MISTRAL,    /* [INST] … [/INST] without <<SYS>>; spacing and system placement vary by
                         version (struct chat_mistral) */
    CHAT_FAMILY_COUNT_
};

/* Mistral's [INST] templates differ by tokenizer version in a few spaces
 * and in where the system prompt goes (Mistral has no system turn: it is
 * prepended to a user turn, separated by a blank line):
 *   v1 (7B v0.1/v0.2, Mixtral 8x7B): "[INST] u [/INST] a</s>", system on the first user turn
 *                                    (older revisions: no space before the reply);
 *   v3 (7B v0.3):                    "[INST] u[/INST] a</s>", reply trimmed, system on the
 *                                    last message when it is a user turn (else dropped);
 *   tekken (Nemo):                   "[INST]u[/INST]a</s>", system as v3
 *                                    (Ministral's template: on the first user turn).
 * Detection reads each from the template's literals. */
struct chat_mistral {
    bool open_space;  /* "[INST] " rather than "[INST]" */
    bool close_space; /* " [/INST]" rather than "[/INST]" */
    bool reply_space; /* " " before a reply */
    bool reply_trim;  /* the reply trimmed */
    bool system_last; /* system prompt on the last message if a user turn, not the first user turn */
};

struct chat_template {
    enum chat_family family;      /* the built-in family, when jinja is NULL */
    char *default_system;         /* system prompt the template inserts when none is given, or NULL */
    struct chat_mistral mistral;  /* CHAT_MISTRAL only */
    struct jinja_template *jinja; /* the template's own text, compiled; NULL: a built-in family */
    char source[192];             /* where it came from, as `render` and the run's settings name it:
                                    "tokenizer.chat_template", a file's path, "request", "chatml" … */
    char hash[17];                /* the text's FNV-1a 64 in hex ("" for a built-in family) */
    char *bos_token, *eos_token;  /* the vocabulary's, given to the template (NULL: none) */
};

struct chat_msg {
    const char *role;    /* "system", "user", "assistant", "developer" (ChatML and Llama 3 families only:
                            rendered as their templates render any role; refused by the others) */
    const char *content; /* NUL-terminated */
};

/* Recognises a family from template text (len bytes, need not be NUL-terminated).
 * KVB_ERR_UNSUPPORTED with a message when it cannot. */
enum kvb_status chat_template_detect(const char *text, size_t len, struct chat_template *out, struct kvb_err *err);
/* By name: "chatml", "llama3", "llama31", "llama2", "mistral" (v1), "mistral-v3",
 * "mistral-tekken", "zephyr", "gemma". */
enum kvb_status chat_template_from_name(const char *name, struct chat_template *out, struct kvb_err *err);
/* Compiles text (len bytes) as a Jinja template; source names it in
 * errors and summaries. KVB_ERR_FORMAT with the syntax error, KVB_ERR_RANGE
 * for a template over the size bound. */
enum kvb_status chat_template_from_text(const char *text, size_t len, const char *source, struct chat_template *out,
                                        struct kvb_err *err);
/* The same with the bounds its renders keep (NULL: jinja's defaults). */
enum kvb_status chat_template_from_text_limited(const char *text, size_t len, const char *source,
                                                const struct jinja_limits *lim, struct chat_template *out,
                                                struct kvb_err *err);
/* The strings the template sees as bos_token and eos_token (copied; NULL:
 * undefined). KVB_ERR_NOMEM. */
enum kvb_status chat_template_set_tokens(struct chat_template *t, const char *bos, const char *eos);
void chat_template_free(struct chat_template *t); /* frees what it holds; accepts NULL */
/* The built-in families' names, comma-separated ("chatml, llama3, …"). */
const char *chat_builtin_names(void);
/* Whether text rendered by t holds the BOS the model wants already: a Jinja
 * template writes bos_token itself (apply_chat_template tokenizes its text
 * adding no special tokens); a built-in family leaves BOS to the caller. */
bool chat_template_writes_bos(const struct chat_template *t);
const char *chat_family_name(enum chat_family f);
/* The name of t's formatting: its family's, with Mistral's variants told
 * apart by the names chat_template_from_name gives them ("mistral",
 * "mistral-v3", "mistral-tekken"), or "mistral-detected" for a variant read
 * from a model's template that none of them formats. (A detected ChatML
 * template's default system prompt is not part of the name.) */
const char *chat_template_name(const struct chat_template *t);

/* A chat request to render. */
struct chat_input {
    const struct chat_msg *msgs;
    size_t n;
    bool add_generation_prompt;
    bool continue_final_message; /* the last message left open (add_generation_prompt must be false) */
    const char *kwargs_json;     /* chat_template_kwargs: a JSON object (its strings are user text), or NULL */
    size_t kwargs_len;
    int64_t now; /* strftime_now's clock (unix seconds); 0: the time of the call */
};

/* Renders in with t: the text and the spans of it that are the user's.
 * Errors (KVB_ERR_FORMAT: the template raised or failed; KVB_ERR_RANGE: a
 * bound; KVB_ERR_INVALID_ARG / KVB_ERR_UNSUPPORTED: a request the template
 * cannot take, e.g. kwargs for a built-in family, a reserved kwarg, a final
 * message the template does not write) say why, naming the template. */
enum kvb_status chat_render(const struct chat_template *t, const struct chat_input *in, struct jinja_output *out,
                            struct kvb_err *err);

/* A short text naming t, as `render` and the run's settings print it: its
 * source and the first 12 hex digits of its hash for a Jinja template
 * ("tokenizer.chat_template@a1b2c3d4e5f6"), the name of a built-in family
 * ("chatml"). */
void chat_template_describe(const struct chat_template *t, char *buf, size_t cap);
/* The hash chat_template_from_text records for text (16 hex digits + NUL). */
void chat_text_hash(const char *text, size_t len, char out[17]);

/* A built-in family's text (t->jinja NULL): formats msgs and, when
 * add_generation_prompt, the opening of the assistant's turn. The result contains special-token text (e.g.
 * "<|im_start|>") to be tokenized with TOK_PARSE_SPECIAL. BOS is not
 * included: the caller adds it by the tokenizer's rule. */
enum kvb_status chat_apply(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                           bool add_generation_prompt, char **out, struct kvb_err *err);

/* As chat_apply without a generation prompt, but with the last message (an
 * assistant's) left open so that generation continues it, as Hugging Face's
 * continue_final_message does: the text is cut just after the last
 * occurrence of that message's content (or of the content trimmed of
 * whitespace, for templates that trim it). KVB_ERR_INVALID_ARG when the last
 * message is not the assistant's, KVB_ERR_UNSUPPORTED when the template
 * does not write it. */
enum kvb_status chat_apply_continue(const struct chat_template *t, const struct chat_msg *msgs, size_t n, char **out,
                                    struct kvb_err *err);

#endif
