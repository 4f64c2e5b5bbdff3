/* tok_bpe.c — byte-level BPE (`tokenizer.ggml.model` = "gpt2"): one raw-text
 * fragment → ids.
 *
 * As the reference does it: decode the bytes to code points (invalid UTF-8
 * becomes U+FFFD), split into words with the pre-tokenizer, write each word's
 * UTF-8 bytes as GPT-2's printable stand-in characters, then merge adjacent
 * symbols by merge rank (lowest first, leftmost on ties) with a heap over a
 * linked list of symbols, so a long word costs O(n log n), not O(n^2). A
 * final symbol that is not a token falls back to its single bytes' tokens
 * (those that exist). */
#include <string.h>

#include "alloc.h"
#include "tok_heap.h"
#include "tok_internal.h"
#include "tok_pre.h"
#include "unicode.h"

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves,
 * the other 68 (0x00-0x20, 0x7F-0xA0, 0xAD) become U+0100.. in byte order. */
uint32_t tok_byte_to_cpt(uint8_t b)
{
    if (b <= 0x20) return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0) return 0x100u + 33u + (b - 0x7Fu);
    if (b == 0xAD) return 0x100u + 67u;
    return b;
}

int tok_cpt_to_byte(uint32_t cpt)
{
    if (cpt < 0x100) {
        if (cpt <= 0x20 || (cpt >= 0x7F && cpt <= 0xA0) || cpt == 0xAD) return -1;
        return (int)cpt;
    }
    if (cpt < 0x100 + 33) return (int)(cpt - 0x100);
    if (cpt < 0x100 + 67) return (int)(cpt - 0x100 - 33 + 0x7F);
    if (cpt == 0x100 + 67) return 0xAD;
    return -1;
}

struct sym {
    uint32_t off, n; /* bytes of the word buffer */
    int32_t prev, next;
};

struct bpe_session {
    uint32_t *cpts;
    size_t cpts_cap;
    struct tok_pre_words words;
    char *word; /* the current word, byte-encoded */
    size_t word_len, word_cap;
    struct sym *syms;
    size_t syms_cap;
    char *key; /* "left right" lookup key */
    size_t key_cap;
    struct tok_heap heap;
};

static void session_free(struct bpe_session *s)
{
    kvb_free(s->cpts);
    tok_pre_words_free(&s->words);
    kvb_free(s->word);
    kvb_free(s->syms);
    kvb_free(s->key);
    tok_heap_free(&s->heap);
}

/* Returns p grown to hold `need` elements (updating *cap), or NULL (p intact). */
static void *reserve(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = kvb_realloc(p, nc * elem);
    if (np) *cap = nc;
    return np;
}

/* Merge rank of the adjacent symbols a, b, or -1. s->key has room for the
 * whole word plus the space. */
static int32_t rank_of(const struct tok *t, struct bpe_session *s, const struct sym *a, const struct sym *b)
{
    size_t need = (size_t)a->n + 1 + b->n;
    memcpy(s->key, s->word + a->off, a->n);
    s->key[a->n] = ' ';
    memcpy(s->key + a->n + 1, s->word + b->off, b->n);
    return tok_map_get(&t->ranks, s->key, need);
}

static enum kvb_status add_bigram(const struct tok *t, struct bpe_session *s, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return KVB_OK;
    int32_t rank = rank_of(t, s, &s->syms[left], &s->syms[right]);
    if (rank < 0) return KVB_OK;
    struct tok_bigram b = {.prio = rank, .left = left, .right = right,
                           .size = (size_t)s->syms[left].n + s->syms[right].n};
    return tok_heap_push(&s->heap, b);
}

