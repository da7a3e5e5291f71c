/* spec.h - the experiment spec (DESIGN.md "Experiment spec"): reading and checking it.
 *
 *     name: lr-sweep                 # required; [A-Za-z0-9._-], starts with a letter or digit
 *     trainer: build/bin/hearth-train    # optional
 *     base: {model: tiny-vlm, device: cpu, train: {steps: 20}}    # a run config mapping
 *     resources: {nodes: 1, gpus_per_node: 8, time: "01:00:00", setup: [...], sbatch: [...]}
 *                                # + retry_timeout: true (a timeout is retried too; not
 *                                #   sweepable, like setup and sbatch)
 *                                # + pack: N (slurm: up to N runs of one shape one after
 *                                #   another in one job, time limit N x time; not sweepable)
 *     matrix:                        # cartesian product, spec order, last key fastest
 *       train.lr: [1e-3, 3e-4]
 *       resources.nodes: [1, 2]
 *       model.decoder.mrope_section: [[16, 24, 24], [8, 28, 28]]   # list-valued key
 *     zip:                           # each group advances its lists together
 *       - {parallel.tp: [1, 2], parallel.pp: [2, 1]}
 *     include: [{train.lr: 1e-2, train.seed: 7}]   # extra points
 *     exclude: [{train.lr: 3e-4, resources.nodes: 2}]   # drop points matching all keys
 *     where: "parallel.tp * parallel.pp <= 8"      # expression (expr.h)
 *     repeat: 3
 *     max_points: 200000             # candidates allowed before where/exclude (default
 *                                    #   SPEC_MAX_POINTS_DEFAULT; expand.h refuses more)
 *     retries: 1
 *     after: {experiment: warmup, on: ok}
 *     auto: {fp8: {threshold: 1.1, max_err: 0.05}}   # what `fp8: auto` asks (select.md)
 *
 * Every dotted key (matrix, zip, include, exclude, where) must be a run-config key
 * (trainer/shape/fields.h tables: "train.lr", "model" / "model.preset", "model.decoder.heads",
 * ...) or a scalar resources key ("resources.nodes").  Every swept value is type-checked
 * against its key when the spec is read, so a bad value is reported at its own line.
 *
 * Errors read "FILE:LINE:COL: KEY: what is wrong" (DESIGN.md "Errors"), e.g.
 *     sweep.yaml:4:3: matrx: unknown key (did you mean 'matrix'?)
 *     sweep.yaml:9:7: zip[0]: parallel.pp has 3 values but parallel.tp has 2
 *     sweep.yaml:12:22: where: expected ')' to close '(' at column 1, got end of expression
 *
 * Command-line overrides (`hearth plan|submit SPEC --set KEY=VALUE`, spec_load_set) are
 * applied to the file's YAML tree before it is read, so that an override is checked by the
 * same code as the line it replaces.  KEY is a top-level key (`name`, `repeat`, `where`,
 * ...), `base.KEY` or a bare run-config key (`train.lr`: a base key), `resources.KEY`,
 * `matrix.KEY` or `after.KEY`; VALUE is YAML (a scalar or a flow list / mapping).  The
 * last override of a key wins.  An error in an override names the argument instead of a
 * line: "--set matrix.train.lr: expected a non-empty list of values in matrix, got 1e-3".
 * Nodes an override wrote carry line -(i+1) for the i-th --set (col 0): spec_node_src and
 * spec_position_format turn that back into "--set KEY".
 *
 * Ownership: spec_load/spec_parse allocate a spec; spec_free releases it, with the YAML
 * tree that every node pointer and string below points into. */
#ifndef HEARTH_SPEC_H
#define HEARTH_SPEC_H

#include <stdint.h>

#include "expr.h"
#include "shape/err.h"
#include "shape/fields.h"
#include "shape/yaml_tree.h"

/* One value of a swept key: a scalar, or a list for list-valued keys. */
typedef struct {
    const yaml_tree_node *node;   /* in the spec's tree */
    const char *text;             /* scalar text, or flow text "[16, 24, 24]" for a list */
    expr_value typed;             /* as expressions see it (spec_value_typed with its key) */
} spec_value;

