/* backend.c - choosing a backend by name.  See backend.h. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "rundir.h"

int backend_open(const char *name, backend **out, hearth_err *err)
{
    *out = NULL;
    if (!name || strcmp(name, "local") == 0)
        return backend_local_create(out, 0, err);
    if (strcmp(name, "slurm") == 0)
        return backend_slurm_create(out, err);
    if (strcmp(name, "slurmrest") == 0)
        return backend_slurmrest_create(out, NULL, NULL, err);
    return herr_set(err, HERR_CONFIG, "--backend %s: unknown backend (expected local, slurm "
                    "or slurmrest)", name);
}

void backend_free(backend *b)
{
    if (b)
        b->ops->free(b);
}

double backend_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void backend_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

int backend_poll_due(double *last_query, int interval_ms, size_t n_jobs, int timeout_ms)
{
    double due = *last_query + interval_ms / 1000.0;
    double now = backend_clock_s();
    if (n_jobs == 0 || (*last_query > 0 && now < due)) {
        double wait_ms = n_jobs == 0 ? timeout_ms : (due - now) * 1000.0;
        if (wait_ms > timeout_ms)
            wait_ms = timeout_ms;
        if (wait_ms > 0)
            backend_sleep_ms((int)wait_ms + 1);
        if (n_jobs == 0 || backend_clock_s() < due)
            return 0;
    }
    *last_query = backend_clock_s();
    return 1;
}

int backend_check_one_process(const char *run_dir, const char *backend, hearth_err *err)
{
    rundir_job rj;
    hearth_err e;
    if (rundir_job_read(run_dir, &rj, &e))
        return 0;
    int nodes = rj.nodes, gpus = rj.gpus_per_node;
    rundir_job_free(&rj);
    if (gpus <= 0 || (long long)nodes * gpus <= 1)
        return 0;
    return herr_set(err, HERR_CONFIG, "device cuda with %lld ranks (resources.nodes %d x "
                    "resources.gpus_per_node %d) needs one process per GPU, started by "
                    "`srun --mpi=pmix`: submit it with --backend slurm; the %s backend "
                    "runs cuda with resources.gpus_per_node 1 and nodes 1 only",
                    (long long)nodes * gpus, nodes, gpus, backend);
}
