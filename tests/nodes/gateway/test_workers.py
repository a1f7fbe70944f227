"""The pieces of `pdbus gateway --workers N` that need no broker (nodes/gateway/workers.py): the
restart back-off, the seat a worker is handed and its command line, holding the port, the
`[gateway] workers` setting, and the `X-Pdbus-Gateway` header that names the worker that answered;
the pool itself with stand-in workers (a failed start ends it with the worker's code, a death
later is a restart, a stop ends every worker)."""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from nodes.commands import gateway_cmd
from nodes.config_file import SettingsError
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.app import Gateway, build_app
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig
from nodes.gateway.shared_limits import LimitsTable, SharedRateLimiter, identity_key
from nodes.gateway.workers import Backoff, WorkerPool, WorkerSeat, reserve_port, worker_argv


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_stable_run():
    backoff = Backoff()
    delays = [backoff.after_exit(ran_s=1.0) for _ in range(10)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0] and max(delays) == Backoff.CAP_S == delays[-1]
    assert backoff.after_exit(ran_s=Backoff.STABLE_S) == Backoff.FIRST_S


def test_a_seat_travels_as_one_argument_and_bad_ones_are_settings_errors():
    seat = WorkerSeat(3, 7, 9)
    assert WorkerSeat.parse(seat.arg()) == seat
    for bad in ("", "1,2", "a,b,c", "-1,3,4", "1,-2,4"):
        with pytest.raises(SettingsError, match="--worker"):
            WorkerSeat.parse(bad)
    assert WorkerSeat(0).limiter(GatewayConfig(rate_limit_rps=1.0)) is None   # no table: its own


def test_a_seat_with_a_table_counts_there():
    table = LimitsTable.create(num_workers=2, num_groups=4)
    try:
        limiter = WorkerSeat(1, table.fd).limiter(GatewayConfig(max_streams_per_key=3))
        assert isinstance(limiter, SharedRateLimiter) and limiter.worker == 1 and limiter.max_streams == 3
    finally:
        table.close()


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for flag in ("--config", "--log-format", "--log-level"):
        parser.add_argument(flag)
    gateway_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_workers_command_line_is_the_parents_with_its_seat_port_and_node_id():
    args = _args("--config", "c.toml", "--workers", "2", "--node-id", "gw", "--model", "tiny", "--port", "0")
    argv = worker_argv(args, GatewayConfig(host="127.0.0.2"), 8123, WorkerSeat(1, 5, 6))
    assert argv[:4] == [sys.executable, "-m", "nodes.cli", "gateway"]
    pairs = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert pairs == {"--worker": "1,5,6", "--host": "127.0.0.2", "--port": "8123", "--config": "c.toml",
                     "--model": "tiny", "--broker-timeout": "30.0", "--node-id": "gw-w1"}
    assert "--node-id" not in worker_argv(_args(), GatewayConfig(), 1, WorkerSeat(0))   # a random id each


def test_the_workers_setting_and_flag():
    assert GatewayConfig.from_settings({}).workers == 1
    assert GatewayConfig.from_settings({"gateway": {"workers": 4}}).workers == 4
    assert GatewayConfig.from_settings({"gateway": {"workers": 4}}, workers=2).workers == 2
    for bad in (0, 65, "2", True):
        with pytest.raises(SettingsError, match="workers must be a whole number in 1..64"):
            GatewayConfig.from_settings({"gateway": {"workers": bad}})


def test_a_held_port_takes_workers_but_no_connection_and_a_listened_one_is_refused():
    held = reserve_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with socket.create_server(("127.0.0.1", port), reuse_port=True) as worker:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                worker.settimeout(2)
                worker.accept()[0].close()   # the connection reached the worker, not the held socket
            with pytest.raises(OSError):
                reserve_port("127.0.0.1", port)   # listened on: a second gateway may not join
    finally:
        held.close()


async def test_every_response_names_the_gateway_that_answered():
    config = GatewayConfig(model_name="m", api_keys=("k",))
    gateway = Gateway(config, Backend(object(), ModelInfo(tiny_tokenizer(512), 2048), config), node_id="gw-w1")
    async with TestClient(TestServer(build_app(gateway))) as client:
        for path in ("/health", "/v1/models", "/nowhere"):
            response = await client.get(path)
            assert response.headers["X-Pdbus-Gateway"] == "gw-w1", path


def stand_in(code: str):
    """A worker's command line: python running `code` (given the seat as `seat`)."""
    def argv(seat: WorkerSeat) -> list[str]:
        prelude = f"import os, sys, time; from nodes.gateway.workers import WorkerSeat; seat = WorkerSeat.parse({seat.arg()!r})"
        return [sys.executable, "-c", f"{prelude}; {code}"]
    return argv


def test_a_worker_that_fails_to_start_ends_the_pool_with_its_code():
    pool = WorkerPool(stand_in("sys.exit(2) if seat.index else time.sleep(30)"), 2)
    assert pool.run(threading.Event(), lambda pids: None) == 2
    assert pool.workers[0].process is not None and pool.workers[0].process.returncode is not None


def test_a_worker_that_dies_after_serving_is_restarted_its_counts_cleared_and_a_stop_ends_all():
    stop, pids, result = threading.Event(), [], []
    table = LimitsTable.create(num_workers=2, num_groups=4)
    held = SharedRateLimiter(table, 1, max_streams=5)
    held.acquire("key:a", 0.0)   # as if worker 1 had a request in flight when it died
    pool = WorkerPool(stand_in("seat.announce_ready(); time.sleep(1.0); sys.exit(3) if seat.index else time.sleep(30)"),
                      2, table)
    runner = threading.Thread(target=lambda: result.append(pool.run(stop, pids.extend)))
    runner.start()
    deadline = time.monotonic() + 10
    while pool.workers[1].backoff.num_failures == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.announced and len(pids) == 2 and pool.workers[1].backoff.num_failures >= 1   # a restart
    assert table.num_in_flight(table.find(identity_key("key:a"))) == 0
    stop.set()
    runner.join(10)
    table.close()
    assert result == [0] and all(w.process is None or w.process.returncode is not None for w in pool.workers)
