/* chat.c — recognising a chat-template family from Jinja text and applying
 * it in C (see chat.h).
 *
 * kvbatch does not run Jinja: the families below cover the models it loads,
 * and each is written out here exactly as its official template renders it
 * (Hugging Face apply_chat_template, BOS left to the caller). Detection looks
 * for each family's distinctive special-token text. For ChatML it also reads
 * the template's string literals, because templates such as SmolLM2's and
 * Qwen2's insert a default system prompt when the conversation has none, and
 * prompts (hence cache keys) must match what the model was tuned on.
 *
 * Not here: tool calls, multimodal content, Mistral's [SYSTEM_PROMPT]
 * templates (v7 and later), per-model quirks beyond these families. */
#include "text/chat.h"
#include "text/chat_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

static const char *const family_names[CHAT_FAMILY_COUNT_] = {
    [CHAT_CHATML] = "chatml", [CHAT_LLAMA3] = "llama3",   [CHAT_LLAMA2] = "llama2",   [CHAT_ZEPHYR] = "zephyr",
    [CHAT_GEMMA] = "gemma",   [CHAT_LLAMA31] = "llama31", [CHAT_MISTRAL] = "mistral",
};

#define NAMES_HINT "chatml, llama3, llama31, llama2, mistral, mistral-v3, mistral-tekken, zephyr, gemma"

const char *chat_builtin_names(void) { return NAMES_HINT; }

const char *chat_family_name(enum chat_family f)
{
    return (unsigned)f < CHAT_FAMILY_COUNT_ ? family_names[f] : "unknown";
}

/* ---- small text helpers ------------------------------------------------------------ */

static const char *mem_find(const char *hay, size_t hlen, const char *needle)
{
    size_t nlen = strlen(needle);
    if (nlen == 0 || nlen > hlen) return NULL;
    for (size_t i = 0; i + nlen <= hlen; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, nlen) == 0) return hay + i;
    return NULL;
}

static bool contains(const char *hay, size_t hlen, const char *needle) { return mem_find(hay, hlen, needle) != NULL; }

/* Python's str.strip() / Jinja's trim on ASCII whitespace. */
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void trim_span(const char **s, size_t *n)
{
    while (*n > 0 && is_space((*s)[0])) {
        (*s)++;
        (*n)--;
    }
    while (*n > 0 && is_space((*s)[*n - 1])) (*n)--;
}

/* Growable output string that remembers which of its bytes are the
 * user's (message contents), for the tokenizer (chat_render). A failed
 * allocation sets oom and turns every later append into a no-op, so
 * formatting code checks once at the end. */
struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
    struct jinja_span *sp; /* (nsp) user bytes, sorted, merged when adjacent */
    size_t nsp, capsp;
};

static void sb_span(struct sbuf *b, size_t off, size_t n)
{
    if (b->oom || n == 0) return;
    if (b->nsp && b->sp[b->nsp - 1].off + b->sp[b->nsp - 1].len == off) {
        b->sp[b->nsp - 1].len += n;
        return;
    }
    if (b->nsp == b->capsp) {
        size_t cap = b->capsp ? b->capsp * 2 : 8;
        struct jinja_span *sp = kvb_realloc(b->sp, cap * sizeof *sp);
        if (!sp) {
            b->oom = true;
            return;
        }
        b->sp = sp;
        b->capsp = cap;
    }
    b->sp[b->nsp++] = (struct jinja_span){off, n};
}

