/* run_config.c - reading a run config: file, --set overrides, defaults, `auto` values,
 * the preset with its `model.*` overrides, the shape checks and the layout rules
 * (run_config.h).  Every error names the place the offending value was written. */
#include "shape/run_config.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/canon_json.h"
#include "shape/fields.h"
#include "shape/shape_internal.h"
#include "shape/yaml_tree.h"

typedef struct {
    run_config c;
    field_state st;                /* the config table over c */
    preset_state ps;               /* the model: preset + model.* overrides */
    field_settings set;            /* the file's settings, then the overrides', in order */
    yaml_tree **trees;             /* the file and every override value (own the nodes) */
    int n_trees;
    char **keys;                   /* override keys split from "KEY=VALUE" (owned) */
    int n_keys;
    const char *file;              /* the config's name in messages, or NULL */
    const field_setting *preset;   /* the last model / model.preset setting */
} cfg_ctx;

static const yaml_tree_node null_node = { .kind = YAML_TREE_SCALAR, .text = "", .len = 0 };

static void ctx_free(cfg_ctx *x)
{
    for (int i = 0; i < x->n_trees; i++)
        yaml_tree_free(x->trees[i]);
    free(x->trees);
    for (int i = 0; i < x->n_keys; i++)
        free(x->keys[i]);
    free(x->keys);
    field_settings_free(&x->set);
    free(x);
}

static int keep_tree(cfg_ctx *x, yaml_tree *t, hearth_err *err)
{
    yaml_tree **nt = realloc(x->trees, (size_t)(x->n_trees + 1) * sizeof *nt);
    if (!nt) {
        yaml_tree_free(t);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    x->trees = nt;
    x->trees[x->n_trees++] = t;
    return 0;
}

/* ---- which keys exist ------------------------------------------------------------- */

static int run_classify(void *ctx, const char *key, const yaml_tree_node *v, char *canon,
                        size_t size)
{
    (void)ctx;
    int is_map = v && v->kind == YAML_TREE_MAP;
    if (strcmp(key, "model") == 0) {
        if (is_map)
            return WALK_SECTION;
        snprintf(canon, size, "model.preset");
        return WALK_LEAF;
    }
    if (strcmp(key, "model.preset") == 0)
        return WALK_LEAF;
    int n;
    const field_desc *t;
    if (strncmp(key, "model.", 6) == 0) {
        t = model_fields(&n);
        key += 6;
    } else {
        t = config_fields(&n);
    }
    int section = field_is_section(t, n, key);
    if (section && is_map)
        return WALK_SECTION;
    if (field_find(t, n, key) >= 0)
        return WALK_LEAF;
    return section ? WALK_SECTION : WALK_UNKNOWN;
}

static void run_suggest(void *ctx, const char *key, char *buf, size_t size)
{
    (void)ctx;
    field_suggestion s;
    field_suggest_init(&s);
    int n;
    const field_desc *t = config_fields(&n);
    for (int i = 0; i < n; i++)
        field_suggest_add(&s, key, t[i].key);
    field_suggest_add(&s, key, "model.preset");
    t = model_fields(&n);
    for (int i = 0; i < n; i++) {
        char k[160];
        snprintf(k, sizeof k, "model.%s", t[i].key);
        field_suggest_add(&s, key, k);
    }
    const char *best = field_suggest_result(&s, key);
    snprintf(buf, size, "%s", best ? best : "");
}

const field_walker run_config_walker = { run_classify, run_suggest, NULL };

/* ---- collecting settings ------------------------------------------------------------ */

static int add_override(cfg_ctx *x, const config_override *o, hearth_err *err)
{
    const char *key = o->key ? o->key : "", *value = o->value;
    if (!value) {
        /* A raw "KEY=VALUE" argument: split it here. */
        const char *eq = strchr(key, '=');
        if (!eq || eq == key)
            return herr_set(err, HERR_CONFIG, "--set %s: expected KEY=VALUE", key);
        char **nk = realloc(x->keys, (size_t)(x->n_keys + 1) * sizeof *nk);
        if (!nk)
            return herr_set(err, HERR_NOMEM, "out of memory");
        x->keys = nk;
        char *k = strndup(key, (size_t)(eq - key));
        if (!k)
            return herr_set(err, HERR_NOMEM, "out of memory");
        x->keys[x->n_keys++] = k;
        key = k;
        value = eq + 1;
    }
    if (!key[0])
        return herr_set(err, HERR_CONFIG, "--set: expected KEY=VALUE, got an empty key");
    char name[300];
    snprintf(name, sizeof name, "--set %s", key);
    yaml_tree *t;
    int rc = yaml_tree_parse(&t, name, value, strlen(value), err);
    if (rc) {
        char inner[sizeof err->msg];
        const char *m = err ? err->msg : "";
        size_t skip = strlen(name);
        snprintf(inner, sizeof inner, "%s", strncmp(m, name, skip) == 0 ? m + skip + 1 : m);
        return herr_set(err, rc, "--set %s: cannot read the value \"%.100s\" (%s)", key, value,
                        inner);
    }
    if ((rc = keep_tree(x, t, err)))
        return rc;
    return field_walk(&run_config_walker, NULL, key, t->root ? t->root : &null_node, &x->set, err);
}

/* ---- where a key was set ------------------------------------------------------------ */

/* The source of a run-config key ("parallel.tp", "model.decoder.heads", "model.preset"),
 * or NULL when it keeps its default.  *from_run: set by the run config or --set. */
static const field_src *key_src(const cfg_ctx *x, const char *key, int *from_run)
{
    *from_run = 0;
    if (strcmp(key, "model.preset") == 0) {
        *from_run = x->preset != NULL;
        return x->preset ? &x->preset->src : NULL;
    }
    if (strncmp(key, "model.", 6) == 0) {
        int i = field_find(x->ps.st.t, x->ps.st.n, key + 6);
        if (i < 0 || !x->ps.st.set[i])
            return NULL;
        *from_run = x->ps.from_run[i];
        return &x->ps.st.src[i];
    }
    int i = field_find(x->st.t, x->st.n, key);
    if (i < 0 || !x->st.set[i])
        return NULL;
    *from_run = 1;
    return &x->st.src[i];
}

/* "LOC KEY" for the most relevant of `keys`: the first one the run config set, else the
 * first one the preset set, else "FILE: keys[0]". */
static void where(const cfg_ctx *x, const char *const *keys, int n, char *buf, size_t size)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < n; k++) {
            int from_run;
            const field_src *s = keys[k][0] ? key_src(x, keys[k], &from_run) : NULL;
            if (s && (from_run || pass == 1)) {
                field_src_format(s, buf, size);
                return;
            }
        }
    }
    if (x->file)
        snprintf(buf, size, "%s: %s", x->file, keys[0]);
    else
        snprintf(buf, size, "%s", keys[0]);
}

