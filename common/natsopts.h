/* NATS connection options from [nats]: the servers, TLS and credentials (docs/security.md). The secrets
 * it reads (a password, a token, a seed) are handed to nats.c and wiped; none is ever logged or printed. */
#ifndef TW_NATSOPTS_H
#define TW_NATSOPTS_H

#include <nats/nats.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/** nats.c options for cfg's [nats]: the servers of url (a comma-separated list), TLS when url has a tls://
 *  server or tls_ca_file or a client certificate is set, and the credentials of credentials_file,
 *  nkey_seed_file, user + password_file or token_file. On failure *opts is NULL and why holds which key
 *  and what went wrong, e.g. "[nats] token_file: cannot read /etc/x: No such file or directory". */
natsStatus tw_nats_options_create(natsOptions **opts, const TwConfig *cfg, char *why, size_t why_len)
    __attribute__((warn_unused_result));
/** For --check-config and a daemon's start: builds the options once; a file that cannot be read or used
 *  becomes an error of cfg naming the key and its line. Returns 0 or -1. */
int tw_nats_check(TwConfig *cfg) __attribute__((warn_unused_result));
/** The keys a server that refuses the connection should make one check ("[nats] token_file"), for the log
 *  line saying so; "[nats] url" when only the URL carries credentials, "" when nothing authenticates. */
const char *tw_nats_auth_keys(const TwConfig *cfg);
/** True for a status that means the server refused who we are (authentication, authorization). */
bool tw_nats_refused(natsStatus s);

/** Warn (log_warn) for each secret file of [nats] (credentials_file, nkey_seed_file, password_file,
 *  token_file, tls_key_file) that group or others may access, naming the file and its mode, as ssh does for
 *  a private key. For a daemon's start, --check-config and a reload. Returns how many. */
int tw_nats_warn_modes(const TwConfig *cfg);

/* The [nats] files (the secrets and the TLS files) as a start read them: path and a digest of the content,
 * so that a reload can say which changed since. */
#define TW_NATS_FILES 7
typedef struct TwNatsFiles {
    char path[TW_NATS_FILES][512]; /* "" when the key is not set */
    unsigned char sum[TW_NATS_FILES][32];
    bool read[TW_NATS_FILES]; /* the content could be read */
} TwNatsFiles;
/** What cfg's [nats] files hold now. */
void tw_nats_files_stamp(const TwConfig *cfg, TwNatsFiles *f);
/** A reload: each file of cfg at the same path as at start (was) whose content changed is logged (log_warn)
 *  with when it takes effect. Returns how many changed. */
int tw_nats_files_report(const TwNatsFiles *was, const TwConfig *cfg);

#define TW_NKEY_SEED_LEN 58   /* SU... */
#define TW_NKEY_PUBLIC_LEN 56 /* U... */
/** The public key of a user nkey seed (checksum and prefix checked). 0, or -EINVAL. */
int tw_nkey_public(const char *seed, char pub[TW_NKEY_PUBLIC_LEN + 1]) __attribute__((warn_unused_result));
/** A new user nkey seed from the system's random source. 0, or -EIO. */
int tw_nkey_seed_new(char seed[TW_NKEY_SEED_LEN + 1]) __attribute__((warn_unused_result));

#endif
