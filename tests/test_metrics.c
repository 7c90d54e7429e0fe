/* test_metrics.c — unit tests of common/metrics.h (no servers): the exposition parses as the Prometheus text
 * format, label values stay in their bounded sets, histograms are cumulative with +Inf equal to the count,
 * the rules' counters and lateness appear per rule, and which events count as ended turns; plus the
 * metrics_listen address and its configuration key. */
#include "fixture.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "metrics.h"
#include "names.h"
#include "rule.h"
#include "tw_build.h"
#include "suite.h"

/* Render and parse; fails the test when the text is not valid exposition. */
static json_t *scrape(bool pg_up, bool nats_up)
{
    TwHealth h = {pg_up, nats_up};
    char *text = tw_metrics_render(&h), *err = NULL;
    ck_assert_ptr_nonnull(text);
    json_t *samples = tw_fx_prom_parse(text, &err);
    ck_assert_msg(samples != NULL, "not valid exposition: %s\n%s", err, text);
    free(text);
    return samples;
}

static double val(json_t *samples, const char *key)
{
    return tw_fx_prom_value(samples, key);
}

static void config_with(TwConfig *cfg, const char *text)
{
    int rc = tw_config_load_string(cfg, "t.ini", text);
    ck_assert_msg(rc == 0, "config: %s", cfg->errors);
}

START_TEST(test_render_empty)
{
    tw_metrics_init("turnwatch-test");
    json_t *s = scrape(true, false);
    char key[128];
    snprintf(key, sizeof key, "turnwatch_build_info{version=\"%s\",daemon=\"turnwatch-test\"}", TW_VERSION);
    ck_assert(val(s, key) == 1);
    ck_assert(val(s, "turnwatch_postgres_up") == 1);
    ck_assert(val(s, "turnwatch_nats_up") == 0);
    /* No reload yet: no reload gauge; no series for counters nothing has touched. */
    ck_assert(isnan(val(s, "turnwatch_config_last_reload_successful")));
    ck_assert_uint_eq(json_object_size(s), 3);
    json_decref(s);
    tw_metrics_reload_result(false);
    s = scrape(false, true);
    ck_assert(val(s, "turnwatch_config_last_reload_successful") == 0);
    ck_assert(val(s, "turnwatch_postgres_up") == 0);
    ck_assert(val(s, "turnwatch_nats_up") == 1);
    json_decref(s);
    tw_metrics_reset();
}
END_TEST

