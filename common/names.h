/* Validation of names and identifiers that come from outside. */
#ifndef TW_NAMES_H
#define TW_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#define TW_NAME_MAX 64
/** Default limit for any JSON document accepted from outside (input, replies, tool output). */
#define TW_DOC_MAX (1024 * 1024)
/** An agent's metadata in the roster: a JSON object of at most this many bytes of compact JSON. */
#define TW_METADATA_MAX 65536

/** Agent and tool names: [A-Za-z0-9_-]{1,64}, one NATS subject token. */
bool tw_name_valid(const char *name);
/** Channel, box, tool call and idempotency identifiers: 1..256 printable characters, no control bytes. */
bool tw_ident_valid(const char *s);
/** A canonical textual UUID (8-4-4-4-12 hex digits). */
bool tw_uuid_valid(const char *s);
/** A listen address "host:port" or "[v6addr]:port" (port 1..65535, host letters, digits, '.', '-', ':' in
 *  brackets only): the host without brackets into host (size >= 256), the port into *port. False when it
 *  is not one. */
bool tw_listen_parse(const char *addr, char *host, size_t host_size, int *port);

#endif
