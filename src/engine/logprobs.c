/* logprobs.c — see logprobs.h. */
#include "engine/logprobs.h"

#include <math.h>

double logprobs_lse(const float *logits, int32_t n_vocab)
{
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

int logprobs_top(const float *logits, int32_t n_vocab, int k, int32_t *best)
{
    /* Repeated selection into a sorted list: k is small (OpenAI allows 20). */
    int nb = 0;
    for (int32_t i = 0; i < n_vocab && k > 0; i++) {
        if (nb < k || logits[i] > logits[best[nb - 1]]) {
            int j = nb < k ? nb++ : k - 1;
            while (j > 0 && logits[i] > logits[best[j - 1]]) {
                best[j] = best[j - 1];
                j--;
            }
            best[j] = i;
        }
    }
    return nb;
}
