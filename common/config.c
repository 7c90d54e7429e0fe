/* The INI configuration's engine: inih reads the syntax through us (line numbers, overlong lines), the
 * parameter table (config_table.c) says what each key is, values are stored, inherited from [worker] and
 * freed by it; the rules across keys are config_check.c's. */
#include "config.h"

#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "names.h"
#include "words.h"

typedef struct ParseState {
    TwConfig *cfg;
    FILE *fp;
    const char *text; /* or a string */
    size_t text_off;
    int line; /* line being parsed */
    bool at_line_start;
    size_t line_len;   /* bytes of the current line read so far */
    int overlong_line; /* the first line longer than TW_CONFIG_MAX_LINE; reading stopped there */
    char head[256];    /* the current line's first bytes, to name the key of an overlong line */
    size_t head_len;
    char section[200]; /* the last section header read */
} ParseState;

static bool parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return *out = true, true;
        if (strcasecmp(v, no[i]) == 0)
            return *out = false, true;
    }
    return false;
}

static bool list_valid(const char *v)
{
    char *copy, *save = NULL;
    bool ok = true;
    int n = 0;

    if (strcmp(v, "*") == 0)
        return true;
    if (!(copy = strdup(v)))
        return false;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        for (char *e = tok + strlen(tok); e > tok && (e[-1] == ' ' || e[-1] == '\t');)
            *--e = '\0';
        if (!tw_name_valid(tok))
            ok = false;
        n++;
    }
    free(copy);
    return ok && n > 0;
}

/* An enum's values "a|b|c" as words: "a, b or c". */
static void enum_words(const char *values, char *buf, size_t size)
{
    size_t off = 0, n = strlen(values);

    for (const char *v = values; *v && off < size;) {
        size_t len = strcspn(v, "|");
        const char *sep = v == values ? "" : v + len == values + n ? " or " : ", ";
        off += (size_t)snprintf(buf + off, size - off, "%s%.*s", sep, (int)len, v);
        v += len + (v[len] == '|');
    }
}

/* value is one of an enum's values "a|b|c". */
static bool enum_has(const char *values, const char *value)
{
    size_t n = strlen(value);

    for (const char *v = values; *v;) {
        size_t len = strcspn(v, "|");
        if (len == n && strncmp(v, value, n) == 0)
            return true;
        v += len + (v[len] == '|');
    }
    return false;
}

/* Where an exec key (TW_PT_ARGV) keeps its line as written, beside the argv. */
static char **exec_line(const TwParam *p, void *base)
{
    if (p->section == TW_SEC_AGENT)
        return &((TwAgentConf *)base)->exec;
    return strcmp(p->key, "mcp") == 0 ? &((TwToolConf *)base)->mcp_exec : &((TwToolConf *)base)->exec;
}

/* Store one value; the same code path serves defaults and file values. */
static bool set_value(ParseState *ps, const TwParam *p, void *base, const char *value, const char *secname,
                      int line)
{
    void *dst = (char *)base + p->offset;

    switch (p->type) {
    case TW_PT_INT: {
        char *end;
        long v;
        errno = 0;
        v = strtol(value, &end, 10);
        if (errno || end == value || *end != '\0') {
            tw_config_error(ps->cfg, line, "[%s] %s: '%s' is not a whole number", secname, p->key, value);
            return false;
        }
        if (v < p->min || v > p->max) {
            tw_config_error(ps->cfg, line, "[%s] %s: %ld is out of range (%ld to %ld)", secname, p->key, v,
                            p->min, p->max);
            return false;
        }
        *(int *)dst = (int)v;
        return true;
    }
    case TW_PT_BOOL:
        if (!parse_bool(value, (bool *)dst)) {
            tw_config_error(ps->cfg, line, "[%s] %s: '%s' is not true or false", secname, p->key, value);
            return false;
        }
        return true;
    case TW_PT_STR:
    case TW_PT_LIST: {
        char *copy;
        /* A key whose default is empty may be empty (it means off). */
        if (!*value && !(p->def && !*p->def)) {
            tw_config_error(ps->cfg, line, "[%s] %s: must not be empty", secname, p->key);
            return false;
        }
        if (p->values && !enum_has(p->values, value)) {
            char words[256];
            enum_words(p->values, words, sizeof words);
            tw_config_error(ps->cfg, line, "[%s] %s: '%s' is not %s", secname, p->key, value, words);
            return false;
        }
        if (p->type == TW_PT_LIST && *value && !list_valid(value)) {
            tw_config_error(ps->cfg, line,
                            "[%s] %s: '%s' must be * or a comma list of names ([A-Za-z0-9_-]{1,64})", secname,
                            p->key, value);
            return false;
        }
        if (!(copy = strdup(value)))
            return false;
        free(*(char **)dst);
        *(char **)dst = copy;
        return true;
    }
    case TW_PT_ARGV: {
        const char *err;
        char **argv = tw_argv_split(value, &err);
        char *copy;
        if (!argv) {
            tw_config_error(ps->cfg, line, "[%s] %s: %s", secname, p->key, err);
            return false;
        }
        if (argv[0][0] != '/') {
            tw_config_error(ps->cfg, line,
                            "[%s] %s: the program '%s' must be an absolute path (no PATH search, no shell)",
                            secname, p->key, argv[0]);
            tw_argv_free(argv);
            return false;
        }
        tw_argv_free(*(char ***)dst);
        *(char ***)dst = argv;
        /* Keep the line as written, for logs and --check-config. */
        copy = strdup(value);
        free(*exec_line(p, base));
        *exec_line(p, base) = copy;
        return true;
    }
    }
    return false;
}

