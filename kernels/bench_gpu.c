/* bench_gpu.c — the GPU benchmark: times the CUDA backend directly (no
 * scheduler, no tokenizer) and prints each figure beside its bound.
 *
 *   bench_gpu bench [--model PATH] [--layers N] [--embd N] [--ff N] [--heads N] [--kv-heads N] [--vocab N]
 *                   [--ctx N] [--batch N] [--prefill-seqs N] [--prefill-len N] [--steps N] [--deterministic]
 *                   [--peak-tflops X]
 *       Without --model, the model is built in memory, no file: Llama-3-8B's
 *       shape by default (32 layers, hidden 4096, 32/8 heads, FFN 14336,
 *       vocab 128256, untied head) with random bf16 weights (every layer
 *       shares one set of host matrices; each gets its own device copy).
 *       Measures: the bf16 GEMM rate of this GPU (cuBLAS, large shapes);
 *       prefill tokens/s of prefill-seqs x prefill-len tokens in one step,
 *       as TFLOP/s and as a share of that GEMM rate; decode step time at
 *       batch 1 and at --batch, each sequence at position --ctx, against the
 *       HBM bound = bytes read per step / 4.8 TB/s (H200), the bytes being
 *       every weight once plus each sequence's K/V. --deterministic repeats
 *       the figures in be_cuda's deterministic mode; --peak-tflops takes the
 *       GEMM rate as given instead of measuring it.
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

#include "alloc.h"
#include "backend.h"
#include "be_cuda.h"
#include "kernels.h"
#include "dtype.h"
#include "model.h"
#include "synth.h"

#define HBM_BYTES_PER_S 4.8e12 /* H200 */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long arg_int(int argc, char **argv, const char *name, long def)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return strtol(argv[i + 1], NULL, 10);
    return def;
}

static const char *arg_str(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

static bool arg_flag(int argc, char **argv, const char *name)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
}

