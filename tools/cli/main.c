/* turnwatch: the operator and user CLI (docs/overview.md). Global options, the command table, generated
 * help and dispatch; each command family lives in its own file. Exit codes: 0 ok, 1 runtime failure, 2 usage
 * or validation error; every failure is one line on stderr. */
#include <getopt.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "tw_build.h"

/* The command table and the help printed from it are commands.c's. */
static const CliCommand *commands;
static size_t n_commands;

static const CliCommand *find_command(const char *name, const char *sub)
{
    for (size_t i = 0; i < n_commands; i++)
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
    for (size_t i = 0; i < n_commands && off < size; i++)
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
            for (size_t i = 0; i < n_commands; i++)
                if (strcmp(commands[i].name, argv[0]) == 0) {
                    if (!first)
                        fputc('\n', stdout);
                    cli_print_command_help(stdout, &commands[i]);
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
        cli_print_help(stdout);
        return CLI_EXIT_OK;
    }
    if (!(c = resolve(argc, argv, true, &used, &rc)))
        return rc;
    cli_print_command_help(stdout, c);
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

    commands = cli_commands(&n_commands);
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
            cli_print_help(stdout);
            return CLI_EXIT_OK;
        default:
            cli_print_help(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (check_config)
        return optind < argc ? cli_die(CLI_EXIT_USAGE, "--check-config takes no command")
                             : cli_check_config(&cli);
    if (optind >= argc) {
        cli_print_help(stderr);
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
        cli_print_command_help(stdout, c);
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
