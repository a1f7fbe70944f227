"""The engine on the tiny model: greedy equivalence, disaggregation, continuous batching, chunking."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from tests.nodes.engines.engine_helpers import (
    GREEDY,
    drain,
    engine_device,
    full_logits,
    generate,
    make_engine,
    raw_pieces,
    reference_greedy,
    tokens_of,
)

PROMPTS = ["Hello world! How are you today?", "The quick brown fox", "def main(): return 0",
           "Once upon a time there was a little model that wanted to write stories about the sea"]


def encode(model, text):
    return tuple(model.tokenizer.encode(text))


def test_runner_matches_transformers_on_the_tiny_model(tiny_model):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**tiny_model.config.to_hf_dict())).eval()
    hf.load_state_dict(tiny_model.weights, strict=False)
    ids = list(encode(tiny_model, PROMPTS[3]))
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    engine = make_engine(tiny_model)
    assert torch.allclose(full_logits(engine.runner, ids).cpu(), expected, atol=1e-5)


def test_colocated_greedy_equals_uncached_recomputation(tiny_model):
    engine = make_engine(tiny_model)
    for text in PROMPTS:
        prompt = encode(tiny_model, text)
        expected, _ = reference_greedy(engine.runner, prompt, GREEDY.max_tokens)
        assert generate(engine, prompt) == expected


def test_prefill_export_then_decode_import_equals_one_engine(tiny_model):
    colocated, prefill_side, decode_side = (make_engine(tiny_model) for _ in range(3))
    for i, text in enumerate(PROMPTS):
        prompt = encode(tiny_model, text)
        (result,) = prefill_side.prefill([PrefillRequest(f"p{i}", prompt, GREEDY)])
        assert result.kv.shape == (2, 2, 2, len(prompt), 16) and result.kv.dtype == torch.float32
        request = DecodeRequest(f"p{i}", prompt, GREEDY, kv=result.kv.clone(), first_token_id=result.first_token_id)
        assert decode_side.add_request(request).ok
        decoded = [result.first_token_id] + tokens_of(drain(decode_side)[f"p{i}"])
        assert decoded == generate(colocated, prompt)
    assert decode_side.stats.num_prefilled_tokens == 0          # importing recomputed nothing
    assert decode_side.stats.num_imported_tokens == sum(len(encode(tiny_model, t)) for t in PROMPTS)


def test_kv_imported_as_raw_pieces_decodes_as_the_dense_kv(tiny_model):
    """What a decode node hands the engine after a raw transfer (the verified frames, RawPieces)
    gives the tokens of the same KV imported as one tensor."""
    prefill_side, dense_side, pieces_side = (make_engine(tiny_model) for _ in range(3))
    for i, text in enumerate(PROMPTS):
        prompt = encode(tiny_model, text)
        (result,) = prefill_side.prefill([PrefillRequest(f"p{i}", prompt, GREEDY)])
        outputs = []
        for engine, kv in ((dense_side, result.kv.clone()), (pieces_side, raw_pieces(result.kv, 256))):
            assert engine.add_request(DecodeRequest(f"p{i}", prompt, GREEDY, kv=kv, first_token_id=result.first_token_id)).ok
            outputs.append(tokens_of(drain(engine)[f"p{i}"]))
        assert outputs[0] == outputs[1]
    assert pieces_side.stats.num_prefilled_tokens == 0


def test_prefill_batches_many_prompts_like_one_at_a_time(tiny_model):
    engine = make_engine(tiny_model, max_batch_tokens=20)
    requests = [PrefillRequest(str(i), encode(tiny_model, t), GREEDY) for i, t in enumerate(PROMPTS)]
    together = engine.prefill(requests)
    alone = [engine.prefill([r])[0] for r in requests]
    for a, b in zip(together, alone, strict=True):
        assert a.request_id == b.request_id and a.first_token_id == b.first_token_id
        assert torch.allclose(a.kv, b.kv, atol=1e-5)


def test_continuous_batching_matches_solo_runs_at_every_step(tiny_model):
    prompts = [encode(tiny_model, t) for t in PROMPTS]
    sampling = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    solo = {}
    for i, prompt in enumerate(prompts):
        engine = make_engine(tiny_model)
        seen = []
        engine.on_logits = lambda ids, logits, seen=seen: seen.extend(logits)
        solo[str(i)] = (generate(engine, prompt, sampling, str(i)), seen)
    engine = make_engine(tiny_model, max_batch_tokens=24, prefill_chunk_tokens=8)
    seen: dict[str, list[torch.Tensor]] = {}
    engine.on_logits = lambda ids, logits: [seen.setdefault(r, []).append(x) for r, x in zip(ids, logits, strict=True)]
    arrivals = {0: [0], 3: [1, 2], 5: [3]}    # step -> requests joining mid-batch
    events: dict[str, list] = {}
    for step in range(200):
        for i in arrivals.get(step, []):
            assert engine.add_request(DecodeRequest(str(i), prompts[i], sampling)).ok
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
        if step > 5 and not engine.has_unfinished():
            break
    for rid, (tokens, logits) in solo.items():
        assert tokens_of(events[rid]) == tokens
        assert len(seen[rid]) == len(logits)
        for batched, alone in zip(seen[rid], logits, strict=True):
            assert (batched - alone).abs().max() < 1e-4


def test_chunked_prefill_equals_one_pass(tiny_model):
    prompt = encode(tiny_model, PROMPTS[3])
    whole = make_engine(tiny_model, prefill_chunk_tokens=4096)
    chunked = make_engine(tiny_model, prefill_chunk_tokens=5)
    assert generate(whole, prompt) == generate(chunked, prompt)
    assert chunked.stats.num_steps > whole.stats.num_steps


def test_requests_leave_and_slots_stay_dense(tiny_model):
    engine = make_engine(tiny_model)
    lengths = [3, 9, 5]
    for i, n in enumerate(lengths):
        engine.add_request(DecodeRequest(str(i), encode(tiny_model, PROMPTS[i]),
                                         SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
    events = drain(engine)
    assert [len(events[str(i)]) for i in range(3)] == lengths
    assert [events[str(i)][-1].finish_reason for i in range(3)] == ["length"] * 3
    for i, n in enumerate(lengths):   # the survivors' moves between slots changed nothing
        solo = make_engine(tiny_model)
        assert tokens_of(events[str(i)]) == generate(
            solo, encode(tiny_model, PROMPTS[i]), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    assert engine.slots.tensor is not None and engine.slots.num_slots == 0   # kept when idle, empty


def test_a_kept_slot_cache_serves_the_next_requests_exactly_as_a_fresh_engine(tiny_model):
    engine = make_engine(tiny_model)
    long_prompt, short_prompt = encode(tiny_model, PROMPTS[3]), encode(tiny_model, PROMPTS[1])
    generate(engine, long_prompt)               # leaves its KV in slot 0, past where the next one ends
    kept = engine.slots.tensor.data_ptr()
    for prompt in (short_prompt, long_prompt):
        assert generate(engine, prompt) == generate(make_engine(tiny_model), prompt)
        assert engine.slots.tensor.data_ptr() == kept   # no new cache for a request that fits


def test_kv_for_a_prefix_or_the_whole_prompt_without_first_token_finishes_the_prefill_here(tiny_model):
    prompt = encode(tiny_model, PROMPTS[3])
    expected = generate(make_engine(tiny_model), prompt)
    (result,) = make_engine(tiny_model).prefill([PrefillRequest("p", prompt, GREEDY)])
    for num_kv in (5, len(prompt)):
        engine = make_engine(tiny_model)
        kv = result.kv[:, :, :, :num_kv].clone()
        assert engine.add_request(DecodeRequest("r", prompt, GREEDY, kv=kv)).ok
        assert tokens_of(drain(engine)["r"]) == expected
        assert engine.stats.num_prefilled_tokens == len(prompt) - min(num_kv, len(prompt) - 1)


def test_bf16_continuous_batching_gives_each_request_its_solo_tokens(tiny_model):
    """bf16 takes another decode-attention layout (SDPA's GQA); requests leaving mid-batch make the
    slots non-dense, exercising its scatter path too."""
    prompts = [encode(tiny_model, t) for t in PROMPTS[:3]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 9, 6)]
    solo = [generate(make_engine(tiny_model, dtype="bfloat16"), p, s) for p, s in zip(prompts, params, strict=True)]
    engine = make_engine(tiny_model, dtype="bfloat16", prefill_chunk_tokens=4)
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        assert engine.add_request(DecodeRequest(str(i), prompt, sampling)).ok
    events = drain(engine)
    assert [tokens_of(events[str(i)]) for i in range(3)] == solo


def test_after_a_long_request_a_burst_of_short_ones_is_admitted_as_on_a_fresh_engine(tiny_model):
    def admitted(engine):
        short = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        prompt = encode(tiny_model, PROMPTS[1])
        return [engine.add_request(DecodeRequest(f"s{i}", prompt, short)).status for i in range(12)]
    used = make_engine(tiny_model, num_kv_blocks=64, block_size=16)
    generate(used, encode(tiny_model, PROMPTS[0]), SamplingParams(temperature=0, max_tokens=600, ignore_eos=True))
    assert admitted(used) == admitted(make_engine(tiny_model, num_kv_blocks=64, block_size=16))


def test_a_reserved_store_grows_the_running_batch_in_place_and_changes_no_token(tiny_model):
    """Requests join mid-run past 8 slots and with longer rows: the cache is relaid within the store
    reserved at start (nothing allocated), and every request gets its solo tokens."""
    prompts = [encode(tiny_model, PROMPTS[i % 3]) for i in range(10)] + [encode(tiny_model, PROMPTS[3])]
    params = [SamplingParams(temperature=0, max_tokens=6 + i, ignore_eos=True) for i in range(10)]
    params.append(SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))   # rows of 512+ tokens
    solo = [generate(make_engine(tiny_model), p, s) for p, s in zip(prompts, params, strict=True)]
    engine = make_engine(tiny_model)
    engine.reserve_kv_memory()
    store = engine.slots._store.data_ptr()
    assert engine.slots.num_store_tokens == engine.config.num_kv_blocks * engine.config.block_size
    arrivals = {0: range(0, 7), 2: range(7, 10), 4: [10]}   # 7 slots, then 10 (grows), then longer rows
    events: dict[str, list] = {}
    shapes = set()
    for step in range(1000):
        for i in arrivals.get(step, []):
            assert engine.add_request(DecodeRequest(str(i), prompts[i], params[i])).ok
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
        shapes.add(tuple(engine.slots.tensor.shape))
        assert engine.slots.tensor.data_ptr() == store
        if step > 4 and not engine.has_unfinished():
            break
    assert len(shapes) >= 3                      # it did grow twice: slots, then capacity
    assert [tokens_of(events[str(i)]) for i in range(11)] == solo


def test_without_preallocation_reserving_allocates_nothing(tiny_model):
    engine = make_engine(tiny_model, preallocate_kv=False)
    engine.reserve_kv_memory()
    assert engine.slots.num_bytes == 0 and engine.kv_usage().num_slot_cache_bytes == 0


def test_a_kept_session_lives_in_the_reserved_store_and_takes_no_memory_of_its_own(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=256, block_size=16)   # 4096 tokens, 2 MiB
    engine.reserve_kv_memory()
    budget_bytes = engine.slots.num_bytes   # the layout while it runs: 8 x 256 tokens, half of it
    prompt = encode(tiny_model, PROMPTS[3])
    sampling = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    assert engine.add_request(DecodeRequest("s", prompt, sampling, session_id="chat")).ok
    drain(engine)
    payload = engine.sessions.get("chat").payload
    assert payload.untyped_storage().data_ptr() == engine.slots._store.untyped_storage().data_ptr()
    assert engine.slots.num_bytes == budget_bytes and len(engine.slots.sessions) == 1


@pytest.mark.skipif(engine_device() != "cpu", reason="host memory is checked on the CPU only; on a GPU the "
                    "allocator's refusal is (test_engine_cuda.py)")
def test_a_kv_budget_beyond_the_memory_available_is_a_clear_error_before_any_of_it_is_touched(
        tiny_model, monkeypatch):
    from nodes.engines import hugepages
    from nodes.engines.kv_reservation import KVMemoryError
    monkeypatch.setattr(hugepages, "available_bytes", lambda: 1 << 20)   # 1 MiB left
    engine = make_engine(tiny_model)
    with pytest.raises(KVMemoryError, match=r"num_kv_blocks = 2048 .* preallocate_kv = false"):
        engine.reserve_kv_memory()
    assert engine.slots.num_bytes == 0
    assert generate(engine, encode(tiny_model, PROMPTS[0]))        # still serves, on demand
    make_engine(tiny_model, preallocate_kv=False).reserve_kv_memory()   # nothing asked, nothing refused


def test_an_allocator_refusing_the_kv_budget_is_the_same_clear_error(tiny_model, monkeypatch):
    from nodes.engines.kv_reservation import KVMemoryError
    engine = make_engine(tiny_model)

    def refuse(num_tokens):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB\nmore detail")
    monkeypatch.setattr(engine.slots, "reserve", refuse)
    with pytest.raises(KVMemoryError, match=r"allocating it failed \(CUDA out of memory. Tried to allocate 80.00 GiB\)"):
        engine.reserve_kv_memory()
