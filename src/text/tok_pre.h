/* tok_pre.h — pre-tokenizer: splits a run of code points into the words that
 * byte-level BPE then merges within, exactly as the reference's regex passes
 * would, but by hand (no regex engine).
 *
 * Each pass of a split sees the chunks the previous pass made and never looks
 * across a chunk boundary — that is how the reference runs its regex list,
 * and it matters (" 1" stays one word for GPT-2 but becomes " " + "1" once
 * digits are split out first). */
#ifndef KVB_TOK_PRE_H
#define KVB_TOK_PRE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/tok_internal.h"

/* Word boundaries: ends[i] is the code-point index one past word i; the last
 * end is n. Reused across calls (tok_pre_words_free releases). 32 bits: the
 * tokenizer takes at most INT32_MAX / 4 bytes of text. */
struct tok_pre_words {
    uint32_t *ends;
    size_t n, cap;
    uint32_t *tmp; /* scratch for multi-pass splits */
    size_t tmp_n, tmp_cap;
    uint8_t *flags; /* per code point class bits (tok_pre.c) */
    size_t flags_cap;
};

/* Splits cpts[0..n) per `split` into w (previous contents replaced).
 * KVB_ERR_RANGE for n past UINT32_MAX. */
enum kvb_status tok_pre_split(enum tok_split split, const uint32_t *cpts, size_t n, struct tok_pre_words *w);
/* Frees the scratch of a split, keeping its result (ends). */
void tok_pre_words_trim(struct tok_pre_words *w);
void tok_pre_words_free(struct tok_pre_words *w);

#endif
