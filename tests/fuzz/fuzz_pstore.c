/* fuzz_pstore.c — libFuzzer target for the cache value decoder
 * (pstore_value_decode): whatever bytes a cache file holds, decoding ends in
 * a block or a clean refusal, and an accepted block is one the codec can
 * carry again unchanged.
 *
 * Input: byte 0 picks the expected model shape (three small ones, f16 and
 * f32), byte 1 the mode, the rest is the value. Mode bit 0 first repairs
 * the value's checksums (header, and payload when the zstd frame inflates
 * to the announced size), so that the fuzzer gets past them and exercises
 * the checks behind; bit 1 passes the value's own tokens as the expected
 * ones (else NULL; bit 2 then passes other tokens, which must never be
 * accepted).
 *
 * Properties (a violation traps, so the replay test fails too):
 *   - the status is KVB_OK, KVB_ERR_FORMAT or KVB_ERR_NOT_FOUND; NOT_FOUND
 *     only when tokens were given;
 *   - decoding is deterministic (same bytes out twice);
 *   - an accepted block re-encoded lossless decodes to the same bytes, and
 *     re-encoded lossy8 decodes at all;
 *   - the decoder never writes outside the block (ASan) and never reads
 *     outside the value (the value is copied into an exact-size buffer).
 * This file is test code, so it may stop the process when a property fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#include "base/alloc.h"
#include "store/pstore/pstore.h"
#include "store/pstore/pstore_internal.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_pstore: %s:%d: %s\n", __FILE__, __LINE__, #c);                                       \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

static const struct {
    enum pstore_dtype dt;
    int bs, n_layer, kv_dim;
} SHAPES[3] = {{PSTORE_DTYPE_F16, 4, 2, 8}, {PSTORE_DTYPE_F32, 2, 1, 4}, {PSTORE_DTYPE_F16, 16, 2, 64}};

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Rewrites the payload and header checksums where the structure allows. */
static void repair(uint8_t *v, size_t len)
{
    if (len < PSTORE_HDR_FIXED + 8) return;
    uint32_t bs = (uint32_t)v[28] | ((uint32_t)v[29] << 8) | ((uint32_t)v[30] << 16) | ((uint32_t)v[31] << 24);
    if (bs == 0 || bs > PSTORE_MAX_BLOCK) return;
    size_t hl = pstore_hdr_len(bs);
    if (len < hl) return;
    uint64_t want = get_u64(v + 48);
    if (want > 0 && want <= (1u << 20)) {
        uint8_t *buf = malloc((size_t)want);
        size_t got = ZSTD_decompress(buf, (size_t)want, v + hl, len - hl);
        if (!ZSTD_isError(got) && got == want) put_u64(v + 64, XXH3_64bits(buf, (size_t)want));
        free(buf);
    }
    put_u64(v + hl - 8, XXH3_64bits(v, hl - 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const int si = data[0] % 3, mode = data[1];
    struct pstore_model m = {.name = "fuzz",
                             .dtype = SHAPES[si].dt,
                             .block_size = SHAPES[si].bs,
                             .n_layer = SHAPES[si].n_layer,
                             .kv_dim = SHAPES[si].kv_dim};
    memcpy(m.fingerprint, "00112233445566778899aabbccddeeff", 33);
    size_t len = size - 2;
    /* An exact-size copy, so that any read past the value is caught. */
    uint8_t *val = malloc(len ? len : 1);
    REQUIRE(val != NULL);
    memcpy(val, data + 2, len);
    if (mode & 1) repair(val, len);

    int32_t tokens[16];
    const int32_t *want = NULL;
    struct pstore_hdr h;
    bool parsed = pstore_hdr_parse(val, len, &h, NULL) == KVB_OK;
    if ((mode & 2) && parsed && h.block_size == (uint32_t)m.block_size) {
        for (int j = 0; j < m.block_size; j++) tokens[j] = pstore_hdr_token(&h, (uint32_t)j);
        if (mode & 4) tokens[m.block_size - 1] ^= 1;
        want = tokens;
    }
    size_t raw =
        (size_t)m.n_layer * 2 * (size_t)m.block_size * (size_t)m.kv_dim * (m.dtype == PSTORE_DTYPE_F16 ? 2 : 4);
    uint8_t *out = malloc(raw), *out2 = malloc(raw), *out3 = malloc(raw);
    REQUIRE(out && out2 && out3);
    struct kvb_err err;
    enum kvb_status st = pstore_value_decode(&m, want, val, len, out, &err);
    REQUIRE(st == KVB_OK || st == KVB_ERR_FORMAT || st == KVB_ERR_NOT_FOUND);
    REQUIRE(st != KVB_ERR_NOT_FOUND || want != NULL);
    if (st == KVB_OK) {
        REQUIRE(parsed);
        REQUIRE(!(mode & 4) || want == NULL);
        REQUIRE(pstore_value_decode(&m, want, val, len, out2, NULL) == KVB_OK);
        REQUIRE(memcmp(out, out2, raw) == 0);
        int32_t toks[16];
        for (int j = 0; j < m.block_size; j++) toks[j] = pstore_hdr_token(&h, (uint32_t)j);
        uint8_t *v2 = NULL;
        size_t l2 = 0;
        REQUIRE(pstore_value_encode(&m, toks, out, 1, false, &v2, &l2, NULL) == KVB_OK);
        REQUIRE(pstore_value_decode(&m, toks, v2, l2, out3, NULL) == KVB_OK);
        REQUIRE(memcmp(out, out3, raw) == 0);
        kvb_free(v2);
        REQUIRE(pstore_value_encode(&m, toks, out, 1, true, &v2, &l2, NULL) == KVB_OK);
        REQUIRE(pstore_value_decode(&m, toks, v2, l2, out3, NULL) == KVB_OK);
        kvb_free(v2);
    }
    free(out);
    free(out2);
    free(out3);
    free(val);
    return 0;
}
