#!/usr/bin/env bash
# Regions (docs/regions.md): three regions on this machine, each a Redis of
# its own and a freqcap node, leasing from a global tier (a fourth Redis)
# over a simulated WAN (benches/wan_proxy.py: every chunk delayed by half of
# RTT_MS each way, default 80 ms round trips).
#
#   benches/regions.sh [OUT_DIR]    # default: ${TMPDIR:-/tmp}/freqcap-regions/<UTC time>
#
# 1. Decisions: the load generator's `screen` workload (K candidates with
#    daily caps and a leased budget each, then a commit) on the three
#    nodes at once for SECS seconds, without regions (each node its
#    region's Redis only) and in regions (the budgets leased from the tier
#    across the WAN), in the order without, in, in, without (every Redis
#    emptied before each: a run's drift weighs on both alike), then in
#    regions with every region's WAN cut (the proxies stopped) once the
#    grants are held. `added_p99_ms` is the mean p99 in regions less
#    without, in this run (each phase's in `p99_ms_by_phase`);
#    `wan_calls_on_decision_path` is the lease calls the WAN proxies
#    carried less those the nodes' region ticks made, each node's count
#    as it logged it once stopped (no call under way then: the two counts
#    are of the same calls, not read at two instants): calls made by
#    anything else, a decision included. The cut phase covers every other
#    command too (the exchange of users across regions — homes, counts —
#    is plain commands the proxy does not count, made by the same tick,
#    src/engine/travellers.rs `travel_tick`): a decision that waited on
#    the tier for anything would take the tier's 2 s call deadline, or
#    fail (`max_decision_ms_wan_cut`, `decision_errors_wan_cut`).
# 2. A budget of BUDGET units shared by the three regions under diurnal
#    demand (each region's peak a third of a compressed day after the
#    last's; 60 impressions a second in all), with travelling users on a
#    user cap of 3 a day (two new users a second, a third staying home),
#    and region 3's WAN cut (its proxy stopped) for CUT_S seconds from the
#    5th (benches/regions_drive.py): `budget_overshoot_pct`,
#    `delivered_pct`, `user_cap_over_max` (the most any user got past its
#    cap), and each region's grant and spend at the tier every second
#    (OUT/lease.csv, plotted in OUT/lease.svg).
#
# Writes OUT/summary.json. On a 2-core machine every process shares both
# cores: p99s are noisy, compared in one run. Every process is stopped by
# its PID on exit. The partition is real time, CUT_S long (600 s by
# default: the run takes about 12 minutes). Run it in the foreground or
# under `setsid`: the kernel continues (SIGCONT) a stopped process whose
# process group is orphaned, so a run left behind by an exiting job-control
# shell heals its partition early (it did: 18 s instead of 600).
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-10}
CONNS=${CONNS:-4}
K=${K:-20}
RTT_MS=${RTT_MS:-80}
CUT_S=${CUT_S:-600}
# Spent about 10 s after the cut heals: 60 a second before it, 40 during it.
BUDGET=${BUDGET:-$((60 * 5 + 40 * CUT_S + 600))}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-regions/$(date -u +%Y%m%dT%H%M%SZ)}
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

