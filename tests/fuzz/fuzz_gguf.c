/* fuzz_gguf.c — libFuzzer target for the GGUF reader.
 *
 * Property: gguf_open_memory() on arbitrary bytes either fails with a message
 * or returns a file whose every exposed pointer is in bounds. So on success
 * this walks every kv (nested array items and the gguf_arr_* readers
 * included) and every tensor, touching the first and last byte of each
 * string, array and tensor: under ASan any out-of-bounds pointer is caught.
 * The input is copied to an exactly sized heap buffer so that reads past its
 * end are caught too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n)
{
    if (n == 0) return;
    const volatile uint8_t *b = p;
    sink ^= b[0];
    sink ^= b[n - 1];
}

static void walk_value(const struct gguf_value *v, int depth)
{
    if (depth > 16) abort(); /* the reader promised a nesting limit */
    switch (v->type) {
    case GGUF_VTYPE_STRING: touch(v->v.str.ptr, v->v.str.len); break;
    case GGUF_VTYPE_ARRAY: {
        uint32_t sz = gguf_vtype_size(v->v.arr.elem_type);
        if (sz) {
            touch(v->v.arr.raw, v->v.arr.n * sz);
            for (uint64_t i = 0; i < v->v.arr.n; i++) {
                if (v->v.arr.elem_type == GGUF_VTYPE_FLOAT32 || v->v.arr.elem_type == GGUF_VTYPE_FLOAT64)
                    sink ^= (uint8_t)(gguf_arr_f64(v, i) != 0.0);
                else sink ^= (uint8_t)gguf_arr_i64(v, i);
            }
        } else {
            if (v->v.arr.n && !v->v.arr.items) abort();
            for (uint64_t i = 0; i < v->v.arr.n; i++) {
                if (v->v.arr.items[i].type != v->v.arr.elem_type) abort();
                walk_value(&v->v.arr.items[i], depth + 1);
            }
        }
        break;
    }
    default: sink ^= (uint8_t)v->v.u64; break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    struct gguf_file *f = NULL;
    struct kvb_err err;
    err.msg[0] = '\0';
    if (gguf_open_memory(copy, size, &f, &err) != KVB_OK) {
        if (f != NULL || err.msg[0] == '\0') abort(); /* failures must say why */
        free(copy);
        return 0;
    }
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        touch(kv->key.ptr, kv->key.len);
        walk_value(&kv->val, 0);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        touch(t->name.ptr, t->name.len);
        if (t->n_dims < 1 || t->n_dims > 4) abort();
        touch(t->data, t->n_bytes);
        const uint8_t *d = t->data;
        if (d < copy || d + t->n_bytes > copy + size) abort();
    }
    /* Lookups and typed getters over whatever keys exist. */
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    struct gguf_str s;
    const struct gguf_value *a;
    for (uint64_t i = 0; i < gguf_n_kv(f) && i < 64; i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char key[128];
        if (kv->key.len >= sizeof key) continue;
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = '\0';
        if (strlen(key) == kv->key.len && gguf_find(f, key) != &kv->val) abort();
        gguf_get_u32(f, key, &u32, &err);
        gguf_get_u64(f, key, &u64, &err);
        gguf_get_i64(f, key, &i64, &err);
        gguf_get_f32(f, key, &f32, &err);
        gguf_get_bool(f, key, &b, &err);
        gguf_get_str(f, key, &s, &err);
        gguf_get_arr(f, key, GGUF_VTYPE_STRING, &a, &err);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f) && i < 64; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        if (t->name.len >= sizeof name) continue;
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        if (strlen(name) == t->name.len && gguf_find_tensor(f, name) != t) abort();
    }
    gguf_close(f);
    free(copy);
    return 0;
}
