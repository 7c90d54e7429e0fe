#!/usr/bin/env bash
# tools/bench lag — how late the watchdogs act (a benchmark, not a test; docs/watchdogs.md). Release build,
# throwaway PostgreSQL and nats-server, one turnwatch-pmo and two turnwatch-workers (plus one that is frozen and
# short-lived ones that are killed), watchdog_interval_seconds at the shipped 5 s, rule timeouts short so that
# each rule acts many times in a few seconds. It prints:
#   1. lateness per rule (database clock at the action minus its due time, from the daemons' action lines):
#      median, p99 and max, with 10,000 turn deadlines waiting meanwhile;
#   2. crash -> re-claim: a worker holding a step is killed with SIGKILL, N times; the time from the kill to the
#      step's new claim by another worker (processed_at on the database clock, the same host's clock);
#   3. idle CPU of each daemon and of PostgreSQL with 100,000 deadlines waiting and nothing due.
# Between 1 and 2: turns that run later (rule retry_due, timer not_before), 20 one at a time and 1,000 due at one
#   instant (twice), and schedules every minute, the lateness of their ticks: 10 on one minute boundary, then 10,000
#   (one expression), then 10,000 (each its own).
# Usage: tools/bench lag [--kills N] [--idle-seconds S]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=tools/lib/servers.sh
source tools/lib/servers.sh

kills=20
idle=30
while (($#)); do
    case $1 in
        --kills) kills=${2:?}; shift ;;
        --idle-seconds) idle=${2:?}; shift ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) tw_die "unknown argument $1 (try --help)" ;;
    esac
    shift
done

tw_bench_build "$root"
# The commit time of a dispatch (section 9's lateness: commit time - due) is read from its history row's xmin.
export TW_PG_CONF="track_commit_timestamp = on"
tw_bench_servers

agent_exec=$build/examples/agents/tw-test-agent
list() { local p=$1 n=$2; for i in $(seq -f '%02g' 1 "$n"); do printf '%s%s,' "$p" "$i"; done; }
ini=$TW_TMP/lag.ini
{
    printf '[postgres]\ndsn = %s\n[nats]\nurl = %s\n' "$TW_PG_DSN" "$TW_NATS_URL"
    printf '[pmo]\nwatchdog_interval_seconds = 5\ndispatched_retry_seconds = 2\ndispatched_timeout_seconds = 3\n'
    printf 'pending_wakeup_seconds = 1\npending_wakeup_skip_seconds = 300\nactive_reap_seconds = 8\n'
    printf '[worker]\nwatchdog_interval_seconds = 5\ninbox_processing_timeout_seconds = 4\nheartbeat_seconds = 1\n'
    printf 'suspend_timeout_seconds = 1\nconcurrency = 32\n'
    printf 'agents = %s%sc,p0,p1,p2,p3,p4,p5,p6,p7,p8,p9\n' "$(list t 20)" "$(list b 200)"
    for a in $(list t 20 | tr , ' ') $(list u 20 | tr , ' ') $(list f 20 | tr , ' ') $(list b 200 | tr , ' ') \
        c p0 p1 p2 p3 p4 p5 p6 p7 p8 p9; do
        printf '[agent.%s]\nexec = %s\n' "$a" "$agent_exec"
    done
    printf '[tool.ext]\nexternal = true\ntimeout_seconds = 1\nsuspend_timeout_seconds = 1\n'
    # Re-rings past 20 per 10 s are logged at debug only: this reads every action's lateness.
    printf '[log]\nlevel = debug\n'
    printf '[tool.hold]\nexternal = true\ntimeout_seconds = 7200\nsuspend_timeout_seconds = 7200\n'
} >"$ini"
sed -e "s/^agents = .*/agents = $(list f 20 | sed 's/,$//')/" -e 's/^concurrency = .*/concurrency = 20/' "$ini" >"$TW_TMP/frozen.ini"
sed -e 's/^agents = .*/agents = c/' "$ini" >"$TW_TMP/crash.ini"
"$build/tools/turnwatch" -c "$ini" migrate >&2

