/* gguf_write.h — a small GGUF writer (version 3 layout, little-endian).
 *
 * Builds a file in memory piece by piece: key-value pairs in the order they
 * are added, then tensors in the order they are added, then writes it to a
 * path or to a heap buffer. Used by tests (valid files and deliberately
 * damaged ones) and to write small random models.
 *
 * Ownership: every add_* call copies what it is given (keys, strings, array
 * elements, tensor data); nothing passed in needs to outlive the call.
 *
 * Validation: the writer refuses what it cannot encode (an unknown vtype, a
 * value that does not fit its vtype, a tensor whose shape does not fit its
 * ggml type) but does NOT check what the reader checks about the file as a
 * whole: duplicate keys or tensor names, empty keys, a `general.alignment`
 * key added by hand that disagrees with the padding. That lets tests write
 * invalid files on purpose; a valid file is the caller's responsibility.
 *
 * Errors are sticky: the first failing add_* call returns its status and is
 * remembered; later calls still work, and gguf_writer_write_* return that
 * first status with its message. So a sequence of adds may be checked once,
 * at write time. */
#ifndef KVB_GGUF_WRITE_H
#define KVB_GGUF_WRITE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"
#include "model/gguf.h"

struct gguf_writer; /* opaque */

/* A writer with version 3 and alignment 32 (no general.alignment key). */
enum kvb_status gguf_writer_create(struct gguf_writer **out, struct kvb_err *err);
void gguf_writer_free(struct gguf_writer *w); /* accepts NULL */

/* The version field, written verbatim (default 3). The body layout is always
 * the v2/v3 one; other numbers exist to test the reader's refusals. */
void gguf_writer_set_version(struct gguf_writer *w, uint32_t version);

/* Pads tensor data to `alignment` (a power of two, 1..2^31) and adds the key
 * `general.alignment` (UINT32) at this point of the key order. At most once;
 * KVB_ERR_INVALID_ARG otherwise. Without it the reader's default 32 is used. */
enum kvb_status gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment);

/* ---- key-value pairs (key: NUL-terminated, copied) ---- */
enum kvb_status gguf_writer_add_u8(struct gguf_writer *w, const char *key, uint8_t v);
enum kvb_status gguf_writer_add_i8(struct gguf_writer *w, const char *key, int8_t v);
enum kvb_status gguf_writer_add_u16(struct gguf_writer *w, const char *key, uint16_t v);
enum kvb_status gguf_writer_add_i16(struct gguf_writer *w, const char *key, int16_t v);
enum kvb_status gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v);
enum kvb_status gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v);
enum kvb_status gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v);
enum kvb_status gguf_writer_add_i64(struct gguf_writer *w, const char *key, int64_t v);
enum kvb_status gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v);
enum kvb_status gguf_writer_add_f64(struct gguf_writer *w, const char *key, double v);
enum kvb_status gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v);
enum kvb_status gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *s);
/* `len` bytes at s (may contain NUL bytes; s may be NULL when len is 0). */
enum kvb_status gguf_writer_add_strn(struct gguf_writer *w, const char *key, const char *s, uint64_t len);

/* An array of `n` scalars of vtype `elem` given in host representation:
 * uint8_t[] for UINT8, int32_t[] for INT32, float[] for FLOAT32, double[] for
 * FLOAT64, bool[] for BOOL, ... STRING/ARRAY elem → KVB_ERR_INVALID_ARG (use
 * add_arr_str / add_value). */
enum kvb_status gguf_writer_add_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem, const void *elems,
                                    uint64_t n);
/* An array of `n` NUL-terminated strings. */
enum kvb_status gguf_writer_add_arr_str(struct gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Any value, described with the reader's struct: scalars from the widened
 * u64/i64/f64/b fields (must fit the vtype), strings from .str, scalar arrays
 * from .arr.raw (n little-endian elements, as the reader exposes them),
 * string and nested arrays from .arr.items (each item's type must equal
 * .arr.elem_type). So a value read from one file can be written to another. */
enum kvb_status gguf_writer_add_value(struct gguf_writer *w, const char *key, const struct gguf_value *v);

/* ---- tensors ---- */
/* A tensor of `type` with n_dims (1..4) extents ne[0..n_dims-1] (ne[0]
 * fastest, a multiple of the type's block size). Its n_bytes (from
 * ggml_type_row_bytes) are copied from `data`, or zero-filled when data is
 * NULL. When out_data is non-NULL it receives the writer-owned copy, which
 * the caller may fill in place until the writer is freed. Its offset is
 * assigned at write time: tensors are laid out in order, each aligned. */
enum kvb_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type, uint32_t n_dims,
                                       const uint64_t *ne, const void *data, void **out_data);
/* Test hook: a tensor info written verbatim — any type code, n_dims 0..8
 * (ne holds n_dims values), the given offset — with no data behind it. */
enum kvb_status gguf_writer_add_tensor_info_raw(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                                const uint64_t *ne, uint64_t offset);

/* ---- output ---- */
/* Creates or truncates `path`; a partial file is removed on failure. */
enum kvb_status gguf_writer_write_file(const struct gguf_writer *w, const char *path, struct kvb_err *err);
/* *out: a kvb_malloc'd buffer of *out_size bytes; free it with kvb_free. */
enum kvb_status gguf_writer_write_memory(const struct gguf_writer *w, void **out, uint64_t *out_size,
                                         struct kvb_err *err);

#endif
