/* Schema migrations: the numbered files of sql/, embedded at build time. A schema migration is applied once;
 * a repeatable one (its first line says "-- migrate: repeatable", like the state-machine functions, which are
 * all CREATE OR REPLACE) again whenever its text differs from the one recorded, so that upgrading the
 * binaries and running `turnwatch migrate` brings the functions up to date. */
#ifndef TW_MIGRATE_H
#define TW_MIGRATE_H

#include <libpq-fe.h>

typedef struct TwMigration {
    int version;
    const char *name;
    int repeatable;
    const char *sql;
} TwMigration;

extern const TwMigration tw_migrations[];
extern const int tw_migrations_count;

/** Apply every migration not yet recorded (and every repeatable one whose text changed), each in its own
 *  transaction under an advisory lock (two concurrent runs are safe). *applied gets how many ran. Returns 0,
 * or -1 with err filled. */
int tw_migrate(PGconn *conn, int *applied, char *err, size_t errsize) __attribute__((warn_unused_result));
/** The highest version recorded in the database, 0 when none, -1 on error. */
int tw_schema_version(PGconn *conn);

#endif
