/* The checks of a configuration beyond each value's own (type, bounds: the table's): the rules across keys
 * and sections at load, and the programs and limits a worker checks at start-up and with --check-config.
 * Every problem is appended as "file:line: [section] key: why". */
#include "config_check.h"

#include <errno.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cron.h"
#include "names.h"

/* A key's index in the table (the line_of arrays). */
static int pidx(TwSection sec, const char *key)
{
    return tw_config_param_index(sec, key);
}

static void check_policy(TwConfig *cfg, const TwPolicyConf *p, const char *section, const int *line_of,
                         int section_line)
{
    int i_base = pidx(p == &cfg->worker.policy ? TW_SEC_WORKER : TW_SEC_AGENT, "retry_backoff_seconds");
    int i_max = pidx(p == &cfg->worker.policy ? TW_SEC_WORKER : TW_SEC_AGENT, "retry_backoff_max_seconds");

    if (p->retry_backoff_max_sec < p->retry_backoff_sec)
        tw_config_error(cfg,
                        line_of[i_max]    ? line_of[i_max]
                        : line_of[i_base] ? line_of[i_base]
                                          : section_line,
                        "[%s] retry_backoff_max_seconds: %d must not be less than retry_backoff_seconds (%d)",
                        section, p->retry_backoff_max_sec, p->retry_backoff_sec);
}

static int line_or_section(int line, int section_line)
{
    return line ? line : section_line;
}

/* A [limit.NAME] section (docs/flow-control.md): rate is "N/S" (N starts per S seconds), burst needs a rate.
 */
static void check_flow_limit(TwConfig *cfg, TwFlowLimitConf *l)
{
    int rate_line = line_or_section(l->line_of[pidx(TW_SEC_LIMIT, "rate")], l->section_line);

    l->rate_n = 0;
    l->rate_sec = 0;
    if (*l->rate) {
        char *end;
        long n;
        double sec;
        errno = 0;
        n = strtol(l->rate, &end, 10);
        if (errno || end == l->rate || *end != '/' || n < 1 || n > 1000000) {
            tw_config_error(
                cfg, rate_line,
                "[limit.%s] rate: '%s' is not N/S (1 to 1000000 starts per S seconds, e.g. 60/60)", l->name,
                l->rate);
            return;
        }
        const char *s = end + 1;
        sec = strtod(s, &end);
        if (errno || end == s || *end != '\0' || !(sec > 0) || sec > 86400) {
            tw_config_error(cfg, rate_line,
                            "[limit.%s] rate: '%s': S must be a number of seconds above 0, at most 86400",
                            l->name, l->rate);
            return;
        }
        l->rate_n = (int)n;
        l->rate_sec = sec;
    }
    if (l->burst && !l->rate_n)
        tw_config_error(cfg, l->line_of[pidx(TW_SEC_LIMIT, "burst")],
                        "[limit.%s] burst: only with a rate (the size of its token bucket)", l->name);
}

/* [nats] security keys (docs/security.md): one way to authenticate, a user with its password file, a client
 * certificate with its key. Whether the files can be read is tw_nats_check's (the daemons' start, and
 * --check-config), not the CLI's every command. */
/* A [schedule.NAME] section (docs/schedules.md): the agent (and profile) a valid name, the cron and its time
 * zone as the cron engine reads them, the input a JSON object. */
static void check_schedule(TwConfig *cfg, const TwScheduleConf *s)
{
    char why[256];
    json_error_t jerr;
    json_t *in;
    int line;

    if (!s->agent || !tw_name_valid(s->agent))
        tw_config_error(cfg, line_or_section(s->line_of[pidx(TW_SEC_SCHEDULE, "agent")], s->section_line),
                        "[schedule.%s] agent: %s", s->name,
                        s->agent ? "invalid name (allowed: [A-Za-z0-9_-]{1,64})" : "required");
    if (*s->profile && !tw_name_valid(s->profile))
        tw_config_error(cfg, s->line_of[pidx(TW_SEC_SCHEDULE, "profile")],
                        "[schedule.%s] profile: invalid name (allowed: [A-Za-z0-9_-]{1,64})", s->name);
    line = line_or_section(s->line_of[pidx(TW_SEC_SCHEDULE, "cron")], s->section_line);
    if (!s->cron)
        tw_config_error(cfg, line, "[schedule.%s] cron: required", s->name);
    else if (tw_cron_check(s->cron, why, sizeof why) != 0)
        tw_config_error(cfg, line, "[schedule.%s] cron: %s", s->name, why);
    if (tw_cron_zone_check(s->timezone, why, sizeof why) != 0)
        tw_config_error(cfg, line_or_section(s->line_of[pidx(TW_SEC_SCHEDULE, "timezone")], s->section_line),
                        "[schedule.%s] timezone: %s", s->name, why);
    in = json_loads(s->input, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(in))
        tw_config_error(cfg, line_or_section(s->line_of[pidx(TW_SEC_SCHEDULE, "input")], s->section_line),
                        "[schedule.%s] input: must be a JSON object (%s)", s->name,
                        in ? "not an object" : jerr.text);
    json_decref(in);
}