static void sb_putn_as(struct sbuf *b, const char *s, size_t n, bool user)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = kvb_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    if (user) sb_span(b, b->len, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_putn(struct sbuf *b, const char *s, size_t n) { sb_putn_as(b, s, n, false); }
static void sb_puts(struct sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_put_user(struct sbuf *b, const char *s) { sb_putn_as(b, s, strlen(s), true); }

static void sb_put_trimmed_user(struct sbuf *b, const char *s)
{
    size_t n = strlen(s);
    trim_span(&s, &n);
    sb_putn_as(b, s, n, true);
}

/* Bytes [off, off+n) of src, with their user spans. */
static void sb_append(struct sbuf *b, const struct sbuf *src, size_t off, size_t n)
{
    if (src->oom) b->oom = true;
    if (b->oom || n == 0) return;
    const size_t at = b->len;
    sb_putn(b, src->p + off, n);
    for (size_t i = 0; i < src->nsp && !b->oom; i++) {
        size_t a = src->sp[i].off, e = a + src->sp[i].len;
        if (e <= off || a >= off + n) continue;
        if (a < off) a = off;
        if (e > off + n) e = off + n;
        sb_span(b, at + a - off, e - a);
    }
}

/* src with its white space trimmed, as Jinja's trim. */
static void sb_append_trimmed(struct sbuf *b, const struct sbuf *src)
{
    const char *s = src->p ? src->p : "";
    size_t n = src->len;
    trim_span(&s, &n);
    sb_append(b, src, src->p ? (size_t)(s - src->p) : 0, n);
}

static void sb_free(struct sbuf *b)
{
    kvb_free(b->p);
    kvb_free(b->sp);
}

/* ---- default system prompt (ChatML) ------------------------------------------------- */

/* Decodes the Jinja string literal body text[0..n) (quotes excluded) into a
 * kvb_malloc'd NUL-terminated string, as Python would: \n \t \r \\ \' \"
 * become their characters, other escapes stay as written. */
static char *decode_literal(const char *text, size_t n, size_t *out_len)
{
    char *d = kvb_malloc(n + 1);
    if (!d) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        if (c == '\\' && i + 1 < n) {
            char e = text[i + 1];
            char r = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : (e == '\\' || e == '\'' || e == '"') ? e : 0;
            if (r) {
                d[k++] = r;
                i++;
                continue;
            }
        }
        d[k++] = c;
    }
    d[k] = '\0';
    *out_len = k;
    return d;
}

/* Looks through the string literals inside {{ }} and {% %} for the first
 * that holds a whole system turn, "<|im_start|>system\n…<|im_end|>", and
 * copies its body into *out (NULL when there is none). A literal that only
 * opens the turn ('<|im_start|>system\n' + messages[0]['content']) is the
 * caller's system prompt, not a default, and is skipped. */
static enum kvb_status chatml_default_system(const char *t, size_t len, char **out)
{
    static const char open[] = "<|im_start|>system\n", close[] = "<|im_end|>";
    *out = NULL;
    size_t i = 0;
    while (i + 1 < len) {
        if (t[i] != '{' || (t[i + 1] != '{' && t[i + 1] != '%' && t[i + 1] != '#')) {
            i++;
            continue;
        }
        if (t[i + 1] == '#') { /* comment: skip to #} */
            const char *end = mem_find(t + i + 2, len - i - 2, "#}");
            if (!end) return KVB_OK;
            i = (size_t)(end - t) + 2;
            continue;
        }
        const char closer = t[i + 1] == '{' ? '}' : '%';
        i += 2;
        while (i < len) { /* inside a block: literals until the closer */
            if (t[i] == closer && i + 1 < len && t[i + 1] == '}') {
                i += 2;
                break;
            }
            if (t[i] != '\'' && t[i] != '"') {
                i++;
                continue;
            }
            const char q = t[i];
            size_t start = ++i;
            while (i < len && t[i] != q) i += (t[i] == '\\' && i + 1 < len) ? 2 : 1;
            if (i > len) i = len;
            size_t dlen;
            char *lit = decode_literal(t + start, i - start, &dlen);
            KVB_RETURN_IF(!lit, KVB_ERR_NOMEM);
            i++; /* past the closing quote */
            const char *a = mem_find(lit, dlen, open);
            const char *body = a ? a + sizeof open - 1 : NULL;
            const char *b = body ? mem_find(body, dlen - (size_t)(body - lit), close) : NULL;
            if (b) {
                *out = kvb_strndup(body, (size_t)(b - body));
                kvb_free(lit);
                KVB_RETURN_IF(!*out, KVB_ERR_NOMEM);
                return KVB_OK;
            }
            kvb_free(lit);
        }
    }
    return KVB_OK;
}

/* ---- detection --------------------------------------------------------------------- */

/* Mistral's versions differ only in literals next to [INST], [/INST] and the
 * reply, and in the loop condition that places the system prompt, so those
 * are what is read (either quote style). */
static bool contains_quoted(const char *t, size_t len, const char *body)
{
    char a[64], b[64];
    snprintf(a, sizeof a, "'%s'", body);
    snprintf(b, sizeof b, "\"%s\"", body);
    return contains(t, len, a) || contains(t, len, b);
}

static struct chat_mistral mistral_variant(const char *t, size_t len)
{
    struct chat_mistral v;
    v.open_space = !contains_quoted(t, len, "[INST]");
    v.close_space = contains_quoted(t, len, " [/INST]");
    v.reply_space = contains(t, len, "' ' + message") || contains(t, len, "\" \" + message");
    v.reply_trim = contains(t, len, "|trim") || contains(t, len, "| trim");
    v.system_last =
        contains(t, len, "loop.last and system_message") || contains(t, len, "system_message is defined and loop.last");
    return v;
}

enum kvb_status chat_template_detect(const char *text, size_t len, struct chat_template *out, struct kvb_err *err)
{
    if (!out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_template_detect: out is NULL");
    memset(out, 0, sizeof *out);
    out->family = CHAT_CHATML;
    if (!text || len == 0)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "the model has no chat template; pass --chat-template NAME (" NAMES_HINT ")");

    /* Most specific markers first: each appears only in its own family. */
    if (contains(text, len, "<|start_header_id|>")) {
        out->family = contains(text, len, "Cutting Knowledge Date") ? CHAT_LLAMA31 : CHAT_LLAMA3;
        return KVB_OK;
    }
    if (contains(text, len, "<|im_start|>")) {
        out->family = CHAT_CHATML;
        enum kvb_status st = chatml_default_system(text, len, &out->default_system);
        if (st != KVB_OK) return kvb_errf(err, st, "chat template: out of memory");
        return KVB_OK;
    }
    if (contains(text, len, "<start_of_turn>")) {
        out->family = CHAT_GEMMA;
        return KVB_OK;
    }
    if (contains(text, len, "<|user|>")) {
        /* Phi-3 shares <|user|> but ends turns with <|end|>. */
        if (contains(text, len, "<|end|>"))
            return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                            "chat template looks like Phi-3 (<|user|> … <|end|>), which kvbatch does not "
                            "format; pass --chat-template NAME (" NAMES_HINT ") if one fits");
        if (contains(text, len, "</s>") || contains(text, len, "eos_token")) {
            out->family = CHAT_ZEPHYR;
            return KVB_OK;
        }
    }
    if (contains(text, len, "[INST]")) {
        if (contains(text, len, "<<SYS>>")) {
            out->family = CHAT_LLAMA2;
            return KVB_OK;
        }
        if (contains(text, len, "[SYSTEM_PROMPT]"))
            return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                            "chat template looks like Mistral's with [SYSTEM_PROMPT] turns (v7 and later), which "
                            "kvbatch does not format; pass --chat-template NAME (" NAMES_HINT ") if one fits");
        out->family = CHAT_MISTRAL;
        out->mistral = mistral_variant(text, len);
        return KVB_OK;
    }
    return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                    "chat template not recognised (no ChatML, Llama 3, Llama 2, Mistral, Zephyr or Gemma "
                    "markers); pass --chat-template NAME (" NAMES_HINT ")");
}

