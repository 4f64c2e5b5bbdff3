/* gguf.c — the GGUF reader: parses and validates a whole GGUF (v2/v3) file in
 * one pass and exposes its metadata and tensor table as pointers into the
 * mapping.
 *
 * Everything that can be wrong with the bytes is checked here, once, so that
 * the model loader and the tokenizer can trust what they get: every read is
 * bounds-checked, counts are compared with the bytes left before anything is
 * allocated, and tensor extents are checked for overflow and against the end
 * of the file. This file does not interpret the metadata (architecture,
 * hyper-parameters, vocabulary): that is model.c's and tok.c's job. */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH 8     /* array nesting levels; real files use 1 */
#define GGUF_MAX_NAME 65536u /* key and tensor-name length limit */
#define GGUF_MAX_DIMS 4u
#define GGUF_HEADER_BYTES 24u /* magic, version, tensor_count, kv_count */
/* Smallest possible encodings, used to refuse absurd counts before
 * allocating: a kv is key length (8) + 1 key byte + value type (4) + a 1-byte
 * value; a tensor info is name length (8) + 1 name byte + n_dims (4) + one
 * ne (8) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES 14u
#define GGUF_MIN_TENSOR_BYTES 33u

/* Open-addressing hash index from a name to its position in an array; slots
 * hold index + 1 so that 0 means empty. */
struct name_index {
    uint64_t *slots;
    uint64_t mask;
};

struct gguf_file {
    const uint8_t *base; /* the whole file */
    uint64_t size;
    void *map; /* non-NULL when we mmapped base ourselves */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start; /* file offset of the data section */
    struct gguf_kv *kvs; /* (n_kv) */
    uint64_t n_kv;
    struct gguf_tensor *tensors; /* (n_tensors) */
    uint64_t n_tensors;
    struct name_index kv_index, tensor_index;
    void **blocks; /* item arrays of STRING/ARRAY values, freed at close */
    size_t n_blocks, cap_blocks;
};

/* ---- small helpers ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static enum kvb_status index_init(struct name_index *ix, uint64_t n)
{
    uint64_t cap = 8;
    while (cap < 2 * n) cap *= 2; /* n is bounded by the file size, so this ends */
    ix->slots = kvb_calloc((size_t)cap, sizeof *ix->slots);
    if (!ix->slots) return KVB_ERR_NOMEM;
    ix->mask = cap - 1;
    return KVB_OK;
}

/* Index of the entry named (p, n), or UINT64_MAX. names(i) is read through
 * the stride so the same code serves kvs and tensors. */
static uint64_t index_find(const struct name_index *ix, const void *entries, size_t stride, size_t name_off,
                           const char *p, uint64_t n)
{
    if (!ix->slots) return UINT64_MAX;
    for (uint64_t h = hash_bytes(p, n) & ix->mask;; h = (h + 1) & ix->mask) {
        uint64_t s = ix->slots[h];
        if (s == 0) return UINT64_MAX;
        const struct gguf_str *name = (const struct gguf_str *)((const char *)entries + (s - 1) * stride + name_off);
        if (name->len == n && memcmp(name->ptr, p, n) == 0) return s - 1;
    }
}

static void index_insert(struct name_index *ix, const char *p, uint64_t n, uint64_t i)
{
    uint64_t h = hash_bytes(p, n) & ix->mask;
    while (ix->slots[h] != 0) h = (h + 1) & ix->mask;
    ix->slots[h] = i + 1;
}

static uint64_t le_bytes(const uint8_t *b, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;) v = (v << 8) | b[i];
    return v;
}

/* Sign-extends the low `bytes` bytes of u without implementation-defined casts. */
static int64_t sext(uint64_t u, unsigned bytes)
{
    if (bytes == 8) {
        int64_t v;
        memcpy(&v, &u, 8);
        return v;
    }
    uint64_t m = 1ull << (bytes * 8 - 1);
    return (int64_t)(u ^ m) - (int64_t)m;
}

static bool vtype_is_unsigned(enum gguf_vtype t)
{
    return t == GGUF_VTYPE_UINT8 || t == GGUF_VTYPE_UINT16 || t == GGUF_VTYPE_UINT32 || t == GGUF_VTYPE_UINT64;
}

static bool vtype_is_signed(enum gguf_vtype t)
{
    return t == GGUF_VTYPE_INT8 || t == GGUF_VTYPE_INT16 || t == GGUF_VTYPE_INT32 || t == GGUF_VTYPE_INT64;
}

/* Copies a name into dst for a message: quoted, non-printable bytes as '?',
 * long names cut with "...". */
