/* The INI configuration (contract section 3): one declarative parameter table, loaded through inih. */
#ifndef TW_CONFIG_H
#define TW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define TW_CONFIG_MAX_PARAMS 32 /* size of the line_of arrays: >= the table length */
/* Longest INI line in bytes, not counting its line end ("\n" or "\r\n"). A longer line is an error: read in
 * pieces, its tail would be parsed as a line of its own (a section or key nobody wrote). */
#define TW_CONFIG_MAX_LINE 65536

typedef struct TwAgentConf {
    char name[65];
    char **argv; /* NULL-terminated, from exec */
    char *exec;
    int step_timeout_sec;
    int kill_grace_sec;
    int section_line;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by parameter table index */
} TwAgentConf;

typedef struct TwToolConf {
    char name[65];
    char **argv; /* NULL when external */
    char *exec;
    bool external;
    int timeout_sec;
    int suspend_timeout_sec;
    int section_line;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by parameter table index */
} TwToolConf;

typedef struct TwConfig {
    char *path;
    char *pg_dsn;
    int pg_keepalive_sec; /* TCP keepalives on every connection: a vanished peer is noticed this fast (0: off)
                           */
    char *nats_url;
    char *nats_events_stream; /* JetStream stream that keeps evt.agent.>; "" = none (contract section 12) */
    int nats_events_max_age_sec; /* how long it keeps them */
    struct {
        int watchdog_interval_sec;
        int dispatched_retry_sec;
        int dispatched_timeout_sec;
        int pending_wakeup_sec;
        int pending_wakeup_skip_sec;
        int active_reap_sec;
    } pmo;
    struct {
        int inbox_processing_timeout_sec;
        int watchdog_interval_sec;
        int suspend_timeout_sec;
        int heartbeat_sec;
        int concurrency;
        char *agents; /* "*" or a comma list */
    } worker;
    struct {
        char *format; /* text | json */
        char *level;  /* debug | info | warn | error */
    } log;
    TwAgentConf *agents;
    size_t n_agents;
    TwToolConf *tools;
    size_t n_tools;
    int line_of[TW_CONFIG_MAX_PARAMS]; /* by table index: line it was set on, 0 for the default */
    char *errors;                      /* newline-separated "file:line: [section] key: why" */
    int n_errors;
} TwConfig;

typedef enum { TW_PT_INT, TW_PT_STR, TW_PT_BOOL, TW_PT_ARGV, TW_PT_LIST } TwParamType;
typedef enum {
    TW_SEC_POSTGRES,
    TW_SEC_NATS,
    TW_SEC_PMO,
    TW_SEC_WORKER,
    TW_SEC_LOG, /* the last section that appears once; agent and tool sections repeat */
    TW_SEC_AGENT,
    TW_SEC_TOOL
} TwSection;

typedef struct TwParam {
    TwSection section;
    const char *key;
    TwParamType type;
    size_t offset; /* into TwConfig, TwAgentConf or TwToolConf by section */
    long min, max;
    const char *def; /* NULL: no default (required or optional, see the cross-key rules) */
} TwParam;

/** The parameter table, for --help texts and the test that compares it with config/turnwatch.ini. */
const TwParam *tw_config_params(size_t *n);
const char *tw_config_section_name(TwSection s);

/** Load and validate path. Returns 0, or -1 with cfg->errors listing every problem found. */
int tw_config_load(TwConfig *cfg, const char *path) __attribute__((warn_unused_result));
/** Load from a string (tests); name is used in messages. */
int tw_config_load_string(TwConfig *cfg, const char *name, const char *text)
    __attribute__((warn_unused_result));
void tw_config_free(TwConfig *cfg);

/** Check the programs of the agents and tools this worker serves: each exec must name an existing regular
 *  file that is executable. Appends each problem to cfg->errors ("file:line: [section] exec: why") and
 *  returns -1, or returns 0. The worker runs it at start-up and with --check-config; the PMO and the CLI
 *  run no programs and do not. */
int tw_config_check_programs(TwConfig *cfg) __attribute__((warn_unused_result));

const TwAgentConf *tw_config_agent(const TwConfig *cfg, const char *name);
const TwToolConf *tw_config_tool(const TwConfig *cfg, const char *name);
/** True when [worker] agents names this agent or tool section (or is "*"). */
bool tw_config_serves(const TwConfig *cfg, const char *name);
/** Seconds a call of this tool may wait (contract 7, 2.2): max(worker default, tool's two options). */
int tw_config_wait_seconds(const TwConfig *cfg, const TwToolConf *tool);

/** Split an exec line into a NULL-terminated argv, with '…', "…" and backslash escapes; no expansion. */
char **tw_argv_split(const char *line, const char **err);
void tw_argv_free(char **argv);

#endif
