/* turnwatch: the operator and user CLI (contract section 2). Global options, the command table, generated
 * help and dispatch; each command family lives in its own file. Exit codes: 0 ok, 1 runtime failure, 2 usage
 * or validation error; every failure is one line on stderr. */
#include <ctype.h>
#include <getopt.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "tw_build.h"

/* Adding a command: its handler in a file of its own (declared in cli.h) and one entry here, with the least
 * PostgreSQL role that may run it (a function of tw it calls goes into the lists of sql/grants/roles.sql). A
 * name either has a subcommand in every entry (turn show, turn history) or is a single entry; the entries of
 * one name stay next to each other so that help lists them together. */
static const CliCommand commands[] = {
    {"migrate", NULL, cli_migrate, "create or upgrade the schema (idempotent)", "", CLI_ROLE_OWNER},
    {"submit", NULL, cli_submit, "submit a turn; prints its id (the same id again for a repeated key)",
     "--agent A --channel C [--profile P] [--box B] [--input JSON | --input-file F] [--timeout SECONDS] "
     "[--idempotency-key K] [--limit-key K] [--priority 0..9]\n"
     "  --agent A              an agent of the roster, or a profile's own agent ([agent.A] section)\n"
     "  --profile P            add agent A bound to profile P in the same transaction if it does not exist;\n"
     "                         an agent bound to another profile is an error\n"
     "  --channel C, --box B   the turn's channel and output box: 1 to 256 bytes, no control characters\n"
     "  --input JSON           the input document (default {}), at most 1 MiB\n"
     "  --input-file F         read the input document from F (- for stdin)\n"
     "  --timeout SECONDS      end the turn with status timeout after this long (1 to 31536000)\n"
     "  --idempotency-key K    a repeated K gives the first turn's id again (1 to 256 bytes)\n"
     "  --limit-key K          the key its tool calls (and child turns) count under in per-key limits and\n"
     "                         share fairly by (1 to 256 bytes; docs/flow-control.md)\n"
     "  --priority N           0 (the default) to 9: waiting for a limit, higher goes first\n",
     CLI_ROLE_CLIENT},
    {"turn", "show", cli_turn_show,
     "status, attempt, epoch, timestamps, error, deliverable, tool calls, warnings, parent, children", "ID",
     CLI_ROLE_OBSERVER},
    {"turn", "history", cli_turn_history,
     "every transition in order: time, from -> to, epoch, attempt, actor, reason", "ID", CLI_ROLE_OBSERVER},
    {"turn", "tree", cli_turn_tree, "the delegation tree a turn belongs to, each turn with its status", "ID",
     CLI_ROLE_OBSERVER},
    {"turns", "list", cli_turns_list, "list turns, newest first",
     "[--agent A] [--status S] [--limit N]\n"
     "  --agent A    only the turns of agent A\n"
     "  --status S   only turns in status S: pending, dispatched, running, suspended, done, failed,\n"
     "               timeout, cancelled\n"
     "  --limit N    at most N turns (1 to 100000; default 100)\n",
     CLI_ROLE_OBSERVER},
    {"tool-result", NULL, cli_tool_result, "post the result of an external tool call",
     "--turn ID --call CALL_ID [--status ok|error] --output JSON\n"
     "  --status ok     (the default) --output is the tool's output\n"
     "  --status error  --output is {\"code\",\"message\"}, or a string used as the message\n"
     "A call of a tool that runs a program, or a delegating call, takes no posted result (exit 2).\n",
     CLI_ROLE_CLIENT},
    {"cancel", NULL, cli_cancel, "cancel a turn that has not ended", "ID", CLI_ROLE_CLIENT},
    {"dead-letters", "list", cli_dead_letters_list,
     "turns whose last attempt ended failed or timeout, newest first",
     "[--agent A] [--limit N]\n"
     "  --agent A    only the dead letters of agent A\n"
     "  --limit N    at most N turns (1 to 100000; default 100)\n",
     CLI_ROLE_OBSERVER},
    {"dead-letters", "replay", cli_dead_letters_replay,
     "submit a dead letter again as a new turn (replay_of = ID); prints its id",
     "ID [--again]\n"
     "  --again      replay a turn that was replayed before once more (without it the first replay's id\n"
     "               is printed again and nothing is submitted)\n",
     CLI_ROLE_CLIENT},
    {"events", NULL, cli_events, "print events from NATS as JSON lines until interrupted",
     "[--agent A] [--since SECONDS]\n"
     "  --agent A        only the events of agent A\n"
     "  --since SECONDS  first the events of the last SECONDS, replayed from the JetStream stream named by\n"
     "                   [nats] events_stream (kept while nobody listened), then the new ones as they "
     "come\n",
     CLI_ROLE_NONE},
    {"daemons", NULL, cli_daemons, "the daemons alive and those gone in the last day, with what each holds",
     "", CLI_ROLE_OBSERVER},
    {"limits", "set", cli_limits_set, "set a limit of flow control at run time (docs/flow-control.md)",
     "NAME [--max-concurrent N] [--rate N/S] [--burst B] [--per-key] [--max-wait S]\n"
     "  --max-concurrent N  at most N tool calls holding it at once (0, the default: no cap)\n"
     "  --rate N/S          at most N starts per S seconds (a token bucket, refilled continuously)\n"
     "  --burst B           the bucket's size (default N)\n"
     "  --per-key           the caps apply to each turn's limit_key separately\n"
     "  --max-wait S        a call that waits longer than S seconds to start ends error/limit_timeout\n"
     "                      (0, the default: as the turn's deadline allows)\n"
     "A limit of the INI ([limit.NAME]) keeps what is set here until the next reload or start of a worker.\n",
     CLI_ROLE_CLIENT},
    {"limits", "remove", cli_limits_remove,
     "remove a limit: the calls waiting for it start as their others allow", "NAME", CLI_ROLE_CLIENT},
    {"limits", "list", cli_limits_list, "every limit: cap, rate, burst, in use, waiting, tokens, source", "",
     CLI_ROLE_OBSERVER},
    {"limits", "show", cli_limits_show,
     "one limit: in use, waiting (by key), tokens, paused until, oldest wait", "NAME", CLI_ROLE_OBSERVER},
    {"agent", "add", cli_agent_add, "add an agent to the roster, bound to a profile (idempotent)",
     "ID --profile P [--metadata JSON]\n"
     "  ID               the agent id: [A-Za-z0-9_-], 1 to 64 characters\n"
     "  --profile P      an [agent.P] section of the configuration (or a profile a daemon published)\n"
     "  --metadata JSON  a JSON object kept with the agent (default {})\n",
     CLI_ROLE_CLIENT},
    {"agent", "retire", cli_agent_retire, "retire an agent: no new turns; those submitted still run", "ID",
     CLI_ROLE_CLIENT},
    {"agent", "show", cli_agent_show, "an agent's profile, status, metadata and turns by status", "ID",
     CLI_ROLE_OBSERVER},
    {"agents", "list", cli_agents_list, "the roster in id order",
     "[--profile P] [--retired] [--after ID] [--limit N]\n"
     "  --profile P  only agents of profile P\n"
     "  --retired    the retired agents (without it: those that take turns)\n"
     "  --after ID   the page after agent ID (ids in order)\n"
     "  --limit N    at most N agents (1 to 100000; default 100)\n",
     CLI_ROLE_OBSERVER},
    {"profiles", NULL, cli_profiles,
     "the profiles published by the daemons, with the live workers serving each", "", CLI_ROLE_OBSERVER},
    {"timeouts", "suggest", cli_timeouts_suggest,
     "steps and tool calls of the last days: run times, timeouts in force, suggested ones as INI lines",
     "[--profile P] [--tool T] [--days N]\n"
     "  --profile P  only the steps of profile P ([agent.P] step_timeout_seconds)\n"
     "  --tool T     only the calls of tool T ([tool.T] timeout_seconds)\n"
     "  --days N     the runs that ended in the last N days (1 to 3650; default 7)\n"
     "\n"
     "For each profile (its agent steps) and each tool (its calls), the newest 10,000 runs of the window: "
     "how\n"
     "many, p50 / p95 / p99 of how long they took, the share that timed out, the timeout in force in this\n"
     "configuration and where it comes from (agent, tool or global), and a suggestion: the p99 of the "
     "successful\n"
     "runs x 1.5, rounded up to a whole second, never below that p99, and never below the timeout in force\n"
     "when some runs timed out (how long those would have taken is unknown). The suggestions follow as INI\n"
     "lines to paste into their sections. Without --profile and --tool: every profile and tool of the\n"
     "configuration or the window. A name neither knows is an error (exit 2).\n",
     CLI_ROLE_OBSERVER},
    {"console", NULL, cli_console,
     "serve a read-only web console: turns, timelines, trees, daemons, dead letters",
     "[--listen HOST:PORT]\n"
     "  --listen HOST:PORT  where to serve it (default 127.0.0.1:8080, loopback only); the page reads JSON\n"
     "                      under /api/ (turns, turns/ID, turns/ID/history, turns/ID/tree, daemons,\n"
     "                      dead-letters); every method but GET and HEAD is refused with 405. Runs until\n"
     "                      SIGINT or SIGTERM\n",
     CLI_ROLE_OBSERVER},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const char usage_head[] = "Usage: turnwatch [-c FILE] [--json] [-v] COMMAND [ARGS]\n";

static const char options_text[] =
    "Options (before or after the command):\n"
    "  -c, --config FILE   INI configuration (default " TW_DEFAULT_CONFIG ")\n"
    "      --json          machine-readable output on stdout\n"
    "  -v, --verbose       more detail on stderr\n"
    "      --check-config  validate the configuration, print what is wrong, exit 0 or 1\n"
    "      --version       print the version and exit\n"
    "  -h, --help          print this help and exit\n"
    "\n"
    "Exit status: 0 ok, 1 runtime failure, 2 usage or validation error.\n"
    "Each command needs the least PostgreSQL role that may run it (turnwatch_observer for reads,\n"
    "turnwatch_client for changes, the owner for migrate); `turnwatch help COMMAND` names it.\n";

/* "turn show ID" or "migrate": the command's words and the first line of its usage. */
static int synopsis(const CliCommand *c, char *buf, size_t size)
{
    size_t first = strcspn(c->usage, "\n");

    return snprintf(buf, size, "%s%s%s%s%.*s", c->name, c->sub ? " " : "", c->sub ? c->sub : "",
                    first ? " " : "", (int)first, c->usage);
}

static void print_help(FILE *f)
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
    fprintf(f, "  %-36s %s\n", "help [COMMAND]", "this help, or a command's options");
    fputs("\n", f);
    fputs(options_text, f);
}

