/* test_gguf.c — the GGUF reader and writer: round trips of every value type
 * and tensor field, a list of damaged files that must each fail cleanly with
 * a message naming the problem, the typed getters, allocation failures, and
 * (when KVB_MODEL is set) the real SmolLM2 file. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "model/gguf.h"
#include "support/gguf_write.h"
#include "support/testutil.h"

/* ---- helpers ------------------------------------------------------------------- */

static uint8_t *build(struct gguf_writer *w, uint64_t *n)
{
    void *p = NULL;
    struct kvb_err e = {{0}};
    enum kvb_status st = gguf_writer_write_memory(w, &p, n, &e);
    CHECK_MSG(st == KVB_OK, "write_memory: %s", e.msg);
    gguf_writer_free(w);
    return p;
}

static struct gguf_writer *new_writer(void)
{
    struct gguf_writer *w = NULL;
    CHECK(gguf_writer_create(&w, NULL) == KVB_OK);
    return w;
}

/* Opens a private, exactly sized copy so that ASan sees any read past `n`. */
static enum kvb_status open_copy(const uint8_t *p, uint64_t n, struct gguf_file **f, struct kvb_err *e)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    enum kvb_status st = gguf_open_memory(copy, n, f, e);
    /* On success the copy must outlive the handle: callers here only check
     * failures, so close right away. */
    if (st == KVB_OK) gguf_close(*f);
    *f = NULL;
    free(copy);
    return st;
}

static void expect_fail(const char *label, const uint8_t *p, uint64_t n, enum kvb_status want, const char *phrase)
{
    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    enum kvb_status st = open_copy(p, n, &f, &e);
    CHECK_MSG(st == want, "%s: status %s, want %s (msg: %s)", label, kvb_strerror(st), kvb_strerror(want), e.msg);
    CHECK_MSG(strstr(e.msg, phrase) != NULL, "%s: message '%s' lacks '%s'", label, e.msg, phrase);
    if (getenv("KVB_TEST_VERBOSE")) fprintf(stderr, "%-28s %s\n", label, e.msg);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A small valid file whose last tensor ends exactly at the end of the file
 * (every data size a multiple of 32), so that every proper prefix is
 * invalid. */
static uint8_t *small_valid(uint64_t *n)
{
    struct gguf_writer *w = new_writer();
    gguf_writer_add_str(w, "general.architecture", "llama");
    gguf_writer_add_u32(w, "llama.block_count", 2);
    gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_add_bool(w, "flag", true);
    const char *toks[] = {"<s>", "", "hello"};
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    int32_t tt[] = {3, 1, 1};
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_VTYPE_INT32, tt, 3);
    struct gguf_value inner[2] = {{.type = GGUF_VTYPE_ARRAY}, {.type = GGUF_VTYPE_ARRAY}};
    uint8_t raw[3] = {1, 2, 3};
    inner[0].v.arr.elem_type = GGUF_VTYPE_UINT8;
    inner[0].v.arr.n = 3;
    inner[0].v.arr.raw = raw;
    inner[1].v.arr.elem_type = GGUF_VTYPE_UINT8;
    inner[1].v.arr.n = 0;
    inner[1].v.arr.raw = raw;
    struct gguf_value outer = {.type = GGUF_VTYPE_ARRAY};
    outer.v.arr.elem_type = GGUF_VTYPE_ARRAY;
    outer.v.arr.n = 2;
    outer.v.arr.items = inner;
    gguf_writer_add_value(w, "nested", &outer);
    uint64_t ne1[] = {8};
    uint64_t ne2[] = {32, 2}; /* Q8_0: 2 blocks of 34 bytes = 68: pad follows */
    uint64_t ne3[] = {16, 2};
    gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 1, ne1, NULL, NULL);
    gguf_writer_add_tensor(w, "b", GGML_TYPE_Q8_0, 2, ne2, NULL, NULL);
    gguf_writer_add_tensor(w, "c", GGML_TYPE_F32, 2, ne3, NULL, NULL); /* 128 bytes, last */
    return build(w, n);
}

/* ---- round trips --------------------------------------------------------------- */

static void fill(uint8_t *p, uint64_t n, unsigned seed)
{
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 8));
}

/* The tensors of the round trip: every dimension count, block and float
 * types, and an empty one. */
struct rt_tensor {
    const char *name;
    enum ggml_type type;
    uint32_t n_dims;
    uint64_t ne[4];
};
static const struct rt_tensor rt_tensors[] = {
    {"t.f32", GGML_TYPE_F32, 1, {5, 1, 1, 1}},           {"t.f16", GGML_TYPE_F16, 2, {3, 7, 1, 1}},
    {"t.q4_0", GGML_TYPE_Q4_0, 2, {64, 3, 1, 1}},        {"t.q8_0", GGML_TYPE_Q8_0, 3, {32, 2, 2, 1}},
    {"t.q4_k", GGML_TYPE_Q4_K, 4, {256, 1, 2, 3}},       {"t.bf16", GGML_TYPE_BF16, 1, {1, 1, 1, 1}},
    {"t.q6_k.empty", GGML_TYPE_Q6_K, 2, {256, 0, 1, 1}},
};
#define RT_N_TENSORS ((int)(sizeof rt_tensors / sizeof rt_tensors[0]))

/* One key of every scalar type, at its extremes. */
static void rt_add_scalars(struct gguf_writer *w)
{
    gguf_writer_add_u8(w, "u8", 250);
    gguf_writer_add_i8(w, "i8", -128);
    gguf_writer_add_u16(w, "u16", 65535);
    gguf_writer_add_i16(w, "i16", -32768);
    gguf_writer_add_u32(w, "u32", 4000000000u);
    gguf_writer_add_i32(w, "i32", INT32_MIN);
    gguf_writer_add_u64(w, "u64", UINT64_MAX);
    gguf_writer_add_i64(w, "i64", INT64_MIN);
    gguf_writer_add_f32(w, "f32", -1.5e-3f);
    gguf_writer_add_f64(w, "f64", 3.141592653589793);
    gguf_writer_add_bool(w, "bool.t", true);
    gguf_writer_add_bool(w, "bool.f", false);
    gguf_writer_add_str(w, "str", "héllo wörld");
    gguf_writer_add_strn(w, "str.nul", "a\0b", 3);
    gguf_writer_add_str(w, "str.empty", "");
}

