#!/usr/bin/env bash
# freqcap's RESP front (CL.THROTTLE) against Redis+Lua GCRA (EVALSHA) and
# against redis-cell itself (the module's CL.THROTTLE, built from its source
# by benches/peers/redis-cell.sh), all driven by Debian's redis-benchmark, in
# one run.
#
#   benches/resp.sh [OUT_DIR]       # default: ${TMPDIR:-/tmp}/freqcap-resp/<UTC time>
#
#   REQUESTS=20000 REPS=1 benches/resp.sh          # a quick check of the script
#   FREQCAP_BIN=/path/to/freqcap benches/resp.sh   # measure that binary, no cargo build
#   LOADGEN=0 benches/resp.sh                      # without the load generator's runs (below)
#   CELL=0 benches/resp.sh                         # without redis-cell (no module build)
#   REDIS_CELL_SO=/path/libredis_cell.so benches/resp.sh   # that module, no build
#
# Starts redis-server on a free loopback port (`--save "" --appendonly no`, as
# benches/run.sh: no persistence) and SCRIPT LOADs benches/lua/gcra.lua; starts
# `freqcap serve --resp-listen 127.0.0.1:<port>` with RocksDB in a temporary
# directory and the default durability (wal), as benches/run.sh's Redis
# comparisons did (FREQCAP_ARGS=--memory for the memory store instead). Both
# servers are pinned to core SERVER_CPU (0), redis-benchmark to CLIENT_CPU (1).
# Once both answer PING, for REPS repetitions, each of the 8 cases
# (target × key set × pipeline) is warmed up and then measured, both targets
# of one (keys, P) back to back (their order alternating by repetition):
#
#   redis    EVALSHA <sha of gcra.lua> 1 KEY 100 100 1 1
#   cell     CL.THROTTLE KEY 100 100 1 1   (the same redis-server, module loaded)
#   freqcap  CL.THROTTLE KEY 100 100 1 1
#
# with KEY `hot` (one key) or `k:__rand_int__` with -r 1000000 (1 000 000
# keys, uniform), -P 1 or -P 16, -c CONNS (50). The limit is loadgen's
# (benches/loadgen.rs, `check-hot`/`check-1m`, BENCHMARKS.md): max_burst 100,
# 100 per 1 s, quantity 1, the same arguments on both sides. So on the one key
# nearly every request is DENIED on both sides (101 allowed at first, then
# 100/s against tens of thousands of requests/s; in Lua a GET and no write),
# and on 1 000 000 keys nearly every request is ALLOWED on both sides (a key
# is drawn about once per 10 s at 100 k req/s, far below its burst; in Lua a
# GET and a SET with PX). Lua's state expires once the key is full again
# (10 ms after one allowed request), so Redis never holds many keys; freqcap
# keeps idle records in memory for idle_grace (60 s).
#
# The warm-up (WARMUP_REQUESTS × P requests) also sizes the measured run:
# SECS (5) seconds at the warm-up's rate, unless REQUESTS fixes the count of
# every measured run. The table gives, per case, the median over REPS of
# requests/s (range if REPS > 1), p50 and p99 latency, the CPU used by
# redis-benchmark and by the server during the run (a client at ≥ 90 %, marked
# *, means the figure is the client's limit, not the server's: on one core
# redis-benchmark tops out near 125 k req/s unpipelined), and freqcap/redis of
# the median requests/s, next to the issue's goal (≥ 1.5× at P=1, ≥ 2× at
# P=16). redis-benchmark's latency of a pipelined request is that of its
# batch: from writing the P commands to the first byte of the first reply.
#
# freqcap is skipped, with a message, when `freqcap serve --help` does not
# mention --resp-listen (TARGETS="redis" skips it too). Every process is
# stopped by its PID on exit. Raw runs: OUT_DIR/results.csv; the table:
# OUT_DIR/summary.md.
set -euo pipefail
shopt -s inherit_errexit  # failures inside $(...) stop the script too
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
SECS=${SECS:-5}
REQUESTS=${REQUESTS:-}
WARMUP_REQUESTS=${WARMUP_REQUESTS:-20000}
CONNS=${CONNS:-50}
PIPELINES=${PIPELINES:-"1 16"}
KEYSETS=${KEYSETS:-"1 1000000"}
TARGETS=${TARGETS:-"redis cell freqcap"}
CELL=${CELL:-1}
MAX_BURST=${MAX_BURST:-100}
COUNT=${COUNT:-100}
PERIOD=${PERIOD:-1}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
FREQCAP_ARGS=${FREQCAP_ARGS:-}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-resp/$(date -u +%Y%m%dT%H%M%SZ)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/freqcap-target}

