/* plan.c - resolve, validate, hash and deduplicate the points of a spec (plan.h). */
#include "plan.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "shape/mem_plan.h"
#include "shape/run_config_override.h"
#include "trainer_caps.h"

/* Keys a `where`/`exclude` reads from the resolved config, resolved to table rows once.
 * Slots are allocated one by one so that a value's text stays put while an expression
 * runs, even when a new key is added meanwhile. */
typedef struct {
    const char *key;            /* pointer from the spec/AST, compared first by address */
    run_config_key k;
    int known;
    run_config_value v;         /* storage for the value while an expression runs */
} key_slot;

typedef struct {
    uint64_t key;               /* first 64 bits of the hash, never 0 (0 marks empty) */
    uint64_t index;
} seen_slot;

typedef struct {
    const spec *s;
    const plan_opts *opts;
    run_config_base *base;
    /* one patch per spec value; NULL for resources keys */
    int n_axes;                           /* product axes: matrix, then zip members */
    const spec_axis **axes;
    run_config_patch **axis_patches;      /* [axis][value] */
    run_config_patch **include_patches;   /* [entry][setting] */
    const run_config_patch **pp;          /* the point's patches */
    int cap_pp;
    /* the resolved candidate */
    int have;
    uint64_t candidate;
    int rc;
    hearth_err rerr;
    run_config cfg;
    plan_resources res;
    key_slot **keys;
    int n_keys, cap_keys;
    seen_slot *seen;
    uint64_t seen_cap, seen_n;
    trainer_caps caps;          /* of opts->trainer_path, asked at the first cuda point */
    int caps_asked;
} planner;

const char *plan_status_name(plan_status s)
{
    switch (s) {
    case PLAN_KEPT: return "kept";
    case PLAN_PRUNED: return "pruned";
    case PLAN_SKIPPED: return "skipped";
    }
    return "?";
}

/* ---- setup ---------------------------------------------------------------------------- */

static int make_patches(planner *pl, const char *key, const spec_value *values, int n,
                        run_config_patch **out, hearth_err *err)
{
    *out = NULL;
    if (spec_key_is_resource(key))
        return 0;
    run_config_patch *p = calloc((size_t)n, sizeof *p);
    if (!p)
        return herr_set(err, HERR_NOMEM, "out of memory");
    *out = p;
    for (int i = 0; i < n; i++) {
        const yaml_tree_node *node = values[i].node;
        field_src src;
        spec_node_src(pl->s, node, key, &src);
        int rc = run_config_patch_make(&p[i], key, node, &src, err);
        if (rc)
            return rc;
        if (p[i].key.kind == RCK_PRESET) {
            /* a missing preset is a spec error, reported where it was written */
            if ((rc = run_config_base_preload(pl->base, p[i].preset, err))) {
                char loc[300];
                field_src_format(&src, loc, sizeof loc);
                return herr_prefix(err, rc, "%s", loc);
            }
        }
    }
    return 0;
}

static void planner_free(planner *pl)
{
    for (int a = 0; a < pl->n_axes; a++)
        free(pl->axis_patches ? pl->axis_patches[a] : NULL);
    free(pl->axis_patches);
    free(pl->axes);
    for (int e = 0; pl->include_patches && e < pl->s->n_include; e++)
        free(pl->include_patches[e]);
    free(pl->include_patches);
    free(pl->pp);
    free(pl->seen);
    for (int i = 0; i < pl->n_keys; i++)
        free(pl->keys[i]);
    free(pl->keys);
    run_config_base_free(pl->base);
}

