/* Validation of names and identifiers that come from outside. */
#ifndef TW_NAMES_H
#define TW_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "registry.h" /* TW_NAME_MAX, TW_DOC_MAX, TW_METADATA_MAX */

/** Agent and tool names: [A-Za-z0-9_-]{1,64}, one NATS subject token. */
bool tw_name_valid(const char *name);
/** Channel, box, tool call and idempotency identifiers: 1..256 printable characters, no control bytes. */
bool tw_ident_valid(const char *s);
/** Longest NATS subject we publish on (ours are below 100 bytes). */
#define TW_SUBJECT_MAX 256

/** A subject fit to publish on, whoever made it: 1..TW_SUBJECT_MAX bytes of printable ASCII without space,
 *  non-empty tokens separated by single dots, no wildcard ('*', '>'). Anything else could end the PUB line
 *  that nats.c writes it into, and start another. */
bool tw_subject_valid(const char *subject);
/** A doorbell subject as the SQL API makes them (tw.doorbell): cmd.agent.<name>.wakeup or
 *  cmd.tool.<name>.wakeup, name as tw_name_valid. Its kind ("agent" or "tool") into *kind and the name into
 *  name (size > TW_NAME_MAX) when they are wanted (NULL: not). False with a word on what is wrong in *why
 *  (may be NULL) when it is not one. */
bool tw_doorbell_parse(const char *subject, const char **kind, char *name, const char **why);
/** Text from outside made fit for one log line: printable ASCII as it is, except '"' and the backslash,
 *  which get a backslash before them, and every other byte as \r, \n, \t or \xNN; cut to fit buf (size >= 4)
 *  with "..." at the end. Returns buf. */
const char *tw_shown(const char *s, size_t len, char *buf, size_t size);
/** A canonical textual UUID (8-4-4-4-12 hex digits). */
bool tw_uuid_valid(const char *s);
/** A listen address "host:port" or "[v6addr]:port" (port 1..65535, host letters, digits, '.', '-', ':' in
 *  brackets only): the host without brackets into host (size >= 256), the port into *port. False when it
 *  is not one. */
bool tw_listen_parse(const char *addr, char *host, size_t host_size, int *port);

#endif
