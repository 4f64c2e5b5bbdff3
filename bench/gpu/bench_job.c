/* bench_job.c — `bench_gpu job`: the offline job of issue 5's GPU
 * benchmark, through the real scheduler (continuous batching, the radix
 * prefix tree, greedy choices on the device) on the CUDA backend, and the
 * persistent cache cold then warm. Token ids, not text: the model is the
 * in-memory one (or --model), and a tokenizer would only add host time
 * that `kvbatch run` measures elsewhere.
 *
 *   bench_gpu job [model options, see bench_util.h] [--requests 1000]
 *                 [--prompt 512] [--prefix 256] [--gen 128] [--max-batch 256]
 *                 [--step-tokens 4096] [--kv-gib 40] [--cache-requests 64]
 *                 [--cache-dir DIR] [--deterministic] [--cuda-graphs]
 *                 [--kv-type f16|q8|q4]
 *
 * The job: --requests prompts of --prompt tokens whose first --prefix are
 * the same, each generating exactly --gen tokens (greedy, no stop);
 * --requests 0 runs the cache pair alone (for other model sizes). Prints
 * output tokens/s and total tokens/s over the job's wall time, the prefill
 * it computed against the prompt tokens it was given, steps and the mean
 * batch. The cache pair: --cache-requests prompts of --prompt tokens that
 * share nothing, one output token each, run twice on fresh schedulers (no
 * prefix tree carried over) over one persistent store in --cache-dir (a new
 * temporary directory, removed after, by default): cold computes and
 * spills, warm restores. Prints both times, the restore rate against the
 * prefill rate, and the bytes per stored token. Lines starting "figure:"
 * are the results. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/rng.h"
#include "bench/gpu/bench_util.h"
#include "engine/scheduler.h"
#include "kernels/be_cuda.h"
#include "store/pstore/pstore.h"

struct job_cb {
    int64_t tokens; /* generated so far */
    int64_t finished;
    int64_t total; /* requests */
    double t0, last_print;
};

static bool job_on_token(void *user, const struct sched_seq_info *info, int32_t tok)
{
    (void)info;
    (void)tok;
    ((struct job_cb *)user)->tokens++;
    return false; /* no stop: every request generates its full count */
}

static void job_on_finish(void *user, const struct sched_seq_info *info, enum sched_finish why)
{
    (void)info;
    (void)why;
    ((struct job_cb *)user)->finished++;
}

static uint64_t mix(uint64_t x) { return kvb_mix64(x); }

/* Prompt `r` of a set: `shared` tokens that every prompt of the set has,
 * then tokens of its own; `salt` tells sets apart. Ids avoid the first 256
 * (byte or special tokens of a real vocabulary). */
static void make_prompt(int32_t *p, int32_t len, int32_t shared, int64_t r, uint64_t salt, int32_t n_vocab)
{
    const uint64_t span = n_vocab > 512 ? (uint64_t)n_vocab - 256 : (uint64_t)n_vocab;
    const int32_t base = n_vocab > 512 ? 256 : 0;
    for (int32_t i = 0; i < len; i++) {
        const uint64_t who = i < shared ? salt : salt ^ mix((uint64_t)r + 1);
        p[i] = base + (int32_t)(mix(who * 0x9e3779b97f4a7c15ull + (uint64_t)i) % span);
    }
}

struct run_result {
    double wall_s;
    struct sched_stats st;
    int64_t tokens, finished;
    bool ok;
};

/* Submits n prompts (made by make_prompt) to a new scheduler over be and
 * runs it to the end, with a progress line on stderr. */
