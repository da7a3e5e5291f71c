/* ptrain_local.c - every rank of a layout as a thread of this process (ptrain_local.h).
 *
 * Rank 0 runs on the caller's thread; ranks 1..n-1 on worker threads that wait for
 * commands (create, step, gather, quit).  A command is published under the mutex with a
 * new generation number; each worker runs it on its own ptrain and counts itself done;
 * the caller runs rank 0's part meanwhile and then waits for the others.  The ranks meet
 * inside the collectives of the command itself, so there is no other synchronisation. */
#include "parallel/ptrain_local.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ptrain.h"

enum { CMD_CREATE = 0, CMD_STEP, CMD_GATHER, CMD_SCATTER, CMD_SAVE, CMD_LOAD, CMD_QUIT };

typedef struct ptrain_local_rank ptrain_local_rank;

struct ptrain_local_rank {
    ptrain_local *owner;
    int rank;
    comm *world;
    ptrain *tr;
    int rc;
    hearth_err err;
    train_step_stats st;
    float *gather_buf;      /* workers: a private copy of the gathered parameters */
};

struct ptrain_local {
    run_config cfg;
    int n;
    comm_world *w;
    ptrain_local_rank *r;   /* [n] */
    pthread_t *th;          /* [n]; th[0] unused */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_cmd, cv_done;
    int cmd;
    unsigned gen;
    int n_done;
    int first_fail;         /* the rank whose error came first (-1: none) */
    model *gather_full;
    const char *ckpt_dir;   /* CMD_SAVE / CMD_LOAD */
    int ckpt_step;
};

static void rank_threads(int n)
{
    int procs = omp_get_num_procs();
    omp_set_num_threads(procs / n > 1 ? procs / n : 1);
}

static void run_cmd(ptrain_local_rank *r, int cmd)
{
    ptrain_local *p = r->owner;
    switch (cmd) {
    case CMD_CREATE:
        rank_threads(p->n);
        r->rc = comm_local_world_rank(p->w, r->rank, &r->world, &r->err);
        if (!r->rc)
            r->rc = ptrain_create(&r->tr, &p->cfg, r->world, &r->err);
        break;
    case CMD_STEP:
        r->rc = ptrain_step(r->tr, &r->st, &r->err);
        break;
    case CMD_GATHER: {
        float *dst = model_params(p->gather_full);
        if (r->rank > 0) {
            size_t n = model_param_count(p->gather_full);
            free(r->gather_buf);
            r->gather_buf = malloc((n ? n : 1) * sizeof(float));
            if (!r->gather_buf) {
                r->rc = herr_set(&r->err, HERR_NOMEM, "gather: out of memory");
                break;
            }
            dst = r->gather_buf;
        }
        r->rc = ptrain_gather(r->tr, p->gather_full, dst, &r->err);
        break;
    }
    case CMD_SCATTER:
        r->rc = ptrain_scatter(r->tr, p->gather_full, &r->err);
        break;
    case CMD_SAVE:
        r->rc = ptrain_save(r->tr, p->ckpt_dir, &r->err);
        break;
    case CMD_LOAD:
        r->rc = ptrain_load(r->tr, p->ckpt_dir, p->ckpt_step, &r->err);
        break;
    default:
        break;
    }
    if (r->rc < 0) {
        /* The others may be waiting for this rank in a collective: stop them, and keep
         * this rank's error as the cause (theirs only say the world was aborted). */
        pthread_mutex_lock(&p->mu);
        if (p->first_fail < 0)
            p->first_fail = r->rank;
        pthread_mutex_unlock(&p->mu);
        comm_local_world_abort(p->w);
    }
}

