/* fixture.c — integration test fixture: its lifetime (create, free, the atexit stop of every live fixture's
 * servers) and the sweep of stale fixtures. The other parts: fixture_util.c (utilities, paths, ports),
 * fixture_proc.c (running programs, processes), fixture_pg.c (PostgreSQL, SQL, TLS), fixture_nats.c
 * (nats-server, the event collector), fixture_daemons.c (daemons, CLI, INI writer), fixture_http.c (HTTP and
 * Prometheus). See fixture.h for the design. */
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

/* Every fixture not yet freed, so the atexit handler can stop its servers. Tests are single-threaded. */
static TwFx *fx_live;
static bool fx_atexit_registered;

/* ---- lifetime
 * --------------------------------------------------------------------------------------------------- */

static void fx_atexit(void)
{
    /* nats.c tears itself down in its own destructor; calling nats_CloseAndWait() here as well crashes 3.4.x
     * at exit (its destructor then locks freed memory; fixed upstream in nats.c PR #1020). */
    while (fx_live)
        tw_fx_free(fx_live);
}

TwFx *tw_fx_new(void)
{
    TwFx *fx = calloc(1, sizeof *fx);
    if (!fx)
        abort();
    char tmpl[] = "/tmp/" FX_TMP_PREFIX "XXXXXX";
    if (!mkdtemp(tmpl))
        fx_fail("mkdtemp: %s", strerror(errno));
    fx->dir = fx_xstrdup(tmpl);
    fx->owner = getpid();
    /* The postgres user must be able to reach pg/ below it when we run as root. */
    chmod(fx->dir, 0755);
    char *owner = fx_asprintf("%s/owner", fx->dir);
    FILE *f = fopen(owner, "w");
    if (f) {
        fprintf(f, "%d %llu\n", (int)fx->owner, fx_proc_starttime(fx->owner));
        fclose(f);
    }
    free(owner);
    fx->next_live = fx_live;
    fx_live = fx;
    if (!fx_atexit_registered) {
        atexit(fx_atexit);
        fx_atexit_registered = true;
    }
    return fx;
}

TwFx *tw_fx_new_all(void)
{
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    tw_fx_write_config(fx, NULL, NULL);
    return fx;
}

TwFx *tw_fx_new_migrated(const char *overrides)
{
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    tw_fx_write_config(fx, NULL, overrides);
    tw_fx_migrate(fx);
    return fx;
}

const char *tw_fx_dir(const TwFx *fx)
{
    return fx->dir;
}

void tw_fx_free(TwFx *fx)
{
    if (!fx)
        return;
    /* A forked child that inherited the fixture must not tear down its parent's servers. */
    bool mine = fx->owner == getpid();
    while (fx->events)
        tw_fx_events_free(fx->events);
    if (fx->pub)
        natsConnection_Destroy(fx->pub);
    if (mine) {
        for (TwFxProc *p = fx->procs; p; p = p->next)
            if (tw_fx_proc_alive(p)) {
                kill(p->pid, SIGCONT);
                kill(p->pid, SIGTERM);
            }
        for (TwFxProc *p = fx->procs; p; p = p->next)
            if (!tw_fx_proc_wait(p, 5000, NULL))
                tw_fx_proc_kill9(p);
        fx_nats_halt(fx);
    }
    while (fx->procs) {
        TwFxProc *p = fx->procs;
        fx->procs = p->next;
        fx_proc_destroy(p);
    }
    PQfinish(fx->conn);
    /* Also when a start timed out half-way: the pid file, not our flag, says whether a postmaster may be up.
     */
    if (mine && fx->pg_inited && fx_pg_has_pidfile(fx))
        fx_pg_ctl(fx, "stop", "immediate", NULL);
    /* Every path keeps the lock order (sql/README.md): a deadlock PostgreSQL had to break fails the test that
     * caused it, whatever else it checked. */
    char deadlock[600] = "";
    if (mine && fx->pg_log) {
        char *log = fx_read_file(fx->pg_log), *at = log ? strstr(log, "deadlock detected") : NULL;
        if (at) {
            snprintf(deadlock, sizeof deadlock, "%s", at);
            fprintf(stderr, "fixture: PostgreSQL detected a deadlock (%s):\n%s\n", fx->pg_log, deadlock);
        }
        free(log);
    }
    if (mine) {
        const char *keep = getenv("TW_FX_KEEP");
        if (keep && *keep && strcmp(keep, "0") != 0)
            fprintf(stderr, "fixture: kept %s\n", fx->dir);
        else
            fx_rm_rf(fx->dir);
    }
    for (TwFx **pp = &fx_live; *pp; pp = &(*pp)->next_live)
        if (*pp == fx) {
            *pp = fx->next_live;
            break;
        }
    while (fx->owned) {
        FxStr *s = fx->owned;
        fx->owned = s->next;
        free(s->s);
        free(s);
    }
    free(fx->dir);
    free(fx->pg_dir);
    free(fx->pg_data);
    free(fx->pg_log);
    free(fx->pg_dsn);
    free(fx->pg_conninfo);
    free(fx->nats_url);
    free(fx->nats_conf);
    free(fx->config_path);
    free(fx);
    ck_assert_msg(deadlock[0] == '\0', "PostgreSQL detected a deadlock: %s", deadlock);
}

