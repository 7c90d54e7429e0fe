/* NATS connection options: servers, TLS and credentials from [nats], and the nkey encoding they need. */
#include "natsopts.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* A secret file is a line or a small block; anything longer is not one of ours. */
#define SECRET_MAX 8192
#define MAX_SERVERS 32

/* nkeys (github.com/nats-io/nkeys): base32 (RFC 4648, no padding) of prefix byte(s), the 32-byte key and a
 * CRC-16/XMODEM, little-endian. A seed has two prefix bytes: 'S' and the key type ('U' for a user). */
#define NKEY_PREFIX_SEED (18 << 3)
#define NKEY_PREFIX_USER (20 << 3)
#define NKEY_RAW 32

static const char b32_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

static uint16_t crc16(const unsigned char *p, size_t n)
{
    uint16_t crc = 0;

    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

static void b32_encode(const unsigned char *in, size_t n, char *out)
{
    unsigned buf = 0;
    int bits = 0;
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        buf = (buf << 8) | in[i];
        bits += 8;
        while (bits >= 5) {
            out[k++] = b32_alphabet[(buf >> (bits - 5)) & 31];
            bits -= 5;
        }
    }
    if (bits > 0)
        out[k++] = b32_alphabet[(buf << (5 - bits)) & 31];
    out[k] = '\0';
}

/* Decodes exactly max bytes' worth of base32 text; false on a character outside the alphabet or a length
 * that is not that of max bytes. */
static bool b32_decode(const char *in, size_t len, unsigned char *out, size_t max)
{
    unsigned buf = 0;
    int bits = 0;
    size_t k = 0;

    if (len != (max * 8 + 4) / 5)
        return false;
    for (size_t i = 0; i < len; i++) {
        const char *at = strchr(b32_alphabet, in[i]);
        if (!at || !in[i])
            return false;
        buf = (buf << 5) | (unsigned)(at - b32_alphabet);
        bits += 5;
        if (bits >= 8) {
            if (k < max)
                out[k++] = (unsigned char)(buf >> (bits - 8));
            bits -= 8;
        }
    }
    return k == max;
}

/* The raw key of a user seed, checksum and prefixes checked. */
static bool seed_decode(const char *seed, size_t len, unsigned char raw[NKEY_RAW])
{
    unsigned char dec[2 + NKEY_RAW + 2];
    bool ok = b32_decode(seed, len, dec, sizeof dec);
    uint16_t crc = ok ? (uint16_t)(dec[sizeof dec - 2] | dec[sizeof dec - 1] << 8) : 0;

    ok = ok && crc == crc16(dec, sizeof dec - 2) && (dec[0] & 0xf8) == NKEY_PREFIX_SEED &&
         (((dec[0] & 7) << 5) | ((dec[1] & 0xf8) >> 3)) == NKEY_PREFIX_USER;
    if (ok)
        memcpy(raw, dec + 2, NKEY_RAW);
    explicit_bzero(dec, sizeof dec);
    return ok;
}

static int public_of_raw(const unsigned char raw[NKEY_RAW], char pub[TW_NKEY_PUBLIC_LEN + 1])
{
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw, NKEY_RAW);
    unsigned char enc[1 + NKEY_RAW + 2];
    size_t len = NKEY_RAW;
    int rc = -EINVAL;

    if (key && EVP_PKEY_get_raw_public_key(key, enc + 1, &len) == 1 && len == NKEY_RAW) {
        enc[0] = NKEY_PREFIX_USER;
        uint16_t crc = crc16(enc, 1 + NKEY_RAW);
        enc[1 + NKEY_RAW] = (unsigned char)(crc & 0xff);
        enc[2 + NKEY_RAW] = (unsigned char)(crc >> 8);
        b32_encode(enc, sizeof enc, pub);
        rc = 0;
    }
    EVP_PKEY_free(key);
    return rc;
}

