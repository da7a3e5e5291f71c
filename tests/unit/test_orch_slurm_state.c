/* test_orch_slurm_state.c - the one mapping of Slurm's job states and exit codes that the
 * sbatch and slurmrest backends share (slurm_state.h): state names to classes, raw wait
 * statuses (slurmrestd's exit_code) to exit codes, and a job's end event: RUN_DIR/exit_code
 * first (only when exit_code.job names this job), then what Slurm said. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "rundir.h"
#include "slurm_state.h"
#include "sweep.h"
#include "support/testutil.h"

static void test_classify(void **state)
{
    (void)state;
    static const struct { const char *name; slurm_state want; } cases[] = {
        { "PENDING", SLURM_ST_ALIVE }, { "RUNNING", SLURM_ST_ALIVE },
        { "COMPLETING", SLURM_ST_ALIVE }, { "SUSPENDED", SLURM_ST_ALIVE },
        { "REQUEUED", SLURM_ST_ALIVE }, { "CONFIGURING", SLURM_ST_ALIVE },
        { "COMPLETED", SLURM_ST_DONE }, { "FAILED", SLURM_ST_DONE },
        { "OUT_OF_MEMORY", SLURM_ST_DONE }, { "CANCELLED", SLURM_ST_CANCELLED },
        { "CANCELLED by 0", SLURM_ST_CANCELLED }, { "TIMEOUT", SLURM_ST_TIMEOUT },
        { "DEADLINE", SLURM_ST_TIMEOUT }, { "NODE_FAIL", SLURM_ST_REQUEUE },
        { "PREEMPTED", SLURM_ST_REQUEUE }, { "BOOT_FAIL", SLURM_ST_REQUEUE },
        { "", SLURM_ST_UNKNOWN }, { "running", SLURM_ST_UNKNOWN },
        { "COMPLETEDX", SLURM_ST_UNKNOWN }, { NULL, SLURM_ST_UNKNOWN },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (slurm_state_classify(cases[i].name) != cases[i].want)
            fail_msg("%s: got %d, want %d", cases[i].name ? cases[i].name : "(null)",
                     (int)slurm_state_classify(cases[i].name), (int)cases[i].want);
    }
}

/* Wait statuses made by a real child process, exit code or signal chosen at random. */
static void test_wait_status(void **state)
{
    (void)state;
    unsigned seed = tu_seed_noted();
    srand(seed);
    for (int k = 0; k < 8; k++) {
        int by_signal = k % 2, code = rand() % 256, sig = (int[]){ 1, 2, 9, 15 }[rand() % 4];
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (by_signal) {
                /* Inherited dispositions (nohup ignores SIGHUP) must not mask the death. */
                signal(sig, SIG_DFL);
                sigset_t set;
                sigemptyset(&set);
                sigaddset(&set, sig);
                sigprocmask(SIG_UNBLOCK, &set, NULL);
                kill(getpid(), sig);
            }
            _exit(code);
        }
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        int want = by_signal ? 128 + sig : code;
        if (slurm_wait_status_code(st) != want)
            fail_msg("seed %u: status %d: got %d, want %d", seed, st,
                     slurm_wait_status_code(st), want);
    }
    /* Slurm 22.05's REST exit_code for `exit 3` */
    assert_int_equal(slurm_wait_status_code(768), 3);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    hearth_err err;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(rundir_write_file(path, text, strlen(text), 0644, &err), 0);
}

