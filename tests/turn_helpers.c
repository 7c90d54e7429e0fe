/* turn_helpers.c — the definitions of turn_helpers.h (see there). */
#include "turn_helpers.h"

char *wd_fmt(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;

    va_start(ap, fmt);
    ck_assert_int_ge(vasprintf(&s, fmt, ap), 0);
    va_end(ap);
    return s;
}

void wd_append(char **s, const char *fmt, ...)
{
    va_list ap;
    char *add = NULL, *all = NULL;

    va_start(ap, fmt);
    ck_assert_int_ge(vasprintf(&add, fmt, ap), 0);
    va_end(ap);
    ck_assert_int_ge(asprintf(&all, "%s%s", *s ? *s : "", add), 0);
    free(*s);
    free(add);
    *s = all;
}

void wd_agents(char **s, const char *prefix, int n, const char *exec)
{
    for (int i = 1; i <= n; i++)
        wd_append(s, "[agent.%s%02d]\nexec = %s\nstep_timeout_seconds = 10\nkill_grace_seconds = 1\n", prefix,
                  i, exec);
}

char *wd_names(const char *prefix, int n)
{
    char *s = NULL;
    for (int i = 1; i <= n; i++)
        wd_append(&s, "%s%s%02d", i > 1 ? "," : "", prefix, i);
    return s;
}

TwFx *wd_fixture(const char *overrides)
{
    return tw_fx_new_migrated(overrides);
}

char *wd_script(TwFx *fx, const char *name, const char *body)
{
    char *path = wd_fmt("%s/%s", tw_fx_dir(fx), name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "#!/bin/sh\n%s", body);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(path, 0755), 0);
    char *exec = wd_fmt("/bin/sh %s", path);
    free(path);
    return exec;
}

char *wd_submit_with(TwFx *fx, const char *agent, const char *input, const char *box, const char *timeout,
                     const char *profile)
{
    /* The options given, in pairs; the first NULL ends tw_fx_cli's arguments. */
    const char *opt[7] = {NULL};
    size_t n = 0;
    if (box) {
        opt[n++] = "--box";
        opt[n++] = box;
    }
    if (timeout) {
        opt[n++] = "--timeout";
        opt[n++] = timeout;
    }
    if (profile) {
        opt[n++] = "--profile";
        opt[n++] = profile;
    }
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "submit", "--json", "--agent", agent, "--channel", "chan-1", "--input",
                       input, opt[0], opt[1], opt[2], opt[3], opt[4], opt[5], NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    char *id = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    return id;
}

char *wd_submit_full(TwFx *fx, const char *agent, const char *input, const char *box, const char *timeout)
{
    return wd_submit_with(fx, agent, input, box, timeout, NULL);
}

char *wd_submit(TwFx *fx, const char *agent, const char *input)
{
    return wd_submit_full(fx, agent, input, NULL, NULL);
}

char *wd_submit_sql(TwFx *fx, const char *agent, const char *input, const char *timeout_s)
{
    char *id = tw_fx_sql_str(fx, "SELECT tw.submit_turn($1, 'chan-1', $2::jsonb, $3::integer)::text", 3,
                             agent, input, timeout_s);
    ck_assert_ptr_nonnull(id);
    return id;
}

int wd_tool_result(TwFx *fx, const char *turn, const char *call, const char *output)
{
    char *out = NULL, *err = NULL;
    int rc =
        tw_fx_cli(fx, &out, &err, "tool-result", "--turn", turn, "--call", call, "--output", output, NULL);
    free(out);
    free(err);
    return rc;
}

bool wd_wait_status(TwFx *fx, const char *turn, const char *status)
{
    return tw_fx_sql_wait(fx, WD_WAIT_MS, status, "SELECT status FROM state.turns WHERE turn_id = $1", 1,
                          turn);
}

void wd_status_within(int at, TwFx *fx, const char *turn, const char *status, int ms)
{
    if (tw_fx_sql_wait(fx, ms, status, "SELECT status FROM state.turns WHERE turn_id = $1", 1, turn))
        return;
    char *st = tw_fx_sql_str(
        fx, "SELECT status || ' ' || coalesce(error, '-') FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_abort_msg("line %d: turn %s: expected %s within %d ms, is %s", at, turn, status, ms,
                 st ? st : "(none)");
}

void wd_actions(const char *log, const char *rule, json_t *into)
{
    char *needle = wd_fmt("watchdog rule=\"%s\" ", rule);
    for (const char *p = strstr(log, needle); p; p = strstr(p + 1, needle)) {
        const char *js = p + strlen(needle);
        const char *eol = strchr(js, '\n');
        json_t *a = json_loadb(js, eol ? (size_t)(eol - js) : strlen(js), 0, NULL);
        if (a)
            json_array_append_new(into, a);
    }
    free(needle);
}

