"""`pdbus generate`: stream a completion from the built-in engine, locally (no broker, no nodes).

Contract: `add_arguments(parser)` and `main(args) -> int`. The prompt (wrapped in the model's chat
template with `--chat`) runs through one colocated `LlamaEngine`; text is written to stdout as each
token is produced, and one summary line (tokens, time to first token, decode tokens/s, finish
reason) goes to stderr. Engine settings come from the config's `[engine]` section, then flags.
A model that cannot be loaded, or bad sampling settings, give one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import time

from nodes.config_file import load_settings, section
from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams
from nodes.engines.engine_common import DTYPES
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import DEFAULT_MODEL, ModelLoadError, load_model
from nodes.node_settings import engine_flag_values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help=f"model spec: {DEFAULT_MODEL!r} (packaged), 'tiny', an HF folder or a .gguf")
    parser.add_argument("--model-dir", help="model cache directory (default: $PDBUS_MODEL_DIR or <repo>/.models)")
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn of the chat template")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--dtype", choices=["auto", *sorted(DTYPES)],
                        help="engine dtype (default: [engine] dtype or auto)")
    parser.add_argument("--device", help="engine device: cpu, cuda or cuda:N (default: [engine] device or cpu)")
    parser.add_argument("--threads", type=int, help="torch threads (default: [engine] num_threads or 1)")


def engine_config(args: argparse.Namespace, settings: dict) -> EngineConfig:
    return EngineConfig.from_dict(dict(section(settings, "engine")) | engine_flag_values(args))


def main(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    engine_settings = section(settings, "engine")
    try:
        config = engine_config(args, settings)
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                  max_tokens=args.max_tokens, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
        model = load_model(args.model or engine_settings.get("model", DEFAULT_MODEL),
                           model_dir=args.model_dir or engine_settings.get("model_dir"))
        engine = LlamaEngine(model, config)
    except (ModelLoadError, ValueError) as exc:
        print(f"pdbus generate: {exc}", file=sys.stderr)
        return 2
    text = args.prompt
    if args.chat:
        text = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    prompt = tuple(model.tokenizer.encode(text))
    admission = engine.add_request(DecodeRequest("generate", prompt, sampling))
    if not admission.ok:
        print(f"pdbus generate: {admission.status}: {admission.reason}", file=sys.stderr)
        return 2
    return stream(engine, len(prompt))


def stream(engine: LlamaEngine, num_prompt_tokens: int) -> int:
    start = time.perf_counter()
    first_at, num_tokens, finish = None, 0, None
    while engine.has_unfinished():
        for event in engine.step():
            sys.stdout.write(event.text)
            sys.stdout.flush()
            if event.token_id is not None:
                num_tokens += 1
                first_at = first_at or time.perf_counter()
            finish = event.finish_reason or finish
    end = time.perf_counter()
    decode_rate = (num_tokens - 1) / (end - first_at) if first_at and num_tokens > 1 and end > first_at else 0.0
    print(file=sys.stdout)
    print(f"[{num_prompt_tokens} prompt tokens, {num_tokens} generated, first token after "
          f"{((first_at or end) - start) * 1e3:.0f} ms, {decode_rate:.1f} tok/s decode, finish: {finish}]",
          file=sys.stderr)
    return 0
