/* fixture_daemons.c — starting the daemons and the CLI, and the INI writer of their configs. See fixture.h.
 */
#include "fixture_int.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <libpq-fe.h>
#include <math.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- daemons and CLI
 * -------------------------------------------------------------------------------------------- */

static const char *fx_config_or_default(TwFx *fx, const char *config)
{
    if (config)
        return config;
    if (!fx->config_path)
        fx_fail("no config written yet (tw_fx_write_config)");
    return fx->config_path;
}

static TwFxProc *fx_start_daemon(TwFx *fx, const char *kind, const char *bin, const char *config)
{
    const char *argv[] = {bin, "-c", fx_config_or_default(fx, config), NULL};
    char name[64];
    snprintf(name, sizeof name, "%s-%u", kind, ++fx->spawn_seq);
    return tw_fx_spawn(fx, name, argv);
}

TwFxProc *tw_fx_start_pmo(TwFx *fx, const char *config)
{
    return fx_start_daemon(fx, "pmo", tw_fx_pmo_path(), config);
}

TwFxProc *tw_fx_start_worker(TwFx *fx, const char *config)
{
    return fx_start_daemon(fx, "worker", tw_fx_worker_path(), config);
}

int tw_fx_cli(TwFx *fx, char **out, char **err, ...)
{
    const char *argv[64];
    size_t n = 0;
    argv[n++] = tw_fx_cli_path();
    argv[n++] = "-c";
    argv[n++] = fx_config_or_default(fx, NULL);
    va_list ap;
    va_start(ap, err);
    for (const char *a = va_arg(ap, const char *); a; a = va_arg(ap, const char *)) {
        if (n >= 63)
            fx_fail("tw_fx_cli: too many arguments");
        argv[n++] = a;
    }
    va_end(ap);
    argv[n] = NULL;
    return tw_fx_run(argv, out, err);
}

void tw_fx_migrate(TwFx *fx)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "migrate", NULL);
    if (rc != 0) {
        fprintf(stderr, "fixture: turnwatch migrate exited %d\nstdout:\n%s\nstderr:\n%s\n", rc, out, err);
        free(out);
        free(err);
        fx_fail("turnwatch migrate exited %d, see stderr", rc);
    }
    free(out);
    free(err);
}

void tw_fx_proc_dump(const TwFxProc *p)
{
    char *log = tw_fx_proc_log(p);
    fprintf(stderr, "---- %s ----\n%s\n", tw_fx_proc_log_path(p), log);
    free(log);
}

void tw_fx_stack_dump(const TwFxStack *st)
{
    tw_fx_events_dump(st->ev);
    tw_fx_proc_dump(st->worker);
    tw_fx_proc_dump(st->pmo);
}

/* ---- INI writer
 * ------------------------------------------------------------------------------------------------- */

/* An INI file as ordered sections of ordered lines; a line with val == NULL is kept verbatim. */
typedef struct FxIniLine {
    char *key, *val;
} FxIniLine;

typedef struct FxIniSec {
    char *name; /* "" for lines before any [section] */
    FxIniLine *lines;
    size_t n;
} FxIniSec;

typedef struct FxIni {
    FxIniSec *secs;
    size_t n;
} FxIni;

static FxIniSec *fx_ini_section(FxIni *ini, const char *name)
{
    for (size_t i = 0; i < ini->n; i++)
        if (strcmp(ini->secs[i].name, name) == 0)
            return &ini->secs[i];
    ini->secs = fx_xrealloc(ini->secs, (ini->n + 1) * sizeof *ini->secs);
    /* Keys given before any section belong at the very top, where an INI parser sees them as section-less. */
    size_t at = *name ? ini->n : 0;
    memmove(&ini->secs[at + 1], &ini->secs[at], (ini->n - at) * sizeof *ini->secs);
    ini->secs[at] = (FxIniSec){.name = fx_xstrdup(name)};
    ini->n++;
    return &ini->secs[at];
}