/* A key with its values: one matrix axis, one member of a zip group. */
typedef struct {
    const char *key;              /* dotted key as written ("model" stays "model") */
    int line, col;                /* of the key */
    int n_values;
    spec_value *values;
} spec_axis;

typedef struct {
    int line, col;                /* of the group's mapping */
    int n_axes;
    spec_axis *axes;              /* every axis has the same n_values */
} spec_zip;

/* One include or exclude entry: dotted key = one value each. */
typedef struct {
    const char *key;
    int line, col;
    spec_value value;
} spec_setting;

typedef struct {
    int line, col;
    int n;
    spec_setting *settings;
} spec_entry;

/* Resources; 0 / NULL where not given (plan applies the defaults: nodes 1, gpus_per_node 1,
 * cpus_per_task 1, max_concurrent unlimited). */
typedef struct {
    int64_t nodes, gpus_per_node, cpus_per_task, max_concurrent;
    const char *time, *partition, *account, *qos, *constraint;
    int n_setup;
    const char **setup;
    int n_sbatch;
    const char **sbatch;
    int retry_timeout;                /* resources.retry_timeout: a TIMEOUT is retried too */
    int64_t pack;                     /* resources.pack (slurm): up to this many runs of one
                                         shape run one after another in one job; 0/1: off */
    double gpu_mem;                   /* resources.gpu_mem: GiB per GPU; device cuda points
                                         whose predicted peak exceeds it are pruned (rule
                                         fits_gpu_mem); 0: no limit */
} spec_resources;

typedef enum { SPEC_AFTER_OK = 0, SPEC_AFTER_ANY = 1 } spec_after_on;

/* Keys whose value may be `auto`, resolved by plan's resolve_auto hook from the results
 * database (docs/select.md): the spec value keeps the text "auto", the YAML node reads as
 * the key's default (uniform, off) for the shape module. */
#define SPEC_AUTO_ENCODER 1u     /* parallel.encoder.strategy (with encoder tp and offload) */
#define SPEC_AUTO_FP8 2u         /* precision.fp8 (with precision.fp8_policy) */

/* The most candidate points (matrix x zip product plus include entries, before exclude and
 * where) a spec may expand to unless it raises `max_points`: enough for any sweep that can
 * run, small enough that a mistyped matrix is refused at once instead of planned for
 * minutes until memory runs out (or, with a `where` that keeps nothing, forever). */
#define SPEC_MAX_POINTS_DEFAULT 100000

typedef struct spec {
    yaml_tree *tree;
    const char *file;                 /* name used in messages */
    const char *name;
    const char *trainer;              /* NULL: the built hearth-train */
    const yaml_tree_node *base;       /* the base run config mapping; NULL when absent */
    spec_resources resources;
    int n_matrix;
    spec_axis *matrix;
    int n_zip;
    spec_zip *zip;
    int n_include;
    spec_entry *include;
    int n_exclude;
    spec_entry *exclude;
    const char *where_src;            /* NULL when absent */
    expr_node *where;
    int where_line, where_col;        /* of the expression's first character in the file */
    int repeat;                       /* >= 1, default 1 */
    int64_t max_points;               /* >= 1, default SPEC_MAX_POINTS_DEFAULT */
    int retries;                      /* >= 0, default 0 */
    const char *after_experiment;     /* NULL when absent */
    spec_after_on after_on;
    int after_line, after_col;
    double fp8_threshold;             /* auto.fp8.threshold: the speedup fp8: auto asks of a
                                         layer kind; 0 = the default (docs/select.md) */
    double fp8_max_err;               /* auto.fp8.max_err: its largest FP8 error; < 0 =
                                         the default */
    unsigned base_auto;               /* SPEC_AUTO_* bits that `base` sets to auto */
    unsigned any_auto;                /* ... that base or any swept value sets to auto */
    int n_sets;                       /* --set overrides applied (spec_load_set) */
    const char **set_keys;            /* the KEY of each, as written */
    const char *text;                 /* the spec as YAML: the file's own text, or with
                                         overrides the tree written out (what the
                                         experiment records; planning it again gives
                                         the same points) */
    /* private */
    yaml_tree **set_trees;            /* each override's value tree (after grafting: the
                                         node it replaced, or nothing) */
    char **owned;                     /* strings the spec allocated (flow texts, where) */
    int n_owned, cap_owned;
} spec;