static void describe_name(char *dst, size_t cap, struct gguf_str s)
{
    size_t j = 0;
    uint64_t shown = s.len > 80 ? 80 : s.len;
    if (cap < 8) {
        if (cap) dst[0] = '\0';
        return;
    }
    dst[j++] = '\'';
    for (uint64_t i = 0; i < shown && j + 5 < cap; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        dst[j++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (shown < s.len && j + 5 < cap) {
        memcpy(dst + j, "...", 3);
        j += 3;
    }
    dst[j++] = '\'';
    dst[j] = '\0';
}

/* ---- the byte reader ------------------------------------------------------------ */

struct rd {
    const uint8_t *p;
    uint64_t size, pos;
    struct gguf_file *f;
    struct kvb_err *err;
    char where[160]; /* what is being parsed, e.g. "kv 3 'general.name'" */
};

/* Outputs are set even on failure so that no caller reads an uninitialised
 * value whatever the status says. */
static enum kvb_status rd_bytes(struct rd *r, uint64_t n, const char *what, const uint8_t **out)
{
    *out = r->p + r->pos;
    if (n > r->size - r->pos)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: %s (%" PRIu64 " bytes at offset %" PRIu64 ") runs past end of file (size %" PRIu64
                        ")",
                        r->where, what, n, r->pos, r->size);
    *out = r->p + r->pos;
    r->pos += n;
    return KVB_OK;
}

static enum kvb_status rd_uint(struct rd *r, unsigned n, const char *what, uint64_t *out)
{
    const uint8_t *b;
    *out = 0;
    KVB_FORWARD_IF_ERROR(rd_bytes(r, n, what, &b));
    *out = le_bytes(b, n);
    return KVB_OK;
}

static enum kvb_status rd_u32(struct rd *r, const char *what, uint32_t *out)
{
    uint64_t v = 0;
    *out = 0;
    KVB_FORWARD_IF_ERROR(rd_uint(r, 4, what, &v));
    *out = (uint32_t)v;
    return KVB_OK;
}

/* A gguf string: u64 length + bytes. Names (keys, tensor names) must be
 * non-empty, at most GGUF_MAX_NAME bytes and free of NUL bytes, since callers
 * look them up by C string. */
static enum kvb_status rd_str(struct rd *r, const char *what, bool is_name, struct gguf_str *out)
{
    uint64_t at = r->pos, len;
    const uint8_t *b;
    KVB_FORWARD_IF_ERROR(rd_uint(r, 8, what, &len));
    if (len > r->size - r->pos)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: %s length %" PRIu64 " at offset %" PRIu64 " runs past end of file (size %" PRIu64
                        ")",
                        r->where, what, len, at, r->size);
    if (is_name && (len == 0 || len > GGUF_MAX_NAME))
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: %s length %" PRIu64 " at offset %" PRIu64 " is invalid (must be 1..%u)", r->where,
                        what, len, at, GGUF_MAX_NAME);
    KVB_FORWARD_IF_ERROR(rd_bytes(r, len, what, &b));
    if (is_name && memchr(b, 0, (size_t)len))
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: %s: %s at offset %" PRIu64 " contains a NUL byte", r->where,
                        what, at);
    out->len = len;
    out->ptr = (const char *)b;
    return KVB_OK;
}

/* ---- values -------------------------------------------------------------------- */

static enum kvb_status keep_block(struct gguf_file *f, void *p)
{
    if (f->n_blocks == f->cap_blocks) {
        size_t cap = f->cap_blocks ? 2 * f->cap_blocks : 16;
        void **nb = kvb_realloc(f->blocks, cap * sizeof *nb);
        if (!nb) return KVB_ERR_NOMEM;
        f->blocks = nb;
        f->cap_blocks = cap;
    }
    f->blocks[f->n_blocks++] = p;
    return KVB_OK;
}

static enum kvb_status parse_value(struct rd *r, enum gguf_vtype type, unsigned depth, struct gguf_value *out);

/* An array body: u32 element type, u64 count, elements. `depth` counts the
 * array levels including this one. */
