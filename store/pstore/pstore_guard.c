/* pstore_guard.c — reading the cache through LMDB's map without letting a
 * file damaged under the running process crash it.
 *
 * The open-time check (pstore_check.c) covers a file damaged before the run.
 * Another process can still damage it during the run: truncate it (every
 * page past the new end then raises SIGBUS when touched), zero its meta
 * pages (LMDB then follows page numbers from nothing and trips its own
 * assertions, abort()), overwrite a branch page (wild page numbers:
 * SIGSEGV). LMDB reads every page through the shared map — in
 * mdb_txn_begin, in every cursor step, in the writer's own transactions —
 * and hands out values as pointers into it, which the decoding threads
 * read. So:
 *   - copying values out with pread would not do: the B-tree's pages are
 *     read through the map before any value is reached, and the writer's
 *     transactions read it too (it would mean re-implementing LMDB's
 *     reader and writer);
 *   - checking the file's size before each read would not do: the damage
 *     can come between the check and the read, and zeroed or overwritten
 *     pages keep the size;
 *   - so every stretch of code that touches the map runs in a guarded
 *     region: a SIGBUS or SIGSEGV raised inside one (or an LMDB assertion,
 *     through mdb_env_set_assert) jumps back to the region's start
 *     (sigsetjmp), which ends its transaction, releases the environment
 *     lock, and turns the store off for the rest of the process: reads are
 *     misses, puts are dropped. A load cut short this way is a miss, so the
 *     run's results are what they would be without a cache; the next run's
 *     open-time check finds the damage and moves the file aside.
 * The store is turned off rather than reopened: a reopen would have to
 * check and move aside a file other processes may be using, mid-run, for a
 * cache that only saves recomputation.
 *
 * Regions are per thread (a thread-local pointer to the innermost one) and
 * nest. Outside a region the handler hands the signal to whatever handled
 * it before (the crash journal, a sanitizer, the default action), as the
 * crash journal does, so a fault elsewhere is still a crash with its
 * signal. The handler is installed when a store is opened and stays; a
 * region's entry puts it back on top when something installed later has
 * replaced it (the crash journal restores the handlers it found when it
 * closes). A fault inside a region that is not the file's doing (a bug in
 * the decoder) is also caught, and reported the same way: as the cache
 * being turned off, with the signal named. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "store/pstore/pstore_internal.h"

static _Thread_local struct pstore_guard *current;

static struct sigaction prev_bus, prev_segv;
static atomic_int handed_on; /* a fault outside any region was handed on once already */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

static void on_fault(int sig, siginfo_t *info, void *uctx);

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK; /* the crash journal's alternate stack, when there is one */
    sigaction(SIGBUS, &sa, &prev_bus);
    sigaction(SIGSEGV, &sa, &prev_segv);
}

static void on_fault(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    struct pstore_guard *g = current;
    if (g) {
        current = g->prev;
        g->sig = sig;
        siglongjmp(g->jb, 1);
    }
    /* Not a cache read: to whoever handled it before. If that handler hands
     * it back to this one (it was installed before this one and this one
     * later put itself on top again), the default action ends the loop. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    const bool again = atomic_exchange(&handed_on, 1);
    sigaction(sig, again ? &dfl : sig == SIGBUS ? &prev_bus : &prev_segv, NULL);
    if (!info || info->si_code <= 0) raise(sig); /* sent, not raised by the faulting instruction: send it again */
}

void pstore_guard_install(void) { pthread_once(&install_once, install); }

/* The handler back on top when something installed later replaced it. */
static void rearm(void)
{
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault &&
        sigaction(SIGSEGV, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault)
        return;
    install();
}

void pstore_guard_push(struct pstore_guard *g)
{
    g->prev = current;
    g->txn = NULL;
    g->env_locked = false;
    g->sig = 0;
    g->what[0] = '\0';
    if (!g->prev) rearm();
    current = g;
}

void pstore_guard_pop(struct pstore_guard *g)
{
    if (current == g) current = g->prev;
}

struct pstore_guard *pstore_guard_current(void) { return current; }

void pstore_guard_assert(MDB_env *env, const char *msg)
{
    (void)env;
    struct pstore_guard *g = current;
    if (!g) return; /* outside a region LMDB aborts, as it would have */
    snprintf(g->what, sizeof g->what, "%s", msg);
    current = g->prev;
    g->sig = SIGABRT;
    siglongjmp(g->jb, 1);
}

static const char *fault_name(int sig)
{
    return sig == SIGBUS ? "SIGBUS" : sig == SIGSEGV ? "SIGSEGV" : sig == SIGABRT ? "an LMDB assertion" : "a fault";
}

void pstore_guard_fault(struct pstore *ps, struct pstore_guard *g, const char *doing)
{
    if (g->txn) {
        mdb_txn_abort(g->txn); /* touches the lock file and the heap, not the map */
        g->txn = NULL;
    }
    if (g->env_locked) {
        pthread_rwlock_unlock(&ps->env_lock);
        g->env_locked = false;
    }
    pstore_guard_off(ps, g->sig, g->what, doing);
}

void pstore_guard_off(struct pstore *ps, int sig, const char *what, const char *doing)
{
    atomic_store(&ps->broken, true);
    pthread_mutex_lock(&ps->mu);
    ps->stats.writing_disabled = true;
    ps->stats.map_faults++;
    const bool say = !ps->warned_fault && !ps->opts.quiet;
    ps->warned_fault = true;
    pthread_mutex_unlock(&ps->mu);
    if (say)
        fprintf(stderr,
                "kvbatch: persistent cache: %s/data.mdb changed under this process (%s while %s%s%s): the cache is "
                "off for the rest of this run (results are not affected: what it would have given is computed); "
                "the next run checks the file and moves it aside if it is damaged\n",
                ps->dir, fault_name(sig), doing, what && what[0] ? ": " : "", what ? what : "");
}
