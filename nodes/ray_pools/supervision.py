"""One component process's lifecycle inside its Ray actor, as a pure object (no processes, no clock).

Contract: `Supervision(ready_event, role, policy)`; the runner reports what happens and asks what
to do:
- `started(now)`: a process was spawned (state `starting`); `observe(event)` with each of its
  JSON log events: the ready event (`registered`, `broker_started`, `gateway_started`) makes it
  `ready`; a node's `role_switched` (with `role`) changes `role`, so a restart comes back in the
  role the node had switched to (`argv_for_role`).
- `exited(code, now) -> float | None`: the delay before starting it again, or None to leave it
  down. Exit 0 means asked to leave (a drain, `down`): it stays `exited`. So does any exit once
  `stop_requested()` was called. Any other exit is a crash: `backing_off`, restarted after
  `policy.delay(streak)` (0.5 s doubling to 10 s); a process that had run `healthy_after_s`
  (30 s) resets the streak, so a crash loop backs off and a rare crash restarts at once.
- `snapshot() -> dict`: state, role, restarts, last exit code, ready — for `pdbus ray status`.
States: starting -> ready -> (backing_off -> starting)* -> stopping -> exited.
"""

from __future__ import annotations

from dataclasses import dataclass

SWITCHABLE_ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class RestartPolicy:
    base_delay_s: float = 0.5
    max_delay_s: float = 10.0
    healthy_after_s: float = 30.0

    def delay(self, streak: int) -> float:
        return min(self.max_delay_s, self.base_delay_s * 2 ** streak)


class Supervision:
    def __init__(self, ready_event: str, role: str, policy: RestartPolicy | None = None) -> None:
        self.ready_event, self.role = ready_event, role
        self.policy = policy or RestartPolicy()
        self.state = "new"
        self.restarts = 0          # processes started after the first
        self.streak = 0            # crashes in a row, each within healthy_after_s of its start
        self.last_exit: int | None = None
        self._started_at = 0.0
        self._stop = False

    def started(self, now: float) -> None:
        if self.state != "new":
            self.restarts += 1
        self.state, self._started_at = "starting", now

    def observe(self, event: dict) -> None:
        name = event.get("event")
        if name == self.ready_event and self.state == "starting":
            self.state = "ready"
        elif name == "role_switched" and event.get("role") in SWITCHABLE_ROLES:
            self.role = str(event["role"])

    def stop_requested(self) -> None:
        self._stop = True
        if self.state in ("new", "starting", "ready", "backing_off"):
            self.state = "stopping"

    def exited(self, code: int, now: float) -> float | None:
        self.last_exit = code
        if code == 0 or self._stop:
            self.state = "exited"
            return None
        if now - self._started_at >= self.policy.healthy_after_s:
            self.streak = 0
        delay = self.policy.delay(self.streak)
        self.streak += 1
        self.state = "backing_off"
        return delay

    @property
    def keeps_running(self) -> bool:
        return not self._stop and self.state != "exited"

    def snapshot(self) -> dict:
        return {"state": self.state, "role": self.role, "restarts": self.restarts,
                "last_exit": self.last_exit, "ready": self.state == "ready"}


def argv_for_role(argv: tuple[str, ...], role: str) -> tuple[str, ...]:
    """`pdbus prefill ...` as `pdbus decode ...` (and back): the command word after `nodes.cli`.
    Other argv (a `both` node, a broker) is returned as is."""
    at = argv.index("nodes.cli") + 1 if "nodes.cli" in argv else -1
    if 0 < at < len(argv) and argv[at] in SWITCHABLE_ROLES and role in SWITCHABLE_ROLES:
        return (*argv[:at], role, *argv[at + 1:])
    return argv
