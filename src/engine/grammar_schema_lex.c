/* grammar_schema_lex.c — the terminals of the schema grammars: JSON mode's
 * whitespace, strings, numbers, integer and number ranges as digit
 * grammars, the formats as regexes, literal values, and free values with a
 * nesting budget (grammar_schema.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar_schema.h"
#include "engine/grammar_schema_int.h"

int gs_fail(struct gs *g, const char *path, const char *fmt, ...)
{
    if (g->err_path && g->path_cap) snprintf(g->err_path, g->path_cap, "%s", path);
    if (g->msg && g->msg_cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->msg, g->msg_cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int gs_nomem(struct gs *g)
{
    g->oom = true;
    return -1;
}

static bool put_n(struct gs *g, struct kvb_buf *b, const char *s, size_t n)
{
    if (kvb_buf_reserve(b, n + 1) != KVB_OK) {
        g->oom = true;
        return false;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

bool gs_put(struct gs *g, struct kvb_buf *b, const char *s) { return put_n(g, b, s, strlen(s)); }

bool gs_putf(struct gs *g, struct kvb_buf *b, const char *fmt, ...)
{
    char t[512];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < sizeof t && put_n(g, b, t, (size_t)n);
}

bool gs_put_lit(struct gs *g, struct kvb_buf *b, const char *s, size_t n)
{
    bool ok = gs_put(g, b, "\"");
    for (size_t i = 0; ok && i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') ok = gs_putf(g, b, "\\%c", c);
        else if (c < 0x20 || c == 0x7F) ok = gs_putf(g, b, "\\x%02X", c);
        else ok = put_n(g, b, (const char *)&c, 1);
    }
    return ok && gs_put(g, b, "\"");
}

int32_t gs_new_id(struct gs *g) { return g->next_id++; }

int gs_rule(struct gs *g, const char *name, const struct kvb_buf *body, const char *path)
{
    if (g->out->len + body->len + strlen(name) + 8 > GSCHEMA_MAX_BYTES)
        return gs_fail(g, path, "field '%s': the schema's grammar would exceed %u MiB", path, GSCHEMA_MAX_BYTES >> 20);
    if (!gs_put(g, g->out, name) || !gs_put(g, g->out, " ::= ") || !put_n(g, g->out, body->data, body->len) ||
        !gs_put(g, g->out, "\n"))
        return -1;
    return 0;
}

static bool rule_text(struct gs *g, const char *text) { return gs_put(g, g->out, text); }

/* ---- shared rules ------------------------------------------------------------------------ */

bool gs_need_ws(struct gs *g)
{
    if (g->have_ws) return true;
    g->have_ws = true;
    /* ws-K: K bytes left, no newline yet; after the newline only spaces and tabs */
    bool ok =
        gs_putf(g, g->out, "ws ::= ([ \\t] ws-%d | \"\\n\" [ \\t]{0,%d})?\n", GSCHEMA_MAX_WS - 1, GSCHEMA_MAX_WS - 1);
    for (int k = GSCHEMA_MAX_WS - 1; ok && k >= 2; k--)
        ok = gs_putf(g, g->out, "ws-%d ::= ([ \\t] ws-%d | \"\\n\" [ \\t]{0,%d})?\n", k, k - 1, k - 1);
    return ok && rule_text(g, "ws-1 ::= [ \\t\\n]?\n");
}

bool gs_need_str(struct gs *g)
{
    if (g->have_str) return true;
    g->have_str = true;
    return rule_text(g, "str ::= \"\\\"\" chr* \"\\\"\"\n"
                        "chr ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n");
}

bool gs_need_lchr(struct gs *g)
{
    if (g->have_lstr) return true;
    g->have_lstr = true;
    /* one character of the decoded string: \u escapes name characters,
     * a surrogate pair one character */
    return rule_text(g, "lchr ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
                        "([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "
                        "\"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2}))\n");
}

bool gs_need_int(struct gs *g)
{
    if (g->have_int) return true;
    g->have_int = true;
    return rule_text(g, "int ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n");
}

