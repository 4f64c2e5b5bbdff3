/* rng.h — the two small generators the tree uses, written once.
 *
 * splitmix64 (Steele, Lea, Flood 2014) is a bijection of its counter: good
 * for seeding and for test data that must be the same on every machine.
 * xorshift64 (Marsaglia 2003, shifts 13/7/17) is the cheapest full-period
 * generator, for test and benchmark fill. Neither is for anything that an
 * adversary may predict. The state is the caller's: no global state. */
#ifndef KVB_RNG_H
#define KVB_RNG_H

#include <stdint.h>

/* splitmix64's output function alone: a strong 64-bit mix of x. */
static inline uint64_t kvb_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t kvb_splitmix64(uint64_t *state) { return kvb_mix64(*state += 0x9e3779b97f4a7c15ull); }

/* The next state of a xorshift64 generator (state must not be 0); the state
 * is also the output. */
static inline uint64_t kvb_xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

#endif
