/* test_comm_nccl_gpu.cu - the nccl backend of comm.h (trainer/comm/comm_nccl.cu) against
 * the local backend: every collective runs on device buffers through NCCL and, on host
 * copies of the same fresh random inputs, through the local backend (threads); the
 * results must agree (integers bit for bit; floats to 1e-6 relative, which with one or two
 * ranks means exactly: a sum of two numbers does not depend on the order).
 * Receive buffers start from the same random contents on both sides, so an element that
 * one backend writes and the other does not (gaps between displacements) fails.
 *
 * One process, one rank, on device 0: every collective in F32/F64/I32/I64 (sum and max),
 * the in-place forms, displacements with gaps, a size-1 subgroup, send/recv to itself
 * (refused by the nccl backend, see comm.h).  With two or more devices (and
 * HEARTH_NCCL_TEST_RANKS unset or 2) the same cases also run with two ranks: two forked
 * processes on devices 0 and 1, the unique id exchanged through a pipe relay in the
 * parent (the blob exchange a bootstrap would do), plus subgroups and send/recv between
 * the two.  HEARTH_NCCL_TEST_RANKS=1 leaves the two-rank part out.
 * Plain TAP; without a CUDA device one skipped test.  HEARTH_SEED=N replays a run. */
#ifdef HEARTH_NO_NCCL
#include <stdio.h>
int main(void)
{
    printf("# device: not probed\n1..1\nok 1 - nccl communicator # SKIP built without nccl.h\n");
    return 0;
}
#else
extern "C" {
#include "comm/comm.h"
}
#include "comm/comm_nccl.h"
#include "tests/gpu/gpu_tap.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR 2
#define GAP 3   /* elements between displaced blocks */

enum { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALL_GATHER, K_ALL_GATHERV, K_BROADCAST, K_ALL_TO_ALL,
       K_ALL_TO_ALLV, K_BARRIER, K_N };
static const char *kname[K_N] = { "allreduce", "reduce_scatter", "all_gather", "all_gatherv",
                                  "broadcast", "all_to_all", "all_to_allv", "barrier" };
static const comm_dtype dtypes[4] = { COMM_F32, COMM_F64, COMM_I32, COMM_I64 };

/* One operation as every rank issues it. */
struct spec {
    int kind, n, root, inplace, displs;
    comm_dtype dt;
    comm_op op;
    size_t count;
    size_t m[MAXR][MAXR];   /* all_to_allv: i sends m[i][j] to j; all_gatherv: m[i][0] */
};

static size_t total_row(const struct spec *s, int r)
{
    size_t t = 0;
    for (int j = 0; j < s->n; j++)
        t += s->m[r][j];
    return t;
}

static size_t total_col(const struct spec *s, int c)
{
    size_t t = 0;
    for (int i = 0; i < s->n; i++)
        t += s->m[i][c];
    return t;
}

/* Element sizes of rank r's send and recv buffers. */
static void sizes(const struct spec *s, int r, size_t *ns, size_t *nr)
{
    size_t n = (size_t)s->n, c = s->count, gaps = s->displs ? n * GAP : 0;
    switch (s->kind) {
    case K_ALLREDUCE: *ns = c; *nr = c; break;
    case K_REDUCE_SCATTER: *ns = n * c; *nr = c; break;
    case K_ALL_GATHER: *ns = c; *nr = n * c; break;
    case K_ALL_GATHERV: {
        size_t t = 0;
        for (int i = 0; i < s->n; i++)
            t += s->m[i][0];
        *ns = s->m[r][0];
        *nr = t + gaps;
        break;
    }
    case K_BROADCAST: *ns = 0; *nr = c; break;
    case K_ALL_TO_ALL: *ns = n * c; *nr = n * c; break;
    case K_ALL_TO_ALLV: *ns = total_row(s, r) + gaps; *nr = total_col(s, r) + gaps; break;
    default: *ns = *nr = 0; break;
    }
}

