"""`make bench-kv-quality`: what each KV quantization mode does to SmolLM2-135M's predictions.

Run under the shared lock: `flock /tmp/pdbus-bench.lock make bench-kv-quality` (or
`python -m harness.bench.kv_quality [--prompts N]`). For N windows of the committed held-out text
(harness/bench/data, King James Bible excerpt, public domain) it computes the prompt's KV, sends it
through the real codec (encode -> frames -> verify -> decode, numpy path) in each mode, and
compares the model's continuation with the exact KV against the round-tripped KV: perplexity of
the next C tokens (teacher forced), top-1 agreement, mean KL(exact || mode), and a greedy 64-token
continuation (share of positions equal, first divergence). The last prompt token is fed again on
top of the cache so every scored prediction attends to the round-tripped KV.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":   # the bench's own process only, as harness/bench/kv_bench.py: an importer keeps its environment
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bus.kv.chunk_codec import ChunkEncoder, verify_and_decode  # noqa: E402
from bus.kv.frames import Chunk, decode_message, encode_message  # noqa: E402
from bus.kv.quant import NumpyQuantizer  # noqa: E402
from harness.bench.kv_model import held_out_text, load_model, prompt_kv  # noqa: E402
from harness.bench.kv_quant_variants import VARIANTS, round_trip_variant  # noqa: E402

CODEC_MODES = ("raw", "bf16", "int8", "int8_sym")
TARGETS = {"ppl_increase_pct": 1.0, "top1": 0.99, "kl": 1e-4}


def codec_round_trip(kv: np.ndarray, mode: str) -> np.ndarray:
    """The prompt KV after the real codec: chunked, framed, verified, decoded into float32."""
    quantizer = NumpyQuantizer()
    encoder = ChunkEncoder(kv, quantizer, transfer_id="q", request_id="q", mode=mode, compression="none")
    outs = [np.empty(n, np.uint8) for n in encoder.buffer_sizes()]
    dst = np.empty_like(kv)
    for index in range(encoder.num_chunks):
        header, wire = encoder.encode(index, outs)
        chunk, payload = decode_message([bytes(memoryview(f).cast("B")) for f in encode_message(header, wire)])
        assert isinstance(chunk, Chunk)   # the encoder's header, decoded
        verify_and_decode(chunk, payload, quantizer, dst)
    return dst


def make_cache(kvs: list[np.ndarray]):
    """A transformers cache holding one batch row per KV (same shape)."""
    from transformers import DynamicCache
    cache = DynamicCache()
    batch = torch.from_numpy(np.stack(kvs))            # (batch, layers, 2, heads, tokens, head_dim)
    for layer in range(batch.shape[1]):
        cache.update(batch[:, layer, 0].clone(), batch[:, layer, 1].clone(), layer)
    return cache


@torch.inference_mode()
def continuations(model, kvs: list[np.ndarray], last_token: int, targets: list[int], greedy_tokens: int):
    """Per KV: (log-probs of the teacher-forced continuation, greedy token ids), one batch for all."""
    batch, past = len(kvs), kvs[0].shape[3]
    inputs = torch.tensor([[last_token, *targets[:-1]]] * batch)
    positions = torch.arange(past, past + inputs.shape[1])[None].expand(batch, -1)
    logits = model(inputs, past_key_values=make_cache(kvs), position_ids=positions, use_cache=True).logits
    cache, tokens, generated = make_cache(kvs), torch.full((batch, 1), last_token), []
    for step in range(greedy_tokens):
        out = model(tokens, past_key_values=cache, position_ids=torch.full((batch, 1), past + step), use_cache=True)
        cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        generated.append(tokens[:, 0])
    greedy = torch.stack(generated, dim=1).tolist() if generated else [[] for _ in kvs]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [(logp[i], greedy[i]) for i in range(batch)]


def compare(exact, other, targets) -> dict:
    logp_exact, greedy_exact = exact
    logp, greedy = other
    index = torch.arange(len(targets))
    target_ids = torch.tensor(targets)
    kl = (logp_exact.exp() * (logp_exact - logp)).sum(-1)
    equal = [a == b for a, b in zip(greedy_exact, greedy, strict=True)]
    return {"nll": float(-logp[index, target_ids].sum()), "nll_exact": float(-logp_exact[index, target_ids].sum()),
            "top1": float((logp.argmax(-1) == logp_exact.argmax(-1)).float().mean()), "kl": float(kl.mean()),
            "greedy_match": sum(equal) / len(equal),
            "first_divergence": equal.index(False) if False in equal else len(equal)}


def summarize(rows: list[dict], num_targets: int) -> dict:
    tokens = num_targets * len(rows)
    ppl = float(np.exp(sum(r["nll"] for r in rows) / tokens))
    ppl_exact = float(np.exp(sum(r["nll_exact"] for r in rows) / tokens))
    return {"ppl": ppl, "ppl_exact": ppl_exact, "ppl_increase_pct": (ppl / ppl_exact - 1) * 100,
            "top1": float(np.mean([r["top1"] for r in rows])), "kl": float(np.mean([r["kl"] for r in rows])),
            "greedy_match": float(np.mean([r["greedy_match"] for r in rows])),
            "first_divergence": float(np.mean([r["first_divergence"] for r in rows])),
            "identical_greedy": sum(r["greedy_match"] == 1.0 for r in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=896)
    parser.add_argument("--scored-tokens", type=int, default=128)
    parser.add_argument("--greedy-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    model, tokenizer = load_model()
    ids = tokenizer(held_out_text())["input_ids"]
    window = args.prompt_tokens + args.scored_tokens
    stride = (len(ids) - window) // max(1, args.prompts - 1)
    modes = [*CODEC_MODES, *VARIANTS]
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}
    for prompt in range(args.prompts):
        start = prompt * stride
        prompt_ids = ids[start:start + args.prompt_tokens]
        targets = ids[start + args.prompt_tokens:start + window]
        kv = prompt_kv(model, prompt_ids[:-1])
        round_tripped = [codec_round_trip(kv, m) if m in CODEC_MODES else round_trip_variant(kv, m) for m in modes]
        assert round_tripped[0].tobytes() == kv.tobytes(), "raw must be bit-exact"
        # The exact KV rides in the same batch, so batching effects are identical for every mode.
        exact, *others = continuations(model, [kv, *round_tripped], prompt_ids[-1], targets, args.greedy_tokens)
        for mode, other in zip(modes, others, strict=True):
            rows[mode].append(compare(exact, other, targets))
        print(f"prompt {prompt + 1}/{args.prompts} done at {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(f"# bench-kv-quality: SmolLM2-135M (fp32, transformers), {args.prompts} prompts of "
          f"{args.prompt_tokens} tokens from the held-out text ({len(ids)} tokens; {args.prompts * window} used), "
          f"{args.scored_tokens} scored tokens each, greedy {args.greedy_tokens}; {time.perf_counter() - started:.0f} s\n")
    print("| mode | wire bytes/value | perplexity (exact -> mode) | increase | top-1 agreement | mean KL | "
          "greedy match | mean first divergence | identical greedy |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    sizes = {"raw": 4, "bf16": 2, "int8": 1 + 4 / 64, "int8_sym": 1 + 2 / 64, "int8_f32params": 1 + 8 / 64,
             "int8_head": 1.0, "int8_tensor": 1.0}
    for mode in modes:
        s = summarize(rows[mode], args.scored_tokens)
        print(f"| {mode} | {sizes[mode]:.3f} | {s['ppl_exact']:.3f} -> {s['ppl']:.3f} | {s['ppl_increase_pct']:+.3f}% | "
              f"{s['top1'] * 100:.2f}% | {s['kl']:.2e} | {s['greedy_match'] * 100:.1f}% | {s['first_divergence']:.1f} | "
              f"{s['identical_greedy']}/{args.prompts} |")
    default = summarize(rows["int8"], args.scored_tokens)
    print("\nTargets for the default int8: perplexity increase <= 1% "
          f"({'met' if default['ppl_increase_pct'] <= 1 else 'MISSED'}), top-1 >= 99% "
          f"({'met' if default['top1'] >= 0.99 else 'MISSED'}), mean KL <= 1e-4 "
          f"({'met' if default['kl'] <= 1e-4 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
