"""What a fuzz run measured and how it is shown: resident memory per process, what the processes
logged at error level, the printed summary and the JSON written under results/.

Contract:
- `rss_mib(procs) -> {name: MiB}` for the live processes among `procs` ({name: Proc}).
- `rss_growth(before, after, held) -> {name: MiB}`: growth per process still alive, less what a
  decode node holds more by design (`held`: its cached sessions, KV store and kept KV buffer, from
  its capacity report, as the chaos runner counts them).
- `logged_errors(procs) -> {name: {"events": {event: count}, "first": [excerpts], "tracebacks": n}}`:
  error-level JSON events (`message_failed`, `internal_error`, ...) and raw tracebacks; a process
  that survived an exception it logged still has a bug worth reporting.
- `metrics_series(url) -> int | None`: how many series the gateway's `/metrics` exposes. Every label
  there is a fixed set (endpoints, outcomes, stages, roles, ...) unless a peer's input became a
  label value: growth over the run is a leak (unbounded cardinality) even when RSS hides it.
- `death(proc) -> dict`: exit code and log tail of a process that ended.
- `render(run) -> str` and `write_json(run, folder) -> path`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

HELD_KEYS = ("kv_mib_cached", "kv_mib_slots", "kv_mib_buffers")


def rss_mib(procs: dict[str, Any]) -> dict[str, float]:
    sizes = {}
    for name, proc in procs.items():
        try:
            status = Path(f"/proc/{proc.process.pid}/status").read_text()
        except OSError:
            continue
        kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
        if kib is not None and proc.alive:
            sizes[name] = round(kib / 1024, 1)
    return sizes


def held_mib(capacity: dict | None) -> float:
    return sum(float((capacity or {}).get(key, 0.0)) for key in HELD_KEYS)


def rss_growth(before: dict[str, float], after: dict[str, float], held: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - mib - max(0.0, held.get(name, 0.0)), 1)
            for name, mib in before.items() if name in after}


def logged_errors(procs: dict[str, Any], max_excerpts: int = 3) -> dict[str, dict]:
    found = {}
    for name, proc in procs.items():
        events = [e for e in list(proc.events) if e.get("level") in ("error", "critical")]
        tracebacks = raw_tracebacks(list(proc.raw))
        if not events and not tracebacks:
            continue
        excerpts = [{k: str(v)[-900:] for k, v in e.items() if k in ("event", "message", "path", "exception", "error")}
                    for e in events[:max_excerpts]]
        kinds = Counter(t[-1].strip()[:160] for t in tracebacks)
        found[name] = {"events": dict(Counter(e.get("event") for e in events)), "first": excerpts,
                       "tracebacks": len(tracebacks), "traceback_kinds": dict(kinds),
                       "first_tracebacks": {kind: _excerpt(next(t for t in tracebacks if t[-1].strip()[:160] == kind))
                                            for kind in kinds}}
    return found


def _excerpt(traceback: list[str], head: int = 12, tail: int = 14) -> str:
    lines = traceback if len(traceback) <= head + tail else [*traceback[:head], "  ...\n", *traceback[-tail:]]
    return "".join(lines)


def raw_tracebacks(lines: list[str]) -> list[list[str]]:
    """Tracebacks printed as plain text (not through the JSON logger), with the line before them
    when it says what failed (asyncio's `Task exception was never retrieved`, aiohttp's `Error
    handling request`): up to the first line that is not indented, the exception line."""
    found, current, previous = [], None, ""
    for line in lines:
        if line.startswith("Traceback"):
            current = [previous, line] if previous and not previous.startswith("{") else [line]
        elif current is not None:
            current.append(line)
            if line and not line[0].isspace() and not line.startswith(("During handling", "The above")):
                found.append(current)
                current = None
        previous = line
    return found


def metrics_series(url: str) -> int | None:
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def death(proc: Any) -> dict[str, Any]:
    return {"exit_code": proc.process.poll(), "log_tail": proc.log_tail(40)}


def _counts_table(counts: dict[str, int], prefix: str) -> list[str]:
    rows = sorted((k.removeprefix(prefix), v) for k, v in counts.items() if k.startswith(prefix))
    return [f"    {name:<44} {value:>9}" for name, value in rows]


def render(run: dict[str, Any]) -> str:
    lines = [f"fuzz: {run['seconds_fuzzed']:.0f}s of hostile traffic (seed {run['options']['seed']}), "
             f"{sum(v for k, v in run['counts'].items() if k.startswith('sent.'))} messages, "
             f"{run['rounds']} hypothesis rounds", "  sent, per target and kind:"]
    lines += _counts_table(run["counts"], "sent.")
    lines += ["  seen (answers):"] + _counts_table(run["counts"], "seen.")
    other = {k: v for k, v in run["counts"].items() if not k.startswith(("sent.", "seen."))}
    lines += ["  hostile nodes and the rest:"] + _counts_table(other, "")
    lines.append(f"  {'process':<12} {'alive':>6} {'RSS base':>10} {'RSS after':>10} {'growth':>8}  (bound "
                 f"{run['options']['rss_bound_mib']} MiB)")
    for name, alive in run["alive"].items():
        before, after = run["rss_before"].get(name), run["rss_after"].get(name)
        lines.append(f"  {name:<12} {'yes' if alive else 'NO':>6} {before!s:>10} {after!s:>10} "
                     f"{run['rss_growth'].get(name, '-')!s:>8}")
    final = run["final_request"]
    lines.append(f"  final request: {'ok' if final['ok'] else 'FAILED'} (HTTP {final['status']}, "
                 f"{final['num_chunks']} tokens, finish {final['finish_reason']}, {final.get('seconds')}s"
                 + (f", error {final['error']}" if final["error"] else "") + ")")
    lines.append(f"  decode KV back to idle: {run['kv_idle']}; gateway /metrics series: "
                 f"{run['metrics_series_before']} -> {run['metrics_series_after']}")
    for name, errors in run["logged_errors"].items():
        lines.append(f"  {name} logged errors: {errors['events']}; plain tracebacks: {errors['traceback_kinds']}")
    for name, dead in run["deaths"].items():
        lines.append(f"  {name} DIED (exit {dead['exit_code']}); log tail:\n{dead['log_tail']}")
    lines.append("fuzz: " + ("PASSED" if run["ok"] else "FAILED: " + "; ".join(run["problems"])))
    return "\n".join(lines)


def write_json(run: dict[str, Any], folder: str) -> Path:
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"fuzz-{time.strftime('%Y%m%d-%H%M%S')}.json"
    target.write_text(json.dumps(run, indent=1, default=str))
    return target
