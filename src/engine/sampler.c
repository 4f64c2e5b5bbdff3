/* sampler.c — next-token selection: penalties, temperature, top-k, top-p,
 * min-p and a seeded draw (see sampler.h for the contract).
 *
 * Everything here is deterministic by construction: the RNG is xoshiro256**
 * seeded through splitmix64 from params.seed, exponentials come from a
 * polynomial built only from IEEE basic operations (not libm, whose last bits
 * differ between platforms), orderings break ties by token id, and every sum
 * is taken in one fixed order. So the same logits, history and seed give the
 * same token on any machine.
 *
 * Speed matters because this runs once per generated token per request on a
 * single thread: a 49152-entry vocabulary must cost well under a millisecond.
 * Hence no full sort of the vocabulary, ever. Top-k keeps a k-entry heap;
 * top-p without top-k histograms the probability mass by logit into buckets,
 * finds the bucket where the cumulative mass crosses p, and sorts only that
 * bucket. The kept set is always a prefix of the vocabulary ordered by
 * (logit descending, id ascending), so it can be described by its last
 * member ("the cut") and the draw walks the vocabulary in id order without
 * materialising the set.
 *
 * A grammar (grammar.h) wraps the whole pipeline: draw, check, and only
 * when the token would break it, mask and draw again.
 *
 * Not here: beam search. */
#include "engine/sampler.h"
#include "base/rng.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "engine/grammar.h"

/* Bit-identical weights need a*b+c rounded twice, never fused. GCC keeps
 * them apart in ISO C mode (the build's -std=c11); Clang contracts within
 * an expression by default unless told otherwise. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The penalties look at the last SAMPLER_HISTORY accepted tokens: enough for
 * any ordinary completion (OpenAI semantics count the whole output), and a
 * fixed bound so accept() never allocates and the history's size does not
 * depend on the vocabulary. */
#define SAMPLER_HISTORY 4096
#define SAMPLER_HASH_BITS 13 /* 8192 slots: load factor <= 1/2 */
#define SAMPLER_HASH_CAP (1u << SAMPLER_HASH_BITS)

/* Buckets of the top-p histogram, spread over at most SAMPLER_BUCKET_RANGE
 * nats below the maximum scaled logit. Beyond ~64 nats a token's weight is
 * below 1e-27 of the top one's, so everything further down shares the last
 * bucket; only a top_p within 1e-20 of 1 would ever have to sort it. */
#define SAMPLER_BUCKETS 1024
#define SAMPLER_BUCKET_RANGE 64.0

/* Tokens per tile of the whole-vocabulary draw: weights are summed per tile,
 * then only the tile the draw lands in is walked token by token. */
#define SAMPLER_TILE 256

struct hist_slot {
    int32_t token; /* -1: empty */
    int32_t count; /* occurrences inside the history window, > 0 when used */
};

struct cand {
    float s; /* scaled logit */
    int32_t id;
    float e; /* exp(s - s_max), filled where needed */
};

struct sampler {
    struct sampler_params p;
    int32_t n_vocab;
    bool penalties; /* any penalty enabled: only then is history kept */
    uint64_t rng[4];

    int32_t *ring; /* (SAMPLER_HISTORY) accepted tokens, oldest at ring_pos once full */
    int32_t ring_len;
    int32_t ring_pos;
    struct hist_slot *slots; /* (SAMPLER_HASH_CAP) token -> count over the ring */

    struct cand *cand; /* (cand_cap) top-k heap, or the top-p crossing bucket */
    size_t cand_cap;
    float *wbuf;                             /* (n_vocab rounded up to VL) exp(s - s_max), made on first use */
    double *tile_sum;                        /* (n_vocab / SAMPLER_TILE rounded up) weight per tile */
    double bucket_mass[SAMPLER_BUCKETS + 1]; /* top-p histogram, + a spare for dropped tokens */
    int32_t bucket_count[SAMPLER_BUCKETS + 1];

    struct sampler_bias *bias;  /* (p.n_bias) a copy of the caller's */
    int32_t *ban;               /* (p.n_ban) a copy of the caller's */
    int64_t n_accepted;         /* tokens accepted since create or reset (for ban_until) */
    struct grammar_matcher *gm; /* with a grammar: the output so far (owned) */
    float *raw;                 /* with a grammar: (n_vocab) the logits as given, for a masked redraw */
};

/* ---- RNG --------------------------------------------------------------------- */

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    /* splitmix64 is a bijection of its counter, so the four words are never
     * all zero (the one state xoshiro cannot leave). */
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s[i] = kvb_splitmix64(&x);
}

/* ---- exp ------------------------------------------------------------------------ */

