/* tpool.c — spin-then-sleep worker pool (see tpool.h for why). */
#include "base/tpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "base/alloc.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spins before a worker sleeps (a pause is ~40-140 cycles, so this is tens
 * of microseconds): long enough to bridge the gap between two kernels of one
 * forward pass, short enough not to burn a core while the engine does
 * single-threaded work (sampling, I/O) or another process needs it. */
#define SPIN_ITERS 4000
/* Spins of the caller waiting for lagging workers before it starts to yield
 * its core to them (they may have been descheduled by another process). */
#define WAIT_SPINS 1000

struct tpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;    /* bumped once per run */
    atomic_int pending; /* workers still inside fn for the current run */
    atomic_int sleepers;
    atomic_bool stop;
    tpool_fn fn;
    void *arg;
};

struct worker_arg {
    struct tpool *pool;
    int ith;
};

static void *worker_main(void *p)
{
    struct tpool *pool = ((struct worker_arg *)p)->pool;
    int ith = ((struct worker_arg *)p)->ith;
    kvb_free(p);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->gen) == seen) pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&pool->stop)) return NULL;
        pool->fn(pool->arg, ith, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

int tpool_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void kick(struct tpool *pool)
{
    /* The increment happens under the mutex so a worker between its last
     * check of gen and pthread_cond_wait cannot miss the wake-up. */
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    if (atomic_load(&pool->sleepers) > 0) pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
}

enum kvb_status tpool_create(int n_threads, struct tpool **out)
{
    if (n_threads <= 0) n_threads = tpool_cpu_count();
    struct tpool *pool = kvb_calloc(1, sizeof *pool);
    if (!pool) return KVB_ERR_NOMEM;
    pool->n = n_threads;
    pool->threads = kvb_calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        kvb_free(pool);
        return KVB_ERR_NOMEM;
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = kvb_malloc(sizeof *wa);
        if (!wa ||
            pthread_create(&pool->threads[i], NULL, worker_main, wa ? (wa->pool = pool, wa->ith = i, wa) : NULL) != 0) {
            kvb_free(wa);
            pool->n = i; /* only workers 1..i-1 exist */
            tpool_free(pool);
            return KVB_ERR_NOMEM;
        }
    }
    *out = pool;
    return KVB_OK;
}

void tpool_free(struct tpool *pool)
{
    if (!pool) return;
    atomic_store(&pool->stop, true);
    kick(pool);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    kvb_free(pool->threads);
    kvb_free(pool);
}

int tpool_size(const struct tpool *pool) { return pool->n; }

void tpool_run(struct tpool *pool, tpool_fn fn, void *arg)
{
    if (pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    kick(pool);
    fn(arg, 0, pool->n);
    /* Workers are usually done within microseconds; if one is not (another
     * process took its core), yield rather than burn the core it needs. */
    for (long spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < WAIT_SPINS) cpu_relax();
        else sched_yield();
    }
}