static enum kvb_status parse_array(struct rd *r, unsigned depth, struct gguf_value *out)
{
    uint64_t at = r->pos, n;
    uint32_t et;
    if (depth > GGUF_MAX_DEPTH)
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: %s: arrays nested deeper than %d levels at offset %" PRIu64,
                        r->where, GGUF_MAX_DEPTH, at);
    KVB_FORWARD_IF_ERROR(rd_u32(r, "array element type", &et));
    if (et >= GGUF_VTYPE_COUNT_)
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: %s: bad array element type %" PRIu32 " at offset %" PRIu64,
                        r->where, et, at);
    uint64_t count_at = r->pos;
    KVB_FORWARD_IF_ERROR(rd_uint(r, 8, "array count", &n));
    uint64_t remaining = r->size - r->pos;
    uint32_t esize = gguf_vtype_size((enum gguf_vtype)et);
    /* The smallest element: a scalar's size, an empty string (8), an empty
     * array (12). */
    uint64_t min_elem = esize ? esize : (et == GGUF_VTYPE_STRING ? 8 : 12);
    if (n > remaining / min_elem)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: array count %" PRIu64 " of %s at offset %" PRIu64 " runs past end of file (%" PRIu64
                        " bytes remain)",
                        r->where, n, gguf_vtype_name((enum gguf_vtype)et), count_at, remaining);
    out->type = GGUF_VTYPE_ARRAY;
    out->v.arr.elem_type = (enum gguf_vtype)et;
    out->v.arr.n = n;
    out->v.arr.raw = NULL;
    out->v.arr.items = NULL;
    if (esize) {
        const uint8_t *b;
        KVB_FORWARD_IF_ERROR(rd_bytes(r, n * esize, "array elements", &b));
        if (et == GGUF_VTYPE_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (b[i] > 1)
                    return kvb_errf(r->err, KVB_ERR_FORMAT,
                                    "gguf: %s: bool array element %" PRIu64 " at offset %" PRIu64 " is %u, not 0 or 1",
                                    r->where, i, (uint64_t)(b - r->p) + i, (unsigned)b[i]);
        out->v.arr.raw = b;
        return KVB_OK;
    }
    if (n == 0) return KVB_OK;
    struct gguf_value *items = kvb_calloc((size_t)n, sizeof *items);
    if (!items) return kvb_errf(r->err, KVB_ERR_NOMEM, "gguf: %s: no memory for %" PRIu64 " array items", r->where, n);
    if (keep_block(r->f, items) != KVB_OK) {
        kvb_free(items);
        return kvb_errf(r->err, KVB_ERR_NOMEM, "gguf: out of memory");
    }
    out->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) KVB_FORWARD_IF_ERROR(parse_value(r, (enum gguf_vtype)et, depth, &items[i]));
    return KVB_OK;
}

/* One value of a known type; `depth` is the array level the value sits in
 * (0 for a kv's own value). */
static enum kvb_status parse_value(struct rd *r, enum gguf_vtype type, unsigned depth, struct gguf_value *out)
{
    uint64_t at = r->pos, u;
    out->type = type;
    switch (type) {
    case GGUF_VTYPE_UINT8:
    case GGUF_VTYPE_UINT16:
    case GGUF_VTYPE_UINT32:
    case GGUF_VTYPE_UINT64: return rd_uint(r, gguf_vtype_size(type), "value", &out->v.u64);
    case GGUF_VTYPE_INT8:
    case GGUF_VTYPE_INT16:
    case GGUF_VTYPE_INT32:
    case GGUF_VTYPE_INT64:
        KVB_FORWARD_IF_ERROR(rd_uint(r, gguf_vtype_size(type), "value", &u));
        out->v.i64 = sext(u, gguf_vtype_size(type));
        return KVB_OK;
    case GGUF_VTYPE_FLOAT32: {
        float x;
        uint32_t bits;
        KVB_FORWARD_IF_ERROR(rd_uint(r, 4, "value", &u));
        bits = (uint32_t)u;
        memcpy(&x, &bits, 4);
        out->v.f64 = x;
        return KVB_OK;
    }
    case GGUF_VTYPE_FLOAT64:
        KVB_FORWARD_IF_ERROR(rd_uint(r, 8, "value", &u));
        memcpy(&out->v.f64, &u, 8);
        return KVB_OK;
    case GGUF_VTYPE_BOOL:
        KVB_FORWARD_IF_ERROR(rd_uint(r, 1, "value", &u));
        if (u > 1)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: %s: bool value %" PRIu64 " at offset %" PRIu64 " is not 0 or 1", r->where, u, at);
        out->v.b = u != 0;
        return KVB_OK;
    case GGUF_VTYPE_STRING: return rd_str(r, "string", false, &out->v.str);
    case GGUF_VTYPE_ARRAY: return parse_array(r, depth + 1, out);
    case GGUF_VTYPE_COUNT_: break;
    }
    return kvb_errf(r->err, KVB_ERR_INTERNAL, "gguf: %s: value type %d", r->where, (int)type);
}

/* ---- sections ------------------------------------------------------------------ */

