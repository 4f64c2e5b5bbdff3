/* test_tok_limits.c — the tokenizer's bounds on memory and time.
 *
 * - The merge loop (tok_merge.c: an indexed heap over a word's bytes) gives
 *   exactly the ids of a plain quadratic BPE written here from the rules —
 *   lowest merge rank first (SentencePiece: highest score), leftmost on
 *   ties — on single words, for every test vocabulary;
 * - tok_encode_with's max_ids never refuses a text that fits (its early
 *   bounds are sound) and always refuses one that does not, on texts built
 *   to sit at those bounds: the longest tokens back to back, special tokens,
 *   bytes that make no token, overlong UTF-8, stripped white space;
 * - a text refused on its bytes alone is refused before any allocation;
 * - a raised cancel flag stops a long encode at once;
 * - every allocation failure in a byte-level BPE encode is KVB_ERR_NOMEM.
 * Vocabularies: the .gguf files of $KVB_TESTDATA/tokenizer (fetched by
 * scripts/fetch-testdata.sh) and the default
 * model's. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/rng.h"
#include "base/unicode.h"
#include "model/gguf.h"
#include "support/testutil.h"
#include "text/tok.h"
#include "text/tok_internal.h"

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) { return (uint32_t)(kvb_xorshift64(&rng_state) % n); }

struct buf {
    char *p;
    size_t n, cap;
};

static void put(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

static int32_t *encode(const struct tok *t, const char *s, size_t len, unsigned flags, size_t *n)
{
    int32_t *ids = NULL;
    struct kvb_err err = {{0}};
    enum kvb_status st = tok_encode(t, s, len, flags, &ids, n, &err);
    CHECK_MSG(st == KVB_OK, "tok_encode: %s", err.msg);
    return ids;
}

/* ---- the reference BPE ------------------------------------------------------ */

/* Symbols as strings in one array of (offset, length) into a text buffer. */
struct rsym {
    size_t off, len;
};

/* Byte-level BPE of one word w[0..n): symbols are the stand-in characters
 * of its bytes; the adjacent pair whose "left right" has the lowest rank
 * merges, leftmost first, until none has one. */
static size_t ref_bpe(const struct tok *t, const char *w, size_t n, int32_t *out)
{
    struct buf s = {0};
    struct rsym *y = malloc((n + 1) * sizeof *y);
    size_t ny = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        size_t ul = unicode_encode(tok_byte_to_cpt((uint8_t)w[i]), u);
        y[ny++] = (struct rsym){s.n, ul};
        put(&s, u, ul);
    }
    struct buf key = {0};
    for (;;) {
        int32_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < ny; i++) {
            key.n = 0;
            put(&key, s.p + y[i].off, y[i].len);
            put(&key, " ", 1);
            put(&key, s.p + y[i + 1].off, y[i + 1].len);
            int32_t r = tok_map_get(&t->ranks, key.p, key.n);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) break;
        /* merged: its text is the two written again side by side (through
         * key: put may move s) */
        size_t off = s.n;
        key.n = 0;
        put(&key, s.p + y[at].off, y[at].len);
        put(&key, s.p + y[at + 1].off, y[at + 1].len);
        put(&s, key.p, key.n);
        y[at] = (struct rsym){off, y[at].len + y[at + 1].len};
        memmove(y + at + 1, y + at + 2, (ny - at - 2) * sizeof *y);
        ny--;
    }
    size_t k = 0;
    for (size_t i = 0; i < ny; i++) {
        int32_t id = tok_map_get(&t->vocab, s.p + y[i].off, y[i].len);
        if (id >= 0) {
            out[k++] = id;
            continue;
        }
        for (size_t j = 0; j < y[i].len; j++) {
            int32_t b = tok_map_get(&t->vocab, s.p + y[i].off + j, 1);
            if (b >= 0) out[k++] = b;
        }
    }
    free(s.p);
    free(key.p);
    free(y);
    return k;
}