static struct run_result run_set(struct backend *be, const struct model *m, const char *what, int64_t n, int32_t len,
                                 int32_t shared, int32_t gen, uint64_t salt, int32_t max_batch, int32_t step_tokens,
                                 struct pstore *ps, const struct pstore_model *pm)
{
    struct run_result res = {0};
    struct job_cb cb_state = {.total = n};
    struct sched_callbacks cb = {.user = &cb_state, .on_token = job_on_token, .on_finish = job_on_finish};
    struct sched_opts so = {.max_batch = max_batch, .max_step_tokens = step_tokens, .n_ctx = len + gen + 1};
    struct sched *s = NULL;
    struct kvb_err err = {{0}};
    int32_t *p = kvb_malloc(sizeof(int32_t) * (size_t)len);
    if (!p || sched_create(be, m->hp.n_vocab, &so, &cb, &s, &err) != KVB_OK) {
        fprintf(stderr, "bench_gpu job: %s: %s\n", what, p ? err.msg : "out of memory");
        kvb_free(p);
        return res;
    }
    if (ps && sched_set_store(s, ps, pm) != KVB_OK)
        fprintf(stderr, "bench_gpu job: %s: no store: out of memory\n", what);
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.0f;
    for (int64_t r = 0; r < n; r++) {
        make_prompt(p, len, shared, r, salt, m->hp.n_vocab);
        if (sched_submit(s, (uint64_t)r, p, len, gen, &sp, 0, &err) != KVB_OK) {
            fprintf(stderr, "bench_gpu job: %s: request %lld: %s\n", what, (long long)r, err.msg);
            goto out;
        }
    }
    cb_state.t0 = cb_state.last_print = bench_now();
    while (!sched_idle(s)) {
        if (sched_step(s, &err) != KVB_OK) {
            fprintf(stderr, "\nbench_gpu job: %s: %s\n", what, err.msg);
            goto out;
        }
        const double t = bench_now();
        if (t - cb_state.last_print >= 2.0) {
            fprintf(stderr, "\r%s: %lld/%lld done, %lld tokens out, %.0f s   ", what, (long long)cb_state.finished,
                    (long long)n, (long long)cb_state.tokens, t - cb_state.t0);
            cb_state.last_print = t;
        }
    }
    res.wall_s = bench_now() - cb_state.t0;
    if (cb_state.last_print > cb_state.t0) fputc('\n', stderr);
    sched_get_stats(s, &res.st);
    res.tokens = cb_state.tokens;
    res.finished = cb_state.finished;
    res.ok = cb_state.finished == n;
    if (!res.ok)
        fprintf(stderr, "bench_gpu job: %s: %lld of %lld requests finished\n", what, (long long)cb_state.finished,
                (long long)n);
out:
    sched_free(s);
    kvb_free(p);
    return res;
}

