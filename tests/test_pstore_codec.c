/* test_pstore_codec.c — the persistent store's value codec: the lossless
 * round trip is bit-exact on any f16/f32 bit pattern (Inf, NaN, -0,
 * subnormals); lossy8 error is measured and bounded; every truncation and
 * byte flip is refused or harmless; compression ratio and single-thread
 * throughput on KV-like data (printed); quantized (q8, q4) blocks kept byte
 * for byte, their scales-apart layout against plain zstd; half
 * conversions; allocation failures. The store itself: test_pstore.c. */
#include <errno.h>
#include <lmdb.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <zstd.h>

#include "backend/kvtype.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "store/pstore/pstore.h"
#include "store/pstore/pstore_internal.h"
#include "support/testutil.h"

#include "pstore_check.h"

/* ---- codec ------------------------------------------------------------------------- */

static void test_codec_lossless(void)
{
    const enum pstore_dtype dts[2] = {PSTORE_DTYPE_F16, PSTORE_DTYPE_F32};
    for (int d = 0; d < 2; d++) {
        struct pstore_model m = model(FP_A, dts[d], 16, 2, 64);
        size_t raw = raw_bytes(&m);
        uint8_t *data = malloc(raw), *out = malloc(raw);
        fill_random(data, raw, 1 + (uint64_t)d);
        if (dts[d] == PSTORE_DTYPE_F16) {
            /* every special pattern: +-0, +-Inf, NaNs, subnormals, max */
            static const uint16_t sp[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00,
                                          0x7c01, 0xfe01, 0x0001, 0x83ff, 0x7bff};
            memcpy(data, sp, sizeof sp);
        } else {
            static const uint32_t sp[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000,
                                          0x7fc00000, 0x7f800001, 0x00000001};
            memcpy(data, sp, sizeof sp);
        }
        int32_t tokens[16];
        for (int i = 0; i < 16; i++) tokens[i] = i * 1000 - 5;
        uint8_t *val = NULL;
        size_t len = 0;
        struct kvb_err err = {{0}};
        CHECK_MSG(pstore_value_encode(&m, tokens, data, 0, false, &val, &len, &err) == KVB_OK, "%s", err.msg);
        CHECK(pstore_value_decode(&m, tokens, val, len, out, &err) == KVB_OK);
        CHECK(!memcmp(data, out, raw));
        CHECK(pstore_value_decode(&m, NULL, val, len, out, &err) == KVB_OK);
        /* lossy8 asked, but Inf/NaN present: stored lossless, still exact */
        uint8_t *val2 = NULL;
        size_t len2 = 0;
        CHECK(pstore_value_encode(&m, tokens, data, 1, true, &val2, &len2, &err) == KVB_OK);
        CHECK(len2 > 8 && (val2[6] & PSTORE_FLAG_LOSSY8) == 0);
        CHECK(pstore_value_decode(&m, tokens, val2, len2, out, &err) == KVB_OK && !memcmp(data, out, raw));
        kvb_free(val2);

        /* wrong expectations */
        int32_t other[16];
        memcpy(other, tokens, sizeof other);
        other[7]++;
        CHECK(pstore_value_decode(&m, other, val, len, out, &err) == KVB_ERR_NOT_FOUND);
        struct pstore_model mb = m;
        memcpy(mb.fingerprint, FP_B, 33);
        CHECK(pstore_value_decode(&mb, tokens, val, len, out, &err) == KVB_ERR_FORMAT);
        CHECK(strstr(err.msg, "another model") != NULL);
        mb = m;
        mb.kv_dim = 32;
        CHECK(pstore_value_decode(&mb, NULL, val, len, out, &err) == KVB_ERR_FORMAT);
        mb = m;
        mb.block_size = 8;
        CHECK(pstore_value_decode(&mb, NULL, val, len, out, &err) == KVB_ERR_FORMAT);

        /* every truncation fails; every single-byte flip fails or decodes
         * to the very same bytes (a flip in an unused zstd bit) */
        for (size_t n = 0; n < len; n++) CHECK(pstore_value_decode(&m, tokens, val, n, out, NULL) == KVB_ERR_FORMAT);
        uint8_t *bad = malloc(len + 1);
        for (size_t i = 0; i < len; i += (i < 200 ? 1 : 37)) {
            memcpy(bad, val, len);
            bad[i] ^= (uint8_t)(1u << (i % 8));
            enum kvb_status st = pstore_value_decode(&m, tokens, bad, len, out, NULL);
            CHECK_MSG(st == KVB_ERR_FORMAT || (st == KVB_OK && !memcmp(out, data, raw)), "flip at %zu: %d", i, st);
        }
        /* one byte longer */
        memcpy(bad, val, len);
        bad[len] = 0;
        CHECK(pstore_value_decode(&m, tokens, bad, len + 1, out, NULL) == KVB_ERR_FORMAT);
        free(bad);
        kvb_free(val);
        free(data);
        free(out);
    }
}

