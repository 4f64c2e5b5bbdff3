/* test_pstore_live.c — the cache file damaged under a process that has it
 * open (store/pstore/pstore_guard.c), through the API; each case in a child
 * process, so that a crash is a failed case and not a lost test.
 *
 * The child opens a store, fills it (chains of small values inline in leaf
 * pages and of 8 KiB ones in overflow pages), reads it once (so the map is
 * warm), then damages data.mdb through a file descriptor of its own, as
 * another process would: truncated to two pages or to nothing, its meta
 * pages zeroed, or the main database's root page overwritten. Then it loads
 * chains, looks keys up, and puts and flushes new chains. What must hold:
 *   - no crash (before pstore_guard.c: SIGBUS on a truncated file, SIGABRT
 *     from LMDB's assertions on zeroed meta pages);
 *   - a load never returns bytes other than those stored (a miss, or the
 *     blocks read before the damage);
 *   - once a read faulted, the store is off: loads are misses, puts are
 *     dropped, pstore_get_stats counts the fault and writing is off;
 *   - truncation and zeroed meta pages do fault (they are what the guard is
 *     for), each for a load, a lookup and the writer's own transaction;
 *   - a fault outside the store still ends the process with its signal, and
 *     a handler installed before or after the store's (the crash journal's
 *     kind: records, restores what it found, returns) still sees it once. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/pstore/pstore.h"
#include "support/testutil.h"

#define NBLK 4
#define PAGE 4096

static const char *const FP_A = "0123456789abcdef0123456789abcdef";
static const char *const FP_B = "fedcba9876543210fedcba9876543210";

struct chain {
    const struct pstore_model *m;
    int32_t tokens[NBLK * 16];
    struct pstore_key keys[NBLK];
    uint8_t *data;
    size_t raw;
};

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void chain_make(struct chain *c, const struct pstore_model *m, uint64_t seed)
{
    c->m = m;
    c->raw = (size_t)m->n_layer * 2 * (size_t)m->block_size * (size_t)m->kv_dim * 2;
    c->data = malloc(c->raw * NBLK);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < NBLK * m->block_size; i++) c->tokens[i] = (int32_t)(next(&s) % 49152);
    for (size_t i = 0; i < c->raw * NBLK; i++) c->data[i] = (uint8_t)(next(&s) >> 29);
    pstore_chain_keys(m, c->tokens, NBLK, c->keys);
}

static void chain_put(struct pstore *ps, const struct chain *c)
{
    for (int i = 0; i < NBLK; i++)
        pstore_put(ps, c->m, &c->keys[i], i ? &c->keys[i - 1] : NULL, c->tokens + (size_t)i * (size_t)c->m->block_size,
                   c->data + (size_t)i * c->raw);
}

/* Blocks loaded, or -1 when one differs from what was stored. */
static int chain_load(struct pstore *ps, const struct chain *c)
{
    uint8_t *buf = malloc(c->raw * NBLK);
    void *dst[NBLK];
    for (int i = 0; i < NBLK; i++) dst[i] = buf + (size_t)i * c->raw;
    int32_t got = 0;
    pstore_load_chain(ps, c->m, c->tokens, c->keys, 0, NBLK, dst, &got, NULL);
    int r = got;
    for (int i = 0; i < got; i++)
        if (memcmp(dst[i], c->data + (size_t)i * c->raw, c->raw)) r = -1;
    free(buf);
    return r;
}

#define N_CH 12
static struct pstore_model MA, MB;
static struct chain CH[N_CH], FRESH[2];

enum damage { TRUNC_TWO_PAGES, TRUNC_EMPTY, ZERO_META, OVERWRITE_ROOT, N_DAMAGE };
static const char *const damage_name[] = {"truncated to two pages", "truncated to nothing", "meta pages zeroed",
                                          "main root page overwritten"};
enum op { OP_LOAD, OP_CONTAINS, OP_WRITE, N_OP };
static const char *const op_name[] = {"load", "lookup", "write"};

