/* test_pstore_damage.c — damage to the cache file's own structure (LMDB's
 * pages, not one value) never crashes a run, and the run's results do not
 * change:
 *  - a small real cache (two models: values inline in leaf pages and values
 *    on overflow pages; a free list, from a GC) is built with the store's
 *    own API;
 *  - a copy of it is then truncated at every page boundary and inside
 *    pages, and, in other copies, every page is overwritten with random
 *    bytes and with zeros. For each copy a child process (so that a crash
 *    is caught as a signal, not suffered) opens it as `cache verify` does
 *    (keep_damaged: must refuse exactly when the structure is damaged),
 *    then as a run does: every loaded block must equal what was stored
 *    (damaged values are misses), new puts, verify, GC and a reload must
 *    work; a damaged file must be moved to a damaged-TIME directory with a message, and
 *    a sound one (a free page overwritten, only free pages cut off) must
 *    not be;
 *  - three processes hammering one cache (open, load, put, close, over and
 *    over) never see it as damaged: the check reads a consistent snapshot.
 * KVB_DAMAGE_SEEDS=N runs the overwrite sweep with N random patterns per
 * page (default 1; scripts/cache-damage-sweep.sh runs more). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/pstore/pstore.h"
#include "store/pstore/pstore_internal.h"
#include "support/testutil.h"

static const char *FP_A = "0123456789abcdef0123456789abcdef";
static const char *FP_B = "fedcba9876543210fedcba9876543210";

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static struct pstore_model model(const char *fp, int bs, int n_layer, int kv_dim)
{
    struct pstore_model m = {
        .name = "damage test model", .dtype = PSTORE_DTYPE_F16, .block_size = bs, .n_layer = n_layer, .kv_dim = kv_dim};
    snprintf(m.fingerprint, sizeof m.fingerprint, "%s", fp);
    return m;
}

static size_t raw_bytes(const struct pstore_model *m)
{
    return (size_t)m->n_layer * 2 * (size_t)m->block_size * (size_t)m->kv_dim * 2;
}

/* ---- chains: deterministic from (model, seed), so a child rebuilds them ------------- */

#define NBLK_MAX 6

struct chain {
    const struct pstore_model *m;
    int n;
    int32_t tokens[NBLK_MAX * 16];
    struct pstore_key keys[NBLK_MAX];
    uint8_t *data; /* n * raw */
    size_t raw;
};

static void chain_make(struct chain *c, const struct pstore_model *m, int n, uint64_t seed)
{
    c->m = m;
    c->n = n;
    c->raw = raw_bytes(m);
    c->data = malloc(c->raw * (size_t)n);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n * m->block_size; i++) c->tokens[i] = (int32_t)(rng_next(&s) % 49152);
    for (size_t i = 0; i < c->raw * (size_t)n; i++) c->data[i] = (uint8_t)(rng_next(&s) >> 29);
    pstore_chain_keys(m, c->tokens, n, c->keys);
}

static void chain_put(struct pstore *ps, const struct chain *c)
{
    for (int i = 0; i < c->n; i++)
        pstore_put(ps, c->m, &c->keys[i], i ? &c->keys[i - 1] : NULL, c->tokens + (size_t)i * (size_t)c->m->block_size,
                   c->data + (size_t)i * c->raw);
}

/* Blocks loaded, or -1 when a loaded block differs from what was stored. */
static int chain_load(struct pstore *ps, const struct chain *c)
{
    uint8_t *buf = malloc(c->raw * (size_t)c->n);
    void *dst[NBLK_MAX];
    for (int i = 0; i < c->n; i++) dst[i] = buf + (size_t)i * c->raw;
    int32_t got = 0;
    pstore_load_chain(ps, c->m, c->tokens, c->keys, 0, c->n, dst, &got, NULL);
    int r = got;
    for (int i = 0; i < got; i++)
        if (memcmp(dst[i], c->data + (size_t)i * c->raw, c->raw)) r = -1;
    free(buf);
    return r;
}