static void check_nats(TwConfig *cfg)
{
    const char *auth[] = {"credentials_file", "nkey_seed_file", "user", "token_file"};
    const char *vals[] = {cfg->nats_credentials_file, cfg->nats_nkey_seed_file, cfg->nats_user,
                          cfg->nats_token_file};
    const char *first = NULL;

    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++) {
        if (!*vals[i])
            continue;
        if (first)
            tw_config_error(
                cfg, cfg->line_of[pidx(TW_SEC_NATS, auth[i])],
                "[nats] %s: %s is set already: choose one of credentials_file, nkey_seed_file, user (with "
                "password_file) or token_file",
                auth[i], first);
        else
            first = auth[i];
    }
    if (*cfg->nats_user && !*cfg->nats_password_file)
        tw_config_error(
            cfg, cfg->line_of[pidx(TW_SEC_NATS, "user")],
            "[nats] user: needs password_file (a file holding the password: it is never written in "
            "the INI)");
    if (!*cfg->nats_user && *cfg->nats_password_file)
        tw_config_error(cfg, cfg->line_of[pidx(TW_SEC_NATS, "password_file")],
                        "[nats] password_file: needs user (the user name the password belongs to)");
    if (!*cfg->nats_tls_cert_file != !*cfg->nats_tls_key_file)
        tw_config_error(
            cfg, cfg->line_of[pidx(TW_SEC_NATS, *cfg->nats_tls_cert_file ? "tls_cert_file" : "tls_key_file")],
            "[nats] %s: a client certificate needs both tls_cert_file and tls_key_file",
            *cfg->nats_tls_cert_file ? "tls_cert_file" : "tls_key_file");
}

/* An MCP tool (docs/mcp.md) is a third kind beside exec and serve: its server is its program. The keys of
 * the other kinds contradict it. True when t is one (checked here), false when the common checks apply. */
static bool check_mcp(TwConfig *cfg, const TwToolConf *t)
{
    static const char *const others[] = {"exec", "external", "mode", "max_requests"};

    if (!t->mcp_argv) {
        for (size_t k = 0; k < 2; k++) {
            const char *key = k == 0 ? "mcp_tool" : "mcp_max_inflight";
            if (t->line_of[pidx(TW_SEC_TOOL, key)])
                tw_config_error(cfg, t->line_of[pidx(TW_SEC_TOOL, key)],
                                "[tool.%s] %s: only for an MCP tool (set mcp = /path/to/server ...)", t->name,
                                key);
        }
        return false;
    }
    for (size_t k = 0; k < sizeof others / sizeof others[0]; k++)
        if (t->line_of[pidx(TW_SEC_TOOL, others[k])])
            tw_config_error(cfg, t->line_of[pidx(TW_SEC_TOOL, others[k])],
                            "[tool.%s] %s: an MCP tool's program is its server (mcp), which takes many calls "
                            "at once; remove %s",
                            t->name, others[k], others[k]);
    if (t->mcp_tool && (!*t->mcp_tool || strlen(t->mcp_tool) > 128 || strpbrk(t->mcp_tool, "\t\r\n")))
        tw_config_error(cfg, t->line_of[pidx(TW_SEC_TOOL, "mcp_tool")],
                        "[tool.%s] mcp_tool: a tool name of 1 to 128 characters without control characters",
                        t->name);
    return true;
}

