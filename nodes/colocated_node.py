"""The colocated node (`pdbus node --role both`): one engine serving both phases.

Contract: `node_works(role, settings, engine, kv_thread) -> list[Work]` for `prefill`, `decode`,
`both` and `switchable` (a prefill or decode node that may switch role: both works on one engine,
the decode one binding its KV data endpoint; the node loop lets only the current role's take
requests, nodes/node_control.py). A `both` node answers every `decode` request with plan `local`: the prompt is prefilled in
chunks by the same engine, interleaved with running decode steps (`step()` batches decode tokens
first, then prefill chunks up to `prefill_chunk_tokens`, the vLLM policy), so no KV moves. It also
serves `prefill` requests from clients that chose it as a prefill node, sending the KV like a
prefill node. It binds no KV data endpoint (it never needs KV from others).
"""

from __future__ import annotations

from nodes.decode_node import DecodeWork
from nodes.engines.base import Engine
from nodes.loop_thread import LoopThread
from nodes.node_settings import NodeSettings
from nodes.prefill_node import PrefillWork
from nodes.runtime import Work


def node_works(role: str, settings: NodeSettings, engine: Engine, kv_thread: LoopThread) -> list[Work]:
    if role == "prefill":
        return [PrefillWork(settings, engine, kv_thread)]
    if role == "decode":
        return [DecodeWork(settings, engine, kv_thread)]
    if role == "both":
        return [DecodeWork(settings, engine, kv_thread, always_local=True), PrefillWork(settings, engine, kv_thread)]
    if role == "switchable":
        return [DecodeWork(settings, engine, kv_thread), PrefillWork(settings, engine, kv_thread)]
    raise ValueError(f"no engine node for role {role!r}")