static void test_codec_lossy(void)
{
    struct pstore_model m = model(FP_A, PSTORE_DTYPE_F16, 16, 30, 192);
    size_t raw = raw_bytes(&m);
    uint16_t *data = malloc(raw), *out = malloc(raw);
    fill_kvlike(&m, data, 5);
    /* rows of zeros and of tiny subnormals quantize too */
    memset(data, 0, 192 * 2);
    for (int j = 0; j < 192; j++) data[192 + j] = (uint16_t)(j % 3);
    int32_t tokens[16] = {0};
    uint8_t *val = NULL;
    size_t len = 0;
    struct kvb_err err = {{0}};
    CHECK(pstore_value_encode(&m, tokens, data, 3, true, &val, &len, &err) == KVB_OK);
    CHECK((val[6] & PSTORE_FLAG_LOSSY8) != 0);
    CHECK_MSG(pstore_value_decode(&m, tokens, val, len, out, &err) == KVB_OK, "%s", err.msg);
    struct err_stats e = lossy_error(&m, data, out);
    printf("lossy8: %.2fx smaller than raw; max abs error %.4g, max error / row max %.4f, relative RMS error %.4f\n",
           (double)raw / (double)len, e.max_abs, e.max_rel_row, e.rms_rel);
    /* int8 with a per-row scale: at most half a step (amax/254) plus the f16
     * roundings of scale and result. The RMS error is set by the row's
     * largest element: with outlier channels (as here, and in real K) the
     * step is coarse for the ordinary ones, about 2 % of the signal RMS. */
    CHECK(e.max_rel_row <= 0.5 / 127.0 * 1.01 + 2.0 / 1024.0);
    CHECK(e.rms_rel < 0.03);
    kvb_free(val);
    free(data);
    free(out);
}

/* Ratio and one-thread speed at the shape of SmolLM2-135M (30 layers, 3 KV
 * heads x 64, blocks of 16 tokens: 360 KiB per block). */
static void test_codec_ratio_speed(void)
{
    struct pstore_model m = model(FP_A, PSTORE_DTYPE_F16, 16, 30, 192);
    size_t raw = raw_bytes(&m);
    enum { NB = 8 };
    uint16_t *data = malloc(raw * NB), *out = malloc(raw);
    for (int i = 0; i < NB; i++) fill_kvlike(&m, data + (size_t)i * raw / 2, 100 + (uint64_t)i);
    int32_t tokens[16] = {0};
    struct pstore_shape s;
    CHECK(pstore_shape_init(&m, &s, NULL) == KVB_OK);
    const struct {
        int level;
        bool lossy;
    } cfg[] = {{1, false}, {3, false}, {9, false}, {3, true}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        struct pstore_codec cod = {0};
        size_t total = 0;
        const uint8_t *v;
        size_t len;
        uint8_t *vals[NB];
        size_t lens[NB];
        for (int i = 0; i < NB; i++) {
            CHECK(pstore_codec_encode(&cod, &s, tokens, data + (size_t)i * raw / 2, NULL, cfg[c].level, cfg[c].lossy,
                                      &v, &len, NULL) == KVB_OK);
            vals[i] = malloc(len);
            memcpy(vals[i], v, len);
            lens[i] = len;
            total += len;
        }
        double t0 = now();
        int iters = 0;
        do {
            for (int i = 0; i < NB; i++)
                pstore_codec_encode(&cod, &s, tokens, data + (size_t)i * raw / 2, NULL, cfg[c].level, cfg[c].lossy, &v,
                                    &len, NULL);
            iters += NB;
        } while (now() - t0 < 0.25);
        double enc = (double)raw * iters / (now() - t0) / 1e6;
        t0 = now();
        int dits = 0;
        do {
            for (int i = 0; i < NB; i++)
                CHECK(pstore_codec_decode(&cod, &s, tokens, true, vals[i], lens[i], out, NULL, NULL) == KVB_OK);
            dits += NB;
        } while (now() - t0 < 0.25);
        double dec = (double)raw * dits / (now() - t0) / 1e6;
        printf("KV-like f16, %s zstd level %d: ratio %.3fx (%.1f bytes/token), encode %.0f MB/s, decode %.0f MB/s "
               "(raw bytes, one thread)\n",
               cfg[c].lossy ? "lossy8," : "lossless,", cfg[c].level, (double)raw * NB / (double)total,
               (double)total / NB / 16.0, enc, dec);
        if (!cfg[c].lossy) CHECK((double)raw * NB / (double)total > 1.1);
        for (int i = 0; i < NB; i++) free(vals[i]);
        pstore_codec_free(&cod);
    }
    free(data);
    free(out);
}

