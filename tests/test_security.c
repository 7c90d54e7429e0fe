/* test_security.c — issue 26 parts 3 to 5 (contract section 16) against real servers: NATS with TLS and
 * credentials (a user with a password over TLS, a token with a client certificate, an nkey user, a .creds
 * file in operator mode; servers that refuse them, a CA that is not the server's), PostgreSQL with TLS and
 * sslmode=verify-full, and the limits on agent and tool programs (memory, CPU, open files, processes,
 * run_as_user). Every secret a test uses is looked for in every log and every output. */
#include "natsopts.h"
#include "suite.h"
#include "turn_helpers.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/wait.h>
#include <time.h>

/* ---- helpers
 * ----------------------------------------------------------------------------------------------------- */

/* A secret nobody could guess or find by chance in a log: prefix and 24 random hex digits (malloc'd). */
static char *sec_secret(const char *prefix)
{
    unsigned char raw[12];
    FILE *f = fopen("/dev/urandom", "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fread(raw, 1, sizeof raw, f), sizeof raw);
    fclose(f);
    char *s = wd_fmt("%s", prefix);
    for (size_t i = 0; i < sizeof raw; i++)
        wd_append(&s, "%02x", raw[i]);
    return s;
}

/* <dir>/<name> holding text (taken and freed), mode 0600; the path (owned by fx). */
static const char *sec_file(TwFx *fx, const char *name, char *text)
{
    char *path = wd_fmt("%s/%s", tw_fx_dir(fx), name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    free(text);
    return tw_fx_keep(fx, path);
}

/* How the fixture's own connections (the event collector) authenticate: independently of turnwatch's code,
 * straight through nats.c. */
typedef struct SecClient {
    const char *ca, *cert, *key, *user, *password, *token, *seed_file, *nkey_pub, *creds;
} SecClient;

static natsStatus sec_client_setup(natsOptions *o, void *arg)
{
    const SecClient *c = arg;
    natsStatus s = NATS_OK;
    if (c->ca)
        s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && c->ca)
        s = natsOptions_LoadCATrustedCertificates(o, c->ca);
    if (s == NATS_OK && c->cert)
        s = natsOptions_LoadCertificatesChain(o, c->cert, c->key);
    if (s == NATS_OK && c->user)
        s = natsOptions_SetUserInfo(o, c->user, c->password);
    if (s == NATS_OK && c->token)
        s = natsOptions_SetToken(o, c->token);
    if (s == NATS_OK && c->seed_file)
        s = natsOptions_SetNKeyFromSeed(o, c->nkey_pub, c->seed_file);
    if (s == NATS_OK && c->creds)
        s = natsOptions_SetUserCredentialsFromFiles(o, c->creds, NULL);
    return s;
}

/* Everything a test's programs printed, to look for secrets in. */
typedef struct SecOut {
    char *all;
} SecOut;

static void sec_out_add(SecOut *o, const char *a, const char *b)
{
    wd_append(&o->all, "%s\n%s\n", a ? a : "", b ? b : "");
}

static int sec_run(SecOut *o, const char *const argv[])
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_run_full(argv, NULL, &out, &err, 30000);
    sec_out_add(o, out, err);
    free(out);
    free(err);
    return rc;
}

/* A secret found anywhere in what was collected fails the test, naming where it is. */
static void sec_assert_no_secret(const SecOut *o, const char *const secrets[], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!secrets[i])
            continue;
        const char *at = strstr(o->all, secrets[i]);
        if (at) {
            size_t off = (size_t)(at - o->all);
            fprintf(stderr, "secret %zu found here:\n%.*s\n", i, 300, o->all + (off > 150 ? off - 150 : 0));
        }
        ck_assert_msg(!at, "a secret (number %zu) reached a log or an output", i);
    }
}

/* The logs of the processes, appended. */
static void sec_out_logs(SecOut *o, TwFxProc *const procs[], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!procs[i])
            continue;
        char *log = tw_fx_proc_log(procs[i]);
        sec_out_add(o, log, NULL);
        free(log);
    }
}

/* Waits until a line of p's log has a (and b, if not NULL); fails with the log otherwise. */
static void sec_wait_log(TwFxProc *p, const char *a, const char *b, int ms)
{
    WdLogHas h = {p, a, b};
    if (!tw_fx_wait_until(wd_log_line_has, &h, ms)) {
        tw_fx_proc_dump(p);
        ck_abort_msg("no log line with '%s'%s%s within %d ms", a, b ? " and " : "", b ? b : "", ms);
    }
}

/* ---- NATS with TLS and credentials
 * ----------------------------------------------------------------------------------------- */

/* A server with `server_conf` (TLS, authorization); the daemons with `nats_keys` in [nats] (the URL comes
 * first, with its scheme), the fixture's collector authenticating as `client`. A turn runs to done, its task
 * event reaches the collector and `turnwatch events`, and no secret is in any log or output. */
