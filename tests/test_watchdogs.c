/* test_watchdogs.c — unit tests of common/watchdogs.h, the watchdog rule table: it and sql/rules/ are in step
 * (every row has its file, and in it its action and due term taking the parameters the row gives them; every
 * file in sql/rules/ has a row), every key a row names is an integer key of the configuration table, the
 * rules a daemon builds carry the configured values, and the wake-up decision follows the rows' clocks. */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "migrate.h"
#include "suite.h"
#include "watchdogs.h"

/* sql/rules/ in the source tree: meson sets TW_SOURCE_DIR (by hand: TW_SOURCE_DIR=. build/tests/...). */
static char *rules_dir(void)
{
    const char *src = getenv("TW_SOURCE_DIR");
    char *path = NULL;

    ck_assert_msg(src && *src,
                  "TW_SOURCE_DIR is not set: run it with meson test, or set it to the source tree");
    ck_assert_int_gt(asprintf(&path, "%s/sql/rules", src), 0);
    return path;
}

static const TwRuleDef *row_of_file(const char *file)
{
    size_t n;
    const TwRuleDef *rows = tw_watchdogs(&n);

    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].file, file) == 0)
            return &rows[i];
    return NULL;
}

/* The embedded text of sql/rules/<file>.sql (sql/embed.c), NULL when it is not embedded. */
static const char *embedded(const char *file)
{
    char name[128];

    snprintf(name, sizeof name, "rules/%s.sql", file);
    for (int i = 0; i < tw_migrations_count; i++)
        if (tw_migrations[i].code && strcmp(tw_migrations[i].name, name) == 0)
            return tw_migrations[i].sql;
    return NULL;
}

/* How many arguments `CREATE OR REPLACE FUNCTION fn(...)` takes in sql; -1 when sql does not define fn. */
static int defined_args(const char *sql, const char *fn)
{
    char head[160];
    const char *p;
    int n = 0, depth = 0;
    bool any = false;

    snprintf(head, sizeof head, "CREATE OR REPLACE FUNCTION %s(", fn);
    if (!(p = strstr(sql, head)))
        return -1;
    for (p += strlen(head); *p && !(depth == 0 && *p == ')'); p++) {
        if (*p == '(')
            depth++;
        else if (*p == ')')
            depth--;
        else if (*p == ',' && depth == 0)
            n++;
        else if (!isspace((unsigned char)*p))
            any = true;
    }
    return any ? n + 1 : 0;
}

START_TEST(every_row_has_its_file_and_every_file_a_row)
{
    size_t n;
    const TwRuleDef *rows = tw_watchdogs(&n);
    char *dir = rules_dir();
    DIR *d = opendir(dir);
    struct dirent *e;
    int files = 0;

    ck_assert_msg(d != NULL, "cannot open %s", dir);
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        char file[128];
        if (len < 5 || strcmp(e->d_name + len - 4, ".sql") != 0)
            continue;
        snprintf(file, sizeof file, "%.*s", (int)(len - 4), e->d_name);
        files++;
        ck_assert_msg(row_of_file(file), "sql/rules/%s has no row in the rule table (common/watchdogs.c)",
                      e->d_name);
        ck_assert_msg(embedded(file), "sql/rules/%s is not embedded: list it in sql/meson.build", e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        char *path = NULL;
        ck_assert_int_gt(asprintf(&path, "%s/%s.sql", dir, rows[i].file), 0);
        FILE *f = fopen(path, "r");
        ck_assert_msg(f != NULL, "rule %s: its file %s is missing", rows[i].name, path);
        fclose(f);
        free(path);
        for (size_t j = 0; j < i; j++) {
            ck_assert_msg(strcmp(rows[i].file, rows[j].file) != 0, "two rows name sql/rules/%s.sql",
                          rows[i].file);
            ck_assert_msg(rows[i].daemon != rows[j].daemon || strcmp(rows[i].name, rows[j].name) != 0,
                          "two rules of one daemon are called %s", rows[i].name);
        }
    }
    ck_assert_int_eq(files, (int)n);
    free(dir);
}
END_TEST