/* The newer meta page's main-database root (LMDB 0.9, 64-bit). */
static uint64_t main_root(int fd)
{
    uint64_t best_txn = 0, root = 0;
    for (int pg = 0; pg < 2; pg++) {
        uint8_t b[PAGE];
        if (pread(fd, b, sizeof b, (off_t)pg * PAGE) != (ssize_t)sizeof b) continue;
        uint64_t txn, r;
        memcpy(&txn, b + 16 + 128, 8);
        memcpy(&r, b + 16 + 72 + 40, 8);
        if (txn >= best_txn) best_txn = txn, root = r;
    }
    return root;
}

static void damage(const char *dir, enum damage d)
{
    char path[600];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    int fd = open(path, O_RDWR);
    if (fd < 0) exit(3);
    uint8_t junk[PAGE];
    uint64_t s = 77;
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)next(&s);
    static const uint8_t zero[2 * PAGE];
    switch (d) {
    case TRUNC_TWO_PAGES:
        if (ftruncate(fd, 2 * PAGE) != 0) exit(3);
        break;
    case TRUNC_EMPTY:
        if (ftruncate(fd, 0) != 0) exit(3);
        break;
    case ZERO_META:
        if (pwrite(fd, zero, sizeof zero, 0) != (ssize_t)sizeof zero) exit(3);
        break;
    case OVERWRITE_ROOT: {
        const uint64_t root = main_root(fd);
        if (root < 2 || pwrite(fd, junk, sizeof junk, (off_t)(root * PAGE)) != (ssize_t)sizeof junk) exit(3);
        break;
    }
    default: break;
    }
    close(fd);
}

/* The child of one case: 0 when everything held, 1 when a check failed. */
static int child_case(const char *dir, enum damage d, enum op op)
{
    struct pstore_opts o = {.n_threads = 3, .quiet = true};
    struct pstore *ps = NULL;
    struct kvb_err err = {{0}};
    if (pstore_open(dir, &o, &ps, &err) != KVB_OK) return fprintf(stderr, "open: %s\n", err.msg), 1;
    for (int i = 0; i < N_CH; i++) chain_put(ps, &CH[i]);
    pstore_flush(ps);
    int bad = 0;
    for (int i = 0; i < N_CH; i++)
        if (chain_load(ps, &CH[i]) != NBLK) bad = 1; /* all there before the damage */
    damage(dir, d);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N_CH; i++) {
            if (op == OP_LOAD && chain_load(ps, &CH[i]) < 0) bad = 1; /* wrong bytes: never */
            if (op == OP_CONTAINS) (void)pstore_contains(ps, &CH[i].keys[NBLK - 1]);
        }
        if (op == OP_WRITE) {
            chain_put(ps, &FRESH[round]);
            pstore_flush(ps);
        }
    }
    struct pstore_stats st;
    pstore_get_stats(ps, &st);
    const bool must_fault = d != OVERWRITE_ROOT;
    if (must_fault && st.map_faults == 0) {
        fprintf(stderr, "no fault counted\n");
        bad = 1;
    }
    if (st.map_faults) {
        /* off: every load a miss, puts dropped */
        if (!st.writing_disabled) bad = 1;
        for (int i = 0; i < N_CH; i++)
            if (chain_load(ps, &CH[i]) != 0) bad = 1;
        const uint64_t dropped = st.blocks_dropped;
        chain_put(ps, &FRESH[0]);
        pstore_flush(ps);
        pstore_get_stats(ps, &st);
        if (st.blocks_dropped < dropped + NBLK) bad = 1;
    }
    pstore_close(ps);
    return bad;
}