START_TEST(test_turns_bounded)
{
    TwConfig cfg;
    config_with(&cfg, "[agent.a]\nexec = /bin/true\n[tool.t]\nexec = /bin/true\n");
    tw_metrics_init("turnwatch-test");
    tw_metrics_learn_names(&cfg);
    tw_metrics_turn_ended("a", "done", NULL);
    tw_metrics_turn_ended("a", "done", "");
    tw_metrics_turn_ended("a", "failed", "agent_failed");
    /* An agent id that is no profile, a status and an error code from nowhere: "other", never the value. */
    tw_metrics_turn_ended("a-3f9c0e1d2b4a", "weird", "Bad Code!");
    /* As the SQL functions return them: events with their payload's text, doorbells with their data. */
    json_t *items = json_pack(
        "[{s:s,s:s,s:s},{s:s,s:s,s:s},{s:s,s:s,s:s},{s:s,s:{s:s}},{s:s,s:s}]", "subject",
        "evt.agent.x-1.task", "event_id", "e1", "text",
        "{\"agent\":\"x-1\",\"profile\":\"a\",\"status\":\"timeout\",\"error\":\"dispatch_timeout\"}",
        "subject", "evt.agent.a.task", "event_id", "e2", "text", "{\"agent\":\"a\",\"status\":\"cancelled\"}",
        "subject", "evt.agent.a.state", "event_id", "e3", "text", "{\"agent\":\"a\",\"status\":\"idle\"}",
        "subject", "cmd.agent.a.wakeup", "data", "target", "a", "subject", "evt.agent.a.task", "text",
        "{\"agent\":\"a\",\"status\":\"done\"}");
    ck_assert_ptr_nonnull(items);
    tw_metrics_count_final_events(items);
    json_decref(items);

    json_t *s = scrape(true, true);
    ck_assert(val(s, "turnwatch_turns_ended_total{agent=\"a\",status=\"done\",error=\"\"}") == 2);
    ck_assert(val(s, "turnwatch_turns_ended_total{agent=\"a\",status=\"failed\",error=\"agent_failed\"}") ==
              1);
    ck_assert(val(s, "turnwatch_turns_ended_total{agent=\"other\",status=\"other\",error=\"other\"}") == 1);
    /* From events: the profile is the label, not the agent id; only task events with an event_id count. */
    ck_assert(
        val(s, "turnwatch_turns_ended_total{agent=\"a\",status=\"timeout\",error=\"dispatch_timeout\"}") ==
        1);
    ck_assert(val(s, "turnwatch_turns_ended_total{agent=\"a\",status=\"cancelled\",error=\"\"}") == 1);
    json_decref(s);

    /* A family never grows past its limit: the rest lands in the all-"other" series. */
    char code[32];
    for (int i = 0; i < TW_METRICS_MAX_SERIES + 50; i++) {
        snprintf(code, sizeof code, "code_%d", i);
        tw_metrics_turn_ended("a", "failed", code);
    }
    s = scrape(true, true);
    size_t turns = 0;
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) turns += strncmp(key, "turnwatch_turns_ended_total{", 28) == 0;
    /* The all-"other" series existed already (above), so it is one of the limit's. */
    ck_assert_uint_eq(turns, TW_METRICS_MAX_SERIES);
    ck_assert(val(s, "turnwatch_turns_ended_total{agent=\"other\",status=\"other\",error=\"other\"}") >= 51);
    json_decref(s);
    tw_metrics_reset();
    tw_config_free(&cfg);
}
END_TEST

START_TEST(test_histograms)
{
    TwConfig cfg;
    config_with(&cfg, "[agent.a]\nexec = /bin/true\n[tool.t]\nexec = /bin/true\n");
    tw_metrics_init("turnwatch-test");
    tw_metrics_learn_names(&cfg);
    tw_metrics_step("a", 0.003);
    tw_metrics_step("a", 0.7);
    tw_metrics_step("a", 5000);
    tw_metrics_step("gone", 1);
    tw_metrics_tool_call("t", "ok", 0.02);
    tw_metrics_tool_call("t", "timeout", 30);
    tw_metrics_tool_call("t", "strange", 1);

    json_t *s = scrape(true, true);
    const char *b = "turnwatch_step_duration_seconds_bucket{agent=\"a\",le=\"%s\"}";
    char key[160];
    static const struct {
        const char *le;
        double n;
    } want[] = {{"0.005", 1}, {"0.5", 1}, {"1", 2}, {"1800", 2}, {"+Inf", 3}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(key, sizeof key, b, want[i].le);
        ck_assert_msg(val(s, key) == want[i].n, "%s = %g, want %g", key, val(s, key), want[i].n);
    }
    ck_assert(val(s, "turnwatch_step_duration_seconds_count{agent=\"a\"}") == 3);
    ck_assert(fabs(val(s, "turnwatch_step_duration_seconds_sum{agent=\"a\"}") - 5000.703) < 1e-6);
    ck_assert(val(s, "turnwatch_step_duration_seconds_count{agent=\"other\"}") == 1);
    ck_assert(val(s, "turnwatch_tool_call_duration_seconds_count{tool=\"t\",status=\"ok\"}") == 1);
    ck_assert(
        val(s, "turnwatch_tool_call_duration_seconds_bucket{tool=\"t\",status=\"timeout\",le=\"10\"}") == 0);
    ck_assert(
        val(s, "turnwatch_tool_call_duration_seconds_bucket{tool=\"t\",status=\"timeout\",le=\"30\"}") == 1);
    ck_assert(val(s, "turnwatch_tool_call_duration_seconds_count{tool=\"t\",status=\"other\"}") == 1);
    /* Every histogram series is cumulative and ends at its count. */
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        const char *inf = strstr(k, "le=\"+Inf\"}");
        if (!inf)
            continue;
        char *count = NULL;
        const char *bucket = strstr(k, "_bucket{");
        ck_assert_ptr_nonnull(bucket);
        /* name_count{labels} : the labels without le. */
        size_t lab = (size_t)(inf - (bucket + 8));
        ck_assert_int_gt(asprintf(&count, "%.*s_count{%.*s}", (int)(bucket - k), k,
                                  (int)(lab > 0 ? lab - 1 : 0), bucket + 8),
                         0);
        ck_assert_msg(val(s, count) == json_real_value(v), "%s != %s", count, k);
        free(count);
    }
    json_decref(s);
    tw_metrics_reset();
    tw_config_free(&cfg);
}
END_TEST

