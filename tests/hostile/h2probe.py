"""Hostile HTTP/2 clients for tests/hostile.rs, written frame by frame with
PyPI's h2 (pinned in tests/requirements.txt). Each mode prints one JSON line
with what it saw; a mode that holds streams open prints {"holding": true}
first, then holds them for the seconds it is given (answering pings, so the
server sees a live peer), and is stopped by the test or by its own bound.

  grpc-declare PORT PID STREAMS SECONDS  gRPC calls that declare a 1 MiB
        message and send 1 byte, without a token; the server's RSS (from
        /proc/PID/status) before and at its peak, and each stream's status.
  hold-headers PORT STREAMS SECONDS      POST /v1/events heads, no body.
  authority PORT NAME                    GET /v1/campaigns with :authority NAME.
  watch PORT SECONDS                     grpc.health.v1.Health/Watch, held.
  bodies PORT STREAMS LENGTH SEND SECONDS  POST /v1/events declaring LENGTH
        bytes and sending SEND of them; each stream's status.
"""

import json
import socket
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    c = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    c.initiate_connection()
    s.sendall(c.data_to_send())
    # The server's SETTINGS (its stream limit among them) before any stream.
    pump(s, c, {}, 2.0, until=lambda ev: any(
        isinstance(e, h2.events.RemoteSettingsChanged) for e in ev))
    return s, c


def pump(s, c, streams, seconds, until=None):
    """Reads and answers frames for `seconds` at most (or until `until` holds
    for a batch of events), noting each stream's status in `streams`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.settimeout(max(0.01, min(0.2, end - time.monotonic())))
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return "closed"
        if not data:
            return "closed"
        try:
            events = c.receive_data(data)
        except Exception:  # a GOAWAY'd or broken connection
            return "closed"
        for e in events:
            sid = getattr(e, "stream_id", None)
            if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                st = streams.setdefault(sid, {})
                for k, v in e.headers:
                    if k in (":status", "grpc-status", "grpc-message"):
                        st[k] = v
            elif isinstance(e, h2.events.DataReceived):
                c.acknowledge_received_data(e.flow_controlled_length, sid)
            elif isinstance(e, h2.events.StreamEnded):
                streams.setdefault(sid, {})["ended"] = True
            elif isinstance(e, h2.events.StreamReset):
                streams.setdefault(sid, {})["reset"] = int(e.error_code)
            elif isinstance(e, h2.events.ConnectionTerminated):
                s.sendall(c.data_to_send())
                return "closed"
        s.sendall(c.data_to_send())
        if until is not None and until(events):
            return "until"
    return "time"


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def grpc_headers(path, port):
    return [(":method", "POST"), (":path", path), (":scheme", "http"),
            (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
            ("te", "trailers")]


def holding():
    print(json.dumps({"holding": True}), flush=True)


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    args = sys.argv[3:]
    if mode == "grpc-declare":
        pid, n, seconds = int(args[0]), int(args[1]), float(args[2])
        before = rss(pid)
        s, c = connect(port)
        for _ in range(n):
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, grpc_headers("/freqcap.v1.Freqcap/Events", port))
            c.send_data(sid, b"\x00" + struct.pack(">I", 1 << 20) + b"\x0a")
        s.sendall(c.data_to_send())
        streams, peak = {}, before
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pump(s, c, streams, 0.1)
            peak = max(peak, rss(pid))
        statuses = {}
        for sid, st in streams.items():
            key = st.get("grpc-status", "reset" if "reset" in st else "none")
            statuses[key] = statuses.get(key, 0) + 1
        print(json.dumps({"rss_before": before, "rss_peak": peak, "answered": len(streams),
                          "grpc_status": statuses}), flush=True)
    elif mode == "hold-headers":
        n, seconds = int(args[0]), float(args[1])
        s, c = connect(port)
        for _ in range(n):
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, [(":method", "POST"), (":path", "/v1/events"),
                                 (":scheme", "http"), (":authority", "localhost"),
                                 ("content-type", "application/json")])
        s.sendall(c.data_to_send())
        # A second for the server to take every head in (and answer the
        # ones it refuses) before the test looks.
        streams = {}
        pump(s, c, streams, 1.0)
        holding()
        how = pump(s, c, streams, seconds)
        print(json.dumps({"answered": len(streams), "end": how}), flush=True)
    elif mode == "authority":
        s, c = connect(port)
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, [(":method", "GET"), (":path", "/v1/campaigns"),
                             (":scheme", "http"), (":authority", args[0])], end_stream=True)
        s.sendall(c.data_to_send())
        streams = {}
        pump(s, c, streams, 5.0, until=lambda ev: any(
            isinstance(e, h2.events.StreamEnded) for e in ev))
        print(json.dumps({"status": int(streams.get(sid, {}).get(":status", 0))}), flush=True)
    elif mode == "watch":
        seconds = float(args[0])
        s, c = connect(port)
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, grpc_headers("/grpc.health.v1.Health/Watch", port))
        c.send_data(sid, b"\x00\x00\x00\x00\x00", end_stream=True)
        s.sendall(c.data_to_send())
        holding()
        streams = {}
        how = pump(s, c, streams, seconds)
        print(json.dumps({"end": how}), flush=True)
    elif mode == "bodies":
        n, length, send, seconds = int(args[0]), int(args[1]), int(args[2]), float(args[3])
        s, c = connect(port)
        sids = []
        for _ in range(n):
            sid = c.get_next_available_stream_id()
            sids.append(sid)
            c.send_headers(sid, [(":method", "POST"), (":path", "/v1/events"),
                                 (":scheme", "http"), (":authority", "localhost"),
                                 ("content-type", "application/json"),
                                 ("content-length", str(length))])
            sent = 0
            while sent < send:
                chunk = min(16384, send - sent, c.local_flow_control_window(sid))
                if chunk <= 0:
                    pump(s, c, {}, 0.05)
                    continue
                c.send_data(sid, b" " * chunk)
                sent += chunk
                s.sendall(c.data_to_send())
        s.sendall(c.data_to_send())
        streams = {}
        pump(s, c, streams, seconds)
        statuses = {}
        for sid in sids:
            key = streams.get(sid, {}).get(":status", "none")
            statuses[key] = statuses.get(key, 0) + 1
        print(json.dumps({"status": statuses}), flush=True)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
