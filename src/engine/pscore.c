/* pscore.c — see pscore.h. */
#include "engine/pscore.h"

#include <string.h>

#include "engine/logprobs.h"

void pscore_of(const float *row, int32_t n_vocab, int32_t token, struct pscore *out)
{
    memset(out, 0, sizeof *out);
    const double lse = logprobs_lse(row, n_vocab);
    const float x = row[token];
    int32_t above = 0;
    for (int32_t i = 0; i < n_vocab; i++) above += row[i] > x;
    out->logprob = (float)((double)x - lse);
    out->rank = above + 1;
    const int n = logprobs_top(row, n_vocab, PSCORE_TOPK, out->top_id);
    for (int k = 0; k < n; k++) out->top_lp[k] = (float)((double)row[out->top_id[k]] - lse);
    for (int k = n; k < PSCORE_TOPK; k++) out->top_id[k] = -1;
}

void pscore_none(struct pscore *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < PSCORE_TOPK; k++) out->top_id[k] = -1;
}
