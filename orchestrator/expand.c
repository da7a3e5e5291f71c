/* expand.c - the matrix as an odometer over its axes, then the include entries; exclude
 * and where filter each candidate as it comes (expand.h). */
#include "expand.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One odometer wheel: a matrix axis, or a zip group (several axes turning together). */
typedef struct {
    int n_values;
    int n_axes;
    const spec_axis *axes;
} wheel;

struct expand_iter {
    const spec *s;
    expand_lookup_fn fallback;
    void *ctx;
    int n_wheels;
    wheel *wheels;
    int *idx;             /* current value index per wheel */
    expand_kv *kv;
    int cap_kv;
    int phase;            /* 0 product, 1 includes, 2 done */
    int next_include;
    expand_point cur;     /* the candidate being looked at, for lookups */
    expand_stats st;
};

static const char *canon(const char *key)
{
    return strcmp(key, "model.preset") == 0 ? "model" : key;
}

/* a * b, or UINT64_MAX when that does not fit. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t p;
    return __builtin_mul_overflow(a, b, &p) ? UINT64_MAX : p;
}

uint64_t expand_candidates(const spec *s)
{
    uint64_t prod = 1;
    for (int i = 0; i < s->n_matrix; i++)
        prod = mul_sat(prod, (uint64_t)s->matrix[i].n_values);
    for (int g = 0; g < s->n_zip; g++)
        prod = mul_sat(prod, (uint64_t)s->zip[g].axes[0].n_values);
    if (s->n_matrix == 0 && s->n_zip == 0 && s->n_include > 0)
        prod = 0;
    uint64_t n = prod + (uint64_t)s->n_include;
    return n < prod ? UINT64_MAX : n;
}

/* Refuses a spec with more candidates than its max_points, before any is made; the message
 * gives the count, the list lengths behind it, the limit and how to raise it. */
static int check_size(const spec *s, hearth_err *err)
{
    uint64_t n = expand_candidates(s);
    if (n <= (uint64_t)s->max_points)
        return 0;
    char count[32], lens[160] = "";
    if (n == UINT64_MAX)
        snprintf(count, sizeof count, "2^64 or more");
    else
        snprintf(count, sizeof count, "%llu", (unsigned long long)n);
    size_t used = 0;
    for (int w = 0; w < s->n_matrix + s->n_zip && used < sizeof lens; w++) {
        int len = w < s->n_matrix ? s->matrix[w].n_values
                                  : s->zip[w - s->n_matrix].axes[0].n_values;
        int k = snprintf(lens + used, sizeof lens - used, "%s%d", w ? " x " : "", len);
        used += k > 0 ? (size_t)k : 0;
    }
    if (used >= sizeof lens)
        memcpy(lens + sizeof lens - 5, " ...", 5);
    if (s->n_include)
        snprintf(lens + strlen(lens), sizeof lens - strlen(lens), "%s%d include entries",
                 lens[0] ? " + " : "", s->n_include);
    return herr_set(err, HERR_CONFIG, "%s: matrix: %s candidate points (%s), more than "
                    "max_points %lld: where and exclude drop points only after they are "
                    "made, so narrow the matrix, or raise the limit with a top-level "
                    "`max_points: N` in the spec", s->file, count, lens,
                    (long long)s->max_points);
}

