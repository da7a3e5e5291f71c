/* test_orch_report_page.c - the charts of `hearth report` agree with themselves: a config
 * has one colour and one marker in every panel (its bar, its legend entry, its scaling
 * point, the loss curves of its runs, whatever order the curves come in); 50 configs get 50
 * different looks; integer axes have integer ticks; each family of configs (the same
 * settings but the layout) gets its own ideal-scaling line from its smallest size; bars
 * carry short labels of what varies.  And as a picture: rsvg-convert renders the SVG, and
 * the pixels at each config's bar, points, curves and legend entries have its colour. */
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "report_page.h"
#include "report_style.h"
#include "support/tmpdir.h"

/* ---- a report built by hand ------------------------------------------------------------ */

static void data_init(report_data *d, size_t n)
{
    memset(d, 0, sizeof *d);
    d->experiment = strdup("t");
    d->configs = calloc(n, sizeof *d->configs);
    assert_true(d->experiment && d->configs);
    d->n_configs = n;
    d->n_runs = 2 * n;
    d->scale = REPORT_SCALE_RANKS;
}

/* Config i: 2 runs at tps +-5 %, `ranks` ranks, in `family`. */
static void data_config(report_data *d, size_t i, const char *label, int64_t ranks,
                        double tps, size_t family)
{
    report_config *c = &d->configs[i];
    char hash[72];
    snprintf(hash, sizeof hash, "%064zx", i);
    c->hash = strdup(hash);
    c->label = strdup(label);
    assert_true(c->hash && c->label);
    c->n_runs = c->n_tps = 2;
    c->tps_min = tps * 0.95;
    c->tps_median = tps;
    c->tps_max = tps * 1.05;
    c->nodes = c->devices = 1;
    c->ranks = ranks;
    c->family = family;
}

/* A loss curve of `steps` steps of a run of config `config`. */
static void data_curve(report_data *d, size_t config, size_t steps)
{
    d->curves = realloc(d->curves, (d->n_curves + 1) * sizeof *d->curves);
    assert_non_null(d->curves);
    report_curve *c = &d->curves[d->n_curves];
    char id[32];
    snprintf(id, sizeof id, "run-%zu", d->n_curves + 1);
    c->run_id = strdup(id);
    c->label = strdup(d->configs[config].label);
    c->config = config;
    c->n = steps;
    c->step = malloc(steps * sizeof *c->step);
    c->loss = malloc(steps * sizeof *c->loss);
    assert_true(c->run_id && c->label && c->step && c->loss);
    for (size_t j = 0; j < steps; j++) {
        c->step[j] = (double)(j + 1);
        /* Curves apart from each other, so that no marker hides another. */
        c->loss[j] = 5.0 - 0.3 * (double)j - 0.37 * (double)d->n_curves;
    }
    d->n_curves++;
}

/* n configs "model.decoder.layers=L train.seq_len=S ranks=R", ranks 1..n in two
 * families (even and odd seq_len), tokens/s growing with ranks. */
static void data_many(report_data *d, size_t n)
{
    data_init(d, n);
    for (size_t i = 0; i < n; i++) {
        char label[128];
        snprintf(label, sizeof label, "model.decoder.layers=%zu train.seq_len=%zu ranks=%zu",
                 2 + i % 3, (size_t)64 << (i % 2), i + 1);
        data_config(d, i, label, (int64_t)i + 1, 300 + 40 * (double)i, i % 2);
    }
}

static char *render(const report_data *d)
{
    char *svg = NULL;
    size_t len = 0;
    hearth_err err = { { 0 } };
    assert_int_equal(report_page_svg(d, &svg, &len, &err), 0);
    assert_int_equal(strlen(svg), len);
    return svg;
}

/* ---- reading the SVG back ---------------------------------------------------------------- */

/* The next <g class="CLS"> (exactly) at or after *from: its body up to its </g> (a config
 * group holds no group) in *body and *len; 0 when there is none. */
static int next_group(const char *svg, const char *cls, const char **from, const char **body,
                      size_t *len)
{
    char open[96];
    snprintf(open, sizeof open, "<g class=\"%s\">", cls);
    const char *p = strstr(*from ? *from : svg, open);
    if (!p)
        return 0;
    const char *end = strstr(p, "</g>");
    assert_non_null(end);
    *body = p + strlen(open);
    *len = (size_t)(end - *body);
    *from = end;
    return 1;
}

/* The value of attribute `name` of the first element in s[0..n) that has it. */
static int attr(const char *s, size_t n, const char *name, double *out)
{
    char key[32];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = strstr(s, key);
    if (!p || p >= s + n)
        return 0;
    *out = strtod(p + strlen(key), NULL);
    return 1;
}

