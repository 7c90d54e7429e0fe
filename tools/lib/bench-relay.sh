#!/usr/bin/env bash
# tools/bench relay — the PMO's outbox relay under a flood (a benchmark, not a test; issue 23). Release build,
# throwaway PostgreSQL and nats-server, one turnwatch-pmo at the shipped defaults and no worker. turnwatch-bench-relay
# submits one turn to an agent nobody serves (it stays dispatched), loads a backlog of unpublished events as one old
# transaction (a cancelled tree whose writer never published them), then cancels the fresh turn through the SQL API
# (tw.cancel_turn: its final event reaches the relay through NOTIFY tw_outbox) and prints how long that event waited
# (marked published, received from NATS) and how fast the backlog drained.
# With --lone M a worker runs too, and M lone turns of another agent (each published by the worker that ends it, not
# by the relay) run one after another meanwhile: submit -> final event while the backlog drains.
# Usage: tools/bench relay [--backlog N] [--timeout S] [--fast] [--runs R] [--lone M]
# (--fast: fsync off; --runs: repeat the measurement R times, each on a fresh cluster)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=tools/lib/servers.sh
source tools/lib/servers.sh

backlog=150000
timeout=600
runs=1
lone=0
export TW_PG_DURABLE=1
while (($#)); do
    case $1 in
        --backlog) backlog=${2:?}; shift ;;
        --timeout) timeout=${2:?}; shift ;;
        --runs) runs=${2:?}; shift ;;
        --lone) lone=${2:?}; shift ;;
        --fast) TW_PG_DURABLE=0 ;;
        -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
        *) tw_die "unknown argument $1 (try --help)" ;;
    esac
    shift
done

tw_bench_build "$root"
if ((runs > 1)); then
    for ((r = 1; r <= runs; r++)); do
        echo "run $r of $runs:"
        more=()
        [[ $TW_PG_DURABLE == 0 ]] && more=(--fast)
        "$0" --backlog "$backlog" --timeout "$timeout" --lone "$lone" "${more[@]}"
    done
    exit 0
fi
tw_bench_servers

ini=$TW_TMP/relay.ini
{
    printf '[postgres]\ndsn = %s\n[nats]\nurl = %s\n' "$TW_PG_DSN" "$TW_NATS_URL"
    printf '[agent.noop]\nexec = %s/examples/agents/tw-echo-agent\n' "$build"
    printf '[agent.held]\nexec = %s/examples/agents/tw-echo-agent\n' "$build"
} >"$ini"
"$build/tools/turnwatch" -c "$ini" migrate >&2
logs=${TW_BENCH_LOGS:-/tmp/turnwatch-bench-relay-logs}
mkdir -p "$logs"
tw_on_exit "cp $TW_TMP/pmo.log $TW_TMP/worker.log $logs/ 2>/dev/null || true"
"$build/pmo/turnwatch-pmo" -c "$ini" 2>"$TW_TMP/pmo.log" &
pmo=$!
tw_on_exit "tw_stop_pid $pmo"
psql_q -c "SELECT tw.add_agent('fresh', 'held'), tw.add_agent('lone0', 'noop')" >/dev/null
if ((lone > 0)); then
    # The worker serves profile noop only: the fresh turn (profile held) stays dispatched until it is cancelled.
    printf '[worker]\nagents = noop\n' >>"$ini"
    "$build/worker/turnwatch-worker" -c "$ini" 2>"$TW_TMP/worker.log" &
    worker=$!
    tw_on_exit "tw_stop_pid $worker"
fi
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); PostgreSQL $(psql --version | awk '{print $3}')" \
    "($([[ $TW_PG_DURABLE == 1 ]] && echo durable || echo 'fsync off')); one pmo at the shipped defaults," \
    "$( ((lone > 0)) && echo "one worker (profile noop)" || echo "no worker")"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# A process with its children that exited (PostgreSQL: the postmaster and every backend, live or gone).
family() {
    local s p
    s=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat" 2>/dev/null || echo 0)
    for p in $(pgrep -P "$1"); do s=$((s + $(ticks "$p"))); done
    echo "$s"
}
# CPU seconds of this shell's children that ended (the measuring client): bash's `times`, which must run in this
# shell, not in a $(...) subshell, written to a file first.
children_cpu() { awk 'NR == 2 { split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$1"; }
postmaster=$(head -n 1 "$TW_PG_DATA/postmaster.pid")
times >"$TW_TMP/times-0"
p0=$(ticks "$pmo") g0=$(family "$postmaster") n0=$(ticks "$TW_NATS_PID")
start=$SECONDS
if ((lone > 0)); then
    "$build/tools/turnwatch-bench" -c "$ini" --mode latency --turns "$lone" --prefix lone >"$TW_TMP/lone.out" 2>&1 &
    lone_pid=$!
fi
"$build/tools/turnwatch-bench-relay" -c "$ini" --backlog "$backlog" --timeout "$timeout" --agent fresh
if ((lone > 0)); then
    wait "$lone_pid" || true
    sed 's/^/lone turns meanwhile (published by the worker): /' "$TW_TMP/lone.out" | grep -v '^lone turns meanwhile (published by the worker):   '
fi
times >"$TW_TMP/times-1"
hz=$(getconf CLK_TCK)
sec() { awk -v t="$1" -v hz="$hz" 'BEGIN{printf "%.1f", t / hz}'; }
printf 'CPU meanwhile (%d s): postgres %s s, pmo %s s, nats-server %s s, this client %s s\n' $((SECONDS - start)) \
    "$(sec $(($(family "$postmaster") - g0)))" "$(sec $(($(ticks "$pmo") - p0)))" \
    "$(sec $(($(ticks "$TW_NATS_PID") - n0)))" \
    "$(awk -v a="$(children_cpu "$TW_TMP/times-0")" -v b="$(children_cpu "$TW_TMP/times-1")" 'BEGIN{printf "%.1f", b - a}')"
echo "pmo log: $(grep -c 'outbox relay' "$TW_TMP/pmo.log" || true) relay lines ($logs/pmo.log)"