static void print_command_help(FILE *f, const CliCommand *c)
{
    char line[512];
    const char *details = strchr(c->usage, '\n');

    synopsis(c, line, sizeof line);
    /* The summary, a phrase in the overview, as a sentence here. */
    fprintf(f, "Usage: turnwatch [-c FILE] [--json] [-v] %s\n\n%c%s.\n", line,
            toupper((unsigned char)c->summary[0]), c->summary + 1);
    if (c->role != CLI_ROLE_NONE)
        fprintf(f, "PostgreSQL role: %s.\n", cli_role_text(c->role));
    if (details && details[1])
        fprintf(f, "\n%s", details + 1);
}

static const CliCommand *find_command(const char *name, const char *sub)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0 &&
            (!sub || !commands[i].sub || strcmp(commands[i].sub, sub) == 0))
            return &commands[i];
    return NULL;
}

/* The subcommands of name, "show|history", for messages. */
static void subcommands(const char *name, char *buf, size_t size)
{
    size_t off = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < N_COMMANDS && off < size; i++)
        if (strcmp(commands[i].name, name) == 0 && commands[i].sub)
            off += (size_t)snprintf(buf + off, size - off, "%s%s", off ? "|" : "", commands[i].sub);
}

/* Looks argv[0] (and argv[1] for a command with subcommands) up in the table. Returns the entry and in *used
 * how many words it took; NULL with the exit status in *rc when there is none, or when only the family was
 * named and help was asked for it (then *rc is 0 and the family's help is printed). */
