/* model_swa.c — the keys of sliding-window attention and soft-capping,
 * shared by the architectures that read them (see model_internal.h). */
#include <math.h>
#include <stdio.h>

#include "model/model_internal.h"

enum kvb_status model_read_swa(struct model *m, uint32_t dflt_window, uint32_t dflt_period, struct kvb_err *err)
{
    char key[128];
    uint32_t window = dflt_window;
    enum kvb_status st =
        gguf_get_u32(m->gguf, model_key(m, "attention.sliding_window", key, sizeof key), &window, NULL);
    if (st != KVB_OK && st != KVB_ERR_NOT_FOUND) return gguf_get_u32(m->gguf, key, &window, err);
    if (window > INT32_MAX) return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %u is out of range", key, window);
    const int32_t n_layer = m->hp.n_layer;
    for (int32_t l = 0; l < n_layer; l++) m->layers[l].swa = false;
    m->ops.n_swa = 0;
    if (window == 0) return KVB_OK; /* llama.cpp and transformers: no window at all */
    m->ops.n_swa = (int32_t)window;

    const struct gguf_value *pv = gguf_find(m->gguf, model_key(m, "attention.sliding_window_pattern", key, sizeof key));
    uint32_t period = dflt_period;
    if (pv && pv->type == GGUF_VTYPE_ARRAY) {
        if (pv->v.arr.elem_type != GGUF_VTYPE_BOOL || pv->v.arr.n != (uint64_t)n_layer)
            return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' must be a bool per layer (%d), has %llu elements", key,
                            n_layer, (unsigned long long)pv->v.arr.n);
        const uint8_t *b = pv->v.arr.raw;
        for (int32_t l = 0; l < n_layer; l++) m->layers[l].swa = b[l] != 0;
        return KVB_OK;
    }
    if (pv) {
        st = gguf_get_u32(m->gguf, key, &period, err);
        if (st != KVB_OK) return st;
    }
    /* A period of 0 or 1 leaves no global layer (llama.cpp reads 0 so); one
     * longer than the model leaves every layer windowed. */
    for (int32_t l = 0; l < n_layer; l++) m->layers[l].swa = period == 0 || (uint32_t)l % period < period - 1;
    return KVB_OK;
}

enum kvb_status model_read_softcap(const struct model *m, const char *suffix, float *out, struct kvb_err *err)
{
    KVB_FORWARD_IF_ERROR(model_opt_f32(m, suffix, 0.0f, NULL, out, err));
    if (!isfinite(*out) || *out < 0) {
        char key[128];
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' = %g must be a non-negative number",
                        model_key(m, suffix, key, sizeof key), (double)*out);
    }
    return KVB_OK;
}
