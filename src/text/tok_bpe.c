/* tok_bpe.c — byte-level BPE (`tokenizer.ggml.model` = "gpt2"): one raw-text
 * fragment → ids.
 *
 * As the reference does it: decode the bytes to code points (invalid UTF-8
 * becomes U+FFFD), split into words with the pre-tokenizer, take each word's
 * UTF-8 bytes as GPT-2's printable stand-in characters, then merge adjacent
 * symbols by merge rank (lowest first, leftmost on ties: tok_merge.c), so a
 * long word costs O(n log n), not O(n^2). A final symbol that is not a token
 * falls back to the tokens of its stand-in text's single bytes (those that
 * exist).
 *
 * Memory is kept to a few bytes per byte of text, since one prompt may be
 * megabytes without a space: the words are written out as plain UTF-8 (the
 * code points and their class bits are freed before merging), symbols are
 * runs of those bytes, and only a lookup key — never longer than the
 * longest merge or token — is written in stand-in characters. */
#include <string.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "text/tok_internal.h"
#include "text/tok_merge.h"
#include "text/tok_pre.h"

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

/* Reused across the words of one fragment. */
struct bpe_session {
    const struct tok *t;
    uint32_t *cpts;
    size_t cpts_cap;
    struct tok_pre_words words;
    char *raw; /* the fragment's words as UTF-8, back to back */
    size_t raw_cap;
    const char *word; /* the word being merged: into raw */
    struct tok_merge merge;
    char *key; /* a lookup key in stand-in form */
    size_t key_cap;
    uint8_t sl[256]; /* stand-in of byte b: sl[b] bytes of sb[b] */
    char sb[256][2];
};

static void session_free(struct bpe_session *s)
{
    kvb_free(s->cpts);
    tok_pre_words_free(&s->words);
    kvb_free(s->raw);
    tok_merge_free(&s->merge);
    kvb_free(s->key);
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

/* Appends the stand-in form of w[0..n) to s->key at *at, stopping (false)
 * once it would pass `limit` bytes. */
static bool put_standin(struct bpe_session *s, const char *w, size_t n, size_t *at, size_t limit)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)w[i];
        if (*at + s->sl[b] > limit) return false;
        memcpy(s->key + *at, s->sb[b], s->sl[b]);
        *at += s->sl[b];
    }
    return true;
}

/* tok_merge_key_fn: the rank of merging [a, b) with [b, c). A pair longer
 * than the longest merge string cannot be one (stand-ins only lengthen). */
static bool rank_of(void *user, int32_t a, int32_t b, int32_t c, uint32_t *key)
{
    struct bpe_session *s = user;
    const size_t limit = s->t->max_merge_len;
    if ((size_t)(c - a) + 1 > limit) return false;
    size_t at = 0;
    if (!put_standin(s, s->word + a, (size_t)(b - a), &at, limit) || at + 1 > limit) return false;
    s->key[at++] = ' ';
    if (!put_standin(s, s->word + b, (size_t)(c - b), &at, limit)) return false;
    int32_t rank = tok_map_get(&s->t->ranks, s->key, at);
    if (rank < 0) return false;
    *key = (uint32_t)rank;
    return true;
}

/* The token whose stand-in text is w[0..n), or -1. */
static int32_t token_of(struct bpe_session *s, const char *w, size_t n)
{
    size_t at = 0;
    if (n > s->t->max_len || !put_standin(s, w, n, &at, s->t->max_len)) return -1;
    return tok_map_get(&s->t->vocab, s->key, at);
}

static enum kvb_status merge_word(struct bpe_session *s, const char *w, size_t len, const struct tok_limits *lim,
                                  struct tok_ids *out)
{
    const struct tok *t = s->t;
    if (t->ignore_merges) { /* Llama 3: a word that is a token is taken whole */
        int32_t id = token_of(s, w, len);
        if (id >= 0) return tok_ids_push(out, id);
    }
    s->word = w;
    KVB_FORWARD_IF_ERROR(tok_merge_start(&s->merge, w, len, false));
    KVB_FORWARD_IF_ERROR(tok_merge_run(&s->merge, rank_of, s, lim));
    for (int32_t i = 0; i >= 0; i = s->merge.sym[i].next) {
        const size_t a = (size_t)i, n = (size_t)tok_merge_end(&s->merge, i) - a;
        int32_t id = token_of(s, w + a, n);
        if (id >= 0) {
            KVB_FORWARD_IF_ERROR(tok_ids_push(out, id));
            continue;
        }
        /* Not a token: the tokens of the single bytes of its stand-in text,
         * skipping the absent (the reference does the same; a complete
         * vocab never gets here). */
        for (size_t j = 0; j < n; j++) {
            uint8_t b = (uint8_t)w[a + j];
            for (uint8_t k = 0; k < s->sl[b]; k++) {
                int32_t bid = tok_map_get(&t->vocab, &s->sb[b][k], 1);
                if (bid >= 0) KVB_FORWARD_IF_ERROR(tok_ids_push(out, bid));
            }
        }
    }
    return KVB_OK;
}

