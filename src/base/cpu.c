/* cpu.c — x86 features by cpuid (see cpu.h). */
#include "base/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* Linux hands out the tile data state (8 KiB per thread) only to a process
 * that asks: without it the first tile instruction is a SIGILL. Asked once
 * per process; every thread, those started earlier too, then has it.
 * KVBATCH_AMX_DENY=1 acts as a refusal (tests of the fallback). */
static bool tile_permission(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    const char *deny = getenv("KVBATCH_AMX_DENY");
    if (deny && *deny && *deny != '0') return false;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) != 0) return false;
    return (granted >> XFEATURE_XTILEDATA) & 1;
#else
    return false; /* other systems: tile state not asked for, so never used */
#endif
}

static struct cpu_features read_features(void)
{
    struct cpu_features f = {false, false, false, false, false};
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
    const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
    const uint64_t tile_state = (uint64_t)3 << 17; /* XTILECFG, XTILEDATA */
    f.amx_cpu = f.avx512 && amx_tile && amx_int8 && amx_bf16 && (x & tile_state) == tile_state;
    f.amx = f.amx_cpu && tile_permission();
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
struct cpu_features cpu_features(void) { return (struct cpu_features){false, false, false, false, false}; }
#endif
