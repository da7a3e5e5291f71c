/* report_page.c - the SVG and HTML of `hearth report`.  See report_page.h. */
#include "report_page.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "svg.h"

#define WIDTH 960.0
#define MARGIN_L 90.0       /* room for the y tick labels and the axis title */
#define MARGIN_R 30.0
#define PLOT_H 220.0
#define LINE_H 16.0
/* Beyond this many configs or curves the legend stops (the HTML table has them all). */
#define LEGEND_MAX 30
/* Evidence is shortened to this many lines of EVIDENCE_COLS bytes in the SVG. */
#define EVIDENCE_LINES 3
#define EVIDENCE_COLS 140

static const char *const palette[] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
};
#define N_COLORS (sizeof palette / sizeof palette[0])

static const char *scale_name(report_scale s)
{
    return s == REPORT_SCALE_NODES ? "nodes" : s == REPORT_SCALE_DEVICES ? "devices" : "ranks";
}

static int64_t scale_value(const report_config *c, report_scale s)
{
    return s == REPORT_SCALE_NODES ? c->nodes : s == REPORT_SCALE_DEVICES ? c->devices
                                                                          : c->ranks;
}

/* Frame, grid lines and tick labels of a plot whose area starts at (x, y). */
static void axes(svg_doc *d, double x, double y, double w, double h, const svg_scale *xs,
                 const svg_scale *ys, const char *xtitle, const char *ytitle)
{
    double ticks[32];
    char num[32];
    int n = svg_scale_ticks(ys, ticks, 32);
    for (int i = 0; i < n; i++) {
        double ty = svg_scale_map(ys, ticks[i]);
        svg_line(d, x, ty, x + w, ty, "#e0e0e0", 1, NULL);
        svg_format_number(ticks[i], num, sizeof num);
        svg_text(d, x - 6, ty + 4, SVG_END, 11, 0, 0, "#333333", num);
    }
    if (xs) {
        n = svg_scale_ticks(xs, ticks, 32);
        for (int i = 0; i < n; i++) {
            double tx = svg_scale_map(xs, ticks[i]);
            svg_line(d, tx, y + h, tx, y + h + 4, "#333333", 1, NULL);
            svg_format_number(ticks[i], num, sizeof num);
            svg_text(d, tx, y + h + 16, SVG_MIDDLE, 11, 0, 0, "#333333", num);
        }
    }
    svg_line(d, x, y, x, y + h, "#333333", 1, NULL);
    svg_line(d, x, y + h, x + w, y + h, "#333333", 1, NULL);
    if (xtitle)
        svg_text(d, x + w / 2, y + h + 34, SVG_MIDDLE, 12, 0, 0, "#333333", xtitle);
    svg_text(d, x - 62, y + h / 2, SVG_MIDDLE, 12, 0, -90, "#333333", ytitle);
}

static size_t legend_lines(size_t n)
{
    return n > LEGEND_MAX ? LEGEND_MAX + 1 : n;
}

/* Tokens/s per config: bars at the median, error bars from min to max.  Returns the
 * panel's height. */
