/* The soak's verdict: every invariant of contract section 13 (and a few more that the tables let us check),
 * each one SQL query over the database at rest plus what the soak knows (its plan, what the CLI answered,
 * every event NATS delivered, loaded into temporary tables), returning one row per violation: the turn and
 * what is wrong. Then the table: turns by kind and outcome, faults, events, invariants with their violation
 * counts. */
#include "chaos.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TERMINAL "('done', 'failed', 'timeout', 'cancelled')"
#define SHOW_PER_INVARIANT 12

typedef struct Invariant {
    const char *name;
    const char *sql;   /* rows of (turn id or '-', what is wrong) */
    const char *plant; /* plants one violation, for the checker's self-test (rolled back) */
} Invariant;

/* Effects are judged against the turn's epoch: a turn runs under one epoch from its dispatch to its end (the
 * idle state event of a forced end carries the agent's epoch after the bump, one more). Once retries exist
 * (contract section 11), a turn has one epoch per attempt and these comparisons become "an epoch the turn had
 * while the effect was made": the turn's history table will say which. */
static const Invariant invariants[] = {
    {"every turn terminal",
     "SELECT turn_id::text, format('status %s (epoch %s, step %s)', status, turn_epoch, step) FROM "
     "state.turns "
     "WHERE status NOT IN " TERMINAL,
     /* planted */
     "UPDATE state.turns SET status = 'running' WHERE turn_id = (SELECT turn_id FROM state.turns LIMIT 1)"},

    {"one turn per submit",
     "SELECT t.turn_id::text, format('not a turn of the plan (idempotency key %s)', t.idempotency_key) "
     "FROM state.turns t WHERE NOT EXISTS (SELECT 1 FROM soak_plan p WHERE p.turn_id = t.turn_id) "
     "UNION ALL SELECT coalesce(answered_id::text, '-'), format('plan turn %s (key soak-%s): submit answered "
     "%s,"
     " the key names %s', idx, idx, answered_id, turn_id) FROM soak_plan "
     "WHERE turn_id IS NULL OR answered_id IS DISTINCT FROM turn_id AND answered_id IS NOT NULL",
     /* planted */
     "INSERT INTO state.turns (agent, profile, channel_id, input, status) SELECT agent, profile, channel_id, "
     "input, 'done' FROM state.turns LIMIT 1"},

    {"one final event per turn (outbox)",
     "SELECT t.turn_id::text, format('%s task events in the outbox for a %s turn', count(o.event_id), "
     "t.status) "
     "FROM state.turns t LEFT JOIN state.outbox o ON o.turn_id = t.turn_id AND o.kind = 'task' "
     "GROUP BY t.turn_id, t.status "
     "HAVING count(o.event_id) <> CASE WHEN t.status IN " TERMINAL " THEN 1 ELSE 0 END",
     /* planted */
     "DELETE FROM state.outbox WHERE event_id = (SELECT event_id FROM state.outbox WHERE kind = 'task' "
     "LIMIT 1)"},

    {"final event says what the turn is",
     "SELECT t.turn_id::text, format('event %s: %s/%s epoch %s card %s on %s; the turn: %s/%s epoch %s card "
     "%s',"
     " o.event_id, o.payload->>'status', o.payload->>'error', o.payload->>'turn_epoch',"
     " o.payload->>'deliverable_card_id', o.subject, t.status, t.error, t.turn_epoch, t.deliverable_card_id) "
     "FROM state.turns t JOIN state.outbox o ON o.turn_id = t.turn_id AND o.kind = 'task' "
     "WHERE o.payload->>'status' IS DISTINCT FROM t.status OR o.payload->>'error' IS DISTINCT FROM t.error "
     "OR (o.payload->>'turn_epoch')::bigint IS DISTINCT FROM t.turn_epoch "
     "OR o.payload->>'deliverable_card_id' IS DISTINCT FROM t.deliverable_card_id::text "
     "OR o.payload->>'turn_id' IS DISTINCT FROM t.turn_id::text "
     "OR o.subject <> 'evt.agent.' || t.agent || '.task'",
     /* planted */
     "UPDATE state.outbox SET payload = payload || '{\"status\": \"planted\"}' WHERE event_id = (SELECT "
     "event_id FROM state.outbox WHERE kind = 'task' LIMIT 1)"},

    {"one final event seen per turn (NATS)",
     "WITH s AS (SELECT payload->>'turn_id' AS turn_id, count(DISTINCT payload->>'event_id') AS n,"
     "                  min(payload->>'event_id') AS event_id"
     "             FROM soak_seen WHERE subject LIKE 'evt.agent.%.task' GROUP BY 1) "
     "SELECT t.turn_id::text, format('%s distinct final events seen (%s), the outbox has %s', coalesce(s.n, "
     "0),"
     " s.event_id, o.event_id) "
     "FROM state.turns t JOIN state.outbox o ON o.turn_id = t.turn_id AND o.kind = 'task' "
     "LEFT JOIN s ON s.turn_id = t.turn_id::text "
     "WHERE coalesce(s.n, 0) <> 1 OR s.event_id <> o.event_id::text",
     /* planted */
     "INSERT INTO soak_seen (subject, payload, source) SELECT subject, payload || jsonb_build_object("
     "'event_id', gen_random_uuid()), source FROM soak_seen WHERE subject LIKE 'evt.agent.%.task' LIMIT 1"},

    {"events seen are in the outbox, unchanged",
     "SELECT coalesce(s.payload->>'turn_id', '-'), format('%s event %s: %s', s.subject, "
     "s.payload->>'event_id',"
     " CASE WHEN s.payload IS NULL THEN 'payload is not a JSON object' WHEN o.event_id IS NULL"
     " THEN 'not in the outbox' ELSE 'differs from the outbox' END) "
     "FROM soak_seen s LEFT JOIN state.outbox o ON o.event_id::text = s.payload->>'event_id' "
     "WHERE s.payload IS NULL OR o.event_id IS NULL OR o.payload <> s.payload OR o.subject <> s.subject",
     /* planted */
     "UPDATE soak_seen SET payload = payload || '{\"planted\": true}' WHERE n = (SELECT min(n) FROM "
     "soak_seen)"},

    {"every event published was seen",
     "SELECT coalesce(o.turn_id::text, '-'), format('%s event %s (%s) published at %s never seen', o.subject,"
     " o.event_id, o.payload->>'status', o.published_at) "
     "FROM state.outbox o WHERE o.published_at IS NOT NULL "
     "AND NOT EXISTS (SELECT 1 FROM soak_seen s WHERE s.payload->>'event_id' = o.event_id::text)",
     /* planted */
     "DELETE FROM soak_seen WHERE payload->>'event_id' = (SELECT event_id::text FROM state.outbox WHERE "
     "published_at IS NOT NULL LIMIT 1)"},

    {"outbox drained",
     "SELECT coalesce(turn_id::text, '-'), format('%s event %s never published', subject, event_id) "
     "FROM state.outbox WHERE published_at IS NULL",
     /* planted */
     "UPDATE state.outbox SET published_at = NULL WHERE event_id = (SELECT event_id FROM state.outbox "
     "LIMIT 1)"},

    {"no processing leftovers",
     "SELECT coalesce(turn_id::text, '-'), format('inbox %s (%s for %s, step %s) still processing, claimed "
     "by %s',"
     " inbox_id, message_type, target, step, claimed_by) FROM state.agent_inbox WHERE status = 'processing' "
     "UNION ALL SELECT turn_id::text, format('resume ledger %s (step %s) still processing, claimed by %s',"
     " ledger_id, step, claimed_by) FROM state.turn_resume_ledger WHERE status = 'processing'",
     /* planted */
     "UPDATE state.agent_inbox SET status = 'processing' WHERE inbox_id = (SELECT min(inbox_id) FROM "
     "state.agent_inbox)"},

    {"no open work after the end",
     "SELECT coalesce(turn_id::text, '-'), format('inbox %s (%s for %s, step %s) still pending', inbox_id,"
     " message_type, target, step) FROM state.agent_inbox WHERE status = 'pending' "
     "UNION ALL SELECT l.turn_id::text, format('resume ledger %s (step %s) pending', l.ledger_id, l.step) "
     "FROM state.turn_resume_ledger l WHERE l.status = 'pending' "
     "UNION ALL SELECT w.turn_id::text, format('call %s (step %s) still waiting', w.tool_call_id, w.step) "
     "FROM state.turn_waiting_tools w JOIN state.turns t USING (turn_id) "
     "WHERE w.wait_status = 'waiting' AND t.status IN " TERMINAL " "
     "UNION ALL SELECT coalesce(active_agent_turn_id::text, '-'), format('agent %s is %s', agent, status) "
     "FROM state.agents WHERE status <> 'idle' OR active_agent_turn_id IS NOT NULL",
     /* planted */
     "UPDATE state.agents SET status = 'running', active_agent_turn_id = (SELECT turn_id FROM state.turns "
     "LIMIT 1) WHERE agent = (SELECT min(agent) FROM state.agents)"},

    {"no effect from a stale epoch",
     "SELECT c.turn_id::text, format('%s card %s (step %s) made under epoch %s, the turn''s is %s',"
     " c.card_type, c.card_id, c.step, c.turn_epoch, t.turn_epoch) "
     "FROM state.cards c JOIN state.turns t USING (turn_id) WHERE c.turn_epoch IS DISTINCT FROM t.turn_epoch "
     "UNION ALL SELECT w.turn_id::text, format('call %s (step %s) made under epoch %s, the turn''s is %s',"
     " w.tool_call_id, w.step, w.turn_epoch, t.turn_epoch) "
     "FROM state.turn_waiting_tools w JOIN state.turns t USING (turn_id) WHERE w.turn_epoch <> t.turn_epoch "
     "UNION ALL SELECT i.turn_id::text, format('inbox %s (%s, step %s) applied under epoch %s, the turn''s "
     "is %s',"
     " i.inbox_id, i.message_type, i.step, i.turn_epoch, t.turn_epoch) "
     "FROM state.agent_inbox i JOIN state.turns t USING (turn_id) "
     "WHERE i.outcome = 'applied' AND i.turn_epoch IS DISTINCT FROM t.turn_epoch "
     "UNION ALL SELECT l.turn_id::text, format('resume ledger %s (step %s) applied under epoch %s, the "
     "turn''s is %s',"
     " l.ledger_id, l.step, l.turn_epoch, t.turn_epoch) "
     "FROM state.turn_resume_ledger l JOIN state.turns t USING (turn_id) "
     "WHERE l.outcome = 'applied' AND l.turn_epoch <> t.turn_epoch "
     "UNION ALL SELECT f.turn_id::text, format('force termination %s (%s) under epoch %s, the turn''s is %s',"
     " f.id, f.reason, f.turn_epoch, t.turn_epoch) "
     "FROM state.force_terminations f JOIN state.turns t USING (turn_id) "
     "WHERE f.turn_epoch IS DISTINCT FROM t.turn_epoch "
     "UNION ALL SELECT o.turn_id::text, format('%s event %s (%s) under epoch %s, the turn''s is %s', o.kind,"
     " o.event_id, o.payload->>'status', o.turn_epoch, t.turn_epoch) "
     "FROM state.outbox o JOIN state.turns t USING (turn_id) WHERE o.turn_epoch IS DISTINCT FROM "
     "t.turn_epoch "
     "AND NOT (o.kind = 'state' AND o.payload->>'status' = 'idle' AND o.turn_epoch = t.turn_epoch + 1) "
     /* A warning belongs to its deadline, not to an attempt: the turn deadline's is sent once for all of
      * them, at whatever epoch the turn has then (none while it is still pending). It must be an epoch the
      * turn had, as its history records it. */
     "AND NOT (o.kind = 'warning' AND EXISTS (SELECT 1 FROM state.turn_history h WHERE h.turn_id = o.turn_id "
     "AND h.turn_epoch IS NOT DISTINCT FROM o.turn_epoch)) "
     "UNION ALL SELECT t.turn_id::text, format('done at step %s under epoch %s, but its output was made at "
     "step %s"
     " under epoch %s', t.step, t.turn_epoch, c.content->'output'->>'step', c.content->'output'->>'epoch') "
     "FROM state.turns t JOIN state.cards c ON c.card_id = t.deliverable_card_id "
     "WHERE t.status = 'done' AND c.content ? 'output' "
     "AND ((c.content->'output'->>'epoch')::bigint IS DISTINCT FROM t.turn_epoch "
     "OR (c.content->'output'->>'step')::integer IS DISTINCT FROM t.step) "
     "UNION ALL SELECT x.turn_id::text, format('agent %s ran %s turns under epoch %s', x.agent, x.n, "
     "x.turn_epoch) "
     "FROM (SELECT turn_id, agent, turn_epoch, count(*) OVER (PARTITION BY agent, turn_epoch) AS n "
     "FROM state.turns WHERE turn_epoch IS NOT NULL) x WHERE x.n > 1",
     /* planted */
     "UPDATE state.cards SET turn_epoch = turn_epoch + 1 WHERE card_id = (SELECT card_id FROM state.cards "
     "WHERE turn_epoch IS NOT NULL LIMIT 1)"},

    {"each step and result applied once",
     "SELECT turn_id::text, format('step 0 applied %s times', count(*)) FROM state.agent_inbox "
     "WHERE message_type = 'turn' AND outcome = 'applied' GROUP BY turn_id HAVING count(*) > 1 "
     "UNION ALL SELECT turn_id::text, format('call %s (step %s) answered %s times', tool_call_id, step, "
     "count(*)) "
     "FROM state.agent_inbox WHERE message_type = 'tool.call' AND outcome = 'applied' "
     "GROUP BY turn_id, step, tool_call_id HAVING count(*) > 1 "
     "UNION ALL SELECT t.turn_id::text, format('ended by its agent at step %s after %s step-0 and %s resumed "
     "steps"
     " applied (last %s)', t.step, s0.n, r.n, r.last) FROM state.turns t "
     "CROSS JOIN LATERAL (SELECT count(*) AS n FROM state.agent_inbox i WHERE i.turn_id = t.turn_id"
     " AND i.message_type = 'turn' AND i.outcome = 'applied') s0 "
     "CROSS JOIN LATERAL (SELECT count(*) AS n, max(l.step) AS last FROM state.turn_resume_ledger l"
     " WHERE l.turn_id = t.turn_id AND l.outcome = 'applied') r "
     "WHERE (t.status = 'done' OR (t.status = 'failed' AND t.error IN ('agent_failed', 'agent_exit',"
     " 'step_timeout', 'bad_output', 'bad_tool_call'))) "
     "AND (s0.n <> 1 OR r.n <> t.step OR r.last IS DISTINCT FROM CASE WHEN t.step > 0 THEN t.step - 1 END)",
     /* planted */
     "INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step, status, "
     "outcome) SELECT target_kind, target, message_type, turn_id, turn_epoch, step, 'archived', 'applied' "
     "FROM state.agent_inbox WHERE message_type = 'turn' AND outcome = 'applied' LIMIT 1"},

    {"results reach their own call",
     "SELECT c.turn_id::text, format('result card %s for call %s (step %s) answers call %s of turn %s',"
     " c.card_id, c.tool_call_id, c.step, c.content->'output'->>'call', c.content->'output'->>'turn') "
     "FROM state.cards c WHERE c.card_type = 'tool.result' AND c.content->'output' ? 'call' "
     "AND (c.content->'output'->>'call' <> c.tool_call_id OR c.content->'output'->>'turn' <> "
     "c.turn_id::text) "
     "UNION ALL SELECT c.turn_id::text, format('result card %s for call %s (step %s) is not its call''s "
     "result',"
     " c.card_id, c.tool_call_id, c.step) FROM state.cards c LEFT JOIN state.turn_waiting_tools w "
     "ON w.turn_id = c.turn_id AND w.step = c.step AND w.tool_call_id = c.tool_call_id "
     "WHERE c.card_type = 'tool.result' AND w.result_card_id IS DISTINCT FROM c.card_id "
     "UNION ALL SELECT w.turn_id::text, format('call %s (step %s) is %s without its result card', "
     "w.tool_call_id,"
     " w.step, w.wait_status) FROM state.turn_waiting_tools w "
     "WHERE w.wait_status IN ('received', 'timeout') AND NOT EXISTS (SELECT 1 FROM state.cards c"
     " WHERE c.card_id = w.result_card_id AND c.turn_id = w.turn_id AND c.step = w.step"
     " AND c.tool_call_id = w.tool_call_id AND c.card_type = 'tool.result') "
     "UNION ALL SELECT w.turn_id::text, format('call %s (step %s) has no tool.call card', w.tool_call_id, "
     "w.step) "
     "FROM state.turn_waiting_tools w WHERE NOT EXISTS (SELECT 1 FROM state.cards c"
     " WHERE c.card_id = w.call_card_id AND c.turn_id = w.turn_id AND c.step = w.step"
     " AND c.tool_call_id = w.tool_call_id AND c.card_type = 'tool.call') "
     "UNION ALL SELECT e.turn_id::text, format('tool-result for %s was accepted (%s), the call is %s/%s', "
     "e.call,"
     " e.status, w.wait_status, w.result_status) FROM soak_ext e LEFT JOIN state.turn_waiting_tools w "
     "ON w.turn_id = e.turn_id AND w.tool_call_id = e.call WHERE e.result = 'accepted' "
     "AND (w.wait_status IS DISTINCT FROM 'received' OR w.result_status IS DISTINCT FROM e.status)",
     /* planted */
     "UPDATE state.cards SET content = jsonb_set(content, '{output,call}', '\"planted\"') WHERE card_id = "
     "(SELECT card_id FROM state.cards WHERE card_type = 'tool.result' AND content->'output' ? 'call' "
     "LIMIT 1)"},

    {"the agent resumed with the results of record",
     "SELECT t.turn_id::text, format('its last step saw %s; the calls of step %s are %s',"
     " c.content->'output'->'saw', t.step - 1, r.rec) FROM state.turns t "
     "JOIN state.cards c ON c.card_id = t.deliverable_card_id "
     "CROSS JOIN LATERAL (SELECT coalesce(jsonb_agg(jsonb_build_array(w.tool_call_id, "
     "coalesce(w.result_status,"
     " CASE w.wait_status WHEN 'cancelled' THEN 'cancelled' END)) ORDER BY w.call_index), '[]') AS rec"
     " FROM state.turn_waiting_tools w WHERE w.turn_id = t.turn_id AND w.step = t.step - 1) r "
     "WHERE t.status = 'done' AND c.content->'output' ? 'saw' AND c.content->'output'->'saw' <> r.rec",
     /* planted */
     "UPDATE state.turn_waiting_tools w SET result_status = CASE WHEN w.result_status = 'ok' THEN 'error' "
     "ELSE 'ok' END FROM (SELECT x.turn_id, x.step, x.tool_call_id FROM state.turn_waiting_tools x JOIN "
     "state.turns t ON t.turn_id = x.turn_id AND x.step = t.step - 1 JOIN state.cards c ON c.card_id = "
     "t.deliverable_card_id WHERE t.status = 'done' AND c.content->'output' ? 'saw' LIMIT 1) x WHERE "
     "w.turn_id = x.turn_id AND w.step = x.step AND w.tool_call_id = x.tool_call_id"},

    {"deliverable and force record fit the outcome",
     "SELECT t.turn_id::text, format('%s/%s: deliverable %s (fallback %s), %s force termination(s) (%s)',"
     " t.status, t.error, t.deliverable_card_id, c.content->>'fallback', f.n, f.reason) FROM state.turns t "
     "LEFT JOIN state.cards c ON c.card_id = t.deliverable_card_id "
     "CROSS JOIN LATERAL (SELECT count(*) AS n, min(x.reason) AS reason FROM state.force_terminations x"
     " WHERE x.turn_id = t.turn_id) f "
     "WHERE (t.deliverable_card_id IS NOT NULL AND (c.card_id IS NULL OR c.turn_id <> t.turn_id"
     "       OR c.card_type <> 'task.deliverable')) "
     "OR (t.status = 'done' AND (c.card_id IS NULL OR c.content->>'fallback' = 'true' OR f.n <> 0)) "
     "OR (t.status IN ('timeout', 'cancelled') AND (f.n <> 1 OR c.content->>'fallback' IS DISTINCT FROM "
     "'true'"
     "    OR f.reason IS DISTINCT FROM t.error)) "
     "OR (t.status = 'failed' AND f.n > 1) "
     "OR (t.status = 'failed' AND f.n = 1 AND (c.content->>'fallback' IS DISTINCT FROM 'true'"
     "    OR f.reason IS DISTINCT FROM t.error)) "
     "OR (t.status = 'failed' AND f.n = 0 AND t.deliverable_card_id IS NOT NULL)",
     /* planted */
     "INSERT INTO state.force_terminations (turn_id, agent, turn_epoch, reason) SELECT turn_id, agent, "
     "turn_epoch, 'planted' FROM state.turns WHERE status = 'done' LIMIT 1"},

    /* The history of a turn is a chain from its submit to its status: each row goes from where the one before
     * it went, so a status change without its row breaks the chain (contract section 11). */
    {"every status change has a history row",
     "WITH h AS (SELECT turn_id, id, from_status, to_status,"
     " lag(to_status) OVER (PARTITION BY turn_id ORDER BY id) AS prev,"
     " row_number() OVER (PARTITION BY turn_id ORDER BY id) AS n,"
     " row_number() OVER (PARTITION BY turn_id ORDER BY id DESC) AS back FROM state.turn_history) "
     "SELECT turn_id::text, format('history row %s goes from %s, but the row before it went to %s', id, "
     "from_status, prev) FROM h WHERE n > 1 AND from_status IS DISTINCT FROM prev "
     "UNION ALL SELECT turn_id::text, format('history starts from %s to %s, not at its submit', from_status, "
     "to_status) FROM h WHERE n = 1 AND (from_status IS NOT NULL OR to_status <> 'pending') "
     "UNION ALL SELECT t.turn_id::text, format('status %s, but its history ends at %s', t.status, "
     "coalesce(h.to_status, 'nothing')) FROM state.turns t LEFT JOIN h ON h.turn_id = t.turn_id AND h.back = "
     "1 "
     "WHERE h.to_status IS DISTINCT FROM t.status",
     /* planted */
     "DELETE FROM state.turn_history WHERE id = (SELECT max(id) FROM state.turn_history WHERE to_status = "
     "'done')"},

    /* A watchdog may end any turn: 2.6 reaps one whose worker stopped heartbeating (frozen, killed, cut off
     * from the database), 2.5 one that no worker took, and a step on a loaded machine (or whose worker was
     * frozen past its limit) reaches its time limit. Anything else must be the kind's own outcome, a deadline
     * the turn had, or a cancel the soak sent. */
    {"outcome explained by the plan",
     "SELECT t.turn_id::text, format('a %s turn ended %s/%s%s%s', p.kind, t.status, coalesce(t.error, '-'),"
     " CASE WHEN p.deadline THEN ' (it had a deadline)' ELSE '' END,"
     " CASE WHEN p.cancel_sent THEN ' (a cancel was sent)' ELSE '' END) "
     "FROM state.turns t JOIN soak_plan p ON p.turn_id = t.turn_id WHERE t.status IN " TERMINAL " "
     "AND NOT ((t.status = p.nat_status AND t.error IS NOT DISTINCT FROM p.nat_error) "
     "OR (t.status = 'failed' AND t.error IN ('timeout_reaped_by_watchdog', 'step_timeout')) "
     "OR (t.status = 'timeout' AND t.error = 'dispatch_timeout') "
     "OR (p.deadline AND t.status = 'timeout' AND t.error = 'turn_deadline_exceeded') "
     "OR (p.cancel_sent AND t.status = 'cancelled' AND t.error = 'cancelled')) "
     "UNION ALL SELECT t.turn_id::text, format('cancel answered cancelled, but the turn ended %s', t.status) "
     "FROM state.turns t JOIN soak_plan p ON p.turn_id = t.turn_id "
     "WHERE p.cancel_result = 'cancelled' AND t.status <> 'cancelled'",
     /* planted */
     "UPDATE state.turns SET status = 'failed', error = 'agent_failed' WHERE turn_id = (SELECT p.turn_id "
     "FROM soak_plan p JOIN state.turns t USING (turn_id) WHERE p.kind = 'done' AND t.status = 'done' "
     "LIMIT 1)"},
};
#define N_INVARIANTS (sizeof invariants / sizeof invariants[0])

