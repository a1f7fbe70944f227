"""The fuzz run's verdict and report, without a cluster: which findings fail a run, RSS growth net
of what a decode node holds by design, plain tracebacks picked out of a log, the printed summary."""

from __future__ import annotations

from harness.fuzz import fuzz_report
from harness.fuzz.fuzz_runner import FuzzOptions, problems


def a_run(**changes) -> dict:
    run = {"options": {"seed": 0, "rss_bound_mib": 64.0}, "seconds_fuzzed": 20.0, "rounds": 9,
           "counts": {"sent.broker.READY": 3, "seen.broker.DISCONNECT": 3, "plan.prefill.forge": 1},
           "alive": {"broker": True, "gateway": True}, "rss_before": {"broker": 40.0, "gateway": 80.0},
           "rss_after": {"broker": 41.0, "gateway": 90.0}, "rss_growth": {"broker": 1.0, "gateway": 10.0},
           "kv_idle": {"decode-0": True}, "metrics_series_before": 200, "metrics_series_after": 205,
           "final_request": {"ok": True, "status": 200, "num_chunks": 16, "finish_reason": "length", "error": None,
                             "seconds": 0.1},
           "logged_errors": {}, "deaths": {}}
    run.update(changes)
    return run


def test_a_clean_run_has_no_problems_and_renders_passed():
    run = a_run()
    assert problems(run, FuzzOptions()) == []
    run["ok"], run["problems"] = True, []
    text = fuzz_report.render(run)
    assert "fuzz: PASSED" in text and "broker.READY" in text and "200 -> 205" in text


def test_each_finding_fails_the_run():
    options = FuzzOptions()
    assert problems(a_run(alive={"broker": False, "gateway": True}), options) == ["broker died"]
    assert "gateway grew 70.0 MiB" in problems(a_run(rss_growth={"broker": 1.0, "gateway": 70.0}), options)[0]
    assert "KV not back to idle" in problems(a_run(kv_idle={"decode-0": False}), options)[0]
    assert "final request failed" in problems(a_run(final_request={"ok": False}), options)[0]
    assert "/metrics grew" in problems(a_run(metrics_series_after=400), options)[0]
    assert "no RSS baseline" in problems(a_run(rss_before={}), options)[0]


def test_rss_growth_is_net_of_what_a_decode_node_holds_by_design():
    growth = fuzz_report.rss_growth({"decode-0": 380.0, "broker": 40.0, "gone": 10.0},
                               {"decode-0": 440.0, "broker": 39.0}, {"decode-0": 50.0, "broker": -5.0})
    assert growth == {"decode-0": 10.0, "broker": -1.0}
    assert fuzz_report.held_mib({"kv_mib_cached": 1.5, "kv_mib_slots": 2.0, "kv_mib_buffers": 0.5, "x": 9}) == 4.0


def test_plain_tracebacks_are_cut_out_of_a_log_with_what_failed():
    lines = ['{"event": "x"}\n', "Task exception was never retrieved\n", "Traceback (most recent call last):\n",
             '  File "a.py", line 1, in f\n', "    body.get('x')\n", "AttributeError: 'list' object has no attribute 'get'\n",
             '{"event": "y"}\n', "Traceback (most recent call last):\n", '  File "b.py", line 2\n',
             "During handling of the above exception, another exception occurred:\n", "KeyError: 'plan'\n"]
    found = fuzz_report.raw_tracebacks(lines)
    assert [t[-1].strip() for t in found] == ["AttributeError: 'list' object has no attribute 'get'", "KeyError: 'plan'"]
    assert found[0][0] == "Task exception was never retrieved\n" and found[1][0].startswith("Traceback")
