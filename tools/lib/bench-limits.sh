#!/usr/bin/env bash
# tools/bench limits — flow control under load (a benchmark, not a test; docs/flow-control.md). Release build,
# throwaway PostgreSQL (durable unless --fast) and nats-server, one turnwatch-pmo and --workers turnwatch-workers
# (16 slots each). Tool calls of a no-op tool (tw-echo-tool, mode = serve) made by fan-out turns of 50 agents (10
# calls a turn, so that no turn's row is a bottleneck of its own; tw-fanout-agent in --agent-mode, exec unless
# told: a process per step, or serve: one per slot, kept):
# first --calls of them through a tool with no limit (the baseline), then --calls through the same tool holding one
# limit of max_concurrent = --cap. For each run: calls/s (first call made -> last result applied), statements per
# call (pg_stat_statements: sent by the daemons, and run inside the functions); for the limited run also the
# statements it adds per call (limited minus baseline), the hand-over latency from a release to the start of the
# call it granted (p50, p99: the grant is made in the releasing transaction; the start is the worker's claim), and
# the most holders ever at once: from the recorded times (granted -> released, and running: started -> settled;
# these are the transactions' clocks, a grant made at once is timed at the start of the transaction that made the
# call, which may then wait for the limit) and as sampled from the database about every 10 ms.
# Usage: tools/bench limits [--calls N] [--cap C] [--workers W] [--agent-mode exec|serve] [--fast]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=tools/lib/servers.sh
source tools/lib/servers.sh

calls=10000
cap=50
workers=4
agent_mode=exec
per_turn=10
agents=50
export TW_PG_DURABLE=1
while (($#)); do
    case $1 in
        --calls) calls=${2:?}; shift ;;
        --cap) cap=${2:?}; shift ;;
        --workers) workers=${2:?}; shift ;;
        --fast) TW_PG_DURABLE=0 ;;
        --agent-mode) agent_mode=${2:?}; shift ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        *) tw_die "unknown argument $1 (try --help)" ;;
    esac
    shift
done
((calls % per_turn == 0)) || tw_die "--calls must be a multiple of $per_turn"
turns=$((calls / per_turn))

tw_bench_build "$root"
export TW_PG_CONF="shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
pg_stat_statements.max = 10000
track_commit_timestamp = on"
tw_bench_servers

ini=$TW_TMP/limits.ini
{
    printf '[postgres]\ndsn = %s\n[nats]\nurl = %s\n' "$TW_PG_DSN" "$TW_NATS_URL"
    printf '[worker]\nconcurrency = 16\n'
    printf '[limit.bench]\nmax_concurrent = %s\n' "$cap"
    for t in free lim; do
        printf '[tool.%s]\nexec = %s/examples/tools/tw-echo-tool\nmode = serve\ntimeout_seconds = 600\n' "$t" "$build"
        printf 'suspend_timeout_seconds = 3600\n'
    done
    printf 'limits = bench\n'
    printf '[agent.fan]\nexec = %s/examples/agents/tw-fanout-agent\nmode = %s\n' "$build" "$agent_mode"
} >"$ini"
"$build/tools/turnwatch" -c "$ini" migrate >&2
psql_q -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null
"$build/pmo/turnwatch-pmo" -c "$ini" 2>"$TW_TMP/pmo.log" &
tw_on_exit "tw_stop_pid $!"
for w in $(seq 1 "$workers"); do
    "$build/worker/turnwatch-worker" -c "$ini" 2>"$TW_TMP/worker$w.log" &
    tw_on_exit "tw_stop_pid $!"
done
for _ in $(seq 1 100); do
    [[ $(psql_q -c "SELECT count(*) FROM state.limits WHERE name = 'bench'") == 1 ]] && break
    sleep 0.1
done
psql_q -c "SELECT count(tw.add_agent('fan' || i, 'fan')) FROM generate_series(0, $((agents - 1))) i" >/dev/null

