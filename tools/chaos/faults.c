/* Fault injection: the plan's faults applied at their times (SIGKILL and SIGSTOP of workers and PMOs,
 * nats-server and PostgreSQL restarts), each undone after its duration, and the heal that undoes everything
 * at the end of the chaos phase. A fault whose target is already down is counted as skipped, so the schedule
 * stays the seed's. */
#include "chaos.h"

#include <signal.h>

/* A SIGTERMed daemon has this long to finish or release its work and exit 0 (a worker waits for its running
 * steps: up to the step limit). */
#define CHAOS_TERM_GRACE_MS ((CHAOS_STEP_TIMEOUT_SEC + 25) * 1000)

static ChaosDaemon *fault_daemon(ChaosRun *run, const ChaosFault *f)
{
    bool worker = f->kind == CHAOS_FAULT_WORKER_KILL || f->kind == CHAOS_FAULT_WORKER_STOP ||
                  f->kind == CHAOS_FAULT_WORKER_TERM;
    return &run->daemons[(worker ? 0 : CHAOS_WORKERS) + f->target];
}

/* `ha-formation CMD DIR [ARG]`, waited for (quick: a kill, a start, one look at the monitor); its output in
 * ha.log. */
static int ha_sync(ChaosRun *run, const char *cmd, const char *arg)
{
    char log[PATH_MAX];
    char *argv[] = {(char *)run->opt.ha_script, (char *)cmd, (char *)run->opt.ha_dir, (char *)arg, NULL};

    snprintf(log, sizeof log, "%s/ha.log", run->opt.dir);
    return chaos_run_sync(run, argv, log);
}

/* The --ha counterparts of the server faults: a NATS fault kills one server of three (which one from the
 * fault's time, so the seed decides) and starts it again after its duration; a PostgreSQL fault is a failover
 * (the primary's postmaster SIGKILLed: its keeper restarts it, the monitor promotes the standby, the old
 * primary is rewound and follows) or a switchover, each only on a settled formation (one primary, one
 * secondary), run in the background in place of pg_ctl. */
static bool fault_apply_ha(ChaosRun *run, const ChaosFault *f, int64_t now)
{
    char which[4], log[PATH_MAX];

    if (f->kind == CHAOS_FAULT_NATS_RESTART) {
        if (run->nats_state != CHAOS_SRV_UP)
            return false;
        run->ha_nats_down = (int)((f->at_ms / 1000) % 3) + 1;
        snprintf(which, sizeof which, "%d", run->ha_nats_down);
        chaos_note(run, "fault: nats-server %d killed, back in %.1fs", run->ha_nats_down,
                   (double)f->duration_ms / 1000.0);
        if (ha_sync(run, "nats-kill", which) != 0)
            return false;
        run->nats_state = CHAOS_SRV_DOWN;
        run->nats_up_at_ms = now + f->duration_ms;
        return true;
    }
    if (run->pg_ctl_pid > 0 || ha_sync(run, "wait-stable", "0") != 0)
        return false;
    bool switchover = f->kind == CHAOS_FAULT_PG_RESTART;
    char *argv[] = {(char *)run->opt.ha_script, switchover ? "switchover" : "kill-primary",
                    (char *)run->opt.ha_dir, NULL};
    snprintf(log, sizeof log, "%s/ha.log", run->opt.dir);
    chaos_note(run, "fault: PostgreSQL %s", switchover ? "switchover" : "primary's postmaster SIGKILLed");
    run->pg_ctl_pid = chaos_spawn(argv, log, log, true);
    return run->pg_ctl_pid > 0;
}

