#!/usr/bin/env python3
"""Record the REAL redis-cell module's CL.THROTTLE answers on a frozen clock.

    ops/redis-cell-table.py [PORT]        # default port: $REDIS_CELL_TABLE_PORT or 7333

writes tests/data/redis_cell_table.json (or $REDIS_CELL_TABLE_OUT): every
scenario below, each run after FLUSHALL, one JSON line per step:

    {"at_ms": 1250, "args": ["CL.THROTTLE", "k", "5", "10", "60"], "reply": [0, 6, 5, -1, 6]}
    {"at_ms": 0, "args": ["CL.THROTTLE", "k", "x", "10", "60"], "error": "Cell error: Store error: ..."}

`at_ms` is milliseconds after START (2026-01-01T00:00:00Z, unix 1767225600),
non-decreasing within a scenario; `args` are the command and its arguments;
an argument {"repeat": S, "times": N} stands for S repeated N times. So a test
can replay each scenario against freqcap at the same relative instants.

Environment:
    REDIS_CELL_SO         the module (default ~/.cache/peers/redis-cell/target/release/libredis_cell.so;
                          benches/peers/redis-cell.sh builds one and prints its path)
    REDIS_CELL_TABLE_PORT loopback port for the private redis-server (default 7333; argv[1] wins)
    REDIS_CELL_TABLE_OUT  output file (default tests/data/redis_cell_table.json in this repository)
    REDIS_SERVER          redis-server binary (default: redis-server on PATH; recorded with 7.0.15)
    LIBFAKETIME           default /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 (0.9.10)
    MALLOC_SHIM           default /usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0 ("" for none)

Needs python3 (stdlib only: a small RESP2 client below keeps error texts
byte-exact), redis-server, libfaketime (Debian: apt-get install faketime),
the module. Running it twice gives byte-identical output.

How the clock is frozen. redis-server runs with LD_PRELOAD=libfaketime and
FAKETIME_TIMESTAMP_FILE + FAKETIME_NO_CACHE=1: the file holds an absolute
date ("2026-01-01 00:00:01.250..."), which freezes CLOCK_REALTIME (what
redis-cell reads through time::OffsetDateTime::now_utc(), and what Redis uses
for TIME and key expiry) at that instant; the script rewrites the file
(atomically, by rename) to move to each step's instant. CLOCK_MONOTONIC stays
real (FAKETIME_DONT_FAKE_MONOTONIC=1) so Redis's event loop and serverCron run
normally; key expiry still follows the frozen wall clock. Two traps:
  * libfaketime 0.9.10 reads the fraction as a double, from the last digit of
    the seconds on: ":07.999" gives (atof("7.999") - 7) * 1e9, truncated to
    998999999 ns. So each instant is written with half a nanosecond more
    (":07.9990000005"): the truncation then lands exactly on 999000000 ns.
  * Debian's redis-server uses jemalloc, which reads the clock while it
    initialises; libfaketime then initialises, and a failing dlsym() inside it
    mallocs again: a deadlock at start-up (libfaketime issue #130; the fix,
    FAKETIME_IGNORE_SYMBOLS, is not in 0.9.10). Preloading glibc's
    libc_malloc_debug.so first makes malloc/free glibc's (no clock reads), so
    start-up passes; only Redis's allocator statistics are affected.
Proof: before recording, at 10 000 instants covering every string atof() can
see (seconds ending in 0..9, times every fraction .000 .. .999) plus some far
instants, and again at every instant a step uses, the script checks that
Redis's TIME answers exactly that instant (microseconds) and that redis-cell's
own clock is exact to the nanosecond: a probe call `CL.THROTTLE <probe> 0 1 1 1`
in database 1 stores TAT = now + 1 s, read back with GET. Any mismatch aborts.

Whole-nanosecond rates: freqcap's rates are exact rationals, while redis-cell
truncates its emission interval to whole nanoseconds (T = (period*1e9 as f64 /
count as f64) as i64). Every command in this table whose reply is not an error
therefore has period*1e9 divisible by count (and redis-cell's f64 division gives
that exact T): asserted for each step, so the table never records a truncation
artefact that freqcap is not meant to reproduce. Error steps are exempt (e.g.
count 2000000000 per 1 s, where T truncates to 0 and redis-cell refuses a zero
rate). A non-UTF-8 argument crashes redis-cell (an unwrap), so none is sent.

redis-server: 127.0.0.1 only, no persistence (--save '' --appendonly no), its
files in a temporary directory; it is stopped by its PID on exit.
"""

