/* report_page.c - the SVG and HTML of `hearth report`.  See report_page.h. */
#include "report_page.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_style.h"
#include "svg.h"

#define WIDTH 960.0
#define MARGIN_L 90.0       /* room for the y tick labels and the axis title */
#define MARGIN_R 30.0
#define PLOT_W (WIDTH - MARGIN_L - MARGIN_R)
#define PLOT_H 220.0
#define LINE_H 16.0
/* Beyond this many configs or curves the legend stops (the HTML table has them all). */
#define LEGEND_MAX 30
/* Evidence is shortened to this many lines of EVIDENCE_COLS bytes in the SVG. */
#define EVIDENCE_LINES 3
#define EVIDENCE_COLS 140
/* The advance of one character of 10-unit text, about (DejaVu Sans is a wide font). */
#define CHAR_W 6.0
/* A bar's label ("C12 tp=2 ranks=8") is cut after this many characters. */
#define BAR_LABEL_MAX 40
/* Keys of a label that label_short looks at; more are written as they are. */
#define LABEL_KEYS 16
/* Radius of a config's marker in plots, in legends and on its bar. */
#define MARKER_R 5.0
#define SWATCH_R 3.5

/* The ideal-scaling lines' dashes: longer gaps than any config's (report_style.c). */
#define IDEAL_DASH "3 5"

/* Curves of runs outside the report's configs (a run named with --runs that did not
 * complete) are drawn in this. */
#define OTHER_COLOUR "#555555"

static const char *scale_name(report_scale s)
{
    return s == REPORT_SCALE_NODES ? "nodes" : s == REPORT_SCALE_DEVICES ? "devices" : "ranks";
}

/* Config i's style, or a neutral one for REPORT_NONE. */
static report_style style_of(size_t i)
{
    if (i == REPORT_NONE)
        return (report_style){ .colour = OTHER_COLOUR, .marker = SVG_CIRCLE, .dash = NULL };
    return report_style_of(i);
}

/* Opens the group of config i's shapes: class "config C<i+1>" in every panel. */
static void config_group(svg_doc *d, size_t i, const char *tip)
{
    char cls[48];
    if (i == REPORT_NONE)
        snprintf(cls, sizeof cls, "config other");
    else
        snprintf(cls, sizeof cls, "config C%zu", i + 1);
    svg_group_begin(d, cls, tip);
}

/* Appends s[0..n) to buf (of size `size`, *pos used), cut to fit. */
static void add(char *buf, size_t size, size_t *pos, const char *s, size_t n)
{
    if (*pos + 1 >= size)
        return;
    if (n > size - 1 - *pos)
        n = size - 1 - *pos;
    memcpy(buf + *pos, s, n);
    *pos += n;
    buf[*pos] = 0;
}

/* Whether the dotted key[0..klen) ends with the dotted part suf[0..slen). */
static int key_ends_with(const char *key, size_t klen, const char *suf, size_t slen)
{
    return klen >= slen && memcmp(key + klen - slen, suf, slen) == 0 &&
           (klen == slen || key[klen - slen - 1] == '.');
}

/* A config's label (report_data_label's "key=value ...") with each dotted key cut to its
 * shortest ending that no other key of the label shares: "parallel.tp=2 ranks=2" becomes
 * "tp=2 ranks=2", while parallel.tp and parallel.encoder.tp stay "tp" and "encoder.tp". */
static void label_short(const char *label, char *buf, size_t size)
{
    const char *key[LABEL_KEYS];
    size_t klen[LABEL_KEYS];
    int n = 0;
    for (const char *p = label; *p && n < LABEL_KEYS;) {
        size_t tok = strcspn(p, " ");
        const char *eq = memchr(p, '=', tok);
        if (eq) {
            key[n] = p;
            klen[n++] = (size_t)(eq - p);
        }
        p += tok + strspn(p + tok, " ");
    }
    size_t pos = 0;
    buf[0] = 0;
    int k = 0;
    for (const char *p = label; *p;) {
        size_t tok = strcspn(p, " ");
        size_t from = 0;   /* where the written part of the token starts */
        if (k < n && p == key[k]) {
            size_t start = klen[k];
            for (;;) {
                while (start > 0 && key[k][start - 1] != '.')
                    start--;
                int shared = 0;
                for (int j = 0; j < n && !shared; j++)
                    shared = j != k && key_ends_with(key[j], klen[j], key[k] + start,
                                                     klen[k] - start);
                if (!shared || start == 0)
                    break;
                start--;
            }
            from = start;
            k++;
        }
        add(buf, size, &pos, p + from, tok - from);
        p += tok;
        size_t sp = strspn(p, " ");
        if (sp && p[sp])
            add(buf, size, &pos, " ", 1);
        p += sp;
    }
}

