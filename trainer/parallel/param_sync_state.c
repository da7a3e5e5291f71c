/* param_sync_state.c - the optimizer state of param_sync as named arrays, for training
 * checkpoints (param_sync.h). */
#include "parallel/param_sync_internal.h"

/* Two moments per replica bucket kind, in a fixed order. */
static const char *const state_names[PS_REP_KINDS][2] = {
    { "adam_m/encoder_dp", "adam_v/encoder_dp" },
    { "adam_m/expert_dp", "adam_v/expert_dp" },
    { "adam_m/dp_cp", "adam_v/dp_cp" },
};

int param_sync_state_count(const param_sync *s)
{
    (void)s;
    return 2 * PS_REP_KINDS;
}

float *param_sync_state_at(param_sync *s, int i, const char **name, size_t *n)
{
    ps_bucket *b = &s->rep[i / 2];
    *name = state_names[i / 2][i % 2];
    *n = b->hi > b->lo ? b->hi - b->lo : 0;
    return i % 2 ? b->v : b->m;
}
