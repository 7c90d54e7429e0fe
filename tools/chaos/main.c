/* turnwatch-soak: the chaos soak of docs/soak.md, run by tools/soak (which builds turnwatch and starts
 * a throwaway PostgreSQL). It starts nats-server, two PMOs and two workers, submits the seed's mixed load
 * while it injects the seed's faults, heals everything, waits for every turn to end, stops the daemons and
 * checks every invariant (check.c). Exit 0: no violation; 1: violations (listed with their turn ids); 2: the
 * soak could not run. */
#include "chaos.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHAOS_TICK_MS 10
#define CHAOS_PROGRESS_MS 10000
#define CHAOS_SETTLE_MS 30000

static volatile sig_atomic_t chaos_interrupted;
static void on_signal(int sig)
{
    chaos_interrupted = sig;
}

/* ---- options
 * --------------------------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fputs(
        "Usage: turnwatch-soak [--turns N] [--minutes M] [--seed S] [--drain SECONDS] [-v] --dir DIR\n"
        "         --build-dir DIR --dsn DSN --pg-bin DIR --pg-data DIR [--pg-user USER] --nats-bin FILE\n"
        "         --nats-port PORT\n"
        "   or: ... --dir DIR --build-dir DIR --dsn DSN --ha-dir DIR --ha-script FILE --nats-urls URLS\n"
        "The driver of tools/soak, which builds turnwatch, starts PostgreSQL and passes the server options;\n"
        "run tools/soak --help for what the soak does.\n",
        f);
}

static bool parse_options(int argc, char **argv, ChaosOptions *o)
{
    static const struct option opts[] = {
        {"turns", required_argument, NULL, 't'},
        {"minutes", required_argument, NULL, 'm'},
        {"seed", required_argument, NULL, 's'},
        {"drain", required_argument, NULL, 'D'},
        {"dir", required_argument, NULL, 'd'},
        {"build-dir", required_argument, NULL, 'b'},
        {"dsn", required_argument, NULL, 'p'},
        {"pg-bin", required_argument, NULL, 'B'},
        {"pg-data", required_argument, NULL, 'P'},
        {"pg-user", required_argument, NULL, 'u'},
        {"nats-bin", required_argument, NULL, 'n'},
        {"nats-port", required_argument, NULL, 'N'},
        {"ha-dir", required_argument, NULL, 'H'},
        {"ha-script", required_argument, NULL, 'S'},
        {"nats-urls", required_argument, NULL, 'U'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    char *end;

    *o = (ChaosOptions){.turns = 500, .minutes = 3, .drain_sec = 90};
    o->seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    o->seed %= 1000000;
    while ((c = getopt_long(argc, argv, "v", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            o->turns = (int)strtol(optarg, &end, 10);
            if (*end || o->turns < 1 || o->turns > 1000000)
                return fprintf(stderr, "turnwatch-soak: --turns must be 1 to 1000000\n"), false;
            break;
        case 'm':
            o->minutes = strtod(optarg, &end);
            if (*end || !(o->minutes > 0.05) || o->minutes > 24 * 60)
                return fprintf(stderr, "turnwatch-soak: --minutes must be above 0.05\n"), false;
            break;
        case 's':
            errno = 0;
            o->seed = strtoull(optarg, &end, 10);
            if (*end || errno)
                return fprintf(stderr, "turnwatch-soak: --seed must be a whole number\n"), false;
            break;
        case 'D':
            o->drain_sec = (int)strtol(optarg, &end, 10);
            if (*end || o->drain_sec < 1)
                return fprintf(stderr, "turnwatch-soak: --drain must be a positive number of seconds\n"),
                       false;
            break;
        case 'd':
            o->dir = optarg;
            break;
        case 'b':
            o->build = optarg;
            break;
        case 'p':
            o->dsn = optarg;
            break;
        case 'B':
            o->pg_bin = optarg;
            break;
        case 'P':
            o->pg_data = optarg;
            break;
        case 'u':
            o->pg_user = optarg;
            break;
        case 'n':
            o->nats_bin = optarg;
            break;
        case 'N':
            o->nats_port = atoi(optarg);
            break;
        case 'H':
            o->ha_dir = optarg;
            break;
        case 'S':
            o->ha_script = optarg;
            break;
        case 'U':
            o->nats_urls = optarg;
            break;
        case 'v':
            o->verbose = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return false;
        }
    }
    if (o->ha_dir ? (optind < argc || !o->dir || !o->build || !o->dsn || !o->ha_script || !o->nats_urls)
                  : (optind < argc || !o->dir || !o->build || !o->dsn || !o->pg_bin || !o->pg_data ||
                     !o->nats_bin || o->nats_port <= 0)) {
        usage(stderr);
        return false;
    }
    return true;
}

/* ---- set-up
 * ---------------------------------------------------------------------------------------------------- */

