/* turnwatch console: the pure part of a request, tested without a server (tests/test_console_query.c): which
 * route a path names, and the query string of the list endpoints, each value validated as the CLI validates
 * its options (names as common/names.c, turn ids as UUIDs, statuses, limits, timestamps). */
#ifndef TW_CONSOLE_QUERY_H
#define TW_CONSOLE_QUERY_H

#include <stdbool.h>
#include <stddef.h>

typedef enum ConsoleRoute {
    CONSOLE_NOT_FOUND,
    CONSOLE_ASSET,        /* a file of the page: "/" (index.html), /app.js, ... */
    CONSOLE_TURNS,        /* /api/turns */
    CONSOLE_TURN,         /* /api/turns/ID */
    CONSOLE_TURN_HISTORY, /* /api/turns/ID/history */
    CONSOLE_TURN_TREE,    /* /api/turns/ID/tree */
    CONSOLE_DAEMONS,      /* /api/daemons */
    CONSOLE_DEAD_LETTERS, /* /api/dead-letters */
    CONSOLE_BAD_ID,       /* /api/turns/X... where X is not a UUID: 400 */
} ConsoleRoute;

/* The route of a decoded path (no query string). For the turn routes the id goes to id (37 bytes). */
ConsoleRoute console_route(const char *path, char id[37]);

/* The list of turns: each member "" when it was not given. */
typedef struct ConsoleTurnsQuery {
    char agent[65];
    char profile[65];
    char status[16];
    char since[64];
    char before[64];
    char cursor[21]; /* a seq: 1 to 19 digits */
    char limit[4];   /* 1 to 500; "50" when not given */
} ConsoleTurnsQuery;

typedef struct ConsoleDeadLettersQuery {
    char agent[65];
    char limit[4]; /* 1 to 500; "100" when not given */
} ConsoleDeadLettersQuery;

/* Parse the raw query string of /api/turns (NULL or "" for none). False with the reason in why when a key is
 * unknown or given twice, or a value is invalid; an empty value counts as not given. */
bool console_turns_query_parse(const char *query, ConsoleTurnsQuery *q, char *why, size_t why_size);
bool console_dead_letters_query_parse(const char *query, ConsoleDeadLettersQuery *q, char *why,
                                      size_t why_size);

/* An RFC 3339 timestamp as the page sends it: YYYY-MM-DD, then optionally THH:MM[:SS[.fraction]] and Z or
 * +HH:MM / -HH:MM (a space may stand for the T). The calendar itself is PostgreSQL's to check. */
bool console_timestamp_valid(const char *s);

#endif
