/* test_console_query.c — the console's routes and query strings (tools/cli/console_query.c), no server: what
 * reaches the database is a known route with validated values, and everything else is refused with a reason.
 */
#include "console_query.h"
#include "suite.h"

#include <check.h>
#include <string.h>

START_TEST(routes)
{
    char id[37];

    ck_assert_int_eq(console_route("/api/turns", id), CONSOLE_TURNS);
    ck_assert_int_eq(console_route("/api/daemons", id), CONSOLE_DAEMONS);
    ck_assert_int_eq(console_route("/api/dead-letters", id), CONSOLE_DEAD_LETTERS);
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2b", id), CONSOLE_TURN);
    ck_assert_str_eq(id, "5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2b");
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2b/history", id),
                     CONSOLE_TURN_HISTORY);
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2b/tree", id),
                     CONSOLE_TURN_TREE);
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2b/other", id),
                     CONSOLE_NOT_FOUND);
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2b/", id),
                     CONSOLE_NOT_FOUND);
    /* Not a UUID: 400, and no id is handed on. */
    ck_assert_int_eq(console_route("/api/turns/not-a-uuid", id), CONSOLE_BAD_ID);
    ck_assert_str_eq(id, "");
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2'", id), CONSOLE_BAD_ID);
    ck_assert_str_eq(id, "");
    ck_assert_int_eq(console_route("/api/turns/5c1e0a3b-1d2e-4f50-9a6b-7c8d9e0f1a2bb", id), CONSOLE_BAD_ID);
    ck_assert_int_eq(console_route("/api/turns/", id), CONSOLE_BAD_ID);
    ck_assert_int_eq(console_route("/api/turn", id), CONSOLE_NOT_FOUND);
    ck_assert_int_eq(console_route("/api", id), CONSOLE_NOT_FOUND);
    ck_assert_int_eq(console_route("/api/", id), CONSOLE_NOT_FOUND);
    /* The page's files are looked up by name in the embedded table. */
    ck_assert_int_eq(console_route("/", id), CONSOLE_ASSET);
    ck_assert_int_eq(console_route("/app.js", id), CONSOLE_ASSET);
    ck_assert_int_eq(console_route("relative", id), CONSOLE_NOT_FOUND);
}
END_TEST

START_TEST(timestamps)
{
    static const char *const good[] = {"2026-11-23",
                                       "2026-11-23T12:00",
                                       "2026-11-23T12:00:05",
                                       "2026-11-23T12:00:05Z",
                                       "2026-11-23T12:00:05.123Z",
                                       "2026-11-23T12:00:05.123456789+02:00",
                                       "2026-11-23 12:00:05-0530",
                                       "2026-11-23T12:00Z"};
    static const char *const bad[] = {"",
                                      "yesterday",
                                      "2026-11-2",
                                      "2026/11/23",
                                      "2026-11-23T",
                                      "2026-11-23T12",
                                      "2026-11-23T12:00:05.",
                                      "2026-11-23T12:00:05.1234567890Z",
                                      "2026-11-23T12:00:05Zjunk",
                                      "2026-11-23T12:00:05+1",
                                      "2026-11-23'; DROP TABLE x; --",
                                      "now",
                                      "infinity"};

    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        ck_assert_msg(console_timestamp_valid(good[i]), "refused %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!console_timestamp_valid(bad[i]), "took %s", bad[i]);
}
END_TEST

START_TEST(turns_query)
{
    ConsoleTurnsQuery q;
    char why[200];

    ck_assert(console_turns_query_parse(NULL, &q, why, sizeof why));
    ck_assert_str_eq(q.limit, "50");
    ck_assert_str_eq(q.agent, "");
    ck_assert(console_turns_query_parse("", &q, why, sizeof why));
    ck_assert(
        console_turns_query_parse("agent=support-7&profile=echo&status=done&since=2026-11-23T12%3A00%3A00Z"
                                  "&before=2026-11-24T00:00:00.5%2B01:00&cursor=1234&limit=500",
                                  &q, why, sizeof why));
    ck_assert_str_eq(q.agent, "support-7");
    ck_assert_str_eq(q.profile, "echo");
    ck_assert_str_eq(q.status, "done");
    ck_assert_str_eq(q.since, "2026-11-23T12:00:00Z");
    ck_assert_str_eq(q.before, "2026-11-24T00:00:00.5+01:00");
    ck_assert_str_eq(q.cursor, "1234");
    ck_assert_str_eq(q.limit, "500");
    /* An empty value is a filter not given. */
    ck_assert(console_turns_query_parse("agent=&status=&limit=", &q, why, sizeof why));
    ck_assert_str_eq(q.agent, "");
    ck_assert_str_eq(q.limit, "50");

    static const char *const bad[][2] = {
        {"agent=bad%20name", "agent"},
        {"agent=a%27b", "agent"},
        {"agent=echo%00x", "NUL"},
        {"profile=0123456789012345678901234567890123456789012345678901234567890123456789", "profile"},
        {"status=sleeping", "status"},
        {"since=yesterday", "since"},
        {"before=2026-13", "before"},
        {"cursor=-1", "cursor"},
        {"cursor=12345678901234567890", "cursor"},
        {"limit=0", "limit"},
        {"limit=501", "limit"},
        {"limit=1e2", "limit"},
        {"agent=echo&agent=fanout", "twice"},
        {"order=seq", "unknown parameter 'order'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        ck_assert_msg(!console_turns_query_parse(bad[i][0], &q, why, sizeof why), "took %s", bad[i][0]);
        ck_assert_msg(strstr(why, bad[i][1]), "%s: the reason '%s' does not say '%s'", bad[i][0], why,
                      bad[i][1]);
    }
}
END_TEST

START_TEST(dead_letters_query)
{
    ConsoleDeadLettersQuery q;
    char why[200];

    ck_assert(console_dead_letters_query_parse(NULL, &q, why, sizeof why));
    ck_assert_str_eq(q.limit, "100");
    ck_assert(console_dead_letters_query_parse("agent=researcher&limit=7", &q, why, sizeof why));
    ck_assert_str_eq(q.agent, "researcher");
    ck_assert_str_eq(q.limit, "7");
    ck_assert(!console_dead_letters_query_parse("agent=re+searcher", &q, why, sizeof why));
    ck_assert(!console_dead_letters_query_parse("status=failed", &q, why, sizeof why));
    ck_assert(!console_dead_letters_query_parse("limit=1000", &q, why, sizeof why));
}
END_TEST

TW_SUITE_DEFINE(console_query, {
                                   {"routes", routes, 10},
                                   {"timestamps", timestamps, 10},
                                   {"turns_query", turns_query, 10},
                                   {"dead_letters_query", dead_letters_query, 10},
                               })
