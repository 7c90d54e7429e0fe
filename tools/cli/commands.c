/* The CLI's command table and everything printed from it: `turnwatch --help`, `turnwatch help COMMAND` (and
 * COMMAND --help), and the manual page turnwatch(1) in scdoc's syntax (tools/mangen.c prints it at build
 * time). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tw_build.h"

/* Adding a command: its handler in a file of its own (declared in cli.h) and one entry here, with the least
 * PostgreSQL role that may run it (a function of tw it calls goes into the lists of sql/grants/roles.sql). A
 * name either has a subcommand in every entry (turn show, turn history) or is a single entry; the entries of
 * one name stay next to each other so that help lists them together. A description is text lines of at most
 * 100 columns, a blank line between paragraphs; the options are lines as `--help` prints them. */
static const CliCommand commands[] = {
    {.name = "migrate",
     .run = cli_migrate,
     .summary = "create or upgrade the schema (idempotent)",
     .synopsis = "",
     .description =
         "Applies the schema migrations built into this turnwatch to the database of [postgres]\n"
         "dsn, each once, and makes its SQL functions, rules and grants current; running it again\n"
         "changes nothing. Run it before the daemons' first start and after every upgrade.\n",
     .options = "",
     .role = CLI_ROLE_OWNER},
    {.name = "submit",
     .run = cli_submit,
     .summary = "submit a turn; prints its id (the same id again for a repeated key)",
     .synopsis =
         "--agent A --channel C [--profile P] [--box B] [--input JSON | --input-file F] [--timeout "
         "SECONDS] [--idempotency-key K] [--limit-key K] [--priority 0..9] [--at TIME | --in DURATION]",
     .description =
         "Checks the names and the input document, then queues a turn for agent A (tw.submit_turn)\n"
         "and prints its id. A worker serving the agent's profile runs it.\n",
     .options =
         "  --agent A              an agent of the roster, or a profile's own agent ([agent.A] section)\n"
         "  --profile P            add agent A bound to profile P in the same transaction if it does "
         "not exist;\n"
         "                         an agent bound to another profile is an error\n"
         "  --channel C, --box B   the turn's channel and output box: 1 to 256 bytes, no control "
         "characters\n"
         "  --input JSON           the input document (default {}), at most 1 MiB\n"
         "  --input-file F         read the input document from F (- for stdin)\n"
         "  --timeout SECONDS      end the turn with status timeout after this long (1 to 31536000)\n"
         "  --idempotency-key K    a repeated K gives the first turn's id again (1 to 256 bytes)\n"
         "  --limit-key K          the key its tool calls (and child turns) count under in per-key limits "
         "and\n"
         "                         share fairly by (1 to 256 bytes; docs/flow-control.md)\n"
         "  --priority N           0 (the default) to 9: waiting for a limit, higher goes first\n"
         "  --at TIME              run it at TIME, ISO 8601 with its offset (2026-12-01T09:00:00Z); until "
         "then it\n"
         "                         waits pending (reason scheduled), and --timeout counts from then\n"
         "  --in DURATION          run it after DURATION (90s, 15m, 2h, 1h30m) on the database's clock\n",
     .role = CLI_ROLE_CLIENT},
    {.name = "turn",
     .sub = "show",
     .run = cli_turn_show,
     .summary =
         "status, attempt, epoch, timestamps, error, deliverable, tool calls, warnings, parent, children",
     .synopsis = "ID",
     .description = "Prints one turn as it is now (tw.turn_show): each tool call with its effective timeout\n"
                    "and where that came from, the warnings sent and a forced end's reason.\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "turn",
     .sub = "history",
     .run = cli_turn_history,
     .summary = "every transition in order: time, from -> to, epoch, attempt, actor, reason",
     .synopsis = "ID",
     .description =
         "Prints the turn's status changes in the order they happened (tw.turn_history), with who\n"
         "made each (a worker, the PMO, a watchdog rule, a client) and why.\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "turn",
     .sub = "tree",
     .run = cli_turn_tree,
     .summary = "the delegation tree a turn belongs to, each turn with its status",
     .synopsis = "ID",
     .description =
         "Prints the tree of child turns that delegating tool calls made, from its root, whichever\n"
         "turn of it ID is.\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "turns",
     .sub = "list",
     .run = cli_turns_list,
     .summary = "list turns, newest first",
     .synopsis = "[--agent A] [--status S] [--limit N]",
     .description =
         "Prints one line per turn (tw.turns_list): id, agent, status, epoch, error, creation time.\n",
     .options = "  --agent A    only the turns of agent A\n"
                "  --status S   only turns in status S: pending, dispatched, running, suspended, done, "
                "failed,\n"
                "               timeout, cancelled\n"
                "  --limit N    at most N turns (1 to 100000; default 100)\n",
     .role = CLI_ROLE_OBSERVER},
    {.name = "tool-result",
     .run = cli_tool_result,
     .summary = "post the result of an external tool call",
     .synopsis = "--turn ID --call CALL_ID [--status ok|error] --output JSON",
     .description =
         "Delivers the result of a call of a tool whose section says external = true, exactly as a\n"
         "tool program's result would arrive (tw.deliver_posted_result); the turn goes on. A\n"
         "result that is refused (no such call, already answered, the turn ended) is said in\n"
         "words. A call of a tool that runs a program, or a delegating call, takes no posted\n"
         "result (exit 2).\n",
     .options = "  --status ok     (the default) --output is the tool's output\n"
                "  --status error  --output is {\"code\",\"message\"}, or a string used as the message\n",
     .role = CLI_ROLE_CLIENT},
    {.name = "cancel",
     .run = cli_cancel,
     .summary = "cancel a turn that has not ended",
     .synopsis = "ID",
     .description = "Ends the turn with status cancelled (tw.cancel_turn_ex). A turn that has ended already\n"
                    "is left as it is: the command says so and exits 1.\n",
     .options = "",
     .role = CLI_ROLE_CLIENT},
    {.name = "dead-letters",
     .sub = "list",
     .run = cli_dead_letters_list,
     .summary = "turns whose last attempt ended failed or timeout, newest first",
     .synopsis = "[--agent A] [--limit N]",
     .description =
         "Prints the turns that used up their attempts (tw.dead_letters), with their error codes.\n",
     .options = "  --agent A    only the dead letters of agent A\n"
                "  --limit N    at most N turns (1 to 100000; default 100)\n",
     .role = CLI_ROLE_OBSERVER},
    {.name = "dead-letters",
     .sub = "replay",
     .run = cli_dead_letters_replay,
     .summary = "submit a dead letter again as a new turn (replay_of = ID); prints its id",
     .synopsis = "ID [--again]",
     .description = "Submits the dead letter's agent, channel, box and input again as a new turn\n"
                    "(tw.replay_turn) whose replay_of is ID, and prints the new turn's id.\n",
     .options = "  --again      replay a turn that was replayed before once more (without it the first "
                "replay's id\n"
                "               is printed again and nothing is submitted)\n",
     .role = CLI_ROLE_CLIENT},
    {.name = "events",
     .run = cli_events,
     .summary = "print events from NATS as JSON lines until interrupted",
     .synopsis = "[--agent A] [--since SECONDS]",
     .description =
         "Subscribes to evt.agent.> (or one agent's events) and prints each event's payload as one\n"
         "JSON line with its subject added, until SIGINT or SIGTERM. Needs NATS, not the database.\n",
     .options = "  --agent A        only the events of agent A\n"
                "  --since SECONDS  first the events of the last SECONDS, replayed from the JetStream stream "
                "named by\n"
                "                   [nats] events_stream (kept while nobody listened), then the new ones as "
                "they come\n",
     .role = CLI_ROLE_NONE},
    {.name = "daemons",
     .run = cli_daemons,
     .summary = "the daemons alive and those gone in the last day, with what each holds",
     .synopsis = "",
     .description =
         "Prints each PMO and worker (tw.daemons): alive means its liveness lock is held now; with\n"
         "counts and the turn ids of the first 100 steps and tool calls each holds.\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "tools",
     .sub = "list",
     .run = cli_tools_list,
     .summary = "each configured tool, and the tools of each MCP server with their input schemas",
     .synopsis = "",
     .description =
         "Prints each [tool.T] of the configuration: its kind (exec, serve, mcp, external,\n"
         "delegating), its program and limits. For an MCP tool it starts the server itself with the\n"
         "section's mcp argv (no shell), asks initialize and tools/list within 20 s, stops it, and\n"
         "prints the server's tools with their input schemas (the one its calls call is marked).\n"
         "Exits 1 when a server could not be asked. No database (docs/mcp.md).\n",
     .options = "",
     .role = CLI_ROLE_NONE},
    {.name = "limits",
     .sub = "set",
     .run = cli_limits_set,
     .summary = "set a limit of flow control at run time",
     .synopsis = "NAME [--max-concurrent N] [--rate N/S] [--burst B] [--per-key] [--max-wait S]",
     .description =
         "Sets limit NAME in the database (tw.set_limit): tool calls that name it in their tool's\n"
         "limits hold it, across every worker (docs/flow-control.md). A limit of the INI\n"
         "([limit.NAME]) keeps what is set here until the next reload or start of a worker.\n",
     .options =
         "  --max-concurrent N  at most N tool calls holding it at once (0, the default: no cap)\n"
         "  --rate N/S          at most N starts per S seconds (a token bucket, refilled continuously)\n"
         "  --burst B           the bucket's size (default N)\n"
         "  --per-key           the caps apply to each turn's limit_key separately\n"
         "  --max-wait S        a call that waits longer than S seconds to start ends error/limit_timeout\n"
         "                      (0, the default: as the turn's deadline allows)\n",
     .role = CLI_ROLE_CLIENT},
    {.name = "limits",
     .sub = "remove",
     .run = cli_limits_remove,
     .summary = "remove a limit: the calls waiting for it start as their others allow",
     .synopsis = "NAME",
     .description =
         "Removes limit NAME (tw.remove_limit); calls that still hold it keep it until they end.\n",
     .options = "",
     .role = CLI_ROLE_CLIENT},
    {.name = "limits",
     .sub = "list",
     .run = cli_limits_list,
     .summary = "every limit: cap, rate, burst, in use, waiting, tokens, source",
     .synopsis = "",
     .description = "Prints every limit with what it allows and how it is used now (tw.limits_list).\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "limits",
     .sub = "show",
     .run = cli_limits_show,
     .summary = "one limit: in use, waiting (by key), tokens, paused until, oldest wait",
     .synopsis = "NAME",
     .description = "Prints one limit as it is now (tw.limit_show).\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "schedules",
     .sub = "add",
     .run = cli_schedules_add,
     .summary = "add (or change) a schedule: a turn submitted to an agent on a calendar",
     .synopsis = "NAME --agent A --cron EXPR [--timezone TZ] [--channel C] [--input JSON] [--timeout S] "
                 "[--limit-key K] [--overlap skip|queue|cancel_previous] [--catchup none|last|all] "
                 "[--catchup-window S]",
     .description =
         "Adds schedule NAME (tw.add_schedule): at each time of the cron, in its time zone, one turn\n"
         "for agent A, exactly once whatever the number of PMOs (docs/schedules.md). A name of the\n"
         "INI ([schedule.NAME]) is refused: it is the file's.\n",
     .options =
         "  --agent A            the agent each tick submits a turn to\n"
         "  --cron EXPR          five fields: minute hour day-of-month month day-of-week\n"
         "  --timezone TZ        the IANA time zone the cron is read in (default UTC)\n"
         "  --channel C          the turns' channel (default schedule:NAME)\n"
         "  --input JSON         the turns' input, a JSON object (default {})\n"
         "  --timeout S          each turn's deadline in seconds (default none)\n"
         "  --limit-key K        the turns' limit key (flow control)\n"
         "  --overlap O          a tick while the last turn has not ended: skip (the default), queue or\n"
         "                       cancel_previous\n"
         "  --catchup C          ticks missed while no PMO ran: none, last (the default) or all\n"
         "  --catchup-window S   how old a missed tick may be and still fire (default 3600)\n",
     .role = CLI_ROLE_CLIENT},
    {.name = "schedules",
     .sub = "remove",
     .run = cli_schedules_remove,
     .summary = "remove a run-time schedule: it fires no more",
     .synopsis = "NAME",
     .description =
         "Removes schedule NAME and its tick records (tw.remove_schedule); one of the INI is refused.\n",
     .options = "",
     .role = CLI_ROLE_CLIENT},
    {.name = "schedules",
     .sub = "list",
     .run = cli_schedules_list,
     .summary = "every schedule: agent, cron, time zone, overlap, catch-up, next fire, owner",
     .synopsis = "",
     .description = "Prints every schedule with its next fire time (tw.schedules_list).\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "schedules",
     .sub = "show",
     .run = cli_schedules_show,
     .summary = "one schedule: its next 5 fire times in UTC, the last turns and the skipped ticks",
     .synopsis = "NAME",
     .description = "Prints one schedule as it is now (tw.schedule_show).\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "agent",
     .sub = "add",
     .run = cli_agent_add,
     .summary = "add an agent to the roster, bound to a profile (idempotent)",
     .synopsis = "ID --profile P [--metadata JSON]",
     .description =
         "Adds agent ID, which runs one turn at a time with the program and timeouts of profile\n"
         "P. Adding it again with the same profile changes nothing; another profile is an error.\n",
     .options = "  ID               the agent id: [A-Za-z0-9_-], 1 to 64 characters\n"
                "  --profile P      an [agent.P] section of the configuration (or a profile a daemon "
                "published)\n"
                "  --metadata JSON  a JSON object kept with the agent (default {})\n",
     .role = CLI_ROLE_CLIENT},
    {.name = "agent",
     .sub = "retire",
     .run = cli_agent_retire,
     .summary = "retire an agent: no new turns; those submitted still run",
     .synopsis = "ID",
     .description = "Marks the agent retired: it takes no new turns, and those submitted before still run.\n"
                    "Retiring it again changes nothing.\n",
     .options = "",
     .role = CLI_ROLE_CLIENT},
    {.name = "agent",
     .sub = "show",
     .run = cli_agent_show,
     .summary = "an agent's profile, status, metadata and turns by status",
     .synopsis = "ID",
     .description = "Prints the agent's roster entry and how many of its turns are in each status.\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "agents",
     .sub = "list",
     .run = cli_agents_list,
     .summary = "the roster in id order",
     .synopsis = "[--profile P] [--retired] [--after ID] [--limit N]",
     .description = "Prints one line per agent: id, profile, status, creation time. Page through a long\n"
                    "roster with --after the last id printed.\n",
     .options = "  --profile P  only agents of profile P\n"
                "  --retired    the retired agents (without it: those that take turns)\n"
                "  --after ID   the page after agent ID (ids in order)\n"
                "  --limit N    at most N agents (1 to 100000; default 100)\n",
     .role = CLI_ROLE_OBSERVER},
    {.name = "profiles",
     .run = cli_profiles,
     .summary = "the profiles published by the daemons, with the live workers serving each",
     .synopsis = "",
     .description =
         "Prints each profile the daemons published from their [agent.NAME] sections, when it was\n"
         "published, and the live workers that serve it.\n",
     .options = "",
     .role = CLI_ROLE_OBSERVER},
    {.name = "timeouts",
     .sub = "suggest",
     .run = cli_timeouts_suggest,
     .summary = "steps and tool calls of the last days: run times, timeouts in force, suggested ones as INI "
                "lines",
     .synopsis = "[--profile P] [--tool T] [--days N]",
     .description =
         "For each profile (its agent steps) and each tool (its calls), the newest 10,000 runs of the\n"
         "window: how many, p50 / p95 / p99 of how long they took, the share that timed out, the\n"
         "timeout in force in this configuration and where it comes from (agent, tool or global),\n"
         "and a suggestion: the p99 of the successful runs x 1.5, rounded up to a whole second,\n"
         "never below that p99, and never below the timeout in force when some runs timed out (how\n"
         "long those would have taken is unknown). The suggestions follow as INI lines to paste into\n"
         "their sections. Without --profile and --tool: every profile and tool of the configuration\n"
         "or the window. A name neither knows is an error (exit 2).\n",
     .options = "  --profile P  only the steps of profile P ([agent.P] step_timeout_seconds)\n"
                "  --tool T     only the calls of tool T ([tool.T] timeout_seconds)\n"
                "  --days N     the runs that ended in the last N days (1 to 3650; default 7)\n",
     .role = CLI_ROLE_OBSERVER},
    {.name = "console",
     .run = cli_console,
     .summary = "serve a read-only web console: turns, timelines, trees, daemons, dead letters",
     .synopsis = "[--listen HOST:PORT]",
     .description = "Serves a web page that reads JSON under /api/ (turns, turns/ID, turns/ID/history,\n"
                    "turns/ID/tree, daemons, dead-letters); every method but GET and HEAD is refused with\n"
                    "405. Plain HTTP without authentication. Runs until SIGINT or SIGTERM.\n",
     .options = "  --listen HOST:PORT  where to serve it (default 127.0.0.1:8080, loopback only)\n",
     .role = CLI_ROLE_OBSERVER},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

const CliCommand *cli_commands(size_t *n)
{
    *n = N_COMMANDS;
    return commands;
}

static const char usage_head[] = "Usage: turnwatch [-c FILE] [--json] [-v] COMMAND [ARGS]\n";

/* The global options: "  -c, --config FILE" and what it does, for --help and the manual page. */
static const struct {
    const char *option, *what;
} global_options[] = {
    {"-c, --config FILE", "INI configuration (default " TW_DEFAULT_CONFIG ")"},
    {"    --json", "machine-readable output on stdout"},
    {"-v, --verbose", "more detail on stderr"},
    {"    --check-config", "validate the configuration, print what is wrong, exit 0 or 1"},
    {"    --version", "print the version and exit"},
    {"-h, --help", "print this help and exit"},
};

static const char roles_text[] =
    "Each command needs the least PostgreSQL role that may run it (turnwatch_observer for reads,\n"
    "turnwatch_client for changes, the owner for migrate); `turnwatch help COMMAND` names it.\n";

/* "turn show ID" or "migrate": the command's words and its synopsis. */
static int synopsis(const CliCommand *c, char *buf, size_t size)
{
    return snprintf(buf, size, "%s%s%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "",
                    *c->synopsis ? " " : "", c->synopsis);
}

void cli_print_help(FILE *f)
{
    char line[512];

    fputs(usage_head, f);
    fputs("\nCommands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        int n = synopsis(&commands[i], line, sizeof line);
        /* A long synopsis gets its summary on the next line, in the same column. */
        if (n <= 36)
            fprintf(f, "  %-36s %s\n", line, commands[i].summary);
        else
            fprintf(f, "  %s\n  %-36s %s\n", line, "", commands[i].summary);
    }
    fprintf(f, "  %-36s %s\n", "help [COMMAND]", "this help, or a command's description and options");
    fputs("\nOptions (before or after the command):\n", f);
    for (size_t i = 0; i < sizeof global_options / sizeof global_options[0]; i++)
        fprintf(f, "  %-18s  %s\n", global_options[i].option, global_options[i].what);
    fputs("\nExit status: 0 ok, 1 runtime failure, 2 usage or validation error.\n", f);
    fputs(roles_text, f);
}

void cli_print_command_help(FILE *f, const CliCommand *c)
{
    char line[512];

    synopsis(c, line, sizeof line);
    /* The summary, a phrase in the overview, as a sentence here. */
    fprintf(f, "Usage: turnwatch [-c FILE] [--json] [-v] %s\n\n%c%s.\n", line,
            toupper((unsigned char)c->summary[0]), c->summary + 1);
    if (c->role != CLI_ROLE_NONE)
        fprintf(f, "PostgreSQL role: %s.\n", cli_role_text(c->role));
    fprintf(f, "\n%s", c->description);
    if (*c->options)
        fprintf(f, "\nOptions:\n%s", c->options);
}

/* ---- turnwatch(1) */

/* Text for scdoc: its markup characters taken literally. */
static void scd_text(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n && s[i]; i++) {
        if (s[i] == '*' || s[i] == '_' || s[i] == '\\')
            fputc('\\', f);
        fputc(s[i], f);
    }
}

