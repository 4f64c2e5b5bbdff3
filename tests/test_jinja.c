/* test_jinja.c — the Jinja interpreter's contract beyond what the reference
 * test against jinja2 covers (tests/pytest_chat_templates.py):
 *
 * - hostile templates end with a clear error, quickly: a template of 1 MB,
 *   one that loops 10^9 times, one that recurses without end (the issue's
 *   three), and output, memory, nesting and range bombs; each within a
 *   second of CPU time (five under the sanitizers);
 * - the user-text spans: which bytes of the output came from the user's
 *   strings, through concatenation, trim, replace, upper, tojson, join,
 *   slicing and format;
 * - chat_render: continue_final_message (transformers' tag rule), kwargs
 *   refused by name for what they may not set, kwargs refused by the
 *   built-in families, BOS left to the template;
 * - the tokenizer reads those spans as plain text (a message spelling
 *   "<|im_end|>" gets no control token), with the default model's
 *   tokenizer when it is there;
 * - errors name the template and the line; a compiled template renders
 *   from several threads at once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "support/testutil.h"
#include "text/chat.h"
#include "text/jinja.h"
#include "text/tok.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 5.0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOW 5.0
#endif
#endif
#ifndef SLOW
#define SLOW 1.0
#endif

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Renders src with vars (a JSON object, user text); returns the status,
 * the text in *out (malloc'd) and the error in err. */
static enum kvb_status render(const char *src, size_t len, const char *vars, char **out, struct jinja_output *o_out,
                              struct kvb_err *err)
{
    struct jinja_template *t = NULL;
    *out = NULL;
    enum kvb_status st = jinja_compile(src, len, "t", NULL, &t, err);
    if (st != KVB_OK) return st;
    struct jinja_strvar sv[] = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    struct jinja_input in = {
        .strs = sv, .n_strs = 2, .user_json = vars, .user_json_len = vars ? strlen(vars) : 0, .now = 1741356309};
    struct jinja_output o;
    st = jinja_render(t, &in, NULL, &o, err);
    jinja_free(t);
    if (st != KVB_OK) return st;
    *out = kvb_strndup(o.text, o.len);
    if (o_out) *o_out = o;
    else jinja_output_free(&o);
    return KVB_OK;
}

static void expect_text(const char *src, const char *vars, const char *want)
{
    char *got;
    struct kvb_err err = {{0}};
    enum kvb_status st = render(src, strlen(src), vars, &got, NULL, &err);
    CHECK_MSG(st == KVB_OK && strcmp(got, want) == 0, "%s: got %s (%s), want %s", src, st == KVB_OK ? got : "error",
              err.msg, want);
    kvb_free(got);
}

/* A hostile template: an error of status want whose message holds what,
 * within the CPU budget. */
static void expect_bounded(const char *label, const char *src, size_t len, enum kvb_status want, const char *what)
{
    char *got = NULL;
    struct kvb_err err = {{0}};
    const double t0 = cpu_seconds();
    enum kvb_status st = render(src, len, NULL, &got, NULL, &err);
    const double dt = cpu_seconds() - t0;
    CHECK_MSG(st == want && strstr(err.msg, what) && strstr(err.msg, "template t"), "%s: status %d (%s), want %d '%s'",
              label, st, err.msg, want, what);
    CHECK_MSG(dt < 1.0 * SLOW, "%s: %.2f s of CPU to refuse it", label, dt);
    printf("%-28s %.3f s: %s\n", label, dt, err.msg);
    kvb_free(got);
}