/* The fixture: model A's blocks are 256 bytes (inline in leaf pages),
 * model B's 8 KiB of incompressible bytes (overflow pages). */
#define N_A 30
#define N_B 6
static struct pstore_model MA, MB;
static struct chain CA[N_A], CB[N_B], NEW_A, NEW_B;

static void fixture_make(void)
{
    MA = model(FP_A, 4, 2, 8);
    MB = model(FP_B, 16, 2, 64);
    for (int i = 0; i < N_A; i++) chain_make(&CA[i], &MA, 5, 100 + (uint64_t)i);
    for (int i = 0; i < N_B; i++) chain_make(&CB[i], &MB, 4, 200 + (uint64_t)i);
    chain_make(&NEW_A, &MA, 3, 900);
    chain_make(&NEW_B, &MB, 2, 901);
}

static struct pstore *store_open(const char *dir, bool keep_damaged, bool quiet, struct kvb_err *err)
{
    struct pstore_opts o = {.n_threads = 1, .quiet = quiet, .keep_damaged = keep_damaged};
    struct pstore *ps = NULL;
    return pstore_open(dir, &o, &ps, err) == KVB_OK ? ps : NULL;
}

static void build_cache(const char *dir)
{
    struct kvb_err err = {{0}};
    struct pstore *ps = store_open(dir, false, true, &err);
    CHECK_MSG(ps != NULL, "%s", err.msg);
    if (!ps) return;
    /* B first: the GC below evicts least recently used blocks, so it frees
     * overflow pages and leaves A's leaf and branch pages. */
    for (int i = 0; i < N_B; i++) chain_put(ps, &CB[i]);
    pstore_flush(ps);
    for (int i = 0; i < N_A; i++) chain_put(ps, &CA[i]);
    pstore_flush(ps);
    /* A GC leaves freed pages in the free list; later puts reuse some. */
    struct pstore_stats st;
    pstore_get_stats(ps, &st);
    uint64_t n = 0;
    CHECK(pstore_gc(ps, st.bytes_written * 3 / 4, &n, &err) == KVB_OK);
    CHECK(n > 0);
    chain_put(ps, &CB[0]);
    pstore_flush(ps);
    pstore_close(ps);
}

/* ---- files ----------------------------------------------------------------------------- */

static void rm_rf(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            rm_rf(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, len, f) == len);
    if (f) fclose(f);
}

/* The name of a damaged-* directory under dir holding data.mdb, or "". */
static void find_set_aside(const char *dir, char *out, size_t cap)
{
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "damaged-", 8)) continue;
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s/data.mdb", dir, e->d_name);
        if (stat(p, &st) == 0) snprintf(out, cap, "%s", e->d_name);
    }
    closedir(d);
}

/* ---- one damaged copy ------------------------------------------------------------------- */

/* Child exit codes. */
enum {
    X_SOUND = 0,       /* the verify-style open accepted it, and the run-style use worked */
    X_REFUSED = 10,    /* the verify-style open refused it as damaged, and the run-style use worked */
    X_OPEN_OTHER = 20, /* the verify-style open failed otherwise */
    X_RUN_OPEN = 21,   /* the run-style open failed */
    X_MISMATCH = 22,   /* a loaded block differs from what was stored */
    X_VERIFY = 23,
    X_GC = 24,
    X_RELOAD = 25 /* new puts did not load back */
};

