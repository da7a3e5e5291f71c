/* comm.h - the communicator API (DESIGN.md "Trainer internals"): collectives and
 * point-to-point messages over groups of ranks, behind one interface with several
 * backends: `local` (N ranks as threads of one process, host buffers) and `nccl` (one
 * process per GPU, device buffers; see "the nccl backend" below for how it differs).
 *
 * Objects and ownership
 *   comm_world  the shared state of one job on the local backend.  Created once (by the
 *               thread that starts the ranks) with comm_local_world_create; freed with
 *               comm_local_world_free after every rank's thread is done with it.  It owns
 *               the shared state of every group created in it.
 *   comm        one rank's handle on one group (the world itself or a subgroup).  Used
 *               by that rank's thread only (a handle is not thread-safe; distinct handles
 *               are).  Freed with comm_free by its rank (freeing a handle never touches
 *               shared state, so ranks may free theirs at any time after their last use).
 *
 * Groups: comm_group_create(handle, ranks, n) is called by every member (each with the
 * same list of *world* ranks in the same order; position i in the list is group rank i).
 * It does not wait for the other members: the k-th creation of a given list by a rank
 * joins the k-th instance of that list, so two groups with the same members (say the
 * decoder's and the encoder's tp group) are distinct communicators as long as every member
 * creates them in the same order.  Members that pass different lists get different groups
 * (their first collective then waits; see the timeout below).
 *
 * Semantics of every operation (all are blocking; collective ones are called by every
 * member of the group with matching arguments):
 *   - Reductions sum (or max) in group-rank order 0..n-1 for every element, whichever
 *     thread computes it, so results are bitwise identical on every rank, independent of
 *     thread timing, and reduce_scatter's chunk equals the same chunk of an allreduce of
 *     the same inputs.  max propagates NaN (a NaN anywhere gives NaN).
 *   - Mismatched arguments across ranks (operation, dtype, count, reduction, root, the
 *     counts of the v-variants) are detected: every member returns HERR_RUNTIME with a
 *     message naming the rank and the values, nothing is written to any output buffer,
 *     and the group stays usable.
 *   - send is buffered (it copies the data and returns), so patterns like a ring where
 *     every rank sends before it receives cannot deadlock; recv takes the first pending
 *     message from that peer with that tag (messages with equal (peer, tag) arrive in the
 *     order sent).  A recv whose count differs from the sent count fails (the message is
 *     consumed).
 *   - Aliasing: in place is allowed as allreduce with send == recv, reduce_scatter with
 *     recv == send + rank*recv_count, all_gather with send == recv + rank*count (and
 *     broadcast, which has one buffer).  Otherwise send and recv must not overlap.
 *     Buffers with count 0 may be NULL.
 *   - Counts are in elements of the dtype; displacement arrays (NULL = packed in rank
 *     order) are in elements too.
 *   - Timeout: with comm_local_opts.timeout_ms > 0, a rank that waits longer than that in
 *     one operation gives up with HERR_RUNTIME ("timed out after ... in OP"); the group is
 *     then marked broken and every later operation on it fails at once.  0 waits forever.
 *     A timeout is a diagnosis, not a recovery: a rank still inside the operation may read
 *     the buffers of a rank that gave up, so after one the job should stop (free nothing
 *     that the operation used, and end the process).
 *
 * Errors are negative herr_codes with the message in *err (err may be NULL). */
#ifndef HEARTH_COMM_H
#define HEARTH_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "shape/err.h"

typedef enum {
    COMM_F32 = 0,   /* float */
    COMM_F64 = 1,   /* double */
    COMM_I32 = 2,   /* int32_t */
    COMM_I64 = 3,   /* int64_t */
    COMM_U8 = 4,    /* raw bytes (no reductions) */
} comm_dtype;

typedef enum { COMM_SUM = 0, COMM_MAX = 1 } comm_op;

typedef struct comm comm;
typedef struct comm_world comm_world;

size_t comm_dtype_size(comm_dtype dt);
const char *comm_dtype_name(comm_dtype dt);

/* ---- the local backend ----------------------------------------------------------- */
typedef struct {
    int timeout_ms;   /* > 0: give up on an operation after this long (see above) */
} comm_local_opts;

/* Creates a world of n >= 1 ranks.  opts may be NULL (no timeout). */
int comm_local_world_create(comm_world **out, int n, const comm_local_opts *opts,
                            hearth_err *err);
/* Rank r's handle on the whole world (group rank == world rank).  Call once per rank,
 * typically from the thread that then uses it; the caller frees it with comm_free. */
int comm_local_world_rank(comm_world *w, int rank, comm **out, hearth_err *err);
/* Marks every group of the world (and every group created later) broken and wakes the
 * ranks waiting in an operation: they, and every later operation, fail at once with
 * HERR_RUNTIME.  For a rank that failed on its own (not in a collective) so that the
 * others stop instead of waiting for it.  Thread-safe. */
void comm_local_world_abort(comm_world *w);
/* Frees the world and every group's shared state.  Only after every rank's thread has
 * finished using its handles (freeing the handles may come before or after). */
