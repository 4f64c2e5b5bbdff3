/* bench_gpu.c — the GPU benchmark: `bench` times the CUDA backend's steps
 * directly (no scheduler, no tokenizer) and prints each figure beside its
 * bound; `job` (bench_job.c) runs the offline job through the scheduler.
 *
 *   bench_gpu bench [--model PATH] [--layers N] [--embd N] [--ff N] [--heads N] [--kv-heads N] [--vocab N]
 *                   [--ctx N] [--batch N] [--prefill-seqs N] [--prefill-len N] [--steps N] [--deterministic]
 *                   [--peak-tflops X]
 *       Without --model, the model is built in memory, no file: Llama-3-8B's
 *       shape by default (32 layers, hidden 4096, 32/8 heads, FFN 14336,
 *       vocab 128256, untied head) with random bf16 weights (every layer
 *       shares one set of host matrices; each gets its own device copy).
 *       Measures: the bf16 GEMM rate of this GPU (cuBLAS, large shapes);
 *       one layer's attention by each kernel (bench_attn.c); prefill tokens/s of prefill-seqs x prefill-len tokens in one step,
 *       as TFLOP/s and as a share of that GEMM rate; decode step time at
 *       batch 1 and at --batch, each sequence at position --ctx, against the
 *       HBM bound = bytes read per step / 4.8 TB/s (H200), the bytes being
 *       every weight once plus each sequence's K/V. --deterministic repeats
 *       the figures in be_cuda's deterministic mode; --peak-tflops takes the
 *       GEMM rate as given instead of measuring it.
 *   bench_gpu job …
 *       the offline job through the scheduler, and the persistent cache
 *       cold/warm pair (bench_job.c).
 *   bench_gpu synth PATH [--layers N] [--embd N] [--ff N] [--heads N] [--kv-heads N] [--type bf16|f16|q8_0]
 *       writes a synthetic GGUF (synth.h: vocabulary of 259 byte tokens)
 *       for runs through `kvbatch run`.
 *
 * Lines that begin with "figure:" are the results (scripts/bench-gpu.sh
 * collects them). Built only with -DKVBATCH_CUDA=ON. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "bench/gpu/bench_util.h"
#include "kernels/be_cuda.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "support/synth.h"

#define HBM_BYTES_PER_S 4.8e12 /* H200 */

static int cmd_synth(int argc, char **argv)
{
    struct synth_opts o;
    synth_opts_default(&o);
    o.n_layer = (int32_t)bench_arg_int(argc, argv, "--layers", 32);
    o.n_embd = (int32_t)bench_arg_int(argc, argv, "--embd", 4096);
    o.n_ff = (int32_t)bench_arg_int(argc, argv, "--ff", 14336);
    o.n_head = (int32_t)bench_arg_int(argc, argv, "--heads", 32);
    o.n_head_kv = (int32_t)bench_arg_int(argc, argv, "--kv-heads", 8);
    o.n_ctx = 8192;
    const char *type = bench_arg_str(argc, argv, "--type", "bf16");
    enum ggml_type t = !strcmp(type, "f16") ? GGML_TYPE_F16 : !strcmp(type, "q8_0") ? GGML_TYPE_Q8_0 : GGML_TYPE_BF16;
    o.matrix_type = o.embd_type = t;
    o.tied_output = 0;
    struct kvb_err err = {{0}};
    double t0 = bench_now();
    if (synth_model_write(argv[2], &o, &err) != KVB_OK) {
        fprintf(stderr, "bench_gpu synth: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %d layers, hidden %d, %d heads / %d KV heads, FFN %d, vocab 259, %s, in %.1f s\n", argv[2],
           o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_ff, type, bench_now() - t0);
    return 0;
}

/* The best bf16 GEMM rate cuBLAS reaches on this GPU over a few large
 * shapes, in FLOP/s: the reference for the prefill figure. */
static double gemm_peak(void)
{
    const int64_t shapes[][3] = {{8192, 8192, 8192}, {4096, 4096, 14336}, {4096, 14336, 4096}}; /* tok, in, out */
    double best = 0;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t n_tok = shapes[s][0], n_in = shapes[s][1], n_out = shapes[s][2];
        uint16_t *x = NULL, *w = NULL;
        float *y = NULL;
        if (cudaMalloc((void **)&x, (size_t)(n_tok * n_in) * 2) != cudaSuccess ||
            cudaMalloc((void **)&w, (size_t)(n_out * n_in) * 2) != cudaSuccess ||
            cudaMalloc((void **)&y, (size_t)(n_tok * n_out) * 4) != cudaSuccess) {
            cudaFree(x);
            cudaFree(w);
            cudaGetLastError();
            continue;
        }
        cudaMemset(x, 0x3c, (size_t)(n_tok * n_in) * 2); /* bf16 0x3c3c ~ 0.0115: finite, nonzero */
        cudaMemset(w, 0x3c, (size_t)(n_out * n_in) * 2);
        kcu_gemm_bf16(h, y, x, w, n_tok, n_in, n_out); /* warm-up, picks the algorithm */
        cudaDeviceSynchronize();
        const int reps = 10;
        double t0 = bench_now();
        for (int r = 0; r < reps; r++) kcu_gemm_bf16(h, y, x, w, n_tok, n_in, n_out);
        cudaDeviceSynchronize();
        const double dt = (bench_now() - t0) / reps, rate = 2.0 * (double)n_tok * n_in * n_out / dt;
        printf("  cuBLAS bf16 GEMM %lldx%lldx%lld: %.3f ms, %.1f TFLOP/s\n", (long long)n_tok, (long long)n_in,
               (long long)n_out, dt * 1e3, rate / 1e12);
        if (rate > best) best = rate;
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
    }
    cublasDestroy(h);
    return best;
}

