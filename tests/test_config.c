/* test_config.c — unit tests of common/config.h and common/names.h: the parameter table and the shipped
 * config/turnwatch.ini agree both ways, the shipped file loads to the table's defaults, every kind of error
 * names file, line and key, and the exec splitter and name validators accept and refuse what they promise. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "config_doc.h"
#include "log.h"
#include "names.h"
#include "natsopts.h"
#include "policy.h"
#include "suite.h"
#include "words.h"

/* ---- the shipped file
 * ------------------------------------------------------------------------------------------- */

static char *shipped_path(void)
{
    const char *src = getenv("TW_SOURCE_DIR");
    char *path = NULL;
    if (src && *src) {
        ck_assert_int_gt(asprintf(&path, "%s/config/turnwatch.ini", src), 0);
    } else {
        /* Run by hand from the build dir: __FILE__ is this file's path as the compiler saw it. */
        const char *slash = strrchr(__FILE__, '/');
        int dir_len = slash ? (int)(slash - __FILE__) : 1;
        ck_assert_int_gt(asprintf(&path, "%.*s/../config/turnwatch.ini", dir_len, slash ? __FILE__ : "."), 0);
    }
    return path;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

/* One `key = value` found in the file: for [postgres] [nats] [pmo] [worker] an active line, for the
 * [agent.NAME] and [tool.NAME] templates a commented "; key = value" line below "; [agent.NAME]" / ";
 * [tool.NAME]". */
typedef struct Doc {
    char section[32];
    char key[64];
    char value[256];
    int line;
} Doc;

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
        *--e = '\0';
    return s;
}

/* Splits "key = value" (a value may be followed by " ; comment"); false if the line is not of that form. */
static bool split_kv(char *s, char **key, char **value)
{
    char *eq = strchr(s, '=');
    if (!eq)
        return false;
    *eq = '\0';
    *key = trim(s);
    char *v = eq + 1;
    char *c = strstr(v, " ;");
    if (c)
        *c = '\0';
    *value = trim(v);
    for (const char *k = *key; *k; k++)
        if (!(*k == '_' || (*k >= 'a' && *k <= 'z')))
            return false;
    return **key != '\0';
}

static size_t parse_doc(const char *text, Doc *docs, size_t max)
{
    char *copy = strdup(text);
    char section[32] = "";
    bool in_template = false;
    size_t n = 0;
    int line = 0;
    /* strtok_r would skip empty lines and lose the count; walk by hand. */
    for (char *p = copy; p && *p; line++) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        char *s = trim(p);
        p = nl ? nl + 1 : NULL;
        if (*s == '[') {
            char *end = strchr(s, ']');
            snprintf(section, sizeof section, "%.*s", end ? (int)(end - s - 1) : 0, s + 1);
            in_template = false;
            continue;
        }
        if (*s == ';' || *s == '#') {
            char *body = trim(s + 1);
            if (strncmp(body, "[agent.NAME]", 12) == 0 || strncmp(body, "[tool.NAME]", 11) == 0 ||
                strncmp(body, "[limit.NAME]", 12) == 0 || strncmp(body, "[schedule.NAME]", 15) == 0) {
                snprintf(section, sizeof section, "%s",
                         body[1] == 'a'   ? "agent"
                         : body[1] == 't' ? "tool"
                         : body[1] == 's' ? "schedule"
                                          : "limit");
                in_template = true;
                continue;
            }
            char *key, *value;
            if (in_template && split_kv(body, &key, &value) && n < max) {
                snprintf(docs[n].section, sizeof docs[n].section, "%s", section);
                snprintf(docs[n].key, sizeof docs[n].key, "%s", key);
                snprintf(docs[n].value, sizeof docs[n].value, "%s", value);
                docs[n++].line = line + 1;
            }
            continue;
        }
        char *key, *value;
        if (*s && split_kv(s, &key, &value) && n < max) {
            ck_assert_msg(!in_template, "line %d: an active key inside a commented template", line + 1);
            snprintf(docs[n].section, sizeof docs[n].section, "%s", section);
            snprintf(docs[n].key, sizeof docs[n].key, "%s", key);
            snprintf(docs[n].value, sizeof docs[n].value, "%s", value);
            docs[n++].line = line + 1;
        }
    }
    free(copy);
    return n;
}

START_TEST(test_table_and_file_agree)
{
    char *path = shipped_path();
    char *text = read_all(path);
    Doc docs[128];
    size_t nd = parse_doc(text, docs, 128);
    size_t np;
    const TwParam *params = tw_config_params(&np);
    ck_assert_uint_ge(np, 21);

    /* Every table parameter is documented at its default. */
    for (size_t i = 0; i < np; i++) {
        const char *sec = tw_config_section_name(params[i].section);
        const Doc *d = NULL;
        for (size_t k = 0; k < nd && !d; k++)
            if (strcmp(docs[k].section, sec) == 0 && strcmp(docs[k].key, params[i].key) == 0)
                d = &docs[k];
        bool templ = params[i].section > TW_SEC_LOG;
        ck_assert_msg(d != NULL, "%s: [%s%s] %s is not documented as `%s%s = %s`", path, sec,
                      templ ? ".NAME" : "", params[i].key, templ ? "; " : "", params[i].key,
                      params[i].def ? params[i].def : "...");
        if (params[i].def)
            ck_assert_msg(strcmp(d->value, params[i].def) == 0,
                          "%s:%d: [%s] %s is documented as '%s', the default is '%s'", path, d->line, sec,
                          params[i].key, d->value, params[i].def);
        else
            ck_assert_msg(*d->value, "%s:%d: [%s] %s has no example value", path, d->line, sec,
                          params[i].key);
    }
    /* Every documented key is in the table (and only once per section). */
    for (size_t k = 0; k < nd; k++) {
        size_t hits = 0;
        for (size_t i = 0; i < np; i++)
            if (strcmp(docs[k].section, tw_config_section_name(params[i].section)) == 0 &&
                strcmp(docs[k].key, params[i].key) == 0)
                hits++;
        ck_assert_msg(hits == 1, "%s:%d: [%s] %s is not a parameter of the table", path, docs[k].line,
                      docs[k].section, docs[k].key);
        for (size_t j = 0; j < k; j++)
            ck_assert_msg(strcmp(docs[j].section, docs[k].section) || strcmp(docs[j].key, docs[k].key),
                          "%s:%d: [%s] %s documented twice", path, docs[k].line, docs[k].section,
                          docs[k].key);
    }
    ck_assert_uint_eq(nd, np);
    free(text);
    free(path);
}
END_TEST

/* config/turnwatch.ini is generated from the table (`ninja -C BUILD update-config-ini`): a key, default,
 * meaning or bound changed in one and not the other fails here, at the first line that differs. */
START_TEST(test_ini_is_generated)
{
    char *path = shipped_path();
    char *text = read_all(path);
    char *want = tw_config_doc_ini();
    ck_assert_ptr_nonnull(want);
    if (strcmp(text, want) != 0) {
        const char *a = text, *b = want;
        int line = 1;
        while (*a && *a == *b) {
            line += *a == '\n';
            a++, b++;
        }
        while (a > text && a[-1] != '\n')
            a--, b--;
        ck_abort_msg("%s:%d differs from the parameter table (run `ninja -C BUILD update-config-ini`):\n"
                     "  file:  %.*s\n  table: %.*s",
                     path, line, (int)strcspn(a, "\n"), a, (int)strcspn(b, "\n"), b);
    }
    free(want);
    free(text);
    free(path);
}
END_TEST

/* One key's entry of the built turnwatch.ini(5): its section, the value after "key =" and the text of its
 * paragraphs, with the troff escapes taken out. */
typedef struct PageKey {
    char section[32];
    char key[64];
    char value[256];
    char text[4096];
} PageKey;

/* s without troff's escapes for fonts (\fB \fI \fR), zero-width (\&) and the backslash itself. */
static void untroff(char *s)
{
    char *o = s;
    for (char *p = s; *p;) {
        if (p[0] == '\\' && p[1] == 'f' && p[2])
            p += 3;
        else if (p[0] == '\\' && p[1] == '&')
            p += 2;
        else if (p[0] == '\\' && (p[1] == '\\' || p[1] == '-' || p[1] == 'e'))
            *o++ = p[1] == 'e' ? '\\' : p[1], p += 2;
        else
            *o++ = *p++;
    }
    *o = '\0';
}

static size_t parse_page(const char *troff, PageKey *keys, size_t max)
{
    char *copy = strdup(troff), *save = NULL;
    char section[32] = "";
    size_t n = 0;
    PageKey *cur = NULL;

    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, ".SH ", 4) == 0) {
            char *open = strchr(line, '['), *close = open ? strchr(open, ']') : NULL;
            snprintf(section, sizeof section, "%.*s", close ? (int)(close - open - 1) : 0,
                     open ? open + 1 : "");
            char *dot = strstr(section, ".NAME");
            if (dot)
                *dot = '\0';
            cur = NULL;
            continue;
        }
        if (strncmp(line, "\\fB", 3) == 0 && *section) {
            char *end = strstr(line, "\\fR =");
            if (end && n < max) {
                cur = &keys[n++];
                memset(cur, 0, sizeof *cur);
                snprintf(cur->section, sizeof cur->section, "%s", section);
                snprintf(cur->key, sizeof cur->key, "%.*s", (int)(end - line - 3), line + 3);
                untroff(cur->key);
                snprintf(cur->value, sizeof cur->value, "%s", trim(end + 5));
                untroff(cur->value);
                continue;
            }
        }
        if (cur && line[0] != '.') {
            size_t len = strlen(cur->text);
            snprintf(cur->text + len, sizeof cur->text - len, "%s ", line);
        }
    }
    for (size_t i = 0; i < n; i++)
        untroff(keys[i].text);
    free(copy);
    return n;
}

/* The built manual page turnwatch.ini(5) says what the table says: every key once in its section, at its
 * default, with its enum values, its reload class and its meaning's first words; and no key besides. With
 * the INI generated from the same table (above), the table, the shipped file and the page agree. */
START_TEST(test_man_page_agrees)
{
    const char *build = getenv("TW_BUILD_DIR"), *man = getenv("TW_MAN");
    if (man && strcmp(man, "0") == 0)
        return; /* configured with -Dman=disabled: no page to compare */
    ck_assert_msg(build && *build, "TW_BUILD_DIR is not set (run through meson test)");
    char *path;
    ck_assert_int_gt(asprintf(&path, "%s/docs/man/turnwatch.ini.5", build), 0);
    char *troff = read_all(path);
    static PageKey keys[160];
    size_t nk = parse_page(troff, keys, 160), np;
    const TwParam *params = tw_config_params(&np);

    for (size_t i = 0; i < np; i++) {
        const TwParam *p = &params[i];
        const char *sec = tw_config_section_name(p->section);
        const PageKey *k = NULL;
        for (size_t j = 0; j < nk; j++)
            if (strcmp(keys[j].section, sec) == 0 && strcmp(keys[j].key, p->key) == 0) {
                ck_assert_msg(!k, "%s: [%s] %s appears twice", path, sec, p->key);
                k = &keys[j];
            }
        ck_assert_msg(k, "%s: [%s] %s is missing", path, sec, p->key);
        ck_assert_msg(strcmp(k->value, p->def ? p->def : "") == 0, "%s: [%s] %s = '%s', the default is '%s'",
                      path, sec, p->key, k->value, p->def ? p->def : "");
        bool restart = strstr(k->text, "Takes effect at the next start") != NULL;
        ck_assert_msg(restart == (p->reload == TW_RESTART), "%s: [%s] %s: reload class wrong: %s", path, sec,
                      p->key, k->text);
        /* Its meaning: the first words of its help (an inherited key: its [worker] key's). */
        char first[40];
        snprintf(first, sizeof first, "%s", p->help);
        ck_assert_msg(strstr(k->text, first), "%s: [%s] %s lacks its meaning '%s...': %s", path, sec, p->key,
                      first, k->text);
        for (const char *v = p->values; v && *v;) {
            size_t len = strcspn(v, "|");
            char one[64];
            snprintf(one, sizeof one, "%.*s,", (int)len, v);
            if (!v[len])
                one[len] = '.';
            ck_assert_msg(strstr(k->text, one), "%s: [%s] %s lacks its value %.*s", path, sec, p->key,
                          (int)len, v);
            v += len + (v[len] == '|');
        }
        if (p->type == TW_PT_INT) {
            char bounds[64];
            snprintf(bounds, sizeof bounds, "%ld to %ld", p->min, p->max);
            ck_assert_msg(strstr(k->text, bounds), "%s: [%s] %s lacks its bounds %s", path, sec, p->key,
                          bounds);
        }
    }
    ck_assert_uint_eq(nk, np); /* nothing else */
    free(troff);
    free(path);
}
END_TEST

