/* run_state.h - run states and the one table of legal transitions (DESIGN.md, "Exit codes
 * and run states").
 *
 *   pending -> submitted -> running -> completed | failed | cancelled | timeout
 *                  ^            |
 *                  +- requeued <+      (preempted or node failure, resubmitted within retries)
 *
 * Besides the main path the table allows what a poller really observes:
 * - submitted -> completed|failed|timeout|cancelled|requeued: a short job can start and end
 *   between two polls, so `running` is never seen;
 * - pending -> failed (the submission itself failed), pending -> cancelled;
 * - requeued -> cancelled, requeued -> failed (resubmission failed or retries ran out);
 * - cancelled -> requeued: only `hearth resume --include-cancelled`, which runs cancelled
 *   runs again in their own directories, from their checkpoints.
 * Otherwise terminal states (completed, failed, cancelled, timeout) never change: running a
 * point again makes a new run.  (A run interrupted with its runner is not cancelled: it
 * goes running -> requeued, sweep.h.) */
#ifndef HEARTH_RUN_STATE_H
#define HEARTH_RUN_STATE_H

#include "shape/err.h"

typedef enum {
    RUN_PENDING = 0,
    RUN_SUBMITTED,
    RUN_RUNNING,
    RUN_REQUEUED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_CANCELLED,
    RUN_TIMEOUT,
    RUN_STATE_COUNT
} run_state;

/* "pending", "submitted", ...; "?" for a value out of range. */
const char *run_state_name(run_state s);
/* Parses a state name; returns 0, or HERR_CONFIG with a message listing the states. */
int run_state_parse(const char *name, run_state *out, hearth_err *err);

/* 1 when from -> to is in the table (a state never transitions to itself). */
int run_state_can_transition(run_state from, run_state to);
/* 0 when legal, else HERR_RUNTIME "illegal run state transition FROM -> TO". */
int run_state_check_transition(run_state from, run_state to, hearth_err *err);

/* completed, failed, cancelled, timeout (cancelled is final too, but for an explicit
 * reopen). */
int run_state_is_terminal(run_state s);

/* The state a finished attempt goes to from its RUN_DIR/exit_code (hearth-train's exit
 * codes): 0 completed, 75 requeued (preempted after a checkpoint), anything else failed.
 * Timeouts are known to the backend, not from the code; the sweep fails a completed one
 * that left no result.json (sweep.h). */
run_state run_state_for_exit_code(int code);

#endif
