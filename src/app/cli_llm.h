/* cli_llm.h — what the single-sequence commands (generate, logits) share:
 * loading a model, its tokenizer and a CPU backend, and turning a prompt
 * (plain or chat) into token ids. Prints its own error messages. */
#ifndef KVB_CLI_LLM_H
#define KVB_CLI_LLM_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "text/tok.h"

struct cli_llm {
    struct model *model;
    struct tok *tok;
    struct backend *be;
    int32_t n_ctx;
};

struct cli_llm_opts {
    const char *model_path;
    int n_threads;
    int32_t n_ctx;        /* 0: min(trained context, 4096) */
    enum mm_impl kernels; /* --kernels (--scalar: MM_IMPL_SCALAR); MM_IMPL_AUTO when zeroed */
    const char *device;   /* --device: auto | cpu | cuda[:N] */
    enum kv_type kv_type; /* --kv-type (KV_F16 when zeroed) */
    bool act16;           /* --activations 16 */
};

/* Returns false (after printing why) on failure; cli_llm_close is safe then. */
bool cli_llm_open(const struct cli_llm_opts *o, struct cli_llm *out);
void cli_llm_close(struct cli_llm *l);

/* Tokenizes a prompt. chat: wrap `prompt` as a user message (with `system`
 * if non-NULL) in the model's chat template (or template_name when given).
 * BOS is added when the tokenizer asks for it. Returns false on failure. */
bool cli_llm_prompt(const struct cli_llm *l, const char *prompt, bool chat, const char *system,
                    const char *template_name, int32_t **ids, size_t *n);

/* Parses a prompt given as token ids (--prompt-ids "1 2 3": decimal ids
 * separated by spaces, tabs, newlines or commas), taken as they are: no
 * template, no BOS. Every id must be below the model's vocabulary size.
 * `cmd` names the command in messages. Returns CLI_EXIT_OK with *ids (the
 * caller frees it with kvb_free) and *n (0 for an empty list), else
 * CLI_EXIT_USAGE for a bad list or CLI_EXIT_FAIL when out of memory, after
 * printing why; *ids is NULL then. */
int cli_llm_prompt_ids(const struct cli_llm *l, const char *cmd, const char *list, int32_t **ids, size_t *n);

#endif
