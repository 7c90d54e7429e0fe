/* The turnwatch CLI's shared context: configuration, a lazily opened blocking libpq connection, one-line
 * errors with the documented exit codes, JSON output through jansson, and the command table's types. */
#ifndef TW_CLI_H
#define TW_CLI_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>

#include "config.h"

/* Exit status (README "Using it"): 0 ok, 1 runtime failure, 2 usage or validation error. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_RUNTIME = 1, CLI_EXIT_USAGE = 2 };

typedef struct CliCommand CliCommand;

typedef struct Cli {
    const char *config_path;
    bool json;
    bool verbose;
    TwConfig cfg;
    PGconn *conn; /* opened by the first cli_db() */
    /* The command's statements may run twice with the same outcome (reads, a submit with an idempotency key,
     * cancel, agent add): after a connection lost in the middle of one (a failover), it is run again once on
     * a new connection. Set by the handler before its first statement; default false. */
    bool idempotent;
    const CliCommand *cmd; /* the command being run */
    char cmd_name[64];     /* its words, "turn show", to start its messages */
} Cli;

/* A command handler gets the arguments after its name (and subcommand): argv[0] is the last command word,
 * so getopt_long starts at optind = 1 as for a program. Returns the exit status. */
typedef int (*CliHandler)(Cli *cli, int argc, char **argv);

/* The least PostgreSQL role a command needs (docs/security.md; sql/grants/roles.sql grants them). */
typedef enum {
    CLI_ROLE_NONE,     /* no database (events) */
    CLI_ROLE_OBSERVER, /* turnwatch_observer, or turnwatch_client, which may read as much */
    CLI_ROLE_CLIENT,   /* turnwatch_client */
    CLI_ROLE_OWNER,    /* the owner of schemas state and tw (migrate) */
} CliRole;

/* One entry of the command table (commands.c): `turnwatch --help`, `turnwatch help NAME` and turnwatch(1)
 * are printed from it. */
struct CliCommand {
    const char *name;
    const char *sub; /* NULL: the command has no subcommand */
    CliHandler run;
    const char *summary;     /* a phrase, for the overview */
    const char *synopsis;    /* its arguments after "turnwatch NAME [SUB] " ("" for none) */
    const char *description; /* lines of at most 100 columns, a blank line between paragraphs */
    const char *options;     /* its options as help prints them, one per line ("" for none) */
    CliRole role;
};

/* The command table and what is printed from it (commands.c). */
const CliCommand *cli_commands(size_t *n);
void cli_print_help(FILE *f);
void cli_print_command_help(FILE *f, const CliCommand *c);
/** turnwatch(1) in scdoc's syntax, from the table. Malloc'd; NULL when out of memory. */
char *cli_doc_man(void);

/* "turnwatch_client", "turnwatch_observer (or turnwatch_client)", ...: the role in words, for help and
 * errors. */
const char *cli_role_text(CliRole role);

/* Command handlers, one per table entry; each family lives in its own file. */
int cli_migrate(Cli *cli, int argc, char **argv);
int cli_submit(Cli *cli, int argc, char **argv);
int cli_turn_show(Cli *cli, int argc, char **argv);
int cli_turn_history(Cli *cli, int argc, char **argv);
int cli_dead_letters_list(Cli *cli, int argc, char **argv);
int cli_dead_letters_replay(Cli *cli, int argc, char **argv);
int cli_turns_list(Cli *cli, int argc, char **argv);
int cli_tool_result(Cli *cli, int argc, char **argv);
int cli_cancel(Cli *cli, int argc, char **argv);
int cli_events(Cli *cli, int argc, char **argv);
int cli_daemons(Cli *cli, int argc, char **argv);
int cli_limits_set(Cli *cli, int argc, char **argv);
int cli_limits_remove(Cli *cli, int argc, char **argv);
int cli_limits_list(Cli *cli, int argc, char **argv);
int cli_tools_list(Cli *cli, int argc, char **argv);
int cli_limits_show(Cli *cli, int argc, char **argv);
int cli_schedules_add(Cli *cli, int argc, char **argv);
int cli_schedules_remove(Cli *cli, int argc, char **argv);
int cli_schedules_list(Cli *cli, int argc, char **argv);
int cli_schedules_show(Cli *cli, int argc, char **argv);
int cli_agent_add(Cli *cli, int argc, char **argv);
int cli_agent_retire(Cli *cli, int argc, char **argv);
int cli_agent_show(Cli *cli, int argc, char **argv);
int cli_agents_list(Cli *cli, int argc, char **argv);
int cli_profiles(Cli *cli, int argc, char **argv);
int cli_turn_tree(Cli *cli, int argc, char **argv);
int cli_console(Cli *cli, int argc, char **argv);
int cli_timeouts_suggest(Cli *cli, int argc, char **argv);

