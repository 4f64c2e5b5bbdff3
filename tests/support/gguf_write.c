/* gguf_write.c — the GGUF writer behind gguf_write.h.
 *
 * Key-value pairs are serialised into one growing byte buffer as they are
 * added; tensors are kept as records with their own data copies. Writing
 * walks the same emitter twice for a memory buffer (once to count, once to
 * copy) and once for a file, so the layout code exists only once. The layout
 * follows llama.cpp's writer: header, kvs, tensor infos, padding to the
 * alignment, then each tensor's data padded to the alignment. */
#include "support/gguf_write.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"

#define WRITER_MAX_DEPTH 64 /* guards against cyclic value trees */
#define WRITER_MAX_RAW_DIMS 8

struct wbuf {
    uint8_t *p;
    size_t len, cap;
};

struct wtensor {
    char *name;
    size_t name_len;
    uint32_t type, n_dims;
    uint64_t ne[WRITER_MAX_RAW_DIMS];
    uint64_t offset;  /* raw infos: as given; data tensors: assigned at write */
    uint64_t n_bytes; /* data tensors only */
    uint8_t *data;    /* NULL for raw infos */
};

struct gguf_writer {
    uint32_t version, alignment;
    bool alignment_set;
    struct wbuf kv; /* serialised kvs */
    uint64_t n_kv;
    struct wtensor *tensors;
    size_t n_tensors, cap_tensors;
    enum kvb_status st; /* first failure, sticky */
    struct kvb_err err;
};

/* Records the first failure; returns st. */
static enum kvb_status fail(struct gguf_writer *w, enum kvb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum kvb_status fail(struct gguf_writer *w, enum kvb_status st, const char *fmt, ...)
{
    if (w->st == KVB_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err.msg, sizeof w->err.msg, fmt, ap);
        va_end(ap);
        w->st = st;
    }
    return st;
}

/* ---- byte buffer --------------------------------------------------------------- */

