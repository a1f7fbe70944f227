"""The engine benchmark's own pieces, on the tiny model: the chunked-prefill stage runs the
interruptible pass to the end, the summary prints the chunked column (and both rooflines) beside the whole pass."""

from __future__ import annotations

from harness.bench import engine_bench as bench
from tests.nodes.cluster_fakes import tiny_engine


def test_the_chunked_stage_times_a_whole_interruptible_pass():
    engine = tiny_engine(prefill_chunk_tokens=16)
    assert bench.engine_chunked_prefill_seconds(engine, 40) > 0   # 3 chunks: 16 + 16 + 8
    assert bench.engine_prefill_seconds(engine, 40) > 0


def test_the_summary_shows_chunked_beside_whole(capsys):
    prefill = {"engine_tok_s": 1000.0, "hf_tok_s": 800.0, "hf_all_logits_tok_s": 700.0, "gemm_tok_s": 2000.0,
               "gemm_attention_tok_s": 1600.0, "engine_chunked_tok_s": 900.0}
    decode = {"engine_tok_s": 20.0, "hf_tok_s": 10.0, "gemm_tok_s": 30.0, "engine_step_ms": 50.0, "hf_step_ms": 100.0}
    bench.print_summary({"dtype": "bfloat16", "threads": 1, "weight_bytes": 2**28, "dram_gbs": 10.0,
                         "weights_pass_gbs": 8.0, "floor_step_ms": 25.0, "prefill": {512: prefill},
                         "decode": {1: decode}})
    out = capsys.readouterr().out
    assert "| 512 | 1000 | 800 | 1.25x | 700 | 1.43x | 2000 | 50% | 1600 | 62% | 900 | 0.90x |" in out


def test_the_transformers_decode_baseline_attends_over_its_context():
    """The baseline must decode against CONTEXT cached tokens, as the engine does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=40_000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(config).eval()
    seen = []
    forward = model.forward

    def spy(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        seen.append(None if cache is None else cache.get_seq_length())
        return forward(*args, **kwargs)
    model.forward = spy
    bench.hf_decode_seconds(model, batch=2, num_steps=2)
    assert seen[0] == bench.CONTEXT and seen[-1] == bench.CONTEXT + len(seen) - 1
    assert all(isinstance(n, int) for n in seen)