/* Short periods everywhere, so that faults turn into watchdog actions within the run: heartbeats every
 * second, a frozen worker's turns reaped after 6 s, an unanswered external call timed out after 4 s. */
static int write_config(ChaosRun *run)
{
    FILE *f = fopen(run->ini, "w");
    const char *b = run->opt.build;

    if (!f)
        return -1;
    fprintf(f,
            "; written by turnwatch-soak (seed %llu)\n"
            "[postgres]\ndsn = %s\nkeepalive_seconds = 5\n\n"
            "[nats]\nurl = %s\nevents_stream = " CHAOS_STREAM "\nevents_replicas = %d\n\n"
            "[pmo]\nwatchdog_interval_seconds = 1\ndispatched_retry_seconds = 2\ndispatched_timeout_seconds "
            "= 20\n"
            "pending_wakeup_seconds = 2\npending_wakeup_skip_seconds = 60\nactive_reap_seconds = 6\n\n"
            "[worker]\ninbox_processing_timeout_seconds = 6\nwatchdog_interval_seconds = 1\n"
            "suspend_timeout_seconds = 4\nheartbeat_seconds = 1\nconcurrency = %d\nagents = *\n\n",
            (unsigned long long)run->opt.seed, run->opt.dsn, run->nats_url, run->opt.ha_dir ? 3 : 1,
            run->plan->n_agents + 4);
    for (int i = 0; i < run->plan->n_agents; i++)
        fprintf(f,
                "[agent.soak%d]\nexec = %s/examples/agents/tw-soak-agent\nstep_timeout_seconds = %d\n"
                "kill_grace_seconds = 1\n\n",
                i, b, CHAOS_STEP_TIMEOUT_SEC);
    fprintf(f,
            "[tool.work]\nexec = %s/examples/tools/tw-soak-tool\ntimeout_seconds = 8\n"
            "suspend_timeout_seconds = 8\n\n"
            /* Flow control: half the calls hold a cap of one worker's slots across both workers (the
             * checker's invariant: never more holders than the cap). */
            "[limit.soak_cap]\nmax_concurrent = %d\n\n"
            "[tool.work_limited]\nexec = %s/examples/tools/tw-soak-tool\ntimeout_seconds = 8\n"
            "suspend_timeout_seconds = 8\nlimits = soak_cap\n\n"
            "[tool.ext]\nexternal = true\ntimeout_seconds = %d\nsuspend_timeout_seconds = %d\n",
            b, run->plan->n_agents + 4, b, CHAOS_EXT_TIMEOUT_SEC, CHAOS_EXT_TIMEOUT_SEC);
    return fclose(f) == 0 ? 0 : -1;
}

