"""Running a planner: its settings from `[planner]`, its bus endpoint, its loop and metrics server,
alone (`pdbus planner`) or on a thread of the launcher (`pdbus cluster --planner`).

Contract:
- `planner_options(settings, interval_s=None, metrics_port=None) -> PlannerOptions`: the `[planner]`
  table; the shell's keys (`metrics_host` "127.0.0.1", `metrics_port`: none = no metrics server,
  0 = any free port; `stats_timeout_s` 2.0; `gateway_metrics_url`: a gateway's Prometheus
  `/metrics` to read TTFT/TPOT p90 from, absent = none, "" = none even where `pdbus cluster`
  would pick its own; `slo_window_s` 30.0, the window of those p90s) are taken out, the rest is
  `PlannerConfig`'s. SettingsError for what is wrong.
- `control_endpoint(settings, broker, node_id="planner") -> Endpoint`: an unstarted bus endpoint in
  role `control`, with the config's heartbeat and CURVE settings (key pair `control`).
- `await serve_planner(shell, options, stop)`: the metrics server (logs `planner_metrics` with the
  port it bound), then `shell.run(stop)`; logs `planner_started` / `planner_stopped`. With a
  `gateway_metrics_url`, a shell that has no `signals` of its own gets `slo_signals.SloSignals`
  on it (so `pdbus planner` and `pdbus cluster --planner` both feed the SLO targets).
- `PlannerThread(options, make_shell)`: `start(broker)` opens the endpoint and runs
  `serve_planner(make_shell(endpoint), ...)` on a thread with its own event loop; `stop()` ends it
  and closes the endpoint (idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bus.endpoint import Endpoint
from bus.log import get_logger
from bus.security import SecurityError
from nodes.bus_config import heartbeat_config, security_config
from nodes.config_file import SettingsError, section
from nodes.planner.planner_metrics import PlannerMetrics, serve_metrics
from nodes.planner.planner_shell import PlannerShell
from nodes.planner.slo_signals import SloSignals
from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import Signals

SHELL_KEYS = ("metrics_host", "metrics_port", "stats_timeout_s", "gateway_metrics_url", "slo_window_s")
REGISTER_TIMEOUT_S = 10.0
log = get_logger("planner")


@dataclass(frozen=True)
class PlannerOptions:
    config: PlannerConfig
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    stats_timeout_s: float = 2.0
    gateway_metrics_url: str | None = None   # None: not set; "": set to none
    slo_window_s: float = 30.0


def planner_options(settings: dict, interval_s: float | None = None, metrics_port: int | None = None
                    ) -> PlannerOptions:
    table = dict(section(settings, "planner"))
    shell = {key: table.pop(key) for key in SHELL_KEYS if key in table}
    try:
        config = PlannerConfig.from_settings(table)
        if interval_s is not None:
            config = replace(config, interval_s=float(interval_s))
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from exc
    options = PlannerOptions(config, str(shell.get("metrics_host", "127.0.0.1")),
                             _port(metrics_port if metrics_port is not None else shell.get("metrics_port")),
                             float(shell.get("stats_timeout_s", 2.0)), _url(shell.get("gateway_metrics_url")),
                             _positive("slo_window_s", shell.get("slo_window_s", 30.0)))
    _positive("stats_timeout_s", options.stats_timeout_s)
    return options


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise SettingsError(f"[planner] {name} must be > 0, got {value!r}")
    return float(value)


def _url(value: Any) -> str | None:
    if value is None or value == "":
        return value
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise SettingsError(f"[planner] gateway_metrics_url must be an http(s) URL or \"\", got {value!r}")
    return value


def _port(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise SettingsError(f"[planner] metrics_port (--metrics-port) must be a port number, got {value!r}")
    return value


def control_endpoint(settings: dict, broker: str, node_id: str = "planner", args: Any = None) -> Endpoint:
    try:
        security = security_config(settings, "control", broker)
    except SecurityError as exc:
        raise SettingsError(f"[security]: {exc}") from exc
    return Endpoint(broker, "control", node_id=node_id, heartbeat=heartbeat_config(settings, args), security=security)


async def serve_planner(shell: PlannerShell, options: PlannerOptions, stop: asyncio.Event) -> None:
    runner = None
    if options.gateway_metrics_url and shell.signals is Signals:
        config = options.config
        shell.signals = SloSignals(options.gateway_metrics_url, options.slo_window_s,
                                   timeout_s=min(1.0, config.interval_s),
                                   targets=(config.ttft_p90_target_s, config.tpot_p90_target_s))
    if options.metrics_port is not None:
        metrics = PlannerMetrics(shell.planner, shell.counts)
        runner, port = await serve_metrics(metrics, options.metrics_host, options.metrics_port)
        log.info("planner_metrics", host=options.metrics_host, port=port)
    log.info("planner_started", dry_run=shell.dry_run, gateway_metrics_url=options.gateway_metrics_url or None,
             **_public(options.config))
    try:
        await shell.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        log.info("planner_stopped", **{k: v for k, v in shell.planner.metrics.items()
                                        if k.startswith(("decisions.", "regrets.", "held.regret"))})


def _public(config: PlannerConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


class PlannerThread:
    """A planner beside other work in one process (the launcher): its own thread and event loop."""

    def __init__(self, options: PlannerOptions, make_endpoint: Callable[[str], Endpoint],
                 make_shell: Callable[[Endpoint], PlannerShell]) -> None:
        self.options, self.make_endpoint, self.make_shell = options, make_endpoint, make_shell
        self.endpoint: Endpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self, broker: str) -> None:
        self.endpoint = self.make_endpoint(broker).start()
        if not self.endpoint.wait_registered(REGISTER_TIMEOUT_S):
            log.warning("planner_not_registered", broker=broker, waited_s=REGISTER_TIMEOUT_S)
        self._thread = threading.Thread(target=self._run, args=(self.endpoint,), name="planner", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)

    def _run(self, endpoint: Endpoint) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await serve_planner(self.make_shell(endpoint), self.options, self._stop)

        try:
            asyncio.run(main())
        except Exception:   # the cluster keeps serving without its planner: say so loudly
            log.exception("planner_thread_failed")
        finally:
            self._ready.set()

    def stop(self, timeout: float = 5.0) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):   # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        if self.endpoint is not None:
            self.endpoint.stop()
        self._loop = self._stop = self._thread = self.endpoint = None