/* ---- loading what the soak knows into temporary tables
 * -------------------------------------------------------- */

static bool exec_ok(PGconn *db, const char *sql, const char *param)
{
    const char *params[] = {param};
    /* Without a parameter, PQexec: the text may hold several statements. */
    PGresult *res = param ? PQexecParams(db, sql, 1, NULL, params, NULL, NULL, 0) : PQexec(db, sql);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "turnwatch-soak: check: %s\n", PQerrorMessage(db));
    PQclear(res);
    return ok;
}

static bool exec_json(PGconn *db, const char *sql, json_t *doc)
{
    char *text = json_dumps(doc, JSON_COMPACT);
    bool ok = text && exec_ok(db, sql, text);
    free(text);
    return ok;
}

static bool load_plan(ChaosRun *run, PGconn *db)
{
    json_t *plan = json_array(), *ext = json_array();
    bool ok;

    for (int i = 0; i < run->plan->n_turns; i++) {
        const ChaosTurnPlan *p = &run->plan->turns[i];
        const ChaosTurn *t = &run->turns[i];
        const ChaosKindInfo *k = chaos_kind_info(p->kind);
        json_array_append_new(
            plan, json_pack("{s:i,s:s?,s:s,s:s,s:s?,s:b,s:b,s:s?}", "idx", i, "answered_id",
                            t->id[0] ? t->id : NULL, "kind", k->name, "nat_status", k->status, "nat_error",
                            k->error, "deadline", p->timeout_sec > 0, "cancel_sent", t->cancel_tries > 0,
                            "cancel_result", t->cancel_result[0] ? t->cancel_result : NULL));
        for (int e = 0; e < p->n_ext; e++)
            if (t->id[0] && t->ext_result[e][0])
                json_array_append_new(
                    ext, json_pack("{s:s,s:s+,s:s,s:s}", "turn_id", t->id, "call", "ext", e ? "1" : "0",
                                   "status", p->ext[e].error ? "error" : "ok", "result", t->ext_result[e]));
    }
    ok = exec_json(
             db,
             "INSERT INTO soak_plan (idx, answered_id, kind, nat_status, nat_error, deadline, cancel_sent,"
             " cancel_result) SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(idx integer,"
             " answered_id uuid, kind text, nat_status text, nat_error text, deadline boolean,"
             " cancel_sent boolean, cancel_result text)",
             plan) &&
         /* A submit whose answer was lost (the CLI killed, the connection dropped after the commit) still
          * made its turn: the idempotency key says which. */
         exec_ok(db,
                 "UPDATE soak_plan p SET turn_id = t.turn_id FROM state.turns t"
                 " WHERE t.idempotency_key = 'soak-' || p.idx",
                 NULL) &&
         exec_json(
             db,
             "INSERT INTO soak_ext SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(turn_id uuid, call text,"
             " status text, result text)",
             ext);
    json_decref(plan);
    json_decref(ext);
    return ok;
}