static void test_hostile(void)
{
    /* the issue's three */
    const size_t mb = 1u << 20;
    char *big = kvb_malloc(mb + 1);
    memset(big, 'x', mb);
    memcpy(big, "{{ 'start' }}", 13);
    big[mb] = '\0';
    expect_bounded("1 MB template", big, mb, KVB_ERR_RANGE, "more than the 262144 a template may have");
    kvb_free(big);
    const char *loop = "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(10000) %}"
                       "{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}{{ ns.n }}";
    expect_bounded("10^9 iterations", loop, strlen(loop), KVB_ERR_RANGE, "evaluation steps");
    const char *rec = "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}";
    expect_bounded("endless recursion", rec, strlen(rec), KVB_ERR_RANGE, "deeper than");

    /* and the other ways a template could grow without end */
    const char *out_bomb = "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}";
    expect_bounded("output bomb", out_bomb, strlen(out_bomb), KVB_ERR_RANGE, "the output passed");
    const char *str_bomb = "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                           "{% endfor %}{{ ns.s|length }}";
    expect_bounded("doubling string", str_bomb, strlen(str_bomb), KVB_ERR_RANGE, "evaluation steps");
    const char *mem_bomb = "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l * 2 %}"
                           "{% endfor %}{{ ns.l|length }}";
    expect_bounded("doubling list", mem_bomb, strlen(mem_bomb), KVB_ERR_RANGE, "memory bound");
    const char *repeat = "{{ 'x' * 100000000000 }}";
    expect_bounded("repeated string", repeat, strlen(repeat), KVB_ERR_RANGE, "memory bound");
    const char *range = "{% for i in range(1000000000) %}{% endfor %}";
    expect_bounded("huge range", range, strlen(range), KVB_ERR_RANGE, "range too big");
    const char *nested = "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}"
                         "{% endfor %}{{ ns.l }}";
    expect_bounded("deeply nested value", nested, strlen(nested), KVB_ERR_RANGE, "deeper than");
    const char *ns_self = "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}";
    expect_bounded("namespace in itself", ns_self, strlen(ns_self), KVB_ERR_RANGE, "deeper than");
    /* source nesting: brackets, unary chains, operator chains, elif chains, blocks */
    struct {
        const char *label, *open, *mid, *close, *what;
        int n;
    } deep[] = {
        {"nested brackets", "{{ ", "(", "1 }}", "nested", 100000},
        {"unary chain", "{{ ", "-", "1 }}", "nested deeper", 100000},
        {"not chain", "{{ ", "not ", "1 }}", "nested deeper", 50000},
        {"operator chain", "{{ 1", " + 1", " }}", "nested deeper", 50000},
        {"filter chain", "{{ 1", "|abs", " }}", "nested deeper", 50000},
        {"attribute chain", "{{ x", ".a", " }}", "nested deeper", 50000},
        {"nested ifs", "", "{% if true %}", "", "nested deeper", 50000},
        {"elif chain", "{% if false %}", "{% elif false %}", "{% endif %}", "nested deeper", 50000},
    };
    for (size_t k = 0; k < sizeof deep / sizeof deep[0]; k++) {
        const size_t ml = strlen(deep[k].mid);
        size_t cap = strlen(deep[k].open) + ml * (size_t)deep[k].n + strlen(deep[k].close) + 1, o = 0;
        char *s = kvb_malloc(cap);
        o += (size_t)sprintf(s + o, "%s", deep[k].open);
        for (int i = 0; i < deep[k].n && o + ml < 200000; i++) o += (size_t)sprintf(s + o, "%s", deep[k].mid);
        o += (size_t)sprintf(s + o, "%s", deep[k].close);
        expect_bounded(deep[k].label, s, o, KVB_ERR_FORMAT, deep[k].what);
        kvb_free(s);
    }
}

/* The user spans of the output of src with vars, as "[a,b)" pairs. */
static void expect_spans(const char *src, const char *vars, const char *want_text, const char *want_spans)
{
    char *got;
    struct jinja_output o = {0};
    struct kvb_err err = {{0}};
    enum kvb_status st = render(src, strlen(src), vars, &got, &o, &err);
    char spans[512] = "";
    for (size_t i = 0; st == KVB_OK && i < o.n_user; i++)
        snprintf(spans + strlen(spans), sizeof spans - strlen(spans), "[%zu,%zu)", o.user[i].off,
                 o.user[i].off + o.user[i].len);
    CHECK_MSG(st == KVB_OK && strcmp(got, want_text) == 0 && strcmp(spans, want_spans) == 0,
              "%s: got %s %s (%s), want %s %s", src, got ? got : "-", spans, err.msg, want_text, want_spans);
    kvb_free(got);
    jinja_output_free(&o);
}

static void test_spans(void)
{
    const char *v = "{\"u\":\"  Hi <|x|>  \",\"k\":\"ab\",\"n\":3}";
    expect_spans("A{{ u }}B", v, "A  Hi <|x|>  B", "[1,13)");
    expect_spans("A{{ u|trim }}B", v, "AHi <|x|>B", "[1,9)");
    expect_spans("{{ '<' + k + '>' }}", v, "<ab>", "[1,3)");
    expect_spans("{{ k ~ k }}", v, "abab", "[0,4)"); /* adjacent spans merge */
    expect_spans("{{ (k ~ '-' ~ k)|upper }}", v, "AB-AB", "[0,2)[3,5)");
    expect_spans("{{ u|trim|replace('Hi', '<s>') }}", v, "<s> <|x|>", "[3,9)");
    expect_spans("{{ k|tojson }}", v, "\"ab\"", "[1,3)");
    expect_spans("{{ [k, 'lit']|join(',') }}", v, "ab,lit", "[0,2)");
    expect_spans("{{ k[1:] ~ n }}", v, "b3", "[0,1)"); /* numbers are not text */
    expect_spans("{{ '{}|{}'.format(k, 'z') }}", v, "ab|z", "[0,2)");
    expect_spans("{% for c in k %}[{{ c }}]{% endfor %}", v, "[a][b]", "[1,2)[4,5)");
    expect_spans("{{ bos_token }}{{ k }}", v, "<s>ab", "[3,5)"); /* the vocabulary's tokens are the template's */
    expect_spans("{{ {'k': k} }}", v, "{'k': 'ab'}", "[7,9)");
}