START_TEST(each_file_defines_the_action_and_due_term_of_its_row)
{
    size_t n;
    const TwRuleDef *rows = tw_watchdogs(&n);

    for (size_t i = 0; i < n; i++) {
        const TwRuleDef *r = &rows[i];
        const char *sql = embedded(r->file);
        ck_assert_msg(sql, "rule %s: rules/%s.sql is not embedded", r->name, r->file);
        ck_assert_msg(strncmp(r->action, "tw.", 3) == 0, "rule %s: action %s is not in schema tw", r->name,
                      r->action);
        int args = defined_args(sql, r->action);
        ck_assert_msg(args >= 0, "rule %s: rules/%s.sql does not define its action %s", r->name, r->file,
                      r->action);
        ck_assert_msg(args == r->n_params + (r->batch > 0),
                      "rule %s: %s takes %d arguments, the row gives it %d parameters%s", r->name, r->action,
                      args, r->n_params, r->batch > 0 ? " and a batch size" : "");
        if (r->daemon == TW_RULES_LIVENESS) {
            ck_assert_msg(!r->due, "rule %s: the liveness poll is not due-timed", r->name);
            continue;
        }
        ck_assert_msg(r->due && strncmp(r->due, "tw.due_", 7) == 0, "rule %s: no due term tw.due_*", r->name);
        args = defined_args(sql, r->due);
        ck_assert_msg(args >= 0, "rule %s: rules/%s.sql does not define its due term %s", r->name, r->file,
                      r->due);
        ck_assert_msg(args == r->n_params, "rule %s: %s takes %d arguments, the row gives it %d", r->name,
                      r->due, args, r->n_params);
        for (int k = 0; k < r->n_params; k++)
            ck_assert_msg(!r->params[k].self, "rule %s: a due term takes integers only", r->name);
    }
}
END_TEST

static void load(TwConfig *cfg, const char *extra)
{
    char *text = NULL;

    ck_assert_int_gt(asprintf(&text, "%s[agent.a]\nexec = /bin/true\n[tool.t]\nexec = /bin/true\n", extra),
                     0);
    memset(cfg, 0, sizeof *cfg);
    ck_assert_msg(tw_config_load_string(cfg, "t.ini", text) == 0, "%s", cfg->errors ? cfg->errors : "");
    free(text);
}

START_TEST(keys_come_from_the_config_table)
{
    size_t n;
    const TwRuleDef *rows = tw_watchdogs(&n);
    TwConfig cfg;

    load(&cfg, "");
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < rows[i].n_params; k++)
            if (!rows[i].params[k].self)
                ck_assert_msg(tw_watchdogs_param(&rows[i].params[k], &cfg) >= 0,
                              "rule %s: parameter %d names [%s] %s, no integer key", rows[i].name, k + 1,
                              tw_config_section_name(rows[i].params[k].section), rows[i].params[k].key);
        if (rows[i].clock.key)
            ck_assert_msg(tw_watchdogs_param(&rows[i].clock, &cfg) >= 0,
                          "rule %s: its clock [%s] %s is no key", rows[i].name,
                          tw_config_section_name(rows[i].clock.section), rows[i].clock.key);
        ck_assert_msg(!rows[i].clock.key == !rows[i].starts, "rule %s: a clock goes with what starts it",
                      rows[i].name);
    }
    tw_config_free(&cfg);
}
END_TEST

static const TwRule *rule_named(const TwRule *rules, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(rules[i].key, key) == 0)
            return &rules[i];
    ck_abort_msg("no rule %s", key);
    return NULL;
}