/* Config i's label under its bar: "C<i+1>" and its short label, cut at BAR_LABEL_MAX
 * characters. */
static void bar_label(const report_config *c, size_t i, char *buf, size_t size)
{
    char sl[256];
    label_short(c->label, sl, sizeof sl);
    snprintf(buf, size, "C%zu %s", i + 1, sl);
    if (strlen(buf) > BAR_LABEL_MAX && size > BAR_LABEL_MAX)
        snprintf(buf + BAR_LABEL_MAX - 3, size - (BAR_LABEL_MAX - 3), "...");
}

/* How bars are labelled: across (two lines: "C3" and the short label) when every label
 * fits its bar's width, else turned to run down from the axis.  Returns the height the
 * labels take under the plot. */
static double bar_labels(const report_data *r, int *turned)
{
    double slot = PLOT_W / (double)(r->n_configs ? r->n_configs : 1);
    size_t longest = 0;
    char buf[BAR_LABEL_MAX + 8];
    for (size_t i = 0; i < r->n_configs; i++) {
        bar_label(&r->configs[i], i, buf, sizeof buf);
        size_t n = strlen(buf);
        longest = n > longest ? n : longest;
    }
    *turned = CHAR_W * (double)longest > slot - 6;
    return *turned ? 10 + CHAR_W * (double)longest : 30;
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

/* Tokens/s per config: bars at the median in the config's colour with its marker in
 * white near the top, error bars from min to max, labels of what varies under the bars.
 * Returns the panel's height. */
static double panel_throughput(svg_doc *d, const report_data *r, double y0)
{
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000",
             "Throughput per config (tokens/s: median of repeats, min-max as error bar)");
    double px = MARGIN_L, py = y0 + 36, pw = PLOT_W;
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
    int turned;
    double label_h = bar_labels(r, &turned);
    double slot = pw / (double)r->n_configs, bw = fmin(slot * 0.6, 60);
    char name[BAR_LABEL_MAX + 8], tip[512], a[32], b[32], c[32];
    for (size_t i = 0; i < r->n_configs; i++) {
        const report_config *cf = &r->configs[i];
        report_style st = report_style_of(i);
        double cx = px + slot * ((double)i + 0.5);
        svg_format_number(cf->tps_median, a, sizeof a);
        svg_format_number(cf->tps_min, b, sizeof b);
        svg_format_number(cf->tps_max, c, sizeof c);
        snprintf(tip, sizeof tip, "C%zu %s: median %s tokens/s, min %s, max %s, %zu runs",
                 i + 1, cf->label, a, b, c, cf->n_runs);
        config_group(d, i, tip);
        double base = svg_scale_map(&ys, 0), top = svg_scale_map(&ys, cf->tps_median);
        svg_rect(d, cx - bw / 2, top, bw, base - top, st.colour, NULL);
        /* The marker ties the bar to the config's points and curves in the other panels
         * (beyond ten configs the colours repeat, the markers do not); at the bar's foot,
         * clear of the error bar. */
        double mr = fmin(MARKER_R, bw / 2 - 2);
        if (base - top > 4 * mr && mr >= 2)
            svg_marker(d, cx, base - 2 * mr, mr, st.marker, "#ffffff", NULL, NULL);
        if (cf->n_tps > 1) {
            double lo = svg_scale_map(&ys, cf->tps_min), hi = svg_scale_map(&ys, cf->tps_max);
            svg_line(d, cx, lo, cx, hi, "#000000", 1.5, NULL);
            svg_line(d, cx - bw / 4, lo, cx + bw / 4, lo, "#000000", 1.5, NULL);
            svg_line(d, cx - bw / 4, hi, cx + bw / 4, hi, "#000000", 1.5, NULL);
        }
        svg_group_end(d);
        if (r->n_configs <= 40)
            svg_text(d, cx, fmin(top, svg_scale_map(&ys, cf->tps_max)) - 4, SVG_MIDDLE, 10, 0,
                     0, "#333333", a);
        bar_label(cf, i, name, sizeof name);
        if (turned) {
            svg_text(d, cx + 3.5, py + PLOT_H + 8, SVG_END, 10, 0, -90, "#333333", name);
        } else {
            char *sp = strchr(name, ' ');
            if (sp)
                *sp = 0;
            svg_text(d, cx, py + PLOT_H + 14, SVG_MIDDLE, 10, 1, 0, "#333333", name);
            if (sp)
                svg_text(d, cx, py + PLOT_H + 27, SVG_MIDDLE, 10, 0, 0, "#333333", sp + 1);
        }
    }
    double ly = py + PLOT_H + label_h + 18;
    for (size_t i = 0; i < legend_lines(r->n_configs); i++) {
        const report_config *cf = &r->configs[i];
        if (i == LEGEND_MAX) {
            snprintf(tip, sizeof tip, "... and %zu more configs (the HTML report lists all)",
                     r->n_configs - LEGEND_MAX);
        } else {
            report_style st = report_style_of(i);
            svg_format_number(cf->tps_median, a, sizeof a);
            svg_format_number(cf->tps_min, b, sizeof b);
            svg_format_number(cf->tps_max, c, sizeof c);
            snprintf(tip, sizeof tip, "C%zu  %s  (%zu run%s; median %s, min %s, max %s)",
                     i + 1, cf->label, cf->n_runs, cf->n_runs == 1 ? "" : "s", a, b, c);
            double sy = ly + LINE_H * (double)i - 10;
            config_group(d, i, NULL);
            svg_rect(d, px, sy, 12, 12, st.colour, NULL);
            svg_marker(d, px + 6, sy + 6, SWATCH_R, st.marker, "#ffffff", NULL, NULL);
            svg_group_end(d);
        }
        svg_text(d, px + 18, ly + LINE_H * (double)i, SVG_START, 11, 0, 0, "#000000", tip);
    }
    return ly + LINE_H * (double)legend_lines(r->n_configs) + 10 - y0;
}

