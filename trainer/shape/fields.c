/* fields.c - reading YAML nodes into structs through a key table (fields.h). */
#include "shape/fields.h"

#include <float.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int field_find(const field_desc *t, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].key, key) == 0)
            return i;
    return -1;
}

int field_is_section(const field_desc *t, int n, const char *key)
{
    size_t len = strlen(key);
    for (int i = 0; i < n; i++)
        if (strncmp(t[i].key, key, len) == 0 && t[i].key[len] == '.')
            return 1;
    return 0;
}

void field_src_format(const field_src *s, char *buf, size_t size)
{
    if (s->file && s->line > 0)
        snprintf(buf, size, "%s:%d:%d: %s", s->file, s->line, s->col, s->key);
    else if (s->file)
        snprintf(buf, size, "%s: %s", s->file, s->key);
    else if (s->key[0])
        snprintf(buf, size, "--set %s", s->key);
    else
        snprintf(buf, size, "(default)");
}

void field_state_init(field_state *st, const field_desc *t, int n, void *base)
{
    memset(st, 0, sizeof *st);
    st->t = t;
    st->n = n;
    st->base = base;
}

static int is_auto_word(const yaml_tree_node *n)
{
    return n && n->kind == YAML_TREE_SCALAR && !n->quoted && strcmp(n->text, "auto") == 0;
}

/* "expected an integer >= 1" style range text for messages. */
static void range_text(const field_desc *f, int integer, char *buf, size_t size)
{
    const char *gt = (f->flags & FIELD_GT_MIN) ? ">" : ">=";
    if (f->max >= 1e15 || (integer && f->max >= 1e9))
        snprintf(buf, size, "%s %.17g", gt, f->min);
    else if (f->flags & FIELD_GT_MIN)
        snprintf(buf, size, "> %.17g and <= %.17g", f->min, f->max);
    else
        snprintf(buf, size, "between %.17g and %.17g", f->min, f->max);
}

static int in_range(const field_desc *f, double v)
{
    if (f->flags & FIELD_GT_MIN)
        return v > f->min && v <= f->max;
    return v >= f->min && v <= f->max;
}

/* Reads one integer of a row (scalar or list item) with its range. */
static int read_int(const field_desc *f, const yaml_tree_node *node, const char *loc,
                    const char *expected, int64_t *out, hearth_err *err)
{
    char got[96], range[96];
    int r = yaml_tree_as_int(node, out);
    if (r == 0) {
        yaml_tree_describe(node, got, sizeof got);
        return herr_set(err, HERR_CONFIG, "%s: expected %s, got %s", loc, expected, got);
    }
    if (r < 0 || !in_range(f, (double)*out)) {
        range_text(f, 1, range, sizeof range);
        return herr_set(err, HERR_CONFIG, "%s: must be %s, got %s", loc, range, node->text);
    }
    return 0;
}

static int read_int_list(const field_desc *f, const yaml_tree_node *node, const char *loc,
                         int *dst, int *count, int exact, int cap, hearth_err *err)
{
    char expected[64], got[96];
    if (exact)
        snprintf(expected, sizeof expected, "a list of %d integers", exact);
    else
        snprintf(expected, sizeof expected, "a list of at most %d integers", cap);
    if (!node || node->kind != YAML_TREE_SEQ || (exact && node->n_items != exact) ||
        node->n_items > cap) {
        yaml_tree_describe(node, got, sizeof got);
        if (node && node->kind == YAML_TREE_SEQ)
            snprintf(got, sizeof got, "a list of %d items", node->n_items);
        return herr_set(err, HERR_CONFIG, "%s: expected %s, got %s", loc, expected, got);
    }
    for (int k = 0; k < node->n_items; k++) {
        int64_t v;
        char iloc[300];
        snprintf(iloc, sizeof iloc, "%s[%d]", loc, k);
        int rc = read_int(f, node->items[k], iloc, "an integer", &v, err);
        if (rc)
            return rc;
        dst[k] = (int)v;
    }
    if (count)
        *count = node->n_items;
    return 0;
}

