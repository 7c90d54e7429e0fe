/* Fuzz target config: the INI parser and its checks (tw_config_load_string) on any text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_check.h"
#include "policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    TwConfig cfg;
    int rc;

    memcpy(text, data, size);
    text[size] = '\0';
    rc = tw_config_load_string(&cfg, "fuzz.ini", text);
    if (rc == 0) {
        fz_check(cfg.n_errors == 0, "loaded with errors");
        /* [nats] security: one way to authenticate at most, a user with its password file, a certificate with
         * its key. */
        fz_check(!!*cfg.nats_credentials_file + !!*cfg.nats_nkey_seed_file + !!*cfg.nats_user +
                         !!*cfg.nats_token_file <=
                     1,
                 "two ways to authenticate to NATS");
        fz_check(!*cfg.nats_user == !*cfg.nats_password_file, "a NATS user without a password file");
        fz_check(!*cfg.nats_tls_cert_file == !*cfg.nats_tls_key_file, "a client certificate without its key");
        for (size_t i = 0; i < cfg.n_agents; i++) {
            fz_check(cfg.agents[i].argv && cfg.agents[i].argv[0], "an agent without a program");
            fz_check(tw_config_agent(&cfg, cfg.agents[i].name) == &cfg.agents[i],
                     "an agent not found by name");
            fz_check(cfg.agents[i].limits.run_as_user && cfg.agents[i].limits.memory_limit_mb >= 0 &&
                         cfg.agents[i].limits.cpu_limit_sec >= 0 &&
                         cfg.agents[i].limits.max_open_files >= 0 && cfg.agents[i].limits.max_processes >= 0,
                     "an agent's limits not set from its section or [worker]");
        }
        for (size_t i = 0; i < cfg.n_tools; i++) {
            fz_check(cfg.tools[i].external || (cfg.tools[i].argv && cfg.tools[i].argv[0]),
                     "a tool without a program that is not external");
            fz_check(tw_config_tool(&cfg, cfg.tools[i].name) == &cfg.tools[i], "a tool not found by name");
            fz_check(cfg.tools[i].limits.run_as_user && cfg.tools[i].limits.memory_limit_mb >= 0 &&
                         cfg.tools[i].limits.cpu_limit_sec >= 0 && cfg.tools[i].limits.max_open_files >= 0 &&
                         cfg.tools[i].limits.max_processes >= 0,
                     "a tool's limits not set from its section or [worker]");
            fz_check(tw_policy_wait_seconds(&cfg, &cfg.tools[i],
                                            tw_policy_tool_timeout(&cfg, NULL, &cfg.tools[i], 0, NULL)) > 0,
                     "a tool with no wait");
            fz_check(tw_policy_tool_timeout(&cfg, NULL, &cfg.tools[i], 0, NULL) > 0,
                     "a tool call with no timeout");
        }
    } else {
        fz_check(cfg.n_errors > 0 && cfg.errors && *cfg.errors, "refused without saying why");
    }
    tw_config_free(&cfg);
    free(text);
    return 0;
}