static void apply_defaults(ParseState *ps, TwSection sec, void *base)
{
    size_t n_params;
    const TwParam *params = tw_config_params(&n_params);

    for (size_t i = 0; i < n_params; i++)
        if (params[i].section == sec && params[i].def)
            (void)set_value(ps, &params[i], base, params[i].def, tw_config_section_name(sec), 0);
}

/* Find or create the [agent.NAME] / [tool.NAME] / [limit.NAME] entry. */
static void *named_section(ParseState *ps, TwSection sec, const char *name, int line)
{
    TwConfig *cfg = ps->cfg;

    if (sec == TW_SEC_SCHEDULE) {
        TwScheduleConf *g = (TwScheduleConf *)tw_config_schedule(cfg, name);
        if (g || !(g = realloc(cfg->schedules, (cfg->n_schedules + 1) * sizeof *g)))
            return g;
        cfg->schedules = g;
        g = memset(&g[cfg->n_schedules++], 0, sizeof *g);
        snprintf(g->name, sizeof g->name, "%s", name);
        g->section_line = line;
        apply_defaults(ps, TW_SEC_SCHEDULE, g);
        return g;
    }
    if (sec == TW_SEC_LIMIT) {
        for (size_t i = 0; i < cfg->n_flow_limits; i++)
            if (strcmp(cfg->flow_limits[i].name, name) == 0)
                return &cfg->flow_limits[i];
        TwFlowLimitConf *g = realloc(cfg->flow_limits, (cfg->n_flow_limits + 1) * sizeof *g);
        if (!g)
            return NULL;
        cfg->flow_limits = g;
        TwFlowLimitConf *l = &cfg->flow_limits[cfg->n_flow_limits++];
        memset(l, 0, sizeof *l);
        snprintf(l->name, sizeof l->name, "%s", name);
        l->section_line = line;
        apply_defaults(ps, TW_SEC_LIMIT, l);
        return l;
    }

    if (sec == TW_SEC_AGENT) {
        for (size_t i = 0; i < cfg->n_agents; i++)
            if (strcmp(cfg->agents[i].name, name) == 0)
                return &cfg->agents[i];
        TwAgentConf *g = realloc(cfg->agents, (cfg->n_agents + 1) * sizeof *g);
        if (!g)
            return NULL;
        cfg->agents = g;
        TwAgentConf *a = &cfg->agents[cfg->n_agents++];
        memset(a, 0, sizeof *a);
        snprintf(a->name, sizeof a->name, "%s", name);
        a->section_line = line;
        apply_defaults(ps, TW_SEC_AGENT, a);
        return a;
    }
    for (size_t i = 0; i < cfg->n_tools; i++)
        if (strcmp(cfg->tools[i].name, name) == 0)
            return &cfg->tools[i];
    TwToolConf *g = realloc(cfg->tools, (cfg->n_tools + 1) * sizeof *g);
    if (!g)
        return NULL;
    cfg->tools = g;
    TwToolConf *t = &cfg->tools[cfg->n_tools++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->section_line = line;
    apply_defaults(ps, TW_SEC_TOOL, t);
    return t;
}

/* Map a section header to its kind; for agent/tool, name gets the part after the dot. */
static int classify_section(const char *section, const char **name)
{
    *name = NULL;
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_LOG; s++)
        if (strcmp(section, tw_config_section_name((TwSection)s)) == 0)
            return s;
    if (strncmp(section, "agent.", 6) == 0) {
        *name = section + 6;
        return TW_SEC_AGENT;
    }
    if (strncmp(section, "tool.", 5) == 0) {
        *name = section + 5;
        return TW_SEC_TOOL;
    }
    if (strncmp(section, "limit.", 6) == 0) {
        *name = section + 6;
        return TW_SEC_LIMIT;
    }
    if (strncmp(section, "schedule.", 9) == 0) {
        *name = section + 9;
        return TW_SEC_SCHEDULE;
    }
    return -1;
}

