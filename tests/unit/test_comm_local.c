/* test_comm_local.c - the local communicator backend: N ranks as threads.
 *
 * Every collective against a serial reference on fresh random inputs for N = 1..8
 * (reductions must match the rank-order reference bitwise, on every rank, on repeated
 * runs), random group subsets, v-variants with random counts including zeros, in-place
 * forms, mismatched arguments (an error everywhere, not a hang, and the group still
 * works), a send/recv ring (buffered: cannot deadlock), tags matched in order, and the
 * timeout.  Rank threads never call cmocka (its failures longjmp): they record a
 * result and the main thread checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <pthread.h>
#include <unistd.h>

#include "comm/comm.h"
#include "support/testutil.h"

#define MAXN 8

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

/* ---- running N rank threads ------------------------------------------------------ */
typedef struct harness harness;
typedef int (*rank_fn)(harness *h, int rank, comm *world, hearth_err *err);

struct harness {
    int n;
    comm_world *w;
    rank_fn fn;
    void *ctx;
    int rc[MAXN];
    hearth_err err[MAXN];
};

typedef struct {
    harness *h;
    int rank;
} rank_arg;

static void *rank_thread(void *p)
{
    rank_arg *a = p;
    harness *h = a->h;
    comm *world = NULL;
    h->rc[a->rank] = comm_local_world_rank(h->w, a->rank, &world, &h->err[a->rank]);
    if (!h->rc[a->rank])
        h->rc[a->rank] = h->fn(h, a->rank, world, &h->err[a->rank]);
    comm_free(world);
    return NULL;
}

/* Runs fn on n threads; timeout_ms 0: none. */
static void run_ranks(harness *h, int n, rank_fn fn, void *ctx, int timeout_ms)
{
    memset(h, 0, sizeof *h);
    h->n = n;
    h->fn = fn;
    h->ctx = ctx;
    hearth_err err;
    comm_local_opts o = { .timeout_ms = timeout_ms };
    assert_int_equal(comm_local_world_create(&h->w, n, &o, &err), 0);
    pthread_t th[MAXN];
    rank_arg args[MAXN];
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){ h, r };
        assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &args[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    comm_local_world_free(h->w);
    h->w = NULL;
}

static void expect_all_ok(const harness *h, const char *what)
{
    for (int r = 0; r < h->n; r++)
        if (h->rc[r])
            fail_msg("%s, n=%d: rank %d failed (%d): %s (seed %llu)", what, h->n, r, h->rc[r],
                     h->err[r].msg, (unsigned long long)g_rng.seed);
}

/* ---- allreduce / reduce_scatter --------------------------------------------------- */
typedef struct {
    comm_dtype dt;
    comm_op op;
    size_t count;        /* allreduce: elements; reduce_scatter: per-rank chunk */
    int in_place;
    int delay_us[MAXN];  /* per-rank delay before the call: perturbs the thread timing */
    void *in[MAXN];      /* inputs (never modified) */
    void *out[MAXN];     /* outputs */
} red_ctx;

static size_t red_total(const red_ctx *x, int n, int scatter)
{
    return scatter ? x->count * (size_t)n : x->count;
}

static int do_allreduce(harness *h, int rank, comm *world, hearth_err *err)
{
    red_ctx *x = h->ctx;
    size_t bytes = x->count * comm_dtype_size(x->dt);
    if (x->delay_us[rank])
        usleep((useconds_t)x->delay_us[rank]);
    if (x->in_place) {
        memcpy(x->out[rank], x->in[rank], bytes);
        return comm_allreduce(world, x->out[rank], x->out[rank], x->count, x->dt, x->op, err);
    }
    return comm_allreduce(world, x->in[rank], x->out[rank], x->count, x->dt, x->op, err);
}

static int do_reduce_scatter(harness *h, int rank, comm *world, hearth_err *err)
{
    red_ctx *x = h->ctx;
    size_t es = comm_dtype_size(x->dt);
    if (x->delay_us[rank])
        usleep((useconds_t)x->delay_us[rank]);
    if (x->in_place) {
        /* the whole input goes into a scratch copy; the result lands in its own chunk */
        size_t all = x->count * (size_t)h->n * es;
        char *buf = malloc(all ? all : 1);
        if (!buf)
            return herr_set(err, HERR_NOMEM, "oom");
        memcpy(buf, x->in[rank], all);
        int rc = comm_reduce_scatter(world, buf, buf + (size_t)rank * x->count * es,
                                     x->count, x->dt, x->op, err);
        memcpy(x->out[rank], buf + (size_t)rank * x->count * es, x->count * es);
        free(buf);
        return rc;
    }
    return comm_reduce_scatter(world, x->in[rank], x->out[rank], x->count, x->dt, x->op, err);
}

