/* tok_load.c — builds a struct tok from GGUF metadata (tok_load / tok_free).
 *
 * Reads `tokenizer.ggml.*`: model and pre-tokenizer names, tokens, scores,
 * token types, merges, special-token ids and flags, and applies the same
 * defaults and fix-ups as the reference loader (llama.cpp's llama_vocab),
 * because token ids and stop conditions must come out identical:
 * - end-of-generation tokens are recognised by text as well as by id, and
 *   such tokens are treated as control tokens whatever their stored type;
 * - Phi-3 vocabularies strip white space after their special tokens;
 * - ids out of range are ignored in favour of the model type's default.
 * Everything is copied: the gguf file may be closed afterwards. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/unicode.h"
#include "text/tok_internal.h"

struct pre_entry {
    const char *name;
    enum tok_split split;
    bool llama3; /* ignore_merges and add_bos by default, as for Llama 3 */
};

/* tokenizer.ggml.pre values kvbatch implements, grouped by the regex list
 * the reference uses for them. Anything else is refused rather than guessed:
 * a wrong split silently changes every token id. */
static const struct pre_entry k_pre[] = {
    {"default", TOK_SPLIT_DEFAULT, false},   {"gpt-2", TOK_SPLIT_GPT2, false},
    {"phi-2", TOK_SPLIT_GPT2, false},        {"mpt", TOK_SPLIT_GPT2, false},
    {"olmo", TOK_SPLIT_GPT2, false},         {"exaone4", TOK_SPLIT_GPT2, false},
    {"starcoder", TOK_SPLIT_DIGITS, false},  {"refact", TOK_SPLIT_DIGITS, false},
    {"smollm", TOK_SPLIT_DIGITS, false},     {"codeshell", TOK_SPLIT_DIGITS, false},
    {"command-r", TOK_SPLIT_DIGITS, false},  {"exaone", TOK_SPLIT_DIGITS, false},
    {"minerva-7b", TOK_SPLIT_DIGITS, false}, {"llama3", TOK_SPLIT_LLAMA3, true},
    {"llama-v3", TOK_SPLIT_LLAMA3, true},    {"llama-bpe", TOK_SPLIT_LLAMA3, true},
    {"falcon3", TOK_SPLIT_LLAMA3, true},     {"pixtral", TOK_SPLIT_LLAMA3, true},
    {"dbrx", TOK_SPLIT_LLAMA3, false},       {"smaug-bpe", TOK_SPLIT_LLAMA3, false},
    {"qwen2", TOK_SPLIT_QWEN2, false},       {"deepseek-r1-qwen", TOK_SPLIT_QWEN2, false},
    {"megrez", TOK_SPLIT_QWEN2, false},      {"stablelm2", TOK_SPLIT_QWEN2, false},
};

/* Texts that end generation (the reference's list, less the entries that
 * only make sense with its per-model workarounds). */
