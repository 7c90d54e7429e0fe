/* Splitting text into words: an exec line into an argv (quotes and backslashes, no expansion), a comma list
 * into its items. */
#include "words.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

char **tw_argv_split(const char *line, const char **err)
{
    size_t cap = 8, n = 0, len = strlen(line);
    char **argv = calloc(cap, sizeof *argv);
    char *word = malloc(len + 1);
    size_t wl = 0;
    bool in_word = false;
    char quote = 0;

    *err = NULL;
    if (!argv || !word)
        goto oom;
    for (size_t i = 0; i <= len; i++) {
        char c = line[i];
        if (c == '\0' || (!quote && (c == ' ' || c == '\t'))) {
            if (c == '\0' && quote) {
                *err = "unterminated quote";
                goto fail;
            }
            if (in_word) {
                if (n + 2 > cap) {
                    char **g = realloc(argv, (cap *= 2) * sizeof *argv);
                    if (!g)
                        goto oom;
                    argv = g;
                }
                word[wl] = '\0';
                if (!(argv[n++] = strdup(word)))
                    goto oom;
                argv[n] = NULL;
                wl = 0;
                in_word = false;
            }
            continue;
        }
        in_word = true;
        if (quote) {
            if (c == quote)
                quote = 0;
            else if (c == '\\' && quote == '"' && (line[i + 1] == '"' || line[i + 1] == '\\'))
                word[wl++] = line[++i];
            else
                word[wl++] = c;
        } else if (c == '\'' || c == '"') {
            quote = c;
        } else if (c == '\\' && line[i + 1]) {
            word[wl++] = line[++i];
        } else {
            word[wl++] = c;
        }
    }
    free(word);
    if (n == 0) {
        *err = "is empty";
        tw_argv_free(argv);
        return NULL;
    }
    return argv;
oom:
    *err = "out of memory";
fail:
    free(word);
    tw_argv_free(argv);
    return NULL;
}

void tw_argv_free(char **argv)
{
    if (!argv)
        return;
    for (char **a = argv; *a; a++)
        free(*a);
    free(argv);
}

const char *tw_list_next(const char *p, const char **item, size_t *len)
{
    while (p && *p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *e = end;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (e > p) {
            *item = p;
            *len = (size_t)(e - p);
            return end;
        }
        p = end;
    }
    return NULL;
}
