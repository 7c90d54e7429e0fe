/* Build-time generator: writes what other languages read of common/registry.h. Usage:
 *     tw-gen-registry --header OUT.h | --sql OUT.sql | --python OUT.py | --typescript OUT.js | --markdown
 * OUT.md
 * --header: TW_RETRY_ON_DEFAULT (the codes retried by default, as the config table's default string);
 * --sql: tw.error_code_* and tw.limit_* functions and tw.policy_default(), applied with sql/fn;
 * --python: python/turnwatch/_registry.py (committed, so that `pip install ./python` needs no build; a unit
 * test fails when it differs from this output); --typescript: typescript/src/registry.js, the same for the
 * TypeScript library (committed and checked alike); --markdown: the table of docs/errors.md (checked the same
 * way). */
#include <stdio.h>
#include <string.h>

#include "registry.h"

typedef struct {
    const char *code, *scope, *status;
    int retry, own;
    const char *timeout_kind, *set_by, *meaning;
} Code;

#define ROW(c, sc, st, r, o, k, b, m) {c, sc, st, r, o, k, b, m},
static const Code codes[] = {TW_ERROR_CODES(ROW)};
#define NCODES (sizeof codes / sizeof codes[0])

static void retry_list(FILE *f, const char *sep, const char *quote)
{
    int first = 1;

    for (size_t i = 0; i < NCODES; i++)
        if (codes[i].retry) {
            fprintf(f, "%s%s%s%s", first ? "" : sep, quote, codes[i].code, quote);
            first = 0;
        }
}

static void gen_header(FILE *f)
{
    fputs("/* Generated from common/registry.h by tw-gen-registry: do not edit. */\n"
          "#ifndef TW_REGISTRY_GEN_H\n#define TW_REGISTRY_GEN_H\n#define TW_RETRY_ON_DEFAULT \"",
          f);
    retry_list(f, ",", "");
    fputs("\"\n#endif\n", f);
}

/* A registry string as a literal between quote marks q: a q inside is doubled (SQL, q = '\'') or escaped with
 * a backslash (Python and JavaScript, q = '"'; a backslash too). They hold none today, but say so if one ever
 * does. */
static void quoted(FILE *f, const char *s, char q)
{
    fputc(q, f);
    for (; *s; s++) {
        if (*s == q || (q == '"' && *s == '\\'))
            fputc(q == '"' ? '\\' : q, f);
        fputc(*s, f);
    }
    fputc(q, f);
}

static void sql_lit(FILE *f, const char *s)
{
    quoted(f, s, '\'');
}