static bool load_events(ChaosRun *run, PGconn *db)
{
    json_t *seen = chaos_events_json(run->events), *gaps = chaos_events_gaps(run->events);
    size_t n = json_array_size(seen);
    bool ok = true;

    for (size_t from = 0; ok && from < n; from += 5000) {
        json_t *chunk = json_array();
        for (size_t i = from; i < n && i < from + 5000; i++)
            json_array_append(chunk, json_array_get(seen, i));
        ok = exec_json(db,
                       "INSERT INTO soak_seen (subject, payload, source) SELECT e->>'subject', "
                       "(e->>'payload')::jsonb, e->>'source'"
                       " FROM jsonb_array_elements($1::jsonb) e",
                       chunk);
        json_decref(chunk);
    }
    ok = ok && exec_json(db,
                         "INSERT INTO soak_gaps SELECT to_timestamp((g->>0)::bigint / 1000.0),"
                         " to_timestamp((g->>1)::bigint / 1000.0) FROM jsonb_array_elements($1::jsonb) g",
                         gaps);
    json_decref(seen);
    json_decref(gaps);
    return ok && exec_ok(db, "CREATE INDEX ON soak_seen ((payload->>'event_id')); ANALYZE soak_seen", NULL);
}

static const char setup_sql[] =
    "CREATE TEMP TABLE soak_plan (idx integer, turn_id uuid, answered_id uuid, kind text, nat_status text,"
    " nat_error text,"
    " deadline boolean, cancel_sent boolean, cancel_result text);"
    "CREATE TEMP TABLE soak_ext (turn_id uuid, call text, status text, result text);"
    "CREATE TEMP TABLE soak_seen (n bigserial, subject text, payload jsonb, source text);"
    "CREATE TEMP TABLE soak_gaps (from_at timestamptz, to_at timestamptz);"
    /* An event published while the soak's own subscriber was reconnecting never reached it live, through no
     * fault of turnwatch (the stream has it): published_at comes after the server took the event (the
     * publisher's flush), so the window reaches a few seconds past the reconnect. For the statistics only. */
    "CREATE FUNCTION pg_temp.soak_away(p_at timestamptz) RETURNS boolean LANGUAGE sql STABLE AS"
    " $$ SELECT EXISTS (SELECT 1 FROM soak_gaps g WHERE p_at BETWEEN g.from_at - interval '1 second'"
    " AND g.to_at + interval '3 seconds') $$;";