/* One array of every element type, empty ones too. */
static void rt_add_arrays(struct gguf_writer *w)
{
    uint8_t a_u8[] = {0, 1, 255};
    int8_t a_i8[] = {-128, 0, 127};
    uint16_t a_u16[] = {0, 65535};
    int16_t a_i16[] = {-32768, 32767, -1};
    uint32_t a_u32[] = {0, 4294967295u};
    int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    float a_f32[] = {0.5f, -2.25f, 1e30f};
    bool a_bool[] = {true, false, true};
    uint64_t a_u64[] = {UINT64_MAX, 7};
    int64_t a_i64[] = {INT64_MIN, INT64_MAX};
    double a_f64[] = {-0.0, 1e300};
    gguf_writer_add_arr(w, "a.u8", GGUF_VTYPE_UINT8, a_u8, 3);
    gguf_writer_add_arr(w, "a.i8", GGUF_VTYPE_INT8, a_i8, 3);
    gguf_writer_add_arr(w, "a.u16", GGUF_VTYPE_UINT16, a_u16, 2);
    gguf_writer_add_arr(w, "a.i16", GGUF_VTYPE_INT16, a_i16, 3);
    gguf_writer_add_arr(w, "a.u32", GGUF_VTYPE_UINT32, a_u32, 2);
    gguf_writer_add_arr(w, "a.i32", GGUF_VTYPE_INT32, a_i32, 3);
    gguf_writer_add_arr(w, "a.f32", GGUF_VTYPE_FLOAT32, a_f32, 3);
    gguf_writer_add_arr(w, "a.bool", GGUF_VTYPE_BOOL, a_bool, 3);
    gguf_writer_add_arr(w, "a.u64", GGUF_VTYPE_UINT64, a_u64, 2);
    gguf_writer_add_arr(w, "a.i64", GGUF_VTYPE_INT64, a_i64, 2);
    gguf_writer_add_arr(w, "a.f64", GGUF_VTYPE_FLOAT64, a_f64, 2);
    gguf_writer_add_arr(w, "a.empty", GGUF_VTYPE_UINT32, NULL, 0);
    const char *strs[] = {"x", "", "longer string"};
    gguf_writer_add_arr_str(w, "a.str", strs, 3);
    gguf_writer_add_arr_str(w, "a.str.empty", NULL, 0);
}

static void rt_add_nested(struct gguf_writer *w)
{
    /* [[1,2],[], [["p","q"]]] is not expressible (items share one type), so:
     * an array of arrays of INT32 and an array of arrays of arrays of STRING. */
    int32_t r0[] = {1, 2}, r1[] = {3};
    struct gguf_value rows[3] = {{.type = GGUF_VTYPE_ARRAY}, {.type = GGUF_VTYPE_ARRAY}, {.type = GGUF_VTYPE_ARRAY}};
    rows[0].v.arr.elem_type = GGUF_VTYPE_INT32, rows[0].v.arr.n = 2, rows[0].v.arr.raw = r0;
    rows[1].v.arr.elem_type = GGUF_VTYPE_INT32, rows[1].v.arr.n = 0, rows[1].v.arr.raw = NULL;
    rows[2].v.arr.elem_type = GGUF_VTYPE_INT32, rows[2].v.arr.n = 1, rows[2].v.arr.raw = r1;
    struct gguf_value mat = {.type = GGUF_VTYPE_ARRAY};
    mat.v.arr.elem_type = GGUF_VTYPE_ARRAY, mat.v.arr.n = 3, mat.v.arr.items = rows;
    gguf_writer_add_value(w, "nest.i32", &mat);
    struct gguf_value s2[2] = {{.type = GGUF_VTYPE_STRING, .v.str = {1, "p"}},
                               {.type = GGUF_VTYPE_STRING, .v.str = {2, "qq"}}};
    struct gguf_value l2 = {.type = GGUF_VTYPE_ARRAY};
    l2.v.arr.elem_type = GGUF_VTYPE_STRING, l2.v.arr.n = 2, l2.v.arr.items = s2;
    struct gguf_value l1 = {.type = GGUF_VTYPE_ARRAY};
    l1.v.arr.elem_type = GGUF_VTYPE_ARRAY, l1.v.arr.n = 1, l1.v.arr.items = &l2;
    struct gguf_value l0 = {.type = GGUF_VTYPE_ARRAY};
    l0.v.arr.elem_type = GGUF_VTYPE_ARRAY, l0.v.arr.n = 1, l0.v.arr.items = &l1;
    gguf_writer_add_value(w, "nest.str", &l0);
}

/* Every tensor of rt_tensors[], with data src[i] (allocated here, freed by the caller). */
static void rt_add_tensors(struct gguf_writer *w, uint8_t *src[])
{
    const int nt = RT_N_TENSORS;
    for (int i = 0; i < nt; i++) {
        uint64_t n_elems = rt_tensors[i].ne[0] * rt_tensors[i].ne[1] * rt_tensors[i].ne[2] * rt_tensors[i].ne[3],
                 nb = 0;
        CHECK(ggml_type_row_bytes(rt_tensors[i].type, n_elems, &nb));
        src[i] = malloc(nb ? nb : 1);
        fill(src[i], nb, (unsigned)i);
        void *mine = NULL;
        CHECK(gguf_writer_add_tensor(w, rt_tensors[i].name, rt_tensors[i].type, rt_tensors[i].n_dims, rt_tensors[i].ne,
                                     src[i], &mine) == KVB_OK);
        CHECK(mine != NULL && mine != src[i]); /* copied */
    }
}

static void rt_check_scalars(const struct gguf_file *f)
{
    const struct gguf_value *v;
    v = gguf_find(f, "u8");
    CHECK(v && v->type == GGUF_VTYPE_UINT8 && v->v.u64 == 250);
    v = gguf_find(f, "i8");
    CHECK(v && v->type == GGUF_VTYPE_INT8 && v->v.i64 == -128);
    v = gguf_find(f, "u16");
    CHECK(v && v->type == GGUF_VTYPE_UINT16 && v->v.u64 == 65535);
    v = gguf_find(f, "i16");
    CHECK(v && v->type == GGUF_VTYPE_INT16 && v->v.i64 == -32768);
    v = gguf_find(f, "u32");
    CHECK(v && v->type == GGUF_VTYPE_UINT32 && v->v.u64 == 4000000000u);
    v = gguf_find(f, "i32");
    CHECK(v && v->type == GGUF_VTYPE_INT32 && v->v.i64 == INT32_MIN);
    v = gguf_find(f, "u64");
    CHECK(v && v->type == GGUF_VTYPE_UINT64 && v->v.u64 == UINT64_MAX);
    v = gguf_find(f, "i64");
    CHECK(v && v->type == GGUF_VTYPE_INT64 && v->v.i64 == INT64_MIN);
    v = gguf_find(f, "f32");
    CHECK(v && v->type == GGUF_VTYPE_FLOAT32 && v->v.f64 == (double)-1.5e-3f);
    v = gguf_find(f, "f64");
    CHECK(v && v->type == GGUF_VTYPE_FLOAT64 && v->v.f64 == 3.141592653589793);
    v = gguf_find(f, "bool.t");
    CHECK(v && v->type == GGUF_VTYPE_BOOL && v->v.b);
    v = gguf_find(f, "bool.f");
    CHECK(v && v->type == GGUF_VTYPE_BOOL && !v->v.b);
    v = gguf_find(f, "str");
    CHECK(v && v->type == GGUF_VTYPE_STRING && gguf_str_eq(v->v.str, "héllo wörld"));
    v = gguf_find(f, "str.nul");
    CHECK(v && v->v.str.len == 3 && memcmp(v->v.str.ptr, "a\0b", 3) == 0);
    v = gguf_find(f, "str.empty");
    CHECK(v && v->v.str.len == 0 && gguf_str_eq(v->v.str, ""));
}

