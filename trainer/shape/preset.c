/* preset.c - finding and reading model presets (model_shape.h, shape_internal.h). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shape/fields.h"
#include "shape/model_shape.h"
#include "shape/shape_internal.h"
#include "shape/yaml_tree.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static int is_path(const char *name)
{
    return strchr(name, '/') || ends_with(name, ".yaml") || ends_with(name, ".yml");
}

/* Appends one search directory (NUL-separated list in dirs). */
static void add_dir(char *dirs, size_t size, size_t *used, const char *dir)
{
    size_t len = strlen(dir);
    if (!len || *used + len + 1 >= size)
        return;
    memcpy(dirs + *used, dir, len + 1);
    *used += len + 1;
}

/* The preset search path (model_shape.h): $HEARTH_MODELS (':'-separated), the running
 * binary's ../../contrib/models and ../share/hearth/models, then ./contrib/models. */
static size_t search_dirs(char *dirs, size_t size)
{
    size_t used = 0;
    const char *env = getenv("HEARTH_MODELS");
    if (env && *env) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", env);
        for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save))
            add_dir(dirs, size, &used, d);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            const char *rel[] = { "/../../contrib/models", "/../share/hearth/models" };
            for (int i = 0; i < 2; i++) {
                char dir[PATH_MAX + 32], real[PATH_MAX];
                snprintf(dir, sizeof dir, "%s%s", exe, rel[i]);
                add_dir(dirs, size, &used, realpath(dir, real) ? real : dir);
            }
        }
    }
    add_dir(dirs, size, &used, "./contrib/models");
    return used;
}

/* Offers every preset name (NAME.yaml) of the search directories to a "did you mean"
 * suggestion, so that a misspelt name is answered with the one that exists. */
static void suggest_presets(const char *dirs, size_t used, const char *name,
                            field_suggestion *sg)
{
    for (size_t off = 0; off < used; off += strlen(dirs + off) + 1) {
        DIR *d = opendir(dirs + off);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            char cand[160];
            size_t len = strlen(e->d_name);
            if (e->d_name[0] == '.' || len <= 5 || len - 5 >= sizeof cand ||
                !ends_with(e->d_name, ".yaml"))
                continue;
            snprintf(cand, sizeof cand, "%.*s", (int)(len - 5), e->d_name);
            field_suggest_add(sg, name, cand);
        }
        closedir(d);
    }
}

int preset_locate(const char *name_or_path, char *path, size_t size, hearth_err *err)
{
    if (!name_or_path[0])
        return herr_set(err, HERR_CONFIG, "expected a preset name or path, got nothing");
    if (is_path(name_or_path)) {
        if (access(name_or_path, R_OK) != 0)
            return herr_set(err, HERR_CONFIG, "preset file \"%s\" cannot be read: %s",
                            name_or_path, strerror(errno));
        snprintf(path, size, "%s", name_or_path);
        return 0;
    }
    char dirs[8192], searched[2048] = "";
    size_t used = search_dirs(dirs, sizeof dirs);
    for (size_t off = 0; off < used; off += strlen(dirs + off) + 1) {
        const char *dir = dirs + off;
        int w = snprintf(path, size, "%s/%s.yaml", dir, name_or_path);
        if (w > 0 && (size_t)w < size && access(path, R_OK) == 0)
            return 0;
        if (searched[0])
            strncat(searched, ", ", sizeof searched - strlen(searched) - 1);
        strncat(searched, dir, sizeof searched - strlen(searched) - 1);
    }
    path[0] = 0;
    field_suggestion sg;
    field_suggest_init(&sg);
    suggest_presets(dirs, used, name_or_path, &sg);
    const char *best = field_suggest_result(&sg, name_or_path);
    char hint[200] = "";
    if (best)
        snprintf(hint, sizeof hint, "; did you mean '%s'?", best);
    return herr_set(err, HERR_CONFIG, "preset \"%s\" not found (searched: %s)%s", name_or_path,
                    searched, hint);
}

/* ---- reading ------------------------------------------------------------------------ */

static int preset_classify(void *ctx, const char *key, const yaml_tree_node *v, char *canon,
                           size_t size)
{
    (void)ctx;
    (void)canon;
    (void)size;
    int n;
    const field_desc *t = model_fields(&n);
    int section = field_is_section(t, n, key);
    if (section && v && v->kind == YAML_TREE_MAP)
        return WALK_SECTION;
    if (field_find(t, n, key) >= 0)
        return WALK_LEAF;
    return section ? WALK_SECTION : WALK_UNKNOWN;
}

static void preset_suggest(void *ctx, const char *key, char *buf, size_t size)
{
    (void)ctx;
    int n;
    const field_desc *t = model_fields(&n);
    field_suggestion s;
    field_suggest_init(&s);
    for (int i = 0; i < n; i++)
        field_suggest_add(&s, key, t[i].key);
    const char *best = field_suggest_result(&s, key);
    snprintf(buf, size, "%s", best ? best : "");
}

