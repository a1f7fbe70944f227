"""In-process doubles for the node tests: an endpoint that records what a node sends (no
sockets), settings for the tiny model, and a tiny engine."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import torch

from bus.liveness import HeartbeatConfig
from bus.mailbox import Mailbox
from nodes.engines.base import EngineConfig
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import build_tiny_model
from nodes.node_settings import NodeSettings


@dataclass
class FakeCore:
    data_endpoint: str = "tcp://127.0.0.1:1"
    capacity: dict = field(default_factory=dict)


class FakeEndpoint:
    def __init__(self, node_id: str = "node-a") -> None:
        self.node_id = node_id
        self.core = FakeCore()
        self.inbox = Mailbox()
        self.sent: list[tuple[str, Any]] = []   # (kind, (request_id or peer, body...))
        self.num_batches = 0
        self.heartbeat = HeartbeatConfig()

    def receive(self, timeout: float | None = None) -> Any:
        return self.inbox.get(timeout)

    def reply(self, request_id: str, body: Any = None, payload: tuple = ()) -> None:
        self.sent.append(("partial", request_id, body))

    def reply_batch(self, items: list[tuple[str, Any]]) -> None:
        self.sent.extend(("partial", request_id, body) for request_id, body in items)
        self.num_batches += 1

    def reply_final(self, request_id: str, body: Any = None, payload: tuple = ()) -> None:
        self.sent.append(("final", request_id, body))

    def reply_error(self, request_id: str, code: str, message: str = "", **details: Any) -> None:
        self.sent.append(("error", request_id, {"code": code, "message": message, **details}))

    def send_direct(self, node_id: str, body: Any = None, payload: tuple = ()) -> None:
        self.sent.append(("direct", node_id, body))

    def update_capacity(self, capacity: dict) -> None:
        self.sent.append(("capacity", "", dict(capacity)))

    def change_role(self, role: str) -> None:
        self.sent.append(("ready", role, None))

    def of(self, kind: str, request_id: str | None = None) -> list[Any]:
        return [body for k, rid, body in self.sent if k == kind and (request_id is None or rid == request_id)]


def tiny_settings(role: str, **overrides: Any) -> NodeSettings:
    values = dict(role=role, broker="tcp://127.0.0.1:1", node_id="node-a", heartbeat=None, model="tiny",
                  model_dir=None, engine={"dtype": "float32"}, kv_quant="raw", kv_compression="none",
                  kv_compile=False)
    values.update(overrides)
    return NodeSettings(**values)


def tiny_engine(**config: Any) -> LlamaEngine:
    config.setdefault("dtype", "float32")
    return LlamaEngine(build_tiny_model(seed=0, dtype=torch.float32), EngineConfig(**config))


def no_args(**values: Any) -> argparse.Namespace:
    base = dict(config=None, broker=None, node_id=None, model=None, model_dir=None, dtype=None, threads=None,
                kv_quant=None, kv_compression=None, kv_bind=None, kv_advertise=None, heartbeat_ms=None,
                liveness=None,
                test_prefill_delay_ms=0, test_step_delay_ms=0, test_kv_faults=0)
    base.update(values)
    return argparse.Namespace(**base)