/* Reads and checks a spec file (HERR_IO when unreadable, HERR_CONFIG on any error). */
int spec_load(spec **out, const char *path, hearth_err *err);
/* Same, from text in memory; `file` names it in messages. */
int spec_parse(spec **out, const char *file, const char *text, size_t len, hearth_err *err);
void spec_free(spec *s);
/* Same as spec_load / spec_parse, with `n_sets` overrides "KEY=VALUE" applied in order
 * (see the top of this file); `sets` may be NULL when n_sets is 0. */
int spec_load_set(spec **out, const char *path, const char *const *sets, int n_sets,
                  hearth_err *err);
int spec_parse_set(spec **out, const char *file, const char *text, size_t len,
                   const char *const *sets, int n_sets, hearth_err *err);

/* Where a position of the spec came from, for messages: "FILE:LINE:COL", "FILE" (line 0)
 * or "--set KEY" (line < 0: written by an override). */
void spec_position_format(const spec *s, int line, int col, char *buf, size_t size);
/* The field_src of a value node of `key` (shape/fields.h), so that the shape module's
 * messages name the file and line, or the --set argument that wrote the node. */
void spec_node_src(const spec *s, const yaml_tree_node *n, const char *key, field_src *src);

/* Whether `key` is a known dotted key of a point: a run-config key (leaf, model keys under
 * "model.") or a scalar resources key.  Also fills a "did you mean" hint when not. */
int spec_key_known(const char *key, char *hint, size_t hint_size);
/* Offers every dotted key of a point (run-config, model and scalar resources keys) to a
 * "did you mean" suggestion (shape/fields.h). */
void spec_key_suggest(field_suggestion *sg, const char *key);
/* The type a known key's value has in expressions: number, bool or string (enums, strings,
 * presets and lists, as their text); EXPR_V_NULL for an unknown key. */
expr_vtype spec_key_type(const char *key);
/* How the expression language sees a value: typed as `key`'s type (spec_key_type) when
 * key is given and known, so that `1` of a string key is the string "1" as the config will
 * hold it; else by the YAML core schema (null, bool, number, string).  Lists are their
 * flow text; `auto` stays a string.  out->str points at `text`. */
void spec_value_typed(const yaml_tree_node *n, const char *text, const char *key,
                      expr_value *out);
/* Whether `key` is a resources key (with the "resources." prefix). */
int spec_key_is_resource(const char *key);

/* Seconds of a Slurm time limit ("MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM",
 * "D-HH:MM:SS"); -1 when the text is not one or is zero.  `seconds` may be NULL. */
int spec_time_seconds(const char *text, int64_t *seconds);

/* The keys a spec knows, NULL-terminated, for its generated manual page hearth-spec(5):
 * top-level keys, then resources keys by kind (swept integers, swept strings, lists,
 * booleans, spec-only integers, spec-only numbers).  NULL for another group. */
typedef enum { SPEC_KEYS_TOP = 0, SPEC_KEYS_RES_INT, SPEC_KEYS_RES_STR, SPEC_KEYS_RES_LIST,
               SPEC_KEYS_RES_BOOL, SPEC_KEYS_RES_SPEC_INT, SPEC_KEYS_RES_SPEC_NUM } spec_key_group;
const char *const *spec_keys(spec_key_group g);

/* Maps a 1-based column inside the `where` expression to a FILE line and column. */
void spec_where_position(const spec *s, int expr_col, int *line, int *col);

#endif