static void rt_check_arrays(const struct gguf_file *f)
{
    const struct gguf_value *a;
    CHECK(gguf_get_arr(f, "a.u8", GGUF_VTYPE_UINT8, &a, NULL) == KVB_OK);
    CHECK(a->v.arr.n == 3 && gguf_arr_i64(a, 2) == 255 && a->v.arr.items == NULL);
    CHECK(gguf_get_arr(f, "a.i8", GGUF_VTYPE_INT8, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 0) == -128 && gguf_arr_i64(a, 2) == 127);
    CHECK(gguf_get_arr(f, "a.u16", GGUF_VTYPE_UINT16, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 1) == 65535);
    CHECK(gguf_get_arr(f, "a.i16", GGUF_VTYPE_INT16, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 0) == -32768 && gguf_arr_i64(a, 1) == 32767 && gguf_arr_i64(a, 2) == -1);
    CHECK(gguf_get_arr(f, "a.u32", GGUF_VTYPE_UINT32, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 1) == 4294967295ll);
    CHECK(gguf_get_arr(f, "a.i32", GGUF_VTYPE_INT32, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 0) == INT32_MIN && gguf_arr_i64(a, 1) == -1 && gguf_arr_i64(a, 2) == INT32_MAX);
    CHECK(gguf_get_arr(f, "a.f32", GGUF_VTYPE_FLOAT32, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_f64(a, 0) == 0.5 && gguf_arr_f64(a, 1) == -2.25 && gguf_arr_f64(a, 2) == (double)1e30f);
    CHECK(gguf_get_arr(f, "a.bool", GGUF_VTYPE_BOOL, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 0) == 1 && gguf_arr_i64(a, 1) == 0 && gguf_arr_i64(a, 2) == 1);
    CHECK(gguf_get_arr(f, "a.u64", GGUF_VTYPE_UINT64, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 1) == 7 && ((const uint8_t *)a->v.arr.raw)[0] == 0xff);
    CHECK(gguf_get_arr(f, "a.i64", GGUF_VTYPE_INT64, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_i64(a, 0) == INT64_MIN && gguf_arr_i64(a, 1) == INT64_MAX);
    CHECK(gguf_get_arr(f, "a.f64", GGUF_VTYPE_FLOAT64, &a, NULL) == KVB_OK);
    CHECK(gguf_arr_f64(a, 0) == 0.0 && signbit(gguf_arr_f64(a, 0)) && gguf_arr_f64(a, 1) == 1e300);
    CHECK(gguf_get_arr(f, "a.empty", GGUF_VTYPE_UINT32, &a, NULL) == KVB_OK);
    CHECK(a->v.arr.n == 0);
    CHECK(gguf_get_arr(f, "a.str", GGUF_VTYPE_STRING, &a, NULL) == KVB_OK);
    CHECK(a->v.arr.n == 3 && a->v.arr.items && a->v.arr.raw == NULL);
    if (a->v.arr.items) {
        CHECK(a->v.arr.items[0].type == GGUF_VTYPE_STRING && gguf_str_eq(a->v.arr.items[0].v.str, "x"));
        CHECK(gguf_str_eq(a->v.arr.items[1].v.str, ""));
        CHECK(gguf_str_eq(a->v.arr.items[2].v.str, "longer string"));
    }
    CHECK(gguf_get_arr(f, "a.str.empty", GGUF_VTYPE_STRING, &a, NULL) == KVB_OK);
    CHECK(a->v.arr.n == 0);
}

static void rt_check_nested(const struct gguf_file *f)
{
    const struct gguf_value *a;
    CHECK(gguf_get_arr(f, "nest.i32", GGUF_VTYPE_ARRAY, &a, NULL) == KVB_OK);
    CHECK(a->v.arr.n == 3 && a->v.arr.items);
    if (a->v.arr.items) {
        const struct gguf_value *it = a->v.arr.items;
        CHECK(it[0].type == GGUF_VTYPE_ARRAY && it[0].v.arr.elem_type == GGUF_VTYPE_INT32);
        CHECK(it[0].v.arr.n == 2 && gguf_arr_i64(&it[0], 0) == 1 && gguf_arr_i64(&it[0], 1) == 2);
        CHECK(it[1].v.arr.n == 0);
        CHECK(it[2].v.arr.n == 1 && gguf_arr_i64(&it[2], 0) == 3);
    }
    CHECK(gguf_get_arr(f, "nest.str", GGUF_VTYPE_ARRAY, &a, NULL) == KVB_OK);
    if (a->v.arr.n == 1 && a->v.arr.items) {
        const struct gguf_value *x1 = &a->v.arr.items[0];
        CHECK(x1->v.arr.elem_type == GGUF_VTYPE_ARRAY && x1->v.arr.n == 1);
        const struct gguf_value *x2 = &x1->v.arr.items[0];
        CHECK(x2->v.arr.elem_type == GGUF_VTYPE_STRING && x2->v.arr.n == 2);
        CHECK(gguf_str_eq(x2->v.arr.items[0].v.str, "p") && gguf_str_eq(x2->v.arr.items[1].v.str, "qq"));
    } else {
        CHECK(!"nest.str shape");
    }
}

/* Shapes, types, sizes, alignment (of offsets and of the data in buf) and bytes. */
static void rt_check_tensors(const struct gguf_file *f, const uint8_t *buf, uint8_t *const src[])
{
    const int nt = RT_N_TENSORS;
    CHECK_EQ_INT(gguf_n_tensors(f), nt);
    uint64_t prev_end = 0;
    for (int i = 0; i < nt; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, (uint64_t)i);
        CHECK(t && t == gguf_find_tensor(f, rt_tensors[i].name));
        if (!t) continue;
        CHECK(gguf_str_eq(t->name, rt_tensors[i].name));
        CHECK_EQ_INT(t->n_dims, rt_tensors[i].n_dims);
        for (int d = 0; d < 4; d++) CHECK_EQ_INT(t->ne[d], rt_tensors[i].ne[d]);
        CHECK_EQ_INT(t->type, rt_tensors[i].type);
        uint64_t nb = 0;
        ggml_type_row_bytes(rt_tensors[i].type,
                            rt_tensors[i].ne[0] * rt_tensors[i].ne[1] * rt_tensors[i].ne[2] * rt_tensors[i].ne[3], &nb);
        CHECK_EQ_INT(t->n_bytes, nb);
        CHECK_EQ_INT(t->offset % 64, 0);
        CHECK(t->offset >= prev_end);
        prev_end = t->offset + t->n_bytes;
        CHECK_EQ_INT(((const uint8_t *)t->data - buf) % 64, 0);
        CHECK(nb == 0 || memcmp(t->data, src[i], nb) == 0);
    }
    CHECK(gguf_tensor_at(f, (uint64_t)nt) == NULL);
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(gguf_find_tensor(f, "t.f3") == NULL);
}

static void test_roundtrip(void)
{
    struct gguf_writer *w = new_writer();
    CHECK(gguf_writer_set_alignment(w, 64) == KVB_OK);
    rt_add_scalars(w);
    rt_add_arrays(w);
    rt_add_nested(w);
    const int nt = RT_N_TENSORS;
    uint8_t *src[8] = {0};
    rt_add_tensors(w, src);
    uint64_t n;
    uint8_t *buf = build(w, &n);

    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    CHECK_MSG(gguf_open_memory(buf, n, &f, &e) == KVB_OK, "%s", e.msg);
    if (!f) return;
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_n_kv(f), 32);
    CHECK(gguf_str_eq(gguf_kv_at(f, 0)->key, "general.alignment"));
    CHECK(gguf_str_eq(gguf_kv_at(f, 1)->key, "u8"));
    CHECK(gguf_kv_at(f, 32) == NULL);
    rt_check_scalars(f);
    rt_check_arrays(f);
    rt_check_nested(f);
    rt_check_tensors(f, buf, src);
    gguf_close(f);
    free(buf);
    for (int i = 0; i < nt; i++) free(src[i]);
}

