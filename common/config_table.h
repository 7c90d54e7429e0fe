/* A configuration as data (docs/configuration.md): its structs, the parameter table that says what every key
 * of every section is (type, bounds, default, flags), and the lookups in a loaded configuration. The engine
 * (config.h) fills it from an INI file; the checks (config_check.h) judge it. */
#ifndef TW_CONFIG_TABLE_H
#define TW_CONFIG_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#define TW_CONFIG_MAX_PARAMS 128 /* size of the line_of arrays: >= the table length */

/* Timeout policies (docs/timeouts.md): [worker] holds the defaults, each [agent.NAME] may override them.
 */
typedef struct TwPolicyConf {
    int max_attempts;          /* 1: every end is final */
    char *retry_on;            /* comma list of error codes that retry, or * */
    int retry_backoff_sec;     /* before attempt 2; doubles per attempt, +-20 % jitter */
    int retry_backoff_max_sec; /* the cap */
    int queue_timeout_sec;     /* 0: none */
    int warn_at_percent;       /* 0: no warnings */
    int tool_timeout_sec;      /* a tool call's timeout when neither the call nor the tool sets one */
} TwPolicyConf;

/* Limits on an agent's or a tool's program (docs/security.md), set in the child before execve: [worker]
 * holds the defaults, each [agent.NAME] and [tool.NAME] may set its own. 0 (or "") is no limit. */
typedef struct TwLimitsConf {
    int memory_limit_mb; /* RLIMIT_DATA: heap and private writable mappings */
    int cpu_limit_sec;   /* RLIMIT_CPU: SIGXCPU at this many seconds of CPU, SIGKILL one second later */
    int max_open_files;  /* RLIMIT_NOFILE */
    int max_processes;   /* RLIMIT_NPROC: processes and threads of the user the program runs as */
    char *run_as_user;   /* setgid, setgroups(0), setuid to this user; the worker must run as root */
} TwLimitsConf;

typedef struct TwAgentConf {
    char name[65];
    char **argv; /* NULL-terminated, from exec */
    char *exec;
    int step_timeout_sec;
    int kill_grace_sec;
    TwPolicyConf policy; /* what the section does not set comes from [worker] */
    char *mode;          /* exec | serve */
    bool serve;          /* mode = serve: one long-lived process per slot, JSON lines (docs/protocol.md) */
    int max_requests;    /* serve: requests per process before it is replaced */
    char *flow_limits;   /* flow control: comma list of the limits its turns hold ([limit.NAME]), "" none */
    TwLimitsConf limits; /* what the section does not set comes from [worker] */
    int section_line;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by parameter table index */
} TwAgentConf;

typedef struct TwToolConf {
    char name[65];
    char **argv; /* NULL when external */
    char *exec;
    bool external;
    char *agent_profile; /* delegation: calls run as child turns of this profile (no program) */
    int timeout_sec;     /* 0: not set (the agent's, then the worker's tool_timeout_seconds) */
    int suspend_timeout_sec;
    char *mode; /* exec | serve */
    bool serve;
    int max_requests;
    TwLimitsConf limits; /* what the section does not set comes from [worker] */
    char *flow_limits;   /* flow control: comma list of the limits its calls hold ([limit.NAME]), "" none */
    int max_concurrent;  /* flow control shorthand: a limit of its own, "tool-NAME" (0: none) */
    int rate_limited_retries; /* pushback: how often a call that says rate_limited runs again */
    int kill_grace_sec;       /* a stopped program's time between SIGTERM and SIGKILL */
    /* MCP (docs/mcp.md): a Model Context Protocol server over stdio instead of exec; NULL when not one. */
    char **mcp_argv;
    char *mcp_exec;       /* its line as written */
    char *mcp_tool;       /* the server's tool that a call calls; NULL: the section's name */
    int mcp_max_inflight; /* calls one server takes at once */
    int section_line;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by parameter table index */
} TwToolConf;

/* Flow control (docs/flow-control.md): a [limit.NAME] section, a limit that calls of the tools naming it
 * hold, across every worker; the workers write it to the database at start and reload (state.limits). */
