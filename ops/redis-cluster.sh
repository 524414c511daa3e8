#!/usr/bin/env bash
# A 3-primary + 3-replica Redis Cluster on 127.0.0.1, for development and
# tests of freqcap's shared state (one machine; not a production layout).
#
#   ops/redis-cluster.sh start  DIR [BASE_PORT]   # default BASE_PORT 7100
#   ops/redis-cluster.sh stop   DIR
#   ops/redis-cluster.sh status DIR
#
# start   installs redis-server/redis-tools with apt-get if redis-server is
#         missing, starts 6 nodes on ports BASE..BASE+5 (data, log, pid file
#         and cluster config of each in DIR/<port>; "port pid" lines in
#         DIR/pids), creates the cluster (or, when an earlier start in DIR
#         created one, restarts it with its nodes.conf and AOF data), waits
#         until it is healthy, and prints the seed list
#         `redis-cluster://127.0.0.1:BASE,...` as its last stdout line
#         (progress goes to stderr, so SEEDS=$(... start DIR) works).
#         On any failure it stops what it started and exits nonzero.
# stop    stops the nodes listed in DIR/pids (SIGTERM, SIGKILL after 5 s),
#         then removes DIR/pids; the data in DIR/<port> stays.
# status  prints port, pid, alive, role of each node; exit 0 only when all
#         six are alive.
#
# Every node listens on 127.0.0.1 only (and its cluster bus on port+10000),
# every wait is bounded, and processes are only ever signalled by the PIDs
# this script recorded, after checking they are still our redis-server.
#
# A secured cluster, as a managed Redis is (docs/cluster.md, "A secured
# Redis"), from the environment of start (and status):
#   REDIS_TLS_DIR=D       TLS only (no plaintext port), the cluster bus and
#                         replication included, with D/ca.pem, D/redis.pem
#                         and D/redis.key; the seeds printed are then
#                         rediss-cluster://...
#   REDIS_TLS_AUTH_CLIENTS=yes|no|optional   client certificates (default no)
#   REDIS_ACL_USER=U REDIS_ACL_PASSWORD=P    an ACL user with every right, the
#                         default user off, replicas authenticating as U
set -euo pipefail

NODES=6
HEALTH_TIMEOUT_S=30   # start: longest wait for a healthy cluster
STOP_TIMEOUT_S=5      # stop: grace after SIGTERM before SIGKILL
CALL_TIMEOUT_S=2      # any single redis-cli call (a stopped node must not hang us)