TwFxStack tw_fx_stack_start_events(const char *overrides, const char *pattern)
{
    TwFxStack st = {0};
    st.fx = tw_fx_new_migrated(overrides);
    if (pattern)
        st.ev = tw_fx_events_new(st.fx, pattern);
    st.pmo = tw_fx_start_pmo(st.fx, NULL);
    st.worker = tw_fx_start_worker(st.fx, NULL);
    return st;
}

TwFxStack tw_fx_stack_start(const char *overrides)
{
    return tw_fx_stack_start_events(overrides, "evt.>");
}

/* ---- stale fixtures
 * --------------------------------------------------------------------------------------------- */

void tw_fx_sweep_stale(void)
{
    DIR *d = opendir("/tmp");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, FX_TMP_PREFIX, strlen(FX_TMP_PREFIX)) != 0)
            continue;
        char *dir = fx_asprintf("/tmp/%s", de->d_name);
        char *owner_path = fx_asprintf("%s/owner", dir);
        FILE *f = fopen(owner_path, "r");
        int pid = 0;
        unsigned long long start = 0;
        bool known = f && fscanf(f, "%d %llu", &pid, &start) == 2;
        if (f)
            fclose(f);
        struct stat st;
        /* A directory without owner is either being created right now or very old debris. */
        bool stale = known ? (pid != getpid() && (start == 0 || fx_proc_starttime(pid) != start))
                           : (stat(dir, &st) == 0 && time(NULL) - st.st_mtime > 3600);
        if (stale) {
            TwFx tmp = {.dir = dir};
            tmp.pg_dir = fx_asprintf("%s/pg", dir);
            tmp.pg_data = fx_asprintf("%s/data", tmp.pg_dir);
            tmp.pg_log = fx_asprintf("%s/postgres.log", tmp.pg_dir);
            if (fx_pg_has_pidfile(&tmp))
                fx_pg_ctl(&tmp, "stop", "immediate", NULL);
            /* An HA formation a test made there (test_ha: tools/lib/ha-formation), left running by a timeout.
             */
            char *ha_env = fx_asprintf("%s/ha/ha.env", dir), *ha_dir = fx_asprintf("%s/ha", dir);
            char *script = fx_asprintf("%s/tools/lib/ha-formation", tw_fx_source_dir());
            if (access(ha_env, F_OK) == 0 && access(script, X_OK) == 0) {
                const char *argv[] = {script, "stop", ha_dir, NULL};
                (void)tw_fx_run_full(argv, NULL, NULL, NULL, 120000);
            }
            free(script);
            free(ha_dir);
            free(ha_env);
            fprintf(stderr, "fixture: removed stale %s (owner %d gone)\n", dir, pid);
            fx_rm_rf(dir);
            free(tmp.pg_dir);
            free(tmp.pg_data);
            free(tmp.pg_log);
        }
        free(owner_path);
        free(dir);
    }
    closedir(d);
}