static void fx_ini_add_line(FxIniSec *sec, const char *key, const char *val)
{
    sec->lines = fx_xrealloc(sec->lines, (sec->n + 1) * sizeof *sec->lines);
    sec->lines[sec->n++] = (FxIniLine){.key = fx_xstrdup(key), .val = val ? fx_xstrdup(val) : NULL};
}

static void fx_ini_set(FxIni *ini, const char *section, const char *key, const char *val)
{
    FxIniSec *sec = fx_ini_section(ini, section);
    for (size_t i = 0; i < sec->n; i++)
        if (sec->lines[i].val && strcmp(sec->lines[i].key, key) == 0) {
            free(sec->lines[i].val);
            sec->lines[i].val = fx_xstrdup(val);
            return;
        }
    fx_ini_add_line(sec, key, val);
}

static void fx_ini_free_section(FxIniSec *sec)
{
    for (size_t i = 0; i < sec->n; i++) {
        free(sec->lines[i].key);
        free(sec->lines[i].val);
    }
    free(sec->lines);
    free(sec->name);
}

static void fx_ini_del_key(FxIni *ini, const char *section, const char *key)
{
    FxIniSec *sec = fx_ini_section(ini, section);
    for (size_t i = 0; i < sec->n; i++)
        if (sec->lines[i].val && strcmp(sec->lines[i].key, key) == 0) {
            free(sec->lines[i].key);
            free(sec->lines[i].val);
            memmove(&sec->lines[i], &sec->lines[i + 1], (sec->n - i - 1) * sizeof *sec->lines);
            sec->n--;
            return;
        }
}

static void fx_ini_del_section(FxIni *ini, const char *section)
{
    for (size_t i = 0; i < ini->n; i++)
        if (strcmp(ini->secs[i].name, section) == 0) {
            fx_ini_free_section(&ini->secs[i]);
            memmove(&ini->secs[i], &ini->secs[i + 1], (ini->n - i - 1) * sizeof *ini->secs);
            ini->n--;
            return;
        }
}

static void fx_ini_free(FxIni *ini)
{
    for (size_t i = 0; i < ini->n; i++)
        fx_ini_free_section(&ini->secs[i]);
    free(ini->secs);
}

static char *fx_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* Applies the override language documented at tw_fx_write_config. */
static void fx_ini_apply(FxIni *ini, const char *overrides)
{
    char *copy = fx_xstrdup(overrides), *save = NULL;
    char *section = fx_xstrdup("");
    for (char *raw = strtok_r(copy, "\n", &save); raw; raw = strtok_r(NULL, "\n", &save)) {
        char *line = fx_trim(raw);
        size_t len = strlen(line);
        if (len == 0 || line[0] == ';' || line[0] == '#')
            continue;
        if (line[0] == '[' && line[len - 1] == ']') {
            free(section);
            line[len - 1] = '\0';
            section = fx_xstrdup(fx_trim(line + 1));
            fx_ini_section(ini, section);
        } else if (line[0] == '!' && line[1] == '[' && line[len - 1] == ']') {
            line[len - 1] = '\0';
            fx_ini_del_section(ini, fx_trim(line + 2));
        } else if (line[0] == '!') {
            fx_ini_del_key(ini, section, fx_trim(line + 1));
        } else if (strchr(line, '=')) {
            char *eq = strchr(line, '=');
            *eq = '\0';
            fx_ini_set(ini, section, fx_trim(line), fx_trim(eq + 1));
        } else {
            fx_ini_add_line(fx_ini_section(ini, section), line, NULL);
        }
    }
    free(section);
    free(copy);
}

/* A [<kind>.<name>] section whose exec is `program` in the build tree, then the lines of `keys`. */
static void fx_program_section(FxIni *ini, const char *kind, const char *name, const char *program,
                               const char *keys)
{
    char *exec = tw_fx_build_path(program);
    char *text = fx_asprintf("[%s.%s]\nexec = %s\n%s", kind, name, exec, keys);
    fx_ini_apply(ini, text);
    free(text);
    free(exec);
}

