"""ClusterPolicy without sockets: decode placement (bounded-load ring, sticky sessions, full
nodes skipped, deferral and overload), prefill least-loaded placement, join/leave remapping
against the ideal, determinism across broker restarts, settings."""

from __future__ import annotations

from collections import Counter

import pytest

from bus.routing import Defer, Refuse
from nodes.config_file import load_settings, section
from scheduler.policy import ClusterPolicy, SchedulerSettings
from scheduler.simulation import (
    SimCluster,
    balance,
    node_ids,
    remap_on_join,
    remap_on_join_busy,
    remap_on_leave,
    session_ids,
)

FULL_KV = {"kv_blocks_total": 100, "kv_blocks_free": 0}
ROOMY_KV = {"kv_blocks_total": 100, "kv_blocks_free": 50, "max_running": 8, "num_running": 0}


def _cluster(num_nodes=4, **settings):
    return SimCluster(ClusterPolicy(SchedulerSettings(**settings)), node_ids(num_nodes))


# -- settings ---------------------------------------------------------------------------------

def test_settings_come_from_the_scheduler_section_of_the_shipped_config(repo_root):
    values = section(load_settings(repo_root / "config" / "local.toml", environ={}), "scheduler")
    settings = SchedulerSettings.from_settings(values)
    assert (settings.vnodes, settings.epsilon, settings.queue_size) == (
        values["vnodes"], values["epsilon"], values["queue_size"])
    assert settings.queue_timeout_s == values["queue_timeout_s"]


def test_the_multihost_example_is_valid_toml_with_valid_scheduler_settings(repo_root):
    settings = load_settings(repo_root / "config" / "multihost.example.toml", environ={})
    assert SchedulerSettings.from_settings(section(settings, "scheduler")).queue_size == 256
    assert not settings["kv"]["data_bind"].startswith(("tcp://127.", "tcp://0.0.0.0"))


def test_the_broker_command_builds_the_policy_from_the_scheduler_section():
    from bus.routing import LeastOutstandingPolicy
    from nodes.commands.broker_cmd import routing_policy
    from nodes.config_file import SettingsError

    policy = routing_policy({"scheduler": {"epsilon": 0.5, "vnodes": 16}})
    assert isinstance(policy, ClusterPolicy) and (policy.ring.epsilon, policy.ring.num_vnodes) == (0.5, 16)
    assert isinstance(routing_policy({}, "least-outstanding"), LeastOutstandingPolicy)
    with pytest.raises(SettingsError, match="scheduler"):
        routing_policy({"scheduler": {"epsilon": 0}})
    with pytest.raises(SettingsError, match="scheduler"):
        routing_policy({"scheduler": {"queue_size": "many"}})


@pytest.mark.parametrize("bad", [{"queue_size": -1}, {"queue_timeout_s": 0}, {"retry_after_s": -1}])
def test_impossible_queue_settings_are_refused(bad):
    with pytest.raises(ValueError, match="scheduler"):
        SchedulerSettings.from_settings(bad)


# -- balance and remapping ---------------------------------------------------------------------

def test_bounded_loads_cap_the_busiest_node_where_the_plain_ring_does_not():
    plain = balance(8, 4000, vnodes=8)
    bounded = balance(8, 4000, epsilon=0.1, vnodes=8)
    assert plain > 1.3
    assert bounded <= 1.1 + 8 / 4000      # ceil() may add one stream to the bound


def test_a_joining_node_takes_only_its_share_of_new_sessions_and_none_of_the_live_ones():
    remap = remap_on_join(4, 4000)
    assert remap.moved == 0.0                               # sticky: live sessions stay put
    assert abs(remap.new_share - remap.ideal) < 0.3 * remap.ideal
    assert abs(remap.restart_moved - remap.ideal) < 0.3 * remap.ideal   # no session table: ~1/(N+1)


def test_a_node_joining_a_busy_cluster_takes_only_what_the_bound_pushes_off_the_others():
    moved, ratio = remap_on_join_busy(4, 2000, epsilon=0.1)
    assert 0.05 < moved < 0.2        # some sessions give up their node; fewer than a full 1/(N+1)
    assert ratio <= 1.1 + 5 / 2000 + 0.01


def test_a_leaving_node_moves_only_its_own_sessions():
    remap = remap_on_leave(5, 4000)
    assert abs(remap.moved - remap.ideal) < 0.3 * remap.ideal
    assert remap.restart_moved == remap.moved


def test_the_departed_nodes_sessions_are_spread_over_the_survivors():
    cluster = _cluster(4)
    placed = {s: cluster.request("decode", s).node_id for s in session_ids(2000)}
    cluster.finish_all()
    cluster.leave("decode-0")
    moved_to = Counter(cluster.request("decode", s).node_id for s, n in placed.items() if n == "decode-0")
    assert set(moved_to) == {"decode-1", "decode-2", "decode-3"}
    assert cluster.policy.metrics["sessions.moved"] == sum(moved_to.values())
    assert cluster.policy.metrics["sessions.orphaned"] == sum(moved_to.values())