static void mark_set(field_state *st, int i, const field_src *src)
{
    st->set[i] = 1;
    st->is_auto[i] = 0;
    st->src[i] = *src;
}

int field_apply(field_state *st, int i, const yaml_tree_node *node, const field_src *src,
                hearth_err *err)
{
    const field_desc *f = &st->t[i];
    char *p = (char *)st->base + f->off;
    char loc[300], got[96], range[96];
    field_src_format(src, loc, sizeof loc);
    const char *or_auto = (f->flags & FIELD_AUTO) ? " or auto" : "";

    if ((f->flags & FIELD_AUTO) && is_auto_word(node)) {
        mark_set(st, i, src);
        st->is_auto[i] = 1;
        return 0;
    }
    switch (f->type) {
    case FT_INT:
    case FT_I64: {
        int64_t v;
        char expected[64];
        snprintf(expected, sizeof expected, "an integer%s", or_auto);
        int rc = read_int(f, node, loc, expected, &v, err);
        if (rc)
            return rc;
        if (f->type == FT_INT)
            *(int *)p = (int)v;
        else
            *(int64_t *)p = v;
        break;
    }
    case FT_DOUBLE:
    case FT_FLOAT: {
        double v;
        int r = yaml_tree_as_double(node, &v);
        if (r == 0) {
            yaml_tree_describe(node, got, sizeof got);
            return herr_set(err, HERR_CONFIG, "%s: expected a number%s, got %s", loc, or_auto,
                            got);
        }
        if (r < 0 || !in_range(f, v) || (f->type == FT_FLOAT && (v > FLT_MAX || v < -FLT_MAX))) {
            range_text(f, 0, range, sizeof range);
            return herr_set(err, HERR_CONFIG, "%s: must be %s, got %s", loc, range, node->text);
        }
        if (f->type == FT_DOUBLE)
            *(double *)p = v;
        else
            *(float *)p = (float)v;
        break;
    }
    case FT_BOOL:
    case FT_BIAS_ALL: {
        int v;
        if (!yaml_tree_as_bool(node, &v)) {
            yaml_tree_describe(node, got, sizeof got);
            return herr_set(err, HERR_CONFIG, "%s: expected a boolean (true or false)%s, got %s",
                            loc, f->type == FT_BIAS_ALL ? " or a mapping" : "", got);
        }
        if (f->type == FT_BIAS_ALL) {
            /* The three rows that follow are bias.qkv, bias.proj and bias.mlp. */
            for (int k = 1; k <= 3; k++) {
                *(int *)((char *)st->base + st->t[i + k].off) = v;
                mark_set(st, i + k, src);
            }
        } else {
            *(int *)p = v;
        }
        break;
    }
    case FT_ENUM: {
        int found = -1;
        if (node && node->kind == YAML_TREE_SCALAR && !yaml_tree_is_null(node))
            for (int k = 0; f->names[k]; k++)
                if (strcmp(node->text, f->names[k]) == 0)
                    found = k;
        if (found < 0) {
            char names[256] = "";
            for (int k = 0; f->names[k]; k++) {
                if (k)
                    strncat(names, "|", sizeof names - strlen(names) - 1);
                strncat(names, f->names[k], sizeof names - strlen(names) - 1);
            }
            yaml_tree_describe(node, got, sizeof got);
            return herr_set(err, HERR_CONFIG, "%s: expected one of %s%s, got %s", loc, names,
                            (f->flags & FIELD_AUTO) ? "|auto" : "", got);
        }
        *(int *)p = found;
        break;
    }
    case FT_STR: {
        if (!node || node->kind != YAML_TREE_SCALAR) {
            yaml_tree_describe(node, got, sizeof got);
            return herr_set(err, HERR_CONFIG, "%s: expected a string, got %s", loc, got);
        }
        const char *s = yaml_tree_is_null(node) ? "" : node->text;
        if (strlen(s) != (yaml_tree_is_null(node) ? 0 : node->len))
            return herr_set(err, HERR_CONFIG, "%s: the string contains a NUL character", loc);
        if (strlen(s) >= f->size)
            return herr_set(err, HERR_CONFIG, "%s: too long (at most %zu characters)", loc,
                            f->size - 1);
        memcpy(p, s, strlen(s) + 1);
        break;
    }
    case FT_INT3: {
        int v[3];
        int rc = read_int_list(f, node, loc, v, NULL, 3, 3, err);
        if (rc)
            return rc;
        memcpy(p, v, sizeof v);
        break;
    }
    case FT_INTLIST: {
        int v[256], count = 0;
        int cap = (int)(f->size < 256 ? f->size : 256);
        int rc = read_int_list(f, node, loc, v, &count, 0, cap, err);
        if (rc)
            return rc;
        memcpy(p, v, (size_t)count * sizeof(int));
        *(int *)((char *)st->base + f->count_off) = count;
        break;
    }
    }
    mark_set(st, i, src);
    return 0;
}

