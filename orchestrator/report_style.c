/* report_style.c - a config's colour, marker and dash.  See report_style.h. */
#include "report_style.h"

/* Matplotlib's "tab10": ten colours that stay apart for most colour-blind readers too. */
static const char *const palette[REPORT_STYLE_COLOURS] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
};

/* One per marker shape, in the same order: the nth ten configs get both. */
static const char *const dashes[SVG_N_SHAPES] = { NULL, "7 3", "2 2", "8 3 2 3", "4 4" };

report_style report_style_of(size_t index)
{
    size_t round = index / REPORT_STYLE_COLOURS % SVG_N_SHAPES;
    return (report_style){
        .colour = palette[index % REPORT_STYLE_COLOURS],
        .marker = (svg_shape)round,
        .dash = dashes[round],
    };
}