def test_same_nodes_give_the_same_placements_after_a_broker_restart():
    def placements(order):
        cluster = SimCluster(ClusterPolicy(), order)
        return [cluster.request("decode", s).node_id for s in session_ids(500)]
    nodes = node_ids(5)
    assert placements(nodes) == placements(list(reversed(nodes)))


# -- decode placement --------------------------------------------------------------------------

def test_a_session_stays_on_its_node_even_when_others_are_idler():
    cluster = _cluster(3)
    home = cluster.request("decode", "chat-1")
    home.num_outstanding = 4                      # other sessions' streams: over the bound, within the slack
    for _ in range(5):                            # turn after turn, one at a time
        assert cluster.request("decode", "chat-1") is home
        home.num_outstanding -= 1
    assert cluster.policy.metrics["sessions.sticky"] == 5


def test_a_session_leaves_a_node_that_is_over_the_load_bound():
    cluster = _cluster(2, epsilon=0.25)
    home = cluster.request("decode", "chat-1")
    home.num_outstanding = 6                      # bound: ceil(1.25 * 7 / 2) = 5; 6 - 0 > slack 4
    other = cluster.request("decode", "chat-1")
    assert other is not home
    assert (cluster.policy.metrics["sessions.over_bound"], cluster.policy.metrics["sessions.moved"]) == (1, 1)


def test_streams_another_broker_placed_count_through_the_nodes_report():
    """With several brokers each routes only its own streams; the node's `num_running` report
    counts them all, so a node another broker loaded is over this broker's bound too."""
    cluster = _cluster(2, epsilon=0.25)
    home = cluster.request("decode", "chat-1")
    home.num_outstanding = 0                      # this broker: nothing outstanding there
    cluster.report(home.node_id, **{**ROOMY_KV, "max_running": 64, "num_running": 6})
    assert cluster.request("decode", "chat-1") is not home
    assert cluster.policy.metrics["sessions.over_bound"] == 1


def test_a_full_node_is_skipped_and_its_session_moves_until_it_has_room():
    cluster = _cluster(3)
    home = cluster.request("decode", "chat-1")
    cluster.report(home.node_id, **FULL_KV)
    other = cluster.request("decode", "chat-1")
    assert other is not home
    assert cluster.policy.metrics["sessions.moved"] == 1
    cluster.report(home.node_id, **ROOMY_KV)
    assert cluster.request("decode", "chat-1") is other     # sticky to where its KV now is


def test_a_draining_node_gets_nothing_new_and_its_sessions_move():
    """A drain or role switch in progress: the node stays on the ring (its leave comes later) but
    is never chosen, for a session that lived there or a new one (regression: the ring's choice
    of a draining node raised KeyError and failed the request, 12-05 elasticity run)."""
    cluster = _cluster(3)
    homes = {session: cluster.request("decode", session).node_id for session in session_ids(300)}
    cluster.report("decode-1", draining=1)
    for session in session_ids(300):
        assert cluster.request("decode", session).node_id != "decode-1"
    assert cluster.request("decode", "").node_id != "decode-1"
    assert cluster.policy.metrics["skipped_draining"] == 301
    assert any(home == "decode-1" for home in homes.values())
    for node_id in ("decode-0", "decode-2"):
        cluster.report(node_id, draining=1)
    with pytest.raises(Defer):   # every decode node draining: wait for one to come back or join
        cluster.request("decode", "s")
    cluster.join("p-0", "prefill", draining=1)
    assert cluster.policy.choose("prefill", "", "r", [cluster.nodes["p-0"]]) is None   # -> no_node


def test_running_at_max_running_is_full_by_report_or_by_routed_streams():
    cluster = _cluster(2)
    cluster.report("decode-0", max_running=2, num_running=2)
    cluster.report("decode-1", max_running=2, num_running=0)
    assert {cluster.request("decode", f"s{i}").node_id for i in range(2)} == {"decode-1"}
    with pytest.raises(Defer):   # decode-1 now runs 2 streams the broker routed
        cluster.request("decode", "s3")


def test_nodes_that_report_no_kv_budget_are_never_full():
    cluster = _cluster(1)
    cluster.report("decode-0", kv_blocks_total=0, kv_blocks_free=0, max_running=0)
    assert all(cluster.request("decode", f"s{i}").node_id == "decode-0" for i in range(50))


def test_a_node_that_says_full_is_skipped_whatever_its_free_blocks():
    cluster = _cluster(2)
    home = cluster.request("decode", "chat")
    cluster.report(home.node_id, **ROOMY_KV, full=1)      # refused a prompt too long for its room
    assert cluster.request("decode", "chat") is not home