/* ---- the table
 * ------------------------------------------------------------------------------------------------- */

static PGresult *query(PGconn *db, const char *sql)
{
    PGresult *res = PQexec(db, sql);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "turnwatch-soak: check: %s\n", PQerrorMessage(db));
        PQclear(res);
        return NULL;
    }
    return res;
}

static void print_outcomes(PGconn *db, FILE *out)
{
    static const char *statuses[] = {"done", "failed", "timeout", "cancelled"};
    long counts[CHAOS_KIND_N + 1][5] = {{0}};
    PGresult *res =
        query(db, "SELECT p.kind, coalesce(t.status, 'never submitted'), count(*) FROM soak_plan p "
                  "LEFT JOIN state.turns t ON t.turn_id = p.turn_id GROUP BY 1, 2");

    if (!res)
        return;
    for (int r = 0; r < PQntuples(res); r++) {
        int k = 0, s = 4;
        while (k < CHAOS_KIND_N && strcmp(chaos_kind_info((ChaosKind)k)->name, PQgetvalue(res, r, 0)) != 0)
            k++;
        for (int i = 0; i < 4; i++)
            if (strcmp(statuses[i], PQgetvalue(res, r, 1)) == 0)
                s = i;
        long n = atol(PQgetvalue(res, r, 2));
        counts[k][s] += n;
        counts[CHAOS_KIND_N][s] += n;
    }
    PQclear(res);
    fprintf(out, "turns by kind and outcome\n  %-10s %7s %7s %7s %7s %9s %7s\n", "kind", "total", "done",
            "failed", "timeout", "cancelled", "open");
    for (int k = 0; k <= CHAOS_KIND_N; k++) {
        long total = 0;
        for (int s = 0; s < 5; s++)
            total += counts[k][s];
        fprintf(out, "  %-10s %7ld %7ld %7ld %7ld %9ld %7ld\n",
                k < CHAOS_KIND_N ? chaos_kind_info((ChaosKind)k)->name : "all", total, counts[k][0],
                counts[k][1], counts[k][2], counts[k][3], counts[k][4]);
    }
    if ((res = query(db, "SELECT status || '/' || coalesce(error, '-'), count(*) FROM state.turns "
                         "WHERE status <> 'done' OR error IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1"))) {
        fprintf(out, "outcomes other than done, by error\n");
        for (int r = 0; r < PQntuples(res); r++)
            fprintf(out, "  %-40s %7s\n", PQgetvalue(res, r, 0), PQgetvalue(res, r, 1));
        PQclear(res);
    }
}

