/* tok_pre.c — the pre-tokenizer splits (see tok_pre.h), hand-written
 * equivalents of the reference's regex lists:
 *
 *   GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama 3 (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+
 *           |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2   as Llama 3 with \p{N} instead of \p{N}{1,3}
 *
 * plus the simple class passes some splits run first (\p{N} one by one,
 * runs of punctuation, runs of numbers, ASCII digit triples). Alternatives are
 * tried in the regex's order at each position, leftmost-first, like a
 * backtracking engine would; `\s` is the White_Space property. Each pass
 * works inside one chunk at a time and treats its end as the end of text. */
#include "text/tok_pre.h"

#include "base/alloc.h"
#include "base/unicode.h"

/* Class bits of one code point. F_IN is set for every code point so that
 * "flags of a position outside the chunk" (0) differs from every real one. */
enum {
    F_NUM = 1u << 0,   /* \p{N} */
    F_LET = 1u << 1,   /* \p{L} */
    F_WS = 1u << 2,    /* \s */
    F_PUNCT = 1u << 3, /* [\p{P}\$\+<=>\^~\|] (the default split's first pass) */
    F_IN = 1u << 4
};

static uint8_t class_bits(uint32_t c)
{
    uint8_t f = F_IN;
    enum unicode_cat cat = unicode_category(c);
    if (cat == UNICODE_CAT_NUMBER) f |= F_NUM;
    if (cat == UNICODE_CAT_LETTER) f |= F_LET;
    bool ws = unicode_is_whitespace(c);
    if (ws) f |= F_WS;
    if ((cat == UNICODE_CAT_PUNCT && !ws) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
        c == '~' || c == '|')
        f |= F_PUNCT;
    return f;
}

static enum kvb_status grow(uint32_t **v, size_t *cap, size_t need)
{
    if (need <= *cap) return KVB_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    uint32_t *nv = kvb_realloc(*v, nc * sizeof **v);
    if (!nv) return KVB_ERR_NOMEM;
    *v = nv;
    *cap = nc;
    return KVB_OK;
}

/* One chunk [ini, end) being split; boundaries go to out. */
struct chunk {
    const uint32_t *c;
    const uint8_t *f;
    size_t ini, end;
    size_t prev; /* end of the last word emitted */
    uint32_t **out;
    size_t *out_n, *out_cap;
    enum kvb_status st;
};

static unsigned fl(const struct chunk *k, size_t pos) { return pos < k->end ? k->f[pos] : 0u; }
static uint32_t cp(const struct chunk *k, size_t pos) { return pos < k->end ? k->c[pos] : 0xFFFFFFFFu; }

/* Ends the current word at `end` (a no-op when it would be empty). */
static void emit(struct chunk *k, size_t end)
{
    if (end <= k->prev || k->st != KVB_OK) return;
    k->st = grow(k->out, k->out_cap, *k->out_n + 1);
    if (k->st != KVB_OK) return;
    (*k->out)[(*k->out_n)++] = (uint32_t)end;
    k->prev = end;
}

