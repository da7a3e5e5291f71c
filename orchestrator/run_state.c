/* run_state.c - the run state transition table.  See run_state.h for why each edge exists. */
#include "run_state.h"

#include <string.h>

static const char *const names[RUN_STATE_COUNT] = {
    [RUN_PENDING] = "pending",
    [RUN_SUBMITTED] = "submitted",
    [RUN_RUNNING] = "running",
    [RUN_REQUEUED] = "requeued",
    [RUN_COMPLETED] = "completed",
    [RUN_FAILED] = "failed",
    [RUN_CANCELLED] = "cancelled",
    [RUN_TIMEOUT] = "timeout",
};

#define TO(s) (1u << (s))

/* allowed[from] is the set of states `from` may move to.  This is the only place that says
 * which transitions are legal. */
static const unsigned allowed[RUN_STATE_COUNT] = {
    [RUN_PENDING] = TO(RUN_SUBMITTED) | TO(RUN_FAILED) | TO(RUN_CANCELLED),
    [RUN_SUBMITTED] = TO(RUN_RUNNING) | TO(RUN_REQUEUED) | TO(RUN_COMPLETED) | TO(RUN_FAILED) |
                      TO(RUN_CANCELLED) | TO(RUN_TIMEOUT),
    [RUN_RUNNING] = TO(RUN_REQUEUED) | TO(RUN_COMPLETED) | TO(RUN_FAILED) | TO(RUN_CANCELLED) |
                    TO(RUN_TIMEOUT),
    [RUN_REQUEUED] = TO(RUN_SUBMITTED) | TO(RUN_FAILED) | TO(RUN_CANCELLED),
    [RUN_COMPLETED] = 0,
    [RUN_FAILED] = 0,
    [RUN_CANCELLED] = TO(RUN_REQUEUED),
    [RUN_TIMEOUT] = 0,
};

const char *run_state_name(run_state s)
{
    return (unsigned)s < RUN_STATE_COUNT ? names[s] : "?";
}

int run_state_parse(const char *name, run_state *out, hearth_err *err)
{
    for (int i = 0; i < RUN_STATE_COUNT; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = (run_state)i;
            return 0;
        }
    return herr_set(err, HERR_CONFIG,
                    "unknown run state '%s' (expected pending, submitted, running, requeued, "
                    "completed, failed, cancelled or timeout)", name ? name : "");
}

int run_state_can_transition(run_state from, run_state to)
{
    if ((unsigned)from >= RUN_STATE_COUNT || (unsigned)to >= RUN_STATE_COUNT)
        return 0;
    return (allowed[from] & TO(to)) != 0;
}

int run_state_check_transition(run_state from, run_state to, hearth_err *err)
{
    if (run_state_can_transition(from, to))
        return 0;
    return herr_set(err, HERR_RUNTIME, "illegal run state transition %s -> %s",
                    run_state_name(from), run_state_name(to));
}

int run_state_is_terminal(run_state s)
{
    return s == RUN_COMPLETED || s == RUN_FAILED || s == RUN_CANCELLED || s == RUN_TIMEOUT;
}

run_state run_state_for_exit_code(int code)
{
    if (code == 0)
        return RUN_COMPLETED;
    if (code == 75)
        return RUN_REQUEUED;
    return RUN_FAILED;
}
