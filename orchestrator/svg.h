/* svg.h - a small SVG writer for `hearth report`: shapes and text into a growing string,
 * every text and attribute value escaped, and linear scales with "nice" ticks.
 *
 * Text: & < > " ' become entities; control characters that XML 1.0 forbids and bytes that
 * are not valid UTF-8 become '?', so any stored value (a run id, a config value, a
 * decision's evidence) gives a well-formed document.
 *
 * Non-finite coordinates: a shape with a NaN or infinite coordinate is left out (a
 * polyline is split at such points), never written as "nan" into the document.
 *
 * Errors: the writer is sticky.  A failed allocation marks the document, later calls do
 * nothing, and svg_finish returns HERR_NOMEM; so drawing code needs no check per shape.
 *
 * Ownership: svg_doc is the caller's (on the stack); svg_finish hands the text over
 * (*out, the caller frees it) and svg_discard frees it on the way out of an error. */
#ifndef HEARTH_SVG_H
#define HEARTH_SVG_H

#include <stddef.h>

#include "shape/err.h"
#include "strbuf.h"

typedef struct {
    strbuf b;
    int failed;          /* an allocation failed: everything after it was dropped */
} svg_doc;

/* Appends the XML-escaped text of s (see above) to b; 0 or HERR_NOMEM. */
int svg_escape(strbuf *b, const char *s);
/* Appends printf-formatted text unescaped (markup the caller writes itself). */
void svg_raw(svg_doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Starts a document of width x height user units (the viewBox), white background,
 * sans-serif text.  `title` (may be NULL) becomes its <title>. */
void svg_begin(svg_doc *d, double width, double height, const char *title);
/* A rectangle; `tip` (may be NULL) is a tooltip (<title>). */
void svg_rect(svg_doc *d, double x, double y, double w, double h, const char *fill,
              const char *tip);
/* A line; `dash` is an SVG stroke-dasharray ("6 3") or NULL for a solid line. */
void svg_line(svg_doc *d, double x1, double y1, double x2, double y2, const char *stroke,
              double width, const char *dash);
void svg_circle(svg_doc *d, double cx, double cy, double r, const char *fill,
                const char *tip);
/* A polyline through (xs[i], ys[i]); points with a non-finite coordinate split it.
 * `dash` is an SVG stroke-dasharray ("6 3") or NULL for a solid line. */
void svg_polyline(svg_doc *d, const double *xs, const double *ys, size_t n,
                  const char *stroke, double width, const char *dash);
/* Marker shapes: with a palette's colours they tell more series apart than the palette
 * has colours. */
typedef enum {
    SVG_CIRCLE = 0, SVG_SQUARE, SVG_TRIANGLE, SVG_DIAMOND, SVG_TRIANGLE_DOWN
} svg_shape;
#define SVG_N_SHAPES 5
/* A marker of about radius r centred on (cx, cy), filled with `fill` and outlined with
 * `stroke` (NULL: no outline); `tip` (may be NULL) is a tooltip.  The centre is always
 * inside the filled area, so a picture of it can be sampled there. */
void svg_marker(svg_doc *d, double cx, double cy, double r, svg_shape shape,
                const char *fill, const char *stroke, const char *tip);
/* Opens a group <g class="cls"> (with tooltip `tip` when not NULL) that svg_group_end
 * closes: it names what its shapes show, for a reader of the document and for tests. */
void svg_group_begin(svg_doc *d, const char *cls, const char *tip);
void svg_group_end(svg_doc *d);
typedef enum { SVG_START = 0, SVG_MIDDLE, SVG_END } svg_anchor;
/* Text at (x, y) (the baseline), `size` in user units, rotated by `rotate` degrees about
 * its anchor point; bold when `bold`. */
void svg_text(svg_doc *d, double x, double y, svg_anchor anchor, double size, int bold,
              double rotate, const char *fill, const char *text);
/* Ends the document and hands its text over: *out (NUL-terminated, the caller frees it)
 * and *len.  Returns 0, or HERR_NOMEM (nothing handed over, the document freed). */
int svg_finish(svg_doc *d, char **out, size_t *len, hearth_err *err);
/* Hands the text written so far over as it is, without closing an <svg> (for an HTML page
 * written with svg_raw and svg_escape); the same results as svg_finish. */
int svg_take(svg_doc *d, char **out, size_t *len, hearth_err *err);
/* Frees an unfinished document. */
void svg_discard(svg_doc *d);

/* A linear map from the data domain [d0, d1] to the output range [r0, r1] (r1 < r0 for
 * a y axis that grows upwards). */
typedef struct {
    double d0, d1, r0, r1;
    double step;         /* tick spacing: a 1, 2 or 5 times a power of ten */
} svg_scale;

/* Fits the domain to the finite values among v[0..n) (NaN and infinities are skipped),
 * widened to include 0 when `with_zero`, then rounded outwards to whole ticks of about 5
 * steps.  No finite value: [0, 1].  One value or all equal: from 0 to that value ([0, 1]
 * when it is 0).  When every finite value is a whole number (ranks, nodes, steps), the
 * step is at least 1, so no tick falls between two whole numbers.  Returns how many
 * values were finite. */
size_t svg_scale_fit(svg_scale *s, const double *v, size_t n, int with_zero, double r0,
                     double r1);
/* The output coordinate of x (NaN for a non-finite x). */
double svg_scale_map(const svg_scale *s, double x);
/* Writes the tick values from d0 to d1 into ticks[0..max) and returns their count. */
int svg_scale_ticks(const svg_scale *s, double *ticks, int max);

/* A short label for a number: 3 significant digits with k, M, G, T for large ones
 * ("1.23M", "950", "0.0012", "-4.5k"); "-" when not finite. */
void svg_format_number(double x, char *buf, size_t size);

#endif