/* The serial reference: rank order 0..n-1 for every element, NaN wins for max. */
#define REF_REDUCE(T)                                                                      \
    do {                                                                                   \
        T *o = ref;                                                                        \
        for (size_t i = 0; i < total; i++) {                                               \
            T acc = ((const T *)x->in[0])[i];                                              \
            for (int r = 1; r < n; r++) {                                                  \
                T v = ((const T *)x->in[r])[i];                                            \
                if (x->op == COMM_SUM)                                                     \
                    acc += v;                                                              \
                else if (v > acc || v != v)                                                \
                    acc = v;                                                               \
            }                                                                              \
            o[i] = acc;                                                                    \
        }                                                                                  \
    } while (0)

static void reference_reduce(const red_ctx *x, int n, size_t total, void *ref)
{
    switch (x->dt) {
    case COMM_F32: REF_REDUCE(float); break;
    case COMM_F64: REF_REDUCE(double); break;
    case COMM_I32: REF_REDUCE(int32_t); break;
    case COMM_I64: REF_REDUCE(int64_t); break;
    default: fail_msg("bad dtype");
    }
}

static void fill_random(void *p, size_t count, comm_dtype dt)
{
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case COMM_F32: ((float *)p)[i] = (float)(tu_normal(&g_rng) * 10.0); break;
        case COMM_F64: ((double *)p)[i] = tu_normal(&g_rng) * 10.0; break;
        case COMM_I32: ((int32_t *)p)[i] = (int32_t)tu_randint(&g_rng, -100000, 100000); break;
        case COMM_I64: ((int64_t *)p)[i] = (int64_t)tu_next(&g_rng) >> 8; break;
        case COMM_U8: ((uint8_t *)p)[i] = (uint8_t)tu_next(&g_rng); break;
        }
    }
}

static void check_reduction(int scatter)
{
    static const comm_dtype dts[] = { COMM_F32, COMM_F32, COMM_F64, COMM_I32, COMM_I64 };
    for (int n = 1; n <= MAXN; n++) {
        for (int trial = 0; trial < 4; trial++) {
            red_ctx x = { 0 };
            x.dt = dts[tu_randint(&g_rng, 0, 5)];
            x.op = trial & 1 ? COMM_MAX : COMM_SUM;
            x.in_place = tu_randint(&g_rng, 0, 2);
            /* small counts too: fewer elements than ranks leaves chunks empty */
            x.count = trial == 0 ? (size_t)tu_randint(&g_rng, 0, 2 * n)
                                 : (size_t)tu_randint(&g_rng, 0, scatter ? 700 : 3000);
            size_t es = comm_dtype_size(x.dt), total = red_total(&x, n, scatter);
            for (int r = 0; r < n; r++) {
                x.in[r] = malloc(total * es + 1);
                x.out[r] = malloc(total * es + 1);
                fill_random(x.in[r], total, x.dt);
            }
            /* a NaN somewhere now and then: max must propagate it like the reference */
            if (x.dt == COMM_F32 && total && tu_randint(&g_rng, 0, 3) == 0)
                ((float *)x.in[tu_randint(&g_rng, 0, n)])[tu_randint(&g_rng, 0, (int)total)] =
                    __builtin_nanf("");
            void *ref = malloc(total * es + 1);
            reference_reduce(&x, n, total, ref);
            void *first = malloc(x.count * es + 1);
            for (int rep = 0; rep < 2; rep++) {
                /* the second run: random delays, so that other threads arrive first */
                for (int r = 0; r < n; r++)
                    x.delay_us[r] = rep ? tu_randint(&g_rng, 0, 2000) : 0;
                harness h;
                run_ranks(&h, n, scatter ? do_reduce_scatter : do_allreduce, &x, 0);
                expect_all_ok(&h, scatter ? "reduce_scatter" : "allreduce");
                for (int r = 0; r < n; r++) {
                    const char *want = (const char *)ref + (scatter ? (size_t)r * x.count * es : 0);
                    if (memcmp(x.out[r], want, x.count * es))
                        fail_msg("%s %s %s n=%d count=%zu in_place=%d: rank %d differs from the "
                                 "rank-order reference (seed %llu)",
                                 scatter ? "reduce_scatter" : "allreduce",
                                 comm_dtype_name(x.dt), x.op == COMM_SUM ? "sum" : "max", n,
                                 x.count, x.in_place, r, (unsigned long long)g_rng.seed);
                }
                /* repeated runs: bitwise identical (rank 0's output) */
                if (rep == 0)
                    memcpy(first, x.out[0], x.count * es);
                else if (memcmp(first, x.out[0], x.count * es))
                    fail_msg("not deterministic across runs (seed %llu)",
                             (unsigned long long)g_rng.seed);
            }
            free(first);
            free(ref);
            for (int r = 0; r < n; r++) {
                free(x.in[r]);
                free(x.out[r]);
            }
        }
    }
}