/* Read a file, copy every kv (add_value) and tensor into a new writer, and
 * expect the very same bytes: the writer can express all the reader sees. */
static void test_copy_identical(void)
{
    uint64_t n, n2;
    uint8_t *buf = small_valid(&n);
    struct gguf_file *f = NULL;
    CHECK(gguf_open_memory(buf, n, &f, NULL) == KVB_OK);
    if (!f) return;
    struct gguf_writer *w = new_writer();
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        CHECK(gguf_writer_add_value(w, key, &kv->val) == KVB_OK);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        CHECK(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, NULL) == KVB_OK);
    }
    uint8_t *buf2 = build(w, &n2);
    CHECK(n == n2 && memcmp(buf, buf2, n) == 0);
    gguf_close(f);
    free(buf);
    kvb_free(buf2);
}

static void test_version2_and_files(void)
{
    struct gguf_writer *w = new_writer();
    gguf_writer_set_version(w, 2);
    gguf_writer_add_str(w, "general.name", "v2");
    uint64_t ne[] = {4};
    float data[4] = {1, 2, 3, 4};
    gguf_writer_add_tensor(w, "w", GGML_TYPE_F32, 1, ne, data, NULL);

    char path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvb_test_gguf_%d.gguf", tmp ? tmp : "/tmp", (int)getpid());
    struct kvb_err e = {{0}};
    CHECK_MSG(gguf_writer_write_file(w, path, &e) == KVB_OK, "%s", e.msg);
    gguf_writer_free(w);
    struct gguf_file *f = NULL;
    CHECK_MSG(gguf_open(path, &f, &e) == KVB_OK, "%s", e.msg);
    if (f) {
        CHECK_EQ_INT(gguf_version(f), 2);
        struct gguf_str s;
        CHECK(gguf_get_str(f, "general.name", &s, NULL) == KVB_OK && gguf_str_eq(s, "v2"));
        const struct gguf_tensor *t = gguf_find_tensor(f, "w");
        CHECK(t && t->n_bytes == 16 && memcmp(t->data, data, 16) == 0);
        gguf_close(f);
    }
    /* A damaged file on disk: the message names the path. */
    FILE *fp = fopen(path, "r+b");
    if (fp) {
        fputs("GGUX", fp);
        fclose(fp);
    }
    CHECK(gguf_open(path, &f, &e) == KVB_ERR_FORMAT && f == NULL);
    CHECK_MSG(strstr(e.msg, path) && strstr(e.msg, "bad magic"), "%s", e.msg);
    /* Empty file. */
    fp = fopen(path, "wb");
    if (fp) fclose(fp);
    CHECK(gguf_open(path, &f, &e) == KVB_ERR_FORMAT);
    CHECK_MSG(strstr(e.msg, "empty"), "%s", e.msg);
    unlink(path);
    CHECK(gguf_open(path, &f, &e) == KVB_ERR_IO);
    CHECK_MSG(strstr(e.msg, "cannot open '") && strstr(e.msg, "No such file or directory"), "%s", e.msg);
    CHECK(gguf_open(tmp ? tmp : "/tmp", &f, &e) == KVB_ERR_IO);
    CHECK_MSG(strstr(e.msg, "Is a directory"), "%s", e.msg);
    /* Writing into a missing directory fails with the path. */
    w = new_writer();
    CHECK(gguf_writer_write_file(w, "/nonexistent-dir/x.gguf", &e) == KVB_ERR_IO);
    CHECK_MSG(strstr(e.msg, "/nonexistent-dir/x.gguf"), "%s", e.msg);
    gguf_writer_free(w);
}

/* ---- damaged files ------------------------------------------------------------- */

static void test_truncation(void)
{
    uint64_t n;
    uint8_t *buf = small_valid(&n);
    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    for (uint64_t len = 0; len < n; len++) {
        e.msg[0] = '\0';
        enum kvb_status st = open_copy(buf, len, &f, &e);
        CHECK_MSG(st == KVB_ERR_FORMAT, "prefix %llu of %llu: %s", (unsigned long long)len, (unsigned long long)n,
                  kvb_strerror(st));
        CHECK_MSG(e.msg[0] != '\0', "prefix %llu: empty message", (unsigned long long)len);
    }
    CHECK(open_copy(buf, n, &f, &e) == KVB_OK);
    /* One prefix in the data, checked for the exact wording. */
    expect_fail("data truncated", buf, n - 1, KVB_ERR_FORMAT, "gguf: tensor 'c' data [offset ");
    free(buf);
}

/* A file whose first kv has key "k": key length at 24, key byte at 32, value
 * type at 33, value at 37. */
static uint8_t *one_kv_file(struct gguf_value *v, uint64_t *n)
{
    struct gguf_writer *w = new_writer();
    gguf_writer_add_value(w, "k", v);
    gguf_writer_add_str(w, "after", "x");
    return build(w, n);
}