PIDS=()
NODE_PIDS=()
stop_nodes() {
    local p
    for p in "${NODE_PIDS[@]}"; do { kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; } || true; done
    NODE_PIDS=()
    return 0
}
cleanup() {
    stop_nodes
    local p
    for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

redis() {
    local port=$1
    mkdir -p "$OUT/redis-$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT/redis-$port" \
        >"$OUT/redis-$port/log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    echo "redis on $port did not start" >&2
    exit 1
}

GLOBAL=$(free_port)
redis "$GLOBAL"
REDIS=() PROXY=() PROXY_PID=()
for r in 1 2 3; do
    port=$(free_port)
    redis "$port"
    REDIS+=("$port")
    p=$(free_port)
    python3 benches/wan_proxy.py "$p" "$GLOBAL" "$RTT_MS" "$OUT/wan-$r.count" &
    PIDS+=($!)
    PROXY+=("$p")
    PROXY_PID+=($!)
done
sleep 0.5

PORTS=()
# nodes REGIONS?: one node per region's Redis; with "regions", in regions
# through the WAN proxies.
# PHASE (default MODE) names their data directories and logs.
start_nodes() {
    local mode=$1 phase=${2:-$1} r port args
    PORTS=()
    for r in 1 2 3; do
        port=$(free_port)
        args=(serve --grpc-listen off --listen "127.0.0.1:$port" --store "redis://127.0.0.1:${REDIS[$((r - 1))]}"
            --node-id "r$r" --data-dir "$OUT/n$r-$phase" --redis-timeout-ms 500)
        [ "$mode" = regions ] && args+=(--region "r$r" --global-store "redis://127.0.0.1:${PROXY[$((r - 1))]}")
        "$FREQCAP" "${args[@]}" 2>"$OUT/n$r-$phase.log" &
        NODE_PIDS+=($!)
        PORTS+=("$port")
    done
    for port in "${PORTS[@]}"; do
        for _ in $(seq 1 100); do
            curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
            sleep 0.1
        done
    done
}

wan_calls() { awk '{s += $1} END {print s + 0}' "$OUT"/wan-*.count; }

# The lease calls every node made to the global tier, as each said when it
# stopped (src/service/run.rs, `leave_region`): read once the nodes have
# exited, so no call is under way.
tick_calls() {
    local total=0 f n
    for f in "$@"; do
        n=$(sed -n 's/.* \([0-9][0-9]*\) lease calls made to the global tier.*/\1/p' "$f" | tail -1)
        total=$((total + ${n:-0}))
    done
    echo "$total"
}

# 1. Decisions, without regions and in them (plain, regions, regions,
#    plain: a drift over the run weighs on both alike), then in regions with
#    every region's WAN cut. Every Redis is emptied before each phase, so
#    none starts on another's records. `decide MODE TAG`.
decide() {
    local mode=$1 tag=$2 r pids=() node_mode=$1 w0 w1 port
    [ "$mode" = cut ] && node_mode=regions
    for port in "$GLOBAL" "${REDIS[@]}"; do redis-cli -p "$port" FLUSHALL >/dev/null; done
    # The proxies carry nothing before the nodes start: their count now is
    # this phase's baseline.
    w0=$(wan_calls)
    start_nodes "$node_mode" "$mode-$tag"
    for r in 1 2 3; do
        # Each region defines its campaigns (definitions are per region).
        "$LOADGEN" run --target freqcap --addr "127.0.0.1:${PORTS[$((r - 1))]}" --workload screen --k "$K" \
            --conns 1 --secs 0.2 --warmup 0 >/dev/null
    done
    if [ "$mode" = cut ]; then
        # Grants held (the region ticks had 2 s), then every region's WAN
        # cut: a decision that waited on the tier would wait out the
        # tier's 2 s call deadline, or fail.
        sleep 2
        for r in 1 2 3; do kill -STOP "${PROXY_PID[$((r - 1))]}"; done
    fi
    for r in 1 2 3; do
        "$LOADGEN" run --target freqcap --addr "127.0.0.1:${PORTS[$((r - 1))]}" --workload screen --k "$K" \
            --users 100000 --conns "$CONNS" --secs "$SECS" --warmup 1 --json >"$OUT/decide-$mode-$tag-$r.json" &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
    if [ "$mode" = cut ]; then
        for r in 1 2 3; do kill -CONT "${PROXY_PID[$((r - 1))]}"; done
    fi
    stop_nodes
    # The proxies rewrite their counts every 200 ms.
    sleep 0.6
    w1=$(wan_calls)
    echo "$((w1 - w0)) $(tick_calls "$OUT"/n[123]-"$mode-$tag".log)" >"$OUT/decide-$mode-$tag.wan"
}
decide plain a
decide regions a
decide regions b
decide plain b
decide cut a

# 2. A shared budget and travelling users through a partition of region 3
#    (benches/regions_drive.py).
for port in "$GLOBAL" "${REDIS[@]}"; do redis-cli -p "$port" FLUSHALL >/dev/null; done
start_nodes regions
for port in "${PORTS[@]}"; do
    curl -sf -X PUT "http://127.0.0.1:$port/v1/campaigns/shared" -H 'content-type: application/json' \
        -d "{\"budget\": {\"amount\": $BUDGET, \"per\": \"1d\", \"pacing\": \"asap\"}}" >/dev/null
    curl -sf -X PUT "http://127.0.0.1:$port/v1/campaigns/freq" -H 'content-type: application/json' \
        -d '{"caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "fixed", "scope": "user"}]}' >/dev/null
done
python3 benches/regions_drive.py "$OUT" "$BUDGET" "$CUT_S" "$GLOBAL" "${PROXY_PID[2]}" "${PORTS[@]}"
stop_nodes

python3 - "$OUT" "$BUDGET" "$RTT_MS" <<'EOF' | tee "$OUT/summary.json"
import json, sys
out, budget, rtt = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def runs(mode, tags):
    return [json.load(open(f"{out}/decide-{mode}-{t}-{r}.json")) for t in tags for r in (1, 2, 3)]
plain, regions, cut = runs("plain", "ab"), runs("regions", "ab"), runs("cut", "a")
p99 = lambda rs: sum(r["p99_us"] for r in rs) / len(rs) / 1000
counts = [list(map(int, open(f"{out}/decide-{m}-{t}.wan").read().split())) for m, t in
          [("regions", "a"), ("regions", "b"), ("cut", "a")]]
wan, ticks = sum(c[0] for c in counts), sum(c[1] for c in counts)
b = json.load(open(f"{out}/budget.json"))
u = json.load(open(f"{out}/users.json"))
delivered = sum(b["acked"])
print(json.dumps({
    "wan_rtt_ms": rtt,
    "decisions": sum(r["ops"] for r in regions),
    "p99_ms_by_phase": {f"{m}-{t}": round(p99(runs(m, t)), 3) for m, t in
                        [("plain", "a"), ("regions", "a"), ("regions", "b"), ("plain", "b"), ("cut", "a")]},
    "decision_errors": sum(r["errors"] for r in plain + regions + cut),
    "p99_ms_without_regions": round(p99(plain), 3),
    "p99_ms_with_regions": round(p99(regions), 3),
    "added_p99_ms": round(p99(regions) - p99(plain), 3),
    "max_decision_ms": round(max(r["max_us"] for r in regions) / 1000, 3),
    # Every region's WAN cut while the nodes decide: a decision that
    # waited on the tier would take its 2 s call deadline, or fail.
    "p99_ms_wan_cut": round(p99(cut), 3),
    "max_decision_ms_wan_cut": round(max(r["max_us"] for r in cut) / 1000, 3),
    "decision_errors_wan_cut": sum(r["errors"] for r in cut),
    # The lease calls the proxies carried, and those the nodes' region
    # ticks made (each node's count once it stopped), in the three phases
    # in regions: calls made by anything else, a decision included, are
    # the difference.
    "wan_calls": wan,
    "wan_calls_by_region_ticks": ticks,
    "wan_calls_on_decision_path": wan - ticks,
    "budget": budget,
    "delivered": b["acked"],
    "budget_overshoot_pct": round(max(delivered - budget, 0) * 100 / budget, 3),
    "delivered_pct": round(delivered * 100 / budget, 3),
    "user_cap": u["cap"],
    "users": u["users"],
    "travellers": u["travellers"],
    "user_cap_over_max": u["over_max"],
    "user_cap_over_max_stay_home": u["over_max_stay_home"],
    "users_over_cap": u["users_over"],
    "partition_s": b["cut_s"],
    "elapsed_s": round(b["elapsed_s"], 1),
}, indent=2))
EOF
