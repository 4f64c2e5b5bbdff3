/* tok_spm.c — SentencePiece-style BPE (`tokenizer.ggml.model` = "llama"):
 * one raw-text fragment → ids.
 *
 * As the reference does it: spaces become U+2581 "▁" (and one is prepended
 * when asked — the dummy prefix), the text is cut into UTF-8 characters
 * (lengths from the lead byte alone, so invalid bytes stay as they are), and
 * adjacent symbols whose concatenation is a token merge, highest token score
 * first, leftmost on ties. A symbol left over that is not a token is written
 * as byte-fallback tokens <0xNN>, or as the unknown token when the vocab has
 * none for that byte. The merging is tok_merge.c's, over the buffer's bytes. */
#include <string.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "text/tok_internal.h"
#include "text/tok_merge.h"

struct spm_session {
    const struct tok *t;
    char *buf;
    size_t len;
    struct tok_merge merge;
};

/* SentencePiece orders by score, higher first; tok_merge pops the least
 * key. This maps floats to 32-bit keys in reverse order of their value
 * (ties stay ties: -0 counts as 0). */
static uint32_t score_key(float score)
{
    if (score == 0.0f) score = 0.0f;
    uint32_t u;
    memcpy(&u, &score, sizeof u);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u; /* ascending with the value */
    return ~u;
}

/* tok_merge_key_fn: adjacent symbols are contiguous in buf, so their
 * concatenation is the slice [a, c). */
static bool score_of(void *user, int32_t a, int32_t b, int32_t c, uint32_t *key)
{
    (void)b;
    const struct spm_session *s = user;
    size_t size = (size_t)(c - a);
    if (size > s->t->max_len) return false;
    int32_t id = tok_map_get(&s->t->vocab, s->buf + a, size);
    if (id < 0) return false;
    *key = score_key(s->t->tokens[id].score);
    return true;
}

static enum kvb_status encode(struct spm_session *s, const char *text, size_t len, bool prefix_space,
                              const struct tok_limits *lim, struct tok_ids *out)
{
    const struct tok *t = s->t;
    static const char k_space[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */
    size_t n_sp = prefix_space;
    for (size_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    const size_t o_len = len + 2 * n_sp;
    s->buf = kvb_malloc(o_len + 1);
    if (!s->buf) return KVB_ERR_NOMEM;
    size_t o = 0;
    if (prefix_space) {
        memcpy(s->buf, k_space, 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + o, k_space, 3);
            o += 3;
        } else {
            s->buf[o++] = text[i];
        }
    }
    s->len = o;
    if (o == 0) return KVB_OK;
    if (lim->max_ids) KVB_FORWARD_IF_ERROR(tok_check_room(t, lim, out->n, tok_live_bytes(t, s->buf, o)));

    KVB_FORWARD_IF_ERROR(tok_merge_start(&s->merge, s->buf, o, true));
    KVB_FORWARD_IF_ERROR(tok_merge_run(&s->merge, score_of, s, lim));
    for (int32_t i = 0; i >= 0; i = s->merge.sym[i].next) {
        const size_t a = (size_t)i, n = (size_t)tok_merge_end(&s->merge, i) - a;
        int32_t id = n <= t->max_len ? tok_map_get(&t->vocab, s->buf + a, n) : -1;
        if (id >= 0) {
            KVB_FORWARD_IF_ERROR(tok_ids_push(out, id));
            continue;
        }
        /* Only unmerged single characters get here (every merge makes a
         * token), so there is nothing to re-split: fall back to bytes. */
        for (size_t j = 0; j < n; j++) {
            int32_t bid = t->byte_tok[(unsigned char)s->buf[a + j]];
            if (bid < 0) bid = t->unk;
            if (bid >= 0) KVB_FORWARD_IF_ERROR(tok_ids_push(out, bid));
        }
    }
    return tok_check_room(t, lim, out->n, 0);
}

enum kvb_status tok_spm_encode(const struct tok *t, const char *text, size_t len, bool prefix_space,
                               const struct tok_limits *lim, struct tok_ids *out)
{
    struct spm_session s = {.t = t};
    enum kvb_status st = encode(&s, text, len, prefix_space, lim, out);
    kvb_free(s.buf);
    tok_merge_free(&s.merge);
    return st;
}
