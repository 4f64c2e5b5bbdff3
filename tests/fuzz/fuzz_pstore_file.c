/* fuzz_pstore_file.c — libFuzzer target for the structural check of the
 * cache's LMDB file (store/pstore_check.c): whatever bytes data.mdb holds,
 * the check ends in "sound" or "damaged, because ...", and a file it calls
 * sound is one LMDB can read and write without faulting.
 *
 * Input: the bytes of data.mdb (no lock file). The harness writes them to a
 * private directory and does what pstore_open does: pstore_file_check on
 * the meta pages, and when they pass, opens them with LMDB (which must not
 * fault: it trusts the page size) and runs pstore_env_check. When that says
 * sound:
 *   - every named database is walked with a cursor, every key and value
 *     byte is read, and every key is found again by mdb_get (the check
 *     promised keys in order);
 *   - a write transaction deletes the first entry of each named database
 *     (freeing its overflow pages: LMDB trusts their headers), inserts a
 *     small and a big value, and commits (allocating from the free list);
 *   - the check, run again on what LMDB wrote, must still say sound.
 * A fault (ASan, a signal) or a property that fails traps, so the replay
 * test fails too. This file is test code: it may stop the process. */
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/pstore/pstore_internal.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_pstore_file: %s:%d: %s\n", __FILE__, __LINE__, #c);                                  \
            __builtin_trap();                                                                                          \
        }                                                                                                              \
    } while (0)

#define MAX_NAMES 6

static char dir[64];

static void cleanup(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        REQUIRE(n > 0);
        off += (size_t)n;
    }
    close(fd);
}

/* Names of the named databases (main database keys without a NUL). */
static int list_names(MDB_txn *txn, char names[MAX_NAMES][64])
{
    MDB_dbi main;
    if (mdb_dbi_open(txn, NULL, 0, &main) != 0) return 0;
    MDB_cursor *cur;
    REQUIRE(mdb_cursor_open(txn, main, &cur) == 0);
    MDB_val k, v;
    int n = 0;
    for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && n < MAX_NAMES;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size == 0 || k.mv_size >= 64 || memchr(k.mv_data, 0, k.mv_size)) continue;
        memcpy(names[n], k.mv_data, k.mv_size);
        names[n][k.mv_size] = '\0';
        n++;
    }
    mdb_cursor_close(cur);
    return n;
}

static volatile unsigned sink; /* the bytes read go somewhere */

static void read_all(MDB_env *env)
{
    MDB_txn *txn;
    REQUIRE(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0);
    char names[MAX_NAMES][64];
    int n = list_names(txn, names);
    unsigned sum = 0;
    for (int i = 0; i < n; i++) {
        MDB_dbi dbi;
        if (mdb_dbi_open(txn, names[i], 0, &dbi) != 0) continue;
        MDB_cursor *cur;
        REQUIRE(mdb_cursor_open(txn, dbi, &cur) == 0);
        MDB_val k, v;
        int rc;
        for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            for (size_t j = 0; j < k.mv_size; j++) sum += ((const uint8_t *)k.mv_data)[j];
            for (size_t j = 0; j < v.mv_size; j++) sum += ((const uint8_t *)v.mv_data)[j];
            MDB_val g;
            REQUIRE(mdb_get(txn, dbi, &k, &g) == 0);
            REQUIRE(g.mv_size == v.mv_size);
        }
        REQUIRE(rc == MDB_NOTFOUND);
        mdb_cursor_close(cur);
    }
    sink = sum;
    mdb_txn_abort(txn);
}

static void write_some(MDB_env *env)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(env, NULL, 0, &txn);
    if (rc) return; /* e.g. a map too small for the file: nothing written */
    char names[MAX_NAMES][64];
    int n = list_names(txn, names);
    static uint8_t big[9000];
    for (size_t j = 0; j < sizeof big; j++) big[j] = (uint8_t)(j * 7);
    for (int i = 0; i < n && rc == 0; i++) {
        MDB_dbi dbi;
        if (mdb_dbi_open(txn, names[i], 0, &dbi) != 0) continue;
        MDB_cursor *cur;
        REQUIRE(mdb_cursor_open(txn, dbi, &cur) == 0);
        MDB_val k, v;
        if (mdb_cursor_get(cur, &k, &v, MDB_FIRST) == 0) rc = mdb_cursor_del(cur, 0);
        mdb_cursor_close(cur);
        uint8_t key[16] = {0xfe, 0xed, (uint8_t)i};
        MDB_val nk = {sizeof key, key}, nv = {40, big};
        if (rc == 0) rc = mdb_put(txn, dbi, &nk, &nv, 0);
        key[3] = 1;
        nv.mv_size = sizeof big;
        if (rc == 0) rc = mdb_put(txn, dbi, &nk, &nv, 0);
    }
    /* MAP_FULL and the like are fine; a fault is not. */
    if (rc == 0) mdb_txn_commit(txn);
    else mdb_txn_abort(txn);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvb_fuzz_file_XXXXXX");
        REQUIRE(mkdtemp(dir) != NULL);
        atexit(cleanup);
    }
    char path[128], lock[128];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    snprintf(lock, sizeof lock, "%s/lock.mdb", dir);
    unlink(lock);
    write_file(path, data, size);

    /* What pstore_open does: the meta pages by pread first (mdb_env_open
     * trusts them), then LMDB, then the walk. */
    struct pstore_check c = {0};
    pstore_file_check(path, &c);
    if (c.damaged) return 0;

    MDB_env *env;
    REQUIRE(mdb_env_create(&env) == 0);
    mdb_env_set_maxdbs(env, 8);
    mdb_env_set_mapsize(env, (size_t)64 << 20);
    if (mdb_env_open(env, dir, MDB_NOTLS | MDB_NOSYNC, 0644) != 0) {
        mdb_env_close(env);
        return 0;
    }
    memset(&c, 0, sizeof c);
    int crc = pstore_env_check(env, &c);
    if (crc) fprintf(stderr, "fuzz_pstore_file: check: %s\n", mdb_strerror(crc));
    REQUIRE(crc == 0);
    if (!c.damaged) {
        read_all(env);
        write_some(env);
        struct pstore_check again = {0};
        REQUIRE(pstore_env_check(env, &again) == 0);
        if (again.damaged)
            fprintf(stderr, "fuzz_pstore_file: sound, then damaged after LMDB's writes: %s\n", again.why);
        REQUIRE(!again.damaged);
        read_all(env);
    }
    mdb_env_close(env);
    return 0;
}
