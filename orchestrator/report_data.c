/* report_data.c - reading an experiment for `hearth report`.  See report_data.h. */
#include "report_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"
#include "runs_db.h"
#include "stats.h"
#include "strbuf.h"

/* At most this many varying config keys make up a config's label. */
#define LABEL_MAX_KEYS 6

/* A completed run with its result, as read before grouping. */
typedef struct {
    int64_t id;
    char *run_id, *hash;
    double tps;
    int64_t nodes, devices, ranks;
} run_row;

static char *dup_col(sqlite3_stmt *st, int col, int *oom)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    char *s = strdup(t ? (const char *)t : "");
    if (!s)
        *oom = 1;
    return s;
}

static double real_col(sqlite3_stmt *st, int col)
{
    return sqlite3_column_type(st, col) == SQLITE_NULL ? NAN : sqlite3_column_double(st, col);
}

/* Grows *arr (elements of `size` bytes) to hold n + 1; 0 or HERR_NOMEM. */
static int grow(void **arr, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 8;
    void *g = realloc(*arr, c * size);
    if (!g)
        return HERR_NOMEM;
    *arr = g;
    *cap = c;
    return 0;
}

static int read_runs(hearth_db *db, int64_t exp, run_row **out, size_t *n, hearth_err *err)
{
    static const char sql[] =
        "SELECT r.id, r.run_id, r.config_hash, x.tokens_per_s, x.nodes, x.device_count, "
        "(SELECT kv.num FROM run_config_kv kv JOIN config_keys k ON k.id = kv.key_id "
        "WHERE kv.run = r.id AND k.key = 'ranks') "
        "FROM runs r JOIN results x ON x.run = r.id "
        "WHERE r.experiment_id = ?1 AND r.state = 'completed' ORDER BY r.seq";
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, exp, &st, err);
    if (rc)
        return rc;
    size_t cap = 0;
    int oom = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (grow((void **)out, *n, &cap, sizeof **out)) {
            rc = SQLITE_NOMEM;
            break;
        }
        run_row *r = &(*out)[(*n)++];
        r->id = sqlite3_column_int64(st, 0);
        r->run_id = dup_col(st, 1, &oom);
        r->hash = dup_col(st, 2, &oom);
        r->tps = real_col(st, 3);
        r->nodes = sqlite3_column_int64(st, 4);
        r->devices = sqlite3_column_int64(st, 5);
        r->ranks = sqlite3_column_int64(st, 6);
        if (oom) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    rc = db_rows_end(db, rc, "reading the experiment's runs", err);
    db_stmt_done(st);
    return rc;
}

int report_data_label(hearth_db *db, int64_t run, const char *hash, char *const *keys,
                      int n_keys, char **out, hearth_err *err)
{
    static const char sql[] =
        "SELECT coalesce(kv.num, kv.txt, CASE kv.flag WHEN 1 THEN 'true' WHEN 0 THEN "
        "'false' END, 'null') FROM run_config_kv kv JOIN config_keys k ON k.id = kv.key_id "
        "WHERE kv.run = ?1 AND k.key = ?2";
    strbuf b = { 0 };
    int rc = 0;
    if (n_keys == 0)
        rc = strbuf_add(&b, hash, strnlen(hash, 12));
    for (int i = 0; i < n_keys && !rc; i++) {
        sqlite3_stmt *st;
        if ((rc = db_prepare_int64(db, sql, run, &st, err)))
            break;
        sqlite3_bind_text(st, 2, keys[i], -1, SQLITE_STATIC);
        int s = sqlite3_step(st);
        const unsigned char *v = s == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
        const char *val = v ? (const char *)v : "-";
        if (s != SQLITE_ROW && s != SQLITE_DONE) {
            rc = db_fail(db, err, "reading a config value");
        } else if ((i && strbuf_add(&b, " ", 1)) || strbuf_add(&b, keys[i], strlen(keys[i])) ||
                   strbuf_add(&b, "=", 1) || strbuf_add(&b, val, strlen(val))) {
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        }
        db_stmt_done(st);
    }
    if (!rc && !b.s && strbuf_add(&b, "", 0))
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    return 0;
}

/* The settings of run `run` but for its layout, as one text ("key=value" lines in key
 * order): two configs with equal texts belong to one scaling family.  *out is malloc'd. */
