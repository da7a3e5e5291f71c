/* backend_local.c - jobs as processes of this machine.
 *
 * A job is its job script, started in a session (and process group) of its own, so that
 * it survives the hearth process that started it and can be signalled as a whole.
 *
 * Liveness is a lock, not a pid: before starting the script, hearth takes an exclusive
 * flock on RUN_DIR/job.lock and hands that open file to the job (the script, the shell
 * around the trainer and the trainer all inherit it).  The lock is held exactly as long as
 * any process of the job lives, is released by the kernel however they die, and cannot be
 * confused with an unrelated process that happens to reuse the pid.  The file also records
 * "PID START" (the script's pid = its process group, and the start time in seconds since
 * the epoch), so a later hearth can signal the group and enforce the wall-time limit.
 * A signal is only sent while the lock is still held, i.e. while the group is still the
 * job's: a process group id cannot be reused while any member of the group lives.
 *
 * The job ends with its script: RUN_DIR/exit_code is the script's last act, after the
 * trainer ended.  A process of the group that still holds the lock after that is a stray
 * (a child the trainer left running in the background): it must neither keep the sweep
 * waiting nor let the wall-time limit turn a finished run into a timeout, so the group is
 * ended like a cancelled job's once the exit code has stood for EXIT_SETTLE_S. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "rundir.h"

/* Seconds from the exit code's appearance to the SIGTERM of what is left of the group:
 * enough for the script to finish its last line and exit. */
#define EXIT_SETTLE_S 1.0

typedef struct {
    void *tag;
    char job_id[BACKEND_JOB_ID_MAX];
    pid_t pid;                /* the job script: leader of the job's process group */
    int is_child;             /* started by this process: waitpid reaps it */
    int reaped, wstatus;
    char *run_dir, *lock_path;
    time_t start;             /* wall clock, for the time limit */
    int64_t limit_s;
    int stage;                /* 0 running, 1 SIGTERM sent, 2 SIGKILL sent */
    double term_at;           /* monotonic seconds of the SIGTERM */
    int exited;               /* RUN_DIR/exit_code was seen while the lock was held */
    double exited_at;         /* monotonic seconds when it was */
    int timed_out, cancelled;
} ljob;

typedef struct {
    backend base;
    ljob *jobs;
    size_t n, cap;
    int grace_ms;
} local_backend;


/* 1 when some process holds RUN_DIR/job.lock, 0 when not (or there is no lock file). */
static int lock_held(const char *lock_path)
{
    int fd = open(lock_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB)) {
        held = errno == EWOULDBLOCK;
    } else {
        flock(fd, LOCK_UN);
    }
    close(fd);
    return held;
}

