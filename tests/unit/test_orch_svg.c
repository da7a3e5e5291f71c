/* test_orch_svg.c - the SVG writer of `hearth report`: escaping of random text (markup,
 * control characters, valid and broken UTF-8) gives text an XML reader accepts and reads
 * back to the input; scales fitted to random data with NaN and infinities keep every
 * finite value inside, with ticks on the domain, also for one point, all-equal, zero and
 * negative values; whole-number data (ranks, nodes, steps) gets whole-number ticks; shapes
 * with non-finite coordinates are left out and polylines split; markers, dashes and
 * groups. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "svg.h"
#include "support/testutil.h"

/* ---- escaping ------------------------------------------------------------------------- */

/* Valid pieces: ASCII (markup characters often), and 2-, 3- and 4-byte UTF-8 sequences. */
static void add_valid(tu_rng *r, strbuf *b)
{
    static const char *const pieces[] = {
        "<", ">", "&", "\"", "'", "&amp;", "]]>", "a", "Z", " ", "\t", "\n", "\xc3\xa9",
        "\xe2\x82\xac", "\xf0\x9f\x94\xa5", "\xef\xbf\xbd", "\xc2\xa0", "x=1",
    };
    const char *p = pieces[tu_randint(r, 0, (int)(sizeof pieces / sizeof *pieces))];
    assert_int_equal(strbuf_add(b, p, strlen(p)), 0);
}

/* Invalid for XML: control characters, stray continuation bytes, overlong forms,
 * surrogates, U+FFFE, truncated sequences, bytes beyond U+10FFFF. */
static void add_invalid(tu_rng *r, strbuf *b)
{
    static const char *const pieces[] = {
        "\x01", "\x1b", "\x7f\x08", "\x80", "\xbf", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf",
        "\xed\xa0\x80", "\xef\xbf\xbe", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff",
        "\xe2\x82", "\xf0\x9f\x94",
    };
    const char *p = pieces[tu_randint(r, 0, (int)(sizeof pieces / sizeof *pieces))];
    assert_int_equal(strbuf_add(b, p, strlen(p)), 0);
}

/* The test's own reader of escaped text: checks that only the five entities occur, no
 * raw markup character, and valid UTF-8 without forbidden characters; returns the
 * decoded text (malloc'd) or NULL with a reason in why. */
static char *xml_unescape(const char *s, char *why, size_t n)
{
    static const struct { const char *ent; char c; } ents[] = {
        { "&amp;", '&' }, { "&lt;", '<' }, { "&gt;", '>' }, { "&quot;", '"' }, { "&#39;", '\'' },
    };
    char *out = malloc(strlen(s) + 1), *o = out;
    assert_non_null(out);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        if (*p == '&') {
            size_t k = 0;
            while (k < 5 && strncmp((const char *)p, ents[k].ent, strlen(ents[k].ent)))
                k++;
            if (k == 5) {
                snprintf(why, n, "a bare '&' at %s", (const char *)p);
                free(out);
                return NULL;
            }
            *o++ = ents[k].c;
            p += strlen(ents[k].ent);
            continue;
        }
        if (*p == '<' || *p == '>' || *p == '"' || *p == '\'' ||
            (*p < 0x20 && *p != '\t' && *p != '\n' && *p != '\r')) {
            snprintf(why, n, "raw byte 0x%02x", *p);
            free(out);
            return NULL;
        }
        int len = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3
                : (*p & 0xF8) == 0xF0 ? 4 : 0;
        uint32_t cp = len == 1 ? *p : len == 2 ? *p & 0x1F : len == 3 ? *p & 0x0F : *p & 0x07;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xC0) != 0x80)
                len = 0;
            else
                cp = cp << 6 | (p[i] & 0x3F);
        }
        static const uint32_t min_cp[] = { 0, 0, 0x80, 0x800, 0x10000 };
        if (!len || cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ||
            cp == 0xFFFE || cp == 0xFFFF) {
            snprintf(why, n, "not valid UTF-8 for XML at byte 0x%02x", *p);
            free(out);
            return NULL;
        }
        memcpy(o, p, (size_t)len);
        o += len;
        p += len;
    }
    *o = 0;
    return out;
}

