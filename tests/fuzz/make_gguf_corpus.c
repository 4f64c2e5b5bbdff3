/* make_gguf_corpus.c — writes the seed files of tests/fuzz/corpus/gguf/.
 *
 * Not part of the build: run by hand when the seeds need regenerating, e.g.
 *   cc -std=c11 -D_GNU_SOURCE -mavx2 -mf16c -Isrc tests/fuzz/make_gguf_corpus.c \
 *      src/gguf_write.c src/gguf.c src/dtype.c src/dtype_avx2.c src/cpu.c \
 *      src/alloc.c src/status.c -o /tmp/mkcorpus && /tmp/mkcorpus tests/fuzz/corpus/gguf
 * Seeds are small valid files of several shapes (every value type, nested
 * arrays, each common tensor type, a llama-like layout, version 2, other
 * alignments) and damaged variants of them (truncated, patched header
 * fields), so the fuzzer starts from inputs that reach deep into the parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "support/gguf_write.h"

static const char *out_dir;

static void save(const char *name, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static uint8_t *finish(struct gguf_writer *w, uint64_t *n)
{
    void *p = NULL;
    struct kvb_err e;
    if (gguf_writer_write_memory(w, &p, n, &e) != KVB_OK) {
        fprintf(stderr, "write: %s\n", e.msg);
        exit(1);
    }
    gguf_writer_free(w);
    return p;
}

static struct gguf_writer *writer(void)
{
    struct gguf_writer *w;
    if (gguf_writer_create(&w, NULL) != KVB_OK) exit(1);
    return w;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Saves a file plus damaged variants: two truncations and header patches. */
static void save_family(const char *base, uint8_t *p, uint64_t n, int variants)
{
    char name[256];
    snprintf(name, sizeof name, "%s.gguf", base);
    save(name, p, n);
    if (!variants) return;
    snprintf(name, sizeof name, "%s-trunc-half", base);
    save(name, p, n / 2);
    snprintf(name, sizeof name, "%s-trunc-1", base);
    save(name, p, n - 1);
    uint8_t *c = malloc(n);
    memcpy(c, p, n);
    put_u64(c + 16, 0xffffffffffull);
    snprintf(name, sizeof name, "%s-kvcount", base);
    save(name, c, n);
    memcpy(c, p, n);
    c[4] = 1;
    snprintf(name, sizeof name, "%s-v1", base);
    save(name, c, n);
    free(c);
}

/* Writes w's file and saves it (with its damaged variants, if asked). */
static void save_writer(struct gguf_writer *w, const char *base, int variants)
{
    uint64_t n;
    uint8_t *p = finish(w, &n);
    save_family(base, p, n, variants);
    kvb_free(p);
}

/* Every scalar type and strings. */
static void seed_scalars(void)
{
    struct gguf_writer *w = writer();
    gguf_writer_add_u8(w, "u8", 1);
    gguf_writer_add_i8(w, "i8", -1);
    gguf_writer_add_u16(w, "u16", 2);
    gguf_writer_add_i16(w, "i16", -2);
    gguf_writer_add_u32(w, "u32", 3);
    gguf_writer_add_i32(w, "i32", -3);
    gguf_writer_add_u64(w, "u64", 4);
    gguf_writer_add_i64(w, "i64", -4);
    gguf_writer_add_f32(w, "f32", 0.5f);
    gguf_writer_add_f64(w, "f64", 0.25);
    gguf_writer_add_bool(w, "bool", true);
    gguf_writer_add_str(w, "str", "hello");
    save_writer(w, "scalars", 0);
}

/* Arrays: every scalar element type, strings, nested. */
static void seed_arrays(void)
{
    struct gguf_writer *w = writer();
    uint8_t a8[] = {1, 2, 3};
    uint16_t a16[] = {1, 2};
    uint32_t a32[] = {1, 2, 3, 4};
    uint64_t a64[] = {1};
    float af[] = {1.5f, -2.0f};
    double ad[] = {3.0};
    bool ab[] = {true, false};
    gguf_writer_add_arr(w, "a.u8", GGUF_VTYPE_UINT8, a8, 3);
    gguf_writer_add_arr(w, "a.i8", GGUF_VTYPE_INT8, a8, 3);
    gguf_writer_add_arr(w, "a.u16", GGUF_VTYPE_UINT16, a16, 2);
    gguf_writer_add_arr(w, "a.i16", GGUF_VTYPE_INT16, a16, 2);
    gguf_writer_add_arr(w, "a.u32", GGUF_VTYPE_UINT32, a32, 4);
    gguf_writer_add_arr(w, "a.i32", GGUF_VTYPE_INT32, a32, 4);
    gguf_writer_add_arr(w, "a.u64", GGUF_VTYPE_UINT64, a64, 1);
    gguf_writer_add_arr(w, "a.i64", GGUF_VTYPE_INT64, a64, 1);
    gguf_writer_add_arr(w, "a.f32", GGUF_VTYPE_FLOAT32, af, 2);
    gguf_writer_add_arr(w, "a.f64", GGUF_VTYPE_FLOAT64, ad, 1);
    gguf_writer_add_arr(w, "a.bool", GGUF_VTYPE_BOOL, ab, 2);
    const char *strs[] = {"<s>", "</s>", "", "hello"};
    gguf_writer_add_arr_str(w, "a.str", strs, 4);
    struct gguf_value rows[2] = {{.type = GGUF_VTYPE_ARRAY}, {.type = GGUF_VTYPE_ARRAY}};
    rows[0].v.arr.elem_type = GGUF_VTYPE_UINT32, rows[0].v.arr.n = 2, rows[0].v.arr.raw = a32;
    rows[1].v.arr.elem_type = GGUF_VTYPE_UINT32, rows[1].v.arr.n = 0;
    struct gguf_value mat = {.type = GGUF_VTYPE_ARRAY};
    mat.v.arr.elem_type = GGUF_VTYPE_ARRAY, mat.v.arr.n = 2, mat.v.arr.items = rows;
    gguf_writer_add_value(w, "a.nested", &mat);
    struct gguf_value sitems[2] = {{.type = GGUF_VTYPE_STRING, .v.str = {1, "x"}},
                                   {.type = GGUF_VTYPE_STRING, .v.str = {0, ""}}};
    struct gguf_value srow = {.type = GGUF_VTYPE_ARRAY};
    srow.v.arr.elem_type = GGUF_VTYPE_STRING, srow.v.arr.n = 2, srow.v.arr.items = sitems;
    struct gguf_value smat = {.type = GGUF_VTYPE_ARRAY};
    smat.v.arr.elem_type = GGUF_VTYPE_ARRAY, smat.v.arr.n = 1, smat.v.arr.items = &srow;
    gguf_writer_add_value(w, "a.nested.str", &smat);
    save_writer(w, "arrays", 0);
}