static void sec_nats_case(const char *server_conf, const char *scheme, const char *nats_keys,
                          SecClient *client, TwFx *fx, const char *const secrets[], size_t n_secrets,
                          const char *log_format)
{
    SecOut o = {NULL};
    tw_fx_nats_set_conf(fx, server_conf);
    tw_fx_nats_client(fx, sec_client_setup, client);
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    /* The server lets no one in without them. */
    natsConnection *anon = NULL;
    ck_assert_int_ne(natsConnection_ConnectTo(&anon, tw_fx_nats_url(fx)), NATS_OK);
    natsConnection_Destroy(anon);
    char *ov = wd_fmt("[nats]\nurl = %s://127.0.0.1:%d\n%s[log]\nformat = %s\n", scheme, tw_fx_nats_port(fx),
                      nats_keys, log_format);
    const char *cfg = tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *w = tw_fx_start_worker(fx, NULL);
    const char *events_argv[] = {tw_fx_cli_path(), "-c", cfg, "events", "--agent", "echo", NULL};
    TwFxProc *cli_events = tw_fx_spawn(fx, "cli-events", events_argv);
    sec_wait_log(w, "nats connection turnwatch-worker up", NULL, WD_WAIT_MS);
    sec_wait_log(pmo, "nats connection turnwatch-pmo up", NULL, WD_WAIT_MS);

    /* The checks pass and say nothing secret. */
    const char *checks[][4] = {{tw_fx_worker_path(), "-c", cfg, "--check-config"},
                               {tw_fx_pmo_path(), "-c", cfg, "--check-config"},
                               {tw_fx_cli_path(), "-c", cfg, "--check-config"}};
    for (size_t i = 0; i < 3; i++) {
        const char *argv[] = {checks[i][0], checks[i][1], checks[i][2], checks[i][3], NULL};
        ck_assert_int_eq(sec_run(&o, argv), 0);
    }

    /* A turn runs to done, its events arrive. */
    char *t = wd_submit(fx, "echo", "{\"x\":1}");
    WD_STATUS_IS(fx, t, "done");
    if (!tw_fx_events_wait(ev, "evt.agent.echo.task", t, 1, WD_WAIT_MS)) {
        tw_fx_events_dump(ev);
        ck_abort_msg("the turn's task event did not reach the collector");
    }
    sec_wait_log(cli_events, t, "\"done\"", WD_WAIT_MS);
    /* One with an external tool call: the CLI publishes the result's events itself, through the same keys. */
    char *t2 = wd_submit(fx, "tester",
                         "{\"mode\":\"tools\",\"calls\":[{\"id\":\"ask\",\"tool\":\"ext\",\"args\":{}}]}");
    WD_STATUS_IS(fx, t2, "suspended");
    char *out = NULL, *err = NULL;
    int rc =
        tw_fx_cli(fx, &out, &err, "-v", "tool-result", "--turn", t2, "--call", "ask", "--output", "{}", NULL);
    sec_out_add(&o, out, err);
    ck_assert_msg(rc == 0 && !strstr(err, "NATS"), "tool-result exited %d: %s", rc, err);
    free(out);
    free(err);
    WD_STATUS_IS(fx, t2, "done");
    if (!tw_fx_events_wait(ev, "evt.agent.tester.task", t2, 1, WD_WAIT_MS)) {
        tw_fx_events_dump(ev);
        ck_abort_msg("the second turn's task event did not reach the collector");
    }
    free(t2);
    ck_assert_int_eq(tw_fx_proc_terminate(cli_events, 10000), 0);
    /* The daemons exit 0 (no leak under ASan either). */
    ck_assert_int_eq(tw_fx_proc_terminate(w, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 30000), 0);
    TwFxProc *procs[] = {pmo, w, cli_events};
    sec_out_logs(&o, procs, 3);
    sec_assert_no_secret(&o, secrets, n_secrets);
    free(o.all);
    free(t);
    free(ov);
}

START_TEST(test_nats_tls_user_password)
{
    TwFx *fx = tw_fx_new();
    const char *tls = tw_fx_tls_cert(fx, "ca", "server", "DNS:localhost,IP:127.0.0.1");
    char *password = sec_secret("Pw5ecret");
    const char *pwfile = sec_file(fx, "nats.password", wd_fmt("%s\n", password));
    char *conf = wd_fmt("tls { cert_file: \"%s/server.pem\", key_file: \"%s/server.key\", timeout: 5 }\n"
                        "authorization { users = [ { user: \"twdaemon\", password: \"%s\" } ] }\n",
                        tls, tls, password);
    char *keys = wd_fmt("tls_ca_file = %s/ca.pem\nuser = twdaemon\npassword_file = %s\n", tls, pwfile);
    char *ca = wd_fmt("%s/ca.pem", tls);
    SecClient client = {.ca = ca, .user = "twdaemon", .password = password};
    const char *secrets[] = {password};
    sec_nats_case(conf, "tls", keys, &client, fx, secrets, 1, "text");
    tw_fx_free(fx);
    free(password);
    free(conf);
    free(keys);
    free(ca);
}
END_TEST

