#!/usr/bin/env bash
# Tests the Redis Functions library src/cluster/functions.lua against a real,
# throwaway redis-server (7.0+) that this script starts on 127.0.0.1 and stops
# by PID on exit, whatever happens.
#
#   ops/test-functions.sh [PORT]        # default 7300
#
# Every check compares exact replies (types included, via redis-cli --no-raw)
# and the script stops at the first mismatch with a nonzero exit. Needs
# redis-server and redis-cli (`apt-get install redis-server`, or run
# `ops/redis-cluster.sh start DIR` once, which installs them).
set -euo pipefail

PORT=${1:-7300}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIB=$HERE/../src/cluster/functions.lua

die() { echo "test-functions: $*" >&2; exit 1; }

[[ $PORT =~ ^[0-9]+$ ]] && (( PORT > 0 && PORT < 65536 )) || die "bad port: $PORT"
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
  die "redis-server/redis-cli not found: apt-get install redis-server"
[[ -r $LIB ]] || die "library not found: $LIB"

rc()  { redis-cli -h 127.0.0.1 -p "$PORT" --no-raw "$@"; }  # typed replies, for exact checks
raw() { redis-cli -h 127.0.0.1 -p "$PORT" --raw "$@"; }     # bare values, for arithmetic

# Someone else's server on the port would be tested (and its data touched):
# refuse instead.
if raw PING >/dev/null 2>&1; then die "something already answers on 127.0.0.1:$PORT"; fi

WORK=$(mktemp -d)
PID=