import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

START_S = 1767225600  # 2026-01-01T00:00:00Z
START_NS = START_S * 10**9
REDIS_CELL = "redis-cell 0.5.0 (commit 4d42338)"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROBE_KEY = "__redis_cell_table_clock_probe__"
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def die(msg):
    sys.exit(f"redis-cell-table: {msg}")


# --- a minimal RESP2 client ----------------------------------------------------


class RespError(Exception):
    pass


class Conn:
    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.rf = self.sock.makefile("rb")

    def close(self):
        try:
            self.rf.close()
            self.sock.close()
        except OSError:
            pass

    def call(self, *args):
        """Sends one command; returns its reply, or a RespError instance."""
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode("utf-8")
            out += [b"$%d\r\n" % len(b), b, b"\r\n"]
        self.sock.sendall(b"".join(out))
        return self._read()

    def ok(self, *args):
        r = self.call(*args)
        if isinstance(r, RespError):
            die(f"{args[0]!r} failed: {r}")
        return r

    def _read(self):
        line = self.rf.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed mid-reply (did redis-server crash?)")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode("utf-8"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.rf.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("connection closed mid-reply")
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ConnectionError(f"unexpected reply line {line!r}")


# --- scenario description ------------------------------------------------------


class Repeat:
    """An argument: `s` repeated `times` times (written as {"repeat", "times"})."""

    def __init__(self, s, times):
        self.s, self.times = s, times

    def to_bytes(self):
        return self.s.encode("utf-8") * self.times

    def to_json(self):
        return {"repeat": self.s, "times": self.times}


def arg_bytes(a):
    return a.to_bytes() if isinstance(a, Repeat) else str(a).encode("utf-8")


def arg_json(a):
    return a.to_json() if isinstance(a, Repeat) else str(a)


def arg_text(a):
    if isinstance(a, Repeat):
        return f"<{a.s!r} x {a.times}>"
    s = str(a)
    return json.dumps(s, ensure_ascii=False) if (s == "" or re.search(r"\s", s)) else s


def step(at_ms, *args, cmd="CL.THROTTLE", inspect=False):
    """One CL.THROTTLE call at START + at_ms. `inspect`: after it, GET/PTTL its
    key (outside the table) and append what was found to the scenario's note."""
    return {"at_ms": at_ms, "args": [cmd, *args], "inspect": inspect}


def scenario(name, note, steps):
    return {"name": name, "note": note, "steps": steps}


def rust_i64(s):
    """str::parse::<i64>() as redis-cell calls it: [+-]?[0-9]+ within i64."""
    if isinstance(s, Repeat) or not re.fullmatch(r"[+-]?[0-9]+", str(s)):
        return None
    v = int(str(s))
    return v if I64_MIN <= v <= I64_MAX else None


def assert_whole_ns(args, reply):
    """A non-error reply must come from a whole-nanosecond emission interval."""
    count, period = rust_i64(args[3]), rust_i64(args[4])
    assert count is not None and period is not None, (args, reply)
    ns = period * 10**9
    assert count != 0 and ns % count == 0, (
        f"{args}: period*1e9 = {ns} is not divisible by count {count}: redis-cell "
        "would truncate T, freqcap would not; keep such rates out of the table")
    # redis-cell: ((ns as f64) / (n as f64)) as i64 -- must be the exact quotient.
    assert int(float(ns) / float(count)) == ns // count, (args, "f64 division inexact")