/* An enum is declared in its row and checked by the engine: each of its values loads, anything else is
 * refused naming the values, on the key's line. */
START_TEST(test_enums_checked_by_table)
{
    size_t np, n_enums = 0;
    const TwParam *params = tw_config_params(&np);

    for (size_t i = 0; i < np; i++) {
        const TwParam *p = &params[i];
        if (!p->values)
            continue;
        n_enums++;
        ck_assert_int_eq(p->type, TW_PT_STR);
        ck_assert_msg(p->def && strstr(p->values, p->def), "[%s] %s: default '%s' is not one of %s",
                      tw_config_section_name(p->section), p->key, p->def, p->values);
        const char *head = p->section == TW_SEC_AGENT      ? "[agent.x]\nexec = /bin/true\n"
                           : p->section == TW_SEC_TOOL     ? "[tool.x]\nexec = /bin/true\n"
                           : p->section == TW_SEC_SCHEDULE ? "[schedule.x]\nagent = a\ncron = * * * * *\n"
                                                           : NULL;
        char text[512];
        TwConfig cfg;
        for (const char *v = p->values; *v;) {
            size_t len = strcspn(v, "|");
            if (head)
                snprintf(text, sizeof text, "%s%s = %.*s\n", head, p->key, (int)len, v);
            else
                snprintf(text, sizeof text, "[%s]\n%s = %.*s\n", tw_config_section_name(p->section), p->key,
                         (int)len, v);
            ck_assert_msg(tw_config_load_string(&cfg, "e.ini", text) == 0, "%s: %s", text, cfg.errors);
            tw_config_free(&cfg);
            v += len + (v[len] == '|');
        }
        if (head)
            snprintf(text, sizeof text, "%s%s = bogus\n", head, p->key);
        else
            snprintf(text, sizeof text, "[%s]\n%s = bogus\n", tw_config_section_name(p->section), p->key);
        ck_assert_int_eq(tw_config_load_string(&cfg, "e.ini", text), -1);
        char want[128];
        int at = 2;
        for (const char *c = head; c && *c; c++)
            at += *c == '\n';
        snprintf(want, sizeof want, "e.ini:%d: ", head ? at - 1 : 2);
        ck_assert_msg(strstr(cfg.errors, want) && strstr(cfg.errors, "'bogus' is not ") &&
                          strstr(cfg.errors, p->key),
                      "%s: %s", text, cfg.errors);
        tw_config_free(&cfg);
    }
    ck_assert_uint_eq(n_enums, 6); /* [agent] mode, [tool] mode, [log] format and level, [schedule] overlap
                                    * and catchup */
}
END_TEST

/* The keys a reload cannot apply are marked in the table (TW_RESTART), and they are those of the daemon's
 * connections, [postgres] and [nats], every one of them and no other: a reload logs a change of one as taking
 * effect at the next restart (README "Reload"). */
START_TEST(test_restart_only_keys)
{
    size_t np, n_restart = 0;
    const TwParam *params = tw_config_params(&np);

    for (size_t i = 0; i < np; i++) {
        bool connection = params[i].section == TW_SEC_POSTGRES || params[i].section == TW_SEC_NATS;
        bool restart = params[i].reload == TW_RESTART;
        ck_assert_msg(restart == connection, "[%s] %s: %s", tw_config_section_name(params[i].section),
                      params[i].key,
                      restart ? "restart-only, but not a connection's key" : "not restart-only");
        ck_assert_msg(params[i].reload == TW_RELOAD || restart, "[%s] %s: reload class %d",
                      tw_config_section_name(params[i].section), params[i].key, (int)params[i].reload);
        n_restart += restart;
    }
    ck_assert_uint_eq(n_restart, 15); /* 3 of [postgres], 12 of [nats] */
}
END_TEST

/* The value of a parameter in a loaded struct, as text, so it compares with the table's default. */
static void value_text(const TwParam *p, const void *base, char *buf, size_t size)
{
    const char *at = (const char *)base + p->offset;
    switch (p->type) {
    case TW_PT_INT:
        snprintf(buf, size, "%d", *(const int *)at);
        break;
    case TW_PT_BOOL:
        snprintf(buf, size, "%s", *(const bool *)at ? "true" : "false");
        break;
    case TW_PT_STR:
    case TW_PT_LIST:
        snprintf(buf, size, "%s", *(char *const *)at ? *(char *const *)at : "(null)");
        break;
    case TW_PT_ARGV:
        snprintf(buf, size, "%s", *(char **const *)at ? (*(char **const *)at)[0] : "(null)");
        break;
    }
}

START_TEST(test_shipped_file_loads_to_defaults)
{
    char *path = shipped_path();
    TwConfig cfg;
    int rc = tw_config_load(&cfg, path);
    ck_assert_msg(rc == 0, "%s: %s", path, cfg.errors);
    ck_assert_int_eq(cfg.n_errors, 0);
    ck_assert_uint_eq(cfg.n_agents, 0);
    ck_assert_uint_eq(cfg.n_tools, 0);
    size_t np;
    const TwParam *params = tw_config_params(&np);
    char got[512];
    for (size_t i = 0; i < np; i++) {
        if (params[i].section >= TW_SEC_AGENT)
            continue;
        value_text(&params[i], &cfg, got, sizeof got);
        ck_assert_msg(strcmp(got, params[i].def) == 0, "[%s] %s loaded as %s, default %s",
                      tw_config_section_name(params[i].section), params[i].key, got, params[i].def);
    }
    tw_config_free(&cfg);

    /* The templates, uncommented (with a real program), load to the table's defaults as well. */
    char *text = read_all(path);
    char *a = strstr(text, "; [agent.NAME]"), *t = strstr(text, "; [tool.NAME]"),
         *l = strstr(text, "; [limit.NAME]"), *sc = strstr(text, "; [schedule.NAME]");
    ck_assert(a && t && l && sc && a < t && t < l && l < sc);
    char sample[8192] = "";
    size_t off = 0;
    for (int which = 0; which < 4; which++) {
        off += (size_t)snprintf(sample + off, sizeof sample - off, "[%s.sample]\n",
                                which == 3   ? "schedule"
                                : which == 2 ? "limit"
                                : which      ? "tool"
                                             : "agent");
        char *from = which == 3   ? sc
                     : which == 2 ? l
                     : which      ? t
                                  : a,
             *to = which == 3   ? text + strlen(text)
                   : which == 2 ? sc
                   : which      ? l
                                : t;
        for (char *p = strchr(from, '\n'); p && p < to; p = strchr(p + 1, '\n')) {
            char line[512];
            char *nl = strchr(p + 1, '\n');
            snprintf(line, sizeof line, "%.*s", nl ? (int)(nl - p - 1) : (int)strlen(p + 1), p + 1);
            char *body = trim(line[0] == ';' ? line + 1 : line), *key, *value;
            /* exec, and its alternatives agent_profile (delegation) and mcp (with its keys), have no default:
             * a real program instead. */
            if (split_kv(body, &key, &value) && strcmp(key, "exec") != 0 &&
                strcmp(key, "agent_profile") != 0 && strncmp(key, "mcp", 3) != 0)
                off += (size_t)snprintf(sample + off, sizeof sample - off, "%s = %s\n", key, value);
        }
        if (which < 2)
            off += (size_t)snprintf(sample + off, sizeof sample - off, "exec = /bin/true\n");
    }
    free(text);
    rc = tw_config_load_string(&cfg, "templates.ini", sample);
    ck_assert_msg(rc == 0, "%s\n%s", sample, cfg.errors);
    ck_assert_uint_eq(cfg.n_agents, 1);
    ck_assert_uint_eq(cfg.n_tools, 1);
    for (size_t i = 0; i < np; i++) {
        const void *base = params[i].section == TW_SEC_AGENT      ? (const void *)&cfg.agents[0]
                           : params[i].section == TW_SEC_TOOL     ? (const void *)&cfg.tools[0]
                           : params[i].section == TW_SEC_LIMIT    ? (const void *)&cfg.flow_limits[0]
                           : params[i].section == TW_SEC_SCHEDULE ? (const void *)&cfg.schedules[0]
                                                                  : NULL;
        if (!base || !params[i].def)
            continue;
        value_text(&params[i], base, got, sizeof got);
        ck_assert_msg(strcmp(got, params[i].def) == 0, "[%s.sample] %s loaded as %s, default %s",
                      tw_config_section_name(params[i].section), params[i].key, got, params[i].def);
    }
    ck_assert_str_eq(cfg.agents[0].argv[0], "/bin/true");
    tw_config_free(&cfg);
    /* And with only the required exec, the defaults come from the table. */
    rc = tw_config_load_string(&cfg, "min.ini", "[agent.a]\nexec = /bin/true\n[tool.t]\nexec = /bin/true\n");
    ck_assert_msg(rc == 0, "%s", cfg.errors);
    ck_assert_int_eq(cfg.agents[0].step_timeout_sec, 120);
    ck_assert_int_eq(cfg.agents[0].kill_grace_sec, 5);
    ck_assert(!cfg.tools[0].external);
    ck_assert_int_eq(cfg.tools[0].timeout_sec, 0); /* not set: the hierarchy decides (contract 11) */
    ck_assert_int_eq(cfg.tools[0].suspend_timeout_sec, 60);
    /* An agent without policy keys has [worker]'s, which are the shipped defaults. */
    ck_assert_int_eq(cfg.agents[0].policy.max_attempts, 1);
    ck_assert_str_eq(cfg.agents[0].policy.retry_on,
                     "step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout");
    ck_assert_int_eq(cfg.agents[0].policy.retry_backoff_sec, 1);
    ck_assert_int_eq(cfg.agents[0].policy.retry_backoff_max_sec, 300);
    ck_assert_int_eq(cfg.agents[0].policy.queue_timeout_sec, 0);
    ck_assert_int_eq(cfg.agents[0].policy.warn_at_percent, 80);
    ck_assert_int_eq(cfg.agents[0].policy.tool_timeout_sec, 30);
    ck_assert_ptr_eq(tw_config_agent(&cfg, "a"), &cfg.agents[0]);
    ck_assert_ptr_null(tw_config_agent(&cfg, "t"));
    ck_assert_ptr_eq(tw_config_tool(&cfg, "t"), &cfg.tools[0]);
    ck_assert(tw_config_serves(&cfg, "anything"));
    /* 2.2: the wait of a call is the largest of the worker default, the tool's suspend_timeout_seconds and
     * the call's timeout. */
    ck_assert_int_eq(tw_policy_wait_seconds(&cfg, &cfg.tools[0], 30), 300);
    ck_assert_int_eq(tw_policy_wait_seconds(&cfg, NULL, 30), 300);
    ck_assert_int_eq(tw_policy_wait_seconds(&cfg, &cfg.tools[0], 301), 301);
    tw_config_free(&cfg);
    tw_config_free(&cfg); /* twice is harmless */
    tw_config_free(NULL);
    free(path);
}
END_TEST

