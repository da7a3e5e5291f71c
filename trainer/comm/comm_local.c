/* comm_local.c - the `local` backend: N ranks as threads of one process, host buffers.
 *
 * Every group has one slot per member.  A collective is:
 *   post   each rank writes its arguments (buffer pointers, counts) into its slot;
 *   meet   a generation barrier: after it every slot of this operation is visible;
 *   check  every rank compares all slots the same way, so all reach the same verdict
 *          (a mismatch is an error everywhere and nothing is written);
 *   move   each rank writes only its own output, reading the others' input buffers
 *          directly (one address space);
 *   leave  a second barrier, so nobody returns (and reuses or frees its input, or posts
 *          the next operation into its slot) while another rank still reads it.
 * Allreduce splits the vector into one chunk per rank: rank r reduces chunk r into a
 * private buffer (every element summed in rank order 0..n-1), then everyone copies every
 * chunk - one extra barrier, the work spread over the threads, and the same bits on all
 * ranks whichever thread ran first.
 *
 * Waiting is on condition variables (no spinning: tests share two cores). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/comm_backend.h"

typedef struct lmsg {
    struct lmsg *next;
    int src, tag;
    size_t bytes;
    unsigned char data[];
} lmsg;

typedef struct {
    comm_args a;
    void *tmp;        /* allreduce: this rank's reduced chunk */
    int failed;       /* allreduce: this rank could not allocate tmp */
} lslot;

typedef struct {
    int n;
    int *ranks;               /* world ranks, group order */
    unsigned char *joined;    /* joined[i]: member i has a handle on this instance */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long gen;
    int broken;               /* a rank timed out: every operation fails from now on */
    lslot *slots;
    lmsg **inbox_head, **inbox_tail;   /* per destination group rank */
} lgroup;

struct comm_world {
    int n;
    int timeout_ms;
    lgroup *world_group;      /* also groups[0]; read without the lock (never moves) */
    pthread_mutex_t mu;       /* guards the group registry (which realloc may move) */
    int aborted;              /* comm_local_world_abort: groups are born broken */
    lgroup **groups;
    int ngroups, cap;
};

typedef struct {
    comm_world *w;
    lgroup *g;
} lhandle;

static const comm_backend local_backend;

/* ---- groups --------------------------------------------------------------------- */
static void lgroup_free(lgroup *g)
{
    if (!g)
        return;
    for (int i = 0; g->inbox_head && i < g->n; i++) {
        lmsg *m = g->inbox_head[i];
        while (m) {
            lmsg *next = m->next;
            free(m);
            m = next;
        }
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->ranks);
    free(g->joined);
    free(g->slots);
    free(g->inbox_head);
    free(g->inbox_tail);
    free(g);
}

static lgroup *lgroup_new(const int *ranks, int n)
{
    lgroup *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->n = n;
    g->ranks = malloc((size_t)n * sizeof *g->ranks);
    g->joined = calloc((size_t)n, 1);
    g->slots = calloc((size_t)n, sizeof *g->slots);
    g->inbox_head = calloc((size_t)n, sizeof *g->inbox_head);
    g->inbox_tail = calloc((size_t)n, sizeof *g->inbox_tail);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (!g->ranks || !g->joined || !g->slots || !g->inbox_head || !g->inbox_tail) {
        lgroup_free(g);
        return NULL;
    }
    memcpy(g->ranks, ranks, (size_t)n * sizeof *ranks);
    return g;
}

static int make_handle(comm_world *w, lgroup *g, int grank, comm **out, hearth_err *err)
{
    comm *c = calloc(1, sizeof *c);
    lhandle *h = calloc(1, sizeof *h);
    if (!c || !h) {
        free(c);
        free(h);
        return herr_set(err, HERR_NOMEM, "comm: out of memory");
    }
    h->w = w;
    h->g = g;
    c->be = &local_backend;
    c->impl = h;
    c->rank = grank;
    c->size = g->n;
    c->world_ranks = g->ranks;
    *out = c;
    return 0;
}

