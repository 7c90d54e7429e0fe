/* Build-time helper: turns the numbered migrations into a C table linked into the binaries, so that
 * `turnwatch migrate` needs no files at run time. Usage: tw-embed-sql OUT.c FILE.sql... */
#define _POSIX_C_SOURCE 200809L
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    FILE *out;

    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT.c FILE.sql...\n", argv[0]);
        return 2;
    }
    if (!(out = fopen(argv[1], "w"))) {
        perror(argv[1]);
        return 1;
    }
    fprintf(
        out,
        "/* Generated from the sql/ migrations by sql/embed.c; do not edit. */\n#include \"migrate.h\"\n\n");
    fprintf(out, "const TwMigration tw_migrations[] = {\n");
    for (int i = 2; i < argc; i++) {
        FILE *in = fopen(argv[i], "r");
        char *copy = strdup(argv[i]);
        const char *base = basename(copy);
        char first[128] = "";
        int c;

        if (!in) {
            perror(argv[i]);
            return 1;
        }
        /* The first line says whether the file is re-applied when its text changes (see migrate.h). */
        if (!fgets(first, sizeof first, in))
            first[0] = '\0';
        rewind(in);
        fprintf(out, "    {%d, \"%s\", %d,\n     \"", atoi(base), base,
                strncmp(first, "-- migrate: repeatable", 22) == 0);
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
    }
    fprintf(out, "};\nconst int tw_migrations_count = %d;\n", argc - 2);
    return fclose(out) == 0 ? 0 : 1;
}
