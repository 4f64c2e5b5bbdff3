/* bench_attn.c — times the two attention kernels on one layer (see
 * bench_util.h): the per-(token, head) f32 kernel and the tensor-core one,
 * so that the first GPU run says which pays where, and by how much; for
 * each KV type (f16, q8, q4: the quantized ones read fewer bytes and
 * dequantize as they go). K/V and Q are constant (timing does not depend on
 * their values; 0x3c bytes are a valid row of every type). */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/kvtype.h"
#include "base/alloc.h"
#include "bench/gpu/bench_util.h"
#include "kernels/kernels.h"

#define BS 16

struct attn_case {
    const char *what;
    int n_seq, n_new, pos; /* each sequence: n_new tokens from position pos */
};

/* Seconds per call of kernel k (0: f32, 1: tensor cores), best of 5 after a warm-up; < 0 on failure. */
static double time_kernel(int k, uint16_t *out, const float *q, int64_t q_ld, const struct kcu_paged *pg,
                          const int32_t *tiles, int32_t n_tiles, const struct model_hparams *hp, float scale)
{
    double best = -1;
    for (int rep = 0; rep < 6; rep++) {
        const double t0 = bench_now();
        cudaError_t e = k == 0 ? kcu_attn_bf16(out, q, q_ld, pg, hp->n_head, hp->n_head_kv, hp->head_dim, scale, 0)
                               : kcu_attn_tc_bf16(out, q, q_ld, pg, tiles, n_tiles, hp->n_head, hp->n_head_kv,
                                                  hp->head_dim, scale, 0);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "bench_attn: %s\n", cudaGetErrorString(e));
            return -1;
        }
        const double dt = bench_now() - t0;
        if (rep > 0 && (best < 0 || dt < best)) best = dt;
    }
    return best;
}