/* ---- a .creds file: NATS's operator mode, made here with OpenSSL (no nsc)
 * ------------------------------------------------------------------------ */

/* An nkey of any type (nkeys' prefixes: 'O' operator 14 << 3, 'A' account 0, 'U' user 20 << 3), written
 * independently of common/natsopts.c (nats-server and nats.c check both): base32 without padding of the
 * prefix byte(s), the key and a CRC-16/XMODEM, little-endian. */
typedef struct SecNkey {
    unsigned char raw[32]; /* the Ed25519 private key (seed) */
    char seed[64], pub[64];
} SecNkey;

static uint16_t sec_crc16(const unsigned char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

static void sec_b32(const unsigned char *in, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    unsigned buf = 0;
    int bits = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        buf = (buf << 8) | in[i];
        for (bits += 8; bits >= 5; bits -= 5)
            out[k++] = a[(buf >> (bits - 5)) & 31];
    }
    if (bits > 0)
        out[k++] = a[(buf << (5 - bits)) & 31];
    out[k] = '\0';
}

static void sec_nkey_new(SecNkey *k, unsigned char prefix)
{
    unsigned char s[36], p[35];
    size_t len = 32;
    ck_assert_int_eq(RAND_bytes(k->raw, 32), 1);
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, k->raw, 32);
    ck_assert_ptr_nonnull(key);
    ck_assert_int_eq(EVP_PKEY_get_raw_public_key(key, p + 1, &len), 1);
    EVP_PKEY_free(key);
    s[0] = (unsigned char)((18 << 3) | (prefix >> 5));
    s[1] = (unsigned char)((prefix & 31) << 3);
    memcpy(s + 2, k->raw, 32);
    uint16_t crc = sec_crc16(s, 34);
    s[34] = (unsigned char)(crc & 0xff);
    s[35] = (unsigned char)(crc >> 8);
    sec_b32(s, sizeof s, k->seed);
    p[0] = prefix;
    crc = sec_crc16(p, 33);
    p[33] = (unsigned char)(crc & 0xff);
    p[34] = (unsigned char)(crc >> 8);
    sec_b32(p, sizeof p, k->pub);
}

/* base64url without padding (malloc'd). */
static char *sec_b64url(const unsigned char *in, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    ck_assert_ptr_nonnull(out);
    int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    while (len > 0 && out[len - 1] == '=')
        out[--len] = '\0';
    for (char *c = out; *c; c++)
        *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
    return out;
}

/* A JWT of nats-io/jwt v2: claims (taken) with iat, iss, sub and jti added, signed by the issuer's key. */
static char *sec_jwt(const SecNkey *issuer, const char *sub, const char *name, json_t *nats)
{
    static const char header[] = "{\"typ\":\"JWT\",\"alg\":\"ed25519-nkey\"}";
    json_t *claims = json_pack("{s:s,s:I,s:s,s:s,s:s,s:o}", "jti", name, "iat", (json_int_t)time(NULL), "iss",
                               issuer->pub, "sub", sub, "name", name, "nats", nats);
    char *text = json_dumps(claims, JSON_COMPACT);
    char *h = sec_b64url((const unsigned char *)header, strlen(header));
    char *c = sec_b64url((const unsigned char *)text, strlen(text));
    char *signing = wd_fmt("%s.%s", h, c);
    unsigned char sig[64];
    size_t siglen = sizeof sig;
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, issuer->raw, 32);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    ck_assert_int_eq(EVP_DigestSignInit(md, NULL, NULL, NULL, key), 1);
    ck_assert_int_eq(EVP_DigestSign(md, sig, &siglen, (const unsigned char *)signing, strlen(signing)), 1);
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(key);
    char *sg = sec_b64url(sig, siglen);
    char *jwt = wd_fmt("%s.%s", signing, sg);
    json_decref(claims);
    free(text);
    free(h);
    free(c);
    free(signing);
    free(sg);
    return jwt;
}

/* An operator, an account it signs and a user the account signs: the server's configuration (operator mode,
 * the account preloaded) and the user's .creds file, as `nsc` writes it. */
