/* The soak's invariants (docs/soak.md, and a few more that the tables let us check): each one SQL
 * query over the database at rest and the temporary tables check.c loads with what the soak knows (its plan,
 * what the CLI answered, every event NATS delivered), returning one row per violation: the turn and what is
 * wrong; and a statement that plants one violation, for the checker's self-test. */
#include "chaos.h"

#include <stddef.h>

#define TERMINAL "('done', 'failed', 'timeout', 'cancelled')"

/* Effects are judged against the turn's epoch: a turn runs under one epoch from its dispatch to its end (the
 * idle state event of a forced end carries the agent's epoch after the bump, one more). Once retries exist
 * (docs/timeouts.md), a turn has one epoch per attempt and these comparisons become "an epoch the turn had
 * while the effect was made": the turn's history table will say which. */
static const ChaosInvariant invariants[] = {
    {"every turn terminal",
     "SELECT turn_id::text, format('status %s (epoch %s, step %s)', status, turn_epoch, step) FROM "
     "state.turns "
     "WHERE status NOT IN " TERMINAL,
     /* planted */
     "UPDATE state.turns SET status = 'running' WHERE turn_id = (SELECT turn_id FROM state.turns LIMIT 1)"},

    {"one turn per submit",
     "SELECT t.turn_id::text, format('not a turn of the plan (idempotency key %s)', t.idempotency_key) "
     "FROM state.turns t WHERE NOT EXISTS (SELECT 1 FROM soak_plan p WHERE p.turn_id = t.turn_id) "
     "AND t.channel_id <> 'schedule:" CHAOS_SCHEDULE "' "
     "UNION ALL SELECT coalesce(answered_id::text, '-'), format('plan turn %s (key soak-%s): submit answered "
     "%s,"
     " the key names %s', idx, idx, answered_id, turn_id) FROM soak_plan "
     "WHERE turn_id IS NULL OR answered_id IS DISTINCT FROM turn_id AND answered_id IS NOT NULL",
     /* planted: a copy of a turn of the plan (a copy of a schedule's turn would be one of the schedule's) */
     "INSERT INTO state.turns (agent, profile, channel_id, input, status) SELECT agent, profile, channel_id, "
     "input, 'done' FROM state.turns WHERE channel_id <> 'schedule:" CHAOS_SCHEDULE "' LIMIT 1"},

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
     "FROM state.outbox o WHERE o.published_at IS NOT NULL AND o.subject LIKE 'evt.agent.%' "
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
     * it went, so a status change without its row breaks the chain (docs/timeouts.md). */
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

    /* Flow control: at no instant more calls of a limit running than its max_concurrent. A limited call runs
     * from its start (its claim, after its grant) to its settling (in the transaction that gives the slot
     * back), and each earlier try of a call that said rate_limited in its own span: those spans lie within
     * the grants, so their overlap bounds the holders from below. Ends before starts at one instant. */
    {"never more holders than a limit's cap",
     "WITH s AS (SELECT l.name::text AS name, l.max_concurrent AS cap, x.a, x.b, w.turn_id"
     "             FROM state.limits l JOIN state.turn_waiting_tools w ON w.limits @> ARRAY[l.name::text]"
     "            CROSS JOIN LATERAL (SELECT w.started_at AS a, w.settled_at AS b WHERE w.started_at IS NOT "
     "NULL"
     "                                UNION ALL SELECT (t ->> 'started_at')::timestamptz,"
     "                                                 (t ->> 'ended_at')::timestamptz"
     "                                  FROM jsonb_array_elements(coalesce(w.tries, '[]')) t"
     "                                 WHERE t ->> 'started_at' IS NOT NULL) x"
     "            WHERE l.max_concurrent > 0 AND NOT l.per_key), "
     "e AS (SELECT name, cap, turn_id, a AS at, 1 AS d FROM s UNION ALL SELECT name, cap, turn_id, b, -1 "
     "FROM s "
     "       WHERE b IS NOT NULL), "
     "r AS (SELECT name, cap, turn_id, at, d, sum(d) OVER (PARTITION BY name ORDER BY at, d ROWS UNBOUNDED "
     "       PRECEDING) AS held FROM e) "
     "SELECT turn_id::text, format('%s calls held limit %s (max_concurrent %s) at %s', held, name, cap, at) "
     "FROM r WHERE d = 1 AND held > cap",
     /* planted: two calls of one run at the same time under a cap of 1 */
     "WITH l AS (INSERT INTO state.limits (name, max_concurrent) VALUES ('soak_plant', 1) RETURNING name) "
     "UPDATE state.turn_waiting_tools w SET limits = ARRAY['soak_plant'], started_at = '2000-01-01', "
     "settled_at = '2000-01-02' FROM l WHERE (w.turn_id, w.step, w.tool_call_id) IN "
     "(SELECT turn_id, step, tool_call_id FROM state.turn_waiting_tools LIMIT 2)"},

    /* Schedules (docs/schedules.md): the soak's schedule fired every minute through the faults. Every tick is
     * recorded, fired or skipped (catchup: no PMO reached it within 60 s), so the ticks follow one another
     * minute by minute from the first after the schedule was made to the last before the driver took them
     * (one minute of slack); each fired tick has its one turn, whose idempotency key is the tick's, and no
     * other turn is on the schedule's channel; each tick has one event in the outbox. */
    {"no tick fired twice, none lost while a PMO ran",
     "WITH k AS (SELECT tick_at, turn_id, skipped, error, created_at, taken_at,"
     "                  lag(tick_at) OVER (ORDER BY tick_at) AS prev FROM soak_ticks) "
     "SELECT '-', format('tick %s follows %s', tick_at, prev) FROM k WHERE prev IS NOT NULL"
     "   AND tick_at <> prev + interval '1 minute' "
     "UNION ALL SELECT '-', format('first tick %s, made at %s', min(tick_at), min(created_at)) FROM k"
     " HAVING min(tick_at) <> date_trunc('minute', min(created_at)) + interval '1 minute' "
     "UNION ALL SELECT '-', format('last tick %s, taken at %s', max(tick_at), max(taken_at)) FROM k"
     " HAVING max(tick_at) < date_trunc('minute', max(taken_at)) - interval '1 minute' "
     "UNION ALL SELECT coalesce(turn_id::text, '-'), format('tick %s skipped %s %s', tick_at, skipped, error)"
     " FROM k WHERE skipped IS NOT NULL AND skipped <> 'catchup' "
     "UNION ALL SELECT coalesce(k.turn_id::text, '-'), format('tick %s names a turn that is not its own', "
     "k.tick_at) FROM k LEFT JOIN state.turns t ON t.turn_id = k.turn_id AND t.idempotency_key = "
     "'schedule:" CHAOS_SCHEDULE
     ":' || to_char(k.tick_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
     "WHERE k.turn_id IS NOT NULL AND t.turn_id IS NULL "
     "UNION ALL SELECT t.turn_id::text, format('turn %s of the schedule (key %s) fired by no tick', "
     "t.turn_id,"
     " t.idempotency_key) FROM state.turns t WHERE t.channel_id = 'schedule:" CHAOS_SCHEDULE "'"
     "   AND NOT EXISTS (SELECT 1 FROM soak_ticks k WHERE k.turn_id = t.turn_id) "
     "UNION ALL SELECT '-', format('tick %s: %s events in the outbox', k.tick_at, count(o.event_id)) FROM k"
     " LEFT JOIN state.outbox o ON o.kind = 'schedule_tick' AND o.subject = 'evt.schedule." CHAOS_SCHEDULE
     ".tick' AND (o.payload ->> 'tick_at')::timestamptz = k.tick_at GROUP BY k.tick_at HAVING "
     "count(o.event_id) <> 1",
     /* planted: a tick lost in the middle, or the only one lost */
     "DELETE FROM soak_ticks WHERE tick_at = (SELECT max(tick_at) FROM soak_ticks)"},
};

_Static_assert(sizeof invariants / sizeof invariants[0] <= CHAOS_MAX_INVARIANTS,
               "raise CHAOS_MAX_INVARIANTS");

const ChaosInvariant *chaos_invariant(size_t i)
{
    return i < sizeof invariants / sizeof invariants[0] ? &invariants[i] : NULL;
}
