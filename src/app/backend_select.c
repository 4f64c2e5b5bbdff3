/* backend_select.c — --device parsing and KV pool sizing (see backend_select.h). */
#include "app/backend_select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/be_cpu.h"
#ifdef KVBATCH_HAVE_CUDA
#include "kernels/be_cuda.h"
#endif

#define DEFAULT_CPU_KV ((uint64_t)1 << 30)

/* "cuda" → 0, "cuda:N" → N; -1 when not a CUDA device string. */
static int cuda_index(const char *d)
{
    if (strncmp(d, "cuda", 4) != 0) return -1;
    if (d[4] == '\0') return 0;
    if (d[4] != ':' || d[5] == '\0') return -1;
    char *end;
    long n = strtol(d + 5, &end, 10);
    return *end == '\0' && n >= 0 && n < 1024 ? (int)n : -1;
}

bool be_select_device_valid(const char *d)
{
    return !d || !strcmp(d, "auto") || !strcmp(d, "cpu") || cuda_index(d) >= 0;
}

static enum kvb_status pool_blocks(const struct model *m, const struct be_select_opts *o, uint64_t kv_mem, int32_t *out,
                                   struct kvb_err *err)
{
    const int64_t block_bytes = be_block_bytes(m, o->block_size, o->kv_type);
    int64_t need = ((int64_t)o->n_ctx + o->block_size - 1) / o->block_size;
    struct be_kv_layout lo;
    be_kv_layout(m, o->block_size, o->kv_type, &lo);
    if (lo.n_groups > 1) { /* windowed layers keep a window's blocks, not the context's (the scheduler adds a step) */
        const int64_t win = (m->ops.n_swa + o->block_size - 1) / o->block_size + 1;
        need = (need * lo.n_global_groups + (win < need ? win : need) * (lo.n_groups - lo.n_global_groups) +
                lo.n_groups - 1) /
               lo.n_groups;
    }
    int64_t n = (int64_t)(kv_mem / (uint64_t)block_bytes);
    if (n < need)
        return kvb_errf(err, KVB_ERR_RANGE,
                        "--kv-mem %llu MiB holds %lld blocks of %d tokens, but one sequence of the %d-token context "
                        "needs %lld (%lld MiB): raise --kv-mem or lower --ctx",
                        (unsigned long long)(kv_mem >> 20), (long long)n, o->block_size, o->n_ctx, (long long)need,
                        (long long)((need * block_bytes) >> 20));
    *out = n > INT32_MAX ? INT32_MAX : (int32_t)n;
    return KVB_OK;
}

static enum kvb_status create_cpu(const struct model *m, const struct be_select_opts *o, struct backend **out,
                                  struct kvb_err *err)
{
    struct be_cpu_opts co = {.n_threads = o->n_threads,
                             .block_size = o->block_size,
                             .impl = o->kernels,
                             .kv_type = o->kv_type,
                             .act16 = o->act16};
    KVB_FORWARD_IF_ERROR(pool_blocks(m, o, o->kv_mem ? o->kv_mem : DEFAULT_CPU_KV, &co.n_blocks, err));
    return be_cpu_create(m, &co, out, err);
}

enum kvb_status be_select_create(const struct model *m, const struct be_select_opts *o, struct backend **out,
                                 struct kvb_err *err)
{
    const char *d = o->device ? o->device : "auto";
    if (!be_select_device_valid(d))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "--device '%s': expected auto, cpu, cuda or cuda:N", d);
    if (!strcmp(d, "cpu")) return create_cpu(m, o, out, err);
#ifdef KVBATCH_HAVE_CUDA
    int dev = strcmp(d, "auto") ? cuda_index(d) : 0;
    char why[256] = "";
    if (!be_cuda_available(dev, why, sizeof why)) {
        if (!strcmp(d, "auto")) return create_cpu(m, o, out, err);
        return kvb_errf(err, KVB_ERR_UNSUPPORTED, "--device %s: no usable CUDA device: %s (use --device cpu)", d, why);
    }
    uint64_t kv = o->kv_mem;
    if (!kv) {
        int64_t free_b = be_cuda_free_memory(dev) - be_cuda_weight_bytes(m) - ((int64_t)1 << 30);
        kv = free_b > 0 ? (uint64_t)(free_b / 10 * 9) : 0;
    }
    struct be_cuda_opts go = {.device = dev,
                              .block_size = o->block_size,
                              .n_threads = o->n_threads,
                              .deterministic = o->deterministic,
                              .graphs = o->cuda_graphs,
                              .kv_type = o->kv_type};
    KVB_FORWARD_IF_ERROR(pool_blocks(m, o, kv, &go.n_blocks, err));
    enum kvb_status st = be_cuda_create(m, &go, out, err);
    /* auto: a model the CUDA backend does not compute yet (one it refuses
     * by name) runs on the CPU, as on a machine without a GPU; the run's
     * settings name the backend it got. --device cuda keeps the refusal. */
    if (st == KVB_ERR_UNSUPPORTED && !strcmp(d, "auto")) return create_cpu(m, o, out, err);
    return st;
#else
    if (!strcmp(d, "auto")) return create_cpu(m, o, out, err);
    return kvb_errf(err, KVB_ERR_UNSUPPORTED, "--device %s: this kvbatch was built without CUDA (use --device cpu)", d);
#endif
}
