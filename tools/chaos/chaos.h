/* chaos.h — turnwatch-soak, the driver behind tools/soak (docs/soak.md): a seeded plan of turns and
 * faults (plan.c), the processes it runs and breaks (procs.c, faults.c), the load it submits through the
 * turnwatch CLI (load.c), every NATS event it sees (events.c), and the invariant check at the end (check.c).
 *
 * One thread runs everything but nats.c's callbacks (events.c keeps what they deliver under a mutex). Every
 * external program is started with posix_spawn and reaped from the main loop, so a PostgreSQL restart or a
 * slow CLI never blocks fault injection. */
#ifndef TW_CHAOS_H
#define TW_CHAOS_H

#include <jansson.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- the plan (plan.c): every random choice, drawn from the seed before the run starts
 * --------------------- */

/* The soak's timing constants: the config (main.c) and the plan (overrun, external answers) agree on them. */
#define CHAOS_STEP_TIMEOUT_SEC 15 /* [agent.*] step_timeout_seconds; an overrun step sleeps longer */
#define CHAOS_EXT_TIMEOUT_SEC 4   /* [tool.ext] timeout: an external call nobody answers times out then */
#define CHAOS_MAX_EXT 2           /* external calls per turn, named ext0 and ext1 */
#define CHAOS_STREAM "soak"       /* [nats] events_stream of the soak's daemons */

/* xoshiro256**, seeded through splitmix64: the same seed gives the same numbers on every machine. */
typedef struct ChaosRng {
    uint64_t s[4];
} ChaosRng;
void chaos_rng_seed(ChaosRng *r, uint64_t seed);
uint64_t chaos_rng_next(ChaosRng *r);
/* Uniform in [lo, hi]. */
int64_t chaos_rng_range(ChaosRng *r, int64_t lo, int64_t hi);
bool chaos_rng_chance(ChaosRng *r, int percent);

/* What a turn does (tw-soak-agent's input.kind). Each kind has the outcome its agent program produces when no
 * fault or watchdog intervenes. Retries (docs/timeouts.md) are a kind to add here once they exist: its
 * natural outcome, and the epochs check.c allows a turn (one per attempt). */
typedef enum {
    CHAOS_KIND_DONE,
    CHAOS_KIND_SLOW,
    CHAOS_KIND_FAIL,
    CHAOS_KIND_EXIT,
    CHAOS_KIND_OVERRUN,
    CHAOS_KIND_TOOLS,
    CHAOS_KIND_EXTERNAL,
    CHAOS_KIND_N
} ChaosKind;

typedef struct ChaosKindInfo {
    const char *name;
    int weight;         /* share of the load, out of the sum of weights */
    const char *status; /* natural final status */
    const char *error;  /* natural error code, or NULL */
} ChaosKindInfo;
const ChaosKindInfo *chaos_kind_info(ChaosKind k);

typedef struct ChaosExtPlan {
    int64_t answer_after_ms; /* after the call is seen waiting; -1: never answered (it times out) */
    bool error;              /* answer with --status error */
} ChaosExtPlan;

typedef struct ChaosTurnPlan {
    int agent; /* soak<agent> */
    ChaosKind kind;
    int64_t submit_ms;       /* from the start of the run */
    int timeout_sec;         /* submit --timeout; 0: none */
    int64_t cancel_after_ms; /* after the submit answered; -1: never cancelled */
    char *input;             /* the input document */
    int n_ext;
    ChaosExtPlan ext[CHAOS_MAX_EXT];
} ChaosTurnPlan;

typedef enum {
    CHAOS_FAULT_WORKER_KILL,
    CHAOS_FAULT_WORKER_STOP,
    CHAOS_FAULT_PMO_KILL,
    CHAOS_FAULT_PMO_STOP,
    CHAOS_FAULT_WORKER_TERM,
    CHAOS_FAULT_PMO_TERM,
    CHAOS_FAULT_NATS_RESTART,
    CHAOS_FAULT_PG_RESTART,
    CHAOS_FAULT_PG_CRASH,
    CHAOS_FAULT_N
} ChaosFaultKind;

typedef struct ChaosFault {
    int64_t at_ms;
    ChaosFaultKind kind;
    int target;          /* which worker or PMO (0 or 1) */
    int64_t duration_ms; /* stopped for, or down for before the restart */
} ChaosFault;
const char *chaos_fault_name(ChaosFaultKind k);

typedef struct ChaosPlan {
    uint64_t seed;
    int n_turns;
    int64_t chaos_ms;
    int n_agents;
    ChaosTurnPlan *turns; /* in submit order */
    int n_faults;
    ChaosFault *faults; /* in time order */
} ChaosPlan;

/* The plan of a run: n_turns turns submitted over chaos_ms, faults during it. NULL on out of memory. */
ChaosPlan *chaos_plan_new(uint64_t seed, int n_turns, int64_t chaos_ms) __attribute__((warn_unused_result));
void chaos_plan_free(ChaosPlan *p);
/* A digest of everything in the plan (FNV-1a, hex): two runs with the same seed print the same one. */
void chaos_plan_digest(const ChaosPlan *p, char out[17]);