static int planner_init(planner *pl, const spec *s, const plan_opts *opts, hearth_err *err)
{
    memset(pl, 0, sizeof *pl);
    pl->s = s;
    pl->opts = opts;
    int rc = run_config_base_create(&pl->base, s->file, s->base, err);
    if (rc)
        return rc;
    int n = s->n_matrix;
    for (int g = 0; g < s->n_zip; g++)
        n += s->zip[g].n_axes;
    pl->n_axes = n;
    pl->axes = calloc((size_t)n + 1, sizeof *pl->axes);
    pl->axis_patches = calloc((size_t)n + 1, sizeof *pl->axis_patches);
    pl->include_patches = calloc((size_t)s->n_include + 1, sizeof *pl->include_patches);
    int cap = n;
    for (int e = 0; e < s->n_include; e++)
        if (s->include[e].n > cap)
            cap = s->include[e].n;
    pl->cap_pp = cap;
    pl->pp = calloc((size_t)cap + 1, sizeof *pl->pp);
    if (!pl->axes || !pl->axis_patches || !pl->include_patches || !pl->pp)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int a = 0;
    for (int i = 0; i < s->n_matrix; i++)
        pl->axes[a++] = &s->matrix[i];
    for (int g = 0; g < s->n_zip; g++)
        for (int i = 0; i < s->zip[g].n_axes; i++)
            pl->axes[a++] = &s->zip[g].axes[i];
    for (a = 0; a < n; a++)
        if ((rc = make_patches(pl, pl->axes[a]->key, pl->axes[a]->values, pl->axes[a]->n_values,
                               &pl->axis_patches[a], err)))
            return rc;
    for (int e = 0; e < s->n_include; e++) {
        const spec_entry *en = &s->include[e];
        run_config_patch *p = calloc((size_t)en->n + 1, sizeof *p);
        if (!p)
            return herr_set(err, HERR_NOMEM, "out of memory");
        pl->include_patches[e] = p;
        for (int k = 0; k < en->n; k++) {
            run_config_patch *one = NULL;
            if ((rc = make_patches(pl, en->settings[k].key, &en->settings[k].value, 1, &one,
                                   err))) {
                free(one);
                return rc;
            }
            if (one) {
                p[k] = *one;
                free(one);
            } else {
                p[k].key.kind = RCK_CONFIG;
                p[k].key.row = -1;   /* a resources key: not a run-config patch */
            }
        }
    }
    return 0;
}

/* ---- resolving a point ---------------------------------------------------------------- */

static void point_resources(const planner *pl, const expand_point *pt, plan_resources *r)
{
    const spec_resources *sr = &pl->s->resources;
    r->nodes = sr->nodes ? sr->nodes : 1;
    r->gpus_per_node = sr->gpus_per_node ? sr->gpus_per_node : 1;
    r->cpus_per_task = sr->cpus_per_task ? sr->cpus_per_task : 1;
    r->max_concurrent = sr->max_concurrent;
    r->time = sr->time;
    r->partition = sr->partition;
    r->account = sr->account;
    r->qos = sr->qos;
    r->constraint = sr->constraint;
    for (int k = 0; k < pt->n; k++) {
        const char *key = pt->kv[k].key;
        if (strncmp(key, "resources.", 10) != 0)
            continue;
        key += 10;
        const yaml_tree_node *n = pt->kv[k].value->node;
        int64_t v = 0;
        yaml_tree_as_int(n, &v);
        if (strcmp(key, "nodes") == 0) r->nodes = v;
        else if (strcmp(key, "gpus_per_node") == 0) r->gpus_per_node = v;
        else if (strcmp(key, "cpus_per_task") == 0) r->cpus_per_task = v;
        else if (strcmp(key, "max_concurrent") == 0) r->max_concurrent = v;
        else if (strcmp(key, "time") == 0) r->time = n->text;
        else if (strcmp(key, "partition") == 0) r->partition = n->text;
        else if (strcmp(key, "account") == 0) r->account = n->text;
        else if (strcmp(key, "qos") == 0) r->qos = n->text;
        else if (strcmp(key, "constraint") == 0) r->constraint = n->text;
    }
}

static int resolve(planner *pl, const expand_point *pt)
{
    if (pl->have && pl->candidate == pt->candidate)
        return pl->rc;
    int m = 0;
    for (int k = 0; k < pt->n; k++) {
        const run_config_patch *p = NULL;
        if (pt->include) {
            p = &pl->include_patches[pt->include - 1][k];
            if (p->key.row < 0 && p->key.kind == RCK_CONFIG)
                p = NULL;
        } else if (pl->axis_patches[k]) {
            p = &pl->axis_patches[k][pt->kv[k].value - pl->axes[k]->values];
        }
        if (p)
            pl->pp[m++] = p;
    }
    point_resources(pl, pt, &pl->res);
    int64_t ranks = pl->res.nodes * pl->res.gpus_per_node;
    pl->rc = run_config_base_resolve(pl->base, pl->pp, m,
                                     ranks > 0 && ranks < (1 << 30) ? (int)ranks : 0, &pl->cfg,
                                     &pl->rerr);
    pl->have = 1;
    pl->candidate = pt->candidate;
    return pl->rc;
}

