/* tpool.h — a fixed pool of worker threads for data-parallel kernels.
 *
 * tpool_run(pool, fn, arg) calls fn(arg, i, n) once for each i in [0, n) where
 * n = tpool_size(pool), on n threads (the caller is thread 0), and returns when
 * all calls have returned. Workers spin briefly between runs and then sleep,
 * because a forward pass issues hundreds of short runs per token and a
 * condition-variable wake-up per run would cost more than the work.
 * Not re-entrant: fn must not call tpool_run on the same pool. One caller
 * thread at a time. */
#ifndef KVB_TPOOL_H
#define KVB_TPOOL_H

#include "base/status.h"

struct tpool;

typedef void (*tpool_fn)(void *arg, int ith, int nth);

/* n_threads <= 0 means one per online CPU. */
enum kvb_status tpool_create(int n_threads, struct tpool **out);
void tpool_free(struct tpool *pool); /* accepts NULL; joins the workers */
int tpool_size(const struct tpool *pool);
void tpool_run(struct tpool *pool, tpool_fn fn, void *arg);

/* Number of online CPUs (at least 1). */
int tpool_cpu_count(void);

#endif
