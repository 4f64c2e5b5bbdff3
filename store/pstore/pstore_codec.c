/* pstore_codec.c — the bytes of one stored KV block: header, byte shuffle
 * (or, for quantized K/V, scales apart from quants) or int8 rows, zstd, and
 * a decoder that trusts nothing.
 *
 * Why shuffle: an f16 element's high byte (sign, exponent, two mantissa bits)
 * varies little across a block while its low byte is nearly noise; laid out
 * as they are, zstd sees one long noisy stream. Grouping all high bytes
 * together (and all low ones) lets it compress the high half well and store
 * the low half almost raw. Lossy8 keeps one f16 scale per row (one token's
 * K or V in one layer, kv_dim elements) and int8 values, halving the f16
 * bytes before zstd; its error is measured by the tests and it is off by
 * default because it breaks "warm output == cold output".
 *
 * Quantized K/V (Q8, Q4: groups of an fp16 scale [and minimum] then the
 * quants) are kept exactly. Their quants are near-uniform noise zstd can
 * hardly shrink, but the scales are fp16 values of one layer's activations,
 * as compressible as an f16 block's high bytes; interleaved every 34 or 20
 * bytes they are lost in the noise. So the payload is each header byte of
 * every group as its own stream (scale low bytes, scale high bytes, ...),
 * then every group's quants, K's taken from the slot before it. Measured on
 * SmolLM2-135M's real K/V (1022 blocks of README prompts, level 3): q8
 * 179.9 MB against 184.1 MB for zstd of the groups as they lie (f16: 328.3
 * MB, so q8 is 54.8 % of it).
 *
 * The decoder is also the fuzz target's subject: every length and field is
 * checked against the model the caller expects before a byte of payload is
 * touched, decompression writes only into a buffer of the exact payload
 * size, and the result must match a checksum. The layout is in
 * pstore_internal.h. Raw block bytes are kept as the pool holds them, which
 * is host order; kvbatch builds only for little-endian hosts. */
#include <float.h>
#include <math.h>
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "store/pstore/pstore_bytes.h"
#include "store/pstore/pstore_internal.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the value format assumes a little-endian host");

static int default_level(int level) { return level == 0 ? 3 : level; }

/* ---- shuffle ---------------------------------------------------------------- */

/* The element size is a constant in each branch so the loops vectorise. */
static void shuffle(uint8_t *restrict dst, const uint8_t *restrict src, size_t n, uint32_t esize)
{
    if (esize == 2) {
        uint8_t *d0 = dst, *d1 = dst + n;
        for (size_t i = 0; i < n; i++) {
            d0[i] = src[2 * i];
            d1[i] = src[2 * i + 1];
        }
    } else {
        uint8_t *d0 = dst, *d1 = dst + n, *d2 = dst + 2 * n, *d3 = dst + 3 * n;
        for (size_t i = 0; i < n; i++) {
            d0[i] = src[4 * i];
            d1[i] = src[4 * i + 1];
            d2[i] = src[4 * i + 2];
            d3[i] = src[4 * i + 3];
        }
    }
}

static void unshuffle(uint8_t *restrict dst, const uint8_t *restrict src, size_t n, uint32_t esize)
{
    if (esize == 2) {
        const uint8_t *s0 = src, *s1 = src + n;
        for (size_t i = 0; i < n; i++) {
            dst[2 * i] = s0[i];
            dst[2 * i + 1] = s1[i];
        }
    } else {
        const uint8_t *s0 = src, *s1 = src + n, *s2 = src + 2 * n, *s3 = src + 3 * n;
        for (size_t i = 0; i < n; i++) {
            dst[4 * i] = s0[i];
            dst[4 * i + 1] = s1[i];
            dst[4 * i + 2] = s2[i];
            dst[4 * i + 3] = s3[i];
        }
    }
}

/* Grouped types: header byte b of group g to its own stream, the quants
 * after all of them, group by group; in K sections each slot's quants as the
 * bytewise difference (mod 256) from the slot before it in the same row
 * position: RoPE turns K's low-frequency dimensions slowly and a channel's
 * magnitude persists from token to token, so the differences are narrower
 * than the quants. V's are not (measured: differences made V 3 % larger,
 * K 3 % smaller), so V quants are kept as they are. */
