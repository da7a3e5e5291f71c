/* ckpt.h - training checkpoints of hearth-train: writing them into the run directory,
 * finding and validating one to resume from (docs/checkpoints.md has the format).
 *
 *   RUN_DIR/checkpoints/step-00000040/manifest.json
 *                                    /rank-00000.safetensors ... (one per rank)
 *   RUN_DIR/checkpoints/latest        "step-00000040\n": the newest complete checkpoint
 *
 * Writing (ckpt_write) is ordered so that a crash at any point leaves the previous
 * checkpoint usable: the rank files go into step-X.tmp (each written to a temp name,
 * fsynced, renamed), then manifest.json (sizes and sha256 of the rank files) the same
 * way, then the directory is renamed to step-X, then `latest` is replaced by rename, and
 * only then are older checkpoints beyond the newest `keep` deleted.  Readers never look
 * at *.tmp directories.
 *
 * Resuming (ckpt_read) checks the manifest (format and version, the config, ranks and
 * layout, every file's size and sha256) before loading the state; each error names the
 * file and what is wrong.  The config must be the saving run's resolved config except
 * for the keys that do not change the computation (CKPT_FREE_KEYS).  train.steps is not
 * among them: the learning-rate schedule depends on it.
 *
 * Not thread-safe per run directory: one writer at a time (the trainer). */
#ifndef HEARTH_CKPT_H
#define HEARTH_CKPT_H

#include <stddef.h>

#include "shape/err.h"
#include "shape/run_config.h"
#include "summary.h"
#include "train.h"

#define CKPT_FORMAT "hearth-train-checkpoint"
#define CKPT_VERSION 1
#define CKPT_KEEP 2
/* Keys that may differ between the saving and the resuming config. */
#define CKPT_FREE_KEYS "train.checkpoint_every, train.measure_from"

typedef struct {
    int keep;           /* complete checkpoints kept (0: CKPT_KEEP) */
    int stop_after;     /* tests: return after this stage as a crash would (0: never);
                           1 rank files, 2 manifest, 3 directory renamed */
} ckpt_write_opts;

/* The hash of cfg with the CKPT_FREE_KEYS set to fixed values: equal for two configs
 * that may resume each other's checkpoints. */
int ckpt_resume_hash(const run_config *cfg, char out_hex[65], hearth_err *err);

/* Writes the checkpoint of tr after its steps done (trainer_steps_done) into
 * run_dir/checkpoints/ (created if missing).  config_hash is the run's config hash; sum
 * holds the steps so far (kept in the manifest so that a resumed run's result.json
 * covers the whole run).  opts may be NULL.  out (may be NULL) gets the directory
 * written. */
int ckpt_write(const char *run_dir, trainer *tr, const run_config *cfg,
               const char *config_hash, const run_summary *sum, const ckpt_write_opts *opts,
               char *out, size_t out_n, hearth_err *err);

/* The checkpoint directory that `path` names: itself when it holds manifest.json, else
 * the one path/checkpoints/latest names.  HERR_CONFIG when it is neither. */
int ckpt_resolve(const char *path, char *out, size_t n, hearth_err *err);

/* The run config the checkpoint in dir was written with (its manifest's resolved config),
 * with the overrides applied on top: what --resume trains when no --config is given.
 * HERR_CONFIG for a manifest without a usable config or a bad override. */
int ckpt_read_config(const char *dir, const config_override *ovr, int n_ovr, run_config *out,
                     hearth_err *err);

/* Validates the checkpoint in dir against cfg and tr (created from cfg), loads it into
 * tr and appends its summary steps to sum (initialised, empty); *step = the step it
 * holds.  HERR_CONFIG for a checkpoint that does not fit (other config, layout, a bad
 * or missing file), HERR_IO when a file cannot be read.  On error tr must be freed. */
int ckpt_read(const char *dir, trainer *tr, const run_config *cfg, run_summary *sum,
              int *step, hearth_err *err);

/* Removes run_dir/checkpoints: `latest` first (so that it never names a removed
 * checkpoint), then every step-* directory, then the directory itself unless it holds
 * something else.  For a run that replaces an earlier one (hearth-train --force): its
 * checkpoints must not be resumed as the new run's.  A missing directory is fine. */
int ckpt_remove_all(const char *run_dir, hearth_err *err);

#endif
