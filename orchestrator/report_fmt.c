/* report_fmt.c - table / CSV / JSON writers.  See report_fmt.h. */
#include "report_fmt.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct report {
    FILE *out;
    report_format fmt;
    size_t ncols;
    char **names;
    long rows;
    /* table only: every cell formatted, and whether each column is right-aligned */
    char **cells;
    unsigned char *right;   /* per row*ncols + col */
    size_t n_cells, cap_cells;
};

int report_format_parse(const char *name, report_format *out, hearth_err *err)
{
    static const char *const names[] = {"table", "csv", "json"};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = (report_format)i;
            return 0;
        }
    return herr_set(err, HERR_CONFIG, "unknown format '%s' (expected table, csv or json)",
                    name ? name : "");
}

const char *report_format_name(report_format f)
{
    return f == REPORT_CSV ? "csv" : f == REPORT_JSON ? "json" : "table";
}

void report_write_real(FILE *out, double x, const char *nonfinite)
{
    if (!isfinite(x)) {
        fputs(nonfinite, out);
        return;
    }
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (prec == 17 || strtod(buf, NULL) == x)
            break;
    }
    fputs(buf, out);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static int utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    int n;
    unsigned min;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        min = 0x80;
        c &= 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        min = 0x800;
        c &= 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        min = 0x10000;
        c &= 0x07;
    } else {
        return 0;
    }
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    return n;
}

void report_write_json_string(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    fputc('"', out);
    while (*p) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc((int)c, out);
            p++;
        } else if (c < 0x20 || c == 0x7F) {
            switch (c) {
            case '\n': fputs("\\n", out); break;
            case '\r': fputs("\\r", out); break;
            case '\t': fputs("\\t", out); break;
            default: fprintf(out, "\\u%04x", c); break;
            }
            p++;
        } else {
            int n = utf8_len(p);
            if (n == 0) {   /* not UTF-8: the replacement character keeps the JSON valid */
                fputs("\\ufffd", out);
                p++;
            } else {
                fwrite(p, 1, (size_t)n, out);
                p += n;
            }
        }
    }
    fputc('"', out);
}

report *report_begin(FILE *out, report_format fmt, size_t ncols, const char *const *names)
{
    report *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->out = out;
    r->fmt = fmt;
    r->ncols = ncols;
    r->names = calloc(ncols ? ncols : 1, sizeof *r->names);
    if (!r->names) {
        free(r);
        return NULL;
    }
    for (size_t i = 0; i < ncols; i++)
        if (!(r->names[i] = strdup(names[i]))) {
            report_abort(r);
            return NULL;
        }
    if (fmt == REPORT_CSV) {
        report_cell *hdr = calloc(ncols ? ncols : 1, sizeof *hdr);
        if (!hdr) {
            report_abort(r);
            return NULL;
        }
        for (size_t i = 0; i < ncols; i++) {
            hdr[i].kind = CELL_TEXT;
            hdr[i].s = names[i];
        }
        /* A header cut short by a failed allocation must not pass for a table. */
        int bad = report_row(r, hdr, NULL);
        r->rows = 0;
        free(hdr);
        if (bad) {
            report_abort(r);
            return NULL;
        }
    } else if (fmt == REPORT_JSON) {
        fputc('[', out);
    }
    return r;
}

void report_abort(report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->ncols; i++)
        free(r->names[i]);
    free(r->names);
    for (size_t i = 0; i < r->n_cells; i++)
        free(r->cells[i]);
    free(r->cells);
    free(r->right);
    free(r);
}

