/* buf.h — a growable byte buffer, the one the JSON writers and the output
 * formatters append to.
 *
 * Ownership: the buffer owns data (kvb_buf_free). Zero-initialise it; reuse
 * it across writes by setting len = 0. Errors: kvb_buf_reserve returns
 * KVB_ERR_NOMEM and leaves the buffer as it was. */
#ifndef KVB_BASE_BUF_H
#define KVB_BASE_BUF_H

#include <stddef.h>

#include "base/status.h"

struct kvb_buf {
    char *data;
    size_t len, cap;
};

/* Room for `extra` more bytes after len (capacity doubles, from 256). */
enum kvb_status kvb_buf_reserve(struct kvb_buf *b, size_t extra);
void kvb_buf_free(struct kvb_buf *b); /* accepts NULL; zeroes b */

#endif