START_TEST(test_rules)
{
    TwRule rules[2] = {{.key = "2.5", .name = "2.5 reap_dispatched"}, {.name = "odd \"name\" \\ here"}};
    tw_lateness_add(&rules[0].lateness, 3);
    tw_lateness_add(&rules[0].lateness, 700);
    rules[0].actions = 2;
    rules[1].actions = 5;
    tw_metrics_init("turnwatch-test");
    tw_metrics_watch_rules(rules, 2);
    json_t *s = scrape(true, true);
    ck_assert(val(s, "turnwatch_watchdog_actions_total{rule=\"2.5 reap_dispatched\"}") == 2);
    ck_assert(
        val(s, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"0.001\"}") == 0);
    ck_assert(
        val(s, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"0.005\"}") == 1);
    ck_assert(val(s, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"0.5\"}") ==
              1);
    ck_assert(val(s, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"1\"}") ==
              2);
    ck_assert(
        val(s, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"+Inf\"}") == 2);
    ck_assert(fabs(val(s, "turnwatch_deadline_lateness_seconds_sum{rule=\"2.5 reap_dispatched\"}") - 0.703) <
              1e-9);
    ck_assert(val(s, "turnwatch_deadline_lateness_seconds_count{rule=\"2.5 reap_dispatched\"}") == 2);
    /* A label value is escaped as the format wants. */
    ck_assert(val(s, "turnwatch_watchdog_actions_total{rule=\"odd \\\"name\\\" \\\\ here\"}") == 5);
    ck_assert(val(s, "turnwatch_deadline_lateness_seconds_count{rule=\"odd \\\"name\\\" \\\\ here\"}") == 0);
    json_decref(s);
    /* Forgotten rules are no longer read (their memory may be gone). */
    tw_metrics_forget_rules();
    s = scrape(true, true);
    ck_assert(isnan(val(s, "turnwatch_watchdog_actions_total{rule=\"2.5 reap_dispatched\"}")));
    json_decref(s);
    tw_metrics_reset();
}
END_TEST

/* The fixture's parser refuses what is not the format, so that the checks above mean something. */
START_TEST(test_parser_refuses)
{
    static const char *const bad[] = {
        "x 1\n",                                    /* no TYPE */
        "# TYPE x counter\nx{a=\"1\" 1\n",          /* unterminated labels */
        "# TYPE x counter\nx{a=1} 1\n",             /* unquoted value */
        "# TYPE x counter\nx one\n",                /* not a number */
        "# TYPE x counter\nx 1\nx 2\n",             /* twice */
        "# TYPE x counter\n# TYPE x gauge\nx 1\n",  /* TYPE twice */
        "# TYPE x counter\nx{a=\"\\q\"} 1\n",       /* bad escape */
        "# TYPE x counter\nx_bucket{le=\"1\"} 1\n", /* a bucket of a counter */
        "# comment\n",                              /* not HELP or TYPE */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *err = NULL;
        json_t *s = tw_fx_prom_parse(bad[i], &err);
        ck_assert_msg(s == NULL, "accepted: %s", bad[i]);
        ck_assert_ptr_nonnull(err);
        free(err);
    }
    char *err = NULL;
    json_t *s =
        tw_fx_prom_parse("# HELP h a histogram\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1.5\n"
                         "h_count 2\n",
                         &err);
    ck_assert_msg(s != NULL, "%s", err);
    ck_assert(tw_fx_prom_value(s, "h_sum") == 1.5);
    json_decref(s);
}
END_TEST

