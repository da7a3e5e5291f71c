/* runs_db.c - experiments and runs: inserts, state transitions, lookups.  See runs_db.h. */
#include "runs_db.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_kv.h"

#define NOW "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static void bind_opt_text(sqlite3_stmt *st, int i, const char *s)
{
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

int runs_db_experiment_find(hearth_db *db, const char *name, int64_t *id, hearth_err *err)
{
    static const char sql[] = "SELECT id FROM experiments WHERE name = ?1";
    sqlite3_stmt *st;
    int rc = db_row_text(db, sql, name, &st, "looking up an experiment", err);
    if (rc == 1) {
        if (id)
            *id = sqlite3_column_int64(st, 0);
        db_stmt_done(st);
    }
    return rc;
}

int runs_db_experiment_upsert(hearth_db *db, const char *name, const char *spec_path,
                              const char *spec_text, int64_t *id, hearth_err *err)
{
    if (!name || !*name)
        return herr_set(err, HERR_CONFIG, "an experiment needs a name");
    static const char sql[] =
        "INSERT INTO experiments (name, spec_path, spec_text) VALUES (?1, ?2, ?3) "
        "ON CONFLICT (name) DO UPDATE SET "
        "spec_path = coalesce(excluded.spec_path, spec_path), "
        "spec_text = coalesce(excluded.spec_text, spec_text), "
        "updated_at = " NOW " RETURNING id";
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, sql, name, &st, err);
    if (rc)
        return rc;
    bind_opt_text(st, 2, spec_path);
    bind_opt_text(st, 3, spec_text);
    if (sqlite3_step(st) == SQLITE_ROW) {
        if (id)
            *id = sqlite3_column_int64(st, 0);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, err, "recording an experiment");
    } else {
        rc = db_fail(db, err, "recording an experiment");
    }
    db_stmt_done(st);
    return rc;
}

int runs_db_names(hearth_db *db, int runs, void (*fn)(void *ctx, const char *name), void *ctx,
                  hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare(db, runs ? "SELECT run_id FROM runs ORDER BY run_id"
                                 : "SELECT name FROM experiments ORDER BY name", &st, err);
    if (rc)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (name)
            fn(ctx, name);
    }
    rc = db_rows_end(db, rc, runs ? "listing run ids" : "listing experiments", err);
    db_stmt_done(st);
    return rc;
}

static int hash_ok(const char *h)
{
    if (!h || strlen(h) != 64)
        return 0;
    for (const char *p = h; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

/* A run's config hash checked and its config JSON parsed into *config (the caller's). */
static int config_parse(const char *hash, const char *json, json_t **config, hearth_err *err)
{
    if (!hash_ok(hash))
        return herr_set(err, HERR_CONFIG, "config hash '%s' is not 64 lowercase hex digits",
                        hash ? hash : "");
    json_error_t jerr;
    *config = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!*config)
        return herr_set(err, HERR_CONFIG, "run config JSON:%d:%d: %s", jerr.line, jerr.column,
                        jerr.text);
    return 0;
}

static int insert_run(hearth_db *db, const run_new *r, json_t *config, char **run_id,
                      int64_t *pk, hearth_err *err)
{
    int64_t exp = 0;   /* set when found; the compiler cannot see that through db_row_text */
    int rc = runs_db_experiment_find(db, r->experiment, &exp, err);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return herr_set(err, HERR_CONFIG, "no experiment named '%s'", r->experiment);

    static const char next_sql[] =
        "SELECT coalesce(max(seq), 0) + 1 FROM runs WHERE experiment_id = ?1";
    sqlite3_stmt *st;
    if ((rc = db_prepare_int64(db, next_sql, exp, &st, err)))
        return rc;
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = db_fail(db, err, "numbering a run");
        db_stmt_done(st);
        return rc;
    }
    int64_t seq = sqlite3_column_int64(st, 0);
    db_stmt_done(st);

    char *id = NULL;
    if (asprintf(&id, "%s-%lld", r->experiment, (long long)seq) < 0)
        return herr_set(err, HERR_NOMEM, "out of memory");
    static const char ins_sql[] =
        "INSERT INTO runs (run_id, experiment_id, seq, config_json, config_hash, run_dir) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
    if ((rc = db_prepare(db, ins_sql, &st, err))) {
        free(id);
        return rc;
    }
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, exp);
    sqlite3_bind_int64(st, 3, seq);
    sqlite3_bind_text(st, 4, r->config_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, r->config_hash, -1, SQLITE_STATIC);
    bind_opt_text(st, 6, r->run_dir);
    if ((rc = db_step_done(db, st, "recording a run", err))) {
        free(id);
        return rc;
    }
    int64_t row = sqlite3_last_insert_rowid(db_sqlite(db));
    if ((rc = config_kv_insert(db, row, config, err))) {
        free(id);
        return rc;
    }
    if (pk)
        *pk = row;
    if (run_id)
        *run_id = id;
    else
        free(id);
    return 0;
}