/* Q8/Q4 values: any bytes come back exactly (the codec never looks inside
 * a group), lossy8 does not apply, a value is another model's to an f16
 * reader, damage is refused, a kv_dim of partial groups cannot be stored. */
static void test_codec_quantized(void)
{
    const enum pstore_dtype dts[2] = {PSTORE_DTYPE_Q8, PSTORE_DTYPE_Q4};
    for (int d = 0; d < 2; d++) {
        struct pstore_model m = model(FP_A, dts[d], 16, 2, 64);
        size_t raw = raw_bytes(&m);
        CHECK(raw == (size_t)2 * 16 * 2 * (dts[d] == PSTORE_DTYPE_Q8 ? 34 + 34 : 34 + 20));
        uint8_t *data = malloc(raw), *out = malloc(raw);
        fill_random(data, raw, 11 + (uint64_t)d);
        int32_t tokens[16];
        for (int i = 0; i < 16; i++) tokens[i] = i * 31 + 2;
        uint8_t *val = NULL;
        size_t len = 0;
        struct kvb_err err = {{0}};
        CHECK_MSG(pstore_value_encode(&m, tokens, data, 0, true, &val, &len, &err) == KVB_OK, "%s", err.msg);
        CHECK((val[6] & PSTORE_FLAG_LOSSY8) == 0); /* stored as it is */
        CHECK(pstore_value_decode(&m, tokens, val, len, out, &err) == KVB_OK && !memcmp(data, out, raw));
        struct pstore_model mf = m;
        mf.dtype = PSTORE_DTYPE_F16;
        uint8_t *out16 = malloc(raw_bytes(&mf));
        CHECK(pstore_value_decode(&mf, tokens, val, len, out16, &err) == KVB_ERR_FORMAT);
        free(out16);
        for (size_t n = 0; n < len; n += 3) CHECK(pstore_value_decode(&m, tokens, val, n, out, NULL) == KVB_ERR_FORMAT);
        uint8_t *bad = malloc(len);
        for (size_t i = 0; i < len; i += (i < 200 ? 1 : 29)) {
            memcpy(bad, val, len);
            bad[i] ^= (uint8_t)(1u << (i % 8));
            enum kvb_status st = pstore_value_decode(&m, tokens, bad, len, out, NULL);
            CHECK_MSG(st == KVB_ERR_FORMAT || (st == KVB_OK && !memcmp(out, data, raw)), "flip at %zu: %d", i, st);
        }
        free(bad);
        kvb_free(val);
        m.kv_dim = 48;
        CHECK(pstore_value_encode(&m, tokens, data, 0, false, &val, &len, &err) == KVB_ERR_INVALID_ARG);
        CHECK(strstr(err.msg, "kv_dim 48") != NULL);
        free(data);
        free(out);
    }
}

/* Bytes per token at SmolLM2-135M's shape: KV-like f16 blocks, and the same
 * values quantized by the reference (kvtype.h) and stored as q8 and q4;
 * the scales-apart payload against zstd of the plain groups. */