/* Mistral's variants that have a name of their own (chat.h). */
static const struct {
    const char *name;
    struct chat_mistral v;
} mistrals[] = {
    {"mistral", {true, true, true, false, false}},
    {"mistral-v3", {true, false, true, true, true}},
    {"mistral-tekken", {false, false, false, false, true}},
};

const char *chat_template_name(const struct chat_template *t)
{
    if (!t) return "unknown";
    if (t->family != CHAT_MISTRAL) return chat_family_name(t->family);
    const struct chat_mistral *v = &t->mistral;
    for (size_t i = 0; i < sizeof mistrals / sizeof mistrals[0]; i++) {
        const struct chat_mistral *m = &mistrals[i].v;
        if (m->open_space == v->open_space && m->close_space == v->close_space && m->reply_space == v->reply_space &&
            m->reply_trim == v->reply_trim && m->system_last == v->system_last)
            return mistrals[i].name;
    }
    return "mistral-detected";
}

enum kvb_status chat_template_from_name(const char *name, struct chat_template *out, struct kvb_err *err)
{
    if (!out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_template_from_name: out is NULL");
    memset(out, 0, sizeof *out);
    out->family = CHAT_CHATML;
    if (name) {
        snprintf(out->source, sizeof out->source, "%s", name);
        for (size_t i = 0; i < sizeof mistrals / sizeof mistrals[0]; i++) {
            if (strcmp(name, mistrals[i].name) == 0) {
                out->family = CHAT_MISTRAL;
                out->mistral = mistrals[i].v;
                return KVB_OK;
            }
        }
        for (int f = 0; f < CHAT_FAMILY_COUNT_; f++) {
            if (strcmp(name, family_names[f]) == 0) {
                out->family = (enum chat_family)f;
                return KVB_OK;
            }
        }
    }
    return kvb_errf(err, KVB_ERR_INVALID_ARG, "unknown chat template name \"%s\" (known: " NAMES_HINT ")",
                    name ? name : "(null)");
}

void chat_template_free(struct chat_template *t)
{
    if (!t) return;
    kvb_free(t->default_system);
    jinja_free(t->jinja);
    kvb_free(t->bos_token);
    kvb_free(t->eos_token);
    t->default_system = NULL;
    t->jinja = NULL;
    t->bos_token = t->eos_token = NULL;
}

/* ---- formatting -------------------------------------------------------------------- */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_DEVELOPER };