bool gs_need_num(struct gs *g)
{
    if (g->have_num) return true;
    g->have_num = true;
    return rule_text(g, "num ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+-]? [0-9]+)?\n");
}

bool gs_need_keyrest(struct gs *g)
{
    if (g->have_keyrest) return true;
    g->have_keyrest = true;
    return gs_need_str(g) && rule_text(g, "krest ::= chr* \"\\\"\"\n");
}

bool gs_need_any(struct gs *g, int budget, char *name)
{
    if (budget < 0) budget = 0;
    if (budget > GSCHEMA_MAX_DEPTH) budget = GSCHEMA_MAX_DEPTH;
    snprintf(name, 16, "jv%d", budget);
    if (g->have_any[budget]) return true;
    g->have_any[budget] = true;
    if (!gs_need_str(g) || !gs_need_num(g)) return false;
    if (budget == 0) return rule_text(g, "jv0 ::= str | num | \"true\" | \"false\" | \"null\"\n");
    char inner[16];
    if (!gs_need_any(g, budget - 1, inner) || !gs_need_ws(g)) return false;
    return gs_putf(g, g->out, "jv%d ::= jo%d | ja%d | str | num | \"true\" | \"false\" | \"null\"\n", budget, budget,
                   budget) &&
           gs_putf(g, g->out,
                   "jo%d ::= \"{\" ws (\"}\" | str \":\" \" \"? %s (ws \",\" ws str \":\" \" \"? %s)* ws \"}\")\n",
                   budget, inner, inner) &&
           gs_putf(g, g->out, "ja%d ::= \"[\" ws (\"]\" | %s (ws \",\" ws %s)* ws \"]\")\n", budget, inner, inner);
}

/* ---- integer ranges ---------------------------------------------------------------------- */

/* n-digit strings between a and z (a <= z, same length; leading zeros are the caller's). */
static bool digits_range(struct gs *g, struct kvb_buf *b, const char *a, const char *z, int n)
{
    if (n == 0) return true;
    bool a0 = true, z9 = true;
    for (int i = 1; i < n; i++) {
        a0 &= a[i] == '0';
        z9 &= z[i] == '9';
    }
    if (a[0] == z[0]) {
        if (!gs_putf(g, b, "\"%c\"", a[0])) return false;
        if (n == 1) return true;
        return gs_put(g, b, " ") && digits_range(g, b, a + 1, z + 1, n - 1);
    }
    if (a0 && z9) return gs_putf(g, b, "[%c-%c]", a[0], z[0]) && (n == 1 || gs_putf(g, b, " [0-9]{%d}", n - 1));
    const char lo = a0 ? a[0] : (char)(a[0] + 1), hi = z9 ? z[0] : (char)(z[0] - 1);
    bool ok = gs_put(g, b, "(");
    int alts = 0;
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    if (!a0) {
        ok = ok && gs_putf(g, b, "\"%c\" ", a[0]) && digits_range(g, b, a + 1, nines, n - 1);
        alts++;
    }
    if (lo <= hi) {
        ok = ok && (alts == 0 || gs_put(g, b, " | ")) && gs_putf(g, b, "[%c-%c]", lo, hi) &&
             (n == 1 || gs_putf(g, b, " [0-9]{%d}", n - 1));
        alts++;
    }
    if (!z9) {
        ok = ok && (alts == 0 || gs_put(g, b, " | ")) && gs_putf(g, b, "\"%c\" ", z[0]) &&
             digits_range(g, b, zeros, z + 1, n - 1);
    }
    return ok && gs_put(g, b, ")");
}

static int n_digits(uint64_t v)
{
    int d = 1;
    while (v >= 10) v /= 10, d++;
    return d;
}