void tw_config_check_rules(TwConfig *cfg)
{
    int i_retry = pidx(TW_SEC_PMO, "dispatched_retry_seconds"),
        i_timeout = pidx(TW_SEC_PMO, "dispatched_timeout_seconds");
    int i_wake = pidx(TW_SEC_PMO, "pending_wakeup_seconds"),
        i_skip = pidx(TW_SEC_PMO, "pending_wakeup_skip_seconds");
    int i_reap = pidx(TW_SEC_PMO, "active_reap_seconds"), i_hb = pidx(TW_SEC_WORKER, "heartbeat_seconds");
    int i_inbox = pidx(TW_SEC_WORKER, "inbox_processing_timeout_seconds");
    PQconninfoOption *opts;
    char *err = NULL;

    /* A JetStream stream name is one subject token at most; ours are as strict as agent names. */
    if (cfg->nats_events_stream[0] && !tw_name_valid(cfg->nats_events_stream))
        tw_config_error(
            cfg, cfg->line_of[pidx(TW_SEC_NATS, "events_stream")],
            "[nats] events_stream: '%s' is not a valid stream name ([A-Za-z0-9_-], 1 to 64 characters)",
            cfg->nats_events_stream);
    if (cfg->pmo.dispatched_retry_sec >= cfg->pmo.dispatched_timeout_sec)
        tw_config_error(
            cfg, cfg->line_of[i_retry] ? cfg->line_of[i_retry] : cfg->line_of[i_timeout],
            "[pmo] dispatched_retry_seconds: %d must be less than dispatched_timeout_seconds (%d)",
            cfg->pmo.dispatched_retry_sec, cfg->pmo.dispatched_timeout_sec);
    if (cfg->pmo.pending_wakeup_sec >= cfg->pmo.pending_wakeup_skip_sec)
        tw_config_error(cfg, cfg->line_of[i_wake] ? cfg->line_of[i_wake] : cfg->line_of[i_skip],
                        "[pmo] pending_wakeup_seconds: %d must be less than pending_wakeup_skip_seconds (%d)",
                        cfg->pmo.pending_wakeup_sec, cfg->pmo.pending_wakeup_skip_sec);
    if (cfg->worker.heartbeat_sec * 2 >= cfg->pmo.active_reap_sec)
        tw_config_error(
            cfg, cfg->line_of[i_hb] ? cfg->line_of[i_hb] : cfg->line_of[i_reap],
            "[worker] heartbeat_seconds: %d must be less than half of [pmo] active_reap_seconds (%d)",
            cfg->worker.heartbeat_sec, cfg->pmo.active_reap_sec);
    if (cfg->worker.heartbeat_sec * 2 >= cfg->worker.inbox_processing_timeout_sec)
        tw_config_error(
            cfg, cfg->line_of[i_hb] ? cfg->line_of[i_hb] : cfg->line_of[i_inbox],
            "[worker] heartbeat_seconds: %d must be less than half of inbox_processing_timeout_seconds (%d)",
            cfg->worker.heartbeat_sec, cfg->worker.inbox_processing_timeout_sec);

    opts = PQconninfoParse(cfg->pg_dsn, &err);
    if (!opts) {
        char *nl = err ? strchr(err, '\n') : NULL;
        if (nl)
            *nl = '\0';
        tw_config_error(cfg, cfg->line_of[pidx(TW_SEC_POSTGRES, "dsn")],
                        "[postgres] dsn: not a valid libpq connection string: %s",
                        err ? err : "out of memory");
        PQfreemem(err);
    }
    PQconninfoFree(opts);
    if (strpbrk(cfg->nats_url, " \t") || strstr(cfg->nats_url, ",,") || cfg->nats_url[0] == ',' ||
        cfg->nats_url[strlen(cfg->nats_url) - 1] == ',')
        tw_config_error(cfg, cfg->line_of[pidx(TW_SEC_NATS, "url")],
                        "[nats] url: '%s' must be a comma-separated list of URLs without spaces",
                        cfg->nats_url);

    for (int w = 0; w < 2; w++) {
        const char *listen = w ? cfg->worker.metrics_listen : cfg->pmo.metrics_listen;
        char host[256];
        int port;
        if (*listen && !tw_listen_parse(listen, host, sizeof host, &port))
            tw_config_error(
                cfg, cfg->line_of[pidx(w ? TW_SEC_WORKER : TW_SEC_PMO, "metrics_listen")],
                "[%s] metrics_listen: '%s' is not host:port (e.g. 127.0.0.1:9464, [::1]:9464; empty: off)",
                w ? "worker" : "pmo", listen);
    }
    check_nats(cfg);
    check_policy(cfg, &cfg->worker.policy, "worker", cfg->line_of, 0);
    for (size_t i = 0; i < cfg->n_agents; i++) {
        TwAgentConf *a = &cfg->agents[i];
        char section[80];
        if (!a->argv)
            tw_config_error(cfg, a->section_line,
                            "[agent.%s] exec: required (the agent program and its arguments)", a->name);
        snprintf(section, sizeof section, "agent.%s", a->name);
        check_policy(cfg, &a->policy, section, a->line_of, a->section_line);
        /* mode is exec or serve: the table's values, checked as it was read. */
        a->serve = strcmp(a->mode, "serve") == 0;
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        TwToolConf *t = &cfg->tools[i];
        int exec_line = t->line_of[pidx(TW_SEC_TOOL, "exec")],
            ext_line = t->line_of[pidx(TW_SEC_TOOL, "external")];
        int prof_line = t->line_of[pidx(TW_SEC_TOOL, "agent_profile")];
        if ((*t->flow_limits || t->max_concurrent) && (t->agent_profile || t->external))
            tw_config_error(
                cfg,
                line_or_section(t->line_of[pidx(TW_SEC_TOOL, *t->flow_limits ? "limits" : "max_concurrent")],
                                t->section_line),
                "[tool.%s] %s: limits hold the calls of tools that run a program; %s tool has none", t->name,
                *t->flow_limits ? "limits" : "max_concurrent",
                t->agent_profile ? "a delegating" : "an external");
        if (t->max_concurrent && strlen(t->name) + strlen(TW_TOOL_LIMIT_PREFIX) > 64)
            tw_config_error(cfg, t->line_of[pidx(TW_SEC_TOOL, "max_concurrent")],
                            "[tool.%s] max_concurrent: its limit " TW_TOOL_LIMIT_PREFIX
                            "%s would be longer than 64 bytes; name a [limit.NAME] in limits instead",
                            t->name, t->name);
        if (t->agent_profile) {
            /* Delegation (docs/roster.md): the call runs as a child turn of that profile, no program. */
            if (!tw_name_valid(t->agent_profile))
                tw_config_error(cfg, prof_line,
                                "[tool.%s] agent_profile: '%s' is not a profile name ([A-Za-z0-9_-]{1,64})",
                                t->name, t->agent_profile);
            else if (!tw_config_agent(cfg, t->agent_profile))
                tw_config_error(
                    cfg, prof_line,
                    "[tool.%s] agent_profile: no [agent.%s] section (the profile its calls run as)", t->name,
                    t->agent_profile);
            if (t->argv || t->external || t->mcp_argv)
                tw_config_error(
                    cfg, prof_line,
                    "[tool.%s] agent_profile: a delegating tool has no program and is not external "
                    "(remove %s)",
                    t->name,
                    t->argv       ? "exec"
                    : t->mcp_argv ? "mcp"
                                  : "external");
            continue;
        }
        if (check_mcp(cfg, t))
            continue;
        if (t->external && t->argv)
            tw_config_error(
                cfg, line_or_section(exec_line, t->section_line),
                "[tool.%s] exec: an external tool has no program (remove exec or set external = false)",
                t->name);
        if (!t->external && !t->argv)
            tw_config_error(cfg, line_or_section(ext_line, t->section_line),
                            "[tool.%s] exec: required unless external = true or agent_profile is set",
                            t->name);
        t->serve = strcmp(t->mode, "serve") == 0;
        if (t->external && t->serve)
            tw_config_error(cfg, line_or_section(t->line_of[pidx(TW_SEC_TOOL, "mode")], t->section_line),
                            "[tool.%s] mode: an external tool has no program to serve (remove mode)",
                            t->name);
    }
    for (size_t i = 0; i < cfg->n_flow_limits; i++)
        check_flow_limit(cfg, &cfg->flow_limits[i]);
    for (size_t i = 0; i < cfg->n_schedules; i++)
        check_schedule(cfg, &cfg->schedules[i]);
    if (strcmp(cfg->worker.agents, "*") != 0) {
        char *copy = strdup(cfg->worker.agents), *save = NULL;
        for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
            while (*tok == ' ' || *tok == '\t')
                tok++;
            for (char *e = tok + strlen(tok); e > tok && (e[-1] == ' ' || e[-1] == '\t');)
                *--e = '\0';
            if (!tw_config_agent(cfg, tok) && !tw_config_tool(cfg, tok))
                tw_config_error(cfg, cfg->line_of[pidx(TW_SEC_WORKER, "agents")],
                                "[worker] agents: '%s' has no [agent.%s] or [tool.%s] section", tok, tok,
                                tok);
        }
        free(copy);
    }
}