static bool wbuf_reserve(struct wbuf *b, uint64_t more)
{
    if (more > SIZE_MAX - b->len) return false;
    if (b->len + more <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    uint8_t *np = kvb_realloc(b->p, cap);
    if (!np) return false;
    b->p = np;
    b->cap = cap;
    return true;
}

static bool wbuf_put(struct wbuf *b, const void *p, uint64_t n)
{
    if (!wbuf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, p, (size_t)n);
    b->len += (size_t)n;
    return true;
}

static bool wbuf_le(struct wbuf *b, uint64_t v, unsigned bytes)
{
    uint8_t t[8];
    for (unsigned i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    return wbuf_put(b, t, bytes);
}

static bool wbuf_str(struct wbuf *b, const char *s, uint64_t len) { return wbuf_le(b, len, 8) && wbuf_put(b, s, len); }

/* ---- create / free ------------------------------------------------------------- */

enum kvb_status gguf_writer_create(struct gguf_writer **out, struct kvb_err *err)
{
    if (!out) return kvb_errf(err, KVB_ERR_INVALID_ARG, "gguf_writer_create: NULL out");
    *out = kvb_calloc(1, sizeof **out);
    if (!*out) return kvb_errf(err, KVB_ERR_NOMEM, "gguf_writer: out of memory");
    (*out)->version = 3;
    (*out)->alignment = 32;
    return KVB_OK;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_tensors; i++) {
        kvb_free(w->tensors[i].name);
        kvb_free(w->tensors[i].data);
    }
    kvb_free(w->tensors);
    kvb_free(w->kv.p);
    kvb_free(w);
}

void gguf_writer_set_version(struct gguf_writer *w, uint32_t version) { w->version = version; }

/* ---- values -------------------------------------------------------------------- */

static bool scalar_fits(const struct gguf_value *v)
{
    switch (v->type) {
    case GGUF_VTYPE_UINT8: return v->v.u64 <= UINT8_MAX;
    case GGUF_VTYPE_UINT16: return v->v.u64 <= UINT16_MAX;
    case GGUF_VTYPE_UINT32: return v->v.u64 <= UINT32_MAX;
    case GGUF_VTYPE_INT8: return v->v.i64 >= INT8_MIN && v->v.i64 <= INT8_MAX;
    case GGUF_VTYPE_INT16: return v->v.i64 >= INT16_MIN && v->v.i64 <= INT16_MAX;
    case GGUF_VTYPE_INT32: return v->v.i64 >= INT32_MIN && v->v.i64 <= INT32_MAX;
    default: return true;
    }
}

/* Serialises one value body (no type tag); *why explains a refusal. */
static enum kvb_status put_value(struct wbuf *b, const struct gguf_value *v, unsigned depth, const char **why)
{
    uint32_t size = gguf_vtype_size(v->type);
    uint64_t u;
    switch (v->type) {
    case GGUF_VTYPE_UINT8:
    case GGUF_VTYPE_UINT16:
    case GGUF_VTYPE_UINT32:
    case GGUF_VTYPE_UINT64:
    case GGUF_VTYPE_INT8:
    case GGUF_VTYPE_INT16:
    case GGUF_VTYPE_INT32:
    case GGUF_VTYPE_INT64:
        if (!scalar_fits(v)) {
            *why = "value does not fit its vtype";
            return KVB_ERR_INVALID_ARG;
        }
        /* Two's complement truncation of the widened value is the encoding. */
        u = v->v.u64;
        return wbuf_le(b, u, size) ? KVB_OK : KVB_ERR_NOMEM;
    case GGUF_VTYPE_FLOAT32: {
        float f = (float)v->v.f64;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        return wbuf_le(b, bits, 4) ? KVB_OK : KVB_ERR_NOMEM;
    }
    case GGUF_VTYPE_FLOAT64: memcpy(&u, &v->v.f64, 8); return wbuf_le(b, u, 8) ? KVB_OK : KVB_ERR_NOMEM;
    case GGUF_VTYPE_BOOL: return wbuf_le(b, v->v.b ? 1 : 0, 1) ? KVB_OK : KVB_ERR_NOMEM;
    case GGUF_VTYPE_STRING:
        if (!v->v.str.ptr && v->v.str.len) {
            *why = "string with NULL pointer";
            return KVB_ERR_INVALID_ARG;
        }
        return wbuf_str(b, v->v.str.ptr, v->v.str.len) ? KVB_OK : KVB_ERR_NOMEM;
    case GGUF_VTYPE_ARRAY: {
        enum gguf_vtype et = v->v.arr.elem_type;
        uint64_t n = v->v.arr.n;
        uint32_t esize = gguf_vtype_size(et);
        if (depth >= WRITER_MAX_DEPTH) {
            *why = "arrays nested too deep (cyclic value?)";
            return KVB_ERR_INVALID_ARG;
        }
        if ((unsigned)et >= GGUF_VTYPE_COUNT_) {
            *why = "bad array element vtype";
            return KVB_ERR_INVALID_ARG;
        }
        if (!wbuf_le(b, (uint32_t)et, 4) || !wbuf_le(b, n, 8)) return KVB_ERR_NOMEM;
        if (esize) {
            if (n && !v->v.arr.raw) {
                *why = "scalar array with NULL raw";
                return KVB_ERR_INVALID_ARG;
            }
            if (n > UINT64_MAX / esize) {
                *why = "array too large";
                return KVB_ERR_INVALID_ARG;
            }
            return wbuf_put(b, v->v.arr.raw, n * esize) ? KVB_OK : KVB_ERR_NOMEM;
        }
        if (n && !v->v.arr.items) {
            *why = "string/array array with NULL items";
            return KVB_ERR_INVALID_ARG;
        }
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.items[i].type != et) {
                *why = "array item type differs from the array's element type";
                return KVB_ERR_INVALID_ARG;
            }
            KVB_FORWARD_IF_ERROR(put_value(b, &v->v.arr.items[i], depth + 1, why));
        }
        return KVB_OK;
    }
    case GGUF_VTYPE_COUNT_: break;
    }
    *why = "bad vtype";
    return KVB_ERR_INVALID_ARG;
}

enum kvb_status gguf_writer_add_value(struct gguf_writer *w, const char *key, const struct gguf_value *v)
{
    if (!key || !v) return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: add_value: NULL %s", key ? "value" : "key");
    size_t mark = w->kv.len;
    const char *why = "out of memory";
    enum kvb_status st = KVB_ERR_NOMEM;
    if (wbuf_str(&w->kv, key, strlen(key)) && wbuf_le(&w->kv, (uint32_t)v->type, 4)) st = put_value(&w->kv, v, 0, &why);
    if (st != KVB_OK) {
        w->kv.len = mark; /* drop the partial kv */
        return fail(w, st, "gguf_writer: key '%s' (%s): %s", key, gguf_vtype_name(v->type), why);
    }
    w->n_kv++;
    return KVB_OK;
}

