/* tok_spm.c — SentencePiece-style BPE (`tokenizer.ggml.model` = "llama"):
 * one raw-text fragment → ids.
 *
 * As the reference does it: spaces become U+2581 "▁" (and one is prepended
 * when asked — the dummy prefix), the text is cut into UTF-8 characters
 * (lengths from the lead byte alone, so invalid bytes stay as they are), and
 * adjacent symbols whose concatenation is a token merge, highest token score
 * first, leftmost on ties. A symbol left over that is not a token is written
 * as byte-fallback tokens <0xNN>, or as the unknown token when the vocab has
 * none for that byte. */
#include <string.h>

#include "alloc.h"
#include "tok_heap.h"
#include "tok_internal.h"
#include "unicode.h"

struct sym {
    uint32_t off, n; /* bytes of the buffer */
    int32_t prev, next;
};

struct spm_session {
    char *buf;
    size_t len;
    struct sym *syms;
    struct tok_heap heap;
};

static enum kvb_status add_bigram(const struct tok *t, struct spm_session *s, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return KVB_OK;
    const struct sym *l = &s->syms[left], *r = &s->syms[right];
    /* adjacent symbols are contiguous in buf, so their concatenation is a slice */
    size_t size = (size_t)l->n + r->n;
    int32_t id = tok_map_get(&t->vocab, s->buf + l->off, size);
    if (id < 0) return KVB_OK;
    struct tok_bigram b = {.prio = -(double)t->tokens[id].score, .left = left, .right = right, .size = size};
    return tok_heap_push(&s->heap, b);
}

static enum kvb_status encode(const struct tok *t, struct spm_session *s, const char *text, size_t len,
                              bool prefix_space, struct tok_ids *out)
{
    static const char k_space[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */
    size_t n_sp = prefix_space;
    for (size_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    s->buf = kvb_malloc(len + 2 * n_sp + 1);
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

    s->syms = kvb_malloc(o * sizeof *s->syms);
    if (!s->syms) return KVB_ERR_NOMEM;
    int32_t n = 0;
    for (size_t off = 0; off < o;) {
        size_t cl = unicode_utf8_len((unsigned char)s->buf[off]);
        if (cl > o - off) cl = o - off;
        s->syms[n] = (struct sym){.off = (uint32_t)off, .n = (uint32_t)cl, .prev = n - 1,
                                  .next = off + cl == o ? -1 : n + 1};
        off += cl;
        n++;
    }
    for (int32_t i = 1; i < n; i++) KVB_FORWARD_IF_ERROR(add_bigram(t, s, i - 1, i));

    struct tok_bigram b;
    while (tok_heap_pop(&s->heap, &b)) {
        struct sym *l = &s->syms[b.left], *r = &s->syms[b.right];
        if (l->n == 0 || r->n == 0 || (size_t)l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        KVB_FORWARD_IF_ERROR(add_bigram(t, s, l->prev, b.left));
        KVB_FORWARD_IF_ERROR(add_bigram(t, s, b.left, l->next));
    }

    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const struct sym *y = &s->syms[i];
        int32_t id = tok_map_get(&t->vocab, s->buf + y->off, y->n);
        if (id >= 0) {
            KVB_FORWARD_IF_ERROR(tok_ids_push(out, id));
            continue;
        }
        /* Only unmerged single characters get here (every merge makes a
         * token), so there is nothing to re-split: fall back to bytes. */
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t bid = t->byte_tok[(unsigned char)s->buf[y->off + j]];
            if (bid < 0) bid = t->unk;
            if (bid >= 0) KVB_FORWARD_IF_ERROR(tok_ids_push(out, bid));
        }
    }
    return KVB_OK;
}

enum kvb_status tok_spm_encode(const struct tok *t, const char *text, size_t len, bool prefix_space,
                               struct tok_ids *out)
{
    struct spm_session s = {0};
    enum kvb_status st = encode(t, &s, text, len, prefix_space, out);
    kvb_free(s.buf);
    kvb_free(s.syms);
    tok_heap_free(&s.heap);
    return st;
}
