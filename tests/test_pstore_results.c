/* test_pstore_results.c — results kept in the persistent cache
 * (store/pstore/pstore_results.h):
 *  - put, then get: from the held puts before any write, and from the
 *    database after a flush and a reopen, bit for bit;
 *  - a get is a miss for other tokens under the same key (a collision), in
 *    another space, for another model, or for another count of values;
 *  - a damaged value (one byte changed in the database) is a miss, counted,
 *    and removed by the next write; `verify` finds one and removes it;
 *  - the size cap (a quarter of the store's): least recently used results
 *    go first, a result used since it was written stays;
 *  - `clear` of one model removes its results and leaves the other's;
 *    `stats` counts them. */
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "store/pstore/pstore.h"
#include "store/pstore/pstore_results.h"
#include "support/testutil.h"

#include "pstore_check.h"

static char *mktmp(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/kvb_presult_XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    if (!d) {
        perror("mkdtemp");
        exit(1);
    }
    return strdup(d);
}

static void rmtree(char *dir)
{
    static const char *const files[] = {"data.mdb", "lock.mdb", "kvbatch.lock"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
    free(dir);
}

static struct pstore *open_store(const char *dir, uint64_t max_size)
{
    struct pstore_opts o = {.quiet = true, .max_size = max_size};
    struct pstore *ps = NULL;
    struct kvb_err err = {{0}};
    CHECK_MSG(pstore_open(dir, &o, &ps, &err) == KVB_OK, "open %s: %s", dir, err.msg);
    return ps;
}

static void space(struct pstore_rspace *sp, const char *fp, uint32_t param)
{
    CHECK(pstore_rspace_init(sp, fp, &param, sizeof param, NULL) == KVB_OK);
}

/* A result of n values from tokens seeded by i. */
static void make(int i, int32_t *toks, int32_t nt, float *v, int32_t nv)
{
    for (int32_t k = 0; k < nt; k++) toks[k] = i * 1000 + k;
    for (int32_t k = 0; k < nv; k++) v[k] = (float)(i + 1) * 0.001f * (float)(k - nv / 2);
}

static bool get(struct pstore *ps, const struct pstore_rspace *sp, const int32_t *toks, int32_t nt, float *v,
                int32_t nv)
{
    struct pstore_key key;
    pstore_result_key(sp, toks, nt, &key);
    bool hit = false;
    struct kvb_err err = {{0}};
    CHECK_MSG(pstore_result_get(ps, sp, &key, toks, nt, v, nv, &hit, &err) == KVB_OK, "get: %s", err.msg);
    return hit;
}

static void put(struct pstore *ps, const struct pstore_rspace *sp, const int32_t *toks, int32_t nt, const float *v,
                int32_t nv)
{
    struct pstore_key key;
    pstore_result_key(sp, toks, nt, &key);
    struct kvb_err err = {{0}};
    CHECK_MSG(pstore_result_put(ps, sp, &key, toks, nt, v, nv, &err) == KVB_OK, "put: %s", err.msg);
}

/* Changes byte `at` of every value in the results database. */
static void damage(const char *dir, size_t at)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *cur;
    CHECK(mdb_env_create(&env) == 0 && mdb_env_set_maxdbs(env, 8) == 0 && mdb_env_set_mapsize(env, 1u << 30) == 0);
    CHECK(mdb_env_open(env, dir, 0, 0644) == 0);
    CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0 && mdb_dbi_open(txn, "results", 0, &dbi) == 0);
    CHECK(mdb_cursor_open(txn, dbi, &cur) == 0);
    MDB_val k, v;
    for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        uint8_t *copy = malloc(v.mv_size);
        memcpy(copy, v.mv_data, v.mv_size);
        copy[at % v.mv_size] ^= 0x40;
        MDB_val nv = {v.mv_size, copy};
        CHECK(mdb_cursor_put(cur, &k, &nv, MDB_CURRENT) == 0);
        free(copy);
    }
    mdb_cursor_close(cur);
    CHECK(mdb_txn_commit(txn) == 0);
    mdb_env_close(env);
}

