/* turn_helpers.h — helpers shared by the integration tests that drive turns (the watchdog, cancel, due,
 * policy, console, serve, ... suites): submitting turns, waiting for states, reading the watchdog log lines
 * (`watchdog rule="NAME" {json}`), checking the output contract of a forced end, and reporting measured
 * delays. Defined once in turn_helpers.c, which is part of the test support library (tests/meson.build). */
#ifndef TW_TESTS_TURN_HELPERS_H
#define TW_TESTS_TURN_HELPERS_H

#include "fixture.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WD_WAIT_MS 20000

char *wd_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Appends to a growing malloc'd string (config overrides). */
void wd_append(char **s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* [agent.<prefix>NN] sections, NN = 01..n, running `exec` (a whole exec line). */
void wd_agents(char **s, const char *prefix, int n, const char *exec);

/* "p01,p02,...,pNN" (malloc'd). */
char *wd_names(const char *prefix, int n);

/* Servers up, the default config written with `overrides`, the schema migrated. */
TwFx *wd_fixture(const char *overrides);

/* An executable sh script in the fixture dir; returns "/bin/sh PATH" for an exec line (malloc'd). */
char *wd_script(TwFx *fx, const char *name, const char *body);

/* `turnwatch submit --json` on channel "chan-1"; box, timeout and profile may be NULL. Returns the turn id
 * (malloc'd). */
char *wd_submit_with(TwFx *fx, const char *agent, const char *input, const char *box, const char *timeout,
                     const char *profile);

char *wd_submit_full(TwFx *fx, const char *agent, const char *input, const char *box, const char *timeout);

char *wd_submit(TwFx *fx, const char *agent, const char *input);

/* Submits through tw.submit_turn directly (many turns quickly); timeout_s NULL for none. */
char *wd_submit_sql(TwFx *fx, const char *agent, const char *input, const char *timeout_s);

/* `turnwatch tool-result --turn T --call C --output JSON`: its exit code. */
int wd_tool_result(TwFx *fx, const char *turn, const char *call, const char *output);

bool wd_wait_status(TwFx *fx, const char *turn, const char *status);

/* Waits up to `ms` for the turn to have `status`; fails with its status and error otherwise. `at` is the
 * caller's line. */
void wd_status_within(int at, TwFx *fx, const char *turn, const char *status, int ms);

#define WD_STATUS_WITHIN(fx, turn, status, ms) wd_status_within(__LINE__, (fx), (turn), (status), (ms))
#define WD_STATUS_IS(fx, turn, status) WD_STATUS_WITHIN(fx, turn, status, WD_WAIT_MS)

/* Every action a rule logged in `log` ("watchdog rule=\"NAME\" {json}"), appended to `into`. */
void wd_actions(const char *log, const char *rule, json_t *into);

/* The actions of one rule in the logs of n processes (a new array). */
json_t *wd_actions_of(TwFxProc *const *procs, size_t n, const char *rule);

/* How many actions one rule logged in the logs of n processes. */
size_t wd_action_count(TwFxProc *const *procs, size_t n, const char *rule);

/* Keeps the actions whose string field `key` equals `value` (a new array). */
json_t *wd_actions_where(json_t *actions, const char *key, const char *value);

/* How many actions have the same value of `key` as another one (0: all distinct). */
size_t wd_actions_dups(json_t *actions, const char *key);

/* How many distinct values of `key` the actions have. */
size_t wd_actions_distinct(json_t *actions, const char *key);

/* The count a daemon's last "watchdog counters" log line gives for `rule` (-1 if there is none). */
long wd_counter(TwFxProc *p, const char *rule);

int wd_cmp_i64(const void *a, const void *b);

/* Prints "MEASURE <what>: n= median= max= min=" from the actions' lateness_ms (database clock: action time
 * minus due time) and asserts each is in [0, max_ok_ms]. */
void wd_report_delays(const char *what, json_t *actions, int max_ok_ms);

/* One rule acted exactly `count` times in the logs of n processes, each time within max_ok_ms of when it was
 * due; its delays are reported as wd_report_delays does under `what`. */
void wd_assert_acted(TwFxProc *const *procs, size_t n, const char *rule, size_t count, const char *what,
                     int max_ok_ms);

/* Final events on NATS for one turn (the collector must subscribe to evt.agent.*.task or wider). */
size_t wd_task_events(TwFxEvents *ev, const char *turn);

/* Each of n turns' final event arrived on NATS (the collector must subscribe to evt.agent.*.task or wider);
 * their ids are freed. */
void wd_finals_then_free(TwFxEvents *ev, char **turns, size_t n);

/* Kills the pids listed one per line ("name pid"): programs orphaned by a SIGKILLed worker. */
void wd_kill_listed(const char *path);

int wd_count_lines(const char *path);

typedef struct WdLines {
    const char *path;
    int n;
} WdLines;

bool wd_has_lines(void *arg);

typedef struct WdLogHas {
    TwFxProc *proc;
    const char *a, *b; /* both must occur on one line (b may be NULL) */
} WdLogHas;

bool wd_log_line_has(void *arg);

bool wd_pid_gone(void *arg);

/* pid of the program agent `name` started, from a "name pid" list (0 if none). */
pid_t wd_listed_pid(const char *path, const char *name);

/* True when every child of `pid` has exited (is a zombie its frozen parent cannot reap yet). */
bool wd_children_exited(void *arg);

/* No "deadlock detected" in the PostgreSQL log: every path takes its locks in one order. */
void wd_assert_no_deadlock(TwFx *fx);

/* The end of a test: no deadlock in PostgreSQL's log, then the fixture freed with all it keeps. */
void wd_done(TwFx *fx);

/* Matches events whose turn_id is `arg` (for tw_fx_events_*_if). */
bool wd_is_turn(const char *subject, const json_t *data, void *arg);

typedef struct WdStateMatch {
    const char *turn, *status;
} WdStateMatch;

/* Matches evt.agent.*.state events of one turn with one status. */
bool wd_is_state(const char *subject, const json_t *data, void *arg);

/*
 * The output contract of a forced end (2.5, 2.6, turn deadline, cancel): the turn ended with
 * `status`/`reason` and a deliverable card; one force-termination record with the reason; a fallback
 * task.deliverable card marked partial (in `box` when given); one task event in the outbox and on NATS with
 * the status, the error and the card id; the state event idle/<reason> with the bumped epoch (unless the turn
 * never left `pending`, `epoch_before` < 0). `ev` collects "evt.>" (or evt.agent.<a>.>). Returns the
 * deliverable card id (malloc'd).
 */
char *wd_check_forced_end(TwFx *fx, TwFxEvents *ev, const char *turn, const char *status, const char *reason,
                          const char *box, int64_t epoch_before);

#endif