/* The centre of the first marker (circle or polygon) in s[0..n). */
static int marker_centre(const char *s, size_t n, double *x, double *y)
{
    const char *c = strstr(s, "<circle"), *p = strstr(s, "<polygon");
    if (c && c < s + n && (!p || c < p))
        return attr(c, n - (size_t)(c - s), "cx", x) && attr(c, n - (size_t)(c - s), "cy", y);
    if (!p || p >= s + n)
        return 0;
    const char *q = strstr(p, "points=\"") + 8;
    double sx = 0, sy = 0;
    int k = 0;
    while (*q != '"') {
        char *e;
        sx += strtod(q, &e);
        sy += strtod(e + 1, &e);
        k++;
        q = e + (*e == ' ');
    }
    *x = sx / k;
    *y = sy / k;
    return 1;
}

/* Which panel a config group belongs to, from what it holds. */
typedef enum { G_BAR, G_BAR_LEGEND, G_SCALING, G_CURVE, G_CURVE_LEGEND } group_kind;

static group_kind kind_of(const char *s, size_t n)
{
    char *t = strndup(s, n);
    assert_non_null(t);
    group_kind k = strstr(t, "<polyline") ? G_CURVE : strstr(t, "tokens/s at") ? G_SCALING
                 : strstr(t, "<rect") && strncmp(t, "<title>", 7) == 0 ? G_BAR
                 : strstr(t, "<rect") ? G_BAR_LEGEND : G_CURVE_LEGEND;
    free(t);
    return k;
}

/* Checks every fill and stroke colour in s[0..n) but white and black is `want`. */
static void check_colours(const char *s, size_t n, const char *want, const char *what)
{
    for (const char *p = s; (p = strstr(p, "=\"#")) && p < s + n; p += 3) {
        if (strncmp(p - 5, " fill", 5) && strncmp(p - 7, " stroke", 7))
            continue;
        if (!strncmp(p + 2, "#ffffff", 7) || !strncmp(p + 2, "#000000", 7))
            continue;
        if (strncmp(p + 2, want, 7))
            fail_msg("%s: colour %.7s, want %s", what, p + 2, want);
    }
}

/* ---- one look per config --------------------------------------------------------------- */

static void test_one_look_per_config(void **state)
{
    (void)state;
    report_data d;
    data_many(&d, 24);
    /* Curves in an order of their own (best runs first), two runs of one config. */
    static const size_t curve_cfg[] = { 7, 2, 13, 2, 0, 21 };
    for (size_t i = 0; i < sizeof curve_cfg / sizeof *curve_cfg; i++)
        data_curve(&d, curve_cfg[i], 5);
    char *svg = render(&d);
    for (size_t k = 0; k < d.n_configs; k++) {
        report_style st = report_style_of(k);
        char cls[32], what[64];
        snprintf(cls, sizeof cls, "config C%zu", k + 1);
        size_t curves = 0, seen[5] = { 0 };
        for (size_t i = 0; i < d.n_curves; i++)
            curves += d.curves[i].config == k;
        const char *from = NULL, *body;
        size_t len;
        while (next_group(svg, cls, &from, &body, &len)) {
            group_kind g = kind_of(body, len);
            seen[g]++;
            snprintf(what, sizeof what, "C%zu in panel part %d", k + 1, (int)g);
            check_colours(body, len, st.colour, what);
            /* The same marker shape everywhere: circles for the first ten, polygons after. */
            char *t = strndup(body, len);
            assert_non_null(t);
            if (strstr(t, st.marker == SVG_CIRCLE ? "<polygon" : "<circle"))
                fail_msg("%s: a marker of another shape: %s", what, t);
            if (g != G_BAR && !strstr(t, st.marker == SVG_CIRCLE ? "<circle" : "<polygon"))
                fail_msg("%s: no marker: %s", what, t);
            if ((g == G_CURVE || g == G_CURVE_LEGEND) && st.dash &&
                !strstr(t, st.dash))
                fail_msg("%s: lines not dashed \"%s\": %s", what, st.dash, t);
            free(t);
        }
        if (seen[G_BAR] != 1 || seen[G_BAR_LEGEND] != 1 || seen[G_SCALING] != 1 ||
            seen[G_CURVE] != curves || seen[G_CURVE_LEGEND] != curves)
            fail_msg("C%zu: groups bar %zu, legend %zu, scaling %zu, curves %zu and %zu "
                     "(want 1, 1, 1, %zu, %zu)", k + 1, seen[0], seen[1], seen[2], seen[3],
                     seen[4], curves, curves);
    }
    free(svg);
    report_data_free(&d);
}

