/* cpu.h — which x86 vector instruction sets this machine runs, for the
 * kernels that choose at run time.
 *
 * Read with cpuid, not __builtin_cpu_supports, whose feature names differ
 * between compilers (Clang 14 knows no "f16c"), and including that the OS
 * saves the vector registers (XCR0). Each set matches the flags its sources
 * are compiled with (CMakeLists.txt): a kernel may use all of them. All
 * false off x86. Read once per process (thread-safe), so kernels may ask
 * on every call. The first call also asks Linux for the AMX tile state when
 * the CPU has AMX (a permission per process, inherited by every thread). */
#ifndef KVB_CPU_H
#define KVB_CPU_H

#include <stdbool.h>

struct cpu_features {
    bool f16c;   /* F16C with AVX state saved */
    bool avx2;   /* AVX2 + FMA + F16C: the *_avx2.c sources */
    bool avx512; /* AVX-512 F/BW/VL/VNNI + the above: the *_avx512.c sources */
    /* AMX-TILE/INT8/BF16 + avx512, the OS saves tile state (XCR0), and the
     * kernel granted this process the tile data (Linux: arch_prctl
     * ARCH_REQ_XCOMP_PERM, asked once per process by cpu_features): the
     * *_amx.c sources. amx_cpu: the CPU and XCR0 have it, whatever the
     * kernel said (so a refusal can be told apart from a CPU without AMX). */
    bool amx;
    bool amx_cpu;
};

struct cpu_features cpu_features(void);

#endif
