/* db.h - the results database connection (DESIGN.md, "Results database").
 *
 * One SQLite file in WAL mode with foreign keys on and a busy timeout, so that `hearth
 * status` writing and `hearth query` reading at the same time both work.  Opening applies
 * the embedded migrations (orchestrator/db_migrations.h) that the file lacks, each in its
 * own transaction together with its `PRAGMA user_version`; a file written by a newer hearth
 * (user_version beyond ours) is refused.
 *
 * Transactions nest by joining: db_tx_begin opens `BEGIN IMMEDIATE` at the outermost level
 * (so a writer waits for the lock up front instead of failing on upgrade) and only counts
 * inside it, so every write function is atomic on its own and can still be grouped by a
 * caller (a batch of run inserts; ingest + state transition of one run).  A failure at
 * any level dooms the whole transaction: the outermost db_tx_end rolls everything back
 * (and returns an error even when given 0), so nothing partial is ever committed.  (No
 * savepoints: they copy every touched page, which made bulk inserts several times
 * slower.)
 *
 * The file must stay the one that was opened.  A database deleted or replaced while open
 * (`rm hearth.db*` during a sweep) still takes writes, into an unlinked inode that nobody
 * will ever read: every result would vanish without an error.  So db_open remembers the
 * identity (st_dev, st_ino) of the file and of its -wal and -shm companions, and
 * db_check_file compares it with what the path names now; every commit checks it (a
 * commit hook: one turned into a rollback fails with the message below), and so does
 * the outermost db_tx_begin, so no write reports success into a lost file.  Once
 * lost, the connection stays lost (db_file_lost) and db_close leaves the files under
 * that path alone (see db_close).
 *
 * Errors: functions return 0 or a negative herr_code with the message in `err`; SQLite
 * failures are HERR_RUNTIME ("PATH: what: sqlite message"), a busy database included; a
 * lost database file is HERR_IO ("PATH: the results database was deleted ..."). */
#ifndef HEARTH_DB_H
#define HEARTH_DB_H

#include <sqlite3.h>
#include <stdint.h>

#include "shape/err.h"

typedef struct hearth_db hearth_db;

/* Opens (creating it when missing) the database at `path` and migrates it to the latest
 * schema.  *out is set on success; close it with db_close. */
int db_open(const char *path, hearth_db **out, hearth_err *err);
/* Closes the connection and frees `db` (NULL is fine).  An open transaction is rolled back.
 * When the file was lost (db_check_file), the connection's -wal and -shm files are kept
 * rather than deleted by name: that name may by now belong to a new database. */
void db_close(hearth_db *db);

/* 0 while `path` (and its -wal and -shm files, once they exist) is still the file this
 * connection opened; HERR_IO with "PATH: the results database was deleted|replaced while
 * hearth was using it" when it is not.  The loss is sticky: every later call fails too. */
int db_check_file(hearth_db *db, hearth_err *err);
/* 1 once db_check_file found the file lost. */
int db_file_lost(const hearth_db *db);

/* The schema version this binary writes (the highest embedded migration). */
int db_schema_latest(void);
/* The file's PRAGMA user_version. */
int db_schema_version(hearth_db *db, int *out, hearth_err *err);

sqlite3 *db_sqlite(hearth_db *db);
const char *db_path(const hearth_db *db);

/* Nested transactions (see above).  db_tx_end with rc != 0 marks the transaction failed;
 * at the outermost level it commits when nothing failed, else rolls back.  It returns rc,
 * or the commit's error, or (outermost, rc == 0, an inner level failed) HERR_RUNTIME. */
int db_tx_begin(hearth_db *db, hearth_err *err);
int db_tx_end(hearth_db *db, int rc, hearth_err *err);
int db_tx_depth(const hearth_db *db);

/* A prepared statement for a constant SQL text, cached on the connection (the cache owns
 * it).  Reset it with db_stmt_done after use, so it releases its read snapshot. */
int db_prepare(hearth_db *db, const char *sql, sqlite3_stmt **out, hearth_err *err);
void db_stmt_done(sqlite3_stmt *st);
/* db_prepare, then ?1 bound to `v`: most statements are keyed by one row id or name.  The
 * text is bound SQLITE_STATIC (it must stay valid until db_stmt_done); NULL binds NULL. */
int db_prepare_int64(hearth_db *db, const char *sql, int64_t v, sqlite3_stmt **out,
                     hearth_err *err);
int db_prepare_text(hearth_db *db, const char *sql, const char *v, sqlite3_stmt **out,
                    hearth_err *err);
/* db_prepare_text and the first step of a lookup: 1 when there is a row (read it from *out,
 * then db_stmt_done), 0 when there is none, or the error (db_fail(db, err, what)); on 0
 * and on errors the statement is done already. */
int db_row_text(hearth_db *db, const char *sql, const char *v, sqlite3_stmt **out,
                const char *what, hearth_err *err);
/* Steps a write statement that returns no rows, then db_stmt_done; a step that does not
 * end with SQLITE_DONE is reported through db_fail(db, err, what). */
int db_step_done(hearth_db *db, sqlite3_stmt *st, const char *what, hearth_err *err);
/* The result of a `while ((rc = sqlite3_step(st)) == SQLITE_ROW)` loop: rc is the last
 * step's code, SQLITE_NOMEM when the loop body ran out of memory, or a negative herr code
 * the body already set.  Returns 0 for SQLITE_DONE, rc when negative, HERR_NOMEM ("out of
 * memory") for SQLITE_NOMEM, else db_fail(db, err, what).  It does not reset `st`. */
int db_rows_end(hearth_db *db, int rc, const char *what, hearth_err *err);
/* Runs SQL text without results (several statements allowed). */
int db_exec(hearth_db *db, const char *sql, hearth_err *err);
/* Formats the connection's last SQLite error as "PATH: what: message"; returns
 * HERR_RUNTIME (HERR_NOMEM for SQLITE_NOMEM). */
int db_fail(hearth_db *db, hearth_err *err, const char *what);

/* The connection's cache of interned config key ids (table config_keys): key -> id and the
 * set of value types seen.  Rolled-back transactions clear it, since ids inserted in them
 * are gone.  db_keycache_get returns 1 when found. */
int db_keycache_get(hearth_db *db, const char *key, int64_t *id, int *types);
int db_keycache_put(hearth_db *db, const char *key, int64_t id, int types);

#endif
