/* fixture_http.c — the fixture's HTTP client and Prometheus text checks. See fixture.h. */
#include "fixture_int.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <libpq-fe.h>
#include <math.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- HTTP and Prometheus
 * ------------------------------------------------------------------------------------------ */

int tw_fx_http_request(int port, const char *method, const char *path, const char *host, const char *body,
                       char **answer)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    size_t len = 0, cap = 8192;
    char *buf, *req;
    int status = -1, major, minor;
    int64_t deadline = tw_fx_now_ms() + 10000;

    *answer = NULL;
    if (fd < 0)
        return -1;
    /* The connect is bounded too: a server whose accept queue is full drops the SYN, and a blocking connect
     * would wait for the kernel's retries (a minute or more). */
    int flags = fcntl(fd, F_GETFL);
    bool connected = fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 &&
                     (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EINPROGRESS);
    if (connected) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len_err = sizeof err;
        connected = poll(&p, 1, (int)(deadline - tw_fx_now_ms())) == 1 &&
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len_err) == 0 && err == 0 &&
                    fcntl(fd, F_SETFL, flags) == 0;
    }
    if (!connected) {
        close(fd);
        return -1;
    }
    char hostbuf[64];
    snprintf(hostbuf, sizeof hostbuf, "127.0.0.1:%d", port);
    if (body)
        req = fx_asprintf("%s %s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\n\r\n%s",
                          method, path, host ? host : hostbuf, strlen(body), body);
    else
        req = fx_asprintf("%s %s HTTP/1.0\r\nHost: %s\r\n\r\n", method, path, host ? host : hostbuf);
    bool sent = write(fd, req, strlen(req)) == (ssize_t)strlen(req);
    free(req);
    buf = fx_xmalloc(cap);
    while (sent) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - tw_fx_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        if (cap - len < 4096)
            buf = fx_xrealloc(buf, cap *= 2);
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    if (sscanf(buf, "HTTP/%d.%d %d", &major, &minor, &status) != 3)
        status = -1;
    *answer = buf;
    return status;
}

int tw_fx_http_get(int port, const char *path, char **body)
{
    char *answer;
    int status = tw_fx_http_request(port, "GET", path, NULL, NULL, &answer);
    char *head_end = answer ? strstr(answer, "\r\n\r\n") : NULL;

    if (body)
        *body = head_end && status >= 0 ? fx_xstrdup(head_end + 4) : NULL;
    free(answer);
    return head_end ? status : -1;
}

static bool prom_name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* The family a sample belongs to: its name, or for a histogram's series the name without the suffix. */
static bool prom_typed(json_t *types, const char *name)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    if (json_object_get(types, name))
        return true;
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) {
            char *base = fx_asprintf("%.*s", (int)(n - k), name);
            const char *t = json_string_value(json_object_get(types, base));
            free(base);
            if (t && (strcmp(t, "histogram") == 0 || (i > 0 && strcmp(t, "summary") == 0)))
                return true;
        }
    }
    return false;
}

json_t *tw_fx_prom_parse(const char *text, char **err)
{
    json_t *samples = json_object(), *types = json_object();
    char *copy = fx_xstrdup(text);
    int line_no = 0;

    if (err)
        *err = NULL;
    for (char *line = copy, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_no++;
        if (!*line)
            continue;
        char *why = NULL;
        if (line[0] == '#') {
            char kind[8], name[256], rest[64];
            if (sscanf(line, "# %7s %255s %63s", kind, name, rest) < 2 ||
                (strcmp(kind, "HELP") != 0 && strcmp(kind, "TYPE") != 0))
                why = fx_asprintf("a comment that is not # HELP or # TYPE");
            else if (strcmp(kind, "TYPE") == 0) {
                static const char *const kinds[] = {"counter", "gauge", "histogram", "summary", "untyped"};
                bool known = false;
                for (size_t i = 0; i < 5; i++)
                    known |= strcmp(rest, kinds[i]) == 0;
                if (!known || json_object_get(types, name))
                    why = fx_asprintf("TYPE %s %s: unknown type or declared twice", name, rest);
                else
                    json_object_set_new(types, name, json_string(rest));
            }
        } else {
            const char *p = line;
            if (!prom_name_char(*p, true))
                why = fx_asprintf("no metric name");
            while (!why && prom_name_char(*p, false))
                p++;
            char *name = why ? NULL : fx_asprintf("%.*s", (int)(p - line), line);
            if (!why && *p == '{') {
                p++;
                while (!why && *p != '}') {
                    if (!prom_name_char(*p, true) || *p == ':') {
                        why = fx_asprintf("bad label name at column %d", (int)(p - line) + 1);
                        break;
                    }
                    while (prom_name_char(*p, false) && *p != ':')
                        p++;
                    if (p[0] != '=' || p[1] != '"') {
                        why = fx_asprintf("label without =\"value\" at column %d", (int)(p - line) + 1);
                        break;
                    }
                    p += 2;
                    while (*p && *p != '"') {
                        if (*p == '\\') {
                            if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') {
                                why = fx_asprintf("bad escape in a label value");
                                break;
                            }
                            p++;
                        }
                        p++;
                    }
                    if (why)
                        break;
                    if (*p != '"') {
                        why = fx_asprintf("unterminated label value");
                        break;
                    }
                    p++;
                    if (*p == ',')
                        p++;
                    else if (*p != '}')
                        why = fx_asprintf("expected , or } at column %d", (int)(p - line) + 1);
                }
                if (!why)
                    p++;
            }
            if (!why && *p != ' ')
                why = fx_asprintf("no space before the value");
            if (!why) {
                char *key = fx_asprintf("%.*s", (int)(p - line), line), *end;
                double v = strtod(p + 1, &end);
                if (end == p + 1 || (*end && *end != ' '))
                    why = fx_asprintf("'%s' is not a value", p + 1);
                else if (json_object_get(samples, key))
                    why = fx_asprintf("sample %s appears twice", key);
                else if (!prom_typed(types, name))
                    why = fx_asprintf("sample %s has no # TYPE before it", key);
                else
                    json_object_set_new(samples, key, json_real(v));
                free(key);
            }
            free(name);
        }
        if (why) {
            if (err)
                *err = fx_asprintf("line %d: %s: %s", line_no, why, line);
            free(why);
            json_decref(samples);
            samples = NULL;
            break;
        }
    }
    free(copy);
    json_decref(types);
    return samples;
}

double tw_fx_prom_value(json_t *samples, const char *key)
{
    json_t *v = json_object_get(samples, key);
    return v ? json_real_value(v) : NAN;
}