static int child_use(const char *dir)
{
    struct kvb_err err = {{0}};
    int code = X_SOUND;
    struct pstore *ps = store_open(dir, true, true, &err);
    if (ps) {
        pstore_close(ps);
    } else {
        if (!strstr(err.msg, "is damaged")) {
            fprintf(stderr, "verify-style open: %s\n", err.msg);
            return X_OPEN_OTHER;
        }
        fprintf(stderr, "verify-style open: %s\n", err.msg);
        code = X_REFUSED;
    }
    ps = store_open(dir, false, false, &err);
    if (!ps) {
        fprintf(stderr, "run-style open: %s\n", err.msg);
        return X_RUN_OPEN;
    }
    for (int i = 0; i < N_A; i++)
        if (chain_load(ps, &CA[i]) < 0) return X_MISMATCH;
    for (int i = 0; i < N_B; i++)
        if (chain_load(ps, &CB[i]) < 0) return X_MISMATCH;
    uint64_t n_bad = 0, n_ev = 0;
    if (pstore_verify(ps, NULL, &n_bad, &err) != KVB_OK) {
        fprintf(stderr, "verify: %s\n", err.msg);
        return X_VERIFY;
    }
    if (pstore_gc(ps, 64 << 10, &n_ev, &err) != KVB_OK) {
        fprintf(stderr, "gc: %s\n", err.msg);
        return X_GC;
    }
    chain_put(ps, &NEW_A);
    chain_put(ps, &NEW_B);
    pstore_flush(ps);
    struct pstore_stats st;
    pstore_get_stats(ps, &st);
    int a = chain_load(ps, &NEW_A), b = chain_load(ps, &NEW_B);
    if (a < 0 || b < 0) return X_MISMATCH;
    if (a != NEW_A.n || b != NEW_B.n) {
        fprintf(stderr, "reload: %d/%d and %d/%d blocks (writing %s)\n", a, NEW_A.n, b, NEW_B.n,
                st.writing_disabled ? "off" : "on");
        return X_RELOAD;
    }
    for (int i = 0; i < N_A; i++)
        if (chain_load(ps, &CA[i]) < 0) return X_MISMATCH;
    pstore_close(ps);
    return code;
}

struct tally {
    int cases, refused, sound, failed;
};

/* Runs one damaged copy in dir; expect_damaged: the structure is broken. */
static void run_case(const char *dir, bool expect_damaged, const char *what, struct tally *t)
{
    char errpath[1024];
    snprintf(errpath, sizeof errpath, "%s.stderr", dir);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        _exit(child_use(dir));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t elen = 0;
    char *emsg = (char *)slurp(errpath, &elen);
    if (emsg) emsg[elen] = '\0';
    char aside[256];
    find_set_aside(dir, aside, sizeof aside);
    t->cases++;
    bool ok = true;
    if (WIFSIGNALED(status)) {
        CHECK_MSG(0, "%s: the process died of signal %d (%s)", what, WTERMSIG(status), strsignal(WTERMSIG(status)));
        ok = false;
    } else {
        int code = WEXITSTATUS(status);
        if (expect_damaged) {
            CHECK_MSG(code == X_REFUSED, "%s: damaged structure, child exit %d (10 expected)", what, code);
            CHECK_MSG(aside[0] != '\0', "%s: the damaged file was not moved aside", what);
            CHECK_MSG(emsg && strstr(emsg, "is damaged") && strstr(emsg, "Moved it to"),
                      "%s: no message saying the file was moved", what);
            ok = code == X_REFUSED && aside[0];
            if (ok) t->refused++;
        } else {
            CHECK_MSG(code == X_SOUND, "%s: sound structure, child exit %d (0 expected)", what, code);
            CHECK_MSG(aside[0] == '\0', "%s: a sound file was moved aside", what);
            ok = code == X_SOUND && !aside[0];
            if (ok) t->sound++;
        }
    }
    if (!ok) {
        t->failed++;
        if (emsg) fprintf(stderr, "  %s: child stderr:\n%s", what, emsg);
    }
    free(emsg);
    unlink(errpath);
}