/* One tensor of each common type. */
static void seed_tensors(void)
{
    static const struct {
        const char *name;
        enum ggml_type t;
        uint64_t ne0;
    } types[] = {
        {"f32", GGML_TYPE_F32, 4},    {"f16", GGML_TYPE_F16, 4},     {"bf16", GGML_TYPE_BF16, 4},
        {"q4_0", GGML_TYPE_Q4_0, 32}, {"q4_1", GGML_TYPE_Q4_1, 32},  {"q5_0", GGML_TYPE_Q5_0, 32},
        {"q8_0", GGML_TYPE_Q8_0, 32}, {"q4_k", GGML_TYPE_Q4_K, 256}, {"q6_k", GGML_TYPE_Q6_K, 256},
    };
    struct gguf_writer *w = writer();
    gguf_writer_add_str(w, "general.architecture", "llama");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint64_t ne[2] = {types[i].ne0, 2};
        void *d;
        gguf_writer_add_tensor(w, types[i].name, types[i].t, 2, ne, NULL, &d);
    }
    save_writer(w, "tensors", 0);
}

/* A tiny llama-like layout with alignment 64. */
static void seed_llama(void)
{
    struct gguf_writer *w = writer();
    gguf_writer_add_str(w, "general.architecture", "llama");
    gguf_writer_set_alignment(w, 64);
    gguf_writer_add_u32(w, "llama.block_count", 1);
    gguf_writer_add_u32(w, "llama.embedding_length", 32);
    gguf_writer_add_u32(w, "llama.attention.head_count", 2);
    gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    const char *toks[] = {"a", "b", "ab", "<|endoftext|>"};
    gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    const char *merges[] = {"a b"};
    gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    int32_t tt[] = {1, 1, 1, 3};
    gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_VTYPE_INT32, tt, 4);
    uint64_t emb[] = {32, 4}, norm[] = {32}, sq[] = {32, 32};
    gguf_writer_add_tensor(w, "token_embd.weight", GGML_TYPE_Q8_0, 2, emb, NULL, NULL);
    gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", GGML_TYPE_F32, 1, norm, NULL, NULL);
    gguf_writer_add_tensor(w, "blk.0.attn_q.weight", GGML_TYPE_Q4_1, 2, sq, NULL, NULL);
    gguf_writer_add_tensor(w, "output_norm.weight", GGML_TYPE_F32, 1, norm, NULL, NULL);
    save_writer(w, "llama", 1);
}

/* Version 2, with 3- and 4-d tensors. */
static void seed_v2(void)
{
    struct gguf_writer *w = writer();
    gguf_writer_set_version(w, 2);
    gguf_writer_add_str(w, "general.name", "v2");
    uint64_t ne4[] = {2, 2, 2, 2};
    gguf_writer_add_tensor(w, "t4", GGML_TYPE_F16, 4, ne4, NULL, NULL);
    gguf_writer_add_tensor(w, "t3", GGML_TYPE_F32, 3, ne4, NULL, NULL);
    save_writer(w, "v2", 0);
}

/* Nothing but the header: no kvs, no tensors. */
static void seed_empty(void)
{
    struct gguf_writer *w = writer();
    save_writer(w, "empty", 0);
}

/* Invalid-by-construction seeds: reach the later checks. */
static void seed_bad_alignment(void)
{
    struct gguf_writer *w = writer();
    gguf_writer_add_u32(w, "general.alignment", 48);
    save_writer(w, "bad-alignment", 0);
}

static void seed_bad_tensor(void)
{
    struct gguf_writer *w = writer();
    uint64_t ne[] = {32, 4};
    gguf_writer_add_tensor_info_raw(w, "bad.type", 77, 2, ne, 0);
    gguf_writer_add_tensor_info_raw(w, "bad.offset", GGML_TYPE_F32, 2, ne, 4);
    save_writer(w, "bad-tensor", 0);
}

static void seed_dup_key(void)
{
    struct gguf_writer *w = writer();
    gguf_writer_add_u8(w, "dup", 1);
    gguf_writer_add_u8(w, "dup", 2);
    save_writer(w, "dup-key", 0);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    seed_scalars();
    seed_arrays();
    seed_tensors();
    seed_llama();
    seed_v2();
    seed_empty();
    seed_bad_alignment();
    seed_bad_tensor();
    seed_dup_key();
    return 0;
}
