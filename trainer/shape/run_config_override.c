/* run_config_override.c - a base run config resolved many times with prepared overrides
 * (run_config_override.h).  The steps mirror run_config.c's load(): config keys, defaults,
 * `auto` values, then the preset with the model overrides; what differs is that the base
 * is read once and each override is converted once. */
#include "shape/run_config_override.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/shape_internal.h"

/* ---- keys ----------------------------------------------------------------------------- */

int run_config_key_find(const char *key, run_config_key *out)
{
    memset(out, 0, sizeof *out);
    if (strcmp(key, "model") == 0 || strcmp(key, "model.preset") == 0) {
        out->kind = RCK_PRESET;
        out->row = -1;
        return 0;
    }
    int n;
    const field_desc *t;
    if (strncmp(key, "model.", 6) == 0) {
        t = model_fields(&n);
        out->kind = RCK_MODEL;
        key += 6;
    } else {
        t = config_fields(&n);
        out->kind = RCK_CONFIG;
    }
    out->row = field_find(t, n, key);
    if (out->row < 0)
        return -1;
    out->f = &t[out->row];
    return 0;
}

static void int_list_text(const int *v, int n, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%d", i ? ", " : "", v[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

void run_config_key_read(const run_config *c, const run_config_key *k, run_config_value *out)
{
    memset(out, 0, sizeof *out);
    if (k->kind == RCK_PRESET) {
        out->type = RCV_STR;
        out->str = c->model_preset;
        return;
    }
    const field_desc *f = k->f;
    const char *base = (const char *)c;
    if (k->kind == RCK_MODEL) {
        if ((f->comp == COMP_ENCODER && !c->model.encoder.present) ||
            (f->comp == COMP_PROJECTOR && !c->model.projector.present))
            return;   /* null */
        base = (const char *)&c->model;
    }
    const char *p = base + f->off;
    switch (f->type) {
    case FT_INT:
        out->type = RCV_NUM;
        out->num = *(const int *)p;
        break;
    case FT_I64:
        out->type = RCV_NUM;
        out->num = (double)*(const int64_t *)p;
        break;
    case FT_DOUBLE:
        out->type = RCV_NUM;
        out->num = *(const double *)p;
        break;
    case FT_FLOAT:
        out->type = RCV_NUM;
        out->num = *(const float *)p;
        break;
    case FT_BOOL:
        out->type = RCV_BOOL;
        out->boolean = *(const int *)p != 0;
        break;
    case FT_BIAS_ALL: {
        /* the shorthand reads true when all three biases are on */
        const field_desc *t = f;
        out->type = RCV_BOOL;
        out->boolean = 1;
        for (int j = 1; j <= 3; j++)
            out->boolean &= *(const int *)(base + t[j].off) != 0;
        break;
    }
    case FT_ENUM: {
        int v = *(const int *)p, count = 0;
        while (f->names[count])
            count++;
        out->type = RCV_STR;
        out->str = (v >= 0 && v < count) ? f->names[v] : "";
        break;
    }
    case FT_STR:
        out->type = RCV_STR;
        out->str = p;
        break;
    case FT_INT3:
        int_list_text((const int *)p, 3, out->buf, sizeof out->buf);
        out->type = RCV_STR;
        out->str = out->buf;
        break;
    case FT_INTLIST: {
        int n = *(const int *)(base + f->count_off);
        if (n < 0)
            n = 0;
        if ((size_t)n > f->size)
            n = (int)f->size;
        int_list_text((const int *)p, n, out->buf, sizeof out->buf);
        out->type = RCV_STR;
        out->str = out->buf;
        break;
    }
    }
}

/* ---- patches -------------------------------------------------------------------------- */

/* Bytes a row occupies (FT_BIAS_ALL and FT_INTLIST have extra parts handled apart). */
static size_t row_len(const field_desc *f)
{
    switch (f->type) {
    case FT_INT: case FT_BOOL: case FT_ENUM: return sizeof(int);
    case FT_I64: return sizeof(int64_t);
    case FT_DOUBLE: return sizeof(double);
    case FT_FLOAT: return sizeof(float);
    case FT_STR: return f->size;
    case FT_INT3: return 3 * sizeof(int);
    case FT_INTLIST: return f->size * sizeof(int);
    case FT_BIAS_ALL: return 0;
    }
    return 0;
}

int run_config_patch_make(run_config_patch *p, const char *key, const yaml_tree_node *value,
                          const field_src *src, hearth_err *err)
{
    memset(p, 0, sizeof *p);
    p->src = *src;
    p->value = value;
    char loc[300];
    if (run_config_key_find(key, &p->key) < 0) {
        field_src_format(src, loc, sizeof loc);
        return herr_set(err, HERR_CONFIG, "%s: unknown key", loc);
    }
    if (p->key.kind == RCK_PRESET) {
        char got[96];
        if (!value || value->kind != YAML_TREE_SCALAR || yaml_tree_is_null(value) ||
            strlen(value->text) != value->len) {
            field_src_format(src, loc, sizeof loc);
            yaml_tree_describe(value, got, sizeof got);
            return herr_set(err, HERR_CONFIG, "%s: expected a preset name or path, got %s", loc,
                            got);
        }
        if (value->len >= sizeof p->preset) {
            field_src_format(src, loc, sizeof loc);
            return herr_set(err, HERR_CONFIG, "%s: too long (at most %zu characters)", loc,
                            sizeof p->preset - 1);
        }
        memcpy(p->preset, value->text, value->len + 1);
        return 0;
    }
    /* Convert through the table into a scratch struct, then keep the row's bytes. */
    int n;
    const field_desc *t = p->key.kind == RCK_MODEL ? model_fields(&n) : config_fields(&n);
    union {
        run_config c;
        model_shape m;
    } *scratch = calloc(1, sizeof *scratch);
    field_state *st = malloc(sizeof *st);
    if (!scratch || !st) {
        free(scratch);
        free(st);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    field_state_init(st, t, n, scratch);
    int rc = field_apply(st, p->key.row, value, src, err);
    if (!rc) {
        const field_desc *f = p->key.f;
        p->is_auto = st->is_auto[p->key.row];
        p->off = f->off;
        p->len = row_len(f);
        if (p->len > sizeof p->bytes)
            rc = herr_set(err, HERR_RUNTIME, "%s: row too large for a patch", f->key);
        else
            memcpy(p->bytes, (const char *)scratch + f->off, p->len);
        if (f->type == FT_INTLIST) {
            p->has_count = 1;
            p->count_off = f->count_off;
            p->count = *(const int *)((const char *)scratch + f->count_off);
        }
    }
    free(st);
    free(scratch);
    return rc;
}

/* ---- base ----------------------------------------------------------------------------- */

typedef struct {
    char name[256];
    preset_state *ps;         /* as read: no defaults, no run-config overrides */
    int finished;             /* `model` below is valid for `recompute` */
    int recompute;
    int finish_rc;
    char finish_msg[sizeof(((hearth_err *)0)->msg)];
    model_shape model;        /* finished with the base's model overrides */
} preset_entry;

struct run_config_base {
    const char *file;
    run_config c;                     /* config keys applied, defaults filled, not derived */
    unsigned char is_auto[FIELDS_MAX];
    field_settings set;               /* the base's settings (model.* are re-applied) */
    const field_setting *preset;      /* the base's model / model.preset, or NULL */
    preset_entry *presets;
    int n_presets, cap_presets;
    preset_state *scratch;            /* for points that change the model */
};

void run_config_base_free(run_config_base *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->n_presets; i++)
        free(b->presets[i].ps);
    free(b->presets);
    free(b->scratch);
    field_settings_free(&b->set);
    free(b);
}

int run_config_base_create(run_config_base **out, const char *file, const yaml_tree_node *root,
                           hearth_err *err)
{
    *out = NULL;
    run_config_base *b = calloc(1, sizeof *b);
    field_state *st = malloc(sizeof *st);
    if (b)
        b->scratch = malloc(sizeof *b->scratch);
    if (!b || !st || !b->scratch) {
        free(st);
        run_config_base_free(b);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    b->file = file;
    int nc, rc;
    const field_desc *tc = config_fields(&nc);
    field_state_init(st, tc, nc, &b->c);
    rc = field_walk(&run_config_walker, file, NULL, root, &b->set, err);
    for (int k = 0; !rc && k < b->set.n; k++) {
        const field_setting *s = &b->set.v[k];
        if (strcmp(s->key, "model.preset") == 0)
            b->preset = s;
        else if (strncmp(s->key, "model.", 6) != 0)
            rc = field_apply(st, field_find(tc, nc, s->key), s->value, &s->src, err);
    }
    if (!rc)
        rc = field_fill_defaults(st, 0, file, "", err);
    if (!rc)
        memcpy(b->is_auto, st->is_auto, sizeof b->is_auto);
    if (!rc && b->preset) {
        const yaml_tree_node *v = b->preset->value;
        char loc[300], got[96];
        field_src_format(&b->preset->src, loc, sizeof loc);
        if (!v || v->kind != YAML_TREE_SCALAR || yaml_tree_is_null(v) ||
            strlen(v->text) != v->len) {
            yaml_tree_describe(v, got, sizeof got);
            rc = herr_set(err, HERR_CONFIG, "%s: expected a preset name or path, got %s", loc,
                          got);
        } else if (v->len >= sizeof b->c.model_preset) {
            rc = herr_set(err, HERR_CONFIG, "%s: too long (at most %zu characters)", loc,
                          sizeof b->c.model_preset - 1);
        } else if ((rc = run_config_base_preload(b, v->text, err))) {
            herr_prefix(err, rc, "%s", loc);
        }
    }
    free(st);
    if (rc) {
        run_config_base_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

const char *run_config_base_preset(const run_config_base *b)
{
    return b->preset ? b->preset->value->text : NULL;
}

static preset_entry *find_preset(run_config_base *b, const char *name)
{
    for (int i = 0; i < b->n_presets; i++)
        if (strcmp(b->presets[i].name, name) == 0)
            return &b->presets[i];
    return NULL;
}

int run_config_base_preload(run_config_base *b, const char *name, hearth_err *err)
{
    if (find_preset(b, name))
        return 0;
    if (strlen(name) >= sizeof b->presets[0].name)
        return herr_set(err, HERR_CONFIG, "preset name too long");
    if (b->n_presets == b->cap_presets) {
        int cap = b->cap_presets ? 2 * b->cap_presets : 4;
        preset_entry *grown = realloc(b->presets, (size_t)cap * sizeof *grown);
        if (!grown)
            return herr_set(err, HERR_NOMEM, "out of memory");
        b->presets = grown;
        b->cap_presets = cap;
    }
    preset_state *ps = malloc(sizeof *ps);
    if (!ps)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = preset_read(ps, name, err);
    if (rc) {
        free(ps);
        return rc;
    }
    preset_entry *e = &b->presets[b->n_presets++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ps = ps;
    return 0;
}

/* Applies one model override to a preset state, as run_config.c does. */
static int apply_model(preset_state *ps, int row, const yaml_tree_node *value,
                       const field_src *src, hearth_err *err)
{
    const field_desc *f = &ps->st.t[row];
    if ((f->comp == COMP_ENCODER && !ps->has_encoder) ||
        (f->comp == COMP_PROJECTOR && !ps->has_projector)) {
        char loc[300];
        field_src_format(src, loc, sizeof loc);
        return herr_set(err, HERR_CONFIG, "%s: the preset \"%s\" has no %s", loc, ps->given,
                        f->comp == COMP_ENCODER ? "encoder" : "projector");
    }
    int rc = field_apply(&ps->st, row, value, src, err);
    if (rc)
        return rc;
    ps->from_run[row] = 1;
    if (f->type == FT_BIAS_ALL)
        for (int j = 1; j <= 3; j++)
            ps->from_run[row + j] = 1;
    return 0;
}

/* Copies a cached preset into the scratch state and applies the base's model overrides,
 * then the point's (`p` may be NULL). */
static int model_build(run_config_base *b, const preset_entry *e,
                       const run_config_patch *const *p, int n, int recompute, hearth_err *err)
{
    preset_state *ps = b->scratch;
    memcpy(ps, e->ps, sizeof *ps);
    ps->st.base = &ps->m;   /* the copy's table must write into the copy */
    int rc, nm;
    const field_desc *tm = model_fields(&nm);
    for (int k = 0; k < b->set.n; k++) {
        const field_setting *s = &b->set.v[k];
        if (strncmp(s->key, "model.", 6) != 0 || strcmp(s->key, "model.preset") == 0)
            continue;
        if ((rc = apply_model(ps, field_find(tm, nm, s->key + 6), s->value, &s->src, err)))
            return rc;
    }
    for (int i = 0; i < n; i++)
        if (p[i]->key.kind == RCK_MODEL &&
            (rc = apply_model(ps, p[i]->key.row, p[i]->value, &p[i]->src, err)))
            return rc;
    return preset_finish(ps, recompute, err);
}

int run_config_base_resolve(run_config_base *b, const run_config_patch *const *p, int n,
                            int cuda_ranks, run_config *out, hearth_err *err)
{
    run_config *c = out;
    unsigned char is_auto[FIELDS_MAX];
    memcpy(c, &b->c, sizeof *c);
    memcpy(is_auto, b->is_auto, sizeof is_auto);
    const char *preset = b->preset ? b->preset->value->text : NULL;
    int model_keys = 0;
    for (int i = 0; i < n; i++) {
        const run_config_patch *q = p[i];
        if (q->key.kind == RCK_PRESET) {
            preset = q->preset;
        } else if (q->key.kind == RCK_MODEL) {
            model_keys = 1;
        } else {
            is_auto[q->key.row] = (unsigned char)q->is_auto;
            if (!q->is_auto) {
                memcpy((char *)c + q->off, q->bytes, q->len);
                if (q->has_count)
                    memcpy((char *)c + q->count_off, &q->count, sizeof q->count);
            }
        }
    }
    if (cuda_ranks > 0 && c->device == DEVICE_CUDA)
        c->ranks = cuda_ranks;
    run_config_derive(c, is_auto);
    if (!preset) {
        if (b->file)
            return herr_set(err, HERR_CONFIG, "%s: model: required: a preset name (model: NAME) "
                            "in the base or in every point", b->file);
        return herr_set(err, HERR_CONFIG, "model: required: a preset name");
    }
    int rc = run_config_base_preload(b, preset, err);
    if (rc)
        return rc;
    preset_entry *e = find_preset(b, preset);
    snprintf(c->model_preset, sizeof c->model_preset, "%s", preset);
    int recompute = (int)c->train.recompute;
    if (model_keys) {
        if ((rc = model_build(b, e, p, n, recompute, err)))
            return rc;
        c->model = b->scratch->m;
        return 0;
    }
    /* The model depends only on the preset, the base's overrides and train.recompute:
     * keep the last finished one per preset. */
    if (!e->finished || e->recompute != recompute) {
        hearth_err ferr = { { 0 } };
        e->finish_rc = model_build(b, e, NULL, 0, recompute, &ferr);
        memcpy(e->finish_msg, ferr.msg, sizeof e->finish_msg);
        if (!e->finish_rc)
            e->model = b->scratch->m;
        e->finished = 1;
        e->recompute = recompute;
    }
    if (e->finish_rc)
        return herr_set(err, e->finish_rc, "%s", e->finish_msg);
    c->model = e->model;
    return 0;
}
