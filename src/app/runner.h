/* runner.h — `kvbatch run`: a JSONL job through the scheduler to a JSONL
 * result file, with metrics.
 *
 * Streams the input (memory bounded by the look-ahead window, not the file),
 * turns each line into token ids (chat template or plain prompt), submits
 * requests to the scheduler, and writes one result or error line per
 * non-blank input line as requests finish, flushed at once. With resume, the
 * ids already in the output are skipped and a torn last line is cut off
 * first. SIGINT/SIGTERM stop admission; what is finished is written and the
 * run is marked interrupted. A request whose own processing fails is a 500
 * error line and the job goes on; one that crashes the process is named in
 * a journal beside the output (crashlog.h), so that --resume writes it as
 * an error line instead of crashing again.
 *
 * Prints its own messages; returns the process exit code. */
#ifndef KVB_RUNNER_H
#define KVB_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/kvtype.h"
#include "model/quant.h"

struct run_opts {
    const char *model_path;
    const char *input_path; /* "-" reads standard input */
    const char *output_path;
    const char *metrics_path;  /* NULL: kvbatch.db beside the output */
    const char *chat_template; /* NULL: detect from the model */
    int n_threads;             /* <= 0: all cores */
    int32_t max_batch;         /* sequences running at once; 0: 128 on the CPU, 256 on a GPU */
    int32_t max_step_tokens;   /* tokens per forward pass; 0: 512 on the CPU, 4096 on a GPU */
    int32_t block_size;        /* tokens per KV block */
    int32_t n_ctx;             /* 0: min(model's, 4096) */
    int32_t lookahead;         /* requests read ahead for prefix grouping; 0: default */
    uint64_t kv_mem;           /* bytes for the KV pool; 0 = the backend's default */
    enum kv_type kv_type;      /* how the pool (and the store) keep K/V rows; KV_F16 when zeroed */
    const char *device;        /* --device: auto | cpu | cuda[:N] */
    bool deterministic;        /* GPU: batch-invariant mode */
    bool cuda_graphs;          /* GPU: CUDA graphs for repeated step shapes */
    const char *cache_dir;     /* persistent prefix cache; NULL: the default directory */
    bool no_cache;             /* do not use the persistent cache at all */
    uint64_t cache_max_size;   /* 0: the store's default (10 GiB, within free disk) */
    int cache_level;           /* zstd level; 0: default */
    bool cache_lossy8;         /* 8-bit lossy cache values */
    uint64_t cache_buffer;     /* bytes of blocks waiting to be written; 0: the store's default */
    bool resume, quiet;
    enum mm_impl kernels;             /* CPU matmul kernels (--kernels, --scalar); MM_IMPL_AUTO when zeroed */
    bool act16;                       /* --activations 16 (be_cpu_opts.act16) */
    const char *pooling;              /* --pooling mean|cls|last for embeddings; NULL: the model's pooling_type */
    bool no_normalize;                /* embeddings as pooled, not L2-normalised */
    int32_t shard_index, shard_count; /* run only shard_index of shard_count (job_shard.h); count <= 1: all */
};

/* Exit codes: 0 the job ran to the end (even with bad lines), 1 it could not
 * run (model, input or output unusable; a write failed), 2 bad usage is the
 * CLI's, 128+signal when interrupted. */
int run_job(const struct run_opts *o);

#endif
