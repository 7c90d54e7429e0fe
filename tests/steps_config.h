/* steps_config.h — the config that the step-outcome unit tests (test_steps.c) and the agent-reply fuzz target
 * (fuzz/fuzz_agent_reply.c) read a program's reply against: agent "a" with a 7 s step limit, two tools with
 * their own limits, and an external one. */
#ifndef TW_TESTS_STEPS_CONFIG_H
#define TW_TESTS_STEPS_CONFIG_H

static const char steps_config_text[] = "[agent.a]\n"
                                        "exec = /bin/true\n"
                                        "step_timeout_seconds = 7\n"
                                        "[tool.search]\n"
                                        "exec = /bin/true\n"
                                        "timeout_seconds = 40\n"
                                        "suspend_timeout_seconds = 90\n"
                                        "[tool.quick]\n"
                                        "exec = /bin/true\n"
                                        "timeout_seconds = 5\n"
                                        "suspend_timeout_seconds = 6\n"
                                        "[tool.ask]\n"
                                        "external = true\n"
                                        "[worker]\n"
                                        "suspend_timeout_seconds = 60\n";

#endif