int tw_nkey_public(const char *seed, char pub[TW_NKEY_PUBLIC_LEN + 1])
{
    unsigned char raw[NKEY_RAW];
    int rc = -EINVAL;

    if (seed_decode(seed, strlen(seed), raw))
        rc = public_of_raw(raw, pub);
    explicit_bzero(raw, sizeof raw);
    return rc;
}

int tw_nkey_seed_new(char seed[TW_NKEY_SEED_LEN + 1])
{
    unsigned char dec[2 + NKEY_RAW + 2];

    if (RAND_bytes(dec + 2, NKEY_RAW) != 1)
        return -EIO;
    dec[0] = (unsigned char)(NKEY_PREFIX_SEED | NKEY_PREFIX_USER >> 5);
    dec[1] = (unsigned char)((NKEY_PREFIX_USER & 31) << 3);
    uint16_t crc = crc16(dec, 2 + NKEY_RAW);
    dec[2 + NKEY_RAW] = (unsigned char)(crc & 0xff);
    dec[3 + NKEY_RAW] = (unsigned char)(crc >> 8);
    b32_encode(dec, sizeof dec, seed);
    explicit_bzero(dec, sizeof dec);
    return 0;
}

/* ---- reading the files */

typedef struct Why {
    char *buf;
    size_t len;
    const char *key; /* the [nats] key at fault */
} Why;

static void why_set(Why *w, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void why_set(Why *w, const char *key, const char *fmt, ...)
{
    va_list ap;
    int n;

    w->key = key;
    n = snprintf(w->buf, w->len, "[nats] %s: ", key);
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < w->len)
        vsnprintf(w->buf + n, w->len - (size_t)n, fmt, ap);
    va_end(ap);
}

/* The whole of a small file into buf (NUL-terminated); false with why set. Nothing of its content is ever
 * put into why. */
static bool read_small(const char *key, const char *path, char *buf, size_t size, size_t *len, Why *w)
{
    struct stat st;
    ssize_t n;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0) {
        why_set(w, key, "cannot read %s: %s", path, strerror(errno));
        return false;
    }
    if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        why_set(w, key, "%s is not a regular file", path);
        close(fd);
        return false;
    }
    while ((n = read(fd, buf + got, size - 1 - got)) > 0)
        got += (size_t)n;
    if (n < 0) {
        why_set(w, key, "cannot read %s: %s", path, strerror(errno));
        close(fd);
        explicit_bzero(buf, got);
        return false;
    }
    close(fd);
    if (got == size - 1) {
        why_set(w, key, "%s is longer than %d bytes: not a file of this kind", path, SECRET_MAX - 1);
        explicit_bzero(buf, got);
        return false;
    }
    buf[got] = '\0';
    *len = got;
    return true;
}

