"""The plain-pyzmq peers of bench-kv's baselines, served in the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio

from harness.bench.kv_baselines import serve_bare, serve_checked


async def start_baseline_servers():
    """(servers, {"bare": endpoint, "checked": endpoint}, serving tasks) on loopback TCP."""
    context = zmq.asyncio.Context.instance()
    servers, endpoints, tasks = [], {}, []
    for name, serve in (("bare", serve_bare), ("checked", serve_checked)):
        server = context.socket(zmq.ROUTER)
        server.bind("tcp://127.0.0.1:0")
        tasks.append(asyncio.get_running_loop().create_task(serve(server)))
        endpoints[name] = server.getsockopt_string(zmq.LAST_ENDPOINT)
        servers.append(server)
    return servers, endpoints, tasks


async def stop_servers(servers, tasks) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for server in servers:
        server.close(linger=0)