/* Four floats at a time through GCC/Clang vector extensions: 16-byte
 * vectors compile to SSE2 on any x86-64 (NEON on ARM) without a special
 * build flag, and every lane operation is an IEEE basic operation, so the
 * bits do not depend on the machine. (The build uses ISO C mode, where GCC
 * does not contract a*b+c into fma.) */
#define VL 4
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(16)));
typedef uint32_t vu __attribute__((vector_size(16)));
_Static_assert(SAMPLER_TILE % VL == 0, "tiles are whole vectors");

static inline vf vf_load(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline vf vf_splat(float x) { return (vf){x, x, x, x}; }

/* m ? a : b, lane by lane (m lanes are all-ones or zero). */
static inline vf vf_select(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }

/* e^x for lanes x <= 0: the Cephes expf range reduction and polynomial
 * (about 1 ulp), from basic operations only instead of libm, whose last bits
 * differ between platforms. x below -87 is taken as -87, so every finite
 * logit keeps a tiny positive weight; NaN stays NaN. */
static inline vf vf_exp(vf x)
{
    const vf magic = vf_splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    x = vf_select(x < -87.0f, vf_splat(-87.0f), x);
    vf big = x * 1.44269504088896341f + magic;
    vf k = big - magic;
    vu ki = (vu)big - (vu)magic; /* k as an integer in [-126, 0], wrapped */
    vf r = x - k * 0.693359375f; /* Cody-Waite: ln 2 in two parts */
    r = r - k * -2.12194440e-4f;
    vf p = vf_splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    return p * (vf)((ki + 127u) << 23); /* times 2^k */
}

/* The same function on one value (same lanes arithmetic, so same bits). */
static float exp1(float x) { return vf_exp(vf_splat(x))[0]; }
/* ---- history and penalties ----------------------------------------------------- */

static uint32_t hist_home(int32_t token) { return ((uint32_t)token * 2654435761u) >> (32 - SAMPLER_HASH_BITS); }

static void hist_inc(struct sampler *s, int32_t token)
{
    uint32_t i = hist_home(token);
    while (s->slots[i].token != -1 && s->slots[i].token != token) i = (i + 1) & (SAMPLER_HASH_CAP - 1);
    if (s->slots[i].token == -1) {
        s->slots[i].token = token;
        s->slots[i].count = 0;
    }
    s->slots[i].count++;
}

static void hist_dec(struct sampler *s, int32_t token)
{
    const uint32_t mask = SAMPLER_HASH_CAP - 1;
    uint32_t i = hist_home(token);
    while (s->slots[i].token != token) {
        if (s->slots[i].token == -1) return; /* not present: cannot happen */
        i = (i + 1) & mask;
    }
    if (--s->slots[i].count > 0) return;
    /* Backward-shift deletion keeps linear probing free of tombstones. */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (s->slots[j].token == -1) break;
        uint32_t k = hist_home(s->slots[j].token);
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        s->slots[i] = s->slots[j];
        i = j;
    }
    s->slots[i].token = -1;
    s->slots[i].count = 0;
}

static void apply_penalties(const struct sampler *s, float *logits)
{
    if (!s->penalties || s->ring_len == 0) return;
    const float rp = s->p.repetition_penalty;
    const float fp = s->p.frequency_penalty;
    const float pp = s->p.presence_penalty;
    for (uint32_t i = 0; i < SAMPLER_HASH_CAP; i++) {
        int32_t t = s->slots[i].token;
        if (t < 0) continue;
        float l = logits[t];
        if (rp != 1.0f) l = l > 0.0f ? l / rp : l * rp; /* CTRL: always toward "less likely" */
        l -= (float)s->slots[i].count * fp + pp;
        logits[t] = l;
    }
}

/* ---- lifecycle ------------------------------------------------------------------- */