int preset_read(preset_state *ps, const char *name_or_path, hearth_err *err)
{
    memset(ps, 0, sizeof *ps);
    int n;
    const field_desc *t = model_fields(&n);
    field_state_init(&ps->st, t, n, &ps->m);
    if (strlen(name_or_path) >= sizeof ps->given)
        return herr_set(err, HERR_CONFIG, "preset name too long");
    snprintf(ps->given, sizeof ps->given, "%s", name_or_path);
    int rc = preset_locate(name_or_path, ps->file, sizeof ps->file, err);
    if (rc)
        return rc;
    yaml_tree *tree;
    if ((rc = yaml_tree_load(&tree, ps->file, err)))
        return rc == HERR_IO ? HERR_CONFIG : rc;
    field_settings set = { 0 };
    field_walker w = { preset_classify, preset_suggest, NULL };
    rc = field_walk(&w, ps->file, NULL, tree->root, &set, err);
    for (int i = 0; !rc && i < set.n; i++) {
        const field_setting *s = &set.v[i];
        int k = field_find(t, n, s->key);
        if (t[k].flags & FIELD_RUN_ONLY) {
            char loc[300];
            field_src_format(&s->src, loc, sizeof loc);
            rc = herr_set(err, HERR_CONFIG, "%s: a training choice, not part of a preset: set "
                          "model.%s in the run config", loc, s->key);
            break;
        }
        rc = field_apply(&ps->st, k, s->value, &s->src, err);
    }
    field_settings_free(&set);
    yaml_tree_free(tree);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        if (!ps->st.set[i])
            continue;
        ps->has_encoder |= t[i].comp == COMP_ENCODER;
        ps->has_projector |= t[i].comp == COMP_PROJECTOR;
    }
    return 0;
}

/* ---- defaults, auto values, checks ------------------------------------------------- */

static int row(const preset_state *ps, const char *key)
{
    return field_find(ps->st.t, ps->st.n, key);
}

static int is_auto(const preset_state *ps, const char *key)
{
    int i = row(ps, key);
    return i >= 0 && ps->st.is_auto[i];
}

/* "WHERE: KEY: msg" for a key of the model: where it was last set (the run config's
 * override, else the preset's line), else the preset file. */
static int error_at(const preset_state *ps, const char *key, const char *msg, hearth_err *err)
{
    int i = row(ps, key);
    if (i >= 0 && ps->st.set[i]) {
        char loc[300];
        field_src_format(&ps->st.src[i], loc, sizeof loc);
        return herr_set(err, HERR_CONFIG, "%s: %s", loc, msg);
    }
    return herr_set(err, HERR_CONFIG, "%s: %s: %s", ps->file, key, msg);
}

static int derive_stack(preset_state *ps, const char *p, stack_shape *s, int recompute,
                        hearth_err *err)
{
    char key[64];
    snprintf(key, sizeof key, "%skv_heads", p);
    if (is_auto(ps, key))
        s->kv_heads = s->heads;
    snprintf(key, sizeof key, "%shead_dim", p);
    if (is_auto(ps, key)) {
        if (s->hidden % s->heads) {
            char msg[200], hk[64];
            snprintf(msg, sizeof msg, "hidden %d is not a multiple of heads %d: give %shead_dim",
                     s->hidden, s->heads, p);
            snprintf(hk, sizeof hk, "%sheads", p);
            return error_at(ps, hk, msg, err);
        }
        s->head_dim = s->hidden / s->heads;
    }
    snprintf(key, sizeof key, "%srecompute", p);
    if (is_auto(ps, key))
        s->recompute = recompute;
    return 0;
}

int preset_finish(preset_state *ps, int recompute_default, hearth_err *err)
{
    model_shape *m = &ps->m;
    unsigned skip = 0;
    if (!ps->has_encoder)
        skip |= 1u << COMP_ENCODER;
    if (!ps->has_projector)
        skip |= 1u << COMP_PROJECTOR;
    int rc = field_fill_defaults(&ps->st, skip, ps->file, "", err);
    if (rc)
        return rc;
    if (is_auto(ps, "name")) {
        const char *base = strrchr(ps->given, '/');
        base = base ? base + 1 : ps->given;
        size_t len = strlen(base);
        if (ends_with(base, ".yaml"))
            len -= 5;
        else if (ends_with(base, ".yml"))
            len -= 4;
        if (len >= sizeof m->name)
            len = sizeof m->name - 1;
        memcpy(m->name, base, len);
        m->name[len] = 0;
    }
    if (ps->has_encoder) {
        if ((rc = derive_stack(ps, "encoder.", &m->encoder.s, recompute_default, err)))
            return rc;
    } else {
        memset(&m->encoder, 0, sizeof m->encoder);
    }
    if (ps->has_projector) {
        if (is_auto(ps, "projector.hidden"))
            m->projector.hidden = m->encoder.spatial_merge * m->encoder.spatial_merge *
                                  m->encoder.s.hidden;
    } else {
        memset(&m->projector, 0, sizeof m->projector);
    }
    if ((rc = derive_stack(ps, "decoder.", &m->decoder.s, recompute_default, err)))
        return rc;
    m->encoder.present = ps->has_encoder;
    m->projector.present = ps->has_projector;

    shape_issue iss;
    if (!shape_check(m, &iss))
        return 0;
    /* Point at the key the user most likely changed: one set by the run config first. */
    const char *keys[4] = { iss.key, iss.others[0], iss.others[1], iss.others[2] };
    for (int k = 0; k < 4; k++) {
        int i = keys[k][0] ? row(ps, keys[k]) : -1;
        if (i >= 0 && ps->st.set[i] && ps->from_run[i]) {
            if (k == 0)
                return error_at(ps, keys[k], iss.msg, err);
            char msg[sizeof iss.msg + 100];
            snprintf(msg, sizeof msg, "with this value, %s: %s", iss.key, iss.msg);
            return error_at(ps, keys[k], msg, err);
        }
    }
    return error_at(ps, iss.key, iss.msg, err);
}

int preset_load(model_shape *out, const char *name_or_path, hearth_err *err)
{
    preset_state *ps = malloc(sizeof *ps);
    if (!ps)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = preset_read(ps, name_or_path, err);
    if (!rc)
        rc = preset_finish(ps, 0, err);
    if (!rc)
        *out = ps->m;
    free(ps);
    return rc;
}