static void test_allreduce(void **state)
{
    (void)state;
    check_reduction(0);
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    check_reduction(1);
}

/* ---- data movement: gathers, broadcast, all-to-all ---------------------------------- */
typedef enum { MV_GATHER, MV_GATHERV, MV_BCAST, MV_A2A, MV_A2AV } mv_kind;

typedef struct {
    mv_kind kind;
    comm_dtype dt;
    int n;
    size_t count;                       /* gather / bcast / a2a: per rank (per peer) */
    int in_place, root;
    size_t cnt[MAXN][MAXN];             /* a2av: cnt[i][j] from i to j; gatherv: cnt[0][r] */
    size_t rdispl[MAXN][MAXN];          /* gatherv / a2av recv displacements */
    int use_displs;
    void *in[MAXN];
    void *out[MAXN];
    size_t out_elems;                   /* per rank */
} mv_ctx;

static int do_move(harness *h, int rank, comm *world, hearth_err *err)
{
    mv_ctx *x = h->ctx;
    size_t es = comm_dtype_size(x->dt);
    int n = x->n;
    switch (x->kind) {
    case MV_GATHER:
        if (x->in_place) {
            char *dst = (char *)x->out[rank] + (size_t)rank * x->count * es;
            memcpy(dst, x->in[rank], x->count * es);
            return comm_all_gather(world, dst, x->out[rank], x->count, x->dt, err);
        }
        return comm_all_gather(world, x->in[rank], x->out[rank], x->count, x->dt, err);
    case MV_GATHERV:
        return comm_all_gatherv(world, x->in[rank], x->cnt[0][rank], x->out[rank], x->cnt[0],
                                x->use_displs ? x->rdispl[0] : NULL, x->dt, err);
    case MV_BCAST:
        if (rank == x->root)
            memcpy(x->out[rank], x->in[rank], x->count * es);
        return comm_broadcast(world, x->out[rank], x->count, x->dt, x->root, err);
    case MV_A2A:
        return comm_all_to_all(world, x->in[rank], x->out[rank], x->count, x->dt, err);
    case MV_A2AV: {
        size_t sc[MAXN], rc[MAXN];
        for (int j = 0; j < n; j++) {
            sc[j] = x->cnt[rank][j];
            rc[j] = x->cnt[j][rank];
        }
        return comm_all_to_allv(world, x->in[rank], sc, NULL, x->out[rank], rc,
                                x->use_displs ? x->rdispl[rank] : NULL, x->dt, err);
    }
    }
    return -1;
}

/* Expected bytes of rank r's output, built from the inputs by plain copies. */
static void expected_move(const mv_ctx *x, int r, unsigned char *want)
{
    size_t es = comm_dtype_size(x->dt);
    int n = x->n;
    memset(want, 0xA5, x->out_elems * es + 1);
    switch (x->kind) {
    case MV_GATHER:
        for (int s = 0; s < n; s++)
            memcpy(want + (size_t)s * x->count * es, x->in[s], x->count * es);
        break;
    case MV_GATHERV: {
        size_t off = 0;
        for (int s = 0; s < n; s++) {
            size_t d = x->use_displs ? x->rdispl[0][s] : off;
            memcpy(want + d * es, x->in[s], x->cnt[0][s] * es);
            off += x->cnt[0][s];
        }
        break;
    }
    case MV_BCAST:
        memcpy(want, x->in[x->root], x->count * es);
        break;
    case MV_A2A:
        for (int s = 0; s < n; s++)
            memcpy(want + (size_t)s * x->count * es,
                   (const unsigned char *)x->in[s] + (size_t)r * x->count * es, x->count * es);
        break;
    case MV_A2AV: {
        size_t off = 0;
        for (int s = 0; s < n; s++) {
            size_t so = 0;   /* packed send displacement of r in s's buffer */
            for (int j = 0; j < r; j++)
                so += x->cnt[s][j];
            size_t d = x->use_displs ? x->rdispl[r][s] : off;
            memcpy(want + d * es, (const unsigned char *)x->in[s] + so * es, x->cnt[s][r] * es);
            off += x->cnt[s][r];
        }
        break;
    }
    }
}

