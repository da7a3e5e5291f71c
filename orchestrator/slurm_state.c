/* slurm_state.c - Slurm job states and exit codes to hearth's terms.  See slurm_state.h. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rundir.h"
#include "slurm_state.h"

slurm_state slurm_state_classify(const char *state)
{
    static const char *const alive[] = {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
        "RESV_DEL_HOLD", "SPECIAL_EXIT",
    };
    if (!state)
        return SLURM_ST_UNKNOWN;
    for (size_t i = 0; i < sizeof alive / sizeof alive[0]; i++)
        if (strcmp(state, alive[i]) == 0)
            return SLURM_ST_ALIVE;
    if (!strcmp(state, "COMPLETED") || !strcmp(state, "FAILED") ||
        !strcmp(state, "OUT_OF_MEMORY"))
        return SLURM_ST_DONE;
    if (!strncmp(state, "CANCELLED", 9))
        return SLURM_ST_CANCELLED;
    if (!strcmp(state, "TIMEOUT") || !strcmp(state, "DEADLINE"))
        return SLURM_ST_TIMEOUT;
    if (!strcmp(state, "NODE_FAIL") || !strcmp(state, "PREEMPTED") ||
        !strcmp(state, "BOOT_FAIL"))
        return SLURM_ST_REQUEUE;
    return SLURM_ST_UNKNOWN;
}

int slurm_job_exit_code(const char *run_dir, const char *job_id, int *code)
{
    char path[4200], buf[128];
    if (rundir_path(path, sizeof path, run_dir, "exit_code.job", NULL))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        char who[BACKEND_JOB_ID_MAX] = "";
        if (n > 0) {
            buf[n] = 0;
            sscanf(buf, "%63s", who);
        }
        if (who[0] && strcmp(who, job_id) != 0)
            return 0;
    }
    return rundir_exit_code(run_dir, code);
}

int slurm_wait_status_code(long long raw)
{
    int st = (int)(raw & 0xffff);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return (st >> 8) & 0xff;
}

void slurm_state_event(const char *run_dir, const char *job_id, void *tag, slurm_state st,
                       int slurm_code, int cancelled, backend_event *e)
{
    memset(e, 0, sizeof *e);
    e->tag = tag;
    snprintf(e->job_id, sizeof e->job_id, "%s", job_id);
    int code = 0;
    if (slurm_job_exit_code(run_dir, job_id, &code)) {
        e->has_exit_code = 1;
        e->exit_code = code;
    } else if (slurm_code >= 0) {
        e->has_exit_code = 1;
        e->exit_code = slurm_code;
    }
    switch (st) {
    case SLURM_ST_CANCELLED: e->how = BACKEND_CANCELLED; break;
    case SLURM_ST_TIMEOUT: e->how = BACKEND_TIMEOUT; break;
    case SLURM_ST_REQUEUE: e->how = BACKEND_REQUEUE; break;
    case SLURM_ST_DONE: e->how = e->has_exit_code ? BACKEND_EXITED : BACKEND_VANISHED; break;
    default: e->how = e->has_exit_code && !cancelled ? BACKEND_EXITED : BACKEND_VANISHED;
    }
    if (cancelled && e->how != BACKEND_EXITED)
        e->how = BACKEND_CANCELLED;
}
