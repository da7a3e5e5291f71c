/* check_db.c - reading the points of `hearth check` from the results database.  See
 * check_db.h. */
#include "check_db.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report_data.h"
#include "runs_db.h"
#include "query.h"

/* At most this many varying config keys make up a point's label (as in `hearth report`). */
#define LABEL_MAX_KEYS 6

/* The figures' columns, in check_figure order, as every query below selects them from
 * results x. */
#define FIGURE_COLS "x.tokens_per_s, x.step_ms_median, x.mfu, x.peak_mem_bytes, x.final_loss"

void check_set_free(check_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].hash);
        free(s->v[i].label);
        free(s->v[i].source);
        free(s->v[i].first_created);
    }
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

check_point *check_set_find(check_set *s, const char *hash)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i].hash, hash) == 0)
            return &s->v[i];
    return NULL;
}

static void point_init(check_point *p)
{
    memset(p, 0, sizeof *p);
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        p->fig[f].median = p->fig[f].min = p->fig[f].max = NAN;
    check_tols_unset(&p->tols);
}

check_point *check_set_add(check_set *s)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        check_point *g = realloc(s->v, cap * sizeof *g);
        if (!g)
            return NULL;
        s->v = g;
        s->cap = cap;
    }
    check_point *p = &s->v[s->n++];
    point_init(p);
    return p;
}

/* The figures of the runs of one point, collected before they are summarised. */
typedef struct {
    double *v[CHECK_N_FIGURES];
    size_t n, cap;
} figure_acc;

static void acc_free(figure_acc *a)
{
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        free(a->v[f]);
}

/* Adds the figures in columns col.. of the row; HERR_NOMEM. */
static int acc_add(figure_acc *a, sqlite3_stmt *st, int col)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 8;
        for (int f = 0; f < CHECK_N_FIGURES; f++) {
            double *g = realloc(a->v[f], cap * sizeof *g);
            if (!g)
                return HERR_NOMEM;
            a->v[f] = g;
        }
        a->cap = cap;
    }
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        a->v[f][a->n] = sqlite3_column_type(st, col + f) == SQLITE_NULL
                            ? NAN : sqlite3_column_double(st, col + f);
    a->n++;
    return 0;
}

/* Summarises what a holds into p and empties a. */
static void acc_finish(figure_acc *a, check_point *p)
{
    p->n_runs = a->n;
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        stats_summarize(a->v[f], a->n, &p->fig[f]);
    a->n = 0;
}

static char *text_col(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return strdup(t ? (const char *)t : "");
}

/* A point with the seq and runs.id of its first run, for ordering and labelling. */
typedef struct {
    int64_t seq, run;
    size_t index;
} point_order;

