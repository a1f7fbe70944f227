"""The fleet bench's output: the table on stdout, the JSON files and the PNG plot.

Contract: `heartbeat_line(row)` one progress line per measured fleet; `print_tables(report)` the
heartbeat and scheduler tables and the verdict on the 10 % target; `write_results(report, out_dir)`
writes `fleet-<UTC time>.json` (the whole report), `fleet-summary.json` (headline figures, replaced
each run) and `fleet-<UTC time>.png` (broker and swarm CPU against nodes); returns their paths.
`lost_nodes(row)` and `target_row(report)` are the figures the verdict reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

TARGET_NODES = 1000


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    return f"{model or platform.processor()} x{os.cpu_count()} ({platform.system()} {platform.release()})"


def is_broker(row: dict) -> bool:
    return str(row["server"]).startswith("broker")


def lost_nodes(row: dict) -> int:
    """Nodes lost: not registered, left (the broker's log), lost their link to it (the swarm), or not
    counted by the broker's stats at the end (the floor server keeps neither log nor registry)."""
    live = row["nodes_by_role"].get("decode", 0) if is_broker(row) and not row["stats_error"] else row["nodes"]
    return max(row["nodes"] - min(live, row["registered"]), row["nodes_left"], row["links_lost"])


def heartbeat_line(row: dict) -> str:
    extra = f", CAPACITY {row['capacity_hz']:g}/s a node" if row["capacity_hz"] else ""
    return (f"{row['server']}, {row['nodes']:,} nodes{extra}: {row['registered']:,} registered in "
            f"{row['register_s']} s, server {row['broker_cpu_pct']:.1f} % of a core (Python thread "
            f"{row['broker_main_pct']:.1f}, libzmq I/O {row['broker_zmq_pct']:.1f}), swarm {row['swarm_cpu_pct']:.1f} %, "
            f"{row['to_broker_per_s']:,.0f} msg/s in, {row['from_broker_per_s']:,.0f} out, {lost_nodes(row)} lost, "
            f"{row['reconnects']} reconnects{', STALLED' if row['broker_stalled'] else ''}")


def target_row(report: dict) -> dict | None:
    return next((r for r in report["heartbeat"] if is_broker(r) and r["nodes"] == TARGET_NODES
                 and not r["capacity_hz"] and not r.get("before")), None)


def print_tables(report: dict) -> None:
    print(f"\nheartbeat load ({report['machine']}; idle decode nodes, heartbeat every idle interval (1 s) both ways;"
          " % of one core: server = Python thread + libzmq I/O thread)")
    print(f"{'server':30} {'nodes':>7} {'cap/s':>6} {'server %':>9} {'python %':>9} {'libzmq %':>9} {'swarm %':>8} "
          f"{'in msg/s':>9} {'out msg/s':>10} {'us/msg':>7} {'register s':>11} {'reg. CPU s':>11} {'lost':>6} {'reconnects':>11}"
          "  note")
    for r in report["heartbeat"]:
        print(f"{r['server']:30} {r['nodes']:>7,} {r['capacity_hz']:>6g} {r['broker_cpu_pct']:>9.1f} "
              f"{r['broker_main_pct']:>9.1f} {r['broker_zmq_pct']:>9.1f} {r['swarm_cpu_pct']:>8.1f} "
              f"{r['to_broker_per_s']:>9,.0f} {r['from_broker_per_s']:>10,.0f} {r['broker_us_per_msg']:>7.1f} "
              f"{r['register_s']:>11} {r['register_server_cpu_s']:>11} {lost_nodes(r):>6} {r['reconnects']:>11}"
              f"  {'STALLED: stopped answering' if r['broker_stalled'] else ''}")
    print("\nBrokerCore alone, in process (no sockets): % of one core for the same heartbeats")
    for r in report["core"]:
        print(f"  {r['nodes']:>7,} nodes: on_frames {r['on_frames_pct']:.2f} %, tick {r['tick_pct']:.2f} %")
    for r in report.get("endpoint", []):
        print(f"  idle Endpoint, idle interval {r['idle_ms']} ms: {r['endpoint_ms_per_s']:.2f} ms CPU/s each "
              f"({r['endpoints']} in one process)")
    print("\nscheduler (decode ring, 64 vnodes a node; key-space shares exact)")
    print(f"{'nodes':>7} {'ring max/mean':>14} {'min/mean':>9} {'bounded max/mean':>17} {'join moved':>11} "
          f"{'x ideal':>8} {'leave moved':>12} {'x ideal':>8} {'placement ms':>13} {'join ms':>8} {'leave ms':>9}")
    for r in report["scheduler"]:
        bounded = f"{r['bounded_max_mean']:.3f}" if r["bounded_max_mean"] is not None else "-"
        print(f"{r['nodes']:>7,} {r['ring_max_mean']:>14.3f} {r['ring_min_mean']:>9.3f} {bounded:>17} "
              f"{r['join_moved']:>11.6f} {r['join_moved'] / r['join_ideal']:>8.2f} {r['leave_moved']:>12.6f} "
              f"{r['leave_moved'] / r['leave_ideal']:>8.2f} {r['decode_decision_ms']:>13.2f} {r['join_ms']:>8.2f} "
              f"{r['leave_ms']:>9.2f}")
    row = target_row(report)
    if row is not None:
        met = row["broker_cpu_pct"] <= report["target_pct"] and lost_nodes(row) == 0
        print(f"\ntarget: heartbeats from {TARGET_NODES:,} nodes cost the broker <= {report['target_pct']:g} % "
              f"of one core: {'met' if met else 'MISSED'} ({row['broker_cpu_pct']:.1f} %, {lost_nodes(row)} lost)")


def summary(report: dict) -> dict:
    row = target_row(report)
    return {
        "when": report["when"], "machine": report["machine"],
        "target": {"nodes": TARGET_NODES, "max_broker_cpu_pct": report["target_pct"],
                   "broker_cpu_pct": round(row["broker_cpu_pct"], 2) if row else None,
                   "met": bool(row and row["broker_cpu_pct"] <= report["target_pct"] and lost_nodes(row) == 0)},
        "heartbeat": [{"server": r["server"], "nodes": r["nodes"], "capacity_hz": r["capacity_hz"],
                       "broker_cpu_pct": round(r["broker_cpu_pct"], 2), "swarm_cpu_pct": round(r["swarm_cpu_pct"], 2),
                       "to_broker_per_s": round(r["to_broker_per_s"]), "from_broker_per_s": round(r["from_broker_per_s"]),
                       "broker_main_pct": round(r["broker_main_pct"], 2), "broker_zmq_pct": round(r["broker_zmq_pct"], 2),
                       "register_s": r["register_s"], "lost": lost_nodes(r), "reconnects": r["reconnects"],
                       "stalled": r["broker_stalled"]} for r in report["heartbeat"]],
        "core": [{k: round(v, 3) for k, v in r.items()} for r in report["core"]],
        "endpoint": [{k: round(v, 3) for k, v in r.items()} for r in report.get("endpoint", [])],
        "scheduler": [{"nodes": r["nodes"], "ring_max_mean": round(r["ring_max_mean"], 3),
                       "bounded_max_mean": r["bounded_max_mean"] and round(r["bounded_max_mean"], 3),
                       "join_moved_x_ideal": round(r["join_moved"] / r["join_ideal"], 3),
                       "leave_moved_x_ideal": round(r["leave_moved"] / r["leave_ideal"], 3),
                       "decode_decision_ms": round(r["decode_decision_ms"], 3), "join_ms": round(r["join_ms"], 3),
                       "leave_ms": round(r["leave_ms"], 3)} for r in report["scheduler"]],
    }


def plot(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    heartbeat = report["heartbeat"]
    for label in dict.fromkeys(r["server"] for r in heartbeat if is_broker(r)):
        rows = sorted((r for r in heartbeat if r["server"] == label and not r["capacity_hz"]), key=lambda r: r["nodes"])
        nodes = [r["nodes"] for r in rows]
        line, = axis.plot(nodes, [r["broker_cpu_pct"] for r in rows], marker="o", label=label)
        axis.plot(nodes, [r["broker_zmq_pct"] for r in rows], marker=".", linestyle="--", color=line.get_color(),
                  label="  of which libzmq's I/O thread")
        if label == heartbeat[0]["server"]:
            axis.plot(nodes, [r["swarm_cpu_pct"] for r in rows], marker="s", linestyle=":", color="grey",
                      label="simulated nodes (the load)")
    for r in heartbeat:
        if r["capacity_hz"]:
            axis.plot([r["nodes"]], [r["broker_cpu_pct"]], marker="^", linestyle="none",
                      label=f"broker, + CAPACITY {r['capacity_hz']:g}/s a node")
        elif not is_broker(r):
            axis.plot([r["nodes"]], [r["broker_cpu_pct"]], marker="v", linestyle="none",
                      label="floor: the broker's shell + libzmq, liveness only")
    axis.plot([TARGET_NODES], [report["target_pct"]], marker="_", markersize=30, color="grey", linestyle="none",
              label=f"target at {TARGET_NODES:,} nodes")
    axis.set_xscale("log")
    axis.set_xlabel("idle decode nodes (heartbeat every 1 s; 'before': every 250 ms)")
    axis.set_ylabel("CPU, % of one core")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(f"pdbus broker heartbeat load ({report['when'][:10]})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def write_results(report: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    full, brief = out_dir / f"fleet-{stamp}.json", out_dir / "fleet-summary.json"
    full.write_text(json.dumps(report, indent=2) + "\n")
    brief.write_text(json.dumps(summary(report), indent=2) + "\n")
    return [full, brief, plot(report, out_dir / f"fleet-{stamp}.png")]
