/* job_resume.c — what an interrupted run already wrote.
 *
 * Result lines are appended and flushed one at a time, so a run killed at
 * any moment leaves a file of complete lines followed by at most one torn
 * line (or, after a machine crash, a tail of zero bytes). This scan collects
 * the key of every complete line and says where the valid part ends, so the
 * next run truncates there and appends: every line stays valid JSON and no
 * request is written twice. Keys rather than custom_ids are collected because
 * error lines for unparseable input have no custom_id; job.h explains keys. */
#include "jobs/job.h"

#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"

/* The key of a valid output line: the 32 hex digits after "batch_req_" in
 * its top-level "id". Returns false for anything else. */
static bool line_key(const char *s, size_t len, struct job_key *key, enum kvb_status *st)
{
    struct json_doc j;
    const char *why;
    size_t where;
    *st = json_parse(s, len, &j, &why, &where);
    if (*st != KVB_OK) {
        if (*st == KVB_ERR_FORMAT) *st = KVB_OK; /* not JSON: a bad line, not a failure */
        return false;
    }
    bool ok = false;
    if (json_kind(&j, 0) == JSON_OBJECT) {
        int i = json_get(&j, 0, "id");
        static const char prefix[] = "batch_req_";
        size_t pl = sizeof prefix - 1;
        if (i >= 0 && json_kind(&j, i) == JSON_STRING && (size_t)(j.tok[i].end - j.tok[i].start) == pl + JOB_KEY_LEN &&
            memcmp(s + j.tok[i].start, prefix, pl) == 0) {
            const char *h = s + j.tok[i].start + pl;
            ok = true;
            for (size_t k = 0; k < JOB_KEY_LEN; k++) {
                char c = h[k];
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) ok = false;
            }
            if (ok) {
                memcpy(key->hex, h, JOB_KEY_LEN);
                key->hex[JOB_KEY_LEN] = '\0';
            }
        }
    }
    json_free(&j);
    return ok;
}

enum kvb_status job_resume_scan(const char *path, struct job_idset *keys, struct job_resume_info *info,
                                struct kvb_err *err)
{
    memset(info, 0, sizeof *info);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return KVB_OK; /* nothing written yet */
        return kvb_errf(err, KVB_ERR_IO, "cannot open %s to resume: %s", path, strerror(errno));
    }
    struct job_reader *r = NULL;
    enum kvb_status st = job_reader_create(f, 0, &r, err);
    uint64_t good_end = 0;    /* offset just past the last valid line */
    uint64_t pending_bad = 0; /* bad lines since the last valid one */
    uint64_t pending_first = 0;
    while (st == KVB_OK) {
        struct job_line line;
        bool got;
        st = job_reader_next(r, &line, &got, err);
        if (st != KVB_OK || !got) break;
        info->size = line.offset + line.full_len + line.terminated;
        struct job_key key;
        bool ok = false;
        if (line.terminated && !line.too_long) {
            ok = line_key(line.data, line.len, &key, &st);
            if (st != KVB_OK) {
                kvb_errf(err, st, "resuming %s: out of memory at line %llu", path, (unsigned long long)line.line_no);
                break;
            }
        }
        if (!ok) {
            if (pending_bad++ == 0) pending_first = line.line_no;
            continue;
        }
        if (pending_bad) {
            /* bad lines followed by a valid one: damage in the middle, kept
             * in place (job.h says why) */
            info->lines_bad += pending_bad;
            if (!info->first_bad_line) info->first_bad_line = pending_first;
            pending_bad = 0;
        }
        st = job_idset_add(keys, key.hex, JOB_KEY_LEN, NULL);
        if (st != KVB_OK) {
            kvb_errf(err, st, "resuming %s: out of memory after %llu lines", path, (unsigned long long)info->lines_ok);
            break;
        }
        info->lines_ok++;
        good_end = info->size;
    }
    job_reader_free(r);
    if (st == KVB_OK && ferror(f)) st = kvb_errf(err, KVB_ERR_IO, "reading %s: %s", path, strerror(errno));
    fclose(f);
    if (st != KVB_OK) return st;
    info->torn = pending_bad > 0;
    info->truncate_at = info->torn ? good_end : info->size;
    return KVB_OK;
}
