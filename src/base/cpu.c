/* cpu.c — x86 features by cpuid (see cpu.h). */
#include "base/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>

static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static struct cpu_features read_features(void)
{
    struct cpu_features f = {false, false, false};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
    if (!osxsave || !avx) return f;
    const uint64_t x = xcr0();
    if ((x & 0x6) != 0x6) return f; /* SSE and AVX state */
    f.f16c = f16c;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    f.avx2 = (b & (1u << 5)) && fma && f16c;
    const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
    const bool vnni = c & (1u << 11);
    f.avx512 = f.avx2 && avx512f && avx512bw && avx512vl && vnni && (x & 0xE0) == 0xE0; /* opmask, ZMM state */
    return f;
}

/* Read once: cpuid is slow (a virtual machine's hypervisor traps it), and
 * kernels ask on every call. This module's one piece of state. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct cpu_features features;

static void init(void) { features = read_features(); }

struct cpu_features cpu_features(void)
{
    pthread_once(&once, init);
    return features;
}
#else
struct cpu_features cpu_features(void) { return (struct cpu_features){false, false, false}; }
#endif