/* Median tokens/s over nodes, devices or ranks, with one ideal linear scaling line per
 * family of configs (the same settings but for the layout), each from the family's
 * smallest size. */
static double panel_scaling(svg_doc *d, const report_data *r, double y0)
{
    const char *what = scale_name(r->scale);
    char title[128];
    snprintf(title, sizeof title, "Scaling: tokens/s over %s (dashed: ideal linear from "
             "the smallest %s of the same other settings)", what, what);
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000", title);
    double px = MARGIN_L, py = y0 + 36, pw = PLOT_W;
    size_t n = r->n_configs;
    double *xv = malloc(4 * (n ? n : 1) * sizeof *xv);
    size_t *base = malloc((n ? n : 1) * sizeof *base);
    if (!xv || !base) {
        free(xv);
        free(base);
        d->failed = 1;
        return 0;
    }
    /* yv and ideal are next to each other: the y range covers both. */
    double *yv = xv + n, *ideal = xv + 2 * n, *end = xv + 3 * n;
    for (size_t i = 0; i < n; i++) {
        int64_t s = report_data_scale_value(&r->configs[i], r->scale);
        xv[i] = s > 0 ? (double)s : NAN;
        yv[i] = r->configs[i].tps_max;
        base[i] = report_data_ideal_base(r, i);
    }
    for (size_t i = 0; i < n; i++) {
        size_t b = base[i];
        ideal[i] = b == REPORT_NONE || !isfinite(xv[i]) ? NAN
                 : r->configs[b].tps_median * xv[i] / xv[b];
        end[i] = NAN;   /* for a family's base: its largest size */
    }
    for (size_t i = 0; i < n; i++)
        if (base[i] != REPORT_NONE && isfinite(xv[i]) && !(end[base[i]] >= xv[i]))
            end[base[i]] = xv[i];
    svg_scale xs, ys;
    svg_scale_fit(&xs, xv, n, 1, px, px + pw);
    svg_scale_fit(&ys, yv, 2 * n, 1, py + PLOT_H, py);
    axes(d, px, py, pw, PLOT_H, &xs, &ys, what, "tokens/s");
    char tip[512], a[32], cls[48];
    for (size_t b = 0; b < n; b++) {
        if (base[b] != b)
            continue;
        double t0 = r->configs[b].tps_median;
        snprintf(tip, sizeof tip, "ideal linear scaling from C%zu %s", b + 1,
                 r->configs[b].label);
        snprintf(cls, sizeof cls, "ideal C%zu", b + 1);
        svg_group_begin(d, cls, tip);
        svg_line(d, svg_scale_map(&xs, xv[b]), svg_scale_map(&ys, t0),
                 svg_scale_map(&xs, end[b]), svg_scale_map(&ys, t0 * end[b] / xv[b]),
                 report_style_of(b).colour, 1.5, IDEAL_DASH);
        svg_group_end(d);
    }
    for (size_t i = 0; i < n; i++) {
        const report_config *cf = &r->configs[i];
        report_style st = report_style_of(i);
        double cx = svg_scale_map(&xs, xv[i]);
        config_group(d, i, NULL);
        if (cf->n_tps > 1)
            svg_line(d, cx, svg_scale_map(&ys, cf->tps_min), cx, svg_scale_map(&ys, cf->tps_max),
                     st.colour, 1.5, NULL);
        svg_format_number(cf->tps_median, a, sizeof a);
        snprintf(tip, sizeof tip, "C%zu %s: %s tokens/s at %.0f %s", i + 1, cf->label, a,
                 xv[i], what);
        svg_marker(d, cx, svg_scale_map(&ys, cf->tps_median), MARKER_R, st.marker, st.colour,
                   "#ffffff", tip);
        svg_group_end(d);
    }
    free(xv);
    free(base);
    return PLOT_H + 36 + 50;
}

