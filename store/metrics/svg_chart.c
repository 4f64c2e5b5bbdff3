/* svg_chart.c — plot axes and lines as SVG text (see svg_chart.h).
 *
 * Coordinates are written with one decimal: a tenth of a pixel is finer
 * than any screen, and the page stays small. Every coordinate goes through
 * px_x/px_y, which clamp to the plot area, and every number printed is
 * checked finite first, so the browser never meets "NaN" in an attribute. */
#include "store/metrics/svg_chart.h"

#include <math.h>
#include <string.h>

#define FONT "font-family=\"system-ui, sans-serif\" font-size=\"12\" fill=\"#333\""

void svg_escape(FILE *out, const char *s)
{
    for (const char *c = s ? s : ""; *c; c++) {
        switch (*c) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&#39;", out); break;
        default: fputc(*c, out);
        }
    }
}

void svg_plot_init(struct svg_plot *p, FILE *out, int width, int height)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->width = width;
    p->height = height;
    p->left = 64;
    p->right = 16;
    p->top = 14;
    p->bottom = 44;
    p->x.lo = p->y.lo = 0;
    p->x.hi = p->y.hi = 1;
}

double svg_nice_step(double span, int target)
{
    if (!(span > 0) || !isfinite(span) || target < 1) return 1;
    double raw = span / target;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return nice * mag;
}

void svg_axis_fit(struct svg_axis *a)
{
    if (!isfinite(a->lo) || !isfinite(a->hi)) {
        a->lo = a->log ? 1 : 0;
        a->hi = a->log ? 10 : 1;
    }
    if (a->log) {
        if (!(a->lo > 0)) a->lo = a->hi > 0 ? a->hi / 10 : 1;
        if (!(a->hi > a->lo)) a->hi = a->lo * 10;
        a->lo = pow(10, floor(log10(a->lo) + 1e-9));
        a->hi = pow(10, ceil(log10(a->hi) - 1e-9));
        if (a->hi <= a->lo) a->hi = a->lo * 10;
        return;
    }
    if (a->hi < a->lo) {
        double t = a->lo;
        a->lo = a->hi;
        a->hi = t;
    }
    if (a->hi == a->lo) a->hi = a->lo + (a->lo != 0 ? fabs(a->lo) : 1);
    double step = svg_nice_step(a->hi - a->lo, 5);
    a->lo = floor(a->lo / step + 1e-9) * step;
    a->hi = ceil(a->hi / step - 1e-9) * step;
}

static double axis_t(const struct svg_axis *a, double v) { return a->log ? log10(v > 0 ? v : a->lo) : v; }