def test_min_free_blocks_sets_the_full_threshold():
    cluster = _cluster(1, min_free_blocks=4)
    cluster.report("decode-0", kv_blocks_total=100, kv_blocks_free=3)
    with pytest.raises(Defer):
        cluster.request("decode", "s")


def test_all_full_defers_with_the_queue_settings():
    cluster = _cluster(2, queue_size=7, queue_timeout_s=3.0, retry_after_s=0.5)
    for node_id in cluster.nodes:
        cluster.report(node_id, **FULL_KV)
    with pytest.raises(Defer) as deferred:
        cluster.request("decode", "s")
    assert (deferred.value.max_queued, deferred.value.timeout_s, deferred.value.retry_after_s) == (7, 3.0, 0.5)
    assert "all 2 decode nodes are full" in deferred.value.message
    assert cluster.policy.metrics["decode.all_full"] == 1


def test_all_full_without_a_queue_is_an_overload_refusal():
    cluster = _cluster(1, queue_size=0, retry_after_s=2.0)
    cluster.report("decode-0", **FULL_KV)
    with pytest.raises(Refuse) as refused:
        cluster.request("decode", "s")
    assert (refused.value.code, refused.value.details) == ("overloaded", {"retry_after_s": 2.0})
    assert cluster.policy.metrics["decode.overloaded"] == 1


def test_a_full_sessions_request_spills_even_past_the_load_bound():
    cluster = _cluster(2, epsilon=0.01)
    for i in range(10):
        cluster.request("decode", f"s{i}")
    cluster.report("decode-0", **FULL_KV)
    assert cluster.request("decode", "late").node_id == "decode-1"


def test_a_request_without_a_session_is_placed_but_not_remembered():
    cluster = _cluster(3)
    cluster.request("decode", "")
    assert len(cluster.policy.sessions) == 0


def test_both_nodes_sit_on_the_ring_and_gateways_do_not():
    cluster = SimCluster(ClusterPolicy())
    cluster.join("colo", "both")
    cluster.join("prefill-only", "prefill")
    assert cluster.policy.ring.nodes == {"colo"}
    assert cluster.request("decode", "s").node_id == "colo"


def test_candidates_the_policy_never_saw_join_are_no_node_rather_than_full():
    stranger = SimCluster(ClusterPolicy(), ["decode-0"]).nodes["decode-0"]
    assert ClusterPolicy().choose("decode", "s", "r1", [stranger]) is None


def test_placements_are_counted_per_service_and_node():
    cluster = _cluster(1)
    cluster.request("decode", "s")
    cluster.request("decode", "s")
    metrics = cluster.policy.metrics
    assert (metrics["placed.decode.decode-0"], metrics["sessions.new"], metrics["sessions.sticky"]) == (2, 1, 1)


# -- prefill placement -------------------------------------------------------------------------

def _prefill_cluster(*queued_tokens):
    cluster = SimCluster(ClusterPolicy(SchedulerSettings(prefill_tokens_estimate=100)))
    for i, tokens in enumerate(queued_tokens):
        cluster.join(f"prefill-{i}", "prefill", queued_tokens=tokens)
    return cluster


def test_prefill_goes_to_the_node_with_the_fewest_queued_tokens():
    cluster = _prefill_cluster(900, 100, 500)
    assert cluster.request("prefill").node_id == "prefill-1"


def test_tokens_routed_since_the_last_report_count_until_the_next_report():
    cluster = _prefill_cluster(0, 0)
    placed = [cluster.request("prefill", "300").node_id for _ in range(4)]
    assert Counter(placed) == {"prefill-0": 2, "prefill-1": 2}
    cluster.report("prefill-0", queued_tokens=0)     # prefill-0 caught up; prefill-1 did not report
    assert cluster.request("prefill", "300").node_id == "prefill-0"


def test_a_numeric_key_is_the_prompt_length_otherwise_the_estimate_is_used():
    cluster = _prefill_cluster(0, 150)
    assert cluster.request("prefill", "1000").node_id == "prefill-0"    # 1000 vs 150
    assert cluster.request("prefill", "").node_id == "prefill-1"        # 1000 vs 150 + 100
    assert cluster.request("prefill", "").node_id == "prefill-1"        # 1000 vs 250 + 100


def test_a_departed_prefill_node_is_forgotten():
    cluster = _prefill_cluster(0, 0)
    cluster.request("prefill", "500")
    cluster.leave("prefill-0")
    cluster.join("prefill-0", "prefill", queued_tokens=0)
    assert cluster.policy.prefill_loads.outstanding_tokens(cluster.nodes["prefill-0"]) == 0


def test_other_services_go_to_the_least_busy_node():
    cluster = SimCluster(ClusterPolicy(), node_ids(2), role="both")
    cluster.request("both")
    assert cluster.request("both").node_id == "decode-1"