static void test_malformed_header_and_kvs(void)
{
    uint64_t n;
    uint8_t *buf = small_valid(&n);
    uint8_t *c = malloc(n);

    memcpy(c, buf, n), c[0] = 'X';
    expect_fail("bad magic", c, n, KVB_ERR_FORMAT, "bad magic");
    memcpy(c, buf, n), put_u32(c + 4, 1);
    expect_fail("version 1", c, n, KVB_ERR_UNSUPPORTED, "version 1");
    memcpy(c, buf, n), put_u32(c + 4, 99);
    expect_fail("version 99", c, n, KVB_ERR_UNSUPPORTED, "unsupported version 99");
    memcpy(c, buf, n), put_u32(c + 4, 0x03000000u);
    expect_fail("big-endian", c, n, KVB_ERR_UNSUPPORTED, "big-endian");
    memcpy(c, buf, n), put_u64(c + 8, 1ull << 40);
    expect_fail("absurd tensor_count", c, n, KVB_ERR_FORMAT, "absurd tensor_count");
    memcpy(c, buf, n), put_u64(c + 8, UINT64_MAX);
    expect_fail("max tensor_count", c, n, KVB_ERR_FORMAT, "absurd tensor_count");
    memcpy(c, buf, n), put_u64(c + 16, 1ull << 40);
    expect_fail("absurd kv_count", c, n, KVB_ERR_FORMAT, "absurd kv_count");
    memcpy(c, buf, n), put_u64(c + 16, UINT64_MAX);
    expect_fail("max kv_count", c, n, KVB_ERR_FORMAT, "absurd kv_count");
    /* kv_count larger than the kvs present: the tensor infos are read as
     * kvs and fail somewhere, cleanly. */
    memcpy(c, buf, n), put_u64(c + 16, 9);
    expect_fail("kv_count too large", c, n, KVB_ERR_FORMAT, "gguf: kv ");
    memcpy(c, buf, n), put_u64(c + 24, 1000000);
    expect_fail("key length past end", c, n, KVB_ERR_FORMAT, "key length 1000000 at offset 24 runs past end");
    memcpy(c, buf, n), put_u64(c + 24, UINT64_MAX);
    expect_fail("key length max", c, n, KVB_ERR_FORMAT, "runs past end");
    memcpy(c, buf, n), put_u64(c + 24, 0);
    expect_fail("empty key", c, n, KVB_ERR_FORMAT, "key length 0 at offset 24 is invalid");
    free(c);
    free(buf);

    /* Value-level damage on a file whose first kv is "k". */
    struct gguf_value sv = {.type = GGUF_VTYPE_STRING, .v.str = {5, "hello"}};
    buf = one_kv_file(&sv, &n);
    c = malloc(n);
    memcpy(c, buf, n), put_u64(c + 37, 1ull << 50);
    expect_fail("string length past end", c, n, KVB_ERR_FORMAT, "string length 1125899906842624 at offset 37");
    memcpy(c, buf, n), put_u32(c + 33, 13);
    expect_fail("bad value type", c, n, KVB_ERR_FORMAT, "bad value type 13 at offset 33");
    memcpy(c, buf, n), put_u32(c + 33, 0xffffffffu);
    expect_fail("bad value type max", c, n, KVB_ERR_FORMAT, "bad value type 4294967295");
    memcpy(c, buf, n), c[32] = '\0';
    expect_fail("NUL in key", c, n, KVB_ERR_FORMAT, "NUL");
    free(c);
    free(buf);

    uint32_t elems[4] = {1, 2, 3, 4};
    struct gguf_value av = {.type = GGUF_VTYPE_ARRAY};
    av.v.arr.elem_type = GGUF_VTYPE_UINT32, av.v.arr.n = 4, av.v.arr.raw = elems;
    buf = one_kv_file(&av, &n);
    c = malloc(n);
    memcpy(c, buf, n), put_u64(c + 41, 1ull << 60);
    expect_fail("array count huge", c, n, KVB_ERR_FORMAT, "array count 1152921504606846976 of UINT32 at offset 41");
    memcpy(c, buf, n), put_u64(c + 41, UINT64_MAX);
    expect_fail("array count max", c, n, KVB_ERR_FORMAT, "array count");
    memcpy(c, buf, n), put_u32(c + 37, 99);
    expect_fail("bad elem type", c, n, KVB_ERR_FORMAT, "bad array element type 99 at offset 37");
    memcpy(c, buf, n), put_u32(c + 37, GGUF_VTYPE_STRING);
    expect_fail("array of strings huge", c, n, KVB_ERR_FORMAT, "runs past end");
    memcpy(c, buf, n), put_u32(c + 37, GGUF_VTYPE_ARRAY);
    expect_fail("array of arrays", c, n, KVB_ERR_FORMAT, "gguf: kv 0 'k'");
    free(c);
    free(buf);

    struct gguf_value bv = {.type = GGUF_VTYPE_BOOL, .v.b = true};
    buf = one_kv_file(&bv, &n);
    buf[37] = 2;
    expect_fail("bool 2", buf, n, KVB_ERR_FORMAT, "bool value 2 at offset 37 is not 0 or 1");
    free(buf);
    bool bools[2] = {false, true};
    av.v.arr.elem_type = GGUF_VTYPE_BOOL, av.v.arr.n = 2, av.v.arr.raw = bools;
    buf = one_kv_file(&av, &n);
    buf[50] = 7;
    expect_fail("bool array 7", buf, n, KVB_ERR_FORMAT, "bool array element 1 at offset 50");
    free(buf);

    /* Nesting: 8 levels of arrays are fine, 9 are not. */
    for (int depth = 8; depth <= 9; depth++) {
        struct gguf_value lv[9];
        uint8_t leaf[1] = {42};
        for (int i = depth - 1; i >= 0; i--) {
            lv[i] = (struct gguf_value){.type = GGUF_VTYPE_ARRAY};
            lv[i].v.arr.n = 1;
            if (i == depth - 1) lv[i].v.arr.elem_type = GGUF_VTYPE_UINT8, lv[i].v.arr.raw = leaf;
            else lv[i].v.arr.elem_type = GGUF_VTYPE_ARRAY, lv[i].v.arr.items = &lv[i + 1];
        }
        buf = one_kv_file(&lv[0], &n);
        if (depth == 8) {
            struct gguf_file *f = NULL;
            CHECK(gguf_open_memory(buf, n, &f, NULL) == KVB_OK);
            const struct gguf_value *x = f ? gguf_find(f, "k") : NULL;
            for (int i = 0; x && i < 7; i++) x = &x->v.arr.items[0];
            CHECK(x && x->v.arr.elem_type == GGUF_VTYPE_UINT8 && gguf_arr_i64(x, 0) == 42);
            gguf_close(f);
        } else {
            expect_fail("nested 9", buf, n, KVB_ERR_FORMAT, "nested deeper than 8");
        }
        free(buf);
    }

    /* Duplicates. */
    struct gguf_writer *w = new_writer();
    gguf_writer_add_u32(w, "a", 1);
    gguf_writer_add_str(w, "b", "x");
    gguf_writer_add_u8(w, "a", 2);
    buf = build(w, &n);
    expect_fail("duplicate key", buf, n, KVB_ERR_FORMAT, "kv 2 'a': duplicate key at offset ");
    free(buf);
}

