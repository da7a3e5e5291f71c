/* spec_set.h - applies `--set KEY=VALUE` overrides to an experiment spec's YAML tree
 * (spec.h, "Command-line overrides"), before the spec is read.
 *
 * Each VALUE is parsed as YAML into a tree of its own whose nodes are marked with line
 * -(i+1), col 0 (the i-th override), then grafted where KEY points:
 *   name, repeat, where, base, ... (a top-level key)  -> that key's value, replaced whole
 *   base.KEY, or a bare run-config key KEY            -> the base key, found where the
 *                                                        file wrote it (nested `train:
 *                                                        {lr: ...}` or dotted), else added
 *                                                        to base as a dotted key
 *   resources.KEY, matrix.KEY, after.KEY              -> that entry of the mapping
 * Whether the key below base/resources/matrix/after exists and whether the value fits it
 * is left to the spec reader, which reports it with the same words as in a file.
 *
 * Ownership: the spec tree takes the grafted node; the node it replaced (or nothing) is
 * left in value_trees[i], which the caller frees with yaml_tree_free, as it frees keys[i]
 * (the KEY part, malloc'd).  On failure the arrays hold what was made so far. */
#ifndef HEARTH_SPEC_SET_H
#define HEARTH_SPEC_SET_H

#include "shape/err.h"
#include "shape/yaml_tree.h"

/* Errors: HERR_CONFIG "--set KEY: what" (no '=', a YAML syntax error in VALUE, an unknown
 * KEY with a did-you-mean, a key below a value that is not a mapping), HERR_NOMEM. */
int spec_set_apply(yaml_tree *tree, const char *file, const char *const *sets, int n_sets,
                   yaml_tree **value_trees, char **keys, hearth_err *err);

#endif
