#!/usr/bin/env bash
# freqcap's check over gRPC (freqcap.v1.Freqcap/Check) against the same check
# over HTTP/1.1 JSON (POST /v1/check), same server, same run, same load
# generator (benches/loadgen.rs: --target freqcap-grpc / freqcap).
#
#   benches/grpc.sh [OUT_DIR]        # REPS=3 SECS=5 CONNS=32 (env overrides)
#   FREQCAP_BIN=/path/to/freqcap benches/grpc.sh
#
# One `freqcap serve` (RocksDB in a temporary directory, durability wal, the
# defaults) on core SERVER_CPU (0); the load generator on CLIENT_CPU (1),
# closed loop, CONNS connections each with one request in flight (an HTTP/1.1
# connection, or an HTTP/2 connection for gRPC), for check-hot (one key) and
# check-1m (1 000 000 keys), the two targets back to back in alternating order
# per repetition. Prints a table of ops/s, p50 and p99 and the ratio
# gRPC / HTTP (the issue's goal: ≥ 1.5× for check).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
SECS=${SECS:-5}
CONNS=${CONNS:-32}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-grpc/$(date -u +%Y%m%dT%H%M%SZ)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/freqcap-target}

if [ -z "${FREQCAP_BIN:-}" ]; then cargo build --release --bin freqcap; fi
LOADGEN=${LOADGEN:-$(cargo bench --bench loadgen --no-run --features client,tower --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] == "loadgen": print(m["executable"])')}
FREQCAP=${FREQCAP_BIN:-$CARGO_TARGET_DIR/release/freqcap}

mkdir -p "$OUT"
DATA=$(mktemp -d /tmp/freqcap-grpc.XXXXXX)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port)
GRPC_PORT=$(free_port)
FC_PID=
cleanup() {
    [ -n "$FC_PID" ] && kill -TERM "$FC_PID" 2>/dev/null && wait "$FC_PID" 2>/dev/null
    rm -rf "$DATA"
}
trap cleanup EXIT

taskset -c "$SERVER_CPU" "$FREQCAP" serve --listen "127.0.0.1:$HTTP_PORT" --grpc-listen "127.0.0.1:$GRPC_PORT" \
    --data-dir "$DATA/freqcap" 2>"$OUT/freqcap.log" &
FC_PID=$!
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null && break
    kill -0 "$FC_PID" 2>/dev/null || { echo "freqcap exited (see $OUT/freqcap.log)" >&2; exit 1; }
    sleep 0.1
done

: >"$OUT/runs.txt"
for rep in $(seq 1 "$REPS"); do
    for w in check-hot check-1m; do
        order="freqcap freqcap-grpc"
        [ $((rep % 2)) = 0 ] && order="freqcap-grpc freqcap"
        for t in $order; do
            line=$(taskset -c "$CLIENT_CPU" "$LOADGEN" run --target "$t" --addr "127.0.0.1:$HTTP_PORT" \
                --grpc-addr "127.0.0.1:$GRPC_PORT" --workload "$w" --conns "$CONNS" --secs "$SECS" --warmup 1 2>&1 | tail -1)
            echo "$rep $t $w $line" | tee -a "$OUT/runs.txt" >&2
        done
    done
done

python3 - "$OUT/runs.txt" <<'PY' | tee "$OUT/summary.md"
import re, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    rep, t, w, rest = l.split(" ", 3)
    m = re.search(r": (\d+) ops/s.* p50 (\d+) µs p90 \d+ p99 (\d+)", rest)
    if not m:
        sys.exit(f"grpc.sh: unexpected loadgen output: {l!r}")
    rows.setdefault((w, t), []).append(tuple(int(x) for x in m.groups()))
print("| workload | front | ops/s (median, range) | p50 µs | p99 µs | gRPC / HTTP |")
print("|---|---|---|---|---|---|")
for w in ("check-hot", "check-1m"):
    med = {}
    for t, label in (("freqcap", "HTTP/1.1 JSON"), ("freqcap-grpc", "gRPC")):
        r = rows[(w, t)]
        ops = [x[0] for x in r]
        med[t] = statistics.median(ops)
        ratio = f"{med[t] / med['freqcap']:.2f}×" if t == "freqcap-grpc" else ""
        print(f"| {w} | {label} | {med[t]:,.0f} ({min(ops):,}–{max(ops):,}) | "
              f"{statistics.median(x[1] for x in r):.0f} | {statistics.median(x[2] for x in r):.0f} | {ratio} |")
PY