static enum role role_of(const struct chat_msg *m)
{
    return strcmp(m->role, "system") == 0      ? ROLE_SYSTEM
           : strcmp(m->role, "user") == 0      ? ROLE_USER
           : strcmp(m->role, "developer") == 0 ? ROLE_DEVELOPER
                                               : ROLE_ASSISTANT;
}

/* Whether the family's template renders a "developer" message. ChatML and
 * Llama 3's write any role's name into the turn header, so a developer turn
 * is "<|im_start|>developer\n…" (and, not being "system", it does not stop
 * ChatML's default system prompt); the others either raise an error for a
 * role they do not know (Llama 2, Mistral, Gemma) or drop the message
 * without a word (Zephyr), which kvbatch turns into a refusal. */
static bool renders_developer(enum chat_family f) { return f == CHAT_CHATML || f == CHAT_LLAMA3 || f == CHAT_LLAMA31; }

static void apply_chatml(const struct chat_template *t, const struct chat_msg *msgs, size_t n, bool gen, struct sbuf *b)
{
    if (n > 0 && t->default_system && role_of(&msgs[0]) != ROLE_SYSTEM) {
        sb_puts(b, "<|im_start|>system\n");
        sb_puts(b, t->default_system);
        sb_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|im_start|>");
        sb_puts(b, msgs[i].role);
        sb_puts(b, "\n");
        sb_put_user(b, msgs[i].content);
        sb_puts(b, "<|im_end|>\n");
    }
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
}

