/* gguf.h — read-only GGUF reader (versions 2 and 3).
 *
 * gguf_open() memory-maps a file; gguf_open_memory() parses a caller-owned
 * buffer (fuzzing, tests). Everything returned — strings, arrays, tensor data —
 * points into that mapping/buffer and stays valid until gguf_close(). Strings
 * (struct gguf_str) are NOT NUL-terminated: use .len.
 *
 * Parsing validates everything before anything is exposed: every read is
 * bounds-checked, counts are checked against the bytes that remain, tensor
 * offsets/sizes are checked for overflow and against the file end, alignment
 * comes from `general.alignment` (default 32, must be a power of two), and
 * duplicate keys or tensor names are errors. A damaged file yields
 * KVB_ERR_FORMAT (or KVB_ERR_UNSUPPORTED for a version/type we do not handle)
 * with err->msg naming the problem and its byte offset. Never a crash.
 *
 * Metadata arrays of scalars are exposed as a pointer to their raw
 * little-endian bytes (possibly unaligned: read elements with the
 * gguf_arr_* helpers). Arrays of strings and arrays of arrays are parsed into
 * `items` (one struct gguf_value per element).
 */
#ifndef KVB_GGUF_H
#define KVB_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

enum gguf_vtype {
    GGUF_VTYPE_UINT8 = 0,
    GGUF_VTYPE_INT8 = 1,
    GGUF_VTYPE_UINT16 = 2,
    GGUF_VTYPE_INT16 = 3,
    GGUF_VTYPE_UINT32 = 4,
    GGUF_VTYPE_INT32 = 5,
    GGUF_VTYPE_FLOAT32 = 6,
    GGUF_VTYPE_BOOL = 7,
    GGUF_VTYPE_STRING = 8,
    GGUF_VTYPE_ARRAY = 9,
    GGUF_VTYPE_UINT64 = 10,
    GGUF_VTYPE_INT64 = 11,
    GGUF_VTYPE_FLOAT64 = 12,
    GGUF_VTYPE_COUNT_
};

struct gguf_str {
    uint64_t len;
    const char *ptr; /* into the mapping; not NUL-terminated */
};

struct gguf_value {
    enum gguf_vtype type;
    union {
        uint64_t u64; /* UINT8..UINT64 widened */
        int64_t i64;  /* INT8..INT64 widened */
        double f64;   /* FLOAT32/FLOAT64 widened */
        bool b;
        struct gguf_str str;
        struct {
            enum gguf_vtype elem_type;
            uint64_t n;
            const void *raw;                /* scalar elements: n * size LE bytes */
            const struct gguf_value *items; /* STRING/ARRAY elements, else NULL */
        } arr;
    } v;
};

struct gguf_kv {
    struct gguf_str key;
    struct gguf_value val;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims; /* 1..4 */
    uint64_t ne[4];  /* elements per dim, ne[0] fastest; unused dims are 1 */
    enum ggml_type type;
    uint64_t offset;  /* relative to the data section */
    uint64_t n_bytes; /* validated: data + n_bytes <= end of file */
    const void *data; /* into the mapping */
};

struct gguf_file; /* opaque */

enum kvb_status gguf_open(const char *path, struct gguf_file **out, struct kvb_err *err);
/* Parses `size` bytes at `data`; the buffer must outlive the handle. */
enum kvb_status gguf_open_memory(const void *data, uint64_t size, struct gguf_file **out, struct kvb_err *err);
void gguf_close(struct gguf_file *f); /* accepts NULL */

/* Tells the kernel that the whole pages of the mapped file inside
 * [p, p + n) are not needed for now (a tensor that was copied elsewhere):
 * they leave the process's resident memory and are read from the file
 * again if touched. The data stays valid. A no-op for memory that is not
 * this file's mapping (gguf_open_memory) or on failure. */
void gguf_release_pages(const struct gguf_file *f, const void *p, size_t n);

uint32_t gguf_version(const struct gguf_file *f);
uint64_t gguf_n_kv(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i);
/* NULL when absent. */
const struct gguf_value *gguf_find(const struct gguf_file *f, const char *key);

/* Typed getters. Return KVB_ERR_NOT_FOUND when absent, KVB_ERR_FORMAT (with
 * message naming the key) when the stored type does not fit. Integer getters
 * accept any integer vtype whose value fits the target. */
enum kvb_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct kvb_err *err);
enum kvb_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out, struct kvb_err *err);
enum kvb_status gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out, struct kvb_err *err);
enum kvb_status gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct kvb_err *err);
enum kvb_status gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct kvb_err *err);
enum kvb_status gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out, struct kvb_err *err);
/* An array whose elements have vtype `elem`; fills *out with the array value. */
enum kvb_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                             const struct gguf_value **out, struct kvb_err *err);

/* Element readers for scalar arrays (caller guarantees i < n and the vtype). */
int64_t gguf_arr_i64(const struct gguf_value *arr, uint64_t i); /* any integer elem type */
double gguf_arr_f64(const struct gguf_value *arr, uint64_t i);  /* FLOAT32/FLOAT64 */
/* Byte size of one scalar element, 0 for STRING/ARRAY. */
uint32_t gguf_vtype_size(enum gguf_vtype t);
const char *gguf_vtype_name(enum gguf_vtype t);

uint64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Compares a gguf_str with a NUL-terminated string. */
bool gguf_str_eq(struct gguf_str s, const char *z);

#endif
