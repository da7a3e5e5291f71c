/* comm_nccl.cu - the `nccl` backend of comm.h (see comm_nccl.h and the "nccl backend"
 * paragraph of comm.h): device buffers, one ncclComm_t and one CUDA stream per handle,
 * every operation synchronized before it returns.  Host-side code only (no kernels):
 * a .cu so that nvcc builds it into its own library, away from libhearth_comm.a. */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "comm/comm_backend.h"
}
#include "comm/comm_nccl.h"

/* State shared by every handle of one rank: the world communicator, which subgroup
 * creation uses to hand the new group's unique id from its first member to the others.
 * Reference-counted so that handles may be freed in any order. */
typedef struct {
    ncclComm_t nc;
    cudaStream_t st;
    void *scratch;         /* device bytes for barrier and unique-id messages */
    int device, size;
    int refs;              /* atomic */
} nworld;

typedef struct {
    nworld *w;
    ncclComm_t nc;         /* == w->nc for the world handle */
    cudaStream_t st;
    void *scratch;
    int *world_ranks;      /* size entries, owned here */
    int is_world;
} nhandle;

/* What the first member of a new group sends to the others: the id and a digest of the
 * member list, so that a member that creates its groups in another order notices. */
typedef struct {
    ncclUniqueId id;
    uint64_t digest;
    int32_t n;
} nid_msg;

#define SCRATCH_BYTES (sizeof(nid_msg) < 256 ? 256 : sizeof(nid_msg))

static int nccl_collective(comm *c, const comm_args *a, hearth_err *err);
static int nccl_send(comm *c, const void *buf, size_t bytes, int peer, int tag, hearth_err *err);
static int nccl_recv(comm *c, void *buf, size_t bytes, int peer, int tag, hearth_err *err);
static int nccl_group_create(comm *any, const int *ranks, int n, comm **out, hearth_err *err);
static void nccl_free_impl(void *impl);
static int nccl_sendrecv(comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                         size_t rbytes, int src, int tag, hearth_err *err);

static const comm_backend nccl_backend_table = {
    "nccl", nccl_collective, nccl_send, nccl_recv, nccl_group_create, nccl_free_impl,
    nccl_sendrecv,
};

static int cuda_fail(hearth_err *err, cudaError_t e, const char *what)
{
    return herr_set(err, HERR_RUNTIME, "nccl backend: %s: %s", what, cudaGetErrorString(e));
}