START_TEST(test_nats_creds)
{
    TwFx *fx = tw_fx_new();
    SecNkey op, acc, sys, user;
    sec_nkey_new(&op, 14 << 3);
    sec_nkey_new(&acc, 0);
    sec_nkey_new(&sys, 0);
    sec_nkey_new(&user, 20 << 3);
    char *op_jwt = sec_jwt(&op, op.pub, "twop", json_pack("{s:s,s:i}", "type", "operator", "version", 2));
    char *acc_jwt = sec_jwt(&op, acc.pub, "twacc",
                            json_pack("{s:{s:i,s:i,s:i,s:i,s:i,s:b,s:i,s:i},s:s,s:i}", "limits", "subs", -1,
                                      "data", -1, "payload", -1, "imports", -1, "exports", -1, "wildcards", 1,
                                      "conn", -1, "leaf", -1, "type", "account", "version", 2));
    /* The server's own account (JetStream, which the fixture's server runs, wants one). */
    char *sys_jwt = sec_jwt(&op, sys.pub, "SYS",
                            json_pack("{s:{s:i,s:i,s:i,s:i,s:i,s:b,s:i,s:i},s:s,s:i}", "limits", "subs", -1,
                                      "data", -1, "payload", -1, "imports", -1, "exports", -1, "wildcards", 1,
                                      "conn", -1, "leaf", -1, "type", "account", "version", 2));
    char *user_jwt = sec_jwt(&acc, user.pub, "twuser",
                             json_pack("{s:{},s:{},s:i,s:i,s:i,s:s,s:i}", "pub", "sub", "subs", -1, "data",
                                       -1, "payload", -1, "type", "user", "version", 2));
    const char *creds =
        sec_file(fx, "turnwatch.creds",
                 wd_fmt("-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n\n"
                        "************************* IMPORTANT *************************\n"
                        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
                        "-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n",
                        user_jwt, user.seed));
    char *conf = wd_fmt("operator: \"%s\"\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: "
                        "\"%s\"\n  %s: \"%s\"\n}\n",
                        op_jwt, sys.pub, acc.pub, acc_jwt, sys.pub, sys_jwt);
    char *keys = wd_fmt("credentials_file = %s\n", creds);
    SecClient client = {.creds = creds};
    /* The user's seed and JWT (and its signature, the part no one else could make). */
    const char *secrets[] = {user.seed, user_jwt, strrchr(user_jwt, '.') + 1};
    sec_nats_case(conf, "nats", keys, &client, fx, secrets, 3, "text");
    tw_fx_free(fx);
    free(op_jwt);
    free(acc_jwt);
    free(sys_jwt);
    free(user_jwt);
    free(conf);
    free(keys);
}
END_TEST

/* A token, over TLS turned on by tls_ca_file alone (a nats:// URL), with a client certificate the server
 * verifies (mutual TLS). */
START_TEST(test_nats_token_client_cert)
{
    TwFx *fx = tw_fx_new();
    const char *tls = tw_fx_tls_cert(fx, "ca", "server", "DNS:localhost,IP:127.0.0.1");
    tw_fx_tls_cert(fx, "ca", "client", "DNS:turnwatch");
    char *token = sec_secret("Tok5ecret");
    const char *tokfile = sec_file(fx, "nats.token", wd_fmt("%s\n", token));
    char *conf = wd_fmt("tls { cert_file: \"%s/server.pem\", key_file: \"%s/server.key\", ca_file: "
                        "\"%s/ca.pem\", verify: true, timeout: 5 }\nauthorization { token: \"%s\" }\n",
                        tls, tls, tls, token);
    char *keys =
        wd_fmt("tls_ca_file = %s/ca.pem\ntls_cert_file = %s/client.pem\ntls_key_file = %s/client.key\n"
               "token_file = %s\n",
               tls, tls, tls, tokfile);
    char *ca = wd_fmt("%s/ca.pem", tls), *cert = wd_fmt("%s/client.pem", tls),
         *key = wd_fmt("%s/client.key", tls);
    SecClient client = {.ca = ca, .cert = cert, .key = key, .token = token};
    const char *secrets[] = {token};
    sec_nats_case(conf, "nats", keys, &client, fx, secrets, 1, "text");
    tw_fx_free(fx);
    free(token);
    free(conf);
    free(keys);
    free(ca);
    free(cert);
    free(key);
}
END_TEST

/* An nkey user, no TLS, JSON logs. */
START_TEST(test_nats_nkey)
{
    TwFx *fx = tw_fx_new();
    char seed[TW_NKEY_SEED_LEN + 1], pub[TW_NKEY_PUBLIC_LEN + 1];
    ck_assert_int_eq(tw_nkey_seed_new(seed), 0);
    ck_assert_int_eq(tw_nkey_public(seed, pub), 0);
    const char *seedfile = sec_file(fx, "nats.nk", wd_fmt("%s\n", seed));
    char *conf = wd_fmt("authorization { users = [ { nkey: \"%s\" } ] }\n", pub);
    char *keys = wd_fmt("nkey_seed_file = %s\n", seedfile);
    SecClient client = {.seed_file = seedfile, .nkey_pub = pub};
    /* The seed, and its part after the prefix (as it would appear if anything printed it decoded). */
    const char *secrets[] = {seed, seed + 8};
    sec_nats_case(conf, "nats", keys, &client, fx, secrets, 2, "json");
    tw_fx_free(fx);
    free(conf);
    free(keys);
}
END_TEST

/* Servers that refuse: a wrong token and a CA that did not sign the server's certificate are clear errors at
 * start that name the keys, and the daemons go on (and connect once the server takes them); a file that
 * cannot be read fails --check-config and the start. */
