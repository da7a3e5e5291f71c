/* test_orch_backend.c - the local backend: a job's exit code (from RUN_DIR/exit_code, or
 * the wait status when the script wrote none), the wall-time limit (SIGTERM to the whole
 * process group), cancel, a job taken over by another backend instance (what a
 * restarted `hearth submit` does) with liveness from the job lock, not the pid, and a
 * stray process that outlives the job's exit code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "rundir.h"
#include "shape/file_read.h"
#include "support/testutil.h"

typedef struct {
    char dir[64];
    char script[128];
} job_dir;

/* A run directory holding job.sh with `body` (sh). */
static void make_job(job_dir *j, const char *body)
{
    snprintf(j->dir, sizeof j->dir, "/tmp/hearth-backend-XXXXXX");
    assert_non_null(mkdtemp(j->dir));
    snprintf(j->script, sizeof j->script, "%s/job.sh", j->dir);
    char text[2048];
    snprintf(text, sizeof text, "#!/bin/sh\n%s\n", body);
    hearth_err err;
    assert_int_equal(rundir_write_file(j->script, text, strlen(text), 0755, &err), 0);
}

static void drop_job(job_dir *j)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", j->dir);
    assert_int_equal(system(cmd), 0);
}

static backend_job bj_of(const job_dir *j, int64_t limit)
{
    backend_job b = { "r-1", j->dir, j->script, 1, limit, 0, NULL };
    return b;
}

/* Polls until one event arrives (at most `secs` seconds). */
static backend_event poll_one(backend *b, double secs)
{
    backend_event ev[4];
    size_t n = 0;
    hearth_err err;
    for (int i = 0; i < (int)(secs * 10) && n == 0; i++)
        assert_int_equal(b->ops->poll(b, 100, ev, 4, &n, &err), 0);
    if (n != 1)
        fail_msg("expected one job to end, got %zu", n);
    return ev[0];
}

static int lock_free(const job_dir *j)
{
    char path[128];
    snprintf(path, sizeof path, "%s/job.lock", j->dir);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    int ok = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);
    return ok;
}

static void test_exit_codes(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    int code = tu_randint(&r, 0, 126);
    backend *b;
    hearth_err err;
    assert_int_equal(backend_local_create(&b, 500, &err), 0);
    job_dir j, k;
    char body[256];
    /* Like the job template: the exit code goes to RUN_DIR/exit_code (cwd is RUN_DIR). */
    snprintf(body, sizeof body, "echo out; echo err >&2; echo %d > exit_code; exit 0", code);
    make_job(&j, body);
    snprintf(body, sizeof body, "exit %d", (code + 1) % 126);
    make_job(&k, body);
    backend_job a = bj_of(&j, 0), c = bj_of(&k, 0);
    char ida[BACKEND_JOB_ID_MAX], idc[BACKEND_JOB_ID_MAX];
    int tag_a, tag_c;
    assert_int_equal(b->ops->submit(b, &a, &tag_a, ida, &err), 0);
    assert_int_equal(b->ops->submit(b, &c, &tag_c, idc, &err), 0);
    assert_true(atoi(ida) > 1);
    assert_int_equal(b->ops->tracked(b), 2);
    backend_event evs[4];
    size_t got = 0;
    for (int i = 0; i < 100 && got < 2; i++) {
        size_t n = 0;
        assert_int_equal(b->ops->poll(b, 100, evs + got, 4 - got, &n, &err), 0);
        got += n;
    }
    assert_int_equal(got, 2);
    for (int i = 0; i < 2; i++) {
        backend_event ev = evs[i];
        assert_int_equal(ev.how, BACKEND_EXITED);
        assert_true(ev.has_exit_code);
        if (ev.tag == &tag_a) {
            assert_string_equal(ev.job_id, ida);
            assert_int_equal(ev.exit_code, code);   /* the file, not the script's 0 */
        } else {
            assert_ptr_equal(ev.tag, &tag_c);
            assert_int_equal(ev.exit_code, (code + 1) % 126);   /* no file: wait status */
        }
    }
    assert_int_equal(b->ops->tracked(b), 0);
    char *text = NULL, path[160];
    snprintf(path, sizeof path, "%s/stdout.log", j.dir);
    assert_int_equal(file_read_bounded(path, FILE_READ_MAX_TEXT, &text, NULL, &err), 0);
    assert_string_equal(text, "out\n");
    free(text);
    snprintf(path, sizeof path, "%s/stderr.log", j.dir);
    assert_int_equal(file_read_bounded(path, FILE_READ_MAX_TEXT, &text, NULL, &err), 0);
    assert_string_equal(text, "err\n");
    free(text);
    backend_free(b);
    drop_job(&j);
    drop_job(&k);
}

static void test_time_limit_kills_group(void **state)
{
    (void)state;
    backend *b;
    hearth_err err;
    assert_int_equal(backend_local_create(&b, 500, &err), 0);
    job_dir j;
    /* A grandchild that would outlive a kill of the script alone. */
    make_job(&j, "sleep 30 & sleep 30; echo 0 > exit_code");
    backend_job a = bj_of(&j, 1);
    char id[BACKEND_JOB_ID_MAX];
    time_t t0 = time(NULL);
    assert_int_equal(b->ops->submit(b, &a, NULL, id, &err), 0);
    assert_int_equal(b->ops->alive(b, &a, id, &err), 1);
    /* A second job in the same run directory is refused while the first lives. */
    char id2[BACKEND_JOB_ID_MAX];
    assert_int_equal(b->ops->submit(b, &a, NULL, id2, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "already running"));
    backend_event ev = poll_one(b, 20);
    assert_int_equal(ev.how, BACKEND_TIMEOUT);
    assert_true(time(NULL) - t0 < 25);   /* the 0.5 s limit, not the script's 30 s sleeps */
    assert_true(lock_free(&j));   /* every process of the group is gone */
    assert_int_equal(b->ops->alive(b, &a, id, &err), 0);
    backend_free(b);
    drop_job(&j);
}