static int nccl_fail(hearth_err *err, ncclComm_t nc, ncclResult_t r, const char *what)
{
    const char *last = nc ? ncclGetLastError(nc) : ncclGetLastError(NULL);
    return herr_set(err, HERR_RUNTIME, "nccl backend: %s: %s%s%s", what,
                    ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

#define CU(call, what)                                                   \
    do {                                                                 \
        cudaError_t e_ = (call);                                         \
        if (e_ != cudaSuccess)                                           \
            return cuda_fail(err, e_, what);                             \
    } while (0)
#define NC(nc, call, what)                                               \
    do {                                                                 \
        ncclResult_t r_ = (call);                                        \
        if (r_ != ncclSuccess)                                           \
            return nccl_fail(err, nc, r_, what);                         \
    } while (0)

static ncclDataType_t nccl_type(comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I32: return ncclInt32;
    case COMM_I64: return ncclInt64;
    case COMM_U8: break;
    }
    return ncclUint8;
}

static nhandle *H(const comm *c) { return (nhandle *)c->impl; }

/* Waits for the handle's stream; an error there (or an asynchronous NCCL error) fails the
 * operation. */
static int finish(nhandle *h, const char *what, hearth_err *err)
{
    cudaError_t e = cudaStreamSynchronize(h->st);
    ncclResult_t ar = ncclSuccess;
    ncclCommGetAsyncError(h->nc, &ar);
    if (ar != ncclSuccess)
        return nccl_fail(err, h->nc, ar, what);
    if (e != cudaSuccess)
        return cuda_fail(err, e, what);
    return 0;
}

static void world_unref(nworld *w)
{
    if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    cudaSetDevice(w->device);
    ncclCommDestroy(w->nc);
    cudaStreamDestroy(w->st);
    cudaFree(w->scratch);
    free(w);
}

static void nccl_free_impl(void *impl)
{
    nhandle *h = (nhandle *)impl;
    if (!h)
        return;
    if (!h->is_world) {
        cudaSetDevice(h->w->device);
        if (h->nc)
            ncclCommDestroy(h->nc);
        if (h->st)
            cudaStreamDestroy(h->st);
        cudaFree(h->scratch);
    }
    world_unref(h->w);
    free(h->world_ranks);
    free(h);
}

/* A new comm with an empty handle on w (takes one reference to w). */
static int handle_new(nworld *w, int rank, int size, comm **out, hearth_err *err)
{
    comm *c = (comm *)calloc(1, sizeof *c);
    nhandle *h = (nhandle *)calloc(1, sizeof *h);
    int *wr = (int *)malloc((size_t)size * sizeof *wr);
    if (!c || !h || !wr) {
        free(c);
        free(h);
        free(wr);
        return herr_set(err, HERR_NOMEM, "nccl backend: out of memory");
    }
    __atomic_add_fetch(&w->refs, 1, __ATOMIC_ACQ_REL);
    h->w = w;
    h->world_ranks = wr;
    c->be = &nccl_backend_table;
    c->impl = h;
    c->rank = rank;
    c->size = size;
    c->world_ranks = wr;
    *out = c;
    return 0;
}

extern "C" int comm_nccl_world_create(comm **out, int rank, int size, int device,
                                      comm_nccl_allgather_fn allgather, void *ctx,
                                      hearth_err *err)
{
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size || !allgather)
        return herr_set(err, HERR_RUNTIME,
                        "comm_nccl_world_create: rank %d of %d (or no all-gather)", rank, size);
    /* NVLink multicast (NVLS) stays off unless the user chose otherwise. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    CU(cudaSetDevice(device), "cudaSetDevice");

    ncclUniqueId mine;
    memset(&mine, 0, sizeof mine);
    if (rank == 0)
        NC(NULL, ncclGetUniqueId(&mine), "ncclGetUniqueId");
    ncclUniqueId *all = (ncclUniqueId *)calloc((size_t)size, sizeof *all);
    if (!all)
        return herr_set(err, HERR_NOMEM, "nccl backend: out of memory");
    int rc = allgather(ctx, &mine, sizeof mine, all, err);
    if (rc) {
        free(all);
        return herr_prefix(err, rc, "nccl backend: exchanging the unique id");
    }
    ncclUniqueId id = all[0];
    free(all);

    nworld *w = (nworld *)calloc(1, sizeof *w);
    if (!w)
        return herr_set(err, HERR_NOMEM, "nccl backend: out of memory");
    w->device = device;
    w->size = size;
    cudaError_t e = cudaStreamCreateWithFlags(&w->st, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMalloc(&w->scratch, SCRATCH_BYTES);
    if (e != cudaSuccess) {
        if (w->st)
            cudaStreamDestroy(w->st);
        free(w);
        return cuda_fail(err, e, "creating the world stream");
    }
    ncclResult_t r = ncclCommInitRank(&w->nc, size, id, rank);
    if (r != ncclSuccess) {
        cudaStreamDestroy(w->st);
        cudaFree(w->scratch);
        free(w);
        return nccl_fail(err, NULL, r, "ncclCommInitRank (world)");
    }
    comm *c;
    w->refs = 0;
    rc = handle_new(w, rank, size, &c, err);
    if (rc) {
        ncclCommDestroy(w->nc);
        cudaStreamDestroy(w->st);
        cudaFree(w->scratch);
        free(w);
        return rc;
    }
    nhandle *h = H(c);
    h->is_world = 1;
    h->nc = w->nc;
    h->st = w->st;
    h->scratch = w->scratch;
    for (int i = 0; i < size; i++)
        h->world_ranks[i] = i;
    *out = c;
    return 0;
}

extern "C" void *comm_nccl_stream(const comm *c)
{
    return c && c->be == &nccl_backend_table ? (void *)H(c)->st : NULL;
}

static uint64_t list_digest(const int *ranks, int n)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a over the list */
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ranks[i];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h ^ (uint64_t)n;
}

/* Members only (like every backend): the first member makes a unique id and sends it to
 * the others over the world communicator; every member then joins with ncclCommInitRank.
 * (ncclCommSplit would need every rank of the parent to call it, members or not.) */
