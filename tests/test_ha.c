/* test_ha.c — high availability (issue 27, contract section 17) on real engines: a pg_auto_failover formation
 * (a monitor, a primary, a synchronous standby) and a cluster of three nats-servers with JetStream, both made
 * by tools/lib/ha-formation in the fixture's directory. The daemons (two PMOs, two workers) and the CLI run
 * with the two-host DSN (target_session_attrs=read-write) and the three NATS URLs. Under load: the primary's
 * postmaster SIGKILLed, a switchover, a nats-server killed, the events stream's leader killed twice; then
 * every turn the CLI acknowledged has ended with exactly one final event, no inbox item is left processing,
 * the outbox is drained and every final event is in the stream. And the answer of a retried submit, given on
 * a primary that is about to be demoted, names a turn that survives the rewind.
 *
 * Skipped, with a message, only where pg_auto_failover cannot be installed (not root, no package). Slow: each
 * PostgreSQL case makes a formation (about 30 s) and waits out a failover; the load is modest for two cores.
 */
#include "turn_helpers.h"

#include <nats/nats.h>
#include <signal.h>
#include <unistd.h>

#include "bus.h"
#include "suite.h"

/* Generous: a failover takes seconds, and everything on this machine shares two cores. */
#define HA_WAIT_MS 180000
#define HA_TURNS 100
#define HA_STREAM "twevents"

/* The formation of the running test, stopped at exit whatever way the test ends. */
static char *ha_dir;

static void ha_stop(void)
{
    if (!ha_dir)
        return;
    char *path = NULL;
    if (asprintf(&path, "%s/tools/lib/ha-formation", tw_fx_source_dir()) > 0) {
        const char *argv[] = {path, "stop", ha_dir, NULL};
        (void)tw_fx_run_full(argv, NULL, NULL, NULL, 120000);
    }
    free(path);
    free(ha_dir);
    ha_dir = NULL;
}

static char *ha_script(void)
{
    char *path = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/tools/lib/ha-formation", tw_fx_source_dir()), 0);
    return path;
}

/* Runs `ha-formation CMD <dir> [ARG]`; its exit code, its stdout in *out (may be NULL). */
static int ha_run(const char *cmd, const char *arg, char **out)
{
    char *path = ha_script(), *err = NULL;
    const char *argv[] = {path, cmd, ha_dir, arg, NULL};
    if (out)
        *out = NULL;
    int rc = tw_fx_run_full(argv, NULL, out, &err, HA_WAIT_MS);
    if (rc != 0)
        fprintf(stderr, "ha-formation %s %s: exit %d: %s\n", cmd, arg ? arg : "", rc, err ? err : "");
    free(err);
    free(path);
    return rc;
}

static char *ha_env(const char *key)
{
    char *path = NULL, line[1024], *val = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/ha.env", ha_dir), 0);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    size_t n = strlen(key);
    while (!val && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == '=') {
            line[strcspn(line, "\n")] = '\0';
            val = strdup(line + n + 1);
        }
    fclose(f);
    free(path);
    ck_assert_msg(val != NULL, "%s not in ha.env", key);
    return val;
}

/* Makes the formation in <fixture dir>/ha (flags: "--no-pg" for NATS alone) and points the fixture at it;
 * false (the test is skipped) when pg_auto_failover cannot be installed. */
static bool ha_start(TwFx *fx, const char *flags)
{
    char *path = ha_script(), *err = NULL;
    const char *deps[] = {path, "deps", NULL};
    if (tw_fx_run_full(deps, NULL, NULL, &err, 600000) != 0) {
        fprintf(
            stderr,
            "test_ha: SKIPPED: pg_auto_failover (Debian pg-auto-failover-cli, postgresql-15-auto-failover) "
            "cannot be installed here: %s\n",
            err ? err : "");
        free(err);
        free(path);
        return false;
    }
    free(err);
    free(path);
    ck_assert_int_gt(asprintf(&ha_dir, "%s/ha", tw_fx_dir(fx)), 0);
    atexit(ha_stop);
    ck_assert_msg(ha_run("start", flags, NULL) == 0, "the formation did not start (logs in %s)", ha_dir);
    char *nats = ha_env("HA_NATS_URL");
    char *dsn = flags && strstr(flags, "--no-pg") ? NULL : ha_env("HA_DSN");
    tw_fx_use_servers(fx, dsn, nats);
    free(dsn);
    free(nats);
    return true;
}

