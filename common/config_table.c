/* The parameter table: every key of every section, its type, bounds, default, reload class, enum values and
 * meaning. The engine (config.c) reads, checks, stores, inherits and frees values by it, and the
 * documentation (config_doc.c) is generated from it; nothing else lists keys. And the lookups in a loaded
 * configuration (a key's line, an agent, a tool, what a worker serves) and its list of errors. */
#include "config_table.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"     /* limits, policy defaults */
#include "registry_gen.h" /* TW_RETRY_ON_DEFAULT */
#include "config.h"       /* tw_config_ref, tw_config_unref */
#include "words.h"

#define G(field) offsetof(TwConfig, field)
#define A(field) offsetof(TwAgentConf, field)
#define T(field) offsetof(TwToolConf, field)
#define L(field) offsetof(TwFlowLimitConf, field)
#define S(field) offsetof(TwScheduleConf, field)

/* The columns of a row, in order: section, key, type, offset, min, max, default, reload class, enum values,
 * template example, help. */

/* The keys that [worker] holds the defaults of and an [agent.NAME] (the policies, the limits) or a
 * [tool.NAME] (the limits) may set for itself, with the same bounds: each group is written once, as rows of
 * section sec whose field F places in its struct, with their defaults (D = DEF, [worker]) or none (NO_DEF:
 * the section inherits [worker]'s) and the example values the templates show (E = EX) or none (NO_EX). */
#define W(field) G(worker.field)
#define DEF(value) value
#define NO_DEF(value) NULL
#define EX(value) value
#define NO_EX(value) NULL
/* clang-format off */
#define POLICY_ROWS(sec, F, D, E)                                                                            \
    {sec, "max_attempts", TW_PT_INT, F(policy.max_attempts), 1, 100, D(TW_STR(TW_POLICY_MAX_ATTEMPTS)), TW_RELOAD, NULL, E("3"),        \
     "How many attempts a turn gets: 1 makes every timeout or failure final."},                              \
    {sec, "retry_on", TW_PT_LIST, F(policy.retry_on), 0, 0, D(TW_RETRY_ON_DEFAULT), TW_RELOAD, NULL,         \
     E("step_timeout,agent_exit"),                                                                           \
     "The error codes that end an attempt and start the next one (a comma list, or * for every code but "    \
     "cancelled and turn_deadline_exceeded, which are always final). Others are final at once."},            \
    {sec, "retry_backoff_seconds", TW_PT_INT, F(policy.retry_backoff_sec), 1, 86400, D(TW_STR(TW_POLICY_RETRY_BACKOFF_SEC)), TW_RELOAD,      \
     NULL, E("2"),                                                                                           \
     "The wait before attempt 2; it doubles for each later attempt, with +-20 % jitter, up to "              \
     "retry_backoff_max_seconds."},                                                                          \
    {sec, "retry_backoff_max_seconds", TW_PT_INT, F(policy.retry_backoff_max_sec), 1, TW_TIMEOUT_MAX_SEC, D(TW_STR(TW_POLICY_RETRY_BACKOFF_MAX_SEC)),      \
     TW_RELOAD, NULL, E("60"),                                                                               \
     "The longest wait between two attempts. Must not be less than retry_backoff_seconds."},                 \
    {sec, "queue_timeout_seconds", TW_PT_INT, F(policy.queue_timeout_sec), 0, TW_TIMEOUT_MAX_SEC, D(TW_STR(TW_POLICY_QUEUE_TIMEOUT_SEC)), TW_RELOAD,     \
     NULL, E("600"),                                                                                         \
     "A turn (or a retried attempt) that is not running this long after it was queued ends timeout / "      \
     "queue_timeout. 0 is no limit."},                                                                       \
    {sec, "warn_at_percent", TW_PT_INT, F(policy.warn_at_percent), 0, 99, D(TW_STR(TW_POLICY_WARN_AT_PERCENT)), TW_RELOAD, NULL, E("80"), \
     "One evt.agent.<agent>.warning event when this share of a deadline has passed: the turn's --timeout, "  \
     "a step's step_timeout_seconds, a tool call's wait, the queue budget. 0 turns warnings off."},          \
    {sec, "tool_timeout_seconds", TW_PT_INT, F(policy.tool_timeout_sec), 1, TW_TIMEOUT_MAX_SEC, D(TW_STR(TW_POLICY_TOOL_TIMEOUT_SEC)), TW_RELOAD,      \
     NULL, E("20"),                                                                                          \
     "A tool call's timeout when neither the call (its timeout_seconds) nor the tool's section sets one."}