def scenarios():
    S = []

    # a. redis-cell's own unit-test table (src/cell/mod.rs, it_rate_limits):
    # limit 5 (max_burst 4), 1 per second.
    a = [(0, 6)] + [(0, 1)] * 6 + [(3000, 1), (3100, 1), (4000, 1), (8000, 1),
                                   (9500, 1), (9500, 0), (9500, 2), (9500, 5)]
    S.append(scenario(
        "it_rate_limits",
        "redis-cell's own test table (src/cell/mod.rs it_rate_limits): key foo, "
        "max_burst 4 (limit 5), 1 per 1 s (T = 1 s, tolerance 5 s). Quantity 6 is "
        "over the limit: denied with retry_after -1. Times are reported in whole "
        "seconds, rounded up when the millisecond part is non-zero (3.9 s -> 4).",
        [step(t, "foo", 4, 1, 1, q) for t, q in a]))

    # b. the README's examples, and the command name in lower/mixed case.
    S.append(scenario(
        "readme_e2e",
        "README: user123 15 30 60 (limit 16, T = 2 s), with and without the "
        "quantity; e2e 0 1 2 1 (limit 1, T = 2 s): allowed, denied with "
        "retry_after 2, allowed again 2 s later. Command names are "
        "case-insensitive (cl.throttle, Cl.Throttle).",
        [step(0, "user123", 15, 30, 60),
         step(0, "user123", 15, 30, 60, 1),
         step(0, "user123", 15, 30, 60, 1, cmd="cl.throttle"),
         step(0, "e2e", 0, 1, 2, 1),
         step(0, "e2e", 0, 1, 2, 1),
         step(2000, "e2e", 0, 1, 2, 1),
         step(2000, "e2e", 0, 1, 2, 1, cmd="cl.throttle"),
         step(4000, "e2e", 0, 1, 2, 1, cmd="Cl.Throttle")]))

    # c. parameter changes on one key.
    state = ("redis-cell keeps ONE value per key, the theoretical arrival time TAT "
             "(unix ns, TTL = TAT - now truncated to ms), whatever the parameters; "
             "each call applies its own T = period/count and tolerance "
             "DVT = T*(max_burst+1) to it: new_tat = max(TAT, now) + quantity*T; "
             "allowed iff new_tat - DVT <= now (then TAT := new_tat). With "
             "ttl = new_tat - now if allowed, else stored TAT - now (0 for a missing "
             "key): remaining = trunc((DVT - ttl) / T) if DVT - ttl > -T, else 0; "
             "reset_after = ttl; retry_after = new_tat - DVT - now if denied "
             "(-1 if allowed or if quantity*T > DVT); durations in whole seconds, "
             "truncated, plus 1 when the millisecond part is non-zero.")
    S.append(scenario(
        "plan_upgrade",
        "One request under 5 10 60 (limit 6, T = 6 s), then the plan becomes "
        "10 10 60 (limit 11): the 6 s already used carry over. " + state,
        [step(0, "k", 5, 10, 60), step(0, "k", 10, 10, 60)]))
    S.append(scenario(
        "burst_upgrade",
        "k under 5 10 60 (limit 6, DVT 36 s) until denied, then 10 10 60 "
        "(limit 11, DVT 66 s) on the same TAT: allowed at once, remaining counted "
        "against the new tolerance. A peek (quantity 0) under the OLD, smaller "
        "burst can answer limited=1 with a retry_after, without changing anything. "
        + state,
        [step(0, "k", 5, 10, 60),
         step(250, "k", 5, 10, 60),
         step(1250, "k", 5, 10, 60),
         step(1250, "k", 5, 10, 60, 3),
         step(1250, "k", 5, 10, 60),
         step(1250, "k", 10, 10, 60),
         step(7999, "k", 10, 10, 60, 0),
         step(7999, "k", 10, 10, 60, 5),
         step(7999, "k", 5, 10, 60, 0),
         step(7999, "k", 10, 10, 60),
         step(12000, "k", 10, 10, 60),
         step(30500, "k", 5, 10, 60),
         step(42000, "k", 5, 10, 60),
         step(60000, "k", 5, 10, 60)]))
    S.append(scenario(
        "burst_downgrade",
        "k under 10 10 60 (limit 11, T = 6 s) eight times (TAT = +48 s), then "
        "2 10 60 (limit 3, DVT 18 s): denied, retry_after = 48 + 6 - 18 - now; "
        "remaining 0. Calls under the old, larger burst still pass meanwhile "
        "(and push TAT further). Under 2 10 60 again: denied until 42 s, where "
        "new_tat - DVT == now exactly (allowed), then the first parameters again. "
        + state,
        [step(0, "k", 10, 10, 60)] * 5
        + [step(250, "k", 10, 10, 60)] * 3
        + [step(250, "k", 2, 10, 60),
           step(1250, "k", 2, 10, 60, 0),
           step(7999, "k", 10, 10, 60),
           step(30000, "k", 2, 10, 60),
           step(36250, "k", 2, 10, 60),
           step(42000, "k", 2, 10, 60),
           step(42000, "k", 2, 10, 60),
           step(48000, "k", 2, 10, 60, 0),
           step(60000, "k", 2, 10, 60),
           step(61250, "k", 10, 10, 60),
           step(61250, "k", 10, 10, 60, 0)]))
    S.append(scenario(
        "rate_change",
        "max_burst 4 (limit 5), period 60: count 10 (T = 6 s) three times "
        "(TAT = +18 s), then count 20 (T = 3 s, DVT 15 s): the 18 s of backlog now "
        "stand for 6 units, more than the limit: denied until 6 s. Then count 5 "
        "(T = 12 s, DVT 60 s): the backlog is worth fewer units. Then count 10 "
        "again, with quantity 2, and once the key has drained. " + state,
        [step(0, "k", 4, 10, 60)] * 3
        + [step(0, "k", 4, 20, 60),
           step(250, "k", 4, 20, 60),
           step(3000, "k", 4, 20, 60),
           step(6000, "k", 4, 20, 60),
           step(7999, "k", 4, 5, 60),
           step(7999, "k", 4, 5, 60, 0),
           step(7999, "k", 4, 20, 60, 0),
           step(12000, "k", 4, 10, 60, 2),
           step(15000, "k", 4, 10, 60, 2),
           step(15000, "k", 4, 10, 60, 0),
           step(60000, "k", 4, 10, 60)]))
    S.append(scenario(
        "period_change",
        "max_burst 4 (limit 5), count 10: period 60 (T = 6 s) twice, then "
        "period 30 (T = 3 s, DVT 15 s), then period 120 (T = 12 s, DVT 60 s); "
        "peeks under each; quantity 6 over the limit (6*12 s > 60 s): retry_after "
        "-1; back to period 60 after the key drained. " + state,
        [step(0, "k", 4, 10, 60),
         step(0, "k", 4, 10, 60),
         step(250, "k", 4, 10, 30),
         step(250, "k", 4, 10, 30),
         step(1250, "k", 4, 10, 120),
         step(7999, "k", 4, 10, 120, 0),
         step(7999, "k", 4, 10, 30, 0),
         step(7999, "k", 4, 10, 60, 3),
         step(15000, "k", 4, 10, 60, 3),
         step(15000, "k", 4, 10, 120, 6),
         step(15000, "k", 4, 10, 120, 5),
         step(16000, "k", 4, 10, 120, 0),
         step(90000, "k", 4, 10, 120, 0),
         step(90000, "k", 4, 10, 60)]))
    S.append(scenario(
        "quantity_and_params",
        "Quantities with parameter changes: 4 units under 9 10 60 (limit 10, "
        "T = 6 s); a peek under 4 10 60 (limit 5) after the change; quantity 6 over "
        "the new limit (retry_after -1) but fine under the old one; 19 20 60 "
        "(T = 3 s: the same DVT 60 s, half the cost per unit) with quantity 10; "
        "quantity 11 over limit 10; back to the first parameters once drained. "
        + state,
        [step(0, "k", 9, 10, 60, 4),
         step(250, "k", 9, 10, 60, 0),
         step(250, "k", 4, 10, 60, 0),
         step(250, "k", 4, 10, 60, 2),
         step(1250, "k", 4, 10, 60, 1),
         step(1250, "k", 4, 10, 60, 6),
         step(1250, "k", 9, 10, 60, 6),
         step(7999, "k", 9, 10, 60, 6),
         step(7999, "k", 19, 20, 60, 10),
         step(7999, "k", 19, 20, 60, 0),
         step(36000, "k", 19, 20, 60, 10),
         step(36000, "k", 9, 10, 60, 11),
         step(96000, "k", 9, 10, 60, 10),
         step(96000, "k", 9, 10, 60, 0),
         step(156000, "k", 9, 10, 60)]))

    # d. negative arguments: redis-cell does not check signs.
    S.append(scenario(
        "negative_arguments",
        "Negative arguments, each on a fresh key (redis-cell checks no signs). "
        "A negative max_burst gives limit max_burst+1 <= 0 and a negative "
        "tolerance: denied, nothing stored. A negative count or period gives a "
        "negative T (both negative: a positive T, a normal answer). When the "
        "call is ALLOWED and the new TAT lies before now, redis-cell writes the key "
        "and then fails to set a negative expiry: the reply is 'Error while "
        "setting key expire' but the key stays written, with no TTL. Except when "
        "the new TAT is exactly 1 ms before now (quantity -1 at T = 1 ms): "
        "the expiry -1 ms is Redis's REDISMODULE_NO_EXPIRE, so the call is "
        "ALLOWED, remaining above the limit, and the key never expires. Last, "
        "a normal call on another fresh key.",
        [step(0, "nb_m1", -1, 1, 1, 1, inspect=True),
         step(0, "nb_m5_q1", -5, 1, 1, 1, inspect=True),
         step(0, "nb_m5_q0", -5, 1, 1, 0, inspect=True),
         step(0, "count_m1_b5", 5, -1, 1, 1, inspect=True),
         step(0, "count_m1_b0", 0, -1, 1, 1, inspect=True),
         step(0, "period_m1_b5", 5, 1, -1, 1, inspect=True),
         step(0, "period_m1_b0", 0, 1, -1, 1, inspect=True),
         step(0, "count_period_m1", 5, -1, -1, 1, inspect=True),
         step(0, "qty_m1_b5", 5, 1, 1, -1, inspect=True),
         step(0, "qty_m1_b0", 0, 1, 1, -1, inspect=True),
         step(0, "qty_m3_b0", 0, 1, 1, -3, inspect=True),
         step(0, "qty_m1_t1ms", 999, 1000, 1, -1, inspect=True),
         step(0, "qty_m2_t1ms", 999, 1000, 1, -2, inspect=True),
         step(0, "normal", 5, 1, 1, 1, inspect=True)]))
    S.append(scenario(
        "negative_quantity_refund",
        "A negative quantity on a used key moves its TAT back (a refund) and "
        "passes while the new TAT is not before now; with TAT == now the expiry "
        "is 0 ms and remaining can reach the limit itself (6 of 6). Once the new "
        "TAT falls before now: the expiry error, the key left written without TTL. "
        "A denial measures from that past TAT as stored (reset_after negative, "
        "remaining above the limit); the next allowed call treats it as now. "
        "Limit 6, 1 per 1 s.",
        [step(0, "r", 5, 1, 1, 1),
         step(0, "r", 5, 1, 1, 1),
         step(0, "r", 5, 1, 1, 1),
         step(250, "r", 5, 1, 1, -1, inspect=True),
         step(250, "r", 5, 1, 1, -5, inspect=True),
         step(250, "r", 5, 1, 1, 7, inspect=True),
         step(1250, "r", 5, 1, 1, 1, inspect=True),
         step(1250, "r", 5, 1, 1, -1, inspect=True),
         step(1250, "r", 5, 1, 1, 1),
         step(1250, "r", 5, 1, 1, -2, inspect=True),
         step(1250, "r", 5, 1, 1, 0, inspect=True),
         step(7999, "r", 5, 1, 1, 1, inspect=True)]))

    # e. errors, in redis-cell's words.
    e = [step(0),
         step(0, "e"),
         step(0, "e", 5, 10),
         step(0, "e", 5, 10, 60, 1, 1),
         step(0, "e", 5, 10, 60, 1, 1, 1)]
    bad = ["x", "1.5", "", "9223372036854775808", "+5", " 5"]
    base = [5, 10, 60, 1]
    for pos, pname in enumerate(["max_burst", "count", "period", "quantity"]):
        for i, v in enumerate(bad):
            args = list(base)
            args[pos] = v
            e.append(step(0, f"e_{pname}_{i}", *args))
    e += [step(0, "e_count0", 5, 0, 60),
          step(0, "e_period0", 5, 10, 0),
          step(0, "e_both0", 5, 0, 0),
          step(0, "e_count0_peek", 5, 0, 60, 0),
          step(0, "e_too_fast", 5, 2000000000, 1),
          step(0, "e_two_bad", "x", "y", 60),
          step(0, "e_two_bad", 5, "1.5", "x"),
          step(0, "e_bad_and_zero", 5, 0, "x"),
          step(0, "e_bad_and_zero", 5, "x", 0),
          step(0, "e_zero_and_bad_qty", 5, 0, 60, "x"),
          step(0, "e_arity_and_bad", "x", "y"),
          step(0, "e_arity_and_bad", "x", "y", "z", "1", "2")]
    S.append(scenario(
        "errors",
        "Argument errors. Order of checks: the argument count (5 or 6 including "
        "the command name) first, then max_burst, count, period, quantity parsed in "
        "that order (the first bad one is named), then a zero rate (count 0, "
        "period 0, or T = period*1e9/count truncated to 0 ns). Parsing is Rust's "
        "str::parse::<i64>: '+5' is accepted (those steps are ordinary calls), "
        "' 5', '1.5', '' and 2^63 are not. The usage line says 'cl.throttle' in "
        "lower case whatever the caller typed.",
        e))

    # f. keys.
    ka = "x" * 999 + "a"
    kb = "x" * 999 + "b"
    S.append(scenario(
        "keys",
        "Keys are opaque bytes: the empty key, 1000-byte and 100000-byte keys, "
        "two 1000-byte keys differing only in the last byte (independent), a "
        "UTF-8 key, keys with spaces and CRLF. Limit 3 (max_burst 2), 10 per 60 s.",
        [step(0, "", 2, 10, 60),
         step(0, "", 2, 10, 60),
         step(0, Repeat("k", 1000), 2, 10, 60),
         step(0, Repeat("k", 1000), 2, 10, 60),
         step(0, Repeat("k", 100000), 2, 10, 60),
         step(0, Repeat("k", 100000), 2, 10, 60),
         step(0, ka, 2, 10, 60),
         step(0, ka, 2, 10, 60),
         step(0, ka, 2, 10, 60),
         step(0, ka, 2, 10, 60),
         step(0, kb, 2, 10, 60),
         step(0, "ключ-🔑", 2, 10, 60),
         step(0, "ключ-🔑", 2, 10, 60),
         step(0, "a b", 2, 10, 60),
         step(0, "a\r\nb", 2, 10, 60),
         step(0, "a\r\nb", 2, 10, 60),
         step(0, "a b\r\nc", 2, 10, 60),
         step(0, "a b", 2, 10, 60, 0),
         step(6000, Repeat("k", 100000), 2, 10, 60, 0),
         step(6000, "", 2, 10, 60, 0)]))

    # g. large values that stay within redis-cell's i64 nanoseconds.
    S.append(scenario(
        "one_per_day",
        "0 1 86400: limit 1, T = 86400 s. Denied until a whole day has passed; "
        "one millisecond before, retry_after rounds 0.001 s up to 1.",
        [step(0, "day", 0, 1, 86400),
         step(0, "day", 0, 1, 86400),
         step(43200000, "day", 0, 1, 86400, 0),
         step(43200000, "day", 0, 1, 86400),
         step(86399999, "day", 0, 1, 86400),
         step(86400000, "day", 0, 1, 86400),
         step(86400000, "day", 0, 1, 86400)]))
    S.append(scenario(
        "one_per_microsecond",
        "1000000 1000000 1: limit 1000001, T = 1 us, DVT = 1.000001 s. Durations "
        "under a millisecond are reported as 0 (retry_after 0 while limited, "
        "reset_after 0 after one unit): redis-cell rounds up only when the "
        "millisecond part is non-zero.",
        [step(0, "us", 1000000, 1000000, 1),
         step(0, "us", 1000000, 1000000, 1, 1000000),
         step(0, "us", 1000000, 1000000, 1),
         step(0, "us", 1000000, 1000000, 1, 0),
         step(1, "us", 1000000, 1000000, 1, 1000),
         step(1, "us", 1000000, 1000000, 1),
         step(5000, "us", 1000000, 1000000, 1, 1000001),
         step(5000, "us", 1000000, 1000000, 1, 0),
         step(10000, "us", 1000000, 1000000, 1, 1000002),
         step(10000, "us", 1000000, 1000000, 1, 1000001)]))
    S.append(scenario(
        "limit_sized_quantities",
        "999 1000 1: limit 1000, T = 1 ms, DVT = 1 s. Quantity 1000 (the whole "
        "limit) passes on an idle key; 1001 never can (retry_after -1).",
        [step(0, "q", 999, 1000, 1, 1000),
         step(0, "q", 999, 1000, 1, 1001),
         step(0, "q", 999, 1000, 1, 1),
         step(250, "q", 999, 1000, 1, 250),
         step(250, "q", 999, 1000, 1, 1),
         step(1250, "q", 999, 1000, 1, 1000),
         step(7999, "q", 999, 1000, 1, 1001),
         step(7999, "q", 999, 1000, 1, 1000)]))
    S.append(scenario(
        "one_per_year_burst_10",
        "10 1 31536000: limit 11, T = 365 days (3.1536e16 ns), DVT = 11 years; "
        "TAT and TTL stay within i64 nanoseconds.",
        [step(0, "year", 10, 1, 31536000),
         step(0, "year", 10, 1, 31536000, 10),
         step(0, "year", 10, 1, 31536000),
         step(0, "year", 10, 1, 31536000, 0),
         step(31536000000, "year", 10, 1, 31536000),
         step(31536000000, "year", 10, 1, 31536000, 0)]))
    return S


