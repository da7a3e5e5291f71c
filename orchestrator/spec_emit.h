/* spec_emit.h - writes a YAML tree (shape/yaml_tree.h) back out as YAML text: how an
 * experiment records a spec whose --set overrides were applied to its tree (spec.h).
 *
 * Reading the text back gives the same tree up to positions and comments: quoted scalars
 * stay strings (double-quoted), plain ones are written plain where YAML allows it, so
 * `1e-3` stays a number and `auto` a word; mappings are block style, lists of scalars flow
 * style ([1e-3, 3e-3]).  `header` (may be NULL) is written first as comment lines.
 *
 * Ownership: *out gets a malloc'd NUL-terminated string the caller frees.  Returns 0, or
 * HERR_NOMEM / HERR_RUNTIME (libyaml's emitter refused) with *out NULL. */
#ifndef HEARTH_SPEC_EMIT_H
#define HEARTH_SPEC_EMIT_H

#include "shape/err.h"
#include "shape/yaml_tree.h"

int spec_emit(const yaml_tree_node *root, const char *header, char **out, hearth_err *err);

#endif