/* Decimal numbers without leading zeros, lo..hi (hi UINT64_MAX: unbounded). */
static bool uint_range(struct gs *g, struct kvb_buf *b, uint64_t lo, uint64_t hi)
{
    const bool unbounded = hi == UINT64_MAX;
    const int d0 = n_digits(lo), d1 = unbounded ? d0 : n_digits(hi);
    bool ok = gs_put(g, b, "(");
    int alts = 0;
    uint64_t p = 1;
    for (int i = 1; i < d0; i++) p *= 10;
    for (int d = d0; ok && d <= d1; d++, p *= 10) {
        const uint64_t first = d == 1 ? 0 : p, last = p * 10 - 1;
        const uint64_t a = lo > first ? lo : first, z = unbounded || hi > last ? last : hi;
        if (a > z) continue;
        char as[24], zs[24];
        snprintf(as, sizeof as, "%0*" PRIu64, d, a);
        snprintf(zs, sizeof zs, "%0*" PRIu64, d, z);
        ok = (alts == 0 || gs_put(g, b, " | ")) && digits_range(g, b, as, zs, d);
        alts++;
    }
    if (ok && unbounded) ok = (alts == 0 || gs_put(g, b, " | ")) && gs_putf(g, b, "[1-9] [0-9]{%d,}", d0);
    return ok && gs_put(g, b, ")");
}

bool gs_int_range(struct gs *g, struct kvb_buf *b, bool has_lo, int64_t lo, bool has_hi, int64_t hi)
{
    bool ok = gs_put(g, b, "(");
    int alts = 0;
    if (!has_hi || hi >= 0) {
        ok = ok && uint_range(g, b, has_lo && lo > 0 ? (uint64_t)lo : 0, has_hi ? (uint64_t)hi : UINT64_MAX);
        alts++;
    }
    if (!has_lo || lo < 0) { /* negative: "-" and the magnitude (never -0) */
        const uint64_t mlo = has_hi && hi < 0 ? (uint64_t)-hi : 1, mhi = has_lo ? (uint64_t)-lo : UINT64_MAX;
        ok = ok && (alts == 0 || gs_put(g, b, " | ")) && gs_put(g, b, "\"-\" ") && uint_range(g, b, mlo, mhi);
    }
    return ok && gs_put(g, b, ")");
}

bool gs_dec_parse(const char *s, size_t n, struct gs_dec *d)
{
    memset(d, 0, sizeof *d);
    char dig[96];
    size_t nd = 0, i = 0;
    long point = -1, exp = 0;
    if (i < n && s[i] == '-') d->neg = true, i++;
    for (; i < n && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.'); i++) {
        if (s[i] == '.') point = (long)nd;
        else if (nd < sizeof dig) dig[nd++] = s[i];
        else return false;
    }
    if (point < 0) point = (long)nd;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        char *end;
        char t[32];
        snprintf(t, sizeof t, "%.*s", (int)(n - i - 1 < 30 ? n - i - 1 : 30), s + i + 1);
        exp = strtol(t, &end, 10);
        if (exp < -60 || exp > 60) return false;
    }
    point += exp;
    /* integer part: dig[0 .. point), fraction: dig[point ..) (zeros outside) */
    uint64_t ip = 0;
    for (long k = 0; k < point; k++) {
        const int v = k < (long)nd ? dig[k] - '0' : 0;
        if (ip > (UINT64_C(1) << 60) / 10) return false;
        ip = ip * 10 + (uint64_t)v;
    }
    size_t w = 0;
    for (long k = point < 0 ? point : point; k < (long)nd; k++) {
        if (w + 1 >= sizeof d->fd) return false;
        d->fd[w++] = k < 0 ? '0' : dig[k];
    }
    while (w && d->fd[w - 1] == '0') w--;
    d->fd[w] = '\0';
    d->ip = ip;
    if (d->ip == 0 && w == 0) d->neg = false; /* -0 is 0 */
    return true;
}

static bool dec_zero(const struct gs_dec *d) { return d->ip == 0 && !d->fd[0]; }

/* The digits D of a fraction with some bounds still tied (lact: D must
 * not fall below lo's remaining digits; hact: not above hi's; a bound's
 * digits run out into zeros). need_digit: at least one digit. Writes the
 * expression and returns true, or false (nothing written) when no D fits. */
