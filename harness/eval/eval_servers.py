"""The OpenAI servers `make eval` points lm-eval at: a local pdbus cluster, or vLLM's own server.

Contract:
- `PdbusCluster(model=, kv_quant=, dtype=, log_path=, python=)` is a context manager around `pdbus cluster`
  (config/local.toml: 1 broker, 1 prefill node, 1 decode node, the gateway) on free loopback
  ports, run by `python` (default: this one), with `[kv] quant`, `[engine] dtype` and the model set through `PDBUS__*` overrides; on
  entry it waits for `cluster_ready` and the gateway's `/ready`, then reads `/v1/models`:
  `.url` (`http://127.0.0.1:PORT`), `.model_name`, `.max_model_len`. On exit: SIGTERM, then SIGKILL
  after 30 s. Its JSON log goes to `log_path`. `RuntimeError` (naming the log) if it never comes up.
- `VllmServer(python=, folder=, name=, dtype=, log_path=)`: the same shape around
  `python -m vllm.entrypoints.openai.api_server` (both cores, no prefix caching, offline).
- `find_vllm_python() -> str | None`: `$VLLM_PYTHON`, else the first of this interpreter, .venv's
  and /tmp/vllm-venv's that imports vllm (`make install-vllm` puts it in .venv).
- `completion_refusal(url, body) -> str | None`: POST one /v1/completions body; None when it is
  served (2xx), else "HTTP <status>: <body>" (how `make eval` reports what a server refuses).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx

from harness.cluster_procs import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
VLLM_CANDIDATES = (REPO_ROOT / ".venv" / "bin" / "python", Path("/tmp/vllm-venv/bin/python"))


class _Server:
    url = ""
    model_name = ""
    max_model_len = 0

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._process: subprocess.Popen | None = None

    def _spawn(self, argv: list[str], env: dict[str, str], *, pipe_stderr: bool) -> None:
        """Start the server, stdout into the log (stderr too, unless piped to be read for events)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w") as log:
            self._process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log, text=True,
                                             stderr=subprocess.PIPE if pipe_stderr else subprocess.STDOUT)

    def _wait_ready(self, path: str, ready: threading.Event | None = None) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ((ready is None or ready.is_set()) and _answers(f"{self.url}{path}")):
            if self._process is None or self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{type(self).__name__}: the server did not come up; see {self.log_path}")
            time.sleep(0.25)
        served = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]
        self.model_name, self.max_model_len = served["id"], int(served.get("max_model_len") or 0)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PdbusCluster(_Server):
    def __init__(self, *, model: str, kv_quant: str, dtype: str, log_path: Path, python: str = sys.executable,
                 config: str = "config/local.toml") -> None:
        super().__init__(log_path)
        self.model, self.kv_quant, self.dtype, self.config, self.python = model, kv_quant, dtype, config, python

    def __enter__(self) -> PdbusCluster:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PDBUS_LOG_FORMAT": "json",
               "PDBUS__BROKER__ENDPOINT": f'"tcp://127.0.0.1:{free_port()}"', "PDBUS__GATEWAY__PORT": str(port),
               "PDBUS__KV__QUANT": json.dumps(self.kv_quant), "PDBUS__ENGINE__DTYPE": json.dumps(self.dtype)}
        self._spawn([self.python, "-m", "nodes.cli", "cluster", "--config", self.config, "--model", self.model],
                    env, pipe_stderr=True)
        ready = threading.Event()
        assert self._process is not None and self._process.stderr is not None
        threading.Thread(target=_copy_log, args=(self._process.stderr, self.log_path, ready), daemon=True).start()
        self._wait_ready("/ready", ready)
        return self


class VllmServer(_Server):
    def __init__(self, *, python: str, folder: Path, name: str, dtype: str, log_path: Path) -> None:
        super().__init__(log_path)
        self.python, self.folder, self.name, self.dtype = python, folder, name, dtype

    def __enter__(self) -> VllmServer:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
               "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": "2"}
        self._spawn([self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.folder),
                     "--served-model-name", self.name, "--dtype", self.dtype, "--enforce-eager",
                     "--no-enable-prefix-caching", "--max-model-len", "2048", "--host", "127.0.0.1",
                     "--port", str(port)], env, pipe_stderr=False)
        self._wait_ready("/v1/models")
        return self


def _copy_log(stream: IO[str], log_path: Path, ready: threading.Event) -> None:
    """Append the cluster's JSON log lines to `log_path`; set `ready` at `cluster_ready`."""
    with log_path.open("a") as out:
        for line in stream:
            out.write(line)
            out.flush()
            if '"cluster_ready"' in line:
                ready.set()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def find_vllm_python() -> str | None:
    if os.environ.get("VLLM_PYTHON"):
        return os.environ["VLLM_PYTHON"]
    for python in (Path(sys.executable), *VLLM_CANDIDATES):
        if python.is_file() and subprocess.run([str(python), "-c", "import vllm"], capture_output=True,
                                               timeout=120).returncode == 0:
            return str(python)
    return None


def completion_refusal(url: str, body: dict[str, Any]) -> str | None:
    try:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    except httpx.HTTPError as exc:
        return f"no answer: {exc!r}"
    return None if response.is_success else f"HTTP {response.status_code}: {response.text[:500]}"