START_TEST(rules_carry_the_configured_values)
{
    TwRule pmo[TW_WATCHDOGS_MAX], wrk[TW_WATCHDOGS_MAX], live;
    TwConfig cfg;
    int np, nw;

    load(&cfg, "[pmo]\ndispatched_timeout_seconds = 47\npending_wakeup_seconds = 3\n"
               "[worker]\ninbox_processing_timeout_seconds = 41\n");
    np = tw_watchdogs_fill(pmo, TW_RULES_PMO, &cfg, "host:1");
    nw = tw_watchdogs_fill(wrk, TW_RULES_WORKER, &cfg, "host:1");
    ck_assert_int_eq(np, 11);
    ck_assert_int_eq(nw, 4);
    ck_assert_int_eq(tw_watchdogs_fill(&live, TW_RULES_LIVENESS, &cfg, "host:1"), 1);
    /* The order the counters line and the metrics have always had. */
    ck_assert_str_eq(pmo[0].name, "2.4 rering_dispatched");
    ck_assert_str_eq(pmo[8].name, "warnings");
    ck_assert_str_eq(pmo[9].name, "limit_grants");
    ck_assert_str_eq(pmo[10].name, "schedule_ticks");
    ck_assert_str_eq(wrk[0].name, "2.1 reclaim_inbox");

    const TwRule *r25 = rule_named(pmo, np, "2.5");
    ck_assert_str_eq(r25->sql, "SELECT tw.wd_reap_dispatched($1::integer, $2::integer, $3::integer)");
    ck_assert_int_eq(r25->nparams, 3);
    ck_assert_str_eq(r25->params[0], "47"); /* the action and, below, the due term: the same value */
    ck_assert_str_eq(r25->params[1], "30");
    ck_assert_str_eq(r25->params[2], "100");
    ck_assert_str_eq(r25->due, "tw.due_reap_dispatched");
    ck_assert_int_eq(r25->due_nparams, 2);
    ck_assert(r25->heartbeat_judged);

    const TwRule *r27 = rule_named(pmo, np, "2.7");
    ck_assert_str_eq(r27->params[0], "3");
    ck_assert_str_eq(r27->params[1], "300");
    ck_assert_int_eq(r27->info_lines_per_10s, 20);
    ck_assert_str_eq(rule_named(pmo, np, "deadline")->sql, "SELECT tw.wd_turn_deadlines($1::integer)");
    ck_assert_int_eq(rule_named(pmo, np, "deadline")->due_nparams, 0);

    const TwRule *r21 = rule_named(wrk, nw, "2.1");
    ck_assert_str_eq(r21->sql, "SELECT tw.wd_reclaim_inbox($1::integer, $2::integer)");
    ck_assert_str_eq(r21->params[0], "41");
    ck_assert_str_eq(r21->params[1], "200");

    ck_assert_str_eq(live.sql, "SELECT tw.reclaim_gone_daemons($1)");
    ck_assert_str_eq(live.params[0], "host:1");
    ck_assert_ptr_null(live.due);
    tw_config_free(&cfg);
}
END_TEST

static bool pays(const char *ini, TwRuleDaemon daemon, unsigned starts)
{
    TwConfig cfg;

    load(&cfg, ini);
    bool yes = tw_watchdogs_wake_pays(daemon, starts, &cfg);
    tw_config_free(&cfg);
    return yes;
}

START_TEST(wake_ups_follow_the_clocks)
{
    /* The shipped intervals: no clock is shorter than a sweep, nothing is sent. */
    ck_assert(!pays("", TW_RULES_PMO, TW_CLOCK_ANY));
    ck_assert(!pays("", TW_RULES_WORKER, TW_CLOCK_ANY));
    /* 2.4's clock below the PMO's sweep: a dispatch, and any change, may start a deadline it would find late.
     */
    ck_assert(pays("[pmo]\nwatchdog_interval_seconds = 30\ndispatched_retry_seconds = 2\n", TW_RULES_PMO,
                   TW_CLOCK_DISPATCH));
    ck_assert(pays("[pmo]\nwatchdog_interval_seconds = 30\npending_wakeup_seconds = 2\n", TW_RULES_PMO,
                   TW_CLOCK_ANY));
    /* 2.6's clock is started by a claim, never by a dispatch. */
    ck_assert(pays("[pmo]\nwatchdog_interval_seconds = 400\n", TW_RULES_PMO, TW_CLOCK_CLAIM));
    ck_assert(!pays(
        "[pmo]\nwatchdog_interval_seconds = 400\ndispatched_retry_seconds = 400\n"
        "dispatched_timeout_seconds = 500\npending_wakeup_seconds = 400\npending_wakeup_skip_seconds = 600\n",
        TW_RULES_PMO, TW_CLOCK_DISPATCH));
    /* The worker's: 2.2's calls wait at least [worker] suspend_timeout_seconds, 2.1's leases are
     * inbox_processing_timeout_seconds long; the PMO's keys do not count for it. */
    ck_assert(pays("[worker]\nwatchdog_interval_seconds = 30\nsuspend_timeout_seconds = 2\n", TW_RULES_WORKER,
                   TW_CLOCK_TOOL_CALL));
    ck_assert(!pays("[worker]\nwatchdog_interval_seconds = 30\nsuspend_timeout_seconds = 2\n",
                    TW_RULES_WORKER, TW_CLOCK_CLAIM));
    ck_assert(!pays("[pmo]\ndispatched_retry_seconds = 2\n", TW_RULES_WORKER, TW_CLOCK_ANY));
}
END_TEST

TW_SUITE_DEFINE(watchdogs, {
                               {"table", every_row_has_its_file_and_every_file_a_row, 10},
                               {"table", each_file_defines_the_action_and_due_term_of_its_row, 10},
                               {"config", keys_come_from_the_config_table, 10},
                               {"config", rules_carry_the_configured_values, 10},
                               {"wakeups", wake_ups_follow_the_clocks, 10},
                           })
