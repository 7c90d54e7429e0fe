/* Build-time helper: turns the console's page files (HTML, CSS, JavaScript, SVG) into a C table linked into
 * the CLI, so that `turnwatch console` serves them with nothing read or loaded at run time. Each file is
 * served as /<its name> with the content type of its extension. Usage: tw-embed-assets OUT.c FILE... */
#define _POSIX_C_SOURCE 200809L
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *content_type(const char *name)
{
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
    };
    size_t n = strlen(name);

    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        size_t k = strlen(types[i][0]);
        if (n > k && strcmp(name + n - k, types[i][0]) == 0)
            return types[i][1];
    }
    return NULL;
}

int main(int argc, char **argv)
{
    FILE *out;

    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT.c FILE...\n", argv[0]);
        return 2;
    }
    if (!(out = fopen(argv[1], "w"))) {
        perror(argv[1]);
        return 1;
    }
    fprintf(out, "/* Generated from tools/cli/console/ by tools/cli/console/embed.c; do not edit. */\n"
                 "#include \"console_assets.h\"\n\nconst ConsoleAsset console_assets[] = {\n");
    for (int i = 2; i < argc; i++) {
        FILE *in = fopen(argv[i], "rb");
        char *copy = strdup(argv[i]);
        const char *base = copy ? basename(copy) : NULL;
        const char *type = base ? content_type(base) : NULL;
        size_t size = 0;
        int c;

        if (!in || !type) {
            fprintf(stderr, "%s: %s\n", argv[i], in ? "unknown file type" : "cannot read");
            return 1;
        }
        fprintf(out, "    {\"/%s\", \"%s\",\n     (const unsigned char *)\"", base, type);
        while ((c = fgetc(in)) != EOF) {
            /* Octal escapes of three digits, so that a digit after one is never read as part of it. */
            if (c == '\n')
                fputs("\\n\"\n     \"", out);
            else if (c == '"' || c == '\\')
                fprintf(out, "\\%c", c);
            else if (c < 0x20 || c > 0x7e || c == '?')
                fprintf(out, "\\%03o", c);
            else
                fputc(c, out);
            size++;
        }
        fprintf(out, "\",\n     %zu},\n", size);
        fclose(in);
        free(copy);
    }
    fprintf(out, "};\nconst size_t console_assets_count = %d;\n", argc - 2);
    return fclose(out) == 0 ? 0 : 1;
}
