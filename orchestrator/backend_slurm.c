/* backend_slurm.c - jobs as Slurm batch jobs: sbatch to start, one batched squeue per poll
 * cycle to follow them all, scancel to end one.
 *
 * Every Slurm command runs through fork/exec with an argument vector (never a shell), so
 * no value from a spec can inject anything: the job's resources become sbatch options
 * on the command line (--job-name, --comment, --cpus-per-task, --time, --output...; a cuda
 * run's --nodes, --ntasks-per-node and --gpus-per-node from RUN_DIR/job.json's launch).
 * The commands are found on PATH (a test counts squeue calls through a wrapper there).
 *
 * The run id travels as the job name (and in the comment, "hearth:RUN_ID"), so a job that
 * was submitted by a hearth killed before it recorded the job id is found again by name
 * (track with an empty job id) instead of being submitted twice.
 *
 * State without accounting: while slurmctld remembers a job (MinJobAge after its end),
 * `squeue -t all` reports its final state: COMPLETED/FAILED (the exit code comes from
 * RUN_DIR/exit_code, which the job script writes, else from one batched `scontrol show
 * job`), CANCELLED, TIMEOUT, and NODE_FAIL/PREEMPTED/BOOT_FAIL, which are reported as
 * BACKEND_REQUEUE so that the sweep resubmits within its retries.  A job squeue no longer
 * knows ended: RUN_DIR/exit_code, or vanished.
 *
 * With accounting (AccountingStorageType other than accounting_storage/none in `scontrol
 * show config`, read once with MaxArraySize): the jobs that ended without an exit code file
 * and those squeue no longer knows go to one batched `sacct` per cycle instead, which knows
 * a job's end state, exit code and nodes however long ago it ended.  sacct lags slurmctld
 * by a second or more (array tasks: several): a job it does not list as ended yet stays
 * tracked for up to ACCT_WAIT_S more.  When
 * sacct fails (slurmdbd down), that cycle falls back to scontrol.
 *
 * Poll cost: one squeue per cycle for all tracked jobs, at most one cycle per poll interval
 * ($HEARTH_SLURM_POLL_MS, default 2000 ms); one sacct (or, without accounting, one
 * scontrol) only when a job ended without an exit code file. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "render.h"
#include "rundir.h"
#include "slurm_state.h"
#include "strbuf.h"

typedef struct {
    void *tag;
    char job_id[BACKEND_JOB_ID_MAX];
    char *run_dir;
    int cancelled;
    double acct_since;        /* monotonic seconds since when it waits for sacct to list it
                                 as ended (accounting lags); 0: not waiting */
} sjob;

/* How long a job that ended without an exit code file waits for sacct to list it before
 * it is reported with what squeue and the run directory say.  Slurm 22.05 sends a plain
 * job's end to slurmdbd within about a second, an array task's within several. */
#define ACCT_WAIT_S 30.0

typedef struct {
    backend base;
    sjob *jobs;
    size_t n, cap;
    int interval_ms;
    double last_query;        /* monotonic seconds of the last squeue; 0: none yet */
    int failures;             /* squeue failures in a row */
    long max_array;           /* MaxArraySize from `scontrol show config`; 0: not read yet */
    int accounting;           /* the cluster keeps accounting (sacct works); valid once
                                 max_array > 0 */
    unsigned arrays;          /* arrays submitted by this process (unique directory names) */
} slurm_backend;

/* ---- running a command ------------------------------------------------------------------ */

/* Runs argv[0] (found on PATH) with stdin from /dev/null; collects stdout into *out and
 * stderr into *errtxt (both malloc'd, NUL-terminated; the caller frees them).  *status is
 * the exit status (or 128 + signal).  Returns 0, or a herr_code when it could not run. */
