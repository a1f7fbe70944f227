"""The CUDA-graph policy of cuda_graphs.py on a CPU: a stand-in recorder "replays" a step by running
it again over the graph's static buffers, so what the policy decides (which steps replay, the key
buckets, a new slot-cache layout dropping the graphs and their pool, the LRU bound, a failed
capture falling back to eager steps) is checked without a GPU. The real graphs are tested on one
in test_engine_cuda.py (marked gpu)."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.base import SamplingParams
from nodes.engines.cuda_graphs import MIN_KEYS, DecodeGraphs, key_bucket
from nodes.engines.llama import LlamaRunner
from tests.nodes.engines.engine_helpers import make_engine, record_logits, run_arrivals

PROMPTS = ["Hello world! How are you today?", "The quick brown fox", "def main(): return 0",
           "Once upon a time there was a little model that wanted to write stories about the sea"]


class ReplayRecorder:
    """CUDA graphs' stand-in: `record` keeps the step (running it once for its output's shape: the
    KV it writes again is the same), `replay` runs it again into that static output."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.num_pools = 0

    def new_pool(self) -> int:
        self.num_pools += 1
        return self.num_pools

    def run_eagerly(self, forward, device):
        return forward()

    def record(self, forward, pool):
        if self.fail:
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED\nmore detail")
        logits = forward()

        class Graph:
            @staticmethod
            def replay() -> None:
                logits.copy_(forward())
        return Graph(), logits


def engine_with(model, recorder=None, max_graphs: int = 128, **settings):
    """An engine whose runner takes the plain torch path a GPU takes (no CPU kernels), with graphs
    on `recorder` (or none)."""
    engine = make_engine(model, device="cpu", **settings)
    runner = LlamaRunner(model.config, model.weights, dtype=torch.float32, max_len=engine.max_model_len,
                         use_kernels=False)
    if recorder is not None:
        runner.graphs = DecodeGraphs(runner, max_graphs=max_graphs, recorder=recorder)
    engine.runner = runner
    return engine


def run(engine, prompts, arrivals, samplings) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]]]:
    """Each request's tokens and sampled logits (engine_helpers.run_arrivals)."""
    seen = record_logits(engine)
    return run_arrivals(engine, prompts, arrivals, samplings=samplings), seen


def scenario(model, num_requests: int = 4, max_tokens: int = 12):
    prompts = [tuple(model.tokenizer.encode(PROMPTS[i % 4]))[: 5 + i] for i in range(num_requests)]
    samplings = {i: SamplingParams(temperature=0.0, max_tokens=max_tokens + 3 * i, ignore_eos=True)
                 for i in range(num_requests)}
    return prompts, samplings


def test_keys_attended_are_power_of_two_buckets_within_the_capacity():
    assert key_bucket(1, 256) == MIN_KEYS == key_bucket(128, 4096)
    assert key_bucket(129, 4096) == 256 and key_bucket(513, 8192) == 1024
    assert key_bucket(300, 256) == 256 and key_bucket(5, 64) == 64


def test_graph_steps_equal_eager_steps_and_only_pure_decode_steps_replay(tiny_model):
    prompts, samplings = scenario(tiny_model)
    arrivals = {0: [0], 3: [1, 2], 9: [3]}   # joins make mixed steps, which run eagerly
    recorder = ReplayRecorder()
    graphed = engine_with(tiny_model, recorder)
    tokens, logits = run(graphed, prompts, arrivals, samplings)
    eager_tokens, eager_logits = run(engine_with(tiny_model), prompts, arrivals, samplings)
    assert tokens == eager_tokens
    for rid in logits:
        for a, b in zip(logits[rid], eager_logits[rid], strict=True):
            assert (a - b).abs().max().item() < 1e-5
    graphs = graphed.runner.graphs
    assert graphs.num_replays > graphs.num_captures > 0 and graphs.enabled


def test_a_new_slot_cache_layout_drops_the_graphs_and_starts_a_new_pool(tiny_model):
    """Four decode, eight join (more than 8 slots: a new layout), finish first, and the four go on:
    the graph for four rows is captured again in a new pool, and no token changes."""
    prompts, _ = scenario(tiny_model, num_requests=12)
    samplings = {i: SamplingParams(temperature=0.0, max_tokens=60 if i < 4 else 20, ignore_eos=True)
                 for i in range(12)}
    arrivals = {0: [0, 1, 2, 3], 10: list(range(4, 12))}
    recorder = ReplayRecorder()
    graphed = engine_with(tiny_model, recorder, preallocate_kv=False)
    tokens, _ = run(graphed, prompts, arrivals, samplings)
    assert tokens == run(engine_with(tiny_model, preallocate_kv=False), prompts, arrivals, samplings)[0]
    assert recorder.num_pools >= 2
    assert graphed.runner.graphs.num_captures >= 3   # 4 rows, 12 rows, 4 rows again


def test_at_most_max_graphs_are_kept(tiny_model):
    prompts, samplings = scenario(tiny_model, num_requests=6, max_tokens=4)
    engine = engine_with(tiny_model, ReplayRecorder(), max_graphs=2)
    run(engine, prompts, {0: list(range(6))}, samplings)   # they finish one by one: 6, 5, ... rows
    graphs = engine.runner.graphs
    assert graphs.num_captures >= 4 and graphs.num_graphs == 2


def test_a_failed_capture_turns_graphs_off_and_loses_no_token(tiny_model, capsys):
    prompts, samplings = scenario(tiny_model)
    arrivals = {0: [0, 1, 2, 3]}
    failing = engine_with(tiny_model, ReplayRecorder(fail=True))
    tokens, _ = run(failing, prompts, arrivals, samplings)
    assert tokens == run(engine_with(tiny_model), prompts, arrivals, samplings)[0]
    graphs = failing.runner.graphs
    assert not graphs.enabled and graphs.num_captures == graphs.num_replays == graphs.num_graphs == 0
    output = capsys.readouterr()
    assert (output.out + output.err).count("cuda_graphs_off") == 1   # said once, not every step


@pytest.mark.parametrize("steps_with_prefill", [True, False])
def test_steps_a_graph_cannot_serve_are_refused(tiny_model, steps_with_prefill):
    """A prefill chunk beside the decode rows, or a decode row that samples nothing, runs eagerly."""
    engine = engine_with(tiny_model, ReplayRecorder())
    graphs = engine.runner.graphs
    seen = []
    original = graphs.can_run
    graphs.can_run = lambda batch: seen.append((bool(batch.spans), original(batch))) or original(batch)
    prompts, samplings = scenario(tiny_model, num_requests=2)
    run(engine, prompts, {0: [0], 2: [1]} if steps_with_prefill else {0: [0, 1]}, samplings)
    assert all(not ok for spans, ok in seen if spans)
    assert any(ok for spans, ok in seen if not spans)