int runs_db_insert(hearth_db *db, const run_new *r, char **run_id, int64_t *pk,
                   hearth_err *err)
{
    if (run_id)
        *run_id = NULL;
    if (!r->experiment || !r->config_json)
        return herr_set(err, HERR_CONFIG, "a run needs an experiment and a config");
    json_t *config;
    int rc = config_parse(r->config_hash, r->config_json, &config, err);
    if (rc)
        return rc;
    rc = db_tx_begin(db, err);
    if (rc == 0)
        rc = db_tx_end(db, insert_run(db, r, config, run_id, pk, err), err);
    json_decref(config);
    if (rc && run_id) {
        free(*run_id);
        *run_id = NULL;
    }
    return rc;
}

static int restore_run(hearth_db *db, const run_restore *r, json_t *config, hearth_err *err)
{
    int64_t exp = 0;
    int rc = runs_db_experiment_upsert(db, r->experiment, NULL, NULL, &exp, err);
    if (rc)
        return rc;
    static const char ins_sql[] =
        "INSERT INTO runs (run_id, experiment_id, seq, config_json, config_hash, run_dir, "
        "state, attempts, backend) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
        "ON CONFLICT DO NOTHING";
    sqlite3_stmt *st;
    if ((rc = db_prepare_text(db, ins_sql, r->run_id, &st, err)))
        return rc;
    sqlite3_bind_int64(st, 2, exp);
    sqlite3_bind_int64(st, 3, r->seq);
    sqlite3_bind_text(st, 4, r->config_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, r->config_hash, -1, SQLITE_STATIC);
    bind_opt_text(st, 6, r->run_dir);
    sqlite3_bind_text(st, 7, run_state_name(r->state), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 8, r->attempts);
    bind_opt_text(st, 9, r->backend);
    if ((rc = db_step_done(db, st, "recording a run", err)))
        return rc;
    if (sqlite3_changes(db_sqlite(db)) == 0)
        return herr_set(err, HERR_CONFIG, "run %s (or number %lld of experiment %s) is "
                        "recorded already; not changed", r->run_id, (long long)r->seq,
                        r->experiment);
    int64_t row = sqlite3_last_insert_rowid(db_sqlite(db));
    if ((rc = config_kv_insert(db, row, config, err)))
        return rc;
    static const char ev_sql[] =
        "INSERT INTO run_events (run, from_state, to_state, attempt, backend, note) "
        "VALUES (?1, 'pending', ?2, ?3, ?4, ?5)";
    if ((rc = db_prepare_int64(db, ev_sql, row, &st, err)))
        return rc;
    sqlite3_bind_text(st, 2, run_state_name(r->state), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, r->attempts);
    bind_opt_text(st, 4, r->backend);
    bind_opt_text(st, 5, r->note);
    return db_step_done(db, st, "recording a run event", err);
}

int runs_db_restore(hearth_db *db, const run_restore *r, hearth_err *err)
{
    if (!r->experiment || !r->run_id || !r->config_json || r->seq < 1 || r->attempts < 0 ||
        (unsigned)r->state >= RUN_STATE_COUNT)
        return herr_set(err, HERR_CONFIG, "a restored run needs an experiment, an id, a "
                        "number, a config and a state");
    json_t *config;
    int rc = config_parse(r->config_hash, r->config_json, &config, err);
    if (rc)
        return rc;
    rc = db_tx_begin(db, err);
    if (rc == 0)
        rc = db_tx_end(db, restore_run(db, r, config, err), err);
    json_decref(config);
    return rc;
}

/* Runs a one-row UPDATE keyed by run_id; "no run named" when nothing matched. */
static int update_run(hearth_db *db, const char *sql, const char *run_id, const char *a,
                      const char *b, hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, sql, run_id, &st, err);
    if (rc)
        return rc;
    bind_opt_text(st, 2, a);
    bind_opt_text(st, 3, b);
    if ((rc = db_step_done(db, st, "updating a run", err)))
        return rc;
    if (sqlite3_changes(db_sqlite(db)) == 0)
        return herr_set(err, HERR_CONFIG, "no run named '%s'", run_id);
    return 0;
}