static int cache_pair(struct backend *be, const struct model *m, int32_t n, int32_t len, int32_t max_batch,
                      int32_t step_tokens, const char *dir_opt)
{
    char tmp[] = "/tmp/kvb_bench_cache_XXXXXX";
    const char *dir = dir_opt;
    if (!dir) {
        if (!mkdtemp(tmp)) {
            perror("bench_gpu job: mkdtemp");
            return 1;
        }
        dir = tmp;
    }
    /* Room to queue every block of the cold run: a GPU computes them faster
     * than zstd compresses, and the warm run is to restore all of them (how
     * long the writing takes after the run is printed apart). */
    const uint64_t cold_bytes = (uint64_t)n * (uint64_t)(len / be->block_size) * (uint64_t)be->block_bytes;
    struct pstore_opts po = {
        .max_size = (uint64_t)64 << 30, .quiet = true, .queue_bytes = cold_bytes + ((uint64_t)64 << 20)};
    struct pstore *ps = NULL;
    struct kvb_err err = {{0}};
    if (pstore_open(dir, &po, &ps, &err) != KVB_OK) {
        fprintf(stderr, "bench_gpu job: cache in %s: %s\n", dir, err.msg);
        return 1;
    }
    const struct model_hparams *hp = &m->hp;
    struct pstore_model pm = {.name = m->name,
                              .dtype = PSTORE_DTYPE_F16,
                              .block_size = be->block_size,
                              .n_layer = hp->n_layer,
                              .kv_dim = hp->n_head_kv * hp->head_dim};
    memcpy(pm.fingerprint, m->fingerprint, sizeof pm.fingerprint);
    const uint64_t salt = 0xcac4e5a17ull;
    struct run_result cold = run_set(be, m, "cache cold", n, len, 0, 1, salt, max_batch, step_tokens, ps, &pm);
    const double f0 = bench_now();
    pstore_flush(ps); /* what a nightly run leaves behind before the next starts */
    const double flush_s = bench_now() - f0;
    struct run_result warm =
        cold.ok ? run_set(be, m, "cache warm", n, len, 0, 1, salt, max_batch, step_tokens, ps, &pm) : cold;
    struct pstore_stats pst;
    pstore_get_stats(ps, &pst);
    pstore_close(ps);
    if (!dir_opt) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "bench_gpu job: could not remove %s\n", tmp);
    }
    if (!cold.ok || !warm.ok) return 1;
    const double prompt_tok = (double)n * len;
    printf("figure: cache cold: %d prompts x %d tokens, %.2f s: %.0f prompt tokens/s computed (%lld computed); "
           "then %.2f s until the store had written %llu blocks (%.1f MB compressed, %.2fx; %llu not stored)\n",
           n, len, cold.wall_s, (double)cold.st.prefill_computed / cold.wall_s, (long long)cold.st.prefill_computed,
           flush_s, (unsigned long long)pst.blocks_written, (double)pst.bytes_written / 1e6,
           pst.bytes_written ? (double)pst.raw_bytes_written / (double)pst.bytes_written : 0.0,
           (unsigned long long)pst.blocks_dropped);
    printf("figure: cache warm: %.2f s (%.2fx faster than cold): %lld of %.0f prompt tokens restored at %.0f tokens/s "
           "(%.2f s reading and decoding; the device copies run beside compute), %lld computed\n",
           warm.wall_s, cold.wall_s / warm.wall_s, (long long)warm.st.store_tokens, prompt_tok,
           warm.st.store_load_s > 0 ? (double)warm.st.store_tokens / warm.st.store_load_s : 0.0, warm.st.store_load_s,
           (long long)warm.st.prefill_computed);
    const double restore = warm.st.store_load_s > 0 ? (double)warm.st.store_tokens / warm.st.store_load_s : 0;
    const double prefill = (double)cold.st.prefill_computed / cold.wall_s;
    printf("figure: cache (%d layers, hidden %d): restoring a token costs %.3g ms vs %.3g ms computing it: the "
           "store %s for this model (KV %.1f KiB per token; restore time scales with KV bytes, prefill with "
           "parameters)\n",
           hp->n_layer, hp->n_embd, restore > 0 ? 1e3 / restore : 0.0, 1e3 / prefill,
           restore > prefill ? "wins" : "LOSES", (double)be_block_bytes(m, 1, be->kv_type) / 1024.0);
    return 0;
}