static const char *const k_eog_text[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>", /* DeepSeek <｜end▁of▁sentence｜> (octal: \x would eat the "e") */
};
/* Fill-in-the-middle tokens the reference also stops on (pad, repo, file separator). */
static const char *const k_fim_pad_text[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
static const char *const k_fim_rep_text[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
static const char *const k_fim_sep_text[] = {"<|file_sep|>"};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

void tok_free(struct tok *t)
{
    if (!t) return;
    kvb_free(t->tokens);
    kvb_free(t->text);
    kvb_free(t->merge_text);
    tok_map_free(&t->vocab);
    tok_map_free(&t->ranks);
    kvb_free(t->special);
    kvb_free(t->eog);
    kvb_free(t);
}

static bool str_is(struct gguf_str s, const char *z) { return gguf_str_eq(s, z); }

static int32_t find_text(const struct tok *t, const char *z) { return tok_map_get(&t->vocab, z, strlen(z)); }

/* An optional special-token id: the key's value when present and in range,
 * else `def` (itself dropped when out of range). Malformed values are
 * ignored like out-of-range ones, as the reference does. */
static int32_t special_id(const struct gguf_file *f, const char *key, int32_t def, int32_t n_vocab)
{
    if (def >= n_vocab) def = -1;
    uint32_t v;
    if (gguf_get_u32(f, key, &v, NULL) == KVB_OK && v < (uint32_t)n_vocab) return (int32_t)v;
    return def;
}

static bool opt_bool(const struct gguf_file *f, const char *key, bool def)
{
    bool v;
    return gguf_get_bool(f, key, &v, NULL) == KVB_OK ? v : def;
}

static enum kvb_status load_tokens(struct tok *t, const struct gguf_file *f, struct kvb_err *err)
{
    const struct gguf_value *toks;
    enum kvb_status st = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VTYPE_STRING, &toks, err);
    if (st != KVB_OK) return kvb_err_wrap(err, st, "tokenizer");
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > (uint64_t)INT32_MAX / 2)
        return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                        (unsigned long long)n);
    t->n_vocab = (int32_t)n;

    const struct gguf_value *scores = gguf_find(f, "tokenizer.ggml.scores");
    if (scores) {
        if (scores->type != GGUF_VTYPE_ARRAY ||
            (scores->v.arr.elem_type != GGUF_VTYPE_FLOAT32 && scores->v.arr.elem_type != GGUF_VTYPE_INT32))
            return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores is not an array of FLOAT32");
        if (scores->v.arr.n < n)
            return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: %llu scores for %llu tokens",
                            (unsigned long long)scores->v.arr.n, (unsigned long long)n);
    }
    const struct gguf_value *types = gguf_find(f, "tokenizer.ggml.token_type");
    if (types) {
        if (types->type != GGUF_VTYPE_ARRAY || types->v.arr.elem_type != GGUF_VTYPE_INT32)
            return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type is not an array of INT32");
        if (types->v.arr.n < n)
            return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: %llu token types for %llu tokens",
                            (unsigned long long)types->v.arr.n, (unsigned long long)n);
    }

    /* All texts in one arena, NUL-terminated; an empty token gets the
     * reference's placeholder "[EMPTY_<id>]" so that no key is empty. */
    size_t bytes = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = toks->v.arr.items[i].v.str.len;
        bytes += (l ? l : 24) + 1;
    }
    t->tokens = kvb_calloc((size_t)n, sizeof *t->tokens);
    t->text = kvb_malloc(bytes);
    if (!t->tokens || !t->text)
        return kvb_errf(err, KVB_ERR_NOMEM, "tokenizer: out of memory for %llu tokens", (unsigned long long)n);
    if (tok_map_init(&t->vocab, (size_t)n) != KVB_OK) return kvb_errf(err, KVB_ERR_NOMEM, "tokenizer: out of memory");
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s = toks->v.arr.items[i].v.str;
        char *dst = t->text + off;
        size_t l = (size_t)s.len;
        if (l) memcpy(dst, s.ptr, l);
        else l = (size_t)snprintf(dst, 25, "[EMPTY_%llu]", (unsigned long long)i);
        dst[l] = '\0';
        struct tok_entry *e = &t->tokens[i];
        e->off = (uint32_t)off;
        e->len = (uint32_t)l;
        e->score = scores ? (scores->v.arr.elem_type == GGUF_VTYPE_FLOAT32 ? (float)gguf_arr_f64(scores, i)
                                                                           : (float)gguf_arr_i64(scores, i))
                          : 0.0f;
        e->attr = TOK_ATTR_NORMAL;
        if (types) {
            switch (gguf_arr_i64(types, i)) {
            case 1: e->attr = TOK_ATTR_NORMAL; break;
            case 2: e->attr = TOK_ATTR_UNKNOWN; break;
            case 3: e->attr = TOK_ATTR_CONTROL; break;
            case 4: e->attr = TOK_ATTR_USER_DEFINED; break;
            case 5: e->attr = TOK_ATTR_UNUSED; break;
            case 6: e->attr = TOK_ATTR_BYTE; break;
            default: e->attr = TOK_ATTR_UNDEFINED; break;
            }
        }
        if (!tok_map_put(&t->vocab, dst, l, (int32_t)i))
            return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: duplicate token '%.64s' (ids %d and %llu)", dst,
                            tok_map_get(&t->vocab, dst, l), (unsigned long long)i);
        off += l + 1;
    }
    return KVB_OK;
}