/* One section of a block (one layer's K rows or V rows: n groups of gb
 * bytes, gh of them scale and minimum, R groups to a row) split as above. */
struct gsec {
    uint32_t gb, gh, R;
    size_t n;
    bool delta; /* quants as differences from the previous slot's */
};

static void split_section(uint8_t *restrict dst, uint8_t *restrict q, const uint8_t *restrict src, const struct gsec *c)
{
    const uint32_t nq = c->gb - c->gh;
    for (size_t g = 0; g < c->n; g++) {
        const uint8_t *grp = src + g * c->gb;
        for (uint32_t b = 0; b < c->gh; b++) dst[(size_t)b * c->n + g] = grp[b];
        if (!c->delta || g < c->R) { /* the section's first slot: as it is */
            memcpy(q + g * nq, grp + c->gh, nq);
            continue;
        }
        const uint8_t *prev = grp - (size_t)c->R * c->gb + c->gh;
        for (uint32_t j = 0; j < nq; j++) q[g * nq + j] = (uint8_t)(grp[c->gh + j] - prev[j]);
    }
}

static void join_section(uint8_t *restrict dst, const uint8_t *restrict src, const uint8_t *restrict q,
                         const struct gsec *c)
{
    const uint32_t nq = c->gb - c->gh;
    for (size_t g = 0; g < c->n; g++) {
        uint8_t *grp = dst + g * c->gb;
        for (uint32_t b = 0; b < c->gh; b++) grp[b] = src[(size_t)b * c->n + g];
        if (!c->delta || g < c->R) {
            memcpy(grp + c->gh, q + g * nq, nq);
            continue;
        }
        const uint8_t *prev = grp - (size_t)c->R * c->gb + c->gh; /* already rebuilt */
        for (uint32_t j = 0; j < nq; j++) grp[c->gh + j] = (uint8_t)(q[g * nq + j] + prev[j]);
    }
}

/* Grouped types, section by section ([layer][K rows | V rows], each of its
 * own group size): split (join false) or join them. Every section's header
 * streams come first, then every section's quants, so that zstd sees the
 * scales of the whole block together. */
static void groups_each(uint8_t *restrict dst, const uint8_t *restrict src, const struct pstore_shape *s, bool join)
{
    const uint32_t R = s->kv_dim / PSTORE_QGROUP;
    const size_t n = (size_t)s->block_size * R;
    const size_t heads = (size_t)s->n_layer * n * ((s->k_gbytes == 34 ? 2 : 4) + (s->v_gbytes == 34 ? 2 : 4));
    size_t off = 0, hoff = 0, qoff = heads;
    for (uint32_t sec = 0; sec < 2 * s->n_layer; sec++) {
        const uint32_t gb = sec % 2 ? s->v_gbytes : s->k_gbytes;
        const struct gsec c = {gb, gb == 34 ? 2 : 4, R, n, sec % 2 == 0};
        if (join) join_section(dst + off, src + hoff, src + qoff, &c);
        else split_section(dst + hoff, dst + qoff, src + off, &c);
        off += n * gb;
        hoff += n * c.gh;
        qoff += n * (gb - c.gh);
    }
}

/* The lossless payload of either kind. */
static void pack_payload(uint8_t *dst, const uint8_t *src, const struct pstore_shape *s)
{
    if (s->k_gbytes) groups_each(dst, src, s, false);
    else shuffle(dst, src, (size_t)(s->raw_len / s->esize), s->esize);
}

static void unpack_payload(uint8_t *dst, const uint8_t *src, const struct pstore_shape *s)
{
    if (s->k_gbytes) groups_each(dst, src, s, true);
    else unshuffle(dst, src, (size_t)(s->raw_len / s->esize), s->esize);
}

/* ---- lossy8 ------------------------------------------------------------------ */

/* Fills payload with scales then int8 rows; false when some row has an
 * Inf/NaN or a scale beyond f16, which int8 rows cannot carry. Each row is
 * first widened into c->row so that the two passes over it are plain float
 * loops. */
