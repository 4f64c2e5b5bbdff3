/* bench_constraint_limits.c — what the largest constraint of each kind that
 * kvbatch accepts costs: the budget of README's "Limits of one constraint"
 * (engine/grammar.h, grammar_regex.h, grammar_schema.h), measured.
 *
 * For each kind the constraint is sized at its limit (or, where the limit is
 * a size the text reaches indirectly, the largest size accepted, found by
 * doubling and bisection): GBNF at the element budget, groups nested to
 * GRAMMAR_MAX_NEST, a chain of rules GRAMMAR_MAX_DEPTH deep, GRAMMAR_MAX_STACKS
 * alternatives, a choice of GRAMMAR_MAX_CHOICES long strings, a regex at the
 * deterministic automaton's limit, a schema writing nearly GSCHEMA_MAX_BYTES
 * of GBNF. Each is compiled in a fresh process of its own, which reports the
 * compile time (text to GBNF to grammar, what admission pays), the peak
 * memory above what the child held before (getrusage), and, with the default
 * model's vocabulary, the first token mask (the start state's, with its cold
 * caches) and the slowest of the next 30 masks along a random walk.
 *
 * Not a ctest: it measures. Usage: bench_constraint_limits [kind] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/clock.h"
#include "engine/grammar.h"
#include "engine/grammar_regex.h"
#include "engine/grammar_schema.h"
#include "support/testutil.h"
#include "text/tok.h"

enum form { F_GBNF, F_REGEX, F_SCHEMA, F_CHOICE };

struct kind {
    const char *name, *what;
    enum form form;
    void (*make)(struct kvb_buf *b, long k);
    long k;      /* the size: fixed, or 0 to search */
    long lo, hi; /* search: accepted at lo, refused at hi (hi 0: double until refused) */
};

static void put(struct kvb_buf *b, const char *s)
{
    const size_t n = strlen(s);
    if (kvb_buf_reserve(b, n + 1) != KVB_OK) abort();
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
}

static void putl(struct kvb_buf *b, long x)
{
    char t[32];
    snprintf(t, sizeof t, "%ld", x);
    put(b, t);
}

static void make_elements(struct kvb_buf *b, long k) /* a 500-byte literal repeated k times */
{
    put(b, "root ::= \"");
    for (int i = 0; i < 500; i++) {
        const char c[2] = {(char)('a' + i % 26), 0};
        put(b, c);
    }
    put(b, "\"{");
    putl(b, k);
    put(b, "}\n");
}

static void make_nest(struct kvb_buf *b, long k)
{
    put(b, "root ::= ");
    for (long i = 0; i < k; i++) put(b, "(");
    put(b, "\"a\" [0-9]*");
    for (long i = 0; i < k; i++) put(b, ")");
    put(b, "\n");
}

static void make_left_chain(struct kvb_buf *b, long k)
{
    put(b, "root ::= r0\n");
    for (long i = 0; i + 1 < k; i++) {
        put(b, "r");
        putl(b, i);
        put(b, " ::= r");
        putl(b, i + 1);
        put(b, " \"a\"\n");
    }
    put(b, "r");
    putl(b, k - 1);
    put(b, " ::= [a-z]\n");
}

static void make_width(struct kvb_buf *b, long k)
{
    put(b, "root ::= ");
    for (long i = 0; i < k; i++) {
        put(b, i ? " | \"" : "\"");
        putl(b, i * 7919 % 100003);
        put(b, " item\"");
    }
    put(b, "\n");
}

static void make_choice(struct kvb_buf *b, long k) /* k strings of 250 bytes */
{
    put(b, "[");
    for (long i = 0; i < k; i++) {
        put(b, i ? ",\"" : "\"");
        putl(b, i);
        for (int j = 0; j < 244; j++) {
            const char c[2] = {(char)('a' + (i + j) % 26), 0};
            put(b, c);
        }
        put(b, "\"");
    }
    put(b, "]");
}

static void make_regex_dfa(struct kvb_buf *b, long k) /* (a|b)*a(a|b){k}: 2^(k+1) deterministic states */
{
    put(b, "(a|b)*a(a|b){");
    putl(b, k);
    put(b, "}");
}

static void make_regex_count(struct kvb_buf *b, long k)
{
    put(b, "([0-9a-f]{4}-){");
    putl(b, k);
    put(b, "}[0-9a-f]{12}");
}

