/* `turnwatch tools list [--json]` (docs/mcp.md): each tool of the configuration, its kind and limits, and for
 * an MCP tool the tools its server offers with their input schemas, asked of the server itself: started with
 * the section's argv (execve, no shell), initialize, tools/list, within a bounded time, then stopped (EOF,
 * SIGTERM to its process group, SIGKILL). No database. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "mcp_proto.h"

extern char **environ;

/* All of one server's asking: its start, initialize and every page of tools/list. */
#define ASK_MS 20000
#define ASK_PAGES 50

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct Server {
    pid_t pid;
    int in, out;
    char *buf;
    size_t len, cap;
    long long deadline;
} Server;

static bool send_line(Server *s, char *line)
{
    bool ok = line != NULL;
    for (size_t off = 0, n = line ? strlen(line) : 0; ok && off < n;) {
        ssize_t w = write(s->in, line + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        ok = w > 0;
        off += w > 0 ? (size_t)w : 0;
    }
    free(line);
    return ok;
}

/* The answer to request id (other messages are skipped), or NULL with why. */
static json_t *answer(Server *s, long long id, char *why, size_t why_len)
{
    for (;;) {
        char *nl;
        while (s->len && (nl = memchr(s->buf, '\n', s->len))) {
            json_t *msg;
            long long got;
            char w[200];
            size_t n = (size_t)(nl - s->buf);
            WrkMcpKind k = wrk_mcp_parse(s->buf, n, &msg, &got, w, sizeof w);
            memmove(s->buf, nl + 1, s->len - n - 1);
            s->len -= n + 1;
            if (k == WRK_MCP_RESPONSE && got == id)
                return msg;
            if (k == WRK_MCP_REQUEST) /* ping, or what the CLI does not give */
                send_line(s, wrk_mcp_answer(json_object_get(msg, "id"),
                                            strcmp(json_string_value(json_object_get(msg, "method")), "ping")
                                                ? NULL
                                                : json_object(),
                                            NULL));
            json_decref(msg);
        }
        long long left = s->deadline - now_ms();
        struct pollfd p = {.fd = s->out, .events = POLLIN};
        if (left <= 0) {
            snprintf(why, why_len, "no answer within %d s", ASK_MS / 1000);
            return NULL;
        }
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        if (s->len + 65536 > WRK_MCP_LINE_MAX) {
            snprintf(why, why_len, "a line longer than %d bytes", WRK_MCP_LINE_MAX);
            return NULL;
        }
        if (s->cap < s->len + 65536) {
            char *nb = realloc(s->buf, s->len + 65536);
            if (!nb) {
                snprintf(why, why_len, "out of memory");
                return NULL;
            }
            s->buf = nb;
            s->cap = s->len + 65536;
        }
        ssize_t r = read(s->out, s->buf + s->len, s->cap - s->len);
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
            snprintf(why, why_len, "it closed its stdout (exited?) before answering");
            return NULL;
        }
        s->len += r > 0 ? (size_t)r : 0;
    }
}

static bool start(Server *s, char *const argv[], char *why, size_t why_len)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return false;
    }
    if ((s->pid = fork()) == 0) {
        int null = open("/dev/null", O_WRONLY);
        setpgid(0, 0);
        dup2(in[0], 0);
        dup2(out[1], 1);
        if (null >= 0)
            dup2(null, 2);
        execve(argv[0], argv, environ);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    s->in = in[1];
    s->out = out[0];
    if (s->pid < 0) {
        snprintf(why, why_len, "fork: %s", strerror(errno));
        close(s->in);
        close(s->out);
        return false;
    }
    signal(SIGPIPE, SIG_IGN);
    return true;
}

