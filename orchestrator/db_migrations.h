/* db_migrations.h - the schema migrations embedded in the binary.
 *
 * db/migrations/NNNN_name.sql is the source; db/gen_migrations.sh turns the files into
 * orchestrator/db_migrations.c (generated, checked in, and compared with the files by
 * test_orch_db).  Migration N brings the schema from user_version N-1 to N. */
#ifndef HEARTH_DB_MIGRATIONS_H
#define HEARTH_DB_MIGRATIONS_H

typedef struct {
    int version;           /* NNNN from the file name: 1, 2, ... without gaps */
    const char *name;      /* the part after NNNN_, without .sql */
    const char *file;      /* the file name, for messages */
    const char *sql;       /* the file's text */
} db_migration;

/* In version order. */
extern const db_migration db_migrations[];
extern const int db_migrations_count;

#endif