START_TEST(test_nats_refused)
{
    SecOut o = {NULL};
    TwFx *fx = tw_fx_new();
    const char *tls = tw_fx_tls_cert(fx, "ca", "server", "DNS:localhost,IP:127.0.0.1");
    tw_fx_tls_cert(fx, "otherca", NULL, NULL);
    char *good = sec_secret("Good5ecret"), *bad = sec_secret("Bad5ecret");
    const char *goodfile = sec_file(fx, "good.token", wd_fmt("%s\n", good));
    const char *badfile = sec_file(fx, "bad.token", wd_fmt("%s\n", bad));
    char *conf_good = wd_fmt("tls { cert_file: \"%s/server.pem\", key_file: \"%s/server.key\", timeout: 5 }\n"
                             "authorization { token: \"%s\" }\n",
                             tls, tls, good);
    char *ca = wd_fmt("%s/ca.pem", tls);
    SecClient client = {.ca = ca, .token = good};
    tw_fx_nats_set_conf(fx, conf_good);
    tw_fx_nats_client(fx, sec_client_setup, &client);
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    int port = tw_fx_nats_port(fx);
    char *ov_bad =
        wd_fmt("[nats]\nurl = tls://127.0.0.1:%d\ntls_ca_file = %s\ntoken_file = %s\n", port, ca, badfile);
    char *ov_ca = wd_fmt("[nats]\nurl = tls://localhost:%d\ntls_ca_file = %s/otherca.pem\ntoken_file = %s\n",
                         port, tls, goodfile);
    char *ov_missing =
        wd_fmt("[nats]\nurl = tls://127.0.0.1:%d\ntls_ca_file = %s\ntoken_file = %s/none.token\n", port, ca,
               tw_fx_dir(fx));
    const char *cfg_bad = tw_fx_write_config(fx, NULL, ov_bad);
    const char *cfg_ca = tw_fx_write_config(fx, "wrong-ca.ini", ov_ca);
    const char *cfg_missing = tw_fx_write_config(fx, "missing.ini", ov_missing);
    tw_fx_migrate(fx);

    /* A wrong token: the daemons start, say that the server refused the credentials of [nats] token_file,
     * and go on (the turn still runs: NATS is a doorbell). */
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *w = tw_fx_start_worker(fx, NULL);
    sec_wait_log(w, "the server refused the credentials", "check [nats] token_file", WD_WAIT_MS);
    sec_wait_log(pmo, "the server refused the credentials", "check [nats] token_file", WD_WAIT_MS);
    /* A CA that did not sign the server's certificate: TLS fails, said as such. */
    TwFxProc *w_ca = tw_fx_start_worker(fx, cfg_ca);
    sec_wait_log(w_ca, "TLS failed", "tls_ca_file", WD_WAIT_MS);
    char *t = wd_submit(fx, "tester",
                        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"ask\",\"tool\":\"ext\",\"args\":{}}]}");
    WD_STATUS_IS(fx, t, "suspended");
    /* The CLI's own publishing says so too, and the result still counts (the PMO's relay publishes). */
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "tool-result", "--turn", t, "--call", "ask", "--output", "{}", NULL);
    sec_out_add(&o, out, err);
    ck_assert_msg(rc == 0, "tool-result: %s", err);
    ck_assert_msg(strstr(err, "refused the credentials") && strstr(err, "[nats] token_file"), "stderr: '%s'",
                  err);
    free(out);
    free(err);
    WD_STATUS_IS(fx, t, "done");
    /* turnwatch events cannot do without NATS: exit 1, saying which key to check. */
    rc = tw_fx_cli(fx, &out, &err, "events", NULL);
    sec_out_add(&o, out, err);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(err, "check [nats] token_file"), "%s", err);
    free(out);
    free(err);
    /* Retried meanwhile: alive, and connected once the server takes the token. */
    tw_fx_sleep_ms(1500);
    ck_assert(tw_fx_proc_alive(w) && tw_fx_proc_alive(pmo) && tw_fx_proc_alive(w_ca));
    char *conf_bad_ok =
        wd_fmt("tls { cert_file: \"%s/server.pem\", key_file: \"%s/server.key\", timeout: 5 }\n"
               "authorization { token: \"%s\" }\n",
               tls, tls, bad);
    tw_fx_nats_set_conf(fx, conf_bad_ok);
    tw_fx_nats_restart(fx);
    sec_wait_log(w, "nats connection turnwatch-worker up", NULL, WD_WAIT_MS);
    sec_wait_log(pmo, "nats connection turnwatch-pmo up", NULL, WD_WAIT_MS);
    ck_assert(tw_fx_proc_alive(w_ca));

    /* A file that cannot be read: --check-config says which key, for the daemons and the CLI, and a daemon
     * does not start. */
    const char *progs[] = {tw_fx_worker_path(), tw_fx_pmo_path(), tw_fx_cli_path()};
    for (size_t i = 0; i < 3; i++) {
        const char *argv[] = {progs[i], "-c", cfg_missing, "--check-config", NULL};
        rc = tw_fx_run_full(argv, NULL, &out, &err, 30000);
        sec_out_add(&o, out, err);
        ck_assert_msg(rc == 1, "%s --check-config exited %d", progs[i], rc);
        ck_assert_msg(strstr(err, "[nats] token_file: cannot read") && strstr(err, "none.token"), "%s: %s",
                      progs[i], err);
        free(out);
        free(err);
    }
    /* One that exists but cannot be read by whoever checks (the token files are root's, mode 0600). The CLI
     * runs from a copy that nobody can reach wherever the build lies. */
    if (geteuid() == 0) {
        char *cli = tw_fx_copy_for_user(tw_fx_cli_path());
        const char *argv[] = {"runuser", "-u", "nobody", "--", cli, "-c", cfg_bad, "--check-config", NULL};
        rc = tw_fx_run_full(argv, NULL, &out, &err, 30000);
        tw_fx_remove_copy(cli);
        sec_out_add(&o, out, err);
        ck_assert_msg(rc == 1, "--check-config as nobody exited %d: %s", rc, err);
        ck_assert_msg(strstr(err, "[nats] token_file: cannot read") && strstr(err, "Permission denied"), "%s",
                      err);
        free(out);
        free(err);
    }
    TwFxProc *w_missing = tw_fx_start_worker(fx, cfg_missing);
    int status = 0;
    ck_assert(tw_fx_proc_wait(w_missing, 30000, &status));
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    sec_wait_log(w_missing, "[nats] token_file: cannot read", NULL, 1000);

    ck_assert_int_eq(tw_fx_proc_terminate(w, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(w_ca, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 30000), 0);
    TwFxProc *procs[] = {pmo, w, w_ca, w_missing};
    sec_out_logs(&o, procs, 4);
    const char *secrets[] = {good, bad};
    sec_assert_no_secret(&o, secrets, 2);
    free(o.all);
    free(t);
    free(good);
    free(bad);
    free(conf_good);
    free(conf_bad_ok);
    free(ca);
    free(ov_bad);
    free(ov_ca);
    free(ov_missing);
    tw_fx_free(fx);
}
END_TEST

