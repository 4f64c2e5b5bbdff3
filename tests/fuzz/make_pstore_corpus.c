/* make_pstore_corpus.c — writes the seed files of tests/fuzz/corpus/pstore/.
 *
 * Not part of the build: run by hand when the value format changes, e.g.
 *   cc -std=c11 -D_GNU_SOURCE -Isrc -Istore tests/fuzz/make_pstore_corpus.c \
 *      store/pstore_codec.c store/pstore_keys.c src/dtype.c src/alloc.c src/status.c \
 *      -lzstd -lxxhash -lm -o /tmp/mkpcorpus && /tmp/mkpcorpus tests/fuzz/corpus/pstore
 * Each seed is [shape byte][mode byte][value] as fuzz_pstore.c reads it:
 * valid values of every shape (random and smooth data, lossless and lossy8,
 * other zstd levels) and damaged ones (truncated, bit flips, other version,
 * other model, unknown flags, wrong lengths, empty), so that the fuzzer
 * starts from inputs that reach every check of the decoder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "store/pstore/pstore.h"
#include "store/pstore/pstore_internal.h"

static const char *out_dir;

static const struct {
    enum pstore_dtype dt;
    int bs, n_layer, kv_dim;
} SHAPES[3] = {{PSTORE_DTYPE_F16, 4, 2, 8}, {PSTORE_DTYPE_F32, 2, 1, 4}, {PSTORE_DTYPE_F16, 16, 2, 64}};

static void save(const char *name, int shape, int mode, const uint8_t *v, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *f = fopen(path, "wb");
    uint8_t pre[2] = {(uint8_t)shape, (uint8_t)mode};
    if (!f || fwrite(pre, 1, 2, f) != 2 || (n && fwrite(v, 1, n, f) != n)) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static struct pstore_model model(int si)
{
    struct pstore_model m = {.name = "fuzz",
                             .dtype = SHAPES[si].dt,
                             .block_size = SHAPES[si].bs,
                             .n_layer = SHAPES[si].n_layer,
                             .kv_dim = SHAPES[si].kv_dim};
    memcpy(m.fingerprint, "00112233445566778899aabbccddeeff", 33);
    return m;
}

static uint8_t *encode(int si, bool smooth, bool lossy, int level, size_t *len)
{
    struct pstore_model m = model(si);
    size_t esz = m.dtype == PSTORE_DTYPE_F16 ? 2 : 4;
    size_t n = (size_t)m.n_layer * 2 * (size_t)m.block_size * (size_t)m.kv_dim;
    uint8_t *raw = malloc(n * esz);
    uint32_t s = 12345u + (uint32_t)si;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float x = smooth ? (float)((int)(i % 97) - 48) / 16.0f : (float)((int)(s >> 8) % 2001 - 1000) / 250.0f;
        if (esz == 2) {
            uint16_t h = kvb_f32_to_fp16(x);
            memcpy(raw + 2 * i, &h, 2);
        } else {
            memcpy(raw + 4 * i, &x, 4);
        }
    }
    int32_t tokens[16];
    for (int j = 0; j < m.block_size; j++) tokens[j] = 100 + j * 3;
    uint8_t *v = NULL;
    if (pstore_value_encode(&m, tokens, raw, level, lossy, &v, len, NULL) != KVB_OK) exit(1);
    free(raw);
    return v;
}

/* Shape 0 with elements of a few f16 subnormal units, lossy8 requested. */
static uint8_t *encode_tiny(size_t *len)
{
    struct pstore_model m = model(0);
    size_t n = (size_t)m.n_layer * 2 * (size_t)m.block_size * (size_t)m.kv_dim;
    uint16_t *raw = malloc(n * 2);
    for (size_t i = 0; i < n; i++) raw[i] = (uint16_t)(i % 7) | (i & 8 ? 0x8000 : 0);
    int32_t tokens[16] = {0};
    uint8_t *v = NULL;
    if (pstore_value_encode(&m, tokens, raw, 3, true, &v, len, NULL) != KVB_OK) exit(1);
    free(raw);
    return v;
}

