/* unicode_norm_tables.h — the generated tables behind unicode.h's
 * normalisation queries (unicode_norm_tables.c, written by
 * scripts/gen-unicode-norm.py). Private to src/base/unicode*.c. */
#ifndef KVB_UNICODE_NORM_TABLES_H
#define KVB_UNICODE_NORM_TABLES_H

#include <stdint.h>

extern const uint32_t unicode_mn_ranges[][2]; /* sorted, inclusive */
extern const uint32_t unicode_mn_count;
extern const uint32_t unicode_nfd_table[][5]; /* sorted by [0]; [1..4] the decomposition, 0-padded */
extern const uint32_t unicode_nfd_count;
extern const uint32_t unicode_lower_table[][3]; /* sorted by [0]; [1..2] the lowercase, 0-padded */
extern const uint32_t unicode_lower_count;

#endif
