/* grammar_mask.c — the token side of a grammar: every token's bytes in a
 * trie, the per-state token mask and the calls the sampler makes.
 *
 * The trie is stored in preorder (the tokens sorted by their bytes), each
 * node with its byte, its depth and the index past its subtree, so a mask
 * is one forward pass: a node whose byte the state refuses skips its whole
 * subtree. The states along the path come from gm_step, memoised, so a
 * state that recurs inside its own tokens (inside a string: most of the
 * vocabulary leads back to the same state) costs a row lookup a node. A
 * mask, once computed, is kept with its state (a bit per token).
 *
 * Not here: the recogniser (grammar_match.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "engine/grammar_internal.h"

struct grammar_vocab {
    int32_t n;
    uint32_t *off; /* [n + 1]: token i's bytes are bytes[off[i] .. off[i + 1]) */
    char *bytes;
    bool *eog;
    int32_t first_eog;
    /* The trie, preorder: */
    uint32_t n_nodes;
    uint8_t *t_byte;        /* [n_nodes] */
    uint16_t *t_depth;      /* [n_nodes] 1 for a first byte */
    uint32_t *t_end;        /* [n_nodes] first node past the subtree */
    uint32_t *t_tok;        /* [n_nodes + 1] tokens ending here: tok_ids[t_tok[i] .. t_tok[i + 1]) */
    int32_t *tok_ids;       /* tokens with bytes, in trie order */
    uint32_t max_depth;     /* the longest token */
    uint32_t lanes[256][8]; /* lanes[b][j]: all ones when bit j of mask byte b is clear (token refused) */
};

#define NEG_INF_BITS 0xff800000u /* -INFINITY as an IEEE-754 single */

struct tkey { /* a token while the trie is built */
    const char *b;
    uint32_t len;
    int32_t id;
};

static int cmp_tok(const void *x, const void *y)
{
    const struct tkey *a = x, *b = y;
    int c = memcmp(a->b, b->b, a->len < b->len ? a->len : b->len);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static enum kvb_status vocab_bytes(const struct tok *t, struct grammar_vocab *v)
{
    const int32_t n = v->n;
    char piece[256];
    size_t total = 0;
    v->first_eog = -1;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = (uint32_t)total;
        v->eog[i] = tok_is_eog(t, i);
        if (v->eog[i] && v->first_eog < 0) v->first_eog = i;
        if (!v->eog[i]) total += tok_piece(t, i, false, piece, sizeof piece);
    }
    v->off[n] = (uint32_t)total;
    v->bytes = kvb_malloc(total ? total : 1);
    if (!v->bytes) return KVB_ERR_NOMEM;
    for (int32_t i = 0; i < n; i++) {
        const size_t len = v->off[i + 1] - v->off[i];
        if (len == 0) continue;
        char *dst = v->bytes + v->off[i];
        if (len <= sizeof piece) {
            tok_piece(t, i, false, piece, sizeof piece);
            memcpy(dst, piece, len);
        } else {
            tok_piece(t, i, false, dst, len); /* a token longer than the scratch */
        }
    }
    return KVB_OK;
}

/* The trie from the tokens sorted by bytes: a token adds the nodes past its
 * common prefix with the one before. */