json_t *wd_actions_of(TwFxProc *const *procs, size_t n, const char *rule)
{
    json_t *all = json_array();
    for (size_t i = 0; i < n; i++) {
        char *log = tw_fx_proc_log(procs[i]);
        wd_actions(log, rule, all);
        free(log);
    }
    return all;
}

size_t wd_action_count(TwFxProc *const *procs, size_t n, const char *rule)
{
    json_t *all = wd_actions_of(procs, n, rule);
    size_t count = json_array_size(all);
    json_decref(all);
    return count;
}

json_t *wd_actions_where(json_t *actions, const char *key, const char *value)
{
    json_t *out = json_array(), *a;
    size_t i;
    json_array_foreach(actions, i, a)
    {
        const char *v = json_string_value(json_object_get(a, key));
        if (v && strcmp(v, value) == 0)
            json_array_append(out, a);
    }
    return out;
}

size_t wd_actions_dups(json_t *actions, const char *key)
{
    size_t i, k, dups = 0;
    json_t *a, *b;
    json_array_foreach(actions, i, a)
    {
        json_array_foreach(actions, k, b)
        {
            if (k > i && json_equal(json_object_get(a, key), json_object_get(b, key)))
                dups++;
        }
    }
    return dups;
}

size_t wd_actions_distinct(json_t *actions, const char *key)
{
    size_t i, k, n = 0;
    json_t *a, *b;
    json_array_foreach(actions, i, a)
    {
        bool seen = false;
        json_array_foreach(actions, k, b)
        {
            if (k >= i)
                break;
            seen = seen || json_equal(json_object_get(a, key), json_object_get(b, key));
        }
        n += !seen;
    }
    return n;
}

long wd_counter(TwFxProc *p, const char *rule)
{
    char *log = tw_fx_proc_log(p), *needle = wd_fmt("\"%s\"=", rule);
    long n = -1;
    for (char *q = strstr(log, "watchdog counters"); q; q = strstr(q + 1, "watchdog counters")) {
        char *eol = strchr(q, '\n'), *at = strstr(q, needle);
        if (at && (!eol || at < eol))
            n = strtol(at + strlen(needle), NULL, 10);
    }
    free(needle);
    free(log);
    return n;
}

int wd_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void wd_report_delays(const char *what, json_t *actions, int max_ok_ms)
{
    size_t n = json_array_size(actions), i;
    int64_t *d = calloc(n ? n : 1, sizeof *d);
    json_t *a;
    json_array_foreach(actions, i, a)
    {
        json_t *v = json_object_get(a, "lateness_ms");
        ck_assert_msg(json_is_number(v), "%s: an action without lateness_ms", what);
        d[i] = (int64_t)json_number_value(v);
        ck_assert_msg(d[i] >= 0, "%s: acted %lld ms before it was due", what, (long long)d[i]);
        ck_assert_msg(d[i] <= max_ok_ms, "%s: acted %lld ms after it was due", what, (long long)d[i]);
    }
    qsort(d, n, sizeof *d, wd_cmp_i64);
    if (n)
        fprintf(stderr, "MEASURE %s: n=%zu median=%lld ms max=%lld ms min=%lld ms\n", what, n,
                (long long)(n % 2 ? d[n / 2] : (d[n / 2 - 1] + d[n / 2]) / 2), (long long)d[n - 1],
                (long long)d[0]);
    free(d);
}

void wd_assert_acted(TwFxProc *const *procs, size_t n, const char *rule, size_t count, const char *what,
                     int max_ok_ms)
{
    json_t *acts = wd_actions_of(procs, n, rule);
    ck_assert_uint_eq(json_array_size(acts), count);
    wd_report_delays(what, acts, max_ok_ms);
    json_decref(acts);
}

size_t wd_task_events(TwFxEvents *ev, const char *turn)
{
    return tw_fx_events_count(ev, "evt.agent.*.task", turn);
}

void wd_finals_then_free(TwFxEvents *ev, char **turns, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.*.task", turns[i], 1, WD_WAIT_MS),
                      "no final event for %s on NATS", turns[i]);
        free(turns[i]);
    }
}

void wd_kill_listed(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[256];
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *last = strrchr(line, ' ');
        int pid = atoi(last ? last + 1 : line);
        if (pid > 1)
            kill(pid, SIGKILL);
    }
    fclose(f);
}

int wd_count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    if (!f)
        return 0;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

bool wd_has_lines(void *arg)
{
    WdLines *l = arg;
    return wd_count_lines(l->path) >= l->n;
}

bool wd_log_line_has(void *arg)
{
    WdLogHas *h = arg;
    char *log = tw_fx_proc_log(h->proc);
    bool found = false;
    char *save = NULL;
    for (char *line = strtok_r(log, "\n", &save); line && !found; line = strtok_r(NULL, "\n", &save))
        found = strstr(line, h->a) && (!h->b || strstr(line, h->b));
    free(log);
    return found;
}

