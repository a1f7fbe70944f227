"""What `pdbus ray status` shows, from what it gathered (pure: no Ray, no bus).

Contract:
- `component_row(name, info, facts, stats) -> dict`: one component. `info` is its actor's answer
  (None: it did not answer — restarting, or its raylet is gone), `facts` Ray's view of the actor
  (`ray_state`, `ray_restarts`, `ray_node`), `stats` a broker's `pdbus.broker.stats` body or None.
  Row keys: name, kind, role (the broker's `role_by_node` when it knows the node, else the
  actor's), state, ready, ray_node, ip, pid, actor_pid, restarts (Ray's restarts of the actor, and the
  actor's of its process), load (the node's last capacity report, or the broker's routes).
- `status_report(rows, nodes, stats) -> dict`: rows plus `pools` (per kind: components, ready),
  the live Ray nodes and the broker stats: what `--json` prints.
- `render(report) -> str`: the pools line and a table, one component per line.
"""

from __future__ import annotations

from typing import Any

KIND_ORDER = ("broker", "prefill", "decode", "both", "gateway")
COLUMNS = (("NAME", "name"), ("POOL", "kind"), ("ROLE", "role"), ("STATE", "state"), ("RAY NODE", "where"),
           ("PID", "pid"), ("RESTARTS", "restarts"), ("LOAD", "load"))


def component_row(name: str, info: dict | None, facts: dict, stats: dict | None) -> dict:
    info = info or {}
    kind = info.get("kind") or name.rsplit("-", 1)[0]
    roles = (stats or {}).get("role_by_node", {})
    return {"name": name, "kind": kind, "role": roles.get(name, info.get("role", kind)),
            "state": info.get("state") or str(facts.get("ray_state", "unknown")).lower(),
            "ready": bool(info.get("ready")), "ray_node": info.get("ray_node") or facts.get("ray_node"),
            "ip": info.get("ip"), "pid": info.get("pid"), "actor_pid": info.get("actor_pid"),
            "restarts": {"actor": facts.get("ray_restarts", 0), "process": info.get("restarts", 0)},
            "load": _load(name, kind, stats)}


def _load(name: str, kind: str, stats: dict | None) -> dict[str, Any]:
    if not stats:
        return {}
    if kind == "broker":
        return {"routes": stats.get("num_routes"), "queued": stats.get("queued_by_service", {})}
    capacity = stats.get("capacity_by_node", {}).get(name, {})
    keys = ("num_running", "max_running", "kv_blocks_free", "kv_blocks_total", "queued_tokens")
    return {key: capacity[key] for key in keys if key in capacity}


def status_report(rows: list[dict], nodes: dict[str, str], stats: dict | None) -> dict:
    pools: dict[str, dict[str, int]] = {}
    for row in rows:
        pool = pools.setdefault(row["kind"], {"components": 0, "ready": 0})
        pool["components"] += 1
        pool["ready"] += int(row["ready"])
    ordered = sorted(rows, key=lambda row: (_rank(row["kind"]), row["name"]))
    return {"pools": dict(sorted(pools.items(), key=lambda item: _rank(item[0]))), "components": ordered,
            "ray_nodes": nodes, "broker_stats": stats}


def _rank(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def render(report: dict) -> str:
    if not report["components"]:
        return "no pdbus components on this Ray cluster (`pdbus ray up` starts them)"
    pools = ", ".join(f"{kind} {pool['ready']}/{pool['components']} ready" for kind, pool in report["pools"].items())
    lines = [f"pools: {pools}; {len(report['ray_nodes'])} Ray nodes"]
    cells = [[_cell(key, row) for _, key in COLUMNS] for row in report["components"]]
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, (header, _) in enumerate(COLUMNS)]
    for row in [[header for header, _ in COLUMNS], *cells]:
        lines.append("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
    if report["broker_stats"] is None:
        lines.append("(no broker answered: roles are the actors', load unknown)")
    return "\n".join(lines)


def _cell(key: str, row: dict) -> str:
    if key == "where":
        return f"{(row['ray_node'] or '?')[:8]} {row['ip'] or ''}".strip()
    if key == "restarts":
        return f"{row['restarts']['actor']}/{row['restarts']['process']}"
    if key == "load":
        return _load_text(row["load"])
    value = row[key]
    return "-" if value is None else str(value)


def _load_text(load: dict) -> str:
    parts = []
    if "num_running" in load:
        parts.append(f"running {load['num_running']}/{load.get('max_running', '?')}")
    if "kv_blocks_free" in load:
        parts.append(f"kv free {load['kv_blocks_free']}/{load.get('kv_blocks_total', '?')}")
    if "queued_tokens" in load:
        parts.append(f"queued {load['queued_tokens']} tok")
    if "routes" in load:
        parts.append(f"routes {load['routes']}")
    return ", ".join(parts) or "-"