static enum kvb_status vocab_trie(struct grammar_vocab *v)
{
    int32_t nt = 0;
    for (int32_t i = 0; i < v->n; i++) nt += v->off[i + 1] > v->off[i];
    v->tok_ids = kvb_malloc(sizeof *v->tok_ids * (size_t)(nt ? nt : 1));
    if (!v->tok_ids) return KVB_ERR_NOMEM;
    struct tkey *keys = kvb_malloc(sizeof *keys * (size_t)(nt ? nt : 1));
    if (!keys) return KVB_ERR_NOMEM;
    nt = 0;
    for (int32_t i = 0; i < v->n; i++)
        if (v->off[i + 1] > v->off[i]) keys[nt++] = (struct tkey){v->bytes + v->off[i], v->off[i + 1] - v->off[i], i};
    qsort(keys, (size_t)nt, sizeof *keys, cmp_tok);
    for (int32_t k = 0; k < nt; k++) v->tok_ids[k] = keys[k].id;
    kvb_free(keys);
    const size_t cap = v->off[v->n] + 1; /* never more nodes than bytes */
    v->t_byte = kvb_malloc(cap);
    v->t_depth = kvb_malloc(sizeof *v->t_depth * cap);
    v->t_end = kvb_malloc(sizeof *v->t_end * cap);
    v->t_tok = kvb_calloc(cap + 1, sizeof *v->t_tok);
    uint32_t *path = kvb_malloc(sizeof *path * cap); /* node index at each depth of the previous token */
    if (!v->t_byte || !v->t_depth || !v->t_end || !v->t_tok || !path) return kvb_free(path), KVB_ERR_NOMEM;
    uint32_t nn = 0, prev_len = 0;
    const char *prev = NULL;
    for (int32_t k = 0; k < nt; k++) {
        const int32_t id = v->tok_ids[k];
        const char *b = v->bytes + v->off[id];
        const uint32_t len = v->off[id + 1] - v->off[id];
        uint32_t lcp = 0;
        while (prev && lcp < len && lcp < prev_len && prev[lcp] == b[lcp]) lcp++;
        for (uint32_t d = lcp; d < len; d++) {
            v->t_byte[nn] = (uint8_t)b[d];
            v->t_depth[nn] = (uint16_t)(d + 1 < 65535 ? d + 1 : 65535);
            path[d] = nn++;
        }
        v->t_tok[path[len - 1] + 1]++; /* counts, prefix-summed below */
        if (len > v->max_depth) v->max_depth = len;
        prev = b;
        prev_len = len;
    }
    kvb_free(path);
    v->n_nodes = nn;
    for (uint32_t i = 0; i < nn; i++) v->t_tok[i + 1] += v->t_tok[i];
    /* t_end: the next node at a depth no deeper, found with a stack. */
    uint32_t *stack = kvb_malloc(sizeof *stack * (v->max_depth + 1));
    if (!stack) return KVB_ERR_NOMEM;
    uint32_t sp = 0;
    for (uint32_t i = 0; i < nn; i++) {
        while (sp && v->t_depth[stack[sp - 1]] >= v->t_depth[i]) v->t_end[stack[--sp]] = i;
        stack[sp++] = i;
    }
    while (sp) v->t_end[stack[--sp]] = nn;
    kvb_free(stack);
    return KVB_OK;
}

enum kvb_status grammar_vocab_create(const struct tok *t, struct grammar_vocab **out, struct kvb_err *err)
{
    *out = NULL;
    struct grammar_vocab *v = kvb_calloc(1, sizeof *v);
    const int32_t n = tok_n_vocab(t);
    if (v) {
        v->n = n;
        v->off = kvb_malloc(sizeof *v->off * ((size_t)n + 1));
        v->eog = kvb_calloc((size_t)n ? (size_t)n : 1, 1);
    }
    enum kvb_status st = v && v->off && v->eog ? vocab_bytes(t, v) : KVB_ERR_NOMEM;
    if (v)
        for (int b = 0; b < 256; b++)
            for (int j = 0; j < 8; j++) v->lanes[b][j] = (b >> j & 1) ? 0 : ~0u;
    if (st == KVB_OK) st = vocab_trie(v);
    if (st != KVB_OK) {
        grammar_vocab_free(v);
        return kvb_errf(err, st, "out of memory for the grammar's vocabulary");
    }
    if (v->first_eog < 0) {
        grammar_vocab_free(v);
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "the vocabulary has no end-of-generation token");
    }
    *out = v;
    return KVB_OK;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v) return;
    kvb_free(v->off);
    kvb_free(v->bytes);
    kvb_free(v->eog);
    kvb_free(v->t_byte);
    kvb_free(v->t_depth);
    kvb_free(v->t_end);
    kvb_free(v->t_tok);
    kvb_free(v->tok_ids);
    kvb_free(v);
}

int32_t grammar_vocab_size(const struct grammar_vocab *v) { return v->n; }
int32_t grammar_vocab_eog(const struct grammar_vocab *v) { return v->first_eog; }

static inline uint32_t step(struct grammar_matcher *m, uint32_t s, uint8_t b)
{
    const uint32_t *row = m->states[s].next;
    if (row && row[b] != GM_UNKNOWN) return row[b];
    return gm_step(m, s, b);
}