static double panel_throughput(svg_doc *d, const report_data *r, double y0)
{
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000",
             "Throughput per config (tokens/s: median of repeats, min-max as error bar)");
    double px = MARGIN_L, py = y0 + 36, pw = WIDTH - MARGIN_L - MARGIN_R;
    double *vals = malloc(2 * (r->n_configs ? r->n_configs : 1) * sizeof *vals);
    if (!vals) {
        d->failed = 1;
        return 0;
    }
    for (size_t i = 0; i < r->n_configs; i++) {
        vals[2 * i] = r->configs[i].tps_max;
        vals[2 * i + 1] = r->configs[i].tps_min;
    }
    svg_scale ys;
    svg_scale_fit(&ys, vals, 2 * r->n_configs, 1, py + PLOT_H, py);
    free(vals);
    axes(d, px, py, pw, PLOT_H, NULL, &ys, NULL, "tokens/s");
    double slot = pw / (double)r->n_configs, bw = fmin(slot * 0.6, 60);
    char name[32], tip[512], a[32], b[32], c[32];
    for (size_t i = 0; i < r->n_configs; i++) {
        const report_config *cf = &r->configs[i];
        double cx = px + slot * ((double)i + 0.5);
        svg_format_number(cf->tps_median, a, sizeof a);
        svg_format_number(cf->tps_min, b, sizeof b);
        svg_format_number(cf->tps_max, c, sizeof c);
        snprintf(tip, sizeof tip, "%s: median %s tokens/s, min %s, max %s, %zu runs",
                 cf->label, a, b, c, cf->n_runs);
        double base = svg_scale_map(&ys, 0), top = svg_scale_map(&ys, cf->tps_median);
        svg_rect(d, cx - bw / 2, top, bw, base - top, palette[i % N_COLORS], tip);
        if (cf->n_tps > 1) {
            double lo = svg_scale_map(&ys, cf->tps_min), hi = svg_scale_map(&ys, cf->tps_max);
            svg_line(d, cx, lo, cx, hi, "#000000", 1.5, NULL);
            svg_line(d, cx - bw / 4, lo, cx + bw / 4, lo, "#000000", 1.5, NULL);
            svg_line(d, cx - bw / 4, hi, cx + bw / 4, hi, "#000000", 1.5, NULL);
        }
        if (r->n_configs <= 40)
            svg_text(d, cx, fmin(top, svg_scale_map(&ys, cf->tps_max)) - 4, SVG_MIDDLE, 10, 0,
                     0, "#333333", a);
        snprintf(name, sizeof name, "C%zu", i + 1);
        svg_text(d, cx, py + PLOT_H + 14, SVG_MIDDLE, 10, 0, r->n_configs > 30 ? -60 : 0,
                 "#333333", name);
    }
    double ly = py + PLOT_H + 40;
    for (size_t i = 0; i < legend_lines(r->n_configs); i++) {
        const report_config *cf = &r->configs[i];
        if (i == LEGEND_MAX) {
            snprintf(tip, sizeof tip, "... and %zu more configs (the HTML report lists all)",
                     r->n_configs - LEGEND_MAX);
        } else {
            svg_format_number(cf->tps_median, a, sizeof a);
            svg_format_number(cf->tps_min, b, sizeof b);
            svg_format_number(cf->tps_max, c, sizeof c);
            snprintf(tip, sizeof tip, "C%zu  %s  (%zu run%s; median %s, min %s, max %s)",
                     i + 1, cf->label, cf->n_runs, cf->n_runs == 1 ? "" : "s", a, b, c);
            svg_rect(d, px, ly + LINE_H * (double)i - 9, 10, 10, palette[i % N_COLORS], NULL);
        }
        svg_text(d, px + 16, ly + LINE_H * (double)i, SVG_START, 11, 0, 0, "#000000", tip);
    }
    return ly + LINE_H * (double)legend_lines(r->n_configs) + 10 - y0;
}

/* Median tokens/s over nodes or devices, and the ideal linear scaling from the smallest
 * size's best config. */