static void apply_llama3(const struct chat_msg *msgs, size_t n, bool gen, struct sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|start_header_id|>");
        sb_puts(b, msgs[i].role);
        sb_puts(b, "<|end_header_id|>\n\n");
        sb_put_trimmed_user(b, msgs[i].content);
        sb_puts(b, "<|eot_id|>");
    }
    if (gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama 3.1 (and 3.2, 3.3): the system turn is always there and opens
 * with the knowledge cutoff and a date; the conversation's own system
 * message, trimmed, follows them. The date is the template's fixed
 * default, "26 Jul 2024": 3.2's template takes today's date when its host
 * offers strftime_now, but a prompt that changes with the calendar would
 * make neither the outputs nor the prefix cache reproducible. (Tool use,
 * which adds "Environment: ipython" lines, is not supported.) */
static void apply_llama31(const struct chat_msg *msgs, size_t n, bool gen, struct sbuf *b)
{
    sb_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n"
               "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    size_t first = 0;
    if (n > 0 && role_of(&msgs[0]) == ROLE_SYSTEM) {
        sb_put_trimmed_user(b, msgs[0].content);
        first = 1;
    }
    sb_puts(b, "<|eot_id|>");
    apply_llama3(msgs + first, n - first, gen, b);
}

/* Llama 2: the system prompt is folded into the next user turn inside
 * <<SYS>> markers; every user turn but the very first opens with BOS text,
 * every assistant turn closes with EOS text. The [/INST] that ends a user
 * turn is already the cue to answer, so there is no generation prompt. */
static void apply_llama2(const struct chat_msg *msgs, size_t n, struct sbuf *b)
{
    struct sbuf sys = {0}, turn = {0};
    bool have_sys = false;
    for (size_t i = 0; i <= n; i++) {
        const bool flush_sys = i == n && have_sys; /* a system prompt nothing followed */
        if (i == n && !flush_sys) break;
        enum role r = flush_sys ? ROLE_USER : role_of(&msgs[i]);
        if (r == ROLE_SYSTEM) {
            if (have_sys) sb_puts(&sys, "\n");
            sb_put_user(&sys, msgs[i].content);
            have_sys = true;
        } else if (r == ROLE_USER) {
            turn.len = 0;
            turn.nsp = 0;
            if (have_sys) {
                sb_puts(&turn, "<<SYS>>\n");
                sb_append(&turn, &sys, 0, sys.len);
                sb_puts(&turn, "\n<</SYS>>\n\n");
                have_sys = false;
                sys.len = 0;
                sys.nsp = 0;
            }
            if (!flush_sys) sb_put_user(&turn, msgs[i].content);
            if (b->len > 0) sb_puts(b, "<s>");
            sb_puts(b, "[INST] ");
            sb_append_trimmed(b, &turn);
            sb_puts(b, " [/INST]");
        } else {
            sb_puts(b, " ");
            sb_put_trimmed_user(b, msgs[i].content);
            sb_puts(b, " </s>");
        }
    }
    if (sys.oom) b->oom = true;
    sb_free(&sys);
    sb_free(&turn);
}

/* Mistral: user turns in [INST] … [/INST], replies closed by EOS text,
 * the system prompt (several are joined by blank lines) opening a user
 * turn after a blank line (struct chat_mistral says which). Where it goes
 * on the first user turn and there is none, it gets a turn of its own; on
 * the last message, it is dropped when that is not a user turn, as the
 * templates do. Like Llama 2, no generation prompt: [/INST] is the cue.
 * User text is kept verbatim, as the templates do. */
static void apply_mistral(const struct chat_mistral *v, const struct chat_msg *msgs, size_t n, struct sbuf *b)
{
    struct sbuf sys = {0};
    size_t target = n; /* the user turn that carries the system prompt */
    for (size_t i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM) {
            if (sys.len > 0) sb_puts(&sys, "\n\n");
            sb_put_user(&sys, msgs[i].content);
            if (!sys.p) sb_puts(&sys, ""); /* an empty system prompt still counts */
        } else if (r == ROLE_USER && target == n && !v->system_last) {
            target = i;
        }
    }
    if (v->system_last && n > 0 && role_of(&msgs[n - 1]) == ROLE_USER) target = n - 1;
    const char *open = v->open_space ? "[INST] " : "[INST]";
    const char *close = v->close_space ? " [/INST]" : "[/INST]";
    for (size_t i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_USER) {
            sb_puts(b, open);
            if (i == target && sys.p) {
                sb_append(b, &sys, 0, sys.len);
                sb_puts(b, "\n\n");
            }
            sb_put_user(b, msgs[i].content);
            sb_puts(b, close);
        } else if (r == ROLE_ASSISTANT) {
            if (v->reply_space) sb_puts(b, " ");
            if (v->reply_trim) sb_put_trimmed_user(b, msgs[i].content);
            else sb_put_user(b, msgs[i].content);
            sb_puts(b, "</s>");
        }
    }
    if (target == n && sys.p && !v->system_last) { /* no user turn to carry it: give it one of its own */
        sb_puts(b, open);
        sb_append(b, &sys, 0, sys.len);
        sb_puts(b, close);
    }
    if (sys.oom) b->oom = true;
    sb_free(&sys);
}