# --- the frozen clock ----------------------------------------------------------


class Clock:
    def __init__(self, path):
        self.path = path
        self.at_ms = None

    @staticmethod
    def stamp(at_ms):
        s, ms = divmod(START_S * 1000 + at_ms, 1000)
        day = datetime.datetime.fromtimestamp(s, tz=datetime.timezone.utc)
        # +0.5 ns: libfaketime truncates (frac as double) * 1e9, see the top.
        return day.strftime("%Y-%m-%d %H:%M:%S") + ".%03d0000005" % ms

    def set(self, at_ms):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(self.stamp(at_ms) + "\n")
        os.replace(tmp, self.path)
        self.at_ms = at_ms


def check_clock(probe, at_ms):
    """Redis's TIME and redis-cell's own clock both read START + at_ms exactly."""
    want_us = (START_S * 1000 + at_ms) * 1000
    sec, usec = probe.ok("TIME")
    got_us = int(sec) * 10**6 + int(usec)
    if got_us != want_us:
        die(f"frozen clock: TIME = {got_us} us, want {want_us} us (at_ms {at_ms})")
    probe.ok("DEL", PROBE_KEY)
    r = probe.ok("CL.THROTTLE", PROBE_KEY, 0, 1, 1, 1)
    tat = int(probe.ok("GET", PROBE_KEY))
    probe.ok("DEL", PROBE_KEY)
    want_ns = START_NS + at_ms * 10**6 + 10**9
    if r != [0, 1, 0, -1, 1] or tat != want_ns:
        die(f"frozen clock: redis-cell stored TAT {tat} ns (reply {r}), want {want_ns} "
            f"(at_ms {at_ms})")