static void test_escape_random(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    char why[256];
    for (int iter = 0; iter < 2000; iter++) {
        int with_invalid = iter % 2;
        strbuf in = { 0 }, out = { 0 };
        int n = tu_randint(&r, 0, 40);
        for (int i = 0; i < n; i++) {
            if (with_invalid && tu_randint(&r, 0, 3) == 0)
                add_invalid(&r, &in);
            else
                add_valid(&r, &in);
        }
        assert_int_equal(svg_escape(&out, in.s ? in.s : ""), 0);
        char *back = xml_unescape(out.s ? out.s : "", why, sizeof why);
        if (!back)
            fail_msg("seed %llu: escaped text is not XML text (%s): %s",
                     (unsigned long long)r.seed, why, out.s);
        /* Valid input reads back unchanged; invalid bytes became '?', nothing else moved. */
        if (!with_invalid && strcmp(back, in.s ? in.s : ""))
            fail_msg("seed %llu: '%s' read back as '%s'", (unsigned long long)r.seed, in.s,
                     back);
        if (with_invalid)
            assert_true(strlen(back) <= in.len);
        free(back);
        free(in.s);
        free(out.s);
    }
}

static void test_escape_cases(void **state)
{
    (void)state;
    static const struct { const char *in, *out; } cases[] = {
        { "a<b>&\"'", "a&lt;b&gt;&amp;&quot;&#39;" },
        { "\x01tab\tnl\n", "?tab\tnl\n" },
        { "\xff\xc3\xa9\xc3", "?\xc3\xa9?" },
        { "\xed\xa0\x80", "???" },
        { "", "" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        strbuf b = { 0 };
        assert_int_equal(svg_escape(&b, cases[i].in), 0);
        assert_string_equal(b.s ? b.s : "", cases[i].out);
        free(b.s);
    }
}

/* ---- scales ---------------------------------------------------------------------------- */

/* Checks the fitted scale's promises for v[0..n). */
static void check_scale(const svg_scale *s, const double *v, size_t n, int with_zero,
                        size_t finite, uint64_t seed)
{
    size_t want_finite = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i])) {
            want_finite++;
            lo = fmin(lo, v[i]);
            hi = fmax(hi, v[i]);
        }
    if (finite != want_finite)
        fail_msg("seed %llu: %zu finite values counted, want %zu", (unsigned long long)seed,
                 finite, want_finite);
    if (!(s->d0 < s->d1) || !isfinite(s->d0) || !isfinite(s->d1) || !(s->step > 0))
        fail_msg("seed %llu: domain [%g, %g] step %g", (unsigned long long)seed, s->d0, s->d1,
                 s->step);
    if (want_finite && (lo < s->d0 || hi > s->d1))
        fail_msg("seed %llu: values [%g, %g] outside the domain [%g, %g]",
                 (unsigned long long)seed, lo, hi, s->d0, s->d1);
    if (with_zero && (s->d0 > 0 || s->d1 < 0))
        fail_msg("seed %llu: domain [%g, %g] lacks 0", (unsigned long long)seed, s->d0, s->d1);
    double rmin = fmin(s->r0, s->r1), rmax = fmax(s->r0, s->r1), eps = 1e-9 * (rmax - rmin);
    for (size_t i = 0; i < n; i++) {
        double m = svg_scale_map(s, v[i]);
        if (isfinite(v[i]) ? !(m >= rmin - eps && m <= rmax + eps) : !isnan(m))
            fail_msg("seed %llu: %g maps to %g, outside [%g, %g]", (unsigned long long)seed,
                     v[i], m, rmin, rmax);
    }
    double t[64];
    int nt = svg_scale_ticks(s, t, 64);
    if (nt < 2 || nt > 12)
        fail_msg("seed %llu: %d ticks over [%g, %g]", (unsigned long long)seed, nt, s->d0, s->d1);
    for (int i = 0; i < nt; i++) {
        double tol = s->step * 1e-6;
        if (t[i] < s->d0 - tol || t[i] > s->d1 + tol ||
            (i && fabs(t[i] - t[i - 1] - s->step) > tol))
            fail_msg("seed %llu: tick %d = %g (domain [%g, %g], step %g)",
                     (unsigned long long)seed, i, t[i], s->d0, s->d1, s->step);
    }
    /* The domain ends on ticks: neither end is more than a step beyond the data (unless
     * the values are equal to 1e-12, when the domain reaches from 0). */
    if (want_finite && (s->d0 < fmin(lo, with_zero ? 0 : lo) - s->step * 1.000001 ||
                        s->d1 > fmax(hi, with_zero ? 0 : hi) + s->step * 1.000001) &&
        hi - lo > fmax(fabs(lo), fabs(hi)) * 1e-12)
        fail_msg("seed %llu: domain [%g, %g] too wide for [%g, %g] (step %g)",
                 (unsigned long long)seed, s->d0, s->d1, lo, hi, s->step);
}