/* Called for every section header seen by the reader, so that empty sections are known too. */
static void on_section(ParseState *ps, const char *section)
{
    const char *name;
    int sec = classify_section(section, &name);

    snprintf(ps->section, sizeof ps->section, "%s", section);
    if (sec < 0) {
        tw_config_error(ps->cfg, ps->line,
                        "[%s]: unknown section (expected postgres, nats, pmo, worker, agent.NAME, tool.NAME, "
                        "limit.NAME, schedule.NAME)",
                        section);
        return;
    }
    if (name && !tw_name_valid(name)) {
        tw_config_error(ps->cfg, ps->line, "[%s]: invalid %s name '%s' (allowed: [A-Za-z0-9_-]{1,64})",
                        section, tw_config_section_name((TwSection)sec), name);
        return;
    }
    if (name) {
        void *existing = NULL;
        if (sec == TW_SEC_AGENT)
            existing = (void *)tw_config_agent(ps->cfg, name);
        else if (sec == TW_SEC_TOOL)
            existing = (void *)tw_config_tool(ps->cfg, name);
        else if (sec == TW_SEC_SCHEDULE)
            existing = (void *)tw_config_schedule(ps->cfg, name);
        else
            existing = (void *)tw_config_flow_limit(ps->cfg, name);
        if (existing)
            tw_config_error(ps->cfg, ps->line, "[%s]: section appears twice", section);
        else
            (void)named_section(ps, (TwSection)sec, name, ps->line);
    }
}

static int on_key(void *user, const char *section, const char *key, const char *value)
{
    ParseState *ps = user;
    const char *name;
    int sec = classify_section(section, &name);
    void *base;
    int *line_of;
    size_t n_params;
    const TwParam *params = tw_config_params(&n_params);

    if (ps->overlong_line)
        return 1; /* the head of a line that is refused as a whole */
    if (sec < 0 || (name && !tw_name_valid(name)))
        return 1; /* reported once at the header */
    if (sec > TW_SEC_LOG) {
        base = named_section(ps, (TwSection)sec, name, ps->line);
        if (!base)
            return 0;
        line_of = sec == TW_SEC_AGENT      ? ((TwAgentConf *)base)->line_of
                  : sec == TW_SEC_TOOL     ? ((TwToolConf *)base)->line_of
                  : sec == TW_SEC_SCHEDULE ? ((TwScheduleConf *)base)->line_of
                                           : ((TwFlowLimitConf *)base)->line_of;
    } else {
        base = ps->cfg;
        line_of = ps->cfg->line_of;
    }
    for (size_t i = 0; i < n_params; i++) {
        if ((int)params[i].section != sec || strcmp(params[i].key, key) != 0)
            continue;
        if (line_of[i]) {
            tw_config_error(ps->cfg, ps->line, "[%s] %s: set twice (first on line %d)", section, key,
                            line_of[i]);
            return 1;
        }
        line_of[i] = ps->line;
        (void)set_value(ps, &params[i], base, value, section, ps->line);
        return 1;
    }
    tw_config_error(ps->cfg, ps->line, "[%s] %s: unknown key", section, key);
    return 1;
}