/* ---- auto values ------------------------------------------------------------------- */

void run_config_derive(run_config *c, const unsigned char *is_auto)
{
    /* Which rows are auto, found by the member each one fills: one pass over the table
     * and no key search, since every resolved point of a sweep comes through here. */
    int nc;
    const field_desc *t = config_fields(&nc);
    int comm = 0, dp = 0, enc_tp = 0, global_batch = 0, min_lr = 0, compute = 0;
    for (int i = 0; i < nc; i++) {
        if (!is_auto[i])
            continue;
        size_t off = t[i].off;
        comm |= off == offsetof(run_config, comm);
        compute |= off == offsetof(run_config, precision.compute);
        dp |= off == offsetof(run_config, parallel.dp);
        enc_tp |= off == offsetof(run_config, parallel.encoder.tp);
        global_batch |= off == offsetof(run_config, train.global_batch);
        min_lr |= off == offsetof(run_config, train.min_lr);
    }
    if (comm)
        c->comm = c->device == DEVICE_CUDA ? COMM_NCCL : COMM_LOCAL;
    if (compute)
        c->precision.compute = c->device == DEVICE_CUDA ? COMPUTE_BF16 : COMPUTE_FP32;
    if (dp) {
        long mp = (long)c->parallel.tp * c->parallel.cp * c->parallel.pp;
        c->parallel.dp = mp > 0 && c->ranks % mp == 0 ? (int)(c->ranks / mp) : 0;
    }
    if (enc_tp) {
        int tp = c->parallel.tp, etp = 1;
        if (c->parallel.encoder.strategy == ENC_UNIFORM)
            etp = tp;
        else if (c->parallel.encoder.strategy == ENC_HETERO_TP)
            for (int d = tp - 1; d >= 1 && etp == 1; d--)
                if (tp % d == 0)
                    etp = d;
        c->parallel.encoder.tp = etp;
    }
    if (global_batch) {
        long long gb = (long long)c->train.micro_batch * c->parallel.dp;
        c->train.global_batch = gb > INT_MAX ? INT_MAX : (int)gb;
    }
    if (min_lr) {
        /* lr / 10 rounded to 15 digits, so that 3e-4 gives 3e-05 (not 2.9999999999999997e-05)
         * and a config that spells the default out hashes the same.  That is
         * strtod(printf("%.15g")), computed without the text. */
        c->train.min_lr = canon_round_digits(c->train.lr / 10, 15);
    }
}

