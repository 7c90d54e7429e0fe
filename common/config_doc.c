/* The configuration's documentation from the parameter table: config/turnwatch.ini (comments wrapped at
 * INI_WIDTH columns) and turnwatch.ini(5) in scdoc's syntax. Everything a key says comes from its row; the
 * prose around the keys is here. */
#include "config_doc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define INI_WIDTH 110

static const char ini_head[] =
    "turnwatch configuration: one file for turnwatch-pmo, turnwatch-worker and the turnwatch CLI. Every key "
    "is shown at its default, with its meaning; turnwatch.ini(5) says the same with each key's type and "
    "bounds. Durations are whole seconds. Unknown sections or keys, bad values and inconsistent values are "
    "errors naming the file, line and key; check a file with `turnwatch-pmo -c FILE --check-config` (or "
    "turnwatch-worker).\n"
    "Comments start with ';' or '#' at the start of a line, or ' ;' after a value. A line may be at most "
    "65,536 bytes long (not counting its line end); a longer one is an error.\n"
    "SIGHUP makes a daemon read the file again and apply it: agents, tools, timeouts, log level, "
    "metrics_listen (running steps keep the configuration they started with). A file with errors is logged, "
    "every error, and the running configuration kept. Changes to [postgres] and [nats] take a restart.\n"
    "This file is generated from the parameter table in the sources (common/config_table.c).";

/* The [worker] row an [agent.NAME] or [tool.NAME] row without a default of its own inherits, or NULL. */
static const TwParam *inherited_from(const TwParam *p)
{
    size_t np;
    const TwParam *params = tw_config_params(&np);

    if ((p->section != TW_SEC_AGENT && p->section != TW_SEC_TOOL) || p->def)
        return NULL;
    for (size_t i = 0; i < np; i++)
        if (params[i].section == TW_SEC_WORKER && strcmp(params[i].key, p->key) == 0)
            return &params[i];
    return NULL;
}

static const TwParamGroup *group_before(const TwParam *p)
{
    size_t ng;
    const TwParamGroup *groups = tw_config_param_groups(&ng);

    for (size_t i = 0; i < ng; i++)
        if (groups[i].section == p->section && strcmp(groups[i].before_key, p->key) == 0)
            return &groups[i];
    return NULL;
}

/* Text as comment lines "; ..." of at most INI_WIDTH columns; a '\n' in it starts a new line. */
static void ini_comment(FILE *f, const char *text)
{
    const char *p = text;

    while (*p) {
        size_t para = strcspn(p, "\n"), col = 1;
        const char *end = p + para;
        fputc(';', f);
        while (p < end) {
            size_t word = strcspn(p, " \n");
            if (col > 1 && col + 1 + word > INI_WIDTH) {
                fputs("\n;", f);
                col = 1;
            }
            fprintf(f, " %.*s", (int)word, p);
            col += 1 + word;
            p += word;
            while (p < end && *p == ' ')
                p++;
        }
        fputc('\n', f);
        p = *end ? end + 1 : end;
    }
}

/* What the INI says of a key besides its meaning: its bounds or values and when a change applies. */
static void facts_short(const TwParam *p, char *buf, size_t size)
{
    size_t off = 0;

    buf[0] = '\0';
    if (p->type == TW_PT_INT)
        off += (size_t)snprintf(buf, size, "%ld to %ld.", p->min, p->max);
    else if (p->values) {
        off += (size_t)snprintf(buf, size, "One of: ");
        for (const char *v = p->values; *v && off < size;) {
            size_t len = strcspn(v, "|");
            off += (size_t)snprintf(buf + off, size - off, "%.*s%s", (int)len, v, v[len] ? ", " : ".");
            v += len + (v[len] == '|');
        }
    }
    if (p->reload == TW_RESTART && off < size)
        snprintf(buf + off, size - off, "%sA change takes a restart.", off ? " " : "");
}

static void ini_key(FILE *f, const TwParam *p, bool templ)
{
    const TwParamGroup *g = group_before(p);
    const char *value = p->def ? p->def : p->example;
    char facts[512], *text;

    if (g) {
        fputc('\n', f);
        ini_comment(f, g->help);
    }
    /* A key inherited from [worker] is said there; its group's paragraph says so. */
    if (!inherited_from(p)) {
        facts_short(p, facts, sizeof facts);
        fputc('\n', f);
        if (asprintf(&text, "%s%s%s", p->help, *facts ? " " : "", facts) < 0)
            return;
        ini_comment(f, text);
        free(text);
    }
    fprintf(f, "%s%s =%s%s\n", templ ? "; " : "", p->key, *value ? " " : "", value);
}

char *tw_config_doc_ini(void)
{
    size_t np, len;
    const TwParam *params = tw_config_params(&np);
    char *out = NULL;
    FILE *f = open_memstream(&out, &len);

    if (!f)
        return NULL;
    ini_comment(f, ini_head);
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_SCHEDULE; s++) {
        bool templ = s > TW_SEC_LOG;
        const TwSectionDoc *sd = tw_config_section_doc((TwSection)s);
        fputc('\n', f);
        if (templ) {
            ini_comment(f, sd->help);
            fprintf(f, ";\n; [%s]\n", sd->header);
        } else {
            fprintf(f, "[%s]\n", sd->header);
            ini_comment(f, sd->help);
        }
        for (size_t i = 0; i < np; i++)
            if ((int)params[i].section == s)
                ini_key(f, &params[i], templ);
    }
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---- turnwatch.ini(5) */

/* Text for scdoc: its markup characters taken literally. */
static void scd_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '*' || *s == '_' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