int comm_local_world_create(comm_world **out, int n, const comm_local_opts *opts,
                            hearth_err *err)
{
    *out = NULL;
    if (n < 1)
        return herr_set(err, HERR_RUNTIME, "comm local: world size %d < 1", n);
    comm_world *w = calloc(1, sizeof *w);
    int *ranks = malloc((size_t)n * sizeof *ranks);
    if (!w || !ranks) {
        free(w);
        free(ranks);
        return herr_set(err, HERR_NOMEM, "comm local: out of memory");
    }
    for (int i = 0; i < n; i++)
        ranks[i] = i;
    w->n = n;
    w->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 0;
    pthread_mutex_init(&w->mu, NULL);
    w->cap = 8;
    w->groups = calloc((size_t)w->cap, sizeof *w->groups);
    lgroup *g = w->groups ? lgroup_new(ranks, n) : NULL;
    free(ranks);
    if (!g) {
        comm_local_world_free(w);
        return herr_set(err, HERR_NOMEM, "comm local: out of memory");
    }
    w->groups[w->ngroups++] = g;   /* groups[0] is the world */
    w->world_group = g;
    *out = w;
    return 0;
}

int comm_local_world_rank(comm_world *w, int rank, comm **out, hearth_err *err)
{
    *out = NULL;
    if (rank < 0 || rank >= w->n)
        return herr_set(err, HERR_RUNTIME, "comm local: rank %d out of range (world of %d)",
                        rank, w->n);
    return make_handle(w, w->world_group, rank, out, err);
}

void comm_local_world_abort(comm_world *w)
{
    pthread_mutex_lock(&w->mu);
    w->aborted = 1;
    for (int i = 0; i < w->ngroups; i++) {
        lgroup *g = w->groups[i];
        pthread_mutex_lock(&g->mu);
        g->broken = 1;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

void comm_local_world_free(comm_world *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->ngroups; i++)
        lgroup_free(w->groups[i]);
    free(w->groups);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static int local_group_create(comm *any, const int *ranks, int n, comm **out, hearth_err *err)
{
    lhandle *h = any->impl;
    comm_world *w = h->w;
    int me = any->world_ranks[any->rank], my_index = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= w->n)
            return herr_set(err, HERR_RUNTIME,
                            "comm_group_create: rank %d out of range (world of %d)", ranks[i],
                            w->n);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return herr_set(err, HERR_RUNTIME, "comm_group_create: rank %d listed twice",
                                ranks[i]);
        if (ranks[i] == me)
            my_index = i;
    }
    if (my_index < 0)
        return herr_set(err, HERR_RUNTIME,
                        "comm_group_create: the caller (world rank %d) is not in the list", me);

    pthread_mutex_lock(&w->mu);
    lgroup *g = NULL;
    /* groups[0] is the world's own group, never joined through here */
    for (int i = 1; i < w->ngroups && !g; i++) {
        lgroup *c = w->groups[i];
        if (c->n == n && !c->joined[my_index] &&
            memcmp(c->ranks, ranks, (size_t)n * sizeof *ranks) == 0)
            g = c;
    }
    if (!g) {
        if (w->ngroups == w->cap) {
            lgroup **ng = realloc(w->groups, (size_t)w->cap * 2 * sizeof *ng);
            if (!ng) {
                pthread_mutex_unlock(&w->mu);
                return herr_set(err, HERR_NOMEM, "comm_group_create: out of memory");
            }
            w->groups = ng;
            w->cap *= 2;
        }
        g = lgroup_new(ranks, n);
        if (!g) {
            pthread_mutex_unlock(&w->mu);
            return herr_set(err, HERR_NOMEM, "comm_group_create: out of memory");
        }
        g->broken = w->aborted;
        w->groups[w->ngroups++] = g;
    }
    g->joined[my_index] = 1;
    pthread_mutex_unlock(&w->mu);
    return make_handle(w, g, my_index, out, err);
}

static void local_free_impl(void *impl)
{
    free(impl);
}

/* ---- waiting ---------------------------------------------------------------------- */
static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Waits on g->cv (g->mu held).  Returns ETIMEDOUT once the deadline passed. */
static int wait_cv(lgroup *g, int timeout_ms, const struct timespec *deadline)
{
    if (timeout_ms <= 0) {
        pthread_cond_wait(&g->cv, &g->mu);
        return 0;
    }
    return pthread_cond_timedwait(&g->cv, &g->mu, deadline);
}

static int broken_err(const comm *c, const char *what, hearth_err *err)
{
    return herr_set(err, HERR_RUNTIME,
                    "%s: rank %d (world rank %d): the group is broken (a rank failed or timed out "
                    "earlier)",
                    what, c->rank, c->world_ranks[c->rank]);
}