int runs_db_set_run_dir(hearth_db *db, const char *run_id, const char *run_dir,
                        hearth_err *err)
{
    static const char sql[] =
        "UPDATE runs SET run_dir = ?2, updated_at = " NOW " WHERE run_id = ?1";
    return update_run(db, sql, run_id, run_dir, NULL, err);
}

int runs_db_set_job(hearth_db *db, const char *run_id, const char *backend,
                    const char *job_id, hearth_err *err)
{
    static const char sql[] =
        "UPDATE runs SET backend = coalesce(?2, backend), "
        "backend_job_id = coalesce(?3, backend_job_id), updated_at = " NOW
        " WHERE run_id = ?1";
    return update_run(db, sql, run_id, backend, job_id, err);
}

static int transition(hearth_db *db, const char *run_id, run_state to,
                      const run_transition *t, hearth_err *err)
{
    static const char get_sql[] = "SELECT id, state FROM runs WHERE run_id = ?1";
    sqlite3_stmt *st;
    int rc = db_row_text(db, get_sql, run_id, &st, "reading a run", err);
    if (rc != 1)
        return rc ? rc : herr_set(err, HERR_CONFIG, "no run named '%s'", run_id);
    int64_t pk = sqlite3_column_int64(st, 0);
    run_state from;
    rc = run_state_parse((const char *)sqlite3_column_text(st, 1), &from, err);
    db_stmt_done(st);
    if (rc)
        return rc;
    if ((rc = run_state_check_transition(from, to, err)))
        return herr_prefix(err, rc, "run %s", run_id);

    /* ?2 is the new state; a new attempt replaces the job id and forgets the old exit
     * code (both stay in run_events). */
    static const char upd_sql[] =
        "UPDATE runs SET state = ?2, updated_at = " NOW ", "
        "attempts = attempts + (?2 = 'submitted'), "
        "submitted_at = CASE WHEN ?2 = 'submitted' THEN " NOW " ELSE submitted_at END, "
        "started_at = CASE WHEN ?2 = 'running' THEN " NOW " ELSE started_at END, "
        "ended_at = CASE WHEN ?2 IN ('completed', 'failed', 'cancelled', 'timeout') "
        "  THEN " NOW " ELSE ended_at END, "
        "backend = coalesce(?3, backend), "
        "backend_job_id = CASE WHEN ?2 = 'submitted' THEN ?4 "
        "  ELSE coalesce(?4, backend_job_id) END, "
        "exit_code = CASE WHEN ?5 IS NOT NULL THEN ?5 WHEN ?2 = 'submitted' THEN NULL "
        "  ELSE exit_code END "
        "WHERE id = ?1 "
        "RETURNING attempts, backend, backend_job_id";
    if ((rc = db_prepare_int64(db, upd_sql, pk, &st, err)))
        return rc;
    sqlite3_bind_text(st, 2, run_state_name(to), -1, SQLITE_STATIC);
    bind_opt_text(st, 3, t ? t->backend : NULL);
    bind_opt_text(st, 4, t ? t->job_id : NULL);
    if (t && t->has_exit_code)
        sqlite3_bind_int(st, 5, t->exit_code);
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = db_fail(db, err, "updating a run's state");
        db_stmt_done(st);
        return rc;
    }
    int attempt = sqlite3_column_int(st, 0);
    char *backend = col_dup(st, 1), *job = col_dup(st, 2);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, err, "updating a run's state");
    db_stmt_done(st);

    static const char ev_sql[] =
        "INSERT INTO run_events (run, from_state, to_state, attempt, backend, backend_job_id, "
        "exit_code, note) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
    if (rc == 0 && (rc = db_prepare(db, ev_sql, &st, err)) == 0) {
        sqlite3_bind_int64(st, 1, pk);
        sqlite3_bind_text(st, 2, run_state_name(from), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, run_state_name(to), -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, attempt);
        bind_opt_text(st, 5, backend);
        bind_opt_text(st, 6, job);
        if (t && t->has_exit_code)
            sqlite3_bind_int(st, 7, t->exit_code);
        bind_opt_text(st, 8, t ? t->note : NULL);
        rc = db_step_done(db, st, "recording a run event", err);
    }
    free(backend);
    free(job);
    return rc;
}

