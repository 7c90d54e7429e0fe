/* The soak's load, through the turnwatch CLI as a user would drive it: `submit` (with an idempotency key, so
 * a retry after a lost answer never makes a second turn), `cancel`, and `tool-result` for the external calls
 * the plan answers. A CLI that could not reach the database is tried again; answers are read from --json
 * output. The driver's own connection only reads (which external calls wait, how many turns are open). */
#include "chaos.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define CHAOS_RETRY_MS 500
#define CHAOS_EXT_POLL_MS 200
/* A cancel or an answer that cannot get through for this long is given up (the turn has long ended). */
#define CHAOS_GIVE_UP_TRIES 240
/* A CLI that hangs this long (a connection attempt to a server that neither answers nor refuses) is killed;
 * its request is tried again like any that failed. */
#define CHAOS_CLI_TIMEOUT_MS 60000

enum { BUSY_SUBMIT = 1, BUSY_CANCEL = 2, BUSY_EXT0 = 4 };

/* The server's notices ("terminating connection due to immediate shutdown") are the faults we caused. */
static void quiet_notices(void *arg, const char *message)
{
}

PGconn *chaos_db(ChaosRun *run)
{
    int64_t now = chaos_now_ms(run);
    const char *keys[] = {"dbname", "connect_timeout", "options", "application_name", NULL};
    const char *vals[] = {run->opt.dsn, "2", "-c statement_timeout=10000", "turnwatch-soak", NULL};

    if (run->db && PQstatus(run->db) == CONNECTION_OK)
        return run->db;
    if (now < run->db_retry_ms)
        return NULL;
    PQfinish(run->db);
    run->db = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(run->db) != CONNECTION_OK) {
        PQfinish(run->db);
        run->db = NULL;
        run->db_retry_ms = now + 300;
        return NULL;
    }
    PQsetNoticeProcessor(run->db, quiet_notices, NULL);
    return run->db;
}

/* ---- turn id -> plan index
 * ------------------------------------------------------------------------------------- */

static size_t id_hash(const char *id)
{
    size_t h = 1469598103934665603ULL;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ULL;
    return h;
}

static void id_put(ChaosRun *run, int turn)
{
    size_t mask = run->id_cap - 1, i = id_hash(run->turns[turn].id) & mask;
    while (run->id_index[i] >= 0)
        i = (i + 1) & mask;
    run->id_index[i] = turn;
}

static int id_find(const ChaosRun *run, const char *id)
{
    size_t mask = run->id_cap - 1, i = id_hash(id) & mask;
    for (; run->id_index[i] >= 0; i = (i + 1) & mask)
        if (strcmp(run->turns[run->id_index[i]].id, id) == 0)
            return run->id_index[i];
    return -1;
}

static void chaos_cli_done(ChaosRun *run, ChaosCli *c, int status);

int chaos_load_init(ChaosRun *run)
{
    run->cli_done = chaos_cli_done;
    run->id_cap = 16;
    while (run->id_cap < (size_t)run->plan->n_turns * 2)
        run->id_cap *= 2;
    if (!(run->id_index = malloc(run->id_cap * sizeof *run->id_index)))
        return -1;
    for (size_t i = 0; i < run->id_cap; i++)
        run->id_index[i] = -1;
    return 0;
}

/* ---- CLI processes
 * --------------------------------------------------------------------------------------------- */

static ChaosCli *cli_slot(ChaosRun *run)
{
    for (int i = 0; i < CHAOS_CLI_MAX; i++)
        if (run->cli[i].pid == 0) {
            snprintf(run->cli[i].out, sizeof run->cli[i].out, "%s/cli/%d.out", run->opt.dir, i);
            snprintf(run->cli[i].err, sizeof run->cli[i].err, "%s/cli/%d.err", run->opt.dir, i);
            return &run->cli[i];
        }
    return NULL;
}