int expand_create(expand_iter **out, const spec *s, expand_lookup_fn fallback, void *ctx,
                  hearth_err *err)
{
    *out = NULL;
    int rc = check_size(s, err);
    if (rc)
        return rc;
    expand_iter *it = calloc(1, sizeof *it);
    if (!it)
        return herr_set(err, HERR_NOMEM, "out of memory");
    it->s = s;
    it->fallback = fallback;
    it->ctx = ctx;
    it->n_wheels = s->n_matrix + s->n_zip;
    it->wheels = calloc((size_t)it->n_wheels + 1, sizeof *it->wheels);
    it->idx = calloc((size_t)it->n_wheels + 1, sizeof *it->idx);
    int w = 0;
    for (int i = 0; i < s->n_matrix; i++, w++)
        if (it->wheels)
            it->wheels[w] = (wheel){ s->matrix[i].n_values, 1, &s->matrix[i] };
    for (int g = 0; g < s->n_zip; g++, w++)
        if (it->wheels)
            it->wheels[w] = (wheel){ s->zip[g].axes[0].n_values, s->zip[g].n_axes,
                                     s->zip[g].axes };
    int cap = 0;
    for (w = 0; w < it->n_wheels; w++)
        cap += it->wheels ? it->wheels[w].n_axes : 0;
    for (int e = 0; e < s->n_include; e++)
        if (s->include[e].n > cap)
            cap = s->include[e].n;
    it->cap_kv = cap;
    it->kv = calloc((size_t)cap + 1, sizeof *it->kv);
    if (!it->wheels || !it->idx || !it->kv) {
        expand_free(it);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    /* An empty product (no axes) is one point, unless includes replace it. */
    it->phase = (it->n_wheels == 0 && s->n_include > 0) ? 1 : 0;
    *out = it;
    return 0;
}

void expand_free(expand_iter *it)
{
    if (!it)
        return;
    free(it->wheels);
    free(it->idx);
    free(it->kv);
    free(it);
}

void expand_get_stats(const expand_iter *it, expand_stats *st)
{
    *st = it->st;
}

const spec_value *expand_point_get(const expand_point *pt, const char *key)
{
    key = canon(key);
    for (int i = 0; i < pt->n; i++)
        if (strcmp(pt->kv[i].key, key) == 0)
            return pt->kv[i].value;
    return NULL;
}

void expand_value_typed(const spec_value *v, expr_value *out)
{
    spec_value_typed(v->node, v->text, NULL, out);
}

void expand_value_as(const spec_value *v, const char *key, expr_value *out)
{
    spec_value_typed(v->node, v->text, key, out);
}

/* Finds a dotted key in a run-config mapping written with nested and/or dotted keys
 * ("train: {lr: 1}", "train.lr: 1"). */
static const yaml_tree_node *base_find(const yaml_tree_node *map, const char *key)
{
    if (!map || map->kind != YAML_TREE_MAP)
        return NULL;
    for (int i = 0; i < map->n_pairs; i++) {
        const yaml_tree_pair *p = &map->pairs[i];
        size_t len = strlen(p->key);
        if (strcmp(p->key, key) == 0)
            return p->value;
        if (strncmp(p->key, key, len) == 0 && key[len] == '.') {
            const yaml_tree_node *found = base_find(p->value, key + len + 1);
            if (found)
                return found;
        }
    }
    return NULL;
}

/* The spec's own answer: resources (with plan's defaults) or the base as written. */
static int spec_lookup(const spec *s, const char *key, expr_value *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(key, "resources.", 10) == 0) {
        const spec_resources *r = &s->resources;
        const char *k = key + 10;
        struct { const char *k; int64_t v, def; } ints[] = {
            {"nodes", r->nodes, 1}, {"gpus_per_node", r->gpus_per_node, 1},
            {"cpus_per_task", r->cpus_per_task, 1}, {"max_concurrent", r->max_concurrent, 0},
        };
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
            if (strcmp(k, ints[i].k) == 0) {
                out->type = EXPR_V_NUM;
                out->num = (double)(ints[i].v ? ints[i].v : ints[i].def);
                return 0;
            }
        }
        struct { const char *k; const char *v; } strs[] = {
            {"time", r->time}, {"partition", r->partition}, {"account", r->account},
            {"qos", r->qos}, {"constraint", r->constraint},
        };
        for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
            if (strcmp(k, strs[i].k) == 0) {
                if (strs[i].v) {
                    out->type = EXPR_V_STR;
                    out->str = strs[i].v;
                }
                return 0;
            }
        }
        return EXPR_UNKNOWN_KEY;
    }
    const yaml_tree_node *n = base_find(s->base, key);
    if (!n && strcmp(key, "model") == 0)
        n = base_find(s->base, "model.preset");
    if (!n || n->kind == YAML_TREE_MAP)
        return EXPR_UNKNOWN_KEY;
    spec_value_typed(n, n->kind == YAML_TREE_SCALAR ? n->text : "[...]", key, out);
    return 0;
}