/* Random counts: about a third zero. */
static size_t rand_count(int max)
{
    return tu_randint(&g_rng, 0, 3) == 0 ? 0 : (size_t)tu_randint(&g_rng, 1, max);
}

/* Displacements in a random order with random gaps; returns the span in elements. */
static size_t random_displs(const size_t *counts, int n, size_t *displs)
{
    int order[MAXN];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = tu_randint(&g_rng, 0, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        off += (size_t)tu_randint(&g_rng, 0, 3);
        displs[order[i]] = off;
        off += counts[order[i]];
    }
    return off;
}

static void check_move(mv_kind kind, const char *what)
{
    static const comm_dtype dts[] = { COMM_F32, COMM_U8, COMM_F64, COMM_I32 };
    for (int n = 1; n <= MAXN; n++) {
        for (int trial = 0; trial < 3; trial++) {
            mv_ctx *x = calloc(1, sizeof *x);
            x->kind = kind;
            x->n = n;
            x->dt = dts[tu_randint(&g_rng, 0, 4)];
            x->count = rand_count(300);
            x->in_place = tu_randint(&g_rng, 0, 2);
            x->root = tu_randint(&g_rng, 0, n);
            x->use_displs = tu_randint(&g_rng, 0, 2);
            size_t es = comm_dtype_size(x->dt), in_elems[MAXN];
            for (int r = 0; r < n; r++) {
                in_elems[r] = x->count;
                if (kind == MV_A2A)
                    in_elems[r] = x->count * (size_t)n;
            }
            x->out_elems = kind == MV_BCAST ? x->count : x->count * (size_t)n;
            if (kind == MV_GATHERV) {
                for (int r = 0; r < n; r++)
                    in_elems[r] = x->cnt[0][r] = rand_count(200);
                size_t packed = 0;
                for (int r = 0; r < n; r++)
                    packed += x->cnt[0][r];
                x->out_elems = x->use_displs ? random_displs(x->cnt[0], n, x->rdispl[0]) : packed;
            }
            if (kind == MV_A2AV) {
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < n; j++)
                        x->cnt[i][j] = rand_count(100);
                x->out_elems = 0;
                for (int r = 0; r < n; r++) {
                    in_elems[r] = 0;
                    for (int j = 0; j < n; j++)
                        in_elems[r] += x->cnt[r][j];
                    size_t rc[MAXN], span = 0;
                    for (int j = 0; j < n; j++) {
                        rc[j] = x->cnt[j][r];
                        span += rc[j];
                    }
                    if (x->use_displs)
                        span = random_displs(rc, n, x->rdispl[r]);
                    if (span > x->out_elems)
                        x->out_elems = span;
                }
            }
            for (int r = 0; r < n; r++) {
                x->in[r] = malloc(in_elems[r] * es + 1);
                fill_random(x->in[r], in_elems[r], x->dt);
                x->out[r] = malloc(x->out_elems * es + 1);
                memset(x->out[r], 0xA5, x->out_elems * es + 1);   /* gaps must stay as is */
            }
            harness h;
            run_ranks(&h, n, do_move, x, 0);
            expect_all_ok(&h, what);
            unsigned char *want = malloc(x->out_elems * es + 1);
            for (int r = 0; r < n; r++) {
                expected_move(x, r, want);
                if (memcmp(want, x->out[r], x->out_elems * es + 1))
                    fail_msg("%s %s n=%d trial %d rank %d: output differs (in_place %d displs "
                             "%d root %d; seed %llu)", what, comm_dtype_name(x->dt), n, trial,
                             r, x->in_place, x->use_displs, x->root,
                             (unsigned long long)g_rng.seed);
            }
            free(want);
            for (int r = 0; r < n; r++) {
                free(x->in[r]);
                free(x->out[r]);
            }
            free(x);
        }
    }
}

static void test_all_gather(void **state) { (void)state; check_move(MV_GATHER, "all_gather"); }
static void test_all_gatherv(void **state) { (void)state; check_move(MV_GATHERV, "all_gatherv"); }
static void test_broadcast(void **state) { (void)state; check_move(MV_BCAST, "broadcast"); }
static void test_all_to_all(void **state) { (void)state; check_move(MV_A2A, "all_to_all"); }
static void test_all_to_allv(void **state) { (void)state; check_move(MV_A2AV, "all_to_allv"); }