static enum kvb_status add_uint(struct gguf_writer *w, const char *key, enum gguf_vtype t, uint64_t x)
{
    struct gguf_value v = {.type = t, .v.u64 = x};
    return gguf_writer_add_value(w, key, &v);
}

static enum kvb_status add_int(struct gguf_writer *w, const char *key, enum gguf_vtype t, int64_t x)
{
    struct gguf_value v = {.type = t, .v.i64 = x};
    return gguf_writer_add_value(w, key, &v);
}

enum kvb_status gguf_writer_add_u8(struct gguf_writer *w, const char *key, uint8_t v)
{
    return add_uint(w, key, GGUF_VTYPE_UINT8, v);
}
enum kvb_status gguf_writer_add_u16(struct gguf_writer *w, const char *key, uint16_t v)
{
    return add_uint(w, key, GGUF_VTYPE_UINT16, v);
}
enum kvb_status gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return add_uint(w, key, GGUF_VTYPE_UINT32, v);
}
enum kvb_status gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return add_uint(w, key, GGUF_VTYPE_UINT64, v);
}
enum kvb_status gguf_writer_add_i8(struct gguf_writer *w, const char *key, int8_t v)
{
    return add_int(w, key, GGUF_VTYPE_INT8, v);
}
enum kvb_status gguf_writer_add_i16(struct gguf_writer *w, const char *key, int16_t v)
{
    return add_int(w, key, GGUF_VTYPE_INT16, v);
}
enum kvb_status gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return add_int(w, key, GGUF_VTYPE_INT32, v);
}
enum kvb_status gguf_writer_add_i64(struct gguf_writer *w, const char *key, int64_t v)
{
    return add_int(w, key, GGUF_VTYPE_INT64, v);
}

enum kvb_status gguf_writer_add_f32(struct gguf_writer *w, const char *key, float x)
{
    struct gguf_value v = {.type = GGUF_VTYPE_FLOAT32, .v.f64 = x};
    return gguf_writer_add_value(w, key, &v);
}

enum kvb_status gguf_writer_add_f64(struct gguf_writer *w, const char *key, double x)
{
    struct gguf_value v = {.type = GGUF_VTYPE_FLOAT64, .v.f64 = x};
    return gguf_writer_add_value(w, key, &v);
}

enum kvb_status gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool x)
{
    struct gguf_value v = {.type = GGUF_VTYPE_BOOL, .v.b = x};
    return gguf_writer_add_value(w, key, &v);
}

enum kvb_status gguf_writer_add_strn(struct gguf_writer *w, const char *key, const char *s, uint64_t len)
{
    struct gguf_value v = {.type = GGUF_VTYPE_STRING, .v.str = {len, s}};
    return gguf_writer_add_value(w, key, &v);
}

enum kvb_status gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *s)
{
    if (!s) return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: key '%s': NULL string", key ? key : "(null)");
    return gguf_writer_add_strn(w, key, s, strlen(s));
}

enum kvb_status gguf_writer_add_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem, const void *elems,
                                    uint64_t n)
{
    uint32_t esize = gguf_vtype_size(elem);
    if (!key || esize == 0 || (n && !elems) || n > SIZE_MAX / 8)
        return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: add_arr '%s': bad arguments (elem %s, n %" PRIu64 ")",
                    key ? key : "(null)", gguf_vtype_name(elem), n);
    /* Convert host values to little-endian bytes, then reuse add_value. */
    uint8_t *raw = kvb_malloc((size_t)(n * esize));
    if (!raw) return fail(w, KVB_ERR_NOMEM, "gguf_writer: add_arr '%s': out of memory", key);
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *src = (const uint8_t *)elems + i * esize;
        uint64_t x = 0;
        if (elem == GGUF_VTYPE_BOOL) {
            x = src[0] != 0; /* bool is one byte on every ABI we build for */
        } else if (esize == 1) {
            x = src[0];
        } else if (esize == 2) {
            uint16_t t;
            memcpy(&t, src, 2);
            x = t;
        } else if (esize == 4) {
            uint32_t t;
            memcpy(&t, src, 4);
            x = t;
        } else {
            memcpy(&x, src, 8);
        }
        for (uint32_t k = 0; k < esize; k++) raw[i * esize + k] = (uint8_t)(x >> (8 * k));
    }
    struct gguf_value v = {.type = GGUF_VTYPE_ARRAY};
    v.v.arr.elem_type = elem;
    v.v.arr.n = n;
    v.v.arr.raw = raw;
    enum kvb_status st = gguf_writer_add_value(w, key, &v);
    kvb_free(raw);
    return st;
}

