/* test_enc_attn.c — an encoder's attention (cpu/enc_attn.h): the AVX2 kernel
 * against the reference over lengths that are and are not multiples of 8
 * (1 to 513 rows) and head sizes with and without a tail (24, 64, 100),
 * with scores large enough that the softmax is peaked: every output within
 * 2e-6 of the largest reference value (float rounding: the kernel sums in
 * other orders and exponentiates by a polynomial). Skips (77) without AVX2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/rng.h"
#include "cpu/attn.h"
#include "cpu/enc_attn.h"
#include "support/testutil.h"

int main(void)
{
    if (!attn_have_avx2()) tu_skip("no AVX2 on this CPU: the kernel has nothing to be compared with");
    static const int32_t ns[] = {1, 3, 8, 9, 64, 200, 513};
    static const int32_t hds[] = {24, 64, 100};
    uint64_t seed = 42;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof hds / sizeof hds[0]; b++) {
            const int32_t n = ns[a], hd = hds[b];
            const int64_t ld = hd + 5; /* rows at a stride, as the heads of a token's row are */
            float *q = kvb_malloc(sizeof(float) * (size_t)(n * ld)), *k = kvb_malloc(sizeof(float) * (size_t)(n * ld));
            float *v = kvb_malloc(sizeof(float) * (size_t)(n * ld));
            float *o1 = kvb_calloc((size_t)(n * ld), sizeof(float)), *o2 = kvb_calloc((size_t)(n * ld), sizeof(float));
            float *scratch = kvb_aligned_alloc(32, sizeof(float) * (size_t)enc_attn_scratch_floats(n, hd));
            for (int64_t i = 0; i < n * ld; i++) {
                q[i] = (float)((double)(kvb_xorshift64(&seed) >> 11) / 9007199254740992.0 * 6 - 3);
                k[i] = (float)((double)(kvb_xorshift64(&seed) >> 11) / 9007199254740992.0 * 6 - 3);
                v[i] = (float)((double)(kvb_xorshift64(&seed) >> 11) / 9007199254740992.0 * 2 - 1);
            }
            const float scale = 1.0f / sqrtf((float)hd);
            enc_attn(o1, q, k, v, ld, n, hd, scale, scratch);
            enc_attn_avx2(o2, q, k, v, ld, n, hd, scale, scratch);
            double mx = 0, err = 0;
            for (int32_t i = 0; i < n; i++)
                for (int32_t c = 0; c < hd; c++) {
                    mx = fmax(mx, fabs(o1[(int64_t)i * ld + c]));
                    err = fmax(err, fabs(o1[(int64_t)i * ld + c] - o2[(int64_t)i * ld + c]));
                }
            CHECK_MSG(err <= 2e-6 * mx, "n %d head %d: max |avx2 - reference| %.3g of %.3g", n, hd, err, mx);
            printf("n %3d head %3d: max |d| %.2e (max |out| %.2f)\n", n, hd, err, mx);
            kvb_free(q);
            kvb_free(k);
            kvb_free(v);
            kvb_free(o1);
            kvb_free(o2);
            kvb_free(scratch);
        }
    return tu_finish();
}
