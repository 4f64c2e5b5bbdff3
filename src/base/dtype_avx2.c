/* dtype_avx2.c — F16C conversions (dtype.h). Compiled with -mavx2 -mf16c;
 * dtype.c checks the CPU before calling in. */
#include <immintrin.h>

#include "base/dtype.h"

void kvb_f32_to_fp16_n_f16c(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = kvb_f32_to_fp16(src[i]);
}