static bool has_penalties(const struct sampler_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

bool sampler_is_greedy(const struct sampler_params *p)
{
    return p && p->temperature == 0.0f && !has_penalties(p) && !p->grammar && p->n_bias == 0 &&
           (p->n_ban == 0 || p->ban_until <= 0);
}

void sampler_params_default(struct sampler_params *p)
{
    if (!p) return;
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->grammar = NULL;
    p->gvocab = NULL;
    p->bias = NULL;
    p->n_bias = 0;
    p->ban = NULL;
    p->n_ban = 0;
    p->ban_until = 0;
}

enum kvb_status sampler_create(const struct sampler_params *p, int32_t n_vocab, struct sampler **out)
{
    KVB_RETURN_IF(!p || !out || n_vocab <= 0, KVB_ERR_INVALID_ARG);
    *out = NULL;
    KVB_RETURN_IF(!(p->temperature >= 0.0f) || isinf(p->temperature), KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(!(p->top_p > 0.0f && p->top_p <= 1.0f), KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(!(p->min_p >= 0.0f && p->min_p < 1.0f), KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty), KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty), KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(p->n_bias < 0 || (p->n_bias > 0 && !p->bias), KVB_ERR_INVALID_ARG);
    for (int32_t i = 0; i < p->n_bias; i++)
        KVB_RETURN_IF(p->bias[i].token < 0 || p->bias[i].token >= n_vocab || !isfinite(p->bias[i].value),
                      KVB_ERR_INVALID_ARG);
    KVB_RETURN_IF(p->n_ban < 0 || (p->n_ban > 0 && !p->ban), KVB_ERR_INVALID_ARG);
    for (int32_t i = 0; i < p->n_ban; i++) KVB_RETURN_IF(p->ban[i] < 0 || p->ban[i] >= n_vocab, KVB_ERR_INVALID_ARG);

    struct sampler *s = kvb_calloc(1, sizeof *s);
    KVB_RETURN_IF(!s, KVB_ERR_NOMEM);
    s->p = *p;
    s->n_vocab = n_vocab;
    s->tile_sum = kvb_malloc((size_t)((n_vocab + SAMPLER_TILE - 1) / SAMPLER_TILE) * sizeof *s->tile_sum);
    if (!s->tile_sum) {
        kvb_free(s);
        return KVB_ERR_NOMEM;
    }
    if (p->n_bias > 0) {
        s->bias = kvb_malloc(sizeof *s->bias * (size_t)p->n_bias);
        if (!s->bias) {
            sampler_free(s);
            return KVB_ERR_NOMEM;
        }
        memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
        s->p.bias = s->bias;
    }
    if (p->n_ban > 0) {
        s->ban = kvb_malloc(sizeof *s->ban * (size_t)p->n_ban);
        if (!s->ban) {
            sampler_free(s);
            return KVB_ERR_NOMEM;
        }
        memcpy(s->ban, p->ban, sizeof *s->ban * (size_t)p->n_ban);
        s->p.ban = s->ban;
    }
    if (p->grammar) {
        /* A tokenizer's vocabulary may be smaller than the logits (padding
         * rows, masked under a grammar), never larger. */
        const bool fits = p->gvocab && grammar_vocab_size(p->gvocab) <= n_vocab;
        s->raw = fits ? kvb_malloc(sizeof *s->raw * (size_t)n_vocab) : NULL;
        enum kvb_status st = !fits ? KVB_ERR_INVALID_ARG : !s->raw ? KVB_ERR_NOMEM : KVB_OK;
        if (st == KVB_OK) st = grammar_matcher_create(p->grammar, p->gvocab, &s->gm);
        if (st != KVB_OK) {
            sampler_free(s);
            return st;
        }
    }
    s->penalties = has_penalties(p);
    if (s->penalties) {
        s->ring = kvb_malloc(SAMPLER_HISTORY * sizeof *s->ring);
        s->slots = kvb_malloc(SAMPLER_HASH_CAP * sizeof *s->slots);
        if (!s->ring || !s->slots) {
            sampler_free(s);
            return KVB_ERR_NOMEM;
        }
    }
    sampler_reset(s);
    *out = s;
    return KVB_OK;
}

void sampler_free(struct sampler *s)
{
    if (!s) return;
    kvb_free(s->ring);
    kvb_free(s->slots);
    kvb_free(s->cand);
    kvb_free(s->tile_sum);
    kvb_free(s->wbuf);
    kvb_free(s->raw);
    grammar_matcher_free(s->gm);
    kvb_free(s->bias);
    kvb_free(s->ban);
    kvb_free(s);
}

void sampler_reset(struct sampler *s)
{
    if (!s) return;
    rng_seed(s->rng, s->p.seed);
    if (s->gm) grammar_matcher_reset(s->gm);
    s->n_accepted = 0;
    s->ring_len = 0;
    s->ring_pos = 0;
    if (s->slots)
        for (uint32_t i = 0; i < SAMPLER_HASH_CAP; i++) s->slots[i] = (struct hist_slot){-1, 0};
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (!s || token < 0 || token >= s->n_vocab) return;
    s->n_accepted++;
    if (s->gm) grammar_accept(s->gm, token);
    if (!s->penalties) return;
    if (s->ring_len == SAMPLER_HISTORY) hist_dec(s, s->ring[s->ring_pos]); /* the oldest token leaves the window */
    else s->ring_len++;
    s->ring[s->ring_pos] = token;
    s->ring_pos = (s->ring_pos + 1) % SAMPLER_HISTORY;
    hist_inc(s, token);
}

/* ---- selection ------------------------------------------------------------------- */

/* The one order every truncation uses: higher scaled logit first, then lower id. */
static inline bool better(float sa, int32_t ia, float sb, int32_t ib) { return sa > sb || (sa == sb && ia < ib); }

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->id == y->id) return 0;
    return better(x->s, x->id, y->s, y->id) ? -1 : 1;
}

