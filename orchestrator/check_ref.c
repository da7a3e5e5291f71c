/* check_ref.c - reading and writing `hearth check` reference files.  See check_ref.h. */
#include "check_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_fmt.h"
#include "rundir.h"
#include "shape/yaml_tree.h"

/* The version of the format that this hearth writes and reads. */
#define REF_VERSION 1

typedef struct {
    const char *file;
    hearth_err *err;
} ref_reader;

static int bad(ref_reader *r, const yaml_tree_node *n, const char *key, const char *what)
{
    char got[96];
    yaml_tree_describe(n, got, sizeof got);
    return herr_set(r->err, HERR_CONFIG, "%s:%d:%d: %s: %s (got %s)", r->file, n->line, n->col,
                    key, what, got);
}

static int is_hex_hash(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
            return 0;
    return n == 64;
}

/* A `tolerances:` mapping into t. */
static int read_tols(ref_reader *r, const yaml_tree_node *map, check_tols *t)
{
    if (map->kind != YAML_TREE_MAP)
        return bad(r, map, "tolerances", "expected a mapping of figure: percent");
    for (int i = 0; i < map->n_pairs; i++) {
        const yaml_tree_pair *kv = &map->pairs[i];
        int f = check_figure_find(kv->key, strlen(kv->key));
        if (f < 0)
            return herr_set(r->err, HERR_CONFIG, "%s:%d:%d: tolerances: unknown figure '%s' "
                            "(figures: tokens_per_s, step_ms_median, mfu, peak_mem_bytes, "
                            "final_loss)", r->file, kv->line, kv->col, kv->key);
        if (kv->value->kind != YAML_TREE_SCALAR || yaml_tree_is_null(kv->value))
            return bad(r, kv->value, kv->key, "expected a percentage >= 0 or off");
        hearth_err e = { { 0 } };
        if (check_tol_value(kv->value->text, kv->key, &t->pct[f], &e))
            return herr_set(r->err, HERR_CONFIG, "%s:%d:%d: tolerances: %s", r->file,
                            kv->value->line, kv->value->col, e.msg);
    }
    return 0;
}

static int read_point(ref_reader *r, const yaml_tree_node *n, check_set *points)
{
    if (n->kind != YAML_TREE_MAP)
        return bad(r, n, "points", "expected a mapping per point");
    const yaml_tree_node *h = yaml_tree_get(n, "config_hash");
    if (!h)
        return herr_set(r->err, HERR_CONFIG, "%s:%d:%d: points: a point without config_hash",
                        r->file, n->line, n->col);
    if (h->kind != YAML_TREE_SCALAR || !is_hex_hash(h->text))
        return bad(r, h, "config_hash", "expected 64 lowercase hex digits");
    if (check_set_find(points, h->text))
        return bad(r, h, "config_hash", "this point is listed twice");
    check_point *p = check_set_add(points);
    if (!p || !(p->hash = strdup(h->text)) || !(p->source = strdup("reference")))
        return herr_set(r->err, HERR_NOMEM, "out of memory");
    for (int i = 0; i < n->n_pairs; i++) {
        const yaml_tree_pair *kv = &n->pairs[i];
        const yaml_tree_node *v = kv->value;
        int f = check_figure_find(kv->key, strlen(kv->key));
        int64_t runs;
        double x;
        if (strcmp(kv->key, "config_hash") == 0)
            continue;
        if (strcmp(kv->key, "label") == 0) {
            if (v->kind != YAML_TREE_SCALAR)
                return bad(r, v, "label", "expected text");
            free(p->label);
            if (!(p->label = strdup(v->text)))
                return herr_set(r->err, HERR_NOMEM, "out of memory");
        } else if (strcmp(kv->key, "runs") == 0) {
            if (yaml_tree_as_int(v, &runs) != 1 || runs < 0)
                return bad(r, v, "runs", "expected an integer >= 0");
            p->n_runs = (size_t)runs;
        } else if (strcmp(kv->key, "tolerances") == 0) {
            int rc = read_tols(r, v, &p->tols);
            if (rc)
                return rc;
        } else if (f >= 0) {
            if (yaml_tree_is_null(v))
                continue;
            if (yaml_tree_as_double(v, &x) != 1)
                return bad(r, v, kv->key, "expected a number or null");
            /* A reference holds one value per figure: its spread is unknown. */
            p->fig[f].n = 1;
            p->fig[f].median = x;
        } else {
            return herr_set(r->err, HERR_CONFIG, "%s:%d:%d: %s: unknown key of a point "
                            "(config_hash, label, runs, tolerances or a figure: "
                            "tokens_per_s, step_ms_median, mfu, peak_mem_bytes, final_loss)",
                            r->file, kv->line, kv->col, kv->key);
        }
    }
    return 0;
}