static int cmd_synth(int argc, char **argv)
{
    struct synth_opts o;
    synth_opts_default(&o);
    o.n_layer = (int32_t)arg_int(argc, argv, "--layers", 32);
    o.n_embd = (int32_t)arg_int(argc, argv, "--embd", 4096);
    o.n_ff = (int32_t)arg_int(argc, argv, "--ff", 14336);
    o.n_head = (int32_t)arg_int(argc, argv, "--heads", 32);
    o.n_head_kv = (int32_t)arg_int(argc, argv, "--kv-heads", 8);
    o.n_ctx = 8192;
    const char *type = arg_str(argc, argv, "--type", "bf16");
    enum ggml_type t = !strcmp(type, "f16") ? GGML_TYPE_F16 : !strcmp(type, "q8_0") ? GGML_TYPE_Q8_0 : GGML_TYPE_BF16;
    o.matrix_type = o.embd_type = t;
    o.tied_output = 0;
    struct kvb_err err = {{0}};
    double t0 = now_s();
    if (synth_model_write(argv[2], &o, &err) != KVB_OK) {
        fprintf(stderr, "bench_gpu synth: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %d layers, hidden %d, %d heads / %d KV heads, FFN %d, vocab 259, %s, in %.1f s\n", argv[2],
           o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_ff, type, now_s() - t0);
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
        double t0 = now_s();
        for (int r = 0; r < reps; r++) kcu_gemm_bf16(h, y, x, w, n_tok, n_in, n_out);
        cudaDeviceSynchronize();
        const double dt = (now_s() - t0) / reps, rate = 2.0 * (double)n_tok * n_in * n_out / dt;
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
        b->seqs[s] = (struct be_seq){.tokens = b->tokens + (int64_t)s * n_new, .n_tokens = n_new, .pos = pos,
                                     .block_table = b->tables + (int64_t)s * per_seq, .n_blocks = per_seq,
                                     .logits = BE_LOGITS_LAST};
}

static void batch_free(struct bench_batch *b)
{
    kvb_free(b->seqs);
    kvb_free(b->tokens);
    kvb_free(b->tables);
}

/* Seconds per forward call of `batch`, after one warm-up call. */
static double time_steps(struct backend *be, const struct be_batch *batch, int steps, float *logits, int *failed)
{
    struct kvb_err err = {{0}};
    if (be->forward(be, batch, logits, &err) != KVB_OK) {
        fprintf(stderr, "forward: %s\n", err.msg);
        *failed = 1;
        return 0;
    }
    double t0 = now_s();
    for (int i = 0; i < steps; i++)
        if (be->forward(be, batch, logits, &err) != KVB_OK) {
            fprintf(stderr, "forward: %s\n", err.msg);
            *failed = 1;
            return 0;
        }
    return (now_s() - t0) / steps;
}

static int run_mode(const struct model *m, bool det, int32_t ctx, int32_t batch, int32_t pf_seqs, int32_t pf_len,
                    int steps, double peak)
{
    const struct model_hparams *hp = &m->hp;
    const int32_t bs = 16;
    const char *mode = det ? "deterministic" : "default";
    const int32_t per_seq_dec = (ctx + 1 + bs - 1) / bs, per_seq_pf = (pf_len + bs - 1) / bs;
    int32_t n_blocks = batch * per_seq_dec;
    if (pf_seqs * per_seq_pf > n_blocks) n_blocks = pf_seqs * per_seq_pf;
    const int64_t kv_tok = be_cpu_block_bytes(m, 1); /* K+V bytes of one position, all layers */
    const int64_t w_bytes = be_cuda_weight_bytes(m);
    printf("[%s] weights %.2f GiB on device, KV pool %d blocks = %.2f GiB\n", mode, (double)w_bytes / (1 << 30),
           n_blocks, (double)n_blocks * bs * kv_tok / (1 << 30));
    struct be_cuda_opts o = {.device = 0, .block_size = bs, .n_blocks = n_blocks, .deterministic = det};
    struct backend *be = NULL;
    struct kvb_err err = {{0}};
    double t0 = now_s();
    if (be_cuda_create(m, &o, &be, &err) != KVB_OK) {
        fprintf(stderr, "be_cuda_create: %s\n", err.msg);
        return 1;
    }
    printf("[%s] upload %.1f s\n", mode, now_s() - t0);
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
        struct be_batch bb = {b.seqs, pf_seqs, NULL};
        const double dt = time_steps(be, &bb, 3, logits, &failed);
        const double toks = (double)pf_seqs * pf_len;
        /* attention: q·k and p·v over the causal triangle, per layer and head */
        const double attn = 4.0 * hp->head_dim * hp->n_head * hp->n_layer * pf_seqs * (double)pf_len * (pf_len + 1) / 2;
        const double flop = 2.0 * body_params * toks + 2.0 * head_params * pf_seqs + attn;
        if (!failed) {
            printf("figure: [%s] prefill %d x %d tokens: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s = %.0f%% of the "
                   "measured bf16 GEMM rate %.1f TFLOP/s (target >= 50%%)\n", mode, pf_seqs, pf_len, dt * 1e3,
                   toks / dt, flop / dt / 1e12, peak > 0 ? 100.0 * flop / dt / peak : 0.0, peak / 1e12);
        }
        batch_free(&b);
    }
    /* Decode: one token per sequence at position ctx. */
    const int32_t sizes[2] = {1, batch};
    for (int k = 0; k < 2 && !failed; k++) {
        const int32_t n = sizes[k];
        struct bench_batch b;
        batch_make(&b, n, 1, ctx, per_seq_dec, hp->n_vocab);
        struct be_batch bb = {b.seqs, n, NULL};
        const double dt = time_steps(be, &bb, steps, logits, &failed);
        /* Bytes a step must read at least: every weight once (but of the
         * embedding table only the rows looked up, when the head is not the
         * same matrix), plus each sequence's K/V for ctx + 1 positions. */
        const double embd = m->output.data == m->tok_embd.data ? 0.0 : 2.0 * hp->n_vocab * hp->n_embd;
        const double bytes = (double)w_bytes - embd + (double)n * (ctx + 1) * (double)kv_tok;
        const double bound = bytes / HBM_BYTES_PER_S;
        if (!failed)
            printf("figure: [%s] decode batch %d at context %d: %.3f ms/step (%.0f tokens/s); HBM bound %.3f ms "
                   "(%.2f GB / 4.8 TB/s) -> %.2fx the bound%s\n", mode, n, ctx, dt * 1e3, n / dt, bound * 1e3,
                   bytes / 1e9, dt / bound, n == 1 ? " (target <= 1.5x)" : "");
        batch_free(&b);
    }
    kvb_free(logits);
    be_free(be);
    return failed;
}