started=
start() { # start BINARY INI LOGNAME: a daemon in the background (stopped on exit); its pid in $started
    "$build/$1" -c "$2" </dev/null >/dev/null 2>>"$TW_TMP/$3.log" &
    started=$!
    tw_on_exit "tw_stop_pid $started"
}
start pmo/turnwatch-pmo "$ini" pmo; pmo=$started
start worker/turnwatch-worker "$ini" wa; wa=$started
start worker/turnwatch-worker "$ini" wb; wb=$started
start worker/turnwatch-worker "$TW_TMP/frozen.ini" frozen; frz=$started
sleep 1

submit_sql() { # agent input timeout -> a statement
    printf "SELECT tw.submit_turn('%s', 'lag', '%s'::jsonb, %s);\n" "$1" "$2" "$3"
}
hold='{"mode":"tools","calls":[{"id":"h","tool":"hold","args":{}}]}'
park() { # park N: each of p0..p9 waits an hour on an external call; N turns each queue behind it with 1 h deadlines
    local n=$1
    psql_q -c "SELECT count(*) FROM (SELECT tw.submit_turn('p' || (i % 10), 'lag', '{\"mode\":\"complete\"}'::jsonb, 3600)
               FROM generate_series(1, $n * 10) i) x" >/dev/null
}
echo "machine: $(nproc) cores; PostgreSQL $(psql --version | awk '{print $3}') (fsync off); one pmo, two workers; watchdog_interval_seconds = 5 (shipped)"
for p in 0 1 2 3 4 5 6 7 8 9; do submit_sql "p$p" "$hold" NULL; done | psql_q >/dev/null
sleep 1
park 1000
echo "waiting deadlines: $(psql_q -c "SELECT count(*) FROM state.turns WHERE deadline_at IS NOT NULL AND status IN ('pending','dispatched','running','suspended')")"

# ---- 1. lateness per rule ------------------------------------------------------------------------------------------

# 2.2: twenty agents, ten turns each, every turn waits for an external call nobody answers (1 s).
for a in $(list t 20 | tr , ' '); do
    for _ in $(seq 10); do submit_sql "$a" '{"mode":"tools","calls":[{"id":"e1","tool":"ext","args":{}}]}' NULL; done
done | psql_q >/dev/null &
loads=($!)
# 2.4, 2.5, 2.7: twenty agents no worker serves, three turns each (re-rung at 1-2 s, reaped at 3 s, next).
for a in $(list u 20 | tr , ' '); do
    for _ in 1 2 3; do submit_sql "$a" '{"mode":"complete"}' NULL; done
done | psql_q >/dev/null &
loads+=($!)
# Turn deadlines: 300 turns with a 2 s deadline, submitted 20 ms apart so that their due times are spread.
for i in $(seq 300); do submit_sql "p$((i % 10))" '{"mode":"complete"}' 2; echo "SELECT pg_sleep(0.02);"; done |
    psql_q >/dev/null &
loads+=($!)
# 2.1 and 2.6: twenty steps on a worker that then freezes (SIGSTOP): leases expire after 4 s, turns reaped at 8 s.
for a in $(list f 20 | tr , ' '); do submit_sql "$a" '{"mode":"sleep","seconds":60}' NULL; echo "SELECT pg_sleep(0.05);"; done |
    psql_q >/dev/null
for _ in $(seq 100); do
    n=$(psql_q -c "SELECT count(*) FROM state.agent_inbox WHERE status = 'processing' AND target LIKE 'f%'")
    ((n >= 20)) && break
    sleep 0.1
done
kill -STOP "$frz"
wait "${loads[@]}"
sleep 15
kill -CONT "$frz"
echo "lateness (ms) = database clock at the action - due time; $(psql_q -c "SELECT count(*) FROM state.turns WHERE deadline_at IS NOT NULL AND status IN ('pending','dispatched','running','suspended')") deadlines still waiting"
# lateness: the action lines on stdin, per rule: median, p99 and max lateness.
lateness() {
    python3 -c '
import json, re, sys
by = {}
for line in sys.stdin:
    m = re.search(r"watchdog rule=\"([^\"]+)\" (\{.*\})$", line.rstrip())
    if not m:
        continue
    a = json.loads(m.group(2))
    if "lateness_ms" in a:
        by.setdefault(m.group(1), []).append((a["lateness_ms"], m.group(2)))
for rule in sorted(by):
    v = sorted(x[0] for x in by[rule])
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    print(f"  {rule:38s} n={len(v):5d}  median={q(0.5):4d}  p99={q(0.99):5d}  max={v[-1]:5d}")
    if v[-1] > 50:  # what the latest action was, to explain a tail
        print(f"      latest: {max(by[rule])[1][:300]}")
'
}
logs=("$TW_TMP"/pmo.log "$TW_TMP"/wa.log "$TW_TMP"/wb.log "$TW_TMP"/frozen.log)
cat "${logs[@]}" | lateness