/* The first line of a secret file (password, token), without its line end and trailing blanks. */
static bool read_secret_line(const char *key, const char *path, char *buf, size_t size, Why *w)
{
    size_t len;

    if (!read_small(key, path, buf, size, &len, w))
        return false;
    buf[strcspn(buf, "\r\n")] = '\0';
    for (len = strlen(buf); len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t');)
        buf[--len] = '\0';
    if (len == 0) {
        why_set(w, key, "%s is empty (its first line is the secret)", path);
        return false;
    }
    return true;
}

/* The public key of the user seed in the file: a line of its own (SU...), alone or in a block as `nsc`
 * writes it. */
static bool seed_file_public(const char *key, const char *path, char pub[TW_NKEY_PUBLIC_LEN + 1], Why *w)
{
    char *buf = malloc(SECRET_MAX);
    size_t len;
    bool found = false;

    if (!buf) {
        why_set(w, key, "out of memory");
        return false;
    }
    if (!read_small(key, path, buf, SECRET_MAX, &len, w)) {
        free(buf);
        return false;
    }
    for (char *line = buf; line && *line && !found;) {
        char *next = line + strcspn(line, "\r\n");
        size_t n = (size_t)(next - line);
        while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t'))
            n--;
        while (n > 0 && (*line == ' ' || *line == '\t'))
            line++, n--;
        if (n == TW_NKEY_SEED_LEN && strncmp(line, "SU", 2) == 0) {
            unsigned char raw[NKEY_RAW];
            if (seed_decode(line, n, raw)) {
                found = public_of_raw(raw, pub) == 0;
            }
            explicit_bzero(raw, sizeof raw);
        }
        line = *next ? next + 1 : NULL;
    }
    explicit_bzero(buf, len);
    free(buf);
    if (!found)
        why_set(w, key, "%s holds no valid user nkey seed (a line SU... of %d characters)", path,
                TW_NKEY_SEED_LEN);
    return found;
}

/* A .creds file: a user JWT block and a user nkey seed block. nats.c reads it again at every connect. */
static bool creds_file_ok(const char *key, const char *path, Why *w)
{
    char *buf = malloc(SECRET_MAX);
    size_t len;
    bool ok;

    if (!buf) {
        why_set(w, key, "out of memory");
        return false;
    }
    if (!read_small(key, path, buf, SECRET_MAX, &len, w)) {
        free(buf);
        return false;
    }
    ok = strstr(buf, "BEGIN NATS USER JWT") && strstr(buf, "BEGIN USER NKEY SEED");
    explicit_bzero(buf, len);
    free(buf);
    if (!ok)
        why_set(w, key, "%s is not a .creds file (a NATS USER JWT block and a USER NKEY SEED block)", path);
    return ok;
}

/* A PEM file nats.c is to load: that it can be read at all, for a plain message (nats.c's is OpenSSL's). */
static bool pem_readable(const char *key, const char *path, Why *w)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0) {
        why_set(w, key, "cannot read %s: %s", path, strerror(errno));
        return false;
    }
    close(fd);
    return true;
}

static void nats_failure(Why *w, const char *key, const char *path, natsStatus s)
{
    const char *last = nats_GetLastError(NULL);

    why_set(w, key, "cannot use %s: %s%s%s", path, natsStatus_GetText(s), last && *last ? ": " : "",
            last && *last ? last : "");
}

static bool any_tls_url(const char *urls)
{
    for (const char *p = urls; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncasecmp(p, "tls://", 6) == 0)
            return true;
    return false;
}

static natsStatus build(natsOptions *opts, const TwConfig *cfg, Why *w)
{
    natsStatus s = NATS_OK;
    bool tls = any_tls_url(cfg->nats_url) || *cfg->nats_tls_ca_file || *cfg->nats_tls_cert_file;

    if (tls && (s = natsOptions_SetSecure(opts, true)) != NATS_OK) {
        /* A nats.c built without TLS says so here. */
        nats_failure(w, *cfg->nats_tls_ca_file ? "tls_ca_file" : "url", "TLS", s);
        return s;
    }
    if (*cfg->nats_tls_ca_file) {
        if (!pem_readable("tls_ca_file", cfg->nats_tls_ca_file, w))
            return NATS_ERR;
        if ((s = natsOptions_LoadCATrustedCertificates(opts, cfg->nats_tls_ca_file)) != NATS_OK) {
            nats_failure(w, "tls_ca_file", cfg->nats_tls_ca_file, s);
            return s;
        }
    }
    if (*cfg->nats_tls_cert_file) {
        if (!pem_readable("tls_cert_file", cfg->nats_tls_cert_file, w) ||
            !pem_readable("tls_key_file", cfg->nats_tls_key_file, w))
            return NATS_ERR;
        s = natsOptions_LoadCertificatesChain(opts, cfg->nats_tls_cert_file, cfg->nats_tls_key_file);
        if (s != NATS_OK) {
            nats_failure(w, "tls_cert_file", cfg->nats_tls_cert_file, s);
            return s;
        }
    }
    if (*cfg->nats_credentials_file) {
        if (!creds_file_ok("credentials_file", cfg->nats_credentials_file, w))
            return NATS_ERR;
        s = natsOptions_SetUserCredentialsFromFiles(opts, cfg->nats_credentials_file, NULL);
        if (s != NATS_OK)
            nats_failure(w, "credentials_file", cfg->nats_credentials_file, s);
    } else if (*cfg->nats_nkey_seed_file) {
        char pub[TW_NKEY_PUBLIC_LEN + 1];
        if (!seed_file_public("nkey_seed_file", cfg->nats_nkey_seed_file, pub, w))
            return NATS_ERR;
        s = natsOptions_SetNKeyFromSeed(opts, pub, cfg->nats_nkey_seed_file);
        if (s != NATS_OK)
            nats_failure(w, "nkey_seed_file", cfg->nats_nkey_seed_file, s);
    } else if (*cfg->nats_user || *cfg->nats_token_file) {
        const char *key = *cfg->nats_user ? "password_file" : "token_file";
        const char *path = *cfg->nats_user ? cfg->nats_password_file : cfg->nats_token_file;
        char *secret = malloc(SECRET_MAX);
        if (!secret) {
            why_set(w, key, "out of memory");
            return NATS_NO_MEMORY;
        }
        if (!read_secret_line(key, path, secret, SECRET_MAX, w))
            s = NATS_ERR;
        else if (*cfg->nats_user)
            s = natsOptions_SetUserInfo(opts, cfg->nats_user, secret);
        else
            s = natsOptions_SetToken(opts, secret);
        if (s != NATS_OK && !w->key)
            nats_failure(w, key, path, s);
        explicit_bzero(secret, SECRET_MAX);
        free(secret);
    }
    return s;
}

