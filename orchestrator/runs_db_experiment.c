/* runs_db_experiment.c - experiments as a user manages them: remove, archive, tag, list.
 * See runs_db.h. */
#include "runs_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOW "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
#define TAG_MAX 64

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

/* The experiment's row id; HERR_CONFIG when there is none. */
static int need_id(hearth_db *db, const char *name, int64_t *id, hearth_err *err)
{
    int rc = runs_db_experiment_find(db, name, id, err);
    if (rc == 0)
        return herr_set(err, HERR_CONFIG, "no experiment named '%s'", name);
    return rc < 0 ? rc : 0;
}

/* One count(*) keyed by the experiment's id into *n. */
static int count_of(hearth_db *db, const char *sql, int64_t id, long *n, const char *what,
                    hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, id, &st, err);
    if (rc)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW)
        *n = (long)sqlite3_column_int64(st, 0);
    else
        rc = db_fail(db, err, what);
    db_stmt_done(st);
    return rc;
}

static int remove_in_tx(hearth_db *db, const char *name, experiment_removed *out,
                        hearth_err *err)
{
    int64_t id = 0;
    long live = 0;
    int rc = need_id(db, name, &id, err);
    if (!rc)
        rc = count_of(db, "SELECT count(*) FROM runs WHERE experiment_id = ?1 AND state IN "
                      "('submitted', 'running')", id, &live, "counting live runs", err);
    if (!rc && live)
        return herr_set(err, HERR_RUNTIME, "%s has %ld run%s submitted or running", name, live,
                        live == 1 ? "" : "s");
    if (!rc)
        rc = count_of(db, "SELECT count(*) FROM runs WHERE experiment_id = ?1", id, &out->runs,
                      "counting runs", err);
    /* Decisions name their experiment (no foreign key: `hearth select` records some for no
     * experiment at all). */
    sqlite3_stmt *st;
    if (!rc && !(rc = db_prepare_text(db, "DELETE FROM decisions WHERE experiment = ?1", name,
                                      &st, err))) {
        rc = db_step_done(db, st, "removing the experiment's decisions", err);
        out->decisions = rc ? 0 : (long)sqlite3_changes(db_sqlite(db));
    }
    if (!rc && !(rc = db_prepare_int64(db, "DELETE FROM experiments WHERE id = ?1", id, &st,
                                       err)))
        rc = db_step_done(db, st, "removing the experiment", err);
    return rc;
}

int runs_db_experiment_remove(hearth_db *db, const char *name, experiment_removed *out,
                              hearth_err *err)
{
    experiment_removed got = { 0, 0 };
    int rc = db_tx_begin(db, err);
    if (rc)
        return rc;
    rc = db_tx_end(db, remove_in_tx(db, name, &got, err), err);
    if (out)
        *out = rc ? (experiment_removed){ 0, 0 } : got;
    return rc;
}

/* Runs `sql` (?1 the experiment's id) in a transaction that first checks the experiment
 * exists; *changed (may be NULL) receives the rows changed. */
static int change_one(hearth_db *db, const char *name, const char *sql, const char *tag,
                      int *changed, const char *what, hearth_err *err)
{
    int64_t id = 0;
    int n = 0;
    int rc = db_tx_begin(db, err);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    if (!(rc = need_id(db, name, &id, err)) &&
        !(rc = db_prepare_int64(db, sql, id, &st, err))) {
        if (tag)
            sqlite3_bind_text(st, 2, tag, -1, SQLITE_STATIC);
        rc = db_step_done(db, st, what, err);
        n = rc ? 0 : sqlite3_changes(db_sqlite(db));
    }
    rc = db_tx_end(db, rc, err);
    if (changed)
        *changed = rc ? 0 : n;
    return rc;
}

int runs_db_experiment_archive(hearth_db *db, const char *name, int archived, int *changed,
                               hearth_err *err)
{
    static const char sql_on[] =
        "UPDATE experiments SET archived_at = " NOW ", updated_at = " NOW
        " WHERE id = ?1 AND archived_at IS NULL";
    static const char sql_off[] =
        "UPDATE experiments SET archived_at = NULL, updated_at = " NOW
        " WHERE id = ?1 AND archived_at IS NOT NULL";
    return change_one(db, name, archived ? sql_on : sql_off, NULL, changed,
                      archived ? "archiving an experiment" : "unarchiving an experiment", err);
}

int runs_db_tag_check(const char *tag, hearth_err *err)
{
    size_t n = strlen(tag);
    int ok = n >= 1 && n <= TAG_MAX && tag[0] != '-';
    for (size_t i = 0; ok && i < n; i++) {
        char ch = tag[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             strchr("._:@+-", ch) != NULL;
    }
    if (!ok)
        return herr_set(err, HERR_CONFIG, "tag '%.*s%s': expected 1 to %d characters of "
                        "A-Z a-z 0-9 . _ : @ + - (not starting with -)", TAG_MAX, tag,
                        n > TAG_MAX ? "..." : "", TAG_MAX);
    return 0;
}

int runs_db_experiment_tag(hearth_db *db, const char *name, const char *tag, int add,
                           int *changed, hearth_err *err)
{
    if (changed)
        *changed = 0;
    int rc = runs_db_tag_check(tag, err);
    if (rc)
        return rc;
    return change_one(db, name,
                      add ? "INSERT OR IGNORE INTO experiment_tags (experiment, tag) "
                            "VALUES (?1, ?2)"
                          : "DELETE FROM experiment_tags WHERE experiment = ?1 AND tag = ?2",
                      tag, changed, add ? "tagging an experiment" : "untagging an experiment",
                      err);
}

/* ---- listing ---------------------------------------------------------------------------- */

void runs_db_experiment_list_free(experiment_info *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        free(v[i].name);
        free(v[i].created_at);
        free(v[i].archived_at);
        free(v[i].tags);
    }
    free(v);
}