# ---- 1b. many due at one instant --------------------------------------------------------------------------------
# 200 tool calls whose deadlines fall at one instant (200 agents, a turn each, waiting on an external call; once all
# wait, the bench moves their 2 h deadlines to one instant 2 s ahead, in one statement) and 200 turn deadlines at one
# instant (200 turns queued behind p0..p9's held turns, submitted in one statement with a 3 s deadline).
declare -A mark
for f in "${logs[@]}"; do mark[$f]=$(wc -l <"$f"); done
for a in $(list b 200 | tr , ' '); do
    submit_sql "$a" '{"mode":"tools","calls":[{"id":"w","tool":"hold","args":{}}]}' NULL
done | psql_q >/dev/null
for _ in $(seq 300); do
    n=$(psql_q -c "SELECT count(*) FROM state.turns WHERE agent LIKE 'b%' AND status = 'suspended'")
    ((n >= 200)) && break
    sleep 0.1
done
((n >= 200)) || tw_die "only $n of 200 turns wait on their tool call after 30 s"
psql_q -c "WITH w AS (UPDATE state.turn_waiting_tools w SET deadline_at = now() + interval '2 s'
                       FROM state.turns t WHERE t.turn_id = w.turn_id AND t.agent LIKE 'b%' AND w.wait_status = 'waiting'
                       RETURNING w.turn_id)
           UPDATE state.turns SET resume_deadline = now() + interval '2 s' WHERE turn_id IN (SELECT turn_id FROM w)" >/dev/null
# The workers learn of the earlier due time as from another daemon: cmd.worker.wakeup (NATS protocol, by hand).
exec 3<>"/dev/tcp/127.0.0.1/$TW_NATS_PORT"
printf 'CONNECT {"verbose":false}\r\nPUB cmd.worker.wakeup 2\r\n{}\r\nPING\r\n' >&3
timeout 5 grep -q -m 1 PONG <&3 || tw_die "nats-server did not take cmd.worker.wakeup"
exec 3<&-
psql_q -c "SELECT count(*) FROM tw.submit_turns(ARRAY(SELECT 'p' || (i % 10) FROM generate_series(1, 200) i),
                                                array_fill('lag'::text, ARRAY[200]),
                                                array_fill('{\"mode\":\"complete\"}'::jsonb, ARRAY[200]),
                                                array_fill(3, ARRAY[200]))" >/dev/null
sleep 6
echo "200 tool-call deadlines and 200 turn deadlines due at one instant each: lateness (ms)"
for f in "${logs[@]}"; do tail -n +"$((mark[$f] + 1))" "$f"; done | lateness