/* The daemons' config on the formation: both hosts, every NATS server, the stream at three replicas. */
static const char ha_overrides[] = "[postgres]\n"
                                   "query_timeout_seconds = 10\n"
                                   "[nats]\n"
                                   "events_stream = " HA_STREAM "\n"
                                   "events_max_age_seconds = 3600\n"
                                   "events_replicas = 3\n";

typedef struct HaStack {
    TwFx *fx;
    TwFxEvents *ev;
    TwFxProc *pmo[2], *worker[2];
} HaStack;

static void ha_daemons(HaStack *st)
{
    for (int i = 0; i < 2; i++) {
        st->pmo[i] = tw_fx_start_pmo(st->fx, NULL);
        st->worker[i] = tw_fx_start_worker(st->fx, NULL);
    }
}

static void ha_dump(const HaStack *st)
{
    for (int i = 0; i < 2; i++) {
        tw_fx_proc_dump(st->pmo[i]);
        tw_fx_proc_dump(st->worker[i]);
    }
}

/* The load: turns of the test agent that sleep a little (so some run while the fault strikes), submitted by
 * the CLI with idempotency keys (a submit whose connection is lost is repeated safely). acked[i] is the id
 * the CLI printed, NULL when it gave up. `fault` runs once half of them are in. */
static void ha_load(HaStack *st, char **acked, int n, void (*fault)(HaStack *st, void *arg), void *arg)
{
    for (int i = 0; i < n; i++) {
        char key[32], input[96], *out = NULL, *err = NULL;
        if (i == n / 2 && fault)
            fault(st, arg);
        snprintf(key, sizeof key, "ha-%d", i);
        snprintf(input, sizeof input, "{\"mode\":\"sleep\",\"seconds\":%.1f}", 0.1 * (i % 5));
        int rc = tw_fx_cli(st->fx, &out, &err, "submit", "--agent", "tester", "--channel", "c", "--input",
                           input, "--idempotency-key", key, NULL);
        acked[i] = rc == 0 && out && strlen(out) >= 36 ? strndup(out, 36) : NULL;
        if (!acked[i])
            fprintf(stderr, "submit %d not acknowledged (exit %d): %s\n", i, rc, err ? err : "");
        free(out);
        free(err);
    }
}

/* Every acknowledged turn ended (done), each with exactly one final event in the outbox and that one seen on
 * NATS; no inbox item left processing; the outbox drained. */
static void ha_check(HaStack *st, char **acked, int n)
{
    TwFx *fx = st->fx;
    int nacked = 0;

    for (int i = 0; i < n; i++) {
        if (!acked[i])
            continue;
        nacked++;
        if (!tw_fx_sql_wait(fx, HA_WAIT_MS, "done", "SELECT status FROM state.turns WHERE turn_id = $1", 1,
                            acked[i])) {
            ha_dump(st);
            ck_abort_msg("acknowledged turn %s (%d) did not end done: %s", acked[i], i,
                         tw_fx_keep(fx, tw_fx_sql_str(fx, "SELECT status FROM state.turns WHERE turn_id = $1",
                                                      1, acked[i])));
        }
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1,
                          acked[i]),
            1);
        char *id = tw_fx_sql_str(
            fx, "SELECT event_id::text FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, acked[i]);
        if (!tw_fx_events_wait(st->ev, "evt.agent.*.task", id, 1, HA_WAIT_MS)) {
            tw_fx_events_dump(st->ev);
            ck_abort_msg("the final event %s of turn %s was never seen", id, acked[i]);
        }
        /* At least once on NATS, but always the same event: no second final event under another id. */
        ck_assert_int_eq(tw_fx_events_count(st->ev, "evt.agent.*.task", acked[i]),
                         tw_fx_events_count(st->ev, "evt.agent.*.task", id));
        free(id);
    }
    ck_assert_msg(nacked >= n * 9 / 10, "only %d of %d submits acknowledged", nacked, n);
    /* Every turn in the database ended, also those whose submit was not acknowledged but committed. */
    ck_assert_msg(
        tw_fx_sql_wait(fx, HA_WAIT_MS, "0",
                       "SELECT count(*) FROM state.turns WHERE status NOT IN ('done','failed','timeout',"
                       "'cancelled')",
                       0),
        "turns left unended");
    ck_assert_msg(tw_fx_sql_wait(fx, HA_WAIT_MS, "0",
                                 "SELECT count(*) FROM state.agent_inbox WHERE status = 'processing'", 0),
                  "inbox items left processing");
    ck_assert_msg(tw_fx_sql_wait(fx, HA_WAIT_MS, "0",
                                 "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0),
                  "the outbox was not drained");
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM (SELECT turn_id FROM state.outbox WHERE kind = 'task' "
                      "GROUP BY turn_id HAVING count(*) > 1) x",
                      0),
        0);
}

