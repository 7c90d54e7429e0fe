#!/usr/bin/env bash
# tools/bench roster — a roster of a million agents costs nothing (a benchmark, not a test; docs/roster.md).
# Release build, throwaway PostgreSQL and nats-server, one turnwatch-pmo and one turnwatch-worker serving one
# no-op profile. It prints, for the same worker and profile:
#   1. the 10-agent run: throughput of T no-op turns over 10 agents, and submit -> final event of lone turns;
#   2. the roster run: the same with N agents registered (default 1,000,000) and the turns spread over K of them
#      (default 10,000), each turn on an agent of its own;
#   3. idle CPU of each daemon and of this PostgreSQL (its own processes only) with the roster loaded.
# Usage: tools/bench roster [--agents N] [--spread K] [--turns T] [--lone M] [--idle-seconds S] [--idle-after S]
# (--idle-after: seconds to wait after the runs before the idle window, default 5; autovacuum and the background
# writer work on the freshly loaded roster for a minute or so)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=tools/lib/servers.sh
source tools/lib/servers.sh

agents=1000000
spread=10000
turns=5000
lone=200
idle=30
idle_after=5
while (($#)); do
    case $1 in
        --agents) agents=${2:?}; shift ;;
        --spread) spread=${2:?}; shift ;;
        --turns) turns=${2:?}; shift ;;
        --lone) lone=${2:?}; shift ;;
        --idle-seconds) idle=${2:?}; shift ;;
        --idle-after) idle_after=${2:?}; shift ;;
        -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
        *) tw_die "unknown argument $1 (try --help)" ;;
    esac
    shift
done

tw_bench_build "$root"
tw_bench_servers

ini=$TW_TMP/roster.ini
{
    printf '[postgres]\ndsn = %s\n[nats]\nurl = %s\n' "$TW_PG_DSN" "$TW_NATS_URL"
    printf '[pmo]\nwatchdog_interval_seconds = 5\n[worker]\nconcurrency = 16\n'
    printf '[agent.noop]\nexec = %s/examples/agents/tw-echo-agent\n' "$build"
} >"$ini"
"$build/tools/turnwatch" -c "$ini" migrate >&2
# The daemons' logs outlive the run (the temporary directory does not).
logs=${TW_BENCH_LOGS:-/tmp/turnwatch-bench-roster-logs}
mkdir -p "$logs"
tw_on_exit "cp $TW_TMP/pmo.log $TW_TMP/worker.log $logs/ 2>/dev/null || true"
"$build/pmo/turnwatch-pmo" -c "$ini" 2>"$TW_TMP/pmo.log" &
pmo=$!
tw_on_exit "tw_stop_pid $pmo"
"$build/worker/turnwatch-worker" -c "$ini" 2>"$TW_TMP/worker.log" &
worker=$!
tw_on_exit "tw_stop_pid $worker"
sleep 0.5

cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6, $9}' /proc/stat; }
cpu_report() {
    local b0 i0 s0 b1 i1 s1 total
    read -r b0 i0 s0 <<<"$1"
    read -r b1 i1 s1 <<<"$(cpu_ticks)"
    total=$(((b1 - b0) + (i1 - i0) + (s1 - s0)))
    ((total > 0)) || total=1
    printf '  host CPU meanwhile (%d cores): %d%% busy, %d%% idle, %d%% stolen by the hypervisor\n' "$(nproc)" \
        $((100 * (b1 - b0) / total)) $((100 * (i1 - i0) / total)) $((100 * (s1 - s0) / total))
}
run() { # PREFIX AGENTS: a throughput run over AGENTS agents PREFIX0.., then lone turns on PREFIX0
    local t0
    t0=$(cpu_ticks)
    "$build/tools/turnwatch-bench" -c "$ini" --mode throughput --turns "$turns" --agents "$2" --prefix "$1"
    cpu_report "$t0"
    t0=$(cpu_ticks)
    "$build/tools/turnwatch-bench" -c "$ini" --mode latency --turns "$lone" --prefix "$1"
    cpu_report "$t0"
}

