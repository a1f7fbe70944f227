"""Property test: random and mutated frames from the 'broker' never break a node's endpoint
core: it never raises, keeps its sequence bookkeeping sane, and only ever sends well-formed
messages."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bus import codec
from bus.endpoint_core import EndpointCore
from bus.liveness import HeartbeatConfig
from bus.messages import Cancel, Direct, Disconnect, Error, Final, Heartbeat, Partial, Request
from tests.conftest import FakeClock

rids = st.sampled_from(["r1", "r2", "q1", ""])
messages = st.one_of(
    st.just(Heartbeat()),
    st.builds(Disconnect, st.sampled_from(["not_registered", "bad_version"])),
    st.builds(Request, st.just("decode"), rids.filter(bool)),
    st.builds(Partial, rids.filter(bool), st.integers(0, 5)),
    st.builds(Final, rids.filter(bool), st.integers(0, 5)),
    st.builds(Error, rids, st.just("node_lost")),
    st.builds(Direct, st.just("g1")),
    st.builds(Cancel, rids.filter(bool)),
)
frames = st.one_of(
    messages.map(codec.encode),
    st.lists(st.binary(max_size=32), max_size=6),
    st.builds(lambda m, i, b: (lambda f: f[:i] + [b] + f[i + 1:])(codec.encode(m)),
              messages, st.integers(0, 4), st.binary(max_size=12)),
)
actions = st.one_of(
    st.tuples(st.just("frames"), frames),
    st.tuples(st.just("tick"), st.floats(0, 1.0)),
    st.tuples(st.just("reply"), rids.filter(bool), st.booleans()),
    st.tuples(st.just("request"), rids.filter(bool)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(actions, max_size=50))
def test_random_input_never_breaks_the_endpoint(steps):
    clock = FakeClock()
    core = EndpointCore("decode", "d1", heartbeat=HeartbeatConfig(0.25, 3), rng=random.Random(0))
    core.on_socket_opened(clock.now)
    for step in steps:
        if step[0] == "frames":
            core.on_frames([bytes(f) for f in step[1]], clock.now)
        elif step[0] == "tick":
            clock.advance(step[1])
            if core.tick(clock.now):
                core.on_socket_opened(clock.now)
        elif step[0] == "reply":
            core.reply(step[1], None, (), step[2], clock.now)
        elif step[0] == "request" and step[1] not in core.streams:
            core.request(Request("decode", step[1]), clock.now)
        assert all(seq >= 0 for seq in core.serving.values())
        assert all(seq >= 0 for seq in core.streams.values())
        for out in core.take_outbox():
            codec.decode([bytes(f) for f in out])   # everything we send is well-formed
        core.take_events()
