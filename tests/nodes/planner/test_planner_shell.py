"""The planner's shell with a fake `control` endpoint and a fake actuator: each decision logged and
carried out the right way, scale-ups it cannot do reported as wanted, dry runs, failures contained."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from bus.mailbox import BusError
from nodes.planner.actuator import BusOnlyActuator
from nodes.planner.planner_shell import PlannerShell
from scheduler.planner import Decision, DecisionKind, Planner
from scheduler.planner_config import PlannerConfig
from tests.conftest import FakeClock
from tests.nodes.planner.planner_fakes import FakeActuator, FakeEndpoint
from tests.scheduler.planner_helpers import decode_cap, pools, prefill_cap

AT_ONCE = PlannerConfig(sustain_s=0, cooldown_s=0, interval_s=0.01, max_nodes=3)
HOT_PREFILL = prefill_cap(queued=5 * 2048)
HOT_DECODE_BODY = pools([prefill_cap(0)], [decode_cap(2)], queued_decode=3)
SWITCH_BODY = pools([HOT_PREFILL], [decode_cap(0, switchable=1), decode_cap(3, switchable=1)])
IDLE_BODY = pools([prefill_cap(0)], [decode_cap(0), decode_cap(1)])


def shell_for(bodies, actuator=None, config=AT_ONCE, **options) -> tuple[PlannerShell, FakeEndpoint]:
    endpoint = FakeEndpoint(bodies)
    shell = PlannerShell(Planner(config), endpoint, actuator or FakeActuator(), clock=FakeClock(), **options)
    return shell, endpoint


async def test_a_switch_is_a_control_role_command_to_the_node():
    shell, endpoint = shell_for([SWITCH_BODY])
    with capture_logs() as events:
        decision, = await shell.tick()
    assert decision.kind is DecisionKind.SWITCH_ROLE
    assert endpoint.controls == [("decode-0", {"action": "role", "role": "prefill"})]
    logged, = [e for e in events if e["event"] == "planner_decision"]
    assert (logged["kind"], logged["role"], logged["node_id"]) == ("switch_role", "prefill", "decode-0")
    assert "least-loaded switchable decode node" in logged["reason"]
    assert all(stream.cancelled for stream in endpoint.streams)


async def test_a_scale_down_goes_through_the_actuator():
    actuator = FakeActuator()
    shell, endpoint = shell_for([IDLE_BODY], actuator)
    await shell.tick()
    assert actuator.stops == ["decode-0"] and endpoint.controls == []


async def test_the_bus_only_actuator_drains_by_control():
    endpoint = FakeEndpoint([IDLE_BODY])
    shell = PlannerShell(Planner(AT_ONCE), endpoint, BusOnlyActuator(endpoint), clock=FakeClock())
    await shell.tick()
    assert endpoint.controls == [("decode-0", {"action": "drain"})]


async def test_a_scale_up_the_actuator_cannot_do_is_logged_as_wanted():
    endpoint = FakeEndpoint([HOT_DECODE_BODY])
    shell = PlannerShell(Planner(AT_ONCE), endpoint, BusOnlyActuator(endpoint), clock=FakeClock())
    with capture_logs() as events:
        decision, = await shell.tick()
    wanted, = [e for e in events if e["event"] == "planner_wanted"]
    assert (wanted["role"], wanted["reason"]) == ("decode", decision.reason)
    assert shell.counts["wanted.decode"] == 1 and endpoint.controls == []
    await shell.tick()   # not waiting for a node that will never come: only the (zero) cooldown held it
    assert shell.planner.metrics["held.waiting"] == 0 and shell.counts["wanted.decode"] == 2


async def test_a_started_node_is_the_one_the_planner_waits_for():
    actuator = FakeActuator(start_as="decode-7")
    shell, _ = shell_for([HOT_DECODE_BODY], actuator)
    await shell.tick()
    assert actuator.starts == ["decode"]
    assert await shell.tick() == [] and shell.planner.metrics["held.waiting"] == 1


async def test_a_dry_run_carries_nothing_out():
    actuator = FakeActuator()
    shell, endpoint = shell_for([SWITCH_BODY], actuator, dry_run=True)
    with capture_logs() as events:
        assert len(await shell.tick()) == 1
        assert len(await shell.tick()) == 1   # nothing pending: decided again after the cooldown
    assert endpoint.controls == [] and actuator.starts == actuator.stops == []
    assert [e["event"] for e in events].count("planner_decision") == 2


@pytest.mark.parametrize("failure", ["control", "actuator"])
async def test_a_failed_action_is_logged_and_counted_and_the_planner_goes_on(failure):
    actuator = FakeActuator(error=RuntimeError("no capacity") if failure == "actuator" else None)
    shell, endpoint = shell_for([SWITCH_BODY if failure == "control" else HOT_DECODE_BODY], actuator)
    endpoint.control_error = ValueError("body too big") if failure == "control" else None
    with capture_logs() as events:
        decision, = await shell.tick()
    failed, = [e for e in events if e["event"] == "planner_action_failed"]
    assert failed["kind"] == str(decision.kind) and "Error" in failed["error"]
    assert shell.counts[f"failed_actions.{decision.kind}"] == 1
    assert len(await shell.tick()) == 1


@pytest.mark.parametrize("answer", [TimeoutError(), BusError("r", "overloaded", "busy"), ["not", "a", "map"]])
async def test_no_usable_answer_from_the_broker_decides_nothing(answer):
    shell, _ = shell_for([answer])
    with capture_logs() as events:
        assert await shell.tick() == []
    assert shell.counts["no_stats"] == 1 and events[0]["event"] == "planner_no_stats"
    assert shell.planner.metrics["snapshots"] == 0


async def test_an_unregistered_endpoint_asks_nothing():
    shell, endpoint = shell_for([SWITCH_BODY])
    endpoint.registered = False
    assert await shell.tick() == [] and endpoint.streams == []


async def test_run_ticks_every_interval_until_stopped_and_survives_a_bad_tick():
    shell, endpoint = shell_for([IDLE_BODY], config=PlannerConfig(interval_s=0.01, sustain_s=3600))
    stop, calls = asyncio.Event(), []
    real_tick = shell.tick

    async def tick():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a bug")
        if len(calls) == 4:
            stop.set()
        return await real_tick()

    shell.tick = tick
    with capture_logs() as events:
        await asyncio.wait_for(shell.run(stop), 5)
    assert len(calls) == 4 and "planner_tick_failed" in [e["event"] for e in events]


class HoldingPlanner(Planner):
    """Holds the same switch for regret on every round but the third."""

    def __init__(self) -> None:
        super().__init__(AT_ONCE)
        self.rounds = 0

    def decide(self, snapshot, now, can_start=True):
        self.rounds += 1
        held = Decision(DecisionKind.SWITCH_ROLE, "prefill", "decode-0", "prefill hot; held: layout (1, 1, 0) ...")
        self.held_back = None if self.rounds == 3 else held
        return []


async def test_a_switch_held_for_regret_is_logged_once_per_holding():
    endpoint = FakeEndpoint([SWITCH_BODY] * 5)
    shell = PlannerShell(HoldingPlanner(), endpoint, FakeActuator(), clock=FakeClock())
    with capture_logs() as events:
        for _ in range(5):
            await shell.tick()
    held = [e for e in events if e["event"] == "planner_held"]
    assert len(held) == 2      # rounds 1 and 4: the holding started twice
    assert (held[0]["kind"], held[0]["role"], held[0]["node_id"]) == ("switch_role", "prefill", "decode-0")
    assert "held: layout" in held[0]["reason"] and endpoint.controls == []