static void apply_zephyr(const struct chat_msg *msgs, size_t n, bool gen, struct sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|");
        sb_puts(b, msgs[i].role);
        sb_puts(b, "|>\n");
        sb_put_user(b, msgs[i].content);
        sb_puts(b, "</s>\n");
    }
    if (gen) sb_puts(b, "<|assistant|>\n");
}

/* Gemma has no system role: as Gemma 3's template does, the system text and
 * a blank line open the first user turn. The assistant is "model". */
static void apply_gemma(const struct chat_msg *msgs, size_t n, bool gen, struct sbuf *b)
{
    struct sbuf sys = {0};
    bool have_sys = false;
    for (size_t i = 0; i < n; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM) {
            if (have_sys) sb_puts(&sys, "\n\n");
            sb_put_user(&sys, msgs[i].content);
            have_sys = true;
            continue;
        }
        sb_puts(b, r == ROLE_USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (r == ROLE_USER && have_sys) {
            sb_append(b, &sys, 0, sys.len);
            sb_puts(b, "\n\n");
            have_sys = false;
            sys.len = 0;
            sys.nsp = 0;
        }
        sb_put_trimmed_user(b, msgs[i].content);
        sb_puts(b, "<end_of_turn>\n");
    }
    if (have_sys) { /* no user turn to carry it: give it one of its own */
        sb_puts(b, "<start_of_turn>user\n");
        sb_append_trimmed(b, &sys);
        sb_puts(b, "<end_of_turn>\n");
    }
    if (sys.oom) b->oom = true;
    sb_free(&sys);
    if (gen) sb_puts(b, "<start_of_turn>model\n");
}

/* The family's text for msgs with its user spans (b), after the checks of
 * roles and contents. */
static enum kvb_status builtin_apply(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                                     bool add_generation_prompt, struct sbuf *b, struct kvb_err *err)
{
    if (!t || (unsigned)t->family >= CHAT_FAMILY_COUNT_)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_apply: no valid template");
    if (n > 0 && !msgs) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_apply: messages are NULL");
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "message %zu: role or content missing", i);
        if (strcmp(r, "developer") == 0 && !renders_developer(t->family))
            return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                            "message %zu: the %s chat template has no developer role (give it as a system message)", i,
                            chat_family_name(t->family));
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 &&
            strcmp(r, "developer") != 0)
            return kvb_errf(err, KVB_ERR_INVALID_ARG,
                            "message %zu: role \"%.64s\" is not supported (system, user, assistant or developer)", i,
                            r);
    }
    switch (t->family) {
    case CHAT_CHATML: apply_chatml(t, msgs, n, add_generation_prompt, b); break;
    case CHAT_LLAMA3: apply_llama3(msgs, n, add_generation_prompt, b); break;
    case CHAT_LLAMA31: apply_llama31(msgs, n, add_generation_prompt, b); break;
    case CHAT_LLAMA2: apply_llama2(msgs, n, b); break;
    case CHAT_MISTRAL: apply_mistral(&t->mistral, msgs, n, b); break;
    case CHAT_ZEPHYR: apply_zephyr(msgs, n, add_generation_prompt, b); break;
    case CHAT_GEMMA: apply_gemma(msgs, n, add_generation_prompt, b); break;
    case CHAT_FAMILY_COUNT_: break;
    }
    sb_puts(b, ""); /* an empty conversation still yields "" */
    if (b->oom) return kvb_errf(err, KVB_ERR_NOMEM, "chat template: out of memory");
    return KVB_OK;
}

