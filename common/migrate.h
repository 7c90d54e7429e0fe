/* Migrations: the SQL of sql/, embedded at build time (sql/embed.c). A schema migration
 * (sql/schema/NNNN_*.sql) is applied once, in number order, and recorded in state.schema_migrations. The code
 * — the functions (sql/fn) and the watchdog rules (sql/rules) — is one set: whenever its text differs from
 * the set recorded in state.code_version, schema tw is made anew from it in one transaction, so that
 * upgrading the binaries and running `turnwatch migrate` brings every function up to date and leaves none
 * that the code no longer has. The grants (sql/grants: the roles of docs/security.md and what each may do)
 * are applied by every migrate, last, in the transaction of the code set. */
#ifndef TW_MIGRATE_H
#define TW_MIGRATE_H

#include <libpq-fe.h>

enum { TW_MIGRATION_SCHEMA = 0, TW_MIGRATION_CODE = 1, TW_MIGRATION_GRANTS = 2 };

typedef struct TwMigration {
    int version;      /* a schema migration's number; 0 for code */
    const char *name; /* "schema/0001_schema.sql", "fn/apply.sql", "rules/2.1_reclaim_inbox.sql" */
    int code;         /* TW_MIGRATION_SCHEMA, _CODE (the code set: fn/, rules/) or _GRANTS (grants/) */
    const char *sql;
} TwMigration;

extern const TwMigration tw_migrations[];
extern const int tw_migrations_count;

/** Apply every schema migration not yet recorded, each in its own transaction, then the code set if it
 *  changed and the grants, in one transaction; all under an advisory lock, so two concurrent runs are safe.
 * *applied gets how many ran (the code set counts as one, the grants not at all). Returns 0, or -1 with err
 * filled. */
int tw_migrate(PGconn *conn, int *applied, char *err, size_t errsize) __attribute__((warn_unused_result));
/** The highest schema migration recorded in the database, 0 when none, -1 on error. */
int tw_schema_version(PGconn *conn);
/** The highest schema migration this build has. */
int tw_schema_version_built(void);

#endif
