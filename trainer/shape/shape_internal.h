/* shape_internal.h - pieces shared by the files of the shape module (not a public API).
 *
 * A preset is read into a preset_state: the model_shape plus, per key, whether and where
 * it was set.  The run config applies its `model.*` overrides to the same state before
 * preset_finish() fills defaults, derives `auto` values and checks the shape, so that an
 * error points at the line that caused it (the run config's override when there is one,
 * else the preset's line). */
#ifndef HEARTH_SHAPE_INTERNAL_H
#define HEARTH_SHAPE_INTERNAL_H

#include "shape/fields.h"
#include "shape/model_shape.h"
#include "shape/run_config.h"

typedef struct {
    model_shape m;
    field_state st;
    char file[4096];                  /* the preset file that was read */
    char given[256];                  /* the name or path as given */
    int has_encoder, has_projector;   /* the preset has these sections */
    unsigned char from_run[FIELDS_MAX]; /* row last set by a run config or --set */
} preset_state;

/* Finds the preset file for a name or path.  Returns 0, or HERR_CONFIG with
 * 'preset "NAME" not found (searched: DIR, DIR, ...)' (no location: the caller adds the
 * place where the name was written). */
int preset_locate(const char *name_or_path, char *path, size_t size, hearth_err *err);
/* Locates and parses a preset into ps (no defaults yet).  ps is initialised here. */
int preset_read(preset_state *ps, const char *name_or_path, hearth_err *err);
/* Fills defaults, derives auto values (recompute from `recompute_default`), sets the
 * present flags and checks the shape; errors name the place of the offending key. */
int preset_finish(preset_state *ps, int recompute_default, hearth_err *err);

/* One failed shape check: the key it is about and others that take part in it. */
typedef struct {
    char key[64];
    char others[3][64];
    char msg[512];
} shape_issue;

/* 0 when the shape is consistent, else 1 with *iss filled. */
int shape_check(const model_shape *m, shape_issue *iss);

/* One failed layout rule of a run config: its name, the dotted keys that take part
 * (run-config names: "parallel.tp", "model.decoder.heads"), most likely culprit first. */
typedef struct {
    const char *name;
    char keys[5][64];
    char msg[512];
} rule_issue;

/* 0 when every rule holds, else 1 with *iss filled (the first rule that fails). */
int run_rules_check(const run_config *c, rule_issue *iss);

/* Derives the run-config values left `auto` (is_auto is indexed by config_fields() rows):
 * comm, parallel.dp, parallel.encoder.tp, train.global_batch, train.min_lr.  The one
 * place these rules live (docs/config.md lists them); every resolver calls it. */
void run_config_derive(run_config *c, const unsigned char *is_auto);

/* Which keys a run config has (a `model` mapping is a section, `model: NAME` is
 * model.preset), with "did you mean" hints: shared by the config reader and the
 * orchestrator's base-config reader so both accept exactly the same keys. */
extern const field_walker run_config_walker;

/* Shortest decimal text that reads back as exactly the same double / float
 * (at most 17 / 9 significant digits).  buf needs 32 bytes. */
void shape_format_double(double v, char *buf, size_t size);
void shape_format_float(float v, char *buf, size_t size);

#endif
