/* crashlog.h — a journal beside a run's output, so that an input line that
 * crashes the process is not run again, and again, by every --resume.
 *
 * Records, one text line each, appended with write(2) so that they reach
 * the file even when the process dies right after:
 *   start PID               a run began
 *   crash SIG LINE HASH P   a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 *                           SIGABRT): LINE is the input line whose work the
 *                           crashing thread was doing (0: none known), HASH
 *                           its bytes' hash (0: not known), P 'p' while the
 *                           line was being parsed (its custom_id unknown),
 *                           'r' after
 *   inflight LINE HASH      after a crash that names no line: every line in
 *                           flight then
 *   end STATUS              the run ended in a way it controls (done, failed,
 *                           SIGINT/SIGTERM)
 * A run killed by SIGKILL (or the machine going down) writes nothing after
 * its start: nothing about its lines is suspect, and resume runs them again.
 *
 * Which line is to blame: the crashing thread's mark (crashlog_mark_line,
 * crashlog_mark_uid) when it has one; else, when exactly one line is in
 * flight (crashlog_track), that line, since it is the only work there is;
 * else none, and the lines in flight are listed for the next run, which
 * runs each of them alone (see runner.c) so that a second crash names one.
 *
 * The handler uses only async-signal-safe calls (write, sigaction, raise)
 * and memory set up beforehand, then hands the signal to the handler that
 * was there before (the default action, or a sanitizer's report), so the
 * exit status is still 128 + SIG.
 *
 * State: one journal per process (a run is one per process); the module
 * owns it, as the signal handler must reach it. Marks are thread-local. */
#ifndef KVB_CRASHLOG_H
#define KVB_CRASHLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* One input line a journal names. */
struct crashlog_line {
    uint64_t line_no; /* 1-based */
    uint64_t hash;    /* crashlog_hash of its bytes; 0: not known (matches any bytes) */
    char phase;       /* blamed lines: 'p' crashed while parsed, 'r' after */
    int sig;          /* blamed lines: the signal */
};

/* What earlier runs recorded, over the whole journal. */
struct crashlog_history {
    struct crashlog_line *blamed; /* (n_blamed) lines a crash named */
    size_t n_blamed;
    struct crashlog_line *suspects; /* (n_suspects) lines in flight at crashes that named none */
    size_t n_suspects;
    int n_runs, n_crashes;
};

/* Reads the journal at path (a missing file is an empty history).
 * KVB_ERR_IO, KVB_ERR_NOMEM. Lines it cannot read are skipped. */
enum kvb_status crashlog_read(const char *path, struct crashlog_history *h, struct kvb_err *err);
void crashlog_history_free(struct crashlog_history *h); /* accepts a zeroed one */

/* The entry of v[n] for line_no whose hash matches (or is 0), or NULL. */
const struct crashlog_line *crashlog_find(const struct crashlog_line *v, size_t n, uint64_t line_no, uint64_t hash);

/* A line's identity in the journal (never 0). */
uint64_t crashlog_hash(const void *data, size_t len);

/* Opens the journal (appending to what is there), writes a start record, makes a table of n_entries in-flight entries, and installs
 * the handler for the fatal signals. uid_div: crashlog_mark_uid(u) names
 * entry u / uid_div. KVB_ERR_IO, KVB_ERR_NOMEM, KVB_ERR_INVALID_ARG when a
 * journal is already open. */
enum kvb_status crashlog_open(const char *path, int32_t n_entries, uint64_t uid_div, struct kvb_err *err);

/* Empties the open journal and writes a new start record: a run that
 * starts afresh (no --resume) calls it once it is sure to run, so that a
 * run that could not start leaves an earlier run's records for a resume. */
void crashlog_restart(void);

/* Entry `entry` now holds line_no (hash of its bytes); line_no 0 frees it. */
void crashlog_track(int32_t entry, uint64_t line_no, uint64_t hash);

/* The calling thread now works on line_no (phase 'p' or 'r'); line_no 0
 * clears the mark. */
void crashlog_mark_line(uint64_t line_no, uint64_t hash, char phase);
/* The calling thread now works for scheduler user id uid (its entry is
 * uid / uid_div); UINT64_MAX clears the mark. Cheap: callable per token. */
void crashlog_mark_uid(uint64_t uid);

/* Writes "end STATUS", restores the signal handlers, closes the journal
 * and, with remove_file, deletes it (a finished job leaves nothing to
 * resume). Accepts no open journal. */
void crashlog_close(const char *status, bool remove_file);

#endif