static enum kvb_status parse_header(struct rd *r, uint64_t *n_tensors, uint64_t *n_kv)
{
    struct gguf_file *f = r->f;
    if (r->size < 4)
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: file is %" PRIu64 " bytes, too small to be a GGUF file",
                        r->size);
    if (memcmp(r->p, "GGUF", 4) != 0) {
        char shown[20];
        snprintf(shown, sizeof shown, "%02x %02x %02x %02x", r->p[0], r->p[1], r->p[2], r->p[3]);
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: bad magic [%s] at offset 0 (expected 'GGUF'): not a GGUF file",
                        shown);
    }
    r->pos = 4;
    KVB_FORWARD_IF_ERROR(rd_u32(r, "version", &f->version));
    uint32_t v = f->version;
    uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
    if (v != 2 && v != 3) {
        if (swapped >= 1 && swapped <= 3)
            return kvb_errf(r->err, KVB_ERR_UNSUPPORTED,
                            "gguf: big-endian GGUF file (version field at offset 4 reads 0x%08" PRIx32
                            ", version %" PRIu32 " byte-swapped) is not supported; use a little-endian file",
                            v, swapped);
        if (v == 1)
            return kvb_errf(r->err, KVB_ERR_UNSUPPORTED,
                            "gguf: version 1 at offset 4 is not supported (only versions 2 and 3); "
                            "re-convert the model with a current llama.cpp");
        return kvb_errf(r->err, KVB_ERR_UNSUPPORTED,
                        "gguf: unsupported version %" PRIu32 " at offset 4 (only versions 2 and 3)", v);
    }
    KVB_FORWARD_IF_ERROR(rd_uint(r, 8, "tensor_count", n_tensors));
    KVB_FORWARD_IF_ERROR(rd_uint(r, 8, "kv_count", n_kv));
    uint64_t rem = r->size - r->pos;
    if (*n_kv > rem / GGUF_MIN_KV_BYTES)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: header: absurd kv_count %" PRIu64 " at offset 16: the %" PRIu64
                        " remaining bytes hold at most %" PRIu64 " key-value pairs",
                        *n_kv, rem, rem / GGUF_MIN_KV_BYTES);
    if (*n_tensors > rem / GGUF_MIN_TENSOR_BYTES ||
        *n_tensors * GGUF_MIN_TENSOR_BYTES > rem - *n_kv * GGUF_MIN_KV_BYTES)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: header: absurd tensor_count %" PRIu64 " at offset 8: the %" PRIu64
                        " remaining bytes cannot hold it besides %" PRIu64 " key-value pairs",
                        *n_tensors, rem, *n_kv);
    return KVB_OK;
}

static enum kvb_status parse_kvs(struct rd *r, uint64_t n)
{
    struct gguf_file *f = r->f;
    f->kvs = kvb_calloc((size_t)n, sizeof *f->kvs);
    if (!f->kvs || index_init(&f->kv_index, n) != KVB_OK)
        return kvb_errf(r->err, KVB_ERR_NOMEM, "gguf: no memory for %" PRIu64 " key-value pairs", n);
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_kv *kv = &f->kvs[i];
        char name[100];
        snprintf(r->where, sizeof r->where, "kv %" PRIu64, i);
        uint64_t key_at = r->pos;
        KVB_FORWARD_IF_ERROR(rd_str(r, "key", true, &kv->key));
        describe_name(name, sizeof name, kv->key);
        snprintf(r->where, sizeof r->where, "kv %" PRIu64 " %s", i, name);
        uint64_t dup =
            index_find(&f->kv_index, f->kvs, sizeof *f->kvs, offsetof(struct gguf_kv, key), kv->key.ptr, kv->key.len);
        if (dup != UINT64_MAX)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: %s: duplicate key at offset %" PRIu64 " (first defined by kv %" PRIu64 ")", r->where,
                            key_at, dup);
        uint64_t type_at = r->pos;
        uint32_t type;
        KVB_FORWARD_IF_ERROR(rd_u32(r, "value type", &type));
        if (type >= GGUF_VTYPE_COUNT_)
            return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: %s: bad value type %" PRIu32 " at offset %" PRIu64, r->where,
                            type, type_at);
        KVB_FORWARD_IF_ERROR(parse_value(r, (enum gguf_vtype)type, 0, &kv->val));
        /* Counted only once complete so gguf_close never sees half a kv. */
        index_insert(&f->kv_index, kv->key.ptr, kv->key.len, i);
        f->n_kv = i + 1;
    }
    return KVB_OK;
}

static enum kvb_status read_alignment(struct rd *r)
{
    struct gguf_file *f = r->f;
    const struct gguf_value *v = gguf_find(f, "general.alignment");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!v) return KVB_OK;
    uint64_t a;
    if (vtype_is_unsigned(v->type)) {
        a = v->v.u64;
    } else if (vtype_is_signed(v->type) && v->v.i64 > 0) {
        a = (uint64_t)v->v.i64;
    } else if (vtype_is_signed(v->type)) {
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: general.alignment = %" PRId64 " is not a power of two",
                        v->v.i64);
    } else {
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: general.alignment has type %s, expected an integer",
                        gguf_vtype_name(v->type));
    }
    if (a == 0 || (a & (a - 1)) != 0)
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: general.alignment = %" PRIu64 " is not a power of two", a);
    if (a > UINT32_MAX)
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: general.alignment = %" PRIu64 " is too large (max 2^31)", a);
    f->alignment = (uint32_t)a;
    return KVB_OK;
}