def self_test(clock, probe):
    # libfaketime parses "<last digit of the seconds>.<fraction>" with atof():
    # seconds 0..9 times every millisecond fraction covers all its inputs.
    instants = list(range(10000)) + [59999, 86399999, 86400000,
                                     31536000000, 31536000999]
    for at in instants:
        clock.set(at)
        check_clock(probe, at)
    return len(instants)


# --- recording -----------------------------------------------------------------


def run_scenario(sc, clock, main, probe):
    steps_out, seen = [], []
    last = None
    for st in sc["steps"]:
        at = st["at_ms"]
        assert last is None or at >= last, (sc["name"], "at_ms must not decrease")
        if last is None:
            clock.set(at)
            check_clock(probe, at)
            main.ok("FLUSHALL")
            if main.ok("DBSIZE") != 0:
                die("FLUSHALL left keys")
        elif at != last:
            clock.set(at)
            check_clock(probe, at)
        last = at
        args = st["args"]
        r = main.call(*[arg_bytes(a) for a in args])
        row = {"at_ms": at, "args": [arg_json(a) for a in args]}
        if isinstance(r, RespError):
            row["error"] = str(r)
        else:
            if not (isinstance(r, list) and len(r) == 5 and all(isinstance(x, int) for x in r)):
                die(f"{sc['name']}: unexpected reply {r!r} to {args}")
            assert_whole_ns(args, r)
            row["reply"] = r
        steps_out.append(row)
        if st["inspect"]:
            key = arg_bytes(args[1])
            val = main.ok("GET", key)
            pttl = main.ok("PTTL", key)
            what = " ".join(arg_text(a) for a in args[1:])
            outcome = "error" if "error" in row else ("denied" if r[0] else "allowed")
            if val is None:
                seen.append(f"{what} ({outcome}): no key")
            else:
                rel_ms = (int(val) - START_NS) / 10**6
                ttl = "no TTL" if pttl == -1 else f"PTTL {pttl}"
                seen.append(f"{what} ({outcome}): key = {val.decode()} "
                            f"(START{rel_ms:+g} ms), {ttl}")
    note = sc["note"]
    if seen:
        note += " Keys found after the call (GET/PTTL at the same instant): " + "; ".join(seen) + "."
    return {"name": sc["name"], "note": note, "steps": steps_out}


