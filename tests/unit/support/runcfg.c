/* runcfg.c - run configs for the unit tests (see runcfg.h). */
#include "runcfg.h"

#include <stdio.h>
#include <string.h>

void runcfg_init(runcfg_list *l)
{
    memset(l, 0, sizeof *l);
}

void runcfg_add(runcfg_list *l, const char *key, const char *value)
{
    if (l->n == RUNCFG_MAX) {
        l->overflow = 1;
        return;
    }
    l->ovr[l->n].key = key;
    l->ovr[l->n].value = value;
    l->n++;
}

void runcfg_add_kv(runcfg_list *l, const char *const *kv, int n)
{
    /* The loader splits a raw override at its first '=' and reports one without it. */
    for (int i = 0; kv && (n < 0 ? kv[i] != NULL : i < n); i++)
        runcfg_add(l, kv[i], NULL);
}

void runcfg_add_seed(runcfg_list *l, uint64_t seed)
{
    snprintf(l->seed_text, sizeof l->seed_text, "%llu", (unsigned long long)seed);
    runcfg_add(l, "train.seed", l->seed_text);
}

int runcfg_parse(run_config *c, const char *yaml, const runcfg_list *l, int single,
                 hearth_err *err)
{
    if (l->overflow)
        return herr_set(err, HERR_CONFIG, "test config: more than %d overrides", RUNCFG_MAX);
    return run_config_parse(c, "test.yaml", yaml, l->ovr, l->n, single, err);
}