static enum kvb_status parse_tensor_info(struct rd *r, uint64_t i, struct gguf_tensor *t)
{
    struct gguf_file *f = r->f;
    char name[100];
    snprintf(r->where, sizeof r->where, "tensor %" PRIu64, i);
    uint64_t name_at = r->pos;
    KVB_FORWARD_IF_ERROR(rd_str(r, "name", true, &t->name));
    describe_name(name, sizeof name, t->name);
    snprintf(r->where, sizeof r->where, "tensor %" PRIu64 " %s", i, name);
    uint64_t dup = index_find(&f->tensor_index, f->tensors, sizeof *f->tensors, offsetof(struct gguf_tensor, name),
                              t->name.ptr, t->name.len);
    if (dup != UINT64_MAX)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: duplicate tensor name at offset %" PRIu64 " (first defined by tensor %" PRIu64 ")",
                        r->where, name_at, dup);

    uint64_t dims_at = r->pos;
    KVB_FORWARD_IF_ERROR(rd_u32(r, "n_dims", &t->n_dims));
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: n_dims %" PRIu32 " at offset %" PRIu64 " is out of range 1..%u", r->where, t->n_dims,
                        dims_at, GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        uint64_t ne_at = r->pos;
        KVB_FORWARD_IF_ERROR(rd_uint(r, 8, "ne", &t->ne[d]));
        /* ggml keeps shapes in int64_t. */
        if (t->ne[d] > (uint64_t)INT64_MAX)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: %s: ne[%" PRIu32 "] = %" PRIu64 " at offset %" PRIu64 " is negative as int64",
                            r->where, d, t->ne[d], ne_at);
        if (t->ne[d] != 0 && n_elems > (uint64_t)INT64_MAX / t->ne[d]) overflow = true;
        else n_elems *= t->ne[d];
    }
    uint64_t type_at = r->pos;
    uint32_t type;
    KVB_FORWARD_IF_ERROR(rd_u32(r, "type", &type));
    const struct ggml_type_traits *tr = ggml_type_get_traits(type);
    if (!tr)
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: %s: unknown ggml type code %" PRIu32 " at offset %" PRIu64,
                        r->where, type, type_at);
    t->type = (enum ggml_type)type;
    KVB_FORWARD_IF_ERROR(rd_uint(r, 8, "offset", &t->offset));
    if (overflow && n_elems != 0) /* a zero dimension makes the product 0 whatever the rest */
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: element count of ne {%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                        "} at offset %" PRIu64 " overflows int64",
                        r->where, t->ne[0], t->ne[1], t->ne[2], t->ne[3], dims_at + 4);
    if (t->ne[0] % tr->block_elems != 0)
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: %s: ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32, r->where,
                        t->ne[0], tr->name, tr->block_elems);
    if (!ggml_type_row_bytes(type, n_elems, &t->n_bytes))
        return kvb_errf(r->err, KVB_ERR_FORMAT, "gguf: %s: data size of %" PRIu64 " %s elements overflows", r->where,
                        n_elems, tr->name);
    return KVB_OK;
}

static enum kvb_status parse_tensors(struct rd *r, uint64_t n)
{
    struct gguf_file *f = r->f;
    uint64_t rem = r->size - r->pos;
    if (n > rem / GGUF_MIN_TENSOR_BYTES) /* the header check assumed minimal kvs */
        return kvb_errf(r->err, KVB_ERR_FORMAT,
                        "gguf: absurd tensor_count %" PRIu64 " at offset 8: the %" PRIu64
                        " bytes after the metadata hold at most %" PRIu64 " tensor infos",
                        n, rem, rem / GGUF_MIN_TENSOR_BYTES);
    f->tensors = kvb_calloc((size_t)n, sizeof *f->tensors);
    if (!f->tensors || index_init(&f->tensor_index, n) != KVB_OK)
        return kvb_errf(r->err, KVB_ERR_NOMEM, "gguf: no memory for %" PRIu64 " tensor infos", n);
    for (uint64_t i = 0; i < n; i++) {
        KVB_FORWARD_IF_ERROR(parse_tensor_info(r, i, &f->tensors[i]));
        index_insert(&f->tensor_index, f->tensors[i].name.ptr, f->tensors[i].name.len, i);
        f->n_tensors = i + 1;
    }