static key_slot *key_lookup_slot(planner *pl, const char *key)
{
    for (int i = 0; i < pl->n_keys; i++)
        if (pl->keys[i]->key == key)
            return pl->keys[i];
    for (int i = 0; i < pl->n_keys; i++)
        if (strcmp(pl->keys[i]->key, key) == 0)
            return pl->keys[i];
    if (pl->n_keys == pl->cap_keys) {
        int cap = pl->cap_keys ? 2 * pl->cap_keys : 16;
        key_slot **grown = realloc(pl->keys, (size_t)cap * sizeof *grown);
        if (!grown)
            return NULL;
        pl->keys = grown;
        pl->cap_keys = cap;
    }
    key_slot *ks = calloc(1, sizeof *ks);
    if (!ks)
        return NULL;
    ks->key = key;   /* points into the spec or its AST, which outlive the plan */
    ks->known = run_config_key_find(key, &ks->k) == 0;
    pl->keys[pl->n_keys++] = ks;
    return ks;
}

/* expand's fallback: run-config keys from the resolved point (resources come from the
 * point or the spec, which expand answers itself). */
static int plan_lookup(void *ctx, const expand_point *pt, const char *key, expr_value *out,
                       hearth_err *err)
{
    planner *pl = ctx;
    if (strncmp(key, "resources.", 10) == 0)
        return EXPR_UNKNOWN_KEY;
    key_slot *ks = key_lookup_slot(pl, key);
    if (!ks)
        return herr_set(err, HERR_NOMEM, "out of memory");
    if (!ks->known)
        return EXPR_UNKNOWN_KEY;
    int rc = resolve(pl, pt);
    memset(out, 0, sizeof *out);
    if (rc && ks->k.kind == RCK_MODEL)
        return 0;   /* the model did not resolve: its keys read as null */
    run_config_key_read(&pl->cfg, &ks->k, &ks->v);
    switch (ks->v.type) {
    case RCV_NUM: out->type = EXPR_V_NUM; out->num = ks->v.num; break;
    case RCV_BOOL: out->type = EXPR_V_BOOL; out->boolean = ks->v.boolean; break;
    case RCV_STR: out->type = EXPR_V_STR; out->str = ks->v.str; break;
    case RCV_NULL: break;
    }
    return 0;
}

/* ---- dedup ---------------------------------------------------------------------------- */