/* ---- errors
 * ----------------------------------------------------------------------------------------------------- */

/* Loading `text` as "t.ini" fails, and one error line starts with "t.ini:LINE:" and contains `key` and `why`.
 * `row` names the case in a failure. */
static void expect_error(const char *row, const char *text, int line, const char *key, const char *why)
{
    TwConfig cfg;
    int rc = tw_config_load_string(&cfg, "t.ini", text);
    ck_assert_msg(rc == -1, "%s: '%s' loaded without error", row, text);
    ck_assert_msg(cfg.errors && cfg.n_errors >= 1, "%s: no error text", row);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t.ini:%d: ", line);
    bool found = false;
    for (const char *l = cfg.errors; l && *l && !found; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *eol = strchr(l, '\n');
        size_t len = eol ? (size_t)(eol - l) : strlen(l);
        char one[1024];
        snprintf(one, sizeof one, "%.*s", (int)len, l);
        found = strncmp(one, prefix, strlen(prefix)) == 0 && strstr(one, key) && strstr(one, why);
    }
    ck_assert_msg(found, "%s: no error '%s...%s...%s' in:\n%s", row, prefix, key, why, cfg.errors);
    tw_config_free(&cfg);
}

/* Loading `text` (as "ok.ini") succeeds. */
static void expect_ok(const char *row, const char *text)
{
    TwConfig cfg;
    int rc = tw_config_load_string(&cfg, "ok.ini", text);
    ck_assert_msg(rc == 0, "%s: '%s': %s", row, text, cfg.errors);
    tw_config_free(&cfg);
}

/* The tests that load rows of config_cases. */
typedef enum ConfigGroup {
    CC_SYNTAX,     /* test_errors_syntax_and_names */
    CC_VALUES,     /* test_errors_values */
    CC_PROGRAMS,   /* test_errors_programs */
    CC_DELEGATING, /* test_delegating_tools */
    CC_CROSS_KEY,  /* test_errors_cross_key_rules */
    CC_POLICIES,   /* test_policies */
    CC_SECURITY,   /* test_nats_keys, test_limits_keys */
} ConfigGroup;

/* One config text, the test that loads it, and what loading it gives: an error on `line` naming `key` and
 * saying `why` (expect_error), or, where line is 0 (and key and why are ""), no error at all (expect_ok). The
 * inner braces keep a row's expectation on one line and its text on the next. */
typedef struct ConfigCase {
    struct {
        ConfigGroup group;
        int line;
        const char *key, *why;
    } expect;
    const char *text;
} ConfigCase;