    /* The data section starts at the next multiple of the alignment. A file
     * without tensors may end before that padding (llama.cpp seeks past it). */
    uint64_t a = f->alignment, pad = (a - r->pos % a) % a;
    if (pad > r->size - r->pos) {
        if (n > 0)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: data section would start at offset %" PRIu64 " (after padding to %" PRIu64
                            ") past end of file (size %" PRIu64 ")",
                            r->pos + pad, a, r->size);
        pad = r->size - r->pos;
    }
    f->data_start = r->pos + pad;

    for (uint64_t i = 0; i < n; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        char name[100];
        describe_name(name, sizeof name, t->name);
        if (t->offset % a != 0)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: tensor %s: data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                            name, t->offset, a);
        uint64_t room = r->size - f->data_start;
        if (t->offset > room)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: tensor %s data [offset %" PRIu64 " in the data section at %" PRIu64
                            "] lies past end of file (size %" PRIu64 ")",
                            name, t->offset, f->data_start, r->size);
        if (t->n_bytes > room - t->offset)
            return kvb_errf(r->err, KVB_ERR_FORMAT,
                            "gguf: tensor %s data [offset %" PRIu64 ", %" PRIu64
                            " bytes] runs past end of file (size %" PRIu64 ")",
                            name, f->data_start + t->offset, t->n_bytes, r->size);
        t->data = r->p + f->data_start + t->offset;
    }
    return KVB_OK;
}

static enum kvb_status parse(struct gguf_file *f, struct kvb_err *err)
{
    struct rd r = {.p = f->base, .size = f->size, .pos = 0, .f = f, .err = err};
    uint64_t n_tensors = 0, n_kv = 0;
    snprintf(r.where, sizeof r.where, "header");
    KVB_FORWARD_IF_ERROR(parse_header(&r, &n_tensors, &n_kv));
    KVB_FORWARD_IF_ERROR(parse_kvs(&r, n_kv));
    KVB_FORWARD_IF_ERROR(read_alignment(&r));
    return parse_tensors(&r, n_tensors);
}

/* ---- open / close -------------------------------------------------------------- */

enum kvb_status gguf_open_memory(const void *data, uint64_t size, struct gguf_file **out, struct kvb_err *err)
{
    if (!out || (!data && size > 0))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "gguf_open_memory: NULL %s", out ? "data" : "out");
    *out = NULL;
    struct gguf_file *f = kvb_calloc(1, sizeof *f);
    if (!f) return kvb_errf(err, KVB_ERR_NOMEM, "gguf: out of memory");
    static const uint8_t empty[1];
    f->base = data ? data : empty;
    f->size = size;
    enum kvb_status st = parse(f, err);
    if (st != KVB_OK) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return KVB_OK;
}

