/* testutil.h — tiny assertion helpers shared by the C tests.
 *
 * A test is a main() that calls CHECK*(); failures print file:line and the
 * expression and mark the test failed; tu_finish() returns the exit code
 * (0 pass, 1 fail). tu_skip() exits 77, which ctest reports as skipped. */
#ifndef KVB_TESTUTIL_H
#define KVB_TESTUTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

extern int tu_failures;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
            tu_failures++;                                                                                             \
        }                                                                                                              \
    } while (0)
#define CHECK_MSG(cond, ...)                                                                                           \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            tu_failures++;                                                                                             \
        }                                                                                                              \
    } while (0)
#define CHECK_EQ_INT(a, b)                                                                                             \
    do {                                                                                                               \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                            \
        if (a_ != b_) {                                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a, #b, a_, b_);     \
            tu_failures++;                                                                                             \
        }                                                                                                              \
    } while (0)

int tu_finish(void);
void tu_skip(const char *why) __attribute__((noreturn));
/* Path from environment variable `name` (set by ctest), or NULL. */
const char *tu_env(const char *name);
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL on error. */
char *tu_read_file(const char *path, size_t *len);

/* The default model's tokenizer ($KVB_MODEL), tok_free by the caller; NULL
 * when the model is not there (*absent set) or does not load (a failed
 * check). */
struct tok;
struct tok *tu_model_tokenizer(bool *absent);

#endif
