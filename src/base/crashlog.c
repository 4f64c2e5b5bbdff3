/* crashlog.c — the crash journal of `kvbatch run` (see crashlog.h). */
#include "base/crashlog.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/alloc.h"

/* ---- state the signal handler reads ------------------------------------------ */

struct entry {
    volatile uint64_t line_no; /* 0: free */
    volatile uint64_t hash;
};

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_FATAL ((int)(sizeof fatal_signals / sizeof fatal_signals[0]))

static struct {
    int fd; /* -1: no journal */
    struct entry *entries;
    int32_t n_entries;
    uint64_t uid_div;
    char path[4096];
    struct sigaction old[N_FATAL];
    stack_t old_stack;
    void *alt_stack;
} J = {.fd = -1};

static _Thread_local uint64_t mark_line, mark_hash, mark_uid = UINT64_MAX;
static _Thread_local char mark_phase;

uint64_t crashlog_hash(const void *data, size_t len)
{
    uint64_t h = XXH3_64bits(data, len);
    return h ? h : 1;
}

/* ---- writing, async-signal-safe ----------------------------------------------- */

static size_t put_u64(char *out, uint64_t v)
{
    char t[24];
    size_t n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++) out[i] = t[n - 1 - i];
    return n;
}

static size_t put_hex(char *out, uint64_t v)
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) out[i] = d[(v >> (60 - 4 * i)) & 15];
    return 16;
}