/* SentencePiece BPE of a text without special tokens: spaces as "▁" (one
 * in front), symbols its UTF-8 characters; the adjacent pair whose
 * concatenation is a token of the highest score merges, leftmost first. */
static size_t ref_spm(const struct tok *t, const char *w, size_t n, int32_t *out)
{
    struct buf s = {0};
    if (t->add_space_prefix) puts_(&s, "\xE2\x96\x81");
    for (size_t i = 0; i < n; i++) {
        if (w[i] == ' ') puts_(&s, "\xE2\x96\x81");
        else put(&s, w + i, 1);
    }
    struct rsym *y = malloc((s.n + 1) * sizeof *y);
    size_t ny = 0;
    for (size_t off = 0; off < s.n;) {
        size_t cl = unicode_utf8_len((unsigned char)s.p[off]);
        if (cl > s.n - off) cl = s.n - off;
        y[ny++] = (struct rsym){off, cl};
        off += cl;
    }
    for (;;) {
        bool found = false;
        float best = 0;
        size_t at = 0;
        for (size_t i = 0; i + 1 < ny; i++) {
            int32_t id = tok_map_get(&t->vocab, s.p + y[i].off, y[i].len + y[i + 1].len);
            if (id >= 0 && (!found || t->tokens[id].score > best)) found = true, best = t->tokens[id].score, at = i;
        }
        if (!found) break;
        y[at].len += y[at + 1].len; /* neighbours are contiguous */
        memmove(y + at + 1, y + at + 2, (ny - at - 2) * sizeof *y);
        ny--;
    }
    size_t k = 0;
    for (size_t i = 0; i < ny; i++) {
        int32_t id = tok_map_get(&t->vocab, s.p + y[i].off, y[i].len);
        if (id >= 0) {
            out[k++] = id;
            continue;
        }
        for (size_t j = 0; j < y[i].len; j++) {
            int32_t b = t->byte_tok[(unsigned char)s.p[y[i].off + j]];
            if (b < 0) b = t->unk;
            if (b >= 0) out[k++] = b;
        }
    }
    free(s.p);
    free(y);
    return k;
}

/* Random words that every pre-tokenizer keeps whole: letters only (ASCII,
 * Latin-1, CJK), so that one word's merges are what is compared. */
static void check_against_reference(const struct tok *t, const char *name)
{
    static const char *const k_letters[] = {
        "a", "b", "c", "e", "n", "t", "ab", "th", "\xC3\xA9", "\xC3\x9F", "\xE4\xB8\xAD", "\xE6\x96\x87"};
    const size_t n_letters = sizeof k_letters / sizeof k_letters[0];
    int mismatches = 0;
    for (int k = 0; k < 60; k++) {
        struct buf w = {0};
        size_t target = k < 50 ? 1 + rnd(120) : 600 + rnd(600);
        const int alpha = 2 + (int)rnd((uint32_t)n_letters - 1); /* small alphabets repeat, large ones vary */
        while (w.n < target) puts_(&w, k_letters[rnd((uint32_t)alpha)]);
        size_t n = 0;
        int32_t *got = encode(t, w.p, w.n, 0, &n);
        int32_t *want = malloc((4 * w.n + 8) * sizeof *want);
        size_t nw = t->kind == TOK_KIND_BPE ? ref_bpe(t, w.p, w.n, want) : ref_spm(t, w.p, w.n, want);
        bool same = got && n == nw && memcmp(got, want, n * sizeof *got) == 0;
        if (!same && mismatches++ < 3)
            CHECK_MSG(false, "%s: %zu ids, the reference %zu, for a word of %zu bytes starting '%.40s'", name, n, nw,
                      w.n, w.p);
        kvb_free(got);
        free(want);
        free(w.p);
    }
    CHECK_EQ_INT(mismatches, 0);
}

/* ---- max_ids ---------------------------------------------------------------- */

/* texts[i] with their lengths (they hold NUL bytes). */
struct texts {
    struct buf *v;
    size_t n;
};

static struct buf *add_text(struct texts *ts)
{
    ts->v = realloc(ts->v, (ts->n + 1) * sizeof *ts->v);
    ts->v[ts->n] = (struct buf){0};
    return &ts->v[ts->n++];
}