static bool quantize(struct pstore_codec *c, const struct pstore_shape *s, const uint8_t *data, uint8_t *payload)
{
    uint8_t *scales = payload, *q = payload + 2 * s->n_rows;
    const uint32_t D = s->kv_dim;
    size_t row_bytes = (size_t)D * s->esize;
    float *x = c->row;
    for (uint64_t r = 0; r < s->n_rows; r++) {
        const uint8_t *row = data + r * row_bytes;
        if (s->dtype == PSTORE_DTYPE_F16) {
            for (uint32_t j = 0; j < D; j++) {
                uint16_t h;
                memcpy(&h, row + 2 * (size_t)j, 2);
                x[j] = pstore_h2f(h);
            }
        } else {
            memcpy(x, row, row_bytes);
        }
        float amax = 0.0f;
        int bad = 0;
        for (uint32_t j = 0; j < D; j++) {
            float a = fabsf(x[j]);
            bad |= !(a <= FLT_MAX); /* Inf, and NaN (every comparison false) */
            amax = a > amax ? a : amax;
        }
        if (bad) return false;
        uint16_t sh = kvb_f32_to_fp16(amax / 127.0f);
        float sc = kvb_fp16_to_f32(sh);
        if (!isfinite(sc)) return false;
        if (sc == 0.0f && amax > 0.0f) {
            /* amax/127 is below half the smallest f16 subnormal: use that
             * subnormal, which still keeps |q| <= 127. */
            sh = 1;
            sc = kvb_fp16_to_f32(sh);
        }
        put_u16(scales + 2 * r, sh);
        int8_t *qr = (int8_t *)(q + r * D);
        float inv = sc > 0.0f ? 1.0f / sc : 0.0f;
        for (uint32_t j = 0; j < D; j++) {
            /* Round to nearest even by adding 1.5 * 2^23 (|v| is at most a
             * hair over 127): branch-free, since signs are random and a
             * branch on them mispredicts half the time. */
            float t = x[j] * inv + 12582912.0f;
            int32_t qi;
            memcpy(&qi, &t, 4);
            qi = (qi & 0x7fffff) - 0x400000;
            qi = qi > 127 ? 127 : qi;
            qi = qi < -127 ? -127 : qi;
            qr[j] = (int8_t)qi;
        }
    }
    return true;
}

static bool dequantize(const struct pstore_shape *s, const uint8_t *payload, uint8_t *dst)
{
    const uint8_t *scales = payload;
    const int8_t *q = (const int8_t *)(payload + 2 * s->n_rows);
    size_t row_bytes = (size_t)s->kv_dim * s->esize;
    for (uint64_t r = 0; r < s->n_rows; r++) {
        float sc = kvb_fp16_to_f32(get_u16(scales + 2 * r));
        if (!isfinite(sc) || sc < 0.0f) return false;
        const int8_t *qr = q + r * s->kv_dim;
        uint8_t *out = dst + r * row_bytes;
        if (s->dtype == PSTORE_DTYPE_F16) {
            for (uint32_t j = 0; j < s->kv_dim; j++) {
                /* q * sc is exact in f32 (7 + 11 significant bits); one rounding to f16. */
                uint16_t h = pstore_f2h((float)qr[j] * sc);
                memcpy(out + 2 * (size_t)j, &h, 2);
            }
        } else {
            for (uint32_t j = 0; j < s->kv_dim; j++) {
                float f = (float)qr[j] * sc;
                memcpy(out + 4 * (size_t)j, &f, 4);
            }
        }
    }
    return true;
}

/* ---- encode ------------------------------------------------------------------ */

static bool grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (*cap >= need) return true;
    uint8_t *p = kvb_malloc(need);
    if (!p) return false;
    kvb_free(*buf);
    *buf = p;
    *cap = need;
    return true;
}

void pstore_codec_free(struct pstore_codec *c)
{
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    kvb_free(c->scratch);
    kvb_free(c->out);
    kvb_free(c->row);
    memset(c, 0, sizeof *c);
}

