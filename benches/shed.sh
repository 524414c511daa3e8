#!/usr/bin/env bash
# Load shedding under CPU saturation (BENCHMARKS.md, "Overload").
#
#   benches/shed.sh [OUT_DIR]     # default: ${TMPDIR:-/tmp}/freqcap-shed/<UTC time>
#
# Two `freqcap serve --memory` servers on core 0, one with shedding on its
# default (shed_queue_delay_ms 20) and one with it out of reach (10 minutes);
# the load generator on core 1. For each server, in the same run: a closed
# loop at 64 connections (the sustainable rate), then 2048 connections closed
# loop (clients resending at once, then clients honouring Retry-After), then
# open loop at 4x the sustainable rate over 2048 connections, then the same
# with half the checks sent as `x-freqcap-priority: sheddable` (503s counted
# per class: the lowest class should absorb them), each with a /healthz
# probe every 50 ms from its own process. Then open loop at 4x again with
# clients that behave: callers with a 30 ms deadline (a request not sent
# within it is dropped unsent, `expired`), and clients throttling themselves
# as freqcap's Rust client does (`--client-throttle 2`, docs/clients.md).
# Accepted latency (p99) is reported apart from the 503s. REPS, SECS and
# CONNS override the defaults. Both servers are stopped by their PIDs on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-2}
SECS=${SECS:-5}
CONNS=${CONNS:-2048}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-shed/$(date -u +%Y%m%dT%H%M%SZ)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/freqcap-target}

if [ -z "${FREQCAP_BIN:-}" ]; then cargo build --release --bin freqcap; fi
# LOADGEN_BIN: a load generator binary to use instead of building one.
LOADGEN=${LOADGEN_BIN:-}
[ -n "$LOADGEN" ] || LOADGEN=$(cargo bench --features client --bench loadgen --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] == "loadgen": print(m["executable"])')
FREQCAP=${FREQCAP_BIN:-$CARGO_TARGET_DIR/release/freqcap}
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    return 0
}
trap cleanup EXIT

declare -A PORT
for mode in shed noshed; do
    PORT[$mode]=$(free_port)
    delay=20
    [ "$mode" = noshed ] && delay=600000
    taskset -c "$SERVER_CPU" "$FREQCAP" serve --grpc-listen off --memory --listen "127.0.0.1:${PORT[$mode]}" \
        --shed-queue-delay-ms "$delay" --max-connections 20000 2>"$OUT/$mode.log" &
    PIDS+=($!)
done
for mode in shed noshed; do
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:${PORT[$mode]}/readyz" >/dev/null && break
        sleep 0.1
    done
done
ulimit -n 65536 2>/dev/null || true

RES=$OUT/results.jsonl
# A liveness probe as an orchestrator runs it: its own process and connection,
# GET /healthz every 50 ms during the measured seconds; prints p99 and max (ms).
probe() { # port
    python3 - "$1" "$SECS" <<'PY'
import http.client, sys, time
port, secs = int(sys.argv[1]), float(sys.argv[2])
time.sleep(1.0)  # the load generator's warm-up
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
lat, end = [], time.monotonic() + secs
while time.monotonic() < end and len(lat) < 10000:
    t = time.monotonic()
    c.request("GET", "/healthz")
    r = c.getresponse()
    r.read()
    lat.append((time.monotonic() - t) * 1000)
    time.sleep(0.05)
lat.sort()
print(f"{lat[int(0.99 * (len(lat) - 1))]:.1f} {lat[-1]:.1f}")
PY
}
run() { # mode tag args...
    local mode=$1 tag=$2
    shift 2
    probe "${PORT[$mode]}" >"$OUT/probe.txt" &
    local probe_pid=$!
    taskset -c "$CLIENT_CPU" "$LOADGEN" run --target freqcap --addr "127.0.0.1:${PORT[$mode]}" \
        --workload check-hot --secs "$SECS" --warmup 1 --json --tag "$mode/$tag" "$@" >"$OUT/one.json"
    wait "$probe_pid"
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); p99, mx = open(sys.argv[2]).read().split()
r["healthz_p99_us"], r["healthz_max_us"] = float(p99) * 1000, float(mx) * 1000
print(json.dumps(r))' "$OUT/one.json" "$OUT/probe.txt" | tee -a "$RES"
}
for rep in $(seq 1 "$REPS"); do
    for mode in shed noshed; do
        sustainable=$(run "$mode" "sustainable-64" --conns 64 |
            python3 -c 'import sys, json; print(json.loads(sys.stdin.read())["ops_per_s"])')
        # What a 503 costs next to an answer: every check sheddable, which
        # the CPU guard sheds while the core is saturated.
        run "$mode" "all-sheddable-64" --conns 64 --sheddable-share 1 >/dev/null
        run "$mode" "closed-$CONNS" --conns "$CONNS" >/dev/null
        run "$mode" "closed-$CONNS-retry-after" --conns "$CONNS" --honour-retry-after >/dev/null
        rate=$(python3 -c "print(4 * $sustainable)")
        run "$mode" "open-4x" --conns "$CONNS" --rate "$rate" >/dev/null
        run "$mode" "open-4x-half-sheddable" --conns "$CONNS" --rate "$rate" --sheddable-share 0.5 >/dev/null
        run "$mode" "open-4x-deadline-30ms" --conns "$CONNS" --rate "$rate" --deadline-ms 30 >/dev/null
        run "$mode" "open-4x-client-throttle" --conns "$CONNS" --rate "$rate" --client-throttle 2 >/dev/null
    done
done
python3 - "$RES" <<'EOF'
import json, sys
print(f"{'server/load':36} {'accepted/s':>10} {'503/s':>9} {'503 %':>6} {'p99 acc ms':>10} {'p99 503 ms':>10} {'healthz p99':>11} {'max ms':>7} {'503 % shed./dflt':>16} {'unsent/s':>9}")
for l in open(sys.argv[1]):
    r = json.loads(l)
    by_class = ""
    if "sheddable" in r["tag"]:
        by_class = f"{100*r['sheddable_shed_share']:.1f} / {100*r['default_shed_share']:.1f}"
    print(f"{r['tag']:36} {r['ops_per_s']:10.0f} {r['shed_per_s']:9.0f} {100*r['shed_share']:6.1f} "
          f"{r['p99_us']/1000:10.1f} {r['shed_p99_us']/1000:10.1f} {r['healthz_p99_us']/1000:11.1f} {r['healthz_max_us']/1000:7.1f} {by_class:>16} "
          f"{r.get('expired_per_s', 0) + r.get('throttled_per_s', 0):9.0f}")
EOF
echo "results: $RES"
