# tools/lib/ha.sh — a high-availability formation on one machine (docs/high-availability.md): a pg_auto_failover monitor,
# a primary and a synchronous standby, and three clustered nats-servers with JetStream. Sourced by tools/ha-local and
# tools/soak --ha; tools/lib/ha-formation wraps it as commands for the tests and the soak's fault driver. Everything
# lives in one directory DIR, which must not exist yet or be empty; DIR/ha.env (KEY=VALUE lines) says where it all is:
#   HA_DSN          postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/turnwatch?target_session_attrs=read-write
#   HA_NATS_URL     nats://127.0.0.1:N1,nats://127.0.0.1:N2,nats://127.0.0.1:N3
#   HA_MONITOR_PORT, HA_PG_PORT1, HA_PG_PORT2, HA_NATS_PORT1..3, HA_NATS_MPORT1..3 (their monitoring: /jsz, /varz)
# The processes are plain children of whoever started them (no new session), with their output in DIR/*.log: a
# test's process group takes them along if it is killed. Needs root (or the postgres user) and sources servers.sh.
# shellcheck shell=bash

# Debian's pg_auto_failover: the pg_autoctl command and the monitor's extension for the PostgreSQL it was built for.
TW_HA_DEPS=(pg-auto-failover-cli postgresql-15-auto-failover)
TW_HA_PG_VERSION=15

# pg_auto_failover's monitor settings that decide how fast a dead primary is noticed (the shipped defaults take
# 20-30 s; these, which a deployment may choose too, make the bench's failover a few seconds): a health check of each
# node every second, given up after one more try half a second later, a node silent for 2 s considered unhealthy,
# and a primary whose keeper cannot confirm its demotion (a dead machine) taken as demoted after 5 s, not 30.
TW_HA_MONITOR_SETTINGS=(
    "pgautofailover.health_check_period = 1000"
    "pgautofailover.health_check_timeout = 1000"
    "pgautofailover.health_check_max_retries = 1"
    "pgautofailover.health_check_retry_delay = 500"
    "pgautofailover.node_considered_unhealthy_timeout = 2000"
    "pgautofailover.primary_demote_timeout = 5000"
)

tw_ha_missing_deps() {
    local p
    for p in "${TW_HA_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf '%s\n' "$p"
    done
}

# Installs pg_auto_failover when it is missing (fresh machines, CI); false when it cannot be (not root, no package).
tw_ha_install_deps() {
    local missing
    missing=$(tw_ha_missing_deps)
    [[ -z $missing ]] && return 0
    # shellcheck disable=SC2086 # one package name per word
    tw_log "installing missing packages: "$missing
    [[ $(id -u) -eq 0 ]] || { tw_log "need root to apt-get install: $missing"; return 1; }
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    { apt-get install -y $missing || { apt-get update && apt-get install -y $missing; }; } >&2 || return 1
}

tw_ha_bindir() { printf '/usr/lib/postgresql/%s/bin\n' "$TW_HA_PG_VERSION"; }

# Runs a command as the postgres user (when root) with the formation's own pg_autoctl state under DIR/xdg, so two
# formations on one machine never share a configuration.
tw_ha_as_pg() {
    local dir=$1
    shift
    local envs=(XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" XDG_RUNTIME_DIR="$dir/xdg/run"
        PG_CONFIG="$(tw_ha_bindir)/pg_config" PATH="$(tw_ha_bindir):$PATH")
    if [[ $(id -u) -eq 0 ]]; then
        (cd "$dir" && runuser -u postgres -- env "${envs[@]}" "$@")
    else
        (cd "$dir" && env "${envs[@]}" "$@")
    fi
}

tw_ha_env() { # DIR KEY: a value of DIR/ha.env
    sed -n "s/^$2=//p" "$1/ha.env"
}

tw_ha_monitor_sql() { # DIR SQL: one query on the monitor, unaligned rows
    "$(tw_ha_bindir)/psql" -X -q -t -A -h 127.0.0.1 -p "$(tw_ha_env "$1" HA_MONITOR_PORT)" -U autoctl_node \
        -d pg_auto_failover -c "$2" 2>/dev/null
}