static uint64_t hash_key(const char *hex)
{
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = hex[i];
        v = v << 4 | (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return v ? v : 1;
}

/* Returns the index of an earlier point with this hash, or UINT64_MAX after adding it. */
static int seen_check(planner *pl, const char *hex, uint64_t index, uint64_t *first,
                      hearth_err *err)
{
    if ((pl->seen_n + 1) * 2 > pl->seen_cap) {
        uint64_t cap = pl->seen_cap ? pl->seen_cap * 2 : 1024;
        seen_slot *t = calloc(cap, sizeof *t);
        if (!t)
            return herr_set(err, HERR_NOMEM, "out of memory");
        for (uint64_t i = 0; i < pl->seen_cap; i++) {
            if (!pl->seen[i].key)
                continue;
            uint64_t j = pl->seen[i].key & (cap - 1);
            while (t[j].key)
                j = (j + 1) & (cap - 1);
            t[j] = pl->seen[i];
        }
        free(pl->seen);
        pl->seen = t;
        pl->seen_cap = cap;
    }
    uint64_t key = hash_key(hex), j = key & (pl->seen_cap - 1);
    while (pl->seen[j].key) {
        if (pl->seen[j].key == key) {
            *first = pl->seen[j].index;
            return 0;
        }
        j = (j + 1) & (pl->seen_cap - 1);
    }
    pl->seen[j].key = key;
    pl->seen[j].index = index;
    pl->seen_n++;
    *first = UINT64_MAX;
    return 0;
}

/* "rule NAME: message" from run_config_check_rules, split. */
static void split_rule(const char *msg, char *name, size_t name_size, char *reason,
                       size_t reason_size)
{
    const char *p = msg;
    if (strncmp(p, "rule ", 5) == 0) {
        p += 5;
        size_t len = strcspn(p, ":");
        if (len >= name_size)
            len = name_size - 1;
        memcpy(name, p, len);
        name[len] = '\0';
        p += strcspn(p, ":");
        if (*p == ':')
            p++;
        while (*p == ' ')
            p++;
    } else {
        snprintf(name, name_size, "rule");
    }
    snprintf(reason, reason_size, "%s", p);
}

/* Rule ranks_match_gpus, the orchestrator's own (it concerns resources, which the run
 * config does not know): a cuda run is one rank per GPU, so its ranks are resources.nodes
 * x resources.gpus_per_node.  resolve() sets them so; a `ranks` written in the base or the
 * point that disagrees is pruned here rather than silently replaced.  Returns 1 with the
 * message in reason when the point breaks the rule. */
static int cuda_ranks_broken(const planner *pl, const expand_point *pt, const run_config *cfg,
                             char *reason, size_t size)
{
    if (cfg->device != DEVICE_CUDA)
        return 0;
    int64_t nodes = pl->res.nodes, gpus = pl->res.gpus_per_node;
    if (nodes < 1 || gpus < 1 || nodes > (1 << 20) || gpus > (1 << 20) ||
        nodes * gpus >= (1 << 30)) {
        snprintf(reason, size, "device cuda runs one rank per GPU: resources.nodes %lld x "
                 "resources.gpus_per_node %lld is not a usable number of ranks",
                 (long long)nodes, (long long)gpus);
        return 1;
    }
    const spec_value *v = expand_point_get(pt, "ranks");
    const yaml_tree_node *n = v ? v->node : yaml_tree_get(pl->s->base, "ranks");
    int64_t given = 0;
    if (n && yaml_tree_as_int(n, &given) == 1 && given != nodes * gpus) {
        snprintf(reason, size, "device cuda runs one rank per GPU: ranks %lld must equal "
                 "resources.nodes %lld x resources.gpus_per_node %lld = %lld (or leave ranks "
                 "out)", (long long)given, (long long)nodes, (long long)gpus,
                 (long long)(nodes * gpus));
        return 1;
    }
    return 0;
}

/* Whether the spec's trainer says it has no cuda backend (asked once, at the first
 * device: cuda point: a spec without one never runs the trainer at plan time). */
static int trainer_lacks_cuda(planner *pl)
{
    if (!pl->opts->trainer_path)
        return 0;
    if (!pl->caps_asked) {
        trainer_caps_query(pl->opts->trainer_path, &pl->caps);
        pl->caps_asked = 1;
    }
    return pl->caps.known && !pl->caps.cuda;
}

/* ---- the plan ------------------------------------------------------------------------- */

typedef struct {
    plan_point p;
    char rule[64];
} point_buf;

int plan_run(const spec *s, const plan_opts *opts, plan_point_fn cb, void *ctx,
             plan_counts *counts, hearth_err *err)
{
    static const plan_opts no_opts;
    if (!opts)
        opts = &no_opts;
    if (s->any_auto && !opts->resolve_auto)
        return herr_set(err, HERR_CONFIG, "%s: `auto` values are resolved from the results "
                        "database, which this plan has no access to", s->file);
    plan_counts cnt;
    memset(&cnt, 0, sizeof cnt);
    planner *pl = malloc(sizeof *pl);
    point_buf *pb = malloc(sizeof *pb);
    if (!pl || !pb) {
        free(pl);
        free(pb);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    expand_iter *it = NULL;
    int rc = planner_init(pl, s, opts, err);
    if (!rc)
        rc = expand_create(&it, s, plan_lookup, pl, err);
    expand_point pt;
    while (!rc && (rc = expand_next(it, &pt, err)) == 1) {
        rc = 0;
        plan_point *p = &pb->p;
        /* field by field: clearing the whole struct (with its 1 KiB reason) per point shows
         * in sweeps of millions */
        p->status = PLAN_KEPT;
        p->hash[0] = '\0';
        p->rule = NULL;
        p->reason[0] = '\0';
        p->completed = 0;
        p->runs = 0;
        p->index = pt.seq;
        p->pt = &pt;
        p->duplicate_of = UINT64_MAX;
        if (!run_config_base_preset(pl->base) && !expand_point_get(&pt, "model")) {
            rc = herr_set(err, HERR_CONFIG, "%s: model: required: name a preset in base "
                          "(model: NAME) or in every point (point %" PRIu64 " names none)",
                          s->file, pt.seq + 1);
            break;
        }
        int rrc = resolve(pl, &pt);
        if (!rrc && opts->resolve_auto &&
            (rc = opts->resolve_auto(opts->auto_ctx, &pt, &pl->cfg, err)))
            break;
        p->config = &pl->cfg;
        p->res = pl->res;
        hearth_err rule_err;
        if (rrc == HERR_NOMEM) {
            rc = herr_set(err, rrc, "%s", pl->rerr.msg);
            break;
        }
        if (rrc) {
            p->status = PLAN_PRUNED;
            snprintf(pb->rule, sizeof pb->rule, "shape");
            snprintf(p->reason, sizeof p->reason, "%s", pl->rerr.msg);
            p->rule = pb->rule;
        } else if (pl->cfg.device == DEVICE_CUDA && trainer_lacks_cuda(pl)) {
            p->status = PLAN_PRUNED;
            snprintf(pb->rule, sizeof pb->rule, "trainer_has_cuda");
            snprintf(p->reason, sizeof p->reason, "device: cuda, but the trainer %s was built "
                     "without the cuda backend (hearth-train --capabilities lists no cuda: "
                     "build with nvcc on PATH, or set HEARTH_CUDA_LIB)",
                     opts->trainer_path ? opts->trainer_path : "");
            p->rule = pb->rule;
        } else if (cuda_ranks_broken(pl, &pt, &pl->cfg, p->reason, sizeof p->reason)) {
            p->status = PLAN_PRUNED;
            snprintf(pb->rule, sizeof pb->rule, "ranks_match_gpus");
            p->rule = pb->rule;
        } else if (run_config_check_rules(&pl->cfg, &rule_err) ||
                   mem_plan_check_gpu_mem(&pl->cfg, s->resources.gpu_mem, &rule_err)) {
            p->status = PLAN_PRUNED;
            split_rule(rule_err.msg, pb->rule, sizeof pb->rule, p->reason, sizeof p->reason);
            p->rule = pb->rule;
        } else if (!opts->no_hash) {
            if ((rc = run_config_hash(&pl->cfg, p->hash, err)))
                break;
            uint64_t first = UINT64_MAX;
            if ((rc = seen_check(pl, p->hash, p->index, &first, err)))
                break;
            if (first != UINT64_MAX) {
                p->status = PLAN_SKIPPED;
                p->duplicate_of = first;
                snprintf(p->reason, sizeof p->reason,
                         "same resolved config as point %" PRIu64, first + 1);
            } else {
                int done = 0;
                if (!opts->force && opts->already_completed &&
                    (rc = opts->already_completed(opts->completed_ctx, p->hash, &done, err)))
                    break;
                p->completed = done;
                if (done >= s->repeat) {
                    p->status = PLAN_SKIPPED;
                    snprintf(p->reason, sizeof p->reason, "%d of %d runs already completed",
                             done, s->repeat);
                } else {
                    p->status = PLAN_KEPT;
                    p->runs = s->repeat - done;
                }
            }
        } else {
            p->status = PLAN_KEPT;
            p->runs = s->repeat;
        }
        switch (p->status) {
        case PLAN_KEPT: cnt.kept++; cnt.runs += (uint64_t)p->runs; break;
        case PLAN_PRUNED: cnt.pruned++; break;
        case PLAN_SKIPPED: cnt.skipped++; break;
        }
        if (cb && (rc = cb(ctx, p)))
            break;
    }
    if (it) {
        expand_stats st;
        expand_get_stats(it, &st);
        cnt.candidates = st.candidates;
        cnt.excluded = st.excluded;
        cnt.filtered = st.filtered;
        cnt.points = st.points;
    }
    if (counts)
        *counts = cnt;
    expand_free(it);
    planner_free(pl);
    free(pl);
    free(pb);
    return rc;
}

/* ---- collecting ----------------------------------------------------------------------- */

static int collect_point(void *ctx, const plan_point *p)
{
    plan_result *r = ctx;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        plan_entry *grown = realloc(r->e, (size_t)cap * sizeof *grown);
        if (!grown)
            return HERR_NOMEM;
        r->e = grown;
        r->cap = cap;
    }
    plan_entry *e = &r->e[r->n];
    memset(e, 0, sizeof *e);
    e->index = p->index;
    e->status = p->status;
    e->include = p->pt->include;
    e->n = p->pt->n;
    e->kv = malloc(((size_t)e->n + 1) * sizeof *e->kv);
    if (!e->kv)
        return HERR_NOMEM;
    memcpy(e->kv, p->pt->kv, (size_t)e->n * sizeof *e->kv);
    memcpy(e->hash, p->hash, sizeof e->hash);
    if (p->rule) {
        /* rule names are short identifiers; keep them beside the reason */
        size_t len = strlen(p->rule) + 1 + strlen(p->reason) + 1;
        e->reason = malloc(len);
        if (!e->reason) {
            free(e->kv);
            return HERR_NOMEM;
        }
        memcpy(e->reason, p->rule, strlen(p->rule) + 1);
        memcpy(e->reason + strlen(p->rule) + 1, p->reason, strlen(p->reason) + 1);
        e->rule = e->reason;
    } else if (p->reason[0]) {
        e->reason = strdup(p->reason);
        if (!e->reason) {
            free(e->kv);
            return HERR_NOMEM;
        }
    }
    e->completed = p->completed;
    e->runs = p->runs;
    e->res = p->res;
    r->n++;
    return 0;
}

/* The reason text of an entry (after the rule name for pruned ones). */
static const char *entry_reason(const plan_entry *e)
{
    if (!e->reason)
        return "";
    return e->rule ? e->reason + strlen(e->rule) + 1 : e->reason;
}

int plan_collect(const spec *s, const plan_opts *opts, plan_result *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    out->s = s;
    int rc = plan_run(s, opts, collect_point, out, &out->counts, err);
    if (rc == HERR_NOMEM)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    if (rc)
        plan_result_free(out);
    return rc;
}

void plan_result_free(plan_result *r)
{
    for (int i = 0; i < r->n; i++) {
        free(r->e[i].kv);
        free(r->e[i].reason);
    }
    free(r->e);
    memset(r, 0, sizeof *r);
}

/* ---- output --------------------------------------------------------------------------- */

/* The swept keys in spec order: matrix, zip, then keys that only includes set. */
static int columns(const spec *s, const char **cols, int cap)
{
    int n = 0;
    for (int i = 0; i < s->n_matrix && n < cap; i++)
        cols[n++] = s->matrix[i].key;
    for (int g = 0; g < s->n_zip; g++)
        for (int i = 0; i < s->zip[g].n_axes && n < cap; i++)
            cols[n++] = s->zip[g].axes[i].key;
    for (int e = 0; e < s->n_include; e++)
        for (int k = 0; k < s->include[e].n && n < cap; k++) {
            const char *key = s->include[e].settings[k].key;
            int dup = 0;
            for (int j = 0; j < n && !dup; j++)
                dup = strcmp(cols[j], key) == 0;
            if (!dup)
                cols[n++] = key;
        }
    return n;
}

static const char *entry_value(const plan_entry *e, const char *key)
{
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->kv[i].key, key) == 0)
            return e->kv[i].value->text;
    return "-";
}

