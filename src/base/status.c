/* status.c — names for kvb_status and the error-message helpers. */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kvb_strerror(enum kvb_status st)
{
    switch (st) {
    case KVB_OK: return "KVB_OK: success";
    case KVB_ERR_NOMEM: return "KVB_ERR_NOMEM: out of memory";
    case KVB_ERR_IO: return "KVB_ERR_IO: input/output error";
    case KVB_ERR_FORMAT: return "KVB_ERR_FORMAT: malformed input";
    case KVB_ERR_UNSUPPORTED: return "KVB_ERR_UNSUPPORTED: not supported";
    case KVB_ERR_INVALID_ARG: return "KVB_ERR_INVALID_ARG: invalid argument";
    case KVB_ERR_NOT_FOUND: return "KVB_ERR_NOT_FOUND: not found";
    case KVB_ERR_RANGE: return "KVB_ERR_RANGE: value out of range";
    case KVB_ERR_INTERNAL: return "KVB_ERR_INTERNAL: internal error";
    case KVB_ERR_CANCELLED: return "KVB_ERR_CANCELLED: interrupted";
    case KVB_STATUS_COUNT: break;
    }
    return "KVB_ERR_UNKNOWN: unknown status";
}

enum kvb_status kvb_errf(struct kvb_err *err, enum kvb_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

enum kvb_status kvb_err_wrap(struct kvb_err *err, enum kvb_status st, const char *fmt, ...)
{
    if (err) {
        char prefix[256], old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        old[sizeof old - 1] = '\0';
        /* Truncation is acceptable: the message stays readable. */
        size_t np = strlen(prefix);
        if (np > sizeof err->msg - 3) np = sizeof err->msg - 3;
        memcpy(err->msg, prefix, np);
        memcpy(err->msg + np, ": ", 2);
        size_t room = sizeof err->msg - np - 3, no = strlen(old);
        if (no > room) no = room;
        memcpy(err->msg + np + 2, old, no);
        err->msg[np + 2 + no] = '\0';
    }
    return st;
}
