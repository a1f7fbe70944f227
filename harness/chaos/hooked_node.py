"""Run a pdbus node with the chaos harness's data-plane hooks: `python -m harness.chaos.hooked_node
--control FILE -- <pdbus args>` (only the harness starts nodes this way; production never does).

Contract:
- Sender side (prefill nodes, started with `--test-kv-faults 1` so the node builds an injector):
  the node's `FaultInjector` is replaced by an `ArmedInjector` that injects nothing until the
  harness arms it by writing `{"flip": N}` or `{"drop": N}` (JSON) to the control file; it then
  flips a byte in (or drops) the next N outbound KV CHUNK messages and logs `chaos_kv_fault`
  (kind, n, transfer_id, index) for each, so the harness counts exactly what it injected. Arming mid-run lets the
  fault-free reference pass and the faulted pass share one cluster.
- Prefill delay: while the control file holds `{"prefill_delay_ms": X}` (and, if given,
  `"prefill_delay_node"` names this node), each prefill batch logs `chaos_prefill_started`
  (request ids) and sleeps X ms first, so a kill lands mid-prefill.
The receiver side needs no hook: the KV receiver itself logs every finished transfer
(`kv_received` / `kv_receive_failed`: ok, checksum_failures, rejected, reason) and every message too
damaged to decode (`kv_undecodable`), which is what harness/chaos/checks.kv_fault_audit reads.
The hooks wrap the existing seams (`nodes.prefill_node.FaultInjector`, `PrefillBatcher.next_batch`)
and change no behaviour when unarmed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, cast

from bus.kv import frames
from bus.kv.faults import FaultInjector
from bus.log import get_logger

log = get_logger("chaos_hook")


def read_order(path: str, cache: dict[str, Any]) -> dict[str, Any]:
    """The control file's current order, re-read only when the file changed. The harness replaces
    the file atomically; a file caught half-written anyway keeps the previous order until the next
    read (an exception here would kill the KV send it runs in, leaving that transfer stuck)."""
    try:
        stamp = os.stat(path).st_mtime_ns
        if cache.get("stamp") != stamp:
            with open(path) as file:
                cache.update(stamp=stamp, order=json.load(file))
    except (OSError, ValueError):
        pass
    return cache.get("order", {})


class ArmedInjector(FaultInjector):
    """A FaultInjector that stays off until the control file arms a number of flips or drops."""

    control_path: str = ""

    def __init__(self, **_ignored: Any) -> None:
        super().__init__(seed=int(os.environ.get("PDBUS_CHAOS_SEED", "0")), only_kinds=(frames.CHUNK,), max_faults=0)
        self._cache: dict[str, Any] = {}
        self._armed_at: int | None = None

    def _rearm(self) -> None:
        order = read_order(self.control_path, self._cache)
        if self._cache.get("stamp") == self._armed_at:
            return
        self._armed_at = self._cache.get("stamp")
        if not (order.get("flip") or order.get("drop")):
            self.max_faults = self.num_faults   # a calm order disarms what is left
            return
        count = int(order.get("flip", 0)) + int(order.get("drop", 0))
        self.flip_probability, self.drop_probability = (1.0, 0.0) if order.get("flip") else (0.0, 1.0)
        self.max_faults = self.num_faults + count
        log.info("chaos_kv_armed", order=order)

    def apply(self, frames_out: list[Any]) -> list[Any] | None:
        self._rearm()
        before = self.num_faults
        result = super().apply(frames_out)
        if self.num_faults > before:
            # The original, intact header; a CHUNK's, as `only_kinds` admits no other kind.
            chunk = cast(frames.Chunk, frames.decode_header(frames_out[0]))
            log.info("chaos_kv_fault", kind="drop" if result is None else "flip", n=self.num_faults,
                     transfer_id=chunk.transfer_id, index=chunk.index)
        return result


def install(control_path: str, node_id: str | None = None) -> None:
    import nodes.prefill_node

    ArmedInjector.control_path = control_path
    # Monkeypatches of the node's seams, set with setattr: a class and a method are not assignable
    # attributes to the type checker, and replacing them is the point here.
    setattr(nodes.prefill_node, "FaultInjector", ArmedInjector)  # noqa: B010
    next_batch = nodes.prefill_node.PrefillBatcher.next_batch
    cache: dict[str, Any] = {}

    def delayed_next_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = next_batch(self, *args, **kwargs)
        order = read_order(control_path, cache) if batch else {}
        delay_ms = order.get("prefill_delay_ms", 0) if order.get("prefill_delay_node") in (None, node_id) else 0
        if delay_ms:
            log.info("chaos_prefill_started", request_ids=[r.request_id for r in batch])
            time.sleep(delay_ms / 1000)
        return batch

    setattr(nodes.prefill_node.PrefillBatcher, "next_batch", delayed_next_batch)  # noqa: B010


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--control" or argv[2] != "--":
        print("usage: python -m harness.chaos.hooked_node --control FILE -- <pdbus args>", file=sys.stderr)
        return 2
    rest = argv[3:]
    node_id = rest[rest.index("--node-id") + 1] if "--node-id" in rest[:-1] else None
    install(argv[1], node_id)
    from nodes.cli import main as pdbus_main
    return pdbus_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
