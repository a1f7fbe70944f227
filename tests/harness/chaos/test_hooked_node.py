"""The harness's data-plane hook: an injector that is off until the control file arms it, then
flips or drops exactly the ordered number of KV chunks, and is disarmed by a calm order."""

from __future__ import annotations

import json
import os

from harness.chaos.hooked_node import ArmedInjector, main, read_order


def order(path, stamp: int, **values) -> None:
    path.write_text(json.dumps(values))
    os.utime(path, ns=(stamp, stamp))   # a distinct mtime per order, as a real write later in time has


def test_unarmed_it_passes_everything(tmp_path, monkeypatch):
    monkeypatch.setattr(ArmedInjector, "control_path", str(tmp_path / "missing.json"))
    injector = ArmedInjector(flip_probability=1.0, max_faults=9)
    message = [b"header", b"payload"]
    assert injector.apply(message) is message and injector.num_faults == 0


def test_armed_flips_then_drops_exactly_as_ordered_and_calm_disarms(tmp_path, monkeypatch):
    control = tmp_path / "control.json"
    monkeypatch.setattr(ArmedInjector, "control_path", str(control))
    monkeypatch.setattr("harness.chaos.hooked_node.frames.decode_header",
                        lambda frame: type("C", (), {"transfer_id": "t", "index": 0})())
    injector = ArmedInjector()
    injector.only_kinds = ()   # the hand-made frames are not real CHUNK headers
    order(control, 1_000_000_000, flip=2)
    message = [b"header", b"payload"]
    outputs = [injector.apply(list(message)) for _ in range(3)]
    assert outputs[0] != message and outputs[1] != message and outputs[2] == message and injector.flips == 2
    order(control, 2_000_000_000, drop=1)
    assert injector.apply(list(message)) is None and injector.apply(list(message)) == message
    order(control, 3_000_000_000, drop=5)
    order(control, 4_000_000_000)   # calm before any chunk went: nothing more is injected
    assert injector.apply(list(message)) == message and injector.drops == 1


def test_a_half_written_control_file_keeps_the_previous_order_instead_of_raising(tmp_path):
    """A raise here ran inside a KV send and left that transfer stuck for the 30 s timeout."""
    control, cache = tmp_path / "control.json", {}
    order(control, 1_000_000_000, drop=2)
    assert read_order(str(control), cache) == {"drop": 2}
    control.write_text('{"fl')   # caught mid-write
    os.utime(control, ns=(2_000_000_000, 2_000_000_000))
    assert read_order(str(control), cache) == {"drop": 2}
    order(control, 3_000_000_000, flip=1)
    assert read_order(str(control), cache) == {"flip": 1}


def test_the_harness_replaces_the_control_file_atomically(tmp_path):
    from types import SimpleNamespace

    from harness.chaos.chaos_cluster import ChaosCluster
    cluster = SimpleNamespace(control_path=tmp_path / "kv-faults.json")
    ChaosCluster.control(cluster, flip=4)
    assert json.loads(cluster.control_path.read_text()) == {"flip": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["kv-faults.json"]   # no partial file left behind


def test_the_wrapper_refuses_a_command_line_without_its_separator(capsys):
    assert main(["pdbus", "prefill"]) == 2
    assert "usage" in capsys.readouterr().err
