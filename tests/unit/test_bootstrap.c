/* test_bootstrap.c - the rank bootstrap: the TCP rendezvous with N threads on 127.0.0.1
 * (fresh random blobs and sizes, several rounds, a large blob), its failure cases (a rank
 * that never comes, no rank 0, mismatched sizes, a stray connection), the environment
 * variable parsing, the single-rank case and --check-bootstrap's parsing.  PMIx needs a
 * launcher: tests/cli/bootstrap.sh runs it under mpirun (and srun where present). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "cli.h"
#include "tests/unit/support/testutil.h"

#define MAX_RANKS 8
#define MAX_ROUNDS 4

/* A port that was free a moment ago (the kernel's choice for port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Blob of rank r in round k: bytes from a generator seeded by (seed, k, r), so every
 * thread can compute every other rank's expected bytes. */
static void make_blob(uint64_t seed, int k, int r, unsigned char *p, size_t n)
{
    tu_rng g;
    tu_rng_init(&g, seed * 1000003u + (uint64_t)k * 131u + (uint64_t)r);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)tu_next(&g);
}

typedef struct {
    bootstrap_tcp_opts o;
    uint64_t seed;
    int rounds;
    size_t sizes[MAX_ROUNDS];    /* bytes per rank in each round */
    size_t bad_size;             /* nonzero: this rank passes this size in round 0 */
    /* results */
    int rc_init, rc_gather;
    hearth_err err;
    int rank, size, local_rank;
    int mismatch_round;          /* -1: every round matched */
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    bootstrap *b = NULL;
    j->mismatch_round = -1;
    j->rc_init = bootstrap_init_tcp(&b, &j->o, &j->err);
    if (j->rc_init)
        return NULL;
    j->rank = bootstrap_rank(b);
    j->size = bootstrap_size(b);
    j->local_rank = bootstrap_local_rank(b);
    for (int k = 0; k < j->rounds && !j->rc_gather; k++) {
        size_t n = j->sizes[k], mine_n = (k == 0 && j->bad_size) ? j->bad_size : n;
        unsigned char *mine = malloc(mine_n), *all = calloc((size_t)j->size, n + 1);
        unsigned char *want = malloc(n);
        if (!mine || !all || !want) {   /* no cmocka asserts off the main thread */
            j->rc_gather = HERR_NOMEM;
            free(mine);
            free(all);
            free(want);
            break;
        }
        make_blob(j->seed, k, j->rank, mine, mine_n);
        j->rc_gather = bootstrap_allgather_blob(b, mine, mine_n, all, &j->err);
        for (int r = 0; !j->rc_gather && r < j->size; r++) {
            make_blob(j->seed, k, r, want, n);
            if (memcmp(all + (size_t)r * n, want, n) && j->mismatch_round < 0)
                j->mismatch_round = k;
        }
        free(mine);
        free(all);
        free(want);
    }
    bootstrap_free(b);
    return NULL;
}

/* Runs jobs[0..n) as threads; present[i] == 0 leaves rank i out. */
static void run_ranks(rank_job *jobs, int n, const int *present)
{
    pthread_t th[MAX_RANKS];
    for (int i = 0; i < n; i++)
        if (!present || present[i])
            assert_int_equal(pthread_create(&th[i], NULL, rank_main, &jobs[i]), 0);
    for (int i = 0; i < n; i++)
        if (!present || present[i])
            pthread_join(th[i], NULL);
}

static void setup_jobs(rank_job *jobs, int size, int port, int timeout_ms, uint64_t seed,
                       int rounds, const size_t *sizes)
{
    memset(jobs, 0, sizeof(rank_job) * (size_t)size);
    for (int i = 0; i < size; i++) {
        jobs[i].o = (bootstrap_tcp_opts){ .rank = i, .size = size, .local_rank = -1,
                                          .master_addr = "127.0.0.1", .master_port = port,
                                          .timeout_ms = timeout_ms };
        jobs[i].seed = seed;
        jobs[i].rounds = rounds;
        memcpy(jobs[i].sizes, sizes, sizeof(size_t) * (size_t)rounds);
    }
}