die() { echo "resp.sh: $*" >&2; exit 1; }

if ! command -v redis-server >/dev/null; then apt-get install -y redis-server >/dev/null; fi
if ! command -v redis-benchmark >/dev/null; then apt-get install -y redis-tools >/dev/null; fi

want_freqcap=0
SKIP_WHY="not in TARGETS"
case " $TARGETS " in *" freqcap "*) want_freqcap=1 ;; esac
# FREQCAP_BIN: a freqcap binary to measure instead of building one.
if [ "$want_freqcap" = 1 ] && [ -z "${FREQCAP_BIN:-}" ]; then cargo build --release --bin freqcap; fi
FREQCAP=${FREQCAP_BIN:-$CARGO_TARGET_DIR/release/freqcap}
if [ "$want_freqcap" = 1 ]; then
    if [ ! -x "$FREQCAP" ]; then
        echo "resp.sh: SKIPPING freqcap: no binary at $FREQCAP" >&2
        want_freqcap=0
        SKIP_WHY="no binary"
    elif ! "$FREQCAP" serve --help 2>/dev/null | grep -q -- '--resp-listen'; then
        echo "resp.sh: SKIPPING freqcap: \`$FREQCAP serve --help\` does not mention --resp-listen (no RESP front in this build); measuring Redis only" >&2
        want_freqcap=0
        SKIP_WHY="no --resp-listen in this build"
    fi
fi
# redis-cell: loaded into the benchmark's redis-server (its own target,
# `cell`, on the same port), unless CELL=0 or TARGETS leaves it out.
CELL_SO=
case " $TARGETS " in *" cell "*) ;; *) CELL=0 ;; esac
if [ "$CELL" != 0 ]; then
    CELL_SO=${REDIS_CELL_SO:-$(benches/peers/redis-cell.sh)} || die "building redis-cell failed (CELL=0 skips it)"
    [ -f "$CELL_SO" ] || die "no redis-cell module at $CELL_SO"
fi
TARGETS_RUN=redis
[ -n "$CELL_SO" ] && TARGETS_RUN="$TARGETS_RUN cell"
[ "$want_freqcap" = 1 ] && TARGETS_RUN="$TARGETS_RUN freqcap"
case " $TARGETS " in *" redis "*) ;; *) die "TARGETS must include redis (the baseline of every ratio)" ;; esac

mkdir -p "$OUT"
DATA=$(mktemp -d /tmp/freqcap-resp.XXXXXX)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
RD_PORT=$(free_port)
FC_PORT=$(free_port)   # freqcap's HTTP listener (unused by the benchmark, kept off 8080)
FC_RESP=$(free_port)