/* Fraction 0..1 of the way from lo to hi, clamped. */
static double axis_frac(const struct svg_axis *a, double v)
{
    double lo = axis_t(a, a->lo), hi = axis_t(a, a->hi);
    double f = hi > lo ? (axis_t(a, v) - lo) / (hi - lo) : 0;
    if (!isfinite(f)) f = 0;
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

static double px_x(const struct svg_plot *p, double v)
{
    return p->left + axis_frac(&p->x, v) * (p->width - p->left - p->right);
}

static double px_y(const struct svg_plot *p, double v)
{
    return p->height - p->bottom - axis_frac(&p->y, v) * (p->height - p->top - p->bottom);
}

/* A tick label: thousands as k, millions as M; decimals as the step needs. */
static void fmt_tick(char *buf, size_t cap, double v, double step)
{
    double a = fabs(v);
    if (a >= 1e6 && step >= 1e5) snprintf(buf, cap, "%gM", v / 1e6);
    else if (a >= 1e4 && step >= 1e3) snprintf(buf, cap, "%gk", v / 1e3);
    else {
        int dec = step > 0 && step < 1 ? (int)ceil(-log10(step) - 1e-9) : 0;
        if (dec > 6) dec = 6;
        snprintf(buf, cap, "%.*f", dec, v);
    }
}

static void tick_x(struct svg_plot *p, double v, double step)
{
    double sc = p->x.scale ? p->x.scale : 1, x = px_x(p, v);
    char lab[32];
    fmt_tick(lab, sizeof lab, v * sc, step * sc);
    fprintf(p->out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e5e5e5\"/>", x, p->top, x,
            p->height - p->bottom);
    fprintf(p->out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" " FONT ">%s</text>\n", x,
            p->height - p->bottom + 16, lab);
}

static void tick_y(struct svg_plot *p, double v, double step)
{
    double sc = p->y.scale ? p->y.scale : 1, y = px_y(p, v);
    char lab[32];
    fmt_tick(lab, sizeof lab, v * sc, step * sc);
    fprintf(p->out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>", p->left, y,
            p->width - p->right, y);
    fprintf(p->out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" " FONT ">%s</text>\n", p->left - 6, y + 4, lab);
}

/* Ticks of one axis: round steps, or decades (with 2 and 5 when few). */
static void ticks(struct svg_plot *p, const struct svg_axis *a, void (*draw)(struct svg_plot *, double, double))
{
    if (a->log) {
        int d0 = (int)floor(log10(a->lo) + 1e-9), d1 = (int)ceil(log10(a->hi) - 1e-9);
        bool minor = d1 - d0 <= 3;
        for (int d = d0; d <= d1; d++) {
            double base = pow(10, d);
            draw(p, base, base);
            if (!minor || d == d1) continue;
            draw(p, 2 * base, base);
            draw(p, 5 * base, base);
        }
        return;
    }
    /* round in the units the labels show */
    double sc = a->scale ? a->scale : 1;
    double step = svg_nice_step((a->hi - a->lo) * sc, 5) / sc;
    for (double v = ceil(a->lo / step - 1e-9) * step; v <= a->hi + step * 1e-6; v += step)
        draw(p, fabs(v) < step * 1e-9 ? 0 : v, step);
}

void svg_plot_begin(struct svg_plot *p, const char *label)
{
    FILE *o = p->out;
    fprintf(o, "<svg role=\"img\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">", p->width, p->height, p->width,
            p->height);
    fputs("<title>", o);
    svg_escape(o, label);
    fputs("</title>\n", o);
    ticks(p, &p->x, tick_x);
    ticks(p, &p->y, tick_y);
    fprintf(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", p->left, p->top,
            p->width - p->left - p->right, p->height - p->top - p->bottom);
    if (p->x.title) {
        fprintf(o, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" " FONT ">",
                p->left + (p->width - p->left - p->right) / 2.0, p->height - 6);
        svg_escape(o, p->x.title);
        fputs("</text>\n", o);
    }
    if (p->y.title) {
        double cy = p->top + (p->height - p->top - p->bottom) / 2.0;
        fprintf(o, "<text transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\" " FONT ">", cy);
        svg_escape(o, p->y.title);
        fputs("</text>\n", o);
    }
}

void svg_plot_end(struct svg_plot *p) { fputs("</svg>\n", p->out); }

static void line_open(struct svg_plot *p, const char *color, const char *dash)
{
    fprintf(p->out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s%s%s points=\"", color,
            dash ? " stroke-dasharray=\"" : "", dash ? dash : "", dash ? "\"" : "");
}

static void line_close(struct svg_plot *p, const char *name)
{
    fputs("\">", p->out);
    if (name) {
        fputs("<title>", p->out);
        svg_escape(p->out, name);
        fputs("</title>", p->out);
    }
    fputs("</polyline>\n", p->out);
}

void svg_plot_line(struct svg_plot *p, const double *xs, const double *ys, size_t n, const char *color,
                   const char *dash, bool step, double x_end, const char *name)
{
    bool open = false;
    for (size_t i = 0; i < n; i++) {
        double x1 = step ? (i + 1 < n ? xs[i + 1] : x_end) : xs[i];
        bool ok = isfinite(xs[i]) && isfinite(ys[i]) && isfinite(x1);
        if (!ok) {
            if (open) line_close(p, name);
            open = false;
            continue;
        }
        if (!open) line_open(p, color, dash);
        open = true;
        fprintf(p->out, "%.1f,%.1f ", px_x(p, xs[i]), px_y(p, ys[i]));
        if (step) fprintf(p->out, "%.1f,%.1f ", px_x(p, x1), px_y(p, ys[i]));
    }
    if (open) line_close(p, name);
}

void svg_plot_rug(struct svg_plot *p, const double *xs, size_t n, const char *color, const char *name)
{
    if (n == 0) return;
    fprintf(p->out, "<path stroke=\"%s\" stroke-width=\"1.5\" d=\"", color);
    int y1 = p->height - p->bottom;
    for (size_t i = 0; i < n; i++)
        if (isfinite(xs[i])) fprintf(p->out, "M%.1f %d V%d ", px_x(p, xs[i]), y1, y1 - 8);
    fputs("\">", p->out);
    if (name) {
        fputs("<title>", p->out);
        svg_escape(p->out, name);
        fputs("</title>", p->out);
    }
    fputs("</path>\n", p->out);
}

void svg_plot_vline(struct svg_plot *p, double x, const char *color, const char *label, int row)
{
    if (!isfinite(x)) return;
    double px = px_x(p, x);
    fprintf(p->out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"2 3\"/>", px,
            p->top, px, p->height - p->bottom, color);
    if (label) {
        fprintf(p->out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" " FONT ">", px, p->top + 12 + 13 * row);
        svg_escape(p->out, label);
        fputs("</text>", p->out);
    }
    fputc('\n', p->out);
}
