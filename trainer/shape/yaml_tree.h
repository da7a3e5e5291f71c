/* yaml_tree.h - one YAML document as a small tree of nodes that remember where they were
 * written, so that every user error can say FILE:LINE:COL.
 *
 * The one YAML reader of Hearth: model presets, run configs, --set values and the
 * orchestrator's experiment specs all go through it.  Built on libyaml's event API.
 *
 * What it keeps: scalars (their text and whether they were quoted), sequences and
 * mappings, each with its 1-based line and column.  Anchors and aliases are resolved
 * by copying the anchored node (an alias can only name a node that is complete, so
 * cycles cannot happen; the node count is bounded against alias bombs).  Tags other
 * than !!str are ignored.  Duplicate keys in one mapping, non-scalar keys and more than
 * one document are errors.  An empty document gives a NULL root.
 *
 * Scalars are interpreted on demand with the YAML 1.2 core schema, restricted on
 * purpose: null is "", "~" or null/Null/NULL; booleans are true/false (any case of the
 * first letter, or all capitals); integers are decimal; numbers are decimal with an
 * optional fraction and exponent (no .inf or .nan).  A quoted or block scalar is
 * always a string.
 *
 * Ownership: yaml_tree_parse/yaml_tree_load allocate the tree; yaml_tree_free releases
 * it with every node.  Nodes and their text live as long as the tree. */
#ifndef HEARTH_YAML_TREE_H
#define HEARTH_YAML_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "shape/err.h"

typedef enum { YAML_TREE_SCALAR = 0, YAML_TREE_SEQ = 1, YAML_TREE_MAP = 2 } yaml_tree_kind;

typedef struct yaml_tree_node yaml_tree_node;

typedef struct {
    char *key;               /* the key's text (keys must be scalars) */
    int line, col;           /* where the key was written */
    yaml_tree_node *value;
} yaml_tree_pair;

struct yaml_tree_node {
    yaml_tree_kind kind;
    int line, col;           /* 1-based start of the node */
    char *text;              /* SCALAR: the value, NUL-terminated (may contain NULs: see len) */
    size_t len;              /* SCALAR: length of text */
    int quoted;              /* SCALAR: quoted, block or !!str: a string, never null/bool/number */
    int n_items;             /* SEQ */
    yaml_tree_node **items;
    int n_pairs;             /* MAP, in document order */
    yaml_tree_pair *pairs;
};

typedef struct {
    char *name;              /* the file name used in messages */
    yaml_tree_node *root;    /* NULL for an empty document */
} yaml_tree;

/* Parses `len` bytes of YAML text.  `name` is used as FILE in messages; syntax errors
 * read "NAME:LINE:COL: YAML syntax error: PROBLEM".  Returns 0 or HERR_CONFIG/HERR_NOMEM. */
int yaml_tree_parse(yaml_tree **out, const char *name, const char *text, size_t len,
                    hearth_err *err);
/* Reads (shape/file_read.h: a regular file of at most FILE_READ_MAX_TEXT) and parses a
 * file; HERR_IO when it cannot be read; `path` names it in messages. */
int yaml_tree_load(yaml_tree **out, const char *path, hearth_err *err);
void yaml_tree_free(yaml_tree *t);

/* The value of `key` in a mapping, or NULL (also when `map` is not a mapping). */
const yaml_tree_node *yaml_tree_get(const yaml_tree_node *map, const char *key);
const yaml_tree_pair *yaml_tree_get_pair(const yaml_tree_node *map, const char *key);

/* Scalar interpretation (see above).  Each returns 1 when the node is of that kind and
 * stores the value, else 0.  yaml_tree_as_int returns -1 for an integer that does not
 * fit in int64_t; yaml_tree_as_double returns -1 for a number that overflows a double. */
int yaml_tree_is_null(const yaml_tree_node *n);
int yaml_tree_as_bool(const yaml_tree_node *n, int *out);
int yaml_tree_as_int(const yaml_tree_node *n, int64_t *out);
int yaml_tree_as_double(const yaml_tree_node *n, double *out);

/* How a node reads in a message: "ten" (quoted, shortened to ~40 characters), the
 * string "5" (for a quoted scalar), nothing (null), a list, a mapping. */
void yaml_tree_describe(const yaml_tree_node *n, char *buf, size_t size);

#endif
