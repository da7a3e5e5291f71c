/* ptrun.c - a short multi-rank training run for the unit tests (see ptrun.h). */
#include "ptrun.h"

#include <string.h>

#include "parallel/ptrain_local.h"

int ptrun_train(const run_config *cfg, int steps, int timeout_ms, double *loss,
                double *grad_norm, model **full, hearth_err *err)
{
    *full = NULL;
    ptrain_local *p = NULL;
    int rc = ptrain_local_create(&p, cfg, timeout_ms, err);
    if (rc)
        return herr_prefix(err, rc, "create");
    for (int s = 0; s < steps; s++) {
        train_step_stats st;
        if ((rc = ptrain_local_step(p, &st, err))) {
            ptrain_local_free(p);
            return herr_prefix(err, rc, "step %d", s + 1);
        }
        loss[s] = st.loss;
        grad_norm[s] = st.grad_norm;
    }
    model *m = NULL;
    if ((rc = model_create(&m, &cfg->model, cfg->train.seed, err))) {
        ptrain_local_free(p);
        return rc;
    }
    /* Zeroed first: a parameter that no rank gathers shows up as a difference. */
    memset(model_params(m), 0, model_param_count(m) * sizeof(float));
    rc = ptrain_local_gather(p, m, err);
    ptrain_local_free(p);
    if (rc) {
        model_free(m);
        return herr_prefix(err, rc, "gather");
    }
    *full = m;
    return 0;
}