static void csv_field(FILE *out, const char *s)
{
    size_t n = strlen(s);
    int quote = strpbrk(s, ",\"\r\n") != NULL || (n && (s[0] == ' ' || s[n - 1] == ' '));
    if (!quote) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

/* A cell as text for the table and CSV; *right tells whether it is a number. */
static char *cell_text(const report_cell *c, int table, int *right)
{
    char buf[64];
    *right = 0;
    switch (c->kind) {
    case CELL_NULL:
        return strdup(table ? "-" : "");
    case CELL_INT:
        *right = 1;
        snprintf(buf, sizeof buf, "%" PRId64, c->i);
        return strdup(buf);
    case CELL_BOOL:
        return strdup(c->i ? "true" : "false");
    case CELL_REAL: {
        *right = 1;
        if (!isfinite(c->d))
            return strdup(isnan(c->d) ? "nan" : c->d > 0 ? "inf" : "-inf");
        if (!table) {
            char *s = NULL;
            size_t len = 0;
            FILE *m = open_memstream(&s, &len);
            if (!m)
                return NULL;
            report_write_real(m, c->d, "");
            fclose(m);
            return s;
        }
        /* Tables are for reading: six significant digits, no exponent for large values. */
        double a = fabs(c->d);
        if (a >= 1e5 && a < 1e15)
            snprintf(buf, sizeof buf, "%.0f", c->d);
        else
            snprintf(buf, sizeof buf, "%.6g", c->d);
        return strdup(buf);
    }
    case CELL_TEXT:
    case CELL_JSON: {
        char *s = strdup(c->s ? c->s : "");
        if (s && table)
            for (char *p = s; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == 0x7F)
                    *p = '?';
        return s;
    }
    }
    return strdup("");
}

static void json_cell(FILE *out, const report_cell *c)
{
    switch (c->kind) {
    case CELL_NULL: fputs("null", out); break;
    case CELL_INT: fprintf(out, "%" PRId64, c->i); break;
    case CELL_BOOL: fputs(c->i ? "true" : "false", out); break;
    case CELL_REAL: report_write_real(out, c->d, "null"); break;
    case CELL_TEXT: report_write_json_string(out, c->s); break;
    case CELL_JSON: fputs(c->s && *c->s ? c->s : "null", out); break;
    }
}

int report_row(report *r, const report_cell *cells, hearth_err *err)
{
    if (r->fmt == REPORT_JSON) {
        fputs(r->rows ? ",\n{" : "\n{", r->out);
        for (size_t i = 0; i < r->ncols; i++) {
            if (i)
                fputc(',', r->out);
            report_write_json_string(r->out, r->names[i]);
            fputc(':', r->out);
            json_cell(r->out, &cells[i]);
        }
        fputc('}', r->out);
        r->rows++;
        return 0;
    }
    if (r->fmt == REPORT_CSV) {
        for (size_t i = 0; i < r->ncols; i++) {
            int right;
            char *s = cell_text(&cells[i], 0, &right);
            if (!s)
                return herr_set(err, HERR_NOMEM, "out of memory");
            if (i)
                fputc(',', r->out);
            csv_field(r->out, s);
            free(s);
        }
        fputc('\n', r->out);
        r->rows++;
        return 0;
    }
    if (r->n_cells + r->ncols > r->cap_cells) {
        size_t cap = r->cap_cells ? 2 * r->cap_cells : 64 * (r->ncols ? r->ncols : 1);
        while (cap < r->n_cells + r->ncols)
            cap *= 2;
        char **nc = realloc(r->cells, cap * sizeof *nc);
        if (!nc)
            return herr_set(err, HERR_NOMEM, "out of memory");
        r->cells = nc;
        unsigned char *nr = realloc(r->right, cap);
        if (!nr)
            return herr_set(err, HERR_NOMEM, "out of memory");
        r->right = nr;
        r->cap_cells = cap;
    }
    for (size_t i = 0; i < r->ncols; i++) {
        int right;
        char *s = cell_text(&cells[i], 1, &right);
        if (!s) {
            for (size_t j = 0; j < i; j++)
                free(r->cells[r->n_cells + j]);
            return herr_set(err, HERR_NOMEM, "out of memory");
        }
        r->cells[r->n_cells + i] = s;
        r->right[r->n_cells + i] = (unsigned char)right;
    }
    r->n_cells += r->ncols;
    r->rows++;
    return 0;
}

/* Display width: UTF-8 continuation bytes take no column. */
static size_t text_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80)
            w++;
    return w;
}

static void pad(FILE *out, size_t n)
{
    while (n--)
        fputc(' ', out);
}

static void write_table(report *r)
{
    size_t *w = calloc(r->ncols ? r->ncols : 1, sizeof *w);
    if (!w)
        return;
    for (size_t c = 0; c < r->ncols; c++)
        w[c] = text_width(r->names[c]);
    for (size_t i = 0; i < r->n_cells; i++) {
        size_t tw = text_width(r->cells[i]);
        if (tw > w[i % r->ncols])
            w[i % r->ncols] = tw;
    }
    /* A column is right-aligned when every non-null cell in it is a number. */
    unsigned char *right = calloc(r->ncols ? r->ncols : 1, 1);
    if (!right) {
        free(w);
        return;
    }
    for (size_t c = 0; c < r->ncols; c++) {
        int any = 0, all = 1;
        for (size_t i = c; i < r->n_cells; i += r->ncols) {
            if (strcmp(r->cells[i], "-") == 0 && !r->right[i])
                continue;
            any = 1;
            all &= r->right[i];
        }
        right[c] = (unsigned char)(any && all);
    }
    for (size_t c = 0; c < r->ncols; c++) {
        size_t tw = text_width(r->names[c]);
        if (c)
            fputs("  ", r->out);
        if (right[c])
            pad(r->out, w[c] - tw);
        for (const char *p = r->names[c]; *p; p++)
            fputc((unsigned char)*p < 0x20 ? '?' : *p, r->out);
        if (!right[c] && c + 1 < r->ncols)
            pad(r->out, w[c] - tw);
    }
    fputc('\n', r->out);
    for (size_t c = 0; c < r->ncols; c++) {
        if (c)
            fputs("  ", r->out);
        for (size_t k = 0; k < w[c]; k++)
            fputc('-', r->out);
    }
    fputc('\n', r->out);
    for (size_t i = 0; i < r->n_cells; i++) {
        size_t c = i % r->ncols;
        size_t tw = text_width(r->cells[i]);
        if (c)
            fputs("  ", r->out);
        if (right[c])
            pad(r->out, w[c] - tw);
        fputs(r->cells[i], r->out);
        if (!right[c] && c + 1 < r->ncols)
            pad(r->out, w[c] - tw);
        if (c + 1 == r->ncols)
            fputc('\n', r->out);
    }
    free(right);
    free(w);
}

int report_end(report *r, hearth_err *err)
{
    if (!r)
        return herr_set(err, HERR_NOMEM, "out of memory");
    if (r->fmt == REPORT_JSON)
        fputs(r->rows ? "\n]\n" : "]\n", r->out);
    else if (r->fmt == REPORT_TABLE)
        write_table(r);
    int bad = fflush(r->out) != 0 || ferror(r->out);
    report_abort(r);
    return bad ? herr_set(err, HERR_IO, "error writing the report") : 0;
}