static bool frac_rest(struct gs *g, struct kvb_buf *b, const char *lo, bool lo_ex, bool lact, const char *hi,
                      bool hi_ex, bool hact, bool need_digit)
{
    const bool lo_end = !lact || !*lo, hi_end = !hact || !*hi;
    if (lo_end && hi_end) { /* both run out (or released): the rest is one of a few forms */
        const bool ls = lact && lo_ex, hs = hact && hi_ex;
        if (hs || (ls && hact)) return false;
        if (ls) return gs_put(g, b, "\"0\"* [1-9] [0-9]*");
        if (hact) return gs_put(g, b, need_digit ? "\"0\"+" : "\"0\"*");
        return gs_put(g, b, need_digit ? "[0-9]+" : "[0-9]*");
    }
    const bool eps_ok = !need_digit && (!lact || (!*lo && !lo_ex)) && (!hact || *hi || !hi_ex);
    struct kvb_buf alts = {0};
    int n_alts = 0;
    bool ok = true, done[10] = {false};
    for (int d0 = 0; ok && d0 < 10; d0++) {
        if (done[d0]) continue;
        /* the state after digit d: bounds still tied, or the digit is out */
        int key[10];
        for (int d = 0; d < 10; d++) {
            const int l = lact ? (*lo ? *lo - '0' : 0) : -1, h = hact ? (*hi ? *hi - '0' : 0) : 10;
            key[d] = d < l || d > h ? -1 : (d == l) * 1 + (d == h) * 2;
        }
        if (key[d0] < 0) {
            done[d0] = true;
            continue;
        }
        char cls[24];
        size_t w = 0;
        cls[w++] = '[';
        for (int d = d0; d < 10; d++)
            if (!done[d] && key[d] == key[d0]) cls[w++] = (char)('0' + d), done[d] = true;
        cls[w++] = ']';
        cls[w] = '\0';
        const bool nl = key[d0] & 1, nh = (key[d0] & 2) != 0;
        struct kvb_buf r = {0};
        if (frac_rest(g, &r, nl && *lo ? lo + 1 : lo, lo_ex, nl, nh && *hi ? hi + 1 : hi, hi_ex, nh, false)) {
            ok = (n_alts == 0 || gs_put(g, &alts, " | ")) && gs_put(g, &alts, cls) && gs_put(g, &alts, " (") &&
                 put_n(g, &alts, r.data ? r.data : "", r.len) && gs_put(g, &alts, ")");
            n_alts++;
        }
        kvb_buf_free(&r);
    }
    if (ok && n_alts == 0 && !eps_ok) {
        kvb_buf_free(&alts);
        return false;
    }
    if (n_alts == 0) ok = ok && gs_put(g, b, "\"\"");
    else ok = ok && gs_put(g, b, eps_ok ? "(\"\" | " : "(") && put_n(g, b, alts.data, alts.len) && gs_put(g, b, ")");
    kvb_buf_free(&alts);
    return ok;
}

/* The fraction after integer part I: ("." digits)? between lo (NULL: none)
 * and hi (NULL: none). False (nothing written) when none fits. */
static bool frac(struct gs *g, struct kvb_buf *b, const char *lo, bool lo_ex, const char *hi, bool hi_ex, bool *ok)
{
    const bool lact = lo != NULL, hact = hi != NULL;
    const bool absent_ok = (!lact || (!*lo && !lo_ex)) && (!hact || *hi || !hi_ex);
    struct kvb_buf r = {0};
    const bool digits = frac_rest(g, &r, lact ? lo : "", lo_ex, lact, hact ? hi : "", hi_ex, hact, true);
    if (!digits && !absent_ok) {
        kvb_buf_free(&r);
        return false;
    }
    if (digits)
        *ok = *ok && gs_put(g, b, absent_ok ? "(\".\" (" : "\".\" (") && put_n(g, b, r.data, r.len) &&
              gs_put(g, b, absent_ok ? "))?" : ")");
    kvb_buf_free(&r);
    return true;
}

