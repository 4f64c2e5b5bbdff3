/* test_shard.c — job_shard: --shard parsing (I/N, Slurm and Kubernetes
 * variables), and the assignment: requests sharing a prefix land together,
 * shards get about equal work, copies of a custom_id follow the first,
 * bad lines are spread, and every shard computes the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/job_shard.h"
#include "support/testutil.h"

static const char *env_names[8], *env_values[8];
static int n_env;

static const char *fake_env(const char *name)
{
    for (int i = 0; i < n_env; i++)
        if (!strcmp(env_names[i], name)) return env_values[i];
    return NULL;
}

static void set_env(int n, const char *const *kv)
{
    n_env = n;
    for (int i = 0; i < n; i++) {
        env_names[i] = kv[2 * i];
        env_values[i] = kv[2 * i + 1];
    }
}

static void test_parse(void)
{
    int32_t i = -1, n = -1;
    struct kvb_err err = {{0}};
    set_env(0, NULL);
    CHECK(shard_parse("0/4", fake_env, &i, &n, &err) == KVB_OK && i == 0 && n == 4);
    CHECK(shard_parse("3/4", fake_env, &i, &n, &err) == KVB_OK && i == 3 && n == 4);
    const char *bad[] = {"4/4", "-1/4", "1/0", "x", "1/", "/4", "1/4/2", "a/b", ""};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err.msg[0] = '\0';
        CHECK_MSG(shard_parse(bad[k], fake_env, &i, &n, &err) == KVB_ERR_INVALID_ARG && err.msg[0], "'%s' accepted",
                  bad[k]);
    }
    CHECK(shard_parse("auto", fake_env, &i, &n, &err) == KVB_ERR_INVALID_ARG && strstr(err.msg, "Slurm"));
    const char *slurm[] = {"SLURM_ARRAY_TASK_ID", "5", "SLURM_ARRAY_TASK_COUNT", "4", "SLURM_ARRAY_TASK_MIN", "3"};
    set_env(3, slurm);
    CHECK(shard_parse("auto", fake_env, &i, &n, &err) == KVB_OK && i == 2 && n == 4);
    const char *slurm0[] = {"SLURM_ARRAY_TASK_ID", "1", "SLURM_ARRAY_TASK_COUNT", "2"};
    set_env(2, slurm0);
    CHECK(shard_parse("auto", fake_env, &i, &n, &err) == KVB_OK && i == 1 && n == 2);
    const char *k8s[] = {"JOB_COMPLETION_INDEX", "2", "KVBATCH_SHARD_COUNT", "3"};
    set_env(2, k8s);
    CHECK(shard_parse("auto", fake_env, &i, &n, &err) == KVB_OK && i == 2 && n == 3);
    set_env(1, k8s);
    CHECK(shard_parse("auto", fake_env, &i, &n, &err) == KVB_ERR_INVALID_ARG && strstr(err.msg, "KVBATCH_SHARD_COUNT"));
    CHECK(shard_parse("0/2000000", fake_env, &i, &n, &err) == KVB_ERR_INVALID_ARG &&
          strstr(err.msg, "number of shards"));
    printf("parse: I/N, Slurm array and Indexed Job variables, 10 bad values refused\n");
}

/* n_groups documents, document g asked per_group + g % 5 - 2 questions
 * (uneven, so that no equal-work cut falls between two documents by luck):
 * a header of head tokens common to all, the document's doc_len tokens, a
 * question of q_len tokens; lines shuffled. */
struct job {
    struct shard_item *items;
    int32_t *group;
    int64_t n;
};