static void test_styles_distinct(void **state)
{
    (void)state;
    for (size_t i = 0; i < REPORT_STYLE_DISTINCT; i++) {
        report_style a = report_style_of(i);
        assert_int_equal(strlen(a.colour), 7);
        for (size_t j = 0; j < i; j++) {
            report_style b = report_style_of(j);
            if (!strcmp(a.colour, b.colour) && a.marker == b.marker)
                fail_msg("configs %zu and %zu look the same", i, j);
            /* The dash goes with the marker: a curve reads without its marker too. */
            int same_dash = a.dash == b.dash || (a.dash && b.dash && !strcmp(a.dash, b.dash));
            if (same_dash != (a.marker == b.marker))
                fail_msg("configs %zu and %zu: dash and marker disagree", i, j);
        }
    }
    report_style a = report_style_of(3), b = report_style_of(3 + REPORT_STYLE_DISTINCT);
    assert_string_equal(a.colour, b.colour);
    assert_int_equal(a.marker, b.marker);
}

/* ---- ticks and labels ---------------------------------------------------------------------- */

static void test_integer_axes(void **state)
{
    (void)state;
    report_data d;
    data_init(&d, 2);
    data_config(&d, 0, "ranks=1", 1, 480, 0);
    data_config(&d, 1, "ranks=2", 2, 350, 0);
    data_curve(&d, 0, 3);
    data_curve(&d, 1, 3);
    char *svg = render(&d);
    /* Ranks 1 and 2, steps 1 to 3: no tick between two whole numbers. */
    assert_null(strstr(svg, ">0.5</text>"));
    assert_null(strstr(svg, ">1.5</text>"));
    assert_null(strstr(svg, ">2.5</text>"));
    assert_non_null(strstr(svg, ">1</text>"));
    assert_non_null(strstr(svg, ">2</text>"));
    free(svg);
    report_data_free(&d);
}

static void test_bar_labels(void **state)
{
    (void)state;
    report_data d;
    data_init(&d, 2);
    data_config(&d, 0, "parallel.encoder.tp=1 parallel.tp=2 ranks=4", 4, 480, 0);
    data_config(&d, 1, "parallel.encoder.tp=2 parallel.tp=2 ranks=8", 8, 900, 0);
    char *svg = render(&d);
    /* Across under each bar: its number, and what varies with keys cut short where that
     * stays unambiguous (tp would be both). */
    assert_non_null(strstr(svg, ">C1</text>"));
    assert_non_null(strstr(svg, ">encoder.tp=1 parallel.tp=2 ranks=4</text>"));
    assert_non_null(strstr(svg, ">encoder.tp=2 parallel.tp=2 ranks=8</text>"));
    free(svg);
    report_data_free(&d);

    /* Too many to write across: turned, each still with its own label. */
    data_many(&d, 24);
    svg = render(&d);
    for (size_t i = 0; i < d.n_configs; i++) {
        char want[96];
        snprintf(want, sizeof want, ">C%zu layers=%zu seq_len=%zu ranks=%zu</text>", i + 1,
                 2 + i % 3, (size_t)64 << (i % 2), i + 1);
        if (!strstr(svg, want))
            fail_msg("no bar label %s", want);
    }
    assert_non_null(strstr(svg, "transform=\"rotate(-90.0"));
    free(svg);
    report_data_free(&d);
}

/* ---- ideal scaling ---------------------------------------------------------------------- */