static void test_codec_quantized_ratio(void)
{
    enum { NB = 8, L = 30, D = 192, B = 16 };
    struct pstore_model m16 = model(FP_A, PSTORE_DTYPE_F16, B, L, D);
    const size_t raw16 = raw_bytes(&m16), rows = (size_t)L * 2 * B;
    uint16_t *h = malloc(raw16);
    float *x = malloc(sizeof(float) * D);
    double f16_bytes = 0;
    const enum pstore_dtype dts[2] = {PSTORE_DTYPE_Q8, PSTORE_DTYPE_Q4};
    const enum kv_type kts[2] = {KV_Q8, KV_Q4};
    double q_bytes[2] = {0, 0}, plain_bytes[2] = {0, 0};
    int32_t tokens[B] = {0};
    struct kvb_err err = {{0}};
    for (int i = 0; i < NB; i++) {
        fill_kvlike(&m16, h, 300 + (uint64_t)i);
        uint8_t *val;
        size_t len;
        CHECK(pstore_value_encode(&m16, tokens, h, 3, false, &val, &len, &err) == KVB_OK);
        f16_bytes += (double)len;
        kvb_free(val);
        for (int d = 0; d < 2; d++) {
            struct pstore_model mq = model(FP_A, dts[d], B, L, D);
            const size_t rq = raw_bytes(&mq);
            uint8_t *q = malloc(rq), *back = malloc(rq), *w = q;
            for (size_t r = 0; r < rows; r++) { /* [layer][K rows | V rows], as the pool */
                const enum kv_type rt = (r / B) % 2 ? kv_v_rows(kts[d]) : kv_k_rows(kts[d]);
                for (int j = 0; j < D; j++) x[j] = kvb_fp16_to_f32(h[r * D + (size_t)j]);
                kv_quantize_row(rt, w, x, D);
                w += kv_row_bytes(rt, D);
            }
            CHECK((size_t)(w - q) == rq);
            CHECK(pstore_value_encode(&mq, tokens, q, 3, false, &val, &len, &err) == KVB_OK);
            CHECK(pstore_value_decode(&mq, tokens, val, len, back, &err) == KVB_OK && !memcmp(q, back, rq));
            q_bytes[d] += (double)len;
            kvb_free(val);
            size_t bound = ZSTD_compressBound(rq);
            uint8_t *z = malloc(bound);
            size_t zl = ZSTD_compress(z, bound, q, rq, 3);
            CHECK(!ZSTD_isError(zl));
            plain_bytes[d] += (double)zl;
            free(z);
            free(q);
            free(back);
        }
    }
    printf("KV-like blocks, zstd level 3, bytes/token: f16 %.0f; q8 %.0f (%.1f %% of f16; plain groups %.0f); "
           "q4 %.0f (%.1f %%; plain groups %.0f)\n",
           f16_bytes / NB / B, q_bytes[0] / NB / B, 100.0 * q_bytes[0] / f16_bytes, plain_bytes[0] / NB / B,
           q_bytes[1] / NB / B, 100.0 * q_bytes[1] / f16_bytes, plain_bytes[1] / NB / B);
    /* no worse than zstd of the groups as they lie, header included */
    for (int d = 0; d < 2; d++) CHECK(q_bytes[d] <= plain_bytes[d] + (double)(NB * pstore_hdr_len(B)));
    CHECK(q_bytes[0] < 0.6 * f16_bytes && q_bytes[1] < 0.47 * f16_bytes);
    free(h);
    free(x);
}

static void test_half_conversions(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kvb_fp16_to_f32((uint16_t)h), b = pstore_h2f((uint16_t)h);
        CHECK_MSG(!memcmp(&a, &b, 4), "h2f %04x", h);
    }
    uint64_t s = 12345;
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = (uint32_t)rng_next(&s);
        if (i & 1) bits = (bits & 0x87ffffffu) | 0x38000000u; /* near the half range */
        float f;
        memcpy(&f, &bits, 4);
        CHECK_MSG(kvb_f32_to_fp16(f) == pstore_f2h(f), "f2h %08x", bits);
    }
}

/* The annex (a block's prompt scores): stored as given beside the K/V, with
 * its own checksum; asked for, a value without it is a miss (not damage);
 * not asked for, it is no obstacle; a flipped byte in it is damage. */
