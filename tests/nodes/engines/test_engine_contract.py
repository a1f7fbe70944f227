"""The engine contract (nodes/engines/base.py), one suite for every engine: the built-in engine on
the tiny random model, `CountingEngine` (fake_engine.py: the contract implemented with no runner
and no model), and the vLLM engine on SmolLM2 (marked `vllm`; skipped without vLLM).

vLLM cannot start once numba is loaded (engine_common.py), and collecting the test suite loads it,
so its cases run in a Python process of their own: `test_the_vllm_engine_keeps_the_contract`
starts pytest on this file with `-m vllm`, and only there is the vLLM engine built (once).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from bus.kv import RawPieces
from bus.kv.layout import KVInfo
from bus.liveness import HeartbeatConfig
from nodes import wire
from nodes.engines.base import (
    DecodeRequest,
    Engine,
    EngineConfig,
    EngineStats,
    KvLayout,
    PrefillRequest,
    SamplingParams,
    TokenEvent,
)
from nodes.node_settings import NodeSettings
from tests.integration.vllm_helpers import MODEL, REPO, requires_vllm
from tests.nodes.engines.fake_engine import CountingEngine

IN_OWN_PROCESS = "PDBUS_ENGINE_CONTRACT_VLLM"   # set in the process that runs the vLLM cases
CONFIG = EngineConfig(dtype="float32", max_num_seqs=2, num_kv_blocks=64, block_size=16, max_model_len=64,
                      max_batch_tokens=256, prefill_chunk_tokens=16)
PROMPT = tuple(range(10, 30))          # ids below every vocabulary here
OTHER = tuple(range(40, 52))
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
SCANS_KV = {"builtin", "fake"}          # their unsound_requests() names a request with non-finite KV
REFUSES_UNSOUND_KV = {"vllm"}           # its add_request refuses non-finite KV (its step cannot name it)


def builtin_engine() -> Engine:
    # Imported here: it loads numba (see the module docstring).
    from nodes.engines.llama_engine import LlamaEngine
    from nodes.engines.model_loader import build_tiny_model

    return LlamaEngine(build_tiny_model(seed=0, dtype=torch.float32), CONFIG)


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[Engine]:
    if not os.environ.get(IN_OWN_PROCESS):
        pytest.skip("run in a process of its own by test_the_vllm_engine_keeps_the_contract")
    from nodes.engines.model_loader import open_model_folder
    from nodes.engines.vllm_engine import VllmEngine

    engine = VllmEngine(open_model_folder(MODEL), dataclasses.replace(CONFIG, dtype="bfloat16", num_threads=1))
    yield engine
    engine.close()


@pytest.fixture(params=["builtin", "fake", pytest.param("vllm", marks=[pytest.mark.vllm, requires_vllm])])
def kind(request) -> str:
    return request.param


@pytest.fixture
def engine(kind, request) -> Iterator[Engine]:
    if kind == "vllm":
        engine = request.getfixturevalue("vllm_engine")
        yield engine
        for request_id in ("a", "b", "c", "local", "imported", "nan", "healthy", "s1", "s2"):
            engine.abort(request_id)   # a failed case leaves the shared engine clean for the next
        return
    engine = builtin_engine() if kind == "builtin" else CountingEngine(CONFIG)
    yield engine
    engine.close()


def decode(request_id: str, prompt=PROMPT, sampling: SamplingParams = GREEDY, **fields) -> DecodeRequest:
    return DecodeRequest(request_id, prompt, sampling, **fields)


def run_to_end(engine: Engine) -> dict[str, list[TokenEvent]]:
    events: dict[str, list[TokenEvent]] = {}
    for _ in range(100):
        if not engine.has_unfinished():
            return events
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
    raise AssertionError("the engine did not finish its requests in 100 steps")


def tokens(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None]


def assert_usage_adds_up(engine: Engine) -> None:
    usage = engine.kv_usage()
    assert usage.num_free_blocks + usage.num_running_blocks + usage.num_session_blocks == usage.num_blocks
    assert min(usage.num_free_blocks, usage.num_running_blocks, usage.num_session_blocks) >= 0


def test_it_names_everything_a_node_reads(engine):
    assert isinstance(engine.model_name, str) and engine.model_name
    assert isinstance(engine.config, EngineConfig) and isinstance(engine.stats, EngineStats)
    assert isinstance(engine.kv_layout, KvLayout) and isinstance(engine.copies_imported_kv, bool)
    assert engine.vocab_size > max(PROMPT + OTHER) and 0 < engine.max_model_len <= (CONFIG.max_model_len or 0)
    assert engine.max_num_seqs == CONFIG.max_num_seqs
    assert engine.num_running == 0 and not engine.has_unfinished() and engine.step() == []
    assert engine.tokenizer.decode(engine.tokenizer.encode("hello")) == "hello"
    bounds = wire.Bounds(vocab_size=engine.vocab_size, max_model_len=engine.max_model_len)
    assert bounds.vocab_size == engine.vocab_size   # what nodes.runtime.engine_bounds reads


def test_new_kv_is_a_cpu_tensor_in_the_layout(engine):
    layout = engine.kv_layout
    kv = engine.new_kv(24)
    assert tuple(kv.shape) == layout.shape(24) == (layout.num_layers, 2, layout.num_kv_heads, 24, layout.head_dim)
    assert kv.dtype == layout.dtype and kv.device.type == "cpu" and kv.is_contiguous()
    assert kv.nbytes == layout.num_bytes(24) and layout.dtype_name in ("float32", "bfloat16", "float16")


def test_prefill_gives_each_prompt_its_first_token_and_its_kv_in_the_layout(engine):
    before = engine.stats.num_prefilled_tokens
    results = engine.prefill([PrefillRequest("a", PROMPT, GREEDY), PrefillRequest("b", OTHER, GREEDY)])
    assert [r.request_id for r in results] == ["a", "b"]
    for result, prompt in zip(results, (PROMPT, OTHER), strict=True):
        assert result.num_prompt_tokens == len(prompt) and 0 <= result.first_token_id < engine.vocab_size
        assert tuple(result.kv.shape) == engine.kv_layout.shape(len(prompt))
        assert result.kv.dtype == engine.kv_layout.dtype and result.kv.device.type == "cpu"
        assert result.finish_reason is None and bool(result.kv.isfinite().all())
    assert engine.stats.num_prefilled_tokens == before + len(PROMPT) + len(OTHER)


def test_a_prefill_pass_gives_what_prefill_gives(engine):
    requests = [PrefillRequest("a", PROMPT, GREEDY), PrefillRequest("b", OTHER, GREEDY)]
    expected = {r.request_id: r.first_token_id for r in engine.prefill(requests)}
    # Under another cache salt nothing prefilled above is shared: the pass computes every token.
    requests = [dataclasses.replace(r, cache_salt="another tenant") for r in requests]
    prefill = engine.start_prefill(requests, chunk_tokens=8)
    assert prefill.num_remaining_tokens == len(PROMPT) + len(OTHER) and not prefill.cancel("unknown")
    results = []
    while not prefill.done:
        results += prefill.step()
    assert {r.request_id: r.first_token_id for r in results} == expected and prefill.num_remaining_tokens == 0


def test_a_repeated_prompt_may_come_from_the_prefix_cache_and_changes_no_token(engine):
    prompt = tuple(range(60, 100))   # 2 full blocks of the built-in engine's 16 tokens
    first, again = (engine.prefill([PrefillRequest(r, prompt, GREEDY, cache_salt="contract")])[0] for r in ("p1", "p2"))
    assert first.num_cached_tokens == 0 and 0 <= again.num_cached_tokens < len(prompt)
    assert again.first_token_id == first.first_token_id and tuple(again.kv.shape) == tuple(first.kv.shape)
    holdings = engine.prefix_holdings(24)   # what a prefill node reports for prefix-aware routing
    assert len(holdings) <= 24 and all(name.startswith("px.") and value > 0 for name, value in holdings.items())


def test_a_held_prefix_is_at_most_the_prompt_less_one_token_and_releases_cleanly(engine):
    held = engine.hold_prefix("h", PROMPT, "contract")
    assert 0 <= held < len(PROMPT)
    engine.release_prefix("h")
    engine.release_prefix("h")   # idempotent


def test_the_kv_receiver_takes_a_prefilled_kv_in_the_engine_layout(engine, kv_thread):
    # Imported here: nodes.decode_kv loads numba, which vLLM tolerates only once it has started.
    from nodes.decode_jobs import DecodeJob
    from nodes.decode_kv import KvLanding

    (result,) = engine.prefill([PrefillRequest("a", PROMPT, GREEDY)])
    job = DecodeJob("a", PROMPT, GREEDY, None, wire.PlanKind.REMOTE)
    job.reserve(1, expires_at=0.0)
    settings = NodeSettings(role="decode", broker="tcp://127.0.0.1:1", node_id="n", heartbeat=HeartbeatConfig(),
                            model="m", model_dir=None, kv_compile=False)
    landing = KvLanding(settings, engine, kv_thread, {"a": job}, lambda event: None)
    info = KVInfo(tuple(result.kv.shape), engine.kv_layout.dtype_name)
    for mode in ("int8", "raw"):
        dst = landing.allocate(f"t-{mode}", "a", info, mode)
        if isinstance(dst, RawPieces):   # the engine copies a raw transfer's frames itself
            assert engine.copies_imported_kv and mode == "raw"
        else:
            assert tuple(dst.shape) == tuple(result.kv.shape) and dst.dtype == engine.kv_layout.dtype
            dst.copy_(result.kv)
        landing.give_back(dst)
    layout = engine.kv_layout
    wrong = KVInfo((layout.num_layers + 1, 2, layout.num_kv_heads, len(PROMPT), layout.head_dim), "float32")
    assert landing.allocate("t-wrong", "a", wrong, "int8") is None


def test_admission_answers_ok_full_or_rejected(engine):
    usage = engine.kv_usage()
    too_long = decode("a", tuple([11] * engine.max_model_len))
    assert engine.check_admission(too_long).status == "rejected" and engine.check_admission(too_long).reason
    assert engine.add_request(too_long).status == "rejected" and engine.num_running == 0
    admission = engine.check_admission(decode("a"))
    assert admission.ok and admission.num_blocks_needed >= 1
    assert engine.kv_usage() == usage and engine.num_running == 0   # checking changed nothing
    assert engine.add_request(decode("a")).ok and engine.add_request(decode("b", OTHER)).ok
    assert engine.add_request(decode("a")).status == "rejected"   # already running
    full = engine.check_admission(decode("c"))
    assert full.status == "full" and full.reason and engine.add_request(decode("c")).status == "full"
    assert engine.num_running == engine.max_num_seqs == 2
    assert set(run_to_end(engine)) == {"a", "b"} and engine.num_running == 0


def test_a_request_streams_its_tokens_then_ends_and_frees_its_kv(engine):
    free = engine.kv_usage().num_free_blocks
    assert engine.add_request(decode("local")).ok
    assert engine.num_running == 1 and engine.has_unfinished() and engine.kv_usage().num_running_blocks > 0
    assert_usage_adds_up(engine)
    events = run_to_end(engine)["local"]
    streamed = [e for e in events if e.token_id is not None]
    assert [e.index for e in streamed] == list(range(GREEDY.max_tokens))
    assert all(0 <= t < engine.vocab_size for t in tokens(events))
    assert events[-1].finish_reason == "length" and not any(e.finished for e in events[:-1])
    assert engine.num_running == 0 and engine.kv_usage().num_running_blocks == 0
    assert engine.kv_usage().num_free_blocks == free and engine.stats.num_generated_tokens >= GREEDY.max_tokens


def test_abort_frees_the_request_at_once_and_is_idempotent(engine):
    assert engine.add_request(decode("a")).ok
    engine.step()
    event = engine.abort("a")
    assert event is not None and event.request_id == "a" and event.finish_reason == "abort" and event.token_id is None
    assert engine.num_running == 0 and engine.kv_usage().num_running_blocks == 0
    assert engine.abort("a") is None and engine.abort("never-seen") is None
    run_to_end(engine)


def test_imported_kv_and_first_token_continue_as_a_local_prefill_would(engine):
    assert engine.add_request(decode("local")).ok
    local = tokens(run_to_end(engine)["local"])
    (result,) = engine.prefill([PrefillRequest("imported", PROMPT, GREEDY)])
    assert result.first_token_id == local[0]
    imported_before = engine.stats.num_imported_tokens
    assert engine.add_request(decode("imported", kv=result.kv, first_token_id=result.first_token_id)).ok
    events = run_to_end(engine)["imported"]
    assert tokens(events) == local[1:] and events[0].index == 1
    assert engine.stats.num_imported_tokens > imported_before


def test_unsound_requests_names_only_running_requests(engine, kind):
    nan = torch.full(engine.kv_layout.shape(len(OTHER)), float("nan"), dtype=engine.kv_layout.dtype)
    assert engine.add_request(decode("healthy")).ok
    admission = engine.add_request(decode("nan", OTHER, kv=nan, first_token_id=7))
    if kind in REFUSES_UNSOUND_KV:
        assert admission.status == "rejected" and "non-finite" in admission.reason
    else:
        assert admission.ok
    unsound = engine.unsound_requests()
    assert set(unsound) <= {"healthy", "nan"}
    if kind in SCANS_KV:
        assert unsound == ["nan"]
    engine.abort("nan")
    engine.abort("healthy")
    assert engine.unsound_requests() == [] and engine.num_running == 0


def test_a_finished_session_is_kept_or_not_and_dropping_it_frees_it(engine):
    assert engine.cached_session_tokens("unknown") == 0 and engine.drop_session("unknown") is False
    assert engine.add_request(decode("s1", session_id="chat")).ok
    first = tokens(run_to_end(engine)["s1"])
    assert_usage_adds_up(engine)
    num_cached = engine.cached_session_tokens("chat")
    assert 0 <= num_cached <= len(PROMPT) + len(first)
    if num_cached == 0:   # an engine that keeps no sessions (vLLM: prefix caching is off)
        assert engine.drop_session("chat") is False
        return
    assert engine.kv_usage().num_sessions == 1 and engine.kv_usage().num_session_blocks > 0
    reused = engine.stats.num_reused_tokens
    assert engine.add_request(decode("s2", PROMPT + tuple(first) + (5, 6), session_id="chat")).ok
    run_to_end(engine)
    assert engine.stats.num_reused_tokens > reused
    assert engine.drop_session("chat") is True and engine.cached_session_tokens("chat") == 0
    assert engine.drop_session("chat") is False and engine.kv_usage().num_session_blocks == 0
    assert_usage_adds_up(engine)


def test_the_kernel_report_is_a_loggable_dict(engine):
    import json
    report = engine.kernel_report()
    assert isinstance(report, dict)
    json.dumps(report)   # a node logs it as JSON


def test_reserving_kv_memory_twice_is_harmless(engine):
    engine.reserve_kv_memory()
    engine.reserve_kv_memory()
    assert engine.add_request(decode("a")).ok and run_to_end(engine)["a"][-1].finish_reason == "length"


@pytest.mark.vllm
@requires_vllm
@pytest.mark.timeout(900)
def test_the_vllm_engine_keeps_the_contract():
    """The vLLM cases of this file, in a process where vLLM starts before anything loads numba."""
    if os.environ.get(IN_OWN_PROCESS):
        pytest.skip("this is that process")
    run = subprocess.run([sys.executable, "-m", "pytest", __file__, "-m", "vllm", "-q", "-p", "no:cacheprovider"],
                         env={**os.environ, IN_OWN_PROCESS: "1"}, cwd=REPO, capture_output=True, text=True,
                         timeout=850, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