/* The rows are in the order of their tests, but for the two texts too long for one line, which come first. */
static const ConfigCase config_cases[] = {
    /* Spaces around a list's commas; an exec with a quoted path and a quoted argument. */
    {
        {CC_PROGRAMS, 0, "", ""},
        "[worker]\n"
        "agents = a , t\n"
        "[agent.a]\n"
        "exec = /bin/true\n"
        "[tool.t]\n"
        "external = true\n"
        "[tool.u]\n"
        "exec = \"/opt/my tools/u\" --flag 'two words'\n",
    },
    /* heartbeat_seconds at the limits of both rules that bound it. */
    {
        {CC_CROSS_KEY, 0, "", ""},
        "[pmo]\nactive_reap_seconds = 3\n"
        "[worker]\nheartbeat_seconds = 1\ninbox_processing_timeout_seconds = 3\n",
    },
    /* Flow control (docs/flow-control.md): [limit.NAME] sections and a tool's limits. */
    {
        {CC_VALUES, 0, "", ""},
        "[limit.llm]\nmax_concurrent = 4\nrate = 60/60\nburst = 10\nper_key = true\nmax_wait_seconds = 120\n"
        "[limit.half]\nrate = 1/0.5\n[tool.t]\nexec = /bin/true\nlimits = llm, half, runtime_one\n"
        "[tool.u]\nexec = /bin/true\nmax_concurrent = 2\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] rate", "is not N/S"},
        "[limit.llm]\nrate = 60 per minute\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] rate", "S must be a number of seconds"},
        "[limit.llm]\nrate = 60/0\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] rate", "is not N/S"},
        "[limit.llm]\nrate = 0/60\n",
    },
    {
        {CC_VALUES, 3, "[limit.llm] burst", "only with a rate"},
        "[limit.llm]\nmax_concurrent = 2\nburst = 5\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] max_concurrent", "out of range"},
        "[limit.llm]\nmax_concurrent = -1\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] per_key", "is not true or false"},
        "[limit.llm]\nper_key = maybe\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] max_wait_seconds", "out of range"},
        "[limit.llm]\nmax_wait_seconds = 604801\n",
    },
    {
        {CC_VALUES, 2, "[limit.llm] rates", "unknown key"},
        "[limit.llm]\nrates = 1/1\n",
    },
    {
        {CC_VALUES, 1, "[limit.a.b]", "invalid limit name"},
        "[limit.a.b]\nmax_concurrent = 1\n",
    },
    {
        {CC_VALUES, 3, "[tool.t] limits", "must be * or a comma list of names"},
        "[tool.t]\nexec = /bin/true\nlimits = a b\n",
    },
    {
        {CC_VALUES, 3, "[tool.t] limits", "an external tool has none"},
        "[tool.t]\nexternal = true\nlimits = a\n",
    },
    {
        {CC_VALUES, 3, "[tool.t] max_concurrent", "out of range"},
        "[tool.t]\nexec = /bin/true\nmax_concurrent = -2\n",
    },
    {
        {CC_SYNTAX, 3, "[bogus]", "unknown section"},
        "[pmo]\nwatchdog_interval_seconds = 5\n[bogus]\n",
    },
    {
        {CC_SYNTAX, 3, "concurency", "unknown key"},
        "[worker]\nconcurrency = 2\nconcurency = 3\n",
    },
    {
        {CC_SYNTAX, 3, "timeout_seconds", "unknown key"},
        "[agent.a]\nexec = /bin/true\ntimeout_seconds = 5\n",
    },
    {
        {CC_SYNTAX, 4, "active_reap_seconds", "set twice (first on line 2)"},
        "[pmo]\nactive_reap_seconds = 60\n\nactive_reap_seconds = 70\n",
    },
    {
        {CC_SYNTAX, 3, "[agent.a]", "twice"},
        "[agent.a]\nexec = /bin/true\n[agent.a]\nexec = /bin/false\n",
    },
    {
        {CC_SYNTAX, 2, "[agent.bad name]", "invalid agent name"},
        "; comment\n[agent.bad name]\nexec = /bin/true\n",
    },
    {
        {CC_SYNTAX, 1, "[tool.a.b]", "invalid tool name"},
        "[tool.a.b]\nexternal = true\n",
    },
    {
        {CC_SYNTAX, 1, "", "syntax error"},
        "[pmo\n",
    },
    {
        {CC_SYNTAX, 2, "", "syntax error"},
        "[pmo]\nthis line is junk\n",
    },
    /* Comments of both kinds, blank lines, spaces around '=' and an inline " ;" comment are fine. */
    {
        {CC_SYNTAX, 0, "", ""},
        "; a\n# b\n\n[pmo]\n  watchdog_interval_seconds   =   7   ; inline\n",
    },
    {
        {CC_VALUES, 2, "concurrency", "out of range"},
        "[worker]\nconcurrency = 0\n",
    },
    {
        {CC_VALUES, 2, "concurrency", "out of range (1 to 1024)"},
        "[worker]\nconcurrency = 1025\n",
    },
    {
        {CC_VALUES, 2, "watchdog_interval_seconds", "out of range"},
        "[pmo]\nwatchdog_interval_seconds = -1\n",
    },
    {
        {CC_VALUES, 3, "kill_grace_seconds", "out of range"},
        "[agent.a]\nexec = /bin/true\nkill_grace_seconds = 0\n",
    },
    {
        {CC_VALUES, 2, "heartbeat_seconds", "not a whole number"},
        "[worker]\nheartbeat_seconds = ten\n",
    },
    {
        {CC_VALUES, 2, "heartbeat_seconds", "not a whole number"},
        "[worker]\nheartbeat_seconds = 5s\n",
    },
    {
        {CC_VALUES, 2, "heartbeat_seconds", "not a whole number"},
        "[worker]\nheartbeat_seconds = 2.5\n",
    },
    {
        {CC_VALUES, 2, "heartbeat_seconds", "not a whole number"},
        "[worker]\nheartbeat_seconds =\n",
    },
    {
        {CC_VALUES, 2, "active_reap_seconds", "not a whole number"},
        "[pmo]\nactive_reap_seconds = 99999999999999999999\n",
    },
    {
        {CC_VALUES, 3, "external", "not true or false"},
        "[tool.t]\nexec = /bin/true\nexternal = maybe\n",
    },
    {
        {CC_VALUES, 2, "dsn", "must not be empty"},
        "[postgres]\ndsn =\n",
    },
    {
        {CC_VALUES, 2, "dsn", "not a valid libpq connection string"},
        "[postgres]\ndsn = nonsense_without_equals\n",
    },
    {
        {CC_VALUES, 2, "url", "without spaces"},
        "[nats]\nurl = nats://a:4222, nats://b:4222\n",
    },
    {
        {CC_VALUES, 2, "url", "comma-separated"},
        "[nats]\nurl = nats://a:4222,,nats://b:4222\n",
    },
    {
        {CC_VALUES, 2, "agents", "comma list of names"},
        "[worker]\nagents = a, bad name!\n",
    },
    {
        {CC_PROGRAMS, 2, "exec", "required"},
        "\n[agent.a]\nstep_timeout_seconds = 5\n",
    },
    {
        {CC_PROGRAMS, 1, "[agent.a] exec", "required"},
        "[agent.a]\n",
    },
    {
        {CC_PROGRAMS, 3, "exec", "an external tool has no program"},
        "[tool.t]\nexternal = true\nexec = /bin/true\n",
    },
    {
        {CC_PROGRAMS, 1, "exec", "required unless external = true"},
        "[tool.t]\ntimeout_seconds = 5\n",
    },
    {
        {CC_PROGRAMS, 2, "exec", "required unless external = true"},
        "[tool.t]\nexternal = false\n",
    },
    {
        {CC_PROGRAMS, 2, "exec", "must be an absolute path"},
        "[agent.a]\nexec = bin/agent --x\n",
    },
    {
        {CC_PROGRAMS, 2, "exec", "must be an absolute path"},
        "[tool.t]\nexec = tool\n",
    },
    /* MCP tools (docs/mcp.md): a third kind, whose server is its program. */
    {
        {CC_PROGRAMS, 3, "[tool.t] exec", "an MCP tool's program is its server"},
        "[tool.t]\nmcp = /bin/cat\nexec = /bin/true\n",
    },
    {
        {CC_PROGRAMS, 3, "[tool.t] mode", "an MCP tool's program is its server"},
        "[tool.t]\nmcp = /bin/cat\nmode = serve\n",
    },
    {
        {CC_PROGRAMS, 3, "[tool.t] external", "remove external"},
        "[tool.t]\nmcp = /bin/cat\nexternal = true\n",
    },
    {
        {CC_PROGRAMS, 3, "[tool.t] mcp_tool", "only for an MCP tool"},
        "[tool.t]\nexec = /bin/true\nmcp_tool = echo\n",
    },
    {
        {CC_PROGRAMS, 3, "[tool.t] mcp_max_inflight", "only for an MCP tool"},
        "[tool.t]\nexec = /bin/true\nmcp_max_inflight = 4\n",
    },
    {
        {CC_PROGRAMS, 2, "mcp", "must be an absolute path"},
        "[tool.t]\nmcp = node server.js\n",
    },
    {
        {CC_PROGRAMS, 3, "mcp_max_inflight", "out of range"},
        "[tool.t]\nmcp = /bin/cat\nmcp_max_inflight = 0\n",
    },
    {
        {CC_PROGRAMS, 2, "exec", "unterminated quote"},
        "[agent.a]\nexec = '/bin/agent\n",
    },
    {
        {CC_PROGRAMS, 2, "agents", "'ghost' has no [agent.ghost] or [tool.ghost] section"},
        "[worker]\nagents = a, ghost\n[agent.a]\nexec = /bin/true\n",
    },
    /* Serve mode (contract section 10). */
    {
        {CC_PROGRAMS, 3, "[agent.a] mode", "not exec or serve"},
        "[agent.a]\nexec = /bin/true\nmode = daemon\n",
    },
    {
        {CC_PROGRAMS, 3, "[tool.t] mode", "not exec or serve"},
        "[tool.t]\nexec = /bin/true\nmode = SERVE\n",
    },
    {
        {CC_PROGRAMS, 3, "[tool.t] mode", "external tool"},
        "[tool.t]\nexternal = true\nmode = serve\n",
    },
    {
        {CC_PROGRAMS, 4, "max_requests", "out of range"},
        "[agent.a]\nexec = /bin/true\nmode = serve\nmax_requests = 0\n",
    },
    /* agent_profile instead of exec (contract section 14): a profile of this config, no program, not
     * external. */
    {
        {CC_DELEGATING, 0, "", ""},
        "[agent.child]\nexec = /bin/true\n[tool.ask]\nagent_profile = child\n",
    },
    {
        {CC_DELEGATING, 4, "agent_profile", "no [agent.nobody] section"},
        "[agent.child]\nexec = /bin/true\n[tool.ask]\nagent_profile = nobody\n",
    },
    {
        {CC_DELEGATING, 4, "agent_profile", "remove exec"},
        "[agent.child]\nexec = /bin/true\n[tool.ask]\nagent_profile = child\nexec = /bin/true\n",
    },
    {
        {CC_DELEGATING, 5, "agent_profile", "remove external"},
        "[agent.child]\nexec = /bin/true\n[tool.ask]\nexternal = true\nagent_profile = child\n",
    },
    {
        {CC_DELEGATING, 4, "agent_profile", "not a profile name"},
        "[agent.child]\nexec = /bin/true\n[tool.ask]\nagent_profile = a.b\n",
    },
    {
        {CC_DELEGATING, 2, "max_delegation_depth", "65"},
        "[worker]\nmax_delegation_depth = 65\n",
    },
    {
        {CC_DELEGATING, 0, "", ""},
        "[worker]\nmax_delegation_depth = 0\n",
    },
    /* The bound on the turns of one delegation tree (issue 23). */
    {
        {CC_DELEGATING, 2, "max_tree_turns", "0"},
        "[worker]\nmax_tree_turns = 0\n",
    },
    {
        {CC_DELEGATING, 2, "max_tree_turns", "1000001"},
        "[worker]\nmax_tree_turns = 1000001\n",
    },
    {
        {CC_DELEGATING, 0, "", ""},
        "[worker]\nmax_tree_turns = 1\n",
    },
    /* dispatched_retry_seconds < dispatched_timeout_seconds: the line of whichever of the two the file sets.
     */
    {
        {CC_CROSS_KEY, 2, "dispatched_retry_seconds", "must be less than dispatched_timeout_seconds (30)"},
        "[pmo]\ndispatched_retry_seconds = 30\n",
    },
    {
        {CC_CROSS_KEY, 2, "dispatched_retry_seconds", "dispatched_timeout_seconds"},
        "[pmo]\ndispatched_retry_seconds = 31\n",
    },
    {
        {CC_CROSS_KEY, 3, "dispatched_retry_seconds", "dispatched_timeout_seconds (10)"},
        "[pmo]\n\ndispatched_timeout_seconds = 10\n",
    },
    {
        {CC_CROSS_KEY, 3, "dispatched_retry_seconds", "must be less than"},
        "[pmo]\ndispatched_timeout_seconds = 5\ndispatched_retry_seconds = 5\n",
    },
    {
        {CC_CROSS_KEY, 0, "", ""},
        "[pmo]\ndispatched_retry_seconds = 29\n",
    },
    /* pending_wakeup_seconds < pending_wakeup_skip_seconds */
    {
        {CC_CROSS_KEY, 2, "pending_wakeup_seconds", "pending_wakeup_skip_seconds"},
        "[pmo]\npending_wakeup_seconds = 300\n",
    },
    {
        {CC_CROSS_KEY, 2, "pending_wakeup_seconds", "pending_wakeup_skip_seconds (4)"},
        "[pmo]\npending_wakeup_skip_seconds = 4\n",
    },
    {
        {CC_CROSS_KEY, 0, "", ""},
        "[pmo]\npending_wakeup_seconds = 299\n",
    },
    /* heartbeat_seconds < active_reap_seconds / 2 */
    {
        {CC_CROSS_KEY, 4, "heartbeat_seconds", "active_reap_seconds (20)"},
        "[pmo]\nactive_reap_seconds = 20\n[worker]\nheartbeat_seconds = 10\n",
    },
    {
        {CC_CROSS_KEY, 2, "heartbeat_seconds", "active_reap_seconds (20)"},
        "[pmo]\nactive_reap_seconds = 20\n",
    },
    {
        {CC_CROSS_KEY, 0, "", ""},
        "[pmo]\nactive_reap_seconds = 21\n",
    },
    /* heartbeat_seconds < inbox_processing_timeout_seconds / 2 */
    {
        {CC_CROSS_KEY, 3, "heartbeat_seconds", "inbox_processing_timeout_seconds (19)"},
        "[worker]\ninbox_processing_timeout_seconds = 19\nheartbeat_seconds = 10\n",
    },
    {
        {CC_CROSS_KEY, 2, "heartbeat_seconds", "inbox_processing_timeout_seconds (20)"},
        "[worker]\ninbox_processing_timeout_seconds = 20\n",
    },
    {
        {CC_CROSS_KEY, 0, "", ""},
        "[worker]\ninbox_processing_timeout_seconds = 21\n",
    },
    /* retry_backoff_max_seconds >= retry_backoff_seconds, in [worker] and in each agent (after inheriting).
     */
    {
        {CC_CROSS_KEY, 2, "[worker] retry_backoff_max_seconds",
         "must not be less than retry_backoff_seconds (400)"},
        "[worker]\nretry_backoff_seconds = 400\n",
    },
    {
        {CC_CROSS_KEY, 5, "[agent.a] retry_backoff_max_seconds", "(6)"},
        "[worker]\nretry_backoff_max_seconds = 5\n[agent.a]\nexec = /bin/true\nretry_backoff_seconds = 6\n",
    },
    {
        {CC_CROSS_KEY, 0, "", ""},
        "[worker]\nretry_backoff_seconds = 300\n",
    },
    {
        {CC_POLICIES, 2, "max_attempts", "out of range (1 to 100)"},
        "[worker]\nmax_attempts = 0\n",
    },
    {
        {CC_POLICIES, 3, "warn_at_percent", "out of range (0 to 99)"},
        "[agent.a]\nexec = /bin/true\nwarn_at_percent = 100\n",
    },
    {
        {CC_POLICIES, 3, "retry_on", "comma list"},
        "[agent.a]\nexec = /bin/true\nretry_on = step timeout\n",
    },
    {
        {CC_POLICIES, 3, "timeout_seconds", "out of range"},
        "[tool.t]\nexec = /bin/true\ntimeout_seconds = 0\n",
    },
    /* [nats] security (contract 16): one way to authenticate, a user with its password file, a certificate
     * with its key. */
    {
        {CC_SECURITY, 3, "[nats] token_file", "user is set already: choose one of"},
        "[nats]\nuser = u\ntoken_file = /t\npassword_file = /p\n",
    },
    {
        {CC_SECURITY, 3, "[nats] nkey_seed_file", "credentials_file is set already"},
        "[nats]\ncredentials_file = /c\nnkey_seed_file = /s\n",
    },
    {
        {CC_SECURITY, 2, "[nats] user", "needs password_file"},
        "[nats]\nuser = u\n",
    },
    {
        {CC_SECURITY, 2, "[nats] password_file", "needs user"},
        "[nats]\npassword_file = /p\n",
    },
    {
        {CC_SECURITY, 2, "[nats] tls_cert_file", "needs both tls_cert_file and tls_key_file"},
        "[nats]\ntls_cert_file = /c\n",
    },
    {
        {CC_SECURITY, 3, "[nats] tls_key_file", "needs both tls_cert_file and tls_key_file"},
        "[nats]\nurl = tls://h:4222\ntls_key_file = /k\n",
    },
    {
        {CC_SECURITY, 0, "", ""},
        "[nats]\nurl = tls://h:4222\ntls_ca_file = /ca\ntls_cert_file = /c\ntls_key_file = /k\n"
        "nkey_seed_file = /s\n",
    },
    {
        {CC_SECURITY, 0, "", ""},
        "[nats]\nuser = u\npassword_file = /p\n[worker]\nrun_as_user =\nmax_processes = 0\n",
    },
    /* Limits on programs: in range, and run_as_user not empty in a section of its own. */
    {
        {CC_SECURITY, 2, "[worker] memory_limit_mb", "out of range (0 to 1048576)"},
        "[worker]\nmemory_limit_mb = -1\n",
    },
    {
        {CC_SECURITY, 3, "[tool.t] cpu_limit_seconds", "out of range (0 to 604800)"},
        "[tool.t]\nexec = /bin/true\ncpu_limit_seconds = 604801\n",
    },
    {
        {CC_SECURITY, 3, "[agent.a] max_open_files", "not a whole number"},
        "[agent.a]\nexec = /bin/true\nmax_open_files = many\n",
    },
    {
        {CC_SECURITY, 3, "[agent.a] run_as_user", "must not be empty"},
        "[agent.a]\nexec = /bin/true\nrun_as_user =\n",
    },
};
static const size_t n_config_cases = sizeof config_cases / sizeof config_cases[0];

/* Every row of config_cases in `group`; a failure names the row by its index ("config_cases[17]"). */
static void expect_cases(ConfigGroup group)
{
    size_t run = 0;
    for (size_t i = 0; i < n_config_cases; i++) {
        const ConfigCase *c = &config_cases[i];
        char row[64];
        if (c->expect.group != group)
            continue;
        run++;
        snprintf(row, sizeof row, "config_cases[%zu]", i);
        if (c->expect.line == 0) {
            ck_assert_msg(!*c->expect.key && !*c->expect.why, "%s: a row that loads fine names no key or why",
                          row);
            expect_ok(row, c->text);
        } else {
            expect_error(row, c->text, c->expect.line, c->expect.key, c->expect.why);
        }
    }
    ck_assert_msg(run > 0, "no row of config_cases is in group %d", (int)group);
}

