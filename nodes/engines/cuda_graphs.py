"""CUDA graphs for pure decode steps: one graph replay instead of some 600 kernel launches a step.

Contract: `DecodeGraphs(runner, max_graphs=, recorder=)` serves `LlamaRunner.forward` on a CUDA
device; `recorder` (default `CudaRecorder`) is what touches CUDA: the eager run on a side stream,
the capture, the memory pools (tests pass a stand-in that replays by running the step again, so
the policy below runs on a CPU: tests/nodes/engines/test_cuda_graphs.py).
`can_run(batch)` says whether a `ForwardBatch` is a step a graph can serve: pure decode (no prefill
span) over dense slots (rows are slots 0..n-1, as the engine keeps them) with every row sampled.
`run(batch)` returns that step's logits [rows, vocab] float32, as the eager forward does up to
rounding (the graph attends over a bucket of keys, the eager step over exactly the longest context;
masked keys weigh 0 either way). `num_captures` / `num_replays` count what it did. A capture that
fails turns the graphs off for good (`enabled`, logged once): the step it failed in returns the
logits of its eager run, so no request notices, and later steps run eagerly.

Why: on a GPU a decode step of a small model is bound by kernel launches, not by the GPU: 30 layers
of some 20 small kernels each, every launch microseconds of Python and driver time, while the
step's arithmetic takes microseconds on an H200. A graph replays the whole step in one launch
(vLLM and SGLang capture their decode steps the same way). On an H200 a float32 batch-1 step of
SmolLM2 took 16.6 ms eagerly and 4.6 ms replayed (docs/BENCHMARKS.md, "On a GPU").

How: one graph per (rows, key bucket) for the current slot-cache layout, captured the first time
that key is met. That step runs eagerly on the graph's static input buffers (a real step: its
logits are returned, its KV written), then the same forward is captured, which executes nothing.
Later steps of that key copy their token ids, positions and sample rows into the static buffers and
replay. The keys attended are a power-of-two bucket of the longest context (at least `MIN_KEYS`, at
most the cache's capacity), masked per row inside the graph from the positions, so a growing
context is captured again only when it crosses a bucket. Graphs hold the slot cache's addresses:
a new layout (the store grew or moved, kv_slots.py) drops them all. At most `max_graphs` are kept,
the least recently used dropped first; the graphs of one layout share one memory pool, which is
safe because replays never overlap (one stream, one step at a time). Dropping them all starts a new
pool. A pool whose graphs are all gone stays in torch's allocator, at use count 0, for as long as a
block of it is still held. A capture naming it then fails the allocator's `use_count > 0` assert
(c10 CUDACachingAllocator's create_or_incref_pool), whereas a new handle makes a new pool. This was
seen on the H200 when the benchmark's batch grew from 8 to 32 requests, the first layout change
after the process's first capture; the same change after earlier captures in other pools passed.
So some block allocated in the first capture outlives its graphs: plausibly cuBLAS's workspace for
torch's shared capture stream, not established.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bus.log import get_logger

MIN_KEYS = 128


@dataclass(slots=True, eq=False)
class _Captured:
    graph: Any                 # what replays the step (torch.cuda.CUDAGraph)
    token_ids: torch.Tensor    # the static inputs the graph reads: kept alive here, since a freed one's
    positions: torch.Tensor    # memory would be reused and the replay read whatever lands there
    sample_rows: torch.Tensor
    rows: torch.Tensor         # 0..rows-1, the slots the graph writes and attends
    logits: torch.Tensor       # the static output it writes


def key_bucket(max_len: int, capacity: int) -> int:
    """Keys a graph attends over for a longest context of `max_len`: a power of two, at least
    MIN_KEYS, never past the cache's `capacity`."""
    return min(capacity, max(MIN_KEYS, 1 << (max_len - 1).bit_length()))


