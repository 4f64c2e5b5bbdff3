/* tok.h — tokenizer built from GGUF metadata.
 *
 * Supported: byte-level BPE (`tokenizer.ggml.model` = "gpt2") with the
 * pre-tokenizer named by `tokenizer.ggml.pre` (default GPT-2 split, "smollm"/
 * "starcoder" digits-one-by-one, "llama-bpe"/"llama3", "qwen2", …) and
 * SentencePiece-style BPE ("llama") with byte fallback. Anything else is
 * refused by tok_load with KVB_ERR_UNSUPPORTED naming the model/pre value.
 *
 * Ownership: tok_load copies everything it needs; the gguf file may be closed
 * afterwards. Arrays returned by tok_encode are owned by the caller (kvb_free).
 * A struct tok is immutable after load and safe to share between threads. */
#ifndef KVB_TOK_H
#define KVB_TOK_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/gguf.h"

struct tok;

enum tok_flags {
    TOK_ADD_BOS = 1u << 0,      /* prepend BOS (if the vocab has one) */
    TOK_ADD_EOS = 1u << 1,      /* append EOS */
    TOK_PARSE_SPECIAL = 1u << 2 /* text of control/user-defined tokens (e.g. "<|im_start|>") maps to them */
};

enum kvb_status tok_load(const struct gguf_file *f, struct tok **out, struct kvb_err *err);
void tok_free(struct tok *t); /* accepts NULL */

int32_t tok_n_vocab(const struct tok *t);
int32_t tok_bos(const struct tok *t); /* -1 when none */
int32_t tok_eos(const struct tok *t); /* -1 when none */
/* Metadata's `tokenizer.ggml.add_bos_token` (or the model type's default). */
bool tok_wants_bos(const struct tok *t);
/* End of generation: EOS, EOT, <|im_end|>, <|eot_id|>, <|end|> … as the vocab marks them. */
bool tok_is_eog(const struct tok *t, int32_t id);
/* Token id whose text is exactly `text` (any token type), or -1. */
int32_t tok_find(const struct tok *t, const char *text);

/* Encodes len bytes of text (any bytes; invalid UTF-8 is handled as the
 * reference tokenizer does). *out_ids is kvb_malloc'd, caller frees.
 * Memory: about 6 bytes per byte of text, plus 20 per byte of its longest
 * pre-tokenizer word (SentencePiece: of its longest run between special
 * tokens), plus the ids. */
enum kvb_status tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags, int32_t **out_ids,
                           size_t *out_n, struct kvb_err *err);

/* Bytes [off, off+len) of a text. */
struct tok_span {
    size_t off, len;
};

/* What a caller tells tok_encode_with beyond the text: bounds (it will
 * refuse long texts anyway, or may be interrupted) and the parts of the
 * text to read as plain text. */
struct tok_limits {
    /* > 0: at most this many ids (BOS/EOS included), else KVB_ERR_RANGE. It
     * is found early: a text whose bytes alone rule it out is not
     * tokenized at all (no token stands for more than so many bytes of
     * text), and tokenizing stops once the ids pass the limit. */
    size_t max_ids;
    /* Non-NULL: polled during a long encode; once nonzero (a signal
     * handler's flag), the encode stops with KVB_ERR_CANCELLED. */
    const volatile sig_atomic_t *cancel;
    /* (n_plain) sorted, disjoint spans read as without TOK_PARSE_SPECIAL
     * even when it is given: a control token whose text touches one is
     * plain text there (a chat template's output: the template's own
     * control tokens are tokens, the user's text that looks like one is
     * not). */
    const struct tok_span *plain;
    size_t n_plain;
};

/* tok_encode within lim (NULL: none). The ids are those of tok_encode
 * whenever it returns KVB_OK. */
enum kvb_status tok_encode_with(const struct tok *t, const char *text, size_t len, unsigned flags,
                                const struct tok_limits *lim, int32_t **out_ids, size_t *out_n, struct kvb_err *err);

/* The raw bytes one token stands for (byte-level decoding and SentencePiece
 * "▁" → space applied; byte-fallback tokens <0xNN> give that byte; control
 * tokens give their text only if render_special). Writes at most cap bytes,
 * returns the full length (like snprintf, without NUL). */
size_t tok_piece(const struct tok *t, int32_t id, bool render_special, char *buf, size_t cap);

/* Streaming decoder: turns a sequence of ids into text, holding back bytes of
 * a UTF-8 sequence split across tokens until it is complete. */
struct tok_stream {
    unsigned char pending[8];
    int n_pending;
    bool at_start; /* SentencePiece: drop the leading space of the first piece */
};
void tok_stream_init(struct tok_stream *s, const struct tok *t);
/* Appends the text that token `id` completes to out (growing *out with
 * kvb_realloc; *cap tracks its size); returns KVB_ERR_NOMEM on failure. */
enum kvb_status tok_stream_push(const struct tok *t, struct tok_stream *s, int32_t id, char **out, size_t *len,
                                size_t *cap);
/* As tok_stream_push, but a control token (one whose text tok_piece gives
 * only with render_special) adds its text, after the bytes held back for an
 * unfinished character (flushed as U+FFFD: the token cannot finish it).
 * What skip_special_tokens false shows, and what `kvbatch render` shows of a
 * prompt given as token ids. */
enum kvb_status tok_stream_push_special(const struct tok *t, struct tok_stream *s, int32_t id, char **out, size_t *len,
                                        size_t *cap);
/* Flushes bytes still pending (an incomplete sequence at the very end) as
 * U+FFFD replacement characters. */
enum kvb_status tok_stream_flush(const struct tok *t, struct tok_stream *s, char **out, size_t *len, size_t *cap);

/* Convenience: whole decode of ids into a NUL-terminated kvb_malloc'd string. */
enum kvb_status tok_decode(const struct tok *t, const int32_t *ids, size_t n, char **out, size_t *out_len);

#endif
