"""bench-kv's auto / none pass: the median's interval, the verdicts, and a run over real sockets."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from bus.kv import KVReceiver, ReceiveConfig
from bus.kv.link import gbit
from harness.bench.kv_auto import (
    AUTO_BASES,
    ORDERS,
    TRIPLE,
    median_interval,
    print_auto_pairs,
    run_auto_pairs,
    verdict,
)
from harness.bench.kv_report import print_targets
from nodes.engines.kv_quant import TorchQuantizer


def test_the_interval_of_sixty_values_is_the_22nd_to_the_39th_as_sign_test_tables_give():
    values = list(range(60, 0, -1))   # unsorted on purpose
    assert median_interval(values) == (22, 30.5, 39)


def test_the_interval_holds_the_true_median_at_least_as_often_as_it_claims():
    rng = random.Random(7)
    misses = 0
    for _ in range(2000):
        low, _, high = median_interval([rng.gauss(1.0, 0.05) for _ in range(60)])
        misses += not low <= 1.0 <= high
    assert misses / 2000 <= 0.05 + 0.015   # binomial noise over 2000 trials


def test_too_few_values_for_the_confidence_give_their_whole_range():
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 2.0, 3.0)
    with pytest.raises(ValueError):
        median_interval([])


@pytest.mark.parametrize(("low", "high", "said"), [
    (0.98, 1.02, "met"), (0.98, 1.03, "met"), (1.031, 1.06, "MISSED"), (1.01, 1.05, "UNRESOLVED")])
def test_a_verdict_needs_the_whole_interval_on_one_side_of_the_goal(low, high, said):
    assert verdict(low, high, 1.03) == said


def test_the_six_orders_put_each_case_in_each_place_equally_often():
    assert sorted(ORDERS) == sorted(itertools.permutations(TRIPLE))
    for place in range(3):
        assert sorted(order[place] for order in ORDERS) == sorted(TRIPLE * 2)


async def test_every_case_runs_on_both_links_and_every_transfer_is_delivered(capsys):
    received = []
    receiver = KVReceiver(quantizer=TorchQuantizer(), config=ReceiveConfig(transfer_timeout=5.0),
                          on_result=received.append)
    endpoint = await receiver.start()
    source = torch.randn(4, 2, 3, 64, 16)
    sources = {"fp32": source, "bf16": source.to(torch.bfloat16)}
    links = {"loopback": (gbit(25), None), "10 Gbit/s": (gbit(10), gbit(10))}
    results = await run_auto_pairs(endpoint, sources, TorchQuantizer(), 3 * 64 * 16 * 4, 6, links)
    await receiver.close()
    assert set(results) == {(link, base) for link in links for base in AUTO_BASES}
    assert all(len(ratios) == 6 and min(ratios) > 0 for pair in results.values() for ratios in pair.values())
    assert len(received) == len(links) * len(AUTO_BASES) * 3 * 7 and all(result.ok for result in received)
    print_auto_pairs(results, 6)
    table = capsys.readouterr().out
    assert all(f"| {link}, {base} |" in table for link in links for base in AUTO_BASES)


def _end_to_end(factor: float) -> dict:
    """Per-round times where raw takes 4x int8 and 1/0.9 of a bare send (those targets are met) and
    `auto` takes `factor` times `none`."""
    out = {}
    for base in AUTO_BASES:
        none = [0.040 if "raw" in base else 0.010] * 6
        out[f"{base}+none"] = (none[0], 1.0, none[0], none)
        out[f"{base}+auto"] = (none[0] * factor, 1.0, none[0] * factor, [t * factor for t in none])
    out.update({"fp32 bare pyzmq": (0.036, 1.0, 0.036, [0.036] * 6), "bf16 bare pyzmq": (0.036, 1.0, 0.036, [0.036] * 6)})
    return out


def test_the_targets_judge_auto_by_the_pass_and_show_the_end_to_end_figure_beside_it(capsys):
    pairs = {(link, base): {"auto": [1.0 + 0.001 * i for i in range(60)], "none again": [1.0] * 60}
             for link in ("loopback", "10 Gbit/s") for base in AUTO_BASES}
    pairs[("10 Gbit/s", "bf16 raw")]["auto"] = [1.05 + 0.001 * i for i in range(60)]
    print_targets(_end_to_end(1.04), _end_to_end(1.04), pairs, 60)
    table = capsys.readouterr().out
    assert ("| loopback: fp32 int8 auto / none time, median of 60 paired rounds (95 % interval 1.021–1.038; "
            "end-to-end table: 1.040) | 1.030 | <= 1.03 | UNRESOLVED |") in table
    assert "| 10 Gbit/s: bf16 raw auto / none time, median of 60 paired rounds" in table
    assert table.count("| MISSED |") == 1