/* n_seq sequences, each n_new tokens at position pos, sequence s owning
 * blocks [s * per_seq, (s + 1) * per_seq). */
struct bench_batch {
    struct be_seq *seqs;
    int32_t *tokens, *tables;
};

static void batch_make(struct bench_batch *b, int32_t n_seq, int32_t n_new, int32_t pos, int32_t per_seq,
                       int32_t n_vocab)
{
    b->seqs = kvb_calloc((size_t)n_seq, sizeof *b->seqs);
    b->tokens = kvb_malloc(sizeof(int32_t) * (size_t)n_seq * n_new);
    b->tables = kvb_malloc(sizeof(int32_t) * (size_t)n_seq * per_seq);
    for (int64_t i = 0; i < (int64_t)n_seq * n_new; i++) b->tokens[i] = (int32_t)((i * 31 + 7) % n_vocab);
    for (int64_t i = 0; i < (int64_t)n_seq * per_seq; i++) b->tables[i] = (int32_t)i;
    for (int32_t s = 0; s < n_seq; s++)
        b->seqs[s] = (struct be_seq){.tokens = b->tokens + (int64_t)s * n_new,
                                     .n_tokens = n_new,
                                     .pos = pos,
                                     .block_table = b->tables + (int64_t)s * per_seq,
                                     .n_blocks = per_seq,
                                     .logits = BE_LOGITS_LAST};
}

static void batch_free(struct bench_batch *b)
{
    kvb_free(b->seqs);
    kvb_free(b->tokens);
    kvb_free(b->tables);
}

/* Seconds per forward call of `batch`, after `warm` untimed calls (two
 * with graphs: the first runs as usual, the second captures). */
static double time_steps(struct backend *be, const struct be_batch *batch, int warm, int steps, float *logits,
                         int *failed)
{
    struct kvb_err err = {{0}};
    for (int i = 0; i < warm; i++)
        if (be->forward(be, batch, logits, &err) != KVB_OK) {
            fprintf(stderr, "forward: %s\n", err.msg);
            *failed = 1;
            return 0;
        }
    double t0 = bench_now();
    for (int i = 0; i < steps; i++)
        if (be->forward(be, batch, logits, &err) != KVB_OK) {
            fprintf(stderr, "forward: %s\n", err.msg);
            *failed = 1;
            return 0;
        }
    return (bench_now() - t0) / steps;
}