/* ---- barrier ---------------------------------------------------------------------- */
typedef struct {
    pthread_mutex_t mu;
    int arrived[4];
} bar_ctx;

static int do_barrier(harness *h, int rank, comm *world, hearth_err *err)
{
    bar_ctx *x = h->ctx;
    (void)rank;
    for (int round = 0; round < 4; round++) {
        pthread_mutex_lock(&x->mu);
        x->arrived[round]++;
        pthread_mutex_unlock(&x->mu);
        int rc = comm_barrier(world, err);
        if (rc)
            return rc;
        pthread_mutex_lock(&x->mu);
        int seen = x->arrived[round];
        pthread_mutex_unlock(&x->mu);
        if (seen != h->n)
            return herr_set(err, HERR_RUNTIME, "round %d: left the barrier with %d of %d",
                            round, seen, h->n);
    }
    return 0;
}

static void test_barrier(void **state)
{
    (void)state;
    for (int n = 1; n <= MAXN; n++) {
        bar_ctx x = { .mu = PTHREAD_MUTEX_INITIALIZER };
        harness h;
        run_ranks(&h, n, do_barrier, &x, 0);
        expect_all_ok(&h, "barrier");
    }
}

/* ---- send / recv ------------------------------------------------------------------ */
#define RING_MSGS 5

typedef struct {
    uint64_t seed;
    size_t len[MAXN][RING_MSGS];
} ring_ctx;

static void ring_payload(uint64_t seed, int src, int k, float *p, size_t len)
{
    tu_rng g;
    tu_rng_init(&g, seed ^ ((uint64_t)src << 32) ^ (uint64_t)k);
    for (size_t i = 0; i < len; i++)
        p[i] = (float)tu_uniform(&g);
}

/* Every rank first sends RING_MSGS messages to the next rank (tag k % 2, so two messages
 * share each tag and must arrive in order), then receives from the previous one, odd
 * tags first: a ring that deadlocks with unbuffered blocking sends. */
static int do_ring(harness *h, int rank, comm *world, hearth_err *err)
{
    ring_ctx *x = h->ctx;
    int n = h->n, next = (rank + 1) % n, prev = (rank + n - 1) % n, rc;
    float buf[512], want[512];
    for (int k = 0; k < RING_MSGS; k++) {
        ring_payload(x->seed, rank, k, buf, x->len[rank][k]);
        if ((rc = comm_send(world, buf, x->len[rank][k], COMM_F32, next, k % 2, err)))
            return rc;
    }
    static const int order[RING_MSGS] = { 1, 3, 0, 2, 4 };
    for (int i = 0; i < RING_MSGS; i++) {
        int k = order[i];
        if ((rc = comm_recv(world, buf, x->len[prev][k], COMM_F32, prev, k % 2, err)))
            return rc;
        ring_payload(x->seed, prev, k, want, x->len[prev][k]);
        if (memcmp(buf, want, x->len[prev][k] * sizeof(float)))
            return herr_set(err, HERR_RUNTIME, "message %d from rank %d differs", k, prev);
    }
    return comm_barrier(world, err);
}

static void test_send_recv_ring(void **state)
{
    (void)state;
    for (int n = 1; n <= MAXN; n++) {
        ring_ctx x = { .seed = tu_next(&g_rng) };
        for (int r = 0; r < n; r++)
            for (int k = 0; k < RING_MSGS; k++)
                x.len[r][k] = rand_count(512);
        harness h;
        run_ranks(&h, n, do_ring, &x, 0);
        expect_all_ok(&h, "send/recv ring");
    }
}

/* comm_sendrecv: RING_MSGS shifts around the ring (the context-parallel pattern), each
 * sending its own message k to the next rank and receiving the previous rank's; every
 * rank checks each payload; n == 1 is the copy to itself. */
static int do_sendrecv(harness *h, int rank, comm *world, hearth_err *err)
{
    ring_ctx *x = h->ctx;
    int n = h->n, next = (rank + 1) % n, prev = (rank + n - 1) % n, rc;
    float out[512], in[512], want[512];
    for (int k = 0; k < RING_MSGS; k++) {
        ring_payload(x->seed, rank, k, out, x->len[rank][k]);
        if ((rc = comm_sendrecv(world, out, x->len[rank][k], next, in, x->len[prev][k], prev,
                                COMM_F32, k, err)))
            return rc;
        ring_payload(x->seed, prev, k, want, x->len[prev][k]);
        if (memcmp(in, want, x->len[prev][k] * sizeof(float)))
            return herr_set(err, HERR_RUNTIME, "sendrecv %d from rank %d differs", k, prev);
    }
    return comm_barrier(world, err);
}

