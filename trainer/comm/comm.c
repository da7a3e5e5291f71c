/* comm.c - the backend-independent half of comm.h: argument checks that need no other
 * rank, then dispatch to the backend. */
#include "comm/comm.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm_backend.h"

size_t comm_dtype_size(comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return sizeof(float);
    case COMM_F64: return sizeof(double);
    case COMM_I32: return sizeof(int32_t);
    case COMM_I64: return sizeof(int64_t);
    case COMM_U8: return 1;
    }
    return 0;
}

const char *comm_dtype_name(comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return "f32";
    case COMM_F64: return "f64";
    case COMM_I32: return "i32";
    case COMM_I64: return "i64";
    case COMM_U8: return "u8";
    }
    return "?";
}

const char *comm_kind_op_name(comm_kind_op k)
{
    switch (k) {
    case COMM_K_ALLREDUCE: return "allreduce";
    case COMM_K_REDUCE_SCATTER: return "reduce_scatter";
    case COMM_K_ALL_GATHER: return "all_gather";
    case COMM_K_ALL_GATHERV: return "all_gatherv";
    case COMM_K_BROADCAST: return "broadcast";
    case COMM_K_ALL_TO_ALL: return "all_to_all";
    case COMM_K_ALL_TO_ALLV: return "all_to_allv";
    case COMM_K_BARRIER: return "barrier";
    }
    return "?";
}

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }

int comm_world_rank_of(const comm *c, int group_rank)
{
    if (group_rank < 0 || group_rank >= c->size)
        return -1;
    return c->world_ranks[group_rank];
}

void comm_free(comm *c)
{
    if (!c)
        return;
    if (c->be && c->be->free_impl)
        c->be->free_impl(c->impl);
    free(c);
}

int comm_group_create(comm *any, const int *ranks, int n, comm **out, hearth_err *err)
{
    *out = NULL;
    if (!any || n < 1 || !ranks)
        return herr_set(err, HERR_RUNTIME, "comm_group_create: need a handle and n >= 1 ranks");
    return any->be->group_create(any, ranks, n, out, err);
}

/* Checks shared by every collective: a valid dtype, a reduction only on numbers, and
 * buffers present where elements move. */
static int check_common(const comm *c, const comm_args *a, hearth_err *err)
{
    const char *what = comm_kind_op_name(a->kind);
    if (!c)
        return herr_set(err, HERR_RUNTIME, "%s: no communicator", what);
    if (comm_dtype_size(a->dt) == 0)
        return herr_set(err, HERR_RUNTIME, "%s: unknown dtype %d", what, (int)a->dt);
    if (a->kind == COMM_K_ALLREDUCE || a->kind == COMM_K_REDUCE_SCATTER) {
        if (a->dt == COMM_U8)
            return herr_set(err, HERR_RUNTIME, "%s: no reduction on dtype u8", what);
        if (a->op != COMM_SUM && a->op != COMM_MAX)
            return herr_set(err, HERR_RUNTIME, "%s: unknown reduction %d", what, (int)a->op);
    }
    return 0;
}

static int need_buf(const void *p, size_t count, const char *what, const char *name,
                    hearth_err *err)
{
    if (count && !p)
        return herr_set(err, HERR_RUNTIME, "%s: %s is NULL with %zu elements", what, name,
                        count);
    return 0;
}

static int run(comm *c, const comm_args *a, hearth_err *err)
{
    int rc = check_common(c, a, err);
    if (rc)
        return rc;
    return c->be->collective(c, a, err);
}