static void gen_sql(FILE *f)
{
    fputs(
        "-- Generated from common/registry.h by tw-gen-registry at build time: do not edit.\n\n"
        "-- turnwatch's own error codes: (code, scope, status, retried by default, own, timeout kind, "
        "meaning).\n"
        "CREATE OR REPLACE FUNCTION tw.error_codes()\n"
        "RETURNS TABLE (code text, scope text, status text, retry boolean, own boolean, timeout_kind text,\n"
        "               meaning text)\nLANGUAGE sql IMMUTABLE AS $$\n    VALUES\n",
        f);
    for (size_t i = 0; i < NCODES; i++) {
        fputs("        (", f);
        sql_lit(f, codes[i].code);
        fputs(", ", f);
        sql_lit(f, codes[i].scope);
        fputs(", ", f);
        sql_lit(f, codes[i].status);
        fprintf(f, ", %s, %s, ", codes[i].retry ? "true" : "false", codes[i].own ? "true" : "false");
        if (*codes[i].timeout_kind)
            sql_lit(f, codes[i].timeout_kind);
        else
            fputs("NULL", f);
        fputs(", ", f);
        sql_lit(f, codes[i].meaning);
        fprintf(f, ")%s\n", i + 1 < NCODES ? "," : "");
    }
    fputs("$$;\n\n"
          "-- The kind of the `timeout` object of a turn that a clock ended with p_code; NULL for any other "
          "code.\n"
          "CREATE OR REPLACE FUNCTION tw.error_timeout_kind(p_code text)\n"
          "RETURNS text LANGUAGE sql IMMUTABLE AS $$\n    SELECT CASE p_code",
          f);
    for (size_t i = 0; i < NCODES; i++)
        if (*codes[i].timeout_kind) {
            fputs(" WHEN ", f);
            sql_lit(f, codes[i].code);
            fputs(" THEN ", f);
            sql_lit(f, codes[i].timeout_kind);
        }
    fputs(" END\n$$;\n\n", f);
    fprintf(
        f,
        "-- Limits.\n"
        "CREATE OR REPLACE FUNCTION tw.limit_name_max() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT "
        "%d $$;\n"
        "CREATE OR REPLACE FUNCTION tw.limit_doc_max() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT "
        "%d $$;\n"
        "CREATE OR REPLACE FUNCTION tw.doc_max_text() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT %d "
        "$$;\n"
        "CREATE OR REPLACE FUNCTION tw.limit_metadata_max() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ "
        "SELECT %d "
        "$$;\n"
        "CREATE OR REPLACE FUNCTION tw.limit_timeout_max() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ "
        "SELECT %d "
        "$$;\n"
        "CREATE OR REPLACE FUNCTION tw.limit_turn_timeout_max() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ "
        "SELECT %d $$;\n\n",
        TW_NAME_MAX, TW_DOC_MAX, TW_DOC_TEXT_MAX, TW_METADATA_MAX, TW_TIMEOUT_MAX_SEC,
        TW_TURN_TIMEOUT_MAX_SEC);
    fputs("-- The shipped timeout policy, for a profile no daemon has published one for.\n"
          "CREATE OR REPLACE FUNCTION tw.policy_default(p_profile text)\n"
          "RETURNS state.policies LANGUAGE plpgsql IMMUTABLE AS $$\nDECLARE\n    p state.policies;\nBEGIN\n"
          "    p.profile := p_profile;\n",
          f);
    fprintf(f, "    p.max_attempts := %d;\n    p.retry_on := ARRAY[", TW_POLICY_MAX_ATTEMPTS);
    retry_list(f, ", ", "'");
    fprintf(f,
            "];\n    p.retry_backoff_seconds := %d;\n    p.retry_backoff_max_seconds := %d;\n"
            "    p.queue_timeout_seconds := %d;\n    p.warn_at_percent := %d;\n    p.tool_timeout_seconds := "
            "%d;\n"
            "    RETURN p;\nEND $$;\n",
            TW_POLICY_RETRY_BACKOFF_SEC, TW_POLICY_RETRY_BACKOFF_MAX_SEC, TW_POLICY_QUEUE_TIMEOUT_SEC,
            TW_POLICY_WARN_AT_PERCENT, TW_POLICY_TOOL_TIMEOUT_SEC);
    fputs("\n-- The fields of a cron expression (sql/fn/cron.sql), in their order: name, range, the names of "
          "the\n"
          "-- values min, min + 1, ... (space-separated, '' when none).\n",
          f);
    fputs("CREATE OR REPLACE FUNCTION tw.cron_field_arrays(OUT names text[], OUT lo integer[], OUT hi "
          "integer[],\n    OUT value_names text[])\nLANGUAGE sql IMMUTABLE AS $$\n    SELECT ARRAY[",
          f);
#define CRON_NAME(n, name, lo, hi, names)                                                                    \
    sql_lit(f, name);                                                                                        \
    fputs(n < 5 ? ", " : "]::text[], ARRAY[", f);
    TW_CRON_FIELDS(CRON_NAME)
#undef CRON_NAME
#define CRON_LO(n, name, lo, hi, names) fprintf(f, "%d%s", lo, n < 5 ? ", " : "], ARRAY[");
    TW_CRON_FIELDS(CRON_LO)
#undef CRON_LO
#define CRON_HI(n, name, lo, hi, names) fprintf(f, "%d%s", hi, n < 5 ? ", " : "], ARRAY[");
    TW_CRON_FIELDS(CRON_HI)
#undef CRON_HI
#define CRON_NAMES(n, name, lo, hi, names)                                                                   \
    sql_lit(f, names);                                                                                       \
    fputs(n < 5 ? ", " : "]::text[]\n", f);
    TW_CRON_FIELDS(CRON_NAMES)
#undef CRON_NAMES
    fprintf(f,
            "$$;\nCREATE OR REPLACE FUNCTION tw.cron_expr_max() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ "
            "SELECT %d $$;\n",
            TW_CRON_EXPR_MAX);
}

static void py_str(FILE *f, const char *s)
{
    quoted(f, s, '"');
}