/* ---- the run
 * ------------------------------------------------------------------------------------------------- */

#define CHAOS_WORKERS 2
#define CHAOS_PMOS 2
#define CHAOS_DAEMONS (CHAOS_WORKERS + CHAOS_PMOS)
#define CHAOS_CLI_MAX 12 /* CLI processes at once */

/* How a daemon may end: not at all (an exit is a crash), by our SIGKILL (any way), or by our SIGTERM (exit 0:
 * the contract's clean stop, after finishing or releasing its work). */
typedef enum { CHAOS_EXPECT_NONE, CHAOS_EXPECT_KILL, CHAOS_EXPECT_CLEAN_EXIT } ChaosExpect;

typedef struct ChaosDaemon {
    char name[16]; /* worker1, worker2, pmo1, pmo2 */
    const char *binary;
    pid_t pid;                /* 0: not running */
    bool stopped;             /* SIGSTOPped by us */
    int64_t cont_at_ms;       /* SIGCONT then */
    int64_t restart_at_ms;    /* start again then (pid 0); -1: not planned */
    ChaosExpect expect;       /* how it may end */
    int64_t term_deadline_ms; /* a SIGTERMed daemon must have exited by then */
    int64_t restart_delay_ms; /* after a SIGTERM: start again this long after it exited */
    int starts;
    char log[PATH_MAX];
} ChaosDaemon;

typedef enum { CHAOS_SRV_UP, CHAOS_SRV_STOPPING, CHAOS_SRV_DOWN, CHAOS_SRV_STARTING } ChaosServerState;

/* A CLI process and what to do with its answer. */
typedef enum { CHAOS_CLI_SUBMIT, CHAOS_CLI_CANCEL, CHAOS_CLI_RESULT } ChaosCliKind;
typedef struct ChaosCli {
    pid_t pid; /* 0: slot free */
    ChaosCliKind kind;
    int turn;
    int ext;
    int64_t started_ms;
    char out[PATH_MAX], err[PATH_MAX];
} ChaosCli;

/* The run time of one planned turn. */
typedef struct ChaosTurn {
    char id[37];          /* "" until a submit answered */
    int64_t next_try_ms;  /* next submit attempt */
    int submit_tries;     /* -1: given up */
    int64_t submitted_ms; /* when the id came back */
    unsigned busy;        /* which CLI requests for it run (load.c) */
    int cancel_tries;
    int64_t cancel_next_ms;
    char cancel_result[16];             /* cancelled | already_ended | "" */
    int64_t ext_seen_ms[CHAOS_MAX_EXT]; /* when the call was first seen waiting; 0: not yet */
    int64_t ext_next_ms[CHAOS_MAX_EXT];
    int ext_tries[CHAOS_MAX_EXT];
    char ext_result[CHAOS_MAX_EXT][16]; /* accepted | refused | "" */
} ChaosTurn;

typedef struct ChaosEvents ChaosEvents;

typedef struct ChaosOptions {
    int turns;
    double minutes;
    uint64_t seed;
    int drain_sec;       /* the drain gives up when no turn ended for this long */
    const char *dir;     /* work dir: config, logs, CLI answers */
    const char *build;   /* build dir */
    const char *dsn;     /* the throwaway cluster */
    const char *pg_bin;  /* its pg_ctl */
    const char *pg_data; /* its data dir */
    const char *pg_user; /* run pg_ctl as this user (root cannot); NULL: as we are */
    const char *nats_bin;
    int nats_port;
    /* --ha (tools/soak --ha): a pg_auto_failover formation and a three-server NATS cluster made by
     * tools/lib/ha.sh in ha_dir, driven through ha_script (tools/lib/ha-formation); nats_urls lists the
     * servers. PostgreSQL faults become failovers (the primary's postmaster SIGKILLed) and switchovers, a
     * NATS fault kills one server. */
    const char *ha_dir;
    const char *ha_script;
    const char *nats_urls;
    bool verbose;
} ChaosOptions;