static void stop(Server *s)
{
    close(s->in);
    close(s->out);
    for (int i = 0; i < 40; i++) {
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
            goto out;
        if (i == 10)
            kill(-s->pid, SIGTERM);
        usleep(50000);
    }
    kill(-s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
out:
    free(s->buf);
}

/* The server's tools ({name, description, inputSchema, ...} as it lists them), or NULL with why. */
static json_t *ask_server(const TwToolConf *t, char *why, size_t why_len)
{
    Server s = {.deadline = now_ms() + ASK_MS};
    json_t *tools = NULL, *msg;
    json_t *cursor = NULL;

    if (!start(&s, t->mcp_argv, why, why_len))
        return NULL;
    if (!send_line(&s, wrk_mcp_request(1, "initialize", wrk_mcp_initialize_params(), NULL)) ||
        !(msg = answer(&s, 1, why, why_len)))
        goto out;
    bool ok = wrk_mcp_version_ok(
        json_string_value(json_object_get(json_object_get(msg, "result"), "protocolVersion")));
    if (!ok)
        snprintf(why, why_len, "initialize: %s",
                 json_object_get(msg, "error") ? "refused" : "a protocol version the worker does not speak");
    json_decref(msg);
    if (!ok)
        goto out;
    send_line(&s, wrk_mcp_notification("notifications/initialized", NULL, NULL));
    tools = json_array();
    for (long long page = 0; page < ASK_PAGES; page++) {
        json_t *params = cursor ? json_pack("{s:O}", "cursor", cursor) : NULL;
        json_decref(cursor);
        cursor = NULL;
        if (!send_line(&s, wrk_mcp_request(2 + page, "tools/list", params, NULL)) ||
            !(msg = answer(&s, 2 + page, why, why_len))) {
            json_decref(tools);
            tools = NULL;
            break;
        }
        json_t *res = json_object_get(msg, "result");
        json_array_extend(tools, json_is_array(json_object_get(res, "tools")) ? json_object_get(res, "tools")
                                                                              : json_array());
        if (json_is_string(json_object_get(res, "nextCursor")))
            cursor = json_incref(json_object_get(res, "nextCursor"));
        json_decref(msg);
        if (!cursor)
            break;
    }
out:
    json_decref(cursor);
    stop(&s);
    return tools;
}

static const char *tool_kind(const TwToolConf *t)
{
    return t->mcp_argv        ? "mcp"
           : t->agent_profile ? "delegating"
           : t->external      ? "external"
           : t->serve         ? "serve"
                              : "exec";
}

static json_t *tool_doc(const TwToolConf *t)
{
    json_t *d = json_pack("{s:s,s:s}", "name", t->name, "kind", tool_kind(t));
    if (t->exec || t->mcp_exec)
        json_object_set_new(d, "program", json_string(t->mcp_argv ? t->mcp_exec : t->exec));
    if (t->timeout_sec)
        json_object_set_new(d, "timeout_seconds", json_integer(t->timeout_sec));
    json_object_set_new(d, "limits", *t->flow_limits ? json_string(t->flow_limits) : json_null());
    json_object_set_new(d, "max_concurrent", json_integer(t->max_concurrent));
    json_object_set_new(
        d, "program_limits",
        json_pack("{s:i,s:i,s:i,s:i,s:s?}", "memory_limit_mb", t->limits.memory_limit_mb, "cpu_limit_seconds",
                  t->limits.cpu_limit_sec, "max_open_files", t->limits.max_open_files, "max_processes",
                  t->limits.max_processes, "run_as_user",
                  t->limits.run_as_user && *t->limits.run_as_user ? t->limits.run_as_user : NULL));
    if (t->mcp_argv) {
        char why[300] = "";
        json_t *tools = ask_server(t, why, sizeof why);
        json_object_set_new(d, "mcp_tool", json_string(t->mcp_tool ? t->mcp_tool : t->name));
        json_object_set_new(d, "mcp_max_inflight", json_integer(t->mcp_max_inflight));
        if (tools)
            json_object_set_new(d, "server_tools", tools);
        else
            json_object_set_new(d, "server_error", json_string(why));
    }
    return d;
}

int cli_tools_list(Cli *cli, int argc, char **argv)
{
    json_t *all = json_array();
    int rc = CLI_EXIT_OK;

    if (argc != 1)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch tools list [--json]");
    for (size_t i = 0; i < cli->cfg.n_tools; i++)
        json_array_append_new(all, tool_doc(&cli->cfg.tools[i]));
    if (cli->json)
        return cli_print_json(all);
    size_t i, k;
    json_t *d, *st;
    json_array_foreach(all, i, d)
    {
        const char *prog = json_string_value(json_object_get(d, "program"));
        printf("%-24s %-10s %s\n", json_string_value(json_object_get(d, "name")),
               json_string_value(json_object_get(d, "kind")), prog ? prog : "");
        if (json_object_get(d, "server_error")) {
            printf("    the server could not be asked: %s\n",
                   json_string_value(json_object_get(d, "server_error")));
            rc = CLI_EXIT_RUNTIME;
        }
        json_array_foreach(json_object_get(d, "server_tools"), k, st)
        {
            const char *name = json_string_value(json_object_get(st, "name"));
            const char *desc = json_string_value(json_object_get(st, "description"));
            char *schema = json_dumps(json_object_get(st, "inputSchema"), JSON_COMPACT | JSON_SORT_KEYS);
            printf("    %s%s%s%s\n      input: %s\n", name ? name : "?",
                   name && strcmp(name, json_string_value(json_object_get(d, "mcp_tool"))) == 0 ? " (called)"
                                                                                                : "",
                   desc ? ": " : "", desc ? desc : "", schema ? schema : "{}");
            free(schema);
        }
    }
    json_decref(all);
    return rc;
}
