/* metrics_series.c — requests to series over time (see metrics_series.h
 * for what is derived from what). */
#include "store/metrics/metrics_series.h"

#include <math.h>
#include <string.h>

void series_add_interval(const struct series_bins *b, double a, double e, double weight, double *acc)
{
    if (!isfinite(a) || !isfinite(e) || !isfinite(weight) || e < a || b->nbins <= 0 || !(b->dt > 0)) return;
    const double end_all = b->t0 + b->dt * b->nbins;
    if (a == e) {
        if (a < b->t0 || a >= end_all) return;
        int k = (int)floor((a - b->t0) / b->dt);
        if (k >= b->nbins) k = b->nbins - 1;
        acc[k] += weight / b->dt;
        return;
    }
    if (e <= b->t0 || a >= end_all) return;
    double lo = a < b->t0 ? b->t0 : a, hi = e > end_all ? end_all : e;
    int k0 = (int)floor((lo - b->t0) / b->dt);
    if (k0 >= b->nbins) k0 = b->nbins - 1;
    for (int k = k0; k < b->nbins; k++) {
        double bs = b->t0 + b->dt * k, be = bs + b->dt;
        if (bs >= hi) break;
        double part = (hi < be ? hi : be) - (lo > bs ? lo : bs);
        if (part > 0) acc[k] += weight * part / b->dt;
    }
}

void series_occupancy(const struct series_bins *b, const struct series_req *r, size_t n, double *running,
                      double *waiting)
{
    memset(running, 0, sizeof *running * (size_t)b->nbins);
    memset(waiting, 0, sizeof *waiting * (size_t)b->nbins);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(r[i].started)) continue;
        /* a == e would count as a point: an instant in the state adds nothing to its time average */
        if (isfinite(r[i].ended) && r[i].ended > r[i].started)
            series_add_interval(b, r[i].started, r[i].ended, 1, running);
        if (isfinite(r[i].submitted) && r[i].started > r[i].submitted)
            series_add_interval(b, r[i].submitted, r[i].started, 1, waiting);
    }
}

void series_throughput(const struct series_bins *b, const struct series_req *r, size_t n, double *output,
                       double *prefill)
{
    memset(output, 0, sizeof *output * (size_t)b->nbins);
    memset(prefill, 0, sizeof *prefill * (size_t)b->nbins);
    for (size_t i = 0; i < n; i++) {
        const struct series_req *q = &r[i];
        if (q->output_tokens > 0 && isfinite(q->first)) {
            /* the first token is a point; the rest spread until the end */
            series_add_interval(b, q->first, q->first, 1, output);
            int64_t rest = q->output_tokens - 1;
            if (rest > 0) {
                if (isfinite(q->ended) && q->ended > q->first)
                    series_add_interval(b, q->first, q->ended, (double)rest / (q->ended - q->first), output);
                else series_add_interval(b, q->first, q->first, (double)rest, output);
            }
        }
        if (q->prefill_tokens > 0 && isfinite(q->started)) {
            double until = isfinite(q->first) ? q->first : q->ended;
            if (isfinite(until) && until > q->started)
                series_add_interval(b, q->started, until, (double)q->prefill_tokens / (until - q->started), prefill);
            else series_add_interval(b, q->started, q->started, (double)q->prefill_tokens, prefill);
        }
    }
}