/* Non-negative decimals I(.F)? between a and b (b_inf: no upper bound). */
static bool pos_range(struct gs *g, struct kvb_buf *x, const struct gs_dec *a, bool a_ex, bool b_inf,
                      const struct gs_dec *b, bool b_ex, int *alts)
{
    bool ok = true;
    struct kvb_buf t = {0};
    if (!b_inf && a->ip == b->ip) {
        ok = gs_putf(g, &t, "\"%" PRIu64 "\" ", a->ip);
        if (frac(g, &t, a->fd, a_ex, b->fd, b_ex, &ok)) {
            ok = ok && (*alts == 0 || gs_put(g, x, " | ")) && put_n(g, x, t.data, t.len);
            (*alts)++;
        }
        kvb_buf_free(&t);
        return ok;
    }
    ok = gs_putf(g, &t, "\"%" PRIu64 "\" ", a->ip);
    if (frac(g, &t, a->fd, a_ex, NULL, false, &ok)) {
        ok = ok && (*alts == 0 || gs_put(g, x, " | ")) && put_n(g, x, t.data, t.len);
        (*alts)++;
    }
    t.len = 0;
    if (b_inf || b->ip > a->ip + 1) {
        ok = ok && (*alts == 0 || gs_put(g, x, " | ")) && uint_range(g, x, a->ip + 1, b_inf ? UINT64_MAX : b->ip - 1) &&
             gs_put(g, x, " (\".\" [0-9]+)?");
        (*alts)++;
    }
    if (!b_inf) {
        ok = ok && gs_putf(g, &t, "\"%" PRIu64 "\" ", b->ip);
        if (frac(g, &t, NULL, false, b->fd, b_ex, &ok)) {
            ok = ok && (*alts == 0 || gs_put(g, x, " | ")) && put_n(g, x, t.data, t.len);
            (*alts)++;
        }
    }
    kvb_buf_free(&t);
    return ok;
}

bool gs_num_range(struct gs *g, struct kvb_buf *b, const struct gs_dec *lo, bool lo_ex, const struct gs_dec *hi,
                  bool hi_ex)
{
    bool ok = gs_put(g, b, "(");
    int alts = 0;
    static const struct gs_dec zero = {0};
    const bool hi_neg = hi && hi->neg && !dec_zero(hi), lo_neg = lo && lo->neg && !dec_zero(lo);
    if (!hi_neg && !(hi && dec_zero(hi) && hi_ex)) { /* x >= 0 */
        const bool from_lo = lo && !lo_neg;
        ok = ok && pos_range(g, b, from_lo ? lo : &zero, from_lo && lo_ex, hi == NULL, hi ? hi : &zero, hi_ex, &alts);
    }
    if (!lo || lo_neg) { /* x = -m, m > 0 */
        struct kvb_buf t = {0};
        int talts = 0;
        ok = ok &&
             pos_range(g, &t, hi_neg ? hi : &zero, hi_neg ? hi_ex : true, lo == NULL, lo ? lo : &zero, lo_ex, &talts);
        if (ok && talts) {
            ok = (alts == 0 || gs_put(g, b, " | ")) && gs_put(g, b, "\"-\" (") && put_n(g, b, t.data, t.len) &&
                 gs_put(g, b, ")");
            alts++;
        }
        kvb_buf_free(&t);
    }
    if (ok && alts == 0) ok = gs_put(g, b, "\"\"");
    return ok && gs_put(g, b, ")");
}

/* ---- formats ------------------------------------------------------------------------------- */

#define YEAR "(?:[1-9]\\d{3}|0[1-9]\\d\\d|00[1-9]\\d|000[1-9])"
#define LEAP "(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
#define DATE                                                                                                           \
    "(?:" YEAR                                                                                                         \
    "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|"           \
    "2[0-8]))|" LEAP "-02-29)"