static void ha_free_acked(char **acked, int n)
{
    for (int i = 0; i < n; i++)
        free(acked[i]);
}

/* Lines of a daemon's log that contain `needle`. */
static int ha_log_count(TwFxProc *p, const char *needle)
{
    char *log = tw_fx_proc_log(p);
    int n = 0;
    for (const char *q = log; (q = strstr(q, needle)); q++)
        n++;
    free(log);
    return n;
}

static void ha_stop_daemons(HaStack *st)
{
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(tw_fx_proc_terminate(st->worker[i], 30000), 0);
        ck_assert_int_eq(tw_fx_proc_terminate(st->pmo[i], 30000), 0);
    }
}

/* ---- PostgreSQL: the primary's postmaster SIGKILLed, a switchover
 * ---------------------------------------------------------------------------- */

static int64_t ha_fault_at;

static void fault_kill_primary(HaStack *st, void *arg)
{
    char *out = NULL;
    (void)st;
    (void)arg;
    ha_fault_at = tw_fx_now_ms();
    ck_assert_int_eq(ha_run("kill-primary", NULL, &out), 0);
    fprintf(stderr, "test_ha: killed the postmaster of %s", out);
    free(out);
}

static void fault_switchover(HaStack *st, void *arg)
{
    (void)st;
    (void)arg;
    ha_fault_at = tw_fx_now_ms();
    /* In the background: the load goes on while pg_autoctl waits for the switchover to complete. */
    char *path = ha_script();
    const char *argv[] = {path, "switchover", ha_dir, NULL};
    *(TwFxProc **)arg = tw_fx_spawn(st->fx, "switchover", argv);
    free(path);
}

static void ha_pg_case(bool switchover)
{
    TwFx *fx = tw_fx_new();
    HaStack st = {.fx = fx};
    char *acked[HA_TURNS] = {0};
    TwFxProc *sw = NULL;

    if (!ha_start(fx, NULL)) {
        tw_fx_free(fx);
        return;
    }
    tw_fx_write_config(fx, NULL, ha_overrides);
    tw_fx_migrate(fx);
    st.ev = tw_fx_events_new(fx, "evt.agent.>");
    ha_daemons(&st);
    char *before = NULL, *after = NULL;
    ck_assert_int_eq(ha_run("primary", NULL, &before), 0);
    ha_load(&st, acked, HA_TURNS, switchover ? fault_switchover : fault_kill_primary, &sw);
    ha_check(&st, acked, HA_TURNS);
    if (sw) {
        int status = 0;
        ck_assert(tw_fx_proc_wait(sw, HA_WAIT_MS, &status));
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pg_autoctl perform switchover failed");
    }
    /* The new primary is another node, and the formation settles again (the old primary follows it). */
    ck_assert_int_eq(ha_run("wait-stable", "180", NULL), 0);
    ck_assert_int_eq(ha_run("primary", NULL, &after), 0);
    fprintf(stderr, "test_ha: primary before %s, after %s", before, after);
    ck_assert_msg(strcmp(before, after) != 0, "no failover: the primary is still %s", after);
    free(before);
    free(after);
    for (int i = 0; i < 2; i++) {
        /* A session refused as read-only is dropped at once: one line per connection, not a loop. */
        int pmo_ro = ha_log_count(st.pmo[i], "read-only"), wrk_ro = ha_log_count(st.worker[i], "read-only");
        fprintf(stderr, "test_ha: read-only lines: pmo %d, worker %d\n", pmo_ro, wrk_ro);
        ck_assert_msg(pmo_ro <= 12 && wrk_ro <= 12, "read-only refusals logged %d and %d times", pmo_ro,
                      wrk_ro);
    }
    ha_stop_daemons(&st);
    ha_free_acked(acked, HA_TURNS);
    ha_stop();
    tw_fx_free(fx);
}

START_TEST(test_primary_killed_under_load)
{
    ha_pg_case(false);
}
END_TEST

START_TEST(test_switchover_under_load)
{
    ha_pg_case(true);
}
END_TEST

/* ---- the answer to a retried submit is as durable as the turn
 * ---------------------------------------------------------------------------- */

