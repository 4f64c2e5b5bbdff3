/* backend.c — what every backend checks before a forward pass, in one place
 * so that all of them refuse the same batches with the same messages. */
#include "backend/backend.h"

#include "base/alloc.h"
#include "model/model.h"

int64_t be_block_bytes(const struct model *m, int32_t block_size, enum kv_type kv_type)
{
    const int64_t kvd = (int64_t)m->hp.n_head_kv * m->hp.head_dim;
    return (int64_t)m->hp.n_layer * block_size *
           (kv_row_bytes(kv_k_rows(kv_type), kvd) + kv_row_bytes(kv_v_rows(kv_type), kvd));
}

static int32_t gcd(int32_t a, int32_t b)
{
    while (b) {
        const int32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

void be_kv_layout(const struct model *m, int32_t block_size, enum kv_type kv_type, struct be_kv_layout *out)
{
    int32_t n_swa = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++) n_swa += m->ops.n_swa > 0 && m->layers[l].swa;
    const int32_t n_glob = m->hp.n_layer - n_swa;
    const int32_t g = n_swa == 0 ? m->hp.n_layer : gcd(n_glob, n_swa);
    out->layers_per_group = g;
    out->n_global_groups = n_swa == 0 ? 1 : n_glob / g;
    out->n_groups = n_swa == 0 ? 1 : n_glob / g + n_swa / g;
    out->page_bytes = be_block_bytes(m, block_size, kv_type) / m->hp.n_layer * g;
}

void be_layer_group(const struct model *m, const struct be_kv_layout *lo, int32_t l, int32_t *group, int32_t *index)
{
    const bool swa = lo->n_groups > 1 && m->layers[l].swa;
    int32_t k = 0; /* l's place among the layers of its kind */
    for (int32_t i = 0; i < l; i++) k += (lo->n_groups > 1 && m->layers[i].swa) == swa;
    *group = (swa ? lo->n_global_groups : 0) + k / lo->layers_per_group;
    *index = k % lo->layers_per_group;
}

void be_paging_init(struct backend *be, const struct model *m, int32_t n_blocks, enum kv_type kv_type)
{
    struct be_kv_layout lo;
    be_kv_layout(m, be->block_size, kv_type, &lo);
    be->n_groups = lo.n_groups;
    be->n_global_groups = lo.n_global_groups;
    be->page_bytes = lo.page_bytes;
    be->n_pages = n_blocks * lo.n_groups;
    be->n_logical = lo.n_groups > 1 ? be->n_pages : n_blocks;
    be->window = lo.n_groups > 1 ? m->ops.n_swa : 0;
}

void *be_host_alloc(struct backend *be, size_t bytes)
{
    return be->host_alloc ? be->host_alloc(be, bytes) : kvb_aligned_alloc(64, bytes);
}

void be_host_free(struct backend *be, void *p)
{
    if (!p) return;
    if (be->host_free) be->host_free(be, p);
    else kvb_free(p);
}

enum kvb_status be_batch_check(const struct backend *be, int32_t n_vocab, const struct be_batch *b,
                               struct be_batch_shape *out, struct kvb_err *err)
{
    struct be_batch_shape sh = {0};
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct be_seq *s = &b->seqs[i];
        if (s->n_tokens <= 0 || s->pos < 0)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d: %d tokens at position %d", i, s->n_tokens, s->pos);
        const int64_t end = (int64_t)s->pos + s->n_tokens;
        if (end > INT32_MAX) return kvb_errf(err, KVB_ERR_RANGE, "sequence %d: position overflow", i);
        if ((end + be->block_size - 1) / be->block_size > s->n_blocks)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d: %d blocks cannot hold %lld positions", i,
                            s->n_blocks, (long long)end);
        for (int32_t bi = 0; bi < s->n_blocks; bi++)
            if (s->block_table[bi] < 0 || s->block_table[bi] >= (be->n_logical > 0 ? be->n_logical : be->n_blocks))
                return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d: block id %d out of range", i,
                                s->block_table[bi]);
        for (int32_t t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= n_vocab)
                return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d: token id %d out of range", i, s->tokens[t]);
        if (s->logits == BE_LOGITS_ARGMAX && (!be->argmax || !b->argmax))
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "sequence %d: greedy choice asked of %s, %s", i, be->name,
                            be->argmax ? "with nowhere to write it" : "which returns logits only");
        sh.n_tok += s->n_tokens;
        sh.n_argmax += s->logits == BE_LOGITS_ARGMAX;
        sh.n_out += s->logits == BE_LOGITS_ALL ? s->n_tokens : s->logits == BE_LOGITS_LAST ? 1 : 0;
        sh.n_tab += s->n_blocks;
        if (end > sh.max_end) sh.max_end = (int32_t)end;
    }
    *out = sh;
    return KVB_OK;
}