static void gen_python(FILE *f)
{
    fputs(
        "\"\"\"turnwatch's own error codes and limits.\n\nGenerated from common/registry.h by "
        "tw-gen-registry: "
        "do not edit (a unit test\nfails when this file differs from what the generator writes).\n\"\"\"\n\n"
        "#: code -> (scope, status, retried by default, only turnwatch gives it, meaning)\n"
        "ERROR_CODES = {\n",
        f);
    for (size_t i = 0; i < NCODES; i++) {
        fputs("    ", f);
        py_str(f, codes[i].code);
        fputs(": (", f);
        py_str(f, codes[i].scope);
        fputs(", ", f);
        py_str(f, codes[i].status);
        fprintf(f, ", %s, %s,\n        ", codes[i].retry ? "True" : "False", codes[i].own ? "True" : "False");
        py_str(f, codes[i].meaning);
        fputs("),\n", f);
    }
    fprintf(
        f,
        "}\n\n#: names: [A-Za-z0-9_-]{1,NAME_MAX}\nNAME_MAX = %d\n#: a JSON document from outside, bytes of "
        "compact JSON\nDOC_MAX = %d\n#: the longest clock a tool call may set, seconds\nTIMEOUT_MAX = %d\n"
        "#: the longest deadline a turn may be given, seconds\nTURN_TIMEOUT_MAX = %d\n",
        TW_NAME_MAX, TW_DOC_MAX, TW_TIMEOUT_MAX_SEC, TW_TURN_TIMEOUT_MAX_SEC);
}

static void gen_typescript(FILE *f)
{
    fputs("// turnwatch's own error codes and limits.\n//\n// Generated from common/registry.h by "
          "tw-gen-registry: "
          "do not edit (a unit test\n// fails when this file differs from what the generator writes).\n\n"
          "/** code -> [scope, status, retried by default, only turnwatch gives it, meaning] */\n"
          "export const ERROR_CODES = Object.freeze({\n",
          f);
    for (size_t i = 0; i < NCODES; i++) {
        fputs("  ", f);
        py_str(f, codes[i].code);
        fputs(": Object.freeze([", f);
        py_str(f, codes[i].scope);
        fputs(", ", f);
        py_str(f, codes[i].status);
        fprintf(f, ", %s, %s,\n    ", codes[i].retry ? "true" : "false", codes[i].own ? "true" : "false");
        py_str(f, codes[i].meaning);
        fputs("]),\n", f);
    }
    fprintf(f,
            "});\n\n/** names: [A-Za-z0-9_-]{1,NAME_MAX} */\nexport const NAME_MAX = %d;\n/** a JSON "
            "document from "
            "outside, bytes of compact JSON */\nexport const DOC_MAX = %d;\n/** the longest clock a tool "
            "call may "
            "set, seconds */\nexport const TIMEOUT_MAX = %d;\n/** the longest deadline a turn may be given, "
            "seconds "
            "*/\nexport const TURN_TIMEOUT_MAX = %d;\n",
            TW_NAME_MAX, TW_DOC_MAX, TW_TIMEOUT_MAX_SEC, TW_TURN_TIMEOUT_MAX_SEC);
}

/* The tables of docs/errors.md: a turn's codes, then a call's (--markdown). */
static void gen_markdown(FILE *f)
{
    fputs("A turn's error:\n\n| code | reserved | meaning | set by | retried by default | final status |\n"
          "|---|---|---|---|---|---|\n",
          f);
    for (size_t i = 0; i < NCODES; i++)
        if (strcmp(codes[i].scope, TW_ERR_TURN) == 0)
            fprintf(f, "| `%s` | %s | %s | %s | %s | %s%s%s |\n", codes[i].code, codes[i].own ? "yes" : "no",
                    codes[i].meaning, codes[i].set_by, codes[i].retry ? "**yes**" : "no",
                    *codes[i].status ? "`" : "", *codes[i].status ? codes[i].status : "—",
                    *codes[i].status ? "`" : "");
    fputs("\nA tool call's error:\n\n| code | status | meaning | set by |\n|---|---|---|---|\n", f);
    for (size_t i = 0; i < NCODES; i++)
        if (strcmp(codes[i].scope, TW_ERR_CALL) == 0)
            fprintf(f, "| `%s` | `%s` | %s | %s |\n", codes[i].code, codes[i].status, codes[i].meaning,
                    codes[i].set_by);
}

int main(int argc, char **argv)
{
    FILE *f;

    if (argc != 3) {
        fprintf(stderr, "usage: %s --header|--sql|--python|--typescript|--markdown OUT\n", argv[0]);
        return 2;
    }
    if (!(f = strcmp(argv[2], "-") == 0 ? stdout : fopen(argv[2], "w"))) {
        perror(argv[2]);
        return 1;
    }
    if (strcmp(argv[1], "--header") == 0)
        gen_header(f);
    else if (strcmp(argv[1], "--sql") == 0)
        gen_sql(f);
    else if (strcmp(argv[1], "--python") == 0)
        gen_python(f);
    else if (strcmp(argv[1], "--typescript") == 0)
        gen_typescript(f);
    else if (strcmp(argv[1], "--markdown") == 0)
        gen_markdown(f);
    else {
        fprintf(stderr, "%s: unknown output %s\n", argv[0], argv[1]);
        return 2;
    }
    if (f != stdout && fclose(f) != 0) {
        perror(argv[2]);
        return 1;
    }
    return 0;
}
