/* fp8_plan.h - which linears of a model compute in FP8 (precision.fp8, docs/fp8.md): the
 * names of components and linear kinds, the plan (rules and keep_bf16 entries) and the
 * question "does this linear use FP8".
 *
 * Part of the pure model-shape/layout rules module: the trainer's model follows a plan
 * (model/fp8.h), the orchestrator asks the same question of the plan it derives, so both
 * read a policy alike.
 *
 * Ownership: a plan's rule and keep arrays belong to the plan (fp8_plan_clear). */
#ifndef HEARTH_FP8_PLAN_H
#define HEARTH_FP8_PLAN_H

#include <stdint.h>

typedef enum { FP8_COMP_ENCODER = 0, FP8_COMP_PROJECTOR, FP8_COMP_DECODER, FP8_COMPS } fp8_comp;

/* Linear kinds (the names of policies and layer benchmarks).  fc1 is the swiglu gate_up,
 * fc2 its down projection. */
typedef enum {
    FP8_QKV = 0, FP8_PROJ, FP8_FC1, FP8_FC2, FP8_EXPERT_FC1, FP8_EXPERT_FC2, FP8_SHARED_FC1,
    FP8_SHARED_FC2, FP8_ROUTER, FP8_LM_HEAD, FP8_KINDS
} fp8_kind_id;

const char *fp8_comp_name(int comp);      /* "encoder", ... */
const char *fp8_kind_name(int kind);      /* "qkv", ..., "lm_head" */
int fp8_comp_parse(const char *s);        /* -1 when unknown */
int fp8_kind_parse(const char *s);
/* Whether component comp has linears of `kind` at all (the encoder: qkv, proj, fc1, fc2;
 * the projector: fc1, fc2; the decoder: every kind). */
int fp8_comp_has_kind(int comp, int kind);

#define FP8_ANY (-1)
#define FP8_LAST_LAYER (-2)

/* A linear kind of a component in FP8 from min_tokens tokens (of the micro batch through
 * that layer) up to max_tokens (0: no upper bound), when the component's tp is tp. */
typedef struct {
    int comp, kind, tp;
    int64_t min_tokens, max_tokens;
    double speedup;                       /* evidence, not used by the decision */
} fp8_rule;

/* Linears kept in high precision whatever the rules say: comp, kind and layer (global
 * index within the component, or FP8_LAST_LAYER) each FP8_ANY or a value. */
typedef struct {
    int comp, kind, layer;
} fp8_keep;

typedef struct {
    int all;              /* every linear except the router and the LM head */
    fp8_rule *rules;
    int n_rules;
    fp8_keep *keep;
    int n_keep;
    int history;          /* amax history length (>= 1) */
    int margin;           /* scale = fp8_max / amax / 2^margin */
    int current;          /* current scaling instead of delayed */
} fp8_plan;

#define FP8_DEFAULT_HISTORY 16

/* Parses a keep_bf16 name: KIND | COMPONENT | COMPONENT.KIND |
 * COMPONENT.layers.(N|first|last).  Returns 0, or -1 when the name is none of these (*k
 * is then unspecified). */
int fp8_keep_parse(const char *name, fp8_keep *k);

/* Frees the rule and keep arrays (owned by the plan) and zeroes it. */
void fp8_plan_clear(fp8_plan *p);
/* Whether a linear of `kind` in layer `layer` (FP8_ANY for the projector and the head) of
 * `comp`, which has n_layers layers and tensor-parallel size tp, runs in FP8 for a micro
 * batch of `tokens` tokens.  keep_bf16 wins over rules and over `all`. */
int fp8_plan_uses(const fp8_plan *p, int comp, int kind, int layer, int n_layers, int tp,
                  int64_t tokens);

#endif
