/* expand.h - streamed expansion of a spec's matrix into points.
 *
 * Candidates come in this order: the cartesian product of the matrix axes (spec order,
 * the last key changing fastest) times the zip groups (each group is one more axis whose
 * lists advance together; groups come after the matrix axes), then the include entries in
 * order.  With neither matrix nor zip, the product is one empty point (the base alone),
 * unless there are include entries: then the points are just those.
 * Every candidate, include entries too, is then dropped when it matches an exclude entry
 * (all of the entry's keys equal) or when `where` is false.
 *
 * Memory is O(number of swept keys), whatever the number of points: a point borrows its
 * keys and values from the spec and is overwritten by the next call.
 *
 * Key lookup (for where and exclude): a key the point sets gives the point's value; other
 * keys go to the caller's fallback (plan answers with the resolved run config: defaults,
 * `auto` values, the preset), else to the spec itself: resources keys from `resources`,
 * run-config keys from the `base` mapping as written.  A key that none of them knows is
 * an error for `where` and "no match" for exclude.
 *
 * `repeat` is not expanded here: plan/submit make N runs of one point.
 *
 * Size: the candidates are counted first, from the list lengths alone (expand_candidates),
 * and a spec with more than its `max_points` (default SPEC_MAX_POINTS_DEFAULT) is refused
 * by expand_create before any candidate is made: where and exclude drop points only after
 * they are made, so a huge product would take minutes (or, when where keeps nothing,
 * forever) before they had any effect. */
#ifndef HEARTH_EXPAND_H
#define HEARTH_EXPAND_H

#include <stdint.h>

#include "expr.h"
#include "spec.h"

typedef struct {
    const char *key;            /* canonical dotted key (spec.h) */
    const spec_value *value;    /* borrowed from the spec */
} expand_kv;

typedef struct {
    uint64_t seq;               /* 0-based among the points returned so far */
    uint64_t candidate;         /* 0-based among all candidates, filtered ones included */
    int include;                /* include entry index + 1, or 0 for a product point */
    int n;
    const expand_kv *kv;        /* valid until the next expand_next / expand_free */
} expand_point;

/* The caller's answer for a key the point does not set: as expr_lookup_fn, plus the point. */
typedef int (*expand_lookup_fn)(void *ctx, const expand_point *pt, const char *key,
                                expr_value *out, hearth_err *err);

typedef struct expand_iter expand_iter;

/* `fallback` may be NULL.  HERR_CONFIG when the spec has more candidates than its
 * max_points ("FILE: matrix: N candidate points (A x B x ...), more than max_points M: ...",
 * saying how to raise it); else fails only for memory. */
int expand_create(expand_iter **out, const spec *s, expand_lookup_fn fallback, void *ctx,
                  hearth_err *err);
void expand_free(expand_iter *it);

/* Fills *pt with the next point: returns 1, or 0 at the end, or a negative herr_code
 * (an error evaluating `where`, reported at the spec's FILE:LINE:COL). */
int expand_next(expand_iter *it, expand_point *pt, hearth_err *err);

/* Candidates before filtering (product + includes), counted without making them;
 * UINT64_MAX when there are that many or more (the count saturates, it never wraps). */
uint64_t expand_candidates(const spec *s);

typedef struct {
    uint64_t candidates;        /* seen so far */
    uint64_t excluded;          /* dropped by exclude */
    uint64_t filtered;          /* dropped by where */
    uint64_t points;            /* returned */
} expand_stats;
void expand_get_stats(const expand_iter *it, expand_stats *st);

/* The value a point gives `key` (canonical), or NULL. */
const spec_value *expand_point_get(const expand_point *pt, const char *key);

/* How the language sees a spec value: null, bool, number (YAML core schema, as the shape
 * module reads it), string; lists as their flow text. */
void expand_value_typed(const spec_value *v, expr_value *out);
/* The same for a value of `key`: typed as the key's type (spec_key_type), so that `1` of a
 * string key is the string "1", as the config will hold it; `auto` stays a string. */
void expand_value_as(const spec_value *v, const char *key, expr_value *out);

#endif
