/* fp8_plan.c - names, keep_bf16 entries and the FP8 decision of a plan (fp8_plan.h). */
#include "shape/fp8_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const COMP_NAMES[FP8_COMPS] = { "encoder", "projector", "decoder" };
static const char *const KIND_NAMES[FP8_KINDS] = {
    "qkv", "proj", "fc1", "fc2", "expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2",
    "router", "lm_head",
};

const char *fp8_comp_name(int c) { return c >= 0 && c < FP8_COMPS ? COMP_NAMES[c] : "?"; }
const char *fp8_kind_name(int k) { return k >= 0 && k < FP8_KINDS ? KIND_NAMES[k] : "?"; }

int fp8_comp_parse(const char *s)
{
    for (int i = 0; i < FP8_COMPS; i++)
        if (!strcmp(s, COMP_NAMES[i]))
            return i;
    return -1;
}

int fp8_kind_parse(const char *s)
{
    for (int i = 0; i < FP8_KINDS; i++)
        if (!strcmp(s, KIND_NAMES[i]))
            return i;
    return -1;
}

int fp8_comp_has_kind(int comp, int kind)
{
    if (kind < 0 || kind >= FP8_KINDS)
        return 0;
    if (comp == FP8_COMP_PROJECTOR)
        return kind == FP8_FC1 || kind == FP8_FC2;
    if (comp == FP8_COMP_ENCODER)
        return kind == FP8_QKV || kind == FP8_PROJ || kind == FP8_FC1 || kind == FP8_FC2;
    return comp == FP8_COMP_DECODER;
}

int fp8_keep_parse(const char *name, fp8_keep *k)
{
    *k = (fp8_keep){ FP8_ANY, FP8_ANY, FP8_ANY };
    char buf[128];
    if (snprintf(buf, sizeof buf, "%s", name) >= (int)sizeof buf)
        return -1;
    char *dot = strchr(buf, '.');
    if (dot)
        *dot++ = 0;
    if (!dot && (k->kind = fp8_kind_parse(buf)) >= 0)
        return 0;
    if ((k->comp = fp8_comp_parse(buf)) < 0)
        return -1;
    if (!dot)
        return 0;
    if (!strncmp(dot, "layers.", 7) && k->comp != FP8_COMP_PROJECTOR) {
        const char *l = dot + 7;
        char *end;
        long v = strtol(l, &end, 10);
        if (!strcmp(l, "first"))
            k->layer = 0;
        else if (!strcmp(l, "last"))
            k->layer = FP8_LAST_LAYER;
        else if (*l && !*end && v >= 0 && v < 1000000)
            k->layer = (int)v;
        else
            return -1;
        return 0;
    }
    k->kind = fp8_kind_parse(dot);
    return fp8_comp_has_kind(k->comp, k->kind) ? 0 : -1;
}

void fp8_plan_clear(fp8_plan *p)
{
    free(p->rules);
    free(p->keep);
    memset(p, 0, sizeof *p);
}

static int keep_matches(const fp8_keep *k, int comp, int kind, int layer, int n_layers)
{
    if (k->comp != FP8_ANY && k->comp != comp)
        return 0;
    if (k->kind != FP8_ANY && k->kind != kind)
        return 0;
    if (k->layer == FP8_ANY)
        return 1;
    if (layer < 0)
        return 0;
    return k->layer == FP8_LAST_LAYER ? layer == n_layers - 1 : k->layer == layer;
}

int fp8_plan_uses(const fp8_plan *p, int comp, int kind, int layer, int n_layers, int tp,
                  int64_t tokens)
{
    if (!p)
        return 0;
    for (int i = 0; i < p->n_keep; i++)
        if (keep_matches(&p->keep[i], comp, kind, layer, n_layers))
            return 0;
    if (p->all)
        return kind != FP8_ROUTER && kind != FP8_LM_HEAD;
    for (int i = 0; i < p->n_rules; i++) {
        const fp8_rule *r = &p->rules[i];
        if (r->comp == comp && r->kind == kind && r->tp == tp && tokens >= r->min_tokens &&
            (r->max_tokens <= 0 || tokens <= r->max_tokens))
            return 1;
    }
    return 0;
}