int field_fill_defaults(field_state *st, unsigned skip_comp_mask, const char *file,
                        const char *key_prefix, hearth_err *err)
{
    for (int i = 0; i < st->n; i++) {
        const field_desc *f = &st->t[i];
        if (st->set[i] || (f->flags & FIELD_NO_JSON) || (skip_comp_mask & (1u << f->comp)))
            continue;
        if (!f->def) {
            if (file)
                return herr_set(err, HERR_CONFIG, "%s: %s%s: required, but not given", file,
                                key_prefix, f->key);
            return herr_set(err, HERR_CONFIG, "%s%s: required, but not given", key_prefix,
                            f->key);
        }
        if (strcmp(f->def, "auto") == 0) {
            st->is_auto[i] = 1;
            continue;
        }
        field_src src = { .file = "(default)" };
        snprintf(src.key, sizeof src.key, "%s%s", key_prefix, f->key);
        int rc;
        if (f->def[0] == '[') {
            /* Lists go through the YAML reader; scalars take the short way below, since
             * planning a large sweep loads thousands of configs. */
            yaml_tree *t;
            if ((rc = yaml_tree_parse(&t, "(default)", f->def, strlen(f->def), err)))
                return rc;
            rc = field_apply(st, i, t->root, &src, err);
            yaml_tree_free(t);
        } else {
            yaml_tree_node n = { .kind = YAML_TREE_SCALAR, .line = 0, .col = 0,
                                 .text = (char *)f->def, .len = strlen(f->def) };
            rc = field_apply(st, i, &n, &src, err);
        }
        if (rc)
            return rc;
        st->set[i] = 0;
        if (f->type == FT_BIAS_ALL)
            for (int k = 1; k <= 3; k++)
                st->set[i + k] = 0;
        memset(&st->src[i], 0, sizeof st->src[i]);
    }
    return 0;
}

/* ---- "did you mean" --------------------------------------------------------------- */

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 150 || lb > 150)
        return 1000;
    int row[152];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *last_part(const char *key)
{
    const char *dot = strrchr(key, '.');
    return dot ? dot + 1 : key;
}

void field_suggest_init(field_suggestion *s)
{
    memset(s, 0, sizeof *s);
    s->dist = 1000;
}

void field_suggest_add(field_suggestion *s, const char *written, const char *candidate)
{
    int d = edit_distance(written, candidate);
    if (d < s->dist) {
        s->dist = d;
        snprintf(s->best, sizeof s->best, "%s", candidate);
    }
    if (strcmp(last_part(written), last_part(candidate)) == 0) {
        if (!s->tail_hits++)
            snprintf(s->tail, sizeof s->tail, "%s", candidate);
    }
}

const char *field_suggest_result(const field_suggestion *s, const char *written)
{
    int len = (int)strlen(written);
    int limit = len / 4 > 2 ? len / 4 : 2;
    if (s->dist <= limit)
        return s->best;
    if (s->tail_hits == 1)
        return s->tail;
    return NULL;
}
