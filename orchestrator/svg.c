/* svg.c - the SVG writer and its scales.  See svg.h. */
#include "svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence XML allows at p (1..4), or 0 when the bytes there
 * are not one (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF,
 * U+FFFE/U+FFFF, a truncated sequence). */
static int utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
          : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!n)
        return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0) ||
        (c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90))
        return 0;
    if (c == 0xEF && p[1] == 0xBF && (p[2] == 0xBE || p[2] == 0xBF))
        return 0;
    return n;
}

int svg_escape(strbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    int rc = 0;
    while (*p && !rc) {
        const char *ent = NULL;
        switch (*p) {
        case '&': ent = "&amp;"; break;
        case '<': ent = "&lt;"; break;
        case '>': ent = "&gt;"; break;
        case '"': ent = "&quot;"; break;
        case '\'': ent = "&#39;"; break;
        default: break;
        }
        if (ent) {
            rc = strbuf_add(b, ent, strlen(ent));
            p++;
        } else if (*p < 0x80) {
            int ok = *p >= 0x20 || *p == '\t' || *p == '\n' || *p == '\r';
            rc = strbuf_add(b, ok ? (const char *)p : "?", 1);
            p++;
        } else {
            int n = utf8_len(p);
            rc = n ? strbuf_add(b, (const char *)p, (size_t)n) : strbuf_add(b, "?", 1);
            p += n ? n : 1;
        }
    }
    return rc;
}

void svg_raw(svg_doc *d, const char *fmt, ...)
{
    if (d->failed)
        return;
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        d->failed = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        d->failed = strbuf_add(&d->b, small, (size_t)n) != 0;
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        d->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    d->failed = strbuf_add(&d->b, big, (size_t)n) != 0;
    free(big);
}

static void add_escaped(svg_doc *d, const char *s)
{
    if (!d->failed && svg_escape(&d->b, s))
        d->failed = 1;
}

static int finite2(double a, double b)
{
    return isfinite(a) && isfinite(b);
}

static void add_tip(svg_doc *d, const char *tip)
{
    if (!tip)
        return;
    svg_raw(d, "<title>");
    add_escaped(d, tip);
    svg_raw(d, "</title>");
}

void svg_begin(svg_doc *d, double width, double height, const char *title)
{
    svg_raw(d, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, "
               "sans-serif\">\n", width, height, width, height);
    add_tip(d, title);
    svg_raw(d, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n",
            width, height);
}

void svg_rect(svg_doc *d, double x, double y, double w, double h, const char *fill,
              const char *tip)
{
    if (!finite2(x, y) || !finite2(w, h))
        return;
    /* A negative extent is an error in SVG: draw the same box from its other corner. */
    if (w < 0) {
        x += w;
        w = -w;
    }
    if (h < 0) {
        y += h;
        h = -h;
    }
    svg_raw(d, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"",
            x, y, w, h);
    add_escaped(d, fill);
    if (!tip) {
        svg_raw(d, "\"/>\n");
        return;
    }
    svg_raw(d, "\">");
    add_tip(d, tip);
    svg_raw(d, "</rect>\n");
}

/* Writes a stroke-dasharray attribute when dash is not NULL. */
static void add_dash(svg_doc *d, const char *dash)
{
    if (!dash)
        return;
    svg_raw(d, " stroke-dasharray=\"");
    add_escaped(d, dash);
    svg_raw(d, "\"");
}

void svg_line(svg_doc *d, double x1, double y1, double x2, double y2, const char *stroke,
              double width, const char *dash)
{
    if (!finite2(x1, y1) || !finite2(x2, y2))
        return;
    svg_raw(d, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke-width=\"%.2f\"",
            x1, y1, x2, y2, width);
    add_dash(d, dash);
    svg_raw(d, " stroke=\"");
    add_escaped(d, stroke);
    svg_raw(d, "\"/>\n");
}

void svg_circle(svg_doc *d, double cx, double cy, double r, const char *fill,
                const char *tip)
{
    if (!finite2(cx, cy) || !isfinite(r))
        return;
    svg_raw(d, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%.2f\" fill=\"", cx, cy, r);
    add_escaped(d, fill);
    svg_raw(d, "\">");
    add_tip(d, tip);
    svg_raw(d, "</circle>\n");
}

