/* job_shard.c — the shard assignment of a job (see job_shard.h). */
#include "jobs/job_shard.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"

void shard_hash_prompt(const int32_t *tokens, int64_t n, struct shard_item *item)
{
    uint64_t h = 0x6b76626174636821ull; /* any fixed seed: every shard computes the same */
    int32_t k = 0;
    for (int64_t at = 0; at < n && k < SHARD_MAX_BLOCKS; at += SHARD_BLOCK) {
        const int64_t len = n - at < SHARD_BLOCK ? n - at : SHARD_BLOCK;
        h = XXH3_64bits_withSeed(tokens + at, sizeof(int32_t) * (size_t)len, h);
        item->hash[k++] = h;
    }
    item->n_hash = k;
}

/* qsort has no context argument: the items being sorted, set for the call. */
static _Thread_local const struct shard_item *sort_items;

static int cmp_prompts(const void *pa, const void *pb)
{
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    const struct shard_item *x = &sort_items[a], *y = &sort_items[b];
    const int32_t n = x->n_hash < y->n_hash ? x->n_hash : y->n_hash;
    for (int32_t i = 0; i < n; i++)
        if (x->hash[i] != y->hash[i]) return x->hash[i] < y->hash[i] ? -1 : 1;
    if (x->n_hash != y->n_hash) return x->n_hash < y->n_hash ? -1 : 1;
    return a < b ? -1 : a > b; /* stable: line order */
}

static int cmp_pins(const void *pa, const void *pb)
{
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    const uint64_t x = sort_items[a].pin, y = sort_items[b].pin;
    if (x != y) return x < y ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int32_t shared_blocks(const struct shard_item *x, const struct shard_item *y)
{
    int32_t n = x->n_hash < y->n_hash ? x->n_hash : y->n_hash, k = 0;
    while (k < n && x->hash[k] == y->hash[k]) k++;
    return k;
}

enum kvb_status shard_assign(const struct shard_item *items, int64_t n, int32_t n_shards, int32_t *shard_of)
{
    if (n_shards < 1 || n < 0 || (n > 0 && (!items || !shard_of))) return KVB_ERR_INVALID_ARG;
    int64_t *order = kvb_malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t *leader = kvb_malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t *cost_before = kvb_malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!order || !leader || !cost_before) {
        kvb_free(order);
        kvb_free(leader);
        kvb_free(cost_before);
        return KVB_ERR_NOMEM;
    }
    sort_items = items;
    /* Copies of one pin follow the first of them. */
    for (int64_t i = 0; i < n; i++) leader[i] = i;
    int64_t np = 0;
    for (int64_t i = 0; i < n; i++)
        if (items[i].pin) order[np++] = i;
    qsort(order, (size_t)np, sizeof *order, cmp_pins);
    for (int64_t i = 1; i < np; i++)
        if (items[order[i]].pin == items[order[i - 1]].pin) leader[order[i]] = leader[order[i - 1]];

    /* Requests in prompt order; the rest by line index. */
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (leader[i] != i) continue;
        if (items[i].n_hash > 0) order[m++] = i;
        else shard_of[i] = (int32_t)(i % n_shards);
    }
    qsort(order, (size_t)m, sizeof *order, cmp_prompts);
    cost_before[0] = 0;
    for (int64_t k = 0; k < m; k++) {
        const int64_t c = items[order[k]].cost;
        cost_before[k + 1] = cost_before[k] + (c > 0 ? c : 1);
    }
    /* Cuts: before sorted position cut, each near equal work, moved within
     * the window to the neighbours sharing the fewest leading blocks
     * (ties: nearest the ideal place). */
    const int64_t total = cost_before[m], window = m / (8 * (int64_t)n_shards) > 1 ? m / (8 * (int64_t)n_shards) : 1;
    int64_t prev = 0, k_at = 0;
    int32_t shard = 0;
    for (int32_t s = 1; s <= n_shards; s++) {
        int64_t cut = m;
        if (s < n_shards) {
            /* total * s / n_shards without the product (which could overflow) */
            const int64_t target = total / n_shards * s + total % n_shards * s / n_shards;
            int64_t ideal = prev;
            while (ideal < m && cost_before[ideal] < target) ideal++;
            int64_t lo = ideal - window > prev ? ideal - window : prev, hi = ideal + window < m ? ideal + window : m;
            cut = ideal;
            int32_t best = -1;
            for (int64_t b = lo; b <= hi; b++) {
                if (b <= 0 || b >= m) continue;
                const int32_t sh = shared_blocks(&items[order[b - 1]], &items[order[b]]);
                const int64_t d = b > ideal ? b - ideal : ideal - b, dbest = cut > ideal ? cut - ideal : ideal - cut;
                if (best < 0 || sh < best || (sh == best && d < dbest)) {
                    best = sh;
                    cut = b;
                }
            }
            if (cut < prev) cut = prev;
        }
        for (; k_at < cut; k_at++) shard_of[order[k_at]] = shard;
        prev = cut;
        shard++;
    }
    for (int64_t i = 0; i < n; i++)
        if (leader[i] != i) shard_of[i] = shard_of[leader[i]];
    sort_items = NULL;
    kvb_free(order);
    kvb_free(leader);
    kvb_free(cost_before);
    return KVB_OK;
}

