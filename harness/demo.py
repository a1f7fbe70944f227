"""`make demo`: start a local disaggregated cluster on the real model and stream one completion.

Contract: `python -m harness.demo [--config PATH] [--prompt TEXT] [--max-tokens N]` prepares the
packaged SmolLM2-135M-Instruct once (`pdbus model prepare`), starts `pdbus cluster` (broker,
prefill node, decode node, OpenAI gateway) on free loopback ports with its logs in
`results/demo-cluster.log`, waits for every node to register, streams a chat completion to the
terminal with `pdbus client` over the gateway's WebSocket (first token from the prefill node, the
rest from the decode node after the KV transfer), then stops the cluster with SIGTERM. Exit code: the completion's, or 1 if the cluster never came up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

DEFAULT_PROMPT = "In two sentences: why do LLM servers run prefill and decode on separate machines?"
READY_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"==> {text}", flush=True)


def _watch(stream, log_file: Path, ready: threading.Event) -> None:
    """Copy the cluster's JSON log lines into `log_file`; set `ready` on `cluster_ready`."""
    with log_file.open("w") as out:
        for line in stream:
            out.write(line)
            out.flush()
            try:
                event = json.loads(line).get("event")
            except (json.JSONDecodeError, AttributeError):
                continue
            if event == "cluster_ready":
                ready.set()


def _pdbus(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodes.cli", *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.demo")
    parser.add_argument("--config", default="config/local.toml")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)

    _say("preparing the model (converted once from the packaged GGUF into .models/)")
    if subprocess.run(_pdbus("model", "prepare", "--config", args.config)).returncode != 0:
        return 1
    endpoint, gateway_port = f"tcp://127.0.0.1:{_free_port()}", _free_port()
    env = {**os.environ, "PDBUS__BROKER__ENDPOINT": f'"{endpoint}"', "PDBUS__GATEWAY__PORT": str(gateway_port),
           "PDBUS_LOG_FORMAT": "json"}
    log_file = Path("results/demo-cluster.log")
    log_file.parent.mkdir(exist_ok=True)
    _say(f"starting the cluster (broker {endpoint}, 1 prefill node, 1 decode node, gateway "
         f"http://127.0.0.1:{gateway_port}); logs: {log_file}")
    cluster = subprocess.Popen(_pdbus("cluster", "--config", args.config), env=env, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ready = threading.Event()
    threading.Thread(target=_watch, args=(cluster.stderr, log_file, ready), daemon=True).start()
    try:
        started = time.monotonic()
        while not ready.wait(0.2):
            if cluster.poll() is not None or time.monotonic() - started > READY_TIMEOUT_S:
                _say(f"the cluster did not come up; see {log_file}")
                return 1
        _say(f"cluster ready in {time.monotonic() - started:.1f} s; streaming a chat completion")
        print(f"> {args.prompt}\n", flush=True)
        done = subprocess.run(_pdbus("client", "--config", args.config, "--url", f"http://127.0.0.1:{gateway_port}",
                                     "--chat", "--prompt", args.prompt, "--max-tokens", str(args.max_tokens)),
                              env={**env, "PDBUS_LOG_LEVEL": "warning"})
        print(flush=True)
        return done.returncode
    finally:
        _say("stopping the cluster")
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(30)
        except subprocess.TimeoutExpired:
            cluster.kill()


if __name__ == "__main__":
    sys.exit(main())
