/* fp8_policy.c - the FP8 policy file (fp8_policy.h, docs/fp8.md). */
#include "fp8_policy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/yaml_tree.h"

#define FP8_POLICY_VERSION 1

typedef struct {
    const char *file;
    hearth_err *err;
} pctx;

/* "FILE:LINE:COL: key: what" */
static int bad(pctx *x, const yaml_tree_node *n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(pctx *x, const yaml_tree_node *n, const char *key, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return herr_set(x->err, HERR_CONFIG, "%s:%d:%d: %s: %s", x->file, n ? n->line : 1,
                    n ? n->col : 1, key, what);
}

static int get_string(pctx *x, const yaml_tree_node *n, const char *key, const char **out)
{
    if (!n || n->kind != YAML_TREE_SCALAR || yaml_tree_is_null(n)) {
        char got[64] = "nothing";
        if (n)
            yaml_tree_describe(n, got, sizeof got);
        return bad(x, n, key, "expected a string, got %s", got);
    }
    *out = n->text;
    return 0;
}

static int get_int(pctx *x, const yaml_tree_node *n, const char *key, int64_t lo,
                   int64_t *out)
{
    int64_t v;
    if (!n || yaml_tree_as_int(n, &v) != 1 || v < lo) {
        char got[64] = "nothing";
        if (n)
            yaml_tree_describe(n, got, sizeof got);
        return bad(x, n, key, "expected an integer >= %lld, got %s", (long long)lo, got);
    }
    *out = v;
    return 0;
}

static int get_number(pctx *x, const yaml_tree_node *n, const char *key, double *out)
{
    if (!n || yaml_tree_as_double(n, out) != 1) {
        char got[64] = "nothing";
        if (n)
            yaml_tree_describe(n, got, sizeof got);
        return bad(x, n, key, "expected a number, got %s", got);
    }
    return 0;
}

/* Every key of map n is one of `known` (NULL-terminated). */
static int check_keys(pctx *x, const yaml_tree_node *n, const char *where,
                      const char *const *known)
{
    for (int i = 0; i < n->n_pairs; i++) {
        int ok = 0;
        for (int k = 0; known[k] && !ok; k++)
            ok = !strcmp(n->pairs[i].key, known[k]);
        if (!ok) {
            yaml_tree_node at = { .line = n->pairs[i].line, .col = n->pairs[i].col };
            char key[160];
            snprintf(key, sizeof key, "%s%s%s", where, where[0] ? "." : "", n->pairs[i].key);
            return bad(x, &at, key, "unknown key");
        }
    }
    return 0;
}

static int parse_rule(pctx *x, const yaml_tree_node *n, int i, fp8_rule *r)
{
    static const char *const known[] = { "component", "kind", "tp", "min_tokens",
                                         "max_tokens", "measured_speedup", "measured_err",
                                         NULL };
    char where[32], key[64];
    snprintf(where, sizeof where, "rules[%d]", i);
    if (n->kind != YAML_TREE_MAP)
        return bad(x, n, where, "expected a mapping {component, kind, tp, min_tokens, "
                   "measured_speedup}");
    int rc = check_keys(x, n, where, known);
    if (rc)
        return rc;
    const char *s;
    int64_t v;
    snprintf(key, sizeof key, "%s.component", where);
    const yaml_tree_node *c = yaml_tree_get(n, "component");
    if (!c)
        return bad(x, n, key, "missing");
    if ((rc = get_string(x, c, key, &s)))
        return rc;
    if ((r->comp = fp8_comp_parse(s)) < 0)
        return bad(x, c, key, "unknown component \"%s\" (encoder, projector, decoder)", s);
    snprintf(key, sizeof key, "%s.kind", where);
    const yaml_tree_node *k = yaml_tree_get(n, "kind");
    if (!k)
        return bad(x, n, key, "missing");
    if ((rc = get_string(x, k, key, &s)))
        return rc;
    if ((r->kind = fp8_kind_parse(s)) < 0 || !fp8_comp_has_kind(r->comp, r->kind))
        return bad(x, k, key, "%s has no linear kind \"%s\"", fp8_comp_name(r->comp), s);
    snprintf(key, sizeof key, "%s.tp", where);
    const yaml_tree_node *t = yaml_tree_get(n, "tp");
    if (!t)
        return bad(x, n, key, "missing");
    if ((rc = get_int(x, t, key, 1, &v)))
        return rc;
    r->tp = (int)v;
    snprintf(key, sizeof key, "%s.min_tokens", where);
    const yaml_tree_node *mt = yaml_tree_get(n, "min_tokens");
    if (!mt)
        return bad(x, n, key, "missing");
    if ((rc = get_int(x, mt, key, 0, &r->min_tokens)))
        return rc;
    r->max_tokens = 0;
    if ((t = yaml_tree_get(n, "max_tokens"))) {
        snprintf(key, sizeof key, "%s.max_tokens", where);
        if ((rc = get_int(x, t, key, r->min_tokens, &r->max_tokens)))
            return rc;
    }
    r->speedup = 0;
    if ((t = yaml_tree_get(n, "measured_speedup"))) {
        snprintf(key, sizeof key, "%s.measured_speedup", where);
        if ((rc = get_number(x, t, key, &r->speedup)))
            return rc;
    }
    double measured_err;   /* evidence only, as measured_speedup */
    if ((t = yaml_tree_get(n, "measured_err"))) {
        snprintf(key, sizeof key, "%s.measured_err", where);
        if ((rc = get_number(x, t, key, &measured_err)))
            return rc;
    }
    return 0;
}

/* keep_bf16 entry: KIND | COMPONENT | COMPONENT.KIND | COMPONENT.layers.(N|first|last) */
static int parse_keep(pctx *x, const yaml_tree_node *n, int i, fp8_keep *k)
{
    char key[32];
    snprintf(key, sizeof key, "keep_bf16[%d]", i);
    const char *s;
    int rc = get_string(x, n, key, &s);
    if (rc)
        return rc;
    if (fp8_keep_parse(s, k))
        return bad(x, n, key, "\"%s\": expected a kind (e.g. lm_head), a component, "
                   "COMPONENT.KIND (a kind the component has) or "
                   "COMPONENT.layers.N (N an index, first or last)", s);
    return 0;
}

static int parse_scaling(pctx *x, const yaml_tree_node *n, fp8_plan *p)
{
    static const char *const known[] = { "recipe", "history", "margin", NULL };
    if (n->kind != YAML_TREE_MAP)
        return bad(x, n, "scaling", "expected a mapping {recipe, history, margin}");
    int rc = check_keys(x, n, "scaling", known);
    if (rc)
        return rc;
    const yaml_tree_node *v;
    const char *s;
    int64_t i;
    if ((v = yaml_tree_get(n, "recipe"))) {
        if ((rc = get_string(x, v, "scaling.recipe", &s)))
            return rc;
        if (strcmp(s, "delayed") && strcmp(s, "current"))
            return bad(x, v, "scaling.recipe", "expected delayed or current, got \"%s\"", s);
        p->current = !strcmp(s, "current");
    }
    if ((v = yaml_tree_get(n, "history"))) {
        if ((rc = get_int(x, v, "scaling.history", 1, &i)))
            return rc;
        if (i > 4096)
            return bad(x, v, "scaling.history", "at most 4096, got %lld", (long long)i);
        p->history = (int)i;
    }
    if ((v = yaml_tree_get(n, "margin"))) {
        if ((rc = get_int(x, v, "scaling.margin", 0, &i)))
            return rc;
        if (i > 64)
            return bad(x, v, "scaling.margin", "at most 64, got %lld", (long long)i);
        p->margin = (int)i;
    }
    return 0;
}

static int parse_policy(pctx *x, const yaml_tree_node *root, const char *model_name,
                        const char *model_given, const char *gpu, fp8_plan *p)
{
    static const char *const known[] = { "version", "gpu", "model", "threshold", "max_err",
                                         "rules", "keep_bf16", "scaling", NULL };
    if (!root || root->kind != YAML_TREE_MAP)
        return bad(x, root, "policy", "expected a mapping (version, gpu, model, threshold, "
                   "rules, keep_bf16)");
    int rc = check_keys(x, root, "", known);
    if (rc)
        return rc;
    const yaml_tree_node *v;
    int64_t ver;
    if (!(v = yaml_tree_get(root, "version")))
        return bad(x, root, "version", "missing");
    if ((rc = get_int(x, v, "version", 0, &ver)))
        return rc;
    if (ver != FP8_POLICY_VERSION)
        return bad(x, v, "version", "this trainer reads policy version %d, got %lld",
                   FP8_POLICY_VERSION, (long long)ver);
    const char *s;
    if (!(v = yaml_tree_get(root, "gpu")))
        return bad(x, root, "gpu", "missing");
    if ((rc = get_string(x, v, "gpu", &s)))
        return rc;
    if (strcmp(s, gpu))
        return bad(x, v, "gpu", "the policy was measured on \"%s\", this run is on \"%s\" "
                   "(precision.fp8_policy: use a policy selected for this device)", s, gpu);
    if (!(v = yaml_tree_get(root, "model")))
        return bad(x, root, "model", "missing");
    if ((rc = get_string(x, v, "model", &s)))
        return rc;
    if (strcmp(s, model_name) && (!model_given || strcmp(s, model_given)))
        return bad(x, v, "model", "the policy is for model \"%s\", this run trains \"%s\"", s,
                   model_name);
    double th;
    if ((v = yaml_tree_get(root, "threshold")) && (rc = get_number(x, v, "threshold", &th)))
        return rc;
    if ((v = yaml_tree_get(root, "max_err")) && (rc = get_number(x, v, "max_err", &th)))
        return rc;
    if (!(v = yaml_tree_get(root, "rules")))
        return bad(x, root, "rules", "missing (an empty list keeps every linear in high "
                   "precision)");
    if (v->kind != YAML_TREE_SEQ && !yaml_tree_is_null(v))
        return bad(x, v, "rules", "expected a list of {component, kind, tp, min_tokens, "
                   "measured_speedup}");
    int nr = v->kind == YAML_TREE_SEQ ? v->n_items : 0;
    p->rules = calloc((size_t)nr + 1, sizeof *p->rules);
    if (!p->rules)
        return herr_set(x->err, HERR_NOMEM, "out of memory");
    for (int i = 0; i < nr; i++, p->n_rules++)
        if ((rc = parse_rule(x, v->items[i], i, &p->rules[i])))
            return rc;
    int nk = 0;
    if ((v = yaml_tree_get(root, "keep_bf16"))) {
        if (v->kind != YAML_TREE_SEQ && !yaml_tree_is_null(v))
            return bad(x, v, "keep_bf16", "expected a list of names (lm_head, router, "
                       "decoder.layers.0, ...)");
        nk = v->kind == YAML_TREE_SEQ ? v->n_items : 0;
    }
    p->keep = calloc((size_t)nk + 1, sizeof *p->keep);
    if (!p->keep)
        return herr_set(x->err, HERR_NOMEM, "out of memory");
    for (int i = 0; i < nk; i++, p->n_keep++)
        if ((rc = parse_keep(x, v->items[i], i, &p->keep[i])))
            return rc;
    if ((v = yaml_tree_get(root, "scaling")) && (rc = parse_scaling(x, v, p)))
        return rc;
    return 0;
}

int fp8_policy_load(fp8_plan *out, const char *path, const char *model_name,
                    const char *model_given, const char *gpu, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    yaml_tree *t = NULL;
    int rc = yaml_tree_load(&t, path, err);
    if (rc)
        return herr_prefix(err, rc, "precision.fp8_policy");
    pctx x = { path, err };
    out->history = FP8_DEFAULT_HISTORY;
    rc = parse_policy(&x, t->root, model_name, model_given, gpu, out);
    yaml_tree_free(t);
    if (rc)
        fp8_plan_clear(out);
    return rc;
}

int fp8_plan_from_config(fp8_plan *out, const run_config *cfg, const char *gpu,
                         hearth_err *err)
{
    memset(out, 0, sizeof *out);
    out->history = FP8_DEFAULT_HISTORY;
    if (cfg->precision.fp8 == FP8_ALL)
        out->all = 1;
    if (cfg->precision.fp8 != FP8_SELECTIVE)
        return 0;
    if (!cfg->precision.fp8_policy[0])
        return herr_set(err, HERR_CONFIG, "precision.fp8_policy: fp8 selective needs the "
                        "policy file");
    return fp8_policy_load(out, cfg->precision.fp8_policy, cfg->model.name,
                           cfg->model_preset, gpu, err);
}

int fp8_plan_install(model *const *models, int n, const run_config *cfg, const char *gpu,
                     hearth_err *err)
{
    if (cfg->precision.fp8 == FP8_OFF)
        return 0;
    fp8_plan plan;
    memset(&plan, 0, sizeof plan);
    int rc = fp8_plan_from_config(&plan, cfg, gpu, err);
    for (int i = 0; !rc && i < n; i++)
        rc = model_set_fp8(models[i], &plan, err);
    fp8_plan_clear(&plan);
    return rc;
}