/* The scenario of issue 27: a submit's commit waits for the standby when the primary dies, so the turn exists
 * only in the old primary's WAL; the client's retry with the same key reaches that primary in its last
 * moments, finds the turn and prints its id; the old node is rewound and the turn is gone. Made exact here:
 * the primary's walsender is stopped (nothing more reaches the standby), the first submit commits locally
 * only (synchronous_commit = local: a commit whose wait was cut short), then `turnwatch submit` with the same
 * key asks the primary. Whatever id the CLI prints must exist on the new primary after the failover: before
 * the fix it printed the lost turn's id at once. */
START_TEST(test_retried_submit_survives_rewind)
{
    TwFx *fx = tw_fx_new();
    char *out = NULL, *err = NULL, *walsender, *lost;

    if (!ha_start(fx, NULL)) {
        tw_fx_free(fx);
        return;
    }
    tw_fx_write_config(fx, NULL, "[postgres]\nquery_timeout_seconds = 20\n");
    tw_fx_migrate(fx);
    walsender = tw_fx_sql_str(fx, "SELECT pid::text FROM pg_stat_replication", 0);
    ck_assert_ptr_nonnull(walsender);
    ck_assert_int_eq(kill((pid_t)atoi(walsender), SIGSTOP), 0);
    tw_fx_sql_exec(fx,
                   "BEGIN; SET LOCAL synchronous_commit = local;"
                   " SELECT tw.submit_turn_ex('echo', 'c', '{}', NULL, 'k-lost', NULL, NULL); COMMIT",
                   0);
    lost = tw_fx_sql_str(fx, "SELECT turn_id::text FROM state.turns WHERE idempotency_key = 'k-lost'", 0);
    ck_assert_ptr_nonnull(lost);

    /* The client's retry, while the standby confirms nothing. */
    const char *argv[] = {
        tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "submit", "--agent", "echo", "--channel", "c",
        "--input",        "{}", "--idempotency-key",   "k-lost", NULL};
    TwFxProc *retry = tw_fx_spawn(fx, "retry", argv);
    tw_fx_sleep_ms(2000);
    /* The primary's node dies (keeper and PostgreSQL, so that the monitor surely fails over rather than see
     * it restarted), the stopped walsender with it; once the standby is promoted, the old node comes back, is
     * rewound and follows. */
    char *before = NULL, *after = NULL, *node = NULL;
    ck_assert_int_eq(ha_run("primary", NULL, &before), 0);
    ck_assert_int_eq(ha_run("kill-node", NULL, &node), 0);
    kill((pid_t)atoi(walsender), SIGKILL);
    node[strcspn(node, "\n")] = '\0';
    int64_t deadline = tw_fx_now_ms() + HA_WAIT_MS;
    do {
        free(after);
        after = NULL;
        ck_assert_msg(tw_fx_poll(deadline), "no failover");
    } while (ha_run("primary", NULL, &after) != 0 || !after[0] || strcmp(after, before) == 0);
    int status = 0;
    ck_assert(tw_fx_proc_wait(retry, HA_WAIT_MS, &status));
    ck_assert_int_eq(ha_run("node-start", node, NULL), 0);
    ck_assert_int_eq(ha_run("wait-stable", "180", NULL), 0);
    free(before);
    free(after);
    free(node);
    out = tw_fx_proc_log(retry);
    fprintf(stderr, "test_ha: the retried submit exited %d: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            out);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        /* An id was printed: the turn must be there, on the new primary, after the rewind. */
        char id[37] = "";
        for (const char *p = out; *p && !id[0]; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
            if (strlen(p) >= 36 && p[8] == '-' && p[13] == '-')
                snprintf(id, sizeof id, "%.36s", p);
        ck_assert_msg(id[0], "no turn id in: %s", out);
        /* A wait, not one read: the formation may still be restarting the old primary as a standby. */
        ck_assert_msg(
            tw_fx_sql_wait(fx, 30000, "1", "SELECT count(*) FROM state.turns WHERE turn_id = $1", 1, id),
            "the CLI acknowledged turn %s (the turn that existed only on the old primary: %s), and it "
            "is gone after the failover",
            id, lost);
    }
    free(out);
    free(err);
    free(lost);
    free(walsender);
    ha_stop();
    tw_fx_free(fx);
}
END_TEST

/* ---- NATS: one of three servers killed, the stream's leader killed twice
 * ---------------------------------------------------------------------------- */

/* nats.c options for a comma-separated list of servers. */
static natsStatus ha_nats_options(natsOptions **opts, const char *urls)
{
    char *copy = strdup(urls), *save = NULL;
    const char *servers[8];
    int n = 0;
    natsStatus s = copy ? natsOptions_Create(opts) : NATS_NO_MEMORY;

    for (char *u = copy ? strtok_r(copy, ",", &save) : NULL; u && n < 8; u = strtok_r(NULL, ",", &save))
        servers[n++] = u;
    if (s == NATS_OK)
        s = natsOptions_SetServers(*opts, servers, n);
    free(copy);
    return s;
}

/* The final events the stream holds: event_ids (object keys) of every evt.agent.*.task message in it. */
static json_t *ha_stream_finals(const char *urls)
{
    natsConnection *nc = NULL;
    natsOptions *opts = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    json_t *ids = json_object();

    ck_assert_int_eq(ha_nats_options(&opts, urls), NATS_OK);
    ck_assert_int_eq(natsConnection_Connect(&nc, opts), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_GetStreamInfo(&si, js, HA_STREAM, NULL, &jerr), NATS_OK);
    for (uint64_t seq = si->State.FirstSeq; seq <= si->State.LastSeq; seq++) {
        natsMsg *m = NULL;
        if (js_GetMsg(&m, js, HA_STREAM, seq, NULL, &jerr) != NATS_OK)
            continue;
        const char *subject = natsMsg_GetSubject(m);
        size_t n = strlen(subject);
        if (n > 5 && strcmp(subject + n - 5, ".task") == 0) {
            json_t *e = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, NULL);
            const char *id = json_string_value(json_object_get(e, "event_id"));
            if (id)
                json_object_set_new(ids, id, json_true());
            json_decref(e);
        }
        natsMsg_Destroy(m);
    }
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(opts);
    return ids;
}

