/* test_dtype.c — half and bfloat16 conversions (exhaustive over all 65536
 * codes, plus rounding at the edges) and the ggml type geometry table. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/rng.h"
#include "support/testutil.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16 value computed independently of dtype.c. */
static double half_ref(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0x1f) v = mant ? NAN : INFINITY;
    else if (exp == 0) v = ldexp(mant, -24);
    else v = ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

static void test_fp16_exhaustive(void)
{
    int bad_decode = 0, bad_round_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvb_fp16_to_f32((uint16_t)h);
        double ref = half_ref((uint16_t)h);
        if (isnan(ref)) {
            uint16_t back = kvb_f32_to_fp16(f);
            if (!isnan(f) || (back & 0x7c00) != 0x7c00 || (back & 0x3ff) == 0 || (back & 0x8000) != (h & 0x8000))
                bad_round_trip++;
            continue;
        }
        if ((double)f != ref || !signbit(f) != !signbit(ref)) bad_decode++;
        if (kvb_f32_to_fp16(f) != h) bad_round_trip++;
    }
    CHECK_EQ_INT(bad_decode, 0);
    CHECK_EQ_INT(bad_round_trip, 0);
}

static void test_fp16_rounding(void)
{
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3c00},
        {1.0f + 0x1p-11f, 0x3c00},            /* tie, even mantissa stays */
        {1.0f + 3 * 0x1p-11f, 0x3c02},        /* tie, odd mantissa rounds up */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01}, /* just above the tie */
        {65504.0f, 0x7bff},                   /* largest half */
        {65519.0f, 0x7bff},                   /* below the tie to infinity */
        {65520.0f, 0x7c00},                   /* tie rounds to even = infinity */
        {1e10f, 0x7c00},
        {-1e10f, 0xfc00},
        {0x1p-24f, 0x0001}, /* smallest subnormal */
        {0x1p-25f, 0x0000}, /* tie with zero: even */
        {0x1p-25f * 1.0001f, 0x0001},
        {3 * 0x1p-25f, 0x0002},        /* tie between 1 and 2 units: even */
        {0x1p-14f, 0x0400},            /* smallest normal */
        {0x1p-14f - 0x1p-25f, 0x0400}, /* tie at the subnormal/normal edge carries up */
        {1e-10f, 0x0000},
        {-0.0f, 0x8000},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = kvb_f32_to_fp16(cases[i].f);
        CHECK_MSG(got == cases[i].h, "f32_to_fp16(%a) = 0x%04x, want 0x%04x", (double)cases[i].f, got, cases[i].h);
    }
    uint16_t n = kvb_f32_to_fp16(NAN);
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
}

/* Random floats in (and a bit beyond) the half range: the result must be the
 * nearest half, ties to even. */
static void test_fp16_nearest(void)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        kvb_xorshift64(&s);
        /* exponents 2^-26 .. 2^17, random sign and mantissa */
        uint32_t bits = (uint32_t)(s & 0x807fffffu) | ((uint32_t)(101 + (s >> 32) % 43) << 23);
        float f = bits_f32(bits);
        uint16_t h = kvb_f32_to_fp16(f);
        double a = fabs((double)f), got = fabs(half_ref(h));
        if (isinf(got)) {
            if (a < 65520.0) bad++;
            continue;
        }
        uint16_t mag = h & 0x7fff;
        double up = mag < 0x7bff ? half_ref((uint16_t)(mag + 1)) : 65536.0; /* 65536: where inf starts */
        double down = mag > 0 ? half_ref((uint16_t)(mag - 1)) : -1.0;
        double e = fabs(a - got);
        if (e > fabs(a - up) || e > fabs(a - down)) bad++;
        if ((e == fabs(a - up) || e == fabs(a - down)) && (mag & 1)) bad++; /* ties go to even */
        if (((h & 0x8000) != 0) != (signbit(f) != 0)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

/* The bulk conversion (F16C where the CPU has it) equals the scalar one on
 * random floats across the half range, subnormals, ties and overflow
 * included, at every length (vector body and scalar tail). */
static void test_fp16_bulk(void)
{
    enum { N = 100003 };
    float *f = malloc(sizeof(float) * N);
    uint16_t *got = malloc(sizeof(uint16_t) * N);
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < N; i++) {
        kvb_xorshift64(&s);
        uint32_t bits = (uint32_t)(s & 0x807fffffu) | ((uint32_t)(95 + (s >> 32) % 50) << 23);
        if (i % 7 == 0) bits &= 0xffffe000u | 0x1000u; /* exact ties */
        f[i] = bits_f32(bits);
    }
    f[0] = 0.0f, f[1] = -0.0f, f[2] = 65519.0f, f[3] = 65520.0f, f[4] = INFINITY, f[5] = -INFINITY;
    int bad = 0;
    for (int len = 0; len < 20; len++) {
        kvb_f32_to_fp16_n(got, f + len, len);
        for (int i = 0; i < len; i++) bad += got[i] != kvb_f32_to_fp16(f[len + i]);
    }
    kvb_f32_to_fp16_n(got, f, N);
    for (int i = 0; i < N; i++) bad += got[i] != kvb_f32_to_fp16(f[i]);
    CHECK_EQ_INT(bad, 0);
    free(f);
    free(got);
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = kvb_bf16_to_f32((uint16_t)b);
        if (f32_bits(f) != b << 16) bad++;
        uint16_t back = kvb_f32_to_bf16(f);
        if (isnan(f)) {
            if (!isnan(kvb_bf16_to_f32(back)) || (back & 0x8000) != (b & 0x8000)) bad++;
        } else if (back != b) {
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(kvb_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(kvb_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);     /* tie, even stays */
    CHECK(kvb_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82); /* tie, odd rounds up */
    CHECK(kvb_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
    CHECK(kvb_f32_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to infinity */
    CHECK(kvb_f32_to_bf16(-0.0f) == 0x8000);
    uint16_t n = kvb_f32_to_bf16(bits_f32(0x7f800001u)); /* signalling NaN with payload only in the low bits */
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    n = kvb_f32_to_bf16(bits_f32(0xffc00000u));
    CHECK(n == 0xffc0);
}

static void test_type_traits(void)
{
    uint64_t nb = 0;
    CHECK(ggml_type_row_bytes(GGML_TYPE_Q4_1, 64, &nb) && nb == 40);
    CHECK(ggml_type_row_bytes(GGML_TYPE_Q8_0, 576, &nb) && nb == 612);
    CHECK(ggml_type_row_bytes(GGML_TYPE_Q6_K, 512, &nb) && nb == 420);
    CHECK(ggml_type_row_bytes(GGML_TYPE_F16, 3, &nb) && nb == 6);
    CHECK(!ggml_type_row_bytes(GGML_TYPE_Q4_0, 33, &nb));
    CHECK(!ggml_type_row_bytes(GGML_TYPE_F32, UINT64_MAX / 2, &nb)); /* overflow */
    CHECK(!ggml_type_row_bytes(4, 32, &nb));                         /* removed code */
    CHECK(ggml_type_get_traits(GGML_TYPE_COUNT_) == NULL);
    CHECK(ggml_type_get_traits(UINT32_MAX) == NULL);
    const struct ggml_type_traits *t = ggml_type_get_traits(GGML_TYPE_BF16);
    CHECK(t && strcmp(t->name, "BF16") == 0 && t->computable);
}

int main(void)
{
    test_fp16_exhaustive();
    test_fp16_rounding();
    test_fp16_nearest();
    test_fp16_bulk();
    test_bf16();
    test_type_traits();
    return tu_finish();
}
