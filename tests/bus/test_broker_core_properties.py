"""Property tests: random and mutated frames from random peers never break the broker core.

Whatever arrives, BrokerCore never raises, only writes to peers it has heard from, emits only
well-formed headers, keeps its tables consistent, and keeps serving a well-behaved pair."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import codec
from bus.broker_core import BrokerCore
from bus.constants import Command
from bus.liveness import HeartbeatConfig
from bus.messages import Final, Partial, Ready, Request
from tests.conftest import FakeClock

IDENTITIES = [b"a", b"b", b"c", b"good-worker", b"good-client"]
headers = st.sampled_from(list(codec.HEADERS.values()))
small_frames = st.binary(max_size=40)
ids = st.sampled_from([b"r1", b"r2", b"x", b"", b"\xff"])

valid_looking = st.one_of(
    st.tuples(headers).map(list),
    st.tuples(headers, small_frames).map(list),
    st.tuples(headers, ids, small_frames, small_frames).map(list),
    st.tuples(headers, st.sampled_from([b"decode", b"prefill", b"?"]), ids, small_frames,
              small_frames, small_frames).map(list),
    st.builds(lambda role, node: codec.encode(Ready(role, node)),
              st.sampled_from(["decode", "prefill", "both", "gateway"]), st.sampled_from(["n1", "n2"])),
    st.builds(lambda rid: codec.encode(Request("decode", rid)), st.sampled_from(["r1", "r2"])),
    st.builds(lambda rid, seq: codec.encode(Partial(rid, seq)), st.sampled_from(["r1", "r2"]),
              st.integers(0, 3)),
    st.builds(lambda rid: codec.encode(Final(rid, 0)), st.sampled_from(["r1", "r2"])),
)
garbage = st.lists(st.binary(max_size=64), max_size=8)
mutated = st.builds(lambda frames, index, data: frames[:index] + [data] + frames[index + 1:],
                    valid_looking, st.integers(0, 6), st.binary(max_size=16))
message = st.tuples(st.sampled_from(IDENTITIES[:3] + [b"good-worker"]),
                    st.one_of(valid_looking, garbage, mutated),
                    st.floats(0, 0.4))


def _check_tables(core: BrokerCore) -> None:
    for identity, node in core.nodes_by_identity.items():
        assert node.identity == identity and core.nodes_by_id[node.node_id] is node
    for request_id, route in core.routes.items():
        if route.client is not None:
            assert request_id in route.client.waiting
        if route.server is not None:
            assert request_id in route.server.serving
    for node in core.nodes_by_identity.values():
        assert all(core.routes[r].server is node for r in node.serving)
        assert all(core.routes[r].client is node for r in node.waiting)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message, max_size=40))
def test_random_frames_never_break_the_broker(messages):
    clock = FakeClock()
    core = BrokerCore(HeartbeatConfig(0.25, 3), max_message_bytes=200)
    heard = set()
    for identity, frames, delay in messages:
        clock.advance(delay)
        heard.add(identity)
        core.on_frames(identity, list(frames), clock.now)
        core.tick(clock.now)
        for out in core.take_outbox():
            assert out[0] in heard
            codec.parse_header(out[1])
        _check_tables(core)
    # A well-behaved pair registering afterwards is served normally.
    clock.advance(HeartbeatConfig(0.25, 3).idle_expiry_s + 0.1)   # every earlier node has expired
    core.tick(clock.now)
    core.on_frames(b"good-worker", codec.encode(Ready("decode", "gw-1")), clock.now)
    core.on_frames(b"good-client", codec.encode(Ready("gateway", "gc-1")), clock.now)
    core.take_outbox()
    core.on_frames(b"good-client", codec.encode(Request("decode", "fresh-request")), clock.now)
    delivered = [out for out in core.take_outbox() if out[0] == b"good-worker"]
    assert any(codec.parse_header(out[1]) is Command.REQUEST for out in delivered)