def render(doc):
    """Readable JSON: one step per line."""
    dump = lambda v: json.dumps(v, ensure_ascii=False)
    out = ["{",
           f'  "source": {dump(doc["source"])},',
           f'  "start_unix_s": {doc["start_unix_s"]},',
           '  "scenarios": [']
    for i, sc in enumerate(doc["scenarios"]):
        out += ["    {",
                f'      "name": {dump(sc["name"])},',
                f'      "note": {dump(sc["note"])},',
                '      "steps": [']
        for j, s in enumerate(sc["steps"]):
            out.append("        " + dump(s) + ("," if j + 1 < len(sc["steps"]) else ""))
        out += ["      ]", "    }" + ("," if i + 1 < len(doc["scenarios"]) else "")]
    out += ["  ]", "}"]
    text = "\n".join(out) + "\n"
    assert json.loads(text) == doc
    return text


# --- redis-server ----------------------------------------------------------------


def port_answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def start_server(port, so, tmp, clock):
    server = os.environ.get("REDIS_SERVER", "redis-server")
    faketime = os.environ.get("LIBFAKETIME", "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
    shim = os.environ.get("MALLOC_SHIM", "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0")
    if shutil.which(server) is None:
        die(f"{server} not found (apt-get install redis-server)")
    if not os.path.exists(faketime):
        die(f"{faketime} not found (apt-get install faketime, or set LIBFAKETIME)")
    if shim and not os.path.exists(shim):
        die(f"MALLOC_SHIM {shim} not found (set MALLOC_SHIM='' to run without)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKETIME")}
    env.update({
        "LD_PRELOAD": " ".join(p for p in (shim, faketime) if p),
        "FAKETIME_TIMESTAMP_FILE": clock.path,
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DISABLE_SHM": "1",
        "TZ": "UTC",      # the absolute date in the file is read with mktime()
        "LC_ALL": "C",    # and its fraction with atof()
    })
    log = os.path.join(tmp, "redis.log")
    cmd = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--daemonize", "no", "--dir", tmp,
           "--logfile", log, "--loadmodule", so]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):  # up to ~10 s
        if proc.poll() is not None:
            break
        try:
            c = Conn(port, timeout=2)
            if c.call("PING") == "PONG":
                return proc, c, log
            c.close()
        except OSError:
            pass
        time.sleep(0.05)
    tail = open(log).read()[-2000:] if os.path.exists(log) else ""
    stop_server(proc)
    die(f"redis-server did not come up on port {port}\n{tail}")