/* A meaning as indented scdoc paragraphs ('\n' starts a new one). */
static void scd_paragraphs(FILE *f, const char *text)
{
    const char *p = text;

    while (*p) {
        size_t para = strcspn(p, "\n");
        char *one = strndup(p, para);
        fputc('\t', f);
        scd_text(f, one ? one : "");
        fputs("\n\n", f);
        free(one);
        p += para + (p[para] == '\n');
    }
}

static void scd_type(FILE *f, const TwParam *p)
{
    fputs("\tType: ", f);
    switch (p->type) {
    case TW_PT_INT:
        fprintf(f, "whole number, %ld to %ld", p->min, p->max);
        break;
    case TW_PT_BOOL:
        fputs("boolean (true, yes, on, 1 or false, no, off, 0)", f);
        break;
    case TW_PT_ARGV:
        fputs("a program: an absolute path and its arguments", f);
        break;
    case TW_PT_LIST:
        scd_text(f, "* or a comma list of names ([A-Za-z0-9_-]{1,64})");
        break;
    case TW_PT_STR:
        if (p->values) {
            fputs("one of ", f);
            for (const char *v = p->values; *v;) {
                size_t len = strcspn(v, "|");
                fprintf(f, "*%.*s*%s", (int)len, v, v[len] ? ", " : "");
                v += len + (v[len] == '|');
            }
        } else {
            fputs(p->def && !*p->def ? "string, empty: unset" : "string, not empty", f);
        }
        break;
    }
    fputs(". Default: ", f);
    const TwParam *from = inherited_from(p);
    if (from)
        fprintf(f, "[worker] *%s*", from->key);
    else if (!p->def)
        fputs("none", f);
    else if (!*p->def)
        fputs("empty", f);
    else {
        fputc('*', f);
        scd_text(f, p->def);
        fputc('*', f);
    }
    fputs(p->reload == TW_RESTART ? ". Takes effect at the next start; a reload (SIGHUP) only logs that it "
                                    "changed.\n\n"
                                  : ". A reload (SIGHUP) applies it.\n\n",
          f);
}

static void scd_key(FILE *f, const TwParam *p)
{
    const TwParam *from = inherited_from(p);

    /* The entry line: `*key* = default`, which the configuration's test reads back from the page. */
    fprintf(f, "*%s* =", p->key);
    if (p->def && *p->def) {
        fputc(' ', f);
        scd_text(f, p->def);
    }
    fputc('\n', f);
    if (from) {
        fprintf(f, "\tAs [worker] *%s*, for this section alone: ", from->key);
        scd_text(f, from->help);
        fputs("\n\n", f);
    } else {
        scd_paragraphs(f, p->help);
    }
    scd_type(f, p);
}

static const char man_head[] =
    "TURNWATCH.INI(5)\n"
    "\n"
    "# NAME\n"
    "\n"
    "turnwatch.ini - the configuration of turnwatch-pmo, turnwatch-worker and turnwatch\n"
    "\n"
    "# SYNOPSIS\n"
    "\n"
    "/etc/turnwatch/turnwatch.ini\n"
    "\n"
    "# DESCRIPTION\n"
    "\n"
    "One INI file configures both daemons and the command line tool; each reads it with *-c* _FILE_ "
    "(default /etc/turnwatch/turnwatch.ini). It holds the sections [postgres], [nats], [pmo], [worker] and "
    "[log], each at most once, and any number of [agent.NAME] and [tool.NAME] sections. Names are 1 to 64 "
    "characters of A-Z, a-z, 0-9, \\_ and -.\n"
    "\n"
    "A line is *key = value*, a *[section]* header, or a comment: ';' or '#' at the start of a line, or ' "
    ";' after a value. A line may be at most 65,536 bytes long. Whole numbers are decimal; durations are "
    "whole seconds.\n"
    "\n"
    "Unknown sections and keys, values of the wrong type or out of bounds, and values that contradict "
    "each other are errors: each names the file, the line and the key, and a daemon does not start. "
    "*turnwatch-pmo -c* _FILE_ *--check-config* (or *turnwatch-worker*) checks a file.\n"
    "\n"
    "A daemon reads the file again at SIGHUP. A file with errors is logged, every error, and the running "
    "configuration kept; otherwise the keys marked as applied by a reload take effect (a running step "
    "keeps the configuration it started with) and a change of a key that takes effect at the next start "
    "is logged as such.\n"
    "\n"
    "Each key below is shown with its default.\n"
    "\n";

static const char man_tail[] = "# FILES\n"
                               "\n"
                               "_/etc/turnwatch/turnwatch.ini_\n"
                               "\tThe default configuration file, installed with every key at its default.\n"
                               "\n"
                               "# SEE ALSO\n"
                               "\n"
                               "*turnwatch*(1), *turnwatch-pmo*(8), *turnwatch-worker*(8)\n";

char *tw_config_doc_man(void)
{
    size_t np, len;
    const TwParam *params = tw_config_params(&np);
    char *out = NULL;
    FILE *f = open_memstream(&out, &len);

    if (!f)
        return NULL;
    fputs(man_head, f);
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_SCHEDULE; s++) {
        const TwSectionDoc *sd = tw_config_section_doc((TwSection)s);
        fprintf(f, "# [%s]\n\n", sd->header);
        scd_text(f, sd->help);
        fputs("\n\n", f);
        for (size_t i = 0; i < np; i++) {
            const TwParamGroup *g;
            if ((int)params[i].section != s)
                continue;
            if ((g = group_before(&params[i]))) {
                scd_text(f, g->help);
                fputs("\n\n", f);
            }
            scd_key(f, &params[i]);
        }
    }
    fputs(man_tail, f);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}
