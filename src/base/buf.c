/* buf.c — see buf.h. */
#include "base/buf.h"

#include <stdint.h>
#include <string.h>

#include "base/alloc.h"

enum kvb_status kvb_buf_reserve(struct kvb_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra) return KVB_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2) return KVB_ERR_NOMEM;
        cap *= 2;
    }
    char *d = kvb_realloc(b->data, cap);
    if (!d) return KVB_ERR_NOMEM;
    b->data = d;
    b->cap = cap;
    return KVB_OK;
}

void kvb_buf_free(struct kvb_buf *b)
{
    if (!b) return;
    kvb_free(b->data);
    memset(b, 0, sizeof *b);
}