static void test_codec_annex(void)
{
    struct pstore_model m = model(FP_A, PSTORE_DTYPE_F16, 16, 2, 64);
    struct pstore_shape s;
    CHECK(pstore_shape_init(&m, &s, NULL) == KVB_OK);
    const size_t raw = raw_bytes(&m);
    uint16_t *data = malloc(raw), *out = malloc(raw);
    int32_t tokens[16];
    for (int j = 0; j < 16; j++) tokens[j] = 100 + j;
    fill_kvlike(&m, data, 9);
    uint8_t annex[300], back[300];
    fill_random(annex, sizeof annex, 4);
    struct pstore_codec cod = {0};
    const uint8_t *v;
    size_t len;
    const struct pstore_annex in = {annex, sizeof annex};
    CHECK(pstore_codec_encode(&cod, &s, tokens, data, &in, 3, false, &v, &len, NULL) == KVB_OK);
    uint8_t *val = malloc(len);
    memcpy(val, v, len);
    CHECK((val[6] & PSTORE_FLAG_ANNEX) != 0);
    struct pstore_annex want = {back, sizeof back};
    struct kvb_err err;
    memset(back, 0, sizeof back);
    CHECK(pstore_codec_decode(&cod, &s, tokens, false, val, len, out, &want, &err) == KVB_OK);
    CHECK(memcmp(out, data, raw) == 0 && memcmp(back, annex, sizeof annex) == 0);
    CHECK(pstore_codec_decode(&cod, &s, tokens, false, val, len, out, NULL, &err) == KVB_OK);
    struct pstore_annex other = {back, sizeof back - 1}; /* another length: not what was asked */
    CHECK(pstore_codec_decode(&cod, &s, tokens, false, val, len, out, &other, &err) == KVB_ERR_NOT_FOUND);
    /* every byte of the annex and of its length and checksum is checked */
    const size_t tail = 4 + sizeof annex + 8;
    for (size_t k = len - tail; k < len; k += 7) {
        val[k] ^= 0x10;
        CHECK_MSG(pstore_codec_decode(&cod, &s, tokens, false, val, len, out, &want, &err) == KVB_ERR_FORMAT,
                  "byte %zu of %zu flipped", k, len);
        val[k] ^= 0x10;
    }
    CHECK(pstore_codec_decode(&cod, &s, tokens, false, val, len - 1, out, NULL, &err) == KVB_ERR_FORMAT);
    /* without an annex: a miss when one is asked for */
    CHECK(pstore_codec_encode(&cod, &s, tokens, data, NULL, 3, false, &v, &len, NULL) == KVB_OK);
    CHECK((v[6] & PSTORE_FLAG_ANNEX) == 0);
    CHECK(pstore_codec_decode(&cod, &s, tokens, false, v, len, out, &want, &err) == KVB_ERR_NOT_FOUND);
    CHECK(pstore_codec_decode(&cod, &s, tokens, false, v, len, out, NULL, &err) == KVB_OK);
    pstore_codec_free(&cod);
    free(val);
    free(data);
    free(out);
}

static void test_codec_nomem(void)
{
    struct pstore_model m = model(FP_A, PSTORE_DTYPE_F16, 16, 2, 64);
    size_t raw = raw_bytes(&m);
    uint8_t *data = malloc(raw), *out = malloc(raw);
    fill_random(data, raw, 3);
    int32_t tokens[16] = {0};
    uint8_t *val;
    size_t len;
    CHECK(pstore_value_encode(&m, tokens, data, 0, false, &val, &len, NULL) == KVB_OK);
    for (long n = 0; n < 6; n++) {
        uint8_t *v2 = NULL;
        size_t l2;
        kvb_alloc_fail_after(n);
        enum kvb_status a = pstore_value_encode(&m, tokens, data, 0, false, &v2, &l2, NULL);
        enum kvb_status b = pstore_value_decode(&m, tokens, val, len, out, NULL);
        kvb_alloc_fail_after(-1);
        CHECK(a == KVB_OK || a == KVB_ERR_NOMEM);
        CHECK(b == KVB_OK || b == KVB_ERR_NOMEM);
        if (a == KVB_OK) kvb_free(v2);
    }
    kvb_free(val);
    free(data);
    free(out);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    test_codec_lossless();
    test_codec_lossy();
    test_codec_ratio_speed();
    test_codec_quantized();
    test_codec_quantized_ratio();
    test_half_conversions();
    test_codec_annex();
    test_codec_nomem();
    return tu_finish();
}