/* Applies one fault; false when its target was not in a state it applies to. */
static bool fault_apply(ChaosRun *run, const ChaosFault *f, int64_t now)
{
    ChaosDaemon *d;

    if (run->opt.ha_dir && (f->kind == CHAOS_FAULT_NATS_RESTART || f->kind == CHAOS_FAULT_PG_RESTART ||
                            f->kind == CHAOS_FAULT_PG_CRASH))
        return fault_apply_ha(run, f, now);
    switch (f->kind) {
    case CHAOS_FAULT_WORKER_KILL:
    case CHAOS_FAULT_PMO_KILL:
        d = fault_daemon(run, f);
        if (d->pid <= 0)
            return false;
        chaos_note(run, "fault: SIGKILL %s (pid %d%s), restart in %.1fs", d->name, (int)d->pid,
                   d->stopped ? ", stopped" : "", (double)f->duration_ms / 1000.0);
        chaos_daemon_signal(run, d, SIGKILL);
        d->restart_at_ms = now + f->duration_ms;
        return true;
    case CHAOS_FAULT_WORKER_STOP:
    case CHAOS_FAULT_PMO_STOP:
        d = fault_daemon(run, f);
        if (d->pid <= 0 || d->stopped)
            return false;
        chaos_note(run, "fault: SIGSTOP %s (pid %d) for %.1fs", d->name, (int)d->pid,
                   (double)f->duration_ms / 1000.0);
        chaos_daemon_signal(run, d, SIGSTOP);
        d->cont_at_ms = now + f->duration_ms;
        if (d->expect == CHAOS_EXPECT_CLEAN_EXIT)
            d->term_deadline_ms += f->duration_ms; /* frozen in its shutdown: its grace starts again after */
        return true;
    case CHAOS_FAULT_WORKER_TERM:
    case CHAOS_FAULT_PMO_TERM:
        /* A graceful restart, as an operator does it: SIGTERM, wait for the clean exit, start again. */
        d = fault_daemon(run, f);
        if (d->pid <= 0 || d->expect != CHAOS_EXPECT_NONE)
            return false;
        chaos_note(run, "fault: SIGTERM %s (pid %d%s), restart %.1fs after it exits", d->name, (int)d->pid,
                   d->stopped ? ", stopped: SIGCONT first" : "", (double)f->duration_ms / 1000.0);
        if (d->stopped)
            chaos_daemon_signal(run, d, SIGCONT);
        chaos_daemon_signal(run, d, SIGTERM);
        d->term_deadline_ms = now + CHAOS_TERM_GRACE_MS;
        d->restart_delay_ms = f->duration_ms;
        d->restart_at_ms = -1;
        return true;
    case CHAOS_FAULT_NATS_RESTART:
        if (run->nats_state != CHAOS_SRV_UP)
            return false;
        chaos_note(run, "fault: nats-server stopped for %.1fs", (double)f->duration_ms / 1000.0);
        chaos_nats_stop(run);
        run->nats_up_at_ms = now + f->duration_ms;
        return true;
    case CHAOS_FAULT_PG_RESTART:
    case CHAOS_FAULT_PG_CRASH:
        if (run->pg_state != CHAOS_SRV_UP || run->pg_ctl_pid > 0)
            return false;
        run->pg_crash = f->kind == CHAOS_FAULT_PG_CRASH;
        chaos_note(run, "fault: PostgreSQL stop -m %s, down %.1fs after it stopped",
                   run->pg_crash ? "immediate" : "fast", (double)f->duration_ms / 1000.0);
        if (chaos_pg_ctl(run, "stop", run->pg_crash ? "immediate" : "fast") != 0)
            return false;
        run->pg_state = CHAOS_SRV_STOPPING;
        /* Counted from now; a slow stop only shortens the time it stays down. */
        run->pg_up_at_ms = now + f->duration_ms;
        return true;
    default:
        return false;
    }
}