enum kvb_status gguf_writer_add_arr_str(struct gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    if (!key || (n && !strs))
        return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: add_arr_str '%s': bad arguments", key ? key : "(null)");
    struct gguf_value *items = kvb_calloc((size_t)n, sizeof *items);
    if (!items) return fail(w, KVB_ERR_NOMEM, "gguf_writer: add_arr_str '%s': out of memory", key);
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = GGUF_VTYPE_STRING;
        items[i].v.str.ptr = strs[i] ? strs[i] : "";
        items[i].v.str.len = strs[i] ? strlen(strs[i]) : 0;
    }
    struct gguf_value v = {.type = GGUF_VTYPE_ARRAY};
    v.v.arr.elem_type = GGUF_VTYPE_STRING;
    v.v.arr.n = n;
    v.v.arr.items = items;
    enum kvb_status st = gguf_writer_add_value(w, key, &v);
    kvb_free(items);
    return st;
}

enum kvb_status gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment)
{
    if (w->alignment_set) return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: alignment set twice");
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: alignment %" PRIu32 " is not a power of two", alignment);
    KVB_FORWARD_IF_ERROR(gguf_writer_add_u32(w, "general.alignment", alignment));
    w->alignment = alignment;
    w->alignment_set = true;
    return KVB_OK;
}

/* ---- tensors ------------------------------------------------------------------- */

static enum kvb_status push_tensor(struct gguf_writer *w, const char *name, struct wtensor *t)
{
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        struct wtensor *nt = kvb_realloc(w->tensors, cap * sizeof *nt);
        if (!nt) return KVB_ERR_NOMEM;
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    t->name_len = strlen(name);
    t->name = kvb_strndup(name, t->name_len);
    if (!t->name) return KVB_ERR_NOMEM;
    w->tensors[w->n_tensors++] = *t;
    return KVB_OK;
}

enum kvb_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type, uint32_t n_dims,
                                       const uint64_t *ne, const void *data, void **out_data)
{
    if (out_data) *out_data = NULL;
    if (!name || !ne || n_dims < 1 || n_dims > 4)
        return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: tensor '%s': bad arguments (n_dims %" PRIu32 ")",
                    name ? name : "(null)", n_dims);
    const struct ggml_type_traits *tr = ggml_type_get_traits((uint32_t)type);
    if (!tr) return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: tensor '%s': unknown ggml type %d", name, (int)type);
    struct wtensor t = {.type = (uint32_t)type, .n_dims = n_dims};
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        t.ne[d] = ne[d];
        if (ne[d] > (uint64_t)INT64_MAX || (ne[d] && n_elems > (uint64_t)INT64_MAX / ne[d]))
            return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: tensor '%s': shape overflows", name);
        n_elems *= ne[d];
    }
    if (ne[0] % tr->block_elems != 0 || !ggml_type_row_bytes((uint32_t)type, n_elems, &t.n_bytes) ||
        t.n_bytes > SIZE_MAX)
        return fail(w, KVB_ERR_INVALID_ARG,
                    "gguf_writer: tensor '%s': ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32,
                    name, ne[0], tr->name, tr->block_elems);
    t.data = data ? kvb_malloc((size_t)t.n_bytes) : kvb_calloc(1, (size_t)t.n_bytes);
    if (!t.data)
        return fail(w, KVB_ERR_NOMEM, "gguf_writer: tensor '%s': no memory for %" PRIu64 " bytes", name, t.n_bytes);
    if (data && t.n_bytes) memcpy(t.data, data, (size_t)t.n_bytes);
    if (push_tensor(w, name, &t) != KVB_OK) {
        kvb_free(t.data);
        return fail(w, KVB_ERR_NOMEM, "gguf_writer: tensor '%s': out of memory", name);
    }
    if (out_data) *out_data = t.data;
    return KVB_OK;
}

enum kvb_status gguf_writer_add_tensor_info_raw(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                                const uint64_t *ne, uint64_t offset)
{
    if (!name || n_dims > WRITER_MAX_RAW_DIMS || (n_dims && !ne))
        return fail(w, KVB_ERR_INVALID_ARG, "gguf_writer: raw tensor info '%s': bad arguments", name ? name : "(null)");
    struct wtensor t = {.type = type, .n_dims = n_dims, .offset = offset};
    for (uint32_t d = 0; d < n_dims; d++) t.ne[d] = ne[d];
    if (push_tensor(w, name, &t) != KVB_OK)
        return fail(w, KVB_ERR_NOMEM, "gguf_writer: tensor '%s': out of memory", name);
    return KVB_OK;
}

