/* report_style.h - how one config of a report looks in every panel of it: its colour,
 * its marker shape and the dash pattern of its lines.
 *
 * The style is a function of the config's index in the report's one ordering of configs
 * (report_data's `configs`, in the order of their first run), so a config has the same
 * colour in the throughput bars, the scaling plot and the loss curves of its runs.  The
 * first 10 configs differ by colour (with circles and solid lines); every further 10 take
 * the palette again with the next marker shape and dash pattern, so REPORT_STYLE_DISTINCT
 * configs look different from each other before a style repeats.
 *
 * Ownership: the strings are static; nothing to free. */
#ifndef HEARTH_REPORT_STYLE_H
#define HEARTH_REPORT_STYLE_H

#include <stddef.h>

#include "svg.h"

#define REPORT_STYLE_COLOURS 10
#define REPORT_STYLE_DISTINCT (REPORT_STYLE_COLOURS * SVG_N_SHAPES)

typedef struct {
    const char *colour;   /* "#rrggbb" */
    svg_shape marker;
    const char *dash;     /* an SVG stroke-dasharray, or NULL for a solid line */
} report_style;

/* The style of config number `index` (0-based). */
report_style report_style_of(size_t index);

#endif