static int run_cmd(char *const argv[], char **out, char **errtxt, int *status,
                   hearth_err *err)
{
    int po[2], pe[2];
    *out = *errtxt = NULL;
    if (pipe2(po, O_CLOEXEC))
        return herr_set(err, HERR_RUNTIME, "pipe: %s", strerror(errno));
    if (pipe2(pe, O_CLOEXEC)) {
        close(po[0]);
        close(po[1]);
        return herr_set(err, HERR_RUNTIME, "pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(po[0]); close(po[1]); close(pe[0]); close(pe[1]);
        return herr_set(err, HERR_RUNTIME, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        int nfd = open("/dev/null", O_RDONLY);
        if (nfd >= 0)
            dup2(nfd, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    strbuf so = { 0 }, se = { 0 };
    struct pollfd pf[2] = { { po[0], POLLIN, 0 }, { pe[0], POLLIN, 0 } };
    int open_fds = 2, oom = 0;
    char buf[8192];
    while (open_fds > 0) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int k = 0; k < 2; k++) {
            if (pf[k].fd < 0 || !(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = read(pf[k].fd, buf, sizeof buf);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                close(pf[k].fd);
                pf[k].fd = -1;
                open_fds--;
                continue;
            }
            if (strbuf_add(k ? &se : &so, buf, (size_t)r))
                oom = 1;
        }
    }
    for (int k = 0; k < 2; k++)
        if (pf[k].fd >= 0)
            close(pf[k].fd);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (oom || (!so.s && strbuf_add(&so, "", 0)) || (!se.s && strbuf_add(&se, "", 0))) {
        free(so.s);
        free(se.s);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    if (*status == 127 && se.len == 0)
        strbuf_add(&se, "command not found", 17);
    *out = so.s;
    *errtxt = se.s;
    return 0;
}

/* The last non-empty line of a command's output, for messages: Slurm's commands put the
 * reason last ("sbatch: error: Batch job submission failed: ..."), after any warnings. */
static void first_line(const char *s, char *buf, size_t size)
{
    const char *best = s, *p = s;
    size_t best_n = strcspn(s, "\n");
    while (*p) {
        size_t n = strcspn(p, "\n");
        if (n > 0) {
            best = p;
            best_n = n;
        }
        p += n;
        if (*p == '\n')
            p++;
    }
    snprintf(buf, size, "%.*s", (int)best_n, best);
}

/* ---- states (their meaning: slurm_state.h, shared with backend_slurmrest.c) ------------- */

/* Whether a Slurm node list (squeue %N, SLURM_JOB_NODELIST) is one we may pass on as
 * --exclude: names, ranges and commas only. */
static int nodelist_ok(const char *s)
{
    if (!*s || strlen(s) >= 256)
        return 0;
    return s[strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.,-[]")]
           == 0;
}

/* "ID1,ID2,...": a job list for squeue/sacct --jobs (malloc'd; NULL when out of memory). */
static char *join_ids(char *const *ids, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(ids[i]) + 1;
    char *list = malloc(len);
    if (!list)
        return NULL;
    list[0] = 0;
    size_t off = 0;
    for (size_t i = 0; i < n; i++)
        off += (size_t)sprintf(list + off, "%s%s", i ? "," : "", ids[i]);
    return list;
}

/* Splits `line` at '|' in place into f[0..n): f[k] is NULL past the last field. */
static void split_bars(char *line, char **f, int n)
{
    f[0] = line;
    for (int k = 1; k < n; k++) {
        char *bar = f[k - 1] ? strchr(f[k - 1], '|') : NULL;
        if (bar)
            *bar = 0;
        f[k] = bar ? bar + 1 : NULL;
    }
}

/* Slurm's "EXIT:SIGNAL" pair (scontrol's and sacct's ExitCode) to an exit code: 128 + the
 * signal for a job killed by one, else the exit status. */
static int exit_pair_code(int ec, int sig)
{
    return sig ? 128 + sig : ec;
}

/* One squeue for the given job ids: fills state[i] (slurm_state; UNKNOWN when squeue does not
 * know the job) and, when `failed_nodes` is not NULL, failed_nodes[i] with the job's node
 * list when it ended by NODE_FAIL or BOOT_FAIL (a node's fault), else "".  Returns 0, 1 when
 * squeue itself failed (transient: slurmctld busy or restarting; *why says how), or a
 * negative herr_code. */
static int query_states(char *const *ids, size_t n, int *state, char (*failed_nodes)[256],
                        char *why, size_t why_size, hearth_err *err)
{
    for (size_t i = 0; i < n; i++) {
        state[i] = SLURM_ST_UNKNOWN;
        if (failed_nodes)
            failed_nodes[i][0] = 0;
    }
    if (n == 0)
        return 0;
    char *list = join_ids(ids, n);
    if (!list)
        return herr_set(err, HERR_NOMEM, "out of memory");
    /* --array: one line per array task, pending ones too (else "123_[4-9]"). */
    char *argv[] = { "squeue", "--noheader", "--array", "--states=all", "--jobs", list,
                     "--format=%i %T %N", NULL };
    char *out = NULL, *etxt = NULL;
    int status = 0;
    int rc = run_cmd(argv, &out, &etxt, &status, err);
    free(list);
    if (rc)
        return rc;
    if (status != 0) {
        /* Every id unknown (they aged out of slurmctld's memory) is an error for squeue. */
        int unknown = strstr(etxt, "Invalid job id") != NULL;
        if (!unknown)
            first_line(etxt[0] ? etxt : "squeue failed", why, why_size);
        free(out);
        free(etxt);
        return unknown ? 0 : 1;
    }
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char id[BACKEND_JOB_ID_MAX], st[64], nodes[256] = "";
        if (sscanf(line, "%63s %63s %255s", id, st, nodes) < 2)
            continue;
        int node_fault = !strcmp(st, "NODE_FAIL") || !strcmp(st, "BOOT_FAIL");
        for (size_t i = 0; i < n; i++)
            if (strcmp(ids[i], id) == 0) {
                state[i] = slurm_state_classify(st);
                if (failed_nodes && node_fault && nodelist_ok(nodes))
                    snprintf(failed_nodes[i], 256, "%s", nodes);
            }
    }
    free(out);
    free(etxt);
    return 0;
}

/* The exit codes of ended jobs from one `scontrol -o show job` (all jobs it remembers):
 * code[i] = the job's exit code, or -1 when unknown. */
static void query_exit_codes(char *const *ids, size_t n, int *code)
{
    for (size_t i = 0; i < n; i++)
        code[i] = -1;
    char *argv[] = { "scontrol", "--oneliner", "show", "job", NULL };
    char *out = NULL, *etxt = NULL;
    int status = 0;
    hearth_err e;
    if (run_cmd(argv, &out, &etxt, &status, &e))
        return;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        const char *j = strstr(line, "JobId=");
        const char *x = strstr(line, " ExitCode=");
        if (!j || !x)
            continue;
        char id[BACKEND_JOB_ID_MAX];
        if (sscanf(j + 6, "%63[0-9]", id) != 1)
            continue;
        /* An array task is known here by ARRAYJOB_TASK. */
        const char *aj = strstr(line, " ArrayJobId="), *at = strstr(line, " ArrayTaskId=");
        long long a = 0, t = 0;
        if (aj && at && sscanf(aj + 12, "%lld", &a) == 1 && sscanf(at + 13, "%lld", &t) == 1 &&
            at[13 + strspn(at + 13, "0123456789")] != '-')
            snprintf(id, sizeof id, "%lld_%lld", a, t);
        int ec = 0, sig = 0;
        if (sscanf(x + 10, "%d:%d", &ec, &sig) < 1)
            continue;
        for (size_t i = 0; i < n; i++)
            if (strcmp(ids[i], id) == 0)
                code[i] = exit_pair_code(ec, sig);
    }
    free(out);
    free(etxt);
}

/* What accounting says of ended jobs, from one `sacct` for all of them (--allocations: one
 * line per job or array task, ARRAYJOB_TASK; of jobs that share an id after slurmctld
 * started afresh, sacct lists the newest).  For each ids[i] it lists: found[i] = 1,
 * state[i] (slurm_state), code[i] (exit code, 128 + signal when killed by one) and, for a
 * node's fault (NODE_FAIL, BOOT_FAIL), nodes[i] = its node list; otherwise found[i] = 0.
 * Returns 0, or 1 when sacct failed (slurmdbd unreachable: the caller falls back). */
static int query_acct(char *const *ids, size_t n, int *found, int *state, int *code,
                      char (*nodes)[256])
{
    for (size_t i = 0; i < n; i++) {
        found[i] = 0;
        nodes[i][0] = 0;
    }
    char *list = join_ids(ids, n);
    if (!list)
        return 1;
    char *argv[] = { "sacct", "--noheader", "--parsable2", "--allocations", "--jobs", list,
                     "--format=JobID,State,ExitCode,NodeList", NULL };
    char *out = NULL, *etxt = NULL;
    int status = 0;
    hearth_err e;
    int rc = run_cmd(argv, &out, &etxt, &status, &e);
    free(list);
    if (rc)
        return 1;
    if (status != 0) {
        free(out);
        free(etxt);
        return 1;
    }
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        /* JobID|State|ExitCode|NodeList; State may read "CANCELLED by 0". */
        char *f[4];
        split_bars(line, f, 4);
        int ec = 0, sig = 0;
        if (!f[3] || sscanf(f[2], "%d:%d", &ec, &sig) < 1)
            continue;
        for (size_t i = 0; i < n; i++) {
            if (found[i] || strcmp(ids[i], f[0]) != 0)
                continue;
            found[i] = 1;
            state[i] = slurm_state_classify(f[1]);
            code[i] = exit_pair_code(ec, sig);
            if ((!strcmp(f[1], "NODE_FAIL") || !strcmp(f[1], "BOOT_FAIL")) && nodelist_ok(f[3]))
                snprintf(nodes[i], 256, "%s", f[3]);
        }
    }
    free(out);
    free(etxt);
    return 0;
}

/* Runs per task of the array in ARRAY_DIR: ARRAY_DIR/pack (resources.pack), else 1. */
static long array_pack(const char *array_dir)
{
    char path[4500];
    snprintf(path, sizeof path, "%s/pack", array_dir);
    FILE *f = fopen(path, "re");
    long p = 1;
    if (f) {
        if (fscanf(f, "%ld", &p) != 1 || p < 1)
            p = 1;
        fclose(f);
    }
    return p;
}

/* Whether `run_dir` is one of the runs of array task `task`: line task + 1 of
 * ARRAY_DIR/runs, or with a pack of P, one of lines task*P + 1 .. task*P + P. */
static int array_task_is(const char *array_dir, long task, const char *run_dir)
{
    char path[4500];
    long pack = array_pack(array_dir);
    snprintf(path, sizeof path, "%s/runs", array_dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[4400];
    long i = 0;
    int hit = 0;
    while (!hit && fgets(line, sizeof line, f)) {
        long k = i++;
        if (k >= task * pack + pack)
            break;
        if (k >= task * pack) {
            line[strcspn(line, "\n")] = 0;
            hit = strcmp(line, run_dir) == 0;
        }
    }
    fclose(f);
    return hit;
}

/* Whether the run in `run_dir` ended on its own inside pack task `job_id` (the pack's script
 * writes RUN_DIR/exit_code.pack with the task's id after each run that was not stopped by a
 * signal to the job): its exit code stands, whatever becomes of the job afterwards. */
static int pack_run_done(const char *run_dir, const char *job_id)
{
    char path[4200], who[BACKEND_JOB_ID_MAX] = "";
    hearth_err e;
    if (rundir_path(path, sizeof path, run_dir, "exit_code.pack", &e))
        return 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    int ok = fgets(who, sizeof who, f) != NULL;
    fclose(f);
    who[strcspn(who, "\n")] = 0;
    return ok && strcmp(who, job_id) == 0;
}

/* The newest live job of a run that was submitted but never recorded (a hearth killed
 * between sbatch and its database write): a job named RUN_ID with the comment
 * "hearth:RUN_ID", or a task of a hearth array (comment "hearth-array:DIR") whose line in
 * DIR/runs is the run's directory.  One squeue for all of Slurm's jobs. */
static int find_by_name(const backend_job *job, char id_out[BACKEND_JOB_ID_MAX],
                        hearth_err *err)
{
    char *argv[] = { "squeue", "--noheader", "--array", "--format=%i|%T|%j|%k", NULL };
    char *out = NULL, *etxt = NULL;
    int status = 0;
    int rc = run_cmd(argv, &out, &etxt, &status, err);
    if (rc)
        return rc;
    if (status != 0) {
        char why[256];
        first_line(etxt, why, sizeof why);
        free(out);
        free(etxt);
        return herr_set(err, HERR_RUNTIME, "squeue: %s", why);
    }
    char want_comment[600];
    snprintf(want_comment, sizeof want_comment, "hearth:%s", job->run_id);
    long long best = -1, best_task = -1;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *f[4];
        split_bars(line, f, 4);
        if (!f[3] || slurm_state_classify(f[1]) != SLURM_ST_ALIVE)
            continue;
        long long id = -1, task = -1;
        if (sscanf(f[0], "%lld_%lld", &id, &task) < 1)
            continue;
        int mine = 0;
        if (task < 0 && strcmp(f[2], job->run_id) == 0 && strcmp(f[3], want_comment) == 0)
            mine = 1;
        else if (task >= 0 && strncmp(f[3], "hearth-array:", 13) == 0)
            mine = array_task_is(f[3] + 13, (long)task, job->run_dir);
        if (mine && id > best) {
            best = id;
            best_task = task;
        }
    }
    free(out);
    free(etxt);
    if (best < 0)
        return 0;
    if (best_task >= 0)
        snprintf(id_out, BACKEND_JOB_ID_MAX, "%lld_%lld", best, best_task);
    else
        snprintf(id_out, BACKEND_JOB_ID_MAX, "%lld", best);
    return 1;
}

/* ---- the backend -------------------------------------------------------------------------- */

static int add_job(slurm_backend *sb, const backend_job *job, void *tag, const char *id,
                   hearth_err *err)
{
    if (sb->n == sb->cap) {
        size_t cap = sb->cap ? 2 * sb->cap : 16;
        sjob *g = realloc(sb->jobs, cap * sizeof *g);
        if (!g)
            return herr_set(err, HERR_NOMEM, "out of memory");
        sb->jobs = g;
        sb->cap = cap;
    }
    sjob *j = &sb->jobs[sb->n];
    memset(j, 0, sizeof *j);
    if (!(j->run_dir = strdup(job->run_dir)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    j->tag = tag;
    snprintf(j->job_id, sizeof j->job_id, "%s", id);
    sb->n++;
    return 0;
}

/* RUN_DIR/exclude_nodes: the nodes the run's last attempt failed on (NODE_FAIL, BOOT_FAIL),
 * which its next attempt is kept off with --exclude.  Written when an attempt ends by a
 * node's fault, removed when it ends any other way (a later failure is not the node's). */
static void note_failed_nodes(const char *run_dir, slurm_state st, const char *nodes)
{
    char path[4200];
    hearth_err e;
    if (rundir_path(path, sizeof path, run_dir, "exclude_nodes", &e))
        return;
    if (st != SLURM_ST_REQUEUE) {
        unlink(path);
        return;
    }
    char buf[300];
    if (!nodes[0]) {   /* PREEMPTED (no node's fault), or squeue did not name the node */
        unlink(path);
        return;
    }
    int len = snprintf(buf, sizeof buf, "%s\n", nodes);
    rundir_write_file(path, buf, (size_t)len, 0644, &e);
}

/* The node list in RUN_DIR/exclude_nodes (see note_failed_nodes): 1 with buf filled, or 0. */
static int read_exclude(const char *run_dir, char *buf, size_t size)
{
    char path[4200];
    hearth_err e;
    buf[0] = 0;
    if (rundir_path(path, sizeof path, run_dir, "exclude_nodes", &e))
        return 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    if (!fgets(buf, (int)size, f))
        buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    if (!nodelist_ok(buf))
        buf[0] = 0;
    return buf[0] != 0;
}

/* ---- sbatch command lines ------------------------------------------------------------------ */

/* A growing argument vector of malloc'd strings. */
typedef struct {
    char **v;
    size_t n, cap;
    int oom;
} argvec;

static void av_add(argvec *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void av_add(argvec *a, const char *fmt, ...)
{
    if (a->oom)
        return;
    if (a->n + 2 > a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 32;
        char **g = realloc(a->v, cap * sizeof *g);
        if (!g) {
            a->oom = 1;
            return;
        }
        a->v = g;
        a->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (!s) {
        a->oom = 1;
        return;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void av_free(argvec *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
}

/* The options every job of ours gets from its resources: a CPU run is one task of
 * cpus_per_task threads on one node; a cuda run (rj->gpus_per_node > 0) is one task per GPU
 * on resources.nodes nodes, which the job script starts with `srun --mpi=pmix`
 * (templates/sbatch.sh.tmpl); then the time limit, partition/account/qos/constraint, then
 * resources.sbatch as they are.  Each is one argument: nothing goes through a shell. */
static void resource_args(argvec *a, const backend_job *job, const rundir_job *rj)
{
    if (rj && rj->gpus_per_node > 0) {
        av_add(a, "--nodes=%d", rj->nodes > 1 ? rj->nodes : 1);
        av_add(a, "--ntasks-per-node=%d", rj->gpus_per_node);
        av_add(a, "--gpus-per-node=%d", rj->gpus_per_node);
    } else {
        av_add(a, "--nodes=1");
        av_add(a, "--ntasks=1");
    }
    /* hearth resubmits after a node failure itself, bounded by `retries`: Slurm must not
     * requeue behind its back (the job would come back under the same id). */
    av_add(a, "--no-requeue");
    av_add(a, "--cpus-per-task=%d", job->cpus_per_task > 0 ? job->cpus_per_task : 1);
    if (job->time_limit_s > 0) {  /* Slurm counts minutes: never shorter than asked */
        av_add(a, "--time=%lld", (long long)(job->time_limit_s + 59) / 60);
        /* Notice before the limit: SIGUSR2 to the job script, which passes it to the
         * trainer; it checkpoints and exits 75, and hearth requeues the run, which resumes
         * (docs/checkpoints.md).  A tenth of the limit, 30 s to 5 min. */
        long long notice = job->time_limit_s / 10;
        av_add(a, "--signal=B:USR2@%lld", notice < 30 ? 30 : notice > 300 ? 300 : notice);
    }
    if (rj && rj->partition)
        av_add(a, "--partition=%s", rj->partition);
    if (rj && rj->account)
        av_add(a, "--account=%s", rj->account);
    if (rj && rj->qos)
        av_add(a, "--qos=%s", rj->qos);
    if (rj && rj->constraint)
        av_add(a, "--constraint=%s", rj->constraint);
    for (int i = 0; rj && i < rj->n_sbatch; i++)
        av_add(a, "%s", rj->sbatch[i]);
    if (job->dependency) {
        /* `after` another experiment whose jobs are still in flight: Slurm starts this one
         * when they ended, and cancels it when they cannot end as asked (afterok on a job
         * that failed), whatever the cluster's DependencyParameters say. */
        av_add(a, "--dependency=%s", job->dependency);
        av_add(a, "--kill-on-invalid-dep=yes");
    }
}

/* Runs the sbatch command line in `a`; fills id (digits, plus nothing else). */
static int run_sbatch(argvec *a, const char *what, char id[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    if (a->oom)
        return herr_set(err, HERR_NOMEM, "out of memory");
    char *out = NULL, *etxt = NULL;
    int status = 0;
    int rc = run_cmd(a->v, &out, &etxt, &status, err);
    if (rc)
        return rc;
    id[0] = 0;
    if (status == 0)
        sscanf(out, "%40[0-9]", id);
    if (!id[0]) {
        char why[512];
        first_line(etxt[0] ? etxt : out, why, sizeof why);
        rc = herr_set(err, HERR_RUNTIME, "sbatch %s (exit %d): %s", what, status, why);
    }
    free(out);
    free(etxt);
    return rc;
}

static int slurm_submit_one(slurm_backend *sb, const backend_job *job, const rundir_job *rj,
                            void *tag, char job_id[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    argvec a = { 0 };
    av_add(&a, "sbatch");
    av_add(&a, "--parsable");
    av_add(&a, "--job-name=%s", job->run_id);
    av_add(&a, "--comment=hearth:%s", job->run_id);
    av_add(&a, "--output=%s/stdout.log", job->run_dir);
    av_add(&a, "--error=%s/stderr.log", job->run_dir);
    av_add(&a, "--open-mode=append");
    av_add(&a, "--chdir=%s", job->run_dir);
    resource_args(&a, job, rj);
    char exclude[256];
    if (read_exclude(job->run_dir, exclude, sizeof exclude))
        av_add(&a, "--exclude=%s", exclude);   /* after a node failure: not there again */
    av_add(&a, "%s", job->script);
    char id[BACKEND_JOB_ID_MAX];
    int rc = run_sbatch(&a, job->script, id, err);
    av_free(&a);
    if (!rc)
        rc = add_job(sb, job, tag, id, err);
    if (!rc)
        snprintf(job_id, BACKEND_JOB_ID_MAX, "%s", id);
    return rc;
}

static int slurm_submit(backend *b, const backend_job *job, void *tag,
                        char job_id[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    rundir_job rj;
    int have = rundir_job_read(job->run_dir, &rj, err) == 0;
    int rc = slurm_submit_one((slurm_backend *)b, job, have ? &rj : NULL, tag, job_id, err);
    if (have)
        rundir_job_free(&rj);
    return rc;
}

/* ---- job arrays ---------------------------------------------------------------------------- */

/* MaxArraySize (array task ids are 0 .. MaxArraySize-1) and whether the cluster keeps
 * accounting, from one `scontrol show config`, read once. */
static long max_array_size(slurm_backend *sb)
{
    if (sb->max_array > 0)
        return sb->max_array;
    sb->max_array = 1001;   /* Slurm's default */
    sb->accounting = 0;
    char *argv[] = { "scontrol", "show", "config", NULL };
    char *out = NULL, *etxt = NULL;
    int status = 0;
    hearth_err e;
    if (run_cmd(argv, &out, &etxt, &status, &e))
        return sb->max_array;
    const char *p = strstr(out, "MaxArraySize");
    long v = 0;
    if (p && (p = strchr(p, '=')) && sscanf(p + 1, "%ld", &v) == 1 && v > 0)
        sb->max_array = v;
    char acct[128] = "";
    if (status == 0 && (p = strstr(out, "\nAccountingStorageType")) && (p = strchr(p, '=')))
        sscanf(p + 1, " %127s", acct);
    sb->accounting = acct[0] && strcmp(acct, "accounting_storage/none") != 0;
    free(out);
    free(etxt);
    return sb->max_array;
}

static int same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Whether two jobs can share one array: the same sbatch options. */
static int same_shape(const backend_job *a, const rundir_job *ra, const backend_job *b,
                      const rundir_job *rb)
{
    if (a->cpus_per_task != b->cpus_per_task || a->time_limit_s != b->time_limit_s ||
        a->max_concurrent != b->max_concurrent || !same_str(a->dependency, b->dependency) ||
        ra->pack != rb->pack || ra->nodes != rb->nodes || ra->gpus_per_node != rb->gpus_per_node ||
        !same_str(ra->partition, rb->partition) ||
        !same_str(ra->account, rb->account) || !same_str(ra->qos, rb->qos) ||
        !same_str(ra->constraint, rb->constraint) || ra->n_sbatch != rb->n_sbatch)
        return 0;
    for (int i = 0; i < ra->n_sbatch; i++)
        if (strcmp(ra->sbatch[i], rb->sbatch[i]))
            return 0;
    return 1;
}

/* Submits jobs[0..n) as one array: DIR = EXP_DIR/arrays/<first run>.<pid>.<k>/ holds
 * `runs` (task i runs the i-th run directory listed) and task.sh, which runs that run's
 * job.sh with its output in the run directory.  The array's comment names DIR, so that a
 * later hearth can find an array task by its run directory (adoption).
 * With resources.pack P > 1 (rj->pack), task i runs the runs on lines i*P+1 .. i*P+P one
 * after another (DIR/pack holds P), with P times the time limit of one run; every run of a
 * task is tracked under the task's id. */
static int submit_array(slurm_backend *sb, const backend_job *jobs, const rundir_job *rj,
                        void *const *tags, size_t n, char (*job_ids)[BACKEND_JOB_ID_MAX],
                        hearth_err *err)
{
    char dir[4400], path[4500];
    const char *slash = strrchr(jobs[0].run_dir, '/');
    int exp_len = slash ? (int)(slash - jobs[0].run_dir) : (int)strlen(jobs[0].run_dir);
    snprintf(dir, sizeof dir, "%.*s/arrays/%s.%d.%u", exp_len, jobs[0].run_dir,
             jobs[0].run_id, (int)getpid(), sb->arrays++);
    int rc = rundir_mkdirs(dir, err);
    if (rc)
        return rc;
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(jobs[i].run_dir) + 1;
    char *list = malloc(len);
    char *qdir = render_shell_quote(dir);
    if (!list || !qdir) {
        free(list);
        free(qdir);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++)
        off += (size_t)sprintf(list + off, "%s\n", jobs[i].run_dir);
    snprintf(path, sizeof path, "%s/runs", dir);
    rc = rundir_write_file(path, list, off, 0644, err);
    free(list);
    size_t pack = rj->pack > 1 ? (size_t)rj->pack : 1, tasks = (n + pack - 1) / pack;
    char *script = NULL;
    int sl;
    if (pack > 1) {
        char pk[32];
        int pl = snprintf(pk, sizeof pk, "%zu\n", pack);
        snprintf(path, sizeof path, "%s/pack", dir);
        if (!rc)
            rc = rundir_write_file(path, pk, (size_t)pl, 0644, err);
        /* Slurm signals every process of the job (TERM) at the time limit or on scancel:
         * the run then in progress ends as the job does (no exit_code.pack), and no further
         * run starts, so those keep the job's end state too. */
        sl = asprintf(&script,
        "#!/bin/bash\n"
        "# A hearth job array of packs: task N runs the run directories on lines N*P+1 .. N*P+P\n"
        "# of runs one after another (P = resources.pack).\n"
        "list=%s/runs\n"
        "pack=%zu\n"
        "job=\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"\n"
        "child=\n"
        "stop=\n"
        "trap 'stop=1; [ -n \"$child\" ] && kill -TERM \"$child\" 2>/dev/null' TERM INT HUP\n"
        "trap 'stop=1; [ -n \"$child\" ] && kill -USR2 \"$child\" 2>/dev/null' USR2\n"
        "rc=0\n"
        "first=$((SLURM_ARRAY_TASK_ID * pack + 1))\n"
        "for ((k = first; k < first + pack; k++)); do\n"
        "    [ -z \"$stop\" ] || break\n"
        "    dir=$(sed -n \"${k}p\" \"$list\")\n"
        "    [ -n \"$dir\" ] || break\n"
        "    ( cd \"$dir\" || exit 1; exec \"$dir/job.sh\" >>\"$dir/stdout.log\" 2>>\"$dir/stderr.log\" ) &\n"
        "    child=$!\n"
        "    while :; do\n"
        "        wait \"$child\"\n"
        "        rc=$?\n"
        "        kill -0 \"$child\" 2>/dev/null || break\n"
        "    done\n"
        "    wait \"$child\" 2>/dev/null\n"
        "    last=$?\n"
        "    if [ \"$last\" -ge 0 ] && [ \"$last\" -le 255 ] && [ \"$last\" -ne 127 ]; then rc=$last; fi\n"
        "    child=\n"
        "    if [ -z \"$stop\" ]; then\n"
        "        printf '%%s\\n' \"$job\" >\"$dir/.exit_code.pack.tmp\" && mv -f \"$dir/.exit_code.pack.tmp\" \"$dir/exit_code.pack\"\n"
        "    fi\n"
        "done\n"
        "exit \"$rc\"\n", qdir, pack);
    } else
    sl = asprintf(&script,
        "#!/bin/bash\n"
        "# A hearth job array: task N runs the run directory on line N+1 of runs.\n"
        "list=%s/runs\n"
        "dir=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" \"$list\")\n"
        "[ -n \"$dir\" ] || { echo \"hearth: no run for array task $SLURM_ARRAY_TASK_ID in $list\" >&2; exit 1; }\n"
        "cd \"$dir\" || exit 1\n"
        "exec \"$dir/job.sh\" >>\"$dir/stdout.log\" 2>>\"$dir/stderr.log\"\n", qdir);
    free(qdir);
    if (sl < 0)
        return herr_set(err, HERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/task.sh", dir);
    if (!rc)
        rc = rundir_write_file(path, script, (size_t)sl, 0755, err);
    free(script);
    if (rc)
        return rc;
    backend_job packed = jobs[0];
    const backend_job *job = &packed;
    if (packed.time_limit_s > 0)
        packed.time_limit_s *= (int64_t)pack;
    argvec a = { 0 };
    av_add(&a, "sbatch");
    av_add(&a, "--parsable");
    av_add(&a, "--job-name=%s", job->run_id);
    av_add(&a, "--comment=hearth-array:%s", dir);
    if (job->max_concurrent > 0)
        av_add(&a, "--array=0-%zu%%%d", tasks - 1, job->max_concurrent);
    else
        av_add(&a, "--array=0-%zu", tasks - 1);
    av_add(&a, "--output=%s/task-%%a.log", dir);
    av_add(&a, "--chdir=%s", dir);
    resource_args(&a, job, rj);
    av_add(&a, "%s", path);
    char id[BACKEND_JOB_ID_MAX], what[700];
    snprintf(what, sizeof what, "--array (%zu runs from %s)", n, job->run_id);
    rc = run_sbatch(&a, what, id, err);
    av_free(&a);
    for (size_t i = 0; !rc && i < n; i++) {
        snprintf(job_ids[i], BACKEND_JOB_ID_MAX, "%.40s_%zu", id, i / pack);
        rc = add_job(sb, &jobs[i], tags[i], job_ids[i], err);
    }
    return rc;
}

static int slurm_submit_many(backend *b, const backend_job *jobs, void *const *tags, size_t n,
                             char (*job_ids)[BACKEND_JOB_ID_MAX], size_t *done,
                             hearth_err *err)
{
    slurm_backend *sb = (slurm_backend *)b;
    *done = 0;
    rundir_job *rj = calloc(n ? n : 1, sizeof *rj);
    if (!rj)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = 0;
    size_t nread = 0;
    for (; !rc && nread < n; nread++)
        rc = rundir_job_read(jobs[nread].run_dir, &rj[nread], err);
    if (rc)
        nread--;   /* the failed read left nothing to free */
    size_t i = 0;
    while (!rc && i < n) {
        /* Array task ids stop at MaxArraySize - 1; a task runs up to `pack` runs. */
        size_t cap = (size_t)max_array_size(sb) * (size_t)(rj[i].pack > 1 ? rj[i].pack : 1);
        size_t j = i + 1;
        char exclude[256];
        /* A run kept off a failed node goes alone (its options differ). */
        if (!read_exclude(jobs[i].run_dir, exclude, sizeof exclude))
            while (j < n && j - i < cap && same_shape(&jobs[i], &rj[i], &jobs[j], &rj[j]) &&
                   !read_exclude(jobs[j].run_dir, exclude, sizeof exclude))
                j++;
        rc = j - i == 1 ? slurm_submit_one(sb, &jobs[i], &rj[i], tags[i], job_ids[i], err)
                        : submit_array(sb, jobs + i, &rj[i], tags + i, j - i, job_ids + i, err);
        if (!rc)
            *done = i = j;
    }
    for (size_t k = 0; k < nread; k++)
        rundir_job_free(&rj[k]);
    free(rj);
    return rc;
}

static int slurm_track(backend *b, const backend_job *job, const char *job_id, void *tag,
                       char job_id_out[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    slurm_backend *sb = (slurm_backend *)b;
    char id[BACKEND_JOB_ID_MAX] = "";
    int rc;
    if (job_id && *job_id) {
        /* A recorded job is tracked without asking Slurm here: the next poll asks about
         * all of them in one squeue and reports how each ended (cancelled, timeout, node
         * failure...), which the exit code file alone cannot tell. */
        snprintf(id, sizeof id, "%s", job_id);
    } else {
        rc = find_by_name(job, id, err);
        if (rc <= 0)
            return rc;
    }
    if ((rc = add_job(sb, job, tag, id, err)))
        return rc;
    if (job_id_out)
        snprintf(job_id_out, BACKEND_JOB_ID_MAX, "%s", id);
    return 1;
}

/* The end of jobs ids[need[0..nn)] that squeue alone cannot tell (no exit code file; with
 * accounting also those it no longer knows): with accounting, from one sacct (a job sacct
 * does not list as ended yet stays alive for up to ACCT_WAIT_S); else, or when sacct
 * failed, exit codes from one scontrol.  Updates st, codes and failed.  Returns 0, or 1
 * when out of memory. */
static int settle_ended(slurm_backend *sb, char *const *ids, const size_t *need, size_t nn,
                        int *st, int *codes, char (*failed)[256])
{
    char **nid = malloc(nn * sizeof *nid);
    int *found = malloc(nn * sizeof *found), *ast = malloc(nn * sizeof *ast);
    int *acode = malloc(nn * sizeof *acode);
    char (*anodes)[256] = malloc(nn * sizeof *anodes);
    if (!nid || !found || !ast || !acode || !anodes) {
        free(nid); free(found); free(ast); free(acode); free(anodes);
        return 1;
    }
    for (size_t k = 0; k < nn; k++)
        nid[k] = ids[need[k]];
    if (sb->accounting && query_acct(nid, nn, found, ast, acode, anodes) == 0) {
        for (size_t k = 0; k < nn; k++) {
            size_t i = need[k];
            /* Listed but not ended there (accounting has not caught up), or not listed. */
            if (!found[k] || ast[k] == SLURM_ST_ALIVE || ast[k] == SLURM_ST_UNKNOWN) {
                double now = backend_clock_s();
                if (sb->jobs[i].acct_since == 0)
                    sb->jobs[i].acct_since = now;
                if (now - sb->jobs[i].acct_since < ACCT_WAIT_S)
                    st[i] = SLURM_ST_ALIVE;   /* ask again next cycle */
                continue;
            }
            st[i] = ast[k];
            codes[i] = acode[k];
            if (anodes[k][0] && !failed[i][0])
                snprintf(failed[i], 256, "%s", anodes[k]);
        }
    } else {
        query_exit_codes(nid, nn, acode);
        for (size_t k = 0; k < nn; k++)
            codes[need[k]] = acode[k];
    }
    free(nid); free(found); free(ast); free(acode); free(anodes);
    return 0;
}

static int slurm_poll(backend *b, int timeout_ms, backend_event *ev, size_t cap, size_t *n,
                      hearth_err *err)
{
    slurm_backend *sb = (slurm_backend *)b;
    *n = 0;
    if (!backend_poll_due(&sb->last_query, sb->interval_ms, sb->n, timeout_ms))
        return 0;
    size_t m = sb->n;
    char **ids = malloc((m ? m : 1) * sizeof *ids);
    int *st = malloc((m ? m : 1) * sizeof *st);
    int *codes = malloc((m ? m : 1) * sizeof *codes);
    size_t *need = malloc((m ? m : 1) * sizeof *need);
    char (*failed)[256] = malloc((m ? m : 1) * sizeof *failed);
    if (!ids || !st || !codes || !need || !failed) {
        free(ids); free(st); free(codes); free(need); free(failed);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < m; i++)
        ids[i] = sb->jobs[i].job_id;
    char why[256] = "";
    int rc = query_states(ids, m, st, failed, why, sizeof why, err);
    if (rc == 1) {
        /* slurmctld may be restarting: try again next cycle, give up after a while. */
        rc = ++sb->failures >= 60 ? herr_set(err, HERR_RUNTIME, "squeue keeps failing: %s",
                                             why) : 0;
        free(ids); free(st); free(codes); free(need); free(failed);
        return rc;
    }
    if (rc) {
        free(ids); free(st); free(codes); free(need); free(failed);
        return rc;
    }
    sb->failures = 0;
    max_array_size(sb);   /* whether the cluster keeps accounting (read once) */
    /* Ended without an exit code file (with accounting: or unknown to squeue): one sacct,
     * else one scontrol, for all of them.  need[] holds their indices. */
    size_t nn = 0;
    for (size_t i = 0; i < m; i++) {
        int dummy;
        codes[i] = -1;
        /* A run of a pack that ended on its own: done now, even while its job runs on
         * (or ended later in another way). */
        if (st[i] != SLURM_ST_UNKNOWN && pack_run_done(sb->jobs[i].run_dir, ids[i]) &&
            slurm_job_exit_code(sb->jobs[i].run_dir, ids[i], &dummy))
            st[i] = SLURM_ST_DONE;
        if (st[i] == SLURM_ST_ALIVE)
            continue;
        int no_file = !slurm_job_exit_code(sb->jobs[i].run_dir, ids[i], &dummy);
        if (sb->accounting ? (no_file || st[i] == SLURM_ST_UNKNOWN)
                           : (no_file && st[i] != SLURM_ST_UNKNOWN))
            need[nn++] = (size_t)i;
    }
    if (nn) {
        rc = settle_ended(sb, ids, need, nn, st, codes, failed);
        if (rc) {
            free(ids); free(st); free(codes); free(need); free(failed);
            return herr_set(err, HERR_NOMEM, "out of memory");
        }
    }
    /* Report the ended ones; ids point into jobs[], so collect first, then compact. */
    size_t w = 0;
    for (size_t i = 0; i < m; i++) {
        sjob *j = &sb->jobs[i];
        if (st[i] != SLURM_ST_ALIVE && *n < cap) {
            note_failed_nodes(j->run_dir, (slurm_state)st[i], failed[i]);
            slurm_state_event(j->run_dir, j->job_id, j->tag, (slurm_state)st[i], codes[i],
                              j->cancelled, &ev[(*n)++]);
            free(j->run_dir);
            continue;
        }
        sb->jobs[w++] = *j;
    }
    sb->n = w;
    free(ids); free(st); free(codes); free(need); free(failed);
    return 0;
}

static int slurm_alive(backend *b, const backend_job *job, const char *job_id,
                       hearth_err *err)
{
    (void)b;
    char id[BACKEND_JOB_ID_MAX] = "";
    if (!job_id || !*job_id)
        return find_by_name(job, id, err);
    snprintf(id, sizeof id, "%s", job_id);
    char *ids[1] = { id };
    int st;
    char why[256] = "";
    int rc = query_states(ids, 1, &st, NULL, why, sizeof why, err);
    if (rc == 1)
        return herr_set(err, HERR_RUNTIME, "squeue: %s", why);
    return rc < 0 ? rc : st == SLURM_ST_ALIVE;
}

static int slurm_cancel(backend *b, const backend_job *job, const char *job_id,
                        hearth_err *err)
{
    slurm_backend *sb = (slurm_backend *)b;
    char id[BACKEND_JOB_ID_MAX] = "";
    if (job_id && *job_id)
        snprintf(id, sizeof id, "%s", job_id);
    else {
        int f = find_by_name(job, id, err);
        if (f <= 0)
            return f;
    }
    int alive = slurm_alive(b, job, id, err);
    if (alive < 0)
        return alive;
    sjob *tracked = NULL;
    for (size_t i = 0; i < sb->n; i++)
        if (strcmp(sb->jobs[i].job_id, id) == 0)
            tracked = &sb->jobs[i];
    if (tracked)
        tracked->cancelled = 1;
    if (!alive)
        return 0;
    char *argv[] = { "scancel", id, NULL };
    char *out = NULL, *etxt = NULL;
    int status = 0;
    int rc = run_cmd(argv, &out, &etxt, &status, err);
    if (!rc && status != 0) {
        char why[256];
        first_line(etxt, why, sizeof why);
        rc = herr_set(err, HERR_RUNTIME, "scancel %s: %s", id, why);
    }
    free(out);
    free(etxt);
    if (rc)
        return rc;
    if (!tracked) {
        /* Untracked: wait (a while) until Slurm says it ended. */
        for (int i = 0; i < 100; i++) {
            hearth_err e;
            if (slurm_alive(b, job, id, &e) != 1)
                break;
            backend_sleep_ms(200);
        }
    }
    return 1;
}

static size_t slurm_tracked(const backend *b)
{
    return ((const slurm_backend *)b)->n;
}

static void slurm_free(backend *b)
{
    slurm_backend *sb = (slurm_backend *)b;
    for (size_t i = 0; i < sb->n; i++)
        free(sb->jobs[i].run_dir);
    free(sb->jobs);
    free(sb);
}

static const backend_ops slurm_ops = {
    .name = "slurm",
    .submit = slurm_submit,
    .submit_many = slurm_submit_many,
    .track = slurm_track,
    .poll = slurm_poll,
    .cancel = slurm_cancel,
    .alive = slurm_alive,
    .tracked = slurm_tracked,
    .free = slurm_free,
};

int backend_slurm_create(backend **out, hearth_err *err)
{
    slurm_backend *sb = calloc(1, sizeof *sb);
    if (!sb)
        return herr_set(err, HERR_NOMEM, "out of memory");
    sb->base.ops = &slurm_ops;
    const char *env = getenv("HEARTH_SLURM_POLL_MS");
    sb->interval_ms = env && atoi(env) > 0 ? atoi(env) : 2000;
    *out = &sb->base;
    return 0;
}
