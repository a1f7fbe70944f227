"""The eval tasks' data, read from the jsonl files beside this module (no hub, no download).

Contract: `load_mc(**_)` and `load_gen(**_)` return a `datasets.DatasetDict` (`test`; `load_gen`
also `fewshot`), as lm-eval's `custom_dataset` hook expects (it passes the task's metadata as
keyword arguments, ignored here). harness/eval/make_task_data.py writes the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def read_jsonl(name: str) -> list[dict]:
    with (HERE / name).open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _dataset(splits: dict[str, str]) -> Any:
    import datasets

    return datasets.DatasetDict({split: datasets.Dataset.from_list(read_jsonl(name)) for split, name in splits.items()})


def load_mc(**_: Any) -> Any:
    return _dataset({"test": "mc.jsonl"})


def load_gen(**_: Any) -> Any:
    return _dataset({"test": "gen_test.jsonl", "fewshot": "gen_fewshot.jsonl"})