enum kvb_status pstore_codec_encode(struct pstore_codec *c, const struct pstore_shape *s, const int32_t *tokens,
                                    const void *data, const struct pstore_annex *annex, int zstd_level, bool lossy8,
                                    const uint8_t **val, size_t *val_len, struct kvb_err *err)
{
    const size_t an = annex && annex->len ? annex->len : 0;
    if (an > PSTORE_MAX_ANNEX) return kvb_errf(err, KVB_ERR_INVALID_ARG, "annex of %zu bytes is too long", an);
    const size_t tail = an ? 4 + an + 8 : 0;
    size_t lossy_len = (size_t)s->n_rows * (2u + s->kv_dim);
    size_t need = s->raw_len > lossy_len ? (size_t)s->raw_len : lossy_len;
    if (!grow(&c->scratch, &c->scratch_cap, need)) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    bool lossy = false;
    if (lossy8 && !s->k_gbytes) { /* quantized K/V is stored as it is */
        size_t need_row = (size_t)s->kv_dim * sizeof(float);
        if (c->row_cap < need_row) {
            float *p = kvb_malloc(need_row);
            if (!p) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
            kvb_free(c->row);
            c->row = p;
            c->row_cap = need_row;
        }
        lossy = quantize(c, s, data, c->scratch);
    }
    size_t payload_len = lossy ? lossy_len : (size_t)s->raw_len;
    if (!lossy) pack_payload(c->scratch, data, s);

    size_t hl = pstore_hdr_len(s->block_size);
    size_t bound = ZSTD_compressBound(payload_len);
    if (!grow(&c->out, &c->out_cap, hl + bound + tail)) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    if (!c->cctx && !(c->cctx = ZSTD_createCCtx())) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory (zstd)");
    size_t comp = ZSTD_compressCCtx(c->cctx, c->out + hl, bound, c->scratch, payload_len, default_level(zstd_level));
    if (ZSTD_isError(comp))
        return kvb_errf(err, KVB_ERR_INTERNAL, "zstd compression failed: %s", ZSTD_getErrorName(comp));

    uint8_t *h = c->out;
    memcpy(h, PSTORE_MAGIC, 4);
    put_u16(h + 4, PSTORE_FORMAT_VERSION);
    put_u16(h + 6, (uint16_t)((lossy ? PSTORE_FLAG_LOSSY8 : 0) | (an ? PSTORE_FLAG_ANNEX : 0)));
    memcpy(h + 8, s->identity, 16);
    put_u32(h + 24, (uint32_t)s->dtype);
    put_u32(h + 28, s->block_size);
    put_u32(h + 32, s->n_layer);
    put_u32(h + 36, s->kv_dim);
    put_u64(h + 40, s->raw_len);
    put_u64(h + 48, payload_len);
    put_u64(h + 56, comp);
    put_u64(h + 64, XXH3_64bits(c->scratch, payload_len));
    for (uint32_t j = 0; j < s->block_size; j++) put_u32(h + PSTORE_HDR_FIXED + 4 * (size_t)j, (uint32_t)tokens[j]);
    put_u64(h + hl - 8, XXH3_64bits(h, hl - 8));
    if (an) {
        uint8_t *t = c->out + hl + comp;
        put_u32(t, (uint32_t)an);
        memcpy(t + 4, annex->data, an);
        put_u64(t + 4 + an, XXH3_64bits(t + 4, an));
    }
    *val = c->out;
    *val_len = hl + comp + tail;
    return KVB_OK;
}

/* ---- decode ------------------------------------------------------------------ */