int runs_db_transition(hearth_db *db, const char *run_id, run_state to,
                       const run_transition *t, hearth_err *err)
{
    if ((unsigned)to >= RUN_STATE_COUNT)
        return herr_set(err, HERR_RUNTIME, "run %s: bad target state %d", run_id, (int)to);
    int rc = db_tx_begin(db, err);
    if (rc)
        return rc;
    return db_tx_end(db, transition(db, run_id, to, t, err), err);
}

int runs_db_count_events(hearth_db *db, const char *run_id, run_state to, const char *note,
                         long *n, hearth_err *err)
{
    static const char sql[] =
        "SELECT COUNT(*) FROM run_events v JOIN runs r ON r.id = v.run "
        "WHERE r.run_id = ?1 AND v.to_state = ?2 AND v.note = ?3";
    sqlite3_stmt *st;
    *n = 0;
    int rc = db_prepare(db, sql, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, run_state_name(to), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, note, -1, SQLITE_TRANSIENT);
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        *n = sqlite3_column_int64(st, 0);
    db_stmt_done(st);
    return step == SQLITE_ROW ? 0 : db_fail(db, err, "counting a run's events");
}

void run_info_free(run_info *r)
{
    if (!r)
        return;
    free(r->run_id);
    free(r->experiment);
    free(r->config_hash);
    free(r->config_json);
    free(r->run_dir);
    free(r->backend);
    free(r->backend_job_id);
    free(r->created_at);
    free(r->submitted_at);
    free(r->started_at);
    free(r->ended_at);
    memset(r, 0, sizeof *r);
}

#define RUN_COLS                                                                           \
    "r.id, r.run_id, e.name, r.seq, r.state, r.attempts, r.config_hash, r.run_dir, "       \
    "r.backend, r.backend_job_id, r.exit_code, r.created_at, r.submitted_at, r.started_at, " \
    "r.ended_at"

/* Fills *r from a row of RUN_COLS (config_json, when selected, follows at column 15). */
static int read_run(sqlite3_stmt *st, run_info *r, int with_config, hearth_err *err)
{
    memset(r, 0, sizeof *r);
    r->pk = sqlite3_column_int64(st, 0);
    r->run_id = col_dup(st, 1);
    r->experiment = col_dup(st, 2);
    r->seq = sqlite3_column_int(st, 3);
    int rc = run_state_parse((const char *)sqlite3_column_text(st, 4), &r->state, err);
    r->attempts = sqlite3_column_int(st, 5);
    r->config_hash = col_dup(st, 6);
    r->run_dir = col_dup(st, 7);
    r->backend = col_dup(st, 8);
    r->backend_job_id = col_dup(st, 9);
    r->has_exit_code = sqlite3_column_type(st, 10) != SQLITE_NULL;
    r->exit_code = sqlite3_column_int(st, 10);
    r->created_at = col_dup(st, 11);
    r->submitted_at = col_dup(st, 12);
    r->started_at = col_dup(st, 13);
    r->ended_at = col_dup(st, 14);
    if (with_config)
        r->config_json = col_dup(st, 15);
    if (!rc && (!r->run_id || !r->experiment || !r->config_hash ||
                (with_config && !r->config_json)))
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    if (rc)
        run_info_free(r);
    return rc;
}

int runs_db_get(hearth_db *db, const char *run_id, run_info *out, hearth_err *err)
{
    static const char sql[] =
        "SELECT " RUN_COLS ", r.config_json FROM runs r "
        "JOIN experiments e ON e.id = r.experiment_id WHERE r.run_id = ?1";
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    int rc = db_row_text(db, sql, run_id, &st, "reading a run", err);
    if (rc == 1) {
        int r2 = read_run(st, out, 1, err);
        db_stmt_done(st);
        rc = r2 ? r2 : 1;
    }
    return rc;
}

void runs_db_list_free(run_info *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        run_info_free(&v[i]);
    free(v);
}