static void test_cancel_tracked(void **state)
{
    (void)state;
    backend *b;
    hearth_err err;
    assert_int_equal(backend_local_create(&b, 300, &err), 0);
    job_dir j;
    /* Ignores SIGTERM: only the SIGKILL after the grace period ends it. */
    make_job(&j, "trap '' TERM; sleep 30 & wait; sleep 30");
    backend_job a = bj_of(&j, 0);
    char id[BACKEND_JOB_ID_MAX];
    assert_int_equal(b->ops->submit(b, &a, NULL, id, &err), 0);
    struct timespec ts = { 0, 200000000L };
    nanosleep(&ts, NULL);
    assert_int_equal(b->ops->cancel(b, &a, id, &err), 1);
    backend_event ev = poll_one(b, 10);
    assert_int_equal(ev.how, BACKEND_CANCELLED);
    assert_true(lock_free(&j));
    backend_free(b);
    drop_job(&j);
}

/* A second backend (a restarted hearth) finds the job through its lock and waits for it;
 * it can also cancel a job it does not track. */
static void test_track_and_untracked_cancel(void **state)
{
    (void)state;
    backend *first, *second;
    hearth_err err;
    assert_int_equal(backend_local_create(&first, 300, &err), 0);
    assert_int_equal(backend_local_create(&second, 300, &err), 0);
    job_dir j, k, never;
    make_job(&j, "sleep 0.5; echo 3 > exit_code");
    make_job(&k, "sleep 30");
    make_job(&never, "true");
    backend_job a = bj_of(&j, 0), c = bj_of(&k, 0), z = bj_of(&never, 0);
    char ida[BACKEND_JOB_ID_MAX], idc[BACKEND_JOB_ID_MAX], got[BACKEND_JOB_ID_MAX];
    assert_int_equal(first->ops->submit(first, &a, NULL, ida, &err), 0);
    assert_int_equal(first->ops->submit(first, &c, NULL, idc, &err), 0);
    int tag;
    /* The job id may be unknown to the new process: the lock file names the pid. */
    assert_int_equal(second->ops->track(second, &a, "", &tag, got, &err), 1);
    assert_string_equal(got, ida);
    assert_int_equal(second->ops->track(second, &z, NULL, &tag, got, &err), 0);
    backend_event ev = poll_one(second, 10);
    assert_ptr_equal(ev.tag, &tag);
    assert_int_equal(ev.how, BACKEND_EXITED);
    assert_int_equal(ev.exit_code, 3);
    assert_int_equal(second->ops->cancel(second, &c, idc, &err), 1);
    assert_true(lock_free(&k));
    assert_int_equal(second->ops->cancel(second, &c, idc, &err), 0);
    backend_free(second);
    backend_free(first);
    drop_job(&j);
    drop_job(&k);
    drop_job(&never);
}

/* A stray of the job (a background child its trainer never waited for) still holds the
 * job lock after the script wrote its exit code: the job ends all the same, with that code
 * and not as a timeout, and the stray goes with its group; also for a job that another
 * backend instance took over. */
static void test_stray_after_exit(void **state)
{
    (void)state;
    backend *first, *second;
    hearth_err err;
    assert_int_equal(backend_local_create(&first, 300, &err), 0);
    assert_int_equal(backend_local_create(&second, 300, &err), 0);
    job_dir j, k;
    make_job(&j, "sleep 60 & echo 0 > exit_code");
    make_job(&k, "sleep 60 & echo 4 > exit_code");
    /* The stray would outlive the wall-time limit. */
    backend_job a = bj_of(&j, 10), c = bj_of(&k, 0);
    char ida[BACKEND_JOB_ID_MAX], idc[BACKEND_JOB_ID_MAX], got[BACKEND_JOB_ID_MAX];
    assert_int_equal(first->ops->submit(first, &a, NULL, ida, &err), 0);
    backend_event ev = poll_one(first, 30);
    assert_int_equal(ev.how, BACKEND_EXITED);
    assert_true(ev.has_exit_code);
    assert_int_equal(ev.exit_code, 0);
    assert_true(lock_free(&j));   /* the stray is gone */
    /* Taken over: the new instance cannot reap the script, it reads the exit code. */
    assert_int_equal(first->ops->submit(first, &c, NULL, idc, &err), 0);
    int tag;
    assert_int_equal(second->ops->track(second, &c, idc, &tag, got, &err), 1);
    ev = poll_one(second, 30);
    assert_ptr_equal(ev.tag, &tag);
    assert_int_equal(ev.how, BACKEND_EXITED);
    assert_int_equal(ev.exit_code, 4);
    assert_true(lock_free(&k));
    backend_free(second);
    backend_free(first);
    drop_job(&j);
    drop_job(&k);
}

static void test_open(void **state)
{
    (void)state;
    backend *b = NULL;
    hearth_err err;
    assert_int_equal(backend_open("local", &b, &err), 0);
    assert_string_equal(b->ops->name, "local");
    backend_free(b);
    assert_int_equal(backend_open("pbs", &b, &err), HERR_CONFIG);
    assert_null(b);
    assert_non_null(strstr(err.msg, "unknown backend"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_codes),
        cmocka_unit_test(test_time_limit_kills_group),
        cmocka_unit_test(test_cancel_tracked),
        cmocka_unit_test(test_track_and_untracked_cancel),
        cmocka_unit_test(test_stray_after_exit),
        cmocka_unit_test(test_open),
    };
    return cmocka_run_group_tests_name("orch_backend", tests, NULL, NULL);
}