/* ---- an in-memory model ------------------------------------------------------------ */

/* Host side of an in-memory bf16 model: one set of matrices that every
 * layer points to (be_cuda uploads each layer separately anyway), so that a
 * 16 GB model costs 0.4 GB of host memory and no disk. */
struct mem_model {
    struct model m;
    uint16_t *bufs[8];
    float *ones;
};

static uint16_t *rand_bf16(int64_t n, float sigma, uint64_t seed)
{
    uint16_t *p = kvb_malloc(sizeof(uint16_t) * (size_t)n);
    if (!p) return NULL;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    const float u = sigma * 1.7320508f / 2147483648.0f; /* uniform on [-u, u]: std sigma */
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = kvb_f32_to_bf16(u * (float)(int32_t)(uint32_t)x);
    }
    return p;
}

static struct mm_weight bf16_weight(const uint16_t *data, int64_t n_in, int64_t n_out)
{
    return (struct mm_weight){.type = GGML_TYPE_BF16, .n_in = n_in, .n_out = n_out, .data = data,
                              .row_bytes = (size_t)n_in * 2};
}

static void mem_model_free(struct mem_model *mm)
{
    if (!mm) return;
    for (int i = 0; i < 8; i++) kvb_free(mm->bufs[i]);
    kvb_free(mm->ones);
    kvb_free(mm->m.layers);
    kvb_free(mm);
}

static struct mem_model *mem_model_create(int32_t n_layer, int32_t e, int32_t ff, int32_t n_head, int32_t n_head_kv,
                                          int32_t n_vocab)
{
    struct mem_model *mm = kvb_calloc(1, sizeof *mm);
    if (!mm) return NULL;
    struct model *m = &mm->m;
    const int32_t hd = e / n_head;
    m->arch = MODEL_ARCH_LLAMA;
    m->hp = (struct model_hparams){.n_vocab = n_vocab, .n_ctx_train = 8192, .n_embd = e, .n_ff = ff,
                                   .n_layer = n_layer, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd,
                                   .rope_dim = hd, .rope_base = 500000.0f, .rms_eps = 1e-5f, .rope = ROPE_NORM};
    snprintf(m->name, sizeof m->name, "in-memory bf16 model (%d layers, hidden %d)", n_layer, e);
    const int64_t qd = (int64_t)n_head * hd, kvd = (int64_t)n_head_kv * hd;
    const float si = 1.0f / sqrtf((float)e), sf = 1.0f / sqrtf((float)ff);
    mm->bufs[0] = rand_bf16(qd * e, si, 1);
    mm->bufs[1] = rand_bf16(kvd * e, si, 2);
    mm->bufs[2] = rand_bf16(kvd * e, si, 3);
    mm->bufs[3] = rand_bf16(e * qd, 1.0f / sqrtf((float)qd), 4);
    mm->bufs[4] = rand_bf16((int64_t)ff * e, si, 5);
    mm->bufs[5] = rand_bf16((int64_t)e * ff, sf, 6);
    mm->bufs[6] = rand_bf16((int64_t)n_vocab * e, 1.0f, 7);
    mm->bufs[7] = rand_bf16((int64_t)n_vocab * e, si, 8);
    mm->ones = kvb_malloc(sizeof(float) * (size_t)e);
    m->layers = kvb_calloc((size_t)n_layer, sizeof *m->layers);
    bool ok = mm->ones && m->layers;
    for (int i = 0; i < 8; i++) ok = ok && mm->bufs[i];
    if (!ok) {
        mem_model_free(mm);
        return NULL;
    }
    for (int32_t i = 0; i < e; i++) mm->ones[i] = 1.0f;
    for (int32_t l = 0; l < n_layer; l++) {
        struct model_layer *L = &m->layers[l];
        L->attn_norm = L->ffn_norm = mm->ones;
        L->wq = bf16_weight(mm->bufs[0], e, qd);
        L->wk = bf16_weight(mm->bufs[1], e, kvd);
        L->wv = bf16_weight(mm->bufs[2], e, kvd);
        L->wo = bf16_weight(mm->bufs[3], qd, e);
        L->w_gate = bf16_weight(mm->bufs[4], e, ff);
        L->w_up = bf16_weight(mm->bufs[4], e, ff); /* same values as gate: only timing matters */
        L->w_down = bf16_weight(mm->bufs[5], ff, e);
    }
    m->tok_embd = bf16_weight(mm->bufs[6], e, n_vocab);
    m->output = bf16_weight(mm->bufs[7], e, n_vocab);
    m->output_norm = mm->ones;
    return mm;
}