/* The server (1..3) that leads the events stream now, 0 when none does (an election). */
static int ha_stream_leader(const char *urls)
{
    natsConnection *nc = NULL;
    natsOptions *opts = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    int leader = 0;

    if (ha_nats_options(&opts, urls) == NATS_OK && natsOptions_SetTimeout(opts, 2000) == NATS_OK &&
        natsConnection_Connect(&nc, opts) == NATS_OK && natsConnection_JetStream(&js, nc, NULL) == NATS_OK &&
        js_GetStreamInfo(&si, js, HA_STREAM, NULL, &jerr) == NATS_OK && si->Cluster && si->Cluster->Leader &&
        strncmp(si->Cluster->Leader, "tw-nats-", 8) == 0)
        leader = atoi(si->Cluster->Leader + 8);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(opts);
    return leader;
}

/* The server (1..3) that leads JetStream's metadata now (its /jsz), 0 when none is known. */
static int ha_meta_leader(void)
{
    for (int i = 1; i <= 3; i++) {
        char key[32], *port, *body = NULL;
        snprintf(key, sizeof key, "HA_NATS_MPORT%d", i);
        port = ha_env(key);
        int code = tw_fx_http_get(atoi(port), "/jsz", &body);
        free(port);
        json_t *j = code == 200 && body ? json_loads(body, 0, NULL) : NULL;
        const char *leader = json_string_value(json_object_get(json_object_get(j, "meta_cluster"), "leader"));
        int n = leader && strncmp(leader, "tw-nats-", 8) == 0 ? atoi(leader + 8) : 0;
        json_decref(j);
        free(body);
        if (n)
            return n;
    }
    return 0;
}

typedef struct NatsFault {
    const char *urls;
    bool leader; /* kill the stream's leader (twice), else server 1 once */
    int kills;
} NatsFault;

/* Moves the stream's leadership until the server that leads it also leads JetStream's metadata: killing that
 * one server is the worst one loss can do (the JetStream API itself is without a leader for a while, so a
 * daemon's stream check after its reconnect fails). Returns that server. */