/* Texts at the edges of the bounds tok_encode_with uses. */
static void edge_texts(const struct tok *t, struct texts *ts)
{
    /* the tokens that cover the most text, back to back */
    int32_t longest = 0, longest_special = -1;
    size_t best = 0, best_special = 0;
    char piece[1024];
    for (int32_t id = 0; id < tok_n_vocab(t); id++) {
        size_t l = tok_piece(t, id, false, piece, sizeof piece);
        if (l > best && l <= sizeof piece) best = l, longest = id;
        const uint32_t sp = TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED;
        if ((t->tokens[id].attr & sp) && t->tokens[id].len > best_special)
            best_special = t->tokens[id].len, longest_special = id;
    }
    struct buf *b = add_text(ts);
    size_t l = tok_piece(t, longest, false, piece, sizeof piece);
    for (int i = 0; i < 300; i++) put(b, piece, l);
    if (longest_special >= 0) {
        b = add_text(ts);
        for (int i = 0; i < 300; i++) put(b, t->text + t->tokens[longest_special].off, t->tokens[longest_special].len);
        b = add_text(ts); /* white space a stripping special token eats */
        for (int i = 0; i < 50; i++) {
            put(b, "      \n\t  ", 10);
            put(b, t->text + t->tokens[longest_special].off, t->tokens[longest_special].len);
            put(b, "    \r\n   ", 9);
        }
    }
    b = add_text(ts); /* every byte, many of them tokenless in some vocabularies */
    for (int i = 0; i < 20; i++)
        for (int c = 0; c < 256; c++) {
            char ch = (char)c;
            put(b, &ch, 1);
        }
    b = add_text(ts); /* the ASCII bytes that alone make no token, then one that does */
    char dead[128];
    size_t n_dead = 0;
    for (int c = 1; c < 128; c++) {
        char ch = (char)c;
        size_t n = 0;
        int32_t *ids = encode(t, &ch, 1, 0, &n);
        if (n == 0) dead[n_dead++] = ch;
        kvb_free(ids);
    }
    for (int i = 0; i < 3000 && n_dead; i++) put(b, dead, n_dead);
    put(b, "x", 1);
    b = add_text(ts); /* overlong forms: several bytes decode to one */
    for (int i = 0; i < 300; i++) put(b, "\xC0\x80\xE0\x80\x80\xF0\x80\x80\x80\xF7\xBF\xBF\xBF", 13);
    b = add_text(ts);
    for (int i = 0; i < 3000; i++) put(b, "a", 1);
    b = add_text(ts);
    for (int i = 0; i < 3000; i++) put(b, " ", 1);
    b = add_text(ts);
    puts_(b, "<|im_start|>user\nHello there, how are you?<|im_end|>\n<s>[INST] 12345 \xF0\x9F\xA6\x99 [/INST]</s>");
    for (int k = 0; k < 30; k++) { /* random mixtures */
        b = add_text(ts);
        static const char *const k_bits[] = {
            "a",    "aa",       " ",    "  ",         "\n",           "1",
            "234",  ".",        "'s",   "\xC3\xA9",   "\xE4\xB8\xAD", "\xF0\x9F\xA6\x99",
            "\x80", "\xC0\x80", "\x04", "<|im_end|>", "<s>",          "\t"};
        size_t parts = 1 + rnd(400);
        for (size_t i = 0; i < parts; i++) puts_(b, k_bits[rnd(sizeof k_bits / sizeof k_bits[0])]);
    }
}

