/* check_db.h - the points that `hearth check` compares, read from the results database.
 *
 * A point is one config hash: the `repeat` runs of a spec's point share it, and so does
 * the same point run again in another experiment (the hash covers every key of the
 * resolved config, so equal hashes are like-for-like measurements and a point whose
 * config changed in any key is a new point).  For each point, the completed runs with a
 * result are summarised per figure (check.h: median, min, max).
 *
 * Errors: HERR_CONFIG "no experiment named 'X'"; database failures HERR_RUNTIME;
 * HERR_NOMEM.
 *
 * Ownership: a check_set and every string of its points belong to it; check_set_free
 * releases them (also after a failed load, and on a zeroed set). */
#ifndef HEARTH_CHECK_DB_H
#define HEARTH_CHECK_DB_H

#include <stddef.h>

#include "check.h"
#include "db.h"
#include "stats.h"

typedef struct {
    char *hash;               /* config hash */
    char *label;              /* the experiment's varying config keys, "k=v k=v" (or a
                                 hash prefix); NULL for baseline points */
    char *source;             /* where the figures come from: an experiment's name,
                                 "reference"; NULL when none */
    char *first_created;      /* the created_at of the point's first run in its experiment */
    size_t n_runs;            /* completed runs with a result (0: none completed) */
    stats_summary fig[CHECK_N_FIGURES];
    check_tols tols;          /* a reference point's own tolerances (else all unset) */
} check_point;

typedef struct {
    check_point *v;
    size_t n, cap;
} check_set;

void check_set_free(check_set *s);
/* The point of hash `hash` in s, or NULL. */
check_point *check_set_find(check_set *s, const char *hash);
/* Appends a zeroed point (stats NaN, tolerances unset); NULL when out of memory. */
check_point *check_set_add(check_set *s);

/* Every point of experiment `experiment`, in the order of its first run, with points
 * whose runs have not (or not yet) completed included with n_runs 0.  `labels`: also
 * compute each point's label. */
int check_db_experiment(hearth_db *db, const char *experiment, int labels, check_set *out,
                        hearth_err *err);

/* The history baseline of `p` (a point of experiment `experiment`): among the completed
 * runs of the same config hash in other experiments, created before p's first run, the
 * runs of the experiment whose median tokens/s is best (ties and points without
 * throughput: the newest experiment).  *out is filled (source = that experiment) and 1
 * returned, or 0 when there is no such run. */
int check_db_history(hearth_db *db, const char *experiment, const check_point *p,
                     check_point *out, hearth_err *err);

#endif
