"""Write the eval tasks' data files (harness/eval/tasks/*.jsonl), deterministically, from facts below.

Contract: `python -m harness.eval.make_task_data` rewrites `mc.jsonl` (multiple choice, scored by
log-likelihood), `gen_test.jsonl` and `gen_fewshot.jsonl` (short answers, scored by exact match)
and prints their item counts; `items()` returns the same records without writing. The files are
committed, so an eval never needs a hub or a download; tests/harness/test_eval_tasks.py checks that
rerunning this gives byte-identical files. Everything here (facts, arithmetic, wording) is written
for pdbus: common knowledge and generated numbers, no third-party data set.

Records: MC `{"id", "category", "question", "choices" (4 strings), "answer" (index)}`; generation
`{"id", "category", "question", "answer"}`. Choices are shuffled by a seeded generator.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent / "tasks"
SEED = 44

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"),
            ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Poland", "Warsaw"), ("Ireland", "Dublin"),
            ("China", "Beijing"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"),
            ("Thailand", "Bangkok"), ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Chile", "Santiago"),
            ("Argentina", "Buenos Aires"), ("Canada", "Ottawa"), ("Australia", "Canberra"),
            ("England", "London"), ("Turkey", "Ankara"), ("India", "New Delhi")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"), ("fast", "slow"),
             ("open", "closed"), ("happy", "sad"), ("light", "dark"), ("old", "young"), ("early", "late"),
             ("full", "empty"), ("hard", "soft"), ("wet", "dry"), ("tall", "short"), ("rich", "poor"),
             ("strong", "weak"), ("clean", "dirty"), ("loud", "quiet"), ("first", "last"), ("win", "lose"),
             ("buy", "sell"), ("push", "pull"), ("left", "right"), ("inside", "outside"), ("thick", "thin"),
             ("heavy", "light"), ("north", "south"), ("east", "west"), ("true", "false"), ("before", "after")]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
YOUNG = [("cat", "kitten"), ("dog", "puppy"), ("cow", "calf"), ("sheep", "lamb"), ("horse", "foal"),
         ("duck", "duckling"), ("frog", "tadpole"), ("bear", "cub"), ("goat", "kid"), ("hen", "chick"),
         ("pig", "piglet"), ("kangaroo", "joey")]
COUNTS = [("How many legs does a spider have?", "8"), ("How many days are in a week?", "7"),
          ("How many months are in a year?", "12"), ("How many legs does a dog have?", "4"),
          ("How many hours are in a day?", "24"), ("How many minutes are in an hour?", "60"),
          ("How many sides does a triangle have?", "3"), ("How many sides does a square have?", "4"),
          ("How many legs does an insect have?", "6"), ("How many wheels does a bicycle have?", "2"),
          ("How many seconds are in a minute?", "60"), ("How many days are in a leap year?", "366"),
          ("How many players are on a soccer team on the field?", "11"), ("How many continents are there?", "7")]
COLORS = [("the sky on a clear day", "blue"), ("grass", "green"), ("snow", "white"), ("a ripe banana", "yellow"),
          ("coal", "black"), ("a ripe tomato", "red"), ("an orange", "orange"), ("a lemon", "yellow"),
          ("milk", "white"), ("a fire truck", "red")]


def _choices(rng: random.Random, answer: str, pool: list[str]) -> tuple[list[str], int]:
    distractors = rng.sample(sorted({p for p in pool if p != answer}), 3)
    choices = [answer, *distractors]
    rng.shuffle(choices)
    return choices, choices.index(answer)


def _numbers_near(rng: random.Random, answer: int) -> list[str]:
    offsets = rng.sample([d for d in (-10, -2, -1, 1, 2, 10) if answer + d > 0], 3)
    return [str(answer + d) for d in offsets]


def _mc_records(rng: random.Random) -> list[dict]:
    records: list[dict] = []

    def add(category: str, question: str, answer: str, pool: list[str]) -> None:
        choices, index = _choices(rng, answer, pool)
        records.append({"category": category, "question": question, "choices": choices, "answer": index})

    for country, capital in CAPITALS:
        add("capital", f"What is the capital of {country}?", capital, [c for _, c in CAPITALS])
    for word, opposite in OPPOSITES:
        add("opposite", f"What is the opposite of \"{word}\"?", opposite, [o for _, o in OPPOSITES])
    for i, day in enumerate(DAYS):
        add("calendar", f"Which day comes after {day}?", DAYS[(i + 1) % 7], DAYS)
    for i, month in enumerate(MONTHS):
        add("calendar", f"Which month comes after {month}?", MONTHS[(i + 1) % 12], MONTHS)
    for animal, young in YOUNG:
        add("animal", f"What is a young {animal} called?", young, [y for _, y in YOUNG])
    for question, answer in COUNTS:
        add("count", question, answer, _numbers_near(rng, int(answer)) + [answer])
    for thing, color in COLORS:
        add("color", f"What color is {thing}?", color, ["blue", "green", "white", "yellow", "black", "red",
                                                         "orange", "purple", "brown", "pink"])
    for _ in range(30):
        a, b = rng.randint(2, 49), rng.randint(2, 49)
        add("arithmetic", f"What is {a} + {b}?", str(a + b), _numbers_near(rng, a + b) + [str(a + b)])
    return [{"id": f"mc-{i:03d}", **r} for i, r in enumerate(records)]


def _gen_records(rng: random.Random) -> list[dict]:
    records = []
    for _ in range(20):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        records.append(("arithmetic", f"What is {a} + {b}?", str(a + b)))
    for _ in range(10):
        start, step = rng.randint(1, 9), rng.randint(2, 5)
        seq = [start + step * k for k in range(4)]
        records.append(("sequence", f"What number comes next: {', '.join(map(str, seq))}?", str(start + step * 4)))
    single_word = [(c, k) for c, k in CAPITALS if " " not in k]
    for country, capital in rng.sample(single_word, 15):
        records.append(("capital", f"What is the capital of {country}?", capital))
    for word, opposite in rng.sample(OPPOSITES, 10):
        records.append(("opposite", f"What is the opposite of \"{word}\"?", opposite))
    for i in rng.sample(range(7), 5):
        records.append(("calendar", f"Which day comes after {DAYS[i]}?", DAYS[(i + 1) % 7]))
    return [{"id": f"gen-{i:03d}", "category": c, "question": q, "answer": a} for i, (c, q, a) in enumerate(records)]


FEWSHOT = [
    {"id": "shot-0", "category": "arithmetic", "question": "What is 3 + 4?", "answer": "7"},
    {"id": "shot-1", "category": "capital", "question": "What is the capital of Mexico?", "answer": "Mexico City"},
    {"id": "shot-2", "category": "opposite", "question": "What is the opposite of \"good\"?", "answer": "bad"},
]


def items() -> dict[str, list[dict]]:
    """File name -> records, the same on every call."""
    rng = random.Random(SEED)
    return {"mc.jsonl": _mc_records(rng), "gen_test.jsonl": _gen_records(rng), "gen_fewshot.jsonl": FEWSHOT}


def render(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)


def main() -> None:
    for name, records in items().items():
        (TASK_DIR / name).write_text(render(records), encoding="utf-8")
        print(f"{TASK_DIR / name}: {len(records)} items")


if __name__ == "__main__":
    main()
