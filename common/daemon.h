/* The shell both daemons run in: main (the flags, the configuration, the loop), the connections every daemon
 * has (its work's, its watchdogs', NATS), its watchdog rules at their due times and its liveness, health to
 * systemd and /healthz, the metrics listener, the counters line every minute, signals (a first one stops
 * taking work and drains, a second one hurries), and reloads (SIGHUP: read the file again, refuse what cannot
 * be applied, else apply it). A daemon gives its own parts through TwDaemonOps. daemon.c: the shell;
 * daemon_main.c: the flags, the signals held until the loop handles them, and main itself; below both,
 * daemon_conf.c (daemon_conf.h): loading and reading the configuration again, [log], the open-files limit. */
#ifndef TW_DAEMON_H
#define TW_DAEMON_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>

#include "bus.h"
#include "config.h"
#include "daemon_conf.h"
#include "due.h"
#include "httpd.h"
#include "liveness.h"
#include "notify.h"
#include "pgconn.h"
#include "pgpool.h"
#include "watchdogs.h"

/* What a daemon adds to the shell; every callback gets the daemon's self. */
typedef struct TwDaemonOps {
    const char *prog;    /* "turnwatch-pmo": log lines, the metrics, a refusal's message */
    const char *kind;    /* "pmo", "worker": its rules' counters line, connection names, cmd.<kind>.wakeup */
    const char *summary; /* for --help */
    TwRuleDaemon rules;  /* its rows of the rule table */
    /* The worker: its programs are checked at start-up and reload, the open-files limit counts them, and the
     * policies it publishes are those of the agents it serves. Also which [section] metrics_listen is its. */
    bool runs_programs;
    int drain_give_up_sec; /* a stop waits at most this long for queries in flight; 0: for as long as they
                              take */
    int (*setup)(void *self, struct event_base *base, TwConfig *cfg); /* takes cfg (one reference) */
    void (*teardown)(void *self);                                     /* after setup, succeeded or not */
    /* Came up, after the shell's part (health; on the work's connection our profiles and policies are
     * published; on the watchdogs' the due-time question is asked; on NATS that too). NULL: nothing more. */
    void (*pg_up)(void *self, TwPg *pg);
    void (*wd_up)(void *self);
    void (*bus_up)(void *self);
    /* Stop taking work (sig: the signal; 0: the database refused the configuration at start); write what
     * systemd's STATUS says meanwhile. The shell then stops the rules and waits for in-flight work. */
    void (*stop)(void *self, int sig, char *status, size_t size);
    void (*second_signal)(void *self); /* a second signal while stopping; NULL: exit at once */
    size_t (*in_flight)(void *self);   /* work that a stop waits for once no query is left; NULL: none */
    /* A reload's own part: the daemon's cfg is the new one, old the one before. Calls
     * tw_daemon_reconfigure where it fits. -1 refuses the file (logged; old is put back). */
    int (*apply)(void *self, const TwConfig *old);
    void (*log_counters)(void *self); /* a line of its own after the rules' (NULL: none) */
} TwDaemonOps;

typedef struct TwDaemon {
    const TwDaemonOps *ops;
    void *self;
    struct event_base *base;
    TwConfig *cfg; /* ours (one reference); a SIGHUP reload swaps it */
    char id[128];  /* host:pid, what claims record */
    TwPgPool pool; /* the work */
    /* The watchdog rules and their due-time questions have a connection of their own, so that they never wait
     * in line behind the work. */
    TwPgPool wd_pool;
    TwBus *bus;
    TwDue *due;
    TwLive *live;
    TwRule rules[TW_WATCHDOGS_MAX]; /* its rows of the rule table (common/watchdogs.c) */
    int n_rules;
    TwHttpd *httpd;   /* /metrics and /healthz when [pmo]/[worker] metrics_listen is set */
    TwNotify *notify; /* systemd */
    struct event *counters, *drain, *sigterm, *sigint, *sighup;
    bool stopping;
    bool reloading;   /* a reload's profiles are being checked against the database */
    bool profiles_ok; /* the database has taken our profiles once (a refusal after that does not stop us) */
    int exit_code;    /* 1 when the database refused the configuration at start */
    int drain_ticks;
} TwDaemon;