static void print_faults(const ChaosRun *run, FILE *out)
{
    fprintf(out, "faults injected%*s%7s %7s\n", 26, "", "done", "skipped");
    for (int k = 0; k < CHAOS_FAULT_N; k++)
        fprintf(out, "  %-38s %7d %7d\n", chaos_fault_label(run, (ChaosFaultKind)k), run->faults_done[k],
                run->faults_skipped[k]);
}

static void print_events(PGconn *db, FILE *out)
{
    PGresult *res = query(
        db, "SELECT (SELECT count(*) FROM state.outbox),"
            " (SELECT count(*) FROM soak_seen WHERE source = 'live'),"
            " (SELECT count(DISTINCT payload->>'event_id') FROM soak_seen WHERE source = 'live'),"
            " (SELECT count(*) FROM soak_seen WHERE source = 'stream'),"
            " (SELECT count(DISTINCT payload->>'event_id') FROM soak_seen WHERE source = 'stream'),"
            " (SELECT count(*) FROM soak_gaps),"
            " (SELECT coalesce(sum(extract(epoch FROM to_at - from_at)), 0)::numeric(10,1) FROM soak_gaps),"
            " (SELECT count(*) FROM state.outbox o WHERE NOT EXISTS (SELECT 1 FROM soak_seen s"
            "  WHERE s.source = 'live' AND s.payload->>'event_id' = o.event_id::text)),"
            " (SELECT count(*) FROM state.outbox o WHERE pg_temp.soak_away(o.published_at) AND NOT EXISTS"
            "  (SELECT 1 FROM soak_seen s WHERE s.source = 'live' AND s.payload->>'event_id' = "
            "o.event_id::text))");
    if (!res)
        return;
    fprintf(out,
            "events: %s in the outbox; %s delivered live (%s distinct), %s kept in the stream (%s distinct)\n"
            "  the soak's subscriber was away %s times (%s s); %s events not delivered to it live, %s of them"
            " published while it was away\n",
            PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3),
            PQgetvalue(res, 0, 4), PQgetvalue(res, 0, 5), PQgetvalue(res, 0, 6), PQgetvalue(res, 0, 7),
            PQgetvalue(res, 0, 8));
    PQclear(res);
}

