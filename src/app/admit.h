/* admit.h — a parsed request line made ready to run: what `kvbatch run` does
 * between job_parse_line and sched_submit.
 *
 * For each prompt of the request: the token ids (the chat template applied
 * to messages, a text prompt encoded, or token ids taken as given), checked
 * against the context; then every check that needs the model (token ids in
 * the vocabulary for prompts, logit_bias and stop_token_ids; JSON mode's
 * token table) and the sampler parameters each choice starts from. A line
 * that cannot run gets a job_error naming the line and the field. Kept
 * apart from the run loop so that a fuzz target drives exactly this code
 * (tests/fuzz/fuzz_admit.c), and `kvbatch render` shows what run would
 * prefill by calling the same functions: the template run would choose,
 * the context it would check against, the checks of a line before it is
 * prepared, and the text each prompt is tokenized from.
 *
 * Ownership: struct admit_ctx borrows the tokenizer and template and owns
 * the JSON-mode table it builds on first use (admit_ctx_free, after every
 * sampler that borrows it is gone); struct admit_plan owns its arrays
 * (admit_plan_free), and its sampler parameters point into them. */
#ifndef KVB_ADMIT_H
#define KVB_ADMIT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "jobs/job.h"
#include "text/chat.h"
#include "text/tok.h"

struct tok;
struct grammar_vocab;
struct model;

struct admit_ctx {
    const struct tok *tok;
    const struct chat_template *tmpl; /* NULL: chat lines fail with tmpl_error (unless they bring one) */
    const char *tmpl_error;           /* why there is no template (NUL-terminated) */
    char *bos_text, *eos_text;        /* the vocabulary's BOS and EOS as text (owned; NULL: none), for a
                                         request's own chat_template */
    int64_t now;                      /* strftime_now's clock for every line (unix seconds; 0: the clock's);
                                         a run sets it once so its lines agree */
    int32_t n_vocab;                  /* width of the model's logits */
    int32_t n_ctx;                    /* positions one sequence may reach; 0: no context check */
    int32_t *eog;                     /* (n_eog) end-of-generation ids, found by admit_ctx_init */
    int32_t n_eog;
    struct grammar_vocab *gvocab;        /* built for the first request with a constraint (owned) */
    const volatile sig_atomic_t *cancel; /* non-NULL: a long tokenization stops once it is nonzero
                                            (KVB_ERR_CANCELLED); set by the caller after init */
};

/* The chat template run renders chat lines with: the one name names (a
 * built-in family, one of the model's named templates
 * tokenizer.chat_template.NAME, or a Jinja file), else the model's own
 * tokenizer.chat_template; a Jinja template gets the vocabulary's BOS and
 * EOS text (none when tok is NULL: kvbatch info on a refused tokenizer). KVB_OK with *have true and *out filled (free it with
 * chat_template_free), or with *have false and why (why_cap bytes,
 * NUL-terminated) saying why there is none (the model has no template, or
 * its template does not compile): completion lines still run, chat lines
 * then fail with that message. KVB_ERR_INVALID_ARG with err when name is
 * neither a template's name nor a file that compiles (a bad command line). */
enum kvb_status admit_template_choose(const struct model *m, const struct tok *tok, const char *name,
                                      struct chat_template *out, bool *have, char *why, size_t why_cap,
                                      struct kvb_err *err);

/* The time chat templates see (strftime_now): $SOURCE_DATE_EPOCH when set
 * (the reproducible-builds convention; tests fix the date with it), else
 * the clock's. */
int64_t admit_clock(void);

/* What q's chat prompt is rendered with, as render and summaries name it
 * ("request@HASH" for a request's own chat_template, "none"). */
void admit_template_label(const struct admit_ctx *ctx, const struct job_request *q, char *buf, size_t cap);

/* The context one sequence may fill: asked (--ctx) when > 0, else the
 * model's trained context, at most 4096. */
int32_t admit_n_ctx(const struct model *m, int32_t asked);

/* Fills ctx (tmpl may be NULL with tmpl_error saying why). KVB_ERR_NOMEM. */
enum kvb_status admit_ctx_init(struct admit_ctx *ctx, const struct tok *tok, const struct chat_template *tmpl,
                               const char *tmpl_error, int32_t n_vocab, int32_t n_ctx);
void admit_ctx_free(struct admit_ctx *ctx); /* accepts a zeroed ctx */

struct admit_prompt {
    int32_t *ids; /* (n) */
    int32_t n;    /* >= 1 and < n_ctx */
};