int comm_allreduce(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                   comm_op op, hearth_err *err)
{
    comm_args a = { .kind = COMM_K_ALLREDUCE, .dt = dt, .op = op, .count = count,
                    .send = send, .recv = recv };
    if (need_buf(send, count, "allreduce", "send", err) ||
        need_buf(recv, count, "allreduce", "recv", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_reduce_scatter(comm *c, const void *send, void *recv, size_t recv_count,
                        comm_dtype dt, comm_op op, hearth_err *err)
{
    comm_args a = { .kind = COMM_K_REDUCE_SCATTER, .dt = dt, .op = op, .count = recv_count,
                    .send = send, .recv = recv };
    if (need_buf(send, recv_count, "reduce_scatter", "send", err) ||
        need_buf(recv, recv_count, "reduce_scatter", "recv", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_all_gather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                    hearth_err *err)
{
    comm_args a = { .kind = COMM_K_ALL_GATHER, .dt = dt, .count = count, .send = send,
                    .recv = recv };
    if (need_buf(send, count, "all_gather", "send", err) ||
        need_buf(recv, count, "all_gather", "recv", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_all_gatherv(comm *c, const void *send, size_t send_count, void *recv,
                     const size_t *recv_counts, const size_t *recv_displs, comm_dtype dt,
                     hearth_err *err)
{
    comm_args a = { .kind = COMM_K_ALL_GATHERV, .dt = dt, .count = send_count, .send = send,
                    .recv = recv, .recv_counts = recv_counts, .recv_displs = recv_displs };
    if (!recv_counts)
        return herr_set(err, HERR_RUNTIME, "all_gatherv: recv_counts is NULL");
    if (need_buf(send, send_count, "all_gatherv", "send", err))
        return HERR_RUNTIME;
    size_t total = 0;
    for (int r = 0; c && r < c->size; r++)
        total += recv_counts[r];
    if (need_buf(recv, total, "all_gatherv", "recv", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root,
                   hearth_err *err)
{
    comm_args a = { .kind = COMM_K_BROADCAST, .dt = dt, .count = count, .root = root,
                    .send = buf, .recv = buf };
    if (c && (root < 0 || root >= c->size))
        return herr_set(err, HERR_RUNTIME, "broadcast: root %d out of range (group of %d)",
                        root, c->size);
    if (need_buf(buf, count, "broadcast", "buf", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_all_to_all(comm *c, const void *send, void *recv, size_t count, comm_dtype dt,
                    hearth_err *err)
{
    comm_args a = { .kind = COMM_K_ALL_TO_ALL, .dt = dt, .count = count, .send = send,
                    .recv = recv };
    if (need_buf(send, count, "all_to_all", "send", err) ||
        need_buf(recv, count, "all_to_all", "recv", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_all_to_allv(comm *c, const void *send, const size_t *send_counts,
                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                     const size_t *recv_displs, comm_dtype dt, hearth_err *err)
{
    comm_args a = { .kind = COMM_K_ALL_TO_ALLV, .dt = dt, .send = send, .recv = recv,
                    .send_counts = send_counts, .send_displs = send_displs,
                    .recv_counts = recv_counts, .recv_displs = recv_displs };
    if (!send_counts || !recv_counts)
        return herr_set(err, HERR_RUNTIME, "all_to_allv: send_counts/recv_counts is NULL");
    size_t ts = 0, tr = 0;
    for (int r = 0; c && r < c->size; r++) {
        ts += send_counts[r];
        tr += recv_counts[r];
    }
    if (need_buf(send, ts, "all_to_allv", "send", err) ||
        need_buf(recv, tr, "all_to_allv", "recv", err))
        return HERR_RUNTIME;
    return run(c, &a, err);
}

int comm_barrier(comm *c, hearth_err *err)
{
    comm_args a = { .kind = COMM_K_BARRIER };
    return run(c, &a, err);
}

static int check_p2p(const comm *c, const void *buf, size_t count, comm_dtype dt, int peer,
                     const char *what, hearth_err *err)
{
    if (!c)
        return herr_set(err, HERR_RUNTIME, "%s: no communicator", what);
    if (comm_dtype_size(dt) == 0)
        return herr_set(err, HERR_RUNTIME, "%s: unknown dtype %d", what, (int)dt);
    if (peer < 0 || peer >= c->size)
        return herr_set(err, HERR_RUNTIME, "%s: peer %d out of range (group of %d)", what,
                        peer, c->size);
    return need_buf(buf, count, what, "buf", err);
}

int comm_send(comm *c, const void *buf, size_t count, comm_dtype dt, int peer, int tag,
              hearth_err *err)
{
    int rc = check_p2p(c, buf, count, dt, peer, "send", err);
    if (rc)
        return rc;
    return c->be->send(c, buf, count * comm_dtype_size(dt), peer, tag, err);
}

int comm_recv(comm *c, void *buf, size_t count, comm_dtype dt, int peer, int tag,
              hearth_err *err)
{
    int rc = check_p2p(c, buf, count, dt, peer, "recv", err);
    if (rc)
        return rc;
    return c->be->recv(c, buf, count * comm_dtype_size(dt), peer, tag, err);
}

int comm_sendrecv(comm *c, const void *sbuf, size_t send_count, int dst, void *rbuf,
                  size_t recv_count, int src, comm_dtype dt, int tag, hearth_err *err)
{
    int rc = check_p2p(c, sbuf, send_count, dt, dst, "sendrecv", err);
    if (rc || (rc = check_p2p(c, rbuf, recv_count, dt, src, "sendrecv", err)))
        return rc;
    size_t es = comm_dtype_size(dt);
    if (dst == c->rank && src == c->rank) {
        if (send_count != recv_count)
            return herr_set(err, HERR_RUNTIME, "sendrecv: to itself with send count %zu "
                            "and recv count %zu", send_count, recv_count);
        if (send_count)
            memmove(rbuf, sbuf, send_count * es);
        return 0;
    }
    if (c->be->sendrecv)
        return c->be->sendrecv(c, sbuf, send_count * es, dst, rbuf, recv_count * es, src, tag,
                               err);
    if ((rc = c->be->send(c, sbuf, send_count * es, dst, tag, err)))
        return rc;
    return c->be->recv(c, rbuf, recv_count * es, src, tag, err);
}