static int nccl_group_create(comm *any, const int *ranks, int n, comm **out, hearth_err *err)
{
    nhandle *ah = H(any);
    nworld *w = ah->w;
    int me = any->world_ranks[any->rank], idx = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= w->size)
            return herr_set(err, HERR_RUNTIME, "comm_group_create: rank %d out of range (world of %d)",
                            ranks[i], w->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return herr_set(err, HERR_RUNTIME, "comm_group_create: rank %d listed twice",
                                ranks[i]);
        if (ranks[i] == me)
            idx = i;
    }
    if (idx < 0)
        return herr_set(err, HERR_RUNTIME, "comm_group_create: the list lacks the caller (world rank %d)",
                        me);
    CU(cudaSetDevice(w->device), "cudaSetDevice");

    nid_msg msg;
    memset(&msg, 0, sizeof msg);
    uint64_t digest = list_digest(ranks, n);
    if (n > 1) {
        if (idx == 0) {
            NC(NULL, ncclGetUniqueId(&msg.id), "ncclGetUniqueId");
            msg.digest = digest;
            msg.n = n;
            CU(cudaMemcpyAsync(w->scratch, &msg, sizeof msg, cudaMemcpyHostToDevice, w->st),
               "group id upload");
            NC(w->nc, ncclGroupStart(), "ncclGroupStart");
            for (int i = 1; i < n; i++)
                ncclSend(w->scratch, sizeof msg, ncclUint8, ranks[i], w->nc, w->st);
            NC(w->nc, ncclGroupEnd(), "sending the group id");
        } else {
            NC(w->nc, ncclRecv(w->scratch, sizeof msg, ncclUint8, ranks[0], w->nc, w->st),
               "receiving the group id");
            CU(cudaMemcpyAsync(&msg, w->scratch, sizeof msg, cudaMemcpyDeviceToHost, w->st),
               "group id download");
        }
        CU(cudaStreamSynchronize(w->st), "group id exchange");
        if (msg.digest != digest || msg.n != n)
            return herr_set(err, HERR_RUNTIME,
                            "comm_group_create: world rank %d's group (%d members) does not match "
                            "this rank's list of %d members (groups created in another order?)",
                            ranks[0], (int)msg.n, n);
    } else {
        NC(NULL, ncclGetUniqueId(&msg.id), "ncclGetUniqueId");
    }

    comm *c;
    int rc = handle_new(w, idx, n, &c, err);
    if (rc)
        return rc;
    nhandle *h = H(c);
    memcpy(h->world_ranks, ranks, (size_t)n * sizeof *ranks);
    cudaError_t e = cudaStreamCreateWithFlags(&h->st, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMalloc(&h->scratch, SCRATCH_BYTES);
    if (e != cudaSuccess) {
        comm_free(c);
        return cuda_fail(err, e, "creating the group stream");
    }
    ncclResult_t r = ncclCommInitRank(&h->nc, n, msg.id, idx);
    if (r != ncclSuccess) {
        h->nc = NULL;
        comm_free(c);
        return nccl_fail(err, NULL, r, "ncclCommInitRank (group)");
    }
    *out = c;
    return 0;
}

/* Element offset i of a dtype buffer. */
static const char *at(const void *p, size_t i, size_t es) { return (const char *)p + i * es; }

/* Peer j's part of a grouped exchange: counts and displacements (elements) of what goes
 * to j and comes from j; *soff and *roff advance over the packed layouts. */
static void peer_part(const comm_args *a, int j, size_t *soff, size_t *roff, size_t *sc,
                      size_t *rc, size_t *sd, size_t *rd)
{
    if (a->kind == COMM_K_ALL_GATHERV) {
        *sc = a->count;
        *sd = 0;
        *rc = a->recv_counts[j];
        *rd = a->recv_displs ? a->recv_displs[j] : *roff;
    } else if (a->kind == COMM_K_ALL_TO_ALL) {
        *sc = *rc = a->count;
        *sd = *rd = (size_t)j * a->count;
    } else {
        *sc = a->send_counts[j];
        *rc = a->recv_counts[j];
        *sd = a->send_displs ? a->send_displs[j] : *soff;
        *rd = a->recv_displs ? a->recv_displs[j] : *roff;
    }
    *soff += *sc;
    *roff += *rc;
}

/* Grouped sends and receives (all_gatherv, all_to_all(v)): the part for this rank itself
 * is a device copy on the same stream, so that no NCCL send-to-self is needed. */
static int exchange(comm *c, const comm_args *a, hearth_err *err)
{
    nhandle *h = H(c);
    size_t es = comm_dtype_size(a->dt);
    int me = c->rank;
    const char *what = comm_kind_op_name(a->kind);
    size_t soff = 0, roff = 0, sc, rc, sd, rd;
    for (int j = 0; j <= me; j++)
        peer_part(a, j, &soff, &roff, &sc, &rc, &sd, &rd);
    const char *src = at(a->send, sd, es);
    char *dst = (char *)at(a->recv, rd, es);
    if (sc && src != dst)
        CU(cudaMemcpyAsync(dst, src, sc * es, cudaMemcpyDeviceToDevice, h->st), what);
    if (c->size > 1) {
        soff = roff = 0;
        NC(h->nc, ncclGroupStart(), "ncclGroupStart");
        ncclResult_t r = ncclSuccess;
        for (int j = 0; j < c->size; j++) {
            peer_part(a, j, &soff, &roff, &sc, &rc, &sd, &rd);
            if (j == me)
                continue;
            if (sc && r == ncclSuccess)
                r = ncclSend(at(a->send, sd, es), sc * es, ncclUint8, j, h->nc, h->st);
            if (rc && r == ncclSuccess)
                r = ncclRecv((void *)at(a->recv, rd, es), rc * es, ncclUint8, j, h->nc, h->st);
        }
        ncclResult_t r2 = ncclGroupEnd();
        if (r != ncclSuccess)
            return nccl_fail(err, h->nc, r, what);
        if (r2 != ncclSuccess)
            return nccl_fail(err, h->nc, r2, what);
    }
    return finish(h, what, err);
}