static int iter_lookup(void *ctx, const char *key, expr_value *out, hearth_err *err)
{
    expand_iter *it = ctx;
    key = canon(key);
    const spec_value *v = expand_point_get(&it->cur, key);
    if (v) {
        *out = v->typed;
        return 0;
    }
    if (it->fallback) {
        int rc = it->fallback(it->ctx, &it->cur, key, out, err);
        if (rc != EXPR_UNKNOWN_KEY)
            return rc;
    }
    return spec_lookup(it->s, key, out);
}

/* Does the candidate match every setting of the exclude entry? */
static int matches(expand_iter *it, const spec_entry *en, int *out, hearth_err *err)
{
    *out = 0;
    for (int i = 0; i < en->n; i++) {
        const spec_setting *st = &en->settings[i];
        const spec_value *pv = expand_point_get(&it->cur, st->key);
        if (pv) {
            /* both written in the spec: lists compare as their flow text */
            if (pv->node->kind != YAML_TREE_SCALAR || st->value.node->kind != YAML_TREE_SCALAR) {
                if (strcmp(pv->text, st->value.text) != 0)
                    return 0;
                continue;
            }
            if (!expr_value_equal(&pv->typed, &st->value.typed))
                return 0;
            continue;
        }
        expr_value a;
        int rc = iter_lookup(it, st->key, &a, err);
        if (rc == EXPR_UNKNOWN_KEY)
            return 0;
        if (rc < 0)
            return rc;
        if (!expr_value_equal(&a, &st->value.typed))
            return 0;
    }
    *out = 1;
    return 0;
}

/* Builds the current product candidate from the odometer. */
static void load_product(expand_iter *it)
{
    int k = 0;
    for (int w = 0; w < it->n_wheels; w++) {
        const wheel *wh = &it->wheels[w];
        for (int a = 0; a < wh->n_axes; a++) {
            it->kv[k].key = wh->axes[a].key;
            it->kv[k].value = &wh->axes[a].values[it->idx[w]];
            k++;
        }
    }
    it->cur.n = k;
    it->cur.include = 0;
}

/* Advances the odometer; returns 0 when it wrapped around (the product is done). */
static int advance(expand_iter *it)
{
    for (int w = it->n_wheels - 1; w >= 0; w--) {
        if (++it->idx[w] < it->wheels[w].n_values)
            return 1;
        it->idx[w] = 0;
    }
    return 0;
}

/* Loads the next candidate; returns 0 when there are none left. */
static int next_candidate(expand_iter *it)
{
    if (it->phase == 0) {
        load_product(it);
        if (!advance(it))
            it->phase = 1;
        return 1;
    }
    if (it->phase == 1 && it->next_include < it->s->n_include) {
        const spec_entry *en = &it->s->include[it->next_include++];
        for (int i = 0; i < en->n; i++) {
            it->kv[i].key = en->settings[i].key;
            it->kv[i].value = &en->settings[i].value;
        }
        it->cur.n = en->n;
        it->cur.include = it->next_include;
        return 1;
    }
    it->phase = 2;
    return 0;
}

int expand_next(expand_iter *it, expand_point *pt, hearth_err *err)
{
    const spec *s = it->s;
    while (next_candidate(it)) {
        it->cur.kv = it->kv;
        it->cur.candidate = it->st.candidates++;
        it->cur.seq = it->st.points;
        int drop = 0, rc;
        for (int e = 0; e < s->n_exclude && !drop; e++)
            if ((rc = matches(it, &s->exclude[e], &drop, err)))
                return rc;
        if (drop) {
            it->st.excluded++;
            continue;
        }
        if (s->where) {
            int keep = 0, col = 0;
            hearth_err eerr;
            rc = expr_eval_bool(s->where, iter_lookup, it, NULL, &keep, &col, &eerr);
            if (rc) {
                int line, fcol;
                char at[300];
                spec_where_position(s, col, &line, &fcol);
                spec_position_format(s, line, fcol, at, sizeof at);
                return herr_set(err, rc, "%s: where: %s (point %llu)", at, eerr.msg,
                                (unsigned long long)it->cur.candidate + 1);
            }
            if (!keep) {
                it->st.filtered++;
                continue;
            }
        }
        it->st.points++;
        *pt = it->cur;
        return 1;
    }
    return 0;
}