static void fresh_copy(const char *dir, const uint8_t *img, size_t len)
{
    rm_rf(dir);
    CHECK(mkdir(dir, 0755) == 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    spit(p, img, len);
}

static bool in_use(uint8_t kind)
{
    return kind == PSTORE_PAGE_META || kind == PSTORE_PAGE_BRANCH || kind == PSTORE_PAGE_LEAF ||
           kind == PSTORE_PAGE_OVERFLOW_HEAD || kind == PSTORE_PAGE_OVERFLOW;
}

/* Overwrites of these must be caught by the structural check; the others
 * (value bytes on overflow pages, free or unreached pages) must not be. */
static bool structural(uint8_t kind)
{
    return kind == PSTORE_PAGE_META || kind == PSTORE_PAGE_BRANCH || kind == PSTORE_PAGE_LEAF ||
           kind == PSTORE_PAGE_OVERFLOW_HEAD;
}

static void test_damage_sweep(const char *base)
{
    char pristine[600], work[600], data[1024];
    snprintf(pristine, sizeof pristine, "%s/pristine", base);
    snprintf(work, sizeof work, "%s/case", base);
    CHECK(mkdir(pristine, 0755) == 0);
    build_cache(pristine);
    snprintf(data, sizeof data, "%s/data.mdb", pristine);
    size_t len = 0;
    uint8_t *img = slurp(data, &len);
    CHECK(img != NULL);
    if (!img) return;

    /* What each page is, from the check itself on the pristine file. */
    MDB_env *env;
    CHECK(mdb_env_create(&env) == 0);
    mdb_env_set_maxdbs(env, 8);
    CHECK(mdb_env_open(env, pristine, MDB_NOTLS, 0644) == 0);
    MDB_stat est;
    mdb_env_stat(env, &est);
    const size_t psize = est.ms_psize, n_pages = len / psize;
    uint8_t *kinds = calloc(n_pages + 1, 1);
    struct pstore_check c = {.kinds = kinds, .n_kinds = n_pages};
    CHECK_EQ_INT(pstore_env_check(env, &c), 0);
    CHECK_MSG(!c.damaged, "the pristine cache is called damaged: %s", c.why);
    mdb_env_close(env);
    int count[8] = {0};
    size_t need_pages = 0;
    for (size_t p = 0; p < n_pages; p++) {
        count[kinds[p]]++;
        if (in_use(kinds[p])) need_pages = p + 1;
    }
    printf("cache of %zu pages of %zu bytes: %d meta, %d branch, %d leaf, %d overflow heads, %d overflow, "
           "%d free, %d unreached; %llu pages read by the check\n",
           n_pages, psize, count[PSTORE_PAGE_META], count[PSTORE_PAGE_BRANCH], count[PSTORE_PAGE_LEAF],
           count[PSTORE_PAGE_OVERFLOW_HEAD], count[PSTORE_PAGE_OVERFLOW], count[PSTORE_PAGE_FREE],
           count[PSTORE_PAGE_UNREACHED], (unsigned long long)c.pages_read);
    CHECK(count[PSTORE_PAGE_BRANCH] > 0 && count[PSTORE_PAGE_LEAF] > 0 && count[PSTORE_PAGE_OVERFLOW_HEAD] > 0 &&
          count[PSTORE_PAGE_OVERFLOW] > 0 && count[PSTORE_PAGE_FREE] > 0);

    struct tally t = {0};
    char what[128];
    /* Truncations: every page boundary, and into the middle of some pages. */
    for (size_t k = 1; k <= n_pages; k++) {
        size_t cuts[2] = {k * psize, k * psize - psize / 2 - 7};
        for (int j = 0; j < 2; j++) {
            if (j == 1 && k % 4) continue;
            size_t cut = cuts[j];
            if (cut >= len) continue;
            fresh_copy(work, img, cut);
            snprintf(what, sizeof what, "truncated to %zu bytes", cut);
            run_case(work, cut / psize < need_pages, what, &t);
        }
    }
    const char *seeds_env = getenv("KVB_DAMAGE_SEEDS");
    int seeds = seeds_env ? atoi(seeds_env) : 1;
    if (seeds < 1) seeds = 1;
    uint8_t *copy = malloc(len);
    uint64_t s = 12345;
    for (size_t p = 0; p < n_pages; p++) {
        for (int v = 0; v <= seeds; v++) {
            memcpy(copy, img, len);
            if (v == 0) {
                memset(copy + p * psize, 0, psize);
            } else {
                for (size_t i = 0; i < psize; i++) copy[p * psize + i] = (uint8_t)(rng_next(&s) >> 40);
            }
            fresh_copy(work, copy, len);
            snprintf(what, sizeof what, "page %zu (kind %d) overwritten with %s", p, kinds[p],
                     v ? "random bytes" : "zeros");
            run_case(work, structural(kinds[p]), what, &t);
        }
    }
    printf("%d damaged copies: %d refused and moved aside, %d sound and used; %d failed\n", t.cases, t.refused, t.sound,
           t.failed);
    rm_rf(work);
    free(copy);
    free(kinds);
    free(img);
}

/* ---- values rewritten through LMDB's API --------------------------------------------------- */

/* Whether LMDB's own cursor sees the blocks database as a sorted set
 * whose every key it can find again. */
static bool lmdb_consistent(MDB_env *env)
{
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    uint8_t prev[16];
    int n = 0, bad = 0;
    CHECK(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0);
    CHECK(mdb_dbi_open(txn, "blocks", 0, &dbi) == 0);
    CHECK(mdb_cursor_open(txn, dbi, &cur) == 0);
    for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 16 || (n && memcmp(prev, k.mv_data, 16) >= 0)) bad++;
        if (k.mv_size == 16) memcpy(prev, k.mv_data, 16);
        MDB_val g;
        if (mdb_get(txn, dbi, &k, &g) != 0) bad++;
        n++;
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return bad == 0;
}