static int cmd_bench(int argc, char **argv)
{
    const int32_t ctx = (int32_t)arg_int(argc, argv, "--ctx", 512);
    const int32_t batch = (int32_t)arg_int(argc, argv, "--batch", 256);
    const int32_t pf_seqs = (int32_t)arg_int(argc, argv, "--prefill-seqs", 8);
    const int32_t pf_len = (int32_t)arg_int(argc, argv, "--prefill-len", 512);
    const int steps = (int)arg_int(argc, argv, "--steps", 10);
    char why[256];
    if (!be_cuda_available(0, why, sizeof why)) {
        fprintf(stderr, "bench_gpu: no CUDA device: %s\n", why);
        return 77;
    }
    printf("device 0: %s, %.1f GiB free\n", why, (double)be_cuda_free_memory(0) / (1 << 30));
    struct model *file_model = NULL;
    struct mem_model *mem = NULL;
    const struct model *m;
    struct kvb_err err = {{0}};
    double t0 = now_s();
    const char *path = arg_str(argc, argv, "--model", NULL);
    if (path) {
        if (model_load(path, &file_model, &err) != KVB_OK) {
            fprintf(stderr, "bench_gpu: %s\n", err.msg);
            return 1;
        }
        m = file_model;
    } else {
        mem = mem_model_create((int32_t)arg_int(argc, argv, "--layers", 32), (int32_t)arg_int(argc, argv, "--embd", 4096),
                               (int32_t)arg_int(argc, argv, "--ff", 14336), (int32_t)arg_int(argc, argv, "--heads", 32),
                               (int32_t)arg_int(argc, argv, "--kv-heads", 8),
                               (int32_t)arg_int(argc, argv, "--vocab", 128256));
        if (!mem) {
            fprintf(stderr, "bench_gpu: out of host memory for the model\n");
            return 1;
        }
        m = &mem->m;
    }
    const struct model_hparams *hp = &m->hp;
    printf("model %s: %d layers, hidden %d, %d/%d heads, FFN %d, vocab %d (ready in %.1f s)\n", path ? path : m->name,
           hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab, now_s() - t0);
    if (hp->n_vocab != 128256)
        printf("figure: NOTE: vocab %d, not Llama 3's 128256: the head and embedding differ from the real model's\n",
               hp->n_vocab);
    if (hp->n_layer != 32)
        printf("figure: NOTE: %d layers, not 32: per-step times scale about linearly with the layer count\n",
               hp->n_layer);
    const char *given = arg_str(argc, argv, "--peak-tflops", NULL); /* skip the measurement */
    const double peak = given ? atof(given) * 1e12 : gemm_peak();
    printf("figure: bf16 GEMM rate (cuBLAS, best of 3 large shapes): %.1f TFLOP/s\n", peak / 1e12);
    int rc = run_mode(m, false, ctx, batch, pf_seqs, pf_len, steps, peak);
    if (arg_flag(argc, argv, "--deterministic")) rc |= run_mode(m, true, ctx, batch, pf_seqs, pf_len, steps, peak);
    model_free(file_model);
    mem_model_free(mem);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "synth")) return cmd_synth(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    fprintf(stderr, "usage: bench_gpu bench [--model PATH | --layers 32 --embd 4096 --ff 14336 --heads 32 --kv-heads 8 "
                    "--vocab 128256]\n"
                    "                       [--ctx 512 --batch 256 --prefill-seqs 8 --prefill-len 512 --steps 10 "
                    "--deterministic --peak-tflops X]\n"
                    "       bench_gpu synth PATH [--layers N --embd N --ff N --heads N --kv-heads N --type bf16]\n");
    return 2;
}
