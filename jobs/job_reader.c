/* job_reader.c — lines of any length from a FILE*, in memory bounded by the
 * longest line.
 *
 * A job file may hold millions of lines, and one line may hold a long
 * document, so the reader keeps one buffer that grows to the longest line
 * seen (never past max_line) and reads the file in 64 KiB chunks. It skips
 * nothing and interprets nothing: blank lines and "\r" reach the caller. */
#include "jobs/job.h"

#include <errno.h>
#include <string.h>

#include "base/alloc.h"

#define CHUNK ((size_t)64 << 10)

struct job_reader {
    FILE *f;
    size_t max_line;
    char *buf; /* holds unconsumed bytes buf[head..tail) */
    size_t cap, head, tail;
    uint64_t line_no; /* of the last line returned */
    uint64_t offset;  /* stream offset of buf[head] */
    bool eof;
};

enum kvb_status job_reader_create(FILE *f, size_t max_line, struct job_reader **out, struct kvb_err *err)
{
    *out = NULL;
    if (!f) return kvb_errf(err, KVB_ERR_INVALID_ARG, "job_reader_create: no file");
    struct job_reader *r = kvb_calloc(1, sizeof *r);
    if (!r) return kvb_errf(err, KVB_ERR_NOMEM, "job reader: out of memory");
    r->f = f;
    r->max_line = max_line ? max_line : JOB_MAX_LINE_DEFAULT;
    r->cap = CHUNK;
    r->buf = kvb_malloc(r->cap);
    if (!r->buf) {
        kvb_free(r);
        return kvb_errf(err, KVB_ERR_NOMEM, "job reader: out of memory");
    }
    *out = r;
    return KVB_OK;
}

void job_reader_free(struct job_reader *r)
{
    if (!r) return;
    kvb_free(r->buf);
    kvb_free(r);
}

/* Reads one more chunk after tail, first moving live bytes to the front and
 * growing the buffer when it is full. Returns bytes read (0 at end). */
static enum kvb_status fill(struct job_reader *r, size_t *got, struct kvb_err *err)
{
    *got = 0;
    if (r->eof) return KVB_OK;
    if (r->head > 0) {
        memmove(r->buf, r->buf + r->head, r->tail - r->head);
        r->tail -= r->head;
        r->head = 0;
    }
    if (r->cap - r->tail < CHUNK) {
        size_t ncap = r->cap * 2;
        while (ncap - r->tail < CHUNK) ncap *= 2;
        char *nb = kvb_realloc(r->buf, ncap);
        if (!nb) return kvb_errf(err, KVB_ERR_NOMEM, "job reader: out of memory for a %zu-byte line", r->tail);
        r->buf = nb;
        r->cap = ncap;
    }
    size_t n = fread(r->buf + r->tail, 1, r->cap - r->tail, r->f);
    r->tail += n;
    *got = n;
    if (ferror(r->f) && errno == EINTR) {
        /* A signal the caller handles (SIGINT, SIGTERM) cut a read from a
         * pipe short: say so rather than block again. */
        clearerr(r->f);
        return kvb_errf(err, KVB_ERR_CANCELLED, "reading the job file was interrupted at byte %llu",
                        (unsigned long long)(r->offset + (r->tail - r->head)));
    }
    if (n == 0) {
        if (ferror(r->f))
            return kvb_errf(err, KVB_ERR_IO, "reading the job file at byte %llu: %s",
                            (unsigned long long)(r->offset + (r->tail - r->head)), strerror(errno));
        r->eof = true;
    }
    return KVB_OK;
}

enum kvb_status job_reader_next(struct job_reader *r, struct job_line *line, bool *got, struct kvb_err *err)
{
    *got = false;
    memset(line, 0, sizeof *line);
    uint64_t start = r->offset; /* stream offset of this line's first byte (buf[head]) */
    size_t scanned = 0;         /* bytes after head already known to hold no "\n" */
    uint64_t skipped = 0;       /* bytes dropped from an over-long line */
    bool ended = false;
    const char *nl = NULL;
    for (;;) {
        nl = memchr(r->buf + r->head + scanned, '\n', r->tail - r->head - scanned);
        if (nl) break;
        scanned = r->tail - r->head;
        if (scanned > r->max_line) {
            /* Keep the first max_line bytes for the caller's error message
             * and drop the rest as it comes: memory stays bounded even for a
             * file that is one endless line. */
            size_t drop = scanned - r->max_line;
            r->tail -= drop;
            skipped += drop;
            scanned = r->max_line;
        }
        size_t n;
        KVB_FORWARD_IF_ERROR(fill(r, &n, err));
        if (n == 0) {
            ended = true;
            break;
        }
    }
    size_t len = ended ? r->tail - r->head : (size_t)(nl - (r->buf + r->head));
    if (ended && len == 0 && skipped == 0) return KVB_OK; /* nothing left */
    bool too_long = skipped > 0 || len > r->max_line;
    line->data = r->buf + r->head;
    line->len = too_long ? r->max_line : len;
    line->full_len = skipped + len;
    line->terminated = !ended;
    line->too_long = too_long;
    line->line_no = ++r->line_no;
    line->offset = start;
    r->head += len + !ended;
    r->offset = start + skipped + len + !ended;
    *got = true;
    return KVB_OK;
}

bool job_line_is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}