/* Rewrites every value of the blocks database through LMDB (garbage,
 * halved, cut to 5 bytes): with mdb_put, LMDB keeps its structure sound,
 * the check must agree, and the store takes the values as misses. The
 * same through mdb_cursor_put(MDB_CURRENT) while iterating, which LMDB
 * 0.9.24 gets wrong when the size changes (keys end up out of order, some
 * unfindable): the check must call that damaged exactly when LMDB's own
 * cursor sees the disorder. */
static void test_value_rewrites(const char *base)
{
    for (int via_cursor = 0; via_cursor < 2; via_cursor++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/rewrites%d", base, via_cursor);
        CHECK(mkdir(dir, 0755) == 0);
        build_cache(dir);
        MDB_env *env;
        MDB_txn *txn;
        MDB_dbi dbi;
        MDB_cursor *cur;
        MDB_val k, v;
        CHECK(mdb_env_create(&env) == 0);
        mdb_env_set_maxdbs(env, 8);
        CHECK(mdb_env_open(env, dir, MDB_NOTLS, 0644) == 0);
        CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0);
        CHECK(mdb_dbi_open(txn, "blocks", 0, &dbi) == 0);
        CHECK(mdb_cursor_open(txn, dbi, &cur) == 0);
        int n = 0;
        struct {
            uint8_t key[16];
            uint8_t *val;
            size_t len;
        } *all = calloc(4096, sizeof *all);
        for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && n < 4096;
             rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            size_t len = v.mv_size;
            uint8_t *val = malloc(len);
            memcpy(val, v.mv_data, len);
            switch (n % 3) {
            case 0:
                for (size_t i = 0; i < len; i++) val[i] = (uint8_t)(i * 131 + 7);
                break;
            case 1: len /= 2; break;
            case 2: len = 5; break;
            }
            if (via_cursor) {
                MDB_val nv = {len, val};
                CHECK(mdb_cursor_put(cur, &k, &nv, MDB_CURRENT) == 0);
                free(val);
            } else {
                memcpy(all[n].key, k.mv_data, 16);
                all[n].val = val;
                all[n].len = len;
            }
            n++;
        }
        mdb_cursor_close(cur);
        for (int i = 0; !via_cursor && i < n; i++) {
            MDB_val nk = {16, all[i].key}, nv = {all[i].len, all[i].val};
            CHECK(mdb_put(txn, dbi, &nk, &nv, 0) == 0);
            free(all[i].val);
        }
        free(all);
        CHECK(mdb_txn_commit(txn) == 0);
        struct pstore_check c = {0};
        CHECK_EQ_INT(pstore_env_check(env, &c), 0);
        bool consistent = lmdb_consistent(env);
        mdb_env_close(env);
        printf("%d values rewritten through %s: LMDB's cursor finds the tree %s, the check calls it %s%s%s\n", n,
               via_cursor ? "mdb_cursor_put(MDB_CURRENT)" : "mdb_put", consistent ? "in order" : "out of order",
               c.damaged ? "damaged (" : "sound", c.damaged ? c.why : "", c.damaged ? ")" : "");
        CHECK_MSG(c.damaged == !consistent, "the check (%s) disagrees with LMDB's own cursor (%s)",
                  c.damaged ? "damaged" : "sound", consistent ? "in order" : "out of order");
        if (!via_cursor) {
            CHECK(consistent);
            struct kvb_err err = {{0}};
            struct pstore *ps = store_open(dir, true, true, &err);
            CHECK_MSG(ps != NULL, "%s", err.msg);
            for (int i = 0; ps && i < N_A; i++) CHECK_EQ_INT(chain_load(ps, &CA[i]), 0);
            pstore_close(ps);
        }
    }
}

