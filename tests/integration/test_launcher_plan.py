"""`pdbus cluster`'s plan, without processes: which children, with which flags, from the config."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from nodes.commands import cluster_cmd as command
from nodes.config_file import SettingsError
from nodes.launch_plan import ClusterShape, cluster_plan
from nodes.launcher_child import parse_line


def _args(**overrides):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def _commands(plan):
    """Each child's pdbus arguments up to its --node-id / common flags."""
    def head(argv):
        ends = [argv.index(flag) for flag in ("--node-id", "--config", "--log-format") if flag in argv]
        return argv[3:min(ends)]
    return [head(spec.argv) for spec in plan]


def test_the_broker_comes_first_then_prefill_then_decode_nodes_with_stable_ids():
    plan = cluster_plan(ClusterShape(num_prefill=1, num_decode=2), "tcp://127.0.0.1:5555", ("--config", "c.toml"))
    assert [spec.name for spec in plan] == ["broker", "prefill-0", "decode-0", "decode-1"]
    assert plan[0].is_broker and not any(spec.is_broker for spec in plan[1:])
    assert _commands(plan) == [("broker", "--endpoint", "tcp://127.0.0.1:5555"), ("prefill",), ("decode",), ("decode",)]
    assert all(spec.argv[:3] == (sys.executable, "-m", "nodes.cli") for spec in plan)
    assert plan[0].argv[-4:] == ("--config", "c.toml", "--log-format", "json")
    assert plan[2].argv[-6:] == ("--node-id", "decode-0", "--config", "c.toml", "--log-format", "json")


def test_colocated_runs_both_nodes_only_and_the_model_reaches_every_node():
    plan = cluster_plan(ClusterShape(num_colocated=2, model="tiny"), "tcp://h:1")
    assert [spec.name for spec in plan] == ["broker", "both-0", "both-1"]
    assert _commands(plan)[1] == ("node", "--role", "both", "--model", "tiny")


def test_idle_nodes_are_echo_nodes_of_each_role():
    plan = cluster_plan(ClusterShape(num_prefill=1, num_decode=1, idle=True, model="ignored"), "tcp://h:1")
    assert _commands(plan)[1:] == [("node", "--idle", "--role", "prefill"), ("node", "--idle", "--role", "decode")]


def test_counts_come_from_the_config_and_flags_override_them():
    settings = {"cluster": {"prefill": 2, "decode": 3}}
    assert (command.cluster_shape(settings, _args()).num_prefill,
            command.cluster_shape(settings, _args()).num_decode) == (2, 3)
    shape = command.cluster_shape(settings, _args(decode=1, prefill=0))
    assert (shape.num_prefill, shape.num_decode) == (0, 1)


def test_colocated_defaults_to_one_node_per_core():
    shape = command.cluster_shape({"cluster": {"colocated": 0}}, _args(colocated=True))
    assert shape.num_colocated == (os.cpu_count() or 1)
    assert command.cluster_shape({}, _args(colocated=True, nodes=3)).num_colocated == 3


@pytest.mark.parametrize("settings, overrides, message", [
    ({}, {"decode": 0}, "at least one decode node"),
    ({}, {"prefill": -1}, "prefill must be a whole number"),
    ({"cluster": {"decode": "two"}}, {}, "decode must be a whole number"),
])
def test_impossible_shapes_are_configuration_errors(settings, overrides, message):
    with pytest.raises(SettingsError, match=message):
        command.cluster_shape(settings, _args(**overrides))


def test_only_json_object_lines_are_events():
    assert parse_line('{"event": "node_joined"}') == {"event": "node_joined"}
    assert parse_line("Traceback (most recent call last):") is None
    assert parse_line("[1, 2]") is None


def test_the_gateway_comes_last_with_the_model_and_a_stable_bus_id():
    plan = cluster_plan(ClusterShape(num_prefill=1, num_decode=1, model="tiny", gateway=True), "tcp://h:1",
                        ("--config", "c.toml"))
    assert [spec.name for spec in plan] == ["broker", "prefill-0", "decode-0", "gateway"]
    assert plan[-1].argv[3:] == ("gateway", "--model", "tiny", "--node-id", "gateway", "--workers", "1",
                                 "--config", "c.toml", "--log-format", "json")
    assert plan[-1].bus_ids == ()   # registers as `gateway`


def test_gateway_workers_come_from_the_flag_or_the_config_and_each_is_a_bus_id():
    assert command.cluster_shape({}, _args()).gateway_workers == 1
    assert command.cluster_shape({"gateway": {"workers": 3}}, _args()).gateway_workers == 3
    shape = command.cluster_shape({"gateway": {"workers": 3}}, _args(gateway_workers=2))
    plan = cluster_plan(shape, "tcp://h:1")
    assert plan[-1].bus_ids == ("gateway-w0", "gateway-w1")
    assert plan[-1].argv[plan[-1].argv.index("--workers") + 1] == "2"
    for bad in (0, 65, True):
        with pytest.raises(SettingsError, match="gateway-workers"):
            command.cluster_shape({}, _args(gateway_workers=bad))


def test_the_gateway_runs_unless_no_gateway_or_idle():
    assert command.cluster_shape({}, _args()).gateway
    assert not command.cluster_shape({}, _args(no_gateway=True)).gateway
    assert not command.cluster_shape({}, _args(idle=True)).gateway


def test_several_brokers_take_consecutive_ports_and_every_node_is_told_of_all():
    shape = command.cluster_shape({"cluster": {"brokers": 2}}, _args(no_gateway=True))
    plan = cluster_plan(shape, "tcp://127.0.0.1:5555")
    brokers = [spec for spec in plan if spec.is_broker]
    assert [(b.name, b.argv[b.argv.index("--endpoint") + 1]) for b in brokers] == [
        ("broker-0", "tcp://127.0.0.1:5555"), ("broker-1", "tcp://127.0.0.1:5556")]
    assert [b.argv[b.argv.index("--endpoint") + 1] for b in cluster_plan(shape, "tcp://127.0.0.1:0")
            if b.is_broker] == ["tcp://127.0.0.1:0", "tcp://127.0.0.1:0"]   # each picks a free port
    assert command.cluster_shape({}, _args(brokers=3)).num_brokers == 3
    for bad in ({"cluster": {"brokers": 0}}, {"cluster": {"brokers": "two"}}):
        with pytest.raises(SettingsError, match="broker"):
            command.cluster_shape(bad, _args())
    with pytest.raises(ValueError, match="host:port"):
        cluster_plan(shape, "ipc:///tmp/pdbus")
