/* metrics_html.c — `kvbatch report --html FILE`: one self-contained page
 * about one run, or about the latest runs of several databases (shards, or
 * nights to compare), drawn as inline SVG by svg_chart.c. No script runs on
 * the page and nothing is fetched: it opens the same from a mail attachment
 * as from disk.
 *
 * What is drawn and from what:
 *   - the summary figures (cards, errors, prefix reuse) are those of the
 *     text report: struct metrics_summary of the run, or of the combination
 *     of several (metrics_combine.c), so the page and `kvbatch report` agree;
 *   - throughput and running/waiting over time come from the per-request
 *     wall-clock times (metrics_series.h says how), per time bin, with the
 *     time axis counted from each run's own start, one line per run;
 *   - latency distributions are cumulative: for each latency x, the share
 *     of requests at or below it, one line per run (nearest-rank marks for
 *     a single run);
 *   - the slowest requests are the rows with the largest end-to-end time.
 * A database written before schema 2 has no per-request times: the time
 * charts then say so instead of drawing nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "base/alloc.h"
#include "store/metrics/metrics.h"
#include "store/metrics/metrics_html_internal.h"
#include "store/metrics/metrics_internal.h"
#include "store/metrics/metrics_report.h"
#include "store/metrics/metrics_report_internal.h"
#include "store/metrics/metrics_series.h"
#include "store/metrics/svg_chart.h"

#define HTML_BINS 100 /* about this many time bins */
#define HTML_CDF_POINTS 400

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
#define N_PALETTE (sizeof palette / sizeof palette[0])

static const char *const lat_title[N_LAT] = {"time to first token", "time per output token", "end to end",
                                             "queue (read to first scheduled)"};

static int cmp_slow(const void *a, const void *b)
{
    const struct slow_row *x = a, *y = b;
    return (x->e2e < y->e2e) - (x->e2e > y->e2e); /* slowest first */
}

/* ---- page pieces --------------------------------------------------------------------- */

static void esc(FILE *o, const char *s) { svg_escape(o, s ? s : "-"); }

/* A duration for people: "0.48 ms", "970 ms", "1.18 s", "71.1 s" — the
 * unit beside every figure, since one table can hold both (the text and
 * JSON forms keep milliseconds throughout). */
static void fmt_dur(char *buf, size_t cap, double seconds)
{
    double ms = 1e3 * seconds;
    if (!isfinite(seconds)) snprintf(buf, cap, "-");
    else if (ms < 10) snprintf(buf, cap, "%.2f ms", ms);
    else if (ms < 1000) snprintf(buf, cap, "%.0f ms", ms);
    else if (seconds < 10) snprintf(buf, cap, "%.2f s", seconds);
    else snprintf(buf, cap, "%.1f s", seconds);
}

static void fmt_pct(char *buf, size_t cap, int64_t part, int64_t whole)
{
    if (whole > 0) snprintf(buf, cap, "%.1f %%", 100.0 * (double)part / (double)whole);
    else snprintf(buf, cap, "-");
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void card(FILE *o, const char *label, const char *value, const char *sub)
{
    fputs("<div class=\"card\"><span>", o);
    esc(o, label);
    fputs("</span><b>", o);
    esc(o, value);
    fputs("</b>", o);
    if (sub) {
        fputs("<small>", o);
        esc(o, sub);
        fputs("</small>", o);
    }
    fputs("</div>\n", o);
}

static void legend_item(FILE *o, const char *color, const char *dash, const char *label)
{
    fprintf(o,
            "<span><svg width=\"26\" height=\"10\" aria-hidden=\"true\"><line x1=\"1\" y1=\"5\" x2=\"25\" y2=\"5\" "
            "stroke=\"%s\" stroke-width=\"2.2\"%s%s%s/></svg> ",
            color, dash ? " stroke-dasharray=\"" : "", dash ? dash : "", dash ? "\"" : "");
    esc(o, label);
    fputs("</span>\n", o);
}

static void legend_rug(FILE *o, const char *label)
{
    fputs("<span><svg width=\"14\" height=\"10\" aria-hidden=\"true\"><line x1=\"7\" y1=\"1\" x2=\"7\" y2=\"9\" "
          "stroke=\"#c00\" stroke-width=\"2\"/></svg> ",
          o);
    esc(o, label);
    fputs("</span>\n", o);
}

static void summary_cards(FILE *o, const struct metrics_summary *s)
{
    const struct metrics_totals *t = &s->t;
    char v[64], sub[96];
    fputs("<div class=\"cards\">\n", o);
    card(o, "status", s->status ? s->status : "-", s->has_totals ? NULL : "no totals recorded yet");
    snprintf(v, sizeof v, "%lld", (long long)t->requests_total);
    snprintf(sub, sizeof sub, "%lld ok, %lld failed", (long long)t->requests_ok, (long long)t->requests_failed);
    card(o, "requests", v, sub);
    if (s->has_wall) snprintf(v, sizeof v, "%.1f s", t->wall_seconds);
    else snprintf(v, sizeof v, "-");
    card(o, "wall time", v, NULL);
    if (s->has_wall) snprintf(v, sizeof v, "%.1f tok/s", (double)t->completion_tokens / t->wall_seconds);
    else snprintf(v, sizeof v, "-");
    snprintf(sub, sizeof sub, "%lld completion tokens", (long long)t->completion_tokens);
    card(o, "output throughput", v, sub);
    char a[32], b[32];
    fmt_dur(a, sizeof a, s->ttft.p50);
    fmt_dur(b, sizeof b, s->ttft.p95);
    snprintf(sub, sizeof sub, "p95 %s", b);
    card(o, "time to first token p50", a, sub);
    fmt_dur(a, sizeof a, s->e2e.p50);
    fmt_dur(b, sizeof b, s->e2e.p95);
    snprintf(sub, sizeof sub, "p50 %s", a);
    card(o, "end to end p95", b, sub);
    fmt_pct(v, sizeof v, t->cached_tokens_run + t->cached_tokens_store, t->prompt_tokens);
    snprintf(sub, sizeof sub, "of %lld prompt tokens", (long long)t->prompt_tokens);
    card(o, "prefix reuse", v, sub);
    if (s->rows_with_preemptions > 0 || t->requests_total == 0) {
        snprintf(v, sizeof v, "%lld", (long long)s->preemptions);
        snprintf(sub, sizeof sub, "%lld requests, %lld positions restored", (long long)s->preempted_requests,
                 (long long)s->restored_tokens);
        card(o, "preemptions", v, sub);
    }
    fputs("</div>\n", o);
}

/* The time unit of the x axis for a span of `span` seconds. */
static void time_axis(struct svg_axis *a, double span)
{
    if (span > 3 * 3600) {
        a->scale = 1.0 / 3600;
        a->title = "time since run start (h)";
    } else if (span > 600) {
        a->scale = 1.0 / 60;
        a->title = "time since run start (min)";
    } else {
        a->scale = 1;
        a->title = "time since run start (s)";
    }
}

static void bins_for(struct series_bins *b, double span)
{
    b->t0 = 0;
    b->dt = svg_nice_step(span > 0 ? span : 1, HTML_BINS);
    b->nbins = (int)ceil(span / b->dt - 1e-9);
    if (b->nbins < 1) b->nbins = 1;
}

static double max_of(const double *v, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i]) && v[i] > m) m = v[i];
    return m;
}

