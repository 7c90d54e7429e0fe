/* Build-time helper: turns the SQL files into a C table linked into the binaries, so that `turnwatch migrate`
 * needs no files at run time. Usage:
 *     tw-embed-sql OUT.c [--schema] FILE.sql... [--code FILE.sql...] [--grants FILE.sql...]
 * Files after --schema are numbered schema migrations (sql/schema/NNNN_name.sql, applied once each); files
 * after --code are the functions and rules (sql/fn, sql/rules), applied as one set whenever any of them
 * changes; files after --grants (sql/grants) are applied by every migrate, after the code set and in its
 * transaction. A name is the path from sql/ on. */
#define _POSIX_C_SOURCE 200809L
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "…/sql/fn/apply.sql" -> "fn/apply.sql": the last two components. */
static const char *short_name(const char *path)
{
    const char *end = path + strlen(path), *p = end;
    int slashes = 0;

    while (p > path) {
        if (p[-1] == '/' && ++slashes == 2)
            break;
        p--;
    }
    return p;
}

int main(int argc, char **argv)
{
    FILE *out;
    int code = 0, n = 0;

    if (argc < 2) {
        fprintf(stderr,
                "usage: %s OUT.c [--schema] FILE.sql... [--code FILE.sql...] [--grants FILE.sql...]\n",
                argv[0]);
        return 2;
    }
    if (!(out = fopen(argv[1], "w"))) {
        perror(argv[1]);
        return 1;
    }
    fprintf(out, "/* Generated from sql/ by sql/embed.c; do not edit. */\n#include \"migrate.h\"\n\n");
    fprintf(out, "const TwMigration tw_migrations[] = {\n");
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--schema") == 0 || strcmp(argv[i], "--code") == 0 ||
            strcmp(argv[i], "--grants") == 0) {
            code = strcmp(argv[i], "--code") == 0 ? 1 : strcmp(argv[i], "--grants") == 0 ? 2 : 0;
            continue;
        }
        FILE *in = fopen(argv[i], "r");
        char *copy = strdup(argv[i]);
        int c;

        if (!in || !copy) {
            perror(argv[i]);
            return 1;
        }
        fprintf(out, "    {%d, \"%s\", %d,\n     \"", code ? 0 : atoi(basename(copy)), short_name(argv[i]),
                code);
        while ((c = fgetc(in)) != EOF) {
            if (c == '\n')
                fputs("\\n\"\n     \"", out);
            else if (c == '"' || c == '\\')
                fprintf(out, "\\%c", c);
            else if (c < 0x20 || c > 0x7e)
                fprintf(out, "\\%03o", c);
            else
                fputc(c, out);
        }
        fprintf(out, "\"},\n");
        fclose(in);
        free(copy);
        n++;
    }
    fprintf(out, "};\nconst int tw_migrations_count = %d;\n", n);
    return fclose(out) == 0 ? 0 : 1;
}