static void test_ideal_from_family_smallest(void **state)
{
    (void)state;
    report_data d;
    data_init(&d, 7);
    /* Family A (0): sizes 4, 2, 2, 8; two layouts at 2 ranks, the faster is the base.
     * Family B (4): sizes 1 and 8: the smallest size overall, but not A's.
     * Family C (6): one size only, no line. */
    data_config(&d, 0, "tp=1 ranks=4 seq=64", 4, 400, 0);
    data_config(&d, 1, "tp=2 ranks=2 seq=64", 2, 210, 0);
    data_config(&d, 2, "tp=1 ranks=2 seq=64", 2, 230, 0);
    data_config(&d, 3, "tp=1 ranks=8 seq=64", 8, 700, 0);
    data_config(&d, 4, "tp=1 ranks=1 seq=128", 1, 90, 4);
    data_config(&d, 5, "tp=1 ranks=8 seq=128", 8, 500, 4);
    data_config(&d, 6, "tp=1 ranks=16 seq=32", 16, 800, 6);
    static const size_t want[] = { 2, 2, 2, 2, 4, 4, REPORT_NONE };
    for (size_t i = 0; i < d.n_configs; i++)
        if (report_data_ideal_base(&d, i) != want[i])
            fail_msg("config %zu: ideal line from %zu, want %zu", i,
                     report_data_ideal_base(&d, i), want[i]);
    assert_int_equal(report_data_ideal_base(&d, 99), REPORT_NONE);

    char *svg = render(&d);
    /* The scaling markers' centres. */
    double mx[7], my[7];
    for (size_t k = 0; k < d.n_configs; k++) {
        char cls[32];
        snprintf(cls, sizeof cls, "config C%zu", k + 1);
        const char *from = NULL, *body;
        size_t len;
        int found = 0;
        while (!found && next_group(svg, cls, &from, &body, &len))
            found = kind_of(body, len) == G_SCALING && marker_centre(body, len, &mx[k], &my[k]);
        assert_true(found);
    }
    /* One line per family with more than one size: A's from C3, B's from C5. */
    static const struct { const char *cls; size_t base, last; } lines[] = {
        { "ideal C3", 2, 3 }, { "ideal C5", 4, 5 },
    };
    for (size_t i = 0; i < 2; i++) {
        const char *from = NULL, *body;
        size_t len;
        assert_true(next_group(svg, lines[i].cls, &from, &body, &len));
        assert_false(next_group(svg, lines[i].cls, &from, &body, &len));
        double x1, y1, x2, y2;
        assert_true(attr(body, len, "x1", &x1) && attr(body, len, "y1", &y1) &&
                    attr(body, len, "x2", &x2) && attr(body, len, "y2", &y2));
        size_t b = lines[i].base, e = lines[i].last;
        if (fabs(x1 - mx[b]) > 0.02 || fabs(y1 - my[b]) > 0.02 || fabs(x2 - mx[e]) > 0.02)
            fail_msg("%s: from (%g, %g) to x %g, want from C%zu's point (%g, %g) to x %g",
                     lines[i].cls, x1, y1, x2, b + 1, mx[b], my[b], mx[e]);
        /* It ends at base tokens/s times the size ratio: the y scale from two points. */
        double per_tps = (my[3] - my[2]) / (700 - 230);
        double ideal = d.configs[b].tps_median * (double)d.configs[e].ranks /
                       (double)d.configs[b].ranks;
        double want_y = my[2] + (ideal - 230) * per_tps;
        if (fabs(y2 - want_y) > 0.05)
            fail_msg("%s: ends at y %g, want %g (%g tokens/s)", lines[i].cls, y2, want_y,
                     ideal);
    }
    char *other = strstr(svg, "<g class=\"ideal ");
    size_t n_lines = 0;
    for (; other; other = strstr(other + 1, "<g class=\"ideal "))
        n_lines++;
    assert_int_equal(n_lines, 2);
    free(svg);
    report_data_free(&d);
}

/* ---- the picture -------------------------------------------------------------------------- */

typedef struct {
    png_uint_32 w, h;
    unsigned char *px;   /* RGBA rows */
} picture;

/* Renders svg with rsvg-convert into dir/NAME.png and reads it back; fails the test on
 * any error or message of the renderer. */