static int family_text(hearth_db *db, int64_t run, char **out, hearth_err *err)
{
    static const char sql[] =
        "SELECT k.key, quote(coalesce(kv.num, kv.txt, kv.flag)) FROM run_config_kv kv "
        "JOIN config_keys k ON k.id = kv.key_id WHERE kv.run = ?1 AND k.key NOT IN ("
        REPORT_LAYOUT_KEYS ") ORDER BY k.key";
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, run, &st, err);
    if (rc)
        return rc;
    strbuf b = { 0 };
    int oom = strbuf_add(&b, "", 0) != 0;
    while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st, 0);
        const char *v = (const char *)sqlite3_column_text(st, 1);
        oom = !k || !v || strbuf_add(&b, k, strlen(k)) || strbuf_add(&b, "=", 1) ||
              strbuf_add(&b, v, strlen(v)) || strbuf_add(&b, "\n", 1);
    }
    rc = oom ? herr_set(err, HERR_NOMEM, "out of memory")
             : db_rows_end(db, rc, "reading a run's settings", err);
    db_stmt_done(st);
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    return 0;
}

/* Sets each config's family from the settings of its first run, runs[first[i]]. */
static int group_families(hearth_db *db, const run_row *runs, const size_t *first,
                          report_data *d, hearth_err *err)
{
    char **text = calloc(d->n_configs ? d->n_configs : 1, sizeof *text);
    if (!text)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < d->n_configs && !rc; i++) {
        rc = family_text(db, runs[first[i]].id, &text[i], err);
        d->configs[i].family = i;
        for (size_t k = 0; k < i && !rc; k++)
            if (strcmp(text[k], text[i]) == 0) {
                d->configs[i].family = d->configs[k].family;
                break;
            }
    }
    for (size_t i = 0; i < d->n_configs; i++)
        free(text[i]);
    free(text);
    return rc;
}

/* Groups the runs by config hash (first appearance order) with their throughput spread. */
static int group_configs(hearth_db *db, int64_t exp, const run_row *runs, size_t n,
                         report_data *d, hearth_err *err)
{
    char *keys[LABEL_MAX_KEYS];
    int n_keys = 0;
    int rc = query_varying_keys(db, exp, LABEL_MAX_KEYS, keys, &n_keys, err);
    double *tps = rc ? NULL : malloc((n ? n : 1) * sizeof *tps);
    size_t *first = rc ? NULL : malloc((n ? n : 1) * sizeof *first);   /* per config */
    if (!rc && (!tps || !first))
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    size_t cap = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int seen = 0;
        for (size_t k = 0; k < d->n_configs && !seen; k++)
            seen = strcmp(d->configs[k].hash, runs[i].hash) == 0;
        if (seen)
            continue;
        if (grow((void **)&d->configs, d->n_configs, &cap, sizeof *d->configs)) {
            rc = herr_set(err, HERR_NOMEM, "out of memory");
            break;
        }
        first[d->n_configs] = i;
        report_config *c = &d->configs[d->n_configs++];
        memset(c, 0, sizeof *c);
        c->nodes = runs[i].nodes;
        c->devices = runs[i].devices;
        c->ranks = runs[i].ranks;
        if (!(c->hash = strdup(runs[i].hash))) {
            rc = herr_set(err, HERR_NOMEM, "out of memory");
            break;
        }
        if ((rc = report_data_label(db, runs[i].id, runs[i].hash, keys, n_keys, &c->label,
                                    err)))
            break;
        for (size_t j = i; j < n; j++) {
            if (strcmp(runs[j].hash, c->hash) != 0)
                continue;
            c->n_runs++;
            if (isfinite(runs[j].tps))
                tps[c->n_tps++] = runs[j].tps;
        }
        stats_summary st;
        stats_summarize(tps, c->n_tps, &st);
        c->tps_min = st.min;
        c->tps_median = st.median;
        c->tps_max = st.max;
    }
    if (!rc)
        rc = group_families(db, runs, first, d, err);
    free(tps);
    free(first);
    for (int i = 0; i < n_keys; i++)
        free(keys[i]);
    return rc;
}

int64_t report_data_scale_value(const report_config *c, report_scale s)
{
    return s == REPORT_SCALE_NODES ? c->nodes : s == REPORT_SCALE_DEVICES ? c->devices
                                                                          : c->ranks;
}

size_t report_data_ideal_base(const report_data *d, size_t i)
{
    if (i >= d->n_configs)
        return REPORT_NONE;
    size_t fam = d->configs[i].family, base = REPORT_NONE;
    int64_t largest = 0;
    for (size_t k = 0; k < d->n_configs; k++) {
        const report_config *c = &d->configs[k];
        int64_t size = report_data_scale_value(c, d->scale);
        if (c->family != fam || size <= 0 || !isfinite(c->tps_median))
            continue;
        if (size > largest)
            largest = size;
        if (base == REPORT_NONE) {
            base = k;
            continue;
        }
        int64_t bsize = report_data_scale_value(&d->configs[base], d->scale);
        if (size < bsize || (size == bsize && c->tps_median > d->configs[base].tps_median))
            base = k;
    }
    if (base == REPORT_NONE || largest == report_data_scale_value(&d->configs[base], d->scale))
        return REPORT_NONE;
    return base;
}

