#!/usr/bin/env bash
# Pacing modes compared (docs/pacing.md, "Comparing even, adaptive and
# throttle"; issue 30 item 6).
#
#   benches/pacing.sh [OUT_DIR]    # default: ${TMPDIR:-/tmp}/freqcap-pacing/<UTC time>
#
# One campaign with a budget of 48 000 a day (12 % of the forecast's
# 400 000 requests a day, the default diurnal curve), run by
# `freqcap simulate` for DAYS days (default 7) under each pacing mode, on
# traffic that misses the forecast by -50, -20, 0, +20 and +50 %: the same
# seed, so each mode sees the same requests. Per mode and error: the share
# of days within ±5 % of the budget, the mean and worst over-delivery, the
# mean pacing RMSE against the even line (% of the budget), and the median
# time the budget was 99 % spent. Every run's report and pictures stay in
# OUT_DIR/<mode>/<error>/ (summary.json, delivery.svg, spend-<mode>.svg).
set -euo pipefail
cd "$(dirname "$0")/.."

DAYS=${DAYS:-7}
FORECAST=${FORECAST:-400000}
AMOUNT=${AMOUNT:-48000}
SEED=${SEED:-7}
OUT=${1:-${TMPDIR:-/tmp}/freqcap-pacing/$(date -u +%Y%m%dT%H%M%SZ)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/freqcap-target}

cargo build --release --quiet
BIN="$CARGO_TARGET_DIR/release/freqcap"
mkdir -p "$OUT"

for mode in even adaptive throttle; do
  cat > "$OUT/$mode.json" <<JSON
{"campaigns": [{"id": "$mode", "campaign": {"unknown_user": "allow",
  "budget": {"amount": $AMOUNT, "pacing": "$mode"}}}]}
JSON
  for err in -50 -20 0 20 50; do
    requests=$(( FORECAST * (100 + err) / 100 ))
    "$BIN" simulate --campaigns "$OUT/$mode.json" --synthetic --days "$DAYS" \
      --requests "$requests" --users 200000 --candidates 1 --seed "$SEED" \
      --out "$OUT/$mode/$err" > /dev/null
  done
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
print("| pacing | traffic vs forecast | days within ±5 % | over-delivery (mean / worst) | pacing RMSE | 99 % spent at (median) |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for mode in ["even", "adaptive", "throttle"]:
    for err in ["-50", "-20", "0", "20", "50"]:
        s = json.load(open(f"{out}/{mode}/{err}/summary.json"))
        c = s["campaigns"][0]
        days = [p for p in c["periods"] if p["complete"]]
        within = sum(1 for p in days if abs(p["delivered_pct"] - 100) <= 5)
        over = [p["over_delivery_pct"] for p in days]
        rmse = statistics.mean(p["pacing_rmse_pct"] for p in days)
        at99 = sorted(p["reached_99pct_at"][11:16] for p in days if p["reached_99pct_at"])
        median = at99[len(at99) // 2] if at99 else "never"
        sign = "+" if not err.startswith("-") and err != "0" else ""
        print(f"| {mode} | {sign}{err} % | {within}/{len(days)} | "
              f"{statistics.mean(over):.2f} % / {max(over):.2f} % | {rmse:.2f} % | {median} |")
PY
echo "reports: $OUT" >&2
