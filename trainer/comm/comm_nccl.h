/* comm_nccl.h - the `nccl` backend of comm.h: one process per GPU, DEVICE buffers, one
 * NCCL communicator (and one CUDA stream) per handle.  Built only where nvcc exists, into
 * libhearth_comm_nccl.a (never into libhearth_comm.a or hearth-train, so that a machine
 * without libnccl can run the CPU trainer).  See the "nccl backend" paragraph of comm.h
 * for the semantics that differ from the local backend.
 *
 * The world needs one all-gather of a small blob before NCCL exists (rank 0's
 * ncclUniqueId travels to everyone): the caller passes it as a function, normally
 * comm_nccl_bootstrap_allgather with a bootstrap* (bootstrap.h) as ctx, so that this
 * library itself does not link the bootstrap (and PMIx).
 *
 * Ownership: comm_nccl_world_create allocates *out, freed with comm_free (which destroys
 * the NCCL communicator and the stream).  Subgroups come from comm_group_create as with
 * every backend. */
#ifndef HEARTH_COMM_NCCL_H
#define HEARTH_COMM_NCCL_H

#include <stddef.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over the job: afterwards all[i*n .. i*n+n) holds rank i's n bytes. */
typedef int (*comm_nccl_allgather_fn)(void *ctx, const void *mine, size_t n, void *all,
                                      hearth_err *err);

/* Joins the world of `size` processes as `rank`, on CUDA device `device` (made current
 * on the calling thread; every later call on the handles selects it again).  Sets
 * NCCL_NVLS_ENABLE=0 in the environment unless it is already set (NVLink multicast is
 * kept off on the machines this runs on).  Collective: every rank calls it once. */
int comm_nccl_world_create(comm **out, int rank, int size, int device,
                           comm_nccl_allgather_fn allgather, void *ctx, hearth_err *err);

/* The CUDA stream the handle's operations run on (a cudaStream_t), for callers that
 * order their own kernels with it; every operation still synchronizes it before
 * returning. */
void *comm_nccl_stream(const comm *c);

#ifdef __cplusplus
}
#endif

/* The adapter for bootstrap.h (static inline: only a caller that uses it needs the
 * bootstrap symbols). */
#ifdef HEARTH_BOOTSTRAP_H
static inline int comm_nccl_bootstrap_allgather(void *ctx, const void *mine, size_t n,
                                                void *all, hearth_err *err)
{
    return bootstrap_allgather_blob((bootstrap *)ctx, mine, n, all, err);
}
#endif

#endif