static int run_mode(const struct model *m, bool det, enum kv_type kt, int32_t ctx, int32_t batch, int32_t pf_seqs,
                    int32_t pf_len, int steps, double peak)
{
    const struct model_hparams *hp = &m->hp;
    const int32_t bs = 16;
    const char *mode = det ? "deterministic" : "default";
    const int32_t per_seq_dec = (ctx + 1 + bs - 1) / bs, per_seq_pf = (pf_len + bs - 1) / bs;
    int32_t n_blocks = batch * per_seq_dec;
    if (pf_seqs * per_seq_pf > n_blocks) n_blocks = pf_seqs * per_seq_pf;
    const int64_t kv_tok = be_block_bytes(m, 1, kt); /* K+V bytes of one position, all layers */
    const int64_t w_bytes = be_cuda_weight_bytes(m);
    printf("[%s] weights %.2f GiB on device, KV pool %d blocks = %.2f GiB (KV %s)\n", mode, (double)w_bytes / (1 << 30),
           n_blocks, (double)n_blocks * bs * kv_tok / (1 << 30), kv_type_name(kt));
    struct be_cuda_opts o = {.device = 0, .block_size = bs, .n_blocks = n_blocks, .deterministic = det, .kv_type = kt};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    double t0 = bench_now();
    if (be_cuda_create(m, &o, &be, &err) != KVB_OK) {
        fprintf(stderr, "be_cuda_create: %s\n", err.msg);
        return 1;
    }
    printf("[%s] upload %.1f s\n", mode, bench_now() - t0);
    int failed = 0;
    const int32_t max_seqs = batch > pf_seqs ? batch : pf_seqs;
    float *logits = kvb_malloc(sizeof(float) * (size_t)max_seqs * hp->n_vocab);

    /* Matmul parameters touched per token (every GEMM; the head counted for
     * the one logits row per sequence). */
    const double e = hp->n_embd, qd = (double)hp->n_head * hp->head_dim, kvd = (double)hp->n_head_kv * hp->head_dim;
    const double layer_params = e * (qd + 2 * kvd) + qd * e + 3.0 * e * hp->n_ff;
    const double body_params = layer_params * hp->n_layer, head_params = e * hp->n_vocab;

    /* Prefill: pf_seqs sequences of pf_len tokens in one step. */
    {
        struct bench_batch b;
        batch_make(&b, pf_seqs, pf_len, 0, per_seq_pf, hp->n_vocab);
        struct be_batch bb = {b.seqs, pf_seqs, NULL, NULL};
        const double dt = time_steps(be, &bb, 1, 3, logits, &failed);
        const double toks = (double)pf_seqs * pf_len;
        /* attention: q·k and p·v over the causal triangle, per layer and head */
        const double attn = 4.0 * hp->head_dim * hp->n_head * hp->n_layer * pf_seqs * (double)pf_len * (pf_len + 1) / 2;
        const double flop = 2.0 * body_params * toks + 2.0 * head_params * pf_seqs + attn;
        if (!failed) {
            printf("figure: [%s] prefill %d x %d tokens: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s = %.0f%% of the "
                   "measured bf16 GEMM rate %.1f TFLOP/s (target >= 50%%)\n",
                   mode, pf_seqs, pf_len, dt * 1e3, toks / dt, flop / dt / 1e12,
                   peak > 0 ? 100.0 * flop / dt / peak : 0.0, peak / 1e12);
        }
        batch_free(&b);
    }
    /* Decode: one token per sequence at position ctx, each choosing its
     * next token greedily on the device (as the engine does for greedy
     * requests); without, then with CUDA graphs. */
    const int32_t sizes[2] = {1, batch};
    int32_t *amax = kvb_malloc(sizeof(int32_t) * (size_t)batch);
    for (int k = 0; k < 4 && !failed && amax; k++) {
        const int32_t n = sizes[k % 2];
        const bool graphs = k >= 2;
        be_cuda_set_graphs(be, graphs);
        struct bench_batch b;
        batch_make(&b, n, 1, ctx, per_seq_dec, hp->n_vocab);
        for (int32_t i = 0; i < n; i++) b.seqs[i].logits = BE_LOGITS_ARGMAX;
        struct be_batch bb = {b.seqs, n, amax, NULL};
        const double dt = time_steps(be, &bb, graphs ? 2 : 1, steps, logits, &failed);
        const char *off = NULL;
        const int64_t launches = be_cuda_graph_launches(be, &off);
        /* Bytes a step must read at least: every weight once (but of the
         * embedding table only the rows looked up, when the head is not the
         * same matrix), plus each sequence's K/V for ctx + 1 positions. */
        const double embd = m->output.data == m->tok_embd.data ? 0.0 : 2.0 * hp->n_vocab * hp->n_embd;
        const double bytes = (double)w_bytes - embd + (double)n * (ctx + 1) * (double)kv_tok;
        const double bound = bytes / HBM_BYTES_PER_S;
        if (!failed)
            printf("figure: [%s%s] decode batch %d at context %d: %.3f ms/step (%.0f tokens/s); HBM bound %.3f ms "
                   "(%.2f GB / 4.8 TB/s) -> %.2fx the bound%s\n",
                   mode, graphs ? ", graphs" : "", n, ctx, dt * 1e3, n / dt, bound * 1e3, bytes / 1e9, dt / bound,
                   n == 1 ? " (target <= 1.5x)" : "");
        if (graphs && !failed)
            printf("figure: [%s, graphs] %lld of %d timed steps from a graph%s%s\n", mode, (long long)launches,
                   steps + 1, off ? "; graphs off: " : "", off ? off : "");
        batch_free(&b);
    }
    kvb_free(amax);
    kvb_free(logits);
    be_free(be);
    return failed;
}