# Stops our server by its PID (never by name), bounded: SIGTERM, up to 5 s,
# then SIGKILL; then reaps it and removes the scratch directory.
cleanup() {
  local status=$?
  if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$PID" 2>/dev/null && kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --save '' and --appendonly no: nothing of the test outlives it.
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --dir "$WORK" --logfile "$WORK/redis.log" &
PID=$!

# Wait (at most 10 s) until it answers; fail early if it died (e.g. the port
# is taken by something that does not speak Redis).
for _ in $(seq 100); do
  kill -0 "$PID" 2>/dev/null || die "redis-server exited at start: $(tail -n 3 "$WORK/redis.log" 2>/dev/null)"
  [[ $(raw PING 2>/dev/null) == PONG ]] && break
  sleep 0.1
done
[[ $(raw PING 2>/dev/null) == PONG ]] || die "redis-server did not answer on $PORT within 10 s"
echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') pid $PID on 127.0.0.1:$PORT"

PASS=0
ok() { PASS=$((PASS + 1)); echo "ok   $1"; }
fail() {
  local name=$1; shift
  echo "FAIL $name" >&2
  printf '     %s\n' "$@" >&2
  exit 1
}
# expect NAME EXPECTED ACTUAL: exact string comparison.
expect() {
  if [[ $2 == "$3" ]]; then ok "$1"; else
    fail "$1" "expected: $(printf '%q' "$2")" "got:      $(printf '%q' "$3")"
  fi
}
# expect_true NAME DESCRIPTION CONDITION...: for relations (>, ranges).
expect_true() {
  local name=$1 what=$2; shift 2
  if "$@"; then ok "$name"; else fail "$name" "$what"; fi
}

now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
now_ms() { echo $(( $(now_us) / 1000 )); }
# within_10s VALUE NOW: the server clock and ours are the same machine's.
within_10s() { local d=$(( $1 - $2 )); (( d < 0 )) && d=$(( -d )); (( d <= 10 * $3 )); }

# Strips redis-cli's "N) (integer) " so a lease reply reads "g s spent total now".
ints() { sed -E 's/^ *[0-9]+\) \(integer\) //' | tr '\n' ' ' | sed 's/ $//'; }

echo "== load"
expect "FUNCTION LOAD REPLACE returns the library name" '"freqcap_v1"' \
  "$(rc -x FUNCTION LOAD REPLACE < "$LIB")"
expect "loading twice with REPLACE is fine" '"freqcap_v1"' \
  "$(rc -x FUNCTION LOAD REPLACE < "$LIB")"
expect "FUNCTION LIST shows the nineteen functions" \
  $'fc_cas_v1\nfc_cas_v2\nfc_cas_v3\nfc_defs_v1\nfc_heat_v1\nfc_hot_v1\nfc_lease_read_v1\nfc_lease_v1\nfc_lease_v2\nfc_line_cap_v1\nfc_line_v1\nfc_member_v1\nfc_own_v1\nfc_peek_v1\nfc_plan_v1\nfc_slots_cap_v1\nfc_slots_v1\nfc_slots_v2\nfc_writer_v1' \
  "$(raw FUNCTION LIST LIBRARYNAME freqcap_v1 | grep '^fc_' | sort)"

###############################################################################
echo "== fc_cas_v1"
K='fc:{u:test}'

out=$(rc FCALL fc_cas_v1 1 "$K" 0 'hello world' 0)
V1=$(sed -n 2p <<<"$out" | ints)
expect "cas on absent key with 0: written" \
  $'1) (integer) 1\n2) (integer) '"$V1" "$out"
expect_true "first version is the server time in µs ($V1)" "V1=$V1 now=$(now_us)" \
  within_10s "$V1" "$(now_us)" 1000000
expect "blob stored" '"hello world"' "$(rc HGET "$K" b)"
expect "no expiry when expire_at_ms is 0" '(integer) -1' "$(rc PTTL "$K")"

expect "cas with 0 on existing key: conflict with current version and blob" \
  $'1) (integer) 0\n2) (integer) '"$V1"$'\n3) "hello world"' \
  "$(rc FCALL fc_cas_v1 1 "$K" 0 other 0)"
expect "cas with a stale version: conflict" \
  $'1) (integer) 0\n2) (integer) '"$V1"$'\n3) "hello world"' \
  "$(rc FCALL fc_cas_v1 1 "$K" $((V1 - 1)) other 0)"
expect "conflict wrote nothing" '"hello world"' "$(rc HGET "$K" b)"
expect "conflict on absent key: version 0, nil blob" \
  $'1) (integer) 0\n2) (integer) 0\n3) (nil)' \
  "$(rc FCALL fc_cas_v1 1 'fc:{u:absent}' 7 x 0)"
expect "conflict did not create the key" '(integer) 0' "$(rc EXISTS 'fc:{u:absent}')"

out=$(rc FCALL fc_cas_v1 1 "$K" "$V1" $'bin\n\xff\x01' 0)
V2=$(sed -n 2p <<<"$out" | ints)
expect "cas with the current version: written" $'1) (integer) 1\n2) (integer) '"$V2" "$out"
expect_true "version monotonic ($V1 < $V2)" "V1=$V1 V2=$V2" test "$V2" -gt "$V1"
expect "binary blob round trip" '"bin\n\xff\x01"' "$(rc HGET "$K" b)"

E=$(( $(now_ms) + 100000 ))
out=$(rc FCALL fc_cas_v1 1 "$K" "$V2" blob3 "$E")
V3=$(sed -n 2p <<<"$out" | ints)
expect "cas with expire_at_ms: written" $'1) (integer) 1\n2) (integer) '"$V3" "$out"
expect_true "version monotonic ($V2 < $V3)" "V2=$V2 V3=$V3" test "$V3" -gt "$V2"
expect "expiry set exactly (PEXPIRETIME)" "(integer) $E" "$(rc PEXPIRETIME "$K")"
out=$(rc FCALL fc_cas_v1 1 "$K" "$V3" blob4 0)
V4=$(sed -n 2p <<<"$out" | ints)
expect "cas with expire_at_ms 0 after an expiry: written" $'1) (integer) 1\n2) (integer) '"$V4" "$out"
expect "expire_at_ms 0 removes the expiry" '(integer) -1' "$(rc PTTL "$K")"

out=$(rc FCALL fc_cas_v1 1 "$K" "$V4" blob5 1)
V5=$(sed -n 2p <<<"$out" | ints)
expect "cas with an expiry in the past: written" $'1) (integer) 1\n2) (integer) '"$V5" "$out"
expect "... and the key is gone at once" '(integer) 0' "$(rc EXISTS "$K")"
out=$(rc FCALL fc_cas_v1 1 "$K" 0 reborn 0)
V6=$(sed -n 2p <<<"$out" | ints)
expect "recreate after expiry with 0: written" $'1) (integer) 1\n2) (integer) '"$V6" "$out"
expect_true "recreated key's version above every earlier one, no ABA ($V5 < $V6)" \
  "V5=$V5 V6=$V6" test "$V6" -gt "$V5"

ERRV='(error) ERR fc_cas_v1: expected_version must be a non-negative integer <= 2^53-1'
ERRE='(error) ERR fc_cas_v1: expire_at_ms must be a non-negative integer <= 2^53-1'
expect "expected_version 'abc' rejected" "$ERRV" "$(rc FCALL fc_cas_v1 1 "$K" abc x 0)"
expect "expected_version '1e3' rejected" "$ERRV" "$(rc FCALL fc_cas_v1 1 "$K" 1e3 x 0)"
expect "expected_version '-1' rejected" "$ERRV" "$(rc FCALL fc_cas_v1 1 "$K" -1 x 0)"
expect "expected_version 2^53 rejected" "$ERRV" "$(rc FCALL fc_cas_v1 1 "$K" 9007199254740992 x 0)"
expect "expire_at_ms 'soon' rejected" "$ERRE" "$(rc FCALL fc_cas_v1 1 "$K" "$V6" x soon)"
expect "expire_at_ms ' 5' rejected" "$ERRE" "$(rc FCALL fc_cas_v1 1 "$K" "$V6" x ' 5')"
expect "two arguments rejected" \
  '(error) ERR fc_cas_v1: expects 3 arguments: expected_version blob expire_at_ms' \
  "$(rc FCALL fc_cas_v1 1 "$K" "$V6" x)"
expect "no key rejected" '(error) ERR fc_cas_v1: expects exactly 1 key' \
  "$(rc FCALL fc_cas_v1 0 0 x 0)"
expect "rejected calls wrote nothing" $'1) "v"\n2) "'"$V6"$'"\n3) "b"\n4) "reborn"' \
  "$(rc HGETALL "$K")"
rc SET 'fc:{u:str}' plain >/dev/null
out=$(rc FCALL fc_cas_v1 1 'fc:{u:str}' 0 x 0)
expect_true "cas on a key of another type: WRONGTYPE" "got: $out" \
  grep -q '^(error) WRONGTYPE' <<<"$out"

###############################################################################
echo "== fc_lease_v1"

# Σ s + Σ max(0, g − s) <= total, from the function's own diagnostic read.
check_invariant() {
  local key=$1 total=$2 sums
  sums=$(raw FCALL_RO fc_lease_read_v1 1 "$key" | awk '
    NR == 1 { next }                       # now_ms
    NR % 2 == 0 { f = $0; next }
    { split(f, p, ":"); n = substr(f, 3)
      if (p[1] == "s") s[n] = $0; if (p[1] == "g") g[n] = $0 }
    END { for (n in s) { S += s[n]; h = g[n] - s[n]; if (h > 0) H += h }
          printf "%d %d", S, H }')
  local spent=${sums% *} held=${sums#* }
  if (( spent + held > total )); then
    fail "invariant on $key" "spent $spent + headroom $held > total $total"
  fi
  echo "$spent $held"
}

# Runs lease calls given as lines on stdin through ONE redis-cli, so calls that
# must land within a 200 ms TTL do not each pay a process start on a loaded
# machine; prints one "g s spent total now_ms" line per call.
lease_batch() {
  redis-cli -h 127.0.0.1 -p "$PORT" --no-raw |
    sed -E 's/^ *[0-9]+\) \(integer\) //' | paste -d ' ' - - - - -
}
# check_batch NAME EXPECTED_LINES ACTUAL_LINES TTL: compares "g s spent total"
# of every call; now_ms must be integral, near our clock, and the batch must
# have run within TTL (else the expected results would not apply: say so).
check_batch() {
  local name=$1 expected=$2 actual=$3 ttl=$4 first last
  first=$(head -n1 <<<"$actual" | awk '{print $5}')
  last=$(tail -n1 <<<"$actual" | awk '{print $5}')
  [[ $first =~ ^[0-9]{13}$ && $last =~ ^[0-9]{13}$ ]] ||
    fail "$name" "malformed replies:" "$actual"
  within_10s "$first" "$(now_ms)" 1000 || fail "$name" "now_ms $first is not the current time"
  (( last - first < ttl )) ||
    fail "$name" "batch took $((last - first)) ms >= TTL $ttl ms: machine too loaded for this timing test"
  expect "$name" "$expected" "$(cut -d ' ' -f 1-4 <<<"$actual")"
}

L='fc:{c:camp1}:2026-01-01'
out=$(lease_batch <<EOF
FCALL fc_lease_v1 1 $L n1 0 60 100 200 0 0
FCALL fc_lease_v1 1 $L n2 0 60 100 200 0 0
FCALL fc_lease_v1 1 $L n3 0 60 100 200 0 0
FCALL fc_lease_v1 1 $L n1 10 60 100 200 0 0
FCALL fc_lease_v1 1 $L n1 10 60 100 200 0 0
EOF
)
check_batch "n1,n2,n3 want 60 of 100 -> g 60,40,0; n1 reports S=10 twice -> g 60 both times" \
  $'60 0 0 100\n40 0 0 100\n0 0 0 100\n60 10 10 100\n60 10 10 100' "$out" 200
expect "invariant: spent 10 + headroom 90 <= 100" "10 90" "$(check_invariant "$L" 100)"

sleep 0.3  # n2 and n3 (ttl 200 ms, grace 0) expire; n1 too, but it is the caller
out=$(lease_batch <<EOF
FCALL fc_lease_v1 1 $L n1 10 60 100 200 0 0
FCALL fc_lease_v1 1 $L n3 0 60 100 200 0 0
EOF
)
check_batch "after n2,n3 expire: n1 wants 60 -> headroom 60 (g 70); n3 back wanting 60 -> 30" \
  $'70 10 10 100\n30 0 10 100' "$out" 200
expect "reclaimed n2 keeps its spent, loses its headroom (g:n2 40 -> 0)" \
  'g:n1=70 g:n2=0 g:n3=30 s:n1=10 s:n2=0 s:n3=0 w:n1=60 w:n2=60 w:n3=60' \
  "$(raw FCALL_RO fc_lease_read_v1 1 "$L" | tail -n +2 | paste -d '=' - - | grep -v '^[ex]:' | tr '\n' ' ' | sed 's/ $//')"
expect "invariant: spent 10 + headroom 90 <= 100" "10 90" "$(check_invariant "$L" 100)"

out=$(rc FCALL_RO fc_lease_read_v1 1 "$L")
E1=$(raw HGET "$L" e:n1)
NOW=$(sed -n 1p <<<"$out" | ints)
expect_true "read: [now_ms, [sorted fields]]" "got: $out" \
  grep -Eq '^2\) +1\) "e:n1"$' <<<"$(sed -n 2p <<<"$out")"
expect_true "e:n1 is the Redis time of n1's call + ttl (within 200 ms of now)" \
  "e:n1=$E1 now=$NOW" test $(( E1 - NOW )) -le 200 -a $(( E1 - NOW )) -gt -10000

L2='fc:{c:over}:p'
expect "overspend: a gets 10 of 10" '10 0 0 10' \
  "$(rc FCALL fc_lease_v1 1 "$L2" a 0 10 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "a reports S=15 > g=10: g lifted to s, nothing new granted" '15 15 15 10' \
  "$(rc FCALL fc_lease_v1 1 "$L2" a 15 10 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "a replays an older S=12: spent never goes down" '15 15 15 10' \
  "$(rc FCALL fc_lease_v1 1 "$L2" a 12 10 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "b asks while spent > total: nothing" '0 0 15 10' \
  "$(rc FCALL fc_lease_v1 1 "$L2" b 0 5 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "node names may contain ':'" '0 0 15 10' \
  "$(rc FCALL fc_lease_v1 1 "$L2" 'eu:1' 0 5 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "... stored as s:eu:1" '"0"' "$(rc HGET "$L2" 's:eu:1')"

L3='fc:{c:round}:p'
expect "round: a gets 10 of 10" '10 0 0 10' \
  "$(rc FCALL fc_lease_v1 1 "$L3" a 0 10 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "round: b gets 0" '0 0 0 10' \
  "$(rc FCALL fc_lease_v1 1 "$L3" b 0 10 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "round: c gets 0" '0 0 0 10' \
  "$(rc FCALL fc_lease_v1 1 "$L3" c 0 10 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "round: a spends all 10, wants nothing more" '10 10 10 10' \
  "$(rc FCALL fc_lease_v1 1 "$L3" a 10 0 10 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "total grows to 11: b's fair share is 0.5, rounded up: the last unit is not stranded" \
  '1 0 10 11' "$(rc FCALL fc_lease_v1 1 "$L3" b 0 10 11 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "... and c gets nothing: the unit is held by b" '0 0 10 11' \
  "$(rc FCALL fc_lease_v1 1 "$L3" c 0 10 11 60000 0 0 | ints | cut -d ' ' -f 1-4)"
expect "invariant on the rounding key" "10 1" "$(check_invariant "$L3" 11)"

L4='fc:{c:unequal}:p'
lease4() { rc FCALL fc_lease_v1 1 "$L4" "$@" 60000 0 0 | ints | cut -d ' ' -f 1-4; }
expect "unequal: a wants 10 of 100, gets 10" '10 0 0 100' "$(lease4 a 0 10 100)"
expect "unequal: b wants 100, fair share 90 (a wants only 10)" '90 0 0 100' "$(lease4 b 0 100 100)"
expect "unequal: c wants 100, share 45, but b's 90 is not revoked: 0" '0 0 0 100' \
  "$(lease4 c 0 100 100)"
expect "unequal: b spends 60: keeps headroom 30 (above its share 15), nothing new" \
  '90 60 60 100' "$(lease4 b 60 100 100)"
expect "unequal: total grows to 130: c gets share (70-10)/2 = 30, all free" \
  '30 0 60 130' "$(lease4 c 0 100 130)"
expect "unequal: b asks again: nothing free, b and c now hold 30 each (converged)" \
  '90 60 60 130' "$(lease4 b 60 100 130)"
expect "invariant on the unequal key: 60 + 10 + 30 + 30 = 130" "60 70" "$(check_invariant "$L4" 130)"

L5='fc:{c:ttl}:p'
rc FCALL fc_lease_v1 1 "$L5" a 0 1 10 60000 0 60000 >/dev/null
P1=$(raw PTTL "$L5")
expect_true "key_expire_ms sets the hash's TTL ($P1 ms)" "PTTL=$P1" \
  test "$P1" -gt 50000 -a "$P1" -le 60000
rc FCALL fc_lease_v1 1 "$L5" a 0 1 10 60000 0 0 >/dev/null
P2=$(raw PTTL "$L5")
expect_true "key_expire_ms 0 leaves the TTL alone ($P2 ms)" "PTTL=$P2" \
  test "$P2" -gt 50000 -a "$P2" -le "$P1"

expect "FCALL_RO of fc_lease_v1 refused (write function)" \
  '(error) ERR Can not execute a script with write flag using *_ro command.' \
  "$(rc FCALL_RO fc_lease_v1 1 "$L5" a 0 1 10 60000 0 0)"
out=$(rc FCALL_RO fc_lease_read_v1 1 'fc:{c:none}')
expect "read of an absent key: [now_ms, []]" \
  $'1) (integer) '"$(sed -n 1p <<<"$out" | ints)"$'\n2) (empty array)' "$out"
ERRL() { echo "(error) ERR fc_lease_v1: $1 must be a non-negative integer <= 2^53-1"; }
expect "spent 'x' rejected"   "$(ERRL spent)"    "$(rc FCALL fc_lease_v1 1 "$L5" a x 1 10 1 0 0)"
expect "want '-1' rejected"   "$(ERRL want)"     "$(rc FCALL fc_lease_v1 1 "$L5" a 0 -1 10 1 0 0)"
expect "total '1.5' rejected" "$(ERRL total)"    "$(rc FCALL fc_lease_v1 1 "$L5" a 0 1 1.5 1 0 0)"
expect "ttl_ms '' rejected"   "$(ERRL ttl_ms)"   "$(rc FCALL fc_lease_v1 1 "$L5" a 0 1 10 '' 0 0)"
expect "grace_ms 'x' rejected" "$(ERRL grace_ms)" "$(rc FCALL fc_lease_v1 1 "$L5" a 0 1 10 1 x 0)"
expect "key_expire_ms 'x' rejected" "$(ERRL key_expire_ms)" \
  "$(rc FCALL fc_lease_v1 1 "$L5" a 0 1 10 1 0 x)"
expect "empty node rejected" '(error) ERR fc_lease_v1: node must not be empty' \
  "$(rc FCALL fc_lease_v1 1 "$L5" '' 0 1 10 1 0 0)"
expect "six arguments rejected" \
  '(error) ERR fc_lease_v1: expects 7 arguments: node spent want total ttl_ms grace_ms key_expire_ms' \
  "$(rc FCALL fc_lease_v1 1 "$L5" a 0 1 10 1 0)"

###############################################################################
echo "== fc_lease_v1 randomized: 4 nodes, spends inside grants, expiries, a growing total"
# Each node spends a random part of its headroom, but only while its last
# grant is alive (ttl 60 s); a call with ttl 1 ms lets its grant lapse, so the
# next call by another node reclaims it, and the lapsed node spends nothing
# until it has a live grant again: the protocol's "spend only inside a live
# grant". After every call: the invariant, spent_total = Σ s, g >= s, and a
# live grant never shrinks.
RANDOM=20260101
LR='fc:{c:random}:p'
declare -A S=() G=() LIVE=()
nodes=(a b c d)
total=40 calls=300 reclaims=0 granted=0
for ((i = 0; i < calls; i++)); do
  n=${nodes[RANDOM % 4]}
  s=${S[$n]:-0} g=${G[$n]:-0} live=${LIVE[$n]:-0}
  if [[ $live == 1 ]] && (( g > s )); then s=$(( s + RANDOM % (g - s + 1) )); fi
  want=$(( RANDOM % 25 ))
  if (( RANDOM % 5 == 0 )); then ttl=1; else ttl=60000; fi
  if (( RANDOM % 8 == 0 )); then total=$(( total + RANDOM % 15 )); fi
  read -r g2 s2 spent tot now < <(raw FCALL fc_lease_v1 1 "$LR" "$n" "$s" "$want" "$total" "$ttl" 0 0 | paste -s -d " ")
  [[ $g2 =~ ^[0-9]+$ && $s2 == "$s" && $tot == "$total" ]] ||
    fail "random call $i" "node $n sent S=$s total=$total, got g=$g2 s=$s2 total=$tot"
  (( g2 >= s2 )) || fail "random call $i" "g $g2 < s $s2"
  if [[ $live == 1 ]] && (( g2 < g )); then fail "random call $i" "live grant of $n shrank: $g -> $g2"; fi
  if [[ $live == 0 ]] && (( g2 < g )); then reclaims=$((reclaims + 1)); fi
  (( g2 > s2 )) && granted=$((granted + 1))
  sums=$(check_invariant "$LR" "$total")
  [[ ${sums% *} == "$spent" ]] || fail "random call $i" "spent_total $spent != Σ s ${sums% *}"
  S[$n]=$s2 G[$n]=$g2
  if [[ $ttl == 60000 ]]; then LIVE[$n]=1; else LIVE[$n]=0; fi
done
sums=$(check_invariant "$LR" "$total")
ok "randomized: $calls calls, invariant held after each (final spent ${sums% *} + headroom ${sums#* } <= total $total)"
expect_true "randomized run exercised reclaims ($reclaims) and grants ($granted)" \
  "reclaims=$reclaims granted=$granted" test "$reclaims" -gt 0 -a "$granted" -gt 0

###############################################################################
echo "== fc_slots_v1"
SL='fc:{l:slots-test}'
# Two holders of max 4 slots: a asks for 2, b for 4 (gets what a leaves).
slots() { rc FCALL fc_slots_v1 1 "$SL" "$@" | head -2 | ints; }
expect "a asks for 2 of 4: granted 2" '2 0' "$(slots a 1 0 2 4 60000 0 0)"
expect "b asks for 4: granted the 2 a leaves" '2 0' "$(slots b 1 0 4 4 60000 0 0)"
expect "a uses its 2" '2 2' "$(slots a 2 2 0 4 60000 5000 0)"
expect "a's older report, applied late, changes nothing" '2 2' "$(slots a 1 0 0 4 60000 0 0)"
expect "a repeats its last report: the same" '2 2' "$(slots a 2 2 0 4 60000 5000 0)"
expect "a holds none and asks for none: gives its slots back" '0 0' "$(slots a 3 0 0 4 60000 0 0)"
expect "b now gets all 4" '4 0' "$(slots b 2 0 4 4 60000 0 0)"
expect "a asks again: b holds them all, a gets none" '0 0' "$(slots a 4 0 2 4 60000 0 0)"
expect "b uses 1 and wants 1 more: max-min fair, b keeps 2" '2 1' "$(slots b 3 1 1 4 60000 0 0)"
expect "a gets the 2 b gave back" '2 0' "$(slots a 5 0 2 4 60000 0 0)"
expect "a holder's grant is never below what it uses" '3 3' "$(slots a 6 3 0 4 60000 0 0)"
# A holder whose grant and holds ended is dropped; its slots are free.
slots c 1 0 0 4 1 1 0 >/dev/null
sleep 0.05
rc FCALL fc_slots_v1 1 "$SL" b 4 0 0 4 60000 0 0 >/dev/null
expect "an expired holder's fields are dropped" '(integer) 0' "$(rc HEXISTS "$SL" h:c)"
expect "fc_slots_v1 names a bad argument" \
  '(error) ERR fc_slots_v1: used must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_slots_v1 1 "$SL" a 7 x 0 4 1 1 0)"

###############################################################################
echo "== fc_slots_v2, fc_slots_cap_v1"
SC='fc:{l:slots-cap-test}'
# v2 answers v1's three numbers and the holder's fair share (target).
slots2() { rc FCALL fc_slots_v2 1 "$SC" "$@" | ints; }
cap() { rc FCALL fc_slots_cap_v1 1 "$SC" "$@" | ints; }
r=$(slots2 n1 1 0 3 10 60000 0 0)
expect "v2: n1 asks for 3 of 10: granted 3, target 3" '3 0 3' "$(echo "$r" | cut -d' ' -f1,2,4)"
r=$(slots2 n2 1 0 3 10 60000 9000 0)
expect "v2: n2 too" '3 0 3' "$(echo "$r" | cut -d' ' -f1,2,4)"
# A region's cap of 4: from now on Σ granted <= max(Σ now, 4).
r=$(cap 100 4 0)
expect "cap set: held 6, demand 6, the cap 4 at seq 100" '6 6 4 100' \
  "$(echo "$r" | cut -d' ' -f1,2,5,6)"
hold=$(echo "$r" | cut -d' ' -f3)
expect_true "cap read: the latest holder's life from now ($hold ms)" "hold=$hold" \
  test "$hold" -gt 50000 -a "$hold" -le 60000
r=$(slots2 n1 2 3 0 10 60000 0 0)
expect "n1 holds its 3: kept, though over its share of the cap (target 1)" '3 3 1' \
  "$(echo "$r" | cut -d' ' -f1,2,4)"
r=$(slots2 n1 3 1 0 10 60000 0 0)
expect "n1 down to 1: granted 1 (the cap leaves 4 - 3 held by n2)" '1 1 1' \
  "$(echo "$r" | cut -d' ' -f1,2,4)"
r=$(slots2 n2 2 0 0 10 60000 0 0)
expect "n2 holds none and asks none: 0" '0 0 0' "$(echo "$r" | cut -d' ' -f1,2,4)"
r=$(slots2 n2 3 0 5 10 60000 0 0)
expect "n2 asks 5: the cap of 4 leaves it 3" '3 0 3' "$(echo "$r" | cut -d' ' -f1,2,4)"
expect "an older cap is not set: the one in force stays" '4 100' \
  "$(cap 99 10 0 | cut -d' ' -f5,6)"
expect "a later cap is" '8 101' "$(cap 101 8 0 | cut -d' ' -f5,6)"
slots2 n3 1 0 0 10 1 0 100000 >/dev/null
cap 102 8 5000 >/dev/null
pttl=$(raw PTTL "$SC")
expect_true "a cap never shortens the life a holder gave the hash ($pttl ms)" "pttl=$pttl" \
  test "$pttl" -gt 50000
cap 103 8 200000 >/dev/null
pttl=$(raw PTTL "$SC")
expect_true "and lengthens a shorter one ($pttl ms)" "pttl=$pttl" test "$pttl" -gt 100000
expect "fc_slots_cap_v1 names a bad argument" \
  '(error) ERR fc_slots_cap_v1: cap must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_slots_cap_v1 1 "$SC" 1 x 0)"
expect "fc_slots_v2 names a bad argument" \
  '(error) ERR fc_slots_v2: used must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_slots_v2 1 "$SC" a 7 x 0 4 1 1 0)"

###############################################################################
echo "== fc_line_cap_v1"
LC='fc:{l:line-cap-test}'
# A line of burst 10, 1 unit a ms, no lookahead.
line() { rc FCALL fc_line_v1 1 "$LC" "$@" | ints; }
lcap() { rc FCALL fc_line_cap_v1 1 "$LC" "$@" | ints; }
expect "n1 asks 5 of a full line: granted 5" '5' "$(line n1 0 5 10 1 1000 0 60000 1000 0 | cut -d' ' -f1)"
r=$(lcap 0 6 0)
expect "cap 6 set: 5 granted, n1's want of 5, the cap 6" '5 5 6' "$(echo "$r" | cut -d' ' -f1,2,4)"
r=$(line n2 0 5 10 1 1000 0 60000 1000 0)
expect "n2 asks 5: the cap leaves it 1" '1' "$(echo "$r" | cut -d' ' -f1)"
retry=$(echo "$r" | cut -d' ' -f4)
expect_true "held back by the cap: retry in 100 ms at the soonest ($retry)" "retry=$retry" \
  test "$retry" -ge 100
expect "cap 0 freezes the line: n2 gets nothing more" '1' \
  "$(lcap 0 0 0 >/dev/null; line n2 0 5 10 1 1000 0 60000 1000 0 | cut -d' ' -f1)"
expect "n1 spends 2 and gives 3 back: granted 2, the sum now 3" '2 3' \
  "$(line n1 2 0 10 1 1000 0 60000 1000 0 | cut -d' ' -f1) $(lcap 0 0 0 | cut -d' ' -f1)"
seq=$(lcap 0 9 0 | cut -d' ' -f5)
expect "an older cap is not set" "9 $seq" "$(lcap 1 50 0 | cut -d' ' -f4,5)"
expect "fc_line_cap_v1 names a bad argument" \
  '(error) ERR fc_line_cap_v1: seq must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_line_cap_v1 1 "$LC" x 1 0)"

###############################################################################
echo "== fc_defs_v1, fc_writer_v1"
D='fc:{defs}'
W='fc:{defs}:writer'
defs() { rc FCALL fc_defs_v1 2 "$D" "$W" "$@" | ints; }
expect "a batch on no definitions (any version): applied, version 1" '1 1' \
  "$(defs '' '' S c/a A S c/b B)"
expect "both definitions are there" $'c/a\nA\nc/b\nB' \
  "$(raw HGETALL "$D" | paste - - | grep -v '^__' | sort | tr '\t' '\n')"
expect "a batch from an older version: conflict, the current version" '0 1' \
  "$(defs 0 '' D c/a S c/c C)"
expect "the conflict applied nothing" '(integer) 1' "$(rc HEXISTS "$D" c/a)"
expect "nor its set" '(integer) 0' "$(rc HEXISTS "$D" c/c)"
expect "a batch with a bad op after a good one: refused" \
  '(error) ERR fc_defs_v1: op 2: must be S or D' "$(rc FCALL fc_defs_v1 2 "$D" "$W" 1 '' S c/x X Q c/y)"
expect "the bad batch applied none of its ops" '(integer) 0' "$(rc HEXISTS "$D" c/x)"
expect "nor bumped the version" '"1"' "$(rc HGET "$D" __v)"
expect "a batch may not touch __ fields" \
  '(error) ERR fc_defs_v1: op 1: a field must be given and must not start with __' \
  "$(rc FCALL fc_defs_v1 2 "$D" "$W" 1 '' S __v 99)"
expect "a writer's batch while no one holds the lock: refused, no holder" \
  $'1) (integer) 2\n2) (nil)' "$(rc FCALL fc_defs_v1 2 "$D" "$W" 1 n1 D c/a)"
expect "n1 takes the free lock" '"n1"' "$(rc FCALL fc_writer_v1 1 "$W" n1 5000)"
expect "n2 cannot take it: n1 holds it" '"n1"' "$(rc FCALL fc_writer_v1 1 "$W" n2 5000)"
expect "n2's batch is refused, naming n1" $'1) (integer) 2\n2) "n1"' \
  "$(rc FCALL fc_defs_v1 2 "$D" "$W" 1 n2 D c/a)"
expect "n1's batch at the current version: applied whole" '1 2' "$(defs 1 n1 D c/a S c/c C)"
expect "its delete applied" '(integer) 0' "$(rc HEXISTS "$D" c/a)"
expect "and its set" '"C"' "$(rc HGET "$D" c/c)"
expect "n1 renews its lock" '"n1"' "$(rc FCALL fc_writer_v1 1 "$W" n1 5000)"
expect "n2 giving up a lock it does not hold changes nothing" '"n1"' \
  "$(rc FCALL fc_writer_v1 1 "$W" n2 0)"
expect "n1 gives it up" '(nil)' "$(rc FCALL fc_writer_v1 1 "$W" n1 0)"
expect "then n2 takes it" '"n2"' "$(rc FCALL fc_writer_v1 1 "$W" n2 60)"
sleep 0.1
expect "an unrenewed lock expires: n3 takes it" '"n3"' "$(rc FCALL fc_writer_v1 1 "$W" n3 5000)"
expect "fc_writer_v1 names a bad argument" \
  '(error) ERR fc_writer_v1: ttl_ms must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_writer_v1 1 "$W" n3 soon)"

###############################################################################
echo "== fc_lease_v2"
L2='fc:{l:v2-test}'
NOWMS=$(now_ms)
S=$(( NOWMS - 100000 )) E=$(( NOWMS + 100000 ))
# node spent want ttl grace key_expire start end rule amount allowance look total
v2() { rc FCALL fc_lease_v2 1 "$@" | ints | cut -d' ' -f1-6; }
out=$(v2 "$L2" a 0 4 60000 0 0 "$S" "$E" 1 10 0 0 999)
expect "rule 1: the total is the amount, not the caller's" '4 0 0 10' "${out% * *}"
expect_true "usable_ms is the ttl well inside the period" "got: $out" test "${out##* }" -eq 60000
out=$(v2 "$L2" b 0 10 60000 0 0 "$S" "$E" 1 10 0 0 999)
expect "b gets the 6 a leaves" '6 0 0 10' "${out% * *}"
out=$(v2 "$L2" a 0 4 60000 0 0 "$E" $(( E + 60000 )) 1 10 0 0 0)
expect "outside the period Redis is in: a's headroom is taken back" '0 0 0 10' "${out% * *}"
expect "... and its grant is not usable" '0' "${out##* }"
out=$(v2 'fc:{l:v2-even}' a 0 1000 60000 0 0 "$S" "$E" 2 1000 0 0 0)
tot=$(awk '{print $4}' <<<"$out")
expect_true "rule 2: an even line at Redis's time, about half way ($tot)" "got: $out" \
  test "$tot" -ge 495 -a "$tot" -le 510
out=$(v2 'fc:{l:v2-given}' a 0 5 60000 0 0 "$S" "$E" 0 0 0 0 3)
expect "rule 0: the caller's total" '3 0 0 3' "${out% * *}"
out=$(v2 'fc:{l:v2-end}' a 0 5 60000 0 0 "$S" $(( NOWMS + 1000 )) 1 10 0 0 0)
expect_true "no grant outlives its period (usable ${out##* } ms)" "got: $out" \
  test "${out##* }" -le 1000
expect "rule 5 rejected" \
  '(error) ERR fc_lease_v2: needs start_ms < end_ms and a rule from 0 to 4' \
  "$(rc FCALL fc_lease_v2 1 "$L2" a 0 1 1 0 0 "$S" "$E" 5 1 0 0 0)"
expect "rule 3 without segments rejected" \
  '(error) ERR fc_lease_v2: rules 3 and 4 need segments_id and segments' \
  "$(rc FCALL fc_lease_v2 1 "$L2" a 0 1 1 0 0 "$S" "$E" 3 1 0 0 0)"
# Rule 3: a period of [S, E) weighted 1 in its first half and 3 in its
# second; Redis's time is at its middle, so F(t)/F(end) = 1/4 (+ lookahead).
v2w() { rc FCALL fc_lease_v2 1 "$@" | ints; }
MID=$(( (S + E) / 2 ))
SEG="$S:1,$MID:3"
out=$(v2w 'fc:{l:v2-w}' a 0 1000 60000 0 0 "$S" "$E" 3 1000 0 0 999 0 42 "$SEG")
tot=$(awk '{print $4}' <<<"$out")
expect_true "rule 3: the weighted line at Redis's time, about a quarter ($tot)" "got: $out" \
  test "$tot" -ge 248 -a "$tot" -le 256
expect "rule 3 stores the segments" "$(printf '"%s"\n"42"' "$SEG")" \
  "$(raw HMGET 'fc:{l:v2-w}' '~pf' '~pid' | sed 's/.*/"&"/')"
out=$(v2w 'fc:{l:v2-w}' a 0 1000 60000 0 0 "$S" "$E" 3 1000 0 0 999 0 42 '')
expect_true "rule 3 with the stored id: segments not resent ($out)" "got: $out" \
  test "$(awk '{print $4, $7}' <<<"$out" | cut -d' ' -f2)" = 0 -a "$(awk '{print $4}' <<<"$out")" -ge 248
out=$(v2w 'fc:{l:v2-w}' b 0 5 60000 0 0 "$S" "$E" 3 1000 0 0 999 0 43 '')
expect "another id, not sent: nothing granted, need_segments" '0 0 0 0 1' \
  "$(awk '{print $1, $2, $4, $6, $7}' <<<"$out")"
# Rule 4: the plan of the slice at S + (E - S) / 4 with base 100, over even
# time (one segment): at the middle, base + (900) * (1/4) / (3/4) = 400.
PW='fc:{l:v2-plan}'
raw HSET "$PW" '~a' $(( S + (E - S) / 4 )) '~base' 100 >/dev/null
out=$(v2w "$PW" a 0 1000 60000 0 0 "$S" "$E" 4 1000 5 0 999 0 7 "$S:1")
tot=$(awk '{print $4}' <<<"$out")
expect_true "rule 4: the stored plan's line at Redis's time, about 400 + 5 ($tot)" "got: $out" \
  test "$tot" -ge 404 -a "$tot" -le 408
expect "v2 stores its rule and period" "$(printf '"1"\n"%s"\n"%s"' "$E" $(( E + 60000 )))" \
  "$(raw HMGET "$L2" '~r' '~ps' '~pe' | sed 's/.*/"&"/')"

###############################################################################
echo "== fc_line_v1"
LN='fc:{l:line-test}'
# node spent want burst rate per_us look_us ttl grace key_expire; a slow line
# (1 per 1000 s, burst 5) so the calls' own time adds nothing.
line() { rc FCALL fc_line_v1 1 "$LN" "$@" | ints; }
out=$(line a 0 3 5 1 1000000000 0 60000 0 0)
expect "a new line starts full: a gets the 3 it wants" '3 0 0 0' "${out% *}"
out=$(line b 0 3 5 1 1000000000 0 60000 0 0)
expect "b: max-min fair share of the 2 left" '1 0 0 0' "${out% *}"
out=$(line a 3 0 5 1 1000000000 0 60000 0 0)
expect "a reports 3 spent, wants none: its grant is its spend" '3 3 3 0' "${out% *}"
out=$(line b 0 5 5 1 1000000000 0 60000 0 0)
read -r g s spent retry _ <<<"$out"
expect "b's headroom goes back to the line before it is granted afresh: 2" '2 0 3' "$g $s $spent"
expect_true "the line is used up: retry when it rises by one (~1000 s; $retry ms)" "got: $out" \
  test "$retry" -ge 999000 -a "$retry" -le 1000000
expect "the line's origin and parameters are stored" $'"5"\n"1"\n"1000000000"' \
  "$(raw HMGET "$LN" '~b' '~r' '~p' | sed 's/.*/"&"/')"
expect "rate 0 rejected" '(error) ERR fc_line_v1: rate and per_us must be at least 1' \
  "$(rc FCALL fc_line_v1 1 "$LN" a 0 1 5 0 1 0 1 0 0)"

###############################################################################
echo "== fc_plan_v1"
PL='fc:{l:plan-test}'
v2 "$PL" a 7 0 60000 0 0 "$S" "$E" 1 100 0 0 0 >/dev/null
v2 "$PL" b 5 0 60000 0 0 "$S" "$E" 1 100 0 0 0 >/dev/null
plan() { rc FCALL fc_plan_v1 1 "$PL" "$@" | head -2 | ints; }
expect "the first plan of a slice: base = the fleet's spend" '1000 12' "$(plan 1000 0 0 0)"
expect "the same slice again: the stored plan" '1000 12' "$(plan 1000 0 0 0)"
expect "an older slice: the stored plan" '1000 12' "$(plan 500 0 0 0)"
expect "a new slice from a caller who knew the plan: the old line if lower" '2000 9' \
  "$(plan 2000 1000 9 0)"
expect "a new slice from a caller who did not: the fleet's spend" '3000 12' \
  "$(plan 3000 999 1 0)"

###############################################################################
echo "== dead holders are folded: a lease hash holds its live holders only"
# A holder reclaimed more than 10 minutes ago (FOLD_AFTER_MS) is folded: its
# spent moves into ~S and its fields go. Without it a period's hash grew by
# five fields per node incarnation that ever held it (rolling restarts).
LF='fc:{l:fold-test}'
NOWMS=$(now_ms)
OLD=$(( NOWMS - 700000 )) RECENT=$(( NOWMS - 1000 ))
raw HSET "$LF" s:old1 5 g:old1 8 w:old1 3 e:old1 "$OLD" x:old1 "$OLD" \
  s:old2 4 g:old2 4 w:old2 0 e:old2 "$OLD" x:old2 "$OLD" \
  s:recent 2 g:recent 6 w:recent 1 e:recent "$RECENT" x:recent "$RECENT" >/dev/null
out=$(v2 "$LF" a 0 1 60000 0 0 "$S" "$E" 1 100 0 0 0)
expect "the fleet's spent counts the folded holders: 11" '1 0 11 100' "${out% * *}"
expect "their fields are gone; a recently reclaimed holder stays" \
  $'"g:a"\n"g:recent"\n"s:a"\n"s:recent"\n"~S"' \
  "$(raw HKEYS "$LF" | grep -E '^(s|g|~S)' | sort | sed 's/.*/"&"/')"
expect "~S holds their spent" '"9"' "$(rc HGET "$LF" '~S')"
out=$(v2 "$LF" a 1 1 60000 0 0 "$S" "$E" 1 100 0 0 0)
expect "folded once: the next call counts 9 + 2 + 1" '2 1 12 100' "${out% * *}"
expect "fc_plan_v1's base counts ~S" '5000 12' \
  "$(rc FCALL fc_plan_v1 1 "$LF" 5000 0 0 0 | head -2 | ints)"
LNF='fc:{l:fold-line}'
# A line not new (~t0 now: burst 5, one more unit in 1000 s).
raw HSET "$LNF" s:old 4 g:old 4 w:old 0 e:old "$OLD" x:old "$OLD" '~t0' "$(now_us)" >/dev/null
out=$(rc FCALL fc_line_v1 1 "$LNF" a 0 3 5 1 1000000000 0 60000 0 0 | ints)
read -r g s spent _ <<<"$out"
expect "fc_line_v1: a folded holder's spent still counts (granted 4 of 5 before; 1 left)" \
  '1 0 4' "$g $s $spent"
expect "fc_line_v1: its fields are gone" '0' "$(raw HEXISTS "$LNF" s:old)"

###############################################################################
echo "== fc_peek_v1"
PK='fc:{u:peek-test}'
expect "an absent record at version 0: current" '(integer) 1' "$(rc FCALL fc_peek_v1 1 "$PK" 0)"
raw FCALL fc_cas_v1 1 "$PK" 0 blob1 0 >/dev/null
V=$(raw HGET "$PK" v)
expect "at its version: current, no record sent" '(integer) 1' "$(rc FCALL fc_peek_v1 1 "$PK" "$V")"
expect "behind: the version and the record" "$(printf '%s\nblob1' "$V")" \
  "$(raw FCALL fc_peek_v1 1 "$PK" 0)"
expect "a record gone, asked at a version: 0 and nil" $'1) (integer) 0\n2) (nil)' \
  "$(rc FCALL fc_peek_v1 1 'fc:{u:peek-none}' 5)"
expect "fc_peek_v1 names a bad version" \
  '(error) ERR fc_peek_v1: version must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_peek_v1 1 "$PK" x)"

###############################################################################
echo "== a holder that reports later: its reclaimed headroom counts as spent, up to its bound"
LU='fc:{l:later-test}'
NOWMS=$(now_ms)
GONE=$(( NOWMS - 5000 ))
# b (batched, no bound: u:b 1, as builds before the bound wrote), c (reports
# at commit) and d (batched with at most 3 unreported: u:d 4) each hold 10
# with 4 reported; all gone 5 s ago.
raw HSET "$LU" s:b 4 g:b 14 w:b 5 e:b "$GONE" x:b "$GONE" u:b 1 \
  s:c 4 g:c 14 w:c 5 e:c "$GONE" x:c "$GONE" \
  s:d 4 g:d 14 w:d 5 e:d "$GONE" x:d "$GONE" u:d 4 >/dev/null
out=$(rc FCALL fc_lease_v2 1 "$LU" a 0 100 60000 0 0 "$S" "$E" 1 100 0 0 0 6 '' '' | ints)
expect "spent counts b's headroom, none of c's, 3 of d's: 14 + 4 + 7" '25' "$(awk '{print $3}' <<<"$out")"
expect "b's spent raised to its grant, c's grant lowered to its spent, d's both to 7" \
  $'14\n14\n4\n4\n7\n7' "$(raw HMGET "$LU" s:b g:b s:c g:c s:d g:d)"
expect "a reports later with a bound of 5: u:a" '6' "$(raw HGET "$LU" u:a)"
expect "reports_later is a number" \
  '(error) ERR fc_lease_v2: reports_later must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_lease_v2 1 "$LU" a 0 1 60000 0 0 "$S" "$E" 1 100 0 0 0 x '' '')"

LUL='fc:{l:later-line}'
raw HSET "$LUL" s:b 0 g:b 1 w:b 1 e:b "$GONE" x:b "$GONE" u:b 1 \
  s:d 0 g:d 3 w:d 1 e:d "$GONE" x:d "$GONE" u:d 2 '~t0' "$(now_us)" >/dev/null
out=$(rc FCALL fc_line_v1 1 "$LUL" a 0 1 2 1 1000000000 0 60000 0 0 1 | ints)
expect "fc_line_v1: b's reclaimed unit and 1 of d's stay taken, d's other 2 go back (a gets 0: burst 2, 2 taken)" '0 0 2' \
  "$(awk '{print $1, $2, $3}' <<<"$out")"
expect "fc_line_v1: d's spent and grant" $'1\n1' "$(raw HMGET "$LUL" s:d g:d)"
expect "fc_line_v1: reports_later is a number" \
  '(error) ERR fc_line_v1: reports_later must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_line_v1 1 "$LUL" a 0 1 1 1 1000000000 0 60000 0 0 x)"
###############################################################################
echo "== others' holds committed: o: counts as spent, r: comes out of the holder's headroom"
LO='fc:{l:moved-test}'
NOWMS=$(now_ms)
# m holds 10 (nothing spent) until well after now; a commits 3 of m's holds
# (foreign 3) and asks for nothing.
raw HSET "$LO" s:m 0 g:m 10 w:m 10 e:m $(( NOWMS + 60000 )) x:m $(( NOWMS + 60000 )) >/dev/null
out=$(rc FCALL fc_lease_v2 1 "$LO" a 0 0 60000 0 0 "$S" "$E" 1 100 0 0 0 0 '' '' 3 0 | ints)
expect "a's foreign 3 counts in the fleet's spend" '3' "$(awk '{print $3}' <<<"$out")"
expect "o:a stored" '3' "$(raw HGET "$LO" o:a)"
# m learns of it and reports given 3, wanting its 10 again: its headroom is
# g - s - r, so it holds 7 more of the pool and is granted up to 10 headroom
# out of 100 - 3 spent - a's 0.
out=$(rc FCALL fc_lease_v2 1 "$LO" m 0 10 60000 60000 0 "$S" "$E" 1 100 0 0 0 0 '' '' 0 3 | ints)
expect "m's grant covers its given 3 and its headroom 10" '13 0 3' "$(awk '{print $1, $2, $3}' <<<"$out")"
expect "r:m stored" '3' "$(raw HGET "$LO" r:m)"
expect "foreign is a number" \
  '(error) ERR fc_lease_v2: foreign must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_lease_v2 1 "$LO" a 0 0 60000 0 0 "$S" "$E" 1 100 0 0 0 0 '' '' x 0)"
###############################################################################
echo "== hot keys: fc_hot_v1, fc_cas_v3"
KH='fc:{k:hot}'
out=$(rc FCALL fc_cas_v3 1 "$KH" 0 'counted' 0 | ints)
VH=$(awk '{print $2}' <<<"$out")
expect "fc_cas_v3 writes a record that is not frozen" "1 $VH" "$out"
expect "an extension of a record not frozen freezes nothing" "0 $VH" \
  "$(rc FCALL fc_hot_v1 1 "$KH" 0 0 | ints)"
out=$(rc FCALL fc_hot_v1 1 "$KH" 0 1)
SH=$(sed -n 1p <<<"$out" | ints)
expect "a freeze answers the record as frozen" '"counted"' "$(sed -n 3p <<<"$out" | sed -E 's/^ *3\) //')"
expect_true "and when (Redis's ms, $SH)" "SH=$SH" test "$SH" -gt 1700000000000
expect_true "the freeze moved the version" "VH=$VH" test "$(raw HGET "$KH" v)" -gt "$VH"
V2=$(raw HGET "$KH" v)
expect "fc_cas_v3 refuses a frozen record, even at its version, answering the freeze" \
  "-2 $SH" "$(rc FCALL fc_cas_v3 1 "$KH" "$V2" 'later' 0 | head -2 | ints)"
expect "nothing was written" '"counted"' "$(rc HGET "$KH" b)"
expect "a second freeze keeps the first's time" "$SH" "$(rc FCALL fc_hot_v1 1 "$KH" 0 1 | head -1 | ints)"
raw PEXPIRE "$KH" 1000 >/dev/null
UNTIL=$(( $(raw TIME | head -1) * 1000 + 60000 ))
expect "an extension never shortens and lives until asked" "$UNTIL" \
  "$(rc FCALL fc_hot_v1 1 "$KH" "$UNTIL" 0 | sed -n 2p | ints)"
expect_true "the key lives a minute now" "PTTL" test "$(raw PTTL "$KH")" -gt 50000
expect "fc_hot_v1 checks its arguments" '(error) ERR fc_hot_v1: freeze must be a non-negative integer <= 2^53-1' \
  "$(rc FCALL fc_hot_v1 1 "$KH" 0 x)"

###############################################################################
echo "== owner mode: fc_own_v1, fc_cas_v2, fc_member_v1"
KO='fc:{u:owned}'
out=$(rc FCALL fc_own_v1 1 "$KO" 5 60000 | ints)
VO=$(awk '{print $2}' <<<"$out")
expect "claim of an absent record: claimed, no blob" "1 $VO" "$(rc FCALL fc_own_v1 1 "$KO" 5 60000 | ints | awk '{print $1, $2}')"
expect "the claim stands for a while (absent_ttl_ms)" '1' "$(( $(raw PTTL "$KO") > 0 ))"
out=$(rc FCALL fc_cas_v2 1 "$KO" "$VO" 'mine' 0 5 | ints)
VW=$(awk '{print $2}' <<<"$out")
expect "the owner of epoch 5 writes" "1 $VW" "$out"
out=$(rc FCALL fc_own_v1 1 "$KO" 6 60000)
expect "a later owner (6) claims it and reads the blob" '"mine"' "$(sed -n 3p <<<"$out" | sed -E 's/^ *3\) //')"
VN=$(sed -n 2p <<<"$out" | ints)
expect_true "the claim moved the version ($VW < $VN)" "VW=$VW VN=$VN" test "$VN" -gt "$VW"
expect "the deposed owner (5) cannot write, even at the current version" '-1 6' \
  "$(rc FCALL fc_cas_v2 1 "$KO" "$VN" 'stale' 0 5 | ints)"
expect "nor claim it back" '-1 6' "$(rc FCALL fc_own_v1 1 "$KO" 5 60000 | ints)"
expect "nothing was written" '"mine"' "$(rc HGET "$KO" b)"
expect "the new owner writes" '1' "$(rc FCALL fc_cas_v2 1 "$KO" "$VN" 'new' 0 6 | ints | awk '{print $1}')"
expect "epoch 0 is refused" '(error) ERR fc_own_v1: epoch must be at least 1' \
  "$(rc FCALL fc_own_v1 1 "$KO" 0 60000)"
KM='fc:{members}'
out=$(rc FCALL fc_member_v1 1 "$KM" n1 127.0.0.1:1 0 2000)
E1=$(sed -n 2p <<<"$out" | ints)
expect "a join gets the first epoch" '1' "$E1"
expect "a renewal of that epoch holds" '1' "$(rc FCALL fc_member_v1 1 "$KM" n1 127.0.0.1:1 1 2000 | head -1 | ints)"
expect "a renewal of another epoch is gone: join again" '0' \
  "$(rc FCALL fc_member_v1 1 "$KM" n1 127.0.0.1:1 7 2000 | head -1 | ints)"
out=$(rc FCALL fc_member_v1 1 "$KM" n2 127.0.0.1:2 0 2000)
expect "a second member gets the next epoch" '2' "$(sed -n 2p <<<"$out" | ints)"
NOWM=$(now_ms)
ENTRY=$(raw HGET "$KM" n:n2)
FROM=$(awk '{print $2}' <<<"$ENTRY")
expect_true "a member owns nothing for a lease after it joined ($FROM >= $NOWM + 1900)" "from=$FROM now=$NOWM" \
  test "$FROM" -ge $(( NOWM + 1900 ))
expect "n1 leaves: its lease holds no longer" '1' \
  "$(rc FCALL fc_member_v1 1 "$KM" n1 127.0.0.1:1 1 0 | head -1 | ints)"
EXP1=$(raw HGET "$KM" n:n1 | awk '{print $3}')
expect_true "its lease ended at the call ($EXP1 <= $(now_ms))" "expiry=$EXP1" test "$EXP1" -le "$(now_ms)"
expect "a renewal after leaving is gone" '0' \
  "$(rc FCALL fc_member_v1 1 "$KM" n1 127.0.0.1:1 1 2000 | head -1 | ints)"
expect "a join needs a ttl" '(error) ERR fc_member_v1: ttl_ms must be at least 1 to join' \
  "$(rc FCALL fc_member_v1 1 "$KM" n4 127.0.0.1:4 0 0)"
expect "a name with a space is refused" \
  '(error) ERR fc_member_v1: node must be 1 to 128 bytes without spaces' \
  "$(rc FCALL fc_member_v1 1 "$KM" 'n 3' 127.0.0.1:3 0 2000)"

echo "== owner mode's loads: fc_heat_v1"
KH='fc:{members}:heat'
A=0000000000000000000000000000000a
B=0000000000000000000000000000000b
expect "no decisions, no table" '' \
  "$(raw FCALL fc_heat_v1 1 "$KH" n1 0 2 10000 6000 | sed -n '2,3p' | tr -d '\n')"
NOWM=$(now_ms)
out=$(raw FCALL fc_heat_v1 1 "$KH" n1 100 2 10000 6000 "$A" 60 "$B" 10)
T1=$(sed -n 3p <<<"$out")
expect "the first table: the heaviest, and the rest" "$A 60 $B 10" "$(cut -d' ' -f3- <<<"$T1")"
expect "the rest is what no key listed" '30' "$(cut -d' ' -f2 <<<"$T1")"
FROM=$(cut -d' ' -f1 <<<"$T1")
expect_true "it applies 6 s ahead ($FROM ~ $NOWM + 6000)" "from=$FROM now=$NOWM" \
  within_10s "$FROM" $(( NOWM + 6000 )) 100
out=$(raw FCALL fc_heat_v1 1 "$KH" n2 50 2 10000 6000 "$B" 45)
expect "a table is made at most every every_ms" "$T1" "$(sed -n 3p <<<"$out")"
expect "n2's report is kept" "50 $B 45" "$(raw HGET "$KH" h:n2 | cut -d' ' -f2-)"
expect "a key is 32 hex digits" '(error) ERR fc_heat_v1: a key must be 32 lowercase hex digits' \
  "$(rc FCALL fc_heat_v1 1 "$KH" n1 1 2 10000 6000 ABC 1)"
expect "at most top keys" '(error) ERR fc_heat_v1: at most `top` keys' \
  "$(rc FCALL fc_heat_v1 1 "$KH" n1 3 1 10000 6000 "$A" 1 "$B" 1)"
# every_ms 0: a table is due at every call; both fresh reports merge.
out=$(raw FCALL fc_heat_v1 1 "$KH" n1 20 2 0 6000 "$A" 20)
expect "the table it replaced is prev" "$T1" "$(sed -n 2p <<<"$out")"
expect "with every_ms 0, only reports of this very ms are fresh" "0 $A 20" "$(sed -n 3p <<<"$out" | cut -d' ' -f2-)"
rc HDEL "$KH" w:next >/dev/null
# (that call removed n2's report, older than 2 x 0 ms; n2 reports again)
out=$(raw FCALL fc_heat_v1 1 "$KH" n2 50 2 10000 6000 "$B" 45)
expect "every fresh report merges, heaviest first" "5 $B 45 $A 20" "$(sed -n 3p <<<"$out" | cut -d' ' -f2-)"

echo "all $PASS checks passed"
