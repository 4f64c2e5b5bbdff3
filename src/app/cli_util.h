/* cli_util.h — small helpers shared by the command implementations:
 * option value parsing with messages that name the option, and reading a
 * whole file or stdin. Errors are printed to stderr prefixed by "kvbatch". */
#ifndef KVB_CLI_UTIL_H
#define KVB_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/kvtype.h"
#include "model/quant.h"

/* Exit codes of kvbatch commands. */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAIL = 1, /* could not do the work (model unreadable, I/O, …) */
    CLI_EXIT_USAGE = 2 /* bad command line */
};

/* Parse `val` as the value of option `opt`; print an error naming the option
 * and return false when it is not a number in [lo, hi]. */
bool cli_parse_i64(const char *opt, const char *val, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_f32(const char *opt, const char *val, float lo, float hi, float *out);
/* --kv-type: f16, q8 or q4 (backend/kvtype.h). */
bool cli_parse_kv_type(const char *opt, const char *val, enum kv_type *out);
/* --kernels NAME: auto | amx | avx512 | avx2 | scalar, and one this CPU can
 * run (auto: what it resolves to, so a bad KVBATCH_KERNELS is reported here
 * too); prints why not. */
bool cli_parse_kernels(const char *opt, const char *val, enum mm_impl *out);
/* --activations BITS: 8 or 16 (*act16 set for 16). */
bool cli_parse_activations(const char *opt, const char *val, bool *act16);
/* Sizes like 512M, 2G, 1.5GiB, 4096 (bytes). */
bool cli_parse_size(const char *opt, const char *val, uint64_t *out);

/* Returns the value of an option that takes one: handles both "--opt VAL"
 * (advancing *i) and "--opt=VAL". NULL (with a message) if missing. Call only
 * when cli_opt_is(argv[*i], name) is true. */
const char *cli_opt_value(int argc, char **argv, int *i);
/* True when arg is `name` or starts with "name=". */
bool cli_opt_is(const char *arg, const char *name);

/* Reads all of a stream / file into a NUL-terminated malloc'd buffer. */
char *cli_read_stream(void *stdio_file, size_t *len);
char *cli_read_file(const char *path, size_t *len);

/* Writes the default model path into buf: $KVBATCH_MODEL, else
 * models/SmolLM2-135M-Instruct.Q4_1.gguf under the working directory, else
 * under the directory above the executable's (build/kvbatch → source tree). */
void cli_default_model(char *buf, size_t cap);

double cli_now(void); /* monotonic seconds */

/* In an option loop over argv with index i and `const char *val`: the
 * option's value into val, or return CLI_EXIT_USAGE from the caller
 * (cli_opt_value has said why). */
#define CLI_VAL()                                                                                                      \
    do {                                                                                                               \
        if (!(val = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;                                             \
    } while (0)

#endif