static void check_max_ids(const struct tok *t, const char *name)
{
    struct texts ts = {0};
    edge_texts(t, &ts);
    int wrong = 0;
    for (size_t i = 0; i < ts.n; i++) {
        for (int fl = 0; fl < 2; fl++) {
            const unsigned flags = fl ? TOK_ADD_BOS | TOK_PARSE_SPECIAL : 0;
            size_t n = 0;
            int32_t *all = encode(t, ts.v[i].p, ts.v[i].n, flags, &n);
            const size_t limits[] = {n, n + 1, n > 1 ? n - 1 : 0, n > 2 ? n / 2 : 0, 1};
            for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
                if (!limits[k]) continue;
                struct tok_limits lim = {.max_ids = limits[k]};
                int32_t *ids = NULL;
                size_t m = 0;
                struct kvb_err err = {{0}};
                enum kvb_status st = tok_encode_with(t, ts.v[i].p, ts.v[i].n, flags, &lim, &ids, &m, &err);
                bool ok = limits[k] >= n ? st == KVB_OK && m == n && memcmp(ids, all, n * sizeof *ids) == 0
                                         : st == KVB_ERR_RANGE && ids == NULL;
                if (!ok && wrong++ < 5)
                    CHECK_MSG(false, "%s: text %zu (%zu bytes, flags %u, %zu ids) with max_ids %zu: %s", name, i,
                              ts.v[i].n, flags, n, limits[k], st == KVB_OK ? "ok" : err.msg);
                kvb_free(ids);
            }
            kvb_free(all);
        }
        free(ts.v[i].p);
    }
    free(ts.v);
    CHECK_EQ_INT(wrong, 0);
}

/* A text far beyond the limit is refused on its bytes, before any work:
 * even with every allocation failing. */
static void check_refused_unread(const struct tok *t, const char *name)
{
    const size_t len = (size_t)20 << 20;
    char *text = malloc(len);
    memset(text, 'a', len);
    struct tok_limits lim = {.max_ids = 4095};
    int32_t *ids = NULL;
    size_t n = 0;
    struct kvb_err err = {{0}};
    kvb_alloc_fail_after(0);
    /* CPU time of this thread, not wall time: what the refusal costs, the
     * same on a busy machine. One pass over the 20 MiB costs ~15 ms here;
     * encoding them, tens of seconds: the bound is 15x the first and far
     * below the second. */
    double t0 = thread_cpu_s();
    enum kvb_status st = tok_encode_with(t, text, len, TOK_ADD_BOS, &lim, &ids, &n, &err);
    double dt = thread_cpu_s() - t0;
    kvb_alloc_fail_after(-1);
    CHECK_MSG(st == KVB_ERR_RANGE, "%s: 20 MiB of 'a' with max_ids 4095: %s", name, err.msg);
    CHECK_MSG(strstr(err.msg, "more than 4095 tokens") != NULL, "%s: message '%s'", name, err.msg);
    CHECK_MSG(dt < 0.25, "%s: refusing took %.4f s of CPU", name, dt);
    kvb_free(ids);
    /* Past the early bound, the ids are counted as they come: a run of one
     * letter needs about a token per 4 bytes, more than its bytes say. */
    lim.max_ids = 1000;
    kvb_alloc_fail_after(-1);
    st = tok_encode_with(t, text, 30000, 0, &lim, &ids, &n, &err);
    CHECK_MSG(st == KVB_ERR_RANGE, "%s: 30000 'a' in 1000 ids: %d", name, (int)st);
    kvb_free(ids);
    free(text);
}

/* ---- cancel ------------------------------------------------------------------- */

/* Raises the flag after `delay` s and notes how much CPU time the encoding
 * thread had used by then: what it uses after that is the cost of noticing,
 * counted in its own CPU time so that a busy machine does not change it. */
struct raiser {
    volatile sig_atomic_t *flag;
    double delay;
    clockid_t encoder; /* CPU clock of the encoding thread */
    double cpu_at;     /* its CPU time when the flag went up */
};

static void *raise_later(void *p)
{
    struct raiser *r = p;
    usleep((useconds_t)(r->delay * 1e6));
    r->cpu_at = clock_s(r->encoder);
    *r->flag = 15;
    return NULL;
}