enum kvb_status gguf_open(const char *path, struct gguf_file **out, struct kvb_err *err)
{
    if (!out || !path) return kvb_errf(err, KVB_ERR_INVALID_ARG, "gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvb_errf(err, KVB_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kvb_errf(err, KVB_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return kvb_errf(err, KVB_ERR_IO, "cannot open '%s': %s", path, strerror(EISDIR));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kvb_errf(err, KVB_ERR_IO, "cannot open '%s': not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return kvb_errf(err, KVB_ERR_FORMAT, "'%s' is empty (0 bytes), not a GGUF file", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file open */
    if (map == MAP_FAILED) return kvb_errf(err, KVB_ERR_IO, "cannot map '%s': %s", path, strerror(map_errno));

    struct gguf_file *f = kvb_calloc(1, sizeof *f);
    if (!f) {
        munmap(map, (size_t)sb.st_size);
        return kvb_errf(err, KVB_ERR_NOMEM, "gguf: out of memory");
    }
    f->map = map;
    f->base = map;
    f->size = (uint64_t)sb.st_size;
    enum kvb_status st = parse(f, err);
    if (st != KVB_OK) {
        gguf_close(f);
        return kvb_err_wrap(err, st, "%s", path);
    }
    *out = f;
    return KVB_OK;
}

void gguf_close(struct gguf_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n_blocks; i++) kvb_free(f->blocks[i]);
    kvb_free(f->blocks);
    kvb_free(f->kvs);
    kvb_free(f->tensors);
    kvb_free(f->kv_index.slots);
    kvb_free(f->tensor_index.slots);
    if (f->map) munmap(f->map, (size_t)f->size);
    kvb_free(f);
}

void gguf_release_pages(const struct gguf_file *f, const void *p, size_t n)
{
    if (!f || !f->map || !p) return;
    const uintptr_t lo = (uintptr_t)f->map, hi = lo + (uintptr_t)f->size;
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (a < lo || b > hi || b < a) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) / page * page; /* whole pages only: neighbours may still be in use */
    b = b / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* ---- queries ------------------------------------------------------------------- */

uint32_t gguf_version(const struct gguf_file *f) { return f->version; }
uint64_t gguf_n_kv(const struct gguf_file *f) { return f->n_kv; }
uint64_t gguf_n_tensors(const struct gguf_file *f) { return f->n_tensors; }

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i) { return i < f->n_kv ? &f->kvs[i] : NULL; }

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct gguf_value *gguf_find(const struct gguf_file *f, const char *key)
{
    if (!key) return NULL;
    uint64_t i = index_find(&f->kv_index, f->kvs, sizeof *f->kvs, offsetof(struct gguf_kv, key), key, strlen(key));
    return i < f->n_kv ? &f->kvs[i].val : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    if (!name) return NULL;
    uint64_t i = index_find(&f->tensor_index, f->tensors, sizeof *f->tensors, offsetof(struct gguf_tensor, name), name,
                            strlen(name));
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

bool gguf_str_eq(struct gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && (n == 0 || memcmp(s.ptr, z, n) == 0);
}

/* ---- typed getters ------------------------------------------------------------- */

static enum kvb_status get_checked(const struct gguf_file *f, const char *key, const struct gguf_value **out,
                                   struct kvb_err *err)
{
    *out = gguf_find(f, key);
    if (!*out) return kvb_errf(err, KVB_ERR_NOT_FOUND, "gguf: key '%s' not found", key ? key : "(null)");
    return KVB_OK;
}

static enum kvb_status type_mismatch(const char *key, const struct gguf_value *v, const char *want, struct kvb_err *err)
{
    return kvb_errf(err, KVB_ERR_FORMAT, "gguf: key '%s' has type %s, expected %s", key, gguf_vtype_name(v->type),
                    want);
}

/* Any integer value as a (sign, magnitude-ish) pair: returns false for
 * non-integers. */
static bool int_value(const struct gguf_value *v, bool *negative, uint64_t *u, int64_t *s)
{
    if (vtype_is_unsigned(v->type)) {
        *negative = false;
        *u = v->v.u64;
        *s = v->v.u64 > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v->v.u64;
        return true;
    }
    if (vtype_is_signed(v->type)) {
        *negative = v->v.i64 < 0;
        *u = *negative ? 0 : (uint64_t)v->v.i64;
        *s = v->v.i64;
        return true;
    }
    return false;
}

enum kvb_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out, struct kvb_err *err)
{
    const struct gguf_value *v = NULL;
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    KVB_FORWARD_IF_ERROR(get_checked(f, key, &v, err));
    if (!int_value(v, &neg, &u, &s)) return type_mismatch(key, v, "an unsigned integer", err);
    if (neg)
        return kvb_errf(err, KVB_ERR_FORMAT, "gguf: key '%s' = %" PRId64 " is negative, expected an unsigned integer",
                        key, s);
    *out = u;
    return KVB_OK;
}

enum kvb_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct kvb_err *err)
{
    uint64_t u = 0;
    KVB_FORWARD_IF_ERROR(gguf_get_u64(f, key, &u, err));
    if (u > UINT32_MAX)
        return kvb_errf(err, KVB_ERR_FORMAT, "gguf: key '%s' = %" PRIu64 " does not fit a uint32", key, u);
    *out = (uint32_t)u;
    return KVB_OK;
}

enum kvb_status gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out, struct kvb_err *err)
{
    const struct gguf_value *v = NULL;
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    KVB_FORWARD_IF_ERROR(get_checked(f, key, &v, err));
    if (!int_value(v, &neg, &u, &s)) return type_mismatch(key, v, "an integer", err);
    if (!neg && u > (uint64_t)INT64_MAX)
        return kvb_errf(err, KVB_ERR_FORMAT, "gguf: key '%s' = %" PRIu64 " does not fit an int64", key, u);
    *out = s;
    return KVB_OK;
}

/* Floats accept FLOAT32/FLOAT64 and also integers (a converter that wrote
 * `rope.freq_base = 10000` as an integer meant the obvious number). */
enum kvb_status gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct kvb_err *err)
{
    const struct gguf_value *v = NULL;
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    KVB_FORWARD_IF_ERROR(get_checked(f, key, &v, err));
    if (v->type == GGUF_VTYPE_FLOAT32 || v->type == GGUF_VTYPE_FLOAT64) *out = (float)v->v.f64;
    else if (int_value(v, &neg, &u, &s)) *out = neg ? (float)s : (float)u;
    else return type_mismatch(key, v, "a number", err);
    return KVB_OK;
}

enum kvb_status gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct kvb_err *err)
{
    const struct gguf_value *v = NULL;
    KVB_FORWARD_IF_ERROR(get_checked(f, key, &v, err));
    if (v->type != GGUF_VTYPE_BOOL) return type_mismatch(key, v, "BOOL", err);
    *out = v->v.b;
    return KVB_OK;
}

