/* report_data.h - what `hearth report EXP` draws, read from the results database: the
 * experiment's completed runs grouped by config (repeats of one point share a config hash),
 * the spread of their throughput, whether nodes, devices or ranks vary (a scaling plot) and
 * which configs differ only in their layout (a family, for the ideal-scaling line), the
 * per-step loss of chosen runs, and the selection decisions recorded for the experiment.
 *
 * Errors (HERR_CONFIG, naming what is missing): no experiment of that name; no completed
 * run with a result; a run named in `runs` that does not exist or is not the
 * experiment's, or has no per-step metrics; none of the default best runs with metrics.
 * Database failures are HERR_RUNTIME.
 *
 * Ownership: report_data_load fills a caller's report_data whose every array and string
 * it allocates; report_data_free releases them (also after a failed load). */
#ifndef HEARTH_REPORT_DATA_H
#define HEARTH_REPORT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "db.h"

/* One config (point) of the experiment: its completed runs' tokens/s. */
typedef struct {
    char *hash;
    char *label;             /* the varying config keys as "key=value ..." (or a hash prefix) */
    size_t n_runs;           /* completed runs with a result */
    size_t n_tps;            /* of which with a finite tokens_per_s */
    double tps_min, tps_median, tps_max;   /* NaN when n_tps is 0 */
    int64_t nodes, devices;  /* of its first run's result; 0 when not recorded */
    int64_t ranks;           /* its config's `ranks` (a CPU run's ranks share one device) */
    size_t family;           /* the first config with the same settings but for the layout
                              * (REPORT_LAYOUT_KEYS): what a scaling line connects */
} report_config;

/* The config keys that make a layout (DESIGN.md's "layout" and the rank count): configs
 * that differ only in these are one family of a scaling plot. */
#define REPORT_LAYOUT_KEYS \
    "'ranks', 'parallel.tp', 'parallel.cp', 'parallel.pp', 'parallel.vpp', 'parallel.dp', " \
    "'parallel.ep', 'parallel.sp', 'parallel.encoder.strategy', 'parallel.encoder.tp'"

/* No config (report_data_ideal_base). */
#define REPORT_NONE ((size_t)-1)

/* The loss per step of one run (steps without a loss are left out). */
typedef struct {
    char *run_id;
    char *label;             /* its config's label */
    size_t config;           /* its config's index in report_data's configs */
    size_t n;
    double *step, *loss;
} report_curve;

typedef struct {
    char *kind, *decision, *method, *evidence, *subject, *created_at;
} report_decision;

typedef enum {
    REPORT_SCALE_NONE = 0, REPORT_SCALE_NODES, REPORT_SCALE_DEVICES, REPORT_SCALE_RANKS
} report_scale;

typedef struct {
    char *experiment;
    size_t n_runs;           /* completed runs with a result */
    report_config *configs;  /* in the order of their first run */
    size_t n_configs;
    report_scale scale;      /* what varies among the configs, if anything */
    report_curve *curves;
    size_t n_curves;
    report_decision *decisions;
    size_t n_decisions;
} report_data;

/* Reads experiment `experiment`.  `runs` is a comma-separated list of run ids whose loss
 * curves to draw, or NULL: the `best` completed runs by tokens/s (best >= 1). */
int report_data_load(hearth_db *db, const char *experiment, const char *runs, long best,
                     report_data *out, hearth_err *err);
void report_data_free(report_data *d);

/* A config's label: "key=value key=value" of run `run` (runs.id) for `keys` (the
 * experiment's varying keys, query_varying_keys), or the first 12 digits of `hash` when
 * there are none.  *out is malloc'd; the caller frees it. */
int report_data_label(hearth_db *db, int64_t run, const char *hash, char *const *keys,
                      int n_keys, char **out, hearth_err *err);

/* Config c's size along scale s (nodes, devices or ranks); 0 when not recorded. */
int64_t report_data_scale_value(const report_config *c, report_scale s);

/* The config that config i's ideal-scaling line starts from: among the configs of i's
 * family with a known size (d->scale) and a finite median tokens/s, the one of the
 * smallest size (of two there, the faster).  REPORT_NONE when there is none or when the
 * family has only that one size (no line to draw). */
size_t report_data_ideal_base(const report_data *d, size_t i);

#endif