#define LIMIT_ROWS(sec, F, D, E)                                                                             \
    {sec, "memory_limit_mb", TW_PT_INT, F(limits.memory_limit_mb), 0, 1048576, D("0"), TW_RELOAD, NULL,      \
     E("512"),                                                                                               \
     "Memory in MiB: the program's heap and private writable mappings (RLIMIT_DATA); an allocation past it " \
     "fails. 0 is no limit."},                                                                               \
    {sec, "cpu_limit_seconds", TW_PT_INT, F(limits.cpu_limit_sec), 0, TW_TIMEOUT_MAX_SEC, D("0"), TW_RELOAD, NULL,       \
     E("60"),                                                                                                \
     "Seconds of CPU time (RLIMIT_CPU): SIGXCPU then, SIGKILL one second later. In serve mode, per "         \
     "request. 0 is no limit."},                                                                             \
    {sec, "max_open_files", TW_PT_INT, F(limits.max_open_files), 0, 1048576, D("0"), TW_RELOAD, NULL,        \
     E("256"), "Open file descriptors (RLIMIT_NOFILE), the three pipes included: 0 (no limit), or at least 16 " \
     "(fewer and a dynamically linked program, or a shell's redirection, cannot even start)."},               \
    {sec, "max_processes", TW_PT_INT, F(limits.max_processes), 0, 4194304, D("0"), TW_RELOAD, NULL, E("64"), \
     "Processes and threads of the user the program runs as, all of them (RLIMIT_NPROC); root is exempt, "   \
     "so this needs run_as_user when the worker runs as root. 0 is no limit."},                              \
    {sec, "run_as_user", TW_PT_STR, F(limits.run_as_user), 0, 0, D(""), TW_RELOAD, NULL, E("nobody"),        \
     "Run the programs as this user (its group, no supplementary groups, no new privileges). The worker "    \
     "must run as root, and that user must be able to run each program (search on its directories, execute " \
     "on it, read on a script: --check-config says which it cannot). Empty: the worker's own user."}
/* clang-format on */

/* Every key with its shipped default: config/turnwatch.ini is generated from this table and a test compares
 * them. [postgres] and [nats] are the daemon's connections, made once: TW_RESTART. */