static void expect_msg(const hearth_err *err, const char *needle, uint64_t seed)
{
    if (!strstr(err->msg, needle))
        fail_msg("message '%s' lacks '%s' (seed %llu)", err->msg, needle,
                 (unsigned long long)seed);
}

/* N ranks, several rounds of fresh random sizes (one large), every view exact. */
static void test_allgather_threads(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    static const int sizes_to_try[] = { 2, 3, 5, MAX_RANKS };
    for (size_t t = 0; t < sizeof sizes_to_try / sizeof *sizes_to_try; t++) {
        int size = sizes_to_try[t];
        size_t sizes[MAX_ROUNDS];
        for (int k = 0; k < MAX_ROUNDS; k++)
            sizes[k] = (size_t)tu_randint(&g, 1, 600);
        sizes[tu_randint(&g, 0, MAX_ROUNDS)] = (size_t)tu_randint(&g, 100000, 300000);
        rank_job jobs[MAX_RANKS];
        setup_jobs(jobs, size, free_port(), 20000, tu_next(&g), MAX_ROUNDS, sizes);
        run_ranks(jobs, size, NULL);
        for (int i = 0; i < size; i++) {
            if (jobs[i].rc_init || jobs[i].rc_gather)
                fail_msg("size %d rank %d: %s (seed %llu)", size, i, jobs[i].err.msg,
                         (unsigned long long)g.seed);
            assert_int_equal(jobs[i].rank, i);
            assert_int_equal(jobs[i].size, size);
            assert_int_equal(jobs[i].local_rank, i);   /* one host: computed = rank */
            if (jobs[i].mismatch_round >= 0)
                fail_msg("size %d rank %d: wrong bytes in round %d (seed %llu)", size, i,
                         jobs[i].mismatch_round, (unsigned long long)g.seed);
        }
    }
}

/* A rank that never comes: every other rank fails within the timeout, and rank 0 names
 * the missing one; the peers relay rank 0's reason. */
static void test_missing_rank_times_out(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    int size = 4, missing = tu_randint(&g, 1, size);
    size_t sizes[1] = { 16 };
    rank_job jobs[MAX_RANKS];
    setup_jobs(jobs, size, free_port(), 700, tu_next(&g), 1, sizes);
    int present[MAX_RANKS] = { 1, 1, 1, 1 };
    present[missing] = 0;
    double t0 = now_s();
    run_ranks(jobs, size, present);
    double took = now_s() - t0;
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d (of 4)", missing);
    assert_int_equal(jobs[0].rc_init, HERR_RUNTIME);
    expect_msg(&jobs[0].err, needle, g.seed);
    expect_msg(&jobs[0].err, "timed out", g.seed);
    for (int i = 1; i < size; i++) {
        if (i == missing)
            continue;
        assert_int_equal(jobs[i].rc_init, HERR_RUNTIME);
        expect_msg(&jobs[i].err, "rank 0 gave up", g.seed);
        expect_msg(&jobs[i].err, needle, g.seed);
    }
    /* never before the timeout; the upper bound only tells a timeout from a hang (a busy
     * 2-core machine may stall the threads for seconds) */
    if (took < 0.6 || took > 60.0)
        fail_msg("took %.2f s for a 0.7 s timeout", took);
}

/* No rank 0: the peer gives up after its timeout, naming rank 0 and the address. */
static void test_no_master_times_out(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    int port = free_port();
    size_t sizes[1] = { 8 };
    rank_job jobs[MAX_RANKS];
    setup_jobs(jobs, 3, port, 400, tu_next(&g), 1, sizes);
    int present[MAX_RANKS] = { 0, 0, 1 };
    double t0 = now_s();
    run_ranks(jobs, 3, present);
    double took = now_s() - t0;
    char addr[64];
    snprintf(addr, sizeof addr, "rank 0 at 127.0.0.1:%d", port);
    assert_int_equal(jobs[2].rc_init, HERR_RUNTIME);
    expect_msg(&jobs[2].err, "rank 2: timed out", g.seed);
    expect_msg(&jobs[2].err, addr, g.seed);
    if (took < 0.35 || took > 60.0)   /* as above: before the timeout never, a hang never */
        fail_msg("took %.2f s for a 0.4 s timeout", took);
}