/* ---- no false alarms under concurrent writers ------------------------------------------- */

static int hammer(const char *dir, int who, double seconds)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t s = 777 + (uint64_t)who;
    int rounds = 0;
    for (;;) {
        struct kvb_err err = {{0}};
        struct pstore *ps = store_open(dir, true, true, &err);
        if (!ps) {
            fprintf(stderr, "process %d, round %d: %s\n", who, rounds, err.msg);
            return 1;
        }
        struct pstore_stats st;
        pstore_get_stats(ps, &st);
        if (st.set_aside) return 2;
        for (int i = 0; i < 4; i++) {
            struct chain c;
            chain_make(&c, (rng_next(&s) & 1) ? &MA : &MB, 3, 1000 * (uint64_t)who + (rng_next(&s) % 40));
            if (chain_load(ps, &c) < 0) return 3;
            chain_put(ps, &c);
            free(c.data);
        }
        if (rounds % 3 == 0) pstore_flush(ps);
        if (rounds % 5 == 4) {
            uint64_t n;
            pstore_gc(ps, 256 << 10, &n, NULL);
        }
        pstore_close(ps);
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) > seconds) break;
    }
    printf("process %d: %d opens, no false alarm\n", who, rounds);
    return 0;
}

static void test_concurrent(const char *base)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/shared", base);
    CHECK(mkdir(dir, 0755) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(hammer(dir, i, 3.0));
    }
    for (int i = 0; i < 3; i++) {
        int status = 0;
        waitpid(pids[i], &status, 0);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: status 0x%x", i, status);
    }
    char aside[256];
    find_set_aside(dir, aside, sizeof aside);
    CHECK_MSG(aside[0] == '\0', "a shared cache was moved aside: %s", aside);
}

/* The messages for LMDB codes that mean a damaged file say what to do
 * (issue 18: "MDB_CURSOR_FULL: Internal error" said nothing). */
static void test_messages(void)
{
    const int codes[] = {MDB_CORRUPTED, MDB_PAGE_NOTFOUND, MDB_CURSOR_FULL, MDB_PAGE_FULL, MDB_INVALID};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        struct kvb_err err = {{0}};
        pstore_lmdb_status(&err, codes[i], "cache read");
        CHECK_MSG(strstr(err.msg, "damaged") && strstr(err.msg, "kvbatch cache verify"), "%s", err.msg);
    }
    struct kvb_err err = {{0}};
    pstore_lmdb_status(&err, MDB_MAP_FULL, "writing");
    CHECK_MSG(!strstr(err.msg, "damaged"), "%s", err.msg);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    char base[512];
    snprintf(base, sizeof base, "%s/kvb_damage_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    fixture_make();
    test_messages();
    test_value_rewrites(base);
    test_damage_sweep(base);
    test_concurrent(base);
    rm_rf(base);
    return tu_finish();
}
