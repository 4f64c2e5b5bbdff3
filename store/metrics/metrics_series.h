/* metrics_series.h — a run's requests turned into series over time, for
 * the charts of the HTML report: throughput per time bin and the number of
 * sequences running and waiting. Pure functions over arrays (no SQL), so
 * tests can hold them to hand-computed cases.
 *
 * What is derived from what (the request rows carry only four wall-clock
 * times each, not every step):
 *   running(t)  = requests with started_at <= t < ended_at: admitted to the
 *                 scheduler and not finished (a preempted request counts as
 *                 running from its first admission to its end);
 *   waiting(t)  = requests with submitted_at <= t < started_at: read from
 *                 the job file and queued, not yet admitted (the look-ahead
 *                 window bounds it; lines not yet read are not counted);
 *   output tokens: the first at first_token_at, the other
 *                 completion_tokens - 1 spread evenly over
 *                 (first_token_at, ended_at];
 *   prefill tokens: the prompt tokens that were computed (prompt minus the
 *                 cached ones) spread evenly over [started_at,
 *                 first_token_at).
 * Every series value of a bin is its time average over the bin: running
 * 2.5 means 2.5 sequences on average over those seconds; tokens/s counts
 * the tokens that fell in the bin over its length. */
#ifndef KVB_METRICS_SERIES_H
#define KVB_METRICS_SERIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One request's times (unix seconds, or any one clock; NAN when not known)
 * and token counts. */
struct series_req {
    double submitted, started, first, ended;
    int64_t prefill_tokens; /* prompt tokens computed (not reused) */
    int64_t output_tokens;  /* completion tokens */
    int64_t preemptions;    /* times preempted (0 when not recorded) */
};

/* Bins [t0 + k dt, t0 + (k + 1) dt) for k in 0..nbins-1. */
struct series_bins {
    double t0, dt;
    int nbins;
};

/* Adds `weight` * (the part of [a, b) inside each bin) / dt to acc[bin];
 * a == b puts `weight` / dt as a point into a's bin. Parts outside the bins
 * are dropped. Non-finite or reversed intervals add nothing. */
void series_add_interval(const struct series_bins *b, double a, double e, double weight, double *acc);

/* running[k], waiting[k]: time-averaged counts per bin (zeroed first).
 * Requests without started/ended (or submitted, for waiting) are skipped. */
void series_occupancy(const struct series_bins *b, const struct series_req *r, size_t n, double *running,
                      double *waiting);

/* output[k], prefill[k]: tokens per second per bin (zeroed first). */
void series_throughput(const struct series_bins *b, const struct series_req *r, size_t n, double *output,
                       double *prefill);

#endif