/* The binned series of the time charts: for run i, bin k is [nb * i + k]. */
struct time_bins {
    struct series_bins b;
    size_t nb;
    double span, x_end;
    double *xs, *out, *pre, *run, *wait, *prun, *scratch;
    struct series_req *preempted; /* scratch: one run's preempted requests */
    bool any_preempted;
};

static void time_bins_free(struct time_bins *t)
{
    kvb_free(t->xs);
    kvb_free(t->out);
    kvb_free(t->pre);
    kvb_free(t->run);
    kvb_free(t->wait);
    kvb_free(t->prun);
    kvb_free(t->scratch);
    kvb_free(t->preempted);
}

/* Bins every run's requests on one grid, each shifted to its own start (t0). */
static bool time_bins_fill(struct time_bins *t, struct html_run *runs, int n)
{
    bins_for(&t->b, t->span);
    const size_t nb = t->nb = (size_t)t->b.nbins, all = nb * (size_t)n;
    size_t most = 1;
    for (int i = 0; i < n; i++)
        if (runs[i].n_req > most) most = runs[i].n_req;
    t->xs = kvb_malloc(sizeof(double) * nb);
    t->out = kvb_malloc(sizeof(double) * all);
    t->pre = kvb_malloc(sizeof(double) * all);
    t->run = kvb_malloc(sizeof(double) * all);
    t->wait = kvb_malloc(sizeof(double) * all);
    t->prun = kvb_malloc(sizeof(double) * all);
    t->scratch = kvb_malloc(sizeof(double) * nb);
    t->preempted = kvb_malloc(sizeof *t->preempted * most);
    if (!(t->xs && t->out && t->pre && t->run && t->wait && t->prun && t->scratch && t->preempted)) return false;
    for (int i = 0; i < n; i++) {
        struct series_req *q = runs[i].req;
        const size_t at = nb * (size_t)i;
        for (size_t k = 0; k < runs[i].n_req; k++) {
            q[k].submitted -= runs[i].t0;
            q[k].started -= runs[i].t0;
            q[k].first -= runs[i].t0;
            q[k].ended -= runs[i].t0;
        }
        series_throughput(&t->b, q, runs[i].n_req, t->out + at, t->pre + at);
        series_occupancy(&t->b, q, runs[i].n_req, t->run + at, t->wait + at);
        /* of the running, those preempted at least once: in a preemption
         * storm, "running" holds many that wait for their KV again */
        size_t np = 0;
        for (size_t k = 0; k < runs[i].n_req; k++)
            if (q[k].preemptions > 0) t->preempted[np++] = q[k];
        t->any_preempted |= np > 0;
        series_occupancy(&t->b, t->preempted, np, t->prun + at, t->scratch); /* its waiting is not drawn */
        for (size_t k = 0; k < runs[i].n_fail; k++) runs[i].fail_at[k] -= runs[i].t0;
        /* a run's lines stop where it ended, rather than drawing zeros
         * after it beside a longer run */
        for (size_t k = 0; k < nb; k++)
            if (t->b.t0 + t->b.dt * (double)k >= runs[i].t_last - runs[i].t0)
                t->out[at + k] = t->pre[at + k] = t->run[at + k] = t->wait[at + k] = t->prun[at + k] = NAN;
    }
    for (size_t k = 0; k < nb; k++) t->xs[k] = t->b.t0 + t->b.dt * (double)k;
    t->x_end = t->b.t0 + t->b.dt * (double)nb;
    return true;
}