static enum kvb_status load_merges(struct tok *t, const struct gguf_file *f, struct kvb_err *err)
{
    const struct gguf_value *m;
    enum kvb_status st = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VTYPE_STRING, &m, err);
    if (st != KVB_OK) return kvb_err_wrap(err, st, "tokenizer (gpt2 needs merges)");
    uint64_t n = m->v.arr.n;
    if (n > (uint64_t)INT32_MAX / 2)
        return kvb_errf(err, KVB_ERR_FORMAT, "tokenizer: %llu merges", (unsigned long long)n);
    size_t bytes = 1;
    for (uint64_t i = 0; i < n; i++) bytes += (size_t)m->v.arr.items[i].v.str.len + 1;
    t->merge_text = kvb_malloc(bytes);
    if (!t->merge_text || tok_map_init(&t->ranks, (size_t)n) != KVB_OK)
        return kvb_errf(err, KVB_ERR_NOMEM, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s = m->v.arr.items[i].v.str;
        /* "left right", split at the first space after the first byte. The
         * whole string is the key: lookups build "left right" from symbols,
         * which never contain a raw space in byte-level BPE. A merge with no
         * such space can never apply. Duplicates: the first rank wins. */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
        if (!sp) continue;
        char *dst = t->merge_text + off;
        memcpy(dst, s.ptr, (size_t)s.len);
        dst[s.len] = '\0';
        tok_map_put(&t->ranks, dst, (size_t)s.len, (int32_t)i);
        if (s.len > t->max_merge_len) t->max_merge_len = (uint32_t)s.len;
        off += (size_t)s.len + 1;
    }
    return KVB_OK;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Special tokens sort longest text first, then by id (the reference's sort
 * is not stable; ties only matter for equal-length texts that overlap in the
 * input). The length travels with the id so qsort needs no context. */
struct special_key {
    uint32_t len;
    int32_t id;
};

static int cmp_special(const void *a, const void *b)
{
    const struct special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t first_of(const struct tok *t, const char *const *texts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = find_text(t, texts[i]);
        if (id >= 0) return id;
    }
    return -1;
}

static enum kvb_status add_eog(struct tok *t, int32_t id)
{
    if (id < 0) return KVB_OK;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return KVB_OK;
    int32_t *nv = kvb_realloc(t->eog, (t->n_eog + 1) * sizeof *nv);
    if (!nv) return KVB_ERR_NOMEM;
    t->eog = nv;
    t->eog[t->n_eog++] = id;
    return KVB_OK;
}

static enum kvb_status load_specials(struct tok *t, const struct gguf_file *f, struct kvb_err *err)
{
    const int32_t nv = t->n_vocab;
    const bool spm = t->kind == TOK_KIND_SPM;
    /* defaults: SentencePiece <unk>=0 <s>=1 </s>=2; the reference's BPE default is 11 */
    t->bos = special_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : 11, nv);
    t->eos = special_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : 11, nv);
    t->unk = special_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, nv);
    if (t->kind == TOK_KIND_WPM) { /* BOS/EOS are BERT's [CLS] and [SEP] (llama.cpp's defaults 101, 102, 100) */
        t->bos =
            special_id(f, "tokenizer.ggml.bos_token_id", special_id(f, "tokenizer.ggml.cls_token_id", 101, nv), nv);
        t->eos = special_id(f, "tokenizer.ggml.eos_token_id",
                            special_id(f, "tokenizer.ggml.seperator_token_id", 102, nv), nv);
        t->unk = special_id(f, "tokenizer.ggml.unknown_token_id", 100, nv);
    }
    int32_t eot = special_id(f, "tokenizer.ggml.eot_token_id", -1, nv);
    int32_t eom = special_id(f, "tokenizer.ggml.eom_token_id", -1, nv);
    int32_t fim_pad = special_id(f, "tokenizer.ggml.fim_pad_token_id", -1, nv);
    int32_t fim_rep = special_id(f, "tokenizer.ggml.fim_rep_token_id", -1, nv);
    int32_t fim_sep = special_id(f, "tokenizer.ggml.fim_sep_token_id", -1, nv);

    /* Recognised by text when no id is given; such a token is a control
     * token even if stored as normal, as in the reference. */
    int32_t *fims[3] = {&fim_pad, &fim_rep, &fim_sep};
    const char *const *fim_texts[3] = {k_fim_pad_text, k_fim_rep_text, k_fim_sep_text};
    const size_t fim_n[3] = {N_OF(k_fim_pad_text), N_OF(k_fim_rep_text), N_OF(k_fim_sep_text)};
    for (int k = 0; k < 3; k++) {
        if (*fims[k] >= 0) continue;
        *fims[k] = first_of(t, fim_texts[k], fim_n[k]);
        if (*fims[k] >= 0) t->tokens[*fims[k]].attr |= TOK_ATTR_CONTROL;
    }
    enum kvb_status st = KVB_OK;
    for (int k = 0; k < 3 && st == KVB_OK; k++) st = add_eog(t, *fims[k]);
    for (size_t i = 0; i < N_OF(k_eog_text) && st == KVB_OK; i++) {
        int32_t id = find_text(t, k_eog_text[i]);
        if (id < 0) continue;
        t->tokens[id].attr |= TOK_ATTR_CONTROL;
        st = add_eog(t, id);
    }
    if (st == KVB_OK) st = add_eog(t, t->eos);
    if (st == KVB_OK) st = add_eog(t, eot);
    if (st == KVB_OK) st = add_eog(t, eom);
    if (st != KVB_OK) return kvb_errf(err, st, "tokenizer: out of memory");
    if (t->n_eog > 1) qsort(t->eog, t->n_eog, sizeof *t->eog, cmp_i32);

    /* Tokens matched in raw text before tokenizing: control, user-defined
     * and unknown ones (control and unknown only when the caller asks). */
    size_t n_sp = 0;
    for (int32_t i = 0; i < nv; i++)
        if (t->tokens[i].attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) n_sp++;
    t->special = kvb_malloc((n_sp ? n_sp : 1) * sizeof *t->special);
    struct special_key *keys = kvb_malloc((n_sp ? n_sp : 1) * sizeof *keys);
    if (!t->special || !keys) {
        kvb_free(keys);
        return kvb_errf(err, KVB_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i < nv; i++)
        if (t->tokens[i].attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN))
            keys[t->n_special++] = (struct special_key){t->tokens[i].len, i};
    qsort(keys, t->n_special, sizeof *keys, cmp_special);
    for (size_t i = 0; i < t->n_special; i++) t->special[i] = keys[i].id;
    kvb_free(keys);

    /* Phi-3: white space after a special token belongs to the token (except
     * after <unk>, <s>, <|endoftext|>). Keyed on the model name, as upstream. */
    struct gguf_str name;
    if (gguf_get_str(f, "general.name", &name, NULL) == KVB_OK) {
        char low[256];
        size_t l = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
        for (size_t i = 0; i < l; i++) low[i] = (char)tolower((unsigned char)name.ptr[i]);
        low[l] = '\0';
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            for (size_t i = 0; i < t->n_special; i++) t->tokens[t->special[i]].attr |= TOK_ATTR_RSTRIP;
            int32_t id = find_text(t, "</s>");
            if (id >= 0) t->tokens[id].attr |= TOK_ATTR_RSTRIP;
            static const char *const k_keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (size_t i = 0; i < N_OF(k_keep); i++) {
                id = find_text(t, k_keep[i]);
                if (id >= 0) t->tokens[id].attr &= ~(uint32_t)TOK_ATTR_RSTRIP;
            }
        }
    }

    /* SentencePiece byte fallback: <0xNN>, else a token that is the byte itself. */
    for (int b = 0; b < 256; b++) {
        t->byte_tok[b] = -1;
        if (!spm) continue;
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = find_text(t, hex);
        if (id < 0) {
            char one = (char)b;
            id = tok_map_get(&t->vocab, &one, 1);
        }
        t->byte_tok[b] = id;
    }
    return KVB_OK;
}