enum kvb_status gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out, struct kvb_err *err)
{
    const struct gguf_value *v = NULL;
    KVB_FORWARD_IF_ERROR(get_checked(f, key, &v, err));
    if (v->type != GGUF_VTYPE_STRING) return type_mismatch(key, v, "STRING", err);
    *out = v->v.str;
    return KVB_OK;
}

enum kvb_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                             const struct gguf_value **out, struct kvb_err *err)
{
    const struct gguf_value *v = NULL;
    KVB_FORWARD_IF_ERROR(get_checked(f, key, &v, err));
    if (v->type != GGUF_VTYPE_ARRAY) {
        char want[48];
        snprintf(want, sizeof want, "ARRAY of %s", gguf_vtype_name(elem));
        return type_mismatch(key, v, want, err);
    }
    if (v->v.arr.elem_type != elem)
        return kvb_errf(err, KVB_ERR_FORMAT, "gguf: key '%s' is an ARRAY of %s, expected an ARRAY of %s", key,
                        gguf_vtype_name(v->v.arr.elem_type), gguf_vtype_name(elem));
    *out = v;
    return KVB_OK;
}

/* ---- array elements and type names --------------------------------------------- */

/* Out-of-contract calls (wrong vtype, i >= n) return 0 rather than read out
 * of bounds: a bug upstream must not become a crash on a user's file. */
int64_t gguf_arr_i64(const struct gguf_value *arr, uint64_t i)
{
    if (arr->type != GGUF_VTYPE_ARRAY || i >= arr->v.arr.n || !arr->v.arr.raw) return 0;
    enum gguf_vtype t = arr->v.arr.elem_type;
    uint32_t sz = gguf_vtype_size(t);
    const uint8_t *b = (const uint8_t *)arr->v.arr.raw + i * sz;
    if (vtype_is_unsigned(t) || t == GGUF_VTYPE_BOOL) {
        uint64_t u = le_bytes(b, sz);
        return u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
    }
    if (vtype_is_signed(t)) return sext(le_bytes(b, sz), sz);
    return 0;
}

double gguf_arr_f64(const struct gguf_value *arr, uint64_t i)
{
    if (arr->type != GGUF_VTYPE_ARRAY || i >= arr->v.arr.n || !arr->v.arr.raw) return 0;
    enum gguf_vtype t = arr->v.arr.elem_type;
    const uint8_t *b = (const uint8_t *)arr->v.arr.raw + i * gguf_vtype_size(t);
    if (t == GGUF_VTYPE_FLOAT32) {
        uint32_t bits = (uint32_t)le_bytes(b, 4);
        float x;
        memcpy(&x, &bits, 4);
        return x;
    }
    if (t == GGUF_VTYPE_FLOAT64) {
        uint64_t bits = le_bytes(b, 8);
        double x;
        memcpy(&x, &bits, 8);
        return x;
    }
    return (double)gguf_arr_i64(arr, i);
}

uint32_t gguf_vtype_size(enum gguf_vtype t)
{
    switch (t) {
    case GGUF_VTYPE_UINT8:
    case GGUF_VTYPE_INT8:
    case GGUF_VTYPE_BOOL: return 1;
    case GGUF_VTYPE_UINT16:
    case GGUF_VTYPE_INT16: return 2;
    case GGUF_VTYPE_UINT32:
    case GGUF_VTYPE_INT32:
    case GGUF_VTYPE_FLOAT32: return 4;
    case GGUF_VTYPE_UINT64:
    case GGUF_VTYPE_INT64:
    case GGUF_VTYPE_FLOAT64: return 8;
    case GGUF_VTYPE_STRING:
    case GGUF_VTYPE_ARRAY:
    case GGUF_VTYPE_COUNT_: break;
    }
    return 0;
}

const char *gguf_vtype_name(enum gguf_vtype t)
{
    switch (t) {
    case GGUF_VTYPE_UINT8: return "UINT8";
    case GGUF_VTYPE_INT8: return "INT8";
    case GGUF_VTYPE_UINT16: return "UINT16";
    case GGUF_VTYPE_INT16: return "INT16";
    case GGUF_VTYPE_UINT32: return "UINT32";
    case GGUF_VTYPE_INT32: return "INT32";
    case GGUF_VTYPE_FLOAT32: return "FLOAT32";
    case GGUF_VTYPE_BOOL: return "BOOL";
    case GGUF_VTYPE_STRING: return "STRING";
    case GGUF_VTYPE_ARRAY: return "ARRAY";
    case GGUF_VTYPE_UINT64: return "UINT64";
    case GGUF_VTYPE_INT64: return "INT64";
    case GGUF_VTYPE_FLOAT64: return "FLOAT64";
    case GGUF_VTYPE_COUNT_: break;
    }
    return "INVALID";
}