static void test_scale_random(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    double v[64];
    for (int iter = 0; iter < 5000; iter++) {
        size_t n = (size_t)tu_randint(&r, 0, 64);
        double mag = pow(10, tu_randint(&r, -12, 13));
        double offset = tu_randint(&r, 0, 3) == 0 ? mag * tu_randint(&r, -1000, 1000) : 0;
        for (size_t i = 0; i < n; i++) {
            int k = tu_randint(&r, 0, 20);
            v[i] = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -INFINITY
                 : offset + mag * (tu_uniform(&r) * 2 - 1);
        }
        int with_zero = tu_randint(&r, 0, 2);
        int flip = tu_randint(&r, 0, 2);
        svg_scale s;
        size_t finite = svg_scale_fit(&s, v, n, with_zero, flip ? 300 : 50, flip ? 50 : 300);
        check_scale(&s, v, n, with_zero, finite, r.seed);
    }
}

static void test_scale_edges(void **state)
{
    (void)state;
    static const struct { double v[3]; size_t n; int zero; double d0, d1; } cases[] = {
        { { 0 }, 0, 0, 0, 1 },                     /* no values */
        { { NAN, INFINITY, -INFINITY }, 3, 1, 0, 1 },   /* none finite */
        { { 7 }, 1, 0, 0, 8 },                     /* one point: from 0 to it */
        { { -7 }, 1, 0, -8, 0 },                   /* one negative point */
        { { 0 }, 1, 0, 0, 1 },                     /* one zero */
        { { 3, 3, 3 }, 3, 1, 0, 3 },               /* all equal */
        { { 0, 0, 0 }, 3, 1, 0, 1 },               /* all zero */
        { { -5, -1, NAN }, 3, 1, -5, 0 },          /* negative with zero */
        { { 0.3, 0.1, 0.2 }, 3, 0, 0.1, 0.3 },     /* steps that do not divide exactly */
        /* lo / step and hi / step round to whole numbers past the values */
        { { 7.958, 7.9581 }, 2, 0, 7.95798, 7.9581 },
        { { 0.22635000000000002, 0.22655000000000003 }, 2, 0, 0.22635, 0.2266 },
        { { 1e15, 1e15 + 2e4, 1e15 + 1 }, 3, 0, 1e15, 1e15 + 2e4 },   /* narrow, far from 0 */
        { { 1e15, 1e15 + 2, 1e15 + 1 }, 3, 0, 0, 1.5e15 },   /* equal to 1e-12: from 0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        svg_scale s;
        size_t finite = svg_scale_fit(&s, cases[i].v, cases[i].n, cases[i].zero, 0, 100);
        check_scale(&s, cases[i].v, cases[i].n, cases[i].zero, finite, i);
        if (fabs(s.d0 - cases[i].d0) > 1e-9 * fmax(1, fabs(cases[i].d0)) ||
            fabs(s.d1 - cases[i].d1) > 1e-9 * fmax(1, fabs(cases[i].d1)))
            fail_msg("case %zu: domain [%.17g, %.17g], want [%g, %g]", i, s.d0, s.d1,
                     cases[i].d0, cases[i].d1);
    }
    /* Values near the ends of the double range stay finite. */
    double big[2] = { -1.7e308, 1.7e308 };
    svg_scale s;
    svg_scale_fit(&s, big, 2, 0, 0, 100);
    assert_true(isfinite(s.d0) && isfinite(s.d1) && s.step > 0);
    assert_true(svg_scale_map(&s, 1.7e308) <= 100 + 1e-9);
    assert_true(svg_scale_map(&s, -1.7e308) >= -1e-9);
}

static void test_scale_integer(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    double v[16], t[64];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = (size_t)tu_randint(&r, 0, 16);
        int top = 1 << tu_randint(&r, 0, 12);   /* ranks up to 2048 */
        for (size_t i = 0; i < n; i++)
            v[i] = tu_randint(&r, 0, 20) == 0 ? NAN : (double)tu_randint(&r, -top, top + 1);
        int with_zero = tu_randint(&r, 0, 2);
        svg_scale s;
        size_t finite = svg_scale_fit(&s, v, n, with_zero, 300, 50);
        check_scale(&s, v, n, with_zero, finite, r.seed);
        int nt = svg_scale_ticks(&s, t, 64);
        for (int i = 0; i < nt; i++)
            if (t[i] != floor(t[i]))
                fail_msg("seed %llu: tick %g between whole numbers (step %g)",
                         (unsigned long long)r.seed, t[i], s.step);
    }
    /* Ranks 1 and 2: 0, 1, 2 (not 0, 0.5, 1, 1.5, 2). */
    svg_scale s;
    double ranks[2] = { 1, 2 };
    svg_scale_fit(&s, ranks, 2, 1, 0, 100);
    assert_int_equal(svg_scale_ticks(&s, t, 64), 3);
    assert_true(t[0] == 0 && t[1] == 1 && t[2] == 2);
    /* A fraction among the values: fractional steps stay. */
    double mixed[2] = { 1, 1.5 };
    svg_scale_fit(&s, mixed, 2, 0, 0, 100);
    assert_true(s.step < 1);
}

