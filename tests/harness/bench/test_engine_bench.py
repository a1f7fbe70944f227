"""The engine benchmark's own pieces, on the tiny model: the chunked-prefill stage runs the
interruptible pass to the end, the summary prints the chunked column beside the whole pass, and the
attention roofline charges causal FLOPs at the linear layers' GEMM rate."""

from __future__ import annotations

from harness.bench import engine as bench
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


def test_the_attention_roofline_charges_causal_flops_at_the_linear_layers_rate():
    import torch

    from nodes.engines.model_loader import build_tiny_model
    config = build_tiny_model().config
    # 3 tokens: query i sees i + 1 keys -> 6 (query, key) pairs, 4 * head_dim FLOPs each.
    assert bench.attention_flops(config, 3) == 6 * 4 * config.head_dim * config.num_heads * config.num_layers
    weights = [torch.zeros(8, 4), torch.zeros(2, 4), torch.zeros(16, 4)]   # two layers' matrices, the head
    assert bench.linear_flops(weights, 10, 1) == 2 * 10 * (32 + 8) + 2 * 64
    gemm_s = 1e-3
    rate = bench.linear_flops(weights, 3, 1) / gemm_s
    assert bench.roofline_with_attention_seconds(config, weights, 3, gemm_s) == gemm_s + bench.attention_flops(config, 3) / rate


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