/* inih reads through us, so that we know the line number of every key and every section header. */
static char *reader(char *buf, int size, void *stream)
{
    ParseState *ps = stream;
    char *got;

    if (ps->overlong_line)
        return NULL;
    if (ps->fp) {
        got = fgets(buf, size, ps->fp);
    } else {
        const char *s = ps->text + ps->text_off;
        const char *nl;
        size_t n;
        if (!*s)
            return NULL;
        nl = strchr(s, '\n');
        n = nl ? (size_t)(nl - s + 1) : strlen(s);
        if (n > (size_t)size - 1)
            n = (size_t)size - 1;
        memcpy(buf, s, n);
        buf[n] = '\0';
        ps->text_off += n;
        got = buf;
    }
    if (!got)
        return NULL;
    if (ps->at_line_start) {
        ps->line++;
        ps->line_len = 0;
        ps->head_len = 0;
    }
    /* The line's head without its leading blanks, however many pieces they take. */
    const char *from = buf;
    while (ps->head_len == 0 && (*from == ' ' || *from == '\t'))
        from++;
    size_t keep = strlen(from);
    if (keep > sizeof ps->head - 1 - ps->head_len)
        keep = sizeof ps->head - 1 - ps->head_len;
    memcpy(ps->head + ps->head_len, from, keep);
    ps->head_len += keep;
    ps->head[ps->head_len] = '\0';
    /* inih reads a long line in pieces and, past its buffer, hands the rest over as a new line: refuse the
     * line instead and stop reading, so that no tail of it is ever parsed. */
    size_t n = strlen(buf);
    bool ends = n > 0 && buf[n - 1] == '\n';
    ps->line_len += n;
    if (ps->line_len - (ends ? 1 : 0) - (ends && n > 1 && buf[n - 2] == '\r' ? 1 : 0) > TW_CONFIG_MAX_LINE) {
        ps->overlong_line = ps->line;
        return NULL;
    }
    if (ps->at_line_start) {
        const char *p = buf;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '[') {
            const char *end = strchr(p, ']');
            if (end) {
                char section[200];
                snprintf(section, sizeof section, "%.*s", (int)(end - p - 1), p + 1);
                on_section(ps, section);
            }
        }
    }
    ps->at_line_start = strchr(buf, '\n') != NULL;
    return got;
}

/* The key an overlong line sets, as inih would read it from the line's head: NULL for a comment, a section
 * header, or a head that holds no "key =" (or ':') with a key that is a name ([A-Za-z0-9_-]{1,64}), so that
 * the message quotes nothing but a key. */
static const char *overlong_key(ParseState *ps)
{
    char *p = ps->head, *end = p + strcspn(p, "=:");

    if (strchr(";#[", *p) || !*end)
        return NULL;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *end = '\0';
    return tw_name_valid(p) ? p : NULL;
}

/* The keys of an [agent.NAME] or [tool.NAME] section without a default of their own (the timeout policies,
 * the limits) that it does not set come from [worker], the same key there. */
static void inherit_from_worker(ParseState *ps)
{
    TwConfig *cfg = ps->cfg;
    size_t n_params;
    const TwParam *params = tw_config_params(&n_params);

    for (size_t k = 0; k < n_params; k++) {
        const TwParam *ap = &params[k], *wp = NULL;
        if ((ap->section != TW_SEC_AGENT && ap->section != TW_SEC_TOOL) || ap->def || ap->type == TW_PT_ARGV)
            continue;
        for (size_t j = 0; j < n_params && !wp; j++)
            if (params[j].section == TW_SEC_WORKER && strcmp(params[j].key, ap->key) == 0)
                wp = &params[j];
        if (!wp)
            continue;
        size_t n = ap->section == TW_SEC_AGENT ? cfg->n_agents : cfg->n_tools;
        for (size_t i = 0; i < n; i++) {
            char *base = ap->section == TW_SEC_AGENT ? (char *)&cfg->agents[i] : (char *)&cfg->tools[i];
            const int *line_of = ap->section == TW_SEC_AGENT ? cfg->agents[i].line_of : cfg->tools[i].line_of;
            void *dst = base + ap->offset;
            const void *src = (const char *)cfg + wp->offset;
            if (line_of[k])
                continue;
            if (ap->type == TW_PT_INT)
                *(int *)dst = *(const int *)src;
            else if (ap->type == TW_PT_STR || ap->type == TW_PT_LIST) {
                free(*(char **)dst);
                *(char **)dst = strdup(*(char *const *)src);
            }
        }
    }
}

