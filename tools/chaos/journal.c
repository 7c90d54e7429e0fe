/* The soak's journal: the run's clock, and its notes and incidents (soak.log, and stderr when verbose or for
 * an incident). Every part of the driver writes to it; it calls none of them. */
#include "chaos.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static FILE *chaos_log;
static bool chaos_verbose;
static int64_t chaos_t0_ms;

static int64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t chaos_now_ms(const ChaosRun *run)
{
    (void)run;
    return monotonic_ms() - chaos_t0_ms;
}

static void vnote(const char *fmt, va_list ap, bool to_stderr)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    if (chaos_log) {
        /* The wall clock too, to read beside the daemons' logs. */
        struct timespec ts;
        struct tm tm;
        char wall[32];
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        strftime(wall, sizeof wall, "%H:%M:%S", &tm);
        fprintf(chaos_log, "%s.%03ldZ t=%7.1fs %s\n", wall, ts.tv_nsec / 1000000,
                (double)(monotonic_ms() - chaos_t0_ms) / 1000.0, line);
        fflush(chaos_log);
    }
    if (to_stderr)
        fprintf(stderr, "turnwatch-soak: t=%.1fs %s\n", (double)(monotonic_ms() - chaos_t0_ms) / 1000.0,
                line);
}

void chaos_note(ChaosRun *run, const char *fmt, ...)
{
    va_list ap;
    (void)run;
    va_start(ap, fmt);
    vnote(fmt, ap, chaos_verbose);
    va_end(ap);
}

void chaos_incident(ChaosRun *run, const char *what, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    json_array_append_new(run->incidents, json_pack("{s:s,s:s}", "what", what, "detail", detail));
    chaos_note(run, "INCIDENT %s: %s", what, detail);
    if (!chaos_verbose)
        fprintf(stderr, "turnwatch-soak: %s: %s\n", what, detail);
}

void chaos_journal_start(void)
{
    chaos_t0_ms = monotonic_ms();
}

void chaos_journal_open(const char *path, bool verbose)
{
    chaos_verbose = verbose;
    chaos_log = fopen(path, "a");
}

void chaos_journal_close(void)
{
    if (chaos_log)
        fclose(chaos_log);
    chaos_log = NULL;
}
