"""The body of a component's Ray actor, with real child processes and no Ray: readiness from the
child's log, restart after a crash, no restart after exit 0 or a drain, the role a node switched
to kept across restarts (and, through the role book, across a reconstructed actor), and the child dying with its actor's process (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nodes.ray_pools.component_runner import ComponentRunner, config_path, resolve_argv
from nodes.ray_pools.pool_plan import CONFIG_SLOT, ComponentSpec
from nodes.ray_pools.supervision import RestartPolicy

CONFIG = "[engine]\nmodel = 'tiny'\n"
FAST = RestartPolicy(base_delay_s=0.05, max_delay_s=0.2, healthy_after_s=30.0)

# A stand-in component: logs its argv and config as JSON events, then does what FAKE_PLAN says
# for this start (counted in a file): "ready" then sleep, "crash", "exit0", "switch" (to decode).
FAKE = textwrap.dedent("""
    import json, os, pathlib, sys, time
    log = lambda **e: print(json.dumps(e), file=sys.stderr, flush=True)
    count = pathlib.Path(os.environ["FAKE_COUNT"])
    n = int(count.read_text()) if count.exists() else 0
    count.write_text(str(n + 1))
    plan = os.environ["FAKE_PLAN"].split(",")
    step = plan[min(n, len(plan) - 1)]
    log(event="argv", argv=sys.argv[1:], config=pathlib.Path(sys.argv[-1]).read_text())
    if step == "crash":
        sys.exit(3)
    if step == "exit0":
        sys.exit(0)
    if step == "switch":
        log(event="role_switched", role="decode")
        sys.exit(1)
    log(event="registered")
    time.sleep(60)
""")


def _runner(tmp_path, plan: str, name: str = "prefill-0", roles=None) -> ComponentRunner:
    argv = ("python", "-c", FAKE, "nodes.cli", "prefill", CONFIG_SLOT)
    spec = ComponentSpec(name, "prefill", argv, 1.0,
                         env={"FAKE_PLAN": plan, "FAKE_COUNT": str(tmp_path / "count")})
    return ComponentRunner(spec, CONFIG, policy=FAST, where=lambda: {"ray_node": "n1"}, roles=roles)


def _until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError("not reached in time")


def _argv_events(runner: ComponentRunner) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in runner.tail() if '"argv"' in line]


@pytest.fixture
def runners():
    started: list[ComponentRunner] = []
    yield started
    for runner in started:
        runner.close()


def test_the_argv_is_made_for_this_host():
    assert resolve_argv(("/driver/python", "-m", "nodes.cli", "--config", CONFIG_SLOT), "/tmp/c.toml") == (
        sys.executable, "-m", "nodes.cli", "--config", "/tmp/c.toml")


def test_ready_from_the_log_with_the_config_written_on_this_host(tmp_path, runners):
    runners.append(runner := _runner(tmp_path, "ready"))
    info = _until(lambda: (i := runner.info())["ready"] and i)
    assert info["name"] == "prefill-0" and info["ray_node"] == "n1" and info["pid"] and info["restarts"] == 0
    assert json.loads(runner.tail()[0])["config"] == CONFIG
    assert runner.config_path == config_path("prefill-0", CONFIG) and runner.config_path.exists()


def test_a_crashed_process_is_started_again_until_it_serves(tmp_path, runners):
    runners.append(runner := _runner(tmp_path, "crash,crash,ready"))
    info = _until(lambda: (i := runner.info())["ready"] and i)
    assert info["restarts"] == 2 and info["last_exit"] == 3


def test_exit_zero_stays_down(tmp_path, runners):
    runners.append(runner := _runner(tmp_path, "exit0,ready"))
    assert runner.wait_exited(10)
    assert runner.info()["state"] == "exited" and runner.info()["pid"] is None
    assert (tmp_path / "count").read_text() == "1"


def test_a_drain_is_sigterm_and_the_process_is_not_started_again(tmp_path, runners):
    runners.append(runner := _runner(tmp_path, "ready"))
    pid = _until(lambda: runner.info()["ready"] and runner.info()["pid"])
    runner.drain()
    assert runner.wait_exited(10)
    assert runner.info()["last_exit"] == -signal.SIGTERM and runner.info()["state"] == "exited"
    assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def test_a_node_that_switched_role_restarts_in_its_new_role(tmp_path, runners):
    runners.append(runner := _runner(tmp_path, "switch,ready"))
    _until(lambda: runner.info()["ready"])
    first, second = _argv_events(runner)
    assert first[:2] == ["nodes.cli", "prefill"] and second[:2] == ["nodes.cli", "decode"]
    assert runner.info()["role"] == "decode"


class DictRoleBook(dict):
    def recall(self, name: str) -> str | None:
        return self.get(name)

    def remember(self, name: str, role: str) -> None:
        self[name] = role


def test_a_switch_is_written_to_the_role_book_and_a_new_runner_starts_in_that_role(tmp_path, runners):
    book = DictRoleBook()
    runners.append(runner := _runner(tmp_path, "switch,ready", roles=book))
    _until(lambda: runner.info()["ready"])
    assert book == {"prefill-0": "decode"}
    runner.close()
    # The actor Ray reconstructs elsewhere: same spec (planned prefill), the book says decode.
    runners.append(again := _runner(tmp_path, "ready", roles=book))
    _until(lambda: again.info()["ready"])
    assert _argv_events(again)[0][:2] == ["nodes.cli", "decode"] and again.info()["role"] == "decode"


def test_a_role_book_entry_that_is_not_a_node_role_is_ignored(tmp_path, runners):
    runners.append(runner := _runner(tmp_path, "ready", roles=DictRoleBook({"prefill-0": "broker"})))
    _until(lambda: runner.info()["ready"])
    assert _argv_events(runner)[0][:2] == ["nodes.cli", "prefill"]


def test_the_process_dies_with_the_actor_process(tmp_path):
    """A lost raylet kills its actor workers; their components must not outlive them."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from tests.nodes.ray_pools.test_component_runner import _runner, _until
        from pathlib import Path
        runner = _runner(Path({str(tmp_path)!r}), "ready")
        print(_until(lambda: runner.info()["ready"] and runner.info()["pid"]), flush=True)
        time.sleep(60)
    """)
    actor = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(actor.stdout.readline())
        actor.send_signal(signal.SIGKILL)
        actor.wait(10)
        _until(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), timeout=10)
    finally:
        actor.kill()
        config_path("prefill-0", CONFIG).unlink(missing_ok=True)   # its runner never closed


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
