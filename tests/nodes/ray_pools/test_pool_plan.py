"""What `pdbus ray up` places: `[ray]` settings, broker addresses, the plan's argv and resource
requests, the actors' options (pure: no Ray)."""

from __future__ import annotations

import pytest

from nodes.config_file import SettingsError
from nodes.launch_plan import ClusterShape
from nodes.ray_pools.pool_plan import (
    CONFIG_SLOT,
    RayOptions,
    actor_options,
    broker_addresses,
    cpus_needed,
    forwarded_env,
    kind_of,
    local_head_argv,
    node_component,
    pool_plan,
    ray_environment,
)

ONE = [("broker", "tcp://127.0.0.1:5555")]


def _flag(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_ray_options_defaults_and_gpus_follow_the_engine_device():
    assert RayOptions.from_settings({}) == RayOptions()
    assert RayOptions.from_settings({"engine": {"device": "cuda"}}).node_gpus == 1.0
    options = RayOptions.from_settings({"ray": {"node_cpus": 2, "broker_resources": {"pdbus_broker": 1},
                                                "env": {"OMP_NUM_THREADS": 1}, "head_port": 7000}})
    assert (options.node_cpus, options.broker_resources, options.env, options.head_port) == (
        2.0, {"pdbus_broker": 1.0}, {"OMP_NUM_THREADS": "1"}, 7000)


@pytest.mark.parametrize("table", [{"node_cpus": -1}, {"spread": "yes"}, {"namespace": ""}, {"nope": 1},
                                   {"node_resources": 3}, {"broker_cpus": True}])
def test_ray_options_refuse_what_is_wrong(table):
    with pytest.raises(SettingsError):
        RayOptions.from_settings({"ray": table})


def test_broker_addresses_from_one_address_a_list_or_consecutive_ports():
    assert broker_addresses("tcp://127.0.0.1:5555", 1) == ONE
    assert broker_addresses("tcp://127.0.0.1:5555", 2) == [("broker-0", "tcp://127.0.0.1:5555"),
                                                           ("broker-1", "tcp://127.0.0.1:5556")]
    assert broker_addresses("tcp://a:1, tcp://b:2", 1) == [("broker-0", "tcp://a:1"), ("broker-1", "tcp://b:2")]


@pytest.mark.parametrize("endpoint, count", [("tcp://127.0.0.1:0", 1), ("tcp://a:1,tcp://b:0", 2),
                                             ("tcp://a:1,tcp://b:2", 3), ("ipc:///tmp/x", 1)])
def test_broker_addresses_need_fixed_ports_a_restarted_broker_can_bind_again(endpoint, count):
    with pytest.raises(SettingsError):
        broker_addresses(endpoint, count)


def test_the_plan_places_brokers_first_and_every_process_finds_every_broker():
    addresses = broker_addresses("tcp://127.0.0.1:5555", 2)
    shape = ClusterShape(num_prefill=1, num_decode=2, model="tiny", gateway=True, gateway_workers=2)
    specs = pool_plan(shape, addresses, RayOptions(), "info", {"PDBUS__X": "1"})
    assert [(s.name, s.kind, s.stage) for s in specs] == [
        ("broker-0", "broker", 0), ("broker-1", "broker", 0), ("prefill-0", "prefill", 1),
        ("decode-0", "decode", 1), ("decode-1", "decode", 1), ("gateway", "gateway", 1)]
    assert [_flag(s.argv, "--endpoint") for s in specs[:2]] == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"]
    for spec in specs:
        assert _flag(spec.argv, "--config") == CONFIG_SLOT and spec.env == {"PDBUS__X": "1"}
        assert "--broker" not in spec.argv if spec.kind == "broker" else (
            _flag(spec.argv, "--broker") == "tcp://127.0.0.1:5555,tcp://127.0.0.1:5556")
    assert _flag(specs[3].argv, "--node-id") == "decode-0" and specs[3].argv[3] == "decode"
    assert _flag(specs[-1].argv, "--workers") == "2"
    assert [s.ready_event for s in (specs[0], specs[2], specs[-1])] == ["broker_started", "registered",
                                                                          "gateway_started"]


def test_resources_come_from_the_options_and_only_nodes_spread():
    options = RayOptions(broker_cpus=0.25, node_cpus=2, node_gpus=1, gateway_cpus=0.5,
                         broker_resources={"pin": 1}, node_resources={"big": 1})
    specs = pool_plan(ClusterShape(num_colocated=1, gateway=True), ONE, options)
    requests = [(s.kind, s.num_cpus, s.num_gpus, dict(s.resources), s.spread, s.is_node) for s in specs]
    assert requests == [("broker", 0.25, 0.0, {"pin": 1}, False, False), ("both", 2, 1, {"big": 1}, True, True),
                        ("gateway", 0.5, 0.0, {}, False, False)]


def test_actor_options_name_detach_restart_and_place():
    spec = node_component("decode", "decode-3", ClusterShape(model="tiny"), ONE, RayOptions(node_resources={"r": 1}))
    options = actor_options(spec, "pdbus")
    assert options == {"name": "decode-3", "namespace": "pdbus", "lifetime": "detached", "max_restarts": -1,
                       "max_task_retries": 0, "num_cpus": 1.0, "num_gpus": 0.0, "max_concurrency": 4,
                       "resources": {"r": 1}, "scheduling_strategy": "SPREAD"}
    broker = pool_plan(ClusterShape(), ONE, RayOptions())[0]
    assert "scheduling_strategy" not in actor_options(broker, "pdbus") and "resources" not in actor_options(broker, "x")


def test_names_tell_the_pool():
    assert [kind_of(n) for n in ("broker", "broker-1", "decode-10", "both-0", "gateway")] == [
        "broker", "broker", "decode", "both", "gateway"]


def test_a_local_head_stays_on_loopback_and_ray_is_told_so():
    argv = local_head_argv("ray", RayOptions(head_port=7001), 4)
    assert argv[:3] == ["ray", "start", "--head"]
    assert {"--node-ip-address=127.0.0.1", "--port=7001", "--include-dashboard=false", "--num-cpus=4"} <= set(argv)
    assert ray_environment(None) == ray_environment("127.0.0.1:6379") == ray_environment("auto") == {
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    assert ray_environment("10.0.0.1:6379") == {"RAY_USAGE_STATS_ENABLED": "0"}


def test_environment_forwarded_to_every_process_and_cpus_of_a_local_head():
    env = forwarded_env(RayOptions(env={"OMP_NUM_THREADS": "1"}), {"PDBUS__ENGINE__MODEL": "tiny", "HOME": "/x"})
    assert env == {"PDBUS__ENGINE__MODEL": "tiny", "OMP_NUM_THREADS": "1"}
    specs = pool_plan(ClusterShape(num_prefill=40, num_decode=40), ONE, RayOptions())
    assert cpus_needed(specs) == 81   # 80 nodes + half a broker, rounded up


def test_node_args_reach_every_node_and_only_nodes():
    options = RayOptions.from_settings({"ray": {"node_args": ["--switchable"]}})
    specs = pool_plan(ClusterShape(num_prefill=1, num_decode=1, gateway=True), ONE, options)
    assert ["--switchable" in s.argv for s in specs] == [False, True, True, False]
    assert "--switchable" in node_component("decode", "decode-5", ClusterShape(), ONE, options).argv
    with pytest.raises(SettingsError):
        RayOptions.from_settings({"ray": {"node_args": "--switchable"}})