static void check_cancel(const struct tok *t, const char *name)
{
    volatile sig_atomic_t flag = 1;
    struct tok_limits lim = {.cancel = &flag};
    const size_t len = (size_t)16 << 20; /* one word: seconds of merging */
    char *text = malloc(len);
    for (size_t i = 0; i < len; i++) text[i] = "ab"[i % 7 == 3];
    int32_t *ids = NULL;
    size_t n = 0;
    struct kvb_err err = {{0}};
    enum kvb_status st = tok_encode_with(t, text, len, 0, &lim, &ids, &n, &err);
    CHECK_MSG(st == KVB_ERR_CANCELLED, "%s: flag raised before: %d", name, (int)st);
    kvb_free(ids);
    ids = NULL;
    flag = 0;
    struct raiser r = {.flag = &flag, .delay = 0.3};
    CHECK(pthread_getcpuclockid(pthread_self(), &r.encoder) == 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, raise_later, &r) == 0);
    st = tok_encode_with(t, text, len, 0, &lim, &ids, &n, &err);
    double done = clock_s(r.encoder);
    pthread_join(th, NULL);
    CHECK_MSG(st == KVB_ERR_CANCELLED, "%s: flag raised during the encode: %d (%zu ids)", name, (int)st, n);
    /* The whole encode takes seconds of CPU; the flag is read between
     * words and merge rounds, milliseconds apart. */
    CHECK_MSG(done - r.cpu_at < 0.25, "%s: used %.3f s of CPU after the flag went up", name, done - r.cpu_at);
    kvb_free(ids);
    free(text);
}

/* ---- allocation failures ----------------------------------------------------- */

static void check_alloc_failures(const struct tok *t, const char *name)
{
    struct buf b = {0};
    puts_(&b, "Hello wörld 12345 ");
    for (int i = 0; i < 500; i++) puts_(&b, "ab");
    puts_(&b, " \xF0\x9F\xA6\x99  x\n");
    bool done = false;
    for (long k = 0; k < 400 && !done; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        struct kvb_err err = {{0}};
        struct tok_limits lim = {.max_ids = 100000};
        kvb_alloc_fail_after(k);
        enum kvb_status st = tok_encode_with(t, b.p, b.n, TOK_ADD_BOS, &lim, &ids, &n, &err);
        kvb_alloc_fail_after(-1);
        if (st == KVB_OK) done = true;
        else CHECK_MSG(st == KVB_ERR_NOMEM, "%s: allocation %ld failing gave %d", name, k, (int)st);
        kvb_free(ids);
    }
    CHECK(done);
    free(b.p);
}

static void check_vocab(const char *path, const char *name, bool slow_checks)
{
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    struct kvb_err err = {{0}};
    if (gguf_open(path, &f, &err) != KVB_OK || tok_load(f, &t, &err) != KVB_OK) {
        CHECK_MSG(false, "%s: %s (the test vocabularies are fetched by scripts/setup.sh --test)", path, err.msg);
        tok_free(t);
        gguf_close(f);
        return;
    }
    fprintf(stderr, "%s: tokens cover at most %u bytes%s\n", name, t->max_cover,
            t->strip_specials ? " (special tokens strip white space)" : "");
    CHECK_MSG(t->max_cover > 0, "%s: no bound", name);
    check_against_reference(t, name);
    check_max_ids(t, name);
    check_refused_unread(t, name);
    if (slow_checks) check_cancel(t, name);
    if (t->kind == TOK_KIND_BPE) check_alloc_failures(t, name);
    tok_free(t);
    gguf_close(f);
}

int main(void)
{
    const char *td = tu_env("KVB_TESTDATA");
    if (!td) {
        fprintf(stderr, "KVB_TESTDATA not set\n");
        return 1;
    }
    static const char *const k_names[] = {"gpt-2", "starcoder", "llama-spm", "phi-3", "llama-bpe", "qwen2"};
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-%s.gguf", td, k_names[i]);
        check_vocab(path, k_names[i], i == 0 || i == 2);
    }
    const char *model = tu_env("KVB_MODEL");
    if (model && access(model, R_OK) == 0) check_vocab(model, "default model", true);
    else fprintf(stderr, "default model absent: its vocabulary not checked\n");
    return tu_finish();
}