int runs_db_list(hearth_db *db, const char *experiment, unsigned state_mask, run_info **out,
                 size_t *n, hearth_err *err)
{
    static const char sql[] =
        "SELECT " RUN_COLS " FROM experiments e JOIN runs r ON r.experiment_id = e.id "
        "WHERE e.name = ?1 ORDER BY r.seq";
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, sql, experiment, &st, err);
    if (rc)
        return rc;
    run_info *v = NULL;
    size_t len = 0, cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        run_state s;
        if (run_state_parse((const char *)sqlite3_column_text(st, 4), &s, err)) {
            rc = HERR_RUNTIME;
            break;
        }
        if (state_mask && !(state_mask & (1u << s)))
            continue;
        if (len == cap) {
            cap = cap ? 2 * cap : 16;
            run_info *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = herr_set(err, HERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        if ((rc = read_run(st, &v[len], 0, err)))
            break;
        len++;
    }
    rc = db_rows_end(db, rc, "listing runs", err);
    db_stmt_done(st);
    if (rc) {
        runs_db_list_free(v, len);
        return rc;
    }
    *out = v;
    *n = len;
    return 0;
}

int runs_db_state_counts(hearth_db *db, const char *experiment,
                         long counts[RUN_STATE_COUNT], hearth_err *err)
{
    static const char sql_exp[] =
        "SELECT r.state, count(*) FROM experiments e JOIN runs r ON r.experiment_id = e.id "
        "WHERE e.name = ?1 GROUP BY r.state";
    static const char sql_all[] = "SELECT state, count(*) FROM runs GROUP BY state";
    for (int i = 0; i < RUN_STATE_COUNT; i++)
        counts[i] = 0;
    sqlite3_stmt *st;
    int rc = db_prepare(db, experiment ? sql_exp : sql_all, &st, err);
    if (rc)
        return rc;
    if (experiment)
        sqlite3_bind_text(st, 1, experiment, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        run_state s;
        if (run_state_parse((const char *)sqlite3_column_text(st, 0), &s, err)) {
            rc = HERR_RUNTIME;
            break;
        }
        counts[s] = sqlite3_column_int64(st, 1);
    }
    rc = db_rows_end(db, rc, "counting runs", err);
    db_stmt_done(st);
    return rc;
}

/* One hash: counts from the (config_hash, state) index. */
static int count_one(hearth_db *db, sqlite3_stmt *st, int64_t exp, const char *hash,
                     long *completed, long *active, hearth_err *err)
{
    sqlite3_bind_text(st, 1, hash, -1, SQLITE_STATIC);
    if (exp >= 0)
        sqlite3_bind_int64(st, 2, exp);
    long c = 0, a = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *s = (const char *)sqlite3_column_text(st, 0);
        long k = sqlite3_column_int64(st, 1);
        if (strcmp(s, "completed") == 0)
            c += k;
        else if (strcmp(s, "pending") == 0 || strcmp(s, "submitted") == 0 ||
                 strcmp(s, "running") == 0 || strcmp(s, "requeued") == 0)
            a += k;
    }
    rc = rc == SQLITE_DONE ? 0 : db_fail(db, err, "counting runs by hash");
    sqlite3_reset(st);
    if (completed)
        *completed = c;
    if (active)
        *active = a;
    return rc;
}

int runs_db_count_by_hashes(hearth_db *db, const char *experiment, const char *const *hashes,
                            size_t n, long *completed, long *active, hearth_err *err)
{
    static const char sql_all[] =
        "SELECT state, count(*) FROM runs WHERE config_hash = ?1 GROUP BY state";
    static const char sql_exp[] =
        "SELECT state, count(*) FROM runs WHERE config_hash = ?1 AND experiment_id = ?2 "
        "GROUP BY state";
    int64_t exp = -1;
    int rc;
    if (experiment) {
        rc = runs_db_experiment_find(db, experiment, &exp, err);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            for (size_t i = 0; i < n; i++) {
                if (completed)
                    completed[i] = 0;
                if (active)
                    active[i] = 0;
            }
            return 0;
        }
    }
    sqlite3_stmt *st;
    if ((rc = db_prepare(db, experiment ? sql_exp : sql_all, &st, err)))
        return rc;
    /* One read snapshot for the whole batch (and no per-statement lock round trips). */
    sqlite3 *s = db_sqlite(db);
    int own = sqlite3_get_autocommit(s);
    if (own && sqlite3_exec(s, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(db, err, "starting a read");
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = count_one(db, st, exp, hashes[i], completed ? &completed[i] : NULL,
                       active ? &active[i] : NULL, err);
    db_stmt_done(st);
    if (own)
        sqlite3_exec(s, rc ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL);
    return rc;
}

int runs_db_count_by_hash(hearth_db *db, const char *experiment, const char *hash,
                          long *completed, long *active, hearth_err *err)
{
    return runs_db_count_by_hashes(db, experiment, &hash, 1, completed, active, err);
}