/* The mask of the current state, computed on first ask; NULL when out of memory. */
static const uint8_t *state_mask(struct grammar_matcher *m)
{
    const struct grammar_vocab *v = m->v;
    const uint32_t s0 = m->cur;
    if (m->states[s0].mask) {
        m->st.mask_hits++;
        return m->states[s0].mask;
    }
    const size_t nbytes = ((size_t)v->n + 63) / 64 * 8; /* whole 64-bit words: grammar_mask reads them so */
    uint8_t *bits = kvb_calloc(nbytes, 1);
    if (!bits) return NULL;
    if (m->cap_walk < v->max_depth + 1) {
        uint32_t *w = kvb_realloc(m->walk, sizeof *w * (v->max_depth + 1));
        if (!w) return kvb_free(bits), NULL;
        m->bytes += sizeof *w * (v->max_depth + 1 - m->cap_walk);
        m->walk = w;
        m->cap_walk = v->max_depth + 1;
    }
    uint32_t *walk = m->walk;
    walk[0] = s0;
    int32_t count = 0;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const uint32_t d = v->t_depth[i];
        const uint32_t s = step(m, walk[d - 1], v->t_byte[i]);
        if (s == GM_DEAD) {
            i = v->t_end[i];
            continue;
        }
        walk[d] = s;
        for (uint32_t k = v->t_tok[i]; k < v->t_tok[i + 1]; k++) {
            const int32_t id = v->tok_ids[k];
            bits[id >> 3] |= (uint8_t)(1u << (id & 7));
            count++;
        }
        i++;
    }
    if (m->states[s0].accept)
        for (int32_t i = 0; i < v->n; i++)
            if (v->eog[i]) bits[i >> 3] |= (uint8_t)(1u << (i & 7)), count++;
    m->states[s0].mask = bits;
    m->states[s0].n_allowed = count;
    m->bytes += nbytes;
    return bits;
}

bool grammar_allows(struct grammar_matcher *m, int32_t token)
{
    const struct grammar_vocab *v = m->v;
    m->st.allows++;
    if (token < 0 || token >= v->n) return false;
    if (v->eog[token]) return m->dead || m->states[m->cur].accept;
    if (m->dead) return false;
    const uint8_t *bits = m->states[m->cur].mask;
    if (bits) return bits[token >> 3] >> (token & 7) & 1;
    const uint32_t a = v->off[token], b = v->off[token + 1];
    if (a == b) return false; /* a control token: it would let the output stall */
    uint32_t s = m->cur;
    for (uint32_t i = a; i < b; i++)
        if ((s = step(m, s, (uint8_t)v->bytes[i])) == GM_DEAD) return false;
    return true;
}

int32_t grammar_mask(struct grammar_matcher *m, float *logits)
{
    const struct grammar_vocab *v = m->v;
    const double t0 = kvb_clock_s();
    m->st.masks++;
    gm_maybe_flush(m);
    int32_t count = 0;
    const uint8_t *bits = m->dead ? NULL : state_mask(m);
    if (bits) {
        /* Eight tokens a byte through a table of lane masks, so the loop
         * has no branch per token and compiles to vector blends; bytes with
         * every token allowed (inside a string: most) are skipped. */
        const int32_t whole = v->n / 8;
        for (int32_t k = 0; k < whole; k++) {
            const uint8_t byte = bits[k];
            if (byte == 0xff) continue;
            const uint32_t *lane = v->lanes[byte];
            uint32_t u[8];
            memcpy(u, logits + 8 * (size_t)k, sizeof u);
            for (int j = 0; j < 8; j++) u[j] = (u[j] & ~lane[j]) | (NEG_INF_BITS & lane[j]);
            memcpy(logits + 8 * (size_t)k, u, sizeof u);
        }
        for (int32_t i = whole * 8; i < v->n; i++)
            if (!(bits[i >> 3] >> (i & 7) & 1)) logits[i] = -INFINITY;
        count = m->states[m->cur].n_allowed;
    } else { /* dead (or no memory for the mask): only the end of generation */
        for (int32_t i = 0; i < v->n; i++)
            if (!v->eog[i]) logits[i] = -INFINITY;
            else count++;
    }
    m->st.mask_ns += (uint64_t)((kvb_clock_s() - t0) * 1e9);
    return count;
}

void grammar_accept(struct grammar_matcher *m, int32_t token)
{
    const struct grammar_vocab *v = m->v;
    if (m->dead) return;
    gm_maybe_flush(m);
    if (m->dead) return;
    if (token < 0 || token >= v->n || v->eog[token]) {
        if (token < 0 || token >= v->n || !m->states[m->cur].accept) m->dead = true;
        return;
    }
    const uint32_t a = v->off[token], b = v->off[token + 1];
    uint32_t s = m->cur;
    for (uint32_t i = a; i < b && s != GM_DEAD; i++) s = step(m, s, (uint8_t)v->bytes[i]);
    if (s == GM_DEAD || a == b) {
        m->dead = true;
        return;
    }
    m->cur = s;
}