int bench_cmd_job(int argc, char **argv)
{
    const int64_t n_req = bench_arg_int(argc, argv, "--requests", 1000);
    const int32_t len = (int32_t)bench_arg_int(argc, argv, "--prompt", 512);
    const int32_t prefix = (int32_t)bench_arg_int(argc, argv, "--prefix", 256);
    const int32_t gen = (int32_t)bench_arg_int(argc, argv, "--gen", 128);
    const int32_t max_batch = (int32_t)bench_arg_int(argc, argv, "--max-batch", 256);
    const int32_t step_tokens = (int32_t)bench_arg_int(argc, argv, "--step-tokens", 4096);
    const int32_t cache_n = (int32_t)bench_arg_int(argc, argv, "--cache-requests", 64);
    const double kv_gib = atof(bench_arg_str(argc, argv, "--kv-gib", "40"));
    const bool det = bench_arg_flag(argc, argv, "--deterministic");
    const bool graphs = bench_arg_flag(argc, argv, "--cuda-graphs");
    enum kv_type kt;
    if (!bench_arg_kv_type(argc, argv, &kt)) return 2;
    if (n_req < 0 || len <= 1 || (n_req > 0 && (prefix < 0 || prefix >= len)) || gen <= 0 || max_batch <= 0 ||
        kv_gib <= 0 || (n_req == 0 && cache_n <= 0)) {
        fprintf(stderr, "bench_gpu job: need --requests >= 0, --prompt > 1, 0 <= --prefix < --prompt, --gen > 0, "
                        "--max-batch > 0, --kv-gib > 0, and a job or a cache pair to run\n");
        return 2;
    }
    struct bench_model bm;
    const int rc_open = bench_open(argc, argv, &bm);
    if (rc_open != 0) return rc_open;
    const struct model *m = bm.m;
    const int32_t bs = 16;
    const int64_t block_bytes = be_block_bytes(m, bs, kt);
    int64_t n_blocks = (int64_t)(kv_gib * (double)(1 << 30)) / block_bytes;
    const int64_t need = ((int64_t)len + gen + bs) / bs;
    if (n_blocks < need) n_blocks = need;
    struct be_cuda_opts o = {.device = 0,
                             .block_size = bs,
                             .n_blocks = (int32_t)n_blocks,
                             .deterministic = det,
                             .graphs = graphs,
                             .kv_type = kt};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    double t0 = bench_now();
    if (be_cuda_create(m, &o, &be, &err) != KVB_OK) {
        fprintf(stderr, "bench_gpu job: %s\n", err.msg);
        bench_model_close(&bm);
        return 1;
    }
    printf("upload %.1f s; KV pool %lld blocks of %d tokens = %.1f GiB (KV %s); %d host threads sample\n",
           bench_now() - t0, (long long)n_blocks, bs, (double)n_blocks * (double)block_bytes / (1 << 30),
           kv_type_name(kt), be->n_threads);
    const char *mode = det ? (graphs ? "deterministic, graphs" : "deterministic") : graphs ? "graphs" : "default";
    int rc = 0;
    struct run_result r = {.ok = true};
    if (n_req > 0) r = run_set(be, m, "job", n_req, len, prefix, gen, 0x5eedull, max_batch, step_tokens, NULL, NULL);
    if (!r.ok) {
        rc = 1;
    } else if (n_req > 0) {
        const double out_tok = (double)r.tokens, prompt_tok = (double)n_req * len;
        printf("figure: [%s] job: %lld requests x (%d prompt, %d shared + %d output) in %.2f s: %.0f output tokens/s, "
               "%.0f total tokens/s (for scale: vLLM BF16 on H100 ~12.5k, TensorRT-LLM FP8 on H200 ~17.7k output "
               "tokens/s on Llama-3.1-8B)\n",
               mode, (long long)n_req, len, prefix, gen, r.wall_s, out_tok / r.wall_s,
               (out_tok + prompt_tok) / r.wall_s);
        printf("figure: [%s] job: prefill computed %lld of %.0f prompt tokens (%lld from the prefix tree); %lld steps, "
               "mean %.1f tokens per step\n",
               mode, (long long)r.st.prefill_computed, prompt_tok, (long long)r.st.cached_tokens, (long long)r.st.steps,
               (double)(r.st.prefill_computed + r.st.decode_tokens) / (double)(r.st.steps ? r.st.steps : 1));
        if (graphs) {
            const char *off = NULL;
            const int64_t launches = be_cuda_graph_launches(be, &off);
            printf("figure: [%s] job: %lld of %lld steps from CUDA graphs%s%s\n", mode, (long long)launches,
                   (long long)r.st.steps, off ? "; graphs off: " : "", off ? off : "");
        }
    }
    if (cache_n > 0 && rc == 0)
        rc = cache_pair(be, m, cache_n, len, max_batch, step_tokens, bench_arg_str(argc, argv, "--cache-dir", NULL));
    be_free(be);
    bench_model_close(&bm);
    return rc;
}
