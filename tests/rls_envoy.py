"""Envoy's rate limit service of a running freqcap, driven by a client
generated from Envoy's own protos (PyPI xds-protos + grpcio), over
tests/rls/edge.yaml. Run by tests/rls.rs: python3 rls_envoy.py HOST:PORT.

Every scenario uses keys of its own, so they do not see each other's
counts. The rules count per day (fixed windows from the epoch, UTC): a run
that starts within a minute of midnight waits for it first, so no window
ends in the middle of a scenario. Prints "ok N" after N scenarios.
"""

import sys
import time
import uuid

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as rl
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.type.v3 import ratelimit_unit_pb2
from google.protobuf import wrappers_pb2

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit

stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[1]))
scenarios = 0


def fresh():
    return uuid.uuid4().hex[:12]


def desc(*entries, hits=None, limit=None):
    d = rl.RateLimitDescriptor(
        entries=[rl.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit is not None:
        d.limit.CopyFrom(limit)
    return d


def call(*descriptors, domain="edge", hits=0):
    return stub.ShouldRateLimit(
        rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits),
        timeout=5,
    )


def headers(r):
    return {h.key: h.value for h in r.response_headers_to_add}


def scenario(f):
    global scenarios
    f()
    scenarios += 1
    return f


def error_of(*descriptors, domain="edge"):
    try:
        call(*descriptors, domain=domain)
    except grpc.RpcError as e:
        return e.code(), e.details()
    raise AssertionError("expected an error")


# No window may end during the run.
to_midnight = 86400 - int(time.time()) % 86400
if to_midnight < 60:
    time.sleep(to_midnight + 1)


@scenario
def fixed_window_counts_and_reports():
    c = fresh()
    for i in range(3):
        r = call(desc(("client", c)))
        assert r.overall_code == OK, r
        s = r.statuses[0]
        assert s.code == OK and s.limit_remaining == 2 - i, r
        assert s.current_limit.requests_per_unit == 3 and s.current_limit.unit == Unit.DAY, r
        # The window is the UTC day: it resets at midnight.
        left = 86400 - int(time.time()) % 86400
        assert abs(s.duration_until_reset.seconds - left) <= 2, (r, left)
    r = call(desc(("client", c)))
    assert r.overall_code == OVER and r.statuses[0].code == OVER, r
    h = headers(r)
    assert h["ratelimit-policy"] == '"client";q=3;w=86400', h
    assert h["ratelimit"].startswith('"client";r=0;t='), h
    assert abs(int(h["retry-after"]) - r.statuses[0].duration_until_reset.seconds) <= 1, h


@scenario
def all_or_nothing():
    # path /api/* allows 2 a day, client 3. The third request is over on
    # path: client is not debited for it (envoyproxy/ratelimit debits it,
    # its issues #185 and #427), so client still has one left.
    c, p = fresh(), "/api/" + fresh()
    for _ in range(2):
        assert call(desc(("client", c)), desc(("path", p))).overall_code == OK
    r = call(desc(("client", c)), desc(("path", p)))
    assert r.overall_code == OVER, r
    assert [s.code for s in r.statuses] == [OK, OVER], r
    assert r.statuses[0].limit_remaining == 1, r
    h = headers(r)
    assert h["ratelimit"].startswith('"api";r=0;'), h
    assert '"client";q=3;w=86400' in h["ratelimit-policy"], h
    assert '"api";q=2;w=86400' in h["ratelimit-policy"], h
    # The remaining one is still there for a request client alone decides.
    r = call(desc(("client", c)))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 0, r


@scenario
def hits_addend_is_the_cost():
    c = fresh()
    # 0 (unset) counts 1.
    assert call(desc(("client", c)), hits=0).statuses[0].limit_remaining == 2
    # 2 at once.
    assert call(desc(("client", c)), hits=2).statuses[0].limit_remaining == 0
    # A cost the rest cannot pay is over and debits nothing.
    c2 = fresh()
    r = call(desc(("client", c2)), hits=4)
    assert r.overall_code == OVER, r
    assert call(desc(("client", c2))).statuses[0].limit_remaining == 2


@scenario
def per_descriptor_hits_addend():
    c, d = fresh(), fresh()
    r = call(desc(("client", c), hits=3), desc(("client", d)))
    assert r.overall_code == OK, r
    assert [s.limit_remaining for s in r.statuses] == [0, 2], r
    # Set to 0, the descriptor is looked at and not debited.
    r = call(desc(("client", d), hits=0))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 2, r


@scenario
def unlimited_and_unmatched():
    r = call(desc(("vip", fresh())), desc(("nobody", "x")), desc(("path", "/static/x")))
    assert r.overall_code == OK, r
    assert r.statuses[0].code == OK and r.statuses[0].limit_remaining == 2**32 - 1, r
    assert not r.statuses[0].HasField("current_limit"), r
    for s in r.statuses[1:]:
        assert s.code == OK and not s.HasField("current_limit"), r
    assert headers(r) == {}, r


@scenario
def blocked():
    c = fresh()
    r = call(desc(("banned", fresh())), desc(("client", c)))
    assert r.overall_code == OVER, r
    assert r.statuses[0].code == OVER and r.statuses[0].current_limit.requests_per_unit == 0, r
    assert r.statuses[0].current_limit.unit == Unit.HOUR, r
    # Nothing else was debited.
    assert r.statuses[1].code == OK and r.statuses[1].limit_remaining == 3, r
    assert int(headers(r)["retry-after"]) <= 3600


@scenario
def shadow_mode():
    t, c = fresh(), fresh()
    r = call(desc(("trial", t)), desc(("client", c)))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 0, r
    # Over the shadow rule: still OK, the enforced one counts on.
    r = call(desc(("trial", t)), desc(("client", c)))
    assert r.overall_code == OK, r
    assert [s.code for s in r.statuses] == [OK, OK], r
    assert r.statuses[0].limit_remaining == 0 and r.statuses[1].limit_remaining == 1, r
    assert "retry-after" not in headers(r), r


@scenario
def nested_and_wildcards():
    t = fresh()
    # tenant > plan gold: the freqcap `limits` extension (a 5/min rate and
    # a 100/day window): the rate's burst is the tightest.
    r = call(desc(("tenant", t), ("plan", "gold")))
    assert r.overall_code == OK, r
    s = r.statuses[0]
    assert s.current_limit.requests_per_unit == 5 and s.current_limit.unit == Unit.MINUTE, r
    assert s.limit_remaining == 4, r
    # tenant alone, or another plan: the rule of the last entry; none there.
    for d in (desc(("tenant", t)), desc(("tenant", t), ("plan", "free"))):
        r = call(d)
        assert r.overall_code == OK and not r.statuses[0].HasField("current_limit"), r
    # A wildcard counts each value apart, as envoyproxy/ratelimit does
    # without share_threshold.
    a, b = "/api/" + fresh(), "/api/" + fresh()
    assert call(desc(("path", a))).statuses[0].limit_remaining == 1
    assert call(desc(("path", b))).statuses[0].limit_remaining == 1
    # A long value (250 bytes; each entry may have max_id_len, 256) in a
    # descriptor of several entries is counted like any other.
    long = "/api/" + "x" * 245
    r = call(desc(("path", long)), desc(("tenant", t), ("plan", "gold")))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 1, r
    # A specific value before the default of its key.
    r = call(desc(("client", "partner")))
    assert r.statuses[0].current_limit.requests_per_unit == 1000, r


@scenario
def replaces():
    # "burst" names a rule listed in "premium"'s replaces: with both
    # matched, only premium applies.
    u = fresh()
    r = call(desc(("user", u)), desc(("premium", u)))
    assert r.overall_code == OK, r
    assert not r.statuses[0].HasField("current_limit"), r
    assert r.statuses[1].current_limit.name == "premium", r
    r = call(desc(("user", u)))
    assert r.statuses[0].current_limit.name == "burst", r


@scenario
def limit_override():
    o = rl.RateLimitDescriptor.RateLimitOverride(
        requests_per_unit=2, unit=ratelimit_unit_pb2.DAY
    )
    c = fresh()
    for want in (1, 0):
        r = call(desc(("anything", c), limit=o))
        assert r.overall_code == OK and r.statuses[0].limit_remaining == want, r
        assert r.statuses[0].current_limit.requests_per_unit == 2, r
    assert call(desc(("anything", c), limit=o)).overall_code == OVER


@scenario
def bad_requests_are_refused_and_change_nothing():
    c = fresh()
    code, text = error_of(desc(("client", c)), domain="")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "domain" in text, text
    code, text = error_of(desc(("client", c)), domain="elsewhere")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and '"elsewhere"' in text, text
    code, text = error_of()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "descriptors" in text, text
    code, text = error_of(desc(("client", c)), rl.RateLimitDescriptor())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "descriptors[1].entries" in text, text
    code, text = error_of(desc(("client", c)), desc(("", "x")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "descriptors[1].entries[0].key" in text, text
    code, text = error_of(desc(("client", c), ("x", "y" * 100000)))
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.OUT_OF_RANGE), (code, text)
    code, text = error_of(*[desc(("client", c))] * 65)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 64" in text, text
    # None of them counted.
    assert call(desc(("client", c))).statuses[0].limit_remaining == 2


print("ok", scenarios)
