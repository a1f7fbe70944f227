"""xgrammar vs llguidance on pdbus's tokenizers: the measurement that chose nodes/engines/grammar.py's library.

Contract: `flock /tmp/pdbus-bench.lock .venv/bin/python -m harness.bench.grammar_mask [--repeats N]`
measures each library on SmolLM2-135M's tokenizer (49,152 ids) and the tiny model's (512 ids), each
pair in its own child process pinned to one CPU (taskset) with one thread:
- `tokenizer_s`, `rss_*_mib`: building the library's tokenizer object (once per engine), and the
  resident memory its import, that object and three compiled grammars add;
- `cold_first_grammar_ms`: the first compile + mask on a new tokenizer object (lazy set-up);
- per grammar (json_object, a nested schema with arrays, enums and a pattern, an OpenAI-style
  tool-call anyOf): `compile_ms`, `new_state_us`, `first_mask_us` (medians of N, no library cache),
  then `mask_us` / `accept_us` p50/p99 per token while walking a valid JSON document (json.dumps
  separators, tokenized by the model's tokenizer) token by token, N times;
- `apply_us`: setting the forbidden logits of [32, vocab] logits to -inf with masks met in the
  walks, float32 and bfloat16: `nodes/engines/grammar_bitmask.apply_bitmask`, and xgrammar's kernel;
- `wide_schema_compile_ms`: compile + first mask of objects with N optional properties (how
  compile time grows with a schema a client sends).
It writes results/grammar-mask-<date>.json and prints the tables. The mask is what every
constrained decode step pays; compile and first mask once per new schema (the engine caches them).
Both libraries are driven through one interface (harness/bench/grammar_adapters.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.bench.grammar_adapters import SEPARATORS, LlguidanceAdapter, XgrammarAdapter

LIBRARIES = ("xgrammar", "llguidance")
INSTALL = {"xgrammar": "xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2", "llguidance": "llguidance==1.9.1"}
TOKENIZERS = ("smollm2", "tiny")
REPO_ROOT = Path(__file__).resolve().parents[2]
BATCH = 32

NESTED_SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "status": {"enum": ["active", "suspended", "deleted"]},
    "address": {"type": "object", "required": ["street", "city", "zip"], "additionalProperties": False,
                "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
    "orders": {"type": "array", "items": {
        "type": "object", "required": ["sku", "quantity", "price", "tags"], "additionalProperties": False,
        "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
                       "price": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["gift", "sale"]}}}}},
    "verified": {"type": "boolean"}}, "required": ["id", "name", "status", "address", "orders", "verified"]}
NESTED_DOC = {"id": 1042, "name": "Ada Lovelace", "status": "active",
              "address": {"street": "12 St James's Square", "city": "London", "zip": "10115"},
              "orders": [{"sku": "BK-0001", "quantity": 2, "price": 19.99, "tags": ["gift", "sale"]},
                         {"sku": "PN-7731", "quantity": 1, "price": 3.5, "tags": []},
                         {"sku": "NB-2210", "quantity": 12, "price": 0.25, "tags": ["sale"]}],
              "verified": True}
WEATHER = {"type": "object", "properties": {
    "location": {"type": "string", "description": "City and country"},
    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["location", "unit"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50}},
    "required": ["query"], "additionalProperties": False}
TOOL_SCHEMA = {"anyOf": [
    {"type": "object", "properties": {"name": {"const": name}, "arguments": params},
     "required": ["name", "arguments"], "additionalProperties": False}
    for name, params in (("get_weather", WEATHER), ("web_search", SEARCH))]}
TOOL_DOC = {"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}
GRAMMARS = {  # name -> (schema text, "" for any JSON object; a valid document)
    "json_object": ("", NESTED_DOC),
    "nested_schema": (json.dumps(NESTED_SCHEMA), NESTED_DOC),
    "tool_call": (json.dumps(TOOL_SCHEMA), TOOL_DOC),
}
WIDE_PROPERTIES = (100, 200, 400, 800)  # xgrammar takes >120 s at 3,000 (a 66 kB schema): not run


def load_tokenizer(name: str) -> Any:
    if name == "tiny":
        from nodes.engines.tiny import tiny_tokenizer
        return tiny_tokenizer(512)
    from nodes.engines.model_loader import open_model_folder
    return open_model_folder().tokenizer


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def walk(adapter: Any, compiled: Any, ids: list[int], bitmask: Any,
         seen: list[Any]) -> tuple[list[float], list[float]]:
    """Mask and accept each token of a valid document in turn; the times in microseconds."""
    state, masks, accepts = adapter.new_state(compiled), [], []
    for token in ids:
        start = time.perf_counter()
        adapter.fill(state, bitmask, 0)
        masks.append((time.perf_counter() - start) * 1e6)
        if len(seen) < 4 * BATCH:
            seen.append(bitmask[0].clone())
        assert (int(bitmask[0, token // 32]) >> (token % 32)) & 1, f"token {token} masked off"
        start = time.perf_counter()
        ok = adapter.accept(state, token)
        accepts.append((time.perf_counter() - start) * 1e6)
        assert ok, f"token {token} refused"
    return masks, accepts


def measure(library: str, tokenizer_name: str, repeats: int, wide: tuple[int, ...] = WIDE_PROPERTIES
            ) -> dict[str, Any]:
    import torch
    tokenizer = load_tokenizer(tokenizer_name)
    vocab_size = tokenizer.vocab_size
    before_import = rss_mib()
    importlib.import_module(library)  # its import (and xgrammar's of transformers) is not the tokenizer's cost
    base_rss = rss_mib()
    start = time.perf_counter()
    adapter = (XgrammarAdapter if library == "xgrammar" else LlguidanceAdapter)(tokenizer, vocab_size)
    result: dict[str, Any] = {"library": library, "tokenizer": tokenizer_name, "vocab_size": vocab_size,
                              "tokenizer_s": time.perf_counter() - start, "rss_import_mib": base_rss - before_import,
                              "rss_tokenizer_mib": rss_mib() - base_rss}
    bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    start = time.perf_counter()  # the first grammar on a new tokenizer object pays for lazy set-up
    adapter.fill(adapter.new_state(adapter.compile(json.dumps(WEATHER))), bitmask, 0)
    result["cold_first_grammar_ms"] = (time.perf_counter() - start) * 1e3
    after_tokenizer = rss_mib()
    kept: list[Any] = []   # measure_grammar's `keep`: the compiled grammars, the masks met
    seen: list[Any] = []
    result["grammars"] = {name: measure_grammar(adapter, tokenizer, source, doc, repeats, bitmask, (kept, seen))
                          for name, (source, doc) in GRAMMARS.items()}
    result["rss_grammars_mib"] = rss_mib() - after_tokenizer - sum(m.numel() * 4 for m in seen) / 2**20
    result["apply_us"] = measure_apply(library, seen, vocab_size)
    result["wide_schema_compile_ms"] = measure_wide(adapter, bitmask, wide)
    return result


def measure_grammar(adapter: Any, tokenizer: Any, source: str, doc: Any, repeats: int, bitmask: Any,
                    keep: tuple[list[Any], list[Any]]) -> dict[str, Any]:
    """Compile, new state and first mask (medians of `repeats`); then walk `doc` `repeats` times.
    `keep`: where the compiled grammar (for the RSS) and masks met (for `apply_us`) are put."""
    kept, seen = keep
    compile_ms, first_mask, new_state = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled = adapter.compile(source)
        compile_ms.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        state = adapter.new_state(compiled)
        new_state.append((time.perf_counter() - start) * 1e6)
        start = time.perf_counter()
        adapter.fill(state, bitmask, 0)
        first_mask.append((time.perf_counter() - start) * 1e6)
    kept.append(compiled)
    ids = tokenizer.encode(json.dumps(doc))
    masks, accepts = [], []
    for _ in range(repeats):
        step_masks, step_accepts = walk(adapter, compiled, ids, bitmask, seen)
        masks += step_masks
        accepts += step_accepts
    return {"doc_tokens": len(ids), "compile_ms": statistics.median(compile_ms),
            "new_state_us": statistics.median(new_state), "first_mask_us": statistics.median(first_mask),
            "mask_us": {"p50": percentile(masks, 0.5), "p99": percentile(masks, 0.99), "max": max(masks),
                        "mean": statistics.fmean(masks)},
            "accept_us": {"p50": percentile(accepts, 0.5), "p99": percentile(accepts, 0.99)}}


def measure_wide(adapter: Any, bitmask: Any, counts: tuple[int, ...]) -> dict[str, float]:
    """Compile + first mask of an object with N optional string properties: how compile time grows
    with a schema's size, which a server taking schemas from clients must bound."""
    out = {}
    for count in counts:
        schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}
        start = time.perf_counter()
        adapter.fill(adapter.new_state(adapter.compile(json.dumps(schema))), bitmask, 0)
        out[str(count)] = (time.perf_counter() - start) * 1e3
    return out


