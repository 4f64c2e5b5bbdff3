/* svg_chart.h — the few drawing primitives the HTML report needs, written
 * as inline SVG text: a plot area with linear or logarithmic axes, ticks at
 * round numbers, grid, axis titles, and polylines. No script, no external
 * reference; every number written is finite (a non-finite point is dropped,
 * so a bad value shows as a gap rather than an SVG the browser refuses).
 *
 * Used by metrics_html.c; knows nothing about metrics. A plot writes to the
 * FILE it is given between svg_plot_begin and svg_plot_end. */
#ifndef KVB_SVG_CHART_H
#define KVB_SVG_CHART_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct svg_axis {
    double lo, hi;     /* data range shown; for log, both > 0 */
    bool log;          /* base-10 logarithmic */
    const char *title; /* e.g. "time since run start (s)" */
    double scale;      /* tick labels show value * scale (0: 1) — e.g. seconds as minutes */
};

struct svg_plot {
    FILE *out;
    int width, height;            /* px, the whole image */
    int left, right, top, bottom; /* margins, px, around the plot area */
    struct svg_axis x, y;
};

/* Fills p with a plot of the given size and default margins. */
void svg_plot_init(struct svg_plot *p, FILE *out, int width, int height);

/* Opens the <svg> (with `label` as its accessible title), draws grid, ticks
 * and axis titles. The ranges must be set (svg_axis_fit helps). */
void svg_plot_begin(struct svg_plot *p, const char *label);
void svg_plot_end(struct svg_plot *p);

/* Widens [lo, hi] to round numbers (and to a non-empty range) for the axis;
 * for a log axis, to whole decades, lo > 0 kept. */
void svg_axis_fit(struct svg_axis *a);

/* A round step near span / target (1, 2 or 5 times a power of ten). */
double svg_nice_step(double span, int target);

/* Draws the points (xs[i], ys[i]) as one line. `step`: a staircase whose
 * step i is held from xs[i] to xs[i + 1] (a histogram over bins), the last
 * one held to x_end. dash: NULL for solid, else an SVG dasharray. Points
 * outside the range are clamped to the plot area; non-finite ones break
 * the line. */
void svg_plot_line(struct svg_plot *p, const double *xs, const double *ys, size_t n, const char *color,
                   const char *dash, bool step, double x_end, const char *name);

/* Short vertical marks at the bottom edge at the given x (a rug). */
void svg_plot_rug(struct svg_plot *p, const double *xs, size_t n, const char *color, const char *name);

/* A vertical line across the plot at x, with a label near its top, in text
 * row `row` (0, 1, …: so that labels of close lines do not overlap). */
void svg_plot_vline(struct svg_plot *p, double x, const char *color, const char *label, int row);

/* Writes s with &, <, >, " and ' escaped (for SVG and HTML text and attributes). */
void svg_escape(FILE *out, const char *s);

#endif