static bool is_contraction1(uint32_t c) { return c == 's' || c == 't' || c == 'm' || c == 'd'; }
static bool is_contraction2(uint32_t a, uint32_t b)
{
    return (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l');
}
/* Llama 3's contractions are case-insensitive. ASCII folding is enough: no
 * other code point lowercases to one of s t m d r e v l. */
static uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

static void split_gpt2(struct chunk *k)
{
    size_t pos = k->ini;
    while (pos < k->end && k->st == KVB_OK) {
        const uint32_t c = k->c[pos];
        const unsigned f = k->f[pos];
        if (c == '\'' && pos + 1 < k->end) { /* 's|'t|'re|'ve|'m|'ll|'d */
            uint32_t n1 = k->c[pos + 1];
            if (is_contraction1(n1)) {
                emit(k, pos += 2);
                continue;
            }
            if (pos + 2 < k->end && is_contraction2(n1, k->c[pos + 2])) {
                emit(k, pos += 3);
                continue;
            }
        }
        const unsigned f2 = c == ' ' ? fl(k, pos + 1) : f;
        if (f2 & F_LET) { /* ' ?\p{L}+' */
            pos += c == ' ';
            while (fl(k, pos) & F_LET) pos++;
            emit(k, pos);
            continue;
        }
        if (f2 & F_NUM) { /* ' ?\p{N}+' */
            pos += c == ' ';
            while (fl(k, pos) & F_NUM) pos++;
            emit(k, pos);
            continue;
        }
        if (f2 && !(f2 & (F_WS | F_LET | F_NUM))) { /* ' ?[^\s\p{L}\p{N}]+' */
            pos += c == ' ';
            while (fl(k, pos) && !(fl(k, pos) & (F_WS | F_LET | F_NUM))) pos++;
            emit(k, pos);
            continue;
        }
        size_t nws = 0;
        while (fl(k, pos + nws) & F_WS) nws++;
        if (nws > 1 && pos + nws < k->end) { /* '\s+(?!\S)': leave the last one to the next word */
            emit(k, pos += nws - 1);
            continue;
        }
        if (nws > 0) { /* '\s+' */
            emit(k, pos += nws);
            continue;
        }
        emit(k, ++pos); /* nothing matched: a word of one code point */
    }
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1). */
static void split_llama3(struct chunk *k, size_t max_digits)
{
    size_t pos = k->ini;
    while (pos < k->end && k->st == KVB_OK) {
        const uint32_t c = k->c[pos];
        const unsigned f = k->f[pos];
        if (c == '\'' && pos + 1 < k->end) {
            uint32_t n1 = ascii_lower(k->c[pos + 1]);
            if (is_contraction1(n1)) {
                emit(k, pos += 2);
                continue;
            }
            if (pos + 2 < k->end && is_contraction2(n1, ascii_lower(k->c[pos + 2]))) {
                emit(k, pos += 3);
                continue;
            }
        }
        /* '[^\r\n\p{L}\p{N}]?\p{L}+' */
        if (!(c == '\r' || c == '\n' || (f & F_NUM)) && ((f & F_LET) || (fl(k, pos + 1) & F_LET))) {
            pos++;
            while (fl(k, pos) & F_LET) pos++;
            emit(k, pos);
            continue;
        }
        if (f & F_NUM) { /* '\p{N}{1,max}' */
            size_t ini = pos;
            while (fl(k, pos) & F_NUM) {
                if (++pos - ini >= max_digits) {
                    emit(k, pos);
                    ini = pos;
                }
            }
            emit(k, pos);
            continue;
        }
        /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' (a lone trailing space also lands here, as one word) */
        const unsigned f2 = c == ' ' ? fl(k, pos + 1) : f;
        if (!(f2 & (F_WS | F_LET | F_NUM))) {
            pos += c == ' ';
            while (fl(k, pos) && !(fl(k, pos) & (F_WS | F_LET | F_NUM))) pos++;
            while (cp(k, pos) == '\r' || cp(k, pos) == '\n') pos++;
            emit(k, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (fl(k, pos + nws) & F_WS) {
            uint32_t w = k->c[pos + nws];
            if (w == '\r' || w == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { /* '\s*[\r\n]+' */
            emit(k, pos = last_rn);
            continue;
        }
        if (nws > 1 && pos + nws < k->end) { /* '\s+(?!\S)' */
            emit(k, pos += nws - 1);
            continue;
        }
        if (nws > 0) { /* '\s+' */
            emit(k, pos += nws);
            continue;
        }
        emit(k, ++pos);
    }
}

/* Runs of code points with class bit `bit` become words (one code point per
 * word when `single`); the text between them is a word too. */
static void split_class(struct chunk *k, unsigned bit, bool single)
{
    size_t pos = k->ini;
    while (pos < k->end && k->st == KVB_OK) {
        if (!(k->f[pos] & bit)) {
            pos++;
            continue;
        }
        emit(k, pos);
        pos++;
        if (!single)
            while (pos < k->end && (k->f[pos] & bit)) pos++;
        emit(k, pos);
    }
    emit(k, k->end);
}

/* '[0-9][0-9][0-9]', searched left to right. */
static void split_digit3(struct chunk *k)
{
    size_t pos = k->ini;
    while (pos + 3 <= k->end && k->st == KVB_OK) {
        const uint32_t *c = k->c + pos;
        if (c[0] >= '0' && c[0] <= '9' && c[1] >= '0' && c[1] <= '9' && c[2] >= '0' && c[2] <= '9') {
            emit(k, pos);
            emit(k, pos += 3);
        } else {
            pos++;
        }
    }
    emit(k, k->end);
}

enum pass { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_NUM_SINGLE, PASS_NUM_RUNS, PASS_PUNCT_RUNS, PASS_DIGIT3 };

/* Applies one pass to every chunk of w->ends, leaving the result in w->ends. */
static enum kvb_status run_pass(struct tok_pre_words *w, const uint32_t *cpts, enum pass p)
{
    w->tmp_n = 0;
    struct chunk k = {
        .c = cpts, .f = w->flags, .out = &w->tmp, .out_n = &w->tmp_n, .out_cap = &w->tmp_cap, .st = KVB_OK};
    size_t start = 0;
    for (size_t i = 0; i < w->n && k.st == KVB_OK; i++) {
        k.ini = k.prev = start;
        k.end = w->ends[i];
        switch (p) {
        case PASS_GPT2: split_gpt2(&k); break;
        case PASS_LLAMA3: split_llama3(&k, 3); break;
        case PASS_QWEN2: split_llama3(&k, 1); break;
        case PASS_NUM_SINGLE: split_class(&k, F_NUM, true); break;
        case PASS_NUM_RUNS: split_class(&k, F_NUM, false); break;
        case PASS_PUNCT_RUNS: split_class(&k, F_PUNCT, false); break;
        case PASS_DIGIT3: split_digit3(&k); break;
        }
        start = k.end;
    }
    if (k.st != KVB_OK) return k.st;
    /* swap: the new boundaries become the current ones */
    uint32_t *v = w->ends;
    size_t cap = w->cap;
    w->ends = w->tmp;
    w->cap = w->tmp_cap;
    w->n = w->tmp_n;
    w->tmp = v;
    w->tmp_cap = cap;
    w->tmp_n = 0;
    return KVB_OK;
}

enum kvb_status tok_pre_split(enum tok_split split, const uint32_t *cpts, size_t n, struct tok_pre_words *w)
{
    w->n = 0;
    if (n == 0) return KVB_OK;
    if (n > UINT32_MAX) return KVB_ERR_RANGE;
    if (n > w->flags_cap) {
        uint8_t *nf = kvb_realloc(w->flags, n);
        if (!nf) return KVB_ERR_NOMEM;
        w->flags = nf;
        w->flags_cap = n;
    }
    for (size_t i = 0; i < n; i++) w->flags[i] = class_bits(cpts[i]);
    KVB_FORWARD_IF_ERROR(grow(&w->ends, &w->cap, 1));
    w->ends[0] = (uint32_t)n;
    w->n = 1;

    static const enum pass k_default[] = {PASS_PUNCT_RUNS, PASS_GPT2, PASS_NUM_RUNS, PASS_DIGIT3};
    static const enum pass k_gpt2[] = {PASS_GPT2};
    static const enum pass k_digits[] = {PASS_NUM_SINGLE, PASS_GPT2};
    static const enum pass k_llama3[] = {PASS_LLAMA3};
    static const enum pass k_qwen2[] = {PASS_QWEN2};
    const enum pass *passes = k_gpt2;
    size_t n_passes = 1;
    switch (split) {
    case TOK_SPLIT_DEFAULT:
        passes = k_default;
        n_passes = 4;
        break;
    case TOK_SPLIT_GPT2:
        passes = k_gpt2;
        n_passes = 1;
        break;
    case TOK_SPLIT_DIGITS:
        passes = k_digits;
        n_passes = 2;
        break;
    case TOK_SPLIT_LLAMA3:
        passes = k_llama3;
        n_passes = 1;
        break;
    case TOK_SPLIT_QWEN2:
        passes = k_qwen2;
        n_passes = 1;
        break;
    }
    for (size_t i = 0; i < n_passes; i++) KVB_FORWARD_IF_ERROR(run_pass(w, cpts, passes[i]));
    return KVB_OK;
}

void tok_pre_words_trim(struct tok_pre_words *w)
{
    kvb_free(w->tmp);
    kvb_free(w->flags);
    w->tmp = NULL;
    w->flags = NULL;
    w->tmp_n = w->tmp_cap = w->flags_cap = 0;
}

void tok_pre_words_free(struct tok_pre_words *w)
{
    if (!w) return;
    kvb_free(w->ends);
    kvb_free(w->tmp);
    kvb_free(w->flags);
    *w = (struct tok_pre_words){0};
}