bool wd_pid_gone(void *arg)
{
    pid_t pid = *(pid_t *)arg;
    return kill(pid, 0) != 0 && errno == ESRCH;
}

pid_t wd_listed_pid(const char *path, const char *name)
{
    FILE *f = fopen(path, "r");
    char line[256], who[128];
    int pid = 0, p;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%127s %d", who, &p) == 2 && strcmp(who, name) == 0)
            pid = p;
    fclose(f);
    return pid;
}

bool wd_children_exited(void *arg)
{
    pid_t pid = *(pid_t *)arg;
    char path[96], buf[4096] = "";
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    char *save = NULL;
    for (char *tok = strtok_r(buf, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
        char st = tw_fx_pid_state((pid_t)atoi(tok));
        if (st != 'Z' && st != '?')
            return false;
    }
    return true;
}

void wd_assert_no_deadlock(TwFx *fx)
{
    char *path = wd_fmt("%s/pg/postgres.log", tw_fx_dir(fx));
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    if (f) {
        int context = 0;
        while (fgets(line, sizeof line, f)) {
            if (strstr(line, "deadlock detected")) {
                n++;
                context = 12; /* the DETAIL lines name the two statements */
            }
            if (context > 0) {
                fprintf(stderr, "%s: %s", path, line);
                context--;
            }
        }
        fclose(f);
    }
    free(path);
    ck_assert_msg(n == 0, "PostgreSQL detected %d deadlock(s)", n);
}

void wd_done(TwFx *fx)
{
    wd_assert_no_deadlock(fx);
    tw_fx_free(fx);
}

bool wd_is_turn(const char *subject, const json_t *data, void *arg)
{
    (void)subject;
    const char *t = json_string_value(json_object_get(data, "turn_id"));
    return t && strcmp(t, arg) == 0;
}

bool wd_is_state(const char *subject, const json_t *data, void *arg)
{
    WdStateMatch *m = arg;
    size_t n = strlen(subject);
    const char *t = json_string_value(json_object_get(data, "turn_id"));
    const char *st = json_string_value(json_object_get(data, "status"));
    return n > 6 && strcmp(subject + n - 6, ".state") == 0 && t && strcmp(t, m->turn) == 0 && st &&
           strcmp(st, m->status) == 0;
}

char *wd_check_forced_end(TwFx *fx, TwFxEvents *ev, const char *turn, const char *status, const char *reason,
                          const char *box, int64_t epoch_before)
{
    char *st = tw_fx_sql_str(
        fx, "SELECT status || '/' || coalesce(error, '-') FROM state.turns WHERE turn_id = $1", 1, turn);
    char *want = wd_fmt("%s/%s", status, reason);
    ck_assert_str_eq(st, want);
    free(st);
    free(want);
    char *card =
        tw_fx_sql_str(fx, "SELECT deliverable_card_id::text FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_msg(card, "turn %s has no deliverable card", turn);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.cards WHERE card_id = $1::uuid AND turn_id = $2 "
                      "AND card_type = 'task.deliverable' AND (content ->> 'partial')::boolean "
                      "AND content ->> 'reason' = $3 AND content ? 'status_before' "
                      "AND output_box_id IS NOT DISTINCT FROM $4",
                      4, card, turn, reason, box),
        1);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1", 1, turn), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1 "
                                   "AND reason = $2",
                                   2, turn, reason),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task' "
                                   "AND payload ->> 'status' = $2 AND payload ->> 'error' = $3 "
                                   "AND payload ->> 'deliverable_card_id' = $4",
                                   4, turn, status, reason, card),
                     1);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, turn),
        1);
    ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.*.task", turn, 1, WD_WAIT_MS),
                  "no final event for %s on NATS", turn);
    json_t *task = tw_fx_events_get(ev, "evt.agent.*.task", turn, 0, NULL, NULL);
    ck_assert_ptr_nonnull(task);
    ck_assert_str_eq(json_string_value(json_object_get(task, "status")), status);
    ck_assert_str_eq(json_string_value(json_object_get(task, "error")), reason);
    ck_assert_str_eq(json_string_value(json_object_get(task, "deliverable_card_id")), card);
    ck_assert(json_is_string(json_object_get(task, "event_id")));
    json_decref(task);
    if (epoch_before >= 0) {
        WdStateMatch m = {turn, "idle"};
        ck_assert_msg(tw_fx_events_wait_if(ev, wd_is_state, &m, 1, WD_WAIT_MS), "no state event idle for %s",
                      turn);
        json_t *s = tw_fx_events_get_if(ev, wd_is_state, &m, 0, NULL, NULL);
        ck_assert_ptr_nonnull(s);
        ck_assert_str_eq(json_string_value(json_object_get(s, "error")), reason);
        ck_assert_int_eq(json_integer_value(json_object_get(s, "turn_epoch")), epoch_before + 1);
        json_decref(s);
    }
    return card;
}