/* Reads "PID START" from the lock file; returns 0 when it holds a usable pid. */
static int lock_read(const char *lock_path, pid_t *pid, time_t *start)
{
    char buf[64];
    int fd = open(lock_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    long long p = 0, s = 0;
    if (sscanf(buf, "%lld %lld", &p, &s) < 1 || p <= 1)
        return -1;
    *pid = (pid_t)p;
    *start = (time_t)s;
    return 0;
}

/* Signals the job's process group, only while the job still holds its lock. */
static void signal_job(const char *lock_path, pid_t pid, int sig)
{
    if (pid <= 1 || !lock_held(lock_path))
        return;
    if (kill(-pid, sig) && errno == ESRCH)
        kill(pid, sig);
}

/* The first step of ending a job: SIGTERM now, SIGKILL after the grace period (poll). */
static void term_job(ljob *j, double now)
{
    j->stage = 1;
    j->term_at = now;
    signal_job(j->lock_path, j->pid, SIGTERM);
}

static int lock_path_of(char *buf, size_t size, const backend_job *job, hearth_err *err)
{
    return rundir_path(buf, size, job->run_dir, "job.lock", err);
}

static int add_job(local_backend *lb, const backend_job *job, void *tag, pid_t pid,
                   time_t start, int is_child, hearth_err *err)
{
    if (lb->n == lb->cap) {
        size_t cap = lb->cap ? 2 * lb->cap : 16;
        ljob *g = realloc(lb->jobs, cap * sizeof *g);
        if (!g)
            return herr_set(err, HERR_NOMEM, "out of memory");
        lb->jobs = g;
        lb->cap = cap;
    }
    ljob *j = &lb->jobs[lb->n];
    memset(j, 0, sizeof *j);
    char lock[4200];
    int rc = lock_path_of(lock, sizeof lock, job, err);
    if (rc)
        return rc;
    j->run_dir = strdup(job->run_dir);
    j->lock_path = strdup(lock);
    if (!j->run_dir || !j->lock_path) {
        free(j->run_dir);
        free(j->lock_path);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    j->tag = tag;
    j->pid = pid;
    j->is_child = is_child;
    j->start = start;
    j->limit_s = job->time_limit_s;
    snprintf(j->job_id, sizeof j->job_id, "%d", (int)pid);
    lb->n++;
    return 0;
}

static int open_log(const char *run_dir, const char *name, hearth_err *err)
{
    char path[4200];
    if (rundir_path(path, sizeof path, run_dir, name, err))
        return HERR_IO;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return herr_set(err, HERR_IO, "%s: %s", path, strerror(errno));
    return fd;
}

static int local_submit(backend *b, const backend_job *job, void *tag,
                        char job_id[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    local_backend *lb = (local_backend *)b;
    char lock[4200];
    int rc = backend_check_one_process(job->run_dir, "local", err);
    if (rc)
        return rc;
    rc = lock_path_of(lock, sizeof lock, job, err);
    if (rc)
        return rc;
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0)
        return herr_set(err, HERR_IO, "%s: %s", lock, strerror(errno));
    if (flock(lfd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        close(lfd);
        if (e == EWOULDBLOCK)
            return herr_set(err, HERR_RUNTIME, "%s: a job of this run is already running",
                            job->run_dir);
        return herr_set(err, HERR_IO, "%s: flock: %s", lock, strerror(e));
    }
    int ofd = open_log(job->run_dir, "stdout.log", err);
    int efd = ofd < 0 ? -1 : open_log(job->run_dir, "stderr.log", err);
    int nfd = efd < 0 ? -1 : open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (ofd < 0 || efd < 0 || nfd < 0) {
        if (ofd >= 0 && efd >= 0)
            herr_set(err, HERR_IO, "/dev/null: %s", strerror(errno));
        if (ofd >= 0)
            close(ofd);
        if (efd >= 0)
            close(efd);
        close(lfd);
        return HERR_IO;
    }
    time_t start = time(NULL);
    const char *script = job->script;
    const char *dir = job->run_dir;
    /* Formatted before fork: the child only makes async-signal-safe calls. */
    char exec_fail[512];
    int exec_fail_len = snprintf(exec_fail, sizeof exec_fail, "hearth: cannot run %s\n",
                                 script);
    if (exec_fail_len >= (int)sizeof exec_fail)
        exec_fail_len = (int)sizeof exec_fail - 1;
    if (ftruncate(lfd, 0)) {
        /* best effort: a stale "PID START" is overwritten below anyway */
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(ofd);
        close(efd);
        close(nfd);
        close(lfd);
        return herr_set(err, HERR_RUNTIME, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        setsid();
        dup2(nfd, 0);
        dup2(ofd, 1);
        dup2(efd, 2);
        /* The lock goes with the job through exec: it is released when the job's last
         * process ends. */
        fcntl(lfd, F_SETFD, 0);
        char line[64];
        pid_t me = getpid();
        int len = 0;
        char digits[24];
        int nd = 0;
        for (long long v = me; v > 0 && nd < 20; v /= 10)
            digits[nd++] = (char)('0' + v % 10);
        while (nd)
            line[len++] = digits[--nd];
        line[len++] = ' ';
        for (long long v = (long long)start; v > 0 && nd < 20; v /= 10)
            digits[nd++] = (char)('0' + v % 10);
        while (nd)
            line[len++] = digits[--nd];
        line[len++] = '\n';
        if (pwrite(lfd, line, (size_t)len, 0) < 0) {
            /* the parent writes the same line */
        }
        if (chdir(dir)) {
            /* the script changes to its own working directory */
        }
        execl(script, script, (char *)NULL);
        if (write(2, exec_fail, (size_t)exec_fail_len) < 0) {
            /* nothing more to do */
        }
        _exit(127);
    }
    char line[64];
    int len = snprintf(line, sizeof line, "%d %lld\n", (int)pid, (long long)start);
    if (pwrite(lfd, line, (size_t)len, 0) < 0) {
        /* the child writes the same line */
    }
    close(lfd);
    close(ofd);
    close(efd);
    close(nfd);
    rc = add_job(lb, job, tag, pid, start, 1, err);
    if (rc) {
        signal_job(lock, pid, SIGKILL);
        return rc;
    }
    snprintf(job_id, BACKEND_JOB_ID_MAX, "%d", (int)pid);
    return 0;
}

static int local_alive(backend *b, const backend_job *job, const char *job_id, hearth_err *err)
{
    (void)b;
    (void)job_id;
    char lock[4200];
    int rc = lock_path_of(lock, sizeof lock, job, err);
    return rc ? rc : lock_held(lock);
}

static int local_track(backend *b, const backend_job *job, const char *job_id, void *tag,
                       char job_id_out[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    local_backend *lb = (local_backend *)b;
    char lock[4200];
    int rc = lock_path_of(lock, sizeof lock, job, err);
    if (rc)
        return rc;
    if (!lock_held(lock))
        return 0;
    pid_t pid = 0;
    time_t start = 0;
    if (lock_read(lock, &pid, &start)) {
        /* Held but not yet written: the job is starting this very moment. */
        pid = job_id && *job_id ? (pid_t)atoi(job_id) : 0;
        start = time(NULL);
    }
    if (start <= 0)
        start = time(NULL);
    if ((rc = add_job(lb, job, tag, pid, start, 0, err)))
        return rc;
    if (job_id_out)
        snprintf(job_id_out, BACKEND_JOB_ID_MAX, "%d", (int)pid);
    return 1;
}

static void finish_event(ljob *j, backend_event *e)
{
    memset(e, 0, sizeof *e);
    e->tag = j->tag;
    snprintf(e->job_id, sizeof e->job_id, "%s", j->job_id);
    int code = 0;
    if (rundir_exit_code(j->run_dir, &code)) {
        e->how = BACKEND_EXITED;
        e->has_exit_code = 1;
        e->exit_code = code;
    } else if (j->is_child && j->reaped && WIFEXITED(j->wstatus)) {
        e->how = BACKEND_EXITED;   /* e.g. the script could not be started (127) */
        e->has_exit_code = 1;
        e->exit_code = WEXITSTATUS(j->wstatus);
    } else {
        e->how = BACKEND_VANISHED;
        if (j->is_child && j->reaped && WIFSIGNALED(j->wstatus)) {
            e->has_exit_code = 1;
            e->exit_code = 128 + WTERMSIG(j->wstatus);
        }
    }
    if (j->cancelled)
        e->how = BACKEND_CANCELLED;
    else if (j->timed_out)
        e->how = BACKEND_TIMEOUT;
}

/* Moves a live job's ending on: SIGTERM at its wall-time limit, or to the strays left
 * once its script wrote the exit code (see the top of the file); SIGKILL a grace period
 * after a SIGTERM. */
static void advance(const local_backend *lb, ljob *j, double now, time_t wall)
{
    int code;
    /* A child's script is known to have ended once reaped; another process's job is
     * looked at every time (it pays a lock_held call each time anyway). */
    if (j->stage == 0 && !j->exited && (!j->is_child || j->reaped) &&
        rundir_exit_code(j->run_dir, &code)) {
        j->exited = 1;
        j->exited_at = now;
    }
    if (j->stage == 0 && j->exited) {
        if (now >= j->exited_at + EXIT_SETTLE_S)
            term_job(j, now);
    } else if (j->stage == 0 && j->limit_s > 0 && wall >= j->start + j->limit_s) {
        j->timed_out = 1;
        term_job(j, now);
    } else if (j->stage == 1 && now >= j->term_at + lb->grace_ms / 1000.0) {
        j->stage = 2;
        signal_job(j->lock_path, j->pid, SIGKILL);
    }
}

static int local_poll(backend *b, int timeout_ms, backend_event *ev, size_t cap, size_t *n,
                      hearth_err *err)
{
    (void)err;
    local_backend *lb = (local_backend *)b;
    double until = backend_clock_s() + (timeout_ms > 0 ? timeout_ms : 0) / 1000.0;
    *n = 0;
    for (;;) {
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0)
            for (size_t i = 0; i < lb->n; i++)
                if (lb->jobs[i].is_child && lb->jobs[i].pid == p) {
                    lb->jobs[i].reaped = 1;
                    lb->jobs[i].wstatus = st;
                }
        double now = backend_clock_s();
        time_t wall = time(NULL);
        for (size_t i = 0; i < lb->n && *n < cap; ) {
            ljob *j = &lb->jobs[i];
            advance(lb, j, now, wall);
            if ((!j->is_child || j->reaped) && !lock_held(j->lock_path)) {
                finish_event(j, &ev[(*n)++]);
                free(j->run_dir);
                free(j->lock_path);
                lb->jobs[i] = lb->jobs[--lb->n];
                continue;
            }
            i++;
        }
        if (*n > 0 || now >= until)
            return 0;
        double left_ms = (until - now) * 1000.0;
        backend_sleep_ms(left_ms < 50 ? (int)left_ms + 1 : 50);
    }
}

static int local_cancel(backend *b, const backend_job *job, const char *job_id,
                        hearth_err *err)
{
    local_backend *lb = (local_backend *)b;
    for (size_t i = 0; i < lb->n; i++) {
        ljob *j = &lb->jobs[i];
        if (strcmp(j->run_dir, job->run_dir) == 0) {
            j->cancelled = 1;
            if (j->stage == 0)
                term_job(j, backend_clock_s());
            return 1;
        }
    }
    char lock[4200];
    int rc = lock_path_of(lock, sizeof lock, job, err);
    if (rc)
        return rc;
    if (!lock_held(lock))
        return 0;
    pid_t pid = 0;
    time_t start;
    if (lock_read(lock, &pid, &start))
        pid = job_id && *job_id ? (pid_t)atoi(job_id) : 0;
    if (pid <= 1)
        return herr_set(err, HERR_RUNTIME, "%s: the job is running but its pid is unknown",
                        job->run_dir);
    signal_job(lock, pid, SIGTERM);
    double until = backend_clock_s() + lb->grace_ms / 1000.0;
    while (lock_held(lock) && backend_clock_s() < until)
        backend_sleep_ms(50);
    if (lock_held(lock)) {
        signal_job(lock, pid, SIGKILL);
        until = backend_clock_s() + 5.0;
        while (lock_held(lock) && backend_clock_s() < until)
            backend_sleep_ms(50);
    }
    return 1;
}

static size_t local_tracked(const backend *b)
{
    return ((const local_backend *)b)->n;
}

static void local_free(backend *b)
{
    local_backend *lb = (local_backend *)b;
    for (size_t i = 0; i < lb->n; i++) {
        free(lb->jobs[i].run_dir);
        free(lb->jobs[i].lock_path);
    }
    free(lb->jobs);
    free(lb);
}

static const backend_ops local_ops = {
    .name = "local",
    .submit = local_submit,
    .track = local_track,
    .poll = local_poll,
    .cancel = local_cancel,
    .alive = local_alive,
    .tracked = local_tracked,
    .free = local_free,
};

int backend_local_create(backend **out, int grace_ms, hearth_err *err)
{
    local_backend *lb = calloc(1, sizeof *lb);
    if (!lb)
        return herr_set(err, HERR_NOMEM, "out of memory");
    lb->base.ops = &local_ops;
    if (grace_ms <= 0) {
        const char *env = getenv("HEARTH_KILL_GRACE_MS");
        grace_ms = env && atoi(env) > 0 ? atoi(env) : 10000;
    }
    lb->grace_ms = grace_ms;
    *out = &lb->base;
    return 0;
}