typedef struct TwFlowLimitConf {
    char name[65];
    int max_concurrent; /* at most this many holders at once; 0: no cap */
    char *rate;         /* "N/S": N starts per S seconds (a token bucket); "" none */
    int rate_n;         /* parsed from rate by the checks; 0 when none */
    double rate_sec;
    int burst;        /* the bucket's size; 0: N */
    bool per_key;     /* the caps apply to each turn's limit_key separately */
    int max_wait_sec; /* a call waits at most this long to start; 0: as its turn's deadline allows */
    int section_line;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by parameter table index */
} TwFlowLimitConf;

/* A [schedule.NAME] section (docs/schedules.md): a turn submitted on a calendar; the PMOs write it to the
 * database at start and reload (state.schedules). */
typedef struct TwScheduleConf {
    char name[65];
    char *agent;
    char *profile; /* "": the agent's own */
    char *cron;
    char *timezone;
    char *channel;   /* "": schedule:NAME */
    char *input;     /* a JSON object */
    int timeout_sec; /* 0: none */
    char *limit_key;
    char *overlap; /* skip | queue | cancel_previous */
    char *catchup; /* none | last | all */
    int catchup_window_sec;
    int section_line;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by parameter table index */
} TwScheduleConf;

/* A tool's rate_limited_retries by default (the SQL assumes it when a call does not say). */
#define TW_RATE_LIMITED_RETRIES_DEFAULT 3

/* The name of a tool's own limit ([tool.T] max_concurrent): "tool-" and the tool's name. */
#define TW_TOOL_LIMIT_PREFIX "tool-"

typedef struct TwConfig {
    char *path;
    char *pg_dsn;
    int pg_keepalive_sec; /* TCP keepalives on every connection: a vanished peer is noticed this fast (0: off)
                           */
    int pg_query_timeout_sec; /* a daemon's statement is given up after this long, and bounded server-side */
    char *nats_url;
    char *nats_events_stream;    /* JetStream stream that keeps evt.agent.>; "" = none (docs/operations.md) */
    int nats_events_max_age_sec; /* how long it keeps them */
    /* NATS security (docs/security.md); "" is unset. Files are read when a connection is set up. */
    char *nats_credentials_file; /* .creds: user JWT and nkey seed */
    char *nats_nkey_seed_file;   /* a user nkey seed (SU...) */
    char *nats_user;             /* with nats_password_file */
    char *nats_password_file;
    char *nats_token_file;
    char *nats_tls_ca_file; /* set (or a tls:// URL, or a client certificate): TLS */
    char *nats_tls_cert_file;
    char *nats_tls_key_file;
    int nats_events_replicas; /* on how many servers of a cluster (docs/high-availability.md) */
    struct {
        int watchdog_interval_sec;
        int dispatched_retry_sec;
        int dispatched_timeout_sec;
        int pending_wakeup_sec;
        int pending_wakeup_skip_sec;
        int active_reap_sec;
        char *metrics_listen; /* host:port of /metrics and /healthz; "" is off */
    } pmo;
    struct {
        int inbox_processing_timeout_sec;
        int watchdog_interval_sec;
        int suspend_timeout_sec;
        int heartbeat_sec;
        int concurrency;
        char *agents;        /* "*" or a comma list of profiles and tools */
        TwPolicyConf policy; /* the agents' defaults */
        int max_delegation_depth;
        int max_tree_turns; /* the turns of one delegation tree, its root included */
        char *metrics_listen;
        TwLimitsConf limits; /* the programs' defaults */
    } worker;
    struct {
        char *format; /* text | json */
        char *level;  /* debug | info | warn | error */
    } log;
    TwAgentConf *agents;
    size_t n_agents;
    TwToolConf *tools;
    size_t n_tools;
    TwFlowLimitConf *flow_limits;
    size_t n_flow_limits;
    TwScheduleConf *schedules;
    size_t n_schedules;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by table index: line it was set on, 0 for the default */
    char *errors;                      /* newline-separated "file:line: [section] key: why" */
    size_t errors_len;                 /* strlen(errors) */
    int n_errors;
    int refs; /* users besides the first of a heap configuration (tw_config_ref/unref) */
} TwConfig;

