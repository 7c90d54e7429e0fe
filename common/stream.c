/* The durable event stream: make sure a JetStream stream keeps every event (docs/operations.md). The daemons
 * call it from their NATS publisher thread each time the connection comes up; the CLI's `events --since`
 * reads it back. */
#include "stream.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_API_WAIT_MS 5000
#define NS_PER_SEC 1000000000LL

static void say(char *buf, size_t size, const char *what, natsStatus s, jsErrCode jerr)
{
    const char *last = nats_GetLastError(NULL);
    if (jerr)
        snprintf(buf, size, "%s: %s (JetStream error %d%s%s)", what, natsStatus_GetText(s), (int)jerr,
                 last ? ": " : "", last ? last : "");
    else
        snprintf(buf, size, "%s: %s%s%s", what, natsStatus_GetText(s), last ? ": " : "", last ? last : "");
}

static const char *ours[] = {TW_STREAM_SUBJECTS, TW_STREAM_SCHEDULE_SUBJECTS};
#define N_OURS (sizeof ours / sizeof ours[0])

static bool holds(const jsStreamConfig *c, const char *subject)
{
    for (int i = 0; i < c->SubjectsLen; i++)
        if (strcmp(c->Subjects[i], subject) == 0 || strcmp(c->Subjects[i], ">") == 0 ||
            strcmp(c->Subjects[i], "evt.>") == 0)
            return true;
    return false;
}

static bool holds_ours(const jsStreamConfig *c)
{
    for (size_t k = 0; k < N_OURS; k++)
        if (!holds(c, ours[k]))
            return false;
    return true;
}

int tw_stream_ensure(natsConnection *nc, const char *name, int max_age_sec, int replicas, char *what,
                     size_t what_size, char *why, size_t why_size)
{
    jsCtx *js = NULL;
    jsOptions jo;
    jsStreamInfo *si = NULL, *done = NULL;
    jsStreamConfig sc;
    jsErrCode jerr = 0;
    const char **subjects = NULL;
    int64_t max_age_ns = (int64_t)max_age_sec * NS_PER_SEC;
    natsStatus s;
    int rc = -1;

    jsOptions_Init(&jo);
    jo.Wait = STREAM_API_WAIT_MS;
    if ((s = natsConnection_JetStream(&js, nc, &jo)) != NATS_OK) {
        say(why, why_size, "cannot use JetStream", s, 0);
        return -1;
    }
    if (replicas < 1)
        replicas = 1;
    s = js_GetStreamInfo(&si, js, name, NULL, &jerr);
    if (s == NATS_NO_RESPONDERS) {
        /* Nothing serves the JetStream API: the server runs without JetStream (a cluster electing a leader
         * still answers, with an error, or not in time). */
        say(why, why_size, "no JetStream on the server (nats-server -js)", s, jerr);
        rc = -ENOENT;
    } else if (s == NATS_NOT_FOUND) {
        jsStreamConfig_Init(&sc);
        sc.Name = name;
        sc.Description =
            "turnwatch events (evt.agent.>, evt.schedule.>), kept for `turnwatch events --since`";
        sc.Subjects = ours;
        sc.SubjectsLen = (int)N_OURS;
        sc.MaxAge = max_age_ns;
        sc.Storage = js_FileStorage;
        sc.Retention = js_LimitsPolicy;
        sc.Discard = js_DiscardOld;
        sc.Replicas = (int64_t)replicas;
        jerr = 0;
        s = js_AddStream(&done, js, &sc, NULL, &jerr);
        if (s == NATS_OK) {
            snprintf(what, what_size, "created");
            rc = 0;
        } else if (jerr == JSStreamNameExistErr) {
            /* Another daemon created it meanwhile, with the same configuration or its own: take it as it is
             * now, next time we connect it is checked again. */
            snprintf(what, what_size, "created by another daemon");
            rc = 0;
        } else {
            say(why, why_size, "cannot create the stream", s, jerr);
        }
    } else if (s != NATS_OK) {
        say(why, why_size, "cannot read the stream's configuration", s, jerr);
    } else if (holds_ours(si->Config) && si->Config->MaxAge == max_age_ns &&
               si->Config->Replicas == (int64_t)replicas) {
        snprintf(what, what_size, "as configured");
        rc = 0;
    } else {
        /* Update only what is ours to say: our subjects added to its own, the age limit. */
        sc = *si->Config;
        if (!holds_ours(si->Config)) {
            int n = si->Config->SubjectsLen;
            subjects = calloc((size_t)n + N_OURS, sizeof *subjects);
            if (!subjects) {
                snprintf(why, why_size, "out of memory");
                goto out;
            }
            for (int i = 0; i < si->Config->SubjectsLen; i++)
                subjects[i] = si->Config->Subjects[i];
            for (size_t k = 0; k < N_OURS; k++)
                if (!holds(si->Config, ours[k]))
                    subjects[n++] = ours[k];
            sc.Subjects = subjects;
            sc.SubjectsLen = n;
        }
        sc.MaxAge = max_age_ns;
        sc.Replicas = (int64_t)replicas;
        jerr = 0;
        s = js_UpdateStream(&done, js, &sc, NULL, &jerr);
        if (s == NATS_OK) {
            snprintf(what, what_size, "updated");
            rc = 0;
        } else {
            say(why, why_size, "cannot update the stream", s, jerr);
        }
    }
out:
    free(subjects);
    jsStreamInfo_Destroy(si);
    jsStreamInfo_Destroy(done);
    jsCtx_Destroy(js);
    return rc;
}

natsStatus tw_stream_msg(natsMsg **msg, const char *subject, const char *data, size_t len, const char *id)
{
    natsStatus s = natsMsg_Create(msg, subject, NULL, data, (int)len);

    if (s == NATS_OK && id)
        s = natsMsgHeader_Set(*msg, "Nats-Msg-Id", id);
    if (s != NATS_OK) {
        natsMsg_Destroy(*msg);
        *msg = NULL;
    }
    return s;
}

natsStatus tw_stream_publish(jsCtx *js, const char *subject, const char *data, size_t len, const char *id,
                             int wait_ms)
{
    natsMsg *msg = NULL;
    jsPubAck *ack = NULL;
    jsPubOptions po;
    jsErrCode jerr = 0;
    natsStatus s = tw_stream_msg(&msg, subject, data, len, id);

    jsPubOptions_Init(&po);
    po.MaxWait = wait_ms;
    if (s == NATS_OK)
        s = js_PublishMsg(&ack, js, msg, &po, &jerr);
    jsPubAck_Destroy(ack);
    natsMsg_Destroy(msg);
    return s;
}