/* Lines of text, each indented by a tab (a blank line stays blank). */
static void scd_indented(FILE *f, const char *text)
{
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        if (n) {
            fputc('\t', f);
            scd_text(f, p, n);
        }
        fputc('\n', f);
        p += n + (p[n] == '\n');
    }
}

static const char man_head[] =
    "TURNWATCH(1)\n"
    "\n"
    "# NAME\n"
    "\n"
    "turnwatch - submit, follow and manage the turns of turnwatch\n"
    "\n"
    "# SYNOPSIS\n"
    "\n"
    "*turnwatch* [*-c* _FILE_] [*--json*] [*-v*] _COMMAND_ [_ARGS_]\n"
    "\n"
    "*turnwatch* [*-c* _FILE_] *--check-config*\n"
    "\n"
    "*turnwatch* *help* [_COMMAND_]\n"
    "\n"
    "# DESCRIPTION\n"
    "\n"
    "turnwatch is the command line of turnwatch, which runs AI agents' turns durably with PostgreSQL as the "
    "truth and NATS as a doorbell; *turnwatch-pmo*(8) and *turnwatch-worker*(8) are its daemons. The "
    "commands submit turns and follow them, post the results of external tools, manage the roster of "
    "agents, and show what the daemons hold. They connect to the database of [postgres] *dsn* as the "
    "command needs (each names its least PostgreSQL role) and to NATS only to print events.\n"
    "\n"
    "*turnwatch help* _COMMAND_ (or _COMMAND_ *--help*) prints a command's description and options.\n"
    "\n"
    "# OPTIONS\n"
    "\n"
    "The options may come before or after the command.\n"
    "\n";

