#!/usr/bin/env python3
"""The workload of benches/regions.sh, part 2 (docs/regions.md, "Measured").

    regions_drive.py OUT BUDGET CUT_S GLOBAL_PORT PROXY3_PID PORT1 PORT2 PORT3

Three regions, each a freqcap node on PORTi, share campaign `shared`'s
budget of BUDGET units through the global tier (a Redis on GLOBAL_PORT).

- Budget demand is diurnal: each region's rate follows a day compressed
  into the run, its peak a third of the day after the previous region's
  (time zones), between 4 and 36 impressions a second.
- Travelling users: two new users a second, each homed in a region (its
  first impression there), then screened about once a second for 15 s on
  campaign `freq` (a user cap of 3 a day): a third stay home, the rest are
  screened in a region drawn at random each time.
- From the 5th second, region 3's WAN is cut (its proxy SIGSTOPped) for
  CUT_S seconds; the run ends once the budget is spent after the cut, or
  60 s after it.

Every second the tier's lease of `shared` is read (each region's
cumulative grant `g:` and reported spend `s:`). Writes OUT/budget.json,
OUT/users.json, OUT/lease.csv (second, then grant and spend of each
region) and OUT/lease.svg (plotted).
"""

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

out, budget, cut_s, gport, proxy3 = (
    sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
ports = sys.argv[6:9]
CAP = 3
DAY_S = max(cut_s + 60, 120)  # the compressed day: one over the run
start = time.time()
done = threading.Event()
lock = threading.Lock()
acked = [0, 0, 0]
per_s = {}
users = {}  # name -> {"home": r, "stays": bool, "got": n}
rng = random.Random(7)


def call(port, method, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except OSError:
        return 0, None


def impression(r, camp, user):
    st, res = call(ports[r], "POST", "/v1/screen", {
        "user": user, "candidates": [{"campaign": camp, "cost": 1}], "reserve": True, "ttl_ms": 2000})
    rid = (res or {}).get("reservation") if st == 200 else None
    if not rid:
        return False
    st, _ = call(ports[r], "POST", f"/v1/reservations/{rid}/commit", {})
    return st == 200


def rate(r, t):
    """Region r's budget demand at second t, impressions a second."""
    phase = 2 * math.pi * (t / DAY_S - r / 3)
    return 4 + 32 * (1 + math.sin(phase)) / 2


def region(r):
    i = 0
    t = 0.0
    while not done.is_set():
        t += 1 / rate(r, t)
        due = start + t
        if due > time.time():
            time.sleep(due - time.time())
        i += 1
        if impression(r, "shared", f"b{r}-{i}"):
            with lock:
                acked[r] += 1
                per_s.setdefault(int(time.time() - start), [0, 0, 0])[r] += 1


def traveller(name, home, stays):
    got = 1 if impression(home, "freq", name) else 0
    for _ in range(15):
        if done.is_set():
            break
        time.sleep(0.7 + 0.6 * rng.random())
        r = home if stays else rng.randrange(3)
        if impression(r, "freq", name):
            got += 1
    with lock:
        users[name] = {"home": home, "stays": stays, "got": got}


def travellers():
    n = 0
    threads = []
    while not done.is_set():
        for _ in range(2):
            n += 1
            t = threading.Thread(target=traveller, args=(f"t{n}", n % 3, (n // 3) % 3 == 0))
            t.start()
            threads.append(t)
        time.sleep(1)
    for t in threads:
        t.join()


lease_rows = []


def lease_key():
    """The tier's lease of `shared`: its key holds the campaign's name in
    hex (src/cluster/conn.rs, `redis_key`)."""
    keys = subprocess.run(["redis-cli", "-p", gport, "--scan"], capture_output=True, text=True).stdout
    name = b"shared\0".hex()
    for k in keys.split("\n"):
        if k and not k.startswith("fc:{rt") and name in k:
            return k
    return None


def watch_lease():
    key = None
    while not done.is_set():
        time.sleep(1)
        key = key or lease_key()
        row = [int(time.time() - start)] + [0] * 6
        if key:
            flat = subprocess.run(["redis-cli", "-p", gport, "HGETALL", key],
                                  capture_output=True, text=True).stdout.split("\n")
            for f, v in zip(flat[0::2], flat[1::2]):
                for r in range(3):
                    if f == f"g:r{r + 1}":
                        row[1 + 2 * r] = int(v or 0)
                    if f == f"s:r{r + 1}":
                        row[2 + 2 * r] = int(v or 0)
        lease_rows.append(row)


threads = [threading.Thread(target=region, args=(r,)) for r in range(3)]
threads += [threading.Thread(target=travellers), threading.Thread(target=watch_lease)]
for t in threads:
    t.start()
time.sleep(5)
os.kill(proxy3, signal.SIGSTOP)
cut_at = time.time() - start
time.sleep(cut_s)
os.kill(proxy3, signal.SIGCONT)
healed = time.time()
while time.time() - healed < 60 and sum(acked) < budget:
    time.sleep(0.5)
time.sleep(3)  # the last reports reach the tier
done.set()
for t in threads:
    t.join()
elapsed = time.time() - start

json.dump({"acked": acked, "cut_at_s": cut_at, "cut_s": cut_s, "elapsed_s": elapsed},
          open(f"{out}/budget.json", "w"))
over = [u["got"] - CAP for u in users.values()]
json.dump({
    "cap": CAP,
    "users": len(users),
    "travellers": sum(1 for u in users.values() if not u["stays"]),
    "over_max": max(over, default=0),
    "over_max_stay_home": max((u["got"] - CAP for u in users.values() if u["stays"]), default=0),
    "users_over": sum(1 for o in over if o > 0),
    "delivered": sum(u["got"] for u in users.values()),
}, open(f"{out}/users.json", "w"))
with open(f"{out}/lease.csv", "w") as f:
    f.write("second,grant1,spend1,grant2,spend2,grant3,spend3\n")
    for row in lease_rows:
        f.write(",".join(map(str, row)) + "\n")

# The plot: each region's grant (dashed) and spend (solid) at the tier.
W, H, P = 760, 380, 50
secs = max((row[0] for row in lease_rows), default=1) or 1
top = max([max(row[1:]) for row in lease_rows] + [budget, 1])
x = lambda s: P + (W - 2 * P) * s / secs
y = lambda v: H - P - (H - 2 * P) * v / top
colors = ["#1f77b4", "#ff7f0e", "#2ca02c"]
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect x="{x(cut_at):.1f}" y="{P}" width="{x(cut_at + cut_s) - x(cut_at):.1f}" height="{H - 2 * P}" fill="#eee"/>',
       f'<text x="{x(cut_at) + 4:.1f}" y="{P + 14}">region 3 cut off ({cut_s:.0f} s)</text>',
       f'<line x1="{P}" y1="{y(budget):.1f}" x2="{W - P}" y2="{y(budget):.1f}" stroke="#999" stroke-dasharray="2,2"/>',
       f'<text x="{P + 4}" y="{y(budget) - 4:.1f}">budget {budget}</text>',
       f'<line x1="{P}" y1="{H - P}" x2="{W - P}" y2="{H - P}" stroke="black"/>',
       f'<line x1="{P}" y1="{P}" x2="{P}" y2="{H - P}" stroke="black"/>',
       f'<text x="{W / 2:.0f}" y="{H - 12}">seconds</text>',
       '<text x="4" y="16">units at the global tier: each region\'s grant (dashed) and spend (solid)</text>']
for r in range(3):
    for col, dash in ((1 + 2 * r, ' stroke-dasharray="6,3"'), (2 + 2 * r, "")):
        pts = " ".join(f"{x(row[0]):.1f},{y(row[col]):.1f}" for row in lease_rows)
        svg.append(f'<polyline fill="none" stroke="{colors[r]}" stroke-width="2"{dash} points="{pts}"/>')
    svg.append(f'<text x="{W - P - 110}" y="{P + 16 * (r + 2)}" fill="{colors[r]}">region {r + 1}: {acked[r]}</text>')
svg.append("</svg>")
open(f"{out}/lease.svg", "w").write("\n".join(svg))
