#!/usr/bin/env python3
"""Memory a RESP connection can make `freqcap serve` hold (docs/resp.md,
"Limits"; security probe turn 3, cases 1.25 and 1.26).

    python3 benches/resp_memory.py [FREQCAP_BIN]   # default target/release/freqcap

Each case starts its own `freqcap serve --memory` on free loopback ports
(stopped by its PID), notes VmRSS from /proc/PID/status once it answers PING,
opens the connections, waits for the server to settle, and prints VmRSS
again with the growth per connection:

  partial-auth N   with --decision-token: N connections each send
                   `*2 ECHO $1048576` and 1 048 000 bytes of it, unauthenticated
                   (the probe's case 1.26)
  partial-open N   without tokens: `*2 ECHO $1048000` and 1 047 000 bytes of
                   it (a command under max_body, 1 MiB, in all)
  pipe N           without tokens: N connections each send `ECHO <1 048 000
                   bytes>` for as long as the server reads (at most 8 s
                   each), reading no reply (case 1.25)

Memory the kernel holds in socket buffers is not in VmRSS and not counted.
"""
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/freqcap"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Server:
    def __init__(self, *extra):
        self.log = tempfile.NamedTemporaryFile(prefix="freqcap-mem-", suffix=".log")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--memory", "--listen", "127.0.0.1:0", "--grpc-listen", "off",
             "--resp-listen", "127.0.0.1:0", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        self.port = None
        while self.port is None:
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the server did not log its RESP address")
            time.sleep(0.1)
            text = open(self.log.name, errors="replace").read()
            m = re.search(r"RESP \(Redis protocol\) listening on [^\d]*([\d.]+):(\d+)", text)
            if m:
                self.port = int(m.group(2))
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(b"PING\r\n")
        s.settimeout(5)
        assert s.recv(64).startswith((b"+PONG", b"-NOAUTH")), "PING answered"
        s.close()
        time.sleep(0.5)
        self.base = rss_kib(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def partial(n, head, body, *extra):
    srv = Server(*extra)
    conns = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.settimeout(5)
            try:
                s.sendall(head + b"x" * body)
            except OSError:
                pass  # refused and closed before all of it was read
            conns.append(s)
        time.sleep(2)
        return srv.base, rss_kib(srv.proc.pid)
    finally:
        for s in conns:
            s.close()
        srv.stop()


def pipe(n):
    srv = Server()
    cmd = b"*2\r\n$4\r\nECHO\r\n$1048000\r\n" + b"y" * 1_048_000 + b"\r\n"
    conns = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.setblocking(False)
            conns.append([s, 0])  # socket, bytes of `cmd` sent modulo len
        # Send until no connection makes progress for 1 s (the server
        # stopped reading), 8 s per connection at most.
        deadline = time.time() + 8 * n
        idle_since = time.time()
        while time.time() < deadline and time.time() - idle_since < 1:
            _, writable, _ = select.select([], [c[0] for c in conns], [], 0.2)
            for c in conns:
                if c[0] not in writable:
                    continue
                try:
                    sent = c[0].send(cmd[c[1]:])
                except BlockingIOError:
                    continue
                except OSError as e:
                    raise SystemExit(f"the server closed a connection: {e}")
                if sent:
                    c[1] = (c[1] + sent) % len(cmd)
                    idle_since = time.time()
        time.sleep(1)
        return srv.base, rss_kib(srv.proc.pid)
    finally:
        for c in conns:
            c[0].close()
        srv.stop()


def main():
    print(f"binary: {BIN}")
    print(f"{'case':<18} {'conns':>5} {'RSS before':>11} {'RSS after':>10} {'per conn':>10}")
    cases = [
        ("partial-auth", 100, lambda n: partial(
            n, b"*2\r\n$4\r\nECHO\r\n$1048576\r\n", 1_048_000,
            "--decision-token", "DTOK-0123456789abcdef")),
        ("partial-open", 100, lambda n: partial(n, b"*2\r\n$4\r\nECHO\r\n$1048000\r\n", 1_047_000)),
        ("pipe", 1, pipe),
        ("pipe", 10, pipe),
        ("pipe", 100, pipe),
    ]
    for name, n, run in cases:
        base, after = run(n)
        per = (after - base) / n
        print(f"{name:<18} {n:>5} {base / 1024:>8.1f} MB {after / 1024:>7.1f} MB {per / 1024:>7.2f} MB",
              flush=True)


if __name__ == "__main__":
    main()