/* Issues rank r's call of s on c (host or device buffers alike). */
static int call_op(comm *c, const struct spec *s, int r, const void *send, void *recv,
                   hearth_err *err)
{
    size_t sc[MAXR], sd[MAXR], rc[MAXR], rd[MAXR], so = 0, ro = 0;
    for (int j = 0; j < s->n; j++) {
        if (s->kind == K_ALL_GATHERV) {
            sc[j] = 0;
            rc[j] = s->m[j][0];
        } else {
            sc[j] = s->m[r][j];
            rc[j] = s->m[j][r];
        }
        sd[j] = so;
        rd[j] = ro;
        so += sc[j] + (s->displs ? GAP : 0);
        ro += rc[j] + (s->displs ? GAP : 0);
    }
    switch (s->kind) {
    case K_ALLREDUCE:
        return comm_allreduce(c, send, recv, s->count, s->dt, s->op, err);
    case K_REDUCE_SCATTER:
        return comm_reduce_scatter(c, send, recv, s->count, s->dt, s->op, err);
    case K_ALL_GATHER:
        return comm_all_gather(c, send, recv, s->count, s->dt, err);
    case K_ALL_GATHERV:
        return comm_all_gatherv(c, send, s->m[r][0], recv, rc, s->displs ? rd : NULL, s->dt,
                                err);
    case K_BROADCAST:
        return comm_broadcast(c, recv, s->count, s->dt, s->root, err);
    case K_ALL_TO_ALL:
        return comm_all_to_all(c, send, recv, s->count, s->dt, err);
    case K_ALL_TO_ALLV:
        return comm_all_to_allv(c, send, sc, s->displs ? sd : NULL, recv, rc,
                                s->displs ? rd : NULL, s->dt, err);
    default:
        return comm_barrier(c, err);
    }
}

static void fill(uint64_t *rng, comm_dtype dt, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int64_t iv = (int64_t)(gu_next(rng) % 2001) - 1000;
        switch (dt) {
        case COMM_F32: ((float *)p)[i] = gu_uniform(rng, -1.f, 1.f); break;
        case COMM_F64: ((double *)p)[i] = (double)gu_uniform(rng, -1.f, 1.f) * (1.0 + 1e-9 * (double)iv); break;
        case COMM_I32: ((int32_t *)p)[i] = (int32_t)iv; break;
        case COMM_I64: ((int64_t *)p)[i] = iv * 1000000007ll; break;
        default: ((uint8_t *)p)[i] = (uint8_t)iv; break;
        }
    }
}

/* Rank i's inputs of one case, the same in every process: send, and the recv buffer's
 * initial contents. */
struct inputs {
    void *send, *recv;
    size_t ns, nr;
};

static void make_inputs(const struct spec *s, uint64_t case_seed, int i, struct inputs *in)
{
    size_t es = comm_dtype_size(s->dt);
    uint64_t rng = case_seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull + 1;
    sizes(s, i, &in->ns, &in->nr);
    in->send = calloc(in->ns + 1, es);
    in->recv = calloc(in->nr + 1, es);
    fill(&rng, s->dt, in->send, in->ns);
    fill(&rng, s->dt, in->recv, in->nr);
}

/* ---- the reference: the local backend, one thread per rank, on host copies ---------- */
struct ref_job {
    comm_world *w;
    const struct spec *s;
    int rank, rc;
    struct inputs *in;
    hearth_err err;
};

static void *ref_thread(void *arg)
{
    struct ref_job *j = (struct ref_job *)arg;
    comm *c = NULL;
    j->rc = comm_local_world_rank(j->w, j->rank, &c, &j->err);
    if (!j->rc) {
        size_t es = comm_dtype_size(j->s->dt);
        const void *send = j->in->send;
        void *recv = j->in->recv;
        /* in place on the local backend too, from the same layout as on the device */
        void *buf = NULL;
        if (j->s->inplace && j->s->kind != K_ALLREDUCE) {
            size_t big = (size_t)j->s->n * j->s->count;
            buf = malloc(big * es + 1);
            if (j->s->kind == K_REDUCE_SCATTER) {
                memcpy(buf, send, big * es);
                send = buf;
                recv = (char *)buf + (size_t)j->rank * j->s->count * es;
            } else {   /* all_gather */
                memcpy(buf, recv, big * es);
                memcpy((char *)buf + (size_t)j->rank * j->s->count * es, send, j->s->count * es);
                recv = buf;
                send = (char *)buf + (size_t)j->rank * j->s->count * es;
            }
        } else if (j->s->inplace) {
            memcpy(recv, send, j->s->count * es);
            send = recv;
        }
        j->rc = call_op(c, j->s, j->rank, send, recv, &j->err);
        if (buf) {
            if (j->s->kind == K_REDUCE_SCATTER)
                memcpy(j->in->recv, recv, j->s->count * es);
            else
                memcpy(j->in->recv, buf, j->in->nr * es);
            free(buf);
        }
    }
    comm_free(c);
    return NULL;
}