static struct job make_job(int n_groups, int per_group, int head, int doc_len, int q_len, uint64_t seed)
{
    struct job j;
    j.n = 0;
    for (int g = 0; g < n_groups; g++) j.n += n_groups > 1 ? per_group + g % 5 - 2 : per_group;
    j.items = calloc((size_t)j.n, sizeof *j.items);
    j.group = calloc((size_t)j.n, sizeof *j.group);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(head + doc_len + q_len));
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)j.n);
    for (int64_t i = 0; i < j.n; i++) perm[i] = i;
    for (int64_t i = j.n - 1; i > 0; i--) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int64_t k = (int64_t)((seed >> 33) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
    for (int64_t r = 0, g = 0, q = 0; r < j.n; r++, q++) {
        if (q == (n_groups > 1 ? per_group + g % 5 - 2 : per_group)) {
            g++;
            q = 0;
        }
        int at = 0;
        for (int t = 0; t < head; t++) toks[at++] = 1000 + t;
        for (int t = 0; t < doc_len; t++) toks[at++] = 5000 + (int)g * 1000 + t;
        for (int t = 0; t < q_len; t++) toks[at++] = 90000 + (int)q * 100 + t;
        struct shard_item *it = &j.items[perm[r]];
        shard_hash_prompt(toks, at, it);
        it->cost = at + 64;
        j.group[perm[r]] = (int32_t)g;
    }
    free(toks);
    free(perm);
    return j;
}

static void free_job(struct job *j)
{
    free(j->items);
    free(j->group);
}

/* Largest shard's work over the mean. */
static double imbalance(const struct job *j, const int32_t *shard_of, int n_shards)
{
    int64_t w[64] = {0}, total = 0;
    for (int64_t i = 0; i < j->n; i++) {
        w[shard_of[i]] += j->items[i].cost;
        total += j->items[i].cost;
    }
    int64_t most = 0;
    for (int s = 0; s < n_shards; s++) most = w[s] > most ? w[s] : most;
    return (double)most * n_shards / (double)total;
}

static void test_rag_affinity(void)
{
    const int n_groups = 24, per = 10;
    struct job j = make_job(n_groups, per, 40, 400, 20, 7);
    for (int n_shards = 1; n_shards <= 8; n_shards *= 2) {
        int32_t *a = malloc(sizeof(int32_t) * (size_t)j.n), *b = malloc(sizeof(int32_t) * (size_t)j.n);
        CHECK(shard_assign(j.items, j.n, n_shards, a) == KVB_OK);
        CHECK(shard_assign(j.items, j.n, n_shards, b) == KVB_OK);
        CHECK_MSG(!memcmp(a, b, sizeof(int32_t) * (size_t)j.n), "two shards would disagree");
        int split = 0, empty = 0;
        for (int g = 0; g < n_groups; g++) {
            int first = -1;
            for (int64_t i = 0; i < j.n; i++) {
                if (j.group[i] != g) continue;
                CHECK(a[i] >= 0 && a[i] < n_shards);
                if (first < 0) first = a[i];
                else if (a[i] != first) {
                    split++;
                    break;
                }
            }
        }
        for (int s = 0; s < n_shards; s++) {
            int64_t c = 0;
            for (int64_t i = 0; i < j.n; i++) c += a[i] == s;
            empty += c == 0;
        }
        const double imb = imbalance(&j, a, n_shards);
        printf("RAG job, %d documents x ~%d questions over %d shards: %d documents split, largest shard %.2fx the "
               "mean\n",
               n_groups, per, n_shards, split, imb);
        CHECK_MSG(split == 0, "%d documents split over shards", split);
        CHECK(empty == 0);
        CHECK_MSG(imb <= 1.35, "imbalance %.2f", imb);
        free(a);
        free(b);
    }
    free_job(&j);
}

/* Every request shares one long header (a few-shot evaluation): nothing to
 * keep together beyond it, so the work is split evenly. */
static void test_shared_header(void)
{
    struct job j = make_job(1, 400, 600, 0, 30, 11);
    for (int64_t i = 0; i < j.n; i++) j.group[i] = (int32_t)i; /* questions differ only past 512 tokens */
    int32_t *a = malloc(sizeof(int32_t) * (size_t)j.n);
    CHECK(shard_assign(j.items, j.n, 4, a) == KVB_OK);
    const double imb = imbalance(&j, a, 4);
    printf("one 600-token header, 400 questions over 4 shards: largest shard %.2fx the mean\n", imb);
    CHECK(imb <= 1.05);
    free(a);
    free_job(&j);
}

