/* ptrain_local.h - a whole parallel layout in one process: cfg->ranks ranks as threads on
 * the local communicator, driven step by step from the calling thread (which is rank 0).
 *
 * This is how hearth-train runs `comm: local`, and how tests compare a layout with the
 * single-rank run.  Worker threads live from create to free; each step, gather and the
 * final shutdown are commands every rank executes in lockstep.
 *
 * Ownership: ptrain_local_create copies the config; ptrain_local_free joins the threads
 * and frees everything.  Not thread-safe: one caller drives it. */
#ifndef HEARTH_PTRAIN_LOCAL_H
#define HEARTH_PTRAIN_LOCAL_H

#include "model/model.h"
#include "shape/err.h"
#include "shape/run_config.h"
#include "train.h"

typedef struct ptrain_local ptrain_local;

/* timeout_ms: a rank waiting longer than this in one collective gives up (comm.h); 0 =
 * wait forever.  On error no thread is left running. */
int ptrain_local_create(ptrain_local **out, const run_config *cfg, int timeout_ms,
                        hearth_err *err);
void ptrain_local_free(ptrain_local *p);

/* One step on every rank; st gets rank 0's statistics.  The first error of any rank is
 * returned (its message prefixed with the rank). */
int ptrain_local_step(ptrain_local *p, train_step_stats *st, hearth_err *err);

/* Gathers the full parameters into `full` (see ptrain_gather). */
int ptrain_local_gather(ptrain_local *p, model *full, hearth_err *err);

/* Sets every rank's parameters to its shard of `full`'s (see ptrain_scatter). */
int ptrain_local_scatter(ptrain_local *p, const model *full, hearth_err *err);

/* Checkpoints: every rank writes (reads) its state file in dir (ptrain_save and
 * ptrain_load, each rank on its own thread). */
int ptrain_local_save(ptrain_local *p, const char *dir, hearth_err *err);
int ptrain_local_load(ptrain_local *p, const char *dir, int step, hearth_err *err);
int ptrain_local_ranks(const ptrain_local *p);

/* Rank 0's first model chunk. */
model *ptrain_local_model(ptrain_local *p);

#endif
