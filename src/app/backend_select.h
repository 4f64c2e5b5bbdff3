/* backend_select.h — turns --device (and the KV memory budget) into a
 * backend: "cpu", "cuda" / "cuda:N" (when kvbatch was built with CUDA), or
 * "auto" (the default: CUDA device 0 when one is usable and the CUDA backend
 * computes the model, else the CPU).
 * Prints nothing; errors come back in err with a hint for the fix. */
#ifndef KVB_BACKEND_SELECT_H
#define KVB_BACKEND_SELECT_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model.h"

struct be_select_opts {
    const char *device;   /* NULL or "auto", "cpu", "cuda", "cuda:N" */
    int n_threads;        /* CPU threads (<= 0: all cores) */
    int32_t block_size;   /* tokens per KV block */
    uint64_t kv_mem;      /* bytes for the KV pool; 0 = default (CPU 1 GiB, GPU 90 % of what the weights leave) */
    int32_t n_ctx;        /* one sequence must fit: the pool gets at least this many positions */
    enum mm_impl kernels; /* CPU matmul kernels (--kernels; MM_IMPL_AUTO when zeroed) */
    bool deterministic;   /* GPU: batch-invariant mode */
    bool cuda_graphs;     /* GPU: CUDA graphs for repeated step shapes */
    enum kv_type kv_type; /* how the KV pool stores K/V (KV_F16 when zeroed) */
    bool act16;           /* CPU: --activations 16 (be_cpu_opts.act16); the CUDA backend's stay float */
};

/* Whether a device string is well-formed (for option parsing). */
bool be_select_device_valid(const char *device);

enum kvb_status be_select_create(const struct model *m, const struct be_select_opts *o, struct backend **out,
                                 struct kvb_err *err);

#endif