static int ha_worst_victim(const NatsFault *f)
{
    natsConnection *nc = NULL;
    natsOptions *opts = NULL;
    int64_t deadline = tw_fx_now_ms() + 90000;
    int stream = 0, meta = 0;

    ck_assert_int_eq(ha_nats_options(&opts, f->urls), NATS_OK);
    ck_assert_int_eq(natsConnection_Connect(&nc, opts), NATS_OK);
    for (;;) {
        stream = ha_stream_leader(f->urls);
        meta = ha_meta_leader();
        if (stream && stream == meta)
            break;
        ck_assert_msg(tw_fx_poll(deadline), "stream leader %d never met meta leader %d", stream, meta);
        if (stream && meta) {
            natsMsg *reply = NULL;
            (void)natsConnection_RequestString(&reply, nc, "$JS.API.STREAM.LEADER.STEPDOWN." HA_STREAM, "",
                                               5000);
            natsMsg_Destroy(reply);
            /* Until a new leader is elected. */
            while (ha_stream_leader(f->urls) == stream && tw_fx_poll(deadline))
                ;
        }
    }
    natsConnection_Destroy(nc);
    natsOptions_Destroy(opts);
    return stream;
}

static void fault_nats(HaStack *st, void *arg)
{
    NatsFault *f = arg;
    char which[4];
    int victim = 1;

    for (int k = 0; k < (f->leader ? 2 : 1); k++) {
        if (f->leader)
            victim = ha_worst_victim(f);
        snprintf(which, sizeof which, "%d", victim);
        fprintf(stderr, "test_ha: killing nats-server %d%s\n", victim,
                f->leader ? " (the stream's leader and JetStream's)" : "");
        ck_assert_int_eq(ha_run("nats-kill", which, NULL), 0);
        f->kills++;
        if (f->leader) {
            /* Turns end during the elections, then the server comes back for the next round. */
            for (int i = 0; i < 10; i++) {
                char *t = wd_submit(st->fx, "echo", "{}");
                free(t);
            }
            ck_assert_int_eq(ha_run("nats-start", which, NULL), 0);
        }
    }
}

static void ha_nats_case(bool leader)
{
    TwFx *fx = tw_fx_new();
    HaStack st = {.fx = fx};
    char *acked[HA_TURNS] = {0};

    tw_fx_pg_init(fx);
    if (!ha_start(fx, "--no-pg")) {
        tw_fx_free(fx);
        return;
    }
    char *urls = ha_env("HA_NATS_URL");
    NatsFault f = {.urls = urls, .leader = leader};
    tw_fx_write_config(fx, NULL, ha_overrides);
    tw_fx_migrate(fx);
    st.ev = tw_fx_events_new(fx, "evt.agent.>");
    ha_daemons(&st);
    /* The daemons made the stream at three replicas before the load starts. */
    int64_t deadline = tw_fx_now_ms() + HA_WAIT_MS;
    while (!ha_stream_leader(urls))
        ck_assert_msg(tw_fx_poll(deadline), "the daemons did not make the events stream");
    ha_load(&st, acked, HA_TURNS, fault_nats, &f);
    ck_assert_int_eq(f.kills, leader ? 2 : 1);
    ha_check(&st, acked, HA_TURNS);
    /* Every final event of every turn is in the stream (its event_id; the stream keeps one copy of each). */
    json_t *finals = NULL;
    char *missing = NULL;
    deadline = tw_fx_now_ms() + 60000;
    do {
        json_decref(finals);
        free(missing);
        missing = NULL;
        finals = ha_stream_finals(urls);
        char *all = tw_fx_sql_str(
            fx, "SELECT string_agg(event_id::text, ',') FROM state.outbox WHERE kind = 'task'", 0);
        ck_assert_ptr_nonnull(all);
        for (char *save = NULL, *id = strtok_r(all, ",", &save); id && !missing;
             id = strtok_r(NULL, ",", &save))
            if (!json_object_get(finals, id))
                missing = strdup(id);
        free(all);
    } while (missing && tw_fx_poll(deadline));
    ck_assert_msg(!missing, "final event %s is not in the %s stream (%zu final events there, %lld turns)",
                  missing, HA_STREAM, json_object_size(finals),
                  (long long)tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0));
    json_decref(finals);
    ha_stop_daemons(&st);
    ha_free_acked(acked, HA_TURNS);
    free(urls);
    ha_stop();
    tw_fx_free(fx);
}

START_TEST(test_nats_server_killed_under_load)
{
    ha_nats_case(false);
}
END_TEST

START_TEST(test_stream_leader_killed_twice)
{
    ha_nats_case(true);
}
END_TEST

TW_SUITE_DEFINE(ha, {
                        {"nats_kill", test_nats_server_killed_under_load, 400},
                        {"nats_leader", test_stream_leader_killed_twice, 400},
                        {"durable_submit", test_retried_submit_survives_rewind, 400},
                        {"pg_failover", test_primary_killed_under_load, 600},
                        {"pg_switchover", test_switchover_under_load, 600},
                    })
