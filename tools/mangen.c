/* turnwatch-mangen: prints a document generated from a table of the sources, for the build (not installed).
 *   turnwatch-mangen ini        config/turnwatch.ini, from the configuration's parameter table
 *   turnwatch-mangen ini5       turnwatch.ini(5) in scdoc's syntax, from the same table
 *   turnwatch-mangen cli1       turnwatch(1) in scdoc's syntax, from the CLI's command table
 * With -o FILE it writes FILE instead of stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "config_doc.h"

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    char *text = NULL;
    FILE *out = stdout;

    if (strcmp(what, "ini") == 0)
        text = tw_config_doc_ini();
    else if (strcmp(what, "ini5") == 0)
        text = tw_config_doc_man();
    else if (strcmp(what, "cli1") == 0)
        text = cli_doc_man();
    else {
        fprintf(stderr, "usage: turnwatch-mangen ini|ini5|cli1 [-o FILE]\n");
        return 2;
    }
    if (!text) {
        fprintf(stderr, "turnwatch-mangen: out of memory\n");
        return 1;
    }
    if (argc == 4 && strcmp(argv[2], "-o") == 0 && !(out = fopen(argv[3], "w"))) {
        perror(argv[3]);
        free(text);
        return 1;
    }
    fputs(text, out);
    free(text);
    if ((out != stdout ? fclose(out) : fflush(out)) != 0) {
        perror("turnwatch-mangen");
        return 1;
    }
    return 0;
}
