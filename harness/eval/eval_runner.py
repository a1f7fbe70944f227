"""`python -m harness.eval` (`make eval`): lm-eval's scores for the built-in engine offline, a pdbus
cluster with raw and with int8 KV, and vLLM's server, side by side.

Contract: runs in .venv-eval (`make install-eval`), with no hub (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE
set here). For each system in `--systems` (default `offline,raw,int8,vllm`) it runs the tasks of
harness/eval/tasks/: `pdbus_mc` (log-likelihood) and `pdbus_gen` (generation) the completions way,
and `pdbus_gen` again the chat way (chat template, examples as earlier turns):
- `offline`: lm-eval model `pdbus-offline` (the engine in this process, harness/eval/pdbus_offline.py);
- `raw`, `int8`: a local `pdbus cluster` started with that `[kv] quant` (eval_servers.PdbusCluster),
  through lm-eval's `local-completions` (token ids; the model folder's tokenizer) and
  `local-chat-completions`, one request at a time (`--concurrency`), no retries; stopped after;
- `vllm`: vLLM's own server on the same folder and dtype, when a Python with vllm is found
  (eval_servers.find_vllm_python); otherwise its column says why it was skipped.
Before the log-likelihood task, one echo request (what local-completions sends) is tried: a server
that refuses it gets no log-likelihood scores, and the refusal (status and body) is printed and kept.
Then it prints one table (task, metric, each system's score, int8 - raw with a paired bootstrap 95 %
interval over the same items), whether every raw-KV response equals the offline one bit for bit, and
writes everything (scores, per-item values, raw responses, refusals, timings) to
results/eval-<UTC time>.json (`--out`). Exit code 1 when raw KV's responses differ from offline's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from harness.eval import eval_stats  # noqa: E402
from harness.eval.eval_servers import (  # noqa: E402
    PdbusCluster,
    VllmServer,
    completion_refusal,
    find_vllm_python,
)

TASK_DIR = Path(__file__).resolve().parent / "tasks"
MC, GEN, CHAT = "pdbus_mc", "pdbus_gen", "pdbus_gen (chat)"
METRICS = [(MC, "acc", "none"), (MC, "acc_norm", "none"), (GEN, "exact_match", "strict"),
           (GEN, "exact_match", "flexible"), (CHAT, "exact_match", "strict"), (CHAT, "exact_match", "flexible")]
COLUMNS = {"offline": "offline", "raw": "cluster raw", "int8": "cluster int8", "vllm": "vLLM"}
MAX_LENGTH = 2048


def _task_manager() -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASK_DIR), include_defaults=False)


def evaluate(model: str, model_args: dict[str, Any], task: str, *, chat: bool, limit: int | None) -> dict[str, Any]:
    """One lm-eval run of one task: its results, logged samples and wall time."""
    import lm_eval
    import lm_eval.models  # noqa: F401  (registers lm-eval's own models, as its CLI does)

    import harness.eval.pdbus_offline  # noqa: F401  (registers pdbus-offline)

    started = time.monotonic()
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], task_manager=_task_manager(),
                                  log_samples=True, apply_chat_template=chat, fewshot_as_multiturn=chat,
                                  limit=limit)
    return {"results": _jsonable(out["results"][task]), "samples": out["samples"][task],
            "seconds": round(time.monotonic() - started, 1)}


def offline_run(args: argparse.Namespace) -> dict[str, Any]:
    base = {"model": args.model, "dtype": args.dtype, "max_length": MAX_LENGTH, "batch_size": args.offline_batch}
    run = {}
    if MC in args.tasks:
        run[MC] = evaluate("pdbus-offline", base, MC, chat=False, limit=args.limit)
    if GEN in args.tasks:
        run[GEN] = evaluate("pdbus-offline", base, GEN, chat=False, limit=args.limit)
    if CHAT in args.tasks:
        run[CHAT] = evaluate("pdbus-offline", {**base, "mode": "chat"}, GEN, chat=True, limit=args.limit)
    return run


def server_run(url: str, name: str, tokenizer: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The three task runs against an OpenAI server (a refused echo skips the log-likelihood one)."""
    completions = {"model": name, "base_url": f"{url}/v1/completions", "tokenizer_backend": "huggingface",
                   "tokenizer": str(tokenizer), "tokenized_requests": True, "max_length": MAX_LENGTH,
                   "num_concurrent": args.concurrency, "max_retries": 1}
    chat = {"model": name, "base_url": f"{url}/v1/chat/completions", "max_length": MAX_LENGTH,
            "num_concurrent": args.concurrency, "max_retries": 1}
    run: dict[str, Any] = {}
    refusal = completion_refusal(url, echo_probe(name, tokenizer)) if MC in args.tasks else None
    if refusal is not None:
        run["refused"] = {"request": echo_probe(name, tokenizer), "answer": refusal}
        print(f"    the server refused the log-likelihood request: {refusal}", flush=True)
    elif MC in args.tasks:
        run[MC] = evaluate("local-completions", completions, MC, chat=False, limit=args.limit)
    if GEN in args.tasks:
        run[GEN] = evaluate("local-completions", completions, GEN, chat=False, limit=args.limit)
    if CHAT in args.tasks:
        run[CHAT] = evaluate("local-chat-completions", chat, GEN, chat=True, limit=args.limit)
    return run