void svg_polyline(svg_doc *d, const double *xs, const double *ys, size_t n,
                  const char *stroke, double width, const char *dash)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && !finite2(xs[i], ys[i]))
            i++;
        size_t start = i;
        while (i < n && finite2(xs[i], ys[i]))
            i++;
        if (i - start == 1) {
            svg_circle(d, xs[start], ys[start], width, stroke, NULL);
        } else if (i > start) {
            svg_raw(d, "<polyline fill=\"none\" stroke-width=\"%.2f\"", width);
            add_dash(d, dash);
            svg_raw(d, " stroke=\"");
            add_escaped(d, stroke);
            svg_raw(d, "\" points=\"");
            for (size_t k = start; k < i; k++)
                svg_raw(d, "%s%.2f,%.2f", k > start ? " " : "", xs[k], ys[k]);
            svg_raw(d, "\"/>\n");
        }
    }
}

void svg_marker(svg_doc *d, double cx, double cy, double r, svg_shape shape,
                const char *fill, const char *stroke, const char *tip)
{
    /* Unit outlines about the centre, scaled by r; each has about the area of the circle
     * of radius r, so no shape looks more important than another. */
    static const double square[] = { -0.9, -0.9, 0.9, -0.9, 0.9, 0.9, -0.9, 0.9 };
    static const double triangle[] = { 0, -1.35, 1.17, 0.68, -1.17, 0.68 };
    static const double diamond[] = { 0, -1.27, 1.27, 0, 0, 1.27, -1.27, 0 };
    static const double triangle_down[] = { 0, 1.35, 1.17, -0.68, -1.17, -0.68 };
    if (!finite2(cx, cy) || !isfinite(r))
        return;
    const double *pts = shape == SVG_SQUARE ? square : shape == SVG_TRIANGLE ? triangle
                      : shape == SVG_DIAMOND ? diamond
                      : shape == SVG_TRIANGLE_DOWN ? triangle_down : NULL;
    int n = shape == SVG_TRIANGLE || shape == SVG_TRIANGLE_DOWN ? 3 : 4;
    if (!pts) {
        svg_raw(d, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%.2f\"", cx, cy, r);
    } else {
        svg_raw(d, "<polygon points=\"");
        for (int i = 0; i < n; i++)
            svg_raw(d, "%s%.2f,%.2f", i ? " " : "", cx + r * pts[2 * i],
                    cy + r * pts[2 * i + 1]);
        svg_raw(d, "\"");
    }
    svg_raw(d, " fill=\"");
    add_escaped(d, fill);
    if (stroke) {
        svg_raw(d, "\" stroke-width=\"1\" stroke=\"");
        add_escaped(d, stroke);
    }
    svg_raw(d, "\">");
    add_tip(d, tip);
    svg_raw(d, "</%s>\n", pts ? "polygon" : "circle");
}

void svg_group_begin(svg_doc *d, const char *cls, const char *tip)
{
    svg_raw(d, "<g class=\"");
    add_escaped(d, cls);
    svg_raw(d, "\">");
    add_tip(d, tip);
    svg_raw(d, "\n");
}

void svg_group_end(svg_doc *d)
{
    svg_raw(d, "</g>\n");
}

void svg_text(svg_doc *d, double x, double y, svg_anchor anchor, double size, int bold,
              double rotate, const char *fill, const char *text)
{
    static const char *const anchors[] = { "start", "middle", "end" };
    if (!finite2(x, y))
        return;
    svg_raw(d, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.1f\" text-anchor=\"%s\"%s", x, y,
            size, anchors[anchor], bold ? " font-weight=\"bold\"" : "");
    if (rotate != 0 && isfinite(rotate))
        svg_raw(d, " transform=\"rotate(%.1f %.2f %.2f)\"", rotate, x, y);
    svg_raw(d, " fill=\"");
    add_escaped(d, fill);
    svg_raw(d, "\">");
    add_escaped(d, text);
    svg_raw(d, "</text>\n");
}

