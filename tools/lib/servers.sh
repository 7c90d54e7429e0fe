# tools/lib/servers.sh — bash helpers shared by tools/test and tools/run-local: install build dependencies, run a
# throwaway PostgreSQL and nats-server, and clean up on exit. Source it; it sets no shell options of its own.
# shellcheck shell=bash

# Debian packages the build and the tests need. libsystemd-dev is sd_notify for the daemons' Type=notify units;
# postgresql pulls in the server binaries (initdb, pg_ctl, postgres); clang-format is for tools/format-check, which
# tools/test runs first; clang and libclang-rt-dev (libFuzzer, only recommended by clang) for tools/fuzz;
# libssl-dev (libcrypto: a user nkey's public key) and openssl (the TLS tests make their certificates with it);
# python3-psycopg for the SQL API example, its test and the Python library's client; python3-pytest for the Python
# library's tests (python/tests); chromium for the console's browser test (tests/test_console.c), which also needs
# node and npm (see tw_missing_deps: only when there are none, since a Node.js of NodeSource brings its own npm).
TW_DEPS=(meson ninja-build pkg-config gcc libnats-dev libpq-dev libinih-dev libjansson-dev libevent-dev libsystemd-dev libssl-dev openssl
         check nats-server postgresql clang-format clang libclang-rt-dev
         python3-psycopg python3-pytest chromium scdoc)

tw_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
tw_die() { tw_log "$*"; exit 1; }

# ---- cleanup ---------------------------------------------------------------------------------------------------------
# Every start function registers its own stop with tw_on_exit; one trap runs them all, newest first, whatever way the
# script ends (error, Ctrl-C, normal exit).
TW_EXIT_HOOKS=()

tw_on_exit() { TW_EXIT_HOOKS+=("$1"); }