class CudaRecorder:
    """The CUDA side of DecodeGraphs (tests replace it to run the graph policy on a CPU)."""

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def run_eagerly(self, forward: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
        """`forward()` for real on a side stream, as torch asks of the run before a capture."""
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            logits = forward()
        torch.cuda.current_stream(device).wait_stream(side)
        return logits

    def record(self, forward: Callable[[], torch.Tensor], pool: Any) -> tuple[Any, torch.Tensor]:
        """A graph of `forward()` (recorded, not run) and the static output its replays write."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: a node's other threads may use CUDA while this thread captures.
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            logits = forward()
        return graph, logits


class DecodeGraphs:
    def __init__(self, runner: Any, max_graphs: int = 128, recorder: Any = None) -> None:
        self.runner = runner
        self.max_graphs = max_graphs
        self.recorder = recorder or CudaRecorder()
        self._graphs: OrderedDict[tuple[int, int], _Captured] = OrderedDict()
        self._layout: tuple | None = None
        self._pool = None
        self.enabled = True
        self.num_captures = 0
        self.num_replays = 0

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def can_run(self, batch: Any) -> bool:
        group = batch.decode
        return (self.enabled and group is not None and not batch.spans and group.dense
                and batch.token_ids.shape[0] == group.num_slots == batch.sample_rows.shape[0])

    def run(self, batch: Any) -> torch.Tensor:
        group = batch.decode
        layout = (group.cache.data_ptr(), tuple(group.cache.shape))
        if layout != self._layout:   # the graphs read the old store's addresses
            self._graphs.clear()
            self._pool = None        # and a pool whose graphs are gone takes no capture (docstring)
            self._layout = layout
        key = (group.num_slots, key_bucket(group.max_len, group.cache.shape[4]))
        captured = self._graphs.get(key)
        if captured is None:
            return self._capture(key, batch)
        self._graphs.move_to_end(key)
        captured.token_ids.copy_(batch.token_ids)
        captured.positions.copy_(group.positions)
        captured.sample_rows.copy_(batch.sample_rows)
        captured.graph.replay()
        self.num_replays += 1
        return captured.logits.clone()

    def _capture(self, key: tuple[int, int], batch: Any) -> torch.Tensor:
        num_rows, num_keys = key
        cache = batch.decode.cache
        token_ids, positions = batch.token_ids.clone(), batch.decode.positions.clone()
        sample_rows = batch.sample_rows.clone()
        rows = torch.arange(num_rows, device=cache.device)

        def forward() -> torch.Tensor:
            return self.runner.forward_eager(self._static_batch(token_ids, positions, sample_rows, rows,
                                                                cache, num_keys))

        logits = self.recorder.run_eagerly(forward, cache.device)   # this step, KV written once
        try:
            if self._pool is None:
                self._pool = self.recorder.new_pool()
            graph, static_logits = self.recorder.record(forward, self._pool)
        except RuntimeError as exc:   # this step is done (above); the next ones run eagerly
            self.enabled = False
            self._graphs.clear()
            get_logger("cuda_graphs").warning("cuda_graphs_off", error=str(exc).splitlines()[0][:300])
            return logits
        self._graphs[key] = _Captured(graph, token_ids, positions, sample_rows, rows, static_logits)
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        self.num_captures += 1
        return logits

    def _static_batch(self, token_ids: torch.Tensor, positions: torch.Tensor, sample_rows: torch.Tensor,
                      rows: torch.Tensor, cache: torch.Tensor, num_keys: int) -> Any:
        """The step over the static buffers; its lengths and mask are computed on the GPU, inside the
        graph (row i sees keys 0..position_i)."""
        from nodes.engines.forward_batch import DecodeGroup, ForwardBatch

        group = DecodeGroup(rows=rows, slots=rows, positions=positions, cache=cache, num_slots=rows.shape[0],
                            lengths=positions + 1, max_len=num_keys, dense=True)
        return ForwardBatch(token_ids=token_ids, positions=positions, sample_rows=sample_rows, decode=group)
