/* report_page.h - `hearth report`'s pictures and page, drawn from a report_data:
 *
 *   the SVG: a title, tokens/s per config as bars (the median of its repeats) with the
 *   min-max spread as an error bar and a short label of what varies under each bar, a
 *   scaling plot (median tokens/s over nodes, devices or ranks, with one ideal linear line
 *   per family of configs, from the family's smallest size) when those vary, the loss
 *   curves of the chosen runs, and the experiment's selection decisions with their
 *   evidence (shortened; the HTML page has it in full).  A config looks the same in every
 *   panel (report_style.h: colour, marker, dash); its shapes are grouped in
 *   <g class="config C<n>">, an ideal line in <g class="ideal C<n>"> (n: from 1).
 *
 *   the HTML: one self-contained page (no external file, script or font) with the SVG
 *   inline and tables of the configs, the curves' runs and the decisions.
 *
 * Both hand over a malloc'd NUL-terminated text (*out, the caller frees it) and its
 * length; the only failure is HERR_NOMEM. */
#ifndef HEARTH_REPORT_PAGE_H
#define HEARTH_REPORT_PAGE_H

#include <stddef.h>

#include "report_data.h"

int report_page_svg(const report_data *d, char **out, size_t *len, hearth_err *err);
/* `svg` is the text report_page_svg made for the same data. */
int report_page_html(const report_data *d, const char *svg, char **out, size_t *len,
                     hearth_err *err);

#endif