/* The base config: every key of contract §3, periods short enough for tests and consistent with the cross-key
 * rules (retry 2 < timeout 6, wakeup 2 < skip 10, heartbeat 1 < reap 10/2 and < processing 10/2). */
static void fx_base_config(TwFx *fx, FxIni *ini)
{
    static const char keys[] = "[pmo]\n"
                               "watchdog_interval_seconds = 1\n"
                               "dispatched_retry_seconds = 2\n"
                               "dispatched_timeout_seconds = 6\n"
                               "pending_wakeup_seconds = 2\n"
                               "pending_wakeup_skip_seconds = 10\n"
                               "active_reap_seconds = 10\n"
                               "[worker]\n"
                               "inbox_processing_timeout_seconds = 10\n"
                               "watchdog_interval_seconds = 1\n"
                               "suspend_timeout_seconds = 30\n"
                               "heartbeat_seconds = 1\n"
                               "concurrency = 4\n"
                               "agents = *\n";
    static const char *const agents[][2] = {
        {"echo", "examples/agents/tw-echo-agent"},   {"failer", "examples/agents/tw-fail-agent"},
        {"tester", "examples/agents/tw-test-agent"}, {"fanout", "examples/agents/tw-fanout-agent"},
        {"racer", "examples/agents/tw-race-agent"},
    };
    static const char *const tools[][2] = {
        {"sleep", "examples/tools/tw-sleep-tool"},
        {"fail", "examples/tools/tw-fail-tool"},
        {"garbage", "examples/tools/tw-garbage-tool"},
        {"echo", "examples/tools/tw-echo-tool"},
    };
    if (!fx->pg_dsn || !fx->nats_url)
        fx_fail("start PostgreSQL and nats-server before writing a config");
    fx_ini_set(ini, "postgres", "dsn", fx->pg_dsn);
    fx_ini_set(ini, "nats", "url", fx->nats_url);
    fx_ini_apply(ini, keys);
    for (size_t i = 0; i < sizeof agents / sizeof agents[0]; i++)
        fx_program_section(ini, "agent", agents[i][0], agents[i][1],
                           "step_timeout_seconds = 10\nkill_grace_seconds = 1\n");
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++)
        fx_program_section(ini, "tool", tools[i][0], tools[i][1],
                           "external = false\ntimeout_seconds = 10\nsuspend_timeout_seconds = 20\n");
    fx_ini_apply(ini, "[tool.ext]\nexternal = true\ntimeout_seconds = 30\nsuspend_timeout_seconds = 30\n");
}

const char *tw_fx_write_config(TwFx *fx, const char *name, const char *overrides)
{
    FxIni ini = {0};
    fx_base_config(fx, &ini);
    if (overrides)
        fx_ini_apply(&ini, overrides);
    char *path = fx_asprintf("%s/%s", fx->dir, name ? name : "turnwatch.ini");
    FILE *f = fopen(path, "w");
    if (!f)
        fx_fail("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "; written by the turnwatch test fixture (tests/fixture.c)\n");
    for (size_t i = 0; i < ini.n; i++) {
        if (*ini.secs[i].name)
            fprintf(f, "\n[%s]\n", ini.secs[i].name);
        for (size_t j = 0; j < ini.secs[i].n; j++) {
            const FxIniLine *l = &ini.secs[i].lines[j];
            if (l->val)
                fprintf(f, "%s = %s\n", l->key, l->val);
            else
                fprintf(f, "%s\n", l->key);
        }
    }
    bool ok = fclose(f) == 0;
    fx_ini_free(&ini);
    if (!ok)
        fx_fail("cannot write %s", path);
    if (!name) {
        free(fx->config_path);
        fx->config_path = path;
        return path;
    }
    return tw_fx_keep(fx, path);
}

const char *tw_fx_config_path(const TwFx *fx)
{
    return fx->config_path;
}