/* ---- shapes ----------------------------------------------------------------------------- */

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void test_nonfinite_left_out(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    for (int iter = 0; iter < 300; iter++) {
        svg_doc d = { 0 };
        svg_begin(&d, 100, 100, "t<i>tle");
        double xs[40], ys[40];
        size_t n = (size_t)tu_randint(&r, 0, 40), lines = 0, dots = 0, run = 0;
        for (size_t i = 0; i <= n; i++) {
            int bad = i == n || tu_randint(&r, 0, 4) == 0;
            if (i < n) {
                xs[i] = tu_uniform(&r) * 100;
                ys[i] = bad ? (tu_randint(&r, 0, 2) ? NAN : -INFINITY) : tu_uniform(&r) * 100;
            }
            if (bad) {
                lines += run >= 2;
                dots += run == 1;
                run = 0;
            } else {
                run++;
            }
        }
        svg_polyline(&d, xs, ys, n, "#000", 1, NULL);
        svg_rect(&d, NAN, 0, 1, 1, "red", NULL);
        svg_line(&d, 0, 0, INFINITY, 1, "red", 1, NULL);
        svg_circle(&d, 1, NAN, 2, "red", NULL);
        svg_text(&d, NAN, 1, SVG_START, 10, 0, 0, "red", "x");
        svg_rect(&d, 10, 10, -5, -5, "blue", "neg & tip");
        char *text;
        size_t len;
        hearth_err err = { { 0 } };
        assert_int_equal(svg_finish(&d, &text, &len, &err), 0);
        assert_int_equal(strlen(text), len);
        if (count(text, "<polyline") != lines || count(text, "<circle") != dots)
            fail_msg("seed %llu: %zu polylines and %zu dots, want %zu and %zu",
                     (unsigned long long)r.seed, count(text, "<polyline"),
                     count(text, "<circle"), lines, dots);
        assert_null(strstr(text, "nan"));
        assert_null(strstr(text, "inf"));
        assert_null(strstr(text, "red"));
        assert_non_null(strstr(text, "<rect x=\"5.00\" y=\"5.00\" width=\"5.00\" height=\"5.00\""));
        assert_non_null(strstr(text, "<title>neg &amp; tip</title>"));
        assert_non_null(strstr(text, "<title>t&lt;i&gt;tle</title>"));
        assert_true(len > 7 && strcmp(text + len - 7, "</svg>\n") == 0);
        free(text);
    }
}