echo "machine: $(nproc) cores, load average $(cut -d ' ' -f 1-3 /proc/loadavg) at start (other work shares it);" \
    "PostgreSQL $(psql_q -c 'SHOW server_version') ($([[ $TW_PG_DURABLE == 1 ]] && echo durable || echo 'fsync off'));" \
    "one pmo, $workers workers of 16 slots; $calls calls of tw-echo-tool (serve) per run, $per_turn per turn," \
    "$agents agents (tw-fanout-agent, $agent_mode)"

# run TOOL: submit the turns, wait for them all to end, print what they cost.
run() {
    local tool=$1 open
    psql_q -c 'SELECT pg_stat_statements_reset()' >/dev/null
    psql_q -c "SELECT count(tw.submit_turn(agent => 'fan' || (i % $agents), channel => 'bench',
                                           input => jsonb_build_object('n', $per_turn, 'tool', '$tool')))
                 FROM generate_series(1, $turns) i" >/dev/null
    for _ in $(seq 1 3600); do
        open=$(psql_q -c "SELECT count(*) FROM state.turns WHERE channel_id = 'bench' AND input ->> 'tool' = '$tool'
                                                          AND status NOT IN ('done', 'failed', 'timeout', 'cancelled')")
        ((open == 0)) && break
        sleep 0.5
    done
    ((open == 0)) || tw_die "$open turns of tool $tool did not end"
    psql_q -c "SELECT pg_stat_clear_snapshot()" >/dev/null
    psql_q -F ' ' -c "
        SELECT count(*) FILTER (WHERE w.result_status = 'ok'),
               round(count(*) / extract(epoch FROM max(w.settled_at) - min(w.created_at))::numeric, 1)
          FROM state.turn_waiting_tools w WHERE w.tool = '$tool'" >"$TW_TMP/run.$tool"
    psql_q -F ' ' -c "
        SELECT coalesce(sum(calls) FILTER (WHERE toplevel), 0), coalesce(sum(calls) FILTER (WHERE NOT toplevel), 0)
          FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())" >>"$TW_TMP/run.$tool"
    read -r ok rate sent nested < <(tr '\n' ' ' <"$TW_TMP/run.$tool") || true
    ((ok == calls)) || tw_die "$ok of $calls calls of $tool ended ok"
    printf '%s: %s calls ok, %s calls/s; statements per call (and per turn 1/%s of it): %.2f sent, %.2f nested\n' \
        "$tool" "$ok" "$rate" "$per_turn" "$(echo "$sent / $calls" | bc -l)" "$(echo "$nested / $calls" | bc -l)"
    eval "sent_$tool=$sent nested_$tool=$nested"
    echo "  the 5 statements that took PostgreSQL the most time (nested ones inside their callers' time):"
    psql_q -F ' | ' -c "SELECT to_char(calls::numeric / $calls, 'FM99990.00') || ' per call',
                               to_char(total_exec_time * 1000 / $calls, 'FM9999990') || ' us per call',
                               CASE WHEN toplevel THEN 'sent' ELSE 'nested' END,
                               left(regexp_replace(query, '\s+', ' ', 'g'), 100)
                          FROM pg_stat_statements
                         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                         ORDER BY total_exec_time DESC LIMIT 5" | sed 's/^/    /'
}

run free
# The holders of the limit as the database has them (state.limit_calls holding), sampled about every 10 ms while
# the limited run goes on, each sample a statement (and a transaction) of its own: the most seen.
(
    most=0 idle=0
    while ((idle < 200)); do
        n=$(psql_q -c "SELECT count(*) FROM state.limit_calls WHERE status = 'holding' AND limits @> ARRAY['bench']")
        ((n > most)) && most=$n
        if ((n == 0 && most > 0)); then idle=$((idle + 1)); else idle=0; fi
        sleep 0.01
    done
    echo "sampled $most" >"$TW_TMP/sampled"
) &
sampler=$!
run lim
# shellcheck disable=SC2154
printf 'added by the limit, per call: %.2f statements sent, %.2f nested\n' \
    "$(echo "($sent_lim - $sent_free) / $calls" | bc -l)" "$(echo "($nested_lim - $nested_free) / $calls" | bc -l)"
