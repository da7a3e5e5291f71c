/* bootstrap_impl.h - the bootstrap object and its three sources (private to bootstrap*.c
 * and the bootstrap unit tests). */
#ifndef HEARTH_BOOTSTRAP_IMPL_H
#define HEARTH_BOOTSTRAP_IMPL_H

#include "bootstrap.h"

struct bootstrap {
    bootstrap_kind kind;
    int rank, size, local_rank;
    char node[256];
    /* env (TCP): rank 0 holds fds[1..size-1], one socket per peer; a peer holds fds[0],
     * its socket to rank 0.  Unused entries are -1. */
    int *fds;
    char master[256];   /* "ADDR:PORT" as given, for messages */
    int timeout_ms;     /* HEARTH_BOOTSTRAP_TIMEOUT: TCP rendezvous, and PMIx fences */
    /* pmix: the pmix_proc_t of this process (opaque here) and a counter that makes each
     * all-gather's key unique. */
    void *pmix_self;
    unsigned seq;
};

/* Each fills b (kind, rank, size, local_rank, node and its own fields) or returns a
 * negative code; the caller frees b with bootstrap_free either way. */
int bootstrap_tcp_join(bootstrap *b, const bootstrap_tcp_opts *o, hearth_err *err);
int bootstrap_tcp_allgather(bootstrap *b, const void *mine, size_t n, void *all,
                            hearth_err *err);
void bootstrap_tcp_close(bootstrap *b);

int bootstrap_pmix_join(bootstrap *b, hearth_err *err);
int bootstrap_pmix_allgather(bootstrap *b, const void *mine, size_t n, void *all,
                             hearth_err *err);
void bootstrap_pmix_close(bootstrap *b);

#endif