static int cmd_bench(int argc, char **argv)
{
    const int32_t ctx = (int32_t)bench_arg_int(argc, argv, "--ctx", 512);
    const int32_t batch = (int32_t)bench_arg_int(argc, argv, "--batch", 256);
    const int32_t pf_seqs = (int32_t)bench_arg_int(argc, argv, "--prefill-seqs", 8);
    const int32_t pf_len = (int32_t)bench_arg_int(argc, argv, "--prefill-len", 512);
    const int steps = (int)bench_arg_int(argc, argv, "--steps", 10);
    enum kv_type kt;
    if (!bench_arg_kv_type(argc, argv, &kt)) return 2;
    struct bench_model bm;
    const int rc_open = bench_open(argc, argv, &bm);
    if (rc_open != 0) return rc_open;
    const char *given = bench_arg_str(argc, argv, "--peak-tflops", NULL); /* skip the measurement */
    const double peak = given ? atof(given) * 1e12 : gemm_peak();
    printf("figure: bf16 GEMM rate (cuBLAS, best of 3 large shapes): %.1f TFLOP/s\n", peak / 1e12);
    int rc = bench_attn(&bm.m->hp, pf_seqs, pf_len, batch, ctx);
    rc |= run_mode(bm.m, false, kt, ctx, batch, pf_seqs, pf_len, steps, peak);
    if (bench_arg_flag(argc, argv, "--deterministic"))
        rc |= run_mode(bm.m, true, kt, ctx, batch, pf_seqs, pf_len, steps, peak);
    bench_model_close(&bm);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "synth")) return cmd_synth(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "job")) return bench_cmd_job(argc, argv);
    fprintf(stderr,
            "usage: bench_gpu bench [--model PATH | --layers 32 --embd 4096 --ff 14336 --heads 32 --kv-heads 8 "
            "--vocab 128256]\n"
            "                       [--ctx 512 --batch 256 --prefill-seqs 8 --prefill-len 512 --steps 10 "
            "--deterministic --peak-tflops X --kv-type f16|q8|q4]\n"
            "       bench_gpu job [model options as bench] [--requests 1000 --prompt 512 --prefix 256 --gen 128\n"
            "                     --max-batch 256 --step-tokens 4096 --kv-gib 40 --cache-requests 64 "
            "--cache-dir DIR --deterministic --cuda-graphs --kv-type f16|q8|q4]\n"
            "       bench_gpu synth PATH [--layers N --embd N --ff N --heads N --kv-heads N --type bf16]\n");
    return 2;
}
