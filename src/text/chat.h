/* chat.h — chat templates applied in C.
 *
 * kvbatch does not run Jinja. It recognises the common template families from
 * the text of `tokenizer.chat_template` and formats messages itself. An
 * unknown template is an error (the CLI offers --chat-template NAME).
 *
 * Ownership: chat_apply returns a kvb_malloc'd NUL-terminated string, caller
 * frees. chat_detect copies nothing it returns beyond the default system
 * prompt, which it kvb_mallocs into *out (freed by chat_template_free). */
#ifndef KVB_CHAT_H
#define KVB_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

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
    enum chat_family family;
    char *default_system;        /* system prompt the template inserts when none is given, or NULL */
    struct chat_mistral mistral; /* CHAT_MISTRAL only */
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
void chat_template_free(struct chat_template *t); /* frees default_system; accepts NULL */
const char *chat_family_name(enum chat_family f);
/* The name of t's formatting: its family's, with Mistral's variants told
 * apart by the names chat_template_from_name gives them ("mistral",
 * "mistral-v3", "mistral-tekken"), or "mistral-detected" for a variant read
 * from a model's template that none of them formats. (A detected ChatML
 * template's default system prompt is not part of the name.) */
const char *chat_template_name(const struct chat_template *t);

/* Formats msgs and, when add_generation_prompt, the opening of the
 * assistant's turn. The result contains special-token text (e.g.
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