/* Whether nodes, else devices, else ranks take more than one value among the configs. */
static report_scale scale_of(const report_data *d)
{
    int nodes = 0, devices = 0, ranks = 0;
    for (size_t i = 1; i < d->n_configs; i++) {
        nodes |= d->configs[i].nodes != d->configs[0].nodes;
        devices |= d->configs[i].devices != d->configs[0].devices;
        ranks |= d->configs[i].ranks != d->configs[0].ranks;
    }
    return nodes ? REPORT_SCALE_NODES : devices ? REPORT_SCALE_DEVICES
         : ranks ? REPORT_SCALE_RANKS : REPORT_SCALE_NONE;
}

/* Reads run `id`'s losses into curve c; *c->run_id is set by the caller. */
static int read_curve(hearth_db *db, int64_t id, report_curve *c, hearth_err *err)
{
    static const char sql[] =
        "SELECT step, loss FROM metrics WHERE run = ?1 AND loss IS NOT NULL ORDER BY step";
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, id, &st, err);
    if (rc)
        return rc;
    size_t cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (c->n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            double *s = realloc(c->step, nc * sizeof *s);
            if (s)
                c->step = s;
            double *l = s ? realloc(c->loss, nc * sizeof *l) : NULL;
            if (!l) {
                rc = SQLITE_NOMEM;
                break;
            }
            c->loss = l;
            cap = nc;
        }
        c->step[c->n] = (double)sqlite3_column_int64(st, 0);
        c->loss[c->n++] = sqlite3_column_double(st, 1);
    }
    rc = db_rows_end(db, rc, "reading per-step metrics", err);
    db_stmt_done(st);
    return rc;
}

/* The index of the config of hash `hash`; every completed run's config is among them. */
static size_t config_of(const report_data *d, const char *hash)
{
    for (size_t i = 0; i < d->n_configs; i++)
        if (strcmp(d->configs[i].hash, hash) == 0)
            return i;
    return REPORT_NONE;
}

/* Adds a curve for run `run_id` (database id, config hash); `explicit`: named by the user,
 * so missing metrics are an error rather than a run left out. */