/* Code points between two looks at the cancel flag while decoding. */
#define POLL_CPTS ((size_t)1 << 20)

static enum kvb_status encode(struct bpe_session *s, const char *text, size_t len, const struct tok_limits *lim,
                              struct tok_ids *out)
{
    const struct tok *t = s->t;
    if (len == 0) return KVB_OK;
    uint32_t *nc = reserve(s->cpts, &s->cpts_cap, len, sizeof *s->cpts);
    if (!nc) return KVB_ERR_NOMEM;
    s->cpts = nc;
    size_t n = 0;
    uint64_t bytes = 0, live = 0; /* of the code points' UTF-8 */
    for (size_t pos = 0; pos < len;) {
        uint32_t c = unicode_decode_lenient(text, len, &pos);
        s->cpts[n++] = c;
        char u[4];
        size_t ul = unicode_encode(c, u);
        bytes += ul;
        live += tok_live_bytes(t, u, ul);
        if (n % POLL_CPTS == 0 && tok_cancelled(lim)) return KVB_ERR_CANCELLED;
    }
    KVB_FORWARD_IF_ERROR(tok_check_room(t, lim, out->n, live));
    KVB_FORWARD_IF_ERROR(tok_pre_split(t->split, s->cpts, n, &s->words));
    if (tok_cancelled(lim)) return KVB_ERR_CANCELLED;

    /* The words as UTF-8; their ends become byte offsets. */
    char *nr = reserve(s->raw, &s->raw_cap, (size_t)bytes, 1);
    if (!nr) return KVB_ERR_NOMEM;
    s->raw = nr;
    size_t at = 0, start = 0;
    for (size_t w = 0; w < s->words.n; w++) {
        const size_t end = s->words.ends[w];
        for (size_t i = start; i < end; i++) at += unicode_encode(s->cpts[i], s->raw + at);
        s->words.ends[w] = (uint32_t)at;
        start = end;
    }
    /* What only the split needed goes before the merging, which needs the
     * most: a word may be the whole fragment. */
    kvb_free(s->cpts);
    s->cpts = NULL;
    s->cpts_cap = 0;
    tok_pre_words_trim(&s->words);

    size_t ws = 0;
    for (size_t w = 0; w < s->words.n; w++) {
        const size_t we = s->words.ends[w];
        if (lim->max_ids) KVB_FORWARD_IF_ERROR(tok_check_room(t, lim, out->n, tok_live_bytes(t, s->raw + ws, we - ws)));
        if (w % 4096 == 4095 && tok_cancelled(lim)) return KVB_ERR_CANCELLED;
        KVB_FORWARD_IF_ERROR(merge_word(s, s->raw + ws, we - ws, lim, out));
        ws = we;
    }
    return tok_check_room(t, lim, out->n, 0);
}

enum kvb_status tok_bpe_encode(const struct tok *t, const char *text, size_t len, const struct tok_limits *lim,
                               struct tok_ids *out)
{
    struct bpe_session s = {.t = t};
    for (int b = 0; b < 256; b++) {
        char u[4];
        s.sl[b] = (uint8_t)unicode_encode(tok_byte_to_cpt((uint8_t)b), u); /* 1 or 2: the stand-ins are < U+0144 */
        memcpy(s.sb[b], u, 2);
    }
    /* The longest key: a merge string, or a token's text. */
    size_t key_need = (t->max_merge_len > t->max_len ? t->max_merge_len : t->max_len) + 1;
    s.key = kvb_malloc(key_need);
    enum kvb_status st = s.key ? encode(&s, text, len, lim, out) : KVB_ERR_NOMEM;
    session_free(&s);
    return st;
}