static void test_malformed_alignment(void)
{
    struct {
        const char *label;
        struct gguf_value v;
        enum kvb_status want;
        const char *phrase;
    } cases[] = {
        {"alignment 48",
         {.type = GGUF_VTYPE_UINT32, .v.u64 = 48},
         KVB_ERR_FORMAT,
         "general.alignment = 48 is not a power of two"},
        {"alignment 0", {.type = GGUF_VTYPE_UINT32, .v.u64 = 0}, KVB_ERR_FORMAT, "not a power of two"},
        {"alignment -16", {.type = GGUF_VTYPE_INT32, .v.i64 = -16}, KVB_ERR_FORMAT, "-16 is not a power of two"},
        {"alignment 2^40",
         {.type = GGUF_VTYPE_UINT64, .v.u64 = 1ull << 40},
         KVB_ERR_FORMAT,
         "1099511627776 is too large"},
        {"alignment string",
         {.type = GGUF_VTYPE_STRING, .v.str = {2, "32"}},
         KVB_ERR_FORMAT,
         "general.alignment has type STRING"},
        {"alignment f32", {.type = GGUF_VTYPE_FLOAT32, .v.f64 = 32}, KVB_ERR_FORMAT, "expected an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gguf_writer *w = new_writer();
        gguf_writer_add_value(w, "general.alignment", &cases[i].v);
        uint64_t n;
        uint8_t *buf = build(w, &n);
        expect_fail(cases[i].label, buf, n, cases[i].want, cases[i].phrase);
        free(buf);
    }
    /* Any integer type with a power of two is accepted; data is aligned to it. */
    struct gguf_writer *w = new_writer();
    gguf_writer_add_i8(w, "general.alignment", 8);
    uint64_t ne[] = {2};
    gguf_writer_add_tensor_info_raw(w, "t", GGML_TYPE_F32, 1, ne, 0);
    uint64_t n;
    uint8_t *buf = build(w, &n);
    /* The writer padded to 32, which is also 8-aligned; append the tensor's
     * 8 bytes. */
    uint8_t *c = calloc(1, n + 8);
    memcpy(c, buf, n);
    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    CHECK_MSG(gguf_open_memory(c, n + 8, &f, &e) == KVB_OK, "%s", e.msg);
    if (f) {
        const struct gguf_tensor *t = gguf_find_tensor(f, "t");
        CHECK(t && (const uint8_t *)t->data - c <= (ptrdiff_t)n && ((const uint8_t *)t->data - c) % 8 == 0);
        gguf_close(f);
    }
    free(c);
    free(buf);
}

static void test_malformed_tensors(void)
{
    uint64_t ne2[] = {32, 4}, ne5[] = {1, 1, 1, 1, 1}, big[] = {1ull << 32, 1ull << 32};
    uint64_t neg[] = {1ull << 63}, q33[] = {33}, f1024[] = {1024}, zero_big[] = {0, 1ull << 62, 1ull << 62};
    struct {
        const char *label;
        uint32_t type, n_dims;
        const uint64_t *ne;
        uint64_t offset;
        const char *phrase;
    } cases[] = {
        {"bad tensor type", 77, 2, ne2, 0, "tensor 1 'bad': unknown ggml type code 77"},
        {"type 4 (removed)", 4, 2, ne2, 0, "unknown ggml type code 4"},
        {"n_dims 0", GGML_TYPE_F32, 0, ne2, 0, "tensor 1 'bad': n_dims 0 at offset"},
        {"n_dims 5", GGML_TYPE_F32, 5, ne5, 0, "n_dims 5 at offset"},
        {"ne overflow", GGML_TYPE_F32, 2, big, 0, "overflows"},
        {"ne negative", GGML_TYPE_F32, 1, neg, 0, "negative as int64"},
        {"ne[0] not block multiple", GGML_TYPE_Q4_0, 1, q33, 0,
         "ne[0] = 33 is not a multiple of the Q4_0 block size 32"},
        {"offset past end", GGML_TYPE_F32, 2, ne2, 1ull << 20, "tensor 'bad' data [offset 1048576"},
        {"offset max", GGML_TYPE_F32, 2, ne2, UINT64_MAX - 31, "past end of file"},
        {"data past end", GGML_TYPE_F32, 1, f1024, 0, "tensor 'bad' data [offset "},
        {"misaligned offset", GGML_TYPE_F32, 2, ne2, 4,
         "tensor 'bad': data offset 4 is not a multiple of the alignment 32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gguf_writer *w = new_writer();
        gguf_writer_add_str(w, "general.architecture", "llama");
        uint64_t ne1[] = {8};
        gguf_writer_add_tensor(w, "good", GGML_TYPE_F32, 1, ne1, NULL, NULL);
        gguf_writer_add_tensor_info_raw(w, "bad", cases[i].type, cases[i].n_dims, cases[i].ne, cases[i].offset);
        uint64_t n;
        uint8_t *buf = build(w, &n);
        expect_fail(cases[i].label, buf, n, KVB_ERR_FORMAT, cases[i].phrase);
        free(buf);
    }
    /* A zero extent makes the product 0 however large the rest: valid. */
    struct gguf_writer *w = new_writer();
    gguf_writer_add_tensor_info_raw(w, "empty", GGML_TYPE_F32, 3, zero_big, 0);
    uint64_t n;
    uint8_t *buf = build(w, &n);
    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    CHECK_MSG(gguf_open_memory(buf, n, &f, &e) == KVB_OK, "%s", e.msg);
    if (f) CHECK(gguf_tensor_at(f, 0)->n_bytes == 0);
    gguf_close(f);
    free(buf);

    w = new_writer();
    uint64_t ne1[] = {8};
    gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, ne1, NULL, NULL);
    gguf_writer_add_tensor(w, "y", GGML_TYPE_F32, 1, ne1, NULL, NULL);
    gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, ne1, NULL, NULL);
    buf = build(w, &n);
    expect_fail("duplicate tensor", buf, n, KVB_ERR_FORMAT, "tensor 2 'x': duplicate tensor name at offset");
    free(buf);

    /* An empty tensor name and a non-printable one (the message escapes it). */
    w = new_writer();
    gguf_writer_add_tensor(w, "", GGML_TYPE_F32, 1, ne1, NULL, NULL);
    buf = build(w, &n);
    expect_fail("empty tensor name", buf, n, KVB_ERR_FORMAT, "tensor 0: name length 0");
    free(buf);
    w = new_writer();
    gguf_writer_add_tensor_info_raw(w, "\x01\x7f", 77, 1, ne1, 0);
    buf = build(w, &n);
    expect_fail("escaped name", buf, n, KVB_ERR_FORMAT,
                "tensor 0 '?"
                "?': unknown ggml type code 77");
    free(buf);

    /* No tensors: a file may end before the data-section padding. */
    w = new_writer();
    gguf_writer_add_str(w, "general.name", "abc");
    buf = build(w, &n);
    uint64_t unpadded = 24 + 8 + 12 + 4 + 8 + 3;
    CHECK(n >= unpadded);
    CHECK(open_copy(buf, unpadded, &f, &e) == KVB_OK);
    free(buf);
}