static void test_marker_dash_group(void **state)
{
    (void)state;
    svg_doc d = { 0 };
    svg_begin(&d, 100, 100, NULL);
    svg_group_begin(&d, "config C1", "a <tip>");
    for (int k = 0; k < SVG_N_SHAPES; k++)
        svg_marker(&d, 50, 40, 5, (svg_shape)k, "#123456", k % 2 ? "#ffffff" : NULL, NULL);
    svg_marker(&d, NAN, 40, 5, SVG_SQUARE, "red", NULL, NULL);
    svg_group_end(&d);
    double xs[2] = { 0, 10 }, ys[2] = { 0, 10 };
    svg_polyline(&d, xs, ys, 2, "#000", 1, "7 3");
    svg_line(&d, 0, 0, 1, 1, "#000", 1, "2 2");
    char *text;
    size_t len;
    hearth_err err = { { 0 } };
    assert_int_equal(svg_finish(&d, &text, &len, &err), 0);
    assert_non_null(strstr(text, "<g class=\"config C1\"><title>a &lt;tip&gt;</title>"));
    assert_int_equal(count(text, "<circle"), 1);
    assert_int_equal(count(text, "<polygon"), SVG_N_SHAPES - 1);
    assert_int_equal(count(text, "stroke=\"#ffffff\""), SVG_N_SHAPES / 2);
    assert_int_equal(count(text, "</g>"), 1);
    assert_null(strstr(text, "red"));
    assert_non_null(strstr(text, "stroke-dasharray=\"7 3\""));
    assert_non_null(strstr(text, "stroke-dasharray=\"2 2\""));
    /* Every polygon's vertices surround its centre: their mean is within a pixel of it. */
    for (const char *p = strstr(text, "points=\""); p; p = strstr(p + 1, "points=\"")) {
        if (strncmp(p - 9, "<polygon ", 9))
            continue;
        const char *q = p + 8;
        double sx = 0, sy = 0;
        int k = 0;
        while (*q != '"') {
            char *e;
            sx += strtod(q, &e);
            sy += strtod(e + 1, &e);
            k++;
            q = e + (*e == ' ');
        }
        assert_true(k >= 3 && fabs(sx / k - 50) < 1 && fabs(sy / k - 40) < 1);
    }
    free(text);
}

static void test_format_number(void **state)
{
    (void)state;
    static const struct { double x; const char *want; } cases[] = {
        { 0, "0" }, { 950, "950" }, { 999.4, "999" }, { 999.6, "1k" }, { 1234, "1.23k" },
        { -4500, "-4.5k" }, { 2.5e6, "2.5M" }, { 7e9, "7G" }, { 3e12, "3T" },
        { 5e15, "5e+03T" }, { 0.0012, "0.0012" }, { NAN, "-" }, { -INFINITY, "-" },
    };
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        svg_format_number(cases[i].x, buf, sizeof buf);
        assert_string_equal(buf, cases[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_random),
        cmocka_unit_test(test_escape_cases),
        cmocka_unit_test(test_scale_random),
        cmocka_unit_test(test_scale_edges),
        cmocka_unit_test(test_scale_integer),
        cmocka_unit_test(test_nonfinite_left_out),
        cmocka_unit_test(test_marker_dash_group),
        cmocka_unit_test(test_format_number),
    };
    return cmocka_run_group_tests_name("orch_svg", tests, NULL, NULL);
}