natsStatus tw_nats_options_create(natsOptions **opts, const TwConfig *cfg, char *why, size_t why_len)
{
    char *copy = strdup(cfg->nats_url), *save = NULL;
    const char *servers[MAX_SERVERS];
    int n = 0;
    natsStatus s;
    Why w = {why, why_len, NULL};

    *opts = NULL;
    if (why_len)
        why[0] = '\0';
    if (!copy) {
        why_set(&w, "url", "out of memory");
        return NATS_NO_MEMORY;
    }
    for (char *tok = strtok_r(copy, ",", &save); tok && n < MAX_SERVERS; tok = strtok_r(NULL, ",", &save))
        servers[n++] = tok;
    s = natsOptions_Create(opts);
    if (s == NATS_OK)
        s = natsOptions_SetServers(*opts, servers, n);
    free(copy);
    if (s != NATS_OK && !w.key)
        why_set(&w, "url", "%s", natsStatus_GetText(s));
    if (s == NATS_OK)
        s = build(*opts, cfg, &w);
    if (s != NATS_OK) {
        natsOptions_Destroy(*opts);
        *opts = NULL;
    }
    return s;
}

int tw_nats_check(TwConfig *cfg)
{
    natsOptions *opts = NULL;
    char why[1024];
    Why w = {why, sizeof why, NULL};
    natsStatus s = natsOptions_Create(&opts);

    why[0] = '\0';
    if (s == NATS_OK)
        s = build(opts, cfg, &w);
    natsOptions_Destroy(opts);
    if (s == NATS_OK)
        return 0;
    tw_config_error(cfg, w.key ? tw_config_line(cfg, TW_SEC_NATS, w.key) : 0, "%s",
                    *why ? why : natsStatus_GetText(s));
    return -1;
}

const char *tw_nats_auth_keys(const TwConfig *cfg)
{
    if (*cfg->nats_credentials_file)
        return "[nats] credentials_file";
    if (*cfg->nats_nkey_seed_file)
        return "[nats] nkey_seed_file";
    if (*cfg->nats_user)
        return "[nats] user and password_file";
    if (*cfg->nats_token_file)
        return "[nats] token_file";
    if (strchr(cfg->nats_url, '@'))
        return "[nats] url";
    return "";
}

bool tw_nats_refused(natsStatus s)
{
    return s == NATS_CONNECTION_AUTH_FAILED || s == NATS_NOT_PERMITTED;
}

/* ---- the files' modes and contents, for start-up, --check-config and reloads */

