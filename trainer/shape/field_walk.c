/* field_walk.c - flattening a YAML mapping into dotted-key settings (fields.h). */
#include "shape/fields.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void field_settings_free(field_settings *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int add_setting(field_settings *out, const char *canon, const yaml_tree_node *v,
                       const field_src *src, hearth_err *err)
{
    char loc[300];
    /* The same key twice in one file (e.g. `train: {steps: 1}` and `train.steps: 2`) is
     * a mistake; --set overrides are meant to replace, so they are not checked. */
    for (int i = 0; src->file && i < out->n; i++) {
        const field_setting *o = &out->v[i];
        if (o->src.file && strcmp(o->src.file, src->file) == 0 && strcmp(o->key, canon) == 0) {
            field_src_format(src, loc, sizeof loc);
            return herr_set(err, HERR_CONFIG, "%s: set twice (first at %d:%d as %s)", loc,
                            o->src.line, o->src.col, o->src.key);
        }
    }
    if (out->n == out->cap) {
        int cap = out->cap ? 2 * out->cap : 32;
        field_setting *nv = realloc(out->v, (size_t)cap * sizeof *nv);
        if (!nv)
            return herr_set(err, HERR_NOMEM, "out of memory");
        out->v = nv;
        out->cap = cap;
    }
    field_setting *s = &out->v[out->n++];
    snprintf(s->key, sizeof s->key, "%s", canon);
    s->value = v;
    s->src = *src;
    return 0;
}

static int walk(const field_walker *w, const char *file, const char *key, int line, int col,
                const yaml_tree_node *node, field_settings *out, hearth_err *err)
{
    field_src src = { .file = file };
    if (strlen(key) >= sizeof src.key) {
        src.line = line;
        src.col = col;
        return herr_set(err, HERR_CONFIG, "%s:%d:%d: %.60s...: key too long", file ? file : "--set",
                        line, col, key);
    }
    snprintf(src.key, sizeof src.key, "%s", key);
    char canon[160] = "";
    int kind = w->classify(w->ctx, key, node, canon, sizeof canon);
    if (kind == WALK_SECTION && node && node->kind == YAML_TREE_MAP) {
        for (int i = 0; i < node->n_pairs; i++) {
            const yaml_tree_pair *p = &node->pairs[i];
            char child[512];
            snprintf(child, sizeof child, "%s.%s", key, p->key);
            int rc = walk(w, file, child, p->line, p->col, p->value, out, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    char loc[300];
    if (kind == WALK_LEAF) {
        if (file && node) {
            src.line = node->line;
            src.col = node->col;
        }
        return add_setting(out, canon[0] ? canon : key, node, &src, err);
    }
    if (kind == WALK_SECTION) {
        char got[96];
        if (file && node) {
            src.line = node->line;
            src.col = node->col;
        }
        field_src_format(&src, loc, sizeof loc);
        yaml_tree_describe(node, got, sizeof got);
        return herr_set(err, HERR_CONFIG, "%s: expected a mapping, got %s", loc, got);
    }
    if (file) {
        src.line = line;
        src.col = col;
    }
    field_src_format(&src, loc, sizeof loc);
    char hint[200] = "";
    if (w->suggest)
        w->suggest(w->ctx, key, hint, sizeof hint);
    if (hint[0])
        return herr_set(err, HERR_CONFIG, "%s: unknown key (did you mean %s?)", loc, hint);
    return herr_set(err, HERR_CONFIG, "%s: unknown key", loc);
}

int field_walk(const field_walker *w, const char *file, const char *key,
               const yaml_tree_node *node, field_settings *out, hearth_err *err)
{
    if (key && key[0])
        return walk(w, file, key, node ? node->line : 0, node ? node->col : 0, node, out, err);
    if (!node || yaml_tree_is_null(node))
        return 0;
    if (node->kind != YAML_TREE_MAP) {
        if (file)
            return herr_set(err, HERR_CONFIG, "%s:%d:%d: expected a mapping of keys at the top",
                            file, node->line, node->col);
        return herr_set(err, HERR_CONFIG, "expected a mapping of keys");
    }
    for (int i = 0; i < node->n_pairs; i++) {
        const yaml_tree_pair *p = &node->pairs[i];
        int rc = walk(w, file, p->key, p->line, p->col, p->value, out, err);
        if (rc)
            return rc;
    }
    return 0;
}