def measure_apply(library: str, seen: list[Any], vocab_size: int) -> dict[str, float]:
    """Median time to mask [BATCH, vocab] logits with masks met in the walks (a spread of steps)."""
    import torch

    from nodes.engines.grammar_bitmask import apply_bitmask
    step = max(1, len(seen) // BATCH)
    bitmask = torch.stack(seen[::step][:BATCH])
    rows = list(range(bitmask.shape[0]))
    kernels = {"pdbus": lambda logits: apply_bitmask(logits, bitmask, rows)}
    if library == "xgrammar":
        import xgrammar
        kernels["xgrammar"] = lambda logits: xgrammar.apply_token_bitmask_inplace(logits, bitmask)
    generator = torch.Generator().manual_seed(0)
    out = {"allowed_fraction": float(sum(bin(w & 0xFFFFFFFF).count("1") for w in bitmask.view(-1).tolist())
                                     / (len(rows) * vocab_size))}
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(len(rows), vocab_size, generator=generator).to(dtype)
        for name, kernel in kernels.items():
            times = []
            for _ in range(21):
                batch = logits.clone()
                start = time.perf_counter()
                kernel(batch)
                times.append((time.perf_counter() - start) * 1e6)
            out[f"{name}_{str(dtype).removeprefix('torch.')}"] = statistics.median(times)
    return out


def run_child(library: str, tokenizer_name: str, repeats: int) -> dict[str, Any]:
    """One (library, tokenizer) in a fresh process pinned to one CPU and one thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RAYON_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    cpu = max(os.sched_getaffinity(0))
    command = ["taskset", "-c", str(cpu), sys.executable, "-m", "harness.bench.grammar_mask",
               "--child", library, tokenizer_name, "--repeats", str(repeats)]
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{library}/{tokenizer_name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'library':11} {'tokenizer':9} {'grammar':13} {'compile ms':>10} {'new state us':>12} "
          f"{'1st mask us':>11} {'mask p50':>8} {'mask p99':>8} {'accept p50':>10} {'accept p99':>10}")
    for row in rows:
        for name, g in row["grammars"].items():
            print(f"{row['library']:11} {row['tokenizer']:9} {name:13} {g['compile_ms']:10.2f} "
                  f"{g['new_state_us']:12.1f} {g['first_mask_us']:11.0f} {g['mask_us']['p50']:8.1f} "
                  f"{g['mask_us']['p99']:8.1f} {g['accept_us']['p50']:10.1f} {g['accept_us']['p99']:10.1f}")
    print(f"\n{'library':11} {'tokenizer':9} {'tokenizer s':>11} {'cold 1st ms':>11} {'RSS import':>10} "
          f"{'RSS tok':>7} {'RSS 3 gr.':>9}  (MiB)  compile + 1st mask, N optional properties (ms)")
    for row in rows:
        wide = ", ".join(f"{n}: {ms:.0f}" for n, ms in row["wide_schema_compile_ms"].items())
        print(f"{row['library']:11} {row['tokenizer']:9} {row['tokenizer_s']:11.3f} "
              f"{row['cold_first_grammar_ms']:11.1f} {row['rss_import_mib']:10.1f} {row['rss_tokenizer_mib']:7.1f} "
              f"{row['rss_grammars_mib']:9.1f}         {wide}")
    print(f"\napplying masks met in the walks to [{BATCH}, vocab] logits (us)")
    for row in rows:
        apply = ", ".join(f"{k} {v:.0f}" for k, v in row["apply_us"].items() if k != "allowed_fraction")
        print(f"{row['library']:11} {row['tokenizer']:9} {apply} ({row['apply_us']['allowed_fraction']:.0%} allowed)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO_ROOT / "results"))
    parser.add_argument("--child", nargs=2, metavar=("LIBRARY", "TOKENIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import torch
        torch.set_num_threads(1)
        print(json.dumps(measure(args.child[0], args.child[1], args.repeats)))
        return 0
    libraries = [lib for lib in LIBRARIES if importlib.util.find_spec(lib)]
    for missing in sorted(set(LIBRARIES) - set(libraries)):  # only the chosen one is a dependency
        print(f"{missing} is not installed, not measured (pip install --no-deps {INSTALL[missing]})")
    rows = [run_child(lib, tok, args.repeats) for tok in TOKENIZERS for lib in libraries]
    print_table(rows)
    from importlib.metadata import version
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "repeats": args.repeats,
              "versions": {lib: version(lib) for lib in libraries} | {"torch": version("torch")},
              "cpu": _cpu_model(), "threads": 1, "separators": SEPARATORS, "rows": rows}
    out = Path(args.out) / f"grammar-mask-{datetime.now(UTC).strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