static const char *const nats_file_keys[TW_NATS_FILES] = {
    "credentials_file", "nkey_seed_file", "password_file", "token_file",
    "tls_key_file",     "tls_cert_file",  "tls_ca_file",
};
/* The first five hold secrets; a certificate and a CA bundle are public. */
#define NATS_SECRET_FILES 5

static const char *nats_file(const TwConfig *cfg, int i)
{
    const char *p[TW_NATS_FILES] = {cfg->nats_credentials_file,
                                    cfg->nats_nkey_seed_file,
                                    *cfg->nats_user ? cfg->nats_password_file : "",
                                    *cfg->nats_user ? "" : cfg->nats_token_file,
                                    cfg->nats_tls_key_file,
                                    cfg->nats_tls_cert_file,
                                    cfg->nats_tls_ca_file};
    return p[i] ? p[i] : "";
}

int tw_nats_warn_modes(const TwConfig *cfg)
{
    int n = 0;

    for (int i = 0; i < NATS_SECRET_FILES; i++) {
        const char *path = nats_file(cfg, i);
        struct stat st;
        if (!*path || stat(path, &st) != 0 || !(st.st_mode & (S_IRWXG | S_IRWXO)))
            continue;
        log_warn("[nats] %s: %s has mode %04o: group or others may %s it; it holds a secret, make it this "
                 "user's only (chmod 600 %s)",
                 nats_file_keys[i], path, (unsigned)(st.st_mode & 07777),
                 st.st_mode & (S_IRGRP | S_IROTH) ? "read" : "change", path);
        n++;
    }
    return n;
}

/* SHA-256 of the file's content; false when it cannot be read. Nothing of the content is kept. */
static bool file_digest(const char *path, unsigned char sum[32])
{
    unsigned char buf[4096];
    unsigned int len = 0;
    ssize_t got;
    bool ok = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    EVP_MD_CTX *ctx = fd >= 0 ? EVP_MD_CTX_new() : NULL;

    if (ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1) {
        while ((got = read(fd, buf, sizeof buf)) > 0)
            if (EVP_DigestUpdate(ctx, buf, (size_t)got) != 1)
                break;
        ok = got == 0 && EVP_DigestFinal_ex(ctx, sum, &len) == 1 && len == 32;
    }
    explicit_bzero(buf, sizeof buf);
    EVP_MD_CTX_free(ctx);
    if (fd >= 0)
        close(fd);
    return ok;
}

void tw_nats_files_stamp(const TwConfig *cfg, TwNatsFiles *f)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < TW_NATS_FILES; i++) {
        snprintf(f->path[i], sizeof f->path[i], "%s", nats_file(cfg, i));
        f->read[i] = *f->path[i] && file_digest(f->path[i], f->sum[i]);
    }
}

int tw_nats_files_report(const TwNatsFiles *was, const TwConfig *cfg)
{
    TwNatsFiles now;
    int n = 0;

    tw_nats_files_stamp(cfg, &now);
    for (int i = 0; i < TW_NATS_FILES; i++) {
        /* A key whose path changed is reported as a restart-only key; one that cannot be read is an error. */
        if (!*now.path[i] || strcmp(now.path[i], was->path[i]) != 0 || !now.read[i] ||
            (was->read[i] && memcmp(now.sum[i], was->sum[i], sizeof now.sum[i]) == 0))
            continue;
        n++;
        if (i == 0)
            log_warn("reload: [nats] %s: %s changed since start; nats.c reads it at every connect, so the "
                     "next reconnect uses it (the connection up now stays as it is)",
                     nats_file_keys[i], now.path[i]);
        else if (i == 1)
            log_warn("reload: [nats] %s: %s changed since start; it takes effect at the next restart, and "
                     "until then a reconnect fails (nats.c signs with the seed the file holds now but sends "
                     "the public key of the one read at start)",
                     nats_file_keys[i], now.path[i]);
        else
            log_warn("reload: [nats] %s: %s changed since start; it takes effect at the next restart (the "
                     "NATS connection keeps what was read at start)",
                     nats_file_keys[i], now.path[i]);
    }
    explicit_bzero(&now, sizeof now);
    return n;
}