static const char man_tail[] =
    "# EXIT STATUS\n"
    "\n"
    "*0*\n"
    "\tSuccess.\n"
    "\n"
    "*1*\n"
    "\tA runtime failure: the database or NATS could not be reached, or refused the command; the "
    "configuration has errors (*--check-config*).\n"
    "\n"
    "*2*\n"
    "\tA usage or validation error: an unknown command or option, a bad argument, a name or document "
    "that is refused.\n"
    "\n"
    "Every failure is one line on stderr.\n"
    "\n"
    "# ENVIRONMENT\n"
    "\n"
    "The libpq variables (*PGPASSWORD*, *PGPASSFILE*, *PGSSLMODE*, ...) apply to the connection of "
    "[postgres] *dsn* as to any libpq client.\n"
    "\n"
    "# FILES\n"
    "\n"
    "_" TW_DEFAULT_CONFIG "_\n"
    "\tThe configuration read without *-c*; see *turnwatch.ini*(5).\n"
    "\n"
    "# SEE ALSO\n"
    "\n"
    "*turnwatch.ini*(5), *turnwatch-pmo*(8), *turnwatch-worker*(8)\n";

char *cli_doc_man(void)
{
    char *out = NULL, line[512];
    size_t len;
    FILE *f = open_memstream(&out, &len);

    if (!f)
        return NULL;
    fputs(man_head, f);
    for (size_t i = 0; i < sizeof global_options / sizeof global_options[0]; i++) {
        const char *o = global_options[i].option;
        while (*o == ' ')
            o++;
        fputc('*', f);
        scd_text(f, o, strlen(o));
        /* The phrase of --help as a sentence. */
        fprintf(f, "*\n\t%c", toupper((unsigned char)global_options[i].what[0]));
        scd_text(f, global_options[i].what + 1, strlen(global_options[i].what + 1));
        fputs(".\n\n", f);
    }
    fputs("# COMMANDS\n\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const CliCommand *c = &commands[i];
        synopsis(c, line, sizeof line);
        fputs("## ", f);
        scd_text(f, line, strlen(line));
        fputs("\n\n", f);
        fprintf(f, "\t%c", toupper((unsigned char)c->summary[0]));
        scd_text(f, c->summary + 1, strlen(c->summary + 1));
        fputs(".", f);
        if (c->role != CLI_ROLE_NONE) {
            fputs(" PostgreSQL role: ", f);
            scd_text(f, cli_role_text(c->role), strlen(cli_role_text(c->role)));
            fputs(".", f);
        }
        fputs("\n\n", f);
        scd_indented(f, c->description);
        fputc('\n', f);
        if (*c->options)
            /* Literal: the options keep their columns. */
            fprintf(f, "```\n%s```\n\n", c->options);
    }
    fputs(man_tail, f);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}