/* A time chart's frame: x from 0 to the bins' end, y from 0 to y_hi. */
static void time_plot_begin(struct svg_plot *p, FILE *o, const struct time_bins *t, int height, double y_hi,
                            const char *y_title, const char *title)
{
    svg_plot_init(p, o, 1020, height);
    p->x.lo = 0;
    p->x.hi = t->x_end;
    time_axis(&p->x, t->span);
    p->y.lo = 0;
    p->y.hi = y_hi;
    p->y.title = y_title;
    svg_axis_fit(&p->y);
    p->x.hi = t->x_end; /* the bins' end, not rounded further */
    svg_plot_begin(p, title);
}

/* The legend entry of run i's series `what` (the run's name first when several are drawn). */
static void run_legend(FILE *o, const struct html_run *runs, int n, int i, const char *color, const char *dash,
                       const char *what)
{
    char title[sizeof runs[i].name + 64]; /* the name and the longest `what` */
    snprintf(title, sizeof title, "%s%s%s", n == 1 ? "" : runs[i].name, n == 1 ? "" : ": ", what);
    legend_item(o, n == 1 ? color : runs[i].color, dash, title);
}

/* Run i's line of series v (nb values from v + nb * i). */
static void run_line(struct svg_plot *p, const struct time_bins *t, const struct html_run *runs, int n, int i,
                     const double *v, const char *color, const char *dash, const char *what)
{
    char title[sizeof runs[i].name + 64];
    snprintf(title, sizeof title, "%s %s", runs[i].name, what);
    svg_plot_line(p, t->xs, v + t->nb * (size_t)i, t->nb, n == 1 ? color : runs[i].color, dash, true, t->x_end, title);
}

static void throughput_chart(FILE *o, const struct time_bins *t, struct html_run *runs, int n)
{
    fputs("<h2>Throughput over time</h2>\n<div class=\"legend\">", o);
    size_t n_fail = 0;
    for (int i = 0; i < n; i++) {
        run_legend(o, runs, n, i, palette[0], NULL, "output tokens/s");
        run_legend(o, runs, n, i, palette[4], "5 3", "prefill tokens/s (computed)");
        n_fail += runs[i].n_fail;
    }
    if (n_fail) legend_rug(o, "failed request (when its error was written)");
    fputs("</div>\n", o);
    struct svg_plot p;
    const int all = t->b.nbins * n;
    time_plot_begin(&p, o, t, 300, fmax(max_of(t->out, all), max_of(t->pre, all)), "tokens/s", "throughput over time");
    for (int i = 0; i < n; i++) {
        run_line(&p, t, runs, n, i, t->pre, palette[4], "5 3", "prefill tokens/s");
        run_line(&p, t, runs, n, i, t->out, palette[0], NULL, "output tokens/s");
        svg_plot_rug(&p, runs[i].fail_at, runs[i].n_fail, "#c00", "failed request");
    }
    svg_plot_end(&p);
    fprintf(o,
            "<p class=\"note\">Tokens per second in bins of %g s. A request's first output token counts "
            "when it was sampled, the others spread evenly up to its end; its computed prompt tokens (not "
            "reused from a cache) spread evenly from its admission to its first token.</p>\n",
            t->b.dt);
}

static void occupancy_chart(FILE *o, const struct time_bins *t, struct html_run *runs, int n)
{
    fputs("<h2>Running and waiting sequences</h2>\n<div class=\"legend\">", o);
    for (int i = 0; i < n; i++) {
        run_legend(o, runs, n, i, palette[0], NULL, "running");
        run_legend(o, runs, n, i, palette[4], "5 3", "waiting");
        if (t->any_preempted) run_legend(o, runs, n, i, palette[1], "1 3", "of the running, preempted at least once");
    }
    fputs("</div>\n", o);
    struct svg_plot p;
    const int all = t->b.nbins * n;
    const double y_hi = fmax(max_of(t->run, all), max_of(t->wait, all));
    time_plot_begin(&p, o, t, 260, y_hi < 1 ? 1 : y_hi, "sequences", "running and waiting sequences over time");
    for (int i = 0; i < n; i++) {
        run_line(&p, t, runs, n, i, t->wait, palette[4], "5 3", "waiting");
        run_line(&p, t, runs, n, i, t->run, palette[0], NULL, "running");
        if (t->any_preempted)
            run_line(&p, t, runs, n, i, t->prun, palette[1], "1 3", "running, preempted at least once");
    }
    svg_plot_end(&p);
    fputs("<p class=\"note\">Average over each bin. Running: admitted to the scheduler and not finished (a "
          "preempted request counts from its first admission to its end). Waiting: read from the job file "
          "and queued, not yet admitted (at most the look-ahead window).</p>\n",
          o);
}