static enum kvb_status merge_word(const struct tok *t, struct bpe_session *s, struct tok_ids *out)
{
    const size_t len = s->word_len;
    if (t->ignore_merges) { /* Llama 3: a word that is a token is taken whole */
        int32_t id = tok_map_get(&t->vocab, s->word, len);
        if (id >= 0) return tok_ids_push(out, id);
    }
    struct sym *ns = reserve(s->syms, &s->syms_cap, len, sizeof *s->syms);
    if (!ns) return KVB_ERR_NOMEM;
    s->syms = ns;
    char *nk = reserve(s->key, &s->key_cap, len + 1, 1);
    if (!nk) return KVB_ERR_NOMEM;
    s->key = nk;
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t cl = unicode_utf8_len((unsigned char)s->word[off]);
        if (cl > len - off) cl = len - off;
        s->syms[n] = (struct sym){.off = (uint32_t)off, .n = (uint32_t)cl, .prev = n - 1,
                                  .next = off + cl == len ? -1 : n + 1};
        off += cl;
        n++;
    }
    s->heap.n = 0;
    for (int32_t i = 1; i < n; i++) KVB_FORWARD_IF_ERROR(add_bigram(t, s, i - 1, i));

    struct tok_bigram b;
    while (tok_heap_pop(&s->heap, &b)) {
        struct sym *l = &s->syms[b.left], *r = &s->syms[b.right];
        /* A bigram is stale once either side merged with something else;
         * symbols only grow, so the byte count tells. */
        if (l->n == 0 || r->n == 0 || (size_t)l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        KVB_FORWARD_IF_ERROR(add_bigram(t, s, l->prev, b.left));
        KVB_FORWARD_IF_ERROR(add_bigram(t, s, b.left, l->next));
    }

    for (int32_t i = 0; i >= 0 && n > 0; i = s->syms[i].next) {
        const struct sym *y = &s->syms[i];
        int32_t id = tok_map_get(&t->vocab, s->word + y->off, y->n);
        if (id >= 0) {
            KVB_FORWARD_IF_ERROR(tok_ids_push(out, id));
            continue;
        }
        /* Not a token: the tokens of its single bytes, skipping the absent
         * (the reference does the same; a complete vocab never gets here). */
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t bid = tok_map_get(&t->vocab, s->word + y->off + j, 1);
            if (bid >= 0) KVB_FORWARD_IF_ERROR(tok_ids_push(out, bid));
        }
    }
    return KVB_OK;
}

static enum kvb_status encode(const struct tok *t, struct bpe_session *s, const char *text, size_t len,
                              struct tok_ids *out)
{
    if (len == 0) return KVB_OK;
    uint32_t *nc = reserve(s->cpts, &s->cpts_cap, len, sizeof *s->cpts);
    if (!nc) return KVB_ERR_NOMEM;
    s->cpts = nc;
    size_t n = 0;
    for (size_t pos = 0; pos < len;) s->cpts[n++] = unicode_decode_lenient(text, len, &pos);
    KVB_FORWARD_IF_ERROR(tok_pre_split(t->split, s->cpts, n, &s->words));

    size_t start = 0;
    for (size_t w = 0; w < s->words.n; w++) {
        size_t end = s->words.ends[w];
        /* each code point: up to 4 UTF-8 bytes, each written as a 1-2 byte stand-in */
        char *nw = reserve(s->word, &s->word_cap, (end - start) * 8, 1);
        if (!nw) return KVB_ERR_NOMEM;
        s->word = nw;
        s->word_len = 0;
        for (size_t i = start; i < end; i++) {
            char u[4];
            size_t ul = unicode_encode(s->cpts[i], u);
            for (size_t j = 0; j < ul; j++)
                s->word_len += unicode_encode(tok_byte_to_cpt((uint8_t)u[j]), s->word + s->word_len);
        }
        KVB_FORWARD_IF_ERROR(merge_word(t, s, out));
        start = end;
    }
    return KVB_OK;
}

enum kvb_status tok_bpe_encode(const struct tok *t, const char *text, size_t len, struct tok_ids *out)
{
    struct bpe_session s = {0};
    enum kvb_status st = encode(t, &s, text, len, out);
    session_free(&s);
    return st;
}