static void picture_of(const char *dir, const char *name, const char *svg, picture *p)
{
    char path[512], cmd[1600];
    snprintf(path, sizeof path, "%s/%s.svg", dir, name);
    assert_int_equal(tu_write_text(path, svg), 0);
    snprintf(cmd, sizeof cmd, "rsvg-convert -o '%s/%s.png' '%s/%s.svg' 2>'%s/err'", dir, name,
             dir, name, dir);
    if (system(cmd) != 0)
        fail_msg("rsvg-convert failed: %s", cmd);
    snprintf(path, sizeof path, "%s/err", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char msg[256] = "";
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    fclose(f);
    if (n)
        fail_msg("rsvg-convert said: %s", msg);
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    snprintf(path, sizeof path, "%s/%s.png", dir, name);
    assert_true(png_image_begin_read_from_file(&img, path));
    img.format = PNG_FORMAT_RGBA;
    p->w = img.width;
    p->h = img.height;
    p->px = malloc(PNG_IMAGE_SIZE(img));
    assert_non_null(p->px);
    assert_true(png_image_finish_read(&img, NULL, p->px, 0, NULL));
}

/* The colour of the pixel that covers point (x, y), as "#rrggbb". */
static void colour_at(const picture *p, double x, double y, char out[8])
{
    long i = (long)floor(x), j = (long)floor(y);
    assert_true(i >= 0 && j >= 0 && i < (long)p->w && j < (long)p->h);
    const unsigned char *c = p->px + 4 * ((size_t)j * p->w + (size_t)i);
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

static size_t pixels_of(const picture *p, const char *colour)
{
    unsigned r, g, b;
    assert_int_equal(sscanf(colour, "#%2x%2x%2x", &r, &g, &b), 3);
    size_t n = 0;
    for (size_t i = 0; i < (size_t)p->w * p->h; i++)
        n += p->px[4 * i] == r && p->px[4 * i + 1] == g && p->px[4 * i + 2] == b;
    return n;
}

static int have_rsvg(void)
{
    return system("command -v rsvg-convert >/dev/null 2>&1") == 0;
}

/* Samples each config at its bar, its legend swatch, its scaling point, its curves' last
 * points and their legend markers: all its colour. */
static void check_picture(const report_data *d, const char *svg, const picture *p)
{
    for (size_t k = 0; k < d->n_configs; k++) {
        const char *want = report_style_of(k).colour;
        char cls[32], got[8];
        snprintf(cls, sizeof cls, "config C%zu", k + 1);
        const char *from = NULL, *body;
        size_t len;
        while (next_group(svg, cls, &from, &body, &len)) {
            group_kind g = kind_of(body, len);
            double x, y, w, h;
            if (g == G_BAR || g == G_BAR_LEGEND) {
                assert_true(attr(body, len, "x", &x) && attr(body, len, "y", &y) &&
                            attr(body, len, "width", &w) && attr(body, len, "height", &h));
                /* Clear of the white marker and of the error bar. */
                if (g == G_BAR)
                    colour_at(p, x + 0.15 * w, y + 0.5 * h, got);
                else
                    colour_at(p, x + 1.2, y + 1.2, got);
            } else {
                assert_true(marker_centre(body, len, &x, &y));
                colour_at(p, x, y, got);
            }
            if (strcmp(got, want))
                fail_msg("C%zu (panel part %d): the picture has %s, want %s", k + 1, (int)g,
                         got, want);
        }
    }
}

static void test_picture(void **state)
{
    (void)state;
    if (!have_rsvg())
        skip();   /* librsvg2-bin (contrib/install-deps.sh) */
    char dir[256];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "report-page"), 0);

    /* 24 configs: all ten colours, three marker shapes, every look where it belongs. */
    report_data d;
    data_many(&d, 24);
    static const size_t curve_cfg[] = { 17, 2, 13, 2, 0, 21 };
    for (size_t i = 0; i < sizeof curve_cfg / sizeof *curve_cfg; i++)
        data_curve(&d, curve_cfg[i], 4);
    char *svg = render(&d);
    picture p;
    picture_of(dir, "many", svg, &p);
    double height;
    assert_true(attr(svg, strlen(svg), "height", &height));
    assert_int_equal(p.w, 960);
    assert_int_equal(p.h, (png_uint_32)height);
    check_picture(&d, svg, &p);
    for (size_t c = 0; c < REPORT_STYLE_COLOURS; c++)
        if (pixels_of(&p, report_style_of(c).colour) < 50)
            fail_msg("colour %s hardly in the picture", report_style_of(c).colour);
    free(p.px);
    free(svg);
    report_data_free(&d);

    /* 3 configs: exactly their 3 colours in the picture (grey aside: text is grey too). */
    data_many(&d, 3);
    data_curve(&d, 2, 4);
    data_curve(&d, 0, 4);
    svg = render(&d);
    picture_of(dir, "few", svg, &p);
    check_picture(&d, svg, &p);
    size_t present = 0;
    for (size_t c = 0; c < REPORT_STYLE_COLOURS; c++) {
        const char *col = report_style_of(c).colour;
        size_t n = pixels_of(&p, col);
        if (c < 3 && n < 50)
            fail_msg("config C%zu's colour %s hardly in the picture", c + 1, col);
        if (strcmp(col, "#7f7f7f"))
            present += n > 0;
    }
    assert_int_equal(present, 3);
    free(p.px);
    free(svg);
    report_data_free(&d);
    if (getenv("KEEP"))   /* to look at the pictures */
        printf("# kept %s\n", dir);
    else
        assert_int_equal(tu_tmpdir_remove(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_look_per_config),
        cmocka_unit_test(test_styles_distinct),
        cmocka_unit_test(test_integer_axes),
        cmocka_unit_test(test_bar_labels),
        cmocka_unit_test(test_ideal_from_family_smallest),
        cmocka_unit_test(test_picture),
    };
    return cmocka_run_group_tests_name("orch_report_page", tests, NULL, NULL);
}