/* ---- output -------------------------------------------------------------------- */

/* Where bytes go: a FILE, a memory buffer sized beforehand, or nowhere (only
 * counting, to size that buffer). */
struct sink {
    FILE *f;
    uint8_t *mem;
    uint64_t pos;
    bool failed;
};

static void put(struct sink *s, const void *p, uint64_t n)
{
    if (n == 0) return;
    if (s->f) {
        if (fwrite(p, 1, (size_t)n, s->f) != (size_t)n) s->failed = true;
    } else if (s->mem) {
        memcpy(s->mem + s->pos, p, (size_t)n);
    }
    s->pos += n;
}

static void put_le(struct sink *s, uint64_t v, unsigned bytes)
{
    uint8_t t[8];
    for (unsigned i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    put(s, t, bytes);
}

static void put_pad(struct sink *s, uint64_t alignment)
{
    static const uint8_t zeros[64];
    uint64_t n = (alignment - s->pos % alignment) % alignment;
    while (n > 0) {
        uint64_t k = n < sizeof zeros ? n : sizeof zeros;
        put(s, zeros, k);
        n -= k;
    }
}

static void emit(const struct gguf_writer *w, struct sink *s)
{
    uint64_t a = w->alignment;
    put(s, "GGUF", 4);
    put_le(s, w->version, 4);
    put_le(s, w->n_tensors, 8);
    put_le(s, w->n_kv, 8);
    put(s, w->kv.p, w->kv.len);

    /* Data tensors are laid out in order, each starting aligned. */
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        uint64_t toff = t->offset;
        if (t->data) {
            off += (a - off % a) % a;
            toff = off;
            off += t->n_bytes;
        }
        put_le(s, t->name_len, 8);
        put(s, t->name, t->name_len);
        put_le(s, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) put_le(s, t->ne[d], 8);
        put_le(s, t->type, 4);
        put_le(s, toff, 8);
    }
    put_pad(s, a);
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        if (!t->data) continue;
        put(s, t->data, t->n_bytes);
        put_pad(s, a);
    }
}

enum kvb_status gguf_writer_write_memory(const struct gguf_writer *w, void **out, uint64_t *out_size,
                                         struct kvb_err *err)
{
    if (!w || !out || !out_size) return kvb_errf(err, KVB_ERR_INVALID_ARG, "gguf_writer_write_memory: NULL argument");
    *out = NULL;
    *out_size = 0;
    if (w->st != KVB_OK) return kvb_errf(err, w->st, "%s", w->err.msg);
    struct sink count = {0};
    emit(w, &count);
    if (count.pos > SIZE_MAX)
        return kvb_errf(err, KVB_ERR_NOMEM, "gguf_writer: %" PRIu64 " bytes do not fit in memory", count.pos);
    struct sink mem = {.mem = kvb_malloc((size_t)count.pos)};
    if (!mem.mem) return kvb_errf(err, KVB_ERR_NOMEM, "gguf_writer: no memory for %" PRIu64 " bytes", count.pos);
    emit(w, &mem);
    *out = mem.mem;
    *out_size = mem.pos;
    return KVB_OK;
}

enum kvb_status gguf_writer_write_file(const struct gguf_writer *w, const char *path, struct kvb_err *err)
{
    if (!w || !path) return kvb_errf(err, KVB_ERR_INVALID_ARG, "gguf_writer_write_file: NULL argument");
    if (w->st != KVB_OK) return kvb_errf(err, w->st, "%s", w->err.msg);
    FILE *f = fopen(path, "wb");
    if (!f) return kvb_errf(err, KVB_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    struct sink s = {.f = f};
    emit(w, &s);
    int e = s.failed ? errno : 0;
    if (fflush(f) != 0 && !e) e = errno ? errno : EIO;
    if (fclose(f) != 0 && !e) e = errno ? errno : EIO;
    if (s.failed && !e) e = EIO;
    if (e) {
        unlink(path);
        return kvb_errf(err, KVB_ERR_IO, "cannot write '%s': %s", path, strerror(e));
    }
    return KVB_OK;
}