/* UTF-8 characters of s[0..n), by lead bytes. */
static uint32_t n_chars(const char *s, uint32_t n)
{
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* The bounds of struct tok's last fields (tok_internal.h). max_cover must
 * never be too small: texts are refused by it. Each output token is a
 * symbol that is a vocabulary entry, a special token matched as text, or a
 * fallback token of one byte, and covers accordingly: byte-level BPE
 * symbols are runs of stand-in characters, one per byte; SentencePiece ones
 * slices of the buffer. A symbol left over that is no entry falls back to
 * tokens of its bytes, which is how live bytes always land in a token —
 * provided every BPE merge makes an entry, as it does in any vocabulary
 * trained as one. */
static enum kvb_status compute_bounds(struct tok *t, struct kvb_err *err)
{
    uint32_t cover = 1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const struct tok_entry *e = &t->tokens[i];
        if (e->len > t->max_len) t->max_len = e->len;
        const bool special = e->attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN);
        uint32_t c = t->kind == TOK_KIND_BPE && !special ? n_chars(t->text + e->off, e->len) : e->len;
        if (c > cover) cover = c;
    }
    for (size_t i = 0; i < t->n_special; i++)
        if (t->tokens[t->special[i]].attr & (TOK_ATTR_LSTRIP | TOK_ATTR_RSTRIP)) t->strip_specials = true;

    bool merges_make_tokens = true;
    for (int b = 0; b < 256; b++) {
        if (t->kind == TOK_KIND_SPM) {
            t->byte_live[b] = t->byte_tok[b] >= 0 || t->unk >= 0;
        } else {
            char u[4];
            size_t ul = unicode_encode(tok_byte_to_cpt((uint8_t)b), u);
            t->byte_live[b] = tok_map_get(&t->vocab, u, ul) >= 0;
        }
    }
    if (t->kind == TOK_KIND_BPE && t->ranks.slots) {
        char *cat = kvb_malloc((size_t)t->max_merge_len + 1);
        if (!cat) return kvb_errf(err, KVB_ERR_NOMEM, "tokenizer: out of memory");
        for (size_t i = 0; merges_make_tokens && i <= t->ranks.mask; i++) {
            const struct tok_map_slot *sl = &t->ranks.slots[i];
            if (!sl->key) continue;
            const char *sp = memchr(sl->key + 1, ' ', sl->len - 1); /* as load_merges split it */
            size_t l = (size_t)(sp - sl->key);
            memcpy(cat, sl->key, l);
            memcpy(cat + l, sp + 1, sl->len - l - 1);
            merges_make_tokens = tok_map_get(&t->vocab, cat, sl->len - 1) >= 0;
        }
        kvb_free(cat);
    }
    /* WordPiece: one unknown token stands for a whole word */
    t->max_cover = merges_make_tokens && t->kind != TOK_KIND_WPM ? cover : 0;
    return KVB_OK;
}