/* The loss of each chosen run over its steps, in its config's style, its config's marker
 * on its last point. */
static double panel_loss(svg_doc *d, const report_data *r, double y0)
{
    svg_text(d, 20, y0 + 20, SVG_START, 15, 1, 0, "#000000", "Loss per step");
    double px = MARGIN_L, py = y0 + 36, pw = PLOT_W;
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
        report_style st = style_of(c->config);
        size_t last = c->n;
        for (size_t j = 0; j < c->n; j++) {
            xv[k + j] = svg_scale_map(&xs, c->step[j]);
            yv[k + j] = svg_scale_map(&ys, c->loss[j]);
            if (isfinite(xv[k + j]) && isfinite(yv[k + j]))
                last = j;
        }
        config_group(d, c->config, c->run_id);
        svg_polyline(d, xv + k, yv + k, c->n, st.colour, 2, st.dash);
        if (last < c->n)
            svg_marker(d, xv[k + last], yv[k + last], MARKER_R, st.marker, st.colour,
                       "#ffffff", NULL);
        svg_group_end(d);
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
            report_style st = style_of(c->config);
            char last[32], cfg[32] = "";
            svg_format_number(c->n ? c->loss[c->n - 1] : NAN, last, sizeof last);
            if (c->config != REPORT_NONE)
                snprintf(cfg, sizeof cfg, "C%zu ", c->config + 1);
            snprintf(line, sizeof line, "%s  %s%s  (final loss %s)", c->run_id, cfg, c->label,
                     last);
            double sy = ly + LINE_H * (double)i - 4;
            config_group(d, c->config, NULL);
            svg_line(d, px - 4, sy, px + 16, sy, st.colour, 2, st.dash);
            svg_marker(d, px + 6, sy, SWATCH_R, st.marker, st.colour, "#ffffff", NULL);
            svg_group_end(d);
        }
        svg_text(d, px + 22, ly + LINE_H * (double)i, SVG_START, 11, 0, 0, "#000000", line);
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
    int turned;
    double h = 60 + 36 + PLOT_H + bar_labels(r, &turned) + 18 +
               LINE_H * (double)legend_lines(r->n_configs) + 10;
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