static void put_all(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(J.fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_fatal(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    const int saved = errno;
    if (J.fd >= 0) {
        uint64_t line = 0, hash = 0;
        char phase = 'r';
        if (mark_line) {
            line = mark_line;
            hash = mark_hash;
            phase = mark_phase;
        } else if (mark_uid != UINT64_MAX && J.uid_div && mark_uid / J.uid_div < (uint64_t)J.n_entries) {
            line = J.entries[mark_uid / J.uid_div].line_no;
            hash = J.entries[mark_uid / J.uid_div].hash;
        }
        if (!line) { /* no mark: the one line in flight, if there is exactly one */
            int32_t used = 0, at = -1;
            for (int32_t i = 0; i < J.n_entries; i++)
                if (J.entries[i].line_no) {
                    used++;
                    at = i;
                }
            if (used == 1) {
                line = J.entries[at].line_no;
                hash = J.entries[at].hash;
            }
        }
        char b[96];
        size_t n = 0;
        memcpy(b, "crash ", 6);
        n = 6;
        n += put_u64(b + n, (uint64_t)sig);
        b[n++] = ' ';
        n += put_u64(b + n, line);
        b[n++] = ' ';
        n += put_hex(b + n, hash);
        b[n++] = ' ';
        b[n++] = phase;
        b[n++] = '\n';
        put_all(b, n);
        for (int32_t i = 0; !line && i < J.n_entries; i++) {
            const uint64_t l = J.entries[i].line_no, h = J.entries[i].hash;
            if (!l) continue;
            memcpy(b, "inflight ", 9);
            n = 9;
            n += put_u64(b + n, l);
            b[n++] = ' ';
            n += put_hex(b + n, h);
            b[n++] = '\n';
            put_all(b, n);
        }
    }
    /* Then whatever handled the signal before (the default action, or a
     * sanitizer's report): for a fault the kernel raised, by returning, so
     * the faulting instruction runs again and faults into it with its own
     * siginfo; for a signal sent (raise, abort, kill), by sending it again. */
    for (int i = 0; i < N_FATAL; i++)
        if (fatal_signals[i] == sig) sigaction(sig, &J.old[i], NULL);
    errno = saved;
    if (!info || info->si_code <= 0) raise(sig);
}

/* ---- the journal ------------------------------------------------------------------ */

static void put_record(const char *s)
{
    if (J.fd >= 0) put_all(s, strlen(s));
}

enum kvb_status crashlog_open(const char *path, int32_t n_entries, uint64_t uid_div, struct kvb_err *err)
{
    if (J.fd >= 0) return kvb_errf(err, KVB_ERR_INVALID_ARG, "a crash journal is already open");
    if (snprintf(J.path, sizeof J.path, "%s", path) >= (int)sizeof J.path)
        return kvb_errf(err, KVB_ERR_RANGE, "journal path too long");
    J.entries = kvb_calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *J.entries);
    if (!J.entries) return kvb_errf(err, KVB_ERR_NOMEM, "out of memory");
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND, 0644);
    if (fd < 0) {
        kvb_free(J.entries);
        J.entries = NULL;
        return kvb_errf(err, KVB_ERR_IO, "cannot open the crash journal %s: %s", path, strerror(errno));
    }
    J.n_entries = n_entries;
    J.uid_div = uid_div;
    J.fd = fd;
    char rec[64];
    snprintf(rec, sizeof rec, "start %ld\n", (long)getpid());
    put_record(rec);
    /* An alternate stack, so a stack overflow still gets its record. */
    J.alt_stack = kvb_malloc(1 << 16);
    if (J.alt_stack) {
        stack_t ss = {.ss_sp = J.alt_stack, .ss_size = 1 << 16, .ss_flags = 0};
        if (sigaltstack(&ss, &J.old_stack) != 0) {
            kvb_free(J.alt_stack);
            J.alt_stack = NULL;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_ONSTACK | SA_SIGINFO;
    for (int i = 0; i < N_FATAL; i++) sigaction(fatal_signals[i], &sa, &J.old[i]);
    return KVB_OK;
}

void crashlog_restart(void)
{
    if (J.fd < 0 || ftruncate(J.fd, 0) != 0) return;
    char rec[64];
    snprintf(rec, sizeof rec, "start %ld\n", (long)getpid());
    put_record(rec);
}

void crashlog_track(int32_t entry, uint64_t line_no, uint64_t hash)
{
    if (J.fd < 0 || entry < 0 || entry >= J.n_entries) return;
    J.entries[entry].line_no = 0; /* never a half-written pair for the handler */
    J.entries[entry].hash = hash;
    J.entries[entry].line_no = line_no;
}

void crashlog_mark_line(uint64_t line_no, uint64_t hash, char phase)
{
    mark_line = 0;
    mark_hash = hash;
    mark_phase = phase;
    mark_line = line_no;
}

void crashlog_mark_uid(uint64_t uid) { mark_uid = uid; }

void crashlog_close(const char *status, bool remove_file)
{
    if (J.fd < 0) return;
    for (int i = 0; i < N_FATAL; i++) sigaction(fatal_signals[i], &J.old[i], NULL);
    if (J.alt_stack) {
        sigaltstack(&J.old_stack, NULL);
        kvb_free(J.alt_stack);
        J.alt_stack = NULL;
    }
    char rec[64];
    snprintf(rec, sizeof rec, "end %s\n", status);
    put_record(rec);
    close(J.fd);
    J.fd = -1;
    if (remove_file) unlink(J.path);
    kvb_free(J.entries);
    J.entries = NULL;
    J.n_entries = 0;
}

/* ---- reading ---------------------------------------------------------------------- */

void crashlog_history_free(struct crashlog_history *h)
{
    if (!h) return;
    kvb_free(h->blamed);
    kvb_free(h->suspects);
    memset(h, 0, sizeof *h);
}

static bool push(struct crashlog_line **v, size_t *n, size_t *cap, struct crashlog_line l)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        struct crashlog_line *nv = kvb_realloc(*v, sizeof *nv * c);
        if (!nv) return false;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = l;
    return true;
}

enum kvb_status crashlog_read(const char *path, struct crashlog_history *h, struct kvb_err *err)
{
    memset(h, 0, sizeof *h);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return KVB_OK;
        return kvb_errf(err, KVB_ERR_IO, "cannot read the crash journal %s: %s", path, strerror(errno));
    }
    size_t cap_b = 0, cap_s = 0;
    char line[1200];
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n == 0 || line[n - 1] != '\n') continue; /* cut short, or too long: not ours */
        line[n - 1] = '\0';
        unsigned long long a = 0, b = 0, c = 0;
        char ph = 0;
        if (strncmp(line, "start ", 6) == 0) {
            h->n_runs++;
        } else if (sscanf(line, "crash %llu %llu %llx %c", &a, &b, &c, &ph) == 4) {
            h->n_crashes++;
            if (b) ok = push(&h->blamed, &h->n_blamed, &cap_b, (struct crashlog_line){b, c, ph, (int)a});
        } else if (sscanf(line, "inflight %llu %llx", &b, &c) == 2) {
            ok = push(&h->suspects, &h->n_suspects, &cap_s, (struct crashlog_line){b, c, 'r', 0});
        }
    }
    fclose(f);
    if (!ok) {
        crashlog_history_free(h);
        return kvb_errf(err, KVB_ERR_NOMEM, "out of memory reading the crash journal");
    }
    return KVB_OK;
}

const struct crashlog_line *crashlog_find(const struct crashlog_line *v, size_t n, uint64_t line_no, uint64_t hash)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].line_no == line_no && (v[i].hash == 0 || hash == 0 || v[i].hash == hash)) return &v[i];
    return NULL;
}