static int run_case(const struct model_hparams *hp, const struct attn_case *ac, enum kv_type kt)
{
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t q_ld = qd + 2 * kvd, n_tok = (int64_t)ac->n_seq * ac->n_new;
    const int32_t per_seq = (ac->pos + ac->n_new + BS - 1) / BS;
    const int32_t tt = kcu_attn_tc_tile_tokens(hp->n_head, hp->n_head_kv, hp->head_dim);
    const int64_t block_bytes =
        BS * (kv_row_bytes(kv_k_rows(kt), kvd) + kv_row_bytes(kv_v_rows(kt), kvd)); /* one layer */
    const int64_t n_blocks = (int64_t)ac->n_seq * per_seq;
    int32_t *pos = kvb_malloc(sizeof(int32_t) * (size_t)n_tok), *tab = kvb_malloc(sizeof(int32_t) * (size_t)n_tok);
    int32_t *blocks = kvb_malloc(sizeof(int32_t) * (size_t)n_blocks);
    int32_t *tiles = kvb_malloc(sizeof(int32_t) * 2 * (size_t)n_tok);
    int32_t n_tiles = 0;
    for (int64_t b = 0; b < n_blocks; b++) blocks[b] = (int32_t)b;
    for (int s = 0, t = 0; s < ac->n_seq; s++) {
        for (int j = 0; j < ac->n_new; j++, t++) {
            pos[t] = ac->pos + j;
            tab[t] = s * per_seq;
        }
        for (int j = 0; tt > 0 && j < ac->n_new; j += tt, n_tiles++) {
            tiles[2 * n_tiles] = t - ac->n_new + j;
            tiles[2 * n_tiles + 1] = ac->n_new - j < tt ? ac->n_new - j : tt;
        }
    }
    void *d_pool = NULL, *d_q = NULL, *d_out = NULL, *d_idx = NULL;
    const size_t idx_n = (size_t)(2 * n_tok + n_blocks + 2 * n_tok);
    cudaError_t e = cudaMalloc(&d_pool, (size_t)(n_blocks * block_bytes));
    if (e == cudaSuccess) e = cudaMalloc(&d_q, sizeof(float) * (size_t)(n_tok * q_ld));
    if (e == cudaSuccess) e = cudaMalloc(&d_out, sizeof(uint16_t) * (size_t)(n_tok * qd));
    if (e == cudaSuccess) e = cudaMalloc(&d_idx, sizeof(int32_t) * idx_n);
    if (e == cudaSuccess) e = cudaMemset(d_pool, 0x3c, (size_t)(n_blocks * block_bytes));
    if (e == cudaSuccess) e = cudaMemset(d_q, 0, sizeof(float) * (size_t)(n_tok * q_ld));
    int32_t *di = d_idx;
    if (e == cudaSuccess) e = cudaMemcpy(di, pos, sizeof(int32_t) * (size_t)n_tok, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(di + n_tok, tab, sizeof(int32_t) * (size_t)n_tok, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(di + 2 * n_tok, blocks, sizeof(int32_t) * (size_t)n_blocks, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(di + 2 * n_tok + n_blocks, tiles, sizeof(int32_t) * 2 * (size_t)n_tiles, cudaMemcpyHostToDevice);
    int rc = 0;
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_attn: %s\n", cudaGetErrorString(e));
        rc = 1;
    } else {
        struct kcu_paged pg = {.pool = d_pool,
                               .block_bytes = block_bytes,
                               .kv_type = (int32_t)kt,
                               .block_size = BS,
                               .kv_dim = (int32_t)kvd,
                               .layer = 0,
                               .n_tok = (int32_t)n_tok,
                               .tok_pos = di,
                               .tok_table = di + n_tok,
                               .blocks = di + 2 * n_tok};
        const float scale = 0.088f;
        double dt[2] = {-1, -1};
        for (int k = 0; k < (tt > 0 ? 2 : 1); k++)
            dt[k] = time_kernel(k, d_out, d_q, q_ld, &pg, di + 2 * n_tok + n_blocks, n_tiles, hp, scale);
        /* Work: q·k and p·v per (token, head, visible position); K/V bytes
         * of each sequence read once at least. */
        double pairs = 0;
        for (int j = 0; j < ac->n_new; j++) pairs += ac->pos + j + 1;
        pairs *= (double)ac->n_seq * hp->n_head;
        const double flop = 4.0 * hp->head_dim * pairs;
        const double bytes = (double)ac->n_seq * (ac->pos + ac->n_new) * (double)block_bytes / BS;
        char what[96]; /* the f16 lines as they always were; the KV type named otherwise */
        snprintf(what, sizeof what, "%s%s%s", ac->what, kt == KV_F16 ? "" : ", KV ",
                 kt == KV_F16 ? "" : kv_type_name(kt));
        if (dt[0] < 0 || (tt > 0 && dt[1] < 0)) rc = 1;
        for (int k = 0; k < 2 && !rc; k++)
            if (dt[k] >= 0)
                printf("figure: attention, one layer (%d/%d heads, head %d), %s: %s %.3f ms = %.1f TFLOP/s, K/V "
                       "%.0f GB/s\n",
                       hp->n_head, hp->n_head_kv, hp->head_dim, what, k ? "tensor cores" : "f32 kernel", dt[k] * 1e3,
                       flop / dt[k] / 1e12, bytes / dt[k] / 1e9);
        if (!rc && tt > 0)
            printf("figure: attention, %s: tensor cores %.2fx the f32 kernel's speed\n", what, dt[0] / dt[1]);
        if (!rc && tt == 0) printf("figure: attention, %s: tensor cores do not take head %d\n", what, hp->head_dim);
    }
    cudaFree(d_pool);
    cudaFree(d_q);
    cudaFree(d_out);
    cudaFree(d_idx);
    kvb_free(pos);
    kvb_free(tab);
    kvb_free(blocks);
    kvb_free(tiles);
    return rc;
}

int bench_attn(const struct model_hparams *hp, int pf_seqs, int pf_len, int batch, int ctx)
{
    /* Decode at batch 1 too: be_cuda takes kcu_attn for steps too small to
     * fill the GPU with tiles (outside deterministic mode); this says
     * whether it should. */
    char pf[64], dec[64], dec1[64];
    snprintf(pf, sizeof pf, "prefill %d x %d", pf_seqs, pf_len);
    snprintf(dec, sizeof dec, "decode %d at %d", batch, ctx);
    snprintf(dec1, sizeof dec1, "decode 1 at %d", ctx);
    const struct attn_case cases[3] = {{pf, pf_seqs, pf_len, 0}, {dec, batch, 1, ctx}, {dec1, 1, 1, ctx}};
    int rc = 0;
    for (int t = 0; t < KV_N_TYPES; t++) {
        if (t != KV_F16 && hp->head_dim % KV_QGROUP) {
            printf("figure: attention, KV %s: head %d is not whole groups of %d, not timed\n",
                   kv_type_name((enum kv_type)t), hp->head_dim, KV_QGROUP);
            continue;
        }
        for (int i = 0; i < 3; i++) rc |= run_case(hp, &cases[i], (enum kv_type)t);
    }
    return rc;
}