static int add_curve(hearth_db *db, report_data *d, size_t *cap, int64_t id,
                     const char *run_id, const char *hash, int explicit, hearth_err *err)
{
    if (grow((void **)&d->curves, d->n_curves, cap, sizeof *d->curves))
        return herr_set(err, HERR_NOMEM, "out of memory");
    report_curve *c = &d->curves[d->n_curves++];
    memset(c, 0, sizeof *c);
    c->config = config_of(d, hash);
    if (!(c->run_id = strdup(run_id)) ||
        !(c->label = strdup(c->config == REPORT_NONE ? "" : d->configs[c->config].label)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = read_curve(db, id, c, err);
    if (rc || c->n)
        return rc;
    if (explicit)
        return herr_set(err, HERR_CONFIG, "run '%s' has no per-step losses in the database "
                        "(its metrics.jsonl was empty or not ingested)", run_id);
    free(c->run_id);
    free(c->label);
    d->n_curves--;
    return 0;
}

/* The curves of the runs named in `list` (comma-separated). */
static int curves_named(hearth_db *db, int64_t exp, const char *list, report_data *d,
                        hearth_err *err)
{
    static const char sql[] =
        "SELECT r.id, r.experiment_id, r.config_hash FROM runs r WHERE r.run_id = ?1";
    size_t cap = 0;
    const char *p = list;
    int rc = 0;
    while (!rc && *p) {
        size_t len = strcspn(p, ",");
        char *name = strndup(p, len);
        if (!name)
            return herr_set(err, HERR_NOMEM, "out of memory");
        if (!*name) {
            rc = herr_set(err, HERR_CONFIG, "--runs %s: an empty run id", list);
        } else {
            sqlite3_stmt *st;
            rc = db_row_text(db, sql, name, &st, "looking up a run", err);
            if (rc == 0) {
                rc = herr_set(err, HERR_CONFIG, "--runs: no run named '%s'", name);
            } else if (rc == 1) {
                int64_t id = sqlite3_column_int64(st, 0), e = sqlite3_column_int64(st, 1);
                int oom = 0;
                char *hash = dup_col(st, 2, &oom);
                db_stmt_done(st);
                if (oom)
                    rc = herr_set(err, HERR_NOMEM, "out of memory");
                else if (e != exp)
                    rc = herr_set(err, HERR_CONFIG, "--runs: run '%s' is not a run of "
                                  "experiment '%s'", name, d->experiment);
                else
                    rc = add_curve(db, d, &cap, id, name, hash, 1, err);
                free(hash);
            }
        }
        free(name);
        p += len;
        if (*p == ',')
            p++;
    }
    return rc;
}

/* The curves of the `best` runs by tokens/s that have metrics. */
static int curves_best(hearth_db *db, const run_row *runs, size_t n, long best,
                       report_data *d, hearth_err *err)
{
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return herr_set(err, HERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    /* Insertion sort, best first, runs without a throughput last; stable in run order. */
    for (size_t i = 1; i < n; i++) {
        size_t k = order[i], j = i;
        while (j > 0 && (isfinite(runs[k].tps) &&
                         (!isfinite(runs[order[j - 1]].tps) || runs[k].tps > runs[order[j - 1]].tps))) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = k;
    }
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc && d->n_curves < (size_t)best; i++)
        rc = add_curve(db, d, &cap, runs[order[i]].id, runs[order[i]].run_id,
                       runs[order[i]].hash, 0, err);
    free(order);
    if (!rc && d->n_curves == 0)
        rc = herr_set(err, HERR_CONFIG, "experiment '%s': none of its completed runs has "
                      "per-step losses in the database (empty metrics)", d->experiment);
    return rc;
}

static int read_decisions(hearth_db *db, report_data *d, hearth_err *err)
{
    static const char sql[] =
        "SELECT kind, decision, method, evidence, subject, created_at FROM decisions "
        "WHERE experiment = ?1 ORDER BY id";
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, sql, d->experiment, &st, err);
    if (rc)
        return rc;
    size_t cap = 0;
    int oom = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (grow((void **)&d->decisions, d->n_decisions, &cap, sizeof *d->decisions)) {
            rc = SQLITE_NOMEM;
            break;
        }
        report_decision *x = &d->decisions[d->n_decisions++];
        x->kind = dup_col(st, 0, &oom);
        x->decision = dup_col(st, 1, &oom);
        x->method = dup_col(st, 2, &oom);
        x->evidence = dup_col(st, 3, &oom);
        x->subject = dup_col(st, 4, &oom);
        x->created_at = dup_col(st, 5, &oom);
        if (oom) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    rc = db_rows_end(db, rc, "reading selection decisions", err);
    db_stmt_done(st);
    return rc;
}

int report_data_load(hearth_db *db, const char *experiment, const char *runs, long best,
                     report_data *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    if (!(out->experiment = strdup(experiment)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    int64_t exp = 0;
    int rc = runs_db_experiment_find(db, experiment, &exp, err);
    if (rc == 0)
        return herr_set(err, HERR_CONFIG, "no experiment named '%s'", experiment);
    if (rc < 0)
        return rc;
    run_row *rows = NULL;
    size_t n = 0;
    rc = read_runs(db, exp, &rows, &n, err);
    if (!rc && n == 0)
        rc = herr_set(err, HERR_CONFIG, "experiment '%s' has no completed run with a result "
                      "(`hearth status %s` shows its runs)", experiment, experiment);
    out->n_runs = n;
    if (!rc)
        rc = group_configs(db, exp, rows, n, out, err);
    if (!rc) {
        out->scale = scale_of(out);
        rc = runs ? curves_named(db, exp, runs, out, err)
                  : curves_best(db, rows, n, best, out, err);
    }
    if (!rc)
        rc = read_decisions(db, out, err);
    for (size_t i = 0; i < n; i++) {
        free(rows[i].run_id);
        free(rows[i].hash);
    }
    free(rows);
    return rc;
}

void report_data_free(report_data *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n_configs; i++) {
        free(d->configs[i].hash);
        free(d->configs[i].label);
    }
    for (size_t i = 0; i < d->n_curves; i++) {
        free(d->curves[i].run_id);
        free(d->curves[i].label);
        free(d->curves[i].step);
        free(d->curves[i].loss);
    }
    for (size_t i = 0; i < d->n_decisions; i++) {
        report_decision *x = &d->decisions[i];
        free(x->kind);
        free(x->decision);
        free(x->method);
        free(x->evidence);
        free(x->subject);
        free(x->created_at);
    }
    free(d->configs);
    free(d->curves);
    free(d->decisions);
    free(d->experiment);
    memset(d, 0, sizeof *d);
}