/* The generation barrier every collective phase goes through. */
static int meet(comm *c, const char *what, hearth_err *err)
{
    lhandle *h = c->impl;
    lgroup *g = h->g;
    int tmo = h->w->timeout_ms;
    struct timespec dl;
    if (tmo > 0)
        deadline_after(&dl, tmo);
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        pthread_mutex_unlock(&g->mu);
        return broken_err(c, what, err);
    }
    unsigned long my = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == my && !g->broken) {
            if (wait_cv(g, tmo, &dl) == ETIMEDOUT && g->gen == my) {
                g->broken = 1;
                pthread_cond_broadcast(&g->cv);
                pthread_mutex_unlock(&g->mu);
                return herr_set(err, HERR_RUNTIME,
                                "%s: rank %d (world rank %d) timed out after %d ms waiting "
                                "for the other %d ranks of its group", what, c->rank,
                                c->world_ranks[c->rank], tmo, g->n - 1);
            }
        }
    }
    int passed = g->gen != my;
    pthread_mutex_unlock(&g->mu);
    return passed ? 0 : broken_err(c, what, err);
}

/* ---- checking the posted arguments ------------------------------------------------ */
/* Every rank runs this over the same slots, so every rank gets the same verdict. */
static int check_slots(const comm *c, const lgroup *g, hearth_err *err)
{
    const comm_args *a0 = &g->slots[0].a;
    const char *what = comm_kind_op_name(a0->kind);
    for (int r = 1; r < g->n; r++) {
        const comm_args *a = &g->slots[r].a;
        if (a->kind != a0->kind)
            return herr_set(err, HERR_RUNTIME,
                            "collective mismatch: rank 0 called %s but rank %d called %s",
                            what, r, comm_kind_op_name(a->kind));
        if (a->dt != a0->dt)
            return herr_set(err, HERR_RUNTIME, "%s: dtype mismatch: rank 0 %s, rank %d %s",
                            what, comm_dtype_name(a0->dt), r, comm_dtype_name(a->dt));
        if (a0->kind == COMM_K_ALLREDUCE || a0->kind == COMM_K_REDUCE_SCATTER) {
            if (a->op != a0->op)
                return herr_set(err, HERR_RUNTIME,
                                "%s: reduction mismatch: rank 0 %s, rank %d %s", what,
                                a0->op == COMM_SUM ? "sum" : "max", r,
                                a->op == COMM_SUM ? "sum" : "max");
        }
        if (a0->kind != COMM_K_ALL_GATHERV && a0->kind != COMM_K_ALL_TO_ALLV &&
            a->count != a0->count)
            return herr_set(err, HERR_RUNTIME,
                            "%s: count mismatch: rank 0 passed %zu, rank %d passed %zu", what,
                            a0->count, r, a->count);
        if (a0->kind == COMM_K_BROADCAST && a->root != a0->root)
            return herr_set(err, HERR_RUNTIME, "%s: root mismatch: rank 0 %d, rank %d %d",
                            what, a0->root, r, a->root);
    }
    if (a0->kind == COMM_K_ALL_GATHERV) {
        for (int i = 0; i < g->n; i++)
            for (int r = 0; r < g->n; r++)
                if (g->slots[i].a.recv_counts[r] != g->slots[r].a.count)
                    return herr_set(err, HERR_RUNTIME,
                                    "all_gatherv: count mismatch: rank %d sends %zu but rank "
                                    "%d expects %zu from it", r, g->slots[r].a.count, i,
                                    g->slots[i].a.recv_counts[r]);
    }
    if (a0->kind == COMM_K_ALL_TO_ALLV) {
        for (int i = 0; i < g->n; i++)
            for (int j = 0; j < g->n; j++)
                if (g->slots[i].a.send_counts[j] != g->slots[j].a.recv_counts[i])
                    return herr_set(err, HERR_RUNTIME,
                                    "all_to_allv: count mismatch: rank %d sends %zu to rank %d "
                                    "but rank %d expects %zu", i, g->slots[i].a.send_counts[j],
                                    j, j, g->slots[j].a.recv_counts[i]);
    }
    (void)c;
    return 0;
}

/* ---- reductions ------------------------------------------------------------------- */
#define RBLOCK 256

/* out[0..len) = op over k = 0..n-1 of src[k][off..off+len), in that order.  A block is
 * read completely before it is written, so out may alias one of the sources at the same
 * offset (in-place reduce_scatter). */