static void test_sendrecv_ring(void **state)
{
    (void)state;
    for (int n = 1; n <= MAXN; n++) {
        ring_ctx x = { .seed = tu_next(&g_rng) };
        for (int r = 0; r < n; r++)
            for (int k = 0; k < RING_MSGS; k++)
                x.len[r][k] = n == 1 ? 64 : rand_count(512);
        harness h;
        run_ranks(&h, n, do_sendrecv, &x, 0);
        expect_all_ok(&h, "sendrecv ring");
    }
}

/* ---- random group subsets ----------------------------------------------------------- */
typedef struct {
    int group_of[MAXN];           /* world rank -> group id */
    int members[MAXN][MAXN];      /* group id -> world ranks in group order */
    int size[MAXN];
    size_t count;
    float *in[MAXN];              /* per world rank */
    float *out_sum[MAXN], *out_gather[MAXN];
} grp_ctx;

static int do_groups(harness *h, int rank, comm *world, hearth_err *err)
{
    grp_ctx *x = h->ctx;
    int gi = x->group_of[rank], rc;
    comm *a = NULL, *b = NULL;
    /* two instances of the same member list: distinct communicators, paired in order */
    if ((rc = comm_group_create(world, x->members[gi], x->size[gi], &a, err)))
        return rc;
    if ((rc = comm_group_create(world, x->members[gi], x->size[gi], &b, err)))
        goto out;
    int me = comm_rank(a);
    if (comm_size(a) != x->size[gi] || comm_world_rank_of(a, me) != rank ||
        comm_rank(b) != me) {
        rc = herr_set(err, HERR_RUNTIME, "rank %d: wrong group rank/size", rank);
        goto out;
    }
    /* interleave: b's gather, a's allreduce, a world barrier in between */
    if ((rc = comm_all_gather(b, x->in[rank], x->out_gather[rank], x->count, COMM_F32, err)))
        goto out;
    if ((rc = comm_barrier(world, err)))
        goto out;
    rc = comm_allreduce(a, x->in[rank], x->out_sum[rank], x->count, COMM_F32, COMM_SUM, err);
out:
    comm_free(a);
    comm_free(b);
    return rc;
}