/* Runs s on the local backend over all ranks' inputs (their recv buffers get the
 * results). */
static int ref_run(const struct spec *s, struct inputs *in, hearth_err *err)
{
    comm_world *w;
    comm_local_opts o = { 20000 };
    int rc = comm_local_world_create(&w, s->n, &o, err);
    if (rc)
        return rc;
    struct ref_job jobs[MAXR];
    pthread_t th[MAXR];
    for (int i = 0; i < s->n; i++) {
        jobs[i].w = w;
        jobs[i].s = s;
        jobs[i].rank = i;
        jobs[i].rc = 0;
        jobs[i].in = &in[i];
        jobs[i].err.msg[0] = 0;
        pthread_create(&th[i], NULL, ref_thread, &jobs[i]);
    }
    for (int i = 0; i < s->n; i++)
        pthread_join(th[i], NULL);
    comm_local_world_free(w);
    for (int i = 0; i < s->n; i++)
        if (jobs[i].rc) {
            herr_set(err, jobs[i].rc, "local rank %d: %s", i, jobs[i].err.msg);
            return jobs[i].rc;
        }
    return 0;
}

/* ---- the nccl side ------------------------------------------------------------------ */
/* Compares n elements; returns the number of mismatches and the worst relative error. */
static size_t compare(comm_dtype dt, const void *got, const void *want, size_t n, double *worst)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g, w;
        switch (dt) {
        case COMM_F32: g = ((const float *)got)[i]; w = ((const float *)want)[i]; break;
        case COMM_F64: g = ((const double *)got)[i]; w = ((const double *)want)[i]; break;
        case COMM_I32:
            bad += ((const int32_t *)got)[i] != ((const int32_t *)want)[i];
            continue;
        default:
            bad += ((const int64_t *)got)[i] != ((const int64_t *)want)[i];
            continue;
        }
        double e = fabs(g - w) / (fabs(w) > 1e-30 ? fabs(w) : 1.0);
        if (isnan(g) != isnan(w) || (!isnan(w) && !(e <= 1e-6)))
            bad++;
        if (!isnan(e) && e > *worst)
            *worst = e;
    }
    return bad;
}

/* Runs s as rank `me` on c (device buffers) and compares with the local backend.
 * Returns 0 on agreement; the reason goes to why. */