static void *worker(void *arg)
{
    ptrain_local_rank *r = arg;
    ptrain_local *p = r->owner;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen)
            pthread_cond_wait(&p->cv_cmd, &p->mu);
        seen = p->gen;
        int cmd = p->cmd;
        pthread_mutex_unlock(&p->mu);
        if (cmd == CMD_QUIT)
            return NULL;
        run_cmd(r, cmd);
        pthread_mutex_lock(&p->mu);
        p->n_done++;
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Runs cmd on every rank; returns the first error (lowest rank). */
static int broadcast_cmd(ptrain_local *p, int cmd, hearth_err *err)
{
    pthread_mutex_lock(&p->mu);
    p->cmd = cmd;
    p->n_done = 0;
    p->first_fail = -1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_cmd);
    pthread_mutex_unlock(&p->mu);
    if (cmd == CMD_QUIT)
        return 0;
    run_cmd(&p->r[0], cmd);
    pthread_mutex_lock(&p->mu);
    while (p->n_done < p->n_started)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    if (p->first_fail >= 0) {
        int i = p->first_fail;
        if (err)
            *err = p->r[i].err;
        return p->n > 1 ? herr_prefix(err, p->r[i].rc, "rank %d", i) : p->r[i].rc;
    }
    for (int i = 0; i < p->n; i++)
        if (p->r[i].rc > 0)
            return p->r[i].rc;
    return 0;
}

int ptrain_local_create(ptrain_local **out, const run_config *cfg, int timeout_ms,
                        hearth_err *err)
{
    *out = NULL;
    int n = cfg->ranks;
    if (n < 1)
        return herr_set(err, HERR_CONFIG, "ranks: must be >= 1, got %d", n);
    ptrain_local *p = calloc(1, sizeof *p);
    if (!p)
        return herr_set(err, HERR_NOMEM, "out of memory");
    p->cfg = *cfg;
    p->n = n;
    p->r = calloc((size_t)n, sizeof *p->r);
    p->th = calloc((size_t)n, sizeof *p->th);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_cmd, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (!p->r || !p->th) {
        ptrain_local_free(p);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    comm_local_opts opts = { .timeout_ms = timeout_ms };
    int rc = comm_local_world_create(&p->w, n, &opts, err);
    if (rc) {
        ptrain_local_free(p);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        p->r[i].owner = p;
        p->r[i].rank = i;
    }
    for (int i = 1; i < n; i++) {
        if (pthread_create(&p->th[i], NULL, worker, &p->r[i])) {
            ptrain_local_free(p);
            return herr_set(err, HERR_RUNTIME, "cannot start the thread of rank %d", i);
        }
        p->n_started++;
    }
    if ((rc = broadcast_cmd(p, CMD_CREATE, err))) {
        ptrain_local_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void ptrain_local_free(ptrain_local *p)
{
    if (!p)
        return;
    if (p->n_started) {
        broadcast_cmd(p, CMD_QUIT, NULL);
        for (int i = 1; i <= p->n_started; i++)
            pthread_join(p->th[i], NULL);
    }
    if (p->r)
        for (int i = 0; i < p->n; i++) {
            ptrain_free(p->r[i].tr);
            comm_free(p->r[i].world);
            free(p->r[i].gather_buf);
        }
    comm_local_world_free(p->w);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_cmd);
    pthread_mutex_destroy(&p->mu);
    free(p->r);
    free(p->th);
    free(p);
}

int ptrain_local_step(ptrain_local *p, train_step_stats *st, hearth_err *err)
{
    int rc = broadcast_cmd(p, CMD_STEP, err);
    if (rc >= 0)
        *st = p->r[0].st;
    return rc;
}

int ptrain_local_gather(ptrain_local *p, model *full, hearth_err *err)
{
    p->gather_full = full;
    return broadcast_cmd(p, CMD_GATHER, err);
}

int ptrain_local_scatter(ptrain_local *p, const model *full, hearth_err *err)
{
    p->gather_full = (model *)full;   /* only read by CMD_SCATTER */
    return broadcast_cmd(p, CMD_SCATTER, err);
}

int ptrain_local_save(ptrain_local *p, const char *dir, hearth_err *err)
{
    p->ckpt_dir = dir;
    return broadcast_cmd(p, CMD_SAVE, err);
}

int ptrain_local_load(ptrain_local *p, const char *dir, int step, hearth_err *err)
{
    p->ckpt_dir = dir;
    p->ckpt_step = step;
    return broadcast_cmd(p, CMD_LOAD, err);
}

int ptrain_local_ranks(const ptrain_local *p)
{
    return p->n;
}

model *ptrain_local_model(ptrain_local *p)
{
    return ptrain_model(p->r[0].tr);
}
