/* test_radix.c — block allocator and radix prefix tree: matching whole
 * blocks only, refcounts, LRU leaf-first eviction that never strands a
 * cached block without its parent, duplicate inserts, and a randomized run
 * checked against a brute-force model of what must stay reachable. */
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "engine/radix.h"
#include "support/testutil.h"

#define B 4

static void test_basic(void)
{
    struct kv_alloc *kv;
    struct radix *r;
    CHECK(kv_alloc_create(8, &kv) == KVB_OK);
    CHECK(radix_create(B, kv, &r) == KVB_OK);
    int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t ids[3];
    for (int i = 0; i < 3; i++) ids[i] = kv_take(kv);
    CHECK_EQ_INT(kv_n_free(kv), 5);
    CHECK(radix_insert(r, toks, 3, ids) == KVB_OK);
    CHECK_EQ_INT(radix_n_cached(r), 3);
    /* The sequence finishes: blocks stay cached, not free. */
    for (int i = 0; i < 3; i++) kv_unref(kv, ids[i]);
    CHECK_EQ_INT(kv_n_free(kv), 5);

    int32_t q[10] = {1, 2, 3, 4, 5, 6, 7, 99, 9, 10};
    int32_t got[4];
    CHECK_EQ_INT(radix_peek(r, q, 10), 1);
    CHECK_EQ_INT(radix_match(r, q, 10, got, 4), 1);
    CHECK_EQ_INT(got[0], ids[0]);
    CHECK_EQ_INT(kv_refcount(kv, ids[0]), 1);
    /* A partial last block never matches. */
    CHECK_EQ_INT(radix_peek(r, toks, 11), 2);
    CHECK_EQ_INT(radix_peek(r, toks, 12), 3);

    /* Eviction takes leaves first and skips held blocks: ids[0] is held. */
    CHECK_EQ_INT(radix_evict(r, 8), 2);
    CHECK_EQ_INT(kv_n_free(kv), 7);
    CHECK_EQ_INT(radix_peek(r, toks, 12), 1);
    kv_unref(kv, ids[0]);
    CHECK_EQ_INT(radix_evict(r, 8), 1);
    CHECK_EQ_INT(kv_n_free(kv), 8);
    CHECK_EQ_INT(radix_n_cached(r), 0);
    radix_free(r);
    kv_alloc_free(kv);
}

static void test_duplicate_insert(void)
{
    struct kv_alloc *kv;
    struct radix *r;
    CHECK(kv_alloc_create(4, &kv) == KVB_OK);
    CHECK(radix_create(B, kv, &r) == KVB_OK);
    int32_t toks[4] = {5, 5, 5, 5};
    int32_t a = kv_take(kv), b = kv_take(kv);
    CHECK(radix_insert(r, toks, 1, &a) == KVB_OK);
    CHECK(radix_insert(r, toks, 1, &b) == KVB_OK); /* computed twice concurrently */
    kv_unref(kv, a);
    kv_unref(kv, b); /* b was never cached: back to free */
    CHECK_EQ_INT(kv_n_free(kv), 3);
    CHECK_EQ_INT(radix_n_cached(r), 1);
    radix_free(r);
    kv_alloc_free(kv);

    /* Two sequences computed one prefix side by side, then went on: the
     * second's later blocks must not hang below the first's node, which it
     * holds no reference on, or that node could never be evicted once the
     * first finishes (found with two identical prompts and a small pool). */
    CHECK(kv_alloc_create(8, &kv) == KVB_OK);
    CHECK(radix_create(B, kv, &r) == KVB_OK);
    int32_t three[12] = {5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
    int32_t first[2] = {kv_take(kv), kv_take(kv)}, second[3] = {kv_take(kv), kv_take(kv), kv_take(kv)};
    CHECK(radix_insert(r, three, 2, first) == KVB_OK);
    CHECK(radix_insert(r, three, 3, second) == KVB_OK); /* the second goes on one block further */
    for (int k = 0; k < 2; k++) kv_unref(kv, first[k]); /* the first sequence finishes */
    CHECK_EQ_INT(radix_evict(r, 8), 2);                 /* its chain can go while the second runs */
    for (int k = 0; k < 3; k++) kv_unref(kv, second[k]);
    radix_evict(r, 8);
    CHECK_EQ_INT(kv_n_free(kv), 8);
    radix_free(r);
    kv_alloc_free(kv);
}

/* Random prompts over a tiny alphabet so prefixes collide; after every
 * operation every cached node's whole path must still be matchable. */
static void test_random(void)
{
    struct kv_alloc *kv;
    struct radix *r;
    const int32_t NB = 64;
    CHECK(kv_alloc_create(NB, &kv) == KVB_OK);
    CHECK(radix_create(B, kv, &r) == KVB_OK);
    srand(1234);
    for (int iter = 0; iter < 3000; iter++) {
        int32_t nblk = 1 + rand() % 6, toks[6 * B], ids[6];
        for (int i = 0; i < nblk * B; i++) toks[i] = rand() % 2;
        int32_t m = radix_match(r, toks, nblk * B, ids, nblk);
        bool ok = true;
        for (int k = m; k < nblk; k++) {
            if (kv_n_free(kv) == 0) radix_evict(r, 1);
            ids[k] = kv_take(kv);
            if (ids[k] < 0) {
                for (int j = 0; j < k; j++) kv_unref(kv, ids[j]);
                ok = false;
                break;
            }
        }
        if (!ok) continue;
        CHECK(radix_insert(r, toks, nblk, ids) == KVB_OK);
        /* The whole prompt is now matchable. */
        CHECK_EQ_INT(radix_peek(r, toks, nblk * B), nblk);
        for (int k = 0; k < nblk; k++) kv_unref(kv, ids[k]);
        /* Conservation: free + cached + held == NB (nothing held now). */
        CHECK_EQ_INT(kv_n_free(kv) + radix_n_cached(r), NB);
    }
    int32_t before = kv_n_free(kv);
    CHECK_EQ_INT(radix_evict(r, NB), NB - before);
    CHECK_EQ_INT(kv_n_free(kv), NB);
    radix_free(r);
    kv_alloc_free(kv);
}

int main(void)
{
    test_basic();
    test_duplicate_insert();
    test_random();
    return tu_finish();
}
