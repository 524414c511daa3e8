#!/usr/bin/env bash
# freqcap nodes on one Redis Cluster: what an ad request costs (docs/cluster.md).
#
#   benches/cluster.sh [OUT_DIR]    # default: ${TMPDIR:-/tmp}/freqcap-cluster/<UTC time>
#
# Starts a 3-primary + 3-replica Redis Cluster (ops/redis-cluster.sh, AOF on)
# and, for 1, 2 and 3 freqcap nodes (durability wal), runs the load
# generator's `screen` workload (screen of K=50 candidates for a Zipf user,
# then a commit of one winner) closed loop over CONNS connections for SECS
# seconds, with users routed by affinity and, for 3 nodes, spread, and again
# with spend reports batched (--spend-reports batched). For each
# run it reads, before and after, the nodes' /metrics (Redis calls, CAS,
# conflicts, lease calls) and the CPU time of every Redis server and every
# freqcap node (/proc/PID/stat), and prints per ad request: Redis calls,
# CAS, conflicts, lease calls, Redis CPU and freqcap CPU, with throughput and
# latency. On this 2-core machine all processes share both cores, so
# throughput does not scale with nodes; the per-request costs are what carry
# over to a real deployment (nodes on their own machines). Every process is
# stopped by its PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-5}
CONNS=${CONNS:-32}
K=${K:-50}
BASE=${BASE:-7600}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-cluster/$(date -u +%Y%m%dT%H%M%SZ)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/freqcap-target}

if [ -z "${FREQCAP_BIN:-}" ]; then cargo build --release --bin freqcap; fi
LOADGEN=${LOADGEN_BIN:-}
[ -n "$LOADGEN" ] || LOADGEN=$(cargo bench --bench loadgen --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] == "loadgen": print(m["executable"])')
FREQCAP=${FREQCAP_BIN:-$CARGO_TARGET_DIR/release/freqcap}
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

NODE_PIDS=()
stop_nodes() {
    local p
    for p in "${NODE_PIDS[@]}"; do { kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; } || true; done
    NODE_PIDS=()
    return 0
}
cleanup() {
    stop_nodes
    ops/redis-cluster.sh stop "$OUT/redis" >/dev/null 2>&1 || true
}
trap cleanup EXIT

SEEDS=$(ops/redis-cluster.sh start "$OUT/redis" "$BASE" | tail -1)
REDIS_PIDS=$(awk '{print $2}' "$OUT/redis/pids")

# CPU seconds (user + system) of the given PIDs.
cpu() {
    local ticks=0 p
    for p in "$@"; do
        [ -r "/proc/$p/stat" ] || continue
        # Fields 14 and 15, after the command in parentheses.
        ticks=$((ticks + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    python3 -c "print($ticks / $(getconf CLK_TCK))"
}

# The sum of one counter over the nodes' /metrics.
metric() {
    local name=$1 total=0 port v
    shift
    for port in "$@"; do
        v=$(curl -sf "http://127.0.0.1:$port/metrics" | awk -v n="$name" '$1 == n {print $2}')
        total=$(python3 -c "print($total + ${v:-0})")
    done
    echo "$total"
}

printf '%-6s %-9s %-8s %9s %8s %8s %10s %8s %10s %10s %12s %13s\n' nodes route reports 'ads/s' 'p50 ms' 'p99 ms' 'redis/ad' 'CAS/ad' 'conflicts' 'lease/ad' 'redis µs/ad' 'freqcap µs/ad' | tee "$OUT/table.txt"
run() {
    local n=$1 route=$2 reports=$3 ports=() addrs=() i
    for i in $(seq 1 "$n"); do
        local port
        port=$(free_port)
        "$FREQCAP" serve --grpc-listen off --listen "127.0.0.1:$port" --store "$SEEDS" --node-id "n$i" \
            --spend-reports "$reports" --data-dir "$OUT/n$i" 2>"$OUT/n$n-$route-$reports-$i.log" &
        NODE_PIDS+=($!)
        ports+=("$port")
        addrs+=("127.0.0.1:$port")
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 1 100); do
            curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
            sleep 0.1
        done
    done
    local addr
    addr=$(IFS=,; echo "${addrs[*]}")
    # Definitions first (the load generator puts them on the first node and
    # waits for the others), outside the measured window.
    "$LOADGEN" run --target freqcap --addr "$addr" --workload screen --k "$K" --conns 1 --secs 0.2 --warmup 0 >/dev/null
    local c0 f0 r0 cas0 cf0 l0
    c0=$(metric freqcap_redis_calls_total "${ports[@]}")
    cas0=$(metric freqcap_cas_total "${ports[@]}")
    cf0=$(metric freqcap_cas_conflicts_total "${ports[@]}")
    l0=$(metric freqcap_lease_calls_total "${ports[@]}")
    r0=$(cpu $REDIS_PIDS)
    f0=$(cpu "${NODE_PIDS[@]}")
    "$LOADGEN" run --target freqcap --addr "$addr" --route "$route" --workload screen --k "$K" \
        --conns "$CONNS" --secs "$SECS" --warmup 0 --json > "$OUT/n$n-$route-$reports.json"
    local c1 f1 r1 cas1 cf1 l1
    c1=$(metric freqcap_redis_calls_total "${ports[@]}")
    cas1=$(metric freqcap_cas_total "${ports[@]}")
    cf1=$(metric freqcap_cas_conflicts_total "${ports[@]}")
    l1=$(metric freqcap_lease_calls_total "${ports[@]}")
    r1=$(cpu $REDIS_PIDS)
    f1=$(cpu "${NODE_PIDS[@]}")
    python3 - "$OUT/n$n-$route-$reports.json" "$n" "$route" "$reports" "$c0" "$c1" "$cas0" "$cas1" "$cf0" "$cf1" "$l0" "$l1" "$r0" "$r1" "$f0" "$f1" <<'EOF' | tee -a "$OUT/table.txt"
import json, sys
j = json.load(open(sys.argv[1]))
n, route, reports = sys.argv[2], sys.argv[3], sys.argv[4]
c0, c1, cas0, cas1, cf0, cf1, l0, l1, r0, r1, f0, f1 = map(float, sys.argv[5:])
ads = max(j["ops"], 1)
print(f'{n:<6} {route:<9} {reports:<8} {j["ops_per_s"]:9.0f} {j["p50_us"]/1000:8.2f} {j["p99_us"]/1000:8.2f} '
      f'{(c1-c0)/ads:10.2f} {(cas1-cas0)/ads:8.2f} {100*(cf1-cf0)/max(cas1-cas0,1):9.2f}% '
      f'{(l1-l0)/ads:10.3f} {1e6*(r1-r0)/ads:12.0f} {1e6*(f1-f0)/ads:13.0f}'
      + (f'   errors {j["errors"]}: {j["first_error"]}' if j["errors"] else ''))
EOF
    stop_nodes
}

run 1 affinity commit
run 2 affinity commit
run 3 affinity commit
run 3 spread commit
run 1 affinity batched
run 3 affinity batched
echo "results in $OUT"
