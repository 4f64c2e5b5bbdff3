/* tok.c — encoding entry point and the small queries of tok.h.
 *
 * tok_encode first cuts the text around special tokens (the reference's
 * "special-token partition": each candidate token, longest text first, is
 * searched in every remaining raw fragment), then hands each raw fragment to
 * the BPE or SentencePiece encoder and adds BOS/EOS. Loading is in
 * tok_load.c, decoding in tok_decode.c. */
#include <string.h>

#include "base/alloc.h"
#include "text/tok_internal.h"

enum kvb_status tok_ids_push(struct tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t nc = ids->cap ? ids->cap * 2 : 64;
        int32_t *nv = kvb_realloc(ids->v, nc * sizeof *nv);
        if (!nv) return KVB_ERR_NOMEM;
        ids->v = nv;
        ids->cap = nc;
    }
    ids->v[ids->n++] = id;
    return KVB_OK;
}

int32_t tok_n_vocab(const struct tok *t) { return t->n_vocab; }
int32_t tok_bos(const struct tok *t) { return t->bos; }
int32_t tok_eos(const struct tok *t) { return t->eos; }
bool tok_wants_bos(const struct tok *t) { return t->add_bos && t->bos >= 0; }

bool tok_is_eog(const struct tok *t, int32_t id)
{
    size_t lo = 0, hi = t->n_eog;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->eog[mid] == id) return true;
        if (t->eog[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

int32_t tok_find(const struct tok *t, const char *text)
{
    return text ? tok_map_get(&t->vocab, text, strlen(text)) : -1;
}

/* A piece of the input: raw text still to tokenize, or a special token. */
struct frag {
    int32_t id; /* -1 for raw text */
    size_t off, len;
};

struct frags {
    struct frag *v;
    size_t n, cap;
};

static enum kvb_status frag_push(struct frags *fs, struct frag f)
{
    if (fs->n == fs->cap) {
        size_t nc = fs->cap ? fs->cap * 2 : 16;
        struct frag *nv = kvb_realloc(fs->v, nc * sizeof *nv);
        if (!nv) return KVB_ERR_NOMEM;
        fs->v = nv;
        fs->cap = nc;
    }
    fs->v[fs->n++] = f;
    return KVB_OK;
}

/* C-locale isspace, which is what the reference strips around special tokens. */
static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Whether bytes [at, at+n) touch one of lim's plain spans (sorted). */
static bool in_plain(const struct tok_limits *lim, size_t at, size_t n)
{
    size_t lo = 0, hi = lim->n_plain;
    while (lo < hi) { /* the first span that ends after at */
        size_t mid = lo + (hi - lo) / 2;
        if (lim->plain[mid].off + lim->plain[mid].len <= at) lo = mid + 1;
        else hi = mid;
    }
    return lo < lim->n_plain && lim->plain[lo].off < at + n;
}

/* Splits every raw fragment of *cur around occurrences of special token id,
 * writing the result to *next. An occurrence that touches a plain span is
 * left as text when guard is set (a control token in the user's text). */
static enum kvb_status split_on(const struct tok *t, int32_t id, const char *text, const struct frags *cur,
                                struct frags *next, const struct tok_limits *lim, bool guard)
{
    const struct tok_entry *e = &t->tokens[id];
    const char *needle = t->text + e->off;
    next->n = 0;
    for (size_t i = 0; i < cur->n; i++) {
        struct frag f = cur->v[i];
        if (f.id >= 0 || f.len < e->len) {
            KVB_FORWARD_IF_ERROR(frag_push(next, f));
            continue;
        }
        size_t off = f.off, len = f.len, from = off;
        for (;;) {
            const size_t room = off + len - from;
            const char *m = room >= e->len ? memmem(text + from, room, needle, e->len) : NULL;
            if (!m) {
                if (len > 0) KVB_FORWARD_IF_ERROR(frag_push(next, (struct frag){-1, off, len}));
                break;
            }
            size_t at = (size_t)(m - text);
            if (guard && in_plain(lim, at, e->len)) {
                from = at + 1;
                continue;
            }
            size_t left = at - off;
            if (e->attr & TOK_ATTR_LSTRIP)
                while (left > 0 && is_space(text[off + left - 1])) left--;
            if (left > 0) KVB_FORWARD_IF_ERROR(frag_push(next, (struct frag){-1, off, left}));
            KVB_FORWARD_IF_ERROR(frag_push(next, (struct frag){id, 0, 0}));
            size_t r_off = at + e->len, r_len = off + len - r_off;
            if (e->attr & TOK_ATTR_RSTRIP)
                while (r_len > 0 && is_space(text[r_off])) r_off++, r_len--;
            off = r_off;
            len = r_len;
            from = off;
            if (len == 0) break;
        }
    }
    return KVB_OK;
}

static enum kvb_status encode(const struct tok *t, const char *text, size_t len, unsigned flags,
                              const struct tok_limits *lim, struct frags *a, struct frags *b, struct tok_ids *out)
{
    if (len > 0) KVB_FORWARD_IF_ERROR(frag_push(a, (struct frag){-1, 0, len}));
    for (size_t i = 0; i < t->n_special && a->n > 0; i++) {
        int32_t id = t->special[i];
        /* Without TOK_PARSE_SPECIAL, control and unknown tokens are plain
         * text; user-defined ones are still split out (as upstream does). */
        const bool parsed_only = t->tokens[id].attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN);
        if (!(flags & TOK_PARSE_SPECIAL) && parsed_only) continue;
        if (tok_cancelled(lim)) return KVB_ERR_CANCELLED; /* each pass reads all the text */
        KVB_FORWARD_IF_ERROR(split_on(t, id, text, a, b, lim, parsed_only && lim->n_plain > 0));
        struct frags tmp = *a;
        *a = *b;
        *b = tmp;
    }

    if ((flags & TOK_ADD_BOS) && t->bos >= 0) KVB_FORWARD_IF_ERROR(tok_ids_push(out, t->bos));
    bool prev_special = true; /* SentencePiece: the dummy prefix goes at the start and after special tokens */
    for (size_t i = 0; i < a->n; i++) {
        const struct frag *f = &a->v[i];
        if (f->id >= 0) {
            KVB_FORWARD_IF_ERROR(tok_ids_push(out, f->id));
            prev_special = true;
        } else if (t->kind == TOK_KIND_SPM) {
            KVB_FORWARD_IF_ERROR(
                tok_spm_encode(t, text + f->off, f->len, t->add_space_prefix && prev_special, lim, out));
            prev_special = false;
        } else {
            KVB_FORWARD_IF_ERROR(tok_bpe_encode(t, text + f->off, f->len, lim, out));
        }
        if (lim->max_ids && out->n > lim->max_ids) return KVB_ERR_RANGE;
    }
    if ((flags & TOK_ADD_EOS) && t->eos >= 0) KVB_FORWARD_IF_ERROR(tok_ids_push(out, t->eos));
    if (lim->max_ids && out->n > lim->max_ids) return KVB_ERR_RANGE;
    return KVB_OK;
}

/* A lower bound on the live bytes the encoders will be given, from the raw
 * text alone (tok_internal.h says what a live byte is): BPE decoding keeps
 * ASCII bytes as they are (other bytes may change); SentencePiece keeps
 * every byte, a space becoming "▁". Bytes inside special tokens are not in
 * the encoders' input, but each such token covers at most max_cover bytes
 * too; the white space a special token may strip is not counted. */
static uint64_t live_at_least(const struct tok *t, const char *text, size_t len)
{
    uint64_t c = 0;
    const bool spm = t->kind == TOK_KIND_SPM;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)text[i];
        if (t->strip_specials && is_space((char)b)) continue;
        if (spm) c += t->byte_live[b == ' ' ? 0xE2 : b];
        else c += b < 0x80 && t->byte_live[b];
    }
    return c;
}