# The node the monitor has as primary now, as "NAME PORT" (nothing while there is none).
tw_ha_primary() {
    tw_ha_monitor_sql "$1" "SELECT nodename, nodeport FROM pgautofailover.node
                            WHERE reportedstate IN ('primary','wait_primary','single') AND goalstate = reportedstate
                            ORDER BY nodeid LIMIT 1" | tr '|' ' '
}

# Waits until the formation is settled: one primary and one secondary, each in the state the monitor assigned it.
tw_ha_wait_stable() { # DIR [SECONDS] (0: look once)
    local deadline=$((SECONDS + ${2:-120})) s
    while :; do
        s=$(tw_ha_monitor_sql "$1" "SELECT string_agg(reportedstate || '/' || goalstate, ' ' ORDER BY reportedstate)
                                     FROM pgautofailover.node" || true)
        [[ $s == "primary/primary secondary/secondary" ]] && return 0
        ((SECONDS < deadline)) || break
        sleep 0.2
    done
    tw_log "formation in $1 not settled after ${2:-120} s: $s"
    return 1
}

# Starts `pg_autoctl run` for one node in the background (its pid in DIR/NAME.pid, its log DIR/NAME.log).
tw_ha_run_node() { # DIR NAME
    tw_ha_as_pg "$1" pg_autoctl run --pgdata "$1/$2" </dev/null >>"$1/$2.log" 2>&1 &
    echo $! >"$1/$2.pid"
}

tw_ha_pg_start() {
    local dir=$1 mon node port n conf
    local bindir
    bindir=$(tw_ha_bindir)
    [[ -x $bindir/pg_ctl ]] || tw_die "PostgreSQL $TW_HA_PG_VERSION not found in $bindir"
    command -v pg_autoctl >/dev/null || tw_die "pg_autoctl not found (Debian package pg-auto-failover-cli)"
    mkdir -p "$dir/xdg/run"
    if [[ $(id -u) -eq 0 ]]; then
        chmod 755 "$dir"
        chown -R postgres: "$dir/xdg"
        chown postgres: "$dir"
    fi
    mon=$(tw_free_port)
    echo "HA_MONITOR_PORT=$mon" >>"$dir/ha.env"
    tw_ha_as_pg "$dir" pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$mon" --hostname 127.0.0.1 \
        --auth trust --no-ssl --pgctl "$bindir/pg_ctl" >"$dir/monitor-create.log" 2>&1 ||
        { tail -n 30 "$dir/monitor-create.log" >&2; tw_die "pg_autoctl create monitor failed"; }
    tw_ha_small "$dir/monitor"
    tw_ha_run_node "$dir" monitor
    tw_wait_port "$mon" 30 || tw_die "the monitor did not start (see $dir/monitor.log)"
    local uri="postgres://autoctl_node@127.0.0.1:$mon/pg_auto_failover?sslmode=disable"
    # Waits until the monitor answers SQL, then tunes its failure detection.
    for ((n = 0; n < 100; n++)); do tw_ha_monitor_sql "$dir" "SELECT 1" >/dev/null && break; sleep 0.1; done
    for conf in "${TW_HA_MONITOR_SETTINGS[@]}"; do
        tw_ha_as_pg "$dir" "$bindir/psql" -X -q -h 127.0.0.1 -p "$mon" -d pg_auto_failover \
            -c "ALTER SYSTEM SET ${conf%% =*} = ${conf##*= }" >/dev/null
    done
    tw_ha_as_pg "$dir" "$bindir/psql" -X -q -h 127.0.0.1 -p "$mon" -d pg_auto_failover -c "SELECT pg_reload_conf()" \
        >/dev/null
    for n in 1 2; do
        node=node$n
        port=$(tw_free_port)
        echo "HA_PG_PORT$n=$port" >>"$dir/ha.env"
        tw_ha_as_pg "$dir" pg_autoctl create postgres --pgdata "$dir/$node" --pgport "$port" --pghost 127.0.0.1 \
            --listen 127.0.0.1 --hostname 127.0.0.1 --name "$node" --auth trust --no-ssl --dbname turnwatch \
            --pgctl "$bindir/pg_ctl" --monitor "$uri" >"$dir/$node-create.log" 2>&1 ||
            { tail -n 30 "$dir/$node-create.log" >&2; tw_die "pg_autoctl create postgres $node failed"; }
        # The standby copies the primary's files, these settings included.
        [[ $n == 1 ]] && tw_ha_small "$dir/$node"
        tw_ha_run_node "$dir" "$node"
        tw_wait_port "$port" 60 || tw_die "$node did not start (see $dir/$node.log)"
    done
    tw_ha_wait_stable "$dir" 120 || tw_die "the formation did not settle (see $dir/*.log)"
    echo "HA_DSN=postgresql://postgres@127.0.0.1:$(tw_ha_env "$dir" HA_PG_PORT1),127.0.0.1:$(tw_ha_env "$dir" \
        HA_PG_PORT2)/turnwatch?target_session_attrs=read-write&connect_timeout=2" >>"$dir/ha.env"
}

# pg_autoctl sizes shared_buffers and wal_keep_size for a dedicated machine (gigabytes); a formation of three
# servers on one small machine takes less. fsync off as in the tests' single server: the faults here kill processes,
# not the machine, so the page cache keeps what was written; synchronous_commit stays on (it waits for the standby).
tw_ha_small() {
    cat >>"$1/postgresql.conf" <<'EOF'

# turnwatch HA formation on one machine (tools/lib/ha.sh)
shared_buffers = '128MB'
wal_keep_size = '512MB'
max_connections = 200
fsync = off
EOF
}

# Three nats-servers in one cluster (routes to each other), each with JetStream and its own store.
tw_ha_nats_start() {
    local dir=$1 i bin urls=""
    bin=$(command -v nats-server || true)
    [[ -n $bin ]] || for bin in /usr/sbin/nats-server /usr/bin/nats-server ""; do [[ -x $bin ]] && break; done
    [[ -n $bin ]] || tw_die "nats-server not found (is the nats-server package installed?)"
    echo "HA_NATS_BIN=$bin" >>"$dir/ha.env"
    for i in 1 2 3; do
        echo "HA_NATS_PORT$i=$(tw_free_port)" >>"$dir/ha.env"
        echo "HA_NATS_CPORT$i=$(tw_free_port)" >>"$dir/ha.env"
        echo "HA_NATS_MPORT$i=$(tw_free_port)" >>"$dir/ha.env"
    done
    for i in 1 2 3; do
        tw_ha_nats_up "$dir" "$i"
        urls+="${urls:+,}nats://127.0.0.1:$(tw_ha_env "$dir" "HA_NATS_PORT$i")"
    done
    echo "HA_NATS_URL=$urls" >>"$dir/ha.env"
    tw_ha_nats_wait_cluster "$dir" 60 || tw_die "the NATS cluster did not form (see $dir/nats-*.log)"
}

# Starts (again) nats-server I of the cluster, on its ports and store.
tw_ha_nats_up() { # DIR I
    local dir=$1 i=$2 routes="" j
    for j in 1 2 3; do
        [[ $j == "$i" ]] || routes+="${routes:+,}nats://127.0.0.1:$(tw_ha_env "$dir" "HA_NATS_CPORT$j")"
    done
    "$(tw_ha_env "$dir" HA_NATS_BIN)" -a 127.0.0.1 -p "$(tw_ha_env "$dir" "HA_NATS_PORT$i")" -n "tw-nats-$i" -js \
        -m "$(tw_ha_env "$dir" "HA_NATS_MPORT$i")" \
        -sd "$dir/nats-$i" --cluster_name turnwatch-ha --cluster "nats://127.0.0.1:$(tw_ha_env "$dir" "HA_NATS_CPORT$i")" \
        --routes "$routes" </dev/null >>"$dir/nats-$i.log" 2>&1 &
    echo $! >"$dir/nats-$i.pid"
    # Killed on purpose later (nats-kill): no "Killed" job notice from this shell then.
    disown $!
    tw_wait_port "$(tw_ha_env "$dir" "HA_NATS_PORT$i")" 20 || tw_die "nats-server $i did not start (see $dir/nats-$i.log)"
}

# Waits until JetStream has a meta leader across the cluster (a server logs it when it sees one elected).
tw_ha_nats_wait_cluster() { # DIR [SECONDS]
    local deadline=$((SECONDS + ${2:-60}))
    while ((SECONDS < deadline)); do
        grep -qsE "JetStream cluster new metadata leader|Self is new JetStream cluster metadata leader" \
            "$1"/nats-*.log && return 0
        sleep 0.2
    done
    return 1
}

tw_ha_nats_kill() { # DIR I [SIGNAL]: kills nats-server I (SIGKILL by default)
    local pidf="$1/nats-$2.pid"
    [[ -f $pidf ]] || return 0
    local pid i
    pid=$(cat "$pidf")
    kill -"${3:-KILL}" "$pid" 2>/dev/null || true
    # Not this shell's child (disowned, or started by another one): wait for it to be gone.
    for ((i = 0; i < 100 && $(kill -0 "$pid" 2>/dev/null && echo 1 || echo 0) == 1; i++)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidf"
}

# SIGKILL of the primary's postmaster (its keeper stays, as after a crash of PostgreSQL alone). Prints the node.
tw_ha_kill_primary() { # DIR
    local name port pid
    read -r name port < <(tw_ha_primary "$1")
    [[ -n ${name:-} ]] || { tw_log "no primary to kill"; return 1; }
    pid=$(head -n 1 "$1/$name/postmaster.pid" 2>/dev/null || true)
    [[ -n $pid ]] || { tw_log "no postmaster.pid for $name"; return 1; }
    kill -KILL "$pid"
    printf '%s\n' "$name"
}

# The pids of PID and all its descendants, parents first.
tw_ha_tree() {
    local c
    printf '%s\n' "$1"
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do tw_ha_tree "$c"; done
}

# The primary's whole node dies at once, as with its machine: its keeper (pg_autoctl) and PostgreSQL, SIGKILL. The
# monitor then fails over once it judges the node unhealthy and primary_demote_timeout has passed (nobody is left to
# confirm the demotion). Prints the node; tw_ha_node_start brings it back (it rejoins as a standby).
tw_ha_kill_node() { # DIR
    local name port pids pm
    read -r name port < <(tw_ha_primary "$1")
    [[ -n ${name:-} ]] || { tw_log "no primary to kill"; return 1; }
    pm=$(head -n 1 "$1/$name/postmaster.pid" 2>/dev/null || true)
    pids=$(tw_ha_tree "$(cat "$1/$name.pid")")
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $pids ${pm:-} 2>/dev/null || true
    wait "$(cat "$1/$name.pid")" 2>/dev/null || true
    printf '%s\n' "$name"
}

tw_ha_node_start() { # DIR NAME
    tw_ha_run_node "$1" "$2"
}

tw_ha_switchover() { # DIR
    tw_ha_as_pg "$1" pg_autoctl perform switchover --pgdata "$1/monitor" --wait 120 >>"$1/switchover.log" 2>&1
}

# Stops the nodes, then the monitor (pg_autoctl stop: its keeper stops its PostgreSQL), then NATS; whatever still
# runs after that is killed. Harmless for a formation that is half up or gone.
tw_ha_stop() { # DIR
    local dir=$1 name pid i
    for name in node1 node2 monitor; do
        [[ -f $dir/$name.pid ]] || continue
        tw_ha_as_pg "$dir" pg_autoctl stop --pgdata "$dir/$name" >/dev/null 2>&1 || true
    done
    for name in node1 node2 monitor; do
        [[ -f $dir/$name.pid ]] || continue
        pid=$(cat "$dir/$name.pid")
        for ((i = 0; i < 150 && $(kill -0 "$pid" 2>/dev/null && echo 1 || echo 0) == 1; i++)); do sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && tw_ha_as_pg "$dir" pg_autoctl stop --pgdata "$dir/$name" --immediate \
            >/dev/null 2>&1
        sleep 0.5
        kill -KILL "$pid" 2>/dev/null || true
        # A postmaster left behind by a keeper that was killed.
        [[ -f $dir/$name/postmaster.pid ]] &&
            kill -KILL "$(head -n 1 "$dir/$name/postmaster.pid")" 2>/dev/null
        rm -f "$dir/$name.pid"
    done
    for i in 1 2 3; do tw_ha_nats_kill "$dir" "$i" INT; done
}

# tw_ha_start DIR [--no-pg] [--no-nats]: the whole formation, settled; DIR/ha.env says where.
tw_ha_start() {
    local dir=$1 pg=true nats=true
    shift
    while (($#)); do
        case $1 in
            --no-pg) pg=false ;;
            --no-nats) nats=false ;;
        esac
        shift
    done
    mkdir -p "$dir"
    : >"$dir/ha.env"
    if $pg; then tw_ha_pg_start "$dir"; fi
    if $nats; then tw_ha_nats_start "$dir"; fi
}