typedef struct {
    experiment_info *v;
    int64_t *ids;             /* ascending: experiments are read in id order */
    size_t n, cap;
} exp_list;

static experiment_info *by_id(const exp_list *l, int64_t id)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n && l->ids[lo] == id ? &l->v[lo] : NULL;
}

static int read_experiments(hearth_db *db, const experiment_filter *f, exp_list *l,
                            hearth_err *err)
{
    static const char sql[] =
        "SELECT id, name, created_at, archived_at FROM experiments e "
        "WHERE (?1 OR archived_at IS NULL) AND (?2 IS NULL OR EXISTS (SELECT 1 FROM "
        "experiment_tags t WHERE t.experiment = e.id AND t.tag = ?2)) ORDER BY id";
    sqlite3_stmt *st;
    int rc = db_prepare(db, sql, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_int(st, 1, f && f->archived);
    if (f && f->tag)
        sqlite3_bind_text(st, 2, f->tag, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 2);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 16;
            experiment_info *nv = realloc(l->v, cap * sizeof *nv);
            if (nv)
                l->v = nv;
            int64_t *ni = nv ? realloc(l->ids, cap * sizeof *ni) : NULL;
            if (!ni) {
                rc = SQLITE_NOMEM;
                break;
            }
            l->ids = ni;
            l->cap = cap;
        }
        experiment_info *e = &l->v[l->n];
        memset(e, 0, sizeof *e);
        l->ids[l->n++] = sqlite3_column_int64(st, 0);
        e->name = col_dup(st, 1);
        e->created_at = col_dup(st, 2);
        e->archived_at = col_dup(st, 3);
        if (!e->name || !e->created_at ||
            (sqlite3_column_type(st, 3) != SQLITE_NULL && !e->archived_at)) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    rc = db_rows_end(db, rc, "listing experiments", err);
    db_stmt_done(st);
    return rc;
}

static int read_counts(hearth_db *db, exp_list *l, hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare(db, "SELECT experiment_id, state, count(*) FROM runs "
                        "GROUP BY experiment_id, state", &st, err);
    if (rc)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        experiment_info *e = by_id(l, sqlite3_column_int64(st, 0));
        run_state s;
        if (e && run_state_parse((const char *)sqlite3_column_text(st, 1), &s, err) == 0)
            e->counts[s] = (long)sqlite3_column_int64(st, 2);
        else if (e) {
            rc = HERR_RUNTIME;
            break;
        }
    }
    rc = db_rows_end(db, rc, "counting runs", err);
    db_stmt_done(st);
    return rc;
}

/* Appends ",tag" (or "tag") to *s. */
static int append_tag(char **s, const char *tag)
{
    size_t old = *s ? strlen(*s) : 0, add = strlen(tag);
    char *g = realloc(*s, old + add + 2);
    if (!g)
        return -1;
    if (old)
        g[old++] = ',';
    memcpy(g + old, tag, add + 1);
    *s = g;
    return 0;
}

static int read_tags(hearth_db *db, exp_list *l, hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare(db, "SELECT experiment, tag FROM experiment_tags "
                        "ORDER BY experiment, tag", &st, err);
    if (rc)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        experiment_info *e = by_id(l, sqlite3_column_int64(st, 0));
        const char *tag = (const char *)sqlite3_column_text(st, 1);
        if (e && tag && append_tag(&e->tags, tag)) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    rc = db_rows_end(db, rc, "reading tags", err);
    db_stmt_done(st);
    return rc;
}

int runs_db_experiment_list(hearth_db *db, const experiment_filter *f, experiment_info **out,
                            size_t *n, hearth_err *err)
{
    *out = NULL;
    *n = 0;
    if (f && f->tag) {
        int rc = runs_db_tag_check(f->tag, err);
        if (rc)
            return rc;
    }
    exp_list l = { NULL, NULL, 0, 0 };
    /* One read snapshot for the three queries (as runs_db_count_by_hashes does). */
    sqlite3 *s = db_sqlite(db);
    int own = sqlite3_get_autocommit(s);
    if (own && sqlite3_exec(s, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(db, err, "starting a read");
    int rc = read_experiments(db, f, &l, err);
    if (!rc && l.n)
        rc = read_counts(db, &l, err);
    if (!rc && l.n)
        rc = read_tags(db, &l, err);
    if (own)
        sqlite3_exec(s, rc ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL);
    free(l.ids);
    if (rc) {
        runs_db_experiment_list_free(l.v, l.n);
        return rc;
    }
    *out = l.v;
    *n = l.n;
    return 0;
}
