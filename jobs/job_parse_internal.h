/* job_parse_internal.h — private to jobs/: what the two halves of the
 * request parser share. job_parse.c holds the context, the error helpers,
 * the typed field readers, the check of which fields exist and the line
 * itself; job_parse_fields.c reads the messages, the prompt and the
 * sampling and output fields. */
#ifndef KVB_JOB_PARSE_INTERNAL_H
#define KVB_JOB_PARSE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "jobs/job.h"

struct jp_ctx {
    const struct json_doc *j;
    struct job_request *r;
    struct job_error *err;
    uint64_t line;
    const char *prefix; /* "body." or "" for the shorthand */
};

#define JP_PATH_MAX 128 /* field paths, as error params (job_error.param) */

/* Each helper and reader below returns 0 when the field is fine (possibly
 * absent), -1 after filling c->err for a bad line, and -2 when memory ran
 * out; each is documented where it is defined. */

void jp_path_sub(char *out, const char *base, const char *suffix);
void jp_path_idx(char *out, const char *base, int k);
void jp_path_of(const struct jp_ctx *c, const char *name, char *out);
int jp_fail(struct jp_ctx *c, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int jp_fail_type(struct jp_ctx *c, const char *path, const char *what);
int jp_fail_missing(struct jp_ctx *c, const char *path);
int jp_fail_nomem(struct jp_ctx *c);
void jp_excerpt(const struct jp_ctx *c, int i, char *out, size_t cap);
double jp_number_value(const struct jp_ctx *c, int i);
int jp_lookup(const struct jp_ctx *c, int obj, const char *name);
int jp_get_float(struct jp_ctx *c, int obj, const char *name, double lo, bool lo_open, double hi, float *out,
                 uint32_t given_bit);
int jp_get_int(struct jp_ctx *c, int obj, const char *name, int64_t lo, int64_t hi, int64_t *out, bool *present);
int jp_get_seed(struct jp_ctx *c, int obj);
int jp_get_bool(struct jp_ctx *c, int obj, const char *name, bool *out, bool *present);
int jp_get_string(struct jp_ctx *c, int obj, const char *name, char **out, size_t *out_len, bool *present);
void jp_key_name(const struct jp_ctx *c, int k, char *buf, size_t cap);
int jp_fail_unknown(struct jp_ctx *c, const char *path, const char *name, const char *extra);
int jp_check_members(struct jp_ctx *c, int obj, const char *path, const char *const *names, size_t n);
int jp_parse_messages(struct jp_ctx *c, int arr);
int jp_parse_prompt(struct jp_ctx *c, int i, const char *name, int max_n);
/* job_parse_pool.c: the body of an embeddings, score or rerank line (its
 * fields, checked against that endpoint's). */
int jp_parse_pooled(struct jp_ctx *c, int body);
int jp_parse_sampling(struct jp_ctx *c, int obj);
int jp_parse_output_form(struct jp_ctx *c, int obj);
/* job_parse_constraint.c: structured_outputs and guided_*; the claim of the
 * request's one constraint (response_format's too). */
int jp_parse_constraints(struct jp_ctx *c, int obj);
int jp_claim_constraint(struct jp_ctx *c, const char *path, enum job_constraint kind);

#endif