START_TEST(test_errors_syntax_and_names)
{
    expect_cases(CC_SYNTAX);

    /* Several problems are all reported. */
    TwConfig cfg;
    ck_assert_int_eq(tw_config_load_string(&cfg, "t.ini", "[pmo]\nfoo = 1\n[worker]\nconcurrency = x\n"), -1);
    ck_assert_int_eq(cfg.n_errors, 2);
    ck_assert_ptr_nonnull(strstr(cfg.errors, "t.ini:2: [pmo] foo: unknown key"));
    ck_assert_ptr_nonnull(strstr(cfg.errors, "t.ini:4: [worker] concurrency:"));
    tw_config_free(&cfg);
    /* A file that is not there. */
    ck_assert_int_eq(tw_config_load(&cfg, "/nonexistent/turnwatch.ini"), -1);
    ck_assert_ptr_nonnull(strstr(cfg.errors, "/nonexistent/turnwatch.ini"));
    ck_assert_ptr_nonnull(strstr(cfg.errors, "cannot open"));
    tw_config_free(&cfg);
}
END_TEST

START_TEST(test_errors_values)
{
    expect_cases(CC_VALUES);
    const char *bools[] = {"yes", "no", "on", "off", "1", "0", "TRUE", "False"};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "[tool.t]\nexec = /bin/true\nexternal = %s\n", bools[i]);
        TwConfig cfg;
        int rc = tw_config_load_string(&cfg, "b.ini", text);
        /* external = true with an exec is refused by a cross-key rule: so true and false both say what they
         * mean. */
        bool truthy = i % 2 == 0;
        ck_assert_msg((rc == 0) == !truthy, "external = %s: rc %d %s", bools[i], rc,
                      cfg.errors ? cfg.errors : "");
        if (truthy)
            ck_assert_ptr_nonnull(strstr(cfg.errors, "an external tool has no program"));
        tw_config_free(&cfg);
    }
}
END_TEST

START_TEST(test_errors_programs)
{
    expect_cases(CC_PROGRAMS);

    TwConfig cfg;
    ck_assert_int_eq(
        tw_config_load_string(&cfg, "ok.ini",
                              "[worker]\nagents = a,t\n[agent.a]\nexec = /bin/true\n[agent.b]\n"
                              "exec = /bin/true\n[tool.t]\nexternal = yes\ntimeout_seconds = 400\n"),
        0);
    ck_assert(tw_config_serves(&cfg, "a"));
    ck_assert(tw_config_serves(&cfg, "t"));
    ck_assert(!tw_config_serves(&cfg, "b"));
    ck_assert(!tw_config_serves(&cfg, ""));
    ck_assert(tw_config_tool(&cfg, "t")->external);
    ck_assert_ptr_null(tw_config_tool(&cfg, "t")->argv);
    ck_assert_int_eq(
        tw_policy_wait_seconds(&cfg, tw_config_tool(&cfg, "t"),
                               tw_policy_tool_timeout(&cfg, NULL, tw_config_tool(&cfg, "t"), 0, NULL)),
        400);
    ck_assert(!tw_config_agent(&cfg, "a")->serve);
    ck_assert_int_eq(tw_config_agent(&cfg, "a")->max_requests, 1000);
    tw_config_free(&cfg);
    ck_assert_int_eq(tw_config_load_string(&cfg, "serve.ini",
                                           "[agent.a]\nexec = /bin/true\nmode = serve\nmax_requests = 7\n"
                                           "[tool.u]\nexec = /bin/true\nmode = serve\n"),
                     0);
    ck_assert(tw_config_agent(&cfg, "a")->serve);
    ck_assert_int_eq(tw_config_agent(&cfg, "a")->max_requests, 7);
    ck_assert(tw_config_tool(&cfg, "u")->serve);
    tw_config_free(&cfg);
}
END_TEST

/* Writes text to a new file from the template path (mkstemp, so path holds its name after), loads it, removes
 * it: tw_config_load's answer. */
static int load_via_file(TwConfig *cfg, char *path, const char *text)
{
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(text, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    int rc = tw_config_load(cfg, path);
    unlink(path);
    return rc;
}

/* A line longer than the parser's buffer must not be split in two with the tail read as a line of its own:
 * that tail could open a section or set a key nobody wrote. Line 1 is a comment of 70,000 bytes whose tail
 * (from byte 65,535, where the parser used to cut it) reads "[agent.x]"; line 2 is an exec for it. */
static char *overlong_text(void)
{
    const size_t len = 70000, cut = 65535;
    const char *tail = "[agent.x]";
    const char *next = "\nexec = /bin/true\n";
    char *text = malloc(len + strlen(next) + 1);
    ck_assert_ptr_nonnull(text);
    memset(text, ' ', len);
    text[0] = ';';
    memset(text + 1, 'c', cut - 1);
    memcpy(text + cut, tail, strlen(tail));
    strcpy(text + len, next);
    return text;
}

static void expect_overlong_refused(TwConfig *cfg, int rc, const char *file)
{
    char want[256];
    snprintf(want, sizeof want, "%s:1: line is longer than %d bytes", file, TW_CONFIG_MAX_LINE);
    ck_assert_msg(rc == -1, "a 70,000-byte line loaded without error (agent x %s)",
                  tw_config_agent(cfg, "x") ? "was injected" : "absent");
    ck_assert_msg(cfg->errors && strstr(cfg->errors, want), "no '%s' in:\n%s", want,
                  cfg->errors ? cfg->errors : "");
    ck_assert_ptr_null(tw_config_agent(cfg, "x"));
}

START_TEST(test_errors_overlong_line)
{
    char *text = overlong_text();
    TwConfig cfg;
    int rc = tw_config_load_string(&cfg, "t.ini", text);
    expect_overlong_refused(&cfg, rc, "t.ini");
    tw_config_free(&cfg);

    /* The same through a file (the reader has a second branch for files). */
    char path[] = "/tmp/tw-config-long-XXXXXX";
    rc = load_via_file(&cfg, path, text);
    expect_overlong_refused(&cfg, rc, path);
    tw_config_free(&cfg);

    /* A line of exactly the limit is fine, with or without a CR before its newline. */
    char *ok = malloc(TW_CONFIG_MAX_LINE + 64);
    ck_assert_ptr_nonnull(ok);
    for (int crlf = 0; crlf < 2; crlf++) {
        memset(ok, 'c', TW_CONFIG_MAX_LINE);
        ok[0] = ';';
        strcpy(ok + TW_CONFIG_MAX_LINE, crlf ? "\r\n[pmo]\nactive_reap_seconds = 60\n" : "\n[pmo]\n");
        rc = tw_config_load_string(&cfg, "ok.ini", ok);
        ck_assert_msg(rc == 0, "a line of %d bytes: %s", TW_CONFIG_MAX_LINE, cfg.errors);
        tw_config_free(&cfg);
    }
    /* One byte more is not. */
    memset(ok, 'c', TW_CONFIG_MAX_LINE + 1);
    ok[0] = ';';
    strcpy(ok + TW_CONFIG_MAX_LINE + 1, "\n");
    expect_error("one byte over the limit", ok, 1, "", "line is longer than");
    free(ok);
    free(text);
}
END_TEST

/* Loads `head`, then `pad` blanks, then `tail` and a newline, from a string and from a file; the errors must
 * hold `want` (after "file:"). */
static void expect_overlong_error(const char *head, size_t pad, const char *tail, const char *want)
{
    size_t hl = strlen(head), tl = strlen(tail);
    char *text = malloc(hl + pad + tl + 2), full[512];
    TwConfig cfg;
    ck_assert_ptr_nonnull(text);
    memcpy(text, head, hl);
    memset(text + hl, ' ', pad);
    memcpy(text + hl + pad, tail, tl);
    strcpy(text + hl + pad + tl, "\n");

    ck_assert_int_eq(tw_config_load_string(&cfg, "t.ini", text), -1);
    snprintf(full, sizeof full, "t.ini:%s", want);
    ck_assert_msg(cfg.errors && strstr(cfg.errors, full), "no '%s' in:\n%s", full,
                  cfg.errors ? cfg.errors : "");
    tw_config_free(&cfg);

    char path[] = "/tmp/tw-config-long-XXXXXX";
    int rc = load_via_file(&cfg, path, text);
    ck_assert_int_eq(rc, -1);
    snprintf(full, sizeof full, "%s:%s", path, want);
    ck_assert_msg(cfg.errors && strstr(cfg.errors, full), "no '%s' in:\n%s", full,
                  cfg.errors ? cfg.errors : "");
    tw_config_free(&cfg);
    free(text);
}

/* An overlong line that sets a key is reported with that key and its section, as every other error of a key
 * is (issue 25): "file:line: [worker] concurrency: line is longer than ...". A comment has no key. */
START_TEST(test_errors_overlong_line_names_key)
{
    char want[256];
    snprintf(want, sizeof want, "4: [worker] concurrency: line is longer than %d bytes", TW_CONFIG_MAX_LINE);
    expect_overlong_error("[pmo]\nactive_reap_seconds = 60\n[worker]\nconcurrency = 4", 70000, "; too long",
                          want);
    /* The key's line starts with more blanks than the parser's first read of a line holds. */
    char lead[400];
    memset(lead, ' ', 300);
    strcpy(lead + 300, "concurrency = 4");
    char *head = malloc(strlen(lead) + 16);
    ck_assert_ptr_nonnull(head);
    sprintf(head, "[worker]\n\n%s", lead);
    snprintf(want, sizeof want, "3: [worker] concurrency: line is longer than %d bytes", TW_CONFIG_MAX_LINE);
    expect_overlong_error(head, 70000, "x", want);
    free(head);
    snprintf(want, sizeof want, "2: [agent.x] exec: line is longer than %d bytes", TW_CONFIG_MAX_LINE);
    expect_overlong_error("[agent.x]\nexec = /bin/echo", 70000, "x", want);
    /* A comment, and a line that names no key we could say: the line only. */
    snprintf(want, sizeof want, "2: line is longer than %d bytes", TW_CONFIG_MAX_LINE);
    expect_overlong_error("[worker]\n; a comment", 70000, "x", want);
    expect_overlong_error("[worker]\nnot a key!", 70000, "= 1", want);
}
END_TEST

/* A directory given as the configuration file is refused, by name (read as a file it looks empty: valid). */
START_TEST(test_errors_config_is_directory)
{
    TwConfig cfg;
    ck_assert_int_eq(tw_config_load(&cfg, "/tmp"), -1);
    ck_assert_msg(cfg.errors && strstr(cfg.errors, "/tmp: is a directory"), "errors: %s",
                  cfg.errors ? cfg.errors : "(none)");
    tw_config_free(&cfg);
}
END_TEST

/* tw_config_check_programs: what the worker checks before it starts (and with --check-config). Only what
 * the worker serves is checked; each problem names file, line, section, the program and why. */
START_TEST(test_check_programs)
{
    char noexec[] = "/tmp/tw-config-noexec-XXXXXX";
    int fd = mkstemp(noexec);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fchmod(fd, 0644), 0);
    close(fd);
    char *text = NULL;
    ck_assert_int_gt(asprintf(&text,
                              "[worker]\nagents = good, gone, dir, plain, t, ext\n"
                              "[agent.good]\nexec = /bin/true --x\n"
                              "[agent.gone]\nexec = /nonexistent/agent\n"
                              "[agent.dir]\nexec = /tmp\n"
                              "[agent.plain]\nstep_timeout_seconds = 5\nexec = %s\n"
                              "[agent.unserved]\nexec = /nonexistent/unserved\n"
                              "[tool.t]\nexec = /usr\n"
                              "[tool.ext]\nexternal = true\n",
                              noexec),
                     0);
    TwConfig cfg;
    ck_assert_int_eq(tw_config_load_string(&cfg, "p.ini", text), 0);
    ck_assert_int_eq(tw_config_check_programs(&cfg), -1);
    ck_assert_int_eq(cfg.n_errors, 4);
    char want[512];
    ck_assert_msg(strstr(cfg.errors, "p.ini:6: [agent.gone] exec: /nonexistent/agent does not exist"), "%s",
                  cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "p.ini:8: [agent.dir] exec: /tmp is a directory, not a program"), "%s",
                  cfg.errors);
    snprintf(want, sizeof want, "p.ini:11: [agent.plain] exec: %s is not executable", noexec);
    ck_assert_msg(strstr(cfg.errors, want), "no '%s' in %s", want, cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "p.ini:15: [tool.t] exec: /usr is a directory, not a program"), "%s",
                  cfg.errors);
    ck_assert_ptr_null(strstr(cfg.errors, "unserved"));
    ck_assert_ptr_null(strstr(cfg.errors, "good"));
    tw_config_free(&cfg);
    unlink(noexec);
    free(text);

    /* Everything served is a program: no error. */
    ck_assert_int_eq(tw_config_load_string(&cfg, "ok.ini",
                                           "[worker]\nagents = a\n[agent.a]\nexec = /bin/true\n"
                                           "[agent.b]\nexec = /nonexistent\n"),
                     0);
    ck_assert_int_eq(tw_config_check_programs(&cfg), 0);
    ck_assert_int_eq(cfg.n_errors, 0);
    tw_config_free(&cfg);
}
END_TEST