# ---- 1c. turns that run later -----------------------------------------------------------------------------------------
mark_logs() { for f in "${logs[@]}"; do mark[$f]=$(wc -l <"$f"); done; }
new_lines() { for f in "${logs[@]}"; do tail -n +"$((mark[$f] + 1))" "$f"; done; }
# later_turns N PREFIX TIMES: N idle agents PREFIX1..PREFIXN of profile t01 (the roster), a turn each submitted in one
# statement to run at TIMES (an SQL array of N times: not_before, docs/schedules.md).
later_turns() {
    psql_q -c "SELECT count(tw.add_agent('$2' || i, 't01')) FROM generate_series(1, $1) i" >/dev/null
    psql_q -c "SELECT count(*) FROM tw.submit_turns(ARRAY(SELECT '$2' || i FROM generate_series(1, $1) i),
                                                    array_fill('lag'::text, ARRAY[$1]),
                                                    array_fill('{\"mode\":\"complete\"}'::jsonb, ARRAY[$1]),
                                                    NULL, NULL, NULL, NULL, $3)" >/dev/null
}
# after_time COLUMN PREFIX: COLUMN - not_before over the later turns of the agents PREFIX*. dispatched_at is the
# dispatching transaction's start; a worker sees the turn at that transaction's commit, and started_at (its claim)
# is after: the lateness a user sees.
after_time() {
    psql_q -c "SELECT format('  $1 - not_before (ms) n=%s  median=%s  p99=%s  max=%s', count(*),
                             round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)),
                             round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)), round(max(ms)))
                 FROM (SELECT extract(epoch FROM $1 - not_before) * 1000 AS ms FROM state.turns
                        WHERE agent LIKE '$2%' AND not_before IS NOT NULL AND $1 IS NOT NULL) x"
}
# One at a time: 20 turns, each due 150 ms after the one before (rule retry_due, as for a `submit --in`).
mark_logs
later_turns 20 one "ARRAY(SELECT now() + interval '1 s' + i * interval '150 ms' FROM generate_series(1, 20) i)"
sleep 6
echo "20 turns that run later, one at a time: lateness (ms)"
new_lines | grep '"timer":"not_before"' | lateness
after_time started_at one
# Many at one instant: 1,000 turns due 3 s ahead, twice: the first burst is the first time the PMO's second
# watchdog connection dispatches (the runs of retry_due share a burst, docs/schedules.md), the second finds both
# connections' plans built.
later_burst() {
    mark_logs
    later_turns 1000 "$1" "array_fill(now() + interval '3 s', ARRAY[1000])"
    sleep 8
    echo "1,000 turns that run later, due at one instant ($2): lateness (ms)"
    new_lines | grep '"timer":"not_before"' | lateness
    after_time dispatched_at "$1"
    # The commit of the transaction that dispatched each: when a worker could see it.
    psql_q -c "SELECT format('  dispatch commit - not_before (ms) n=%s  median=%s  p99=%s  max=%s', count(*),
                             round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)),
                             round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)), round(max(ms)))
                 FROM (SELECT extract(epoch FROM pg_xact_commit_timestamp(h.xmin) - t.not_before) * 1000 AS ms
                         FROM state.turns t JOIN state.turn_history h ON h.turn_id = t.turn_id
                                                                   AND h.to_status = 'dispatched'
                        WHERE t.agent LIKE '$1%' AND t.not_before IS NOT NULL) x"
    after_time started_at "$1"
}
later_burst ba "the first burst"
later_burst bb "the second"

# ---- 1d. schedules on one minute boundary -----------------------------------------------------------------------
# Lateness of each tick (the PMO's schedule_ticks action lines: database clock at the action minus the tick's
# time). First 10 schedules every minute, alone on their boundary (up to a minute's wait), then 10,000
# (docs/schedules.md) on the next, their turns queued behind p0..p9's held turns: all with one expression, then
# each with an expression of its own that also means every minute (minute, hour and day of month written as two
# ranges split at a point of their own: the rule computes the following tick once per distinct expression).
# tick_schedules N PREFIX SECONDS [distinct]: N schedules every minute, until each has ticked once (at most SECONDS).
tick_schedules() {
    local cron="'* * * * *'" what=""
    if [[ ${4:-} == distinct ]]; then
        cron="format('0-%s,%s-59 0-%s,%s-23 1-%s,%s-31 * *', i % 59, i % 59 + 1, (i / 59) % 23, (i / 59) % 23 + 1,
                     1 + (i / 1357) % 29, 2 + (i / 1357) % 29)"
        what=", each its own expression"
    fi
    mark_logs
    psql_q -c "SELECT count(*) FROM (SELECT tw.add_schedule('$2' || i, 'p' || (i % 10), $cron,
                                                            p_overlap => 'queue')
                                       FROM generate_series(1, $1) i) x" >/dev/null
    for _ in $(seq "$(($3 * 10))"); do
        n=$(psql_q -c "SELECT count(*) FROM state.schedule_ticks")
        ((n >= $1)) && break
        sleep 0.1
    done
    ((n >= $1)) || tw_die "only $n of $1 schedules ticked within $3 s"
    echo "$1 schedules on one minute boundary$what: lateness (ms)"
    new_lines | grep 'rule="schedule_ticks"' | lateness
    psql_q -c "DELETE FROM state.schedules; DELETE FROM state.schedule_ticks" >/dev/null
}
tick_schedules 10 few 70
tick_schedules 10000 s 150
tick_schedules 10000 d 150 distinct