int svg_finish(svg_doc *d, char **out, size_t *len, hearth_err *err)
{
    svg_raw(d, "</svg>\n");
    return svg_take(d, out, len, err);
}

int svg_take(svg_doc *d, char **out, size_t *len, hearth_err *err)
{
    if (!d->failed && !d->b.s && strbuf_add(&d->b, "", 0))
        d->failed = 1;
    if (d->failed) {
        svg_discard(d);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    *out = d->b.s;
    *len = d->b.len;
    d->b = (strbuf){ 0 };
    return 0;
}

void svg_discard(svg_doc *d)
{
    free(d->b.s);
    d->b = (strbuf){ 0 };
    d->failed = 0;
}

/* 1, 2 or 5 times a power of ten, the smallest such at least `raw` (> 0). */
static double nice_step(double raw)
{
    double p = pow(10, floor(log10(raw)));
    double f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

size_t svg_scale_fit(svg_scale *s, const double *v, size_t n, int with_zero, double r0,
                     double r1)
{
    double lo = INFINITY, hi = -INFINITY;
    size_t finite = 0;
    int whole = 1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        finite++;
        whole &= v[i] == floor(v[i]);
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
    }
    if (!finite) {
        lo = 0;
        hi = 1;
    }
    if (with_zero) {
        lo = fmin(lo, 0);
        hi = fmax(hi, 0);
    }
    /* One value, or all equal (to the precision that matters): span from 0 to it. */
    if (hi - lo <= fmax(fabs(lo), fabs(hi)) * 1e-12) {
        if (lo == 0 && hi == 0)
            hi = 1;
        else if (lo > 0)
            lo = 0;
        else
            hi = 0;
    }
    s->r0 = r0;
    s->r1 = r1;
    double span = hi - lo;
    if (!isfinite(span)) {
        /* Values near the ends of the double range: no rounding outwards (it would
         * overflow); ticks as far apart as the span allows. */
        s->d0 = lo;
        s->d1 = hi;
        s->step = nice_step(hi / 5 - lo / 5);
        return finite;
    }
    s->step = nice_step(span / 5);
    /* A rank or a node count of 1.5 does not exist: whole values get whole ticks. */
    if (whole && s->step < 1)
        s->step = 1;
    s->d0 = floor(lo / s->step) * s->step;
    s->d1 = ceil(hi / s->step) * s->step;
    /* lo / step can round up past a whole number: keep every value inside. */
    if (s->d0 > lo)
        s->d0 -= s->step;
    if (s->d1 < hi)
        s->d1 += s->step;
    if (!isfinite(s->d0) || !isfinite(s->d1)) {
        s->d0 = lo;
        s->d1 = hi;
    }
    return finite;
}

double svg_scale_map(const svg_scale *s, double x)
{
    if (!isfinite(x))
        return NAN;
    double t = x / 2 - s->d0 / 2, span = s->d1 / 2 - s->d0 / 2;   /* halves: no overflow */
    return s->r0 + t / span * (s->r1 - s->r0);
}

int svg_scale_ticks(const svg_scale *s, double *ticks, int max)
{
    int n = 0;
    double first = ceil(s->d0 / s->step - 1e-9) * s->step;
    for (int i = 0; n < max; i++) {
        double t = first + i * s->step;
        if (!isfinite(t) || t > s->d1 + s->step * 1e-9)
            break;
        if (fabs(t) < s->step * 1e-9)
            t = 0;   /* not -0 or 1e-17 from accumulated rounding */
        ticks[n++] = t;
    }
    return n;
}

void svg_format_number(double x, char *buf, size_t size)
{
    static const char suffix[] = "kMGT";
    if (!isfinite(x)) {
        snprintf(buf, size, "-");
        return;
    }
    double a = fabs(x);
    int k = -1;
    while (k < 3 && a >= 999.5) {
        a /= 1000;
        x /= 1000;
        k++;
    }
    if (k < 0)
        snprintf(buf, size, "%.3g", x);
    else
        snprintf(buf, size, "%.3g%c", x, suffix[k]);
}
