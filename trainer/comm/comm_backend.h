/* comm_backend.h - private to trainer/comm/: what a backend provides behind comm.h.
 *
 * comm.c checks the arguments every backend would check the same way (dtypes, ranks in
 * range, NULL buffers with nonzero counts) and then calls the backend through this table,
 * so a backend only implements the data movement. */
#ifndef HEARTH_COMM_BACKEND_H
#define HEARTH_COMM_BACKEND_H

#include "comm/comm.h"

/* The arguments of one operation, as every rank posts them. */
typedef enum {
    COMM_K_ALLREDUCE, COMM_K_REDUCE_SCATTER, COMM_K_ALL_GATHER, COMM_K_ALL_GATHERV,
    COMM_K_BROADCAST, COMM_K_ALL_TO_ALL, COMM_K_ALL_TO_ALLV, COMM_K_BARRIER,
} comm_kind_op;

typedef struct {
    comm_kind_op kind;
    comm_dtype dt;
    comm_op op;
    size_t count;            /* per-rank element count (the v-variants: send count / 0) */
    int root;
    const void *send;
    void *recv;
    const size_t *send_counts, *send_displs;   /* all_to_allv */
    const size_t *recv_counts, *recv_displs;   /* all_gatherv, all_to_allv */
} comm_args;

typedef struct comm_backend {
    const char *name;
    /* a collective over c's group; args already checked locally */
    int (*collective)(comm *c, const comm_args *a, hearth_err *err);
    int (*send)(comm *c, const void *buf, size_t bytes, int peer, int tag, hearth_err *err);
    int (*recv)(comm *c, void *buf, size_t bytes, int peer, int tag, hearth_err *err);
    int (*group_create)(comm *any, const int *ranks, int n, comm **out, hearth_err *err);
    void (*free_impl)(void *impl);
    /* optional: send to one peer and receive from another as one step (a ring shift);
     * NULL = send then recv, right for a backend whose send is buffered */
    int (*sendrecv)(comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                    size_t rbytes, int src, int tag, hearth_err *err);
} comm_backend;

struct comm {
    const comm_backend *be;
    void *impl;              /* backend's per-handle state, freed by be->free_impl */
    int rank, size;
    const int *world_ranks;  /* size entries; owned by the backend's shared state */
};

const char *comm_kind_op_name(comm_kind_op k);

#endif
