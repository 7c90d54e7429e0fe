/* Schema migrations: the numbered files of sql/, embedded at build time, applied once each. */
#ifndef TW_MIGRATE_H
#define TW_MIGRATE_H

#include <libpq-fe.h>

typedef struct TwMigration {
    int version;
    const char *name;
    const char *sql;
} TwMigration;

extern const TwMigration tw_migrations[];
extern const int tw_migrations_count;

/** Apply every migration not yet recorded, each in its own transaction under an advisory lock (two
 *  concurrent runs are safe). *applied gets how many ran. Returns 0, or -1 with err filled. */
int tw_migrate(PGconn *conn, int *applied, char *err, size_t errsize) __attribute__((warn_unused_result));
/** The highest version recorded in the database, 0 when none, -1 on error. */
int tw_schema_version(PGconn *conn);

#endif