/* One served program: why it cannot be run, or NULL. why_buf holds a message built from errno. */
static const char *program_problem(const char *path, char *why_buf, size_t why_len)
{
    struct stat st;

    if (stat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return "does not exist";
        snprintf(why_buf, why_len, "cannot be checked: %s", strerror(errno));
        return why_buf;
    }
    /* access(X_OK) alone passes a directory (search permission) and, for root, any file with an x bit. */
    if (S_ISDIR(st.st_mode))
        return "is a directory, not a program";
    if (!S_ISREG(st.st_mode))
        return "is not a regular file";
    if (access(path, X_OK) != 0) {
        snprintf(why_buf, why_len, "is not executable (%s)", strerror(errno));
        return why_buf;
    }
    return NULL;
}

int tw_config_check_programs(TwConfig *cfg)
{
    int i_agent = pidx(TW_SEC_AGENT, "exec"), i_tool = pidx(TW_SEC_TOOL, "exec");
    int before = cfg->n_errors;
    char why_buf[256];
    const char *why;

    for (size_t i = 0; i < cfg->n_agents; i++) {
        const TwAgentConf *a = &cfg->agents[i];
        if (!a->argv || !tw_config_serves(cfg, a->name) ||
            !(why = program_problem(a->argv[0], why_buf, sizeof why_buf)))
            continue;
        tw_config_error(cfg, line_or_section(a->line_of[i_agent], a->section_line), "[agent.%s] exec: %s %s",
                        a->name, a->argv[0], why);
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        const TwToolConf *t = &cfg->tools[i];
        char *const *argv = t->mcp_argv ? t->mcp_argv : t->argv;
        if (t->external || !argv || !tw_config_serves(cfg, t->name) ||
            !(why = program_problem(argv[0], why_buf, sizeof why_buf)))
            continue;
        tw_config_error(
            cfg,
            line_or_section(t->line_of[t->mcp_argv ? pidx(TW_SEC_TOOL, "mcp") : i_tool], t->section_line),
            "[tool.%s] %s: %s %s", t->name, t->mcp_argv ? "mcp" : "exec", argv[0], why);
    }
    if (tw_config_check_limits(cfg, geteuid()) != 0)
        return -1;
    return cfg->n_errors > before ? -1 : 0;
}