void comm_local_world_free(comm_world *w);

/* ---- the nccl backend (trainer/comm/comm_nccl.h) ---------------------------------
 * One process per GPU; comm_nccl_world_create joins the world (rank 0's NCCL unique id
 * reaches everyone through the bootstrap's blob all-gather) and sets NCCL_NVLS_ENABLE=0
 * unless it is set.  Built only where nvcc exists, into libhearth_comm_nccl.a (not this
 * library).  Differences from the semantics above:
 *   - Buffers are DEVICE pointers on the handle's device.  Each handle owns one NCCL
 *     communicator and one CUDA stream; every call returns after its work completed on
 *     that stream (cudaStreamSynchronize), so the blocking contract above holds.
 *   - The backend trusts its callers: mismatched arguments across ranks are NOT detected
 *     (NCCL cannot check them cheaply); they give wrong results, an NCCL error or a hang.
 *     There is no timeout either (a missing rank blocks the others).
 *   - Reductions are NCCL's: the order of a sum over more than two ranks depends on
 *     NCCL's algorithm (results agree across ranks but not bitwise with the local
 *     backend), and max follows NCCL's NaN handling, which need not propagate NaN.
 *   - send is not buffered: it waits until the peer posts the matching recv, so a ring
 *     where every rank sends first deadlocks, and send/recv to oneself is refused with
 *     HERR_RUNTIME.  Tags are not carried: messages between two ranks match in order.
 *   - comm_group_create is called by the members only (as here): the first member makes
 *     a unique id and sends it to the others over the world communicator, then every
 *     member calls ncclCommInitRank (ncclCommSplit would need every rank of the parent).
 *     Hence every member must create its groups in the same order (a member that does
 *     not is detected by a digest of the list and fails, while the others may wait), and
 *     a creation must not overlap an operation on the same rank's world handle. */

/* ---- groups and handles ---------------------------------------------------------- */
/* See "Groups" above.  `ranks` are world ranks, distinct, in range, and must include the
 * caller's own world rank (any handle of the caller may be passed).  *out is freed by
 * the caller with comm_free. */
int comm_group_create(comm *any, const int *ranks, int n, comm **out, hearth_err *err);
void comm_free(comm *c);

int comm_rank(const comm *c);                    /* rank in this group */
int comm_size(const comm *c);
int comm_world_rank_of(const comm *c, int group_rank);   /* -1 if out of range */

/* ---- collectives ----------------------------------------------------------------- */
/* recv[i] = op over ranks of send[i], count elements (F32, F64, I32, I64). */
int comm_allreduce(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                   comm_op op, hearth_err *err);
/* send holds size*recv_count elements; recv gets chunk `rank` of the reduction. */
int comm_reduce_scatter(comm *c, const void *send, void *recv, size_t recv_count,
                        comm_dtype dt, comm_op op, hearth_err *err);
/* recv (size*count elements) gets every rank's `count` elements in rank order. */
int comm_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                    hearth_err *err);
/* Variable counts: rank r sends send_count elements; every rank passes recv_counts[size]
 * (recv_counts[r] must equal rank r's send_count) and recv_displs[size] (NULL: packed),
 * and rank r's data lands at recv + recv_displs[r]. */
int comm_all_gatherv(comm *c, const void *send, size_t send_count, void *recv,
                     const size_t *recv_counts, const size_t *recv_displs, comm_dtype dt,
                     hearth_err *err);
/* root's buf (count elements) is copied into every other rank's buf. */
int comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root,
                   hearth_err *err);
/* send holds size chunks of count elements; chunk j goes to rank j, and recv chunk j
 * comes from rank j. */
int comm_all_to_all(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                    hearth_err *err);
/* send_counts[j] elements at send + send_displs[j] go to rank j; recv_counts[j] elements
 * from rank j land at recv + recv_displs[j]; rank i's send_counts[j] must equal rank j's
 * recv_counts[i].  Displacement arrays may be NULL (packed). */
int comm_all_to_allv(comm *c, const void *send, const size_t *send_counts,
                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                     const size_t *recv_displs, comm_dtype dt, hearth_err *err);
int comm_barrier(comm *c, hearth_err *err);

/* ---- point to point (peer is a group rank) ---------------------------------------- */
int comm_send(comm *c, const void *buf, size_t count, comm_dtype dt, int peer, int tag,
              hearth_err *err);
int comm_recv(comm *c, void *buf, size_t count, comm_dtype dt, int peer, int tag,
              hearth_err *err);
/* send_count elements of sbuf to group rank dst and recv_count elements from group rank
 * src into rbuf, as one step that cannot deadlock when every rank of a ring calls it
 * (on nccl the send and the receive are one NCCL group).  sbuf and rbuf must not
 * overlap.  dst == src == own rank copies sbuf into rbuf (counts equal). */
int comm_sendrecv(comm *c, const void *sbuf, size_t send_count, int dst, void *rbuf,
                  size_t recv_count, int src, comm_dtype dt, int tag, hearth_err *err);

#endif