static double panel_scaling(svg_doc *d, const report_data *r, double y0)
{
    const char *what = scale_name(r->scale);
    char title[128];
    snprintf(title, sizeof title, "Scaling: tokens/s over %s (dashed: ideal linear)", what);
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000", title);
    double px = MARGIN_L, py = y0 + 36, pw = WIDTH - MARGIN_L - MARGIN_R;
    size_t n = r->n_configs;
    double *xv = malloc(3 * (n ? n : 1) * sizeof *xv);
    if (!xv) {
        d->failed = 1;
        return 0;
    }
    double *yv = xv + n, *ideal = xv + 2 * n;
    double x_min = INFINITY, best_at_min = NAN;
    for (size_t i = 0; i < n; i++) {
        int64_t s = scale_value(&r->configs[i], r->scale);
        xv[i] = s > 0 ? (double)s : NAN;
        yv[i] = r->configs[i].tps_max;
        if (isfinite(xv[i]) && xv[i] < x_min)
            x_min = xv[i];
    }
    for (size_t i = 0; i < n; i++)
        if (xv[i] == x_min && isfinite(r->configs[i].tps_median) &&
            !(best_at_min >= r->configs[i].tps_median))
            best_at_min = r->configs[i].tps_median;
    for (size_t i = 0; i < n; i++)
        ideal[i] = isfinite(xv[i]) ? best_at_min * xv[i] / x_min : NAN;
    svg_scale xs, ys;
    svg_scale_fit(&xs, xv, n, 1, px, px + pw);
    /* The y range covers the measurements and the ideal line. */
    double *both = malloc(2 * (n ? n : 1) * sizeof *both);
    if (!both) {
        free(xv);
        d->failed = 1;
        return 0;
    }
    memcpy(both, yv, n * sizeof *both);
    memcpy(both + n, ideal, n * sizeof *both);
    svg_scale_fit(&ys, both, 2 * n, 1, py + PLOT_H, py);
    free(both);
    axes(d, px, py, pw, PLOT_H, &xs, &ys, what, "tokens/s");
    /* Ideal line: from the origin-side point through the largest size. */
    double x_max = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (isfinite(xv[i]) && xv[i] > x_max)
            x_max = xv[i];
    if (isfinite(best_at_min) && isfinite(x_max))
        svg_line(d, svg_scale_map(&xs, x_min), svg_scale_map(&ys, best_at_min),
                 svg_scale_map(&xs, x_max), svg_scale_map(&ys, best_at_min * x_max / x_min),
                 "#888888", 1.5, "4 3");
    char tip[512], a[32];
    for (size_t i = 0; i < n; i++) {
        const report_config *cf = &r->configs[i];
        double cx = svg_scale_map(&xs, xv[i]);
        if (cf->n_tps > 1)
            svg_line(d, cx, svg_scale_map(&ys, cf->tps_min), cx, svg_scale_map(&ys, cf->tps_max),
                     palette[i % N_COLORS], 1.5, NULL);
        svg_format_number(cf->tps_median, a, sizeof a);
        snprintf(tip, sizeof tip, "C%zu %s: %s tokens/s at %.0f %s", i + 1, cf->label, a,
                 xv[i], what);
        svg_circle(d, cx, svg_scale_map(&ys, cf->tps_median), 5, palette[i % N_COLORS], tip);
    }
    free(xv);
    return PLOT_H + 36 + 50;
}

/* The loss of each chosen run over its steps. */
static double panel_loss(svg_doc *d, const report_data *r, double y0)
{
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000", "Loss per step");
    double px = MARGIN_L, py = y0 + 36, pw = WIDTH - MARGIN_L - MARGIN_R;
    size_t total = 0;
    for (size_t i = 0; i < r->n_curves; i++)
        total += r->curves[i].n;
    double *xv = malloc(2 * (total ? total : 1) * sizeof *xv);
    if (!xv) {
        d->failed = 1;
        return 0;
    }
    double *yv = xv + total;
    size_t k = 0;
    for (size_t i = 0; i < r->n_curves; i++)
        for (size_t j = 0; j < r->curves[i].n; j++, k++) {
            xv[k] = r->curves[i].step[j];
            yv[k] = r->curves[i].loss[j];
        }
    svg_scale xs, ys;
    svg_scale_fit(&xs, xv, total, 0, px, px + pw);
    svg_scale_fit(&ys, yv, total, 0, py + PLOT_H, py);
    axes(d, px, py, pw, PLOT_H, &xs, &ys, "step", "loss");
    k = 0;
    for (size_t i = 0; i < r->n_curves; i++) {
        const report_curve *c = &r->curves[i];
        for (size_t j = 0; j < c->n; j++) {
            xv[k + j] = svg_scale_map(&xs, c->step[j]);
            yv[k + j] = svg_scale_map(&ys, c->loss[j]);
        }
        svg_polyline(d, xv + k, yv + k, c->n, palette[i % N_COLORS], 2, NULL);
        k += c->n;
    }
    free(xv);
    double ly = py + PLOT_H + 50;
    char line[512];
    for (size_t i = 0; i < legend_lines(r->n_curves); i++) {
        if (i == LEGEND_MAX) {
            snprintf(line, sizeof line, "... and %zu more runs", r->n_curves - LEGEND_MAX);
        } else {
            const report_curve *c = &r->curves[i];
            char last[32];
            svg_format_number(c->n ? c->loss[c->n - 1] : NAN, last, sizeof last);
            snprintf(line, sizeof line, "%s  %s  (final loss %s)", c->run_id, c->label, last);
            svg_line(d, px, ly + LINE_H * (double)i - 4, px + 12, ly + LINE_H * (double)i - 4,
                     palette[i % N_COLORS], 3, NULL);
        }
        svg_text(d, px + 18, ly + LINE_H * (double)i, SVG_START, 11, 0, 0, "#000000", line);
    }
    return ly + LINE_H * (double)legend_lines(r->n_curves) + 10 - y0;
}