/* Prints text with control characters shown as '?', padded to width. */
static void put_cell(FILE *f, const char *text, int width)
{
    int n = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++, n++)
        fputc(*c < 0x20 || *c == 0x7f ? '?' : *c, f);
    for (; n < width; n++)
        fputc(' ', f);
}

static int cell_len(const char *text)
{
    return (int)strlen(text);
}

#define PLAN_MAX_COLS 64

static void print_section(const plan_result *r, FILE *f, plan_status status, const char **cols,
                          int n_cols)
{
    int count = 0;
    for (int i = 0; i < r->n; i++)
        count += r->e[i].status == status;
    if (!count)
        return;
    int w[PLAN_MAX_COLS], w_idx = 1, w_extra = 4;
    const char *extra_head = status == PLAN_KEPT ? "runs" : status == PLAN_PRUNED ? "rule" : "hash";
    for (int c = 0; c < n_cols; c++)
        w[c] = cell_len(cols[c]);
    for (int i = 0; i < r->n; i++) {
        const plan_entry *e = &r->e[i];
        if (e->status != status)
            continue;
        char idx[32];
        int len = snprintf(idx, sizeof idx, "%" PRIu64, e->index + 1);
        if (len > w_idx)
            w_idx = len;
        for (int c = 0; c < n_cols; c++) {
            int l = cell_len(entry_value(e, cols[c]));
            if (l > w[c])
                w[c] = l;
        }
        if (status == PLAN_PRUNED && e->rule && cell_len(e->rule) > w_extra)
            w_extra = cell_len(e->rule);
        if (status != PLAN_PRUNED)
            w_extra = 12;
    }
    /* the last cell of a line is not padded: no trailing blanks */
    int last_pad = status == PLAN_KEPT ? 0 : 2;
    fprintf(f, "\n%s (%d):\n  ", plan_status_name(status), count);
    put_cell(f, "#", w_idx + 2);
    if (status == PLAN_KEPT) {
        put_cell(f, "hash", 14);
        put_cell(f, "runs", n_cols ? 6 : 0);
    } else {
        put_cell(f, extra_head, w_extra + 2);
    }
    for (int c = 0; c < n_cols; c++)
        put_cell(f, cols[c], c == n_cols - 1 && !last_pad ? 0 : w[c] + 2);
    if (status != PLAN_KEPT)
        fputs("reason", f);
    fputc('\n', f);
    for (int i = 0; i < r->n; i++) {
        const plan_entry *e = &r->e[i];
        if (e->status != status)
            continue;
        char idx[32], hash[16];
        snprintf(idx, sizeof idx, "%" PRIu64, e->index + 1);
        snprintf(hash, sizeof hash, "%.12s", e->hash);
        fputs("  ", f);
        put_cell(f, idx, w_idx + 2);
        if (status == PLAN_KEPT) {
            char runs[16];
            snprintf(runs, sizeof runs, "%d", e->runs);
            put_cell(f, hash, 14);
            put_cell(f, runs, n_cols ? 6 : 0);
        } else if (status == PLAN_PRUNED) {
            put_cell(f, e->rule ? e->rule : "", w_extra + 2);
        } else {
            put_cell(f, hash, w_extra + 2);
        }
        for (int c = 0; c < n_cols; c++)
            put_cell(f, entry_value(e, cols[c]), c == n_cols - 1 && !last_pad ? 0 : w[c] + 2);
        if (status != PLAN_KEPT)
            put_cell(f, entry_reason(e), 0);
        fputc('\n', f);
    }
}