static int cmp_u64_pair(const void *pa, const void *pb)
{
    const uint64_t *a = pa, *b = pb;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

enum kvb_status shard_plan(FILE *f, int32_t index, int32_t count, int64_t max_gen,
                           bool (*prompt_of)(void *user, const struct job_request *q, int32_t **ids, size_t *n),
                           void *user, struct shard_plan_out *out, struct kvb_err *err)
{
    memset(out, 0, sizeof *out);
    struct job_reader *rd = NULL;
    KVB_FORWARD_IF_ERROR(job_reader_create(f, 0, &rd, err));
    struct shard_item *items = NULL;
    uint64_t *ids_of = NULL; /* (cap) custom_id hash of each line, 0: none */
    int64_t n = 0, cap = 0;
    enum kvb_status st = KVB_OK;
    for (;;) {
        struct job_line ln;
        bool got = false;
        st = job_reader_next(rd, &ln, &got, err);
        if (st != KVB_OK || !got) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            struct shard_item *ni = kvb_realloc(items, sizeof *ni * (size_t)cap);
            uint64_t *nk = ni ? kvb_realloc(ids_of, sizeof *nk * (size_t)cap) : NULL;
            if (ni) items = ni;
            if (nk) ids_of = nk;
            if (!ni || !nk) {
                st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory planning the shards (%lld lines)", (long long)n);
                break;
            }
        }
        struct shard_item *it = &items[n];
        it->n_hash = 0;
        it->cost = 1;
        it->pin = 0;
        ids_of[n] = 0;
        struct job_request q;
        struct job_error je;
        if (!ln.too_long && !job_line_is_blank(ln.data, ln.len) &&
            job_parse_line(ln.data, ln.len, ln.line_no, &q, &je) == KVB_OK) {
            ids_of[n] = XXH3_64bits(q.custom_id, q.custom_id_len) | 1;
            int32_t *tok = NULL;
            size_t nt = 0;
            if (prompt_of(user, &q, &tok, &nt)) {
                shard_hash_prompt(tok, (int64_t)nt, it);
                int64_t gen = q.max_tokens > 0 ? q.max_tokens : 0;
                if (max_gen > 0 && gen > max_gen) gen = max_gen;
                it->cost = (int64_t)nt + gen * (q.n > 0 ? q.n : 1);
                kvb_free(tok);
            }
            job_request_free(&q);
        }
        n++;
    }
    job_reader_free(rd);
    /* Pins: custom_ids met more than once. */
    uint64_t *pairs = st == KVB_OK ? kvb_malloc(sizeof(uint64_t) * 2 * (size_t)(n ? n : 1)) : NULL;
    int32_t *shard_of = st == KVB_OK ? kvb_malloc(sizeof(int32_t) * (size_t)(n ? n : 1)) : NULL;
    uint8_t *m = st == KVB_OK ? kvb_calloc((size_t)(n ? n : 1), 1) : NULL;
    if (st == KVB_OK && (!pairs || !shard_of || !m))
        st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory planning the shards");
    if (st == KVB_OK) {
        int64_t np = 0;
        for (int64_t i = 0; i < n; i++)
            if (ids_of[i]) {
                pairs[2 * np] = ids_of[i];
                pairs[2 * np + 1] = (uint64_t)i;
                np++;
            }
        qsort(pairs, (size_t)np, 2 * sizeof(uint64_t), cmp_u64_pair);
        for (int64_t k = 0; k < np; k++) {
            const uint64_t id = pairs[2 * k];
            const bool dup = (k > 0 && id == pairs[2 * k - 2]) || (k + 1 < np && id == pairs[2 * k + 2]);
            if (dup) items[pairs[2 * k + 1]].pin = pairs[2 * k];
        }
        st = shard_assign(items, n, count, shard_of);
        if (st != KVB_OK) kvb_errf(err, st, "cannot plan the shards");
    }
    if (st == KVB_OK) {
        for (int64_t i = 0; i < n; i++) {
            m[i] = shard_of[i] == index;
            out->n_mine += m[i];
        }
        out->hash = XXH3_64bits(shard_of, sizeof(int32_t) * (size_t)n) ^ (uint64_t)count;
        out->mine = m;
        out->n_lines = n;
        m = NULL;
    }
    kvb_free(m);
    kvb_free(pairs);
    kvb_free(shard_of);
    kvb_free(items);
    kvb_free(ids_of);
    return st;
}