# True while PID is a live process (not gone, not a zombie).
alive() {
    local st
    st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
# SIGTERM, up to 10 s to exit, then SIGKILL; by PID only.
stop_pid() {
    local p=$1 i
    [ -n "$p" ] || return 0
    kill -TERM "$p" 2>/dev/null || { wait "$p" 2>/dev/null || true; return 0; }
    for i in $(seq 1 100); do alive "$p" || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}
FC_PID=
RD_PID=
cleanup() {
    stop_pid "$FC_PID"
    stop_pid "$RD_PID"
    rm -rf "$DATA"
}
trap cleanup EXIT

# `taskset -c CPU cmd` execs cmd, so $! is the server's own PID.
LOADMODULE=()
[ -n "$CELL_SO" ] && LOADMODULE=(--loadmodule "$CELL_SO")
taskset -c "$SERVER_CPU" redis-server --bind 127.0.0.1 --port "$RD_PORT" --save "" --appendonly no \
    --dir "$DATA" --logfile "$OUT/redis.log" "${LOADMODULE[@]}" &
RD_PID=$!
if [ "$want_freqcap" = 1 ]; then
    # Load shedding is loosened to 1 s of queueing: redis-benchmark aborts on
    # the first error reply, and 50 connections × 16 pipelined commands on
    # one core can queue past the default 20 ms (Redis has no shedding).
    # shellcheck disable=SC2086 # FREQCAP_ARGS: extra flags, split on spaces
    taskset -c "$SERVER_CPU" "$FREQCAP" serve --grpc-listen off --listen "127.0.0.1:$FC_PORT" --data-dir "$DATA/freqcap" \
        --resp-listen "127.0.0.1:$FC_RESP" --shed-queue-delay-ms 1000 $FREQCAP_ARGS 2>"$OUT/freqcap.log" &
    FC_PID=$!
fi

# Bounded wait for PING; gives up at once if the server died.
wait_ping() { # name pid port
    local i
    for i in $(seq 1 100); do
        alive "$2" || die "$1 exited before answering PING (see $OUT/$1.log)"
        [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$3" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    die "$1 did not answer PING on 127.0.0.1:$3 within 10 s (see $OUT/$1.log)"
}
wait_ping redis "$RD_PID" "$RD_PORT"
[ "$want_freqcap" = 1 ] && wait_ping freqcap "$FC_PID" "$FC_RESP"

SHA=$(redis-cli -h 127.0.0.1 -p "$RD_PORT" -x SCRIPT LOAD <benches/lua/gcra.lua)
[ "$SHA" = "$(sha1sum <benches/lua/gcra.lua | cut -d' ' -f1)" ] || die "SCRIPT LOAD answered '$SHA'"
LIMIT=("$MAX_BURST" "$COUNT" "$PERIOD" 1)

# The command of a target, with KEY in it.
cmd_of() { # target key
    if [ "$1" = redis ]; then
        echo EVALSHA "$SHA" 1 "$2" "${LIMIT[@]}"
    else
        echo CL.THROTTLE "$2" "${LIMIT[@]}"
    fi
}
port_of() { if [ "$1" = freqcap ]; then echo "$FC_RESP"; else echo "$RD_PORT"; fi; }
pid_of() { if [ "$1" = freqcap ]; then echo "$FC_PID"; else echo "$RD_PID"; fi; }

# One call on a fresh key must be allowed with limit max_burst + 1: both
# targets answer CL.THROTTLE's five integers for the same limit.
for t in $TARGETS_RUN; do
    # shellcheck disable=SC2046
    mapfile -t ans < <(timeout 5 redis-cli -h 127.0.0.1 -p "$(port_of "$t")" $(cmd_of "$t" "resp-sh-check-$$") 2>&1)
    echo "$t: $(cmd_of "$t" "resp-sh-check-$$") -> ${ans[*]}" | tee -a "$OUT/check.txt"
    [ "${#ans[@]}" = 5 ] && [ "${ans[0]}" = 0 ] && [ "${ans[1]}" = $((MAX_BURST + 1)) ] ||
        die "$t: expected 5 integers '0 $((MAX_BURST + 1)) ...', got '${ans[*]}'"
done

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null)"
    if [ "$want_freqcap" = 1 ]; then
        echo "freqcap binary: $FREQCAP $(md5sum <"$FREQCAP" | cut -d' ' -f1) args: --data-dir (RocksDB, wal) $FREQCAP_ARGS"
    else
        echo "freqcap: skipped"
    fi
    echo "nproc: $(nproc)"
    grep -m1 'model name' /proc/cpuinfo
    grep MemTotal /proc/meminfo
    uname -r
    redis-server --version
    redis-benchmark --version
    [ -n "$CELL_SO" ] && echo "redis-cell: $CELL_SO $(md5sum <"$CELL_SO" | cut -d' ' -f1)"
    echo "gcra.lua sha1: $SHA; limit: max_burst $MAX_BURST, count $COUNT, period $PERIOD s, quantity 1"
    echo "server cpu $SERVER_CPU, client cpu $CLIENT_CPU; reps $REPS, secs $SECS, requests ${REQUESTS:-by warm-up}, warm-up $WARMUP_REQUESTS x P, conns $CONNS"
} >"$OUT/machine.txt"

# CPU seconds (user + system) of a PID, all its threads.
cpu_s() {
    local ticks
    ticks=$(sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}')
    python3 -c "print($ticks / $(getconf CLK_TCK))"
}

RES=$OUT/results.csv
echo "rep,target,keys,pipeline,requests,rps,avg_ms,p50_ms,p95_ms,p99_ms,max_ms,wall_s,client_cpu_pct,server_cpu_pct" >"$RES"

