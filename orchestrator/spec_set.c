/* spec_set.c - grafts `--set KEY=VALUE` overrides into a spec's YAML tree.  See spec_set.h. */
#include "spec_set.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/fields.h"
#include "spec.h"

/* The top-level keys whose value is a mapping that an override may reach into. */
static const char *const mapping_keys[] = { "base", "resources", "matrix", "after", "auto",
                                             NULL };

static int in_list(const char *const *list, const char *key)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], key) == 0)
            return 1;
    return 0;
}

static int nomem(hearth_err *err)
{
    return herr_set(err, HERR_NOMEM, "out of memory");
}

/* Every node an override wrote says so (spec.h): its messages then name the argument. */
static void mark(yaml_tree_node *n, int line)
{
    if (!n)
        return;
    n->line = line;
    n->col = 0;
    for (int i = 0; i < n->n_items; i++)
        mark(n->items[i], line);
    for (int i = 0; i < n->n_pairs; i++) {
        n->pairs[i].line = line;
        n->pairs[i].col = 0;
        mark(n->pairs[i].value, line);
    }
}

static yaml_tree_node *new_node(yaml_tree_kind kind, int line)
{
    yaml_tree_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->kind = kind;
    n->line = line;
    if (kind == YAML_TREE_SCALAR && !(n->text = calloc(1, 1))) {
        free(n);
        return NULL;
    }
    return n;
}

/* Appends `key: value` to a mapping; the mapping takes the value. */
static int add_pair(yaml_tree_node *map, const char *key, int line, yaml_tree_node *value)
{
    yaml_tree_pair *pairs = realloc(map->pairs, (size_t)(map->n_pairs + 1) * sizeof *pairs);
    if (!pairs)
        return -1;
    map->pairs = pairs;
    char *k = strdup(key);
    if (!k)
        return -1;
    pairs[map->n_pairs++] = (yaml_tree_pair){ .key = k, .line = line, .col = 0, .value = value };
    return 0;
}

/* "model" and "model.preset" name one key. */
static int same_key(const char *a, const char *b)
{
    if (strcmp(a, "model") == 0)
        a = "model.preset";
    if (strcmp(b, "model") == 0)
        b = "model.preset";
    return strcmp(a, b) == 0;
}

/* The pair of run-config key `key` in a base mapping, whether written dotted
 * (`train.lr: 1`), nested (`train: {lr: 1}`) or in between; `model: NAME` is
 * model.preset.  NULL when the base does not set it. */
static yaml_tree_pair *find_run_pair(yaml_tree_node *map, const char *key)
{
    for (int i = 0; map && map->kind == YAML_TREE_MAP && i < map->n_pairs; i++) {
        yaml_tree_pair *p = &map->pairs[i];
        size_t len = strlen(p->key);
        if (same_key(p->key, key) &&
            (strcmp(p->key, "model") != 0 || p->value->kind == YAML_TREE_SCALAR))
            return p;
        if (strncmp(key, p->key, len) == 0 && key[len] == '.' &&
            p->value->kind == YAML_TREE_MAP) {
            yaml_tree_pair *inner = find_run_pair(p->value, key + len + 1);
            if (inner)
                return inner;
        }
    }
    return NULL;
}

/* The mapping under top-level `name`, made when absent (or written empty). */
static int top_map(yaml_tree *t, const char *name, int line, const char *key,
                   yaml_tree_node **out, hearth_err *err)
{
    yaml_tree_pair *p = (yaml_tree_pair *)yaml_tree_get_pair(t->root, name);
    if (p && p->value->kind == YAML_TREE_MAP) {
        *out = p->value;
        return 0;
    }
    if (p && !yaml_tree_is_null(p->value)) {
        char got[96];
        yaml_tree_describe(p->value, got, sizeof got);
        return herr_set(err, HERR_CONFIG, "--set %s: the spec's %s (line %d) is %s, not a "
                        "mapping to set a key in", key, name, p->value->line, got);
    }
    yaml_tree_node *m = new_node(YAML_TREE_MAP, line);
    if (!m)
        return nomem(err);
    if (p) {   /* `matrix:` with nothing: the empty mapping takes its place */
        free(p->value->text);
        free(p->value);
        p->value = m;
    } else if (add_pair(t->root, name, line, m)) {
        free(m);
        return nomem(err);
    }
    *out = m;
    return 0;
}

/* Puts `value` at `pair` (the node it replaces goes back into vt, to be freed with it) or,
 * without a pair, adds `key: value` to `map`. */
static int graft(yaml_tree *vt, yaml_tree_node *map, yaml_tree_pair *pair, const char *key,
                 int line, hearth_err *err)
{
    yaml_tree_node *value = vt->root;
    if (pair) {
        vt->root = pair->value;
        pair->value = value;
        return 0;
    }
    if (add_pair(map, key, line, value))
        return nomem(err);
    vt->root = NULL;
    return 0;
}