static const CliCommand *resolve(int argc, char **argv, bool help, int *used, int *rc)
{
    const CliCommand *c = find_command(argv[0], NULL);
    char subs[256];

    if (!c) {
        *rc = cli_die(CLI_EXIT_USAGE, "unknown command '%.40s'; try turnwatch --help", argv[0]);
        return NULL;
    }
    *used = 1;
    if (!c->sub)
        return c;
    if (argc < 2 || argv[1][0] == '-') {
        if (help) {
            bool first = true;
            for (size_t i = 0; i < N_COMMANDS; i++)
                if (strcmp(commands[i].name, argv[0]) == 0) {
                    if (!first)
                        fputc('\n', stdout);
                    print_command_help(stdout, &commands[i]);
                    first = false;
                }
            *rc = CLI_EXIT_OK;
            return NULL;
        }
        subcommands(argv[0], subs, sizeof subs);
        *rc = cli_die(CLI_EXIT_USAGE, "%s: which one? (%s); try turnwatch %s --help", argv[0], subs, argv[0]);
        return NULL;
    }
    if (!(c = find_command(argv[0], argv[1]))) {
        subcommands(argv[0], subs, sizeof subs);
        *rc = cli_die(CLI_EXIT_USAGE, "%s: unknown subcommand '%.40s' (%s); try turnwatch %s --help", argv[0],
                      argv[1], subs, argv[0]);
        return NULL;
    }
    *used = 2;
    return c;
}