enum kvb_status pstore_hdr_parse(const uint8_t *val, size_t len, struct pstore_hdr *h, struct kvb_err *err)
{
    if (!val || len < PSTORE_HDR_FIXED + 8)
        return kvb_errf(err, KVB_ERR_FORMAT, "value of %zu bytes is shorter than a header", len);
    if (memcmp(val, PSTORE_MAGIC, 4) != 0)
        return kvb_errf(err, KVB_ERR_FORMAT, "bad magic (not a kvbatch cache value)");
    h->version = get_u16(val + 4);
    if (h->version != PSTORE_FORMAT_VERSION)
        return kvb_errf(err, KVB_ERR_FORMAT, "format version %u, this kvbatch reads version %u", h->version,
                        PSTORE_FORMAT_VERSION);
    h->flags = get_u16(val + 6);
    if (h->flags & ~PSTORE_FLAGS_KNOWN) return kvb_errf(err, KVB_ERR_FORMAT, "unknown flags 0x%04x", h->flags);
    h->block_size = get_u32(val + 28);
    if (h->block_size == 0 || h->block_size > PSTORE_MAX_BLOCK)
        return kvb_errf(err, KVB_ERR_FORMAT, "block size %u out of range", h->block_size);
    size_t hl = pstore_hdr_len(h->block_size);
    if (len < hl)
        return kvb_errf(err, KVB_ERR_FORMAT, "value of %zu bytes is shorter than its %zu-byte header", len, hl);
    if (get_u64(val + hl - 8) != XXH3_64bits(val, hl - 8))
        return kvb_errf(err, KVB_ERR_FORMAT, "header checksum mismatch");
    memcpy(h->identity, val + 8, 16);
    h->dtype = get_u32(val + 24);
    h->n_layer = get_u32(val + 32);
    h->kv_dim = get_u32(val + 36);
    h->raw_len = get_u64(val + 40);
    h->payload_len = get_u64(val + 48);
    h->comp_len = get_u64(val + 56);
    h->payload_sum = get_u64(val + 64);
    h->tokens = val + PSTORE_HDR_FIXED;
    h->frame = val + hl;
    h->annex = NULL;
    h->annex_len = h->annex_sum = 0;
    const size_t after = len - hl; /* the frame, and the annex when flagged */
    if (!(h->flags & PSTORE_FLAG_ANNEX)) {
        if (h->comp_len != after)
            return kvb_errf(err, KVB_ERR_FORMAT, "compressed length %llu, but %zu bytes follow the header",
                            (unsigned long long)h->comp_len, after);
        return KVB_OK;
    }
    if (h->comp_len > after || after - h->comp_len < 12)
        return kvb_errf(err, KVB_ERR_FORMAT, "compressed length %llu leaves no room for the annex in %zu bytes",
                        (unsigned long long)h->comp_len, after);
    const uint8_t *t = h->frame + h->comp_len;
    h->annex_len = get_u32(t);
    if (h->annex_len == 0 || h->annex_len > PSTORE_MAX_ANNEX || after - h->comp_len != 4 + h->annex_len + 8)
        return kvb_errf(err, KVB_ERR_FORMAT, "annex length %llu does not fit the value's %zu bytes",
                        (unsigned long long)h->annex_len, len);
    h->annex = t + 4;
    h->annex_sum = get_u64(t + 4 + h->annex_len);
    return KVB_OK;
}

int32_t pstore_hdr_token(const struct pstore_hdr *h, uint32_t j) { return (int32_t)get_u32(h->tokens + 4 * (size_t)j); }

