/* fuzz_template.c — libFuzzer target for the Jinja interpreter (text/jinja.h)
 * and the chat rendering around it (text/chat.h).
 *
 * Input: template text, then optionally a NUL byte and the variables as a
 * JSON object (default: a small conversation). Properties checked (a
 * violation traps, so the replay test fails too):
 *   - jinja_compile and jinja_render return KVB_OK or an error with a
 *     message naming the template (no crash, no leak, no hang: the bounds
 *     below keep every input short);
 *   - on KVB_OK the output is NUL-terminated at its length and its user
 *     spans are inside it, sorted, disjoint and not adjacent;
 *   - rendering twice gives the same text and spans (the template is not
 *     changed by a render);
 *   - chat_render of the same text as a chat template keeps its own
 *     invariants (spans inside the text), continued or not.
 * This file is test code, so it may stop the process when a property fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/jinja.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_template: %s:%d: %s\n", __FILE__, __LINE__, #c);                                     \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

static const char k_vars[] = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                             "{\"role\":\"user\",\"content\":\"Hi <|im_end|> {{x}}\"},"
                             "{\"role\":\"assistant\",\"content\":\" Hello \"}],"
                             "\"add_generation_prompt\":true,\"tools\":null,\"enable_thinking\":false,"
                             "\"data\":{\"a\":1,\"b\":[1,2.5,\"x\"],\"c\":{\"d\":null}}}";

static void check_output(const struct jinja_output *o)
{
    REQUIRE(o->text && o->text[o->len] == '\0');
    for (size_t i = 0; i < o->n_user; i++) {
        REQUIRE(o->user[i].len > 0 && o->user[i].off + o->user[i].len <= o->len);
        if (i) REQUIRE(o->user[i].off > o->user[i - 1].off + o->user[i - 1].len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    const size_t tlen = nul ? (size_t)(nul - text) : size;
    const char *vars = nul ? nul + 1 : k_vars;
    const size_t vlen = nul ? size - tlen - 1 : sizeof k_vars - 1;

    /* small bounds: every input ends in milliseconds */
    struct jinja_limits lim;
    jinja_limits_default(&lim);
    lim.max_steps = 200000;
    lim.max_memory = 32u << 20;
    lim.max_output = 1u << 20;

    struct kvb_err err = {{0}};
    struct jinja_template *t = NULL;
    enum kvb_status st = jinja_compile(text, tlen, "fuzz", &lim, &t, &err);
    if (st != KVB_OK) {
        REQUIRE(!t && strstr(err.msg, "template fuzz") != NULL);
        return 0;
    }
    struct jinja_strvar sv[] = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    const struct jinja_input in = {.strs = sv, .n_strs = 2, .user_json = vars, .user_json_len = vlen, .now = 1};
    struct jinja_output a, b;
    st = jinja_render(t, &in, &lim, &a, &err);
    if (st == KVB_OK) {
        check_output(&a);
        REQUIRE(jinja_render(t, &in, &lim, &b, &err) == KVB_OK);
        REQUIRE(a.len == b.len && memcmp(a.text, b.text, a.len) == 0 && a.n_user == b.n_user);
        REQUIRE(a.n_user == 0 || memcmp(a.user, b.user, a.n_user * sizeof *a.user) == 0);
        jinja_output_free(&b);
        jinja_output_free(&a);
    } else {
        REQUIRE(st == KVB_ERR_FORMAT || st == KVB_ERR_RANGE || st == KVB_ERR_INVALID_ARG || st == KVB_ERR_NOMEM);
        REQUIRE(strstr(err.msg, "template fuzz") != NULL);
    }
    jinja_free(t);

    /* the same text as a chat template, through chat_render's rules */
    struct chat_template ct;
    if (chat_template_from_text_limited(text, tlen, "fuzz", &lim, &ct, &err) == KVB_OK &&
        chat_template_set_tokens(&ct, "<s>", "</s>") == KVB_OK) {
        const struct chat_msg msgs[] = {{"user", "Hello <|im_end|>"}, {"assistant", "  It is "}};
        for (int cont = 0; cont < 2; cont++) {
            const struct chat_input ci = {
                .msgs = msgs, .n = 2, .add_generation_prompt = !cont, .continue_final_message = cont};
            struct jinja_output o;
            if (chat_render(&ct, &ci, &o, &err) == KVB_OK) {
                check_output(&o);
                jinja_output_free(&o);
            }
        }
    }
    chat_template_free(&ct);
    return 0;
}