static enum kvb_status load(struct tok *t, const struct gguf_file *f, struct kvb_err *err)
{
    struct gguf_str model;
    enum kvb_status st = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
    if (st != KVB_OK) return kvb_err_wrap(err, st, "tokenizer");
    const struct pre_entry *pre = NULL;
    if (str_is(model, "llama")) {
        t->kind = TOK_KIND_SPM;
    } else if (str_is(model, "gpt2")) {
        t->kind = TOK_KIND_BPE;
        struct gguf_str pname = {0, ""};
        if (gguf_get_str(f, "tokenizer.ggml.pre", &pname, NULL) != KVB_OK || pname.len == 0)
            pre = &k_pre[0]; /* no name: the reference's "default" split */
        for (size_t i = 0; !pre && i < N_OF(k_pre); i++)
            if (str_is(pname, k_pre[i].name)) pre = &k_pre[i];
        if (!pre)
            return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                            "tokenizer: pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported; kvbatch knows "
                            "default, gpt-2, starcoder, smollm, refact, llama-bpe/llama3, qwen2 and a few aliases",
                            (int)(pname.len > 64 ? 64 : pname.len), pname.ptr);
        t->split = pre->split;
        t->ignore_merges = pre->llama3;
    } else if (str_is(model, "bert")) {
        t->kind = TOK_KIND_WPM;
        /* BertNormalizer: lowercase by default, accents stripped when
         * lowercasing unless said otherwise (llama.cpp's reading) */
        t->wpm_lowercase = opt_bool(f, "tokenizer.ggml.normalizer.lowercase", true);
        t->wpm_strip_accents = opt_bool(f, "tokenizer.ggml.normalizer.strip_accents", t->wpm_lowercase);
    } else {
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "tokenizer: model '%.*s' (tokenizer.ggml.model) is not supported; kvbatch handles "
                        "'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE) and 'bert' (WordPiece)",
                        (int)(model.len > 64 ? 64 : model.len), model.ptr);
    }

    KVB_FORWARD_IF_ERROR(load_tokens(t, f, err));
    if (t->kind == TOK_KIND_BPE) KVB_FORWARD_IF_ERROR(load_merges(t, f, err));

    const bool wpm = t->kind == TOK_KIND_WPM; /* [CLS] text [SEP], as a BERT tokenizer encodes */
    t->add_bos = opt_bool(f, "tokenizer.ggml.add_bos_token", wpm || t->kind == TOK_KIND_SPM || (pre && pre->llama3));
    t->add_eos = opt_bool(f, "tokenizer.ggml.add_eos_token", wpm && opt_bool(f, "tokenizer.ggml.add_sep_token", true));
    t->add_space_prefix = opt_bool(f, "tokenizer.ggml.add_space_prefix", t->kind == TOK_KIND_SPM);
    KVB_FORWARD_IF_ERROR(load_specials(t, f, err));
    return compute_bounds(t, err);
}

enum kvb_status tok_load(const struct gguf_file *f, struct tok **out, struct kvb_err *err)
{
    *out = NULL;
    struct tok *t = kvb_calloc(1, sizeof *t);
    if (!t) return kvb_errf(err, KVB_ERR_NOMEM, "tokenizer: out of memory");
    t->bos = t->eos = t->unk = -1;
    enum kvb_status st = load(t, f, err);
    if (st != KVB_OK) {
        tok_free(t);
        return st;
    }
    *out = t;
    return KVB_OK;
}