/* Throughput and running/waiting charts. Each run's requests are shifted to
 * its own start (t0) and binned on one shared grid. */
static bool time_charts(FILE *o, struct html_run *runs, int n)
{
    struct time_bins t = {0};
    size_t timed = 0;
    for (int i = 0; i < n; i++) {
        timed += runs[i].n_req;
        if (runs[i].t_last - runs[i].t0 > t.span) t.span = runs[i].t_last - runs[i].t0;
    }
    if (timed == 0) {
        fputs("<h2>Throughput over time</h2>\n<p class=\"note\">No per-request times in this database: it was "
              "written by a kvbatch before metrics schema 2 (or holds no finished request). Run the job again "
              "with this kvbatch to draw throughput and running/waiting over time.</p>\n",
              o);
        return true;
    }
    const bool ok = time_bins_fill(&t, runs, n);
    if (ok) {
        throughput_chart(o, &t, runs, n);
        occupancy_chart(o, &t, runs, n);
    }
    time_bins_free(&t);
    return ok;
}

/* One cumulative distribution chart of latency k over the runs. */
static bool cdf_chart(FILE *o, struct html_run *runs, int n, int k)
{
    double lo = INFINITY, hi = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += runs[i].n_lat[k];
        for (size_t j = 0; j < runs[i].n_lat[k]; j++) {
            double v = runs[i].lat[k][j] * 1e3;
            if (v > 0 && v < lo) lo = v;
            if (v > hi) hi = v;
        }
    }
    fputs("<div><h3>", o);
    esc(o, lat_title[k]);
    fputs("</h3>\n", o);
    if (total == 0) {
        fputs("<p class=\"note\">No values recorded.</p></div>\n", o);
        return true;
    }
    struct svg_plot p;
    svg_plot_init(&p, o, 500, 250);
    p.x.log = isfinite(lo) && hi / lo > 30;
    p.x.lo = p.x.log ? lo : 0;
    p.x.hi = hi > 0 ? hi : 1;
    /* seconds where the values are 10 s and up; a log axis that spans
     * from below a second keeps milliseconds (no "0.00001") */
    const bool secs = p.x.log ? lo >= 1000 : hi >= 10000;
    p.x.scale = secs ? 1e-3 : 1;
    p.x.title =
        p.x.log ? (secs ? "seconds (log scale)" : "milliseconds (log scale)") : (secs ? "seconds" : "milliseconds");
    svg_axis_fit(&p.x);
    p.y.lo = 0;
    p.y.hi = 100;
    p.y.title = "% of requests at or below";
    svg_plot_begin(&p, lat_title[k]);
    double *xs = kvb_malloc(sizeof(double) * HTML_CDF_POINTS), *ys = kvb_malloc(sizeof(double) * HTML_CDF_POINTS);
    if (!xs || !ys) {
        kvb_free(xs);
        kvb_free(ys);
        svg_plot_end(&p);
        fputs("</div>\n", o);
        return false;
    }
    for (int i = 0; i < n; i++) {
        size_t m = runs[i].n_lat[k];
        if (m == 0) continue;
        /* A staircase (the empirical distribution: flat between observed
         * values) from 0 % at the smallest value, through evenly spaced
         * ranks, the last included. */
        size_t np = m < HTML_CDF_POINTS - 1 ? m : HTML_CDF_POINTS - 1;
        xs[0] = runs[i].lat[k][0] * 1e3;
        ys[0] = 0;
        for (size_t j = 0; j < np; j++) {
            size_t r = np == 1 ? m - 1 : (size_t)llround((double)j * (double)(m - 1) / (double)(np - 1));
            xs[j + 1] = runs[i].lat[k][r] * 1e3;
            ys[j + 1] = 100.0 * (double)(r + 1) / (double)m;
        }
        svg_plot_line(&p, xs, ys, np + 1, runs[i].color, NULL, true, xs[np], runs[i].name);
    }
    if (n == 1) {
        const struct metrics_dist *d = k == LAT_TTFT   ? &runs[0].sum.ttft
                                       : k == LAT_TPOT ? &runs[0].sum.tpot
                                       : k == LAT_E2E  ? &runs[0].sum.e2e
                                                       : &runs[0].sum.queue;
        svg_plot_vline(&p, d->p50 * 1e3, "#555", "p50", 0);
        svg_plot_vline(&p, d->p99 * 1e3, "#555", "p99", 1);
    }
    svg_plot_end(&p);
    kvb_free(xs);
    kvb_free(ys);
    fputs("</div>\n", o);
    return true;
}

static void dist_row(FILE *o, const char *run, const char *what, const struct metrics_dist *d)
{
    char a[32], b[32], c[32], m[32];
    fmt_dur(a, sizeof a, d->p50);
    fmt_dur(b, sizeof b, d->p95);
    fmt_dur(c, sizeof c, d->p99);
    fmt_dur(m, sizeof m, d->max);
    fputs("<tr>", o);
    if (run) {
        fputs("<td class=\"l\">", o);
        esc(o, run);
        fputs("</td>", o);
    }
    fputs("<td class=\"l\">", o);
    esc(o, what);
    fprintf(o, "</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%zu</td></tr>\n", a, b, c, m, d->n);
}

