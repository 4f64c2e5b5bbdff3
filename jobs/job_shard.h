/* job_shard.h — splitting one job over N processes (`kvbatch run --shard
 * I/N`, e.g. the tasks of a Slurm job array): which lines shard I runs.
 *
 * Every shard reads the whole input and computes the same assignment, so
 * they need not talk. Requests that share a prompt prefix go to the same
 * shard, where the prefix is computed once and its cache entries live; the
 * shards get about the same work. How: requests are sorted by their
 * prompts' block hashes (so shared prefixes sit together), the order is
 * cut into N runs of about equal work, and each cut is moved, within a
 * window around its ideal place, to where neighbours share the fewest
 * leading blocks.
 *
 * Ownership: the caller owns the items and the output array; shard_plan
 * returns an array the caller frees (kvb_free). shard_plan reads the job
 * file it is given; nothing else does I/O. */
#ifndef KVB_JOB_SHARD_H
#define KVB_JOB_SHARD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "jobs/job.h"

#define SHARD_BLOCK 16      /* tokens per hashed block */
#define SHARD_MAX_BLOCKS 32 /* leading blocks that decide affinity (512 tokens) */
#define SHARD_MAX_COUNT 1000000

/* One line of the job. */
struct shard_item {
    uint64_t hash[SHARD_MAX_BLOCKS]; /* chained hashes of the prompt's leading blocks (shard_hash_prompt) */
    int32_t n_hash;                  /* 0: not a request (blank or bad line): assigned by its line index */
    int64_t cost;                    /* work: prompt tokens plus tokens to generate */
    uint64_t pin;                    /* nonzero: all items with this pin go where the first one goes,
                                        whatever their prompts (copies of one custom_id) */
};

/* Fills item->hash / n_hash from a prompt of n tokens. */
void shard_hash_prompt(const int32_t *tokens, int64_t n, struct shard_item *item);

/* shard_of[i] in [0, n_shards) for each of the n items. KVB_ERR_NOMEM, or
 * KVB_ERR_INVALID_ARG for n_shards < 1. */
enum kvb_status shard_assign(const struct shard_item *items, int64_t n, int32_t n_shards, int32_t *shard_of);

/* What shard_plan decides for one shard. */
struct shard_plan_out {
    uint8_t *mine;   /* mine[k] = 1 when line k+1 is this shard's (kvb_malloc'd: caller frees) */
    int64_t n_lines; /* lines read */
    int64_t n_mine;  /* of them this shard's */
    uint64_t hash;   /* of the whole assignment (every line's shard): equal in every shard
                         that planned the same split, so reports can tell when they did not */
};

/* Reads the job in f (from its current position to the end) and says
 * which lines shard `index` of `count` runs. prompt_of gives a parsed
 * request's prompt tokens (*ids, kvb_malloc'd by it, freed here), or false
 * when the line is no request: such a line goes by its number, and the
 * shard that takes it reports its error. A request's work counts at most
 * max_gen generated tokens per choice (pass the model's context: no
 * request generates more, whatever its max_tokens). Lines with one
 * custom_id stay together, so that one shard runs the first and reports
 * the others as duplicates. KVB_ERR_IO / KVB_ERR_NOMEM with a message. */
enum kvb_status shard_plan(FILE *f, int32_t index, int32_t count, int64_t max_gen,
                           bool (*prompt_of)(void *user, const struct job_request *q, int32_t **ids, size_t *n),
                           void *user, struct shard_plan_out *out, struct kvb_err *err);

/* Parses a --shard value: "I/N" (0 <= I < N), or "auto": the Slurm job
 * array's task (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN of
 * SLURM_ARRAY_TASK_COUNT), else a Kubernetes Indexed Job's
 * JOB_COMPLETION_INDEX of KVBATCH_SHARD_COUNT, read through get_env (getenv
 * in the program). KVB_ERR_INVALID_ARG with a message saying what is wrong
 * or missing. */
enum kvb_status shard_parse(const char *spec, const char *(*get_env)(const char *name), int32_t *index, int32_t *count,
                            struct kvb_err *err);

#endif
