/* chat_render.c — a chat request rendered by the template chosen for it:
 * the model's Jinja template as transformers' apply_chat_template renders
 * it (render_jinja_template in transformers/utils/chat_template_utils.py
 * read as the specification), or a built-in family (chat.c). See chat.h. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/json.h"
#include "base/unicode.h"
#include "text/chat.h"
#include "text/chat_internal.h"

enum kvb_status chat_template_from_text_limited(const char *text, size_t len, const char *source,
                                                const struct jinja_limits *lim, struct chat_template *out,
                                                struct kvb_err *err)
{
    memset(out, 0, sizeof *out);
    snprintf(out->source, sizeof out->source, "%s", source ? source : "template");
    chat_text_hash(text, len, out->hash);
    return jinja_compile(text, len, out->source, lim, &out->jinja, err);
}

enum kvb_status chat_template_from_text(const char *text, size_t len, const char *source, struct chat_template *out,
                                        struct kvb_err *err)
{
    return chat_template_from_text_limited(text, len, source, NULL, out, err);
}

void chat_text_hash(const char *text, size_t len, char out[17])
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

enum kvb_status chat_template_set_tokens(struct chat_template *t, const char *bos, const char *eos)
{
    char *b = bos ? kvb_strndup(bos, strlen(bos)) : NULL, *e = eos ? kvb_strndup(eos, strlen(eos)) : NULL;
    if ((bos && !b) || (eos && !e)) {
        kvb_free(b);
        kvb_free(e);
        return KVB_ERR_NOMEM;
    }
    kvb_free(t->bos_token);
    kvb_free(t->eos_token);
    t->bos_token = b;
    t->eos_token = e;
    return KVB_OK;
}

bool chat_template_writes_bos(const struct chat_template *t) { return t && t->jinja; }

void chat_template_describe(const struct chat_template *t, char *buf, size_t cap)
{
    if (!t) snprintf(buf, cap, "none");
    else if (t->jinja) snprintf(buf, cap, "%s@%.12s", t->source, t->hash);
    else snprintf(buf, cap, "%s", chat_template_name(t));
}

/* transformers appends this to the final message and cuts the text where
 * it comes out (continue_final_message). */
static const char TAG[] = "CONTINUE_FINAL_MESSAGE_TAG ";

/* Names the template's callers may not set through kwargs: they are
 * apply_chat_template's own parameters. */
static const char *const k_reserved[] = {
    "messages",      "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template", "tokenize",     NULL};