enum kvb_status tok_encode_with(const struct tok *t, const char *text, size_t len, unsigned flags,
                                const struct tok_limits *lim, int32_t **out_ids, size_t *out_n, struct kvb_err *err)
{
    *out_ids = NULL;
    *out_n = 0;
    static const struct tok_limits k_none = {0};
    if (!lim) lim = &k_none;
    if (!text && len > 0) return kvb_errf(err, KVB_ERR_INVALID_ARG, "tok_encode: NULL text");
    if (len > (size_t)INT32_MAX / 4)
        return kvb_errf(err, KVB_ERR_RANGE, "tok_encode: text of %zu bytes is too long", len);
    /* Refused before any work when its bytes alone need more ids than the
     * limit allows. */
    if (lim->max_ids && t->max_cover) {
        const size_t bos = (flags & TOK_ADD_BOS) && t->bos >= 0;
        if (tok_check_room(t, lim, bos, live_at_least(t, text, len)) != KVB_OK)
            return kvb_errf(err, KVB_ERR_RANGE,
                            "the text has more than %zu tokens (%zu bytes, and no token stands "
                            "for more than %u)",
                            lim->max_ids, len, t->max_cover);
    }
    struct frags a = {0}, b = {0};
    struct tok_ids ids = {0};
    enum kvb_status st = encode(t, text, len, flags, lim, &a, &b, &ids);
    kvb_free(a.v);
    kvb_free(b.v);
    if (st == KVB_OK && !ids.v) { /* keep *out_ids non-NULL even when empty */
        ids.v = kvb_malloc(sizeof *ids.v);
        if (!ids.v) st = KVB_ERR_NOMEM;
    }
    if (st != KVB_OK) {
        kvb_free(ids.v);
        if (st == KVB_ERR_RANGE) return kvb_errf(err, st, "the text has more than %zu tokens", lim->max_ids);
        if (st == KVB_ERR_CANCELLED) return kvb_errf(err, st, "tokenizing was interrupted");
        return kvb_errf(err, st, "tok_encode: out of memory for %zu bytes of text", len);
    }
    *out_ids = ids.v;
    *out_n = ids.n;
    return KVB_OK;
}

enum kvb_status tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags, int32_t **out_ids,
                           size_t *out_n, struct kvb_err *err)
{
    return tok_encode_with(t, text, len, flags, NULL, out_ids, out_n, err);
}