int plan_format_table(const plan_result *r, FILE *f)
{
    const plan_counts *c = &r->counts;
    fprintf(f, "experiment %s: %" PRIu64 " points: %" PRIu64 " kept (%" PRIu64 " runs), %" PRIu64
            " pruned, %" PRIu64 " skipped\n", r->s->name, c->points, c->kept, c->runs, c->pruned,
            c->skipped);
    if (c->excluded || c->filtered)
        fprintf(f, "  (%" PRIu64 " candidates: %" PRIu64 " excluded, %" PRIu64
                " filtered out by where)\n", c->candidates, c->excluded, c->filtered);
    const char *cols[PLAN_MAX_COLS];
    int n_cols = columns(r->s, cols, PLAN_MAX_COLS);
    print_section(r, f, PLAN_KEPT, cols, n_cols);
    print_section(r, f, PLAN_PRUNED, cols, n_cols);
    print_section(r, f, PLAN_SKIPPED, cols, n_cols);
    return ferror(f) ? HERR_IO : 0;
}

/* A spec value as JSON, typed the way the YAML reader types it. */
static json_t *value_json(const yaml_tree_node *n)
{
    if (!n)
        return json_null();
    if (n->kind == YAML_TREE_SEQ) {
        json_t *a = json_array();
        for (int i = 0; a && i < n->n_items; i++)
            json_array_append_new(a, value_json(n->items[i]));
        return a;
    }
    if (n->kind == YAML_TREE_MAP) {
        json_t *o = json_object();
        for (int i = 0; o && i < n->n_pairs; i++)
            json_object_set_new(o, n->pairs[i].key, value_json(n->pairs[i].value));
        return o;
    }
    int64_t iv;
    double dv;
    int bv;
    if (n->quoted)
        return json_stringn(n->text, n->len);
    if (yaml_tree_is_null(n))
        return json_null();
    if (yaml_tree_as_bool(n, &bv))
        return json_boolean(bv);
    if (yaml_tree_as_int(n, &iv) == 1)
        return json_integer((json_int_t)iv);
    if (yaml_tree_as_double(n, &dv) == 1)
        return json_real(dv);
    return json_stringn(n->text, n->len);
}

