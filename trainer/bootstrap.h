/* bootstrap.h - who am I in the job, and how do ranks exchange their first bytes.
 *
 * Before any communicator exists (the NCCL unique id must travel from rank 0 to everyone)
 * a rank needs its rank, the world size, its rank on the node, and one all-gather of a
 * small blob.  Three sources, chosen by bootstrap_init() from the environment:
 *
 *   pmix    under `srun --mpi=pmix` or `mpirun` (PMIX_RANK + PMIX_NAMESPACE set, or
 *           SLURM_MPI_TYPE=pmix* inside an srun step): rank, size, local rank and host from
 *           PMIx (failing to reach the PMIx server is an error, not a fallback); the all-gather
 *           is PMIx_Put + PMIx_Commit + PMIx_Fence(collect data) + PMIx_Get per peer.
 *   env     torchrun's variables RANK, WORLD_SIZE, LOCAL_RANK (optional), MASTER_ADDR,
 *           MASTER_PORT: a TCP rendezvous where rank 0 listens on MASTER_ADDR:MASTER_PORT,
 *           the others connect (retrying with backoff), rank 0 gathers every blob and sends
 *           the whole array back.  Every message is length-prefixed and checked.
 *   single  none of the above: one rank, the all-gather is a copy.  (Inside an srun step
 *           of several tasks without PMIx this is an error: N ranks that each believe they
 *           are alone would train N copies.)
 *
 * HEARTH_BOOTSTRAP=pmix|env|single forces a source (e.g. to use the env variables
 * inside an allocation that also exports PMIx variables).  HEARTH_BOOTSTRAP_TIMEOUT
 * (seconds, default 300) bounds the TCP rendezvous: connecting, waiting for every rank,
 * and each all-gather.  Errors name the rank (and address) that failed or never came.
 *
 * Ownership: bootstrap_init* allocate *out; the caller frees it with bootstrap_free
 * (which also closes sockets / finalizes PMIx).  Not thread-safe per object; distinct
 * objects (one per thread in tests) are independent. */
#ifndef HEARTH_BOOTSTRAP_H
#define HEARTH_BOOTSTRAP_H

#include <stddef.h>
#include <stdio.h>

#include "shape/err.h"

typedef struct bootstrap bootstrap;

typedef enum {
    BOOTSTRAP_SINGLE = 0,
    BOOTSTRAP_ENV = 1,
    BOOTSTRAP_PMIX = 2,
} bootstrap_kind;

/* Chooses the source from the process environment (see above) and joins the job.
 * Returns 0, HERR_CONFIG (bad variables), or HERR_RUNTIME (PMIx or rendezvous failure). */
int bootstrap_init(bootstrap **out, hearth_err *err);

/* Like bootstrap_init but reads variables from envp (a NULL-terminated "NAME=VALUE"
 * array, like environ); NULL means the process environment. */
int bootstrap_init_envp(bootstrap **out, char *const *envp, hearth_err *err);

/* The TCP rendezvous with explicit parameters (what the env source parses).  local_rank
 * < 0 means: computed by rank 0 from the host names of all ranks.  port 1..65535;
 * timeout_ms > 0. */
typedef struct {
    int rank, size, local_rank;
    const char *master_addr;  /* host name or numeric address; copied */
    int master_port;
    int timeout_ms;
} bootstrap_tcp_opts;
int bootstrap_init_tcp(bootstrap **out, const bootstrap_tcp_opts *o, hearth_err *err);

int bootstrap_rank(const bootstrap *b);
int bootstrap_size(const bootstrap *b);
int bootstrap_local_rank(const bootstrap *b);
const char *bootstrap_node_name(const bootstrap *b);   /* owned by b */
bootstrap_kind bootstrap_get_kind(const bootstrap *b);
const char *bootstrap_kind_name(bootstrap_kind k);     /* "single", "env", "pmix" */

/* Collective: every rank passes n bytes (the same n everywhere); afterwards
 * all[i*n .. i*n+n) holds rank i's bytes on every rank (all has size*n bytes; mine may
 * alias all's own slot).  May be called any number of times.  A mismatched n or a dead
 * peer is an error on the ranks that notice it, naming the rank. */
int bootstrap_allgather_blob(bootstrap *b, const void *mine, size_t n, void *all,
                             hearth_err *err);

void bootstrap_free(bootstrap *b);

/* hearth-train --check-bootstrap: joins the job, all-gathers a blob from every rank
 * ("rank R of N on HOST pid P" plus random bytes and a checksum), prints what it received
 * to out and checks that blob i names rank i of the same size and that the local ranks of
 * each host are 0..k-1, each once, then all-gathers a digest
 * of the whole view to check that every rank saw the same bytes.  Returns the exit
 * status: 0 consistent, 1 not (or the bootstrap failed; the reason goes to errf). */
int bootstrap_check_main(FILE *out, FILE *errf);

#endif