/* ---- the checker's self-test
 * ---------------------------------------------------------------------------------- */

/* Each invariant must see a violation planted in this very database (in a transaction rolled back
 * afterwards): a check that cannot fail proves nothing. Returns how many did not see theirs; prints the
 * result. */
static int self_test(PGconn *db, FILE *out)
{
    int caught = 0, missed = 0, nothing = 0;

    for (size_t i = 0; i < N_INVARIANTS; i++) {
        PGresult *res;
        bool planted;

        if (!exec_ok(db, "BEGIN", NULL))
            return 1;
        res = PQexec(db, invariants[i].plant);
        planted = PQresultStatus(res) == PGRES_COMMAND_OK && atoi(PQcmdTuples(res)) > 0;
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            fprintf(stderr, "turnwatch-soak: self-test of \"%s\": %s", invariants[i].name,
                    PQerrorMessage(db));
        PQclear(res);
        if (planted) {
            res = PQexec(db, invariants[i].sql);
            if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0) {
                caught++;
            } else {
                missed++;
                fprintf(out, "checker self-test: \"%s\" did not see the violation planted for it\n",
                        invariants[i].name);
            }
            PQclear(res);
        } else {
            nothing++;
        }
        exec_ok(db, "ROLLBACK", NULL);
    }
    fprintf(out, "checker self-test: %d of %zu invariants saw the violation planted for them", caught,
            N_INVARIANTS);
    if (nothing)
        fprintf(out, " (%d had nothing to plant it on in this run)", nothing);
    fprintf(out, "\n");
    return missed;
}