static void test_event(void **state)
{
    (void)state;
    unsigned seed = tu_seed_noted();
    srand(seed);
    char dir[] = "/tmp/hearth-slurmstate-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int tag = 0, file_code = 1 + rand() % 200, slurm_code = 1 + rand() % 200;
    backend_event ev;

    /* Nothing in the run dir: Slurm's code, or vanished without one. */
    slurm_state_event(dir, "41", &tag, SLURM_ST_DONE, slurm_code, 0, &ev);
    assert_ptr_equal(ev.tag, &tag);
    assert_string_equal(ev.job_id, "41");
    assert_int_equal(ev.how, BACKEND_EXITED);
    assert_int_equal(ev.exit_code, slurm_code);
    slurm_state_event(dir, "41", &tag, SLURM_ST_DONE, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_VANISHED);
    assert_int_equal(ev.has_exit_code, 0);

    /* The job's own exit code file wins over Slurm's code. */
    char text[32];
    snprintf(text, sizeof text, "%d\n", file_code);
    write_text(dir, "exit_code", text);
    write_text(dir, "exit_code.job", "41\n");
    slurm_state_event(dir, "41", &tag, SLURM_ST_DONE, slurm_code, 0, &ev);
    assert_int_equal(ev.how, BACKEND_EXITED);
    assert_int_equal(ev.exit_code, file_code);
    /* ... but not another (earlier) job's file. */
    slurm_state_event(dir, "42", &tag, SLURM_ST_DONE, slurm_code, 0, &ev);
    assert_int_equal(ev.exit_code, slurm_code);
    slurm_state_event(dir, "42", &tag, SLURM_ST_UNKNOWN, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_VANISHED);

    /* Classes that say how it ended; a cancel asked by hearth makes it cancelled. */
    slurm_state_event(dir, "41", &tag, SLURM_ST_TIMEOUT, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_TIMEOUT);
    slurm_state_event(dir, "41", &tag, SLURM_ST_REQUEUE, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_REQUEUE);
    slurm_state_event(dir, "41", &tag, SLURM_ST_CANCELLED, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_CANCELLED);
    slurm_state_event(dir, "42", &tag, SLURM_ST_UNKNOWN, -1, 1, &ev);
    assert_int_equal(ev.how, BACKEND_CANCELLED);
    /* Known gone (aged out) with its exit code: exited, unless hearth cancelled it. */
    slurm_state_event(dir, "41", &tag, SLURM_ST_UNKNOWN, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_EXITED);
    slurm_state_event(dir, "41", &tag, SLURM_ST_TIMEOUT, -1, 1, &ev);
    assert_int_equal(ev.how, BACKEND_CANCELLED);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* resources.retry_timeout: a Slurm TIMEOUT (-> BACKEND_TIMEOUT -> RUN_TIMEOUT) is worth
 * another attempt only when it is set; the other ends do not depend on it. */
static void test_retry_decision(void **state)
{
    (void)state;
    unsigned seed = tu_seed_noted();
    srand(seed);
    char dir[] = "/tmp/hearth-slurmstate-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int tag = 0;
    backend_event ev;
    assert_int_equal(slurm_state_classify("TIMEOUT"), SLURM_ST_TIMEOUT);
    assert_int_equal(slurm_state_classify("DEADLINE"), SLURM_ST_TIMEOUT);
    slurm_state_event(dir, "7", &tag, SLURM_ST_TIMEOUT, -1, 0, &ev);
    assert_int_equal(ev.how, BACKEND_TIMEOUT);
    for (int i = 0; i < 200; i++) {
        int code = rand() % 260 - 1;   /* -1: none */
        int flag = rand() % 2;
        assert_int_equal(sweep_retryable(RUN_TIMEOUT, code, flag), flag);
        assert_int_equal(sweep_retryable(RUN_REQUEUED, code, flag), 1);
        assert_int_equal(sweep_retryable(RUN_FAILED, code, flag), code != 2);
        assert_int_equal(sweep_retryable(RUN_COMPLETED, code, flag), 0);
        assert_int_equal(sweep_retryable(RUN_CANCELLED, code, flag), 0);
    }
    assert_int_equal(sweep_retryable(RUN_TIMEOUT, -1, 0), 0);
    assert_int_equal(sweep_retryable(RUN_TIMEOUT, -1, 1), 1);
    assert_int_equal(sweep_retryable(RUN_FAILED, 2, 1), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_wait_status),
        cmocka_unit_test(test_event),
        cmocka_unit_test(test_retry_decision),
    };
    return cmocka_run_group_tests_name("orch_slurm_state", tests, NULL, NULL);
}