def echo_probe(name: str, tokenizer: Path) -> dict[str, Any]:
    """The body local-completions sends to score a continuation (lm_eval/models/openai_completions.py)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(tokenizer))("Question: What is 2 + 2?\nAnswer: 4").input_ids
    return {"model": name, "prompt": [ids], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}


def run_system(system: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    from harness.eval.pdbus_offline import tokenizer_folder

    if system == "offline":
        return offline_run(args)
    tokenizer = tokenizer_folder(args.model)
    if system in ("raw", "int8"):
        with PdbusCluster(model=args.model, kv_quant=system, dtype=args.dtype, python=pdbus_python(),
                          log_path=log_dir / f"eval-cluster-{system}.log") as cluster:
            return server_run(cluster.url, cluster.model_name, tokenizer, args)
    python = find_vllm_python()
    if python is None:
        return {"skipped": "no Python with vllm (`make install-vllm`, or VLLM_PYTHON=...)"}
    if args.model == "tiny":
        return {"skipped": "the tiny model exists only inside pdbus"}
    with VllmServer(python=python, folder=tokenizer, name=tokenizer.name, dtype=args.dtype,
                    log_path=log_dir / "eval-vllm-server.log") as server:
        return server_run(server.url, server.model_name, tokenizer, args)


def pdbus_python() -> str:
    """The project's own interpreter for the cluster's processes (not .venv-eval's, with lm-eval's packages)."""
    base = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
    return str(base) if base.is_file() else sys.executable


def summarize(runs: dict[str, dict[str, Any]], systems: list[str]) -> tuple[str, dict[str, Any]]:
    """The table and the offline-vs-raw exactness check."""
    scored = {COLUMNS[s]: {t: (r["results"], r["samples"]) for t, r in runs[s].items() if isinstance(r, dict)
                           and "samples" in r} for s in systems}
    columns = [COLUMNS[s] for s in systems]
    diff = ("cluster raw", "cluster int8") if {"raw", "int8"} <= set(systems) else None
    rows = [row for row in eval_stats.score_rows(scored, METRICS, columns, diff=diff)
            if any(cell is not None for cell in row[2:])]   # a task not run here has no row
    header = ["task", "metric", *columns] + (["int8 - raw [95% CI] (+/- items)"] if diff else [])
    lines = [eval_stats.format_table(rows, header)]
    exact: dict[str, Any] = {}
    for system in (s for s in systems if s != "offline" and "offline" in systems):
        for task in (t for t in (MC, GEN, CHAT) if t in runs["offline"] and t in runs[system]):
            a, b = runs["offline"][task]["samples"], runs[system][task]["samples"]
            equal, total = eval_stats.same_responses(a, b)
            gap = eval_stats.loglikelihood_gap(a, b)
            exact[f"{system} {task}"] = {"equal": equal, "items": total, "max_loglikelihood_gap": gap}
            lines.append(f"{task}: {COLUMNS[system]}'s responses equal offline's bit for bit on {equal}/{total} items"
                         + (f" (largest log-likelihood gap {gap:.3g})" if gap is not None else ""))
    for system in systems:
        note = runs[system].get("skipped") or (runs[system].get("refused") or {}).get("answer")
        if note:
            lines.append(f"{COLUMNS[system]}: {note}")
    return "\n".join(lines), {"rows": rows, "header": header, "equal_to_offline": exact}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def compact(run: dict[str, Any]) -> dict[str, Any]:
    """A run for the JSON file: results, per-item scores and responses, not lm-eval's whole samples."""
    out = {}
    for task, value in run.items():
        if isinstance(value, dict) and "samples" in value:
            samples = value["samples"]
            out[task] = {"results": value["results"], "seconds": value["seconds"],
                         "items": {m if f == "none" else f"{m},{f}": eval_stats.item_scores(samples, m, f)
                                   for t, m, f in METRICS if t == task},
                         "responses": {int(s["doc_id"]): _jsonable(s["resps"]) for s in samples}}
        else:
            out[task] = value
    return out


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.environ.get("EVAL_MODEL") or "SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32", help="engine dtype everywhere (float32: raw KV = offline)")
    parser.add_argument("--systems", default="offline,raw,int8,vllm", help="comma-separated: offline,raw,int8,vllm")
    parser.add_argument("--tasks", default="mc,gen,chat", help="comma-separated: mc (pdbus_mc), gen (pdbus_gen), "
                        "chat (pdbus_gen through the chat API)")
    parser.add_argument("--limit", type=int, help="only the first N items of each task (a quick look)")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight to a server")
    parser.add_argument("--offline-batch", type=int, default=1, help="prompts per offline prefill pass")
    parser.add_argument("--out", type=Path, help="results file (default results/eval-<UTC time>.json)")
    return parser.parse_args(argv)


TASK_NAMES = {"mc": MC, "gen": GEN, "chat": CHAT}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.tasks = [TASK_NAMES[t] for t in args.tasks.split(",") if t]
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(COLUMNS):
        raise SystemExit(f"unknown systems: {', '.join(sorted(unknown))} (choose from {', '.join(COLUMNS)})")
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    stamp = datetime.now(UTC)
    out = args.out or Path("results") / f"eval-{stamp:%Y%m%dT%H%M%SZ}.json"
    runs: dict[str, dict[str, Any]] = {}
    for system in systems:
        print(f"==> {COLUMNS[system]} ({args.model}, {args.dtype})", flush=True)
        started = time.monotonic()
        runs[system] = run_system(system, args, out.parent)
        print(f"    done in {time.monotonic() - started:.0f} s", flush=True)
    table, summary = summarize(runs, systems)
    print(f"\nlm-eval 0.4 on {args.model} ({args.dtype}), {machine()}, {stamp:%Y-%m-%d}\n{table}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": stamp.isoformat(), "machine": machine(), "model": args.model,
                               "dtype": args.dtype, "limit": args.limit, "concurrency": args.concurrency,
                               **summary, "runs": {s: compact(r) for s, r in runs.items()}}, indent=1))
    print(f"wrote {out}")
    exact = [e for key, e in summary["equal_to_offline"].items() if key.startswith("raw ")]
    return 1 if any(e["equal"] != e["items"] for e in exact) else 0