# Hand-over: a call that waited was granted by the transaction that released a slot (its history row's time, the
# grant's clock), and started when a worker claimed it, or when that transaction committed when it took the call
# for its own worker (its started_at is then that transaction's, before the grant: the start is its commit,
# track_commit_timestamp). In two parts: release -> the releasing commit, and that commit -> the start.
psql_q -F ' ' -c "
    SELECT count(*), count(*) FILTER (WHERE s <= c),
           round((percentile_cont(0.5) WITHIN GROUP (ORDER BY greatest(s, c) - g) * 1000)::numeric, 2),
           round((percentile_cont(0.99) WITHIN GROUP (ORDER BY greatest(s, c) - g) * 1000)::numeric, 2),
           round((max(greatest(s, c) - g) * 1000)::numeric, 2),
           round((percentile_cont(0.5) WITHIN GROUP (ORDER BY c - g) * 1000)::numeric, 2),
           round((percentile_cont(0.99) WITHIN GROUP (ORDER BY c - g) * 1000)::numeric, 2),
           round((percentile_cont(0.5) WITHIN GROUP (ORDER BY greatest(s, c) - c) * 1000)::numeric, 2),
           round((percentile_cont(0.99) WITHIN GROUP (ORDER BY greatest(s, c) - c) * 1000)::numeric, 2)
      FROM (SELECT extract(epoch FROM h.at) AS g, extract(epoch FROM pg_xact_commit_timestamp(h.xmin)) AS c,
                   extract(epoch FROM w.started_at) AS s
              FROM state.turn_waiting_tools w
              JOIN state.turn_history h ON h.turn_id = w.turn_id AND h.tool_call_id = w.tool_call_id
                                       AND h.waited_from IS NOT NULL
             WHERE w.tool = 'lim') x" | {
    read -r n own p50 p99 max a50 a99 b50 b99
    echo "hand-over, release -> start of the call it granted ($n calls waited, $own taken by the releasing worker):" \
        "p50 $p50 ms, p99 $p99 ms, max $max ms"
    echo "  of which release -> its commit p50 $a50 ms, p99 $a99 ms; commit -> start p50 $b50 ms, p99 $b99 ms"
}
# The most holders at once: +1 at a grant (the history's wait row, or the call's making when it did not wait),
# -1 at its release (settled_at); at equal times the release first. And the most running at once.
for what in holding running; do
    if [[ $what == holding ]]; then
        from="coalesce((SELECT h.at FROM state.turn_history h WHERE h.turn_id = w.turn_id
                                      AND h.tool_call_id = w.tool_call_id AND h.waited_from IS NOT NULL), w.created_at)"
    else
        from="w.started_at"
    fi
    psql_q -c "
        SELECT max(n) FROM (
            SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS n
              FROM (SELECT $from AS t, 1 AS d FROM state.turn_waiting_tools w WHERE w.tool = 'lim'
                    UNION ALL
                    SELECT w.settled_at, -1 FROM state.turn_waiting_tools w WHERE w.tool = 'lim') e) x" | {
        read -r most
        echo "most calls $what the limit at once: $most (max_concurrent $cap)"
    }
done
wait "$sampler" || true
echo "most calls holding the limit at once, sampled from the database about every 10 ms: $(grep -o 'sampled [0-9]*' "$TW_TMP/sampled" | cut -d ' ' -f 2) (max_concurrent $cap)"
for log in "$TW_TMP"/pmo.log "$TW_TMP"/worker*.log; do
    n=$(grep -c -E ' (WARN|ERROR): ' "$log" || true)
    ((n == 0)) || { echo "${log##*/}: $n warning or error lines, the first:"; grep -m 3 -E ' (WARN|ERROR): ' "$log"; }
done
