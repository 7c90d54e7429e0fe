/* The console's page files, built into the binary by tools/cli/console/embed.c (tools/meson.build). */
#ifndef TW_CONSOLE_ASSETS_H
#define TW_CONSOLE_ASSETS_H

#include <stddef.h>

typedef struct ConsoleAsset {
    const char *path; /* "/index.html", "/app.js", ... */
    const char *type; /* its Content-Type */
    const unsigned char *data;
    size_t size;
} ConsoleAsset;

extern const ConsoleAsset console_assets[];
extern const size_t console_assets_count;

#endif
