/* alloc.c — allocation wrapper with fault injection for tests. */
#include "base/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown = -1; /* <0: never fail */

static int should_fail(void)
{
    long v = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (v < 0) return 0;
    while (v > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &v, v - 1)) return 0;
        if (v < 0) return 0;
    }
    return 1;
}

void kvb_alloc_fail_after(long n) { atomic_store(&fail_countdown, n); }

void *kvb_malloc(size_t n) { return should_fail() ? NULL : malloc(n ? n : 1); }

void *kvb_calloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size) return NULL;
    return should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}

void *kvb_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n ? n : 1); }

void *kvb_aligned_alloc(size_t align, size_t n)
{
    void *p = NULL;
    if (should_fail()) return NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, n ? n : 1) != 0) return NULL;
    return p;
}

char *kvb_strndup(const char *s, size_t n)
{
    char *d = kvb_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

void kvb_free(void *p) { free(p); }