static bool put(struct kvb_buf *b, const char *s, size_t n)
{
    if (kvb_buf_reserve(b, n + 1) != KVB_OK) return false;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static bool puts_(struct kvb_buf *b, const char *s) { return put(b, s, strlen(s)); }

/* The template's variables besides the messages, as a JSON object:
 * add_generation_prompt, tools and documents as null, then the kwargs'
 * members. */
static enum kvb_status vars_json(const struct chat_input *in, struct kvb_buf *b, struct kvb_err *err)
{
    bool ok = puts_(b, "{");
    ok = ok && puts_(b, "\"add_generation_prompt\":") && puts_(b, in->add_generation_prompt ? "true" : "false") &&
         puts_(b, ",\"tools\":null,\"documents\":null");
    if (!ok) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    if (in->kwargs_json) {
        struct json_doc j;
        const char *why = NULL;
        size_t where = 0;
        enum kvb_status st = json_parse(in->kwargs_json, in->kwargs_len, &j, &why, &where);
        if (st == KVB_ERR_NOMEM) return kvb_errf(err, st, "out of memory");
        if (st != KVB_OK) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_template_kwargs is not JSON (%s)", why);
        if (json_kind(&j, 0) != JSON_OBJECT) {
            json_free(&j);
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_template_kwargs must be an object");
        }
        int k = 1;
        for (int m = 0; m < j.tok[0].size; m++, k = json_skip(&j, k + 1)) {
            for (const char *const *r = k_reserved; *r; r++)
                if (json_str_eq(&j, k, *r)) {
                    json_free(&j);
                    return kvb_errf(err, KVB_ERR_INVALID_ARG,
                                    "chat_template_kwargs may not set '%s' (a request field or fixed by kvbatch)", *r);
                }
            /* the member as written, from the key's opening quote to the
             * end of its value (a string token ends before its quote) */
            const jsmntok_t *kt = &j.tok[k], *vt = &j.tok[k + 1];
            const size_t end = (size_t)vt->end + (vt->type == JSMN_STRING);
            ok = ok && puts_(b, ",") && put(b, in->kwargs_json + kt->start - 1, end - (size_t)(kt->start - 1));
        }
        json_free(&j);
    }
    ok = ok && puts_(b, "}");
    if (!ok) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    return KVB_OK;
}

/* Python's str.strip on the bytes s[0..n): the span left. */
static void py_strip(const char *s, size_t n, size_t *a, size_t *e)
{
    size_t i = 0, first = n, last = 0;
    while (i < n) {
        size_t at = i;
        uint32_t c = unicode_decode_lenient(s, n, &i);
        bool sp = (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
                  (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
                  c == 0x3000;
        if (sp) continue;
        if (first == n) first = at;
        last = i;
    }
    *a = first == n ? n : first;
    *e = first == n ? n : last;
}

static void cut_spans(struct jinja_output *o, size_t cut)
{
    size_t k = 0;
    for (size_t i = 0; i < o->n_user; i++) {
        if (o->user[i].off >= cut) break;
        if (o->user[i].off + o->user[i].len > cut) o->user[i].len = cut - o->user[i].off;
        k++;
    }
    o->n_user = k;
    o->len = cut;
    o->text[cut] = '\0';
}

/* transformers' cut for continue_final_message: at the last tag; when the
 * template kept the tag's trailing space the text ends right before it,
 * else (it stripped the content) trailing white space goes too. */
static enum kvb_status continue_cut(const struct chat_template *t, const struct chat_input *in, struct jinja_output *o,
                                    struct kvb_err *err)
{
    const char *fin = in->msgs[in->n - 1].content;
    size_t a, e;
    py_strip(fin, strlen(fin), &a, &e);
    const size_t tag_n = sizeof TAG - 2; /* without its space */
    const char *found = NULL;
    for (size_t k = o->len >= tag_n ? o->len - tag_n + 1 : 0; k-- > 0;)
        if (memcmp(o->text + k, TAG, tag_n) == 0) {
            found = o->text + k;
            break;
        }
    if (!found || (e > a && !memmem(o->text, o->len, fin + a, e - a)))
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "template %s: continue_final_message is set but the final message does not appear in the "
                        "chat the template writes (it deletes part of it)",
                        t->source);
    size_t cut = (size_t)(found - o->text);
    if (!(cut + tag_n < o->len && o->text[cut + tag_n] == ' ')) {
        size_t s0, s1;
        py_strip(o->text, cut, &s0, &s1);
        cut = s0 == cut ? 0 : s1; /* rstrip (an all-space prefix goes entirely) */
    }
    cut_spans(o, cut);
    return KVB_OK;
}

enum kvb_status chat_render(const struct chat_template *t, const struct chat_input *in, struct jinja_output *out,
                            struct kvb_err *err)
{
    memset(out, 0, sizeof *out);
    if (!t || !in) return kvb_errf(err, KVB_ERR_INVALID_ARG, "chat_render: no template or input");
    if (in->continue_final_message && in->add_generation_prompt)
        return kvb_errf(err, KVB_ERR_INVALID_ARG,
                        "continue_final_message and add_generation_prompt are not compatible");
    if (!t->jinja) {
        if (in->kwargs_json) {
            /* an empty object changes nothing; anything else would be ignored */
            size_t i = 0;
            while (i < in->kwargs_len &&
                   (in->kwargs_json[i] == ' ' || in->kwargs_json[i] == '\t' || in->kwargs_json[i] == '\n' ||
                    in->kwargs_json[i] == '\r' || in->kwargs_json[i] == '{'))
                i++;
            if (i < in->kwargs_len && in->kwargs_json[i] != '}')
                return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                                "chat_template_kwargs: the built-in %s template takes no variables (run with the "
                                "model's own template, or a template file)",
                                chat_template_name(t));
        }
        return chat_builtin_render(t, in->msgs, in->n, in->add_generation_prompt, in->continue_final_message, out, err);
    }
    if (in->continue_final_message) {
        if (in->n == 0)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "continue_final_message is set but the conversation is empty");
        if (!jinja_source_contains(t->jinja, "content"))
            return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                            "template %s: continue_final_message is set but the template never names the field "
                            "\"content\" it continues",
                            t->source);
    }
    struct kvb_buf vars = {0};
    enum kvb_status st = vars_json(in, &vars, err);
    /* the messages, read in place; a continued final one carries the tag */
    struct jinja_msg *msgs = st == KVB_OK ? kvb_calloc(in->n ? in->n : 1, sizeof *msgs) : NULL;
    char *tagged = NULL;
    if (st == KVB_OK && !msgs) st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == KVB_OK && i < in->n; i++) {
        const struct chat_msg *m = &in->msgs[i];
        if (!m->role || !m->content) {
            st = kvb_errf(err, KVB_ERR_INVALID_ARG, "message %zu: role or content missing", i);
            break;
        }
        msgs[i] = (struct jinja_msg){m->role, m->content, strlen(m->content)};
        if (in->continue_final_message && i + 1 == in->n) {
            tagged = kvb_malloc(msgs[i].content_len + sizeof TAG);
            if (!tagged) {
                st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
                break;
            }
            memcpy(tagged, m->content, msgs[i].content_len);
            memcpy(tagged + msgs[i].content_len, TAG, sizeof TAG);
            msgs[i].content = tagged;
            msgs[i].content_len += sizeof TAG - 1;
        }
    }
    if (st != KVB_OK) {
        kvb_buf_free(&vars);
        kvb_free(msgs);
        kvb_free(tagged);
        return st;
    }
    struct jinja_strvar sv[2];
    size_t nsv = 0;
    if (t->bos_token) sv[nsv++] = (struct jinja_strvar){"bos_token", t->bos_token};
    if (t->eos_token) sv[nsv++] = (struct jinja_strvar){"eos_token", t->eos_token};
    const struct jinja_input ji = {.strs = sv,
                                   .n_strs = nsv,
                                   .msgs = msgs,
                                   .n_msgs = in->n,
                                   .user_json = vars.data,
                                   .user_json_len = vars.len,
                                   .now = in->now};
    st = jinja_render(t->jinja, &ji, NULL, out, err);
    kvb_buf_free(&vars);
    kvb_free(msgs);
    kvb_free(tagged);
    if (st != KVB_OK) return st;
    if (in->continue_final_message && (st = continue_cut(t, in, out, err)) != KVB_OK) jinja_output_free(out);
    return st;
}