static bool latency_section(FILE *o, struct html_run *runs, int n)
{
    fputs("<h2>Latency</h2>\n", o);
    if (n > 1) {
        fputs("<div class=\"legend\">", o);
        for (int i = 0; i < n; i++) legend_item(o, runs[i].color, NULL, runs[i].name);
        fputs("</div>\n", o);
    }
    fputs("<div class=\"grid2\">\n", o);
    for (int k = 0; k < N_LAT; k++)
        if (!cdf_chart(o, runs, n, k)) return false;
    fputs("</div>\n<table><tr>", o);
    if (n > 1) fputs("<th class=\"l\">run</th>", o);
    fputs("<th class=\"l\">latency</th><th>p50</th><th>p95</th><th>p99</th><th>max</th><th>n</th></tr>\n", o);
    for (int i = 0; i < n; i++) {
        const char *rn = n > 1 ? runs[i].name : NULL;
        dist_row(o, rn, "queue", &runs[i].sum.queue);
        dist_row(o, rn, "time to first token", &runs[i].sum.ttft);
        dist_row(o, rn, "time per output token", &runs[i].sum.tpot);
        dist_row(o, rn, "end to end", &runs[i].sum.e2e);
    }
    fputs("</table>\n<p class=\"note\">Nearest-rank percentiles, as <code>kvbatch report</code> prints them (there in "
          "ms). "
          "Queue and first token are timed from when the line was read.</p>\n",
          o);
    return true;
}

