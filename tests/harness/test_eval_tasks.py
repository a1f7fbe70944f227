"""harness/eval/tasks: the shipped data is what make_task_data writes, and each item is well formed."""

from __future__ import annotations

import re

from harness.eval import make_task_data
from harness.eval.tasks import task_data


def test_the_shipped_files_are_exactly_what_the_generator_writes():
    for name, records in make_task_data.items().items():
        assert (make_task_data.TASK_DIR / name).read_text(encoding="utf-8") == make_task_data.render(records), name


def test_multiple_choice_items_have_four_distinct_choices_and_a_valid_answer():
    items = task_data.read_jsonl("mc.jsonl")
    assert 100 <= len(items) <= 200
    assert len({item["id"] for item in items}) == len(items)
    for item in items:
        assert len(set(item["choices"])) == 4, item
        assert 0 <= item["answer"] < 4
    answers = [item["answer"] for item in items]
    assert all(answers.count(k) > len(items) // 8 for k in range(4))   # the right answer is not always first


def test_generation_items_are_few_and_short():
    items = task_data.read_jsonl("gen_test.jsonl")
    assert len(items) <= 100
    assert all(re.fullmatch(r"[A-Za-z]+|[0-9]+", item["answer"]) for item in items)   # what "flexible" extracts
    assert len(task_data.read_jsonl("gen_fewshot.jsonl")) == 3


def test_each_task_yaml_names_its_loader():
    for name, loader in (("pdbus_mc.yaml", "load_mc"), ("pdbus_gen.yaml", "load_gen")):
        text = (make_task_data.TASK_DIR / name).read_text()
        assert f"custom_dataset: !function task_data.{loader}" in text
        assert hasattr(task_data, loader)
