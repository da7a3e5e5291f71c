/* runs_db.h - experiments and runs in the results database: what `plan`, `submit` and
 * `status` record and read.
 *
 * Every write is atomic (one transaction, nested inside the caller's when there is one: see
 * db_tx_begin), so a crash never leaves a run half-recorded.  Run ids are
 * "<experiment>-<n>" with n = 1, 2, ... per experiment (DESIGN.md, "Experiment spec").
 *
 * Lookups return 1 when found, 0 when not found, or a negative herr_code. */
#ifndef HEARTH_RUNS_DB_H
#define HEARTH_RUNS_DB_H

#include <stddef.h>
#include <stdint.h>

#include "db.h"
#include "run_state.h"

/* Creates the experiment or updates its spec (a resubmitted, changed spec adds points to
 * the same experiment).  spec_path / spec_text may be NULL (kept as they were).  *id (may
 * be NULL) receives experiments.id. */
int runs_db_experiment_upsert(hearth_db *db, const char *name, const char *spec_path,
                              const char *spec_text, int64_t *id, hearth_err *err);
int runs_db_experiment_find(hearth_db *db, const char *name, int64_t *id, hearth_err *err);

/* Calls fn with every experiment name (runs == 0) or every run id (runs == 1), sorted:
 * what shell completion offers. */
int runs_db_names(hearth_db *db, int runs, void (*fn)(void *ctx, const char *name), void *ctx,
                  hearth_err *err);

/* A new run, recorded as `pending`. */
typedef struct {
    const char *experiment;   /* name of an existing experiment */
    const char *config_json;  /* the resolved config's canonical JSON (an object) */
    const char *config_hash;  /* its sha256, 64 lowercase hex digits */
    const char *run_dir;      /* may be NULL (set later with runs_db_set_run_dir) */
} run_new;

/* Inserts the run and its flattened config (run_config_kv).  *run_id (may be NULL)
 * receives the new id, malloc'd: the caller frees it; *pk (may be NULL) runs.id.
 * A config that is not a JSON object or a malformed hash fail with HERR_CONFIG. */
int runs_db_insert(hearth_db *db, const run_new *r, char **run_id, int64_t *pk,
                   hearth_err *err);

/* A run recorded again from its run directory (`hearth ingest`, rebuild.h): its id, number
 * and state are what the directory says, not assigned here. */
typedef struct {
    const char *experiment;   /* name; the experiment is created when missing */
    const char *run_id;       /* "<experiment>-<seq>" */
    int64_t seq;
    const char *config_json;  /* as for run_new */
    const char *config_hash;
    const char *run_dir;
    run_state state;
    int attempts;
    const char *backend;      /* may be NULL */
    const char *note;         /* for the history (run_events): from where it came */
} run_restore;

/* Inserts the run with the given id, state and attempts, its flattened config and one
 * run_events row (pending -> state, with the note).  A run id that exists already fails
 * with HERR_CONFIG and changes nothing: a restore never overwrites a recorded run. */
int runs_db_restore(hearth_db *db, const run_restore *r, hearth_err *err);

int runs_db_set_run_dir(hearth_db *db, const char *run_id, const char *run_dir,
                        hearth_err *err);
/* Records the backend and job id of the current attempt without changing the state (for
 * backends that learn the id after the transition to `submitted`).  NULL keeps a value. */
int runs_db_set_job(hearth_db *db, const char *run_id, const char *backend,
                    const char *job_id, hearth_err *err);

/* What comes with a transition; every field is optional (NULL / 0). */
typedef struct {
    const char *backend;     /* recorded when not NULL */
    const char *job_id;      /* recorded when not NULL (the job of this attempt) */
    int has_exit_code;
    int exit_code;
    const char *note;        /* why, for the history (run_events) */
} run_transition;

/* Moves the run to state `to` if the transition table (run_state.h) allows it from its
 * current state, else fails with HERR_RUNTIME "run ID: illegal run state transition A -> B"
 * and changes nothing.  Side effects: -> submitted counts an attempt and stamps
 * submitted_at; -> running stamps started_at; a terminal state stamps ended_at.  Each
 * transition is appended to run_events.  t may be NULL. */
int runs_db_transition(hearth_db *db, const char *run_id, run_state to,
                       const run_transition *t, hearth_err *err);

/* A run as recorded.  Strings are malloc'd (NULL when unset); free with run_info_free. */
typedef struct {
    int64_t pk;               /* runs.id */
    char *run_id;
    char *experiment;
    int seq;
    run_state state;
    int attempts;
    char *config_hash;
    char *config_json;        /* runs_db_get only; NULL from runs_db_list */
    char *run_dir;
    char *backend;
    char *backend_job_id;
    int has_exit_code;
    int exit_code;
    char *created_at, *submitted_at, *started_at, *ended_at;
} run_info;

