/* run_config_override.h - one base run config, resolved many times with different
 * overrides.  The orchestrator's `plan` resolves every point of a sweep (up to millions)
 * this way: the base is read once; an override is checked and converted once, when it is
 * made, so that applying it is a copy of a few bytes; only points that change the model
 * (a preset, a `model.*` key or train.recompute) go through the preset again, and presets
 * are read once per name.
 *
 * The result equals what run_config_parse() gives for the same base text followed by the
 * same overrides (tests/unit/test_orch_plan.c checks this on random points), except that
 * the layout rules are not checked here: call run_config_check_rules() on the result, so
 * that a sweep can report the points that break a rule instead of stopping at the first.
 *
 * Part of the pure shape module (no I/O beyond reading presets). */
#ifndef HEARTH_RUN_CONFIG_OVERRIDE_H
#define HEARTH_RUN_CONFIG_OVERRIDE_H

#include <stddef.h>

#include "shape/err.h"
#include "shape/fields.h"
#include "shape/run_config.h"
#include "shape/yaml_tree.h"

#define RUN_CONFIG_PATCH_BYTES 320

typedef enum {
    RCK_PRESET = 0,   /* "model" / "model.preset" */
    RCK_CONFIG = 1,   /* a row of config_fields() */
    RCK_MODEL = 2,    /* "model." + a row of model_fields() */
} run_config_key_kind;

/* A run-config key resolved to its table row (for repeated reads and writes). */
typedef struct {
    run_config_key_kind kind;
    int row;                  /* RCK_CONFIG / RCK_MODEL */
    const field_desc *f;      /* the row, NULL for RCK_PRESET */
} run_config_key;

/* Finds a dotted key ("train.lr", "model", "model.preset", "model.decoder.heads");
 * returns 0, or -1 when it is not a value key of a run config. */
int run_config_key_find(const char *key, run_config_key *out);

/* A value read back from a resolved config. */
typedef enum { RCV_NULL = 0, RCV_NUM, RCV_BOOL, RCV_STR } run_config_value_type;
typedef struct {
    run_config_value_type type;
    double num;
    int boolean;
    const char *str;          /* enum name (static), string (points into the config) or buf */
    char buf[RUN_CONFIG_PATCH_BYTES];   /* lists as flow text: "[16, 24, 24]" */
} run_config_value;

/* Reads a key of a resolved config.  Keys of a model part the preset lacks (an encoder
 * key of a text-only model) read as null. */
void run_config_key_read(const run_config *c, const run_config_key *k, run_config_value *out);

/* One prepared override. */
typedef struct {
    run_config_key key;
    int is_auto;                      /* the value was `auto` (FIELD_AUTO rows) */
    const yaml_tree_node *value;      /* borrowed: must outlive the patch */
    field_src src;                    /* where it was written, for messages */
    /* RCK_CONFIG: the converted bytes */
    size_t off, len;
    unsigned char bytes[RUN_CONFIG_PATCH_BYTES];
    int has_count;                    /* FT_INTLIST: the count at count_off */
    size_t count_off;
    int count;
    /* RCK_PRESET */
    char preset[256];
} run_config_patch;

/* Checks `value` against `key` and converts it.  Errors read "SRC: ..." like the run
 * config's own ("FILE:LINE:COL: parallel.tp: expected an integer, got ..."). */
int run_config_patch_make(run_config_patch *p, const char *key, const yaml_tree_node *value,
                          const field_src *src, hearth_err *err);

typedef struct run_config_base run_config_base;

/* Reads a run-config mapping (`root` may be NULL: an empty base; a spec's `base:`), with
 * FILE:LINE:COL errors.  The nodes are borrowed: the tree must outlive the base.  The
 * base need not name a model when every point does.  Rules are not checked. */
int run_config_base_create(run_config_base **out, const char *file, const yaml_tree_node *root,
                           hearth_err *err);
void run_config_base_free(run_config_base *b);

/* The base's preset name or path, or NULL when the base names none. */
const char *run_config_base_preset(const run_config_base *b);

/* Reads preset `name` into the base's cache now (so that a missing preset is reported once,
 * where the caller knows the place); resolving also does this on demand. */
int run_config_base_preload(run_config_base *b, const char *name, hearth_err *err);

/* Resolves base + patches (in order: a later patch of a key wins) into *out: defaults,
 * `auto` values, the preset with its model overrides, the shape checks.  When
 * cuda_ranks > 0 and the device is cuda, ranks is set to it (nodes x gpus_per_node).
 * Fails with HERR_CONFIG when the shape is inconsistent or no model is named; the layout
 * rules are left to run_config_check_rules(). */
int run_config_base_resolve(run_config_base *b, const run_config_patch *const *p, int n,
                            int cuda_ranks, run_config *out, hearth_err *err);

#endif
