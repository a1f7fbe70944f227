"""Builders for the planner's tests: broker stats bodies as `pdbus.broker.stats` sends them."""

from __future__ import annotations

from typing import Any

from scheduler.planner_signals import Signals, Snapshot, parse_snapshot


def decode_cap(running: float = 0, max_running: float = 10, free: float = 100, total: float = 100,
               **extra: float) -> dict[str, float]:
    return {"kv_blocks_total": total, "kv_blocks_free": free, "max_running": max_running,
            "num_running": running, "full": 0, "block_size": 16, **extra}


def prefill_cap(queued: float = 0, batch: float = 2048, **extra: float) -> dict[str, float]:
    return {"queued_tokens": queued, "max_batch_tokens": batch, "num_prefilled": 7, "px.0123456789ab": 32, **extra}


def stats_body(nodes: dict[str, tuple[str, dict]], queued_decode: int = 0, queued_prefill: int = 0) -> dict[str, Any]:
    """The broker's stats body for `nodes` (node id -> (role, capacity))."""
    by_role: dict[str, int] = {"gateway": 1, "control": 1}
    for role, _ in nodes.values():
        by_role[role] = by_role.get(role, 0) + 1
    return {"nodes_by_role": by_role, "queued_by_service": {"decode": queued_decode, "prefill": queued_prefill},
            "num_routes": 3, "capacity_by_node": {i: dict(cap) for i, (_, cap) in nodes.items()},
            "role_by_node": {i: role for i, (role, _) in nodes.items()}}


def pools(prefill: list[dict] | None = None, decode: list[dict] | None = None, **queued: int) -> dict[str, Any]:
    """A stats body with prefill-0.. and decode-0.. reporting the given capacities."""
    nodes = {f"prefill-{i}": ("prefill", cap) for i, cap in enumerate(prefill or [])}
    nodes.update({f"decode-{i}": ("decode", cap) for i, cap in enumerate(decode or [])})
    return stats_body(nodes, **queued)


def snap(body: dict[str, Any], signals: Signals | None = None) -> Snapshot:
    return parse_snapshot(body, signals)