static int unknown_key(const char *key, hearth_err *err)
{
    field_suggestion sg;
    field_suggest_init(&sg);
    spec_key_suggest(&sg, key);
    const char *const *top = spec_keys(SPEC_KEYS_TOP);
    for (int i = 0; top[i]; i++)
        field_suggest_add(&sg, key, top[i]);
    /* "matrx.train.lr" -> "matrix.train.lr" */
    const char *dot = strchr(key, '.');
    for (int i = 0; dot && mapping_keys[i]; i++) {
        char cand[200];
        snprintf(cand, sizeof cand, "%s%s", mapping_keys[i], dot);
        field_suggest_add(&sg, key, cand);
    }
    const char *best = field_suggest_result(&sg, key);
    char hint[220] = "";
    if (best)
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
    return herr_set(err, HERR_CONFIG, "--set %s: unknown key%s", key, hint);
}

/* Grafts override vt (already marked with `line`) at `key`. */
static int apply_one(yaml_tree *t, yaml_tree *vt, const char *key, int line, hearth_err *err)
{
    char head[64];
    size_t hl = strcspn(key, ".");
    const char *rest = key[hl] ? key + hl + 1 : NULL;
    snprintf(head, sizeof head, "%.*s", (int)(hl < sizeof head ? hl : sizeof head - 1), key);
    yaml_tree_node *map;
    int rc;
    if (in_list(spec_keys(SPEC_KEYS_TOP), head) && hl < sizeof head) {
        if (!rest)
            return graft(vt, t->root, (yaml_tree_pair *)yaml_tree_get_pair(t->root, head), head,
                         line, err);
        if (!in_list(mapping_keys, head))
            return herr_set(err, HERR_CONFIG, "--set %s: %s is a value, with no keys below it",
                            key, head);
        if (!*rest)
            return herr_set(err, HERR_CONFIG, "--set %s: expected a key after '%s.'", key,
                            head);
        if ((rc = top_map(t, head, line, key, &map, err)))
            return rc;
    } else if (spec_key_known(key, NULL, 0) && !spec_key_is_resource(key)) {
        if ((rc = top_map(t, "base", line, key, &map, err)))
            return rc;
        strcpy(head, "base");
        rest = key;
    } else {
        return unknown_key(key, err);
    }
    yaml_tree_pair *pair = NULL;
    if (strcmp(head, "base") == 0) {
        pair = find_run_pair(map, rest);
        /* `model: NAME` reads best, unless the base already has a `model:` mapping */
        if (!pair && same_key(rest, "model") && !yaml_tree_get_pair(map, "model"))
            rest = "model";
    } else {
        for (int i = 0; i < map->n_pairs && !pair; i++)
            if (strcmp(head, "matrix") == 0 ? same_key(map->pairs[i].key, rest)
                                            : strcmp(map->pairs[i].key, rest) == 0)
                pair = &map->pairs[i];
    }
    return graft(vt, map, pair, rest, line, err);
}

/* Splits "KEY=VALUE" and parses VALUE into a marked tree whose root is never NULL. */
static int parse_one(const char *arg, int line, yaml_tree **vt, char **key, hearth_err *err)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return herr_set(err, HERR_CONFIG, "--set %s: expected KEY=VALUE", arg);
    if (!(*key = strndup(arg, (size_t)(eq - arg))))
        return nomem(err);
    char name[300];
    snprintf(name, sizeof name, "--set %s", *key);
    int rc = yaml_tree_parse(vt, name, eq + 1, strlen(eq + 1), err);
    if (rc) {
        /* "--set KEY:1:5: YAML syntax error: ..." -> the value and the problem */
        char inner[sizeof err->msg];
        size_t skip = strlen(name);
        snprintf(inner, sizeof inner, "%s",
                 strncmp(err->msg, name, skip) == 0 ? err->msg + skip + 1 : err->msg);
        return herr_set(err, rc, "--set %s: cannot read the value \"%.100s\" (%s)", *key,
                        eq + 1, inner);
    }
    if (!(*vt)->root && !((*vt)->root = new_node(YAML_TREE_SCALAR, line)))
        return nomem(err);
    mark((*vt)->root, line);
    return 0;
}

int spec_set_apply(yaml_tree *tree, const char *file, const char *const *sets, int n_sets,
                   yaml_tree **value_trees, char **keys, hearth_err *err)
{
    if (n_sets > 0 && !tree->root && !(tree->root = new_node(YAML_TREE_MAP, 1)))
        return nomem(err);
    if (n_sets > 0 && tree->root->kind != YAML_TREE_MAP)
        return herr_set(err, HERR_CONFIG, "%s: the spec is not a mapping; --set cannot apply",
                        file);
    for (int i = 0; i < n_sets; i++) {
        int line = -(i + 1);
        int rc = parse_one(sets[i], line, &value_trees[i], &keys[i], err);
        if (!rc)
            rc = apply_one(tree, value_trees[i], keys[i], line, err);
        if (rc)
            return rc;
    }
    return 0;
}
