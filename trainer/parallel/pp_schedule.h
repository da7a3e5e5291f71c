/* pp_schedule.h - the op list each pipeline stage runs in one training step, and a
 * checker that simulates all stages together.
 *
 * A stage (pipeline rank p of pp) holds vpp model chunks; chunk c on stage p is virtual
 * stage v = c * pp + p, so the model's layers run through virtual stages 0 .. pp*vpp - 1
 * and every virtual stage boundary is a hop to the next rank.  A stage runs its ops on one
 * thread, in list order; each op works on one (micro batch, chunk):
 *   forward of v  needs the forward of v - 1 of that micro batch (v > 0);
 *   backward of v needs the forward of v and the backward of v + 1 (the last virtual
 *                 stage starts the backward from its own forward).
 * Sends never block; a stage blocks until the input of its next op has arrived.
 *
 * Schedules:
 *   vpp == 1  1F1B (PipeDream-flush, as in Megatron): min(pp - p - 1, M) warmup forwards,
 *             then one forward and one backward alternately, then the cooldown backwards.
 *             Micro batches in order.  Stage 0 holds at most min(pp, M) micro batches.
 *   vpp > 1   Megatron's interleaved 1F1B.  The forward order is a table of
 *             (micro, chunk): micro batches go in groups; for each group, every chunk in
 *             turn runs the group's micro batches.  Groups hold pp micro batches, except
 *             the last, which also takes the M % pp left over (with M % pp == 0 this is
 *             exactly Megatron's table; with M < pp there is one group of M).  The k-th
 *             backward is the k-th table entry with the chunk reversed (vpp - 1 - chunk).
 *             Warmup: (pp - p - 1) * 2 + (vpp - 1) * G forwards, at most M * vpp, where G
 *             is the largest group (pp when M % pp == 0, as in Megatron); then one forward
 *             and one backward alternately; then the cooldown backwards.
 *             Any M >= 1 is accepted.  A short group after a full one deadlocks (see
 *             pp_schedule.c), which is why the remainder joins the last group; the price
 *             is (vpp - 1) * (M % pp) more warmup forwards, so more activations held: M a
 *             multiple of pp is the efficient choice.  The tests check every pp <= 8,
 *             vpp <= 5, M <= 40 by simulation; pp_schedule_check proves any other
 *             (pp, vpp, M) by simulating its pp * 2 * M * vpp ops (milliseconds for pp 32,
 *             vpp 8, M 1024), cheap enough to run once at start-up.
 *
 * Pure functions: no communication, no global state.  The op lists are caller-owned. */
#ifndef HEARTH_PP_SCHEDULE_H
#define HEARTH_PP_SCHEDULE_H

#include "shape/err.h"

typedef enum { PP_FORWARD = 0, PP_BACKWARD = 1 } pp_op_kind;

typedef struct {
    pp_op_kind kind;
    int micro;   /* micro batch, 0 .. M - 1 */
    int chunk;   /* model chunk on this stage, 0 .. vpp - 1 (virtual stage chunk*pp + stage) */
} pp_op;

/* The number of ops every stage runs: 2 * M * vpp (a forward and a backward of each
 * micro batch on each chunk). */
int pp_schedule_len(int vpp, int M);

/* Writes the ops of `stage` (0 .. pp - 1) for M micro batches, pp stages and vpp chunks per
 * stage (1 = plain 1F1B) into ops (room for cap; pp_schedule_len(vpp, M) are needed) and
 * returns the count.  Errors: HERR_CONFIG when the sizes break a rule (the message names
 * it: pp >= 1, vpp >= 1, M >= 1, 0 <= stage < pp), HERR_RUNTIME when cap is too small. */
int pp_schedule_build(pp_op *ops, int cap, int pp, int vpp, int stage, int M, hearth_err *err);

/* Builds every stage's schedule and simulates them (see pp_schedule_check_ops).  Returns 0
 * when every stage finishes, else HERR_CONFIG (as pp_schedule_build), HERR_NOMEM, or
 * HERR_RUNTIME with a message.  *max_inflight (may be NULL) gets the largest number of
 * (micro batch, chunk) activations any stage holds at once (forwarded, not yet
 * backwarded); with vpp == 1 that is a count of micro batches. */
int pp_schedule_check(int pp, int vpp, int M, int *max_inflight, hearth_err *err);

/* Simulates arbitrary op lists: ops[p] (n_ops[p] entries) is what stage p runs.  Returns
 * 0 when every stage runs to its end and every (micro, virtual stage) was forwarded and
 * backwarded exactly once; HERR_RUNTIME when an op is out of range, runs twice, is never
 * run, or the stages deadlock (the message names the blocked ops and what they wait
 * for); HERR_NOMEM.  *max_inflight as for pp_schedule_check. */
int pp_schedule_check_ops(int pp, int vpp, int M, const pp_op *const *ops, const int *n_ops,
                          int *max_inflight, hearth_err *err);

#endif