echo "machine: $(nproc) cores; PostgreSQL $(psql --version | awk '{print $3}'), one pmo, one worker (16 slots), profile noop (tw-echo-agent)"
psql_q -c "SELECT count(*) FROM (SELECT tw.add_agent('ten' || i, 'noop') FROM generate_series(0, 9) i) x" >/dev/null
printf 'warm-up, not measured: '
"$build/tools/turnwatch-bench" -c "$ini" --mode throughput --turns 500 --agents 10 --prefix ten
echo "10-agent run ($(psql_q -c 'SELECT count(*) FROM state.agents') agents registered):"
run ten 10

start=$SECONDS
psql_q -c "INSERT INTO state.agents (agent, profile) SELECT 'r' || i, 'noop' FROM generate_series(0, $((agents - 1))) i" >/dev/null
psql_q -c "VACUUM ANALYZE state.agents" >/dev/null
echo "roster loaded: $agents agents in $((SECONDS - start)) s; state.agents $(psql_q -c "SELECT pg_size_pretty(pg_total_relation_size('state.agents'))") with indexes"
echo "roster run ($(psql_q -c 'SELECT count(*) FROM state.agents') agents registered, turns over $spread of them):"
run r "$spread"

sleep "$idle_after"
echo "idle with the roster loaded: CPU over ${idle} s, ${idle_after} s after the runs (% of one core):"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# The postmaster's own time and that of its children that exited (an autovacuum worker that came and went).
reaped() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat" 2>/dev/null || echo 0; }
postmaster=$(head -n 1 "$TW_PG_DATA/postmaster.pid")
pgticks() { local s p; s=$(reaped "$postmaster"); for p in $(pgrep -P "$postmaster"); do s=$((s + $(ticks "$p"))); done; echo "$s"; }
# Each live PostgreSQL process with its ticks and what it is: "backend" for a session (its title names the
# client), otherwise the title ("checkpointer", "autovacuum launcher", ...).
pgprocs() {
    local p title
    for p in $(pgrep -P "$postmaster"); do
        title=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed -e 's/^postgres: //' -e 's/ *$//')
        [[ $title == *"("*")"* ]] && title="backend (a session of a daemon or this script)"
        printf '%s\t%s\t%s\n' "$p" "$(ticks "$p")" "$title"
    done
}
hz=$(getconf CLK_TCK)
p0=$(ticks "$pmo") w0=$(ticks "$worker") g0=$(pgticks) r0=$(reaped "$postmaster")
pgprocs >"$TW_TMP/pg-idle-0"
sleep "$idle"
pct() { awk -v d="$1" -v hz="$hz" -v s="$idle" 'BEGIN{printf "%.2f", 100 * d / hz / s}'; }
printf '  pmo       %s%%\n  worker    %s%%\n  postgres  %s%% (this cluster'"'"'s processes), of which:\n' \
    "$(pct $(($(ticks "$pmo") - p0)))" "$(pct $(($(ticks "$worker") - w0)))" "$(pct $(($(pgticks) - g0)))"
pgprocs >"$TW_TMP/pg-idle-1"
# By kind: live processes' ticks over the window (those that started during it count whole), then the exited ones.
awk -F '\t' -v hz="$hz" -v s="$idle" 'NR == FNR { t0[$1] = $2; next }
    { d[$3] += $2 - ($1 in t0 ? t0[$1] : 0) }
    END { for (k in d) printf "    %-48s %.2f%%\n", k, 100 * d[k] / hz / s }' \
    "$TW_TMP/pg-idle-0" "$TW_TMP/pg-idle-1" | sort
printf '    %-48s %s%%\n' "postmaster and processes that exited meanwhile" "$(pct $(($(reaped "$postmaster") - r0)))"
