#!/usr/bin/env bash
# Start and stop the private servers that lockkit's integration tests and the
# measurement lab talk to: a single Redis, 5 Redis masters for Redlock, a
# 3-master Redis Cluster, a Redis Sentinel deployment (a master, a replica,
# three sentinels), a 3-member etcd cluster and a PostgreSQL 15 cluster.
#
#   scripts/servers.sh install install what is missing (Debian packages), start nothing
#   scripts/servers.sh up      install what is missing, (re)start everything, write urls.env
#   scripts/servers.sh up sentinel   (re)start only the Sentinel deployment, add its URL
#   scripts/servers.sh down    stop exactly the processes this script started
#   scripts/servers.sh down sentinel stop only the Sentinel deployment
#   scripts/servers.sh env     print urls.env (eval "$(scripts/servers.sh env)")
#   scripts/servers.sh status  one line per server: up or down (exit 1 if any is down)
#
# Why it looks the way it does:
# - Fixed NON-standard loopback ports, so the servers never collide with the
#   machine's own Redis (6379), PostgreSQL (5432) or etcd (2379).
# - All state lives under target/lockkit-servers/ in the repo (gitignored), so
#   `cargo clean` or `rm -rf target` wipes it and nothing leaks elsewhere.
# - Servers run in the foreground of a background job (`&`), never
#   --daemonize: $! is then the server's own PID, which goes to a pid file, and
#   `down` stops exactly those PIDs and nothing else.
# - PID 1 on these machines does not reap orphans, so a stopped server may
#   linger as a zombie: every "is it alive" check treats a zombie as dead.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE_DIR="$REPO_ROOT/target/lockkit-servers"
PID_DIR="$STATE_DIR/pids"
LOG_DIR="$STATE_DIR/logs"
URLS_ENV="$STATE_DIR/urls.env"

PG_BIN=/usr/lib/postgresql/15/bin
HOST=127.0.0.1
READY_TIMEOUT=30 # seconds a server gets to answer before `up` gives up
STOP_TIMEOUT=10  # seconds between the polite signal and SIGKILL in `down`

REDIS_PORT=16379
REDLOCK_PORTS=(16381 16382 16383 16384 16385)
CLUSTER_PORTS=(16391 16392 16393)
ETCD_CLIENT_PORTS=(12379 12479 12579)
ETCD_PEER_PORTS=(12380 12480 12580)
PG_PORT=15432
SENTINEL_REDIS_PORTS=(16401 16402) # the master, then its replica
SENTINEL_PORTS=(26401 26402 26403)
SENTINEL_MASTER=mymaster

# Every server this script manages: "name port kind". The name is used for
# the pid file, the log file and the data dir; the kind says how to ping it.
SERVERS=("redis $REDIS_PORT redis")
for i in "${!REDLOCK_PORTS[@]}"; do SERVERS+=("redlock-$((i + 1)) ${REDLOCK_PORTS[$i]} redis"); done
for i in "${!CLUSTER_PORTS[@]}"; do SERVERS+=("cluster-$((i + 1)) ${CLUSTER_PORTS[$i]} redis"); done
for i in "${!ETCD_CLIENT_PORTS[@]}"; do SERVERS+=("etcd-$((i + 1)) ${ETCD_CLIENT_PORTS[$i]} etcd"); done
SERVERS+=("postgres $PG_PORT postgres")
SENTINEL_SERVERS=("sentinel-master ${SENTINEL_REDIS_PORTS[0]} redis" "sentinel-replica ${SENTINEL_REDIS_PORTS[1]} redis")
for i in "${!SENTINEL_PORTS[@]}"; do SENTINEL_SERVERS+=("sentinel-$((i + 1)) ${SENTINEL_PORTS[$i]} sentinel"); done
SERVERS+=("${SENTINEL_SERVERS[@]}")

log() { printf 'servers.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- installing

# Installs only the packages whose binaries are absent; `apt-get update` runs
# only when something has to be installed, so a warm machine does no network
# round trip at all.
install_missing() {
    local -a missing=()
    local spec path pkg
    # "file that proves it is installed:package"
    for spec in \
        /usr/bin/redis-server:redis-server \
        /usr/bin/redis-cli:redis-server \
        /usr/bin/etcd:etcd-server \
        /usr/bin/etcdctl:etcd-client \
        "$PG_BIN/postgres:postgresql" \
        "$PG_BIN/initdb:postgresql" \
        /usr/bin/psql:postgresql \
        /usr/bin/pg_isready:postgresql \
        /usr/bin/protoc:protobuf-compiler \
        /usr/include/google/protobuf/descriptor.proto:libprotobuf-dev \
        /usr/bin/faketime:faketime \
        /usr/bin/valgrind:valgrind \
        /usr/bin/callgrind_control:valgrind \
        /usr/bin/openssl:openssl; do
        path="${spec%%:*}"
        pkg="${spec##*:}"
        if [[ ! -e "$path" ]] && [[ " ${missing[*]-} " != *" $pkg "* ]]; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]} == 0)); then
        return 0
    fi
    [[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}); run as root or install them yourself"
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# ---------------------------------------------------------------- processes