static int nccl_collective(comm *c, const comm_args *a, hearth_err *err)
{
    nhandle *h = H(c);
    const char *what = comm_kind_op_name(a->kind);
    ncclDataType_t t = nccl_type(a->dt);
    ncclRedOp_t op = a->op == COMM_MAX ? ncclMax : ncclSum;
    CU(cudaSetDevice(h->w->device), "cudaSetDevice");
    switch (a->kind) {
    case COMM_K_ALLREDUCE:
        if (!a->count)
            return 0;
        NC(h->nc, ncclAllReduce(a->send, a->recv, a->count, t, op, h->nc, h->st), what);
        break;
    case COMM_K_REDUCE_SCATTER:
        if (!a->count)
            return 0;
        NC(h->nc, ncclReduceScatter(a->send, a->recv, a->count, t, op, h->nc, h->st), what);
        break;
    case COMM_K_ALL_GATHER:
        if (!a->count)
            return 0;
        NC(h->nc, ncclAllGather(a->send, a->recv, a->count, t, h->nc, h->st), what);
        break;
    case COMM_K_BROADCAST:
        if (!a->count)
            return 0;
        NC(h->nc, ncclBroadcast(a->send, a->recv, a->count, t, a->root, h->nc, h->st), what);
        break;
    case COMM_K_ALL_GATHERV:
    case COMM_K_ALL_TO_ALL:
    case COMM_K_ALL_TO_ALLV:
        return exchange(c, a, err);
    case COMM_K_BARRIER:
        /* NCCL has no barrier: a one-element allreduce is one. */
        NC(h->nc, ncclAllReduce(h->scratch, h->scratch, 1, ncclInt32, ncclSum, h->nc, h->st),
           what);
        break;
    }
    return finish(h, what, err);
}

/* Unbuffered: NCCL matches a send with the peer's receive, so the call returns once the
 * peer has received (tags are not carried; see comm.h). */
static int nccl_p2p(comm *c, void *buf, size_t bytes, int peer, int is_send, hearth_err *err)
{
    nhandle *h = H(c);
    const char *what = is_send ? "send" : "recv";
    if (peer == c->rank)
        return herr_set(err, HERR_RUNTIME,
                        "%s: to itself (rank %d) is not possible on the nccl backend, whose "
                        "send waits for the matching recv", what, peer);
    if (!bytes)
        return 0;
    CU(cudaSetDevice(h->w->device), "cudaSetDevice");
    if (is_send)
        NC(h->nc, ncclSend(buf, bytes, ncclUint8, peer, h->nc, h->st), what);
    else
        NC(h->nc, ncclRecv(buf, bytes, ncclUint8, peer, h->nc, h->st), what);
    return finish(h, what, err);
}

static int nccl_send(comm *c, const void *buf, size_t bytes, int peer, int tag, hearth_err *err)
{
    (void)tag;
    return nccl_p2p(c, (void *)buf, bytes, peer, 1, err);
}

static int nccl_recv(comm *c, void *buf, size_t bytes, int peer, int tag, hearth_err *err)
{
    (void)tag;
    return nccl_p2p(c, buf, bytes, peer, 0, err);
}

/* One NCCL group, so that a ring of sendrecvs does not deadlock (comm.c handles the
 * copy to itself). */
static int nccl_sendrecv(comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                         size_t rbytes, int src, int tag, hearth_err *err)
{
    nhandle *h = H(c);
    (void)tag;
    if (dst == c->rank || src == c->rank)
        return herr_set(err, HERR_RUNTIME, "sendrecv: to or from itself (rank %d) with "
                        "another peer is not possible on the nccl backend", c->rank);
    CU(cudaSetDevice(h->w->device), "cudaSetDevice");
    NC(h->nc, ncclGroupStart(), "sendrecv");
    if (sbytes)
        NC(h->nc, ncclSend(sbuf, sbytes, ncclUint8, dst, h->nc, h->st), "sendrecv");
    if (rbytes)
        NC(h->nc, ncclRecv(rbuf, rbytes, ncclUint8, src, h->nc, h->st), "sendrecv");
    NC(h->nc, ncclGroupEnd(), "sendrecv");
    return finish(h, "sendrecv", err);
}