/* ---- PostgreSQL with TLS
 * --------------------------------------------------------------------------------------------------- */

/* A server with a certificate of a test CA, TCP without TLS refused, and a login role whose password comes
 * from libpq's passfile: with sslmode=verify-full and that CA the daemons and the CLI work (a turn runs to
 * done over TLS connections); with another CA the CLI exits 1 saying why, and a daemon logs libpq's reason
 * and keeps trying, never exiting. The password is in no log or output. */
START_TEST(test_pg_tls_verify_full)
{
    SecOut o = {NULL};
    TwFx *fx = tw_fx_new();
    const char *tls = tw_fx_tls_cert(fx, "pgca", "pgserver", "DNS:localhost,IP:127.0.0.1");
    tw_fx_tls_cert(fx, "otherca", NULL, NULL);
    char *password = sec_secret("Pg5ecret");
    char *cert = wd_fmt("%s/pgserver.pem", tls), *key = wd_fmt("%s/pgserver.key", tls);
    tw_fx_pg_init(fx);
    tw_fx_pg_ssl(fx, cert, key, "hostssl all twapp 0.0.0.0/0 scram-sha-256\n");
    char *create = wd_fmt("CREATE ROLE twapp LOGIN SUPERUSER PASSWORD '%s'", password);
    tw_fx_sql_exec(fx, create, 0);
    tw_fx_nats_start(fx);
    int port = tw_fx_pg_port(fx);
    const char *passfile =
        sec_file(fx, "pgpass", wd_fmt("localhost:%d:turnwatch:twapp:%s\n", port, password));
    char *ov =
        wd_fmt("[postgres]\ndsn = host=localhost port=%d dbname=turnwatch user=twapp sslmode=verify-full "
               "sslrootcert=%s/pgca.pem passfile=%s\n",
               port, tls, passfile);
    char *ov_wrong = wd_fmt("[postgres]\ndsn = host=localhost port=%d dbname=turnwatch user=twapp "
                            "sslmode=verify-full sslrootcert=%s/otherca.pem passfile=%s\n",
                            port, tls, passfile);
    const char *cfg = tw_fx_write_config(fx, NULL, ov);
    const char *cfg_wrong = tw_fx_write_config(fx, "wrong-ca.ini", ov_wrong);
    tw_fx_migrate(fx);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *w = tw_fx_start_worker(fx, NULL);
    char *t = wd_submit(fx, "echo", "{\"x\":1}");
    WD_STATUS_IS(fx, t, "done");
    /* Every connection of twapp is a TLS one (pg_hba refuses the others anyway). */
    ck_assert_int_gt(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                                   "WHERE a.usename = 'twapp' AND s.ssl",
                                   0),
                     0);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                                   "WHERE a.usename = 'twapp' AND NOT s.ssl",
                                   0),
                     0);
    char *out = NULL, *err = NULL;
    const char *show[] = {tw_fx_cli_path(), "-c", cfg, "turn", "show", t, NULL};
    ck_assert_int_eq(sec_run(&o, show), 0);

    /* Another CA: the CLI exits 1 with libpq's reason; a daemon says it and keeps trying. */
    const char *show_wrong[] = {tw_fx_cli_path(), "-c", cfg_wrong, "turn", "show", t, NULL};
    int rc = tw_fx_run_full(show_wrong, NULL, &out, &err, 30000);
    sec_out_add(&o, out, err);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(err, "certificate verify failed"), "%s", err);
    free(out);
    free(err);
    TwFxProc *w_wrong = tw_fx_start_worker(fx, cfg_wrong);
    sec_wait_log(w_wrong, "postgres connection", "certificate verify failed", WD_WAIT_MS);
    tw_fx_sleep_ms(1500);
    ck_assert(tw_fx_proc_alive(w_wrong));
    ck_assert_int_eq(tw_fx_proc_terminate(w_wrong, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(w, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 30000), 0);
    TwFxProc *procs[] = {pmo, w, w_wrong};
    sec_out_logs(&o, procs, 3);
    const char *secrets[] = {password};
    sec_assert_no_secret(&o, secrets, 1);
    free(o.all);
    free(t);
    free(password);
    free(cert);
    free(key);
    free(create);
    free(ov);
    free(ov_wrong);
    tw_fx_free(fx);
}
END_TEST

