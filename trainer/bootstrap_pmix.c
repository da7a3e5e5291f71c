/* bootstrap_pmix.c - rank, size, local rank, host and the blob all-gather from PMIx
 * (the server is Slurm's slurmstepd under `srun --mpi=pmix`, or OpenMPI's mpirun).
 *
 * The all-gather publishes the blob under a key unique to this call ("hearth.bs.<seq>":
 * every rank makes the same sequence of calls, so the keys agree), commits, fences with
 * PMIX_COLLECT_DATA so that the data of every rank is local afterwards, and reads each
 * peer's value back.  PMIx delivers values as they were put, so a peer that passed a
 * different size is seen (and named) by every rank. */
#include "bootstrap_impl.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pmix.h>

static pmix_proc_t *self_of(bootstrap *b) { return b->pmix_self; }

/* Reads a job-level (wildcard rank) or own-proc value of the expected type. */
static int get_value(const pmix_proc_t *proc, const char *key, pmix_data_type_t type,
                     pmix_value_t **val, hearth_err *err)
{
    pmix_status_t st = PMIx_Get(proc, key, NULL, 0, val);
    if (st != PMIX_SUCCESS)
        return herr_set(err, HERR_RUNTIME, "PMIx_Get(%s): %s", key, PMIx_Error_string(st));
    if ((*val)->type != type) {
        int t = (*val)->type;
        PMIX_VALUE_RELEASE(*val);
        return herr_set(err, HERR_RUNTIME, "PMIx_Get(%s): unexpected type %d", key, t);
    }
    return 0;
}

int bootstrap_pmix_join(bootstrap *b, hearth_err *err)
{
    b->kind = BOOTSTRAP_PMIX;
    pmix_proc_t *self = calloc(1, sizeof *self);
    if (!self)
        return herr_set(err, HERR_NOMEM, "out of memory");
    pmix_status_t st = PMIx_Init(self, NULL, 0);
    if (st != PMIX_SUCCESS) {
        free(self);
        return herr_set(err, HERR_RUNTIME, "PMIx_Init: %s (under Slurm, launch with "
                        "`srun --mpi=pmix`; or unset the PMIx variables to use RANK/"
                        "WORLD_SIZE/MASTER_ADDR/MASTER_PORT)", PMIx_Error_string(st));
    }
    b->pmix_self = self;   /* from here on bootstrap_pmix_close finalizes */
    b->rank = (int)self->rank;

    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, self->nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    int rc = get_value(&job, PMIX_JOB_SIZE, PMIX_UINT32, &v, err);
    if (rc)
        return rc;
    b->size = (int)v->data.uint32;
    PMIX_VALUE_RELEASE(v);
    if (b->size < 1 || b->rank < 0 || b->rank >= b->size)
        return herr_set(err, HERR_RUNTIME, "PMIx: rank %d of job size %d", b->rank, b->size);

    if ((rc = get_value(self, PMIX_LOCAL_RANK, PMIX_UINT16, &v, err)))
        return rc;
    b->local_rank = v->data.uint16;
    PMIX_VALUE_RELEASE(v);

    /* The host name as the launcher knows it: under simulated Slurm nodes on one machine
     * it is the node's name, not the machine's. */
    if (PMIx_Get(self, PMIX_HOSTNAME, NULL, 0, &v) == PMIX_SUCCESS) {
        if (v->type == PMIX_STRING && v->data.string)
            snprintf(b->node, sizeof b->node, "%s", v->data.string);
        PMIX_VALUE_RELEASE(v);
    }
    if (!b->node[0] && gethostname(b->node, sizeof b->node - 1))
        strcpy(b->node, "localhost");
    return 0;
}

int bootstrap_pmix_allgather(bootstrap *b, const void *mine, size_t n, void *all,
                             hearth_err *err)
{
    pmix_proc_t *self = self_of(b);
    char key[PMIX_MAX_KEYLEN + 1];
    snprintf(key, sizeof key, "hearth.bs.%u", b->seq++);

    pmix_value_t val;
    PMIX_VALUE_CONSTRUCT(&val);
    val.type = PMIX_BYTE_OBJECT;
    val.data.bo.bytes = (char *)mine;   /* PMIx_Put copies; not released here */
    val.data.bo.size = n;
    pmix_status_t st = PMIx_Put(PMIX_GLOBAL, key, &val);
    if (st != PMIX_SUCCESS)
        return herr_set(err, HERR_RUNTIME, "PMIx_Put: %s", PMIx_Error_string(st));
    if ((st = PMIx_Commit()) != PMIX_SUCCESS)
        return herr_set(err, HERR_RUNTIME, "PMIx_Commit: %s", PMIx_Error_string(st));

    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, self->nspace, PMIX_RANK_WILDCARD);
    /* A rank that never arrives (crashed before the fence) must not hang the others
     * forever: PMIX_TIMEOUT bounds the fence where the server supports it. */
    pmix_info_t info[2];
    bool collect = true;
    int timeout_s = b->timeout_ms > 0 ? (b->timeout_ms + 999) / 1000 : 0;
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &timeout_s, PMIX_INT);
    st = PMIx_Fence(&job, 1, info, timeout_s > 0 ? 2 : 1);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (st != PMIX_SUCCESS)
        return herr_set(err, HERR_RUNTIME, "PMIx_Fence: %s", PMIx_Error_string(st));

    /* Copy our own blob last: mine may alias our slot of all. */
    unsigned char *out = all;
    for (int i = 0; i < b->size; i++) {
        if (i == b->rank)
            continue;
        pmix_proc_t peer;
        PMIX_LOAD_PROCID(&peer, self->nspace, (pmix_rank_t)i);
        pmix_value_t *v = NULL;
        st = PMIx_Get(&peer, key, NULL, 0, &v);
        if (st != PMIX_SUCCESS)
            return herr_set(err, HERR_RUNTIME, "PMIx_Get(%s) from rank %d: %s", key, i,
                            PMIx_Error_string(st));
        int bad = v->type != PMIX_BYTE_OBJECT || v->data.bo.size != n;
        size_t got = v->type == PMIX_BYTE_OBJECT ? v->data.bo.size : 0;
        if (!bad)
            memcpy(out + (size_t)i * n, v->data.bo.bytes, n);
        PMIX_VALUE_RELEASE(v);
        if (bad)
            return herr_set(err, HERR_RUNTIME, "rank %d published %zu bytes, rank %d has "
                            "%zu (every rank must pass the same size)", i, got, b->rank, n);
    }
    memmove(out + (size_t)b->rank * n, mine, n);
    return 0;
}

void bootstrap_pmix_close(bootstrap *b)
{
    if (!b->pmix_self)
        return;
    PMIx_Finalize(NULL, 0);
    free(b->pmix_self);
    b->pmix_self = NULL;
}