pid_file() { echo "$PID_DIR/$1.pid"; }
log_file() { echo "$LOG_DIR/$1.log"; }

# The process name a server of this kind has in /proc/PID/comm. Checked before
# signalling a PID from a pid file, so a recycled PID is never signalled.
comm_of_kind() {
    case "$1" in
    redis | sentinel) echo redis-server ;;
    etcd) echo etcd ;;
    postgres) echo postgres ;;
    esac
}

# True if PID runs and is not a zombie (zombies stay around here: PID 1 does
# not reap, see the header).
pid_alive() {
    local pid=$1 state
    [[ -r /proc/$pid/stat ]] || return 1
    # Field 3 of /proc/PID/stat is the state; the command name before it is in
    # parentheses and may contain spaces, so cut after the last ')'.
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# Prints the PID recorded for server NAME of KIND if that process is alive and
# is still the server we started (same comm); prints nothing otherwise.
live_pid() {
    local name=$1 kind=$2 file pid
    file=$(pid_file "$name")
    [[ -f "$file" ]] || return 0
    pid=$(<"$file")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    pid_alive "$pid" || return 0
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$(comm_of_kind "$kind")" ]] || return 0
    echo "$pid"
}

# Starts a server in the foreground of a background job. `setsid` puts it in
# its own session, so a Ctrl-C or hang-up of the shell that ran `up` does not
# take the servers down; since this script has no job control the child is no
# process-group leader and setsid execs in place, so $! is the server's PID.
start_bg() {
    local name=$1
    shift
    setsid "$@" </dev/null >"$(log_file "$name")" 2>&1 &
    echo $! >"$(pid_file "$name")"
}

answers() {
    local kind=$1 port=$2
    case "$kind" in
    redis | sentinel) [[ "$(redis-cli -h $HOST -p "$port" ping 2>/dev/null)" == PONG ]] ;;
    etcd) ETCDCTL_API=3 etcdctl --endpoints="http://$HOST:$port" --dial-timeout=1s \
        --command-timeout=2s endpoint health >/dev/null 2>&1 ;;
    postgres) "$PG_BIN/pg_isready" -q -h $HOST -p "$port" -U postgres -d postgres -t 2 ;;
    esac
}

# wait_until NAME DESCRIPTION COMMAND...: polls COMMAND until it succeeds, for
# at most READY_TIMEOUT seconds. Gives up early if the server's process died.
# On failure prints the tail of the server's log and exits non-zero.
wait_until() {
    local name=$1 what=$2
    shift 2
    local deadline=$((SECONDS + READY_TIMEOUT)) pid
    pid=$(cat "$(pid_file "$name")" 2>/dev/null || true)
    until "$@"; do
        if [[ -n "$pid" ]] && ! pid_alive "$pid"; then
            log "$name exited before it was $what; last lines of $(log_file "$name"):"
            tail -n 30 "$(log_file "$name")" >&2 || true
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            log "$name was not $what after ${READY_TIMEOUT}s; last lines of $(log_file "$name"):"
            tail -n 30 "$(log_file "$name")" >&2 || true
            exit 1
        fi
        sleep 0.2
    done
}