/* ---- limits on agent and tool programs
 * ------------------------------------------------------------------------------------- */

/* The turn's task.deliverable content (malloc'd JSON). */
static json_t *sec_deliverable(TwFx *fx, const char *turn)
{
    char *text = tw_fx_sql_str(fx,
                               "SELECT c.content::text FROM state.turns t JOIN state.cards c ON c.card_id = "
                               "t.deliverable_card_id WHERE t.turn_id = $1::uuid",
                               1, turn);
    ck_assert_ptr_nonnull(text);
    json_t *j = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(j);
    free(text);
    return j;
}

/* What a tool result of the tw-test-agent's tools mode says: "status code: message" or "ok <output>". */
static char *sec_result(json_t *results, const char *id)
{
    size_t i;
    json_t *r;
    json_array_foreach(results, i, r)
    {
        if (strcmp(json_string_value(json_object_get(r, "tool_call_id")), id) != 0)
            continue;
        json_t *e = json_object_get(r, "error");
        if (e)
            return wd_fmt("%s %s: %s", json_string_value(json_object_get(r, "status")),
                          json_string_value(json_object_get(e, "code")),
                          json_string_value(json_object_get(e, "message")));
        char *out = json_dumps(json_object_get(r, "output"), JSON_COMPACT | JSON_SORT_KEYS);
        char *s = wd_fmt("ok %s", out);
        free(out);
        return s;
    }
    return wd_fmt("no result for %s", id);
}

/* Tools allocating 512 MiB under memory_limit_mb = 64 and looping under cpu_limit_seconds = 1 (exec and serve
 * mode) end resource_limit with the limit in the message, as does an agent's step at its memory limit; a tool
 * with run_as_user runs as that user; the agent goes on, and the next turns on the same worker are done. */