static int read_root(ref_reader *r, const yaml_tree_node *root, check_set *points,
                     check_tols *tols)
{
    if (!root || root->kind != YAML_TREE_MAP)
        return herr_set(r->err, HERR_CONFIG, "%s: expected a mapping with hearth_reference "
                        "and points", r->file);
    const yaml_tree_node *pts = NULL;
    int64_t version = 0;
    for (int i = 0; i < root->n_pairs; i++) {
        const yaml_tree_pair *kv = &root->pairs[i];
        int rc = 0;
        if (strcmp(kv->key, "hearth_reference") == 0) {
            if (yaml_tree_as_int(kv->value, &version) != 1 || version != REF_VERSION)
                rc = bad(r, kv->value, kv->key, "expected 1 (the format's version)");
        } else if (strcmp(kv->key, "experiment") == 0) {
            if (kv->value->kind != YAML_TREE_SCALAR)
                rc = bad(r, kv->value, kv->key, "expected a name");
        } else if (strcmp(kv->key, "tolerances") == 0) {
            rc = read_tols(r, kv->value, tols);
        } else if (strcmp(kv->key, "points") == 0) {
            pts = kv->value;
            if (pts->kind != YAML_TREE_SEQ)
                rc = bad(r, pts, kv->key, "expected a list of points");
        } else {
            rc = herr_set(r->err, HERR_CONFIG, "%s:%d:%d: %s: unknown key (hearth_reference, "
                          "experiment, tolerances, points)", r->file, kv->line, kv->col,
                          kv->key);
        }
        if (rc)
            return rc;
    }
    if (!version)
        return herr_set(r->err, HERR_CONFIG, "%s: hearth_reference: missing (a reference "
                        "file starts with hearth_reference: 1)", r->file);
    if (!pts)
        return herr_set(r->err, HERR_CONFIG, "%s: points: missing", r->file);
    for (int i = 0; i < pts->n_items; i++) {
        int rc = read_point(r, pts->items[i], points);
        if (rc)
            return rc;
    }
    return 0;
}

int check_ref_load(const char *path, check_set *points, check_tols *tols, hearth_err *err)
{
    memset(points, 0, sizeof *points);
    check_tols_unset(tols);
    yaml_tree *t = NULL;
    int rc = yaml_tree_load(&t, path, err);
    if (rc)
        return rc;
    ref_reader r = { path, err };
    rc = read_root(&r, t->root, points, tols);
    yaml_tree_free(t);
    return rc;
}

int check_ref_write(const char *path, const char *experiment, const check_set *points,
                    hearth_err *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m)
        return herr_set(err, HERR_NOMEM, "out of memory");
    fprintf(m, "# hearth check reference: per-point medians of experiment ");
    /* Comments hold the name as a JSON string, so no byte of it can end the line. */
    report_write_json_string(m, experiment);
    fprintf(m, ".\n# Add `tolerances: {FIGURE: PERCENT|off}` at the top or per point to "
               "override the defaults.\nhearth_reference: %d\nexperiment: ", REF_VERSION);
    report_write_json_string(m, experiment);
    size_t n_done = 0;
    for (size_t i = 0; i < points->n; i++)
        n_done += points->v[i].n_runs > 0;
    fprintf(m, "\npoints:%s\n", n_done ? "" : " []");
    for (size_t i = 0; i < points->n; i++) {
        const check_point *p = &points->v[i];
        if (!p->n_runs)
            continue;
        fprintf(m, "  - config_hash: %s\n    label: ", p->hash);
        report_write_json_string(m, p->label ? p->label : "");
        fprintf(m, "\n    runs: %zu\n", p->n_runs);
        for (int f = 0; f < CHECK_N_FIGURES; f++) {
            fprintf(m, "    %s: ", check_figure_get((check_figure)f)->name);
            report_write_real(m, p->fig[f].median, "null");
            fputc('\n', m);
        }
    }
    if (fclose(m) || !text) {
        free(text);
        return herr_set(err, HERR_NOMEM, "out of memory writing the reference");
    }
    int rc = rundir_write_file(path, text, len, 0644, err);
    free(text);
    return rc;
}
