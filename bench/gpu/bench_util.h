/* bench_util.h — what the GPU benchmark's commands share (bench_gpu.c,
 * bench_job.c): a clock, option look-ups, and the model under test — a
 * GGUF file, or a bf16 model of any shape built in host memory on the spot
 * (no download, no disk).
 *
 * Ownership: bench_model_open fills a struct bench_model that
 * bench_model_close releases; the model it points to lives until then. */
#ifndef KVB_BENCH_UTIL_H
#define KVB_BENCH_UTIL_H

#include <stdbool.h>

#include "backend/kvtype.h"
#include "model/model.h"

/* Monotonic seconds. */
double bench_now(void);

/* The value after option `name` in argv (strtol / the string itself), or
 * def when absent; whether a flag is present. */
long bench_arg_int(int argc, char **argv, const char *name, long def);
const char *bench_arg_str(int argc, char **argv, const char *name, const char *def);
bool bench_arg_flag(int argc, char **argv, const char *name);
/* --kv-type f16|q8|q4 (default f16) into *out; false, with a message on
 * stderr naming the value, for anything else. */
bool bench_arg_kv_type(int argc, char **argv, enum kv_type *out);

struct mem_model;

struct bench_model {
    const struct model *m;
    struct model *file;    /* --model PATH, or NULL */
    struct mem_model *mem; /* the in-memory one, or NULL */
};

/* --model PATH loads that GGUF; otherwise a llama-shaped model with random
 * bf16 weights is built from --layers --embd --ff --heads --kv-heads --vocab
 * (default Llama-3-8B's shape: 32, 4096, 14336, 32, 8, 128256; every layer
 * shares one set of host matrices, ~0.4 GB for that shape; its fingerprint
 * names the shape). Prints a line describing the model and NOTE figures
 * where the shape is not Llama 3 8B's. false (with a message on stderr)
 * when it cannot. */
bool bench_model_open(int argc, char **argv, struct bench_model *out);
void bench_model_close(struct bench_model *bm);

/* What every command starts with: CUDA device 0 must be usable (it prints
 * its name and free memory), then bench_model_open. 0 when both are done;
 * else the exit status: 77 (no device: skipped) or 1. */
int bench_open(int argc, char **argv, struct bench_model *out);

/* The attention kernels alone, f32 (kcu_attn) against tensor cores
 * (kcu_attn_tc) on one layer of hp's heads: a prefill step of pf_seqs x
 * pf_len tokens and a decode step of `batch` tokens at position ctx, over
 * a pool of each KV type (f16, q8, q4). Prints
 * "figure:" lines; returns 0, or 1 when a launch failed (bench_attn.c). */
int bench_attn(const struct model_hparams *hp, int pf_seqs, int pf_len, int batch, int ctx);

/* `bench_gpu job …` (bench_job.c); returns the exit status. */
int bench_cmd_job(int argc, char **argv);

#endif