/* ---- the verdict
 * ----------------------------------------------------------------------------------------------- */

typedef struct Verdict {
    const char *name;
    int n;
    json_t *rows; /* [[turn, what]] */
} Verdict;

static void add_turn(json_t *ids, const char *id)
{
    if (strcmp(id, "-") != 0)
        json_object_set_new(ids, id, json_true());
}

int chaos_check(ChaosRun *run, FILE *out)
{
    const char *keys[] = {"dbname", "application_name", NULL};
    const char *vals[] = {run->opt.dsn, "turnwatch-soak check", NULL};
    PGconn *db = PQconnectdbParams(keys, vals, 1);
    Verdict v[N_INVARIANTS + 1];
    json_t *ids = json_object();
    int total = 0, failed_queries = 0;
    char path[PATH_MAX];
    FILE *all;

    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "turnwatch-soak: check: cannot connect: %s", PQerrorMessage(db));
        PQfinish(db);
        json_decref(ids);
        return -1;
    }
    if (!exec_ok(db, setup_sql, NULL) || !load_plan(run, db) || !load_events(run, db)) {
        PQfinish(db);
        json_decref(ids);
        return -1;
    }
    for (size_t i = 0; i < N_INVARIANTS; i++) {
        PGresult *res = query(db, invariants[i].sql);
        v[i].name = invariants[i].name;
        v[i].rows = json_array();
        if (!res) {
            json_array_append_new(v[i].rows, json_pack("[s,s]", "-", "the check query failed (see above)"));
            failed_queries++;
        }
        for (int r = 0; res && r < PQntuples(res); r++) {
            json_array_append_new(v[i].rows,
                                  json_pack("[s,s]", PQgetvalue(res, r, 0), PQgetvalue(res, r, 1)));
            add_turn(ids, PQgetvalue(res, r, 0));
        }
        PQclear(res);
        v[i].n = (int)json_array_size(v[i].rows);
    }
    /* What happened outside the database: a daemon that died on its own or did not stop cleanly. */
    v[N_INVARIANTS].name = "no crash, unclean stop or unreadable stream";
    v[N_INVARIANTS].rows = json_array();
    for (size_t i = 0; i < json_array_size(run->incidents); i++) {
        json_t *inc = json_array_get(run->incidents, i);
        json_array_append_new(v[N_INVARIANTS].rows,
                              json_pack("[s,s++]", "-", json_string_value(json_object_get(inc, "what")), ": ",
                                        json_string_value(json_object_get(inc, "detail"))));
    }
    v[N_INVARIANTS].n = (int)json_array_size(v[N_INVARIANTS].rows);

    print_outcomes(db, out);
    print_faults(run, out);
    print_events(db, out);
    fprintf(out, "invariants%*s%s\n", 44, "", "violations");
    for (size_t i = 0; i <= N_INVARIANTS; i++) {
        fprintf(out, "  %-50s %10d\n", v[i].name, v[i].n);
        total += v[i].n;
    }
    total += self_test(db, out);
    snprintf(path, sizeof path, "%s/violations.txt", run->opt.dir);
    all = fopen(path, "w");
    for (size_t i = 0; i <= N_INVARIANTS; i++) {
        if (!v[i].n)
            continue;
        fprintf(out, "violations of \"%s\" (%d)%s:\n", v[i].name, v[i].n,
                v[i].n > SHOW_PER_INVARIANT ? ", the first few" : "");
        for (size_t r = 0; r < json_array_size(v[i].rows); r++) {
            json_t *row = json_array_get(v[i].rows, r);
            const char *turn = json_string_value(json_array_get(row, 0));
            const char *what = json_string_value(json_array_get(row, 1));
            if (r < SHOW_PER_INVARIANT)
                fprintf(out, "  %s  %s\n", turn, what);
            if (all)
                fprintf(all, "%s\t%s\t%s\n", v[i].name, turn, what);
        }
        json_decref(v[i].rows);
        v[i].rows = NULL;
    }
    for (size_t i = 0; i <= N_INVARIANTS; i++)
        json_decref(v[i].rows);
    if (all)
        fclose(all);
    if (json_object_size(ids)) {
        const char *id;
        json_t *val;
        fprintf(out, "violating turns (%zu):", json_object_size(ids));
        json_object_foreach(ids, id, val) fprintf(out, " %s", id);
        fprintf(out, "\n");
    }
    if (total)
        fprintf(out, "every violation: %s\n", path);
    json_decref(ids);
    PQfinish(db);
    return failed_queries && !total ? -1 : total;
}
