/* tok_internal.h — what the tokenizer's files share: the layout of struct
 * tok, token attributes, and the per-fragment encoders. Not a public header:
 * only tok*.c include it; everyone else uses tok.h.
 *
 * The tokenizer is split by job: tok_load.c reads the vocabulary, tok.c
 * drives an encode (special-token partition, BOS/EOS), tok_pre.c splits text
 * into words the way each pre-tokenizer's regex would, tok_bpe.c does
 * byte-level BPE, tok_spm.c SentencePiece BPE, tok_wpm.c BERT's WordPiece,
 * tok_decode.c turns ids back
 * into bytes; tok_map.c and tok_merge.c are their hash map and merge loop. */
#ifndef KVB_TOK_INTERNAL_H
#define KVB_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/tok.h"
#include "text/tok_map.h"

/* Token attributes, a bit set as in the reference (a token can gain CONTROL
 * on top of its stored type, e.g. an end-of-turn token stored as normal). */
enum tok_attr {
    TOK_ATTR_UNDEFINED = 0,
    TOK_ATTR_UNKNOWN = 1u << 0,
    TOK_ATTR_UNUSED = 1u << 1,
    TOK_ATTR_NORMAL = 1u << 2,
    TOK_ATTR_CONTROL = 1u << 3,
    TOK_ATTR_USER_DEFINED = 1u << 4,
    TOK_ATTR_BYTE = 1u << 5,
    TOK_ATTR_LSTRIP = 1u << 7, /* special-token match eats white space before it */
    TOK_ATTR_RSTRIP = 1u << 8  /* … and after it */
};

enum tok_kind {
    TOK_KIND_SPM, /* tokenizer.ggml.model = "llama" */
    TOK_KIND_BPE, /* tokenizer.ggml.model = "gpt2" */
    TOK_KIND_WPM  /* tokenizer.ggml.model = "bert": WordPiece (tok_wpm.c) */
};

/* Pre-tokenizer splits (BPE only), each a fixed sequence of regex passes. */
enum tok_split {
    TOK_SPLIT_DEFAULT, /* punctuation runs, GPT-2, \p{N}+, [0-9]{3} (the reference's fallback) */
    TOK_SPLIT_GPT2,    /* the GPT-2 regex */
    TOK_SPLIT_DIGITS,  /* \p{N} one by one, then the GPT-2 regex (starcoder, smollm, refact) */
    TOK_SPLIT_LLAMA3,  /* the Llama 3 regex (\p{N}{1,3}) */
    TOK_SPLIT_QWEN2    /* the Llama 3 regex with \p{N} one by one */
};

struct tok_entry {
    uint32_t off;  /* into tok.text; the text is also NUL-terminated there */
    uint32_t len;  /* bytes */
    float score;   /* SPM merge priority (higher merges first) */
    uint32_t attr; /* enum tok_attr bits */
};

struct tok {
    enum tok_kind kind;
    enum tok_split split;
    int32_t n_vocab;
    struct tok_entry *tokens; /* (n_vocab) */
    char *text;               /* all token texts, NUL-separated */
    char *merge_text;         /* BPE: all merge strings "left right", NUL-separated */
    struct tok_map vocab;     /* token text → id */
    struct tok_map ranks;     /* BPE: "left right" → merge rank (lower merges first) */
    int32_t *special;         /* ids matched in raw text before tokenizing, longest text first */
    size_t n_special;
    int32_t *eog; /* sorted ids that end generation */
    size_t n_eog;
    int32_t bos, eos, unk; /* -1 when absent */
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    bool wpm_lowercase, wpm_strip_accents; /* WordPiece's normalizer (tokenizer.ggml.normalizer.*) */
    int32_t byte_tok[256];                 /* SPM byte fallback: id of <0xNN> (or of the 1-byte token), -1 none */
    /* Bounds the encoders use to skip work (tok_load.c computes them): */
    uint32_t max_len;       /* longest token text, stored form (bytes) */
    uint32_t max_merge_len; /* BPE: longest "left right" merge string */
    /* Lower bounds on the ids of a text, from its bytes: every "live" byte
     * of an encoder's input (BPE: the UTF-8 of the decoded code points;
     * SPM: its buffer) ends up inside some output token, and no token
     * covers more than max_cover bytes. A byte is live when it alone makes
     * a token (BPE: its stand-in character; SPM: its byte-fallback or the
     * unknown token); the others may vanish. max_cover 0: no bound (a
     * BPE merge that makes no token). */
    uint32_t max_cover;
    bool byte_live[256];
    bool strip_specials; /* some special token eats white space beside it */
};

/* Limits as the encoders see them: never NULL (tok.c passes zeros). */
static inline bool tok_cancelled(const struct tok_limits *lim) { return lim->cancel && *lim->cancel; }

/* KVB_ERR_RANGE when `have` ids plus the at least ceil(live / max_cover)
 * that `live` live bytes give cannot stay within lim->max_ids. */
static inline enum kvb_status tok_check_room(const struct tok *t, const struct tok_limits *lim, size_t have,
                                             uint64_t live)
{
    if (!lim->max_ids) return KVB_OK;
    if (have > lim->max_ids) return KVB_ERR_RANGE;
    if (!t->max_cover) return KVB_OK;
    uint64_t at_least = (live + t->max_cover - 1) / t->max_cover;
    return at_least > lim->max_ids - have ? KVB_ERR_RANGE : KVB_OK;
}

/* The live bytes of s[0..n). */
static inline uint64_t tok_live_bytes(const struct tok *t, const char *s, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++) c += t->byte_live[(unsigned char)s[i]];
    return c;
}

/* A growing array of ids. */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
enum kvb_status tok_ids_push(struct tok_ids *ids, int32_t id);

/* Encoders of one raw-text fragment (no special tokens inside), appending to
 * out. SPM: prefix_space prepends " " first (the SentencePiece dummy prefix).
 * KVB_ERR_RANGE (out past lim->max_ids: stopped early), KVB_ERR_CANCELLED,
 * KVB_ERR_NOMEM. */
enum kvb_status tok_spm_encode(const struct tok *t, const char *text, size_t len, bool prefix_space,
                               const struct tok_limits *lim, struct tok_ids *out);
enum kvb_status tok_bpe_encode(const struct tok *t, const char *text, size_t len, const struct tok_limits *lim,
                               struct tok_ids *out);
enum kvb_status tok_wpm_encode(const struct tok *t, const char *text, size_t len, const struct tok_limits *lim,
                               struct tok_ids *out);

/* The GPT-2 byte ↔ printable-character mapping used by byte-level BPE: byte b
 * is written as code point tok_byte_to_cpt(b); the inverse gives -1 for a
 * code point that stands for no byte. */
uint32_t tok_byte_to_cpt(uint8_t b);
int tok_cpt_to_byte(uint32_t cpt);

#endif