/* ---- single rank -------------------------------------------------------------------- */

static int check_single_rank(const cfg_ctx *x, hearth_err *err)
{
    const run_config *c = &x->c;
    char val[64] = "";
    const char *key = NULL;
    const struct { const char *k; int v; } sizes[] = {
        { "ranks", c->ranks }, { "parallel.tp", c->parallel.tp }, { "parallel.cp", c->parallel.cp },
        { "parallel.pp", c->parallel.pp }, { "parallel.vpp", c->parallel.vpp },
        { "parallel.dp", c->parallel.dp }, { "parallel.ep", c->parallel.ep },
        { "parallel.encoder.tp", c->parallel.encoder.tp },
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !key; i++)
        if (sizes[i].v != 1) {
            key = sizes[i].k;
            snprintf(val, sizeof val, "%d", sizes[i].v);
        }
    if (!key && c->parallel.sp) {
        key = "parallel.sp";
        snprintf(val, sizeof val, "true");
    }
    if (!key && c->parallel.encoder.strategy != ENC_UNIFORM) {
        key = "parallel.encoder.strategy";
        snprintf(val, sizeof val, "%s", encoder_strategy_name(c->parallel.encoder.strategy));
    }
    if (!key && c->parallel.encoder.offload) {
        key = "parallel.encoder.offload";
        snprintf(val, sizeof val, "true");
    }
    if (!key)
        return 0;
    char loc[400];
    where(x, &key, 1, loc, sizeof loc);
    return herr_set(err, HERR_CONFIG, "%s: %s: this hearth-train supports a single rank only "
                    "so far", loc, val);
}

/* ---- the whole load ------------------------------------------------------------------ */

static int apply_model_overrides(cfg_ctx *x, hearth_err *err)
{
    preset_state *ps = &x->ps;
    for (int k = 0; k < x->set.n; k++) {
        const field_setting *s = &x->set.v[k];
        if (strncmp(s->key, "model.", 6) != 0 || strcmp(s->key, "model.preset") == 0)
            continue;
        int i = field_find(ps->st.t, ps->st.n, s->key + 6);
        const field_desc *f = &ps->st.t[i];
        if ((f->comp == COMP_ENCODER && !ps->has_encoder) ||
            (f->comp == COMP_PROJECTOR && !ps->has_projector)) {
            char loc[300];
            field_src_format(&s->src, loc, sizeof loc);
            return herr_set(err, HERR_CONFIG, "%s: the preset \"%s\" has no %s", loc, ps->given,
                            f->comp == COMP_ENCODER ? "encoder" : "projector");
        }
        int rc = field_apply(&ps->st, i, s->value, &s->src, err);
        if (rc)
            return rc;
        ps->from_run[i] = 1;
        if (f->type == FT_BIAS_ALL)
            for (int j = 1; j <= 3; j++)
                ps->from_run[i + j] = 1;
    }
    return 0;
}