/* s (or NULL) as the text output shows a value from the database or from outside: its control characters
 * escaped (tw_text_escape: an agent's fail message, a tool's error or a program's stderr must not reach the
 * terminal as sequences or make a line read as another). The copy lives until 64 more calls (a ring), enough
 * for every value of one printf; --json output needs none of this (JSON escapes them). */
const char *cli_text(const char *s);
/* Prints "turnwatch: <message>" as one line on stderr, its control characters escaped; returns code. */
int cli_die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* After getopt_long (run with a leading ':' in its optstring and opterr = 0) returned '?' or ':': one line
 * naming the option that was wrong, exit 2. */
int cli_bad_option(Cli *cli, int c, char **argv);
/* A whole decimal number in [min, max]. */
bool cli_parse_long(const char *s, long min, long max, long *out);

/* Loads cli->config_path; on failure prints the first problem and returns 2. */
int cli_config_load(Cli *cli) __attribute__((warn_unused_result));
/* --check-config: every problem on stderr and 1, or one line saying the file is valid and 0. */
int cli_check_config(Cli *cli);

/* The database connection, opened on first use; NULL with the exit status in *code when it cannot be. */
PGconn *cli_db(Cli *cli, int *code);
/* A parameterised statement (connecting first if need be); NULL with the error printed and the exit status
 * in *code (2 when the database refused the input: SQLSTATE class 22 or 23). A statement refused because the
 * node is read-only (25006: a standby, a demoted primary) changed nothing and is run again once on a new
 * connection, which looks for the primary through the DSN's hosts; so is a statement of an idempotent command
 * (cli->idempotent) whose connection was lost in the middle. Otherwise a lost connection is said in words:
 * whether the statement took effect is unknown. Reconnecting waits for a primary up to query_timeout_seconds.
 * A statement refused for want of a privilege (42501) says which role the command needs, exit 1.
 */
PGresult *cli_query(Cli *cli, const char *sql, int n, const char *const *params, int *code)
    __attribute__((warn_unused_result));
/* "permission denied: `turnwatch CMD` needs the role R (GRANT R TO user;) (PostgreSQL said: why)" on stderr,
 * as a statement of the command got SQLSTATE 42501; returns 1. */
int cli_permission_denied(Cli *cli, const char *why);
/* cli_query for a statement that returns one json/jsonb value; parsed with jansson. */
json_t *cli_query_json(Cli *cli, const char *sql, int n, const char *const *params, int *code)
    __attribute__((warn_unused_result));

/* The document a `turnwatch CMD ID` command reads: checks that argv is exactly CMD and a turn id (a UUID),
 * runs sql (one parameter, the id; one json/jsonb value back) and returns the parsed value. NULL with *code
 * set when the arguments are wrong (usage), there is no such turn (a SQL NULL or an empty array: "CMD: no
 * turn ID", usage) or the query failed. */
json_t *cli_turn_doc(Cli *cli, int argc, char **argv, const char *cmd, const char *sql, int *code)
    __attribute__((warn_unused_result));

/* `turnwatch NOUN WHAT NAME` (limits, schedules): that argv[at] is the last argument and a valid name of a
 * KIND
 * ("limit"); else a usage error on stderr. Returns CLI_EXIT_OK or the exit status. */
int cli_need_name(const char *noun, const char *kind, const char *what, int argc, char **argv, int at);

/* `turnwatch NOUN show NAME`: checks the name, runs sql (one parameter, the name; one json/jsonb value back,
 * SQL NULL when there is no such KIND) and returns the parsed document. NULL with *code set when the
 * arguments are wrong or there is none (usage) or the query failed. */
json_t *cli_named_doc(Cli *cli, int argc, char **argv, const char *noun, const char *kind, const char *sql,
                      int *code) __attribute__((warn_unused_result));

/* `turnwatch NOUN remove NAME`: checks the name, runs sql (one parameter, the name; a boolean back: whether
 * there was one) and says so, as {"name","removed"} with --json; no such KIND is a usage error. Returns the
 * exit status. */
int cli_named_remove(Cli *cli, int argc, char **argv, const char *noun, const char *kind, const char *sql);

/* `turnwatch NOUN list`: sql returns a JSON array, printed as one line of JSON with --json, else as a table:
 * row(NULL) for its header, then row(element) for each. Returns the exit status. */
int cli_list_rows(Cli *cli, int argc, const char *noun, const char *sql, void (*row)(json_t *));

/* Prints doc as one line of compact JSON on stdout and flushes; takes the reference. Returns 0, or 1 when
 * it could not be encoded or written. */
int cli_print_json(json_t *doc);

/* Publishes what a state-change function returned ({"subject","data","event_id"} items), confirms with a
 * flush (with [nats] events_stream: the stream's acknowledgment of each event) and marks the events
 * published. When NATS is not reachable the outbox relay of a running turnwatch-pmo publishes them, so this
 * never fails the command. */
void cli_publish(Cli *cli, json_t *items);

#endif