# ---- 2. crash -> re-claim -------------------------------------------------------------------------------------------
kill "$frz" 2>/dev/null || true
start worker/turnwatch-worker "$TW_TMP/crash.ini" crash; x=$started
start worker/turnwatch-worker "$TW_TMP/crash.ini" crash; y=$started
sleep 1
times=()
for _ in $(seq "$kills"); do
    id=$(psql_q -c "SELECT tw.submit_turn('c', 'lag', '{\"mode\":\"sleep\",\"seconds\":1}'::jsonb)")
    holder=""
    for _ in $(seq 200); do
        holder=$(psql_q -c "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = '$id' AND status = 'processing'")
        [[ -n $holder ]] && break
        sleep 0.01
    done
    [[ -n $holder ]] || tw_die "turn $id was never claimed"
    victim=${holder##*:}
    killed_at=$(date +%s.%N)
    # Reaped here, so that bash does not report each killed worker as a job that died.
    { kill -9 "$victim" && wait "$victim"; } 2>/dev/null || true
    for _ in $(seq 400); do
        ms=$(psql_q -c "SELECT round((extract(epoch FROM processed_at) - $killed_at) * 1000) FROM state.agent_inbox
                        WHERE turn_id = '$id' AND status IN ('processing', 'archived') AND claimed_by <> '$holder'")
        [[ -n $ms ]] && break
        sleep 0.02
    done
    [[ -n $ms ]] || tw_die "turn $id was not claimed again within 8 s of the kill"
    times+=("$ms")
    # The survivor runs the step; a new worker replaces the victim.
    start worker/turnwatch-worker "$TW_TMP/crash.ini" crash
    if [[ $victim == "$x" ]]; then x=$started; else y=$started; fi
    for _ in $(seq 300); do
        [[ $(psql_q -c "SELECT status FROM state.turns WHERE turn_id = '$id'") == "done" ]] && break
        sleep 0.02
    done
    sleep 0.3
done
printf '%s\n' "${times[@]}" | sort -n | python3 -c '
import sys
v = [int(float(x)) for x in sys.stdin if x.strip()]
q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
print(f"crash -> re-claim by another worker over {len(v)} SIGKILLs (ms): median={q(0.5)} p99={q(0.99)} max={v[-1]} min={v[0]}")
'

# ---- 3. idle CPU with 100,000 waiting deadlines ---------------------------------------------------------------------
park 9000
sleep 5
echo "idle: $(psql_q -c "SELECT count(*) FROM state.turns WHERE deadline_at IS NOT NULL AND status IN ('pending','dispatched','running','suspended')") deadlines waiting, nothing due; CPU over ${idle} s (% of one core):"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# This cluster's processes only (other clusters may run on the machine): the postmaster with what it reaped, and its
# children.
pgticks() {
    local pm s c
    pm=$(head -n 1 "$TW_PG_DATA/postmaster.pid")
    s=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat")
    for c in $(cat /proc/"$pm"/task/*/children); do s=$((s + $(ticks "$c"))); done
    echo "$s"
}
hz=$(getconf CLK_TCK)
declare -A before
for p in "$pmo" "$wa" "$wb" "$x" "$y"; do before[$p]=$(ticks "$p"); done
pg0=$(pgticks)
sleep "$idle"
for name in "pmo:$pmo" "worker:$wa" "worker:$wb" "worker:$x" "worker:$y"; do
    p=${name#*:}
    d=$(($(ticks "$p") - before[$p]))
    printf '  %-8s pid %-7s %5.2f%%\n' "${name%%:*}" "$p" "$(awk -v d="$d" -v hz="$hz" -v s="$idle" 'BEGIN{print 100 * d / hz / s}')"
done
printf '  %-8s %-11s %5.2f%% (all its processes)\n' postgres "" "$(awk -v d="$(($(pgticks) - pg0))" -v hz="$hz" -v s="$idle" 'BEGIN{print 100 * d / hz / s}')"