static int run_case(comm *c, const struct spec *s, int me, uint64_t case_seed, char *why,
                    size_t whylen)
{
    struct inputs in[MAXR];
    size_t es = comm_dtype_size(s->dt);
    hearth_err err;
    err.msg[0] = 0;
    for (int i = 0; i < s->n; i++)
        make_inputs(s, case_seed, i, &in[i]);
    size_t ns = in[me].ns, nr = in[me].nr;
    /* the device side starts from the same bytes */
    size_t big = (size_t)s->n * s->count;
    size_t dev_n = (s->inplace && s->kind != K_ALLREDUCE) ? big : nr;
    void *dsend = NULL, *drecv = NULL;
    int fail = 0;
    void *got = calloc(dev_n + 1, es);
    if (cudaMalloc(&dsend, (ns + 1) * es) != cudaSuccess ||
        cudaMalloc(&drecv, (dev_n + 1) * es) != cudaSuccess) {
        snprintf(why, whylen, "cudaMalloc failed");
        fail = 1;
        goto out;
    }
    {
        const void *send = dsend;
        void *recv = drecv;
        cudaMemcpy(dsend, in[me].send, ns * es, cudaMemcpyHostToDevice);
        if (s->inplace && s->kind == K_REDUCE_SCATTER) {
            cudaMemcpy(drecv, in[me].send, big * es, cudaMemcpyHostToDevice);
            send = drecv;
            recv = (char *)drecv + (size_t)me * s->count * es;
        } else if (s->inplace && s->kind == K_ALL_GATHER) {
            cudaMemcpy(drecv, in[me].recv, big * es, cudaMemcpyHostToDevice);
            cudaMemcpy((char *)drecv + (size_t)me * s->count * es, in[me].send, s->count * es,
                       cudaMemcpyHostToDevice);
            send = (char *)drecv + (size_t)me * s->count * es;
        } else if (s->inplace) {   /* allreduce */
            cudaMemcpy(drecv, in[me].send, nr * es, cudaMemcpyHostToDevice);
            send = drecv;
        } else {
            cudaMemcpy(drecv, in[me].recv, nr * es, cudaMemcpyHostToDevice);
        }
        int rc = call_op(c, s, me, send, recv, &err);
        if (rc) {
            snprintf(why, whylen, "nccl: %s", err.msg);
            fail = 1;
            goto out;
        }
        if (s->inplace && s->kind == K_REDUCE_SCATTER)
            cudaMemcpy(got, recv, nr * es, cudaMemcpyDeviceToHost);
        else if (cudaMemcpy(got, drecv, nr * es, cudaMemcpyDeviceToHost) != cudaSuccess) {
            snprintf(why, whylen, "download failed");
            fail = 1;
            goto out;
        }
    }
    if (ref_run(s, in, &err)) {
        snprintf(why, whylen, "reference: %s", err.msg);
        fail = 1;
        goto out;
    }
    {
        double worst = 0;
        size_t bad = compare(s->dt, got, in[me].recv, nr, &worst);
        if (bad) {
            int reduce = s->kind == K_ALLREDUCE || s->kind == K_REDUCE_SCATTER;
            snprintf(why, whylen, "%s%s%s: %zu of %zu elements differ (worst rel %.2e)",
                     comm_dtype_name(s->dt), !reduce ? "" : s->op == COMM_MAX ? " max" : " sum",
                     s->inplace ? " in place" : "", bad, nr, worst);
            fail = 1;
        }
    }
out:
    cudaFree(dsend);
    cudaFree(drecv);
    free(got);
    for (int i = 0; i < s->n; i++) {
        free(in[i].send);
        free(in[i].recv);
    }
    return fail;
}

/* The cases of one kind for a group of n: every dtype, both reductions where they apply,
 * in place where allowed, displacements with gaps on every other dtype. */
static int run_kind(comm *c, int kind, int n, int me, uint64_t *rng, char *why, size_t whylen)
{
    int fails = 0;
    for (int d = 0; d < 4; d++) {
        for (int variant = 0; variant < 4; variant++) {
            struct spec s;
            memset(&s, 0, sizeof s);
            s.kind = kind;
            s.n = n;
            s.dt = dtypes[d];
            int reduce = kind == K_ALLREDUCE || kind == K_REDUCE_SCATTER;
            int can_inplace = reduce || kind == K_ALL_GATHER;
            s.op = (variant & 1) ? COMM_MAX : COMM_SUM;
            s.inplace = (variant & 2) != 0;
            if ((variant & 1) && !reduce)
                continue;
            if (s.inplace && !can_inplace)
                continue;
            /* counts: odd sizes, sometimes zero for one peer in the v-variants */
            s.count = 1 + (size_t)(gu_next(rng) % 3000);
            if (kind == K_BROADCAST)
                s.root = (int)(gu_next(rng) % (uint64_t)n);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++)
                    s.m[i][j] = (gu_next(rng) % 5 == 0) ? 0 : (size_t)(gu_next(rng) % 1500);
            s.displs = (d & 1);
            if (kind == K_BARRIER && (d || variant))
                continue;
            uint64_t cs = gu_next(rng);
            char w[600];
            w[0] = 0;
            if (run_case(c, &s, me, cs, w, sizeof w)) {
                if (!fails)
                    snprintf(why, whylen, "%s", w);
                fails++;
            }
        }
    }
    return fails;
}

/* ---- the pipe relay for two ranks: the blob all-gather a bootstrap provides --------- */
struct relay {
    int up, down;   /* this rank writes to up, reads the gathered blobs from down */
    int size;
};