# One redis-benchmark run; prints "rps p50 p99" and, unless tag is warmup,
# appends a line to results.csv.
bench() { # tag target keys P requests
    local tag=$1 t=$2 keys=$3 p=$4 n=$5 key rargs=() s0 s1 line timing
    if [ "$keys" = 1 ]; then key=hot; else key=k:__rand_int__; rargs=(-r "$keys"); fi
    local o=$OUT/rb.out e=$OUT/rb.err tf=$OUT/rb.time
    s0=$(cpu_s "$(pid_of "$t")")
    local TIMEFORMAT='%R %U %S'
    # shellcheck disable=SC2046
    if ! { time taskset -c "$CLIENT_CPU" redis-benchmark -h 127.0.0.1 -p "$(port_of "$t")" \
        -c "$CONNS" -n "$n" -P "$p" "${rargs[@]}" --precision 3 --csv $(cmd_of "$t" "$key") >"$o" 2>"$e"; } 2>"$tf"; then
        cat "$e" >&2
        die "redis-benchmark failed: $t keys=$keys P=$p"
    fi
    s1=$(cpu_s "$(pid_of "$t")")
    # stderr besides the expected warning (a server without CONFIG GET) goes to the log.
    grep -v '^WARNING: Could not fetch server CONFIG' "$e" >>"$OUT/redis-benchmark.stderr" || true
    timing=$(tail -1 "$tf")
    line=$(python3 - "$o" "$timing" "$s0" "$s1" <<'EOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and r[0] != "test"]
if len(rows) != 1:
    sys.exit(f"resp.sh: unexpected redis-benchmark output: {open(sys.argv[1]).read()!r}")
r = rows[0]
real, user, sys_ = map(float, sys.argv[2].split())
s0, s1 = float(sys.argv[3]), float(sys.argv[4])
rps, avg, mn, p50, p95, p99, mx = map(float, r[1:8])
print(f"{rps:.0f},{avg},{p50},{p95},{p99},{mx},{real:.3f},{100 * (user + sys_) / real:.0f},{100 * (s1 - s0) / real:.0f}")
EOF
)
    if [ "$tag" != warmup ]; then echo "$tag,$t,$keys,$p,$n,$line" >>"$RES"; fi
    echo "$line" | awk -F, '{print $1, $3, $5, $7, $8, $9}'
}

declare -A N
for rep in $(seq 1 "$REPS"); do
    for keys in $KEYSETS; do
        for p in $PIPELINES; do
            order=$TARGETS_RUN
            [ $((rep % 2)) = 0 ] && order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
            for t in $order; do
                w=$(bench warmup "$t" "$keys" "$p" $((WARMUP_REQUESTS * p)))
                read -r wrps _ <<<"$w"
                case_id=$t/$keys/$p
                if [ -n "$REQUESTS" ]; then
                    N[$case_id]=$REQUESTS
                elif [ -z "${N[$case_id]:-}" ]; then
                    # SECS seconds at the warm-up's rate, a whole number of batches per connection.
                    N[$case_id]=$(python3 -c "b = $CONNS * $p; print(max(20 * b, round($wrps * $SECS / b) * b))")
                fi
                m=$(bench "$rep" "$t" "$keys" "$p" "${N[$case_id]}")
                read -r rps p50 p99 wall ccpu scpu <<<"$m"
                printf 'rep %s  %-7s keys %-7s P=%-2s  n %-9s %9s req/s  p50 %6s ms  p99 %6s ms  %5ss  client %3s%%  server %3s%%\n' \
                    "$rep" "$t" "$keys" "$p" "${N[$case_id]}" "$rps" "$p50" "$p99" "$wall" "$ccpu" "$scpu" >&2
            done
        done
    done
done
rm -f "$OUT/rb.out" "$OUT/rb.err" "$OUT/rb.time"

python3 - "$RES" "$want_freqcap" "$SKIP_WHY" <<'EOF' | tee "$OUT/summary.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
freqcap_ran = sys.argv[2] == "1"
med = lambda xs: statistics.median(xs)
CLIENT_BOUND = 90  # redis-benchmark's CPU %, past which its one core is the limit
def agg(t, k, p):
    rs = [r for r in rows if (r["target"], r["keys"], r["pipeline"]) == (t, k, p)]
    if not rs:
        return None
    f = lambda c: [float(r[c]) for r in rs]
    return dict(rps=med(f("rps")), lo=min(f("rps")), hi=max(f("rps")), p50=med(f("p50_ms")),
                p99=med(f("p99_ms")), ccpu=med(f("client_cpu_pct")), scpu=med(f("server_cpu_pct")), n=len(rs))
