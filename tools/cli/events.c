/* turnwatch events: print the events of every agent (or one) from NATS as JSON lines until interrupted.
 * Each line is the event's payload, parsed and printed again with its subject added. */
#include <getopt.h>
#include <nats/nats.h>
#include <signal.h>
#include <stdio.h>

#include "bus.h"
#include "cli.h"
#include "log.h"
#include "names.h"

static volatile sig_atomic_t events_stop;

static void events_signal(int sig)
{
    events_stop = 1;
}

static void events_disconnected(natsConnection *nc, void *closure)
{
    if (events_stop)
        return; /* our own close on Ctrl-C */
    fprintf(stderr, "turnwatch: events: NATS connection lost; reconnecting\n");
}

static void events_reconnected(natsConnection *nc, void *closure)
{
    fprintf(stderr, "turnwatch: events: NATS connection back\n");
}

/* The JSON line for one message, or NULL for a payload that is not a JSON object (not one of our events). */
static json_t *event_line(natsMsg *msg)
{
    json_t *payload = json_loadb(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), 0, NULL);
    json_t *line = NULL;

    if (json_is_object(payload)) {
        line = json_pack("{s:s}", "subject", natsMsg_GetSubject(msg));
        json_object_update(line, payload);
    }
    json_decref(payload);
    return line;
}

int cli_events(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"agent", required_argument, NULL, 'a'}, {NULL, 0, NULL, 0}};
    const char *agent = NULL;
    char subject[128];
    natsConnection *nc = NULL;
    natsOptions *no = NULL;
    natsSubscription *sub = NULL;
    natsStatus s;
    int c, rc = CLI_EXIT_OK;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (c != 'a')
            return cli_bad_option(cli, c, argv);
        agent = optarg;
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "events: unexpected argument '%.80s'", argv[optind]);
    if (agent && !tw_name_valid(agent))
        return cli_die(CLI_EXIT_USAGE, "events: invalid agent name '%.80s'", agent);
    if (agent)
        snprintf(subject, sizeof subject, "evt.agent.%s.>", agent);
    else
        snprintf(subject, sizeof subject, "evt.agent.>");
    signal(SIGINT, events_signal);
    signal(SIGTERM, events_signal);
    /* A reader that went away (turnwatch events | head) ends the loop through the failed write instead. */
    signal(SIGPIPE, SIG_IGN);

    s = tw_nats_options_create(&no, cli->cfg.nats_url);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(no, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(no, 250);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(no, events_disconnected, NULL);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(no, events_reconnected, NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, no);
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, nc, subject);
    if (s == NATS_OK)
        s = natsConnection_Flush(nc);
    if (s != NATS_OK) {
        char shown[512];
        rc = cli_die(CLI_EXIT_RUNTIME, "events: cannot subscribe at %s: %s",
                     tw_redact_urls(cli->cfg.nats_url, shown, sizeof shown), natsStatus_GetText(s));
        goto out;
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);
    if (cli->verbose)
        fprintf(stderr, "turnwatch: events: listening on %s\n", subject);
    while (!events_stop) {
        natsMsg *msg = NULL;
        json_t *line;

        s = natsSubscription_NextMsg(&msg, sub, 200);
        if (s == NATS_TIMEOUT)
            continue;
        if (s != NATS_OK)
            break;
        line = event_line(msg);
        natsMsg_Destroy(msg);
        if (line && (rc = cli_print_json(line)) != CLI_EXIT_OK)
            break;
    }
out:
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(no);
    return rc;
}