static int full_write(int fd, const void *p, size_t n)
{
    const char *c = (const char *)p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int full_read(int fd, void *p, size_t n)
{
    char *c = (char *)p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int relay_allgather(void *ctx, const void *mine, size_t n, void *all, hearth_err *err)
{
    struct relay *r = (struct relay *)ctx;
    uint64_t len = n;
    if (full_write(r->up, &len, sizeof len) || full_write(r->up, mine, n) ||
        full_read(r->down, all, n * (size_t)r->size))
        return herr_set(err, HERR_RUNTIME, "pipe relay failed");
    return 0;
}

static int single_allgather(void *ctx, const void *mine, size_t n, void *all, hearth_err *err)
{
    (void)ctx;
    (void)err;
    memcpy(all, mine, n);
    return 0;
}

/* One child of the two-rank run: returns the number of failures as its exit status. */
static int two_rank_child(int rank, struct relay *rl, uint64_t seed)
{
    alarm(240);   /* a hang fails the test instead of blocking the machine */
    hearth_err err;
    err.msg[0] = 0;
    comm *w = NULL;
    int fails = 0;
    if (comm_nccl_world_create(&w, rank, 2, rank, relay_allgather, rl, &err)) {
        printf("# r%d: world: %s\n", rank, err.msg);
        return 1;
    }
    close(rl->up);
    close(rl->down);
    uint64_t rng = seed ^ 0xABCDEF12345ull;   /* the same stream on both ranks */
    for (int k = 0; k < K_N; k++) {
        char why[700];
        why[0] = 0;
        int f = run_kind(w, k, 2, rank, &rng, why, sizeof why);
        if (f)
            printf("# r%d: %s: %d case(s) failed: %s\n", rank, kname[k], f, why);
        fails += f;
    }
    /* subgroups: both ranks in reverse order, then each alone */
    int rev[2] = { 1, 0 }, alone[1] = { rank };
    comm *g = NULL, *g1 = NULL;
    if (comm_group_create(w, rev, 2, &g, &err) || comm_rank(g) != 1 - rank ||
        comm_world_rank_of(g, 0) != 1) {
        printf("# r%d: reversed subgroup: %s\n", rank, err.msg);
        fails++;
    } else {
        char why[700];
        for (int k = 0; k < K_N; k++)
            if (run_kind(g, k, 2, comm_rank(g), &rng, why, sizeof why)) {
                printf("# r%d: reversed subgroup %s: %s\n", rank, kname[k], why);
                fails++;
            }
    }
    if (comm_group_create(w, alone, 1, &g1, &err) || comm_size(g1) != 1) {
        printf("# r%d: size-1 subgroup: %s\n", rank, err.msg);
        fails++;
    } else {
        char why[700];
        uint64_t r1 = rng ^ (uint64_t)(rank + 1);   /* independent groups: own stream */
        if (run_kind(g1, K_ALLREDUCE, 1, 0, &r1, why, sizeof why)) {
            printf("# r%d: size-1 subgroup allreduce: %s\n", rank, why);
            fails++;
        }
    }
    /* send/recv: 0 -> 1 then 1 -> 0 */
    {
        size_t n = 777;
        uint64_t r2 = rng;
        int32_t *a = (int32_t *)malloc(n * 4), *b = (int32_t *)malloc(n * 4);
        fill(&r2, COMM_I32, a, n);
        int32_t *d = NULL;
        cudaMalloc(&d, n * 4);
        for (int dir = 0; dir < 2; dir++) {
            int sender = dir;
            int rc;
            if (rank == sender) {
                cudaMemcpy(d, a, n * 4, cudaMemcpyHostToDevice);
                rc = comm_send(w, d, n, COMM_I32, 1 - rank, 7, &err);
            } else {
                cudaMemset(d, 0, n * 4);
                rc = comm_recv(w, d, n, COMM_I32, 1 - rank, 7, &err);
                cudaMemcpy(b, d, n * 4, cudaMemcpyDeviceToHost);
                if (!rc && memcmp(a, b, n * 4)) {
                    printf("# r%d: recv from %d: wrong data\n", rank, sender);
                    fails++;
                }
            }
            if (rc) {
                printf("# r%d: send/recv: %s\n", rank, err.msg);
                fails++;
            }
        }
        cudaFree(d);
        free(a);
        free(b);
    }
    /* NaN under max: reported, not checked (NCCL decides; see comm.h) */
    {
        float h[2] = { rank == 0 ? NAN : 1.0f, 2.0f }, *d = NULL;
        cudaMalloc(&d, sizeof h);
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
        if (!comm_allreduce(w, d, d, 2, COMM_F32, COMM_MAX, &err)) {
            cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
            if (rank == 0)
                printf("# nccl max(NaN, 1) = %g (the local backend gives nan)\n", (double)h[0]);
        }
        cudaFree(d);
    }
    comm_free(g1);
    comm_free(g);
    comm_free(w);
    fflush(stdout);
    return fails > 100 ? 100 : fails;
}

/* Forks the two ranks and relays their blobs; returns the number of failures (or -1 if
 * the run could not start). */
static int two_rank_run(uint64_t seed, char *why, size_t whylen)
{
    int up[2][2], down[2][2];
    pid_t pid[2];
    fflush(stdout);
    for (int r = 0; r < 2; r++)
        if (pipe(up[r]) || pipe(down[r])) {
            snprintf(why, whylen, "pipe failed");
            return -1;
        }
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            struct relay rl = { up[r][1], down[r][0], 2 };
            for (int q = 0; q < 2; q++) {
                close(up[q][0]);
                close(down[q][1]);
                if (q != r) {
                    close(up[q][1]);
                    close(down[q][0]);
                }
            }
            _exit(two_rank_child(r, &rl, seed));
        }
    }
    for (int r = 0; r < 2; r++) {
        close(up[r][1]);
        close(down[r][0]);
    }
    signal(SIGPIPE, SIG_IGN);   /* a rank that died must not take this process along */
    /* relay: each round one blob from each rank, the concatenation back to both */
    for (;;) {
        uint64_t len[2];
        char *blob[2] = { NULL, NULL };
        int ok = 1;
        for (int r = 0; r < 2 && ok; r++) {
            ok = !full_read(up[r][0], &len[r], sizeof len[r]) && len[r] <= (1u << 20);
            if (ok) {
                blob[r] = (char *)malloc(len[r] + 1);
                ok = !full_read(up[r][0], blob[r], len[r]);
            }
        }
        if (ok && len[0] == len[1])
            for (int r = 0; r < 2; r++)
                for (int q = 0; q < 2; q++)
                    full_write(down[r][1], blob[q], len[q]);
        free(blob[0]);
        free(blob[1]);
        if (!ok || len[0] != len[1])
            break;
    }
    for (int r = 0; r < 2; r++) {
        close(up[r][0]);
        close(down[r][1]);
    }
    int fails = 0;
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        if (WIFEXITED(st))
            fails += WEXITSTATUS(st);
        else {
            fails++;
            snprintf(why, whylen, "rank %d died (signal %d)", r,
                     WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        }
    }
    return fails;
}