static void fix_header(uint8_t *v, size_t len, int si)
{
    size_t hl = pstore_hdr_len((uint32_t)SHAPES[si].bs);
    if (len < hl) return;
    uint64_t h = XXH3_64bits(v, hl - 8);
    for (int i = 0; i < 8; i++) v[hl - 8 + (size_t)i] = (uint8_t)(h >> (8 * i));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    char name[64];
    for (int si = 0; si < 3; si++) {
        size_t len;
        uint8_t *v = encode(si, false, false, 3, &len);
        snprintf(name, sizeof name, "s%d_random_lossless", si);
        save(name, si, 2, v, len);
        if (si != 1) {
            snprintf(name, sizeof name, "s%d_othertokens", si);
            save(name, si, 6, v, len);
        }
        snprintf(name, sizeof name, "s%d_truncated", si);
        save(name, si, 2, v, len * 2 / 3);
        uint8_t *d = malloc(len + 8);
        memcpy(d, v, len);
        d[len - 3] ^= 0x40;
        snprintf(name, sizeof name, "s%d_frameflip_repaired", si);
        save(name, si, 3, d, len);
        if (si == 2) {
            memcpy(d, v, len);
            d[4] = 2;
            fix_header(d, len, si);
            save("s2_version2", si, 2, d, len);
            memcpy(d, v, len);
            d[9] ^= 1;
            fix_header(d, len, si);
            save("s2_othermodel", si, 2, d, len);
        }
        kvb_free(v);
        free(d);

        v = encode(si, true, true, 3, &len);
        snprintf(name, sizeof name, "s%d_smooth_lossy8", si);
        save(name, si, 2, v, len);
        if (si == 2) {
            d = malloc(len);
            memcpy(d, v, len);
            d[PSTORE_HDR_FIXED + 4u * (size_t)SHAPES[si].bs + 8u + 2u] ^= 0x7c; /* inside the frame */
            save("s2_lossy8_damaged_repair", si, 3, d, len);
            free(d);
        }
        kvb_free(v);
    }
    size_t len;
    uint8_t *v = encode(2, true, false, 19, &len);
    save("s2_smooth_level19", 2, 2, v, len);
    uint8_t *d = malloc(len + 8);
    memcpy(d, v, len);
    d[6] = 0x02; /* unknown flag */
    fix_header(d, len, 2);
    save("s2_unknown_flag", 2, 3, d, len);
    memcpy(d, v, len);
    d[48] ^= 1; /* payload length */
    save("s2_payload_len_repaired", 2, 1, d, len);
    memcpy(d, v, len);
    d[28] = 8; /* block size 8, header no longer where the checksum is */
    save("s2_blocksize8", 2, 1, d, len);
    save("s1_as_shape0", 0, 2, v, len); /* a value of another shape */
    save("empty", 0, 0, v, 0);
    kvb_free(v);
    free(d);

    /* shape 0: one seed per check that the repair mode can reach */
    v = encode(0, false, false, 3, &len);
    d = malloc(len + 8);
    memcpy(d, v, len);
    d[34] ^= 0x10; /* n_layer byte, checksum not repaired */
    save("s0_header_flip", 0, 2, d, len);
    memcpy(d, v, len);
    memset(d + 28, 0, 4); /* block size 0 */
    save("s0_blocksize0", 0, 1, d, len);
    memcpy(d, v, len);
    d[32] = 3; /* n_layer 3 */
    save("s0_nlayer3_repaired", 0, 3, d, len);
    memcpy(d, v, len);
    d[41] ^= 1; /* raw length */
    save("s0_rawlen_repaired", 0, 3, d, len);
    memcpy(d, v, len);
    memset(d + len, 0, 4); /* 4 bytes after the frame, counted in the length */
    d[56] = (uint8_t)(d[56] + 4);
    save("s0_trailing_repaired", 0, 1, d, len + 4);
    memcpy(d, v, len);
    d[64] ^= 1; /* payload checksum, header checksum fixed */
    fix_header(d, len, 0);
    save("s0_payload_sum", 0, 2, d, len);
    kvb_free(v);
    free(d);
    /* values near the smallest subnormal: the lossy8 scale underflows */
    v = encode_tiny(&len);
    save("s0_tiny_lossy8", 0, 2, v, len);
    kvb_free(v);
    return 0;
}