static enum kvb_status cand_reserve(struct sampler *s, size_t n)
{
    if (n <= s->cand_cap) return KVB_OK;
    struct cand *c = kvb_realloc(s->cand, n * sizeof *c);
    KVB_RETURN_IF(!c, KVB_ERR_NOMEM);
    s->cand = c;
    s->cand_cap = n;
    return KVB_OK;
}

static enum kvb_status wbuf_reserve(struct sampler *s)
{
    if (s->wbuf) return KVB_OK;
    /* Rounded up to whole vectors: the last partial vector stores its padding. */
    s->wbuf = kvb_malloc(((size_t)s->n_vocab + VL - 1) / VL * VL * sizeof *s->wbuf);
    KVB_RETURN_IF(!s->wbuf, KVB_ERR_NOMEM);
    return KVB_OK;
}

/* x[i .. i+VL), with `fill` past the end n. */
static inline vf vf_load_tail(const float *x, int32_t i, int32_t n, float fill)
{
    if (i + VL <= n) return vf_load(x + i);
    float pad[VL];
    for (int32_t l = 0; l < VL; l++) pad[l] = i + l < n ? x[i + l] : fill;
    return vf_load(pad);
}

static inline double vf_sum(vf a)
{
    double sum = 0.0;
    for (int l = 0; l < VL; l++) sum += (double)a[l];
    return sum;
}

static inline int32_t tile_len(int32_t n, int32_t t)
{
    return n - t * SAMPLER_TILE < SAMPLER_TILE ? n - t * SAMPLER_TILE : SAMPLER_TILE;
}

/* Which tokens a draw over the whole vocabulary may return: weight > 0
 * (the logit is neither -inf nor NaN), weight >= min_p and, when has_cut,
 * not worse than (cut_s, cut_id). */
struct keep_rule {
    float min_p;
    bool has_cut;
    float cut_s;
    int32_t cut_id;
};

static inline vi keep_mask(const struct keep_rule *kr, vf v, vf w, vi idx)
{
    vi keep = (w > vf_splat(0.0f)) & (w >= vf_splat(kr->min_p));
    if (kr->has_cut) {
        vf cut = vf_splat(kr->cut_s);
        keep &= (v > cut) | ((v == cut) & (idx <= kr->cut_id));
    }
    return keep;
}

/* The same test on one token, for the walk inside a tile. */
static inline bool keep_one(const struct keep_rule *kr, float v, float w, int32_t i)
{
    if (!(w > 0.0f) || !(w >= kr->min_p)) return false;
    return !kr->has_cut || v > kr->cut_s || (v == kr->cut_s && i <= kr->cut_id);
}

/* wbuf[i] = exp(x[i] - smax), 0 for -inf and NaN logits; tile_sum[t] = the
 * weights of tile t; returns their total. The sums run in float lanes over
 * at most 64 values each (relative error near 1e-6), then in double. */
static double weigh_all(struct sampler *s, const float *x, float smax)
{
    const int32_t n = s->n_vocab, nt = (n + SAMPLER_TILE - 1) / SAMPLER_TILE;
    double total = 0.0;
    for (int32_t t = 0; t < nt; t++) {
        const int32_t end = t * SAMPLER_TILE + tile_len(n, t);
        vf acc = vf_splat(0.0f);
        for (int32_t i = t * SAMPLER_TILE; i < end; i += VL) {
            vf v = vf_load_tail(x, i, n, -INFINITY);
            vf w = vf_exp(v - smax);
            w = (vf)((vi)w & (v > vf_splat(-INFINITY)));
            memcpy(s->wbuf + i, &w, sizeof w);
            acc += w;
        }
        s->tile_sum[t] = vf_sum(acc);
        total += s->tile_sum[t];
    }
    return total;
}

/* Draws from the tokens the rule keeps, weight-proportionally, in id order:
 * tile sums first, then only the tile the draw lands in is walked token by
 * token. weigh_all has filled wbuf (and tile_sum, which is reused as is when
 * the rule keeps every token). */
