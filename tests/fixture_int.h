/* fixture_int.h — private to the fixture's files (fixture*.c): its structures and the helpers one part of the
 * fixture uses from another. Tests include fixture.h only. */
#ifndef TW_TESTS_FIXTURE_INT_H
#define TW_TESTS_FIXTURE_INT_H

#include "fixture.h"

#include <libpq-fe.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

#define FX_TMP_PREFIX "twfx-"
#define FX_RUN_TIMEOUT_MS 60000
#define FX_PG_TIMEOUT_MS 90000
#define FX_SQL_MAX_PARAMS 32
#define FX_POLL_MS 20

struct TwFxProc {
    TwFx *fx;
    char *name;
    char *log_path;
    pid_t pid;
    bool reaped;
    int status; /* raw wait status once reaped */
    TwFxProc *next;
};

typedef struct FxMsg {
    char *subject;
    char *data;
    json_t *json; /* NULL when the payload is not JSON */
    int64_t recv_ms;
} FxMsg;

struct TwFxEvents {
    TwFx *fx;
    natsConnection *nc;
    natsSubscription *sub;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    FxMsg **msgs;
    size_t n, cap;
    json_t *seen;      /* event_id -> true (NULL: keep every message): an event_id seen before is dropped */
    size_t duplicates; /* how many were dropped as such */
    TwFxEvents *next;
};

typedef struct FxStr {
    char *s;
    struct FxStr *next;
} FxStr;

struct TwFx {
    char *dir;
    pid_t owner;
    /* PostgreSQL */
    char *pg_dir, *pg_data, *pg_log, *pg_dsn, *pg_conninfo;
    int pg_port;
    bool pg_inited, pg_running;
    PGconn *conn;
    /* nats-server */
    int nats_port;
    char *nats_url;
    TwFxProc *nats;
    natsConnection *pub;
    char *nats_conf;          /* tw_fx_nats_set_conf: the server's -c file, or NULL */
    TwFxNatsSetup nats_setup; /* tw_fx_nats_client: TLS and credentials of the fixture's own connections */
    void *nats_setup_arg;
    /* everything else */
    TwFxProc *procs;
    unsigned spawn_seq;
    TwFxEvents *events;
    char *config_path;
    FxStr *owned; /* strings freed with the fixture (extra config paths, tw_fx_keep) */
    TwFx *next_live;
};

/* fixture_util.c */
__attribute__((noreturn, format(printf, 1, 2))) void fx_fail(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) char *fx_asprintf(const char *fmt, ...);
void *fx_xmalloc(size_t n);
void *fx_xrealloc(void *p, size_t n);
char *fx_xstrdup(const char *s);
char *fx_read_file(const char *path);
char *fx_file_tail(const char *path, size_t max);
bool fx_is_executable(const char *path);
char *fx_which(const char *name);
bool fx_loopback_probe(int port, bool connect_to_it);
int fx_free_port(void);
void fx_rm_rf(const char *path);
unsigned long long fx_proc_starttime(pid_t pid);
/* fixture_proc.c */
int fx_run(const char *const argv[], const char *input, char **out, char **err, int timeout_ms,
           const char *cwd);
TwFxProc *fx_proc_start(TwFx *fx, const char *name, const char *log_name, const char *const argv[]);
void fx_proc_destroy(TwFxProc *p);
/* fixture_pg.c */
bool fx_pg_has_pidfile(const TwFx *fx);
int fx_pg_ctl(TwFx *fx, const char *action, const char *mode, char **out);
/* fixture_nats.c */
void fx_nats_halt(TwFx *fx);

#endif