void run_info_free(run_info *r);

int runs_db_get(hearth_db *db, const char *run_id, run_info *out, hearth_err *err);

/* The runs of an experiment in run order, optionally only those whose state is in
 * `state_mask` (bit 1 << state; 0 = all).  *out is a malloc'd array of *n entries
 * (NULL when none); free it with runs_db_list_free.  An unknown experiment yields 0 runs. */
int runs_db_list(hearth_db *db, const char *experiment, unsigned state_mask, run_info **out,
                 size_t *n, hearth_err *err);
void runs_db_list_free(run_info *v, size_t n);

/* Runs per state of an experiment (NULL: all experiments). */
int runs_db_state_counts(hearth_db *db, const char *experiment,
                         long counts[RUN_STATE_COUNT], hearth_err *err);

/* How many of the run's transitions (run_events) went to state `to` with exactly the note
 * `note`, into *n. */
int runs_db_count_events(hearth_db *db, const char *run_id, run_state to, const char *note,
                         long *n, hearth_err *err);

/* Plan dedup: how many runs with this config hash are completed, and how many are still
 * on their way (pending, submitted, running, requeued).  experiment NULL counts runs of
 * every experiment.  Either output may be NULL. */
int runs_db_count_by_hash(hearth_db *db, const char *experiment, const char *hash,
                          long *completed, long *active, hearth_err *err);
/* The same for many hashes at once, read from one snapshot; completed/active are arrays of
 * n (either may be NULL). */
int runs_db_count_by_hashes(hearth_db *db, const char *experiment, const char *const *hashes,
                            size_t n, long *completed, long *active, hearth_err *err);

/* ---- experiments as a user manages them (runs_db_experiment.c) ------------------------------
 *
 * An experiment can be archived (hidden from `hearth status` and `hearth query` unless
 * asked for; nothing is removed), tagged, and removed.  Each call is one transaction. */

/* What runs_db_experiment_remove removed. */
typedef struct {
    long runs;                /* runs, with their history, config keys, metrics and results */
    long decisions;           /* `auto` decisions recorded for its points (select.h) */
} experiment_removed;

/* Removes experiment `name` with every run and everything recorded about them (the schema
 * cascades: history, config keys, metrics, results, tags), and the decisions made for its
 * points.  Layer benchmarks ingested from its runs stay (they lose the link to the run).
 * Refused with HERR_RUNTIME, changing nothing, while some of its runs are submitted or
 * running: their jobs are alive and would report to a database that no longer knows them
 * (cancel them first).  No such experiment: HERR_CONFIG.  `out` may be NULL.  Run
 * directories are files, not the database's: the caller decides about them. */
int runs_db_experiment_remove(hearth_db *db, const char *name, experiment_removed *out,
                              hearth_err *err);

/* Archives (archived != 0) or unarchives the experiment.  *changed (may be NULL) is 0 when
 * it was so already.  No such experiment: HERR_CONFIG. */
int runs_db_experiment_archive(hearth_db *db, const char *name, int archived, int *changed,
                               hearth_err *err);

/* A tag is 1 to 64 characters of [A-Za-z0-9._:@+-], not starting with '-' (so that it
 * never reads as an option); else HERR_CONFIG naming it. */
int runs_db_tag_check(const char *tag, hearth_err *err);
/* Adds (add != 0) or removes a tag of the experiment.  *changed (may be NULL) is 0 when
 * the experiment had it already / did not have it.  HERR_CONFIG for an unknown experiment
 * or a malformed tag. */
int runs_db_experiment_tag(hearth_db *db, const char *name, const char *tag, int add,
                           int *changed, hearth_err *err);

/* An experiment as `hearth status` lists it.  Strings are malloc'd (NULL when unset). */
typedef struct {
    char *name;
    char *created_at;
    char *archived_at;        /* NULL: not archived */
    char *tags;               /* "a,b", sorted; NULL when it has none */
    long counts[RUN_STATE_COUNT];
} experiment_info;

typedef struct {
    int archived;             /* also list archived experiments */
    const char *tag;          /* only experiments with this tag; NULL: any */
} experiment_filter;

/* The experiments `f` selects (NULL: those not archived), in the order they were created,
 * read from one snapshot.  *out is a malloc'd array of *n (NULL when none); free it with
 * runs_db_experiment_list_free. */
int runs_db_experiment_list(hearth_db *db, const experiment_filter *f, experiment_info **out,
                            size_t *n, hearth_err *err);
void runs_db_experiment_list_free(experiment_info *v, size_t n);

#endif