static json_t *resources_json(const plan_resources *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "nodes", json_integer(r->nodes));
    json_object_set_new(o, "gpus_per_node", json_integer(r->gpus_per_node));
    json_object_set_new(o, "cpus_per_task", json_integer(r->cpus_per_task));
    if (r->max_concurrent)
        json_object_set_new(o, "max_concurrent", json_integer(r->max_concurrent));
    const struct { const char *k, *v; } strs[] = {
        {"time", r->time}, {"partition", r->partition}, {"account", r->account},
        {"qos", r->qos}, {"constraint", r->constraint},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (strs[i].v)
            json_object_set_new(o, strs[i].k, json_string(strs[i].v));
    return o;
}

int plan_format_json(const plan_result *r, FILE *f)
{
    const plan_counts *c = &r->counts;
    json_t *root = json_object(), *counts = json_object();
    json_t *arr[3] = { json_array(), json_array(), json_array() };
    if (!root || !counts || !arr[0] || !arr[1] || !arr[2]) {
        json_decref(root);
        json_decref(counts);
        for (int i = 0; i < 3; i++)
            json_decref(arr[i]);
        return HERR_NOMEM;
    }
    json_object_set_new(root, "experiment", json_string(r->s->name));
    json_object_set_new(counts, "candidates", json_integer((json_int_t)c->candidates));
    json_object_set_new(counts, "excluded", json_integer((json_int_t)c->excluded));
    json_object_set_new(counts, "filtered", json_integer((json_int_t)c->filtered));
    json_object_set_new(counts, "points", json_integer((json_int_t)c->points));
    json_object_set_new(counts, "kept", json_integer((json_int_t)c->kept));
    json_object_set_new(counts, "runs", json_integer((json_int_t)c->runs));
    json_object_set_new(counts, "pruned", json_integer((json_int_t)c->pruned));
    json_object_set_new(counts, "skipped", json_integer((json_int_t)c->skipped));
    json_object_set_new(root, "repeat", json_integer(r->s->repeat));
    json_object_set_new(root, "counts", counts);
    for (int i = 0; i < r->n; i++) {
        const plan_entry *e = &r->e[i];
        json_t *o = json_object(), *ov = json_object();
        json_object_set_new(o, "index", json_integer((json_int_t)e->index + 1));
        for (int k = 0; k < e->n; k++)
            json_object_set_new(ov, e->kv[k].key, value_json(e->kv[k].value->node));
        json_object_set_new(o, "overrides", ov);
        if (e->include)
            json_object_set_new(o, "include", json_integer(e->include));
        json_object_set_new(o, "resources", resources_json(&e->res));
        if (e->status != PLAN_PRUNED)
            json_object_set_new(o, "hash", json_string(e->hash));
        if (e->status == PLAN_KEPT) {
            json_object_set_new(o, "runs", json_integer(e->runs));
            json_object_set_new(o, "completed", json_integer(e->completed));
        } else if (e->status == PLAN_PRUNED) {
            json_object_set_new(o, "rule", json_string(e->rule ? e->rule : ""));
            json_object_set_new(o, "reason", json_string(entry_reason(e)));
        } else {
            json_object_set_new(o, "completed", json_integer(e->completed));
            json_object_set_new(o, "reason", json_string(entry_reason(e)));
        }
        json_array_append_new(arr[e->status], o);
    }
    json_object_set_new(root, "kept", arr[PLAN_KEPT]);
    json_object_set_new(root, "pruned", arr[PLAN_PRUNED]);
    json_object_set_new(root, "skipped", arr[PLAN_SKIPPED]);
    int rc = json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(root);
    fputc('\n', f);
    return rc || ferror(f) ? HERR_IO : 0;
}
