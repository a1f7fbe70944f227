"""`pdbus planner`: its flags, the `[planner]` table with the shell's keys, the `control` endpoint,
and the planner on a thread of its own (as the launcher runs it)."""

from __future__ import annotations

import time

import pytest

from nodes.cli import build_parser, main
from nodes.config_file import SettingsError
from nodes.planner.planner_run import PlannerOptions, PlannerThread, control_endpoint, planner_options
from nodes.planner.planner_shell import PlannerShell
from scheduler.planner import Planner
from scheduler.planner_config import PlannerConfig
from tests.nodes.planner.planner_fakes import FakeActuator, FakeEndpoint
from tests.scheduler.planner_helpers import decode_cap, pools, prefill_cap


def test_the_command_takes_its_flags():
    args = build_parser("planner").parse_args(["planner", "--config", "c.toml", "--interval", "2",
                                               "--metrics-port", "9100", "--dry-run", "--broker", "tcp://h:1"])
    assert (args.config, args.interval, args.metrics_port, args.dry_run, args.broker) == (
        "c.toml", 2.0, 9100, True, "tcp://h:1")
    assert build_parser("planner").parse_args(["planner"]).node_id == "planner"


def test_options_split_the_table_between_the_shell_and_the_core():
    settings = {"planner": {"max_decode": 6, "max_nodes": 8, "metrics_port": 9100, "metrics_host": "0.0.0.0",
                            "stats_timeout_s": 1}}
    options = planner_options(settings, interval_s=2.5)
    assert options == PlannerOptions(PlannerConfig(max_decode=6, max_nodes=8, interval_s=2.5), "0.0.0.0", 9100, 1.0)
    assert planner_options(settings, metrics_port=0).metrics_port == 0
    assert planner_options({}).metrics_port is None


@pytest.mark.parametrize("table", [{"metrics_port": 70000}, {"metrics_port": "x"}, {"stats_timeout_s": 0},
                                   {"typo": 1}, {"min_decode": 0}])
def test_bad_options_are_settings_errors(table):
    with pytest.raises(SettingsError):
        planner_options({"planner": table})


def test_a_bad_planner_table_exits_2_with_one_line(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("[planner]\nmax_nodse = 3\n")
    assert main(["planner", "--config", str(config)]) == 2
    assert "unknown keys: max_nodse" in capsys.readouterr().err


def test_the_endpoint_registers_as_planner_in_role_control():
    endpoint = control_endpoint({}, "tcp://127.0.0.1:5555")
    assert (endpoint.node_id, endpoint.role) == ("planner", "control")


class StartableEndpoint(FakeEndpoint):
    def start(self) -> StartableEndpoint:
        self.started = True
        return self

    def wait_registered(self, timeout: float) -> bool:
        return True

    def stop(self) -> None:
        self.stopped = True


def test_the_planner_thread_runs_rounds_until_stopped():
    body = pools([prefill_cap(0)], [decode_cap(0), decode_cap(0)])
    endpoint = StartableEndpoint([body])
    options = PlannerOptions(PlannerConfig(interval_s=0.01, sustain_s=0, cooldown_s=0), metrics_port=0)
    actuator = FakeActuator()
    thread = PlannerThread(options, lambda broker: endpoint,
                           lambda e: PlannerShell(Planner(options.config), e, actuator))
    thread.start("tcp://127.0.0.1:1")
    deadline = time.monotonic() + 5
    while not actuator.stops and time.monotonic() < deadline:
        time.sleep(0.01)
    thread.stop()
    assert actuator.stops[0] == "decode-0" and endpoint.stopped and thread.endpoint is None
    thread.stop()   # idempotent