#define DEF_REDUCE(NAME, T)                                                               \
    static void NAME(T *out, const void *const *src, int n, size_t off, size_t len,      \
                     comm_op op)                                                          \
    {                                                                                     \
        T acc[RBLOCK];                                                                    \
        for (size_t b = 0; b < len; b += RBLOCK) {                                        \
            size_t m = len - b < RBLOCK ? len - b : RBLOCK;                               \
            const T *s0 = (const T *)src[0] + off + b;                                    \
            for (size_t i = 0; i < m; i++)                                                \
                acc[i] = s0[i];                                                           \
            for (int k = 1; k < n; k++) {                                                 \
                const T *s = (const T *)src[k] + off + b;                                 \
                if (op == COMM_SUM) {                                                     \
                    for (size_t i = 0; i < m; i++)                                        \
                        acc[i] += s[i];                                                   \
                } else {                                                                  \
                    for (size_t i = 0; i < m; i++)                                        \
                        /* NaN wins: x != x only for NaN */                               \
                        if (s[i] > acc[i] || s[i] != s[i])                                \
                            acc[i] = s[i];                                                \
                }                                                                         \
            }                                                                             \
            memcpy(out + b, acc, m * sizeof(T));                                          \
        }                                                                                 \
    }

DEF_REDUCE(reduce_f32, float)
DEF_REDUCE(reduce_f64, double)
DEF_REDUCE(reduce_i32, int32_t)
DEF_REDUCE(reduce_i64, int64_t)

static void reduce_any(comm_dtype dt, void *out, const void *const *src, int n, size_t off,
                       size_t len, comm_op op)
{
    switch (dt) {
    case COMM_F32: reduce_f32(out, src, n, off, len, op); break;
    case COMM_F64: reduce_f64(out, src, n, off, len, op); break;
    case COMM_I32: reduce_i32(out, src, n, off, len, op); break;
    case COMM_I64: reduce_i64(out, src, n, off, len, op); break;
    case COMM_U8: break;   /* refused by comm.c */
    }
}

/* Chunk r of an allreduce of `count` elements over n ranks: [*off, *off + *len). */
static void chunk_of(size_t count, int n, int r, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *off = (size_t)r * base + ((size_t)r < extra ? (size_t)r : extra);
    *len = base + ((size_t)r < extra ? 1 : 0);
}

/* ---- the collectives -------------------------------------------------------------- */
static void copy_bytes(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src)
        memcpy(dst, src, bytes);
}

static size_t displ_of(const size_t *counts, const size_t *displs, int r)
{
    if (displs)
        return displs[r];
    size_t d = 0;
    for (int i = 0; i < r; i++)
        d += counts[i];
    return d;
}

static int local_collective(comm *c, const comm_args *a, hearth_err *err)
{
    lhandle *h = c->impl;
    lgroup *g = h->g;
    int n = g->n, me = c->rank, rc;
    const char *what = comm_kind_op_name(a->kind);
    size_t es = comm_dtype_size(a->dt);
    lslot *mine = &g->slots[me];

    /* post: the previous operation's closing barrier guarantees nobody reads this slot */
    mine->a = *a;
    mine->tmp = NULL;
    mine->failed = 0;
    if ((rc = meet(c, what, err)))
        return rc;
    int bad = check_slots(c, g, err);
    if (bad) {
        /* leave together so that nobody posts the next operation over a slot that a
         * slower rank is still checking */
        (void)meet(c, what, NULL);
        return bad;
    }

    const void **src = NULL;
    if (a->kind == COMM_K_ALLREDUCE || a->kind == COMM_K_REDUCE_SCATTER) {
        src = malloc((size_t)n * sizeof *src);
        if (!src)
            mine->failed = 1;
        for (int r = 0; src && r < n; r++)
            src[r] = g->slots[r].a.send;
    }

    switch (a->kind) {
    case COMM_K_ALLREDUCE: {
        size_t off, len;
        chunk_of(a->count, n, me, &off, &len);
        if (src && len) {
            mine->tmp = malloc(len * es);
            if (mine->tmp)
                reduce_any(a->dt, mine->tmp, (const void *const *)src, n, off, len, a->op);
            else
                mine->failed = 1;
        }
        /* everybody has read every input; now the chunks may be copied out */
        if ((rc = meet(c, what, err))) {
            free(src);
            free(mine->tmp);
            return rc;
        }
        int failed = 0;
        for (int r = 0; r < n; r++)
            failed |= g->slots[r].failed;
        if (!failed) {
            for (int r = 0; r < n; r++) {
                chunk_of(a->count, n, r, &off, &len);
                copy_bytes((char *)a->recv + off * es, g->slots[r].tmp, len * es);
            }
        }
        rc = meet(c, what, err);
        free(src);
        if (rc)   /* timed out: a slow rank may still copy from tmp, so leak it */
            return rc;
        free(mine->tmp);
        if (failed)
            return herr_set(err, HERR_NOMEM, "allreduce: out of memory on some rank");
        return 0;
    }
    case COMM_K_REDUCE_SCATTER:
        if (src)
            reduce_any(a->dt, a->recv, (const void *const *)src, n, (size_t)me * a->count,
                       a->count, a->op);
        free(src);
        if ((rc = meet(c, what, err)))
            return rc;
        if (!src)
            return herr_set(err, HERR_NOMEM, "reduce_scatter: out of memory");
        return 0;
    case COMM_K_ALL_GATHER:
        for (int r = 0; r < n; r++)
            copy_bytes((char *)a->recv + (size_t)r * a->count * es, g->slots[r].a.send,
                       a->count * es);
        break;
    case COMM_K_ALL_GATHERV:
        for (int r = 0; r < n; r++)
            copy_bytes((char *)a->recv + displ_of(a->recv_counts, a->recv_displs, r) * es,
                       g->slots[r].a.send, a->recv_counts[r] * es);
        break;
    case COMM_K_BROADCAST:
        if (me != a->root)
            copy_bytes(a->recv, g->slots[a->root].a.send, a->count * es);
        break;
    case COMM_K_ALL_TO_ALL:
        for (int r = 0; r < n; r++)
            copy_bytes((char *)a->recv + (size_t)r * a->count * es,
                       (const char *)g->slots[r].a.send + (size_t)me * a->count * es,
                       a->count * es);
        break;
    case COMM_K_ALL_TO_ALLV:
        for (int r = 0; r < n; r++) {
            const comm_args *o = &g->slots[r].a;
            size_t so = displ_of(o->send_counts, o->send_displs, me);
            size_t ro = displ_of(a->recv_counts, a->recv_displs, r);
            copy_bytes((char *)a->recv + ro * es, (const char *)o->send + so * es,
                       a->recv_counts[r] * es);
        }
        break;
    case COMM_K_BARRIER:
        break;
    }
    return meet(c, what, err);
}