/* One stacked bar: in-run cache / persistent store / computed. */
static void reuse_bar(FILE *o, int y, const char *label, const struct metrics_totals *t)
{
    const int x0 = 190, w = 800, h = 22;
    fprintf(o,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-family=\"system-ui, sans-serif\" font-size=\"12\" "
            "fill=\"#333\">",
            x0 - 8, y + 15);
    esc(o, label);
    fputs("</text>\n", o);
    const int64_t parts[3] = {t->cached_tokens_run, t->cached_tokens_store, t->prefill_tokens_computed};
    static const char *const colors[3] = {"#2ca02c", "#1f77b4", "#bbbbbb"};
    static const char *const names[3] = {"in-run cache", "persistent store", "computed"};
    int64_t whole = parts[0] + parts[1] + parts[2];
    if (whole <= 0) {
        fprintf(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#ccc\"/>", x0, y, w, h);
        return;
    }
    double x = x0;
    for (int k = 0; k < 3; k++) {
        double pw = (double)w * (double)parts[k] / (double)whole;
        if (pw <= 0) continue;
        fprintf(o,
                "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s: %lld tokens "
                "(%.1f %%)</title></rect>",
                x, y, pw, h, colors[k], names[k], (long long)parts[k], 100.0 * (double)parts[k] / (double)whole);
        if (pw > 60)
            fprintf(o,
                    "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-family=\"system-ui, sans-serif\" "
                    "font-size=\"12\" fill=\"%s\">%.1f %%</text>",
                    x + pw / 2, y + 15, k == 2 ? "#222" : "#fff", 100.0 * (double)parts[k] / (double)whole);
        x += pw;
    }
    fputc('\n', o);
}

static void reuse_section(FILE *o, struct html_run *runs, int n, const struct metrics_summary *all)
{
    fputs("<h2>Prefix reuse</h2>\n<div class=\"legend\">", o);
    fputs("<span><i class=\"sw\" style=\"background:#2ca02c\"></i> in-run cache (radix tree)</span>"
          "<span><i class=\"sw\" style=\"background:#1f77b4\"></i> persistent store (LMDB)</span>"
          "<span><i class=\"sw\" style=\"background:#bbbbbb\"></i> computed (prefill)</span></div>\n",
          o);
    int rows = n + (n > 1 ? 1 : 0);
    fprintf(o, "<svg role=\"img\" width=\"1020\" height=\"%d\" viewBox=\"0 0 1020 %d\"><title>prefix reuse</title>\n",
            rows * 30 + 4, rows * 30 + 4);
    for (int i = 0; i < n; i++) reuse_bar(o, 2 + 30 * i, runs[i].name, &runs[i].sum.t);
    if (n > 1) reuse_bar(o, 2 + 30 * n, "all of them", &all->t);
    fputs("</svg>\n<table><tr><th class=\"l\">run</th><th>prompt tokens</th><th>in-run cache</th>"
          "<th>persistent store</th><th>computed</th></tr>\n",
          o);
    for (int i = 0; i <= n; i++) {
        if (i == n && n == 1) break;
        const struct metrics_totals *t = i < n ? &runs[i].sum.t : &all->t;
        char a[32], b[32], c[32];
        fmt_pct(a, sizeof a, t->cached_tokens_run, t->prompt_tokens);
        fmt_pct(b, sizeof b, t->cached_tokens_store, t->prompt_tokens);
        fmt_pct(c, sizeof c, t->prefill_tokens_computed, t->prompt_tokens);
        fputs("<tr><td class=\"l\">", o);
        esc(o, i < n ? runs[i].name : "all of them");
        fprintf(o, "</td><td>%lld</td><td>%lld (%s)</td><td>%lld (%s)</td><td>%lld (%s)</td></tr>\n",
                (long long)t->prompt_tokens, (long long)t->cached_tokens_run, a, (long long)t->cached_tokens_store, b,
                (long long)t->prefill_tokens_computed, c);
    }
    fputs("</table>\n", o);
}

static void errors_section(FILE *o, const struct metrics_summary *s)
{
    fputs("<h2>Errors</h2>\n", o);
    if (s->n_errors == 0) {
        fprintf(o, "<p>No failed requests (%lld of %lld ok).</p>\n", (long long)s->t.requests_ok,
                (long long)s->t.requests_total);
        return;
    }
    fprintf(o,
            "<p>%lld of %lld requests failed.</p>\n<table><tr><th class=\"l\">code</th><th>count</th>"
            "<th class=\"l\">first message</th></tr>\n",
            (long long)s->t.requests_failed, (long long)s->t.requests_total);
    for (size_t i = 0; i < s->n_errors; i++) {
        fputs("<tr><td class=\"l\">", o);
        esc(o, s->errors[i].key);
        fprintf(o, "</td><td>%lld</td><td class=\"l msg\">", (long long)s->errors[i].n);
        esc(o, s->errors[i].example ? s->errors[i].example : "(not recorded)");
        fputs("</td></tr>\n", o);
    }
    fputs("</table>\n", o);
}

static void slowest_section(FILE *o, struct slow_row *rows, size_t n_rows, const struct html_run *runs, int n)
{
    fputs("<h2>Slowest requests</h2>\n", o);
    if (n_rows == 0) {
        fputs("<p class=\"note\">No timed requests.</p>\n", o);
        return;
    }
    qsort(rows, n_rows, sizeof *rows, cmp_slow);
    if (n_rows > HTML_SLOWEST) n_rows = HTML_SLOWEST;
    fputs("<table><tr>", o);
    if (n > 1) fputs("<th class=\"l\">run</th>", o);
    fputs("<th>line</th><th class=\"l\">custom_id</th><th>prompt tokens</th><th>cached: run + store</th>"
          "<th>output tokens</th><th>queue</th><th>first token</th><th>per token</th><th>end to end</th>"
          "<th>preempted</th><th>restored</th><th class=\"l\">finish</th></tr>\n",
          o);
    for (size_t i = 0; i < n_rows; i++) {
        const struct slow_row *s = &rows[i];
        char q[32], f[32], t[32], e[32];
        fmt_dur(q, sizeof q, s->queue);
        fmt_dur(f, sizeof f, s->ttft);
        fmt_dur(t, sizeof t, s->tpot);
        fmt_dur(e, sizeof e, s->e2e);
        fputs("<tr>", o);
        if (n > 1) {
            fputs("<td class=\"l\">", o);
            esc(o, runs[s->run].name);
            fputs("</td>", o);
        }
        fprintf(o, "<td>%lld</td><td class=\"l\">", (long long)s->line);
        esc(o, s->custom_id);
        fprintf(o, "</td><td>%lld</td><td>%lld + %lld</td><td>%lld</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>",
                (long long)s->prompt, (long long)s->cached_run, (long long)s->cached_store, (long long)s->completion, q,
                f, t, e);
        if (s->has_preemptions)
            fprintf(o, "<td>%lld</td><td>%lld</td>", (long long)s->preemptions, (long long)s->restored);
        else fputs("<td>-</td><td>-</td>", o);
        fputs("<td class=\"l\">", o);
        if (s->finish) esc(o, s->finish);
        else fprintf(o, "status %d", s->status);
        fputs("</td></tr>\n", o);
    }
    fputs("</table>\n<p class=\"note\">Preempted: times the scheduler took the request's KV blocks back for "
          "others; restored: the positions it then had to rebuild (from a cache where still there, else "
          "recomputed).</p>\n",
          o);
}

/* The runs table: one row per run, so that a regression between runs shows. */
static void runs_row(FILE *o, const char *db, const struct metrics_summary *s, bool drawn)
{
    const struct metrics_totals *t = &s->t;
    char when[64], wall[32], tps[32], a[32], b[32], c[32], reuse[32];
    metrics_fmt_time(when, sizeof when, s->started_at);
    if (s->has_wall) {
        snprintf(wall, sizeof wall, "%.1f s", t->wall_seconds);
        snprintf(tps, sizeof tps, "%.1f", (double)t->completion_tokens / t->wall_seconds);
    } else {
        snprintf(wall, sizeof wall, "-");
        snprintf(tps, sizeof tps, "-");
    }
    fmt_dur(a, sizeof a, s->ttft.p50);
    fmt_dur(b, sizeof b, s->ttft.p95);
    fmt_dur(c, sizeof c, s->e2e.p95);
    fmt_pct(reuse, sizeof reuse, t->cached_tokens_run + t->cached_tokens_store, t->prompt_tokens);
    fprintf(o, "<tr%s><td class=\"l\">", drawn ? " class=\"drawn\"" : "");
    esc(o, db);
    fprintf(o, "</td><td>%lld</td><td class=\"l\">", (long long)s->run_id);
    esc(o, when);
    fputs("</td><td class=\"l\">", o);
    esc(o, s->status);
    fprintf(o, "</td><td>%lld / %lld</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>",
            (long long)t->requests_ok, (long long)t->requests_total, wall, tps, a, b, c, reuse);
    if (s->rows_with_preemptions > 0) fprintf(o, "<td>%lld</td>", (long long)s->preemptions);
    else fputs("<td>-</td>", o);
    fputs("<td class=\"l job\">", o);
    esc(o, s->job_file);
    fputs("</td></tr>\n", o);
}

static void runs_head(FILE *o)
{
    fputs("<table><tr><th class=\"l\">database</th><th>run</th><th class=\"l\">started</th><th class=\"l\">status</th>"
          "<th>ok / requests</th><th>wall</th><th>output tok/s</th><th>first token p50</th>"
          "<th>first token p95</th><th>end to end p95</th><th>prefix reuse</th><th>preemptions</th>"
          "<th class=\"l\">job</th></tr>\n",
          o);
}

static const char css[] =
    "body{font-family:system-ui,sans-serif;color:#222;max-width:1040px;margin:20px auto;padding:0 14px}"
    "h1{font-size:22px;margin-bottom:2px}h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid #ddd}"
    "h3{font-size:14px;margin:6px 0 2px}td.job{white-space:normal}"
    ".sub{color:#555;font-size:13px;margin:0 0 12px}.note{color:#666;font-size:12px;margin:4px 0}"
    ".cards{display:flex;flex-wrap:wrap;gap:8px}.card{border:1px solid #ddd;border-radius:6px;padding:6px 12px;"
    "min-width:120px}.card span{color:#555;font-size:12px;display:block}.card b{font-size:19px;display:block}"
    ".card small{color:#666;font-size:11px}"
    ".legend{font-size:13px;margin:4px 0}.legend span{margin-right:18px;white-space:nowrap}"
    ".sw{display:inline-block;width:12px;height:12px;vertical-align:-1px}"
    ".grid2{display:grid;grid-template-columns:1fr 1fr;gap:4px 16px}"
    "table{border-collapse:collapse;font-size:12px;margin:6px 0}th,td{padding:3px 7px;border-bottom:1px solid #eee;"
    "text-align:right;vertical-align:top;white-space:nowrap}th{background:#f4f4f4;white-space:normal}"
    ".l{text-align:left}td.msg{max-width:560px;white-space:normal}"
    "tr.drawn td{background:#f3f8ff}code{font-size:12px}";

/* Whether the runs, taken in order of start, each began after the one
 * before had ended (a run still going ends at its latest row). */
static bool runs_disjoint(const struct html_run *runs, int n)
{
    for (int i = 0; i < n; i++) {
        const double si = runs[i].sum.started_at;
        const double ei = runs[i].sum.ended ? runs[i].sum.ended_at : runs[i].t_last;
        for (int j = 0; j < n; j++) {
            if (j == i) continue;
            const double sj = runs[j].sum.started_at;
            const double ej = runs[j].sum.ended ? runs[j].sum.ended_at : runs[j].t_last;
            if (sj < ei && si < ej) return false; /* [si, ei) and [sj, ej) overlap */
        }
    }
    return true;
}

/* The runs table: with several databases their drawn runs; with one, its
 * latest HTML_MAX_RUNS runs, the drawn one shaded. */
static enum kvb_status runs_section(FILE *out, struct html_run *runs, int n, struct metrics_db **dbs,
                                    const char *const *paths, struct kvb_err *err)
{
    enum kvb_status st = KVB_OK;
    fputs("<h2>Runs</h2>\n", out);
    runs_head(out);
    if (n > 1) {
        for (int i = 0; i < n; i++) runs_row(out, base_name(paths[i]), &runs[i].sum, true);
    } else {
        int64_t *ids = NULL;
        size_t n_ids = 0;
        st = html_list_run_ids(dbs[0], &ids, &n_ids, err);
        for (size_t k = 0; st == KVB_OK && k < n_ids; k++) {
            if (ids[k] == runs[0].sum.run_id) {
                runs_row(out, base_name(paths[0]), &runs[0].sum, true);
                continue;
            }
            struct metrics_summary s;
            st = metrics_summary_load(dbs[0], ids[k], NULL, &s, err);
            if (st == KVB_OK) runs_row(out, base_name(paths[0]), &s, false);
            metrics_summary_free(&s);
        }
        kvb_free(ids);
    }
    fputs("</table>\n<p class=\"note\">One row per run: with several databases, the latest run of each (each "
          "drawn as its own line); with one, its latest runs, the drawn one shaded.</p>\n",
          out);
    return st;
}

/* ---- the page ----------------------------------------------------------------------- */

static void page_head(FILE *o, const struct metrics_summary *s, const char *const *paths, int n, bool compared)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>kvbatch report: ",
          o);
    esc(o, s->job_file ? base_name(s->job_file) : "run");
    fprintf(o, "</title>\n<style>%s</style></head><body>\n<h1>kvbatch report: ", css);
    esc(o, s->job_file);
    fputs("</h1>\n<p class=\"sub\">", o);
    if (n == 1) {
        fprintf(o, "run %lld of ", (long long)s->run_id);
        esc(o, paths[0]);
    } else {
        fprintf(o, "the latest runs of %d databases, %s:", n, compared ? "one after the other, compared" : "summed");
        for (int i = 0; i < n; i++) {
            fputc(' ', o);
            esc(o, paths[i]);
        }
    }
    char when[64];
    metrics_fmt_time(when, sizeof when, s->started_at);
    fputs(" &middot; model ", o);
    esc(o, s->model);
    fputs(" on ", o);
    esc(o, s->backend);
    fputs(" &middot; started ", o);
    esc(o, when);
    fputs("</p>\n", o);
}

