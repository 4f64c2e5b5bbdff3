/* alloc.h — the one allocation wrapper (STYLE.md rule 10).
 *
 * Every heap allocation in library code goes through these so that a test can
 * make the Nth call fail (kvb_alloc_fail_after) and check that the caller
 * reports KVB_ERR_NOMEM without leaking or crashing. kvb_free accepts NULL.
 * The fault-injection counter is this module's only global state; it is
 * thread-safe (atomic) and off unless a test turns it on. */
#ifndef KVB_ALLOC_H
#define KVB_ALLOC_H

#include <stddef.h>

void *kvb_malloc(size_t n);
void *kvb_calloc(size_t count, size_t size); /* checks count*size overflow */
void *kvb_realloc(void *p, size_t n);
void *kvb_aligned_alloc(size_t align, size_t n); /* free with kvb_free */
char *kvb_strndup(const char *s, size_t n);
void kvb_free(void *p);

/* Test hook: after `n` more successful allocations every call fails, until
 * reset with n < 0. */
void kvb_alloc_fail_after(long n);

#endif