static void test_pins_and_bad_lines(void)
{
    struct job j = make_job(6, 5, 10, 100, 10, 3); /* 28 lines */
    CHECK(j.n == 28);
    /* lines 0 and 7 and 20 share a custom_id; line 3 and 4 are bad */
    j.items[0].pin = j.items[7].pin = j.items[20].pin = 0xabcdef;
    j.items[3].n_hash = 0;
    j.items[4].n_hash = 0;
    j.items[4].pin = 0x1234;
    j.items[27].pin = 0x1234; /* a bad line first, a good copy later: the copy follows */
    int32_t *a = malloc(sizeof(int32_t) * (size_t)j.n);
    CHECK(shard_assign(j.items, j.n, 3, a) == KVB_OK);
    CHECK(a[7] == a[0] && a[20] == a[0]);
    CHECK(a[3] == 3 % 3 && a[4] == 4 % 3 && a[27] == a[4]);
    int32_t one;
    CHECK(shard_assign(j.items, 1, 1, &one) == KVB_OK && one == 0);
    CHECK(shard_assign(j.items, j.n, 0, a) == KVB_ERR_INVALID_ARG);
    CHECK(shard_assign(NULL, 0, 2, NULL) == KVB_OK);
    /* more shards than requests: every request somewhere, some shards empty */
    int32_t few[5];
    CHECK(shard_assign(j.items, 5, 8, few) == KVB_OK);
    for (int i = 0; i < 5; i++) CHECK(few[i] >= 0 && few[i] < 8);
    printf("copies of a custom_id follow the first; bad lines by line index\n");
    free(a);
    free_job(&j);
}

/* A completion prompt's bytes as its tokens. */
static bool bytes_as_tokens(void *user, const struct job_request *q, int32_t **ids, size_t *n)
{
    (void)user;
    if (!q->prompt) return false;
    *ids = malloc(sizeof(int32_t) * (q->prompt_len ? q->prompt_len : 1));
    for (size_t k = 0; k < q->prompt_len; k++) (*ids)[k] = (unsigned char)q->prompt[k];
    *n = q->prompt_len;
    return true;
}

/* shard_plan over a file: every line in exactly one shard, the same plan
 * hash in every shard, and a huge max_tokens counted only up to max_gen
 * (else its request alone outweighs the rest and most shards idle). */
static void test_plan(void)
{
    FILE *f = tmpfile();
    const int n_lines = 41;
    for (int i = 0; i < n_lines - 1; i++)
        fprintf(f, "{\"custom_id\":\"r%d\",\"prompt\":\"question %d about topic %d\",\"max_tokens\":%d}\n", i, i,
                i * 7919 % 101, i == 17 ? 1000000 : 16);
    fprintf(f, "not json\n");
    uint8_t seen[41] = {0};
    uint64_t hash0 = 0;
    int64_t least = n_lines;
    for (int32_t s = 0; s < 4; s++) {
        rewind(f);
        struct shard_plan_out p;
        struct kvb_err err = {{0}};
        CHECK_MSG(shard_plan(f, s, 4, 64, bytes_as_tokens, NULL, &p, &err) == KVB_OK, "%s", err.msg);
        CHECK(p.n_lines == n_lines);
        if (s == 0) hash0 = p.hash;
        CHECK(p.hash == hash0);
        int64_t mine = 0;
        for (int64_t k = 0; k < p.n_lines; k++) {
            if (!p.mine[k]) continue;
            CHECK_MSG(!seen[k], "line %lld in two shards", (long long)k + 1);
            seen[k] = 1;
            mine++;
        }
        CHECK(mine == p.n_mine);
        if (mine < least) least = mine;
        free(p.mine);
    }
    for (int k = 0; k < n_lines; k++) CHECK_MSG(seen[k], "line %d in no shard", k + 1);
    CHECK_MSG(least >= 5, "a shard got only %lld of %d lines", (long long)least, n_lines);
    /* A different split (other shard count) has another hash. */
    rewind(f);
    struct shard_plan_out p3;
    CHECK(shard_plan(f, 0, 3, 64, bytes_as_tokens, NULL, &p3, NULL) == KVB_OK && p3.hash != hash0);
    free(p3.mine);
    fclose(f);
    printf("plan: 41 lines over 4 shards, each once, one plan hash, smallest shard %lld lines\n", (long long)least);
}

int main(void)
{
    test_parse();
    test_rag_affinity();
    test_shared_header();
    test_pins_and_bad_lines();
    test_plan();
    return tu_finish();
}