static void test_group_subsets(void **state)
{
    (void)state;
    for (int n = 1; n <= MAXN; n++) {
        for (int trial = 0; trial < 3; trial++) {
            grp_ctx *x = calloc(1, sizeof *x);
            int perm[MAXN];
            for (int i = 0; i < n; i++)
                perm[i] = i;
            for (int i = n - 1; i > 0; i--) {
                int j = tu_randint(&g_rng, 0, i + 1), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            /* cut the permutation into groups of random sizes */
            int ng = 0;
            for (int i = 0; i < n;) {
                int sz = tu_randint(&g_rng, 1, n - i + 1);
                for (int k = 0; k < sz; k++) {
                    x->members[ng][k] = perm[i + k];
                    x->group_of[perm[i + k]] = ng;
                }
                x->size[ng++] = sz;
                i += sz;
            }
            x->count = (size_t)tu_randint(&g_rng, 0, 400);
            for (int r = 0; r < n; r++) {
                x->in[r] = tu_falloc(x->count + 1);
                x->out_sum[r] = tu_falloc(x->count + 1);
                x->out_gather[r] = tu_falloc(x->count * MAXN + 1);
                tu_fill_normal(&g_rng, x->in[r], x->count, 0.f, 1.f);
            }
            harness h;
            run_ranks(&h, n, do_groups, x, 0);
            expect_all_ok(&h, "group subsets");
            float *want = tu_falloc(x->count * MAXN + 1);
            for (int r = 0; r < n; r++) {
                int gi = x->group_of[r];
                /* sum in group-rank order */
                for (size_t i = 0; i < x->count; i++) {
                    float acc = x->in[x->members[gi][0]][i];
                    for (int k = 1; k < x->size[gi]; k++)
                        acc += x->in[x->members[gi][k]][i];
                    want[i] = acc;
                }
                if (!tu_bitwise_equal(want, x->out_sum[r], x->count))
                    fail_msg("group allreduce: rank %d (group of %d) differs (seed %llu)", r,
                             x->size[gi], (unsigned long long)g_rng.seed);
                for (int k = 0; k < x->size[gi]; k++)
                    memcpy(want + (size_t)k * x->count, x->in[x->members[gi][k]],
                           x->count * sizeof(float));
                if (!tu_bitwise_equal(want, x->out_gather[r], x->count * (size_t)x->size[gi]))
                    fail_msg("group all_gather: rank %d differs (seed %llu)", r,
                             (unsigned long long)g_rng.seed);
            }
            free(want);
            for (int r = 0; r < n; r++) {
                free(x->in[r]);
                free(x->out_sum[r]);
                free(x->out_gather[r]);
            }
            free(x);
        }
    }
}

/* ---- errors --------------------------------------------------------------------------- */
typedef struct {
    int bad_rank;
    int which;      /* 0 count, 1 gatherv counts, 2 a2av counts, 3 kind, 4 recv size */
    int after_ok;   /* the follow-up allreduce gave the right answer */
} err_ctx;

static int do_mismatch(harness *h, int rank, comm *world, hearth_err *err)
{
    err_ctx *x = h->ctx;
    int n = h->n, bad = rank == x->bad_rank, rc = 0;
    float in[64], out[64 * MAXN];
    for (int i = 0; i < 64; i++)
        in[i] = (float)(rank + 1);
    size_t cnt[MAXN], cnt2[MAXN];
    for (int j = 0; j < n; j++)
        cnt[j] = cnt2[j] = 2;
    switch (x->which) {
    case 0:
        rc = comm_allreduce(world, in, out, bad ? 5 : 4, COMM_F32, COMM_SUM, err);
        break;
    case 1:
        if (bad)
            cnt[(rank + 1) % n] = 3;   /* expects 3 from the next rank, which sends 2 */
        rc = comm_all_gatherv(world, in, 2, out, cnt, NULL, COMM_F32, err);
        break;
    case 2:
        if (bad)
            cnt[0] = 1;   /* sends 1 to rank 0, which expects 2 */
        rc = comm_all_to_allv(world, in, cnt, NULL, out, cnt2, NULL, COMM_F32, err);
        break;
    case 3:
        rc = bad ? comm_broadcast(world, in, 4, COMM_F32, 0, err)
                 : comm_allreduce(world, in, out, 4, COMM_F32, COMM_SUM, err);
        break;
    case 4: {
        /* every rank sends 4 floats to the next; only the bad rank expects 3 */
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        if ((rc = comm_send(world, in, 4, COMM_F32, next, 7, err)))
            return rc;
        rc = comm_recv(world, out, bad ? 3 : 4, COMM_F32, prev, 7, err);
        break;
    }
    }
    /* the group must still work */
    float s[3] = { (float)rank, 1.f, 2.f * rank }, t[3];
    int rc2 = comm_allreduce(world, s, t, 3, COMM_F32, COMM_SUM, NULL);
    if (!rc2 && t[0] == (float)(n * (n - 1) / 2) && t[1] == (float)n && rank == 0)
        x->after_ok = 1;
    return rc;
}

static void test_mismatch(void **state)
{
    (void)state;
    static const char *const expect[] = { "count mismatch", "all_gatherv: count mismatch",
                                          "all_to_allv: count mismatch",
                                          "collective mismatch", "expected" };
    for (int which = 0; which < 5; which++) {
        for (int n = which == 4 ? 1 : 2; n <= MAXN; n += 3) {
            err_ctx x = { .bad_rank = tu_randint(&g_rng, 0, n), .which = which };
            harness h;
            run_ranks(&h, n, do_mismatch, &x, 10000);
            if (!x.after_ok)
                fail_msg("case %d n=%d: the group did not work after the error", which, n);
            for (int r = 0; r < n; r++) {
                if (which == 4 && r != x.bad_rank) {
                    if (h.rc[r])
                        fail_msg("recv size: rank %d failed: %s", r, h.err[r].msg);
                    continue;
                }
                if (h.rc[r] != HERR_RUNTIME)
                    fail_msg("case %d n=%d: rank %d returned %d, want an error", which, n, r,
                             h.rc[r]);
                if (!strstr(h.err[r].msg, expect[which]))
                    fail_msg("case %d n=%d: rank %d: message '%s' lacks '%s'", which, n, r,
                             h.err[r].msg, expect[which]);
            }
        }
    }
}

/* A rank that never comes: the others time out instead of hanging, and the group is
 * broken afterwards. */
static int do_absent(harness *h, int rank, comm *world, hearth_err *err)
{
    (void)h;
    if (rank == 1)
        return 0;
    int rc = comm_barrier(world, err);
    if (rc != HERR_RUNTIME || !strstr(err->msg, "timed out"))
        return herr_set(err, HERR_RUNTIME, "barrier returned %d: %s", rc, err->msg);
    float v = 1.f;
    rc = comm_allreduce(world, &v, &v, 1, COMM_F32, COMM_SUM, err);
    if (rc != HERR_RUNTIME)
        return herr_set(err, HERR_RUNTIME, "allreduce after a timeout returned %d", rc);
    rc = comm_recv(world, &v, 1, COMM_F32, 1, 0, err);
    if (rc != HERR_RUNTIME)
        return herr_set(err, HERR_RUNTIME, "recv after a timeout returned %d", rc);
    return 0;
}

static void test_timeout(void **state)
{
    (void)state;
    harness h;
    run_ranks(&h, 3, do_absent, NULL, 200);
    expect_all_ok(&h, "timeout");
}

/* A rank that fails on its own aborts the world: the ranks already waiting in a
 * collective or a receive, and every later operation (on a group created afterwards too),
 * fail at once instead of waiting; no timeout is set, so a missed wake-up would hang. */
static int do_abort(harness *h, int rank, comm *world, hearth_err *err)
{
    if (rank == 0) {
        struct timespec ts = { 0, 50 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        comm_local_world_abort(h->w);
        return 0;
    }
    float v = 1.f;
    int rc = rank == 1 ? comm_barrier(world, err)
                       : comm_recv(world, &v, 1, COMM_F32, 0, 0, err);
    if (rc != HERR_RUNTIME || !strstr(err->msg, "broken"))
        return herr_set(err, HERR_RUNTIME, "wait after an abort returned %d: %s", rc,
                        err->msg);
    int pair[2] = { 1, 2 };
    comm *g = NULL;
    if (rank <= 2) {
        if ((rc = comm_group_create(world, pair, 2, &g, err)))
            return rc;
        rc = comm_allreduce(g, &v, &v, 1, COMM_F32, COMM_SUM, err);
        comm_free(g);
        if (rc != HERR_RUNTIME)
            return herr_set(err, HERR_RUNTIME, "a new group after an abort returned %d", rc);
    }
    return 0;
}

static void test_abort(void **state)
{
    (void)state;
    harness h;
    run_ranks(&h, 3, do_abort, NULL, 0);
    expect_all_ok(&h, "abort");
}

static void test_bad_arguments(void **state)
{
    (void)state;
    comm_world *w;
    comm *c, *g;
    hearth_err err;
    assert_int_equal(comm_local_world_create(&w, 2, NULL, &err), 0);
    assert_int_equal(comm_local_world_rank(w, 0, &c, &err), 0);
    int r[3] = { 1, 1, 0 };
    assert_int_equal(comm_group_create(c, r, 2, &g, &err), HERR_RUNTIME);   /* duplicate */
    r[0] = 5;
    assert_int_equal(comm_group_create(c, r, 1, &g, &err), HERR_RUNTIME);   /* range */
    r[0] = 1;
    assert_int_equal(comm_group_create(c, r, 1, &g, &err), HERR_RUNTIME);   /* not a member */
    float v[2] = { 0 };
    assert_int_equal(comm_broadcast(c, v, 2, COMM_F32, 2, &err), HERR_RUNTIME);
    assert_int_equal(comm_allreduce(c, v, v, 2, COMM_U8, COMM_SUM, &err), HERR_RUNTIME);
    assert_int_equal(comm_send(c, v, 1, COMM_F32, 3, 0, &err), HERR_RUNTIME);
    assert_int_equal(comm_allreduce(c, NULL, v, 2, COMM_F32, COMM_SUM, &err), HERR_RUNTIME);
    assert_int_equal(comm_local_world_rank(w, 2, &g, &err), HERR_RUNTIME);
    comm_free(c);
    comm_local_world_free(w);
    assert_int_equal(comm_local_world_create(&w, 0, NULL, &err), HERR_RUNTIME);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_all_gatherv),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_all_to_allv),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_send_recv_ring),
        cmocka_unit_test(test_sendrecv_ring),
        cmocka_unit_test(test_group_subsets),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name("comm_local", tests, setup_seed, NULL);
}