static void make_schema(struct kvb_buf *b, long k) /* k properties, each a pattern within lengths */
{
    put(b, "{\"type\":\"object\",\"properties\":{");
    for (long i = 0; i < k; i++) {
        put(b, i ? ",\"p" : "\"p");
        putl(b, i);
        put(b, "\":{\"type\":\"string\",\"pattern\":\"^(ab|cd|ef)+[0-9]{1,9}$\",\"minLength\":5,\"maxLength\":");
        putl(b, 40 + i % 7);
        put(b, "}");
    }
    put(b, "}}");
}

static const struct kind kinds[] = {
    {"elements", "GBNF: a 500-byte literal {k} (GRAMMAR_MAX_ELEMS)", F_GBNF, make_elements, 2000, 0, 0},
    {"nest", "GBNF: groups nested k deep (GRAMMAR_MAX_NEST)", F_GBNF, make_nest, GRAMMAR_MAX_NEST, 0, 0},
    {"left-chain", "GBNF: k rules, each the next one's first item (GRAMMAR_MAX_DEPTH)", F_GBNF, make_left_chain,
     GRAMMAR_MAX_DEPTH, 0, 0},
    {"width", "GBNF: k alternatives (GRAMMAR_MAX_STACKS)", F_GBNF, make_width, GRAMMAR_MAX_STACKS, 0, 0},
    {"choice", "choice: k strings of 250 bytes (GRAMMAR_MAX_CHOICES)", F_CHOICE, make_choice, GRAMMAR_MAX_CHOICES, 0,
     0},
    {"regex-dfa", "regex (a|b)*a(a|b){k} (GREGEX_MAX_DFA)", F_REGEX, make_regex_dfa, 0, 4, 0},
    {"regex-count", "regex ([0-9a-f]{4}-){k}[0-9a-f]{12} (GREGEX_MAX_DFA, through a count)", F_REGEX, make_regex_count,
     0, 8, 0},
    {"schema", "schema: k properties, a pattern within lengths each (GRAMMAR_MAX_ELEMS of 8 MiB of GBNF)", F_SCHEMA,
     make_schema, 0, 16, 0},
};

/* Text to grammar as admission does it; NULL when refused (msg says why). */
static struct grammar *compile(enum form f, const struct kvb_buf *text, char *msg, size_t cap, size_t *gbnf_len)
{
    struct kvb_buf g = {0};
    char path[256];
    enum kvb_status st = KVB_OK;
    msg[0] = 0;
    switch (f) {
    case F_GBNF:
        st = kvb_buf_reserve(&g, text->len + 1);
        if (st == KVB_OK) {
            memcpy(g.data, text->data, text->len);
            g.len = text->len;
            g.data[g.len] = 0;
        }
        break;
    case F_REGEX: st = gregex_to_gbnf(text->data, text->len, GREGEX_WHOLE, "root", &g, msg, cap); break;
    case F_SCHEMA: st = gschema_to_gbnf(text->data, text->len, "schema", &g, path, sizeof path, msg, cap); break;
    case F_CHOICE: st = grammar_choice_gbnf(text->data, text->len, &g, msg, cap); break;
    }
    struct grammar *gr = NULL;
    if (st == KVB_OK) grammar_compile(g.data, g.len, &gr, msg, cap);
    *gbnf_len = g.len;
    kvb_buf_free(&g);
    return gr;
}

static bool accepted(const struct kind *k, long n)
{
    struct kvb_buf t = {0};
    k->make(&t, n);
    char msg[300];
    size_t gl;
    struct grammar *g = t.len <= GRAMMAR_MAX_TEXT ? compile(k->form, &t, msg, sizeof msg, &gl) : NULL;
    kvb_buf_free(&t);
    grammar_free(g);
    return g != NULL;
}