/* Lines of the decisions panel for decision x (its head line and the evidence's). */
static size_t evidence_lines(const report_decision *x)
{
    size_t n = (strlen(x->evidence) + EVIDENCE_COLS - 1) / EVIDENCE_COLS;
    return n > EVIDENCE_LINES ? EVIDENCE_LINES : n ? n : 1;
}

static double panel_decisions(svg_doc *d, const report_data *r, double y0)
{
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000", "Selection decisions");
    double y = y0 + 42;
    char line[EVIDENCE_COLS + 400];
    for (size_t i = 0; i < r->n_decisions; i++) {
        const report_decision *x = &r->decisions[i];
        snprintf(line, sizeof line, "%s: %.200s  (%s, %s)", x->kind, x->decision, x->method,
                 x->created_at);
        svg_text(d, 30, y, SVG_START, 12, 1, 0, "#000000", line);
        y += LINE_H;
        size_t len = strlen(x->evidence), n = evidence_lines(x);
        for (size_t k = 0; k < n; k++) {
            size_t off = k * EVIDENCE_COLS, cut = len - off < EVIDENCE_COLS ? len - off
                                                                             : EVIDENCE_COLS;
            int more = k + 1 == n && off + cut < len;
            snprintf(line, sizeof line, "%s%.*s%s", k ? "  " : "evidence: ", (int)cut,
                     x->evidence + off, more ? " ..." : "");
            svg_text(d, 40, y, SVG_START, 10, 0, 0, "#444444", line);
            y += LINE_H - 2;
        }
        y += 6;
    }
    return y - y0 + 10;
}

static double height_estimate(const report_data *r)
{
    double h = 60 + 36 + PLOT_H + 40 + LINE_H * (double)legend_lines(r->n_configs) + 10;
    if (r->scale != REPORT_SCALE_NONE)
        h += PLOT_H + 86;
    h += 36 + PLOT_H + 50 + LINE_H * (double)legend_lines(r->n_curves) + 10;
    if (r->n_decisions) {
        h += 52;
        for (size_t i = 0; i < r->n_decisions; i++)
            h += LINE_H + (LINE_H - 2) * (double)evidence_lines(&r->decisions[i]) + 6;
    }
    return h + 10;
}

int report_page_svg(const report_data *r, char **out, size_t *len, hearth_err *err)
{
    svg_doc d = { 0 };
    char title[256], sub[256];
    snprintf(title, sizeof title, "hearth report: %s", r->experiment);
    snprintf(sub, sizeof sub, "%zu completed run%s in %zu config%s; %zu loss curve%s; "
             "%zu selection decision%s", r->n_runs, r->n_runs == 1 ? "" : "s", r->n_configs,
             r->n_configs == 1 ? "" : "s", r->n_curves, r->n_curves == 1 ? "" : "s",
             r->n_decisions, r->n_decisions == 1 ? "" : "s");
    svg_begin(&d, WIDTH, height_estimate(r), title);
    svg_text(&d, 20, 28, SVG_START, 20, 1, 0, "#000000", title);
    svg_text(&d, 20, 48, SVG_START, 12, 0, 0, "#555555", sub);
    double y = 60;
    y += panel_throughput(&d, r, y);
    if (r->scale != REPORT_SCALE_NONE)
        y += panel_scaling(&d, r, y);
    y += panel_loss(&d, r, y);
    if (r->n_decisions)
        panel_decisions(&d, r, y);
    return svg_finish(&d, out, len, err);
}

/* Writes a table cell with escaped text. */
static void cell(svg_doc *d, const char *tag, const char *text)
{
    svg_raw(d, "<%s>", tag);
    if (!d->failed && svg_escape(&d->b, text))
        d->failed = 1;
    svg_raw(d, "</%s>", tag);
}

static void num_cell(svg_doc *d, double x)
{
    char buf[32];
    if (isfinite(x))
        snprintf(buf, sizeof buf, "%.6g", x);
    else
        snprintf(buf, sizeof buf, "-");
    svg_raw(d, "<td class=\"n\">%s</td>", buf);
}