/* Whether a user with uid and gid (its primary group only: a program runs without supplementary groups)
 * has `want` (R_OK and X_OK, the same bits as a mode's) on st by its mode bits; ACLs are not read. Root may
 * do anything but execute a file without an x bit. */
static bool user_may(const struct stat *st, uid_t uid, gid_t gid, int want)
{
    if (uid == 0)
        return !(want & X_OK) || S_ISDIR(st->st_mode) || (st->st_mode & (S_IXUSR | S_IXGRP | S_IXOTH));
    int shift = st->st_uid == uid ? 6 : st->st_gid == gid ? 3 : 0;
    return (int)((st->st_mode >> shift) & 7 & (mode_t)want) == want;
}

/* Why the user cannot start the program at path (why, or NULL when it can, or when path cannot be looked
 * at: program_problem says that): a directory along the path, as written and as resolved, that it may not
 * search; the file, that it may not execute, or read when it is a script (its interpreter reads it). */
static const char *user_cannot_run(const char *path, uid_t uid, gid_t gid, char *why, size_t len)
{
    char *real = realpath(path, NULL);
    const char *paths[] = {path, real};
    struct stat st;
    const char *problem = NULL;

    for (size_t k = 0; k < 2 && !problem; k++) {
        const char *p = paths[k];
        if (!p || p[0] != '/')
            continue;
        for (const char *slash = p; slash && !problem; slash = strchr(slash + 1, '/')) {
            char dir[4096];
            int n = snprintf(dir, sizeof dir, "%.*s", slash == p ? 1 : (int)(slash - p), p);
            if (n < 0 || (size_t)n >= sizeof dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
                continue;
            if (!user_may(&st, uid, gid, X_OK)) {
                snprintf(why, len, "it may not search %s (mode %04o, owner uid %u gid %u)", dir,
                         (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid);
                problem = why;
            }
        }
    }
    free(real);
    if (problem || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return problem;
    if (!user_may(&st, uid, gid, X_OK)) {
        snprintf(why, len, "it may not execute it (mode %04o, owner uid %u gid %u)",
                 (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid);
        return why;
    }
    char head[2] = {0};
    FILE *f = fopen(path, "re");
    bool script = f && fread(head, 1, 2, f) == 2 && head[0] == '#' && head[1] == '!';
    if (f)
        fclose(f);
    if (script && !user_may(&st, uid, gid, R_OK)) {
        snprintf(why, len, "it may not read it, and it is a script (mode %04o, owner uid %u gid %u)",
                 (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid);
        return why;
    }
    return NULL;
}

/* The line of a limits key of a section: its own, else [worker]'s it inherited, else the section header. */
static int limit_line(const TwConfig *cfg, TwSection sec, const int *line_of, int section_line,
                      const char *key)
{
    int own = line_of[pidx(sec, key)], dflt = cfg->line_of[pidx(TW_SEC_WORKER, key)];

    return own ? own : dflt ? dflt : section_line;
}

static void check_one_limits(TwConfig *cfg, TwSection sec, const char *name, const TwLimitsConf *l,
                             const char *program, const int *line_of, int section_line, uid_t euid)
{
    const char *kind = tw_config_section_name(sec);
    bool as_root = euid == 0;

    if (l->run_as_user && *l->run_as_user) {
        struct passwd pw, *found = NULL;
        char buf[4096];
        int rc = getpwnam_r(l->run_as_user, &pw, buf, sizeof buf, &found);
        int line = limit_line(cfg, sec, line_of, section_line, "run_as_user");
        if (euid != 0)
            tw_config_error(cfg, line,
                            "[%s.%s] run_as_user: the worker must run as root to start a program as another "
                            "user (it runs as uid %u)",
                            kind, name, (unsigned)euid);
        else if (!found)
            tw_config_error(cfg, line, "[%s.%s] run_as_user: %s", kind, name,
                            rc ? strerror(rc) : "no such user");
        char why[4096 + 128];
        if (found && euid == 0 && user_cannot_run(program, pw.pw_uid, pw.pw_gid, why, sizeof why))
            tw_config_error(cfg, line, "[%s.%s] run_as_user: %s cannot run %s: %s", kind, name,
                            l->run_as_user, program, why);
        as_root = found && pw.pw_uid == 0;
    }
    if (l->max_open_files > 0 && l->max_open_files < TW_MIN_OPEN_FILES)
        tw_config_error(cfg, limit_line(cfg, sec, line_of, section_line, "max_open_files"),
                        "[%s.%s] max_open_files: %d is too few for a program to start (at least %d: its "
                        "stdin, stdout and stderr, the libraries its dynamic loader opens, a shell's "
                        "redirections), or 0 for no limit",
                        kind, name, l->max_open_files, TW_MIN_OPEN_FILES);
    /* RLIMIT_NPROC does not hold a process of root (nor one with CAP_SYS_RESOURCE): a silent no-op. */
    if (l->max_processes > 0 && as_root)
        tw_config_error(
            cfg, limit_line(cfg, sec, line_of, section_line, "max_processes"),
            "[%s.%s] max_processes: does not apply to a program that runs as root; set run_as_user "
            "as well",
            kind, name);
}

int tw_config_check_limits(TwConfig *cfg, uid_t euid)
{
    int before = cfg->n_errors;

    for (size_t i = 0; i < cfg->n_agents; i++) {
        const TwAgentConf *a = &cfg->agents[i];
        if (a->argv && tw_config_serves(cfg, a->name))
            check_one_limits(cfg, TW_SEC_AGENT, a->name, &a->limits, a->argv[0], a->line_of, a->section_line,
                             euid);
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        const TwToolConf *t = &cfg->tools[i];
        char *const *argv = t->mcp_argv ? t->mcp_argv : t->argv;
        if (argv && !t->external && tw_config_serves(cfg, t->name))
            check_one_limits(cfg, TW_SEC_TOOL, t->name, &t->limits, argv[0], t->line_of, t->section_line,
                             euid);
    }
    return cfg->n_errors > before ? -1 : 0;
}