/* Undoes faults whose time is up: SIGCONT, restarts, servers back. */
static void servers_tick(ChaosRun *run, int64_t now)
{
    for (int i = 0; i < CHAOS_DAEMONS; i++) {
        ChaosDaemon *d = &run->daemons[i];
        if (d->pid > 0 && d->expect == CHAOS_EXPECT_CLEAN_EXIT && !d->stopped && now > d->term_deadline_ms) {
            chaos_incident(run, "daemon stop", "%s (pid %d) did not exit within %d s of SIGTERM; killed",
                           d->name, (int)d->pid, CHAOS_TERM_GRACE_MS / 1000);
            chaos_daemon_signal(run, d, SIGKILL);
            d->restart_at_ms = now + 1000;
        }
        if (d->pid > 0 && d->stopped && now >= d->cont_at_ms) {
            chaos_note(run, "SIGCONT %s (pid %d)", d->name, (int)d->pid);
            chaos_daemon_signal(run, d, SIGCONT);
        }
        if (d->pid <= 0 && d->restart_at_ms >= 0 && now >= d->restart_at_ms &&
            chaos_daemon_start(run, d) != 0)
            d->restart_at_ms = now + 1000;
    }
    if (run->opt.ha_dir) {
        char which[4];
        snprintf(which, sizeof which, "%d", run->ha_nats_down);
        if (run->nats_state == CHAOS_SRV_DOWN && now >= run->nats_up_at_ms) {
            if (ha_sync(run, "nats-start", which) == 0) {
                run->nats_state = CHAOS_SRV_UP;
                chaos_note(run, "nats-server %d up", run->ha_nats_down);
                run->ha_nats_down = 0;
            } else {
                run->nats_up_at_ms = now + 1000;
            }
        }
        return; /* PostgreSQL heals itself: the formation's keepers and monitor */
    }
    if (run->nats_state == CHAOS_SRV_STARTING && chaos_nats_accepting(run)) {
        run->nats_state = CHAOS_SRV_UP;
        chaos_note(run, "nats-server up");
    } else if (run->nats_state == CHAOS_SRV_DOWN && now >= run->nats_up_at_ms && chaos_nats_start(run) != 0) {
        run->nats_up_at_ms = now + 1000;
    }
    if (run->pg_state == CHAOS_SRV_DOWN && run->pg_ctl_pid <= 0 && now >= run->pg_up_at_ms) {
        if (chaos_pg_ctl(run, "start", NULL) == 0) {
            run->pg_state = CHAOS_SRV_STARTING;
            chaos_note(run, "PostgreSQL starting");
        } else {
            run->pg_up_at_ms = now + 1000;
        }
    }
}

void chaos_faults_tick(ChaosRun *run, int64_t now)
{
    const ChaosPlan *p = run->plan;

    servers_tick(run, now);
    while (run->chaos_on && run->next_fault < p->n_faults && p->faults[run->next_fault].at_ms <= now) {
        const ChaosFault *f = &p->faults[run->next_fault++];
        if (fault_apply(run, f, now))
            run->faults_done[f->kind]++;
        else
            run->faults_skipped[f->kind]++;
    }
}

bool chaos_heal_tick(ChaosRun *run, int64_t now)
{
    bool all_up = true;

    for (int i = 0; i < CHAOS_DAEMONS; i++) {
        ChaosDaemon *d = &run->daemons[i];
        if (d->stopped)
            d->cont_at_ms = now;
        if (d->pid <= 0 && (d->restart_at_ms < 0 || d->restart_at_ms > now))
            d->restart_at_ms = now;
    }
    if (run->nats_state == CHAOS_SRV_DOWN && run->nats_up_at_ms > now)
        run->nats_up_at_ms = now;
    if (run->pg_state == CHAOS_SRV_DOWN && run->pg_up_at_ms > now)
        run->pg_up_at_ms = now;
    servers_tick(run, now);
    for (int i = 0; i < CHAOS_DAEMONS; i++)
        all_up = all_up && run->daemons[i].pid > 0 && !run->daemons[i].stopped;
    /* With --ha: no switchover or failover command still running. */
    return all_up && run->nats_state == CHAOS_SRV_UP && run->pg_state == CHAOS_SRV_UP &&
           !(run->opt.ha_dir && run->pg_ctl_pid > 0);
}