typedef enum { TW_PT_INT, TW_PT_STR, TW_PT_BOOL, TW_PT_ARGV, TW_PT_LIST } TwParamType;
typedef enum {
    TW_SEC_POSTGRES,
    TW_SEC_NATS,
    TW_SEC_PMO,
    TW_SEC_WORKER,
    TW_SEC_LOG, /* the last section that appears once; agent and tool sections repeat */
    TW_SEC_AGENT,
    TW_SEC_TOOL,
    TW_SEC_LIMIT,
    TW_SEC_SCHEDULE
} TwSection;

/* When a change of a key takes effect (TwParam.reload). */
typedef enum {
    /* At a reload (SIGHUP): the new value applies to what starts afterwards; running steps keep theirs. */
    TW_RELOAD,
    /* At the next start only: the key is read once, when the daemon starts (its connections); a reload that
     * changes it logs that the change takes effect at the next restart (as PgBouncer's CF_NO_RELOAD). */
    TW_RESTART,
} TwReload;

/* One row of the parameter table: everything about a key is said here, once. The engine reads, checks,
 * stores, inherits and frees values by it; turnwatch.ini(5) and config/turnwatch.ini are generated from it
 * (config_doc.h). */
typedef struct TwParam {
    TwSection section;
    const char *key;
    TwParamType type; /* also what tw_config_free frees: the strings (TW_PT_STR, TW_PT_LIST) and argvs */
    size_t offset;    /* into TwConfig, TwAgentConf, TwToolConf or TwFlowLimitConf by section */
    long min, max;    /* TW_PT_INT: the bounds, both included */
    const char *def;  /* NULL: no default (required, optional, or [worker]'s: see the cross-key rules) */
    TwReload reload;
    const char *values;  /* TW_PT_STR: "exec|serve", the only values the engine accepts; NULL: any */
    const char *example; /* a key without a default: the value the commented templates show */
    const char *help;    /* its meaning, for the generated INI comments and manual page */
} TwParam;

/* A section as the documentation introduces it. */
typedef struct TwSectionDoc {
    const char *header; /* "postgres", "agent.NAME" */
    const char *help;
} TwSectionDoc;

/* A paragraph that introduces a group of keys of a section (the timeout policies, the limits): printed
 * before the key named. */
typedef struct TwParamGroup {
    TwSection section;
    const char *before_key;
    const char *help;
} TwParamGroup;

/** The parameter table: the engine's, the documentation generator's (config_doc.h) and the tests'. */
const TwParam *tw_config_params(size_t *n);
const char *tw_config_section_name(TwSection s);
/** How the documentation introduces section s. */
const TwSectionDoc *tw_config_section_doc(TwSection s);
/** The groups of keys with an introduction of their own. */
const TwParamGroup *tw_config_param_groups(size_t *n);
/** The table index of a key (the index of the line_of arrays). A key the table lacks is a mistake in the
 *  caller's code, not a runtime condition: abort(). */
int tw_config_param_index(TwSection sec, const char *key);
/** The line a key of a once-only section ([postgres] ... [log]) was set on, 0 for its default. */
int tw_config_line(const TwConfig *cfg, TwSection sec, const char *key);

/** Append one problem to cfg->errors ("file:line: " and the message; line 0: the file only). */
void tw_config_error(TwConfig *cfg, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const TwAgentConf *tw_config_agent(const TwConfig *cfg, const char *name);
const TwToolConf *tw_config_tool(const TwConfig *cfg, const char *name);
const TwFlowLimitConf *tw_config_flow_limit(const TwConfig *cfg, const char *name);
const TwScheduleConf *tw_config_schedule(const TwConfig *cfg, const char *name);
/** True when [worker] agents names this agent or tool section (or is "*"). */
bool tw_config_serves(const TwConfig *cfg, const char *name);

#endif