/* One rank passes a different size: every rank fails, and the error names it. */
static void test_size_mismatch(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    int size = 3, bad = tu_randint(&g, 1, size);
    size_t sizes[1] = { (size_t)tu_randint(&g, 8, 64) };
    rank_job jobs[MAX_RANKS];
    setup_jobs(jobs, size, free_port(), 5000, tu_next(&g), 1, sizes);
    jobs[bad].bad_size = sizes[0] + (size_t)tu_randint(&g, 1, 9);
    run_ranks(jobs, size, NULL);
    char needle[32];
    snprintf(needle, sizeof needle, "rank %d sent %zu bytes", bad, jobs[bad].bad_size);
    for (int i = 0; i < size; i++) {
        assert_int_equal(jobs[i].rc_init, 0);
        assert_int_equal(jobs[i].rc_gather, HERR_RUNTIME);
        expect_msg(&jobs[i].err, needle, g.seed);
    }
}

/* Two ranks disagree on WORLD_SIZE: rank 0 refuses, naming both sizes. */
static void test_world_size_mismatch(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    size_t sizes[1] = { 4 };
    rank_job jobs[MAX_RANKS];
    setup_jobs(jobs, 2, free_port(), 3000, tu_next(&g), 1, sizes);
    jobs[1].o.size = 3;
    run_ranks(jobs, 2, NULL);
    assert_int_equal(jobs[0].rc_init, HERR_RUNTIME);
    expect_msg(&jobs[0].err, "WORLD_SIZE=3, rank 0 has 2", g.seed);
    assert_int_equal(jobs[1].rc_init, HERR_RUNTIME);
    expect_msg(&jobs[1].err, "WORLD_SIZE=3, rank 0 has 2", g.seed);
}