static enum kvb_status draw_tiles(struct sampler *s, const float *x, const struct keep_rule *kr, double u, int32_t *out)
{
    const int32_t n = s->n_vocab, nt = (n + SAMPLER_TILE - 1) / SAMPLER_TILE;
    const vi iota = {0, 1, 2, 3};
    double w = 0.0;
    for (int32_t t = 0; t < nt; t++) {
        if (kr->has_cut || kr->min_p > 0.0f) {
            const int32_t end = t * SAMPLER_TILE + tile_len(n, t);
            vf acc = vf_splat(0.0f);
            for (int32_t i = t * SAMPLER_TILE; i < end; i += VL) {
                vf v = vf_load_tail(x, i, n, -INFINITY);
                vf e = vf_load(s->wbuf + i); /* padding lanes hold weight 0 */
                acc += (vf)((vi)e & keep_mask(kr, v, e, iota + i));
            }
            s->tile_sum[t] = vf_sum(acc);
        }
        w += s->tile_sum[t];
    }
    double r = u * w, cum = 0.0;
    int32_t pick = -1; /* the tile the draw lands in */
    for (int32_t t = 0; t < nt; t++) {
        if (!(s->tile_sum[t] > 0.0)) continue;
        pick = t;
        if (cum + s->tile_sum[t] > r) break;
        cum += s->tile_sum[t];
    }
    KVB_RETURN_IF(pick < 0, KVB_ERR_INTERNAL); /* the top token always weighs 1 */
    const int32_t base = pick * SAMPLER_TILE, end = base + tile_len(n, pick);
    int32_t last = -1;
    for (int32_t i = base; i < end; i++) {
        if (!keep_one(kr, x[i], s->wbuf[i], i)) continue;
        cum += (double)s->wbuf[i];
        last = i;
        if (cum > r) break;
    }
    /* Falling off the end means the token-by-token sum rounded below the
     * tile sum: the tile's last kept token takes that sliver. */
    KVB_RETURN_IF(last < 0, KVB_ERR_INTERNAL);
    *out = last;
    return KVB_OK;
}

/* Histogram bucket of scaled logits v: monotone (never smaller for a smaller
 * logit), the same bits however it is called. */
static inline vi bucket_of(vf v, float smax, float scale)
{
    vf bd = (vf_splat(smax) - v) * scale; /* >= 0; +inf or NaN for -inf or NaN logits */
    bd = vf_select(bd < (float)(SAMPLER_BUCKETS - 1), bd, vf_splat((float)(SAMPLER_BUCKETS - 1)));
    return __builtin_convertvector(bd, vi);
}

/* Top-p over the whole vocabulary: histogram the weights by logit into
 * buckets (a bucket before the crossing one is wholly kept, one after it
 * wholly dropped), then sort only the bucket where the cumulative weight
 * crosses top_p * total. Sets the cut in *kr. total: weigh_all's result. */
static enum kvb_status top_p_cut(struct sampler *s, const float *x, float smax, float smin, double total,
                                 struct keep_rule *kr)
{
    const int32_t n = s->n_vocab;
    float range = smax - smin;
    if (!(range <= (float)SAMPLER_BUCKET_RANGE)) range = (float)SAMPLER_BUCKET_RANGE;
    const float scale = range > 0.0f ? (float)SAMPLER_BUCKETS / range : 0.0f;
    const vf min_p = vf_splat(kr->min_p);
    memset(s->bucket_mass, 0, sizeof s->bucket_mass);
    memset(s->bucket_count, 0, sizeof s->bucket_count);

    /* Tokens min-p drops go to a spare bucket past the end. */
    const vi spare = {SAMPLER_BUCKETS, SAMPLER_BUCKETS, SAMPLER_BUCKETS, SAMPLER_BUCKETS};
    int32_t bidx[SAMPLER_TILE];
    for (int32_t base = 0; base < n; base += SAMPLER_TILE) {
        const int32_t m = n - base < SAMPLER_TILE ? n - base : SAMPLER_TILE;
        for (int32_t j = 0; j < m; j += VL) {
            vf v = vf_load_tail(x, base + j, n, -INFINITY);
            vf e = vf_load(s->wbuf + base + j);
            vi in = (e > vf_splat(0.0f)) & (e >= min_p);
            vi b = (bucket_of(v, smax, scale) & in) | (spare & ~in);
            memcpy(bidx + j, &b, sizeof b);
        }
        for (int32_t j = 0; j < m; j++) {
            s->bucket_mass[bidx[j]] += (double)s->wbuf[base + j];
            s->bucket_count[bidx[j]]++;
        }
    }
    const double target = (double)s->p.top_p * total;
    double cum = 0.0;
    int32_t bc = -1;
    for (int32_t b = 0; b < SAMPLER_BUCKETS; b++) {
        if (s->bucket_count[b] > 0 && cum + s->bucket_mass[b] >= target) {
            bc = b;
            break;
        }
        cum += s->bucket_mass[b];
    }
    if (bc < 0) return KVB_OK; /* min-p cuts deeper than top-p: min-p alone decides */

