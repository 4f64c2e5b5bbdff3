/* bench_util.c — see bench_util.h. */
#include "bench/gpu/bench_util.h"
#include "base/clock.h"
#include "base/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/be_cuda.h"

double bench_now(void) { return kvb_clock_s(); }

long bench_arg_int(int argc, char **argv, const char *name, long def)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return strtol(argv[i + 1], NULL, 10);
    return def;
}

const char *bench_arg_str(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

bool bench_arg_kv_type(int argc, char **argv, enum kv_type *out)
{
    const char *s = bench_arg_str(argc, argv, "--kv-type", "f16");
    if (kv_type_parse(s, out)) return true;
    fprintf(stderr, "bench_gpu: --kv-type %s: expected f16, q8 or q4\n", s);
    return false;
}

bool bench_arg_flag(int argc, char **argv, const char *name)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
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
        kvb_xorshift64(&x);
        p[i] = kvb_f32_to_bf16(u * (float)(int32_t)(uint32_t)x);
    }
    return p;
}

static struct mm_weight bf16_weight(const uint16_t *data, int64_t n_in, int64_t n_out)
{
    return (struct mm_weight){
        .type = GGML_TYPE_BF16, .n_in = n_in, .n_out = n_out, .data = data, .row_bytes = (size_t)n_in * 2};
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
    m->hp = (struct model_hparams){.n_vocab = n_vocab,
                                   .n_ctx_train = 8192,
                                   .n_embd = e,
                                   .n_ff = ff,
                                   .n_layer = n_layer,
                                   .n_head = n_head,
                                   .n_head_kv = n_head_kv,
                                   .head_dim = hd,
                                   .rope_dim = hd,
                                   .rope_base = 500000.0f,
                                   .rms_eps = 1e-5f,
                                   .rope = ROPE_NORM};
    m->ops = (struct model_ops){.act = MODEL_ACT_SILU, .embd_scale = 1.0f, .attn_scale = 1.0f / sqrtf((float)hd)};
    snprintf(m->name, sizeof m->name, "in-memory bf16 model (%d layers, hidden %d)", n_layer, e);
    /* Random weights from fixed seeds: the shape is the identity (for the
     * persistent cache's keys). */
    snprintf(m->fingerprint, sizeof m->fingerprint, "bec%05x%06x%04x%04x%04x%06x", (unsigned)n_layer & 0xfffff,
             (unsigned)e & 0xffffff, (unsigned)n_head & 0xffff, (unsigned)n_head_kv & 0xffff, (unsigned)ff & 0xffff,
             (unsigned)n_vocab & 0xffffff);
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

bool bench_model_open(int argc, char **argv, struct bench_model *out)
{
    memset(out, 0, sizeof *out);
    const double t0 = bench_now();
    const char *path = bench_arg_str(argc, argv, "--model", NULL);
    if (path) {
        struct kvb_err err = {{0}};
        if (model_load(path, &out->file, &err) != KVB_OK) {
            fprintf(stderr, "bench_gpu: %s\n", err.msg);
            return false;
        }
        out->m = out->file;
    } else {
        out->mem = mem_model_create(
            (int32_t)bench_arg_int(argc, argv, "--layers", 32), (int32_t)bench_arg_int(argc, argv, "--embd", 4096),
            (int32_t)bench_arg_int(argc, argv, "--ff", 14336), (int32_t)bench_arg_int(argc, argv, "--heads", 32),
            (int32_t)bench_arg_int(argc, argv, "--kv-heads", 8), (int32_t)bench_arg_int(argc, argv, "--vocab", 128256));
        if (!out->mem) {
            fprintf(stderr, "bench_gpu: out of host memory for the model\n");
            return false;
        }
        out->m = &out->mem->m;
    }
    const struct model_hparams *hp = &out->m->hp;
    printf("model %s: %d layers, hidden %d, %d/%d heads, FFN %d, vocab %d (ready in %.1f s)\n",
           path ? path : out->m->name, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab,
           bench_now() - t0);
    if (hp->n_vocab != 128256)
        printf("figure: NOTE: vocab %d, not Llama 3's 128256: the head and embedding differ from the real model's\n",
               hp->n_vocab);
    if (hp->n_layer != 32)
        printf("figure: NOTE: %d layers, not 32: per-step times scale about linearly with the layer count\n",
               hp->n_layer);
    return true;
}

int bench_open(int argc, char **argv, struct bench_model *out)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (!be_cuda_available(0, why, sizeof why)) {
        fprintf(stderr, "bench_gpu: no CUDA device: %s\n", why);
        return 77;
    }
    printf("device 0: %s, %.1f GiB free\n", why, (double)be_cuda_free_memory(0) / (1 << 30));
    return bench_model_open(argc, argv, out) ? 0 : 1;
}

void bench_model_close(struct bench_model *bm)
{
    model_free(bm->file);
    mem_model_free(bm->mem);
    memset(bm, 0, sizeof *bm);
}
