"""The planner's actuator on Ray, with Ray's calls replaced by fakes: it starts a node only where
one fits, under the next free stable id and placed like the pool's others; it stops a node by a
drain (SIGTERM), and reaps the actors of nodes that drained."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the optional Ray extra is not installed (make install-ray)")

from nodes.launch_plan import ClusterShape  # noqa: E402
from nodes.ray_pools import placement, ray_actuator  # noqa: E402
from nodes.ray_pools.pool_plan import RayOptions  # noqa: E402
from nodes.ray_pools.pools import pool_record  # noqa: E402
from nodes.ray_pools.ray_actuator import RayActuator, next_free_id  # noqa: E402


class FakeRay:
    """Named actors by name; each answers `info` with its state; what was launched, drained, killed."""

    def __init__(self, states: dict[str, str], free: dict[str, float]) -> None:
        self.states, self.free = states, free
        self.launched, self.calls, self.killed = [], [], []

    def components(self) -> dict[str, str]:
        return {name: name for name in self.states}

    def call(self, handle: str, method: str, *args, timeout: float = 10.0):
        self.calls.append((handle, method))
        return {"name": handle, "state": self.states[handle]} if method == "info" else None

    def launch(self, spec, config_text: str, namespace: str) -> str:
        self.launched.append((spec, config_text, namespace))
        self.states[spec.name] = "starting"
        return spec.name

    def kill(self, handle: str) -> None:
        self.killed.append(handle)
        del self.states[handle]


@pytest.fixture
def fake(monkeypatch):
    ray = FakeRay({"broker": "ready", "prefill-0": "ready", "decode-0": "ready", "decode-2": "ready"},
                  {"CPU": 2.0, "GPU": 0.0})
    for name in ("components", "call", "launch", "kill"):
        monkeypatch.setattr(placement, name, getattr(ray, name))
    monkeypatch.setattr(ray_actuator.ray, "available_resources", lambda: dict(ray.free))
    return ray


def _actuator(options: RayOptions | None = None) -> RayActuator:
    record = pool_record(ClusterShape(model="tiny"), [("broker", "tcp://127.0.0.1:5555")], options or RayOptions(),
                         "info", {"PDBUS__X": "1"}, local_head=False)
    return RayActuator("pdbus", {**record, "config_text": "[engine]\n"})


def test_next_free_id_keeps_ids_stable():
    assert next_free_id("decode", {"decode-0", "decode-2", "prefill-1"}) == "decode-1"
    assert next_free_id("prefill", set()) == "prefill-0"


def test_a_node_starts_under_the_next_free_id_placed_like_the_others(fake):
    assert _actuator().start_node("decode") == "decode-1"
    ((spec, config_text, namespace),) = fake.launched
    assert (spec.name, spec.kind, spec.num_cpus, spec.spread, dict(spec.env)) == ("decode-1", "decode", 1.0, True,
                                                                                  {"PDBUS__X": "1"})
    assert spec.argv[spec.argv.index("--broker") + 1] == "tcp://127.0.0.1:5555"
    assert (config_text, namespace) == ("[engine]\n", "pdbus")
    assert _actuator().start_node("both") is None and _actuator().start_node("gateway") is None


def test_nothing_starts_where_it_would_not_fit(fake):
    fake.free["CPU"] = 0.5
    assert not _actuator().can_start() and _actuator().start_node("prefill") is None
    fake.free["CPU"] = 4.0
    assert not _actuator(RayOptions(node_gpus=1)).can_start()            # no GPU free
    assert not _actuator(RayOptions(node_resources={"big": 1})).can_start()
    assert fake.launched == []


def test_stop_is_a_drain_and_a_drained_node_is_reaped(fake):
    actuator = _actuator()
    actuator.stop_node("decode-2")
    actuator.stop_node("broker")      # not a node: never drained by the planner
    actuator.stop_node("decode-9")    # unknown: nothing to do
    assert [call for call in fake.calls if call[1] == "drain"] == [("decode-2", "drain")]
    fake.states["decode-2"] = "exited"
    assert actuator.reap() == ["decode-2"] and fake.killed == ["decode-2"]
    fake.states["broker"] = "exited"
    assert actuator.reap() == [] and "broker" in fake.states