static int cmp_order(const void *a, const void *b)
{
    const point_order *x = a, *y = b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Reorders s->v by the first run's seq. */
static int order_points(check_set *s, point_order *ord, hearth_err *err)
{
    if (!s->n)
        return 0;
    qsort(ord, s->n, sizeof *ord, cmp_order);
    check_point *v = malloc((s->n ? s->n : 1) * sizeof *v);
    if (!v)
        return herr_set(err, HERR_NOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++)
        v[i] = s->v[ord[i].index];
    memcpy(s->v, v, s->n * sizeof *v);
    free(v);
    return 0;
}

static int add_labels(hearth_db *db, int64_t exp, check_set *s, const point_order *ord,
                      hearth_err *err)
{
    char *keys[LABEL_MAX_KEYS];
    int n_keys = 0;
    int rc = query_varying_keys(db, exp, LABEL_MAX_KEYS, keys, &n_keys, err);
    for (size_t i = 0; i < s->n && !rc; i++)
        rc = report_data_label(db, ord[i].run, s->v[i].hash, keys, n_keys, &s->v[i].label,
                               err);
    for (int i = 0; i < n_keys; i++)
        free(keys[i]);
    return rc;
}

int check_db_experiment(hearth_db *db, const char *experiment, int labels, check_set *out,
                        hearth_err *err)
{
    /* Grouped by hash in SQL, so that grouping here is one pass whatever the size. */
    static const char sql[] =
        "SELECT r.config_hash, r.seq, r.id, r.created_at, "
        "r.state = 'completed' AND x.run IS NOT NULL, " FIGURE_COLS " "
        "FROM runs r LEFT JOIN results x ON x.run = r.id "
        "WHERE r.experiment_id = ?1 ORDER BY r.config_hash, r.seq";
    memset(out, 0, sizeof *out);
    int64_t exp;
    int rc = runs_db_experiment_find(db, experiment, &exp, err);
    if (rc <= 0)
        return rc ? rc : herr_set(err, HERR_CONFIG, "no experiment named '%s'", experiment);
    sqlite3_stmt *st;
    if ((rc = db_prepare_int64(db, sql, exp, &st, err)))
        return rc;
    figure_acc acc = { { 0 }, 0, 0 };
    point_order *ord = NULL;
    size_t ord_cap = 0;
    check_point *cur = NULL;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *hash = (const char *)sqlite3_column_text(st, 0);
        if (!cur || strcmp(cur->hash, hash ? hash : "") != 0) {
            if (cur)
                acc_finish(&acc, cur);
            if (out->n == ord_cap) {
                point_order *g = realloc(ord, (ord_cap ? 2 * ord_cap : 8) * sizeof *g);
                if (!g) {
                    rc = SQLITE_NOMEM;
                    break;
                }
                ord = g;
                ord_cap = ord_cap ? 2 * ord_cap : 8;
            }
            if (!(cur = check_set_add(out))) {
                rc = SQLITE_NOMEM;
                break;
            }
            ord[out->n - 1] = (point_order){ sqlite3_column_int64(st, 1),
                                             sqlite3_column_int64(st, 2), out->n - 1 };
            cur->hash = text_col(st, 0);
            cur->first_created = text_col(st, 3);
            cur->source = strdup(experiment);
            if (!cur->hash || !cur->first_created || !cur->source) {
                rc = SQLITE_NOMEM;
                break;
            }
        }
        if (sqlite3_column_int(st, 4) && acc_add(&acc, st, 5)) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    if (rc == SQLITE_DONE && cur)
        acc_finish(&acc, cur);
    rc = db_rows_end(db, rc, "reading the experiment's runs", err);
    db_stmt_done(st);
    acc_free(&acc);
    if (!rc)
        rc = order_points(out, ord, err);
    if (!rc && labels)
        rc = add_labels(db, exp, out, ord, err);
    free(ord);
    return rc;
}

/* Summarises the group of runs in acc (one experiment's, source set) into *group and
 * keeps it in *best when it beats the best so far: more tokens/s, or as many (none
 * measured included) and newer, since groups come oldest first.  group->source moves to
 * *best or is freed. */
static void take_group(figure_acc *acc, check_point *group, check_point *best, int *found)
{
    acc_finish(acc, group);
    double g = group->fig[CHECK_TOKENS_PER_S].median;
    double b = best->fig[CHECK_TOKENS_PER_S].median;
    if (!*found || (isfinite(g) && !(g < b)) || (!isfinite(g) && !isfinite(b))) {
        free(best->source);
        *best = *group;
        *found = 1;
    } else {
        free(group->source);
    }
    group->source = NULL;
}

int check_db_history(hearth_db *db, const char *experiment, const check_point *p,
                     check_point *out, hearth_err *err)
{
    static const char sql[] =
        "SELECT e.id, e.name, " FIGURE_COLS " "
        "FROM runs r JOIN results x ON x.run = r.id JOIN experiments e ON e.id = "
        "r.experiment_id WHERE r.config_hash = ?1 AND r.state = 'completed' "
        "AND e.name != ?2 AND r.created_at < ?3 ORDER BY e.id, r.seq";
    point_init(out);
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, sql, p->hash, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 2, experiment, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, p->first_created ? p->first_created : "", -1, SQLITE_STATIC);
    figure_acc acc = { { 0 }, 0, 0 };
    check_point group;
    point_init(&group);
    int64_t group_exp = 0;
    int found = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t e = sqlite3_column_int64(st, 0);
        if (acc.n && e != group_exp)
            take_group(&acc, &group, out, &found);
        if (!acc.n) {
            group_exp = e;
            if (!(group.source = text_col(st, 1))) {
                rc = SQLITE_NOMEM;
                break;
            }
        }
        if (acc_add(&acc, st, 2)) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    if (rc == SQLITE_DONE && acc.n)
        take_group(&acc, &group, out, &found);
    free(group.source);
    rc = db_rows_end(db, rc, "reading earlier runs of the point", err);
    db_stmt_done(st);
    acc_free(&acc);
    if (rc) {
        free(out->source);
        point_init(out);
        return rc;
    }
    return found;
}
