#!/usr/bin/env bash
# freqcap against Redis+Lua in one run (BENCHMARKS.md).
#
#   benches/run.sh [OUT_DIR]        # default: ${TMPDIR:-/tmp}/freqcap-bench/<UTC time>
#
# Installs redis-server from Debian's packages if missing, starts it on a free
# loopback port with no persistence, and `freqcap serve` (RocksDB, durability
# wal) on another; servers are pinned to core 0 and the load generator to
# core 1 (REPS, SECS, WARMUP, CONNS and FRACTIONS override the defaults).
# Each repetition runs every workload on both targets, closed loop (max
# throughput) and then open loop at fractions of that target's closed-loop
# rate in the same repetition. Both servers are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
SECS=${SECS:-5}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-32}
FRACTIONS=${FRACTIONS:-"0.05 0.1 0.25 0.5 0.75 0.9"}
WORKLOADS=${WORKLOADS:-"check-hot check-1m screen events"}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-bench/$(date -u +%Y%m%dT%H%M%SZ)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/freqcap-target}

if ! command -v redis-server >/dev/null; then
    apt-get install -y redis-server >/dev/null
fi

# FREQCAP_BIN: a freqcap binary to measure instead of building one.
if [ -z "${FREQCAP_BIN:-}" ]; then cargo build --release --bin freqcap; fi
LOADGEN=$(cargo bench --bench loadgen --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] == "loadgen": print(m["executable"])')
FREQCAP=${FREQCAP_BIN:-$CARGO_TARGET_DIR/release/freqcap}

mkdir -p "$OUT"
DATA=$(mktemp -d /tmp/freqcap-bench.XXXXXX)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
FC_PORT=$(free_port)
RD_PORT=$(free_port)

FC_PID=
RD_PID=
cleanup() {
    [ -n "$FC_PID" ] && kill -TERM "$FC_PID" 2>/dev/null && wait "$FC_PID" 2>/dev/null
    [ -n "$RD_PID" ] && kill -TERM "$RD_PID" 2>/dev/null && wait "$RD_PID" 2>/dev/null
    rm -rf "$DATA"
}
trap cleanup EXIT

taskset -c "$SERVER_CPU" "$FREQCAP" serve --grpc-listen off --listen "127.0.0.1:$FC_PORT" --data-dir "$DATA/freqcap" \
    2>"$OUT/freqcap.log" &
FC_PID=$!
taskset -c "$SERVER_CPU" redis-server --bind 127.0.0.1 --port "$RD_PORT" --save "" --appendonly no \
    --dir "$DATA" --logfile "$OUT/redis.log" &
RD_PID=$!
for _ in $(seq 1 100); do
    if curl -sf "http://127.0.0.1:$FC_PORT/readyz" >/dev/null &&
        redis-cli -p "$RD_PORT" ping >/dev/null 2>&1; then break; fi
    sleep 0.1
done

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null)"
    echo "freqcap binary: $FREQCAP $(md5sum <"$FREQCAP" | cut -d' ' -f1)"
    echo "nproc: $(nproc)"
    grep -m1 'model name' /proc/cpuinfo
    grep MemTotal /proc/meminfo
    uname -r
    redis-server --version
    rustc --version
    echo "server cpu $SERVER_CPU, client cpu $CLIENT_CPU; reps $REPS, secs $SECS, warmup $WARMUP, conns $CONNS"
} >"$OUT/machine.txt"

RES=$OUT/results.jsonl
lg() { taskset -c "$CLIENT_CPU" "$LOADGEN" run --json --secs "$SECS" --warmup "$WARMUP" --conns "$CONNS" "$@" | tee -a "$RES"; }
addr() { if [ "$1" = freqcap ]; then echo "127.0.0.1:$FC_PORT"; else echo "127.0.0.1:$RD_PORT"; fi; }

for rep in $(seq 1 "$REPS"); do
    for w in $WORKLOADS; do
        for t in freqcap redis; do
            verify=()
            [ "$w" = screen ] && verify=(--verify)
            line=$(lg --target "$t" --addr "$(addr "$t")" --workload "$w" --tag "rep$rep closed" "${verify[@]}")
            max=$(python3 -c 'import sys, json; print(json.loads(sys.argv[1])["ops_per_s"])' "$line")
            for f in $FRACTIONS; do
                rate=$(python3 -c "print(round($max * $f))")
                lg --target "$t" --addr "$(addr "$t")" --workload "$w" --rate "$rate" \
                    --tag "rep$rep open $f" >/dev/null
            done
        done
    done
done

# Memory of the state left behind (bytes per record / per key).
curl -sf "http://127.0.0.1:$FC_PORT/metrics" | grep -E '^freqcap_(hot_records|hot_bytes|disk_live_bytes)' \
    >"$OUT/freqcap-memory.txt" || true
{
    redis-cli -p "$RD_PORT" dbsize
    redis-cli -p "$RD_PORT" info memory | grep -E '^used_memory:|^used_memory_dataset:'
    echo "MEMORY USAGE hot: $(redis-cli -p "$RD_PORT" memory usage hot)"
    echo "MEMORY USAGE k1: $(redis-cli -p "$RD_PORT" memory usage k1)"
} >"$OUT/redis-memory.txt" || true
du -sb "$DATA/freqcap" >"$OUT/freqcap-disk.txt"

python3 benches/summarize.py "$RES" | tee "$OUT/summary.md"
