/* test_chat.c — chat-template detection on real template texts (SmolLM2's
 * exactly as its GGUF stores it, Qwen2.5, Llama 2/3, Mistral, TinyLlama,
 * Gemma, Phi-3) and the exact strings each family renders for a few
 * conversations, compared with what Hugging Face's apply_chat_template gives
 * for the official templates (BOS left out: the caller adds it). */
#include <string.h>

#include "base/alloc.h"
#include "support/testutil.h"
#include "text/chat.h"

/* SmolLM2-135M-Instruct's tokenizer.chat_template as its GGUF stores it:
 * the newlines inside the quotes are real newline characters. */
static const char SMOLLM2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/* The same with Jinja escapes (as tokenizer_config.json shows it). */
static const char SMOLLM2_ESCAPED[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

/* Qwen2.5-Instruct (abridged tool branch): the first literals only open a
 * system turn around the caller's content; the default comes later. */
static const char QWEN25[] =
    "{# a comment with '<|im_start|>system\\nnot this<|im_end|>' #}"
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions.\\n\\n<tools>\" }}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}{%- if (message.role == \"user\") or (message.role == \"system\" and not "
    "loop.first) or (message.role == \"assistant\") %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/* OpenHermes-2.5: plain ChatML, no default system prompt. */
static const char CHATML_PLAIN[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char LLAMA3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* Llama 3.1 Instruct's template, abridged (tool branches cut): the system
 * turn is always emitted, with the cutoff and the default date. */
static const char LLAMA31[] =
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = "
    "messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set "
    "system_message = \"\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}";

static const char LLAMA2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char MISTRAL[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

/* Mistral 7B v0.1/v0.2 in later revisions: a space before the reply, untrimmed; the system prompt on
 * the first user turn. */
static const char MISTRAL_V2[] =
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token}}{%- endif %}{%- endfor %}";

/* Mistral 7B v0.3's shape: system prompt on the last user turn, no space before [/INST], a space and
 * a trimmed reply. */
static const char MISTRAL_V3[] =
    "{%- if messages[0][\"role\"] == \"system\" %}{%- set system_message = messages[0][\"content\"] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message[\"role\"] == \"user\" %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}"
    "{%- else %}{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}{%- endif %}"
    "{%- elif message[\"role\"] == \"assistant\" %}{{- \" \" + message[\"content\"]|trim + eos_token}}"
    "{%- endif %}{%- endfor %}";

/* Ministral's shape (Tekken): no spaces, system prompt on the first user turn. */
static const char MINISTRAL[] =
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- '[INST]' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token}}{%- endif %}{%- endfor %}";