    const int32_t want = s->bucket_count[bc];
    KVB_FORWARD_IF_ERROR(cand_reserve(s, (size_t)want));
    struct cand *c = s->cand;
    int32_t m = 0;
    const vi bcv = {bc, bc, bc, bc};
    for (int32_t i = 0; i < n && m < want; i += VL) {
        vf v = vf_load_tail(x, i, n, -INFINITY);
        vf e = vf_load(s->wbuf + i);
        vi hit = (bucket_of(v, smax, scale) == bcv) & (e > vf_splat(0.0f)) & (e >= min_p);
        if (!(hit[0] | hit[1] | hit[2] | hit[3])) continue;
        for (int32_t l = 0; l < VL; l++)
            if (hit[l]) c[m++] = (struct cand){v[l], i + l, e[l]};
    }
    KVB_RETURN_IF(m != want, KVB_ERR_INTERNAL);
    qsort(c, (size_t)m, sizeof *c, cand_cmp);
    int32_t j = 0;
    for (; j < m; j++) {
        cum += (double)c[j].e;
        if (cum >= target) break;
    }
    if (j == m) j = m - 1; /* rounding: the bucket fell just short */
    kr->has_cut = true;
    kr->cut_s = c[j].s;
    kr->cut_id = c[j].id;
    return KVB_OK;
}

/* Min-heap on `better`: the worst of the k best sits at c[0]. */
static void heap_sift_down(struct cand *c, int32_t m, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && better(c[w].s, c[w].id, c[l].s, c[l].id)) w = l;
        if (r < m && better(c[w].s, c[w].id, c[r].s, c[r].id)) w = r;
        if (w == i) return;
        struct cand t = c[i];
        c[i] = c[w];
        c[w] = t;
        i = w;
    }
}

static void heap_sift_up(struct cand *c, int32_t i)
{
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!better(c[parent].s, c[parent].id, c[i].s, c[i].id)) return;
        struct cand t = c[i];
        c[i] = c[parent];
        c[parent] = t;
        i = parent;
    }
}

/* Top-k path: the k best through a heap (almost every token costs one
 * comparison with the heap's worst), sorted, then top-p and min-p on that
 * short list. */
static enum kvb_status sample_top_k(struct sampler *s, const float *logits, float smax, double u, int32_t *out)
{
    const int32_t k = s->p.top_k;
    KVB_FORWARD_IF_ERROR(cand_reserve(s, (size_t)k));
    struct cand *c = s->cand;
    int32_t m = 0;
    const int32_t n = s->n_vocab;
    float worst = -INFINITY; /* once the heap is full: the logit of its worst entry */
    for (int32_t i = 0; i < n; i += VL) {
        /* Almost every vector falls below the heap's worst and is skipped
         * in one comparison. */
        if (m == k && i + VL <= n) {
            vi ge = vf_load(logits + i) >= vf_splat(worst);
            if (!(ge[0] | ge[1] | ge[2] | ge[3])) continue;
        }
        for (int32_t j = i; j < i + VL && j < n; j++) {
            float v = logits[j];
            if (!(v > -INFINITY)) continue; /* -inf and NaN can never be drawn */
            if (m < k) {
                c[m] = (struct cand){v, j, 0.0f};
                heap_sift_up(c, m);
                m++;
            } else if (better(v, j, c[0].s, c[0].id)) {
                c[0] = (struct cand){v, j, 0.0f};
                heap_sift_down(c, m, 0);
            } else {
                continue;
            }
            if (m == k) worst = c[0].s;
        }
    }
    qsort(c, (size_t)m, sizeof *c, cand_cmp);

    double z = 0.0;
    for (int32_t j = 0; j < m; j++) {
        c[j].e = exp1(c[j].s - smax);
        z += (double)c[j].e;
    }
    int32_t keep = m;
    if (s->p.top_p < 1.0f) {
        double target = (double)s->p.top_p * z, cum = 0.0;
        for (int32_t j = 0; j < m; j++) {
            cum += (double)c[j].e;
            if (cum >= target) {
                keep = j + 1;
                break;
            }
        }
    }
    /* p_j >= min_p * p_max  <=>  e_j >= min_p, since the best weighs 1. */
    for (int32_t j = 1; j < keep; j++) {
        if (c[j].e < s->p.min_p) {
            keep = j;
            break;
        }
    }
    double w = 0.0;
    for (int32_t j = 0; j < keep; j++) w += (double)c[j].e;
    double r = u * w, cum = 0.0;
    for (int32_t j = 0; j < keep; j++) {
        cum += (double)c[j].e;
        if (cum > r) {
            *out = c[j].id;
            return KVB_OK;
        }
    }
    *out = c[keep - 1].id; /* u*w rounded up to the total */
    return KVB_OK;
}