/* ---- getters ------------------------------------------------------------------- */

static void test_getters(void)
{
    struct gguf_writer *w = new_writer();
    gguf_writer_add_u8(w, "u8", 200);
    gguf_writer_add_i8(w, "i8", -3);
    gguf_writer_add_i32(w, "i32", 77);
    gguf_writer_add_u64(w, "u64.big", 1ull << 40);
    gguf_writer_add_u64(w, "u64.max", UINT64_MAX);
    gguf_writer_add_f32(w, "f32", 1.5f);
    gguf_writer_add_f64(w, "f64", 0.25);
    gguf_writer_add_bool(w, "bool", true);
    gguf_writer_add_str(w, "str", "abc");
    int32_t ai[] = {5, -6};
    gguf_writer_add_arr(w, "arr", GGUF_VTYPE_INT32, ai, 2);
    uint64_t n;
    uint8_t *buf = build(w, &n);
    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    CHECK(gguf_open_memory(buf, n, &f, &e) == KVB_OK);
    if (!f) return;

    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    bool b = false;
    struct gguf_str s;
    const struct gguf_value *a;

    CHECK(gguf_get_u32(f, "u8", &u32, &e) == KVB_OK && u32 == 200);
    CHECK(gguf_get_u32(f, "i32", &u32, &e) == KVB_OK && u32 == 77);
    CHECK(gguf_get_u64(f, "u64.max", &u64, &e) == KVB_OK && u64 == UINT64_MAX);
    CHECK(gguf_get_i64(f, "i8", &i64, &e) == KVB_OK && i64 == -3);
    CHECK(gguf_get_i64(f, "u64.big", &i64, &e) == KVB_OK && i64 == (1ll << 40));
    CHECK(gguf_get_u32(f, "i8", &u32, &e) == KVB_ERR_FORMAT && strstr(e.msg, "'i8'") && strstr(e.msg, "negative"));
    CHECK(gguf_get_u64(f, "i8", &u64, &e) == KVB_ERR_FORMAT);
    CHECK(gguf_get_u32(f, "u64.big", &u32, &e) == KVB_ERR_FORMAT && strstr(e.msg, "does not fit a uint32"));
    CHECK(gguf_get_i64(f, "u64.max", &i64, &e) == KVB_ERR_FORMAT && strstr(e.msg, "does not fit an int64"));
    CHECK(gguf_get_u32(f, "str", &u32, &e) == KVB_ERR_FORMAT);
    CHECK_MSG(strstr(e.msg, "key 'str' has type STRING, expected an unsigned integer"), "%s", e.msg);
    CHECK(gguf_get_u32(f, "f32", &u32, &e) == KVB_ERR_FORMAT);
    CHECK(gguf_get_u32(f, "bool", &u32, &e) == KVB_ERR_FORMAT);
    CHECK(gguf_get_f32(f, "f32", &f32, &e) == KVB_OK && f32 == 1.5f);
    CHECK(gguf_get_f32(f, "f64", &f32, &e) == KVB_OK && f32 == 0.25f);
    CHECK(gguf_get_f32(f, "i8", &f32, &e) == KVB_OK && f32 == -3.0f);
    CHECK(gguf_get_f32(f, "str", &f32, &e) == KVB_ERR_FORMAT);
    CHECK(gguf_get_bool(f, "bool", &b, &e) == KVB_OK && b);
    CHECK(gguf_get_bool(f, "u8", &b, &e) == KVB_ERR_FORMAT && strstr(e.msg, "has type UINT8, expected BOOL"));
    CHECK(gguf_get_str(f, "str", &s, &e) == KVB_OK && gguf_str_eq(s, "abc"));
    CHECK(gguf_get_str(f, "u8", &s, &e) == KVB_ERR_FORMAT);
    CHECK(gguf_get_arr(f, "arr", GGUF_VTYPE_INT32, &a, &e) == KVB_OK && a->v.arr.n == 2);
    CHECK(gguf_arr_i64(a, 1) == -6 && gguf_arr_f64(a, 0) == 5.0);
    CHECK(gguf_arr_i64(a, 2) == 0); /* out of contract: 0, not a crash */
    CHECK(gguf_get_arr(f, "arr", GGUF_VTYPE_FLOAT32, &a, &e) == KVB_ERR_FORMAT);
    CHECK_MSG(strstr(e.msg, "'arr' is an ARRAY of INT32, expected an ARRAY of FLOAT32"), "%s", e.msg);
    CHECK(gguf_get_arr(f, "str", GGUF_VTYPE_STRING, &a, &e) == KVB_ERR_FORMAT);
    CHECK(gguf_get_u32(f, "missing", &u32, &e) == KVB_ERR_NOT_FOUND && strstr(e.msg, "'missing' not found"));
    CHECK(gguf_get_str(f, "missing", &s, NULL) == KVB_ERR_NOT_FOUND);
    CHECK(gguf_get_arr(f, "missing", GGUF_VTYPE_INT32, &a, NULL) == KVB_ERR_NOT_FOUND);
    CHECK(gguf_find(f, "missing") == NULL && gguf_find(f, "u") == NULL && gguf_find(f, "u88") == NULL);
    gguf_close(f);
    free(buf);

    CHECK(gguf_vtype_size(GGUF_VTYPE_UINT16) == 2 && gguf_vtype_size(GGUF_VTYPE_FLOAT64) == 8);
    CHECK(gguf_vtype_size(GGUF_VTYPE_STRING) == 0 && gguf_vtype_size(GGUF_VTYPE_ARRAY) == 0);
    CHECK(strcmp(gguf_vtype_name(GGUF_VTYPE_BOOL), "BOOL") == 0);
    CHECK(strcmp(gguf_vtype_name((enum gguf_vtype)99), "INVALID") == 0);
    struct gguf_str z = {0, NULL};
    CHECK(gguf_str_eq(z, "") && !gguf_str_eq(z, "a"));
}

/* ---- writer refusals and allocation failures ----------------------------------- */

static void test_writer_refusals(void)
{
    struct gguf_writer *w = new_writer();
    uint64_t q33[] = {33}, ok[] = {32};
    CHECK(gguf_writer_add_tensor(w, "q", GGML_TYPE_Q4_0, 1, q33, NULL, NULL) == KVB_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "q", GGML_TYPE_Q4_0, 1, ok, NULL, NULL) == KVB_OK); /* later adds still work */
    CHECK(gguf_writer_set_alignment(w, 3) == KVB_ERR_INVALID_ARG);
    struct gguf_value big = {.type = GGUF_VTYPE_UINT8, .v.u64 = 300};
    CHECK(gguf_writer_add_value(w, "x", &big) == KVB_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_arr(w, "x", GGUF_VTYPE_STRING, NULL, 0) == KVB_ERR_INVALID_ARG);
    void *p = NULL;
    uint64_t n = 0;
    struct kvb_err e = {{0}};
    CHECK(gguf_writer_write_memory(w, &p, &n, &e) == KVB_ERR_INVALID_ARG && p == NULL);
    CHECK_MSG(strstr(e.msg, "tensor 'q'") && strstr(e.msg, "block size 32"), "first error kept: %s", e.msg);
    gguf_writer_free(w);

    w = new_writer();
    CHECK(gguf_writer_set_alignment(w, 16) == KVB_OK);
    CHECK(gguf_writer_set_alignment(w, 16) == KVB_ERR_INVALID_ARG);
    gguf_writer_free(w);
    gguf_writer_free(NULL);
    gguf_close(NULL);
}

