"""What a cluster did during a measured run, read from its JSON log: the planner's decisions and
the node roles over time (the elasticity benchmark's timeline).

Contract (pure but `read_events`):
- `EVENTS`: the log events read (`cluster_node_ready` {node_id, role}, `planner_decision` {kind,
  role, node_id, reason}, `planner_node_started`, `planner_wanted`, `planner_action_failed`, `planner_held`,
  `role_switched` {role; the node is `node_id` or the launcher's `child` tag}, `cluster_node_drained`
  {child}). `wanted(event)` says whether a parsed log line is one of them.
- `read_events(path) -> list[dict]`: those events of a cluster log file (`--log-format json`), in
  order; lines that are not JSON objects are skipped.
- `timeline(events, load_start, load_end=None) -> dict`: times in seconds from `load_start` (epoch
  seconds; events carry structlog's ISO `timestamp`, UTC) up to `load_end` when given:
  `planner_decisions` (t_s, kind, role, node_id, reason; also `planner_wanted` and
  `planner_action_failed` and `planner_held`, as `kind` "wanted" / "failed" / "held"), and `role_timeline`: a list of
  {t_s, prefill, decode, both, switching, draining} node counts, one entry at t 0 (the roles
  before the load) and one at each change. A node is `switching` from the planner's switch_role
  decision until its `role_switched`, `draining` from a scale_down until `cluster_node_drained`,
  and counts in its role once ready. Events without a readable timestamp are skipped.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

EVENTS = ("cluster_node_ready", "planner_decision", "planner_node_started", "planner_wanted",
          "planner_action_failed", "planner_held", "role_switched", "cluster_node_drained")
STATES = ("prefill", "decode", "both", "switching", "draining")
DECISION_EVENTS = {"planner_decision": None, "planner_wanted": "wanted", "planner_action_failed": "failed",
                   "planner_held": "held"}


def wanted(event: object) -> bool:
    return isinstance(event, dict) and event.get("event") in EVENTS


def read_events(path: Path) -> list[dict]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if wanted(event):
            events.append(event)
    return events


def epoch_of(event: dict) -> float | None:
    try:
        return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return None


def _node(event: dict) -> str:
    return str(event.get("node_id") or event.get("child") or "")


def _new_state(event: dict, current: str | None) -> str | None:
    """The node's state after `event` (None: no change)."""
    name, kind = event.get("event"), event.get("kind")
    if name in ("cluster_node_ready", "role_switched"):
        return str(event.get("role") or current)
    if name == "planner_decision" and kind == "switch_role":
        return "switching"
    if name == "planner_decision" and kind == "scale_down":
        return "draining"
    if name == "cluster_node_drained":
        return "gone"
    return None


def _apply(states: dict[str, str], event: dict) -> bool:
    """Move the event's node to its new state; whether it had one."""
    node = _node(event)
    state = _new_state(event, states.get(node))
    if state is None or not node:
        return False
    states[node] = state
    return True


def _counts(states: dict[str, str]) -> dict[str, int]:
    return {state: sum(s == state for s in states.values()) for state in STATES}


def _decision(event: dict, t_s: float) -> dict:
    kind = DECISION_EVENTS[str(event["event"])] or event.get("kind")
    return {"t_s": round(t_s, 3), "kind": kind, "role": event.get("role"), "node_id": event.get("node_id"),
            "reason": event.get("reason") or event.get("error") or ""}


def _step(steps: list[dict], step: dict) -> None:
    """Add a step of the role timeline: one per instant (the last state of it), and only on a change."""
    if steps and steps[-1]["t_s"] == step["t_s"]:
        steps[-1] = step
    elif not steps or any(steps[-1][k] != step[k] for k in STATES):
        steps.append(step)


def timeline(events: list[dict], load_start: float, load_end: float | None = None) -> dict:
    states: dict[str, str] = {}
    decisions: list[dict] = []
    steps: list[dict] = []
    for event in events:
        at = epoch_of(event)
        if at is None or (load_end is not None and at > load_end):
            continue
        t_s = max(0.0, at - load_start)   # what happened before the load is its starting state
        if event.get("event") in DECISION_EVENTS and at >= load_start:
            decisions.append(_decision(event, t_s))
        if _apply(states, event):
            _step(steps, {"t_s": round(t_s, 3), **_counts(states)})
    if not steps or steps[0]["t_s"] > 0:
        steps.insert(0, {"t_s": 0.0, **_counts({})})
    return {"planner_decisions": decisions, "role_timeline": steps}
