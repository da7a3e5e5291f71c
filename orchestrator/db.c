/* db.c - opening, migrating and transacting on the results database.  See db.h. */
#include "db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "db_migrations.h"

/* A writer waiting for another process's write transaction gives up after this long. */
#define DB_BUSY_TIMEOUT_MS 15000
#define DB_WAL_RETRY_MS 10
/* Page cache per connection, in KiB (negative = KiB for SQLite). */
#define DB_CACHE_KIB 262144

typedef struct {
    const char *sql;
    sqlite3_stmt *st;
} stmt_slot;

typedef struct {
    char *key;
    int64_t id;
    int types;
} key_slot;

/* The files that make up the database: the file itself and, in WAL mode, its -wal (the
 * commits not yet copied into the file) and -shm (the index of the -wal).  Deleting any
 * of them under an open connection loses data: see db.h. */
static const char *const db_file_suffixes[] = { "", "-wal", "-shm" };
#define DB_N_FILES (sizeof db_file_suffixes / sizeof db_file_suffixes[0])

typedef struct {
    int known;               /* dev/ino were seen (a -wal appears with the first write) */
    dev_t dev;
    ino_t ino;
} file_id;

struct hearth_db {
    sqlite3 *s;
    char *path;
    stmt_slot *stmts;
    size_t n_stmts, cap_stmts;
    key_slot *keys;          /* open addressing, cap a power of two */
    size_t n_keys, cap_keys;
    int depth;               /* db_tx_begin nesting */
    int outer_began;         /* the outermost level started the transaction */
    int doomed;              /* an inner level failed: the outermost must roll back */
    int checked;             /* the main file's identity is known: db_check_file works */
    int lost;                /* db_check_file found the file deleted or replaced */
    file_id files[DB_N_FILES];   /* per db_file_suffixes */
};

int db_fail(hearth_db *db, hearth_err *err, const char *what)
{
    if (db->lost)   /* the commit hook refused: that, not "constraint failed", is why */
        return db_check_file(db, err);
    int code = sqlite3_errcode(db->s);
    return herr_set(err, code == SQLITE_NOMEM ? HERR_NOMEM : HERR_RUNTIME, "%s: %s: %s",
                    db->path, what, sqlite3_errmsg(db->s));
}

int db_exec(hearth_db *db, const char *sql, hearth_err *err)
{
    if (sqlite3_exec(db->s, sql, NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(db, err, "executing SQL");
    return 0;
}

/* Runs a pragma (constant text) that returns one row and copies its first column. */
static int pragma_text(hearth_db *db, const char *sql, char *out, size_t n, hearth_err *err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db->s, sql, -1, &st, NULL) != SQLITE_OK)
        return db_fail(db, err, sql);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        db_fail(db, err, sql);
        sqlite3_finalize(st);
        return HERR_RUNTIME;
    }
    const unsigned char *t = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    snprintf(out, n, "%s", t ? (const char *)t : "");
    sqlite3_finalize(st);
    return 0;
}

int db_schema_latest(void)
{
    return db_migrations_count > 0 ? db_migrations[db_migrations_count - 1].version : 0;
}

int db_schema_version(hearth_db *db, int *out, hearth_err *err)
{
    char buf[32];
    int rc = pragma_text(db, "PRAGMA user_version", buf, sizeof buf, err);
    if (rc)
        return rc;
    *out = atoi(buf);
    return 0;
}

/* Applies migration m unless another process got there first: the version is re-read
 * inside the write transaction, so two hearth processes opening a fresh file at once
 * cannot both run it. */