enum kvb_status pstore_codec_decode(struct pstore_codec *c, const struct pstore_shape *s, const int32_t *tokens,
                                    bool allow_lossy, const uint8_t *val, size_t len, void *dst,
                                    const struct pstore_annex *annex, struct kvb_err *err)
{
    struct pstore_hdr h;
    KVB_FORWARD_IF_ERROR(pstore_hdr_parse(val, len, &h, err));
    if (memcmp(h.identity, s->identity, 16) != 0)
        return kvb_errf(err, KVB_ERR_FORMAT, "value of another model (identity differs)");
    if (h.dtype != (uint32_t)s->dtype || h.block_size != s->block_size || h.n_layer != s->n_layer ||
        h.kv_dim != s->kv_dim)
        return kvb_errf(err, KVB_ERR_FORMAT, "shape dtype %u block %u layers %u kv_dim %u, expected %u %u %u %u",
                        h.dtype, h.block_size, h.n_layer, h.kv_dim, (unsigned)s->dtype, s->block_size, s->n_layer,
                        s->kv_dim);
    if (h.raw_len != s->raw_len)
        return kvb_errf(err, KVB_ERR_FORMAT, "raw length %llu, expected %llu", (unsigned long long)h.raw_len,
                        (unsigned long long)s->raw_len);
    bool lossy = (h.flags & PSTORE_FLAG_LOSSY8) != 0;
    if (lossy && s->k_gbytes) return kvb_errf(err, KVB_ERR_FORMAT, "lossy8 flag on a quantized-KV value");
    uint64_t want = lossy ? s->n_rows * (2u + (uint64_t)s->kv_dim) : s->raw_len;
    if (h.payload_len != want)
        return kvb_errf(err, KVB_ERR_FORMAT, "payload length %llu, expected %llu", (unsigned long long)h.payload_len,
                        (unsigned long long)want);
    if (tokens)
        for (uint32_t j = 0; j < s->block_size; j++)
            if (pstore_hdr_token(&h, j) != tokens[j])
                return kvb_errf(err, KVB_ERR_NOT_FOUND, "value stands for other tokens (token %u differs)", j);
    if (lossy && !allow_lossy) return kvb_errf(err, KVB_ERR_NOT_FOUND, "lossy value, and lossless was asked for");
    if (h.annex && XXH3_64bits(h.annex, (size_t)h.annex_len) != h.annex_sum)
        return kvb_errf(err, KVB_ERR_FORMAT, "annex checksum mismatch");
    if (annex && !pstore_hdr_has_annex(&h, annex->len))
        return kvb_errf(err, KVB_ERR_NOT_FOUND, "value without the %zu-byte annex asked for", annex->len);

    unsigned long long fcs = ZSTD_getFrameContentSize(h.frame, (size_t)h.comp_len);
    if (fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs != want)
        return kvb_errf(err, KVB_ERR_FORMAT, "zstd frame header does not announce %llu bytes",
                        (unsigned long long)want);
    size_t fsz = ZSTD_findFrameCompressedSize(h.frame, (size_t)h.comp_len);
    if (ZSTD_isError(fsz) || fsz != h.comp_len)
        return kvb_errf(err, KVB_ERR_FORMAT, "zstd frame does not end where the value does");
    if (!grow(&c->scratch, &c->scratch_cap, (size_t)want)) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    if (!c->dctx && !(c->dctx = ZSTD_createDCtx())) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory (zstd)");
    size_t got = ZSTD_decompressDCtx(c->dctx, c->scratch, (size_t)want, h.frame, (size_t)h.comp_len);
    if (ZSTD_isError(got)) return kvb_errf(err, KVB_ERR_FORMAT, "zstd: %s", ZSTD_getErrorName(got));
    if (got != want)
        return kvb_errf(err, KVB_ERR_FORMAT, "decompressed %zu bytes, expected %llu", got, (unsigned long long)want);
    if (XXH3_64bits(c->scratch, (size_t)want) != h.payload_sum)
        return kvb_errf(err, KVB_ERR_FORMAT, "payload checksum mismatch");
    if (lossy) {
        if (!dequantize(s, c->scratch, dst)) return kvb_errf(err, KVB_ERR_FORMAT, "lossy8 row scale is not finite");
    } else {
        unpack_payload(dst, c->scratch, s);
    }
    if (annex && annex->len) memcpy(annex->data, h.annex, annex->len);
    return KVB_OK;
}

/* ---- the public, context-free forms -------------------------------------------- */

enum kvb_status pstore_value_encode(const struct pstore_model *m, const int32_t *tokens, const void *data,
                                    int zstd_level, bool lossy8, uint8_t **out, size_t *out_len, struct kvb_err *err)
{
    struct pstore_shape s;
    KVB_FORWARD_IF_ERROR(pstore_shape_init(m, &s, err));
    if (!tokens || !data || !out || !out_len) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL argument");
    struct pstore_codec c = {0};
    const uint8_t *v;
    size_t n;
    enum kvb_status st = pstore_codec_encode(&c, &s, tokens, data, NULL, zstd_level, lossy8, &v, &n, err);
    if (st == KVB_OK) {
        /* Hand over the codec's output buffer instead of copying it. */
        (void)v;
        *out = c.out;
        *out_len = n;
        c.out = NULL;
    }
    pstore_codec_free(&c);
    return st;
}

enum kvb_status pstore_value_decode(const struct pstore_model *m, const int32_t *tokens, const uint8_t *val, size_t len,
                                    void *dst, struct kvb_err *err)
{
    struct pstore_shape s;
    KVB_FORWARD_IF_ERROR(pstore_shape_init(m, &s, err));
    if (!dst) return kvb_errf(err, KVB_ERR_INVALID_ARG, "NULL destination");
    struct pstore_codec c = {0};
    enum kvb_status st = pstore_codec_decode(&c, &s, tokens, true, val, len, dst, NULL, err);
    pstore_codec_free(&c);
    return st;
}