typedef struct ChaosRun {
    ChaosOptions opt;
    ChaosPlan *plan;
    ChaosTurn *turns;
    int64_t t0_ms; /* monotonic start */
    char ini[PATH_MAX];
    char cli_bin[PATH_MAX], pmo_bin[PATH_MAX], worker_bin[PATH_MAX];
    char nats_url[512];
    ChaosDaemon daemons[CHAOS_DAEMONS]; /* workers first */
    ChaosCli cli[CHAOS_CLI_MAX];
    /* A CLI process ended (procs.c reaps it; load.c, which started it, sets this) */
    void (*cli_done)(struct ChaosRun *run, ChaosCli *c, int status);
    /* servers */
    pid_t nats_pid;
    int ha_nats_down; /* --ha: the server (1..3) a NATS fault killed, 0: none */
    ChaosServerState nats_state;
    int64_t nats_up_at_ms; /* start it again then */
    ChaosServerState pg_state;
    pid_t pg_ctl_pid; /* a pg_ctl running */
    bool pg_crash;    /* the running stop is -m immediate */
    int64_t pg_up_at_ms;
    bool chaos_on; /* faults are injected (false once the chaos phase ends) */
    int next_fault;
    int faults_done[CHAOS_FAULT_N];
    int faults_skipped[CHAOS_FAULT_N];
    /* the driver's own reading connection */
    PGconn *db;
    int64_t db_retry_ms;
    int64_t ext_poll_ms, scan_ms;
    int first_unsubmitted;
    int *id_index; /* open addressing: turn id -> plan index */
    size_t id_cap;
    int n_submitted;
    /* what went wrong outside the database: daemons that died on their own, shutdown failures, submits that
     * never succeeded. check.c reports them with the invariants. */
    json_t *incidents; /* [{"what","detail"}] */
    ChaosEvents *events;
    bool ticks_taken; /* the schedule's ticks are in soak_ticks and it is removed (schedule.c) */
} ChaosRun;

/* journal.c: the run's clock and its notes */
void chaos_journal_start(void); /* the run's clock starts */
void chaos_journal_open(const char *path, bool verbose);
void chaos_journal_close(void);
int64_t chaos_now_ms(const ChaosRun *run); /* since the start of the run */
void chaos_note(ChaosRun *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void chaos_incident(ChaosRun *run, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* procs.c: spawning and signalling */
pid_t chaos_spawn(char *const argv[], const char *out, const char *err, bool append);
void chaos_reap(ChaosRun *run);
int chaos_daemon_start(ChaosRun *run, ChaosDaemon *d);
void chaos_daemon_signal(ChaosRun *run, ChaosDaemon *d, int sig);
int chaos_nats_start(ChaosRun *run);
void chaos_nats_stop(ChaosRun *run);
bool chaos_nats_accepting(const ChaosRun *run);
int chaos_pg_ctl(ChaosRun *run, const char *action, const char *mode);
/* Blocks until every daemon has exited after SIGTERM (SIGKILL after grace_ms); false if one exited badly. */
bool chaos_daemons_stop(ChaosRun *run, int grace_ms);
int chaos_run_sync(ChaosRun *run, char *const argv[], const char *log);

/* faults.c */
void chaos_faults_tick(ChaosRun *run, int64_t now);
/* Undo every fault in force: SIGCONT, restart what is down. True once everything is up. */
bool chaos_heal_tick(ChaosRun *run, int64_t now);

/* load.c */
int chaos_load_init(ChaosRun *run);
PGconn *chaos_db(ChaosRun *run); /* NULL while PostgreSQL is away */
void chaos_load_tick(ChaosRun *run, int64_t now);
bool chaos_load_all_submitted(const ChaosRun *run);
bool chaos_load_idle(const ChaosRun *run); /* no CLI running */
/* Counts turns not yet ended; -1 when the database is away. */
int chaos_load_open_turns(ChaosRun *run);

/* events.c */
ChaosEvents *chaos_events_start(const char *url);
/* Reads back every event the stream `stream` kept (the daemons keep it: [nats] events_stream), adding them
 * with source "stream". 0, or -1 with why. */
int chaos_events_replay(ChaosEvents *ev, const char *stream, char *why, size_t why_size);
/* Stops the subscription; what was seen stays readable. */
void chaos_events_stop(ChaosEvents *ev);
void chaos_events_free(ChaosEvents *ev);
size_t chaos_events_count(ChaosEvents *ev);
/* The events seen, as [{"subject","payload","source"}] (payload null when it was not a JSON object; source
 * "live" or "stream"), and the times
 * (Unix ms) the subscriber was away, as
 * [[from_ms, to_ms]]. */
json_t *chaos_events_json(ChaosEvents *ev);
json_t *chaos_events_gaps(ChaosEvents *ev);

/* schedule.c: the soak's schedule (docs/schedules.md), added at set-up; its ticks taken and the schedule
 * removed once everything is up (true when done; tried again while the database is away). */
#define CHAOS_SCHEDULE "soak_tick"
int chaos_schedule_start(ChaosRun *run);
bool chaos_schedule_take(ChaosRun *run);

/* invariants.c: the i-th invariant, NULL past the last (at most CHAOS_MAX_INVARIANTS) */
#define CHAOS_MAX_INVARIANTS 40
typedef struct ChaosInvariant {
    const char *name;
    const char *sql;   /* rows of (turn id or '-', what is wrong) */
    const char *plant; /* plants one violation, for the checker's self-test (rolled back) */
} ChaosInvariant;
const ChaosInvariant *chaos_invariant(size_t i);

/* check.c: the invariants over the database and the events; prints the table, returns the violation count. */
int chaos_check(ChaosRun *run, FILE *out);

#endif