def stop_server(proc):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def main():
    port = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_CELL_TABLE_PORT", "7333"))
    so = os.environ.get("REDIS_CELL_SO",
                        os.path.expanduser("~/.cache/peers/redis-cell/target/release/libredis_cell.so"))
    out = os.environ.get("REDIS_CELL_TABLE_OUT", os.path.join(REPO, "tests", "data", "redis_cell_table.json"))
    if not os.path.exists(so):
        die(f"no module at {so}: build one with benches/peers/redis-cell.sh and set REDIS_CELL_SO")
    if port_answers(port):
        die(f"something already listens on 127.0.0.1:{port}; pass another port")

    tmp = tempfile.mkdtemp(prefix="redis-cell-table.")
    clock = Clock(os.path.join(tmp, "faketime"))
    clock.set(0)
    proc = None
    try:
        proc, main_conn, log = start_server(port, so, tmp, clock)
        probe = Conn(port)
        probe.ok("SELECT", 1)  # the clock probe lives in db 1, scenarios in db 0
        mods = main_conn.ok("MODULE", "LIST")
        if not any(b"redis-cell" in m for m in mods):
            die(f"module redis-cell not loaded: {mods}")
        info = main_conn.ok("INFO", "server").decode()
        version = re.search(r"redis_version:(\S+)", info).group(1)
        checked = self_test(clock, probe)
        print(f"redis-cell-table: frozen clock exact at {checked} instants "
              f"(TIME in us, redis-cell's own clock in ns)", file=sys.stderr)

        doc = {"source": f"{REDIS_CELL}, redis-server {version}, frozen clock",
               "start_unix_s": START_S,
               "scenarios": [run_scenario(sc, clock, main_conn, probe) for sc in scenarios()]}
        main_conn.close()
        probe.close()
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    text = render(doc)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(out + ".tmp", out)
    n = sum(len(s["steps"]) for s in doc["scenarios"])
    print(f"redis-cell-table: {len(doc['scenarios'])} scenarios, {n} steps -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