/* The device count, asked in a child so that this process starts CUDA only after the
 * two-rank children are forked (a forked child cannot use its parent's CUDA state). */
static int probe_devices(void)
{
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0;
        if (n > 0) {
            cudaDeviceProp prop;
            cudaGetDeviceProperties(&prop, 0);
            printf("# device: %s (sm_%d%d), %d device(s)\n", prop.name, prop.major, prop.minor, n);
        } else {
            printf("# device: none\n");
        }
        fflush(stdout);
        _exit(n > 100 ? 100 : n);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) < 0 || !WIFEXITED(st))
        return 0;
    return WEXITSTATUS(st);
}

static int ntap;
static int tap(int ok, const char *name, const char *note)
{
    printf("%s %d - %s%s%s\n", ok ? "ok" : "not ok", ++ntap, name, note && *note ? " # " : "",
           note ? note : "");
    return ok ? 0 : 1;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ndev = probe_devices();
    if (ndev < 1) {
        printf("1..1\nok 1 - nccl communicator # SKIP no CUDA device\n");
        return 0;
    }
    uint64_t seed = gu_seed();
    printf("# seed %llu (NCCL_NVLS_ENABLE=%s)\n", (unsigned long long)seed,
           getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "unset");
    int failures = 0;

    /* two ranks first: forked before this process touches CUDA */
    const char *nr = getenv("HEARTH_NCCL_TEST_RANKS");
    int two = ndev >= 2 && !(nr && atoi(nr) == 1);
    int two_fails = 0;
    char two_why[300] = "";
    if (two)
        two_fails = two_rank_run(seed, two_why, sizeof two_why);

    /* one rank, one process */
    uint64_t rng = seed;
    hearth_err err;
    err.msg[0] = 0;
    comm *w = NULL;
    if (comm_nccl_world_create(&w, 0, 1, 0, single_allgather, NULL, &err)) {
        failures += tap(0, "nccl world of one rank", err.msg);
        printf("1..%d\n", ntap);
        return 1;
    }
    failures += tap(comm_rank(w) == 0 && comm_size(w) == 1 && comm_world_rank_of(w, 0) == 0 &&
                        comm_nccl_stream(w) != NULL && getenv("NCCL_NVLS_ENABLE"),
                    "world of one rank (rank, size, stream, NCCL_NVLS_ENABLE set)", NULL);
    for (int k = 0; k < K_N; k++) {
        char why[700] = "", name[96];
        int f = run_kind(w, k, 1, 0, &rng, why, sizeof why);
        snprintf(name, sizeof name, "%s, 1 rank, f32/f64/i32/i64 vs local backend", kname[k]);
        failures += tap(!f, name, why);
    }
    /* a size-1 subgroup (twice: distinct communicators), used, then freed before the world */
    {
        int me[1] = { 0 }, notme[1] = { 1 };
        comm *g = NULL, *g2 = NULL, *bad = NULL;
        int rc = comm_group_create(w, me, 1, &g, &err);
        int rc2 = rc ? rc : comm_group_create(g, me, 1, &g2, &err);
        char why[700] = "";
        int ok = !rc && !rc2 && comm_size(g) == 1 && comm_rank(g2) == 0 &&
                 comm_world_rank_of(g, 0) == 0 && comm_nccl_stream(g) != comm_nccl_stream(w);
        if (ok)
            ok = !run_kind(g, K_ALLREDUCE, 1, 0, &rng, why, sizeof why) &&
                 !run_kind(g2, K_ALL_TO_ALLV, 1, 0, &rng, why, sizeof why);
        /* a list without the caller, or out of the world, is refused */
        ok = ok && comm_group_create(w, notme, 1, &bad, &err) == HERR_RUNTIME && !bad;
        comm_free(g2);
        comm_free(g);
        if (!*why && !ok)
            snprintf(why, sizeof why, "%s", err.msg);
        failures += tap(ok, "size-1 subgroups (two instances), bad lists refused", why);
    }
    /* send/recv to itself: refused (the nccl send waits for its recv), handle still usable */
    {
        int32_t *d = NULL;
        cudaMalloc(&d, 16 * sizeof *d);
        int rs = comm_send(w, d, 16, COMM_I32, 0, 1, &err);
        int rr = comm_recv(w, d, 16, COMM_I32, 0, 1, &err);
        char why[700] = "";
        int ok = rs == HERR_RUNTIME && rr == HERR_RUNTIME &&
                 !run_kind(w, K_BARRIER, 1, 0, &rng, why, sizeof why);
        cudaFree(d);
        failures += tap(ok, "send/recv to itself refused, handle usable after",
                        ok ? "not possible on NCCL with a blocking send: checked that it is refused" : why);
    }
    comm_free(w);

    if (two) {
        if (two_fails) {
            char why[400];
            snprintf(why, sizeof why, "%d failure(s)%s%s (see the # r lines)", two_fails,
                     *two_why ? ": " : "", two_why);
            failures += tap(0, "two ranks (2 processes, devices 0 and 1)", why);
        } else {
            failures += tap(1, "two ranks (2 processes, devices 0 and 1): every collective, subgroups, send/recv",
                            NULL);
        }
    } else {
        tap(1, "two ranks", ndev < 2 ? "SKIP needs 2 devices" : "SKIP HEARTH_NCCL_TEST_RANKS=1");
    }
    printf("1..%d\n", ntap);
    if (failures)
        printf("# replay with HEARTH_SEED=%llu\n", (unsigned long long)seed);
    return failures ? 1 : 0;
}
#endif