START_TEST(test_listen_address)
{
    char host[256];
    int port = 0;
    ck_assert(tw_listen_parse("127.0.0.1:9464", host, sizeof host, &port));
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(port, 9464);
    ck_assert(tw_listen_parse("[::1]:1", host, sizeof host, &port));
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 1);
    ck_assert(tw_listen_parse("localhost:65535", host, sizeof host, &port));
    ck_assert(tw_listen_parse("0.0.0.0:9100", host, sizeof host, &port));
    static const char *const bad[] = {"",
                                      "9464",
                                      ":9464",
                                      "host:",
                                      "host:0",
                                      "host:65536",
                                      "host:12a",
                                      "[::1:9",
                                      "a b:1",
                                      "::1:9464",
                                      "[]:1",
                                      "host:-1",
                                      "host:99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!tw_listen_parse(bad[i], host, sizeof host, &port), "accepted '%s'", bad[i]);

    TwConfig cfg;
    ck_assert_int_eq(tw_config_load_string(&cfg, "t.ini", ""), 0);
    ck_assert_str_eq(cfg.pmo.metrics_listen, "");
    ck_assert_str_eq(cfg.worker.metrics_listen, "");
    tw_config_free(&cfg);
    ck_assert_int_eq(
        tw_config_load_string(&cfg, "t.ini",
                              "[pmo]\nmetrics_listen = 127.0.0.1:9464\n[worker]\nmetrics_listen =\n"),
        0);
    ck_assert_str_eq(cfg.pmo.metrics_listen, "127.0.0.1:9464");
    ck_assert_str_eq(cfg.worker.metrics_listen, "");
    tw_config_free(&cfg);
    ck_assert_int_eq(tw_config_load_string(&cfg, "t.ini", "[pmo]\n\n[worker]\nmetrics_listen = 9464\n"), -1);
    ck_assert_int_eq(cfg.n_errors, 1);
    ck_assert_msg(strstr(cfg.errors, "t.ini:4: [worker] metrics_listen: '9464' is not host:port"), "%s",
                  cfg.errors);
    tw_config_free(&cfg);
    /* Other string keys still refuse an empty value: only an empty default makes empty valid. */
    ck_assert_int_eq(tw_config_load_string(&cfg, "t.ini", "[log]\nlevel =\n"), -1);
    ck_assert_ptr_nonnull(strstr(cfg.errors, "must not be empty"));
    tw_config_free(&cfg);
}
END_TEST

START_TEST(test_config_refs)
{
    TwConfig *cfg = calloc(1, sizeof *cfg);
    ck_assert_ptr_nonnull(cfg);
    ck_assert_int_eq(tw_config_load_string(cfg, "t.ini", "[agent.a]\nexec = /bin/true\n"), 0);
    /* Two more users: it lives until the third unref (ASan would see a use after free or a leak). */
    ck_assert_ptr_eq(tw_config_ref(cfg), cfg);
    tw_config_ref(cfg);
    tw_config_unref(cfg);
    tw_config_unref(cfg);
    ck_assert_str_eq(tw_config_agent(cfg, "a")->name, "a");
    tw_config_unref(cfg);
    tw_config_unref(NULL);
}
END_TEST

TW_SUITE_DEFINE(metrics, {
                             {"metrics", test_render_empty, 30},
                             {"metrics", test_turns_bounded, 30},
                             {"metrics", test_histograms, 30},
                             {"metrics", test_rules, 30},
                             {"metrics", test_parser_refuses, 30},
                             {"metrics", test_listen_address, 30},
                             {"metrics", test_config_refs, 30},
                         })
