/* be_cpu.h — the CPU backend (see backend/backend.h for the seam it
 * implements): the forward pass on this machine's cores, with the scalar
 * reference kernels or the AVX2 / AVX-512 ones chosen at run time, and the
 * KV pool in host memory. */
#ifndef KVB_BE_CPU_H
#define KVB_BE_CPU_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model.h"

struct be_cpu_opts {
    int n_threads;        /* <= 0: one per CPU */
    int32_t block_size;   /* tokens per KV block, > 0 */
    int32_t n_blocks;     /* KV pool size in blocks, > 0 */
    enum mm_impl impl;    /* MM_IMPL_AUTO unless forcing the scalar reference */
    enum kv_type kv_type; /* KV pool rows (backend/kvtype.h); KV_F16 when zeroed */
    bool act16;           /* 16-bit activations in quantized products (mm_ctx_set_act16); 8 when false */
};

/* The model must outlive the backend. */
enum kvb_status be_cpu_create(const struct model *m, const struct be_cpu_opts *opts, struct backend **out,
                              struct kvb_err *err);
/* Name of the matmul implementation in use ("avx2", "scalar", …). */
const char *be_cpu_impl_name(const struct backend *be);

#endif