# Stops every server whose pid file names a live process we started: a polite
# signal to all of them first (so they shut down in parallel), then SIGKILL
# for whatever still runs after STOP_TIMEOUT seconds.
stop_all() {
    local entry name port kind pid sig
    local -a pids=()
    for entry in "${SERVERS[@]}"; do
        read -r name port kind <<<"$entry"
        pid=$(live_pid "$name" "$kind")
        if [[ -n "$pid" ]]; then
            # PostgreSQL treats SIGTERM as "smart" shutdown, which waits for
            # every client to disconnect; SIGINT is its "fast" shutdown.
            sig=TERM
            [[ "$kind" == postgres ]] && sig=INT
            kill -s "$sig" "$pid" 2>/dev/null || true
            pids+=("$pid")
            log "stopping $name (pid $pid)"
        fi
    done
    local deadline=$((SECONDS + STOP_TIMEOUT)) killed=0
    local -a still
    while ((${#pids[@]} > 0)); do
        still=()
        for pid in "${pids[@]}"; do if pid_alive "$pid"; then still+=("$pid"); fi; done
        pids=(${still[@]+"${still[@]}"})
        ((${#pids[@]} == 0)) && break
        if ((SECONDS >= deadline)); then
            if ((killed)); then
                die "pids ${pids[*]} survived SIGKILL; not removing their pid files"
            fi
            for pid in "${pids[@]}"; do
                log "pid $pid did not stop within ${STOP_TIMEOUT}s, sending SIGKILL"
                kill -s KILL "$pid" 2>/dev/null || true
            done
            killed=1
            deadline=$((SECONDS + 5))
        fi
        sleep 0.1
    done
    for entry in "${SERVERS[@]}"; do
        read -r name port kind <<<"$entry"
        rm -f "$(pid_file "$name")"
    done
}

# Fails, naming the port and its owner, if any port we need is already
# listened on. Runs after our own old servers were stopped, so whatever is
# found belongs to someone else and must not be touched.
check_ports_free() {
    local port line
    local -a ports=("${SENTINEL_REDIS_PORTS[@]}" "${SENTINEL_PORTS[@]}")
    if [[ "$ONLY" != sentinel ]]; then
        ports+=("$REDIS_PORT" "${REDLOCK_PORTS[@]}" "${CLUSTER_PORTS[@]}"
            "${ETCD_CLIENT_PORTS[@]}" "${ETCD_PEER_PORTS[@]}" "$PG_PORT")
        # A cluster node also listens on its port + 10000 (the cluster bus).
        for port in "${CLUSTER_PORTS[@]}"; do ports+=($((port + 10000))); done
    fi
    for port in "${ports[@]}"; do
        line=$(ss -Hltnp "sport = :$port" 2>/dev/null | head -n 1)
        if [[ -n "$line" ]]; then
            die "port $port is already in use by a process this script did not start: $line"
        fi
    done
}

# ---------------------------------------------------------------- starting

start_redis() {
    local name=$1 port=$2
    shift 2
    mkdir -p "$STATE_DIR/$name"
    start_bg "$name" redis-server --bind $HOST --port "$port" --dir "$STATE_DIR/$name" \
        --save "" --appendonly no --daemonize no --protected-mode no "$@"
}

start_etcd() {
    local i=$1 token=$2 cluster=$3
    local name="etcd-$((i + 1))"
    local client="http://$HOST:${ETCD_CLIENT_PORTS[$i]}" peer="http://$HOST:${ETCD_PEER_PORTS[$i]}"
    # etcd 3.4 defaults to the deprecated capnslog logger and warns about it;
    # zap on stderr gives structured lines in the log file instead.
    start_bg "$name" etcd --name "$name" --data-dir "$STATE_DIR/$name" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "$cluster" --initial-cluster-state new \
        --initial-cluster-token "$token" --logger zap --log-outputs stderr
}

start_postgres() {
    local data="$STATE_DIR/postgres/data" sock="$STATE_DIR/postgres/socket"
    mkdir -p "$data" "$sock"
    chmod 700 "$data"
    # initdb and postgres refuse to run as root: everything runs as the
    # `postgres` user, which must own the data and socket dirs.
    chown -R postgres:postgres "$STATE_DIR/postgres"
    # Trust auth is fine: the server listens on loopback only, for tests.
    runuser -u postgres -- "$PG_BIN/initdb" -D "$data" -U postgres -A trust \
        --encoding=UTF8 --locale=C --no-sync >"$(log_file postgres-initdb)" 2>&1 ||
        { tail -n 30 "$(log_file postgres-initdb)" >&2; die "initdb failed"; }
    # setpriv execs (runuser would fork and wait), so $! is the postmaster.
    # Every held lock pins a connection, and the suite, the lab and pgbench
    # share this server: room for several hundred clients.
    start_bg postgres setpriv --reuid=postgres --regid=postgres --init-groups -- \
        "$PG_BIN/postgres" -D "$data" -p "$PG_PORT" -k "$sock" -c listen_addresses=$HOST \
        -c max_connections=400
}

# The Sentinel deployment: a master, its replica, three sentinels that watch
# it (quorum 2). Down after 5 s without an answer: a loaded CI machine must
# not fail the shared master over by accident.
start_sentinel_deployment() {
    local master=${SENTINEL_REDIS_PORTS[0]} i name
    start_redis sentinel-master "$master"
    start_redis sentinel-replica "${SENTINEL_REDIS_PORTS[1]}" --replicaof $HOST "$master"
    for i in "${!SENTINEL_PORTS[@]}"; do
        name="sentinel-$((i + 1))"
        mkdir -p "$STATE_DIR/$name"
        # A sentinel rewrites its config file: one each.
        printf '%s\n' \
            "sentinel monitor $SENTINEL_MASTER $HOST $master 2" \
            "sentinel down-after-milliseconds $SENTINEL_MASTER 5000" \
            "sentinel failover-timeout $SENTINEL_MASTER 10000" >"$STATE_DIR/$name/sentinel.conf"
        start_bg "$name" redis-server "$STATE_DIR/$name/sentinel.conf" --sentinel --bind $HOST \
            --port "${SENTINEL_PORTS[$i]}" --dir "$STATE_DIR/$name" --daemonize no --protected-mode no
    done
}

# Before this, a failover has no replica to promote and no quorum to vote.
sentinel_formed() {
    local port info
    redis-cli -h $HOST -p "${SENTINEL_REDIS_PORTS[1]}" info replication 2>/dev/null |
        grep -q '^master_link_status:up' || return 1
    for port in "${SENTINEL_PORTS[@]}"; do
        info=$(redis-cli -h $HOST -p "$port" sentinel master $SENTINEL_MASTER 2>/dev/null | tr -d '\r')
        [[ "$(grep -x -A1 'num-slaves' <<<"$info" | tail -n 1)" == 1 ]] || return 1
        [[ "$(grep -x -A1 'num-other-sentinels' <<<"$info" | tail -n 1)" == 2 ]] || return 1
    done
}

sentinel_url() {
    echo "LOCKKIT_REDIS_SENTINEL_URL=redis+sentinel://$(join_hostports "${SENTINEL_PORTS[@]}")/$SENTINEL_MASTER"
}

cluster_ok() {
    local port
    for port in "${CLUSTER_PORTS[@]}"; do
        redis-cli -h $HOST -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    done
}

etcd_healthy() {
    local eps="" port
    for port in "${ETCD_CLIENT_PORTS[@]}"; do eps+="${eps:+,}http://$HOST:$port"; done
    ETCDCTL_API=3 etcdctl --endpoints="$eps" --dial-timeout=1s --command-timeout=2s \
        endpoint health >/dev/null 2>&1
}

write_urls_env() {
    local tmp="$URLS_ENV.tmp"
    cat >"$tmp" <<EOF
LOCKKIT_REDIS_URL=redis://$HOST:$REDIS_PORT
LOCKKIT_REDLOCK_URL=redlock://$(join_hostports "${REDLOCK_PORTS[@]}")
LOCKKIT_REDIS_CLUSTER_URL=redis+cluster://$(join_hostports "${CLUSTER_PORTS[@]}")
LOCKKIT_ETCD_URL=etcd://$(join_hostports "${ETCD_CLIENT_PORTS[@]}")
LOCKKIT_POSTGRES_URL=postgres://postgres@$HOST:$PG_PORT/lockkit
$(sentinel_url)
EOF
    mv "$tmp" "$URLS_ENV"
}

# `up sentinel`: the other servers' URLs stay as they are.
add_sentinel_url() {
    local tmp="$URLS_ENV.tmp"
    { grep -v '^LOCKKIT_REDIS_SENTINEL_URL=' "$URLS_ENV" 2>/dev/null || true; sentinel_url; } >"$tmp"
    mv "$tmp" "$URLS_ENV"
}

# `up sentinel`: (re)starts only the Sentinel deployment.
cmd_up_sentinel() {
    install_missing
    stop_all
    check_ports_free
    local entry name port kind
    for entry in "${SERVERS[@]}"; do
        read -r name port kind <<<"$entry"
        rm -rf "${STATE_DIR:?}/$name"
    done
    mkdir -p "$PID_DIR" "$LOG_DIR"
    trap 'log "up failed, stopping what it started"; stop_all' EXIT
    start_sentinel_deployment
    for entry in "${SERVERS[@]}"; do
        read -r name port kind <<<"$entry"
        wait_until "$name" "answering on port $port" answers "$kind" "$port"
    done
    wait_until sentinel-1 "watching a replica with two other sentinels" sentinel_formed
    add_sentinel_url
    trap - EXIT
    log "the Sentinel deployment is up; $(sentinel_url)"
}

join_hostports() {
    local out="" port
    for port in "$@"; do out+="${out:+,}$HOST:$port"; done
    echo "$out"
}

cmd_up() {
    local started=$SECONDS
    install_missing
    # Servers from an earlier `up` are stopped and started afresh rather than
    # reused: every `up` then gives the same clean state (empty Redis, a new
    # etcd cluster, a new database), whatever a previous test run left behind.
    stop_all
    check_ports_free
    # Wipe the old state (old etcd members and cluster nodes.conf files would
    # refuse to form a new cluster) but keep nothing else around.
    rm -rf "$STATE_DIR"
    mkdir -p "$PID_DIR" "$LOG_DIR"

    # If anything below fails, stop what this run started: a half-started set
    # of servers would only confuse the next test run.
    trap 'log "up failed, stopping what it started"; stop_all' EXIT

    # Start everything first, then wait: the servers boot in parallel.
    start_redis redis "$REDIS_PORT"
    local i port
    for i in "${!REDLOCK_PORTS[@]}"; do start_redis "redlock-$((i + 1))" "${REDLOCK_PORTS[$i]}"; done
    for i in "${!CLUSTER_PORTS[@]}"; do
        start_redis "cluster-$((i + 1))" "${CLUSTER_PORTS[$i]}" --cluster-enabled yes \
            --cluster-config-file "$STATE_DIR/cluster-$((i + 1))/nodes.conf" --cluster-node-timeout 5000
    done
    local token="lockkit-dev-$(date +%s)-$$" cluster=""
    for i in "${!ETCD_PEER_PORTS[@]}"; do cluster+="${cluster:+,}etcd-$((i + 1))=http://$HOST:${ETCD_PEER_PORTS[$i]}"; done
    for i in "${!ETCD_CLIENT_PORTS[@]}"; do start_etcd "$i" "$token" "$cluster"; done
    start_postgres
    start_sentinel_deployment

    local entry name kind
    for entry in "${SERVERS[@]}"; do
        read -r name port kind <<<"$entry"
        wait_until "$name" "answering on port $port" answers "$kind" "$port"
    done

    # The cluster nodes answer PING before they form a cluster: assign the
    # slots now, then wait until every node agrees the cluster is ok.
    local -a nodes=()
    for port in "${CLUSTER_PORTS[@]}"; do nodes+=("$HOST:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
        >"$(log_file cluster-create)" 2>&1 ||
        { tail -n 30 "$(log_file cluster-create)" >&2; die "redis-cli --cluster create failed"; }
    wait_until cluster-1 "in cluster_state:ok on all nodes" cluster_ok
    wait_until etcd-1 "healthy on all members" etcd_healthy
    wait_until sentinel-1 "watching a replica with two other sentinels" sentinel_formed

    "$PG_BIN/psql" -q -h $HOST -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 \
        -c 'CREATE DATABASE lockkit' >/dev/null
    write_urls_env
    trap - EXIT
    log "all servers up in $((SECONDS - started))s; urls in ${URLS_ENV#"$REPO_ROOT"/}"
    cat "$URLS_ENV"
}

cmd_down() {
    if [[ -d "$PID_DIR" ]]; then
        stop_all
    fi
    log "down"
}

cmd_env() {
    [[ -f "$URLS_ENV" ]] || die "no ${URLS_ENV#"$REPO_ROOT"/}: run scripts/servers.sh up first"
    cat "$URLS_ENV"
}

cmd_status() {
    local entry name port kind pid state all_up=0
    for entry in "${SERVERS[@]}"; do
        read -r name port kind <<<"$entry"
        pid=$(live_pid "$name" "$kind")
        if [[ -n "$pid" ]] && answers "$kind" "$port"; then
            state="up (pid $pid)"
        elif [[ -n "$pid" ]]; then
            state="down (pid $pid runs but does not answer)"
            all_up=1
        else
            state="down"
            all_up=1
        fi
        printf '%-10s %s:%-5s %s\n' "$name" "$HOST" "$port" "$state"
    done
    return $all_up
}

# `up sentinel` / `down sentinel`: only the Sentinel deployment.
ONLY=""
if [[ "${2-}" == sentinel ]]; then
    ONLY=sentinel
    SERVERS=("${SENTINEL_SERVERS[@]}")
elif [[ -n "${2-}" ]]; then
    die "unknown subset '$2'; the one subset is 'sentinel'"
fi

case "${1-}" in
install) install_missing ;;
up) if [[ "$ONLY" == sentinel ]]; then cmd_up_sentinel; else cmd_up; fi ;;
down) cmd_down ;;
env) cmd_env ;;
status) cmd_status ;;
*)
    echo "usage: $0 install|up|down|env|status [sentinel]" >&2
    exit 2
    ;;
esac