static const TwParam params[] = {
    {TW_SEC_POSTGRES, "dsn", TW_PT_STR, G(pg_dsn), 0, 0, "postgresql:///turnwatch", TW_RESTART, NULL, NULL,
     "libpq connection string or URI (https://www.postgresql.org/docs/current/libpq-connect.html). Passwords "
     "are never logged; prefer a ~/.pgpass file or PGPASSWORD over putting one here. Its user needs the role "
     "turnwatch_daemon for the daemons, turnwatch_client or turnwatch_observer for the CLI's commands and "
     "the "
     "console, and must own the schema for `turnwatch migrate`."},
    {TW_SEC_POSTGRES, "keepalive_seconds", TW_PT_INT, G(pg_keepalive_sec), 0, 3600, "10", TW_RESTART, NULL,
     NULL,
     "TCP keepalives on every connection of the daemons, at both ends: a host that vanishes (power off, "
     "network cut) is noticed within about this many seconds, and the work its worker held goes back to "
     "other workers (a daemon's liveness lock ends with its session). 0 turns keepalives off (the system's "
     "defaults: hours). An \"options\" or \"keepalives*\" setting in the dsn itself takes precedence."},
    {TW_SEC_POSTGRES, "query_timeout_seconds", TW_PT_INT, G(pg_query_timeout_sec), 2, 3600, "30", TW_RESTART,
     NULL, NULL,
     "How long a daemon waits for one statement before it gives up on it and drops the connection. Each "
     "session of a daemon also tells the server to cancel any statement of its own at four fifths of this "
     "(statement_timeout), so a statement the daemon gave up on never commits behind its back; and to wait "
     "at most 1 second for a row lock (lock_timeout), so that an application holding a transaction open "
     "after tw.submit_turn delays only that agent's own turns (the daemon tries again later)."},
    {TW_SEC_NATS, "url", TW_PT_STR, G(nats_url), 0, 0, "nats://127.0.0.1:4222", TW_RESTART, NULL, NULL,
     "NATS server URL; a comma-separated list (no spaces) for a cluster. NATS is only a doorbell: while it "
     "is unreachable nothing is lost, turns go on at the pace of the watchdog scans."},
    {TW_SEC_NATS, "events_stream", TW_PT_STR, G(nats_events_stream), 0, 0, "", TW_RESTART, NULL, NULL,
     "Durable observers: the name of a JetStream stream that keeps every event (evt.agent.>, "
     "evt.schedule.>), "
     "so that "
     "`turnwatch events --since SECONDS` can show what happened while nobody watched. Empty: off (events are "
     "only delivered to whoever listens at the time). When set, each daemon creates the stream on connect if "
     "it is missing, or adds evt.agent.>, evt.schedule.> and the age limit to it; the server must run with "
     "JetStream "
     "(nats-server -js). Name: [A-Za-z0-9_-], 1 to 64 characters."},
    {TW_SEC_NATS, "events_max_age_seconds", TW_PT_INT, G(nats_events_max_age_sec), 1, 315360000, "604800",
     TW_RESTART, NULL, NULL, "How long the events stream keeps an event, in seconds (604800: a week)."},
    {TW_SEC_NATS, "credentials_file", TW_PT_STR, G(nats_credentials_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "A .creds file (user JWT and nkey seed, as `nsc` writes it): operator/account (decentralized) mode. "
     "Its contents are read again at every connect: a file replaced at the same path applies then."},
    {TW_SEC_NATS, "nkey_seed_file", TW_PT_STR, G(nats_nkey_seed_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "A file holding a user nkey seed (SU...), for a server with an nkey user: the public key is derived "
     "from it. Its contents are read again at every connect, as credentials_file's."},
    {TW_SEC_NATS, "user", TW_PT_STR, G(nats_user), 0, 0, "", TW_RESTART, NULL, NULL,
     "A user name, with password_file."},
    {TW_SEC_NATS, "password_file", TW_PT_STR, G(nats_password_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "A file whose first line is the password of user."},
    {TW_SEC_NATS, "token_file", TW_PT_STR, G(nats_token_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "A file whose first line is the token, for a server with token authorization."},
    {TW_SEC_NATS, "tls_ca_file", TW_PT_STR, G(nats_tls_ca_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "TLS: the CA certificate(s) (PEM) that signed the server's certificate. Setting it, or a tls:// URL, or "
     "a client certificate, turns TLS on; the server's certificate must then be valid for the URL's host."},
    {TW_SEC_NATS, "tls_cert_file", TW_PT_STR, G(nats_tls_cert_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "A client certificate (PEM), with tls_key_file, for a server that verifies clients (tls { verify: true "
     "})."},
    {TW_SEC_NATS, "tls_key_file", TW_PT_STR, G(nats_tls_key_file), 0, 0, "", TW_RESTART, NULL, NULL,
     "The key (PEM) of tls_cert_file."},
    {TW_SEC_NATS, "events_replicas", TW_PT_INT, G(nats_events_replicas), 1, 5, "1", TW_RESTART, NULL, NULL,
     "On how many servers of a NATS cluster the events stream keeps each event: 3 in a cluster of three, so "
     "that losing one server loses no event. An existing stream is updated to this. An event counts as "
     "published only once the stream acknowledged it; until then it stays in the outbox and is published "
     "again."},
    {TW_SEC_PMO, "watchdog_interval_seconds", TW_PT_INT, G(pmo.watchdog_interval_sec), 1, 86400, "5",
     TW_RELOAD, NULL, NULL,
     "The PMO's safety sweep: how often it runs the dispatch scan, every watchdog (2.4-2.7, turn deadlines) "
     "and the outbox relay whether or not anything is due. Between sweeps each rule fires at its own due "
     "time, asked of the database (an index-backed min()), so this interval does not make any rule late: a "
     "longer one only costs more when a wake-up is lost (a deadline created by another daemon while NATS "
     "was down is then found at the next sweep)."},
    {TW_SEC_PMO, "dispatched_retry_seconds", TW_PT_INT, G(pmo.dispatched_retry_sec), 1, 86400, "10",
     TW_RELOAD, NULL, NULL,
     "2.4: an agent 'dispatched' for this long gets its turn envelope re-enqueued (if no live copy exists) "
     "and its doorbell rung again, at most once per this many seconds. Must be less than "
     "dispatched_timeout_seconds."},
    {TW_SEC_PMO, "dispatched_timeout_seconds", TW_PT_INT, G(pmo.dispatched_timeout_sec), 1,
     TW_TIMEOUT_MAX_SEC, "30", TW_RELOAD, NULL, NULL,
     "2.5: an agent 'dispatched' for this long is reaped: the turn ends 'timeout' / dispatch_timeout."},
    {TW_SEC_PMO, "pending_wakeup_seconds", TW_PT_INT, G(pmo.pending_wakeup_sec), 1, 86400, "5", TW_RELOAD,
     NULL, NULL,
     "2.7: a 'pending' inbox item older than this gets its doorbell rung again (once per this many "
     "seconds). Must be less than pending_wakeup_skip_seconds."},
    {TW_SEC_PMO, "pending_wakeup_skip_seconds", TW_PT_INT, G(pmo.pending_wakeup_skip_sec), 1,
     TW_TIMEOUT_MAX_SEC, "300", TW_RELOAD, NULL, NULL,
     "2.7: a 'pending' inbox item with no determinable channel older than this is marked 'skipped' "
     "(watchdog_error = missing_channel)."},
    {TW_SEC_PMO, "active_reap_seconds", TW_PT_INT, G(pmo.active_reap_sec), 1, TW_TIMEOUT_MAX_SEC, "300",
     TW_RELOAD, NULL, NULL,
     "2.6: an agent 'running' with no worker heartbeat for this long is reaped: the turn ends 'failed' / "
     "timeout_reaped_by_watchdog."},
    {TW_SEC_PMO, "metrics_listen", TW_PT_STR, G(pmo.metrics_listen), 0, 0, "", TW_RELOAD, NULL, NULL,
     "host:port on which this PMO serves GET /metrics (Prometheus text format) and GET /healthz (200 when "
     "its "
     "PostgreSQL and NATS connections are up, else 503), e.g. 127.0.0.1:9464 or [::1]:9464. Empty: off. "
     "Plain HTTP without authentication: keep it on a loopback or private address."},
    {TW_SEC_WORKER, "inbox_processing_timeout_seconds", TW_PT_INT, G(worker.inbox_processing_timeout_sec), 1,
     604800, "300", TW_RELOAD, NULL, NULL,
     "2.1: an inbox item 'processing' whose lease was not renewed for this long goes back to 'pending'. Also "
     "the lease length of resume ledger entries (2.3). Leases are for a worker that is alive but stuck "
     "(stopped, hung): one whose session ends (exit, kill -9, a host gone) has its work handed back within a "
     "second through its liveness lock, whatever this value."},
    {TW_SEC_WORKER, "watchdog_interval_seconds", TW_PT_INT, G(worker.watchdog_interval_sec), 1, 86400, "5",
     TW_RELOAD, NULL, NULL,
     "The worker's safety sweep: how often it runs watchdogs 2.1-2.3 and polls its inbox whether or not "
     "anything is due (doorbells make polling rarely needed). Each rule also fires at its own due time, "
     "asked of the database, so a longer interval does not make any rule late."},
    {TW_SEC_WORKER, "suspend_timeout_seconds", TW_PT_INT, G(worker.suspend_timeout_sec), 1,
     TW_TIMEOUT_MAX_SEC, "300", TW_RELOAD, NULL, NULL,
     "2.2: how long a tool call may stay unanswered by default; a call's deadline is its suspension time "
     "plus the largest of this, the tool's suspend_timeout_seconds and the call's timeout "
     "(tool_timeout_seconds)."},
    {TW_SEC_WORKER, "heartbeat_seconds", TW_PT_INT, G(worker.heartbeat_sec), 1, 86400, "10", TW_RELOAD, NULL,
     NULL,
     "How often a worker renews the leases and turns it holds. Must be less than half of [pmo] "
     "active_reap_seconds and less than half of inbox_processing_timeout_seconds."},
    {TW_SEC_WORKER, "concurrency", TW_PT_INT, G(worker.concurrency), 1, 1024, "4", TW_RELOAD, NULL, NULL,
     "How many agent and tool programs this worker runs at once."},
    {TW_SEC_WORKER, "agents", TW_PT_LIST, G(worker.agents), 0, 0, "*", TW_RELOAD, NULL, NULL,
     "Which profiles ([agent.*] sections) and [tool.*] sections this worker serves: * for all, or a comma "
     "list of names. The worker runs the turns of every agent of the roster bound to a served profile, "
     "sharing its concurrency slots among them, ready turns in submit order."},
    {TW_SEC_WORKER, "max_delegation_depth", TW_PT_INT, G(worker.max_delegation_depth), 0, 64, "8", TW_RELOAD,
     NULL, NULL,
     "Delegation: a submitted turn is at depth 0, its child turns at 1, theirs at 2, ... A delegating call "
     "from a turn at this depth fails at once with error code delegation_depth (0: no delegation at all)."},
    {TW_SEC_WORKER, "max_tree_turns", TW_PT_INT, G(worker.max_tree_turns), 1, 1000000, "10000", TW_RELOAD,
     NULL, NULL,
     "The turns of one delegation tree (a submitted turn, its children, theirs, ...): a delegating call "
     "that would make its tree larger fails at once with error code delegation_limit."},
    {TW_SEC_WORKER, "metrics_listen", TW_PT_STR, G(worker.metrics_listen), 0, 0, "", TW_RELOAD, NULL, NULL,
     "host:port for this worker's /metrics and /healthz, as [pmo] metrics_listen (a worker and a PMO on one "
     "host need two ports). Empty: off."},
    POLICY_ROWS(TW_SEC_WORKER, W, DEF, NO_EX),
    LIMIT_ROWS(TW_SEC_WORKER, W, DEF, NO_EX),
    {TW_SEC_LOG, "format", TW_PT_STR, G(log.format), 0, 0, "text", TW_RELOAD, "text|json", NULL,
     "text lines, or json: one object per line with ts, level, daemon, pid, msg and the event's fields "
     "(agent, turn_id, epoch, rule, lateness_ms, ...)."},
    {TW_SEC_LOG, "level", TW_PT_STR, G(log.level), 0, 0, "info", TW_RELOAD, "debug|info|warn|error", NULL,
     "The least severe level logged (-v on the command line is debug)."},
    {TW_SEC_AGENT, "exec", TW_PT_ARGV, A(argv), 0, 0, NULL, TW_RELOAD, NULL, "/path/to/program arg ...",
     "The agent program and its arguments: an absolute path, started with execve (no shell, no PATH "
     "search); '...', \"...\" and backslash quote spaces. Required."},
    {TW_SEC_AGENT, "step_timeout_seconds", TW_PT_INT, A(step_timeout_sec), 1, TW_TIMEOUT_MAX_SEC, "120",
     TW_RELOAD, NULL, NULL,
     "A step that runs longer is stopped: SIGTERM, then SIGKILL after kill_grace_seconds."},
    {TW_SEC_AGENT, "kill_grace_seconds", TW_PT_INT, A(kill_grace_sec), 1, 3600, "5", TW_RELOAD, NULL, NULL,
     "How long a stopped step's program has between SIGTERM and SIGKILL."},
    POLICY_ROWS(TW_SEC_AGENT, A, NO_DEF, EX),
    {TW_SEC_AGENT, "mode", TW_PT_STR, A(mode), 0, 0, "exec", TW_RELOAD, "exec|serve", NULL,
     "exec starts the program for every step. serve starts it once per worker slot, when first needed, and "
     "keeps it: each step goes to its stdin as one JSON line and its reply is one line on stdout; "
     "TURNWATCH_MODE=serve is in its environment. Agents with the same exec line (and limits) share these "
     "processes. A serve process that exits, writes a bad line or outlives its step is replaced, and only "
     "that step fails."},
    {TW_SEC_AGENT, "max_requests", TW_PT_INT, A(max_requests), 1, 1000000000, "1000", TW_RELOAD, NULL, NULL,
     "serve: a process is replaced after this many steps."},
    LIMIT_ROWS(TW_SEC_AGENT, A, NO_DEF, EX),
    /* Flow control (docs/flow-control.md): the limits a turn of this profile holds while it runs. */
    {TW_SEC_AGENT, "limits", TW_PT_LIST, A(flow_limits), 0, 0, "", TW_RELOAD, NULL, NULL,
     "Flow control: the [limit.NAME] sections a turn of this profile must hold from its dispatch until it "
     "suspends or ends (a resumed turn asks again); a turn that cannot have them all stays pending, "
     "waiting_limit:NAME, until it can (docs/flow-control.md). Empty: none."},
    {TW_SEC_TOOL, "exec", TW_PT_ARGV, T(argv), 0, 0, NULL, TW_RELOAD, NULL, "/path/to/program arg ...",
     "The tool program, as for agents. Omit it, with external set to true, for a tool whose results are "
     "posted from outside with `turnwatch tool-result`; or set agent_profile instead."},
    {TW_SEC_TOOL, "external", TW_PT_BOOL, T(external), 0, 0, "false", TW_RELOAD, NULL, NULL,
     "true: the tool has no program; its results are posted from outside with `turnwatch tool-result`."},
    {TW_SEC_TOOL, "timeout_seconds", TW_PT_INT, T(timeout_sec), 1, TW_TIMEOUT_MAX_SEC, NULL, TW_RELOAD, NULL,
     "30",
     "How long one call may run before the program is stopped (SIGTERM, then SIGKILL 5 s later) and the call "
     "reported as tool_timeout. No default: a call's own timeout_seconds wins over this, this over the "
     "agent's tool_timeout_seconds, that over [worker] tool_timeout_seconds."},
    {TW_SEC_TOOL, "suspend_timeout_seconds", TW_PT_INT, T(suspend_timeout_sec), 1, TW_TIMEOUT_MAX_SEC, "60",
     TW_RELOAD, NULL, NULL,
     "How long the turn waits for a call of this tool at least (see [worker] suspend_timeout_seconds)."},
    {TW_SEC_TOOL, "agent_profile", TW_PT_STR, T(agent_profile), 0, 0, NULL, TW_RELOAD, NULL, "NAME",
     "Delegation, instead of exec: each call runs as a child turn on a new agent of this profile (id "
     "PROFILE-<12 hex>), or on the existing agent args.agent of that profile, with args.input as its input; "
     "the child's result is the call's result (ok with its output, or error child_failed, child_timeout or "
     "child_cancelled), the call's deadline bounds the child (args.timeout_seconds may only shorten it), and "
     "a call that times out or a parent that ends cancels the child and its own children."},
    {TW_SEC_TOOL, "mode", TW_PT_STR, T(mode), 0, 0, "exec", TW_RELOAD, "exec|serve", NULL,
     "exec or serve, as for agents: in serve mode each call is one JSON line to a long-lived process. An "
     "external tool has no program to serve."},
    {TW_SEC_TOOL, "max_requests", TW_PT_INT, T(max_requests), 1, 1000000000, "1000", TW_RELOAD, NULL, NULL,
     "serve: a process is replaced after this many calls."},
    LIMIT_ROWS(TW_SEC_TOOL, T, NO_DEF, EX),
    /* Flow control (docs/flow-control.md): the limits a call of the tool holds, and a cap of its own. */
    {TW_SEC_TOOL, "limits", TW_PT_LIST, T(flow_limits), 0, 0, "", TW_RELOAD, NULL, NULL,
     "Flow control: the [limit.NAME] sections every call of this tool must hold (a comma list); a call that "
     "cannot have them all waits, waiting_limit, until it can (docs/flow-control.md). Empty: none."},
    {TW_SEC_TOOL, "max_concurrent", TW_PT_INT, T(max_concurrent), 0, 1000000, "0", TW_RELOAD, NULL, NULL,
     "Flow control shorthand: at most this many calls of this tool at once across every worker (a limit of "
     "its own, tool-NAME). 0: no cap of its own."},
    {TW_SEC_TOOL, "rate_limited_retries", TW_PT_INT, T(rate_limited_retries), 0, 100, "3", TW_RELOAD, NULL,
     NULL,
     "How many times a call whose tool answered rate_limited (with retry_after_seconds) is run again, after "
     "the pause it asked for and within the turn's deadline; after the last, the call ends error "
     "rate_limited."},
    {TW_SEC_TOOL, "kill_grace_seconds", TW_PT_INT, T(kill_grace_sec), 1, 3600, "5", TW_RELOAD, NULL, NULL,
     "How long a stopped tool program (or MCP server) has between SIGTERM and SIGKILL; for an MCP server, "
     "also how long it has to answer a ping after one of its calls timed out before it is taken as wedged."},
    /* MCP servers as tools (docs/mcp.md). */
    {TW_SEC_TOOL, "mcp", TW_PT_ARGV, T(mcp_argv), 0, 0, NULL, TW_RELOAD, NULL, "/usr/bin/node server.js",
     "A Model Context Protocol server, instead of exec: its argv as for exec (no shell), started once per "
     "worker when a call first needs it and spoken to over stdio (JSON-RPC 2.0: initialize, then tools/call "
     "with the call's args as arguments). It takes many calls at once (mcp_max_inflight); it is started "
     "again when it exits or stops answering ping. Not with exec, mode, external or agent_profile."},
    {TW_SEC_TOOL, "mcp_tool", TW_PT_STR, T(mcp_tool), 0, 0, NULL, TW_RELOAD, NULL, "NAME",
     "mcp: the name of the server's tool that a call of this section calls. Default: the section's name."},
    {TW_SEC_TOOL, "mcp_max_inflight", TW_PT_INT, T(mcp_max_inflight), 1, 10000, "16", TW_RELOAD, NULL, NULL,
     "mcp: at most this many calls in flight on the server at once; the others wait in the worker for one "
     "to end."},
    {TW_SEC_LIMIT, "max_concurrent", TW_PT_INT, L(max_concurrent), 0, 1000000, "0", TW_RELOAD, NULL, NULL,
     "At most this many holders at once across every worker (with per_key: per key). 0: no cap."},
    {TW_SEC_LIMIT, "rate", TW_PT_STR, L(rate), 0, 0, "", TW_RELOAD, NULL, NULL,
     "N/S: a token bucket of N starts per S seconds, refilled continuously, holding at most burst; each "
     "start "
     "takes a token. Empty: no rate."},
    {TW_SEC_LIMIT, "burst", TW_PT_INT, L(burst), 0, 1000000, "0", TW_RELOAD, NULL, NULL,
     "The token bucket's size (only with a rate). 0: N of the rate."},
    {TW_SEC_LIMIT, "per_key", TW_PT_BOOL, L(per_key), 0, 0, "false", TW_RELOAD, NULL, NULL,
     "true: the cap and the rate apply to each limit_key (a turn's tenant, say) separately."},
    {TW_SEC_LIMIT, "max_wait_seconds", TW_PT_INT, L(max_wait_sec), 0, TW_TIMEOUT_MAX_SEC, "0", TW_RELOAD,
     NULL, NULL,
     "A call that waited this long for the limit ends error limit_timeout. 0: as long as the turn's deadline "
     "allows."},
    {TW_SEC_SCHEDULE, "agent", TW_PT_STR, S(agent), 0, 0, NULL, TW_RELOAD, NULL, "inbox",
     "The agent each tick submits a turn to (required)."},
    {TW_SEC_SCHEDULE, "profile", TW_PT_STR, S(profile), 0, 0, "", TW_RELOAD, NULL, NULL,
     "The agent's profile, when the agent may not exist yet (added with it at the first tick). Empty: the "
     "agent's own."},
    {TW_SEC_SCHEDULE, "cron", TW_PT_STR, S(cron), 0, 0, NULL, TW_RELOAD, NULL, "0 9 * * mon-fri",
     "When it fires: five fields (minute hour day-of-month month day-of-week), with *, */n, ranges, lists "
     "and names of days and months (required; docs/schedules.md). A change takes effect at the reload: the "
     "next tick is the new "
     "cron's first after it."},
    {TW_SEC_SCHEDULE, "timezone", TW_PT_STR, S(timezone), 0, 0, "UTC", TW_RELOAD, NULL, NULL,
     "The IANA time zone the cron is read in; daylight saving is honoured."},
    {TW_SEC_SCHEDULE, "channel", TW_PT_STR, S(channel), 0, 0, "", TW_RELOAD, NULL, NULL,
     "The turns' channel. Empty: schedule:NAME."},
    {TW_SEC_SCHEDULE, "input", TW_PT_STR, S(input), 0, 0, "{}", TW_RELOAD, NULL, NULL,
     "The turns' input: a JSON object on one line."},
    {TW_SEC_SCHEDULE, "timeout_seconds", TW_PT_INT, S(timeout_sec), 0, TW_TURN_TIMEOUT_MAX_SEC, "0",
     TW_RELOAD, NULL, NULL, "Each turn's deadline (as submit --timeout). 0: none."},
    {TW_SEC_SCHEDULE, "limit_key", TW_PT_STR, S(limit_key), 0, 0, "", TW_RELOAD, NULL, NULL,
     "The turns' limit_key (flow control). Empty: none."},
    {TW_SEC_SCHEDULE, "overlap", TW_PT_STR, S(overlap), 0, 0, "skip", TW_RELOAD, "skip|queue|cancel_previous",
     NULL,
     "A tick while the last turn has not ended: skip (nothing submitted, the tick recorded as skipped), "
     "queue "
     "(submitted behind it) or cancel_previous (the last turn cancelled, then submitted)."},
    {TW_SEC_SCHEDULE, "catchup", TW_PT_STR, S(catchup), 0, 0, "last", TW_RELOAD, "none|last|all", NULL,
     "Ticks missed while no PMO ran (reached more than 60 s late): none (each recorded as skipped), last "
     "(the "
     "latest within catchup_window_seconds fires) or all (each within the window fires)."},
    {TW_SEC_SCHEDULE, "catchup_window_seconds", TW_PT_INT, S(catchup_window_sec), 0, TW_TURN_TIMEOUT_MAX_SEC,
     "3600", TW_RELOAD, NULL, NULL, "How old a missed tick may be and still fire (catchup last or all)."},
};
#define N_PARAMS (sizeof params / sizeof params[0])
_Static_assert(N_PARAMS <= TW_CONFIG_MAX_PARAMS, "grow TW_CONFIG_MAX_PARAMS");

int tw_config_param_index(TwSection sec, const char *key)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && strcmp(params[i].key, key) == 0)
            return (int)i;
    abort(); /* a typo in the caller's code, not a runtime condition */
}

static const char *section_names[] = {"postgres", "nats", "pmo",   "worker",  "log",
                                      "agent",    "tool", "limit", "schedule"};

static const TwSectionDoc section_docs[] = {
    {"postgres", "The database, which holds the truth: every daemon and the CLI connect to it."},
    {"nats",
     "NATS, the doorbell, and the optional JetStream stream that keeps the events. Authentication: at "
     "most one way; empty is unset. Secrets are read from files, never written here, and never "
     "logged. The daemons read the files at start; --check-config and the start fail when one cannot "
     "be read. A server that refuses them is logged as such, and tried again."},
    {"pmo", "turnwatch-pmo: dispatch, and the watchdogs that judge turns (2.4-2.7, turn deadlines)."},
    {"worker",
     "turnwatch-worker: the agent and tool programs it runs and the watchdogs of its work (2.1-2.3); "
     "and the defaults of every agent's timeout policy and every program's limits."},
    {"log", "The daemons log to stderr (journald picks it up)."},
    {"agent.NAME",
     "One section per profile: a program with its timeouts. Names: [A-Za-z0-9_-]{1,64}. Each profile is "
     "also an agent of the same name; any number of further agents can be bound to it (`turnwatch agent add "
     "ID --profile NAME`, or `submit --agent ID --profile NAME`), each running one turn at a time."},
    {"tool.NAME", "One section per tool: a program (exec), a tool whose results are posted from outside "
                  "(external), or a delegation to an agent profile (agent_profile)."},
    {"limit.NAME",
     "Flow control: one section per limit that tool calls hold ([tool.NAME] limits = NAME), enforced in "
     "PostgreSQL across every worker: a cap on holders at once, a rate of starts, or both "
     "(docs/flow-control.md). "
     "Names: [A-Za-z0-9_-]{1,64}. Run-time limits: turnwatch limits set; a name in this file is the file's."},
    {"schedule.NAME",
     "Schedules (docs/schedules.md): one section per schedule, a turn submitted to an agent on a calendar, "
     "exactly once per tick whatever the number of PMOs, which apply these at start and at a reload (a "
     "section "
     "removed is a schedule removed). Names: [A-Za-z0-9_-]{1,64}. Run-time schedules: turnwatch schedules "
     "add; "
     "a name in this file is the file's."},
};

static const TwParamGroup groups[] = {
    {TW_SEC_WORKER, "max_attempts",
     "Timeout policies: the defaults of every agent; an [agent.NAME] section may set any of them for itself. "
     "The daemons publish each agent's policy to the database when they connect."},
    {TW_SEC_WORKER, "memory_limit_mb",
     "Limits on the agent and tool programs: the defaults of every agent and tool section, which may set any "
     "of them for itself. Set in the program's process before it starts; 0 is no limit. A program stopped by "
     "its memory or CPU limit fails its step (or call) with error code resource_limit."},
    {TW_SEC_AGENT, "max_attempts",
     "The timeout policy keys of [worker], for this agent alone; unset, "
     "[worker]'s apply."},
    {TW_SEC_AGENT, "memory_limit_mb",
     "The limits keys of [worker], for this agent alone; unset, [worker]'s "
     "apply."},
    {TW_SEC_TOOL, "memory_limit_mb",
     "The limits keys of [worker], for this tool alone; unset, [worker]'s "
     "apply."},
};

const TwSectionDoc *tw_config_section_doc(TwSection s)
{
    return &section_docs[s];
}

const TwParamGroup *tw_config_param_groups(size_t *n)
{
    *n = sizeof groups / sizeof groups[0];
    return groups;
}

const TwParam *tw_config_params(size_t *n)
{
    *n = N_PARAMS;
    return params;
}

const char *tw_config_section_name(TwSection s)
{
    return section_names[s];
}

int tw_config_line(const TwConfig *cfg, TwSection sec, const char *key)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && strcmp(params[i].key, key) == 0)
            return sec <= TW_SEC_LOG ? cfg->line_of[i] : 0;
    return 0;
}

void tw_config_error(TwConfig *cfg, int line, const char *fmt, ...)
{
    const char *file = cfg->path ? cfg->path : "(config)";
    char msg[1024], *grown;
    va_list ap;
    int n;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        n = snprintf(NULL, 0, "%s:%d: %s\n", file, line, msg);
    else
        n = snprintf(NULL, 0, "%s: %s\n", file, msg);
    grown = realloc(cfg->errors, cfg->errors_len + (size_t)n + 1);
    if (!grown)
        return;
    cfg->errors = grown;
    if (line > 0)
        snprintf(cfg->errors + cfg->errors_len, (size_t)n + 1, "%s:%d: %s\n", file, line, msg);
    else
        snprintf(cfg->errors + cfg->errors_len, (size_t)n + 1, "%s: %s\n", file, msg);
    cfg->errors_len += (size_t)n;
    cfg->n_errors++;
}

const TwAgentConf *tw_config_agent(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_agents; i++)
        if (strcmp(cfg->agents[i].name, name) == 0)
            return &cfg->agents[i];
    return NULL;
}

const TwToolConf *tw_config_tool(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_tools; i++)
        if (strcmp(cfg->tools[i].name, name) == 0)
            return &cfg->tools[i];
    return NULL;
}

const TwScheduleConf *tw_config_schedule(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_schedules; i++)
        if (strcmp(cfg->schedules[i].name, name) == 0)
            return &cfg->schedules[i];
    return NULL;
}

const TwFlowLimitConf *tw_config_flow_limit(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_flow_limits; i++)
        if (strcmp(cfg->flow_limits[i].name, name) == 0)
            return &cfg->flow_limits[i];
    return NULL;
}

bool tw_config_serves(const TwConfig *cfg, const char *name)
{
    const char *p = cfg->worker.agents;
    size_t n = strlen(name);

    const char *item;
    size_t len;

    if (strcmp(p, "*") == 0)
        return true;
    while ((p = tw_list_next(p, &item, &len)))
        if (len == n && strncmp(item, name, n) == 0)
            return true;
    return false;
}

/* A heap configuration's users (config.h). */
TwConfig *tw_config_ref(TwConfig *cfg)
{
    if (cfg)
        cfg->refs++;
    return cfg;
}

void tw_config_unref(TwConfig *cfg)
{
    if (!cfg)
        return;
    if (cfg->refs-- > 0)
        return;
    tw_config_free(cfg);
    free(cfg);
}