START_TEST(test_limits_turns)
{
    bool root = geteuid() == 0;
    /* whoami runs it as nobody: a copy of its own, that nobody can read wherever the checkout lies. */
    char *script = wd_fmt("%s/examples/tools/tw-hog-tool.py", tw_fx_source_dir());
    char *copy = tw_fx_copy_for_user(script);
    char *hog = wd_fmt("/usr/bin/python3 %s", copy);
    free(script);
    char *ov =
        wd_fmt("[tool.hog]\nexec = %s\ntimeout_seconds = 20\nmemory_limit_mb = 64\ncpu_limit_seconds = 1\n"
               "[tool.hogserve]\nexec = %s\nmode = serve\ntimeout_seconds = 20\ncpu_limit_seconds = 1\n"
               "[agent.hogagent]\nexec = %s\nstep_timeout_seconds = 20\nkill_grace_seconds = 1\n"
               "memory_limit_mb = 64\n"
               "%s%s%s",
               hog, hog, hog, root ? "[tool.whoami]\nexec = " : "", root ? hog : "",
               root ? "\ntimeout_seconds = 20\nrun_as_user = nobody\nmax_processes = 50\n" : "");
    TwFxStack st = tw_fx_stack_start_events(ov, NULL);
    TwFx *fx = st.fx;
    char *calls = wd_fmt("{\"mode\":\"tools\",\"calls\":["
                         "{\"id\":\"m\",\"tool\":\"hog\",\"args\":{\"what\":\"memory\",\"mb\":512}},"
                         "{\"id\":\"c\",\"tool\":\"hog\",\"args\":{\"what\":\"cpu\"}},"
                         "{\"id\":\"s\",\"tool\":\"hogserve\",\"args\":{\"what\":\"cpu\"}},"
                         "{\"id\":\"ok\",\"tool\":\"hog\",\"args\":{\"what\":\"memory\",\"mb\":4}}%s]}",
                         root ? ",{\"id\":\"w\",\"tool\":\"whoami\",\"args\":{\"what\":\"id\"}}" : "");
    char *t = wd_submit(fx, "tester", calls);
    WD_STATUS_WITHIN(fx, t, "done", 60000);
    json_t *d = sec_deliverable(fx, t);
    json_t *results = json_array_get(json_object_get(json_object_get(d, "output"), "tool_results"), 0);
    char *m = sec_result(results, "m"), *c = sec_result(results, "c"), *sv = sec_result(results, "s");
    char *ok = sec_result(results, "ok");
    ck_assert_msg(strstr(m,
                         "error resource_limit: the tool program exited with status 1 at its memory_limit_mb "
                         "(64 MiB; its peak resident memory was") &&
                      strstr(m, "MemoryError"),
                  "%s", m);
    ck_assert_msg(strstr(c,
                         "error resource_limit: the tool program used up its cpu_limit_seconds (1 s of CPU "
                         "time) and was stopped"),
                  "%s", c);
    ck_assert_msg(strstr(sv, "error resource_limit: the tool program used up its cpu_limit_seconds"), "%s",
                  sv);
    ck_assert_msg(strncmp(ok, "ok ", 3) == 0, "%s", ok);
    if (root) {
        char *w = sec_result(results, "w");
        ck_assert_msg(strstr(w, "\"uid\":65534") && strstr(w, "\"groups\":[]") &&
                          strstr(w, "\"no_new_privs\":1"),
                      "%s", w);
        free(w);
    }
    json_decref(d);

    /* An agent's step at its memory limit fails the turn with resource_limit; the next turns are done: the
     * same agent's, another's, and the serve tool's (a new process in place of the one its limit stopped). */
    char *t2 = wd_submit(fx, "hogagent", "{\"what\":\"memory\",\"mb\":512}");
    WD_STATUS_WITHIN(fx, t2, "failed", 60000);
    char *err = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1::uuid", 1, t2);
    ck_assert_str_eq(err, "resource_limit");
    free(err);
    char *out = NULL, *e = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &e, "turn", "show", t2, NULL), 0);
    ck_assert_msg(strstr(out, "resource_limit") && strstr(out, "memory_limit_mb (64 MiB"), "%s", out);
    free(out);
    free(e);
    char *t3 = wd_submit(fx, "hogagent", "{\"what\":\"ok\"}");
    char *t4 = wd_submit(fx, "echo", "{\"x\":1}");
    char *t5 = wd_submit(
        fx, "tester", "{\"mode\":\"tools\",\"calls\":[{\"id\":\"s2\",\"tool\":\"hogserve\",\"args\":{}}]}");
    WD_STATUS_IS(fx, t3, "done");
    WD_STATUS_IS(fx, t4, "done");
    WD_STATUS_IS(fx, t5, "done");
    d = sec_deliverable(fx, t5);
    char *s2 =
        sec_result(json_array_get(json_object_get(json_object_get(d, "output"), "tool_results"), 0), "s2");
    ck_assert_msg(strncmp(s2, "ok ", 3) == 0, "%s", s2);
    json_decref(d);
    ck_assert(tw_fx_proc_alive(st.worker));

    /* run_as_user is refused at --check-config unless the worker runs as root. */
    if (root) {
        char *worker = tw_fx_copy_for_user(tw_fx_worker_path());
        const char *argv[] = {"runuser",        "-u", "nobody", "--", worker, "-c", tw_fx_config_path(fx),
                              "--check-config", NULL};
        int rc = tw_fx_run_full(argv, NULL, &out, &e, 30000);
        tw_fx_remove_copy(worker);
        ck_assert_msg(rc == 1, "check-config as nobody exited %d: %s", rc, e);
        ck_assert_msg(strstr(e, "[tool.whoami] run_as_user: the worker must run as root"), "%s", e);
        free(out);
        free(e);
    }
    ck_assert_int_eq(tw_fx_proc_terminate(st.worker, 30000), 0);
    free(s2);
    free(m);
    free(c);
    free(sv);
    free(ok);
    free(t);
    free(t2);
    free(t3);
    free(t4);
    free(t5);
    free(calls);
    free(hog);
    free(ov);
    tw_fx_free(fx);
    tw_fx_remove_copy(copy);
}
END_TEST

TW_SUITE_DEFINE(security, {
                              {"nats_tls_user_password", test_nats_tls_user_password, 120},
                              {"nats_token_client_cert", test_nats_token_client_cert, 120},
                              {"nats_nkey", test_nats_nkey, 120},
                              {"nats_creds", test_nats_creds, 120},
                              {"nats_refused", test_nats_refused, 150},
                              {"pg_tls", test_pg_tls_verify_full, 120},
                              {"limits", test_limits_turns, 150},
                          })