int report_page_html(const report_data *r, const char *svg, char **out, size_t *len,
                     hearth_err *err)
{
    svg_doc d = { 0 };
    svg_raw(&d, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                "<title>hearth report: ");
    if (svg_escape(&d.b, r->experiment))
        d.failed = 1;
    svg_raw(&d, "</title>\n<style>\n"
                "body { font-family: sans-serif; margin: 2em; color: #222; }\n"
                "table { border-collapse: collapse; margin: 1em 0; }\n"
                "th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; "
                "vertical-align: top; }\n"
                "td.n { text-align: right; font-variant-numeric: tabular-nums; }\n"
                "pre { white-space: pre-wrap; word-break: break-all; max-width: 70em; "
                "margin: 0; }\n"
                "</style>\n</head>\n<body>\n<h1>hearth report: ");
    if (svg_escape(&d.b, r->experiment))
        d.failed = 1;
    svg_raw(&d, "</h1>\n<div class=\"charts\">\n%s</div>\n", svg);
    svg_raw(&d, "<h2>Configs</h2>\n<table>\n<tr><th>#</th><th>config</th><th>runs</th>"
                "<th>tokens/s median</th><th>min</th><th>max</th><th>nodes</th>"
                "<th>devices</th><th>ranks</th><th>config hash</th></tr>\n");
    for (size_t i = 0; i < r->n_configs; i++) {
        const report_config *c = &r->configs[i];
        svg_raw(&d, "<tr><td>C%zu</td>", i + 1);
        cell(&d, "td", c->label);
        svg_raw(&d, "<td class=\"n\">%zu</td>", c->n_runs);
        num_cell(&d, c->tps_median);
        num_cell(&d, c->tps_min);
        num_cell(&d, c->tps_max);
        svg_raw(&d, "<td class=\"n\">%lld</td><td class=\"n\">%lld</td><td class=\"n\">%lld"
                "</td>", (long long)c->nodes, (long long)c->devices, (long long)c->ranks);
        cell(&d, "td", c->hash);
        svg_raw(&d, "</tr>\n");
    }
    svg_raw(&d, "</table>\n<h2>Loss curves</h2>\n<table>\n<tr><th>run</th><th>config</th>"
                "<th>steps</th><th>first loss</th><th>final loss</th></tr>\n");
    for (size_t i = 0; i < r->n_curves; i++) {
        const report_curve *c = &r->curves[i];
        svg_raw(&d, "<tr>");
        cell(&d, "td", c->run_id);
        cell(&d, "td", c->label);
        svg_raw(&d, "<td class=\"n\">%zu</td>", c->n);
        num_cell(&d, c->n ? c->loss[0] : NAN);
        num_cell(&d, c->n ? c->loss[c->n - 1] : NAN);
        svg_raw(&d, "</tr>\n");
    }
    svg_raw(&d, "</table>\n");
    if (r->n_decisions) {
        svg_raw(&d, "<h2>Selection decisions</h2>\n<table>\n<tr><th>kind</th><th>decision"
                    "</th><th>method</th><th>subject</th><th>evidence</th><th>at</th></tr>\n");
        for (size_t i = 0; i < r->n_decisions; i++) {
            const report_decision *x = &r->decisions[i];
            svg_raw(&d, "<tr>");
            cell(&d, "td", x->kind);
            svg_raw(&d, "<td><pre>");
            if (!d.failed && svg_escape(&d.b, x->decision))
                d.failed = 1;
            svg_raw(&d, "</pre></td>");
            cell(&d, "td", x->method);
            svg_raw(&d, "<td><pre>");
            if (!d.failed && svg_escape(&d.b, x->subject))
                d.failed = 1;
            svg_raw(&d, "</pre></td><td><pre>");
            if (!d.failed && svg_escape(&d.b, x->evidence))
                d.failed = 1;
            svg_raw(&d, "</pre></td>");
            cell(&d, "td", x->created_at);
            svg_raw(&d, "</tr>\n");
        }
        svg_raw(&d, "</table>\n");
    }
    svg_raw(&d, "</body>\n</html>\n");
    return svg_take(&d, out, len, err);
}