enum kvb_status metrics_report_html(const char *const *paths, int n, int64_t run_id, FILE *out, struct kvb_err *err)
{
    if (n < 1 || !paths) return kvb_errf(err, KVB_ERR_INVALID_ARG, "no database given");
    struct html_run *runs = kvb_calloc((size_t)n, sizeof *runs);
    struct metrics_db **dbs = kvb_calloc((size_t)n, sizeof *dbs);
    struct slow_row *slow = NULL;
    size_t n_slow = 0;
    struct metrics_summary all = {0};
    struct metrics_db *cdb = NULL;
    char tmp[64] = "";
    enum kvb_status st = runs && dbs ? KVB_OK : kvb_errf(err, KVB_ERR_NOMEM, "out of memory drawing the report");
    for (int i = 0; i < n && st == KVB_OK; i++) {
        st = metrics_open_existing(paths[i], &dbs[i], err);
        if (st == KVB_OK)
            st = metrics_summary_load(dbs[i], n == 1 ? run_id : METRICS_RUN_LATEST, NULL, &runs[i].sum, err);
        if (st != KVB_OK) break;
        runs[i].db_path = paths[i];
        runs[i].color = palette[(size_t)i % N_PALETTE];
        if (n == 1) snprintf(runs[i].name, sizeof runs[i].name, "run %lld", (long long)runs[i].sum.run_id);
        else
            snprintf(runs[i].name, sizeof runs[i].name, "%s run %lld", base_name(paths[i]),
                     (long long)runs[i].sum.run_id);
        st = html_load_rows(dbs[i], &runs[i], err);
        if (st == KVB_OK) st = html_load_slowest(dbs[i], i, runs[i].sum.run_id, &slow, &n_slow, err);
    }
    /* The page's summary: the run's own, or the combination's (the warnings
     * about partial sums go on the page) */
    char *warn = NULL;
    size_t warn_len = 0;
    if (st == KVB_OK && n > 1) {
        FILE *wf = open_memstream(&warn, &warn_len);
        if (!wf) st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory drawing the report");
        if (st == KVB_OK) {
            st = metrics_combined_open(paths, n, wf, &cdb, tmp, err);
            fclose(wf);
        }
        if (st == KVB_OK) st = metrics_summary_load(cdb, 1, "all of them", &all, err);
    }
    const struct metrics_summary *sum = n > 1 ? &all : st == KVB_OK ? &runs[0].sum : NULL;
    /* Runs that did not overlap in time (nights, not shards): a sum over
     * them would give a wall time and a throughput of no run, so the page
     * opens with one row per run instead of the summed cards. */
    const bool compared = n > 1 && st == KVB_OK && runs_disjoint(runs, n);
    if (st == KVB_OK) {
        page_head(out, sum, paths, n, compared);
        if (warn && *warn) {
            fputs("<p class=\"note\">", out);
            esc(out, warn);
            fputs("</p>\n", out);
        }
        if (compared) {
            st = runs_section(out, runs, n, dbs, paths, err);
            fputs("<p class=\"note\">These runs did not overlap in time, so they are compared rather than summed: "
                  "each is drawn as its own line below. Errors and prefix reuse also show their sum.</p>\n",
                  out);
        } else {
            summary_cards(out, sum);
        }
        if (st == KVB_OK && (!time_charts(out, runs, n) || !latency_section(out, runs, n)))
            st = kvb_errf(err, KVB_ERR_NOMEM, "out of memory drawing the report");
    }
    if (st == KVB_OK) {
        reuse_section(out, runs, n, sum);
        errors_section(out, sum);
        slowest_section(out, slow, n_slow, runs, n);
        if (!compared) st = runs_section(out, runs, n, dbs, paths, err);
    }
    if (st == KVB_OK) {
        char now[64];
        metrics_fmt_time(now, sizeof now, metrics_now_unix());
        fputs("<p class=\"note\">Written by <code>kvbatch report --html</code> at ", out);
        esc(out, now);
        fputs(". The same figures as text: <code>kvbatch report DB</code>; as JSON or CSV: "
              "<code>--format json|csv</code>.</p>\n</body></html>\n",
              out);
    }
    free(warn); /* open_memstream's buffer */
    metrics_summary_free(&all);
    metrics_combined_close(cdb, tmp);
    html_slow_free(slow, n_slow);
    for (int i = 0; runs && i < n; i++) html_run_free(&runs[i]);
    for (int i = 0; dbs && i < n; i++) metrics_close(dbs[i]);
    kvb_free(runs);
    kvb_free(dbs);
    return st;
}