PROG=${0##*/}
log() { echo "$PROG: $*" >&2; }
die() { log "error: $*"; exit 1; }
usage() {
  sed -n '5,7p' "$0" | sed 's/^# *//' >&2
  exit 2
}

# What a secured cluster adds to redis-server's and redis-cli's arguments.
SERVER_SECURE=() CLI_SECURE=() SCHEME=redis-cluster
if [[ -n ${REDIS_TLS_DIR:-} ]]; then
  for f in ca.pem redis.pem redis.key; do
    [[ -r $REDIS_TLS_DIR/$f ]] || { echo "${0##*/}: error: REDIS_TLS_DIR has no readable $f" >&2; exit 1; }
  done
  SERVER_SECURE+=(--tls-cert-file "$REDIS_TLS_DIR/redis.pem" --tls-key-file "$REDIS_TLS_DIR/redis.key"
    --tls-ca-cert-file "$REDIS_TLS_DIR/ca.pem" --tls-cluster yes --tls-replication yes
    --tls-auth-clients "${REDIS_TLS_AUTH_CLIENTS:-no}")
  CLI_SECURE+=(--tls --cacert "$REDIS_TLS_DIR/ca.pem" --cert "$REDIS_TLS_DIR/redis.pem" --key "$REDIS_TLS_DIR/redis.key")
  SCHEME=rediss-cluster
fi
if [[ -n ${REDIS_ACL_USER:-} ]]; then
  [[ -n ${REDIS_ACL_PASSWORD:-} ]] || { echo "${0##*/}: error: REDIS_ACL_USER needs REDIS_ACL_PASSWORD" >&2; exit 1; }
  SERVER_SECURE+=(--user default off --user "$REDIS_ACL_USER" on ">$REDIS_ACL_PASSWORD" '~*' '&*' '+@all'
    --masteruser "$REDIS_ACL_USER" --masterauth "$REDIS_ACL_PASSWORD")
  CLI_SECURE+=(--user "$REDIS_ACL_USER" --pass "$REDIS_ACL_PASSWORD" --no-auth-warning)
fi

# The node's port: the TLS port of a secured cluster (no plaintext one).
port_args() {
  if [[ -n ${REDIS_TLS_DIR:-} ]]; then echo "--port 0 --tls-port $1"; else echo "--port $1"; fi
}

# redis-cli against one local node, bounded in time. Never -c: the checks
# below ask each node about itself.
rcli() { local port=$1; shift; timeout "$CALL_TIMEOUT_S" redis-cli -h 127.0.0.1 -p "$port" "${CLI_SECURE[@]}" "$@"; }

# True when PID is alive and still the redis-server of PORT: guards against
# signalling an unrelated process that reused the PID. Accepted:
# - a child of this very shell (start's own nodes): its PID cannot be reused
#   before we reap it, and it may not have exec'd redis-server yet, or not yet
#   rewritten its command line;
# - a redis-server whose command line names PORT, as Redis rewrites it
#   ("redis-server 127.0.0.1:PORT [cluster]") or as started ("--port PORT").
# A zombie (exited, not yet reaped by its new parent) counts as gone.
is_our_redis() {
  local port=$1 pid=$2 stat fields comm cmdline
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  read -r -a fields <<<"${stat##*) }"   # state ppid ... (after "pid (comm) ")
  [[ ${fields[0]} != Z ]] || return 1
  [[ ${fields[1]} == "$$" ]] && return 0
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == redis-server ]] || return 1
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ "$cmdline " == *":$port "* || "$cmdline " == *"--port $port "* || "$cmdline " == *"--tls-port $port "* ]]
}

# Reads DIR/pids into the parallel arrays PORTS and PIDS.
read_pids() {
  PORTS=() PIDS=()
  local port pid
  while read -r port pid; do
    [[ -n ${port:-} ]] || continue
    PORTS+=("$port") PIDS+=("${pid:-}")
  done < "$DIR/pids"
}