#define TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define IPV4 OCTET "\\." OCTET "\\." OCTET "\\." OCTET
#define H16 "[0-9a-fA-F]{1,4}"
#define IPV6                                                                                                           \
    "(?:(?:" H16 ":){7}" H16 "|(?:" H16 ":){1,7}:|(?:" H16 ":){1,6}:" H16 "|(?:" H16 ":){1,5}(?::" H16                 \
    "){1,2}|(?:" H16 ":){1,4}(?::" H16 "){1,3}|(?:" H16 ":){1,3}(?::" H16 "){1,4}|(?:" H16 ":){1,2}(?::" H16           \
    "){1,5}|" H16 ":(?::" H16 "){1,6}|:(?:(?::" H16 "){1,7}|:)|(?:" H16 ":){6}" IPV4 "|::(?:[fF]{4}:)?" IPV4 ")"

static const struct {
    const char *name, *re;
} formats[] = {
    {"date", "^" DATE "$"},
    {"time", "^" TIME "$"},
    {"date-time", "^" DATE "T" TIME "$"},
    {"email",
     "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[A-Za-z0-9]+(?:-+[A-Za-z0-9]+)*"
     "\\.)+[A-Za-z]{2,}$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9._~:/?#\\[\\]@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})+$"},
    {"ipv4", "^" IPV4 "$"},
    {"ipv6", "^" IPV6 "$"},
};

const char *gs_format_regex(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (strlen(formats[i].name) == n && memcmp(formats[i].name, name, n) == 0) return formats[i].re;
    return NULL;
}

/* ---- literal values (enum, const) ------------------------------------------------------- */

bool gs_put_value_lit(struct gs *g, struct kvb_buf *b, int i)
{
    const struct json_doc *j = g->j;
    const jsmntok_t *t = &j->tok[i];
    switch (json_kind(j, i)) {
    case JSON_STRING: {
        /* as written; and where the schema escapes, also as json_put_string
         * writes the same string (raw UTF-8), the form a model writes */
        const char *raw = j->src + t->start - 1;
        const size_t n = (size_t)(t->end - t->start) + 2;
        if (!memchr(raw, '\\', n)) return gs_put_lit(g, b, raw, n);
        char *dec = NULL;
        size_t dn = 0;
        struct kvb_buf canon = {0};
        if (json_str_dup(j, i, &dec, &dn) != KVB_OK || json_put_string(&canon, dec, dn) != KVB_OK) {
            kvb_free(dec);
            kvb_buf_free(&canon);
            g->oom = true;
            return false;
        }
        kvb_free(dec);
        bool ok;
        if (canon.len == n && memcmp(canon.data, raw, n) == 0) ok = gs_put_lit(g, b, raw, n);
        else
            ok = gs_put(g, b, "(") && gs_put_lit(g, b, raw, n) && gs_put(g, b, " | ") &&
                 gs_put_lit(g, b, canon.data, canon.len) && gs_put(g, b, ")");
        kvb_buf_free(&canon);
        return ok;
    }
    case JSON_OBJECT:
    case JSON_ARRAY: {
        const bool obj = json_kind(j, i) == JSON_OBJECT;
        if (!gs_need_ws(g)) return false;
        bool ok = gs_put(g, b, obj ? "(\"{\" ws " : "(\"[\" ws ");
        int k = i + 1;
        for (int m = 0; ok && m < t->size; m++) {
            if (m) ok = gs_put(g, b, " ws \",\" ws ");
            if (obj) {
                const jsmntok_t *kt = &j->tok[k];
                ok = ok && gs_put_lit(g, b, j->src + kt->start - 1, (size_t)(kt->end - kt->start) + 2) &&
                     gs_put(g, b, " \":\" \" \"? ");
                k++;
            }
            ok = ok && gs_put_value_lit(g, b, k);
            k = json_skip(j, k);
        }
        return ok && gs_put(g, b, obj ? (t->size ? " ws \"}\")" : "\"}\")") : (t->size ? " ws \"]\")" : "\"]\")"));
    }
    default: return gs_put_lit(g, b, j->src + t->start, (size_t)(t->end - t->start));
    }
}
