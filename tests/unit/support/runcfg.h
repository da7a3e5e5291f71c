/* runcfg.h - run configs for the unit tests: a base YAML text plus "KEY=VALUE" overrides
 * (the form hearth-train takes with --set) and an optional train.seed, parsed by
 * run_config_parse() under the name "test.yaml".
 *
 * The overrides are applied in the order they were added (a later one wins), so a test
 * chooses whether its seed or its own KEY=VALUE list comes last.  The list holds pointers
 * to the caller's strings (which must outlive runcfg_parse) and to its own seed text, so
 * it is filled in place and never copied.  No cmocka dependency (the bench links the
 * support files too): errors come back as herr codes and the test asserts on them. */
#ifndef HEARTH_RUNCFG_H
#define HEARTH_RUNCFG_H

#include <stdint.h>

#include "shape/err.h"
#include "shape/run_config.h"

#define RUNCFG_MAX 48

typedef struct {
    config_override ovr[RUNCFG_MAX];
    int n;
    int overflow;        /* more were added than fit: runcfg_parse fails */
    char seed_text[24];
} runcfg_list;

void runcfg_init(runcfg_list *l);
/* One override: value NULL means `key` is the raw "KEY=VALUE" text. */
void runcfg_add(runcfg_list *l, const char *key, const char *value);
/* Raw "KEY=VALUE" strings kv[0..n); n < 0: kv is NULL-terminated (kv may be NULL). */
void runcfg_add_kv(runcfg_list *l, const char *const *kv, int n);
/* train.seed = seed (at most one per list). */
void runcfg_add_seed(runcfg_list *l, uint64_t seed);

/* Parses `yaml` with the list's overrides into *c (run_config_parse's single_rank_only
 * is `single`).  0, or a negative herr code with err set. */
int runcfg_parse(run_config *c, const char *yaml, const runcfg_list *l, int single,
                 hearth_err *err);

#endif