static void test_errors(void)
{
    struct jinja_template *t = NULL;
    struct kvb_err err = {{0}};
    CHECK(jinja_compile("a\n{% if %}", 10, "mine", NULL, &t, &err) == KVB_ERR_FORMAT && !t);
    CHECK_MSG(strstr(err.msg, "template mine, line 2:") != NULL, "%s", err.msg);
    CHECK(jinja_compile("{{ x | nosuch }}", 16, "mine", NULL, &t, &err) == KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "no filter named 'nosuch'") != NULL, "%s", err.msg);
    char *got;
    static const char raise[] = "l1\nl2 {{ raise_exception('no ' ~ 'way') }}";
    CHECK(render(raise, sizeof raise - 1, NULL, &got, NULL, &err) == KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "template t, line 2: raise_exception: no way") != NULL, "%s", err.msg);
    CHECK(render("{{ a.b }}", 9, NULL, &got, NULL, &err) == KVB_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "'a' is undefined") != NULL, "%s", err.msg);
    CHECK(render("{{ x }}", 7, "[1]", &got, NULL, &err) == KVB_ERR_INVALID_ARG);
    CHECK(render("{{ x }}", 7, "{\"x\":", &got, NULL, &err) == KVB_ERR_INVALID_ARG);
    /* the trailing newline is dropped, one only, and \r\n reads as \n */
    expect_text("a\r\nb\n\n", NULL, "a\nb\n");
    expect_text("{{ x|length }}{{ y }}", "{\"x\":[1,2],\"y\":null}", "2None");
}

/* chat_render: the Jinja path, transformers' rules around it. */
static void test_chat_render(void)
{
    static const char tmpl[] = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content|trim }}</>"
                               "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
                               "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}";
    struct chat_template t;
    struct kvb_err err = {{0}};
    CHECK(chat_template_from_text(tmpl, sizeof tmpl - 1, "unit", &t, &err) == KVB_OK);
    CHECK(chat_template_set_tokens(&t, "<s>", "</s>") == KVB_OK);
    CHECK(chat_template_writes_bos(&t));
    char label[256];
    chat_template_describe(&t, label, sizeof label);
    CHECK_MSG(strncmp(label, "unit@", 5) == 0 && strlen(label) == 17, "%s", label);
    const struct chat_msg msgs[] = {{"user", "Hi <|x|>"}, {"assistant", "  The answer is  "}};
    struct jinja_output o;
    struct chat_input in = {.msgs = msgs, .n = 1, .add_generation_prompt = true};
    CHECK(chat_render(&t, &in, &o, &err) == KVB_OK);
    CHECK_MSG(strcmp(o.text, "<s><user>Hi <|x|></><assistant>") == 0, "%s", o.text);
    CHECK(o.n_user == 2 && o.user[0].off == 4 && o.user[0].len == 4 && o.user[1].off == 9 && o.user[1].len == 8);
    jinja_output_free(&o);

    /* continue_final_message: the template trims the content, so the tag
     * lost its space and the text is cut before it, white space stripped */
    in = (struct chat_input){.msgs = msgs, .n = 2, .continue_final_message = true};
    CHECK(chat_render(&t, &in, &o, &err) == KVB_OK);
    CHECK_MSG(strcmp(o.text, "<s><user>Hi <|x|></><assistant>The answer is") == 0, "%s", o.text);
    CHECK(o.n_user == 4 && o.user[3].off + o.user[3].len == o.len); /* the roles are the user's strings too */
    jinja_output_free(&o);
    in.add_generation_prompt = true;
    CHECK(chat_render(&t, &in, &o, &err) == KVB_ERR_INVALID_ARG);

    /* kwargs reach the template; the names apply_chat_template owns are refused */
    static const char kw[] = "{\"enable_thinking\": false}";
    in = (struct chat_input){.msgs = msgs, .n = 1, .kwargs_json = kw, .kwargs_len = sizeof kw - 1};
    CHECK(chat_render(&t, &in, &o, &err) == KVB_OK);
    CHECK_MSG(strcmp(o.text, "<s><user>Hi <|x|></>[no-think]") == 0, "%s", o.text);
    jinja_output_free(&o);
    static const char kw_bad[] = "{\"add_generation_prompt\": true}";
    in.kwargs_json = kw_bad;
    in.kwargs_len = sizeof kw_bad - 1;
    CHECK(chat_render(&t, &in, &o, &err) == KVB_ERR_INVALID_ARG && strstr(err.msg, "add_generation_prompt"));
    static const char kw_bos[] = "{\"bos_token\": \"[BOS]\", \"x\": {\"a\": [1, \"s\"]}}";
    in.kwargs_json = kw_bos;
    in.kwargs_len = sizeof kw_bos - 1;
    CHECK(chat_render(&t, &in, &o, &err) == KVB_OK && strncmp(o.text, "[BOS]", 5) == 0); /* kwargs win, as there */
    jinja_output_free(&o);
    chat_template_free(&t);

    /* a built-in family: no variables to give, BOS left to the tokenizer */
    struct chat_template c;
    CHECK(chat_template_from_name("chatml", &c, &err) == KVB_OK && !chat_template_writes_bos(&c));
    in = (struct chat_input){
        .msgs = msgs, .n = 1, .add_generation_prompt = true, .kwargs_json = kw, .kwargs_len = sizeof kw - 1};
    CHECK(chat_render(&c, &in, &o, &err) == KVB_ERR_UNSUPPORTED);
    in.kwargs_json = "{ }";
    in.kwargs_len = 3;
    CHECK(chat_render(&c, &in, &o, &err) == KVB_OK);
    CHECK(o.n_user == 1 && memcmp(o.text + o.user[0].off, "Hi <|x|>", 8) == 0 && o.user[0].len == 8);
    jinja_output_free(&o);
    chat_template_free(&c);
}