static int load(TwConfig *cfg, ParseState *ps)
{
    int rc;

    ps->cfg = cfg;
    ps->at_line_start = true;
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_LOG; s++)
        apply_defaults(ps, (TwSection)s, cfg);
    /* Long exec lines must not be cut: heap line buffer that grows, to one line of TW_CONFIG_MAX_LINE bytes
     * plus "\r\n" and the NUL; the reader refuses longer lines. No multi-line values, so that every key has
     * exactly one line number. */
    ini_use_stack = false;
    ini_allow_realloc = true;
    ini_max_line = TW_CONFIG_MAX_LINE + 3;
    ini_allow_multiline = false;
    ini_allow_no_value = false;
    rc = ini_parse_stream(reader, ps, on_key, ps);
    if (ps->overlong_line) {
        const char *key = overlong_key(ps);
        char what[sizeof ps->section + sizeof ps->head + 8] = "";
        if (key && ps->section[0])
            snprintf(what, sizeof what, "[%s] %s: ", ps->section, key);
        else if (key)
            snprintf(what, sizeof what, "%s: ", key);
        tw_config_error(cfg, ps->overlong_line,
                        "%sline is longer than %d bytes (the rest of the file was not read)", what,
                        TW_CONFIG_MAX_LINE);
    } else if (rc > 0) {
        tw_config_error(cfg, rc, "syntax error (expected [section], key = value, or a ; comment)");
    } else if (rc < 0 || (ps->fp && ferror(ps->fp))) {
        tw_config_error(cfg, 0, "cannot read the file");
    }
    if (cfg->n_errors == 0) {
        inherit_from_worker(ps);
        tw_config_check_rules(cfg);
    }
    return cfg->n_errors ? -1 : 0;
}

int tw_config_load(TwConfig *cfg, const char *path)
{
    ParseState ps = {.cfg = cfg};
    int rc;

    memset(cfg, 0, sizeof *cfg);
    cfg->path = strdup(path);
    ps.fp = fopen(path, "r");
    if (!ps.fp) {
        tw_config_error(cfg, 0, "cannot open: %s", strerror(errno));
        return -1;
    }
    /* fopen opens a directory and reading it looks like an empty file, which would be valid. */
    struct stat st;
    if (fstat(fileno(ps.fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        tw_config_error(cfg, 0, "is a directory, not a configuration file");
        fclose(ps.fp);
        return -1;
    }
    rc = load(cfg, &ps);
    fclose(ps.fp);
    return rc;
}

int tw_config_load_string(TwConfig *cfg, const char *name, const char *text)
{
    ParseState ps = {.cfg = cfg, .text = text};

    memset(cfg, 0, sizeof *cfg);
    cfg->path = strdup(name);
    return load(cfg, &ps);
}

/* Frees the values of section sec's keys held at base: the table says which are strings and argvs. */
static void free_values(TwSection sec, void *base)
{
    size_t n_params;
    const TwParam *params = tw_config_params(&n_params);

    for (size_t i = 0; i < n_params; i++) {
        const TwParam *p = &params[i];
        void *at = (char *)base + p->offset;
        if (p->section != sec)
            continue;
        if (p->type == TW_PT_STR || p->type == TW_PT_LIST) {
            free(*(char **)at);
        } else if (p->type == TW_PT_ARGV) {
            tw_argv_free(*(char ***)at);
            free(*exec_line(p, base));
        }
    }
}

void tw_config_free(TwConfig *cfg)
{
    if (!cfg)
        return;
    free(cfg->path);
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_LOG; s++)
        free_values((TwSection)s, cfg);
    for (size_t i = 0; i < cfg->n_agents; i++)
        free_values(TW_SEC_AGENT, &cfg->agents[i]);
    for (size_t i = 0; i < cfg->n_tools; i++)
        free_values(TW_SEC_TOOL, &cfg->tools[i]);
    for (size_t i = 0; i < cfg->n_flow_limits; i++)
        free_values(TW_SEC_LIMIT, &cfg->flow_limits[i]);
    for (size_t i = 0; i < cfg->n_schedules; i++)
        free_values(TW_SEC_SCHEDULE, &cfg->schedules[i]);
    free(cfg->schedules);
    free(cfg->agents);
    free(cfg->tools);
    free(cfg->flow_limits);
    free(cfg->errors);
    memset(cfg, 0, sizeof *cfg);
}
