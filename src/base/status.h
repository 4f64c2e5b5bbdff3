/* status.h — the one status type of kvbatch and its error-message carrier.
 *
 * Library code returns an enum kvb_status and never exits. Where a status alone
 * cannot say what went wrong (which file, which key, which offset), the callee
 * also fills a struct kvb_err if the caller passed one (NULL is allowed
 * everywhere). Messages are plain text, no trailing newline. */
#ifndef KVB_STATUS_H
#define KVB_STATUS_H

#include <stddef.h>

enum kvb_status {
    KVB_OK = 0,
    KVB_ERR_NOMEM,       /* an allocation failed */
    KVB_ERR_IO,          /* open/read/write/mmap failed (errno text in the message) */
    KVB_ERR_FORMAT,      /* input bytes do not follow their format (GGUF, JSON, cache value) */
    KVB_ERR_UNSUPPORTED, /* well-formed but not something kvbatch handles */
    KVB_ERR_INVALID_ARG, /* caller passed something out of range */
    KVB_ERR_NOT_FOUND,   /* a key, tensor or token that was asked for is absent */
    KVB_ERR_RANGE,       /* a value does not fit where it must go (context length, buffer) */
    KVB_ERR_INTERNAL,    /* a broken invariant inside kvbatch: a bug */
    KVB_ERR_CANCELLED,   /* stopped on request (a signal) before the work was done */
    KVB_STATUS_COUNT
};

/* Returns a static string that begins with the code's name, e.g. "KVB_ERR_IO: i/o error". */
const char *kvb_strerror(enum kvb_status st);

struct kvb_err {
    char msg[512];
};

/* Formats into err->msg (truncating) when err is non-NULL; returns st so that
 * `return kvb_errf(err, KVB_ERR_FORMAT, "...", ...)` reads as one statement. */
enum kvb_status kvb_errf(struct kvb_err *err, enum kvb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes err->msg with "context: " (if err non-NULL); returns st. */
enum kvb_status kvb_err_wrap(struct kvb_err *err, enum kvb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The two error-flow macros (STYLE.md rule 5). */
#define KVB_RETURN_IF(cond, st)                                                                                        \
    do {                                                                                                               \
        if (cond) return (st);                                                                                         \
    } while (0)
#define KVB_FORWARD_IF_ERROR(expr)                                                                                     \
    do {                                                                                                               \
        enum kvb_status kvb_st_ = (expr);                                                                              \
        if (kvb_st_ != KVB_OK) return kvb_st_;                                                                         \
    } while (0)

#endif