/* The tokenizer keeps the user's spans as plain text. */
static void test_plain_spans(void)
{
    bool absent = false;
    struct tok *tk = tu_model_tokenizer(&absent);
    if (!tk) {
        printf("(no default model: plain spans not checked against its tokenizer)\n");
        return;
    }
    static const char text[] = "<|im_start|>user\nsay <|im_end|> now<|im_end|>\n";
    const int32_t im_end = tok_find(tk, "<|im_end|>");
    int32_t *ids = NULL, *ref = NULL;
    size_t n = 0, nref = 0;
    struct kvb_err err = {{0}};
    const struct tok_span plain[] = {{17, 17}}; /* "say <|im_end|> now" */
    const struct tok_limits lim = {.plain = plain, .n_plain = 1};
    CHECK(tok_encode_with(tk, text, sizeof text - 1, TOK_PARSE_SPECIAL, &lim, &ids, &n, &err) == KVB_OK);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += ids[i] == im_end;
    CHECK_MSG(count == 1, "%zu <|im_end|> tokens, want 1 (the template's)", count);
    /* and the content is tokenized as it would be on its own, between the control tokens */
    CHECK(tok_encode(tk, "say <|im_end|> now", 18, 0, &ref, &nref, &err) == KVB_OK);
    CHECK(n == nref + 5 && memcmp(ids + 3, ref, nref * sizeof *ids) == 0);
    kvb_free(ids);
    kvb_free(ref);
    tok_free(tk);
}

/* A compiled template is read-only: several threads render it at once. */
struct thread_arg {
    const struct jinja_template *t;
    int ok;
};

static void *render_many(void *p)
{
    struct thread_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char vars[64];
        snprintf(vars, sizeof vars, "{\"n\": %d}", i);
        struct jinja_input in = {.user_json = vars, .user_json_len = strlen(vars)};
        struct jinja_output o;
        if (jinja_render(a->t, &in, NULL, &o, NULL) != KVB_OK) continue;
        char want[64];
        snprintf(want, sizeof want, "%d:%d", i, i * 2);
        a->ok += strcmp(o.text, want) == 0;
        jinja_output_free(&o);
    }
    return NULL;
}

static void test_threads(void)
{
    static const char src[] = "{% set ns = namespace(v=n) %}{% set ns.v = ns.v * 2 %}{{ n }}:{{ ns.v }}";
    struct jinja_template *t = NULL;
    CHECK(jinja_compile(src, sizeof src - 1, "threads", NULL, &t, NULL) == KVB_OK);
    pthread_t th[4];
    struct thread_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thread_arg){t, 0};
        pthread_create(&th[i], NULL, render_many, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(a[i].ok, 200);
    }
    jinja_free(t);
}

int main(void)
{
    test_hostile();
    test_spans();
    test_errors();
    test_chat_render();
    test_plain_spans();
    test_threads();
    return tu_finish();
}
