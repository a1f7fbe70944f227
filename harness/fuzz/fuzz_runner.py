"""Fuzz a live local cluster with hostile traffic for a time budget, then judge whether it survived.

Contract: `run_fuzz(FuzzOptions(...)) -> dict` (counts per target and kind, RSS per process at the
baseline and after, liveness, what the processes logged at error level, the final request, `ok`
and `problems`) and `main(options) -> int` (prints the summary, writes results/fuzz-*.json, 0 only
when the run passed). Flow: start the cluster as real processes (`ChaosCluster`: broker, one
prefill node, one decode node, the gateway; the tiny random-weight model, fp32, raw KV), stream
one normal request, learn the decode node's KV endpoint from the broker's `node_joined` (its
READY's `data_endpoint`), run the `Fuzzer` for `seconds`, taking the RSS baseline once `warmup_s`
of fuzzing has passed, then let the cluster settle (the closed sessions' routes cancelled, held
DIRECTs and orphans expired, the decode node's KV back to idle) and check:
1. every process (broker, prefill-0, decode-0, gateway) is alive, before and after the final request;
2. no process's resident memory grew by more than `rss_bound_mib` (64 MiB) over its baseline
   (a decode node's growth less what it holds by design: cached sessions, KV store, kept buffer);
3. a normal request streams a completion through the gateway (SSE, tokens, finish reason, [DONE]);
4. the gateway's `/metrics` exposes no more than `max_new_series` series more than at the
   baseline: its labels are fixed sets, so growth means peer input became label values (a leak).
Why 64 MiB: the baseline comes after every target was hit for the warm-up, so allocator arenas,
socket buffers and caches are near their working size; what the protocol lets a peer make a
process hold afterwards is bounded and expires (held DIRECTs and orphaned routes for 2 liveness
windows, the KV receiver's 4096 remembered transfer ids, the gateway's per-connection buffers).
In our runs growth after the warm-up stayed under 4 MiB for the broker and the nodes and under
22 MiB for the gateway, whose RSS rises in steps and then holds (allocator high-water marks of
1-2 MiB request bodies and deep JSON: `rss_timeline` shows the plateau); a leak of even 1 KiB
per message passes 100 MiB over the default 10 minutes (100 000+ messages). 64 MiB is three times
the worst noise seen and well under a leak.
The decode node's KV not being back to idle is reported and fails the run too (a KV-block leak).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

from harness.chaos.chaos_cluster import ChaosCluster
from harness.fuzz import fuzz_report
from harness.fuzz.http_peer import complete, warm_extras
from harness.fuzz.loop import TARGETS, ClusterView, Fuzzer


@dataclass
class FuzzOptions:
    seconds: float = 600.0
    seed: int = 0
    batch: int = 32
    warmup_s: float | None = None      # default: a tenth of `seconds`, 3 to 60 s
    rss_bound_mib: float = 64.0
    settle_s: float = 3.0
    kv_idle_timeout_s: float = 30.0
    max_new_series: int = 50
    targets: tuple[str, ...] = TARGETS
    results_dir: str | None = "results"
    verbose: bool = True

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(60.0, max(3.0, self.seconds / 10))


def say(options: FuzzOptions, text: str) -> None:
    if options.verbose:
        print(text, flush=True)


def build_cluster() -> ChaosCluster:
    return ChaosCluster(num_prefill=1, num_decode=1, model="tiny", kv_quant="raw", gateway=True)


def view_of(cluster: ChaosCluster) -> ClusterView:
    assert cluster.broker is not None and cluster.gateway_url is not None   # started, with the gateway
    joined = {e["node_id"]: e.get("data_endpoint") for e in cluster.broker.find("node_joined")}
    kv_endpoints = {node_id: endpoint for node_id in cluster.decode_ids()
                    if (endpoint := joined.get(node_id))}
    return ClusterView(cluster.broker_endpoint, cluster.gateway_url, kv_endpoints, list(cluster.nodes),
                       procs=dict(cluster.nodes))


def run_fuzz(options: FuzzOptions) -> dict[str, Any]:
    started = time.monotonic()
    with build_cluster() as cluster:
        gateway_url = cluster.gateway_url
        # Started, with the gateway.
        assert cluster.broker is not None and cluster.gateway is not None and gateway_url is not None
        procs = {"broker": cluster.broker, **cluster.nodes, "gateway": cluster.gateway}
        first = asyncio.run(complete(gateway_url, max_tokens=8))
        if not first["ok"]:
            raise RuntimeError(f"the cluster could not serve a normal request before fuzzing: {first}")
        if (statuses := asyncio.run(warm_extras(gateway_url))) != [200, 200, 200]:
            raise RuntimeError(f"the cluster could not serve the OpenAI extras before fuzzing: {statuses}")
        view = view_of(cluster)
        say(options, f"cluster up in {time.monotonic() - started:.1f}s (KV endpoints {view.kv_endpoints}); "
                     f"fuzzing for {options.seconds:g}s, baseline after {options.warmup:g}s")
        fuzzer = Fuzzer(view, seed=options.seed, batch=options.batch, targets=options.targets)
        baseline: dict[str, float] = {}
        held_before: dict[str, float] = {}
        series: dict[str, int | None] = {}

        def on_warm() -> None:
            series["before"] = fuzz_report.metrics_series(gateway_url)
            baseline.update(fuzz_report.rss_mib(procs))
            held_before.update({n: fuzz_report.held_mib(cluster.kv_capacity(n)) for n in cluster.decode_ids()})

        timeline: list[dict[str, Any]] = []

        def on_sample() -> None:
            timeline.append({"t": round(time.monotonic() - started, 1), **fuzz_report.rss_mib(procs)})

        seconds = asyncio.run(fuzzer.run(options.seconds, options.warmup, on_warm, on_sample))
        say(options, f"fuzzed {seconds:.0f}s; settling")
        time.sleep(options.settle_s)
        kv_idle = cluster.wait_kv_idle(options.kv_idle_timeout_s)
        rss_after = fuzz_report.rss_mib(procs)
        held = {n: fuzz_report.held_mib(cluster.kv_capacity(n)) - held_before.get(n, 0.0) for n in cluster.decode_ids()}
        alive_before = {name: proc.alive for name, proc in procs.items()}
        final = asyncio.run(complete(gateway_url, max_tokens=16))
        alive = {name: proc.alive and alive_before[name] for name, proc in procs.items()}
        series["after"] = fuzz_report.metrics_series(gateway_url)
        run = {"options": asdict(options), "seconds_fuzzed": round(seconds, 1), "rounds": fuzzer.sampler.rounds,
               "counts": dict(fuzzer.counts), "kv_endpoints": view.kv_endpoints, "rss_before": baseline,
               "rss_after": rss_after, "rss_growth": fuzz_report.rss_growth(baseline, rss_after, held),
               "rss_timeline": timeline,
               "alive": alive, "kv_idle": kv_idle, "final_request": final,
               "metrics_series_before": series.get("before"), "metrics_series_after": series.get("after"),
               "logged_errors": fuzz_report.logged_errors(procs),
               "deaths": {name: fuzz_report.death(proc) for name, proc in procs.items() if not proc.alive}}
    run["problems"] = problems(run, options)
    run["ok"] = not run["problems"]
    run["seconds"] = round(time.monotonic() - started, 1)
    return run


def problems(run: dict[str, Any], options: FuzzOptions) -> list[str]:
    found = [f"{name} died" for name, alive in run["alive"].items() if not alive]
    found += [f"{name} grew {mib} MiB (bound {options.rss_bound_mib})" for name, mib in run["rss_growth"].items()
              if mib > options.rss_bound_mib]
    if not run["rss_before"]:
        found.append("no RSS baseline was taken (the run ended before its warm-up)")
    if not all(run["kv_idle"].values()):
        found.append(f"decode KV not back to idle: {run['kv_idle']}")
    before, after = run["metrics_series_before"], run["metrics_series_after"]
    if before is not None and after is not None and after - before > options.max_new_series:
        found.append(f"the gateway's /metrics grew from {before} to {after} series (peer input as label values)")
    if not run["final_request"]["ok"]:
        found.append(f"the final request failed: {run['final_request']}")
    if not any(k.startswith("sent.") for k in run["counts"]):
        found.append("nothing was sent")
    return found


def main(options: FuzzOptions) -> int:
    run = run_fuzz(options)
    print(fuzz_report.render(run))
    if options.results_dir:
        print(f"written: {fuzz_report.write_json(run, options.results_dir)}")
    return 0 if run["ok"] else 1