/* A connection that is not a Hearth rank (garbage, then gone) is ignored. */
static void test_stray_connection_ignored(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    int size = 3, port = free_port();
    size_t sizes[2] = { (size_t)tu_randint(&g, 1, 100), (size_t)tu_randint(&g, 1, 100) };
    rank_job jobs[MAX_RANKS];
    setup_jobs(jobs, size, port, 10000, tu_next(&g), 2, sizes);
    pthread_t t0;
    assert_int_equal(pthread_create(&t0, NULL, rank_main, &jobs[0]), 0);
    /* Connect (rank 0 may not listen yet), send junk, and wait for rank 0 to drop us. */
    int fd = -1;
    for (int tries = 0; tries < 500 && fd < 0; tries++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
            close(fd);
            fd = -1;
            struct timespec ts = { 0, 10 * 1000000L };
            nanosleep(&ts, NULL);
        }
    }
    assert_true(fd >= 0);
    unsigned char junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)tu_next(&g);
    assert_int_equal(send(fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
    char c;
    assert_true(recv(fd, &c, 1, 0) <= 0);   /* rank 0 closed it */
    close(fd);
    int present[MAX_RANKS] = { 0, 1, 1 };
    run_ranks(jobs, size, present);
    pthread_join(t0, NULL);
    for (int i = 0; i < size; i++) {
        if (jobs[i].rc_init || jobs[i].rc_gather)
            fail_msg("rank %d: %s (seed %llu)", i, jobs[i].err.msg,
                     (unsigned long long)g.seed);
        assert_int_equal(jobs[i].mismatch_round, -1);
    }
}

/* Rank 0's port is taken: a clean error naming the address, at once. */
static void test_port_in_use(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    bootstrap_tcp_opts o = { .rank = 0, .size = 2, .local_rank = -1,
                             .master_addr = "127.0.0.1", .master_port = ntohs(a.sin_port),
                             .timeout_ms = 120000 };
    bootstrap *b = NULL;
    hearth_err err = { { 0 } };
    double t0 = now_s();
    assert_int_equal(bootstrap_init_tcp(&b, &o, &err), HERR_RUNTIME);
    assert_null(b);
    char needle[64];
    snprintf(needle, sizeof needle, "cannot listen on 127.0.0.1:%d", o.master_port);
    expect_msg(&err, needle, 0);
    assert_true(now_s() - t0 < 60.0);   /* refused at once, not after the 120 s timeout */
    close(fd);
}

/* ---- environment variables ----------------------------------------------------- */

static void expect_env_error(char *const *envp, int code, const char *needle)
{
    bootstrap *b = (bootstrap *)1;
    hearth_err err = { { 0 } };
    assert_int_equal(bootstrap_init_envp(&b, envp, &err), code);
    assert_null(b);
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

static void test_env_errors(void **state)
{
    (void)state;
    expect_env_error((char *[]){ "RANK=x", "WORLD_SIZE=2", NULL }, HERR_CONFIG, "RANK=x");
    expect_env_error((char *[]){ "RANK=2", "WORLD_SIZE=2", NULL }, HERR_CONFIG, "RANK=2");
    expect_env_error((char *[]){ "RANK=0", NULL }, HERR_CONFIG, "WORLD_SIZE: not set");
    expect_env_error((char *[]){ "RANK=0", "WORLD_SIZE=0", NULL }, HERR_CONFIG,
                     "WORLD_SIZE=0");
    expect_env_error((char *[]){ "RANK=1", "WORLD_SIZE=2", "MASTER_PORT=5", NULL },
                     HERR_CONFIG, "MASTER_ADDR: not set");
    expect_env_error((char *[]){ "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                 "MASTER_PORT=70000", NULL }, HERR_CONFIG, "MASTER_PORT");
    expect_env_error((char *[]){ "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=-1", NULL },
                     HERR_CONFIG, "LOCAL_RANK=-1");
    expect_env_error((char *[]){ "RANK=0", "WORLD_SIZE=1", "HEARTH_BOOTSTRAP_TIMEOUT=0",
                                 NULL }, HERR_CONFIG, "HEARTH_BOOTSTRAP_TIMEOUT=0");
    expect_env_error((char *[]){ "HEARTH_BOOTSTRAP=mpi", NULL }, HERR_CONFIG,
                     "HEARTH_BOOTSTRAP=mpi");
    expect_env_error((char *[]){ "SLURM_STEP_NUM_TASKS=4", "SLURM_PROCID=2", NULL },
                     HERR_CONFIG, "srun --mpi=pmix");
}

/* Empty environment -> single; WORLD_SIZE=1 -> env with one rank; forced single wins
 * over PMIx variables.  The all-gather of one rank is a copy. */
static void test_env_single(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    static char *const envs[5][4] = {
        { NULL },
        { "RANK=0", "WORLD_SIZE=1", NULL },
        { "HEARTH_BOOTSTRAP=single", "PMIX_RANK=3", "PMIX_NAMESPACE=x", NULL },
        { "SLURM_STEP_NUM_TASKS=1", "SLURM_PROCID=0", NULL },
        { "SLURM_MPI_TYPE=pmix_v4", "SLURM_NTASKS=4", NULL },   /* a batch script */
    };
    static const bootstrap_kind kinds[5] = { BOOTSTRAP_SINGLE, BOOTSTRAP_ENV,
                                             BOOTSTRAP_SINGLE, BOOTSTRAP_SINGLE,
                                             BOOTSTRAP_SINGLE };
    for (int e = 0; e < 5; e++) {
        bootstrap *b = NULL;
        hearth_err err = { { 0 } };
        assert_int_equal(bootstrap_init_envp(&b, envs[e], &err), 0);
        assert_int_equal(bootstrap_get_kind(b), kinds[e]);
        assert_int_equal(bootstrap_rank(b), 0);
        assert_int_equal(bootstrap_size(b), 1);
        assert_int_equal(bootstrap_local_rank(b), 0);
        assert_true(strlen(bootstrap_node_name(b)) > 0);
        unsigned char mine[37], all[37];
        for (size_t i = 0; i < sizeof mine; i++)
            mine[i] = (unsigned char)tu_next(&g);
        assert_int_equal(bootstrap_allgather_blob(b, mine, sizeof mine, all, &err), 0);
        assert_memory_equal(mine, all, sizeof mine);
        bootstrap_free(b);
    }
}

/* The env source end to end: threads with their own environment arrays and explicit
 * LOCAL_RANK values, which win over the computed ones. */
typedef struct {
    char *env[8];
    char buf[6][64];
    int rc, local;
    hearth_err err;
    unsigned char mine[24], all[3 * 24];
} env_job;

static void *env_main(void *arg)
{
    env_job *j = arg;
    bootstrap *b = NULL;
    j->rc = bootstrap_init_envp(&b, j->env, &j->err);
    if (j->rc)
        return NULL;
    j->local = bootstrap_local_rank(b);
    j->rc = bootstrap_allgather_blob(b, j->mine, sizeof j->mine, j->all, &j->err);
    bootstrap_free(b);
    return NULL;
}

static void test_env_rendezvous(void **state)
{
    (void)state;
    tu_rng g = tu_rng_fresh();
    int port = free_port();
    env_job jobs[3];
    pthread_t th[3];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < 3; r++) {
        env_job *j = &jobs[r];
        snprintf(j->buf[0], 64, "RANK=%d", r);
        snprintf(j->buf[1], 64, "WORLD_SIZE=3");
        snprintf(j->buf[2], 64, "LOCAL_RANK=%d", 2 - r);
        snprintf(j->buf[3], 64, "MASTER_ADDR=localhost");
        snprintf(j->buf[4], 64, "MASTER_PORT=%d", port);
        snprintf(j->buf[5], 64, "HEARTH_BOOTSTRAP_TIMEOUT=20");
        for (int k = 0; k < 6; k++)
            j->env[k] = j->buf[k];
        j->env[6] = NULL;
        for (size_t i = 0; i < sizeof j->mine; i++)
            j->mine[i] = (unsigned char)tu_next(&g);
    }
    for (int r = 0; r < 3; r++)
        assert_int_equal(pthread_create(&th[r], NULL, env_main, &jobs[r]), 0);
    for (int r = 0; r < 3; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) {
        if (jobs[r].rc)
            fail_msg("rank %d: %s (seed %llu)", r, jobs[r].err.msg,
                     (unsigned long long)g.seed);
        assert_int_equal(jobs[r].local, 2 - r);
        for (int q = 0; q < 3; q++)
            assert_memory_equal(jobs[r].all + q * 24, jobs[q].mine, 24);
    }
}

/* ---- --check-bootstrap ---------------------------------------------------------- */

static void test_cli_check_bootstrap(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    char *ok[] = { "hearth-train", "--check-bootstrap", NULL };
    assert_int_equal(cli_parse(&a, 2, ok, &err), 0);
    assert_true(a.check_bootstrap);
    cli_args_free(&a);
    char *bad[] = { "hearth-train", "--check-bootstrap", "--out", "d", NULL };
    assert_int_equal(cli_parse(&a, 4, bad, &err), HERR_CONFIG);
    if (!strstr(err.msg, "--check-bootstrap"))
        fail_msg("message '%s' lacks '--check-bootstrap'", err.msg);
    cli_args_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allgather_threads),
        cmocka_unit_test(test_missing_rank_times_out),
        cmocka_unit_test(test_no_master_times_out),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_world_size_mismatch),
        cmocka_unit_test(test_stray_connection_ignored),
        cmocka_unit_test(test_port_in_use),
        cmocka_unit_test(test_env_errors),
        cmocka_unit_test(test_env_single),
        cmocka_unit_test(test_env_rendezvous),
        cmocka_unit_test(test_cli_check_bootstrap),
    };
    return cmocka_run_group_tests_name("bootstrap", tests, NULL, NULL);
}
