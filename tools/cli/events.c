/* turnwatch events: print the events of every agent (or one) from NATS as JSON lines until interrupted.
 * Each line is the event's payload, parsed and printed again with its subject added. With --since, the
 * events of the last SECONDS come first, replayed from the [nats] events_stream JetStream stream by an
 * ordered consumer that then goes on with the live ones (docs/operations.md). */
#include <getopt.h>
#include <nats/nats.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "bus.h"
#include "cli.h"
#include "log.h"
#include "names.h"
#include "natsopts.h"

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

/* An ordered consumer on the events stream from `since_sec` ago: the replay, then the live events. */
static natsStatus events_replay(natsSubscription **sub, jsCtx **js, natsConnection *nc, const char *stream,
                                const char *subject, long since_sec, jsErrCode *jerr)
{
    jsSubOptions so;
    struct timespec now;
    natsStatus s = natsConnection_JetStream(js, nc, NULL);

    if (s != NATS_OK)
        return s;
    clock_gettime(CLOCK_REALTIME, &now);
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverByStartTime;
    so.Config.OptStartTime = ((int64_t)now.tv_sec - (int64_t)since_sec) * 1000000000LL + (int64_t)now.tv_nsec;
    return js_SubscribeSync(sub, *js, subject, NULL, &so, jerr);
}

int cli_events(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"agent", required_argument, NULL, 'a'}, {"since", required_argument, NULL, 's'}, {NULL, 0, NULL, 0}};
    const char *agent = NULL, *since = NULL;
    long since_sec = -1;
    char subject[128];
    natsConnection *nc = NULL;
    natsOptions *no = NULL;
    natsSubscription *sub = NULL;
    jsCtx *js = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    int c, rc = CLI_EXIT_OK;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (c == 'a')
            agent = optarg;
        else if (c == 's')
            since = optarg;
        else
            return cli_bad_option(cli, c, argv);
    }
    if (since && !cli_parse_long(since, 0, 315360000, &since_sec))
        return cli_die(CLI_EXIT_USAGE,
                       "events: --since must be a whole number of seconds from 0 to 315360000");
    if (since && !cli->cfg.nats_events_stream[0])
        return cli_die(CLI_EXIT_USAGE,
                       "events: --since replays from a JetStream stream: set [nats] events_stream in %s (the "
                       "daemons then keep every event there)",
                       cli->config_path);
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

    char why[1024];
    if (tw_nats_options_create(&no, &cli->cfg, why, sizeof why) != NATS_OK)
        return cli_die(CLI_EXIT_RUNTIME, "events: %s", why);
    s = natsOptions_SetMaxReconnect(no, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(no, 250);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(no, events_disconnected, NULL);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(no, events_reconnected, NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, no);
    if (s == NATS_OK && since) {
        s = events_replay(&sub, &js, nc, cli->cfg.nats_events_stream, subject, since_sec, &jerr);
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
            rc = cli_die(CLI_EXIT_RUNTIME,
                         "events: there is no stream %s on the NATS server yet (a daemon with [nats] "
                         "events_stream = %s creates it when it connects)",
                         cli->cfg.nats_events_stream, cli->cfg.nats_events_stream);
            goto out;
        }
    } else if (s == NATS_OK) {
        s = natsConnection_SubscribeSync(&sub, nc, subject);
    }
    if (s == NATS_OK)
        s = natsConnection_Flush(nc);
    if (s != NATS_OK) {
        char shown[512];
        const char *last = nats_GetLastError(NULL);
        rc = cli_die(CLI_EXIT_RUNTIME, "events: cannot subscribe%s%s at %s: %s%s%s%s%s",
                     since ? " to stream " : "", since ? cli->cfg.nats_events_stream : "",
                     tw_redact_urls(cli->cfg.nats_url, shown, sizeof shown), natsStatus_GetText(s),
                     last ? ": " : "", last ? last : "", tw_nats_refused(s) ? "; check " : "",
                     tw_nats_refused(s) ? tw_nats_auth_keys(&cli->cfg) : "");
        goto out;
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);
    if (cli->verbose && since)
        fprintf(stderr, "turnwatch: events: replaying %s from the last %ld s of stream %s, then following\n",
                subject, since_sec, cli->cfg.nats_events_stream);
    else if (cli->verbose)
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
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(no);
    return rc;
}