static bool parse_int(const char *s, long *out)
{
    if (!s || !*s) return false;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0) return false;
    *out = v;
    return true;
}

enum kvb_status shard_parse(const char *spec, const char *(*get_env)(const char *name), int32_t *index, int32_t *count,
                            struct kvb_err *err)
{
    long i = -1, n = -1;
    if (spec && !strcmp(spec, "auto")) {
        const char *id = get_env("SLURM_ARRAY_TASK_ID"), *cnt = get_env("SLURM_ARRAY_TASK_COUNT");
        const char *mn = get_env("SLURM_ARRAY_TASK_MIN"), *kidx = get_env("JOB_COMPLETION_INDEX");
        long lo = 0;
        if (id || cnt) {
            if (!parse_int(id, &i) || !parse_int(cnt, &n) || (mn && !parse_int(mn, &lo)))
                return kvb_errf(err, KVB_ERR_INVALID_ARG,
                                "--shard auto: SLURM_ARRAY_TASK_ID='%s', SLURM_ARRAY_TASK_COUNT='%s', "
                                "SLURM_ARRAY_TASK_MIN='%s' are not all whole numbers",
                                id ? id : "", cnt ? cnt : "", mn ? mn : "");
            i -= lo; /* arrays may start anywhere (--array=1-8); steps other than 1 are not shards */
        } else if (kidx) {
            const char *kcnt = get_env("KVBATCH_SHARD_COUNT");
            if (!parse_int(kidx, &i) || !parse_int(kcnt, &n))
                return kvb_errf(err, KVB_ERR_INVALID_ARG,
                                "--shard auto: JOB_COMPLETION_INDEX='%s' needs KVBATCH_SHARD_COUNT (the job's "
                                "completions) as a whole number, got '%s'",
                                kidx, kcnt ? kcnt : "");
        } else {
            return kvb_errf(err, KVB_ERR_INVALID_ARG,
                            "--shard auto: neither a Slurm job array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT) "
                            "nor a Kubernetes Indexed Job (JOB_COMPLETION_INDEX) is in the environment");
        }
    } else {
        const char *slash = spec ? strchr(spec, '/') : NULL;
        char a[32] = "";
        if (slash && (size_t)(slash - spec) < sizeof a) {
            memcpy(a, spec, (size_t)(slash - spec));
            a[slash - spec] = '\0';
        }
        if (!slash || !parse_int(a, &i) || !parse_int(slash + 1, &n))
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "--shard '%s': expected I/N (e.g. 0/4) or auto",
                            spec ? spec : "");
    }
    if (n < 1 || n > SHARD_MAX_COUNT)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "shard %ld of %ld: the number of shards must be in 1..%d", i, n,
                        SHARD_MAX_COUNT);
    if (i < 0 || i >= n)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "shard %ld of %ld: the index must be in 0..%ld", i, n, n - 1);
    *index = (int32_t)i;
    *count = (int32_t)n;
    return KVB_OK;
}