/* `turnwatch help [COMMAND [SUB]]`. */
static int help_command(int argc, char **argv)
{
    const CliCommand *c;
    int used, rc;

    if (argc == 0) {
        print_help(stdout);
        return CLI_EXIT_OK;
    }
    if (!(c = resolve(argc, argv, true, &used, &rc)))
        return rc;
    print_command_help(stdout, c);
    return CLI_EXIT_OK;
}

static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}

/* The global options may also follow the command (turnwatch submit ... --json -c FILE): take them out of
 * argv, which then holds the command and its own arguments only. Returns the new argc. */
static int take_global_options(Cli *cli, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "-v") == 0 ||
            strcmp(argv[i], "--verbose") == 0) {
            if (argv[i][2] == 'j')
                cli->json = true;
            else
                cli->verbose = true;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            i--;
        } else if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) && i + 1 < argc) {
            cli->config_path = argv[i + 1];
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
            i--;
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            cli->config_path = argv[i] + 9;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            i--;
        }
    }
    return argc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"verbose", no_argument, NULL, 'v'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {"check-config", no_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    Cli cli = {.config_path = TW_DEFAULT_CONFIG};
    bool check_config = false;
    const CliCommand *c;
    int opt, used, rc;

    /* Global options come before the command; the command parses the rest. */
    while ((opt = getopt_long(argc, argv, "+c:vh", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            cli.config_path = optarg;
            break;
        case 'j':
            cli.json = true;
            break;
        case 'v':
            cli.verbose = true;
            break;
        case 'V':
            printf("turnwatch %s\n", TW_VERSION);
            return CLI_EXIT_OK;
        case 'C':
            check_config = true;
            break;
        case 'h':
            print_help(stdout);
            return CLI_EXIT_OK;
        default:
            print_help(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (check_config)
        return optind < argc ? cli_die(CLI_EXIT_USAGE, "--check-config takes no command")
                             : cli_check_config(&cli);
    if (optind >= argc) {
        print_help(stderr);
        return CLI_EXIT_USAGE;
    }
    argc -= optind;
    argv += optind;
    argc = take_global_options(&cli, argc, argv);
    if (strcmp(argv[0], "help") == 0)
        return help_command(argc - 1, argv + 1);
    if (!(c = resolve(argc, argv, wants_help(argc, argv), &used, &rc)))
        return rc;
    argc -= used - 1;
    argv += used - 1;
    if (wants_help(argc, argv)) {
        print_command_help(stdout, c);
        return CLI_EXIT_OK;
    }

    tw_log_init("turnwatch", cli.verbose ? TW_LOG_DEBUG : TW_LOG_WARN);
    if ((rc = cli_config_load(&cli)))
        return rc;
    cli.cmd = c;
    /* Most commands read, or change something the same way twice; those that do not say so themselves
     * (submit without an idempotency key, tool-result, dead-letters replay --again). */
    cli.idempotent = true;
    snprintf(cli.cmd_name, sizeof cli.cmd_name, "%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "");
    /* Handlers parse their options with getopt_long from optind 1 and report bad ones themselves. */
    opterr = 0;
    rc = c->run(&cli, argc, argv);
    if (cli.conn)
        PQfinish(cli.conn);
    tw_config_free(&cli.cfg);
    /* Wait for nats.c's own threads to end before exit runs its destructor: nats_Close() alone returns with
     * them still running (a subscription's delivery thread reading freed memory at exit, seen once by
     * AddressSanitizer in a loop of `turnwatch cancel`). */
    if (nats_CloseAndWait(2000) == NATS_TIMEOUT)
        log_debug("nats: library threads still running at exit");
    return rc;
}
