/* test_kvtype.c — the reference K/V row quantizers (backend/kvtype.h):
 * every stored value within half a step of its input (computed here in
 * double, not through kvtype.c's formulas), the group layout, the edges
 * (zero, constant and overflowing groups) and the names. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/kvtype.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "support/testutil.h"

static float rnd(uint64_t *st, float scale)
{
    return scale * (float)((double)(kvb_splitmix64(st) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Quantizes n random rows of 128 elements and checks each value's error
 * against the bound the scheme promises: half a step, plus the rounding of
 * the minimum to fp16 for q4. */
static void test_error_bound(enum kv_type t)
{
    uint64_t st = 42 + (uint64_t)t;
    float x[128], y[128];
    unsigned char buf[512];
    double worst = 0;
    for (int r = 0; r < 2000; r++) {
        const float scale = (float)pow(10.0, (double)(r % 9) - 4.0); /* 1e-4 .. 1e4 */
        for (int i = 0; i < 128; i++) x[i] = rnd(&st, scale) + (r % 3 == 0 ? 0.5f * scale : 0.0f);
        if (r % 7 == 0) x[r % 128] = 20 * scale; /* an outlier channel */
        kv_quantize_row(t, buf, x, 128);
        kv_dequantize_row(t, y, buf, 128);
        for (int g = 0; g < 128 / KV_QGROUP; g++) {
            double lo = x[g * 32], hi = x[g * 32], amax = 0;
            for (int i = 0; i < 32; i++) {
                lo = fmin(lo, x[g * 32 + i]);
                hi = fmax(hi, x[g * 32 + i]);
                amax = fmax(amax, fabs(x[g * 32 + i]));
            }
            /* the fp16 scale is off the exact one by half an ulp: 2^-11
             * relative, or 2^-25 absolute where it is subnormal; each
             * stored value carries that times its quantized integer */
            const double exact = t == KV_Q8 ? amax / 127 : (hi - lo) / 15, qmax = t == KV_Q8 ? 127 : 15;
            const double delta = fmax(exact / 2048, ldexp(1, -25));
            const double step = exact + delta;
            const double mslack = (t == KV_Q4 ? fmax(fabs(lo) / 2048, ldexp(1, -25)) : 0) + qmax * delta;
            for (int i = 0; i < 32; i++) {
                const double e = fabs((double)y[g * 32 + i] - x[g * 32 + i]);
                const double bound = step / 2 * (1 + 1e-6) + mslack + 1e-30;
                CHECK_MSG(e <= bound, "%s row %d elem %d: |%g - %g| = %g > %g", kv_type_name(t), r, g * 32 + i,
                          (double)y[g * 32 + i], (double)x[g * 32 + i], e, bound);
                if (step > 0 && e / step > worst) worst = e / step;
            }
        }
    }
    CHECK(worst > 0.3); /* the bound is not trivially loose: some value sits near half a step */
}

static void test_layout(void)
{
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = (float)i - 16.0f;
    struct kvq8_group g8;
    kvq8_quantize_group(&g8, x);
    CHECK(g8.q[0] == -127); /* amax 16 at element 0 */
    CHECK(g8.q[16] == 0);
    struct kvq4_group g4;
    kvq4_quantize_group(&g4, x);
    CHECK_EQ_INT(kvb_fp16_to_f32(g4.m), -16);
    CHECK((g4.qs[0] & 15) == 0);   /* element 0: the minimum */
    CHECK((g4.qs[15] >> 4) == 15); /* element 31: the maximum */
    /* a minimum of -0 beside +0 has one code, whichever the loop meets first */
    float zz[32];
    for (int i = 0; i < 32; i++) zz[i] = i == 3 ? -0.0f : (float)(i % 5);
    kvq4_quantize_group(&g4, zz);
    CHECK_EQ_INT(g4.m, 0);
    zz[0] = -0.0f;
    kvq4_quantize_group(&g4, zz);
    CHECK_EQ_INT(g4.m, 0);
    CHECK_EQ_INT(kv_row_bytes(KV_Q8, 64), 68);
    CHECK_EQ_INT(kv_row_bytes(KV_Q4, 64), 40);
    CHECK_EQ_INT(kv_row_bytes(KV_F16, 64), 128);
    /* the q4 pool keeps K at 8 bits */
    CHECK(kv_k_rows(KV_Q4) == KV_Q8 && kv_v_rows(KV_Q4) == KV_Q4);
    CHECK(kv_k_rows(KV_Q8) == KV_Q8 && kv_v_rows(KV_Q8) == KV_Q8);
    CHECK(kv_k_rows(KV_F16) == KV_F16 && kv_v_rows(KV_F16) == KV_F16);
}

static void test_edges(void)
{
    float z[32] = {0}, y[32];
    for (int t = 1; t < KV_N_TYPES; t++) {
        unsigned char buf[64];
        kv_quantize_row((enum kv_type)t, buf, z, 32);
        kv_dequantize_row((enum kv_type)t, y, buf, 32);
        for (int i = 0; i < 32; i++) CHECK(y[i] == 0.0f && !signbit(y[i]) == !signbit(0.0f));
        float c[32], big[32];
        for (int i = 0; i < 32; i++) c[i] = 3.25f, big[i] = (i % 2 ? -1 : 1) * 1e9f;
        kv_quantize_row((enum kv_type)t, buf, c, 32);
        kv_dequantize_row((enum kv_type)t, y, buf, 32);
        for (int i = 0; i < 32; i++) CHECK(fabsf(y[i] - 3.25f) <= 3.25f / 127 + 1e-6f);
        kv_quantize_row((enum kv_type)t, buf, big, 32);
        kv_dequantize_row((enum kv_type)t, y, buf, 32);
        for (int i = 0; i < 32; i++) CHECK(isfinite(y[i]));
    }
}

static void test_names(void)
{
    enum kv_type t;
    for (int i = 0; i < KV_N_TYPES; i++) CHECK(kv_type_parse(kv_type_name((enum kv_type)i), &t) && (int)t == i);
    CHECK(!kv_type_parse("q4_0", &t) && !kv_type_parse("", &t) && !kv_type_parse(NULL, &t));
    struct kvb_err err = {0};
    CHECK(kv_type_check(KV_Q8, 64, &err) == KVB_OK);
    CHECK(kv_type_check(KV_F16, 20, &err) == KVB_OK);
    CHECK(kv_type_check(KV_Q4, 48, &err) == KVB_ERR_UNSUPPORTED && strstr(err.msg, "head_dim is 48"));
}

int main(void)
{
    test_error_bound(KV_Q8);
    test_error_bound(KV_Q4);
    test_layout();
    test_edges();
    test_names();
    return tu_finish();
}