/* ---- point to point --------------------------------------------------------------- */
static int local_send(comm *c, const void *buf, size_t bytes, int peer, int tag,
                      hearth_err *err)
{
    lhandle *h = c->impl;
    lgroup *g = h->g;
    lmsg *m = malloc(sizeof *m + bytes);
    if (!m)
        return herr_set(err, HERR_NOMEM, "send: out of memory (%zu bytes)", bytes);
    m->next = NULL;
    m->src = c->rank;
    m->tag = tag;
    m->bytes = bytes;
    if (bytes)
        memcpy(m->data, buf, bytes);
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        pthread_mutex_unlock(&g->mu);
        free(m);
        return broken_err(c, "send", err);
    }
    if (g->inbox_tail[peer])
        g->inbox_tail[peer]->next = m;
    else
        g->inbox_head[peer] = m;
    g->inbox_tail[peer] = m;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static int local_recv(comm *c, void *buf, size_t bytes, int peer, int tag, hearth_err *err)
{
    lhandle *h = c->impl;
    lgroup *g = h->g;
    int me = c->rank, tmo = h->w->timeout_ms;
    struct timespec dl;
    if (tmo > 0)
        deadline_after(&dl, tmo);
    pthread_mutex_lock(&g->mu);
    lmsg *m = NULL;
    for (;;) {
        if (g->broken) {
            pthread_mutex_unlock(&g->mu);
            return broken_err(c, "recv", err);
        }
        lmsg *prev = NULL;
        for (m = g->inbox_head[me]; m; prev = m, m = m->next)
            if (m->src == peer && m->tag == tag)
                break;
        if (m) {
            if (prev)
                prev->next = m->next;
            else
                g->inbox_head[me] = m->next;
            if (g->inbox_tail[me] == m)
                g->inbox_tail[me] = prev;
            break;
        }
        if (wait_cv(g, tmo, &dl) == ETIMEDOUT) {
            g->broken = 1;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
            return herr_set(err, HERR_RUNTIME,
                            "recv: rank %d (world rank %d) timed out after %d ms waiting for "
                            "a message from rank %d with tag %d", me, c->world_ranks[me], tmo,
                            peer, tag);
        }
    }
    pthread_mutex_unlock(&g->mu);
    int rc = 0;
    if (m->bytes != bytes)
        rc = herr_set(err, HERR_RUNTIME,
                      "recv: rank %d expected %zu bytes from rank %d (tag %d) but %zu were sent",
                      me, bytes, peer, tag, m->bytes);
    else if (bytes)
        memcpy(buf, m->data, bytes);
    free(m);
    return rc;
}

static const comm_backend local_backend = {
    .name = "local",
    .collective = local_collective,
    .send = local_send,
    .recv = local_recv,
    .group_create = local_group_create,
    .free_impl = local_free_impl,
};