# Stops every node in DIR/pids: SIGTERM to all at once (Redis then flushes
# its AOF and exits), up to STOP_TIMEOUT_S for them to go, SIGKILL for the
# rest, then removes DIR/pids once none of them is left.
stop_nodes() {
  [[ -f $DIR/pids ]] || { log "nothing to stop: no $DIR/pids"; return 0; }
  read_pids
  local i live=()
  for i in "${!PORTS[@]}"; do
    if is_our_redis "${PORTS[i]}" "${PIDS[i]}"; then
      kill -TERM "${PIDS[i]}" 2>/dev/null || true
      live+=("$i")
    else
      log "port ${PORTS[i]}: pid ${PIDS[i]:-?} is not running (or not our redis-server): skipped"
    fi
  done
  local deadline=$(( SECONDS + STOP_TIMEOUT_S )) left
  while :; do
    left=()
    for i in "${live[@]}"; do is_our_redis "${PORTS[i]}" "${PIDS[i]}" && left+=("$i"); done
    (( ${#left[@]} == 0 || SECONDS >= deadline )) && break
    sleep 0.1
  done
  for i in "${left[@]}"; do
    log "port ${PORTS[i]}: pid ${PIDS[i]} still alive after ${STOP_TIMEOUT_S} s: SIGKILL"
    kill -KILL "${PIDS[i]}" 2>/dev/null || true
  done
  # SIGKILL cannot be ignored, but the kernel takes a moment to reap.
  for _ in $(seq 20); do
    left=()
    for i in "${live[@]}"; do is_our_redis "${PORTS[i]}" "${PIDS[i]}" && left+=("$i"); done
    (( ${#left[@]} == 0 )) && break
    sleep 0.1
  done
  if (( ${#left[@]} > 0 )); then
    die "could not stop pids: $(for i in "${left[@]}"; do printf '%s ' "${PIDS[i]}"; done); $DIR/pids kept"
  fi
  for i in "${live[@]}"; do log "port ${PORTS[i]}: pid ${PIDS[i]} stopped"; done
  rm -f "$DIR/pids"
}

# Installs redis-server and redis-tools (redis-cli) when redis-server is
# missing. Debian's package also enables a default redis-server service on
# port 6379 where systemd runs; it does not touch the ports used here.
ensure_redis() {
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    local sudo=()
    if (( EUID != 0 )); then
      command -v sudo >/dev/null || die "redis-server is missing and we are not root (no sudo): install redis-server"
      sudo=(sudo)
    fi
    log "installing redis-server and redis-tools with apt-get"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 ||
      die "apt-get update failed"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools >&2 ||
      die "apt-get install redis-server redis-tools failed"
    command -v redis-server >/dev/null || die "redis-server still not found after apt-get install"
  fi
  # freqcap uses Redis Functions (FUNCTION LOAD, FCALL): 7.0 or newer.
  local version major
  version=$(redis-server --version | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')
  major=${version%%.*}
  [[ $major =~ ^[0-9]+$ ]] && (( major >= 7 )) ||
    die "redis-server ${version:-of unknown version} found; Redis 7.0+ is needed (Functions)"
  log "redis-server $version"
}

# One poll of cluster health. True when every node says cluster_state:ok with
# 6 known nodes and 3 slot-serving primaries, and the roles are 3 primaries
# each with exactly 1 connected replica and 3 replicas with their link up.
# Sets HEALTH to a one-line reason otherwise.
cluster_healthy() {
  local port info repl primaries=0 replicas=0
  for port in "${PORTS[@]}"; do
    info=$(rcli "$port" CLUSTER INFO 2>/dev/null | tr -d '\r') || { HEALTH="$port: no answer"; return 1; }
    grep -qx 'cluster_state:ok' <<<"$info" || { HEALTH="$port: cluster_state not ok"; return 1; }
    grep -qx 'cluster_known_nodes:6' <<<"$info" || { HEALTH="$port: does not know all 6 nodes yet"; return 1; }
    grep -qx 'cluster_size:3' <<<"$info" || { HEALTH="$port: cluster_size not 3"; return 1; }
    repl=$(rcli "$port" INFO replication 2>/dev/null | tr -d '\r') || { HEALTH="$port: no answer"; return 1; }
    if grep -qx 'role:master' <<<"$repl"; then
      grep -qx 'connected_slaves:1' <<<"$repl" || { HEALTH="$port: primary without exactly 1 connected replica"; return 1; }
      # A connected replica may still be loading its first sync; WAIT
      # answers 1 only once it has acknowledged the primary's offset, so the
      # first write that waits for a replica (durability replicated) does
      # not time out on a cluster that just started.
      [[ $(rcli "$port" WAIT 1 200 2>/dev/null | tr -d '\r') == 1 ]] ||
        { HEALTH="$port: its replica has not acknowledged the primary's offset"; return 1; }
      primaries=$((primaries + 1))
    elif grep -qx 'role:slave' <<<"$repl"; then
      grep -qx 'master_link_status:up' <<<"$repl" || { HEALTH="$port: replica link not up"; return 1; }
      replicas=$((replicas + 1))
    else
      HEALTH="$port: unknown role"; return 1
    fi
  done
  (( primaries == 3 && replicas == 3 )) || { HEALTH="$primaries primaries, $replicas replicas"; return 1; }
}

cmd_start() {
  local base=$1 port i
  [[ $base =~ ^[0-9]+$ ]] && (( base >= 1024 && base + NODES - 1 + 10000 <= 65535 )) ||
    die "BASE_PORT must be 1024..$((65535 - 10000 - NODES + 1)) (each node also uses port+10000 for the cluster bus)"

  if [[ -f $DIR/pids ]]; then
    read_pids
    for i in "${!PORTS[@]}"; do
      is_our_redis "${PORTS[i]}" "${PIDS[i]}" &&
        die "$DIR/pids lists a live redis-server (port ${PORTS[i]}, pid ${PIDS[i]}): run '$PROG stop $DIR' first"
    done
    log "removing stale $DIR/pids (none of its processes is running)"
    rm -f "$DIR/pids"
  fi

  ensure_redis

  PORTS=()
  for ((i = 0; i < NODES; i++)); do PORTS+=($((base + i))); done

  # A Redis already answering on one of the ports would be mistaken for ours.
  for port in "${PORTS[@]}"; do
    if rcli "$port" PING >/dev/null 2>&1; then die "127.0.0.1:$port already answers: another Redis is running there"; fi
  done

  # Fresh cluster, or a restart of the one an earlier start created (marked
  # by DIR/created once it was healthy)? nodes.conf files without the mark
  # are leftovers of a start that failed: a fresh create needs them gone.
  local restart=0
  if [[ -f $DIR/created ]]; then
    local created_base
    created_base=$(< "$DIR/created")
    [[ $created_base == "$base" ]] ||
      die "$DIR holds a cluster created with BASE_PORT $created_base: use that, or another DIR"
    for port in "${PORTS[@]}"; do
      [[ -s $DIR/$port/nodes.conf ]] ||
        die "$DIR/$port/nodes.conf is missing: cluster state incomplete; remove $DIR to start fresh"
    done
    restart=1
  else
    for port in "${PORTS[@]}"; do rm -f "$DIR/$port/nodes.conf"; done
  fi

  # From here on, a failure stops whatever was started.
  trap 'status=$?; if (( status != 0 )) && [[ -f $DIR/pids ]]; then log "start failed: stopping the nodes it started"; stop_nodes || true; fi' EXIT

  : > "$DIR/pids"
  for port in "${PORTS[@]}"; do
    mkdir -p "$DIR/$port"
    # --daemonize no + '&': the PID we record is the server's own. stdin/out
    # are detached so the caller's pipes do not stay open.
    # --repl-diskless-sync-delay 0: a primary otherwise waits 5 s for more
    # replicas before the first full sync; with one replica each that is 5 s
    # of every start (and of every resync in failover tests) for nothing.
    # shellcheck disable=SC2046 # port_args is two words or four, on purpose
    redis-server $(port_args "$port") --bind 127.0.0.1 "${SERVER_SECURE[@]}" \
      --cluster-enabled yes --cluster-config-file "$DIR/$port/nodes.conf" \
      --cluster-node-timeout 2000 --repl-diskless-sync-delay 0 \
      --dir "$DIR/$port" --appendonly yes --appendfsync everysec --save '' \
      --daemonize no --logfile "$DIR/$port/redis.log" --pidfile "$DIR/$port/redis.pid" \
      </dev/null >/dev/null 2>&1 &
    echo "$port $!" >> "$DIR/pids"
    # Not a job of this shell: it outlives the script, and a SIGKILL from
    # stop_nodes on failure is not reported as "Killed" noise.
    disown "$!"
  done
  read_pids
  log "started ${#PIDS[@]} redis-server processes: ${PIDS[*]}"

  # Wait for each node to answer (or to die, e.g. port or bus port taken).
  local deadline=$(( SECONDS + HEALTH_TIMEOUT_S ))
  for i in "${!PORTS[@]}"; do
    port=${PORTS[i]}
    until [[ $(rcli "$port" PING 2>/dev/null) == PONG ]]; do
      is_our_redis "$port" "${PIDS[i]}" ||
        die "redis-server on port $port exited: $(tail -n 3 "$DIR/$port/redis.log" 2>/dev/null | tr '\n' ' ')"
      (( SECONDS < deadline )) || die "port $port did not answer within ${HEALTH_TIMEOUT_S} s"
      sleep 0.1
    done
  done

  if (( restart )); then
    log "restarting the existing cluster from $DIR (nodes.conf and AOF of each node)"
  else
    log "creating the cluster (redis-cli --cluster create, log in $DIR/create.log)"
    local addrs=()
    for port in "${PORTS[@]}"; do addrs+=("127.0.0.1:$port"); done
    # redis-cli waits for the join itself with no limit of its own: bound it.
    timeout "$HEALTH_TIMEOUT_S" redis-cli "${CLI_SECURE[@]}" --cluster create "${addrs[@]}" \
      --cluster-replicas 1 --cluster-yes > "$DIR/create.log" 2>&1 ||
      die "redis-cli --cluster create failed: $(tail -n 5 "$DIR/create.log" | sed "s/\x1b\[[0-9;]*m//g" | tr "\n" " ")"
  fi

  # Healthy = every node agrees the cluster is ok and replication is attached.
  deadline=$(( SECONDS + HEALTH_TIMEOUT_S ))
  HEALTH="not checked yet"
  until cluster_healthy; do
    for i in "${!PORTS[@]}"; do
      is_our_redis "${PORTS[i]}" "${PIDS[i]}" || die "redis-server on port ${PORTS[i]} exited (see $DIR/${PORTS[i]}/redis.log)"
    done
    (( SECONDS < deadline )) || die "cluster not healthy within ${HEALTH_TIMEOUT_S} s: $HEALTH"
    sleep 0.15
  done

  trap - EXIT
  echo "$base" > "$DIR/created"
  log "cluster healthy: 3 primaries, 3 replicas"
  local seeds=()
  for port in "${PORTS[@]}"; do seeds+=("127.0.0.1:$port"); done
  (IFS=,; echo "$SCHEME://${seeds[*]}")
}

cmd_status() {
  [[ -f $DIR/pids ]] || { log "not running: no $DIR/pids"; return 1; }
  read_pids
  local i alive role all=0
  printf '%-6s %-8s %-5s %s\n' port pid alive role
  for i in "${!PORTS[@]}"; do
    if is_our_redis "${PORTS[i]}" "${PIDS[i]}"; then
      alive=yes
      role=$(rcli "${PORTS[i]}" ROLE 2>/dev/null | head -n 1 | tr -d '\r') || role=
      [[ -n $role ]] || role="(no answer)"
    else
      alive=no role=- all=1
    fi
    printf '%-6s %-8s %-5s %s\n' "${PORTS[i]}" "${PIDS[i]:-?}" "$alive" "$role"
  done
  return "$all"
}

[[ $# -ge 2 ]] || usage
CMD=$1 DIR=$2
[[ $DIR != *[[:space:]]* ]] || die "DIR must not contain whitespace (it goes into redis-server arguments)"
case $CMD in
  start)
    [[ $# -le 3 ]] || usage
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)  # absolute: the nodes chdir into their own dirs
    cmd_start "${3:-7100}"
    ;;
  stop)
    [[ $# -eq 2 ]] || usage
    [[ -d $DIR ]] || die "no such directory: $DIR"
    DIR=$(cd "$DIR" && pwd)
    stop_nodes
    ;;
  status)
    [[ $# -eq 2 ]] || usage
    [[ -d $DIR ]] || die "no such directory: $DIR"
    DIR=$(cd "$DIR" && pwd)
    cmd_status
    ;;
  *) usage ;;
esac
