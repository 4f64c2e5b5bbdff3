/* cli_files.c — see cli_files.h. */
#include "app/cli_files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a path names: an existing file by device and inode, or, when there is
 * none yet, the absolute path it would be created at. */
struct file_id {
    const char *label; /* for messages: the option and its path */
    char label_buf[PATH_MAX + 64];
    bool exists;
    bool regular;
    dev_t dev;
    ino_t ino;
    char where[PATH_MAX + NAME_MAX + 2];
};

/* The absolute path of a file that need not exist: its directory resolved
 * (links and all), then its name. The path as given when even the directory
 * cannot be resolved: such a file cannot be created, so it matches nothing. */
static void resolve_absent(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    const char *base = path;
    if (slash) {
        size_t n = (size_t)(slash - path);
        if (n == 0) n = 1; /* "/name" */
        if (n >= sizeof dir) {
            snprintf(out, cap, "%s", path);
            return;
        }
        memcpy(dir, path, n);
        dir[n] = '\0';
        base = slash + 1;
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    char real[PATH_MAX];
    if (!realpath(dir, real)) {
        snprintf(out, cap, "%s", path);
        return;
    }
    snprintf(out, cap, "%s%s%s", real, strcmp(real, "/") ? "/" : "", base);
}

/* fd >= 0: the file open there (standard input or output), else path. */
static void file_id_of(const char *path, int fd, const char *label, struct file_id *id)
{
    memset(id, 0, sizeof *id);
    snprintf(id->label_buf, sizeof id->label_buf, "%s", label);
    id->label = id->label_buf;
    struct stat sb;
    int rc = fd >= 0 ? fstat(fd, &sb) : stat(path, &sb);
    if (rc == 0) {
        id->exists = true;
        id->regular = S_ISREG(sb.st_mode);
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        return;
    }
    if (fd < 0) resolve_absent(path, id->where, sizeof id->where);
}

/* One file, as far as writing one could destroy the other: regular files
 * are the ones holding data (a device or FIFO named twice loses nothing). */
static bool same_file(const struct file_id *a, const struct file_id *b)
{
    if (a->exists != b->exists) return false;
    if (a->exists) return a->regular && b->regular && a->dev == b->dev && a->ino == b->ino;
    return a->where[0] && strcmp(a->where, b->where) == 0;
}

static const char *kind_of(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return "not a regular file";
    if (S_ISCHR(sb.st_mode)) return "a character device";
    if (S_ISBLK(sb.st_mode)) return "a block device";
    if (S_ISFIFO(sb.st_mode)) return "a FIFO";
    if (S_ISSOCK(sb.st_mode)) return "a socket";
    if (S_ISDIR(sb.st_mode)) return "a directory";
    return "not a regular file";
}

enum kvb_status cli_files_check(const struct cli_run_files *f, struct kvb_err *err)
{
    const bool out_std = strcmp(f->output, "-") == 0;
    const bool in_std = strcmp(f->input, "-") == 0;
    if (f->resume && out_std)
        return kvb_errf(err, KVB_ERR_INVALID_ARG,
                        "--resume reads the results already written, so it needs --output to be a file, "
                        "not standard output ('-')");

    char label[PATH_MAX + 64];
    struct file_id in, out, model, db[4];
    if (in_std) file_id_of(NULL, STDIN_FILENO, "standard input (--input -)", &in);
    else {
        snprintf(label, sizeof label, "--input %s", f->input);
        file_id_of(f->input, -1, label, &in);
    }
    if (out_std) file_id_of(NULL, STDOUT_FILENO, "standard output (--output -)", &out);
    else {
        snprintf(label, sizeof label, "--output %s", f->output);
        file_id_of(f->output, -1, label, &out);
    }
    snprintf(label, sizeof label, "--model %s", f->model);
    file_id_of(f->model, -1, label, &model);
    static const char *const k_sib[4] = {"", "-wal", "-shm", "-journal"};
    for (int i = 0; i < 4; i++) {
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s%s", f->metrics, k_sib[i]);
        if (i == 0) snprintf(label, sizeof label, "the metrics database %s", f->metrics);
        else snprintf(label, sizeof label, "the metrics database's %s", p);
        file_id_of(p, -1, label, &db[i]);
    }

    /* Only files that exist can be destroyed by being read as something
     * else; a missing input or model is reported when the run opens it. */
    if (in.exists && same_file(&out, &in))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "%s and %s are one file: the results would overwrite the job",
                        out.label, in.label);
    if (model.exists && same_file(&out, &model))
        return kvb_errf(err, KVB_ERR_INVALID_ARG, "%s is the model (%s): the results would overwrite it", out.label,
                        model.label);
    for (int i = 0; i < 4; i++) {
        if (same_file(&out, &db[i]))
            return kvb_errf(err, KVB_ERR_INVALID_ARG,
                            "%s is %s: the results and the metrics would overwrite each other (give --metrics "
                            "another path)",
                            out.label, db[i].label);
        if (in.exists && same_file(&in, &db[i]))
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "%s is %s: the metrics would overwrite the job", in.label,
                            db[i].label);
        if (model.exists && same_file(&model, &db[i]))
            return kvb_errf(err, KVB_ERR_INVALID_ARG, "%s is %s: the metrics would overwrite the model", model.label,
                            db[i].label);
    }

    /* Resuming reads the output to the end before appending: /dev/full or
     * /dev/zero never end, a FIFO gives back nothing that was written. */
    if (f->resume && out.exists && !out.regular)
        return kvb_errf(err, KVB_ERR_INVALID_ARG,
                        "--resume needs --output to be a regular file holding earlier results; %s is %s", f->output,
                        kind_of(f->output));
    return KVB_OK;
}

enum kvb_status cli_output_open(const char *path, FILE **out, struct kvb_err *err)
{
    *out = NULL;
    if (strcmp(path, "-") == 0) {
        *out = stdout;
        return KVB_OK;
    }
    /* No O_TRUNC: emptying waits for cli_output_cut. O_APPEND so that what
     * the run writes lands after the cut wherever it falls. */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return kvb_errf(err, KVB_ERR_IO, "cannot open %s for writing: %s", path, strerror(errno));
    FILE *fp = fdopen(fd, "ab");
    if (!fp) {
        int e = errno;
        close(fd);
        return kvb_errf(err, KVB_ERR_IO, "cannot open %s for writing: %s", path, strerror(e));
    }
    *out = fp;
    return KVB_OK;
}

enum kvb_status cli_output_cut(FILE *f, const char *path, uint64_t size, struct kvb_err *err)
{
    if (f == stdout) return KVB_OK; /* the shell opened it: '>' emptied it, '>>' appends */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) return kvb_errf(err, KVB_ERR_IO, "cannot inspect %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return KVB_OK;
    if (size > (uint64_t)sb.st_size)
        return kvb_errf(err, KVB_ERR_INTERNAL, "cutting %s to %llu bytes: it holds only %lld", path,
                        (unsigned long long)size, (long long)sb.st_size);
    if (ftruncate(fileno(f), (off_t)size) != 0)
        return kvb_errf(err, KVB_ERR_IO, "cannot %s %s: %s", size ? "cut the torn last line of" : "empty", path,
                        strerror(errno));
    return KVB_OK;
}