/* Largest value that is not NaN (-inf when there is none) and, in *at, the
 * lowest index holding it. Four independent vector accumulators, so the
 * compare-and-select chains overlap. */
static float argmax_finite(const float *x, int32_t n, int32_t *at)
{
    const vi step = {VL, VL, VL, VL};
    vf m[4];
    vi mi[4], idx[4];
    for (int a = 0; a < 4; a++) {
        m[a] = vf_splat(-INFINITY);
        mi[a] = (vi){-1, -1, -1, -1};
        idx[a] = (vi){0, 1, 2, 3} + a * VL;
    }
    int32_t i = 0;
    for (; i + 4 * VL <= n; i += 4 * VL) {
        for (int a = 0; a < 4; a++) {
            vf v = vf_load(x + i + a * VL);
            vi gt = v > m[a]; /* strict: the earlier index keeps a tie; NaN never wins */
            m[a] = vf_select(gt, v, m[a]);
            mi[a] = (gt & idx[a]) | (~gt & mi[a]);
            idx[a] += 4 * step;
        }
    }
    float best = -INFINITY;
    int32_t best_i = -1;
    for (int a = 0; a < 4; a++) {
        for (int l = 0; l < VL; l++) {
            if (mi[a][l] < 0) continue;
            if (m[a][l] > best || (m[a][l] == best && mi[a][l] < best_i)) {
                best = m[a][l];
                best_i = mi[a][l];
            }
        }
    }
    for (; i < n; i++) { /* the tail comes after every vector index */
        if (x[i] > best) {
            best = x[i];
            best_i = i;
        }
    }
    *at = best_i;
    return best;
}

/* Divides by the temperature in place; returns the max and (in *smin) the
 * min over logits above -inf, both ignoring NaN. */
static float scale_logits(float *x, int32_t n, float t, float *smin)
{
    const vf ninf = vf_splat(-INFINITY);
    vf mx[2] = {ninf, ninf}, mn[2] = {vf_splat(INFINITY), vf_splat(INFINITY)};
    int32_t i = 0;
    for (; i + 2 * VL <= n; i += 2 * VL) {
        for (int a = 0; a < 2; a++) {
            vf v = vf_load(x + i + a * VL);
            if (t != 1.0f) {
                v = v / t;
                memcpy(x + i + a * VL, &v, sizeof v);
            }
            mx[a] = vf_select(v > mx[a], v, mx[a]);
            mn[a] = vf_select((v < mn[a]) & (v > ninf), v, mn[a]);
        }
    }
    float hi = -INFINITY, lo = INFINITY;
    for (int a = 0; a < 2; a++) {
        for (int l = 0; l < VL; l++) {
            if (mx[a][l] > hi) hi = mx[a][l];
            if (mn[a][l] < lo) lo = mn[a][l];
        }
    }
    for (; i < n; i++) {
        if (t != 1.0f) x[i] = x[i] / t;
        if (x[i] > hi) hi = x[i];
        if (x[i] < lo && x[i] > -INFINITY) lo = x[i];
    }
    *smin = lo;
    return hi;
}

static enum kvb_status sample_free(struct sampler *s, float *logits, int32_t *out_token);

enum kvb_status sampler_sample(struct sampler *s, float *logits, int32_t *out_token)
{
    KVB_RETURN_IF(!s || !logits || !out_token, KVB_ERR_INVALID_ARG);
    if (s->n_accepted < s->p.ban_until)
        for (int32_t i = 0; i < s->p.n_ban; i++) logits[s->ban[i]] = -INFINITY;
    if (!s->gm) return sample_free(s, logits, out_token);
    const int32_t n = s->n_vocab;
    memcpy(s->raw, logits, sizeof *logits * (size_t)n);
    enum kvb_status st = sample_free(s, logits, out_token);
    if (st == KVB_OK && grammar_allows(s->gm, *out_token)) return KVB_OK;
    memcpy(logits, s->raw, sizeof *logits * (size_t)n);
    for (int32_t i = grammar_vocab_size(s->p.gvocab); i < n; i++) logits[i] = -INFINITY; /* padding rows */
    /* Some token is mostly allowed (a byte-level vocabulary has every
     * byte; the end of generation once the grammar is complete). Were
     * none, or none left with a weight (min_tokens bans the end of
     * generation that a complete grammar allows alone), ending the output
     * beats a token that breaks the grammar. */
    bool any = grammar_mask(s->gm, logits) > 0;
    if (any) {
        any = false;
        for (int32_t i = 0; i < n && !any; i++) any = logits[i] > -INFINITY;
    }
    if (!any) {
        *out_token = grammar_vocab_eog(s->p.gvocab);
        return KVB_OK;
    }
    return sample_free(s, logits, out_token);
}