static int migrate_one(hearth_db *db, const db_migration *m, hearth_err *err)
{
    if (sqlite3_exec(db->s, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(db, err, "starting a migration");
    int cur = 0;
    int rc = db_schema_version(db, &cur, err);
    if (rc == 0 && cur < m->version) {
        if (cur != m->version - 1) {
            rc = herr_set(err, HERR_RUNTIME, "%s: schema version %d cannot take migration %s",
                          db->path, cur, m->file);
        } else if (sqlite3_exec(db->s, m->sql, NULL, NULL, NULL) != SQLITE_OK) {
            rc = herr_set(err, HERR_RUNTIME, "%s: migration %s: %s", db->path, m->file,
                          sqlite3_errmsg(db->s));
        } else {
            char sql[64];
            snprintf(sql, sizeof sql, "PRAGMA user_version = %d", m->version);
            rc = db_exec(db, sql, err);
        }
    }
    if (rc == 0 && sqlite3_exec(db->s, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        rc = db_fail(db, err, "committing a migration");
    if (rc)
        sqlite3_exec(db->s, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static int migrate(hearth_db *db, hearth_err *err)
{
    for (int i = 0; i < db_migrations_count; i++)
        if (db_migrations[i].version != i + 1)
            return herr_set(err, HERR_RUNTIME, "embedded migration %s is number %d, expected %d",
                            db_migrations[i].file, db_migrations[i].version, i + 1);
    int cur = 0, rc = db_schema_version(db, &cur, err);
    if (rc)
        return rc;
    if (cur > db_schema_latest())
        return herr_set(err, HERR_RUNTIME,
                        "%s: schema version %d is newer than this hearth knows (%d); "
                        "use a newer hearth", db->path, cur, db_schema_latest());
    for (int i = cur; i < db_migrations_count; i++)
        if ((rc = migrate_one(db, &db_migrations[i], err)))
            return rc;
    return 0;
}

/* PRAGMA journal_mode = WAL, retried while another connection holds the file: switching
 * a fresh file to WAL returns SQLITE_BUSY without consulting the busy handler (SQLite
 * does not wait there, to avoid deadlocks), which two hearth processes opening a new
 * database at once would otherwise see as an error.  Waits up to the busy timeout. */
static int set_wal(hearth_db *db, char *out, size_t n, hearth_err *err)
{
    for (int waited = 0;; waited += DB_WAL_RETRY_MS) {
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(db->s, "PRAGMA journal_mode = WAL", -1, &st, NULL) !=
            SQLITE_OK)
            return db_fail(db, err, "PRAGMA journal_mode = WAL");
        int rc = sqlite3_step(st);
        const unsigned char *t = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
        snprintf(out, n, "%s", t ? (const char *)t : "");
        int busy = (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED;
        if (rc != SQLITE_ROW && rc != SQLITE_DONE && !(busy && waited < DB_BUSY_TIMEOUT_MS)) {
            db_fail(db, err, "PRAGMA journal_mode = WAL");
            sqlite3_finalize(st);
            return HERR_RUNTIME;
        }
        sqlite3_finalize(st);
        if (!busy)
            return 0;
        sqlite3_sleep(DB_WAL_RETRY_MS);
    }
}

static int configure(hearth_db *db, hearth_err *err)
{
    char buf[32];
    int rc;
    sqlite3_extended_result_codes(db->s, 1);
    sqlite3_busy_timeout(db->s, DB_BUSY_TIMEOUT_MS);
    if ((rc = db_exec(db, "PRAGMA foreign_keys = ON", err)))
        return rc;
    if ((rc = pragma_text(db, "PRAGMA foreign_keys", buf, sizeof buf, err)))
        return rc;
    if (strcmp(buf, "1") != 0)
        return herr_set(err, HERR_RUNTIME, "%s: SQLite refused to enable foreign keys", db->path);
    /* Reading the header first turns "not a database" into a clear error here. */
    if ((rc = set_wal(db, buf, sizeof buf, err)))
        return rc;
    if (strcmp(buf, "wal") != 0 && strcmp(buf, "memory") != 0)
        return herr_set(err, HERR_RUNTIME, "%s: cannot use WAL mode (journal mode is '%s')",
                        db->path, buf);
    /* In WAL mode NORMAL keeps every commit atomic; only the last commits may be lost on a
     * power cut, never half of one. */
    if ((rc = db_exec(db, "PRAGMA synchronous = NORMAL", err)))
        return rc;
    /* Sorts and the rollback copies of big transactions stay in memory; reads of a large
     * database go through a memory map instead of a read() per page. */
    if ((rc = db_exec(db, "PRAGMA temp_store = MEMORY", err)) ||
        (rc = db_exec(db, "PRAGMA mmap_size = 1073741824", err)))
        return rc;
    snprintf(buf, sizeof buf, "PRAGMA cache_size = -%d", DB_CACHE_KIB);
    return db_exec(db, buf, err);
}

/* stat() of the database's file number i (db_file_suffixes): 0, or -1 with errno. */
static int stat_file(const hearth_db *db, size_t i, struct stat *st)
{
    char p[4200];
    if ((size_t)snprintf(p, sizeof p, "%s%s", db->path, db_file_suffixes[i]) >= sizeof p)
        return -1;
    return stat(p, st);
}

/* Remembers the identity of the files that exist now.  A path whose file cannot be
 * stat'ed after opening (no such thing on disk) is not checked at all. */
static void remember_files(hearth_db *db)
{
    for (size_t i = 0; i < DB_N_FILES; i++) {
        struct stat st;
        if (!db->files[i].known && stat_file(db, i, &st) == 0) {
            db->files[i].known = 1;
            db->files[i].dev = st.st_dev;
            db->files[i].ino = st.st_ino;
        }
    }
    db->checked = db->files[0].known;
}

int db_file_lost(const hearth_db *db) { return db->lost; }

int db_check_file(hearth_db *db, hearth_err *err)
{
    if (db->checked && !db->lost) {
        for (size_t i = 0; i < DB_N_FILES && !db->lost; i++) {
            struct stat st;
            int gone = stat_file(db, i, &st) != 0;
            if (!db->files[i].known) {
                /* Not there at open: a -wal or -shm made since; from now on it is ours. */
                if (!gone) {
                    db->files[i].known = 1;
                    db->files[i].dev = st.st_dev;
                    db->files[i].ino = st.st_ino;
                }
                continue;
            }
            if (gone || st.st_dev != db->files[i].dev || st.st_ino != db->files[i].ino)
                db->lost = gone ? 1 : 2;
        }
    }
    if (!db->lost)
        return 0;
    return herr_set(err, HERR_IO, "%s: the results database was %s while hearth was using "
                    "it; nothing more can be recorded in it", db->path,
                    db->lost == 1 ? "deleted" : "replaced");
}

/* Every commit, explicit or of a single statement, asks here first: a commit into a file
 * that is no longer the database must not pass for one that was recorded.  Non-zero turns
 * the commit into a rollback; db_fail then reports why. */
static int on_commit(void *p)
{
    return db_check_file(p, NULL) != 0;
}

int db_open(const char *path, hearth_db **out, hearth_err *err)
{
    *out = NULL;
    if (!path || !*path)
        return herr_set(err, HERR_CONFIG, "no database path given");
    hearth_db *db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    int rc;
    if (sqlite3_open_v2(path, &db->s, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        rc = herr_set(err, HERR_IO, "%s: cannot open database: %s", path,
                      db->s ? sqlite3_errmsg(db->s) : "out of memory");
        db_close(db);
        return rc;
    }
    if ((rc = configure(db, err)) || (rc = migrate(db, err))) {
        db_close(db);
        return rc;
    }
    remember_files(db);
    sqlite3_commit_hook(db->s, on_commit, db);
    *out = db;
    return 0;
}

static void keycache_clear(hearth_db *db)
{
    for (size_t i = 0; i < db->cap_keys; i++)
        free(db->keys[i].key);
    free(db->keys);
    db->keys = NULL;
    db->n_keys = db->cap_keys = 0;
}

void db_close(hearth_db *db)
{
    if (!db)
        return;
    if (db->s) {
        if (db->depth > 0 || !sqlite3_get_autocommit(db->s))
            sqlite3_exec(db->s, "ROLLBACK", NULL, NULL, NULL);
        for (size_t i = 0; i < db->n_stmts; i++)
            sqlite3_finalize(db->stmts[i].st);
        if (db_check_file(db, NULL) == 0) {
            /* Keeps planner statistics fresh; the limit bounds the work on large tables,
             * and no waiting: while another process writes, a reader's exit must not
             * block. */
            sqlite3_busy_timeout(db->s, 0);
            sqlite3_exec(db->s, "PRAGMA analysis_limit = 1000; PRAGMA optimize", NULL, NULL,
                         NULL);
        } else {
            /* The last connection to close deletes the -wal and -shm files *by name*: with
             * our file gone, those names may already be a new database's (`hearth ingest`
             * rebuilding it), whose recent commits would go with them.  A persistent WAL
             * is left in place. */
            int persist = 1;
            sqlite3_file_control(db->s, "main", SQLITE_FCNTL_PERSIST_WAL, &persist);
        }
        sqlite3_close(db->s);
    }
    keycache_clear(db);
    free(db->stmts);
    free(db->path);
    free(db);
}

sqlite3 *db_sqlite(hearth_db *db) { return db->s; }
const char *db_path(const hearth_db *db) { return db->path; }
int db_tx_depth(const hearth_db *db) { return db->depth; }

int db_tx_begin(hearth_db *db, hearth_err *err)
{
    if (db->depth == 0) {
        /* A transaction the caller opened by hand is joined, not nested. */
        int outer = sqlite3_get_autocommit(db->s);
        int rc = outer ? db_check_file(db, err) : 0;
        if (rc)
            return rc;
        if (outer && sqlite3_exec(db->s, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
            return db_fail(db, err, "starting a transaction");
        db->outer_began = outer;
        db->doomed = 0;
    }
    db->depth++;
    return 0;
}

int db_tx_end(hearth_db *db, int rc, hearth_err *err)
{
    if (db->depth <= 0)
        return rc ? rc : herr_set(err, HERR_RUNTIME, "db_tx_end without db_tx_begin");
    db->depth--;
    if (rc)
        db->doomed = 1;
    if (db->depth > 0)
        return rc;
    int doomed = db->doomed;
    db->doomed = 0;
    if (!db->outer_began) {
        if (doomed)
            keycache_clear(db);   /* the caller's transaction may still roll back */
        return rc;
    }
    if (!doomed) {
        if (sqlite3_exec(db->s, "COMMIT", NULL, NULL, NULL) == SQLITE_OK)
            return 0;
        rc = db_fail(db, err, "committing");
    } else if (rc == 0) {
        rc = herr_set(err, HERR_RUNTIME,
                      "%s: an operation inside the transaction failed; nothing was recorded",
                      db->path);
    }
    /* Errors are ignored here: SQLite may already have rolled back by itself (e.g. on a
     * full disk), and the caller's error is the one worth reporting. */
    sqlite3_exec(db->s, "ROLLBACK", NULL, NULL, NULL);
    keycache_clear(db);
    return rc;
}

int db_prepare(hearth_db *db, const char *sql, sqlite3_stmt **out, hearth_err *err)
{
    for (size_t i = 0; i < db->n_stmts; i++)
        if (db->stmts[i].sql == sql || strcmp(db->stmts[i].sql, sql) == 0) {
            *out = db->stmts[i].st;
            return 0;
        }
    if (db->n_stmts == db->cap_stmts) {
        size_t cap = db->cap_stmts ? 2 * db->cap_stmts : 32;
        stmt_slot *s = realloc(db->stmts, cap * sizeof *s);
        if (!s)
            return herr_set(err, HERR_NOMEM, "out of memory");
        db->stmts = s;
        db->cap_stmts = cap;
    }
    sqlite3_stmt *st;
    if (sqlite3_prepare_v3(db->s, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK)
        return db_fail(db, err, "preparing a statement");
    db->stmts[db->n_stmts].sql = sql;
    db->stmts[db->n_stmts].st = st;
    db->n_stmts++;
    *out = st;
    return 0;
}

void db_stmt_done(sqlite3_stmt *st)
{
    if (st) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    }
}

int db_prepare_int64(hearth_db *db, const char *sql, int64_t v, sqlite3_stmt **out,
                     hearth_err *err)
{
    int rc = db_prepare(db, sql, out, err);
    if (rc == 0)
        sqlite3_bind_int64(*out, 1, v);
    return rc;
}

int db_prepare_text(hearth_db *db, const char *sql, const char *v, sqlite3_stmt **out,
                    hearth_err *err)
{
    int rc = db_prepare(db, sql, out, err);
    if (rc == 0)
        sqlite3_bind_text(*out, 1, v, -1, SQLITE_STATIC);
    return rc;
}

int db_row_text(hearth_db *db, const char *sql, const char *v, sqlite3_stmt **out,
                const char *what, hearth_err *err)
{
    int rc = db_prepare_text(db, sql, v, out, err);
    if (rc)
        return rc;
    rc = sqlite3_step(*out);
    if (rc == SQLITE_ROW)
        return 1;
    rc = rc == SQLITE_DONE ? 0 : db_fail(db, err, what);
    db_stmt_done(*out);
    return rc;
}

int db_step_done(hearth_db *db, sqlite3_stmt *st, const char *what, hearth_err *err)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, err, what);
    db_stmt_done(st);
    return rc;
}

int db_rows_end(hearth_db *db, int rc, const char *what, hearth_err *err)
{
    if (rc == SQLITE_DONE)
        return 0;
    if (rc < 0)
        return rc;
    if (rc == SQLITE_NOMEM)
        return herr_set(err, HERR_NOMEM, "out of memory");
    return db_fail(db, err, what);
}

/* FNV-1a: keys are short dotted names. */
static uint64_t key_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static key_slot *keycache_find(key_slot *slots, size_t cap, const char *key)
{
    size_t i = key_hash(key) & (cap - 1);
    while (slots[i].key && strcmp(slots[i].key, key) != 0)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

int db_keycache_get(hearth_db *db, const char *key, int64_t *id, int *types)
{
    if (!db->cap_keys)
        return 0;
    key_slot *s = keycache_find(db->keys, db->cap_keys, key);
    if (!s->key)
        return 0;
    *id = s->id;
    *types = s->types;
    return 1;
}

int db_keycache_put(hearth_db *db, const char *key, int64_t id, int types)
{
    if (2 * (db->n_keys + 1) > db->cap_keys) {
        size_t cap = db->cap_keys ? 2 * db->cap_keys : 256;
        key_slot *n = calloc(cap, sizeof *n);
        if (!n)
            return HERR_NOMEM;
        for (size_t i = 0; i < db->cap_keys; i++)
            if (db->keys[i].key)
                *keycache_find(n, cap, db->keys[i].key) = db->keys[i];
        free(db->keys);
        db->keys = n;
        db->cap_keys = cap;
    }
    key_slot *s = keycache_find(db->keys, db->cap_keys, key);
    if (!s->key) {
        if (!(s->key = strdup(key)))
            return HERR_NOMEM;
        db->n_keys++;
    }
    s->id = id;
    s->types = types;
    return 0;
}