/* Mistral's later templates give the system prompt a turn of its own. */
static const char MISTRAL_V7[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
    "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
    "message['content'] + eos_token }}{% endif %}{% endfor %}";

/* TinyLlama-1.1B-Chat: Zephyr with eos_token rather than a literal </s>. */
static const char TINYLLAMA[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

static const char ZEPHYR_LITERAL[] =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + "
    "'</s>\n' }}{% elif message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '</s>\n' }}"
    "{% else %}{{ '<|assistant|>\n' + message['content'] + '</s>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";

static const char GEMMA[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

static const char PHI3[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";

static const char ALPACA[] =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '### Instruction:\n' + "
    "message['content'] + '\n\n' }}{% else %}{{ '### Response:\n' + message['content'] + '\n\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '### Response:\n' }}{% endif %}";

static void check_detect(const char *what, const char *text, enum chat_family want, const char *want_system)
{
    struct chat_template t;
    struct kvb_err err = {{0}};
    enum kvb_status st = chat_template_detect(text, strlen(text), &t, &err);
    CHECK_MSG(st == KVB_OK, "%s: %s", what, err.msg);
    if (st != KVB_OK) return;
    CHECK_MSG(t.family == want, "%s: detected %s, want %s", what, chat_family_name(t.family), chat_family_name(want));
    if (want_system)
        CHECK_MSG(t.default_system && strcmp(t.default_system, want_system) == 0, "%s: default system [%s]", what,
                  t.default_system ? t.default_system : "(null)");
    else CHECK_MSG(t.default_system == NULL, "%s: unexpected default system [%s]", what, t.default_system);
    chat_template_free(&t);
}

static void check_mistral(const char *what, const char *text, struct chat_mistral want)
{
    struct chat_template t;
    struct kvb_err err = {{0}};
    CHECK_EQ_INT(chat_template_detect(text, strlen(text), &t, &err), KVB_OK);
    CHECK_MSG(t.family == CHAT_MISTRAL, "%s: detected %s", what, chat_family_name(t.family));
    CHECK_MSG(t.mistral.open_space == want.open_space && t.mistral.close_space == want.close_space &&
                  t.mistral.reply_space == want.reply_space && t.mistral.reply_trim == want.reply_trim &&
                  t.mistral.system_last == want.system_last,
              "%s: variant open %d close %d reply %d trim %d last %d", what, t.mistral.open_space,
              t.mistral.close_space, t.mistral.reply_space, t.mistral.reply_trim, t.mistral.system_last);
    chat_template_free(&t);
}

static void check_unsupported(const char *what, const char *text, size_t len, const char *msg_part)
{
    struct chat_template t;
    struct kvb_err err = {{0}};
    CHECK_EQ_INT(chat_template_detect(text, len, &t, &err), KVB_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, msg_part) != NULL, "%s: message [%s] lacks [%s]", what, err.msg, msg_part);
    CHECK(strstr(err.msg, "--chat-template") != NULL);
    chat_template_free(&t); /* harmless after a failure */
}

static void test_detect(void)
{
    check_detect("SmolLM2 (GGUF)", SMOLLM2, CHAT_CHATML, SMOLLM2_SYSTEM);
    check_detect("SmolLM2 (escaped)", SMOLLM2_ESCAPED, CHAT_CHATML, SMOLLM2_SYSTEM);
    check_detect("Qwen2.5", QWEN25, CHAT_CHATML,
                 "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    check_detect("OpenHermes", CHATML_PLAIN, CHAT_CHATML, NULL);
    check_detect("Llama 3", LLAMA3, CHAT_LLAMA3, NULL);
    check_detect("Llama 3.1", LLAMA31, CHAT_LLAMA31, NULL);
    check_detect("Llama 2", LLAMA2, CHAT_LLAMA2, NULL);
    check_mistral("Mistral v0.1 (first revision)", MISTRAL, (struct chat_mistral){true, true, false, false, false});
    check_mistral("Mistral v0.2", MISTRAL_V2, (struct chat_mistral){true, true, true, false, false});
    check_mistral("Mistral v0.3", MISTRAL_V3, (struct chat_mistral){true, false, true, true, true});
    check_mistral("Ministral", MINISTRAL, (struct chat_mistral){false, false, false, false, false});
    check_detect("TinyLlama", TINYLLAMA, CHAT_ZEPHYR, NULL);
    check_detect("Zephyr literal", ZEPHYR_LITERAL, CHAT_ZEPHYR, NULL);
    check_detect("Gemma", GEMMA, CHAT_GEMMA, NULL);

    check_unsupported("Phi-3", PHI3, strlen(PHI3), "Phi-3");
    check_unsupported("Alpaca", ALPACA, strlen(ALPACA), "not recognised");
    check_unsupported("Mistral v7", MISTRAL_V7, strlen(MISTRAL_V7), "[SYSTEM_PROMPT]");
    check_unsupported("empty", "", 0, "no chat template");
    check_unsupported("NULL", NULL, 0, "no chat template");
    /* len bounds the text: markers past it do not count */
    const char cut[] = "{{ messages }}<|im_start|>";
    check_unsupported("bounded", cut, strlen("{{ messages }}"), "not recognised");

    /* SmolLM2's template cut short inside its default literal: still ChatML,
     * but no (half) default prompt. */
    struct chat_template t;
    CHECK_EQ_INT(chat_template_detect(SMOLLM2, 120, &t, NULL), KVB_OK);
    CHECK(t.family == CHAT_CHATML && t.default_system == NULL);
    chat_template_free(&t);
    chat_template_free(NULL);
}

static void test_names(void)
{
    const char *names[] = {"chatml",     "llama3",         "llama31", "llama2", "mistral",
                           "mistral-v3", "mistral-tekken", "zephyr",  "gemma"};
    const enum chat_family fam[] = {CHAT_CHATML,  CHAT_LLAMA3,  CHAT_LLAMA31, CHAT_LLAMA2, CHAT_MISTRAL,
                                    CHAT_MISTRAL, CHAT_MISTRAL, CHAT_ZEPHYR,  CHAT_GEMMA};
    for (int i = 0; i < 9; i++) {
        struct chat_template t;
        CHECK_EQ_INT(chat_template_from_name(names[i], &t, NULL), KVB_OK);
        CHECK_EQ_INT(t.family, fam[i]);
        CHECK(t.default_system == NULL);
        /* render reports the name that gives this formatting */
        CHECK_MSG(strcmp(chat_template_name(&t), names[i]) == 0, "%s named %s", names[i], chat_template_name(&t));
        chat_template_free(&t);
    }
    for (int f = 0; f < CHAT_FAMILY_COUNT_; f++) {
        struct chat_template t;
        CHECK_EQ_INT(chat_template_from_name(chat_family_name((enum chat_family)f), &t, NULL), KVB_OK);
        CHECK_EQ_INT(t.family, f);
    }
    struct chat_template t;
    struct kvb_err err = {{0}};
    CHECK_EQ_INT(chat_template_from_name("vicuna", &t, &err), KVB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "vicuna") && strstr(err.msg, "chatml"));
    CHECK_EQ_INT(chat_template_from_name(NULL, &t, NULL), KVB_ERR_INVALID_ARG);
    CHECK_EQ_INT(chat_template_from_name("mistral", &t, NULL), KVB_OK);
    t.mistral.reply_space = false; /* an older v1 revision, which no name gives */
    CHECK(strcmp(chat_template_name(&t), "mistral-detected") == 0);
}

static const struct chat_msg SYS_USER[] = {{"system", "You are terse."}, {"user", "Hi there"}};
static const struct chat_msg USER[] = {{"user", "Hi there"}};
static const struct chat_msg MULTI[] = {
    {"user", "Hi"}, {"assistant", "Hello! How can I help?"}, {"user", "What is 2+2?"}};

static void check_apply(const char *what, const struct chat_template *t, const struct chat_msg *m, size_t n, bool gen,
                        const char *want)
{
    char *got = NULL;
    struct kvb_err err = {{0}};
    enum kvb_status st = chat_apply(t, m, n, gen, &got, &err);
    CHECK_MSG(st == KVB_OK, "%s: %s", what, err.msg);
    if (st != KVB_OK) return;
    CHECK_MSG(strcmp(got, want) == 0, "%s:\n got [%s]\nwant [%s]", what, got, want);
    kvb_free(got);
}

static void check_turns(const char *what, const struct chat_template *t, const char *sys_user, const char *user,
                        const char *multi, const char *gen)
{
    char buf[1024];
    check_apply(what, t, SYS_USER, 2, false, sys_user);
    snprintf(buf, sizeof buf, "%s%s", sys_user, gen);
    check_apply(what, t, SYS_USER, 2, true, buf);
    check_apply(what, t, USER, 1, false, user);
    snprintf(buf, sizeof buf, "%s%s", user, gen);
    check_apply(what, t, USER, 1, true, buf);
    check_apply(what, t, MULTI, 3, false, multi);
    snprintf(buf, sizeof buf, "%s%s", multi, gen);
    check_apply(what, t, MULTI, 3, true, buf);
}

static void check_family(const char *what, enum chat_family f, const char *default_system, const char *sys_user,
                         const char *user, const char *multi, const char *gen)
{
    struct chat_template t = {.family = f, .default_system = (char *)default_system};
    check_turns(what, &t, sys_user, user, multi, gen);
}

static void test_apply(void)
{
    check_family("chatml", CHAT_CHATML, NULL,
                 "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n",
                 "<|im_start|>user\nHi there<|im_end|>\n",
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
                 "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
                 "<|im_start|>assistant\n");
    check_family("chatml + SmolLM2 default", CHAT_CHATML, SMOLLM2_SYSTEM,
                 "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n",
                 "<|im_start|>system\n" SMOLLM2_SYSTEM "<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n",
                 "<|im_start|>system\n" SMOLLM2_SYSTEM "<|im_end|>\n"
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
                 "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
                 "<|im_start|>assistant\n");
    check_family("llama3", CHAT_LLAMA3, NULL,
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
                 "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
                 "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
#define L31_HEAD                                                                                                       \
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"                            \
    "Today Date: 26 Jul 2024\n\n"
    check_family("llama31", CHAT_LLAMA31, NULL,
                 L31_HEAD "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
                 L31_HEAD "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
                 L31_HEAD "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
                          "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_family("llama2", CHAT_LLAMA2, NULL, "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST]",
                 "[INST] Hi there [/INST]",
                 "[INST] Hi [/INST] Hello! How can I help? </s><s>[INST] What is 2+2? [/INST]",
                 ""); /* the closing [/INST] is the cue: no generation prompt */
    /* Mistral's versions, by their presets (what detection fills in). */
    struct chat_template mv1, mv3, mtk;
    CHECK_EQ_INT(chat_template_from_name("mistral", &mv1, NULL), KVB_OK);
    CHECK_EQ_INT(chat_template_from_name("mistral-v3", &mv3, NULL), KVB_OK);
    CHECK_EQ_INT(chat_template_from_name("mistral-tekken", &mtk, NULL), KVB_OK);
    check_turns("mistral v1", &mv1, "[INST] You are terse.\n\nHi there [/INST]", "[INST] Hi there [/INST]",
                "[INST] Hi [/INST] Hello! How can I help?</s>[INST] What is 2+2? [/INST]", "");
    check_turns("mistral v3", &mv3, "[INST] You are terse.\n\nHi there[/INST]", "[INST] Hi there[/INST]",
                "[INST] Hi[/INST] Hello! How can I help?</s>[INST] What is 2+2?[/INST]", "");
    check_turns("mistral tekken", &mtk, "[INST]You are terse.\n\nHi there[/INST]", "[INST]Hi there[/INST]",
                "[INST]Hi[/INST]Hello! How can I help?</s>[INST]What is 2+2?[/INST]", "");
    check_family("zephyr", CHAT_ZEPHYR, NULL, "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n",
                 "<|user|>\nHi there</s>\n",
                 "<|user|>\nHi</s>\n<|assistant|>\nHello! How can I help?</s>\n<|user|>\nWhat is 2+2?</s>\n",
                 "<|assistant|>\n");
    check_family("gemma", CHAT_GEMMA, NULL, "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n",
                 "<start_of_turn>user\nHi there<end_of_turn>\n",
                 "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello! How can I help?<end_of_turn>\n"
                 "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n",
                 "<start_of_turn>model\n");

    /* Trimming: Llama 3 and Gemma trim content (| trim), Llama 2 strips the
     * whole turn, ChatML and Zephyr keep it verbatim. */
    const struct chat_msg padded[] = {{"user", "  spaced out \n"}};
    struct chat_template t3 = {.family = CHAT_LLAMA3}, tg = {.family = CHAT_GEMMA}, t2 = {.family = CHAT_LLAMA2},
                         tc = {.family = CHAT_CHATML};
    check_apply("llama3 trim", &t3, padded, 1, false,
                "<|start_header_id|>user<|end_header_id|>\n\nspaced out<|eot_id|>");
    const struct chat_msg padded_sys[] = {{"system", " \n sys  "}, {"user", "  spaced out \n"}};
    struct chat_template t31 = {.family = CHAT_LLAMA31};
    check_apply("llama31 trim", &t31, padded_sys, 2, false,
                L31_HEAD "sys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nspaced out<|eot_id|>");
    check_apply("llama31 empty", &t31, NULL, 0, true,
                L31_HEAD "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    check_apply("gemma trim", &tg, padded, 1, false, "<start_of_turn>user\nspaced out<end_of_turn>\n");
    check_apply("llama2 strip", &t2, padded, 1, false, "[INST] spaced out [/INST]");
    check_apply("chatml verbatim", &tc, padded, 1, false, "<|im_start|>user\n  spaced out \n<|im_end|>\n");

    /* Edge conversations. */
    check_apply("chatml empty", &tc, NULL, 0, true, "<|im_start|>assistant\n");
    check_apply("chatml empty, no prompt", &tc, NULL, 0, false, "");
    const struct chat_msg sys_only[] = {{"system", "Be brief."}};
    check_apply("llama2 system only", &t2, sys_only, 1, false, "[INST] <<SYS>>\nBe brief.\n<</SYS>> [/INST]");
    check_apply("gemma system only", &tg, sys_only, 1, true,
                "<start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n");
    const struct chat_msg sys_multi[] = {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
    check_apply("llama2 system then turns", &t2, sys_multi, 4, true,
                "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
    /* Where the system prompt goes, verbatim user text, trimmed v3 replies, a lone system prompt. */
    check_apply("mistral v1 system then turns", &mv1, sys_multi, 4, true,
                "[INST] S\n\nU1 [/INST] A1</s>[INST] U2 [/INST]");
    check_apply("mistral v3 system then turns", &mv3, sys_multi, 4, true,
                "[INST] U1[/INST] A1</s>[INST] S\n\nU2[/INST]");
    /* v3 places it on the last message only when that is a user turn (else the template drops it) */
    check_apply("mistral v3 system, reply last", &mv3, sys_multi, 3, true, "[INST] U1[/INST] A1</s>");
    check_apply("mistral v1 system, reply last", &mv1, sys_multi, 3, true, "[INST] S\n\nU1 [/INST] A1</s>");
    const struct chat_msg padded_reply[] = {{"user", " u "}, {"assistant", "  a \n"}, {"user", "v"}};
    check_apply("mistral v1 verbatim", &mv1, padded_reply, 3, true, "[INST]  u  [/INST]   a \n</s>[INST] v [/INST]");
    check_apply("mistral v3 trimmed reply", &mv3, padded_reply, 3, true, "[INST]  u [/INST] a</s>[INST] v[/INST]");
    check_apply("mistral system only", &mv1, sys_only, 1, true, "[INST] Be brief. [/INST]");
    const struct chat_msg two_sys[] = {{"system", "S1"}, {"system", "S2"}, {"user", "U"}};
    check_apply("mistral two system prompts", &mtk, two_sys, 3, true, "[INST]S1\n\nS2\n\nU[/INST]");
    check_apply("gemma system then turns", &tg, sys_multi, 4, true,
                "<start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
                "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
}

static void test_errors(void)
{
    struct chat_template t = {.family = CHAT_CHATML};
    const struct chat_msg bad[] = {{"user", "hi"}, {"tool", "{\"x\":1}"}};
    char *out = (char *)1;
    struct kvb_err err = {{0}};
    CHECK_EQ_INT(chat_apply(&t, bad, 2, true, &out, &err), KVB_ERR_INVALID_ARG);
    CHECK(out == NULL);
    CHECK_MSG(strstr(err.msg, "tool") && strstr(err.msg, "message 1"), "message: %s", err.msg);
    const struct chat_msg null_content[] = {{"user", NULL}};
    CHECK_EQ_INT(chat_apply(&t, null_content, 1, true, &out, NULL), KVB_ERR_INVALID_ARG);
    CHECK_EQ_INT(chat_apply(NULL, USER, 1, true, &out, NULL), KVB_ERR_INVALID_ARG);

    /* Allocation failures: NOMEM with nothing returned, never a crash. */
    const enum chat_family fams[] = {CHAT_CHATML, CHAT_LLAMA2, CHAT_GEMMA, CHAT_MISTRAL};
    for (int f = 0; f < 4; f++) {
        struct chat_template tf = {.family = fams[f], .default_system = (char *)SMOLLM2_SYSTEM};
        int ok = 0;
        for (long k = 0; k < 8; k++) {
            kvb_alloc_fail_after(k);
            out = NULL;
            enum kvb_status st = chat_apply(&tf, MULTI, 3, true, &out, NULL);
            kvb_alloc_fail_after(-1);
            CHECK(st == KVB_OK || (st == KVB_ERR_NOMEM && out == NULL));
            if (st == KVB_OK) ok = 1;
            kvb_free(out);
        }
        CHECK(ok);
    }
    for (long k = 0; k < 4; k++) {
        struct chat_template td;
        kvb_alloc_fail_after(k);
        enum kvb_status st = chat_template_detect(SMOLLM2, strlen(SMOLLM2), &td, NULL);
        kvb_alloc_fail_after(-1);
        CHECK(st == KVB_OK || st == KVB_ERR_NOMEM);
        chat_template_free(&td);
    }
}

/* The developer role as each family's template renders it, and a final
 * assistant message left open (continue_final_message). */
static void test_developer_and_continue(void)
{
    struct chat_template chatml = {.family = CHAT_CHATML, .default_system = (char *)SMOLLM2_SYSTEM};
    const struct chat_msg dev[] = {{"developer", "Be brief."}, {"user", "Hi"}};
    char want[512];
    snprintf(want, sizeof want,
             "<|im_start|>system\n%s<|im_end|>\n<|im_start|>developer\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
             "<|im_end|>\n<|im_start|>assistant\n",
             SMOLLM2_SYSTEM);
    check_apply("chatml developer (not a system turn: the default one stays)", &chatml, dev, 2, true, want);
    struct chat_template l3 = {.family = CHAT_LLAMA3};
    check_apply("llama3 developer", &l3, dev, 2, true,
                "<|start_header_id|>developer<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
                "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    const enum chat_family refuse[] = {CHAT_LLAMA2, CHAT_MISTRAL, CHAT_GEMMA, CHAT_ZEPHYR};
    for (int f = 0; f < 4; f++) {
        struct chat_template t = {.family = refuse[f]};
        char *out = NULL;
        struct kvb_err err = {{0}};
        CHECK_EQ_INT(chat_apply(&t, dev, 2, true, &out, &err), KVB_ERR_UNSUPPORTED);
        CHECK_MSG(out == NULL && strstr(err.msg, "developer"), "%s: %s", chat_family_name(refuse[f]), err.msg);
    }

    const struct chat_msg cont[] = {{"user", "Name a fruit."}, {"assistant", "A fruit: "}};
    char *out = NULL;
    struct kvb_err err = {{0}};
    CHECK_EQ_INT(chat_apply_continue(&chatml, cont, 2, &out, &err), KVB_OK);
    snprintf(want, sizeof want,
             "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n"
             "A fruit: ",
             SMOLLM2_SYSTEM);
    CHECK_MSG(out && strcmp(out, want) == 0, "chatml continue: [%s]", out ? out : "");
    kvb_free(out);
    /* Llama 3 trims the content: the cut is after the trimmed text */
    CHECK_EQ_INT(chat_apply_continue(&l3, cont, 2, &out, &err), KVB_OK);
    CHECK_MSG(out && strcmp(out, "<|start_header_id|>user<|end_header_id|>\n\nName a fruit.<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\nA fruit:") == 0,
              "llama3 continue: [%s]", out ? out : "");
    kvb_free(out);
    CHECK_EQ_INT(chat_apply_continue(&chatml, cont, 1, &out, &err), KVB_ERR_INVALID_ARG);
    CHECK(out == NULL);
}

int main(void)
{
    test_detect();
    test_names();
    test_apply();
    test_errors();
    test_developer_and_continue();
    return tu_finish();
}