/* Starts `turnwatch -c INI --json ARGS...` in slot c. */
static bool cli_start(ChaosRun *run, ChaosCli *c, ChaosCliKind kind, int turn, int ext,
                      const char *const *args)
{
    char *argv[24];
    int n = 0;

    argv[n++] = run->cli_bin;
    argv[n++] = "-c";
    argv[n++] = run->ini;
    argv[n++] = "--json";
    for (; *args && n < 23; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    c->kind = kind;
    c->turn = turn;
    c->ext = ext;
    c->started_ms = chaos_now_ms(run);
    c->pid = chaos_spawn(argv, c->out, c->err, false);
    if (c->pid <= 0) {
        c->pid = 0;
        return false;
    }
    return true;
}

static json_t *read_json_file(const char *path)
{
    return json_load_file(path, JSON_DISABLE_EOF_CHECK, NULL);
}

static bool file_contains(const char *path, const char *needle)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    size_t n;

    if (!f)
        return false;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void chaos_cli_done(ChaosRun *run, ChaosCli *c, int status)
{
    ChaosTurn *t = &run->turns[c->turn];
    int64_t now = chaos_now_ms(run);
    json_t *ans = read_json_file(c->out);
    const char *s;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;

    switch (c->kind) {
    case CHAOS_CLI_SUBMIT:
        t->busy &= ~BUSY_SUBMIT;
        s = json_string_value(json_object_get(ans, "turn_id"));
        if (code == 0 && s && strlen(s) == 36) {
            snprintf(t->id, sizeof t->id, "%s", s);
            t->submitted_ms = now;
            t->next_try_ms = 0;
            id_put(run, c->turn);
            run->n_submitted++;
        } else if (code == 2) {
            /* A usage error is the soak's own mistake: retrying cannot help. */
            chaos_incident(run, "submit refused", "turn %d: the CLI refused the submit (see %s)", c->turn,
                           c->err);
            t->submit_tries = -1;
        } else {
            t->next_try_ms = now + CHAOS_RETRY_MS;
        }
        break;
    case CHAOS_CLI_CANCEL:
        t->busy &= ~BUSY_CANCEL;
        s = json_string_value(json_object_get(ans, "result"));
        if (s && (strcmp(s, "cancelled") == 0 || strcmp(s, "already_ended") == 0))
            snprintf(t->cancel_result, sizeof t->cancel_result, "%s", s);
        else
            t->cancel_next_ms = now + CHAOS_RETRY_MS;
        break;
    case CHAOS_CLI_RESULT:
        t->busy &= ~(unsigned)(BUSY_EXT0 << c->ext);
        s = json_string_value(json_object_get(ans, "result"));
        if (code == 0 && s && strcmp(s, "accepted") == 0)
            snprintf(t->ext_result[c->ext], sizeof t->ext_result[c->ext], "accepted");
        else if (code != 0 && file_contains(c->err, "nothing changed"))
            snprintf(t->ext_result[c->ext], sizeof t->ext_result[c->ext], "refused");
        else
            t->ext_next_ms[c->ext] = now + CHAOS_RETRY_MS;
        break;
    }
    json_decref(ans);
}

/* ---- the three kinds of requests
 * ------------------------------------------------------------------------------- */

static bool submit_turn(ChaosRun *run, ChaosCli *c, int i)
{
    const ChaosTurnPlan *p = &run->plan->turns[i];
    char agent[32], key[48], timeout[16];
    const char *args[16] = {"submit", "--agent",           agent, "--channel", "soak", "--input",
                            p->input, "--idempotency-key", key};
    int n = 9;

    snprintf(agent, sizeof agent, "soak%d", p->agent);
    snprintf(key, sizeof key, "soak-%d", i);
    if (p->timeout_sec > 0) {
        snprintf(timeout, sizeof timeout, "%d", p->timeout_sec);
        args[n++] = "--timeout";
        args[n++] = timeout;
    }
    args[n] = NULL;
    run->turns[i].submit_tries++;
    return cli_start(run, c, CHAOS_CLI_SUBMIT, i, 0, args);
}

static bool cancel_turn(ChaosRun *run, ChaosCli *c, int i)
{
    const char *args[] = {"cancel", run->turns[i].id, NULL};
    run->turns[i].cancel_tries++;
    return cli_start(run, c, CHAOS_CLI_CANCEL, i, 0, args);
}

static bool answer_ext(ChaosRun *run, ChaosCli *c, int i, int e)
{
    const ChaosTurnPlan *p = &run->plan->turns[i];
    char call[16], output[128];
    const char *args[] = {"tool-result",
                          "--turn",
                          run->turns[i].id,
                          "--call",
                          call,
                          "--status",
                          p->ext[e].error ? "error" : "ok",
                          "--output",
                          output,
                          NULL};

    snprintf(call, sizeof call, "ext%d", e);
    if (p->ext[e].error)
        snprintf(output, sizeof output, "{\"code\":\"soak_external_error\",\"message\":\"%s %s\"}", call,
                 run->turns[i].id);
    else
        snprintf(output, sizeof output, "{\"call\":\"%s\",\"turn\":\"%s\"}", call, run->turns[i].id);
    run->turns[i].ext_tries[e]++;
    return cli_start(run, c, CHAOS_CLI_RESULT, i, e, args);
}

/* Which external calls wait now: the first sighting of each starts its answer clock. */
static void poll_external(ChaosRun *run, int64_t now)
{
    PGconn *db = chaos_db(run);
    PGresult *res;

    if (!db)
        return;
    res = PQexec(db, "SELECT turn_id::text, tool_call_id FROM state.turn_waiting_tools "
                     "WHERE external AND wait_status = 'waiting'");
    if (PQresultStatus(res) == PGRES_TUPLES_OK) {
        for (int r = 0; r < PQntuples(res); r++) {
            int i = id_find(run, PQgetvalue(res, r, 0));
            const char *call = PQgetvalue(res, r, 1);
            if (i < 0 || strncmp(call, "ext", 3) != 0)
                continue;
            int e = atoi(call + 3);
            if (e >= 0 && e < run->plan->turns[i].n_ext && run->turns[i].ext_seen_ms[e] == 0)
                run->turns[i].ext_seen_ms[e] = now;
        }
    }
    PQclear(res);
}

void chaos_load_tick(ChaosRun *run, int64_t now)
{
    const ChaosPlan *p = run->plan;
    ChaosCli *c;

    for (int i = 0; i < CHAOS_CLI_MAX; i++)
        if (run->cli[i].pid > 0 && now - run->cli[i].started_ms > CHAOS_CLI_TIMEOUT_MS) {
            chaos_note(run, "CLI pid %d hangs for %d s; killed", (int)run->cli[i].pid,
                       CHAOS_CLI_TIMEOUT_MS / 1000);
            kill(run->cli[i].pid, SIGKILL);
            run->cli[i].started_ms = now; /* reaped by chaos_reap */
        }
    if (now >= run->ext_poll_ms) {
        poll_external(run, now);
        run->ext_poll_ms = now + CHAOS_EXT_POLL_MS;
    }
    /* Submits in plan order; the first not yet answered bounds the scan. */
    while (run->first_unsubmitted < p->n_turns &&
           (run->turns[run->first_unsubmitted].id[0] || run->turns[run->first_unsubmitted].submit_tries < 0))
        run->first_unsubmitted++;
    for (int i = run->first_unsubmitted; i < p->n_turns && p->turns[i].submit_ms <= now; i++) {
        ChaosTurn *t = &run->turns[i];
        if (t->id[0] || t->submit_tries < 0 || (t->busy & BUSY_SUBMIT) || now < t->next_try_ms)
            continue;
        if (!(c = cli_slot(run)) || !submit_turn(run, c, i))
            return;
        t->busy |= BUSY_SUBMIT;
    }
    /* Cancels and external answers, for turns that have an id: a scan of every turn, a few times a second. */
    if (now < run->scan_ms)
        return;
    run->scan_ms = now + 50;
    for (int i = 0; i < p->n_turns; i++) {
        const ChaosTurnPlan *tp = &p->turns[i];
        ChaosTurn *t = &run->turns[i];
        if (!t->id[0])
            continue;
        if (tp->cancel_after_ms >= 0 && !t->cancel_result[0] && !(t->busy & BUSY_CANCEL) &&
            t->cancel_tries < CHAOS_GIVE_UP_TRIES && now >= t->submitted_ms + tp->cancel_after_ms &&
            now >= t->cancel_next_ms) {
            if (!(c = cli_slot(run)) || !cancel_turn(run, c, i))
                return;
            t->busy |= BUSY_CANCEL;
        }
        for (int e = 0; e < tp->n_ext; e++) {
            if (tp->ext[e].answer_after_ms < 0 || t->ext_seen_ms[e] == 0 || t->ext_result[e][0] ||
                (t->busy & (unsigned)(BUSY_EXT0 << e)) || t->ext_tries[e] >= CHAOS_GIVE_UP_TRIES ||
                now < t->ext_seen_ms[e] + tp->ext[e].answer_after_ms || now < t->ext_next_ms[e])
                continue;
            if (!(c = cli_slot(run)) || !answer_ext(run, c, i, e))
                return;
            t->busy |= (unsigned)(BUSY_EXT0 << e);
        }
    }
}

bool chaos_load_all_submitted(const ChaosRun *run)
{
    for (int i = 0; i < run->plan->n_turns; i++)
        if (!run->turns[i].id[0] && run->turns[i].submit_tries >= 0)
            return false;
    return true;
}

bool chaos_load_idle(const ChaosRun *run)
{
    for (int i = 0; i < CHAOS_CLI_MAX; i++)
        if (run->cli[i].pid > 0)
            return false;
    return true;
}

int chaos_load_open_turns(ChaosRun *run)
{
    PGconn *db = chaos_db(run);
    PGresult *res;
    int n = -1;

    if (!db)
        return -1;
    res = PQexec(db, "SELECT count(*) FROM state.turns "
                     "WHERE status NOT IN ('done', 'failed', 'timeout', 'cancelled')");
    if (PQresultStatus(res) == PGRES_TUPLES_OK)
        n = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return n;
}