START_TEST(test_delegating_tools)
{
    expect_cases(CC_DELEGATING);
}
END_TEST

START_TEST(test_errors_cross_key_rules)
{
    expect_cases(CC_CROSS_KEY);
}
END_TEST

/* ---- timeout policies (contract 11)
 * ---------------------------------------------------------------------------- */

START_TEST(test_policies)
{
    TwConfig cfg;
    const char *src = NULL;
    int rc = tw_config_load_string(
        &cfg, "p.ini",
        "[worker]\nmax_attempts = 3\nretry_on = step_timeout, agent_exit\n"
        "warn_at_percent = 50\ntool_timeout_seconds = 11\n"
        "[agent.a]\nexec = /bin/true\nmax_attempts = 5\nqueue_timeout_seconds = 9\n"
        "tool_timeout_seconds = 22\nretry_on = *\n"
        "[agent.b]\nexec = /bin/true\nwarn_at_percent = 0\n"
        "[tool.t]\nexec = /bin/true\ntimeout_seconds = 33\n[tool.u]\nexec = /bin/true\n");
    ck_assert_msg(rc == 0, "%s", cfg.errors);
    const TwAgentConf *a = tw_config_agent(&cfg, "a"), *b = tw_config_agent(&cfg, "b");
    const TwToolConf *t = tw_config_tool(&cfg, "t"), *u = tw_config_tool(&cfg, "u");
    /* What an agent sets is its own; the rest comes from [worker], whatever the order of the sections. */
    ck_assert_int_eq(a->policy.max_attempts, 5);
    ck_assert_str_eq(a->policy.retry_on, "*");
    ck_assert_int_eq(a->policy.queue_timeout_sec, 9);
    ck_assert_int_eq(a->policy.warn_at_percent, 50);
    ck_assert_int_eq(b->policy.max_attempts, 3);
    ck_assert_str_eq(b->policy.retry_on, "step_timeout, agent_exit");
    ck_assert_int_eq(b->policy.warn_at_percent, 0);
    ck_assert_int_eq(b->policy.retry_backoff_max_sec, 300);
    ck_assert_ptr_eq(tw_policy_of(&cfg, "a"), &a->policy);
    ck_assert_ptr_eq(tw_policy_of(&cfg, "nobody"), &cfg.worker.policy);
    /* The hierarchy: call -> tool -> agent -> global, each level named. */
    ck_assert_int_eq(tw_policy_tool_timeout(&cfg, a, t, 7, &src), 7);
    ck_assert_str_eq(src, "call");
    ck_assert_int_eq(tw_policy_tool_timeout(&cfg, a, t, 0, &src), 33);
    ck_assert_str_eq(src, "tool");
    ck_assert_int_eq(tw_policy_tool_timeout(&cfg, a, u, 0, &src), 22);
    ck_assert_str_eq(src, "agent");
    ck_assert_int_eq(tw_policy_tool_timeout(&cfg, b, u, 0, &src), 11);
    ck_assert_str_eq(src, "global");
    ck_assert_int_eq(tw_policy_tool_timeout(&cfg, NULL, NULL, 0, &src), 11);
    ck_assert_str_eq(src, "global");
    tw_config_free(&cfg);
    expect_cases(CC_POLICIES);
}
END_TEST

/* ---- exec lines and names
 * --------------------------------------------------------------------------------------- */

static void expect_argv(const char *line, const char *const *want)
{
    const char *err = "unset";
    char **argv = tw_argv_split(line, &err);
    ck_assert_msg(argv != NULL, "'%s': %s", line, err);
    ck_assert_ptr_null(err);
    size_t i = 0;
    for (; want[i]; i++) {
        ck_assert_msg(argv[i] != NULL, "'%s': only %zu words", line, i);
        ck_assert_msg(strcmp(argv[i], want[i]) == 0, "'%s': word %zu is '%s', want '%s'", line, i, argv[i],
                      want[i]);
    }
    ck_assert_msg(argv[i] == NULL, "'%s': extra word '%s'", line, argv[i]);
    tw_argv_free(argv);
}

static void expect_argv_error(const char *line, const char *why)
{
    const char *err = NULL;
    char **argv = tw_argv_split(line, &err);
    ck_assert_msg(argv == NULL, "'%s' split without error", line);
    ck_assert_msg(err && strstr(err, why), "'%s': error '%s', want '%s'", line, err, why);
}

START_TEST(test_argv_split)
{
    expect_argv("/bin/prog", (const char *[]){"/bin/prog", NULL});
    expect_argv("/bin/prog a 'b c' \"d \\\"e\\\"\" f\\ g",
                (const char *[]){"/bin/prog", "a", "b c", "d \"e\"", "f g", NULL});
    expect_argv("  /bin/x\t\ty  \t", (const char *[]){"/bin/x", "y", NULL});
    expect_argv("/bin/x '' \"\"", (const char *[]){"/bin/x", "", "", NULL});
    expect_argv("/bin/x a'b'\"c\"d", (const char *[]){"/bin/x", "abcd", NULL});
    /* Single quotes keep everything; double quotes only unescape \" and \\. */
    expect_argv("/bin/x 'a\\b \"q\"'", (const char *[]){"/bin/x", "a\\b \"q\"", NULL});
    expect_argv("/bin/x \"a\\b\" \"c\\\\d\" \"it's\"",
                (const char *[]){"/bin/x", "a\\b", "c\\d", "it's", NULL});
    expect_argv("/bin/x \\'q\\' \\\\", (const char *[]){"/bin/x", "'q'", "\\", NULL});
    /* No expansion of any kind. */
    expect_argv("/bin/x $HOME * ~ `id` ;ls",
                (const char *[]){"/bin/x", "$HOME", "*", "~", "`id`", ";ls", NULL});
    expect_argv("/bin/x trailing\\", (const char *[]){"/bin/x", "trailing\\", NULL});
    expect_argv_error("", "empty");
    expect_argv_error("   \t ", "empty");
    expect_argv_error("/bin/x 'open", "unterminated quote");
    expect_argv_error("/bin/x \"open", "unterminated quote");
    expect_argv_error("/bin/x \"esc\\\"", "unterminated quote");
    tw_argv_free(NULL);
}
END_TEST

START_TEST(test_names)
{
    char n64[65], n65[66], s256[257], s257[258];
    memset(n64, 'a', 64), n64[64] = '\0';
    memset(n65, 'a', 65), n65[65] = '\0';
    memset(s256, 'x', 256), s256[256] = '\0';
    memset(s257, 'x', 257), s257[257] = '\0';

    const char *good_names[] = {"a", "Z", "0", "researcher", "A-z_09", "-", "_", n64};
    for (size_t i = 0; i < sizeof good_names / sizeof good_names[0]; i++)
        ck_assert_msg(tw_name_valid(good_names[i]), "'%s' should be a valid name", good_names[i]);
    const char *bad_names[] = {"",   n65,   "a.b", "a b", "bad name!", "a*",
                               "a>", "a/b", "é",   "a\n", "a'b",       "a;b"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++)
        ck_assert_msg(!tw_name_valid(bad_names[i]), "'%s' should be refused", bad_names[i]);
    ck_assert(!tw_name_valid(NULL));

    const char *good_ids[] = {
        "c", "chan-1", "x'); DROP TABLE state.turns; --", "a b\"c\\d", "é ü 日本", "~!@#$%^&*()", s256};
    for (size_t i = 0; i < sizeof good_ids / sizeof good_ids[0]; i++)
        ck_assert_msg(tw_ident_valid(good_ids[i]), "'%s' should be a valid identifier", good_ids[i]);
    const char *bad_ids[] = {"", s257, "a\tb", "a\nb", "a\rb", "\x1b[31m", "del\x7f"};
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++)
        ck_assert_msg(!tw_ident_valid(bad_ids[i]), "identifier %zu should be refused", i);
    ck_assert(!tw_ident_valid(NULL));

    const char *good_uuids[] = {"123e4567-e89b-12d3-a456-426614174000",
                                "00000000-0000-0000-0000-000000000000",
                                "ABCDEF01-2345-6789-ABCD-EF0123456789"};
    for (size_t i = 0; i < sizeof good_uuids / sizeof good_uuids[0]; i++)
        ck_assert_msg(tw_uuid_valid(good_uuids[i]), "'%s' should be a valid uuid", good_uuids[i]);
    const char *bad_uuids[] = {"",
                               "123e4567-e89b-12d3-a456-42661417400",
                               "123e4567-e89b-12d3-a456-4266141740000",
                               "123e4567e89b-12d3-a456-426614174000-",
                               "123e4567-e89b-12d3-a456_426614174000",
                               "g23e4567-e89b-12d3-a456-426614174000",
                               "123e4567-e89b-12d3-a4564-26614174000",
                               "{123e4567-e89b-12d3-a456-42661417400}",
                               "123e4567-e89b-12d3-a456-426614174000\n",
                               "x'); DROP TABLE state.turns; --     "};
    for (size_t i = 0; i < sizeof bad_uuids / sizeof bad_uuids[0]; i++)
        ck_assert_msg(!tw_uuid_valid(bad_uuids[i]), "'%s' should be refused", bad_uuids[i]);
    ck_assert(!tw_uuid_valid(NULL));
}
END_TEST