tw_run_exit_hooks() {
    local i
    for ((i = ${#TW_EXIT_HOOKS[@]} - 1; i >= 0; i--)); do
        eval "${TW_EXIT_HOOKS[i]}" || true
    done
    TW_EXIT_HOOKS=()
}

tw_trap_cleanup() {
    trap 'tw_run_exit_hooks' EXIT
    # Leave through EXIT so the hooks run exactly once, with the conventional 128+signal status.
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# ---- dependencies ----------------------------------------------------------------------------------------------------

tw_missing_deps() {
    local p
    for p in "${TW_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf '%s\n' "$p"
    done
    command -v node >/dev/null || printf '%s\n' nodejs
    command -v npm >/dev/null || printf '%s\n' npm
}

# Installs the build and test dependencies, touching apt only when something is missing (CI and fresh machines).
tw_install_deps() {
    local missing
    missing=$(tw_missing_deps)
    [[ -z $missing ]] && return 0
    # shellcheck disable=SC2086 # one package name per word
    tw_log "installing missing packages: "$missing
    [[ $(id -u) -eq 0 ]] || tw_die "need root to apt-get install: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    # shellcheck disable=SC2086
    apt-get install -y $missing
}

# ---- ports -----------------------------------------------------------------------------------------------------------

# A TCP port on 127.0.0.1 that nothing listens on, below the kernel's ephemeral range (client sockets take their
# local ports from that range and could otherwise sit on a port we restart a server on).
tw_free_port() {
    local lo=32768 port i
    read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
    ((lo > 11000)) || lo=32768
    for ((i = 0; i < 200; i++)); do
        port=$((10000 + RANDOM % (lo - 10000)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            printf '%s\n' "$port"
            return 0
        fi
    done
    tw_die "no free TCP port found"
}

# Waits until 127.0.0.1:PORT accepts connections; false after SECONDS (default 10).
tw_wait_port() {
    local port=$1 deadline=$((SECONDS + ${2:-10}))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# ---- PostgreSQL ------------------------------------------------------------------------------------------------------

# Debian keeps initdb and pg_ctl off PATH: take the newest /usr/lib/postgresql/<v>/bin.
tw_pg_bindir() {
    local d best=""
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x $d/initdb ]] || continue
        if [[ -z $best || ${d//[!0-9]/} -gt ${best//[!0-9]/} ]]; then best=$d; fi
    done
    if [[ -z $best ]] && command -v initdb >/dev/null; then best=$(dirname "$(command -v initdb)"); fi
    [[ -n $best ]] || tw_die "PostgreSQL server binaries not found (is the postgresql package installed?)"
    printf '%s\n' "$best"
}

# initdb and postgres refuse to run as root: run them as the postgres user then, from a directory it can enter.
tw_as_pg() {
    if [[ $(id -u) -eq 0 ]]; then
        (cd "$TW_PG_DIR" && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

# tw_pg_start DIR — a throwaway cluster in DIR/pg (trust auth, superuser postgres, fsync off) on a free port with a
# database `turnwatch`. Exports TW_PG_DIR, TW_PG_DATA, TW_PG_PORT, TW_PG_DSN; stops itself on exit.
# TW_PG_DURABLE=1 keeps fsync and full_page_writes on (PostgreSQL's defaults: every commit waits for the disk);
# TW_PG_CONF holds more postgresql.conf lines.
tw_pg_start() {
    local base=$1 bindir durable=off
    [[ ${TW_PG_DURABLE:-0} == 1 ]] && durable=on
    bindir=$(tw_pg_bindir)
    export TW_PG_DIR=$base/pg TW_PG_BIN=$bindir
    export TW_PG_DATA=$TW_PG_DIR/data
    mkdir -p "$TW_PG_DIR"
    if [[ $(id -u) -eq 0 ]]; then
        chmod 755 "$base"
        chown postgres: "$TW_PG_DIR"
    fi
    chmod 700 "$TW_PG_DIR"
    tw_as_pg "$bindir/initdb" -D "$TW_PG_DATA" -A trust -U postgres --no-sync --no-locale -E UTF8 \
        >"$base/initdb.log" 2>&1 || { cat "$base/initdb.log" >&2; tw_die "initdb failed"; }
    TW_PG_PORT=$(tw_free_port)
    export TW_PG_PORT
    # Appending as root keeps the file's owner. synchronous_commit stays on: a crashed server keeps its commits.
    cat >>"$TW_PG_DATA/postgresql.conf" <<EOF

# turnwatch throwaway cluster (tools/lib/servers.sh)
port = $TW_PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$TW_PG_DIR'
fsync = $durable
full_page_writes = $durable
max_connections = 200
${TW_PG_CONF:-}
EOF
    tw_on_exit tw_pg_stop
    tw_as_pg "$bindir/pg_ctl" -D "$TW_PG_DATA" -l "$TW_PG_DIR/postgres.log" -w -t 60 start >/dev/null ||
        { tail -n 40 "$TW_PG_DIR/postgres.log" >&2; tw_die "PostgreSQL did not start"; }
    tw_as_pg "$bindir/psql" -X -q -h 127.0.0.1 -p "$TW_PG_PORT" -U postgres -d postgres \
        -c 'CREATE DATABASE turnwatch' || tw_die "CREATE DATABASE turnwatch failed"
    export TW_PG_DSN="postgresql://postgres@127.0.0.1:$TW_PG_PORT/turnwatch"
    tw_log "PostgreSQL on port $TW_PG_PORT ($TW_PG_DIR/postgres.log)"
}

# Fast shutdown of the cluster started by tw_pg_start; harmless when none runs.
tw_pg_stop() {
    [[ -n ${TW_PG_DATA:-} && -f $TW_PG_DATA/postmaster.pid ]] || return 0
    tw_as_pg "$TW_PG_BIN/pg_ctl" -D "$TW_PG_DATA" -m fast -w -t 60 stop >/dev/null 2>&1 ||
        tw_as_pg "$TW_PG_BIN/pg_ctl" -D "$TW_PG_DATA" -m immediate -w stop >/dev/null 2>&1 || true
}

# ---- nats-server -----------------------------------------------------------------------------------------------------

# tw_nats_start DIR — nats-server on a free port, log in DIR/nats.log. Exports TW_NATS_PORT, TW_NATS_PID,
# TW_NATS_URL; stops itself on exit.
tw_nats_start() {
    local base=$1 bin
    bin=$(command -v nats-server || true)
    [[ -n $bin ]] || for bin in /usr/sbin/nats-server /usr/bin/nats-server ""; do [[ -x $bin ]] && break; done
    [[ -n $bin ]] || tw_die "nats-server not found (is the nats-server package installed?)"
    TW_NATS_PORT=$(tw_free_port)
    "$bin" -a 127.0.0.1 -p "$TW_NATS_PORT" >>"$base/nats.log" 2>&1 &
    export TW_NATS_PID=$! TW_NATS_PORT
    tw_on_exit tw_nats_stop
    tw_wait_port "$TW_NATS_PORT" 10 || { tail -n 20 "$base/nats.log" >&2; tw_die "nats-server did not start"; }
    export TW_NATS_URL="nats://127.0.0.1:$TW_NATS_PORT"
    tw_log "nats-server on port $TW_NATS_PORT ($base/nats.log)"
}

# SIGINT (nats-server's clean shutdown), then SIGKILL if it lingers.
tw_nats_stop() {
    [[ -n ${TW_NATS_PID:-} ]] || return 0
    tw_stop_pid "$TW_NATS_PID" INT 10
    TW_NATS_PID=
}

# ---- processes -------------------------------------------------------------------------------------------------------

# tw_stop_pid PID [SIGNAL [SECONDS]] — signal (default TERM), wait up to SECONDS (default 10), then SIGKILL.
tw_stop_pid() {
    local pid=$1 sig=${2:-TERM} secs=${3:-10} i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -CONT "$pid" 2>/dev/null || true
    kill -"$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < secs * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
}

# tw_tempdir — sets TW_TMP to a private temp dir that is removed on exit, after the servers started in it have
# stopped (hooks run newest first); with TW_KEEP=1 it stays, for reading the logs. Not in $(...): the hook must be
# registered in this shell.
tw_tempdir() {
    TW_TMP=$(mktemp -d /tmp/turnwatch-XXXXXX)
    if [[ ${TW_KEEP:-0} == 1 ]]; then
        tw_on_exit "tw_log 'kept $TW_TMP'"
    else
        tw_on_exit "rm -rf '$TW_TMP'"
    fi
}

# tw_bench_build ROOT — the benchmarks' release build: sets build=ROOT/build-bench, set up once, brought up to date.
tw_bench_build() {
    tw_install_deps
    build=$1/build-bench
    [[ -f $build/build.ninja ]] || meson setup "$build" --buildtype=release -Dtests=disabled >&2
    ninja -C "$build" >&2
}

# tw_bench_servers — a throwaway PostgreSQL (TW_PG_DURABLE and TW_PG_CONF as exported) and nats-server in a
# private temp dir, both stopped on exit, and psql_q to query the database. Not in $(...), as tw_tempdir.
tw_bench_servers() {
    tw_trap_cleanup
    tw_tempdir
    tw_pg_start "$TW_TMP"
    tw_nats_start "$TW_TMP"
    psql_q() { psql -X -q -t -A -h 127.0.0.1 -p "$TW_PG_PORT" -U postgres -d turnwatch "$@"; }
}
