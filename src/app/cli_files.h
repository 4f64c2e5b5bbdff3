/* cli_files.h — the files `kvbatch run` reads and writes, checked before
 * any of them is written.
 *
 * A run reads the job (-i) and the model, and writes the results (-o) and
 * the metrics database (--metrics, with SQLite's -wal, -shm and -journal
 * beside it). Naming one file twice, directly or through a link, would
 * destroy it (the job emptied by -o, a database scribbled over with
 * results), so cli_files_check compares them by device and inode before
 * anything is opened for writing. The results file is then opened without
 * emptying it, and cut only once everything else that can fail has been
 * opened (cli_output_cut): a run that cannot start leaves the previous
 * results as they were. `-o -` writes to standard output. */
#ifndef KVB_CLI_FILES_H
#define KVB_CLI_FILES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

struct cli_run_files {
    const char *input;   /* "-": standard input */
    const char *output;  /* "-": standard output */
    const char *metrics; /* the database path the run will open */
    const char *model;
    bool resume;
};

/* KVB_OK when the files are distinct and usable as asked; else
 * KVB_ERR_INVALID_ARG (a bad command line: the caller exits 2) with a
 * message naming the two paths that are one file, or saying why --resume
 * cannot use the output (standard output, or not a regular file: resuming
 * reads what the output already holds, and a device or FIFO either never
 * ends or cannot be read back). Regular files count as one when they share
 * device and inode, so links are seen through; a file that does not exist
 * yet matches a path that resolves to the same place. */
enum kvb_status cli_files_check(const struct cli_run_files *f, struct kvb_err *err);

/* Opens the results file for writing without emptying it (created if
 * absent, appended to: see cli_output_cut), or standard output for "-".
 * KVB_ERR_IO with a message naming the path. */
enum kvb_status cli_output_open(const char *path, FILE **out, struct kvb_err *err);

/* Cuts a results file opened by cli_output_open to `size` bytes: 0 for a
 * fresh run, the end of the last whole line for a resumed one. Does nothing
 * for standard output or what is not a regular file (a FIFO, /dev/null).
 * KVB_ERR_IO with a message naming path. */
enum kvb_status cli_output_cut(FILE *f, const char *path, uint64_t size, struct kvb_err *err);

#endif