static int load_preset(cfg_ctx *x, hearth_err *err)
{
    const field_setting *s = x->preset;
    if (!s) {
        if (x->file)
            return herr_set(err, HERR_CONFIG, "%s: model: required: a preset name "
                            "(model: NAME) or a mapping with model.preset", x->file);
        return herr_set(err, HERR_CONFIG, "model: required: give --set model=NAME");
    }
    char loc[300], got[96], path[4096];
    field_src_format(&s->src, loc, sizeof loc);
    const yaml_tree_node *v = s->value;
    if (!v || v->kind != YAML_TREE_SCALAR || yaml_tree_is_null(v) || strlen(v->text) != v->len) {
        yaml_tree_describe(v, got, sizeof got);
        return herr_set(err, HERR_CONFIG, "%s: expected a preset name or path, got %s", loc, got);
    }
    if (v->len >= sizeof x->c.model_preset)
        return herr_set(err, HERR_CONFIG, "%s: too long (at most %zu characters)", loc,
                        sizeof x->c.model_preset - 1);
    int rc = preset_locate(v->text, path, sizeof path, err);
    if (rc)
        return herr_prefix(err, rc, "%s", loc);
    if ((rc = preset_read(&x->ps, v->text, err)))
        return rc;
    snprintf(x->c.model_preset, sizeof x->c.model_preset, "%s", v->text);
    if ((rc = apply_model_overrides(x, err)))
        return rc;
    if ((rc = preset_finish(&x->ps, x->c.train.recompute, err)))
        return rc;
    x->c.model = x->ps.m;
    return 0;
}

static int load(cfg_ctx *x, yaml_tree *file_tree, const config_override *ovr, int n_ovr,
                int single_rank_only, hearth_err *err)
{
    int rc, nc;
    const field_desc *tc = config_fields(&nc);
    field_state_init(&x->st, tc, nc, &x->c);
    if (file_tree) {
        if ((rc = keep_tree(x, file_tree, err)))
            return rc;
        if ((rc = field_walk(&run_config_walker, x->file, NULL, file_tree->root, &x->set, err)))
            return rc;
    }
    for (int i = 0; i < n_ovr; i++)
        if ((rc = add_override(x, &ovr[i], err)))
            return rc;
    for (int k = 0; k < x->set.n; k++) {
        const field_setting *s = &x->set.v[k];
        if (strcmp(s->key, "model.preset") == 0) {
            x->preset = s;
            continue;
        }
        if (strncmp(s->key, "model.", 6) == 0)
            continue;   /* applied to the preset once it is read */
        if ((rc = field_apply(&x->st, field_find(tc, nc, s->key), s->value, &s->src, err)))
            return rc;
    }
    if ((rc = field_fill_defaults(&x->st, 0, x->file, "", err)))
        return rc;
    run_config_derive(&x->c, x->st.is_auto);
    if ((rc = load_preset(x, err)))
        return rc;
    if (single_rank_only && (rc = check_single_rank(x, err)))
        return rc;
    rule_issue iss;
    if (run_rules_check(&x->c, &iss)) {
        const char *keys[5];
        int n = 0;
        for (int k = 0; k < 5 && iss.keys[k][0]; k++)
            keys[n++] = iss.keys[k];
        char loc[400];
        where(x, keys, n, loc, sizeof loc);
        return herr_set(err, HERR_CONFIG, "%s: rule %s: %s", loc, iss.name, iss.msg);
    }
    return 0;
}

static int run(run_config *out, const char *name, yaml_tree *tree, const config_override *ovr,
               int n_ovr, int single_rank_only, hearth_err *err)
{
    cfg_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        yaml_tree_free(tree);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    x->file = name;
    int rc = load(x, tree, ovr, n_ovr, single_rank_only, err);
    if (!rc)
        *out = x->c;
    ctx_free(x);
    return rc;
}

int run_config_parse(run_config *out, const char *name, const char *yaml_text,
                     const config_override *ovr, int n_ovr, int single_rank_only,
                     hearth_err *err)
{
    yaml_tree *t;
    int rc = yaml_tree_parse(&t, name, yaml_text, strlen(yaml_text), err);
    if (rc)
        return rc;
    return run(out, name, t, ovr, n_ovr, single_rank_only, err);
}

int run_config_load(run_config *out, const char *file, const config_override *ovr, int n_ovr,
                    int single_rank_only, hearth_err *err)
{
    yaml_tree *t = NULL;
    if (file) {
        int rc = yaml_tree_load(&t, file, err);
        if (rc)
            return rc == HERR_IO ? HERR_CONFIG : rc;
    }
    return run(out, file, t, ovr, n_ovr, single_rank_only, err);
}