/* Subjects from outside (the database, NOTIFY payloads) never reach a PUB line unless they are subjects. */
START_TEST(test_subjects)
{
    char s256[257], s257[258];
    memset(s256, 'x', 256), s256[256] = '\0';
    memset(s257, 'x', 257), s257[257] = '\0';
    s256[3] = s257[3] = '.';

    const char *good[] = {"a",
                          "cmd.agent.researcher.wakeup",
                          "evt.agent.A-z_09.task",
                          "cmd.pmo.wakeup",
                          "$JS.API.INFO",
                          "a.b.c.d.e.f",
                          "x|y.~!#%&",
                          s256};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        ck_assert_msg(tw_subject_valid(good[i]), "'%s' should be a valid subject", good[i]);
    const char *bad[] = {
        "",
        s257,
        "cmd.x 2\r\n{}\r\nPUB evt.agent.victim.task 16\r\n{\"forged\": true}\r\nPUB cmd.y",
        "cmd.a b",
        "cmd.a\tb",
        "cmd.a\r",
        "cmd.a\n",
        "cmd.a\x01",
        "cmd.a\x7f",
        "cmd.\xc3\xa9",
        "cmd..x",
        ".cmd",
        "cmd.",
        ".",
        "..",
        "cmd.*",
        "cmd.>",
        "cmd.a*",
        "cmd.a>b",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!tw_subject_valid(bad[i]), "subject %zu should be refused", i);
    ck_assert(!tw_subject_valid(NULL));

    const char *kind = NULL, *why = NULL;
    char name[TW_NAME_MAX + 1], n64[64 + 20], n65[65 + 20];
    ck_assert(tw_doorbell_parse("cmd.agent.researcher.wakeup", &kind, name, &why));
    ck_assert_str_eq(kind, "agent");
    ck_assert_str_eq(name, "researcher");
    ck_assert(tw_doorbell_parse("cmd.tool.web-search_2.wakeup", &kind, name, NULL));
    ck_assert_str_eq(kind, "tool");
    ck_assert_str_eq(name, "web-search_2");
    ck_assert(tw_doorbell_parse("cmd.agent.wakeup.wakeup", NULL, NULL, NULL));
    snprintf(n64, sizeof n64, "cmd.agent.%064d.wakeup", 0);
    snprintf(n65, sizeof n65, "cmd.agent.%065d.wakeup", 0);
    ck_assert(tw_doorbell_parse(n64, &kind, name, NULL));
    ck_assert_int_eq(strlen(name), 64);
    const char *not_bells[] = {"cmd.agent.a b.wakeup",
                               "cmd.agent.a\r\n.wakeup",
                               "cmd.agent..wakeup",
                               "cmd.agent.*.wakeup",
                               "cmd.agent.>",
                               "cmd.agent.wakeup",
                               "cmd.agent.a.b.wakeup",
                               "cmd.agent.a.wakeup.x",
                               "cmd.agent.a.task",
                               "cmd.pmo.wakeup",
                               "cmd.worker.wakeup",
                               "cmd.x.a.wakeup",
                               "cmd.agents.a.wakeup",
                               "evt.agent.a.wakeup",
                               "cmd.tool.a",
                               "cmd.agent.a+b.wakeup",
                               n65,
                               ""};
    for (size_t i = 0; i < sizeof not_bells / sizeof not_bells[0]; i++) {
        why = NULL;
        ck_assert_msg(!tw_doorbell_parse(not_bells[i], &kind, name, &why), "'%s' is no doorbell",
                      not_bells[i]);
        ck_assert_msg(why && *why, "no reason given for '%s'", not_bells[i]);
    }
    ck_assert(!tw_doorbell_parse(NULL, NULL, NULL, NULL));

    /* Shown in a log line: no raw control byte, quotes escaped, cut with "..." to fit. */
    char buf[32];
    const char *raw = "a\"b\\c\r\n\t\x01\xc3";
    ck_assert_str_eq(tw_shown(raw, strlen(raw), buf, sizeof buf), "a\\\"b\\\\c\\r\\n\\t\\x01\\xc3");
    ck_assert_str_eq(tw_shown("abcdefghij", 10, buf, 8), "abcd...");
    ck_assert_str_eq(tw_shown("abcdefg", 7, buf, 8), "abcdefg");
    ck_assert_str_eq(tw_shown("ab\r\ncdefg", 9, buf, 8), "ab\\r...");
    ck_assert_str_eq(tw_shown("x\x01", 2, buf, 4), "...");
    ck_assert_str_eq(tw_shown("", 0, buf, 8), "");
    char big[600];
    memset(big, '\n', sizeof big);
    tw_shown(big, sizeof big, buf, sizeof buf);
    ck_assert_int_lt(strlen(buf), sizeof buf);
    ck_assert_ptr_null(strchr(buf, '\n'));
    ck_assert_str_eq(buf + strlen(buf) - 3, "...");
}
END_TEST

/* ---- NATS security and the limits on programs (contract 16)
 * ---------------------------------------------------------- */

/* A file in a fresh temp dir with `text`; returns its path (malloc'd). */
static char *temp_file(const char *dir, const char *name, const char *text)
{
    char *path = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/%s", dir, name), 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* tw_nats_check on a config text: its errors (malloc'd, "" when none). */
static char *nats_check(const char *text)
{
    TwConfig cfg;
    int rc = tw_config_load_string(&cfg, "n.ini", text);
    ck_assert_msg(rc == 0, "%s", cfg.errors);
    rc = tw_nats_check(&cfg);
    char *errors = strdup(cfg.errors ? cfg.errors : "");
    ck_assert_int_eq(rc, *errors ? -1 : 0);
    tw_config_free(&cfg);
    return errors;
}

#define NATS_CHECK_SAYS(text, want)                                                                          \
    do {                                                                                                     \
        char *e_ = nats_check(text);                                                                         \
        ck_assert_msg(strstr(e_, want), "no '%s' in '%s' for:\n%s", want, e_, text);                         \
        free(e_);                                                                                            \
        free(text);                                                                                          \
    } while (0)

START_TEST(test_nats_keys)
{
    expect_cases(CC_SECURITY);

    /* nkeys: the public key of a user seed (the pair is the example of nats-io/nkeys.net's README), a new
     * seed's public key, and seeds that are not valid. */
    char pub[TW_NKEY_PUBLIC_LEN + 1], seed[TW_NKEY_SEED_LEN + 1];
    ck_assert_int_eq(tw_nkey_public("SUAOBFVHF4ZWKTBJ6QP4C362WLBBBFIE7ENFTPYKUGZ3M2ESOXY353LXDI", pub), 0);
    ck_assert_str_eq(pub, "UBIWK4X3RXCPJ4CMIAVLAFDFABMLCCMZDDLAO5OZZ2265MDLXUTOGO4B");
    ck_assert_int_eq(tw_nkey_seed_new(seed), 0);
    ck_assert_uint_eq(strlen(seed), TW_NKEY_SEED_LEN);
    ck_assert(strncmp(seed, "SU", 2) == 0);
    ck_assert_int_eq(tw_nkey_public(seed, pub), 0);
    ck_assert_uint_eq(strlen(pub), TW_NKEY_PUBLIC_LEN);
    ck_assert_int_eq(pub[0], 'U');
    char bad[TW_NKEY_SEED_LEN + 1];
    memcpy(bad, seed, sizeof bad);
    bad[20] = bad[20] == 'A' ? 'B' : 'A'; /* the checksum no longer fits */
    ck_assert_int_eq(tw_nkey_public(bad, pub), -EINVAL);
    /* An operator seed (SO...) is not a user's; nor is a public key or a short text. */
    ck_assert_int_eq(tw_nkey_public("SOAELH6NJCEK4HST5644G4HK7TOAFZGRRJHNM4EUKUY7PPNDLIKO5IH4JM", pub),
                     -EINVAL);
    ck_assert_int_eq(tw_nkey_public("UBIWK4X3RXCPJ4CMIAVLAFDFABMLCCMZDDLAO5OZZ2265MDLXUTOGO4B", pub),
                     -EINVAL);
    ck_assert_int_eq(tw_nkey_public("SU", pub), -EINVAL);

    /* The files, as a daemon's start and --check-config read them: each problem names the key and its line,
     * and never the secret. */
    char dir[] = "/tmp/tw-nats-keys-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *token = temp_file(dir, "token", "Tok5ecretXyz\n"), *empty = temp_file(dir, "empty", "\n");
    char *seedf = NULL, *text = NULL;
    ck_assert_int_gt(asprintf(&text, "# a comment\n%s\n", seed), 0);
    seedf = temp_file(dir, "seed.nk", text);
    free(text);
    char *garbage = temp_file(dir, "garbage", "SUNOTASEED\nTok5ecretXyz\n");
    char *creds = temp_file(dir, "x.creds", "Tok5ecretXyz\n");
    char *pem =
        temp_file(dir, "ca.pem", "-----BEGIN CERTIFICATE-----\nTok5ecretXyz\n-----END CERTIFICATE-----\n");

    ck_assert_int_gt(asprintf(&text, "[nats]\ntoken_file = %s\n", token), 0);
    char *e = nats_check(text);
    ck_assert_str_eq(e, "");
    free(e);
    free(text);
    ck_assert_int_gt(asprintf(&text, "[nats]\nnkey_seed_file = %s\n", seedf), 0);
    e = nats_check(text);
    ck_assert_str_eq(e, "");
    free(e);
    free(text);
    ck_assert_int_gt(asprintf(&text, "[nats]\nurl = nats://h:1\ntoken_file = %s/none\n", dir), 0);
    NATS_CHECK_SAYS(text, "n.ini:3: [nats] token_file: cannot read");
    ck_assert_int_gt(asprintf(&text, "[nats]\ntoken_file = %s\n", dir), 0);
    NATS_CHECK_SAYS(text, "n.ini:2: [nats] token_file: ");
    ck_assert_int_gt(asprintf(&text, "[nats]\ntoken_file = %s\n", dir), 0);
    NATS_CHECK_SAYS(text, "is not a regular file");
    ck_assert_int_gt(asprintf(&text, "[nats]\nuser = u\npassword_file = %s\n", empty), 0);
    NATS_CHECK_SAYS(text, "n.ini:3: [nats] password_file: ");
    ck_assert_int_gt(asprintf(&text, "[nats]\nuser = u\npassword_file = %s\n", empty), 0);
    NATS_CHECK_SAYS(text, "is empty");
    ck_assert_int_gt(asprintf(&text, "[nats]\nnkey_seed_file = %s\n", garbage), 0);
    NATS_CHECK_SAYS(text, "n.ini:2: [nats] nkey_seed_file: ");
    ck_assert_int_gt(asprintf(&text, "[nats]\nnkey_seed_file = %s\n", garbage), 0);
    NATS_CHECK_SAYS(text, "holds no valid user nkey seed");
    ck_assert_int_gt(asprintf(&text, "[nats]\ncredentials_file = %s\n", creds), 0);
    NATS_CHECK_SAYS(text, "n.ini:2: [nats] credentials_file: ");
    ck_assert_int_gt(asprintf(&text, "[nats]\ncredentials_file = %s\n", creds), 0);
    NATS_CHECK_SAYS(text, "is not a .creds file");
    ck_assert_int_gt(asprintf(&text, "[nats]\ntls_ca_file = %s\n", pem), 0);
    NATS_CHECK_SAYS(text, "n.ini:2: [nats] tls_ca_file: cannot use");
    ck_assert_int_gt(asprintf(&text, "[nats]\ntls_cert_file = %s\ntls_key_file = %s/none\n", pem, dir), 0);
    NATS_CHECK_SAYS(text, "n.ini:3: [nats] tls_key_file: cannot read");
    /* Whatever went wrong, the secret text of a file is never in the message. */
    const char *files[] = {garbage, creds, pem};
    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_gt(asprintf(&text, "[nats]\n%s = %s\n",
                                  i == 0   ? "nkey_seed_file"
                                  : i == 1 ? "credentials_file"
                                           : "tls_ca_file",
                                  files[i]),
                         0);
        e = nats_check(text);
        ck_assert_msg(*e && !strstr(e, "Tok5ecretXyz"), "%s", e);
        free(e);
        free(text);
    }
    char *all[] = {token, empty, seedf, garbage, creds, pem};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        unlink(all[i]);
        free(all[i]);
    }
    rmdir(dir);
}
END_TEST

