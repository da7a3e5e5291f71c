/* bootstrap.c - choosing the bootstrap source and the accessors (see bootstrap.h). */
#include "bootstrap_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#define DEFAULT_TIMEOUT_S 300

static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* Parses a whole decimal integer in [lo, hi]; the message names the variable. */
static int env_int(char *const *envp, const char *name, long lo, long hi, long *v,
                   hearth_err *err)
{
    const char *s = env_get(envp, name);
    if (!s || !*s)
        return herr_set(err, HERR_CONFIG, "%s: not set", name);
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || end == s)
        return herr_set(err, HERR_CONFIG, "%s=%s: expected an integer", name, s);
    if (x < lo || x > hi)
        return herr_set(err, HERR_CONFIG, "%s=%s: expected %ld..%ld", name, s, lo, hi);
    *v = x;
    return 0;
}

static bootstrap *bootstrap_alloc(void)
{
    bootstrap *b = calloc(1, sizeof *b);
    if (b)
        b->size = 1;
    return b;
}

static int init_single(bootstrap *b)
{
    b->kind = BOOTSTRAP_SINGLE;
    b->rank = 0;
    b->size = 1;
    b->local_rank = 0;
    if (gethostname(b->node, sizeof b->node - 1))
        strcpy(b->node, "localhost");
    return 0;
}

static int init_env(bootstrap *b, char *const *envp, hearth_err *err)
{
    long rank, size, local = -1, port;
    int rc;
    if ((rc = env_int(envp, "WORLD_SIZE", 1, 1 << 20, &size, err)) ||
        (rc = env_int(envp, "RANK", 0, size - 1, &rank, err)))
        return rc;
    if (env_get(envp, "LOCAL_RANK") &&
        (rc = env_int(envp, "LOCAL_RANK", 0, size - 1, &local, err)))
        return rc;
    if (size == 1) {
        init_single(b);
        b->kind = BOOTSTRAP_ENV;
        return 0;
    }
    const char *addr = env_get(envp, "MASTER_ADDR");
    if (!addr || !*addr)
        return herr_set(err, HERR_CONFIG, "MASTER_ADDR: not set (needed with WORLD_SIZE=%ld)",
                        size);
    if ((rc = env_int(envp, "MASTER_PORT", 1, 65535, &port, err)))
        return rc;
    bootstrap_tcp_opts o = {
        .rank = (int)rank, .size = (int)size, .local_rank = (int)local,
        .master_addr = addr, .master_port = (int)port, .timeout_ms = b->timeout_ms,
    };
    return bootstrap_tcp_join(b, &o, err);
}

/* Chooses the source (see bootstrap.h for the order) and joins the job. */
static int join(bootstrap *b, char *const *envp, hearth_err *err)
{
    const char *force = env_get(envp, "HEARTH_BOOTSTRAP");
    const char *mpi = env_get(envp, "SLURM_MPI_TYPE");
    const char *step_tasks = env_get(envp, "SLURM_STEP_NUM_TASKS");
    long timeout_s = DEFAULT_TIMEOUT_S;
    int rc;
    if (env_get(envp, "HEARTH_BOOTSTRAP_TIMEOUT") &&
        (rc = env_int(envp, "HEARTH_BOOTSTRAP_TIMEOUT", 1, INT_MAX / 1000, &timeout_s, err)))
        return rc;
    b->timeout_ms = (int)timeout_s * 1000;
    if (force && *force && strcmp(force, "pmix") && strcmp(force, "env") &&
        strcmp(force, "single"))
        return herr_set(err, HERR_CONFIG, "HEARTH_BOOTSTRAP=%s: expected pmix, env or single",
                        force);
    if (force && !strcmp(force, "single"))
        return init_single(b);
    if (force && !strcmp(force, "env"))
        return init_env(b, envp, err);
    /* SLURM_MPI_TYPE alone is also exported into batch scripts, which are no step and have
     * no PMIx server: there it means nothing. */
    if ((force && !strcmp(force, "pmix")) ||
        (env_get(envp, "PMIX_RANK") && env_get(envp, "PMIX_NAMESPACE")) ||
        (mpi && !strncmp(mpi, "pmix", 4) && step_tasks))
        return bootstrap_pmix_join(b, err);
    if (env_get(envp, "RANK") || env_get(envp, "WORLD_SIZE"))
        return init_env(b, envp, err);
    /* srun started several tasks but gave them no PMIx: each would think it is alone and
     * the job would silently train N copies. */
    if (step_tasks && strcmp(step_tasks, "1"))
        return herr_set(err, HERR_CONFIG, "srun started %s tasks without PMIx: launch with "
                        "`srun --mpi=pmix` (or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                        step_tasks);
    return init_single(b);
}

int bootstrap_init_envp(bootstrap **out, char *const *envp, hearth_err *err)
{
    *out = NULL;
    if (!envp)
        envp = environ;
    bootstrap *b = bootstrap_alloc();
    if (!b)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = join(b, envp, err);
    if (rc) {
        herr_prefix(err, rc, "bootstrap");
        bootstrap_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

int bootstrap_init(bootstrap **out, hearth_err *err)
{
    return bootstrap_init_envp(out, NULL, err);
}

int bootstrap_init_tcp(bootstrap **out, const bootstrap_tcp_opts *o, hearth_err *err)
{
    *out = NULL;
    bootstrap *b = bootstrap_alloc();
    if (!b)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = bootstrap_tcp_join(b, o, err);
    if (rc) {
        bootstrap_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

int bootstrap_rank(const bootstrap *b) { return b->rank; }
int bootstrap_size(const bootstrap *b) { return b->size; }
int bootstrap_local_rank(const bootstrap *b) { return b->local_rank; }
const char *bootstrap_node_name(const bootstrap *b) { return b->node; }
bootstrap_kind bootstrap_get_kind(const bootstrap *b) { return b->kind; }

const char *bootstrap_kind_name(bootstrap_kind k)
{
    switch (k) {
    case BOOTSTRAP_SINGLE: return "single";
    case BOOTSTRAP_ENV: return "env";
    case BOOTSTRAP_PMIX: return "pmix";
    }
    return "?";
}

int bootstrap_allgather_blob(bootstrap *b, const void *mine, size_t n, void *all,
                             hearth_err *err)
{
    int rc = 0;
    if (b->size == 1) {
        memmove(all, mine, n);
        return 0;
    }
    if (b->kind == BOOTSTRAP_PMIX)
        rc = bootstrap_pmix_allgather(b, mine, n, all, err);
    else
        rc = bootstrap_tcp_allgather(b, mine, n, all, err);
    if (rc)
        herr_prefix(err, rc, "rank %d: all-gather", b->rank);
    return rc;
}

void bootstrap_free(bootstrap *b)
{
    if (!b)
        return;
    if (b->kind == BOOTSTRAP_PMIX)
        bootstrap_pmix_close(b);
    else
        bootstrap_tcp_close(b);
    free(b);
}
