"""Screenshots of the gateway's /dashboard on a real local cluster, for docs/img.

Contract: `python -m harness.dashboard_screenshots [--out docs/img] [--model SmolLM2-135M-Instruct]
[--kv int8] [--concurrency 3] [--load-s 25]` starts a broker, 1 prefill and 2 decode nodes and a gateway
(harness/cluster_procs.py, free loopback ports), sends streaming completions at `--concurrency`
and opens /dashboard in headless Chromium (harness/headless_chromium.py). After `--load-s` it saves
`dashboard-load.png`; then it SIGKILLs the decode node serving one long stream (and some of the
load's) mid-stream, keeps the load going, waits until the page shows that node lost and a failover, and saves
`dashboard-failover.png`. Exit code 0, or 1 with the reason when the page never showed what it
should. Run it under the benchmarks' lock (`flock /tmp/pdbus-bench.lock ...`): it starts processes.
On the real model (the default, float32 on the CPU) it takes about 3 minutes on two cores, most of
it the nodes' first start; `--model tiny` takes 40 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.cluster_procs import ClusterProcs, Proc, free_port, gateway_ready, pdbus, render_config
from harness.dashboard_browser import (
    CHARTS_FILLED_JS,
    STATE_JS,
    Load,
    fail_over,
    failover_shown_js,
    open_dashboard,
)
from harness.headless_chromium import Chromium

MODEL_NAME = "SmolLM2-135M-Instruct"   # what the gateway serves under, whatever `--model`
# The tiny model decodes in microseconds: a step delay gives its streams a real model's pace on a
# CPU (tens of ms per token), so the charts show what a served model's would.
STEP_DELAY_MS = "15"


def start_gateway(cluster: ClusterProcs) -> tuple[Proc, str]:
    port = free_port()
    config = cluster.config_path.with_name("gateway.toml")
    config.write_text(render_config({**cluster.settings, "gateway": {"port": port, "model_name": MODEL_NAME}}))
    proc = Proc(pdbus("gateway", "--config", str(config), "--broker", cluster.broker_endpoint))
    url = f"http://127.0.0.1:{port}"
    if not gateway_ready(proc, url, timeout=120):
        raise RuntimeError("the gateway never became ready:\n" + proc.log_tail())
    return proc, url


def run(out: Path, model: str, kv: str, concurrency: int, load_s: float) -> int:
    extra = {"decode": ["--test-step-delay-ms", STEP_DELAY_MS]} if model == "tiny" else {}
    with ClusterProcs(num_prefill=1, num_decode=2, model=model, kv_quant=kv, extra_args=extra) as cluster:
        gateway, url = start_gateway(cluster)
        try:
            with Load(url, MODEL_NAME, concurrency) as load, Chromium(size=(1600, 1200)) as browser:
                tab = open_dashboard(browser, f"{url}/dashboard")
                tab.wait_for(CHARTS_FILLED_JS, timeout_s=30)
                time.sleep(load_s)
                tab.screenshot(out / "dashboard-load.png")
                print("load:", json.dumps(tab.evaluate(STATE_JS)), flush=True)
                victim = fail_over(url, MODEL_NAME, cluster.kill)["decode_nodes"][0]
                print(f"killed {victim} with {load.num_done} requests done", flush=True)
                tab.wait_for(failover_shown_js(victim), timeout_s=30)
                time.sleep(4)   # the survivors take the load: a few seconds of it on the charts
                tab.screenshot(out / "dashboard-failover.png")
                print("failover:", json.dumps(tab.evaluate(STATE_JS)), flush=True)
                print(f"requests: {load.num_done} done, {load.num_failed} failed", flush=True)
        except TimeoutError as exc:
            print(f"the page never showed it: {exc}", file=sys.stderr)
            return 1
        finally:
            gateway.stop()
    print(f"wrote {out / 'dashboard-load.png'} and {out / 'dashboard-failover.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.dashboard_screenshots")
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--model", default=MODEL_NAME, help="a model spec, or tiny (random weights, paced "
                        "to a real model's step time: a quick look in seconds, not minutes)")
    parser.add_argument("--kv", default="int8", choices=["raw", "int8"])
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--load-s", type=float, default=25.0)
    args = parser.parse_args(argv)
    return run(args.out, args.model, args.kv, args.concurrency, args.load_s)


if __name__ == "__main__":
    sys.exit(main())