/* The largest size accepted: k->k, or found by doubling and bisection. */
static long largest(const struct kind *k)
{
    if (k->k) return k->k;
    long lo = k->lo, hi = k->hi;
    if (!accepted(k, lo)) return 0;
    if (!hi)
        for (hi = lo * 2; accepted(k, hi); hi *= 2) lo = hi;
    while (hi - lo > 1) {
        const long mid = lo + (hi - lo) / 2;
        if (accepted(k, mid)) lo = mid;
        else hi = mid;
    }
    return lo;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static struct grammar_vocab *vocab(struct tok **tok)
{
    bool absent = false;
    *tok = tu_model_tokenizer(&absent);
    struct grammar_vocab *v = NULL;
    struct kvb_err err = {{0}};
    if (*tok && grammar_vocab_create(*tok, &v, &err) != KVB_OK) v = NULL;
    return v;
}

/* In a fresh process: compile, masks; one line of results on stdout. */
static int measure(const struct kind *k, long n)
{
    struct kvb_buf t = {0};
    k->make(&t, n);
    const long before = rss_kib();
    char msg[300];
    size_t gl = 0;
    const double t0 = kvb_clock_s();
    struct grammar *g = compile(k->form, &t, msg, sizeof msg, &gl);
    const double t_compile = kvb_clock_s() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const long peak = ru.ru_maxrss - before;
    if (!g) {
        printf("%-12s k=%-6ld REFUSED: %s\n", k->name, n, msg);
        return 1;
    }
    struct tok *tok = NULL;
    struct grammar_vocab *v = vocab(&tok); /* after the compile: its peak is the compile's alone */
    double t_first = 0, t_worst = 0;
    size_t cache = 0;
    if (v) {
        struct grammar_matcher *m = NULL;
        float *logits = malloc(sizeof *logits * (size_t)grammar_vocab_size(v));
        if (grammar_matcher_create(g, v, &m) == KVB_OK && logits) {
            uint64_t s = 12345;
            for (int step = 0; step < 31; step++) {
                for (int32_t i = 0; i < grammar_vocab_size(v); i++) logits[i] = 0;
                const double a = kvb_clock_s();
                const int32_t allowed = grammar_mask(m, logits);
                const double dt = kvb_clock_s() - a;
                if (step == 0) t_first = dt;
                else if (dt > t_worst) t_worst = dt;
                if (allowed <= 0) break;
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                int32_t pick = (int32_t)((s >> 33) % (uint64_t)allowed), next = -1;
                for (int32_t i = 0; i < grammar_vocab_size(v) && next < 0; i++)
                    if (logits[i] == 0 && pick-- == 0) next = i;
                if (next < 0 || next == grammar_vocab_eog(v)) break;
                grammar_accept(m, next);
            }
            struct grammar_stats st;
            grammar_matcher_stats(m, &st);
            cache = st.cache_bytes;
        }
        free(logits);
        grammar_matcher_free(m);
    }
    printf("%-12s k=%-6ld text %7.2f MiB  gbnf %7.2f MiB  compile %7.3f s  peak +%6.1f MiB", k->name, n,
           (double)t.len / (1 << 20), (double)gl / (1 << 20), t_compile, (double)peak / 1024);
    if (!v) printf("  (no model vocabulary: masks not measured)");
    if (v)
        printf("  first mask %6.1f ms  worst of next 30 %6.1f ms  matcher caches %5.1f MiB", t_first * 1e3,
               t_worst * 1e3, (double)cache / (1 << 20));
    printf("\n");
    grammar_free(g);
    kvb_buf_free(&t);
    grammar_vocab_free(v);
    tok_free(tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--measure")) { /* a fresh process: its peak memory is the compile's */
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (!strcmp(kinds[i].name, argv[2])) return measure(&kinds[i], atol(argv[3]));
        return 2;
    }
    const char *only = argc > 1 ? argv[1] : NULL;
    printf("the largest accepted constraint of each kind (compiled in a fresh process each; peak: memory above\n"
           "what the process held before the compile; masks over the default model's vocabulary):\n");
    int bad = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const struct kind *k = &kinds[i];
        if (only && strcmp(only, k->name)) continue;
        const long n = largest(k);
        printf("# %s\n", k->what);
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            char kk[32];
            snprintf(kk, sizeof kk, "%ld", n);
            execl("/proc/self/exe", argv[0], "--measure", k->name, kk, (char *)NULL);
            _exit(127);
        }
        int ws = 0;
        waitpid(pid, &ws, 0);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) bad = 1;
        { /* one more is refused, by name */
            struct kvb_buf t = {0};
            k->make(&t, n + 1);
            char msg[300] = "";
            size_t gl;
            struct grammar *g = compile(k->form, &t, msg, sizeof msg, &gl);
            printf("%-12s k=%-6ld refused: %s\n", k->name, n + 1, g ? "(accepted!)" : msg);
            grammar_free(g);
            kvb_buf_free(&t);
        }
    }
    return bad;
}