static void test_round_trip(void)
{
    char *dir = mktmp();
    struct pstore *ps = open_store(dir, 0);
    struct pstore_rspace a, b, other_model;
    space(&a, FP_A, 1);
    space(&b, FP_A, 2);
    space(&other_model, FP_B, 1);
    int32_t toks[3][40];
    float v[3][64], got[64];
    for (int i = 0; i < 3; i++) {
        make(i, toks[i], 10 + 10 * i, v[i], 64);
        put(ps, &a, toks[i], 10 + 10 * i, v[i], 64);
    }
    /* held: before any write */
    CHECK(get(ps, &a, toks[1], 20, got, 64) && !memcmp(got, v[1], sizeof got));
    struct kvb_err err = {{0}};
    CHECK(pstore_results_flush(ps, &err) == KVB_OK);
    CHECK(get(ps, &a, toks[2], 30, got, 64) && !memcmp(got, v[2], sizeof got));
    pstore_close(ps);
    ps = open_store(dir, 0);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(get(ps, &a, toks[i], 10 + 10 * i, got, 64) && !memcmp(got, v[i], sizeof got),
                  "result %d after reopening", i);
    /* misses: other space, other model, other count, other tokens under the same key */
    CHECK(!get(ps, &b, toks[0], 10, got, 64));
    CHECK(!get(ps, &other_model, toks[0], 10, got, 64));
    CHECK(!get(ps, &a, toks[0], 10, got, 63));
    CHECK(!get(ps, &a, toks[0], 9, got, 64));
    {
        struct pstore_key key;
        pstore_result_key(&a, toks[0], 10, &key);
        int32_t other[10];
        memcpy(other, toks[0], sizeof other);
        other[9]++;
        bool hit = true;
        CHECK(pstore_result_get(ps, &a, &key, other, 10, got, 64, &hit, &err) == KVB_OK && !hit);
    }
    struct pstore_results_stats st;
    pstore_results_get_stats(ps, &st);
    CHECK(st.hits == 3 && st.misses == 5 && st.damaged == 0);
    /* one byte changed in every stored value: misses, counted, removed */
    pstore_close(ps);
    damage(dir, 100);
    ps = open_store(dir, 0);
    CHECK(!get(ps, &a, toks[1], 20, got, 64));
    pstore_results_get_stats(ps, &st);
    CHECK_EQ_INT(st.damaged, 1);
    CHECK(pstore_results_flush(ps, &err) == KVB_OK); /* removes it */
    uint64_t n_bad = 0;
    FILE *devnull = fopen("/dev/null", "w");
    CHECK(pstore_verify(ps, devnull, &n_bad, &err) == KVB_OK);
    CHECK_EQ_INT(n_bad, 2); /* the two left, found by verify */
    n_bad = 9;
    CHECK(pstore_verify(ps, devnull, &n_bad, &err) == KVB_OK && n_bad == 0);
    fclose(devnull);
    pstore_close(ps);
    rmtree(dir);
}

static void test_cap_and_clear(void)
{
    char *dir = mktmp();
    /* a 4 MiB store: results may take 1 MiB, ~250 results of 1000 floats */
    struct pstore *ps = open_store(dir, (uint64_t)4 << 20);
    struct pstore_rspace a, other;
    space(&a, FP_A, 1);
    space(&other, FP_B, 1);
    enum { NV = 1000, NT = 16, N = 600 };
    static float v[NV], got[NV];
    int32_t toks[NT];
    struct kvb_err err = {{0}};
    for (int i = 0; i < N; i++) {
        make(i, toks, NT, v, NV);
        put(ps, &a, toks, NT, v, NV);
        if (i >= 100) { /* result 0 is used all along; results 1.. are not */
            make(0, toks, NT, v, NV);
            const bool there = get(ps, &a, toks, NT, got, NV);
            CHECK_MSG(there, "result 0 was evicted at put %d though it is used", i);
            if (!there) break;
        }
    }
    make(7, toks, NT, v, NV);
    put(ps, &other, toks, NT, v, NV);
    CHECK(pstore_results_flush(ps, &err) == KVB_OK);
    struct pstore_results_stats st;
    pstore_results_get_stats(ps, &st);
    printf("cap: %llu written, %llu evicted\n", (unsigned long long)st.written, (unsigned long long)st.evicted);
    CHECK(st.evicted > 0 && st.written == N + 1);
    make(1, toks, NT, v, NV);
    CHECK(!get(ps, &a, toks, NT, got, NV)); /* the least recently used went */
    make(N - 1, toks, NT, v, NV);
    CHECK(get(ps, &a, toks, NT, got, NV) && !memcmp(got, v, sizeof v)); /* the last stayed */
    make(0, toks, NT, v, NV);
    CHECK(get(ps, &a, toks, NT, got, NV));
    /* clear one model: its results go, the other's stay */
    uint64_t n = 0;
    CHECK(pstore_clear(ps, FP_A, &n, &err) == KVB_OK && n > 0);
    CHECK(!get(ps, &a, toks, NT, got, NV));
    make(7, toks, NT, v, NV);
    CHECK(get(ps, &other, toks, NT, got, NV));
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    CHECK(pstore_print_stats(ps, f, &err) == KVB_OK);
    fclose(f);
    CHECK_MSG(strstr(buf, "results (embeddings, scores): 1,") != NULL, "stats: %s", buf);
    CHECK(pstore_clear(ps, NULL, &n, &err) == KVB_OK && !get(ps, &other, toks, NT, got, NV));
    pstore_close(ps);
    rmtree(dir);
}

int main(void)
{
    struct pstore_rspace sp;
    CHECK(pstore_rspace_init(&sp, "not hex", NULL, 0, NULL) == KVB_ERR_INVALID_ARG);
    test_round_trip();
    test_cap_and_clear();
    return tu_finish();
}
