/* gen.c — single-sequence prefill/decode over a backend (see gen.h). */
#include "engine/gen.h"

#include <string.h>

#include "base/alloc.h"

struct gen_ctx {
    const struct model *m;
    struct backend *be;
    int32_t n_ctx, chunk, pos;
    int32_t *table; /* identity block table: block i holds positions [i*B, (i+1)*B) */
    float *logits;  /* (n_vocab) */
};

enum kvb_status gen_create(const struct model *m, struct backend *be, int32_t n_ctx, int32_t chunk,
                           struct gen_ctx **out, struct kvb_err *err)
{
    int64_t need = ((int64_t)n_ctx + be->block_size - 1) / be->block_size;
    if (n_ctx <= 0 || chunk <= 0 || need > be->n_blocks)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "context %d needs %lld KV blocks, the pool has %d", n_ctx,
                        (long long)need, be->n_blocks);
    struct gen_ctx *g = kvb_calloc(1, sizeof *g);
    if (!g) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    g->m = m;
    g->be = be;
    g->n_ctx = n_ctx;
    g->chunk = chunk;
    g->table = kvb_malloc(sizeof(int32_t) * (size_t)need);
    g->logits = kvb_malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    if (!g->table || !g->logits) {
        gen_free(g);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < need; i++) g->table[i] = i;
    *out = g;
    return KVB_OK;
}

void gen_free(struct gen_ctx *g)
{
    if (!g) return;
    kvb_free(g->table);
    kvb_free(g->logits);
    kvb_free(g);
}

enum kvb_status gen_feed(struct gen_ctx *g, const int32_t *tokens, int32_t n, float *all_logits, struct kvb_err *err)
{
    if (n <= 0) return KVB_OK;
    if ((int64_t)g->pos + n > g->n_ctx)
        return kvb_errf(err, KVB_ERR_RANGE, "%d tokens at position %d exceed the context of %d", n, g->pos, g->n_ctx);
    const int64_t nv = g->m->hp.n_vocab;
    for (int32_t done = 0; done < n;) {
        int32_t len = n - done < g->chunk ? n - done : g->chunk;
        bool last = done + len == n;
        struct be_seq s = {
            .tokens = tokens + done,
            .n_tokens = len,
            .pos = g->pos,
            .block_table = g->table,
            .n_blocks = (g->pos + len + g->be->block_size - 1) / g->be->block_size,
            .logits = all_logits ? BE_LOGITS_ALL
                      : last     ? BE_LOGITS_LAST
                                 : BE_LOGITS_NONE,
        };
        struct be_batch b = {&s, 1, NULL, NULL};
        float *dst = all_logits ? all_logits + (int64_t)done * nv : g->logits;
        KVB_FORWARD_IF_ERROR(g->be->forward(g->be, &b, dst, err));
        g->pos += len;
        done += len;
        if (last && all_logits) memcpy(g->logits, dst + (int64_t)(len - 1) * nv, sizeof(float) * (size_t)nv);
    }
    return KVB_OK;
}

const float *gen_logits(const struct gen_ctx *g) { return g->logits; }