static int setup(ChaosRun *run)
{
    char path[PATH_MAX];
    char *migrate[] = {run->cli_bin, "-c", run->ini, "migrate", NULL};
    static const char *names[CHAOS_DAEMONS] = {"worker1", "worker2", "pmo1", "pmo2"};

    snprintf(path, sizeof path, "%s/cli", run->opt.dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return fprintf(stderr, "turnwatch-soak: mkdir %s: %s\n", path, strerror(errno)), -1;
    snprintf(run->ini, sizeof run->ini, "%s/soak.ini", run->opt.dir);
    snprintf(run->cli_bin, sizeof run->cli_bin, "%s/tools/turnwatch", run->opt.build);
    snprintf(run->pmo_bin, sizeof run->pmo_bin, "%s/pmo/turnwatch-pmo", run->opt.build);
    snprintf(run->worker_bin, sizeof run->worker_bin, "%s/worker/turnwatch-worker", run->opt.build);
    if (run->opt.ha_dir)
        snprintf(run->nats_url, sizeof run->nats_url, "%s", run->opt.nats_urls);
    else
        snprintf(run->nats_url, sizeof run->nats_url, "nats://127.0.0.1:%d", run->opt.nats_port);
    if (write_config(run) != 0)
        return fprintf(stderr, "turnwatch-soak: cannot write %s\n", run->ini), -1;
    /* With --ha the cluster runs already (tools/soak made the formation). */
    if (!run->opt.ha_dir && chaos_nats_start(run) != 0)
        return -1;
    for (int64_t until = chaos_now_ms(run) + 15000; !run->opt.ha_dir && !chaos_nats_accepting(run);
         usleep(50 * 1000))
        if (chaos_now_ms(run) > until)
            return fprintf(stderr, "turnwatch-soak: nats-server did not start (see %s/nats.log)\n",
                           run->opt.dir),
                   -1;
    run->nats_state = CHAOS_SRV_UP;
    run->pg_state = CHAOS_SRV_UP;
    snprintf(path, sizeof path, "%s/migrate.log", run->opt.dir);
    if (chaos_run_sync(run, migrate, path) != 0)
        return fprintf(stderr, "turnwatch-soak: turnwatch migrate failed (see %s)\n", path), -1;
    if (!(run->events = chaos_events_start(run->nats_url)))
        return -1;
    if (chaos_schedule_start(run) != 0)
        return -1;
    for (int i = 0; i < CHAOS_DAEMONS; i++) {
        ChaosDaemon *d = &run->daemons[i];
        snprintf(d->name, sizeof d->name, "%s", names[i]);
        d->binary = i < CHAOS_WORKERS ? run->worker_bin : run->pmo_bin;
        snprintf(d->log, sizeof d->log, "%s/%s.log", run->opt.dir, d->name);
        if (chaos_daemon_start(run, d) != 0)
            return -1;
    }
    return 0;
}

/* ---- the run
 * --------------------------------------------------------------------------------------------------- */

typedef enum { PHASE_CHAOS, PHASE_HEAL, PHASE_DRAIN, PHASE_SETTLE, PHASE_DONE } Phase;
static const char *phase_names[] = {"chaos", "heal", "drain", "settle", "done"};

static int unpublished_events(ChaosRun *run)
{
    PGconn *db = chaos_db(run);
    PGresult *res;
    int n = -1;

    if (!db)
        return -1;
    res = PQexec(db, "SELECT count(*) FROM state.outbox WHERE published_at IS NULL");
    if (PQresultStatus(res) == PGRES_TUPLES_OK)
        n = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return n;
}

static void progress(ChaosRun *run, Phase phase, int open)
{
    int faults = 0;
    char open_s[32];
    for (int k = 0; k < CHAOS_FAULT_N; k++)
        faults += run->faults_done[k];
    /* While a fault keeps PostgreSQL down, nobody can count the open turns. */
    if (open >= 0)
        snprintf(open_s, sizeof open_s, "%d", open);
    else
        snprintf(open_s, sizeof open_s, "? (database down)");
    fprintf(stderr, "turnwatch-soak: t=%5.0fs %-6s submitted %d/%d, open %s, events seen %zu, faults %d\n",
            (double)chaos_now_ms(run) / 1000.0, phase_names[phase], run->n_submitted, run->plan->n_turns,
            open_s, chaos_events_count(run->events), faults);
}

/* Runs the phases; false when interrupted. */
static bool run_loop(ChaosRun *run)
{
    Phase phase = PHASE_CHAOS;
    int64_t phase_at = 0, next_poll = 0, next_progress = CHAOS_PROGRESS_MS, last_progress = 0;
    int open = -1, last_open = -1, last_submitted = 0;

    run->chaos_on = true;
    while (phase != PHASE_DONE) {
        int64_t now = chaos_now_ms(run);
        if (chaos_interrupted)
            return false;
        chaos_reap(run);
        chaos_faults_tick(run, now);
        chaos_load_tick(run, now);
        if (phase == PHASE_CHAOS && now >= run->plan->chaos_ms) {
            run->chaos_on = false;
            phase = PHASE_HEAL;
            chaos_note(run, "chaos over: healing");
        }
        if (phase == PHASE_HEAL && chaos_heal_tick(run, now)) {
            phase = PHASE_DRAIN;
            phase_at = now;
            chaos_note(run, "everything up: waiting for the last turns");
        }
        if (phase >= PHASE_HEAL && phase < PHASE_DONE)
            chaos_heal_tick(run, now); /* a daemon that died on its own meanwhile comes back */
        if (now >= next_poll) {
            next_poll = now + 500;
            open = chaos_load_open_turns(run);
            if (open != last_open || run->n_submitted != last_submitted) {
                last_open = open;
                last_submitted = run->n_submitted;
                last_progress = now;
            }
            if (phase == PHASE_DRAIN) {
                /* The schedule goes first: a tick fired meanwhile is a turn to wait for. */
                if (chaos_schedule_take(run) && open == 0 && chaos_load_all_submitted(run) &&
                    chaos_load_idle(run)) {
                    chaos_note(run, "every turn ended after %.1fs of draining",
                               (double)(now - phase_at) / 1000.0);
                    phase = PHASE_SETTLE;
                    phase_at = now;
                } else if (now - last_progress > (int64_t)run->opt.drain_sec * 1000) {
                    /* Nothing moved for that long: what is still open will stay open. */
                    chaos_note(run, "drain: %d turns still open, none ended for %d s; checking", open,
                               run->opt.drain_sec);
                    fprintf(stderr, "turnwatch-soak: %d turns still open and none ended for %d s\n", open,
                            run->opt.drain_sec);
                    phase = PHASE_SETTLE;
                    phase_at = now;
                }
            } else if (phase == PHASE_SETTLE) {
                /* The outbox relay publishes what a writer could not; a second more for the last deliveries.
                 */
                int unpublished = unpublished_events(run);
                if ((unpublished == 0 && now - phase_at >= 1000) || now - phase_at > CHAOS_SETTLE_MS)
                    phase = PHASE_DONE;
            }
        }
        if (now >= next_progress) {
            next_progress = now + CHAOS_PROGRESS_MS;
            progress(run, phase, open);
        }
        usleep(CHAOS_TICK_MS * 1000);
    }
    return true;
}

/* Stops everything; with replay, reads the events stream back before nats-server stops. */
static void shutdown_all(ChaosRun *run, bool replay)
{
    int status;

    for (int i = 0; i < CHAOS_CLI_MAX; i++)
        if (run->cli[i].pid > 0) {
            kill(run->cli[i].pid, SIGKILL);
            waitpid(run->cli[i].pid, &status, 0);
            run->cli[i].pid = 0;
        }
    chaos_daemons_stop(run, 20000);
    if (replay && run->events && run->nats_state == CHAOS_SRV_UP) {
        char why[512];
        if (chaos_events_replay(run->events, CHAOS_STREAM, why, sizeof why) != 0)
            chaos_incident(run, "events stream", "%s", why);
    }
    chaos_events_stop(run->events);
    if (run->nats_pid > 0) {
        kill(run->nats_pid, SIGTERM);
        waitpid(run->nats_pid, &status, 0);
        run->nats_pid = 0;
    }
    if (run->pg_ctl_pid > 0) {
        waitpid(run->pg_ctl_pid, &status, 0);
        run->pg_ctl_pid = 0;
    }
}

int main(int argc, char **argv)
{
    ChaosRun run = {0};
    char digest[17], path[PATH_MAX];
    int violations, rc;

    chaos_journal_start();
    if (!parse_options(argc, argv, &run.opt))
        return 2;
    /* Our own process group: tools/soak stops the daemons and nats-server with it if we are killed. */
    setpgid(0, 0);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    snprintf(path, sizeof path, "%s/soak.log", run.opt.dir);
    chaos_journal_open(path, run.opt.verbose);
    run.incidents = json_array();
    run.plan = chaos_plan_new(run.opt.seed, run.opt.turns, (int64_t)(run.opt.minutes * 60000.0));
    if (!run.plan || !(run.turns = calloc((size_t)run.opt.turns, sizeof *run.turns)) ||
        chaos_load_init(&run) != 0)
        return fprintf(stderr, "turnwatch-soak: out of memory\n"), 2;
    chaos_plan_digest(run.plan, digest);
    printf("turnwatch soak: seed %llu, %d turns over %d agents, %.1f min of faults (%d planned), plan %s\n",
           (unsigned long long)run.opt.seed, run.opt.turns, run.plan->n_agents, run.opt.minutes,
           run.plan->n_faults, digest);
    printf("replay: tools/soak%s --turns %d --minutes %g --seed %llu\n", run.opt.ha_dir ? " --ha" : "",
           run.opt.turns, run.opt.minutes, (unsigned long long)run.opt.seed);
    fflush(stdout);
    rc = setup(&run);
    if (rc == 0 && !run_loop(&run)) {
        fprintf(stderr, "turnwatch-soak: interrupted\n");
        rc = 128 + (int)chaos_interrupted;
    }
    shutdown_all(&run, rc == 0);
    if (rc == 0) {
        violations = chaos_check(&run, stdout);
        if (violations < 0) {
            rc = 2;
        } else {
            printf("result: %s (%d violations)\n", violations ? "FAIL" : "PASS", violations);
            rc = violations ? 1 : 0;
        }
    } else if (rc < 0) {
        rc = 2;
    }
    chaos_events_free(run.events);
    PQfinish(run.db);
    json_decref(run.incidents);
    free(run.id_index);
    free(run.turns);
    chaos_plan_free(run.plan);
    chaos_journal_close();
    return rc;
}