static void test_alloc_failures(void)
{
    uint64_t n;
    uint8_t *buf = small_valid(&n);
    int saw_ok = 0;
    for (long k = 0; k < 64 && !saw_ok; k++) {
        struct gguf_file *f = NULL;
        struct kvb_err e = {{0}};
        kvb_alloc_fail_after(k);
        enum kvb_status st = gguf_open_memory(buf, n, &f, &e);
        kvb_alloc_fail_after(-1);
        CHECK_MSG(st == KVB_OK || st == KVB_ERR_NOMEM, "fail after %ld: %s", k, kvb_strerror(st));
        CHECK((st == KVB_OK) == (f != NULL));
        if (st == KVB_OK) saw_ok = 1;
        gguf_close(f);
    }
    CHECK(saw_ok);
    saw_ok = 0;
    for (long k = 0; k < 200 && !saw_ok; k++) {
        struct gguf_writer *w = NULL;
        kvb_alloc_fail_after(k);
        enum kvb_status st = gguf_writer_create(&w, NULL);
        if (st == KVB_OK) {
            const char *strs[] = {"a", "b"};
            uint32_t u[] = {1, 2, 3};
            uint64_t ne[] = {64, 2};
            gguf_writer_add_str(w, "s", "v");
            gguf_writer_add_arr_str(w, "as", strs, 2);
            gguf_writer_add_arr(w, "au", GGUF_VTYPE_UINT32, u, 3);
            gguf_writer_set_alignment(w, 64);
            gguf_writer_add_tensor(w, "t", GGML_TYPE_Q8_0, 2, ne, NULL, NULL);
            void *p = NULL;
            uint64_t m = 0;
            st = gguf_writer_write_memory(w, &p, &m, NULL);
            kvb_alloc_fail_after(-1);
            CHECK(st == KVB_OK || st == KVB_ERR_NOMEM);
            if (st == KVB_OK) {
                struct gguf_file *f = NULL;
                CHECK(gguf_open_memory(p, m, &f, NULL) == KVB_OK);
                CHECK(f && gguf_n_kv(f) == 4 && gguf_n_tensors(f) == 1);
                gguf_close(f);
                saw_ok = 1;
            }
            kvb_free(p);
        }
        kvb_alloc_fail_after(-1);
        gguf_writer_free(w);
    }
    CHECK(saw_ok);
    free(buf);
}

/* ---- the real model -------------------------------------------------------------- */

/* Resident memory of this process in bytes (/proc/self/statm), -1 if unknown. */
static long long resident_bytes(void)
{
    FILE *fp = fopen("/proc/self/statm", "r");
    long long size = 0, res = -1;
    if (fp) {
        if (fscanf(fp, "%lld %lld", &size, &res) != 2) res = -1;
        fclose(fp);
    }
    return res < 0 ? -1 : res * sysconf(_SC_PAGESIZE);
}

static uint64_t checksum(const uint8_t *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* gguf_release_pages: a tensor read in full, then released, leaves
 * resident memory (most of its bytes: whole pages only) and reads the same
 * afterwards; bytes outside the mapping are refused quietly. */
static void check_release_pages(struct gguf_file *f, const struct gguf_tensor *t)
{
    const uint64_t h0 = checksum(t->data, t->n_bytes);
    const long long before = resident_bytes();
    gguf_release_pages(f, t->data, (size_t)t->n_bytes);
    const long long after = resident_bytes();
    const uint64_t h1 = checksum(t->data, t->n_bytes);
    const long long after_read = resident_bytes();
    printf("release pages: %s (%.1f MB): resident %.1f -> %.1f MB, %.1f MB once read again\n", "token_embd.weight",
           (double)t->n_bytes / 1e6, (double)before / 1e6, (double)after / 1e6, (double)after_read / 1e6);
    CHECK_MSG(h0 == h1, "the tensor reads differently after its pages were released");
    if (before > 0 && after > 0)
        CHECK_MSG(before - after >= (long long)(t->n_bytes * 9 / 10), "released %.1f MB of %.1f MB",
                  (double)(before - after) / 1e6, (double)t->n_bytes / 1e6);
    uint8_t outside[64] = {0};
    gguf_release_pages(f, outside, sizeof outside); /* not the mapping: nothing happens */
    gguf_release_pages(NULL, t->data, 1);
    CHECK(outside[0] == 0);
}

static void test_real_model(void)
{
    const char *path = tu_env("KVB_MODEL");
    struct stat sb;
    if (!path || stat(path, &sb) != 0) {
        fprintf(stderr, "note: KVB_MODEL not set or missing; real-model checks skipped\n");
        return;
    }
    struct gguf_file *f = NULL;
    struct kvb_err e = {{0}};
    CHECK_MSG(gguf_open(path, &f, &e) == KVB_OK, "%s", e.msg);
    if (!f) return;
    CHECK_EQ_INT(gguf_n_tensors(f), 272);
    uint32_t blocks = 0;
    CHECK(gguf_get_u32(f, "llama.block_count", &blocks, &e) == KVB_OK);
    CHECK_EQ_INT(blocks, 30);
    struct gguf_str arch;
    CHECK(gguf_get_str(f, "general.architecture", &arch, NULL) == KVB_OK && gguf_str_eq(arch, "llama"));
    const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK_EQ_INT(t->type, GGML_TYPE_Q8_0);
        CHECK_EQ_INT(t->n_dims, 2);
        CHECK_EQ_INT(t->ne[0], 576);
        CHECK_EQ_INT(t->ne[1], 49152);
        CHECK_EQ_INT(t->n_bytes, 576ull / 32 * 34 * 49152);
        check_release_pages(f, t);
    }
    const struct gguf_value *tokens = NULL;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VTYPE_STRING, &tokens, &e) == KVB_OK);
    if (tokens) CHECK_EQ_INT(tokens->v.arr.n, 49152);
    gguf_close(f);
}

int main(void)
{
    test_roundtrip();
    test_copy_identical();
    test_version2_and_files();
    test_truncation();
    test_malformed_header_and_kvs();
    test_malformed_alignment();
    test_malformed_tensors();
    test_getters();
    test_writer_refusals();
    test_alloc_failures();
    test_real_model();
    return tu_finish();
}