START_TEST(test_limits_keys)
{
    TwConfig cfg;
    int rc =
        tw_config_load_string(&cfg, "l.ini",
                              "[worker]\nmemory_limit_mb = 256\ncpu_limit_seconds = 9\nrun_as_user = nobody\n"
                              "[agent.a]\nexec = /bin/true\nmemory_limit_mb = 64\n"
                              "[agent.b]\nexec = /bin/true\ncpu_limit_seconds = 0\nmax_processes = 7\n"
                              "[tool.t]\nexec = /bin/true\nmax_open_files = 32\n"
                              "[tool.u]\nexec = /bin/true\nrun_as_user = root\nmemory_limit_mb = 0\n"
                              "[tool.ext]\nexternal = true\n");
    ck_assert_msg(rc == 0, "%s", cfg.errors);
    const TwAgentConf *a = tw_config_agent(&cfg, "a"), *b = tw_config_agent(&cfg, "b");
    const TwToolConf *t = tw_config_tool(&cfg, "t"), *u = tw_config_tool(&cfg, "u");
    /* What a section sets is its own (0 too), the rest comes from [worker], for agents and tools alike. */
    ck_assert_int_eq(a->limits.memory_limit_mb, 64);
    ck_assert_int_eq(a->limits.cpu_limit_sec, 9);
    ck_assert_int_eq(a->limits.max_open_files, 0);
    ck_assert_str_eq(a->limits.run_as_user, "nobody");
    ck_assert_int_eq(b->limits.memory_limit_mb, 256);
    ck_assert_int_eq(b->limits.cpu_limit_sec, 0);
    ck_assert_int_eq(b->limits.max_processes, 7);
    ck_assert_int_eq(t->limits.memory_limit_mb, 256);
    ck_assert_int_eq(t->limits.max_open_files, 32);
    ck_assert_str_eq(t->limits.run_as_user, "nobody");
    ck_assert_int_eq(u->limits.memory_limit_mb, 0);
    ck_assert_str_eq(u->limits.run_as_user, "root");
    /* The worker's check: as root, every user exists; not as root, run_as_user is refused (each section that
     * has one, at the line it came from: [worker]'s for those that inherit it). */
    ck_assert_int_eq(tw_config_check_limits(&cfg, 0), 0);
    ck_assert_int_eq(tw_config_check_limits(&cfg, 1000), -1);
    ck_assert_int_eq(cfg.n_errors, 4); /* a, b, t from [worker]; u its own; ext runs nothing */
    ck_assert_msg(strstr(cfg.errors, "l.ini:4: [agent.a] run_as_user: the worker must run as root to start a "
                                     "program as another user (it runs as uid 1000)"),
                  "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "l.ini:17: [tool.u] run_as_user: the worker must run as root"), "%s",
                  cfg.errors);
    ck_assert_msg(!strstr(cfg.errors, "[tool.ext]"), "%s", cfg.errors);
    tw_config_free(&cfg);

    /* A user that does not exist; max_processes for a program that runs as root, where RLIMIT_NPROC does not
     * hold (the worker's own user when it is root, or run_as_user = root). */
    rc = tw_config_load_string(&cfg, "m.ini",
                               "[worker]\nagents = a, b, t\n"
                               "[agent.a]\nexec = /bin/true\nrun_as_user = no-such-user-tw\n"
                               "[agent.b]\nexec = /bin/true\nmax_processes = 10\n"
                               "[tool.t]\nexec = /bin/true\nmax_processes = 10\nrun_as_user = root\n"
                               "[tool.n]\nexec = /bin/true\nmax_processes = 10\nrun_as_user = nobody\n"
                               "[tool.unserved]\nexec = /bin/true\nmax_processes = 10\n");
    ck_assert_msg(rc == 0, "%s", cfg.errors);
    ck_assert_int_eq(tw_config_check_limits(&cfg, 0), -1);
    ck_assert_int_eq(cfg.n_errors, 3);
    ck_assert_msg(strstr(cfg.errors, "m.ini:5: [agent.a] run_as_user: no such user"), "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors,
                         "m.ini:8: [agent.b] max_processes: does not apply to a program that runs "
                         "as root; set run_as_user as well"),
                  "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "m.ini:11: [tool.t] max_processes: does not apply"), "%s", cfg.errors);
    tw_config_free(&cfg);
    /* Not root: max_processes counts the worker user's processes, which is a limit (README says so). */
    rc = tw_config_load_string(&cfg, "m.ini", "[agent.b]\nexec = /bin/true\nmax_processes = 10\n");
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(tw_config_check_limits(&cfg, 1000), 0);
    tw_config_free(&cfg);
}
END_TEST

/* An executable file at dir/name (mode), a script when script is true; the path (malloc'd). */
static char *lim_program(const char *dir, const char *name, bool script, mode_t mode)
{
    char *path = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/%s", dir, name), 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(script ? "#!/bin/sh\nexit 0\n" : "\177ELF", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(path, mode), 0);
    return path;
}

/* --check-config refuses what run_as_user could not start: a program in a directory it may not search, one
 * it may not execute, a script it may not read; and max_open_files too low for any program to start. A
 * program it may run, and max_open_files at the floor, pass. */
START_TEST(test_limits_user_access)
{
    char open_dir[] = "/tmp/tw-cfg-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(open_dir));
    ck_assert_int_eq(chmod(open_dir, 0755), 0);
    char *closed = NULL;
    ck_assert_int_gt(asprintf(&closed, "%s/closed", open_dir), 0);
    ck_assert_int_eq(mkdir(closed, 0700), 0);
    char *hidden = lim_program(closed, "hidden", false, 0755);
    char *noexec = lim_program(open_dir, "noexec", false, 0744);
    char *noread = lim_program(open_dir, "noread", true, 0711);
    char *fine = lim_program(open_dir, "fine", true, 0755);
    char *binary = lim_program(open_dir, "binary", false, 0711);
    char *ini = NULL;
    ck_assert_int_gt(asprintf(&ini,
                              "[worker]\nrun_as_user = nobody\n"
                              "[agent.hidden]\nexec = %s\n[agent.noexec]\nexec = %s\n"
                              "[tool.noread]\nexec = %s\n[tool.fine]\nexec = %s\nmax_open_files = 16\n"
                              "[tool.binary]\nexec = %s\n[agent.few]\nexec = %s\nmax_open_files = 3\n"
                              "[agent.root]\nexec = %s\nrun_as_user = root\nmax_open_files = 15\n",
                              hidden, noexec, noread, fine, binary, fine, hidden),
                     0);
    TwConfig cfg;
    int rc = tw_config_load_string(&cfg, "u.ini", ini);
    ck_assert_msg(rc == 0, "%s", cfg.errors);
    ck_assert_int_eq(tw_config_check_limits(&cfg, 0), -1);
    char *want = NULL;
    ck_assert_int_gt(asprintf(&want,
                              "u.ini:2: [agent.hidden] run_as_user: nobody cannot run %s: it may not search "
                              "%s (mode 0700",
                              hidden, closed),
                     0);
    ck_assert_msg(strstr(cfg.errors, want), "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "[agent.noexec] run_as_user: nobody cannot run") &&
                      strstr(cfg.errors, "it may not execute it (mode 0744"),
                  "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "[tool.noread] run_as_user: nobody cannot run") &&
                      strstr(cfg.errors, "it may not read it, and it is a script (mode 0711"),
                  "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "u.ini:16: [agent.few] max_open_files: 3 is too few for a program to "
                                     "start (at least 16"),
                  "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "u.ini:20: [agent.root] max_open_files: 15 is too few"), "%s",
                  cfg.errors);
    /* Root may search anything, and the binary needs no read; the rest were refused, nothing more. */
    ck_assert_msg(!strstr(cfg.errors, "[tool.fine]") && !strstr(cfg.errors, "[tool.binary]") &&
                      !strstr(cfg.errors, "[agent.root] run_as_user"),
                  "%s", cfg.errors);
    ck_assert_int_eq(cfg.n_errors, 5);
    tw_config_free(&cfg);
    const char *const all[] = {hidden, noexec, noread, fine, binary};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        unlink(all[i]);
        free((char *)all[i]);
    }
    rmdir(closed);
    rmdir(open_dir);
    free(closed);
    free(ini);
    free(want);
}
END_TEST

/* Credentials never reach a log line: a NATS URL's user:password or token, a DSN's password. */
START_TEST(test_redact_credentials)
{
    char buf[512];
    static const char *const cases[][2] = {
        {"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
        {"nats://alice:s3cret@n1:4222", "nats://***@n1:4222"},
        {"nats://tok3n@n1:4222,nats://bob:pw@n2:4222,tls://n3",
         "nats://***@n1:4222,nats://***@n2:4222,tls://n3"},
        {"nats://u:p@ss@n1:4222/", "nats://***@n1:4222/"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_str_eq(tw_redact_urls(cases[i][0], buf, sizeof buf), cases[i][1]);
        ck_assert_ptr_null(strstr(buf, "s3cret"));
    }
    tw_redact_dsn("postgresql://u:hunter2@db:5432/tw", buf, sizeof buf);
    ck_assert_ptr_null(strstr(buf, "hunter2"));
    ck_assert_ptr_nonnull(strstr(buf, "password=***"));
    /* Every option libpq marks secret, in both forms: the key password (sslpassword) too. */
    static const char *const dsns[] = {
        "host=db dbname=tw user=u password=hunter2 sslpassword=k3ypass sslkey=/k.pem",
        "postgresql://u:hunter2@db:5432/tw?sslpassword=k3ypass&sslkey=/k.pem",
    };
    for (size_t i = 0; i < sizeof dsns / sizeof dsns[0]; i++) {
        tw_redact_dsn(dsns[i], buf, sizeof buf);
        ck_assert_msg(!strstr(buf, "hunter2") && !strstr(buf, "k3ypass"), "a secret printed in clear: %s",
                      buf);
        ck_assert_msg(strstr(buf, "sslpassword=***") && strstr(buf, " password=***"), "%s", buf);
        ck_assert_msg(strstr(buf, "host=db") && strstr(buf, "sslkey=/k.pem"), "%s", buf);
    }
}
END_TEST

TW_SUITE_DEFINE(config, {
                            {"shipped", test_table_and_file_agree, 10},
                            {"shipped", test_shipped_file_loads_to_defaults, 10},
                            {"shipped", test_restart_only_keys, 10},
                            {"shipped", test_ini_is_generated, 10},
                            {"shipped", test_man_page_agrees, 10},
                            {"shipped", test_enums_checked_by_table, 10},
                            {"errors", test_errors_syntax_and_names, 10},
                            {"errors", test_errors_values, 10},
                            {"errors", test_errors_programs, 10},
                            {"errors", test_errors_cross_key_rules, 10},
                            {"errors", test_delegating_tools, 10},
                            {"errors", test_errors_overlong_line, 10},
                            {"errors", test_errors_overlong_line_names_key, 10},
                            {"errors", test_errors_config_is_directory, 10},
                            {"errors", test_check_programs, 10},
                            {"errors", test_policies, 10},
                            {"security", test_nats_keys, 10},
                            {"security", test_limits_keys, 10},
                            {"security", test_limits_user_access, 10},
                            {"names", test_argv_split, 10},
                            {"names", test_names, 10},
                            {"names", test_subjects, 10},
                            {"names", test_redact_credentials, 10},
                        })