/* The final message continued: the text cut just after the last
 * occurrence of its content (or of the content trimmed, for templates that
 * trim it), as Hugging Face's continue_final_message did before its tag. */
static enum kvb_status builtin_cut(const struct chat_template *t, const struct chat_msg *msgs, size_t n, struct sbuf *b,
                                   struct kvb_err *err)
{
    const char *fin = msgs[n - 1].content;
    size_t fl = strlen(fin), tl = b->len;
    const char *text = b->p;
    const char *at = NULL;
    for (int pass = 0; pass < 2 && !at; pass++) {
        if (pass == 1) trim_span(&fin, &fl);
        for (size_t k = tl >= fl ? tl - fl + 1 : 0; k-- > 0;)
            if (memcmp(text + k, fin, fl) == 0) {
                at = text + k;
                break;
            }
    }
    if (!at)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "the %s chat template does not write the final message where it could be continued",
                        chat_family_name(t->family));
    const size_t cut = (size_t)(at - text) + fl;
    b->len = cut;
    b->p[cut] = '\0';
    size_t k = 0;
    for (size_t i = 0; i < b->nsp; i++) {
        if (b->sp[i].off >= cut) break;
        if (b->sp[i].off + b->sp[i].len > cut) b->sp[i].len = cut - b->sp[i].off;
        k++;
    }
    b->nsp = k;
    return KVB_OK;
}

enum kvb_status chat_builtin_render(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                                    bool add_generation_prompt, bool continue_final, struct jinja_output *out,
                                    struct kvb_err *err)
{
    memset(out, 0, sizeof *out);
    if (continue_final && (n == 0 || !msgs || !msgs[n - 1].role || strcmp(msgs[n - 1].role, "assistant") != 0))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "the last message must be the assistant's to be continued");
    struct sbuf b = {0};
    enum kvb_status st = builtin_apply(t, msgs, n, continue_final ? false : add_generation_prompt, &b, err);
    if (st == KVB_OK && continue_final) st = builtin_cut(t, msgs, n, &b, err);
    if (st != KVB_OK) {
        sb_free(&b);
        return st;
    }
    out->text = b.p;
    out->len = b.len;
    out->user = b.sp;
    out->n_user = b.nsp;
    return KVB_OK;
}

enum kvb_status chat_apply(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                           bool add_generation_prompt, char **out, struct kvb_err *err)
{
    if (!out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_apply: out is NULL");
    *out = NULL;
    struct jinja_output o;
    KVB_FORWARD_IF_ERROR(chat_builtin_render(t, msgs, n, add_generation_prompt, false, &o, err));
    kvb_free(o.user);
    *out = o.text;
    return KVB_OK;
}

enum kvb_status chat_apply_continue(const struct chat_template *t, const struct chat_msg *msgs, size_t n, char **out,
                                    struct kvb_err *err)
{
    if (!out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_apply_continue: out is NULL");
    *out = NULL;
    struct jinja_output o;
    KVB_FORWARD_IF_ERROR(chat_builtin_render(t, msgs, n, false, true, &o, err));
    kvb_free(o.user);
    *out = o.text;
    return KVB_OK;
}