static void rm_rf(const char *path)
{
    DIR *dd = opendir(path);
    if (dd) {
        struct dirent *e;
        while ((e = readdir(dd))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            rm_rf(p);
        }
        closedir(dd);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void test_damage_under_use(const char *base)
{
    int n = 0;
    for (int d = 0; d < N_DAMAGE; d++)
        for (int op = 0; op < N_OP; op++) {
            char dir[600];
            snprintf(dir, sizeof dir, "%s/c%d_%d", base, d, op);
            fflush(NULL);
            const pid_t pid = fork();
            if (pid == 0) _exit(child_case(dir, (enum damage)d, (enum op)op));
            int ws = 0;
            waitpid(pid, &ws, 0);
            CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s, then %s: %s %d", damage_name[d], op_name[op],
                      WIFSIGNALED(ws) ? "killed by signal" : "exit", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
            rm_rf(dir);
            n++;
        }
    printf("damage under use: %d cases (4 kinds of damage x load, lookup, write), no crash, no wrong bytes\n", n);
}

/* ---- faults that are not the store's ----------------------------------------- */

static int marker_fd = -1;
static struct sigaction journal_prev;

/* A handler like the crash journal's: says so, puts back what it found, returns. */
static void journal_like(int sig, siginfo_t *info, void *uctx)
{
    (void)info;
    (void)uctx;
    if (write(marker_fd, "J", 1) < 0) {}
    sigaction(sig, &journal_prev, NULL);
}

static void install_journal_like(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = journal_like;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &journal_prev);
}

/* order: 0 no other handler, 1 the journal-like one before the store, 2 after it. */
static void foreign_fault(const char *dir, int order, int *sig, int *marks)
{
    int p[2];
    CHECK(pipe(p) == 0);
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        marker_fd = p[1];
        if (order == 1) install_journal_like();
        struct pstore_opts o = {.n_threads = 1, .quiet = true};
        struct pstore *ps = NULL;
        if (pstore_open(dir, &o, &ps, NULL) != KVB_OK) _exit(3);
        if (order == 2) install_journal_like();
        (void)pstore_contains(ps, &CH[0].keys[0]); /* a region's entry: puts the store's handler back on top */
        /* a real fault, which no sanitizer reports first: a page with no access */
        volatile int *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if ((void *)page == MAP_FAILED) _exit(4);
        *page = 1;
        _exit(0);
    }
    close(p[1]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    char buf[16];
    const ssize_t n = read(p[0], buf, sizeof buf);
    close(p[0]);
    *marks = n > 0 ? (int)n : 0;
    *sig = WIFSIGNALED(ws) ? WTERMSIG(ws) : -WEXITSTATUS(ws);
}

static void test_foreign_faults(const char *base)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/foreign", base);
    for (int order = 0; order < 3; order++) {
        int sig = 0, marks = 0;
        foreign_fault(dir, order, &sig, &marks);
#if defined(__SANITIZE_ADDRESS__)
        /* ASan's own handler is the one before: it reports and exits */
        CHECK_MSG(sig != 0, "a fault outside the store (order %d) did not end the child", order);
#else
        CHECK_MSG(sig == SIGSEGV, "a fault outside the store (order %d) ended the child with %d, not SIGSEGV", order,
                  sig);
#endif
        CHECK_MSG(marks == (order ? 1 : 0), "order %d: the other handler saw the fault %d times", order, marks);
    }
    rm_rf(dir);
    printf("foreign faults: still SIGSEGV, seen once by a journal-like handler installed before or after\n");
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    char base[512];
    snprintf(base, sizeof base, "%s/kvb_live_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    MA = (struct pstore_model){.name = "small", .dtype = PSTORE_DTYPE_F16, .block_size = 4, .n_layer = 2, .kv_dim = 8};
    MB =
        (struct pstore_model){.name = "large", .dtype = PSTORE_DTYPE_F16, .block_size = 16, .n_layer = 2, .kv_dim = 64};
    snprintf(MA.fingerprint, sizeof MA.fingerprint, "%s", FP_A);
    snprintf(MB.fingerprint, sizeof MB.fingerprint, "%s", FP_B);
    for (int i = 0; i < N_CH; i++) chain_make(&CH[i], i % 2 ? &MB : &MA, 100 + (uint64_t)i);
    chain_make(&FRESH[0], &MA, 900);
    chain_make(&FRESH[1], &MB, 901);
    test_damage_under_use(base);
    test_foreign_faults(base);
    rm_rf(base);
    for (int i = 0; i < N_CH; i++) free(CH[i].data);
    free(FRESH[0].data);
    free(FRESH[1].data);
    return tu_finish();
}
