/* pool.c — embeddings and rerank scores from pooled hidden states (see
 * pool.h). Plain loops in double: a vector or a head of a few thousand
 * values per request costs nothing next to the forward pass that made it. */
#include "engine/pool.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "model/quant.h"

static const char *const names[] = {"none", "mean", "cls", "last", "rank"};

const char *pool_name(enum model_pooling p) { return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?"; }

bool pool_parse(const char *s, bool rank, enum model_pooling *out)
{
    for (int i = MODEL_POOL_MEAN; i <= (rank ? MODEL_POOL_RANK : MODEL_POOL_LAST); i++)
        if (!strcmp(s, names[i])) {
            *out = (enum model_pooling)i;
            return true;
        }
    return false;
}

void pool_normalize(float *v, int32_t n)
{
    double ss = 0;
    for (int32_t i = 0; i < n; i++) ss += (double)v[i] * v[i];
    if (!(ss > 0)) return;
    const double inv = 1.0 / sqrt(ss);
    for (int32_t i = 0; i < n; i++) v[i] = (float)(v[i] * inv);
}

/* y[r] = w[r]·x (+ b[r]) for the rows of w, each dequantized into row. */
static enum kvb_status matvec(const struct mm_weight *w, const float *b, const float *x, float *row, double *y)
{
    for (int64_t r = 0; r < w->n_out; r++) {
        KVB_FORWARD_IF_ERROR(quant_dequant_row(w->type, (const char *)w->data + r * w->row_bytes, row, w->n_in));
        double acc = b ? b[r] : 0.0;
        for (int64_t i = 0; i < w->n_in; i++) acc += (double)row[i] * x[i];
        y[r] = acc;
    }
    return KVB_OK;
}

enum kvb_status pool_rank_logit(const struct model *m, const float *h, float *logit, struct kvb_err *err)
{
    const int64_t e = m->hp.n_embd;
    if (m->n_cls_out != 1 && m->n_cls_out != 2)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "the model's classification head has %d outputs; kvbatch scores with one (a cross-encoder's "
                        "logit) or two (yes/no)",
                        m->n_cls_out);
    float *row = kvb_malloc(sizeof(float) * (size_t)e), *x = kvb_malloc(sizeof(float) * (size_t)e);
    double *y = kvb_malloc(sizeof(double) * (size_t)(e > 2 ? e : 2));
    enum kvb_status st = !row || !x || !y ? KVB_ERR_NOMEM : KVB_OK;
    if (st == KVB_OK) memcpy(x, h, sizeof(float) * (size_t)e);
    if (st == KVB_OK && m->cls.data) {
        st = matvec(&m->cls, m->cls_b, h, row, y);
        for (int64_t i = 0; st == KVB_OK && i < e; i++) x[i] = (float)tanh(y[i]);
    }
    if (st == KVB_OK) st = matvec(&m->cls_out, m->cls_out_b, x, row, y);
    if (st == KVB_OK) {
        /* two: softmax's first is the sigmoid of the difference */
        *logit = (float)(m->n_cls_out == 1 ? y[0] : y[0] - y[1]);
    }
    kvb_free(row);
    kvb_free(x);
    kvb_free(y);
    if (st == KVB_ERR_NOMEM) return kvb_errf(err, st, "out of memory for the classification head");
    if (st != KVB_OK) return kvb_errf(err, st, "cannot read the classification head's weights");
    return KVB_OK;
}

float pool_sigmoid(float logit) { return (float)(1.0 / (1.0 + exp(-(double)logit))); }

float pool_cosine(const float *a, const float *b, int32_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int32_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? (float)(ab / sqrt(aa * bb)) : 0.0f;
}
