/* pstore_check.h — what the persistent-store tests share (test_pstore.c,
 * test_pstore_codec.c): model descriptions, KV-like and random block data
 * from a seeded generator. Static helpers: each test includes this once. */
#ifndef KVB_TESTS_PSTORE_CHECK_H
#define KVB_TESTS_PSTORE_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "store/pstore/pstore.h"

static const char *const FP_A = "0123456789abcdef0123456789abcdef";
static const char *const FP_B = "fedcba9876543210fedcba9876543210";

static inline double now(void) { return kvb_clock_s(); }

static inline uint64_t rng_next(uint64_t *s) { return kvb_xorshift64(s); }

static inline double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static inline double rng_gauss(uint64_t *s)
{
    double u = rng_unit(s), v = rng_unit(s);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static inline struct pstore_model model(const char *fp, enum pstore_dtype dt, int bs, int n_layer, int kv_dim)
{
    struct pstore_model m = {
        .name = "tiny test model", .dtype = dt, .block_size = bs, .n_layer = n_layer, .kv_dim = kv_dim};
    snprintf(m.fingerprint, sizeof m.fingerprint, "%s", fp);
    return m;
}

static inline size_t raw_bytes(const struct pstore_model *m)
{
    const size_t rows = (size_t)m->n_layer * 2 * (size_t)m->block_size, g = (size_t)m->kv_dim / PSTORE_QGROUP;
    switch (m->dtype) {
    case PSTORE_DTYPE_Q8: return rows * g * 34;
    case PSTORE_DTYPE_Q4: return rows / 2 * g * (34 + 20); /* K rows q8, V rows q4 */
    case PSTORE_DTYPE_F16: return rows * (size_t)m->kv_dim * 2;
    default: return rows * (size_t)m->kv_dim * 4;
    }
}

/* KV-like f16 data: per layer and K/V, each channel has its own offset and
 * scale (K has a few large outlier channels, as real models do), and values
 * drift smoothly across token positions (AR(1)). */
static inline void fill_kvlike(const struct pstore_model *m, uint16_t *out, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    int D = m->kv_dim, B = m->block_size;
    double *mean = malloc(sizeof(double) * (size_t)D), *scale = malloc(sizeof(double) * (size_t)D),
           *z = malloc(sizeof(double) * (size_t)D);
    for (int l = 0; l < m->n_layer; l++)
        for (int kv = 0; kv < 2; kv++) {
            for (int c = 0; c < D; c++) {
                mean[c] = kv == 0 ? 0.5 * rng_gauss(&s) : 0.05 * rng_gauss(&s);
                scale[c] = exp(0.5 * rng_gauss(&s)) * (kv == 0 ? 1.0 : 0.3);
                if (kv == 0 && rng_unit(&s) < 0.03) scale[c] *= 8.0;
                z[c] = rng_gauss(&s);
            }
            for (int t = 0; t < B; t++)
                for (int c = 0; c < D; c++) {
                    z[c] = 0.9 * z[c] + 0.43588989 * rng_gauss(&s);
                    float x = (float)(mean[c] + scale[c] * z[c]);
                    out[(((size_t)l * 2 + (size_t)kv) * (size_t)B + (size_t)t) * (size_t)D + (size_t)c] =
                        kvb_f32_to_fp16(x);
                }
        }
    free(mean);
    free(scale);
    free(z);
}

static inline void fill_random(void *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(rng_next(&s) >> 24);
}

/* How far lossy8 values b are from the originals a: the largest absolute
 * error, the largest relative to its row's largest value, and the RMS error
 * relative to the values' RMS. */
struct err_stats {
    double max_abs, max_rel_row, rms_rel;
};

static inline struct err_stats lossy_error(const struct pstore_model *m, const uint16_t *a, const uint16_t *b)
{
    struct err_stats e = {0, 0, 0};
    size_t rows = (size_t)m->n_layer * 2 * (size_t)m->block_size, D = (size_t)m->kv_dim;
    double se = 0, sx = 0;
    for (size_t r = 0; r < rows; r++) {
        double amax = 0;
        for (size_t j = 0; j < D; j++) amax = fmax(amax, fabs(kvb_fp16_to_f32(a[r * D + j])));
        for (size_t j = 0; j < D; j++) {
            double x = kvb_fp16_to_f32(a[r * D + j]), y = kvb_fp16_to_f32(b[r * D + j]), d = fabs(x - y);
            e.max_abs = fmax(e.max_abs, d);
            if (amax > 0) e.max_rel_row = fmax(e.max_rel_row, d / amax);
            se += d * d;
            sx += x * x;
        }
    }
    e.rms_rel = sqrt(se / (sx > 0 ? sx : 1));
    return e;
}

#endif