struct admit_plan {
    struct admit_prompt *prompts; /* (n_prompts): chat 1, completion the request's n_prompts */
    int32_t n_prompts;
    int32_t n_choices;         /* n_prompts x n: choice c runs prompt c / n with seed + c % n */
    struct sampler_params sp;  /* choice 0's parameters; admit_choice_params gives each choice's */
    struct sampler_bias *bias; /* (sp.n_bias) logit_bias */
    int32_t *ban;              /* (sp.n_ban) what min_tokens holds back: end of generation (unless
                                     ignore_eos) and stop_token_ids */
    struct grammar *grammar;   /* sp.grammar: the request's constraint, compiled (owned) */
};

/* The checks of an input line around job_parse_line, in run's order:
 * admit_check_length before parsing (a line longer than the reader's limit
 * is an error line, not parsed), admit_check_unique after it (a custom_id
 * an earlier line of the input used is a duplicate_custom_id error; seen
 * collects the ids of the lines that parsed). KVB_ERR_FORMAT with e a 400
 * error, KVB_ERR_NOMEM with e a server_error. */
enum kvb_status admit_check_length(const struct job_line *ln, struct job_error *e);
enum kvb_status admit_check_unique(struct job_idset *seen, const struct job_request *q, struct job_error *e);

/* Compiles q's output constraint (*out NULL when it has none) into one
 * grammar: json_object and json_schema through grammar_schema.h, regex
 * through grammar_regex.h, choice as an alternation of literals, a GBNF
 * grammar as written. Run as the last step of reading the line: a
 * constraint the engine refuses is a bad field value like a temperature of
 * 5, so e is a 400 error keyed by line (e->by_line) naming the field, as
 * for a line that does not parse, and the custom_id stays free for a later
 * line. KVB_OK (*out owned by the caller, or by the plan it is given to);
 * KVB_ERR_FORMAT; KVB_ERR_NOMEM with e a server_error. */
enum kvb_status admit_constraint(const struct job_request *q, struct grammar **out, struct job_error *e);

/* Prepares q, whose compiled constraint (admit_constraint; NULL without
 * one) the plan takes over whatever the result. KVB_OK with *plan filled;
 * KVB_ERR_FORMAT with e a 400 error
 * (a line that cannot run on this model; a prompt too long for the context
 * is found without tokenizing all of it); KVB_ERR_NOMEM with e a
 * server_error; KVB_ERR_CANCELLED when ctx->cancel stopped it (no error
 * line is due: the line was not judged). *plan holds nothing to free unless
 * KVB_OK. */
enum kvb_status admit_prepare(struct admit_ctx *ctx, const struct job_request *q, struct grammar *grammar,
                              struct admit_plan *plan, struct job_error *e);
void admit_plan_free(struct admit_plan *plan); /* accepts a zeroed plan */

/* The sampler parameters of choice c (< plan->n_choices). */
void admit_choice_params(const struct admit_plan *plan, const struct job_request *q, int32_t c,
                         struct sampler_params *out);

/* Prompt k's token ids, at most max_ids of them (0: no bound; more is a
 * context_length_exceeded error), without ctx's context check (the shard
 * plan, which must not depend on --ctx, passes its own bound): *ids is
 * kvb_malloc'd, the caller frees it. The same results as admit_prepare for
 * that prompt. */
enum kvb_status admit_prompt_ids(const struct admit_ctx *ctx, const struct job_request *q, int32_t k, size_t max_ids,
                                 int32_t **ids, size_t *n, struct job_error *e);

/* The text prompt k of q is tokenized from, and how: the chat template
 * applied to the messages (tokenized with TOK_PARSE_SPECIAL: the template's
 * control-token text is those tokens, but the messages' text, in plain, is
 * plain text whatever it holds), or a completion's prompt text (plain
 * text); BOS by the tokenizer's rule, except after a Jinja template (it
 * writes bos_token itself). text is NULL for a prompt given as token ids,
 * which are used as they are. What admit_prompt_ids tokenizes, so what
 * `kvbatch render` prints. KVB_ERR_FORMAT / KVB_ERR_NOMEM with e as
 * admit_prompt_ids. Free with admit_text_free whatever the result. */
struct admit_text {
    const char *text; /* (len) bytes, NUL-terminated; NULL: token ids */
    size_t len;
    unsigned flags;         /* enum tok_flags for tok_encode */
    char *owned;            /* the rendered chat text (text points at it), or NULL */
    struct tok_span *plain; /* (n_plain) the user's text in a chat prompt (owned), for tok_limits.plain */
    size_t n_plain;
};
enum kvb_status admit_prompt_text(const struct admit_ctx *ctx, const struct job_request *q, int32_t k,
                                  struct admit_text *out, struct job_error *e);
void admit_text_free(struct admit_text *t); /* accepts a zeroed one */

/* Whether token is one of q's stop_token_ids. */
bool admit_is_stop_token(const struct job_request *q, int32_t token);

#endif
