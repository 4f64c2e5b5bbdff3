/* make_pstore_file_corpus.c — writes the seed files of
 * tests/fuzz/corpus/pstore_file/: data.mdb files of small real caches.
 *
 * Not part of the build: run by hand when the store's layout changes, e.g.
 *   cc -std=c11 -D_GNU_SOURCE -Isrc -Istore tests/fuzz/make_pstore_file_corpus.c build/libkvbcore.a \
 *      -llmdb -lzstd -lsqlite3 -lxxhash -lpthread -lm -o /tmp/mkfcorpus && \
 *      /tmp/mkfcorpus tests/fuzz/corpus/pstore_file
 * Seeds: an empty store (the four named databases, nothing in them); values
 * inline in leaf pages; values on overflow pages with a free list left by a
 * GC; enough entries for branch pages. So the fuzzer starts from files that
 * reach every kind of page the check walks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/pstore/pstore.h"

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void chains(struct pstore *ps, const struct pstore_model *m, int n_chains, int n_blocks, uint64_t seed)
{
    size_t raw = (size_t)m->n_layer * 2 * (size_t)m->block_size * (size_t)m->kv_dim * 2;
    uint8_t *data = malloc(raw);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(m->block_size * n_blocks));
    struct pstore_key *keys = malloc(sizeof *keys * (size_t)n_blocks);
    for (int c = 0; c < n_chains; c++) {
        for (int i = 0; i < m->block_size * n_blocks; i++) tok[i] = (int32_t)(rng(&seed) % 40000);
        pstore_chain_keys(m, tok, n_blocks, keys);
        for (int b = 0; b < n_blocks; b++) {
            for (size_t i = 0; i < raw; i++) data[i] = (uint8_t)(rng(&seed) >> 30);
            pstore_put(ps, m, &keys[b], b ? &keys[b - 1] : NULL, tok + b * m->block_size, data);
        }
        pstore_flush(ps);
    }
    free(data);
    free(tok);
    free(keys);
}

static void seed_file(const char *out_dir, const char *name, int kind)
{
    char dir[] = "/tmp/kvb_mkfcorpus_XXXXXX";
    if (!mkdtemp(dir)) exit(1);
    struct pstore_opts o = {.n_threads = 1, .quiet = true};
    struct pstore *ps = NULL;
    if (pstore_open(dir, &o, &ps, NULL) != KVB_OK) exit(1);
    struct pstore_model small = {.name = "s", .dtype = PSTORE_DTYPE_F16, .block_size = 4, .n_layer = 1, .kv_dim = 8};
    struct pstore_model big = {.name = "b", .dtype = PSTORE_DTYPE_F16, .block_size = 8, .n_layer = 2, .kv_dim = 64};
    memcpy(small.fingerprint, "0123456789abcdef0123456789abcdef", 33);
    memcpy(big.fingerprint, "fedcba9876543210fedcba9876543210", 33);
    if (kind == 1) chains(ps, &small, 3, 3, 11);
    if (kind == 2) {
        chains(ps, &big, 3, 2, 12);
        uint64_t n;
        pstore_gc(ps, 12 << 10, &n, NULL);
        chains(ps, &small, 1, 2, 13);
    }
    if (kind == 3) chains(ps, &small, 40, 3, 14);
    pstore_close(ps);
    char src[128], dst[1024], cmd[1400];
    snprintf(src, sizeof src, "%s/data.mdb", dir);
    snprintf(dst, sizeof dst, "%s/%s", out_dir, name);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && rm -rf '%s'", src, dst, dir);
    if (system(cmd) != 0) exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    seed_file(argv[1], "empty", 0);
    seed_file(argv[1], "inline", 1);
    seed_file(argv[1], "overflow-free", 2);
    seed_file(argv[1], "branch", 3);
    return 0;
}