/** Run a daemon: parse the flags, load the configuration, ops->setup, the loop until a stop, the counters,
 *  ops->teardown. d is the shell inside self. Returns the exit code. */
int tw_daemon_main(int argc, char **argv, const TwDaemonOps *ops, void *self, TwDaemon *d);

/** Start-up, first: the id, the rules, the metrics registry, systemd, the connections (conns for the work,
 * one for the watchdogs; they connect at tw_daemon_start) and NATS (subscribed to cmd.<kind>.wakeup). */
int tw_daemon_open(TwDaemon *d, const TwDaemonOps *ops, void *self, struct event_base *base, TwConfig *cfg,
                   int conns) __attribute__((warn_unused_result));
/** Then the watchdogs (on_acted: a rule acted; may be NULL), the liveness (info: what `turnwatch daemons`
 *  shows, borrowed; on_reclaimed: it handed something back), the metrics listener, the counters and signals.
 */
int tw_daemon_arm(TwDaemon *d, json_t *info, void (*on_acted)(void *self), TwLiveReclaimedCb on_reclaimed)
    __attribute__((warn_unused_result));
/** Last: connect, and run the rules and the liveness. */
int tw_daemon_start(TwDaemon *d) __attribute__((warn_unused_result));
/** The connections' state callbacks tw_daemon_open sets (arg: d); for a daemon that sets a notify callback on
 *  one of them (tw_pg_set_callbacks), whose arg is then d too. */
void tw_daemon_pg_state(TwPg *pg, bool up, void *d);
void tw_daemon_wd_state(TwPg *pg, bool up, void *d);
/** Stop taking work (ops->stop), stop the rules, and end the loop once nothing is in flight. */
void tw_daemon_stop(TwDaemon *d, int sig);
/** Within ops->apply: the rules' parameters, the sweep and grace, the liveness info (borrowed), the metrics'
 *  names, and our profiles and policies published, all from the new configuration. */
void tw_daemon_reconfigure(TwDaemon *d, json_t *info);
/** Its connections now (for /healthz, the metrics and systemd); arg is the TwDaemon. */
void tw_daemon_health(void *d, TwHealth *h);
/** Every rule's counters and the daemon's own line (every minute and at exit). */
void tw_daemon_log_counters(TwDaemon *d);
/** Teardown, in two steps around the daemon's own: tw_daemon_disconnect stops the rules and frees NATS and
 * the connections (queries in flight get their callbacks now, so what they use must still exist), then
 *  tw_daemon_close frees the rest and drops the configuration. */
void tw_daemon_disconnect(TwDaemon *d);
void tw_daemon_close(TwDaemon *d);

/** Hold SIGTERM, SIGINT and SIGHUP from the first line of main until the event loop handles them
 *  (tw_daemon_signals_ready, once the daemon's setup has added its signal events): one that arrives during
 *  start-up is then a graceful stop or a reload as at any other time, not the default action that kills the
 *  process before it has said anything. Threads started meanwhile (nats.c's) keep them blocked, so they go to
 *  the main thread. */
void tw_daemon_hold_signals(void);
void tw_daemon_signals_ready(void);

/** Parse -c FILE, --check-config, --version, --help, -v. Returns -1 to go on, else the exit code. */
int tw_daemon_args(int argc, char **argv, const char *prog, const char *summary, TwDaemonArgs *args);
/** Log what a reload changes: keys, agents and tools added, removed or changed; the keys that only a restart
 *  applies (the connections) are named as such. */
void tw_daemon_log_changes(const TwConfig *old, const TwConfig *cfg);

#endif