/* The pipeline of sampler.h without a grammar. */
static enum kvb_status sample_free(struct sampler *s, float *logits, int32_t *out_token)
{
    const int32_t n = s->n_vocab;
    for (int32_t i = 0; i < s->p.n_bias; i++) logits[s->bias[i].token] += s->bias[i].value;
    apply_penalties(s, logits);

    if (s->p.temperature == 0.0f) return sampler_greedy(logits, n, out_token);

    /* One uniform per non-greedy call, whatever path follows, so the random
     * stream of a request does not depend on how its truncation played out. */
    const double u = rng_uniform(s->rng);

    float smin;
    const float smax = scale_logits(logits, n, s->p.temperature, &smin);
    KVB_RETURN_IF(!(smax > -INFINITY), KVB_ERR_INVALID_ARG);
    if (smax == INFINITY) {
        /* An infinite logit is a point mass; the lowest such id, as in greedy. */
        for (int32_t i = 0; i < n; i++) {
            if (logits[i] == INFINITY) {
                *out_token = i;
                return KVB_OK;
            }
        }
    }

    if (s->p.top_k > 0 && s->p.top_k < n) return sample_top_k(s, logits, smax, u, out_token);
    KVB_FORWARD_IF_ERROR(wbuf_reserve(s));
    const double total = weigh_all(s, logits, smax);
    struct keep_rule kr = {s->p.min_p, false, 0.0f, 0};
    if (s->p.top_p < 1.0f) KVB_FORWARD_IF_ERROR(top_p_cut(s, logits, smax, smin, total, &kr));
    return draw_tiles(s, logits, &kr, u, out_token);
}

int32_t sampler_first_nonfinite(const float *logits, int32_t n_vocab)
{
    /* Four lanes at a time: x - x is 0 for every finite x and NaN for NaN
     * and both infinities, so one compare per vector finds them all. */
    int32_t i = 0;
    for (; i + VL <= n_vocab; i += VL) {
        const vf x = vf_load(logits + i);
        const vi ok = (x - x) == vf_splat(0.0f);
        if (!(ok[0] & ok[1] & ok[2] & ok[3])) break;
    }
    for (; i < n_vocab; i++)
        if (!isfinite(logits[i])) return i;
    return -1;
}

enum kvb_status sampler_greedy(const float *logits, int32_t n_vocab, int32_t *out_token)
{
    KVB_RETURN_IF(!logits || n_vocab <= 0 || !out_token, KVB_ERR_INVALID_ARG);
    int32_t best;
    const float mx = argmax_finite(logits, n_vocab, &best);
    *out_token = mx > -INFINITY ? best : -1;
    return mx > -INFINITY ? KVB_OK : KVB_ERR_INVALID_ARG; /* nothing can be chosen */
}

float sampler_logprob(const float *logits, int32_t n_vocab, int32_t token)
{
    if (!logits || n_vocab <= 0 || token < 0 || token >= n_vocab) return NAN;
    const float lt = logits[token];
    if (isnan(lt)) return NAN;
    if (lt == -INFINITY) return -INFINITY;
    int32_t at;
    const float mx = argmax_finite(logits, n_vocab, &at);
    if (mx == INFINITY) {
        /* The probability is shared evenly by the infinite logits. */
        if (lt != INFINITY) return -INFINITY;
        int32_t c = 0;
        for (int32_t i = 0; i < n_vocab; i++) c += logits[i] == INFINITY;
        return (float)-log((double)c);
    }
    /* Subtracting the max keeps every term in (0, 1], so nothing overflows
     * and the sum is at least 1. */
    double sum = 0.0;
    for (int32_t base = 0; base < n_vocab; base += SAMPLER_TILE) {
        const int32_t end = base + tile_len(n_vocab, base / SAMPLER_TILE);
        vf acc = vf_splat(0.0f);
        for (int32_t i = base; i < end; i += VL) {
            vf v = vf_load_tail(logits, i, n_vocab, -INFINITY);
            acc += (vf)((vi)vf_exp(v - mx) & (v > vf_splat(-INFINITY)));
        }
        sum += vf_sum(acc);
    }
    return (float)(((double)lt - (double)mx) - log(sum));
}
