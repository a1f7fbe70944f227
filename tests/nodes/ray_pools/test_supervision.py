"""A component process's lifecycle inside its actor: restart with back-off after a crash, stay
down after exit 0 or a stop, follow a role switch (pure: driven by hand with a fake clock)."""

from __future__ import annotations

from nodes.ray_pools.supervision import RestartPolicy, Supervision, argv_for_role

POLICY = RestartPolicy(base_delay_s=0.5, max_delay_s=4.0, healthy_after_s=30.0)


def _started(role: str = "decode") -> Supervision:
    supervision = Supervision("registered", role, POLICY)
    supervision.started(0.0)
    return supervision


def test_ready_once_its_event_is_logged_and_only_then():
    supervision = _started()
    supervision.observe({"event": "node_started"})
    assert supervision.snapshot() == {"state": "starting", "role": "decode", "restarts": 0, "last_exit": None,
                                      "ready": False}
    supervision.observe({"event": "registered"})
    assert supervision.snapshot()["ready"] and supervision.state == "ready"


def test_a_crash_loop_backs_off_and_a_process_that_ran_a_while_restarts_at_once(clock):
    supervision = _started()
    delays = []
    for _ in range(5):
        delays.append(supervision.exited(-9, clock.advance(1.0)))
        supervision.started(clock.now)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert supervision.restarts == 5 and supervision.state == "starting"
    assert supervision.exited(1, clock.advance(31.0)) == 0.5   # it had served: the streak starts again
    assert supervision.snapshot()["last_exit"] == 1 and supervision.keeps_running


def test_exit_zero_is_a_drain_and_it_stays_down():
    supervision = _started()
    assert supervision.exited(0, 5.0) is None
    assert supervision.state == "exited" and not supervision.keeps_running


def test_after_a_stop_request_no_exit_restarts_it():
    supervision = _started()
    supervision.observe({"event": "registered"})
    supervision.stop_requested()
    assert supervision.state == "stopping" and not supervision.keeps_running
    assert supervision.exited(-9, 1.0) is None and supervision.state == "exited"


def test_a_role_switch_is_followed_and_survives_restarts():
    supervision = _started("prefill")
    supervision.observe({"event": "role_switched", "role": "decode"})
    supervision.observe({"event": "role_switched", "role": "gateway"})   # not a node role: ignored
    assert supervision.role == "decode"
    argv = ("python", "-m", "nodes.cli", "prefill", "--node-id", "prefill-0", "--log-format", "json")
    assert argv_for_role(argv, supervision.role) == ("python", "-m", "nodes.cli", "decode", "--node-id",
                                                     "prefill-0", "--log-format", "json")
    assert argv_for_role(("python", "-m", "nodes.cli", "node", "--role", "both"), "decode")[3] == "node"
    assert argv_for_role(("python", "-m", "nodes.cli", "broker"), "decode")[3] == "broker"
