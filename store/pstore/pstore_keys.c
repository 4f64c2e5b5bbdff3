/* pstore_keys.c — naming things in the persistent prefix cache: the model
 * identity that seeds every key chain and is stamped into every value, the
 * chained block keys, and the default cache directory.
 *
 * The identity covers everything that makes a stored block meaningless for
 * another reader: the weights (fingerprint), the KV element type, the block
 * size, the shape, the format version, and the arithmetic when it is not
 * the reference one (appended only then, so the reference's keys are those
 * of caches written before the field existed). Keys are XXH3-128: at 2^-64
 * collision odds per pair a collision is not expected in practice, and the
 * stored token ids catch one anyway. Tokens are hashed as little-endian
 * bytes so that keys are the same on every host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* For XXH3_state_t on the stack (no allocation per key). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "store/pstore/pstore_bytes.h"
#include "store/pstore/pstore_internal.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The identity of m; does not validate m (pstore_shape_init does). The
 * fingerprint is taken lowercase so that "AB.." and "ab.." name one model. */
static void model_identity(const struct pstore_model *m, uint8_t id[16])
{
    uint8_t buf[24 + 32 + 20 + PSTORE_ARITH_MAX];
    memcpy(buf, "kvbatch pstore identity\0", 24);
    for (int i = 0; i < 32; i++) {
        char c = m->fingerprint[i];
        buf[24 + i] = (uint8_t)((c >= 'A' && c <= 'F') ? c - 'A' + 'a' : c);
    }
    put_u32(buf + 56, PSTORE_FORMAT_VERSION);
    put_u32(buf + 60, (uint32_t)m->dtype);
    put_u32(buf + 64, (uint32_t)m->block_size);
    put_u32(buf + 68, (uint32_t)m->n_layer);
    put_u32(buf + 72, (uint32_t)m->kv_dim);
    size_t n = 76, a = m->arith ? strlen(m->arith) : 0;
    if (a) {
        if (a > PSTORE_ARITH_MAX - 1) a = PSTORE_ARITH_MAX - 1; /* pstore_shape_init refuses longer */
        memcpy(buf + n, m->arith, a);
        n += a;
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, n));
    memcpy(id, c.digest, 16);
}

enum kvb_status pstore_shape_init(const struct pstore_model *m, struct pstore_shape *s, struct kvb_err *err)
{
    if (!m) return kvb_errf(err, KVB_ERR_INVALID_ARG, "no model given");
    for (int i = 0; i < 32; i++)
        if (hexval(m->fingerprint[i]) < 0)
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "model fingerprint is not 32 hex digits");
    if (m->fingerprint[32] != '\0')
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "model fingerprint is longer than 32 hex digits");
    if (m->arith && strlen(m->arith) >= PSTORE_ARITH_MAX)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "arithmetic name '%.40s…' is longer than %d bytes", m->arith,
                        PSTORE_ARITH_MAX - 1);
    uint32_t esize = 1, kg = 0, vg = 0;
    switch (m->dtype) {
    case PSTORE_DTYPE_F16: esize = 2; break;
    case PSTORE_DTYPE_F32: esize = 4; break;
    case PSTORE_DTYPE_Q8: kg = vg = 34; break;
    case PSTORE_DTYPE_Q4: /* K rows stay q8 (backend/kvtype.h) */
        kg = 34;
        vg = 20;
        break;
    default: return kvb_errf(err, KVB_ERR_INVALID_ARG, "unknown KV dtype %d", (int)m->dtype);
    }
    if (kg && m->kv_dim % PSTORE_QGROUP != 0)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "kv_dim %d is not whole groups of %d (quantized KV dtype)",
                        (int)m->kv_dim, PSTORE_QGROUP);
    if (m->block_size <= 0 || (uint32_t)m->block_size > PSTORE_MAX_BLOCK || m->n_layer <= 0 || m->kv_dim <= 0)
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "bad block shape: block_size %d (1..%u), n_layer %d, kv_dim %d",
                        (int)m->block_size, PSTORE_MAX_BLOCK, (int)m->n_layer, (int)m->kv_dim);
    uint64_t rows = (uint64_t)m->n_layer * 2u * (uint64_t)m->block_size;
    /* n_layer and kv_dim are below 2^31 and rows below 2^44, so checking
     * each factor against the limit first keeps the product exact. */
    if (rows > PSTORE_MAX_RAW || (uint64_t)m->kv_dim > PSTORE_MAX_RAW ||
        rows * (uint64_t)m->kv_dim > PSTORE_MAX_RAW / (esize > 2 ? esize : 2))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "block of %d layers x %d x %d tokens is larger than %llu bytes",
                        (int)m->n_layer, (int)m->kv_dim, (int)m->block_size, (unsigned long long)PSTORE_MAX_RAW);
    memset(s, 0, sizeof *s);
    model_identity(m, s->identity);
    s->dtype = m->dtype;
    s->block_size = (uint32_t)m->block_size;
    s->n_layer = (uint32_t)m->n_layer;
    s->kv_dim = (uint32_t)m->kv_dim;
    s->esize = esize;
    s->k_gbytes = kg;
    s->v_gbytes = vg;
    s->n_rows = rows;
    s->raw_len = kg ? rows / 2 * ((uint64_t)m->kv_dim / PSTORE_QGROUP) * (kg + vg) : rows * (uint64_t)m->kv_dim * esize;
    return KVB_OK;
}

void pstore_key_next_le(const uint8_t prev[16], const uint8_t *tokens_le, uint32_t n, struct pstore_key *out)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, prev, 16);
    XXH3_128bits_update(&st, tokens_le, (size_t)n * 4u);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out->b, c.digest, 16);
}

void pstore_key_next(const uint8_t prev[16], const int32_t *tokens, uint32_t n, struct pstore_key *out)
{
    /* Converted in chunks so that no block size needs a heap buffer. */
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, prev, 16);
    uint8_t buf[1024];
    for (uint32_t i = 0; i < n;) {
        uint32_t k = n - i < sizeof buf / 4 ? n - i : (uint32_t)(sizeof buf / 4);
        for (uint32_t j = 0; j < k; j++) put_u32(buf + 4 * j, (uint32_t)tokens[i + j]);
        XXH3_128bits_update(&st, buf, (size_t)k * 4u);
        i += k;
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out->b, c.digest, 16);
}

void pstore_chain_keys(const struct pstore_model *m, const int32_t *tokens, int32_t n_blocks, struct pstore_key *keys)
{
    uint8_t id[16];
    model_identity(m, id);
    uint32_t bs = m->block_size > 0 ? (uint32_t)m->block_size : 0;
    for (int32_t i = 0; i < n_blocks; i++)
        pstore_key_next(i == 0 ? id : keys[i - 1].b, tokens + (size_t)i * bs, bs, &keys[i]);
}

void pstore_hex16(const uint8_t b[16], char out[33])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[32] = '\0';
}

void pstore_default_dir(char *buf, size_t cap)
{
    if (!buf || cap == 0) return;
    const char *v = getenv("KVBATCH_CACHE_DIR");
    if (v && *v) {
        snprintf(buf, cap, "%s", v);
        return;
    }
    v = getenv("XDG_CACHE_HOME");
    if (v && *v) {
        snprintf(buf, cap, "%s/kvbatch", v);
        return;
    }
    v = getenv("HOME");
    /* Without a home (some batch schedulers) a directory beside the job is
     * the least surprising place: the user sees it and can remove it. */
    snprintf(buf, cap, "%s/.cache/kvbatch", v && *v ? v : ".");
}
