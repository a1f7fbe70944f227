"""The fuzz corpus: every input the fuzzer (`make fuzz`) found taking a process down, hanging it or
failing what it should have isolated, replayed exactly, as a regression case each.

1. KV data plane, decode node's KV thread: a 73-byte CHUNK header with a valid xxh3 trailer and a
   shape of [1, 2, 1, 2**31-1, 2**31-1] sent `bus.kv.frames.decode_message` into computing the
   payload sizes of 2**32 one-row frames before comparing them with the header: the KV thread hung
   with its memory growing (fixed in the tree by bus/kv/header_checks.py; kept as a regression).
2. Decode node, engine thread: a forged but checksummed raw KV transfer holding NaN (or infinities,
   or float32 max), then its `kv_ready`, made the next `LlamaEngine.step()` raise ZeroDivisionError
   in `f32_attention.decode_attention`; every request decoding in that step failed with it, the
   healthy ones included (`engine_step_failed`).
3. Gateway, ClusterClient: a prefill node's FINAL whose body is not a map (or whose `token` /
   `transfer` has the wrong type) raised AttributeError / TypeError in
   `Attempt._consume_prefill` (nodes/cluster/attempt.py); the generation ended as `internal` (and asyncio
   logged "Task exception was never retrieved") instead of treating it as a failed prefill. The
   fuzz saw the same for a prefill PARTIAL token body without `index` / `token_id` (KeyError), or
   not a map, a non-numeric `token_id` (ValueError in `Attempt.deliver`), and a decode plan without
   `plan` (KeyError in `_plan`) or not a map.
4. Gateway, /metrics: the `code` of a node's ERROR becomes a label value of
   `pdbus_cluster_failures_total`, one series per distinct code a hostile node invents (the fuzz
   saw the exposition grow during the run): unbounded memory. And a decode node's FINAL `stats` /
   a prefill report of the wrong types make `GatewayMetrics.observe_stream` raise.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nodes.cluster import RequestTrace
from nodes.gateway.gateway_metrics import GatewayMetrics
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

HUGE_DIMS_HEADER = bytes.fromhex(
    "50444b560201dc0010a27431a2723195010201ce7fffffffce7fffffffa7666c6f61743332a3726177000100000200ce7fffffffa091"
    "94a46e6f6e65000101000012e1d3b7a92c1d0d")
REPLAY = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from bus.kv import frames
started = time.monotonic()
try:
    frames.decode_message([bytes.fromhex(sys.argv[1]), b"x"])
except frames.KVFrameError:
    pass
print(round(time.monotonic() - started, 3))
"""


def run_case(*args: str) -> dict:
    """A corpus case of corpus_cases.py in a child process (its docstring says why), its outcome."""
    done = subprocess.run([sys.executable, "-m", "tests.harness.fuzz.corpus_cases", *args], capture_output=True,
                          text=True, timeout=150, cwd=REPO_ROOT)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"the case ended with {done.returncode} and no result:\n{done.stderr[-3000:]}"
    return json.loads(line[len("RESULT "):])


def test_a_checksummed_chunk_header_with_2g_dims_is_refused_at_once():
    done = subprocess.run([sys.executable, "-c", REPLAY, HUGE_DIMS_HEADER.hex()], capture_output=True, text=True,
                          timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) < 1.0


def test_a_forged_nan_kv_for_one_request_does_not_fail_the_others():
    outcome = run_case("nan_kv")
    assert outcome["decode_alive"]
    assert outcome["good"] == "ok" and outcome["num_tokens"] == 80 and outcome["failures"] == [], outcome


WRONG_REPLIES = {
    "final-float": ("prefill_final", 1.5), "final-list": ("prefill_final", [0, 5, "x"]),
    "final-token-float": ("prefill_final", {"type": "done", "token": 1.5}),
    "final-token-4": ("prefill_final", {"type": "done", "token": [0, 5, "x", 7]}),
    "final-transfer-float": ("prefill_final", {"type": "done", "transfer": 1.5}),
    "token-no-index": ("prefill_token", {"type": "token", "token_id": 5, "text": "x"}),
    "token-id-text": ("prefill_token", {"type": "token", "index": 0, "token_id": "xx", "text": "x"}),
    "token-list": ("prefill_token", [1, 2]),
    "plan-missing": ("decode_plan", {"type": "plan"}), "plan-bool": ("decode_plan", True),
}


@pytest.mark.parametrize("case", list(WRONG_REPLIES))
def test_a_reply_of_the_wrong_shape_is_a_failed_attempt_not_an_internal_error(case):
    where, body = WRONG_REPLIES[case]
    outcome = run_case("wrong_reply", where, json.dumps(body))
    assert outcome["code"] != "internal", outcome


def test_error_codes_a_node_invents_do_not_become_unbounded_metric_labels():
    metrics = GatewayMetrics()
    for i in range(300):
        trace = RequestTrace("r", "s")
        trace.failures.append(f"hostile-{i}@a-fake-decode")   # what the client records from ERROR {code}
        metrics.observe_stream(trace, {"prompt_tokens": 1, "completion_tokens": 1}, [], 0.0, 1.0)
    body, _ = metrics.render()
    series = [line for line in body.decode().splitlines() if line.startswith("pdbus_cluster_failures_total{")]
    assert len(series) <= 32, f"{len(series)} series"


@pytest.mark.parametrize("final", [{"stats": {"kv_raw_bytes": "a", "kv_wire_bytes": "b"}}, {"stats": [1]},
                                   {"stats": {"kv_raw_bytes": -5, "kv_wire_bytes": 1}}])
def test_a_decode_final_of_the_wrong_types_does_not_break_the_metrics(final):
    trace = RequestTrace("r", "s")
    trace.decode_final = final   # the decode node's FINAL body, as the client keeps it
    GatewayMetrics().observe_stream(trace, {"prompt_tokens": 1, "completion_tokens": 1}, [0.5], 0.0, 1.0)