num = lambda x: f"{x:,.0f}".replace(",", " ")
keys_label = lambda k: num(int(k))
print("| target | keys | pipeline | requests/s | p50 ms | p99 ms | client CPU % | server CPU % | freqcap/lua | freqcap/redis-cell |")
print("|---|---|---|---|---|---|---|---|---|---|")
seen = []
for r in rows:
    kp = (r["keys"], r["pipeline"])
    if kp not in seen:
        seen.append(kp)
for k, p in seen:
    base, cell = agg("redis", k, p), agg("cell", k, p)
    for t in ("redis", "cell", "freqcap"):
        a = agg(t, k, p)
        if a is None:
            if t == "freqcap" and not freqcap_ran:
                print(f"| freqcap | {keys_label(k)} | {p} | skipped ({sys.argv[3]}) | | | | | n/a | n/a |")
            continue
        rps = num(a["rps"]) + (f" ({num(a['lo'])}–{num(a['hi'])})" if a["n"] > 1 else "")
        ratio = lambda b: f"{a['rps'] / b['rps']:.2f}" if t == "freqcap" and b else ""
        bound = " *" if a["ccpu"] >= CLIENT_BOUND else ""
        print(f"| {t} | {keys_label(k)} | {p} | {rps} | {a['p50']:.3f} | {a['p99']:.3f} | "
              f"{a['ccpu']:.0f}{bound} | {a['scpu']:.0f} | {ratio(base)} | {ratio(cell)} |")
reps = len({r["rep"] for r in rows})
print(f"\nmedian of {reps} repetition(s); requests/s range in parentheses; "
      "latency of a pipelined request = its batch's (write of P commands to first reply byte); "
      f"* client CPU ≥ {CLIENT_BOUND} %: redis-benchmark's core was (nearly) saturated, so that "
      "requests/s is a lower bound of the server's and a ratio involving it is not the servers' ratio")
EOF
# The load generator's RESP mode (benches/loadgen.rs, --target freqcap-resp
# and --target redis; check-hot, check-1m; unpipelined, CONNS connections,
# SECS seconds after a second of warm-up), pinned like redis-benchmark: it
# drives a server at P=1 harder than redis-benchmark's one core can.
# LOADGEN=0 skips it; LOADGEN=/path/to/loadgen uses that build.
LOADGEN=${LOADGEN:-}
if [ "$LOADGEN" != 0 ] && [ "$want_freqcap" = 1 ]; then
    if [ -z "$LOADGEN" ]; then
        LOADGEN=$(cargo bench --bench loadgen --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] == "loadgen": print(m["executable"])')
    fi
    {
        echo
        echo "| loadgen | workload | target | ops/s | p50 µs | p99 µs | server CPU % | freqcap/redis |"
        echo "|---|---|---|---|---|---|---|---|"
    } | tee -a "$OUT/summary.md"
    for w in check-hot check-1m; do
        declare -A OPS=()
        for t in redis freqcap; do
            if [ "$t" = redis ]; then lt=redis; else lt=freqcap-resp; fi
            s0=$(cpu_s "$(pid_of "$t")")
            t0=$(date +%s.%N)
            line=$(taskset -c "$CLIENT_CPU" "$LOADGEN" run --target "$lt" --addr "127.0.0.1:$(port_of "$t")" \
                --workload "$w" --conns "$CONNS" --secs "$SECS" --warmup 1 2>&1 | tail -1)
            t1=$(date +%s.%N)
            s1=$(cpu_s "$(pid_of "$t")")
            echo "$line" >>"$OUT/loadgen.txt"
            read -r ops p50 p99 <<<"$(echo "$line" | sed -E 's/.*: ([0-9]+) ops\/s.* p50 ([0-9]+) µs p90 [0-9]+ p99 ([0-9]+).*/\1 \2 \3/')"
            OPS[$t]=$ops
            cpu=$(python3 -c "print(round(100 * ($s1 - $s0) / ($t1 - $t0)))")
            ratio=""
            [ "$t" = freqcap ] && ratio=$(python3 -c "print(f'{${OPS[freqcap]} / ${OPS[redis]}:.2f}')")
            echo "| loadgen | $w | $t | $ops | $p50 | $p99 | $cpu | $ratio |" | tee -a "$OUT/summary.md"
        done
    done
fi
echo "results: $RES" >&2
